//! The staleness guarantee, checked over many simulated batches and random cost
//! scripts: no reuse ever exceeds the bound, whatever the costs, the pipeline
//! shape, the bound, the publication cadence and the late policy.
//!
//! Every check recomputes from the run's trace, independently of the protocol's
//! and the simulator's own bookkeeping, following the protocol's steps 2, 4, 5
//! and 9 (`scheduler::protocol`): a publication publishes the training steps
//! finished before it; a CPU job stamps the newest publication finished before
//! it started; an install uploads its computation's rows; a chunk's rows are
//! readable by a batch once an install of them finished before the batch's
//! step; and a batch may only have used, per chunk of its super-batch's queue
//! that it reads, the newest installed rows of that chunk. That replay runs
//! without reuse across super-batches; with it, the simulator's own device
//! model (slab and store versions as the actions leave them) checks every row
//! a batch reads, and the runs are compared with the runs without reuse.

use scheduler::{
    simulate, CostModel, Device, ModelShape, MonitorConfig, OnLate, PipelineConfig, Publication,
    RandomCosts, SimConfig, SimReport, StalenessRule, SyntheticWorkload, VertexClass, WorkKind,
    Workload,
};

use cpu_ops::Rng;

/// A random scenario for `seed`: pipeline shape, bound, workers, CPU speed, costs.
fn scenario(
    seed: u64,
    on_late: OnLate,
    reuse: bool,
) -> (SimConfig, Workload, RandomCosts<CostModel>) {
    let mut rng = Rng::new(seed);
    let n = 1 + rng.below(6) as usize;
    let depth = rng.below(3) as usize;
    let chunk = [8, 32, 128][rng.below(3) as usize];
    let pipeline = PipelineConfig::new(n, depth, chunk)
        .and_then(|p| p.with_min_chunks(1 + rng.below(4) as usize))
        .unwrap();
    let natural = pipeline.on_time_gap();
    let bound = match rng.below(6) {
        0 => 0,
        1 => 1,
        2 => natural / 2,
        3 => natural,
        4 => natural + rng.below(6),
        // Room for rows kept across super-batches.
        _ => natural + (n * (1 + depth)) as u64 * (1 + rng.below(3)),
    };
    let model = ModelShape::new(64, 64, 2 + rng.below(2) as u32, 5 + rng.below(10) as u32).unwrap();
    let mut cfg = SimConfig::layer(model).unwrap();
    cfg.pipeline = pipeline;
    cfg.staleness = StalenessRule::new(bound, on_late);
    cfg.cpu_workers = 1 + rng.below(4) as u32;
    cfg.record_trace = true;
    cfg.reuse = reuse;
    let mut synth = SyntheticWorkload::small(150 + rng.below(150) as usize, seed ^ 0xABCD);
    synth.hot_count = [0, 50, 500, 2000][rng.below(4) as usize];
    synth.hot_draws = if synth.hot_count == 0 {
        0
    } else {
        20 + rng.below(300) as u32
    };
    let work = synth.generate().unwrap();
    if rng.below(2) == 0 && work.hot_count() > 0 {
        let mut m =
            MonitorConfig::with_budget(work.hot_count() as u64 * model.feature_row_bytes() / 2);
        m.warmup = 1;
        cfg.monitor = Some(m);
    }
    // CPU from 30x slower to 3x faster than the reference rates.
    let mut costs = CostModel::reference();
    let speed = (rng.next_f64() * 4.6 - 3.4).exp();
    costs.cpu.flops_per_s *= speed;
    costs.cpu.mem_bytes_per_s *= speed;
    costs.cpu.sample_edges_per_s *= speed;
    let spread = 1.0 + 2.0 * rng.next_f64();
    let random = RandomCosts::new(costs, seed, spread, 0.05, 10.0).unwrap();
    // The runtime's cadence (from the bound) most of the time, either one forced
    // otherwise: the bound must hold under both.
    cfg.publication = match rng.below(4) {
        0 => Some(Publication::EverySuperBatch),
        1 => Some(Publication::EveryBatch),
        _ => None,
    };
    (cfg, work, random)
}

