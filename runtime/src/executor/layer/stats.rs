//! What the layer-based pipeline did: the protocol's counts
//! ([`scheduler::ProtocolStats`]: staleness gaps, waits, cold and CPU work) with
//! the driver's clock readings and the monitor's moves ([`OrchestrationStats`]),
//! per epoch and summed over a run.

use scheduler::ProtocolStats;

/// What orchestration did, summed over the epochs it ran.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OrchestrationStats {
    /// What the protocol counted: every reuse's gap, late, waited, computed-cold,
    /// urgent, dropped, computed and installed work.
    pub protocol: ProtocolStats,
    /// Seconds the accelerator thread spent waiting for hot rows.
    pub wait_secs: f64,
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
    /// Batches trained from a bottom hop sampled a super-batch ahead
    /// (`device.sample_ahead`, `executor/layer/device/` step 1b).
    pub bottoms_ahead: u64,
    /// Batches whose bottom hop sampled ahead skipped other positions than
    /// they trained with (late chunks left cold), sampled again at train time.
    pub bottoms_resampled: u64,
}

impl OrchestrationStats {
    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &OrchestrationStats) {
        self.protocol.merge(&other.protocol);
        self.wait_secs += other.wait_secs;
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
        self.bottoms_ahead += other.bottoms_ahead;
        self.bottoms_resampled += other.bottoms_resampled;
    }

    /// One line: the protocol's counts ([`ProtocolStats::summary`]), the time
    /// waited and the CPU's busy time, and the monitor's moves when it ran.
    pub fn summary(&self) -> String {
        let mut line = format!(
            "{}; {:.3} s waited, {:.3} CPU worker-s",
            self.protocol.summary(),
            self.wait_secs,
            self.cpu_busy_secs
        );
        if self.bottoms_ahead + self.bottoms_resampled > 0 {
            line.push_str(&format!(
                "; bottom hops: {} sampled ahead, {} resampled",
                self.bottoms_ahead, self.bottoms_resampled
            ));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_adds_the_protocol_counts_and_the_clock_readings() {
        let mut a = OrchestrationStats {
            wait_secs: 0.5,
            hot_count: 10,
            ..OrchestrationStats::default()
        };
        a.protocol.gaps.record(2);
        a.protocol.hot_uses = 1;
        let mut b = a.clone();
        b.cpu_busy_secs = 2.0;
        b.monitor = true;
        b.monitor_cached_rows = 7;
        a.merge(&b);
        assert_eq!((a.protocol.hot_uses, a.protocol.gaps.total()), (2, 2));
        assert_eq!((a.wait_secs, a.cpu_busy_secs), (1.0, 2.0));
        assert_eq!((a.hot_count, a.monitor_cached_rows), (10, 7));
        let s = a.summary();
        assert!(s.contains("2 reused (gap max 2"), "{s}");
        assert!(s.contains("1.000 s waited, 2.000 CPU worker-s"), "{s}");
        assert!(s.contains("monitor: 0 moves to cache"), "{s}");
    }
}
