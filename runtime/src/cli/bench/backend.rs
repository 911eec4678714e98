//! `tandem bench backend`: the accelerator's sample, gather and GEMM throughput on
//! one backend (`--device host | cuda`), each next to a reference measured in the
//! same run on the same device.
//!
//! 1. **sampling**: [`Sampling::sample`](gpu_ops::Sampling::sample) of `batches` random
//!    seed batches with the given fanouts on a graph loaded with
//!    [`Sampling::load_graph`](gpu_ops::Sampling::load_graph); sampled edges per
//!    second.
//! 2. **gather**: [`FeatureStore::gather`](gpu_ops::FeatureStore::gather) of the same
//!    random rows three ways — with every row in the device cache (hits), with an empty
//!    cache (every row read from host memory: zero-copy over the bus on CUDA), and the
//!    reference, a device-to-device copy of as many bytes
//!    ([`DeviceMemory::copy`](gpu_ops::DeviceMemory::copy)); then the same two gathers
//!    from bfloat16 rows ([`gpu_ops::FeatureDtype::Bf16`]: half the bytes read, widened
//!    to `f32`), whose rate counts the `f32` rows delivered, so the ratio to the copy
//!    shows what halving the read bytes buys.
//! 3. **GEMM**: [`DenseOps::matmul`](gpu_ops::DenseOps::matmul) at a layer shape, in FLOP/s.
//!
//! Every number is the best of `reps` timed repetitions after one warm-up, timed
//! with the backend's events on its compute stream (host wall time on the host
//! backend).

use std::fmt;

use cpu_ops::{CsrGraph, FeatureMatrix, Rng};
use gpu_ops::{Backend, DevMat, FeatureDtype, GpuOpsError, TopologyPlacement};

use crate::error::{Error, Result};

/// What to measure.
#[derive(Clone, Debug)]
pub struct BackendBenchOptions {
    /// Seeds per sampling batch.
    pub batch_size: usize,
    /// Sampling batches per repetition.
    pub batches: usize,
    /// Fanouts, bottom first.
    pub fanouts: Vec<u32>,
    /// Rows gathered per repetition.
    pub gather_rows: usize,
    /// GEMM shape `m × k × n`.
    pub gemm: (usize, usize, usize),
    /// Timed repetitions.
    pub reps: usize,
    /// Seed of the random seeds and rows.
    pub seed: u64,
}

/// One measured quantity: best repetition's rate and its unit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    /// Units per second of the best repetition.
    pub per_sec: f64,
    /// Best repetition, milliseconds.
    pub best_ms: f64,
}

/// What [`bench_backend`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendReport {
    /// The device, in words.
    pub device: String,
    /// Sampled edges per second.
    pub sample_edges: Rate,
    /// Bytes per second gathering rows that are all cached on the device.
    pub gather_cached: Rate,
    /// Bytes per second gathering rows that are all read from host memory.
    pub gather_host: Rate,
    /// `f32` bytes per second delivered gathering from bfloat16 rows, all cached.
    pub gather_bf16_cached: Rate,
    /// The same with every bfloat16 row read from host memory.
    pub gather_bf16_host: Rate,
    /// Bytes per second of a device-to-device copy of the same size.
    pub copy_reference: Rate,
    /// FLOP per second of the GEMM.
    pub gemm_flops: Rate,
    /// FLOP per second of the same GEMM with TF32 products
    /// ([`gpu_ops::Precision::Tf32`]: tensor cores on a GPU; on the host, an
    /// emulation that rounds the inputs first, so slower).
    pub gemm_tf32_flops: Rate,
    /// The GEMM shape.
    pub gemm: (usize, usize, usize),
    /// Host synchronizations of one sampled batch (CUDA: one per layer; the
    /// host backend counts none).
    pub sample_syncs: u64,
    /// Host synchronizations of one gather (CUDA: none since the counters stay
    /// on the device).
    pub gather_syncs: u64,
    /// Layers of a sampled batch (the fanouts).
    pub layers: usize,
}

impl fmt::Display for BackendReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = |x: f64| x / self.copy_reference.per_sec.max(f64::MIN_POSITIVE);
        writeln!(f, "device: {}", self.device)?;
        writeln!(
            f,
            "op                       rate              best ms   vs d2d copy"
        )?;
        writeln!(
            f,
            "sample                   {:>8.1} M edges/s {:>9.3}",
            self.sample_edges.per_sec / 1e6,
            self.sample_edges.best_ms
        )?;
        for (name, x) in [
            ("gather (all cached)", self.gather_cached),
            ("gather (all from host)", self.gather_host),
            ("gather bf16 (cached)", self.gather_bf16_cached),
            ("gather bf16 (host)", self.gather_bf16_host),
            ("d2d copy (reference)", self.copy_reference),
        ] {
            writeln!(
                f,
                "{name:<24} {:>8.2} GB/s      {:>9.3}   {:>6.2}×",
                x.per_sec / 1e9,
                x.best_ms,
                r(x.per_sec)
            )?;
        }
        writeln!(
            f,
            "host syncs: {} per sampled batch ({}), {} per gather",
            self.sample_syncs,
            crate::trace::fmt_count(self.layers, "layer"),
            self.gather_syncs
        )?;
        let (m, k, n) = self.gemm;
        let shape = format!("{m}×{k}×{n}");
        writeln!(
            f,
            "gemm fp32 {shape:<14} {:>8.1} GFLOP/s   {:>9.3}",
            self.gemm_flops.per_sec / 1e9,
            self.gemm_flops.best_ms
        )?;
        write!(
            f,
            "gemm tf32 {shape:<14} {:>8.1} GFLOP/s   {:>9.3}   {:>6.2}× fp32",
            self.gemm_tf32_flops.per_sec / 1e9,
            self.gemm_tf32_flops.best_ms,
            self.gemm_tf32_flops.per_sec / self.gemm_flops.per_sec.max(f64::MIN_POSITIVE)
        )
    }
}

