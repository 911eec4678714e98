//! A deterministic discrete-event simulation of the super-batch pipeline: the
//! protocol's state machine ([`crate::Protocol`]) driven with simulated
//! resources and work durations from a [`CostSource`] — the same decisions the
//! runtime's accelerator thread carries out, on a simulated clock.
//!
//! Two resources, as in the runtime: `cpu_workers` CPU workers (a job queue with
//! urgent jobs first, claims, dropping — protocol step 9) and the accelerator
//! thread, which carries out the protocol's actions one at a time (it is one
//! in-order stream: launches, bottom hops sampled ahead, installs, training
//! steps, publications' copies and loss reads take their cost's time,
//! everything else none, so a loss read's resolution finds its copy done).
//! The [`Monitor`] observes the windows the protocol marks; its split plans
//! every super-batch launched afterwards. No threads, no clocks: the same
//! inputs give the same report.
//!
//! Beside the clock, the simulator keeps the device as the actions leave it,
//! independently of the protocol's bookkeeping, and refuses an action that
//! contradicts it: the version of every slab and store row (a batch reads only
//! rows within the bound), the bottom hop sampled ahead for each batch and the
//! positions it skipped (a batch trains on it iff the engine would: it skipped
//! exactly the positions the batch trains with), the loss slots written, read
//! and shown (each read covers the batches trained since the last, each batch
//! is shown once, in order, and a non-finite loss rewinds exactly the steps
//! the device skipped), and the publications' copies (a job never reads
//! weights whose copy has not ended).
//!
//! # One run, step by step
//! 1. **Start**: one epoch of every workload batch, weights at version 0
//!    ([`Event::EpochStarted`]).
//! 2. **Drive the accelerator** while it is free: hand in every worker report
//!    waiting, poll the protocol, carry out the action. [`Action::Launch`] takes
//!    the top sampling of its batches and is answered with their hot
//!    destinations (in the simulator a batch's bottom destinations are its hot
//!    vertices, with no seeds among them) and the split in effect;
//!    [`Action::SampleBottoms`] takes the bottom hops' sampling;
//!    [`Action::Train`] takes its batch's step (late positions moved to the cold
//!    side, [`BatchShape::with_cold`]; its bottom hop sampled in it unless it
//!    trains on the one sampled ahead) and is answered with the next version
//!    (a batch of [`SimConfig::nonfinite`] writes a non-finite loss);
//!    [`Action::Publish`] takes its copy, which resolves when it ends
//!    ([`Event::PublicationResolved`]); [`Action::QueueLossRead`] takes its
//!    copy, [`Action::ResolveLossRead`] is answered at once with the read's
//!    first non-finite loss; [`Action::ShowLosses`] shows its batches (a
//!    non-finite one stops the run, as `train.on_nonfinite = "stop"` does);
//!    [`Action::Mark`] records the clock; [`Action::Install`] takes its
//!    upload; [`Action::Wait`] blocks until a report arrives;
//!    [`Action::Retire`] moves the drop watermark at once.
//! 3. **Start CPU jobs** on free workers: urgent first, then regular, in queue
//!    order; a droppable job ([`crate::Job::droppable`]) is reported dropped at
//!    once, a job whose claim was taken is skipped, any other reads the newest
//!    published version when it starts, computes once that publication's copy
//!    has ended, and reports its rows when its cost has passed.
//! 4. **Advance** the clock to the next completions (all of those at that time,
//!    oldest first) and apply them; back to 2.
//! 5. **After a super-batch** ([`Action::EndSuperBatch`]): close its window,
//!    record it, hand the monitor its [`Observation`] when the protocol says so.
//! 6. **End** at [`Action::Finished`]; a run where the accelerator waits with no
//!    CPU work left to report is an error ([`SchedulerError::SimulationStalled`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Range;

use crate::cost::{CostSource, Work};
use crate::error::{invalid, Result, SchedulerError};
use crate::monitor::{Monitor, MonitorConfig, Observation};
use crate::pipeline::{HotSplit, PipelineConfig, Publication};
use crate::protocol::{
    Action, BottomHops, ChunkKey, ClaimId, Event, Job, LaunchedBatch, Protocol, ProtocolConfig,
    ProtocolStats, TrainBatch,
};
use crate::report::{
    BatchRecord, LossReadRecord, MarkRecord, SimReport, SimTotals, Span, SuperBatchRecord,
};
use crate::staleness::{OnLate, StalenessRule};
use crate::workload::{ModelShape, Workload};

