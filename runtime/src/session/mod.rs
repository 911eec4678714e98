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
//!    the epoch's position and shows its [`crate::BatchMetrics`] to the callbacks
//!    (a non-finite loss stops with [`Error::NonFinite`], or is skipped with
//!    `train.on_nonfinite = "skip-batch"`).
//! 3. Every `train.eval_every` epochs (and after the last), evaluate validation
//!    and test accuracy without dropout (`session/evaluate.rs`):
//!    `train.eval_mode = "sampled"` (default) evaluates mini-batches of the
//!    validation/test vertices sampled with `train.eval_fanouts` (the training
//!    fanouts unless set), a working set bounded by the batch; `"full"` applies
//!    each layer to the whole graph before the next — layer-wise full-neighbor
//!    inference, DGL's `inference` pattern, activations of every vertex.
//!
//! Everything random derives from `train.seed` (initialization, shuffles,
//! sampling, dropout), so a run is reproducible. Batch `k` of epoch `e` depends
//! only on `(seed, e, k)` and the weights, which is why a run interrupted
//! between batches (cancel token, callback, checkpoint) and continued gives
//! bit-identical parameters and losses.
//!
//! # Ownership
//! A trainer holds its dataset by reference count (an `Arc<Dataset>` other
//! trainers may share: nothing below copies its arrays), owns its executor
//! (which alone holds the weights and Adam's state), its callbacks (until
//! removed) and cancel token, and runs on its compute pool (its own rayon pool,
//! or one passed to the builder and shared); there is no global state, so
//! several trainers can run in one process on different threads. It prints nothing
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
mod epoch;
mod evaluate;
mod infer;
mod join;
mod link;
mod state;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::Arc;

use rayon::ThreadPool;

use crate::checkpoint::Position;
use crate::clock::SharedClock;
use crate::config::{OnNonFiniteKind, PinPolicy, TrainConfig};
use crate::data::dataset::{open_dataset, Dataset, SplitSpec, Verify};
use crate::data::generate::{generate_sbm, SbmOptions};
use crate::dist::DistStats;
use crate::embedding::Embeddings;
use crate::error::{Error, Result};
use crate::executor::{DistSetup, EpochEnd, EpochRun, Executor, OrchestrationStats};
use crate::placement::{place, PlacementInput, SetupSinks};
use crate::pool::build_pool;
use crate::task::Task;
use crate::trace::{Tracer, TrackId, TrackKind};

pub use infer::{InferOutput, InferReport};

use control::{Callback, CallbackId, CancelToken};
use epoch::OnNonFinite;
use join::Dist;

/// Loads the configured dataset, or generates the built-in synthetic one
/// (for `model.task = "link"` with a 0.85 / 0.05 / 0.1 train / validation /
/// test split of its edges).
pub fn load_dataset(cfg: &TrainConfig) -> Result<Dataset> {
    match &cfg.data.path {
        Some(p) => open_dataset(p, Verify::Default).map_err(|e| match &cfg.data.path_origin {
            Some(origin) => Error::DataPath {
                origin: origin.clone(),
                source: Box::new(e),
            },
            None => e,
        }),
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
                edge_split: (cfg.model.task == crate::config::TaskKind::Link)
                    .then(|| crate::data::EdgeSplitSpec::new([0.85, 0.05, 0.1]))
                    .transpose()?,
                ..SbmOptions::default()
            })
        }
    }
}

