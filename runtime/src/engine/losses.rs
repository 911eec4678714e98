//! Deferred losses (`device.loss_lag` = L > 1), one component for both
//! executors: a step writes its loss into a device slot instead of reading
//! it, and the slots of several batches come back in one asynchronous read.
//!
//! Read at once, every batch's loss synchronizes the compute stream before
//! its Adam step: the device's queue drains and the host's work for the next
//! batch cannot overlap it.
//!
//! # Operations ([`DeferredLosses`])
//! 1. **Keep** a trained batch ([`DeferredLosses::push`], [`Trained`]), with its
//!    loss when its step read it (no lag). A deferred step wrote its loss sum
//!    and correct count into a device slot and applied its Adam step behind
//!    the model's device guard; the version moved on at once.
//! 2. **Queue a read** of a range of kept batches' slots
//!    ([`DeferredLosses::queue`]: [`LossReads::queue_loss_read`], one copy into
//!    page-locked memory on the compute stream and an event after it; nothing
//!    waits, `engine/pinned.rs`). The slots are written again at once: the
//!    next steps are queued after the copy.
//! 3. **Resolve** it ([`DeferredLosses::resolve`]: an event wait for that copy
//!    only, the device keeps the work queued after it); each batch gets its
//!    loss, and the first non-finite one is named.
//! 4. **Show** a range of batches whose losses are known, in order
//!    ([`DeferredLosses::show`]). After a non-finite loss the device's guard
//!    skipped that step and every one queued after it: the version first moves
//!    back by that many ([`LossReads::rewind_skipped`]); nothing after the bad
//!    batch is shown (`train.on_nonfinite = "stop"`, the only mode a lag is
//!    used with, ends the run there).
//!
//! # Who decides when
//! - The layer path: `scheduler::protocol` (its step 7) decides when a read is
//!   queued, resolved and shown — once per super-batch, and before every
//!   measurement mark, stop and end — and its simulator tests those timings;
//!   `executor/layer/pipeline.rs` carries the actions out with 2–4.
//! - The step path: [`DeferredLosses::rotate`] (`executor/step/mod.rs`): when
//!   L batches are pending, the read in flight is resolved and shown, then
//!   the pending ones are queued (the host runs at most one read ahead of the
//!   device); a flush (the end of a call, a cancel, a callback's stop) queues,
//!   resolves and shows every batch trained.

use std::collections::VecDeque;
use std::ops::Range;

use gpu_ops::Backend;

use super::pinned::PendingCopy;
use super::{dev_err, DeviceEngine};
use crate::error::{Error, Result};

/// What one trained batch did, for the session's bookkeeping and callbacks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchDone {
    /// Batch index in the epoch.
    pub k: usize,
    /// Loss × rows (NaN when the loss or a gradient was not finite: no update
    /// was applied).
    pub loss_sum: f64,
    /// Correct predictions.
    pub correct: usize,
    /// Seconds the batch took.
    pub seconds: f64,
    /// The weight version after it.
    pub version: u64,
}

/// A batch trained (step 1), until it is shown.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Trained {
    /// Batch index in the epoch.
    pub k: usize,
    /// Its clock seconds, start to step queued.
    pub seconds: f64,
    /// The version its step made.
    pub version: u64,
    /// (loss × rows, correct), once read (at once when the step read it).
    pub loss: Option<(f64, usize)>,
}

/// What [`DeferredLosses::rotate`] read: the batches to show, in order, and
/// whether the last of them had a non-finite loss (nothing after it is
/// shown).
#[derive(Debug, Default)]
pub(crate) struct Read {
    /// The batches, in training order.
    pub done: Vec<BatchDone>,
    /// The last of `done` had a non-finite loss.
    pub nonfinite: bool,
}

/// Deferred losses on their way to the host
/// ([`LossReads::queue_loss_read`]): a `Send` handle resolved once.
pub(crate) trait PendingLosses: Send {
    /// Waits for the copy and returns each slot's (loss sum, correct count),
    /// in slot order.
    fn resolve(self: Box<Self>) -> Result<Vec<(f64, usize)>>;
}

