//! Simulates one synthetic workload under every orchestration and prints a table.
//!
//! `cargo run -p scheduler --example simulate -- [batches] [seed]`

use scheduler::{
    simulate, CostModel, ModelShape, MonitorConfig, OnLate, Orchestration, SimConfig,
    StalenessRule, SyntheticWorkload,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let batches: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(2000);
    let seed: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1);
    let work = SyntheticWorkload::small(batches, seed).generate()?;
    let model = ModelShape::new(602, 128, 3, 10)?;
    println!(
        "{batches} batches, hot set {} (synthetic, seed {seed}), model f=602 h=128 L=3 fanout 10",
        work.hot_count()
    );
    println!(
        "{:<24} {:>9} {:>7} {:>7} {:>9} {:>9} {:>8} {:>6} {:>6}",
        "orchestration",
        "epoch_s",
        "acc%",
        "cpu%",
        "hotwait_s",
        "PCIe_MB",
        "maxgap",
        "late",
        "moves"
    );
    for (orch, monitor) in Orchestration::ALL
        .iter()
        .map(|&o| (o, false))
        .chain([(Orchestration::Layer, true)])
    {
        let mut cfg = SimConfig::layer(model)?;
        cfg.orchestration = orch;
        cfg.staleness = StalenessRule::new(cfg.pipeline.on_time_gap(), OnLate::Wait);
        if monitor {
            cfg.monitor = Some(MonitorConfig::with_budget(
                work.hot_count() as u64 * model.feature_row_bytes(),
            ));
        }
        let r = simulate(&cfg, &work, CostModel::reference())?;
        let t = &r.totals;
        let name = if monitor {
            format!("{orch} + monitor")
        } else {
            orch.to_string()
        };
        println!(
            "{:<24} {:>9.4} {:>6.1}% {:>6.1}% {:>9.4} {:>9.1} {:>8} {:>6} {:>6}",
            name,
            t.epoch_s,
            100.0 * t.acc_busy_fraction,
            100.0 * t.cpu_busy_fraction,
            t.acc_wait_hot_s,
            t.pcie_bytes as f64 / 1e6,
            r.gaps.max().map_or("-".into(), |g| g.to_string()),
            t.late_computed,
            t.moves
        );
    }
    Ok(())
}
