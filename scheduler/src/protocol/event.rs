//! What goes into the protocol ([`Event`]) and what comes out ([`Action`]), and
//! the values they carry: chunk keys, claims, CPU jobs, a batch's training order.
//!
//! The driver owns every resource the values name (threads, channels, claim
//! flags, staging buffers, slabs, clocks); the protocol names them with plain
//! numbers. See the module doc of [`crate::protocol`] for the order in which
//! they come and go.

use std::ops::Range;

use crate::pipeline::HotSplit;

use super::plan::{LaunchPlan, LaunchedBatch};
use super::stats::{ProtocolStats, SuperBatchHot};

/// Names a chunk of a hot queue: the global super-batch (numbered across epochs,
/// never reused) and the chunk's index in that super-batch's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkKey {
    /// Global super-batch.
    pub super_batch: u64,
    /// Chunk within the super-batch's queue.
    pub chunk: u32,
}

/// One claim flag: every job of one computation of a chunk (its regular job and
/// the urgent duplicate that promotes it) shares it, and the first worker to
/// claim it computes while the others skip the job silently (protocol step 9).
/// A recomputation gets a fresh claim. The driver maps ids to flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimId(pub u64);

/// One worker report, numbered in the order [`Event::ChunkComputed`]s were
/// handed in; the [`Action::Install`] or [`Action::Discard`] answering it
/// carries the same number (they come out in the same order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReportId(pub u64);

/// Why a job is urgent (protocol step 6, `on_late = "wait"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Urgent {
    /// 1, 2, … per epoch, in the order urgent jobs are queued (the runtime
    /// derives the job's sampling seed from it).
    pub seq: u64,
    /// `true`: the chunk's rows are stale, recompute them with weights of version
    /// at least `b − bound` (published first when needed; a fresh claim).
    /// `false`: the chunk is not computed yet; this duplicate shares its regular
    /// job's claim, whichever starts first computes (a promotion).
    pub recompute: bool,
    /// The epoch batch whose gate sent it.
    pub batch: usize,
}

/// One CPU job: compute the rows of one chunk of a hot queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// The chunk.
    pub key: ChunkKey,
    /// The super-batch's index in its epoch (the runtime derives a regular job's
    /// sampling seed from it and the chunk).
    pub local: u64,
    /// The chunk's queue positions, which are its rows in the super-batch's slab.
    pub rows: Range<u32>,
    /// Its vertices (relabeled ids, hottest first), one per row.
    pub vertices: Vec<u32>,
    /// The claim it shares.
    pub claim: ClaimId,
    /// `None` for the regular job queued at launch.
    pub urgent: Option<Urgent>,
}

impl Job {
    /// Whether a worker about to start this job drops it unstarted instead: a
    /// regular job of a super-batch below the newest [`Action::Retire`]
    /// watermark, which nobody will read (protocol step 9). Urgent jobs are never
    /// dropped: a gate is waiting for them.
    pub fn droppable(&self, retired_below: u64) -> bool {
        self.urgent.is_none() && self.key.super_batch < retired_below
    }
}

/// What the gate let through for one batch (protocol steps 5–7): train it with
/// these hot rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrainBatch {
    /// Batch index in the epoch.
    pub batch: usize,
    /// The weight version it trains at (`b`).
    pub version: u64,
    /// Its global super-batch.
    pub super_batch: u64,
    /// Its super-batch's index in the epoch.
    pub local: u64,
    /// The slab its super-batch's rows are in.
    pub slab: usize,
    /// Positions among the bottom layer's destinations that take slab rows.
    pub positions: Vec<u32>,
    /// The slab row of each position.
    pub rows: Vec<u32>,
    /// Positions of CPU-hot destinations left cold in this batch (late chunks
    /// under `on_late = "compute"`): the accelerator samples, gathers and
    /// computes them itself.
    pub cold: Vec<u32>,
    /// The largest gap `b − e` among the rows used.
    pub max_gap: Option<u64>,
    /// Chunks (of its super-batch) this batch is the first to read.
    pub first_reads: Vec<u32>,
    /// Whether it trains on the bottom hop [`Action::SampleBottoms`] sampled at
    /// its launch (step 7: the hop skipped exactly the positions it trains
    /// with); `false`: the driver samples its bottom hop in the step.
    pub bottom_ahead: bool,
    /// The loss slot its step writes instead of reading its loss (a loss lag,
    /// step 7: the `i`-th batch since the last [`Action::QueueLossRead`]
    /// writes slot `i`); `None`: the step reads its loss.
    pub loss_slot: Option<usize>,
}