/// What [`DeferredLosses`] asks of the engine (steps 2 and 4); object-safe,
/// so the layer pipeline's device trait extends it.
pub(crate) trait LossReads {
    /// Loss slots `0..n` on their way to the host, queued after every step so
    /// far without waiting for them (step 2).
    fn queue_loss_read(&mut self, n: usize) -> Result<Box<dyn PendingLosses>>;
    /// After a non-finite deferred loss: the version moves back by the
    /// `skipped` steps the device did not apply, and the guard is cleared
    /// (step 4).
    fn rewind_skipped(&mut self, skipped: usize) -> Result<()>;
}

/// The batches trained and not shown yet, in order, and the read in flight
/// (module doc).
#[derive(Default)]
pub(crate) struct DeferredLosses {
    trained: VecDeque<Trained>,
    reading: Option<(Range<usize>, Box<dyn PendingLosses>)>,
}

fn internal(what: String) -> Error {
    Error::invalid_argument("device.loss_lag", format!("internal: {what}"))
}

impl DeferredLosses {
    /// Step 1.
    pub fn push(&mut self, batch: Trained) {
        self.trained.push_back(batch);
    }

    /// Whether every kept batch was shown.
    pub fn is_empty(&self) -> bool {
        self.trained.is_empty() && self.reading.is_none()
    }

    /// The kept batches `batches`, which must all be kept.
    fn kept(&mut self, batches: &Range<usize>) -> Result<&mut [Trained]> {
        let first = self.trained.front().map_or(usize::MAX, |t| t.k);
        let (start, end) = (
            batches.start.wrapping_sub(first),
            batches.end.wrapping_sub(first),
        );
        let held = self.trained.make_contiguous();
        let len = held.len();
        match held.get_mut(start..end) {
            Some(b) if b.first().is_some_and(|t| t.k == batches.start) => Ok(b),
            _ => Err(internal(format!(
                "batches {batches:?} are not among those trained and not shown \
                 (from batch {first}, {len} of them)"
            ))),
        }
    }

    /// Step 2.
    pub fn queue(&mut self, engine: &mut dyn LossReads, batches: Range<usize>) -> Result<()> {
        if let Some((r, _)) = &self.reading {
            return Err(internal(format!(
                "a read of batches {batches:?} queued with the read of {r:?} in flight"
            )));
        }
        self.kept(&batches)?;
        let handle = engine.queue_loss_read(batches.len())?;
        self.reading = Some((batches, handle));
        Ok(())
    }

    /// Step 3: the first batch read whose loss is not finite.
    pub fn resolve(&mut self, batches: Range<usize>) -> Result<Option<usize>> {
        let handle = match self.reading.take() {
            Some((r, handle)) if r == batches => handle,
            other => {
                return Err(internal(format!(
                    "the resolution of a read of batches {batches:?}, the read in flight is \
                     {:?}",
                    other.map(|(r, _)| r)
                )))
            }
        };
        let losses = handle.resolve()?;
        let kept = self.kept(&batches)?;
        if losses.len() != kept.len() {
            return Err(internal(format!(
                "{} losses read for {} batches",
                losses.len(),
                kept.len()
            )));
        }
        let mut nonfinite = None;
        for (t, &loss) in kept.iter_mut().zip(&losses) {
            t.loss = Some(loss);
            if nonfinite.is_none() && !loss.0.is_finite() {
                nonfinite = Some(t.k);
            }
        }
        Ok(nonfinite)
    }

    /// Step 4: the batches to show, in order, the version moved back by
    /// `rewind` steps first.
    pub fn show(
        &mut self,
        engine: &mut dyn LossReads,
        batches: Range<usize>,
        rewind: u64,
    ) -> Result<Vec<BatchDone>> {
        if rewind > 0 {
            let steps = usize::try_from(rewind).map_err(|_| internal("a rewind".into()))?;
            engine.rewind_skipped(steps)?;
        }
        let mut done = Vec::with_capacity(batches.len());
        for k in batches {
            match self.trained.pop_front() {
                Some(Trained {
                    k: kept,
                    seconds,
                    version,
                    loss: Some((loss_sum, correct)),
                }) if kept == k => done.push(BatchDone {
                    k,
                    loss_sum,
                    correct,
                    seconds,
                    version,
                }),
                other => {
                    return Err(internal(format!(
                        "batch {k} shown, the next kept is {other:?}"
                    )))
                }
            }
        }
        Ok(done)
    }

    /// Kept batches not yet queued for a read (the step path's schedule).
    pub fn pending(&self) -> usize {
        let read = self.reading.as_ref().map_or(0, |(r, _)| r.len());
        self.trained.len() - read
    }