fn dev_err(context: &'static str) -> impl Fn(GpuOpsError) -> Error {
    move |source| Error::device(context, source)
}

/// Times `f` on `dev`'s compute stream `reps` times after one warm-up; returns the
/// best time in milliseconds.
fn time_best<B: Backend>(dev: &B, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let s = dev.stream();
        let start = dev.record_event(s).map_err(dev_err("event"))?;
        f()?;
        let end = dev.record_event(s).map_err(dev_err("event"))?;
        dev.synchronize(s).map_err(dev_err("synchronize"))?;
        let ms = f64::from(dev.elapsed_ms(&start, &end).map_err(dev_err("event"))?);
        best = best.min(ms);
    }
    Ok(best)
}

/// Host synchronizations of one call of `f` (the backend's transfer counter).
fn syncs_of<B: Backend>(dev: &B, f: impl FnOnce() -> Result<()>) -> Result<u64> {
    let before = dev.transfer_stats();
    f()?;
    Ok(dev.transfer_stats().since(&before).syncs)
}

fn rate(amount: f64, ms: f64) -> Rate {
    Rate {
        per_sec: if ms > 0.0 { amount / (ms / 1e3) } else { 0.0 },
        best_ms: ms,
    }
}

/// Runs the three measurements on `dev` for `graph` and `features`.
pub fn bench_backend<B: Backend>(
    dev: &B,
    graph: &CsrGraph,
    features: &FeatureMatrix,
    o: &BackendBenchOptions,
) -> Result<BackendReport> {
    let n = graph.num_vertices();
    if n == 0 || features.num_rows() != n {
        return Err(Error::invalid_argument(
            "bench backend",
            format!(
                "need a non-empty graph and one feature row per vertex ({n} vertices, {} rows)",
                features.num_rows()
            ),
        ));
    }
    let mut rng = Rng::new(o.seed);
    // 1. Sampling.
    let g = dev
        .load_graph(graph, TopologyPlacement::Device)
        .map_err(dev_err("loading the graph"))?;
    let seed_batches: Vec<Vec<u32>> = (0..o.batches.max(1))
        .map(|_| {
            let mut ids: Vec<u32> = (0..n as u32).collect();
            rng.shuffle(&mut ids);
            ids.truncate(o.batch_size.min(n));
            ids
        })
        .collect();
    let mut edges = 0usize;
    let mut counted = false;
    let ms = time_best(dev, o.reps, || {
        for (b, seeds) in seed_batches.iter().enumerate() {
            let batch = dev
                .sample(&g, seeds, &o.fanouts, o.seed + b as u64)
                .map_err(dev_err("sampling"))?;
            if !counted {
                edges += batch
                    .blocks
                    .iter()
                    .map(|bl| dev.block_shape(bl).2)
                    .sum::<usize>();
            }
        }
        counted = true;
        Ok(())
    })?;
    let sample_edges = rate(edges as f64, ms);
    let sample_syncs = syncs_of(dev, || {
        dev.sample(&g, &seed_batches[0], &o.fanouts, o.seed)
            .map(drop)
            .map_err(dev_err("sampling"))
    })?;

    // 2. Gather: all cached, none cached, and the d2d reference.
    let dim = features.dim();
    let rows = o.gather_rows.max(1);
    let ids: Vec<u32> = (0..rows).map(|_| rng.below(n as u64) as u32).collect();
    let ids_dev = dev.to_device(&ids).map_err(dev_err("ids"))?;
    let bytes = (rows * dim * 4) as f64;
    let mut out = dev
        .alloc::<f32>(rows * dim)
        .map_err(dev_err("gather output"))?;
    let everyone: Vec<u32> = (0..n as u32).collect();
    // (all cached, all from host) for each stored type.
    let mut gathers = [(0.0, 0.0); 2];
    let mut gather_syncs = 0;
    for (dtype, times) in [FeatureDtype::F32, FeatureDtype::Bf16]
        .into_iter()
        .zip(&mut gathers)
    {
        let all = dev
            .load_features(features, &everyone, n * dim * 4, dtype)
            .map_err(dev_err("loading features (cached)"))?;
        times.0 = time_best(dev, o.reps, || {
            dev.gather(&all, &ids_dev, rows, &mut out)
                .map_err(dev_err("gather"))
        })?;
        if dtype == FeatureDtype::F32 {
            gather_syncs = syncs_of(dev, || {
                dev.gather(&all, &ids_dev, rows, &mut out)
                    .map_err(dev_err("gather"))
            })?;
        }
        drop(all);
        let none = dev
            .load_features(features, &[], 0, dtype)
            .map_err(dev_err("loading features (uncached)"))?;
        times.1 = time_best(dev, o.reps, || {
            dev.gather(&none, &ids_dev, rows, &mut out)
                .map_err(dev_err("gather"))
        })?;
    }
    let [(cached_ms, host_ms), (bf16_cached_ms, bf16_host_ms)] = gathers;
    let src = dev
        .alloc::<f32>(rows * dim)
        .map_err(dev_err("copy source"))?;
    let copy_ms = time_best(dev, o.reps, || {
        dev.copy(&src, &mut out, rows * dim)
            .map_err(dev_err("device copy"))
    })?;

    // 3. GEMM.
    let (m, k, nn) = o.gemm;
    let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
    let b: Vec<f32> = (0..k * nn).map(|i| (i % 5) as f32 * 0.1).collect();
    let (a, b) = (
        dev.to_device(&a).map_err(dev_err("gemm input"))?,
        dev.to_device(&b).map_err(dev_err("gemm input"))?,
    );
    let mut c = dev.alloc::<f32>(m * nn).map_err(dev_err("gemm output"))?;
    let mut gemm = || {
        dev.matmul(DevMat::new(&a, m, k), DevMat::new(&b, k, nn), &mut c, false)
            .map_err(dev_err("gemm"))
    };
    let before = dev.precision();
    dev.set_precision(gpu_ops::Precision::Fp32)
        .map_err(dev_err("precision"))?;
    let gemm_ms = time_best(dev, o.reps, &mut gemm)?;
    dev.set_precision(gpu_ops::Precision::Tf32)
        .map_err(dev_err("precision"))?;
    let tf32_ms = time_best(dev, o.reps, &mut gemm);
    dev.set_precision(before).map_err(dev_err("precision"))?;
    let tf32_ms = tf32_ms?;
    Ok(BackendReport {
        device: format!("{} backend: {}", dev.kind(), dev.describe()),
        sample_edges,
        gather_cached: rate(bytes, cached_ms),
        gather_host: rate(bytes, host_ms),
        gather_bf16_cached: rate(bytes, bf16_cached_ms),
        gather_bf16_host: rate(bytes, bf16_host_ms),
        copy_reference: rate(bytes, copy_ms),
        gemm_flops: rate(2.0 * (m * k * nn) as f64, gemm_ms),
        gemm_tf32_flops: rate(2.0 * (m * k * nn) as f64, tf32_ms),
        gemm: o.gemm,
        sample_syncs,
        gather_syncs,
        layers: o.fanouts.len(),
    })
}

