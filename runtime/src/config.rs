//! The training configuration: one TOML file, `TANDEM_` environment overrides and
//! `--set key=value` overrides. `docs/config.md` lists every key with its type,
//! default, unit and allowed range (a test keeps it in step with this file).
//!
//! Every section and key is optional; missing ones take the defaults below. Unknown
//! keys, wrong types and out-of-range values are errors that name the key (with the
//! file, variable or `--set` it came from). The effective configuration can be
//! printed back as TOML ([`TrainConfig::to_toml`]), which is what `tandem train`
//! prints at start and saves beside the run's outputs.
//!
//! # Layers, in order
//! 1. The file (or the built-in defaults, or a checkpoint's configuration).
//! 2. Environment variables `TANDEM_<SECTION>__<KEY>=value` ([`env_overrides`]):
//!    the part after `TANDEM_` is lower-cased and `__` (double underscore) separates
//!    the levels of the dotted key, so `TANDEM_TRAIN__BATCH_SIZE=512` sets
//!    `train.batch_size` and `TANDEM_DATA__SYNTHETIC__VERTICES=1000` sets
//!    `data.synthetic.vertices`. Variables without `__` (e.g. `TANDEM_REQUIRE_WORDNET`)
//!    are not configuration and are ignored. The library never reads the environment
//!    itself: the CLI passes [`env_overrides`]`(std::env::vars_os())` in.
//! 3. `--set key=value` (dotted keys).
//!
//! Values of layers 2 and 3 are TOML (`512`, `0.01`, `[5, 5]`, `"gcn"`); a bare word
//! is taken as a string. Each override is type-checked as it is applied, so an
//! unknown key or a wrong type names the variable or `--set` argument; the ranges
//! are checked once all layers are applied, and a range error names the key and the
//! layer that last set it.
//!
//! ```toml
//! [data]
//! path = "wordnet.tds"      # omit for the built-in synthetic graph ([data.synthetic])
//!
//! [model]
//! kind = "sage"             # "gcn" | "sage" | "gat"
//! layers = 2
//! hidden = 256
//! heads = 4                 # GAT only; hidden must be a multiple
//! dropout = 0.5
//!
//! [train]
//! fanouts = [10, 10]        # per layer, input layer first (DGL order); -1 = all
//! batch_size = 1024
//! epochs = 20
//! lr = 0.003
//!
//! [device]
//! kind = "auto"             # "auto" | "host" | "cuda"
//! cache_bytes = 4294967296  # device feature-cache budget (4 GiB)
//!
//! [threads]
//! compute = 0               # rayon pool size; 0 = all cores
//! pin = "none"              # "none" | "cores" (needs the `hwloc` feature)
//! ```

use std::path::{Path, PathBuf};

use cpu_ops::{ModelConfig, ModelKind, ALL_NEIGHBORS};
use gpu_ops::{FeatureDtype, HotGrad, Precision, TopologyPlacement};
use scheduler::{Hotness, OnLate, Orchestration, Policy};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The whole training configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Which dataset to train on.
    pub data: DataConfig,
    /// The model.
    pub model: ModelSection,
    /// The training loop.
    pub train: TrainSection,
    /// The accelerator.
    pub device: DeviceSection,
    /// Host worker threads.
    pub threads: ThreadsSection,
    /// Layer-based orchestration (hot-vertex embeddings computed by the CPU).
    pub orchestration: OrchestrationSection,
    /// Data-parallel training over several ranks (`mpirun -np N tandem train`).
    pub dist: DistSection,
}

/// `[data]`: a stored dataset, or the built-in synthetic graph.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// A `.tds` dataset; when absent, `synthetic` is generated in-process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// The built-in dataset's parameters.
    pub synthetic: SyntheticConfig,
}

/// `[data.synthetic]`: a stochastic block model with class-correlated features.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SyntheticConfig {
    /// Vertices.
    pub vertices: usize,
    /// Undirected edges drawn.
    pub edges: usize,
    /// Classes (= blocks).
    pub classes: u32,
    /// Feature dimension.
    pub dim: usize,
    /// Fraction of edges inside a class, in [0, 1].
    pub homophily: f64,
    /// Class signal strength in the features (≥ 0).
    pub signal: f32,
    /// Seed of the generated graph.
    pub seed: u64,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        Self {
            vertices: 50_000,
            edges: 400_000,
            classes: 16,
            dim: 64,
            homophily: 0.6,
            signal: 0.1,
            seed: 0,
        }
    }
}

/// `[model]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// `"gcn"`, `"sage"` or `"gat"`.
    pub kind: ModelKind,
    /// Number of GNN layers (≥ 1); equals the number of fanouts.
    pub layers: usize,
    /// Hidden width (≥ 1).
    pub hidden: usize,
    /// Attention heads (GAT; `hidden` must be a multiple).
    pub heads: usize,
    /// Dropout probability on hidden activations, in [0, 1).
    pub dropout: f32,
    /// `"fp32"` or `"tf32"`: the arithmetic of a device engine's matrix products.
    pub precision: Precision,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            kind: ModelKind::Sage,
            layers: 2,
            hidden: 256,
            heads: 4,
            dropout: 0.5,
            precision: Precision::Fp32,
        }
    }
}