    /// The slot the next deferred step writes (the step path's schedule:
    /// slot `i` for the `i`-th batch since the last read was queued).
    pub fn next_slot(&self) -> usize {
        self.pending()
    }

    /// The step path's schedule (module doc): resolves and shows the read in
    /// flight, then queues the pending batches; with `flush`, resolves and
    /// shows those too. A non-finite loss ends what is shown there (every
    /// step trained from it is rewound).
    pub fn rotate(&mut self, engine: &mut dyn LossReads, flush: bool) -> Result<Read> {
        let mut read = Read::default();
        if self.resolve_and_show(engine, &mut read)? {
            return Ok(read);
        }
        let first = self.trained.front().map(|t| t.k);
        if let (Some(first), n) = (first, self.trained.len()) {
            if n > 0 {
                self.queue(engine, first..first + n)?;
            }
        }
        if flush {
            self.resolve_and_show(engine, &mut read)?;
        }
        Ok(read)
    }

    /// Steps 3 and 4 for the read in flight, appended to `read`; returns
    /// whether a loss was non-finite (the version then moved back by every
    /// step trained from that batch on, and nothing after it is kept).
    fn resolve_and_show(&mut self, engine: &mut dyn LossReads, read: &mut Read) -> Result<bool> {
        let Some(range) = self.reading.as_ref().map(|(r, _)| r.clone()) else {
            return Ok(false);
        };
        match self.resolve(range.clone())? {
            None => {
                read.done.extend(self.show(engine, range, 0)?);
                Ok(false)
            }
            Some(bad) => {
                let last = self.trained.back().map_or(bad, |t| t.k);
                let rewind = (last + 1 - bad) as u64;
                read.done
                    .extend(self.show(engine, range.start..bad + 1, rewind)?);
                self.trained.clear();
                read.nonfinite = true;
                Ok(true)
            }
        }
    }
}

/// The engine's loss slots (step 1) and the pinned sets their reads go
/// through (step 2).
pub(crate) struct LossSlots<B: Backend> {
    /// Batches between a step and the read of its loss (`device.loss_lag`
    /// resolved; 1: every loss read at once).
    lag: usize,
    /// `2 · lag` words (loss sum bits, correct count), made on first use.
    slots: Option<B::Buf<u64>>,
    /// Page-locked sets the reads go into.
    reads: super::pinned::PinnedPool<B, u64>,
}

impl<B: Backend> LossSlots<B> {
    /// Slots for a lag of `lag` batches (0 counts as 1).
    pub(crate) fn new(lag: usize) -> Self {
        Self {
            lag: lag.max(1),
            slots: None,
            reads: Default::default(),
        }
    }

    /// Batches between a step and the read of its loss (at least 1).
    pub(crate) fn lag(&self) -> usize {
        self.lag
    }

    /// Slot `slot` to write a step's loss into, the slots made on first use.
    pub(crate) fn slot<'a>(&'a mut self, dev: &B, slot: usize) -> Result<gpu_ops::LossSlot<'a, B>> {
        if slot >= self.lag {
            return Err(Error::invalid_argument(
                "device.loss_lag",
                format!("internal: loss slot {slot} past the lag of {}", self.lag),
            ));
        }
        if self.slots.is_none() {
            self.slots = Some(dev.alloc(2 * self.lag).map_err(dev_err("loss slots"))?);
        }
        let out = self
            .slots
            .as_mut()
            .ok_or_else(|| Error::invalid_argument("device.loss_lag", "internal: no loss slots"))?;
        Ok(gpu_ops::LossSlot { out, slot })
    }
}

/// Deferred slot words as (loss sum, correct count) pairs.
fn loss_words(words: &[u64]) -> Vec<(f64, usize)> {
    words
        .chunks_exact(2)
        .map(|w| (f64::from_bits(w[0]), w[1] as usize))
        .collect()
}

impl<B: Backend> PendingLosses for PendingCopy<B, u64> {
    fn resolve(self: Box<Self>) -> Result<Vec<(f64, usize)>> {
        let words = self.resolve_copies()?;
        Ok(loss_words(words.first().map_or(&[][..], |w| w)))
    }
}

impl<B: Backend> DeviceEngine<B> {
    /// Batches between a step and the read of its loss (`device.loss_lag`
    /// resolved, at least 1).
    pub(crate) fn loss_lag(&self) -> usize {
        self.losses.lag()
    }
}

