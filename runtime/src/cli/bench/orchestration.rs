//! `tandem bench orchestration`: one config trained under all five placements
//! (`orchestration.policy`), each traced, compared in one table.
//!
//! 1. The config is resolved once; when `device.kind` resolves to the host, the
//!    report says that the host backend stands in for the accelerator.
//! 2. Each policy trains from the same seed for the same epochs: the step-based
//!    ones with `hot_ratio = 0`, `"layer"` with the config's `hot_ratio` (0.2
//!    when it is 0).
//! 3. Per policy: the mean training time of the epochs after the first (the only
//!    one when there is one), the accelerator and CPU busy fractions of the run's
//!    trace, the engine's host → device bytes per epoch, and the test accuracy at
//!    the best validation epoch.
//!
//! The steps are functions of their own ([`bench_base_config`], [`policy_config`],
//! [`measure_policy`]) so that [`super::regimes`] runs the same measurement on
//! generated datasets across cache sizes and feature widths.

use std::fmt;

use scheduler::Orchestration;

use crate::config::{DeviceKind, TrainConfig};
use crate::data::dataset::Dataset;
use crate::error::{Error, Result};
use crate::session::control::test_at_best_val;
use crate::trace::{fmt_bytes, summarize, Tracer};
use crate::TrainerBuilder;

/// `hot_ratio` of the `"layer"` row when the config's is 0.
pub const DEFAULT_LAYER_HOT_RATIO: f64 = 0.2;

/// A policy the benches train: a fixed placement, or `"auto"` (which measures
/// them in its first batches and keeps the fastest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchPolicy {
    /// One of the five placements.
    Fixed(Orchestration),
    /// `orchestration.policy = "auto"`.
    Auto,
}

impl BenchPolicy {
    /// Every policy the benches train, in table order: the five placements, then
    /// `"auto"`.
    pub const ALL: [BenchPolicy; 6] = [
        BenchPolicy::Fixed(Orchestration::Layer),
        BenchPolicy::Fixed(Orchestration::CpuSampleCpuGather),
        BenchPolicy::Fixed(Orchestration::GpuSampleCpuGather),
        BenchPolicy::Fixed(Orchestration::CpuSampleGpuGather),
        BenchPolicy::Fixed(Orchestration::GpuSampleGpuGather),
        BenchPolicy::Auto,
    ];

    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fixed(o) => o.name(),
            Self::Auto => "auto",
        }
    }

    /// The policy a row names (`None` for an unknown name).
    pub fn of_name(name: &str) -> Option<Self> {
        if name == "auto" {
            return Some(Self::Auto);
        }
        name.parse().ok().map(Self::Fixed)
    }
}

/// One policy's row of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyRow {
    /// The policy's config name.
    pub policy: &'static str,
    /// `orchestration.hot_ratio` it ran with.
    pub hot_ratio: f64,
    /// Mean training seconds per epoch, over the epochs after the first.
    pub epoch_secs: f64,
    /// Fraction of the trace's wall time an accelerator track was busy.
    pub acc_busy: f64,
    /// Fraction of the trace's wall time a CPU track was busy.
    pub cpu_busy: f64,
    /// Host → device bytes per epoch (the engine's counter).
    pub h2d_per_epoch: u64,
    /// Test accuracy at the best validation epoch (`None`: never evaluated).
    pub test_acc: Option<f64>,
    /// `"auto"`: what it chose (the placement, and the CPU split for `"layer"`).
    pub chose: Option<String>,
    /// The layer pipeline's hot rows: uses per CPU-computed row and rows
    /// carried across super-batches, over the run (`None`: it did not run).
    pub hot_rows: Option<(Option<f64>, u64)>,
}

