//! The library API a training service uses: builder, callbacks, cancellation,
//! checkpoints (bit-exact resume), embeddings, and independence of trainers.

use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use cpu_ops::AdamConfig;
use gpu_ops::prelude::*;
use gpu_ops::{DeviceModel, HostBackend};
use runtime::config::TrainConfig;
use runtime::load_dataset;
use runtime::ndarray::{s, Array2};
use runtime::Checkpoint;
use runtime::{
    on_batch, on_epoch, BatchMetrics, CancelToken, Control, EpochStats, Error, StopCause, Trainer,
    TrainerBuilder,
};

/// A small SAGE run: 2000 vertices, 1200 training vertices in 10 batches of 128.
fn toml(extra: &str) -> String {
    format!(
        r#"
[data.synthetic]
vertices = 2000
edges = 12000
classes = 4
dim = 12
homophily = 0.9
signal = 0.4
[model]
hidden = 16
heads = 2
[train]
epochs = 3
batch_size = 128
lr = 0.01
[threads]
compute = 2
{extra}
"#
    )
}

fn build(extra: &str) -> Trainer {
    TrainerBuilder::from_toml(&toml(extra))
        .expect("config")
        .build()
        .expect("trainer")
}

fn params(t: &Trainer) -> Vec<Vec<u32>> {
    t.params()
        .unwrap()
        .iter()
        .map(|p| p.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// An epoch's numbers as bits: loss, train/val/test accuracy, batches, steps.
type Numbers = (u64, u64, Option<u64>, Option<u64>, usize, u64);

/// Loss and accuracies as bits (timings differ between runs).
fn numbers(s: &[EpochStats]) -> Vec<Numbers> {
    s.iter()
        .map(|s| {
            (
                s.loss.to_bits(),
                s.train_acc.to_bits(),
                s.val_acc.map(f64::to_bits),
                s.test_acc.map(f64::to_bits),
                s.batches,
                s.steps,
            )
        })
        .collect()
}

/// Records every batch's metrics.
fn recorder() -> (
    Arc<Mutex<Vec<BatchMetrics>>>,
    impl runtime::Callback + 'static,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let cb = on_batch(move |m: &BatchMetrics| {
        s.lock().unwrap().push(m.clone());
        Control::Continue
    });
    (seen, cb)
}

#[test]
fn resume_after_epoch_k_is_bit_identical_to_an_uninterrupted_run() {
    let d = tempfile::tempdir().unwrap();
    for kind in ["sage", "gat"] {
        let cfg = |text: &str| {
            TrainConfig::from_toml_with_overrides(
                text,
                Path::new("t"),
                &[format!("model.kind=\"{kind}\"")],
            )
            .unwrap()
        };
        let mut whole = TrainerBuilder::new(cfg(&toml(""))).build().unwrap();
        let all = whole.fit().unwrap();
        assert_eq!(all.len(), 3);

        let ck = d.path().join(format!("{kind}.tck"));
        let mut first = TrainerBuilder::new(cfg(&toml(""))).build().unwrap();
        let e0 = first.train_epoch().unwrap();
        first.save_checkpoint(&ck).unwrap();
        drop(first);

        let mut resumed = TrainerBuilder::new(cfg(&toml(""))).build().unwrap();
        resumed.load_checkpoint(&ck).unwrap();
        assert_eq!((resumed.epoch(), resumed.steps()), (1, 10));
        let rest = resumed.fit().unwrap();
        assert_eq!(rest.len(), 2);
        let mut joined = vec![e0];
        joined.extend(rest);
        assert_eq!(numbers(&joined), numbers(&all), "{kind}");
        assert_eq!(params(&resumed), params(&whole), "{kind}");
        assert_eq!(resumed.steps(), whole.steps());
        // The Adam moments match too: the final checkpoints are equal but for timing.
        let (mut a, mut b) = (resumed.checkpoint().unwrap(), whole.checkpoint().unwrap());
        a.position.train_secs = 0.0;
        b.position.train_secs = 0.0;
        assert_eq!(a, b, "{kind}");
    }
}

