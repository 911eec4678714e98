//! `tandem bench hot`: hot vertices' layer-0 rows on the CPU, the generic path
//! against the fused kernel, timed side by side in the same run.
//!
//! The destinations are the `rows` highest-degree vertices of the graph (the ones
//! layer-based orchestration keeps hot), cut into chunks of `chunk` as the CPU
//! workers take them, and the layer is GraphSAGE-mean `dim → hidden` with ReLU
//! (layer 0 of a 2-layer model). Each repetition times, in alternating order:
//!
//! 1. **old**: what the hot computation does per chunk for GCN and GAT: one-hop
//!    [`NeighborSampler::sample`], [`gather_rows`] of every source, the generic
//!    layer 0 on the host backend ([`Layer0::rows`], the layer the model trains,
//!    which projects every source when `dim > hidden`), and a copy into the
//!    output rows;
//! 2. **fused**: [`SageHotKernel::compute_profiled`] writing into the output rows;
//! 3. with `bf16` (`--dtype bf16`), **fused-bf16**: the same kernel reading the
//!    bfloat16 copy of the rows ([`HotFeatures::Bf16`], what the CPU workers read
//!    when `device.feature_dtype = "bf16"`), and its speed-up over **fused** (the
//!    previous kernel, `f32` rows) in the same run.
//!
//! Both run on a pool of `threads` threads, one chunk per task (so `threads = 1`
//! gives one worker's throughput). Reported per path: µs per row per worker, rows/s,
//! GB/s of feature bytes (sampled neighbors + self, `dim · 4` each: the bytes the
//! layer needs, whatever a path actually copies) and GFLOP/s of the layer's GEMM
//! (`2 · rows · 2·dim · hidden`, the aggregate-first count, for both paths), then the
//! fused kernel's phases (draw, aggregate, project) with the aggregate phase's GB/s
//! and the project phase's GFLOP/s next to the FMA peak of `threads` cores measured
//! in the same run: whichever phase dominates says whether memory or FLOPs bound it.
//! The two paths' outputs are compared once (largest relative difference; the
//! bfloat16 path against **fused**, so it shows the inputs' rounding).
//!
//! Memory bandwidth: a plain streaming read (sum of 256 MiB of `u64`, best of 3,
//! on the same `threads` threads) is measured in the same run, and each path's
//! GB/s (bytes the layer needs in the path's row dtype) is printed as a share of it.

use parking_lot::Mutex;
use std::fmt;
use std::time::{Duration, Instant};

use cpu_ops::{
    gather_rows, Bf16Rows, BlockView, CsrGraph, FeatureMatrix, HotFeatures, HotProfile, HotRequest,
    ModelConfig, ModelInput, ModelKind, NeighborSampler, SageHotKernel, SamplerScratch,
};
use gpu_ops::{GpuOpsError, HostBackend, Layer0, ModelLayout};
use rayon::prelude::*;

use super::gemm::{fma_peak, FmaPeak};
use super::{median, per_second};
use crate::error::{Error, Result};

/// What to measure.
#[derive(Clone, Debug)]
pub struct HotBenchOptions {
    /// Output width of layer 0.
    pub hidden: usize,
    /// Bottom-layer fanout.
    pub fanout: u32,
    /// Hot destinations (the highest-degree vertices).
    pub rows: usize,
    /// Destinations per worker task (the orchestrator's hot chunk).
    pub chunk: usize,
    /// Worker threads.
    pub threads: usize,
    /// Timed repetitions (after one warm-up).
    pub reps: usize,
    /// Destinations per GEMM block of the fused kernel (`None`: its default).
    pub block_rows: Option<usize>,
    /// Seed of the model and of the sampling.
    pub seed: u64,
    /// Also time the fused kernel on bfloat16 rows (`--dtype bf16`).
    pub bf16: bool,
}

/// One path's times.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PathTiming {
    /// Fastest repetition.
    pub best: Duration,
    /// Median repetition.
    pub median: Duration,
}

