//! The device loader: the same batches as the host loader, sampled and
//! gathered on a backend ([`gpu_ops::Backend`]: CUDA, or the host backend that
//! stands in for it in tests), and left there as device buffers for a model on
//! that device.
//!
//! # What runs where
//! 1. [`DeviceLoader::new`] checks the options as the host loader does, then
//!    loads the topology and the features onto the backend: the topology in
//!    device memory when it takes at most a quarter of the free memory (else
//!    it stays in pinned host memory, read over the bus), and a feature cache
//!    of the highest-degree rows ([`plan_memory`]); rows past the cache are
//!    read from pinned host memory at each gather.
//! 2. Each batch is built on the worker thread (`worker.rs`, the host
//!    loader's) with the backend's own stream: the seeds are uploaded, each
//!    hop is one [`Sampling::sample_hop`] over every vertex reached so far with
//!    the vertices sampled at an earlier hop masked out (the host loader's
//!    rule, so `n_id` and every hop have the host loader's layout), and the
//!    input rows are gathered through the cache into one `f32` buffer (a bf16
//!    store is widened by the gather). An event is recorded after the batch's
//!    last kernel ([`DeviceMiniBatch::ready`]).
//! 3. Sampling reads each hop's size back (one synchronization per hop, on the
//!    loader's stream only); the gather does not synchronize.
//!
//! # Determinism
//! Hop `h` of batch `k` draws with `derive_seed(derive_seed(derive_seed(seed,
//! epoch), k), h)`, as the host loader does. On the host backend
//! `sample_hop` is `cpu_ops::sample_hop`, so the batches equal the host
//! loader's bit for bit ([`DeviceMiniBatch::to_host`], tested); CUDA draws its
//! own (deterministic) sample for the same seeds.
//!
//! A consumer on another stream must wait for [`DeviceMiniBatch::ready`]
//! before it reads the buffers, and must be done with them before they are
//! dropped (the loader's stream may reuse their memory after the drop).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cpu_ops::derive_seed;
use gpu_ops::{Backend, DeviceCore, TopologyPlacement};

use super::batch::{Batch, Features, Hop};
use super::worker::{spawn, Epoch, MakeBatch};
use super::{batch_seeds, checked, epoch_order, Counters, FeatureDtype, LoaderOptions};
use crate::data::Dataset;
use crate::error::{Error, Result};

/// One hop of a [`DeviceMiniBatch`]: the host loader's [`Hop`] with its CSR in
/// a device block (destinations `n_id[..num_dst]`, sources `n_id[..num_src]`).
pub struct DeviceHop<B: DeviceCore> {
    /// Destinations: the vertices reached before this hop.
    pub num_dst: usize,
    /// Sources: the vertices reached up to this hop.
    pub num_src: usize,
    /// The first destination sampled at this hop (earlier ones have no edges).
    pub first_sampled: usize,
    /// Sampled edges.
    pub num_edges: usize,
    /// The hop's CSR over its destinations, local source ids.
    pub block: B::Block,
}

/// One mini-batch left on the device (module doc): the host [`Batch`]'s
/// fields, with `n_id`, the hops and the feature rows in device buffers.
pub struct DeviceMiniBatch<B: DeviceCore> {
    /// Its index in the epoch.
    pub index: usize,
    /// Seeds: the first `num_seeds` entries of `n_id`.
    pub num_seeds: usize,
    /// Input vertices (global ids), `num_nodes` of them: the seeds, then each
    /// hop's new vertices.
    pub n_id: B::Buf<u32>,
    /// Entries of `n_id` in use (the buffer may be longer).
    pub num_nodes: usize,
    /// The hops from the seeds outwards.
    pub hops: Vec<DeviceHop<B>>,
    /// Feature columns.
    pub dim: usize,
    /// `num_nodes × dim` feature rows, row-major, `f32`.
    pub x: B::Buf<f32>,
    /// The seeds' class labels (the seeds are known on the host).
    pub y: Vec<u32>,
    /// Recorded on the loader's stream after the batch's last kernel.
    pub ready: B::Event,
}

