//! `orchestration.policy = "auto"` as an executor that wraps the others: it
//! trains the first batches under each candidate placement in turn, as the
//! [`Calibrator`] asks, times them on the injectable clock, decides, and from
//! then on forwards every call to the executor it chose. Calibration batches
//! are ordinary training steps (same model, same batches, same seeds), so a
//! run with `"auto"` trains what the chosen placement would have trained.
//!
//! # The engine moves between strategies
//! The one device engine (the weights) is owned by the executor that runs now:
//! a [`StepExecutor`] with the candidate's placement, or a [`LayerExecutor`].
//! Switching hands the engine over; the layer pipeline's [`Orchestrator`]
//! (hot set, workers) is built on the first layer measurement and parked while
//! a step-based candidate runs, so it is scored once.
//!
//! # A measurement
//! - step-based: `warm` untimed batches, then up to `measure` timed ones
//!   (seconds per batch on the clock), ending after any timed batch once the
//!   candidate is far slower than the best so far ([`Calibrator::cut_short`]);
//! - layer-based, with the monitor on as the choice would run it: one
//!   super-batch to fill the pipeline, the timed super-batches, and two after
//!   them; the window the pipeline marks opens before the first timed
//!   super-batch's launch-ahead and closes after its last batch, so it holds
//!   one launch (and one top-layer sampling for the planner, a further
//!   super-batch ahead) per timed super-batch ([`EpochRun::mark`]). The probe reports
//!   the accelerator's share (waits subtracted), the CPU's busy time, and per
//!   candidate split the rows it would compute.
//!
//! Each measurement is an `auto probe` slice in the trace (its per-batch
//! result in the arguments), scoring the layer candidate's hot set a `layer
//! setup` slice, and the decision an `auto choice` instant.
//!
//! Leaving the layer pipeline for a step-based placement gives the feature
//! cache back as it was loaded ([`Orchestrator::release_cache`]).
//!
//! # Memory
//! The layer candidate's slabs and hot-row store (`engine/memory.rs` step 8)
//! must fit what the device memory (or `device.memory_budget_bytes`) leaves
//! after the topology, the feature cache and the working set: its hot set is
//! cut to the largest the placement found room for at setup
//! (`budget::MemoryDecision::layer_rows`), so every CPU split it can measure or
//! choose — and every share the monitor moves to later, which never exceeds
//! the hot set — fits; with no room for one row the candidate is skipped.
//! Either is said in the reason line and on the trace (`layer_rows_limit` on
//! the `layer setup` slice and the `auto choice` instant). Never an error.
//!
//! A measurement that does not fit in what is left of the epoch moves to the
//! next one (the batches in between train on the best placement measured so
//! far); one longer than a whole epoch is skipped.
//!
//! # Drift
//! After the decision every epoch trained wholly on the choice is timed per
//! batch ([`DriftWatch`]); one more than [`super::drift::DRIFT`] slower than
//! the choice's baseline starts a new calibration from the next epoch (an
//! `auto drift` instant on the trace; the new reason line says why), at most
//! [`super::drift::MAX_REDECISIONS`] times a run.

use std::sync::Arc;

use gpu_ops::Backend;
use scheduler::{Choice, LayerProbe, Orchestration};

use super::calibrator::{Calibrator, ProbeStep};
use super::drift::{DriftWatch, Verdict};
use super::step_placement;
use crate::clock::SharedClock;
use crate::engine::{DeviceEngine, ModelState};
use crate::error::{Error, Result};
use crate::executor::layer::{
    LayerExecutor, LayerOptions, LayerSetup, OrchestrationStats, Orchestrator, ParkedLayer,
};
use crate::executor::step::StepExecutor;
use crate::executor::DistSetup;
use crate::executor::{BatchDone, EpochEnd, EpochRun, Executor, OnBatch};
use crate::trace::{Tracer, TrackId};

/// `hot_ratio` of the layer-based candidate when the configured one is 0.
pub const AUTO_HOT_RATIO: f64 = 0.2;

/// The executor running now.
enum Current<B: Backend> {
    Step(Box<StepExecutor<B>>),
    Layer(Box<LayerExecutor<B>>),
    /// Only while the engine moves from one to the other.
    Moving,
}