/// `[train]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Sampling fanout per layer, input layer first; -1 takes every neighbor.
    pub fanouts: Vec<i64>,
    /// How validation/test accuracy is computed: `"full"` applies each layer to the
    /// whole graph before the next (layer-wise full-neighbor inference, as DGL's
    /// `inference`; exact GCN normalization with full-graph degrees), `"sampled"`
    /// runs mini-batches of `eval_batch_size` seeds sampled with `eval_fanouts`.
    pub eval_mode: EvalMode,
    /// Fanouts for `eval_mode = "sampled"`; empty means every neighbor at every layer.
    pub eval_fanouts: Vec<i64>,
    /// Seeds per training batch (≥ 1).
    pub batch_size: usize,
    /// Seeds per evaluation batch (≥ 1).
    pub eval_batch_size: usize,
    /// Epochs (≥ 1).
    pub epochs: usize,
    /// Adam learning rate (> 0).
    pub lr: f64,
    /// L2 weight decay added to the gradient, as `torch.optim.Adam` (≥ 0).
    pub weight_decay: f64,
    /// Evaluate validation and test accuracy every this many epochs (0: only at the end).
    pub eval_every: usize,
    /// Input-feature representation for the first layer: `"auto"` keeps a sparse
    /// (CSR) copy when at most `sparse_threshold` of the values are non-zero (e.g.
    /// bag-of-words features), `"on"` always, `"off"` never. Results are the same
    /// either way up to float rounding; sparse skips the multiplications by zero.
    pub sparse_features: SparseFeatures,
    /// Density at or below which `sparse_features = "auto"` goes sparse, in [0, 1].
    pub sparse_threshold: f64,
    /// Seed of initialization, shuffling, sampling and dropout.
    pub seed: u64,
    /// `tandem train --out DIR` writes `DIR/checkpoint.tck` every this many epochs
    /// (0: only at the end of the run).
    pub checkpoint_every: usize,
    /// What a batch with a non-finite loss does: `"stop"` ends training with an
    /// error naming the epoch and batch (the weights are those before the batch,
    /// checkpointed when there is a checkpoint path), `"skip-batch"` leaves the
    /// weights untouched and trains on (counted per epoch).
    pub on_nonfinite: OnNonFiniteKind,
    /// Deprecated spelling of `threads.compute`, still accepted so older files keep
    /// working: it must agree with `threads.compute` when both are set, and it is
    /// folded into `threads.compute` when a file is loaded (so it is never printed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            fanouts: vec![10, 10],
            eval_mode: EvalMode::Full,
            eval_fanouts: Vec::new(),
            batch_size: 1024,
            eval_batch_size: 4096,
            epochs: 10,
            lr: 0.003,
            weight_decay: 0.0,
            eval_every: 1,
            sparse_features: SparseFeatures::Auto,
            sparse_threshold: 0.1,
            seed: 0,
            checkpoint_every: 0,
            on_nonfinite: OnNonFiniteKind::Stop,
            threads: None,
        }
    }
}

/// `device.kind`: where training runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceKind {
    /// A CUDA device when one is present and the build has CUDA, else the host.
    #[default]
    Auto,
    /// The host backend (CPU threads), even when a GPU is present.
    Host,
    /// A CUDA device; an error when none is usable.
    Cuda,
}

/// The default device feature-cache budget: 4 GiB (`4294967296` bytes).
pub const DEFAULT_CACHE_BYTES: u64 = 4 << 30;

/// Largest accepted `device.ordinal` (CUDA ordinals are C `int`s).
pub const MAX_DEVICE_ORDINAL: u32 = i32::MAX as u32;

/// `[device]`: which accelerator trains and how its memory is used.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeviceSection {
    /// `"auto"`, `"host"` or `"cuda"`.
    pub kind: DeviceKind,
    /// GPU index (CUDA ordinal) when `kind` selects a GPU.
    pub ordinal: u32,
    /// Device feature-cache budget in bytes (0: no cache).
    pub cache_bytes: u64,
    /// `"device"` or `"pinned-host"`.
    pub topology: TopologyPlacement,
    /// `"f32"` or `"bf16"`: how a device engine stores feature rows.
    pub feature_dtype: FeatureDtype,
    /// Sample each training batch while the one before it trains (a second
    /// stream on CUDA).
    pub sample_ahead: bool,
}

impl Default for DeviceSection {
    fn default() -> Self {
        Self {
            kind: DeviceKind::Auto,
            ordinal: 0,
            cache_bytes: DEFAULT_CACHE_BYTES,
            topology: TopologyPlacement::Device,
            feature_dtype: FeatureDtype::F32,
            sample_ahead: false,
        }
    }
}

pub use crate::executor::step::data_parallel::DistReduce;

/// `dist.features`: where each rank keeps the feature rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DistFeatures {
    /// Every rank holds every row (what one rank does).
    #[default]
    Replicated,
    /// Rank `r` of `N` owns the contiguous rows `[r·n/N, (r+1)·n/N)` and fetches
    /// the others from their owners once per batch (one all-to-all of requests,
    /// one of rows), through a cache of `remote_cache_rows` remote rows.
    Partitioned,
}

/// `dist.full_eval`: how a job's ranks run full-graph evaluation
/// (`train.eval_mode = "full"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DistFullEval {
    /// `"sharded"` when the ranks run on more than one machine, else
    /// `"replicated"`.
    #[default]
    Auto,
    /// Rank `r` infers its vertex range layer by layer; the ranks exchange
    /// each hidden layer's rows (one all-gather per layer below the top).
    Sharded,
    /// Every rank infers the whole graph (no communication: what pays when the
    /// ranks share one machine's cores and memory bandwidth).
    Replicated,
}

/// `[dist]`: data-parallel training over several ranks. One process (no MPI
/// launcher) ignores it. `train.batch_size` is the *global* batch: each of `N`
/// ranks trains its share of every batch, so `N` ranks train the model one rank
/// trains with the same configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DistSection {
    /// `"auto"`, `"mpi"` or `"nccl"`.
    pub reduce: DistReduce,
    /// `"replicated"` or `"partitioned"`.
    pub features: DistFeatures,
    /// `"auto"`, `"sharded"` or `"replicated"`.
    pub full_eval: DistFullEval,
    /// With `features = "partitioned"`: remote rows each rank keeps (those of the
    /// highest-degree vertices it does not own), fetched once at start.
    pub remote_cache_rows: usize,
    /// With `features = "partitioned"`: a partition file (METIS format, one
    /// rank per vertex per line; `runtime::dist::partition`) giving each rank
    /// its rows and the seeds it trains, instead of contiguous ranges.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition_file: Option<PathBuf>,
}

/// `threads.pin`: whether compute workers are bound to cores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PinPolicy {
    /// Threads float as the OS schedules them.
    #[default]
    None,
    /// Worker `i` is bound to core `i` (modulo the number of cores); needs a build
    /// with the `hwloc` feature.
    Cores,
}

/// Largest accepted `threads.compute`.
pub const MAX_COMPUTE_THREADS: usize = 4096;

/// `[threads]`: the trainer's compute pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThreadsSection {
    /// Rayon pool size (0: one per core, or `RAYON_NUM_THREADS` when set).
    pub compute: usize,
    /// `"none"` or `"cores"`.
    pub pin: PinPolicy,
}

