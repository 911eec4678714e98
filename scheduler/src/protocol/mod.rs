//! The super-batch pipeline's decisions as a pure state machine: it consumes
//! [`Event`]s and emits [`Action`]s, in the style of quinn-proto ("sans-IO"). It
//! starts no thread, reads no clock and does no I/O; the runtime's accelerator
//! thread drives it with engine calls, worker channels and a wall clock, and the
//! simulator ([`crate::simulate`]) drives it with simulated resources and a cost
//! model. These numbered steps are the one description of the protocol.
//!
//! # Protocol (one epoch)
//! 1. **Start** ([`Event::EpochStarted`] with the epoch's batches `start..end`,
//!    the weights' version, the device's loss lag `L` and the measurement
//!    window, if any): the batches are cut into super-batches of `N`
//!    consecutive batches from `start` (the last may be shorter), numbered in the
//!    epoch (`local` `j`) and globally across epochs (`g`, never reused).
//! 2. **Publish** layer 0's weights with their version ([`Action::Publish`]): at
//!    the epoch's start (a reset: a checkpoint may have moved them back), after
//!    every super-batch, and — when `staleness_bound` is below the pipeline's
//!    on-time gap ([`crate::Publication::for_bound`]) — after every batch; never
//!    twice at one version. A chunk of queue `j` starts during super-batch
//!    `j − D` with weights of version ≥ `(j − D) · N` and is read at most at
//!    `(j + 1) · N − 1`, so an on-time CPU's rows are at most
//!    [`crate::PipelineConfig::on_time_gap`] `= (D + 1) · N − 1` steps old; under
//!    a tighter bound, publishing every step makes the rows of chunks started
//!    later fresher (fewer are late).
//!    A publication's copies are queued, not waited for; the driver hands in
//!    [`Event::PublicationResolved`] once they resolved (the reset's are
//!    downloaded at once: resolved when published). A job reads the newest
//!    publication, waiting for its copies (step 9), so no row is computed
//!    with weights whose copies had not resolved: a report of such rows is
//!    refused (an error), as one from the future is.
//! 3. **Launch** super-batch `j` (`0..=D` at the epoch's start, `j + D` when `j >
//!    0` starts): [`Action::Launch`]; the driver samples its batches' top layers
//!    and answers [`Event::Launched`] with each batch's bottom destinations and
//!    the split to plan with (the monitor's) — or [`Event::Planned`] with the
//!    same batches already planned for every split up to a limit
//!    ([`LaunchPlan`], a pure function the driver may run on another thread,
//!    ahead of time); the protocol cuts the plan at the split, so both answers
//!    give the same actions. The queue is the CPU-hot bottom
//!    destinations of its batches other than their own seeds, deduplicated,
//!    hottest first ([`crate::SuperBatchPlan`]), cut into chunks
//!    ([`crate::PipelineConfig::chunk_ranges`]). With the bottom hops sampled
//!    ahead ([`ProtocolConfig::bottoms`]) the batches' bottom hops are sampled
//!    first ([`Action::SampleBottoms`]), each skipping its batch's *planned*
//!    positions — the positions that take a slab row if nothing is late
//!    ([`BottomHops::SkipPlanned`]) — or nothing ([`BottomHops::SkipNothing`]).
//!    Then the protocol reserves slab
//!    `g % (D + 1)` for the queue ([`Action::ReserveSlab`]) and queues one regular job per
//!    chunk, each with a fresh claim ([`Action::QueueJob`]). **Carry** (reuse
//!    across super-batches, [`ProtocolConfig::reuses_across_super_batches`]):
//!    a queued vertex whose row the hot-row store holds at version `e` with
//!    `e + staleness_bound ≥ v_first + i` — `v_first` the most the super-batch's
//!    first batch can train at, `i` the last of its batches reading the vertex,
//!    so the row is within the bound at every read — is not computed: its row
//!    goes to the slab from the store ([`Action::Carry`], right after the
//!    reservation), in chunks ready at their version with no job; the rows to
//!    compute come first in the slab. The store is empty at every epoch's start
//!    (step 1: the weights may have been moved back), so an epoch's first
//!    launch carries nothing. A batch's own seeds
//!    never read a hot row: their bottom rows are computed on the accelerator,
//!    so the training vertices' own paths always train layer 0 (with constant
//!    historical rows, a training set inside the hot set otherwise starves
//!    layer 0 of gradient: WordNet lost 11 points, 2 with this).
//! 4. **Install** ([`Event::ChunkComputed`], whenever a report is handed in): a
//!    chunk of a live super-batch computed with newer weights than its slab rows
//!    (or into an empty slot) is installed ([`Action::Install`]: one upload,
//!    ordered before every later batch) and becomes *ready* at that version, its
//!    urgent flag cleared; with reuse across super-batches, its rows newer than
//!    the store's go into the store, indexed by hot vertex, with their version
//!    ([`Action::Keep`], right after the install) — unless no launch still to
//!    come could carry them (`version + bound` below the next launch's first
//!    batch: at the default bound, nearly every install); any other report is
//!    discarded ([`Action::Discard`]).
//!    Either way the report's staging buffer goes back. Rows computed with
//!    weights newer than the current ones are refused (an error): versions never
//!    run ahead.
//! 5. **Gate**, per batch at the current version `b` ([`Action::Gate`]): a chunk
//!    the batch reads is usable iff it is ready at `e` with `b − e ≤
//!    staleness_bound` ([`crate::StalenessRule::decide`]); the others are *late*.
//! 6. **Late** chunks, by `on_late`:
//!    - `"compute"`: their positions stay cold in this batch
//!      ([`TrainBatch::cold`]: the accelerator samples, gathers and computes them
//!      itself, gap 0). Nothing waits.
//!    - `"wait"`: every late chunk without urgent work gets an urgent job — for a
//!      chunk not computed yet a duplicate sharing its claim (a promotion:
//!      whichever starts first computes), for a stale one a recomputation with a
//!      fresh claim, after publishing the current weights when the published ones
//!      are older than `b − bound` — and the gate blocks ([`Action::Wait`]) until
//!      the next report, then goes back to step 5. A chunk report handed in
//!      after the gate decided to wait but before the driver polled the `Wait`
//!      withdraws it (the gate decides again at the next poll): a driver whose
//!      reports arrive concurrently never blocks for a report it already handed
//!      in.
//! 7. **Train** ([`Action::Train`]) with the usable chunks' positions and slab
//!    rows; every row's gap `b − e` is recorded, and a row past the bound or from
//!    the future is an error, never a use. The batch trains on the bottom hop
//!    sampled at its launch ([`TrainBatch::bottom_ahead`]) iff that hop
//!    skipped exactly the positions it trains with: its planned ones (always,
//!    under `"wait"`; under `"compute"` not when a late chunk left positions
//!    cold), or none when the hops skip nothing; otherwise its bottom hop is
//!    sampled in its step. Under a loss lag (`L > 1`) its step writes loss
//!    slot `i` ([`TrainBatch::loss_slot`]: it is the `i`-th batch trained
//!    since the last loss read was queued) instead of reading its loss. The
//!    driver answers [`Event::BatchTrained`] with the new version (a skipped
//!    step leaves it). Then:
//!    - **Loss reads** (`L > 1`): once `L` batches are pending, and after a
//!      super-batch's last batch (step 8), a *rotation*: the read in flight
//!      is resolved ([`Action::ResolveLossRead`], answered with
//!      [`Event::LossesRead`]) and its batches shown ([`Action::ShowLosses`]),
//!      then a read of the pending batches' slots is queued
//!      ([`Action::QueueLossRead`]). So at most one read is in flight, at most
//!      `⌈N / L⌉` are queued per super-batch (one when `L ≥ N`, so each of
//!      the monitor's windows holds one; a mark's flush adds one), and a
//!      batch is shown about a
//!      super-batch after it trained. A *flush* (a rotation, then the read
//!      just queued resolved and shown too) comes before every mark, at the
//!      epoch's end and after a stop (step 10): every trained batch is shown
//!      once, in order. A **non-finite loss** (the device skipped that step
//!      and every one after it): the read's batches up to it are shown with
//!      `rewind` = those skipped steps (the rest of its read and the pending
//!      batches), the version moves back by as many, no batch after it is
//!      shown, and the epoch ends (step 10). With `L = 1` every step reads
//!      its own loss and the batch is shown right after its answer (and its
//!      mark).
//!    - **Marks** (the measurement window `w`): [`Action::Mark`] of the
//!      window's start before batch `w.start`, then of its end before batch
//!      `w.end` (once each) — right after the answer of the batch before it,
//!      or before the epoch's first super-batch begins — each after a flush,
//!      so every batch trained before a mark has its loss on the host by
//!      then: shown (under a loss lag), or read by its step (the batch right
//!      before the mark is shown right after it).
//!
//!    After a super-batch's last batch its regular jobs become droppable
//!    ([`Action::Retire`]); then the per-batch publication of step 2, if any.
//! 8. **After the super-batch**: publish (step 2), rotate the loss reads if
//!    a batch is pending (step 7), then [`Action::EndSuperBatch`]
//!    with its queue's counts ([`SuperBatchHot`]: rows queued, computed,
//!    carried, used) (the monitor observes its window, except for the epoch's first and last
//!    super-batch, where the pipeline fills or drains). The next super-batch
//!    starts with [`Action::BeginSuperBatch`] (the monitor's evictions taking
//!    effect), then its launch-ahead (step 3), then its batches.
//! 9. **Workers** (the driver's threads or simulated workers) take urgent jobs
//!    first; a regular job below the [`Action::Retire`] watermark is dropped
//!    unstarted ([`Job::droppable`], reported as [`Event::JobDropped`]); of the
//!    jobs sharing a claim, the first to claim it computes and the others skip
//!    silently; a job reads the newest published weights once, when it starts
//!    (waiting for their copies, step 2), and stamps every row with their
//!    version.
//! 10. **End**: after the last super-batch; on [`Event::Stop`] (queued
//!     actions are dropped, except that the answers to reports already handed
//!     in stay, installs turned into discards, and losses already read are
//!     still shown); on [`Event::Abort`] (the same, but nothing more is read:
//!     the driver failed); or at
//!     a non-finite loss (step 7). Every job of the epoch becomes droppable
//!     ([`Action::Retire`]); unless the epoch was aborted or hit a non-finite
//!     loss, the deferred losses are flushed (step 7), followed by the mark a
//!     stop interrupted, if any; then [`Action::Finished`] carries the
//!     epoch's [`ProtocolStats`].
//!
//! By steps 4, 5 and 7 no recorded gap exceeds the bound and no row is from the
//! future, whatever the timing of the reports; the tests check it over thousands
//! of simulated batches with an independent replay of the simulator's trace.
//! Carried rows keep their version: the gate (step 5) checks them like any
//! other, and the carry rule (step 3) makes them pass it. The monitor's moves
//! change which vertices are CPU-hot, never what a stored row holds (a row is
//! layer 0 of a vertex at a version, wherever its features live), so a split
//! change invalidates nothing: a vertex back on the CPU is carried only if its
//! stored row is still fresh enough.
//!
//! # Driving it
//! 1. Hand in every worker report waiting ([`Event::ChunkComputed`],
//!    [`Event::JobDropped`]) before every [`Protocol::poll`], without blocking.
//!    Hand in [`Event::PublicationResolved`] once a publication's copies
//!    resolved, before any report computed with them.
//! 2. Carry out each action in order. Answer [`Action::Launch`] with
//!    [`Event::Launched`] (or [`Event::Planned`]), [`Action::Train`] with
//!    [`Event::BatchTrained`] and [`Action::ResolveLossRead`] with
//!    [`Event::LossesRead`] before polling again; on [`Action::Wait`] block for
//!    one report and hand it in; on [`Action::Gate`] a driver may answer
//!    [`Event::Stop`], and so may a callback on [`Action::ShowLosses`]; after
//!    a failure the driver answers [`Event::Abort`].
//! 3. [`Protocol::poll`] returns `None` only while it awaits such an answer, or
//!    between epochs.
//!
//! ```
//! # use scheduler::{Action, Event, HotSplit, LaunchedBatch, OnLate, PipelineConfig,
//! #     Protocol, ProtocolConfig};
//! let pipeline = PipelineConfig::new(2, 1, 64).unwrap();
//! let mut p = Protocol::new(ProtocolConfig::new(pipeline, 3, OnLate::Compute));
//! p.handle(Event::EpochStarted { batches: 0..4, version: 0, loss_lag: 1, window: None })
//!     .unwrap();
//! let mut trained = 0;
//! while let Some(action) = p.poll().unwrap() {
//!     match action {
//!         Action::Launch { super_batch, batches, .. } => {
//!             let batches = batches.map(|_| LaunchedBatch { seeds: 1, bottom: vec![9, 0, 1] });
//!             let split = HotSplit::all_cpu(2);
//!             p.handle(Event::Launched { super_batch, split, batches: batches.collect() })
//!                 .unwrap();
//!         }
//!         Action::Train(t) => {
//!             trained += 1;
//!             p.handle(Event::BatchTrained { batch: t.batch, version: t.version + 1 }).unwrap();
//!         }
//!         Action::Finished { stats, .. } => assert_eq!(stats.computed_cold, 8),
//!         _ => {}
//!     }
//! }
//! assert_eq!(trained, 4);
//! ```

