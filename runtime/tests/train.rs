//! Training learns, is reproducible, and reports bad configs by key.

use std::path::Path;

use runtime::config::TrainConfig;
use runtime::{load_dataset, test_at_best_val, Trainer};

fn small(kind: &str, extra: &[&str]) -> TrainConfig {
    let mut sets: Vec<String> = vec![
        format!("model.kind=\"{kind}\""),
        "model.hidden=32".into(),
        "model.heads=2".into(),
        "train.epochs=4".into(),
        "train.batch_size=256".into(),
        "train.lr=0.01".into(),
        "data.synthetic.vertices=4000".into(),
        "data.synthetic.edges=30000".into(),
        "data.synthetic.classes=4".into(),
        "data.synthetic.dim=16".into(),
        "data.synthetic.homophily=0.9".into(),
        "data.synthetic.signal=0.4".into(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    TrainConfig::from_toml_with_overrides("", Path::new("test"), &sets).expect("config")
}

fn run(cfg: TrainConfig) -> Vec<runtime::EpochStats> {
    let ds = load_dataset(&cfg).expect("dataset");
    let mut t = Trainer::new(ds, cfg).expect("trainer");
    t.fit().expect("fit")
}

#[test]
fn every_model_kind_learns_the_synthetic_graph() {
    for kind in ["sage", "gcn", "gat"] {
        let stats = run(small(kind, &[]));
        let (_, acc) = test_at_best_val(&stats).expect("evaluated");
        assert!(
            stats.last().expect("epochs").loss < stats[0].loss,
            "{kind}: loss did not fall: {stats:?}"
        );
        // 4 classes: chance is 0.25.
        assert!(acc > 0.6, "{kind}: test accuracy {acc}");
    }
}

#[test]
fn same_seed_same_run_on_one_and_two_threads() {
    // The trainer runs on its own pool of `threads.compute` workers.
    let a = run(small("sage", &["train.epochs=2", "threads.compute=1"]));
    let b = run(small("sage", &["train.epochs=2", "threads.compute=2"]));
    let strip = |v: &[runtime::EpochStats]| {
        v.iter()
            .map(|s| (s.loss, s.train_acc, s.val_acc, s.test_acc))
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&a), strip(&b));
    let c = run(small("sage", &["train.epochs=2", "train.seed=5"]));
    assert_ne!(strip(&a), strip(&c));
}

#[test]
fn three_layers_with_sampled_eval() {
    let stats = run(small(
        "sage",
        &[
            "model.layers=3",
            "train.fanouts=[5,5,5]",
            "train.eval_fanouts=[10,10,10]",
        ],
    ));
    assert!(test_at_best_val(&stats).expect("evaluated").1 > 0.5);
}

#[test]
fn full_graph_and_sampled_all_neighbor_eval_agree_for_sage() {
    // SAGE-mean with every neighbor is exact in both modes, so the accuracies match.
    let cfg = small("sage", &["train.epochs=2"]);
    let ds = load_dataset(&cfg).expect("dataset");
    let mut t = Trainer::new(ds, cfg).expect("trainer");
    t.fit().expect("fit");
    let (val_full, test_full) = t.evaluate_val_test().expect("full");
    let ids = t.dataset().val_ids();
    let val_sampled = t.evaluate(&ids).expect("sampled");
    assert!(
        (val_full - val_sampled).abs() < 1e-3,
        "{val_full} vs {val_sampled}"
    );
    assert!(test_full > 0.5);
}

#[test]
fn sparse_and_dense_features_train_the_same() {
    // The synthetic features are dense; forcing the sparse path must give the same
    // run up to float rounding (same batches, same math, other summation order).
    let a = run(small(
        "gcn",
        &["train.epochs=2", "train.sparse_features=off"],
    ));
    let b = run(small(
        "gcn",
        &["train.epochs=2", "train.sparse_features=on"],
    ));
    for (x, y) in a.iter().zip(&b) {
        assert!(
            (x.loss - y.loss).abs() < 1e-3 * x.loss.abs().max(1.0),
            "{x:?} {y:?}"
        );
        let (va, vb) = (x.val_acc.expect("val"), y.val_acc.expect("val"));
        assert!((va - vb).abs() < 0.01, "{va} vs {vb}");
    }
}

/// `model.precision = "tf32"` on a device engine (here the host backend, which
/// rounds matrix-product inputs as tensor cores do) trains every model kind
/// to the fp32 accuracy within a point, on different weights.
#[test]
fn tf32_products_train_to_the_fp32_accuracy() {
    for kind in ["sage", "gcn", "gat"] {
        let fp32_cfg = small(kind, &["device.kind=\"host\""]);
        let tf32_cfg = small(kind, &["device.kind=\"host\"", "model.precision=\"tf32\""]);
        let ds = load_dataset(&fp32_cfg).expect("dataset");
        let mut a = Trainer::new(ds.clone(), fp32_cfg).expect("trainer");
        let mut b = Trainer::new(ds, tf32_cfg).expect("trainer");
        assert!(b.device_note().contains("tf32"), "{}", b.device_note());
        let (sa, sb) = (a.fit().expect("fit"), b.fit().expect("fit"));
        let (_, acc_a) = test_at_best_val(&sa).expect("evaluated");
        let (_, acc_b) = test_at_best_val(&sb).expect("evaluated");
        eprintln!("{kind}: test accuracy fp32 {acc_a:.4}, tf32 {acc_b:.4}");
        assert!(
            (acc_a - acc_b).abs() <= 0.01,
            "{kind}: fp32 {acc_a} vs tf32 {acc_b}"
        );
        assert_ne!(
            a.params().unwrap()[0],
            b.params().unwrap()[0],
            "{kind}: tf32 changed nothing"
        );
    }
}

/// `ds` with every feature rounded to bfloat16 (checked to change some).
fn rounded_to_bf16(ds: &runtime::data::Dataset) -> runtime::data::Dataset {
    let mut rounded = ds.clone();
    let x = gpu_ops::to_bf16_bits(ds.features.as_slice());
    let x: Vec<f32> = x.into_iter().map(gpu_ops::bf16_bits_to_f32).collect();
    assert_ne!(
        &x[..],
        ds.features.as_slice(),
        "the rounding changes the features"
    );
    rounded.features =
        cpu_ops::FeatureMatrix::new(x.into(), ds.num_vertices(), ds.features.dim()).unwrap();
    rounded
}

/// `device.feature_dtype = "bf16"` on a device engine (the host backend, which
/// stores bfloat16 rows as a GPU does): training equals, bit for bit, fp32
/// training on the features rounded to bfloat16 beforehand (the gather widens
/// exactly, in the cache and from host rows alike), and reaches the fp32
/// accuracy within a point for every model kind.
#[test]
fn bf16_feature_rows_train_to_the_fp32_accuracy() {
    for kind in ["sage", "gcn", "gat"] {
        let ops = [
            "device.kind=\"host\"",
            "device.cache_bytes=20000",
            "orchestration.policy=\"gpu-sample-gpu-gather\"",
        ];
        let f32_cfg = small(kind, &ops);
        let bf16_cfg = small(
            kind,
            &[ops[0], ops[1], ops[2], "device.feature_dtype=\"bf16\""],
        );
        let ds = load_dataset(&f32_cfg).expect("dataset");
        let rounded = rounded_to_bf16(&ds);
        let mut a = Trainer::new(ds.clone(), f32_cfg.clone()).expect("trainer");
        let mut b = Trainer::new(ds, bf16_cfg).expect("trainer");
        let mut c = Trainer::new(rounded, f32_cfg).expect("trainer");
        assert!(b.device_note().contains("bf16"), "{}", b.device_note());
        let (sa, sb, sc) = (
            a.fit().expect("fit"),
            b.fit().expect("fit"),
            c.fit().expect("fit"),
        );
        assert_eq!(
            b.params().unwrap(),
            c.params().unwrap(),
            "{kind}: bf16 rows vs rounded features"
        );
        assert_eq!(
            sb.iter().map(|s| s.loss).collect::<Vec<_>>(),
            sc.iter().map(|s| s.loss).collect::<Vec<_>>()
        );
        let (_, acc_a) = test_at_best_val(&sa).expect("evaluated");
        let (_, acc_b) = test_at_best_val(&sb).expect("evaluated");
        eprintln!("{kind}: test accuracy f32 rows {acc_a:.4}, bf16 rows {acc_b:.4}");
        assert!(
            (acc_a - acc_b).abs() <= 0.01,
            "{kind}: f32 {acc_a} vs bf16 {acc_b}"
        );
        assert_ne!(
            a.params().unwrap()[0],
            b.params().unwrap()[0],
            "{kind}: bf16 changed nothing"
        );
    }
    // A host gather (here every step on the host) rounds the same way, so every
    // step-based placement trains on the same values.
    let host_steps = [
        "orchestration.policy=\"cpu-sample-cpu-gather\"",
        "train.epochs=1",
    ];
    let f32_cfg = small("sage", &host_steps);
    let ds = load_dataset(&f32_cfg).expect("dataset");
    let rounded = rounded_to_bf16(&ds);
    let bf16_cfg = small(
        "sage",
        &[
            host_steps[0],
            host_steps[1],
            "device.feature_dtype=\"bf16\"",
        ],
    );
    let mut b = Trainer::new(ds, bf16_cfg).expect("trainer");
    let mut c = Trainer::new(rounded, f32_cfg).expect("trainer");
    b.fit().expect("fit");
    c.fit().expect("fit");
    assert_eq!(b.params().unwrap(), c.params().unwrap(), "host gather");
    // The host-gathered rows travel as bfloat16: half their bytes (blocks and
    // labels are the same in both runs).
    let (hb, hc) = (b.h2d_bytes(), c.h2d_bytes());
    let rows_f32 = (hc - hb) * 2;
    eprintln!("host gather: {hc} bytes uploaded with f32 rows, {hb} with bf16 rows");
    assert!(hb < hc && rows_f32 > hc / 2, "{hb} vs {hc}");
}

#[test]
fn device_engine_reports_cache_hits_and_resumes_from_a_checkpoint() {
    let cfg = small(
        "sage",
        &[
            "device.cache_bytes=32000",
            "train.epochs=2",
            "train.eval_mode=\"sampled\"",
        ],
    );
    let ds = load_dataset(&cfg).expect("dataset");
    let mut straight = Trainer::new(ds.clone(), cfg.clone()).expect("trainer");
    assert!(
        straight.device_note().contains("host backend"),
        "{}",
        straight.device_note()
    );
    let full = straight.fit().expect("fit");
    let stats = straight.cache_stats();
    assert!(stats.hits > 0 && stats.misses > 0, "{stats:?}");
    assert!(stats.cached_bytes <= 32000, "{stats:?}");

    let d = tempfile::tempdir().expect("tempdir");
    let ck = d.path().join("c.tck");
    let mut first = Trainer::new(ds.clone(), cfg.clone()).expect("trainer");
    first.train_epoch().expect("epoch 0");
    first.save_checkpoint(&ck).expect("save");
    let mut resumed = Trainer::new(ds, cfg).expect("trainer");
    resumed.load_checkpoint(&ck).expect("load");
    let rest = resumed.fit().expect("fit");
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].loss, full[1].loss, "resumed epoch 1 differs");
    assert_eq!(resumed.params().unwrap(), straight.params().unwrap());
}