/// An input of the protocol.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// An epoch starts: train the epoch's batches `batches` (indices in the
    /// epoch; `start > 0` after an interruption) from weight `version` (step 1).
    /// An epoch still running is aborted first ([`Event::Abort`]).
    EpochStarted {
        /// Epoch batch indices to train.
        batches: Range<usize>,
        /// The weights' version now.
        version: u64,
        /// `L`, batches between a step and the read of its loss (at least 1;
        /// the device's `device.loss_lag`): above 1, steps write loss slots
        /// and the protocol's loss reads bring them back (step 7).
        loss_lag: usize,
        /// The measurement window: a mark before batch `window.start` and one
        /// before batch `window.end` (step 7).
        window: Option<Range<usize>>,
    },
    /// The answer to [`Action::Launch`]: the super-batch's batches were sampled.
    Launched {
        /// The global super-batch of the launch.
        super_batch: u64,
        /// The hot split to plan its queue with (the monitor's, or fixed).
        split: HotSplit,
        /// Its batches, in order.
        batches: Vec<LaunchedBatch>,
    },
    /// The answer to [`Action::Launch`] as [`Event::Launched`], with the
    /// batches already planned ([`LaunchPlan::new`], made by the driver off
    /// its accelerator thread, a super-batch ahead): the protocol cuts the plan
    /// at `split` and goes on exactly as it does for `Launched` with the
    /// batches the plan was made from.
    Planned {
        /// The global super-batch of the launch.
        super_batch: u64,
        /// The hot split to plan its queue with; its CPU part must be at most
        /// the plan's [`LaunchPlan::limit`].
        split: HotSplit,
        /// Its batches, planned.
        plan: LaunchPlan,
    },
    /// A worker computed a chunk's `rows` rows with weights of `version`.
    ChunkComputed {
        /// The chunk.
        key: ChunkKey,
        /// The version of the weights it read.
        version: u64,
        /// Rows computed.
        rows: u32,
    },
    /// A worker dropped a regular job unstarted ([`Job::droppable`]).
    JobDropped {
        /// The job's chunk.
        key: ChunkKey,
    },
    /// The answer to [`Action::Train`]: the batch's step is done; the weights are
    /// at `version` now (`b + 1`, or `b` when the step was skipped).
    BatchTrained {
        /// Epoch batch index.
        batch: usize,
        /// The weights' version after it.
        version: u64,
    },
    /// The answer to [`Action::ResolveLossRead`]: the read's losses are on
    /// the host; `nonfinite` is the first of its batches whose loss is not
    /// finite, if any (step 7).
    LossesRead {
        /// The first batch of the read with a non-finite loss.
        nonfinite: Option<usize>,
    },
    /// The copies of the publication of `version` ([`Action::Publish`])
    /// resolved: those weights are on the host (step 2). Hand it in before
    /// any report computed with them.
    PublicationResolved {
        /// The publication's version.
        version: u64,
    },
    /// Stop the epoch (a cancellation, a callback's request): its queued jobs
    /// become droppable, the deferred losses are read and shown, and the
    /// epoch finishes (step 10).
    Stop,
    /// End the epoch now (the driver failed): as [`Event::Stop`], but no loss
    /// is read (step 10).
    Abort,
}

impl Event {
    /// The event's name, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Self::EpochStarted { .. } => "EpochStarted",
            Self::Launched { .. } => "Launched",
            Self::Planned { .. } => "Planned",
            Self::ChunkComputed { .. } => "ChunkComputed",
            Self::JobDropped { .. } => "JobDropped",
            Self::BatchTrained { .. } => "BatchTrained",
            Self::LossesRead { .. } => "LossesRead",
            Self::PublicationResolved { .. } => "PublicationResolved",
            Self::Stop => "Stop",
            Self::Abort => "Abort",
        }
    }
}

