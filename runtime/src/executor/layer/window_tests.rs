//! What `policy = "auto"` asks of the layer pipeline, on a scripted clock: its
//! measurement window ([`EpochRun::mark`]) on a device whose launches (one
//! `LAUNCH` per batch in `prepare_tops`) and steps (`train_prepared`) move a [`ManualClock`]
//! by fixed costs, so what the window holds is exact (no sleeps, no wall
//! clock); a new split under a running monitor; the planner thread's
//! ends: a failed plan is the epoch's error, a stop joins the thread; and the
//! top layers sampled ahead (`executor/layer/device/` step 1): one synchronization per
//! super-batch, the blocks of hop-by-hop sampling.

use std::sync::Arc;
use std::time::Duration;

use cpu_ops::{ModelConfig, ModelKind};
use gpu_ops::HostBackend;

use super::device::{
    BottomBatch, BottomCounts, HotStaging, HotUse, LayerDevice, LayerEngine, LayerState,
    PreparedTops, TopBatch, TopsAhead,
};
use super::pipeline::{LayerOptions, LayerSetup, Orchestrator};
use crate::cancel::CancelToken;
use crate::clock::{Clock, ManualClock};
use crate::data::dataset::Dataset;
use crate::data::generate::{generate_sbm, SbmOptions};
use crate::engine::{DeviceEngine, EngineOptions, LossReads, PendingLosses, PendingParams};
use crate::error::{Result, StopCause};
use crate::executor::{BatchRef, EpochEnd, EpochRun};
use crate::task::Task;
use crate::trace::{Tracer, TrackKind};

/// What one batch's share of a launch costs on the scripted clock.
const LAUNCH: Duration = Duration::from_millis(1);
/// What one step costs.
const STEP: Duration = Duration::from_millis(10);
const DIM: usize = 16;
/// Batches per super-batch.
const N: usize = 2;

/// A host-backend engine whose launches and steps advance `clock`.
struct Scripted {
    inner: LayerEngine<HostBackend>,
    clock: ManualClock,
}

impl LossReads for Scripted {
    fn queue_loss_read(&mut self, n: usize) -> Result<Box<dyn PendingLosses>> {
        self.inner.queue_loss_read(n)
    }
    fn rewind_skipped(&mut self, skipped: usize) -> Result<()> {
        self.inner.rewind_skipped(skipped)
    }
}

