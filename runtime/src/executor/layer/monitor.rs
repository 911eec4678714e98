//! The hybrid monitor at run time: feeds [`scheduler::Monitor`] one
//! [`Observation`] per super-batch and applies its [`MoveEvent`]s to the plans and
//! to the device feature cache (docs/orchestration.md §6, §9).
//!
//! The hot set `0..hot` (relabeled ids) is split at `cpu`: the CPU computes
//! `0..cpu`; `cpu..hot` are *cache-hot*, treated as cold by the accelerator (its
//! own layer 0 computes them) with their feature rows kept in the device cache.
//!
//! # Protocol (the accelerator thread, once per super-batch)
//! 1. **Setup** (the first epoch with `orchestration.monitor = true`): the
//!    monitor's budget is the feature cache's capacity in whole rows
//!    (`cache_stats().budget_bytes` / row bytes, at most the vertex count). The
//!    rows the engine cached at load — the first `cached_rows` of
//!    [`Dataset::degree_order`] — are *filler*: the monitor's rows displace
//!    them, lowest degree first, and get them back when they leave.
//! 2. **Plan.** Super-batches are numbered globally across epochs (`g` = epoch
//!    base + local index); super-batch `g` is planned with
//!    [`Monitor::split_for`]`(g)` ([`HybridMonitor::split_for`]).
//! 3. **Measure** over the super-batch's window (end of the previous super-batch,
//!    or the epoch's start, to the end of its last batch's publication):
//!    wall time; accelerator seconds blocked in hot waits; CPU worker-seconds
//!    spent on hot chunks (credited when a chunk finishes); CPU idle
//!    worker-seconds (`workers × wall − busy`, at least 0); and as free device
//!    memory the cache headroom the monitor may still claim (its budget minus
//!    what its live splits hold: filler rows count as free, they are displaced).
//! 4. **Observe** ([`Monitor::observe`]) when the protocol's
//!    [`scheduler::Action::EndSuperBatch`] says so (`observe`): not for the first
//!    and the last super-batch of an epoch, where the pipeline is filling (the
//!    accelerator waits for queue 0 whatever the split) or draining (the CPU has
//!    no next queue and idles). So an epoch of fewer than three super-batches
//!    gives no evidence.
//! 5. **To the cache** (an event moving relabeled ids `a..b`): make room by
//!    evicting filler rows (lowest degree first), then
//!    [`LayerDevice::update_cache`] with the moved vertices' user ids, now — the
//!    super-batches planned before `effective_from` still compute them on the CPU,
//!    which is harmless. The cache refuses rows past its budget; only the rows it
//!    reports cached count as moved (stats and trace). The plan still treats the
//!    whole range as cold (correct either way: a cold row the cache lacks is
//!    gathered from host memory).
//! 6. **Back to the CPU**: the rows stay until super-batch `effective_from`
//!    starts (the super-batch planned before still treats them as cold), then
//!    those the newest split leaves on the CPU are evicted and the displaced
//!    filler rows come back, highest degree first, in the same
//!    [`LayerDevice::update_cache`] call. Their hot-table rows are old: the staleness
//!    gate makes the CPU recompute them (wait) or the accelerator compute them
//!    (compute), as for any late row.
//! 7. **Trace and count** every applied event: an instant `monitor move` on the
//!    accelerator track with `to_cache` or `to_cpu` (vertices), `cached_rows`,
//!    `cpu_share` (the new split's CPU rows) and, in the time mode, `dropped`
//!    (rows that left the hot set), and [`OrchestrationStats`]'s monitor counters.
//!
//! With `orchestration.monitor_control = "time"` (the default) steps 4–6 decide
//! by the measured time per super-batch instead ([`scheduler::ShareController`]:
//! the CPU share goes down to none, with or without cache room, docs/orchestration.md
//! §6.1); the rows a shrink cannot cache leave the hot set
//! ([`MoveEvent::dropped`]), their cache rows evicted at once.

use scheduler::{
    Direction, HotSplit, Monitor, MonitorConfig, MonitorControl, MoveEvent, Observation,
    PipelineConfig, Relabeling, ShareConfig,
};

use super::device::LayerDevice;
use crate::data::dataset::Dataset;
use crate::error::{Error, Result};
use crate::trace::{Direction as TraceDirection, Tracer, TrackId};

use super::stats::OrchestrationStats;
use crate::clock::Clock;

/// Who holds a vertex's cache row, in the runtime's model of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// Not cached.
    None,
    /// Cached at load (degree order), displaceable.
    Filler,
    /// Cached by a monitor move.
    Monitor,
}

