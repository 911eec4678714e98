//! The hybrid monitor: moves hot vertices between CPU computation and the device
//! feature cache (NeutronOrch §4.1.3, which the paper's artifact does not build).
//!
//! The hot set `0..hot` is split at `cpu` ([`HotSplit`]): the CPU computes
//! embeddings for `0..cpu`, the accelerator computes `cpu..hot` itself from
//! features kept in its cache. The worklist is the hot set in hotness order and
//! the monitor moves the boundary: *to the cache* takes the coldest CPU vertices
//! (they save the CPU a whole embedding and cost the accelerator the fewest uses),
//! *back to the CPU* returns the hottest cached ones.
//!
//! # The loop, step by step
//! After super-batch `k` finishes, the runtime measures over its window (end of
//! `k - 1` to end of `k`) and calls [`Monitor::observe`]:
//!
//! 1. **Check** the observation (finite, non-negative, `k` increasing).
//! 2. **Retire** splits no super-batch will use again (a newer one is in effect
//!    from `k + 1` on); their cache rows may be freed.
//! 3. **Memory.** The cache may hold `allowed = min(budget, committed + free -
//!    reserve)` bytes, where `committed` is what live splits hold. If the newest
//!    split holds more, shrink it to fit at once (reason `MemoryPressure`; no
//!    dwell, no waiting for pending moves).
//! 4. **Sample.** Windows before super-batch `warmup` (a pipeline still filling)
//!    and windows planned before the previous move took effect (it applies from
//!    super-batch `k' + 1 + D`, [`PipelineConfig::effective_from`]) are not
//!    evidence: drop them. Keep the others since the previous move took effect.
//!    Decide on the mean of the last `smoothing` of them, and only once there are
//!    that many (one is enough before the first move, so the monitor reacts as
//!    soon as the pipeline is full).
//! 5. **To the cache** if the accelerator waited for hot embeddings more than
//!    `wait_high` of the time: move `m = gain · cpu · wait / t_cpu` vertices, where
//!    `t_cpu` is the CPU's hot-work wall time (the share of the CPU's work to shed
//!    so it finishes `wait` earlier), at least `min_step`, at most `max_step · hot`,
//!    the CPU set, and what the memory allows.
//! 6. **Back to the CPU** if in none of the sampled windows the accelerator waited
//!    more than `wait_low` of the time, and the CPU was idle at least `idle_high` of
//!    its time: return `m = back_gain · idle / c` vertices, `c` being the CPU time
//!    per CPU-set vertex (or `back_gain · max_step` of the cache when the CPU set is
//!    empty), within the same step limits — and at most half way up to the
//!    *ceiling*, the CPU-set size at which the last move to the cache found the
//!    accelerator waiting (bisection: a size known to wait is not tried again). A
//!    ceiling within `max(min_step, 1% of the hot set)` of the CPU set is forgotten.
//! 7. **Hysteresis.** The gap between `wait_high` and `wait_low` is a dead band,
//!    decisions need `smoothing` windows of evidence, and a move against the
//!    previous direction needs `min_dwell` more windows after the previous move
//!    took effect. Steps 5–6 both undershoot by construction (the moved vertices
//!    are colder than the CPU-set average), so moves approach the balance from one
//!    side.
//! 8. **Emit** a [`MoveEvent`]: the runtime applies it to super-batches from
//!    `effective_from` on — copies the moved rows' features into the cache now (to
//!    the cache), or evicts them once no live split needs them (back) — and traces it.
//!
//! # Time mode (`MonitorConfig::time`)
//! Steps 5–7 are replaced by the line search of [`ShareController`] over the CPU
//! share `0..=` the initial hot set, on each window's duration (every window is
//! one super-batch of the same size). A window counts when it was planned with
//! the split in effect since the last move took effect (step 4's rule); the search
//! says which share to run next. Growing the share to `c` gives `(max(hot, c),
//! c)`: rows `cpu..c` come back from the cache (evicted once no live split needs
//! them) or from the cold set. Shrinking it to `c` gives `(min(hot, c + room), c)`,
//! `room` the cache rows the memory allows: rows `c..cpu` go to the cache while
//! it has room, and the rest — all of them with no cache — become cold
//! ([`MoveEvent::dropped`]: gathered from host memory by the accelerator's own
//! layer 0). Share 0 with no cache is the all-GPU placement on the layer path. Step
//! 3's memory pressure keeps the CPU share and drops the coldest cached rows.

