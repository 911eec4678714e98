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

mod layers;
#[cfg(test)]
mod tests;
mod validate;

pub use layers::{env_overrides, Override, ENV_PREFIX};
pub use validate::{MAX_BATCH, MAX_EPOCHS, MAX_HIDDEN, MAX_LAYERS, TOML_INT_MAX};

use std::path::PathBuf;

use cpu_ops::{ModelConfig, ModelKind, ALL_NEIGHBORS};
use gpu_ops::{FeatureDtype, HotGrad, Precision, TopologyPlacement};
use scheduler::{Hotness, MonitorControl, OnLate, Orchestration, Policy};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use crate::task::LinkMetric;

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
    /// Link prediction (`model.task = "link"`): negatives, exclusion, decoder,
    /// evaluation.
    pub link: LinkSection,
}

/// `[data]`: a stored dataset, or the built-in synthetic graph.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// A `.tds` dataset; when absent, `synthetic` is generated in-process. A
    /// relative path in a configuration file is taken from the file's folder
    /// ([`TrainConfig::load_layered`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// The built-in dataset's parameters.
    pub synthetic: SyntheticConfig,
    /// Which layer set `path`: the file, or the `--set` argument or variable
    /// that overrode it (`None`: set in code, or unset). Errors about the
    /// dataset file name it ([`crate::Error::DataPath`]); not part of the TOML.
    #[serde(skip)]
    pub path_origin: Option<String>,
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
    /// `"auto"`, `"fp32"` or `"tf32"`: the arithmetic of a device engine's
    /// matrix products.
    pub precision: ModelPrecision,
    /// `"node"` (classify vertices) or `"link"` (score edges; `[link]`).
    pub task: TaskKind,
}

/// `model.task`: what the model is trained to predict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskKind {
    /// Node classification: one label per vertex, cross-entropy.
    #[default]
    Node,
    /// Link prediction: positive edges against sampled negatives, a decoder
    /// scoring vertex pairs, binary cross-entropy (`[link]`).
    Link,
}

/// `link.negative_sampler`: where a negative's destination is drawn from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NegativeSamplerKind {
    /// Uniformly over the vertices.
    #[default]
    Uniform,
    /// In proportion to degree^0.75 (word2vec's distribution).
    Degree,
}

/// `link.exclude`: which edges a training batch keeps out of its sampled
/// message-passing graph, so that the model cannot read the answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExcludeKind {
    /// `"reverse"` on a store whose graph holds every edge both ways
    /// (undirected), `"self"` otherwise.
    #[default]
    Auto,
    /// Nothing: the positive edges stay in the sampled graph.
    None,
    /// The batch's positive edges.
    #[serde(rename = "self")]
    SelfEdges,
    /// The batch's positive edges and their reverses.
    Reverse,
}

/// `orchestration.hot_backward`: what layer 0's backward does with the hot
/// rows the layer path reuses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HotBackward {
    /// `"aggregate"` for link prediction, `"constant"` for node
    /// classification ([`HotBackward::for_task`]).
    #[default]
    Auto,
    /// Reused rows are constants: hot destinations give layer 0 no gradient.
    Constant,
    /// Their gradient flows into layer 0 through the device's aggregate of
    /// their sampled neighbours.
    Aggregate,
}

impl HotBackward {
    /// The backward mode for `task`. `"auto"` takes `"aggregate"` for link
    /// prediction: its seeds are the endpoints of the batch's edges, and on a
    /// link set still learning, `"constant"`'s missing layer-0 gradient left
    /// the layer path 3 points of test MRR behind the exact path where
    /// `"aggregate"` matched it. Node classification keeps the paper's
    /// `"constant"`, within its accuracy target and cheaper on a GPU, where
    /// `"aggregate"` has the device sample and aggregate the hot destinations'
    /// neighbourhoods too (reuse then saves the device nothing).
    pub fn for_task(self, task: TaskKind) -> HotGrad {
        match (self, task) {
            (HotBackward::Constant, _) | (HotBackward::Auto, TaskKind::Node) => HotGrad::Constant,
            (HotBackward::Aggregate, _) | (HotBackward::Auto, TaskKind::Link) => HotGrad::Aggregate,
        }
    }
}

