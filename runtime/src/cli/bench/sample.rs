//! `tandem bench sample`: throughput of layered neighbor sampling.

use std::fmt;
use std::time::{Duration, Instant};

use cpu_ops::{CsrGraph, NeighborSampler, Rng, SampledBatch, SamplerScratch};

use super::{median, per_second};
use crate::error::{Error, Result};

/// Untimed batches run first (they size the reusable buffers).
const WARMUP_BATCHES: usize = 2;

/// What [`bench_sample`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleReport {
    /// Fanouts, bottom layer first.
    pub fanouts: Vec<u32>,
    /// Seeds per batch.
    pub batch_size: usize,
    /// Timed batches.
    pub batches: usize,
    /// Threads of the rayon pool it ran on.
    pub threads: usize,
    /// Vertices of the graph.
    pub graph_vertices: usize,
    /// Stored (directed) edges of the graph.
    pub graph_edges: usize,
    /// Sum of the timed batches' sampling times.
    pub total_time: Duration,
    /// Median time of one batch.
    pub median_batch_time: Duration,
    /// Fastest batch.
    pub min_batch_time: Duration,
    /// Sampled edges over all timed batches and layers.
    pub sampled_edges: u64,
    /// Input vertices (bottom block sources) summed over the timed batches.
    pub input_vertices: u64,
    /// Per-layer means, bottom layer first.
    pub layers: Vec<SampleLayerStats>,
}

/// Mean sizes of one layer's block over the timed batches.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleLayerStats {
    /// Mean destination vertices.
    pub mean_dst: f64,
    /// Mean source vertices (destinations included).
    pub mean_src: f64,
    /// Mean sampled edges.
    pub mean_edges: f64,
}

impl SampleReport {
    /// Sampled edges per second.
    pub fn edges_per_second(&self) -> f64 {
        per_second(self.sampled_edges as f64, self.total_time)
    }

    /// Batches per second.
    pub fn batches_per_second(&self) -> f64 {
        per_second(self.batches as f64, self.total_time)
    }

    /// Mean input vertices per batch (rows the gather step will copy).
    pub fn mean_input_vertices(&self) -> f64 {
        self.input_vertices as f64 / self.batches.max(1) as f64
    }

    /// Mean sampled edges per batch.
    pub fn mean_edges(&self) -> f64 {
        self.sampled_edges as f64 / self.batches.max(1) as f64
    }
}

impl fmt::Display for SampleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "neighbor sampling: fanouts {:?}, batch {}, {}, {}",
            self.fanouts,
            self.batch_size,
            crate::trace::fmt_count(self.batches, "batch"),
            crate::trace::fmt_count(self.threads, "thread")
        )?;
        writeln!(
            f,
            "  graph          {} vertices, {} stored edges",
            self.graph_vertices, self.graph_edges
        )?;
        writeln!(
            f,
            "  time           {:.3} s total, {:.2} ms/batch median, {:.2} ms min",
            self.total_time.as_secs_f64(),
            self.median_batch_time.as_secs_f64() * 1e3,
            self.min_batch_time.as_secs_f64() * 1e3
        )?;
        writeln!(
            f,
            "  throughput     {:.1} M sampled edges/s, {:.1} batches/s",
            self.edges_per_second() / 1e6,
            self.batches_per_second()
        )?;
        writeln!(
            f,
            "  per batch      {:.0} sampled edges, {:.0} input vertices",
            self.mean_edges(),
            self.mean_input_vertices()
        )?;
        writeln!(
            f,
            "  {:<6} {:>7} {:>12} {:>12} {:>12}",
            "layer", "fanout", "dst", "src", "edges"
        )?;
        for (i, l) in self.layers.iter().enumerate() {
            let fanout = match self.fanouts.get(i) {
                Some(&cpu_ops::ALL_NEIGHBORS) => "all".to_string(),
                Some(x) => x.to_string(),
                None => "?".to_string(),
            };
            writeln!(
                f,
                "  {:<6} {:>7} {:>12.0} {:>12.0} {:>12.0}",
                i, fanout, l.mean_dst, l.mean_src, l.mean_edges
            )?;
        }
        Ok(())
    }
}

