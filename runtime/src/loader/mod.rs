//! A mini-batch loader for a model the caller trains itself: Tandem's sampler
//! and gather run ahead on their own threads and hand over finished batches
//! (seed count, per-hop sampled edges in local ids, input vertex ids, gathered
//! input features, the seeds' labels). The Python package's
//! `tandem.NeighborLoader` is this type; PyG's and DGL's layouts are built from
//! its batches (`docs/python.md`).
//!
//! # What a batch holds
//! Sampling goes hop by hop from the seeds, as PyG's `NeighborLoader` does: hop
//! `h` (1-based) draws `fanout` neighbors for each vertex first reached at hop
//! `h − 1` (the seeds at hop 1), with the `fanouts` counted bottom first
//! (Tandem's and DGL's order: `fanouts.last()` is the seeds' hop). Each hop is
//! one call of [`cpu_ops::sample_hop`] over every vertex reached so far, with a
//! skip mask on those sampled at an earlier hop, so:
//! - `n_id` lists the seeds first, then each hop's new vertices in order of
//!   first appearance; a vertex keeps its local id (its index in `n_id`) in
//!   every hop;
//! - hop `h`'s edges point from a source (any of the first `num_src` vertices)
//!   to a destination among the vertices first reached at hop `h − 1`.
//!
//! # Threads, order and shutdown
//! 1. [`NeighborLoader::new`] checks every argument (fanouts, batch size,
//!    seeds, device, feature-cache budget, prefetch) before any work starts.
//! 2. [`NeighborLoader::epoch`] orders the seeds for the next epoch (shuffled
//!    with `derive_seed(seed, epoch)` when asked) and starts one worker thread
//!    that builds batch `k` with seed `derive_seed(derive_seed(seed, epoch),
//!    k)`, in order, inside the loader's own rayon pool (`threads` workers);
//!    every random choice depends on these seeds only, so the batches are the
//!    same for any `prefetch` and thread count.
//! 3. The worker sends each batch into a channel of `prefetch − 1` slots, so at
//!    most `prefetch` batches exist ahead of the one the consumer holds (one in
//!    the worker's hands while it waits to send).
//! 4. Dropping the [`Epoch`] raises its stop flag, drops the receiving end and
//!    joins the worker: the worker checks the flag before each batch and each
//!    hop, and a send to a dropped receiver fails, so it ends within the hop it
//!    is in. [`NeighborLoader::workers_running`] and
//!    [`NeighborLoader::batches_built`] let a caller (and the tests) count it.
//! 5. A batch's feature rows may be given back when the consumer is done with
//!    them ([`NeighborLoader::recycle`]; the Python package does it when numpy
//!    frees `x`): the loader keeps up to `prefetch + 1` buffers and the next
//!    batches overwrite them instead of allocating ([`RowBuffers`]).
//!
//! # Devices
//! [`NeighborLoader`] samples with `cpu_ops`' sampler and gathers from the
//! dataset's feature rows in host memory; its batches are host arrays.
//! [`DeviceLoader`] (`device.rs`) builds the same batches on a backend (the
//! device sampler, the device feature cache) and leaves them in device
//! buffers (the Python package's `device="cuda"` hands them over by DLPack).
//! [`NeighborLoader`] checks a `device` of `Cuda` (compiled in, present, the
//! feature-cache budget within its free memory) and then refuses it, naming
//! [`DeviceLoader`]; `Auto` takes the host path and says so in
//! [`NeighborLoader::note`].

mod batch;
mod device;
#[cfg(test)]
mod device_tests;
mod pool;
#[cfg(test)]
mod tests;
mod worker;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub use gpu_ops::FeatureDtype;
/// The backends a [`DeviceLoader`] runs on, for callers that name them (the
/// Python package).
pub use gpu_ops::{Backend, CudaBackend, HostBackend};

pub use batch::{Batch, Features, Hop};
pub use device::{plan_memory, DeviceHop, DeviceLoader, DeviceMemoryPlan, DeviceMiniBatch};
pub use pool::RowBuffers;
pub use worker::Epoch;

use crate::data::Dataset;
use crate::error::{Error, Result};

/// Where the loader samples and gathers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoaderDevice {
    /// A usable GPU's device loader when one is built and present, else the
    /// host ([`NeighborLoader`]'s batches are host arrays: always the host).
    #[default]
    Auto,
    /// The host: `cpu_ops`' sampler and gather, batches in host memory.
    Host,
    /// CUDA device `ordinal` (checked, then refused by [`NeighborLoader`]:
    /// device batches come from [`DeviceLoader`]).
    Cuda(usize),
}

