//! Session tests that need seams the public API does not offer: a fault in the
//! layer pipeline's CPU workers (the shutdown protocol, the monitor under a slow
//! CPU) and the device-resident data-parallel step summed through host copies.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::config::TrainConfig;
use crate::dist::{Communicator, ThreadGroup};
use crate::executor::layer::InjectedFault;
use crate::{load_dataset, EpochStats, Error, OrchestrationStats, Trainer};

fn config(base: &[&str], extra: &[&str]) -> TrainConfig {
    let sets: Vec<String> = base.iter().chain(extra).map(|s| s.to_string()).collect();
    TrainConfig::from_toml_with_overrides("", Path::new("test"), &sets).expect("config")
}

fn trainer(c: TrainConfig) -> Trainer {
    let ds = load_dataset(&c).expect("dataset");
    Trainer::new(ds, c).expect("trainer")
}

/// The layer pipeline on a small graph (`runtime/tests/orchestration.rs`).
const LAYER: &[&str] = &[
    "model.kind=\"sage\"",
    "model.hidden=32",
    "train.epochs=4",
    "train.batch_size=128",
    "train.lr=0.01",
    "data.synthetic.vertices=4000",
    "data.synthetic.edges=30000",
    "data.synthetic.classes=4",
    "data.synthetic.dim=16",
    "data.synthetic.homophily=0.9",
    "data.synthetic.signal=0.4",
    "device.kind=\"host\"",
    "orchestration.policy=\"layer\"",
    "device.cache_bytes=32000",
    "threads.compute=1",
];

/// The run ends with the worker's error as soon as the protocol needs the
/// failed job's rows, also when the accelerator is blocked waiting for the dead
/// worker (bound 0, wait). Promptness is counted in batches, not seconds: the
/// worker fails on its job `n + 1` (after `n` jobs); every super-batch queues at
/// least one job, so that job serves super-batch `n` at the latest, whose first
/// batch cannot train without its rows (`on_late = "wait"`). At most the
/// batches of super-batches `0..=n` train before the error — fewer than one
/// epoch's here, and far fewer than the run's.
#[test]
fn a_failing_worker_ends_the_run_with_its_error_promptly() {
    const N: usize = 4; // orchestration.super_batch (the default)
    const AFTER: u64 = 2;
    for (fault, needle) in [
        (InjectedFault::ErrorAfter(AFTER), "injected failure"),
        (InjectedFault::PanicAfter(AFTER), "injected panic"),
    ] {
        for bound in [
            "orchestration.staleness_bound=0",
            "orchestration.staleness_bound=7",
        ] {
            let sets = [
                "orchestration.hot_ratio=0.2",
                "orchestration.super_batch=4",
                bound,
            ];
            let mut t = trainer(config(LAYER, &sets));
            let epoch_batches = t.dataset().train_ids().len().div_ceil(128);
            let trained = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let count = Arc::clone(&trained);
            let id = t.add_callback(Box::new(crate::on_batch(move |_| {
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                crate::Control::Continue
            })));
            t.inject_orchestration_fault(Some(fault));
            let e = t.fit().expect_err("the worker fails");
            assert!(
                matches!(&e, Error::Worker { what, .. } if what.contains(needle)),
                "{fault:?} {bound}: {e}"
            );
            let trained = trained.load(std::sync::atomic::Ordering::Relaxed);
            let most = (AFTER as usize + 1) * N;
            eprintln!("{fault:?} {bound}: {trained} batches before the error (at most {most})");
            assert!(
                trained <= most && most < epoch_batches,
                "{fault:?} {bound}: {trained} batches trained before the error, more than \
                 {most} (an epoch has {epoch_batches})"
            );
            t.remove_callback(id);
            // The trainer is still usable afterwards: clear the fault, train on.
            t.inject_orchestration_fault(None);
            t.fit().expect("trains after the failure");
        }
    }
}

/// The hybrid monitor in the executor (host backend): with a slow CPU it moves
/// hot vertices to the device cache; the cache stays within
/// `device.cache_bytes`; the staleness bound holds throughout.
mod monitor {
    use super::*;

    const CACHE_BYTES: usize = 64_000;