mod event;
mod losses;
mod plan;
mod queue;
mod stats;

use std::collections::VecDeque;
use std::ops::Range;

pub use event::{Action, ChunkKey, ClaimId, Event, Job, ReportId, TrainBatch, Urgent};
pub use plan::{LaunchPlan, LaunchedBatch};
pub use stats::{ProtocolStats, SuperBatchHot};

use crate::error::{invalid, Result, SchedulerError};
use crate::pipeline::{HotSplit, PipelineConfig, Publication};
use crate::staleness::{OnLate, StalenessRule};

use losses::{DeferredLosses, Mark};
use queue::{CarrySpec, ChunkState, HotQueue, LaunchSpec, NO_ROW};

/// The protocol's knobs: the pipeline's shape, the staleness rule and the
/// publication cadence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProtocolConfig {
    /// Super-batch size `N`, depth `D`, chunk sizes.
    pub pipeline: PipelineConfig,
    /// `staleness_bound` and `on_late`.
    pub staleness: StalenessRule,
    /// When weights are published besides the epoch's start (step 2).
    pub publication: Publication,
    /// Keep hot rows across super-batches (step 3's carry, step 4's keep):
    /// effective only when the bound allows any reuse
    /// ([`ProtocolConfig::reuses_across_super_batches`]).
    pub reuse: bool,
    /// When the batches' bottom hops are sampled (steps 3 and 7).
    pub bottoms: BottomHops,
}