/// How to build a [`NeighborLoader`].
#[derive(Clone, Debug)]
pub struct LoaderOptions {
    /// Neighbors drawn per vertex and hop, bottom (input) layer first; the last
    /// entry is the seeds' hop. [`cpu_ops::ALL_NEIGHBORS`] takes every neighbor.
    pub fanouts: Vec<u32>,
    /// Seeds per batch (the last batch of an epoch may hold fewer).
    pub batch_size: usize,
    /// The seed vertices (distinct); `None`: the dataset's training vertices.
    pub seeds: Option<Vec<u32>>,
    /// Shuffle the seeds at the start of each epoch.
    pub shuffle: bool,
    /// Where to sample and gather.
    pub device: LoaderDevice,
    /// Device feature-cache budget in bytes; `None`: decided from free memory.
    /// Unused on the host (every row is in host memory already).
    pub feature_cache_bytes: Option<u64>,
    /// The element type of the gathered feature rows.
    pub feature_dtype: FeatureDtype,
    /// Batches built ahead of the one the consumer holds (at least 1).
    pub prefetch: usize,
    /// Fixes the order and every sampled neighbor.
    pub seed: u64,
    /// Workers of the loader's sampling and gathering pool (0: one per core).
    pub threads: usize,
    /// Also build each batch's [`Batch::edge_index`] (PyG's int64 COO) on the
    /// worker, ahead of the consumer.
    pub edge_index: bool,
}

impl LoaderOptions {
    /// Options with the defaults of `tandem.NeighborLoader`: the training
    /// vertices, shuffled, host or auto device, f32 rows, `prefetch = 2`, seed 0,
    /// one worker per core.
    pub fn new(fanouts: Vec<u32>, batch_size: usize) -> Self {
        Self {
            fanouts,
            batch_size,
            seeds: None,
            shuffle: true,
            device: LoaderDevice::Auto,
            feature_cache_bytes: None,
            feature_dtype: FeatureDtype::F32,
            prefetch: 2,
            seed: 0,
            threads: 0,
            edge_index: false,
        }
    }
}

/// State the loader shares with its workers.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Batches built by every worker so far.
    pub built: AtomicUsize,
    /// Workers started and not yet ended.
    pub running: AtomicUsize,
}

/// Samples and gathers mini-batches ahead of the caller (module doc).
pub struct NeighborLoader {
    ds: Arc<Dataset>,
    fanouts: Arc<[u32]>,
    batch_size: usize,
    seeds: Arc<[u32]>,
    shuffle: bool,
    feature_dtype: FeatureDtype,
    edge_index: bool,
    prefetch: usize,
    seed: u64,
    pool: Arc<rayon::ThreadPool>,
    /// The epoch [`NeighborLoader::epoch`] starts next (shared: a Python
    /// iterator starts epochs through `&self`).
    next_epoch: AtomicUsize,
    counters: Arc<Counters>,
    buffers: Arc<RowBuffers>,
    note: String,
}

impl std::fmt::Debug for NeighborLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NeighborLoader")
            .field("fanouts", &self.fanouts)
            .field("batch_size", &self.batch_size)
            .field("seeds", &self.seeds.len())
            .field("prefetch", &self.prefetch)
            .field("note", &self.note)
            .finish_non_exhaustive()
    }
}

