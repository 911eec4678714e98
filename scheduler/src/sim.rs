//! A deterministic discrete-event simulation of the super-batch pipeline: a model
//! of the runtime's protocol, whose one description is the numbered steps of
//! `runtime/src/orchestrate/pipeline.rs` (the CPU side: `runtime/src/orchestrate/
//! workers.rs`). The task graph ([`GraphBuilder`]) has a task for each piece of
//! work the runtime does; this module adds what is decided while running: the
//! installs, the gate, urgent work, dropped work.
//!
//! Two resources: `cpu_workers` CPU workers (each runs one task at a time, the
//! ready task with the smallest `(priority, id)` first: the runtime's job queue,
//! urgent jobs first) and the accelerator (one in-order stream: it runs its tasks
//! strictly by `(priority, id)` and idles when the next one is not ready). Task
//! costs come from a [`CostSource`]; weights are published as
//! [`SimConfig::publication`] says; the [`Monitor`] decides after every
//! super-batch, and its split is used for the super-batches built from then on.
//! No threads, no clocks: the same inputs give the same report.
//!
//! # One run, step by step
//! 1. **Launch** super-batches `0..=D` with the initial split (runtime step 3):
//!    their tasks join the graph; a chunk's [`TaskKind::HotInstall`] is held back
//!    until a gate takes its report (step 3a).
//! 2. **Run.** Repeat until nothing is left: start every task a free resource can
//!    start, advance time to the next completion and apply it. An optimizer step
//!    moves the version; a publication makes the version at its start the one CPU
//!    work reads from then on (runtime step 2); a [`TaskKind::HotCompute`] reads
//!    it when it starts and, when it ends, is a report waiting for the next gate.
//!    A regular chunk that starts after every gate of its super-batch passed is
//!    dropped (workers step 3).
//! 3. **Gate**, when a batch `b`'s [`TaskKind::HotLoad`] is next on the stream
//!    (runtime steps 4–5, per chunk of the batch's super-batch):
//!    1. *Install*: every report waiting is taken. A chunk of a super-batch with a
//!       gate still to pass, computed with newer weights than its slab rows, gets
//!       its install at the front of the stream (before the gate's batch) and is
//!       ready at that version; any other report's install is dropped.
//!    2. *Decide* per chunk the batch reads: ready at `e` with `b − e ≤ bound`
//!       is used and every one of the batch's vertices in it records the gap.
//!    3. *Late* chunks, by `on_late`: `"compute"` leaves their vertices cold in
//!       this batch (its [`TaskKind::SampleBottom`], [`TaskKind::ColdGather`] and
//!       [`TaskKind::ColdCompute`] take them on) and the batch passes; `"wait"`
//!       sends, per late chunk without urgent work, a promotion of its
//!       computation to priority 0 when it is not computed yet (nothing when it
//!       already runs), or an urgent recomputation when it is stale — after a
//!       publication of the current weights when the published version is older
//!       than `b − bound` — and the gate blocks until the next report, then goes
//!       back to 3.1.
//! 4. **After a super-batch** `k` (its last publication, runtime step 7): close its
//!    window, record it, hand the monitor its [`Observation`] (unless no
//!    super-batch is left for a decision to apply to), trace any move, and launch
//!    super-batch `k + 1 + D` with the split in effect for it.
//! 5. **End**: check every task ran, and sum the totals.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::ops::Range;

use crate::builder::{
    hot_chunk_estimate, hot_install_estimate, publish_estimate, BatchTasks, GraphBuilder,
    ModelShape,
};
use crate::cost::CostSource;
use crate::error::{invalid, Result, SchedulerError};
use crate::monitor::{Monitor, MonitorConfig, MoveEvent, Observation};
use crate::pipeline::{HotSplit, PipelineConfig, Publication, SuperBatchPlan};
use crate::placement::{Orchestration, Placement};
use crate::report::{BatchRecord, SimReport, SimTotals, SuperBatchRecord, TaskSpan};
use crate::staleness::{Decision, GapHistogram, OnLate, StalenessRule};
use crate::task::{Device, Estimate, LayerSpan, Task, TaskKind};
use crate::workload::Workload;

