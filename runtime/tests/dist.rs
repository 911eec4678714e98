//! Data-parallel training (`runtime::dist`) with ranks as threads
//! (`ThreadGroup`): N ranks with a global batch B train the model one rank
//! trains with batch B; partitioned features train what replicated features
//! train, without a rank ever reading a row it does not own; the ranks stop
//! together on a cancel, and a rank that fails ends the others with an error
//! instead of a hang. (`tests/mpi/` runs the same over MPI, in CI.)

use std::path::Path;
use std::sync::Arc;

use cpu_ops::FeatureMatrix;
use runtime::config::TrainConfig;
use runtime::data::Dataset;
use runtime::dist::{share, Communicator, ThreadGroup};
use runtime::load_dataset;
use runtime::{on_batch, CancelToken, Control, EpochStats, Error, Trainer, TrainerBuilder};

fn cfg(extra: &[&str]) -> TrainConfig {
    let mut sets: Vec<String> = vec![
        "model.kind=\"sage\"".into(),
        "model.hidden=16".into(),
        "model.dropout=0.0".into(),
        "train.epochs=2".into(),
        "train.batch_size=128".into(),
        "train.fanouts=[5,5]".into(),
        "train.eval_mode=\"sampled\"".into(),
        "train.eval_fanouts=[5,5]".into(),
        "data.synthetic.vertices=1500".into(),
        "data.synthetic.edges=9000".into(),
        "data.synthetic.classes=4".into(),
        "data.synthetic.dim=12".into(),
        "device.kind=\"host\"".into(),
        "threads.compute=1".into(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    TrainConfig::from_toml_with_overrides("", Path::new("test"), &sets).expect("config")
}

/// What a rank reports after training.
struct RankRun {
    params: Vec<Vec<f32>>,
    stats: Vec<EpochStats>,
    dist: runtime::dist::DistStats,
}

/// Trains `cfg` on `ranks` threads; rank `r` trains on `dataset(r)`.
fn train_ranks(
    cfg: &TrainConfig,
    ranks: usize,
    dataset: impl Fn(usize) -> Dataset + Sync,
) -> Vec<RankRun> {
    train_ranks_with(cfg, ranks, dataset, |_| {})
}

/// [`train_ranks`], calling `setup` on each rank's trainer before training.
fn train_ranks_with(
    cfg: &TrainConfig,
    ranks: usize,
    dataset: impl Fn(usize) -> Dataset + Sync,
    setup: impl Fn(&mut Trainer) + Sync,
) -> Vec<RankRun> {
    let comms = ThreadGroup::new(ranks).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let (dataset, setup) = (&dataset, &setup);
                s.spawn(move || {
                    let r = c.rank();
                    let mut t = TrainerBuilder::new(cfg.clone())
                        .dataset(dataset(r))
                        .communicator(Arc::new(c))
                        .build()
                        .expect("build");
                    assert_eq!(t.rank(), (r, ranks));
                    setup(&mut t);
                    let stats = t.fit().expect("fit");
                    RankRun {
                        params: t.params().unwrap(),
                        stats,
                        dist: t.dist_stats(),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The error a configuration refusal gives for `sets` (on top of nothing).
fn refused(sets: &[&str]) -> String {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    TrainConfig::from_toml_with_overrides("", Path::new("test"), &sets)
        .unwrap_err()
        .to_string()
}

/// Asserts that `set_communicator` fails on every one of `ranks` thread ranks
/// with an error containing every one of `words`.
fn every_rank_refuses(c: &TrainConfig, ds: &Dataset, ranks: usize, words: &[&str]) {
    let comms = ThreadGroup::new(ranks).unwrap();
    std::thread::scope(|s| {
        for comm in comms {
            let (c, ds) = (c.clone(), ds.clone());
            s.spawn(move || {
                let mut t = Trainer::new(ds, c).unwrap();
                let e = t.set_communicator(Arc::new(comm)).unwrap_err().to_string();
                assert!(words.iter().all(|w| e.contains(w)), "{e}");
            });
        }
    });
}

/// Largest |a − b| / max(|b|, 1e-3 · max |b|) over every parameter.
fn max_rel_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    let scale = b.iter().flatten().fold(0f32, |m, x| m.max(x.abs())) as f64;
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(&x, &y)| (x as f64 - y as f64).abs() / (y.abs() as f64).max(1e-3 * scale))
        .fold(0.0, f64::max)
}

/// GCN's symmetric normalization divides by the sources' degrees *in the
/// sampled block*, which depend on which seeds share a batch (DGL's
/// `GraphConv` on blocks does the same): its ranks agree with each other, and
/// train as well, but not bit-for-bit like one rank. SAGE and GAT aggregate
/// per destination and split exactly.
#[test]
fn n_ranks_train_the_one_rank_model() {
    for kind in ["sage", "gat"] {
        let kind_set = format!("model.kind=\"{kind}\"");
        let c = cfg(&[&kind_set, "model.heads=2"]);
        let ds = load_dataset(&c).unwrap();
        let one = train_ranks(&c, 1, |_| ds.clone());
        for n in [2usize, 3] {
            let many = train_ranks(&c, n, |_| ds.clone());
            for (r, run) in many.iter().enumerate() {
                // The ranks hold bit-identical weights.
                assert_eq!(run.params, many[0].params, "{kind}: rank {r} of {n}");
                assert_eq!(
                    run.dist.allreduces,
                    one[0].stats.iter().map(|s| s.batches as u64).sum::<u64>()
                );
            }
            let d = max_rel_diff(&many[0].params, &one[0].params);
            eprintln!("{kind}: {n} ranks vs 1, largest relative parameter difference {d:.2e}");
            assert!(d < 1e-3, "{kind}: {n} ranks differ from 1 rank by {d}");
            // The metrics are the whole batch's, on every rank.
            for (a, b) in many[0].stats.iter().zip(&one[0].stats) {
                assert!(
                    (a.loss - b.loss).abs() < 1e-3 * b.loss,
                    "{kind}: {} vs {}",
                    a.loss,
                    b.loss
                );
                assert!((a.train_acc - b.train_acc).abs() < 1e-9 + 2.0 / 1500.0);
                let (va, vb) = (a.val_acc.unwrap(), b.val_acc.unwrap());
                assert!((va - vb).abs() < 0.02, "{kind}: val {va} vs {vb}");
            }
        }
    }
}

/// `ds` with every feature row outside `keep` set to 1e30 (the builder refuses
/// NaN features; a rank that read one of these rows would train on garbage and
/// overflow).
fn foreign_rows_poisoned(ds: &Dataset, keep: std::ops::Range<usize>) -> Dataset {
    rows_poisoned_unless(ds, |v| keep.contains(&v))
}

/// `ds` with every feature row `v` for which `keep(v)` is false set to 1e30.
fn rows_poisoned_unless(ds: &Dataset, keep: impl Fn(usize) -> bool) -> Dataset {
    let mut ds = ds.clone();
    let dim = ds.features.dim();
    let mut x = ds.features.as_slice().to_vec();
    for (v, row) in x.chunks_mut(dim).enumerate() {
        if !keep(v) {
            row.fill(1e30);
        }
    }
    ds.features = FeatureMatrix::new(x.into(), ds.num_vertices(), dim).unwrap();
    ds
}

#[test]
fn partitioned_features_train_what_replicated_features_train() {
    // Dense rows, and sparse rows (the exchange then moves sparse rows).
    for sparse in ["off", "on"] {
        partitioned_equals_replicated(&format!("train.sparse_features=\"{sparse}\""));
    }
}

fn partitioned_equals_replicated(sparse: &str) {
    let replicated = cfg(&[sparse]);
    let ds = load_dataset(&replicated).unwrap();
    let n = ds.num_vertices();
    let reference = train_ranks(&replicated, 3, |_| ds.clone());
    for cache in [0usize, 200] {
        let c = cfg(&[
            sparse,
            "dist.features=\"partitioned\"",
            &format!("dist.remote_cache_rows={cache}"),
        ]);
        // A rank that read a row it does not own would train on 1e30 (and stop
        // with a non-finite loss, or train other weights).
        let part = train_ranks(&c, 3, |r| foreign_rows_poisoned(&ds, share(n, r, 3)));
        for (r, run) in part.iter().enumerate() {
            assert_eq!(
                run.params, reference[0].params,
                "{sparse}, cache {cache}, rank {r}"
            );
            for (a, b) in run.stats.iter().zip(&reference[0].stats) {
                assert_eq!(
                    (a.loss, a.val_acc, a.test_acc),
                    (b.loss, b.val_acc, b.test_acc)
                );
            }
            let d = run.dist;
            // One exchange per training and evaluation batch.
            assert!(
                d.exchanges > 0 && d.exchange_bytes > 0 && d.remote_rows > 0,
                "{d:?}"
            );
            if cache == 0 {
                assert_eq!(d.remote_cache_hits, 0);
            } else {
                assert!(d.remote_hit_rate() > 0.05, "{d:?}");
            }
        }
    }
}

/// Device ranks (the host backend's device engine) with partitioned features:
/// each rank gathers its share's input rows on the host through the exchange
/// and uploads them, wherever the placement samples, and never reads a row it
/// does not own (those rows are poisoned; the device does not load the
/// features). They train what device ranks with replicated features train, bit
/// for bit, and with a partition file the one-rank model.
#[test]
fn device_ranks_with_partitioned_features_train_what_replicated_ranks_train() {
    let base = ["device.kind=\"host\"", "train.sparse_features=\"off\""];
    let replicated = cfg(&[
        base[0],
        base[1],
        "orchestration.policy=\"gpu-sample-gpu-gather\"",
    ]);
    let ds = load_dataset(&replicated).unwrap();
    let n = ds.num_vertices();
    let reference = train_ranks(&replicated, 3, |_| ds.clone());
    let mut f32_bytes = 0;
    for policy in ["auto", "cpu-sample-gpu-gather", "gpu-sample-cpu-gather"] {
        let c = cfg(&[
            base[0],
            base[1],
            &format!("orchestration.policy=\"{policy}\""),
            "dist.features=\"partitioned\"",
            "dist.remote_cache_rows=100",
        ]);
        let part = train_ranks(&c, 3, |r| foreign_rows_poisoned(&ds, share(n, r, 3)));
        for (r, run) in part.iter().enumerate() {
            assert_eq!(run.params, reference[0].params, "{policy}: rank {r}");
            for (a, b) in run.stats.iter().zip(&reference[0].stats) {
                assert_eq!(
                    (a.loss, a.val_acc, a.test_acc),
                    (b.loss, b.val_acc, b.test_acc),
                    "{policy}"
                );
            }
            let d = run.dist;
            assert!(
                d.exchanges > 0 && d.remote_rows > 0 && d.remote_cache_hits > 0,
                "{policy}: {d:?}"
            );
        }
        f32_bytes = part[0].dist.exchange_bytes;
    }

    // bfloat16 rows (`device.feature_dtype`): rows travel as bfloat16, which
    // the device rounds to anyway: the replicated bfloat16 model, bit for bit,
    // for about half the exchanged bytes.
    let bf16 = "device.feature_dtype=\"bf16\"";
    let policy = "orchestration.policy=\"gpu-sample-cpu-gather\"";
    let reference = train_ranks(&cfg(&[base[0], base[1], policy, bf16]), 3, |_| ds.clone());
    let c = cfg(&[
        base[0],
        base[1],
        policy,
        bf16,
        "dist.features=\"partitioned\"",
        "dist.remote_cache_rows=100",
    ]);
    let part = train_ranks(&c, 3, |r| foreign_rows_poisoned(&ds, share(n, r, 3)));
    for run in &part {
        assert_eq!(run.params, reference[0].params, "bf16 rows");
    }
    let bytes = part[0].dist.exchange_bytes;
    eprintln!("exchanged bytes on rank 0: f32 rows {f32_bytes}, bf16 rows {bytes}");
    assert!(bytes * 10 < f32_bytes * 6, "{bytes} vs {f32_bytes}");

    // A partition file: ranks train the seeds they own; shares of one seed
    // and empty shares (batch 7 over 5 ranks) still take part in the exchange.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("graph.part.5");
    let parts: Vec<u32> = (0..n as u32).map(|v| (v * 7 + 3) % 5).collect();
    runtime::dist::write_partition_file(&path, &parts).unwrap();
    let small = ["train.batch_size=7", "train.epochs=1"];
    let one = train_ranks(
        &cfg(&[
            base[0],
            base[1],
            small[0],
            small[1],
            "orchestration.policy=\"gpu-sample-gpu-gather\"",
        ]),
        1,
        |_| ds.clone(),
    );
    let c = cfg(&[
        base[0],
        base[1],
        small[0],
        small[1],
        "dist.features=\"partitioned\"",
        &format!("dist.partition_file={:?}", path.to_str().unwrap()),
    ]);
    let many = train_ranks(&c, 5, |r| {
        rows_poisoned_unless(&ds, |v| parts[v] == r as u32)
    });
    for run in &many {
        assert_eq!(run.params, many[0].params);
    }
    let d = max_rel_diff(&many[0].params, &one[0].params);
    eprintln!("device ranks, partition file: 5 ranks vs 1, largest relative difference {d:.2e}");
    assert!(d < 1e-3, "{d}");
}

/// A partition file (METIS format) instead of contiguous ranges: each rank
/// reads only the rows the file gives it and trains the seeds it owns, so the
/// model is the one-rank model up to summation order; a partition that follows
/// the graph's communities (here the generator's blocks, which are the
/// classes) fetches fewer remote rows than contiguous ranges.
#[test]
fn a_partition_file_places_rows_and_seeds_by_owner() {
    // Three communities (classes), 90% of edges inside one.
    let community = ["data.synthetic.classes=3", "data.synthetic.homophily=0.9"];
    let base = cfg(&community);
    let ds = load_dataset(&base).unwrap();
    let n = ds.num_vertices();
    let one = train_ranks(&base, 1, |_| ds.clone());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("graph.part.3");
    let parts: Vec<u32> = ds.labels.iter().map(|&c| c % 3).collect();
    runtime::dist::write_partition_file(&path, &parts).unwrap();
    let file_set = format!("dist.partition_file={:?}", path.to_str().unwrap());
    let by_file = cfg(&[
        community[0],
        community[1],
        "dist.features=\"partitioned\"",
        &file_set,
    ]);
    let contiguous = cfg(&[community[0], community[1], "dist.features=\"partitioned\""]);
    let runs = train_ranks(&by_file, 3, |r| {
        rows_poisoned_unless(&ds, |v| parts[v] == r as u32)
    });
    let ranges = train_ranks(&contiguous, 3, |r| {
        foreign_rows_poisoned(&ds, share(n, r, 3))
    });
    for (r, run) in runs.iter().enumerate() {
        assert_eq!(run.params, runs[0].params, "rank {r}");
    }
    let d = max_rel_diff(&runs[0].params, &one[0].params);
    eprintln!("partition file: 3 ranks vs 1, largest relative difference {d:.2e}");
    assert!(d < 1e-3, "{d}");
    let (file_rows, range_rows): (u64, u64) = (
        runs.iter().map(|r| r.dist.remote_rows).sum(),
        ranges.iter().map(|r| r.dist.remote_rows).sum(),
    );
    eprintln!("remote rows: partition file {file_rows}, contiguous ranges {range_rows}");
    assert!(file_rows * 2 < range_rows, "{file_rows} vs {range_rows}");

    // A file for other ranks or another graph is refused, naming it.
    std::fs::write(&path, "0\n1\n").unwrap();
    every_rank_refuses(&by_file, &ds, 3, &["graph.part.3", "one per vertex"]);
    let e = refused(&["dist.partition_file=\"p.txt\""]);
    assert!(
        e.contains("dist.partition_file") && e.contains("partitioned"),
        "{e}"
    );
}

#[test]
fn gcn_ranks_agree_and_train_as_well_as_one_rank() {
    let c = cfg(&["model.kind=\"gcn\"", "train.epochs=4"]);
    let ds = load_dataset(&c).unwrap();
    let one = train_ranks(&c, 1, |_| ds.clone());
    let many = train_ranks(&c, 3, |_| ds.clone());
    for run in &many {
        assert_eq!(run.params, many[0].params);
    }
    let (a, b) = (
        many[0].stats.last().unwrap().val_acc.unwrap(),
        one[0].stats.last().unwrap().val_acc.unwrap(),
    );
    eprintln!("gcn: val accuracy 3 ranks {a:.4}, 1 rank {b:.4}");
    assert!(a > b - 0.05, "3 ranks {a} vs 1 rank {b}");
}

#[test]
fn a_last_batch_smaller_than_the_ranks_still_trains() {
    // 1500 vertices, train split 60%: batches of 299 leave a small last batch;
    // with 5 ranks and batch 6, some shares are a single seed, and a batch of
    // fewer seeds than ranks leaves some ranks nothing.
    let c = cfg(&["train.batch_size=7", "train.epochs=1"]);
    let ds = load_dataset(&c).unwrap();
    let one = train_ranks(&c, 1, |_| ds.clone());
    let many = train_ranks(&c, 5, |_| ds.clone());
    let d = max_rel_diff(&many[0].params, &one[0].params);
    assert!(d < 1e-3, "{d}");
}

/// Device ranks (the GPU code path, here on the host backend): each rank's
/// share runs forward and backward
/// on its device, the gradients are summed on the host, and every rank takes
/// the same device step. `policy = "auto"` keeps its starting placement on
/// every rank instead of measuring.
#[test]
fn device_engine_ranks_train_the_one_rank_model() {
    let one_cfg = cfg(&["orchestration.policy=\"gpu-sample-gpu-gather\""]);
    let ds = load_dataset(&one_cfg).unwrap();
    let one = train_ranks(&one_cfg, 1, |_| ds.clone());
    for (policy, n) in [
        ("auto", 2usize),
        ("gpu-sample-gpu-gather", 3),
        ("cpu-sample-gpu-gather", 2),
    ] {
        let c = cfg(&[&format!("orchestration.policy=\"{policy}\"")]);
        let many = train_ranks(&c, n, |_| ds.clone());
        for (r, run) in many.iter().enumerate() {
            assert_eq!(run.params, many[0].params, "{policy}: rank {r} of {n}");
            assert!(run
                .stats
                .iter()
                .all(|s| !s.calibrating && s.orchestration.is_none()));
        }
        assert_eq!(
            many[0].dist.allreduces,
            one[0].stats.iter().map(|s| s.batches as u64).sum::<u64>()
        );
        let d = max_rel_diff(&many[0].params, &one[0].params);
        eprintln!("device engine, {policy}: {n} ranks vs 1, largest relative difference {d:.2e}");
        assert!(d < 1e-3, "{policy}: {n} ranks differ from 1 rank by {d}");
        for (a, b) in many[0].stats.iter().zip(&one[0].stats) {
            assert!(
                (a.loss - b.loss).abs() < 1e-3 * b.loss,
                "{} vs {}",
                a.loss,
                b.loss
            );
            assert_eq!(a.steps, b.steps);
        }
    }
    // Shares of one seed and empty shares (batch 7 over 5 ranks).
    let c = cfg(&["train.batch_size=7", "train.epochs=1"]);
    let c1 = cfg(&[
        "orchestration.policy=\"gpu-sample-gpu-gather\"",
        "train.batch_size=7",
        "train.epochs=1",
    ]);
    let one = train_ranks(&c1, 1, |_| ds.clone());
    let many = train_ranks(&c, 5, |_| ds.clone());
    let d = max_rel_diff(&many[0].params, &one[0].params);
    assert!(d < 1e-3, "{d}");
}

/// The accuracy of `logits` (`n × classes`, row `v` for vertex `v`) on `ids`.
fn accuracy(logits: &ndarray::Array2<f32>, ds: &Dataset, ids: &[u32]) -> f64 {
    let correct = ids
        .iter()
        .filter(|&&v| {
            let row = logits.row(v as usize);
            let best = (0..row.len())
                .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
                .unwrap();
            best as u32 == ds.labels[v as usize]
        })
        .count();
    correct as f64 / ids.len() as f64
}

/// Full-graph evaluation in a job (host backend) is sharded: each rank infers
/// its vertex range layer by layer, the ranks exchange hidden rows, and each
/// counts its own validation and test vertices. It gives what full-graph
/// inference of the whole graph on one rank gives (`full_graph_logits`, which
/// stays local), for every model (a rank that counted other ranks' vertices
/// too would give a multiple of it).
#[test]
fn full_graph_evaluation_is_sharded_and_equals_whole_graph_inference() {
    for (kind, ranks, how) in [
        ("sage", 2usize, "sharded"),
        ("gcn", 3, "sharded"),
        ("gat", 2, "sharded"),
        ("gcn", 2, "sharded"),
        ("gcn", 2, "replicated"),
        // Threads are one machine: replicated.
        ("sage", 3, "auto"),
    ] {
        let c = cfg(&[
            &format!("model.kind=\"{kind}\""),
            &format!("dist.full_eval=\"{how}\""),
            "train.eval_mode=\"full\"",
            "train.epochs=4",
            "model.layers=3",
            "train.fanouts=[5,5,5]",
            "train.lr=0.02",
            "data.synthetic.homophily=0.7",
            "data.synthetic.signal=0.15",
            "train.eval_fanouts=[]",
        ]);
        let ds = load_dataset(&c).unwrap();
        let comms = ThreadGroup::new(ranks).unwrap();
        let results: Vec<((f64, f64), (f64, f64))> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|comm| {
                    let (c, ds) = (c.clone(), ds.clone());
                    s.spawn(move || {
                        let mut t = TrainerBuilder::new(c)
                            .dataset(ds.clone())
                            .communicator(Arc::new(comm))
                            .build()
                            .unwrap();
                        for _ in 0..4 {
                            t.train_epoch().unwrap();
                        }
                        let sharded = t.evaluate_val_test().unwrap();
                        let logits = t.full_graph_logits().unwrap();
                        let whole = (
                            accuracy(&logits, &ds, &ds.val_ids()),
                            accuracy(&logits, &ds, &ds.test_ids()),
                        );
                        (sharded, whole)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let one_vertex = 1.0 / ds.val_ids().len().min(ds.test_ids().len()) as f64;
        for (r, (sharded, whole)) in results.iter().enumerate() {
            eprintln!("{kind}, {ranks} ranks, rank {r}: {how} {sharded:?}, whole {whole:?}");
            assert_eq!(sharded, &results[0].0, "{kind}: ranks agree");
            if kind == "gcn" {
                // Rescaled inputs: equal up to rounding (a near tie may flip).
                // Replicated evaluation streams row blocks (`session/infer.rs`),
                // so it rescales GCN's inputs too.
                assert!((sharded.0 - whole.0).abs() <= one_vertex, "{kind}");
                assert!((sharded.1 - whole.1).abs() <= one_vertex, "{kind}");
            } else {
                assert_eq!(sharded, whole, "{kind}");
            }
        }
        assert!(results[0].0 .0 > 0.3, "{kind}: trained, not chance");
    }
}

/// `dist.reduce = "auto"` sums over MPI where a rank has no GPU or no NCCL
/// (here: host-backend device ranks), and says nothing of NCCL then.
#[test]
fn auto_reduce_falls_back_to_the_host_bucket_without_gpus() {
    let c = cfg(&["dist.reduce=\"auto\""]);
    let ds = load_dataset(&c).unwrap();
    let comms = ThreadGroup::new(2).unwrap();
    std::thread::scope(|s| {
        for comm in comms {
            let (c, ds) = (c.clone(), ds.clone());
            s.spawn(move || {
                let t = TrainerBuilder::new(c)
                    .dataset(ds)
                    .communicator(Arc::new(comm))
                    .build()
                    .unwrap();
                assert!(
                    !t.placement_note().contains("on the device over"),
                    "{}",
                    t.placement_note()
                );
            });
        }
    });
}

/// `--resume` with the same number of ranks: a job checkpointed after epoch 1
/// (by rank 0, as the CLI does) and resumed on every rank trains what an
/// uninterrupted job trains, bit for bit.
#[test]
fn a_checkpointed_job_resumes_on_the_same_ranks() {
    let c = cfg(&["train.epochs=2"]);
    let ds = load_dataset(&c).unwrap();
    let whole = train_ranks(&c, 3, |_| ds.clone());
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("checkpoint.tck");
    let first = {
        let mut c = c.clone();
        c.train.epochs = 1;
        c
    };
    let run = |resume: Option<&Path>, cfg: &TrainConfig| -> Vec<Vec<Vec<f32>>> {
        let comms = ThreadGroup::new(3).unwrap();
        std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|comm| {
                    let ds = ds.clone();
                    let ck = &ck;
                    s.spawn(move || {
                        let r = comm.rank();
                        let mut t = TrainerBuilder::new(cfg.clone())
                            .dataset(ds)
                            .communicator(Arc::new(comm))
                            .build()
                            .expect("build");
                        if let Some(path) = resume {
                            t.load_checkpoint(path).expect("load");
                            assert_eq!(t.epoch(), 1);
                        }
                        t.fit().expect("fit");
                        if resume.is_none() && r == 0 {
                            t.save_checkpoint(ck).expect("save");
                        }
                        t.params().unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    run(None, &first);
    let resumed = run(Some(&ck), &c);
    for (r, p) in resumed.iter().enumerate() {
        assert_eq!(p, &whole[r].params, "rank {r}");
    }
}

#[test]
fn a_cancel_on_one_rank_stops_every_rank_after_the_same_batch() {
    let c = cfg(&["train.epochs=1"]);
    let ds = load_dataset(&c).unwrap();
    let comms = ThreadGroup::new(3).unwrap();
    let stopped: Vec<(usize, usize)> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let ds = ds.clone();
                let c = c.clone();
                s.spawn(move || {
                    let r = comm.rank();
                    let token = CancelToken::new();
                    let t2 = token.clone();
                    let mut t = TrainerBuilder::new(c)
                        .dataset(ds)
                        .cancel_token(token)
                        // Only rank 2 is told to cancel, during batch 2.
                        .callback(on_batch(move |m| {
                            if r == 2 && m.batch == 2 {
                                t2.cancel();
                            }
                            Control::Continue
                        }))
                        .communicator(Arc::new(comm))
                        .build()
                        .unwrap();
                    match t.fit() {
                        Err(Error::Cancelled { epoch, batch, .. }) => (epoch, batch),
                        other => panic!("rank {r}: {other:?}"),
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Rank 2's flag rides on batch 3's all-reduce: every rank stops before batch 4.
    assert_eq!(stopped, vec![(0, 4); 3]);
}

#[test]
fn a_callback_stop_on_one_rank_stops_every_rank_together() {
    let c = cfg(&["train.epochs=3"]);
    let ds = load_dataset(&c).unwrap();
    for (at_batch, at_epoch) in [(Some(1usize), None), (None, Some(0usize))] {
        let comms = ThreadGroup::new(3).unwrap();
        let ends: Vec<(usize, usize, usize)> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|comm| {
                    let (ds, c) = (ds.clone(), c.clone());
                    s.spawn(move || {
                        let r = comm.rank();
                        let mut t = TrainerBuilder::new(c)
                            .dataset(ds)
                            .callback(on_batch(move |m| {
                                if r == 0 && Some(m.batch) == at_batch {
                                    Control::Stop
                                } else {
                                    Control::Continue
                                }
                            }))
                            .callback(runtime::on_epoch(move |e| {
                                if r == 2 && Some(e.epoch) == at_epoch {
                                    Control::Stop
                                } else {
                                    Control::Continue
                                }
                            }))
                            .communicator(Arc::new(comm))
                            .build()
                            .unwrap();
                        let stats = t.fit().unwrap();
                        (stats.len(), t.epoch(), t.batch_in_epoch())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        if at_batch.is_some() {
            // Rank 0 stops after batch 1; the stop rides on batch 2's all-reduce.
            assert_eq!(ends, vec![(0, 0, 3); 3]);
        } else {
            // Rank 2 stops after epoch 0; the epoch's agreement ends every rank.
            assert_eq!(ends, vec![(1, 1, 0); 3]);
        }
    }
}

#[test]
fn a_failing_rank_ends_the_others_with_an_error_not_a_hang() {
    let c = cfg(&["train.epochs=1"]);
    let ds = load_dataset(&c).unwrap();
    let comms = ThreadGroup::new(3).unwrap();
    let outcomes: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let ds = ds.clone();
                let c = c.clone();
                s.spawn(move || {
                    let r = comm.rank();
                    let comm: Arc<dyn Communicator> = Arc::new(comm);
                    let mut t: Trainer = TrainerBuilder::new(c)
                        .dataset(ds)
                        .communicator(Arc::clone(&comm))
                        .build()
                        .unwrap();
                    if r == 1 {
                        // Rank 1 fails after one epoch's worth of nothing: it leaves.
                        comm.abort(1);
                        return "rank 1 failed".to_string();
                    }
                    t.fit().unwrap_err().to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, o) in outcomes.iter().enumerate() {
        if r != 1 {
            assert!(o.contains("rank 1 left the job"), "rank {r}: {o}");
        }
    }
}

#[test]
fn ranks_with_different_configurations_are_refused() {
    let comms = ThreadGroup::new(2).unwrap();
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let lr = format!("train.lr={}", 0.01 * (1 + comm.rank()) as f64);
                    let c = cfg(&[&lr]);
                    let ds = load_dataset(&c).unwrap();
                    TrainerBuilder::new(c)
                        .dataset(ds)
                        .communicator(Arc::new(comm))
                        .build()
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in errs {
        assert!(e.contains("disagree on the configuration"), "{e}");
    }
}

#[test]
fn what_is_not_built_says_so() {
    let c = cfg(&["dist.reduce=\"nccl\""]);
    let ds = load_dataset(&c).unwrap();
    let mut t = Trainer::new(ds.clone(), c).unwrap();
    let e = t
        .set_communicator(Arc::new(runtime::dist::Solo))
        .unwrap_err()
        .to_string();
    // Without libnccl the error names the library; with it, a rank on the
    // host says it needs a GPU.
    let expected = match gpu_ops::nccl_available() {
        Ok(()) => "device.kind = \"cuda\"",
        Err(_) => "libnccl.so",
    };
    assert!(
        e.contains("dist.reduce") && e.contains(expected) && !e.contains('\n'),
        "{e}"
    );
    // Layer-based orchestration across ranks is refused on every rank.
    let layer = cfg(&[
        "orchestration.policy=\"layer\"",
        "orchestration.hot_ratio=0.1",
    ]);
    every_rank_refuses(&layer, &ds, 2, &["orchestration.policy", "not built yet"]);

    // Partitioned features cannot serve full-graph work.
    let e = refused(&["dist.features=\"partitioned\"", "train.eval_mode=\"full\""]);
    assert!(
        e.contains("train.eval_mode") && e.contains("partitioned"),
        "{e}"
    );
    let e = refused(&["dist.remote_cache_rows=5"]);
    assert!(e.contains("dist.remote_cache_rows"), "{e}");
}
