//! The super-batch pipeline's driver: [`Orchestrator`] trains an epoch of the
//! layer-based executor on a device ([`LayerDevice`]) and the persistent CPU
//! workers by carrying out the actions of [`scheduler::Protocol`].
//!
//! The protocol is `scheduler::protocol`: what is launched, queued, installed,
//! gated, waited for, trained with which hot rows and on which bottom hop,
//! published, read back (deferred losses), shown, marked and retired is
//! decided there, and its module doc's numbered steps are the one description
//! of it (docs/orchestration.md §2; §9 says why it is so and what was measured).
//! Nothing here decides any of it: this module owns the resources the protocol
//! names with plain numbers — the engine, the worker channels, claim flags,
//! staging buffers, the clock, the monitor and the trace — and executes.
//!
//! # Driving it (one epoch, the accelerator thread)
//! 1. **Setup** (once per trainer, [`Orchestrator::new`]): score hotness
//!    (`orchestration.hotness`; a `hotness scores` slice, the pre-sampling
//!    pass's progress reported as phase `"presample"`), build the
//!    [`Relabeling`] (hot = relabeled id below `hot_count`) and the
//!    [`Protocol`], which lives across epochs. The
//!    workers (`workers.rs`) start on the first epoch and live as long as the
//!    orchestrator.
//! 2. **Start**: [`Event::EpochStarted`] with the run's batches, the
//!    engine's version and loss lag ([`LayerDevice::loss_lag`]) and the run's
//!    measurement window ([`EpochRun::mark`]).
//! 3. **Hand in** every worker report waiting before every poll: computed rows
//!    as [`Event::ChunkComputed`] (the staging buffer is held, in report order,
//!    until the protocol's `Install` or `Discard` for it) — after
//!    [`Event::PublicationResolved`] when a worker resolved a newer
//!    publication's copies since the last report —, a dropped job as
//!    [`Event::JobDropped`]; a worker's failure is the epoch's error.
//! 4. **Carry out** each [`Action`], in order:
//!    - `Publish`: layer 0's weights at the engine's version to the workers
//!      ([`Published`]): queued on the compute stream without waiting
//!      ([`LayerDevice::publish_layer0`]; the first worker reading them waits
//!      for the copies and records their version for step 3); a reset at the
//!      epoch's start downloads them at once;
//!    - `Launch`: take this super-batch's plan from the planner thread
//!      (`planner.rs`: relabel, candidate-split counts for `policy = "auto"`,
//!      the split-independent [`scheduler::LaunchPlan`], made while the
//!      super-batch before trained) and answer `Planned` with the monitor's
//!      split (or the fixed one), its sampled top layers handed to the engine
//!      ([`LayerDevice::adopt_tops`]). Once its jobs are queued (at the next
//!      `Gate` or `Launch`), sample the top layers ([`LayerDevice::prepare_tops`],
//!      one read for the super-batch, on the sampling stream with
//!      `device.sample_ahead`) of the super-batch *after* it and submit the read
//!      to the planner, which waits for their bottom destinations. The run's
//!      first launch samples and submits its own super-batch and the next first;
//!    - `SampleBottoms`: its batches' bottom hops, each skipping the positions
//!      the protocol names (the planned hot ones; none with `hot_backward =
//!      "aggregate"`), queued on the sampling stream with one read of their
//!      sizes started ([`LayerDevice::prepare_bottoms`]; nothing without
//!      `device.sample_ahead`);
//!    - `ReserveSlab`: [`LayerDevice::hot_slab_reserve`];
//!    - `QueueJob`: the job with its vertices' user ids, the flag of its claim,
//!      a trace flow (regular jobs) and its sampling seed: a regular job's
//!      `derive_seed(derive_seed(base_seed, 5_000_000 + local), chunk)`, an
//!      urgent one's `derive_seed(derive_seed(base_seed, 6_000_000), seq)`;
//!    - `Install`: [`LayerDevice::hot_install`] of the report's rows; `Discard`:
//!      nothing; either way its staging buffer goes back to the workers;
//!    - `Keep` / `Carry` (reuse across super-batches):
//!      [`LayerDevice::hot_keep`] (installed slab rows into the device's
//!      hot-row store) / [`LayerDevice::hot_carry`] (stored rows into a new
//!      slab: rows not computed again);
//!    - `BeginSuperBatch` / `EndSuperBatch`: the hybrid monitor's evictions /
//!      its observation of the super-batch's window (`monitor.rs`);
//!    - `Gate`: a cancelled token answers [`Event::Stop`] (the epoch ends
//!      there, unless a callback stops it while the protocol shows the
//!      batches trained); else the batch's clock starts;
//!    - `Wait`: block for one report and hand it in (all workers dead: their
//!      error); a report handed in after the gate decided to wait withdraws
//!      the `Wait` (protocol step 6), so the one awaited is still to come;
//!    - `Train`: [`LayerDevice::train_prepared`] with the order's positions,
//!      slab rows and loss slot (under `device.loss_lag` > 1 the step reads
//!      no loss: `engine/losses.rs`), answer [`Event::BatchTrained`] with the
//!      engine's version; the batch is kept until it is shown. The engine uses
//!      the bottom hop sampled at the launch when it skipped exactly these
//!      positions, else samples it again (the `bottoms_ahead` /
//!      `bottoms_resampled` counts): as the order's `bottom_ahead` says, or
//!      the epoch fails;
//!    - `QueueLossRead` / `ResolveLossRead`: the deferred losses' read queued
//!      ([`LayerDevice::queue_loss_read`], no synchronization) / resolved on
//!      its event, answered with [`Event::LossesRead`] (`engine/losses.rs`);
//!    - `ShowLosses`: the version moved back by the steps a non-finite loss
//!      made the device skip, then `on_batch` sees the batches, in order; a
//!      callback's stop answers `Stop` (the protocol shows every batch trained
//!      before the epoch ends);
//!    - `Mark`: [`EpochRun::mark`]'s reading of the clock and the statistics;
//!    - `Retire`: the workers' drop watermark;
//!    - `Finished`: the epoch's counts; the epoch is over.
//! 5. **End** (finished, stopped or failed): a protocol still running is
//!    aborted ([`Event::Abort`]), the actions left are carried out (staging
//!    buffers go back, the watermark covers the epoch), the prepared batches
//!    are forgotten; after a worker's failure the workers are restarted on
//!    the next epoch.
//!
//! Trace (`acc stream compute` track): `launch` slices (with `super_batch`;
//! `plan wait` inside when its plan was not ready, and the engine's `sample
//! bottom ahead`: the bottom hops' kernels queued on the sampling stream and
//! their read started), `sample ahead` (the
//! engine's one `sample top` of the super-batch after it: kernels queued and a
//! read started, no synchronization with `device.sample_ahead`), `gate`, `hot wait` (inside the gate), `train`
//! (with `staleness_gap` = the batch's largest gap, the engine's `device step`
//! inside, and in it `bottom read` at a super-batch's first batch — the wait
//! for its bottom hops' read (an event, no synchronization) — and `sample bottom`
//! only where the hop is sampled at train time: without `device.sample_ahead`,
//! or when the batch's positions changed since its plan, then with
//! `bottom_resampled`, also an arg of the `train` slice), `loss read`
//! (consecutive loss actions: a read resolved and shown, the next queued;
//! its `host_syncs` is 0), `publish` (with its `downloads` and `host_syncs`:
//! one per layer-0 tensor and none); instants `hot install` (rows, bytes host
//! → device), `compute cold` (vertices), `hot carry` (rows carried into a
//! super-batch's slab) and `hot rows` at a super-batch's end (rows `queued`,
//! `computed`, `carried`, `uses`, `uses_per_computed_row`); `hot compute` slices on `hot worker
//! i` tracks with a flow to the first batch reading their rows; `plan` slices on
//! the `planner` track, with `sample wait` (the top layers' read) inside.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cpu_ops::{derive_seed, ModelConfig, NeighborSampler};
use scheduler::{
    Action, BottomHops, ChunkKey, ClaimId, Event, HotSplit, HotnessPolicy, PipelineConfig,
    Protocol, ProtocolConfig, Relabeling, ReportId, TrainBatch,
};

