//! Host-backend features and row movement: the feature cache laid out as on a device
//! (a store of `slots_used × dim` rows that never exceeds the byte budget, in front of
//! the host [`FeatureMatrix`]), the counting gather through it, and the row
//! selection ops [`crate::FeatureStore::index_select_rows`] /
//! [`crate::FeatureStore::index_put_rows`].
//!
//! The store is real memory, not a flag: a hit copies from the store, a miss from the
//! matrix, so budget accounting and hit/miss counts mean on the host what they mean
//! on a GPU (and the monitor can be tested here).

use std::sync::Arc;

use cpu_ops::FeatureMatrix;
use rayon::prelude::*;

use crate::backend::{bf16_bits_to_f32, to_bf16_bits, FeatureDtype};
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
fn prefetch_row<T>(row: &[T]) {
    let size = std::mem::size_of::<T>().max(1);
    let line_values = (64 / size).max(1);
    let head = row.len().min(PREFETCH_MAX_BYTES / size);
    for line in row[..head].iter().step_by(line_values) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            // SAFETY: a prefetch is a hint that never faults and changes no state the
            // program can see; the pointer comes from a live reference anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>((line as *const T).cast::<i8>()) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = line;
    }
}

/// Rows per rayon task for rows of `dim` `f32`s.
fn rows_per_task(dim: usize) -> usize {
    (TASK_BYTES / (dim.max(1) * std::mem::size_of::<f32>())).max(1)
}

/// A stored feature value: `f32`, or bfloat16 bits (`u16`).
trait Value: Copy + Default + Send + Sync + 'static {
    /// Writes `src` widened to `f32` into `dst` (same length).
    fn widen_row(src: &[Self], dst: &mut [f32]);
}