/// Everything a simulation run needs besides the workload and the costs.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// The placement policy.
    pub orchestration: Orchestration,
    /// Super-batch size, depth, chunk size.
    pub pipeline: PipelineConfig,
    /// The staleness bound and late policy.
    pub staleness: StalenessRule,
    /// When weights are published (`None`: as the runtime decides,
    /// [`Publication::for_bound`] of the staleness bound).
    pub publication: Option<Publication>,
    /// Model dimensions (for estimates and memory).
    pub model: ModelShape,
    /// CPU worker threads (≥ 1).
    pub cpu_workers: u32,
    /// Initial CPU part of the hot set (`None`: all of it). Placements that do not
    /// reuse embeddings always start (and stay) at 0: the hot set is then a static
    /// feature cache.
    pub initial_cpu: Option<u32>,
    /// The hybrid monitor (only for placements that reuse embeddings).
    pub monitor: Option<MonitorConfig>,
    /// Device memory, bytes.
    pub device_memory_bytes: u64,
    /// Device memory training itself uses, bytes.
    pub training_bytes: u64,
    /// Keep a [`TaskSpan`] for every task in [`SimReport::trace`].
    pub record_trace: bool,
}

impl SimConfig {
    /// A layer-based configuration: `N = 4`, `D = 1`, chunks of at most 64 and at
    /// least 4 per queue, bound `(D + 1) · N - 1 = 7`, `on_late = "wait"`,
    /// publication as the runtime decides, 4 CPU workers, 80 GB of device memory
    /// of which 8 GB for training, no monitor.
    pub fn layer(model: ModelShape) -> Result<Self> {
        let pipeline = PipelineConfig::new(4, 1, 1024)?.with_min_chunks(4)?;
        Ok(Self {
            orchestration: Orchestration::Layer,
            pipeline,
            staleness: StalenessRule::new(pipeline.on_time_gap(), OnLate::Wait),
            publication: None,
            model,
            cpu_workers: 4,
            initial_cpu: None,
            monitor: None,
            device_memory_bytes: 80 << 30,
            training_bytes: 8 << 30,
            record_trace: false,
        })
    }

    /// The publication in effect: [`SimConfig::publication`], or the runtime's
    /// rule for the staleness bound.
    pub fn effective_publication(&self) -> Publication {
        self.publication
            .unwrap_or_else(|| Publication::for_bound(&self.pipeline, self.staleness.bound()))
    }
}

/// Runs the workload under `cfg` with task durations from `costs`.
pub fn simulate<C: CostSource>(
    cfg: &SimConfig,
    workload: &Workload,
    costs: C,
) -> Result<SimReport> {
    let placement = cfg.orchestration.placement();
    let mut sim = Sim::new(cfg, workload, costs, placement.as_ref())?;
    sim.run()?;
    sim.finish()
}

/// One chunk of a launched super-batch's queue (the runtime's `Chunk`).
#[derive(Clone, Debug)]
struct ChunkRun {
    /// Positions of its vertices in the queue (= slab rows).
    range: Range<usize>,
    /// Its regular computation.
    compute: usize,
    /// The version of its rows in the slab (`None`: pending).
    ready: Option<u64>,
    /// An urgent job for it is queued or running.
    urgent: bool,
}

/// The gate of the batch at the head of the accelerator's stream, blocked.
#[derive(Clone, Copy, Debug)]
struct GateWait {
    batch: u64,
    /// A report arrived since it blocked: decide again.
    woken: bool,
}

/// Why the accelerator is idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Idle {
    Hot(u64),
    Other(Option<u64>),
    Nothing,
}

struct Sim<'a, 'p, C> {
    cfg: &'a SimConfig,
    work: &'a Workload,
    costs: C,
    builder: GraphBuilder<'p>,
    monitor: Option<Monitor>,
    fixed_split: HotSplit,
    total_batches: u64,
    num_sbs: u64,
    // per task
    missing: Vec<u32>,
    users: Vec<Vec<usize>>,
    done: Vec<bool>,
    /// A hot computation's stamp, an install's rows, a publication's weights.
    version: Vec<Option<u64>>,
    dropped: Vec<bool>,
    dynamic: Vec<bool>,
    started: Vec<bool>,
    promoted: Vec<bool>,
    /// The install of a hot computation's rows.
    install_of: Vec<Option<usize>>,
    // per super-batch
    plans: Vec<Option<SuperBatchPlan>>,
    last_publish: Vec<usize>,
    chunks: Vec<Vec<ChunkRun>>,
    gates_passed: Vec<u32>,
    sb_dropped: Vec<u32>,
    built_splits: VecDeque<(u64, HotSplit)>,
    // per batch
    batch_tasks: Vec<Option<BatchTasks>>,
    passed: Vec<bool>,
    // the gate
    /// Finished hot computations the next gate takes (runtime step 4).
    reports: Vec<usize>,
    gate: Option<GateWait>,
    /// A publication an urgent recomputation waits for.
    pending_publish: Option<usize>,
    // versions
    steps: u64,
    published: u64,
    // resources
    time: f64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, usize)>>,
    cpu_free: u32,
    cpu_ready: BinaryHeap<Reverse<(u64, usize)>>,
    acc_queue: BinaryHeap<Reverse<(u64, usize)>>,
    acc_running: Option<usize>,
    cpu_intervals: Vec<(f64, f64, bool)>,
    // window accumulators
    win_start: f64,
    win_acc_busy: f64,
    win_wait_hot: f64,
    win_wait_other: f64,
    // records
    batches: Vec<BatchRecord>,
    sbs: Vec<SuperBatchRecord>,
    moves: Vec<MoveEvent>,
    gaps: GapHistogram,
    cold_computed: Vec<u64>,
    totals: SimTotals,
    trace: Vec<TaskSpan>,
}