/// Implements `Display` as the config spelling (serde's kebab-case name).
macro_rules! config_name {
    ($t:ty { $($v:ident => $name:literal),* $(,)? }) => {
        impl $t {
            /// The name as written in a config file.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$v => $name,)*
                }
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

/// `train.eval_mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EvalMode {
    /// Layer-wise full-graph inference.
    #[default]
    Full,
    /// Mini-batches sampled with `train.eval_fanouts`.
    Sampled,
}
config_name!(EvalMode { Full => "full", Sampled => "sampled" });
config_name!(DistFeatures { Replicated => "replicated", Partitioned => "partitioned" });
config_name!(DistFullEval { Auto => "auto", Sharded => "sharded", Replicated => "replicated" });

/// `train.sparse_features`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SparseFeatures {
    /// Sparse when the density is at most `train.sparse_threshold`.
    #[default]
    Auto,
    /// Always sparse.
    On,
    /// Never sparse.
    Off,
}
config_name!(SparseFeatures { Auto => "auto", On => "on", Off => "off" });

/// `train.on_nonfinite`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnNonFiniteKind {
    /// End training with an error naming the epoch and batch.
    #[default]
    Stop,
    /// Leave the weights untouched and train on.
    SkipBatch,
}
config_name!(OnNonFiniteKind { Stop => "stop", SkipBatch => "skip-batch" });

/// Default `orchestration.super_batch` (batches per super-batch).
pub const DEFAULT_SUPER_BATCH: usize = 4;
/// Largest accepted `orchestration.super_batch`.
pub const MAX_SUPER_BATCH: usize = 1 << 20;
/// Largest accepted `orchestration.presample_epochs`.
pub const MAX_PRESAMPLE_EPOCHS: u32 = 1000;

/// `[orchestration]`: how work is split between the CPU and the accelerator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrchestrationSection {
    /// `"auto"` (measure the candidates in the first batches and keep the
    /// fastest), `"layer"` (NeutronOrch) or a step-based baseline
    /// (`"cpu-sample-cpu-gather"`, `"gpu-sample-cpu-gather"`,
    /// `"cpu-sample-gpu-gather"`, `"gpu-sample-gpu-gather"`).
    pub policy: Policy,
    /// Fraction of vertices that are hot, in [0, 1]; 0 disables embedding reuse.
    pub hot_ratio: f64,
    /// `"presample"` or `"degree"`.
    pub hotness: Hotness,
    /// Epochs of pre-sampling for `hotness = "presample"` (≥ 1).
    pub presample_epochs: u32,
    /// Batches per super-batch (≥ 1).
    pub super_batch: usize,
    /// Largest allowed gap, in optimizer steps, between the weights a reused
    /// embedding was computed with and the weights it is used at.
    pub staleness_bound: u64,
    /// `"wait"` or `"compute"`.
    pub on_late: OnLate,
    /// `"constant"` or `"aggregate"`.
    pub hot_backward: HotGrad,
    /// Whether the hybrid monitor moves hot vertices between CPU compute and the
    /// device feature cache.
    pub monitor: bool,
    /// CPU worker threads computing hot embeddings (≥ 1).
    pub cpu_workers: usize,
}

impl Default for OrchestrationSection {
    fn default() -> Self {
        Self {
            policy: Policy::Auto,
            hot_ratio: 0.0,
            hotness: Hotness::Presample,
            presample_epochs: scheduler::DEFAULT_PRESAMPLE_EPOCHS,
            super_batch: DEFAULT_SUPER_BATCH,
            staleness_bound: 2 * DEFAULT_SUPER_BATCH as u64 - 1,
            on_late: OnLate::Wait,
            hot_backward: HotGrad::Constant,
            monitor: false,
            cpu_workers: 1,
        }
    }
}

impl OrchestrationSection {
    /// Whether the policy is `"auto"`.
    pub fn is_auto(&self) -> bool {
        self.policy == Policy::Auto
    }

    /// The policy's placement; `"auto"` gives the placement it starts from,
    /// `"gpu-sample-gpu-gather"`.
    pub fn orchestration(&self) -> Orchestration {
        self.policy
            .fixed()
            .unwrap_or(Orchestration::GpuSampleGpuGather)
    }

    /// Whether training reuses CPU-computed hot embeddings (policy `"layer"` with a
    /// positive `hot_ratio`).
    pub fn reuses_embeddings(&self) -> bool {
        self.hot_ratio > 0.0 && self.policy == Policy::Fixed(Orchestration::Layer)
    }
}

fn range_err(key: &str, expected: &str, found: impl std::fmt::Display) -> Error {
    Error::invalid_argument(key, format!("expected {expected}, found {found}"))
}

fn fanouts(key: &str, v: &[i64]) -> Result<Vec<u32>> {
    v.iter()
        .map(|&f| match f {
            -1 => Ok(ALL_NEIGHBORS),
            1..=0xFFFF_FFFE => Ok(f as u32),
            _ => Err(range_err(key, "positive fanouts or -1 (all neighbors)", f)),
        })
        .collect()
}

/// One override of a configuration key: from a `TANDEM_` environment variable or a
/// `--set key=value` argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    /// Where it came from, as errors name it: the variable (`TANDEM_TRAIN__LR`) or
    /// `--set`.
    pub origin: String,
    /// The dotted key (`train.lr`).
    pub key: String,
    /// The value in TOML syntax (a bare word is taken as a string).
    pub value: String,
}

impl Override {
    /// Parses a `--set` argument `a.b.c=value`.
    pub fn from_set(assignment: &str) -> Result<Self> {
        let Some((key, raw)) = assignment.split_once('=') else {
            return Err(Error::invalid_argument(
                "--set",
                format!("`{assignment}`: expected key=value, e.g. train.epochs=5"),
            ));
        };
        let key = key.trim();
        if key.split('.').any(str::is_empty) {
            return Err(Error::invalid_argument(
                "--set",
                format!("`{key}` is not a dotted key"),
            ));
        }
        Ok(Self {
            origin: "--set".into(),
            key: key.into(),
            value: raw.trim().into(),
        })
    }

    /// The TOML value: parsed as TOML, or the raw text as a string.
    fn toml_value(&self) -> toml::Value {
        format!("v = {}", self.value)
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(self.value.clone()))
    }

    /// How errors name this override: the variable, or `--set key=value`.
    fn label(&self) -> String {
        if self.origin == "--set" {
            format!("--set {}={}", self.key, self.value)
        } else {
            self.origin.clone()
        }
    }
}

/// The prefix of configuration environment variables.
pub const ENV_PREFIX: &str = "TANDEM_";