#[test]
fn cancel_inside_an_epoch_then_checkpoint_and_continue_is_bit_identical() {
    let mut whole = build("");
    let all = whole.fit().unwrap();

    let token = CancelToken::new();
    let t2 = token.clone();
    // Cancel from the callback's thread after batch 3 of epoch 1 (as another
    // thread would); the trainer notices before batch 4.
    let mut t = TrainerBuilder::from_toml(&toml(""))
        .unwrap()
        .cancel_token(token.clone())
        .callback(on_batch(move |m: &BatchMetrics| {
            if m.epoch == 1 && m.batch == 3 {
                t2.cancel();
            }
            Control::Continue
        }))
        .build()
        .unwrap();
    let e0 = t.train_epoch().unwrap();
    match t.train_epoch() {
        Err(Error::Cancelled {
            epoch: 1,
            batch: 4,
            cause: StopCause::Token,
        }) => {}
        other => panic!("expected a cancel before batch 4 of epoch 1, got {other:?}"),
    }
    assert_eq!((t.epoch(), t.batch_in_epoch(), t.steps()), (1, 4, 14));
    // Still cancelled: nothing more is trained.
    assert!(matches!(
        t.train_epoch(),
        Err(Error::Cancelled { batch: 4, .. })
    ));
    assert_eq!(t.steps(), 14);

    // Save mid-epoch, load into a fresh trainer, finish: same as never stopping.
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("mid.tck");
    t.save_checkpoint(&ck).unwrap();
    let mut fresh = build("");
    fresh.load_checkpoint(&ck).unwrap();
    assert_eq!((fresh.epoch(), fresh.batch_in_epoch()), (1, 4));
    let rest = fresh.fit().unwrap();
    let mut joined = vec![e0.clone()];
    joined.extend(rest);
    assert_eq!(numbers(&joined), numbers(&all));
    assert_eq!(params(&fresh), params(&whole));

    // And the cancelled trainer itself continues with a fresh token.
    t.set_cancel_token(CancelToken::new());
    let rest = t.fit().unwrap();
    let mut joined = vec![e0];
    joined.extend(rest);
    assert_eq!(numbers(&joined), numbers(&all));
    assert_eq!(params(&t), params(&whole));
}

#[test]
fn a_cancel_from_another_thread_stops_within_one_batch() {
    let token = CancelToken::new();
    let (tx, rx) = mpsc::channel::<usize>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let mut t = TrainerBuilder::from_toml(&toml(""))
        .unwrap()
        .cancel_token(token.clone())
        .callback(on_batch(move |m: &BatchMetrics| {
            let _ = tx.send(m.epoch * m.batches + m.batch);
            // Wait until the other thread has cancelled after batch 2.
            if m.epoch == 0 && m.batch == 2 {
                let _ = go_rx.recv();
            }
            Control::Continue
        }))
        .build()
        .unwrap();
    let canceller = std::thread::spawn(move || {
        while let Ok(k) = rx.recv() {
            if k == 2 {
                token.cancel();
                let _ = go_tx.send(());
                return;
            }
        }
    });
    let e = t.fit().unwrap_err();
    canceller.join().unwrap();
    assert!(
        matches!(
            e,
            Error::Cancelled {
                epoch: 0,
                batch: 3,
                cause: StopCause::Token
            }
        ),
        "{e}"
    );
    assert_eq!(t.steps(), 3);
    assert!(e.to_string().contains("cancel"), "{e}");
}