use super::device::{BottomBatch, HotStaging, HotUse, LayerDevice, TopBatch};
use crate::data::dataset::Dataset;
use crate::engine::{record_copies, DeferredLosses, PendingParams, Trained};
use crate::error::{Error, Result, StopCause};
use crate::executor::{BatchRef, EpochEnd, EpochRun, OnBatch};
use crate::task::TaskBatch;
use crate::trace::{Direction, FlowId, SliceGuard, Tracer, TrackId, TrackKind};

use super::hot_compute::{HotComputer, Published, Snapshot};
use super::monitor::{HybridMonitor, SuperBatchEnd, Window};
use super::planner::{PlanInputs, PlanRequest, Planner};
use super::stats::OrchestrationStats;
use super::workers::{Done, HotWorkers, InjectedFault, Job, Outcome, WorkerShared};
use crate::clock::{wall_clock, Clock, SharedClock};

/// Pipeline depth `D` (NeutronOrch's: the CPU works one super-batch ahead).
pub const DEPTH: usize = 1;
/// Largest number of vertices per CPU job (one upload per chunk).
pub const HOT_CHUNK: usize = 1024;

fn sched(context: &'static str) -> impl Fn(scheduler::SchedulerError) -> Error {
    move |source| Error::scheduler(context, source)
}

/// How the layer pipeline runs (`[orchestration]`, as the placement module
/// resolves it).
#[derive(Clone, Debug)]
pub(crate) struct LayerOptions {
    /// How vertices are ranked hot.
    pub hotness: HotnessPolicy,
    /// Fraction of vertices that are hot.
    pub hot_ratio: f64,
    /// Batches per super-batch.
    pub super_batch: usize,
    /// Largest allowed gap, in optimizer steps, of a reused row.
    pub staleness_bound: u64,
    /// What a batch does with a late row.
    pub on_late: scheduler::OnLate,
    /// What layer 0's backward does with reused rows.
    pub hot_grad: gpu_ops::HotGrad,
    /// Whether the hybrid monitor runs.
    pub monitor: bool,
    /// What it steers by.
    pub monitor_control: scheduler::MonitorControl,
    /// CPU workers computing hot rows.
    pub cpu_workers: usize,
    /// Keep hot rows across super-batches (`reuse_across_superbatches`).
    pub reuse: bool,
}

/// What [`Orchestrator::new`] needs: the pipeline's options, and the dataset,
/// model and training batches whose hot set it scores.
pub(crate) struct LayerSetup<'a> {
    /// The pipeline's options (`hot_ratio` sizes the hot set).
    pub opts: &'a LayerOptions,
    /// The dataset, in user ids.
    pub ds: &'a Arc<Dataset>,
    /// The trained model's configuration (layer 0's shape for the CPU).
    pub model: &'a ModelConfig,
    /// Training fanouts, bottom first.
    pub fanouts: &'a [u32],
    /// The training vertices.
    pub train_ids: &'a [u32],
    /// `train.batch_size`.
    pub batch_size: usize,
    /// `train.seed`.
    pub seed: u64,
    /// Where the pre-sampling pass reports its progress (phase
    /// `"presample"`, batches; `crate::progress`).
    pub progress: &'a dyn crate::progress::Progress,
    /// Where scoring the hot set records its `hotness scores` slice.
    pub tracer: &'a Tracer,
}

/// Layer-based orchestration for one trainer: the hot set, the protocol, the
/// workers, and what the driver holds for the numbers the protocol names.
pub struct Orchestrator {
    relabeling: Relabeling,
    split: HotSplit,
    /// The super-batch protocol (module doc); it lives across epochs.
    protocol: Protocol,
    /// Staging buffers, claim flags and trace flows the protocol names.
    held: Held,
    /// `orchestration.hot_backward`.
    hot_grad: gpu_ops::HotGrad,
    pipeline: PipelineConfig,
    workers_wanted: usize,
    bottom_fanout: u32,
    model: ModelConfig,
    ds: Arc<Dataset>,
    totals: OrchestrationStats,
    last_epoch: Option<OrchestrationStats>,
    fault: Option<InjectedFault>,
    /// `orchestration.monitor`.
    use_monitor: bool,
    /// `orchestration.monitor_control`.
    monitor_control: scheduler::MonitorControl,
    /// The hybrid monitor, built on the first epoch (it needs the engine's cache).
    monitor: Option<HybridMonitor>,
    /// The split changed under a running monitor: the next epoch restarts it
    /// from the new split, with the cache as it was loaded.
    monitor_outdated: bool,
    workers: Option<HotWorkers>,
    /// First core for the workers when pinning (`threads.pin = "cores"`).
    pin_from: Option<usize>,
    clock: SharedClock,
    /// The protocol's [`Action::Retire`] watermark, shared with the workers.
    retired: Arc<AtomicU64>,
    /// Where the workers' slices go, one track per worker.
    trace: (Tracer, Vec<TrackId>),
    /// The planner thread's track in `trace`'s tracer.
    planner_track: Option<TrackId>,
    /// Candidate splits whose counts launches accumulate (`policy = "auto"`).
    count_splits: Vec<u32>,
    /// Per candidate split: (rows queued, hot positions), and batches launched.
    split_counts: (Vec<(u64, u64)>, u64),
    /// The last run's measurement window ([`EpochRun::mark`]).
    window_marks: Marks,
    /// The bfloat16 host copy of the features the GraphSAGE hot kernel reads
    /// when the device stores bfloat16 rows (built on the first start of the
    /// workers that needs it: half the `f32` store's bytes).
    bf16_rows: Option<Arc<[u16]>>,
    /// Planner threads running (one per epoch run, joined before it returns).
    planners_alive: Arc<AtomicUsize>,
    /// Fails the plan of this global super-batch (tests).
    plan_fault: Option<u64>,
}