/// The independent check of one run (see the file doc); returns the number of
/// late vertices it counted.
fn check_run(cfg: &SimConfig, work: &Workload, r: &SimReport) -> u64 {
    let bound = cfg.staleness.bound();
    let n = cfg.pipeline.batches_per_super_batch() as u64;
    let of = |kind: WorkKind| {
        r.trace
            .iter()
            .enumerate()
            .filter(move |(_, s)| s.kind == kind)
    };
    // Publications: the version is the training steps finished at their start.
    let mut step_ends: Vec<f64> = of(WorkKind::Train).map(|(_, s)| s.end_s).collect();
    step_ends.sort_by(f64::total_cmp);
    let mut publications: Vec<(f64, u64)> = Vec::new();
    for (i, s) in of(WorkKind::Publish) {
        let v = step_ends.partition_point(|&e| e <= s.start_s) as u64;
        assert_eq!(s.version, Some(v), "version of publication {i}");
        publications.push((s.end_s, v));
    }
    publications.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert_eq!(publications.len() as u64, r.stats.publications);
    // One publication after every super-batch's last batch, and after every
    // batch when the cadence says so.
    let per_batch = cfg.effective_publication() == Publication::EveryBatch;
    let published: std::collections::HashSet<u64> = publications.iter().map(|p| p.1).collect();
    for b in 0..work.len() as u64 {
        let last = b % n == n - 1 || b + 1 == work.len() as u64;
        if per_batch || last {
            assert!(
                published.contains(&(b + 1)),
                "no publication after batch {b}"
            );
        }
    }
    // CPU jobs stamp the newest publication finished at their start.
    let newest_at = |t: f64| {
        publications
            .iter()
            .take_while(|p| p.0 <= t)
            .map(|p| p.1)
            .max()
            .unwrap_or(0)
    };
    for (i, s) in of(WorkKind::HotCompute) {
        assert_eq!(s.device, Device::Cpu);
        assert_eq!(s.version, Some(newest_at(s.start_s)), "stamp of job {i}");
    }
    // Installs: (end, super-batch, chunk, the stamp of the computation uploaded).
    let mut installs: Vec<(f64, u64, u32, u64)> = Vec::new();
    for (i, s) in of(WorkKind::Install) {
        assert_eq!(s.device, Device::Accelerator);
        let src = &r.trace[s.source.unwrap_or_else(|| panic!("install {i} of nothing"))];
        assert_eq!(src.kind, WorkKind::HotCompute);
        assert!(src.end_s <= s.start_s, "install {i} before its rows");
        assert_eq!((src.super_batch, src.chunk), (s.super_batch, s.chunk));
        assert_eq!(s.version, src.version, "install {i}");
        installs.push((s.end_s, s.super_batch, s.chunk.unwrap(), s.version.unwrap()));
    }
    installs.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert_eq!(installs.len() as u64, r.stats.installs);
    // Gates: replay each super-batch's slab up to each batch's step.
    let mut trains: Vec<(u64, f64, Option<u64>)> = of(WorkKind::Train)
        .map(|(_, s)| (s.batch.unwrap(), s.start_s, s.version))
        .collect();
    trains.sort_by(|a, b| a.1.total_cmp(&b.1));
    assert_eq!(trains.len(), work.len());
    let mut slab: std::collections::HashMap<(u64, u32), u64> = Default::default();
    let mut next = 0;
    let mut late_total = 0u64;
    let mut late_per_vertex = vec![0u64; work.hot_count() as usize];
    for (i, &(b, t, version)) in trains.iter().enumerate() {
        assert_eq!(b, i as u64, "batches train in order");
        assert_eq!(version, Some(b), "batch {b} trains at version {b}");
        while next < installs.len() && installs[next].0 <= t {
            let (_, sb, c, v) = installs[next];
            let e = slab.entry((sb, c)).or_insert(v);
            *e = (*e).max(v);
            next += 1;
        }
        let j = b / n;
        let split = r.super_batches[j as usize].split;
        // The queue of super-batch j, cut as the pipeline says.
        let batches = j * n..((j + 1) * n).min(work.len() as u64);
        let mut queue: Vec<u32> = batches
            .flat_map(|k| work.batches()[k as usize].hot.iter().copied())
            .filter(|&u| split.class(u) == VertexClass::CpuHot)
            .collect();
        queue.sort_unstable();
        queue.dedup();
        assert_eq!(queue.len(), r.super_batches[j as usize].queue_len);
        let ranges = cfg.pipeline.chunk_ranges(queue.len());
        let rec = &r.batches[b as usize];
        let mut max_gap = None;
        let mut late = 0u32;
        let mut used = 0u32;
        for &u in &work.batches()[b as usize].hot {
            if split.class(u) != VertexClass::CpuHot {
                continue;
            }
            let pos = queue.binary_search(&u).unwrap();
            let c = ranges.partition_point(|r| r.end <= pos) as u32;
            match slab.get(&(j, c)) {
                Some(&e) if b - e <= bound => {
                    used += 1;
                    max_gap = max_gap.max(Some(b - e));
                }
                _ => {
                    late += 1;
                    late_per_vertex[u as usize] += 1;
                }
            }
        }
        match cfg.staleness.on_late() {
            OnLate::Wait => assert_eq!(late, 0, "batch {b} passed its gate with late vertices"),
            OnLate::Compute => assert_eq!(late, rec.late_computed, "batch {b}"),
        }
        assert_eq!(used, rec.hot_used, "batch {b}");
        assert_eq!(max_gap, rec.max_gap, "batch {b}");
        if let Some(g) = max_gap {
            assert!(g <= bound, "batch {b}: gap {g} > bound {bound}");
        }
        late_total += late as u64;
    }
    assert_eq!(late_per_vertex, r.cold_computed);
    late_total
}

