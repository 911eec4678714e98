//! The super-batch pipeline executor: layer-based orchestration of one epoch on a
//! device ([`LayerDevice`]) and the persistent CPU workers. The numbered steps below
//! are the one description of the protocol (with those of `workers.rs` and
//! `engine/hot.rs`); the scheduler's task graph and simulator model them, and
//! docs/orchestration.md §9 says why they are so and what was measured.
//!
//! # Protocol (one epoch, the accelerator thread)
//! 1. **Setup** (once per trainer, [`Orchestrator::new`]): score hotness
//!    (`orchestration.hotness`), build the [`Relabeling`] (hot = relabeled id below
//!    `hot_count`). The workers (`orchestrate/workers.rs`) start on the first
//!    epoch and live as long as the orchestrator.
//! 2. **Publish** layer 0's weights with their version at the epoch's start and
//!    after every super-batch (one download per super-batch, not per batch). A
//!    chunk of queue `j + 1` starts during super-batch `j` with weights of version
//!    ≥ `j · N`, so its rows are at most `2N − 1` steps old when used
//!    ([`PipelineConfig::on_time_gap`] with `D = 1`). With a `staleness_bound`
//!    below that gap, weights are published after every batch instead (rows of
//!    chunks started later are then fresher; fewer are late).
//! 3. **Launch** super-batch `j` (queues 0 and 1 at the epoch's start, queue
//!    `j + 1` when `j` starts): sample its batches' top layers on the engine
//!    ([`LayerDevice::prepare_top`]), plan its queue ([`SuperBatchPlan`]: the CPU-hot
//!    bottom destinations, deduplicated, hottest first, cut into chunks), reserve
//!    its slab (`j % 2`) for the queue, record per batch which (position, queue
//!    index) pairs it reads and which chunks, and queue one job per chunk. A
//!    batch's own seeds never read a hot row: their bottom-layer rows are computed
//!    fresh on the accelerator, so the training vertices' own paths always train
//!    layer 0 (with constant historical rows, a training set inside the hot set
//!    otherwise starves layer 0 of gradient: WordNet lost 11 points, 2 with this).
//! 4. **Install.** At every gate, every report waiting is taken: a chunk of a live
//!    super-batch computed with newer weights than its slab rows is installed
//!    ([`LayerDevice::hot_install`]: one asynchronous upload of the chunk, ordered
//!    before later batches with an event) and becomes *ready* at its version;
//!    anything else (a dropped job, a chunk of a finished super-batch) only gives
//!    its staging buffer back.
//! 5. **Gate**, per batch `b` (the engine's version), per chunk it reads: ready at
//!    version `e` with `b − e ≤ staleness_bound` is used (every reuse's gap is
//!    recorded). A late chunk, by `on_late`:
//!    - `"compute"`: its vertices stay cold in this batch: the accelerator samples,
//!      gathers and computes them itself (gap 0). Nothing waits.
//!    - `"wait"`: an urgent job is queued — for a chunk not computed yet, a
//!      duplicate sharing its claim flag (promotion: whichever starts first
//!      computes); for a stale one, a recomputation after publishing the current
//!      weights — and the thread blocks on reports (step 4) until every chunk the
//!      batch reads is ready within the bound.
//! 6. **Train** the batch ([`LayerDevice::train_prepared`] with the used positions and
//!    slab rows), then mark it passed (workers drop regular jobs of super-batches
//!    every batch of which has passed).
//! 7. **After the super-batch**: publish (step 2); the hybrid monitor observes.
//! 8. **End.** At the epoch's end, on a stop or an error, the prepared batches are
//!    forgotten and every queued job of the epoch becomes droppable; a worker's
//!    failure is returned as the epoch's error and the workers are restarted on
//!    the next epoch.
//!
//! Trace (`acc stream compute` track): `launch` slices (with `super_batch`; the
//! engine's `sample top` inside), `gate`, `hot wait`, `train` (with
//! `staleness_gap` = the batch's largest gap, the engine's `sample bottom` and
//! `device step` inside), `publish`; instants `hot install` (rows, bytes host →
//! device) and `compute cold` (vertices); `hot compute` slices on `hot worker i`
//! tracks with a flow to the first batch reading their rows.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use cpu_ops::{derive_seed, ModelConfig, NeighborSampler};
use scheduler::{
    GapHistogram, HotSplit, HotnessPolicy, OnLate, PipelineConfig, Relabeling, SuperBatchPlan,
};

use crate::config::{HotnessKind, OrchestrationSection};
use crate::dataset::Dataset;
use crate::engine::{record_copies, HotUse, LayerDevice};
use crate::error::{Error, Result, StopCause};
use crate::executor::{BatchDone, EpochEnd, EpochRun};
use crate::trace::{Direction, FlowId, Tracer, TrackId, TrackKind};