impl LayerDevice for Scripted {
    fn version(&self) -> u64 {
        LayerDevice::version(&self.inner)
    }
    fn hot_width(&self) -> usize {
        self.inner.hot_width()
    }
    fn feature_dtype(&self) -> gpu_ops::FeatureDtype {
        self.inner.feature_dtype()
    }
    fn new_staging(&self, rows: usize) -> Result<Box<dyn HotStaging>> {
        self.inner.new_staging(rows)
    }
    fn hot_slab_reserve(&mut self, slab: usize, rows: usize) -> Result<()> {
        self.inner.hot_slab_reserve(slab, rows)
    }
    fn hot_install(
        &mut self,
        slab: usize,
        row0: usize,
        n: usize,
        staging: &mut dyn HotStaging,
    ) -> Result<()> {
        self.inner.hot_install(slab, row0, n, staging)
    }
    fn hot_keep(&mut self, slab: usize, rows: &[u32], vertices: &[u32]) -> Result<()> {
        self.inner.hot_keep(slab, rows, vertices)
    }
    fn hot_carry(&mut self, slab: usize, rows: &[u32], vertices: &[u32]) -> Result<()> {
        self.inner.hot_carry(slab, rows, vertices)
    }
    fn prepare_tops(&mut self, batches: &[TopBatch<'_>]) -> Result<TopsAhead> {
        for _ in batches {
            self.clock.advance(LAUNCH);
        }
        self.inner.prepare_tops(batches)
    }
    fn adopt_tops(&mut self, tops: PreparedTops) -> Result<()> {
        self.inner.adopt_tops(tops)
    }
    fn prepare_bottoms(&mut self, batches: &[BottomBatch<'_>]) -> Result<()> {
        self.inner.prepare_bottoms(batches)
    }
    fn bottom_counts(&self) -> BottomCounts {
        self.inner.bottom_counts()
    }
    fn train_prepared(
        &mut self,
        key: u64,
        batch: BatchRef<'_>,
        hot: &HotUse<'_>,
        deferred: Option<usize>,
    ) -> Result<Option<(f64, usize)>> {
        self.clock.advance(STEP);
        self.inner.train_prepared(key, batch, hot, deferred)
    }
    fn loss_lag(&self) -> usize {
        self.inner.loss_lag()
    }
    fn discard_prepared(&mut self) {
        self.inner.discard_prepared()
    }
    fn layer0_params(&self) -> Result<Vec<Vec<f32>>> {
        self.inner.layer0_params()
    }
    fn publish_layer0(&self) -> Result<Box<dyn PendingParams>> {
        self.inner.publish_layer0()
    }
    fn update_cache(&mut self, insert: &[u32], evict: &[u32]) -> Result<usize> {
        self.inner.update_cache(insert, evict)
    }
    fn cache_stats(&self) -> gpu_ops::CacheStats {
        LayerDevice::cache_stats(&self.inner)
    }
    fn row_bytes(&self) -> u64 {
        self.inner.row_bytes()
    }
    fn h2d_bytes(&self) -> u64 {
        LayerDevice::h2d_bytes(&self.inner)
    }
    fn transfer_stats(&self) -> gpu_ops::TransferStats {
        LayerDevice::transfer_stats(&self.inner)
    }
}

struct Rig {
    ds: Arc<Dataset>,
    device: Scripted,
    orch: Orchestrator,
    clock: ManualClock,
    batches: Vec<Vec<u32>>,
}

fn rig() -> Rig {
    rig_with(gpu_ops::FeatureDtype::F32)
}

/// The rig with the device storing feature rows as `dtype`.
fn rig_with(dtype: gpu_ops::FeatureDtype) -> Rig {
    rig_opts(dtype, false)
}

/// The rig with feature rows as `dtype`, sampling the top layers on the
/// sampling sibling when `sample_ahead` (`device.sample_ahead`).
fn rig_opts(dtype: gpu_ops::FeatureDtype, sample_ahead: bool) -> Rig {
    let ds = Arc::new(
        generate_sbm(&SbmOptions {
            num_vertices: 2000,
            num_edges: 10_000,
            num_classes: 4,
            feature_dim: DIM,
            ..SbmOptions::default()
        })
        .unwrap(),
    );
    let model = ModelConfig {
        kind: ModelKind::Sage,
        in_dim: DIM,
        hidden: 8,
        num_classes: 4,
        num_layers: 2,
        heads: 1,
        dropout: 0.0,
    };
    let fanouts = vec![5, 5];
    let inner = DeviceEngine::new(
        HostBackend::new(),
        &ds,
        &model,
        EngineOptions {
            cache_bytes: 200 * DIM * 4,
            feature_dtype: dtype,
            sample_ahead,
            ..EngineOptions::for_tests(fanouts.clone())
        },
    )
    .unwrap();
    let inner = LayerEngine::new(inner, LayerState::default());
    let train_ids: Vec<u32> = (0..640).collect();
    let opts = LayerOptions {
        hotness: scheduler::HotnessPolicy::new(scheduler::Hotness::Degree, 1).unwrap(),
        hot_ratio: 0.1,
        super_batch: N,
        staleness_bound: 3,
        on_late: scheduler::OnLate::Wait,
        hot_grad: gpu_ops::HotGrad::default(),
        monitor: false,
        monitor_control: scheduler::MonitorControl::Time,
        cpu_workers: 1,
        reuse: true,
    };
    let mut orch = Orchestrator::new(&LayerSetup {
        opts: &opts,
        ds: &ds,
        model: &model,
        fanouts: &fanouts,
        train_ids: &train_ids,
        batch_size: 64,
        seed: 7,
        progress: &crate::progress::NoProgress,
        tracer: &crate::trace::Tracer::disabled(),
    })
    .unwrap();
    let clock = ManualClock::new();
    orch.set_clock(Arc::new(clock.clone()));
    Rig {
        ds,
        device: Scripted {
            inner,
            clock: clock.clone(),
        },
        orch,
        clock,
        batches: train_ids.chunks(64).map(<[u32]>::to_vec).collect(),
    }
}

impl Rig {
    /// Trains batches `0..end` with the window `mark`; the window's seconds.
    fn window(&mut self, end: usize, mark: (usize, usize)) -> Option<f64> {
        self.train(end, Some(mark));
        let ((t0, _), (t1, _)) = self.orch.last_window()?;
        Some(t1 - t0)
    }

    /// Trains batches `0..end`, checking the clock moved by each launch and step.
    fn train(&mut self, end: usize, mark: Option<(usize, usize)>) {
        let batches: Vec<&[u32]> = self.batches.iter().map(Vec::as_slice).collect();
        let tracer = Tracer::disabled();
        let cancel = CancelToken::new();
        let run = EpochRun {
            ds: &self.ds,
            batches: &batches,
            start: 0,
            end,
            mark,
            base_seed: 3,
            epoch: 0,
            tracer: &tracer,
            acc_track: tracer.declare_track("acc", TrackKind::Accelerator),
            cancel: &cancel,
            clock: &self.clock,
            task: &Task::Node,
        };
        let before = self.clock.now();
        let end = self
            .orch
            .run_epoch(&mut self.device, &run, &mut |_| Ok(false))
            .unwrap();
        assert_eq!(end, EpochEnd::Finished(false));
        // Every launch and step of the run moved the clock.
        let run_ms = (self.clock.now() - before).as_millis();
        assert_eq!(
            run_ms as usize,
            run.end * (LAUNCH + STEP).as_millis() as usize
        );
    }
}

fn ms(secs: f64) -> u64 {
    (secs * 1e3).round() as u64
}

#[test]
fn a_window_followed_by_two_super_batches_holds_one_launch_per_timed_super_batch() {
    // Warm super-batch 0, time super-batches 1 and 2, then super-batches 3 and
    // 4: the window opens before super-batch 1 launches super-batch 2 (whose
    // batches were sampled for the planner when 1 was launched) and samples
    // super-batch 3, and closes after batch 5, so it holds the sampling of
    // super-batches 3 and 4 (4 batches) and 4 steps, as in steady state (it
    // once opened at batch 2's gate, after the launch, and missed one:
    // 2026-11-26, 1.46 ms/batch measured for 2.84 real).
    let mut r = rig();
    let secs = r.window(5 * N, (N, 3 * N)).expect("window closed");
    let per = (LAUNCH + STEP).as_millis() as u64;
    assert_eq!(ms(secs), 2 * N as u64 * per);
}

#[test]
fn a_window_near_the_end_of_the_run_holds_the_launches_there_are() {
    // Fewer than two super-batches after the window: its last launches have
    // nothing (or one super-batch fewer) to sample ahead.
    let steps = 2 * N as u64 * STEP.as_millis() as u64;
    let launches = N as u64 * LAUNCH.as_millis() as u64;
    let mut r = rig();
    let secs = r.window(4 * N, (N, 3 * N)).expect("window closed");
    assert_eq!(ms(secs), steps + launches);
    let mut r = rig();
    let secs = r.window(3 * N, (N, 3 * N)).expect("window closed");
    assert_eq!(ms(secs), steps);
}

#[test]
fn a_run_that_stops_before_the_window_ends_measures_nothing() {
    let mut r = rig();
    assert!(r.window(2 * N, (N, 3 * N)).is_none());
}

#[test]
fn a_new_split_under_a_running_monitor_restarts_it_from_that_split() {
    // `auto` probes with the monitor on at the whole hot set, then sets the split
    // it chose: the monitor must plan with that split, not keep its own.
    let mut r = rig();
    r.orch.enable_monitor();
    r.train(4 * N, None);
    let computed = |r: &Rig| {
        r.orch
            .last_epoch()
            .expect("an epoch")
            .protocol
            .rows_computed
    };
    assert!(computed(&r) > 0, "the CPU computed no hot rows");
    r.orch.set_cpu_split(0).unwrap();
    // Two super-batches: the monitor observes neither (the pipeline fills and
    // drains), so it moves nothing and the split is the one set.
    r.train(2 * N, None);
    assert_eq!(computed(&r), 0, "the monitor kept its own split");
}

#[test]
fn bf16_rows_on_the_device_make_the_cpu_read_the_bf16_copy() {
    for (dtype, copy) in [
        (gpu_ops::FeatureDtype::F32, false),
        (gpu_ops::FeatureDtype::Bf16, true),
    ] {
        let mut r = rig_with(dtype);
        r.train(2 * N, None);
        assert_eq!(r.orch.reads_bf16_rows(), copy, "{dtype:?}");
        let rows = r
            .orch
            .last_epoch()
            .expect("an epoch")
            .protocol
            .rows_computed;
        assert!(rows > 0, "{dtype:?}: the CPU computed no hot rows");
    }
}

impl Rig {
    /// Trains batches `0..end`, stopping from the callback after batch `stop`
    /// (a callback's stop, or a cancelled token seen at the next gate).
    fn run(&mut self, end: usize, stop: Option<(usize, bool)>) -> Result<EpochEnd> {
        let batches: Vec<&[u32]> = self.batches.iter().map(Vec::as_slice).collect();
        let tracer = Tracer::disabled();
        let cancel = CancelToken::new();
        let run = EpochRun {
            ds: &self.ds,
            batches: &batches,
            start: 0,
            end,
            mark: None,
            base_seed: 3,
            epoch: 0,
            tracer: &tracer,
            acc_track: tracer.declare_track("acc", TrackKind::Accelerator),
            cancel: &cancel,
            clock: &self.clock,
            task: &Task::Node,
        };
        self.orch.run_epoch(&mut self.device, &run, &mut |d| {
            Ok(match stop {
                Some((k, token)) if d.k == k => {
                    if token {
                        cancel.cancel();
                    }
                    !token
                }
                _ => false,
            })
        })
    }
}

#[test]
fn a_failed_plan_ends_the_epoch_with_its_error_and_the_next_runs() {
    let mut r = rig();
    // Super-batch 2 is planned while super-batch 0 trains.
    r.orch.inject_plan_fault(Some(2));
    let e = r.run(4 * N, None).unwrap_err().to_string();
    assert!(e.contains("planner") && e.contains("super-batch 2"), "{e}");
    assert_eq!(r.orch.planners_alive(), 0);
    r.orch.inject_plan_fault(None);
    assert_eq!(r.run(4 * N, None).unwrap(), EpochEnd::Finished(false));
    assert!(r.orch.last_epoch().unwrap().protocol.hot_uses > 0);
}

#[test]
fn a_stop_mid_epoch_joins_the_planner_with_plans_in_flight() {
    for token in [false, true] {
        let mut r = rig();
        // Batch 2 is super-batch 1's first: super-batch 3 is in flight then.
        let end = r.run(5 * N, Some((N, token))).unwrap();
        assert_eq!(
            end,
            EpochEnd::Stopped(
                N + 1,
                if token {
                    StopCause::Token
                } else {
                    StopCause::Callback
                }
            )
        );
        assert_eq!(r.orch.planners_alive(), 0, "token {token}");
        // Nothing of the stopped run is left over: a whole run follows.
        assert_eq!(r.run(5 * N, None).unwrap(), EpochEnd::Finished(false));
        assert_eq!(r.orch.planners_alive(), 0);
    }
}

/// The device's hot-row store (reuse across super-batches): kept slab rows come
/// back, unchanged, in whichever slab and row a later carry puts them, also
/// after the store grew; a carry of a row never kept is refused.
#[test]
fn kept_rows_are_carried_into_another_slab_unchanged() {
    let mut dev = rig().device.inner;
    let w = dev.hot_width();
    dev.hot_slab_reserve(0, 4).unwrap();
    let mut staging = dev.new_staging(4).unwrap();
    for (i, x) in staging.rows_mut()[..4 * w].iter_mut().enumerate() {
        *x = i as f32 + 0.5;
    }
    dev.hot_install(0, 0, 4, &mut *staging).unwrap();
    let row = |k: usize| -> Vec<f32> { (k * w..(k + 1) * w).map(|i| i as f32 + 0.5).collect() };
    // Slab rows 1 and 3 go to vertices 10 and 2.
    dev.hot_keep(0, &[1, 3], &[10, 2]).unwrap();
    // The store grows (vertex 500) and keeps what it held.
    dev.hot_keep(0, &[0], &[500]).unwrap();
    dev.hot_slab_reserve(1, 3).unwrap();
    dev.hot_carry(1, &[0, 2], &[2, 10]).unwrap();
    dev.hot_carry(1, &[1], &[500]).unwrap();
    let slab = dev.hot_slab_to_host(1).unwrap();
    assert_eq!(&slab[..w], &row(3)[..]);
    assert_eq!(&slab[w..2 * w], &row(0)[..]);
    assert_eq!(&slab[2 * w..3 * w], &row(1)[..]);
    // Slab 0 is untouched by the carries.
    let first = dev.hot_slab_to_host(0).unwrap();
    assert_eq!(&first[3 * w..4 * w], &row(3)[..]);
    // Past the store, past the slab, mismatched lengths: errors, not panics.
    assert!(dev.hot_carry(1, &[0], &[100_000]).is_err());
    assert!(dev.hot_carry(1, &[99], &[2]).is_err());
    assert!(dev.hot_keep(0, &[0, 1], &[2]).is_err());
}

/// Hot rows installed into `slab` of a fresh `dtype` rig: rows of values
/// that are not bfloat16-exact, written by a "worker" and sealed. Returns the
/// slab's first `rows` rows as the device holds them, the values written, and
/// the upload bytes the install moved (engine count, transfer stats).
fn install_hot_rows(dtype: gpu_ops::FeatureDtype, rows: usize) -> (Vec<f32>, Vec<f32>, u64, u64) {
    let mut dev = rig_with(dtype).device.inner;
    let w = dev.hot_width();
    dev.hot_slab_reserve(0, rows + 2).unwrap();
    let mut staging = dev.new_staging(rows).unwrap();
    let written: Vec<f32> = (0..rows * w)
        .map(|i| (i as f32 * 0.371 - 5.0) / 3.0 + 1e-4 * (i % 7) as f32)
        .collect();
    staging.rows_mut()[..rows * w].copy_from_slice(&written);
    staging.seal(rows);
    let h2d = LayerDevice::h2d_bytes(&dev);
    let up = LayerDevice::transfer_stats(&dev).upload_bytes;
    // Rows 1..=rows: an install at an offset (odd, for the widening).
    dev.hot_install(0, 1, rows, &mut *staging).unwrap();
    let moved = LayerDevice::h2d_bytes(&dev) - h2d;
    let uploaded = LayerDevice::transfer_stats(&dev).upload_bytes - up;
    let slab = dev.hot_slab_to_host(0).unwrap();
    (slab[w..(rows + 1) * w].to_vec(), written, moved, uploaded)
}

/// With bfloat16 feature rows the hot rows are staged and uploaded as
/// bfloat16: the rows the device reads are the fp32 rows rounded to nearest
/// even (the crate's conversion), and the upload is half the bytes; with fp32
/// rows they are the rows written, bit for bit.
#[test]
fn bf16_rows_upload_hot_rows_as_bf16_rounded_to_nearest_even() {
    let rows = 5;
    let (f32_slab, written, f32_h2d, f32_up) = install_hot_rows(gpu_ops::FeatureDtype::F32, rows);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&f32_slab), bits(&written));
    let (bf16_slab, written16, bf16_h2d, bf16_up) =
        install_hot_rows(gpu_ops::FeatureDtype::Bf16, rows);
    assert_eq!(written16, written);
    let rounded: Vec<f32> = written.iter().map(|&x| gpu_ops::round_to_bf16(x)).collect();
    assert_eq!(bits(&bf16_slab), bits(&rounded));
    // The values were not bfloat16-exact: the test sees the rounding.
    assert!(rounded.iter().zip(&written).any(|(a, b)| a != b));
    let w = rig_with(gpu_ops::FeatureDtype::F32)
        .device
        .inner
        .hot_width() as u64;
    assert_eq!(f32_h2d, rows as u64 * w * 4);
    assert_eq!(bf16_h2d, rows as u64 * w * 2);
    assert_eq!(f32_up, f32_h2d);
    assert_eq!(bf16_up, bf16_h2d);
}