/// What the layer-based candidate is built from.
pub(crate) struct LayerPlan {
    /// The pipeline's options with the candidate's `hot_ratio`.
    pub opts: LayerOptions,
    /// The dataset.
    pub ds: Arc<crate::data::dataset::Dataset>,
    /// The trained model's configuration.
    pub model: cpu_ops::ModelConfig,
    /// Training fanouts.
    pub fanouts: Vec<u32>,
    /// The training vertices.
    pub train_ids: Vec<u32>,
    /// `train.batch_size`.
    pub batch_size: usize,
    /// `train.seed`.
    pub seed: u64,
    /// First core of the CPU workers when pinning.
    pub pin_from: Option<usize>,
    /// Where the hot set's pre-sampling pass reports its progress.
    pub progress: Arc<dyn crate::progress::Progress>,
}

/// `policy = "auto"` (module doc).
pub(crate) struct AutoExecutor<B: Backend> {
    current: Current<B>,
    /// The layer pipeline while a step-based candidate runs.
    parked: Option<ParkedLayer<B>>,
    /// Measuring (`None` once decided).
    calibrator: Option<Calibrator>,
    choice: Option<Choice>,
    plan: LayerPlan,
    sample_ahead: bool,
    clock: SharedClock,
    trace: Option<(Tracer, TrackId)>,
    /// Times the choice's epochs (module doc, "Drift").
    drift: DriftWatch,
    /// Why the calibration running now was started again, for its reason line.
    redecide: Option<String>,
    /// The most hot rows the layer candidate may have (module doc, "Memory").
    layer_rows: u64,
    /// What memory did to the layer candidate, for every reason line.
    layer_note: Option<String>,
}

fn internal(what: &str) -> Error {
    Error::invalid_argument(
        "orchestration.policy = \"auto\"",
        format!("internal: {what}"),
    )
}

impl<B: Backend> AutoExecutor<B> {
    /// Measures on `engine` from its first batch, starting from
    /// `gpu-sample-gpu-gather`; measures the layer-based candidate too when the
    /// model has two layers or more.
    pub fn new(
        engine: DeviceEngine<B>,
        layer_rows: u64,
        plan: LayerPlan,
        sample_ahead: bool,
        clock: SharedClock,
    ) -> Self {
        let n = plan.ds.num_vertices() as f64;
        let wanted = (plan.opts.hot_ratio * n).ceil().min(n) as u64;
        let layer_note = if plan.fanouts.len() < 2 {
            None
        } else if layer_rows == 0 {
            Some(
                "no layer-based candidate: its hot-row slabs and store do not fit the device \
                 memory (device.memory_budget_bytes or what is free) left after the topology, \
                 the feature cache and the working set"
                    .to_string(),
            )
        } else if layer_rows < wanted {
            Some(format!(
                "the layer-based candidate's hot set cut to {layer_rows} of {wanted} rows: \
                 the most whose slabs and store fit the device memory left after the topology, \
                 the feature cache and the working set"
            ))
        } else {
            None
        };
        let mut this = Self {
            current: Current::Step(Box::new(StepExecutor::new(
                engine,
                step_placement(Orchestration::GpuSampleGpuGather),
                sample_ahead,
            ))),
            parked: None,
            calibrator: None,
            choice: None,
            plan,
            sample_ahead,
            clock,
            trace: None,
            drift: DriftWatch::new(),
            redecide: None,
            layer_rows,
            layer_note,
        };
        this.calibrator = Some(this.new_calibrator());
        this
    }

    /// A calibration from the start: the layer candidate only with two layers
    /// or more and room for its hot rows (module doc, "Memory").
    fn new_calibrator(&self) -> Calibrator {
        let layer = self.plan.fanouts.len() >= 2 && self.layer_rows > 0;
        let mut c = Calibrator::new(layer, self.plan.opts.super_batch);
        if let Some(note) = &self.layer_note {
            c.note(note.clone());
        }
        c
    }

