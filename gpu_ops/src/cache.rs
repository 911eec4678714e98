//! The feature-cache *policy* both backends share: which vertex rows sit in the
//! device cache, in which slot, and how often a gather found them there.
//!
//! A backend's cache store is `capacity_rows × dim` `f32`s of device memory (the host
//! backend lays out a host vector the same way); [`CachePolicy`] decides the slots and
//! the backend copies rows. The budget covers the rows only:
//! `capacity_rows = min(budget_bytes / (dim · 4), num_vertices)`, so a store never
//! holds more than `budget_bytes` of rows. The slot map (one `u32` per vertex, what a
//! device gather kernel reads) is bookkeeping outside the budget.
//!
//! # An update, step by step ([`CachePolicy::update`])
//! 1. Every id of `evict` and `insert` is checked against `num_vertices`; a bad id is
//!    an error and nothing changes.
//! 2. Each vertex of `evict` that is cached gives its slot back (the slot is listed in
//!    [`CacheUpdate::freed`]; its row needs no clearing). Others are ignored.
//! 3. Each vertex of `insert`, in order: already cached → counts as cached; else, if a
//!    slot is free (a freed one first, lowest-numbered fresh one otherwise) it takes
//!    it and `(vertex, slot)` is listed in [`CacheUpdate::filled`] — the backend must
//!    copy that row in; else it is left out. Rows are all the same size, so once the
//!    cache is full every later new vertex is left out too.
//!
//! Slots are handed out densely: the store only needs its first
//! [`CachePolicy::slots_used`] rows, a high-water mark that never exceeds
//! `capacity_rows`, so a backend may grow its store lazily and still stay inside the
//! budget.
//!
//! Hit and miss counters are atomic, so a gather through `&self` can count
//! ([`CachePolicy::record`]).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::CacheStats;
use crate::error::{GpuOpsError, Result};

/// The slot-map entry of a vertex that is not cached.
pub const NO_SLOT: u32 = u32::MAX;

/// Bytes of one `f32` feature value.
const F32_BYTES: usize = std::mem::size_of::<f32>();

/// What one [`CachePolicy::update`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheUpdate {
    /// Slots freed by evictions, in eviction order (a slot may be refilled below).
    pub freed: Vec<u32>,
    /// `(vertex, slot)` pairs whose rows the backend must copy into the store, in
    /// insertion order; slots are distinct.
    pub filled: Vec<(u32, u32)>,
    /// Entries of `insert` that are cached after the update (already cached ones and
    /// repeats included): what [`crate::FeatureStore::update_cache`] returns.
    pub cached: usize,
}

/// Which vertices are cached, in which slot, plus hit/miss counters (module doc).
#[derive(Debug)]
pub struct CachePolicy {
    dim: usize,
    /// Bytes of one stored value (4: `f32`, 2: bfloat16).
    value_bytes: usize,
    budget_bytes: usize,
    capacity_rows: usize,
    /// Per vertex: its slot, or [`NO_SLOT`].
    slot_of: Vec<u32>,
    /// Per slot below the high-water mark: its vertex, or [`NO_SLOT`] when free.
    vertex_of: Vec<u32>,
    /// Free slots below the high-water mark (a stack).
    free: Vec<u32>,
    cached_rows: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// A zeroed-or-filled `Vec` of `len` values, or `OutOfMemory` naming `what`.
fn try_vec(what: &str, len: usize, value: u32) -> Result<Vec<u32>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| GpuOpsError::OutOfMemory {
            what: what.to_string(),
            requested: len.saturating_mul(std::mem::size_of::<u32>()),
            available: 0,
        })?;
    v.resize(len, value);
    Ok(v)
}

impl CachePolicy {
    /// An empty cache for `num_vertices` rows of `dim` `f32`s with a byte budget.
    ///
    /// `capacity_rows = min(budget_bytes / (dim · 4), num_vertices)` (all vertices
    /// when `dim` is 0, as rows then take no bytes). Fails for more than `u32::MAX`
    /// vertices, a row size that overflows, or when the slot map cannot be allocated.
    pub fn new(num_vertices: usize, dim: usize, budget_bytes: usize) -> Result<Self> {
        Self::with_value_bytes(num_vertices, dim, F32_BYTES, budget_bytes)
    }