impl<'a, 'p, C: CostSource> Sim<'a, 'p, C> {
    fn new(
        cfg: &'a SimConfig,
        work: &'a Workload,
        costs: C,
        placement: &'p dyn Placement,
    ) -> Result<Self> {
        if cfg.cpu_workers == 0 {
            return Err(invalid("cpu_workers", "at least 1", 0));
        }
        let hot = work.hot_count();
        let reuse = placement.reuses_embeddings();
        let cpu = if reuse {
            cfg.initial_cpu.unwrap_or(hot)
        } else {
            0
        };
        let split = HotSplit::new(hot, cpu).map_err(|_| {
            invalid(
                "initial_cpu",
                format!("at most the workload's hot count ({hot})"),
                cpu,
            )
        })?;
        let row = cfg.model.feature_row_bytes();
        let monitor = match (cfg.monitor, reuse) {
            (Some(m), true) => Some(Monitor::new(m, cfg.pipeline, split, row)?),
            (Some(_), false) => {
                return Err(invalid(
                    "monitor",
                    format!(
                        "no monitor: placement \"{}\" does not reuse embeddings",
                        placement.name()
                    ),
                    "a monitor config",
                ))
            }
            (None, _) => None,
        };
        let total = work.len() as u64;
        let num_sbs = cfg.pipeline.num_super_batches(total);
        let builder = GraphBuilder::new(cfg.model, cfg.pipeline, placement)
            .with_publication(cfg.effective_publication());
        let mut sim = Self {
            cfg,
            work,
            costs,
            builder,
            monitor,
            fixed_split: split,
            total_batches: total,
            num_sbs,
            missing: Vec::new(),
            users: Vec::new(),
            done: Vec::new(),
            version: Vec::new(),
            dropped: Vec::new(),
            dynamic: Vec::new(),
            started: Vec::new(),
            promoted: Vec::new(),
            install_of: Vec::new(),
            plans: vec![None; num_sbs as usize],
            last_publish: Vec::with_capacity(num_sbs as usize),
            chunks: vec![Vec::new(); num_sbs as usize],
            gates_passed: vec![0; num_sbs as usize],
            sb_dropped: vec![0; num_sbs as usize],
            built_splits: VecDeque::new(),
            batch_tasks: vec![None; total as usize],
            passed: vec![false; total as usize],
            reports: Vec::new(),
            gate: None,
            pending_publish: None,
            steps: 0,
            published: 0,
            time: 0.0,
            seq: 0,
            events: BinaryHeap::new(),
            cpu_free: cfg.cpu_workers,
            cpu_ready: BinaryHeap::new(),
            acc_queue: BinaryHeap::new(),
            acc_running: None,
            cpu_intervals: Vec::new(),
            win_start: 0.0,
            win_acc_busy: 0.0,
            win_wait_hot: 0.0,
            win_wait_other: 0.0,
            batches: (0..total)
                .map(|b| BatchRecord {
                    batch: b,
                    super_batch: cfg.pipeline.super_batch_of(b),
                    ..BatchRecord::default()
                })
                .collect(),
            sbs: Vec::with_capacity(num_sbs as usize),
            moves: Vec::new(),
            gaps: GapHistogram::new(),
            cold_computed: vec![0; hot as usize],
            totals: SimTotals::default(),
            trace: Vec::new(),
        };
        // Step 1.
        for j in 0..=(cfg.pipeline.depth() as u64) {
            sim.build(j)?;
        }
        sim.note_cache();
        Ok(sim)
    }

    fn split_for(&self, j: u64) -> HotSplit {
        self.monitor
            .as_ref()
            .map_or(self.fixed_split, |m| m.split_for(j))
    }