    /// An epoch of `batches` batches trained wholly on the choice in `secs`:
    /// measures again from the next epoch when it drifted (module doc).
    fn watch(&mut self, epoch: usize, batches: usize, secs: f64) {
        let verdict = self.drift.observe(batches, secs);
        let (per_batch_s, baseline_s, again) = match verdict {
            Verdict::Untimed | Verdict::Baseline(_) | Verdict::Steady { .. } => return,
            Verdict::Drifted {
                per_batch_s,
                baseline_s,
            } => (per_batch_s, baseline_s, true),
            Verdict::Exhausted {
                per_batch_s,
                baseline_s,
            } => (per_batch_s, baseline_s, false),
        };
        if let Some((tracer, _)) = &self.trace {
            tracer.instant("auto drift", |a| {
                a.extra.push(("per_batch_ms".into(), per_batch_s * 1e3));
                a.extra.push(("baseline_ms".into(), baseline_s * 1e3));
                a.extra
                    .push(("measure_again".into(), f64::from(u8::from(again))));
            });
        }
        if again {
            self.redecide = Some(format!(
                "measured again after epoch {epoch}: {:.3} ms per batch against {:.3} ms \
                 before (re-decision {} of at most {})",
                per_batch_s * 1e3,
                baseline_s * 1e3,
                self.drift.redecisions(),
                super::drift::MAX_REDECISIONS,
            ));
            self.calibrator = Some(self.new_calibrator());
        }
    }

    fn exec(&mut self) -> Result<&mut dyn Executor> {
        match &mut self.current {
            Current::Step(s) => Ok(&mut **s),
            Current::Layer(l) => Ok(&mut **l),
            Current::Moving => Err(internal("no executor")),
        }
    }

    fn exec_ref(&self) -> Option<&dyn Executor> {
        match &self.current {
            Current::Step(s) => Some(&**s),
            Current::Layer(l) => Some(&**l),
            Current::Moving => None,
        }
    }

    /// Runs the step-based placement of `policy` from now on.
    fn use_step(&mut self, policy: Orchestration) -> Result<()> {
        let placement = step_placement(policy);
        match std::mem::replace(&mut self.current, Current::Moving) {
            Current::Step(mut s) => {
                s.set_placement(placement);
                self.current = Current::Step(s);
            }
            Current::Layer(l) => {
                let (engine, parked) = l.park()?;
                self.parked = Some(parked);
                let mut s = StepExecutor::new(engine, placement, self.sample_ahead);
                if let Some((t, acc)) = &self.trace {
                    s.set_tracer(t, *acc);
                }
                self.current = Current::Step(Box::new(s));
            }
            Current::Moving => return Err(internal("no executor")),
        }
        Ok(())
    }

    /// Runs the layer pipeline from now on (built on first use).
    fn use_layer(&mut self) -> Result<&mut Orchestrator> {
        if let Current::Step(_) = self.current {
            let parked = match self.parked.take() {
                Some(p) => p,
                None => {
                    let p = &self.plan;
                    // Scoring the hot set (a presampling epoch by default) is
                    // part of what measuring the layer placement costs.
                    let limit = self.layer_rows;
                    let _slice = self.trace.as_ref().map(|(t, _)| {
                        t.slice("layer setup")
                            .args(|a| a.extra.push(("layer_rows_limit".into(), limit as f64)))
                    });
                    // The hot set the memory has room for (module doc,
                    // "Memory"): `floor(ratio · n)` hot ids, at most `limit`.
                    let n = p.ds.num_vertices().max(1) as f64;
                    let mut opts = p.opts.clone();
                    opts.hot_ratio = opts.hot_ratio.min(limit as f64 / n);
                    let off = Tracer::disabled();
                    let mut o = Orchestrator::new(&LayerSetup {
                        opts: &opts,
                        ds: &p.ds,
                        model: &p.model,
                        fanouts: &p.fanouts,
                        train_ids: &p.train_ids,
                        batch_size: p.batch_size,
                        seed: p.seed,
                        progress: &*p.progress,
                        tracer: self.trace.as_ref().map_or(&off, |(t, _)| t),
                    })?;
                    if u64::from(o.hot_count()) > limit {
                        return Err(internal(&format!(
                            "a hot set of {} rows past the {limit} memory has room for",
                            o.hot_count()
                        )));
                    }
                    o.set_clock(Arc::clone(&self.clock));
                    o.pin_workers_from(p.pin_from);
                    ParkedLayer::new(o)
                }
            };
            let Current::Step(s) = std::mem::replace(&mut self.current, Current::Moving) else {
                return Err(internal("no step executor"));
            };
            let mut l = LayerExecutor::resume(s.into_engine(), parked);
            if let Some((t, acc)) = &self.trace {
                l.set_tracer(t, *acc);
            }
            self.current = Current::Layer(Box::new(l));
        }
        match &mut self.current {
            Current::Layer(l) => Ok(l.orchestrator_mut()),
            _ => Err(internal("no layer executor")),
        }
    }