/// `link.decoder`: how a vertex pair's embeddings become a score.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecoderKind {
    /// The dot product of the two embeddings.
    #[default]
    Dot,
    /// A two-layer perceptron on their element-wise product.
    Mlp,
}

/// `[link]`: link prediction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinkSection {
    /// Negatives drawn per positive edge in training (≥ 1): each keeps the
    /// positive's source and draws a destination.
    pub negatives: u32,
    /// `"uniform"` or `"degree"` (∝ degree^0.75).
    pub negative_sampler: NegativeSamplerKind,
    /// `"auto"`, `"none"`, `"self"` or `"reverse"`.
    pub exclude: ExcludeKind,
    /// `"dot"` or `"mlp"`.
    pub decoder: DecoderKind,
    /// Negatives per validation or test positive (≥ 1), drawn once per split
    /// from `train.seed` unless the store holds fixed ones.
    pub eval_negatives: u32,
    /// What evaluation reports: `"mrr"`, `"hits@K"` (K ≥ 1), `"auc"`; the first
    /// one selects the best validation epoch.
    pub metrics: Vec<String>,
}

impl Default for LinkSection {
    fn default() -> Self {
        Self {
            negatives: 1,
            negative_sampler: NegativeSamplerKind::Uniform,
            exclude: ExcludeKind::Auto,
            decoder: DecoderKind::Dot,
            eval_negatives: 100,
            metrics: vec!["mrr".into(), "hits@10".into(), "auc".into()],
        }
    }
}

impl LinkSection {
    /// `link.metrics`, parsed (checked by [`TrainConfig::validate`]).
    pub fn metric_list(&self) -> Vec<LinkMetric> {
        self.metrics
            .iter()
            .filter_map(|m| LinkMetric::parse(m))
            .collect()
    }
}

/// `model.precision`: an arithmetic ([`Precision`]) or `"auto"`, resolved
/// once the device is open ([`ModelPrecision::resolve`]). Its own type because
/// `"auto"` is a choice, not an arithmetic a backend could run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelPrecision {
    /// TF32 products for SAGE and GCN on a CUDA device (tensor cores: GEMMs
    /// 2.71× fp32 on an H200); FP32 for GAT, whose attention moved test
    /// accuracy by up to half a point under TF32, and on the host backend,
    /// where TF32 is only an emulation (a rounding copy) that saves nothing
    /// (the measurements: docs/config.md, "TF32 accuracy").
    #[default]
    Auto,
    /// IEEE single precision throughout.
    Fp32,
    /// TF32 products on every backend (the host rounds the same way).
    Tf32,
}

impl ModelPrecision {
    /// The arithmetic of a `kind` model on a CUDA device (`on_cuda`) or the
    /// host backend.
    pub fn resolve(self, on_cuda: bool, kind: ModelKind) -> Precision {
        match self {
            Self::Auto if on_cuda && kind != ModelKind::Gat => Precision::Tf32,
            Self::Auto | Self::Fp32 => Precision::Fp32,
            Self::Tf32 => Precision::Tf32,
        }
    }
}

impl std::fmt::Display for ModelPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Fp32 => "fp32",
            Self::Tf32 => "tf32",
        })
    }
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            kind: ModelKind::Sage,
            layers: 2,
            hidden: 256,
            heads: 4,
            dropout: 0.5,
            precision: ModelPrecision::Auto,
            task: TaskKind::Node,
        }
    }
}

/// `[train]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Sampling fanout per layer, input layer first; -1 takes every neighbor.
    pub fanouts: Vec<i64>,
    /// How validation/test accuracy is computed: `"sampled"` (default) runs
    /// mini-batches of `eval_batch_size` validation/test seeds sampled with
    /// `eval_fanouts`, so its memory is bounded by the batch, not the graph;
    /// `"full"` applies each layer to the whole graph before the next (layer-wise
    /// full-neighbor inference, as DGL's `inference`; exact GCN normalization with
    /// full-graph degrees), holding activations of every vertex.
    pub eval_mode: EvalMode,
    /// Fanouts for `eval_mode = "sampled"`; empty means each layer's training
    /// fanout raised to at least [`DEFAULT_EVAL_FANOUT_FLOOR`] (`-1` stays
    /// `-1`; see [`TrainConfig::eval_fanouts`]); `-1` at a layer takes every
    /// neighbor there.
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
            eval_mode: EvalMode::Sampled,
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