/// The table of [`bench_orchestration`].
#[derive(Clone, Debug, PartialEq)]
pub struct OrchestrationReport {
    /// The device engine the runs used.
    pub device: String,
    /// What the bench changed in the config, if anything.
    pub notes: Vec<String>,
    /// Epochs per run.
    pub epochs: usize,
    /// One row per policy, in [`BenchPolicy::ALL`]'s order.
    pub rows: Vec<PolicyRow>,
    /// The test split's chance level ([`Dataset::chance_accuracy`]).
    pub chance_acc: f64,
    /// The runs trained on the host backend (the CPU stood in for the
    /// accelerator): the columns are named for what it did.
    pub on_host: bool,
}

/// What the host backend's column headers mean, printed above its tables.
pub(crate) const HOST_COLUMNS: &str = "(hb: the host backend, the CPU doing the accelerator's \
     part; copy: bytes it copied into its buffers)";

/// The headers of the busy and bytes columns: an accelerator's, or (on the
/// host backend) the host backend's, whose "uploads" are copies in host memory.
pub(crate) fn device_columns(on_host: bool) -> (&'static str, &'static str) {
    if on_host {
        ("hb busy", "copy/epoch")
    } else {
        ("acc busy", "h2d/epoch")
    }
}

/// Whether `device.kind` resolves to the host (`"host"`, or `"auto"` without a
/// usable GPU).
pub(crate) fn resolves_to_host(cfg: &TrainConfig) -> bool {
    match cfg.device.kind {
        DeviceKind::Host => true,
        DeviceKind::Cuda => false,
        DeviceKind::Auto => gpu_ops::CudaBackend::new(cfg.device.ordinal as usize).is_err(),
    }
}

/// The config every policy run starts from (module doc, step 1): `cfg` with
/// `train.epochs = epochs` when given (0 is an error naming `--epochs`). Returns
/// it with the notes saying what the numbers mean.
pub fn bench_base_config(
    cfg: &TrainConfig,
    epochs: Option<usize>,
) -> Result<(TrainConfig, Vec<String>)> {
    let mut base = cfg.clone();
    if let Some(e) = epochs {
        if e == 0 {
            return Err(Error::invalid_argument(
                "--epochs",
                "expected at least 1, found 0",
            ));
        }
        base.train.epochs = e;
    }
    let mut notes = Vec::new();
    if resolves_to_host(&base) {
        notes.push(
            "device.kind resolves to the host: the host backend stands in for the \
             accelerator (its times say nothing about GPU speed)"
                .to_string(),
        );
    }
    Ok((base, notes))
}

/// `hot_ratio` of the `"layer"` runs: the config's, or
/// [`DEFAULT_LAYER_HOT_RATIO`] when it is 0.
pub fn layer_hot_ratio(base: &TrainConfig) -> f64 {
    if base.orchestration.hot_ratio > 0.0 {
        base.orchestration.hot_ratio
    } else {
        DEFAULT_LAYER_HOT_RATIO
    }
}

/// Whether `policy` is one of the four step-based placements (no embedding
/// reuse), the baselines a regime's ratios are taken against.
pub fn is_step_based(policy: BenchPolicy) -> bool {
    matches!(
        policy,
        BenchPolicy::Fixed(
            Orchestration::CpuSampleCpuGather
                | Orchestration::GpuSampleCpuGather
                | Orchestration::CpuSampleGpuGather
                | Orchestration::GpuSampleGpuGather
        )
    )
}

/// `base` set to run `policy` (module doc, step 2): step-based policies with
/// `hot_ratio = 0`, the others (`"layer"`, and `"auto"`'s layer-based candidate)
/// with [`layer_hot_ratio`].
pub fn policy_config(base: &TrainConfig, policy: BenchPolicy) -> TrainConfig {
    let mut c = base.clone();
    c.orchestration.policy = match policy {
        BenchPolicy::Fixed(o) => scheduler::Policy::Fixed(o),
        BenchPolicy::Auto => scheduler::Policy::Auto,
    };
    c.orchestration.hot_ratio = if is_step_based(policy) {
        0.0
    } else {
        layer_hot_ratio(base)
    };
    c
}