impl Orchestrator {
    /// Step 1: scores hotness over the training vertices with the training
    /// fanouts and batch size, relabels, builds the protocol.
    pub fn new(setup: &LayerSetup<'_>) -> Result<Self> {
        let LayerSetup {
            opts: cfg,
            ds,
            model,
            fanouts,
            train_ids,
            batch_size,
            seed,
            progress,
            tracer,
        } = setup;
        let (ds, batch_size, seed) = (Arc::clone(ds), *batch_size, *seed);
        let cpu_workers = cfg.cpu_workers;
        let policy = cfg.hotness;
        let sampler = NeighborSampler::new(fanouts.to_vec())
            .map_err(|e| Error::cpu_ops("train.fanouts", e))?;
        let scores = {
            // The pre-sampling pass can take seconds on a large graph: a
            // slice, and progress reports as the importers give them.
            let mut slice = tracer.slice("hotness scores");
            let batches = AtomicU64::new(0);
            let scores = policy
                .scores_with(
                    &ds.graph,
                    &sampler,
                    train_ids,
                    batch_size,
                    seed,
                    &|done, total| {
                        batches.store(total, Ordering::Relaxed);
                        progress.update("presample", done, total);
                    },
                )
                .map_err(sched("hotness scores"))?;
            if let Some(a) = slice.args_mut() {
                a.extra
                    .push(("presample_batches".into(), batches.into_inner() as f64));
            }
            scores
        };
        let mut relabeling = Relabeling::by_score(&scores, cfg.hot_ratio)
            .map_err(sched("orchestration.hot_ratio"))?;
        if policy.zero_is_cold() {
            // `hotness = "pcie"`: a vertex that saves nothing is never hot.
            let saving = scores.iter().filter(|&&s| s > 0).count() as u32;
            if saving < relabeling.hot_count() {
                relabeling = Relabeling::new(relabeling.permutation().clone(), saving)
                    .map_err(sched("orchestration.hot_ratio"))?;
            }
        }
        let hot = relabeling.hot_count();
        let pipeline = PipelineConfig::new(cfg.super_batch, DEPTH, HOT_CHUNK)
            .and_then(|p| p.with_min_chunks(cpu_workers.max(1)))
            .map_err(sched("orchestration.super_batch"))?;
        let bottom_fanout = *fanouts.first().ok_or_else(|| {
            Error::invalid_argument("train.fanouts", "orchestration needs at least one layer")
        })?;
        // The bottom hops sampled ahead skip the planned hot positions when
        // their rows' gradient stops there (`executor/layer/device/` step 1b).
        let bottoms = match cfg.hot_grad {
            gpu_ops::HotGrad::Constant => BottomHops::SkipPlanned,
            gpu_ops::HotGrad::Aggregate => BottomHops::SkipNothing,
        };
        let protocol = Protocol::new(
            ProtocolConfig::new(pipeline, cfg.staleness_bound, cfg.on_late)
                .with_reuse(cfg.reuse)
                .with_bottoms(bottoms),
        );
        Ok(Self {
            split: HotSplit::all_cpu(hot),
            protocol,
            held: Held::default(),
            hot_grad: cfg.hot_grad,
            pipeline,
            workers_wanted: cpu_workers.max(1),
            bottom_fanout,
            model: (*model).clone(),
            ds,
            relabeling,
            totals: OrchestrationStats {
                hot_count: hot,
                ..OrchestrationStats::default()
            },
            last_epoch: None,
            fault: None,
            use_monitor: cfg.monitor,
            monitor_control: cfg.monitor_control,
            monitor: None,
            monitor_outdated: false,
            workers: None,
            pin_from: None,
            clock: wall_clock(),
            retired: Arc::new(AtomicU64::new(0)),
            trace: (Tracer::disabled(), Vec::new()),
            planner_track: None,
            count_splits: Vec::new(),
            split_counts: (Vec::new(), 0),
            window_marks: Marks::default(),
            bf16_rows: None,
            planners_alive: Arc::new(AtomicUsize::new(0)),
            plan_fault: None,
        })
    }

    /// The relabeling (hot = relabeled id below `hot_count`; `old_id` maps back).
    pub fn relabeling(&self) -> &Relabeling {
        &self.relabeling
    }

    /// Totals over every epoch run so far.
    pub fn totals(&self) -> &OrchestrationStats {
        &self.totals
    }

    /// The statistics of the last epoch run.
    pub fn last_epoch(&self) -> Option<&OrchestrationStats> {
        self.last_epoch.as_ref()
    }

    /// Hot vertices (relabeled ids below this).
    pub fn hot_count(&self) -> u32 {
        self.split.hot()
    }

    /// The CPU computes hot ids `0..cpu` from the next epoch run on (the rest of
    /// the hot set is treated as cold); clamped to the hot set.
    pub fn set_cpu_split(&mut self, cpu: u32) -> Result<()> {
        let hot = self.split.hot();
        self.split = HotSplit::new(hot, cpu.min(hot)).map_err(sched("orchestration CPU split"))?;
        // A running monitor plans with its own split: restart it from this one.
        self.monitor_outdated = self.monitor.is_some();
        Ok(())
    }

    /// Ends the monitor, giving the device cache back as it was loaded
    /// ([`HybridMonitor::restore_cache`]); the next epoch with the monitor on
    /// starts a new one from the current split. Called when `policy = "auto"`
    /// leaves the layer pipeline.
    pub(crate) fn release_cache(&mut self, engine: &mut dyn LayerDevice) -> Result<()> {
        self.monitor_outdated = false;
        match self.monitor.take() {
            Some(m) => m.restore_cache(engine),
            None => Ok(()),
        }
    }

    /// The CPU's share of the hot set now.
    pub fn cpu_split(&self) -> u32 {
        self.split.cpu()
    }

    /// Starts counting, for each of `splits`, the rows the CPU would compute and
    /// the positions the accelerator would skip in every launched batch.
    pub fn count_splits(&mut self, splits: Vec<u32>) {
        self.split_counts = (vec![(0, 0); splits.len()], 0);
        self.count_splits = splits;
    }

    /// The counts since [`Orchestrator::count_splits`], per batch; stops counting.
    pub fn take_split_counts(&mut self) -> Vec<scheduler::SplitCounts> {
        let (sums, batches) = std::mem::take(&mut self.split_counts);
        let n = batches.max(1) as f64;
        let out = self
            .count_splits
            .iter()
            .zip(sums)
            .map(|(&split, (rows, entries))| scheduler::SplitCounts {
                split,
                rows_per_batch: rows as f64 / n,
                entries_per_batch: entries as f64 / n,
            })
            .collect();
        self.count_splits.clear();
        out
    }

    /// The clock seconds and statistics at the start and the end of the last
    /// run's measurement window ([`EpochRun::mark`]); `None` when the run did
    /// not reach both.
    pub(crate) fn last_window(&self) -> Option<(&Mark, &Mark)> {
        Some((
            self.window_marks.start.as_ref()?,
            self.window_marks.end.as_ref()?,
        ))
    }

    /// Whether the CPU workers read the bfloat16 copy of the features (the device
    /// stores bfloat16 rows and the model is GraphSAGE).
    #[cfg(test)]
    pub(crate) fn reads_bf16_rows(&self) -> bool {
        self.bf16_rows.is_some()
    }

    /// Turns the hybrid monitor on from the next epoch (starting from the
    /// current split), as `orchestration.monitor = true` does from the start.
    pub fn enable_monitor(&mut self) {
        self.use_monitor = true;
    }

    /// CPU workers.
    pub fn workers(&self) -> usize {
        self.workers_wanted
    }