    /// Builds super-batch `j` (if it exists) and registers its tasks.
    fn build(&mut self, j: u64) -> Result<()> {
        if j >= self.num_sbs {
            return Ok(());
        }
        let split = self.split_for(j);
        let range = self.cfg.pipeline.batches_of(j, self.total_batches);
        let hots: Vec<&[u32]> = range
            .clone()
            .map(|b| self.work.batches()[b as usize].hot.as_slice())
            .collect();
        let plan = SuperBatchPlan::new(j, range.start, split, &hots);
        let shapes = range
            .clone()
            .map(|b| self.work.shape(b as usize, &split, &self.cfg.model))
            .collect::<Result<Vec<_>>>()?;
        let first = self.builder.graph().len();
        let tasks = self.builder.push_super_batch(&plan, &shapes)?;
        self.register(first);
        self.chunks[j as usize] = tasks
            .chunks
            .iter()
            .map(|c| {
                self.install_of[c.compute] = Some(c.install);
                ChunkRun {
                    range: c.range.clone(),
                    compute: c.compute,
                    ready: None,
                    urgent: false,
                }
            })
            .collect();
        self.last_publish.push(tasks.publish);
        for t in &tasks.batches {
            self.batch_tasks[t.batch as usize] = Some(*t);
        }
        self.built_splits.push_back((j, split));
        self.plans[j as usize] = Some(plan);
        Ok(())
    }

    /// Registers tasks `first..` of the graph (deps already done do not count).
    /// Installs are held back until a gate takes their computation's report.
    fn register(&mut self, first: usize) {
        let n = self.builder.graph().len();
        for id in first..n {
            let (deps, kind, device, priority) = {
                let t = &self.builder.graph().tasks()[id];
                (t.deps.clone(), t.kind, t.device, t.priority)
            };
            self.users.push(Vec::new());
            self.done.push(false);
            self.version.push(None);
            self.dropped.push(false);
            self.dynamic.push(false);
            self.started.push(false);
            self.promoted.push(false);
            self.install_of.push(None);
            let mut missing = 0;
            for d in deps {
                if !self.done[d] {
                    missing += 1;
                    self.users[d].push(id);
                }
            }
            self.missing.push(missing);
            match device {
                _ if kind == TaskKind::HotInstall => {}
                Device::Accelerator => self.acc_queue.push(Reverse((priority, id))),
                Device::Cpu if missing == 0 => self.cpu_ready.push(Reverse((priority, id))),
                Device::Cpu => {}
            }
        }
    }

    /// Appends a task created at run time (urgent hot work, a publication for
    /// it) to the builder's graph, so ids stay dense and PCIe accounting sees it.
    fn push_dynamic(&mut self, task: Task) -> Result<usize> {
        let first = self.builder.graph().len();
        let id = self.builder.push_dynamic(task)?;
        self.register(first);
        self.dynamic[id] = true;
        Ok(id)
    }

    /// Whether some batch of super-batch `sb` has not passed its gate yet (its
    /// chunks are still worth computing and installing).
    fn live(&self, sb: u64) -> bool {
        let all = self.cfg.pipeline.batches_of(sb, self.total_batches);
        (self.gates_passed[sb as usize] as u64) < all.end - all.start
    }

    // --- step 2 -------------------------------------------------------------

    fn run(&mut self) -> Result<()> {
        loop {
            self.dispatch()?;
            let Some(&Reverse((bits, _, _))) = self.events.peek() else {
                break;
            };
            let next = f64::from_bits(bits);
            let dt = next - self.time;
            if self.acc_running.is_none() && dt > 0.0 {
                match self.idle_reason() {
                    Idle::Hot(b) => {
                        self.win_wait_hot += dt;
                        self.totals.acc_wait_hot_s += dt;
                        self.batches[b as usize].hot_wait_s += dt;
                    }
                    Idle::Other(b) => {
                        self.win_wait_other += dt;
                        self.totals.acc_wait_other_s += dt;
                        if let Some(b) = b {
                            self.batches[b as usize].other_wait_s += dt;
                        }
                    }
                    Idle::Nothing => {}
                }
            }
            self.time = next;
            while let Some(&Reverse((bits, _, id))) = self.events.peek() {
                if f64::from_bits(bits) > self.time {
                    break;
                }
                self.events.pop();
                self.complete(id)?;
            }
        }
        let pending = self.done.iter().filter(|d| !**d).count();
        if pending > 0 {
            return Err(SchedulerError::SimulationStalled {
                time_s: self.time,
                pending,
            });
        }
        Ok(())
    }

    fn idle_reason(&self) -> Idle {
        let Some(&Reverse((_, head))) = self.acc_queue.peek() else {
            return Idle::Nothing;
        };
        let t = &self.builder.graph().tasks()[head];
        match (&self.gate, t.batch) {
            (Some(g), Some(b)) if t.kind == TaskKind::HotLoad && g.batch == b => Idle::Hot(b),
            _ => Idle::Other(t.batch),
        }
    }

