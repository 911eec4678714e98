//! The split-independent part of planning a launched super-batch (protocol
//! step 3), as a value the driver may compute off the accelerator thread and
//! hand in with [`Event::Planned`](super::Event::Planned).
//!
//! Planning a queue takes the batches' bottom destinations, keeps the CPU-hot
//! ones (ids below the split's `cpu`) that are not a batch's own seeds,
//! deduplicates them in id order (= hotness order) and finds each position's
//! queue index. Every step but the cut at `cpu` is independent of the split,
//! and the cut of a sorted list at `cpu` is a prefix: a [`LaunchPlan`] made for
//! every id below `limit` serves any split with `cpu <= limit`, and the queue
//! index of a vertex is its index in the plan's `union`, whatever the cut. So
//! the protocol still plans with the split the driver answers (the monitor's,
//! decided late), and only the linear cut runs when the answer comes.

/// One batch of a launched super-batch, as the driver sampled it (protocol
/// step 3).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaunchedBatch {
    /// The batch's seed count: the first `seeds` bottom destinations are its own
    /// seeds and never take a hot row.
    pub seeds: usize,
    /// Its bottom layer's destinations (relabeled ids), in position order.
    pub bottom: Vec<u32>,
}

/// A launched super-batch planned for every split whose CPU part is at most
/// [`LaunchPlan::limit`]: the protocol cuts it at the split it is answered
/// with ([`Event::Planned`](super::Event::Planned)); [`Event::Launched`](super::Event::Launched)
/// builds one inline. Pure: the same batches give the same plan on any thread.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaunchPlan {
    /// Ids at or above it were left out: the plan serves splits with `cpu <=
    /// limit`.
    limit: u32,
    /// The batches' bottom destinations below `limit`, their own seeds
    /// excluded, deduplicated, ascending (the queue of the split `cpu =
    /// limit`; any smaller split's queue is a prefix).
    union: Vec<u32>,
    /// Per batch, in position order: (position among its bottom destinations,
    /// index in `union`) of each non-seed destination below `limit`.
    entries: Vec<Vec<(u32, u32)>>,
}

/// Below this many ids per planned position a dense index is used instead of
/// a binary search (a scratch array of `limit` entries, O(1) per position).
const DENSE_IDS_PER_POSITION: usize = 16;

impl LaunchPlan {
    /// Plans `batches` (in order; each one's first `seeds` destinations are its
    /// own seeds and never take a hot row) for every split with `cpu <= limit`.
    pub fn new(batches: &[LaunchedBatch], limit: u32) -> Self {
        let below = |v: &u32| *v < limit;
        let mut union: Vec<u32> = batches
            .iter()
            .flat_map(|b| b.bottom.iter().skip(b.seeds).filter(|v| below(v)))
            .copied()
            .collect();
        let positions = union.len();
        let index = |union: &[u32], v: u32| -> u32 {
            // Present by construction.
            union.binary_search(&v).unwrap_or_else(|i| i) as u32
        };
        let dense = (limit as usize) <= positions.saturating_mul(DENSE_IDS_PER_POSITION);
        let entries = if dense {
            // A marker per id, then the marked ids in order: the union sorted
            // without a sort, and a direct index per position.
            let mut slot = vec![u32::MAX; limit as usize];
            for &v in &union {
                slot[v as usize] = 0;
            }
            union.clear();
            for (v, s) in slot.iter_mut().enumerate() {
                if *s == 0 {
                    *s = union.len() as u32;
                    union.push(v as u32);
                }
            }
            Self::entries(batches, limit, |v| slot[v as usize])
        } else {
            union.sort_unstable();
            union.dedup();
            Self::entries(batches, limit, |v| index(&union, v))
        };
        Self {
            limit,
            union,
            entries,
        }
    }

    fn entries(
        batches: &[LaunchedBatch],
        limit: u32,
        index: impl Fn(u32) -> u32,
    ) -> Vec<Vec<(u32, u32)>> {
        batches
            .iter()
            .map(|b| {
                b.bottom
                    .iter()
                    .enumerate()
                    .skip(b.seeds)
                    .filter(|&(_, &v)| v < limit)
                    .map(|(p, &v)| (p as u32, index(v)))
                    .collect()
            })
            .collect()
    }

    /// The largest split (`cpu`) it serves.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Batches planned.
    pub fn batches(&self) -> usize {
        self.entries.len()
    }

    /// Distinct planned vertices (the queue of the split `cpu = limit`).
    pub fn union(&self) -> &[u32] {
        &self.union
    }

    /// Batch `i`'s (position, index in [`LaunchPlan::union`]) pairs, in
    /// position order.
    pub fn entries_of(&self, i: usize) -> &[(u32, u32)] {
        self.entries.get(i).map_or(&[], Vec::as_slice)
    }

    /// The queue's length under split `cpu` (`cpu <= limit`): the union's
    /// ids below `cpu`.
    pub fn queue_len(&self, cpu: u32) -> usize {
        self.union.partition_point(|&v| v < cpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_and_searched_plans_agree() {
        let batches = vec![
            LaunchedBatch {
                seeds: 1,
                bottom: vec![2, 5, 0, 7, 20, 5],
            },
            LaunchedBatch {
                seeds: 2,
                bottom: vec![0, 3, 5, 9, 3],
            },
        ];
        // Limit 10: 7 positions × 16 > 10 → dense; limit 1000 → searched.
        let dense = LaunchPlan::new(&batches, 10);
        assert_eq!(dense.union(), &[0, 3, 5, 7, 9]);
        assert_eq!(dense.entries_of(0), &[(1, 2), (2, 0), (3, 3), (5, 2)]);
        assert_eq!(dense.entries_of(1), &[(2, 2), (3, 4), (4, 1)]);
        let searched = LaunchPlan::new(&batches, 1000);
        assert_eq!(searched.union(), &[0, 3, 5, 7, 9, 20]);
        let cut: Vec<(u32, u32)> = searched
            .entries_of(0)
            .iter()
            .copied()
            .filter(|&(_, q)| (q as usize) < searched.queue_len(10))
            .collect();
        assert_eq!(cut, dense.entries_of(0));
        assert_eq!(dense.queue_len(6), 3);
        assert_eq!(LaunchPlan::new(&[], 5).batches(), 0);
    }
}