/// The monitor's state at run time (module doc): the scheduler's [`Monitor`],
/// the cache model and the evictions waiting for their super-batch.
pub struct HybridMonitor {
    monitor: Monitor,
    workers: u32,
    row_bytes: u64,
    capacity_rows: u64,
    owner: Vec<Owner>,
    /// Filler rows in degree order (highest first); entries no longer filler are
    /// skipped lazily.
    filler: Vec<u32>,
    filler_rows: u64,
    monitor_rows: u64,
    /// Displaced filler rows, lowest degree first (restored from the back).
    displaced: Vec<u32>,
    /// `(effective_from, relabeled ids)` of moves back not evicted yet.
    pending_evictions: Vec<(u64, std::ops::Range<u32>)>,
    last_direction: Option<Direction>,
    /// The next global super-batch index (the next epoch's base).
    next_super_batch: u64,
}

/// Measurements of one super-batch window in progress (step 3).
pub(crate) struct Window {
    start_secs: f64,
    wait_secs: f64,
    cpu_busy_secs: f64,
    late: u64,
    hot_uses: u64,
}

impl Window {
    /// A window starting now on `clock`, with the epoch's counters so far.
    pub(crate) fn open(stats: &OrchestrationStats, clock: &dyn Clock) -> Self {
        Self {
            start_secs: clock.now().as_secs_f64(),
            wait_secs: stats.wait_secs,
            cpu_busy_secs: stats.cpu_busy_secs,
            late: stats.protocol.computed_cold + stats.protocol.waited,
            hot_uses: stats.protocol.hot_uses,
        }
    }
}

/// A finished super-batch, as [`HybridMonitor::end_super_batch`] sees it (the
/// protocol's [`scheduler::Action::EndSuperBatch`] and the driver's window).
pub(crate) struct SuperBatchEnd<'a> {
    /// The monitor's global index of the super-batch (`g`, step 2).
    pub global: u64,
    /// Its index in the epoch (the `monitor move` instant's `super_batch`).
    pub local: u64,
    /// Whether its window is evidence (step 4; the action's `observe`).
    pub observe: bool,
    /// Its measurements so far.
    pub window: &'a Window,
    /// The clock that closes the window.
    pub clock: &'a dyn Clock,
    /// Where the `monitor move` instant goes (step 7), and its track.
    pub trace: (&'a Tracer, TrackId),
}

impl HybridMonitor {
    /// Step 1: a monitor for the hot set of `split` on `engine`'s feature cache,
    /// starting from `split` (all of it on the CPU, or the split `policy =
    /// "auto"` chose), steering by `control` (the time mode searches the CPU
    /// share over `0..=split.hot()`).
    pub fn new(
        engine: &dyn LayerDevice,
        ds: &Dataset,
        pipeline: PipelineConfig,
        split: HotSplit,
        workers: usize,
        control: MonitorControl,
    ) -> Result<Self> {
        let sched = |source| Error::scheduler("orchestration.monitor", source);
        let row_bytes = engine.row_bytes();
        if row_bytes == 0 {
            return Err(Error::invalid_argument(
                "orchestration.monitor",
                "features of width 0 have no rows to cache",
            ));
        }
        let stats = engine.cache_stats();
        let n = ds.num_vertices();
        let capacity_rows = (stats.budget_bytes as u64 / row_bytes).min(n as u64);
        let mut owner = vec![Owner::None; n];
        let mut filler: Vec<u32> = ds.degree_order();
        filler.truncate(stats.cached_rows.min(n));
        for &v in &filler {
            owner[v as usize] = Owner::Filler;
        }
        let cfg = MonitorConfig {
            time: (control == MonitorControl::Time).then(ShareConfig::default),
            ..MonitorConfig::with_budget(capacity_rows * row_bytes)
        };
        let monitor = Monitor::new(cfg, pipeline, split, row_bytes).map_err(sched)?;
        Ok(Self {
            monitor,
            workers: workers.max(1) as u32,
            row_bytes,
            capacity_rows,
            owner,
            filler_rows: filler.len() as u64,
            filler,
            monitor_rows: 0,
            displaced: Vec::new(),
            pending_evictions: Vec::new(),
            last_direction: None,
            next_super_batch: 0,
        })
    }

    /// The global index of the next epoch's first super-batch; advances it by
    /// `count` super-batches (step 2).
    pub(crate) fn start_epoch(&mut self, count: u64) -> u64 {
        let base = self.next_super_batch;
        self.next_super_batch += count;
        base
    }

