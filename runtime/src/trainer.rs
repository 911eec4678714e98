//! The host training loop: sample → gather → forward → loss → backward → step, on
//! the CPU, for one dataset and one model, with validation and test accuracy.
//!
//! # One epoch
//! 1. Shuffle the training vertices with `(seed, epoch)`; cut batches of
//!    `train.batch_size` seeds.
//! 2. For batch `k`, *prepare* (sample blocks with the training fanouts, gather the
//!    input rows) and *compute* (forward with dropout, softmax cross-entropy on the
//!    seeds' labels, hand-written backward, Adam step). Preparing batch `k+1` runs
//!    concurrently with computing batch `k` (`rayon::join`), so sampling and gather
//!    hide behind the dense math; both still use the one rayon pool.
//! 3. Every `train.eval_every` epochs (and after the last), evaluate validation and
//!    test accuracy without dropout. `train.eval_mode = "full"` (default) applies
//!    each layer to the whole graph before the next — layer-wise full-neighbor
//!    inference, DGL's `inference` pattern: one pass gives every vertex's logits,
//!    and GCN's normalization uses full-graph degrees, independent of how the
//!    evaluated vertices are batched. `"sampled"` evaluates mini-batches of
//!    shuffled seeds sampled with `train.eval_fanouts`.
//!
//! Everything random derives from `train.seed` (initialization, shuffles, sampling,
//! dropout), so a run is reproducible; sampling does not depend on the thread count.
//! Batch `k` of epoch `e` depends only on `(seed, e, k)` and the weights, which is
//! why a run interrupted between batches (cancel token, callback, checkpoint) and
//! continued gives bit-identical parameters and losses.
//!
//! # Ownership
//! A trainer owns its dataset, model, optimizer, compute pool (its own rayon pool),
//! callbacks and cancel token; there is no global state, so several trainers can
//! run in one process on different threads. It prints nothing unless built with
//! `verbose(true)` (one line per epoch on stderr). Build one with
//! [`crate::TrainerBuilder`] or [`Trainer::new`].
//!
//! ```
//! use runtime::TrainerBuilder;
//!
//! # fn main() -> runtime::Result<()> {
//! let toml = "[data.synthetic]\nvertices = 400\nedges = 2000\nclasses = 2\ndim = 4\n\
//!             [model]\nhidden = 8\n[train]\nepochs = 2\n[threads]\ncompute = 1\n";
//! let mut trainer = TrainerBuilder::from_toml(toml)?.build()?;
//! let epoch = trainer.train_epoch()?; // one epoch, evaluated as train.eval_every says
//! assert_eq!((epoch.epoch, trainer.epoch()), (0, 1));
//! let (val, test) = trainer.evaluate_val_test()?;
//! assert!((0.0..=1.0).contains(&val) && (0.0..=1.0).contains(&test));
//! assert_eq!(trainer.predict(&[3, 9])?.dim(), (2, 2)); // logits
//! # Ok(())
//! # }
//! ```

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cpu_ops::{
    accuracy_count, derive_seed, gather_rows, softmax_cross_entropy, Adam, AdamConfig, BlockView,
    CpuOpsError, MatMut, MatRef, Model, ModelInput, NeighborSampler, Optimizer, Rng, SampledBatch,
    SamplerScratch, SparseRows, WeightDecay,
};

use ndarray::Array2;
use rayon::ThreadPool;

use crate::auto::{Calibrator, ProbeStep};
use crate::checkpoint::{Checkpoint, DatasetShape, Position, TensorState};
use crate::config::{
    DistFeatures, DistFullEval, DistReduce, EvalMode, FeatureDtypeName, OnNonFiniteKind,
    PolicyName, PrecisionName, SparseFeatures, TrainConfig,
};
use crate::control::{BatchMetrics, Callback, CancelToken, Control, StopCause};
use crate::dataset::{open_dataset, Dataset, SplitSpec, Verify};
use crate::dist::features::PartitionedFeatures;
use crate::dist::{share, Communicator, DistStats, Solo};
use crate::embedding::Embeddings;
use crate::engine::{choose_engine, BatchGradients, Engine, EngineOptions, ReduceOn};
use crate::error::{Error, Result};
use crate::generate::{generate_sbm, SbmOptions};
use crate::orchestrate::clock::{wall_clock, SharedClock};
use crate::orchestrate::pipeline::{BatchDone, EpochEnd, EpochRun};
use crate::orchestrate::{InjectedFault, OrchestrationStats, Orchestrator};
use crate::pool::build_pool;
use crate::trace::{FlowId, SliceGuard, Tracer, TrackId, TrackKind, CACHE_HIT_RATE};

/// `hot_ratio` of the layer-based candidate `policy = "auto"` measures when the
/// configured one is 0.
pub const AUTO_HOT_RATIO: f64 = 0.2;

/// The step-based placement of a policy (`"layer"` samples and gathers on the
/// accelerator).
fn step_placement(o: scheduler::Orchestration) -> scheduler::StepBased {
    use scheduler::{Device::Accelerator as Acc, Device::Cpu, Orchestration as O};
    match o {
        O::Layer | O::GpuSampleGpuGather => scheduler::StepBased::new(Acc, Acc),
        O::CpuSampleCpuGather => scheduler::StepBased::new(Cpu, Cpu),
        O::GpuSampleCpuGather => scheduler::StepBased::new(Acc, Cpu),
        O::CpuSampleGpuGather => scheduler::StepBased::new(Cpu, Acc),
    }
}

/// What one epoch did.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochStats {
    /// 0-based epoch index.
    pub epoch: usize,
    /// Mean training loss over the epoch's batches (weighted by batch size).
    pub loss: f64,
    /// Training accuracy over the epoch's batches (with dropout, as trained).
    pub train_acc: f64,
    /// Validation accuracy, when evaluated this epoch.
    pub val_acc: Option<f64>,
    /// Test accuracy, when evaluated this epoch.
    pub test_acc: Option<f64>,
    /// Seconds spent training (sampling, gather, forward, backward, step).
    pub train_secs: f64,
    /// Seconds spent evaluating.
    pub eval_secs: f64,
    /// Number of training batches.
    pub batches: usize,
    /// Optimizer steps taken by the end of the epoch (the weight version).
    pub steps: u64,
    /// What layer-based orchestration did this epoch (`None` without embedding
    /// reuse): staleness gaps, waits, vertices computed cold, CPU jobs.
    pub orchestration: Option<OrchestrationStats>,
    /// `policy = "auto"` was still measuring placements during this epoch.
    pub calibrating: bool,
    /// What `policy = "auto"` chose, and why, in the epoch it decided.
    pub auto_choice: Option<String>,
    /// Batches skipped for a non-finite loss (`train.on_nonfinite = "skip-batch"`).
    pub skipped_batches: usize,
}

/// Loads the configured dataset, or generates the built-in synthetic one.
pub fn load_dataset(cfg: &TrainConfig) -> Result<Dataset> {
    match &cfg.data.path {
        Some(p) => open_dataset(p, Verify::Default),
        None => {
            let s = &cfg.data.synthetic;
            generate_sbm(&SbmOptions {
                num_vertices: s.vertices,
                num_edges: s.edges,
                num_classes: s.classes,
                homophily: s.homophily,
                feature_dim: s.dim,
                signal: s.signal,
                split: SplitSpec::default(),
                seed: s.seed,
                ..SbmOptions::default()
            })
        }
    }
}

/// Gathered input features of a batch, dense or sparse.
enum Inputs {
    Dense(Vec<f32>),
    Sparse(SparseRows<f32>),
}

impl Inputs {
    fn as_model_input(&self) -> ModelInput<'_, f32> {
        match self {
            Self::Dense(x) => ModelInput::Dense(x),
            Self::Sparse(x) => ModelInput::Sparse(x),
        }
    }
}

/// A prepared batch: its seeds, sampled blocks and gathered input features.
struct Prepared<'t> {
    seeds: Vec<u32>,
    batch: SampledBatch,
    x: Inputs,
    seed: u64,
    probe: Probe<'t>,
}

/// Where a batch's trace slices go: the tracer, the batch's epoch and index, and
/// the flow from its preparation to its compute. With a disabled tracer, recording
/// is a no-op.
#[derive(Clone, Copy)]
struct Probe<'t> {
    tracer: &'t Tracer,
    epoch: u64,
    batch: u64,
    flow: FlowId,
}

impl<'t> Probe<'t> {
    fn new(tracer: &'t Tracer, epoch: usize, batch: usize) -> Self {
        Self {
            tracer,
            epoch: epoch as u64,
            batch: batch as u64,
            flow: tracer.flow("prepare→compute"),
        }
    }

    /// Starts slice `name` with this batch's epoch and index.
    fn slice(&self, name: &'static str) -> SliceGuard<'t> {
        self.tracer.slice(name).epoch(self.epoch).batch(self.batch)
    }
}

/// The non-zeros of every row of `f`, as sparse rows.
fn sparse_rows(f: &cpu_ops::FeatureMatrix) -> Result<SparseRows<f32>> {
    SparseRows::from_dense(f.as_slice(), f.num_rows(), f.dim()).map_err(kernel("sparse features"))
}

/// The non-zeros of `f`'s rows for which `keep` holds (the others empty), as
/// sparse rows: a rank's own rows of partitioned features, read row by row.
fn sparse_rows_where(
    f: &cpu_ops::FeatureMatrix,
    keep: impl Fn(usize) -> bool,
) -> Result<SparseRows<f32>> {
    let (n, dim) = (f.num_rows(), f.dim());
    let mut indptr = Vec::with_capacity(n + 1);
    let (mut cols, mut vals) = (Vec::new(), Vec::new());
    indptr.push(0u64);
    for v in 0..n {
        if keep(v) {
            for (c, &x) in f.row(v).iter().enumerate() {
                if x != 0.0 {
                    cols.push(c as u32);
                    vals.push(x);
                }
            }
        }
        indptr.push(cols.len() as u64);
    }
    SparseRows::from_parts(indptr, cols, vals, dim).map_err(kernel("sparse features"))
}

/// Fraction of non-zero values, estimated on up to 4096 evenly spaced rows.
fn feature_density(f: &cpu_ops::FeatureMatrix) -> f64 {
    let n = f.num_rows();
    if n == 0 || f.dim() == 0 {
        return 1.0;
    }
    let step = n.div_ceil(4096);
    let (mut nz, mut total) = (0usize, 0usize);
    for r in (0..n).step_by(step) {
        let row = f.row(r);
        nz += row.iter().filter(|&&v| v != 0.0).count();
        total += row.len();
    }
    nz as f64 / total as f64
}

/// A model being trained on a dataset.
pub struct Trainer {
    ds: Arc<Dataset>,
    cfg: TrainConfig,
    model: Model<f32>,
    opt: Adam<f32>,
    sampler: NeighborSampler,
    eval_sampler: NeighborSampler,
    scratch: SamplerScratch,
    sparse: Option<SparseRows<f32>>,
    /// The trainer reads sparse rows but has not built them: with
    /// `dist.features = "partitioned"` they are built once the communicator is
    /// known, for the rank's own rows only ([`Trainer::set_communicator`]), or
    /// for every row before the first use in a one-rank run.
    sparse_pending: bool,
    train_ids: Vec<u32>,
    val_ids: Vec<u32>,
    test_ids: Vec<u32>,
    /// Where training stands: the epoch in progress and how far into it.
    pos: Position,
    pool: Arc<ThreadPool>,
    callbacks: Vec<Box<dyn Callback>>,
    cancel: CancelToken,
    verbose: bool,
    /// A callback asked to stop at the end of the last epoch.
    stop_requested: bool,
    /// Embeddings of the current weights, computed on first request.
    embeddings: Option<Embeddings>,
    /// Full-graph logits of the current weights (`n × classes`, in the same row
    /// table type), computed on the first `predict`.
    logits: Option<Embeddings>,
    /// Where training and evaluation record their slices (disabled by default).
    tracer: Tracer,
    /// The device engine's track in `tracer`.
    acc_track: TrackId,
    /// The accelerator engine when training runs on a device backend (`None`: the
    /// native host path above). While it exists it holds the current weights;
    /// `model`/`opt` are refreshed from it after every batch loop.
    engine: Option<Mutex<Box<dyn Engine>>>,
    /// What `[device]` chose, and why.
    device_note: String,
    /// Layer-based orchestration with embedding reuse (`orchestration.hot_ratio >
    /// 0` and a device engine, or `policy = "auto"` choosing it): epochs run
    /// through its pipeline.
    orch: Option<Orchestrator>,
    /// `policy = "auto"` while it measures (`None` once decided, or when the
    /// policy is fixed).
    calibrator: Option<Calibrator>,
    /// What `policy = "auto"` chose, and why.
    auto_choice: Option<scheduler::Choice>,
    /// The clock measurements read.
    clock: SharedClock,
    /// Where `fit` writes checkpoints.
    checkpoint_path: Option<std::path::PathBuf>,
    /// `train.on_nonfinite`.
    on_nonfinite: OnNonFinite,
    /// Batches of the epoch in progress skipped for a non-finite loss.
    skipped: usize,
    /// The ranks of a distributed job ([`Solo`] unless set).
    dist: Dist,
}

/// A trainer's part in a distributed job ([`Trainer::set_communicator`]).
struct Dist {
    comm: Arc<dyn Communicator>,
    /// `dist.features = "partitioned"` with more than one rank.
    /// (Shared with a device engine, which gathers its input rows through it.)
    features: Option<Arc<PartitionedFeatures>>,
    /// The gradient all-reduces' counters (the exchanges keep their own).
    stats: DistStats,
    /// The step's all-reduce bucket: gradients, then [`BUCKET_SCALARS`] scalars.
    bucket: Vec<f32>,
    /// The device engine sums the gradients on the device (NCCL): the bucket
    /// then holds the scalars only. The transport's line.
    device_reduce: Option<String>,
    /// Full-graph evaluation is sharded over the ranks (`dist.full_eval`).
    shard_full_eval: bool,
    /// The sharded evaluation's block and GCN input scale, made by the first
    /// evaluation (the graph, this rank's range and the model kind are fixed).
    shard_block: std::sync::OnceLock<ShardBlock>,
}

/// This rank's one-hop block for sharded full-graph evaluation
/// ([`Trainer::evaluate_full_sharded`]).
struct ShardBlock {
    /// Every neighbor of the rank's vertex range.
    block: cpu_ops::Block,
    /// GCN only: each source's input scale, √(block degree / graph degree).
    scale: Option<Vec<f32>>,
}

impl Dist {
    fn solo() -> Self {
        Self {
            comm: Arc::new(Solo),
            features: None,
            stats: DistStats::default(),
            bucket: Vec::new(),
            device_reduce: None,
            shard_full_eval: false,
            shard_block: std::sync::OnceLock::new(),
        }
    }

