//! Executors: how a session's batches are trained, one implementation per
//! strategy behind one trait (as tokio keeps its scheduler flavours behind one
//! handle). The session (`crate::session`) sees only `Box<dyn Executor>`; the
//! placement module (`crate::placement`) builds it from `orchestration.policy`.
//!
//! - [`step::StepExecutor`]: a step-based placement — sample → gather → train,
//!   batch after batch, with sampling the next batch as a stage of the batch
//!   stream (`device.sample_ahead`);
//! - [`layer::LayerExecutor`]: the layer-based super-batch pipeline (CPU
//!   workers compute hot vertices' bottom-layer rows a super-batch ahead);
//! - [`step::data_parallel::DataParallel`]: wraps a step executor as one rank
//!   of a data-parallel job (one gradient all-reduce per step);
//! - `placement::auto::AutoExecutor`: wraps both while `policy = "auto"`
//!   measures them, then keeps the one it chose.
//!
//! An executor alone owns the weights: its device engine holds the model, its
//! gradients and Adam's state. The session reads and replaces them, and runs
//! inference, through [`Executor::state`].
//!
//! # One call of [`Executor::train`]
//! 1. For each batch `k` of `run.start..run.end` (the session's order; batch `k`
//!    samples with `derive_seed(run.base_seed, k)`): a cancelled token stops
//!    before the batch ([`EpochEnd::Stopped`] with [`StopCause::Token`]).
//! 2. The batch trains (where and how is the strategy's business).
//! 3. `on_batch` sees it ([`BatchDone`]); an error (a non-finite loss the
//!    session refuses) ends the call; `true` (a callback's stop) ends it after
//!    this batch: [`EpochEnd::Stopped`] at `k + 1` inside the epoch,
//!    [`EpochEnd::Finished`]`(true)` after its last batch.

pub(crate) mod layer;
pub(crate) mod step;

use std::sync::Arc;

use crate::cancel::CancelToken;
use crate::clock::Clock;
use crate::data::dataset::Dataset;
pub(crate) use crate::engine::BatchDone;
use crate::engine::ModelState;
use crate::error::{Result, StopCause};
use crate::task::{HostTarget, Task, TaskBatch};
use crate::trace::{Tracer, TrackId};

pub use layer::OrchestrationStats;

/// The inputs of one [`Executor::train`] call: a range of an epoch's batches.
#[derive(Clone, Copy)]
pub(crate) struct EpochRun<'a> {
    /// The dataset (user ids).
    pub ds: &'a Arc<Dataset>,
    /// The epoch's batches, in the session's order: each batch's items
    /// (training vertices; training-edge indices for link prediction), which
    /// `task` turns into what the batch trains ([`EpochRun::task_batch`]).
    pub batches: &'a [&'a [u32]],
    /// The run's task (`crate::task`).
    pub task: &'a Task,
    /// First batch to train.
    pub start: usize,
    /// One past the last batch to train (`batches.len()` for the rest of the
    /// epoch; less while `policy = "auto"` measures).
    pub end: usize,
    /// The layer pipeline records the clock and its statistics at the start
    /// of batches `mark.0..mark.1` and after the last of them (`policy =
    /// "auto"`'s measurement window; a window starting a super-batch starts
    /// before its launch-ahead, so it holds one launch per super-batch it
    /// times when the run goes on two super-batches past it: a launch samples
    /// the super-batch after the one it launches).
    pub mark: Option<(usize, usize)>,
    /// Batch `k` samples with `derive_seed(base_seed, k)`.
    pub base_seed: u64,
    /// The epoch index.
    pub epoch: usize,
    /// Where slices go.
    pub tracer: &'a Tracer,
    /// The accelerator's track in `tracer`.
    pub acc_track: TrackId,
    /// Checked before every batch.
    pub cancel: &'a CancelToken,
    /// Every batch's time is read from it.
    pub clock: &'a dyn Clock,
}

impl<'a> EpochRun<'a> {
    /// Batch `k`'s seed: it samples, draws negatives and drops out with it.
    pub fn seed(&self, k: usize) -> u64 {
        cpu_ops::derive_seed(self.base_seed, k as u64)
    }

    /// Batch `k` as its task trains it: seeds, target, excluded edges.
    pub fn task_batch(&self, k: usize) -> TaskBatch<'a> {
        self.task.batch(self.batches[k], self.seed(k))
    }

    /// The same run over batches `start..end` (clamped to the epoch).
    pub fn range(&self, start: usize, end: usize, mark: Option<(usize, usize)>) -> Self {
        let len = self.batches.len();
        Self {
            start: start.min(len),
            end: end.min(len),
            mark,
            ..*self
        }
    }
}

/// The target of every node-classification batch (tests).
#[cfg(test)]
static LABELS: HostTarget = HostTarget::Labels;

/// One training batch as the executors name it: its seeds, its sampling
/// seed, where it stands (its slices carry the epoch and batch index), what it
/// is trained against and the edges its blocks leave out ([`TaskBatch`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchRef<'a> {
    /// The batch's seeds.
    pub seeds: &'a [u32],
    /// Its sampling seed.
    pub seed: u64,
    /// The epoch.
    pub epoch: usize,
    /// The batch index in the epoch.
    pub k: usize,
    /// What its seeds' outputs are trained against.
    pub target: &'a HostTarget,
    /// (destination, source) pairs left out of its sampled blocks, sorted.
    pub exclude: &'a [(u32, u32)],
}