    /// Starts what can start now. The accelerator goes first: its gate may create
    /// urgent CPU work, which then competes for the CPU workers like the rest.
    fn dispatch(&mut self) -> Result<()> {
        self.dispatch_accelerator()?;
        while self.cpu_free > 0 {
            let Some(Reverse((_, id))) = self.cpu_ready.pop() else {
                break;
            };
            if !self.started[id] {
                self.start(id)?;
            }
        }
        Ok(())
    }

    fn dispatch_accelerator(&mut self) -> Result<()> {
        while self.acc_running.is_none() {
            let Some(&Reverse((_, head))) = self.acc_queue.peek() else {
                return Ok(());
            };
            if self.missing[head] > 0 {
                return Ok(());
            }
            let (kind, batch) = {
                let t = &self.builder.graph().tasks()[head];
                (t.kind, t.batch)
            };
            if kind == TaskKind::HotLoad {
                let b = batch.unwrap_or(0);
                if !self.passed[b as usize] {
                    let pass = self.evaluate_gate(b)?;
                    if self.acc_queue.peek().map(|r| r.0 .1) != Some(head) {
                        // Installs or a publication went in front of the gate.
                        continue;
                    }
                    if !pass {
                        return Ok(());
                    }
                }
            }
            self.acc_queue.pop();
            self.start(head)?;
        }
        Ok(())
    }

    /// Step 3.1: every report waiting.
    fn drain(&mut self) -> Result<()> {
        for compute in std::mem::take(&mut self.reports) {
            let Some(install) = self.install_of[compute] else {
                continue;
            };
            let (sb, c) = self.chunk_of(compute)?;
            let live = self.live(sb);
            let v = self.version[compute];
            let chunk = &mut self.chunks[sb as usize][c];
            match v {
                Some(v) if live && chunk.ready.is_none_or(|e| e < v) => {
                    chunk.ready = Some(v);
                    chunk.urgent = false;
                    self.version[install] = Some(v);
                    let device = self.builder.graph().tasks()[install].device;
                    match device {
                        Device::Accelerator => self.acc_queue.push(Reverse((0, install))),
                        Device::Cpu => self.cpu_ready.push(Reverse((0, install))),
                    }
                }
                _ => self.drop_now(install)?,
            }
        }
        Ok(())
    }

    /// The super-batch and chunk index of a hot-chunk task.
    fn chunk_of(&self, id: usize) -> Result<(u64, usize)> {
        let t = &self.builder.graph().tasks()[id];
        let c = t
            .chunk
            .ok_or_else(|| invalid("hot task", "a chunk index", t.kind))?;
        Ok((t.super_batch, c as usize))
    }

    /// The chunks batch `b` reads, each with the batch's CPU-hot vertices in it
    /// (the runtime's `reads` and `entries`).
    fn reads(&self, b: u64) -> Result<Vec<(usize, Vec<u32>)>> {
        let sb = self.cfg.pipeline.super_batch_of(b);
        let plan = self.plans[sb as usize]
            .as_ref()
            .ok_or_else(|| invalid("super-batch plan", "built before its gate", sb))?;
        let k = (b - plan.batches.start) as usize;
        let chunks = &self.chunks[sb as usize];
        let mut out: Vec<(usize, Vec<u32>)> = Vec::new();
        for &u in &plan.batch_hot[k] {
            let pos = plan
                .queue
                .binary_search(&u)
                .map_err(|_| invalid("hot queue", "every CPU-hot vertex of its batches", u))?;
            let c = chunks.partition_point(|ch| ch.range.end <= pos);
            match out.last_mut() {
                Some((last, verts)) if *last == c => verts.push(u),
                _ => out.push((c, vec![u])),
            }
        }
        Ok(out)
    }

    /// The gate of batch `b` (step 3). `Ok(true)` when the batch may proceed.
    fn evaluate_gate(&mut self, b: u64) -> Result<bool> {
        if self.gate.is_some_and(|g| g.batch == b && !g.woken) {
            return Ok(false);
        }
        self.drain()?;
        let rule = self.cfg.staleness;
        let sb = self.cfg.pipeline.super_batch_of(b);
        let mut late_chunks = Vec::new();
        let mut late = Vec::new();
        let mut gaps = Vec::new();
        for (c, verts) in self.reads(b)? {
            match rule.decide(self.chunks[sb as usize][c].ready, b)? {
                Decision::Use { gap } => gaps.extend(std::iter::repeat_n(gap, verts.len())),
                Decision::Wait { .. } | Decision::ComputeCold { .. } => {
                    late_chunks.push(c);
                    late.extend(verts);
                }
            }
        }
        if !late_chunks.is_empty() && rule.on_late() == OnLate::Wait {
            for c in late_chunks {
                self.send_urgent(b, sb, c)?;
            }
            self.gate = Some(GateWait {
                batch: b,
                woken: false,
            });
            return Ok(false);
        }
        // Pass: record the reuses; late vertices stay cold in this batch.
        let rec = &mut self.batches[b as usize];
        rec.hot_used = gaps.len() as u32;
        rec.max_gap = gaps.iter().copied().max();
        for &g in &gaps {
            self.gaps.record(g);
        }
        self.totals.hot_uses += gaps.len() as u64;
        if !late.is_empty() {
            self.compute_late(b, &late)?;
        }
        self.passed[b as usize] = true;
        self.gates_passed[sb as usize] += 1;
        self.gate = None;
        Ok(true)
    }

