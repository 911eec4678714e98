//! `tandem bench orchestration --regimes`: the placements compared across
//! feature widths, device-cache sizes and feature row dtypes, to check where
//! layer-based orchestration beats the step-based baselines.
//!
//! 1. A regime is a feature width `dim`, a cache fraction `f` and a row dtype
//!    (`device.feature_dtype`: `f32`, 4 bytes a value, or `bf16`, 2). The fraction
//!    applies to the bytes the rows are stored in: the device cache gets
//!    `ceil(f × vertices × dim × value_bytes)` bytes ([`cache_bytes`]), so `f = 1`
//!    holds every feature row and `f = 0` none, and `f = 0.05` holds 5% of the
//!    rows in either dtype. Regimes run widths outermost, then fractions, then
//!    dtypes.
//! 2. Per width, one R-MAT graph is generated in memory ([`generate_rmat`]) from
//!    the same options and seed, so graph, labels and split are the same for every
//!    width; only the feature columns differ. Every fraction and dtype of that
//!    width trains on it (`bf16` rows are rounded from it when the features load).
//! 3. The config is prepared as in [`bench_orchestration`](super::orchestration::bench_orchestration)
//!    ([`bench_base_config`]: epochs); its `model.precision` (`"fp32"`, or
//!    `"tf32"` with `--set model.precision="tf32"`) is the same for every run and
//!    recorded in the report. Each regime trains every policy of
//!    [`REGIME_POLICIES`] on a copy of the dataset with [`measure_policy`]
//!    (`device.cache_bytes` and `device.feature_dtype` set to the regime's;
//!    step-based policies with `hot_ratio = 0`, the others with
//!    [`layer_hot_ratio`]).
//! 4. Per regime, the best step-based policy is the fastest of the four; every row
//!    gets `best / this` (above 1: faster than it), and the regime a verdict on the
//!    target ([`Verdict`]): where the cache holds at most 20% of the features,
//!    `"layer"` is at least 1.3× as fast as the best step-based policy with a test
//!    accuracy at most 1 point below that policy's.

use std::fmt;
use std::io::Write;
use std::path::Path;

use gpu_ops::FeatureDtype;
use scheduler::Orchestration;
use serde::de::{value::StrDeserializer, Deserialize};

use super::orchestration::{
    bench_base_config, device_columns, is_step_based, layer_hot_ratio, measure_policy,
    policy_config, resolves_to_host, BenchPolicy, PolicyRow, HOST_COLUMNS,
};
use crate::atomic::write_file_atomically;
use crate::config::{ModelPrecision, TrainConfig};
use crate::data::generate::{generate_rmat, RmatOptions};
use crate::error::{Error, Result};
use crate::trace::fmt_bytes;

/// The policies each regime trains, in table order. A new policy is one line
/// here; step-based ones are recognised by [`is_step_based`], anything else runs
/// with the layer `hot_ratio` (`"auto"`: its layer-based candidate's).
pub const REGIME_POLICIES: &[BenchPolicy] = &BenchPolicy::ALL;

/// `"auto"` is on target in a regime when its epoch time is within this fraction
/// of the best fixed policy's.
pub const AUTO_TARGET: f64 = 0.05;

/// The target applies to regimes whose cache holds at most this fraction of the
/// features.
pub const TARGET_MAX_CACHE_FRACTION: f64 = 0.2;
/// Speed-up of `"layer"` over the best step-based policy the target asks for.
pub const TARGET_SPEEDUP: f64 = 1.3;
/// How far (as a fraction, 0.01 = 1 point) `"layer"`'s test accuracy may fall
/// below the best step-based policy's.
pub const TARGET_ACC_DROP: f64 = 0.01;

/// The row dtypes a regime can store its features in, in the order
/// [`row_dtype_names`] lists them.
pub const ROW_DTYPES: [FeatureDtype; 2] = [FeatureDtype::F32, FeatureDtype::Bf16];

/// A row dtype by its `device.feature_dtype` name (`"f32"`, `"bf16"`: the config's
/// serde spelling); `None` for anything else.
pub fn parse_row_dtype(name: &str) -> Option<FeatureDtype> {
    let de: StrDeserializer<'_, serde::de::value::Error> = StrDeserializer::new(name);
    FeatureDtype::deserialize(de).ok()
}

