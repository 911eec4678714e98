//! The step-based executor: sample → gather → train, batch after batch, where a
//! [`StepBased`] placement puts sampling and gathering (NeutronOrch §3, Figure 4
//! (a)–(d); `executor/step/device.rs` has the per-batch steps on the device).
//!
//! # The batch stream
//! 1. Batch `k`'s blocks are the ones sampled ahead for it when there are any
//!    (same seeds, same seed: always, within one call), else sampled now — a
//!    `sample` slice on the calling thread's track for a host sampler, a `device
//!    sample` slice on the accelerator track for the device.
//! 2. Its gather and step are queued ([`device::train_sampled`]).
//! 3. **Sample ahead** (`device.sample_ahead`): a host sampler samples batch
//!    `k + 1` of the same call now, while batch `k`'s backward and Adam run. A
//!    device sampler (on CUDA on the sampling sibling's stream; an `acc sample`
//!    track) instead *queues* the next group of up to [`SAMPLE_GROUP`] batches
//!    once the previous group was read (`engine/sibling.rs`: their kernels
//!    enqueued, buffers sized by bounds, nothing read; `device sample` slices)
//!    and step 1 of the group's first batch reads all their layer sizes at once
//!    (a `sample read` slice: the one synchronization of the group, whose
//!    kernels finished long before). In steady state the sampling stream synchronizes once per
//!    [`SAMPLE_GROUP`] batches (the trace's `host.syncs.sampling`), at the price
//!    of up to 2 × [`SAMPLE_GROUP`] batches' blocks alive at once. A failed
//!    sample-ahead (queue or read) is dropped: the batch samples again at its
//!    turn and reports the error then.
//! 4. Batch `k`'s blocks are dropped only now, so that the sibling does not
//!    recycle their memory (which would make it wait for the backward).
//! 5. The session sees the batch (`executor/mod.rs`, step 3).
//!
//! # The deferred loss (`device.loss_lag` = L > 1)
//! Step 2 then reads nothing: batch `k`'s loss goes to a device slot and step
//! 5 waits, by the engine's deferred-loss protocol (`engine/losses.rs`, the one
//! the layer path uses): when L batches are pending, their slots are queued
//! for one asynchronous read and the read queued before is resolved (a `loss
//! read` slice on the accelerator track; an event wait, so its `host_syncs`
//! argument is 0), and the session sees those batches in order; at the end of
//! the call and before a cancel returns every read is flushed. A non-finite
//! loss set the model's device guard, so its batch and every step queued
//! after it left the weights alone: the version moves back by that many steps,
//! and the session sees the bad batch (`train.on_nonfinite = "stop"`: an error
//! naming it) and none after it. A callback's stop is seen when its batch is
//! shown; the call then flushes and ends after the batches already trained,
//! which the session sees too. With a tracer, every batch adds a
//! sample of the engine's synchronizations so far to the `host.syncs` counter
//! (its backend: the compute stream) and to `host.syncs.sampling` (the
//! sampling sibling's, which wait for sampling kernels only).
//!
//! A batch sampled ahead is kept across calls only for the batch it was
//! sampled for; anything else (a new epoch order, a checkpoint load that moved
//! the position) samples afresh.

use gpu_ops::Backend;
use scheduler::StepBased;

pub(crate) mod data_parallel;
pub(crate) mod device;

use super::{BatchDone, BatchRef, DistSetup, EpochEnd, EpochRun, Executor, OnBatch};
use crate::engine::{
    record_copies, DeferredLosses, DeviceEngine, ModelState, Read, Trained, SAMPLE_GROUP,
};
use crate::error::{Error, Result, StopCause};
use crate::trace::{TrackId, TrackKind, CACHE_HIT_RATE, HOST_SYNCS, SAMPLING_SYNCS};
use data_parallel::DataParallel;
use device::{HostSampler, Sampled};

/// A batch sampled ahead: its seeds, its seed, the pairs left out of its
/// blocks and what was sampled.
type AheadBatch<T> = (Vec<u32>, u64, Vec<(u32, u32)>, T);

/// Batches sampled ahead and their counters (steps 1 and 3).
struct Ahead<B: Backend> {
    /// Whether to sample ahead (`device.sample_ahead`).
    on: bool,
    /// Batches sampled ahead with their blocks ready, in batch order.
    ready: std::collections::VecDeque<AheadBatch<Sampled<B>>>,
    /// A group queued on the device whose layer sizes are not read yet (the
    /// batches right after `ready`'s).
    queued: Vec<AheadBatch<B::Queued>>,
    /// Batches that trained on blocks sampled ahead.
    used: u64,
    /// The `acc sample` track, declared on first use.
    track: Option<TrackId>,
}