/// An output of the protocol: what the driver does next, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Publish layer 0's weights (at `version`, the current one) to the CPU
    /// workers (step 2): their copies queued, not waited for, and
    /// [`Event::PublicationResolved`] handed in once they resolved. `reset`:
    /// at an epoch's start, whatever the version published before (a
    /// checkpoint may have moved the weights back), downloaded at once.
    Publish {
        /// The version published.
        version: u64,
        /// Replace the published weights even if they are newer.
        reset: bool,
    },
    /// Sample the top layers of the epoch's batches `batches` (they form global
    /// super-batch `super_batch`, the epoch's `local`-th) and answer with
    /// [`Event::Launched`] (or [`Event::Planned`]) before polling again
    /// (step 3).
    Launch {
        /// Global super-batch.
        super_batch: u64,
        /// Its index in the epoch.
        local: u64,
        /// Its batches (epoch indices).
        batches: Range<usize>,
    },
    /// Sample the bottom hop of each of `batches` (the super-batch just
    /// launched) a super-batch ahead, batch `i`'s skipping the positions
    /// `skip[i]` among its bottom destinations (step 3).
    SampleBottoms {
        /// Global super-batch.
        super_batch: u64,
        /// Its batches (epoch indices).
        batches: Range<usize>,
        /// Per batch, ascending: its planned hot positions, or none.
        skip: Vec<Vec<u32>>,
    },
    /// Reserve slab `slab` for `rows` rows of `super_batch`'s queue, ordered
    /// after every batch already issued (step 3).
    ReserveSlab {
        /// The slab (`super_batch % (D + 1)`).
        slab: usize,
        /// Rows needed (the queue's length).
        rows: usize,
        /// The super-batch it is for.
        super_batch: u64,
    },
    /// Queue a CPU job (urgent jobs go to the urgent queue) (steps 3 and 6).
    QueueJob(Job),
    /// Upload the rows of report `report` (chunk `key`, computed with `version`)
    /// into slab `slab` at rows `rows`, ordered before every later batch; then
    /// give the report's staging buffer back (step 4).
    Install {
        /// The report.
        report: ReportId,
        /// Its chunk.
        key: ChunkKey,
        /// The slab.
        slab: usize,
        /// Slab rows (the chunk's queue positions).
        rows: Range<u32>,
        /// The rows' version.
        version: u64,
    },
    /// Reuse across super-batches (step 4, keep): copy rows `rows` of slab
    /// `slab` (just installed, computed with `version`) into the hot-row store
    /// at `vertices` (relabeled hot ids, one per row), ordered after the
    /// install and before every later action's device work.
    Keep {
        /// The super-batch whose chunk was installed.
        super_batch: u64,
        /// Its slab.
        slab: usize,
        /// Slab rows.
        rows: Vec<u32>,
        /// Store rows (relabeled hot ids), one per slab row.
        vertices: Vec<u32>,
        /// The rows' version.
        version: u64,
    },
    /// Reuse across super-batches (step 3, carry): copy the hot-row store's
    /// rows `vertices` into slab `slab` at `rows`, ordered after the
    /// [`Action::ReserveSlab`] before it and before every later batch; those
    /// rows of `super_batch`'s queue are not computed again.
    Carry {
        /// The super-batch launched.
        super_batch: u64,
        /// Its slab.
        slab: usize,
        /// Slab rows.
        rows: Vec<u32>,
        /// Store rows (relabeled hot ids), one per slab row.
        vertices: Vec<u32>,
    },
    /// Give report `report`'s staging buffer back without installing it (its
    /// super-batch finished, or the slab holds rows as new) (step 4).
    Discard {
        /// The report.
        report: ReportId,
        /// Its chunk.
        key: ChunkKey,
    },
    /// Super-batch `super_batch` starts (the monitor's evictions that take effect
    /// now, step 8).
    BeginSuperBatch {
        /// Global super-batch.
        super_batch: u64,
        /// Its index in the epoch.
        local: u64,
    },
    /// Batch `batch`'s gate opens at weight `version` (step 5): the point to
    /// check for cancellation (answer [`Event::Stop`]) and to hand in every
    /// report waiting before polling again.
    Gate {
        /// Epoch batch index.
        batch: usize,
        /// The version it will train at.
        version: u64,
    },
    /// Block until the next worker report arrives, hand it in, poll again
    /// (step 6, `on_late = "wait"`).
    Wait {
        /// The batch whose gate waits.
        batch: usize,
        /// Its late chunks now.
        late_chunks: u32,
        /// Its hot positions in late chunks now.
        late_vertices: u64,
    },
    /// Train the batch with these hot rows and answer with
    /// [`Event::BatchTrained`] before polling again (step 7).
    Train(TrainBatch),
    /// Queue a read of the loss slots of `batches` (batch `batches.start + i`
    /// wrote slot `i`) after every step so far, without waiting (step 7).
    QueueLossRead {
        /// The batches read.
        batches: Range<usize>,
    },
    /// Wait for the read of `batches` queued before and answer with
    /// [`Event::LossesRead`] before polling again (step 7).
    ResolveLossRead {
        /// The batches read.
        batches: Range<usize>,
    },
    /// Show the losses of `batches` (trained, read), in order, after moving
    /// the weights' version back by `rewind` steps the device skipped (a
    /// non-finite loss, the last of `batches`; 0 otherwise) (step 7).
    ShowLosses {
        /// The batches shown.
        batches: Range<usize>,
        /// Steps to take back.
        rewind: u64,
    },
    /// Take the measurement window's mark before batch `batch`: its start
    /// (`start`) or its end (step 7).
    Mark {
        /// The batch it is before.
        batch: usize,
        /// The window's start, else its end.
        start: bool,
    },
    /// Regular jobs of global super-batches below `below` are droppable
    /// ([`Job::droppable`]): every batch reading them has trained, or the epoch
    /// ended (steps 7 and 9).
    Retire {
        /// The watermark (only grows).
        below: u64,
    },
    /// Super-batch `super_batch` is done and its weights published (step 8); the
    /// monitor observes its window when `observe` (not the epoch's first or last
    /// super-batch: the pipeline fills or drains there).
    EndSuperBatch {
        /// Global super-batch.
        super_batch: u64,
        /// Its index in the epoch.
        local: u64,
        /// Hand the monitor this window.
        observe: bool,
        /// What its hot queue did: rows computed, carried, used.
        hot: SuperBatchHot,
    },
    /// The epoch is over (step 10), with its counts.
    Finished {
        /// What the protocol counted this epoch.
        stats: ProtocolStats,
        /// Whether [`Event::Stop`] ended it.
        stopped: bool,
    },
}