    /// Injects a fault into the CPU workers from now on (tests).
    #[cfg(test)]
    pub fn inject_fault(&mut self, fault: Option<InjectedFault>) {
        self.fault = fault;
        if let Some(w) = &self.workers {
            *w.shared().fault.lock() = fault;
        }
    }

    /// Fails the plan of global super-batch `g` from now on (tests).
    #[cfg(test)]
    pub fn inject_plan_fault(&mut self, g: Option<u64>) {
        self.plan_fault = g;
    }

    /// Planner threads alive now (none outlives its epoch run).
    #[cfg(test)]
    pub fn planners_alive(&self) -> usize {
        self.planners_alive.load(Ordering::Acquire)
    }

    /// Pins the workers to cores `first..` (after the compute pool's) from their
    /// next start.
    pub(crate) fn pin_workers_from(&mut self, first: Option<usize>) {
        self.pin_from = first;
    }

    /// Records the workers' `hot compute` slices into `tracer` from now on, on one
    /// `hot worker i` track each (declared once per tracer).
    pub fn set_tracer(&mut self, tracer: &Tracer) {
        let tracks: Vec<TrackId> = (0..self.workers_wanted)
            .map(|i| tracer.declare_track(format!("hot worker {i}"), TrackKind::Cpu))
            .collect();
        if let Some(w) = &self.workers {
            w.set_trace(tracer, &tracks);
        }
        self.planner_track = Some(tracer.declare_track("planner", TrackKind::Cpu));
        self.trace = (tracer.clone(), tracks);
    }

    /// Replaces the clock the measurements read (tests inject a manual one).
    pub fn set_clock(&mut self, clock: SharedClock) {
        self.clock = clock;
        self.workers = None;
    }

    /// The workers, started if needed (step 1).
    fn ensure_workers(&mut self, engine: &dyn LayerDevice) -> Result<()> {
        if self.workers.is_none() {
            let sampler = NeighborSampler::new(vec![self.bottom_fanout])
                .map_err(|e| Error::cpu_ops("train.fanouts", e))?;
            let bf16 = engine.feature_dtype() == gpu_ops::FeatureDtype::Bf16;
            if bf16 && self.model.kind == cpu_ops::ModelKind::Sage && self.bf16_rows.is_none() {
                self.bf16_rows = Some(gpu_ops::to_bf16_bits(self.ds.features.as_slice()).into());
            }
            let computer = HotComputer {
                ds: Arc::clone(&self.ds),
                bf16_rows: self.bf16_rows.clone().filter(|_| bf16),
                model: self.model.clone(),
                sampler,
            };
            let shared = Arc::new(WorkerShared {
                published: Published::new(Snapshot {
                    version: engine.version(),
                    tensors: engine.layer0_params()?,
                }),
                retired: Arc::clone(&self.retired),
                fault: Mutex::new(self.fault),
                clock: Arc::clone(&self.clock),
                tracer: Mutex::new(self.trace.clone()),
            });
            let chunk = self.pipeline.hot_chunk();
            self.workers = Some(HotWorkers::start(
                self.workers_wanted,
                computer,
                shared,
                chunk,
                |rows| engine.new_staging(rows),
                self.pin_from,
            )?);
        }
        Ok(())
    }

    /// Runs batches `run.start..run.end` of an epoch through the pipeline
    /// (module doc, steps 2–5); `on_batch` sees every trained batch and returns
    /// whether to stop after it.
    pub(crate) fn run_epoch(
        &mut self,
        engine: &mut dyn LayerDevice,
        run: &EpochRun<'_>,
        on_batch: &mut OnBatch<'_>,
    ) -> Result<EpochEnd> {
        self.ensure_workers(&*engine)?;
        if self.monitor_outdated {
            self.release_cache(engine)?;
        }
        if self.use_monitor && self.monitor.is_none() {
            self.monitor = Some(HybridMonitor::new(
                &*engine,
                run.ds,
                self.pipeline,
                self.split,
                self.workers_wanted,
                self.monitor_control,
            )?);
        }
        let Some(workers) = self.workers.as_ref() else {
            return Err(internal("workers not started"));
        };
        let total = run.end.min(run.batches.len());
        let batches = run.start.min(total)..total;
        let num_sb = batches
            .len()
            .div_ceil(self.pipeline.batches_per_super_batch()) as u64;
        let mut monitor = self.monitor.as_mut();
        let base = monitor.as_deref_mut().map_or(0, |m| m.start_epoch(num_sb));
        let stats = OrchestrationStats {
            hot_count: self.split.hot(),
            ..OrchestrationStats::default()
        };
        let inputs = PlanInputs {
            relabeling: &self.relabeling,
            limit: self.split.hot(),
            count_splits: &self.count_splits,
            fail_at: self.plan_fault,
            trace: self.planner_track.map(|t| (&self.trace.0, t)),
        };
        let (protocol, held, split_counts) =
            (&mut self.protocol, &mut self.held, &mut self.split_counts);
        let (relabeling, clock, retired) = (&self.relabeling, &*self.clock, &self.retired);
        let (split, hot_grad) = (self.split, self.hot_grad);
        let per_super_batch = self.pipeline.batches_per_super_batch();
        let alive = Arc::clone(&self.planners_alive);
        // The planner thread lives inside the scope: it is joined before the
        // run returns, whatever happens (planner.rs step 6).
        let (result, stats, marks) = std::thread::scope(|scope| {
            let planner = match Planner::spawn(scope, inputs, alive) {
                Ok(p) => p,
                Err(e) => return (Err(e), stats, Marks::default()),
            };
            let mut driver = Driver {
                run: *run,
                protocol,
                held,
                workers,
                relabeling,
                monitor,
                base,
                split,
                per_super_batch,
                batches: batches.clone(),
                planner,
                sample_next: None,
                hot_grad,
                retired,
                clock,
                split_counts,
                window: Window::open(&stats, clock),
                stats,
                marks: Marks::default(),
                launch: None,
                gate: None,
                end: None,
                cancelled: None,
                losses: DeferredLosses::default(),
                loss_slice: None,
                last_trained: None,
                resolved: Arc::new(AtomicU64::new(engine.version())),
                resolved_handed: engine.version(),
            };
            let result = driver.drive(engine, batches, on_batch);
            // Step 5, whatever happened.
            let settled = driver.settle();
            let result = result.and_then(|end| settled.map(|()| end));
            // Dropping the driver drops the planner: its thread ends.
            (result, driver.stats, driver.marks)
        });
        self.window_marks = marks;
        engine.discard_prepared();
        self.totals.merge(&stats);
        self.last_epoch = Some(stats);
        if matches!(&result, Err(Error::Worker { worker, .. }) if worker != "planner") {
            // A worker failed: start a fresh set next epoch.
            self.workers = None;
        }
        result
    }
}

fn internal(what: impl std::fmt::Display) -> Error {
    Error::invalid_argument("orchestration", format!("internal: {what}"))
}

fn protocol_error(source: scheduler::SchedulerError) -> Error {
    sched("orchestration protocol")(source)
}

