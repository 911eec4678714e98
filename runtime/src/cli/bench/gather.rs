//! `tandem bench gather`: feature-row gather against the machine's limits, measured
//! in the same run.
//!
//! Three copies are timed, each over the same random row ids:
//! 1. **reference**: the simplest parallel gather, one `copy_from_slice` per row, the
//!    ids split evenly across rayon's threads. What the hardware gives for random rows
//!    with no effort; the target is to stay within 80% of it or beat it.
//! 2. **stream**: one thread copying a large contiguous buffer, the sequential
//!    bandwidth of one core, for context.
//! 3. **gather**: [`cpu_ops::gather_rows`].
//!
//! Each repetition runs all three, in alternating order; the report keeps each one's
//! best repetition (the least disturbed by other work on the machine) and its median.

use std::fmt;
use std::time::{Duration, Instant};

use cpu_ops::{gather_rows, FeatureMatrix, Rng};
use rayon::prelude::*;

use super::{median, per_second};
use crate::error::{Error, Result};

/// Timed repetitions of each copy (after one untimed warm-up).
const REPETITIONS: usize = 5;
/// The streaming copy moves as many bytes as one gather batch, but at least this
/// many (to get past the caches)...
const MIN_STREAM_BYTES: usize = 64 << 20;
/// ...and at most this many (to bound the memory the benchmark takes).
const MAX_STREAM_BYTES: usize = 256 << 20;

/// Time and throughput of one of the copies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CopyStats {
    /// Best repetition.
    pub best: Duration,
    /// Median repetition.
    pub median: Duration,
    /// Bytes copied per repetition.
    pub bytes: u64,
}

impl CopyStats {
    /// GB/s (10^9 bytes copied per second) of the best repetition.
    pub fn gbps(&self) -> f64 {
        per_second(self.bytes as f64, self.best) / 1e9
    }

    /// GB/s of the median repetition.
    pub fn median_gbps(&self) -> f64 {
        per_second(self.bytes as f64, self.median) / 1e9
    }
}

/// What [`bench_gather`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct GatherReport {
    /// Rows of the feature matrix.
    pub num_rows: usize,
    /// Values per row.
    pub dim: usize,
    /// Rows gathered per batch.
    pub rows_per_batch: usize,
    /// Batches (distinct id lists) per repetition.
    pub batches: usize,
    /// Timed repetitions.
    pub repetitions: usize,
    /// Threads of the rayon pool it ran on.
    pub threads: usize,
    /// The plain parallel `copy_from_slice` gather (the machine limit).
    pub reference: CopyStats,
    /// One thread streaming a contiguous buffer.
    pub stream: CopyStats,
    /// [`cpu_ops::gather_rows`].
    pub gather: CopyStats,
}

impl GatherReport {
    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.dim * std::mem::size_of::<f32>()
    }

    /// `gather_rows` throughput over the reference's (best repetitions).
    pub fn ratio(&self) -> f64 {
        let r = self.reference.gbps();
        if r > 0.0 {
            self.gather.gbps() / r
        } else {
            0.0
        }
    }
}

impl fmt::Display for GatherReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "feature gather: {} rows × {} f32 ({} B/row), {} rows/batch × {} batches, \
             best of {}, {}",
            self.num_rows,
            self.dim,
            self.row_bytes(),
            self.rows_per_batch,
            self.batches,
            self.repetitions,
            crate::trace::fmt_count(self.threads, "thread")
        )?;
        writeln!(
            f,
            "  {:<34} {:>9} {:>11} {:>11}",
            "copy", "GB/s", "median GB/s", "best ms"
        )?;
        let rows = [
            ("reference (parallel row memcpy)", &self.reference),
            ("stream (1 thread, contiguous)", &self.stream),
            ("cpu_ops::gather_rows", &self.gather),
        ];
        for (name, s) in rows {
            writeln!(
                f,
                "  {:<34} {:>9.2} {:>11.2} {:>11.2}",
                name,
                s.gbps(),
                s.median_gbps(),
                s.best.as_secs_f64() * 1e3
            )?;
        }
        writeln!(
            f,
            "  gather / reference: {:.2} (target ≥ 0.80)",
            self.ratio()
        )
    }
}