/// A bfloat16 staging buffer must be sealed before its rows are installed:
/// rows written but not sealed are refused (an error, not stale bits).
#[test]
fn bf16_hot_install_refuses_unsealed_rows() {
    let mut dev = rig_with(gpu_ops::FeatureDtype::Bf16).device.inner;
    dev.hot_slab_reserve(0, 4).unwrap();
    let mut staging = dev.new_staging(4).unwrap();
    staging.rows_mut().fill(1.0);
    staging.seal(2);
    assert!(dev.hot_install(0, 0, 3, &mut *staging).is_err());
    dev.hot_install(0, 0, 2, &mut *staging).unwrap();
    // Writing again unseals.
    staging.rows_mut().fill(2.0);
    assert!(dev.hot_install(0, 0, 1, &mut *staging).is_err());
}

/// With `device.sample_ahead` each super-batch's top layers cost one
/// synchronization of the sampling stream (the read of their sizes and bottom
/// destinations, which the planner thread waits for) and none of the compute
/// stream (sampling them at train time took three a batch on the compute
/// stream: two hops and a download) — and its bottom hops cost none of either (`executor/layer/device/`
/// step 1b: one read of their sizes, finished at the super-batch's first
/// batch by one event wait), where they took one synchronization of the
/// compute stream per batch before. Without it both reads are the compute
/// stream's.
#[test]
fn each_super_batch_s_top_layers_cost_one_sampling_synchronization() {
    let super_batches = 5;
    let batches = super_batches * N;
    let runs: Vec<((u64, u64, u64), BottomCounts)> = [false, true]
        .into_iter()
        .map(|ahead| {
            let mut r = rig_opts(gpu_ops::FeatureDtype::F32, ahead);
            let before = r.device.inner.engine.syncs_by_stream();
            let waits = r.device.inner.sampling_event_waits();
            r.train(batches, None);
            let after = r.device.inner.engine.syncs_by_stream();
            let waits = r.device.inner.sampling_event_waits() - waits;
            (
                (after.0 - before.0, after.1 - before.1, waits),
                r.device.bottom_counts(),
            )
        })
        .collect();
    let (((compute_off, sampling_off, waits_off), off), ((compute_on, sampling_on, waits_on), on)) =
        (runs[0], runs[1]);
    eprintln!(
        "{batches} batches, 2 layers: without sample_ahead {compute_off} compute / \
         {sampling_off} sampling synchronizations and event waits {waits_off}; with it \
         {compute_on} / {sampling_on}, {waits_on}"
    );
    assert_eq!(sampling_off, 0, "no sibling without sample_ahead");
    assert_eq!(
        off,
        BottomCounts::default(),
        "nothing sampled ahead without it"
    );
    // Under on_late = "wait" every batch trains with its planned positions.
    assert_eq!(
        on,
        BottomCounts {
            ahead: batches as u64,
            resampled: 0
        }
    );
    assert_eq!(
        sampling_on, super_batches as u64,
        "one read of the top layers per super-batch ({N} batches each)"
    );
    assert_eq!(
        (waits_off, waits_on),
        (0, super_batches as u64),
        "one event wait for the bottom hops' read per super-batch"
    );
    assert_eq!(
        compute_off - compute_on,
        (super_batches + batches) as u64,
        "the reads moved off the compute stream ({compute_off} vs {compute_on}): \
         the top layers' one a super-batch, the bottom hop's one a batch"
    );
}