/// The rows a device gather reads from host memory (cache misses) are counted
/// in the host → device bytes after the step (the device counts reach
/// `cache_stats` at the step's synchronization): with no cache, every input
/// row; with every row cached, none — the same batches otherwise.
#[test]
fn device_gather_misses_are_counted_as_host_to_device_bytes() {
    let run = |cache: &str| {
        let cfg = small(
            "sage",
            &[
                "orchestration.policy=\"gpu-sample-gpu-gather\"",
                &format!("device.cache_bytes={cache}"),
                // Two of three epochs: no evaluation, whose gathers count too.
                "train.epochs=3",
                "train.eval_every=0",
            ],
        );
        let ds = load_dataset(&cfg).expect("dataset");
        let mut t = Trainer::new(ds, cfg).expect("trainer");
        t.train_epoch().expect("epoch 0");
        t.train_epoch().expect("epoch 1");
        let s = t.cache_stats();
        (t.h2d_bytes(), s, t.params().unwrap())
    };
    let (h_none, s_none, p_none) = run("0");
    let (h_all, s_all, p_all) = run("1000000000");
    assert_eq!(p_none, p_all, "the cache changed what was trained");
    assert!(s_none.hits == 0 && s_none.misses > 0, "{s_none:?}");
    assert!(
        s_all.misses == 0 && s_all.hits == s_none.misses,
        "{s_all:?}"
    );
    let row_bytes = 16 * 4;
    assert_eq!(h_none - h_all, s_none.misses * row_bytes);
}