    /// A layer-based measurement at `split` over `run`, timed over its window
    /// `run.mark` (module doc), with the monitor on as the choice would run.
    fn probe_layer(
        &mut self,
        split: u32,
        run: &EpochRun<'_>,
        on_batch: &mut OnBatch<'_>,
    ) -> Result<EpochEnd> {
        let (first, last) = run.mark.ok_or_else(|| internal("no measurement window"))?;
        let measure = last.saturating_sub(first);
        let orch = self.use_layer()?;
        let hot = orch.hot_count();
        let split = split.min(hot);
        let splits = match self.calibrator.as_mut() {
            Some(c) => {
                c.set_hot(hot);
                if hot == 0 {
                    return Ok(EpochEnd::Finished(false));
                }
                c.candidate_splits()
            }
            None => return Err(internal("no calibrator")),
        };
        let orch = self.use_layer()?;
        orch.set_cpu_split(split)?;
        orch.count_splits(splits);
        orch.enable_monitor();
        let workers = orch.workers() as u32;
        let tracer = self.trace.as_ref().map(|(t, _)| t.clone());
        let mut slice = tracer.as_ref().map(|t| {
            t.slice("auto probe")
                .epoch(run.epoch as u64)
                .args(|a| a.extra.push(("layer cpu_split".into(), split as f64)))
        });
        let end = self.exec()?.train(run, on_batch)?;
        let orch = self.use_layer()?;
        let counts = orch.take_split_counts();
        let Some(((t0, s0), (t1, s1))) = orch.last_window() else {
            // Stopped before the window closed: nothing measured.
            return Ok(end);
        };
        let window = |f: fn(&OrchestrationStats) -> u64| f(s1).saturating_sub(f(s0));
        let wait = (s1.wait_secs - s0.wait_secs).max(0.0);
        let late = window(|s| s.protocol.computed_cold + s.protocol.waited);
        let used = window(|s| s.protocol.hot_uses);
        let per_batch = (t1 - t0).max(0.0) / measure.max(1) as f64;
        if let Some(a) = slice.as_mut().and_then(|s| s.args_mut()) {
            a.extra.push(("per_batch_ms".into(), per_batch * 1e3));
        }
        let probe = LayerProbe {
            cpu_split: split,
            per_batch_s: per_batch,
            acc_per_batch_s: (per_batch - wait / measure.max(1) as f64).max(0.0),
            cpu_busy_s: (s1.cpu_busy_secs - s0.cpu_busy_secs).max(0.0),
            rows_computed: window(|s| s.protocol.rows_computed),
            entries_read: used + late,
            entries_late: late,
            workers,
        };
        if let Some(c) = self.calibrator.as_mut() {
            c.record_layer(probe, &counts)?;
        }
        Ok(end)
    }

    /// Applies the calibrator's choice: a step-based placement (the pipeline
    /// and its workers go), or the layer pipeline at the chosen CPU split with
    /// the monitor on (it keeps correcting the split from what the accelerator
    /// actually loses to the CPU). An instant `auto choice` on the trace.
    fn decide(&mut self) -> Result<()> {
        let Some(calibrator) = self.calibrator.take() else {
            return Ok(());
        };
        let mut choice = calibrator.finish()?;
        if let Some(why) = self.redecide.take() {
            choice.reason = format!("{}; {why}", choice.reason);
        }
        if choice.policy == Orchestration::Layer {
            let o = self.use_layer()?;
            o.set_cpu_split(choice.cpu_split)?;
            o.enable_monitor();
        } else {
            self.use_step(choice.policy)?;
            self.parked = None;
        }
        if let Some((tracer, _)) = &self.trace {
            let (name, split, ms) = (
                choice.policy.name(),
                choice.cpu_split,
                choice.per_batch_s * 1e3,
            );
            let limit = self.layer_rows;
            tracer.instant("auto choice", |a| {
                a.extra.push((format!("policy {name}").into(), ms));
                a.extra.push(("cpu_split".into(), split as f64));
                a.extra.push(("layer_rows_limit".into(), limit as f64));
            });
        }
        self.choice = Some(choice);
        Ok(())
    }