/// The top layers read ahead are those hop-by-hop sampling draws (the bottom
/// destinations of `cpu_ops::sample_hop` with `derive_seed(seed, 1)`), the read
/// is finished on another thread, and batches trained from them train the same
/// with the read on the sampling sibling as on the engine's backend (losses
/// and weights bit for bit).
#[test]
fn top_layers_read_ahead_are_the_hop_by_hop_ones_and_train_the_same() {
    let r = rig();
    let ds = Arc::clone(&r.ds);
    let mut engines = engines_with_and_without_sibling();
    let mut rng = cpu_ops::Rng::new(41);
    let mut scratch = cpu_ops::SamplerScratch::new(ds.num_vertices());
    let no_hot = HotUse {
        slab: 0,
        positions: &[],
        rows: &[],
        grad: gpu_ops::HotGrad::default(),
    };
    for round in 0..3u64 {
        let count = 1 + rng.below(4) as usize;
        let batches = random_batches(&mut rng, ds.num_vertices(), count, (1, 64));
        let tops = top_batches(&batches, round);
        let want: Vec<Vec<u32>> = batches
            .iter()
            .map(|(seeds, seed)| {
                let hop = cpu_ops::sample_hop(
                    &ds.graph,
                    seeds,
                    5,
                    cpu_ops::derive_seed(*seed, 1),
                    None,
                    &mut scratch,
                )
                .unwrap();
                hop.src_ids().to_vec()
            })
            .collect();
        let mut losses = Vec::new();
        for (ahead, e) in &mut engines {
            let (c0, s0) = e.engine.syncs_by_stream();
            let reading = e.prepare_tops(&tops).unwrap();
            let queued = e.engine.syncs_by_stream();
            let read = std::thread::scope(|t| t.spawn(|| reading.wait()).join())
                .unwrap()
                .unwrap();
            let done = e.engine.syncs_by_stream();
            if *ahead {
                assert_eq!(queued, (c0, s0), "queued without a synchronization");
                assert_eq!(done, (c0, s0 + 1), "one read, on the sampling stream");
            } else {
                assert_eq!(queued, (c0 + 1, s0), "one read, on the compute stream");
                assert_eq!(done, queued);
            }
            assert_eq!(read.bottoms, want, "round {round}, ahead {ahead}");
            e.adopt_tops(read.tops).unwrap();
            let l: Vec<(u64, usize)> = tops
                .iter()
                .map(|b| {
                    let (loss, correct) = e
                        .train_prepared(b.key, BatchRef::for_seeds(b.seeds, b.seed), &no_hot, None)
                        .unwrap()
                        .unwrap();
                    (loss.to_bits(), correct)
                })
                .collect();
            losses.push(l);
        }
        assert_eq!(losses[0], losses[1], "round {round}");
    }
    use crate::engine::ModelState;
    assert_eq!(
        engines[0].1.engine.params_to_host().unwrap(),
        engines[1].1.engine.params_to_host().unwrap()
    );
    // A batch never adopted is not trained.
    let e = &mut engines[1].1;
    assert!(e
        .train_prepared(999, BatchRef::for_seeds(&[1], 1), &no_hot, None)
        .is_err());
}