    fn ranks(&self) -> usize {
        self.comm.size()
    }
}

/// What [`Trainer::compute`] needs to take part in a distributed step.
struct DistStep<'a> {
    comm: &'a dyn Communicator,
    /// Seeds of the whole batch, over every rank.
    global: usize,
    /// This rank was asked to cancel.
    cancel: bool,
    /// A callback on this rank asked to stop.
    stop: bool,
    stats: &'a mut DistStats,
    bucket: &'a mut Vec<f32>,
}

/// Scalars at the end of a step's all-reduce bucket: loss × rows, correct
/// predictions, ranks with a non-finite loss or gradient, ranks asked to cancel,
/// ranks whose callbacks asked to stop.
const BUCKET_SCALARS: usize = 5;

/// What the ranks agreed on in a step's all-reduce: some rank was asked to
/// cancel, some rank's callback asked to stop.
#[derive(Clone, Copy, Default)]
struct Agreed {
    cancel: bool,
    stop: bool,
}

/// A distributed step's all-reduce, summed over the ranks.
struct Reduced {
    /// The whole batch's loss × rows.
    loss_sum: f64,
    /// The whole batch's correct predictions.
    correct: usize,
    /// Some rank's loss or gradient was not finite: no rank steps.
    bad: bool,
    agreed: Agreed,
}

fn kernel(context: &'static str) -> impl Fn(CpuOpsError) -> Error {
    move |e| Error::cpu_ops(context, e)
}

/// A trained batch, as the batch loops report it to [`finish_batch`].
struct Trained {
    epoch: usize,
    batch: usize,
    batches: usize,
    size: usize,
    loss_sum: f64,
    correct: usize,
    seconds: f64,
    step: u64,
}

/// What a batch with a non-finite loss does (`train.on_nonfinite`); its update
/// was never applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OnNonFinite {
    /// End training with [`Error::NonFinite`]; the position stays at the batch.
    Stop,
    /// Count it and go on with the next batch.
    Skip,
}

/// Adds a trained batch to the epoch's position and shows its metrics to the
/// callbacks; returns whether one asked to stop. A batch whose loss is not finite
/// is an [`Error::NonFinite`] (`Stop`), or only moves the position on and counts
/// in `skipped` (`Skip`), without callbacks.
fn finish_batch(
    pos: &mut Position,
    callbacks: &mut [Box<dyn Callback>],
    t: Trained,
    on_nonfinite: OnNonFinite,
    skipped: &mut usize,
) -> Result<bool> {
    if !t.loss_sum.is_finite() {
        return match on_nonfinite {
            OnNonFinite::Stop => Err(Error::NonFinite {
                epoch: t.epoch,
                batch: t.batch,
                loss: t.loss_sum / t.size.max(1) as f64,
            }),
            OnNonFinite::Skip => {
                pos.batch = t.batch + 1;
                *skipped += 1;
                Ok(false)
            }
        };
    }
    pos.batch = t.batch + 1;
    pos.loss_sum += t.loss_sum;
    pos.correct += t.correct as u64;
    pos.seen += t.size as u64;
    let metrics = BatchMetrics {
        epoch: t.epoch,
        batch: t.batch,
        batches: t.batches,
        batch_size: t.size,
        loss: t.loss_sum / t.size.max(1) as f64,
        accuracy: t.correct as f64 / t.size.max(1) as f64,
        seconds: t.seconds,
        step: t.step,
    };
    let mut stop = false;
    for cb in callbacks.iter_mut() {
        stop |= cb.on_batch(&metrics) == Control::Stop;
    }
    Ok(stop)
}

/// A panic while the device engine was locked left it unusable.
fn poisoned() -> Error {
    Error::invalid_argument(
        "device engine",
        "an earlier panic left the engine in an unknown state; build a new trainer",
    )
}

impl Trainer {
    /// Builds the model, optimizer and compute pool for `ds` as `cfg` says, with no
    /// callbacks, a fresh cancel token and no printing. [`crate::TrainerBuilder`]
    /// offers the rest.
    pub fn new(ds: Dataset, cfg: TrainConfig) -> Result<Self> {
        cfg.validate()?;
        let pool = build_pool(cfg.compute_threads(), cfg.threads.pin)?;
        Self::with_pool(ds, cfg, Arc::new(pool), 0)
    }

    /// [`Trainer::new`] on an existing compute pool (which also runs the setup);
    /// a GPU engine uses GPU `device.ordinal + gpu_offset` (a rank's local rank).
    pub(crate) fn with_pool(
        ds: Dataset,
        cfg: TrainConfig,
        pool: Arc<ThreadPool>,
        gpu_offset: usize,
    ) -> Result<Self> {
        let p = Arc::clone(&pool);
        p.install(move || Self::assemble(ds, cfg, pool, gpu_offset))
    }

    fn assemble(
        ds: Dataset,
        cfg: TrainConfig,
        pool: Arc<ThreadPool>,
        gpu_offset: usize,
    ) -> Result<Self> {
        cfg.validate()?;
        let ds = Arc::new(ds);
        let mcfg = cfg.model_config(ds.features.dim(), ds.num_classes as usize)?;
        let model = Model::new(&mcfg, derive_seed(cfg.train.seed, 1)).map_err(kernel("model"))?;
        let opt = Adam::new(AdamConfig {
            lr: cfg.train.lr,
            weight_decay: cfg.train.weight_decay,
            decay: WeightDecay::L2,
            ..AdamConfig::default()
        })
        .map_err(kernel("optimizer"))?;
        let sampler =
            NeighborSampler::new(cfg.train_fanouts()?).map_err(kernel("train.fanouts"))?;
        let eval_sampler =
            NeighborSampler::new(cfg.eval_fanouts()?).map_err(kernel("train.eval_fanouts"))?;
        let train_ids = ds.train_ids();
        if train_ids.is_empty() {
            return Err(Error::InvalidDataset {
                what: format!("dataset `{}` has no training vertices", ds.name),
            });
        }
        let sparse = match cfg.train.sparse_features {
            SparseFeatures::On => true,
            SparseFeatures::Auto => feature_density(&ds.features) <= cfg.train.sparse_threshold,
            SparseFeatures::Off => false,
        };
        // Partitioned features: a rank reads only its own rows, so their sparse
        // copy waits for the communicator (the density above samples 4,096 rows).
        let sparse_pending = sparse && cfg.dist.features == DistFeatures::Partitioned;
        let sparse = if sparse && !sparse_pending {
            Some(sparse_rows(&ds.features)?)
        } else {
            None
        };
        let mut device = cfg.device.clone();
        device.ordinal = u32::try_from(device.ordinal as usize + gpu_offset)
            .map_err(|_| Error::invalid_argument("device.ordinal", "too large"))?;
        let chosen = choose_engine(
            &device,
            &ds,
            &model,
            EngineOptions {
                fanouts: cfg.train_fanouts()?,
                eval_fanouts: cfg.eval_fanouts()?,
                cache_bytes: usize::try_from(cfg.device.cache_bytes).unwrap_or(usize::MAX),
                topology: match cfg.device.topology {
                    crate::config::TopologyPlacement::Device => gpu_ops::TopologyPlacement::Device,
                    crate::config::TopologyPlacement::PinnedHost => {
                        gpu_ops::TopologyPlacement::PinnedHost
                    }
                },
                adam: *opt.config(),
                placement: cfg.orchestration.step_placement()?,
                batch_size: cfg.train.batch_size,
                precision: cfg.model.precision.precision(),
                // A rank with partitioned features gets its rows from the
                // exchange (set_communicator): the device never holds them all.
                defer_features: cfg.dist.features == DistFeatures::Partitioned,
                feature_dtype: cfg.device.feature_dtype.dtype(),
                sample_ahead: cfg.device.sample_ahead,
            },
        )?;
        let mut chosen = chosen;
        if chosen.engine.is_none() && cfg.model.precision == PrecisionName::Tf32 {
            // Said, not silent: the setting asks for something this path lacks.
            chosen.note.push_str(
                "; model.precision = \"tf32\" applies to device engines' matrix products: \
                 the native host path computes in fp32",
            );
        }
        if chosen.engine.is_none() && cfg.device.feature_dtype == FeatureDtypeName::Bf16 {
            chosen.note.push_str(
                "; device.feature_dtype = \"bf16\" applies to device engines' feature \
                 rows: the native host path reads fp32 features",
            );
        }
        if cfg.device.sample_ahead {
            if chosen.engine.is_none() {
                chosen.note.push_str(
                    "; device.sample_ahead applies to device engines: the native host path \
                     samples on its own threads while it trains",
                );
            } else if cfg.orchestration.reuses_embeddings() {
                chosen.note.push_str(
                    "; device.sample_ahead applies to step-based placements: the layer-based \
                     pipeline samples each super-batch's top layers ahead itself",
                );
            }
        }
        if chosen.engine.is_none()
            && cfg.orchestration.policy != PolicyName::Layer
            && !cfg.orchestration.is_auto()
        {
            return Err(Error::invalid_argument(
                "orchestration.policy",
                format!(
                    "\"{}\" needs a device engine (device.host_engine = \"ops\" or a GPU); {}",
                    cfg.orchestration.policy, chosen.note
                ),
            ));
        }
        let orch =
            match (&chosen.engine, cfg.orchestration.reuses_embeddings()) {
                (Some(_), true) => Some(Orchestrator::new(
                    &cfg.orchestration,
                    Arc::clone(&ds),
                    &model,
                    &cfg.train_fanouts()?,
                    &train_ids,
                    cfg.train.batch_size,
                    cfg.train.seed,
                    cfg.orchestration.cpu_workers,
                )?),
                (None, true) => return Err(Error::invalid_argument(
                    "orchestration.hot_ratio",
                    "orchestration needs a device engine (device.host_engine = \"ops\" or a GPU)",
                )),
                _ => None,
            };
        let mut orch = orch;
        if let (Some(o), crate::config::PinPolicy::Cores) = (orch.as_mut(), cfg.threads.pin) {
            // Hot workers go on the cores after the compute pool's.
            o.pin_workers_from(Some(pool.current_num_threads()));
        }
        let calibrator = match (&chosen.engine, cfg.orchestration.is_auto()) {
            (Some(_), true) => Some(Calibrator::new(
                cfg.model.layers >= 2,
                cfg.orchestration.super_batch,
            )),
            _ => None,
        };
        Ok(Self {
            acc_track: Tracer::disabled().declare_track("acc", TrackKind::Accelerator),
            tracer: Tracer::disabled(),
            orch,
            calibrator,
            auto_choice: None,
            clock: wall_clock(),
            checkpoint_path: None,
            on_nonfinite: if cfg.train.on_nonfinite == OnNonFiniteKind::SkipBatch {
                OnNonFinite::Skip
            } else {
                OnNonFinite::Stop
            },
            skipped: 0,
            dist: Dist::solo(),
            engine: chosen.engine.map(Mutex::new),
            device_note: chosen.note,
            scratch: SamplerScratch::new(ds.num_vertices()),
            sparse,
            sparse_pending,
            val_ids: ds.val_ids(),
            test_ids: ds.test_ids(),
            train_ids,
            ds,
            cfg,
            model,
            opt,
            sampler,
            eval_sampler,
            pos: Position::default(),
            pool,
            callbacks: Vec::new(),
            cancel: CancelToken::new(),
            verbose: false,
            stop_requested: false,
            embeddings: None,
            logits: None,
        })
    }