impl<B: Backend> DeviceMiniBatch<B> {
    /// The batch copied to host memory as the host loader lays it out
    /// (synchronizes the loader's stream): for tests, and for a consumer
    /// without device memory of its own.
    pub fn to_host(&self, dev: &B) -> Result<Batch> {
        let err = |what: &'static str| {
            move |source| Error::device(format!("loader: copying {what} to the host"), source)
        };
        let n_id = dev
            .to_host(&self.n_id, self.num_nodes)
            .map_err(err("n_id"))?;
        let mut hops = Vec::with_capacity(self.hops.len());
        for h in &self.hops {
            let (indptr, indices) = dev.block_to_host(&h.block).map_err(err("a hop"))?;
            hops.push(Hop {
                num_dst: h.num_dst,
                num_src: h.num_src,
                first_sampled: h.first_sampled,
                indptr,
                indices,
            });
        }
        let x = dev
            .to_host(&self.x, self.num_nodes * self.dim)
            .map_err(err("the feature rows"))?;
        Ok(Batch {
            index: self.index,
            num_seeds: self.num_seeds,
            n_id,
            hops,
            dim: self.dim,
            x: Features::F32(x),
            y: self.y.clone(),
            edge_index: None,
        })
    }
}

/// Where the loader puts the topology and how large a feature cache it keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMemoryPlan {
    /// Where the topology lives.
    pub topology: TopologyPlacement,
    /// Bytes of the topology (`8(n+1) + 4m`).
    pub topology_bytes: u64,
    /// Bytes of the feature cache.
    pub cache_bytes: u64,
    /// Bytes of the whole feature matrix in the stored dtype.
    pub feature_bytes: u64,
}

/// Divides `free` device bytes (module doc, step 1): the topology on the
/// device when it takes at most a quarter of `free`; the cache `asked`, or by
/// default half of what the topology leaves (the rest is the model's, which
/// shares the device), never more than the matrix.
pub fn plan_memory(
    ds: &Dataset,
    dtype: FeatureDtype,
    asked: Option<u64>,
    free: u64,
) -> DeviceMemoryPlan {
    let n = ds.num_vertices() as u64;
    let topology_bytes = 8 * (n + 1) + 4 * ds.graph.num_edges() as u64;
    let on_device = topology_bytes <= free / 4;
    let elem = match dtype {
        FeatureDtype::F32 => 4,
        FeatureDtype::Bf16 => 2,
    };
    let feature_bytes = ds.features.num_rows() as u64 * ds.features.dim() as u64 * elem;
    let left = free.saturating_sub(if on_device { topology_bytes } else { 0 });
    let cache_bytes = asked.unwrap_or(left / 2).min(feature_bytes);
    DeviceMemoryPlan {
        topology: if on_device {
            TopologyPlacement::Device
        } else {
            TopologyPlacement::PinnedHost
        },
        topology_bytes,
        cache_bytes,
        feature_bytes,
    }
}

/// The dataset as the backend holds it, shared with the epochs' workers.
struct OnDevice<B: Backend> {
    dev: Arc<B>,
    graph: B::Graph,
    features: B::Features,
    ds: Arc<Dataset>,
}

/// Samples and gathers mini-batches on a backend, ahead of the caller (module
/// doc); the batches stay in its memory.
pub struct DeviceLoader<B: Backend> {
    on: Arc<OnDevice<B>>,
    fanouts: Arc<[u32]>,
    batch_size: usize,
    seeds: Arc<[u32]>,
    shuffle: bool,
    prefetch: usize,
    seed: u64,
    feature_dtype: FeatureDtype,
    next_epoch: AtomicUsize,
    counters: Arc<Counters>,
    plan: DeviceMemoryPlan,
    note: String,
}

