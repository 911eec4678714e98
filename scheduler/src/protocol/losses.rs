//! The deferred losses of one epoch (protocol step 7, a loss lag `L > 1`):
//! which trained batches' loss slots are pending, which read is in flight, and
//! the read-out in progress — a rotation (resolve the read in flight, queue
//! the pending batches') or a flush (a rotation, then resolve the read just
//! queued), with the measurement mark that waits for it.

use std::collections::VecDeque;
use std::ops::Range;

use super::event::Action;
use crate::error::{Result, SchedulerError};

/// A measurement mark: the batch it is before, and whether it opens the window.
pub(crate) type Mark = (usize, bool);

/// What a read-out does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Resolve the read in flight, then queue.
    Resolve,
    /// Queue a read of the pending batches.
    Queue,
    /// Resolve the read just queued (a flush), then done.
    ResolveQueued,
    /// Emit the mark waiting for it, if any.
    Done,
}

/// One read-out in progress.
#[derive(Clone, Copy, Debug)]
struct ReadOut {
    stage: Stage,
    flush: bool,
    mark: Option<Mark>,
}

/// Step 7's loss reads for one epoch.
#[derive(Debug)]
pub(crate) struct DeferredLosses {
    /// `L`: with `L <= 1` every step reads its own loss and nothing is deferred.
    lag: usize,
    /// Trained, their slots not queued for a read yet: batch `pending.start + i`
    /// wrote slot `i`.
    pending: Range<usize>,
    /// The read in flight (queued, not resolved).
    reading: Option<Range<usize>>,
    /// The read-out in progress.
    op: Option<ReadOut>,
    /// Awaiting [`Event::LossesRead`](super::Event::LossesRead).
    resolving: bool,
}

impl DeferredLosses {
    /// No batch trained yet; the epoch's first batch is `first`.
    pub(crate) fn new(lag: usize, first: usize) -> Self {
        Self {
            lag: lag.max(1),
            pending: first..first,
            reading: None,
            op: None,
            resolving: false,
        }
    }

    /// Whether steps defer their losses (`L > 1`).
    pub(crate) fn deferred(&self) -> bool {
        self.lag > 1
    }

    /// The slot the next batch's step writes (`None`: it reads its loss).
    pub(crate) fn slot(&self) -> Option<usize> {
        self.deferred().then_some(self.pending.len())
    }

    /// Batch `k` trained (with its loss in slot [`DeferredLosses::slot`]).
    pub(crate) fn trained(&mut self, k: usize) -> Result<()> {
        if !self.deferred() {
            return Ok(());
        }
        if self.pending.is_empty() {
            self.pending = k..k + 1;
        } else if self.pending.end == k {
            self.pending.end += 1;
        } else {
            return Err(SchedulerError::ProtocolInvariant {
                what: format!(
                    "batch {k} trained after batches {:?}, whose losses are pending",
                    self.pending
                ),
            });
        }
        Ok(())
    }

    /// Whether `L` batches are pending (a rotation is due).
    pub(crate) fn full(&self) -> bool {
        self.deferred() && self.pending.len() >= self.lag
    }

    /// Whether some batch is pending.
    pub(crate) fn any_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Whether some trained batch's loss is not read yet.
    pub(crate) fn unread(&self) -> bool {
        !self.pending.is_empty() || self.reading.is_some()
    }

    /// Whether a read-out is in progress.
    pub(crate) fn busy(&self) -> bool {
        self.op.is_some()
    }

    /// Starts a rotation.
    pub(crate) fn rotate(&mut self) {
        self.op = Some(ReadOut {
            stage: Stage::Resolve,
            flush: false,
            mark: None,
        });
    }

    /// Starts a flush followed by `mark`; with nothing unread, `mark` goes out
    /// at once.
    pub(crate) fn flush(&mut self, mark: Option<Mark>, out: &mut VecDeque<Action>) {
        if self.unread() {
            self.op = Some(ReadOut {
                stage: Stage::Resolve,
                flush: true,
                mark,
            });
        } else if let Some((batch, start)) = mark {
            out.push_back(Action::Mark { batch, start });
        }
    }

    /// Drops the read-out in progress (a stop): returns the mark it carried.
    /// The read in flight and the pending batches stay.
    pub(crate) fn abandon(&mut self) -> Option<Mark> {
        self.resolving = false;
        self.op.take().and_then(|o| o.mark)
    }