    /// Step 3.3, `"wait"`: urgent work for late chunk `c` of super-batch `sb`.
    fn send_urgent(&mut self, b: u64, sb: u64, c: usize) -> Result<()> {
        let chunk = &mut self.chunks[sb as usize][c];
        if chunk.urgent {
            return Ok(());
        }
        chunk.urgent = true;
        let oldest = self.cfg.staleness.oldest_usable(b);
        let stale = chunk.ready.is_some_and(|e| e < oldest);
        let (regular, k) = (chunk.compute, chunk.range.len() as u64);
        self.batches[b as usize].urgent_tasks += 1;
        self.totals.urgent_tasks += 1;
        if !stale {
            // Not computed yet: whichever of its job and the urgent duplicate
            // starts first computes it.
            self.promote(regular);
            return Ok(());
        }
        // Stale: recompute with weights of version ≥ b − bound.
        let on_cpu = self.builder.placement().device(TaskKind::HotCompute) == Device::Cpu;
        let mut deps = Vec::new();
        if on_cpu && self.published < oldest {
            deps.push(self.publish_now(b, sb)?);
        }
        let m = self.cfg.model;
        let task = self.dynamic_task(
            TaskKind::HotCompute,
            b,
            sb,
            Some(c),
            deps,
            hot_chunk_estimate(&m, k),
        );
        let compute = self.push_dynamic(task)?;
        let task = self.dynamic_task(
            TaskKind::HotInstall,
            b,
            sb,
            Some(c),
            vec![compute],
            hot_install_estimate(&m, k),
        );
        let install = self.push_dynamic(task)?;
        self.install_of[compute] = Some(install);
        Ok(())
    }

    /// A publication of the current weights at the front of the stream (or the
    /// one already waiting there).
    fn publish_now(&mut self, b: u64, sb: u64) -> Result<usize> {
        if let Some(p) = self.pending_publish {
            return Ok(p);
        }
        let est = publish_estimate(&self.cfg.model);
        let task = self.dynamic_task(TaskKind::PublishWeights, b, sb, None, vec![], est);
        let id = self.push_dynamic(task)?;
        self.pending_publish = Some(id);
        Ok(id)
    }

    /// Gives a queued chunk's computation priority 0 (nothing once it started).
    fn promote(&mut self, compute: usize) {
        if self.started[compute] || self.promoted[compute] {
            return;
        }
        self.promoted[compute] = true;
        if self.missing[compute] == 0 {
            // The stale entry with the old priority is skipped when popped.
            self.cpu_ready.push(Reverse((0, compute)));
        }
    }

    /// Step 3.3, `"compute"`: the late vertices stay cold in batch `b`: its bottom
    /// hop, gather and compute (after the gate) take them on, and its hot load
    /// moves only the rows used.
    fn compute_late(&mut self, b: u64, late: &[u32]) -> Result<()> {
        for &u in late {
            self.cold_computed[u as usize] += 1;
        }
        self.batches[b as usize].late_computed = late.len() as u32;
        self.totals.late_computed += late.len() as u64;
        let tasks = self.batch_tasks[b as usize]
            .ok_or_else(|| invalid("batch tasks", "built before the gate", b))?;
        self.builder.leave_cold(&tasks, late.len() as u64)
    }

    /// A task of batch `b` created at run time, priority 0.
    fn dynamic_task(
        &self,
        kind: TaskKind,
        b: u64,
        sb: u64,
        chunk: Option<usize>,
        deps: Vec<usize>,
        est: Estimate,
    ) -> Task {
        Task {
            id: 0,
            kind,
            device: self.builder.placement().device(kind),
            batch: Some(b),
            super_batch: sb,
            chunk: chunk.map(|c| c as u32),
            layers: LayerSpan::one(0),
            deps,
            est,
            priority: 0,
        }
    }