impl Value for f32 {
    fn widen_row(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl Value for u16 {
    fn widen_row(src: &[u16], dst: &mut [f32]) {
        for (d, &b) in dst.iter_mut().zip(src) {
            *d = bf16_bits_to_f32(b);
        }
    }
}

/// The stored rows: the host rows a miss reads and the cache store (rows
/// `0..policy.slots_used()`, slot `s` at `s * dim`; its capacity, the bytes it
/// owns, stays within the budget).
#[derive(Debug)]
enum Rows {
    /// `f32` rows: the host rows are the matrix itself.
    F32 {
        matrix: Arc<FeatureMatrix>,
        store: Vec<f32>,
    },
    /// bfloat16 rows: a converted copy of the matrix, and a bfloat16 store.
    Bf16 { host: Vec<u16>, store: Vec<u16> },
}

/// Features on the host backend: the host rows and a row cache with a byte budget.
#[derive(Debug)]
pub struct HostFeatures {
    policy: CachePolicy,
    rows: Rows,
}

/// Makes room in `store` for `need_rows` rows of `dim` (the caller caps it at the
/// capacity), growing geometrically up to `cap_rows`, never past it.
fn reserve_rows<T>(
    store: &mut Vec<T>,
    need_rows: usize,
    cap_rows: usize,
    dim: usize,
    budget: usize,
) -> Result<()> {
    if need_rows * dim <= store.capacity() {
        return Ok(());
    }
    let rows_now = store.capacity() / dim;
    let target = need_rows.max(rows_now.saturating_mul(2)).min(cap_rows) * dim;
    store
        .try_reserve_exact(target - store.len())
        .map_err(|_| GpuOpsError::OutOfMemory {
            what: "host feature cache store".into(),
            requested: target * std::mem::size_of::<T>(),
            available: budget,
        })
}

/// Copies the rows `filled` names (vertex, slot) from `src` into `store`.
fn fill_rows<T: Value>(src: &[T], store: &mut [T], filled: &[(u32, u32)], dim: usize) {
    let first = filled[0].1 as usize;
    let consecutive = filled
        .iter()
        .enumerate()
        .all(|(i, &(_, s))| s as usize == first + i);
    if consecutive {
        // Fresh slots in a run (the initial load): one parallel copy.
        store[first * dim..(first + filled.len()) * dim]
            .par_chunks_mut(dim)
            .zip(filled.par_iter())
            .with_min_len(rows_per_task(dim))
            .for_each(|(row, &(v, _))| {
                row.copy_from_slice(&src[v as usize * dim..(v as usize + 1) * dim]);
            });
    } else {
        for &(v, s) in filled {
            let (v, s) = (v as usize, s as usize);
            store[s * dim..(s + 1) * dim].copy_from_slice(&src[v * dim..(v + 1) * dim]);
        }
    }
}

impl HostFeatures {
    /// [`crate::FeatureStore::load_features`]: clones `features` (an `Arc` clone of the map
    /// for a memory-mapped matrix, a copy for an owned one; with bfloat16 rows only
    /// a converted copy of half its size) and caches the rows of `cached`, in
    /// order, while the budget allows.
    pub(crate) fn load(
        features: &FeatureMatrix,
        cached: &[u32],
        budget_bytes: usize,
        dtype: FeatureDtype,
    ) -> Result<Self> {
        let policy = CachePolicy::for_features(features, dtype, budget_bytes, cached)?;
        let rows = match dtype {
            FeatureDtype::F32 => Rows::F32 {
                matrix: Arc::new(features.clone()),
                store: Vec::new(),
            },
            FeatureDtype::Bf16 => Rows::Bf16 {
                host: to_bf16_bits(features.as_slice()),
                store: Vec::new(),
            },
        };
        let mut f = Self { policy, rows };
        f.update(cached, &[])?;
        Ok(f)
    }

    /// The host matrix (`None` with bfloat16 rows, which keep only their
    /// converted copy).
    pub fn matrix(&self) -> Option<&FeatureMatrix> {
        match &self.rows {
            Rows::F32 { matrix, .. } => Some(matrix),
            Rows::Bf16 { .. } => None,
        }
    }

    /// How the rows are stored.
    pub fn dtype(&self) -> FeatureDtype {
        match self.rows {
            Rows::F32 { .. } => FeatureDtype::F32,
            Rows::Bf16 { .. } => FeatureDtype::Bf16,
        }
    }

    /// The cache policy (slot map, occupancy, counters).
    pub fn policy(&self) -> &CachePolicy {
        &self.policy
    }

    /// Bytes the cache store has allocated (never above the budget).
    pub fn store_bytes(&self) -> usize {
        match &self.rows {
            Rows::F32 { store, .. } => store.capacity() * std::mem::size_of::<f32>(),
            Rows::Bf16 { store, .. } => store.capacity() * std::mem::size_of::<u16>(),
        }
    }

    /// [`crate::FeatureStore::update_cache`]: evict, insert, copy the new rows in. Room
    /// for up to `insert.len()` more slots (capped at the capacity) is made before
    /// the policy changes, so a failed allocation changes nothing.
    pub(crate) fn update(&mut self, insert: &[u32], evict: &[u32]) -> Result<usize> {
        // Validate first, so a bad id leaves the store untouched too.
        self.policy.check_ids("evict", evict)?;
        self.policy.check_ids("insert", insert)?;
        let dim = self.policy.dim();
        let cap_rows = self.policy.capacity_rows();
        let need_rows = self
            .policy
            .slots_used()
            .saturating_add(insert.len())
            .min(cap_rows);
        let budget = self.policy.budget_bytes();
        if dim > 0 {
            match &mut self.rows {
                Rows::F32 { store, .. } => reserve_rows(store, need_rows, cap_rows, dim, budget)?,
                Rows::Bf16 { store, .. } => reserve_rows(store, need_rows, cap_rows, dim, budget)?,
            }
        }
        let up = self.policy.update(insert, evict)?;
        // Within the reservation: no reallocation, the budget holds.
        let len = self.policy.slots_used() * dim;
        if dim == 0 {
            return Ok(up.cached);
        }
        match &mut self.rows {
            Rows::F32 { matrix, store } => {
                store.resize(len, 0.0);
                if !up.filled.is_empty() {
                    fill_rows(matrix.as_slice(), store, &up.filled, dim);
                }
            }
            Rows::Bf16 { host, store } => {
                store.resize(len, 0);
                if !up.filled.is_empty() {
                    fill_rows(host, store, &up.filled, dim);
                }
            }
        }
        Ok(up.cached)
    }

    /// [`crate::FeatureStore::gather`]: `out[r] = features[ids[r]]` for `r < n`, from the
    /// store on a hit and from the host rows on a miss (widened to `f32`); counts
    /// both (only when every id is valid).
    pub(crate) fn gather(&self, ids: &[u32], n: usize, out: &mut [f32]) -> Result<()> {
        let dim = self.policy.dim();
        let ids = prefix("gather ids", ids, n)?;
        let out = prefix_mut("gather output (n × dim)", out, mul("n × dim", n, dim)?)?;
        let num_rows = self.policy.num_vertices();
        let hits = if dim == 0 {
            let mut hits = 0;
            for (r, &v) in ids.iter().enumerate() {
                if v as usize >= num_rows {
                    return Err(bad_id(r, v, num_rows));
                }
                hits += u64::from(self.policy.is_cached(v));
            }
            hits
        } else {
            match &self.rows {
                Rows::F32 { matrix, store } => {
                    gather_through(matrix.as_slice(), store, &self.policy, ids, out)?
                }
                Rows::Bf16 { host, store } => gather_through(host, store, &self.policy, ids, out)?,
            }
        };
        self.policy.record(hits, n as u64 - hits);
        Ok(())
    }
}

/// The error for id `v` at position `r`, not below `num_rows`.
fn bad_id(r: usize, v: u32, num_rows: usize) -> GpuOpsError {
    GpuOpsError::InvalidArgument {
        name: "ids",
        reason: format!("id {v} at position {r} is not below the {num_rows} feature rows"),
    }
}

/// The gather through the cache (`dim > 0`): returns the hits.
fn gather_through<T: Value>(
    src: &[T],
    store: &[T],
    policy: &CachePolicy,
    ids: &[u32],
    out: &mut [f32],
) -> Result<u64> {
    let dim = policy.dim();
    let num_rows = policy.num_vertices();
    let per_task = rows_per_task(dim);
    let slots = policy.slot_map();
    out.par_chunks_mut(per_task * dim)
        .zip(ids.par_chunks(per_task))
        .enumerate()
        .map(|(t, (out, ids))| -> Result<u64> {
            // 1. Resolve every row's source first: the slot-map loads are
            //    independent, so they overlap.
            let mut rows: Vec<&[T]> = Vec::with_capacity(ids.len());
            let mut hits = 0u64;
            for (i, &v) in ids.iter().enumerate() {
                let Some(&slot) = slots.get(v as usize) else {
                    return Err(bad_id(t * per_task + i, v, num_rows));
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
                T::widen_row(r, o);
            }
            Ok(hits)
        })
        .try_reduce(|| 0, |a, b| Ok(a + b))
}

/// Rows of width `dim` in a buffer of `len` values.
fn rows_of(len: usize, dim: usize) -> usize {
    len.checked_div(dim).unwrap_or(0)
}

/// [`crate::FeatureStore::index_select_rows`]: `out[r] = src[idx[r]]` for `r < n`.
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

/// [`crate::FeatureStore::index_put_rows`]: `dst[idx[r]] = src[r]` for `r < n`; `idx` must
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

    /// Row `v` of `f`'s cache slot `s`, widened to `f32`.
    fn store_row(f: &HostFeatures, s: usize) -> Vec<f32> {
        let dim = f.policy().dim();
        let mut out = vec![0.0; dim];
        match &f.rows {
            Rows::F32 { store, .. } => f32::widen_row(&store[s * dim..(s + 1) * dim], &mut out),
            Rows::Bf16 { store, .. } => u16::widen_row(&store[s * dim..(s + 1) * dim], &mut out),
        }
        out
    }

    #[test]
    fn store_never_allocates_past_the_budget() {
        for dtype in [FeatureDtype::F32, FeatureDtype::Bf16] {
            store_stays_within_the_budget(dtype);
        }
    }

    fn store_stays_within_the_budget(dtype: FeatureDtype) {
        let mut rng = Rng::new(3);
        for _ in 0..30 {
            let rows = 1 + rng.below(500) as usize;
            let dim = 1 + rng.below(37) as usize;
            let budget = rng.below((rows * dim * 4) as u64 + 100) as usize;
            let m = matrix(rows, dim);
            let first: Vec<u32> = (0..rng.below(rows as u64))
                .map(|_| rng.below(rows as u64) as u32)
                .collect();
            let mut f = HostFeatures::load(&m, &first, budget, dtype).unwrap();
            // bfloat16 rows take half the bytes: twice the rows fit.
            let cap = (budget / (dim * dtype.value_bytes())).min(rows);
            assert_eq!(f.policy().capacity_rows(), cap);
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
                // Every cached slot holds its vertex's row (rounded to the dtype).
                for v in 0..rows as u32 {
                    if let Some(s) = f.policy().slot(v) {
                        let want: Vec<f32> = m
                            .row(v as usize)
                            .iter()
                            .map(|&x| match dtype {
                                FeatureDtype::F32 => x,
                                FeatureDtype::Bf16 => crate::round_to_bf16(x),
                            })
                            .collect();
                        assert_eq!(store_row(&f, s as usize), want);
                    }
                }
            }
        }
    }

    #[test]
    fn gather_counts_and_matches_the_plain_gather() {
        let m = matrix(100, 6);
        let f = HostFeatures::load(&m, &[5, 7, 9, 11], 3 * 6 * 4, FeatureDtype::F32).unwrap();
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
            HostFeatures::load(&m, &[100], 1000, FeatureDtype::F32),
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