    /// Makes this trainer rank `comm.rank()` of a data-parallel job of
    /// `comm.size()` ranks (see [`crate::dist`]); collective: every rank calls it,
    /// with the same configuration and dataset (checked: a rank whose
    /// configuration or dataset shape differs is an error on every rank). With
    /// `dist.features = "partitioned"` each rank from then on reads only its own
    /// feature rows and fills its remote-row cache here.
    ///
    /// A device engine (a GPU, or `device.host_engine = "ops"`) trains each
    /// rank's share on its device and sums the gradients over the communicator on
    /// the host; `policy = "auto"` then keeps its starting placement
    /// (`gpu-sample-gpu-gather`) instead of measuring, so that every rank runs
    /// the same one. With partitioned features a device engine gathers every
    /// batch's input rows on the host through the exchange and uploads them
    /// (sampling stays where the placement puts it); it never loads the whole
    /// feature matrix onto the device.
    ///
    /// With `dist.reduce = "nccl"` (or `"auto"` finding NCCL and a GPU on
    /// every rank) a device engine sums its gradients on the device instead
    /// (`docs/distributed.md`, "NCCL").
    ///
    /// Errors (on every rank alike): more than one rank with layer-based
    /// orchestration (not built yet), or a trainer that already trained with
    /// another communicator. `dist.reduce = "nccl"` on a rank without NCCL or a
    /// GPU is an error on that rank.
    pub fn set_communicator(&mut self, comm: Arc<dyn Communicator>) -> Result<()> {
        if self.cfg.dist.reduce == DistReduce::Nccl {
            // Decided on each rank alone, before any collective: every rank
            // has the same configuration, and a rank that lacks NCCL fails the
            // job (its error printed, the others stopped) instead of hanging it.
            if let Some(why) = self.nccl_lacks() {
                return Err(Error::invalid_argument(
                    "dist.reduce",
                    format!(
                        "\"nccl\": {why}; dist.reduce = \"mpi\" or \"auto\" sums the \
                         gradients over MPI"
                    ),
                ));
            }
        }
        let distributed = comm.size() > 1;
        if distributed && self.cfg.orchestration.reuses_embeddings() {
            return Err(Error::invalid_argument(
                "orchestration.policy",
                format!(
                    "distributed training ({} ranks) runs step-based placements: \
                     layer-based orchestration (policy = \"layer\" with hot_ratio > 0) \
                     across ranks is not built yet",
                    comm.size()
                ),
            ));
        }
        if self.dist.ranks() > 1 || self.opt.version() > 0 && comm.size() > 1 {
            return Err(Error::invalid_argument(
                "communicator",
                "set it once, before training: the ranks must start from the same weights",
            ));
        }
        // Every rank must train the same configuration on the same graph.
        let ds = &self.ds;
        let fingerprint = format!(
            "{}|{}|{}|{}|{}",
            self.cfg.to_toml(),
            ds.num_vertices(),
            ds.graph.num_edges(),
            ds.features.dim(),
            ds.num_classes
        );
        if !crate::dist::ranks_agree(&*comm, xxhash_rust::xxh3::xxh3_64(fingerprint.as_bytes()))? {
            return Err(Error::Dist {
                what: format!(
                    "rank {}: the ranks disagree on the configuration or the dataset's shape \
                     (every rank must load the same config file and dataset)",
                    comm.rank()
                ),
            });
        }
        let features = if comm.size() > 1 && self.cfg.dist.features == DistFeatures::Partitioned {
            let channel = comm.duplicate()?;
            let pool = Arc::clone(&self.pool);
            let cache = self.cfg.dist.remote_cache_rows;
            let parts = match &self.cfg.dist.partition_file {
                Some(path) => Some(crate::dist::read_partition_file(
                    path,
                    ds.num_vertices(),
                    comm.size(),
                )?),
                None => None,
            };
            if self.sparse_pending && self.engine.is_none() {
                // The sparse copy of this rank's own rows only (a partition
                // file that does not fit is refused just below).
                let (rank, ranks, n) = (comm.rank(), comm.size(), ds.num_vertices());
                let own = share(n, rank, ranks);
                let keep = |v| crate::dist::features::owned_by(parts.as_deref(), &own, rank, v);
                self.sparse = Some(sparse_rows_where(&ds.features, keep)?);
                self.sparse_pending = false;
            }
            // A device engine uploads dense rows; bfloat16 ones when it stores
            // bfloat16 rows, so they may travel as bfloat16 too.
            let sparse = self.sparse.as_ref().filter(|_| self.engine.is_none());
            let bf16 =
                self.engine.is_some() && self.cfg.device.feature_dtype == FeatureDtypeName::Bf16;
            let pf =
                pool.install(|| PartitionedFeatures::new(ds, channel, cache, parts, sparse, bf16))?;
            Some(Arc::new(pf))
        } else {
            None
        };
        if let (Some(engine), Some(pf)) = (&self.engine, &features) {
            let source = crate::dist::ExchangeRows::new(Arc::clone(ds), Arc::clone(pf));
            engine
                .lock()
                .map_err(|_| poisoned())?
                .set_row_source(Some(Arc::new(source)));
            self.device_note.push_str(
                "; dist.features = \"partitioned\": input rows are gathered on the host \
                 through the feature exchange and uploaded",
            );
        }
        if distributed && self.calibrator.take().is_some() {
            // Ranks measuring placements each on their own could choose
            // differently; every rank keeps the configured starting placement.
            self.device_note.push_str(&format!(
                "; policy = \"auto\" keeps {} on every rank of a distributed job",
                scheduler::Orchestration::GpuSampleGpuGather
            ));
        }
        let device_reduce = if distributed {
            self.join_device_reduce(&comm)?
        } else {
            None
        };
        let shard_full_eval = distributed
            && match self.cfg.dist.full_eval {
                DistFullEval::Sharded => true,
                DistFullEval::Replicated => false,
                DistFullEval::Auto => {
                    // One rank per machine has local rank 0.
                    let mut machines = [f64::from(u8::from(comm.local_rank() == 0))];
                    comm.all_reduce_sum_f64(&mut machines)?;
                    machines[0] > 1.0
                }
            };
        self.dist = Dist {
            comm,
            features,
            stats: DistStats::default(),
            bucket: Vec::new(),
            device_reduce,
            shard_full_eval,
            shard_block: std::sync::OnceLock::new(),
        };
        Ok(())
    }

    /// Why this rank cannot sum gradients over NCCL (`None`: it can).
    fn nccl_lacks(&self) -> Option<String> {
        if let Err(e) = gpu_ops::nccl_available() {
            return Some(match e {
                gpu_ops::GpuOpsError::Unavailable { reason, .. } => reason,
                e => e.to_string(),
            });
        }
        let kind = self
            .engine
            .as_ref()
            .and_then(|e| e.lock().ok().map(|e| e.device_kind()));
        (kind != Some(gpu_ops::DeviceKind::Cuda)).then(|| {
            "NCCL sums gradients between GPUs and this rank trains on the host \
             (device.kind = \"cuda\" on every rank)"
                .to_string()
        })
    }

    /// Sets a device engine's gradient sum up over NCCL when `dist.reduce`
    /// asks for it (`"nccl"`, or `"auto"` with NCCL and a GPU on every rank;
    /// collective): the flag first, so that every rank takes the same way,
    /// then rank 0's unique id. Returns the transport's line, `None` for MPI.
    fn join_device_reduce(&mut self, comm: &Arc<dyn Communicator>) -> Result<Option<String>> {
        let use_nccl = match self.cfg.dist.reduce {
            DistReduce::Mpi => false,
            // Checked on each rank before: every rank can.
            DistReduce::Nccl => true,
            DistReduce::Auto => {
                let here = self.nccl_lacks().is_none();
                let mut able = [if here { 1.0 } else { 0.0 }];
                comm.all_reduce_sum_f64(&mut able)?;
                able[0] as usize == comm.size()
            }
        };
        let Some(engine) = self.engine.as_ref().filter(|_| use_nccl) else {
            return Ok(None);
        };
        // Byte 128 says whether rank 0 drew an id (else every rank fails alike).
        let mut buf = [0u8; 129];
        let mut drawn = None;
        if comm.rank() == 0 {
            match gpu_ops::nccl_unique_id() {
                Ok(id) => {
                    buf[..128].copy_from_slice(&id.0);
                    buf[128] = 1;
                }
                Err(e) => drawn = Some(e),
            }
        }
        comm.broadcast_bytes(0, &mut buf)?;
        if buf[128] != 1 {
            let why = drawn.map_or_else(|| "see rank 0's error".into(), |e| e.to_string());
            return Err(Error::Dist {
                what: format!("rank 0 could not draw an NCCL id: {why}"),
            });
        }
        let mut id = [0u8; 128];
        id.copy_from_slice(&buf[..128]);
        let on = ReduceOn::Nccl {
            rank: comm.rank(),
            ranks: comm.size(),
            id: gpu_ops::NcclId(id),
        };
        let line = engine.lock().map_err(|_| poisoned())?.set_grad_reduce(on)?;
        self.device_note
            .push_str(&format!("; gradients summed on the device over {line}"));
        Ok(Some(line))
    }

    /// Test seam: sums this device rank's gradients on the device through host
    /// copies over a duplicate of its communicator (`engine::CopyReduce`),
    /// the step `dist.reduce = "nccl"` takes, so that it can be checked on the
    /// host backend (collective; after [`Trainer::set_communicator`]).
    #[doc(hidden)]
    pub fn reduce_on_device_through_host_copies(&mut self) -> Result<()> {
        let Some(engine) = self.engine.as_ref() else {
            return Err(Error::invalid_argument(
                "device",
                "only a device engine keeps its gradients on the device",
            ));
        };
        let channel = self.dist.comm.duplicate()?;
        let line = engine
            .lock()
            .map_err(|_| poisoned())?
            .set_grad_reduce(ReduceOn::HostCopy(channel))?;
        self.dist.device_reduce = Some(line);
        Ok(())
    }

    /// This trainer's rank and the job's number of ranks (`(0, 1)` alone).
    pub fn rank(&self) -> (usize, usize) {
        (self.dist.comm.rank(), self.dist.comm.size())
    }

    /// What this rank's collectives moved and cost so far (all zero alone).
    pub fn dist_stats(&self) -> DistStats {
        let mut s = self.dist.stats;
        if let Some(f) = &self.dist.features {
            let x = f.stats();
            s.exchanges = x.exchanges;
            s.exchange_bytes = x.exchange_bytes;
            s.exchange_secs = x.exchange_secs;
            s.remote_rows = x.remote_rows;
            s.remote_cache_hits = x.remote_cache_hits;
        }
        s
    }

    /// Adds a callback (after those already added).
    pub fn add_callback(&mut self, callback: Box<dyn Callback>) {
        self.callbacks.push(callback);
    }

    /// Replaces the cancel token (e.g. with a fresh one after a cancel).
    pub fn set_cancel_token(&mut self, token: CancelToken) {
        self.cancel = token;
    }

    /// A clone of the cancel token: cancelling it stops training at the next batch.
    pub fn cancel_token(&self) -> CancelToken {
        self.cancel.clone()
    }

    /// Whether the trainer prints one line per epoch on stderr.
    pub fn set_verbose(&mut self, verbose: bool) {
        self.verbose = verbose;
    }

    /// Completed epochs (= the 0-based epoch in progress).
    pub fn epoch(&self) -> usize {
        self.pos.epoch
    }

    /// Batches of the epoch in progress already trained (0 at an epoch boundary;
    /// more after a cancel or a stop inside an epoch).
    pub fn batch_in_epoch(&self) -> usize {
        self.pos.batch
    }

    /// Whether a callback asked to stop at the end of the last epoch.
    pub fn stop_requested(&self) -> bool {
        self.stop_requested
    }

    /// Worker threads of the trainer's compute pool.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// The dataset.
    pub fn dataset(&self) -> &Dataset {
        &self.ds
    }

    /// The model.
    pub fn model(&self) -> &Model<f32> {
        &self.model
    }