/// Gathers `batches` lists of `rows_per_batch` random row ids (drawn with
/// replacement from `Rng::new(seed)`) from `features` with each of the three copies
/// of the module doc, on rayon's current pool, and reports GB/s of row data copied.
pub fn bench_gather(
    features: &FeatureMatrix,
    rows_per_batch: usize,
    batches: usize,
    seed: u64,
) -> Result<GatherReport> {
    let dim = features.dim();
    let num_rows = features.num_rows();
    if dim == 0 || num_rows == 0 {
        return Err(Error::invalid_argument(
            "features",
            format!("need at least one row and one column, got {num_rows} × {dim}"),
        ));
    }
    if rows_per_batch == 0 || batches == 0 {
        return Err(Error::invalid_argument(
            "rows_per_batch, batches",
            format!("both must be at least 1, got {rows_per_batch} and {batches}"),
        ));
    }
    let values = rows_per_batch.checked_mul(dim).ok_or_else(|| {
        Error::invalid_argument(
            "rows_per_batch",
            format!("{rows_per_batch} × {dim} overflows"),
        )
    })?;
    let mut rng = Rng::new(seed);
    let ids: Vec<Vec<u32>> = (0..batches)
        .map(|_| {
            (0..rows_per_batch)
                .map(|_| rng.below(num_rows as u64) as u32)
                .collect()
        })
        .collect();
    let mut out = vec![0f32; values];
    let batch_bytes = (values * std::mem::size_of::<f32>()) as u64;
    let stream_len = values.clamp(
        MIN_STREAM_BYTES / std::mem::size_of::<f32>(),
        MAX_STREAM_BYTES / std::mem::size_of::<f32>(),
    );
    let stream_src: Vec<f32> = (0..stream_len).map(|i| i as f32).collect();
    let mut stream_dst = vec![0f32; stream_len];
    let src = features.as_slice();

    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for rep in 0..=REPETITIONS {
        let order: [usize; 3] = if rep % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        for which in order {
            let start = Instant::now();
            match which {
                0 => {
                    for batch in &ids {
                        reference_gather(src, dim, batch, &mut out);
                    }
                }
                1 => stream_dst.copy_from_slice(&stream_src),
                _ => {
                    for batch in &ids {
                        gather_rows(features, batch, &mut out)
                            .map_err(|e| Error::cpu_ops("bench gather", e))?;
                    }
                }
            }
            let elapsed = start.elapsed();
            std::hint::black_box((&out, &stream_dst));
            if rep > 0 {
                times[which].push(elapsed);
            }
        }
    }
    let stats = |t: &[Duration], bytes: u64| CopyStats {
        best: t.iter().min().copied().unwrap_or_default(),
        median: median(t),
        bytes,
    };
    Ok(GatherReport {
        num_rows,
        dim,
        rows_per_batch,
        batches,
        repetitions: REPETITIONS,
        threads: rayon::current_num_threads(),
        reference: stats(&times[0], batch_bytes * batches as u64),
        stream: stats(&times[1], (stream_len * std::mem::size_of::<f32>()) as u64),
        gather: stats(&times[2], batch_bytes * batches as u64),
    })
}

/// The reference: ids split evenly across the pool's threads, one `copy_from_slice`
/// per row. Ids come from `below(num_rows)`, so indexing cannot fail.
fn reference_gather(src: &[f32], dim: usize, ids: &[u32], out: &mut [f32]) {
    let rows_per_thread = ids.len().div_ceil(rayon::current_num_threads()).max(1);
    out.par_chunks_mut(rows_per_thread * dim)
        .zip(ids.par_chunks(rows_per_thread))
        .for_each(|(out, ids)| {
            for (o, &id) in out.chunks_exact_mut(dim).zip(ids) {
                let start = id as usize * dim;
                o.copy_from_slice(&src[start..start + dim]);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_gather_runs_and_reports() {
        let data: Vec<f32> = (0..1000 * 16).map(|i| i as f32).collect();
        let f = FeatureMatrix::new(data.into(), 1000, 16).unwrap();
        let report = bench_gather(&f, 300, 3, 5).unwrap();
        assert_eq!(report.row_bytes(), 64);
        assert_eq!(report.gather.bytes, 300 * 3 * 64);
        assert_eq!(report.reference.bytes, report.gather.bytes);
        assert!(report.stream.bytes >= MIN_STREAM_BYTES as u64);
        assert!(report.ratio() > 0.0);
        let text = report.to_string();
        assert!(text.contains("gather / reference"), "{text}");
        assert!(text.contains("cpu_ops::gather_rows"), "{text}");
    }

    #[test]
    fn bench_gather_rejects_bad_arguments() {
        let f = FeatureMatrix::new(vec![0.0; 8].into(), 2, 4).unwrap();
        assert!(bench_gather(&f, 0, 1, 0).is_err());
        assert!(bench_gather(&f, 1, 0, 0).is_err());
        let empty = FeatureMatrix::new(Vec::new().into(), 0, 4).unwrap();
        assert!(bench_gather(&empty, 1, 1, 0).is_err());
    }
}