    /// The policy of `features` stored as `dtype` with `budget_bytes`, after
    /// checking the ids of `cached` (the rows to cache first).
    pub fn for_features(
        features: &cpu_ops::FeatureMatrix,
        dtype: crate::FeatureDtype,
        budget_bytes: usize,
        cached: &[u32],
    ) -> Result<Self> {
        let p = Self::with_value_bytes(
            features.num_rows(),
            features.dim(),
            dtype.value_bytes(),
            budget_bytes,
        )?;
        p.check_ids("cached", cached)?;
        Ok(p)
    }

    /// [`CachePolicy::new`] for rows of `dim` values of `value_bytes` bytes each
    /// (2 for bfloat16 rows): `capacity_rows = min(budget_bytes / (dim ·
    /// value_bytes), num_vertices)`.
    pub fn with_value_bytes(
        num_vertices: usize,
        dim: usize,
        value_bytes: usize,
        budget_bytes: usize,
    ) -> Result<Self> {
        if num_vertices > u32::MAX as usize {
            return Err(GpuOpsError::InvalidArgument {
                name: "num_vertices",
                reason: format!("{num_vertices} does not fit u32 vertex ids"),
            });
        }
        let row_bytes =
            dim.checked_mul(value_bytes)
                .ok_or_else(|| GpuOpsError::InvalidArgument {
                    name: "dim",
                    reason: format!("a row of {dim} values overflows usize bytes"),
                })?;
        let capacity_rows = match budget_bytes.checked_div(row_bytes) {
            Some(rows) => rows.min(num_vertices),
            None => num_vertices,
        };
        Ok(Self {
            dim,
            value_bytes,
            budget_bytes,
            capacity_rows,
            slot_of: try_vec("feature cache slot map", num_vertices, NO_SLOT)?,
            vertex_of: Vec::new(),
            free: Vec::new(),
            cached_rows: 0,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Number of vertices (length of the slot map).
    pub fn num_vertices(&self) -> usize {
        self.slot_of.len()
    }

    /// The byte budget of the rows.
    pub fn budget_bytes(&self) -> usize {
        self.budget_bytes
    }

    /// Bytes of one row (`dim · 4`, or `dim · 2` for bfloat16 rows).
    pub fn row_bytes(&self) -> usize {
        self.dim * self.value_bytes
    }

    /// The most rows the cache can hold.
    pub fn capacity_rows(&self) -> usize {
        self.capacity_rows
    }

    /// Rows cached now.
    pub fn cached_rows(&self) -> usize {
        self.cached_rows
    }

    /// Bytes the cached rows occupy (never above the budget).
    pub fn cached_bytes(&self) -> usize {
        self.cached_rows * self.row_bytes()
    }

    /// The high-water mark of slots handed out: the store needs rows `0..slots_used`
    /// (at most [`CachePolicy::capacity_rows`]).
    pub fn slots_used(&self) -> usize {
        self.vertex_of.len()
    }

    /// The slot of vertex `v`, or `None` when it is not cached (or not a vertex).
    #[inline]
    pub fn slot(&self, v: u32) -> Option<u32> {
        match self.slot_of.get(v as usize) {
            Some(&s) if s != NO_SLOT => Some(s),
            _ => None,
        }
    }

    /// Whether vertex `v` is cached.
    #[inline]
    pub fn is_cached(&self, v: u32) -> bool {
        self.slot(v).is_some()
    }

    /// The vertex in `slot`, or `None` when the slot is free or past the high-water mark.
    pub fn vertex_in_slot(&self, slot: u32) -> Option<u32> {
        match self.vertex_of.get(slot as usize) {
            Some(&v) if v != NO_SLOT => Some(v),
            _ => None,
        }
    }

    /// The slot map, one entry per vertex ([`NO_SLOT`] when not cached): what a
    /// device gather reads.
    pub fn slot_map(&self) -> &[u32] {
        &self.slot_of
    }

    /// Checks that every id of `ids` is a vertex; `name` is the argument's name.
    pub(crate) fn check_ids(&self, name: &'static str, ids: &[u32]) -> Result<()> {
        let n = self.slot_of.len();
        if let Some((i, &v)) = ids.iter().enumerate().find(|&(_, &v)| v as usize >= n) {
            return Err(GpuOpsError::InvalidArgument {
                name,
                reason: format!("entry {i} is vertex {v}, not below the {n} feature rows"),
            });
        }
        Ok(())
    }

    /// Evicts `evict`, then inserts `insert` in order while slots are free (the
    /// module doc's steps). On error nothing changes.
    pub fn update(&mut self, insert: &[u32], evict: &[u32]) -> Result<CacheUpdate> {
        self.check_ids("evict", evict)?;
        self.check_ids("insert", insert)?;
        let mut up = CacheUpdate::default();
        for &v in evict {
            let s = self.slot_of[v as usize];
            if s != NO_SLOT {
                self.slot_of[v as usize] = NO_SLOT;
                self.vertex_of[s as usize] = NO_SLOT;
                self.free.push(s);
                self.cached_rows -= 1;
                up.freed.push(s);
            }
        }
        for &v in insert {
            if self.slot_of[v as usize] != NO_SLOT {
                up.cached += 1;
                continue;
            }
            let s = if let Some(s) = self.free.pop() {
                self.vertex_of[s as usize] = v;
                s
            } else if self.vertex_of.len() < self.capacity_rows {
                // capacity_rows <= num_vertices <= u32::MAX, so the slot fits u32 and
                // is not NO_SLOT.
                let s = self.vertex_of.len() as u32;
                self.vertex_of.push(v);
                s
            } else {
                continue;
            };
            self.slot_of[v as usize] = s;
            self.cached_rows += 1;
            up.filled.push((v, s));
            up.cached += 1;
        }
        Ok(up)
    }

    /// Adds to the hit and miss counters (one gather's counts).
    pub fn record(&self, hits: u64, misses: u64) {
        self.hits.fetch_add(hits, Ordering::Relaxed);
        self.misses.fetch_add(misses, Ordering::Relaxed);
    }

    /// Counters since creation (or the last reset) and occupancy.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            cached_rows: self.cached_rows,
            cached_bytes: self.cached_bytes(),
            budget_bytes: self.budget_bytes,
        }
    }

    /// Zeroes the hit and miss counters.
    pub fn reset_stats(&self) {
        self.hits.store(0, Ordering::Relaxed);
        self.misses.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use cpu_ops::Rng;

    use super::*;

    /// Checks the policy's internal invariants against a plain model of the cached set.
    fn check_invariants(p: &CachePolicy, model: &HashSet<u32>) {
        assert!(p.cached_bytes() <= p.budget_bytes(), "over budget");
        assert!(p.slots_used() <= p.capacity_rows());
        assert_eq!(p.cached_rows(), model.len());
        let mut seen = HashSet::new();
        for v in 0..p.num_vertices() as u32 {
            match p.slot(v) {
                Some(s) => {
                    assert!(model.contains(&v), "vertex {v} cached but not in model");
                    assert!((s as usize) < p.slots_used());
                    assert_eq!(p.vertex_in_slot(s), Some(v));
                    assert!(seen.insert(s), "slot {s} used twice");
                }
                None => assert!(!model.contains(&v), "vertex {v} lost"),
            }
        }
        let free = (0..p.slots_used() as u32)
            .filter(|&s| p.vertex_in_slot(s).is_none())
            .count();
        assert_eq!(free + p.cached_rows(), p.slots_used());
    }

    #[test]
    fn capacity_follows_the_budget() {
        let p = CachePolicy::new(1000, 10, 400).unwrap();
        assert_eq!(p.capacity_rows(), 10);
        assert_eq!(p.row_bytes(), 40);
        let p = CachePolicy::new(1000, 10, 439).unwrap();
        assert_eq!(p.capacity_rows(), 10);
        let p = CachePolicy::new(5, 10, 1 << 20).unwrap();
        assert_eq!(p.capacity_rows(), 5, "never more rows than vertices");
        let p = CachePolicy::new(7, 0, 0).unwrap();
        assert_eq!(p.capacity_rows(), 7, "zero-width rows cost nothing");
        let p = CachePolicy::new(7, 3, 11).unwrap();
        assert_eq!(p.capacity_rows(), 0);
        assert!(matches!(
            CachePolicy::new(3, usize::MAX / 2, 10),
            Err(GpuOpsError::InvalidArgument { name: "dim", .. })
        ));
    }

    #[test]
    fn update_semantics_step_by_step() {
        let mut p = CachePolicy::new(10, 2, 3 * 8).unwrap();
        assert_eq!(p.capacity_rows(), 3);
        let up = p.update(&[4, 5, 4, 6, 7, 8], &[]).unwrap();
        assert_eq!(up.filled, vec![(4, 0), (5, 1), (6, 2)]);
        assert_eq!(up.cached, 4, "4, 5, the repeated 4, 6; 7 and 8 left out");
        assert!(up.freed.is_empty());
        // Evict 5 (slot 1) and 9 (not cached): slot 1 goes to 7; 6 already cached.
        let up = p.update(&[7, 6, 8], &[5, 9]).unwrap();
        assert_eq!(up.freed, vec![1]);
        assert_eq!(up.filled, vec![(7, 1)]);
        assert_eq!(up.cached, 2);
        assert_eq!(p.slot(7), Some(1));
        assert!(!p.is_cached(5) && !p.is_cached(8));
        assert_eq!(p.slot_map()[4], 0);
        assert_eq!(p.slot_map()[5], NO_SLOT);
        // Bad ids change nothing.
        let before: Vec<u32> = p.slot_map().to_vec();
        let err = p.update(&[1, 10], &[4]).unwrap_err();
        let named = matches!(&err, GpuOpsError::InvalidArgument { name: "insert", reason }
            if reason.contains("vertex 10"));
        assert!(named, "{err}");
        assert!(matches!(
            p.update(&[], &[11]),
            Err(GpuOpsError::InvalidArgument { name: "evict", .. })
        ));
        assert_eq!(p.slot_map(), &before[..]);
        assert_eq!(p.cached_rows(), 3);
    }

    #[test]
    fn random_updates_never_exceed_the_budget_and_match_a_model() {
        let mut rng = Rng::new(7);
        for case in 0..40 {
            let n = 1 + rng.below(300) as usize;
            let dim = 1 + rng.below(40) as usize;
            let budget = rng.below((n * dim * 4) as u64 + 1) as usize;
            let mut p = CachePolicy::new(n, dim, budget).unwrap();
            let mut model: HashSet<u32> = HashSet::new();
            // Contents of each slot as the backend would keep them.
            let mut store: HashMap<u32, u32> = HashMap::new();
            for _ in 0..30 {
                let ins: Vec<u32> = (0..rng.below(60))
                    .map(|_| rng.below(n as u64) as u32)
                    .collect();
                let ev: Vec<u32> = (0..rng.below(60))
                    .map(|_| rng.below(n as u64) as u32)
                    .collect();
                let up = p.update(&ins, &ev).unwrap();
                for v in &ev {
                    model.remove(v);
                }
                let mut cached = 0;
                for &v in &ins {
                    if model.contains(&v) {
                        cached += 1;
                    } else if model.len() < p.capacity_rows() {
                        model.insert(v);
                        cached += 1;
                    }
                }
                assert_eq!(up.cached, cached, "case {case}");
                let filled_slots: HashSet<u32> = up.filled.iter().map(|&(_, s)| s).collect();
                assert_eq!(filled_slots.len(), up.filled.len(), "filled slots distinct");
                for &(v, s) in &up.filled {
                    store.insert(s, v);
                }
                for v in 0..n as u32 {
                    if let Some(s) = p.slot(v) {
                        assert_eq!(store.get(&s), Some(&v), "slot {s} holds another row");
                    }
                }
                check_invariants(&p, &model);
            }
        }
    }

    #[test]
    fn counters_add_and_reset() {
        let mut p = CachePolicy::new(4, 1, 8).unwrap();
        p.update(&[0, 1], &[]).unwrap();
        p.record(3, 5);
        p.record(1, 0);
        let s = p.stats();
        assert_eq!((s.hits, s.misses), (4, 5));
        assert_eq!((s.cached_rows, s.cached_bytes, s.budget_bytes), (2, 8, 8));
        assert!((s.hit_rate() - 4.0 / 9.0).abs() < 1e-12);
        p.reset_stats();
        let s = p.stats();
        assert_eq!((s.hits, s.misses, s.cached_rows), (0, 0, 2));
    }
}
