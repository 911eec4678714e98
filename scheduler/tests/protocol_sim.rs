//! The simulated run follows the runtime's protocol (`runtime/src/orchestrate/
//! pipeline.rs`, steps 2–7), read back from its trace: super-batches launched a
//! stage ahead, each batch's gate before its bottom hop, chunks installed once
//! before the batches that read them, weights published per super-batch (or per
//! batch under a tight bound), and urgent recomputations reading weights within
//! the bound.

use std::collections::HashMap;

use scheduler::{
    simulate, CostModel, ModelShape, OnLate, Publication, SimConfig, SimReport, StalenessRule,
    SyntheticWorkload, TaskKind, TaskSpan, Workload,
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

/// The span of the static task of `kind` for batch `b`.
fn of(r: &SimReport, kind: TaskKind, b: u64) -> &TaskSpan {
    r.trace
        .iter()
        .find(|s| s.kind == kind && s.batch == Some(b) && !s.dynamic)
        .unwrap_or_else(|| panic!("no {kind} for batch {b}"))
}

#[test]
fn launch_ahead_then_per_batch_gate_bottom_hop_and_training() {
    let (cfg, work, costs) = setup(None, OnLate::Wait, 1.0);
    let r = simulate(&cfg, &work, costs).unwrap();
    let n = cfg.pipeline.batches_per_super_batch() as u64;
    for b in 0..work.len() as u64 {
        // Step 6 after step 5: the bottom hop, gather and compute of the cold
        // destinations only once the gate passed.
        let chain = [
            TaskKind::HotLoad,
            TaskKind::SampleBottom,
            TaskKind::ColdGather,
            TaskKind::ColdCompute,
            TaskKind::Forward,
            TaskKind::Backward,
            TaskKind::OptimizerStep,
        ];
        for w in chain.windows(2) {
            let (a, z) = (of(&r, w[0], b), of(&r, w[1], b));
            assert!(a.end_s <= z.start_s, "batch {b}: {} before {}", w[0], w[1]);
        }
        // Step 3: super-batch j + 1's top layers are sampled before the first gate
        // of j.
        let j = b / n;
        if b % n == 0 && (j + 1) * n < work.len() as u64 {
            let gate = of(&r, TaskKind::HotLoad, b);
            for k in (j + 1) * n..((j + 2) * n).min(work.len() as u64) {
                let top = of(&r, TaskKind::SampleTop, k);
                assert!(
                    top.end_s <= gate.start_s,
                    "batch {k} sampled after gate {b}"
                );
            }
        }
    }
}

#[test]
fn each_chunk_goes_up_once_before_the_batches_that_read_it() {
    let (cfg, work, costs) = setup(None, OnLate::Wait, 1.0);
    let r = simulate(&cfg, &work, costs).unwrap();
    let end: HashMap<usize, f64> = r.trace.iter().map(|s| (s.id, s.end_s)).collect();
    let mut rows = 0;
    let mut per_chunk: HashMap<(u64, u32), u32> = HashMap::new();
    for s in r.trace.iter().filter(|s| s.kind == TaskKind::HotInstall) {
        let compute = s.deps[0];
        assert!(
            end[&compute] <= s.start_s,
            "install {} before its rows",
            s.id
        );
        if s.dropped {
            continue;
        }
        rows += s.hot_vertices.len() as u64;
        *per_chunk
            .entry((s.super_batch, s.chunk.unwrap()))
            .or_default() += 1;
        // Installed at a gate of its own super-batch, before that batch trains.
        let n = cfg.pipeline.batches_per_super_batch() as u64;
        let last = ((s.super_batch + 1) * n).min(work.len() as u64) - 1;
        assert!(s.end_s <= of(&r, TaskKind::HotLoad, last).start_s);
    }
    assert_eq!(rows, r.totals.rows_installed);
    assert!(rows > 0);
    // With an on-time CPU and no recomputation, every chunk goes up exactly once.
    assert_eq!(r.trace.iter().filter(|s| s.dynamic).count(), 0);
    assert!(per_chunk.values().all(|&k| k == 1), "{per_chunk:?}");
    let computed = r
        .trace
        .iter()
        .filter(|s| s.kind == TaskKind::HotCompute && !s.dropped)
        .count();
    assert_eq!(per_chunk.len(), computed);
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
        let published: Vec<u64> = r
            .trace
            .iter()
            .filter(|s| s.kind == TaskKind::PublishWeights && !s.dynamic)
            .map(|s| s.batch.unwrap())
            .collect();
        let want: Vec<u64> = (0..work.len() as u64)
            .filter(|b| per_batch || b % n == n - 1 || *b + 1 == work.len() as u64)
            .collect();
        assert_eq!(published, want, "bound {bound:?}");
        // Each publishes the version after its batch's step.
        for s in r
            .trace
            .iter()
            .filter(|s| s.kind == TaskKind::PublishWeights)
        {
            assert_eq!(s.version, Some(s.batch.unwrap() + 1));
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
    let spans: HashMap<usize, &TaskSpan> = r.trace.iter().map(|s| (s.id, s)).collect();
    let urgent: Vec<&TaskSpan> = r
        .trace
        .iter()
        .filter(|s| s.dynamic && s.kind == TaskKind::HotCompute)
        .collect();
    assert!(!urgent.is_empty());
    let mut published = 0;
    for s in urgent {
        let b = s.batch.unwrap();
        assert_eq!(s.version, Some(b), "recomputation of chunk {:?}", s.chunk);
        for d in &s.deps {
            let p = spans[d];
            assert!(p.kind == TaskKind::PublishWeights && p.dynamic && p.end_s <= s.start_s);
            published += 1;
        }
    }
    assert!(published > 0, "no publication before a recomputation");
    assert_eq!(r.gaps.max(), Some(0));
    assert_eq!(r.totals.late_computed, 0);
}
