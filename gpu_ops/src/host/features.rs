//! Host-backend features and row movement: the feature cache laid out as on a device
//! (a store of `slots_used × dim` rows that never exceeds the byte budget, in front of
//! the host [`FeatureMatrix`]), the counting gather through it, and the row
//! selection ops [`crate::Backend::index_select_rows`] /
//! [`crate::Backend::index_put_rows`].
//!
//! The store is real memory, not a flag: a hit copies from the store, a miss from the
//! matrix, so budget accounting and hit/miss counts mean on the host what they mean
//! on a GPU (and the monitor can be tested here).

use std::sync::Arc;

use cpu_ops::FeatureMatrix;
use rayon::prelude::*;

use crate::cache::{CachePolicy, NO_SLOT};
use crate::error::{GpuOpsError, Result};
use crate::host::buffer::{mul, prefix, prefix_mut};

/// Output bytes per rayon task of a gather or row selection.
const TASK_BYTES: usize = 64 * 1024;

/// How many rows ahead of the copy a gather prefetches.
const PREFETCH_ROWS: usize = 8;
/// Bytes prefetched at the start of a row (the hardware prefetcher follows the rest).
const PREFETCH_MAX_BYTES: usize = 1024;

/// Asks the CPU to start loading the first lines of `row` (a no-op off x86-64).
#[inline(always)]
fn prefetch_row(row: &[f32]) {
    const LINE_FLOATS: usize = 64 / std::mem::size_of::<f32>();
    let head = row
        .len()
        .min(PREFETCH_MAX_BYTES / std::mem::size_of::<f32>());
    for line in row[..head].iter().step_by(LINE_FLOATS) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            // SAFETY: a prefetch is a hint that never faults and changes no state the
            // program can see; the pointer comes from a live reference anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>((line as *const f32).cast::<i8>()) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = line;
    }
}

/// Rows per rayon task for rows of `dim` `f32`s.
fn rows_per_task(dim: usize) -> usize {
    (TASK_BYTES / (dim.max(1) * std::mem::size_of::<f32>())).max(1)
}

/// Features on the host backend: the host matrix and a row cache with a byte budget.
#[derive(Debug)]
pub struct HostFeatures {
    matrix: Arc<FeatureMatrix>,
    policy: CachePolicy,
    /// Rows `0..policy.slots_used()`, slot `s` at `s * dim`; its capacity (the bytes
    /// it owns) stays within the budget.
    store: Vec<f32>,
}

impl HostFeatures {
    /// [`crate::Backend::load_features`]: clones `features` (an `Arc` clone of the map
    /// for a memory-mapped matrix, a copy for an owned one) and caches the rows of
    /// `cached`, in order, while the budget allows.
    pub(crate) fn load(
        features: &FeatureMatrix,
        cached: &[u32],
        budget_bytes: usize,
    ) -> Result<Self> {
        let policy = CachePolicy::new(features.num_rows(), features.dim(), budget_bytes)?;
        policy.check_ids("cached", cached)?;
        let mut f = Self {
            matrix: Arc::new(features.clone()),
            policy,
            store: Vec::new(),
        };
        f.update(cached, &[])?;
        Ok(f)
    }

    /// The host matrix.
    pub fn matrix(&self) -> &FeatureMatrix {
        &self.matrix
    }

    /// The cache policy (slot map, occupancy, counters).
    pub fn policy(&self) -> &CachePolicy {
        &self.policy
    }

    /// Bytes the cache store has allocated (never above the budget).
    pub fn store_bytes(&self) -> usize {
        self.store.capacity() * std::mem::size_of::<f32>()
    }

    /// Makes room in the store for up to `extra` more slots (capped at the capacity),
    /// before the policy changes, so a failed allocation changes nothing. Grows
    /// geometrically but never past `capacity_rows × dim` values.
    fn reserve(&mut self, extra: usize) -> Result<()> {
        let dim = self.policy.dim();
        let cap_rows = self.policy.capacity_rows();
        let need_rows = self.policy.slots_used().saturating_add(extra).min(cap_rows);
        if need_rows * dim <= self.store.capacity() {
            return Ok(());
        }
        let rows_now = self.store.capacity() / dim;
        let target = need_rows.max(rows_now.saturating_mul(2)).min(cap_rows) * dim;
        self.store
            .try_reserve_exact(target - self.store.len())
            .map_err(|_| GpuOpsError::OutOfMemory {
                what: "host feature cache store".into(),
                requested: target * std::mem::size_of::<f32>(),
                available: self.policy.budget_bytes(),
            })
    }