/// `device.sample_ahead` samples each batch while the one before it trains
/// (`engine/step_based.rs`): it changes when blocks are sampled, never which.
/// Under every placement, the epochs' losses, the weights and the host →
/// device bytes equal those of a run without it, and every batch but each
/// epoch's first trained on blocks sampled ahead.
#[test]
fn sampling_ahead_trains_on_the_same_blocks() {
    let run = |placement: &str, ahead: bool| {
        let cfg = small(
            "sage",
            &[
                &format!("orchestration.policy=\"{placement}\""),
                &format!("device.sample_ahead={ahead}"),
                "device.cache_bytes=20000",
                "train.epochs=2",
                "train.eval_every=0",
            ],
        );
        let ds = load_dataset(&cfg).expect("dataset");
        let mut t = Trainer::new(ds, cfg).expect("trainer");
        let stats = [
            t.train_epoch().expect("epoch 0"),
            t.train_epoch().expect("epoch 1"),
        ];
        let losses: Vec<f64> = stats.iter().map(|s| s.loss).collect();
        let batches: usize = stats.iter().map(|s| s.batches).sum();
        let ahead = t.batches_sampled_ahead();
        (losses, t.params().unwrap(), t.h2d_bytes(), batches, ahead)
    };
    for placement in [
        "gpu-sample-gpu-gather",
        "gpu-sample-cpu-gather",
        "cpu-sample-gpu-gather",
        "cpu-sample-cpu-gather",
    ] {
        let (l0, p0, h0, b0, a0) = run(placement, false);
        let (l1, p1, h1, b1, a1) = run(placement, true);
        assert_eq!(l0, l1, "{placement}: losses");
        assert!(p0 == p1, "{placement}: sampling ahead changed the weights");
        assert_eq!(h0, h1, "{placement}: host → device bytes");
        assert_eq!(a0, 0, "{placement}: sampled ahead while off");
        assert!(b1 > 4, "{placement}: {b1} batches");
        assert_eq!(a1, (b1 - 2) as u64, "{placement}: batches sampled ahead");
        assert_eq!(b0, b1);
    }
    // The layer pipeline samples ahead itself: the option (on by default) is
    // ignored there, without a note.
    let cfg = small(
        "sage",
        &[
            "device.sample_ahead=true",
            "train.epochs=1",
            "orchestration.policy=\"layer\"",
            "orchestration.hot_ratio=0.1",
        ],
    );
    let mut t = Trainer::new(load_dataset(&cfg).expect("dataset"), cfg).expect("trainer");
    let note = t.device_note().to_string();
    assert!(!note.contains("sample_ahead"), "{note}");
    t.fit().expect("fit");
    assert_eq!(t.batches_sampled_ahead(), 0);
}

