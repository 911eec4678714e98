//! A training service running four jobs at once on one graph held in memory once.
//!
//! ```sh
//! cargo run --release -p runtime --no-default-features --example service_jobs
//! # with ONNX serving (ONNX Runtime >= 1.30 loaded at run time):
//! TANDEM_ORT_LIB=/path/to/libonnxruntime.so \
//!   cargo run --release -p runtime --no-default-features --features onnx-runtime \
//!   --example service_jobs
//! ```
//!
//! The dataset is built once from arrays (`DatasetBuilder`) and shared as an
//! `Arc<Dataset>`; each job gets a core budget — jobs A and B a pool of one
//! worker each (`threads(1)`), jobs C and D one shared one-worker pool
//! (`thread_pool`) — and trains a 2-layer GraphSAGE on the host backend:
//! - job A trains, exports its model to ONNX and serves predictions through ONNX
//!   Runtime (feature `onnx-runtime` and `TANDEM_ORT_LIB`; otherwise it says why
//!   it cannot and serves the same requests with `Trainer::predict`);
//! - job B reports its batches over a channel to a monitor thread, which cancels
//!   it from there part-way through; the job then removes its callback, which
//!   closes the channel so the monitor ends while the trainer lives on;
//! - job C stops after its first epoch with a checkpoint, and a fresh trainer on
//!   the same dataset resumes it to the end, then trains one epoch more;
//! - job D trains the same configuration as C straight through: C's resumed
//!   weights equal D's bit for bit.
//!
//! At the end it prints the resident memory with the dataset built and its peak
//! while the jobs ran (`VmRSS`, `VmHWM`), the size of the data, and whether
//! every job's arrays are the shared ones. The library prints
//! nothing itself; every line here is the example's.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::thread;

use runtime::config::{DeviceKind, TrainConfig};
use runtime::data::{Amount, SplitSpec};
use runtime::ndarray::{Array1, Array2};
use runtime::onnx::{ExportOptions, OnnxBlock, OrtModel, ORT_LIB_ENV};
use runtime::{
    on_batch, on_epoch, BatchMetrics, CancelToken, Control, Dataset, DatasetBuilder, Error, Result,
    StopCause, Trainer, TrainerBuilder,
};

/// The graph: `VERTICES` vertices in `CLASSES` communities, `DIM` features each.
const VERTICES: usize = 4000;
const CLASSES: usize = 4;
const DIM: usize = 512;
/// Undirected edges, each given once (the builder symmetrizes them).
const EDGES: usize = 20_000;

/// A tiny seeded generator (splitmix64), so the example needs nothing else.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// The service's graph, built from arrays as a host program would hand them
/// over; the arrays are dropped on return, so the dataset is the only copy.
pub fn dataset(vertices: usize, dim: usize, edges: usize) -> Result<Dataset> {
    let mut rng = Rng(7);
    let labels: Array1<i64> = (0..vertices).map(|_| rng.below(CLASSES) as i64).collect();
    let mut members = vec![Vec::new(); CLASSES];
    for (v, &c) in labels.iter().enumerate() {
        members[c as usize].push(v);
    }
    let mut edge_index = Array2::<i64>::zeros((2, edges));
    for j in 0..edges {
        let s = rng.below(vertices);
        let same = &members[labels[s] as usize];
        let d = if rng.unit() < 0.8 {
            same[rng.below(same.len())]
        } else {
            rng.below(vertices)
        };
        edge_index[[0, j]] = s as i64;
        edge_index[[1, j]] = d as i64;
    }
    let features = Array2::from_shape_fn((vertices, dim), |(v, k)| {
        let signal = if k % CLASSES == labels[v] as usize {
            0.1
        } else {
            0.0
        };
        signal + rng.unit() - 0.5
    });
    DatasetBuilder::new("service-graph")
        .edge_index(&edge_index)
        .symmetrize(true)
        .features(&features)
        .labels(&labels)
        .split(SplitSpec {
            train: Amount::Fraction(0.3),
            val: Amount::Fraction(0.2),
            test: Amount::Rest,
        })
        .seed(1)
        .build()
}