/// What [`bench_hot`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct HotReport {
    /// Feature columns (`d_in`).
    pub dim: usize,
    /// `d_out`.
    pub hidden: usize,
    /// Fanout.
    pub fanout: u32,
    /// Destinations.
    pub rows: usize,
    /// Smallest degree among them.
    pub min_degree: usize,
    /// Destinations per task.
    pub chunk: usize,
    /// Worker threads.
    pub threads: usize,
    /// Timed repetitions.
    pub reps: usize,
    /// The fused kernel's block rows and SIMD level.
    pub block_rows: usize,
    /// The SIMD level of the fused kernel's aggregation.
    pub simd: &'static str,
    /// Feature bytes the layer needs: `(sampled neighbors + rows) · dim · 4`.
    pub feature_bytes: u64,
    /// GEMM FLOPs of the layer, aggregate first: `2 · rows · 2·dim · hidden`.
    pub flops: f64,
    /// The generic path.
    pub old: PathTiming,
    /// The fused kernel.
    pub fused: PathTiming,
    /// The fused kernel's phases in its best repetition, summed over workers.
    pub phases: HotProfile,
    /// FMA peak of `threads` cores.
    pub peak: FmaPeak,
    /// Largest `|fused − old| / (1 + |old|)` over the output.
    pub max_rel_diff: f64,
    /// The fused kernel on bfloat16 rows (`bf16`).
    pub fused_bf16: Option<PathTiming>,
    /// Its phases in its best repetition, summed over workers.
    pub bf16_phases: HotProfile,
    /// Largest `|bf16 − fused| / (1 + |fused|)` (the rounding of the inputs).
    pub bf16_rel_diff: f64,
    /// Streaming read bandwidth of `threads` threads, GB/s.
    pub stream_gbs: f64,
}

impl HotReport {
    fn line(
        &self,
        f: &mut fmt::Formatter<'_>,
        name: &str,
        t: &PathTiming,
        value_bytes: u64,
    ) -> fmt::Result {
        let us_per_row = t.best.as_secs_f64() * 1e6 * self.threads as f64 / self.rows.max(1) as f64;
        let gbs = per_second((self.feature_bytes / 4 * value_bytes) as f64, t.best) / 1e9;
        writeln!(
            f,
            "{:<10} {:>10.3} {:>10.3} {:>12.0} {:>8.2} {:>7.0}% {:>9.1}",
            name,
            us_per_row,
            t.median.as_secs_f64() * 1e6 * self.threads as f64 / self.rows.max(1) as f64,
            per_second(self.rows as f64, t.best),
            gbs,
            100.0 * gbs / self.stream_gbs.max(1e-9),
            per_second(self.flops, t.best) / 1e9,
        )
    }

    fn phases_line(
        &self,
        f: &mut fmt::Formatter<'_>,
        name: &str,
        p: &HotProfile,
        value_bytes: u64,
    ) -> fmt::Result {
        let total = p.total().as_secs_f64().max(1e-12);
        let share = |d: Duration| 100.0 * d.as_secs_f64() / total;
        let project_gflops = per_second(self.flops, p.project) / 1e9 * self.threads as f64;
        writeln!(
            f,
            "{name} phases (worker time, block rows {}, aggregation {}): draw {:.0}%, \
             aggregate {:.0}% at {:.2} GB/s, project {:.0}% at {:.1} GFLOP/s \
             ({:.0}% of the {}-core {} FMA peak {:.1})",
            self.block_rows,
            self.simd,
            share(p.draw),
            share(p.aggregate),
            per_second((self.feature_bytes / 4 * value_bytes) as f64, p.aggregate) / 1e9,
            share(p.project),
            project_gflops,
            100.0 * project_gflops / self.peak.gflops.max(1e-9),
            self.threads,
            self.peak.isa,
            self.peak.gflops
        )
    }
}

impl fmt::Display for HotReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "SAGE layer 0, {} → {} with ReLU, fanout {}, {} hot rows (degree ≥ {}), \
             chunks of {}, {} thread(s), best / median of {}",
            self.dim,
            self.hidden,
            self.fanout,
            self.rows,
            self.min_degree,
            self.chunk,
            self.threads,
            self.reps
        )?;
        writeln!(
            f,
            "per row: {:.1} KB of features, {:.3} MFLOP of GEMM",
            self.feature_bytes as f64 / self.rows.max(1) as f64 / 1e3,
            self.flops / self.rows.max(1) as f64 / 1e6
        )?;
        writeln!(
            f,
            "memory: streaming read {:.1} GB/s on {} thread(s) (GB/s below: bytes the layer \
             needs in the path's row dtype; %: of the streaming read)",
            self.stream_gbs, self.threads
        )?;
        writeln!(
            f,
            "{:<10} {:>10} {:>10} {:>12} {:>8} {:>8} {:>9}",
            "path", "µs/row", "med µs/row", "rows/s", "GB/s", "of read", "GFLOP/s"
        )?;
        self.line(f, "old", &self.old, 4)?;
        self.line(f, "fused", &self.fused, 4)?;
        if let Some(b) = &self.fused_bf16 {
            self.line(f, "fused-bf16", b, 2)?;
        }
        writeln!(
            f,
            "speed-up fused vs old: {:.2}× (best), {:.2}× (median)",
            self.old.best.as_secs_f64() / self.fused.best.as_secs_f64().max(1e-12),
            self.old.median.as_secs_f64() / self.fused.median.as_secs_f64().max(1e-12)
        )?;
        if let Some(b) = &self.fused_bf16 {
            writeln!(
                f,
                "speed-up fused-bf16 vs fused (f32 rows, the previous kernel): {:.2}× (best), \
                 {:.2}× (median)",
                self.fused.best.as_secs_f64() / b.best.as_secs_f64().max(1e-12),
                self.fused.median.as_secs_f64() / b.median.as_secs_f64().max(1e-12)
            )?;
        }
        self.phases_line(f, "fused", &self.phases, 4)?;
        if self.fused_bf16.is_some() {
            self.phases_line(f, "fused-bf16", &self.bf16_phases, 2)?;
            writeln!(
                f,
                "bf16 rounding: max |fused-bf16 − fused| / (1 + |fused|) = {:.1e}",
                self.bf16_rel_diff
            )?;
        }
        write!(
            f,
            "outputs agree: max |fused − old| / (1 + |old|) = {:.1e}",
            self.max_rel_diff
        )
    }
}