use std::collections::VecDeque;
use std::ops::Range;

use crate::error::{invalid, Result};
use crate::pipeline::{HotSplit, PipelineConfig};
use crate::share::{ShareConfig, ShareController};

/// The monitor's knobs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MonitorConfig {
    /// Move to the cache when hot waiting exceeds this fraction of the window.
    pub wait_high: f64,
    /// Move back only when hot waiting is at most this fraction (`<= wait_high`).
    pub wait_low: f64,
    /// Move back only when the CPU idled at least this fraction of its time.
    pub idle_high: f64,
    /// Share of the estimated excess removed by one move to the cache (0, 1].
    pub gain: f64,
    /// Share of the CPU's idle time filled by one move back (0, 1].
    pub back_gain: f64,
    /// Largest move, as a fraction of the hot set (0, 1].
    pub max_step: f64,
    /// Smallest move, in vertices (≥ 1).
    pub min_step: u32,
    /// Measured super-batches between a move taking effect and a move the other way.
    pub min_dwell: u64,
    /// Super-batches observed before the first load-driven move.
    pub warmup: u64,
    /// Windows averaged per decision (≥ 1).
    pub smoothing: u64,
    /// Bytes the cache may hold, at most.
    pub memory_budget_bytes: u64,
    /// Free device memory the cache never takes.
    pub reserve_bytes: u64,
    /// Steer the CPU share by the measured time per super-batch instead of
    /// steps 5–6 (the *time* mode of the module doc); `None`: wait/idle balance.
    pub time: Option<ShareConfig>,
}

impl MonitorConfig {
    /// The defaults with a memory budget: 5% / 1% wait thresholds, 25% idle
    /// threshold, full gain to the cache, half gain back, steps of at most 3/4 of
    /// the hot set, dwell 2, warm-up 1, smoothing over 2 windows, no reserve.
    pub fn with_budget(memory_budget_bytes: u64) -> Self {
        Self {
            wait_high: 0.05,
            wait_low: 0.01,
            idle_high: 0.25,
            gain: 1.0,
            back_gain: 0.5,
            max_step: 0.75,
            min_step: 1,
            min_dwell: 2,
            warmup: 1,
            smoothing: 2,
            memory_budget_bytes,
            reserve_bytes: 0,
            time: None,
        }
    }

    /// Checks ranges: fractions in `[0, 1]` with `wait_low <= wait_high`, gains and
    /// `max_step` in `(0, 1]`, `min_step >= 1`.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("monitor.wait_high", self.wait_high),
            ("monitor.wait_low", self.wait_low),
            ("monitor.idle_high", self.idle_high),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(invalid(name, "a fraction in [0, 1]", v));
            }
        }
        if self.wait_low > self.wait_high {
            return Err(invalid(
                "monitor.wait_low",
                format!("at most monitor.wait_high ({})", self.wait_high),
                self.wait_low,
            ));
        }
        for (name, v) in [
            ("monitor.gain", self.gain),
            ("monitor.back_gain", self.back_gain),
            ("monitor.max_step", self.max_step),
        ] {
            if !(v > 0.0 && v <= 1.0) {
                return Err(invalid(name, "a fraction in (0, 1]", v));
            }
        }
        if self.min_step == 0 {
            return Err(invalid("monitor.min_step", "at least 1 vertex", 0));
        }
        if self.smoothing == 0 {
            return Err(invalid("monitor.smoothing", "at least 1 window", 0));
        }
        if let Some(t) = &self.time {
            t.validate()?;
        }
        Ok(())
    }
}

