//! Aggregation throughput next to the machine's streaming bandwidth, both measured
//! in the same run.
//!
//! [`bench_aggregate`] builds a bottom-layer-like block (`num_dst` destinations ×
//! `fanout` sampled sources out of `num_src`), then times:
//!
//! 1. a streaming copy: parallel `copy_from_slice` of a [`COPY_BYTES`] buffer (4× the
//!    32 MiB L3), bytes = read + written;
//! 2. mean aggregation forward and backward (`f32`), bytes = feature rows read +
//!    rows written: forward `(edges + num_dst) · dim · 4`, backward
//!    `(edges + num_src) · dim · 4`;
//!
//! each at the detected SIMD level and at the scalar level, and on two numberings
//! of the same block's sources: `random` (uniform local ids: every row read is a
//! random access, the worst case) and `first-seen` (local ids in order of first
//! appearance, as DGL's `to_block` numbers them: a destination's new neighbors are
//! consecutive rows). The transpose the backward gathers over is built once per block,
//! outside the backward timings, and reported on its own line.
//!
//! The operations run interleaved, one of each per round (`reps` rounds after a
//! warm-up), so that other processes' load falls on all of them alike and the
//! ratio to the copy stays meaningful on a shared machine; the table shows the best
//! and the median round.

use std::fmt;
use std::time::Instant;

use cpu_ops::{
    aggregate_backward_f32, aggregate_forward_f32, AggregateKind, BlockView, CpuOpsError, Rng,
    Simd, SimdLevel,
};
use rayon::prelude::*;

/// Bytes of the streaming-copy source (the destination is as large).
pub const COPY_BYTES: usize = 128 << 20;

/// How the block's sources are numbered (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceOrder {
    /// Uniform random local ids: every row read is a random access.
    Random,
    /// Local ids in order of first appearance (DGL's `to_block`).
    FirstSeen,
}

impl fmt::Display for SourceOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SourceOrder::Random => "random",
            SourceOrder::FirstSeen => "first-seen",
        })
    }
}

/// Times of one measured operation.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    /// Bytes counted per run.
    pub bytes: u64,
    /// Fastest run, seconds.
    pub best_s: f64,
    /// Median run, seconds.
    pub median_s: f64,
}

impl Timing {
    /// Throughput of the fastest run, GB/s (10⁹ bytes).
    pub fn best_gbs(&self) -> f64 {
        self.bytes as f64 / self.best_s / 1e9
    }

    /// Throughput of the median run, GB/s.
    pub fn median_gbs(&self) -> f64 {
        self.bytes as f64 / self.median_s / 1e9
    }
}

/// One timed aggregation pass.
#[derive(Clone, Debug, PartialEq)]
pub struct PassTiming {
    /// `"forward"` or `"backward"`.
    pub pass: &'static str,
    /// Source numbering of the block.
    pub order: SourceOrder,
    /// SIMD level it ran at.
    pub level: SimdLevel,
    /// Its times.
    pub timing: Timing,
}

/// What [`bench_aggregate`] measured; `Display` prints it as a table.
#[derive(Clone, Debug, PartialEq)]
pub struct AggregateReport {
    /// Destinations of the block.
    pub num_dst: usize,
    /// Sampled sources per destination.
    pub fanout: usize,
    /// Sources of the block (rows of the input features).
    pub num_src: usize,
    /// Sources at least one edge reads.
    pub distinct_src_read: usize,
    /// Feature columns (`f32`).
    pub dim: usize,
    /// Timed runs per measurement (after one warm-up run).
    pub reps: usize,
    /// Rayon threads.
    pub threads: usize,
    /// The streaming copy.
    pub copy: Timing,
    /// Building the block's transpose (once per block), seconds, best of `reps`.
    pub transpose_s: f64,
    /// The aggregation passes.
    pub passes: Vec<PassTiming>,
}

impl fmt::Display for AggregateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "mean aggregation, f32: {} dst × fanout {} over {} src ({} read), dim {}; \
             {}, best / median of {}",
            self.num_dst,
            self.fanout,
            self.num_src,
            self.distinct_src_read,
            self.dim,
            crate::trace::fmt_count(self.threads, "thread"),
            self.reps
        )?;
        writeln!(
            f,
            "{:<22} {:<10} {:>9} {:>9} {:>10} {:>10} {:>8}",
            "pass", "level", "MB", "best ms", "best GB/s", "med GB/s", "vs copy"
        )?;
        writeln!(
            f,
            "{:<22} {:<10} {:>9.1} {:>9.2} {:>10.1} {:>10.1} {:>8}",
            "streaming copy",
            "-",
            self.copy.bytes as f64 / 1e6,
            self.copy.best_s * 1e3,
            self.copy.best_gbs(),
            self.copy.median_gbs(),
            "1.00"
        )?;
        for p in &self.passes {
            writeln!(
                f,
                "{:<22} {:<10} {:>9.1} {:>9.2} {:>10.1} {:>10.1} {:>8.2}",
                format!("{} {}", p.pass, p.order),
                p.level.name(),
                p.timing.bytes as f64 / 1e6,
                p.timing.best_s * 1e3,
                p.timing.best_gbs(),
                p.timing.median_gbs(),
                p.timing.best_gbs() / self.copy.best_gbs()
            )?;
        }
        write!(
            f,
            "transpose build (once per block, not in the backward times): {:.2} ms",
            self.transpose_s * 1e3
        )
    }
}