/// `device.cache_bytes = "auto"`: the feature cache takes what the device's
/// free memory (or `device.memory_budget_bytes`) leaves after the topology and
/// the working set (`placement/budget.rs`). Read and written as the string
/// `"auto"`.
pub const CACHE_BYTES_AUTO: u64 = u64::MAX;

/// `device.topology`: where the graph topology lives for device-side sampling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyChoice {
    /// On the device when it fits in the free memory (or the budget) beside the
    /// working set, else pinned host (`placement/budget.rs`); `"device"` on the
    /// host backend.
    #[default]
    Auto,
    /// Copied into device memory.
    Device,
    /// Left in pinned host memory and sampled over the bus.
    PinnedHost,
}

impl TopologyChoice {
    /// The placement when not `"auto"`.
    pub fn fixed(self) -> Option<TopologyPlacement> {
        match self {
            Self::Auto => None,
            Self::Device => Some(TopologyPlacement::Device),
            Self::PinnedHost => Some(TopologyPlacement::PinnedHost),
        }
    }
}

impl From<TopologyPlacement> for TopologyChoice {
    fn from(p: TopologyPlacement) -> Self {
        match p {
            TopologyPlacement::Device => Self::Device,
            TopologyPlacement::PinnedHost => Self::PinnedHost,
        }
    }
}

/// `device.cache_bytes` as bytes or `"auto"` ([`CACHE_BYTES_AUTO`]).
mod cache_bytes_serde {
    use super::CACHE_BYTES_AUTO;
    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Bytes(u64),
        Word(String),
    }

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        if *v == CACHE_BYTES_AUTO {
            s.serialize_str("auto")
        } else {
            s.serialize_u64(*v)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        match Repr::deserialize(d) {
            Ok(Repr::Bytes(b)) => Ok(b),
            Ok(Repr::Word(w)) if w == "auto" => Ok(CACHE_BYTES_AUTO),
            _ => Err(serde::de::Error::custom(
                "expected a byte count (0 ..= 2^63 - 1) or \"auto\"",
            )),
        }
    }
}

/// `[device]`: which accelerator trains and how its memory is used.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeviceSection {
    /// `"auto"`, `"host"` or `"cuda"`.
    pub kind: DeviceKind,
    /// GPU index (CUDA ordinal) when `kind` selects a GPU.
    pub ordinal: u32,
    /// Device feature-cache budget in bytes (0: no cache; [`CACHE_BYTES_AUTO`]:
    /// `"auto"`, what the free memory leaves).
    #[serde(with = "cache_bytes_serde")]
    pub cache_bytes: u64,
    /// `"auto"`, `"device"` or `"pinned-host"`.
    pub topology: TopologyChoice,
    /// `"f32"` or `"bf16"`: how a device engine stores feature rows.
    pub feature_dtype: FeatureDtype,
    /// Sample each training batch while the one before it trains (a second
    /// stream on CUDA).
    pub sample_ahead: bool,
    /// The most device memory the job's engine may plan for (0: what the
    /// device has free); the feature cache shrinks to fit it.
    pub memory_budget_bytes: u64,
    /// Batches between a step and the read of its loss (`0`: 8 on CUDA, 1 on
    /// the host backend): the step-based executor reads the losses of this many
    /// batches at once, so a steady batch does not wait for the device.
    pub loss_lag: u32,
}

impl Default for DeviceSection {
    fn default() -> Self {
        Self {
            kind: DeviceKind::Auto,
            ordinal: 0,
            cache_bytes: DEFAULT_CACHE_BYTES,
            topology: TopologyChoice::Auto,
            feature_dtype: FeatureDtype::F32,
            memory_budget_bytes: 0,
            sample_ahead: true,
            loss_lag: 0,
        }
    }
}