/// Everything a simulation run needs besides the workload and the costs.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Super-batch size, depth, chunk sizes.
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
    /// Initial CPU part of the hot set (`None`: all of it).
    pub initial_cpu: Option<u32>,
    /// The hybrid monitor.
    pub monitor: Option<MonitorConfig>,
    /// Device memory, bytes.
    pub device_memory_bytes: u64,
    /// Device memory training itself uses, bytes.
    pub training_bytes: u64,
    /// Keep a [`Span`] for every piece of work in [`SimReport::trace`].
    pub record_trace: bool,
    /// Keep hot rows across super-batches ([`ProtocolConfig::reuse`]; the
    /// runtime's `orchestration.reuse_across_superbatches`).
    pub reuse: bool,
    /// When bottom hops are sampled ([`ProtocolConfig::bottoms`]).
    pub bottoms: BottomHops,
    /// Batches between a step and the read of its loss (the runtime's
    /// `device.loss_lag`; at most 1: every step reads its own).
    pub loss_lag: usize,
    /// The measurement window ([`Event::EpochStarted`]'s `window`).
    pub window: Option<Range<usize>>,
    /// A batch whose loss is not finite: the device skips its step and every
    /// later one until the version is rewound, and the run stops when it is
    /// shown.
    pub nonfinite: Option<usize>,
}

impl SimConfig {
    /// The runtime's configuration: `N = 4`, `D = 1`, chunks of at most 1024 and
    /// at least 4 per queue, bound `(D + 1) · N − 1 = 7`, `on_late = "wait"`,
    /// publication as the runtime decides, bottom hops sampled ahead skipping
    /// the planned positions, a loss lag of 8 (a GPU's default), 4 CPU
    /// workers, 80 GB of device memory of which 8 GB for training, no monitor,
    /// no measurement window.
    pub fn layer(model: ModelShape) -> Result<Self> {
        let pipeline = PipelineConfig::new(4, 1, 1024)?.with_min_chunks(4)?;
        Ok(Self {
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
            reuse: true,
            bottoms: BottomHops::SkipPlanned,
            loss_lag: 8,
            window: None,
            nonfinite: None,
        })
    }

    /// The publication in effect: [`SimConfig::publication`], or the runtime's
    /// rule for the staleness bound.
    pub fn effective_publication(&self) -> Publication {
        self.publication
            .unwrap_or_else(|| Publication::for_bound(&self.pipeline, self.staleness.bound()))
    }

    /// The protocol's configuration.
    pub fn protocol(&self) -> ProtocolConfig {
        ProtocolConfig {
            pipeline: self.pipeline,
            staleness: self.staleness,
            publication: self.effective_publication(),
            reuse: self.reuse,
            bottoms: self.bottoms,
        }
    }
}

/// A contradiction between the actions and the simulator's device model.
fn device_model(what: String) -> SchedulerError {
    SchedulerError::ProtocolInvariant {
        what: format!("simulated device: {what}"),
    }
}

/// Runs the workload under `cfg` with work durations from `costs`.
pub fn simulate<C: CostSource>(cfg: &SimConfig, work: &Workload, costs: C) -> Result<SimReport> {
    let mut sim = Sim::new(cfg, work, costs)?;
    sim.run()?;
    Ok(sim.finish())
}

/// What ends at a point of simulated time.
#[derive(Clone, Debug)]
enum Completion {
    /// The accelerator's launch of a super-batch.
    Launched { super_batch: u64, split: HotSplit },
    /// The accelerator's training step of a batch.
    Trained { batch: usize, version: u64 },
    /// The accelerator's download of weights of `version`.
    Published { version: u64 },
    /// Other accelerator work.
    Free,
    /// A worker's job.
    Computed {
        key: ChunkKey,
        version: u64,
        rows: u32,
        span: Option<usize>,
    },
}

/// A worker report waiting for the accelerator thread.
#[derive(Clone, Copy, Debug)]
enum Report {
    Computed {
        key: ChunkKey,
        version: u64,
        rows: u32,
        span: Option<usize>,
    },
    Dropped {
        key: ChunkKey,
    },
}

/// What the accelerator thread is doing.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Acc {
    Free,
    Busy,
    /// Blocked at batch `batch`'s gate since `since`.
    Waiting {
        batch: usize,
        since: f64,
    },
}