/// The configuration overrides among `vars` (pass `std::env::vars_os()`), sorted by
/// variable name: every `TANDEM_<A>__<B>[__<C>...]=value` becomes the key `a.b[.c]`
/// (see the module doc). Variables with the prefix but no `__` are not
/// configuration and are skipped. Errors name the variable: a name or value that is
/// not UTF-8, an empty level (`TANDEM_TRAIN____LR`), or two variables that set the
/// same key (names differing only in case).
pub fn env_overrides<I, K, V>(vars: I) -> Result<Vec<Override>>
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<std::ffi::OsString>,
    V: Into<std::ffi::OsString>,
{
    let mut out: Vec<Override> = Vec::new();
    for (name, value) in vars {
        let (name, value) = (name.into(), value.into());
        let Some(name) = name.to_str() else {
            if name.to_string_lossy().starts_with(ENV_PREFIX) {
                return Err(Error::invalid_argument(
                    name.to_string_lossy(),
                    "environment variable name is not UTF-8",
                ));
            }
            continue;
        };
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if !rest.contains("__") {
            continue;
        }
        let parts: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
        if parts.iter().any(String::is_empty) {
            return Err(Error::invalid_argument(
                name,
                "expected TANDEM_<SECTION>__<KEY> with non-empty parts, e.g. TANDEM_TRAIN__BATCH_SIZE",
            ));
        }
        let Some(value) = value.to_str() else {
            return Err(Error::invalid_argument(name, "value is not UTF-8"));
        };
        out.push(Override {
            origin: name.into(),
            key: parts.join("."),
            value: value.trim().into(),
        });
    }
    out.sort_by(|a, b| a.origin.cmp(&b.origin));
    for (i, o) in out.iter().enumerate() {
        if let Some(first) = out[..i].iter().find(|p| p.key == o.key) {
            return Err(Error::invalid_argument(
                o.origin.clone(),
                format!("sets `{}`, which {} also sets", o.key, first.origin),
            ));
        }
    }
    Ok(out)
}

impl TrainConfig {
    /// Parses a TOML string; `origin` names it in errors (a file path or "--set").
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self> {
        Self::from_layers(text, origin, &[])
    }

    /// Parses a TOML string and applies `key=value` overrides (dotted keys, values in
    /// TOML syntax; a bare word is taken as a string), then validates.
    pub fn from_toml_with_overrides(
        text: &str,
        origin: &Path,
        overrides: &[String],
    ) -> Result<Self> {
        let layers = overrides
            .iter()
            .map(|o| Override::from_set(o))
            .collect::<Result<Vec<_>>>()?;
        Self::from_layers(text, origin, &layers)
    }