/// The `rows` highest-degree vertices, highest first (ties by id).
fn hottest(graph: &CsrGraph, rows: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..graph.num_vertices() as u32).collect();
    let key = |v: &u32| (std::cmp::Reverse(graph.degree(*v)), *v);
    if rows < ids.len() {
        ids.select_nth_unstable_by_key(rows, key);
        ids.truncate(rows);
    }
    ids.sort_unstable_by_key(key);
    ids
}

/// One worker thread's reusable state for both paths.
struct Worker {
    scratch: SamplerScratch,
    buf: Vec<f32>,
    kernel: SageHotKernel,
    host: HostBackend,
    layer: Layer0<HostBackend>,
}

/// A host-backend error of the generic path.
fn device_err(context: &'static str) -> impl Fn(GpuOpsError) -> Error {
    move |source| Error::device(context, source)
}

/// The generic path over one chunk, into its output rows.
fn old_chunk(
    graph: &CsrGraph,
    features: &FeatureMatrix,
    sampler: &NeighborSampler,
    chunk: &[u32],
    seed: u64,
    w: &mut Worker,
    out: &mut [f32],
) -> Result<()> {
    let cpu = |e| Error::cpu_ops("old hot path", e);
    let batch = sampler
        .sample(graph, chunk, seed, &mut w.scratch)
        .map_err(cpu)?;
    let ids = batch.input_ids();
    w.buf.resize(ids.len() * features.dim(), 0.0);
    gather_rows(features, ids, &mut w.buf).map_err(cpu)?;
    let b = &batch.blocks()[0];
    let view = BlockView::new(b.num_src(), b.indptr(), b.indices()).map_err(cpu)?;
    let rows = w
        .layer
        .rows(&w.host, &view, ModelInput::Dense(&w.buf))
        .map_err(device_err("old hot path"))?;
    out.copy_from_slice(&rows);
    Ok(())
}