struct Sim<'a, C> {
    cfg: &'a SimConfig,
    work: &'a Workload,
    costs: C,
    protocol: Protocol,
    monitor: Option<Monitor>,
    fixed_split: HotSplit,
    time: f64,
    seq: u64,
    /// `(time, seq, what)`, at most one per worker plus one for the accelerator.
    pending: Vec<(f64, u64, Completion)>,
    // the CPU side
    urgent: VecDeque<Job>,
    regular: VecDeque<Job>,
    claimed: HashSet<ClaimId>,
    idle_workers: u32,
    /// The newest publication: its version and when its copy ends (jobs
    /// read it, computing once the copy ended).
    issued: (u64, f64),
    retired_below: u64,
    reports: VecDeque<Report>,
    /// The computation span of each report handed in (by report id).
    report_span: Vec<Option<usize>>,
    /// `(start, end)` of every computation.
    cpu_busy: Vec<(f64, f64)>,
    // the accelerator
    acc: Acc,
    finished: Option<ProtocolStats>,
    // per super-batch
    splits: Vec<HotSplit>,
    queue_len: Vec<usize>,
    dropped: Vec<u32>,
    /// Splits of launched super-batches not finished yet (they hold cache rows).
    live_splits: VecDeque<(u64, HotSplit)>,
    // the window of the super-batch in progress
    win_start: f64,
    win_acc_busy: f64,
    win_wait: f64,
    // records
    batches: Vec<BatchRecord>,
    sbs: Vec<SuperBatchRecord>,
    moves: Vec<crate::monitor::MoveEvent>,
    cold_computed: Vec<u64>,
    totals: SimTotals,
    trace: Vec<Span>,
    /// The device as the actions leave it, independently of the protocol's
    /// bookkeeping: per live super-batch the version of each slab row, and
    /// the hot-row store's version per vertex (`None`: never written).
    slab_versions: HashMap<u64, Vec<Option<u64>>>,
    store_versions: Vec<Option<u64>>,
    /// Per batch, the positions its bottom hop sampled ahead skipped.
    bottom_hops: HashMap<usize, Vec<u32>>,
    /// Loss slots: batches trained since the last read was queued, in slot
    /// order; the read in flight.
    unqueued: Vec<usize>,
    in_flight: Option<Range<usize>>,
    /// The first non-finite batch whose step the device skipped, and the
    /// steps it skipped since (its guard).
    skipping: Option<usize>,
    skipped: u64,
    /// Batches trained so far.
    trained: usize,
    loss_reads: Vec<LossReadRecord>,
    shown: Vec<usize>,
    marks: Vec<MarkRecord>,
    rewound: Option<(usize, u64)>,
}

impl<'a, C: CostSource> Sim<'a, C> {
    fn new(cfg: &'a SimConfig, work: &'a Workload, costs: C) -> Result<Self> {
        if cfg.cpu_workers == 0 {
            return Err(invalid("cpu_workers", "at least 1", 0));
        }
        cfg.model.validate()?;
        let hot = work.hot_count();
        let cpu = cfg.initial_cpu.unwrap_or(hot);
        let split = HotSplit::new(hot, cpu).map_err(|_| {
            invalid(
                "initial_cpu",
                format!("at most the workload's hot count ({hot})"),
                cpu,
            )
        })?;
        let row = cfg.model.feature_row_bytes();
        let monitor = cfg
            .monitor
            .map(|m| Monitor::new(m, cfg.pipeline, split, row))
            .transpose()?;
        let total = work.len() as u64;
        let num_sbs = cfg.pipeline.num_super_batches(total) as usize;
        Ok(Self {
            cfg,
            work,
            costs,
            protocol: Protocol::new(cfg.protocol()),
            monitor,
            fixed_split: split,
            time: 0.0,
            seq: 0,
            pending: Vec::new(),
            urgent: VecDeque::new(),
            regular: VecDeque::new(),
            claimed: HashSet::new(),
            idle_workers: cfg.cpu_workers,
            issued: (0, 0.0),
            retired_below: 0,
            reports: VecDeque::new(),
            report_span: Vec::new(),
            cpu_busy: Vec::new(),
            acc: Acc::Free,
            finished: None,
            splits: vec![split; num_sbs],
            queue_len: vec![0; num_sbs],
            dropped: vec![0; num_sbs],
            live_splits: VecDeque::new(),
            win_start: 0.0,
            win_acc_busy: 0.0,
            win_wait: 0.0,
            batches: (0..total)
                .map(|b| BatchRecord {
                    batch: b,
                    super_batch: cfg.pipeline.super_batch_of(b),
                    ..BatchRecord::default()
                })
                .collect(),
            sbs: Vec::with_capacity(num_sbs),
            moves: Vec::new(),
            cold_computed: vec![0; hot as usize],
            totals: SimTotals::default(),
            slab_versions: HashMap::new(),
            store_versions: Vec::new(),
            trace: Vec::new(),
            bottom_hops: HashMap::new(),
            unqueued: Vec::new(),
            in_flight: None,
            skipping: None,
            skipped: 0,
            trained: 0,
            loss_reads: Vec::new(),
            shown: Vec::new(),
            marks: Vec::new(),
            rewound: None,
        })
    }

    /// Steps 1–4.
    fn run(&mut self) -> Result<()> {
        self.protocol.handle(Event::EpochStarted {
            batches: 0..self.work.len(),
            version: 0,
            loss_lag: self.cfg.loss_lag,
            window: self.cfg.window.clone(),
        })?;
        loop {
            self.drive_accelerator()?;
            if self.finished.is_some() {
                return Ok(());
            }
            if self.dispatch_cpu()? {
                continue;
            }
            let Some(next) = self
                .pending
                .iter()
                .map(|p| (p.0, p.1))
                .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            else {
                return Err(SchedulerError::SimulationStalled {
                    time_s: self.time,
                    what: format!("the accelerator is {:?} and no CPU job is left", self.acc),
                });
            };
            self.time = next.0;
            // Every completion at this time, oldest first.
            let mut now: Vec<(f64, u64, Completion)> = Vec::new();
            let mut i = 0;
            while i < self.pending.len() {
                if self.pending[i].0 <= self.time {
                    now.push(self.pending.swap_remove(i));
                } else {
                    i += 1;
                }
            }
            now.sort_by_key(|p| p.1);
            for (_, _, c) in now {
                self.complete(c)?;
            }
        }
    }

