//! The versioned hot-embedding table: per hot vertex (relabeled id below the hot
//! count), layer 0's output row and the weight version it was computed with.
//!
//! # Protocol
//! 1. Rows live in [`SHARDS`] shards (vertex `v` in shard `v % SHARDS`, slot
//!    `v / SHARDS`), each behind its own `RwLock`, so CPU workers writing different
//!    chunks and the accelerator thread reading a batch's rows rarely contend.
//! 2. A row and its version change together, under the shard's write lock; a
//!    reader sees both under the read lock, so a row is never read half-written or
//!    with another version's stamp.
//! 3. A slot only moves to newer versions ([`HotTable::write`] ignores an older
//!    one): an urgent recomputation and a slower regular chunk may race; the newer
//!    wins whatever the order.
//! 4. Every batch of writes bumps a generation counter and wakes the waiters
//!    ([`HotTable::wait_for_change`]); waits also return on a timeout so the waiter
//!    can check the pipeline's abort flag.
//! 5. `pending[v]` is the version of a CPU task computing `v` right now (or none):
//!    the accelerator waits for such a task when its version is within the bound
//!    instead of asking for an urgent recomputation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, RwLock};
use std::time::Duration;

/// Number of lock shards.
pub const SHARDS: usize = 64;

/// "No version": the slot was never written / no task is computing it.
const NONE: u64 = u64::MAX;

struct Shard {
    rows: Vec<f32>,
    versions: Vec<u64>,
}

/// Rows and versions of the hot vertices' bottom-layer embeddings.
pub struct HotTable {
    dim: usize,
    len: usize,
    shards: Vec<RwLock<Shard>>,
    pending: Vec<AtomicU64>,
    generation: Mutex<u64>,
    changed: Condvar,
}

impl HotTable {
    /// An empty table for `len` hot vertices with rows of `dim` values.
    pub fn new(len: usize, dim: usize) -> Self {
        let shards = (0..SHARDS)
            .map(|s| {
                let slots = len.saturating_sub(s).div_ceil(SHARDS);
                RwLock::new(Shard {
                    rows: vec![0.0; slots * dim],
                    versions: vec![NONE; slots],
                })
            })
            .collect();
        Self {
            dim,
            len,
            shards,
            pending: (0..len).map(|_| AtomicU64::new(NONE)).collect(),
            generation: Mutex::new(0),
            changed: Condvar::new(),
        }
    }

    /// Hot vertices the table holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the table holds no vertex.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Row width.
    pub fn dim(&self) -> usize {
        self.dim
    }

    fn locate(&self, v: u32) -> Option<(usize, usize)> {
        let v = v as usize;
        (v < self.len).then_some((v % SHARDS, v / SHARDS))
    }

    /// The version of `v`'s row, if any (step 2).
    pub fn version(&self, v: u32) -> Option<u64> {
        let (s, slot) = self.locate(v)?;
        let shard = self.shards[s].read().unwrap_or_else(|p| p.into_inner());
        Some(shard.versions[slot]).filter(|&e| e != NONE)
    }

    /// Appends `v`'s row to `out` and returns its version, or returns `None`
    /// (nothing appended) when the slot is empty or `v` is not hot.
    pub fn read_into(&self, v: u32, out: &mut Vec<f32>) -> Option<u64> {
        let (s, slot) = self.locate(v)?;
        let shard = self.shards[s].read().unwrap_or_else(|p| p.into_inner());
        let e = shard.versions[slot];
        if e == NONE {
            return None;
        }
        out.extend_from_slice(&shard.rows[slot * self.dim..(slot + 1) * self.dim]);
        Some(e)
    }

    /// Writes the rows of `ids` (`ids.len() × dim` values) stamped `version`,
    /// skipping slots that already hold a newer version (step 3), then wakes the
    /// waiters (step 4). Ids past the table are ignored. Returns the rows written.
    pub fn write(&self, ids: &[u32], rows: &[f32], version: u64) -> usize {
        let mut written = 0;
        for (i, &v) in ids.iter().enumerate() {
            let Some((s, slot)) = self.locate(v) else {
                continue;
            };
            let Some(row) = rows.get(i * self.dim..(i + 1) * self.dim) else {
                break;
            };
            let mut shard = self.shards[s].write().unwrap_or_else(|p| p.into_inner());
            let old = shard.versions[slot];
            if old != NONE && old > version {
                continue;
            }
            shard.rows[slot * self.dim..(slot + 1) * self.dim].copy_from_slice(row);
            shard.versions[slot] = version;
            written += 1;
        }
        self.bump();
        written
    }

    /// Marks `ids` as being computed at `version` (`None`: no longer) (step 5).
    pub fn set_pending(&self, ids: &[u32], version: Option<u64>) {
        let e = version.unwrap_or(NONE);
        for &v in ids {
            if let Some(p) = self.pending.get(v as usize) {
                p.store(e, Ordering::Release);
            }
        }
        if version.is_none() {
            self.bump();
        }
    }

    /// The version of a task computing `v` now, if any.
    pub fn pending(&self, v: u32) -> Option<u64> {
        let e = self.pending.get(v as usize)?.load(Ordering::Acquire);
        (e != NONE).then_some(e)
    }

    /// The current generation (changes after every write batch).
    pub fn generation(&self) -> u64 {
        *self.generation.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes every waiter (e.g. on abort).
    pub fn bump(&self) {
        let mut g = self.generation.lock().unwrap_or_else(|p| p.into_inner());
        *g += 1;
        self.changed.notify_all();
    }

    /// Blocks until the generation differs from `seen` or `timeout` passes;
    /// returns the generation.
    pub fn wait_for_change(&self, seen: u64, timeout: Duration) -> u64 {
        let g = self.generation.lock().unwrap_or_else(|p| p.into_inner());
        let (g, _) = self
            .changed
            .wait_timeout_while(g, timeout, |g| *g == seen)
            .unwrap_or_else(|p| p.into_inner());
        *g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_versions_round_trip_and_only_move_forward() {
        let t = HotTable::new(130, 3);
        assert_eq!(t.version(5), None);
        let mut out = Vec::new();
        assert_eq!(t.read_into(5, &mut out), None);
        assert!(out.is_empty());
        assert_eq!(
            t.write(&[5, 129, 200], &[1., 2., 3., 4., 5., 6., 7., 8., 9.], 4),
            2
        );
        assert_eq!(t.read_into(129, &mut out), Some(4));
        assert_eq!(out, vec![4., 5., 6.]);
        // Older versions never overwrite newer ones.
        assert_eq!(t.write(&[5], &[0., 0., 0.], 3), 0);
        out.clear();
        assert_eq!(t.read_into(5, &mut out), Some(4));
        assert_eq!(out, vec![1., 2., 3.]);
        assert_eq!(t.write(&[5], &[9., 9., 9.], 6), 1);
        assert_eq!(t.version(5), Some(6));
        assert_eq!(t.version(200), None);
    }

    #[test]
    fn pending_marks_and_waiters_wake() {
        let t = std::sync::Arc::new(HotTable::new(10, 1));
        t.set_pending(&[1, 2], Some(7));
        assert_eq!(t.pending(2), Some(7));
        let g = t.generation();
        let t2 = std::sync::Arc::clone(&t);
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            t2.write(&[1], &[1.0], 7);
            t2.set_pending(&[1, 2], None);
        });
        let g2 = t.wait_for_change(g, Duration::from_secs(5));
        assert_ne!(g2, g);
        h.join().unwrap();
        assert_eq!(t.pending(2), None);
        assert_eq!(t.version(1), Some(7));
    }
}
