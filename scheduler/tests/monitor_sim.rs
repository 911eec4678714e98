//! The hybrid monitor in the simulated pipeline, with scripted costs: a slow CPU
//! makes it move hot vertices to the device cache until the accelerator stops
//! waiting (within the memory budget), a fast CPU makes it move them back, and a
//! steady workload does not make it oscillate.

use scheduler::{
    simulate, Direction, ModelShape, MonitorConfig, MoveReason, RandomCosts, Scripted, SimConfig,
    SimReport, SyntheticWorkload, Work, WorkKind, Workload,
};

/// Accelerator costs per batch (fixed, plus 2 µs per cold destination: the
/// bottom hop 0.5 ms, gather 1 ms, cold compute 1 ms, hot rows 0.1 ms, forward
/// 2 ms, backward 3 ms, step 0.5 ms) and CPU costs of `cpu_per_vertex` seconds per
/// hot vertex.
fn costs(cpu_per_vertex: f64) -> impl FnMut(&Work) -> f64 {
    move |w: &Work| match w.kind {
        WorkKind::HotCompute => cpu_per_vertex * w.est.vertices as f64,
        WorkKind::SampleTop => 5e-4,
        // The bottom hop is in the step's fixed cost, wherever it is sampled.
        WorkKind::SampleBottom => 0.0,
        WorkKind::Train => 8.1e-3 + 2e-6 * w.est.vertices as f64,
        WorkKind::Install => 1e-5,
        WorkKind::Publish => 2e-4,
        WorkKind::LossRead => 1e-5,
    }
}

fn setup(batches: usize, seed: u64) -> (SimConfig, Workload, u64) {
    let model = ModelShape::new(128, 64, 2, 10).unwrap();
    let cfg = SimConfig::layer(model).unwrap();
    let mut synth = SyntheticWorkload::small(batches, seed);
    synth.jitter = 0.0;
    let work = synth.generate().unwrap();
    let all_rows = work.hot_count() as u64 * model.feature_row_bytes();
    (cfg, work, all_rows)
}

/// Seconds per hot vertex that make the CPU's hot work per super-batch `ratio`
/// times the accelerator's busy time (measured in a run without monitor).
fn calibrate(cfg: &SimConfig, work: &Workload, ratio: f64) -> f64 {
    let probe = 1e-7;
    let r = simulate(cfg, work, Scripted(costs(probe))).unwrap();
    let steady = &r.super_batches[2..r.super_batches.len() - 2];
    let cpu: f64 = steady.iter().map(|s| s.cpu_hot_busy_s).sum::<f64>() / cfg.cpu_workers as f64;
    let acc: f64 = steady.iter().map(|s| s.acc_busy_s).sum();
    probe * ratio * acc / cpu
}

fn reversals(r: &SimReport) -> usize {
    r.moves
        .windows(2)
        .filter(|w| w[0].direction != w[1].direction)
        .count()
}

fn assert_within_budget(r: &SimReport, budget: u64) {
    assert!(
        r.totals.max_cache_bytes <= budget,
        "{} > {budget}",
        r.totals.max_cache_bytes
    );
    for m in &r.moves {
        assert!(m.cache_bytes_after <= budget, "{m:?}");
    }
    for s in &r.super_batches {
        assert!(
            s.cache_bytes <= budget,
            "super-batch {}: {}",
            s.index,
            s.cache_bytes
        );
    }
}

#[test]
fn a_cpu_twice_too_slow_halves_the_waiting_within_five_super_batches() {
    for seed in [11, 12, 13] {
        let (mut cfg, work, all_rows) = setup(120, seed);
        let alpha = calibrate(&cfg, &work, 2.0);
        let without = simulate(&cfg, &work, Scripted(costs(alpha))).unwrap();
        let monitor = MonitorConfig::with_budget(all_rows);
        cfg.monitor = Some(monitor);
        let with = simulate(&cfg, &work, Scripted(costs(alpha))).unwrap();
        // The scenario: the CPU's hot work per super-batch is twice the
        // accelerator's training time, so the accelerator waits about as long as
        // it trains.
        let steady = &without.super_batches[2..without.super_batches.len() - 2];
        let cpu: f64 = steady.iter().map(|s| s.cpu_hot_busy_s).sum::<f64>();
        let acc: f64 = steady.iter().map(|s| s.acc_busy_s).sum::<f64>();
        let ratio = cpu / cfg.cpu_workers as f64 / acc;
        assert!((1.95..2.05).contains(&ratio), "seed {seed}: ratio {ratio}");
        // Reference: the steady waiting per super-batch without the monitor.
        let reference = steady.iter().map(|s| s.acc_wait_hot_s).sum::<f64>() / steady.len() as f64;
        assert!(
            reference > 0.8 * acc / steady.len() as f64,
            "seed {seed}: {reference}"
        );
        // From the fifth super-batch after the monitor's warm-up, every one waits
        // at most half as long.
        let k0 = monitor.warmup as usize;
        for w in &with.super_batches[k0 + 5..with.super_batches.len() - 1] {
            assert!(
                w.acc_wait_hot_s <= 0.5 * reference,
                "seed {seed}: super-batch {} waited {} (reference {reference})",
                w.index,
                w.acc_wait_hot_s
            );
        }
        assert!(with.totals.acc_wait_hot_s < 0.3 * without.totals.acc_wait_hot_s);
        assert!(with.totals.epoch_s < 0.8 * without.totals.epoch_s);
        assert!(
            with.moves
                .iter()
                .take(2)
                .all(|m| m.direction == Direction::ToCache
                    && m.reason == MoveReason::AcceleratorWaits)
        );
        assert_within_budget(&with, all_rows);
    }
}