impl<B: Backend> std::fmt::Debug for DeviceLoader<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceLoader")
            .field("fanouts", &self.fanouts)
            .field("batch_size", &self.batch_size)
            .field("seeds", &self.seeds.len())
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> DeviceLoader<B> {
    /// Checks `opts` against `ds` (the host loader's checks, and a
    /// `feature_cache_bytes` within the backend's free memory), then loads the
    /// topology and the feature cache onto `dev` (module doc, step 1).
    /// `opts.device` and `opts.threads` are not read: `dev` is the device,
    /// and its stream does the work. `opts.edge_index` is not built here.
    pub fn new(dev: B, ds: Arc<Dataset>, opts: LoaderOptions) -> Result<Self> {
        let c = checked(&ds, &opts)?;
        let on_dev =
            |what: &'static str| move |source| Error::device(format!("loader: {what}"), source);
        let free = dev
            .memory_info()
            .map_err(on_dev("reading free device memory"))?
            .free as u64;
        if let Some(bytes) = opts.feature_cache_bytes {
            if bytes > free {
                return Err(Error::invalid_argument(
                    "feature_cache_bytes",
                    format!("{bytes} bytes asked but the device has {free} bytes free"),
                ));
            }
        }
        let plan = plan_memory(&ds, opts.feature_dtype, opts.feature_cache_bytes, free);
        let graph = dev
            .load_graph(&ds.graph, plan.topology)
            .map_err(on_dev("loading the topology"))?;
        let features = dev
            .load_features(
                &ds.features,
                &ds.degree_order(),
                plan.cache_bytes as usize,
                opts.feature_dtype,
            )
            .map_err(on_dev("loading the features"))?;
        let share = if plan.feature_bytes == 0 {
            100.0
        } else {
            100.0 * plan.cache_bytes as f64 / plan.feature_bytes as f64
        };
        let note = format!(
            "device: {} (topology {} MiB {}, feature cache {} MiB = {share:.0}% of the rows in {})",
            dev.describe(),
            plan.topology_bytes >> 20,
            match plan.topology {
                TopologyPlacement::Device => "on the device",
                TopologyPlacement::PinnedHost => "in pinned host memory",
            },
            plan.cache_bytes >> 20,
            match opts.feature_dtype {
                FeatureDtype::F32 => "f32",
                FeatureDtype::Bf16 => "bf16",
            },
        );
        Ok(Self {
            on: Arc::new(OnDevice {
                dev: Arc::new(dev),
                graph,
                features,
                ds,
            }),
            fanouts: opts.fanouts.into(),
            batch_size: opts.batch_size,
            seeds: c.seeds.into(),
            shuffle: opts.shuffle,
            prefetch: opts.prefetch,
            seed: opts.seed,
            feature_dtype: opts.feature_dtype,
            next_epoch: AtomicUsize::new(0),
            counters: Arc::default(),
            plan,
            note,
        })
    }

    /// Starts the next epoch's worker and returns its batches.
    pub fn epoch(&self) -> Epoch<DeviceMiniBatch<B>> {
        let e = self.next_epoch.fetch_add(1, Ordering::AcqRel);
        self.epoch_at(e)
    }

    /// Epoch `epoch`'s batches, without moving the epoch counter.
    pub fn epoch_at(&self, epoch: usize) -> Epoch<DeviceMiniBatch<B>> {
        let (base, order) = epoch_order(&self.seeds, self.shuffle, self.seed, epoch);
        let batches = order.len().div_ceil(self.batch_size);
        let (on, fanouts, batch_size) = (
            Arc::clone(&self.on),
            Arc::clone(&self.fanouts),
            self.batch_size,
        );
        let make: MakeBatch<DeviceMiniBatch<B>> = Box::new(move |k, stopped| {
            let seeds = batch_seeds(&order, batch_size, k);
            build(
                &on,
                &fanouts,
                seeds,
                k,
                derive_seed(base, k as u64),
                stopped,
            )
        });
        spawn(batches, self.prefetch, &self.counters, make)
    }

    /// The backend the batches live on (to read them, or wait for
    /// [`DeviceMiniBatch::ready`]).
    pub fn device(&self) -> &B {
        &self.on.dev
    }

    /// The backend, shared: for an owner of batches that may outlive the
    /// loader (the Python package's device arrays).
    pub fn device_handle(&self) -> Arc<B> {
        Arc::clone(&self.on.dev)
    }

    /// The seed vertices, in their given order.
    pub fn seeds(&self) -> &[u32] {
        &self.seeds
    }

    /// The fanouts, bottom first.
    pub fn fanouts(&self) -> &[u32] {
        &self.fanouts
    }

    /// The element type of the device feature store (the rows handed out are
    /// `f32` either way).
    pub fn feature_dtype(&self) -> FeatureDtype {
        self.feature_dtype
    }

    /// How the device memory was divided.
    pub fn memory_plan(&self) -> DeviceMemoryPlan {
        self.plan
    }

    /// Feature-cache hits and misses so far (as of the loader stream's last
    /// synchronization).
    pub fn cache_stats(&self) -> gpu_ops::CacheStats {
        self.on.dev.cache_stats(&self.on.features)
    }

    /// Zeroes the feature-cache hit and miss counts.
    pub fn reset_cache_stats(&self) {
        self.on.dev.reset_cache_stats(&self.on.features);
    }

    /// Batches per epoch.
    pub fn num_batches(&self) -> usize {
        self.seeds.len().div_ceil(self.batch_size)
    }

    /// One line: the device and how its memory was divided.
    pub fn note(&self) -> &str {
        &self.note
    }

    /// Batches built so far over every epoch.
    pub fn batches_built(&self) -> usize {
        self.counters.built.load(Ordering::Acquire)
    }

    /// Worker threads started and not yet ended.
    pub fn workers_running(&self) -> usize {
        self.counters.running.load(Ordering::Acquire)
    }
}