/// Times the generic path and the fused kernel on the hottest `o.rows` vertices of
/// `graph` (module doc). Runs on a pool of `o.threads` threads of its own.
pub fn bench_hot(
    graph: &CsrGraph,
    features: &FeatureMatrix,
    o: &HotBenchOptions,
) -> Result<HotReport> {
    let bad = |name: &str, reason: &str| Err(Error::invalid_argument(name, reason));
    if o.rows == 0 || o.rows > graph.num_vertices() {
        return bad("--rows", "expected 1 ..= the number of vertices");
    }
    if o.chunk == 0 || o.threads == 0 || o.reps == 0 || o.hidden == 0 {
        return bad(
            "--chunk/--threads/--reps/--hidden",
            "expected at least 1 each",
        );
    }
    let kernel_err = |what: &'static str| move |e| Error::cpu_ops(what, e);
    let dim = features.dim();
    let cfg = ModelConfig {
        kind: ModelKind::Sage,
        in_dim: dim,
        hidden: o.hidden,
        num_classes: 16,
        num_layers: 2,
        heads: 1,
        dropout: 0.0,
    };
    // Layer 0's tensors of the model `DeviceModel::new(cfg, seed)` trains from.
    let layout = ModelLayout::new(&cfg).map_err(device_err("hot bench model"))?;
    let range = layout
        .layer_params(0)
        .map_err(device_err("hot bench model"))?;
    let tensors = layout.init_params(o.seed)[range].to_vec();
    let mut kernel =
        SageHotKernel::new(&tensors, dim, o.hidden).map_err(kernel_err("hot kernel weights"))?;
    if let Some(r) = o.block_rows {
        kernel
            .set_block_rows(r)
            .map_err(kernel_err("--block-rows"))?;
    }
    let sampler = NeighborSampler::new(vec![o.fanout]).map_err(kernel_err("--fanout"))?;
    let dst = hottest(graph, o.rows);
    let min_degree = dst.last().map_or(0, |&v| graph.degree(v));
    let sampled: u64 = dst
        .iter()
        .map(|&v| graph.degree(v).min(o.fanout as usize) as u64 + 1)
        .sum();
    let feature_bytes = sampled * dim as u64 * 4;
    let flops = 2.0 * o.rows as f64 * 2.0 * dim as f64 * o.hidden as f64;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(o.threads)
        .build()
        .map_err(|e| Error::invalid_argument("--threads", e.to_string()))?;
    let n = graph.num_vertices();
    let d_out = o.hidden;
    let chunk_seed = |c: usize| o.seed.wrapping_add(c as u64);

    // Per-worker state lives across repetitions, as a CPU worker's does, so no
    // timed run pays for first-touch allocations.
    let workers: Vec<Mutex<Worker>> = (0..o.threads)
        .map(|_| -> Result<Mutex<Worker>> {
            let host = HostBackend::new();
            let layer = Layer0::new(&host, &cfg, &tensors).map_err(device_err("hot layer 0"))?;
            Ok(Mutex::new(Worker {
                scratch: SamplerScratch::new(n),
                buf: Vec::new(),
                kernel: kernel.clone(),
                host,
                layer,
            }))
        })
        .collect::<Result<_>>()?;
    let worker = || {
        let i = rayon::current_thread_index().unwrap_or(0) % workers.len();
        workers[i].lock()
    };
    let run_old = |out: &mut [f32]| -> Result<Duration> {
        let t = Instant::now();
        out.par_chunks_mut(o.chunk * d_out)
            .zip(dst.par_chunks(o.chunk))
            .enumerate()
            .try_for_each(|(c, (out, chunk))| {
                old_chunk(
                    graph,
                    features,
                    &sampler,
                    chunk,
                    chunk_seed(c),
                    &mut worker(),
                    out,
                )
            })?;
        Ok(t.elapsed())
    };
    let bf16_bits: Vec<u16> = if o.bf16 {
        gpu_ops::to_bf16_bits(features.as_slice())
    } else {
        Vec::new()
    };
    let run_fused = |out: &mut [f32], rows: HotFeatures<'_>| -> Result<(Duration, HotProfile)> {
        let t = Instant::now();
        let profiles = out
            .par_chunks_mut(o.chunk * d_out)
            .zip(dst.par_chunks(o.chunk))
            .enumerate()
            .map(|(c, (out, chunk))| {
                let req = HotRequest {
                    graph,
                    features: rows,
                    dst: chunk,
                    fanout: o.fanout,
                    seed: chunk_seed(c),
                    relu: true,
                };
                worker().kernel.compute_profiled(req, out)
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(kernel_err("fused hot kernel"))?;
        let elapsed = t.elapsed();
        let mut sum = HotProfile::default();
        for p in &profiles {
            sum.add(p);
        }
        Ok((elapsed, sum))
    };

    let f32_rows = HotFeatures::F32(features);
    let bf16_rows = HotFeatures::Bf16(Bf16Rows {
        data: &bf16_bits,
        dim,
    });
    pool.install(|| -> Result<HotReport> {
        let peak = fma_peak();
        let stream_gbs = stream_read_gbs();
        let mut old_out = vec![0f32; o.rows * d_out];
        let mut fused_out = vec![0f32; o.rows * d_out];
        let mut bf16_out = vec![0f32; o.rows * d_out];
        // Warm-up, and the one comparison of the outputs.
        run_old(&mut old_out)?;
        run_fused(&mut fused_out, f32_rows)?;
        let rel = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(&a, &b)| ((a - b).abs() / (1.0 + a.abs())) as f64)
                .fold(0.0, f64::max)
        };
        let max_rel_diff = rel(&old_out, &fused_out);
        let bf16_rel_diff = if o.bf16 {
            run_fused(&mut bf16_out, bf16_rows)?;
            rel(&fused_out, &bf16_out)
        } else {
            0.0
        };
        let (mut old_times, mut fused_times, mut bf16_times) = (Vec::new(), Vec::new(), Vec::new());
        let mut best_phases: Option<(Duration, HotProfile)> = None;
        let mut best_bf16: Option<(Duration, HotProfile)> = None;
        for rep in 0..o.reps {
            // Each path in turn, the order rotating per repetition.
            for path in (0..3).map(|i| (i + rep) % 3) {
                match path {
                    0 => old_times.push(run_old(&mut old_out)?),
                    1 => {
                        let (t, p) = run_fused(&mut fused_out, f32_rows)?;
                        fused_times.push(t);
                        if best_phases.is_none_or(|(b, _)| t < b) {
                            best_phases = Some((t, p));
                        }
                    }
                    _ if o.bf16 => {
                        let (t, p) = run_fused(&mut bf16_out, bf16_rows)?;
                        bf16_times.push(t);
                        if best_bf16.is_none_or(|(b, _)| t < b) {
                            best_bf16 = Some((t, p));
                        }
                    }
                    _ => {}
                }
            }
        }
        let timing = |t: &[Duration]| PathTiming {
            best: t.iter().copied().min().unwrap_or_default(),
            median: median(t),
        };
        Ok(HotReport {
            dim,
            hidden: o.hidden,
            fanout: o.fanout,
            rows: o.rows,
            min_degree,
            chunk: o.chunk,
            threads: o.threads,
            reps: o.reps,
            block_rows: kernel.block_rows(),
            simd: kernel.simd().level().name(),
            feature_bytes,
            flops,
            old: timing(&old_times),
            fused: timing(&fused_times),
            phases: best_phases.map(|(_, p)| p).unwrap_or_default(),
            peak,
            max_rel_diff,
            fused_bf16: o.bf16.then(|| timing(&bf16_times)),
            bf16_phases: best_bf16.map(|(_, p)| p).unwrap_or_default(),
            bf16_rel_diff,
            stream_gbs,
        })
    })
}

