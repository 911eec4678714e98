//! The session: a model being trained on a dataset — epochs, evaluation,
//! callbacks, cancellation and checkpoints. How each batch trains is the
//! executor's business (`crate::executor`, chosen by `crate::placement`); the
//! session only orders the batches and keeps the books.
//!
//! # One epoch
//! 1. Shuffle the training vertices with `(seed, epoch)`; cut batches of
//!    `train.batch_size` seeds; batch `k` samples with `derive_seed(base, k)`.
//! 2. The executor trains the remaining batches of the epoch
//!    (`executor::Executor::train`); after each, the session adds it to
//!    the epoch's position and shows its [`BatchMetrics`] to the callbacks
//!    (a non-finite loss stops with [`Error::NonFinite`], or is skipped with
//!    `train.on_nonfinite = "skip-batch"`).
//! 3. Every `train.eval_every` epochs (and after the last), evaluate validation
//!    and test accuracy without dropout (`session/evaluate.rs`):
//!    `train.eval_mode = "full"` (default) applies each layer to the whole graph
//!    before the next — layer-wise full-neighbor inference, DGL's `inference`
//!    pattern; `"sampled"` evaluates mini-batches sampled with
//!    `train.eval_fanouts`.
//!
//! Everything random derives from `train.seed` (initialization, shuffles,
//! sampling, dropout), so a run is reproducible. Batch `k` of epoch `e` depends
//! only on `(seed, e, k)` and the weights, which is why a run interrupted
//! between batches (cancel token, callback, checkpoint) and continued gives
//! bit-identical parameters and losses.
//!
//! # Ownership
//! A trainer owns its dataset (shared by reference count), its executor (which
//! alone holds the weights and Adam's state), its compute pool (its own rayon
//! pool), callbacks and cancel token; there is no global state, so several
//! trainers can run in one process on different threads. It prints nothing
//! unless built with `verbose(true)` (one line per epoch on stderr). Build one
//! with [`crate::TrainerBuilder`] or [`Trainer::new`].
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

pub(crate) mod builder;
pub(crate) mod control;
mod evaluate;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use cpu_ops::{derive_seed, Rng};
use rayon::ThreadPool;

use crate::checkpoint::{Checkpoint, DatasetShape, Position, TensorState};
use crate::config::{DistFeatures, DistFullEval, DistReduce, OnNonFiniteKind, TrainConfig};
use crate::data::dataset::{open_dataset, Dataset, SplitSpec, Verify};
use crate::data::generate::{generate_sbm, SbmOptions};
use crate::dist::features::PartitionedFeatures;
use crate::dist::{Communicator, DistStats, Solo};
use crate::embedding::Embeddings;
use crate::engine::sparse_rows_where;
use crate::error::{Error, Result, StopCause};
use crate::executor::step::data_parallel::nccl_lacks;
use crate::executor::{BatchDone, DistSetup, EpochEnd, EpochRun, Executor, OrchestrationStats};
use crate::placement::{place, PlacementInput};
use crate::pool::build_pool;
use crate::trace::{Tracer, TrackId, TrackKind};

use control::{BatchMetrics, Callback, CancelToken, Control, EpochStats};

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

/// The dataset's vertex splits.
struct Splits {
    train: Vec<u32>,
    val: Vec<u32>,
    test: Vec<u32>,
}

/// A trainer's part in a distributed job ([`Trainer::set_communicator`]), as
/// evaluation needs it (the executor keeps the training side).
struct Dist {
    comm: Arc<dyn Communicator>,
    /// `dist.features = "partitioned"` with more than one rank.
    features: Option<Arc<PartitionedFeatures>>,
    /// Full-graph evaluation is sharded over the ranks (`dist.full_eval`).
    shard_full_eval: bool,
    /// The sharded evaluation's block and GCN input scale, made by the first
    /// evaluation (the graph, this rank's range and the model kind are fixed).
    shard_block: Option<evaluate::ShardBlock>,
}

impl Dist {
    fn solo() -> Self {
        Self {
            comm: Arc::new(Solo),
            features: None,
            shard_full_eval: false,
            shard_block: None,
        }
    }

    fn ranks(&self) -> usize {
        self.comm.size()
    }
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

/// The books of the epoch in progress that each trained batch updates.
struct Books<'a> {
    pos: &'a mut Position,
    callbacks: &'a mut [Box<dyn Callback>],
    on_nonfinite: OnNonFinite,
    skipped: &'a mut usize,
    epoch: usize,
    batches: &'a [&'a [u32]],
}