use super::clock::{wall_clock, SharedClock};
use super::hot_compute::{HotComputer, Published, Snapshot};
use super::monitor::{HybridMonitor, Window};
use super::stats::OrchestrationStats;
use super::workers::{ChunkKey, Done, HotWorkers, Job, Outcome, WorkerShared};

use super::workers::InjectedFault;

/// Pipeline depth `D` (NeutronOrch's: the CPU works one super-batch ahead).
pub const DEPTH: usize = 1;
/// Largest number of vertices per CPU job (one upload per chunk).
pub const HOT_CHUNK: usize = 1024;

fn sched(context: &'static str) -> impl Fn(scheduler::SchedulerError) -> Error {
    move |source| Error::Scheduler {
        context: context.into(),
        source,
    }
}

/// What [`Orchestrator::new`] needs: the `[orchestration]` section, and the
/// dataset, model and training batches whose hot set it scores.
pub(crate) struct LayerSetup<'a> {
    /// `[orchestration]` (its `hot_ratio` sizes the hot set).
    pub cfg: &'a OrchestrationSection,
    /// The dataset, in user ids.
    pub ds: &'a Arc<Dataset>,
    /// The trained model's configuration (layer 0's shape for the CPU).
    pub model: &'a ModelConfig,
    /// Training fanouts, bottom first.
    pub fanouts: &'a [u32],
    /// The training vertices.
    pub train_ids: &'a [u32],
    /// `train.batch_size`.
    pub batch_size: usize,
    /// `train.seed`.
    pub seed: u64,
}

/// Layer-based orchestration for one trainer: the hot set, the rule, the workers.
pub struct Orchestrator {
    relabeling: Relabeling,
    split: HotSplit,
    bound: u64,
    on_late: OnLate,
    /// `orchestration.hot_backward`.
    hot_grad: gpu_ops::HotGrad,
    pipeline: PipelineConfig,
    workers_wanted: usize,
    bottom_fanout: u32,
    model: ModelConfig,
    ds: Arc<Dataset>,
    totals: OrchestrationStats,
    last_epoch: Option<OrchestrationStats>,
    fault: Option<InjectedFault>,
    /// `orchestration.monitor`.
    use_monitor: bool,
    /// The hybrid monitor, built on the first epoch (it needs the engine's cache).
    monitor: Option<HybridMonitor>,
    workers: Option<HotWorkers>,
    /// First core for the workers when pinning (`threads.pin = "cores"`).
    pin_from: Option<usize>,
    clock: SharedClock,
    /// The next global super-batch index (never reused, across epochs).
    next_super_batch: u64,
    /// Global super-batches below this are finished: their jobs are droppable.
    min_live: Arc<AtomicU64>,
    /// Where the workers' slices go, one track per worker.
    trace: (Tracer, Vec<TrackId>),
    /// Candidate splits whose counts launches accumulate (`policy = "auto"`).
    count_splits: Vec<u32>,
    /// Per candidate split: (rows queued, hot positions), and batches launched.
    split_counts: (Vec<(u64, u64)>, u64),
    /// Clock seconds and statistics when the marked batch started.
    mark: Option<(f64, OrchestrationStats)>,
}

impl Orchestrator {
    /// Step 1: scores hotness over the training vertices with the training
    /// fanouts and batch size, relabels.
    pub fn new(setup: &LayerSetup<'_>) -> Result<Self> {
        let LayerSetup {
            cfg,
            ds,
            model,
            fanouts,
            train_ids,
            batch_size,
            seed,
        } = setup;
        let (ds, batch_size, seed) = (Arc::clone(ds), *batch_size, *seed);
        let cpu_workers = cfg.cpu_workers;
        let name = match cfg.hotness {
            HotnessKind::Presample => "presample",
            HotnessKind::Degree => "degree",
        };
        let policy = HotnessPolicy::from_name(name, cfg.presample_epochs)
            .map_err(sched("orchestration.hotness"))?;
        let sampler = NeighborSampler::new(fanouts.to_vec())
            .map_err(|e| Error::cpu_ops("train.fanouts", e))?;
        let scores = policy
            .scores(&ds.graph, &sampler, train_ids, batch_size, seed)
            .map_err(sched("hotness scores"))?;
        let relabeling = Relabeling::by_score(&scores, cfg.hot_ratio)
            .map_err(sched("orchestration.hot_ratio"))?;
        let hot = relabeling.hot_count();
        let pipeline = PipelineConfig::new(cfg.super_batch, DEPTH, HOT_CHUNK)
            .and_then(|p| p.with_min_chunks(cpu_workers.max(1)))
            .map_err(sched("orchestration.super_batch"))?;
        let bottom_fanout = *fanouts.first().ok_or_else(|| {
            Error::invalid_argument("train.fanouts", "orchestration needs at least one layer")
        })?;
        Ok(Self {
            split: HotSplit::all_cpu(hot),
            bound: cfg.staleness_bound,
            on_late: cfg.on_late.to_scheduler(),
            hot_grad: cfg.hot_backward.to_device(),
            pipeline,
            workers_wanted: cpu_workers.max(1),
            bottom_fanout,
            model: (*model).clone(),
            ds,
            relabeling,
            totals: OrchestrationStats {
                hot_count: hot,
                ..OrchestrationStats::default()
            },
            last_epoch: None,
            fault: None,
            use_monitor: cfg.monitor,
            monitor: None,
            workers: None,
            pin_from: None,
            clock: wall_clock(),
            next_super_batch: 0,
            min_live: Arc::new(AtomicU64::new(0)),
            trace: (Tracer::disabled(), Vec::new()),
            count_splits: Vec::new(),
            split_counts: (Vec::new(), 0),
            mark: None,
        })
    }