/// One measured run: the row, and the trainer's device note.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyRun {
    /// The measurements (module doc, step 3).
    pub row: PolicyRow,
    /// [`crate::Trainer::device_note`] of the run.
    pub device: String,
    /// The test split's chance level ([`Dataset::chance_accuracy`]).
    pub chance_acc: f64,
}

/// Trains `cfg` once, traced, on `dataset` (or what `cfg.data` names when
/// `None`) and measures the run (module doc, step 3). The row is named after
/// `cfg.orchestration.policy`.
pub fn measure_policy(cfg: TrainConfig, dataset: Option<Dataset>) -> Result<PolicyRun> {
    let policy = if cfg.orchestration.is_auto() {
        BenchPolicy::Auto
    } else {
        BenchPolicy::Fixed(cfg.orchestration.orchestration())
    };
    let mut builder = TrainerBuilder::new(cfg);
    if let Some(ds) = dataset {
        builder = builder.dataset(ds);
    }
    let mut trainer = builder.build()?;
    let tracer = Tracer::new();
    trainer.set_tracer(tracer.clone());
    let stats = trainer.fit()?;
    let summary = summarize(&tracer.collect());
    // The epochs after the first, and after `"auto"` finished measuring.
    let timed: Vec<f64> = stats
        .iter()
        .skip(1)
        .filter(|s| !s.calibrating)
        .map(|s| s.train_secs)
        .collect();
    let timed = if timed.is_empty() {
        stats.iter().map(|s| s.train_secs).collect()
    } else {
        timed
    };
    let wall = summary.wall.max(1) as f64;
    let row = PolicyRow {
        policy: policy.name(),
        hot_ratio: trainer.config().orchestration.hot_ratio,
        epoch_secs: timed.iter().sum::<f64>() / timed.len().max(1) as f64,
        acc_busy: summary.acc_busy.unwrap_or(0) as f64 / wall,
        cpu_busy: summary.cpu_busy as f64 / wall,
        h2d_per_epoch: trainer.h2d_bytes() / stats.len().max(1) as u64,
        test_acc: test_at_best_val(&stats).map(|(_, t)| t),
        hot_rows: trainer
            .orchestration_totals()
            .map(|o| (o.protocol.uses_per_computed_row(), o.protocol.rows_carried)),
        chose: trainer.auto_choice().map(|c| {
            if c.policy == Orchestration::Layer {
                format!("layer (cpu split {})", c.cpu_split)
            } else {
                c.policy.name().to_string()
            }
        }),
    };
    Ok(PolicyRun {
        row,
        device: trainer.device_note().to_string(),
        chance_acc: trainer
            .dataset()
            .chance_accuracy(&trainer.dataset().test_ids()),
    })
}

/// Trains `cfg` (with `epochs` epochs when given) under every policy and measures
/// each run; see the module doc.
pub fn bench_orchestration(
    cfg: &TrainConfig,
    epochs: Option<usize>,
) -> Result<OrchestrationReport> {
    let (base, notes) = bench_base_config(cfg, epochs)?;
    let on_host = resolves_to_host(&base);
    let mut rows = Vec::new();
    let (mut device, mut chance_acc) = (String::new(), 0.0);
    for policy in BenchPolicy::ALL {
        let run = measure_policy(policy_config(&base, policy), None)?;
        device = run.device;
        chance_acc = run.chance_acc;
        rows.push(run.row);
    }
    Ok(OrchestrationReport {
        device,
        notes,
        epochs: base.train.epochs,
        rows,
        chance_acc,
        on_host,
    })
}