/// A batch's excluded pairs (link prediction) leave its top layers when they
/// are adopted and its bottom hop when it is read, on the stream that sampled
/// them: with the sampling sibling the compute stream synchronizes exactly as
/// often as without the pairs, and the sibling once per block; the batches
/// train bit for bit as without the sibling (all on the compute stream), and
/// not as without the pairs.
#[test]
fn excluded_pairs_leave_the_blocks_on_the_stream_that_sampled_them() {
    let r = rig();
    let ds = Arc::clone(&r.ds);
    let mut rng = cpu_ops::Rng::new(47);
    let batches = random_batches(&mut rng, ds.num_vertices(), 3, (8, 24));
    // Every edge at each seed, both directions: the top block loses them all.
    let pairs: Vec<Vec<(u32, u32)>> = batches
        .iter()
        .map(|(seeds, _)| {
            seeds
                .iter()
                .flat_map(|&s| {
                    ds.graph
                        .neighbors(s)
                        .iter()
                        .flat_map(move |&n| [(s, n), (n, s)])
                })
                .collect()
        })
        .collect();
    let no_hot = HotUse {
        slab: 0,
        positions: &[],
        rows: &[],
        grad: gpu_ops::HotGrad::default(),
    };
    // Per engine (without, with the sibling) and without / with the pairs:
    // the losses, and the compute and sampling streams' synchronizations.
    let mut runs = Vec::new();
    for exclude in [false, true] {
        for (ahead, mut e) in engines_with_and_without_sibling() {
            let no_pairs: &[(u32, u32)] = &[];
            let of = |i: usize| if exclude { &pairs[i][..] } else { no_pairs };
            let tops: Vec<TopBatch<'_>> = top_batches(&batches, 0)
                .into_iter()
                .enumerate()
                .map(|(i, t)| TopBatch {
                    exclude: of(i),
                    ..t
                })
                .collect();
            let (c0, s0) = e.engine.syncs_by_stream();
            let read = e.prepare_tops(&tops).unwrap().wait().unwrap();
            e.adopt_tops(read.tops).unwrap();
            let bottoms: Vec<BottomBatch<'_>> = tops
                .iter()
                .map(|t| BottomBatch {
                    key: t.key,
                    seed: t.seed,
                    skip: &[],
                })
                .collect();
            e.prepare_bottoms(&bottoms).unwrap();
            let losses: Vec<u64> = tops
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let batch = BatchRef {
                        exclude: of(i),
                        ..BatchRef::for_seeds(t.seeds, t.seed)
                    };
                    let (loss, _) = e
                        .train_prepared(t.key, batch, &no_hot, None)
                        .unwrap()
                        .unwrap();
                    loss.to_bits()
                })
                .collect();
            let (c1, s1) = e.engine.syncs_by_stream();
            runs.push(((exclude, ahead), losses, c1 - c0, s1 - s0));
        }
    }
    let find = |key: (bool, bool)| runs.iter().find(|r| r.0 == key).unwrap();
    let (plain, excluded) = (find((false, true)), find((true, true)));
    assert_eq!(
        excluded.2, plain.2,
        "compute stream: no synchronization added"
    );
    // One read of the kept edge count per block: a top layer and a bottom hop
    // per batch.
    assert_eq!(excluded.3, plain.3 + 2 * batches.len() as u64);
    assert_eq!(
        excluded.1,
        find((true, false)).1,
        "same training either way"
    );
    assert_ne!(excluded.1, plain.1, "the pairs left the blocks");
    // Without the sibling everything is on the compute stream.
    assert_eq!(
        find((true, false)).2,
        find((false, false)).2 + 2 * batches.len() as u64
    );
}

