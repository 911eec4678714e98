//! The layer path's losses between a step and the session: what the driver
//! holds for the batches `scheduler::protocol`'s loss actions name (its step
//! 7 decides when a read is queued, resolved and shown; this module carries
//! them out).
//!
//! With `device.loss_lag` = L > 1 a step does not read its loss: every
//! batch's step reading its loss before its Adam step would synchronize the
//! compute stream once per batch, draining the device's queue so the host's
//! work for the next batch could not overlap it. The step
//! ([`LayerDevice::train_prepared`] with `Some(slot)`) writes its loss sum and
//! correct count into device slot `slot` and applies its Adam step behind the
//! model's device guard; the version moves on at once.
//!
//! # Carrying out the loss actions
//! 1. `Train`: the batch is kept ([`Trained`]), with its loss when its step
//!    read it (no lag).
//! 2. `QueueLossRead { batches }`: [`LayerDevice::queue_loss_read`] of their
//!    slots: one copy into page-locked memory on the compute stream, an event
//!    after it, nothing waits. The slots are written again at once: the next
//!    steps are queued after the copy.
//! 3. `ResolveLossRead { batches }`: an event wait for that copy only (the
//!    device keeps the work queued after it); each batch gets its loss, and
//!    the first non-finite one answers the protocol's `LossesRead`.
//! 4. `ShowLosses { batches, rewind }`: after a non-finite loss the device's
//!    guard skipped that step and every one queued after it; the version moves
//!    back by the `rewind` steps the protocol counted
//!    ([`LayerDevice::rewind_skipped`]) first. Then the batches go to the
//!    session, in order.

use std::collections::VecDeque;
use std::ops::Range;

use crate::engine::{LayerDevice, PendingLosses};
use crate::error::{Error, Result};
use crate::executor::BatchDone;

/// A batch trained, until its loss is shown (step 1).
#[derive(Clone, Copy, Debug)]
pub(super) struct Trained {
    /// Batch index in the epoch.
    pub k: usize,
    /// Its clock seconds, gate to step queued.
    pub seconds: f64,
    /// The version its step made.
    pub version: u64,
    /// (loss × rows, correct), once read.
    pub loss: Option<(f64, usize)>,
}

/// The batches trained and not shown yet, in order, and the read in flight.
#[derive(Default)]
pub(super) struct DeferredLosses {
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
    pub fn queue(&mut self, engine: &mut dyn LayerDevice, batches: Range<usize>) -> Result<()> {
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
        engine: &mut dyn LayerDevice,
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
}