#[test]
fn callbacks_see_every_batch_and_may_stop() {
    let (seen, rec) = recorder();
    let epochs = Arc::new(Mutex::new(Vec::new()));
    let ep = Arc::clone(&epochs);
    let mut t = TrainerBuilder::from_toml(&toml(""))
        .unwrap()
        .callback(rec)
        .callback(on_epoch(move |s: &EpochStats| {
            ep.lock().unwrap().push(s.clone());
            if s.epoch == 1 {
                Control::Stop
            } else {
                Control::Continue
            }
        }))
        .build()
        .unwrap();
    let stats = t.fit().unwrap();
    assert_eq!(stats.len(), 2, "stopped after epoch 1");
    assert!(t.stop_requested());
    assert_eq!(*epochs.lock().unwrap(), stats);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 20);
    for (i, m) in seen.iter().enumerate() {
        assert_eq!((m.epoch, m.batch, m.batches), (i / 10, i % 10, 10));
        assert_eq!(m.step, i as u64 + 1);
        let size = if i % 10 == 9 { 1200 - 9 * 128 } else { 128 };
        assert_eq!(m.batch_size, size);
        assert!(m.loss.is_finite() && (0.0..=1.0).contains(&m.accuracy) && m.seconds >= 0.0);
    }
    // The epoch's loss is the size-weighted mean of its batches'.
    let mean: f64 = seen[..10]
        .iter()
        .map(|m| m.loss * m.batch_size as f64)
        .sum::<f64>()
        / 1200.0;
    assert!((mean - stats[0].loss).abs() < 1e-12);

    // A per-batch stop ends fit early; the epoch is resumable.
    let mut t = TrainerBuilder::from_toml(&toml(""))
        .unwrap()
        .callback(on_batch(|m: &BatchMetrics| {
            if m.epoch == 0 && m.batch == 5 {
                Control::Stop
            } else {
                Control::Continue
            }
        }))
        .build()
        .unwrap();
    assert!(t.fit().unwrap().is_empty());
    assert_eq!((t.epoch(), t.batch_in_epoch(), t.steps()), (0, 6, 6));
    let mut whole = build("");
    let all = whole.fit().unwrap();
    let rest = t.fit().unwrap();
    assert_eq!(numbers(&rest), numbers(&all));
    assert_eq!(params(&t), params(&whole));
}

#[test]
fn trainers_move_between_threads_and_snapshots_are_shared() {
    fn send<T: Send>() {}
    fn share<T: Send + Sync>() {}
    send::<Trainer>();
    share::<runtime::Embeddings>();
    share::<CancelToken>();
    // Built on one thread, trained on another.
    let t = build("");
    let mut t = std::thread::spawn(move || {
        let mut t = t;
        t.train_epoch().unwrap();
        t
    })
    .join()
    .unwrap();
    assert_eq!(t.steps(), 10);
    let table = t.embedding_table().unwrap();
    let rows: Vec<Array2<f32>> = (0..2u32)
        .map(|v| {
            let table = table.clone();
            std::thread::spawn(move || table.gather(&[v]).unwrap())
                .join()
                .unwrap()
        })
        .collect();
    assert_eq!(rows[1].dim(), (1, 16));
    assert_eq!(rows[1].as_slice().unwrap(), table.row(1).unwrap());
}

#[test]
fn two_trainers_on_two_threads_match_one_alone() {
    let alone = {
        let mut t = build("");
        (numbers(&t.fit().unwrap()), params(&t))
    };
    let handles: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(|| {
                let mut t = build("");
                (numbers(&t.fit().unwrap()), params(&t))
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), alone);
    }
}

