//! The simulated run follows the protocol's steps (`scheduler::protocol`), read
//! back from its trace: super-batches launched a stage ahead, batches trained in
//! order at their versions, chunks installed once before the batches that read
//! them, weights published per super-batch (or per batch under a tight bound),
//! urgent recomputations reading weights within the bound, regular jobs of
//! finished super-batches dropped.

use std::collections::HashMap;

use scheduler::{
    simulate, CostModel, ModelShape, OnLate, Publication, SimConfig, SimReport, Span,
    StalenessRule, SyntheticWorkload, WorkKind, Workload,
};

fn setup(bound: Option<u64>, on_late: OnLate, cpu_speed: f64) -> (SimConfig, Workload, CostModel) {
    let model = ModelShape::new(64, 64, 3, 10).unwrap();
    let mut cfg = SimConfig::layer(model).unwrap();
    let bound = bound.unwrap_or(cfg.pipeline.on_time_gap());
    cfg.staleness = StalenessRule::new(bound, on_late);
    cfg.record_trace = true;
    let work = SyntheticWorkload::small(80, 5).generate().unwrap();
    let mut costs = CostModel::reference();
    costs.cpu.flops_per_s *= cpu_speed;
    costs.cpu.mem_bytes_per_s *= cpu_speed;
    costs.cpu.sample_edges_per_s *= cpu_speed;
    (cfg, work, costs)
}

fn spans(r: &SimReport, kind: WorkKind) -> impl Iterator<Item = &Span> {
    r.trace.iter().filter(move |s| s.kind == kind)
}

/// The span of `kind` for batch `b`.
fn of(r: &SimReport, kind: WorkKind, b: u64) -> &Span {
    spans(r, kind)
        .find(|s| s.batch == Some(b))
        .unwrap_or_else(|| panic!("no {kind} for batch {b}"))
}

#[test]
fn launch_ahead_then_train_every_batch_in_order() {
    let (cfg, work, costs) = setup(None, OnLate::Wait, 1.0);
    let r = simulate(&cfg, &work, costs).unwrap();
    let n = cfg.pipeline.batches_per_super_batch() as u64;
    let total = work.len() as u64;
    let mut last_end = 0.0;
    for b in 0..total {
        // One step per batch, in order, at version b, after its top sampling.
        let t = of(&r, WorkKind::Train, b);
        assert_eq!(t.version, Some(b));
        assert!(t.start_s >= last_end, "batch {b} before batch {}", b - 1);
        last_end = t.end_s;
        assert!(of(&r, WorkKind::SampleTop, b).end_s <= t.start_s);
        assert_eq!(r.batches[b as usize].end_s, t.end_s);
        // Step 3: super-batch j + 1's top layers are sampled before the first
        // batch of j trains.
        let j = b / n;
        if b % n == 0 && (j + 1) * n < total {
            for k in (j + 1) * n..((j + 2) * n).min(total) {
                let top = of(&r, WorkKind::SampleTop, k);
                assert!(top.end_s <= t.start_s, "batch {k} sampled after batch {b}");
            }
        }
    }
    // One accelerator: its work never overlaps.
    let mut acc: Vec<&Span> = r
        .trace
        .iter()
        .filter(|s| s.kind != WorkKind::HotCompute)
        .collect();
    acc.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    for w in acc.windows(2) {
        assert!(
            w[0].end_s <= w[1].start_s + 1e-12,
            "{:?} overlaps {:?}",
            w[0],
            w[1]
        );
    }
    assert_eq!(r.super_batches.len() as u64, total.div_ceil(n));
    assert!(r.totals.epoch_s >= last_end);
}

#[test]
fn each_chunk_goes_up_once_before_the_batches_that_read_it() {
    let (cfg, work, costs) = setup(None, OnLate::Wait, 1.0);
    let r = simulate(&cfg, &work, costs).unwrap();
    let n = cfg.pipeline.batches_per_super_batch() as u64;
    let mut rows = 0;
    let mut per_chunk: HashMap<(u64, u32), u32> = HashMap::new();
    for s in spans(&r, WorkKind::Install) {
        let src = &r.trace[s.source.unwrap()];
        assert!(src.end_s <= s.start_s, "install before its rows");
        rows += s.vertices;
        *per_chunk
            .entry((s.super_batch, s.chunk.unwrap()))
            .or_default() += 1;
        // Installed before the last batch of its super-batch trains.
        let last = ((s.super_batch + 1) * n).min(work.len() as u64) - 1;
        assert!(s.end_s <= of(&r, WorkKind::Train, last).start_s);
    }
    assert_eq!(rows, r.stats.rows_installed);
    assert!(rows > 0);
    // With an on-time CPU and the natural bound only the first super-batch's
    // gates find chunks not computed yet (the pipeline fills: promotions),
    // nothing is recomputed, and every chunk goes up exactly once.
    assert_eq!(r.stats.recomputations, 0);
    assert!(r.batches[n as usize..].iter().all(|b| b.urgent_jobs == 0));
    assert!(per_chunk.values().all(|&k| k == 1), "{per_chunk:?}");
    // Every computation reported is installed or given back.
    let computed = spans(&r, WorkKind::HotCompute).count() as u64;
    assert!(r.stats.jobs <= computed);
    assert_eq!(r.stats.installs + r.stats.discarded, r.stats.jobs);
    assert_eq!(per_chunk.len() as u64, r.stats.installs);
}