/// A step-based placement over one device engine (module doc).
pub(crate) struct StepExecutor<B: Backend> {
    engine: DeviceEngine<B>,
    /// The host sampler of placements that sample on the CPU.
    host: HostSampler,
    placement: StepBased,
    ahead: Ahead<B>,
}

impl<B: Backend> StepExecutor<B> {
    /// `placement` over `engine`; `sample_ahead` turns step 3 on.
    pub fn new(engine: DeviceEngine<B>, placement: StepBased, sample_ahead: bool) -> Self {
        Self {
            engine,
            host: HostSampler::default(),
            placement,
            ahead: Ahead {
                on: sample_ahead,
                ready: Default::default(),
                queued: Vec::new(),
                used: 0,
                track: None,
            },
        }
    }

    /// The placement.
    pub fn placement(&self) -> StepBased {
        self.placement
    }

    /// Samples and gathers where `placement` says from the next batch on.
    pub fn set_placement(&mut self, placement: StepBased) {
        if placement != self.placement {
            self.ahead.ready.clear();
            self.ahead.queued.clear();
        }
        self.placement = placement;
    }

    /// The engine, for the executors that wrap this one.
    pub fn engine_mut(&mut self) -> &mut DeviceEngine<B> {
        &mut self.engine
    }

    /// Gives the engine back (another strategy takes it over).
    pub fn into_engine(self) -> DeviceEngine<B> {
        self.engine
    }

    /// Step 1: `batch`'s blocks, sampled ahead or now. A queued group is read
    /// when its first batch is due.
    pub fn sample(&mut self, batch: BatchRef<'_>) -> Result<Sampled<B>> {
        let BatchRef {
            seeds,
            seed,
            exclude,
            ..
        } = batch;
        if self.ahead.ready.is_empty() && !self.ahead.queued.is_empty() {
            self.resolve_group(batch);
        }
        if let Some((s, k, x, b)) = self.ahead.ready.pop_front() {
            if k == seed && s == seeds && x == exclude {
                self.ahead.used += 1;
                return Ok(b);
            }
            // Another order than the one sampled for: sample afresh.
            self.ahead.ready.clear();
            self.ahead.queued.clear();
        }
        let (tracer, acc) = self.engine.tracer();
        let tracer = tracer.clone();
        let _s = batch.tag(
            if self.placement.sample_device() == scheduler::Device::Cpu {
                tracer.slice("sample")
            } else {
                tracer.slice_on(acc, "device sample")
            },
        );
        self.host
            .sample_placed(&mut self.engine, self.placement, seeds, seed, exclude)
    }

    /// The `acc sample` track, declared on first use.
    fn ahead_track(&mut self) -> TrackId {
        let tracer = self.engine.tracer().0.clone();
        *self
            .ahead
            .track
            .get_or_insert_with(|| tracer.declare_track("acc sample", TrackKind::Accelerator))
    }

    /// Reads the queued group's layer sizes (one synchronization; a `sample
    /// read` slice on the `acc sample` track), leaves each batch's excluded
    /// pairs out of its blocks there, and makes its batches ready. A failed
    /// read drops the group: its batches sample again at their turn and
    /// report the error then.
    fn resolve_group(&mut self, due: BatchRef<'_>) {
        let queued = std::mem::take(&mut self.ahead.queued);
        let tracer = self.engine.tracer().0.clone();
        let track = self.ahead_track();
        let before = ModelState::transfer_stats(&self.engine);
        let mut slice = due.tag(tracer.slice_on(track, "sample read"));
        let (ids, work): (Vec<_>, Vec<_>) = queued
            .into_iter()
            .map(|(s, k, x, q)| ((s, k, x), q))
            .unzip();
        let excludes: Vec<&[(u32, u32)]> = ids.iter().map(|(_, _, x)| x.as_slice()).collect();
        if let Ok(batches) = self.engine.resolve_ahead(work, &excludes) {
            for ((s, k, x), b) in ids.into_iter().zip(batches) {
                self.ahead.ready.push_back((s, k, x, Sampled::Device(b)));
            }
        }
        let copies = ModelState::transfer_stats(&self.engine).since(&before);
        record_copies(slice.args_mut(), &copies);
    }