impl Action {
    /// The action's name, for traces and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Publish { .. } => "Publish",
            Self::Launch { .. } => "Launch",
            Self::SampleBottoms { .. } => "SampleBottoms",
            Self::ReserveSlab { .. } => "ReserveSlab",
            Self::QueueJob(_) => "QueueJob",
            Self::Install { .. } => "Install",
            Self::Discard { .. } => "Discard",
            Self::Keep { .. } => "Keep",
            Self::Carry { .. } => "Carry",
            Self::BeginSuperBatch { .. } => "BeginSuperBatch",
            Self::Gate { .. } => "Gate",
            Self::Wait { .. } => "Wait",
            Self::Train(_) => "Train",
            Self::QueueLossRead { .. } => "QueueLossRead",
            Self::ResolveLossRead { .. } => "ResolveLossRead",
            Self::ShowLosses { .. } => "ShowLosses",
            Self::Mark { .. } => "Mark",
            Self::Retire { .. } => "Retire",
            Self::EndSuperBatch { .. } => "EndSuperBatch",
            Self::Finished { .. } => "Finished",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_jobs_of_retired_super_batches_are_droppable() {
        let mut job = Job {
            key: ChunkKey {
                super_batch: 3,
                chunk: 0,
            },
            local: 1,
            rows: 0..2,
            vertices: vec![0, 1],
            claim: ClaimId(7),
            urgent: None,
        };
        assert!(!job.droppable(3));
        assert!(job.droppable(4));
        job.urgent = Some(Urgent {
            seq: 1,
            recompute: false,
            batch: 5,
        });
        assert!(!job.droppable(4));
    }

    #[test]
    fn names() {
        assert_eq!(Event::Stop.name(), "Stop");
        assert_eq!(Action::Retire { below: 1 }.name(), "Retire");
    }
}