    /// The configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// The sparse copy of the features, when the trainer uses one (with
    /// partitioned features: this rank's rows, built by
    /// [`Trainer::set_communicator`]; in a one-rank run, built on first use).
    pub fn sparse_features(&self) -> Option<&SparseRows<f32>> {
        self.sparse.as_ref()
    }

    /// Builds the sparse copy of every row if it is still waiting for a
    /// communicator (a one-rank run of a partitioned configuration).
    fn resolve_sparse(&mut self) -> Result<()> {
        if self.sparse_pending && self.engine.is_none() {
            let f = &self.ds.features;
            let sparse = self.pool.install(|| sparse_rows(f))?;
            self.sparse = Some(sparse);
            self.sparse_pending = false;
        }
        Ok(())
    }

    /// Optimizer steps taken so far (the weight version).
    pub fn steps(&self) -> u64 {
        self.opt.version()
    }

    /// One line: the device training runs on and why it was chosen
    /// (`device.kind = "auto"` names the missing library when it fell back to the
    /// host).
    pub fn device_note(&self) -> &str {
        &self.device_note
    }

    /// Feature-cache statistics of the device engine (`None` on the native host
    /// path).
    pub fn cache_stats(&self) -> Option<gpu_ops::CacheStats> {
        let e = self.engine.as_ref()?;
        let e = e.lock().ok()?;
        Some(e.cache_stats())
    }

    /// Bytes training batches moved host → device so far (blocks, ids, feature
    /// rows, labels, hot rows; `None` on the native host path, which moves none).
    pub fn h2d_bytes(&self) -> Option<u64> {
        let e = self.engine.as_ref()?;
        e.lock().ok().map(|e| e.h2d_bytes())
    }

    /// The device backend's copies and synchronizations so far (`None` on the
    /// native host path).
    pub fn transfer_stats(&self) -> Option<gpu_ops::TransferStats> {
        let e = self.engine.as_ref()?;
        e.lock().ok().map(|e| e.transfer_stats())
    }

    /// How many batches trained on blocks sampled while the batch before them
    /// trained (`device.sample_ahead`; `None` on the native host path).
    pub fn batches_sampled_ahead(&self) -> Option<u64> {
        let e = self.engine.as_ref()?;
        e.lock().ok().map(|e| e.batches_sampled_ahead())
    }

    /// What layer-based orchestration did in the last epoch (`None` without
    /// embedding reuse).
    pub fn orchestration_stats(&self) -> Option<&OrchestrationStats> {
        self.orch.as_ref()?.last_epoch()
    }

    /// What layer-based orchestration did over every epoch so far.
    pub fn orchestration_totals(&self) -> Option<&OrchestrationStats> {
        self.orch.as_ref().map(Orchestrator::totals)
    }

    /// The orchestrator, when training reuses hot embeddings (its relabeling maps
    /// hot ranks back to vertex ids).
    pub fn orchestrator(&self) -> Option<&Orchestrator> {
        self.orch.as_ref()
    }

    /// Test hook: makes the orchestration's CPU workers fail as `fault` says from
    /// the next epoch on (`None` clears it). No effect without embedding reuse.
    #[doc(hidden)]
    pub fn inject_orchestration_fault(&mut self, fault: Option<InjectedFault>) {
        if let Some(o) = self.orch.as_mut() {
            o.inject_fault(fault);
        }
    }

    /// Records training into `tracer` from now on: slices `sample`, `gather` (with
    /// `bytes`), `forward`, `loss`, `backward`, `step` (each with `epoch` and
    /// `batch`; `device step` per batch on a device engine) and `eval` (with
    /// `epoch`), and a flow from each batch's gather to its forward. A disabled
    /// tracer (the default) records nothing.
    pub fn set_tracer(&mut self, tracer: Tracer) {
        if let Some(engine) = self.engine.as_mut() {
            self.acc_track = tracer.declare_track("acc stream compute", TrackKind::Accelerator);
            // A poisoned engine fails the next batch anyway.
            if let Ok(e) = engine.get_mut() {
                e.set_tracer(tracer.clone(), self.acc_track);
            }
        }
        if let Some(o) = self.orch.as_mut() {
            o.set_tracer(&tracer);
        }
        self.tracer = tracer;
    }

    /// The tracer training records into.
    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    /// Copies the device engine's weights and Adam state into the host model and
    /// optimizer (checkpoints, embeddings and `model()` read those).
    fn sync_from_engine(&mut self) -> Result<()> {
        let Some(engine) = &self.engine else {
            return Ok(());
        };
        let e = engine.lock().map_err(|_| poisoned())?;
        let params = e.params_to_host()?;
        let [m, v] = e.moments_to_host()?;
        let steps = e.version();
        drop(e);
        let (m, v) = if steps == 0 {
            (Vec::new(), Vec::new())
        } else {
            (m, v)
        };
        self.opt
            .restore_state(steps, m, v)
            .map_err(kernel("optimizer state from the device"))?;
        for (dst, src) in self.model.params_mut().into_iter().zip(&params) {
            dst.copy_from_slice(src);
        }
        Ok(())
    }