    /// Step 2: the split to plan global super-batch `g` with.
    pub fn split_for(&self, g: u64) -> HotSplit {
        self.monitor.split_for(g)
    }

    /// Rows the monitor's moves hold in the device cache now.
    #[cfg(test)]
    pub fn cached_rows(&self) -> u64 {
        self.monitor_rows
    }

    /// Step 6 at the start of global super-batch `g`: evicts the rows of moves
    /// back that take effect by now, restoring filler rows.
    pub(crate) fn begin_super_batch(
        &mut self,
        g: u64,
        engine: &mut dyn LayerDevice,
        relabeling: &Relabeling,
    ) -> Result<()> {
        if self.pending_evictions.iter().all(|(eff, _)| *eff > g) {
            return Ok(());
        }
        let newest_cpu = self.monitor.split().cpu();
        let mut evict = Vec::new();
        let mut keep = Vec::new();
        for (eff, ids) in self.pending_evictions.drain(..) {
            if eff > g {
                keep.push((eff, ids));
                continue;
            }
            for r in ids.filter(|&r| r < newest_cpu) {
                let v = relabeling.old_id(r);
                if self.owner[v as usize] == Owner::Monitor {
                    self.owner[v as usize] = Owner::None;
                    self.monitor_rows = self.monitor_rows.saturating_sub(1);
                    evict.push(v);
                }
            }
        }
        self.pending_evictions = keep;
        let mut free = self
            .capacity_rows
            .saturating_sub(self.filler_rows + self.monitor_rows);
        // Highest degree first; a displaced row the monitor cached since is skipped.
        let mut restore = Vec::new();
        while free > 0 {
            let Some(v) = self.displaced.pop() else { break };
            if self.owner[v as usize] == Owner::None {
                restore.push(v);
                free -= 1;
            }
        }
        let restored = engine.update_cache(&restore, &evict)?;
        for &v in restore.iter().take(restored) {
            self.owner[v as usize] = Owner::Filler;
            self.filler.push(v);
        }
        // Rows the cache refused are not filler any more (the model follows it).
        self.filler_rows += restored as u64;
        Ok(())
    }

    /// Gives the cache back to the step-based placements (the monitor ends:
    /// `policy = "auto"` leaves the layer pipeline, or its split is reset):
    /// evicts the rows the monitor's moves hold and restores the filler rows
    /// they displaced, highest degree first, so the cache holds the degree
    /// order it was loaded with (2026-11-26: a probe's moves left it holding
    /// hot rows of low rank, and the step-based placement `auto` chose ran
    /// 1.29× slower than the same placement alone at 512 columns).
    pub(crate) fn restore_cache(self, engine: &mut dyn LayerDevice) -> Result<()> {
        let evict: Vec<u32> = (0..self.owner.len() as u32)
            .filter(|&v| self.owner[v as usize] == Owner::Monitor)
            .collect();
        let mut seen = vec![false; self.owner.len()];
        let restore: Vec<u32> = self
            .displaced
            .iter()
            .rev()
            .copied()
            .filter(|&v| {
                self.owner[v as usize] != Owner::Filler
                    && !std::mem::replace(&mut seen[v as usize], true)
            })
            .collect();
        if evict.is_empty() && restore.is_empty() {
            return Ok(());
        }
        engine.update_cache(&restore, &evict)?;
        Ok(())
    }