/// What the driver holds for the numbers the protocol names (they outlive an
/// epoch as the protocol does).
#[derive(Default)]
struct Held {
    /// Staging buffers of reports handed in, in report order, until the
    /// protocol's `Install` or `Discard` for them.
    staged: VecDeque<(ReportId, Box<dyn HotStaging>)>,
    /// The id the protocol gives the next report (it numbers them from 0).
    next_report: u64,
    /// The flag of each claim of a live super-batch (and its super-batch).
    claims: HashMap<ClaimId, (u64, Arc<AtomicBool>)>,
    /// Trace flows of regular jobs whose chunk no batch has read yet.
    flows: HashMap<ChunkKey, FlowId>,
}

impl Held {
    /// Holds the staging buffer of the next report.
    fn stage(&mut self, staging: Box<dyn HotStaging>) {
        self.staged.push_back((ReportId(self.next_report), staging));
        self.next_report += 1;
    }

    /// The staging buffer of `report`, which must be the oldest held (answers
    /// come in report order).
    fn take(&mut self, report: ReportId) -> Result<Box<dyn HotStaging>> {
        match self.staged.pop_front() {
            Some((r, s)) if r == report => Ok(s),
            front => {
                let oldest = front.as_ref().map(|(r, _)| r.0);
                if let Some(f) = front {
                    self.staged.push_front(f);
                }
                Err(internal(format!(
                    "no staging buffer for report {} (the oldest held: {oldest:?})",
                    report.0
                )))
            }
        }
    }

    /// Forgets what belongs to super-batches below `below`.
    fn retire(&mut self, below: u64) {
        self.claims.retain(|_, (sb, _)| *sb >= below);
        self.flows.retain(|k, _| k.super_batch >= below);
    }
}

/// A batch between its [`Action::Gate`] and its [`Action::Train`].
struct OpenGate<'a> {
    /// The clock when the gate opened (the batch's time starts).
    start: Duration,
    /// The version it trains at.
    version: u64,
    slice: SliceGuard<'a>,
    /// Once the gate waits: the clock then, and the `hot wait` slice.
    wait: Option<(Duration, SliceGuard<'a>)>,
}

/// Clock seconds and the statistics at one end of a measurement window.
pub(crate) type Mark = (f64, OrchestrationStats);

/// A measurement window's marks: at its start and at its end
/// ([`EpochRun::mark`]).
#[derive(Default)]
struct Marks {
    start: Option<Mark>,
    end: Option<Mark>,
}

/// One epoch's driver (module doc, steps 2–5): the orchestrator's parts it
/// uses, the run, and the slices open.
struct Driver<'a> {
    run: EpochRun<'a>,
    protocol: &'a mut Protocol,
    held: &'a mut Held,
    workers: &'a HotWorkers,
    relabeling: &'a Relabeling,
    monitor: Option<&'a mut HybridMonitor>,
    /// The monitor's global index of the epoch's first super-batch.
    base: u64,
    /// The split launches plan with when the monitor does not run.
    split: HotSplit,
    /// Batches per super-batch.
    per_super_batch: usize,
    /// The run's batches (epoch indices).
    batches: Range<usize>,
    /// Plans launches a super-batch ahead (`planner.rs`).
    planner: Planner,
    /// The super-batch to sample for the planner once the launch's jobs are
    /// queued (at the next gate or launch).
    sample_next: Option<(u64, Range<usize>)>,
    hot_grad: gpu_ops::HotGrad,
    retired: &'a AtomicU64,
    clock: &'a dyn Clock,
    split_counts: &'a mut (Vec<(u64, u64)>, u64),
    /// The epoch's numbers: the driver's, and the protocol's as of the last
    /// sync ([`Driver::synced_stats`]) or its `Finished`.
    stats: OrchestrationStats,
    /// The monitor's window of the super-batch in progress.
    window: Window,
    /// The measurement window's marks taken so far.
    marks: Marks,
    /// The `launch` slice, until its slab is reserved.
    launch: Option<SliceGuard<'a>>,
    gate: Option<OpenGate<'a>>,
    /// How the epoch ends, once the driver stopped it.
    end: Option<EpochEnd>,
    /// The gate of this batch saw the token cancelled: the epoch ends there
    /// unless a callback stopped it first (while the losses were flushed).
    cancelled: Option<usize>,
    /// Batches trained and not shown yet (`engine/losses.rs`).
    losses: DeferredLosses,
    /// The `loss read` slice of consecutive loss actions, with the copies
    /// before it.
    loss_slice: Option<(SliceGuard<'a>, gpu_ops::TransferStats)>,
    /// The last batch trained.
    last_trained: Option<usize>,
    /// The newest publication whose copies a worker resolved this epoch
    /// ([`Resolution`]), and the newest handed to the protocol.
    resolved: Arc<AtomicU64>,
    resolved_handed: u64,
}

/// Layer 0's weights of one publication on their way to the host
/// ([`LayerDevice::publish_layer0`]), which, once a worker resolved them,
/// tells the driver (protocol step 2's `PublicationResolved`).
struct Resolution {
    pending: Box<dyn PendingParams>,
    version: u64,
    resolved: Arc<AtomicU64>,
}

impl PendingParams for Resolution {
    fn resolve(self: Box<Self>) -> Result<Vec<Vec<f32>>> {
        let tensors = self.pending.resolve()?;
        self.resolved.fetch_max(self.version, Ordering::AcqRel);
        Ok(tensors)
    }
}

impl<'a> Driver<'a> {
    /// Steps 2–4, until `Finished` or an error.
    fn drive(
        &mut self,
        engine: &mut dyn LayerDevice,
        batches: Range<usize>,
        on_batch: &mut OnBatch<'_>,
    ) -> Result<EpochEnd> {
        let run = self.run;
        self.protocol
            .handle(Event::EpochStarted {
                batches,
                version: engine.version(),
                loss_lag: engine.loss_lag(),
                window: run.mark.map(|(first, end)| first..end),
            })
            .map_err(protocol_error)?;
        loop {
            self.hand_in_waiting()?;
            let action = self
                .protocol
                .poll()
                .map_err(protocol_error)?
                .ok_or_else(|| internal("the protocol awaits an answer"))?;
            if let Action::Finished { stats, .. } = action {
                self.close_loss_slice(&*engine);
                self.stats.protocol = stats;
                let cancelled = self
                    .cancelled
                    .map(|k| EpochEnd::Stopped(k, StopCause::Token));
                return Ok(self.end.or(cancelled).unwrap_or(EpochEnd::Finished(false)));
            }
            self.act(engine, action, on_batch)?;
        }
    }

    /// Step 5: stops a protocol still running and carries out what is left (only
    /// answers to reports, the watermark and the end come out after a stop).
    fn settle(&mut self) -> Result<()> {
        self.launch = None;
        self.gate = None;
        self.loss_slice = None;
        let mut result = Ok(());
        if self.protocol.running() {
            result = self.protocol.handle(Event::Abort).map_err(protocol_error);
        }
        loop {
            let action = match self.protocol.poll() {
                Ok(Some(a)) => a,
                Ok(None) => break,
                Err(e) => {
                    result = result.and(Err(protocol_error(e)));
                    break;
                }
            };
            match action {
                Action::Discard { report, .. } => match self.held.take(report) {
                    Ok(s) => self.workers.recycle(s),
                    Err(e) => result = result.and(Err(e)),
                },
                Action::Retire { below } => self.retire(below),
                Action::Finished { stats, .. } => self.stats.protocol = stats,
                _ => {}
            }
        }
        // Nothing is held for a report the protocol has no answer for any more.
        for (_, s) in self.held.staged.drain(..) {
            self.workers.recycle(s);
        }
        result
    }