/// When a batch's bottom hop (the sampled layer below its top layers) is
/// sampled: in its step, or a super-batch ahead at its launch
/// ([`Action::SampleBottoms`], protocol step 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BottomHops {
    /// In each batch's step (the runtime's `device.sample_ahead = false`).
    AtTrain,
    /// At the launch, each skipping its batch's planned hot positions (their
    /// rows come from the slab; `orchestration.hot_backward = "constant"`): a
    /// batch trains on it iff it trains with exactly those positions.
    SkipPlanned,
    /// At the launch, skipping nothing (`hot_backward = "aggregate"`: the hot
    /// rows' gradient flows through the bottom hop): every batch trains on it.
    SkipNothing,
}

impl ProtocolConfig {
    /// The runtime's configuration: the publication cadence follows the bound
    /// ([`Publication::for_bound`]); bottom hops sampled ahead skipping the
    /// planned positions (the runtime's defaults); no reuse.
    pub fn new(pipeline: PipelineConfig, staleness_bound: u64, on_late: OnLate) -> Self {
        Self {
            pipeline,
            staleness: StalenessRule::new(staleness_bound, on_late),
            publication: Publication::for_bound(&pipeline, staleness_bound),
            reuse: false,
            bottoms: BottomHops::SkipPlanned,
        }
    }

    /// This configuration with the bottom hops sampled as `bottoms`.
    pub fn with_bottoms(mut self, bottoms: BottomHops) -> Self {
        self.bottoms = bottoms;
        self
    }

    /// This configuration with reuse across super-batches on or off
    /// ([`ProtocolConfig::reuse`]).
    pub fn with_reuse(mut self, reuse: bool) -> Self {
        self.reuse = reuse;
        self
    }

    /// Whether hot rows are kept across super-batches: [`ProtocolConfig::reuse`]
    /// and a bound of at least `max(D, 1) · N` steps. A row carried into
    /// super-batch `g` was computed with weights no newer than those at `g`'s
    /// launch, `D · N` steps before `g`'s first batch, and must serve every
    /// batch of `g` reading it; under a smaller bound (0 included) no row ever
    /// could, so nothing is kept and the protocol is exactly the one without
    /// reuse.
    pub fn reuses_across_super_batches(&self) -> bool {
        let n = self.pipeline.batches_per_super_batch() as u64;
        let d = self.pipeline.depth().max(1) as u64;
        self.reuse && self.staleness.bound() >= d * n
    }

    /// Slabs the driver needs: one per live super-batch, `D + 1`.
    pub fn slabs(&self) -> usize {
        self.pipeline.depth() + 1
    }
}