impl Books<'_> {
    /// Adds a trained batch to the position and shows its metrics to the
    /// callbacks; returns whether one asked to stop. A batch whose loss is not
    /// finite is an [`Error::NonFinite`] (`Stop`), or only moves the position on
    /// and counts as skipped (`Skip`), without callbacks.
    fn batch(&mut self, d: &BatchDone) -> Result<bool> {
        let size = self.batches[d.k].len();
        if !d.loss_sum.is_finite() {
            return match self.on_nonfinite {
                OnNonFinite::Stop => Err(Error::NonFinite {
                    epoch: self.epoch,
                    batch: d.k,
                    loss: d.loss_sum / size.max(1) as f64,
                }),
                OnNonFinite::Skip => {
                    self.pos.batch = d.k + 1;
                    *self.skipped += 1;
                    Ok(false)
                }
            };
        }
        self.pos.batch = d.k + 1;
        self.pos.loss_sum += d.loss_sum;
        self.pos.correct += d.correct as u64;
        self.pos.seen += size as u64;
        let metrics = BatchMetrics {
            epoch: self.epoch,
            batch: d.k,
            batches: self.batches.len(),
            batch_size: size,
            loss: d.loss_sum / size.max(1) as f64,
            accuracy: d.correct as f64 / size.max(1) as f64,
            seconds: d.seconds,
            step: d.version,
        };
        let mut stop = false;
        for cb in self.callbacks.iter_mut() {
            stop |= cb.on_batch(&metrics) == Control::Stop;
        }
        Ok(stop)
    }
}

/// A model being trained on a dataset (module doc).
pub struct Trainer {
    ds: Arc<Dataset>,
    cfg: TrainConfig,
    /// Trains the batches and holds the weights.
    exec: Box<dyn Executor>,
    splits: Splits,
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
    /// Full-graph logits of the current weights, computed on the first
    /// `predict`.
    logits: Option<Embeddings>,
    /// Where training and evaluation record their slices (disabled by default).
    tracer: Tracer,
    /// The accelerator's track in `tracer`.
    acc_track: TrackId,
    /// What `[device]` chose, and why.
    device_note: String,
    /// Where `fit` writes checkpoints.
    checkpoint_path: Option<PathBuf>,
    /// `train.on_nonfinite`.
    on_nonfinite: OnNonFinite,
    /// Batches of the epoch in progress skipped for a non-finite loss.
    skipped: usize,
    /// The ranks of a distributed job ([`Solo`] unless set).
    dist: Dist,
}

/// A failed [`Trainer::set_communicator`] left no executor behind.
struct Spent;

impl Executor for Spent {
    fn train(
        &mut self,
        _: &EpochRun<'_>,
        _: &mut crate::executor::OnBatch<'_>,
    ) -> Result<EpochEnd> {
        Err(spent())
    }
    fn state(&mut self) -> &mut dyn crate::engine::ModelState {
        unreachable!("Trainer::state checks for a spent executor")
    }
    fn state_ref(&self) -> &dyn crate::engine::ModelState {
        unreachable!("Trainer::state checks for a spent executor")
    }
    fn set_tracer(&mut self, _: &Tracer, _: TrackId) {}
    fn describe(&self) -> String {
        "no executor (a failed set_communicator)".into()
    }
    fn is_spent(&self) -> bool {
        true
    }
    fn distribute(self: Box<Self>, _: DistSetup) -> Result<Box<dyn Executor>> {
        Err(spent())
    }
}

fn spent() -> Error {
    Error::invalid_argument(
        "communicator",
        "joining the job failed and left this trainer without its model; build a new trainer",
    )
}

