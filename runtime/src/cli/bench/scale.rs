//! `tandem bench scale`: one large graph end to end — generate, (optionally)
//! write and reopen the store, train, evaluate — with the time of each phase and
//! the peak memory of each.
//!
//! 1. An R-MAT graph ([`generate_rmat`]) is built in memory from
//!    [`ScaleOptions::graph`]; the peak host memory of generation is read from
//!    `VmHWM` and then reset (`/proc/self/clear_refs`), so the training peak is
//!    measured on its own.
//! 2. With [`ScaleOptions::store`], the graph is written there and dropped, and
//!    training reads the store memory-mapped (what `tandem train` does); without
//!    it, training reads the graph from memory (for machines whose disk is smaller
//!    than the dataset: papers100M's fp32 store is ~70 GB, the GPU machine's disk
//!    64 GB).
//! 3. The trainer is built from the caller's config with the graph's store bytes
//!    counted once; `train.epochs` epochs run with evaluation only after the last
//!    (sampled validation / test batches, `train.eval_mode`).
//! 4. A sampler thread polls the device's used memory through NVML every 100 ms
//!    while training runs (none on the host backend, where the device memory is
//!    the host memory, reported as peak host memory).
//!
//! The report prints as a table and as one JSON line.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::config::TrainConfig;
use crate::data::dataset::{open_dataset, write_dataset, Dataset, Verify};
use crate::data::generate::{generate_rmat, RmatOptions};
use crate::error::{Error, Result};
use crate::trace::{fmt_bytes, peak_rss, reset_peak_rss};
use crate::TrainerBuilder;

/// What to build and where it lives (module doc).
#[derive(Clone, Debug)]
pub struct ScaleOptions {
    /// The generated graph.
    pub graph: RmatOptions,
    /// Write the store here and train from the file; `None`: train from memory.
    pub store: Option<PathBuf>,
    /// Keep the store file afterwards (otherwise it is removed at the end).
    pub keep_store: bool,
    /// On a GPU, choose `device.topology` and `device.cache_bytes` from the free
    /// device memory: both set to `"auto"` (`placement/budget.rs`).
    pub fit_device: bool,
}

/// One run's measurements.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScaleReport {
    /// The device the trainer ran on (its note).
    pub device: String,
    /// Vertices.
    pub vertices: usize,
    /// Stored (directed) edges.
    pub stored_edges: usize,
    /// Feature columns.
    pub dim: usize,
    /// Classes.
    pub classes: u32,
    /// Training vertices.
    pub train_vertices: usize,
    /// Bytes of the graph's arrays (features, topology, labels, masks): what a
    /// store holds and training maps once.
    pub store_bytes: u64,
    /// Seconds to generate the graph in memory.
    pub generate_secs: f64,
    /// Peak host memory of generation (`VmHWM`), when readable.
    pub generate_peak_rss: Option<u64>,
    /// Seconds to write the store (`None`: trained from memory).
    pub write_secs: Option<f64>,
    /// Seconds to open the store / build the trainer (loading the device).
    pub load_secs: f64,
    /// Training seconds of each epoch (epoch 0 pays one-time costs).
    pub epoch_secs: Vec<f64>,
    /// Seconds of the final evaluation.
    pub eval_secs: f64,
    /// Validation accuracy after the last epoch.
    pub val_acc: Option<f64>,
    /// Test accuracy after the last epoch.
    pub test_acc: Option<f64>,
    /// The accuracy of always answering the test split's most frequent class
    /// ([`Dataset::chance_accuracy`]): what the test accuracy is read against.
    pub chance_acc: f64,
    /// Peak host memory from opening the store to the end of training
    /// (`VmHWM` after the reset of step 1), when readable.
    pub train_peak_rss: Option<u64>,
    /// Peak used device memory seen by NVML during training (`None` on the host
    /// backend or without NVML).
    pub peak_device_bytes: Option<u64>,
    /// The placement `fit_device` chose, in words (`None` when not asked or on
    /// the host backend).
    pub placement: Option<String>,
}

