//! Epoch-time control of the CPU share: a line search over the number of hot
//! vertices the CPU computes, on the measured time per super-batch.
//!
//! The wait/idle rules of [`Monitor`](crate::Monitor) balance the CPU against the
//! accelerator inside a fixed hot set; they cannot tell whether a CPU row saves
//! more accelerator time than it costs, so they never shrink the CPU share to
//! zero, and with no cache room they cannot move at all. [`ShareController`]
//! measures what the share is for: the wall time of a super-batch (every batch of
//! a super-batch is the same size, so this is the time per batch times a constant).
//!
//! # The search, step by step
//! The controller holds an *anchor* share `a` with its measured time `t_a`, a
//! direction `d` (−1: toward all-GPU, +1: toward more CPU rows, starting with −1)
//! and a step `s` (`first_step` of the largest share at first).
//! 1. **Measure.** A window counts only if it was planned entirely with the share
//!    being measured (the caller passes the share in effect); `smoothing` windows
//!    are averaged into one measurement.
//! 2. **Anchor.** The first measurement is `t_a`; then probe.
//! 3. **Probe** `p = clamp(a + d·s, 0, max)`. If `p == a` (a boundary), the probe
//!    fails without a measurement.
//! 4. **Accept** a probe measured faster than `(1 − band)·t_a`: it becomes the
//!    anchor, and the same direction and step are probed next (the side it came
//!    from is known slower at this step).
//! 5. **Reject** any other probe: the target goes back to the anchor. If the
//!    other direction has not been tried at this step, it is tried next; else the
//!    step halves (keeping the direction). A step below `min_step` of the largest
//!    share **settles** the search at the anchor.
//! 6. **Settled**, the share holds. Each further measurement of it is compared
//!    with `t_a`; one that differs by more than `drift` (relative) restarts the
//!    search from the anchor with the first step (the costs changed: a new
//!    regime, a slower device, another job on the CPU).
//!
//! # Hysteresis
//! A share changes only on a measured gain of more than `band`; measurement noise
//! of amplitude below `band / 2` can therefore never move the anchor, and noise
//! below `drift / 2` never restarts a settled search. Probes are reverted at
//! once when they do not pay, and the search ends after at most about
//! `2·log2(first_step / min_step)` rejected probes plus one per accepted step.
//! Share 0 is the all-GPU placement on the layer path (no CPU rows): reached by
//! accepted probes, it is held like any other settled share.

use crate::error::{invalid, Result};

/// What the hybrid monitor steers by (`orchestration.monitor_control`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum MonitorControl {
    /// The measured time per super-batch: the CPU share is searched for the
    /// fastest, down to none ([`ShareController`]; the default).
    #[default]
    Time,
    /// The accelerator's wait against the CPU's idle time, inside the hot set
    /// ([`Monitor`](crate::Monitor)'s steps 5–6).
    Balance,
}

impl MonitorControl {
    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Time => "time",
            Self::Balance => "balance",
        }
    }
}

/// The search's knobs (module doc).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShareConfig {
    /// Relative gain a probe must show to be accepted, in `(0, 1)`.
    pub band: f64,
    /// Relative change of a settled share's time that restarts the search
    /// (`>= band`).
    pub drift: f64,
    /// First step, as a fraction of the largest share, in `(0, 1]`.
    pub first_step: f64,
    /// The search settles when the step falls below this fraction of the largest
    /// share (`<= first_step`, at least one vertex).
    pub min_step: f64,
    /// Windows averaged per measurement (≥ 1).
    pub smoothing: u64,
}

impl Default for ShareConfig {
    /// 5% band, 15% drift, first step a quarter of the largest share, settle
    /// below 1/16 of it, two windows per measurement.
    fn default() -> Self {
        Self {
            band: 0.05,
            drift: 0.15,
            first_step: 0.25,
            min_step: 1.0 / 16.0,
            smoothing: 2,
        }
    }
}