    /// Every measurement the calibrator asks for that fits in `run`, then the
    /// decision; returns the first batch left and how the run ended, when a
    /// stop or the epoch's end came first.
    fn calibrate(
        &mut self,
        run: &EpochRun<'_>,
        on_batch: &mut OnBatch<'_>,
    ) -> Result<std::result::Result<usize, EpochEnd>> {
        let epoch_len = run.batches.len();
        if let Some(c) = self.calibrator.as_mut() {
            c.fit_to_epoch(epoch_len);
        }
        let mut start = run.start;
        while let Some(step) = self.calibrator.as_ref().and_then(Calibrator::next) {
            let need = step.batches();
            if start + need > epoch_len {
                if need > epoch_len {
                    if let Some(c) = self.calibrator.as_mut() {
                        c.skip(&format!(
                            "an epoch has {epoch_len} batches, the measurement needs {need}"
                        ));
                    }
                    continue;
                }
                // Not enough left in this epoch: finish it on the best
                // placement measured so far (the all-accelerator one before any).
                let best = self
                    .calibrator
                    .as_ref()
                    .and_then(Calibrator::best_so_far)
                    .map(|m| m.policy)
                    .filter(|&p| p != Orchestration::Layer)
                    .unwrap_or(Orchestration::GpuSampleGpuGather);
                self.use_step(best)?;
                let end = self
                    .exec()?
                    .train(&run.range(start, run.end, None), on_batch)?;
                return Ok(Err(end));
            }
            let end = match step {
                ProbeStep::Fixed {
                    policy,
                    warm,
                    measure,
                } => {
                    self.use_step(policy)?;
                    let tracer = self.trace.as_ref().map(|(t, _)| t.clone());
                    let mut slice = tracer.as_ref().map(|t| {
                        t.slice("auto probe").epoch(run.epoch as u64).args(|a| {
                            a.extra
                                .push((format!("policy {}", policy.name()).into(), 1.0))
                        })
                    });
                    let warmed = self
                        .exec()?
                        .train(&run.range(start, start + warm, None), on_batch)?;
                    if warmed != EpochEnd::Finished(false) {
                        return Ok(Err(warmed));
                    }
                    let best = self
                        .calibrator
                        .as_ref()
                        .and_then(Calibrator::best_so_far)
                        .map(|m| m.per_batch_s);
                    let clock = Arc::clone(&self.clock);
                    let t0 = clock.now();
                    let timed = run.range(start + warm, start + warm + measure, None);
                    // Timed batches trained, and whether the measurement ended
                    // early ([`Calibrator::cut_short`]) rather than the caller
                    // stopping. Once cut short it stays so: with deferred losses
                    // (`device.loss_lag`) the executor shows every batch it
                    // trained after the one that asked to stop, and a later
                    // batch must not turn the measurement's stop into the
                    // caller's.
                    let (mut done, mut aborted, mut stopped) = (0usize, false, false);
                    let mut timing = |b: &BatchDone| -> Result<bool> {
                        if on_batch(b)? {
                            stopped = true;
                            return Ok(true);
                        }
                        done += 1;
                        if !aborted {
                            let secs = clock.now().saturating_sub(t0).as_secs_f64();
                            aborted = Calibrator::cut_short(best, done, measure, secs);
                        }
                        Ok(aborted)
                    };
                    let end = self.exec()?.train(&timed, &mut timing)?;
                    let secs = clock.now().saturating_sub(t0).as_secs_f64();
                    let per_batch = secs / done.max(1) as f64;
                    if let Some(a) = slice.as_mut().and_then(|s| s.args_mut()) {
                        a.extra.push(("per_batch_ms".into(), per_batch * 1e3));
                        a.extra.push(("timed_batches".into(), done as f64));
                    }
                    if done > 0 {
                        if let Some(c) = self.calibrator.as_mut() {
                            c.record_fixed(per_batch)?;
                        }
                    }
                    if aborted && !stopped {
                        // Calibration goes on from the next batch.
                        start -= measure - done;
                        EpochEnd::Finished(false)
                    } else {
                        end
                    }
                }
                ProbeStep::Layer {
                    split,
                    warm,
                    measure,
                    tail,
                } => {
                    let window = (start + warm, start + warm + measure);
                    let r = run.range(start, start + warm + measure + tail, Some(window));
                    self.probe_layer(split, &r, on_batch)?
                }
            };
            if end != EpochEnd::Finished(false) {
                return Ok(Err(end));
            }
            start += need;
        }
        self.decide()?;
        Ok(Ok(start))
    }
}