    /// Steps 4–7 after a super-batch finished: observes its window (when
    /// `end.observe`) and applies a move to the cache now (a move back is queued
    /// for step 6).
    pub(crate) fn end_super_batch(
        &mut self,
        end: &SuperBatchEnd<'_>,
        stats: &mut OrchestrationStats,
        engine: &mut dyn LayerDevice,
        relabeling: &Relabeling,
    ) -> Result<()> {
        stats.monitor = true;
        stats.monitor_cached_rows = self.monitor_rows;
        if !end.observe {
            return Ok(());
        }
        let window = end.window;
        let duration = (end.clock.now().as_secs_f64() - window.start_secs).max(0.0);
        // Time the accelerator lost to a late CPU: blocked in hot waits
        // (`on_late = "wait"`), or, with `"compute"`, the share of the window's
        // hot rows it had to compute itself (late rows / rows the batches read) —
        // work moved back onto the accelerator by a CPU that did not keep up.
        let late =
            (stats.protocol.computed_cold + stats.protocol.waited).saturating_sub(window.late);
        let reads = (stats.protocol.hot_uses - window.hot_uses) + late;
        let late_share = if reads == 0 {
            0.0
        } else {
            late as f64 / reads as f64
        };
        let blocked = (stats.wait_secs - window.wait_secs).clamp(0.0, duration);
        let wait = if blocked > 0.0 {
            blocked
        } else {
            (late_share * duration).clamp(0.0, duration)
        };
        let busy = (stats.cpu_busy_secs - window.cpu_busy_secs).max(0.0);
        let capacity = self.workers as f64 * duration;
        let budget = self.monitor.config().memory_budget_bytes;
        let obs = Observation {
            super_batch: end.global,
            duration_s: duration,
            acc_busy_s: duration - wait,
            acc_wait_hot_s: wait,
            cpu_workers: self.workers,
            cpu_hot_busy_s: busy,
            cpu_idle_s: (capacity - busy).max(0.0),
            free_device_bytes: budget.saturating_sub(self.monitor.committed_cache_bytes()),
        };
        let event = self
            .monitor
            .observe(&obs)
            .map_err(|source| Error::scheduler("hybrid monitor", source))?;
        let Some(event) = event else {
            return Ok(());
        };
        self.drop_rows(&event, engine, relabeling)?;
        let moved = match event.direction {
            Direction::ToCache => self.move_to_cache(&event, engine, relabeling)?,
            Direction::ToCpu => {
                self.pending_evictions
                    .push((event.effective_from, event.vertices.clone()));
                event.vertices.len() as u64
            }
        };
        if self
            .last_direction
            .is_some_and(|d| d != event.direction && moved > 0)
        {
            stats.monitor_reversals += 1;
        }
        if moved > 0 {
            self.last_direction = Some(event.direction);
        }
        let (key, bytes) = match event.direction {
            Direction::ToCache => {
                stats.monitor_moves_to_cache += 1;
                stats.monitor_rows_to_cache += moved;
                ("to_cache", moved * self.row_bytes)
            }
            Direction::ToCpu => {
                stats.monitor_moves_to_cpu += 1;
                stats.monitor_rows_to_cpu += moved;
                ("to_cpu", 0)
            }
        };
        stats.monitor_cached_rows = self.monitor_rows;
        let cached = self.monitor_rows;
        let (tracer, track) = end.trace;
        tracer.instant_on(track, "monitor move", |a| {
            a.super_batch = Some(end.local);
            if bytes > 0 {
                a.bytes = Some(bytes);
                a.direction = Some(TraceDirection::HostToDevice);
            }
            a.extra.push((key.into(), moved as f64));
            a.extra
                .push(("effective_from".into(), event.effective_from as f64));
            a.extra.push(("cached_rows".into(), cached as f64));
            // The CPU share planned from `effective_from` on, and (time mode) the
            // rows that left the hot set for the cold path.
            a.extra
                .push(("cpu_share".into(), f64::from(event.after.cpu())));
            if !event.dropped.is_empty() {
                a.extra.push(("dropped".into(), event.dropped.len() as f64));
            }
        });
        Ok(())
    }

    /// The time mode's rows leaving the hot set ([`MoveEvent::dropped`]): their
    /// cache rows are evicted now (a super-batch planned before still treats them
    /// as cold to the accelerator, so a missing cache row is gathered from host
    /// memory: correct either way).
    fn drop_rows(
        &mut self,
        event: &MoveEvent,
        engine: &mut dyn LayerDevice,
        relabeling: &Relabeling,
    ) -> Result<()> {
        let mut evict = Vec::new();
        for r in event.dropped.clone() {
            let v = relabeling.old_id(r);
            if self.owner[v as usize] == Owner::Monitor {
                self.owner[v as usize] = Owner::None;
                self.monitor_rows = self.monitor_rows.saturating_sub(1);
                evict.push(v);
            }
        }
        if !evict.is_empty() {
            engine.update_cache(&[], &evict)?;
        }
        Ok(())
    }

    /// The time mode's search, when it runs (tests and the trace).
    #[cfg(test)]
    pub fn share(&self) -> Option<&scheduler::ShareController> {
        self.monitor.share()
    }

