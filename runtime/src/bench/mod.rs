//! Micro-benchmarks of the host kernels, as library functions that `tandem bench`
//! calls and prints.
//!
//! - [`bench_sample`]: layered neighbor sampling, in sampled edges per second;
//! - [`bench_gather`]: feature-row gather, in GB/s next to the machine's limits
//!   measured in the same run (a plain parallel row copy and a streaming memcpy);
//! - [`backend::bench_backend`]: sampling, cached/uncached gather and GEMM on an
//!   accelerator backend, next to a device-to-device copy;
//! - [`hot::bench_hot`]: hot vertices' layer-0 rows, the generic sample + gather +
//!   layer path against the fused [`cpu_ops::SageHotKernel`], per worker;
//! - [`orchestration::bench_orchestration`]: one training config under the five
//!   placements (epoch time, busy fractions, host → device bytes, accuracy);
//! - [`regimes::bench_regimes`]: the placements across device-cache sizes and
//!   feature widths on generated R-MAT graphs, with layer-based's speed-up over
//!   the best step-based placement per regime;
//! - [`scale::bench_scale`]: one large generated graph end to end (generation,
//!   store, training, evaluation) with the time and peak memory of each phase.
//!
//! They time real work on the caller's data, on rayon's current pool, and return a
//! report whose `Display` is a short table. Nothing is printed while they run.

pub mod aggregate;
pub mod backend;
mod gather;
pub mod gemm;
pub mod hot;
pub mod orchestration;
pub mod regimes;
mod sample;
pub mod scale;

pub use gather::bench_gather;
pub use sample::bench_sample;

use std::time::Duration;

/// The median of `times` (the upper one for an even count); zero when empty.
pub(crate) fn median(times: &[Duration]) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

/// `amount / time`, or 0 for a zero time.
pub(crate) fn per_second(amount: f64, time: Duration) -> f64 {
    let secs = time.as_secs_f64();
    if secs > 0.0 {
        amount / secs
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use cpu_ops::{BuildOptions, CsrGraph, FeatureMatrix, Rng};
    use rayon::prelude::*;

    use super::*;

    /// The reference workload of the sampling and gather targets: a uniform random
    /// graph of 1M vertices and 12.5M random pairs (about 25M stored edges), fanouts
    /// [25, 10, 5], batch 1024, and a 1M × 128 `f32` feature matrix. Run with
    /// `cargo test --release -p runtime reference_workload -- --ignored --nocapture`.
    #[test]
    #[ignore = "a benchmark: about a minute and 1 GB of memory"]
    fn reference_workload() {
        const N: usize = 1_000_000;
        let mut r = Rng::new(42);
        let edges: Vec<(u32, u32)> = (0..12_500_000)
            .map(|_| (r.below(N as u64) as u32, r.below(N as u64) as u32))
            .collect();
        let graph = CsrGraph::from_edges(N, &edges, BuildOptions::UNDIRECTED).unwrap();
        drop(edges);
        for threads in [1, rayon::current_num_threads()] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let report = pool.install(|| bench_sample(&graph, &[25, 10, 5], 1024, 100, 1));
            println!("{}", report.unwrap());
        }
        drop(graph);
        let data: Vec<f32> = (0..N * 128)
            .into_par_iter()
            .map(|i| (i % 1021) as f32)
            .collect();
        let features = FeatureMatrix::new(data.into(), N, 128).unwrap();
        for rows in [100_000, 750_000] {
            println!("{}", bench_gather(&features, rows, 4, 1).unwrap());
        }
    }
}
