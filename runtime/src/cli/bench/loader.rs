//! `tandem bench loader`: the device loader's batches per second against the
//! host loader's, measured in the same run on the same seeds.
//!
//! Each loader runs one untimed epoch of a few batches first (it starts its
//! worker, sizes its buffers, and on CUDA loads its kernels), then one timed
//! epoch of `batches` batches. A device batch counts when its
//! [`ready`](crate::loader::DeviceMiniBatch::ready) event has completed, so
//! the time covers every kernel of every batch; a host batch counts when it is
//! received. Nothing else runs: the figure is the loader's alone (sample and
//! gather), the rate a model on the device could be fed at most.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_ops::{Backend, FeatureDtype};
use serde::Serialize;

use super::per_second;
use crate::data::Dataset;
use crate::error::Result;
use crate::loader::{DeviceLoader, LoaderDevice, LoaderOptions, NeighborLoader};

/// Batches of the untimed epoch that precedes each timed one.
const WARMUP_BATCHES: usize = 3;

/// What [`bench_loader`] runs.
#[derive(Clone, Debug)]
pub struct LoaderBenchOptions {
    /// Fanouts, input layer first.
    pub fanouts: Vec<u32>,
    /// Seeds per batch.
    pub batch_size: usize,
    /// Timed batches per loader.
    pub batches: usize,
    /// Host loader workers (0: one per core).
    pub threads: usize,
    /// Device feature-cache bytes (`None`: the loader's default).
    pub cache_bytes: Option<u64>,
    /// Element type of the device feature store (and of the host rows).
    pub dtype: FeatureDtype,
    /// Batches built ahead.
    pub prefetch: usize,
    /// Fixes the seeds' order and every sample.
    pub seed: u64,
}

/// One loader's timed epoch.
#[derive(Clone, Debug, Serialize)]
pub struct LoaderRun {
    /// Batches timed.
    pub batches: usize,
    /// Wall time of the timed epoch.
    pub secs: f64,
    /// Input vertices per batch, mean.
    pub mean_nodes: f64,
    /// Sampled edges per batch, mean.
    pub mean_edges: f64,
}

impl LoaderRun {
    /// Batches per second.
    pub fn batches_per_second(&self) -> f64 {
        per_second(self.batches as f64, Duration::from_secs_f64(self.secs))
    }
}

/// What [`bench_loader`] measured.
#[derive(Clone, Debug, Serialize)]
pub struct LoaderReport {
    /// The backend the device loader ran on.
    pub device: String,
    /// The device loader's note (topology placement, cache share).
    pub note: String,
    /// Fanouts, input layer first.
    pub fanouts: Vec<u32>,
    /// Seeds per batch.
    pub batch_size: usize,
    /// Host loader workers.
    pub threads: usize,
    /// The reference: the host loader.
    pub host: LoaderRun,
    /// The device loader.
    pub device_run: LoaderRun,
    /// Device feature-cache hit rate over the timed epoch.
    pub hit_rate: f64,
}

impl LoaderReport {
    /// Device batches/s over host batches/s.
    pub fn ratio(&self) -> f64 {
        let h = self.host.batches_per_second();
        if h > 0.0 {
            self.device_run.batches_per_second() / h
        } else {
            0.0
        }
    }

    /// The report as one JSON line, the ratio included.
    pub fn json_line(&self) -> String {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("ratio".into(), serde_json::json!(self.ratio()));
            o.insert(
                "host_batches_per_s".into(),
                serde_json::json!(self.host.batches_per_second()),
            );
            o.insert(
                "device_batches_per_s".into(),
                serde_json::json!(self.device_run.batches_per_second()),
            );
        }
        v.to_string()
    }
}