    fn at(&mut self, duration: f64, what: Completion) {
        self.seq += 1;
        self.pending.push((self.time + duration, self.seq, what));
    }

    /// The duration of `work`, checked, with its PCIe bytes counted.
    fn cost(&mut self, work: &Work) -> Result<f64> {
        let d = self.costs.duration(work);
        if !(d.is_finite() && d >= 0.0) {
            return Err(invalid(
                "work cost",
                format!(
                    "a finite, non-negative duration for {} of super-batch {}",
                    work.kind, work.super_batch
                ),
                d,
            ));
        }
        self.totals.pcie_bytes += work.est.pcie_bytes;
        Ok(d)
    }

    fn span(&mut self, work: &Work, start: f64, end: f64) -> Option<usize> {
        if !self.cfg.record_trace {
            return None;
        }
        self.trace.push(Span {
            kind: work.kind,
            device: work.device,
            start_s: start,
            end_s: end,
            batch: work.batch,
            super_batch: work.super_batch,
            chunk: None,
            vertices: work.est.vertices,
            version: None,
            source: None,
            urgent: None,
        });
        Some(self.trace.len() - 1)
    }

    /// Accelerator work of `duration` starting now.
    fn busy(&mut self, duration: f64, what: Completion) {
        self.busy_until(self.time + duration, what);
    }

    /// Accelerator work from now until `end`.
    fn busy_until(&mut self, end: f64, what: Completion) {
        let duration = end - self.time;
        self.totals.acc_busy_s += duration;
        self.win_acc_busy += duration;
        self.acc = Acc::Busy;
        self.seq += 1;
        self.pending.push((end, self.seq, what));
    }

    /// Step 2.
    fn drive_accelerator(&mut self) -> Result<()> {
        while self.acc == Acc::Free && self.finished.is_none() {
            while let Some(r) = self.reports.pop_front() {
                match r {
                    Report::Computed {
                        key,
                        version,
                        rows,
                        span,
                    } => {
                        self.report_span.push(span);
                        self.protocol
                            .handle(Event::ChunkComputed { key, version, rows })?;
                    }
                    Report::Dropped { key } => {
                        self.protocol.handle(Event::JobDropped { key })?;
                    }
                }
            }
            let Some(action) = self.protocol.poll()? else {
                return Err(SchedulerError::ProtocolInvariant {
                    what: "the protocol awaits an answer the simulator did not give".into(),
                });
            };
            self.execute(action)?;
        }
        Ok(())
    }

    fn local(&self) -> u64 {
        self.sbs.len() as u64
    }