/// The bottom hops sampled a super-batch ahead (`executor/layer/device/` step 1b)
/// train bit for bit as the hops sampled at train time: with
/// `hot_backward = "constant"` masked by the planned hot positions — a batch
/// trained with fewer positions (late chunks left cold under `on_late =
/// "compute"`) samples its hop again, counted — and with `"aggregate"`
/// unmasked. Queueing them synchronizes nothing; the super-batch's first batch
/// finishes their one read with an event wait, no synchronization; each hop
/// used ahead saves the compute stream one synchronization.
#[test]
fn bottom_hops_sampled_ahead_train_as_at_train_time_and_resample_when_the_mask_changed() {
    use crate::engine::ModelState;
    let r = rig();
    let ds = Arc::clone(&r.ds);
    let mut engines = engines_with_and_without_sibling();
    // Slab 0 holds 40 rows of fixed values on both engines.
    let slab_rows = 40usize;
    for (_, e) in &mut engines {
        let w = e.hot_width();
        e.hot_slab_reserve(0, slab_rows).unwrap();
        let mut staging = e.new_staging(slab_rows).unwrap();
        for (i, x) in staging.rows_mut()[..slab_rows * w].iter_mut().enumerate() {
            *x = ((i * 37 % 101) as f32 - 50.0) / 70.0;
        }
        staging.seal(slab_rows);
        e.hot_install(0, 0, slab_rows, &mut *staging).unwrap();
    }
    let mut rng = cpu_ops::Rng::new(43);
    for (round, grad) in [
        gpu_ops::HotGrad::Constant,
        gpu_ops::HotGrad::Aggregate,
        gpu_ops::HotGrad::Constant,
    ]
    .into_iter()
    .enumerate()
    {
        let round = round as u64;
        let batches = random_batches(&mut rng, ds.num_vertices(), 4, (8, 40));
        let tops = top_batches(&batches, round);
        let mut per_engine = Vec::new();
        for (ahead, e) in &mut engines {
            let read = e.prepare_tops(&tops).unwrap().wait().unwrap();
            let bottoms = read.bottoms.clone();
            e.adopt_tops(read.tops).unwrap();
            // Planned: every other position past the seeds (they never take
            // a hot row), slab rows in turn.
            let planned: Vec<Vec<u32>> = bottoms
                .iter()
                .zip(&batches)
                .map(|(b, (seeds, _))| (seeds.len() as u32..b.len() as u32).step_by(2).collect())
                .collect();
            let masked = grad == gpu_ops::HotGrad::Constant;
            let bottom_batches: Vec<BottomBatch<'_>> = tops
                .iter()
                .zip(&planned)
                .map(|(t, p)| BottomBatch {
                    key: t.key,
                    seed: t.seed,
                    skip: if masked { p } else { &[] },
                })
                .collect();
            let syncs = e.engine.syncs_by_stream();
            e.prepare_bottoms(&bottom_batches).unwrap();
            assert_eq!(
                e.engine.syncs_by_stream(),
                syncs,
                "queued without a synchronization"
            );
            let counts = e.bottom_counts();
            let mut losses = Vec::new();
            for (i, t) in tops.iter().enumerate() {
                // Batch 1 leaves its first planned positions cold.
                let positions: Vec<u32> = match i {
                    1 => planned[i].iter().skip(2).copied().collect(),
                    _ => planned[i].clone(),
                };
                let rows: Vec<u32> = (0..positions.len())
                    .map(|j| ((j * 7 + i) % slab_rows) as u32)
                    .collect();
                let before = e.engine.syncs_by_stream();
                let waits = e.sampling_event_waits();
                let (loss, correct) = e
                    .train_prepared(
                        t.key,
                        BatchRef::for_seeds(t.seeds, t.seed),
                        &HotUse {
                            slab: 0,
                            positions: &positions,
                            rows: &rows,
                            grad,
                        },
                        None,
                    )
                    .unwrap()
                    .unwrap();
                let after = e.engine.syncs_by_stream();
                let waits = e.sampling_event_waits() - waits;
                let read_now = u64::from(*ahead && i == 0);
                assert_eq!(
                    (after.1 - before.1, waits),
                    (0, read_now),
                    "round {round}, batch {i}: the read is finished by the first batch, \
                     with an event wait"
                );
                losses.push((loss.to_bits(), correct, after.0 - before.0));
            }
            let got = e.bottom_counts();
            let resampled = u64::from(masked && planned[1].len() > 2);
            let want = if *ahead {
                BottomCounts {
                    ahead: counts.ahead + 4 - resampled,
                    resampled: counts.resampled + resampled,
                }
            } else {
                BottomCounts::default()
            };
            assert_eq!(got, want, "round {round}, ahead {ahead}");
            per_engine.push(losses);
        }
        let (off, on) = (&per_engine[0], &per_engine[1]);
        for (i, (a, b)) in off.iter().zip(on).enumerate() {
            assert_eq!((a.0, a.1), (b.0, b.1), "round {round}, batch {i}: loss");
            // A hop used ahead saves the compute stream its synchronization.
            let saved = u64::from(!(i == 1 && grad == gpu_ops::HotGrad::Constant));
            assert_eq!(a.2 - b.2, saved, "round {round}, batch {i}: compute syncs");
        }
    }
    assert_eq!(
        engines[0].1.engine.params_to_host().unwrap(),
        engines[1].1.engine.params_to_host().unwrap()
    );
    // A batch never prepared is not trained; forgetting drops the hops too.
    let e = &mut engines[1].1;
    e.discard_prepared();
    let no_hot = HotUse {
        slab: 0,
        positions: &[],
        rows: &[],
        grad: gpu_ops::HotGrad::Constant,
    };
    assert!(e
        .train_prepared(0, BatchRef::for_seeds(&[1], 1), &no_hot, None)
        .is_err());
}

