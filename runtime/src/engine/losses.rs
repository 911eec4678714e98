//! Deferred losses (`device.loss_lag` = L > 1), one component for both
//! executors: a step writes its loss into a device slot instead of reading
//! it, and the slots of several batches come back in one asynchronous read.
//!
//! Read at once, every batch's loss synchronizes the compute stream before
//! its Adam step: the device's queue drains and the host's work for the next
//! batch cannot overlap it.
//!
//! # Protocol
//! 1. **Train** without reading: batch `k`'s step writes its loss sum and
//!    correct count into device slot `i` ([`DeferredLosses::next_slot`]: the
//!    `i`-th batch since the last read was queued) and applies its Adam step
//!    behind the model's device guard; the version moves on at once
//!    ([`DeferredLosses::push`]).
//! 2. **Queue a read** of the pending slots ([`LossReads::queue_loss_read`]:
//!    one copy into page-locked memory on the compute stream, an event after
//!    it, nothing waits; `engine/pinned.rs`) when the executor says so: when L
//!    batches are pending, and on the layer path also at every super-batch's
//!    end. The slots are written again at once: the next steps are queued
//!    after the copy.
//! 3. **Resolve** the read queued before (an event wait for that copy only:
//!    the device keeps the work queued after it) right before queueing the
//!    next one ([`DeferredLosses::rotate`]), and show its batches in order.
//!    The host thus runs at most one read ahead of the device.
//! 4. **Flush** (queue and resolve at once, which waits for every step so
//!    far; `rotate` with `flush`) before a measurement mark, at the end of an
//!    executor's call and before a cancel returns, so every trained batch is
//!    shown and a window's clock covers the device's work.
//! 5. **Non-finite loss**: the device guard skipped that batch's step and
//!    every one queued after it. The version moves back by that many
//!    ([`LossReads::rewind_skipped`]), and the batches shown end with the bad
//!    one ([`Read::nonfinite`]): nothing after it is shown
//!    (`train.on_nonfinite = "stop"`, the only mode a lag is used with, ends
//!    the run there).
//!
//! A callback's stop is seen when its batch is shown; the executor then
//! flushes, so the run ends after the batches already trained, which the
//! session sees too.

use super::pinned::PendingCopy;
use super::{dev_err, DeviceEngine};
use crate::error::{Error, Result};
use gpu_ops::Backend;

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

/// A batch trained with a deferred loss (step 1), until its loss is read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Trained {
    /// Batch index in the epoch.
    pub k: usize,
    /// Its clock seconds, start to step queued.
    pub seconds: f64,
    /// The version its step made.
    pub version: u64,
}

/// What a resolution read: the batches to show, in order, and whether the
/// last of them had a non-finite loss (step 5: nothing after it is shown).
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

/// What [`DeferredLosses`] asks of the engine (steps 2 and 5); object-safe,
/// so the layer pipeline's device trait extends it.
pub(crate) trait LossReads {
    /// Loss slots `0..n` on their way to the host, queued after every step so
    /// far without waiting for them (step 2).
    fn queue_loss_read(&mut self, n: usize) -> Result<Box<dyn PendingLosses>>;
    /// After a non-finite deferred loss: the version moves back by the
    /// `skipped` steps the device did not apply, and the guard is cleared
    /// (step 5).
    fn rewind_skipped(&mut self, skipped: usize) -> Result<()>;
}

/// Steps 1–5's bookkeeping: the batches whose slots are not read yet.
#[derive(Default)]
pub(crate) struct DeferredLosses {
    /// Trained since the last read was queued: batch `i` wrote slot `i`.
    pending: Vec<Trained>,
    /// The read queued last (step 2), with its batches.
    reading: Option<(Vec<Trained>, Box<dyn PendingLosses>)>,
}

impl DeferredLosses {
    /// The slot the next batch writes.
    pub fn next_slot(&self) -> usize {
        self.pending.len()
    }

    /// Step 1: `batch` wrote slot [`DeferredLosses::next_slot`].
    pub fn push(&mut self, batch: Trained) {
        self.pending.push(batch);
    }

    /// Batches trained and not yet queued for a read.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether every trained batch was shown.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.reading.is_none()
    }

    /// Steps 2 and 3: resolves the read in flight, then queues one of the
    /// pending batches; with `flush` (step 4) resolves that one too.
    pub fn rotate(&mut self, engine: &mut dyn LossReads, flush: bool) -> Result<Read> {
        let mut read = Read::default();
        if self.resolve(engine, &mut read)? {
            return Ok(read);
        }
        if !self.pending.is_empty() {
            let handle = engine.queue_loss_read(self.pending.len())?;
            self.reading = Some((std::mem::take(&mut self.pending), handle));
        }
        if flush {
            self.resolve(engine, &mut read)?;
        }
        Ok(read)
    }

    /// Step 3 (and 5) for the read in flight, appended to `read`; returns
    /// whether a loss was non-finite.
    fn resolve(&mut self, engine: &mut dyn LossReads, read: &mut Read) -> Result<bool> {
        let Some((batches, handle)) = self.reading.take() else {
            return Ok(false);
        };
        let losses = handle.resolve()?;
        if losses.len() != batches.len() {
            return Err(Error::invalid_argument(
                "device.loss_lag",
                format!(
                    "internal: {} losses read for {} batches",
                    losses.len(),
                    batches.len()
                ),
            ));
        }
        for (i, (b, &(loss_sum, correct))) in batches.iter().zip(&losses).enumerate() {
            read.done.push(BatchDone {
                k: b.k,
                loss_sum,
                correct,
                seconds: b.seconds,
                version: b.version,
            });
            if !loss_sum.is_finite() {
                // Step 5: this step and every one queued after it were skipped.
                let skipped = batches.len() - i + self.pending.len();
                self.pending.clear();
                engine.rewind_skipped(skipped)?;
                read.nonfinite = true;
                return Ok(true);
            }
        }
        Ok(false)
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