#[cfg(test)]
mod tests {
    use cpu_ops::BuildOptions;
    use gpu_ops::DeviceCore;

    use super::*;

    #[test]
    fn host_backend_report_has_every_number() {
        let mut r = Rng::new(1);
        let n = 2000;
        let edges: Vec<(u32, u32)> = (0..10_000)
            .map(|_| (r.below(n) as u32, r.below(n) as u32))
            .collect();
        let g = CsrGraph::from_edges(n as usize, &edges, BuildOptions::UNDIRECTED).unwrap();
        let f = FeatureMatrix::new(vec![1f32; 2000 * 16].into(), 2000, 16).unwrap();
        let o = BackendBenchOptions {
            batch_size: 64,
            batches: 2,
            fanouts: vec![5, 5],
            gather_rows: 500,
            gemm: (64, 32, 16),
            reps: 2,
            seed: 3,
        };
        let dev = gpu_ops::HostBackend::new();
        let rep = bench_backend(&dev, &g, &f, &o).unwrap();
        // The bench leaves the backend's precision as it found it.
        assert_eq!(dev.precision(), gpu_ops::Precision::Fp32);
        for x in [
            rep.sample_edges,
            rep.gather_cached,
            rep.gather_host,
            rep.gather_bf16_cached,
            rep.gather_bf16_host,
            rep.copy_reference,
            rep.gemm_flops,
            rep.gemm_tf32_flops,
        ] {
            assert!(x.per_sec > 0.0 && x.best_ms >= 0.0, "{rep:?}");
        }
        let text = rep.to_string();
        assert!(
            text.contains("host backend") && text.contains("gemm tf32"),
            "{text}"
        );
        // The host backend counts synchronizations as the CUDA backend makes
        // them: one read of a batch's layer sizes, none for a gather.
        assert!(
            text.contains("host syncs: 1 per sampled batch (2 layers), 0 per gather"),
            "{text}"
        );
        // A feature matrix that does not match the graph is an error.
        let small = FeatureMatrix::new(vec![0f32; 10].into(), 10, 1).unwrap();
        assert!(bench_backend(&gpu_ops::HostBackend::new(), &g, &small, &o).is_err());
    }
}