impl ShareConfig {
    /// Checks the ranges of the fields' docs.
    pub fn validate(&self) -> Result<()> {
        if !(self.band > 0.0 && self.band < 1.0) {
            return Err(invalid("share.band", "a fraction in (0, 1)", self.band));
        }
        if !(self.drift >= self.band && self.drift.is_finite()) {
            return Err(invalid(
                "share.drift",
                format!("a finite fraction at least share.band ({})", self.band),
                self.drift,
            ));
        }
        if !(self.first_step > 0.0 && self.first_step <= 1.0) {
            return Err(invalid(
                "share.first_step",
                "a fraction in (0, 1]",
                self.first_step,
            ));
        }
        if !(self.min_step > 0.0 && self.min_step <= self.first_step) {
            return Err(invalid(
                "share.min_step",
                format!("a fraction in (0, share.first_step = {}]", self.first_step),
                self.min_step,
            ));
        }
        if self.smoothing == 0 {
            return Err(invalid("share.smoothing", "at least 1 window", 0));
        }
        Ok(())
    }
}

/// Where the search is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharePhase {
    /// Measuring the anchor before the first probe.
    Start,
    /// Measuring a probe.
    Probing,
    /// Holding the anchor (step 6).
    Settled,
}

/// The line search of the module doc. Pure: it consumes measurements and says
/// which share to run next.
#[derive(Clone, Debug)]
pub struct ShareController {
    cfg: ShareConfig,
    max: u32,
    anchor: u32,
    anchor_time: f64,
    probe: Option<u32>,
    /// −1 or +1.
    dir: i64,
    step: u32,
    min_step: u32,
    /// Whether the direction opposite to `dir` is known slower at this step.
    other_known: bool,
    phase: SharePhase,
    samples: Vec<f64>,
    probes: u64,
    accepted: u64,
}