    /// Step 5: caches the moved vertices' rows, displacing filler; returns how
    /// many the cache holds afterwards.
    fn move_to_cache(
        &mut self,
        event: &MoveEvent,
        engine: &mut dyn LayerDevice,
        relabeling: &Relabeling,
    ) -> Result<u64> {
        // Coldest first: if the cache refuses some, the hottest are left out.
        let insert: Vec<u32> = event
            .vertices
            .clone()
            .rev()
            .map(|r| relabeling.old_id(r))
            .collect();
        let new = insert
            .iter()
            .filter(|&&v| self.owner[v as usize] == Owner::None)
            .count() as u64;
        let mut need =
            (self.filler_rows + self.monitor_rows + new).saturating_sub(self.capacity_rows);
        let moving: std::collections::HashSet<u32> = insert.iter().copied().collect();
        let mut evict = Vec::new();
        while need > 0 {
            let Some(v) = self.filler.pop() else { break };
            if self.owner[v as usize] != Owner::Filler || moving.contains(&v) {
                continue;
            }
            self.owner[v as usize] = Owner::None;
            self.filler_rows -= 1;
            self.displaced.push(v);
            evict.push(v);
            need -= 1;
        }
        let cached = engine.update_cache(&insert, &evict)? as u64;
        for &v in &insert {
            match self.owner[v as usize] {
                Owner::Monitor => {}
                Owner::Filler => {
                    self.filler_rows -= 1;
                    self.monitor_rows += 1;
                }
                Owner::None => self.monitor_rows += 1,
            }
            self.owner[v as usize] = Owner::Monitor;
        }
        // The model counts every moved vertex; the cache may hold fewer.
        self.monitor_rows -= (insert.len() as u64)
            .saturating_sub(cached)
            .min(self.monitor_rows);
        Ok(cached)
    }
}

#[cfg(test)]
mod tests {
    //! The monitor's run-time steps on scripted windows: time comes from a
    //! [`ManualClock`] and the window's waits and CPU time from scripted counters,
    //! so every decision is deterministic (no sleeps, no wall clock).

    use std::sync::Arc;
    use std::time::Duration;

    use cpu_ops::{ModelConfig, ModelKind};
    use gpu_ops::HostBackend;

    use super::super::device::{LayerEngine, LayerState};
    use super::*;
    use crate::clock::ManualClock;
    use crate::data::generate::{generate_sbm, SbmOptions};
    use crate::engine::{DeviceEngine, EngineOptions};

    const HOT: u32 = 400;
    const DIM: usize = 16;
    /// Room for 1,000 feature rows.
    const CACHE: usize = 1000 * DIM * 4;

    struct Rig {
        engine: LayerEngine<HostBackend>,
        ds: Arc<Dataset>,
        relabeling: Relabeling,
        clock: ManualClock,
        stats: OrchestrationStats,
        monitor: HybridMonitor,
        moves: Vec<(u64, Direction)>,
        /// The feature cache's budget, bytes.
        cache: usize,
    }

    /// A small cache of bfloat16 rows and a hot set with a small CPU share
    /// (what `policy = "auto"` chose on 2026-11-26 before `tandem train` exited
    /// with "invalid 'initial split'"): the monitor starts, keeps the CPU share,
    /// and counts rows at the bytes the device stores (2 per value).
    #[test]
    fn a_hot_set_larger_than_a_bf16_cache_starts_with_the_cpu_share() {
        let ds = Arc::new(
            generate_sbm(&SbmOptions {
                num_vertices: 4000,
                num_edges: 20_000,
                num_classes: 4,
                feature_dim: DIM,
                ..SbmOptions::default()
            })
            .unwrap(),
        );
        let model = ModelConfig {
            kind: ModelKind::Sage,
            in_dim: DIM,
            hidden: 8,
            num_classes: 4,
            num_layers: 2,
            heads: 1,
            dropout: 0.0,
        };
        // Room for 50 fp32 rows, i.e. 100 bfloat16 rows.
        let engine = DeviceEngine::new(
            HostBackend::new(),
            &ds,
            &model,
            EngineOptions {
                cache_bytes: 50 * DIM * 4,
                feature_dtype: gpu_ops::FeatureDtype::Bf16,
                ..EngineOptions::for_tests(vec![5, 5])
            },
        )
        .unwrap();
        let engine = LayerEngine::new(engine, LayerState::default());
        assert_eq!(engine.row_bytes(), (DIM * 2) as u64);
        let pipeline = PipelineConfig::new(2, 1, 256).unwrap();
        let split = HotSplit::new(HOT, 20).unwrap();
        let m =
            HybridMonitor::new(&engine, &ds, pipeline, split, 2, MonitorControl::Balance).unwrap();
        let s = m.split_for(0);
        assert_eq!(s.cpu(), 20, "{s:?}");
        assert!(s.cached() <= 100, "{s:?}");
    }