    /// Step 3 after batch `k`'s step: a device sampler queues the next group of
    /// up to [`SAMPLE_GROUP`] batches (those after the ones ready) once the
    /// previous group was read; a host sampler samples batch `k + 1`.
    fn sample_ahead(&mut self, run: &EpochRun<'_>, k: usize, end: usize) {
        if self.placement.sample_device() == scheduler::Device::Cpu {
            if self.ahead.ready.is_empty() && k + 1 < end {
                let tb = run.task_batch(k + 1);
                self.sample_one_ahead(BatchRef::of(&tb, run.seed(k + 1), run.epoch, k + 1));
            }
            return;
        }
        if !self.ahead.queued.is_empty() {
            return;
        }
        let first = k + 1 + self.ahead.ready.len();
        let tracer = self.engine.tracer().0.clone();
        for j in first..end.min(first + SAMPLE_GROUP) {
            let tb = run.task_batch(j);
            let batch = BatchRef::of(&tb, run.seed(j), run.epoch, j);
            let track = self.ahead_track();
            let before = ModelState::transfer_stats(&self.engine);
            let mut slice = batch.tag(tracer.slice_on(track, "device sample"));
            let queued = self.engine.queue_ahead(batch.seeds, batch.seed, 0);
            let copies = ModelState::transfer_stats(&self.engine).since(&before);
            record_copies(slice.args_mut(), &copies);
            match queued {
                Ok(q) => self.ahead.queued.push((
                    batch.seeds.to_vec(),
                    batch.seed,
                    batch.exclude.to_vec(),
                    q,
                )),
                // Dropped: this batch and the later ones sample at their turn.
                Err(_) => break,
            }
        }
    }

    /// Samples `batch` on the host now, before its turn.
    fn sample_one_ahead(&mut self, batch: BatchRef<'_>) {
        let BatchRef {
            seeds,
            seed,
            exclude,
            ..
        } = batch;
        let tracer = self.engine.tracer().0.clone();
        let before = ModelState::transfer_stats(&self.engine);
        let mut slice = batch.tag(
            if self.placement.sample_device() == scheduler::Device::Cpu {
                tracer.slice("sample")
            } else {
                let track = *self.ahead.track.get_or_insert_with(|| {
                    tracer.declare_track("acc sample", TrackKind::Accelerator)
                });
                tracer.slice_on(track, "device sample")
            },
        );
        if let Ok(b) =
            self.host
                .sample_placed(&mut self.engine, self.placement, seeds, seed, exclude)
        {
            self.ahead
                .ready
                .push_back((seeds.to_vec(), seed, exclude.to_vec(), b));
        }
        let copies = ModelState::transfer_stats(&self.engine).since(&before);
        record_copies(slice.args_mut(), &copies);
    }
}

impl<B: Backend> StepExecutor<B> {
    /// Resolves the read in flight and queues the pending batches' (the
    /// deferred loss, module doc; with `flush`, resolved at once too), in a
    /// `loss read` slice on the accelerator track.
    fn read_losses(
        &mut self,
        run: &EpochRun<'_>,
        losses: &mut DeferredLosses,
        flush: bool,
    ) -> Result<Read> {
        let (tracer, acc) = self.engine.tracer();
        let tracer = tracer.clone();
        let before = ModelState::transfer_stats(&self.engine);
        let mut slice = tracer.slice_on(acc, "loss read").epoch(run.epoch as u64);
        let read = losses.rotate(&mut self.engine, flush);
        if let Some(last) = read.as_ref().ok().and_then(|r| r.done.last()) {
            slice = slice.batch(last.k as u64);
        }
        let copies = ModelState::transfer_stats(&self.engine).since(&before);
        record_copies(slice.args_mut(), &copies);
        read
    }