/// The bytes of `ds`'s arrays: features, CSR offsets and indices, labels, masks.
pub fn dataset_bytes(ds: &Dataset) -> u64 {
    let n = ds.num_vertices() as u64;
    let feats = std::mem::size_of_val(ds.features.as_slice()) as u64;
    let topo = 8 * (n + 1) + 4 * ds.graph.num_edges() as u64;
    // Labels (u32) and three one-byte masks.
    feats + topo + 4 * n + 3 * n
}

/// Polls the used memory of device `ordinal` through NVML until dropped.
struct DeviceMemoryPoll {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    seen: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DeviceMemoryPoll {
    fn start(ordinal: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(AtomicBool::new(false));
        let thread = crate::trace::nvml::Nvml::load().ok().map(|nvml| {
            let (stop, peak, seen) = (Arc::clone(&stop), Arc::clone(&peak), Arc::clone(&seen));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for s in nvml.sample() {
                        if let (true, Some(used)) = (s.index == ordinal, s.mem_used) {
                            peak.fetch_max(used, Ordering::Relaxed);
                            seen.store(true, Ordering::Relaxed);
                        }
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            })
        });
        Self {
            stop,
            peak,
            seen,
            thread,
        }
    }

    /// Stops polling: the peak, when a sample was taken.
    fn finish(mut self) -> Option<u64> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.seen
            .load(Ordering::Relaxed)
            .then(|| self.peak.load(Ordering::Relaxed))
    }
}

/// Runs the benchmark (module doc): `cfg` is the training config (its `[data]`
/// is replaced by the generated graph); `on_phase` sees a line as each phase
/// starts and ends (progress for long runs).
pub fn bench_scale(
    cfg: &TrainConfig,
    opts: &ScaleOptions,
    mut on_phase: impl FnMut(&str),
) -> Result<ScaleReport> {
    let mut report = ScaleReport::default();
    let g = &opts.graph;
    on_phase(&format!(
        "generating R-MAT: {} vertices, {} edges drawn, {} columns",
        g.num_vertices, g.num_edges, g.feature_dim
    ));
    let t = Instant::now();
    let ds = generate_rmat(g)?;
    report.generate_secs = t.elapsed().as_secs_f64();
    report.generate_peak_rss = peak_rss();
    report.vertices = ds.num_vertices();
    report.stored_edges = ds.graph.num_edges();
    report.dim = ds.features.dim();
    report.classes = ds.num_classes;
    report.train_vertices = ds.train_mask.iter().filter(|&&m| m != 0).count();
    report.chance_acc = ds.chance_accuracy(&ds.test_ids());
    report.store_bytes = dataset_bytes(&ds);
    on_phase(&format!(
        "generated in {:.1} s: {} stored edges, {} of arrays",
        report.generate_secs,
        report.stored_edges,
        fmt_bytes(report.store_bytes)
    ));
    let mut cfg = cfg.clone();
    let fit = opts.fit_device && !super::orchestration::resolves_to_host(&cfg);
    if fit {
        cfg.device.topology = crate::config::TopologyChoice::Auto;
        cfg.device.cache_bytes = crate::config::CACHE_BYTES_AUTO;
    }
    // From the reset on, the peak is training's own (the graph included, mapped
    // or in memory).
    let ds = match &opts.store {
        Some(path) => {
            on_phase(&format!("writing the store to {}", path.display()));
            let t = Instant::now();
            write_dataset(path, &ds)?;
            report.write_secs = Some(t.elapsed().as_secs_f64());
            drop(ds);
            cfg.data.path = Some(path.clone());
            reset_peak_rss();
            open_dataset(path, Verify::Default)?
        }
        None => {
            reset_peak_rss();
            ds
        }
    };
    on_phase("building the trainer (loading the device)");
    let t = Instant::now();
    let builder = TrainerBuilder::new(cfg.clone()).dataset(ds);
    let mut trainer = builder.build()?;
    report.load_secs = t.elapsed().as_secs_f64();
    report.device = trainer.device_note().to_string();
    if fit {
        // The engine's choice, with its numbers (`placement/budget.rs`).
        let line = report
            .device
            .split("; ")
            .filter(|c| c.contains("\"auto\" chose"))
            .collect::<Vec<_>>()
            .join("; ");
        on_phase(&format!("placement: {line}"));
        report.placement = Some(line);
    }
    on_phase(&format!(
        "loaded in {:.1} s; training {}",
        report.load_secs,
        crate::trace::fmt_count(cfg.train.epochs, "epoch")
    ));
    let poll = (!super::orchestration::resolves_to_host(&cfg))
        .then(|| DeviceMemoryPoll::start(cfg.device.ordinal));
    let fitted = trainer.fit();
    report.peak_device_bytes = poll.and_then(DeviceMemoryPoll::finish);
    let stats = fitted?;
    report.train_peak_rss = peak_rss();
    report.epoch_secs = stats.iter().map(|s| s.train_secs).collect();
    if let Some(last) = stats.last() {
        report.eval_secs = last.eval_secs;
        report.val_acc = last.val_acc;
        report.test_acc = last.test_acc;
    }
    if let (Some(path), false) = (&opts.store, opts.keep_store) {
        drop(trainer);
        std::fs::remove_file(path).map_err(|e| Error::io(path, e))?;
    }
    Ok(report)
}

