//! The super-batch pipeline executor: layer-based orchestration of one epoch on a
//! device [`Engine`] and CPU worker threads (docs/orchestration.md §4, §5, §9).
//!
//! # Protocol (one epoch)
//! 1. **Setup** (once per trainer, [`Orchestrator::new`]): score hotness
//!    (`orchestration.hotness`), build the [`Relabeling`] (hot = relabeled id below
//!    `hot_count`), an empty [`HotTable`] (it persists across epochs: versions are
//!    global optimizer steps).
//! 2. **Publish** the engine's layer-0 weights with their version.
//! 3. **Workers.** Start `cpu_workers` scoped threads. Each takes jobs from the
//!    [`JobQueue`] (urgent ones first), reads the newest published weights once,
//!    computes the chunk ([`HotComputer`]) and writes it to the table. A regular
//!    job whose super-batch has passed every gate is dropped unstarted.
//! 4. **Sample ahead.** Super-batch `j`'s batches are sampled on the engine
//!    ([`Engine::prepare_batch`]) and its hot queue planned
//!    ([`SuperBatchPlan::new`]) and queued when super-batch `j − D` starts
//!    (`D = 1`); super-batches `0..=D` at once. So at most `D + 1` super-batches of
//!    sampled blocks and queued work exist: nothing runs ahead without limit.
//! 5. **Gate**, per batch `b` (the engine's version): for each CPU-hot bottom
//!    destination, [`StalenessRule::decide`] on its slot version. `Use`: take the
//!    row, record the gap. `ComputeCold`: leave the row to the accelerator's own
//!    layer 0 (counted). `Wait`: vertices that no in-bound task is computing go to
//!    the CPU as one urgent job; the thread blocks on the table until every late
//!    vertex is usable (checking the abort flag at least every 50 ms).
//! 6. **Train** the batch with its rows ([`Engine::train_prepared`]), then publish
//!    (step 2) the new version.
//! 7. **Shutdown.** On the last batch, a stop, an error on this thread, or a
//!    worker's error or panic (caught with `catch_unwind`, stored, abort flag set):
//!    close the queue, wake every waiter, join the workers (each finishes at most
//!    its current chunk), forget sampled-ahead batches, and return the first error —
//!    a worker's before the abort it caused.
//!
//! Trace: `hot compute` slices (with `super_batch`) on `hot worker i` tracks, `train`
//! slices (with `staleness_gap` = the batch's largest gap) on `acc stream compute`,
//! a flow from each finished chunk to the first batch that uses its rows, and
//! instants `hot wait` (vertices awaited) and `compute cold` (late vertices).

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cpu_ops::{derive_seed, Model, NeighborSampler, SamplerScratch};
use scheduler::{
    Decision, GapHistogram, HotSplit, HotnessPolicy, PipelineConfig, Relabeling, StalenessRule,
    SuperBatchPlan, VertexClass,
};

use crate::config::{HotnessKind, OrchestrationSection};
use crate::control::{CancelToken, StopCause};
use crate::dataset::Dataset;
use crate::engine::{Engine, HostHotRows};
use crate::error::{Error, Result};
use crate::trace::{Direction, FlowId, Tracer, TrackId, TrackKind};

use super::hot_compute::{HotComputer, Published, Snapshot};
use super::hot_table::HotTable;
use super::monitor::{HybridMonitor, Window};

/// Pipeline depth `D` (NeutronOrch's: the CPU works one super-batch ahead).
pub const DEPTH: usize = 1;
/// Largest number of vertices per CPU job.
pub const HOT_CHUNK: usize = 256;
/// How often a blocked thread checks the abort flag.
const POLL: Duration = Duration::from_millis(50);