/// Best and median of measured seconds.
fn timing(bytes: u64, mut secs: Vec<f64>) -> Timing {
    secs.sort_by(f64::total_cmp);
    Timing {
        bytes,
        best_s: secs[0],
        median_s: secs[secs.len() / 2],
    }
}

/// One timed operation of a round.
#[derive(Clone, Copy)]
enum Op {
    Copy,
    Forward(usize, Simd),
    Backward(usize, Simd),
}

/// `fanout` uniform sources per destination (with replacement), seeded per row.
fn random_indices(num_dst: usize, fanout: usize, num_src: usize, seed: u64) -> Vec<u32> {
    let mut indices = vec![0u32; num_dst * fanout];
    indices
        .par_chunks_mut(fanout)
        .enumerate()
        .for_each(|(i, row)| {
            let mut rng = Rng::for_stream(seed, i as u64);
            for j in row {
                *j = rng.below(num_src as u64) as u32;
            }
        });
    indices
}

/// Renumbers sources as DGL's `to_block` does: destinations keep `0..num_dst`, the
/// other sources are numbered in order of first appearance in the edge list.
fn first_seen(num_dst: usize, num_src: usize, indices: &[u32]) -> Vec<u32> {
    let mut map = vec![u32::MAX; num_src];
    for (i, m) in map.iter_mut().enumerate().take(num_dst) {
        *m = i as u32;
    }
    let mut next = num_dst as u32;
    indices
        .iter()
        .map(|&j| {
            let m = &mut map[j as usize];
            if *m == u32::MAX {
                *m = next;
                next += 1;
            }
            *m
        })
        .collect()
}

/// Measures mean aggregation forward and backward (`f32`) on a random block of
/// `num_dst × fanout` edges over `num_src` sources with `dim` columns, and a
/// streaming copy in the same run (module doc). `reps` timed runs each.
pub fn bench_aggregate(
    num_dst: usize,
    fanout: usize,
    num_src: usize,
    dim: usize,
    reps: usize,
    seed: u64,
) -> Result<AggregateReport, CpuOpsError> {
    run(COPY_BYTES, num_dst, fanout, num_src, dim, reps, seed)
}

