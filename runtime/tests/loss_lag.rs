//! The deferred loss (`device.loss_lag`) on the host backend: the step executor
//! queues batches without reading their losses and reads them in groups,
//! through the engine's one deferred-loss component (`engine/losses.rs`).
//! Losses, weights and the non-finite stop are those of reading every loss at
//! once, and the trace's `host.syncs` counter shows no synchronization of the
//! compute stream for them (an asynchronous read per group, resolved on an
//! event) instead of one per batch. The layer-based executor defers its losses
//! through the same component: the same losses, weights and non-finite stop,
//! one read per super-batch, and no synchronization of the compute stream for
//! them (a stop under a lag:
//! `a_stop_inside_a_super_batch_then_training_on_matches_an_uninterrupted_run`
//! in `orchestration.rs`).

use std::path::Path;

use cpu_ops::FeatureMatrix;
use runtime::config::TrainConfig;
use runtime::data::Dataset;
use runtime::trace::{Tracer, HOST_SYNCS, SAMPLING_SYNCS};
use runtime::{load_dataset, Checkpoint, Error, Trainer};

fn cfg(extra: &[&str]) -> TrainConfig {
    let mut sets: Vec<String> = vec![
        "model.kind=\"sage\"".into(),
        "model.hidden=16".into(),
        "model.dropout=0.2".into(),
        "train.epochs=2".into(),
        "train.batch_size=64".into(),
        "train.fanouts=[5,5]".into(),
        "train.eval_every=0".into(),
        "data.synthetic.vertices=2000".into(),
        "data.synthetic.edges=8000".into(),
        "data.synthetic.classes=4".into(),
        "data.synthetic.dim=8".into(),
        "device.kind=\"host\"".into(),
        "threads.compute=1".into(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    TrainConfig::from_toml_with_overrides("", Path::new("test"), &sets).expect("config")
}

fn lag(n: usize, extra: &[&str]) -> TrainConfig {
    let mut sets = vec![format!("device.loss_lag={n}")];
    sets.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = sets.iter().map(String::as_str).collect();
    cfg(&refs)
}

/// Each epoch's loss, accuracy (bits) and batches, the weights and the steps.
type Bits = (Vec<(u64, u64, usize)>, Vec<Vec<f32>>, u64);

/// The [`Bits`] of a `fit` under `c`, and the trainer.
fn fit_bits(c: TrainConfig) -> (Bits, Trainer) {
    let ds = load_dataset(&c).expect("dataset");
    let mut t = Trainer::new(ds, c).expect("trainer");
    let stats = t.fit().expect("fit");
    let losses = stats
        .iter()
        .map(|s| (s.loss.to_bits(), s.train_acc.to_bits(), s.batches))
        .collect();
    ((losses, t.params().expect("params"), t.steps()), t)
}

#[test]
fn a_loss_lag_trains_the_same_losses_and_weights() {
    for extra in [
        &[][..],
        &["orchestration.policy=\"cpu-sample-cpu-gather\""][..],
        &["device.sample_ahead=false"][..],
    ] {
        let run = |n: usize| fit_bits(lag(n, extra)).0;
        let one = run(1);
        assert!(one.2 > 16, "{extra:?}: too few batches to test a lag");
        for n in [3, 8] {
            assert_eq!(run(n), one, "{extra:?}: lag {n}");
        }
    }
}

/// The built-in graph with feature (`v`, column 3) set to NaN.
fn poisoned(c: &TrainConfig, v: usize) -> Dataset {
    let mut ds = load_dataset(c).expect("dataset");
    let dim = ds.features.dim();
    let mut x = ds.features.as_slice().to_vec();
    x[v * dim + 3] = f32::NAN;
    ds.features = FeatureMatrix::new(x.into(), ds.num_vertices(), dim).expect("features");
    ds
}

/// A training vertex of the smallest degree (it appears in few batches).
fn quiet_training_vertex(ds: &Dataset) -> usize {
    (0..ds.num_vertices())
        .filter(|&v| ds.train_mask[v] != 0 && ds.graph.degree(v as u32) > 0)
        .min_by_key(|&v| (ds.graph.degree(v as u32), v))
        .expect("a training vertex")
}

#[test]
fn a_nan_under_a_loss_lag_stops_at_its_batch_with_the_weights_before_it() {
    let clean = load_dataset(&cfg(&[])).expect("dataset");
    let v = quiet_training_vertex(&clean);
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |n: usize| {
        let c = lag(n, &[]);
        let ck = dir.path().join(format!("lag{n}.tck"));
        let mut t = Trainer::new(poisoned(&c, v), c).expect("trainer");
        t.set_checkpoint_path(Some(ck.clone()));
        match t.fit() {
            Err(Error::NonFinite { epoch, batch, loss }) => {
                assert!(!loss.is_finite(), "lag {n}");
                assert_eq!(t.batch_in_epoch(), batch, "lag {n}: the position");
                let saved = Checkpoint::read(&ck).expect("checkpoint");
                assert_eq!(
                    (saved.position.epoch, saved.position.batch),
                    (epoch, batch),
                    "lag {n}"
                );
                (epoch, batch, t.params().expect("params"), t.steps())
            }
            other => panic!("lag {n}: expected a non-finite stop, got {other:?}"),
        }
    };
    let one = run(1);
    let (epoch, batch, ref weights, steps) = one;
    assert!(
        weights.iter().all(|p| p.iter().all(|x| x.is_finite())),
        "the bad update was applied"
    );
    // The bad batch is not the first: the steps before it count.
    assert!(steps > 0, "epoch {epoch} batch {batch}");
    for n in [2, 3, 8] {
        // Same batch named, same weights bit for bit (those before it: the
        // steps queued after it were skipped on the device and taken back).
        assert_eq!(run(n), one, "lag {n}");
    }
    // And training can go on from there: the guard was cleared.
    let c = lag(8, &["train.on_nonfinite=\"skip-batch\""]);
    let mut t = Trainer::new(poisoned(&c, v), c).expect("trainer");
    t.fit().expect("skip-batch trains on");
}

/// The synchronizations per batch as the trace's `host.syncs` counter shows
/// them: one sample per batch of the only epoch, cumulative.
fn sync_samples(n: usize) -> Vec<f64> {
    let c = lag(n, &["train.epochs=1"]);
    let ds = load_dataset(&c).expect("dataset");
    let mut t = Trainer::new(ds, c).expect("trainer");
    let tracer = Tracer::new();
    t.set_tracer(tracer.clone());
    t.fit().expect("fit");
    tracer
        .collect()
        .counter_series(HOST_SYNCS)
        .map(|c| c.value)
        .collect()
}

#[test]
fn the_trace_counts_one_synchronization_per_batch_or_per_lag() {
    // Every loss read at once: one synchronization per batch (the host
    // backend counts a loss that reaches the host as one).
    let one = sync_samples(1);
    assert!(one.len() > 16, "{} batches", one.len());
    for w in one.windows(2) {
        assert_eq!(w[1] - w[0], 1.0, "{one:?}");
    }
    // Lag 8: the losses of 8 batches in one asynchronous read, resolved on
    // its copy's event: the compute stream never synchronizes for them.
    let eight = sync_samples(8);
    assert_eq!(eight.len(), one.len());
    assert!(eight.iter().all(|&s| s == eight[0]), "{eight:?}");
}

#[test]
fn the_sampling_syncs_have_their_own_counter() {
    // The device sampler (the host backend's sibling) queues groups of 8
    // batches and reads each group's sizes once: after the first batch (sampled
    // at its turn, one read) no 8 consecutive batches hold more than one
    // sampling synchronization, and the reads do happen.
    let c = lag(8, &["train.epochs=1"]);
    let ds = load_dataset(&c).expect("dataset");
    let mut t = Trainer::new(ds, c).expect("trainer");
    let tracer = Tracer::new();
    t.set_tracer(tracer.clone());
    t.fit().expect("fit");
    let trace = tracer.collect();
    let sampling: Vec<f64> = trace
        .counter_series(SAMPLING_SYNCS)
        .map(|c| c.value)
        .collect();
    assert_eq!(sampling.len(), trace.counter_series(HOST_SYNCS).count());
    assert!(sampling.len() > 17, "{} batches", sampling.len());
    for w in sampling.windows(9) {
        assert!(w[8] - w[0] <= 1.0, "{sampling:?}");
    }
    let reads = sampling.len().saturating_sub(1).div_ceil(8) as f64;
    assert_eq!(sampling.last().copied(), Some(1.0 + reads), "{sampling:?}");
    // One `sample read` slice per group read, each with its one synchronization.
    let group_reads: Vec<_> = trace
        .slices
        .iter()
        .filter(|s| s.name == "sample read")
        .collect();
    assert_eq!(group_reads.len() as f64, reads);
    assert!(group_reads.iter().all(|s| s
        .args
        .extra
        .iter()
        .any(|(k, v)| k == "host_syncs" && *v == 1.0)));
    // A `loss read` slice every 8 batches and one at the end (the flush of
    // the read still in flight), on the accelerator track, none of them a
    // synchronization.
    let reads: Vec<_> = trace
        .slices
        .iter()
        .filter(|s| s.name == "loss read")
        .collect();
    assert_eq!(reads.len(), sampling.len() / 8 + 1);
    assert!(reads.iter().all(|s| s
        .args
        .extra
        .iter()
        .any(|(k, v)| k == "host_syncs" && *v == 0.0)));
}

#[test]
fn sampling_ahead_in_groups_trains_as_sampling_at_each_turn() {
    // Same blocks whichever way they were sampled: losses and weights agree
    // bit for bit with sampling ahead off, and with a host sampler ahead.
    let run = |extra: &[&str]| {
        let c = lag(8, extra);
        let ds = load_dataset(&c).expect("dataset");
        let mut t = Trainer::new(ds, c).expect("trainer");
        let stats = t.fit().expect("fit");
        let losses: Vec<(u64, u64)> = stats
            .iter()
            .map(|s| (s.loss.to_bits(), s.train_acc.to_bits()))
            .collect();
        (losses, t.params().expect("params"))
    };
    let grouped = run(&[]);
    assert_eq!(run(&["device.sample_ahead=false"]), grouped);
    assert_eq!(
        run(&["orchestration.policy=\"cpu-sample-gpu-gather\""]),
        grouped
    );
}

/// The layer-based executor with rows that do not depend on the CPU workers'
/// timing: all-neighbour bottom sampling, no dropout, bound 0 and `"wait"`
/// (every hot row is computed with the batch's own weights).
const LAYER: [&str; 7] = [
    "orchestration.policy=\"layer\"",
    "orchestration.hot_ratio=0.3",
    "orchestration.staleness_bound=0",
    "orchestration.on_late=\"wait\"",
    "orchestration.super_batch=4",
    "train.fanouts=[-1, 5]",
    "model.dropout=0.0",
];

fn layer_lag(n: usize, extra: &[&str]) -> TrainConfig {
    let mut sets: Vec<&str> = LAYER.to_vec();
    sets.extend_from_slice(extra);
    lag(n, &sets)
}

#[test]
fn the_layer_path_under_a_loss_lag_trains_the_same_losses_and_weights() {
    let run = |n: usize| {
        let (bits, t) = fit_bits(layer_lag(n, &[]));
        let o = t.orchestration_totals().expect("layer path");
        assert!(o.protocol.hot_uses > 0, "lag {n}: {}", o.summary());
        bits
    };
    let one = run(1);
    assert!(one.2 > 16, "too few batches to test a lag");
    for n in [3, 8] {
        assert_eq!(run(n), one, "lag {n}");
    }
}

/// The compute stream's synchronizations and the `loss read` slices of one
/// epoch on the layer path (after a first epoch).
fn layer_syncs(n: usize) -> (u64, usize, usize) {
    let c = layer_lag(n, &["train.eval_every=0"]);
    let ds = load_dataset(&c).expect("dataset");
    let mut t = Trainer::new(ds, c).expect("trainer");
    t.train_epoch().expect("epoch 0");
    let tracer = Tracer::new();
    t.set_tracer(tracer.clone());
    let before = t.transfer_stats();
    let s = t.train_epoch().expect("epoch 1");
    let d = t.transfer_stats().since(&before);
    let trace = tracer.collect();
    let reads: Vec<_> = trace
        .slices
        .iter()
        .filter(|s| s.name == "loss read")
        .collect();
    // A read waits for its copy on an event, never on the stream.
    for r in &reads {
        let syncs = r.args.extra.iter().find(|(k, _)| k == "host_syncs");
        assert_eq!(syncs.map(|(_, v)| *v), Some(0.0), "{:?}", r.args);
    }
    // Inside a `train` slice (the batch's whole device step, its bottom hop
    // sampled a super-batch ahead and read on an event): the loss read at
    // lag 1, nothing under a lag — but for the planner thread's one read of
    // a super-batch's top layers on the sampling stream, which the slice
    // counts when it runs meanwhile.
    let trains: Vec<f64> = trace
        .slices
        .iter()
        .filter(|s| s.name == "train")
        .filter_map(|s| s.args.extra.iter().find(|(k, _)| k == "host_syncs"))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(trains.len(), s.batches, "lag {n}");
    let planner_reads = s.batches.div_ceil(4) as f64;
    if n == 1 {
        assert!(trains.iter().all(|&v| v >= 1.0), "lag {n}: {trains:?}");
    } else {
        let total: f64 = trains.iter().sum();
        assert!(total <= planner_reads, "lag {n}: {trains:?}");
    }
    (d.syncs, reads.len(), s.batches)
}

#[test]
fn the_layer_path_reads_its_losses_once_per_super_batch_without_a_synchronization() {
    let (syncs1, reads1, batches) = layer_syncs(1);
    assert!(batches > 8, "{batches} batches");
    assert_eq!(reads1, 0, "lag 1 reads each loss in its step");
    for n in [3, 8] {
        let (syncs, reads, b) = layer_syncs(n);
        assert_eq!(b, batches);
        // Each batch's loss read was one synchronization of the compute
        // stream (the host backend counts a loss reaching the host as one).
        assert_eq!(syncs1 - syncs, batches as u64, "lag {n}");
        // One read queued per super-batch of 4, and one more per `n` batches
        // inside a super-batch when `n` is smaller; each `loss read` slice
        // resolves the read before it and queues the next, and the run's end
        // resolves the last.
        let super_batches = batches.div_ceil(4);
        let queued: usize = (0..super_batches)
            .map(|j| (batches - 4 * j).min(4).div_ceil(n))
            .sum();
        assert_eq!(reads, queued + 1, "lag {n}");
    }
}

#[test]
fn a_nan_under_a_loss_lag_on_the_layer_path_stops_at_its_batch_with_the_weights_before_it() {
    let clean = load_dataset(&layer_lag(1, &[])).expect("dataset");
    let v = quiet_training_vertex(&clean);
    let run = |n: usize| {
        let c = layer_lag(n, &[]);
        let mut t = Trainer::new(poisoned(&c, v), c).expect("trainer");
        match t.fit() {
            Err(Error::NonFinite { epoch, batch, loss }) => {
                assert!(!loss.is_finite(), "lag {n}");
                assert_eq!(t.batch_in_epoch(), batch, "lag {n}: the position");
                (epoch, batch, t.params().expect("params"), t.steps())
            }
            other => panic!("lag {n}: expected a non-finite stop, got {other:?}"),
        }
    };
    let one = run(1);
    assert!(one.3 > 0, "the bad batch is not the first");
    assert!(
        one.2.iter().all(|p| p.iter().all(|x| x.is_finite())),
        "the bad update was applied"
    );
    for n in [3, 8] {
        assert_eq!(run(n), one, "lag {n}");
    }
}