/// Every job's configuration: `epochs` epochs of a 2-layer GraphSAGE on the host
/// backend. `device.kind` is set: its default, `"auto"`, would move the jobs to
/// a GPU on a machine with one. The host backend's "device" feature cache is a
/// copy of the cached rows in host memory (it stands for GPU memory), so the
/// jobs run without one.
pub fn job_config(epochs: usize) -> TrainConfig {
    let mut cfg = TrainConfig::default();
    cfg.device.kind = DeviceKind::Host;
    cfg.device.cache_bytes = 0;
    cfg.model.hidden = 32;
    cfg.train.fanouts = vec![10, 10];
    cfg.train.batch_size = 128;
    cfg.train.epochs = epochs;
    cfg.train.lr = 0.01;
    cfg
}

/// A line of `/proc/self/status` in KiB (`VmHWM`: peak resident memory, `VmRSS`:
/// now); `None` where there is no such file.
fn status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Resets the peak resident memory (`VmHWM`) to the current one (Linux ≥ 4.0:
/// `5` written to `/proc/self/clear_refs`); false where that is not possible.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Bytes of the dataset's arrays.
fn data_bytes(ds: &Dataset) -> usize {
    std::mem::size_of_val(ds.features.as_slice())
        + std::mem::size_of_val(ds.graph.offsets().as_slice())
        + std::mem::size_of_val(ds.graph.indices().as_slice())
        + std::mem::size_of_val(&ds.labels[..])
        + 3 * ds.num_vertices()
}

/// Whether `t` trains on `ds`'s arrays themselves (not a copy of them).
pub fn shares(t: &Trainer, ds: &Arc<Dataset>) -> bool {
    Arc::ptr_eq(t.shared_dataset(), ds)
        && t.dataset()
            .features
            .data()
            .shares_storage(ds.features.data())
        && t.dataset()
            .graph
            .indices()
            .shares_storage(ds.graph.indices())
}

/// What a job reports back to the service.
#[derive(Debug)]
pub struct JobReport {
    /// The job's name.
    pub name: &'static str,
    /// Whether its trainer(s) held the shared dataset, not a copy.
    pub shared: bool,
    /// Epochs completed.
    pub epochs: usize,
    /// Test accuracy at the end.
    pub test_acc: f64,
    /// The weights at `train.epochs` (jobs C and D).
    pub params: Option<Vec<Vec<f32>>>,
    /// Where the cancel stopped job B: `(epoch, batch)`.
    pub cancelled_at: Option<(usize, usize)>,
    /// How the job ended or what it served, one line.
    pub note: String,
}

/// Job A: train, export to ONNX, serve predictions for a few vertices through
/// ONNX Runtime (or say why not and serve them from the trainer).
fn job_export(ds: Arc<Dataset>, dir: &Path, epochs: usize) -> Result<JobReport> {
    let mut t = TrainerBuilder::new(job_config(epochs))
        .dataset(Arc::clone(&ds))
        .threads(1)
        .build()?;
    t.fit()?;
    let onnx = dir.join("job-a.onnx");
    t.export_onnx(&onnx, &ExportOptions::default())?;
    let ids: Vec<u32> = vec![0, 1, 2, 3];
    let from_trainer = t.predict(&ids)?;
    let note = match serve_onnx(&ds, &onnx, &ids) {
        Ok(logits) => {
            let diff = logits
                .iter()
                .zip(from_trainer.iter())
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            format!(
                "served {} vertices through ONNX Runtime; largest difference from \
                 Trainer::predict {diff:.2e}",
                ids.len()
            )
        }
        Err(why) => format!(
            "exported {}; ONNX serving skipped ({why}); served {} × {} logits with \
             Trainer::predict instead",
            onnx.display(),
            from_trainer.nrows(),
            from_trainer.ncols()
        ),
    };
    let (_, test_acc) = t.evaluate_val_test()?;
    Ok(JobReport {
        name: "A (export, serve)",
        shared: shares(&t, &ds),
        epochs: t.epoch(),
        test_acc,
        params: None,
        cancelled_at: None,
        note,
    })
}

/// The logits of `ids` from the ONNX file, run through ONNX Runtime on the whole
/// graph (layer-wise full-neighbor inference, as `Trainer::predict` does).
fn serve_onnx(ds: &Dataset, onnx: &Path, ids: &[u32]) -> std::result::Result<Vec<f32>, String> {
    let lib = std::env::var_os(ORT_LIB_ENV).ok_or(format!("{ORT_LIB_ENV} is not set"))?;
    let mut model = OrtModel::from_file(Path::new(&lib), onnx).map_err(|e| e.to_string())?;
    let full = OnnxBlock::full_graph(&ds.graph);
    let all = model
        .run(ds.features.as_slice(), &[full.clone(), full])
        .map_err(|e| e.to_string())?;
    let c = all.len() / ds.num_vertices();
    Ok(ids
        .iter()
        .flat_map(|&v| all[v as usize * c..(v as usize + 1) * c].iter().copied())
        .collect())
}

/// Job B: progress goes over a channel to a monitor thread, which cancels the
/// job from there after `cancel_after` batches; then the job drops its callback
/// (and with it the channel's sender) so the monitor finishes. The callback
/// waits for the monitor's answer to each batch, so the cancel lands before the
/// next batch whatever the threads' timing.
fn job_cancelled(ds: Arc<Dataset>, epochs: usize, cancel_after: usize) -> Result<JobReport> {
    let cancel = CancelToken::new();
    let mut t = TrainerBuilder::new(job_config(epochs))
        .dataset(Arc::clone(&ds))
        .threads(1)
        .cancel_token(cancel.clone())
        .build()?;
    let (tx, rx) = mpsc::channel::<BatchMetrics>();
    let (ack_tx, ack_rx) = mpsc::channel::<()>();
    let id = t.add_callback(Box::new(on_batch(move |m: &BatchMetrics| {
        if tx.send(m.clone()).is_ok() {
            let _ = ack_rx.recv();
        }
        Control::Continue
    })));
    let monitor = thread::spawn(move || {
        let mut seen = 0;
        for _ in rx {
            seen += 1;
            if seen == cancel_after {
                cancel.cancel();
            }
            let _ = ack_tx.send(());
        }
        seen // the loop ends when the sender is dropped
    });
    let (note, cancelled_at) = match t.fit() {
        Err(Error::Cancelled {
            epoch,
            batch,
            cause: StopCause::Token,
        }) => (
            format!("cancelled from the monitor thread before batch {batch} of epoch {epoch}"),
            Some((epoch, batch)),
        ),
        Err(e) => return Err(e),
        Ok(_) => ("finished before the cancel arrived".into(), None),
    };
    // Without this the monitor would wait for as long as the trainer lives.
    drop(t.remove_callback(id));
    let seen = monitor.join().expect("monitor thread");
    let (_, test_acc) = t.evaluate_val_test()?;
    Ok(JobReport {
        name: "B (cancelled)",
        shared: shares(&t, &ds),
        epochs: t.epoch(),
        test_acc,
        params: None,
        cancelled_at,
        note: format!("{note}; the monitor saw {seen} batches and ended"),
    })
}

/// Job C: stops after epoch 0 with a checkpoint; a fresh trainer on the same
/// dataset resumes it to `train.epochs` (its weights are reported), then trains
/// one epoch more with `fit_epochs`.
fn job_resumed(
    ds: Arc<Dataset>,
    pool: Arc<runtime::rayon::ThreadPool>,
    checkpoint: PathBuf,
    epochs: usize,
) -> Result<JobReport> {
    let mut first = TrainerBuilder::new(job_config(epochs))
        .dataset(Arc::clone(&ds))
        .thread_pool(Arc::clone(&pool))
        .checkpoint_to(&checkpoint)
        .callback(on_epoch(|_| Control::Stop))
        .build()?;
    first.fit()?; // one epoch, then the checkpoint
    let shared_first = shares(&first, &ds);
    drop(first);
    let mut t = TrainerBuilder::new(job_config(epochs))
        .dataset(Arc::clone(&ds))
        .thread_pool(pool)
        .build()?;
    t.load_checkpoint(&checkpoint)?;
    let resumed_at = t.epoch();
    t.fit()?;
    let params = t.params()?;
    let more = t.fit_epochs(1)?;
    let again = match t.fit() {
        Err(Error::TrainingComplete { .. }) => "fit() now says the training is complete",
        Err(e) => return Err(e),
        Ok(_) => "fit() trained again",
    };
    let (_, test_acc) = t.evaluate_val_test()?;
    Ok(JobReport {
        name: "C (checkpoint, resume)",
        shared: shared_first && shares(&t, &ds),
        epochs: t.epoch(),
        test_acc,
        params: Some(params),
        cancelled_at: None,
        note: format!(
            "stopped after epoch 0, resumed at epoch {resumed_at}, trained to {epochs}, then \
             {} more with fit_epochs(1); {again}",
            more.len()
        ),
    })
}

/// Job D: C's configuration, uninterrupted.
fn job_reference(
    ds: Arc<Dataset>,
    pool: Arc<runtime::rayon::ThreadPool>,
    epochs: usize,
) -> Result<JobReport> {
    let mut t = TrainerBuilder::new(job_config(epochs))
        .dataset(Arc::clone(&ds))
        .thread_pool(pool)
        .build()?;
    t.fit()?;
    let (_, test_acc) = t.evaluate_val_test()?;
    Ok(JobReport {
        name: "D (reference)",
        shared: shares(&t, &ds),
        epochs: t.epoch(),
        test_acc,
        params: Some(t.params()?),
        cancelled_at: None,
        note: "trained straight through".into(),
    })
}

/// What the service saw.
#[derive(Debug)]
pub struct ServiceReport {
    /// One report per job, A to D.
    pub jobs: Vec<JobReport>,
    /// Whether job C's resumed weights equal job D's bit for bit.
    pub resumed_equals_reference: bool,
    /// Bytes of the dataset's arrays.
    pub data_bytes: usize,
    /// Resident memory once the dataset is built and its source arrays are
    /// dropped, and the peak while the jobs ran, in KiB (`None` without
    /// `/proc`).
    pub rss_kib: Option<(u64, u64)>,
}

/// Runs the four jobs concurrently on a graph of `vertices` vertices with `dim`
/// features and `edges` edges, each job `epochs` epochs.
pub fn run_service(
    vertices: usize,
    dim: usize,
    edges: usize,
    epochs: usize,
    dir: &Path,
) -> Result<ServiceReport> {
    let ds = Arc::new(dataset(vertices, dim, edges)?);
    // The peak from here on: the jobs, not the builder's copy from the arrays.
    let start = status_kib("VmRSS:").filter(|_| reset_peak_rss());
    let pool = runtime::rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .thread_name(|i| format!("service-shared-{i}"))
        .build()
        .map_err(|e| Error::invalid_argument("shared pool", e.to_string()))?;
    let pool = Arc::new(pool);
    let checkpoint = dir.join("job-c.tck");
    let results: Vec<Result<JobReport>> = thread::scope(|s| {
        let a = s.spawn(|| job_export(Arc::clone(&ds), dir, epochs));
        let b = s.spawn(|| job_cancelled(Arc::clone(&ds), epochs, 3));
        let c = s.spawn(|| job_resumed(Arc::clone(&ds), Arc::clone(&pool), checkpoint, epochs));
        let d = s.spawn(|| job_reference(Arc::clone(&ds), Arc::clone(&pool), epochs));
        [a, b, c, d]
            .into_iter()
            .map(|h| h.join().expect("job thread"))
            .collect()
    });
    let jobs = results.into_iter().collect::<Result<Vec<_>>>()?;
    let resumed_equals_reference =
        jobs[2].params.is_some() && jobs[2].params.as_ref() == jobs[3].params.as_ref();
    let peak = status_kib("VmHWM:");
    Ok(ServiceReport {
        jobs,
        resumed_equals_reference,
        data_bytes: data_bytes(&ds),
        rss_kib: start.zip(peak),
    })
}

fn main() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("tandem-service-jobs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let report = run_service(VERTICES, DIM, EDGES, 3, &dir);
    std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let report = report?;
    for j in &report.jobs {
        println!(
            "[job {}] {} epochs, test acc {:.4}, shared dataset: {}; {}",
            j.name, j.epochs, j.test_acc, j.shared, j.note
        );
    }
    println!(
        "[service] job C resumed = job D uninterrupted, bit for bit: {}",
        report.resumed_equals_reference
    );
    let mib = |kib: u64| kib as f64 / 1024.0;
    let data = report.data_bytes as f64 / (1 << 20) as f64;
    match report.rss_kib {
        Some((start, peak)) => println!(
            "[service] data {data:.1} MiB, held once and shared by the four jobs: RSS {:.1} MiB \
             with the dataset built, peak {:.1} MiB while the jobs ran (+{:.1} MiB of working \
             memory: each job's gathered batch rows and full-graph evaluation, ONNX Runtime); \
             a copy of the data per job would add {:.1} MiB more",
            mib(start),
            mib(peak),
            mib(peak.saturating_sub(start)),
            4.0 * data
        ),
        None => println!("[service] data {data:.1} MiB; no /proc to read the peak RSS from"),
    }
    Ok(())
}