/// What the runtime measured over one super-batch's window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Observation {
    /// The super-batch that just finished.
    pub super_batch: u64,
    /// Length of its window, seconds.
    pub duration_s: f64,
    /// Accelerator busy time in the window.
    pub acc_busy_s: f64,
    /// Accelerator time spent waiting for hot embeddings (the gate) in the window.
    pub acc_wait_hot_s: f64,
    /// CPU workers.
    pub cpu_workers: u32,
    /// Worker-seconds the CPU spent on hot-embedding work in the window.
    pub cpu_hot_busy_s: f64,
    /// Worker-seconds the CPU workers were idle in the window.
    pub cpu_idle_s: f64,
    /// Free device memory at the end of the window.
    pub free_device_bytes: u64,
}

/// Which way hot vertices move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From CPU computation to the device feature cache.
    ToCache,
    /// From the device feature cache back to CPU computation.
    ToCpu,
}

/// Why the monitor moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MoveReason {
    /// The accelerator waited for hot embeddings (step 6).
    AcceleratorWaits,
    /// The CPU idled while the accelerator did not wait (step 7).
    CpuIdle,
    /// The cache no longer fits the device memory allowed (step 3).
    MemoryPressure,
    /// The time mode's search over the CPU share ([`ShareController`]).
    EpochTime,
}

/// One decision of the monitor, for the runtime to apply and trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoveEvent {
    /// The super-batch after which it was decided.
    pub decided_after: u64,
    /// The first super-batch planned with the new split.
    pub effective_from: u64,
    /// Which way.
    pub direction: Direction,
    /// Why.
    pub reason: MoveReason,
    /// The relabeled ids moved.
    pub vertices: Range<u32>,
    /// The split before.
    pub before: HotSplit,
    /// The split after.
    pub after: HotSplit,
    /// Bytes the new split's cache holds.
    pub cache_bytes_after: u64,
    /// Relabeled ids that leave the hot set (time mode: no cache room for them;
    /// they are cold from `effective_from` on and their cache rows, if any, may
    /// be freed now). Empty in the balance mode.
    pub dropped: Range<u32>,
}

/// The monitor's state: the splits still in use and the last move.
#[derive(Clone, Debug)]
pub struct Monitor {
    cfg: MonitorConfig,
    pipeline: PipelineConfig,
    row_bytes: u64,
    /// `(effective_from, split)`, oldest first; the front is in use now.
    targets: VecDeque<(u64, HotSplit)>,
    last_move: Option<(Direction, u64)>,
    last_observed: Option<u64>,
    /// Windows kept as evidence since the last move took effect (step 4).
    samples: VecDeque<Observation>,
    /// The CPU-set size at which the accelerator was last seen waiting (step 6).
    ceiling: Option<u32>,
    reversals: u64,
    /// The time mode's search (`cfg.time`), over shares `0..=` the initial hot set.
    share: Option<ShareController>,
}