/// What orchestration did, summed over the epochs it ran.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OrchestrationStats {
    /// Gap (optimizer steps) of every reused embedding.
    pub gaps: GapHistogram,
    /// Reused embeddings (= `gaps.total()`).
    pub hot_uses: u64,
    /// Late vertices a batch waited for (`on_late = "wait"`).
    pub waited: u64,
    /// Batches that waited.
    pub wait_batches: u64,
    /// Seconds the accelerator thread spent waiting for hot embeddings.
    pub wait_secs: f64,
    /// Late vertices computed on the accelerator (`on_late = "compute"`).
    pub computed_cold: u64,
    /// Urgent CPU jobs sent by waiting batches.
    pub urgent_jobs: u64,
    /// CPU jobs computed (regular and urgent).
    pub jobs: u64,
    /// Regular jobs dropped because every batch of their super-batch had passed.
    pub dropped_jobs: u64,
    /// Hot rows computed by the CPU.
    pub rows_computed: u64,
    /// Worker-seconds spent computing hot rows.
    pub cpu_busy_secs: f64,
    /// Hot vertices (relabeled ids below this are hot).
    pub hot_count: u32,
    /// Whether the hybrid monitor ran (`orchestration.monitor`).
    pub monitor: bool,
    /// Monitor moves of hot vertices to the device cache.
    pub monitor_moves_to_cache: u64,
    /// Monitor moves of hot vertices back to the CPU.
    pub monitor_moves_to_cpu: u64,
    /// Vertices the monitor moved to the cache (only rows the cache took count).
    pub monitor_rows_to_cache: u64,
    /// Vertices the monitor moved back to the CPU.
    pub monitor_rows_to_cpu: u64,
    /// Rows the monitor's moves held in the device cache at the end.
    pub monitor_cached_rows: u64,
    /// Moves against the previous move's direction.
    pub monitor_reversals: u64,
}

impl OrchestrationStats {
    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &OrchestrationStats) {
        self.gaps.merge(&other.gaps);
        self.hot_uses += other.hot_uses;
        self.waited += other.waited;
        self.wait_batches += other.wait_batches;
        self.wait_secs += other.wait_secs;
        self.computed_cold += other.computed_cold;
        self.urgent_jobs += other.urgent_jobs;
        self.jobs += other.jobs;
        self.dropped_jobs += other.dropped_jobs;
        self.rows_computed += other.rows_computed;
        self.cpu_busy_secs += other.cpu_busy_secs;
        self.hot_count = self.hot_count.max(other.hot_count);
        self.monitor |= other.monitor;
        self.monitor_moves_to_cache += other.monitor_moves_to_cache;
        self.monitor_moves_to_cpu += other.monitor_moves_to_cpu;
        self.monitor_rows_to_cache += other.monitor_rows_to_cache;
        self.monitor_rows_to_cpu += other.monitor_rows_to_cpu;
        if other.monitor {
            self.monitor_cached_rows = other.monitor_cached_rows;
        }
        self.monitor_reversals += other.monitor_reversals;
    }

    /// One line: gap max/mean, uses, waits, computed-cold, CPU jobs, and the
    /// monitor's moves when it ran.
    pub fn summary(&self) -> String {
        let max = self
            .gaps
            .max()
            .map_or_else(|| "-".into(), |m| m.to_string());
        let mean = self
            .gaps
            .mean()
            .map_or_else(|| "-".into(), |m| format!("{m:.2}"));
        let mut line = format!(
            "hot: {} reused (gap max {max}, mean {mean}), {} waited ({:.3} s), {} computed cold, {} CPU jobs ({} urgent, {} dropped)",
            self.hot_uses,
            self.waited,
            self.wait_secs,
            self.computed_cold,
            self.jobs,
            self.urgent_jobs,
            self.dropped_jobs
        );
        if self.monitor {
            line.push_str(&format!(
                "; monitor: {} moves to cache ({} rows), {} to CPU ({} rows), {} rows cached, {} reversals",
                self.monitor_moves_to_cache,
                self.monitor_rows_to_cache,
                self.monitor_moves_to_cpu,
                self.monitor_rows_to_cpu,
                self.monitor_cached_rows,
                self.monitor_reversals
            ));
        }
        line
    }
}

/// A fault injected into a CPU worker (tests of the shutdown protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectedFault {
    /// The worker returns an error after this many jobs.
    ErrorAfter(u64),
    /// The worker panics after this many jobs.
    PanicAfter(u64),
    /// The worker sleeps this long per vertex of every chunk, counted as busy
    /// time (a slow CPU, for tests of the hybrid monitor).
    SlowCpu(Duration),
}