    /// Step 3.
    fn hand_in_waiting(&mut self) -> Result<()> {
        while let Some(d) = self.workers.try_done() {
            self.hand_in(d)?;
        }
        Ok(())
    }

    /// Step 3 for one report.
    fn hand_in(&mut self, d: Done) -> Result<()> {
        self.stats.cpu_busy_secs += d.busy_secs;
        match d.outcome {
            Outcome::Failed(e) => Err(e),
            Outcome::Dropped => self
                .protocol
                .handle(Event::JobDropped { key: d.key })
                .map_err(protocol_error),
            Outcome::Rows {
                version,
                rows,
                staging,
            } => {
                let rows = u32::try_from(rows).map_err(|_| internal("a chunk of 2³² rows"))?;
                // The publication the rows were computed with resolved before
                // the worker computed them: the protocol hears it first.
                let resolved = self.resolved.load(Ordering::Acquire);
                if resolved > self.resolved_handed {
                    self.resolved_handed = resolved;
                    self.protocol
                        .handle(Event::PublicationResolved { version: resolved })
                        .map_err(protocol_error)?;
                }
                self.held.stage(staging);
                let handed = self.protocol.handle(Event::ChunkComputed {
                    key: d.key,
                    version,
                    rows,
                });
                if let Err(e) = handed {
                    // A refused report gets no answer: its buffer goes back now.
                    if let Some((_, s)) = self.held.staged.pop_back() {
                        self.workers.recycle(s);
                    }
                    return Err(protocol_error(e));
                }
                Ok(())
            }
        }
    }

    /// Step 4 for one action (all but `Finished`).
    fn act(
        &mut self,
        engine: &mut dyn LayerDevice,
        action: Action,
        on_batch: &mut OnBatch<'_>,
    ) -> Result<()> {
        if matches!(action, Action::Gate { .. } | Action::Launch { .. }) {
            self.sample_ahead(engine)?;
        }
        let loss_action = matches!(
            action,
            Action::QueueLossRead { .. }
                | Action::ResolveLossRead { .. }
                | Action::ShowLosses { .. }
        );
        if !loss_action {
            self.close_loss_slice(&*engine);
        }
        match action {
            Action::Publish { version, reset } => self.publish(&*engine, version, reset),
            Action::SampleBottoms { batches, skip, .. } => {
                // Each bottom hop queued on the sampling stream behind its top
                // layers, skipping what the protocol says (`executor/layer/device/`
                // step 1b; nothing without `device.sample_ahead`).
                let run = self.run;
                let bottoms: Vec<BottomBatch<'_>> = batches
                    .zip(&skip)
                    .map(|(k, skip)| BottomBatch {
                        key: k as u64,
                        seed: run.seed(k),
                        skip,
                    })
                    .collect();
                engine.prepare_bottoms(&bottoms)
            }
            Action::Launch {
                super_batch,
                local,
                batches,
            } => self.launch(engine, super_batch, local, batches),
            Action::ReserveSlab { slab, rows, .. } => {
                engine.hot_slab_reserve(slab, rows)?;
                if let Some(mut s) = self.launch.take() {
                    s.set_bytes((rows * 4) as u64);
                }
                Ok(())
            }
            Action::QueueJob(job) => self.queue(job),
            Action::Install {
                report,
                key,
                slab,
                rows,
                version,
            } => {
                let mut staging = self.held.take(report)?;
                let n = rows.len();
                let installed = engine.hot_install(slab, rows.start as usize, n, &mut *staging);
                self.workers.recycle(staging);
                installed?;
                let bytes = (n * engine.hot_width() * 4) as u64;
                let run = self.run;
                run.tracer.instant_on(run.acc_track, "hot install", |a| {
                    a.super_batch = Some(key.super_batch);
                    a.bytes = Some(bytes);
                    a.direction = Some(Direction::HostToDevice);
                    a.extra.push(("rows".into(), n as f64));
                    a.extra.push(("version".into(), version as f64));
                });
                Ok(())
            }
            Action::Discard { report, .. } => {
                let staging = self.held.take(report)?;
                self.workers.recycle(staging);
                Ok(())
            }
            Action::Keep {
                slab,
                rows,
                vertices,
                ..
            } => engine.hot_keep(slab, &rows, &vertices),
            Action::Carry {
                super_batch,
                slab,
                rows,
                vertices,
            } => {
                engine.hot_carry(slab, &rows, &vertices)?;
                let run = self.run;
                run.tracer.instant_on(run.acc_track, "hot carry", |a| {
                    a.super_batch = Some(super_batch);
                    a.extra.push(("rows".into(), rows.len() as f64));
                });
                Ok(())
            }
            Action::BeginSuperBatch { local, .. } => match self.monitor.as_deref_mut() {
                Some(m) => m.begin_super_batch(self.base + local, engine, self.relabeling),
                None => Ok(()),
            },
            Action::EndSuperBatch {
                super_batch,
                local,
                observe,
                hot,
            } => {
                let run = self.run;
                run.tracer.instant_on(run.acc_track, "hot rows", |a| {
                    a.super_batch = Some(super_batch);
                    a.extra.push(("queued".into(), hot.queue_rows as f64));
                    a.extra.push(("computed".into(), hot.computed_rows as f64));
                    a.extra.push(("carried".into(), hot.carried_rows as f64));
                    a.extra.push(("uses".into(), hot.uses as f64));
                    if let Some(u) = hot.uses_per_computed_row() {
                        a.extra.push(("uses_per_computed_row".into(), u));
                    }
                });
                self.end_super_batch(engine, local, observe)
            }
            Action::Gate { batch, version } => self.gate(batch, version),
            Action::Wait { late_vertices, .. } => {
                if let Some(g) = self.gate.as_mut() {
                    if g.wait.is_none() {
                        let run = self.run;
                        let mut s = run
                            .tracer
                            .slice_on(run.acc_track, "hot wait")
                            .batch(g.version);
                        s.set_bytes(late_vertices);
                        g.wait = Some((self.clock.now(), s));
                    }
                }
                let d = self.workers.wait_done()?;
                self.hand_in(d)
            }
            Action::Train(t) => self.train(engine, &t),
            Action::QueueLossRead { batches } => {
                self.open_loss_slice(&*engine);
                self.losses.queue(engine, batches)
            }
            Action::ResolveLossRead { batches } => {
                self.open_loss_slice(&*engine);
                let nonfinite = self.losses.resolve(batches)?;
                self.protocol
                    .handle(Event::LossesRead { nonfinite })
                    .map_err(protocol_error)
            }
            Action::ShowLosses { batches, rewind } => self.show(engine, batches, rewind, on_batch),
            Action::Mark { start, .. } => {
                // A measurement window (`policy = "auto"`): the protocol takes
                // its marks before the super-batch's launch-ahead, so the
                // window holds one launch per timed super-batch (a mark at the
                // first batch's gate left the first launch out: 2026-11-26,
                // 1.46 ms/batch measured for 2.84 real), and after the losses
                // trained before it were read, so its clock covers the
                // device's work.
                let mark = (self.clock.now().as_secs_f64(), self.synced_stats().clone());
                if start {
                    self.marks.start = Some(mark);
                } else {
                    self.marks.end = Some(mark);
                }
                Ok(())
            }
            Action::Retire { below } => {
                self.retire(below);
                Ok(())
            }
            Action::Finished { .. } => Err(internal("Finished carried out as an action")),
        }
    }

