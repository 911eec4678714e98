//! What the layer-based pipeline did: staleness gaps, waits, CPU work, the
//! monitor's moves ([`OrchestrationStats`]), summed per epoch and over a run.

use scheduler::GapHistogram;

/// What orchestration did, summed over the epochs it ran.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OrchestrationStats {
    /// Gap (optimizer steps) of every reused embedding.
    pub gaps: GapHistogram,
    /// Reused embeddings (= `gaps.total()`).
    pub hot_uses: u64,
    /// Late hot vertices a batch waited for (`on_late = "wait"`).
    pub waited: u64,
    /// Batches that waited.
    pub wait_batches: u64,
    /// Seconds the accelerator thread spent waiting for hot rows.
    pub wait_secs: f64,
    /// Late hot vertices left to the accelerator (`on_late = "compute"`).
    pub computed_cold: u64,
    /// Urgent CPU jobs sent by waiting batches.
    pub urgent_jobs: u64,
    /// CPU jobs computed (regular and urgent).
    pub jobs: u64,
    /// Regular jobs dropped because every batch of their super-batch had passed.
    pub dropped_jobs: u64,
    /// Hot rows computed by the CPU.
    pub rows_computed: u64,
    /// Hot rows uploaded to the device (once per computed chunk of a live
    /// super-batch).
    pub rows_installed: u64,
    /// Worker-seconds spent computing hot rows.
    pub cpu_busy_secs: f64,
    /// Hot vertices (relabeled ids below this are hot).
    pub hot_count: u32,
    /// Whether the hybrid monitor ran (`orchestration.monitor`).
    pub monitor: bool,
    /// Monitor moves of hot vertices to the device cache.
    pub monitor_moves_to_cache: u64,
    /// Monitor moves of hot vertices back to the CPU.
    pub monitor_moves_to_cpu: u64,
    /// Vertices the monitor moved to the cache (only rows the cache took count).
    pub monitor_rows_to_cache: u64,
    /// Vertices the monitor moved back to the CPU.
    pub monitor_rows_to_cpu: u64,
    /// Rows the monitor's moves held in the device cache at the end.
    pub monitor_cached_rows: u64,
    /// Moves against the previous move's direction.
    pub monitor_reversals: u64,
}

impl OrchestrationStats {
    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &OrchestrationStats) {
        self.gaps.merge(&other.gaps);
        self.hot_uses += other.hot_uses;
        self.waited += other.waited;
        self.wait_batches += other.wait_batches;
        self.wait_secs += other.wait_secs;
        self.computed_cold += other.computed_cold;
        self.urgent_jobs += other.urgent_jobs;
        self.jobs += other.jobs;
        self.dropped_jobs += other.dropped_jobs;
        self.rows_computed += other.rows_computed;
        self.rows_installed += other.rows_installed;
        self.cpu_busy_secs += other.cpu_busy_secs;
        self.hot_count = self.hot_count.max(other.hot_count);
        self.monitor |= other.monitor;
        self.monitor_moves_to_cache += other.monitor_moves_to_cache;
        self.monitor_moves_to_cpu += other.monitor_moves_to_cpu;
        self.monitor_rows_to_cache += other.monitor_rows_to_cache;
        self.monitor_rows_to_cpu += other.monitor_rows_to_cpu;
        if other.monitor {
            self.monitor_cached_rows = other.monitor_cached_rows;
        }
        self.monitor_reversals += other.monitor_reversals;
    }

    /// One line: gap max/mean, uses, waits, computed-cold, CPU jobs, and the
    /// monitor's moves when it ran.
    pub fn summary(&self) -> String {
        let max = self
            .gaps
            .max()
            .map_or_else(|| "-".into(), |m| m.to_string());
        let mean = self
            .gaps
            .mean()
            .map_or_else(|| "-".into(), |m| format!("{m:.2}"));
        let mut line = format!(
            "hot: {} reused (gap max {max}, mean {mean}), {} rows computed, {} installed, {} waited ({:.3} s), {} computed cold, {} CPU jobs ({} urgent, {} dropped)",
            self.hot_uses,
            self.rows_computed,
            self.rows_installed,
            self.waited,
            self.wait_secs,
            self.computed_cold,
            self.jobs,
            self.urgent_jobs,
            self.dropped_jobs
        );
        if self.monitor {
            line.push_str(&format!(
                "; monitor: {} moves to cache ({} rows), {} to CPU ({} rows), {} rows cached, {} reversals",
                self.monitor_moves_to_cache,
                self.monitor_rows_to_cache,
                self.monitor_moves_to_cpu,
                self.monitor_rows_to_cpu,
                self.monitor_cached_rows,
                self.monitor_reversals
            ));
        }
        line
    }
}