    /// The relabeling (hot = relabeled id below `hot_count`; `old_id` maps back).
    pub fn relabeling(&self) -> &Relabeling {
        &self.relabeling
    }

    /// Totals over every epoch run so far.
    pub fn totals(&self) -> &OrchestrationStats {
        &self.totals
    }

    /// The statistics of the last epoch run.
    pub fn last_epoch(&self) -> Option<&OrchestrationStats> {
        self.last_epoch.as_ref()
    }

    /// Hot vertices (relabeled ids below this).
    pub fn hot_count(&self) -> u32 {
        self.split.hot()
    }

    /// The CPU computes hot ids `0..cpu` from the next epoch run on (the rest of
    /// the hot set is treated as cold); clamped to the hot set.
    pub fn set_cpu_split(&mut self, cpu: u32) -> Result<()> {
        let hot = self.split.hot();
        self.split = HotSplit::new(hot, cpu.min(hot)).map_err(sched("orchestration CPU split"))?;
        Ok(())
    }

    /// The CPU's share of the hot set now.
    pub fn cpu_split(&self) -> u32 {
        self.split.cpu()
    }

    /// Starts counting, for each of `splits`, the rows the CPU would compute and
    /// the positions the accelerator would skip in every launched batch.
    pub fn count_splits(&mut self, splits: Vec<u32>) {
        self.split_counts = (vec![(0, 0); splits.len()], 0);
        self.count_splits = splits;
    }

    /// The counts since [`Orchestrator::count_splits`], per batch; stops counting.
    pub fn take_split_counts(&mut self) -> Vec<scheduler::SplitCounts> {
        let (sums, batches) = std::mem::take(&mut self.split_counts);
        let n = batches.max(1) as f64;
        let out = self
            .count_splits
            .iter()
            .zip(sums)
            .map(|(&split, (rows, entries))| scheduler::SplitCounts {
                split,
                rows_per_batch: rows as f64 / n,
                entries_per_batch: entries as f64 / n,
            })
            .collect();
        self.count_splits.clear();
        out
    }

    /// Clock seconds and statistics when the last run's marked batch started
    /// ([`EpochRun::mark`]).
    pub(crate) fn last_mark(&self) -> Option<&(f64, OrchestrationStats)> {
        self.mark.as_ref()
    }

    /// The clock the measurements read.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// Turns the hybrid monitor on from the next epoch (starting from the
    /// current split), as `orchestration.monitor = true` does from the start.
    pub fn enable_monitor(&mut self) {
        self.use_monitor = true;
    }

    /// CPU workers.
    pub fn workers(&self) -> usize {
        self.workers_wanted
    }

    /// Injects a fault into the CPU workers from now on (tests).
    #[cfg(test)]
    pub fn inject_fault(&mut self, fault: Option<InjectedFault>) {
        self.fault = fault;
        if let Some(w) = &self.workers {
            *w.shared().fault.lock() = fault;
        }
    }

    /// Pins the workers to cores `first..` (after the compute pool's) from their
    /// next start.
    pub(crate) fn pin_workers_from(&mut self, first: Option<usize>) {
        self.pin_from = first;
    }

    /// Records the workers' `hot compute` slices into `tracer` from now on, on one
    /// `hot worker i` track each (declared once per tracer).
    pub fn set_tracer(&mut self, tracer: &Tracer) {
        let tracks: Vec<TrackId> = (0..self.workers_wanted)
            .map(|i| tracer.declare_track(format!("hot worker {i}"), TrackKind::Cpu))
            .collect();
        if let Some(w) = &self.workers {
            w.set_trace(tracer, &tracks);
        }
        self.trace = (tracer.clone(), tracks);
    }

    /// Replaces the clock the measurements read (tests inject a manual one).
    pub fn set_clock(&mut self, clock: SharedClock) {
        self.clock = clock;
        self.workers = None;
    }