    fn rig() -> Rig {
        rig_with(CACHE, MonitorControl::Balance)
    }

    /// The rig with a cache of `cache` bytes and the monitor steering by `control`.
    fn rig_with(cache: usize, control: MonitorControl) -> Rig {
        let ds = Arc::new(
            generate_sbm(&SbmOptions {
                num_vertices: 4000,
                num_edges: 20_000,
                num_classes: 4,
                feature_dim: DIM,
                ..SbmOptions::default()
            })
            .unwrap(),
        );
        let model = ModelConfig {
            kind: ModelKind::Sage,
            in_dim: DIM,
            hidden: 8,
            num_classes: 4,
            num_layers: 2,
            heads: 1,
            dropout: 0.0,
        };
        let engine = DeviceEngine::new(
            HostBackend::new(),
            &ds,
            &model,
            EngineOptions {
                cache_bytes: cache,
                ..EngineOptions::for_tests(vec![5, 5])
            },
        )
        .unwrap();
        let engine = LayerEngine::new(engine, LayerState::default());
        let scores = scheduler::degree_scores(&ds.graph);
        let relabeling = Relabeling::by_score(&scores, HOT as f64 / 4000.0).unwrap();
        assert_eq!(relabeling.hot_count(), HOT);
        let pipeline = PipelineConfig::new(2, 1, 256).unwrap();
        let monitor =
            HybridMonitor::new(&engine, &ds, pipeline, HotSplit::all_cpu(HOT), 2, control).unwrap();
        Rig {
            engine,
            ds,
            relabeling,
            clock: ManualClock::new(),
            stats: OrchestrationStats::default(),
            monitor,
            moves: Vec::new(),
            cache,
        }
    }

    impl Rig {
        /// One epoch of `n` super-batches of 10 ms each in which the accelerator
        /// is blocked `wait_ms` per super-batch and the 2 CPU workers are busy
        /// `busy_ms` worker-milliseconds.
        fn epoch(&mut self, n: u64, wait_ms: f64, busy_ms: f64) {
            self.epoch_costs(n, |_, _| (10.0, wait_ms, busy_ms));
        }

        /// One epoch of `n` super-batches; super-batch `g` planned with CPU share
        /// `c` lasts `cost(c, g).0` ms, the accelerator waits `.1` ms of it and the
        /// CPU workers are busy `.2` worker-ms.
        fn epoch_costs(&mut self, n: u64, cost: impl Fn(u32, u64) -> (f64, f64, f64)) {
            let base = self.monitor.start_epoch(n);
            let tracer = Tracer::disabled();
            let track = tracer.declare_track("acc", crate::trace::TrackKind::Accelerator);
            for j in 0..n {
                self.monitor
                    .begin_super_batch(base + j, &mut self.engine, &self.relabeling)
                    .unwrap();
                let w = Window::open(&self.stats, &self.clock);
                let (ms, wait_ms, busy_ms) = cost(self.monitor.split_for(base + j).cpu(), base + j);
                self.clock.advance(Duration::from_secs_f64(ms * 1e-3));
                self.stats.wait_secs += wait_ms * 1e-3;
                self.stats.cpu_busy_secs += busy_ms * 1e-3;
                let before = (
                    self.stats.monitor_moves_to_cache,
                    self.stats.monitor_moves_to_cpu,
                );
                let end = SuperBatchEnd {
                    global: base + j,
                    local: j,
                    observe: j > 0 && j + 1 < n,
                    window: &w,
                    clock: &self.clock,
                    trace: (&tracer, track),
                };
                self.monitor
                    .end_super_batch(&end, &mut self.stats, &mut self.engine, &self.relabeling)
                    .unwrap();
                if self.stats.monitor_moves_to_cache > before.0 {
                    self.moves.push((base + j, Direction::ToCache));
                }
                if self.stats.monitor_moves_to_cpu > before.1 {
                    self.moves.push((base + j, Direction::ToCpu));
                }
                let cache = LayerDevice::cache_stats(&self.engine);
                assert!(cache.cached_bytes <= self.cache, "{cache:?}");
                let s = self.monitor.split_for(base + j + 1);
                assert!(
                    u64::from(s.cached()) * LayerDevice::row_bytes(&self.engine)
                        <= self.cache as u64,
                    "{s:?} does not fit the cache"
                );
            }
        }

        fn cpu_split(&self) -> u32 {
            self.monitor.split_for(self.monitor.next_super_batch).cpu()
        }

