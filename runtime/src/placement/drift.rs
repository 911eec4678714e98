//! `policy = "auto"` re-decides when what its choice costs drifts:
//! after the decision, every epoch that trains wholly on the choice
//! is timed per batch; the first such epoch is the baseline (the calibration
//! probes time steady-state windows, an epoch also holds the pipeline's fill
//! and drain, so the probe's figure is not comparable); the baseline follows
//! the fastest epoch since; an epoch more than [`DRIFT`] slower than the
//! baseline asks for a new calibration from the next epoch. Re-decisions are
//! capped at [`MAX_REDECISIONS`] per run, so a machine whose speed keeps
//! changing does not spend its run measuring.
//!
//! Epochs, not batches: a layer-based epoch's per-batch time is lumpy within a
//! super-batch and the time monitor (`scheduler::ShareController`) already
//! corrects the CPU share within an epoch on a 15% drift; this watch catches
//! what the share cannot fix (the placement itself has become the wrong one).

/// An epoch this much slower per batch than the baseline triggers a
/// re-decision (above the time monitor's own 15% re-search threshold, and far
/// above the ±2–5% epoch-to-epoch noise measured on the host backend).
pub const DRIFT: f64 = 0.25;
/// Re-decisions per run at most.
pub const MAX_REDECISIONS: u32 = 3;
/// Epochs shorter than this many batches on the choice are not timed (their
/// per-batch figure is mostly the pipeline's fill).
pub const MIN_BATCHES: usize = 8;

/// What one timed epoch says.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    /// Too short to say anything.
    Untimed,
    /// The first timed epoch on this choice: the baseline.
    Baseline(f64),
    /// Within [`DRIFT`] of the baseline (the baseline after this epoch).
    Steady {
        /// This epoch's seconds per batch.
        per_batch_s: f64,
        /// The baseline it was compared with.
        baseline_s: f64,
    },
    /// Slower than the baseline by more than [`DRIFT`]: measure again.
    Drifted {
        /// This epoch's seconds per batch.
        per_batch_s: f64,
        /// The baseline it was compared with.
        baseline_s: f64,
    },
    /// Drifted, but the run has used its [`MAX_REDECISIONS`].
    Exhausted {
        /// This epoch's seconds per batch.
        per_batch_s: f64,
        /// The baseline it was compared with.
        baseline_s: f64,
    },
}

/// The drift watch of one run (module doc).
#[derive(Debug, Default)]
pub struct DriftWatch {
    baseline: Option<f64>,
    redecisions: u32,
}

impl DriftWatch {
    /// A watch with no baseline and no re-decision used.
    pub fn new() -> Self {
        Self::default()
    }

    /// Re-decisions asked for so far.
    pub fn redecisions(&self) -> u32 {
        self.redecisions
    }

    /// An epoch of `batches` batches that took `secs`, trained wholly on the
    /// current choice.
    pub fn observe(&mut self, batches: usize, secs: f64) -> Verdict {
        if batches < MIN_BATCHES || !secs.is_finite() || secs <= 0.0 {
            return Verdict::Untimed;
        }
        let per_batch_s = secs / batches as f64;
        let Some(baseline_s) = self.baseline else {
            self.baseline = Some(per_batch_s);
            return Verdict::Baseline(per_batch_s);
        };
        if per_batch_s <= baseline_s * (1.0 + DRIFT) {
            self.baseline = Some(baseline_s.min(per_batch_s));
            return Verdict::Steady {
                per_batch_s,
                baseline_s,
            };
        }
        if self.redecisions >= MAX_REDECISIONS {
            return Verdict::Exhausted {
                per_batch_s,
                baseline_s,
            };
        }
        // The next choice sets its own baseline.
        self.redecisions += 1;
        self.baseline = None;
        Verdict::Drifted {
            per_batch_s,
            baseline_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: usize = 40;

    fn epoch(w: &mut DriftWatch, ms: f64) -> Verdict {
        w.observe(N, ms * 1e-3 * N as f64)
    }

    #[test]
    fn the_first_timed_epoch_is_the_baseline_and_short_ones_are_not_timed() {
        let mut w = DriftWatch::new();
        assert_eq!(w.observe(MIN_BATCHES - 1, 1.0), Verdict::Untimed);
        assert_eq!(w.observe(N, 0.0), Verdict::Untimed);
        assert_eq!(w.observe(N, f64::NAN), Verdict::Untimed);
        assert!(matches!(epoch(&mut w, 2.0), Verdict::Baseline(b) if (b - 2e-3).abs() < 1e-12));
        assert!(matches!(epoch(&mut w, 2.0), Verdict::Steady { .. }));
    }

    #[test]
    fn noise_within_the_margin_never_triggers() {
        let mut w = DriftWatch::new();
        epoch(&mut w, 10.0);
        // ±10% around the baseline for 200 epochs, and a slow crawl to +20%.
        for i in 0..200 {
            let noise = 1.0 + 0.1 * ((i * 7919 % 21) as f64 - 10.0) / 10.0;
            let v = epoch(&mut w, 10.0 * noise);
            assert!(matches!(v, Verdict::Steady { .. }), "epoch {i}: {v:?}");
        }
        assert_eq!(w.redecisions(), 0);
    }

    #[test]
    fn a_slowdown_past_the_margin_triggers_once_then_the_next_choice_sets_its_baseline() {
        let mut w = DriftWatch::new();
        epoch(&mut w, 10.0);
        epoch(&mut w, 10.2);
        let v = epoch(&mut w, 13.0);
        let Verdict::Drifted {
            per_batch_s,
            baseline_s,
        } = v
        else {
            panic!("{v:?}");
        };
        assert!((per_batch_s - 13e-3).abs() < 1e-12 && (baseline_s - 10e-3).abs() < 1e-12);
        assert_eq!(w.redecisions(), 1);
        // The new choice runs at 13 ms: that is its baseline, not a drift.
        assert!(matches!(epoch(&mut w, 13.0), Verdict::Baseline(_)));
        assert!(matches!(epoch(&mut w, 13.5), Verdict::Steady { .. }));
    }

    #[test]
    fn the_baseline_follows_the_fastest_epoch() {
        // A cold first epoch (page cache, allocator) must not hide a later
        // slowdown relative to the warm speed.
        let mut w = DriftWatch::new();
        epoch(&mut w, 20.0);
        epoch(&mut w, 10.0);
        assert!(matches!(epoch(&mut w, 12.4), Verdict::Steady { .. }));
        assert!(matches!(epoch(&mut w, 12.6), Verdict::Drifted { .. }));
    }

    #[test]
    fn re_decisions_are_capped() {
        let mut w = DriftWatch::new();
        let mut ms = 1.0;
        for _ in 0..MAX_REDECISIONS {
            epoch(&mut w, ms);
            ms *= 2.0;
            assert!(matches!(epoch(&mut w, ms), Verdict::Drifted { .. }));
        }
        epoch(&mut w, ms);
        assert!(matches!(epoch(&mut w, ms * 2.0), Verdict::Exhausted { .. }));
        assert_eq!(w.redecisions(), MAX_REDECISIONS);
    }
}