    fn start(&mut self, id: usize) -> Result<()> {
        self.started[id] = true;
        let (kind, device, batch, sb) = {
            let t = &self.builder.graph().tasks()[id];
            (t.kind, t.device, t.batch, t.super_batch)
        };
        // A regular chunk nobody will read any more is dropped (workers step 3).
        if kind == TaskKind::HotCompute && !self.dynamic[id] && !self.live(sb) {
            self.dropped[id] = true;
            self.sb_dropped[sb as usize] += 1;
            self.totals.dropped_chunks += 1;
        }
        let duration = if self.dropped[id] {
            0.0
        } else {
            let pcie = self.builder.graph().pcie_bytes(id);
            self.totals.pcie_bytes += pcie;
            if let Some(b) = batch {
                self.batches[b as usize].pcie_bytes += pcie;
            }
            let d = self.costs.duration(&self.builder.graph().tasks()[id], pcie);
            if !(d.is_finite() && d >= 0.0) {
                return Err(invalid(
                    "task cost",
                    format!("a finite, non-negative duration for {kind} of super-batch {sb}"),
                    d,
                ));
            }
            d
        };
        match kind {
            TaskKind::HotCompute if !self.dropped[id] => {
                self.version[id] = Some(match device {
                    Device::Cpu => self.published,
                    Device::Accelerator => self.steps,
                });
            }
            TaskKind::PublishWeights => self.version[id] = Some(self.steps),
            _ => {}
        }
        let end = self.time + duration;
        self.record_span(id, end);
        self.seq += 1;
        self.events.push(Reverse((end.to_bits(), self.seq, id)));
        match device {
            Device::Cpu => {
                self.cpu_free -= 1;
                self.totals.cpu_busy_s += duration;
                if duration > 0.0 {
                    let hot = kind.is_hot_chunk();
                    self.cpu_intervals.push((self.time, end, hot));
                }
            }
            Device::Accelerator => {
                self.acc_running = Some(id);
                self.totals.acc_busy_s += duration;
                self.win_acc_busy += duration;
            }
        }
        Ok(())
    }

    /// Finishes task `id` now without running it (an install nobody will read).
    fn drop_now(&mut self, id: usize) -> Result<()> {
        self.started[id] = true;
        self.dropped[id] = true;
        self.record_span(id, self.time);
        self.apply(id)
    }

    fn record_span(&mut self, id: usize, end: f64) {
        if !self.cfg.record_trace {
            return;
        }
        let t = &self.builder.graph().tasks()[id];
        let rows = t.kind.is_hot_chunk() && !self.dropped[id];
        self.trace.push(TaskSpan {
            id,
            kind: t.kind,
            device: t.device,
            batch: t.batch,
            super_batch: t.super_batch,
            chunk: t.chunk,
            start_s: self.time,
            end_s: end,
            version: self.version[id],
            hot_vertices: if rows {
                self.hot_vertices(id)
            } else {
                Vec::new()
            },
            dropped: self.dropped[id],
            dynamic: self.dynamic[id],
            deps: t.deps.clone(),
        });
    }

    /// The hot vertices of a hot-chunk task's chunk.
    fn hot_vertices(&self, id: usize) -> Vec<u32> {
        let Ok((sb, c)) = self.chunk_of(id) else {
            return Vec::new();
        };
        match (&self.plans[sb as usize], self.chunks[sb as usize].get(c)) {
            (Some(p), Some(ch)) => p.queue[ch.range.clone()].to_vec(),
            _ => Vec::new(),
        }
    }

    fn complete(&mut self, id: usize) -> Result<()> {
        match self.builder.graph().tasks()[id].device {
            Device::Cpu => self.cpu_free += 1,
            Device::Accelerator => self.acc_running = None,
        }
        self.apply(id)
    }

    /// What a finished task changes (its resource already given back).
    fn apply(&mut self, id: usize) -> Result<()> {
        self.done[id] = true;
        let (kind, batch, sb) = {
            let t = &self.builder.graph().tasks()[id];
            (t.kind, t.batch, t.super_batch)
        };
        match kind {
            TaskKind::OptimizerStep => {
                self.steps += 1;
                let b = batch.unwrap_or(0);
                self.batches[b as usize].end_s = self.time;
                if let Some(next) = self.batches.get_mut(b as usize + 1) {
                    next.start_s = self.time;
                }
            }
            TaskKind::PublishWeights => {
                self.published = self.published.max(self.version[id].unwrap_or(0));
                if self.pending_publish == Some(id) {
                    self.pending_publish = None;
                }
                if self.last_publish.get(sb as usize) == Some(&id) {
                    self.end_super_batch(sb)?;
                }
            }
            TaskKind::HotCompute => {
                if let Some(g) = &mut self.gate {
                    g.woken = true;
                }
                if let Some(install) = self.install_of[id] {
                    if self.dropped[id] || !self.live(sb) {
                        self.drop_now(install)?;
                    } else {
                        self.reports.push(id);
                    }
                }
            }
            TaskKind::HotInstall if !self.dropped[id] => {
                let rows = self.builder.graph().tasks()[id].est.vertices;
                self.totals.rows_installed += rows;
            }
            _ => {}
        }
        let users = std::mem::take(&mut self.users[id]);
        for u in users {
            self.missing[u] -= 1;
            if self.missing[u] == 0 {
                let t = &self.builder.graph().tasks()[u];
                if t.device == Device::Cpu && t.kind != TaskKind::HotInstall {
                    let p = if self.promoted[u] { 0 } else { t.priority };
                    self.cpu_ready.push(Reverse((p, u)));
                }
            }
        }
        Ok(())
    }