    /// The tests measure time: run them one at a time, not competing for the cores.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn cfg(extra: &[&str]) -> TrainConfig {
        let cache = format!("device.cache_bytes={CACHE_BYTES}");
        let base = [
            "model.kind=\"sage\"",
            "model.hidden=32",
            "train.epochs=3",
            "train.batch_size=64",
            "train.lr=0.01",
            "data.synthetic.vertices=4000",
            "data.synthetic.edges=30000",
            "data.synthetic.classes=4",
            "data.synthetic.dim=16",
            "device.kind=\"host\"",
            "orchestration.policy=\"layer\"",
            &cache,
            "threads.compute=1",
            "orchestration.hot_ratio=0.2",
            "orchestration.super_batch=2",
            "orchestration.staleness_bound=3",
            "orchestration.on_late=\"wait\"",
        ];
        config(&base, extra)
    }

    /// Trains with `extra` settings and an optional slow CPU; returns the totals,
    /// the trace's `monitor move` instants and the engine's cache statistics.
    fn train(
        extra: &[&str],
        slow: Option<Duration>,
    ) -> (OrchestrationStats, Vec<(u64, f64)>, gpu_ops::CacheStats) {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let mut t = trainer(cfg(extra));
        let tracer = crate::trace::Tracer::new();
        t.set_tracer(tracer.clone());
        t.inject_orchestration_fault(slow.map(InjectedFault::SlowCpu));
        t.fit().expect("fit");
        let o = t.orchestration_totals().expect("orchestration ran").clone();
        let trace = tracer.collect();
        trace.validate().expect("valid trace");
        let moves = trace
            .instants
            .iter()
            .filter(|i| i.name == "monitor move")
            .map(|i| {
                let sb = i.args.super_batch.unwrap_or(u64::MAX);
                let signed = i
                    .args
                    .extra
                    .iter()
                    .find_map(|(k, v)| match &**k {
                        "to_cache" => Some(*v),
                        "to_cpu" => Some(-*v),
                        _ => None,
                    })
                    .unwrap_or(0.0);
                (sb, signed)
            })
            .collect();
        (o, moves, t.cache_stats())
    }

    #[test]
    fn a_slow_cpu_moves_hot_vertices_to_the_cache_within_the_budget() {
        let slow = Some(Duration::from_micros(200));
        let (off, off_moves, _) = train(&["orchestration.monitor=false"], slow);
        let (on, on_moves, cache) = train(
            &[
                "orchestration.monitor=true",
                "orchestration.monitor_control=\"balance\"",
            ],
            slow,
        );
        eprintln!("monitor off: {}", off.summary());
        eprintln!("monitor on:  {}", on.summary());
        eprintln!("moves: {on_moves:?}");
        assert!(off_moves.is_empty() && !off.monitor);
        // Moves to the cache come early: within the first epoch's super-batches.
        assert!(on.monitor_moves_to_cache > 0, "{}", on.summary());
        let first = on_moves
            .iter()
            .find(|m| m.1 > 0.0)
            .expect("a move to the cache");
        assert!(first.0 <= 3, "first move after super-batch {}", first.0);
        assert_eq!(
            on_moves.len() as u64,
            on.monitor_moves_to_cache + on.monitor_moves_to_cpu
        );
        assert!(on.monitor_cached_rows > 0, "{}", on.summary());
        // How much waiting the moves save is a timing property, printed here and
        // measured by `tandem bench orchestration`; the decisions themselves are
        // tested deterministically (scripted windows on a manual clock) in
        // `executor/layer/monitor.rs`.
        eprintln!(
            "wait with the monitor {:.3} s vs without {:.3} s",
            on.wait_secs, off.wait_secs
        );
        // The cache never exceeds its budget, and the monitor's rows fit in it.
        assert!(cache.cached_bytes <= CACHE_BYTES, "{cache:?}");
        assert!(
            on.monitor_cached_rows as usize <= cache.cached_rows,
            "{cache:?}"
        );
        // The staleness bound still holds.
        assert!(on.protocol.gaps.max().unwrap_or(0) <= 3, "{}", on.summary());
    }

    #[test]
    fn a_small_cache_caps_the_moves_at_its_budget() {
        // 100 rows of 64 bytes: far fewer than the hot vertices a slow CPU would shed.
        let (on, _, cache) = train(
            &[
                "orchestration.monitor=true",
                "orchestration.monitor_control=\"balance\"",
                "device.cache_bytes=6400",
            ],
            Some(Duration::from_micros(200)),
        );
        assert!(on.monitor_moves_to_cache > 0, "{}", on.summary());
        assert!(on.monitor_cached_rows <= 100, "{}", on.summary());
        assert!(cache.cached_bytes <= 6400, "{cache:?}");
        assert!(on.protocol.gaps.max().unwrap_or(0) <= 3, "{}", on.summary());
    }

    #[test]
    fn with_an_on_time_cpu_the_bound_and_the_budget_hold() {
        for on_late in ["wait", "compute"] {
            let l = format!("orchestration.on_late=\"{on_late}\"");
            let (on, moves, cache) = train(
                &[
                    "orchestration.monitor=true",
                    "train.epochs=4",
                    // Two super-batches of slack: an on-time CPU never makes a batch wait.
                    "orchestration.super_batch=4",
                    "orchestration.staleness_bound=7",
                    &l,
                ],
                None,
            );
            // The default control (`"time"`) on the wall clock: which shares
            // it probes is timing; the search itself, oscillation included, is
            // tested on scripted windows in `executor/layer/monitor.rs`.
            eprintln!("{on_late}: {} {moves:?}", on.summary());
            assert_eq!(
                moves.len() as u64,
                on.monitor_moves_to_cache + on.monitor_moves_to_cpu,
                "{on_late}: every move is traced once"
            );
            assert!(cache.cached_bytes <= CACHE_BYTES, "{cache:?}");
            assert!(on.protocol.gaps.max().unwrap_or(0) <= 7, "{}", on.summary());
            assert!(on.protocol.hot_uses > 0, "{}", on.summary());
        }
    }
}