    /// [`crate::Backend::update_cache`]: evict, insert, copy the new rows in.
    pub(crate) fn update(&mut self, insert: &[u32], evict: &[u32]) -> Result<usize> {
        // Validate first, so a bad id leaves the store untouched too.
        self.policy.check_ids("evict", evict)?;
        self.policy.check_ids("insert", insert)?;
        self.reserve(insert.len())?;
        let up = self.policy.update(insert, evict)?;
        let dim = self.policy.dim();
        // Within the reservation: no reallocation, the budget holds.
        self.store.resize(self.policy.slots_used() * dim, 0.0);
        if dim == 0 || up.filled.is_empty() {
            return Ok(up.cached);
        }
        let first = up.filled[0].1 as usize;
        let consecutive = up
            .filled
            .iter()
            .enumerate()
            .all(|(i, &(_, s))| s as usize == first + i);
        if consecutive {
            // Fresh slots in a run (the initial load): one parallel gather.
            let ids: Vec<u32> = up.filled.iter().map(|&(v, _)| v).collect();
            let rows = &mut self.store[first * dim..(first + ids.len()) * dim];
            cpu_ops::gather_rows(&self.matrix, &ids, rows)?;
        } else {
            for &(v, s) in &up.filled {
                let s = s as usize;
                self.store[s * dim..(s + 1) * dim].copy_from_slice(self.matrix.row(v as usize));
            }
        }
        Ok(up.cached)
    }

    /// [`crate::Backend::gather`]: `out[r] = features[ids[r]]` for `r < n`, from the
    /// store on a hit and from the matrix on a miss; counts both (only when every id
    /// is valid).
    pub(crate) fn gather(&self, ids: &[u32], n: usize, out: &mut [f32]) -> Result<()> {
        let dim = self.policy.dim();
        let ids = prefix("gather ids", ids, n)?;
        let out = prefix_mut("gather output (n × dim)", out, mul("n × dim", n, dim)?)?;
        let num_rows = self.matrix.num_rows();
        let bad = |r: usize, v: u32| GpuOpsError::InvalidArgument {
            name: "ids",
            reason: format!("id {v} at position {r} is not below the {num_rows} feature rows"),
        };
        let per_task = rows_per_task(dim);
        let hits: u64 = if dim == 0 {
            let mut hits = 0;
            for (r, &v) in ids.iter().enumerate() {
                if v as usize >= num_rows {
                    return Err(bad(r, v));
                }
                hits += u64::from(self.policy.is_cached(v));
            }
            hits
        } else {
            let (src, store, slots) = (self.matrix.as_slice(), &self.store, self.policy.slot_map());
            out.par_chunks_mut(per_task * dim)
                .zip(ids.par_chunks(per_task))
                .enumerate()
                .map(|(t, (out, ids))| -> Result<u64> {
                    // 1. Resolve every row's source first: the slot-map loads are
                    //    independent, so they overlap.
                    let mut rows: Vec<&[f32]> = Vec::with_capacity(ids.len());
                    let mut hits = 0u64;
                    for (i, &v) in ids.iter().enumerate() {
                        let Some(&slot) = slots.get(v as usize) else {
                            return Err(bad(t * per_task + i, v));
                        };
                        rows.push(if slot == NO_SLOT {
                            &src[v as usize * dim..(v as usize + 1) * dim]
                        } else {
                            hits += 1;
                            &store[slot as usize * dim..(slot as usize + 1) * dim]
                        });
                    }
                    // 2. Copy, with the rows a few ahead already on their way.
                    for r in rows.iter().take(PREFETCH_ROWS) {
                        prefetch_row(r);
                    }
                    for (i, (o, r)) in out.chunks_exact_mut(dim).zip(&rows).enumerate() {
                        if let Some(ahead) = rows.get(i + PREFETCH_ROWS) {
                            prefetch_row(ahead);
                        }
                        o.copy_from_slice(r);
                    }
                    Ok(hits)
                })
                .try_reduce(|| 0, |a, b| Ok(a + b))?
        };
        self.policy.record(hits, n as u64 - hits);
        Ok(())
    }
}

