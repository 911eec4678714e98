//! Simulates one synthetic workload through the super-batch protocol under a few
//! staleness settings, with and without the monitor, and prints a table.
//!
//! `cargo run -p scheduler --example simulate -- [batches] [seed]`

use scheduler::{
    simulate, CostModel, ModelShape, MonitorConfig, OnLate, SimConfig, StalenessRule,
    SyntheticWorkload,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let batches: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(2000);
    let seed: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1);
    let work = SyntheticWorkload::small(batches, seed).generate()?;
    let model = ModelShape::new(602, 128, 3, 10)?;
    println!(
        "{batches} batches, hot set {} (synthetic, seed {seed}), model f=602 h=128 L=3 fanout 10, \
         N=4 D=1, 4 CPU workers",
        work.hot_count()
    );
    println!(
        "{:<30} {:>8} {:>6} {:>6} {:>9} {:>8} {:>6} {:>7} {:>6} {:>5}",
        "run",
        "epoch_s",
        "acc%",
        "cpu%",
        "hotwait_s",
        "PCIe_MB",
        "maxgap",
        "cold",
        "urgent",
        "moves"
    );
    let on_time = SimConfig::layer(model)?.pipeline.on_time_gap();
    let runs = [
        ("bound 7, wait", on_time, OnLate::Wait, 1.0, false),
        ("bound 7, compute", on_time, OnLate::Compute, 1.0, false),
        ("bound 3, wait", 3, OnLate::Wait, 1.0, false),
        ("bound 0, wait", 0, OnLate::Wait, 1.0, false),
        ("CPU /8, bound 7, wait", on_time, OnLate::Wait, 0.125, false),
        (
            "CPU /8, bound 7, compute",
            on_time,
            OnLate::Compute,
            0.125,
            false,
        ),
        (
            "CPU /8, bound 7, wait, monitor",
            on_time,
            OnLate::Wait,
            0.125,
            true,
        ),
    ];
    for (name, bound, on_late, cpu_speed, monitor) in runs {
        let mut cfg = SimConfig::layer(model)?;
        cfg.staleness = StalenessRule::new(bound, on_late);
        if monitor {
            cfg.monitor = Some(MonitorConfig::with_budget(
                work.hot_count() as u64 * model.feature_row_bytes(),
            ));
        }
        let mut costs = CostModel::reference();
        costs.cpu.flops_per_s *= cpu_speed;
        costs.cpu.mem_bytes_per_s *= cpu_speed;
        costs.cpu.sample_edges_per_s *= cpu_speed;
        let r = simulate(&cfg, &work, costs)?;
        let t = &r.totals;
        println!(
            "{:<30} {:>8.4} {:>5.1}% {:>5.1}% {:>9.4} {:>8.1} {:>6} {:>7} {:>6} {:>5}",
            name,
            t.epoch_s,
            100.0 * t.acc_busy_fraction,
            100.0 * t.cpu_busy_fraction,
            t.acc_wait_hot_s,
            t.pcie_bytes as f64 / 1e6,
            r.stats.gaps.max().map_or("-".into(), |g| g.to_string()),
            r.stats.computed_cold,
            r.stats.urgent_jobs,
            t.moves
        );
    }
    Ok(())
}