impl fmt::Display for LoaderReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "loader: fanouts {:?}, batch {}, host loader {} workers",
            self.fanouts, self.batch_size, self.threads
        )?;
        writeln!(f, "{}", self.note)?;
        writeln!(
            f,
            "{:<24} {:>10} {:>12} {:>12}",
            "loader", "batches/s", "nodes/batch", "edges/batch"
        )?;
        for (name, r) in [
            ("host loader (reference)", &self.host),
            ("device loader", &self.device_run),
        ] {
            writeln!(
                f,
                "{name:<24} {:>10.1} {:>12.0} {:>12.0}",
                r.batches_per_second(),
                r.mean_nodes,
                r.mean_edges
            )?;
        }
        writeln!(
            f,
            "device / host: {:.2}x; cache hit rate {:.1}%",
            self.ratio(),
            100.0 * self.hit_rate
        )?;
        write!(f, "json: {}", self.json_line())
    }
}

/// Times the host loader, then the device loader on `dev`, on the same seeds
/// (module doc).
pub fn bench_loader<B: Backend>(
    dev: B,
    ds: &Arc<Dataset>,
    o: &LoaderBenchOptions,
) -> Result<LoaderReport> {
    let mut seeds = ds.train_ids();
    if seeds.is_empty() {
        seeds = (0..ds.num_vertices() as u32).collect();
    }
    cpu_ops::Rng::new(o.seed).shuffle(&mut seeds);
    seeds.truncate(o.batches.max(1) * o.batch_size);
    let opts = LoaderOptions {
        seeds: Some(seeds),
        device: LoaderDevice::Host,
        feature_cache_bytes: None,
        feature_dtype: o.dtype,
        prefetch: o.prefetch,
        seed: o.seed,
        threads: o.threads,
        ..LoaderOptions::new(o.fanouts.clone(), o.batch_size)
    };
    let host = NeighborLoader::new(Arc::clone(ds), opts.clone())?;
    let threads = if o.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        o.threads
    };
    for b in host.epoch_at(1).take(WARMUP_BATCHES) {
        b?;
    }
    let t = Instant::now();
    let (mut nodes, mut edges, mut n) = (0usize, 0usize, 0usize);
    for b in host.epoch_at(0) {
        let b = b?;
        nodes += b.n_id.len();
        edges += b.num_sampled_edges().iter().sum::<usize>();
        n += 1;
    }
    let host_run = LoaderRun {
        batches: n,
        secs: t.elapsed().as_secs_f64(),
        mean_nodes: nodes as f64 / n.max(1) as f64,
        mean_edges: edges as f64 / n.max(1) as f64,
    };
    drop(host);

    let device = dev.describe();
    let dl = DeviceLoader::new(
        dev,
        Arc::clone(ds),
        LoaderOptions {
            feature_cache_bytes: o.cache_bytes,
            ..opts
        },
    )?;
    let on = |source| crate::error::Error::device("bench loader: waiting for a batch", source);
    for b in dl.epoch_at(1).take(WARMUP_BATCHES) {
        dl.device().wait_host(&b?.ready).map_err(on)?;
    }
    dl.reset_cache_stats();
    let t = Instant::now();
    let (mut nodes, mut edges, mut n) = (0usize, 0usize, 0usize);
    for b in dl.epoch_at(0) {
        let b = b?;
        dl.device().wait_host(&b.ready).map_err(on)?;
        nodes += b.num_nodes;
        edges += b.hops.iter().map(|h| h.num_edges).sum::<usize>();
        n += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    // The counts reach the stats at a synchronization of the loader's stream.
    let d = dl.device();
    d.synchronize(d.stream()).map_err(on)?;
    let s = dl.cache_stats();
    let rows = s.hits + s.misses;
    Ok(LoaderReport {
        device,
        note: dl.note().to_string(),
        fanouts: o.fanouts.clone(),
        batch_size: o.batch_size,
        threads,
        host: host_run,
        device_run: LoaderRun {
            batches: n,
            secs,
            mean_nodes: nodes as f64 / n.max(1) as f64,
            mean_edges: edges as f64 / n.max(1) as f64,
        },
        hit_rate: if rows > 0 {
            s.hits as f64 / rows as f64
        } else {
            0.0
        },
    })
}