/// `device.topology` and `device.cache_bytes` set to `"auto"` on the host
/// backend (no separate device memory, `placement/budget.rs`) are the device
/// topology and every row cached: the same run, bit for bit, as those set by
/// hand, whatever memory the machine has free.
#[test]
fn auto_placement_on_the_host_is_the_device_topology_with_every_row_cached() {
    let ops = [
        "device.kind=\"host\"",
        "orchestration.policy=\"gpu-sample-gpu-gather\"",
    ];
    let auto_cfg = small(
        "sage",
        &[
            ops[0],
            ops[1],
            "device.topology=\"auto\"",
            "device.cache_bytes=auto",
        ],
    );
    let hand_cfg = small(
        "sage",
        &[
            ops[0],
            ops[1],
            "device.topology=\"device\"",
            "device.cache_bytes=1000000000",
        ],
    );
    let ds = load_dataset(&auto_cfg).expect("dataset");
    let mut a = Trainer::new(ds.clone(), auto_cfg).expect("trainer");
    let mut b = Trainer::new(ds, hand_cfg).expect("trainer");
    let (sa, sb) = (a.fit().expect("fit"), b.fit().expect("fit"));
    assert_eq!(a.params().unwrap(), b.params().unwrap());
    assert_eq!(
        sa.iter().map(|s| s.loss).collect::<Vec<_>>(),
        sb.iter().map(|s| s.loss).collect::<Vec<_>>()
    );
    assert_eq!(a.device_note(), b.device_note());
}