impl<B: Backend> LossReads for DeviceEngine<B> {
    /// The slots `0..n` on their way to the host, without waiting: one
    /// download into page-locked memory queued on the compute stream after
    /// every step so far (`engine/pinned.rs`). The slots may be written again
    /// at once: the next steps are queued after the copy. Resolving the
    /// handle waits for the copy only (an event wait, not a synchronization
    /// of the stream), so the device keeps the work queued after it.
    fn queue_loss_read(&mut self, n: usize) -> Result<Box<dyn PendingLosses>> {
        let slots = self.losses.slots.as_ref().ok_or_else(|| {
            Error::invalid_argument("device.loss_lag", "internal: no loss slot was written")
        })?;
        let what = "reading the batches' losses";
        let copy = self
            .losses
            .reads
            .download(&self.dev, &[slots], vec![2 * n], what)?;
        Ok(Box::new(copy))
    }

    fn rewind_skipped(&mut self, skipped: usize) -> Result<()> {
        self.model
            .rewind_skipped(&self.dev, skipped as u64)
            .map_err(dev_err("clearing the loss guard"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads scripted losses; counts queued reads and rewinds.
    #[derive(Default)]
    struct Script {
        losses: Vec<(f64, usize)>,
        next: usize,
        queued: Vec<usize>,
        rewound: Vec<usize>,
    }

    struct Ready(Vec<(f64, usize)>);

    impl PendingLosses for Ready {
        fn resolve(self: Box<Self>) -> Result<Vec<(f64, usize)>> {
            Ok(self.0)
        }
    }

    impl LossReads for Script {
        fn queue_loss_read(&mut self, n: usize) -> Result<Box<dyn PendingLosses>> {
            self.queued.push(n);
            let out = self.losses[self.next..self.next + n].to_vec();
            self.next += n;
            Ok(Box::new(Ready(out)))
        }
        fn rewind_skipped(&mut self, skipped: usize) -> Result<()> {
            self.rewound.push(skipped);
            Ok(())
        }
    }

    fn trained(k: usize) -> Trained {
        Trained {
            k,
            seconds: 0.0,
            version: k as u64 + 1,
            loss: None,
        }
    }

    #[test]
    fn batches_are_shown_once_in_order_one_read_behind_and_all_after_a_flush() {
        let mut e = Script {
            losses: (0..10).map(|k| (k as f64, k)).collect(),
            ..Script::default()
        };
        let mut d = DeferredLosses::default();
        let mut shown = Vec::new();
        for k in 0..10 {
            assert_eq!(d.next_slot(), k % 3);
            d.push(trained(k));
            if d.pending() == 3 {
                let r = d.rotate(&mut e, false).unwrap();
                assert!(!r.nonfinite);
                shown.extend(r.done.iter().map(|b| b.k));
                // One read behind: only batches of the read queued before.
                assert!(shown.len() + 3 <= k + 1, "{shown:?} at {k}");
            }
        }
        let r = d.rotate(&mut e, true).unwrap();
        shown.extend(r.done.iter().map(|b| b.k));
        assert_eq!(shown, (0..10).collect::<Vec<_>>());
        assert!(d.is_empty());
        assert_eq!(e.queued, vec![3, 3, 3, 1]);
        assert!(e.rewound.is_empty());
    }

    #[test]
    fn a_nonfinite_loss_ends_the_batches_shown_and_rewinds_every_skipped_step() {
        let mut losses: Vec<(f64, usize)> = (0..9).map(|k| (k as f64, k)).collect();
        losses[4].0 = f64::NAN;
        let mut e = Script {
            losses,
            ..Script::default()
        };
        let mut d = DeferredLosses::default();
        let mut last = Read::default();
        for k in 0..9 {
            d.push(trained(k));
            if d.pending() == 3 {
                last = d.rotate(&mut e, false).unwrap();
                if last.nonfinite {
                    break;
                }
            }
        }
        // Batches 3..6 were read when 6..9 were queued: 4 is bad; 5 and the
        // three pending (6, 7, 8) were skipped by the guard, and 4 itself.
        assert!(last.nonfinite);
        assert_eq!(last.done.iter().map(|b| b.k).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(e.rewound, vec![2 + 3]);
        assert_eq!(d.pending(), 0);
    }
}