impl ShareController {
    /// A search over shares `0..=max` starting at `initial` (clamped to `max`).
    pub fn new(cfg: ShareConfig, max: u32, initial: u32) -> Result<Self> {
        cfg.validate()?;
        let step = ((cfg.first_step * f64::from(max)).ceil() as u32).max(1);
        let min_step = ((cfg.min_step * f64::from(max)).ceil() as u32).max(1);
        Ok(Self {
            cfg,
            max,
            anchor: initial.min(max),
            anchor_time: 0.0,
            probe: None,
            dir: -1,
            step,
            min_step,
            other_known: false,
            phase: SharePhase::Start,
            samples: Vec::new(),
            probes: 0,
            accepted: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ShareConfig {
        &self.cfg
    }

    /// The share to run now: the probe being measured, or the anchor.
    pub fn target(&self) -> u32 {
        self.probe.unwrap_or(self.anchor)
    }

    /// The best share measured so far.
    pub fn anchor(&self) -> u32 {
        self.anchor
    }

    /// Where the search is.
    pub fn phase(&self) -> SharePhase {
        self.phase
    }

    /// Probes started so far.
    pub fn probes(&self) -> u64 {
        self.probes
    }

    /// Probes accepted so far (anchor moves).
    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    /// Step 1: one window of `seconds` planned entirely with `share`. Returns the
    /// new target when it changes. A window of another share than the target (one
    /// planned before the last change took effect) is ignored. Fails for a time
    /// that is not finite and non-negative.
    pub fn observe(&mut self, share: u32, seconds: f64) -> Result<Option<u32>> {
        if !(seconds.is_finite() && seconds >= 0.0) {
            return Err(invalid(
                "share observation",
                "a finite, non-negative time in seconds",
                seconds,
            ));
        }
        if share != self.target() {
            return Ok(None);
        }
        self.samples.push(seconds);
        if (self.samples.len() as u64) < self.cfg.smoothing {
            return Ok(None);
        }
        let mean = self.samples.iter().sum::<f64>() / self.samples.len() as f64;
        self.samples.clear();
        let before = self.target();
        match self.phase {
            SharePhase::Start => {
                // Step 2.
                self.anchor_time = mean;
                self.next_probe();
            }
            SharePhase::Settled => {
                // Step 6.
                let t = self.anchor_time.max(f64::MIN_POSITIVE);
                if (mean - t).abs() / t > self.cfg.drift {
                    self.anchor_time = mean;
                    self.step = ((self.cfg.first_step * f64::from(self.max)).ceil() as u32).max(1);
                    self.dir = if self.anchor > 0 { -1 } else { 1 };
                    self.other_known = false;
                    self.next_probe();
                }
            }
            SharePhase::Probing => {
                let p = self.probe.take().unwrap_or(self.anchor);
                if mean < (1.0 - self.cfg.band) * self.anchor_time {
                    // Step 4.
                    self.anchor = p;
                    self.anchor_time = mean;
                    self.accepted += 1;
                    self.other_known = true;
                } else {
                    // Step 5.
                    self.reject();
                }
                self.next_probe();
            }
        }
        let after = self.target();
        Ok((after != before).then_some(after))
    }

    /// Step 5's bookkeeping for a failed probe.
    fn reject(&mut self) {
        if self.other_known {
            self.step /= 2;
            self.other_known = false;
        } else {
            self.dir = -self.dir;
            self.other_known = true;
        }
    }

    /// Step 3: picks the next probe, or settles (step 5).
    fn next_probe(&mut self) {
        loop {
            if self.step < self.min_step {
                self.phase = SharePhase::Settled;
                self.probe = None;
                return;
            }
            let p = (i64::from(self.anchor) + self.dir * i64::from(self.step))
                .clamp(0, i64::from(self.max)) as u32;
            if p == self.anchor {
                self.reject();
                continue;
            }
            self.probe = Some(p);
            self.probes += 1;
            self.phase = SharePhase::Probing;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `windows` windows with the time `cost(share, window)`; returns the
    /// share of every window.
    fn run(c: &mut ShareController, windows: usize, cost: impl Fn(u32, usize) -> f64) -> Vec<u32> {
        let mut shares = Vec::with_capacity(windows);
        for w in 0..windows {
            let s = c.target();
            shares.push(s);
            c.observe(s, cost(s, w)).unwrap();
        }
        shares
    }

    #[test]
    fn expensive_cpu_rows_go_to_zero_and_stay() {
        // Every CPU row costs more than the accelerator saves: time grows with it.
        let cost = |s: u32, _| 1.0 + 0.002 * f64::from(s);
        let mut c = ShareController::new(ShareConfig::default(), 400, 400).unwrap();
        let shares = run(&mut c, 60, cost);
        assert_eq!(c.anchor(), 0, "{shares:?}");
        assert_eq!(c.phase(), SharePhase::Settled, "{shares:?}");
        let settled_at = shares.len() - shares.iter().rev().take_while(|&&s| s == 0).count();
        // Once settled, nothing moves, whatever the time.
        let more = run(&mut c, 300, cost);
        assert!(more.iter().all(|&s| s == 0), "{more:?}");
        // The search was short: one probe per step down, two refinements off zero.
        assert!(
            settled_at <= 30,
            "settled after {settled_at} windows: {shares:?}"
        );
        assert!(c.probes() <= 8, "{} probes: {shares:?}", c.probes());
    }

    #[test]
    fn cheap_cpu_rows_grow_the_share_and_settle_near_the_best() {
        // The accelerator's time falls with CPU rows until the CPU becomes the
        // bottleneck at 230 of 400: time = max(gpu, cpu).
        let cost = |s: u32, _| {
            let s = f64::from(s);
            (2.0 - 0.004 * s).max(0.5 + 0.0025 * s)
        };
        let best = 230.0;
        for start in [0, 10, 400] {
            let mut c = ShareController::new(ShareConfig::default(), 400, start).unwrap();
            let shares = run(&mut c, 120, cost);
            assert_eq!(c.phase(), SharePhase::Settled, "from {start}: {shares:?}");
            let a = f64::from(c.anchor());
            // Within two of the smallest steps (25) of the best share, and its time
            // within 10% of the best time.
            assert!(
                (a - best).abs() <= 50.0,
                "from {start}: settled at {a}: {shares:?}"
            );
            assert!(
                cost(c.anchor(), 0) <= 1.1 * cost(230, 0),
                "from {start}: {a}"
            );
            let tail = &shares[shares.len() - 40..];
            assert!(
                tail.iter().all(|&s| s == c.anchor()),
                "from {start}: {tail:?}"
            );
        }
    }

    #[test]
    fn noise_within_the_band_moves_nothing() {
        // A flat cost with alternating noise of ±2% (band 5%): the anchor never
        // moves, the probes are all reverted, and once settled the share stays.
        for pattern in [[1.02, 0.98, 1.02, 0.98], [1.02, 1.02, 0.98, 0.98]] {
            let cost = |_s: u32, w: usize| pattern[w % 4];
            let mut c = ShareController::new(ShareConfig::default(), 400, 200).unwrap();
            let shares = run(&mut c, 400, cost);
            assert_eq!(c.anchor(), 200, "{shares:?}");
            assert_eq!(c.accepted(), 0);
            assert_eq!(c.phase(), SharePhase::Settled);
            let last_probe = shares.iter().rposition(|&s| s != 200).unwrap_or(0);
            assert!(last_probe < 30, "still probing at window {last_probe}");
            assert!(c.probes() <= 6, "{} probes", c.probes());
        }
    }

    #[test]
    fn a_settled_share_searches_again_when_its_time_drifts() {
        let mut c = ShareController::new(ShareConfig::default(), 100, 100).unwrap();
        // CPU rows too expensive: all-GPU.
        run(&mut c, 60, |s, _| 1.0 + 0.01 * f64::from(s));
        assert_eq!((c.anchor(), c.phase()), (0, SharePhase::Settled));
        // The accelerator becomes 3x slower per batch; CPU rows now pay.
        run(&mut c, 120, |s, _| {
            (3.0 - 0.02 * f64::from(s)).max(1.0 + 0.01 * f64::from(s))
        });
        assert_eq!(c.phase(), SharePhase::Settled);
        assert!((c.anchor() as i64 - 67).abs() <= 15, "{}", c.anchor());
    }

    #[test]
    fn windows_of_an_older_share_are_not_evidence() {
        let mut c = ShareController::new(ShareConfig::default(), 100, 100).unwrap();
        assert_eq!(c.observe(100, 1.0).unwrap(), None);
        assert_eq!(c.observe(100, 1.0).unwrap(), Some(75));
        // Windows still planned with 100 (the probe takes effect later).
        for _ in 0..5 {
            assert_eq!(c.observe(100, 0.1).unwrap(), None);
        }
        assert_eq!(c.target(), 75);
        assert!(c.observe(75, f64::NAN).is_err());
        assert!(c.observe(75, -1.0).is_err());
    }

    #[test]
    fn an_empty_range_and_bad_knobs() {
        // Nothing to share: settles at once at 0 and stays.
        let mut c = ShareController::new(ShareConfig::default(), 0, 5).unwrap();
        assert_eq!(c.target(), 0);
        run(&mut c, 10, |_, _| 1.0);
        assert_eq!((c.target(), c.phase()), (0, SharePhase::Settled));
        let bad = [
            ShareConfig {
                band: 0.0,
                ..ShareConfig::default()
            },
            ShareConfig {
                drift: 0.01,
                ..ShareConfig::default()
            },
            ShareConfig {
                first_step: 1.5,
                ..ShareConfig::default()
            },
            ShareConfig {
                min_step: 0.5,
                ..ShareConfig::default()
            },
            ShareConfig {
                smoothing: 0,
                ..ShareConfig::default()
            },
        ];
        for cfg in bad {
            assert!(ShareController::new(cfg, 10, 10).is_err(), "{cfg:?}");
        }
    }
}