/// One CPU job: a chunk of a hot queue.
struct Job {
    super_batch: u64,
    ids: Vec<u32>,
    /// Global index of the last batch of its super-batch (drop once it passed).
    last_batch: u64,
    urgent: bool,
    seed: u64,
    flow: FlowId,
    done: Arc<AtomicBool>,
}

/// The CPU jobs: a deque (urgent jobs at the front) behind a mutex, closed at
/// shutdown.
struct JobQueue {
    inner: Mutex<(VecDeque<Job>, bool)>,
    ready: Condvar,
}

impl JobQueue {
    fn new() -> Self {
        Self {
            inner: Mutex::new((VecDeque::new(), false)),
            ready: Condvar::new(),
        }
    }

    fn push(&self, job: Job) {
        let mut q = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if job.urgent {
            q.0.push_front(job);
        } else {
            q.0.push_back(job);
        }
        self.ready.notify_one();
    }

    fn close(&self) {
        let mut q = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        q.1 = true;
        q.0.clear();
        self.ready.notify_all();
    }

    /// The next job; `None` once closed or aborted.
    fn pop(&self, abort: &AtomicBool) -> Option<Job> {
        let mut q = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if q.1 || abort.load(Ordering::Acquire) {
                return None;
            }
            if let Some(j) = q.0.pop_front() {
                return Some(j);
            }
            q = self
                .ready
                .wait_timeout(q, POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// State shared by the accelerator thread and the workers for one epoch.
struct Shared<'a> {
    table: &'a HotTable,
    published: Published,
    queue: JobQueue,
    abort: AtomicBool,
    failure: Mutex<Option<Error>>,
    /// Global index + 1 of the last batch past its gate.
    passed: AtomicU64,
    stats: Mutex<OrchestrationStats>,
}

impl Shared<'_> {
    fn fail(&self, e: Error) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(e);
        }
        drop(f);
        self.abort.store(true, Ordering::Release);
        self.queue.close();
        self.table.bump();
    }

    fn take_failure(&self) -> Option<Error> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

/// The inputs of one epoch.
pub(crate) struct EpochRun<'a> {
    /// The dataset (user ids).
    pub ds: &'a Dataset,
    /// The epoch's batches (seeds), in the trainer's order.
    pub batches: &'a [&'a [u32]],
    /// First batch to train (after an interruption).
    pub start: usize,
    /// Batch `k` samples with `derive_seed(base_seed, k)`.
    pub base_seed: u64,
    /// The epoch index.
    pub epoch: usize,
    /// Where slices go.
    pub tracer: &'a Tracer,
    /// Checked before every batch.
    pub cancel: &'a CancelToken,
}

/// What one trained batch did, for the trainer's bookkeeping and callbacks.
pub(crate) struct BatchDone {
    /// Batch index in the epoch.
    pub k: usize,
    /// Loss × rows.
    pub loss_sum: f64,
    /// Correct predictions.
    pub correct: usize,
    /// Seconds from gate to publication.
    pub seconds: f64,
    /// The version after its step.
    pub version: u64,
}

/// How an epoch's batch loop ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum EpochEnd {
    /// Every batch trained; `true` if the last batch's callback asked to stop.
    Finished(bool),
    /// Stopped before batch `k` (`cause`).
    Stopped(usize, StopCause),
}

/// Layer-based orchestration for one trainer: the hot set, the table, the rule.
pub struct Orchestrator {
    relabeling: Relabeling,
    split: HotSplit,
    table: HotTable,
    rule: StalenessRule,
    /// `orchestration.hot_backward`.
    hot_grad: gpu_ops::HotGrad,
    pipeline: PipelineConfig,
    workers: usize,
    bottom_fanout: u32,
    model: Model<f32>,
    totals: OrchestrationStats,
    last_epoch: Option<OrchestrationStats>,
    fault: Option<InjectedFault>,
    /// `orchestration.monitor`.
    use_monitor: bool,
    /// The hybrid monitor, built on the first epoch (it needs the engine's cache).
    monitor: Option<HybridMonitor>,
}