/// Streaming read bandwidth of the current rayon pool, GB/s: the best of 3 sums of
/// 256 MiB of `u64` (written once first, so the pages exist), one slice per thread.
fn stream_read_gbs() -> f64 {
    const WORDS: usize = 32 << 20;
    let data: Vec<u64> = (0..WORDS as u64).into_par_iter().collect();
    let per = WORDS.div_ceil(rayon::current_num_threads().max(1));
    (0..3)
        .map(|_| {
            let t = Instant::now();
            let sum: u64 = data
                .par_chunks(per)
                .map(|c| c.iter().fold(0u64, |s, &x| s.wrapping_add(x)))
                .reduce(|| 0, u64::wrapping_add);
            std::hint::black_box(sum);
            per_second((WORDS * 8) as f64, t.elapsed()) / 1e9
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use cpu_ops::{BuildOptions, Rng};

    use super::*;

    #[test]
    fn small_run_agrees_and_reports() {
        let n = 3000;
        let mut r = Rng::new(1);
        let edges: Vec<(u32, u32)> = (0..30_000)
            .map(|_| (r.below(n as u64) as u32, r.below(n as u64 / 4) as u32))
            .collect();
        let g = CsrGraph::from_edges(n, &edges, BuildOptions::UNDIRECTED).unwrap();
        let data: Vec<f32> = (0..n * 24).map(|_| r.next_f32() - 0.5).collect();
        let f = FeatureMatrix::new(data.into(), n, 24).unwrap();
        let o = HotBenchOptions {
            hidden: 16,
            fanout: 10,
            rows: 700,
            chunk: 256,
            threads: 2,
            reps: 1,
            block_rows: Some(32),
            seed: 3,
            bf16: true,
        };
        let report = bench_hot(&g, &f, &o).unwrap();
        assert!(report.max_rel_diff < 1e-4, "{report}");
        assert_eq!(report.block_rows, 32);
        let hot = hottest(&g, 700);
        assert!(hot.windows(2).all(|w| g.degree(w[0]) >= g.degree(w[1])));
        assert_eq!(report.min_degree, g.degree(hot[699]));
        let text = report.to_string();
        assert!(text.contains("speed-up fused vs old"), "{text}");
        assert!(text.contains("speed-up fused-bf16 vs fused"), "{text}");
        assert!(report.fused_bf16.is_some() && report.stream_gbs > 0.0);
        // bfloat16 inputs in [-0.5, 0.5) move the outputs by rounding only.
        assert!(
            report.bf16_rel_diff > 0.0 && report.bf16_rel_diff < 0.05,
            "{text}"
        );
        assert!(bench_hot(&g, &f, &HotBenchOptions { rows: 0, ..o }).is_err());
    }
}