/// `count` batches of distinct random seeds below `n`, `lo + below(span)`
/// each, with random seeds.
fn random_batches(
    rng: &mut cpu_ops::Rng,
    n: usize,
    count: usize,
    (lo, span): (usize, u64),
) -> Vec<(Vec<u32>, u64)> {
    (0..count)
        .map(|_| {
            let mut s: Vec<u32> = (0..n as u32).collect();
            rng.shuffle(&mut s);
            s.truncate(lo + rng.below(span) as usize);
            (s, rng.next_u64())
        })
        .collect()
}

/// `batches` as top batches of round `round` (keys `100 · round + i`).
fn top_batches(batches: &[(Vec<u32>, u64)], round: u64) -> Vec<TopBatch<'_>> {
    batches
        .iter()
        .enumerate()
        .map(|(i, (seeds, seed))| TopBatch {
            key: 100 * round + i as u64,
            seeds,
            seed: *seed,
            exclude: &[],
        })
        .collect()
}

/// Two fp32 rig engines: without (`false`) and with (`true`) the sampling
/// sibling (`device.sample_ahead`).
fn engines_with_and_without_sibling() -> Vec<(bool, LayerEngine<HostBackend>)> {
    [false, true]
        .into_iter()
        .map(|ahead| {
            (
                ahead,
                rig_opts(gpu_ops::FeatureDtype::F32, ahead).device.inner,
            )
        })
        .collect()
}
