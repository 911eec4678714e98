//! Link prediction end to end on the host backend: it learns (MRR far above
//! chance on an SBM whose links follow its communities), every placement
//! trains the same batches, a loss lag and a checkpoint change nothing, the
//! layer path keeps its staleness bound, data-parallel ranks train the model
//! one rank trains, scores come out, and bad input is refused before training
//! with one line naming the key or field.

use std::path::Path;
use std::sync::Arc;

use runtime::config::TrainConfig;
use runtime::data::{generate_sbm, Dataset, EdgeSplitSpec, SbmOptions};
use runtime::trace::{Tracer, HOST_SYNCS, SAMPLING_SYNCS};
use runtime::{load_dataset, Error, Trainer};

/// A learnable link set: 2,000 vertices in 4 tight communities, features that
/// follow them, 5% of the edges held out for validation and 10% for test.
fn sbm() -> Dataset {
    generate_sbm(&SbmOptions {
        num_vertices: 2000,
        num_edges: 20_000,
        num_classes: 4,
        feature_dim: 16,
        homophily: 0.9,
        signal: 0.5,
        edge_split: Some(EdgeSplitSpec::new([0.85, 0.05, 0.1]).expect("split")),
        seed: 3,
        ..SbmOptions::default()
    })
    .expect("sbm")
}