#[test]
fn no_reuse_ever_exceeds_the_bound_over_ten_thousand_random_batches() {
    let mut batches = 0;
    let mut late = [0u64; 2];
    let mut urgent = 0u64;
    let mut reuses = 0u64;
    let mut seed = 0;
    while batches < 20_000 || seed < 40 {
        for (i, on_late) in [OnLate::Wait, OnLate::Compute].into_iter().enumerate() {
            let (cfg, work, costs) = scenario(seed, on_late, false);
            let r = simulate(&cfg, &work, costs).unwrap_or_else(|e| {
                panic!(
                    "seed {seed} {on_late}: {e} {cfg:?} hot {}",
                    work.hot_count()
                )
            });
            let bound = cfg.staleness.bound();
            let st = &r.stats;
            assert!(
                st.gaps.max().is_none_or(|g| g <= bound),
                "seed {seed}: max gap {:?} > bound {bound}",
                st.gaps.max()
            );
            assert_eq!(st.gaps.total(), st.hot_uses);
            let used: u64 = r.batches.iter().map(|b| b.hot_used as u64).sum();
            assert_eq!(used, st.hot_uses);
            late[i] += check_run(&cfg, &work, &r);
            match on_late {
                OnLate::Wait => {
                    assert_eq!(st.computed_cold, 0);
                    urgent += st.urgent_jobs;
                    let sent: u64 = r.batches.iter().map(|b| b.urgent_jobs as u64).sum();
                    assert_eq!(sent, st.urgent_jobs);
                }
                OnLate::Compute => {
                    assert_eq!(st.urgent_jobs, 0);
                    assert_eq!(st.computed_cold, r.cold_computed.iter().sum::<u64>());
                }
            }
            reuses += st.hot_uses;
            batches += work.len();
        }
        seed += 1;
    }
    println!("{seed} seeds, {batches} batches, {reuses} reuses, {urgent} urgent tasks, {} late vertices computed cold", late[1]);
    // The scenarios must exercise both the happy path and the late paths.
    assert!(reuses > 100_000, "{reuses}");
    assert!(urgent > 0, "no urgent work in wait mode");
    assert!(late[1] > 0, "nothing was late in compute mode");
    assert_eq!(late[0], 0);
}