        fn reversals(&self) -> usize {
            self.moves.windows(2).filter(|w| w[0].1 != w[1].1).count()
        }
    }

    #[test]
    fn a_waiting_accelerator_moves_hot_vertices_to_the_cache_and_back_when_the_cpu_idles() {
        let mut r = rig();
        assert_eq!(r.cpu_split(), HOT);
        // The CPU is the bottleneck: the accelerator waits 40% of every window.
        r.epoch(12, 4.0, 20.0);
        let shed = r.cpu_split();
        assert!(shed < HOT, "no move to the cache: {:?}", r.moves);
        assert_eq!(r.moves[0].1, Direction::ToCache);
        // Within the first observed windows (warm-up and smoothing allow 3).
        assert!(
            r.moves[0].0 <= 3,
            "first move after super-batch {}",
            r.moves[0].0
        );
        assert!(r.stats.monitor_cached_rows > 0);
        assert!(
            r.monitor.cached_rows() as usize <= LayerDevice::cache_stats(&r.engine).cached_rows
        );
        // Then the CPU keeps up easily: no waits, 90% idle. Vertices come back.
        r.epoch(20, 0.0, 2.0);
        assert!(r.cpu_split() > shed, "no move back: {:?}", r.moves);
        assert!(r.moves.iter().any(|m| m.1 == Direction::ToCpu));
        let _ = &r.ds;
    }

    #[test]
    fn a_steady_load_settles_without_oscillating() {
        let mut r = rig();
        // A CPU moderately too slow, then exactly on time (waits within the dead
        // band, CPU busy): after the first corrections the split stays put.
        r.epoch(10, 2.0, 19.0);
        let settled_moves = r.moves.len();
        r.epoch(30, 0.05, 19.0);
        assert!(r.reversals() <= 2, "{:?}", r.moves);
        assert!(
            r.moves.len() <= settled_moves + 2,
            "still moving under a steady load: {:?}",
            r.moves
        );
    }

    #[test]
    fn a_late_cpu_under_compute_counts_as_lost_accelerator_time() {
        let mut r = rig();
        // `on_late = "compute"`: nothing waits, but half the hot rows the batches
        // read were late and computed by the accelerator. That is the signal.
        let base = r.monitor.start_epoch(8);
        let tracer = Tracer::disabled();
        let track = tracer.declare_track("acc", crate::trace::TrackKind::Accelerator);
        for j in 0..8 {
            r.monitor
                .begin_super_batch(base + j, &mut r.engine, &r.relabeling)
                .unwrap();
            let w = Window::open(&r.stats, &r.clock);
            r.clock.advance(Duration::from_millis(10));
            r.stats.protocol.hot_uses += 500;
            r.stats.protocol.computed_cold += 500;
            r.stats.cpu_busy_secs += 0.02;
            let end = SuperBatchEnd {
                global: base + j,
                local: j,
                observe: j > 0 && j + 1 < 8,
                window: &w,
                clock: &r.clock,
                trace: (&tracer, track),
            };
            r.monitor
                .end_super_batch(&end, &mut r.stats, &mut r.engine, &r.relabeling)
                .unwrap();
        }
        assert!(r.stats.monitor_moves_to_cache > 0, "{}", r.stats.summary());
        assert!(r.cpu_split() < HOT);
    }

    #[test]
    fn restoring_the_cache_gives_back_the_degree_order_it_was_loaded_with() {
        let mut r = rig();
        // Hot = the lowest degrees, so the monitor's rows are not filler already.
        let scores: Vec<u64> = scheduler::degree_scores(&r.ds.graph)
            .iter()
            .map(|&d| u64::MAX - d)
            .collect();
        r.relabeling = Relabeling::by_score(&scores, HOT as f64 / 4000.0).unwrap();
        let n = r.ds.num_vertices() as u32;
        let loaded: Vec<u32> = (0..n).filter(|&v| r.engine.engine.is_cached(v)).collect();
        assert!(!loaded.is_empty());
        // A CPU too slow: the monitor moves hot rows into the cache, displacing
        // filler rows.
        r.epoch(12, 4.0, 20.0);
        assert!(r.monitor.cached_rows() > 0, "no move: {:?}", r.moves);
        let moved: Vec<u32> = (0..n).filter(|&v| r.engine.engine.is_cached(v)).collect();
        assert_ne!(moved, loaded, "the moves changed nothing");
        let Rig {
            mut engine,
            monitor,
            ..
        } = r;
        monitor.restore_cache(&mut engine).unwrap();
        let restored: Vec<u32> = (0..n).filter(|&v| engine.engine.is_cached(v)).collect();
        assert_eq!(restored, loaded);
    }

