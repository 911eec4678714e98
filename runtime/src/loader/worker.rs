//! The loader's worker: one thread per epoch that builds the batches in order
//! and queues them, and the [`Epoch`] that receives them and stops the worker
//! when dropped (module doc of `loader`, steps 2–4). The host and the device
//! loaders both run their batches through [`spawn`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use cpu_ops::{derive_seed, SamplerScratch};

use super::batch::{build, Batch, BatchSpec};
use super::pool::RowBuffers;
use super::{batch_seeds, Counters, FeatureDtype};
use crate::data::Dataset;
use crate::error::{Error, Result};

/// One epoch's work on the host.
pub(crate) struct Job {
    pub ds: Arc<Dataset>,
    pub fanouts: Arc<[u32]>,
    /// The seeds in this epoch's order.
    pub order: Vec<u32>,
    pub batch_size: usize,
    /// The epoch's seed: batch `k` is seeded `derive_seed(base, k)`.
    pub base: u64,
    pub feature_dtype: FeatureDtype,
    pub edge_index: bool,
    pub prefetch: usize,
    pub pool: Arc<rayon::ThreadPool>,
    pub counters: Arc<Counters>,
    pub buffers: Arc<RowBuffers>,
}

/// The batches of one epoch, in order, built ahead by a worker thread (host
/// [`Batch`]es, or a device loader's batches). Dropping it stops and joins the
/// worker.
pub struct Epoch<T = Batch> {
    rx: Option<Receiver<Result<T>>>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
    remaining: usize,
}

impl<T> std::fmt::Debug for Epoch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epoch")
            .field("remaining", &self.remaining)
            .finish_non_exhaustive()
    }
}

/// A started worker in [`Counters::running`] until dropped.
pub(crate) struct Running(Arc<Counters>);

impl Running {
    fn new(counters: &Arc<Counters>) -> Self {
        counters.running.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(counters))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Builds batch `k` of an epoch; `stop` is asked between steps (`Ok(None)`:
/// stopped).
pub(crate) type MakeBatch<T> =
    Box<dyn FnMut(usize, &(dyn Fn() -> bool + Sync)) -> Result<Option<T>> + Send + 'static>;

/// Starts the worker of `job` (step 2).
pub(crate) fn start(job: Job) -> Epoch {
    let batches = job.order.len().div_ceil(job.batch_size);
    let (prefetch, counters) = (job.prefetch, Arc::clone(&job.counters));
    let mut scratch = SamplerScratch::new(job.ds.num_vertices());
    let make: MakeBatch<Batch> = Box::new(move |k, stopped| {
        let seeds = batch_seeds(&job.order, job.batch_size, k);
        let spec = BatchSpec {
            ds: &job.ds,
            fanouts: &job.fanouts,
            seeds,
            index: k,
            seed: derive_seed(job.base, k as u64),
            feature_dtype: job.feature_dtype,
            edge_index: job.edge_index,
            buffers: &job.buffers,
        };
        job.pool.install(|| build(&spec, &mut scratch, stopped))
    });
    spawn(batches, prefetch, &counters, make)
}

/// Starts a worker that builds `batches` batches with `make`, in order, at
/// most `prefetch` ahead of the consumer (steps 2–4 of the module doc).
pub(crate) fn spawn<T: Send + 'static>(
    batches: usize,
    prefetch: usize,
    counters: &Arc<Counters>,
    make: MakeBatch<T>,
) -> Epoch<T> {
    // Step 3: `prefetch - 1` queued plus one in the worker's hands.
    let (tx, rx) = crossbeam_channel::bounded(prefetch - 1);
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    // Counted now, uncounted when the worker ends (or, if it cannot start,
    // when the closure that owns the guard is dropped).
    let running = Running::new(counters);
    let counters = Arc::clone(counters);
    let worker = std::thread::Builder::new()
        .name("tandem-loader".into())
        .spawn(move || run(batches, make, &counters, tx, flag, running));
    match worker {
        Ok(handle) => Epoch {
            rx: Some(rx),
            stop,
            worker: Some(handle),
            remaining: batches,
        },
        Err(e) => {
            // The job (and its counters) went with the failed spawn: report it
            // as the epoch's only item.
            let (tx, rx) = crossbeam_channel::bounded(1);
            let _ = tx.send(Err(Error::invalid_argument(
                "threads",
                format!("could not start the loader's worker thread: {e}"),
            )));
            Epoch {
                rx: Some(rx),
                stop,
                worker: None,
                remaining: 1,
            }
        }
    }
}

/// The worker's loop: build batch `k`, count it, send it; end at the last
/// batch, on the stop flag, when the receiver is gone, or after an error
/// (sent as the last item).
fn run<T>(
    batches: usize,
    mut make: MakeBatch<T>,
    counters: &Counters,
    tx: Sender<Result<T>>,
    stop: Arc<AtomicBool>,
    _running: Running,
) {
    let stopped = || stop.load(Ordering::Acquire);
    for k in 0..batches {
        if stopped() {
            return;
        }
        let item = match make(k, &stopped) {
            Ok(Some(batch)) => Ok(batch),
            Ok(None) => return,
            Err(e) => Err(e),
        };
        let failed = item.is_err();
        if !failed {
            counters.built.fetch_add(1, Ordering::AcqRel);
        }
        if tx.send(item).is_err() || failed {
            return;
        }
    }
}

impl<T> Epoch<T> {
    /// Batches not yet taken.
    pub fn remaining(&self) -> usize {
        self.remaining
    }

    /// The next batch, waiting for the worker; `None` after the last one.
    pub fn next_batch(&mut self) -> Option<Result<T>> {
        if self.remaining == 0 {
            return None;
        }
        let item = match self.rx.as_ref()?.recv() {
            Ok(item) => item,
            // The worker ended without sending every batch: it panicked.
            Err(_) => Err(Error::invalid_argument(
                "loader",
                "the loader's worker thread ended before the epoch's last batch",
            )),
        };
        self.remaining = if item.is_ok() { self.remaining - 1 } else { 0 };
        Some(item)
    }
}

impl<T> Iterator for Epoch<T> {
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        self.next_batch()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.remaining))
    }
}

impl<T> Drop for Epoch<T> {
    /// Step 4: raise the flag, drop the receiver (a blocked send fails), join.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.rx = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}
