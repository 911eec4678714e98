//! The protocol's timings besides the hot rows (`scheduler::protocol` steps 2,
//! 3 and 7), checked over thousands of simulated batches with random costs:
//! the deferred losses' reads (at most `⌈N / L⌉` per super-batch, every
//! trained batch shown once, in order, about a super-batch after it trained and
//! before the epoch ends), the measurement marks (each after a flush), a
//! non-finite loss (the version moves back by exactly the steps the device
//! skipped), the bottom hops sampled ahead (a batch trains on its own iff it
//! trains with its planned positions), and the publications' copies (no job
//! computes with weights whose copy has not ended).
//!
//! Every check reads the run's records and trace, not the protocol's counts;
//! the simulator's device model refuses, besides, any action that contradicts
//! the device (a read of other slots than those written, a rewind of other
//! steps than those skipped, a batch on a bottom hop the engine would not use).

use scheduler::{
    simulate, BottomHops, CostModel, ModelShape, OnLate, PipelineConfig, RandomCosts, Scripted,
    SimConfig, SimReport, StalenessRule, SyntheticWorkload, Work, WorkKind, Workload,
};

use cpu_ops::Rng;

/// Slows the publications' copies by `factor` (so jobs meet copies in flight).
fn slow_copies(factor: f64) -> Scripted<impl FnMut(&Work) -> f64> {
    let model = CostModel::reference();
    Scripted(move |w: &Work| {
        let d = model.seconds(w);
        if w.kind == WorkKind::Publish {
            d * factor
        } else {
            d
        }
    })
}

/// A random scenario for `seed`: pipeline shape, bound, late policy, workers,
/// CPU speed, loss lag, how bottom hops are sampled, random costs.
fn scenario(seed: u64) -> (SimConfig, Workload, u64) {
    let mut rng = Rng::new(seed);
    let n = 1 + rng.below(8) as usize;
    let depth = rng.below(3) as usize;
    let pipeline = PipelineConfig::new(n, depth, [8, 64][rng.below(2) as usize])
        .and_then(|p| p.with_min_chunks(1 + rng.below(4) as usize))
        .unwrap();
    let model = ModelShape::new(64, 64, 2 + rng.below(2) as u32, 5 + rng.below(10) as u32).unwrap();
    let mut cfg = SimConfig::layer(model).unwrap();
    cfg.pipeline = pipeline;
    let on_late = if rng.below(2) == 0 {
        OnLate::Wait
    } else {
        OnLate::Compute
    };
    let bound = [0, pipeline.on_time_gap() / 2, pipeline.on_time_gap()][rng.below(3) as usize];
    cfg.staleness = StalenessRule::new(bound, on_late);
    cfg.cpu_workers = 1 + rng.below(4) as u32;
    cfg.record_trace = true;
    cfg.reuse = rng.below(2) == 0;
    cfg.loss_lag = [1, 2, 3, 4, 8, 16][rng.below(6) as usize];
    cfg.bottoms = match rng.below(4) {
        0 => BottomHops::AtTrain,
        1 => BottomHops::SkipNothing,
        _ => BottomHops::SkipPlanned,
    };
    let mut synth = SyntheticWorkload::small(100 + rng.below(200) as usize, seed ^ 0x5EED);
    synth.hot_count = [50, 500, 2000][rng.below(3) as usize];
    synth.hot_draws = 20 + rng.below(300) as u32;
    (cfg, synth.generate().unwrap(), rng.next_u64())
}

/// `cfg` over `work` with the reference costs, CPU speed and copies' speed
/// drawn from `seed`, perturbed.
fn run(cfg: &SimConfig, work: &Workload, seed: u64) -> SimReport {
    let mut rng = Rng::new(seed);
    let cpu = (rng.next_f64() * 4.0 - 3.0).exp();
    let copies = 1.0 + 50.0 * rng.next_f64();
    let base = slow_copies(copies);
    let mut costs = RandomCosts::new(base, seed, 1.5, 0.05, 10.0).unwrap();
    let mut scaled = Scripted(move |w: &Work| {
        use scheduler::CostSource;
        let d = costs.duration(w);
        if w.kind == WorkKind::HotCompute {
            d / cpu
        } else {
            d
        }
    });
    simulate(cfg, work, &mut scaled).unwrap_or_else(|e| panic!("{cfg:?}: {e}"))
}

/// What a run trained: the batches whose step the trace holds, in order.
fn trained(r: &SimReport) -> Vec<usize> {
    let mut t: Vec<(f64, usize)> = r
        .trace
        .iter()
        .filter(|s| s.kind == WorkKind::Train)
        .map(|s| (s.start_s, s.batch.unwrap() as usize))
        .collect();
    t.sort_by(|a, b| a.0.total_cmp(&b.0));
    t.into_iter().map(|(_, b)| b).collect()
}