    /// The workers, started if needed (step 1).
    fn ensure_workers(&mut self, engine: &dyn LayerDevice) -> Result<()> {
        if self.workers.is_none() {
            let sampler = NeighborSampler::new(vec![self.bottom_fanout])
                .map_err(|e| Error::cpu_ops("train.fanouts", e))?;
            let computer = HotComputer {
                ds: Arc::clone(&self.ds),
                model: self.model.clone(),
                sampler,
            };
            let shared = Arc::new(WorkerShared {
                published: Published::new(Snapshot {
                    version: engine.version(),
                    tensors: engine.layer0_params()?,
                }),
                passed: AtomicU64::new(0),
                min_live: Arc::clone(&self.min_live),
                fault: Mutex::new(self.fault),
                clock: Arc::clone(&self.clock),
                tracer: Mutex::new(self.trace.clone()),
            });
            let chunk = self.pipeline.hot_chunk();
            self.workers = Some(HotWorkers::start(
                self.workers_wanted,
                computer,
                shared,
                chunk,
                |rows| engine.new_staging(rows),
                self.pin_from,
            )?);
        }
        Ok(())
    }

    /// Runs batches `run.start..` of an epoch through the pipeline (module doc);
    /// `on_batch` sees every trained batch and returns whether to stop after it.
    pub(crate) fn run_epoch(
        &mut self,
        engine: &mut dyn LayerDevice,
        run: &EpochRun<'_>,
        on_batch: &mut dyn FnMut(&BatchDone) -> Result<bool>,
    ) -> Result<EpochEnd> {
        let acc_track = run.acc_track;
        self.ensure_workers(&*engine)?;
        if self.use_monitor && self.monitor.is_none() {
            self.monitor = Some(HybridMonitor::new(
                &*engine,
                run.ds,
                self.pipeline,
                self.split,
                self.workers_wanted,
            )?);
        }
        let Some(workers) = self.workers.as_ref() else {
            return Err(Error::invalid_argument(
                "orchestration",
                "internal: workers not started",
            ));
        };
        // Step 2 at the epoch's start (a checkpoint may have moved the weights back).
        workers
            .shared()
            .passed
            .store(engine.version(), Ordering::Release);
        workers.shared().published.reset(Snapshot {
            version: engine.version(),
            tensors: engine.layer0_params()?,
        });
        let mut acc = Accelerator {
            bound: self.bound,
            on_late: self.on_late,
            pipeline: self.pipeline,
            split: self.split,
            relabeling: &self.relabeling,
            run,
            workers,
            acc_track,
            hot_grad: self.hot_grad,
            clock: Arc::clone(&self.clock),
            stats: OrchestrationStats {
                hot_count: self.split.hot(),
                ..OrchestrationStats::default()
            },
            next_sb: self.next_super_batch,
            urgent_seq: 0,
            count_splits: &self.count_splits,
            split_counts: std::mem::take(&mut self.split_counts),
            mark: None,
            v0: engine.version(),
        };
        let result = acc.run(engine, on_batch, self.monitor.as_mut());
        self.next_super_batch = acc.next_sb;
        self.split_counts = std::mem::take(&mut acc.split_counts);
        self.mark = acc.mark.take();
        // Step 8: nothing queued for this epoch is worth computing any more.
        self.min_live
            .store(self.next_super_batch, Ordering::Release);
        let stats = std::mem::take(&mut acc.stats);
        drop(acc);
        engine.discard_prepared();
        self.totals.merge(&stats);
        self.last_epoch = Some(stats);
        if matches!(&result, Err(Error::Worker { .. })) {
            // A worker failed: start a fresh set next epoch.
            self.workers = None;
        }
        result
    }
}

/// Where a chunk stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChunkState {
    /// Queued or being computed.
    Pending,
    /// Its rows are in the slab, computed with weights of this version.
    Ready(u64),
}

/// One chunk of a launched super-batch's queue.
struct Chunk {
    /// Queue positions (= slab rows).
    range: Range<u32>,
    /// User ids of the queue positions.
    ids: Arc<[u32]>,
    state: ChunkState,
    claim: Arc<AtomicBool>,
    flow: FlowId,
    flow_used: bool,
    /// An urgent job for it is queued or running.
    urgent: bool,
}

/// A super-batch whose top layers are sampled and whose queue is out (step 3).
struct Launched {
    /// Global super-batch index.
    g: u64,
    /// Local super-batch index in the epoch.
    j: u64,
    slab: usize,
    /// Batch indices in the epoch.
    batches: Range<usize>,
    /// Per batch: (position among block 0's destinations, queue index) of its
    /// CPU-hot bottom destinations.
    entries: Vec<Vec<(u32, u32)>>,
    /// Per batch: the chunks it reads, sorted.
    reads: Vec<Vec<u32>>,
    /// Chunk of each queue index.
    chunk_of: Vec<u32>,
    chunks: Vec<Chunk>,
}