    /// Advances the read-out in progress; `true` when it awaits the answer to
    /// the resolution it emitted.
    pub(crate) fn step(&mut self, out: &mut VecDeque<Action>) -> bool {
        while let Some(op) = self.op.as_mut() {
            match op.stage {
                Stage::Resolve | Stage::ResolveQueued => {
                    op.stage = if op.stage == Stage::Resolve {
                        Stage::Queue
                    } else {
                        Stage::Done
                    };
                    if let Some(r) = &self.reading {
                        out.push_back(Action::ResolveLossRead { batches: r.clone() });
                        self.resolving = true;
                        return true;
                    }
                }
                Stage::Queue => {
                    op.stage = if op.flush {
                        Stage::ResolveQueued
                    } else {
                        Stage::Done
                    };
                    if !self.pending.is_empty() {
                        let end = self.pending.end;
                        let batches = std::mem::replace(&mut self.pending, end..end);
                        out.push_back(Action::QueueLossRead {
                            batches: batches.clone(),
                        });
                        self.reading = Some(batches);
                    }
                }
                Stage::Done => {
                    if let Some((batch, start)) = op.mark {
                        out.push_back(Action::Mark { batch, start });
                    }
                    self.op = None;
                }
            }
        }
        false
    }

    /// The answer to the resolution: shows the read's batches, or, at a
    /// non-finite loss, those up to it and returns the steps the device
    /// skipped (it and every step after it: the rest of the read and the
    /// pending batches), forgetting the rest.
    pub(crate) fn read(
        &mut self,
        nonfinite: Option<usize>,
        out: &mut VecDeque<Action>,
    ) -> Result<Option<u64>> {
        let read = match (&self.reading, self.resolving) {
            (Some(r), true) => r.clone(),
            _ => {
                return Err(SchedulerError::UnexpectedEvent {
                    event: "LossesRead",
                    state: "no loss read is being resolved".into(),
                })
            }
        };
        if let Some(b) = nonfinite.filter(|b| !read.contains(b)) {
            return Err(SchedulerError::ProtocolInvariant {
                what: format!("a non-finite loss of batch {b}, outside the read {read:?}"),
            });
        }
        self.reading = None;
        self.resolving = false;
        let Some(b) = nonfinite else {
            out.push_back(Action::ShowLosses {
                batches: read,
                rewind: 0,
            });
            return Ok(None);
        };
        let rewind = (read.end - b + self.pending.len()) as u64;
        let end = self.pending.end;
        self.pending = end..end;
        self.op = None;
        out.push_back(Action::ShowLosses {
            batches: read.start..b + 1,
            rewind,
        });
        Ok(Some(rewind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(l: &mut DeferredLosses, out: &mut VecDeque<Action>) -> Vec<&'static str> {
        while l.step(out) {
            l.read(None, out).unwrap();
        }
        out.drain(..).map(|a| a.name()).collect()
    }

    #[test]
    fn a_rotation_resolves_the_read_in_flight_then_queues_the_pending_batches() {
        let mut out = VecDeque::new();
        let mut l = DeferredLosses::new(2, 3);
        assert_eq!(l.slot(), Some(0));
        l.trained(3).unwrap();
        assert_eq!(l.slot(), Some(1));
        l.trained(4).unwrap();
        assert!(l.full());
        assert!(l.trained(6).is_err(), "batches train in order");
        l.rotate();
        assert_eq!(drain(&mut l, &mut out), ["QueueLossRead"]);
        l.trained(5).unwrap();
        l.rotate();
        assert_eq!(
            drain(&mut l, &mut out),
            ["ResolveLossRead", "ShowLosses", "QueueLossRead"]
        );
        l.flush(Some((6, true)), &mut out);
        assert_eq!(
            drain(&mut l, &mut out),
            ["ResolveLossRead", "ShowLosses", "Mark"]
        );
        assert!(!l.unread());
        // Nothing unread: the mark goes out at once.
        l.flush(Some((7, false)), &mut out);
        assert_eq!(
            out.pop_front(),
            Some(Action::Mark {
                batch: 7,
                start: false
            })
        );
        // Without a lag nothing is deferred.
        let mut one = DeferredLosses::new(1, 0);
        one.trained(0).unwrap();
        assert_eq!((one.slot(), one.unread()), (None, false));
    }

    #[test]
    fn a_non_finite_loss_rewinds_it_and_every_step_after_it() {
        let mut out = VecDeque::new();
        let mut l = DeferredLosses::new(3, 0);
        for k in 0..3 {
            l.trained(k).unwrap();
        }
        l.rotate();
        assert!(!l.step(&mut out));
        l.trained(3).unwrap();
        l.trained(4).unwrap();
        l.flush(None, &mut out);
        assert!(l.step(&mut out));
        assert!(
            l.read(Some(7), &mut out).is_err(),
            "batch 7 is not in the read"
        );
        // Batch 1 is non-finite: 1 and 2 of the read, 3 and 4 pending.
        assert_eq!(l.read(Some(1), &mut out).unwrap(), Some(4));
        assert_eq!(
            out.pop_back(),
            Some(Action::ShowLosses {
                batches: 0..2,
                rewind: 4
            })
        );
        assert!(!l.unread() && !l.busy());
        assert!(l.read(None, &mut out).is_err(), "nothing is being resolved");
    }
}
