//! Layer-based orchestration on the host backend: the staleness bound holds, both
//! late policies work, reuse keeps accuracy.
//! (A failing CPU worker: `runtime/src/session/tests.rs`.)

use std::path::Path;
use std::time::Instant;

use runtime::config::TrainConfig;
use runtime::{load_dataset, test_at_best_val, EpochStats, Trainer};

fn cfg(extra: &[&str]) -> TrainConfig {
    let mut sets: Vec<String> = vec![
        "model.kind=\"sage\"".into(),
        "model.hidden=32".into(),
        "train.epochs=4".into(),
        "train.batch_size=128".into(),
        "train.lr=0.01".into(),
        "data.synthetic.vertices=4000".into(),
        "data.synthetic.edges=30000".into(),
        "data.synthetic.classes=4".into(),
        "data.synthetic.dim=16".into(),
        "data.synthetic.homophily=0.9".into(),
        "data.synthetic.signal=0.4".into(),
        "device.kind=\"host\"".into(),
        "orchestration.policy=\"layer\"".into(),
        "device.cache_bytes=32000".into(),
        "threads.compute=1".into(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    TrainConfig::from_toml_with_overrides("", Path::new("test"), &sets).expect("config")
}

/// What a CPU worker gets done while the accelerator thread trains is timing:
/// with `on_late = "compute"` nothing waits for it, and on two cores a test
/// training beside another (the WordNet one above all) starves the worker until
/// nothing is reused (`observed_gap_never_exceeds_the_bound` failed so, before
/// and after the pipeline drove `scheduler::Protocol`). The tests run one at a
/// time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn trainer(c: TrainConfig) -> Trainer {
    let ds = load_dataset(&c).expect("dataset");
    Trainer::new(ds, c).expect("trainer")
}

fn run(c: TrainConfig) -> (Vec<EpochStats>, Trainer) {
    let mut t = trainer(c);
    let s = t.fit().expect("fit");
    (s, t)
}

/// The trained weights and each epoch's loss, as bits.
fn bits(t: &Trainer, s: &[EpochStats]) -> (Vec<Vec<u32>>, Vec<u64>) {
    let params = t
        .params()
        .expect("params")
        .iter()
        .map(|p| p.iter().map(|x| x.to_bits()).collect())
        .collect();
    (params, s.iter().map(|e| e.loss.to_bits()).collect())
}

fn stats(t: &Trainer) -> runtime::OrchestrationStats {
    t.orchestration_totals().expect("orchestration ran").clone()
}

#[test]
fn observed_gap_never_exceeds_the_bound() {
    let _serial = serial();
    for on_late in ["wait", "compute"] {
        for bound in [0u64, 1, 3, 7] {
            let b = format!("orchestration.staleness_bound={bound}");
            let l = format!("orchestration.on_late=\"{on_late}\"");
            let (s, t) = run(cfg(&[
                "orchestration.hot_ratio=0.2",
                "orchestration.super_batch=4",
                "train.epochs=3",
                &b,
                &l,
            ]));
            let o = stats(&t);
            let what = format!("on_late {on_late}, bound {bound}: {}", o.summary());
            // Rows of queue j + 1 are computed while super-batch j trains, so with
            // "compute" (never wait) only a bound of at least the on-time gap
            // (2 super-batches − 1 = 7 here) leaves rows to reuse.
            let reuse_expected = match on_late {
                "wait" => bound > 0,
                _ => bound >= 7,
            };
            assert!(o.protocol.hot_uses > 0 || !reuse_expected, "{what}");
            assert!(o.protocol.gaps.max().unwrap_or(0) <= bound, "{what}");
            assert_eq!(o.protocol.gaps.total(), o.protocol.hot_uses, "{what}");
            // Every epoch reports its own numbers.
            assert!(s.iter().all(|e| e.orchestration.is_some()), "{what}");
            match on_late {
                "wait" => assert_eq!(o.protocol.computed_cold, 0, "{what}"),
                _ => assert_eq!(
                    (o.protocol.waited, o.protocol.urgent_jobs),
                    (0, 0),
                    "{what}"
                ),
            }
            if bound == 0 && on_late == "compute" {
                // Regular chunks mostly run a step or more behind: most hot rows
                // are computed cold (how many exactly depends on timing).
                assert!(o.protocol.computed_cold > o.protocol.hot_uses, "{what}");
            }
        }
    }
}

fn best_test(s: &[EpochStats]) -> f64 {
    test_at_best_val(s).expect("evaluated").1
}

#[test]
fn bound_zero_computing_cold_matches_no_reuse() {
    let _serial = serial();
    let plain = best_test(&run(cfg(&["train.epochs=3"])).0);
    let (s, t) = run(cfg(&[
        "train.epochs=3",
        "orchestration.hot_ratio=0.2",
        "orchestration.staleness_bound=0",
        "orchestration.on_late=\"compute\"",
    ]));
    let cold = best_test(&s);
    assert!(stats(&t).protocol.computed_cold > 0);
    assert!(
        (plain - cold).abs() <= 0.01,
        "no reuse {plain} vs bound 0 {cold}"
    );
}

#[test]
fn reuse_within_two_super_batches_keeps_accuracy() {
    let _serial = serial();
    let plain = best_test(&run(cfg(&["train.epochs=4"])).0);
    for on_late in ["wait", "compute"] {
        let l = format!("orchestration.on_late=\"{on_late}\"");
        let (s, t) = run(cfg(&[
            "train.epochs=4",
            "orchestration.hot_ratio=0.2",
            "orchestration.super_batch=4",
            "orchestration.staleness_bound=8",
            &l,
        ]));
        let reuse = best_test(&s);
        let o = stats(&t);
        // Every hot position is reused or (late, `compute`) computed cold;
        // which of the two depends on how fast the CPU workers run beside the
        // accelerator thread, so only `wait` pins the reuse count.
        let hot_positions = o.protocol.hot_uses + o.protocol.computed_cold;
        assert!(hot_positions > 1000, "{}", o.summary());
        if on_late == "wait" {
            assert_eq!(o.protocol.computed_cold, 0, "{}", o.summary());
        }
        assert!(
            (plain - reuse).abs() <= 0.01,
            "{on_late}: no reuse {plain} vs hot_ratio 0.2 {reuse} ({})",
            o.summary()
        );
    }
}

/// bfloat16 feature rows on the layer path: the CPU's hot rows read the
/// bfloat16 host copy and are uploaded as bfloat16 (widened on the device); accuracy stays within 1 point of fp32 rows with the same reuse.
#[test]
fn bf16_rows_with_hot_rows_uploaded_as_bf16_keep_accuracy() {
    let _serial = serial();
    let reuse = [
        "train.epochs=4",
        "orchestration.hot_ratio=0.2",
        "orchestration.super_batch=4",
        "orchestration.staleness_bound=8",
        "orchestration.on_late=\"wait\"",
    ];
    let (s32, _) = run(cfg(&reuse));
    let mut bf16 = reuse.to_vec();
    bf16.push("device.feature_dtype=\"bf16\"");
    let (s16, t16) = run(cfg(&bf16));
    let o = stats(&t16);
    assert!(o.protocol.hot_uses > 1000, "{}", o.summary());
    let (a, b) = (best_test(&s32), best_test(&s16));
    assert!((a - b).abs() <= 0.01, "fp32 rows {a} vs bf16 rows {b}");
}

/// `hotness = "pcie"` (PCIe bytes saved per CPU µs, `scheduler::pcie_values`):
/// the hot set is another one than touch counts give, only of vertices that
/// save something, and training with it keeps accuracy.
#[test]
fn pcie_hotness_picks_its_own_hot_set_and_keeps_accuracy() {
    let _serial = serial();
    let reuse = [
        "train.epochs=4",
        "orchestration.hot_ratio=0.2",
        "orchestration.super_batch=4",
        "orchestration.staleness_bound=8",
    ];
    let hot_set = |t: &Trainer| {
        let r = t.relabeling().expect("layer relabeling");
        let mut ids: Vec<u32> = (0..r.hot_count()).map(|n| r.old_id(n)).collect();
        ids.sort_unstable();
        ids
    };
    let (s_touch, t_touch) = run(cfg(&reuse));
    let mut with_pcie = reuse.to_vec();
    with_pcie.push("orchestration.hotness=\"pcie\"");
    let (s_pcie, t_pcie) = run(cfg(&with_pcie));
    let (touch, pcie) = (hot_set(&t_touch), hot_set(&t_pcie));
    assert!(!pcie.is_empty() && pcie.len() <= 800, "{} hot", pcie.len());
    assert_ne!(touch, pcie, "pcie ranked as touch counts do");
    let o = stats(&t_pcie);
    assert!(o.protocol.hot_uses > 500, "{}", o.summary());
    let (a, b) = (best_test(&s_touch), best_test(&s_pcie));
    assert!((a - b).abs() <= 0.01, "presample {a} vs pcie {b}");
}

#[test]
fn trace_shows_hot_compute_train_gaps_and_flows() {
    let _serial = serial();
    let tracer = runtime::trace::Tracer::new();
    let mut t = trainer(cfg(&[
        "train.epochs=1",
        "orchestration.hot_ratio=0.2",
        "orchestration.staleness_bound=3",
    ]));
    t.set_tracer(tracer.clone());
    t.fit().expect("fit");
    let trace = tracer.collect();
    trace.validate().expect("valid trace");
    let hot = trace
        .slices
        .iter()
        .filter(|s| s.name == "hot compute")
        .count();
    assert!(hot > 0);
    assert!(trace
        .slices
        .iter()
        .filter(|s| s.name == "hot compute")
        .all(|s| s.args.super_batch.is_some()));
    let gaps: Vec<u64> = trace
        .slices
        .iter()
        .filter(|s| s.name == "train")
        .filter_map(|s| s.args.staleness_gap)
        .collect();
    assert!(!gaps.is_empty() && gaps.iter().all(|&g| g <= 3), "{gaps:?}");
    assert!(!trace.flows.is_empty());
}

/// WordNet 3.0 (`apt-get install wordnet-base`), SAGE: hot_ratio 0.2 with a bound of
/// two super-batches (`super_batch = 4`, bound 8) against no reuse, same seed and
/// epochs, within 1 point — with `hot_backward = "aggregate"`. (With the paper's
/// default, `"constant"`, the 20% hottest vertices include most training vertices
/// on WordNet, layer 0 gets too little gradient, and 5 epochs end about 11 points
/// lower; docs/orchestration.md §9.) About 20 s on two cores.
#[test]
fn wordnet_reuse_keeps_accuracy() {
    let _serial = serial();
    let dir = Path::new("/usr/share/wordnet");
    if !dir.join("data.noun").exists() {
        assert!(
            std::env::var("TANDEM_REQUIRE_WORDNET").as_deref() != Ok("1"),
            "TANDEM_REQUIRE_WORDNET=1 but /usr/share/wordnet/data.noun is missing"
        );
        eprintln!("skip: /usr/share/wordnet/data.noun missing (apt-get install wordnet-base)");
        return;
    }
    let ds = runtime::data::import_wordnet(&runtime::data::WordNetOptions::default())
        .expect("import wordnet");
    let run_wn = |extra: &[&str]| {
        let mut sets: Vec<String> = vec![
            // SAGE: GCN's block-local normalization (1/sqrt(d_out(j)) counts the
            // destinations of the block that sampled j) differs between the CPU's
            // hot chunks and the accelerator's batches, so GCN's hot rows are not
            // the rows the accelerator would compute (docs/orchestration.md §9).
            "model.kind=\"sage\"".into(),
            "model.hidden=64".into(),
            "train.epochs=5".into(),
            "train.batch_size=256".into(),
            "train.lr=0.01".into(),
            "device.kind=\"host\"".into(),
            "orchestration.policy=\"layer\"".into(),
        ];
        sets.extend(extra.iter().map(|s| s.to_string()));
        let c = TrainConfig::from_toml_with_overrides("", Path::new("wn"), &sets).expect("cfg");
        let start = Instant::now();
        let mut t = Trainer::new(ds.clone(), c).expect("trainer");
        let s = t.fit().expect("fit");
        let secs = start.elapsed().as_secs_f64();
        let o = t.orchestration_totals().map(|o| o.summary());
        (best_test(&s), secs, o)
    };
    let (plain, ps, _) = run_wn(&[]);
    let (reuse, rs, o) = run_wn(&[
        "orchestration.hot_ratio=0.2",
        "orchestration.super_batch=4",
        "orchestration.staleness_bound=8",
        "orchestration.hot_backward=\"aggregate\"",
    ]);
    eprintln!(
        "wordnet: no reuse {plain:.4} ({ps:.1} s); hot_ratio 0.2 {reuse:.4} ({rs:.1} s); {o:?}"
    );
    assert!(
        (plain - reuse).abs() <= 0.01,
        "no reuse {plain} vs reuse {reuse}"
    );
}

/// With all-neighbor bottom sampling, fresh rows (bound 0, wait) and no dropout,
/// the CPU's hot rows equal what the accelerator computes for the same vertices,
/// so the first batch's loss (taken before any update) is the no-reuse loss: the
/// rows land at the right positions for the right vertices.
#[test]
fn fresh_hot_rows_give_the_first_batch_the_no_reuse_loss() {
    let _serial = serial();
    use std::sync::{Arc, Mutex};
    let first_loss = |extra: &[&str]| {
        let mut sets = vec![
            "train.fanouts=[-1, 5]",
            "model.dropout=0.0",
            "train.epochs=1",
        ];
        sets.extend_from_slice(extra);
        let c = cfg(&sets);
        let ds = load_dataset(&c).expect("dataset");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = Arc::clone(&seen);
        let mut t = runtime::TrainerBuilder::new(c)
            .dataset(ds)
            .callback(runtime::on_batch(move |m| {
                s2.lock().unwrap().push(m.loss);
                runtime::Control::Continue
            }))
            .build()
            .expect("trainer");
        t.fit().expect("fit");
        let losses = seen.lock().unwrap().clone();
        (
            losses[0],
            t.orchestration_totals().map(|o| o.protocol.hot_uses),
        )
    };
    let (plain, _) = first_loss(&[]);
    let (reuse, uses) = first_loss(&[
        "orchestration.hot_ratio=0.5",
        "orchestration.staleness_bound=0",
        "orchestration.on_late=\"wait\"",
    ]);
    assert!(uses.unwrap_or(0) > 0, "no hot row was reused");
    assert!(
        (plain - reuse).abs() <= 1e-5 * plain.abs().max(1.0),
        "first-batch loss: no reuse {plain} vs fresh hot rows {reuse}"
    );
}

/// The layer path's host↔device copies per batch are fixed and small: the
/// bottom hop is sampled on the device with hot destinations skipped (no block
/// goes to the host and back), hot rows go up once per computed chunk, and the
/// layer-0 weights come down once per super-batch.
#[test]
fn the_layer_path_copies_a_fixed_few_things_per_batch() {
    let _serial = serial();
    for bound in [7, 15] {
        copies_per_batch(bound);
    }
}

/// [`the_layer_path_copies_a_fixed_few_things_per_batch`] at `bound`: with
/// reuse across super-batches (bound 15), each install may also be kept (two
/// index uploads) and each launch carry (two more), and the store may grow.
fn copies_per_batch(bound: u64) {
    let b = format!("orchestration.staleness_bound={bound}");
    let mut t = trainer(cfg(&[
        "orchestration.hot_ratio=0.2",
        "orchestration.super_batch=4",
        &b,
        "train.epochs=3",
        "train.eval_every=0",
    ]));
    t.train_epoch().expect("epoch 0");
    let before = t.transfer_stats();
    let jobs_before = stats(&t).protocol.jobs;
    let (kept_before, carried_before) = {
        let o = stats(&t).protocol;
        (o.rows_kept, o.rows_carried)
    };
    let s = t.train_epoch().expect("epoch 1");
    let d = t.transfer_stats().since(&before);
    let installs = stats(&t).protocol.jobs - jobs_before;
    let batches = s.batches as u64;
    let super_batches = batches.div_ceil(4);
    // SAGE's layer 0 has three tensors: one publication is three downloads.
    let publications = super_batches + 1;
    let what = format!("{d:?}, {batches} batches, {installs} chunks installed");
    assert!(installs > 0, "{what}");
    // Per batch: the bottom-layer ids (sampled a super-batch ahead). Per epoch:
    // the trainer's copy of the 6 parameter tensors and their 12 Adam moments.
    assert!(d.downloads <= batches + 3 * publications + 18, "{what}");
    // Per batch: seeds, hot positions, slab rows, skip mask, labels; per chunk:
    // its rows; with reuse, two index uploads per keep and per carry, and the
    // store's growth.
    let (kept, carried) = {
        let o = stats(&t).protocol;
        (o.rows_kept - kept_before, o.rows_carried - carried_before)
    };
    let reuse = if kept + carried > 0 {
        2 * installs.min(kept) + 2 * super_batches.min(carried) + 4
    } else {
        0
    };
    if bound == 15 {
        assert!(kept > 0 && carried > 0, "{what}");
    }
    assert!(d.uploads <= 5 * batches + installs + reuse, "{what}");
    // Nothing else crosses: the old path also sent the bottom block down and up.
    let row_bytes = 32 * 4;
    assert!(d.upload_bytes >= installs * row_bytes, "{what}");
    // No zeroed buffer in a steady epoch (memsets on CUDA): the slabs and the
    // reused per-batch buffers are not zeroed, and the zero rows that stop the
    // gradient at constant hot rows are zeroed once, when they grow.
    assert!(d.zero_fills <= 2, "{what}");
}

/// Publishing layer 0's weights adds no synchronization to the accelerator
/// thread: each `publish` slice (every super-batch's end) queues one download
/// per tensor (SAGE's layer 0 has three) and waits for none of them — before,
/// each was a blocking download, a synchronization per tensor. The workers
/// wait for the copies on an event instead, at most once per publication (a
/// publication replaced before any worker read it is never waited for); the
/// only other event waits are the bottom hops' reads, one a super-batch.
#[test]
fn publishing_adds_no_synchronization_to_the_accelerator_thread() {
    let _serial = serial();
    let tracer = runtime::trace::Tracer::new();
    let mut t = trainer(cfg(&[
        "train.epochs=2",
        "train.eval_every=0",
        "orchestration.hot_ratio=0.2",
        "orchestration.super_batch=4",
    ]));
    t.set_tracer(tracer.clone());
    let before = t.transfer_stats();
    t.fit().expect("fit");
    let d = t.transfer_stats().since(&before);
    let trace = tracer.collect();
    let publish: Vec<_> = trace
        .slices
        .iter()
        .filter(|s| s.name == "publish")
        .collect();
    assert!(publish.len() >= 4, "{} publications", publish.len());
    let arg = |s: &runtime::trace::Slice, key: &str| {
        s.args.extra.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    };
    for s in &publish {
        assert_eq!(arg(s, "host_syncs"), Some(0.0), "{:?}", s.args);
        assert_eq!(arg(s, "downloads"), Some(3.0), "{:?}", s.args);
    }
    // Besides, each super-batch's first batch waits for its bottom hops'
    // read (`device.sample_ahead`, engine/hot.rs step 1b) on an event.
    let bottom_reads = trace
        .slices
        .iter()
        .filter(|s| s.name == "bottom read")
        .count() as u64;
    assert!(bottom_reads >= 4, "{bottom_reads} bottom reads");
    assert!(d.event_waits > bottom_reads, "{d:?}");
    assert!(
        d.event_waits <= publish.len() as u64 + bottom_reads,
        "{d:?}"
    );
}

/// A stop inside a super-batch — a cancelled token (seen at the batch's gate) or a
/// callback's stop (after the batch trained) — ends the pipeline's epoch cleanly,
/// and training on from there gives exactly the weights and losses of a run that
/// never stopped: with fresh rows (bound 0, wait) and all-neighbour bottom sampling
/// no hot row depends on where the resumed epoch's super-batches start. Under a
/// loss lag (`executor/layer/losses.rs`) the session sees a batch when its
/// super-batch's read resolves, at the next super-batch's end: the stop comes
/// after the batches trained by then, every one of them shown.
#[test]
fn a_stop_inside_a_super_batch_then_training_on_matches_an_uninterrupted_run() {
    let _serial = serial();
    use runtime::{on_batch, BatchMetrics, CancelToken, Control, Error, StopCause};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    // Batch 5 is the second batch of super-batch 1; under a lag its loss is
    // read at super-batch 2's end, after batch 11 trained.
    for (lag, stop_at) in [(1, 6), (8, 12)] {
        let lag_set = format!("device.loss_lag={lag}");
        let c = cfg(&[
            "train.fanouts=[-1, 5]",
            "model.dropout=0.0",
            "train.epochs=2",
            "orchestration.hot_ratio=0.3",
            "orchestration.staleness_bound=0",
            "orchestration.on_late=\"wait\"",
            "orchestration.super_batch=4",
            &lag_set,
        ]);
        let ds = load_dataset(&c).expect("dataset");
        let mut whole = Trainer::new(ds.clone(), c.clone()).expect("trainer");
        let all = whole.fit().expect("fit");
        let expected = bits(&whole, &all);

        for cause in [StopCause::Token, StopCause::Callback] {
            let token = CancelToken::new();
            let (stopper, fired) = (token.clone(), Arc::new(AtomicBool::new(false)));
            let seen = Arc::new(AtomicUsize::new(0));
            let counter = Arc::clone(&seen);
            let mut t = runtime::TrainerBuilder::new(c.clone())
                .dataset(ds.clone())
                .cancel_token(token)
                .callback(on_batch(move |m: &BatchMetrics| {
                    if m.epoch == 0 {
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                    if m.epoch != 0 || m.batch != 5 || fired.swap(true, Ordering::Relaxed) {
                        return Control::Continue;
                    }
                    match cause {
                        StopCause::Token => {
                            stopper.cancel();
                            Control::Continue
                        }
                        _ => Control::Stop,
                    }
                }))
                .build()
                .expect("trainer");
            let what = format!("{cause:?}, lag {lag}");
            match t.train_epoch() {
                Err(Error::Cancelled {
                    epoch: 0,
                    batch,
                    cause: found,
                }) if found == cause && batch == stop_at => {}
                other => panic!("{what}: expected a stop before batch {stop_at}, got {other:?}"),
            }
            let seen = seen.load(Ordering::Relaxed);
            assert_eq!(seen, stop_at, "{what}: every batch trained is shown");
            t.set_cancel_token(CancelToken::new());
            let rest = t.fit().expect("training on");
            assert_eq!(bits(&t, &rest), expected, "{what}");
            let o = stats(&t);
            assert!(o.protocol.hot_uses > 0, "{what}: {}", o.summary());
            assert_eq!(o.protocol.gaps.max(), Some(0), "{what}: {}", o.summary());
        }
    }
}

/// Reuse across super-batches (`orchestration.reuse_across_superbatches`, on by
/// default): whatever the workers' timing, no row is used past the bound, with
/// either late policy, with the monitor moving the split, and after a stop in
/// the middle of an epoch (the resumed epoch starts with an empty store). With
/// `on_late = "wait"` and a bound of `4N − 1`, rows of super-batch `j` are
/// always in the store, fresh enough, when `j + 2` is launched: rows are
/// carried, and fewer rows are computed than without reuse.
#[test]
fn rows_kept_across_super_batches_never_exceed_the_bound() {
    let _serial = serial();
    let base = [
        "orchestration.hot_ratio=0.2",
        "orchestration.super_batch=4",
        "train.epochs=3",
    ];
    let with = |extra: &[&str]| {
        let mut sets: Vec<&str> = base.to_vec();
        sets.extend_from_slice(extra);
        cfg(&sets)
    };
    for (bound, on_late, monitor) in [
        (4u64, "wait", false),
        (11, "compute", false),
        (15, "wait", false),
        (15, "compute", true),
    ] {
        let b = format!("orchestration.staleness_bound={bound}");
        let l = format!("orchestration.on_late=\"{on_late}\"");
        let m = format!("orchestration.monitor={monitor}");
        let (_, t) = run(with(&[&b, &l, &m]));
        let o = stats(&t);
        let what = format!("bound {bound} {on_late} monitor {monitor}: {}", o.summary());
        assert!(o.protocol.gaps.max().unwrap_or(0) <= bound, "{what}");
        assert_eq!(o.protocol.gaps.total(), o.protocol.hot_uses, "{what}");
        assert!(o.summary().contains("uses per computed row"), "{what}");
        if bound == 15 && on_late == "wait" {
            assert!(o.protocol.rows_carried > 0, "{what}");
            assert!(o.protocol.rows_kept > 0, "{what}");
            let off = stats(
                &run(with(&[
                    &b,
                    &l,
                    &m,
                    "orchestration.reuse_across_superbatches=false",
                ]))
                .1,
            );
            assert_eq!(off.protocol.rows_carried + off.protocol.rows_kept, 0);
            assert!(
                o.protocol.rows_computed < off.protocol.rows_computed,
                "{what} vs {}",
                off.summary()
            );
            assert!(
                o.protocol.uses_per_computed_row() > off.protocol.uses_per_computed_row(),
                "{what} vs {}",
                off.summary()
            );
        }
    }
    // A stop inside an epoch, then training on.
    use runtime::{on_batch, BatchMetrics, Control};
    let mut t = runtime::TrainerBuilder::new(with(&[
        "orchestration.staleness_bound=15",
        "orchestration.on_late=\"wait\"",
    ]))
    .callback(on_batch(move |m: &BatchMetrics| {
        if m.epoch == 0 && m.batch == 5 {
            Control::Stop
        } else {
            Control::Continue
        }
    }))
    .build()
    .expect("trainer");
    assert!(t.train_epoch().is_err());
    t.fit().expect("training on");
    let o = stats(&t);
    assert!(o.protocol.gaps.max().unwrap_or(0) <= 15, "{}", o.summary());
    assert!(o.protocol.rows_carried > 0, "{}", o.summary());
}

/// The bottom hop of every batch sampled a super-batch ahead on the sampling
/// stream (`device.sample_ahead`, `engine/hot.rs` step 1b), masked by its
/// planned hot positions, trains exactly as the hop sampled at train time
/// (`sample_ahead = false`): weights and losses bit for bit, with either
/// `hot_backward`. With fresh rows (bound 0, wait) and all-neighbour bottom
/// sampling no hot row depends on the workers' timing. Under `"wait"` every
/// batch trains with its planned positions, so every hop is used; under
/// `"compute"` a batch with late positions left cold samples its hop again,
/// and only then (counted in `bottoms_resampled`).
#[test]
fn bottom_hops_sampled_ahead_train_bit_for_bit_as_at_train_time() {
    let _serial = serial();
    for grad in ["constant", "aggregate"] {
        let g = format!("orchestration.hot_backward=\"{grad}\"");
        let runs: Vec<_> = ["false", "true"]
            .into_iter()
            .map(|ahead| {
                let a = format!("device.sample_ahead={ahead}");
                let (s, t) = run(cfg(&[
                    "train.fanouts=[-1, 5]",
                    "model.dropout=0.0",
                    "train.epochs=2",
                    "orchestration.hot_ratio=0.3",
                    "orchestration.staleness_bound=0",
                    "orchestration.on_late=\"wait\"",
                    "orchestration.super_batch=4",
                    &g,
                    &a,
                ]));
                let batches: u64 = s.iter().map(|e| e.batches as u64).sum();
                (bits(&t, &s), stats(&t), batches)
            })
            .collect();
        let ((off_bits, off, batches), (on_bits, on, _)) = (&runs[0], &runs[1]);
        assert_eq!(off_bits, on_bits, "{grad}");
        assert!(on.protocol.hot_uses > 0, "{grad}: {}", on.summary());
        assert_eq!((off.bottoms_ahead, off.bottoms_resampled), (0, 0), "{grad}");
        assert_eq!(
            (on.bottoms_ahead, on.bottoms_resampled),
            (*batches, 0),
            "{grad}: {}",
            on.summary()
        );
        // "compute": late positions stay cold; the hop sampled ahead with
        // them skipped is sampled again (constant) or fits as is (aggregate).
        let (s, t) = run(cfg(&[
            "train.epochs=2",
            "orchestration.hot_ratio=0.3",
            "orchestration.staleness_bound=0",
            "orchestration.on_late=\"compute\"",
            "orchestration.super_batch=4",
            &g,
        ]));
        let o = stats(&t);
        let batches: u64 = s.iter().map(|e| e.batches as u64).sum();
        let what = format!("{grad}, compute: {}", o.summary());
        assert_eq!(o.bottoms_ahead + o.bottoms_resampled, batches, "{what}");
        if grad == "constant" {
            assert_eq!(
                o.bottoms_resampled > 0,
                o.protocol.computed_cold > 0,
                "{what}"
            );
        } else {
            assert_eq!(o.bottoms_resampled, 0, "{what}");
        }
    }
}
