//! What the protocol counts: per epoch ([`ProtocolStats`]) every reuse's gap,
//! and the late, waited, computed-cold, urgent, dropped and installed work (the
//! runtime's `OrchestrationStats` adds the driver's clock readings and the
//! monitor's counts to these); per super-batch ([`SuperBatchHot`]) what its hot
//! queue did.

use crate::staleness::GapHistogram;

/// The protocol's counts, for one epoch ([`super::Action::Finished`]) or summed
/// ([`ProtocolStats::merge`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProtocolStats {
    /// Gap (optimizer steps) of every reused row; by construction none exceeds
    /// the staleness bound.
    pub gaps: GapHistogram,
    /// Reused rows (= `gaps.total()`).
    pub hot_uses: u64,
    /// Late hot positions a batch waited for (`on_late = "wait"`), counted when
    /// its gate first blocked.
    pub waited: u64,
    /// Batches whose gate waited.
    pub wait_batches: u64,
    /// Late hot positions left cold (`on_late = "compute"`).
    pub computed_cold: u64,
    /// Urgent jobs queued (promotions and recomputations).
    pub urgent_jobs: u64,
    /// Of which recomputations of stale chunks.
    pub recomputations: u64,
    /// Publications (the epoch's reset included).
    pub publications: u64,
    /// Worker reports of computed chunks.
    pub jobs: u64,
    /// Rows those reports computed.
    pub rows_computed: u64,
    /// Regular jobs dropped unstarted.
    pub dropped_jobs: u64,
    /// Reports installed.
    pub installs: u64,
    /// Rows installed.
    pub rows_installed: u64,
    /// Reports discarded (their super-batch had finished, or the slab held rows
    /// as new).
    pub discarded: u64,
    /// Rows carried into a super-batch's slab from the hot-row store instead of
    /// computed again (reuse across super-batches).
    pub rows_carried: u64,
    /// Rows copied into the hot-row store after their install.
    pub rows_kept: u64,
}

impl ProtocolStats {
    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &ProtocolStats) {
        self.gaps.merge(&other.gaps);
        self.hot_uses += other.hot_uses;
        self.waited += other.waited;
        self.wait_batches += other.wait_batches;
        self.computed_cold += other.computed_cold;
        self.urgent_jobs += other.urgent_jobs;
        self.recomputations += other.recomputations;
        self.publications += other.publications;
        self.jobs += other.jobs;
        self.rows_computed += other.rows_computed;
        self.dropped_jobs += other.dropped_jobs;
        self.installs += other.installs;
        self.rows_installed += other.rows_installed;
        self.discarded += other.discarded;
        self.rows_carried += other.rows_carried;
        self.rows_kept += other.rows_kept;
    }

    /// Hot rows used per row computed (`None` when nothing was computed): how
    /// many batches each CPU-computed row served, within and across
    /// super-batches.
    pub fn uses_per_computed_row(&self) -> Option<f64> {
        (self.rows_computed > 0).then(|| self.hot_uses as f64 / self.rows_computed as f64)
    }

    /// One line: reuses and their gaps, rows computed and installed, late work.
    pub fn summary(&self) -> String {
        let max = self
            .gaps
            .max()
            .map_or_else(|| "-".into(), |m| m.to_string());
        let mean = self
            .gaps
            .mean()
            .map_or_else(|| "-".into(), |m| format!("{m:.2}"));
        let per_row = self
            .uses_per_computed_row()
            .map_or_else(|| "-".into(), |u| format!("{u:.2}"));
        format!(
            "hot: {} reused (gap max {max}, mean {mean}), {} rows computed, {} installed, \
             {} carried across super-batches, {per_row} uses per computed row, \
             {} waited ({} batches), {} computed cold, {} CPU jobs ({} urgent, {} recomputed, \
             {} dropped)",
            self.hot_uses,
            self.rows_computed,
            self.rows_installed,
            self.rows_carried,
            self.waited,
            self.wait_batches,
            self.computed_cold,
            self.jobs,
            self.urgent_jobs,
            self.recomputations,
            self.dropped_jobs
        )
    }
}

/// What a super-batch's hot queue did, reported with
/// [`Action::EndSuperBatch`](super::Action::EndSuperBatch): the trace's
/// per-super-batch record of reuse across super-batches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SuperBatchHot {
    /// Rows of its queue (its slab).
    pub queue_rows: u64,
    /// Of which carried from the store: computed for an earlier super-batch
    /// and fresh enough for every batch of this one that reads them.
    pub carried_rows: u64,
    /// Rows CPU jobs computed for it (reports handed in, installed or not).
    pub computed_rows: u64,
    /// Hot rows its batches used (positions that took a slab row).
    pub uses: u64,
}

impl SuperBatchHot {
    /// Uses per computed row (`None` when nothing was computed).
    pub fn uses_per_computed_row(&self) -> Option<f64> {
        (self.computed_rows > 0).then(|| self.uses as f64 / self.computed_rows as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_adds_every_count_and_summary_names_them() {
        let mut a = ProtocolStats::default();
        assert!(a.summary().contains("gap max -, mean -"), "{}", a.summary());
        a.gaps.record_n(2, 3);
        a.hot_uses = 3;
        a.waited = 1;
        a.jobs = 4;
        let mut b = a.clone();
        b.gaps.record(5);
        b.hot_uses = 4;
        b.urgent_jobs = 2;
        b.recomputations = 1;
        b.discarded = 6;
        a.merge(&b);
        assert_eq!(a.hot_uses, 7);
        assert_eq!(a.gaps.total(), 7);
        assert_eq!(a.gaps.max(), Some(5));
        assert_eq!((a.waited, a.jobs, a.urgent_jobs), (2, 8, 2));
        assert_eq!((a.recomputations, a.discarded), (1, 6));
        let s = a.summary();
        assert!(s.contains("7 reused (gap max 5"), "{s}");
        assert!(s.contains("2 urgent, 1 recomputed"), "{s}");
    }
}