    // --- step 4 -------------------------------------------------------------

    fn end_super_batch(&mut self, j: u64) -> Result<()> {
        let (start, end) = (self.win_start, self.time);
        let window = end - start;
        let (mut busy, mut hot_busy) = (0.0, 0.0);
        for &(s, e, hot) in &self.cpu_intervals {
            let overlap = (e.min(end) - s.max(start)).max(0.0);
            busy += overlap;
            if hot {
                hot_busy += overlap;
            }
        }
        self.cpu_intervals.retain(|&(_, e, _)| e > end);
        let workers = self.cfg.cpu_workers;
        let idle = (workers as f64 * window - busy).max(0.0);
        // Splits of finished super-batches no longer hold cache rows.
        while self.built_splits.front().is_some_and(|&(s, _)| s <= j) {
            self.built_splits.pop_front();
        }
        let cache = self.cache_bytes();
        let free = self
            .cfg
            .device_memory_bytes
            .saturating_sub(self.cfg.training_bytes)
            .saturating_sub(cache);
        let (queue_len, split) = self.plans[j as usize]
            .as_ref()
            .map_or((0, self.fixed_split), |p| (p.queue.len(), p.split));
        self.sbs.push(SuperBatchRecord {
            index: j,
            start_s: start,
            end_s: end,
            acc_busy_s: self.win_acc_busy,
            acc_wait_hot_s: self.win_wait_hot,
            acc_wait_other_s: self.win_wait_other,
            cpu_busy_s: busy,
            cpu_hot_busy_s: hot_busy,
            cpu_idle_s: idle,
            queue_len,
            split,
            dropped_chunks: self.sb_dropped[j as usize],
            cache_bytes: cache,
        });
        // A decision nobody would apply (past the last super-batch) is not asked for:
        // the last windows only show the pipeline draining.
        let applies = self.cfg.pipeline.effective_from(j) < self.num_sbs;
        if let Some(m) = self.monitor.as_mut().filter(|_| applies) {
            let obs = Observation {
                super_batch: j,
                duration_s: window,
                acc_busy_s: self.win_acc_busy,
                acc_wait_hot_s: self.win_wait_hot,
                cpu_workers: workers,
                cpu_hot_busy_s: hot_busy,
                cpu_idle_s: idle,
                free_device_bytes: free,
            };
            if let Some(ev) = m.observe(&obs)? {
                self.moves.push(ev);
            }
        }
        self.note_cache();
        self.win_start = end;
        self.win_acc_busy = 0.0;
        self.win_wait_hot = 0.0;
        self.win_wait_other = 0.0;
        self.build(self.cfg.pipeline.effective_from(j))?;
        self.note_cache();
        Ok(())
    }

    /// Device cache bytes held: the largest cache among live splits (built and
    /// unfinished super-batches, and the monitor's decisions).
    fn cache_bytes(&self) -> u64 {
        let built = self
            .built_splits
            .iter()
            .map(|(_, s)| s.cached() as u64)
            .max()
            .unwrap_or(0)
            * self.cfg.model.feature_row_bytes();
        let decided = self
            .monitor
            .as_ref()
            .map_or(0, Monitor::committed_cache_bytes);
        built.max(decided)
    }

    fn note_cache(&mut self) {
        let c = self.cache_bytes();
        self.totals.max_cache_bytes = self.totals.max_cache_bytes.max(c);
    }

    // --- step 5 -------------------------------------------------------------

    fn finish(mut self) -> Result<SimReport> {
        let t = &mut self.totals;
        t.epoch_s = self.time;
        if self.time > 0.0 {
            t.acc_busy_fraction = t.acc_busy_s / self.time;
            t.cpu_busy_fraction = t.cpu_busy_s / (self.cfg.cpu_workers as f64 * self.time);
        }
        t.moves = self.moves.len() as u64;
        Ok(SimReport {
            batches: self.batches,
            super_batches: self.sbs,
            moves: self.moves,
            gaps: self.gaps,
            cold_computed: self.cold_computed,
            totals: self.totals,
            trace: self.trace,
        })
    }
}