/// What a batch's gate let through (step 5).
struct Gated {
    /// Positions among block 0's destinations that take slab rows.
    positions: Vec<u32>,
    /// The slab row of each position.
    rows: Vec<u32>,
    /// The largest gap used.
    max_gap: Option<u64>,
    /// Flows of chunks first read by this batch.
    flows: Vec<FlowId>,
}

/// The accelerator thread's side (steps 2–7).
struct Accelerator<'a> {
    bound: u64,
    on_late: OnLate,
    pipeline: PipelineConfig,
    split: HotSplit,
    relabeling: &'a Relabeling,
    run: &'a EpochRun<'a>,
    workers: &'a HotWorkers,
    acc_track: TrackId,
    hot_grad: gpu_ops::HotGrad,
    clock: SharedClock,
    stats: OrchestrationStats,
    next_sb: u64,
    urgent_seq: u64,
    count_splits: &'a [u32],
    split_counts: (Vec<(u64, u64)>, u64),
    mark: Option<(f64, OrchestrationStats)>,
    /// The engine's version when the run started (batch `start` trains at it).
    v0: u64,
}

impl Accelerator<'_> {
    fn publish(&self, engine: &dyn LayerDevice) -> Result<()> {
        let published = &self.workers.shared().published;
        if published.version() == engine.version() {
            return Ok(());
        }
        let _s = self.run.tracer.slice_on(self.acc_track, "publish");
        published.publish(Snapshot {
            version: engine.version(),
            tensors: engine.layer0_params()?,
        });
        Ok(())
    }

    /// Step 3 for local super-batch `j` (batches from `run.start`).
    fn launch(
        &mut self,
        engine: &mut dyn LayerDevice,
        j: u64,
        split: HotSplit,
    ) -> Result<Launched> {
        let run = self.run;
        let g = self.next_sb + j;
        let mut slice = run
            .tracer
            .slice_on(self.acc_track, "launch")
            .epoch(run.epoch as u64)
            .super_batch(j);
        let n = self.pipeline.batches_per_super_batch();
        let total = run.end.min(run.batches.len());
        let first = run.start + j as usize * n;
        let last = (first + n).min(total);
        let mut bottom: Vec<Vec<u32>> = Vec::with_capacity(last - first);
        for k in first..last {
            let ids = engine.prepare_top(
                k as u64,
                run.batches[k],
                derive_seed(run.base_seed, k as u64),
            )?;
            bottom.push(ids.iter().map(|&v| self.relabeling.new_id(v)).collect());
        }
        if !self.count_splits.is_empty() {
            // `policy = "auto"`: what each candidate split would cost here.
            let mut all: Vec<u32> = bottom.iter().flatten().copied().collect();
            all.sort_unstable();
            all.dedup();
            let (sums, batches) = &mut self.split_counts;
            sums.resize(self.count_splits.len(), (0, 0));
            *batches += bottom.len() as u64;
            for (i, &c) in self.count_splits.iter().enumerate() {
                sums[i].0 += all.partition_point(|&v| v < c) as u64;
                sums[i].1 += bottom
                    .iter()
                    .map(|b| b.iter().filter(|&&v| v < c).count() as u64)
                    .sum::<u64>();
            }
        }
        // Batch `k` of the epoch trains at version `v0 + (k − start)`.
        let global = |k: usize| self.v0 + (k - run.start) as u64;
        let plan = SuperBatchPlan::new(j, global(first), split, &bottom);
        let queue = &plan.queue;
        let slab = (g % 2) as usize;
        engine.hot_slab_reserve(slab, queue.len())?;
        // Queue index of each CPU-hot vertex: the queue is sorted, so a binary
        // search per bottom destination.
        let mut chunks = Vec::new();
        let mut chunk_of = vec![0u32; queue.len()];
        for (c, (range, ids)) in plan.chunks(&self.pipeline).enumerate() {
            let user: Arc<[u32]> = ids.iter().map(|&r| self.relabeling.old_id(r)).collect();
            for q in range.clone() {
                chunk_of[q] = c as u32;
            }
            let chunk = Chunk {
                range: range.start as u32..range.end as u32,
                ids: user,
                state: ChunkState::Pending,
                claim: Arc::new(AtomicBool::new(false)),
                flow: run.tracer.flow("hot compute→train"),
                flow_used: false,
                urgent: false,
            };
            self.workers.push(Job {
                key: ChunkKey {
                    super_batch: g,
                    chunk: c as u32,
                },
                ids: Arc::clone(&chunk.ids),
                last_batch: global(last - 1),
                seed: derive_seed(derive_seed(run.base_seed, 5_000_000 + j), c as u64),
                urgent: false,
                claim: Arc::clone(&chunk.claim),
                flow: chunk.flow,
            })?;
            chunks.push(chunk);
        }
        let mut entries = Vec::with_capacity(bottom.len());
        let mut reads = Vec::with_capacity(bottom.len());
        for (bi, b) in bottom.iter().enumerate() {
            let mut e = Vec::new();
            let mut r: Vec<u32> = Vec::new();
            // A batch's seeds are the first positions of every layer's
            // destinations; they never take a hot row (see step 3).
            let seeds = run.batches[first + bi].len();
            for (p, &v) in b.iter().enumerate() {
                if v >= split.cpu() || p < seeds {
                    continue;
                }
                let q = queue.binary_search(&v).map_err(|_| {
                    Error::invalid_argument(
                        "orchestration",
                        format!("internal: CPU-hot vertex {v} missing from its queue"),
                    )
                })? as u32;
                e.push((p as u32, q));
                r.push(chunk_of[q as usize]);
            }
            r.sort_unstable();
            r.dedup();
            entries.push(e);
            reads.push(r);
        }
        slice.set_bytes((queue.len() * 4) as u64);
        Ok(Launched {
            g,
            j,
            slab,
            batches: first..last,
            entries,
            reads,
            chunk_of,
            chunks,
        })
    }

    /// Step 4 for one report.
    fn handle(
        &mut self,
        engine: &mut dyn LayerDevice,
        live: &mut VecDeque<Launched>,
        d: Done,
    ) -> Result<()> {
        self.stats.cpu_busy_secs += d.busy_secs;
        match d.outcome {
            Outcome::Failed(e) => Err(e),
            Outcome::Dropped => {
                self.stats.dropped_jobs += 1;
                Ok(())
            }
            Outcome::Rows {
                version,
                rows,
                mut staging,
            } => {
                self.stats.jobs += 1;
                self.stats.rows_computed += rows as u64;
                let target = live
                    .iter_mut()
                    .find(|l| l.g == d.key.super_batch)
                    .and_then(|l| {
                        let slab = l.slab;
                        l.chunks.get_mut(d.key.chunk as usize).map(|c| (slab, c))
                    });
                let result = match target {
                    Some((slab, c))
                        if matches!(c.state, ChunkState::Pending)
                            || matches!(c.state, ChunkState::Ready(e) if e < version) =>
                    {
                        let n = c.range.len();
                        let r = engine.hot_install(slab, c.range.start as usize, n, &mut *staging);
                        if r.is_ok() {
                            c.state = ChunkState::Ready(version);
                            c.urgent = false;
                            self.stats.rows_installed += n as u64;
                            let bytes = (n * engine.hot_width() * 4) as u64;
                            self.run
                                .tracer
                                .instant_on(self.acc_track, "hot install", |a| {
                                    a.super_batch = Some(d.key.super_batch);
                                    a.bytes = Some(bytes);
                                    a.direction = Some(Direction::HostToDevice);
                                    a.extra.push(("rows".into(), n as f64));
                                    a.extra.push(("version".into(), version as f64));
                                });
                        }
                        r
                    }
                    _ => Ok(()),
                };
                self.workers.recycle(staging);
                result
            }
        }
    }

    /// Step 4: every report waiting.
    fn drain(&mut self, engine: &mut dyn LayerDevice, live: &mut VecDeque<Launched>) -> Result<()> {
        while let Some(d) = self.workers.try_done() {
            self.handle(engine, live, d)?;
        }
        Ok(())
    }

    /// Whether chunk `c` is usable at batch version `b`.
    fn usable(&self, state: ChunkState, b: u64) -> bool {
        matches!(state, ChunkState::Ready(e) if e <= b && b - e <= self.bound)
    }

    /// Step 5, `"wait"`: queues urgent work for the late chunks of batch `i` of
    /// `live[0]`.
    fn send_urgent(
        &mut self,
        engine: &dyn LayerDevice,
        sb: &mut Launched,
        late: &[u32],
        b: u64,
    ) -> Result<()> {
        let oldest = b.saturating_sub(self.bound);
        for &c in late {
            let chunk = &mut sb.chunks[c as usize];
            if chunk.urgent {
                continue;
            }
            let recompute = matches!(chunk.state, ChunkState::Ready(e) if e < oldest);
            if recompute {
                // The recomputation must read weights of version ≥ b − bound.
                if self.workers.shared().published.version() < oldest {
                    self.publish(engine)?;
                }
                chunk.claim = Arc::new(AtomicBool::new(false));
            }
            self.urgent_seq += 1;
            self.stats.urgent_jobs += 1;
            chunk.urgent = true;
            self.workers.push(Job {
                key: ChunkKey {
                    super_batch: sb.g,
                    chunk: c,
                },
                ids: Arc::clone(&chunk.ids),
                last_batch: b,
                seed: derive_seed(derive_seed(self.run.base_seed, 6_000_000), self.urgent_seq),
                urgent: true,
                claim: Arc::clone(&chunk.claim),
                flow: FlowId::NONE,
            })?;
        }
        Ok(())
    }

    /// Step 5 for batch `i` of `live[0]` at version `b`.
    fn gate(
        &mut self,
        engine: &mut dyn LayerDevice,
        live: &mut VecDeque<Launched>,
        i: usize,
        b: u64,
    ) -> Result<Gated> {
        let _gate = self.run.tracer.slice_on(self.acc_track, "gate").batch(b);
        self.drain(engine, live)?;
        let late: Vec<u32> = {
            let sb = &live[0];
            sb.reads[i]
                .iter()
                .copied()
                .filter(|&c| !self.usable(sb.chunks[c as usize].state, b))
                .collect()
        };
        let mut skip = vec![false; live[0].chunks.len()];
        if !late.is_empty() {
            let late_rows: u64 = {
                let sb = &live[0];
                sb.entries[i]
                    .iter()
                    .filter(|(_, q)| late.binary_search(&sb.chunk_of[*q as usize]).is_ok())
                    .count() as u64
            };
            match self.on_late {
                OnLate::Compute => {
                    self.stats.computed_cold += late_rows;
                    self.run
                        .tracer
                        .instant_on(self.acc_track, "compute cold", |a| {
                            a.batch = Some(b);
                            a.extra.push(("vertices".into(), late_rows as f64));
                        });
                    for &c in &late {
                        skip[c as usize] = true;
                    }
                }
                OnLate::Wait => {
                    let t = self.clock.now();
                    let mut waiting = self
                        .run
                        .tracer
                        .slice_on(self.acc_track, "hot wait")
                        .batch(b);
                    waiting.set_bytes(late_rows);
                    loop {
                        let still: Vec<u32> = late
                            .iter()
                            .copied()
                            .filter(|&c| !self.usable(live[0].chunks[c as usize].state, b))
                            .collect();
                        if still.is_empty() {
                            break;
                        }
                        let mut sb = live.pop_front().ok_or_else(|| {
                            Error::invalid_argument(
                                "orchestration",
                                "internal: no live super-batch",
                            )
                        })?;
                        let sent = self.send_urgent(&*engine, &mut sb, &still, b);
                        live.push_front(sb);
                        sent?;
                        let d = self.workers.wait_done()?;
                        self.handle(engine, live, d)?;
                        self.drain(engine, live)?;
                    }
                    drop(waiting);
                    self.stats.waited += late_rows;
                    self.stats.wait_batches += 1;
                    self.stats.wait_secs += (self.clock.now().saturating_sub(t)).as_secs_f64();
                }
            }
        }
        let sb = &mut live[0];
        let mut positions = Vec::with_capacity(sb.entries[i].len());
        let mut rows = Vec::with_capacity(sb.entries[i].len());
        let mut gaps = GapHistogram::new();
        let mut max_gap = None;
        for &(p, q) in &sb.entries[i] {
            let c = sb.chunk_of[q as usize] as usize;
            if skip[c] {
                continue;
            }
            let ChunkState::Ready(e) = sb.chunks[c].state else {
                return Err(Error::invalid_argument(
                    "orchestration",
                    format!("internal: chunk {c} passed the gate without rows"),
                ));
            };
            if e > b || b - e > self.bound {
                return Err(Error::invalid_argument(
                    "orchestration",
                    format!(
                        "internal: a row of version {e} at batch version {b} (bound {})",
                        self.bound
                    ),
                ));
            }
            gaps.record(b - e);
            max_gap = max_gap.max(Some(b - e));
            positions.push(p);
            rows.push(q);
        }
        let mut flows = Vec::new();
        for &c in &sb.reads[i] {
            let chunk = &mut sb.chunks[c as usize];
            if !skip[c as usize] && !chunk.flow_used {
                chunk.flow_used = true;
                flows.push(chunk.flow);
            }
        }
        self.stats.hot_uses += gaps.total();
        self.stats.gaps.merge(&gaps);
        Ok(Gated {
            positions,
            rows,
            max_gap,
            flows,
        })
    }

    /// Steps 2–7 for every super-batch of the epoch, with the hybrid monitor's
    /// steps (`orchestrate::monitor`) around each super-batch when it runs.
    fn run(
        &mut self,
        engine: &mut dyn LayerDevice,
        on_batch: &mut dyn FnMut(&BatchDone) -> Result<bool>,
        mut monitor: Option<&mut HybridMonitor>,
    ) -> Result<EpochEnd> {
        let run = self.run;
        let total = run.end.min(run.batches.len());
        let epoch_len = run.batches.len();
        if run.start >= total {
            return Ok(EpochEnd::Finished(false));
        }
        let n = self.pipeline.batches_per_super_batch();
        let num_sb = (total - run.start).div_ceil(n) as u64;
        let base = monitor.as_deref_mut().map_or(0, |m| m.start_epoch(num_sb));
        let default_split = self.split;
        let split_for = |m: &Option<&mut HybridMonitor>, j: u64| {
            m.as_deref()
                .map_or(default_split, |m| m.split_for(base + j))
        };
        let v0 = engine.version();
        self.v0 = v0;
        let mut live: VecDeque<Launched> = VecDeque::new();
        let result = (|| -> Result<EpochEnd> {
            for j in 0..=(DEPTH as u64).min(num_sb - 1) {
                let split = split_for(&monitor, j);
                let l = self.launch(engine, j, split)?;
                live.push_back(l);
            }
            let mut window = Window::open(&self.stats, &*self.clock);
            for j in 0..num_sb {
                if let Some(m) = monitor.as_deref_mut() {
                    m.begin_super_batch(base + j, engine, self.relabeling)?;
                }
                if j > 0 && j + (DEPTH as u64) < num_sb {
                    let split = split_for(&monitor, j + DEPTH as u64);
                    let l = self.launch(engine, j + DEPTH as u64, split)?;
                    live.push_back(l);
                }
                if live.front().map(|l| l.j) != Some(j) {
                    return Err(Error::Worker {
                        worker: "pipeline".into(),
                        what: format!("internal: super-batch {j} was not launched"),
                    });
                }
                let batches = live[0].batches.clone();
                for (i, k) in batches.enumerate() {
                    if run.cancel.is_cancelled() {
                        return Ok(EpochEnd::Stopped(k, StopCause::Token));
                    }
                    // Batch `k` runs at `v0 + (k − start)` minus the batches skipped
                    // for a non-finite loss (their step was not applied).
                    let b = engine.version();
                    if b > v0 + (k - run.start) as u64 {
                        return Err(Error::invalid_argument(
                            "orchestration",
                            format!("internal: batch {k} runs at version {b}"),
                        ));
                    }
                    let t = self.clock.now();
                    if run.mark == Some(k) {
                        self.mark = Some((t.as_secs_f64(), self.stats.clone()));
                    }
                    let Gated {
                        positions,
                        rows,
                        max_gap,
                        flows,
                    } = self.gate(engine, &mut live, i, b)?;
                    let mut slice = run
                        .tracer
                        .slice_on(self.acc_track, "train")
                        .epoch(run.epoch as u64)
                        .batch(k as u64)
                        .super_batch(j);
                    if let Some(g) = max_gap {
                        slice.set_staleness_gap(g);
                    }
                    for flow in flows {
                        slice.flow_in(flow);
                    }
                    let h2d_before = engine.h2d_bytes();
                    let copies_before = engine.transfer_stats();
                    let (loss_sum, correct) = engine.train_prepared(
                        k as u64,
                        run.batches[k],
                        derive_seed(run.base_seed, k as u64),
                        &HotUse {
                            slab: live[0].slab,
                            positions: &positions,
                            rows: &rows,
                            grad: self.hot_grad,
                        },
                    )?;
                    slice.set_transfer(
                        Direction::HostToDevice,
                        engine.h2d_bytes().saturating_sub(h2d_before),
                    );
                    // What crossed between host and device in the batch's step (the
                    // gate's installs and the launch's downloads are not in it).
                    let copies = engine.transfer_stats().since(&copies_before);
                    record_copies(slice.args_mut(), &copies);
                    if let Some(a) = slice.args_mut() {
                        a.extra.push(("hot_rows".into(), positions.len() as f64));
                    }
                    drop(slice);
                    self.workers.shared().passed.store(b + 1, Ordering::Release);
                    if self.bound < self.pipeline.on_time_gap() {
                        // A bound tighter than the pipeline's on-time gap (step 2):
                        // rows are usable only if computed with nearly current
                        // weights, so every step is published.
                        self.publish(&*engine)?;
                    }
                    let done = BatchDone {
                        k,
                        loss_sum,
                        correct,
                        seconds: (self.clock.now().saturating_sub(t)).as_secs_f64(),
                        version: engine.version(),
                    };
                    if on_batch(&done)? {
                        if k + 1 < epoch_len {
                            return Ok(EpochEnd::Stopped(k + 1, StopCause::Callback));
                        }
                        return Ok(EpochEnd::Finished(true));
                    }
                }
                live.pop_front();
                self.publish(&*engine)?;
                if let Some(m) = monitor.as_deref_mut() {
                    m.end_super_batch(
                        base + j,
                        j,
                        num_sb,
                        &window,
                        &*self.clock,
                        &mut self.stats,
                        engine,
                        self.relabeling,
                        run.tracer,
                        self.acc_track,
                    )?;
                    window = Window::open(&self.stats, &*self.clock);
                }
            }
            Ok(EpochEnd::Finished(false))
        })();
        // Reports that already arrived give their staging buffers back now.
        let drained = self.drain(engine, &mut VecDeque::new());
        self.next_sb += num_sb;
        match (result, drained) {
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(e),
            (Ok(r), Ok(())) => Ok(r),
        }
    }
}