/// Samples `batches` batches of `batch_size` distinct random seeds (a shuffled
/// vertex order, reshuffled when used up, like training epochs) with `fanouts`, on
/// rayon's current pool, reusing one scratch and one output batch as a training loop
/// would. Only the sampling calls are timed, after a short warm-up.
pub fn bench_sample(
    graph: &CsrGraph,
    fanouts: &[u32],
    batch_size: usize,
    batches: usize,
    seed: u64,
) -> Result<SampleReport> {
    let n = graph.num_vertices();
    if batch_size == 0 || batch_size > n {
        return Err(Error::invalid_argument(
            "batch_size",
            format!("must be between 1 and the number of vertices ({n}), got {batch_size}"),
        ));
    }
    if batches == 0 {
        return Err(Error::invalid_argument("batches", "must be at least 1"));
    }
    let sampler =
        NeighborSampler::new(fanouts.to_vec()).map_err(|e| Error::cpu_ops("bench sample", e))?;
    let mut rng = Rng::new(seed);
    let mut order: Vec<u32> = (0..n as u32).collect();
    rng.shuffle(&mut order);
    let per_epoch = n / batch_size;
    let mut scratch = SamplerScratch::new(n);
    let mut out = SampledBatch::default();
    let mut times = Vec::with_capacity(batches);
    let mut sampled_edges = 0u64;
    let mut input_vertices = 0u64;
    let mut layers = vec![(0f64, 0f64, 0f64); sampler.num_layers()];
    for b in 0..WARMUP_BATCHES + batches {
        let slot = b % per_epoch;
        if slot == 0 && b > 0 {
            rng.shuffle(&mut order);
        }
        let seeds = &order[slot * batch_size..(slot + 1) * batch_size];
        let start = Instant::now();
        sampler
            .sample_into(
                graph,
                seeds,
                seed.wrapping_add(b as u64),
                &mut scratch,
                &mut out,
            )
            .map_err(|e| Error::cpu_ops("bench sample", e))?;
        let elapsed = start.elapsed();
        if b < WARMUP_BATCHES {
            continue;
        }
        times.push(elapsed);
        sampled_edges += out.num_sampled_edges() as u64;
        input_vertices += out.input_ids().len() as u64;
        for (acc, block) in layers.iter_mut().zip(out.blocks()) {
            acc.0 += block.num_dst() as f64;
            acc.1 += block.num_src() as f64;
            acc.2 += block.num_edges() as f64;
        }
    }
    let k = batches as f64;
    Ok(SampleReport {
        fanouts: fanouts.to_vec(),
        batch_size,
        batches,
        threads: rayon::current_num_threads(),
        graph_vertices: n,
        graph_edges: graph.num_edges(),
        total_time: times.iter().sum(),
        median_batch_time: median(&times),
        min_batch_time: times.iter().min().copied().unwrap_or_default(),
        sampled_edges,
        input_vertices,
        layers: layers
            .into_iter()
            .map(|(d, s, e)| SampleLayerStats {
                mean_dst: d / k,
                mean_src: s / k,
                mean_edges: e / k,
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpu_ops::BuildOptions;

    fn small_graph() -> CsrGraph {
        let mut r = Rng::new(1);
        let edges: Vec<(u32, u32)> = (0..5000)
            .map(|_| (r.below(1000) as u32, r.below(1000) as u32))
            .collect();
        CsrGraph::from_edges(1000, &edges, BuildOptions::UNDIRECTED).unwrap()
    }

    #[test]
    fn bench_sample_runs_and_reports() {
        let g = small_graph();
        // More batches than one epoch holds, to cover the reshuffle.
        let report = bench_sample(&g, &[5, 3], 64, 20, 7).unwrap();
        assert_eq!(report.batches, 20);
        assert_eq!(report.layers.len(), 2);
        assert!(report.sampled_edges > 0);
        assert_eq!(report.layers[1].mean_dst, 64.0);
        assert!(report.mean_input_vertices() >= 64.0);
        let text = report.to_string();
        assert!(text.contains("sampled edges/s"), "{text}");
        assert!(text.contains("layer"), "{text}");
    }

    #[test]
    fn bench_sample_rejects_bad_arguments() {
        let g = small_graph();
        assert!(bench_sample(&g, &[5], 0, 1, 0).is_err());
        assert!(bench_sample(&g, &[5], 1001, 1, 0).is_err());
        assert!(bench_sample(&g, &[5], 10, 0, 0).is_err());
        assert!(bench_sample(&g, &[], 10, 1, 0).is_err());
        assert!(bench_sample(&g, &[0], 10, 1, 0).is_err());
    }
}