impl Monitor {
    /// A monitor starting from `initial`, whose cache rows cost `row_bytes` of
    /// device memory each (a feature row, in the dtype the device stores). Hot
    /// rows above the CPU share that the budget cannot hold are not the
    /// monitor's: they stay cold (gathered from host memory like any other), so
    /// the initial split keeps the CPU share and at most the budget's rows above
    /// it ([`Monitor::split`] says what was kept). Any split a caller can choose
    /// is thus valid.
    pub fn new(
        cfg: MonitorConfig,
        pipeline: PipelineConfig,
        initial: HotSplit,
        row_bytes: u64,
    ) -> Result<Self> {
        cfg.validate()?;
        if row_bytes == 0 {
            return Err(invalid("row_bytes", "at least 1 byte per cached row", 0));
        }
        let fits = (cfg.memory_budget_bytes / row_bytes).min(u64::from(initial.cached())) as u32;
        let share = match cfg.time {
            Some(t) => Some(ShareController::new(t, initial.hot(), initial.cpu())?),
            None => None,
        };
        let initial = HotSplit::new(initial.cpu() + fits, initial.cpu())?;
        Ok(Self {
            cfg,
            pipeline,
            row_bytes,
            targets: VecDeque::from([(0, initial)]),
            last_move: None,
            last_observed: None,
            samples: VecDeque::new(),
            ceiling: None,
            reversals: 0,
            share,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MonitorConfig {
        &self.cfg
    }

    /// The newest split decided.
    pub fn split(&self) -> HotSplit {
        self.targets.back().map_or(HotSplit::all_cpu(0), |t| t.1)
    }

    /// The split in effect for super-batch `j` (the newest decided one whose
    /// `effective_from <= j`; super-batches before the oldest live split get it).
    pub fn split_for(&self, j: u64) -> HotSplit {
        self.targets
            .iter()
            .rev()
            .find(|t| t.0 <= j)
            .or(self.targets.front())
            .map_or(HotSplit::all_cpu(0), |t| t.1)
    }

    /// Bytes of device cache the live splits need (the largest of them: rows in
    /// any live split stay resident until it retires).
    pub fn committed_cache_bytes(&self) -> u64 {
        self.targets
            .iter()
            .map(|t| t.1.cached() as u64)
            .max()
            .unwrap_or(0)
            * self.row_bytes
    }

    /// Moves that reversed the previous move's direction so far.
    pub fn reversals(&self) -> u64 {
        self.reversals
    }

    /// Steps 1–8 of the module doc for the super-batch that just finished.
    pub fn observe(&mut self, obs: &Observation) -> Result<Option<MoveEvent>> {
        // 1. Check.
        check_observation(obs)?;
        if let Some(last) = self.last_observed {
            if obs.super_batch <= last {
                return Err(invalid(
                    "observation.super_batch",
                    format!("a super-batch after {last}"),
                    obs.super_batch,
                ));
            }
        }
        self.last_observed = Some(obs.super_batch);
        let k = obs.super_batch;
        // 2. Retire.
        while self.targets.len() > 1 && self.targets[1].0 <= k + 1 {
            self.targets.pop_front();
        }
        let cur = self.split();
        let row = self.row_bytes;
        // 3. Memory.
        let allowed = self.cfg.memory_budget_bytes.min(
            (self.committed_cache_bytes() + obs.free_device_bytes)
                .saturating_sub(self.cfg.reserve_bytes),
        );
        let allowed_rows = (allowed / row).min(u32::MAX as u64) as u32;
        if cur.cached() > allowed_rows {
            let m = cur.cached() - allowed_rows;
            if self.share.is_some() {
                // Time mode: the CPU share is the search's; rows the cache cannot
                // hold go cold.
                let after = HotSplit::new(cur.cpu() + allowed_rows, cur.cpu())?;
                return self.push(k, Direction::ToCpu, MoveReason::MemoryPressure, after);
            }
            return self.emit(k, Direction::ToCpu, MoveReason::MemoryPressure, m);
        }
        if self.share.is_some() {
            return self.observe_time(k, obs, allowed_rows);
        }
        // 4. Sample.
        let effective = self.last_move.map_or(0, |(_, eff)| eff);
        if k < self.cfg.warmup || k < effective {
            return Ok(None);
        }
        self.samples.push_back(*obs);
        while self.samples.len() as u64 > self.cfg.smoothing {
            self.samples.pop_front();
        }
        let need = if self.last_move.is_some() {
            self.cfg.smoothing
        } else {
            1
        };
        if (self.samples.len() as u64) < need {
            return Ok(None);
        }
        let dwell_ok = |want: Direction, this: &Self| match this.last_move {
            Some((d, eff)) if d != want => k >= eff + this.cfg.min_dwell,
            _ => true,
        };
        let sum = |f: fn(&Observation) -> f64| self.samples.iter().map(f).sum::<f64>();
        let window = sum(|o| o.duration_s).max(f64::MIN_POSITIVE);
        let wait = sum(|o| o.acc_wait_hot_s);
        let hot_busy = sum(|o| o.cpu_hot_busy_s);
        let idle = sum(|o| o.cpu_idle_s);
        let max_wait_frac = self
            .samples
            .iter()
            .map(|o| o.acc_wait_hot_s / o.duration_s.max(f64::MIN_POSITIVE))
            .fold(0.0, f64::max);
        let wait_frac = wait / window;
        let idle_frac = if hot_busy + idle > 0.0 {
            idle / (hot_busy + idle)
        } else {
            0.0
        };
        let max_rows = ((self.cfg.max_step * cur.hot() as f64).ceil() as u32).max(1);
        // 5. To the cache.
        if wait_frac > self.cfg.wait_high && cur.cpu() > 0 && dwell_ok(Direction::ToCache, self) {
            let t_cpu = hot_busy / obs.cpu_workers as f64;
            let share = if t_cpu > 0.0 {
                (wait / t_cpu.max(wait)).min(1.0)
            } else {
                self.cfg.max_step
            };
            let want = (self.cfg.gain * share * cur.cpu() as f64).ceil() as u32;
            let room = allowed_rows.saturating_sub(cur.cached());
            let m = want
                .max(self.cfg.min_step)
                .min(max_rows)
                .min(cur.cpu())
                .min(room);
            if m == 0 {
                return Ok(None);
            }
            self.ceiling = Some(cur.cpu());
            return self.emit(k, Direction::ToCache, MoveReason::AcceleratorWaits, m);
        }
        // 6. Back to the CPU.
        if max_wait_frac <= self.cfg.wait_low
            && idle_frac >= self.cfg.idle_high
            && cur.cached() > 0
            && dwell_ok(Direction::ToCpu, self)
        {
            let want = if cur.cpu() > 0 && hot_busy > 0.0 {
                let per_vertex = hot_busy / cur.cpu() as f64;
                (self.cfg.back_gain * idle / per_vertex).floor()
            } else {
                (self.cfg.back_gain * self.cfg.max_step * cur.cached() as f64).ceil()
            };
            let want = want.min(u32::MAX as f64) as u32;
            let mut m = want.max(self.cfg.min_step).min(max_rows).min(cur.cached());
            if let Some(c) = self.ceiling {
                let near = self.cfg.min_step.max(cur.hot().div_ceil(100));
                if c <= cur.cpu() + near {
                    self.ceiling = None;
                } else {
                    m = m.min((c - cur.cpu()) / 2);
                }
            }
            if m == 0 {
                return Ok(None);
            }
            return self.emit(k, Direction::ToCpu, MoveReason::CpuIdle, m);
        }
        Ok(None)
    }

    /// The time mode after steps 1–3: feeds the search the window's time when
    /// the window was planned with the split in effect since the last move, and
    /// turns a new target share into a split (module doc, *Time mode*).
    fn observe_time(
        &mut self,
        k: u64,
        obs: &Observation,
        allowed_rows: u32,
    ) -> Result<Option<MoveEvent>> {
        let effective = self.last_move.map_or(0, |(_, eff)| eff);
        if k < self.cfg.warmup || k < effective {
            return Ok(None);
        }
        let in_effect = self.split_for(k).cpu();
        let Some(share) = self.share.as_mut() else {
            return Ok(None);
        };
        let Some(c) = share.observe(in_effect, obs.duration_s)? else {
            return Ok(None);
        };
        let cur = self.split();
        if c < cur.cpu() {
            // Rows c..cpu go to the accelerator: cached while the cache has room
            // (the hottest first), the rest, and the coldest cached rows past the
            // room, cold.
            let hot = cur.hot().min(c.saturating_add(allowed_rows)).max(c);
            let after = HotSplit::new(hot, c)?;
            self.push(k, Direction::ToCache, MoveReason::EpochTime, after)
        } else if c > cur.cpu() {
            let after = HotSplit::new(cur.hot().max(c), c)?;
            self.push(k, Direction::ToCpu, MoveReason::EpochTime, after)
        } else {
            Ok(None)
        }
    }

    /// Records the move from the newest split to `after` decided after
    /// super-batch `k` (time mode and its memory pressure).
    fn push(
        &mut self,
        k: u64,
        direction: Direction,
        reason: MoveReason,
        after: HotSplit,
    ) -> Result<Option<MoveEvent>> {
        let before = self.split();
        let vertices = match direction {
            Direction::ToCache => after.cpu()..before.cpu().min(after.hot()),
            Direction::ToCpu => before.cpu()..after.cpu(),
        };
        let dropped = after.hot().min(before.hot())..before.hot();
        let effective_from = self.pipeline.effective_from(k);
        if reason != MoveReason::MemoryPressure {
            if let Some((d, _)) = self.last_move {
                if d != direction {
                    self.reversals += 1;
                }
            }
        }
        self.last_move = Some((direction, effective_from));
        self.samples.clear();
        while self.targets.len() > 1 && self.targets.back().is_some_and(|t| t.0 >= effective_from) {
            self.targets.pop_back();
        }
        self.targets.push_back((effective_from, after));
        Ok(Some(MoveEvent {
            decided_after: k,
            effective_from,
            direction,
            reason,
            vertices,
            before,
            after,
            cache_bytes_after: after.cached() as u64 * self.row_bytes,
            dropped,
        }))
    }

    /// The time mode's search, when it runs.
    pub fn share(&self) -> Option<&ShareController> {
        self.share.as_ref()
    }

    /// Step 8: records a move of `m` vertices decided after super-batch `k`.
    fn emit(
        &mut self,
        k: u64,
        direction: Direction,
        reason: MoveReason,
        m: u32,
    ) -> Result<Option<MoveEvent>> {
        let before = self.split();
        let (cpu, vertices) = match direction {
            Direction::ToCache => (before.cpu() - m, before.cpu() - m..before.cpu()),
            Direction::ToCpu => (before.cpu() + m, before.cpu()..before.cpu() + m),
        };
        let after = HotSplit::new(before.hot(), cpu)?;
        let effective_from = self.pipeline.effective_from(k);
        if reason != MoveReason::MemoryPressure {
            if let Some((d, _)) = self.last_move {
                if d != direction {
                    self.reversals += 1;
                }
            }
        }
        self.last_move = Some((direction, effective_from));
        self.samples.clear();
        // A newer decision for the same first super-batch replaces the older one.
        while self.targets.len() > 1 && self.targets.back().is_some_and(|t| t.0 >= effective_from) {
            self.targets.pop_back();
        }
        self.targets.push_back((effective_from, after));
        Ok(Some(MoveEvent {
            decided_after: k,
            effective_from,
            direction,
            reason,
            vertices,
            before,
            after,
            cache_bytes_after: after.cached() as u64 * self.row_bytes,
            dropped: before.hot()..before.hot(),
        }))
    }
}

fn check_observation(obs: &Observation) -> Result<()> {
    for (name, v) in [
        ("observation.duration_s", obs.duration_s),
        ("observation.acc_busy_s", obs.acc_busy_s),
        ("observation.acc_wait_hot_s", obs.acc_wait_hot_s),
        ("observation.cpu_hot_busy_s", obs.cpu_hot_busy_s),
        ("observation.cpu_idle_s", obs.cpu_idle_s),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(invalid(name, "a finite, non-negative time in seconds", v));
        }
    }
    if obs.cpu_workers == 0 {
        return Err(invalid("observation.cpu_workers", "at least 1", 0));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn monitor(hot: u32, cpu: u32, budget_rows: u64) -> Monitor {
        let pipe = PipelineConfig::new(4, 1, 64).unwrap();
        let mut cfg = MonitorConfig::with_budget(budget_rows * 100);
        cfg.warmup = 0;
        cfg.smoothing = 1;
        Monitor::new(cfg, pipe, HotSplit::new(hot, cpu).unwrap(), 100).unwrap()
    }

    fn obs(k: u64, wait: f64, hot_busy: f64, idle: f64) -> Observation {
        Observation {
            super_batch: k,
            duration_s: 1.0,
            acc_busy_s: 1.0 - wait,
            acc_wait_hot_s: wait,
            cpu_workers: 2,
            cpu_hot_busy_s: hot_busy,
            cpu_idle_s: idle,
            free_device_bytes: 1 << 40,
        }
    }

    #[test]
    fn waiting_moves_the_coldest_cpu_vertices_to_the_cache_then_waits_for_the_effect() {
        let mut m = monitor(1000, 1000, 1000);
        // The CPU works 2 s of wall time (4 worker-s over 2 workers) and the
        // accelerator waits 0.5 s of a 1 s window: shed a quarter.
        let e = m.observe(&obs(0, 0.5, 4.0, 0.0)).unwrap().unwrap();
        assert_eq!(e.direction, Direction::ToCache);
        assert_eq!(e.reason, MoveReason::AcceleratorWaits);
        assert_eq!(e.vertices, 750..1000);
        assert_eq!(e.after.cpu(), 750);
        assert_eq!(e.effective_from, 2);
        assert_eq!(e.cache_bytes_after, 25_000);
        assert_eq!(m.split_for(1).cpu(), 1000);
        assert_eq!(m.split_for(2).cpu(), 750);
        assert_eq!(m.committed_cache_bytes(), 25_000);
        // Pending: super-batch 1 does not show the effect yet.
        assert_eq!(m.observe(&obs(1, 0.5, 4.0, 0.0)).unwrap(), None);
        let e = m.observe(&obs(2, 0.3, 4.0, 0.0)).unwrap().unwrap();
        assert_eq!(e.direction, Direction::ToCache);
        assert_eq!(e.before.cpu(), 750);
    }

    #[test]
    fn the_memory_budget_caps_moves_and_pressure_shrinks_the_cache() {
        let mut m = monitor(1000, 1000, 100);
        let e = m.observe(&obs(0, 0.9, 2.0, 0.0)).unwrap().unwrap();
        assert_eq!(e.after.cached(), 100);
        assert!(m.committed_cache_bytes() <= 100 * 100);
        // Budget full: waiting again moves nothing.
        for k in 2..5 {
            assert_eq!(m.observe(&obs(k, 0.9, 2.0, 0.0)).unwrap(), None);
        }
        // Free memory drops: the cache must shrink to what fits.
        let mut o = obs(5, 0.9, 2.0, 0.0);
        o.free_device_bytes = 0;
        let mut shrink = MonitorConfig::with_budget(100 * 100);
        shrink.reserve_bytes = 4_000;
        m.cfg = shrink;
        let e = m.observe(&o).unwrap().unwrap();
        assert_eq!(e.reason, MoveReason::MemoryPressure);
        assert_eq!(e.direction, Direction::ToCpu);
        assert_eq!(e.after.cached(), 60);
    }

    #[test]
    fn an_idle_cpu_takes_work_back_after_the_dwell_time() {
        let mut m = monitor(1000, 600, 1000);
        // No waiting, CPU idle 75% of its time: give back half the idle capacity.
        // 0.5 worker-s for 600 vertices; 1.5 worker-s idle → 0.5 · 1.5 / (0.5/600) = 900, capped at 400.
        let e = m.observe(&obs(0, 0.0, 0.5, 1.5)).unwrap().unwrap();
        assert_eq!(e.direction, Direction::ToCpu);
        assert_eq!(e.reason, MoveReason::CpuIdle);
        assert_eq!(e.vertices, 600..1000);
        // A reversal right after the move took effect is refused (dwell 2).
        assert_eq!(m.observe(&obs(2, 0.5, 2.0, 0.0)).unwrap(), None);
        assert_eq!(m.observe(&obs(3, 0.5, 2.0, 0.0)).unwrap(), None);
        let e = m.observe(&obs(4, 0.5, 2.0, 0.0)).unwrap().unwrap();
        assert_eq!(e.direction, Direction::ToCache);
        assert_eq!(m.reversals(), 1);
    }

    #[test]
    fn later_moves_wait_for_smoothed_evidence() {
        let pipe = PipelineConfig::new(4, 1, 64).unwrap();
        let mut cfg = MonitorConfig::with_budget(1 << 30);
        cfg.warmup = 1;
        let mut m = Monitor::new(cfg, pipe, HotSplit::all_cpu(1000), 100).unwrap();
        // Warm-up window: ignored.
        assert_eq!(m.observe(&obs(0, 0.9, 4.0, 0.0)).unwrap(), None);
        // First evidence: one window is enough.
        let e = m.observe(&obs(1, 0.5, 4.0, 0.0)).unwrap().unwrap();
        assert_eq!(e.effective_from, 3);
        assert_eq!(m.observe(&obs(2, 0.5, 4.0, 0.0)).unwrap(), None);
        // After the effect: two windows, decided on their mean (0.2 and 0.0 → 0.1).
        assert_eq!(m.observe(&obs(3, 0.2, 4.0, 0.0)).unwrap(), None);
        let e = m.observe(&obs(4, 0.0, 4.0, 0.0)).unwrap().unwrap();
        // share = 0.2 s of waiting over 4 s of CPU wall time: 5% of 750.
        assert_eq!(e.vertices.len(), 38);
        // A single quiet-but-idle window after a noisy one does not move back.
        let mut m2 = Monitor::new(cfg, pipe, HotSplit::new(1000, 500).unwrap(), 100).unwrap();
        m2.observe(&obs(1, 0.5, 4.0, 0.0)).unwrap().unwrap(); // to the cache, effective 3
        assert_eq!(m2.observe(&obs(3, 0.02, 0.5, 1.5)).unwrap(), None);
        assert_eq!(m2.observe(&obs(4, 0.0, 0.5, 1.5)).unwrap(), None); // dwell (3 + 2)
        assert_eq!(m2.observe(&obs(5, 0.02, 0.5, 1.5)).unwrap(), None); // a wait in the samples
        assert_eq!(m2.observe(&obs(6, 0.0, 0.5, 1.5)).unwrap(), None);
        let e = m2.observe(&obs(7, 0.0, 0.5, 1.5)).unwrap().unwrap();
        assert_eq!(e.direction, Direction::ToCpu);
    }

    #[test]
    fn the_dead_band_holds_still() {
        let mut m = monitor(1000, 500, 1000);
        for k in 0..20 {
            // Small waits (between low and high) and a busy CPU: nothing moves.
            assert_eq!(m.observe(&obs(k, 0.03, 1.9, 0.1)).unwrap(), None);
        }
        assert_eq!(m.split().cpu(), 500);
    }

    #[test]
    fn bad_observations_and_configs_are_errors() {
        let mut m = monitor(10, 10, 10);
        let mut o = obs(0, 0.1, 1.0, 0.0);
        o.acc_wait_hot_s = f64::NAN;
        assert!(m
            .observe(&o)
            .unwrap_err()
            .to_string()
            .contains("acc_wait_hot_s"));
        let mut o = obs(0, 0.1, 1.0, 0.0);
        o.cpu_workers = 0;
        assert!(m.observe(&o).is_err());
        m.observe(&obs(3, 0.0, 1.0, 0.0)).unwrap();
        assert!(m.observe(&obs(3, 0.0, 1.0, 0.0)).is_err());
        let mut c = MonitorConfig::with_budget(0);
        c.wait_low = 0.5;
        assert!(c.validate().unwrap_err().to_string().contains("wait_low"));
    }

    /// A split whose rows above the CPU share do not fit the cache (`auto`
    /// choosing a small CPU share of a large hot set; 2026-11-26: 420,000 rows
    /// for a 250 MB cache) is not an error: the monitor keeps the CPU share and
    /// the rows the budget holds; the rest are cold.
    #[test]
    fn an_initial_split_beyond_the_budget_keeps_the_cpu_share_and_what_fits() {
        let pipe = PipelineConfig::new(1, 1, 1).unwrap();
        let m = Monitor::new(
            MonitorConfig::with_budget(250),
            pipe,
            HotSplit::new(10, 5).unwrap(),
            100,
        )
        .unwrap();
        assert_eq!((m.split().cpu(), m.split().cached()), (5, 2));
        // Within the budget, the split is kept as it is.
        let m = Monitor::new(
            MonitorConfig::with_budget(1000),
            pipe,
            HotSplit::new(10, 5).unwrap(),
            100,
        )
        .unwrap();
        assert_eq!(m.split(), HotSplit::new(10, 5).unwrap());
        // No room at all: every hot row above the CPU share is cold.
        let m = Monitor::new(
            MonitorConfig::with_budget(0),
            pipe,
            HotSplit::new(10, 0).unwrap(),
            100,
        )
        .unwrap();
        assert_eq!(m.split(), HotSplit::new(0, 0).unwrap());
    }
}