/// The data-parallel job of `runtime/tests/dist.rs`.
const DIST: &[&str] = &[
    "model.kind=\"sage\"",
    "model.hidden=16",
    "model.dropout=0.0",
    "train.epochs=2",
    "train.batch_size=128",
    "train.fanouts=[5,5]",
    "train.eval_mode=\"sampled\"",
    "train.eval_fanouts=[5,5]",
    "data.synthetic.vertices=1500",
    "data.synthetic.edges=9000",
    "data.synthetic.classes=4",
    "data.synthetic.dim=12",
    "device.kind=\"host\"",
    "threads.compute=1",
];

/// Trains `c` on `ranks` threads, every rank joining through
/// `Trainer::set_communicator` or, with `on_device`, the device-resident step's
/// seam; returns each rank's parameters, epochs and all-reduce count.
fn train_ranks(
    c: &TrainConfig,
    ranks: usize,
    on_device: bool,
) -> Vec<(Vec<Vec<f32>>, Vec<EpochStats>, u64)> {
    let ds = load_dataset(c).expect("dataset");
    let comms = ThreadGroup::new(ranks).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let (c, ds) = (c.clone(), ds.clone());
                s.spawn(move || {
                    let mut t = Trainer::new(ds, c).expect("trainer");
                    let comm: Arc<dyn Communicator> = Arc::new(comm);
                    if on_device {
                        t.set_communicator_reducing_on_device(comm).unwrap();
                    } else {
                        t.set_communicator(comm).unwrap();
                    }
                    let stats = t.fit().expect("fit");
                    (t.params().unwrap(), stats, t.dist_stats().allreduces)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The device-resident step (`dist.reduce = "nccl"`: scalars over the
/// communicator, gradients weighted, summed, checked and applied on the device)
/// trains what the host bucket trains, bit for bit, with the sum taken through
/// host copies (NCCL needs GPUs): every placement, empty shares, partitioned
/// features.
#[test]
fn the_device_resident_step_trains_what_the_host_bucket_trains() {
    for (sets, n) in [
        (
            vec!["orchestration.policy=\"gpu-sample-gpu-gather\""],
            2usize,
        ),
        (vec!["orchestration.policy=\"cpu-sample-gpu-gather\""], 3),
        (
            vec![
                "orchestration.policy=\"gpu-sample-cpu-gather\"",
                "dist.features=\"partitioned\"",
            ],
            2,
        ),
        (vec!["train.batch_size=7", "train.epochs=1"], 5),
        (vec!["model.kind=\"gat\"", "model.dropout=0.3"], 2),
    ] {
        let c = config(DIST, &sets);
        let bucket = train_ranks(&c, n, false);
        let device = train_ranks(&c, n, true);
        for (r, run) in device.iter().enumerate() {
            assert_eq!(run.0, bucket[0].0, "{sets:?}: rank {r} of {n}");
            for (a, b) in run.1.iter().zip(&bucket[0].1) {
                assert_eq!(a.loss.to_bits(), b.loss.to_bits(), "{sets:?}");
                assert_eq!(a.train_acc.to_bits(), b.train_acc.to_bits(), "{sets:?}");
                assert_eq!((a.steps, a.test_acc), (b.steps, b.test_acc), "{sets:?}");
            }
        }
        assert_eq!(device[0].2, bucket[0].2);
    }
}

/// `orchestration.policy = "auto"` end to end, measuring on the host backend as
/// on a GPU: every candidate is measured on the first batches, the choice is
/// applied and recorded, and training goes on with it. Which candidate wins
/// depends on this machine's timing, so the tests check the protocol, not the
/// winner (the decision itself is tested on scripted costs in
/// `scheduler/src/auto.rs` and `placement/calibrator.rs`).
mod auto {
    use super::*;
    use crate::test_at_best_val;
    use crate::trace::Tracer;

    const AUTO: &[&str] = &[
        "model.kind=\"sage\"",
        "model.hidden=16",
        "train.epochs=3",
        "train.batch_size=64",
        "train.lr=0.01",
        "train.fanouts=[5,5]",
        "data.synthetic.vertices=4000",
        "data.synthetic.edges=30000",
        "data.synthetic.classes=4",
        "data.synthetic.dim=16",
        "data.synthetic.homophily=0.9",
        "data.synthetic.signal=0.4",
        "device.kind=\"host\"",
        "threads.compute=1",
    ];

    fn cfg(extra: &[&str]) -> TrainConfig {
        config(AUTO, extra)
    }

    fn auto_trainer(c: TrainConfig) -> Trainer {
        let ds = load_dataset(&c).expect("dataset");
        Trainer::measuring_on_host(ds, c).expect("trainer")
    }

    const STEP_BASED: [&str; 4] = [
        "gpu-sample-gpu-gather",
        "cpu-sample-gpu-gather",
        "gpu-sample-cpu-gather",
        "cpu-sample-cpu-gather",
    ];

    /// Measures on a scripted clock (the wall clock of a loaded 2-core machine
    /// can make any epoch look slower than the one before).
    #[test]
    fn auto_is_the_default_and_measures_every_candidate_then_trains_with_its_choice() {
        let c = cfg(&[]);
        assert_eq!(c.orchestration.policy, scheduler::Policy::Auto);
        let (mut t, tracer) = scripted_trainer(c, |_, _| 1e-3);
        assert!(t.auto_choice().is_none(), "nothing measured yet");
        let stats = t.fit().expect("fit");
        let choice = t.auto_choice().expect("auto decided").clone();
        for name in STEP_BASED {
            assert!(
                choice.reason.contains(name),
                "{name} not measured: {}",
                choice.reason
            );
        }
        assert!(
            choice.reason.contains("layer (cpu split"),
            "layer not measured: {}",
            choice.reason
        );
        // 38 batches an epoch: the measurements (4 × 5 step-based batches, 12
        // layer-based) take the first epoch and may spill into the second; the last
        // trains only with the choice.
        assert!(stats[0].calibrating);
        assert!(!stats.last().expect("epochs").calibrating);
        assert!(choice.per_batch_s > 0.0);
        // The choice is on the trace.
        let trace = tracer.collect();
        assert!(
            trace.instants.iter().any(|i| i.name == "auto choice"),
            "no auto choice instant"
        );
        // Every measurement is a slice with its result, and so is scoring the
        // hot set: where calibration's time goes.
        let probes: Vec<_> = trace
            .slices
            .iter()
            .filter(|s| s.name == "auto probe")
            .collect();
        assert!(probes.len() >= 5, "{} auto probe slices", probes.len());
        for p in &probes {
            let ms = p.args.extra.iter().find(|(k, _)| k == "per_batch_ms");
            assert!(ms.is_some_and(|(_, v)| *v > 0.0), "{:?}", p.args.extra);
        }
        assert!(trace.slices.iter().any(|s| s.name == "layer setup"));
        // Every calibration batch trained the model: accuracy as usual.
        let (_, acc) = test_at_best_val(&stats).expect("evaluated");
        assert!(acc > 0.6, "test accuracy {acc}");
    }

    /// A trainer of `c` measuring on a scripted clock that a callback moves by
    /// `cost(epoch, batch)` per batch (whatever the placement), and its tracer.
    fn scripted_trainer(
        c: TrainConfig,
        cost: impl Fn(usize, usize) -> f64 + Send + 'static,
    ) -> (Trainer, Tracer) {
        use crate::clock::ManualClock;
        let clock = ManualClock::new();
        let ds = load_dataset(&c).expect("dataset");
        let mut t =
            Trainer::measuring_on_host_with_clock(ds, c, Arc::new(clock.clone())).expect("trainer");
        let tracer = Tracer::new();
        t.set_tracer(tracer.clone());
        t.add_callback(Box::new(crate::on_batch(move |m| {
            clock.advance(Duration::from_secs_f64(cost(m.epoch, m.batch)));
            crate::Control::Continue
        })));
        (t, tracer)
    }

    /// `"auto"` on a scripted clock that a callback moves by `cost(epoch)` per
    /// batch (whatever the placement): `epochs` epochs, the stats and trace.
    fn auto_on_scripted_time(
        epochs: usize,
        cost: fn(usize) -> f64,
    ) -> (Vec<EpochStats>, crate::trace::Trace, scheduler::Choice) {
        let epochs_set = format!("train.epochs={epochs}");
        let (mut t, tracer) = scripted_trainer(cfg(&[epochs_set.as_str()]), move |e, _| cost(e));
        let stats = t.fit().expect("fit");
        let choice = t.auto_choice().expect("auto decided").clone();
        (stats, tracer.collect(), choice)
    }

    fn instants(trace: &crate::trace::Trace, name: &str) -> usize {
        trace.instants.iter().filter(|i| i.name == name).count()
    }

    #[test]
    fn auto_keeps_its_choice_while_the_cost_per_batch_holds() {
        let (stats, trace, choice) = auto_on_scripted_time(6, |_| 1e-3);
        assert_eq!(instants(&trace, "auto choice"), 1);
        assert_eq!(instants(&trace, "auto drift"), 0);
        assert!(stats[2..].iter().all(|s| !s.calibrating));
        assert!(
            !choice.reason.contains("measured again"),
            "{}",
            choice.reason
        );
    }

    #[test]
    fn auto_measures_again_when_the_cost_per_batch_drifts() {
        // Epochs 0–3 at 1 ms a batch, then 2 ms: epoch 4 drifts (+100% > 25%),
        // epoch 5 measures again, and the new choice's epochs set its baseline
        // (no second drift at the new, steady speed).
        let (stats, trace, choice) = auto_on_scripted_time(9, |e| if e < 4 { 1e-3 } else { 2e-3 });
        assert!(!stats[4].calibrating);
        assert!(stats[5].calibrating, "no new calibration after the drift");
        assert!(stats[7..].iter().all(|s| !s.calibrating));
        assert_eq!(instants(&trace, "auto drift"), 1);
        assert_eq!(instants(&trace, "auto choice"), 2);
        let drift = trace
            .instants
            .iter()
            .find(|i| i.name == "auto drift")
            .expect("drift instant");
        let arg = |k: &str| {
            drift
                .args
                .extra
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| *v)
        };
        assert!((arg("per_batch_ms").expect("per batch") - 2.0).abs() < 1e-6);
        assert!((arg("baseline_ms").expect("baseline") - 1.0).abs() < 1e-6);
        assert!(
            choice.reason.contains("measured again after epoch 4"),
            "{}",
            choice.reason
        );
    }

    /// A candidate far slower than the first is cut short after its first
    /// timed batch; with deferred losses (as on CUDA, `device.loss_lag = 8`)
    /// the batches trained after the cut are shown too, and the cut must stay
    /// the measurement's own: every epoch trains in full.
    #[test]
    fn a_cut_short_measurement_with_deferred_losses_ends_no_epoch() {
        for lag in ["device.loss_lag=1", "device.loss_lag=8"] {
            // The first candidate (batches 0–4) at 1 ms a batch, the second's
            // timed batches at 10 ms: more than `ABORT_RATIO` times the first.
            let c = cfg(&[lag]);
            let (mut t, _) = scripted_trainer(c, |e, b| {
                if e == 0 && (6..10).contains(&b) {
                    1e-2
                } else {
                    1e-3
                }
            });
            let stats = t.fit().expect("fit");
            assert_eq!(stats.len(), 3, "{lag}: {} epochs trained of 3", stats.len());
            let per_epoch = stats[0].steps;
            assert!(per_epoch > 10, "{lag}: {per_epoch} steps in epoch 0");
            assert_eq!(stats[2].steps, 3 * per_epoch, "{lag}: an epoch ended early");
            let choice = t.auto_choice().expect("auto decided");
            assert!(
                choice.reason.contains(STEP_BASED[1]),
                "{lag}: the cut measurement is not reported: {}",
                choice.reason
            );
        }
    }

    #[test]
    fn auto_on_a_one_layer_model_measures_only_step_based_placements() {
        let mut t = auto_trainer(cfg(&["model.layers=1", "train.fanouts=[5]"]));
        t.fit().expect("fit");
        let choice = t.auto_choice().expect("auto decided");
        assert!(
            !choice.reason.contains("layer (cpu split"),
            "{}",
            choice.reason
        );
        assert!(!choice.reason.starts_with("layer"), "{}", choice.reason);
    }
}