#[test]
fn with_an_on_time_cpu_and_the_natural_bound_nothing_is_late() {
    // CPU fast, bound (D + 1) N - 1: after the first super-batch, every embedding
    // is fresh enough (pipeline step 7).
    let model = ModelShape::new(64, 64, 2, 10).unwrap();
    let mut cfg = SimConfig::layer(model).unwrap();
    cfg.staleness = StalenessRule::new(cfg.pipeline.on_time_gap(), OnLate::Compute);
    let work = SyntheticWorkload::small(400, 3).generate().unwrap();
    let mut costs = CostModel::reference();
    costs.cpu.flops_per_s *= 100.0;
    costs.cpu.mem_bytes_per_s *= 100.0;
    costs.cpu.sample_edges_per_s *= 100.0;
    let r = simulate(&cfg, &work, costs).unwrap();
    let n = cfg.pipeline.batches_per_super_batch();
    let late_after_warmup: u32 = r.batches[n..].iter().map(|b| b.late_computed).sum();
    assert_eq!(late_after_warmup, 0);
    assert_eq!(r.stats.gaps.max(), Some(cfg.pipeline.on_time_gap()));
    // A tighter bound makes the rule step in even with an on-time CPU.
    cfg.staleness = StalenessRule::new(1, OnLate::Compute);
    let r = simulate(&cfg, &work, costs).unwrap();
    assert!(r.stats.computed_cold > 0);
    assert!(r.stats.gaps.max().unwrap() <= 1);
}

#[test]
fn the_slow_cpu_shows_up_as_waiting_or_as_cold_work() {
    let model = ModelShape::new(64, 64, 2, 10).unwrap();
    let work = SyntheticWorkload::small(200, 9).generate().unwrap();
    let mut slow = CostModel::reference();
    slow.cpu.flops_per_s /= 50.0;
    slow.cpu.mem_bytes_per_s /= 50.0;
    slow.cpu.sample_edges_per_s /= 50.0;
    let mut cfg = SimConfig::layer(model).unwrap();
    let wait = simulate(&cfg, &work, slow).unwrap();
    cfg.staleness = StalenessRule::new(cfg.staleness.bound(), OnLate::Compute);
    let compute = simulate(&cfg, &work, slow).unwrap();
    assert!(wait.totals.acc_wait_hot_s > 0.1 * wait.totals.epoch_s);
    assert!(compute.totals.acc_wait_hot_s == 0.0);
    assert!(compute.stats.computed_cold > 0);
    assert!(wait.stats.waited > 0 && wait.stats.wait_batches > 0);
    // Late computation is recorded per vertex, and the hottest are late most.
    let head: u64 = compute.cold_computed[..200].iter().sum();
    let tail: u64 = compute.cold_computed[1800..].iter().sum();
    assert!(head > tail, "{head} {tail}");
    // Same inputs, same report.
    assert_eq!(compute, simulate(&cfg, &work, slow).unwrap());
}