fn cfg(extra: &[&str]) -> TrainConfig {
    let mut sets: Vec<String> = [
        "model.task=\"link\"",
        "model.kind=\"sage\"",
        "model.hidden=32",
        "model.dropout=0.0",
        "train.fanouts=[5, 5]",
        "train.batch_size=256",
        "train.epochs=3",
        "train.lr=0.01",
        "train.eval_batch_size=512",
        "link.eval_negatives=20",
        "device.kind=\"host\"",
        "threads.compute=1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    sets.extend(extra.iter().map(|s| s.to_string()));
    TrainConfig::from_toml_with_overrides("", Path::new("test"), &sets).expect("config")
}

/// Each epoch's loss and train accuracy bits and the test metrics; the weights.
type Run = (Vec<(u64, u64)>, Vec<(String, u64)>, Vec<Vec<f32>>);

fn run(ds: &Arc<Dataset>, extra: &[&str]) -> Run {
    let mut t = Trainer::new(Arc::clone(ds), cfg(extra)).expect("trainer");
    let stats = t.fit().expect("fit");
    let losses = stats
        .iter()
        .map(|s| (s.loss.to_bits(), s.train_acc.to_bits()))
        .collect();
    let last = stats.last().expect("an epoch");
    let test = last
        .test_metrics
        .iter()
        .map(|m| (m.name.clone(), m.value.to_bits()))
        .collect();
    (losses, test, t.params().expect("params"))
}

fn metric(stats: &runtime::EpochStats, name: &str) -> f64 {
    stats
        .test_metrics
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no {name} in {:?}", stats.test_metrics))
        .value
}

#[test]
fn link_prediction_learns_far_above_chance() {
    let ds = Arc::new(sbm());
    let mut t = Trainer::new(Arc::clone(&ds), cfg(&["train.epochs=4"])).expect("trainer");
    let stats = t.fit().expect("fit");
    let last = stats.last().expect("epochs");
    assert!(last.val_acc.is_none() && last.test_acc.is_none());
    assert_eq!(
        last.test_metrics
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>(),
        ["mrr", "hits@10", "auc"]
    );
    // 20 negatives each: a random ranking scores an MRR of H(21)/21 ≈ 0.173
    // and an AUC of 0.5.
    let (mrr, auc) = (metric(last, "mrr"), metric(last, "auc"));
    assert!(mrr > 0.4, "test MRR {mrr}");
    assert!(auc > 0.8, "test AUC {auc}");
    assert!(stats[0].loss > last.loss, "{stats:?}");
    // The best epoch by the first metric (MRR).
    let (_, best) = runtime::test_at_best_val(&stats).expect("evaluated");
    assert!(best > 0.4);
    // Scores of a caller's pairs: a held-out positive outscores, on average,
    // a pair drawn across communities.
    let split = ds.edges.as_ref().expect("split");
    let (src, dst): (Vec<u32>, Vec<u32>) = split.test.iter().take(200).unzip();
    let pos = t.score_edges(&src, &dst).expect("scores");
    let far: Vec<u32> = src.iter().map(|&u| (u + 1000) % 2000).collect();
    let neg = t.score_edges(&src, &far).expect("scores");
    let mean = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
    assert!(mean(&pos) > mean(&neg), "{} vs {}", mean(&pos), mean(&neg));
    assert!(t.score_edges(&[0], &[2000]).is_err());
    assert!(t.predict(&[0]).is_err(), "a link model has no class logits");
}

#[test]
fn every_step_placement_and_a_loss_lag_train_the_same_link_batches() {
    let ds = Arc::new(sbm());
    let base = run(&ds, &[]);
    for extra in [
        &["orchestration.policy=\"cpu-sample-cpu-gather\""][..],
        &["orchestration.policy=\"gpu-sample-cpu-gather\""][..],
        &["orchestration.policy=\"cpu-sample-gpu-gather\""][..],
        &["device.sample_ahead=false"][..],
        &["device.loss_lag=4"][..],
    ] {
        assert_eq!(run(&ds, extra), base, "{extra:?}");
    }
    // Deterministic for the seed; another seed trains other batches.
    assert_eq!(run(&ds, &[]), base);
    assert_ne!(run(&ds, &["train.seed=5"]).0, base.0);
}

#[test]
fn leaving_a_batchs_edges_out_never_synchronizes_the_compute_stream() {
    // The exclusion reads each block's kept edge count (a synchronization on
    // CUDA, counted by the host backend). It runs where the batch was sampled:
    // on the host sampler, or on the device sampler's stream before the batch
    // reaches the compute stream. With losses deferred (lag 8) the compute
    // stream's count stays flat over the epoch.
    let ds = Arc::new(sbm());
    for policy in ["gpu-sample-gpu-gather", "cpu-sample-gpu-gather"] {
        let p = format!("orchestration.policy=\"{policy}\"");
        let c = cfg(&[&p, "device.loss_lag=8", "train.epochs=1"]);
        let mut t = Trainer::new(Arc::clone(&ds), c).expect("trainer");
        let tracer = Tracer::new();
        t.set_tracer(tracer.clone());
        t.fit().expect("fit");
        let trace = tracer.collect();
        let syncs: Vec<f64> = trace.counter_series(HOST_SYNCS).map(|c| c.value).collect();
        assert!(syncs.len() > 16, "{policy}: {} batches", syncs.len());
        assert!(syncs.iter().all(|&s| s == syncs[0]), "{policy}: {syncs:?}");
        if policy.starts_with("gpu-sample") {
            // The device sampler synchronizes for it instead: each batch's two
            // blocks after every group read.
            let sampling: Vec<f64> = trace
                .counter_series(SAMPLING_SYNCS)
                .map(|c| c.value)
                .collect();
            assert!(
                sampling.last() >= Some(&(2.0 * sampling.len() as f64)),
                "{sampling:?}"
            );
        }
    }
}

#[test]
fn the_exclusion_changes_what_a_batch_samples() {
    let ds = Arc::new(sbm());
    // With every neighbour sampled, leaving the batch's own edges out changes
    // the blocks, hence the losses; "self" and "reverse" differ on an
    // undirected store.
    let all = ["train.fanouts=[-1, -1]", "train.epochs=1"];
    let with = |e: &str| {
        let mut x = all.to_vec();
        x.push(e);
        run(&ds, &x).0
    };
    let none = with("link.exclude=\"none\"");
    let reverse = with("link.exclude=\"reverse\"");
    assert_ne!(none, reverse);
    assert_ne!(with("link.exclude=\"self\""), reverse);
    assert_eq!(
        with("link.exclude=\"auto\""),
        reverse,
        "auto is reverse when undirected"
    );
}

#[test]
fn the_layer_path_trains_link_batches_within_the_staleness_bound() {
    let ds = Arc::new(sbm());
    let mut t = Trainer::new(
        Arc::clone(&ds),
        cfg(&[
            "orchestration.policy=\"layer\"",
            "orchestration.hot_ratio=0.2",
            "orchestration.super_batch=2",
            "orchestration.staleness_bound=3",
            "train.epochs=4",
        ]),
    )
    .expect("trainer");
    let stats = t.fit().expect("fit");
    for s in &stats {
        let o = s.orchestration.as_ref().expect("layer statistics");
        assert!(o.protocol.hot_uses > 0, "{o:?}");
        assert!(o.protocol.gaps.max().unwrap_or(0) <= 3, "{o:?}");
    }
    let mrr = metric(stats.last().expect("epochs"), "mrr");
    assert!(mrr > 0.4, "layer path test MRR {mrr}");
}

#[test]
fn a_resumed_link_run_is_bit_identical() {
    let ds = Arc::new(sbm());
    let c = cfg(&["link.decoder=\"mlp\"", "train.epochs=2"]);
    let mut whole = Trainer::new(Arc::clone(&ds), c.clone()).expect("trainer");
    let all = whole.fit().expect("fit");
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("link.tck");
    let mut first = Trainer::new(Arc::clone(&ds), c.clone()).expect("trainer");
    first.train_epoch().expect("epoch 0");
    first.save_checkpoint(&ck).expect("save");
    let mut again = Trainer::new(Arc::clone(&ds), c).expect("trainer");
    again.load_checkpoint(&ck).expect("load");
    let rest = again.fit().expect("fit");
    assert_eq!(
        rest.last().map(|s| s.loss.to_bits()),
        all.last().map(|s| s.loss.to_bits())
    );
    assert_eq!(
        again.params().expect("params"),
        whole.params().expect("params")
    );
    // The MLP decoder's tensors are part of the model.
    assert!(whole
        .param_names()
        .iter()
        .any(|n| n.starts_with("decoder.")));
}

#[test]
fn bad_link_input_is_refused_before_training_with_one_line() {
    // No edge split.
    let plain = generate_sbm(&SbmOptions {
        num_vertices: 300,
        num_edges: 2000,
        ..SbmOptions::default()
    })
    .expect("sbm");
    let e = Trainer::new(plain, cfg(&[])).err().expect("refused");
    let msg = e.to_string();
    assert!(
        msg.contains("model.task") && msg.contains("edge split"),
        "{msg}"
    );
    assert!(!msg.contains('\n'));
    // More negatives than vertices.
    let e = Trainer::new(sbm(), cfg(&["link.negatives=5000"]))
        .err()
        .expect("refused");
    assert!(e.to_string().contains("link.negatives"), "{e}");
    // Keys checked by the config.
    for (set, key) in [
        ("link.metrics=[\"mrr\", \"hits@0\"]", "link.metrics"),
        ("link.metrics=[]", "link.metrics"),
        ("link.negatives=0", "link.negatives"),
        ("link.decoder=\"bilinear\"", "link.decoder"),
        ("link.exclude=\"both\"", "link.exclude"),
    ] {
        let sets = vec![set.to_string()];
        let msg = match TrainConfig::from_toml_with_overrides("", Path::new("t"), &sets)
            .and_then(|c| c.validate().map(|()| c))
        {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{set} accepted"),
        };
        assert!(msg.contains(key), "{set}: {msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }
    assert!(matches!(
        Trainer::new(sbm(), cfg(&["link.negatives=5000"])),
        Err(Error::Config { .. })
    ));
}

#[test]
fn the_built_in_dataset_splits_its_edges_for_a_link_task() {
    let c = cfg(&[
        "data.synthetic.vertices=1000",
        "data.synthetic.edges=5000",
        "train.epochs=1",
    ]);
    let ds = load_dataset(&c).expect("dataset");
    let split = ds
        .edges
        .as_ref()
        .expect("a link task's synthetic graph has a split");
    assert!(!split.val.is_empty() && !split.test.is_empty());
    Trainer::new(ds, c).expect("trainer").fit().expect("trains");
}

#[test]
fn a_link_model_exports_its_encoder_with_its_decoder_and_writes_embeddings() {
    use runtime::onnx::{ExportOptions, OnnxOutput, OnnxSignature};
    let ds = Arc::new(sbm());
    let mut t = Trainer::new(
        Arc::clone(&ds),
        cfg(&["link.decoder=\"mlp\"", "train.epochs=1"]),
    )
    .expect("trainer");
    t.fit().expect("fit");
    let dir = tempfile::tempdir().expect("tempdir");
    let scores = dir.path().join("scores.onnx");
    t.export_onnx(
        &scores,
        &ExportOptions {
            output: OnnxOutput::Scores,
            ..ExportOptions::default()
        },
    )
    .expect("export scores");
    let sig = OnnxSignature::of(&std::fs::read(&scores).expect("read")).expect("signature");
    assert_eq!(
        (sig.output, sig.num_blocks, sig.in_dim),
        (OnnxOutput::Scores, 2, 16)
    );
    let logits = t.export_onnx(&dir.path().join("l.onnx"), &ExportOptions::default());
    assert!(logits.is_err(), "a link model has no class logits");
    // Every vertex's embedding: the encoder's output, `model.hidden` wide.
    let out = dir.path().join("emb.npy");
    let r = t
        .infer_to_file(runtime::InferOutput::Embeddings, &out)
        .expect("infer");
    assert_eq!((r.rows, r.width), (2000, 32));
    assert_eq!(t.embeddings(&[0, 1]).expect("embeddings").dim(), (2, 32));
    // The streamed rows give the scores score_edges returns.
    let [val, test] = t.evaluate_link().expect("evaluate");
    assert_eq!((val.len(), test.len()), (3, 3));
}