/// The run's training items (vertices, or training-edge indices for link
/// prediction) and the dataset's validation and test vertices.
struct Splits {
    train: Vec<u32>,
    val: Vec<u32>,
    test: Vec<u32>,
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
    /// Called in order; each with the id `add_callback` returned.
    callbacks: Vec<(CallbackId, Box<dyn Callback>)>,
    /// The id the next `add_callback` returns.
    next_callback: u64,
    cancel: CancelToken,
    verbose: bool,
    /// A callback asked to stop at the end of the last epoch.
    stop_requested: bool,
    /// Embeddings of the current weights, computed on first request.
    embeddings: Option<Embeddings>,
    /// Full-graph logits of the current weights, computed on the first
    /// `predict`.
    logits: Option<Embeddings>,
    /// What a batch trains against (`crate::task`).
    task: Task,
    /// Link prediction's evaluation sets and metrics (`session/link.rs`).
    link: Option<link::LinkEval>,
    /// Where training and evaluation record their slices (disabled by default).
    tracer: Tracer,
    /// The accelerator's track in `tracer`.
    acc_track: TrackId,
    /// The track of the `eval` slices in `tracer` (`evaluation`: the thread
    /// that trains also evaluates, and its own track would call it a worker).
    eval_track: TrackId,
    /// What `[device]` chose, and why.
    device_note: String,
    /// Where `fit` writes checkpoints.
    checkpoint_path: Option<PathBuf>,
    /// `train.on_nonfinite`.
    on_nonfinite: OnNonFinite,
    /// Batches of the epoch in progress skipped for a non-finite loss.
    skipped: usize,
    /// The ranks of a distributed job ([`crate::dist::Solo`] unless set).
    dist: Dist,
    /// Every batch, epoch and measurement time is read from it (`crate::clock`).
    clock: SharedClock,
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
    ///
    /// `ds` is a [`Dataset`] or an `Arc<Dataset>` shared with other trainers:
    /// the trainer keeps the `Arc` and copies none of its arrays.
    pub fn new(ds: impl Into<Arc<Dataset>>, cfg: TrainConfig) -> Result<Self> {
        cfg.validate()?;
        let pool = build_pool(cfg.compute_threads(), cfg.threads.pin == PinPolicy::Cores)?;
        Self::with_pool(ds.into(), cfg, Arc::new(pool), 0, SetupSinks::default())
    }

    /// [`Trainer::new`] on an existing compute pool (which also runs the setup);
    /// a GPU engine uses GPU `device.ordinal + gpu_offset` (a rank's local rank).
    pub(crate) fn with_pool(
        ds: Arc<Dataset>,
        cfg: TrainConfig,
        pool: Arc<ThreadPool>,
        gpu_offset: usize,
        sinks: SetupSinks,
    ) -> Result<Self> {
        let p = Arc::clone(&pool);
        let clock = crate::clock::wall_clock();
        p.install(move || Self::assemble(ds, cfg, pool, gpu_offset, (clock, false), &sinks))
    }