    /// Parses a TOML string (`origin` names it in errors), applies `overrides` in
    /// order (environment first, then `--set`: see the module doc), folds the
    /// deprecated `train.threads` into `threads.compute`, and validates.
    pub fn from_layers(text: &str, origin: &Path, overrides: &[Override]) -> Result<Self> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| Error::format(origin, e.to_string()))?;
        Self::deserialize_table(&table).map_err(|e| Error::format(origin, e))?;
        // Which override last set each key, to name it in range errors.
        let mut set_by: Vec<(&str, String)> = Vec::new();
        for o in overrides {
            apply_override(&mut table, o)?;
            Self::deserialize_table(&table).map_err(|e| {
                Error::invalid_argument(o.label(), format!("key `{}`: {}", o.key, e.trim_end()))
            })?;
            set_by.retain(|(k, _)| *k != o.key);
            set_by.push((&o.key, o.label()));
        }
        let mut cfg = Self::deserialize_table(&table).map_err(|e| Error::format(origin, e))?;
        let named = |e: Error| match e {
            Error::InvalidArgument { name, reason } => {
                let reason = match set_by.iter().find(|(k, _)| *k == name) {
                    Some((_, label)) => format!("{reason} (set by {label})"),
                    None => reason,
                };
                Error::InvalidArgument { name, reason }
            }
            other => other,
        };
        cfg.fold_deprecated().map_err(named)?;
        cfg.validate().map_err(named)?;
        Ok(cfg)
    }

    fn deserialize_table(table: &toml::Table) -> std::result::Result<Self, String> {
        table
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| e.to_string())
    }

    /// Moves the deprecated `train.threads` into `threads.compute`.
    fn fold_deprecated(&mut self) -> Result<()> {
        if let Some(t) = self.train.threads {
            if self.threads.compute != 0 && self.threads.compute != t {
                return Err(range_err(
                    "train.threads",
                    &format!(
                        "the same value as threads.compute = {} (train.threads is its deprecated spelling)",
                        self.threads.compute
                    ),
                    t,
                ));
            }
            self.threads.compute = t;
            self.train.threads = None;
        }
        Ok(())
    }

    /// Reads a TOML file (see [`TrainConfig::from_toml_with_overrides`]).
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_toml_with_overrides(&text, path, overrides)
    }

    /// Reads a TOML file and applies `overrides` (see [`TrainConfig::from_layers`]).
    pub fn load_layered(path: &Path, overrides: &[Override]) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_layers(&text, path, overrides)
    }

    /// Compute threads in force: `threads.compute`, or the deprecated
    /// `train.threads` when only that is set (0: all cores).
    pub fn compute_threads(&self) -> usize {
        match (self.threads.compute, self.train.threads) {
            (0, Some(t)) => t,
            (c, _) => c,
        }
    }

    /// The effective configuration as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot print config: {e}\n"))
    }

    /// The model's shape for a dataset with `in_dim` feature columns and
    /// `num_classes` classes.
    pub fn model_config(&self, in_dim: usize, num_classes: usize) -> Result<ModelConfig> {
        Ok(ModelConfig {
            kind: self.model.kind,
            in_dim,
            hidden: self.model.hidden,
            num_classes,
            num_layers: self.model.layers,
            heads: self.model.heads,
            dropout: self.model.dropout,
        })
    }

    /// Training fanouts as the sampler takes them.
    pub fn train_fanouts(&self) -> Result<Vec<u32>> {
        fanouts("train.fanouts", &self.train.fanouts)
    }

    /// Evaluation fanouts (every neighbor when not configured).
    pub fn eval_fanouts(&self) -> Result<Vec<u32>> {
        if self.train.eval_fanouts.is_empty() {
            Ok(vec![ALL_NEIGHBORS; self.model.layers])
        } else {
            fanouts("train.eval_fanouts", &self.train.eval_fanouts)
        }
    }

    /// Checks every range; errors name the key, the allowed range and the value.
    pub fn validate(&self) -> Result<()> {
        let m = &self.model;
        let t = &self.train;
        let s = &self.data.synthetic;
        in_range("model.layers", m.layers, 1, MAX_LAYERS)?;
        in_range("model.hidden", m.hidden, 1, MAX_HIDDEN)?;
        in_range("model.heads", m.heads, 1, MAX_HIDDEN)?;
        if m.kind == ModelKind::Gat && !m.hidden.is_multiple_of(m.heads) {
            return Err(range_err(
                "model.hidden",
                &format!("a multiple of model.heads = {}", m.heads),
                m.hidden,
            ));
        }
        if !(0.0..1.0).contains(&m.dropout) {
            return Err(range_err(
                "model.dropout",
                "a probability in [0, 1)",
                m.dropout,
            ));
        }
        let f = self.train_fanouts()?;
        if f.len() != m.layers {
            return Err(range_err(
                "train.fanouts",
                &format!("one fanout per layer (model.layers = {})", m.layers),
                format!("{} fanouts", f.len()),
            ));
        }
        let ef = self.eval_fanouts()?;
        if ef.len() != m.layers {
            return Err(range_err(
                "train.eval_fanouts",
                &format!(
                    "empty or one fanout per layer (model.layers = {})",
                    m.layers
                ),
                format!("{} fanouts", ef.len()),
            ));
        }

        if !(0.0..=1.0).contains(&t.sparse_threshold) {
            return Err(range_err(
                "train.sparse_threshold",
                "[0, 1]",
                t.sparse_threshold,
            ));
        }
        in_range("train.batch_size", t.batch_size, 1, MAX_BATCH)?;
        in_range("train.eval_batch_size", t.eval_batch_size, 1, MAX_BATCH)?;
        in_range("train.epochs", t.epochs, 1, MAX_EPOCHS)?;
        in_range("train.eval_every", t.eval_every, 0, TOML_INT_MAX)?;
        in_range(
            "train.checkpoint_every",
            t.checkpoint_every,
            0,
            TOML_INT_MAX,
        )?;
        in_range("train.seed", t.seed, 0, TOML_INT_MAX)?;
        if !(t.lr > 0.0 && t.lr.is_finite()) {
            return Err(range_err("train.lr", "a finite number > 0", t.lr));
        }
        if !(t.weight_decay >= 0.0 && t.weight_decay.is_finite()) {
            return Err(range_err(
                "train.weight_decay",
                "a finite number ≥ 0",
                t.weight_decay,
            ));
        }
        if let Some(threads) = t.threads {
            in_range("train.threads", threads, 0, MAX_COMPUTE_THREADS)?;
            if self.threads.compute != 0 && self.threads.compute != threads {
                return Err(range_err(
                    "train.threads",
                    &format!(
                        "the same value as threads.compute = {} (train.threads is its deprecated spelling)",
                        self.threads.compute
                    ),
                    threads,
                ));
            }
        }
        in_range(
            "threads.compute",
            self.threads.compute,
            0,
            MAX_COMPUTE_THREADS,
        )?;
        in_range("device.ordinal", self.device.ordinal, 0, MAX_DEVICE_ORDINAL)?;
        in_range(
            "device.cache_bytes",
            self.device.cache_bytes,
            0,
            TOML_INT_MAX,
        )?;
        in_range("data.synthetic.seed", s.seed, 0, TOML_INT_MAX)?;
        self.validate_orchestration()?;
        self.validate_dist()?;
        if self.data.path.is_none() {
            in_range("data.synthetic.vertices", s.vertices, 2, u32::MAX)?;
            in_range("data.synthetic.edges", s.edges, 0, MAX_SYNTHETIC_VALUES)?;
            in_range("data.synthetic.classes", s.classes, 1, s.vertices)?;
            let values = s.vertices.checked_mul(s.dim);
            if s.dim == 0 || values.is_none_or(|v| v as u64 > MAX_SYNTHETIC_VALUES) {
                return Err(range_err(
                    "data.synthetic.dim",
                    "at least 1, with vertices × dim ≤ 2^58",
                    s.dim,
                ));
            }
            if !(0.0..=1.0).contains(&s.homophily) {
                return Err(range_err("data.synthetic.homophily", "[0, 1]", s.homophily));
            }
            if !(s.signal >= 0.0 && s.signal.is_finite()) {
                return Err(range_err(
                    "data.synthetic.signal",
                    "a finite number ≥ 0",
                    s.signal,
                ));
            }
        }
        Ok(())
    }
}

impl TrainConfig {
    /// Checks `[dist]`: ranges, and what partitioned features cannot serve.
    fn validate_dist(&self) -> Result<()> {
        let d = &self.dist;
        in_range(
            "dist.remote_cache_rows",
            d.remote_cache_rows,
            0,
            u32::MAX as usize,
        )?;
        if d.features == DistFeatures::Partitioned {
            if self.train.eval_mode == EvalMode::Full {
                return Err(range_err(
                    "train.eval_mode",
                    "\"sampled\" with dist.features = \"partitioned\" (full-graph \
                     evaluation reads every feature row)",
                    self.train.eval_mode,
                ));
            }
        } else if d.remote_cache_rows > 0 {
            return Err(range_err(
                "dist.remote_cache_rows",
                "0 unless dist.features = \"partitioned\"",
                d.remote_cache_rows,
            ));
        } else if let Some(p) = &d.partition_file {
            return Err(range_err(
                "dist.partition_file",
                "no partition file unless dist.features = \"partitioned\"",
                p.display(),
            ));
        }
        Ok(())
    }

    /// Checks `[orchestration]`: ranges, names, and that reuse has what it needs.
    fn validate_orchestration(&self) -> Result<()> {
        let o = &self.orchestration;
        if !(0.0..=1.0).contains(&o.hot_ratio) {
            return Err(range_err("orchestration.hot_ratio", "[0, 1]", o.hot_ratio));
        }
        in_range(
            "orchestration.presample_epochs",
            o.presample_epochs,
            1,
            MAX_PRESAMPLE_EPOCHS,
        )?;
        in_range(
            "orchestration.super_batch",
            o.super_batch,
            1,
            MAX_SUPER_BATCH,
        )?;
        in_range(
            "orchestration.cpu_workers",
            o.cpu_workers,
            1,
            MAX_COMPUTE_THREADS,
        )?;
        in_range(
            "orchestration.staleness_bound",
            o.staleness_bound,
            0,
            TOML_INT_MAX,
        )?;
        if o.policy != Policy::Fixed(Orchestration::Layer) && !o.is_auto() && o.hot_ratio > 0.0 {
            return Err(range_err(
                "orchestration.hot_ratio",
                &format!(
                    "0 with orchestration.policy = \"{}\": step-based placements do not reuse embeddings (only \"layer\" does)",
                    o.policy
                ),
                o.hot_ratio,
            ));
        }
        if o.hot_ratio > 0.0 && self.model.layers < 2 {
            return Err(range_err(
                "orchestration.hot_ratio",
                "0 for a 1-layer model (the bottom layer's output is the logits; reuse needs model.layers ≥ 2)",
                o.hot_ratio,
            ));
        }
        Ok(())
    }
}