    /// Shows the batches whose losses came back (module doc, the deferred
    /// loss). Returns how the call ends when a callback asked to stop: every
    /// trained batch is flushed and shown first. A non-finite loss is the
    /// session's error (or, were it to go on, an internal one: the guard
    /// skipped the steps queued after it).
    fn show_losses(
        &mut self,
        run: &EpochRun<'_>,
        losses: &mut DeferredLosses,
        flush: bool,
        on_batch: &mut OnBatch<'_>,
    ) -> Result<Option<EpochEnd>> {
        if losses.is_empty() {
            return Ok(None);
        }
        let mut stop = false;
        let mut last = None;
        let mut flush = flush;
        loop {
            let read = self.read_losses(run, losses, flush)?;
            for d in &read.done {
                stop |= on_batch(d)?;
                last = Some(d.k);
            }
            if read.nonfinite {
                return Err(Error::invalid_argument(
                    "device.loss_lag",
                    format!(
                        "internal: batch {} had a non-finite loss and the steps queued after it \
                         were not applied, but training went on (a loss lag needs \
                         train.on_nonfinite = \"stop\")",
                        last.unwrap_or(0)
                    ),
                ));
            }
            if !stop || flush {
                break;
            }
            // A stop: every trained batch is shown before the call ends.
            flush = true;
        }
        Ok(stop.then(|| {
            let next = last.map_or(0, |k| k + 1);
            if next < run.batches.len() {
                EpochEnd::Stopped(next, StopCause::Callback)
            } else {
                EpochEnd::Finished(true)
            }
        }))
    }
}

impl<B: Backend> Executor for StepExecutor<B> {
    fn train(&mut self, run: &EpochRun<'_>, on_batch: &mut OnBatch<'_>) -> Result<EpochEnd> {
        let epoch_len = run.batches.len();
        let end = run.end.min(epoch_len);
        let lag = self.engine.loss_lag();
        let mut losses = DeferredLosses::default();
        for k in run.start..end {
            if run.cancel.is_cancelled() {
                if let Some(e) = self.show_losses(run, &mut losses, true, on_batch)? {
                    return Ok(e);
                }
                return Ok(EpochEnd::Stopped(k, StopCause::Token));
            }
            let t = run.clock.now();
            let tb = run.task_batch(k);
            let batch = BatchRef::of(&tb, run.seed(k), run.epoch, k);
            let before = ModelState::transfer_stats(&self.engine);
            let sampled = self.sample(batch)?;
            let slot = (lag > 1).then_some(losses.next_slot());
            let (stats, blocks) = device::train_sampled(
                &mut self.engine,
                self.placement,
                sampled,
                batch,
                true,
                slot,
                before,
            )?;
            if self.ahead.on {
                self.sample_ahead(run, k, end);
            }
            drop(blocks);
            if run.tracer.is_enabled() {
                run.tracer.counter(
                    CACHE_HIT_RATE,
                    ModelState::cache_stats(&self.engine).hit_rate(),
                );
                let (compute, sampling) = self.engine.syncs_by_stream();
                run.tracer.counter(HOST_SYNCS, compute as f64);
                run.tracer.counter(SAMPLING_SYNCS, sampling as f64);
            }
            let version = ModelState::version(&self.engine);
            let seconds = run.clock.now().saturating_sub(t).as_secs_f64();
            let Some(stats) = stats else {
                losses.push(Trained {
                    k,
                    seconds,
                    version,
                    loss: None,
                });
                if losses.pending() >= lag {
                    if let Some(e) = self.show_losses(run, &mut losses, false, on_batch)? {
                        return Ok(e);
                    }
                }
                continue;
            };
            let done = BatchDone {
                k,
                loss_sum: stats.loss * batch.rows() as f64,
                correct: stats.correct,
                seconds,
                version,
            };
            if on_batch(&done)? {
                return Ok(if k + 1 < epoch_len {
                    EpochEnd::Stopped(k + 1, StopCause::Callback)
                } else {
                    EpochEnd::Finished(true)
                });
            }
        }
        if let Some(e) = self.show_losses(run, &mut losses, true, on_batch)? {
            return Ok(e);
        }
        Ok(EpochEnd::Finished(false))
    }

    fn state(&mut self) -> &mut dyn ModelState {
        &mut self.engine
    }

    fn state_ref(&self) -> &dyn ModelState {
        &self.engine
    }

    fn set_tracer(&mut self, tracer: &crate::trace::Tracer, acc: TrackId) {
        self.engine.set_tracer(tracer.clone(), acc);
        self.ahead.track = None;
    }

    fn describe(&self) -> String {
        let mut line = format!("orchestration: {}", self.placement.name());
        if self.ahead.on {
            line.push_str(", sampling ahead");
        }
        line
    }

    fn batches_sampled_ahead(&self) -> u64 {
        self.ahead.used
    }

    fn distribute(self: Box<Self>, setup: DistSetup) -> Result<Box<dyn super::Executor>> {
        Ok(Box::new(DataParallel::new(*self, setup)?))
    }
}