    fn execute(&mut self, action: Action) -> Result<()> {
        let m = self.cfg.model;
        match action {
            Action::Publish { version, .. } => {
                let w = Work::publish(&m, self.local());
                let d = self.cost(&w)?;
                if let Some(s) = self.span(&w, self.time, self.time + d) {
                    self.trace[s].version = Some(version);
                }
                self.issued = (version, self.time + d);
                self.busy(d, Completion::Published { version });
            }
            Action::SampleBottoms {
                super_batch,
                batches,
                skip,
            } => {
                if skip.len() != batches.len() {
                    return Err(device_model(format!(
                        "{} skip masks for the bottom hops of batches {batches:?}",
                        skip.len()
                    )));
                }
                let split = self.splits[super_batch as usize];
                let mut end = self.time;
                for (k, mut skip) in batches.zip(skip) {
                    // The hop samples every destination it does not skip.
                    let shape = self.work.shape(k, &split, &m)?;
                    let unskipped = shape.hot.saturating_sub(skip.len() as u64);
                    let shape = shape.with_cold(unskipped, m.bottom_fanout);
                    let w = Work::sample_bottom(&shape, k as u64, super_batch);
                    let d = self.cost(&w)?;
                    self.span(&w, end, end + d);
                    end += d;
                    skip.sort_unstable();
                    self.bottom_hops.insert(k, skip);
                }
                self.busy_until(end, Completion::Free);
            }
            Action::QueueLossRead { batches } => {
                if self.in_flight.is_some() || !batches.clone().eq(self.unqueued.iter().copied()) {
                    return Err(device_model(format!(
                        "a read of the loss slots of batches {batches:?}: the slots hold \
                         batches {:?}, the read in flight is {:?}",
                        self.unqueued, self.in_flight
                    )));
                }
                self.unqueued.clear();
                self.in_flight = Some(batches.clone());
                let w = Work::loss_read(batches.len() as u64, self.local());
                let d = self.cost(&w)?;
                self.span(&w, self.time, self.time + d);
                self.loss_reads.push(LossReadRecord {
                    batches,
                    super_batch: self.local(),
                    queued_s: self.time,
                    resolved_s: None,
                });
                self.busy(d, Completion::Free);
            }
            Action::ResolveLossRead { batches } => {
                if self.in_flight.as_ref() != Some(&batches) {
                    return Err(device_model(format!(
                        "the resolution of a read of batches {batches:?}: the read in flight \
                         is {:?}",
                        self.in_flight
                    )));
                }
                self.in_flight = None;
                if let Some(r) = self.loss_reads.last_mut() {
                    r.resolved_s = Some(self.time);
                }
                let nonfinite = self.cfg.nonfinite.filter(|b| batches.contains(b));
                self.protocol.handle(Event::LossesRead { nonfinite })?;
            }
            Action::ShowLosses { batches, rewind } => self.show(batches, rewind)?,
            Action::Mark { batch, start } => self.marks.push(MarkRecord {
                batch,
                start,
                time_s: self.time,
                trained: self.trained,
                shown: self.shown.len(),
            }),
            Action::Launch {
                super_batch,
                local,
                batches,
            } => {
                let split = self
                    .monitor
                    .as_ref()
                    .map_or(self.fixed_split, |mo| mo.split_for(local));
                self.splits[local as usize] = split;
                self.live_splits.push_back((local, split));
                self.note_cache();
                let mut end = self.time;
                for k in batches {
                    let shape = self.work.shape(k, &split, &m)?;
                    let w = Work::sample_top(&shape, k as u64, local);
                    let d = self.cost(&w)?;
                    self.span(&w, end, end + d);
                    end += d;
                }
                self.busy_until(end, Completion::Launched { super_batch, split });
            }
            Action::ReserveSlab {
                rows, super_batch, ..
            } => {
                self.queue_len[super_batch as usize] = rows;
                self.slab_versions.insert(super_batch, vec![None; rows]);
            }
            Action::Keep {
                super_batch,
                rows,
                vertices,
                version,
                ..
            } => {
                for (&r, &v) in rows.iter().zip(&vertices) {
                    let e = self.slab_row(super_batch, r)?;
                    if e != Some(version) {
                        return Err(device_model(format!(
                            "keep of super-batch {super_batch} row {r} at version {version}: \
                             the slab holds {e:?}"
                        )));
                    }
                    let v = v as usize;
                    if v >= self.store_versions.len() {
                        self.store_versions.resize(v + 1, None);
                    }
                    self.store_versions[v] = e;
                }
            }
            Action::Carry {
                super_batch,
                rows,
                vertices,
                ..
            } => {
                for (&r, &v) in rows.iter().zip(&vertices) {
                    let e = self.store_versions.get(v as usize).copied().flatten();
                    if e.is_none() {
                        return Err(device_model(format!(
                            "carry of vertex {v} into super-batch {super_batch}: not stored"
                        )));
                    }
                    self.slab_row(super_batch, r)?;
                    if let Some(slab) = self.slab_versions.get_mut(&super_batch) {
                        slab[r as usize] = e;
                    }
                }
            }
            Action::QueueJob(job) => match job.urgent {
                Some(u) => {
                    self.batches[u.batch].urgent_jobs += 1;
                    self.urgent.push_back(job);
                }
                None => self.regular.push_back(job),
            },
            Action::Install {
                report,
                key,
                rows,
                version,
                ..
            } => {
                let slab = self
                    .slab_versions
                    .get_mut(&key.super_batch)
                    .ok_or_else(|| device_model(format!("install into {key:?}: no slab")))?;
                match slab.get_mut(rows.start as usize..rows.end as usize) {
                    Some(r) => r.fill(Some(version)),
                    None => return Err(device_model(format!("install {key:?} rows {rows:?}"))),
                }
                let w = Work::install(&m, rows.len() as u64, key.super_batch);
                let d = self.cost(&w)?;
                if let Some(s) = self.span(&w, self.time, self.time + d) {
                    let t = &mut self.trace[s];
                    t.chunk = Some(key.chunk);
                    t.version = Some(version);
                    t.source = self.report_span.get(report.0 as usize).copied().flatten();
                }
                self.busy(d, Completion::Free);
            }
            Action::Discard { .. } => {}
            Action::BeginSuperBatch { local, .. } => {
                if local == 0 {
                    self.win_start = self.time;
                }
            }
            Action::Gate { batch, .. } => self.batches[batch].start_s = self.time,
            Action::Wait { batch, .. } => {
                self.acc = Acc::Waiting {
                    batch,
                    since: self.time,
                };
            }
            Action::Train(t) => self.train(t)?,
            Action::Retire { below } => self.retired_below = below,
            Action::EndSuperBatch {
                super_batch,
                local,
                observe,
                hot,
            } => {
                self.slab_versions.remove(&super_batch);
                self.end_super_batch(local, observe)?;
                if let Some(r) = self.sbs.last_mut() {
                    r.hot = hot;
                }
            }
            Action::Finished { stats, .. } => self.finished = Some(stats),
        }
        Ok(())
    }