fn run(
    copy_bytes: usize,
    num_dst: usize,
    fanout: usize,
    num_src: usize,
    dim: usize,
    reps: usize,
    seed: u64,
) -> Result<AggregateReport, CpuOpsError> {
    let arg = |name: &'static str, reason: &str| CpuOpsError::InvalidArgument {
        name,
        reason: reason.into(),
    };
    if reps == 0 {
        return Err(arg("reps", "expected at least 1"));
    }
    if fanout == 0 || dim == 0 || num_dst == 0 {
        return Err(arg("fanout, dim, num_dst", "expected at least 1 each"));
    }
    if num_src < num_dst || num_src > u32::MAX as usize {
        return Err(arg("num_src", "expected num_dst ≤ num_src < 2³²"));
    }
    let edges = num_dst
        .checked_mul(fanout)
        .ok_or_else(|| arg("num_dst × fanout", "overflows"))?;
    let src_values = num_src
        .checked_mul(dim)
        .ok_or_else(|| arg("num_src × dim", "overflows"))?;

    // 1. Data: the block in both numberings, features, the copy buffers.
    let indptr: Vec<u64> = (0..=num_dst).map(|i| (i * fanout) as u64).collect();
    let random = random_indices(num_dst, fanout, num_src, seed);
    let seen = first_seen(num_dst, num_src, &random);
    let mut read = vec![false; num_src];
    for &j in &random {
        read[j as usize] = true;
    }
    let distinct_src_read = read.iter().filter(|&&r| r).count();
    drop(read);
    let orders = [SourceOrder::Random, SourceOrder::FirstSeen];
    let mut transpose_s = f64::INFINITY;
    let mut blocks = Vec::new();
    for indices in [&random, &seen] {
        for _ in 0..reps {
            let b = BlockView::new(num_src, &indptr, indices)?;
            let t = Instant::now();
            b.prepare_transpose();
            transpose_s = transpose_s.min(t.elapsed().as_secs_f64());
        }
        let b = BlockView::new(num_src, &indptr, indices)?;
        b.prepare_transpose();
        blocks.push(b);
    }
    let x: Vec<f32> = (0..src_values)
        .into_par_iter()
        .map(|k| (k % 1021) as f32 * 1e-3)
        .collect();
    let grad_out: Vec<f32> = (0..num_dst * dim)
        .into_par_iter()
        .map(|k| (k % 977) as f32 * 1e-3)
        .collect();
    let mut out = vec![0f32; num_dst * dim];
    let mut grad_x = vec![0f32; src_values];
    let copy_src: Vec<u8> = (0..copy_bytes).into_par_iter().map(|i| i as u8).collect();
    let mut copy_dst = vec![0u8; copy_bytes];

    // 2. Rounds: every operation once per round (round 0 warms up), so that load
    //    from other processes spreads over all of them alike.
    let best = Simd::detect();
    let mut levels = vec![best];
    if best.level() != SimdLevel::Scalar {
        levels.push(Simd::scalar());
    }
    let mut ops = vec![Op::Copy];
    for o in 0..orders.len() {
        for &simd in &levels {
            ops.push(Op::Forward(o, simd));
            ops.push(Op::Backward(o, simd));
        }
    }
    let mut secs = vec![Vec::with_capacity(reps); ops.len()];
    for round in 0..=reps {
        for (k, &op) in ops.iter().enumerate() {
            let t = Instant::now();
            match op {
                Op::Copy => copy_dst
                    .par_chunks_mut(1 << 20)
                    .zip(copy_src.par_chunks(1 << 20))
                    .for_each(|(d, s)| d.copy_from_slice(s)),
                Op::Forward(o, simd) => {
                    let kind = AggregateKind::Mean;
                    aggregate_forward_f32(simd, &blocks[o], kind, &x, dim, &mut out)?
                }
                Op::Backward(o, simd) => {
                    let kind = AggregateKind::Mean;
                    aggregate_backward_f32(simd, &blocks[o], kind, &grad_out, dim, &mut grad_x)?
                }
            }
            if round > 0 {
                secs[k].push(t.elapsed().as_secs_f64());
            }
        }
    }

    // 3. Bytes: rows read + rows written.
    let fwd_bytes = ((edges + num_dst) * dim * 4) as u64;
    let bwd_bytes = ((edges + num_src) * dim * 4) as u64;
    let mut copy = None;
    let mut passes = Vec::new();
    for (op, secs) in ops.into_iter().zip(secs) {
        match op {
            Op::Copy => copy = Some(timing(2 * copy_bytes as u64, secs)),
            Op::Forward(o, simd) | Op::Backward(o, simd) => {
                let fwd = matches!(op, Op::Forward(..));
                passes.push(PassTiming {
                    pass: if fwd { "forward" } else { "backward" },
                    order: orders[o],
                    level: simd.level(),
                    timing: timing(if fwd { fwd_bytes } else { bwd_bytes }, secs),
                });
            }
        }
    }
    let copy = copy.ok_or_else(|| arg("reps", "no copy measured"))?;
    Ok(AggregateReport {
        num_dst,
        fanout,
        num_src,
        distinct_src_read,
        dim,
        reps,
        threads: rayon::current_num_threads(),
        copy,
        transpose_s,
        passes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_run_reports_every_pass() {
        let r = run(1 << 20, 200, 5, 1000, 17, 1, 3).unwrap();
        let per_order = if SimdLevel::detected() == SimdLevel::Scalar {
            2
        } else {
            4
        };
        assert_eq!(r.passes.len(), 2 * per_order);
        assert!(r.copy.best_gbs() > 0.0 && r.passes.iter().all(|p| p.timing.best_s > 0.0));
        assert!(r.distinct_src_read > 500 && r.distinct_src_read <= 750);
        let table = r.to_string();
        assert!(table.contains("streaming copy") && table.contains("backward first-seen"));
        assert!(bench_aggregate(10, 5, 5, 8, 1, 0).is_err());
        assert!(bench_aggregate(10, 5, 50, 8, 0, 0).is_err());
    }

    #[test]
    fn first_seen_numbering_keeps_dsts_and_is_dense() {
        let idx = [5u32, 1, 5, 7, 0, 9];
        assert_eq!(first_seen(2, 10, &idx), [2, 1, 2, 3, 0, 4]);
    }
}