/// Samples and gathers one batch on the backend (module doc, step 2); `stop`
/// is asked between hops.
fn build<B: Backend>(
    on: &OnDevice<B>,
    fanouts: &[u32],
    seeds: &[u32],
    index: usize,
    seed: u64,
    stop: &dyn Fn() -> bool,
) -> Result<Option<DeviceMiniBatch<B>>> {
    let dev = &on.dev;
    let err = |what: &'static str| move |source| Error::device(format!("loader: {what}"), source);
    let mut n_id = dev.to_device(seeds).map_err(err("uploading the seeds"))?;
    let mut num_nodes = seeds.len();
    let mut first_sampled = 0;
    let mut hops = Vec::with_capacity(fanouts.len());
    let mut skip = Vec::new();
    for (h, &fanout) in fanouts.iter().rev().enumerate() {
        if stop() {
            return Ok(None);
        }
        skip.clear();
        skip.resize(num_nodes, 1u8);
        skip[first_sampled..].fill(0);
        let mask = dev
            .to_device(&skip)
            .map_err(err("uploading a hop's mask"))?;
        let (block, src_ids, num_src) = dev
            .sample_hop(
                &on.graph,
                &n_id,
                num_nodes,
                fanout,
                derive_seed(seed, h as u64),
                Some(&mask),
            )
            .map_err(err("sampling"))?;
        let (_, _, num_edges) = dev.block_shape(&block);
        hops.push(DeviceHop {
            num_dst: num_nodes,
            num_src,
            first_sampled,
            num_edges,
            block,
        });
        first_sampled = num_nodes;
        num_nodes = num_src;
        n_id = src_ids;
    }
    let dim = dev.feature_dim(&on.features);
    let mut x = dev
        .alloc_uninit::<f32>(num_nodes * dim)
        .map_err(err("allocating the feature rows"))?;
    dev.gather(&on.features, &n_id, num_nodes, &mut x)
        .map_err(err("gathering features"))?;
    let ready = dev
        .record_event(dev.stream())
        .map_err(err("recording the batch's event"))?;
    let labels = on.ds.labels.as_slice();
    Ok(Some(DeviceMiniBatch {
        index,
        num_seeds: seeds.len(),
        n_id,
        num_nodes,
        hops,
        dim,
        x,
        y: seeds.iter().map(|&s| labels[s as usize]).collect(),
        ready,
    }))
}