    /// `(clock, measure_on_host)`: the clock every time is read from, and
    /// whether `policy = "auto"` measures on the host backend too (tests of its
    /// mechanics; `crate::placement`).
    fn assemble(
        ds: Arc<Dataset>,
        cfg: TrainConfig,
        pool: Arc<ThreadPool>,
        gpu_offset: usize,
        (clock, measure_on_host): (SharedClock, bool),
        sinks: &SetupSinks,
    ) -> Result<Self> {
        cfg.validate()?;
        let task = crate::placement::task::task(&cfg, &ds)?;
        let train: Vec<u32> = match &task {
            Task::Node => ds.train_ids(),
            Task::Link(l) => (0..l.src.len() as u32).collect(),
        };
        if train.is_empty() {
            return Err(Error::dataset(
                "train_mask",
                &[],
                crate::DatasetProblem::Split {
                    what: format!("dataset `{}` has no training vertices", ds.name),
                },
            ));
        }
        let model = cfg.model_config(ds.features.dim(), ds.num_classes as usize)?;
        let link = if task.is_link() {
            Some(link::LinkEval::new(
                &ds,
                cfg.link.eval_negatives as usize,
                cfg.train.seed,
                cfg.link.metric_list(),
            )?)
        } else {
            None
        };
        let placed = place(&PlacementInput {
            cfg: &cfg,
            ds: &ds,
            model: &model,
            // The layer path scores hotness from the training seeds: for link
            // prediction, the training edges' endpoints.
            train_ids: &match &task {
                Task::Node => train.clone(),
                Task::Link(l) => {
                    let mut e: Vec<u32> = l.src.iter().chain(l.dst.iter()).copied().collect();
                    e.sort_unstable();
                    e.dedup();
                    e
                }
            },
            gpu_offset,
            pool_threads: pool.current_num_threads(),
            clock: Arc::clone(&clock),
            measure_on_host,
            sinks,
        })?;
        let tracer = Tracer::disabled();
        Ok(Self {
            acc_track: tracer.declare_track("acc", TrackKind::Accelerator),
            eval_track: tracer.declare_track("evaluation", TrackKind::Cpu),
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
            clock,
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
            next_callback: 0,
            cancel: CancelToken::new(),
            verbose: false,
            stop_requested: false,
            embeddings: None,
            logits: None,
            task,
            link,
        })
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

    /// Adds a callback (called after those already added); the id removes it
    /// again ([`Trainer::remove_callback`]).
    pub fn add_callback(&mut self, callback: Box<dyn Callback>) -> CallbackId {
        let id = CallbackId(self.next_callback);
        self.next_callback += 1;
        self.callbacks.push((id, callback));
        id
    }

    /// Removes the callback `id` names and hands it back (drop it to release
    /// what it owns, e.g. a channel's sender, so that the receiving side sees
    /// the channel close while the trainer lives on: `session::control`'s "A
    /// callback's life"); `None` when it was already removed.
    pub fn remove_callback(&mut self, id: CallbackId) -> Option<Box<dyn Callback>> {
        let i = self.callbacks.iter().position(|(c, _)| *c == id)?;
        Some(self.callbacks.remove(i).1)
    }

    /// Removes and drops every callback, those passed to the builder included.
    pub fn clear_callbacks(&mut self) {
        self.callbacks.clear();
    }

    /// Callbacks the trainer holds.
    pub fn num_callbacks(&self) -> usize {
        self.callbacks.len()
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

    /// The dataset as the shared handle the trainer holds: pass a clone to
    /// [`crate::TrainerBuilder::dataset`] to train another job on the same
    /// arrays without copying them.
    pub fn shared_dataset(&self) -> &Arc<Dataset> {
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
        // On the host backend the "accelerator" is this CPU: its tracks say so.
        if self.on_host() {
            tracer.name_accelerator(crate::trace::HOST_BACKEND);
        }
        self.acc_track = tracer.declare_track("acc stream compute", TrackKind::Accelerator);
        self.eval_track = tracer.declare_track("evaluation", TrackKind::Cpu);
        self.exec.set_tracer(&tracer, self.acc_track);
        self.tracer = tracer;
    }

    /// Whether the device engine is the host backend: the CPU does the
    /// accelerator's part too (sampling, gathering and training), so timings
    /// say nothing about a GPU's.
    pub fn on_host(&self) -> bool {
        !self.exec.is_spent() && self.exec.state_ref().device_kind() == gpu_ops::DeviceKind::Host
    }

    /// The tracer training records into.
    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    /// Test seam: [`Trainer::new`] whose `policy = "auto"` measures on the host
    /// backend as it would on a GPU.
    #[cfg(test)]
    pub(crate) fn measuring_on_host(ds: Dataset, cfg: TrainConfig) -> Result<Self> {
        Self::measuring_on_host_with_clock(ds, cfg, crate::clock::wall_clock())
    }

    /// Test seam: [`Trainer::measuring_on_host`] timing on `clock` (a
    /// scripted clock makes what `"auto"` measures exact).
    #[cfg(test)]
    pub(crate) fn measuring_on_host_with_clock(
        ds: Dataset,
        cfg: TrainConfig,
        clock: SharedClock,
    ) -> Result<Self> {
        let pool = Arc::new(build_pool(
            cfg.compute_threads(),
            cfg.threads.pin == PinPolicy::Cores,
        )?);
        let p = Arc::clone(&pool);
        p.install(move || {
            Self::assemble(
                Arc::new(ds),
                cfg,
                pool,
                0,
                (clock, true),
                &SetupSinks::default(),
            )
        })
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
        comm: Arc<dyn crate::dist::Communicator>,
    ) -> Result<()> {
        self.join(comm, true)
    }
}