impl NeighborLoader {
    /// Checks `opts` against `ds` and builds the loader; no worker starts before
    /// [`NeighborLoader::epoch`]. Errors ([`Error::InvalidArgument`] naming the
    /// argument, or [`Error::CudaNotCompiled`] / [`Error::Device`] for the
    /// device) come before any work.
    pub fn new(ds: Arc<Dataset>, opts: LoaderOptions) -> Result<Self> {
        let Checked { seeds } = checked(&ds, &opts)?;
        let note = resolve_device(opts.device, opts.feature_cache_bytes, &ds)?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.threads)
            .thread_name(|i| format!("tandem-loader-{i}"))
            .build()
            .map_err(|e| Error::invalid_argument("threads", e.to_string()))?;
        Ok(Self {
            ds,
            fanouts: opts.fanouts.into(),
            batch_size: opts.batch_size,
            seeds: seeds.into(),
            shuffle: opts.shuffle,
            feature_dtype: opts.feature_dtype,
            edge_index: opts.edge_index,
            prefetch: opts.prefetch,
            seed: opts.seed,
            pool: Arc::new(pool),
            next_epoch: AtomicUsize::new(0),
            counters: Arc::default(),
            // Every batch that can exist at once: `prefetch` ahead and the
            // one the consumer holds.
            buffers: Arc::new(RowBuffers::new(opts.prefetch + 1)),
            note,
        })
    }

    /// Starts the next epoch's worker and returns its batches (module doc,
    /// steps 2–4). Epochs are numbered from 0 in the order they are started.
    pub fn epoch(&self) -> Epoch {
        let e = self.next_epoch.fetch_add(1, Ordering::AcqRel);
        self.epoch_at(e)
    }

    /// Epoch `epoch`'s batches, without moving the epoch counter: the same
    /// batches [`NeighborLoader::epoch`] gives for that epoch.
    pub fn epoch_at(&self, epoch: usize) -> Epoch {
        let (base, order) = epoch_order(&self.seeds, self.shuffle, self.seed, epoch);
        worker::start(worker::Job {
            ds: Arc::clone(&self.ds),
            fanouts: Arc::clone(&self.fanouts),
            order,
            batch_size: self.batch_size,
            base,
            feature_dtype: self.feature_dtype,
            edge_index: self.edge_index,
            prefetch: self.prefetch,
            pool: Arc::clone(&self.pool),
            counters: Arc::clone(&self.counters),
            buffers: Arc::clone(&self.buffers),
        })
    }

    /// The element type of the gathered feature rows.
    pub fn feature_dtype(&self) -> FeatureDtype {
        self.feature_dtype
    }

    /// Gives a finished batch's feature rows back, so that a later batch
    /// overwrites them instead of allocating (`loader/pool.rs`); optional.
    pub fn recycle(&self, x: Features) {
        self.buffers.give(x);
    }

    /// The loader's kept feature buffers, for an owner that gives rows back
    /// after the loader is gone (the Python package's arrays).
    pub fn buffers(&self) -> &Arc<RowBuffers> {
        &self.buffers
    }

    /// Batches per epoch.
    pub fn num_batches(&self) -> usize {
        self.seeds.len().div_ceil(self.batch_size)
    }

    /// The seed vertices, in their given order.
    pub fn seeds(&self) -> &[u32] {
        &self.seeds
    }

    /// The fanouts, bottom first.
    pub fn fanouts(&self) -> &[u32] {
        &self.fanouts
    }

    /// The dataset the batches come from.
    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.ds
    }

    /// One line: where the loader runs and why.
    pub fn note(&self) -> &str {
        &self.note
    }

    /// Batches built so far over every epoch (counted when a batch is complete,
    /// before it is queued).
    pub fn batches_built(&self) -> usize {
        self.counters.built.load(Ordering::Acquire)
    }

    /// Worker threads started and not yet ended (0 once every [`Epoch`] is
    /// dropped).
    pub fn workers_running(&self) -> usize {
        self.counters.running.load(Ordering::Acquire)
    }
}

impl LoaderOptions {
    fn seeds_given(&self) -> &'static str {
        if self.seeds.is_some() {
            "seeds"
        } else {
            "seeds (the dataset's training vertices)"
        }
    }
}

/// Epoch `epoch`'s seed and its seeds in order (shuffled with that seed when
/// asked): both loaders' epochs start here, so they draw the same batches.
pub(crate) fn epoch_order(
    seeds: &[u32],
    shuffle: bool,
    seed: u64,
    epoch: usize,
) -> (u64, Vec<u32>) {
    let base = cpu_ops::derive_seed(seed, epoch as u64);
    let mut order = seeds.to_vec();
    if shuffle {
        cpu_ops::Rng::new(base).shuffle(&mut order);
    }
    (base, order)
}

/// Batch `k`'s seeds in an epoch's `order` (the last batch may be short).
pub(crate) fn batch_seeds(order: &[u32], batch_size: usize, k: usize) -> &[u32] {
    let from = k * batch_size;
    &order[from..(from + batch_size).min(order.len())]
}

/// What [`checked`] resolved.
pub(crate) struct Checked {
    /// The seeds (given, or the training vertices).
    pub seeds: Vec<u32>,
}