impl Trainer {
    /// Builds the model and its executor on the configured device, and the
    /// compute pool, for `ds` as `cfg` says, with no callbacks, a fresh cancel
    /// token and no printing. [`crate::TrainerBuilder`] offers the rest.
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
        p.install(move || Self::assemble(ds, cfg, pool, gpu_offset, false))
    }

    /// `measure_on_host`: `policy = "auto"` measures on the host backend too
    /// (tests of its mechanics; `crate::placement`).
    fn assemble(
        ds: Dataset,
        cfg: TrainConfig,
        pool: Arc<ThreadPool>,
        gpu_offset: usize,
        measure_on_host: bool,
    ) -> Result<Self> {
        cfg.validate()?;
        let ds = Arc::new(ds);
        let train = ds.train_ids();
        if train.is_empty() {
            return Err(Error::InvalidDataset {
                what: format!("dataset `{}` has no training vertices", ds.name),
            });
        }
        let model = cfg.model_config(ds.features.dim(), ds.num_classes as usize)?;
        let placed = place(&PlacementInput {
            cfg: &cfg,
            ds: &ds,
            model: &model,
            train_ids: &train,
            gpu_offset,
            pool_threads: pool.current_num_threads(),
            measure_on_host,
        })?;
        let tracer = Tracer::disabled();
        Ok(Self {
            acc_track: tracer.declare_track("acc", TrackKind::Accelerator),
            tracer,
            exec: placed.exec,
            device_note: placed.note,
            checkpoint_path: None,
            on_nonfinite: if cfg.train.on_nonfinite == OnNonFiniteKind::SkipBatch {
                OnNonFinite::Skip
            } else {
                OnNonFinite::Stop
            },
            skipped: 0,
            dist: Dist::solo(),
            splits: Splits {
                val: ds.val_ids(),
                test: ds.test_ids(),
                train,
            },
            ds,
            cfg,
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
    /// Each rank trains its share of every batch on its device and the
    /// gradients are summed over the communicator on the host
    /// (`executor/step/data_parallel.rs`); `policy = "auto"` keeps its starting
    /// placement (`gpu-sample-gpu-gather`) instead of measuring, so that every
    /// rank runs the same one. With partitioned features every batch's input
    /// rows are gathered on the host through the exchange and uploaded; the
    /// device never loads the whole feature matrix.
    ///
    /// With `dist.reduce = "nccl"` (or `"auto"` finding NCCL and a GPU on
    /// every rank) the gradients are summed on the device instead
    /// (`docs/distributed.md`, "NCCL").
    ///
    /// Errors (on every rank alike): more than one rank with layer-based
    /// orchestration (not built yet), or a trainer that already trained with
    /// another communicator. `dist.reduce = "nccl"` on a rank without NCCL or a
    /// GPU is an error on that rank. A failure after the ranks agreed leaves
    /// the trainer unusable (build a new one).
    pub fn set_communicator(&mut self, comm: Arc<dyn Communicator>) -> Result<()> {
        self.join(comm, false)
    }

    /// [`Trainer::set_communicator`]; `host_copy_reduce` sums the gradients on
    /// the device through host copies (the step `dist.reduce = "nccl"` takes,
    /// checkable on the host backend).
    fn join(&mut self, comm: Arc<dyn Communicator>, host_copy_reduce: bool) -> Result<()> {
        if self.cfg.dist.reduce == DistReduce::Nccl {
            // Decided on each rank alone, before any collective: every rank
            // has the same configuration, and a rank that lacks NCCL fails the
            // job (its error printed, the others stopped) instead of hanging it.
            if let Some(why) = nccl_lacks(self.state_ref()?.device_kind()) {
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
        if self.dist.ranks() > 1 || self.steps() > 0 && distributed {
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
        let features = if distributed && self.cfg.dist.features == DistFeatures::Partitioned {
            let channel = comm.duplicate()?;
            let cache = self.cfg.dist.remote_cache_rows;
            let parts = match &self.cfg.dist.partition_file {
                Some(path) => Some(crate::dist::read_partition_file(
                    path,
                    ds.num_vertices(),
                    comm.size(),
                )?),
                None => None,
            };
            // Sparse input rows: this rank's own rows only (never another
            // rank's); dense ones travel as bfloat16 when the device stores
            // bfloat16 rows.
            let local = if self.state_ref()?.sparse_input() {
                let (rank, ranks, n) = (comm.rank(), comm.size(), ds.num_vertices());
                let own = crate::dist::share(n, rank, ranks);
                let p = parts.as_deref();
                let keep = |v| crate::dist::features::owned_by(p, &own, rank, v);
                let pool = Arc::clone(&self.pool);
                Some(Arc::new(
                    pool.install(|| sparse_rows_where(&ds.features, keep))?,
                ))
            } else {
                None
            };
            let bf16 = self.cfg.device.feature_dtype == gpu_ops::FeatureDtype::Bf16;
            let pool = Arc::clone(&self.pool);
            let pf = pool.install(|| {
                PartitionedFeatures::new(ds, channel, cache, parts, local.as_deref(), bf16)
            })?;
            Some((Arc::new(pf), local))
        } else {
            None
        };
        let (features, local_sparse) = match features {
            Some((f, l)) => (Some(f), l),
            None => (None, None),
        };
        if distributed {
            if self.cfg.orchestration.is_auto() {
                // Ranks measuring placements each on their own could choose
                // differently; every rank keeps the starting placement.
                self.device_note.push_str(&format!(
                    "; policy = \"auto\" keeps {} on every rank of a distributed job",
                    scheduler::Orchestration::GpuSampleGpuGather
                ));
            }
            let exec = std::mem::replace(&mut self.exec, Box::new(Spent));
            self.exec = exec.distribute(DistSetup {
                comm: Arc::clone(&comm),
                features: features.clone(),
                local_sparse,
                reduce: self.cfg.dist.reduce,
                host_copy_reduce,
            })?;
            self.exec.set_tracer(&self.tracer, self.acc_track);
        }
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
            shard_full_eval,
            shard_block: None,
        };
        Ok(())
    }

    /// The executor's weights and inference, unless a failed
    /// [`Trainer::set_communicator`] spent them.
    fn state_ref(&self) -> Result<&dyn crate::engine::ModelState> {
        if self.exec.is_spent() {
            return Err(spent());
        }
        Ok(self.exec.state_ref())
    }

    /// [`Trainer::state_ref`], mutable.
    fn state(&mut self) -> Result<&mut dyn crate::engine::ModelState> {
        if self.exec.is_spent() {
            return Err(spent());
        }
        Ok(self.exec.state())
    }

    /// This trainer's rank and the job's number of ranks (`(0, 1)` alone).
    pub fn rank(&self) -> (usize, usize) {
        (self.dist.comm.rank(), self.dist.comm.size())
    }

    /// What this rank's collectives moved and cost so far (all zero alone).
    pub fn dist_stats(&self) -> DistStats {
        self.exec.dist_stats().unwrap_or_default()
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

    /// The configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// The parameters at the current weights, in the model's order (a copy).
    pub fn params(&self) -> Result<Vec<Vec<f32>>> {
        self.state_ref()?.params_to_host()
    }

    /// The parameters' names, in the model's order (`layer0.weight`, …).
    pub fn param_names(&self) -> Vec<String> {
        self.state_ref()
            .map(|s| s.param_names())
            .unwrap_or_default()
    }

    /// The model's parameter count, over every tensor.
    pub fn num_params(&self) -> usize {
        self.state_ref().map_or(0, |s| s.num_params())
    }

    /// Optimizer steps taken so far (the weight version).
    pub fn steps(&self) -> u64 {
        self.state_ref().map_or(0, |s| s.version())
    }

    /// One line: the device training runs on and why it was chosen
    /// (`device.kind = "auto"` names the missing library when it fell back to the
    /// host).
    pub fn device_note(&self) -> &str {
        &self.device_note
    }

    /// One line: the strategy that trains (the placement, its settings; what
    /// `policy = "auto"` chose once it has).
    pub fn placement_note(&self) -> String {
        self.exec.describe()
    }

    /// Feature-cache statistics of the device.
    pub fn cache_stats(&self) -> gpu_ops::CacheStats {
        self.state_ref()
            .map(|s| s.cache_stats())
            .unwrap_or_default()
    }

    /// Bytes training batches moved host → device so far (blocks, ids, feature
    /// rows, labels, hot rows).
    pub fn h2d_bytes(&self) -> u64 {
        self.state_ref().map_or(0, |s| s.h2d_bytes())
    }

    /// The device backend's copies and synchronizations so far.
    pub fn transfer_stats(&self) -> gpu_ops::TransferStats {
        self.state_ref()
            .map(|s| s.transfer_stats())
            .unwrap_or_default()
    }

    /// How many batches trained on blocks sampled while the batch before them
    /// trained (`device.sample_ahead`).
    pub fn batches_sampled_ahead(&self) -> u64 {
        self.exec.batches_sampled_ahead()
    }

    /// What layer-based orchestration did in the last epoch (`None` without
    /// embedding reuse).
    pub fn orchestration_stats(&self) -> Option<&OrchestrationStats> {
        self.exec.orchestration()?.0
    }

    /// What layer-based orchestration did over every epoch so far.
    pub fn orchestration_totals(&self) -> Option<&OrchestrationStats> {
        Some(self.exec.orchestration()?.1)
    }

    /// The layer pipeline's relabeling (hot = relabeled id below
    /// `hot_count`; `old_id` maps back), when training reuses hot embeddings.
    pub fn relabeling(&self) -> Option<&scheduler::Relabeling> {
        self.exec.relabeling()
    }

    /// What `policy = "auto"` chose and why (`None` while it measures, or with a
    /// fixed policy).
    pub fn auto_choice(&self) -> Option<&scheduler::Choice> {
        self.exec.auto_choice()
    }

    /// Records training into `tracer` from now on: slices `sample`, `gather` (with
    /// `bytes`), `device step` per batch and `eval` (with `epoch`). A disabled
    /// tracer (the default) records nothing.
    pub fn set_tracer(&mut self, tracer: Tracer) {
        self.acc_track = tracer.declare_track("acc stream compute", TrackKind::Accelerator);
        self.exec.set_tracer(&tracer, self.acc_track);
        self.tracer = tracer;
    }

    /// The tracer training records into.
    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    /// Test seam: [`Trainer::new`] whose `policy = "auto"` measures on the host
    /// backend as it would on a GPU.
    #[cfg(test)]
    pub(crate) fn measuring_on_host(ds: Dataset, cfg: TrainConfig) -> Result<Self> {
        let pool = Arc::new(build_pool(cfg.compute_threads(), cfg.threads.pin)?);
        let p = Arc::clone(&pool);
        p.install(move || Self::assemble(ds, cfg, pool, 0, true))
    }

    /// Test seam: a fault in the layer pipeline's CPU workers from the next
    /// epoch on (`None` clears it).
    #[cfg(test)]
    pub(crate) fn inject_orchestration_fault(
        &mut self,
        fault: Option<crate::executor::layer::InjectedFault>,
    ) {
        self.exec.inject_fault(fault);
    }

    /// Test seam: [`Trainer::set_communicator`] summing the gradients on the
    /// device through host copies.
    #[cfg(test)]
    pub(crate) fn set_communicator_reducing_on_device(
        &mut self,
        comm: Arc<dyn Communicator>,
    ) -> Result<()> {
        self.join(comm, true)
    }

    /// Trains the next epoch (or the rest of an interrupted one), evaluates when
    /// `train.eval_every` says so (and at epoch `train.epochs - 1`), calls the
    /// callbacks, and returns the epoch's statistics. A cancelled token or a
    /// callback's stop inside the epoch returns [`Error::Cancelled`]; the trainer
    /// then remembers the position, and the next call continues from there.
    pub fn train_epoch(&mut self) -> Result<EpochStats> {
        let pool = Arc::clone(&self.pool);
        pool.install(|| self.train_epoch_here())
    }

    fn train_epoch_here(&mut self) -> Result<EpochStats> {
        self.stop_requested = false;
        self.embeddings = None;
        self.logits = None;
        let calibrating = self.exec.calibrating();
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
            orchestration: self.orchestration_stats().cloned(),
            calibrating,
            skipped_batches: std::mem::take(&mut self.skipped),
            auto_choice: match (calibrating, self.exec.auto_choice()) {
                (true, Some(c)) => Some(c.reason.clone()),
                _ => None,
            },
        };
        if self.verbose {
            if let Some(reason) = &stats.auto_choice {
                eprintln!("orchestration.policy = \"auto\": {reason}");
            }
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

    /// Epoch `epoch`'s seed and its shuffled training vertices, which the
    /// executor trains in `train.batch_size` batches (batch `k` seeded
    /// `derive_seed(base, k)`).
    fn epoch_order(&self, epoch: usize) -> (u64, Vec<u32>) {
        let base = derive_seed(self.cfg.train.seed, 1000 + epoch as u64);
        let mut order = self.splits.train.clone();
        Rng::new(base).shuffle(&mut order);
        (base, order)
    }

    /// Trains the remaining batches of the epoch in progress. Returns whether a
    /// callback asked to stop after the last batch; a cancel or a stop before it
    /// is [`Error::Cancelled`].
    fn train_batches(&mut self) -> Result<bool> {
        let t = Instant::now();
        let epoch = self.pos.epoch;
        let (base, order) = self.epoch_order(epoch);
        let batches: Vec<&[u32]> = order.chunks(self.cfg.train.batch_size).collect();
        let total = batches.len();
        let Self {
            ds,
            exec,
            pos,
            callbacks,
            cancel,
            tracer,
            acc_track,
            on_nonfinite,
            skipped,
            ..
        } = self;
        let run = EpochRun {
            ds,
            batches: &batches,
            start: pos.batch.min(total),
            end: total,
            mark: None,
            base_seed: base,
            epoch,
            tracer,
            acc_track: *acc_track,
            cancel,
        };
        let mut books = Books {
            pos,
            callbacks,
            on_nonfinite: *on_nonfinite,
            skipped,
            epoch,
            batches: &batches,
        };
        let end = exec.train(&run, &mut |d: &BatchDone| books.batch(d));
        books.pos.train_secs += t.elapsed().as_secs_f64();
        match end? {
            EpochEnd::Finished(stop) => Ok(stop),
            EpochEnd::Stopped(k, cause) => Err(Error::Cancelled {
                epoch,
                batch: k,
                cause,
            }),
        }
    }

    /// Trains until `train.epochs` epochs are complete (continuing an interrupted
    /// epoch or a loaded checkpoint), evaluating as configured, and returns the
    /// statistics of the epochs it trained. Callbacks see every batch and epoch; a
    /// callback's stop ends `fit` early with `Ok` (see `session::control`); a
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
    pub fn set_checkpoint_path(&mut self, path: Option<PathBuf>) {
        self.checkpoint_path = path;
    }

    /// Where [`Trainer::fit`] writes its checkpoints.
    pub fn checkpoint_path(&self) -> Option<&Path> {
        self.checkpoint_path.as_deref()
    }

    /// The trainer's state as a [`Checkpoint`].
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        let state = self.state_ref()?;
        let steps = state.version();
        let params = state.params_to_host()?;
        let [m, v] = if steps == 0 {
            [Vec::new(), Vec::new()]
        } else {
            state.moments_to_host()?
        };
        let moment = |all: &[Vec<f32>], i: usize| all.get(i).cloned().unwrap_or_default();
        let tensors = params
            .into_iter()
            .zip(state.param_names())
            .enumerate()
            .map(|(i, (values, name))| TensorState {
                name,
                values,
                m: moment(&m, i),
                v: moment(&v, i),
            })
            .collect();
        Ok(Checkpoint {
            config_toml: self.cfg.to_toml(),
            dataset: DatasetShape::of(&self.ds),
            position: self.pos,
            steps,
            tensors,
        })
    }

    /// Saves the configuration, position (epoch, batch), optimizer step count,
    /// parameters and Adam moments to `path`, atomically (format:
    /// [`Checkpoint`](crate::Checkpoint)).
    pub fn save_checkpoint(&self, path: &Path) -> Result<()> {
        self.checkpoint()?.write(path)
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
        let state = self.state_ref()?;
        let lens: Vec<usize> = state.params_to_host()?.iter().map(Vec::len).collect();
        let params: Vec<(String, usize)> = state.param_names().into_iter().zip(lens).collect();
        c.check_fits(origin, &self.cfg, &DatasetShape::of(&self.ds), &params)?;
        let values: Vec<&[f32]> = c.tensors.iter().map(|t| t.values.as_slice()).collect();
        let zeros: Vec<Vec<f32>> = params.iter().map(|(_, n)| vec![0.0; *n]).collect();
        let (m, v): (Vec<&[f32]>, Vec<&[f32]>) = if c.steps == 0 {
            let z: Vec<&[f32]> = zeros.iter().map(Vec::as_slice).collect();
            (z.clone(), z)
        } else {
            c.tensors
                .iter()
                .map(|t| (t.m.as_slice(), t.v.as_slice()))
                .unzip()
        };
        self.state()?.load_state(&values, &m, &v, c.steps)?;
        self.pos = c.position;
        self.stop_requested = false;
        self.embeddings = None;
        self.logits = None;
        Ok(())
    }

    /// Writes the model at the current weights to `path` as an ONNX graph,
    /// atomically ([`crate::onnx`]; `opts` picks logits or embeddings). The file
    /// serves sampled blocks and full-graph inference alike.
    pub fn export_onnx(&self, path: &Path, opts: &crate::onnx::ExportOptions) -> Result<()> {
        let state = self.state_ref()?;
        let params = state.params_to_host()?;
        let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
        crate::onnx::write(state.model_config(), &refs, opts, path)
    }
}