#[test]
fn loss_reads_show_every_trained_batch_once_in_order_a_super_batch_later() {
    let (mut batches, mut deferred) = (0, 0);
    for seed in 0..60 {
        let (cfg, work, costs) = scenario(seed);
        let r = run(&cfg, &work, costs);
        let what = format!("seed {seed}: {cfg:?}");
        let total = work.len();
        batches += total;
        // Every batch trained, and shown exactly once, in order, after its
        // step and before the epoch ended.
        assert_eq!(trained(&r), (0..total).collect::<Vec<_>>(), "{what}");
        assert_eq!(r.shown, (0..total).collect::<Vec<_>>(), "{what}");
        for b in &r.batches {
            let shown = b
                .shown_s
                .unwrap_or_else(|| panic!("{what}: {b:?} never shown"));
            assert!(
                b.end_s <= shown && shown <= r.totals.epoch_s,
                "{what}: {b:?}"
            );
        }
        let n = cfg.pipeline.batches_per_super_batch();
        if cfg.loss_lag <= 1 {
            assert!(r.loss_reads.is_empty(), "{what}");
            continue;
        }
        deferred += total;
        // The reads cover the batches, in order, each the batches trained
        // since the one before; one in flight at a time, each resolved.
        let mut next = 0;
        for (i, read) in r.loss_reads.iter().enumerate() {
            assert_eq!(read.batches.start, next, "{what}: read {i}");
            assert!(!read.batches.is_empty() && read.batches.len() <= cfg.loss_lag);
            next = read.batches.end;
            let resolved = read.resolved_s.expect("every read is resolved");
            assert!(read.queued_s <= resolved, "{what}: read {i}");
            if let Some(after) = r.loss_reads.get(i + 1) {
                assert!(resolved <= after.queued_s, "{what}: two reads in flight");
            }
        }
        assert_eq!(next, total, "{what}");
        // At most ⌈N / L⌉ reads per super-batch (one when L ≥ N), and a read
        // never spans two super-batches.
        let per = n.div_ceil(cfg.loss_lag);
        for j in 0..r.super_batches.len() as u64 {
            let reads: Vec<_> = r.loss_reads.iter().filter(|x| x.super_batch == j).collect();
            assert!(
                !reads.is_empty() && reads.len() <= per,
                "{what}: super-batch {j}"
            );
            for x in reads {
                let first = x.batches.start / n;
                assert_eq!(
                    (first as u64, (x.batches.end - 1) / n),
                    (j, first),
                    "{what}"
                );
            }
        }
        // A batch of super-batch j is shown by the end of super-batch j + 1.
        for b in &r.batches {
            let j = b.super_batch as usize + 1;
            let by = r.super_batches.get(j).map_or(r.totals.epoch_s, |s| s.end_s);
            assert!(b.shown_s.unwrap() <= by, "{what}: {b:?} shown late");
        }
    }
    assert!(batches > 10_000 && deferred > 5_000, "{batches} batches");
    println!("{batches} batches, {deferred} with deferred losses");
}

#[test]
fn a_flush_precedes_every_measurement_mark() {
    let mut marks = 0;
    for seed in 0..40 {
        let (mut cfg, work, costs) = scenario(seed);
        let mut rng = Rng::new(seed ^ 0x3A3A);
        let total = work.len();
        let start = rng.below(total as u64 / 2) as usize;
        let end = start + 1 + rng.below(total as u64 - start as u64 + 2) as usize;
        cfg.window = Some(start..end);
        let r = run(&cfg, &work, costs);
        let what = format!("seed {seed}: window {start}..{end}, {cfg:?}");
        let want: Vec<(usize, bool)> = if end <= total {
            vec![(start, true), (end, false)]
        } else {
            vec![(start, true)]
        };
        let got: Vec<(usize, bool)> = r.marks.iter().map(|m| (m.batch, m.start)).collect();
        assert_eq!(got, want, "{what}");
        for m in &r.marks {
            marks += 1;
            // Every batch before it trained, none after it, and every one
            // trained had its loss read before the mark: under a lag, read
            // and shown by the flush before it; without one, read by its step
            // (the batch just before the mark is shown right after it).
            let shown = if cfg.loss_lag > 1 {
                m.batch
            } else {
                m.batch.saturating_sub(1)
            };
            assert_eq!((m.trained, m.shown), (m.batch, shown), "{what}: {m:?}");
            if m.batch > 0 && cfg.loss_lag > 1 {
                assert!(
                    r.batches[m.batch - 1].shown_s.unwrap() <= m.time_s,
                    "{what}"
                );
            }
            if let Some(b) = r.batches.get(m.batch) {
                assert!(m.time_s <= b.start_s, "{what}: {m:?} after batch's gate");
            }
        }
        // The rest of the run is as without the window: every batch shown once.
        assert_eq!(r.shown, (0..total).collect::<Vec<_>>(), "{what}");
    }
    assert!(marks > 60, "{marks} marks");
    println!("{marks} marks");
}