/// The checks both loaders make before any work: fanouts, batch size,
/// prefetch and seeds.
pub(crate) fn checked(ds: &Dataset, opts: &LoaderOptions) -> Result<Checked> {
    check_fanouts(&opts.fanouts)?;
    if opts.batch_size == 0 {
        return Err(Error::invalid_argument("batch_size", "must be at least 1"));
    }
    if opts.prefetch == 0 {
        return Err(Error::invalid_argument(
            "prefetch",
            "must be at least 1 (batches built ahead of the one in use)",
        ));
    }
    let seeds: Vec<u32> = match &opts.seeds {
        Some(s) => s.clone(),
        None => ds.train_ids(),
    };
    check_seeds(&seeds, ds.num_vertices(), opts.seeds_given())?;
    Ok(Checked { seeds })
}

/// Fanouts: at least one hop, none 0.
fn check_fanouts(fanouts: &[u32]) -> Result<()> {
    if fanouts.is_empty() {
        return Err(Error::invalid_argument(
            "fanouts",
            "at least one hop is needed (e.g. [15, 10, 5])",
        ));
    }
    if let Some(i) = fanouts.iter().position(|&f| f == 0) {
        return Err(Error::invalid_argument(
            "fanouts",
            format!(
                "fanouts[{i}] is 0; each hop draws at least one neighbor (-1 or \
                 ALL_NEIGHBORS takes every one)"
            ),
        ));
    }
    Ok(())
}

/// Seeds: not empty, each a vertex, none repeated.
fn check_seeds(seeds: &[u32], n: usize, name: &str) -> Result<()> {
    if seeds.is_empty() {
        return Err(Error::invalid_argument(name, "no seed vertices"));
    }
    let mut first = vec![u32::MAX; n];
    for (i, &s) in seeds.iter().enumerate() {
        let Some(slot) = first.get_mut(s as usize) else {
            return Err(Error::invalid_argument(
                name,
                format!("seeds[{i}] = {s} is not a vertex (the graph has {n})"),
            ));
        };
        if *slot != u32::MAX {
            return Err(Error::invalid_argument(
                name,
                format!("seeds[{i}] = {s} repeats seeds[{}]", *slot),
            ));
        }
        *slot = i as u32;
    }
    Ok(())
}

/// The device check (module doc, "Devices"): the note for the host path, or
/// the error that names the argument.
fn resolve_device(device: LoaderDevice, cache: Option<u64>, ds: &Dataset) -> Result<String> {
    let host_cache = if cache.is_some() {
        "; feature_cache_bytes unused (every row is in host memory)"
    } else {
        ""
    };
    match device {
        LoaderDevice::Host => Ok(format!("device: host (asked){host_cache}")),
        LoaderDevice::Auto => Ok(format!(
            "device: host (device = \"auto\" gives host batches; device = \"cuda\" gives them on the GPU){host_cache}"
        )),
        LoaderDevice::Cuda(ordinal) => {
            let free = cuda_free_bytes(ordinal)?;
            let rows = ds.features.num_rows() as u64 * ds.features.dim() as u64 * 4;
            if let Some(bytes) = cache {
                if bytes > free {
                    return Err(Error::invalid_argument(
                        "feature_cache_bytes",
                        format!(
                            "{bytes} bytes asked but cuda:{ordinal} has {free} bytes free \
                             (the features take {rows} bytes in f32)"
                        ),
                    ));
                }
            }
            Err(Error::invalid_argument(
                "device",
                format!(
                    "cuda:{ordinal} is there, but NeighborLoader's batches are host arrays: \
                     build a DeviceLoader for batches on the device"
                ),
            ))
        }
    }
}

/// Free memory of CUDA device `ordinal`, or the error naming `device`.
#[cfg(feature = "cuda")]
fn cuda_free_bytes(ordinal: usize) -> Result<u64> {
    use gpu_ops::DeviceCore;
    let dev = gpu_ops::CudaBackend::new(ordinal)
        .map_err(|source| Error::device(format!("device = \"cuda:{ordinal}\""), source))?;
    let info = dev
        .memory_info()
        .map_err(|source| Error::device(format!("device = \"cuda:{ordinal}\""), source))?;
    Ok(info.free as u64)
}

#[cfg(not(feature = "cuda"))]
fn cuda_free_bytes(ordinal: usize) -> Result<u64> {
    Err(Error::CudaNotCompiled {
        context: format!("device = \"cuda:{ordinal}\""),
    })
}