impl fmt::Display for OrchestrationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        writeln!(
            f,
            "{}; {} per policy; test acc against chance {:.4} (the test split's most \
             frequent class)",
            self.device,
            crate::trace::fmt_count(self.epochs, "epoch"),
            self.chance_acc
        )?;
        let (busy, bytes) = device_columns(self.on_host);
        if self.on_host {
            writeln!(f, "{HOST_COLUMNS}")?;
        }
        writeln!(
            f,
            "{:<22} {:>9} {:>9} {:>8} {:>8} {:>12} {:>9}",
            "policy", "hot_ratio", "epoch s", busy, "cpu busy", bytes, "test acc"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<22} {:>9.2} {:>9.3} {:>7.1}% {:>7.1}% {:>12} {:>9}",
                r.policy,
                r.hot_ratio,
                r.epoch_secs,
                r.acc_busy * 100.0,
                r.cpu_busy * 100.0,
                fmt_bytes(r.h2d_per_epoch),
                r.test_acc.map_or_else(|| "-".into(), |a| format!("{a:.4}")),
            )?;
        }
        for r in &self.rows {
            if let Some(c) = &r.chose {
                writeln!(f, "  (auto chose {c})")?;
            }
            if let Some((per_row, carried)) = r.hot_rows {
                let per_row = per_row.map_or_else(|| "-".into(), |u| format!("{u:.2}"));
                writeln!(
                    f,
                    "  ({}: {per_row} uses per computed hot row, {carried} rows carried across super-batches)",
                    r.policy
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn try_cfg(extra: &[&str]) -> crate::Result<TrainConfig> {
        let mut sets: Vec<String> = vec![
            "model.kind=\"sage\"".into(),
            "model.hidden=32".into(),
            "train.epochs=3".into(),
            "train.batch_size=128".into(),
            "train.lr=0.01".into(),
            "data.synthetic.vertices=3000".into(),
            "data.synthetic.edges=20000".into(),
            "data.synthetic.classes=4".into(),
            "data.synthetic.dim=16".into(),
            "data.synthetic.homophily=0.9".into(),
            "data.synthetic.signal=0.4".into(),
            "device.kind=\"host\"".into(),
            // Every row (3000 × 16 × 4 B) fits: a device gather never reads the host.
            "device.cache_bytes=1000000".into(),
            "threads.compute=1".into(),
        ];
        sets.extend(extra.iter().map(|s| s.to_string()));
        TrainConfig::from_toml_with_overrides("", std::path::Path::new("test"), &sets).and_then(
            |c| {
                c.validate()?;
                Ok(c)
            },
        )
    }

    fn cfg(extra: &[&str]) -> TrainConfig {
        try_cfg(extra).expect("config")
    }

    #[test]
    fn every_policy_trains_to_the_device_path_accuracy_and_host_gathers_move_more_bytes() {
        let report = bench_orchestration(&cfg(&[]), None).expect("bench");
        // The five placements and "auto".
        assert_eq!(report.rows.len(), 6);
        let row = |name: &str| {
            report
                .rows
                .iter()
                .find(|r| r.policy == name)
                .unwrap_or_else(|| panic!("no row {name}"))
        };
        let reference = row("gpu-sample-gpu-gather");
        let ref_acc = reference.test_acc.expect("evaluated");
        assert!(ref_acc > 0.5, "the reference run did not learn: {ref_acc}");
        for r in &report.rows {
            let acc = r.test_acc.expect("evaluated");
            assert!(
                (acc - ref_acc).abs() <= 0.01,
                "{}: test accuracy {acc} vs {ref_acc}",
                r.policy
            );
            assert!(r.h2d_per_epoch > 0, "{}: no bytes counted", r.policy);
        }
        // With every row cached, a device gather uploads labels only; a host gather
        // uploads every input row, and host sampling uploads the blocks.
        for host in ["cpu-sample-cpu-gather", "gpu-sample-cpu-gather"] {
            for dev in ["cpu-sample-gpu-gather", "gpu-sample-gpu-gather"] {
                assert!(
                    row(host).h2d_per_epoch > row(dev).h2d_per_epoch,
                    "{host} {} vs {dev} {}",
                    row(host).h2d_per_epoch,
                    row(dev).h2d_per_epoch
                );
            }
        }
        assert!(row("cpu-sample-gpu-gather").h2d_per_epoch > reference.h2d_per_epoch);
        assert_eq!(row("layer").hot_ratio, 0.2);
    }
}