/// Where the epoch's program stands (what the next poll does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pc {
    /// Step 2 at the epoch's start.
    Start,
    /// Step 3 for super-batches `0..=D` at the start.
    LaunchInitial(u64),
    /// Step 8: super-batch `j` begins.
    Begin(u64),
    /// Step 3: the launch-ahead when `j` begins.
    LaunchAhead(u64),
    /// Step 5: batch `k`'s gate opens.
    Gate(usize),
    /// Steps 5–7: batch `k`'s gate decides.
    Decide(usize),
    /// Step 7 after batch `k`'s answer: its loss reads.
    Trained(usize),
    /// Step 7: the mark before batch `k + 1`.
    MarkAfter(usize),
    /// Step 7: batch `k` shown (its loss read by its step).
    Show(usize),
    /// Step 7 after batch `k` trained and was shown.
    AfterTrain(usize),
    /// Step 8 after super-batch `j`'s last batch.
    End(u64),
    /// Step 8: super-batch `j` ends with its queue's counts.
    EndSuperBatch(u64, SuperBatchHot),
    /// Step 7: the mark before super-batch `j` begins (or step 10 past the last).
    MarkBefore(u64),
    /// Step 10.
    Finish,
}

/// An answer the protocol waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Awaiting {
    Nothing,
    /// [`Event::Launched`] for a global super-batch.
    Launched(u64),
    /// [`Event::BatchTrained`] for an epoch batch.
    Trained(usize),
    /// [`Event::LossesRead`].
    LossesRead,
}

/// One epoch in progress.
#[derive(Debug)]
struct Epoch {
    batches: Range<usize>,
    /// The version when it started.
    v0: u64,
    /// The weights' version now.
    version: u64,
    /// The newest version published.
    published: u64,
    /// Global index of its first super-batch.
    first: u64,
    num_sb: u64,
    live: VecDeque<HotQueue>,
    pc: Pc,
    awaiting: Awaiting,
    stats: ProtocolStats,
    urgent_seq: u64,
    /// Late positions of the batch whose gate blocked, when it first blocked.
    waiting: Option<u64>,
    /// The hot-row store: per relabeled hot id, the version of the row the
    /// driver keeps for it ([`NO_ROW`]: none). Empty at every epoch's start
    /// (the weights may have moved: a checkpoint, another strategy's epochs).
    store: Vec<u64>,
    /// The newest publication whose copies resolved (step 2).
    resolved: u64,
    /// Step 7's loss reads.
    losses: DeferredLosses,
    /// The measurement window, and whether its start and end were marked.
    window: Option<Range<usize>>,
    marked: (bool, bool),
    /// Ending early (step 10): stopped, or at a non-finite loss.
    stopped: bool,
    /// At a non-finite loss: nothing is flushed (step 10).
    nonfinite: bool,
    /// The mark a stop interrupted, taken after the flush (step 10).
    stop_mark: Option<Mark>,
}

impl Epoch {
    /// Epoch batch indices of local super-batch `j`.
    fn batches_of(&self, j: u64, n: usize) -> Range<usize> {
        let first = self.batches.start + j as usize * n;
        first..(first + n).min(self.batches.end)
    }

    /// Step 7: the mark due before batch `k`, if any, taken now (after a
    /// flush of the deferred losses).
    fn mark_before(&mut self, k: usize, out: &mut VecDeque<Action>) {
        let Some(w) = &self.window else { return };
        let start = k == w.start && !self.marked.0;
        if start || (k == w.end && self.marked.0 && !self.marked.1) {
            if start {
                self.marked.0 = true;
            } else {
                self.marked.1 = true;
            }
            self.losses.flush(Some((k, start)), out);
        }
    }
}

/// The super-batch pipeline's state machine (module doc), one per trainer: it
/// lives across epochs (global super-batch numbers, claims and report ids are
/// never reused).
#[derive(Debug)]
pub struct Protocol {
    cfg: ProtocolConfig,
    /// The next epoch's first global super-batch.
    next_super_batch: u64,
    next_claim: u64,
    next_report: u64,
    retired_below: u64,
    actions: VecDeque<Action>,
    epoch: Option<Epoch>,
    /// Counts of reports handed in between epochs (they go to the next epoch).
    between: ProtocolStats,
}