    /// The version of row `r` of super-batch `g`'s slab in the device model.
    fn slab_row(&self, g: u64, r: u32) -> Result<Option<u64>> {
        self.slab_versions
            .get(&g)
            .and_then(|s| s.get(r as usize).copied())
            .ok_or_else(|| device_model(format!("row {r} of super-batch {g}'s slab")))
    }

    /// [`Action::Train`]: the batch's step, its late positions cold.
    fn train(&mut self, t: TrainBatch) -> Result<()> {
        let m = self.cfg.model;
        let k = t.batch;
        // What the device reads: every slab row present, within the bound,
        // not from the future, and the largest gap the protocol reported.
        let bound = self.cfg.staleness.bound();
        let mut max_gap = None;
        for &r in &t.rows {
            match self.slab_row(t.super_batch, r)? {
                Some(e) if e <= t.version && t.version - e <= bound => {
                    max_gap = max_gap.max(Some(t.version - e));
                }
                e => {
                    return Err(device_model(format!(
                        "batch {k} at version {} reads slab row {r} of super-batch {} \
                         holding {e:?} (bound {bound})",
                        t.version, t.super_batch
                    )))
                }
            }
        }
        if max_gap != t.max_gap {
            return Err(device_model(format!(
                "batch {k}: the slab's largest gap is {max_gap:?}, the protocol's {:?}",
                t.max_gap
            )));
        }
        let split = self.splits[t.local as usize];
        let shape = self.work.shape(k, &split, &m)?;
        let used = t.positions.len() as u64;
        if used + t.cold.len() as u64 != shape.hot {
            return Err(SchedulerError::SizeMismatch {
                what: "hot positions of a trained batch (used + cold vs CPU-hot)",
                expected: shape.hot as usize,
                found: (used + t.cold.len() as u64) as usize,
            });
        }
        let shape = shape.with_cold(t.cold.len() as u64, m.bottom_fanout);
        // Its bottom hop: the one sampled ahead iff it skipped exactly the
        // positions the step skips (the engine's rule: the planned hot ones
        // under `SkipPlanned`, none otherwise), else sampled in the step.
        let want: Vec<u32> = if self.cfg.bottoms == BottomHops::SkipPlanned {
            let mut p = t.positions.clone();
            p.sort_unstable();
            p
        } else {
            Vec::new()
        };
        let ahead = self.bottom_hops.remove(&k).is_some_and(|skip| skip == want);
        if ahead != t.bottom_ahead {
            return Err(device_model(format!(
                "batch {k} trains on the bottom hop sampled ahead: the device says {ahead}, \
                 the protocol {}",
                t.bottom_ahead
            )));
        }
        // Its loss: read in the step, or written to the next slot.
        let deferred = self.cfg.loss_lag > 1;
        let slot = deferred.then_some(self.unqueued.len());
        if t.loss_slot != slot {
            return Err(device_model(format!(
                "batch {k} writes loss slot {:?}, the next free is {slot:?}",
                t.loss_slot
            )));
        }
        if deferred {
            self.unqueued.push(k);
            if self.skipping.is_some() || self.cfg.nonfinite == Some(k) {
                // The guard skips this step and every later one.
                self.skipping.get_or_insert(k);
                self.skipped += 1;
            }
        }
        let w = if ahead {
            Work::train_bottom_ahead(&m, &shape, k as u64, t.local)
        } else {
            Work::train(&m, &shape, k as u64, t.local)
        };
        let d = self.cost(&w)?;
        if let Some(s) = self.span(&w, self.time, self.time + d) {
            self.trace[s].version = Some(t.version);
        }
        let hot = &self.work.batches()[k].hot;
        for &p in &t.cold {
            self.cold_computed[hot[p as usize] as usize] += 1;
        }
        let rec = &mut self.batches[k];
        rec.hot_used = used as u32;
        rec.late_computed = t.cold.len() as u32;
        rec.max_gap = t.max_gap;
        rec.pcie_bytes = w.est.pcie_bytes;
        rec.bottom_ahead = ahead;
        self.busy(
            d,
            Completion::Trained {
                batch: k,
                version: t.version + 1,
            },
        );
        Ok(())
    }

    /// [`Action::ShowLosses`]: each batch once, in order, after it trained; a
    /// rewind only at the non-finite batch, by the steps the device skipped.
    fn show(&mut self, batches: Range<usize>, rewind: u64) -> Result<()> {
        for k in batches.clone() {
            if k != self.shown.len() || k >= self.trained {
                return Err(device_model(format!(
                    "batch {k} shown after {} batches shown and {} trained",
                    self.shown.len(),
                    self.trained
                )));
            }
            self.shown.push(k);
            self.batches[k].shown_s = Some(self.time);
        }
        let last = batches.end.checked_sub(1);
        if rewind > 0 || (self.skipping.is_some() && self.skipping == last) {
            if self.skipping != last || rewind != self.skipped {
                return Err(device_model(format!(
                    "a rewind of {rewind} steps after batch {last:?}: the device skipped \
                     {} steps from batch {:?}",
                    self.skipped, self.skipping
                )));
            }
            self.rewound = last.map(|b| (b, rewind));
            self.skipping = None;
            self.skipped = 0;
            self.unqueued.clear();
        }
        if self.cfg.nonfinite.is_some_and(|b| batches.contains(&b)) {
            // `train.on_nonfinite = "stop"`: the session stops at it.
            self.protocol.handle(Event::Stop)?;
        }
        Ok(())
    }