#[test]
fn embeddings_are_the_input_of_the_classifier() {
    for kind in ["sage", "gcn"] {
        let cfg = TrainConfig::from_toml_with_overrides(
            &toml(""),
            Path::new("t"),
            &[format!("model.kind=\"{kind}\""), "train.epochs=1".into()],
        )
        .unwrap();
        let mut t = TrainerBuilder::new(cfg).build().unwrap();
        t.fit().unwrap();
        let table = t.embedding_table().unwrap();
        assert_eq!(
            (table.num_vertices(), table.dim(), table.steps()),
            (2000, 16, 10)
        );
        // The classifier alone on the embeddings (full graph) gives the logits.
        let ds = t.dataset();
        let full_cfg = t
            .config()
            .model_config(ds.features.dim(), ds.num_classes as usize)
            .unwrap();
        let full = t.params().unwrap();
        let mut top_cfg = full_cfg.clone();
        top_cfg.num_layers = 1;
        top_cfg.in_dim = 16;
        // The top layer's tensors are the last ones.
        let top_len = gpu_ops::ModelLayout::new(&top_cfg).unwrap().params().len();
        let top_params: Vec<&[f32]> = full[full.len() - top_len..]
            .iter()
            .map(Vec::as_slice)
            .collect();
        let dev = HostBackend::new();
        let top =
            DeviceModel::from_params(&dev, &top_cfg, &top_params, AdamConfig::default()).unwrap();
        let g = &t.dataset().graph;
        let block = dev
            .block_from_host(2000, g.offsets().as_slice(), g.indices().as_slice())
            .unwrap();
        let x = dev.to_device(table.as_slice()).unwrap();
        let fwd = top.forward(&dev, &[block], &x, false, 0).unwrap();
        let logits = dev.to_host(fwd.logits(), 2000 * 4).unwrap();
        let full = t.full_graph_logits().unwrap();
        assert_eq!(full.dim(), (2000, 4), "{kind}");
        assert_eq!(full.as_slice().unwrap(), &logits[..], "{kind}");
        // Rows by id, in request order; bad ids name their position.
        let some = t.embeddings(&[7, 0, 7]).unwrap();
        assert_eq!(some.dim(), (3, 16));
        assert_eq!(some.row(0).as_slice().unwrap(), table.row(7).unwrap());
        assert_eq!(some.row(1).as_slice().unwrap(), table.row(0).unwrap());
        assert_eq!(some.row(2), some.row(0));
        assert_eq!(table.view().dim(), (2000, 16));
        assert_eq!(table.view().slice(s![7, ..]), some.row(0));
        assert_eq!(table.to_array(), table.view());
        let e = t.embeddings(&[1, 2000]).unwrap_err().to_string();
        assert!(e.contains("2000 at position 1"), "{e}");
        // Predictions: the rows of the full-graph logits, ids checked the same way.
        let p = t.predict(&[7, 0, 1999]).unwrap();
        assert_eq!(p.dim(), (3, 4));
        for (i, v) in [7, 0, 1999].into_iter().enumerate() {
            assert_eq!(p.row(i), full.row(v), "{kind}");
        }
        assert_eq!(t.predict(&[]).unwrap().dim(), (0, 4));
        let e = t.predict(&[2000]).unwrap_err().to_string();
        assert!(e.contains("2000 at position 0"), "{e}");
        // Training invalidates the snapshots; the old one is unchanged.
        t.train_epoch().unwrap();
        let newer = t.embedding_table().unwrap();
        assert_eq!(newer.steps(), 20);
        assert_ne!(newer.as_slice(), table.as_slice());
        let fresh = t.full_graph_logits().unwrap();
        assert_ne!(fresh, full);
        assert_eq!(t.predict(&[7]).unwrap().row(0), fresh.row(7), "{kind}");
    }
    // One layer: the "layer below the classifier" is the input.
    let one = TrainConfig::from_toml_with_overrides(
        &toml(""),
        Path::new("t"),
        &["model.layers=1".into(), "train.fanouts=[5]".into()],
    )
    .unwrap();
    let mut t = TrainerBuilder::new(one).build().unwrap();
    let x = t.embeddings(&[3]).unwrap();
    assert_eq!(x.dim(), (1, 12));
    assert_eq!(x.as_slice().unwrap(), t.dataset().features.row(3));
}