    /// Answers [`Event::Stop`]; the epoch ends as `end`.
    fn stop(&mut self, end: EpochEnd) -> Result<()> {
        self.end = Some(end);
        self.protocol.handle(Event::Stop).map_err(protocol_error)
    }

    /// The epoch's numbers with the protocol's counts so far.
    fn synced_stats(&mut self) -> &mut OrchestrationStats {
        if let Some(s) = self.protocol.epoch_stats() {
            self.stats.protocol.clone_from(s);
        }
        &mut self.stats
    }

    /// `Publish`.
    fn publish(&mut self, engine: &dyn LayerDevice, version: u64, reset: bool) -> Result<()> {
        if version != engine.version() {
            return Err(internal(format!(
                "the protocol publishes version {version}, the weights are at {}",
                engine.version()
            )));
        }
        let published = &self.workers.shared().published;
        if reset {
            published.reset(Snapshot {
                version,
                tensors: engine.layer0_params()?,
            });
        } else {
            // Queued, not waited for: the first worker reading it resolves it
            // and tells the protocol (through `hand_in`).
            let run = self.run;
            let mut slice = run.tracer.slice_on(run.acc_track, "publish");
            let before = engine.transfer_stats();
            let pending = engine.publish_layer0()?;
            record_copies(slice.args_mut(), &engine.transfer_stats().since(&before));
            let resolved = Arc::clone(&self.resolved);
            published.publish_pending(
                version,
                Box::new(Resolution {
                    pending,
                    version,
                    resolved,
                }),
            );
        }
        Ok(())
    }

    /// `Launch` of local super-batch `local` (global `super_batch`): this
    /// one's plan, made a super-batch ago, answers the protocol (`planner.rs`
    /// step 4); the super-batch after it is sampled on the device for the
    /// planner once this one's jobs are queued (step 2, [`Driver::sample_ahead`]).
    /// The run's first launch samples and submits itself and the next first.
    fn launch(
        &mut self,
        engine: &mut dyn LayerDevice,
        super_batch: u64,
        local: u64,
        batches: Range<usize>,
    ) -> Result<()> {
        let run = self.run;
        self.launch = Some(
            run.tracer
                .slice_on(run.acc_track, "launch")
                .epoch(run.epoch as u64)
                .super_batch(local),
        );
        let next = (super_batch + 1, self.batches_of(local + 1));
        if !self.planner.pending(super_batch) {
            // The run's first launch: this one and the next go to the planner
            // now, so the next is planned while this one's jobs go out.
            self.submit(engine, super_batch, batches.clone())?;
            if !next.1.is_empty() {
                self.submit(engine, next.0, next.1)?;
            }
        } else if !next.1.is_empty() {
            // Sampled once this launch's jobs are queued (the CPU starts first).
            self.sample_next = Some(next);
        }
        let (ready, tops) = if self.planner.ready() {
            self.planner.take(super_batch)?
        } else {
            let _s = run
                .tracer
                .slice_on(run.acc_track, "plan wait")
                .super_batch(local);
            self.planner.take(super_batch)?
        };
        if let Some(tops) = tops {
            engine.adopt_tops(tops)?;
        }
        if !ready.counts.is_empty() {
            let (sums, launched) = &mut *self.split_counts;
            sums.resize(ready.counts.len(), (0, 0));
            for (s, c) in sums.iter_mut().zip(&ready.counts) {
                s.0 += c.0;
                s.1 += c.1;
            }
            *launched += ready.plan.batches() as u64;
        }
        let split = self
            .monitor
            .as_deref()
            .map_or(self.split, |m| m.split_for(self.base + local));
        self.protocol
            .handle(Event::Planned {
                super_batch,
                split,
                plan: ready.plan,
            })
            .map_err(protocol_error)
    }

    /// Samples the super-batch the last launch left for the planner (a
    /// `sample ahead` slice with the engine's `sample top` inside).
    fn sample_ahead(&mut self, engine: &mut dyn LayerDevice) -> Result<()> {
        let Some((g, batches)) = self.sample_next.take() else {
            return Ok(());
        };
        let run = self.run;
        let _s = run
            .tracer
            .slice_on(run.acc_track, "sample ahead")
            .epoch(run.epoch as u64);
        self.submit(engine, g, batches)
    }

    /// The run's batches of local super-batch `local` (empty past the end).
    fn batches_of(&self, local: u64) -> Range<usize> {
        let n = self.per_super_batch;
        let first = (self.batches.start + local as usize * n).min(self.batches.end);
        first..(first + n).min(self.batches.end)
    }