/// Largest accepted `model.layers`.
pub const MAX_LAYERS: usize = 16;
/// Largest accepted `model.hidden` (and `model.heads`).
pub const MAX_HIDDEN: usize = 1 << 16;
/// Largest accepted `train.batch_size` / `train.eval_batch_size` (vertex ids are u32).
pub const MAX_BATCH: u32 = u32::MAX;
/// Largest accepted `train.epochs`.
pub const MAX_EPOCHS: usize = 1_000_000;
/// Largest integer TOML can hold (64-bit signed): the bound of counts and seeds
/// that must print back into the effective configuration.
pub const TOML_INT_MAX: u64 = i64::MAX as u64;
/// Largest synthetic edge count and `vertices × dim` (the generators' bound).
const MAX_SYNTHETIC_VALUES: u64 = 1 << 58;

/// Fails unless `lo ≤ v ≤ hi`, naming `key` and the inclusive range.
fn in_range<V, H>(key: &str, v: V, lo: u64, hi: H) -> Result<()>
where
    V: TryInto<u64> + std::fmt::Display + Copy,
    H: TryInto<u64>,
{
    let hi = hi.try_into().unwrap_or(u64::MAX);
    match v.try_into() {
        Ok(x) if (lo..=hi).contains(&x) => Ok(()),
        _ => Err(range_err(key, &format!("{lo}..={hi}"), v)),
    }
}