/// The accepted row dtype names, quoted and comma-separated, for error messages:
/// `"f32", "bf16"`.
pub fn row_dtype_names() -> String {
    ROW_DTYPES
        .iter()
        .map(|d| format!("\"{d}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What [`bench_regimes`] runs.
#[derive(Clone, Debug, PartialEq)]
pub struct RegimeOptions {
    /// Feature widths, in table order (each ≥ 1).
    pub dims: Vec<usize>,
    /// Fractions of the stored feature bytes the device cache holds, in table
    /// order (each in `[0, 1]`).
    pub cache_fractions: Vec<f64>,
    /// Feature row dtypes (`device.feature_dtype`), in table order (at least one).
    pub row_dtypes: Vec<FeatureDtype>,
    /// The generated graph; `feature_dim` is replaced by each width.
    pub graph: RmatOptions,
    /// Epochs per run (replaces `train.epochs`; ≥ 1).
    pub epochs: usize,
}

impl RegimeOptions {
    /// Checks the widths, fractions and row dtypes; errors name `--dims`,
    /// `--cache-fractions` or `--row-dtypes`.
    pub fn validate(&self) -> Result<()> {
        if self.dims.is_empty() {
            return Err(Error::invalid_argument(
                "--dims",
                "expected at least one width",
            ));
        }
        if self.dims.contains(&0) {
            return Err(Error::invalid_argument(
                "--dims",
                "a feature width of 0; expected positive integers",
            ));
        }
        if self.cache_fractions.is_empty() {
            return Err(Error::invalid_argument(
                "--cache-fractions",
                "expected at least one fraction",
            ));
        }
        if let Some(f) = self
            .cache_fractions
            .iter()
            .find(|f| !(0.0..=1.0).contains(*f))
        {
            return Err(Error::invalid_argument(
                "--cache-fractions",
                format!("{f} is outside [0, 1]"),
            ));
        }
        if self.row_dtypes.is_empty() {
            return Err(Error::invalid_argument(
                "--row-dtypes",
                format!("expected at least one of {}", row_dtype_names()),
            ));
        }
        Ok(())
    }
}

/// Device-cache bytes of a regime: `ceil(fraction × vertices × dim × value_bytes)`,
/// at most the feature bytes, where `value_bytes` is what `dtype` stores a value in
/// (4 for `f32`, 2 for `bf16`). The fraction is one of the stored bytes, so it is
/// the same fraction of the rows in either dtype.
pub fn cache_bytes(vertices: usize, dim: usize, fraction: f64, dtype: FeatureDtype) -> u64 {
    let bytes = (vertices as u64)
        .saturating_mul(dim as u64)
        .saturating_mul(dtype.value_bytes() as u64);
    ((fraction * bytes as f64).ceil() as u64).min(bytes)
}

/// One regime's runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Regime {
    /// Feature width.
    pub dim: usize,
    /// Fraction of the stored feature bytes the cache holds.
    pub cache_fraction: f64,
    /// `device.feature_dtype` of the runs.
    pub row_dtype: FeatureDtype,
    /// `device.cache_bytes` of the runs ([`cache_bytes`]).
    pub cache_bytes: u64,
    /// The device engine its runs used ([`PolicyRun::device`](super::orchestration::PolicyRun::device)):
    /// it names bf16 feature rows and the matrix precision when they are not f32.
    pub device: String,
    /// One row per policy, in [`REGIME_POLICIES`]' order.
    pub rows: Vec<PolicyRow>,
}

/// A regime's comparison of `"layer"` with the best step-based policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// The fastest step-based policy and its epoch seconds (`None`: no step-based row).
    pub best_step: Option<(&'static str, f64)>,
    /// Best step-based epoch seconds over `"layer"`'s (`None`: a row is missing).
    pub layer_speedup: Option<f64>,
    /// `"layer"`'s test accuracy minus the best step-based policy's (`None`: a row
    /// or an accuracy is missing).
    pub layer_acc_gap: Option<f64>,
    /// Whether the target applies (cache fraction ≤ [`TARGET_MAX_CACHE_FRACTION`]).
    pub applies: bool,
    /// Whether the target holds: `None` where it does not apply or a number is
    /// missing.
    pub holds: Option<bool>,
    /// The fastest fixed policy (the five placements) and its epoch seconds.
    pub best_fixed: Option<(&'static str, f64)>,
    /// `"auto"`'s epoch seconds over the best fixed policy's (`None`: no auto
    /// row), and what it chose.
    pub auto: Option<(f64, Option<String>)>,
}

/// The row's policy (`None` for a name that is not one).
fn policy_of(row: &PolicyRow) -> Option<BenchPolicy> {
    BenchPolicy::of_name(row.policy)
}

impl Regime {
    /// The fastest step-based row.
    pub fn best_step_based(&self) -> Option<&PolicyRow> {
        self.rows
            .iter()
            .filter(|r| policy_of(r).is_some_and(is_step_based))
            .min_by(|a, b| a.epoch_secs.total_cmp(&b.epoch_secs))
    }

    /// `best / row` epoch seconds against [`Regime::best_step_based`] (above 1:
    /// `row` is faster); `None` without a step-based row.
    pub fn ratio(&self, row: &PolicyRow) -> Option<f64> {
        Some(self.best_step_based()?.epoch_secs / row.epoch_secs)
    }

    /// The `"layer"` row.
    pub fn layer(&self) -> Option<&PolicyRow> {
        self.rows
            .iter()
            .find(|r| policy_of(r) == Some(BenchPolicy::Fixed(Orchestration::Layer)))
    }

    /// The fastest row of a fixed policy (not `"auto"`).
    pub fn best_fixed(&self) -> Option<&PolicyRow> {
        self.rows
            .iter()
            .filter(|r| matches!(policy_of(r), Some(BenchPolicy::Fixed(_))))
            .min_by(|a, b| a.epoch_secs.total_cmp(&b.epoch_secs))
    }

    /// The regime's verdict on the target (module doc, step 4).
    pub fn verdict(&self) -> Verdict {
        let best = self.best_step_based();
        let layer = self.layer();
        let layer_speedup = match (best, layer) {
            (Some(b), Some(l)) => Some(b.epoch_secs / l.epoch_secs),
            _ => None,
        };
        let layer_acc_gap = match (
            best.and_then(|b| b.test_acc),
            layer.and_then(|l| l.test_acc),
        ) {
            (Some(b), Some(l)) => Some(l - b),
            _ => None,
        };
        let applies = self.cache_fraction <= TARGET_MAX_CACHE_FRACTION;
        let holds = match (applies, layer_speedup, layer_acc_gap) {
            (true, Some(s), Some(g)) => Some(s >= TARGET_SPEEDUP && g >= -TARGET_ACC_DROP - 1e-12),
            _ => None,
        };
        let best_fixed = self.best_fixed();
        let auto = self
            .rows
            .iter()
            .find(|r| policy_of(r) == Some(BenchPolicy::Auto))
            .and_then(|a| best_fixed.map(|b| (a.epoch_secs / b.epoch_secs, a.chose.clone())));
        Verdict {
            best_step: best.map(|b| (b.policy, b.epoch_secs)),
            layer_speedup,
            layer_acc_gap,
            applies,
            holds,
            best_fixed: best_fixed.map(|b| (b.policy, b.epoch_secs)),
            auto,
        }
    }
}

/// The table of [`bench_regimes`].
#[derive(Clone, Debug, PartialEq)]
pub struct RegimesReport {
    /// The device engine the first run used, for the header (each regime's:
    /// [`Regime::device`]; they differ where the row dtypes do).
    pub device: String,
    /// What the bench changed in the config, if anything.
    pub notes: Vec<String>,
    /// Epochs per run.
    pub epochs: usize,
    /// `hot_ratio` of the non-step-based runs.
    pub layer_hot_ratio: f64,
    /// `model.precision` of every run (the base config's; `"auto"` is TF32 on
    /// a CUDA device, FP32 on the host backend).
    pub precision: ModelPrecision,
    /// The graph: vertices, stored (directed) edges, classes, training vertices.
    pub graph: GraphSize,
    /// The runs trained on the host backend: their times say nothing about a
    /// GPU's, so the table gives the measured ratios and no verdict on the
    /// targets (which are a GPU's).
    pub on_host: bool,
    /// One entry per (width, fraction, row dtype), widths outermost, dtypes
    /// innermost.
    pub regimes: Vec<Regime>,
}

/// Sizes of the generated graph, for the report header.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GraphSize {
    /// Vertices.
    pub vertices: usize,
    /// Stored (directed) edges.
    pub stored_edges: usize,
    /// Classes.
    pub classes: u32,
    /// Training vertices.
    pub train: usize,
    /// The test split's chance level ([`crate::Dataset::chance_accuracy`]).
    pub chance_acc: f64,
}

/// Trains every policy of [`REGIME_POLICIES`] in every regime of `opts` (see the
/// module doc) and measures each run; `on_row` sees each row as it is measured
/// (width, cache fraction, row dtype, row), for progress output.
pub fn bench_regimes(
    cfg: &TrainConfig,
    opts: &RegimeOptions,
    mut on_row: impl FnMut(usize, f64, FeatureDtype, &PolicyRow),
) -> Result<RegimesReport> {
    opts.validate()?;
    let (base, notes) = bench_base_config(cfg, Some(opts.epochs))?;
    let mut report = RegimesReport {
        device: String::new(),
        on_host: resolves_to_host(&base),
        notes,
        epochs: base.train.epochs,
        layer_hot_ratio: layer_hot_ratio(&base),
        precision: base.model.precision,
        graph: GraphSize::default(),
        regimes: Vec::new(),
    };
    for &dim in &opts.dims {
        let ds = generate_rmat(&RmatOptions {
            feature_dim: dim,
            ..opts.graph
        })?;
        report.graph = GraphSize {
            vertices: ds.num_vertices(),
            stored_edges: ds.graph.num_edges(),
            classes: ds.num_classes,
            train: ds.train_mask.iter().filter(|&&m| m != 0).count(),
            chance_acc: ds.chance_accuracy(&ds.test_ids()),
        };
        for &fraction in &opts.cache_fractions {
            for &dtype in &opts.row_dtypes {
                let bytes = cache_bytes(ds.num_vertices(), dim, fraction, dtype);
                let mut regime = Regime {
                    dim,
                    cache_fraction: fraction,
                    row_dtype: dtype,
                    cache_bytes: bytes,
                    device: String::new(),
                    rows: Vec::with_capacity(REGIME_POLICIES.len()),
                };
                for &policy in REGIME_POLICIES {
                    let mut c = policy_config(&base, policy);
                    c.device.cache_bytes = bytes;
                    c.device.feature_dtype = dtype;
                    let run = measure_policy(c, Some(ds.clone()))?;
                    on_row(dim, fraction, dtype, &run.row);
                    if report.device.is_empty() {
                        report.device.clone_from(&run.device);
                    }
                    regime.device = run.device;
                    regime.rows.push(run.row);
                }
                report.regimes.push(regime);
            }
        }
    }
    Ok(report)
}

impl RegimesReport {
    /// The verdicts of the regimes the target applies to: (holding, applying).
    pub fn target_count(&self) -> (usize, usize) {
        let v: Vec<Verdict> = self
            .regimes
            .iter()
            .map(Regime::verdict)
            .filter(|v| v.applies)
            .collect();
        (v.iter().filter(|v| v.holds == Some(true)).count(), v.len())
    }

    /// One JSON object per row (regime fields, the row's measurements, its ratio
    /// and the regime's best step-based policy, the run's `model.precision`),
    /// newline-terminated. `row_dtype` and `precision` are the config's names
    /// (`"f32"`/`"bf16"`, `"fp32"`/`"tf32"`).
    pub fn json_lines(&self) -> String {
        let mut out = String::new();
        for g in &self.regimes {
            let best = g.best_step_based().map(|b| b.policy);
            for r in &g.rows {
                let v = serde_json::json!({
                    "dim": g.dim,
                    "cache_fraction": g.cache_fraction,
                    "row_dtype": g.row_dtype,
                    "cache_bytes": g.cache_bytes,
                    "policy": r.policy,
                    "hot_ratio": r.hot_ratio,
                    "epoch_secs": r.epoch_secs,
                    "vs_best_step_based": g.ratio(r),
                    "best_step_based": best,
                    "acc_busy": r.acc_busy,
                    "cpu_busy": r.cpu_busy,
                    "h2d_per_epoch": r.h2d_per_epoch,
                    "test_acc": r.test_acc,
                    "epochs": self.epochs,
                    "precision": self.precision,
                    "device": g.device,
                });
                out.push_str(&v.to_string());
                out.push('\n');
            }
        }
        out
    }

    /// Writes [`RegimesReport::json_lines`] to `path` atomically.
    pub fn write_json(&self, path: &Path) -> Result<()> {
        let text = self.json_lines();
        write_file_atomically(path, |w| {
            w.write_all(text.as_bytes()).map_err(|e| Error::io(path, e))
        })
    }
}

/// `0.2` → `"20%"`, `0.005` → `"0.5%"`.
pub(crate) fn fmt_percent(fraction: f64) -> String {
    let p = fraction * 100.0;
    if (p - p.round()).abs() < 1e-9 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

impl Verdict {
    /// The best step-based policy, `"layer"`'s speed-up over it and accuracy gap.
    fn comparison(&self) -> String {
        let mut s = match self.best_step {
            Some((name, secs)) => format!("best step-based {name} ({secs:.3} s/epoch)"),
            None => "no step-based run".to_string(),
        };
        match self.layer_speedup {
            Some(x) => s.push_str(&format!("; layer {x:.2}× of it")),
            None => s.push_str("; no layer run"),
        }
        if let Some(g) = self.layer_acc_gap {
            s.push_str(&format!(", test acc {:+.1} points", g * 100.0));
        }
        s
    }

    /// `"auto"`'s time against the best fixed policy's, and the ratio.
    fn auto_part(&self) -> Option<(String, f64)> {
        let ((ratio, chose), (best, _)) = (self.auto.as_ref()?, self.best_fixed?);
        Some((
            format!(
                "auto ({}) {ratio:.2}× the time of the best fixed policy ({best})",
                chose.as_deref().unwrap_or("no choice")
            ),
            *ratio,
        ))
    }

    /// The measured comparison without the verdicts on the targets (what a
    /// host-backend run can say).
    pub fn measured(&self) -> String {
        match self.auto_part() {
            Some((auto, _)) => format!("{}; {auto}", self.comparison()),
            None => self.comparison(),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.comparison())?;
        let target = format!(
            "target (layer ≥ {TARGET_SPEEDUP:.1}×, acc within {:.0} point)",
            TARGET_ACC_DROP * 100.0
        );
        match (self.applies, self.holds) {
            (false, _) => write!(
                f,
                "; {target} not checked (cache above {})",
                fmt_percent(TARGET_MAX_CACHE_FRACTION)
            ),
            (true, Some(true)) => write!(f, "; {target} HOLDS"),
            (true, Some(false)) => write!(f, "; {target} does not hold"),
            (true, None) => write!(f, "; {target} unknown (a number is missing)"),
        }?;
        if let Some((auto, ratio)) = self.auto_part() {
            let within = if ratio <= 1.0 + AUTO_TARGET {
                "within 5%"
            } else {
                "NOT within 5%"
            };
            write!(f, "; {auto}: {within}")?;
        }
        Ok(())
    }
}

impl fmt::Display for RegimesReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        let g = &self.graph;
        writeln!(
            f,
            "{}; R-MAT {} vertices, {} stored edges, {} classes, {} training vertices \
             (test acc against chance {:.4}: the test split's most frequent class); {} per \
             run; model.precision {}; layer hot_ratio {:.2}",
            self.device,
            g.vertices,
            g.stored_edges,
            g.classes,
            g.train,
            g.chance_acc,
            crate::trace::fmt_count(self.epochs, "epoch"),
            self.precision,
            self.layer_hot_ratio
        )?;
        if self.on_host {
            writeln!(f, "{HOST_COLUMNS}")?;
        }
        writeln!(
            f,
            "{:>5} {:>6} {:>5} {:<22} {:>9} {:>8} {:>8} {:>8} {:>12} {:>9}",
            "dim",
            "cache",
            "dtype",
            "policy",
            "epoch s",
            "vs best",
            device_columns(self.on_host).0,
            "cpu busy",
            device_columns(self.on_host).1,
            "test acc"
        )?;
        for regime in &self.regimes {
            for r in &regime.rows {
                let ratio = regime
                    .ratio(r)
                    .filter(|x| x.is_finite())
                    .map_or_else(|| "-".into(), |x| format!("{x:.2}×"));
                writeln!(
                    f,
                    "{:>5} {:>6} {:>5} {:<22} {:>9.3} {:>8} {:>7.1}% {:>7.1}% {:>12} {:>9}",
                    regime.dim,
                    fmt_percent(regime.cache_fraction),
                    regime.row_dtype.to_string(),
                    r.policy,
                    r.epoch_secs,
                    ratio,
                    r.acc_busy * 100.0,
                    r.cpu_busy * 100.0,
                    fmt_bytes(r.h2d_per_epoch),
                    r.test_acc.map_or_else(|| "-".into(), |a| format!("{a:.4}")),
                )?;
            }
            let verdict = regime.verdict();
            writeln!(
                f,
                "  -> dim {}, cache {} ({}), {} rows: {}",
                regime.dim,
                fmt_percent(regime.cache_fraction),
                fmt_bytes(regime.cache_bytes),
                regime.row_dtype,
                if self.on_host {
                    verdict.measured()
                } else {
                    verdict.to_string()
                }
            )?;
        }
        if self.on_host {
            return writeln!(
                f,
                "no verdict on the targets (layer ≥ {TARGET_SPEEDUP:.1}× the best step-based \
                 policy, auto within {:.0}% of the best): they are a GPU's, and these runs \
                 timed the host backend",
                AUTO_TARGET * 100.0
            );
        }
        let (holds, applies) = self.target_count();
        write!(
            f,
            "target (layer ≥ {TARGET_SPEEDUP:.1}× the best step-based policy at cache ≤ {}, \
             test acc within {:.0} point): ",
            fmt_percent(TARGET_MAX_CACHE_FRACTION),
            TARGET_ACC_DROP * 100.0
        )?;
        if applies == 0 {
            writeln!(f, "no regime with cache ≤ 20% was run")?;
        } else {
            writeln!(f, "holds in {holds} of {applies} regimes")?;
        }
        let autos: Vec<f64> = self
            .regimes
            .iter()
            .filter_map(|g| g.verdict().auto.map(|a| a.0))
            .collect();
        if !autos.is_empty() {
            writeln!(
                f,
                "auto within {:.0}% of the best fixed policy: {} of {} regimes",
                AUTO_TARGET * 100.0,
                autos.iter().filter(|&&r| r <= 1.0 + AUTO_TARGET).count(),
                autos.len()
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(policy: &'static str, secs: f64, acc: Option<f64>) -> PolicyRow {
        PolicyRow {
            policy,
            hot_ratio: if policy == "layer" { 0.2 } else { 0.0 },
            epoch_secs: secs,
            chose: None,
            acc_busy: 0.5,
            cpu_busy: 0.5,
            h2d_per_epoch: 1 << 20,
            test_acc: acc,
            hot_rows: None,
        }
    }

    fn regime(fraction: f64, layer: (f64, f64), step: [(f64, f64); 4]) -> Regime {
        regime_of(FeatureDtype::F32, fraction, layer, step)
    }

    fn regime_of(
        dtype: FeatureDtype,
        fraction: f64,
        layer: (f64, f64),
        step: [(f64, f64); 4],
    ) -> Regime {
        let mut rows = vec![row("layer", layer.0, Some(layer.1))];
        for (name, (s, a)) in Orchestration::NAMES[1..].iter().zip(step) {
            rows.push(row(name, s, Some(a)));
        }
        Regime {
            dim: 8,
            cache_fraction: fraction,
            row_dtype: dtype,
            cache_bytes: cache_bytes(100, 8, fraction, dtype),
            device: match dtype {
                FeatureDtype::F32 => "test".into(),
                d => format!("test, {d} feature rows"),
            },
            rows,
        }
    }

    fn report(regimes: Vec<Regime>) -> RegimesReport {
        RegimesReport {
            device: "test".into(),
            notes: vec![],
            epochs: 2,
            layer_hot_ratio: 0.2,
            precision: ModelPrecision::Fp32,
            graph: GraphSize::default(),
            on_host: false,
            regimes,
        }
    }

    #[test]
    fn every_policy_is_in_each_regime() {
        for o in Orchestration::ALL {
            assert!(
                REGIME_POLICIES.contains(&BenchPolicy::Fixed(o)),
                "{o} missing from REGIME_POLICIES"
            );
        }
        assert!(REGIME_POLICIES.contains(&BenchPolicy::Auto));
    }

    #[test]
    fn cache_bytes_round_up_and_stay_within_the_features() {
        let f32 = FeatureDtype::F32;
        // 2000 × 16 × 4 = 128000 bytes.
        assert_eq!(cache_bytes(2000, 16, 1.0, f32), 128_000);
        assert_eq!(cache_bytes(2000, 16, 0.0, f32), 0);
        assert_eq!(cache_bytes(2000, 16, 0.2, f32), 25_600);
        assert_eq!(cache_bytes(2000, 16, 0.05, f32), 6_400);
        // 3 × 1 × 4 = 12 bytes; 0.1 of them is 1.2 → 2.
        assert_eq!(cache_bytes(3, 1, 0.1, f32), 2);
        assert_eq!(cache_bytes(2_400_000, 512, 0.05, f32), 245_760_000);
        assert_eq!(cache_bytes(2_400_000, 100, 1.0, f32), 960_000_000);
    }

    #[test]
    fn bf16_cache_bytes_are_half_of_f32_rounded_up() {
        let (f32, bf16) = (FeatureDtype::F32, FeatureDtype::Bf16);
        // 2000 × 16 × 2 = 64000 bytes: the same fraction of the rows as in f32.
        assert_eq!(cache_bytes(2000, 16, 1.0, bf16), 64_000);
        assert_eq!(cache_bytes(2000, 16, 0.0, bf16), 0);
        assert_eq!(cache_bytes(2000, 16, 0.2, bf16), 12_800);
        assert_eq!(cache_bytes(2000, 16, 0.05, bf16), 3_200);
        // 3 × 1 × 2 = 6 bytes; 0.1 of them is 0.6 → 1 (f32: 1.2 → 2).
        assert_eq!(cache_bytes(3, 1, 0.1, bf16), 1);
        // 0.15 of 6 is 0.9 → 1, of 12 is 1.8 → 2; 0.3 of 6 is 1.8 → 2, of 12 3.6 → 4.
        assert_eq!(cache_bytes(3, 1, 0.15, bf16), 1);
        assert_eq!(cache_bytes(3, 1, 0.3, bf16), 2);
        assert_eq!(cache_bytes(2_400_000, 512, 0.05, bf16), 122_880_000);
        assert_eq!(cache_bytes(2_400_000, 100, 1.0, bf16), 480_000_000);
        // Half of f32, rounded up, over widths, sizes and fractions.
        for (v, d) in [
            (2000, 16),
            (3, 1),
            (7, 3),
            (2_400_000, 100),
            (2_400_000, 512),
        ] {
            for f in [0.0, 0.001, 0.05, 0.1, 0.2, 1.0 / 3.0, 0.5, 1.0] {
                let (full, half) = (cache_bytes(v, d, f, f32), cache_bytes(v, d, f, bf16));
                assert_eq!(half, full.div_ceil(2), "{v} × {d} at {f}");
                assert!(half <= (v * d * 2) as u64);
            }
        }
    }

    #[test]
    fn row_dtypes_parse_by_their_config_names() {
        // A new FeatureDtype variant fails to compile here until ROW_DTYPES has it.
        for d in ROW_DTYPES {
            match d {
                FeatureDtype::F32 | FeatureDtype::Bf16 => {}
            }
        }
        for d in ROW_DTYPES {
            assert_eq!(parse_row_dtype(&d.to_string()), Some(d));
            // The name is the config's (serde) spelling.
            assert_eq!(serde_json::to_value(d).unwrap(), d.to_string());
        }
        assert_eq!(parse_row_dtype("bf16"), Some(FeatureDtype::Bf16));
        assert_eq!(parse_row_dtype("f32"), Some(FeatureDtype::F32));
        for bad in ["", "F32", "fp32", "f16", "bfloat16", " bf16"] {
            assert_eq!(parse_row_dtype(bad), None, "{bad:?}");
        }
        assert_eq!(row_dtype_names(), r#""f32", "bf16""#);
    }

    #[test]
    fn ratios_best_step_based_and_verdicts() {
        // Layer 2 s; best step-based is the third at 3 s.
        let g = regime(
            0.05,
            (2.0, 0.90),
            [(6.0, 0.905), (4.0, 0.91), (3.0, 0.905), (5.0, 0.9)],
        );
        let best = g.best_step_based().unwrap();
        assert_eq!(best.policy, "cpu-sample-gpu-gather");
        assert_eq!(g.ratio(&g.rows[0]), Some(1.5));
        assert_eq!(g.ratio(best), Some(1.0));
        assert_eq!(g.ratio(&g.rows[1]), Some(0.5));
        let v = g.verdict();
        assert_eq!(v.best_step, Some(("cpu-sample-gpu-gather", 3.0)));
        assert_eq!(v.layer_speedup, Some(1.5));
        assert!((v.layer_acc_gap.unwrap() + 0.005).abs() < 1e-12);
        assert!(v.applies);
        assert_eq!(v.holds, Some(true));
        assert!(v.to_string().contains("HOLDS"), "{v}");

        // Fast enough but 1.5 points less accurate: does not hold.
        let g = regime(0.2, (2.0, 0.89), [(3.0, 0.905); 4]);
        assert_eq!(g.verdict().holds, Some(false));
        // Exactly 1 point less and exactly 1.3×: holds (both bounds inclusive).
        let g = regime(0.2, (1.0, 0.895), [(1.3, 0.905); 4]);
        assert!(g.verdict().layer_speedup.unwrap() >= TARGET_SPEEDUP - 1e-12);
        assert_eq!(g.verdict().holds, Some(true));
        // Accurate but slower: does not hold.
        let g = regime(0.0, (4.0, 0.95), [(3.0, 0.9); 4]);
        assert_eq!(g.verdict().holds, Some(false));
        // A big cache: the target does not apply, whatever the numbers.
        let g = regime(1.0, (1.0, 0.95), [(3.0, 0.9); 4]);
        let v = g.verdict();
        assert!(!v.applies);
        assert_eq!(v.holds, None);
        assert_eq!(v.layer_speedup, Some(3.0));
        // No accuracy (never evaluated): unknown.
        let mut g = regime(0.05, (1.0, 0.9), [(3.0, 0.9); 4]);
        g.rows[0].test_acc = None;
        assert_eq!(g.verdict().holds, None);
        assert_eq!(g.verdict().layer_acc_gap, None);

        let report = report(vec![
            regime(1.0, (1.0, 0.9), [(3.0, 0.9); 4]),
            regime(0.2, (1.0, 0.9), [(3.0, 0.9); 4]),
            regime(0.05, (4.0, 0.9), [(3.0, 0.9); 4]),
        ]);
        assert_eq!(report.target_count(), (1, 2));
        let text = report.to_string();
        assert!(text.contains("holds in 1 of 2 regimes"), "{text}");
        assert_eq!(text.lines().filter(|l| l.contains("-> dim 8")).count(), 3);
        assert!(text.contains("model.precision fp32"), "{text}");
        let lines = report.json_lines();
        assert_eq!(lines.lines().count(), 15);
        let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
        assert_eq!(first["policy"], "layer");
        assert_eq!(first["vs_best_step_based"], 3.0);
        assert_eq!(first["cache_bytes"], 3200);
        assert_eq!(first["row_dtype"], "f32");
        assert_eq!(first["precision"], "fp32");

        // Host-backend timings get the measured ratios and no verdict.
        let mut host = report;
        host.on_host = true;
        let text = host.to_string();
        assert!(text.contains("layer 0.75× of it"), "{text}");
        for verdict in [
            "HOLDS",
            "does not hold",
            ": within 5%",
            "NOT within",
            "holds in",
        ] {
            assert!(!text.contains(verdict), "{verdict}:\n{text}");
        }
        assert!(text.contains("no verdict on the targets"), "{text}");
    }

    #[test]
    fn a_table_of_two_row_dtypes_prints_and_records_both() {
        let (f32, bf16) = (FeatureDtype::F32, FeatureDtype::Bf16);
        let mut report = report(vec![
            regime_of(f32, 0.05, (4.0, 0.9), [(3.0, 0.9); 4]),
            regime_of(bf16, 0.05, (1.0, 0.9), [(2.0, 0.9); 4]),
        ]);
        report.precision = ModelPrecision::Tf32;
        let text = report.to_string();
        assert!(text.contains("model.precision tf32"), "{text}");
        let header = text.lines().find(|l| l.contains("policy")).unwrap();
        assert!(
            header
                .split_whitespace()
                .take(4)
                .eq(["dim", "cache", "dtype", "policy"]),
            "{header}"
        );
        for dtype in ["f32", "bf16"] {
            let rows = text
                .lines()
                .filter(|l| l.split_whitespace().take(3).eq(["8", "5%", dtype]))
                .count();
            assert_eq!(rows, REGIME_POLICIES.len() - 1, "{dtype}:\n{text}");
        }
        // 100 × 8 × 4 × 0.05 = 160 bytes in f32, 80 in bf16.
        assert!(
            text.contains("-> dim 8, cache 5% (160 B), f32 rows: best step-based"),
            "{text}"
        );
        assert!(
            text.contains("-> dim 8, cache 5% (80 B), bf16 rows: best step-based"),
            "{text}"
        );
        assert_eq!(report.target_count(), (1, 2));

        let rows: Vec<serde_json::Value> = report
            .json_lines()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 10);
        for (i, r) in rows.iter().enumerate() {
            let (dtype, bytes) = if i < 5 { ("f32", 160) } else { ("bf16", 80) };
            assert_eq!(r["row_dtype"], dtype, "{r}");
            assert_eq!(r["cache_bytes"], bytes, "{r}");
            assert_eq!(r["precision"], "tf32", "{r}");
            // Each line names its own run's device.
            assert_eq!(
                r["device"].as_str().unwrap().contains("bf16"),
                i >= 5,
                "{r}"
            );
        }
    }

    #[test]
    fn bad_widths_and_fractions_name_the_flag() {
        let ok = RegimeOptions {
            dims: vec![8],
            cache_fractions: vec![1.0, 0.0],
            row_dtypes: vec![FeatureDtype::F32, FeatureDtype::Bf16],
            graph: RmatOptions::default(),
            epochs: 1,
        };
        ok.validate().unwrap();
        let bad = |dims: Vec<usize>, fr: Vec<f64>| {
            RegimeOptions {
                dims,
                cache_fractions: fr,
                ..ok.clone()
            }
            .validate()
            .unwrap_err()
            .to_string()
        };
        assert!(bad(vec![0], vec![1.0]).contains("--dims"));
        assert!(bad(vec![], vec![1.0]).contains("--dims"));
        assert!(bad(vec![8], vec![1.5]).contains("--cache-fractions"));
        assert!(bad(vec![8], vec![f64::NAN]).contains("--cache-fractions"));
        assert!(bad(vec![8], vec![-0.1]).contains("--cache-fractions"));
        let e = RegimeOptions {
            row_dtypes: vec![],
            ..ok.clone()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("--row-dtypes"), "{e}");
        assert!(e.contains(r#""f32", "bf16""#), "{e}");
    }
}