    /// Samples `batches`' top layers on the device (one read of their sizes
    /// and bottom destinations for all of them, still in flight with
    /// `device.sample_ahead`) and hands the read to the planner as global
    /// super-batch `super_batch`.
    fn submit(
        &mut self,
        engine: &mut dyn LayerDevice,
        super_batch: u64,
        batches: Range<usize>,
    ) -> Result<()> {
        let run = self.run;
        let task_batches: Vec<(usize, TaskBatch<'_>)> =
            batches.map(|k| (k, run.task_batch(k))).collect();
        let tops: Vec<TopBatch<'_>> = task_batches
            .iter()
            .map(|(k, tb)| TopBatch {
                key: *k as u64,
                seeds: &tb.seeds,
                seed: run.seed(*k),
                exclude: &tb.exclude,
            })
            .collect();
        let ahead = engine.prepare_tops(&tops)?;
        self.planner.submit(PlanRequest {
            super_batch,
            batches: tops.iter().map(|b| (b.seeds.len(), Vec::new())).collect(),
            ahead: Some(ahead),
        })
    }

    /// `QueueJob`.
    fn queue(&mut self, order: scheduler::Job) -> Result<()> {
        let run = self.run;
        let (seed, flow) = match order.urgent {
            None => {
                let flow = run.tracer.flow("hot compute→train");
                self.held.flows.insert(order.key, flow);
                let local = derive_seed(run.base_seed, 5_000_000 + order.local);
                (derive_seed(local, u64::from(order.key.chunk)), flow)
            }
            Some(u) => (
                derive_seed(derive_seed(run.base_seed, 6_000_000), u.seq),
                FlowId::NONE,
            ),
        };
        let (_, flag) = self
            .held
            .claims
            .entry(order.claim)
            .or_insert_with(|| (order.key.super_batch, Arc::new(AtomicBool::new(false))));
        let claim = Arc::clone(flag);
        let ids = order
            .vertices
            .iter()
            .map(|&r| self.relabeling.old_id(r))
            .collect();
        self.workers.push(Job {
            order,
            ids,
            seed,
            claim,
            flow,
        })
    }

    /// Opens the `loss read` slice of the loss actions that follow, unless
    /// one is open.
    fn open_loss_slice(&mut self, engine: &dyn LayerDevice) {
        if self.loss_slice.is_none() {
            let run = self.run;
            let slice = run.tracer.slice_on(run.acc_track, "loss read");
            self.loss_slice = Some((slice, engine.transfer_stats()));
        }
    }

    /// Closes the open `loss read` slice with its copies and synchronizations.
    fn close_loss_slice(&mut self, engine: &dyn LayerDevice) {
        if let Some((mut slice, before)) = self.loss_slice.take() {
            record_copies(slice.args_mut(), &engine.transfer_stats().since(&before));
        }
    }

    /// `ShowLosses` (`engine/losses.rs` step 4): `on_batch` sees the batches; a
    /// callback's stop ends the run after every batch trained (the protocol
    /// shows them all first); a non-finite loss under a lag ends it with the
    /// session's error for that batch.
    fn show(
        &mut self,
        engine: &mut dyn LayerDevice,
        batches: Range<usize>,
        rewind: u64,
        on_batch: &mut OnBatch<'_>,
    ) -> Result<()> {
        let done = self.losses.show(engine, batches, rewind)?;
        let mut stop = false;
        for d in &done {
            stop |= on_batch(d)?;
        }
        if rewind > 0 {
            let k = done.last().map_or(0, |d| d.k);
            return Err(Error::invalid_argument(
                "device.loss_lag",
                format!(
                    "internal: batch {k} had a non-finite loss and the steps queued after it \
                     were not applied, but training went on (a loss lag needs \
                     train.on_nonfinite = \"stop\")"
                ),
            ));
        }
        if stop && self.end.is_none() {
            let next = self.last_trained.map_or(self.batches.start, |k| k + 1);
            return self.stop(if next < self.run.batches.len() {
                EpochEnd::Stopped(next, StopCause::Callback)
            } else {
                EpochEnd::Finished(true)
            });
        }
        Ok(())
    }

    /// `Gate` of epoch batch `batch` at `version`.
    fn gate(&mut self, batch: usize, version: u64) -> Result<()> {
        let run = self.run;
        if run.cancel.is_cancelled() {
            // The protocol shows the batches trained so far before it ends.
            self.cancelled = Some(batch);
            return self.protocol.handle(Event::Stop).map_err(protocol_error);
        }
        let start = self.clock.now();
        self.gate = Some(OpenGate {
            start,
            version,
            slice: run.tracer.slice_on(run.acc_track, "gate").batch(version),
            wait: None,
        });
        Ok(())
    }

    /// `Train`: closes the batch's gate, trains, answers; the batch is kept
    /// until the protocol shows it (`engine/losses.rs`).
    fn train(&mut self, engine: &mut dyn LayerDevice, t: &TrainBatch) -> Result<()> {
        let run = self.run;
        let k = t.batch;
        if !t.cold.is_empty() {
            run.tracer.instant_on(run.acc_track, "compute cold", |a| {
                a.batch = Some(t.version);
                a.extra.push(("vertices".into(), t.cold.len() as f64));
            });
        }
        let start = match self.gate.take() {
            Some(OpenGate {
                start, slice, wait, ..
            }) => {
                if let Some((waited_from, s)) = wait {
                    drop(s);
                    let waited = self.clock.now().saturating_sub(waited_from);
                    self.stats.wait_secs += waited.as_secs_f64();
                }
                drop(slice);
                start
            }
            None => self.clock.now(),
        };
        let mut slice = run
            .tracer
            .slice_on(run.acc_track, "train")
            .epoch(run.epoch as u64)
            .batch(k as u64)
            .super_batch(t.local);
        if let Some(g) = t.max_gap {
            slice.set_staleness_gap(g);
        }
        for &chunk in &t.first_reads {
            let key = ChunkKey {
                super_batch: t.super_batch,
                chunk,
            };
            if let Some(flow) = self.held.flows.remove(&key) {
                slice.flow_in(flow);
            }
        }
        let h2d_before = engine.h2d_bytes();
        let copies_before = engine.transfer_stats();
        let bottoms_before = engine.bottom_counts();
        let tb = run.task_batch(k);
        let loss = engine.train_prepared(
            k as u64,
            BatchRef::of(&tb, run.seed(k), run.epoch, k),
            &HotUse {
                slab: t.slab,
                positions: &t.positions,
                rows: &t.rows,
                grad: self.hot_grad,
            },
            t.loss_slot,
        )?;
        slice.set_transfer(
            Direction::HostToDevice,
            engine.h2d_bytes().saturating_sub(h2d_before),
        );
        // What crossed between host and device in the batch's step (the gate's
        // installs and the launch's downloads are not in it).
        let copies = engine.transfer_stats().since(&copies_before);
        record_copies(slice.args_mut(), &copies);
        let bottoms = engine.bottom_counts();
        let (ahead, resampled) = (
            bottoms.ahead - bottoms_before.ahead,
            bottoms.resampled - bottoms_before.resampled,
        );
        // The engine uses the hop the protocol's `SampleBottoms` sampled iff
        // the protocol said so (neither count moves without
        // `device.sample_ahead`: no hop was sampled).
        if (ahead > 0 && !t.bottom_ahead) || (resampled > 0 && t.bottom_ahead) {
            return Err(internal(format!(
                "batch {k}: the engine trained on {} bottom hop, the protocol said {}",
                if ahead > 0 {
                    "the sampled-ahead"
                } else {
                    "a resampled"
                },
                if t.bottom_ahead { "ahead" } else { "resample" }
            )));
        }
        self.stats.bottoms_ahead += ahead;
        self.stats.bottoms_resampled += resampled;
        if let Some(a) = slice.args_mut() {
            a.extra.push(("hot_rows".into(), t.positions.len() as f64));
            if resampled > 0 {
                a.extra.push(("bottom_resampled".into(), resampled as f64));
            }
        }
        drop(slice);
        let version = engine.version();
        self.last_trained = Some(k);
        self.protocol
            .handle(Event::BatchTrained { batch: k, version })
            .map_err(protocol_error)?;
        self.losses.push(Trained {
            k,
            seconds: self.clock.now().saturating_sub(start).as_secs_f64(),
            version,
            loss,
        });
        Ok(())
    }

    /// `Retire`: the workers drop regular jobs below `below` from now on.
    fn retire(&mut self, below: u64) {
        self.retired.store(below, Ordering::Release);
        self.held.retire(below);
    }

    /// `EndSuperBatch`: the monitor observes (when `observe`) and may move
    /// vertices; its next window opens.
    fn end_super_batch(
        &mut self,
        engine: &mut dyn LayerDevice,
        local: u64,
        observe: bool,
    ) -> Result<()> {
        if self.monitor.is_none() {
            return Ok(());
        }
        self.synced_stats();
        let run = self.run;
        let end = SuperBatchEnd {
            global: self.base + local,
            local,
            observe,
            window: &self.window,
            clock: self.clock,
            trace: (run.tracer, run.acc_track),
        };
        if let Some(m) = self.monitor.as_deref_mut() {
            m.end_super_batch(&end, &mut self.stats, engine, self.relabeling)?;
        }
        self.window = Window::open(&self.stats, self.clock);
        Ok(())
    }
}