/// Applies one override to a TOML table; errors name the override.
fn apply_override(table: &mut toml::Table, o: &Override) -> Result<()> {
    let parts: Vec<&str> = o.key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(Error::invalid_argument(
            o.label(),
            format!("`{}` is not a dotted key", o.key),
        ));
    }
    let mut cur = table;
    for p in &parts[..parts.len() - 1] {
        let entry = cur
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = entry.as_table_mut().ok_or_else(|| {
            Error::invalid_argument(o.label(), format!("key `{}`: `{p}` is not a table", o.key))
        })?;
    }
    cur.insert(parts[parts.len() - 1].to_string(), o.toml_value());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<TrainConfig> {
        TrainConfig::from_toml(s, Path::new("t.toml"))
    }

    #[test]
    fn empty_file_gives_defaults_and_round_trips() {
        let c = parse("").unwrap();
        assert_eq!(c, TrainConfig::default());
        let back = parse(&c.to_toml()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_the_key() {
        let e = parse("[train]\nepoch = 3\n").unwrap_err().to_string();
        assert!(e.contains("t.toml") && e.contains("epoch"), "{e}");
        let e = parse("[model]\nhidden = \"big\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.toml") && e.contains("hidden"), "{e}");
        let e = parse("[nope]\n").unwrap_err().to_string();
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn ranges_are_checked() {
        for (toml, key) in [
            ("[model]\nkind = \"mlp\"", "model.kind"),
            ("[model]\ndropout = 1.0", "model.dropout"),
            ("[model]\nlayers = 3", "train.fanouts"),
            (
                "[model]\nkind = \"gat\"\nhidden = 10\nheads = 4",
                "model.hidden",
            ),
            ("[train]\nfanouts = [10, 0]", "train.fanouts"),
            ("[train]\nlr = 0.0", "train.lr"),
            ("[train]\neval_mode = \"exact\"", "train.eval_mode"),
            ("[device]\nfeature_dtype = \"fp16\"", "device.feature_dtype"),
            ("[train]\non_nonfinite = \"ignore\"", "train.on_nonfinite"),
            ("[train]\nbatch_size = 0", "train.batch_size"),
            (
                "[data.synthetic]\nhomophily = 2.0",
                "data.synthetic.homophily",
            ),
        ] {
            let e = parse(toml).unwrap_err().to_string();
            assert!(e.contains(key), "{toml}: {e}");
        }
    }

    #[test]
    fn overrides_apply_with_toml_values() {
        let c = TrainConfig::from_toml_with_overrides(
            "[train]\nepochs = 3\n",
            Path::new("t.toml"),
            &[
                "train.epochs=7".into(),
                "model.kind=gcn".into(),
                "train.fanouts=[5,-1]".into(),
                "data.path=\"x.tds\"".into(),
            ],
        )
        .unwrap();
        assert_eq!(c.train.epochs, 7);
        assert_eq!(c.model.kind, ModelKind::Gcn);
        assert_eq!(c.train_fanouts().unwrap(), vec![5, ALL_NEIGHBORS]);
        assert_eq!(c.data.path.as_deref(), Some(Path::new("x.tds")));
        let e = TrainConfig::from_toml_with_overrides("", Path::new("t"), &["x".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--set"), "{e}");
    }

    fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn device_and_threads_sections_parse_and_name_bad_values() {
        let c = parse("").unwrap();
        assert_eq!(c.device.kind, DeviceKind::Auto);
        assert_eq!(c.device.cache_bytes, 4 << 30);
        assert_eq!(c.device.topology, TopologyPlacement::Device);
        assert_eq!((c.threads.compute, c.threads.pin), (0, PinPolicy::None));
        let c = parse(
            "[device]\nkind = \"cuda\"\nordinal = 1\ncache_bytes = 0\ntopology = \"pinned-host\"\n\
             [threads]\ncompute = 3\npin = \"cores\"\n",
        )
        .unwrap();
        assert_eq!(c.device.kind, DeviceKind::Cuda);
        assert_eq!(c.device.topology, TopologyPlacement::PinnedHost);
        assert_eq!((c.threads.compute, c.threads.pin), (3, PinPolicy::Cores));
        assert_eq!(parse(&c.to_toml()).unwrap(), c);
        for (toml, key) in [
            ("[device]\nkind = \"gpu\"", "device.kind"),
            ("[device]\ntopology = \"host\"", "device.topology"),
            ("[device]\nordinal = -1", "device.ordinal"),
            ("[device]\ncache_bytes = -5", "device.cache_bytes"),
            ("[device]\nmemory = 5", "memory"),
            ("[threads]\npin = \"numa\"", "threads.pin"),
            ("[threads]\ncompute = 5000", "threads.compute"),
            ("[threads]\ncompute = \"all\"", "threads.compute"),
        ] {
            let e = parse(toml).unwrap_err().to_string();
            assert!(e.contains(key), "{toml}: {e}");
        }
        let e = parse("[threads]\ncompute = 5000").unwrap_err().to_string();
        assert!(e.contains("0..=4096"), "{e}");
    }

    #[test]
    fn upper_bounds_and_toml_integer_limits_are_checked() {
        for (toml, key, range) in [
            ("[model]\nlayers = 17", "model.layers", "1..=16"),
            ("[model]\nhidden = 100000", "model.hidden", "1..=65536"),
            ("[train]\nepochs = 2000000", "train.epochs", "1..=1000000"),
            (
                "[data.synthetic]\nvertices = 10\nclasses = 11",
                "data.synthetic.classes",
                "1..=10",
            ),
            (
                "[data.synthetic]\nedges = 400000000000000000",
                "data.synthetic.edges",
                "",
            ),
            ("[data.synthetic]\ndim = 0", "data.synthetic.dim", ""),
        ] {
            let e = parse(toml).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(range), "{toml}: {e}");
        }
        // Values a program can set but TOML cannot print back are refused.
        let mut c = TrainConfig::default();
        c.train.seed = u64::MAX;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("train.seed") && e.contains("9223372036854775807"),
            "{e}"
        );
        let mut c = TrainConfig::default();
        c.device.cache_bytes = u64::MAX;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("device.cache_bytes"));
    }

    #[test]
    fn env_variables_map_to_dotted_keys() {
        let o = env_overrides(vars(&[
            ("TANDEM_TRAIN__BATCH_SIZE", "512"),
            ("TANDEM_DATA__SYNTHETIC__VERTICES", " 1000 "),
            ("TANDEM_REQUIRE_WORDNET", "1"),
            ("PATH", "/bin"),
            ("TANDEM_MODEL__KIND", "gcn"),
        ]))
        .unwrap();
        let keys: Vec<(&str, &str, &str)> = o
            .iter()
            .map(|o| (o.origin.as_str(), o.key.as_str(), o.value.as_str()))
            .collect();
        assert_eq!(
            keys,
            vec![
                (
                    "TANDEM_DATA__SYNTHETIC__VERTICES",
                    "data.synthetic.vertices",
                    "1000"
                ),
                ("TANDEM_MODEL__KIND", "model.kind", "gcn"),
                ("TANDEM_TRAIN__BATCH_SIZE", "train.batch_size", "512"),
            ]
        );
        let e = env_overrides(vars(&[("TANDEM_TRAIN____LR", "1")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("TANDEM_TRAIN____LR"), "{e}");
        let e = env_overrides(vars(&[
            ("TANDEM_TRAIN__LR", "1"),
            ("TANDEM_train__lr", "2"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("TANDEM_TRAIN__LR") && e.contains("TANDEM_train__lr"),
            "{e}"
        );
        #[cfg(unix)]
        {
            use std::ffi::OsString;
            use std::os::unix::ffi::OsStringExt;
            let bad = OsString::from_vec(vec![0xff, 0xfe]);
            let e = env_overrides(vec![(OsString::from("TANDEM_TRAIN__LR"), bad)])
                .unwrap_err()
                .to_string();
            assert!(e.contains("TANDEM_TRAIN__LR") && e.contains("UTF-8"), "{e}");
        }
    }

    #[test]
    fn layers_apply_file_then_env_then_set_and_errors_name_the_source() {
        let file = "[train]\nepochs = 3\nlr = 0.1\nbatch_size = 64\n";
        let mut layers = env_overrides(vars(&[
            ("TANDEM_TRAIN__EPOCHS", "5"),
            ("TANDEM_TRAIN__LR", "0.2"),
        ]))
        .unwrap();
        layers.push(Override::from_set("train.epochs=7").unwrap());
        let c = TrainConfig::from_layers(file, Path::new("run.toml"), &layers).unwrap();
        assert_eq!(
            (c.train.epochs, c.train.lr, c.train.batch_size),
            (7, 0.2, 64)
        );
        // Cross-key checks run once at the end: layers set by env, fanouts by --set.
        let layers = vec![
            env_overrides(vars(&[("TANDEM_MODEL__LAYERS", "3")])).unwrap()[0].clone(),
            Override::from_set("train.fanouts=[5,5,5]").unwrap(),
        ];
        let c = TrainConfig::from_layers("", Path::new("d"), &layers).unwrap();
        assert_eq!(c.model.layers, 3);

        let env = |k: &str, v: &str| {
            TrainConfig::from_layers(
                file,
                Path::new("run.toml"),
                &env_overrides(vars(&[(k, v)])).unwrap(),
            )
            .unwrap_err()
            .to_string()
        };
        let e = env("TANDEM_TRAIN__EPOCH", "5");
        assert!(
            e.contains("TANDEM_TRAIN__EPOCH") && e.contains("train.epoch"),
            "{e}"
        );
        let e = env("TANDEM_TRAIN__EPOCHS", "many");
        assert!(
            e.contains("TANDEM_TRAIN__EPOCHS") && e.contains("epochs"),
            "{e}"
        );
        let e = env("TANDEM_TRAIN__LR", "0");
        assert!(
            e.contains("train.lr") && e.contains("> 0") && e.contains("set by TANDEM_TRAIN__LR"),
            "{e}"
        );
        let e = env("TANDEM_TRAIN__EPOCHS__X", "1");
        assert!(
            e.contains("TANDEM_TRAIN__EPOCHS__X") && e.contains("not a table"),
            "{e}"
        );
        let e = TrainConfig::from_toml_with_overrides(
            file,
            Path::new("run.toml"),
            &["train.lr=-1".into()],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("train.lr") && e.contains("set by --set train.lr=-1"),
            "{e}"
        );
        // A range error in the file itself names the key (no override to blame).
        let e = parse("[train]\nlr = -1\n").unwrap_err().to_string();
        assert!(e.contains("train.lr") && !e.contains("set by"), "{e}");
    }

    #[test]
    fn deprecated_train_threads_folds_into_threads_compute() {
        let c = parse("[train]\nthreads = 2\n").unwrap();
        assert_eq!((c.threads.compute, c.train.threads), (2, None));
        assert!(!c.to_toml().contains("[train]\nthreads") && c.compute_threads() == 2);
        let c = parse("[train]\nthreads = 2\n[threads]\ncompute = 2\n").unwrap();
        assert_eq!(c.threads.compute, 2);
        let e = parse("[train]\nthreads = 2\n[threads]\ncompute = 3\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("train.threads") && e.contains("threads.compute = 3"),
            "{e}"
        );
        // Set in code: honoured without folding, and checked.
        let mut c = TrainConfig::default();
        c.train.threads = Some(3);
        assert_eq!(c.compute_threads(), 3);
        c.validate().unwrap();
        c.threads.compute = 1;
        assert!(c.validate().is_err());
    }

    /// Dotted keys and values of a TOML table, depth first.
    fn flatten(prefix: &str, t: &toml::Table, out: &mut Vec<(String, toml::Value)>) {
        for (k, v) in t {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(sub) => flatten(&key, sub, out),
                other => out.push((key, other.clone())),
            }
        }
    }

    fn same_value(a: &toml::Value, b: &toml::Value) -> bool {
        match (a, b) {
            (toml::Value::Float(x), toml::Value::Float(y)) => {
                (x - y).abs() <= 1e-6 * x.abs().max(y.abs())
            }
            (toml::Value::Array(x), toml::Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q))
            }
            _ => a == b,
        }
    }

    #[test]
    fn orchestration_section_parses_and_names_bad_values() {
        let c = parse("").unwrap();
        assert_eq!(c.orchestration.policy, Policy::Auto);
        assert_eq!(c.orchestration.hot_ratio, 0.0);
        assert!(!c.orchestration.reuses_embeddings());
        let c = parse(
            "[orchestration]\npolicy = \"layer\"\nhot_ratio = 0.2\nhotness = \"degree\"\nsuper_batch = 2\n\
             staleness_bound = 3\non_late = \"compute\"\npresample_epochs = 1",
        )
        .unwrap();
        let o = &c.orchestration;
        assert!(o.reuses_embeddings());
        assert_eq!(o.hotness, Hotness::Degree);
        assert_eq!(o.on_late, OnLate::Compute);
        assert_eq!((o.super_batch, o.staleness_bound), (2, 3));
        for (text, key) in [
            (
                "[orchestration]\nhot_ratio = 1.5",
                "orchestration.hot_ratio",
            ),
            (
                "[orchestration]\nhot_ratio = -0.1",
                "orchestration.hot_ratio",
            ),
            ("[orchestration]\npolicy = \"gpu\"", "orchestration.policy"),
            (
                "[orchestration]\nhotness = \"random\"",
                "orchestration.hotness",
            ),
            (
                "[orchestration]\non_late = \"skip\"",
                "orchestration.on_late",
            ),
            (
                "[orchestration]\nsuper_batch = 0",
                "orchestration.super_batch",
            ),
            (
                "[orchestration]\npresample_epochs = 0",
                "orchestration.presample_epochs",
            ),
            (
                "[orchestration]\nstaleness_bound = -1",
                "orchestration.staleness_bound",
            ),
            // Reuse needs a layer above the bottom.
            (
                "[model]\nlayers = 1\n[train]\nfanouts = [5]\n\
                 [orchestration]\nhot_ratio = 0.2",
                "orchestration.hot_ratio",
            ),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
        // Reuse is for the layer-based policy only.
        let e = parse("[orchestration]\npolicy = \"gpu-sample-gpu-gather\"\nhot_ratio = 0.2")
            .unwrap_err()
            .to_string();
        assert!(e.contains("only \"layer\""), "{e}");
    }

    /// The shipped example configs load and validate; `run.toml` spells out
    /// the defaults (so the README's first example is the default run).
    #[test]
    fn example_configs_load_and_run_toml_is_the_defaults() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/configs");
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("examples/configs") {
            let path = entry.expect("entry").path();
            let c = TrainConfig::load(&path, &[]).unwrap_or_else(|e| panic!("{e}"));
            c.validate()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            names.push(path.file_name().unwrap().to_string_lossy().into_owned());
            if path.ends_with("run.toml") {
                assert_eq!(c, TrainConfig::default(), "run.toml is not the defaults");
            }
        }
        assert!(names.iter().any(|n| n == "run.toml"), "{names:?}");
    }

    #[test]
    fn docs_list_every_key_with_its_default() {
        let doc_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/config.md");
        let doc = std::fs::read_to_string(doc_path).expect("docs/config.md");
        // Rows `| `key` | type | default | unit | allowed | meaning |`.
        let mut rows: Vec<(String, String)> = Vec::new();
        for line in doc.lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            if cells.len() < 8 || !cells[1].starts_with('`') {
                continue;
            }
            let key = cells[1].trim_matches('`').to_string();
            assert!(
                !rows.iter().any(|(k, _)| *k == key),
                "docs/config.md lists `{key}` twice"
            );
            rows.push((key, cells[3].to_string()));
        }
        let table: toml::Table = TrainConfig::default().to_toml().parse().unwrap();
        let mut defaults = Vec::new();
        flatten("", &table, &mut defaults);
        assert!(defaults.len() > 30, "{defaults:?}");
        for (key, value) in &defaults {
            let (_, cell) = rows
                .iter()
                .find(|(k, _)| k == key)
                .unwrap_or_else(|| panic!("docs/config.md does not list `{key}`"));
            let documented = format!("v = {}", cell.trim_matches('`'))
                .parse::<toml::Table>()
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| panic!("`{key}`: default cell {cell} is not a TOML value"));
            assert!(
                same_value(&documented, value),
                "`{key}`: docs/config.md says {cell}, the schema's default is {value}"
            );
        }
        // Keys without a default (unset) exist: setting them parses.
        for (key, cell) in &rows {
            if defaults.iter().any(|(k, _)| k == key) {
                continue;
            }
            assert_eq!(cell, "unset", "`{key}` is documented but not in the schema");
            let sets: Vec<String> = match key.as_str() {
                "data.path" => vec![format!("{key}=\"x.tds\"")],
                // A partition file only goes with partitioned features.
                "dist.partition_file" => vec![
                    "dist.features=\"partitioned\"".into(),
                    "train.eval_mode=\"sampled\"".into(),
                    format!("{key}=\"p.txt\""),
                ],
                _ => vec![format!("{key}=0")],
            };
            TrainConfig::from_toml_with_overrides("", Path::new("doc"), &sets)
                .unwrap_or_else(|e| panic!("documented key `{key}` is refused: {e}"));
        }
    }
}
