//! The host backend's [`FeatureStore`]: the feature cache's policy as on a device
//! (a slot map of `slots_used` rows whose bytes never exceed the budget, in front of
//! the host [`FeatureMatrix`]), the counting gather through it, and the row
//! selection ops [`FeatureStore::index_select_rows`] /
//! [`FeatureStore::index_put_rows`].
//!
//! On this backend device memory *is* host memory, so a cached row is read where
//! it already lies (the matrix, or the bfloat16 copy): the cache is its policy
//! (slots, budget, hit/miss counts, inserts and evictions exactly as on a GPU, so
//! the monitor can be tested here) without a second copy of the rows. A store of
//! copied rows would hold the same bits twice: with the default 4 GiB
//! `device.cache_bytes` it would duplicate the whole feature matrix of a 2M-vertex,
//! 128-column graph (1 GB more peak memory for nothing).

use std::sync::Arc;

use cpu_ops::FeatureMatrix;
use rayon::prelude::*;

use crate::backend::{bf16_bits_to_f32, to_bf16_bits, CacheStats, FeatureDtype, FeatureStore};
use crate::cache::{CachePolicy, NO_SLOT};
use crate::error::{GpuOpsError, Result};
use crate::host::buffer::{mul, prefix, prefix_mut, HostBuf};
use crate::host::HostBackend;

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

/// The stored rows every gather reads, hit or miss (module doc).
#[derive(Debug)]
enum Rows {
    /// `f32` rows: the matrix itself (an `Arc` of the map for a mapped matrix).
    F32 { matrix: Arc<FeatureMatrix> },
    /// bfloat16 rows: a converted copy of the matrix.
    Bf16 { host: Vec<u16> },
}

/// Features on the host backend: the host rows and a row cache with a byte budget.
#[derive(Debug)]
pub struct HostFeatures {
    policy: CachePolicy,
    rows: Rows,
}

impl HostFeatures {
    /// [`crate::FeatureStore::load_features`]: clones `features` (an `Arc` clone of the map
    /// for a memory-mapped matrix, a copy for an owned one; with bfloat16 rows only
    /// a converted copy of half its size) and marks the rows of `cached` cached, in
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
            },
            FeatureDtype::Bf16 => Rows::Bf16 {
                host: to_bf16_bits(features.as_slice()),
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

    /// [`crate::FeatureStore::update_cache`]: evict, then insert while the budget
    /// allows (the policy validates every id first, so a bad one changes nothing);
    /// returns how many of `insert` are cached afterwards.
    pub(crate) fn update(&mut self, insert: &[u32], evict: &[u32]) -> Result<usize> {
        Ok(self.policy.update(insert, evict)?.cached)
    }

    /// [`crate::FeatureStore::gather`]: `out[r] = features[ids[r]]` for `r < n`, from the
    /// host rows (widened to `f32`); counts hits and misses (only when every id is
    /// valid).
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
                Rows::F32 { matrix } => gather_through(matrix.as_slice(), &self.policy, ids, out)?,
                Rows::Bf16 { host } => gather_through(host, &self.policy, ids, out)?,
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
                hits += u64::from(slot != NO_SLOT);
                rows.push(&src[v as usize * dim..(v as usize + 1) * dim]);
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

impl FeatureStore for HostBackend {
    fn load_features(
        &self,
        features: &FeatureMatrix,
        cached: &[u32],
        budget_bytes: usize,
        dtype: FeatureDtype,
    ) -> Result<HostFeatures> {
        HostFeatures::load(features, cached, budget_bytes, dtype)
    }

    fn update_cache(&self, f: &mut HostFeatures, insert: &[u32], evict: &[u32]) -> Result<usize> {
        f.update(insert, evict)
    }

    fn is_cached(&self, f: &HostFeatures, v: u32) -> bool {
        f.policy().is_cached(v)
    }

    fn feature_dim(&self, f: &HostFeatures) -> usize {
        f.policy().dim()
    }

    fn gather(
        &self,
        f: &HostFeatures,
        ids: &HostBuf<u32>,
        n: usize,
        out: &mut HostBuf<f32>,
    ) -> Result<()> {
        f.gather(ids, n, out)
    }

    fn cache_stats(&self, f: &HostFeatures) -> CacheStats {
        f.policy().stats()
    }

    fn reset_cache_stats(&self, f: &HostFeatures) {
        f.policy().reset_stats()
    }

    fn index_select_rows(
        &self,
        src: &HostBuf<f32>,
        dim: usize,
        idx: &HostBuf<u32>,
        n: usize,
        out: &mut HostBuf<f32>,
    ) -> Result<()> {
        index_select_rows(src, dim, idx, n, out)
    }

    fn index_put_rows(
        &self,
        src: &HostBuf<f32>,
        dim: usize,
        idx: &HostBuf<u32>,
        n: usize,
        dst: &mut HostBuf<f32>,
    ) -> Result<()> {
        index_put_rows(src, dim, idx, n, dst)
    }
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
    fn the_cache_stays_within_the_budget_and_hits_read_the_right_rows() {
        for dtype in [FeatureDtype::F32, FeatureDtype::Bf16] {
            cache_stays_within_the_budget(dtype);
        }
    }

    fn cache_stays_within_the_budget(dtype: FeatureDtype) {
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
            for _ in 0..20 {
                let ins: Vec<u32> = (0..rng.below(80))
                    .map(|_| rng.below(rows as u64) as u32)
                    .collect();
                let ev: Vec<u32> = (0..rng.below(80))
                    .map(|_| rng.below(rows as u64) as u32)
                    .collect();
                f.update(&ins, &ev).unwrap();
                assert!(f.policy().cached_bytes() <= budget);
                // Every cached vertex gathers its own row (rounded to the dtype),
                // counted as a hit.
                let cached: Vec<u32> = (0..rows as u32)
                    .filter(|&v| f.policy().slot(v).is_some())
                    .collect();
                let mut out = vec![0.0; cached.len() * dim];
                let hits_before = f.policy().stats().hits;
                f.gather(&cached, cached.len(), &mut out).unwrap();
                assert_eq!(f.policy().stats().hits - hits_before, cached.len() as u64);
                for (v, got) in cached.iter().zip(out.chunks(dim)) {
                    let want: Vec<f32> = m
                        .row(*v as usize)
                        .iter()
                        .map(|&x| match dtype {
                            FeatureDtype::F32 => x,
                            FeatureDtype::Bf16 => crate::round_to_bf16(x),
                        })
                        .collect();
                    assert_eq!(got, &want[..]);
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