/// Rows of width `dim` in a buffer of `len` values.
fn rows_of(len: usize, dim: usize) -> usize {
    len.checked_div(dim).unwrap_or(0)
}

/// [`crate::Backend::index_select_rows`]: `out[r] = src[idx[r]]` for `r < n`.
pub(crate) fn index_select_rows(
    src: &[f32],
    dim: usize,
    idx: &[u32],
    n: usize,
    out: &mut [f32],
) -> Result<()> {
    let idx = prefix("index_select_rows idx", idx, n)?;
    let out = prefix_mut(
        "index_select_rows output (n × dim)",
        out,
        mul("n × dim", n, dim)?,
    )?;
    if dim == 0 {
        return Ok(());
    }
    let src_rows = rows_of(src.len(), dim);
    if let Some((r, &i)) = idx
        .iter()
        .enumerate()
        .find(|&(_, &i)| i as usize >= src_rows)
    {
        return Err(GpuOpsError::InvalidArgument {
            name: "idx",
            reason: format!("entry {r} is row {i}, but the source has {src_rows} rows of {dim}"),
        });
    }
    out.par_chunks_mut(dim)
        .zip(idx.par_iter())
        .with_min_len(rows_per_task(dim))
        .for_each(|(row, &i)| {
            row.copy_from_slice(&src[i as usize * dim..(i as usize + 1) * dim]);
        });
    Ok(())
}