impl<'a> BatchRef<'a> {
    /// `tb` as batch `k` of `epoch`, drawn with `seed`.
    pub fn of(tb: &'a TaskBatch<'_>, seed: u64, epoch: usize, k: usize) -> Self {
        BatchRef {
            seeds: &tb.seeds,
            seed,
            epoch,
            k,
            target: &tb.target,
            exclude: &tb.exclude,
        }
    }

    /// A node-classification batch of `seeds` drawn with `seed` (tests).
    #[cfg(test)]
    pub fn for_seeds(seeds: &'a [u32], seed: u64) -> Self {
        BatchRef {
            seeds,
            seed,
            epoch: 0,
            k: 0,
            target: &LABELS,
            exclude: &[],
        }
    }

    /// Rows the batch's loss is taken over.
    pub fn rows(&self) -> usize {
        match self.target {
            HostTarget::Labels => self.seeds.len(),
            HostTarget::Pairs(p) => p.len(),
        }
    }

    /// `slice` with this batch's epoch and index.
    pub fn tag<'t>(&self, slice: crate::trace::SliceGuard<'t>) -> crate::trace::SliceGuard<'t> {
        slice.epoch(self.epoch as u64).batch(self.k as u64)
    }
}

/// How a [`Executor::train`] call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EpochEnd {
    /// Every batch of the range trained; `true` if the last batch's callback
    /// asked to stop.
    Finished(bool),
    /// Stopped before batch `k` (`cause`).
    Stopped(usize, StopCause),
}

/// The session's per-batch hook (module doc, step 3).
pub(crate) type OnBatch<'a> = dyn FnMut(&BatchDone) -> Result<bool> + 'a;

/// What an executor needs to become one rank of a job
/// ([`Executor::distribute`]).
pub(crate) struct DistSetup {
    /// The job's ranks.
    pub comm: Arc<dyn crate::dist::Communicator>,
    /// This rank's share of the feature rows (`dist.features =
    /// "partitioned"` with more than one rank): input rows then come from the
    /// exchange.
    pub features: Option<Arc<crate::dist::features::PartitionedFeatures>>,
    /// With sparse input rows: this rank's own rows as sparse rows (the
    /// others empty), which the exchange sends.
    pub local_sparse: Option<Arc<cpu_ops::SparseRows<f32>>>,
    /// `dist.reduce`.
    pub reduce: crate::dist::DistReduce,
    /// Sum the gradients on the device through host copies (the step
    /// `dist.reduce = "nccl"` takes, checkable on the host backend).
    pub host_copy_reduce: bool,
}

/// What every executor does (module doc).
pub(crate) trait Executor: Send {
    /// Trains batches `run.start..run.end` (module doc).
    fn train(&mut self, run: &EpochRun<'_>, on_batch: &mut OnBatch<'_>) -> Result<EpochEnd>;
    /// The weights and what is computed from them.
    fn state(&mut self) -> &mut dyn ModelState;
    /// [`Executor::state`], read-only.
    fn state_ref(&self) -> &dyn ModelState;
    /// Records training into `tracer` from now on (device work on `acc`).
    fn set_tracer(&mut self, tracer: &Tracer, acc: TrackId);
    /// One line: the strategy and its settings (the device note's tail).
    fn describe(&self) -> String;
    /// The layer pipeline's statistics: (last epoch, every epoch so far);
    /// `None` for executors that reuse no embedding.
    fn orchestration(&self) -> Option<(Option<&OrchestrationStats>, &OrchestrationStats)> {
        None
    }
    /// The layer pipeline's hot set as relabeled ids (hot = below
    /// `hot_count`), when this executor runs one.
    fn relabeling(&self) -> Option<&scheduler::Relabeling> {
        None
    }
    /// Batches trained on blocks sampled while the batch before them trained.
    fn batches_sampled_ahead(&self) -> u64 {
        0
    }
    /// What `policy = "auto"` chose, once it has (`None` while it measures and
    /// for fixed policies).
    fn auto_choice(&self) -> Option<&scheduler::Choice> {
        None
    }
    /// Whether `policy = "auto"` is still measuring.
    fn calibrating(&self) -> bool {
        false
    }
    /// Whether this executor is the placeholder a failed
    /// `Trainer::set_communicator` leaves (it has no weights).
    fn is_spent(&self) -> bool {
        false
    }
    /// The gradient all-reduces' counters of a data-parallel job.
    fn dist_stats(&self) -> Option<crate::dist::DistStats> {
        None
    }
    /// This executor as rank `setup.comm.rank()` of a data-parallel job
    /// (collective; `executor/step/data_parallel.rs`). Strategies that cannot run
    /// across ranks say so.
    fn distribute(self: Box<Self>, setup: DistSetup) -> Result<Box<dyn Executor>>;
    /// Test seam: a fault for the layer pipeline's CPU workers (`None` clears
    /// it); no effect elsewhere.
    #[cfg(test)]
    fn inject_fault(&mut self, _fault: Option<layer::InjectedFault>) {}
}