fn sched(context: &'static str) -> impl Fn(scheduler::SchedulerError) -> Error {
    move |source| Error::Scheduler {
        context: context.into(),
        source,
    }
}

impl Orchestrator {
    /// Step 1: scores hotness over `train_ids` with the training `fanouts` and
    /// `batch_size`, relabels, and sizes the table for layer 0's output width.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: &OrchestrationSection,
        ds: &Dataset,
        model: &Model<f32>,
        fanouts: &[u32],
        train_ids: &[u32],
        batch_size: usize,
        seed: u64,
        cpu_workers: usize,
    ) -> Result<Self> {
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
        let width = model.config().hidden;
        let bottom_fanout = *fanouts.first().ok_or_else(|| {
            Error::invalid_argument("train.fanouts", "orchestration needs at least one layer")
        })?;
        Ok(Self {
            split: HotSplit::all_cpu(hot),
            table: HotTable::new(hot as usize, width),
            rule: StalenessRule::new(cfg.staleness_bound, cfg.on_late.to_scheduler()),
            hot_grad: cfg.hot_backward.to_device(),
            pipeline,
            workers: cpu_workers.max(1),
            bottom_fanout,
            model: model.clone(),
            relabeling,
            totals: OrchestrationStats {
                hot_count: hot,
                ..OrchestrationStats::default()
            },
            last_epoch: None,
            fault: None,
            use_monitor: cfg.monitor,
            monitor: None,
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

    /// Injects a fault into the CPU workers of later epochs (tests).
    pub fn inject_fault(&mut self, fault: Option<InjectedFault>) {
        self.fault = fault;
    }

    /// Runs batches `run.start..` of an epoch through the pipeline (module doc);
    /// `on_batch` sees every trained batch and returns whether to stop after it.
    pub(crate) fn run_epoch(
        &mut self,
        engine: &mut dyn Engine,
        run: &EpochRun<'_>,
        on_batch: &mut dyn FnMut(&BatchDone) -> bool,
    ) -> Result<EpochEnd> {
        let tracer = run.tracer;
        let acc_track = tracer.declare_track("acc stream compute", TrackKind::Accelerator);
        let worker_tracks: Vec<TrackId> = (0..self.workers)
            .map(|i| tracer.declare_track(format!("hot worker {i}"), TrackKind::Cpu))
            .collect();
        let published = Published::new(Snapshot {
            version: engine.version(),
            tensors: engine.layer0_params()?,
        });
        let shared = Shared {
            table: &self.table,
            published,
            queue: JobQueue::new(),
            abort: AtomicBool::new(false),
            failure: Mutex::new(None),
            passed: AtomicU64::new(0),
            stats: Mutex::new(OrchestrationStats {
                hot_count: self.split.hot(),
                ..OrchestrationStats::default()
            }),
        };
        let old_of_new = self.relabeling.permutation().old_of_new();
        let bottom_sampler = NeighborSampler::new(vec![self.bottom_fanout])
            .map_err(|e| Error::cpu_ops("train.fanouts", e))?;
        if self.use_monitor && self.monitor.is_none() {
            self.monitor = Some(HybridMonitor::new(
                &*engine,
                run.ds,
                self.pipeline,
                self.split.hot(),
                self.workers,
            )?);
        }
        let acc = Accelerator {
            rule: self.rule,
            pipeline: self.pipeline,
            split: self.split,
            relabeling: &self.relabeling,
            run,
            shared: &shared,
            acc_track,
            hot_grad: self.hot_grad,
        };
        let result = std::thread::scope(|scope| {
            for (i, &track) in worker_tracks.iter().enumerate() {
                let computer = HotComputer {
                    ds: run.ds,
                    model: &self.model,
                    sampler: bottom_sampler.clone(),
                    old_of_new,
                };
                let shared = &shared;
                let fault = self.fault;
                std::thread::Builder::new()
                    .name(format!("tandem-hot-{i}"))
                    .spawn_scoped(scope, move || {
                        let r = catch_unwind(AssertUnwindSafe(|| {
                            worker(i, &computer, shared, tracer, track, fault)
                        }));
                        let err = match r {
                            Ok(Ok(())) => return,
                            Ok(Err(e)) => e,
                            Err(panic) => Error::Worker {
                                worker: format!("hot worker {i}"),
                                what: format!("panicked: {}", panic_message(&*panic)),
                            },
                        };
                        shared.fail(err);
                    })
                    .map_err(|e| Error::Worker {
                        worker: format!("hot worker {i}"),
                        what: format!("could not start: {e}"),
                    })?;
            }
            let r = acc.run(engine, on_batch, self.monitor.as_mut());
            if let Err(e) = &r {
                if !matches!(e, Error::Worker { .. }) {
                    shared.abort.store(true, Ordering::Release);
                }
            }
            shared.queue.close();
            shared.table.bump();
            r
        });
        engine.discard_prepared();
        let stats = shared.stats.into_inner().unwrap_or_else(|p| p.into_inner());
        self.totals.merge(&stats);
        self.last_epoch = Some(stats);
        let failure = shared
            .failure
            .into_inner()
            .unwrap_or_else(|p| p.into_inner());
        match (failure, result) {
            (Some(e), _) => Err(e),
            (None, r) => r,
        }
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".into())
}

/// Step 3: one CPU worker's loop.
fn worker(
    index: usize,
    computer: &HotComputer<'_>,
    shared: &Shared<'_>,
    tracer: &Tracer,
    track: TrackId,
    fault: Option<InjectedFault>,
) -> Result<()> {
    let mut scratch = SamplerScratch::new(computer.ds.num_vertices());
    let mut buf = Vec::new();
    let mut done = 0u64;
    // One thread: the worker's kernels must not queue behind the accelerator
    // thread's rayon work (on the host backend both are CPU threads).
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .map_err(|e| Error::Worker {
            worker: format!("hot worker {index}"),
            what: format!("could not build its thread pool: {e}"),
        })?;
    while let Some(job) = shared.queue.pop(&shared.abort) {
        if !job.urgent && job.last_batch < shared.passed.load(Ordering::Acquire) {
            shared.lock_stats().dropped_jobs += 1;
            continue;
        }
        match fault {
            Some(InjectedFault::ErrorAfter(n)) if done >= n => {
                return Err(Error::Worker {
                    worker: format!("hot worker {index}"),
                    what: "injected failure".into(),
                });
            }
            Some(InjectedFault::PanicAfter(n)) if done >= n => {
                panic!("injected panic in hot worker {index}");
            }
            _ => {}
        }
        let t = Instant::now();
        let weights = shared.published.newest();
        let mut slice = tracer
            .slice_on(track, "hot compute")
            .super_batch(job.super_batch);
        slice.flow_out(job.flow);
        if let Some(InjectedFault::SlowCpu(per_vertex)) = fault {
            std::thread::sleep(per_vertex.saturating_mul(job.ids.len() as u32));
        }
        let rows = pool.install(|| {
            computer.compute(
                &job.ids,
                &weights,
                job.seed,
                shared.table,
                &mut scratch,
                &mut buf,
            )
        })?;
        drop(slice);
        job.done.store(true, Ordering::Release);
        done += 1;
        let mut s = shared.lock_stats();
        s.jobs += 1;
        s.rows_computed += rows as u64;
        s.cpu_busy_secs += t.elapsed().as_secs_f64();
    }
    Ok(())
}

impl Shared<'_> {
    fn lock_stats(&self) -> std::sync::MutexGuard<'_, OrchestrationStats> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A super-batch sampled ahead: per batch, block 0's destinations (relabeled),
/// and per queue chunk its flow and completion flag.
struct Ahead {
    plan: SuperBatchPlan,
    bottom: Vec<Vec<u32>>,
    chunks: Vec<(Vec<u32>, FlowId, Arc<AtomicBool>, bool)>,
}

/// The accelerator thread's side (steps 4–6).
struct Accelerator<'a> {
    rule: StalenessRule,
    pipeline: PipelineConfig,
    split: HotSplit,
    relabeling: &'a Relabeling,
    run: &'a EpochRun<'a>,
    shared: &'a Shared<'a>,
    acc_track: TrackId,
    /// `orchestration.hot_backward`.
    hot_grad: gpu_ops::HotGrad,
}

impl Accelerator<'_> {
    fn check_abort(&self) -> Result<()> {
        if self.shared.abort.load(Ordering::Acquire) {
            return Err(self.shared.take_failure().unwrap_or_else(|| Error::Worker {
                worker: "pipeline".into(),
                what: "aborted".into(),
            }));
        }
        Ok(())
    }

    /// Step 4 for super-batch `j` (local index; batches from `run.start`).
    fn launch(&self, engine: &mut dyn Engine, j: u64, v0: u64, split: HotSplit) -> Result<Ahead> {
        let run = self.run;
        let n = self.pipeline.batches_per_super_batch();
        let total = run.batches.len();
        let first = run.start + j as usize * n;
        let last = (first + n).min(total);
        let mut bottom = Vec::with_capacity(last - first);
        for k in first..last {
            let ids = engine.prepare_batch(
                k as u64,
                run.batches[k],
                derive_seed(run.base_seed, k as u64),
            )?;
            bottom.push(ids.iter().map(|&v| self.relabeling.new_id(v)).collect());
        }
        let first_global = v0 + (first - run.start) as u64;
        let plan = SuperBatchPlan::new(j, first_global, split, &bottom);
        let mut chunks = Vec::new();
        for (c, (_, ids)) in plan.chunks(&self.pipeline).enumerate() {
            let flow = run.tracer.flow("hot compute→train");
            let done = Arc::new(AtomicBool::new(false));
            self.shared.queue.push(Job {
                super_batch: j,
                ids: ids.to_vec(),
                last_batch: plan.batches.end.saturating_sub(1),
                urgent: false,
                seed: derive_seed(derive_seed(run.base_seed, 5_000_000 + j), c as u64),
                flow,
                done: Arc::clone(&done),
            });
            chunks.push((ids.to_vec(), flow, done, false));
        }
        Ok(Ahead {
            plan,
            bottom,
            chunks,
        })
    }

    /// Steps 4–6 for every super-batch of the epoch, with the hybrid monitor's
    /// steps (`orchestrate::monitor`) around each super-batch when it runs.
    fn run(
        &self,
        engine: &mut dyn Engine,
        on_batch: &mut dyn FnMut(&BatchDone) -> bool,
        mut monitor: Option<&mut HybridMonitor>,
    ) -> Result<EpochEnd> {
        let run = self.run;
        let total = run.batches.len();
        if run.start >= total {
            return Ok(EpochEnd::Finished(false));
        }
        let n = self.pipeline.batches_per_super_batch();
        let num_sb = (total - run.start).div_ceil(n) as u64;
        let base = monitor.as_deref_mut().map_or(0, |m| m.start_epoch(num_sb));
        let split_for = |m: &Option<&mut HybridMonitor>, j: u64| {
            m.as_deref().map_or(self.split, |m| m.split_for(base + j))
        };
        let v0 = engine.version();
        let mut ahead: VecDeque<Ahead> = VecDeque::new();
        for j in 0..=(DEPTH as u64).min(num_sb - 1) {
            let split = split_for(&monitor, j);
            ahead.push_back(self.launch(engine, j, v0, split)?);
        }
        let mut urgent_seq = 0u64;
        let mut window = Window::open(&self.shared.lock_stats());
        for j in 0..num_sb {
            if let Some(m) = monitor.as_deref_mut() {
                m.begin_super_batch(base + j, engine, self.relabeling)?;
            }
            if j > 0 && j + (DEPTH as u64) < num_sb {
                let split = split_for(&monitor, j + DEPTH as u64);
                let next = self.launch(engine, j + DEPTH as u64, v0, split)?;
                ahead.push_back(next);
            }
            let mut sb = ahead.pop_front().ok_or_else(|| Error::Worker {
                worker: "pipeline".into(),
                what: format!("internal: super-batch {j} was not sampled ahead"),
            })?;
            for (i, b) in sb.plan.batches.clone().enumerate() {
                let k = run.start + (b - v0) as usize;
                if run.cancel.is_cancelled() {
                    return Ok(EpochEnd::Stopped(k, StopCause::Token));
                }
                self.check_abort()?;
                if engine.version() != b {
                    return Err(Error::invalid_argument(
                        "orchestration",
                        format!("internal: batch {b} runs at version {}", engine.version()),
                    ));
                }
                let t = Instant::now();
                let (hot, max_gap, late) =
                    self.gate(&mut sb, i, b, &mut urgent_seq, engine.version())?;
                self.shared.passed.store(b + 1, Ordering::Release);
                let mut slice = run
                    .tracer
                    .slice_on(self.acc_track, "train")
                    .epoch(run.epoch as u64)
                    .batch(k as u64)
                    .super_batch(j);
                if let Some(g) = max_gap {
                    slice.set_staleness_gap(g);
                }
                for flow in late {
                    slice.flow_in(flow);
                }
                let seeds = run.batches[k];
                let h2d_before = engine.h2d_bytes();
                let (loss_sum, correct) = engine.train_prepared(
                    k as u64,
                    seeds,
                    derive_seed(run.base_seed, k as u64),
                    &hot,
                )?;
                // Cache misses, the pruned block, labels and hot rows crossed the bus.
                slice.set_transfer(
                    Direction::HostToDevice,
                    engine.h2d_bytes().saturating_sub(h2d_before),
                );
                self.shared.published.publish(Snapshot {
                    version: engine.version(),
                    tensors: engine.layer0_params()?,
                });
                drop(slice);
                let done = BatchDone {
                    k,
                    loss_sum,
                    correct,
                    seconds: t.elapsed().as_secs_f64(),
                    version: engine.version(),
                };
                if on_batch(&done) {
                    if k + 1 < total {
                        return Ok(EpochEnd::Stopped(k + 1, StopCause::Callback));
                    }
                    return Ok(EpochEnd::Finished(true));
                }
            }
            if let Some(m) = monitor.as_deref_mut() {
                let mut stats = self.shared.lock_stats();
                m.end_super_batch(
                    base + j,
                    j,
                    num_sb,
                    &window,
                    &mut stats,
                    engine,
                    self.relabeling,
                    run.tracer,
                    self.acc_track,
                )?;
                window = Window::open(&stats);
            }
        }
        Ok(EpochEnd::Finished(false))
    }

    /// Step 5 for batch `i` of super-batch `sb` at version `b`: the rows to use,
    /// the largest gap, and the flows of chunks first used here.
    fn gate(
        &self,
        sb: &mut Ahead,
        i: usize,
        b: u64,
        urgent_seq: &mut u64,
        current: u64,
    ) -> Result<(HostHotRows, Option<u64>, Vec<FlowId>)> {
        let table = self.shared.table;
        let bottom = &sb.bottom[i];
        let hot: Vec<(u32, u32)> = bottom
            .iter()
            .enumerate()
            .filter(|(_, &v)| sb.plan.split.class(v) == VertexClass::CpuHot)
            .map(|(p, &v)| (p as u32, v))
            .collect();
        let mut late = Vec::new();
        for &(_, v) in &hot {
            match self
                .rule
                .decide(table.version(v), current)
                .map_err(sched("staleness gate"))?
            {
                Decision::Use { .. } => {}
                Decision::Wait { .. } | Decision::ComputeCold { .. } => late.push(v),
            }
        }
        let mut skip: Vec<u32> = Vec::new();
        if !late.is_empty() {
            match self.rule.on_late() {
                scheduler::OnLate::Compute => {
                    self.shared.lock_stats().computed_cold += late.len() as u64;
                    let n = late.len();
                    self.run
                        .tracer
                        .instant_on(self.acc_track, "compute cold", |a| {
                            a.batch = Some(b);
                            a.extra.push(("vertices".into(), n as f64));
                        });
                    skip = late;
                    skip.sort_unstable();
                }
                scheduler::OnLate::Wait => self.wait(&late, b, urgent_seq)?,
            }
        }
        let mut rows = HostHotRows {
            grad: self.hot_grad,
            ..HostHotRows::default()
        };
        rows.rows.reserve(hot.len() * table.dim());
        let mut max_gap = None;
        let mut gaps = GapHistogram::new();
        for &(p, v) in &hot {
            if skip.binary_search(&v).is_ok() {
                continue;
            }
            let e = table.read_into(v, &mut rows.rows).ok_or_else(|| {
                Error::invalid_argument(
                    "orchestration",
                    format!("internal: hot vertex {v} passed the gate without a row"),
                )
            })?;
            if e > current || current - e > self.rule.bound() {
                return Err(Error::invalid_argument(
                    "orchestration",
                    format!(
                        "internal: hot vertex {v} has version {e} at batch version {current} (bound {})",
                        self.rule.bound()
                    ),
                ));
            }
            let gap = current - e;
            gaps.record(gap);
            max_gap = max_gap.max(Some(gap));
            rows.positions.push(p);
        }
        let mut s = self.shared.lock_stats();
        s.hot_uses += gaps.total();
        s.gaps.merge(&gaps);
        drop(s);
        // Flows from finished chunks of this super-batch first used here.
        let mut flows = Vec::new();
        let used: &[u32] = &sb.plan.batch_hot[i];
        for (ids, flow, done, consumed) in &mut sb.chunks {
            if *consumed || !done.load(Ordering::Acquire) {
                continue;
            }
            if ids.iter().any(|v| used.binary_search(v).is_ok()) {
                *consumed = true;
                flows.push(*flow);
            }
        }
        Ok((rows, max_gap, flows))
    }

    /// Step 5, `"wait"`: urgent job for late vertices no in-bound task computes,
    /// then block until all are usable (or abort).
    fn wait(&self, late: &[u32], b: u64, urgent_seq: &mut u64) -> Result<()> {
        let table = self.shared.table;
        let oldest = self.rule.oldest_usable(b);
        let urgent: Vec<u32> = late
            .iter()
            .copied()
            .filter(|&v| table.pending(v).is_none_or(|e| e < oldest))
            .collect();
        let t = Instant::now();
        let n = late.len();
        self.run.tracer.instant_on(self.acc_track, "hot wait", |a| {
            a.batch = Some(b);
            a.extra.push(("vertices".into(), n as f64));
            a.extra.push(("urgent".into(), urgent.len() as f64));
        });
        if !urgent.is_empty() {
            *urgent_seq += 1;
            self.shared.queue.push(Job {
                super_batch: u64::MAX,
                ids: urgent,
                last_batch: b,
                urgent: true,
                seed: derive_seed(derive_seed(self.run.base_seed, 6_000_000), *urgent_seq),
                flow: FlowId::NONE,
                done: Arc::new(AtomicBool::new(false)),
            });
        }
        let mut _wait = self
            .run
            .tracer
            .slice_on(self.acc_track, "hot wait")
            .batch(b);
        loop {
            self.check_abort()?;
            let g = table.generation();
            let mut missing = Vec::new();
            for &v in late {
                if !self
                    .rule
                    .decide(table.version(v), b)
                    .map_err(sched("staleness gate"))?
                    .is_use()
                {
                    missing.push(v);
                }
            }
            if missing.is_empty() {
                break;
            }
            // A pending task that finished without a usable row (it was dropped
            // or started too early): ask again.
            let orphans: Vec<u32> = missing
                .iter()
                .copied()
                .filter(|&v| table.pending(v).is_none())
                .collect();
            if !orphans.is_empty() && t.elapsed() > POLL * 4 {
                *urgent_seq += 1;
                self.shared.queue.push(Job {
                    super_batch: u64::MAX,
                    ids: orphans,
                    last_batch: b,
                    urgent: true,
                    seed: derive_seed(derive_seed(self.run.base_seed, 6_000_000), *urgent_seq),
                    flow: FlowId::NONE,
                    done: Arc::new(AtomicBool::new(false)),
                });
            }
            table.wait_for_change(g, POLL);
        }
        let mut s = self.shared.lock_stats();
        s.waited += late.len() as u64;
        s.wait_batches += 1;
        s.wait_secs += t.elapsed().as_secs_f64();
        if *urgent_seq > 0 {
            s.urgent_jobs = *urgent_seq;
        }
        Ok(())
    }
}