/// Reuse across super-batches, over many random scenarios: every row a batch
/// reads is within the bound on the simulated device (the simulator fails the
/// run otherwise); rows are carried whenever the bound leaves room; under a
/// bound too small for any reuse the run is the run without reuse, bit for
/// bit; and reuse never computes more rows than the run without it.
#[test]
fn rows_kept_across_super_batches_never_exceed_the_bound() {
    let mut batches = 0;
    let (mut carried, mut kept, mut fewer) = (0u64, 0u64, 0u64);
    let mut seed = 0;
    let mut identical = 0;
    while batches < 20_000 || seed < 40 {
        for on_late in [OnLate::Wait, OnLate::Compute] {
            let (cfg, work, costs) = scenario(seed, on_late, true);
            let r = simulate(&cfg, &work, costs.clone()).unwrap_or_else(|e| {
                panic!("seed {seed} {on_late}: {e} {cfg:?}");
            });
            let bound = cfg.staleness.bound();
            let st = &r.stats;
            assert!(st.gaps.max().is_none_or(|g| g <= bound), "seed {seed}");
            assert_eq!(st.gaps.total(), st.hot_uses);
            let used: u64 = r.batches.iter().map(|b| b.hot_used as u64).sum();
            assert_eq!(used, st.hot_uses);
            if on_late == OnLate::Wait {
                assert_eq!(st.computed_cold, 0, "seed {seed}");
            }
            // Per super-batch counts add up to the epoch's.
            let sb_carried: u64 = r.super_batches.iter().map(|s| s.hot.carried_rows).sum();
            let sb_uses: u64 = r.super_batches.iter().map(|s| s.hot.uses).sum();
            assert_eq!((sb_carried, sb_uses), (st.rows_carried, st.hot_uses));
            for sb in &r.super_batches {
                assert!(sb.hot.carried_rows <= sb.hot.queue_rows);
                assert_eq!(sb.hot.queue_rows, sb.queue_len as u64);
            }
            let mut off_cfg = cfg.clone();
            off_cfg.reuse = false;
            let off = simulate(&off_cfg, &work, costs).unwrap();
            let n = cfg.pipeline.batches_per_super_batch() as u64;
            let room = bound >= cfg.pipeline.depth().max(1) as u64 * n;
            if !room {
                assert_eq!(st.rows_carried + st.rows_kept, 0, "seed {seed}");
                assert_eq!((&r.stats, &r.batches), (&off.stats, &off.batches));
                assert_eq!(r.trace, off.trace, "seed {seed}");
                identical += 1;
            }
            if st.rows_carried > 0 {
                // Carried rows are rows not queued again.
                let queued: u64 = r.super_batches.iter().map(|s| s.hot.queue_rows).sum();
                let queued_off: u64 = off.super_batches.iter().map(|s| s.hot.queue_rows).sum();
                if queued == queued_off && off.stats.rows_computed > st.rows_computed {
                    fewer += 1;
                }
            }
            carried += st.rows_carried;
            kept += st.rows_kept;
            batches += work.len();
        }
        seed += 1;
    }
    println!("{seed} seeds, {batches} batches, {carried} rows carried, {kept} kept, {identical} runs without room identical, {fewer} runs computing fewer rows");
    assert!(carried > 1000, "{carried}");
    assert!(kept >= carried.min(1), "{kept}");
    assert!(identical > 10, "{identical}");
    assert!(fewer > 5, "{fewer}");
}

/// With a fast CPU and a bound of three super-batches, rows computed for one
/// super-batch serve the next: fewer rows are computed for the same batches,
/// each serving more uses, and nothing is late after the first super-batch.
#[test]
fn a_bound_of_three_super_batches_computes_fewer_rows() {
    let model = ModelShape::new(64, 64, 2, 10).unwrap();
    let mut cfg = SimConfig::layer(model).unwrap();
    let n = cfg.pipeline.batches_per_super_batch() as u64;
    cfg.staleness = StalenessRule::new(3 * n - 1, OnLate::Wait);
    let work = SyntheticWorkload::small(400, 3).generate().unwrap();
    let mut costs = CostModel::reference();
    costs.cpu.flops_per_s *= 100.0;
    costs.cpu.mem_bytes_per_s *= 100.0;
    costs.cpu.sample_edges_per_s *= 100.0;
    let on = simulate(&cfg, &work, costs).unwrap();
    cfg.reuse = false;
    let off = simulate(&cfg, &work, costs).unwrap();
    assert_eq!(on.stats.hot_uses, off.stats.hot_uses);
    assert!(on.stats.rows_carried > 0);
    assert!(
        on.stats.rows_computed < off.stats.rows_computed,
        "{} vs {}",
        on.stats.rows_computed,
        off.stats.rows_computed
    );
    let (u_on, u_off) = (
        on.stats.uses_per_computed_row().unwrap(),
        off.stats.uses_per_computed_row().unwrap(),
    );
    assert!(u_on > u_off, "{u_on} vs {u_off}");
    assert!(on.stats.gaps.max().unwrap() < 3 * n);
    println!("uses per computed row {u_off:.2} -> {u_on:.2}");
}