impl Protocol {
    /// A protocol with no epoch running.
    pub fn new(cfg: ProtocolConfig) -> Self {
        Self {
            cfg,
            next_super_batch: 0,
            next_claim: 0,
            next_report: 0,
            retired_below: 0,
            actions: VecDeque::new(),
            epoch: None,
            between: ProtocolStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ProtocolConfig {
        &self.cfg
    }

    /// Whether an epoch is running (started and not finished).
    pub fn running(&self) -> bool {
        self.epoch.is_some()
    }

    /// The current [`Action::Retire`] watermark.
    pub fn retired_below(&self) -> u64 {
        self.retired_below
    }

    /// The counts of the epoch running so far (`None` between epochs).
    pub fn epoch_stats(&self) -> Option<&ProtocolStats> {
        self.epoch.as_ref().map(|e| &e.stats)
    }

    /// Each batch's planned hot positions of live global super-batch
    /// `super_batch` (in its batch order): the positions among the batch's
    /// bottom destinations that take a slab row if nothing is late when it
    /// trains — with `on_late = "wait"` exactly [`TrainBatch::positions`]
    /// (as a set); with `"compute"` a late chunk's positions move to
    /// [`TrainBatch::cold`]. Known once [`Event::Planned`] or
    /// [`Event::Launched`] for it is handled (step 3), until its
    /// [`Action::EndSuperBatch`]; `None` otherwise. They are the skip masks
    /// of [`Action::SampleBottoms`] under [`BottomHops::SkipPlanned`].
    pub fn planned_positions(&self, super_batch: u64) -> Option<Vec<Vec<u32>>> {
        self.epoch
            .as_ref()?
            .live
            .iter()
            .find(|q| q.global == super_batch)
            .map(HotQueue::planned_positions)
    }

    /// Feeds one event (module doc); the actions it causes come out of
    /// [`Protocol::poll`]. An event the protocol does not expect now is an error
    /// that names it.
    pub fn handle(&mut self, event: Event) -> Result<()> {
        match event {
            Event::EpochStarted {
                batches,
                version,
                loss_lag,
                window,
            } => self.start_epoch(batches, version, loss_lag, window),
            Event::Launched {
                super_batch,
                split,
                batches,
            } => {
                let plan = LaunchPlan::new(&batches, split.cpu());
                self.launched(super_batch, split, &plan, "Launched")
            }
            Event::Planned {
                super_batch,
                split,
                plan,
            } => self.launched(super_batch, split, &plan, "Planned"),
            Event::ChunkComputed { key, version, rows } => {
                self.withdraw_wait();
                self.computed(key, version, rows)
            }
            Event::JobDropped { .. } => {
                self.stats_mut().dropped_jobs += 1;
                Ok(())
            }
            Event::BatchTrained { batch, version } => self.trained(batch, version),
            Event::LossesRead { nonfinite } => self.losses_read(nonfinite),
            Event::PublicationResolved { version } => self.publication_resolved(version),
            Event::Stop => {
                self.stop();
                Ok(())
            }
            Event::Abort => {
                self.abort();
                Ok(())
            }
        }
    }

    /// The next action, or `None` while the protocol awaits an answer
    /// ([`Event::Launched`], [`Event::BatchTrained`], [`Event::LossesRead`])
    /// or no epoch runs.
    pub fn poll(&mut self) -> Result<Option<Action>> {
        loop {
            if let Some(a) = self.actions.pop_front() {
                return Ok(Some(a));
            }
            let Some(e) = &self.epoch else {
                return Ok(None);
            };
            if e.awaiting != Awaiting::Nothing {
                return Ok(None);
            }
            self.step()?;
        }
    }

    fn stats_mut(&mut self) -> &mut ProtocolStats {
        match &mut self.epoch {
            Some(e) => &mut e.stats,
            None => &mut self.between,
        }
    }

    fn unexpected(event: &'static str, state: impl Into<String>) -> SchedulerError {
        SchedulerError::UnexpectedEvent {
            event,
            state: state.into(),
        }
    }

    /// Step 1.
    fn start_epoch(
        &mut self,
        batches: Range<usize>,
        version: u64,
        loss_lag: usize,
        window: Option<Range<usize>>,
    ) -> Result<()> {
        if self.epoch.is_some() {
            self.abort();
        }
        if batches.start > batches.end {
            return Err(invalid(
                "epoch batches",
                "a range start..end with start <= end",
                format!("{batches:?}"),
            ));
        }
        let n = self.cfg.pipeline.batches_per_super_batch();
        let num_sb = batches.len().div_ceil(n) as u64;
        let stats = std::mem::take(&mut self.between);
        self.epoch = Some(Epoch {
            v0: version,
            version,
            published: version,
            first: self.next_super_batch,
            num_sb,
            live: VecDeque::new(),
            pc: Pc::Start,
            awaiting: Awaiting::Nothing,
            stats,
            urgent_seq: 0,
            waiting: None,
            store: Vec::new(),
            resolved: version,
            losses: DeferredLosses::new(loss_lag, batches.start),
            window,
            marked: (false, false),
            stopped: false,
            nonfinite: false,
            stop_mark: None,
            batches,
        });
        Ok(())
    }

    /// One step of the epoch's program: queues zero or more actions and moves
    /// on (or waits for an answer).
    fn step(&mut self) -> Result<()> {
        let d = self.cfg.pipeline.depth() as u64;
        let n = self.cfg.pipeline.batches_per_super_batch();
        let Some(e) = self.epoch.as_mut() else {
            return Ok(());
        };
        if e.losses.busy() {
            // Step 7: a loss read-out in progress goes first.
            if e.losses.step(&mut self.actions) {
                e.awaiting = Awaiting::LossesRead;
            }
            return Ok(());
        }
        match e.pc {
            Pc::Start => {
                e.stats.publications += 1;
                self.actions.push_back(Action::Publish {
                    version: e.version,
                    reset: true,
                });
                e.pc = if e.num_sb == 0 {
                    Pc::Finish
                } else {
                    Pc::LaunchInitial(0)
                };
            }
            Pc::LaunchInitial(j) => {
                if j <= d && j < e.num_sb {
                    self.launch(j);
                    if let Some(e) = self.epoch.as_mut() {
                        e.pc = Pc::LaunchInitial(j + 1);
                    }
                } else {
                    e.pc = Pc::MarkBefore(0);
                }
            }
            Pc::MarkBefore(j) => {
                if j >= e.num_sb {
                    e.pc = Pc::Finish;
                } else {
                    e.pc = Pc::Begin(j);
                    let first = e.batches_of(j, n).start;
                    e.mark_before(first, &mut self.actions);
                }
            }
            Pc::Begin(j) => {
                self.actions.push_back(Action::BeginSuperBatch {
                    super_batch: e.first + j,
                    local: j,
                });
                e.pc = Pc::LaunchAhead(j);
            }
            Pc::LaunchAhead(j) => {
                let first = e.batches_of(j, n).start;
                e.pc = Pc::Gate(first);
                if j > 0 && j + d < e.num_sb {
                    self.launch(j + d);
                }
            }
            Pc::Gate(k) => {
                if e.live.front().map(|q| q.batches.contains(&k)) != Some(true) {
                    return Err(SchedulerError::ProtocolInvariant {
                        what: format!("batch {k}'s super-batch was not launched"),
                    });
                }
                self.actions.push_back(Action::Gate {
                    batch: k,
                    version: e.version,
                });
                e.pc = Pc::Decide(k);
            }
            Pc::Decide(k) => self.decide(k)?,
            Pc::Trained(k) => {
                if e.losses.full() {
                    e.losses.rotate();
                }
                e.pc = Pc::MarkAfter(k);
            }
            Pc::MarkAfter(k) => {
                e.pc = Pc::Show(k);
                e.mark_before(k + 1, &mut self.actions);
            }
            Pc::Show(k) => {
                if !e.losses.deferred() {
                    self.actions.push_back(Action::ShowLosses {
                        batches: k..k + 1,
                        rewind: 0,
                    });
                }
                e.pc = Pc::AfterTrain(k);
            }
            Pc::AfterTrain(k) => {
                let q = e
                    .live
                    .front()
                    .ok_or_else(|| SchedulerError::ProtocolInvariant {
                        what: "no live super-batch after training".into(),
                    })?;
                let (global, local, last) = (q.global, q.local, q.batches.end);
                if k + 1 == last {
                    self.retire(global + 1);
                }
                if self.cfg.publication == Publication::EveryBatch {
                    self.publish();
                }
                if let Some(e) = self.epoch.as_mut() {
                    e.pc = if k + 1 < last {
                        Pc::Gate(k + 1)
                    } else {
                        Pc::End(local)
                    };
                }
            }
            Pc::End(j) => {
                let hot = e.live.pop_front().map(|q| q.counts).unwrap_or_default();
                e.pc = Pc::EndSuperBatch(j, hot);
                self.publish();
                if let Some(e) = self.epoch.as_mut().filter(|e| e.losses.any_pending()) {
                    e.losses.rotate();
                }
            }
            Pc::EndSuperBatch(j, hot) => {
                let (global, observe) = (e.first + j, j > 0 && j + 1 < e.num_sb);
                e.pc = Pc::MarkBefore(j + 1);
                self.actions.push_back(Action::EndSuperBatch {
                    super_batch: global,
                    local: j,
                    observe,
                    hot,
                });
            }
            Pc::Finish => {
                let (next, stopped) = (e.first + e.num_sb, e.stopped);
                self.retire(next);
                if let Some(e) = self.epoch.as_mut() {
                    if !e.nonfinite && (e.losses.unread() || e.stop_mark.is_some()) {
                        let mark = e.stop_mark.take();
                        e.losses.flush(mark, &mut self.actions);
                        if e.losses.busy() {
                            return Ok(());
                        }
                    }
                }
                self.finish(stopped);
            }
        }
        Ok(())
    }

    /// Step 2: publishes the current version unless it is published already.
    fn publish(&mut self) {
        let Some(e) = self.epoch.as_mut() else { return };
        if e.published == e.version {
            return;
        }
        e.published = e.version;
        e.stats.publications += 1;
        self.actions.push_back(Action::Publish {
            version: e.version,
            reset: false,
        });
    }

    /// Step 3: asks the driver to launch local super-batch `j`.
    fn launch(&mut self, j: u64) {
        let n = self.cfg.pipeline.batches_per_super_batch();
        let Some(e) = self.epoch.as_mut() else { return };
        let g = e.first + j;
        e.awaiting = Awaiting::Launched(g);
        self.actions.push_back(Action::Launch {
            super_batch: g,
            local: j,
            batches: e.batches_of(j, n),
        });
    }

    /// Step 3, the answer: plans the queue, reserves its slab, queues its jobs.
    fn launched(
        &mut self,
        g: u64,
        split: HotSplit,
        plan: &LaunchPlan,
        event: &'static str,
    ) -> Result<()> {
        let n = self.cfg.pipeline.batches_per_super_batch();
        let slabs = self.cfg.slabs() as u64;
        let pipeline = self.cfg.pipeline;
        let reuse = self.cfg.reuses_across_super_batches();
        let bound = self.cfg.staleness.bound();
        let next_claim = &mut self.next_claim;
        let e = match self.epoch.as_mut() {
            Some(e) if e.awaiting == Awaiting::Launched(g) => e,
            Some(e) => {
                return Err(Self::unexpected(
                    event,
                    format!("awaiting {:?}, not super-batch {g}", e.awaiting),
                ))
            }
            None => return Err(Self::unexpected(event, "no epoch running")),
        };
        let local = g - e.first;
        let spec = LaunchSpec {
            global: g,
            local,
            slab: (g % slabs) as usize,
            batches: e.batches_of(local, n),
            split,
        };
        let first_version = e.v0 + (spec.batches.start - e.batches.start) as u64;
        let carry = reuse.then_some(CarrySpec {
            store: &e.store,
            first_version,
            bound,
        });
        let q = HotQueue::from_plan_carrying(spec, plan, &pipeline, carry, || {
            *next_claim += 1;
            ClaimId(*next_claim)
        })?;
        match self.cfg.bottoms {
            BottomHops::AtTrain => {}
            bottoms => self.actions.push_back(Action::SampleBottoms {
                super_batch: g,
                batches: q.batches.clone(),
                skip: if bottoms == BottomHops::SkipPlanned {
                    q.planned_positions()
                } else {
                    vec![Vec::new(); q.batches.len()]
                },
            }),
        }
        self.actions.push_back(Action::ReserveSlab {
            slab: q.slab,
            rows: q.len(),
            super_batch: g,
        });
        if q.counts.carried_rows > 0 {
            let (rows, vertices) = q.carried();
            e.stats.rows_carried += rows.len() as u64;
            self.actions.push_back(Action::Carry {
                super_batch: g,
                slab: q.slab,
                rows,
                vertices,
            });
        }
        for c in 0..q.chunks.len() {
            if !q.chunks[c].carried {
                self.actions.push_back(Action::QueueJob(q.regular_job(c)));
            }
        }
        e.live.push_back(q);
        e.awaiting = Awaiting::Nothing;
        Ok(())
    }

    /// Step 4.
    fn computed(&mut self, key: ChunkKey, version: u64, rows: u32) -> Result<()> {
        let report = ReportId(self.next_report);
        self.next_report += 1;
        let stats = self.stats_mut();
        stats.jobs += 1;
        stats.rows_computed += rows as u64;
        let n = self.cfg.pipeline.batches_per_super_batch() as u64;
        let bound = self.cfg.staleness.bound();
        // Keep only rows a later launch could carry: the next launch's first
        // batch trains at `v0 + next · N` at most, later ones later still, so
        // a row with `version + bound` below it is never carried (and the
        // store's older row for the vertex is not either).
        let keep = self.cfg.reuses_across_super_batches()
            && self.epoch.as_ref().is_some_and(|e| {
                let next = e.live.back().map_or(0, |q| q.local + 1);
                next < e.num_sb && version.saturating_add(bound) >= e.v0 + next * n
            });
        let mut kept: Option<Action> = None;
        let target = self.epoch.as_mut().and_then(|e| {
            let (current, resolved) = (e.version, e.resolved);
            e.live
                .iter_mut()
                .find(|q| q.global == key.super_batch)
                .and_then(|q| {
                    let slab = q.slab;
                    q.counts.computed_rows += rows as u64;
                    q.chunks
                        .get_mut(key.chunk as usize)
                        .map(|c| (current, resolved, slab, c, &mut e.stats, &mut e.store))
                })
        });
        let install = match target {
            Some((current, ..)) if version > current => {
                return Err(SchedulerError::VersionAhead {
                    embedding: version,
                    current,
                })
            }
            Some((_, resolved, ..)) if version > resolved => {
                return Err(SchedulerError::ProtocolInvariant {
                    what: format!(
                        "rows of chunk {key:?} computed with the weights of version {version}, \
                         whose copies had not resolved (the newest resolved: {resolved})"
                    ),
                })
            }
            Some((_, _, slab, c, stats, store))
                if c.state.version().is_none_or(|e| e < version) =>
            {
                c.state = ChunkState::Ready(version);
                c.urgent = false;
                stats.installs += 1;
                stats.rows_installed += c.rows.len() as u64;
                if keep {
                    // Step 4, keep: rows newer than the store's go into it.
                    let (mut rows, mut vertices) = (Vec::new(), Vec::new());
                    for (r, &v) in c.rows.clone().zip(&c.vertices) {
                        let v_us = v as usize;
                        if v_us >= store.len() {
                            store.resize(v_us + 1, NO_ROW);
                        }
                        if store[v_us] == NO_ROW || store[v_us] < version {
                            store[v_us] = version;
                            rows.push(r);
                            vertices.push(v);
                        }
                    }
                    if !rows.is_empty() {
                        stats.rows_kept += rows.len() as u64;
                        kept = Some(Action::Keep {
                            super_batch: key.super_batch,
                            slab,
                            rows,
                            vertices,
                            version,
                        });
                    }
                }
                Some((slab, c.rows.clone()))
            }
            _ => None,
        };
        let action = match install {
            Some((slab, rows)) => Action::Install {
                report,
                key,
                slab,
                rows,
                version,
            },
            None => {
                self.stats_mut().discarded += 1;
                Action::Discard { report, key }
            }
        };
        self.actions.push_back(action);
        self.actions.extend(kept);
        Ok(())
    }

    /// Step 6: a report handed in while a [`Action::Wait`] is queued may be what
    /// the gate waits for; the `Wait` goes, and the gate (`pc` is still its
    /// `Decide`) decides again once the queue is empty.
    fn withdraw_wait(&mut self) {
        self.actions.retain(|a| !matches!(a, Action::Wait { .. }));
    }

    /// Steps 5–7 for epoch batch `k`.
    fn decide(&mut self, k: usize) -> Result<()> {
        let (rule, bottoms) = (self.cfg.staleness, self.cfg.bottoms);
        let Some(e) = self.epoch.as_mut() else {
            return Ok(());
        };
        let b = e.version;
        if b > e.v0 + (k - e.batches.start) as u64 {
            return Err(SchedulerError::ProtocolInvariant {
                what: format!("batch {k} would run at version {b}, ahead of its steps"),
            });
        }
        let q = e
            .live
            .front_mut()
            .ok_or_else(|| SchedulerError::ProtocolInvariant {
                what: format!("no live super-batch for batch {k}"),
            })?;
        let i = k - q.batches.start;
        let late = q.late(i, b, &rule)?;
        let late_positions = q.late_positions(i, &late);
        if late.is_empty() || rule.on_late() == OnLate::Compute {
            // Step 7 (with step 6, "compute": late chunks stay cold).
            e.stats.computed_cold += late_positions;
            if let Some(w) = e.waiting.take() {
                e.stats.waited += w;
                e.stats.wait_batches += 1;
            }
            let mut t = q.train(i, b, &rule, &late, &mut e.stats.gaps)?;
            t.bottom_ahead = match bottoms {
                BottomHops::AtTrain => false,
                BottomHops::SkipPlanned => q.trains_as_planned(i, &t.positions),
                BottomHops::SkipNothing => true,
            };
            t.loss_slot = e.losses.slot();
            e.stats.hot_uses += t.positions.len() as u64;
            e.awaiting = Awaiting::Trained(k);
            self.actions.push_back(Action::Train(t));
            return Ok(());
        }
        // Step 6, "wait".
        e.waiting.get_or_insert(late_positions);
        let oldest = rule.oldest_usable(b);
        for &c in &late {
            let q = &mut e.live[0];
            let chunk = &mut q.chunks[c as usize];
            if chunk.urgent {
                continue;
            }
            let recompute = chunk.state.version().is_some_and(|v| v < oldest);
            if recompute {
                if e.published < oldest {
                    e.published = b;
                    e.stats.publications += 1;
                    self.actions.push_back(Action::Publish {
                        version: b,
                        reset: false,
                    });
                }
                self.next_claim += 1;
                chunk.claim = ClaimId(self.next_claim);
                e.stats.recomputations += 1;
            }
            chunk.urgent = true;
            e.urgent_seq += 1;
            e.stats.urgent_jobs += 1;
            let mut job = q.regular_job(c as usize);
            job.urgent = Some(Urgent {
                seq: e.urgent_seq,
                recompute,
                batch: k,
            });
            self.actions.push_back(Action::QueueJob(job));
        }
        self.actions.push_back(Action::Wait {
            batch: k,
            late_chunks: late.len() as u32,
            late_vertices: late_positions,
        });
        Ok(())
    }

    /// Step 7, the answer.
    fn trained(&mut self, k: usize, version: u64) -> Result<()> {
        let e = match self.epoch.as_mut() {
            Some(e) if e.awaiting == Awaiting::Trained(k) => e,
            Some(e) => {
                return Err(Self::unexpected(
                    "BatchTrained",
                    format!("awaiting {:?}, not batch {k}", e.awaiting),
                ))
            }
            None => return Err(Self::unexpected("BatchTrained", "no epoch running")),
        };
        if version < e.version || version > e.version + 1 {
            return Err(invalid(
                "BatchTrained version",
                format!("{} or {} (one step at most)", e.version, e.version + 1),
                version,
            ));
        }
        e.losses.trained(k)?;
        e.version = version;
        e.awaiting = Awaiting::Nothing;
        e.pc = Pc::Trained(k);
        Ok(())
    }

    /// Step 7: the answer to a loss read's resolution.
    fn losses_read(&mut self, nonfinite: Option<usize>) -> Result<()> {
        let e = match self.epoch.as_mut() {
            Some(e) if e.awaiting == Awaiting::LossesRead => e,
            Some(e) => {
                return Err(Self::unexpected(
                    "LossesRead",
                    format!("awaiting {:?}", e.awaiting),
                ))
            }
            None => return Err(Self::unexpected("LossesRead", "no epoch running")),
        };
        let rewind = e.losses.read(nonfinite, &mut self.actions)?;
        e.awaiting = Awaiting::Nothing;
        if let Some(r) = rewind {
            // The device skipped those steps: the version moves back, and the
            // epoch ends (step 10) without another read.
            e.version = e
                .version
                .checked_sub(r)
                .filter(|&v| v >= e.v0)
                .ok_or_else(|| SchedulerError::ProtocolInvariant {
                    what: format!("{r} steps skipped at version {}, from {}", e.version, e.v0),
                })?;
            e.stopped = true;
            e.nonfinite = true;
            e.stop_mark = None;
            e.pc = Pc::Finish;
        }
        Ok(())
    }

    /// Step 2: the copies of publication `version` resolved.
    fn publication_resolved(&mut self, version: u64) -> Result<()> {
        let Some(e) = self.epoch.as_mut() else {
            // Between epochs nobody reads them: the next epoch starts with a reset.
            return Ok(());
        };
        if version > e.published {
            return Err(invalid(
                "PublicationResolved version",
                format!("at most {} (the newest publication)", e.published),
                version,
            ));
        }
        e.resolved = e.resolved.max(version);
        Ok(())
    }

    /// Steps 7 and 10: regular jobs below `below` become droppable.
    fn retire(&mut self, below: u64) {
        if below > self.retired_below {
            self.retired_below = below;
            self.actions.push_back(Action::Retire { below });
        }
    }

    /// Step 10 on [`Event::Stop`]: drops the queued actions but the answers to
    /// reports and the losses read; then flushes the deferred losses (and
    /// takes the mark the stop interrupted) before finishing.
    fn stop(&mut self) {
        let Some(e) = self.epoch.as_mut().filter(|e| !e.stopped) else {
            return;
        };
        let mark = e.losses.abandon();
        let flush = e.losses.unread() || mark.is_some();
        self.drop_queued(true);
        match self.epoch.as_mut() {
            Some(e) if flush => {
                e.stopped = true;
                e.stop_mark = mark;
                e.awaiting = Awaiting::Nothing;
                e.pc = Pc::Finish;
            }
            _ => self.finish(true),
        }
    }

    /// Step 10 on [`Event::Abort`]: drops the queued actions but the answers
    /// to reports, and finishes at once.
    fn abort(&mut self) {
        let Some(e) = self.epoch.as_mut() else {
            return;
        };
        e.losses.abandon();
        self.drop_queued(false);
        self.finish(true);
    }

    /// Steps 10: drops the queued actions but the answers to reports (an
    /// install becomes a discard) and, with `shows`, the losses to show and
    /// the marks.
    fn drop_queued(&mut self, shows: bool) {
        let Some(e) = self.epoch.as_mut() else {
            return;
        };
        let queued = std::mem::take(&mut self.actions);
        for a in queued {
            match a {
                Action::Install {
                    report, key, rows, ..
                } => {
                    e.stats.installs -= 1;
                    e.stats.rows_installed -= rows.len() as u64;
                    e.stats.discarded += 1;
                    self.actions.push_back(Action::Discard { report, key });
                }
                a @ Action::Discard { .. } => self.actions.push_back(a),
                a @ (Action::ShowLosses { .. } | Action::Mark { .. }) if shows => {
                    self.actions.push_back(a)
                }
                _ => {}
            }
        }
    }

    /// Step 10.
    fn finish(&mut self, stopped: bool) {
        let Some(e) = self.epoch.take() else {
            return;
        };
        self.next_super_batch = e.first + e.num_sb;
        self.retire(self.next_super_batch);
        self.actions.push_back(Action::Finished {
            stats: e.stats,
            stopped,
        });
    }
}