    /// Applies what ends now (step 4).
    fn complete(&mut self, c: Completion) -> Result<()> {
        match c {
            Completion::Launched { super_batch, split } => {
                self.acc = Acc::Free;
                let range = self
                    .cfg
                    .pipeline
                    .batches_of(super_batch, self.work.len() as u64);
                let batches = range
                    .map(|k| LaunchedBatch {
                        seeds: 0,
                        bottom: self.work.batches()[k as usize].hot.clone(),
                    })
                    .collect();
                self.protocol.handle(Event::Launched {
                    super_batch,
                    split,
                    batches,
                })?;
            }
            Completion::Trained { batch, version } => {
                self.acc = Acc::Free;
                self.trained += 1;
                self.batches[batch].end_s = self.time;
                self.protocol
                    .handle(Event::BatchTrained { batch, version })?;
            }
            Completion::Published { version } => {
                self.acc = Acc::Free;
                self.protocol
                    .handle(Event::PublicationResolved { version })?;
            }
            Completion::Free => self.acc = Acc::Free,
            Completion::Computed {
                key,
                version,
                rows,
                span,
            } => {
                self.idle_workers += 1;
                self.deliver(Report::Computed {
                    key,
                    version,
                    rows,
                    span,
                });
            }
        }
        Ok(())
    }

    /// A report for the accelerator thread; it wakes a waiting gate.
    fn deliver(&mut self, r: Report) {
        if let Report::Dropped { key } = r {
            if let Some(d) = self.dropped.get_mut(key.super_batch as usize) {
                *d += 1;
            }
        }
        self.reports.push_back(r);
        if let Acc::Waiting { batch, since } = self.acc {
            let dt = self.time - since;
            self.totals.acc_wait_hot_s += dt;
            self.win_wait += dt;
            self.batches[batch].hot_wait_s += dt;
            self.acc = Acc::Free;
        }
    }

    /// Step 3; `true` if a report woke the accelerator.
    fn dispatch_cpu(&mut self) -> Result<bool> {
        let waiting = matches!(self.acc, Acc::Waiting { .. });
        while self.idle_workers > 0 {
            let Some(job) = self.urgent.pop_front().or_else(|| self.regular.pop_front()) else {
                break;
            };
            if job.droppable(self.retired_below) {
                self.deliver(Report::Dropped { key: job.key });
                continue;
            }
            if !self.claimed.insert(job.claim) {
                continue;
            }
            let w = Work::hot_compute(
                &self.cfg.model,
                job.vertices.len() as u64,
                job.key.super_batch,
            );
            let d = self.cost(&w)?;
            // It reads the newest publication and computes once its copy ended.
            let (version, ready) = self.issued;
            let start = self.time.max(ready);
            let span = self.span(&w, start, start + d);
            if let Some(s) = span {
                let t = &mut self.trace[s];
                t.chunk = Some(job.key.chunk);
                t.version = Some(version);
                t.batch = job.urgent.map(|u| u.batch as u64);
                t.urgent = job.urgent.map(|u| u.recompute);
            }
            self.idle_workers -= 1;
            self.totals.cpu_busy_s += d;
            self.cpu_busy.push((start, start + d));
            self.at(
                start - self.time + d,
                Completion::Computed {
                    key: job.key,
                    version,
                    rows: job.vertices.len() as u32,
                    span,
                },
            );
        }
        Ok(waiting && self.acc == Acc::Free)
    }

