//! No silent NaN: a non-finite feature is refused where data enters (a `.npy`
//! file, an in-memory dataset, a stored one verified in full), and a non-finite
//! loss stops training with an error naming the epoch and the batch — the
//! weights as before that batch, checkpointed — or, with
//! `train.on_nonfinite = "skip-batch"`, is skipped and counted.

use std::path::Path;
use std::sync::Arc;

use cpu_ops::FeatureMatrix;
use runtime::config::TrainConfig;
use runtime::data::{open_dataset, write_dataset, Dataset, Verify};
use runtime::Checkpoint;
use runtime::{load_dataset, Trainer};
use runtime::{Error, TrainerBuilder};

fn cfg(extra: &[&str]) -> TrainConfig {
    let mut sets: Vec<String> = vec![
        "model.kind=\"sage\"".into(),
        "model.hidden=16".into(),
        "train.epochs=2".into(),
        "train.batch_size=100".into(),
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

/// The vertex of the largest degree (it appears in nearly every batch).
fn busy_vertex(ds: &Dataset) -> usize {
    (0..ds.num_vertices())
        .max_by_key(|&v| ds.graph.degree(v as u32))
        .expect("a vertex")
}

#[test]
fn a_nan_in_a_features_npy_file_is_an_error_naming_the_file_row_and_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.npy");
    let mut x = vec![0.5f32; 6 * 4];
    x[2 * 4 + 1] = f32::INFINITY;
    runtime::data::npy::write_f32_matrix(&path, &x, 6, 4).expect("write");
    let e = runtime::data::npy::read_f32_matrix(&path).expect_err("refused");
    let msg = e.to_string();
    assert!(msg.contains("x.npy"), "{msg}");
    assert!(msg.contains("row 2, column 1"), "{msg}");
    assert!(msg.contains("inf"), "{msg}");
}

#[test]
fn a_dataset_with_a_nan_feature_is_refused_by_the_builder_and_by_a_full_verify() {
    let c = cfg(&[]);
    let ds = poisoned(&c, 7);
    let e = TrainerBuilder::new(c.clone())
        .dataset(ds.clone())
        .build()
        .err()
        .expect("refused");
    assert!(
        matches!(&e, Error::Dataset { field, index, problem: runtime::DatasetProblem::NonFinite { value } }
            if field == "features" && index == &[7, 3] && value.is_nan()),
        "{e:?}"
    );
    // A stored dataset is not written with it...
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("g.tds");
    assert!(write_dataset(&p, &ds).is_err());
    assert!(!p.exists(), "no half-written output");
    // ... and one that holds it anyway (written by older code) is refused by a
    // full verify, naming the file.
    let good = load_dataset(&c).expect("dataset");
    write_dataset(&p, &good).expect("write");
    let mut bytes = std::fs::read(&p).expect("read");
    let want = good.features.as_slice()[7 * 8 + 3].to_le_bytes();
    let at = bytes
        .windows(4)
        .position(|w| w == want)
        .expect("the value is in the file");
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&p, &bytes).expect("write back");
    let e = open_dataset(&p, Verify::Full).expect_err("refused");
    assert!(e.to_string().contains("g.tds"), "{e}");
}

fn finite_params(t: &Trainer) -> bool {
    t.params()
        .unwrap()
        .iter()
        .all(|p| p.iter().all(|v| v.is_finite()))
}

fn nan_stops(extra: &[&str]) {
    let c = cfg(extra);
    let ds = poisoned(&c, 0);
    let v = busy_vertex(&ds);
    let ds = poisoned(&c, v);
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("last-good.tck");
    // Trainer::new does not scan the features (a stored dataset opened without
    // --verify): the NaN reaches training.
    let mut t = Trainer::new(ds, c).expect("trainer");
    let before: Vec<Vec<f32>> = t.params().unwrap();
    t.set_checkpoint_path(Some(ck.clone()));
    match t.fit() {
        Err(Error::NonFinite { epoch, batch, loss }) => {
            assert_eq!(epoch, 0, "{extra:?}");
            assert!(!loss.is_finite());
            assert_eq!(t.batch_in_epoch(), batch, "the position stays at the batch");
            assert!(finite_params(&t), "{extra:?}: the bad update was applied");
            if batch == 0 {
                let after: Vec<Vec<f32>> = t.params().unwrap();
                assert_eq!(before, after, "{extra:?}: weights moved");
            }
            let saved = Checkpoint::read(&ck).expect("checkpoint of the last good state");
            assert_eq!((saved.position.epoch, saved.position.batch), (0, batch));
            assert!(saved
                .tensors
                .iter()
                .all(|t| t.values.iter().all(|v| v.is_finite())));
        }
        other => panic!("{extra:?}: expected a non-finite stop, got {other:?}"),
    }
}

#[test]
fn a_nan_loss_stops_training_naming_epoch_and_batch_with_the_weights_before_it() {
    nan_stops(&[]);
    nan_stops(&["orchestration.policy=\"gpu-sample-gpu-gather\""]);
}

#[test]
fn skip_batch_trains_on_without_the_poisoned_batches() {
    for extra in [
        &[][..],
        &["orchestration.policy=\"gpu-sample-gpu-gather\""][..],
    ] {
        let mut sets = vec!["train.on_nonfinite=\"skip-batch\""];
        sets.extend_from_slice(extra);
        let c = cfg(&sets);
        let clean = load_dataset(&c).expect("dataset");
        let v = quiet_training_vertex(&clean);
        let ds = Arc::new(poisoned(&c, v));
        let mut t = Trainer::new((*ds).clone(), c).expect("trainer");
        let stats = t.fit().expect("fit trains on");
        for s in &stats {
            // The vertex is a seed once per epoch: that batch at least is skipped.
            assert!(s.skipped_batches >= 1, "{extra:?} epoch {}: {s:?}", s.epoch);
            assert!(
                s.skipped_batches < s.batches,
                "{extra:?}: everything skipped"
            );
            assert!(
                s.loss.is_finite(),
                "{extra:?}: a NaN reached the epoch's loss"
            );
        }
        assert!(finite_params(&t), "{extra:?}");
    }
}