impl ScaleReport {
    /// Mean training seconds of the epochs after the first (the first alone
    /// when only one ran).
    pub fn steady_epoch_secs(&self) -> Option<f64> {
        match self.epoch_secs.as_slice() {
            [] => None,
            [one] => Some(*one),
            [_, rest @ ..] => Some(rest.iter().sum::<f64>() / rest.len() as f64),
        }
    }

    /// The report as one JSON line (`"bench": "scale"` and every field).
    pub fn json_line(&self) -> String {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("bench".into(), "scale".into());
            o.insert(
                "steady_epoch_secs".into(),
                serde_json::json!(self.steady_epoch_secs()),
            );
        }
        v.to_string()
    }
}

fn opt_bytes(b: Option<u64>) -> String {
    b.map_or_else(|| "n/a".into(), fmt_bytes)
}

fn opt_acc(a: Option<f64>) -> String {
    a.map_or_else(|| "n/a".into(), |x| format!("{x:.4}"))
}

impl std::fmt::Display for ScaleReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "graph: {} vertices, {} stored edges, {} columns, {} classes, {} training vertices; \
             arrays {}",
            self.vertices,
            self.stored_edges,
            self.dim,
            self.classes,
            self.train_vertices,
            fmt_bytes(self.store_bytes)
        )?;
        writeln!(f, "{}", self.device)?;
        if let Some(p) = &self.placement {
            writeln!(f, "placement (--fit-device): {p}")?;
        }
        writeln!(
            f,
            "generate            {:>9.2} s   peak host memory {}",
            self.generate_secs,
            opt_bytes(self.generate_peak_rss)
        )?;
        if let Some(w) = self.write_secs {
            writeln!(f, "write store         {w:>9.2} s")?;
        }
        writeln!(f, "load (trainer)      {:>9.2} s", self.load_secs)?;
        for (e, s) in self.epoch_secs.iter().enumerate() {
            writeln!(f, "epoch {e:<3}           {s:>9.3} s")?;
        }
        writeln!(
            f,
            "evaluation          {:>9.2} s   val {}  test {} (chance {:.4}: the test \
             split's most frequent of {} classes)",
            self.eval_secs,
            opt_acc(self.val_acc),
            opt_acc(self.test_acc),
            self.chance_acc,
            self.classes
        )?;
        let over = match (self.train_peak_rss, self.store_bytes) {
            (Some(p), s) if s > 0 => format!(" ({:.2}× the arrays)", p as f64 / s as f64),
            _ => String::new(),
        };
        writeln!(
            f,
            "training peak host memory {}{over}; peak device memory {}",
            opt_bytes(self.train_peak_rss),
            opt_bytes(self.peak_device_bytes)
        )?;
        match self.steady_epoch_secs() {
            Some(s) => writeln!(
                f,
                "epoch time {s:.3} s (mean excluding epoch 0 when more ran)"
            ),
            None => writeln!(f, "no epoch trained"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::dataset::SplitSpec;

    fn small() -> RmatOptions {
        RmatOptions {
            num_vertices: 3000,
            num_edges: 15_000,
            num_classes: 4,
            feature_dim: 16,
            split: "0.3,0.1,0.1".parse::<SplitSpec>().unwrap(),
            seed: 5,
            ..RmatOptions::default()
        }
    }

    fn config() -> TrainConfig {
        TrainConfig::from_toml_with_overrides(
            "",
            "test".as_ref(),
            &[
                "device.kind=\"host\"".into(),
                "train.epochs=2".into(),
                "train.eval_every=0".into(),
                "train.fanouts=[5,5]".into(),
                "model.hidden=16".into(),
                "threads.compute=1".into(),
            ],
        )
        .unwrap()
    }

    #[test]
    fn a_small_run_from_memory_and_from_a_store_reports_every_phase() {
        let d = tempfile::tempdir().unwrap();
        let mut phases = Vec::new();
        for store in [None, Some(d.path().join("s.tds"))] {
            let opts = ScaleOptions {
                graph: small(),
                store: store.clone(),
                keep_store: false,
                fit_device: true,
            };
            let r = bench_scale(&config(), &opts, |p| phases.push(p.to_string())).unwrap();
            assert_eq!(r.vertices, 3000);
            assert_eq!(r.dim, 16);
            assert_eq!(r.epoch_secs.len(), 2);
            assert!(r.test_acc.is_some_and(|a| (0.0..=1.0).contains(&a)));
            // 4 classes: the most frequent one holds at least a quarter.
            assert!((0.25..=1.0).contains(&r.chance_acc), "{}", r.chance_acc);
            assert_eq!(r.write_secs.is_some(), store.is_some());
            // features 3000 × 16 × 4, offsets, indices, labels, masks
            let want = 3000 * 64 + 8 * 3001 + 4 * r.stored_edges as u64 + 7 * 3000;
            assert_eq!(r.store_bytes, want);
            assert_eq!(
                r.peak_device_bytes, None,
                "the host backend has no NVML device"
            );
            assert_eq!(r.placement, None, "--fit-device is for a GPU");
            if let Some(p) = &store {
                assert!(!p.exists(), "the store is removed unless kept");
            }
            let json: serde_json::Value = serde_json::from_str(&r.json_line()).unwrap();
            assert_eq!(json["bench"], "scale");
            assert_eq!(json["vertices"], 3000);
            let table = r.to_string();
            assert!(table.contains("peak device memory n/a"), "{table}");
            assert!(table.contains("epoch 1"), "{table}");
            assert!(table.contains("(chance 0."), "{table}");
        }
        assert!(phases.iter().any(|p| p.starts_with("writing the store")));
        assert!(phases.iter().any(|p| p.starts_with("generated in")));
    }

    #[test]
    fn the_steady_epoch_time_skips_epoch_0_when_others_ran() {
        let mut r = ScaleReport::default();
        assert_eq!(r.steady_epoch_secs(), None);
        r.epoch_secs = vec![5.0];
        assert_eq!(r.steady_epoch_secs(), Some(5.0));
        r.epoch_secs = vec![5.0, 1.0, 2.0];
        assert_eq!(r.steady_epoch_secs(), Some(1.5));
    }
}