    /// Time mode: the CPU share follows the measured time per super-batch.
    mod time {
        use super::*;
        use scheduler::SharePhase;

        /// Super-batch time (ms) when every CPU row costs more than the
        /// accelerator saves: 10 ms all-GPU, +0.05 ms per CPU row.
        fn expensive(c: u32, _: u64) -> (f64, f64, f64) {
            (10.0 + 0.05 * f64::from(c), 0.0, 0.02 * f64::from(c))
        }

        /// CPU rows pay until the CPU is the bottleneck at about 230 of 400:
        /// time = max(accelerator, CPU).
        fn cheap(c: u32, _: u64) -> (f64, f64, f64) {
            let c = f64::from(c);
            let (acc, cpu) = (20.0 - 0.04 * c, 5.0 + 0.025 * c);
            (acc.max(cpu), (cpu - acc).max(0.0), 2.0 * cpu)
        }

        fn settled(r: &Rig) -> bool {
            r.monitor.share().map(|s| s.phase()) == Some(SharePhase::Settled)
        }

        /// Epochs of 12 super-batches until the search settles (at most 40).
        fn until_settled(r: &mut Rig, cost: fn(u32, u64) -> (f64, f64, f64)) {
            for _ in 0..40 {
                if settled(r) {
                    return;
                }
                r.epoch_costs(12, cost);
            }
            panic!("not settled: {:?}", r.moves);
        }

        #[test]
        fn expensive_cpu_rows_go_to_zero_and_stay() {
            for cache in [CACHE, 0] {
                let mut r = rig_with(cache, MonitorControl::Time);
                assert_eq!(r.cpu_split(), HOT);
                until_settled(&mut r, expensive);
                assert_eq!(r.cpu_split(), 0, "cache {cache}: {:?}", r.moves);
                let moves = r.moves.len();
                for _ in 0..10 {
                    r.epoch_costs(12, expensive);
                }
                assert_eq!(r.cpu_split(), 0);
                assert_eq!(r.moves.len(), moves, "moved after settling: {:?}", r.moves);
                if cache == 0 {
                    // No cache room: the rows left the hot set, nothing was cached.
                    let s = r.monitor.split_for(r.monitor.next_super_batch);
                    assert_eq!((s.hot(), s.cached()), (0, 0), "{s:?}");
                    assert_eq!(LayerDevice::cache_stats(&r.engine).cached_rows, 0);
                }
            }
        }

        #[test]
        fn cheap_cpu_rows_grow_the_share_and_settle() {
            for cache in [CACHE, 0] {
                let mut r = rig_with(cache, MonitorControl::Time);
                // Start from all-GPU: the search grows the share.
                until_settled(&mut r, expensive);
                assert_eq!(r.cpu_split(), 0);
                // The costs change (a drift restarts the search).
                let moves = r.moves.len();
                r.epoch_costs(12, cheap);
                until_settled(&mut r, cheap);
                let c = r.cpu_split();
                assert!(
                    (f64::from(c) - 230.0).abs() <= 60.0,
                    "cache {cache}: settled at {c}: {:?}",
                    r.moves
                );
                assert!(r.moves.len() > moves);
                let at = r.moves.len();
                for _ in 0..10 {
                    r.epoch_costs(12, cheap);
                }
                assert_eq!(r.cpu_split(), c);
                assert_eq!(r.moves.len(), at, "moved after settling: {:?}", r.moves);
            }
        }

        #[test]
        fn noise_within_the_band_does_not_move_the_share() {
            let mut r = rig_with(CACHE, MonitorControl::Time);
            // A flat 10 ms ± 2% (the band is 5%), alternating per super-batch.
            let noisy = |_: u32, g: u64| (if g.is_multiple_of(2) { 10.2 } else { 9.8 }, 0.0, 5.0);
            for _ in 0..40 {
                r.epoch_costs(12, noisy);
            }
            assert!(settled(&r), "{:?}", r.moves);
            assert_eq!(r.cpu_split(), HOT, "the share moved: {:?}", r.moves);
            assert_eq!(r.monitor.share().map(|s| s.accepted()), Some(0));
            // Probes only while searching (each reverted), none after settling.
            let last = r.moves.last().map_or(0, |m| m.0);
            assert!(last < 12 * 15, "still probing at super-batch {last}");
        }
    }
}