pub use crate::dist::DistReduce;

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
    /// Layer-wise full-graph inference (activations of every vertex).
    Full,
    /// Mini-batches of the evaluated vertices sampled with `train.eval_fanouts`.
    #[default]
    Sampled,
}
config_name!(EvalMode { Full => "full", Sampled => "sampled" });
config_name!(TaskKind { Node => "node", Link => "link" });
config_name!(NegativeSamplerKind { Uniform => "uniform", Degree => "degree" });
config_name!(ExcludeKind { Auto => "auto", None => "none", SelfEdges => "self", Reverse => "reverse" });
config_name!(DecoderKind { Dot => "dot", Mlp => "mlp" });
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
    /// `"auto"`, `"constant"` or `"aggregate"` ([`HotBackward`]).
    pub hot_backward: HotBackward,
    /// Whether the hybrid monitor moves hot vertices between CPU compute and the
    /// device feature cache.
    pub monitor: bool,
    /// What the monitor steers by: `"time"` (the measured time per super-batch;
    /// it searches the CPU share, down to none) or `"balance"` (the accelerator's
    /// wait against the CPU's idle time).
    pub monitor_control: MonitorControl,
    /// CPU worker threads computing hot embeddings (≥ 1).
    pub cpu_workers: usize,
    /// Keep CPU-computed hot embeddings on the device across super-batches and
    /// recompute one only when using it in the coming super-batch would exceed
    /// `staleness_bound` (effective when the bound is at least `super_batch`).
    pub reuse_across_superbatches: bool,
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
            hot_backward: HotBackward::Auto,
            monitor: false,
            monitor_control: MonitorControl::Time,
            cpu_workers: 1,
            reuse_across_superbatches: true,
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
    Error::config_value(key, expected, found.to_string())
}

/// The fewest neighbors a layer samples in sampled evaluation when
/// `train.eval_fanouts` is empty ([`TrainConfig::eval_fanouts`]): SALIENT's test
/// fanouts (20 per layer for its [15, 10, 5] training), within 0.001 of
/// full-graph inference on the default dataset at 2 and 3 layers.
pub const DEFAULT_EVAL_FANOUT_FLOOR: u32 = 20;

fn fanouts(key: &str, v: &[i64]) -> Result<Vec<u32>> {
    v.iter()
        .map(|&f| match f {
            -1 => Ok(ALL_NEIGHBORS),
            1..=0xFFFF_FFFE => Ok(f as u32),
            _ => Err(range_err(key, "positive fanouts or -1 (all neighbors)", f)),
        })
        .collect()
}

impl TrainConfig {
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
    /// `num_classes` classes: a link-prediction model's top layer outputs
    /// `model.hidden`-wide embeddings instead of class logits.
    pub fn model_config(&self, in_dim: usize, num_classes: usize) -> Result<ModelConfig> {
        Ok(ModelConfig {
            kind: self.model.kind,
            in_dim,
            hidden: self.model.hidden,
            num_classes: match self.model.task {
                TaskKind::Node => num_classes,
                TaskKind::Link => self.model.hidden,
            },
            num_layers: self.model.layers,
            heads: self.model.heads,
            dropout: self.model.dropout,
        })
    }

    /// What the encoder's top layer feeds: class logits (`model.task =
    /// "node"`) or `link.decoder` (`"link"`).
    pub fn head(&self) -> gpu_ops::Head {
        match self.model.task {
            TaskKind::Node => gpu_ops::Head::Classify,
            TaskKind::Link => gpu_ops::Head::Link(match self.link.decoder {
                DecoderKind::Dot => gpu_ops::Decoder::Dot,
                DecoderKind::Mlp => gpu_ops::Decoder::Mlp,
            }),
        }
    }

    /// Training fanouts as the sampler takes them.
    pub fn train_fanouts(&self) -> Result<Vec<u32>> {
        fanouts("train.fanouts", &self.train.fanouts)
    }

    /// Evaluation fanouts: `train.eval_fanouts`, or when that is empty each
    /// layer's training fanout raised to at least [`DEFAULT_EVAL_FANOUT_FLOOR`]
    /// (every neighbor stays every neighbor). Sampled evaluation with the
    /// training fanouts reports a noisier, lower accuracy than full-neighbor
    /// inference of the same weights; the floor closes most of that gap at a
    /// working set still bounded by `train.eval_batch_size` (measurements in
    /// `docs/config.md`).
    pub fn eval_fanouts(&self) -> Result<Vec<u32>> {
        if self.train.eval_fanouts.is_empty() {
            Ok(self
                .train_fanouts()?
                .into_iter()
                .map(|f| f.max(DEFAULT_EVAL_FANOUT_FLOOR))
                .collect())
        } else {
            fanouts("train.eval_fanouts", &self.train.eval_fanouts)
        }
    }
}