/// [`crate::Backend::index_put_rows`]: `dst[idx[r]] = src[r]` for `r < n`; `idx` must
/// be distinct (a repeat is an error here, where the CUDA backend would race).
pub(crate) fn index_put_rows(
    src: &[f32],
    dim: usize,
    idx: &[u32],
    n: usize,
    dst: &mut [f32],
) -> Result<()> {
    let src = prefix(
        "index_put_rows source (n × dim)",
        src,
        mul("n × dim", n, dim)?,
    )?;
    let idx = prefix("index_put_rows idx", idx, n)?;
    if dim == 0 {
        return Ok(());
    }
    if n >= NO_SLOT as usize {
        return Err(GpuOpsError::InvalidArgument {
            name: "n",
            reason: format!("{n} rows do not fit u32 row numbers"),
        });
    }
    let dst_rows = rows_of(dst.len(), dim);
    // Per destination row, the source row written to it: builds the inverse map and
    // finds bad or repeated indices before anything is written.
    let mut from = vec![NO_SLOT; dst_rows];
    for (r, &i) in idx.iter().enumerate() {
        let Some(slot) = from.get_mut(i as usize) else {
            return Err(GpuOpsError::InvalidArgument {
                name: "idx",
                reason: format!(
                    "entry {r} is row {i}, but the destination has {dst_rows} rows of {dim}"
                ),
            });
        };
        if *slot != NO_SLOT {
            return Err(GpuOpsError::InvalidArgument {
                name: "idx",
                reason: format!(
                    "row {i} appears at entries {} and {r}; idx must be distinct",
                    *slot
                ),
            });
        }
        // r < n < u32::MAX (checked above), so it fits and is not NO_SLOT.
        *slot = r as u32;
    }
    dst[..dst_rows * dim]
        .par_chunks_mut(dim)
        .zip(from.par_iter())
        .with_min_len(rows_per_task(dim))
        .for_each(|(row, &r)| {
            if r != NO_SLOT {
                row.copy_from_slice(&src[r as usize * dim..(r as usize + 1) * dim]);
            }
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    use cpu_ops::Rng;

    use super::*;

    fn matrix(rows: usize, dim: usize) -> FeatureMatrix {
        let v: Vec<f32> = (0..rows * dim).map(|x| x as f32 * 0.5 - 3.0).collect();
        FeatureMatrix::new(v.into(), rows, dim).unwrap()
    }

    #[test]
    fn store_never_allocates_past_the_budget() {
        let mut rng = Rng::new(3);
        for _ in 0..30 {
            let rows = 1 + rng.below(500) as usize;
            let dim = 1 + rng.below(37) as usize;
            let budget = rng.below((rows * dim * 4) as u64 + 100) as usize;
            let m = matrix(rows, dim);
            let first: Vec<u32> = (0..rng.below(rows as u64))
                .map(|_| rng.below(rows as u64) as u32)
                .collect();
            let mut f = HostFeatures::load(&m, &first, budget).unwrap();
            assert!(f.store_bytes() <= budget, "{} > {budget}", f.store_bytes());
            for _ in 0..20 {
                let ins: Vec<u32> = (0..rng.below(80))
                    .map(|_| rng.below(rows as u64) as u32)
                    .collect();
                let ev: Vec<u32> = (0..rng.below(80))
                    .map(|_| rng.below(rows as u64) as u32)
                    .collect();
                f.update(&ins, &ev).unwrap();
                assert!(f.store_bytes() <= budget, "{} > {budget}", f.store_bytes());
                assert!(f.policy().cached_bytes() <= budget);
                // Every cached slot holds its vertex's row.
                for v in 0..rows as u32 {
                    if let Some(s) = f.policy().slot(v) {
                        let s = s as usize;
                        assert_eq!(&f.store[s * dim..(s + 1) * dim], m.row(v as usize));
                    }
                }
            }
        }
    }

    #[test]
    fn gather_counts_and_matches_the_plain_gather() {
        let m = matrix(100, 6);
        let f = HostFeatures::load(&m, &[5, 7, 9, 11], 3 * 6 * 4).unwrap();
        assert!(f.policy().is_cached(9) && !f.policy().is_cached(11));
        let ids = [9u32, 1, 5, 5, 99, 11, 0];
        let mut out = vec![f32::NAN; 7 * 6 + 5];
        f.gather(&ids, 6, &mut out).unwrap();
        let want = cpu_ops::gather_rows_into_vec(&m, &ids[..6]).unwrap();
        assert_eq!(&out[..36], &want[..]);
        assert!(
            out[36..].iter().all(|v| v.is_nan()),
            "only the prefix is written"
        );
        let s = f.policy().stats();
        assert_eq!((s.hits, s.misses), (3, 3));
        // A bad id: an error naming it, and nothing counted.
        let err = f.gather(&[1, 100], 2, &mut out).unwrap_err();
        assert!(err.to_string().contains("id 100 at position 1"), "{err}");
        assert_eq!(f.policy().stats().hits, 3);
        assert!(matches!(
            f.gather(&ids, 8, &mut out),
            Err(GpuOpsError::SizeMismatch {
                expected: 8,
                found: 7,
                ..
            })
        ));
        assert!(matches!(
            f.gather(&ids, 7, &mut out[..41]),
            Err(GpuOpsError::SizeMismatch {
                expected: 42,
                found: 41,
                ..
            })
        ));
        assert!(matches!(
            HostFeatures::load(&m, &[100], 1000),
            Err(GpuOpsError::InvalidArgument { name: "cached", .. })
        ));
    }

    #[test]
    fn row_selection_and_placement() {
        let src: Vec<f32> = (0..12).map(|x| x as f32).collect(); // 4 rows of 3
        let mut out = vec![-1.0; 9];
        index_select_rows(&src, 3, &[3, 0, 3], 3, &mut out).unwrap();
        assert_eq!(out, [9.0, 10.0, 11.0, 0.0, 1.0, 2.0, 9.0, 10.0, 11.0]);
        assert!(index_select_rows(&src, 3, &[4], 1, &mut out).is_err());
        assert!(index_select_rows(&src, 3, &[0], 4, &mut out).is_err());
        let mut dst = vec![0.0; 12];
        index_put_rows(&src[..6], 3, &[2, 0], 2, &mut dst).unwrap();
        assert_eq!(
            dst,
            [3.0, 4.0, 5.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0]
        );
        assert!(matches!(
            index_put_rows(&src, 3, &[1, 1], 2, &mut dst),
            Err(GpuOpsError::InvalidArgument { name: "idx", .. })
        ));
        assert!(index_put_rows(&src, 3, &[4], 1, &mut dst).is_err());
        assert!(index_put_rows(&src[..2], 3, &[0], 1, &mut dst).is_err());
    }
}
