//! A deterministic discrete-event simulation of the super-batch pipeline.
//!
//! Two resources: `cpu_workers` CPU workers (each runs one task at a time, the
//! ready task with the smallest `(priority, id)` first) and the accelerator (one
//! in-order stream: it runs its tasks strictly by `(priority, id)` and idles when
//! the next one is not ready). Task costs come from a [`CostSource`]; the task
//! graph from [`GraphBuilder`] under the chosen placement; hot embeddings go
//! through the [`StalenessRule`] at each batch's gate; the [`Monitor`] decides
//! after every super-batch, and its split is used for the super-batches built
//! from then on. No threads, no clocks: the same inputs give the same report.
//!
//! # One run, step by step
//! 1. Build super-batches `0..=D` with the initial split.
//! 2. Repeat until nothing is left: start every task a free resource can start
//!    (the accelerator evaluates the gate before a [`TaskKind::HotLoad`], see
//!    [`crate::staleness`] steps 4–5); advance time to the next completion and
//!    apply it (versions move on optimizer steps and publications; a finished
//!    [`TaskKind::HotCompute`] writes its version into the embedding table).
//! 3. When super-batch `k` finishes (its last publication), close its window:
//!    record it, hand the monitor its [`Observation`] (unless no super-batch is
//!    left for a decision to apply to), trace any move, and build super-batch
//!    `k + 1 + D` with the split in effect for it.
//! 4. At the end, check every task ran, and sum the totals.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::builder::{hot_chunk_estimate, late_cold_estimates, GraphBuilder, ModelShape};
use crate::cost::CostSource;
use crate::error::{invalid, Result, SchedulerError};
use crate::monitor::{Monitor, MonitorConfig, MoveEvent, Observation};
use crate::pipeline::{HotSplit, PipelineConfig, SuperBatchPlan};
use crate::placement::{Orchestration, Placement};
use crate::report::{BatchRecord, SimReport, SimTotals, SuperBatchRecord, TaskSpan};
use crate::staleness::{Decision, GapHistogram, OnLate, StalenessRule};
use crate::task::{Device, LayerSpan, Task, TaskKind};
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
    /// least 4 per queue, bound `(D + 1) · N - 1 = 7`, `on_late = "wait"`, 4 CPU
    /// workers, 80 GB of device memory of which 8 GB for training, no monitor.
    pub fn layer(model: ModelShape) -> Result<Self> {
        let pipeline = PipelineConfig::new(4, 1, 64)?.with_min_chunks(4)?;
        Ok(Self {
            orchestration: Orchestration::Layer,
            pipeline,
            staleness: StalenessRule::new(pipeline.on_time_gap(), OnLate::Wait),
            model,
            cpu_workers: 4,
            initial_cpu: None,
            monitor: None,
            device_memory_bytes: 80 << 30,
            training_bytes: 8 << 30,
            record_trace: false,
        })
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

/// What a task is for, beyond its [`Task`] fields.
#[derive(Clone, Debug)]
enum Info {
    /// A batch task, or a late-cold task of a batch.
    Batch,
    /// A chunk of super-batch `sb`'s queue: positions `range` of the queue.
    Chunk {
        sb: u64,
        range: std::ops::Range<usize>,
    },
    /// An urgent hot task for these vertices.
    Urgent { verts: Vec<u32> },
}

/// The gate of the batch at the head of the accelerator's stream.
#[derive(Clone, Debug)]
struct GateWait {
    batch: u64,
    /// Tasks whose completion may satisfy the rule; the first to finish wakes
    /// the gate (the list is then emptied).
    awaiting: Vec<usize>,
    /// Urgent work must wait for this published version first.
    need_published: Option<u64>,
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
    info: Vec<Info>,
    version: Vec<Option<u64>>,
    dropped: Vec<bool>,
    dynamic: Vec<bool>,
    started: Vec<bool>,
    promoted: Vec<bool>,
    // per super-batch
    plans: Vec<Option<SuperBatchPlan>>,
    last_publish: Vec<usize>,
    forward: Vec<usize>,
    chunks: Vec<Vec<crate::builder::ChunkTasks>>,
    gates_passed: Vec<u32>,
    sb_dropped: Vec<u32>,
    built_splits: VecDeque<(u64, HotSplit)>,
    // hot table
    emb: Vec<Option<u64>>,
    /// Running hot computations covering each vertex, with their versions.
    inflight: Vec<Vec<(usize, u64)>>,
    /// An urgent computation created for the vertex and not started yet.
    queued: Vec<Option<usize>>,
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
    gate: Option<GateWait>,
    passed: Vec<bool>,
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
        let mut sim = Self {
            cfg,
            work,
            costs,
            builder: GraphBuilder::new(cfg.model, cfg.pipeline, placement),
            monitor,
            fixed_split: split,
            total_batches: total,
            num_sbs,
            missing: Vec::new(),
            users: Vec::new(),
            done: Vec::new(),
            info: Vec::new(),
            version: Vec::new(),
            dropped: Vec::new(),
            dynamic: Vec::new(),
            started: Vec::new(),
            promoted: Vec::new(),
            plans: vec![None; num_sbs as usize],
            last_publish: Vec::with_capacity(num_sbs as usize),
            forward: vec![0; total as usize],
            chunks: vec![Vec::new(); num_sbs as usize],
            gates_passed: vec![0; num_sbs as usize],
            sb_dropped: vec![0; num_sbs as usize],
            built_splits: VecDeque::new(),
            emb: vec![None; hot as usize],
            inflight: vec![Vec::new(); hot as usize],
            queued: vec![None; hot as usize],
            steps: 0,
            published: 0,
            time: 0.0,
            seq: 0,
            events: BinaryHeap::new(),
            cpu_free: cfg.cpu_workers,
            cpu_ready: BinaryHeap::new(),
            acc_queue: BinaryHeap::new(),
            acc_running: None,
            gate: None,
            passed: vec![false; total as usize],
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
        self.register(first, Info::Batch);
        for c in &tasks.chunks {
            self.info[c.compute] = Info::Chunk {
                sb: j,
                range: c.range.clone(),
            };
        }
        if let Some(last) = tasks.batches.last() {
            self.last_publish.push(last.publish);
        }
        for t in &tasks.batches {
            self.forward[t.batch as usize] = t.forward;
        }
        self.built_splits.push_back((j, split));
        self.chunks[j as usize] = tasks.chunks;
        self.plans[j as usize] = Some(plan);
        Ok(())
    }

    /// Registers tasks `first..` of the graph (deps already done do not count).
    fn register(&mut self, first: usize, info: Info) {
        let n = self.builder.graph().len();
        for id in first..n {
            let (deps, device, priority) = {
                let t = &self.builder.graph().tasks()[id];
                (t.deps.clone(), t.device, t.priority)
            };
            self.users.push(Vec::new());
            self.done.push(false);
            self.info.push(info.clone());
            self.version.push(None);
            self.dropped.push(false);
            self.dynamic.push(false);
            self.started.push(false);
            self.promoted.push(false);
            let mut missing = 0;
            for d in deps {
                if !self.done[d] {
                    missing += 1;
                    self.users[d].push(id);
                }
            }
            self.missing.push(missing);
            match device {
                Device::Accelerator => self.acc_queue.push(Reverse((priority, id))),
                Device::Cpu if missing == 0 => self.cpu_ready.push(Reverse((priority, id))),
                Device::Cpu => {}
            }
        }
    }

    /// Appends a task created at run time (urgent hot work, late cold work) to the
    /// builder's graph, so ids stay dense and PCIe accounting sees it.
    fn push_dynamic(&mut self, task: Task, info: Info) -> Result<usize> {
        let first = self.builder.graph().len();
        let id = self.builder.push_dynamic(task)?;
        self.register(first, info);
        self.dynamic[id] = true;
        Ok(id)
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
        if self.acc_running.is_some() {
            return Ok(());
        }
        // The gate may add tasks at the head (urgent work in front of it), so look
        // again after evaluating it.
        for _ in 0..4 {
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
                if !self.passed[b as usize] && !self.evaluate_gate(b)? {
                    if self.acc_queue.peek().map(|r| r.0 .1) == Some(head) {
                        return Ok(());
                    }
                    // Urgent work went in front of the gate: run it.
                    continue;
                }
            }
            self.acc_queue.pop();
            return self.start(head);
        }
        Ok(())
    }

    /// The gate of batch `b` (staleness protocol steps 4–5). `Ok(true)` when the
    /// batch may proceed.
    fn evaluate_gate(&mut self, b: u64) -> Result<bool> {
        if let Some(g) = &self.gate {
            if g.batch == b {
                let pending =
                    !g.awaiting.is_empty() || g.need_published.is_some_and(|v| self.published < v);
                if pending {
                    return Ok(false);
                }
            }
        }
        let rule = self.cfg.staleness;
        let sb = self.cfg.pipeline.super_batch_of(b);
        let plan = self.plans[sb as usize]
            .as_ref()
            .ok_or_else(|| invalid("super-batch plan", "built before its gate", sb))?;
        let k = (b - plan.batches.start) as usize;
        let mut late = Vec::new();
        let mut gaps = Vec::with_capacity(plan.batch_hot[k].len());
        for &u in &plan.batch_hot[k] {
            match rule.decide(self.emb[u as usize], b)? {
                Decision::Use { gap } => gaps.push(gap),
                Decision::Wait { .. } | Decision::ComputeCold { .. } => late.push(u),
            }
        }
        if !late.is_empty() && rule.on_late() == OnLate::Wait {
            self.block_on(b, sb, late)?;
            return Ok(false);
        }
        // Pass: record the reuses and send late vertices to the accelerator.
        let rec = &mut self.batches[b as usize];
        rec.hot_used = gaps.len() as u32;
        rec.max_gap = gaps.iter().copied().max();
        for &g in &gaps {
            self.gaps.record(g);
        }
        self.totals.hot_uses += gaps.len() as u64;
        if !late.is_empty() {
            self.compute_late(b, sb, &late)?;
        }
        self.passed[b as usize] = true;
        self.gates_passed[sb as usize] += 1;
        self.gate = None;
        Ok(true)
    }

    /// `on_late = "wait"`: find what to wait for, creating urgent work. The gate
    /// wakes when *any* awaited task finishes and then decides again, so a vertex
    /// covered by several computations waits only for the first to finish.
    fn block_on(&mut self, b: u64, sb: u64, late: Vec<u32>) -> Result<()> {
        let oldest = self.cfg.staleness.oldest_usable(b);
        let on_cpu = self.builder.placement().device(TaskKind::HotCompute) == Device::Cpu;
        // Work not started yet reads the weights published when it starts: it is
        // fresh enough only once version `oldest` is published.
        let later_is_fresh = !on_cpu || self.published >= oldest;
        let mut awaiting: Vec<usize> = Vec::new();
        let mut urgent = Vec::new();
        let mut need_published = None;
        for u in late {
            let running: Vec<usize> = self.inflight[u as usize]
                .iter()
                .filter(|&&(_, e)| e >= oldest)
                .map(|&(t, _)| t)
                .collect();
            if !running.is_empty() {
                awaiting.extend(running);
            } else if !later_is_fresh {
                need_published = Some(oldest);
            } else if let Some(c) = self.queued[u as usize] {
                awaiting.push(c);
            } else if let Some(c) = self.pending_chunk(sb, u) {
                // Its queue chunk has not started: run it next instead of
                // computing the vertex twice.
                self.promote(c);
                awaiting.push(c);
            } else {
                urgent.push(u);
            }
        }
        if !urgent.is_empty() {
            for &u in &urgent {
                self.queued[u as usize] = None;
            }
            let compute = self.push_urgent(b, sb, urgent.clone())?;
            for u in urgent {
                self.queued[u as usize] = Some(compute);
            }
            awaiting.push(compute);
            self.batches[b as usize].urgent_tasks += 1;
            self.totals.urgent_tasks += 1;
        }
        awaiting.sort_unstable();
        awaiting.dedup();
        self.gate = Some(GateWait {
            batch: b,
            awaiting,
            need_published,
        });
        Ok(())
    }

    /// The compute task of the not-yet-started chunk of `sb`'s queue that holds `u`.
    fn pending_chunk(&self, sb: u64, u: u32) -> Option<usize> {
        let plan = self.plans[sb as usize].as_ref()?;
        let pos = plan.queue.binary_search(&u).ok()?;
        let chunks = &self.chunks[sb as usize];
        let chunk = chunks.get(chunks.partition_point(|c| c.range.end <= pos))?;
        (!self.started[chunk.compute]).then_some(chunk.compute)
    }

    /// Gives a queued chunk's computation priority 0.
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

    /// An urgent computation of `verts`, priority 0. Returns its id.
    fn push_urgent(&mut self, b: u64, sb: u64, verts: Vec<u32>) -> Result<usize> {
        let est = hot_chunk_estimate(&self.cfg.model, verts.len() as u64);
        let task = self.dynamic_task(TaskKind::HotCompute, b, sb, vec![], est, 0);
        self.push_dynamic(task, Info::Urgent { verts })
    }

    /// `on_late = "compute"`: the late vertices become cold work of batch `b`,
    /// ahead of its forward.
    fn compute_late(&mut self, b: u64, sb: u64, late: &[u32]) -> Result<()> {
        for &u in late {
            self.cold_computed[u as usize] += 1;
        }
        self.batches[b as usize].late_computed = late.len() as u32;
        self.totals.late_computed += late.len() as u64;
        let (ge, ce) = late_cold_estimates(&self.cfg.model, late.len() as u64);
        let forward = self.forward[b as usize];
        let priority = self.builder.graph().tasks()[forward]
            .priority
            .saturating_sub(1);
        let g = self.dynamic_task(TaskKind::ColdGather, b, sb, vec![], ge, priority);
        let g = self.push_dynamic(g, Info::Batch)?;
        let c = self.dynamic_task(TaskKind::ColdCompute, b, sb, vec![g], ce, priority);
        let c = self.push_dynamic(c, Info::Batch)?;
        // The forward needs them (an edge added at run time).
        if !self.done[c] {
            self.missing[forward] += 1;
            self.users[c].push(forward);
        }
        Ok(())
    }

    fn dynamic_task(
        &self,
        kind: TaskKind,
        b: u64,
        sb: u64,
        deps: Vec<usize>,
        est: crate::task::Estimate,
        priority: u64,
    ) -> Task {
        Task {
            id: 0,
            kind,
            device: self.builder.placement().device(kind),
            batch: Some(b),
            super_batch: sb,
            chunk: None,
            layers: LayerSpan::one(0),
            deps,
            est,
            priority,
        }
    }

    fn start(&mut self, id: usize) -> Result<()> {
        self.started[id] = true;
        let (kind, device, batch, sb) = {
            let t = &self.builder.graph().tasks()[id];
            (t.kind, t.device, t.batch, t.super_batch)
        };
        // Pipeline step 6: chunks nobody will read are dropped.
        if let Info::Chunk { sb: q, .. } = &self.info[id] {
            let q = *q;
            let all = self.cfg.pipeline.batches_of(q, self.total_batches);
            if self.gates_passed[q as usize] as u64 == all.end - all.start {
                self.dropped[id] = true;
                if kind == TaskKind::HotCompute {
                    self.sb_dropped[q as usize] += 1;
                    self.totals.dropped_chunks += 1;
                }
            }
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
        if kind == TaskKind::HotCompute && !self.dropped[id] {
            let v = match device {
                Device::Cpu => self.published,
                Device::Accelerator => self.steps,
            };
            self.version[id] = Some(v);
            for u in self.hot_vertices(id) {
                self.inflight[u as usize].push((id, v));
                if self.queued[u as usize] == Some(id) {
                    self.queued[u as usize] = None;
                }
            }
        }
        let end = self.time + duration;
        if self.cfg.record_trace {
            let hot_compute = kind == TaskKind::HotCompute && !self.dropped[id];
            self.trace.push(TaskSpan {
                id,
                kind,
                device,
                batch,
                super_batch: sb,
                start_s: self.time,
                end_s: end,
                version: self.version[id],
                hot_vertices: if hot_compute {
                    self.hot_vertices(id)
                } else {
                    Vec::new()
                },
                dropped: self.dropped[id],
                dynamic: self.dynamic[id],
                deps: self.builder.graph().tasks()[id].deps.clone(),
            });
        }
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

    /// The hot vertices a hot-compute task writes.
    fn hot_vertices(&self, id: usize) -> Vec<u32> {
        match &self.info[id] {
            Info::Chunk { sb, range } => self.plans[*sb as usize]
                .as_ref()
                .map(|p| p.queue[range.clone()].to_vec())
                .unwrap_or_default(),
            Info::Urgent { verts } => verts.clone(),
            Info::Batch => Vec::new(),
        }
    }

    fn complete(&mut self, id: usize) -> Result<()> {
        self.done[id] = true;
        let (kind, device, batch) = {
            let t = &self.builder.graph().tasks()[id];
            (t.kind, t.device, t.batch)
        };
        match device {
            Device::Cpu => self.cpu_free += 1,
            Device::Accelerator => self.acc_running = None,
        }
        match kind {
            TaskKind::OptimizerStep => self.steps += 1,
            TaskKind::PublishWeights => {
                let b = batch.unwrap_or(0);
                self.published = self.published.max(b + 1);
                self.batches[b as usize].end_s = self.time;
                if let Some(next) = self.batches.get_mut(b as usize + 1) {
                    next.start_s = self.time;
                }
                let sb = self.cfg.pipeline.super_batch_of(b);
                if self.last_publish.get(sb as usize) == Some(&id) {
                    self.end_super_batch(sb)?;
                }
            }
            TaskKind::HotCompute if !self.dropped[id] => {
                if let Some(v) = self.version[id] {
                    for u in self.hot_vertices(id) {
                        let e = &mut self.emb[u as usize];
                        *e = Some(e.map_or(v, |old| old.max(v)));
                        self.inflight[u as usize].retain(|&(t, _)| t != id);
                    }
                }
            }
            _ => {}
        }
        if let Some(g) = &mut self.gate {
            if g.awaiting.contains(&id) {
                g.awaiting.clear();
            }
        }
        let users = std::mem::take(&mut self.users[id]);
        for u in users {
            self.missing[u] -= 1;
            if self.missing[u] == 0 {
                let t = &self.builder.graph().tasks()[u];
                if t.device == Device::Cpu {
                    let p = if self.promoted[u] { 0 } else { t.priority };
                    self.cpu_ready.push(Reverse((p, u)));
                }
            }
        }
        Ok(())
    }

    // --- step 3 -------------------------------------------------------------

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

    // --- step 4 -------------------------------------------------------------

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