    // The tracing probe made this one argument longer than clippy's limit.
    #[allow(clippy::too_many_arguments)]
    fn prepare<'t>(
        ds: &Dataset,
        sparse: Option<&SparseRows<f32>>,
        sampler: &NeighborSampler,
        scratch: &mut SamplerScratch,
        seeds: Vec<u32>,
        seed: u64,
        mut buf: Vec<f32>,
        probe: Probe<'t>,
        partitioned: Option<&PartitionedFeatures>,
    ) -> Result<Prepared<'t>> {
        let sampling = probe.slice("sample");
        // A rank's share of a batch can be empty (a last batch smaller than the
        // number of ranks); it still takes part in the feature exchange.
        let batch = if seeds.is_empty() {
            SampledBatch::default()
        } else {
            sampler
                .sample(&ds.graph, &seeds, seed, scratch)
                .map_err(kernel("sampling"))?
        };
        drop(sampling);
        let mut gathering = probe.slice("gather");
        gathering.flow_out(probe.flow);
        let x = match (sparse, partitioned) {
            (Some(s), Some(pf)) => {
                let mut exchange = probe.slice("exchange");
                let (rows, bytes) = pf.gather_sparse(s, batch.input_ids())?;
                exchange.set_bytes(bytes);
                drop(exchange);
                Inputs::Sparse(rows)
            }
            (None, Some(pf)) => {
                let mut exchange = probe.slice("exchange");
                exchange.set_bytes(pf.gather(ds, batch.input_ids(), &mut buf)?);
                drop(exchange);
                Inputs::Dense(buf)
            }
            (Some(s), None) => {
                Inputs::Sparse(s.gather(batch.input_ids()).map_err(kernel("gather"))?)
            }
            (None, None) => {
                // Reuse the buffer of a finished batch: a fresh allocation of tens of
                // megabytes per batch costs page faults and TLB shootdowns. The gather
                // overwrites every value, so only a grown tail is zero-filled.
                let ids = batch.input_ids();
                buf.resize(ids.len() * ds.features.dim(), 0.0);
                gather_rows(&ds.features, ids, &mut buf).map_err(kernel("gather"))?;
                Inputs::Dense(buf)
            }
        };
        gathering.set_bytes(match &x {
            Inputs::Dense(v) => std::mem::size_of_val(v.as_slice()) as u64,
            Inputs::Sparse(r) => (r.nnz() * 8 + (r.num_rows() + 1) * 8) as u64,
        });
        drop(gathering);
        Ok(Prepared {
            seeds,
            batch,
            x,
            seed,
            probe,
        })
    }

    fn views(batch: &SampledBatch) -> Result<Vec<BlockView<'_>>> {
        batch
            .blocks()
            .iter()
            .map(|b| BlockView::new(b.num_src(), b.indptr(), b.indices()))
            .collect::<std::result::Result<_, _>>()
            .map_err(kernel("block"))
    }

    fn labels_of(ds: &Dataset, seeds: &[u32]) -> Vec<u32> {
        seeds.iter().map(|&s| ds.labels[s as usize]).collect()
    }

    /// One training step on a prepared batch; returns (loss sum, correct, what
    /// the ranks agreed on). Alone (`dist = None`) the step applies this
    /// batch's gradients. In a distributed job, `p` holds this rank's share of a
    /// batch of `global` seeds: its gradients, weighted by its share, are summed
    /// over the ranks with the loss, the correct count and the non-finite and
    /// cancel flags in one all-reduce, and every rank applies the same step (none
    /// when any rank's loss or gradient is not finite); the returned loss and
    /// count are the whole batch's.
    fn compute(
        ds: &Dataset,
        model: &mut Model<f32>,
        opt: &mut Adam<f32>,
        p: &Prepared<'_>,
        dist: Option<DistStep<'_>>,
    ) -> Result<(f64, usize, Agreed)> {
        let (n, c) = (p.seeds.len(), ds.num_classes as usize);
        let (mut loss_sum, mut correct, mut grads) = (0.0f64, 0usize, None);
        if n > 0 {
            let mut forward = p.probe.slice("forward");
            forward.flow_in(p.probe.flow);
            let views = Self::views(&p.batch)?;
            let fwd = model
                .forward_input(&views, p.x.as_model_input(), true, p.seed)
                .map_err(kernel("forward"))?;
            drop(forward);
            let loss = p.probe.slice("loss");
            let labels = Self::labels_of(ds, &p.seeds);
            let mut grad = vec![0f32; n * c];
            let ce = softmax_cross_entropy(
                MatRef::new(fwd.logits(), n, c).map_err(kernel("logits"))?,
                &labels,
                Some(MatMut::new(&mut grad, n, c).map_err(kernel("logits"))?),
            )
            .map_err(kernel("loss"))?;
            drop(loss);
            loss_sum = ce.loss * n as f64;
            correct = ce.correct;
            if ce.loss.is_finite() {
                let backward = p.probe.slice("backward");
                let g = model
                    .backward_input(&views, p.x.as_model_input(), &fwd, &grad)
                    .map_err(kernel("backward"))?;
                drop(backward);
                if g.iter().flatten().any(|x| !x.is_finite()) {
                    // A non-finite gradient with a finite loss: not applied either,
                    // and reported as a non-finite loss.
                    loss_sum = f64::NAN;
                } else {
                    grads = Some(g);
                }
            }
        }
        let Some(d) = dist else {
            let Some(grads) = grads.filter(|_| loss_sum.is_finite()) else {
                // No step: the caller sees the loss (train.on_nonfinite).
                return Ok((loss_sum, correct, Agreed::default()));
            };
            let _step = p.probe.slice("step");
            let grad_refs: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
            opt.step(&mut model.params_mut(), &grad_refs)
                .map_err(kernel("optimizer step"))?;
            return Ok((loss_sum, correct, Agreed::default()));
        };
        let sizes: Vec<usize> = model.params().iter().map(|t| t.len()).collect();
        let mut d = d;
        let parts: Option<Vec<&[f32]>> = grads
            .as_ref()
            .map(|g| g.iter().map(Vec::as_slice).collect());
        let r = Self::all_reduce_step(
            &mut d,
            sizes.iter().sum(),
            n,
            loss_sum,
            correct,
            parts,
            &p.probe,
        )?;
        if r.bad {
            return Ok((f64::NAN, r.correct, r.agreed));
        }
        let bucket = &*d.bucket;
        let total: usize = sizes.iter().sum();
        let _step = p.probe.slice("step");
        let mut grad_refs: Vec<&[f32]> = Vec::with_capacity(sizes.len());
        let mut rest = &bucket[..total];
        for len in sizes {
            let (head, tail) = rest.split_at(len);
            grad_refs.push(head);
            rest = tail;
        }
        opt.step(&mut model.params_mut(), &grad_refs)
            .map_err(kernel("optimizer step"))?;
        Ok((r.loss_sum, r.correct, r.agreed))
    }

    /// This rank's part of a distributed step's one all-reduce: the bucket holds
    /// its gradients (`grads`, the parameters' in order, `total` values) ×
    /// (its `rows` / the batch's rows), then the loss, correct count,
    /// non-finite, cancel and stop scalars; a rank with no rows or a non-finite
    /// loss (`grads` = `None`, or a non-finite `loss_sum`) sends zero gradients.
    /// Afterwards `d.bucket[..total]` holds the summed gradients.
    fn all_reduce_step(
        d: &mut DistStep<'_>,
        total: usize,
        rows: usize,
        loss_sum: f64,
        correct: usize,
        grads: Option<Vec<&[f32]>>,
        probe: &Probe<'_>,
    ) -> Result<Reduced> {
        let bucket = &mut *d.bucket;
        bucket.clear();
        bucket.resize(total + BUCKET_SCALARS, 0.0);
        let finite = loss_sum.is_finite() && (rows == 0 || grads.is_some());
        if let (Some(g), true) = (&grads, finite) {
            let w = rows as f32 / d.global.max(1) as f32;
            for (dst, src) in bucket.iter_mut().zip(g.iter().copied().flatten()) {
                *dst = src * w;
            }
        }
        bucket[total] = if finite { loss_sum as f32 } else { 0.0 };
        bucket[total + 1] = correct as f32;
        bucket[total + 2] = if finite { 0.0 } else { 1.0 };
        bucket[total + 3] = if d.cancel { 1.0 } else { 0.0 };
        bucket[total + 4] = if d.stop { 1.0 } else { 0.0 };
        {
            let mut reduce = probe.slice("allreduce");
            let bytes = std::mem::size_of_val(bucket.as_slice()) as u64;
            reduce.set_bytes(bytes);
            let t = Instant::now();
            d.comm.all_reduce_sum(bucket)?;
            d.stats.allreduces += 1;
            d.stats.allreduce_bytes += bytes;
            d.stats.allreduce_secs += t.elapsed().as_secs_f64();
        }
        Ok(Reduced {
            loss_sum: bucket[total] as f64,
            correct: bucket[total + 1].round() as usize,
            bad: bucket[total + 2] > 0.0,
            agreed: Agreed {
                cancel: bucket[total + 3] > 0.0,
                stop: bucket[total + 4] > 0.0,
            },
        })
    }

    /// Trains the next epoch (or the rest of an interrupted one), evaluates when
    /// `train.eval_every` says so (and at epoch `train.epochs - 1`), calls the
    /// callbacks, and returns the epoch's statistics. A cancelled token or a
    /// callback's stop inside the epoch returns [`Error::Cancelled`]; the trainer
    /// then remembers the position, and the next call continues from there.
    pub fn train_epoch(&mut self) -> Result<EpochStats> {
        self.resolve_sparse()?;
        let pool = Arc::clone(&self.pool);
        pool.install(|| self.train_epoch_here())
    }

    fn train_epoch_here(&mut self) -> Result<EpochStats> {
        self.stop_requested = false;
        self.embeddings = None;
        self.logits = None;
        let calibrating = self.calibrator.is_some();
        let stop_at_end = self.train_batches()?;
        self.check_ranks_agree()?;
        let pos = std::mem::take(&mut self.pos);
        let e = pos.epoch;
        self.pos.epoch = e + 1;
        let (epochs, every) = (self.cfg.train.epochs, self.cfg.train.eval_every);
        let eval_now = e + 1 == epochs || (every > 0 && (e + 1).is_multiple_of(every));
        let t = Instant::now();
        let (val_acc, test_acc) = if eval_now {
            let (v, t) = self.evaluate_val_test_here()?;
            (Some(v), Some(t))
        } else {
            (None, None)
        };
        let seen = pos.seen.max(1) as f64;
        let stats = EpochStats {
            epoch: e,
            loss: pos.loss_sum / seen,
            train_acc: pos.correct as f64 / seen,
            val_acc,
            test_acc,
            train_secs: pos.train_secs,
            eval_secs: t.elapsed().as_secs_f64(),
            batches: pos.batch,
            steps: self.steps(),
            orchestration: self.orch.as_ref().and_then(|o| o.last_epoch().cloned()),
            calibrating,
            skipped_batches: std::mem::take(&mut self.skipped),
            auto_choice: match (calibrating, &self.auto_choice) {
                (true, Some(c)) => Some(c.reason.clone()),
                _ => None,
            },
        };
        if self.verbose {
            let acc = |a: Option<f64>| a.map_or_else(|| "-".into(), |x| format!("{x:.4}"));
            eprintln!(
                "epoch {e}: loss {:.4}, train acc {:.4}, val acc {}, test acc {}, {:.2} s train, {:.2} s eval",
                stats.loss,
                stats.train_acc,
                acc(stats.val_acc),
                acc(stats.test_acc),
                stats.train_secs,
                stats.eval_secs
            );
            if let Some(o) = &stats.orchestration {
                eprintln!("  {}", o.summary());
            }
        }
        let mut stop = stop_at_end;
        for cb in &mut self.callbacks {
            stop |= cb.on_epoch(&stats) == Control::Stop;
        }
        if self.dist.ranks() > 1 {
            // Every rank ends together: a stop asked on any rank ends them all.
            let mut any = [if stop { 1.0 } else { 0.0 }];
            self.dist.comm.all_reduce_sum_f64(&mut any)?;
            stop = any[0] > 0.0;
        }
        self.stop_requested = stop;
        Ok(stats)
    }

    /// Trains the remaining batches of the epoch in progress. Returns whether a
    /// callback asked to stop after the last batch; a cancel or a stop before it
    /// is [`Error::Cancelled`].
    fn train_batches(&mut self) -> Result<bool> {
        if self.engine.is_none() {
            return self.train_batches_direct(None);
        }
        let result = if self.calibrator.is_some() {
            self.train_batches_auto()
        } else {
            self.train_batches_placed(None)
        };
        let synced = self.sync_from_engine();
        result.and_then(|stop| synced.map(|()| stop))
    }

    /// The remaining batches of the epoch, up to batch `end` (the epoch's end
    /// when `None`), on the device engine as placed now: through the
    /// orchestration pipeline when an orchestrator is active, else batch by batch.
    fn train_batches_placed(&mut self, end: Option<usize>) -> Result<bool> {
        if self.orch.is_some() {
            self.train_batches_orchestrated(end, None)
        } else {
            self.train_batches_direct(end)
        }
    }

    /// Number of batches in every epoch.
    fn batches_per_epoch(&self) -> usize {
        self.train_ids
            .len()
            .div_ceil(self.cfg.train.batch_size.max(1))
    }

    /// The orchestrator `policy = "auto"` measures the layer-based placement
    /// with: the configured `hot_ratio`, or [`AUTO_HOT_RATIO`] when it is 0.
    fn auto_orchestrator(&mut self) -> Result<&mut Orchestrator> {
        if self.orch.is_none() {
            let mut o = self.cfg.orchestration.clone();
            if o.hot_ratio <= 0.0 {
                o.hot_ratio = AUTO_HOT_RATIO;
            }
            let pool = Arc::clone(&self.pool);
            let (ds, cfg, model, ids) = (&self.ds, &self.cfg, &self.model, &self.train_ids);
            let mut orch = pool.install(|| {
                Orchestrator::new(
                    &o,
                    Arc::clone(ds),
                    model,
                    &cfg.train_fanouts()?,
                    ids,
                    cfg.train.batch_size,
                    cfg.train.seed,
                    o.cpu_workers,
                )
            })?;
            orch.set_clock(Arc::clone(&self.clock));
            orch.set_tracer(&self.tracer);
            if self.cfg.threads.pin == crate::config::PinPolicy::Cores {
                orch.pin_workers_from(Some(self.pool.current_num_threads()));
            }
            self.orch = Some(orch);
        }
        self.orch
            .as_mut()
            .ok_or_else(|| Error::invalid_argument("orchestration", "internal: no orchestrator"))
    }

    /// `policy = "auto"` (`crate::auto`): runs the calibrator's measurements on
    /// the epoch's next batches, decides when they are done, and trains the
    /// rest of the epoch as decided. Measurements that do not fit in what is left
    /// of the epoch move to the next one (the batches in between train on the
    /// placement measured last); a layer-based one longer than a whole epoch is
    /// skipped.
    fn train_batches_auto(&mut self) -> Result<bool> {
        let epoch_len = self.batches_per_epoch();
        if let Some(c) = self.calibrator.as_mut() {
            c.fit_to_epoch(epoch_len);
        }
        while let Some(step) = self.calibrator.as_ref().and_then(Calibrator::next) {
            let start = self.pos.batch;
            let need = step.batches();
            if start + need > epoch_len {
                if need > epoch_len {
                    if let Some(c) = self.calibrator.as_mut() {
                        c.skip(&format!(
                            "an epoch has {epoch_len} batches, the measurement needs {need}"
                        ));
                    }
                    continue;
                }
                // Not enough left in this epoch: finish it on the best placement
                // measured so far (the all-accelerator one before any).
                let best = self
                    .calibrator
                    .as_ref()
                    .and_then(Calibrator::best_so_far)
                    .map(|m| m.policy)
                    .filter(|&p| p != scheduler::Orchestration::Layer)
                    .unwrap_or(scheduler::Orchestration::GpuSampleGpuGather);
                if let Some(e) = self.engine.as_mut().and_then(|e| e.get_mut().ok()) {
                    e.set_placement(step_placement(best));
                }
                return self.train_batches_direct(None);
            }
            match step {
                ProbeStep::Fixed {
                    policy,
                    warm,
                    measure,
                } => {
                    if let Some(e) = self.engine.as_mut().and_then(|e| e.get_mut().ok()) {
                        e.set_placement(step_placement(policy));
                    }
                    if self.train_batches_direct(Some(start + warm))? {
                        return Ok(true);
                    }
                    let t0 = self.clock.now();
                    let stop = self.train_batches_direct(Some(start + warm + measure))?;
                    let secs = (self.clock.now().saturating_sub(t0)).as_secs_f64();
                    if let Some(c) = self.calibrator.as_mut() {
                        c.record_fixed(secs / measure as f64)?;
                    }
                    if stop {
                        return Ok(true);
                    }
                }
                ProbeStep::Layer {
                    split,
                    warm,
                    measure,
                } => {
                    let orch = self.auto_orchestrator()?;
                    let hot = orch.hot_count();
                    let split = split.min(hot);
                    if let Some(c) = self.calibrator.as_mut() {
                        c.set_hot(hot);
                        if hot == 0 {
                            continue;
                        }
                    }
                    let splits = self
                        .calibrator
                        .as_ref()
                        .map(Calibrator::candidate_splits)
                        .unwrap_or_default();
                    let orch = self.auto_orchestrator()?;
                    orch.set_cpu_split(split)?;
                    orch.count_splits(splits);
                    let before = orch.totals().clone();
                    let workers = orch.workers() as u32;
                    let stop = self.train_batches_orchestrated(
                        Some(start + warm + measure),
                        Some(start + warm),
                    )?;
                    let orch = self.auto_orchestrator()?;
                    let t1 = orch.clock().now().as_secs_f64();
                    let counts = orch.take_split_counts();
                    let (t0, at_mark) = orch.last_mark().cloned().ok_or_else(|| {
                        Error::invalid_argument("orchestration", "internal: no timing mark")
                    })?;
                    let after = orch.totals().clone();
                    // `at_mark` counts from the start of this run; `before`/`after`
                    // are totals over every run.
                    let run =
                        |f: fn(&OrchestrationStats) -> u64| f(&after).saturating_sub(f(&before));
                    let wait = (after.wait_secs - before.wait_secs - at_mark.wait_secs).max(0.0);
                    let late = run(|s| s.computed_cold + s.waited)
                        .saturating_sub(at_mark.computed_cold + at_mark.waited);
                    let used = run(|s| s.hot_uses).saturating_sub(at_mark.hot_uses);
                    let per_batch = (t1 - t0).max(0.0) / measure as f64;
                    let probe = scheduler::LayerProbe {
                        cpu_split: split,
                        per_batch_s: per_batch,
                        acc_per_batch_s: (per_batch - wait / measure as f64).max(0.0),
                        cpu_busy_s: (after.cpu_busy_secs - before.cpu_busy_secs).max(0.0),
                        rows_computed: run(|s| s.rows_computed),
                        entries_read: used + late,
                        entries_late: late,
                        workers,
                    };
                    if let Some(c) = self.calibrator.as_mut() {
                        c.record_layer(probe, &counts)?;
                    }
                    if stop {
                        return Ok(true);
                    }
                }
            }
        }
        self.decide_auto()?;
        self.train_batches_placed(None)
    }

    /// Applies the calibrator's choice: a step-based placement on the engine
    /// (the orchestrator and its workers go), or the layer-based pipeline at the
    /// chosen CPU split. Printed when verbose; an instant `auto choice` on the
    /// trace.
    fn decide_auto(&mut self) -> Result<()> {
        let Some(calibrator) = self.calibrator.take() else {
            return Ok(());
        };
        let choice = calibrator.finish()?;
        if choice.policy == scheduler::Orchestration::Layer {
            // The monitor keeps correcting the split from what the accelerator
            // actually loses to the CPU (late rows, waits).
            let o = self.auto_orchestrator()?;
            o.set_cpu_split(choice.cpu_split)?;
            o.enable_monitor();
        } else {
            self.orch = None;
            if let Some(e) = self.engine.as_mut().and_then(|e| e.get_mut().ok()) {
                e.set_placement(step_placement(choice.policy));
            }
        }
        if self.verbose {
            eprintln!("orchestration.policy = \"auto\": {}", choice.reason);
        }
        let (name, split, ms) = (
            choice.policy.name(),
            choice.cpu_split,
            choice.per_batch_s * 1e3,
        );
        self.tracer.instant("auto choice", |a| {
            a.extra.push((format!("policy {name}").into(), ms));
            a.extra.push(("cpu_split".into(), split as f64));
        });
        self.auto_choice = Some(choice);
        Ok(())
    }

    /// What `policy = "auto"` chose and why (`None` while it measures, or with a
    /// fixed policy).
    pub fn auto_choice(&self) -> Option<&scheduler::Choice> {
        self.auto_choice.as_ref()
    }

    /// Epoch `epoch`'s seed and its shuffled training vertices, which every batch
    /// loop cuts into `train.batch_size` batches (batch `k` seeded
    /// `derive_seed(base, k)`).
    fn epoch_order(&self, epoch: usize) -> (u64, Vec<u32>) {
        let base = derive_seed(self.cfg.train.seed, 1000 + epoch as u64);
        let mut order = self.train_ids.clone();
        Rng::new(base).shuffle(&mut order);
        (base, order)
    }

    /// The one batch loop of [`Trainer::train_batches`] (the orchestration
    /// pipeline, `orchestrate/pipeline.rs`, runs its own super-batch loop and
    /// shares [`finish_batch`]): batches `pos.batch..end` of the epoch in
    /// progress (`end` = the epoch's end when `None`), each trained by a runner
    /// that returns (loss × rows, correct, optimizer steps after it):
    /// - with a device engine, [`Engine::train_batch`] (sampling, gathering and
    ///   the step where the engine's placement says; its ops queue on the device);
    /// - on the native host path, the `cpu_ops` model: preparing (sampling and
    ///   gathering) batch `k + 1` runs concurrently with computing batch `k`
    ///   (`rayon::join`), so sampling and gather hide behind the dense math.
    ///
    /// Checks the cancel token before every batch; a callback's stop ends the
    /// loop after its batch.
    fn train_batches_direct(&mut self, end: Option<usize>) -> Result<bool> {
        let t = Instant::now();
        let epoch = self.pos.epoch;
        let (base, order) = self.epoch_order(epoch);
        let batches: Vec<&[u32]> = order.chunks(self.cfg.train.batch_size).collect();
        let total = batches.len();
        let end = end.unwrap_or(total).min(total);
        let Self {
            ds,
            model,
            opt,
            sampler,
            scratch,
            sparse,
            pos,
            callbacks,
            cancel,
            tracer,
            engine,
            on_nonfinite,
            skipped,
            dist,
            ..
        } = self;
        let tracer = &*tracer;
        let start = pos.batch.min(total);
        // In a distributed job the ranks stop together: a cancel seen by any rank
        // travels in the next step's all-reduce, and every rank stops after it.
        let distributed = dist.ranks() > 1;
        // Likewise a callback's stop on one rank: it travels in the next step's
        // all-reduce (at the epoch's end, in the epoch's agreement).
        let mut agreed = Agreed::default();
        let mut pending_stop = false;
        let stopped = |pos: &mut Position, k: usize, cause: StopCause| {
            pos.train_secs += t.elapsed().as_secs_f64();
            Err(Error::Cancelled {
                epoch,
                batch: k,
                cause,
            })
        };
        let batches = &batches;
        type Runner<'r> = Box<dyn FnMut(usize, bool) -> Result<(f64, usize, u64, Agreed)> + 'r>;
        let mut runner: Runner<'_> = match engine.as_ref() {
            Some(e) => {
                let mut e = e.lock().map_err(|_| poisoned())?;
                let Dist {
                    comm,
                    features: partitioned,
                    stats: dist_stats,
                    bucket,
                    device_reduce,
                    ..
                } = dist;
                let on_device = device_reduce.is_some();
                let comm: &dyn Communicator = &**comm;
                let partitioned = partitioned.as_deref();
                let (rank, ranks) = (comm.rank(), comm.size());
                let total: usize = model.params().iter().map(|t| t.len()).sum();
                let cancel = &*cancel;
                Box::new(move |k, stop| {
                    let seed = derive_seed(base, k as u64);
                    if !distributed {
                        // The engine records the batch's sample / gather /
                        // device-step slices (with its host → device bytes) into
                        // its tracer. With `device.sample_ahead` it samples the
                        // next batch of this run while this one's step runs.
                        let next = (k + 1 < end)
                            .then(|| (batches[k + 1], derive_seed(base, k as u64 + 1)));
                        e.set_next_batch(next);
                        let (l, c) = e.train_batch(batches[k], seed)?;
                        if tracer.is_enabled() {
                            tracer.counter(CACHE_HIT_RATE, e.cache_stats().hit_rate());
                        }
                        return Ok((l, c, e.version(), Agreed::default()));
                    }
                    // This rank's share up to its gradients on the device, the
                    // one all-reduce on the host, then the same step on every rank.
                    let whole = batches[k];
                    // With a partition file, the seeds this rank owns.
                    let owned = partitioned.and_then(|f| f.seeds_of(whole));
                    let mine = owned
                        .as_deref()
                        .unwrap_or(&whole[share(whole.len(), rank, ranks)]);
                    let g = if mine.is_empty() {
                        if let Some(pf) = partitioned {
                            // The exchange is collective: take part with no rows.
                            pf.gather(ds, &[], &mut Vec::new())?;
                        }
                        BatchGradients {
                            loss_sum: 0.0,
                            correct: 0,
                            flat: None,
                        }
                    } else if on_device {
                        let (loss_sum, correct) = e.device_gradients(mine, seed)?;
                        BatchGradients {
                            loss_sum,
                            correct,
                            flat: None,
                        }
                    } else {
                        e.batch_gradients(mine, seed)?
                    };
                    let probe = Probe::new(tracer, epoch, k);
                    let mut d = DistStep {
                        comm,
                        global: whole.len(),
                        cancel: cancel.is_cancelled(),
                        stop,
                        stats: &mut *dist_stats,
                        bucket: &mut *bucket,
                    };
                    // On the device (NCCL) the bucket carries the scalars alone,
                    // so that every rank knows whether to go on; the gradients
                    // are then summed, checked and applied on the device.
                    let (len, parts) = match (on_device, g.flat.as_deref()) {
                        (true, _) => (0, Some(Vec::new())),
                        (false, f) => (total, f.map(|f| vec![f])),
                    };
                    let r = Self::all_reduce_step(
                        &mut d,
                        len,
                        mine.len(),
                        g.loss_sum,
                        g.correct,
                        parts,
                        &probe,
                    )?;
                    if r.bad {
                        return Ok((f64::NAN, r.correct, e.version(), r.agreed));
                    }
                    let mut loss_sum = r.loss_sum;
                    if on_device {
                        let weight = mine.len() as f32 / whole.len().max(1) as f32;
                        let mut s = probe.slice("device allreduce + step");
                        let bytes = 4 * total as u64;
                        s.set_bytes(bytes);
                        let t = Instant::now();
                        if !e.reduce_and_step(weight)? {
                            loss_sum = f64::NAN;
                        }
                        d.stats.allreduce_bytes += bytes;
                        d.stats.allreduce_secs += t.elapsed().as_secs_f64();
                    } else {
                        let _step = probe.slice("step");
                        e.apply_gradients(&d.bucket[..total])?;
                    }
                    if tracer.is_enabled() {
                        tracer.counter(CACHE_HIT_RATE, e.cache_stats().hit_rate());
                    }
                    Ok((loss_sum, r.correct, e.version(), r.agreed))
                })
            }
            None => {
                let sparse = sparse.as_ref();
                let Dist {
                    comm,
                    features: partitioned,
                    stats: dist_stats,
                    bucket,
                    ..
                } = dist;
                let comm: &dyn Communicator = &**comm;
                let partitioned = partitioned.as_deref();
                let (rank, ranks) = (comm.rank(), comm.size());
                // This rank's share of batch `k` (the whole batch alone).
                // With a partition file, the seeds it owns (their rows are local).
                let mine = move |k: usize| -> Vec<u32> {
                    let b = batches[k];
                    partitioned
                        .and_then(|f| f.seeds_of(b))
                        .unwrap_or_else(|| b[share(b.len(), rank, ranks)].to_vec())
                };
                // Without MPI_THREAD_MULTIPLE the exchange of batch k + 1 waits for
                // the all-reduce of batch k instead of running beside it.
                let overlap = !distributed || comm.concurrent();
                let cancel = &*cancel;
                let mut next: Option<Prepared<'_>> = None;
                let mut spare: Vec<f32> = Vec::new();
                Box::new(move |k, stop| {
                    let cur = match next.take() {
                        Some(p) if p.probe.batch == k as u64 => p,
                        _ => Self::prepare(
                            ds,
                            sparse,
                            sampler,
                            scratch,
                            mine(k),
                            derive_seed(base, k as u64),
                            std::mem::take(&mut spare),
                            Probe::new(tracer, epoch, k),
                            partitioned,
                        )?,
                    };
                    let upcoming = (k + 1 < end).then_some(k + 1);
                    let buf = std::mem::take(&mut spare);
                    let step = |model: &mut Model<f32>, opt: &mut Adam<f32>, stats, bucket| {
                        let d = distributed.then(|| DistStep {
                            comm,
                            global: batches[k].len(),
                            cancel: cancel.is_cancelled(),
                            stop,
                            stats,
                            bucket,
                        });
                        Self::compute(ds, model, opt, &cur, d)
                    };
                    let prep = |scratch: &mut SamplerScratch, buf| {
                        upcoming
                            .map(|j| {
                                Self::prepare(
                                    ds,
                                    sparse,
                                    sampler,
                                    scratch,
                                    mine(j),
                                    derive_seed(base, j as u64),
                                    buf,
                                    Probe::new(tracer, epoch, j),
                                    partitioned,
                                )
                            })
                            .transpose()
                    };
                    let (prepared, stepped) = if overlap {
                        rayon::join(
                            || prep(scratch, buf),
                            || step(model, opt, &mut *dist_stats, &mut *bucket),
                        )
                    } else {
                        let stepped = step(model, opt, &mut *dist_stats, &mut *bucket);
                        (prep(scratch, buf), stepped)
                    };
                    let (l, c, agreed) = stepped?;
                    next = prepared?;
                    if let Inputs::Dense(v) = cur.x {
                        spare = v;
                    }
                    Ok((l, c, opt.version(), agreed))
                })
            }
        };
        for (k, seeds) in batches.iter().enumerate().take(end).skip(start) {
            if agreed.cancel || (!distributed && cancel.is_cancelled()) {
                return stopped(pos, k, StopCause::Token);
            }
            if agreed.stop {
                return stopped(pos, k, StopCause::Callback);
            }
            let tb = Instant::now();
            let (l, c, step, now) = runner(k, pending_stop)?;
            agreed = now;
            let stop = finish_batch(
                pos,
                callbacks,
                Trained {
                    epoch,
                    batch: k,
                    batches: total,
                    size: seeds.len(),
                    loss_sum: l,
                    correct: c,
                    seconds: tb.elapsed().as_secs_f64(),
                    step,
                },
                *on_nonfinite,
                skipped,
            );
            let stop = match stop {
                Ok(stop) => stop,
                Err(e) => {
                    pos.train_secs += t.elapsed().as_secs_f64();
                    return Err(e);
                }
            };
            if stop && distributed && k + 1 < total {
                // Stops with every rank, after the next batch.
                pending_stop = true;
            } else if stop {
                if k + 1 < total {
                    return stopped(pos, k + 1, StopCause::Callback);
                }
                pos.train_secs += t.elapsed().as_secs_f64();
                return Ok(true);
            }
        }
        pos.train_secs += t.elapsed().as_secs_f64();
        Ok(pending_stop)
    }

    /// [`Trainer::train_batches_direct`] through the orchestration pipeline
    /// ([`crate::orchestrate::pipeline`]): same batches, order and seeds; hot
    /// vertices' bottom-layer rows come from the CPU within the staleness bound.
    fn train_batches_orchestrated(
        &mut self,
        end: Option<usize>,
        mark: Option<usize>,
    ) -> Result<bool> {
        let t = Instant::now();
        let epoch = self.pos.epoch;
        let (base, order) = self.epoch_order(epoch);
        let batches: Vec<&[u32]> = order.chunks(self.cfg.train.batch_size).collect();
        let total = batches.len();
        let Self {
            ds,
            engine,
            orch,
            pos,
            callbacks,
            cancel,
            tracer,
            acc_track,
            on_nonfinite,
            skipped,
            ..
        } = self;
        let on_nonfinite = *on_nonfinite;
        let (Some(engine), Some(orch)) = (engine.as_ref(), orch.as_mut()) else {
            return Ok(false);
        };
        let mut engine = engine.lock().map_err(|_| poisoned())?;
        let run = EpochRun {
            ds,
            batches: &batches,
            start: pos.batch.min(total),
            end: end.unwrap_or(total).min(total),
            mark,
            acc_track: *acc_track,
            base_seed: base,
            epoch,
            tracer,
            cancel,
        };
        let mut on_batch = |d: &BatchDone| -> Result<bool> {
            finish_batch(
                pos,
                callbacks,
                Trained {
                    epoch,
                    batch: d.k,
                    batches: total,
                    size: batches[d.k].len(),
                    loss_sum: d.loss_sum,
                    correct: d.correct,
                    seconds: d.seconds,
                    step: d.version,
                },
                on_nonfinite,
                skipped,
            )
        };
        let end = orch.run_epoch(&mut **engine, &run, &mut on_batch);
        pos.train_secs += t.elapsed().as_secs_f64();
        match end? {
            EpochEnd::Finished(stop) => Ok(stop),
            EpochEnd::Stopped(k, cause) => Err(Error::Cancelled {
                epoch,
                batch: k,
                cause,
            }),
        }
    }

    /// Logits of every vertex by layer-wise full-graph inference (no dropout): a
    /// `num_vertices × num_classes` matrix, row `v` for vertex `v`. Computed anew
    /// on every call; [`Trainer::predict`] keeps them per weight version.
    pub fn full_graph_logits(&self) -> Result<Array2<f32>> {
        let n = self.ds.num_vertices();
        let c = self.ds.num_classes as usize;
        let flat = self.full_graph_logits_flat()?;
        Array2::from_shape_vec((n, c), flat).map_err(|e| Error::InvalidDataset {
            what: format!("internal: full-graph logits are not {n} × {c}: {e}"),
        })
    }

    /// [`Trainer::full_graph_logits`], row-major in one vector.
    fn full_graph_logits_flat(&self) -> Result<Vec<f32>> {
        self.check_every_row("full-graph logits")?;
        if let Some(engine) = &self.engine {
            return engine.lock().map_err(|_| poisoned())?.full_graph_logits();
        }
        let (ds, model, sparse) = (&self.ds, &self.model, self.sparse.as_ref());
        self.pool
            .install(|| Ok(Self::full_graph_forward(ds, model, sparse)?.into_logits()))
    }

    /// The logits of `ids` (each below the vertex count), in order: an `ids.len()
    /// × num_classes` matrix, the rows of [`Trainer::full_graph_logits`] (the
    /// predicted class of a row is its largest entry). The full-graph logits are
    /// computed once per weight version and kept until the next training step or
    /// checkpoint load, so serving many requests costs one inference.
    pub fn predict(&mut self, ids: &[u32]) -> Result<Array2<f32>> {
        self.resolve_sparse()?;
        self.check_ids(ids)?;
        if self.logits.is_none() {
            let flat = self.full_graph_logits_flat()?;
            let c = self.ds.num_classes as usize;
            self.logits = Some(Embeddings::new(flat, c, self.steps())?);
        }
        match &self.logits {
            Some(table) => table.gather(ids),
            None => unreachable!("computed above"),
        }
    }

    /// An error naming the first id in `ids` that is not below the vertex count.
    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let n = self.ds.num_vertices();
        match ids.iter().enumerate().find(|(_, &v)| v as usize >= n) {
            Some((i, &v)) => Err(Error::invalid_argument(
                "ids",
                format!(
                    "vertex id {v} at position {i} is out of range: the dataset has {n} vertices (ids 0..{n})"
                ),
            )),
            None => Ok(()),
        }
    }

    /// Layer-wise full-graph forward pass (no dropout), on the calling pool. (Takes
    /// the parts, not `&self`: callbacks make the trainer `Send` but not `Sync`.)
    /// Full-graph computations read every feature row: an error on a rank that
    /// holds only its partition.
    fn check_every_row(&self, what: &str) -> Result<()> {
        if self.dist.features.is_some() {
            return Err(Error::invalid_argument(
                "dist.features",
                format!(
                    "{what} read every feature row, and this rank holds only its partition \
                     (dist.features = \"partitioned\"); compute them in a one-rank run from \
                     the checkpoint"
                ),
            ));
        }
        Ok(())
    }

    /// In a distributed job, checks that every rank holds the same weights (they
    /// apply the same steps to the same summed gradients; a difference is a bug
    /// or a rank that trained something else).
    fn check_ranks_agree(&self) -> Result<()> {
        if self.dist.ranks() <= 1 {
            return Ok(());
        }
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for t in self.model.params() {
            h.update(bytemuck::cast_slice(t));
        }
        if !crate::dist::ranks_agree(&*self.dist.comm, h.digest())? {
            return Err(Error::Dist {
                what: format!(
                    "rank {}: the ranks' weights differ after epoch {} (they must apply the \
                     same steps)",
                    self.dist.comm.rank(),
                    self.pos.epoch
                ),
            });
        }
        Ok(())
    }

    fn full_graph_forward(
        ds: &Dataset,
        model: &Model<f32>,
        sparse: Option<&SparseRows<f32>>,
    ) -> Result<cpu_ops::Forward<f32>> {
        let g = &ds.graph;
        let n = g.num_vertices();
        let views = (0..model.config().num_layers)
            .map(|_| BlockView::new(n, g.offsets(), g.indices()))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(kernel("full-graph block"))?;
        let x = match sparse {
            Some(s) => ModelInput::Sparse(s),
            None => ModelInput::Dense(ds.features.as_slice()),
        };
        model
            .forward_input(&views, x, false, 0)
            .map_err(kernel("full-graph inference"))
    }

    /// Every vertex's embedding at the current weights: the output of the layer
    /// below the classifier by full-neighbor, layer-wise inference over the whole
    /// graph (see [`crate::embedding`]). Computed once per weight version and
    /// cached until the next training step or checkpoint load; the snapshot is
    /// cheap to clone and can be served from other threads.
    pub fn embedding_table(&mut self) -> Result<Embeddings> {
        self.resolve_sparse()?;
        if let Some(e) = &self.embeddings {
            return Ok(e.clone());
        }
        self.check_every_row("embeddings")?;
        let layers = self.cfg.model.layers;
        let e = if layers < 2 {
            let f = &self.ds.features;
            Embeddings::new(f.as_slice().to_vec(), f.dim(), self.steps())?
        } else {
            let (ds, model, sparse) = (&self.ds, &self.model, self.sparse.as_ref());
            let fwd = self
                .pool
                .install(|| Self::full_graph_forward(ds, model, sparse))?;
            let h = fwd
                .hidden(layers - 2)
                .ok_or_else(|| Error::InvalidDataset {
                    what: "internal: the forward pass kept no hidden layer output".into(),
                })?;
            Embeddings::new(h.to_vec(), self.cfg.model.hidden, self.steps())?
        };
        self.embeddings = Some(e.clone());
        Ok(e)
    }

    /// The embeddings of `ids` (each below the vertex count), in order: an
    /// `ids.len() × dim` matrix, where `dim` is `model.hidden` (the input feature
    /// width for a 1-layer model). See [`Trainer::embedding_table`].
    pub fn embeddings(&mut self, ids: &[u32]) -> Result<Array2<f32>> {
        self.check_ids(ids)?;
        self.embedding_table()?.gather(ids)
    }

    /// Writes the model at the current weights to `path` as an ONNX graph,
    /// atomically ([`crate::onnx`]; `opts` picks logits or embeddings). The file
    /// serves sampled blocks and full-graph inference alike.
    pub fn export_onnx(&self, path: &Path, opts: &crate::onnx::ExportOptions) -> Result<()> {
        crate::onnx::write_model(&self.model, opts, path)
    }

    /// The trainer's state as a [`Checkpoint`].
    pub fn checkpoint(&self) -> Checkpoint {
        let names = self.model.param_names();
        let tensors = self
            .model
            .params()
            .into_iter()
            .zip(names)
            .enumerate()
            .map(|(i, (p, name))| TensorState {
                name,
                values: p.to_vec(),
                m: self
                    .opt
                    .first_moment(i)
                    .map(<[f32]>::to_vec)
                    .unwrap_or_default(),
                v: self
                    .opt
                    .second_moment(i)
                    .map(<[f32]>::to_vec)
                    .unwrap_or_default(),
            })
            .collect();
        Checkpoint {
            config_toml: self.cfg.to_toml(),
            dataset: DatasetShape::of(&self.ds),
            position: self.pos,
            steps: self.steps(),
            tensors,
        }
    }

    /// Saves the configuration, position (epoch, batch), optimizer step count,
    /// parameters and Adam moments to `path`, atomically (format:
    /// [`crate::checkpoint`]).
    pub fn save_checkpoint(&self, path: &Path) -> Result<()> {
        self.checkpoint().write(path)
    }

    /// Loads a checkpoint written by [`Trainer::save_checkpoint`]: parameters,
    /// Adam state, step count and position. The model shape and the dataset's sizes
    /// must match; a checkpoint taken inside an epoch also needs the same
    /// `train.seed` and `train.batch_size`. Continuing with the same configuration
    /// gives bit-identical results to a run that never stopped. On error the
    /// trainer is unchanged.
    pub fn load_checkpoint(&mut self, path: &Path) -> Result<()> {
        let c = Checkpoint::read(path)?;
        self.restore(c, path)
    }

    /// [`Trainer::load_checkpoint`] from a checkpoint in memory (`origin` names it
    /// in errors).
    pub fn restore(&mut self, c: Checkpoint, origin: &Path) -> Result<()> {
        let params: Vec<(String, usize)> = self
            .model
            .param_names()
            .into_iter()
            .zip(self.model.params().iter().map(|p| p.len()))
            .collect();
        c.check_fits(origin, &self.cfg, &DatasetShape::of(&self.ds), &params)?;
        let (mut m, mut v) = (Vec::new(), Vec::new());
        let mut values = Vec::with_capacity(c.tensors.len());
        for t in c.tensors {
            values.push(t.values);
            if c.steps > 0 {
                m.push(t.m);
                v.push(t.v);
            }
        }
        self.opt
            .restore_state(c.steps, m, v)
            .map_err(|e| Error::format(origin, format!("optimizer state: {e}")))?;
        for (dst, src) in self.model.params_mut().into_iter().zip(&values) {
            dst.copy_from_slice(src);
        }
        if let Some(engine) = &self.engine {
            let params = self.model.params();
            let n = params.len();
            let (m, v): (Vec<&[f32]>, Vec<&[f32]>) = (0..n)
                .map(|i| {
                    (
                        self.opt.first_moment(i).unwrap_or(&[]),
                        self.opt.second_moment(i).unwrap_or(&[]),
                    )
                })
                .unzip();
            let zeros: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
            let zero_refs: Vec<&[f32]> = zeros.iter().map(Vec::as_slice).collect();
            let (m, v) = if c.steps == 0 {
                (zero_refs.clone(), zero_refs)
            } else {
                (m, v)
            };
            engine
                .lock()
                .map_err(|_| poisoned())?
                .load_state(&params, &m, &v, c.steps)?;
        }
        self.pos = c.position;
        self.stop_requested = false;
        self.embeddings = None;
        self.logits = None;
        Ok(())
    }

    /// Accuracy of `logits` (all vertices) on `ids`.
    fn accuracy_on(&self, logits: &[f32], ids: &[u32]) -> Result<f64> {
        if ids.is_empty() {
            return Ok(0.0);
        }
        Ok(self.correct_on(logits, 0, ids)? as f64 / ids.len() as f64)
    }

    /// Correct predictions among `ids`, whose logits are rows `v − first` of
    /// `logits` (`num_classes` wide).
    fn correct_on(&self, logits: &[f32], first: usize, ids: &[u32]) -> Result<usize> {
        let c = self.ds.num_classes as usize;
        let rows: Vec<f32> = ids
            .iter()
            .flat_map(|&v| {
                let r = v as usize - first;
                logits[r * c..(r + 1) * c].iter().copied()
            })
            .collect();
        accuracy_count(
            MatRef::new(&rows, ids.len(), c).map_err(kernel("logits"))?,
            &Self::labels_of(&self.ds, ids),
        )
        .map_err(kernel("accuracy"))
    }

    /// Validation and test accuracy, as `train.eval_mode` says.
    pub fn evaluate_val_test(&mut self) -> Result<(f64, f64)> {
        self.resolve_sparse()?;
        let pool = Arc::clone(&self.pool);
        pool.install(|| self.evaluate_val_test_here())
    }

    fn evaluate_val_test_here(&mut self) -> Result<(f64, f64)> {
        let tracer = self.tracer.clone();
        let _eval = tracer.slice("eval").epoch(self.pos.epoch as u64);
        if self.cfg.train.eval_mode == EvalMode::Full {
            if self.dist.shard_full_eval && self.engine.is_none() {
                return self.evaluate_full_sharded();
            }
            let logits = match &self.engine {
                Some(engine) => engine.lock().map_err(|_| poisoned())?.full_graph_logits()?,
                None => Self::full_graph_forward(&self.ds, &self.model, self.sparse.as_ref())?
                    .into_logits(),
            };
            Ok((
                self.accuracy_on(&logits, &self.val_ids)?,
                self.accuracy_on(&logits, &self.test_ids)?,
            ))
        } else {
            let (v, t) = (self.val_ids.clone(), self.test_ids.clone());
            Ok((self.evaluate_here(&v)?, self.evaluate_here(&t)?))
        }
    }

    /// Full-graph (layer-wise) validation and test accuracy in a distributed
    /// job on the native host path, sharded: rank `r` computes every layer's
    /// rows of its vertex range `share(n, r, N)` over the one-hop block of
    /// that range (every neighbor: the rows of full-graph inference), the
    /// ranks exchange the hidden rows after each layer below the top (one
    /// all-gather, `allgather` slices), and each rank counts the correct
    /// predictions of its own validation and test vertices; the counts are
    /// summed. GCN normalizes by each source's degree in the whole graph: its
    /// input rows are scaled by √(block degree / graph degree) to undo the
    /// block's own normalization (equal to full-graph inference up to rounding).
    fn evaluate_full_sharded(&self) -> Result<(f64, f64)> {
        let (rank, ranks) = self.rank();
        let (ds, model, comm) = (&*self.ds, &self.model, &*self.dist.comm);
        let g = &ds.graph;
        let n = g.num_vertices();
        let own = share(n, rank, ranks);
        if self.dist.shard_block.get().is_none() {
            let _s = self.tracer.slice("shard block");
            let made = self.shard_block(own.clone())?;
            // Only this trainer's thread evaluates: the cell is empty here.
            let _ = self.dist.shard_block.set(made);
        }
        let ShardBlock { block, scale } =
            self.dist.shard_block.get().ok_or_else(|| {
                Error::invalid_argument("dist.full_eval", "internal: no shard block")
            })?;
        let view = BlockView::new(block.num_src(), block.indptr(), block.indices())
            .map_err(kernel("full-graph block"))?;
        let src = block.src_ids();
        let scale_rows = |x: &mut [f32], dim: usize| {
            if let Some(s) = scale {
                for (row, &c) in x.chunks_mut(dim).zip(s) {
                    row.iter_mut().for_each(|v| *v *= c);
                }
            }
        };
        let layers = model.config().num_layers;
        let mut h: Vec<f32> = Vec::new();
        let mut out = Vec::new();
        for l in 0..layers {
            let params = model.layer_params(l).map_err(kernel("layer parameters"))?;
            out = if l == 0 {
                match self.sparse.as_ref() {
                    Some(s) => {
                        let mut x = s.gather(src).map_err(kernel("sparse input rows"))?;
                        if let Some(c) = scale {
                            let rows = x.indptr().windows(2).map(|w| (w[1] - w[0]) as usize);
                            let vals: Vec<f32> = rows
                                .zip(c)
                                .flat_map(|(k, &c)| std::iter::repeat_n(c, k))
                                .zip(x.values())
                                .map(|(c, &v)| c * v)
                                .collect();
                            x = SparseRows::from_parts(
                                x.indptr().to_vec(),
                                x.col_ids().to_vec(),
                                vals,
                                x.num_cols(),
                            )
                            .map_err(kernel("scaled sparse input rows"))?;
                        }
                        model.forward_layer_with(l, params, &view, ModelInput::Sparse(&x))
                    }
                    None => {
                        let dim = ds.features.dim();
                        let mut x = vec![0.0f32; src.len() * dim];
                        gather_rows(&ds.features, src, &mut x).map_err(kernel("input rows"))?;
                        scale_rows(&mut x, dim);
                        model.forward_layer_with(l, params, &view, ModelInput::Dense(&x))
                    }
                }
            } else {
                let dim = h.len() / n.max(1);
                let mut x = Vec::with_capacity(src.len() * dim);
                for &v in src {
                    x.extend_from_slice(&h[v as usize * dim..(v as usize + 1) * dim]);
                }
                scale_rows(&mut x, dim);
                model.forward_layer_with(l, params, &view, ModelInput::Dense(&x))
            }
            .map_err(kernel("full-graph inference"))?;
            if l + 1 < layers {
                // Every rank's rows, in rank (= vertex) order.
                let mut s = self.tracer.slice("allgather");
                s.set_bytes((out.len() * 4 * ranks) as u64);
                let send: Vec<f32> = (0..ranks).flat_map(|_| out.iter().copied()).collect();
                let (all, _) = comm.all_to_all_f32(&send, &vec![out.len(); ranks])?;
                h = all;
            }
        }
        let mut counts = [0.0f64; 2];
        for (slot, ids) in counts.iter_mut().zip([&self.val_ids, &self.test_ids]) {
            let mine: Vec<u32> = ids
                .iter()
                .copied()
                .filter(|&v| own.contains(&(v as usize)))
                .collect();
            *slot = self.correct_on(&out, own.start, &mine)? as f64;
        }
        comm.all_reduce_sum_f64(&mut counts)?;
        let acc = |k: f64, ids: &[u32]| {
            if ids.is_empty() {
                0.0
            } else {
                k / ids.len() as f64
            }
        };
        Ok((
            acc(counts[0], &self.val_ids),
            acc(counts[1], &self.test_ids),
        ))
    }

    /// The one-hop block of the vertices `own` (every neighbor) and, for GCN,
    /// each source's input scale: its normalization reads the source's degree in
    /// the block, self loops included; inference over the whole graph reads its
    /// degree in the graph.
    fn shard_block(&self, own: std::ops::Range<usize>) -> Result<ShardBlock> {
        let g = &self.ds.graph;
        let n = g.num_vertices();
        let dst: Vec<u32> = (own.start as u32..own.end as u32).collect();
        let mut scratch = SamplerScratch::new(n);
        let block = cpu_ops::sample_hop(g, &dst, cpu_ops::ALL_NEIGHBORS, 0, None, &mut scratch)
            .map_err(kernel("full-graph block of this rank's vertices"))?;
        let view = BlockView::new(block.num_src(), block.indptr(), block.indices())
            .map_err(kernel("full-graph block"))?;
        let nd = dst.len();
        let scale = (self.model.config().kind == cpu_ops::ModelKind::Gcn).then(|| {
            let mut deg = vec![0u32; n];
            for &v in g.indices().iter() {
                deg[v as usize] += 1;
            }
            block
                .src_ids()
                .iter()
                .enumerate()
                .map(|(j, &v)| {
                    let in_block = view.out_degree(j) + usize::from(j < nd);
                    let in_graph = deg[v as usize] as usize + 1;
                    (in_block as f64 / in_graph as f64).sqrt() as f32
                })
                .collect()
        });
        Ok(ShardBlock { block, scale })
    }

    /// Accuracy on `ids` by mini-batches sampled with the evaluation fanouts (seeds
    /// shuffled, so batches are random subsets), no dropout. Ids must be below the
    /// vertex count.
    pub fn evaluate(&mut self, ids: &[u32]) -> Result<f64> {
        self.resolve_sparse()?;
        let n = self.ds.num_vertices();
        if let Some((i, &v)) = ids.iter().enumerate().find(|(_, &v)| v as usize >= n) {
            return Err(Error::invalid_argument(
                "ids",
                format!(
                    "vertex id {v} at position {i} is out of range: the dataset has {n} vertices"
                ),
            ));
        }
        let pool = Arc::clone(&self.pool);
        pool.install(|| self.evaluate_here(ids))
    }

    fn evaluate_here(&mut self, ids: &[u32]) -> Result<f64> {
        if ids.is_empty() {
            return Ok(0.0);
        }
        let mut ids = ids.to_vec();
        Rng::new(derive_seed(self.cfg.train.seed, 6_000_000)).shuffle(&mut ids);
        let mut correct = 0usize;
        // Evaluation shows as one `eval` slice; its batches are not traced.
        let untraced = Tracer::disabled();
        let c = self.ds.num_classes as usize;
        let (rank, ranks) = self.rank();
        for (k, whole) in ids.chunks(self.cfg.train.eval_batch_size).enumerate() {
            let seed = derive_seed(self.cfg.train.seed, 7_000_000 + k as u64);
            // Each rank evaluates its share of every batch; the counts are summed.
            let owned = self.dist.features.as_ref().and_then(|f| f.seeds_of(whole));
            let chunk = owned
                .as_deref()
                .unwrap_or(&whole[share(whole.len(), rank, ranks)]);
            if let Some(engine) = &self.engine {
                if chunk.is_empty() {
                    if let Some(pf) = &self.dist.features {
                        // The exchange is collective: take part with no rows.
                        pf.gather(&self.ds, &[], &mut Vec::new())?;
                    }
                    continue;
                }
                let logits = engine
                    .lock()
                    .map_err(|_| poisoned())?
                    .sampled_logits(chunk, seed)?;
                correct += accuracy_count(
                    MatRef::new(&logits, chunk.len(), c).map_err(kernel("logits"))?,
                    &Self::labels_of(&self.ds, chunk),
                )
                .map_err(kernel("accuracy"))?;
                continue;
            }
            let p = Self::prepare(
                &self.ds,
                self.sparse.as_ref(),
                &self.eval_sampler,
                &mut self.scratch,
                chunk.to_vec(),
                seed,
                Vec::new(),
                Probe::new(&untraced, 0, k),
                self.dist.features.as_deref(),
            )?;
            if chunk.is_empty() {
                continue;
            }
            let views = Self::views(&p.batch)?;
            let fwd = self
                .model
                .forward_input(&views, p.x.as_model_input(), false, 0)
                .map_err(kernel("forward"))?;
            let labels = Self::labels_of(&self.ds, chunk);
            correct += accuracy_count(
                MatRef::new(fwd.logits(), chunk.len(), c).map_err(kernel("logits"))?,
                &labels,
            )
            .map_err(kernel("accuracy"))?;
        }
        if ranks > 1 {
            let mut sum = [correct as f64];
            self.dist.comm.all_reduce_sum_f64(&mut sum)?;
            correct = sum[0] as usize;
        }
        Ok(correct as f64 / ids.len() as f64)
    }

    /// Trains until `train.epochs` epochs are complete (continuing an interrupted
    /// epoch or a loaded checkpoint), evaluating as configured, and returns the
    /// statistics of the epochs it trained. Callbacks see every batch and epoch; a
    /// callback's stop ends `fit` early with `Ok` (see [`crate::control`]); a
    /// cancelled token is [`Error::Cancelled`].
    ///
    /// With a checkpoint path ([`Trainer::set_checkpoint_path`]) it also writes a
    /// checkpoint every `train.checkpoint_every` epochs (before the last), when a
    /// cancel stops it (the position inside the epoch, for a bit-exact resume),
    /// when a non-finite loss stops it ([`Error::NonFinite`]: the weights before
    /// that batch), and at the end.
    pub fn fit(&mut self) -> Result<Vec<EpochStats>> {
        let mut all = Vec::new();
        let every = self.cfg.train.checkpoint_every;
        while self.pos.epoch < self.cfg.train.epochs {
            match self.train_epoch() {
                Ok(s) => all.push(s),
                Err(Error::Cancelled {
                    cause: StopCause::Callback,
                    ..
                }) => break,
                Err(e @ (Error::Cancelled { .. } | Error::NonFinite { .. })) => {
                    // The position inside the epoch and the last good weights.
                    if let Some(p) = self.checkpoint_path.clone() {
                        self.save_checkpoint(&p)?;
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
            if self.stop_requested {
                break;
            }
            let done = self.pos.epoch;
            if let Some(p) = self.checkpoint_path.clone() {
                if done < self.cfg.train.epochs && every > 0 && done.is_multiple_of(every) {
                    self.save_checkpoint(&p)?;
                }
            }
        }
        if let Some(p) = self.checkpoint_path.clone() {
            self.save_checkpoint(&p)?;
        }
        Ok(all)
    }

    /// Where [`Trainer::fit`] writes its checkpoints (`None`: nowhere).
    pub fn set_checkpoint_path(&mut self, path: Option<std::path::PathBuf>) {
        self.checkpoint_path = path;
    }

    /// Where [`Trainer::fit`] writes its checkpoints.
    pub fn checkpoint_path(&self) -> Option<&Path> {
        self.checkpoint_path.as_deref()
    }
}

/// The test accuracy at the epoch with the best validation accuracy (the usual
/// model-selection rule), with that epoch.
pub fn test_at_best_val(stats: &[EpochStats]) -> Option<(usize, f64)> {
    stats
        .iter()
        .filter_map(|s| Some((s.epoch, s.val_acc?, s.test_acc?)))
        .fold(None, |best: Option<(usize, f64, f64)>, cur| match best {
            Some(b) if b.1 >= cur.1 => Some(b),
            _ => Some(cur),
        })
        .map(|(e, _, t)| (e, t))
}