#[test]
fn weights_are_published_per_super_batch_or_per_batch_under_a_tight_bound() {
    for (bound, per_batch) in [(None, false), (Some(3), true)] {
        let (cfg, work, costs) = setup(bound, OnLate::Compute, 1.0);
        assert_eq!(
            cfg.effective_publication() == Publication::EveryBatch,
            per_batch
        );
        let r = simulate(&cfg, &work, costs).unwrap();
        let n = cfg.pipeline.batches_per_super_batch() as u64;
        let published: Vec<u64> = spans(&r, WorkKind::Publish)
            .map(|s| s.version.unwrap())
            .collect();
        // The reset at the start, then after each batch or each super-batch.
        let want: Vec<u64> = std::iter::once(0)
            .chain(
                (0..work.len() as u64)
                    .filter(|b| per_batch || b % n == n - 1 || *b + 1 == work.len() as u64)
                    .map(|b| b + 1),
            )
            .collect();
        assert_eq!(published, want, "bound {bound:?}");
        assert_eq!(r.stats.publications, want.len() as u64);
        // Each publication follows the step that made its version.
        for s in spans(&r, WorkKind::Publish).filter(|s| s.version != Some(0)) {
            let b = s.version.unwrap() - 1;
            assert!(of(&r, WorkKind::Train, b).end_s <= s.start_s);
        }
    }
}

#[test]
fn a_waiting_gate_recomputes_stale_chunks_with_weights_within_the_bound() {
    // Bound 0 with one publication per super-batch: every chunk is stale by the
    // second batch, so the gate publishes the current weights and recomputes.
    let (mut cfg, work, costs) = setup(Some(0), OnLate::Wait, 5.0);
    cfg.publication = Some(Publication::EverySuperBatch);
    let r = simulate(&cfg, &work, costs).unwrap();
    let recomputed: Vec<&Span> = spans(&r, WorkKind::HotCompute)
        .filter(|s| s.urgent == Some(true))
        .collect();
    assert!(!recomputed.is_empty());
    for s in &recomputed {
        let b = s.batch.unwrap();
        assert_eq!(s.version, Some(b), "recomputation of chunk {:?}", s.chunk);
        // The weights of version b were published before it started.
        assert!(spans(&r, WorkKind::Publish).any(|p| p.version == Some(b) && p.end_s <= s.start_s));
    }
    assert!(r.stats.recomputations >= recomputed.len() as u64);
    assert!(r.stats.publications > r.super_batches.len() as u64 + 1);
    assert_eq!(r.stats.gaps.max(), Some(0));
    assert_eq!(r.stats.computed_cold, 0);
}

#[test]
fn regular_jobs_of_finished_super_batches_are_dropped() {
    // A CPU far too slow with "compute": nobody waits for it, so its queues fall
    // behind and the jobs of super-batches that finished are dropped unstarted.
    let (cfg, work, costs) = setup(None, OnLate::Compute, 0.02);
    let r = simulate(&cfg, &work, costs).unwrap();
    assert!(r.stats.dropped_jobs > 0);
    let per_sb: u64 = r.super_batches.iter().map(|s| s.dropped_jobs as u64).sum();
    assert_eq!(per_sb, r.stats.dropped_jobs);
    // A dropped job never ran: every computation started before its
    // super-batch's last step ended.
    let n = cfg.pipeline.batches_per_super_batch() as u64;
    for s in spans(&r, WorkKind::HotCompute) {
        let last = ((s.super_batch + 1) * n).min(work.len() as u64) - 1;
        assert!(s.start_s <= of(&r, WorkKind::Train, last).end_s);
    }
    assert!(r.stats.computed_cold > 0);
}