#[test]
fn in_memory_dataset_and_bad_checkpoints() {
    let cfg = TrainConfig::from_toml(&toml(""), Path::new("t")).unwrap();
    let ds = load_dataset(&cfg).unwrap();
    let mut t = TrainerBuilder::new(cfg.clone())
        .dataset(ds.clone())
        .build()
        .unwrap();
    t.train_epoch().unwrap();
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("a.tck");
    t.save_checkpoint(&ck).unwrap();

    // Another model shape: error names the file and the key.
    let mut other = TrainerBuilder::new(
        TrainConfig::from_toml_with_overrides(
            &toml(""),
            Path::new("t"),
            &["model.hidden=8".into()],
        )
        .unwrap(),
    )
    .dataset(ds.clone())
    .build()
    .unwrap();
    let before = params(&other);
    let e = other.load_checkpoint(&ck).unwrap_err();
    assert!(
        matches!(&e, Error::CheckpointMismatch { path, field, .. }
            if path == &ck && field == "model.hidden"),
        "{e:?}"
    );
    assert_eq!(params(&other), before, "a failed load changes nothing");

    // Another dataset: error names what differs.
    let mut small = cfg.clone();
    small.data.synthetic.dim = 5;
    let mut other = TrainerBuilder::new(small).build().unwrap();
    let e = other.load_checkpoint(&ck).unwrap_err();
    assert!(
        matches!(&e, Error::CheckpointMismatch { field, .. } if field == "dataset feature dim"),
        "{e:?}"
    );

    // Damaged and missing files.
    let mut bytes = std::fs::read(&ck).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    let bad = d.path().join("bad.tck");
    std::fs::write(&bad, &bytes).unwrap();
    let e = t.load_checkpoint(&bad).unwrap_err();
    assert!(
        matches!(&e, Error::CheckpointCorrupt { path, .. } if path == &bad),
        "{e:?}"
    );
    assert!(e.to_string().contains("checksum"), "{e}");
    let e = t
        .load_checkpoint(&d.path().join("missing.tck"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.tck"), "{e}");
    // The checkpoint holds the configuration it was trained with.
    let c = Checkpoint::read(&ck).unwrap();
    assert_eq!(c.config(&ck).unwrap(), cfg);
    assert_eq!(c.position.epoch, 1);

    // A dataset that fails validation is refused at build.
    let mut broken = ds;
    broken.num_classes = 0;
    let e = TrainerBuilder::new(cfg).dataset(broken).build();
    assert!(matches!(e, Err(Error::Dataset { ref field, .. }) if field == "num_classes"));
}

#[test]
fn builder_sources_and_errors() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("run.toml");
    std::fs::write(&f, toml("")).unwrap();
    let b = TrainerBuilder::from_file(&f).unwrap();
    assert_eq!(b.config().model.hidden, 16);
    std::fs::write(&f, "[train]\nbatch = 3\n").unwrap();
    let e = TrainerBuilder::from_file(&f).err().unwrap().to_string();
    assert!(e.contains("run.toml") && e.contains("batch"), "{e}");
    let e = TrainerBuilder::from_toml("[model]\nlayers = 0\n")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("model.layers") && e.contains("1..=16"), "{e}");
    // A config value built in code is validated at build.
    let mut cfg = TrainConfig::default();
    cfg.train.lr = -1.0;
    let e = TrainerBuilder::new(cfg).build().err().unwrap().to_string();
    assert!(e.contains("train.lr"), "{e}");
    let e = TrainerBuilder::from_file(&d.path().join("nope.toml"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("nope.toml"), "{e}");
}

#[cfg(not(feature = "hwloc"))]
#[test]
fn pinning_needs_the_hwloc_feature() {
    let e = TrainerBuilder::from_toml(&toml("pin = \"cores\"\n"))
        .unwrap()
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("threads.pin") && e.contains("hwloc"), "{e}");
}

#[cfg(feature = "hwloc")]
#[test]
fn pinned_trainer_trains_exactly_like_an_unpinned_one() {
    let mut pinned = build("pin = \"cores\"\n");
    let mut free = build("");
    assert_eq!(
        numbers(&pinned.fit().unwrap()),
        numbers(&free.fit().unwrap())
    );
    assert_eq!(params(&pinned), params(&free));
}

#[test]
fn fit_writes_its_checkpoints_where_the_builder_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("run.tck");
    let mut t = TrainerBuilder::from_toml(
        &toml("").replace("[train]\n", "[train]\ncheckpoint_every = 1\n"),
    )
    .expect("config")
    .checkpoint_to(&path)
    .build()
    .expect("trainer");
    assert_eq!(t.checkpoint_path(), Some(path.as_path()));
    t.fit().expect("fit");
    // The last one is written at the end: it resumes at the last epoch.
    let c = Checkpoint::read(&path).expect("checkpoint");
    assert_eq!(c.position.epoch, 3);
    assert_eq!(c.steps, t.steps());
}
