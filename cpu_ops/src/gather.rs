//! Feature-row gather: copies the rows of a block's input vertices into one dense
//! buffer (the batch's input features).
//!
//! Random 512-byte rows from a matrix far larger than the caches are bound by memory
//! latency, not bandwidth: the copy of row `i` cannot start before its lines arrive.
//! The loop therefore prefetches the rows a few ids ahead, so several rows are in
//! flight per core, and hands rayon chunks of about `TASK_BYTES` so scheduling costs
//! stay small next to the copies. Ids are checked per chunk, just before its copy,
//! while they are in cache.

use rayon::prelude::*;

use crate::error::{CpuOpsError, Result};
use crate::features::FeatureMatrix;

/// Bytes of output per rayon task.
const TASK_BYTES: usize = 64 * 1024;
/// How many rows ahead of the copy the loop prefetches.
const PREFETCH_ROWS: usize = 8;
/// Bytes prefetched at the start of each row; the hardware prefetcher follows longer
/// rows by itself.
const PREFETCH_MAX_BYTES: usize = 1024;

/// Copies row `ids[i]` of `features` to `out[i * dim..(i + 1) * dim]` for every `i`,
/// in parallel on rayon's current pool.
///
/// Fails with [`CpuOpsError::SizeMismatch`] when `out.len() != ids.len() * dim` and
/// with [`CpuOpsError::VertexOutOfRange`] when an id is not a row; on error the
/// content of `out` is unspecified.
pub fn gather_rows(features: &FeatureMatrix, ids: &[u32], out: &mut [f32]) -> Result<()> {
    let dim = features.dim();
    let num_rows = features.num_rows();
    let expected = ids
        .len()
        .checked_mul(dim)
        .ok_or_else(|| CpuOpsError::InvalidArgument {
            name: "ids",
            reason: format!("{} ids × {dim} values overflow", ids.len()),
        })?;
    if out.len() != expected {
        return Err(CpuOpsError::SizeMismatch {
            what: "gather output values (ids × dim)",
            expected,
            found: out.len(),
        });
    }
    if dim == 0 {
        return check_ids(ids, num_rows);
    }
    let src = features.as_slice();
    let rows_per_task = (TASK_BYTES / (dim * std::mem::size_of::<f32>())).max(1);
    out.par_chunks_mut(rows_per_task * dim)
        .zip(ids.par_chunks(rows_per_task))
        .try_for_each(|(out, ids)| {
            check_ids(ids, num_rows)?;
            copy_rows(src, dim, ids, out);
            Ok(())
        })
}

/// Allocates the output and calls [`gather_rows`]: `ids.len() × dim` values.
pub fn gather_rows_into_vec(features: &FeatureMatrix, ids: &[u32]) -> Result<Vec<f32>> {
    let len =
        ids.len()
            .checked_mul(features.dim())
            .ok_or_else(|| CpuOpsError::InvalidArgument {
                name: "ids",
                reason: format!("{} ids × {} values overflow", ids.len(), features.dim()),
            })?;
    let mut out = vec![0.0; len];
    gather_rows(features, ids, &mut out)?;
    Ok(out)
}

/// Fails on the first id that is not below `num_rows`.
fn check_ids(ids: &[u32], num_rows: usize) -> Result<()> {
    // A branch-free max vectorizes; the slow search runs only on failure.
    let max = ids.iter().copied().max().unwrap_or(0);
    if ids.is_empty() || (max as usize) < num_rows {
        return Ok(());
    }
    let bad = ids
        .iter()
        .copied()
        .find(|&i| i as usize >= num_rows)
        .unwrap_or(max);
    Err(CpuOpsError::VertexOutOfRange {
        context: "gather ids",
        vertex: bad as u64,
        num_vertices: num_rows,
    })
}

/// The sequential kernel: checked ids, `out.len() == ids.len() * dim`, `dim > 0`.
fn copy_rows(src: &[f32], dim: usize, ids: &[u32], out: &mut [f32]) {
    let head = dim.min(PREFETCH_MAX_BYTES / std::mem::size_of::<f32>());
    for &id in ids.iter().take(PREFETCH_ROWS) {
        prefetch_row(src, id as usize * dim, head);
    }
    for (i, (o, &id)) in out.chunks_exact_mut(dim).zip(ids).enumerate() {
        if let Some(&ahead) = ids.get(i + PREFETCH_ROWS) {
            prefetch_row(src, ahead as usize * dim, head);
        }
        let start = id as usize * dim;
        o.copy_from_slice(&src[start..start + dim]);
    }
}

/// Asks the CPU to start loading `src[start..start + len]` into cache.
#[inline(always)]
fn prefetch_row(src: &[f32], start: usize, len: usize) {
    const LINE_FLOATS: usize = 64 / std::mem::size_of::<f32>();
    for line in src[start..start + len].iter().step_by(LINE_FLOATS) {
        prefetch(line);
    }
}

/// Asks the CPU to start loading the cache line holding `x` (a no-op off x86-64).
#[inline(always)]
pub(crate) fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = (x as *const T).cast::<i8>();
        // SAFETY: a prefetch is a hint that never faults and has no visible effect;
        // `p` comes from a reference anyway.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn matrix(rows: usize, dim: usize, seed: u64) -> FeatureMatrix {
        let mut r = Rng::new(seed);
        let data: Vec<f32> = (0..rows * dim).map(|_| r.next_f32()).collect();
        FeatureMatrix::new(data.into(), rows, dim).unwrap()
    }

    fn scalar_gather(f: &FeatureMatrix, ids: &[u32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(ids.len() * f.dim());
        for &i in ids {
            for c in 0..f.dim() {
                out.push(f.as_slice()[i as usize * f.dim() + c]);
            }
        }
        out
    }

    #[test]
    fn matches_scalar_reference_on_odd_sizes() {
        let mut r = Rng::new(11);
        for dim in [1, 3, 127, 128, 129, 300] {
            for rows in [1, 7, 1000] {
                let f = matrix(rows, dim, (dim * rows) as u64);
                for n_ids in [0, 1, 5, 333, 4099] {
                    let ids: Vec<u32> = (0..n_ids).map(|_| r.below(rows as u64) as u32).collect();
                    let want = scalar_gather(&f, &ids);
                    let got = gather_rows_into_vec(&f, &ids).unwrap();
                    assert_eq!(got, want, "dim {dim} rows {rows} ids {n_ids}");
                }
            }
        }
    }

    #[test]
    fn rejects_bad_inputs() {
        let f = matrix(10, 4, 1);
        let mut out = vec![0.0; 8];
        let err = gather_rows(&f, &[1, 10], &mut out).unwrap_err();
        assert!(
            matches!(err, CpuOpsError::VertexOutOfRange { vertex: 10, .. }),
            "{err}"
        );
        let err = gather_rows(&f, &[1, 2], &mut out[..7]).unwrap_err();
        assert!(
            matches!(
                err,
                CpuOpsError::SizeMismatch {
                    expected: 8,
                    found: 7,
                    ..
                }
            ),
            "{err}"
        );
        // A bad id deep inside a long list, past the first task.
        let mut ids = vec![3u32; 100_000];
        ids[77_777] = u32::MAX;
        assert!(gather_rows_into_vec(&f, &ids).is_err());
        // Zero-width rows still check ids.
        let empty = FeatureMatrix::new(Vec::new().into(), 3, 0).unwrap();
        assert!(gather_rows(&empty, &[0, 2], &mut []).is_ok());
        assert!(gather_rows(&empty, &[3], &mut []).is_err());
    }
}
