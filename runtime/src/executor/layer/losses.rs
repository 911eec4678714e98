//! The layer path's deferred losses (`device.loss_lag` = L > 1; issue 22,
//! item 2: the accelerator thread only issues device work).
//!
//! Without them every batch's step reads its loss before its Adam step: one
//! synchronization of the compute stream per batch, which drains the
//! device's queue so the host's work for the next batch cannot overlap it.
//!
//! # Protocol
//! 1. **Train** without reading: batch `k`'s step
//!    ([`LayerDevice::train_prepared`] with `Some(slot)`) writes its loss sum
//!    and correct count into device slot `i` (the `i`-th batch since the last
//!    read was queued) and applies its Adam step behind the model's device
//!    guard; the version moves on at once, and the protocol hears
//!    `BatchTrained` with it.
//! 2. **Queue a read** of the pending slots ([`LayerDevice::queue_loss_read`]:
//!    one copy into page-locked memory on the compute stream, an event after
//!    it, nothing waits) when L batches are pending and at every super-batch's
//!    end, so each of the monitor's windows holds one read. The slots are
//!    written again at once: the next steps are queued after the copy.
//! 3. **Resolve** the read queued before (an event wait for that copy only:
//!    the device keeps the super-batch queued after it) right before queueing
//!    the next one, and show its batches to the session in order. The host
//!    thus runs at most about one super-batch ahead of the device.
//! 4. **Flush** (queue and resolve at once, which waits for every step so far)
//!    before a measurement mark ([`EpochRun::mark`](crate::executor::EpochRun)),
//!    at the run's end and before a cancel stops it, so a window's clock
//!    covers the device's work and every trained batch is shown.
//! 5. **Non-finite loss**: the device guard skipped that batch's step and
//!    every one queued after it. The version moves back by that many
//!    ([`LayerDevice::rewind_skipped`]), the session sees the bad batch and
//!    none after it (`train.on_nonfinite = "stop"`, the only mode a lag is
//!    used with, ends the run there).
//!
//! A callback's stop ends the run after the batches already trained, which
//! the session sees too, as on the step path (`executor/step/mod.rs`).

use crate::engine::{LayerDevice, PendingLosses};
use crate::error::Result;
use crate::executor::BatchDone;

/// A batch trained with a deferred loss (step 1), until its loss is read.
#[derive(Clone, Copy, Debug)]
pub(super) struct Trained {
    /// Batch index in the epoch.
    pub k: usize,
    /// Its clock seconds, gate to step queued.
    pub seconds: f64,
    /// The version its step made.
    pub version: u64,
}

/// What a resolution read: the batches to show, in order, and whether the
/// last of them had a non-finite loss (step 5: nothing after it is shown).
#[derive(Debug, Default)]
pub(super) struct Read {
    pub done: Vec<BatchDone>,
    pub nonfinite: bool,
}

/// Steps 1–5's bookkeeping: the batches whose slots are not read yet.
#[derive(Default)]
pub(super) struct DeferredLosses {
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
    pub fn rotate(&mut self, engine: &mut dyn LayerDevice, flush: bool) -> Result<Read> {
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
    fn resolve(&mut self, engine: &mut dyn LayerDevice, read: &mut Read) -> Result<bool> {
        let Some((batches, handle)) = self.reading.take() else {
            return Ok(false);
        };
        let losses = handle.resolve()?;
        if losses.len() != batches.len() {
            return Err(crate::error::Error::invalid_argument(
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