impl<B: Backend> Executor for AutoExecutor<B> {
    fn train(&mut self, run: &EpochRun<'_>, on_batch: &mut OnBatch<'_>) -> Result<EpochEnd> {
        let decided = self.calibrator.is_none();
        let start = if decided {
            run.start
        } else {
            match self.calibrate(run, on_batch)? {
                Ok(start) => start,
                Err(end) => return Ok(end),
            }
        };
        let t0 = self.clock.now();
        let end = self
            .exec()?
            .train(&run.range(start, run.end, None), on_batch)?;
        if decided && end == EpochEnd::Finished(false) {
            let secs = self.clock.now().saturating_sub(t0).as_secs_f64();
            self.watch(run.epoch, run.end.saturating_sub(start), secs);
        }
        Ok(end)
    }

    fn state(&mut self) -> &mut dyn ModelState {
        match &mut self.current {
            Current::Step(s) => s.state(),
            Current::Layer(l) => l.state(),
            Current::Moving => unreachable!("the engine is never left moving"),
        }
    }

    fn state_ref(&self) -> &dyn ModelState {
        match &self.current {
            Current::Step(s) => s.state_ref(),
            Current::Layer(l) => l.state_ref(),
            Current::Moving => unreachable!("the engine is never left moving"),
        }
    }

    fn set_tracer(&mut self, tracer: &Tracer, acc: TrackId) {
        self.trace = Some((tracer.clone(), acc));
        if let Ok(e) = self.exec() {
            e.set_tracer(tracer, acc);
        }
        if let Some(p) = self.parked.as_mut() {
            p.orchestrator_mut().set_tracer(tracer);
        }
    }

    fn describe(&self) -> String {
        match (&self.choice, self.exec_ref()) {
            (Some(_), Some(e)) if self.calibrator.is_some() => {
                format!(
                    "orchestration: auto (measuring again; now {})",
                    e.describe()
                )
            }
            (Some(c), _) => format!("orchestration: auto chose {}", c.reason),
            (None, Some(e)) => format!("orchestration: auto (measuring; now {})", e.describe()),
            (None, None) => "orchestration: auto".into(),
        }
    }

    fn orchestration(&self) -> Option<(Option<&OrchestrationStats>, &OrchestrationStats)> {
        self.exec_ref()?.orchestration()
    }

    fn relabeling(&self) -> Option<&scheduler::Relabeling> {
        self.exec_ref()?.relabeling()
    }

    fn batches_sampled_ahead(&self) -> u64 {
        self.exec_ref().map_or(0, Executor::batches_sampled_ahead)
    }

    fn auto_choice(&self) -> Option<&Choice> {
        self.choice.as_ref()
    }

    fn calibrating(&self) -> bool {
        self.calibrator.is_some()
    }

    /// Ranks measuring placements each on their own could choose differently:
    /// every rank keeps the starting placement, `gpu-sample-gpu-gather`.
    fn distribute(mut self: Box<Self>, setup: DistSetup) -> Result<Box<dyn Executor>> {
        let policy = match &self.choice {
            Some(c) if c.policy != Orchestration::Layer => c.policy,
            _ => Orchestration::GpuSampleGpuGather,
        };
        self.use_step(policy)?;
        match std::mem::replace(&mut self.current, Current::Moving) {
            Current::Step(s) => s.distribute(setup),
            _ => Err(internal("no step executor")),
        }
    }

    #[cfg(test)]
    fn inject_fault(&mut self, fault: Option<crate::executor::layer::InjectedFault>) {
        if let Ok(e) = self.exec() {
            e.inject_fault(fault);
        }
    }
}