    /// Step 5.
    fn end_super_batch(&mut self, j: u64, observe: bool) -> Result<()> {
        let (start, end) = (self.win_start, self.time);
        let window = end - start;
        let hot_busy: f64 = self
            .cpu_busy
            .iter()
            .map(|&(s, e)| (e.min(end) - s.max(start)).max(0.0))
            .sum();
        self.cpu_busy.retain(|&(_, e)| e > end);
        let workers = self.cfg.cpu_workers;
        let idle = (workers as f64 * window - hot_busy).max(0.0);
        while self.live_splits.front().is_some_and(|&(s, _)| s <= j) {
            self.live_splits.pop_front();
        }
        let cache = self.cache_bytes();
        let free = self
            .cfg
            .device_memory_bytes
            .saturating_sub(self.cfg.training_bytes)
            .saturating_sub(cache);
        self.sbs.push(SuperBatchRecord {
            index: j,
            start_s: start,
            end_s: end,
            acc_busy_s: self.win_acc_busy,
            acc_wait_hot_s: self.win_wait,
            cpu_hot_busy_s: hot_busy,
            cpu_idle_s: idle,
            queue_len: self.queue_len[j as usize],
            split: self.splits[j as usize],
            dropped_jobs: 0,
            cache_bytes: cache,
            hot: Default::default(),
        });
        if let Some(m) = self.monitor.as_mut().filter(|_| observe) {
            let obs = Observation {
                super_batch: j,
                duration_s: window,
                acc_busy_s: self.win_acc_busy,
                acc_wait_hot_s: self.win_wait,
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
        self.win_wait = 0.0;
        Ok(())
    }

    /// Device cache bytes held: the largest cache among the splits of launched,
    /// unfinished super-batches and the monitor's decisions.
    fn cache_bytes(&self) -> u64 {
        let built = self
            .live_splits
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

    /// Step 6.
    fn finish(mut self) -> SimReport {
        let end = self.time;
        let t = &mut self.totals;
        t.epoch_s = end;
        // Jobs still running at the end count up to the end.
        let overrun: f64 = self
            .pending
            .iter()
            .filter(|p| matches!(p.2, Completion::Computed { .. }))
            .map(|p| (p.0 - end).max(0.0))
            .sum();
        t.cpu_busy_s = (t.cpu_busy_s - overrun).max(0.0);
        if end > 0.0 {
            t.acc_busy_fraction = t.acc_busy_s / end;
            t.cpu_busy_fraction = t.cpu_busy_s / (self.cfg.cpu_workers as f64 * end);
        }
        t.moves = self.moves.len() as u64;
        for (r, &d) in self.sbs.iter_mut().zip(&self.dropped) {
            r.dropped_jobs = d;
        }
        SimReport {
            batches: self.batches,
            super_batches: self.sbs,
            moves: self.moves,
            stats: self.finished.unwrap_or_default(),
            cold_computed: self.cold_computed,
            totals: self.totals,
            trace: self.trace,
            loss_reads: self.loss_reads,
            shown: self.shown,
            marks: self.marks,
            rewound: self.rewound,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{Scripted, WorkKind};
    use crate::workload::SyntheticWorkload;

    fn setup() -> (SimConfig, Workload) {
        let model = ModelShape::new(16, 8, 2, 5).unwrap();
        let cfg = SimConfig::layer(model).unwrap();
        let work = SyntheticWorkload::small(12, 3).generate().unwrap();
        (cfg, work)
    }

    #[test]
    fn bad_configurations_and_costs_are_errors() {
        let (mut cfg, work) = setup();
        let unit = |_: &Work| 1e-3;
        cfg.cpu_workers = 0;
        assert!(simulate(&cfg, &work, Scripted(unit)).is_err());
        cfg.cpu_workers = 2;
        cfg.initial_cpu = Some(work.hot_count() + 1);
        let e = simulate(&cfg, &work, Scripted(unit)).unwrap_err();
        assert!(e.to_string().contains("initial_cpu"), "{e}");
        cfg.initial_cpu = None;
        let e = simulate(&cfg, &work, Scripted(|_: &Work| -1.0)).unwrap_err();
        assert!(e.to_string().contains("work cost"), "{e}");
        let e = simulate(&cfg, &work, Scripted(|_: &Work| f64::NAN)).unwrap_err();
        assert!(e.to_string().contains("work cost"), "{e}");
    }

    #[test]
    fn a_run_is_the_protocol_s_epoch_on_a_simulated_clock() {
        let (mut cfg, work) = setup();
        cfg.record_trace = true;
        let r = simulate(&cfg, &work, Scripted(|_: &Work| 1e-3)).unwrap();
        // 12 batches of 4: 3 super-batches, one step each per batch.
        assert_eq!(r.super_batches.len(), 3);
        let trains = r.trace.iter().filter(|s| s.kind == WorkKind::Train).count();
        assert_eq!(trains, 12);
        assert!(r.batches.iter().all(|b| b.end_s > b.start_s));
        // After the last step: its publication, then the read of the last
        // super-batch's losses (a lag of 8 > N = 4), resolved at once.
        assert_eq!(r.totals.epoch_s, r.batches[11].end_s + 2e-3);
        assert_eq!(r.loss_reads.len(), 3);
        assert_eq!(r.shown, (0..12).collect::<Vec<_>>());
        assert!(r.stats.hot_uses > 0);
        // Without a trace, the same run.
        cfg.record_trace = false;
        let again = simulate(&cfg, &work, Scripted(|_: &Work| 1e-3)).unwrap();
        assert_eq!((again.stats, again.batches), (r.stats, r.batches));
        assert!(again.trace.is_empty());
        // An empty workload finishes at once.
        let empty = SyntheticWorkload::small(0, 3).generate().unwrap();
        let r = simulate(&cfg, &empty, Scripted(|_: &Work| 1e-3)).unwrap();
        assert!(r.batches.is_empty() && r.super_batches.is_empty());
    }
}