#[test]
fn the_cache_never_exceeds_the_budget_or_the_free_device_memory() {
    let (mut cfg, work, all_rows) = setup(120, 11);
    let alpha = calibrate(&cfg, &work, 3.0);
    // A budget of a fifth of the hot rows.
    let budget = all_rows / 5;
    cfg.monitor = Some(MonitorConfig::with_budget(budget));
    let r = simulate(&cfg, &work, Scripted(costs(alpha))).unwrap();
    assert!(!r.moves.is_empty());
    assert_within_budget(&r, budget);
    assert_eq!(
        r.totals.max_cache_bytes,
        budget / cfg.model.feature_row_bytes() * cfg.model.feature_row_bytes()
    );
    // Free device memory smaller than the budget: the free memory decides.
    let free = all_rows / 10;
    cfg.monitor = Some(MonitorConfig::with_budget(all_rows));
    cfg.device_memory_bytes = cfg.training_bytes + free;
    let r = simulate(&cfg, &work, Scripted(costs(alpha))).unwrap();
    assert_within_budget(&r, free);
    assert!(r.totals.max_cache_bytes > free / 2);
}

#[test]
fn a_fast_cpu_takes_the_work_back() {
    let (mut cfg, work, all_rows) = setup(160, 12);
    let alpha = calibrate(&cfg, &work, 0.3);
    cfg.monitor = Some(MonitorConfig::with_budget(all_rows));
    cfg.initial_cpu = Some(work.hot_count() / 4);
    let r = simulate(&cfg, &work, Scripted(costs(alpha))).unwrap();
    assert!(!r.moves.is_empty());
    assert!(r
        .moves
        .iter()
        .all(|m| m.direction == Direction::ToCpu && m.reason == MoveReason::CpuIdle));
    let first = r.super_batches.first().unwrap().split;
    let last = r.super_batches.last().unwrap().split;
    assert!(
        last.cpu() > first.cpu() && last.cached() < first.cached(),
        "{first:?} → {last:?}"
    );
    assert_eq!(
        last.cached(),
        0,
        "a CPU this fast takes every hot vertex back"
    );
    assert!(r.totals.acc_wait_hot_s < 0.05 * r.totals.epoch_s);
}

#[test]
fn a_steady_workload_does_not_make_the_monitor_oscillate() {
    // 60 super-batches of a steady workload, CPUs from slightly to very slow.
    for ratio in [1.3, 2.0, 3.0, 5.0] {
        for init in [None, Some(500)] {
            let (mut cfg, work, all_rows) = setup(240, 11);
            let alpha = calibrate(&cfg, &work, ratio);
            cfg.monitor = Some(MonitorConfig::with_budget(all_rows));
            cfg.initial_cpu = init;
            let r = simulate(&cfg, &work, Scripted(costs(alpha))).unwrap();
            let rev = reversals(&r);
            assert!(
                rev <= 3,
                "ratio {ratio} init {init:?}: {rev} direction changes {:?}",
                r.moves
            );
            // After the first 20 super-batches only small corrections remain.
            for m in r.moves.iter().filter(|m| m.decided_after >= 20) {
                assert!(
                    m.vertices.len() as u32 <= work.hot_count() / 20,
                    "ratio {ratio} init {init:?}: late move {m:?}"
                );
            }
        }
    }
}

#[test]
fn noisy_costs_keep_the_moves_bounded() {
    let (mut cfg, work, all_rows) = setup(240, 13);
    let alpha = calibrate(&cfg, &work, 2.0);
    cfg.monitor = Some(MonitorConfig::with_budget(all_rows));
    for seed in 0..4 {
        let noisy = RandomCosts::new(Scripted(costs(alpha)), seed, 1.3, 0.02, 3.0).unwrap();
        let r = simulate(&cfg, &work, noisy).unwrap();
        assert!(r.moves.len() <= 20, "seed {seed}: {} moves", r.moves.len());
        assert!(
            reversals(&r) <= 8,
            "seed {seed}: {} reversals",
            reversals(&r)
        );
        assert_within_budget(&r, all_rows);
    }
}

#[test]
fn moves_are_traced_and_applied_from_their_effective_super_batch() {
    let (mut cfg, work, all_rows) = setup(120, 11);
    let alpha = calibrate(&cfg, &work, 2.0);
    cfg.monitor = Some(MonitorConfig::with_budget(all_rows));
    let r = simulate(&cfg, &work, Scripted(costs(alpha))).unwrap();
    let d = cfg.pipeline.depth() as u64;
    let mut split = r.super_batches[0].split;
    let mut next = r.moves.iter().peekable();
    for s in &r.super_batches {
        while let Some(m) = next.next_if(|m| m.effective_from <= s.index) {
            assert_eq!(m.effective_from, m.decided_after + 1 + d);
            assert_eq!(m.before, split);
            split = m.after;
        }
        assert_eq!(s.split, split, "super-batch {}", s.index);
    }
}