#[test]
fn a_nonfinite_loss_rewinds_by_exactly_the_skipped_steps() {
    let mut rewound = 0;
    for seed in 0..60 {
        let (mut cfg, work, costs) = scenario(seed);
        let bad = Rng::new(seed ^ 0xBAD).below(work.len() as u64) as usize;
        cfg.nonfinite = Some(bad);
        let r = run(&cfg, &work, costs);
        let what = format!("seed {seed}: batch {bad}, {cfg:?}");
        // The session sees every batch up to the bad one, and none after it.
        assert_eq!(r.shown, (0..=bad).collect::<Vec<_>>(), "{what}");
        let trained = trained(&r);
        assert_eq!(trained, (0..trained.len()).collect::<Vec<_>>(), "{what}");
        if cfg.loss_lag <= 1 {
            // Each step read its own loss: the run stops at it, nothing to undo.
            assert_eq!((trained.len(), r.rewound), (bad + 1, None), "{what}");
        } else {
            // Its step and every one trained after it were skipped.
            let skipped = (trained.len() - bad) as u64;
            assert_eq!(r.rewound, Some((bad, skipped)), "{what}");
            rewound += 1;
        }
    }
    assert!(rewound > 20, "{rewound} rewinds");
    println!("{rewound} rewinds");
}

#[test]
fn a_batch_trains_on_its_bottom_hop_sampled_ahead_iff_it_trains_with_its_planned_positions() {
    let (mut ahead, mut resampled) = (0, 0);
    for seed in 0..60 {
        let (cfg, work, costs) = scenario(seed);
        let r = run(&cfg, &work, costs);
        let what = format!("seed {seed}: {cfg:?}");
        let hops: Vec<&scheduler::Span> = r
            .trace
            .iter()
            .filter(|s| s.kind == WorkKind::SampleBottom)
            .collect();
        for b in &r.batches {
            // Its planned positions are those it used and those left cold.
            let planned = b.late_computed == 0;
            let want = match cfg.bottoms {
                BottomHops::AtTrain => false,
                BottomHops::SkipNothing => true,
                BottomHops::SkipPlanned => planned,
            };
            assert_eq!(b.bottom_ahead, want, "{what}: {b:?}");
            if cfg.bottoms == BottomHops::AtTrain {
                continue;
            }
            // Its hop was sampled once, at its super-batch's launch, before
            // the super-batch before it trained its last batch.
            let hop: Vec<_> = hops.iter().filter(|s| s.batch == Some(b.batch)).collect();
            assert_eq!(hop.len(), 1, "{what}: {b:?}");
            assert!(hop[0].end_s <= b.start_s, "{what}: {b:?}");
            if b.bottom_ahead {
                ahead += 1;
            } else {
                resampled += 1;
            }
        }
        if cfg.bottoms == BottomHops::AtTrain {
            assert!(hops.is_empty(), "{what}");
        }
    }
    assert!(
        ahead > 5_000 && resampled > 100,
        "{ahead} ahead, {resampled} resampled"
    );
    println!("{ahead} batches on their bottom hop sampled ahead, {resampled} resampled");
}

#[test]
fn workers_never_compute_with_a_publication_before_its_copy_resolved() {
    let mut waited = 0;
    for seed in 0..60 {
        let (cfg, work, costs) = scenario(seed);
        let r = run(&cfg, &work, costs);
        let what = format!("seed {seed}: {cfg:?}");
        let copies: Vec<(u64, f64, f64)> = r
            .trace
            .iter()
            .filter(|s| s.kind == WorkKind::Publish)
            .map(|s| (s.version.unwrap(), s.start_s, s.end_s))
            .collect();
        for s in r.trace.iter().filter(|s| s.kind == WorkKind::HotCompute) {
            let v = s.version.unwrap();
            // The publication it read: its copy ended before it computed, and
            // no newer copy had ended by then (it read the newest).
            let (_, issued, ended) = copies
                .iter()
                .copied()
                .find(|c| c.0 == v)
                .unwrap_or_else(|| panic!("{what}: no publication of version {v}"));
            assert!(ended <= s.start_s, "{what}: {s:?} before its copy ended");
            assert!(
                copies.iter().all(|c| c.0 <= v || c.2 >= s.start_s),
                "{what}: {s:?} read an old publication"
            );
            if issued < s.start_s && s.start_s == ended {
                waited += 1;
            }
        }
    }
    assert!(waited > 10, "{waited} jobs waited for a copy");
    println!("{waited} jobs waited for a copy");
}
