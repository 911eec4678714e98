//! One dataset and one model on one `gpu_ops` backend (the host backend or
//! CUDA): the device-level mechanisms every executor composes
//! (`crate::executor`). Mechanisms only: each strategy's device half lives in
//! its executor's folder (`executor/step/device.rs`, `executor/layer/device/`),
//! and the placement decides every option before the engine is built
//! (`placement/budget.rs`: topology, feature cache, loss lag).
//!
//! A [`DeviceEngine`] holds:
//! - the **model and optimizer state**: the [`DeviceModel`] — parameters,
//!   gradients and Adam's state: the weights of the run, held nowhere else —
//!   behind [`ModelState`] for the session (checkpoints, inference);
//! - the **topology and the feature cache** (`device.cache_bytes` of the
//!   highest-degree rows), the gather through it or from a [`RowSource`], and
//!   sparse input rows (`engine/input.rs`);
//! - the **sampling sibling** and the one look-ahead mechanism
//!   (`engine/sibling.rs`);
//! - the **loss slots** of deferred losses and their reads
//!   (`engine/losses.rs`), through pinned downloads (`engine/pinned.rs`);
//! - the **memory estimate** the placement checks a run against
//!   (`engine/memory.rs`).
//!
//! Every batch counts the bytes it moved host → device ([`ModelState::h2d_bytes`]).
//! Evaluation runs on the device too: layer-wise full-graph inference (the whole
//! graph as one block per layer) or sampled mini-batches.

mod input;
mod losses;
pub(crate) mod memory;
mod pinned;
mod sibling;

pub(crate) use input::{density, sparse_rows_where};
pub(crate) use losses::{
    BatchDone, DeferredLosses, LossReads, LossSlots, PendingLosses, Read, Trained,
};
pub(crate) use pinned::{PendingCopy, PendingParams, PinnedPool};
pub(crate) use sibling::SAMPLE_GROUP;

use std::sync::Arc;

use cpu_ops::{AdamConfig, ModelConfig};
use gpu_ops::{Backend, CacheStats, DeviceModel, GpuOpsError, TopologyPlacement};

use crate::data::dataset::Dataset;
use crate::error::{Error, Result};
use crate::task::HostTarget;
use crate::trace::{Tracer, TrackId, TrackKind};

/// How to set a [`DeviceEngine`] up: decided values only (the placement
/// resolves `"auto"` keys and the memory budget first, `placement/budget.rs`).
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Training fanouts, bottom first.
    pub fanouts: Vec<u32>,
    /// Evaluation fanouts, bottom first.
    pub eval_fanouts: Vec<u32>,
    /// Feature-cache budget in bytes.
    pub cache_bytes: usize,
    /// Where the topology lives.
    pub topology: TopologyPlacement,
    /// Adam's hyper-parameters.
    pub adam: AdamConfig,
    /// The seed the weights are initialized from.
    pub init_seed: u64,
    /// The arithmetic of the model's matrix products (`model.precision`).
    pub precision: gpu_ops::Precision,
    /// Load the features onto the device only when a device gather first needs
    /// them: a rank with partitioned features (`dist.features =
    /// "partitioned"`) gets its rows from a [`RowSource`] instead and never
    /// loads (or pins) the whole feature matrix.
    pub defer_features: bool,
    /// How the device stores feature rows (`device.feature_dtype`).
    pub feature_dtype: gpu_ops::FeatureDtype,
    /// Input rows are sparse (`train.sparse_features`; `engine/input.rs`).
    pub sparse: bool,
    /// Sample device batches on a sibling stream (`device.sample_ahead`,
    /// `engine/sibling.rs`).
    pub sample_ahead: bool,
    /// Batches between a step and the read of its loss (`device.loss_lag`
    /// resolved; 1: every loss read at once; `engine/losses.rs`).
    pub loss_lag: usize,
    /// What the encoder's top layer feeds: class logits (node
    /// classification) or a pair decoder (link prediction).
    pub head: gpu_ops::Head,
}

#[cfg(test)]
impl EngineOptions {
    /// Unit tests' options: `fanouts` for training and evaluation, no feature
    /// cache, fp32 everything, every loss read at once; override fields with
    /// `..EngineOptions::for_tests(..)`.
    pub(crate) fn for_tests(fanouts: Vec<u32>) -> Self {
        EngineOptions {
            eval_fanouts: fanouts.clone(),
            fanouts,
            cache_bytes: 0,
            topology: TopologyPlacement::Device,
            adam: AdamConfig::default(),
            init_seed: 1,
            precision: gpu_ops::Precision::Fp32,
            defer_features: false,
            feature_dtype: gpu_ops::FeatureDtype::F32,
            sparse: false,
            sample_ahead: false,
            loss_lag: 1,
            head: gpu_ops::Head::Classify,
        }
    }
}

/// Where a device engine's input rows come from when the device does not hold
/// the features ([`DeviceEngine::set_row_source`]): a partitioned feature store,
/// whose gather is collective (every rank calls it once per batch, an empty
/// share included).
pub trait RowSource: Send + Sync {
    /// Writes the rows of `ids` into `out` (`ids.len() × dim`, resized) and
    /// returns the bytes exchanged with other ranks.
    fn gather(&self, ids: &[u32], out: &mut Vec<f32>) -> Result<u64>;
    /// [`RowSource::gather`] as bfloat16 bits (rounded to nearest even), for a
    /// device that stores bfloat16 rows. The default rounds what `gather`
    /// writes; a source whose rows already travel as bfloat16 passes them on.
    fn gather_bf16(&self, ids: &[u32], out: &mut Vec<u16>) -> Result<u64> {
        let mut rows = Vec::new();
        let bytes = self.gather(ids, &mut rows)?;
        out.clear();
        out.extend(rows.iter().map(|&v| gpu_ops::f32_to_bf16_bits(v)));
        Ok(bytes)
    }
    /// The rows of `ids` as sparse rows, and the bytes exchanged; `None` for a
    /// source without sparse rows (the engine then converts dense ones).
    fn gather_sparse(&self, ids: &[u32]) -> Result<Option<(cpu_ops::SparseRows<f32>, u64)>> {
        let _ = ids;
        Ok(None)
    }
}

/// A dataset and a model on one backend (module doc). The fields the
/// executors' device halves compose are visible to the crate; the rest is the
/// engine's own.
pub struct DeviceEngine<B: Backend> {
    pub(crate) dev: std::sync::Arc<B>,
    /// The sampling sibling (`device.sample_ahead`). Declared before `graph` so
    /// it drops first: the sibling reads the graph.
    pub(crate) sibling: sibling::Sibling<B>,
    pub(crate) graph: B::Graph,
    /// The device feature store (`None` until first needed with
    /// [`EngineOptions::defer_features`]).
    features: Option<B::Features>,
    /// Input rows from the host instead of the device store
    /// ([`DeviceEngine::set_row_source`]).
    pub(crate) rows: Option<Arc<dyn RowSource>>,
    /// Sparse feature rows (`train.sparse_features`; built on first use).
    sparse: Option<input::SparseStore<B>>,
    pub(crate) model: DeviceModel<B>,
    pub(crate) opts: EngineOptions,
    /// The dataset (shared, not copied).
    ds: Arc<Dataset>,
    num_classes: usize,
    num_vertices: usize,
    /// Reused gather buffer (grown on demand; ops read prefixes).
    x: Option<B::Buf<f32>>,
    /// Reused device buffer of host-gathered rows uploaded as bfloat16.
    bits: Option<B::Buf<u16>>,
    /// Reused host buffers of rows gathered on the host: f32 values, and the
    /// same rows as bfloat16 bits for an upload of half the bytes.
    host_rows: Vec<f32>,
    host_bits: Vec<u16>,
    /// The whole graph as one block, for full-graph inference (built on first use).
    full_block: Option<B::Block>,
    /// Host → device bytes of training batches so far.
    pub(crate) h2d: u64,
    /// Cache misses before the current batch's gather: its miss rows are added
    /// to `h2d` after the step's synchronization
    /// ([`DeviceEngine::settle_gather_misses`]).
    misses_before: Option<u64>,
    /// The deferred losses' slots and their reads (`engine/losses.rs`).
    pub(crate) losses: LossSlots<B>,
    pub(crate) tracer: Tracer,
    pub(crate) acc: TrackId,
}

pub(crate) fn dev_err(context: &'static str) -> impl Fn(GpuOpsError) -> Error {
    move |source| Error::device(context, source)
}

/// `buf`'s buffer, taken out, when it holds at least `n` elements; else a new
/// one a quarter larger (so slowly growing sizes do not reallocate per call),
/// not zeroed: for outputs the caller overwrites (reused gather and upload
/// buffers).
pub(crate) fn take_at_least<B: Backend, T: gpu_ops::Elem>(
    dev: &B,
    buf: &mut Option<B::Buf<T>>,
    n: usize,
    what: &'static str,
) -> Result<B::Buf<T>> {
    match buf.take() {
        Some(b) if dev.len(&b) >= n => Ok(b),
        _ => dev.alloc_uninit(n + n / 4).map_err(dev_err(what)),
    }
}

/// Adds to a `device step` / `train` slice's arguments what the batch cost in
/// copies, host synchronizations and zero-filled buffers (memsets on CUDA).
pub(crate) fn record_copies(
    args: Option<&mut crate::trace::Args>,
    copies: &gpu_ops::TransferStats,
) {
    if let Some(a) = args {
        // In the order a trace reader gives them back (by name).
        a.extra.push(("downloads".into(), copies.downloads as f64));
        a.extra.push(("host_syncs".into(), copies.syncs as f64));
        a.extra.push(("uploads".into(), copies.uploads as f64));
        a.extra
            .push(("zero_fills".into(), copies.zero_fills as f64));
    }
}

/// Loads `ds`'s features onto `dev` with a cache of the highest-degree rows.
fn load_features<B: Backend>(dev: &B, ds: &Dataset, opts: &EngineOptions) -> Result<B::Features> {
    dev.load_features(
        &ds.features,
        &ds.degree_order(),
        opts.cache_bytes,
        opts.feature_dtype,
    )
    .map_err(dev_err("loading the features"))
}

impl<B: Backend> DeviceEngine<B> {
    /// Loads `ds` (topology, features with a cache of the highest-degree rows)
    /// and `model` onto `dev`, as `opts` decided (the placement checked that it
    /// fits, `placement/budget.rs`).
    pub fn new(
        dev: B,
        ds: &Arc<Dataset>,
        model: &ModelConfig,
        opts: EngineOptions,
    ) -> Result<Self> {
        dev.set_precision(opts.precision)
            .map_err(dev_err("setting model.precision"))?;
        let graph = dev
            .load_graph(&ds.graph, opts.topology)
            .map_err(dev_err("loading the topology"))?;
        let features = if opts.defer_features || opts.sparse {
            None
        } else {
            Some(load_features(&dev, ds, &opts)?)
        };
        let dm = DeviceModel::with_head(&dev, model, opts.head, opts.init_seed, opts.adam)
            .map_err(dev_err("model"))?;
        let tracer = Tracer::disabled();
        Ok(Self {
            h2d: 0,
            misses_before: None,
            losses: LossSlots::new(opts.loss_lag),
            acc: tracer.declare_track("acc", TrackKind::Accelerator),
            tracer,
            graph,
            features,
            rows: None,
            sparse: None,
            model: dm,
            ds: Arc::clone(ds),
            num_classes: ds.num_classes as usize,
            num_vertices: ds.num_vertices(),
            x: None,
            bits: None,
            host_rows: Vec::new(),
            host_bits: Vec::new(),
            full_block: None,
            sibling: sibling::Sibling::default(),
            opts,
            dev: std::sync::Arc::new(dev),
        })
    }

    /// The device feature store, loaded on first use.
    fn features(&mut self) -> Result<&mut B::Features> {
        if self.features.is_none() {
            let f = load_features(&*self.dev, &self.ds, &self.opts)?;
            self.features = Some(f);
        }
        self.features
            .as_mut()
            .ok_or_else(|| Error::invalid_argument("features", "internal: not loaded"))
    }

    /// Whether vertex `v`'s row is in the device cache (tests).
    #[cfg(test)]
    pub(crate) fn is_cached(&mut self, v: u32) -> bool {
        let dev = std::sync::Arc::clone(&self.dev);
        self.features().is_ok_and(|f| dev.is_cached(f, v))
    }

    /// Gathers the rows of `ids` (on the device, `n` of them) into the reused
    /// buffer: through the device feature cache, or with a row source on the
    /// host (the ids downloaded, the rows uploaded).
    fn gather(&mut self, ids: &B::Buf<u32>, n: usize) -> Result<B::Buf<f32>> {
        if self.rows.is_some() {
            let host_ids = self
                .dev
                .to_host(ids, n)
                .map_err(dev_err("downloading input ids"))?;
            let values = self.gather_on_host(&host_ids)?;
            return self.upload_gathered(values);
        }
        let need = n * self.ds.features.dim();
        let mut x = take_at_least(&*self.dev, &mut self.x, need, "gather buffer")?;
        let dev = Arc::clone(&self.dev);
        dev.gather(self.features()?, ids, n, &mut x)
            .map_err(dev_err("gather"))?;
        Ok(x)
    }

    /// Samples blocks for `seeds` (training or evaluation fanouts) and gathers their
    /// input rows.
    fn sample_and_gather(
        &mut self,
        seeds: &[u32],
        eval: bool,
        seed: u64,
    ) -> Result<(gpu_ops::DeviceBatch<B>, input::Input<B>)> {
        let fanouts = if eval {
            &self.opts.eval_fanouts
        } else {
            &self.opts.fanouts
        };
        let batch = self
            .dev
            .sample(&self.graph, seeds, fanouts, seed)
            .map_err(dev_err("sampling"))?;
        let n_in = self.dev.block_shape(&batch.blocks[0]).0;
        let x = self.gather_input(&batch.src_ids[0], n_in)?;
        Ok((batch, x))
    }

    /// The decoder's scores of pairs `(src[i], dst[i])` of rows of `h`.
    fn decode(&self, h: &B::Buf<f32>, dim: usize, src: &[u32], dst: &[u32]) -> Result<Vec<f32>> {
        let up = |e: GpuOpsError| Error::device("uploading pairs to score", e);
        let s = self.dev.to_device(src).map_err(up)?;
        let d = self.dev.to_device(dst).map_err(up)?;
        let scores = self
            .model
            .score_pairs(&self.dev, h, dim, &s, &d, src.len())
            .map_err(dev_err("scoring pairs"))?;
        self.dev
            .to_host(&scores, src.len())
            .map_err(dev_err("downloading pair scores"))
    }

    /// The labels of `seeds`.
    pub(crate) fn labels_of(&self, seeds: &[u32]) -> Vec<u32> {
        seeds.iter().map(|&s| self.ds.labels[s as usize]).collect()
    }

    /// Evicts `evict`'s rows from the device feature cache, then caches
    /// `insert`'s (user ids): returns how many entries of `insert` are cached
    /// afterwards. The cache never exceeds its budget.
    pub(crate) fn update_cache(&mut self, insert: &[u32], evict: &[u32]) -> Result<usize> {
        let dev = Arc::clone(&self.dev);
        dev.update_cache(self.features()?, insert, evict)
            .map_err(dev_err("updating the feature cache"))
    }

    /// Layer 0's parameter tensors on the device, in the model's order.
    pub(crate) fn layer0_tensors(&self) -> Result<&[B::Buf<f32>]> {
        let range = self
            .model
            .layer_params(0)
            .map_err(dev_err("layer 0's parameters"))?;
        Ok(&self.model.params()[range])
    }
}

/// A batch's target on the device ([`DeviceEngine::upload_target`]).
pub(crate) enum DeviceTarget<B: Backend> {
    /// The seeds' labels.
    Labels(B::Buf<u32>),
    /// Labelled pairs of local seed ids.
    Pairs {
        src: B::Buf<u32>,
        dst: B::Buf<u32>,
        labels: B::Buf<f32>,
        n: usize,
    },
}

impl<B: Backend> DeviceTarget<B> {
    /// Runs `f` with the target as the model takes it.
    pub fn with<R>(&self, f: impl FnOnce(gpu_ops::Target<'_, B>) -> R) -> R {
        match self {
            DeviceTarget::Labels(l) => f(gpu_ops::Target::Labels(l)),
            DeviceTarget::Pairs {
                src,
                dst,
                labels,
                n,
            } => {
                let pairs = gpu_ops::PairBatch {
                    src,
                    dst,
                    labels,
                    n: *n,
                };
                f(gpu_ops::Target::Pairs(&pairs))
            }
        }
    }
}

impl<B: Backend> DeviceEngine<B> {
    /// `target` of a batch of `seeds` on the device (its bytes counted host →
    /// device): the seeds' labels, or the pairs.
    pub(crate) fn upload_target(
        &mut self,
        seeds: &[u32],
        target: &HostTarget,
    ) -> Result<DeviceTarget<B>> {
        match target {
            HostTarget::Labels => {
                let labels = self.labels_of(seeds);
                self.h2d += (labels.len() * 4) as u64;
                Ok(DeviceTarget::Labels(
                    self.dev.to_device(&labels).map_err(dev_err("labels"))?,
                ))
            }
            HostTarget::Pairs(p) => {
                self.h2d += (p.len() * 12) as u64;
                let up = |e: GpuOpsError| Error::device("uploading the batch's pairs", e);
                Ok(DeviceTarget::Pairs {
                    src: self.dev.to_device(&p.src).map_err(up)?,
                    dst: self.dev.to_device(&p.dst).map_err(up)?,
                    labels: self.dev.to_device(&p.labels).map_err(up)?,
                    n: p.len(),
                })
            }
        }
    }

    /// The table of the (destination, source) pairs `exclude` (global ids) a
    /// batch's blocks leave out (link prediction's exclusion; `None` when
    /// there is none), uploaded on `on`'s stream (the engine's backend or its
    /// sampling sibling: the one that sampled the blocks), its bytes counted
    /// host → device.
    pub(crate) fn excluded(
        &mut self,
        on: &B,
        exclude: &[(u32, u32)],
    ) -> Result<Option<gpu_ops::ExcludedPairs<B>>> {
        if exclude.is_empty() {
            return Ok(None);
        }
        let ex = on.excluded_pairs(exclude).map_err(dev_err(EXCLUDE))?;
        self.h2d += (ex.len() * 8) as u64;
        Ok(Some(ex))
    }

    /// `block` (sources `src`, global ids) without the edges of `ex`, on
    /// `on`'s stream. Its read of the kept edge count waits for that stream
    /// only: on the sampler's, for sampling work, not for queued training.
    pub(crate) fn exclude_block(
        on: &B,
        block: &B::Block,
        src: &B::Buf<u32>,
        ex: &gpu_ops::ExcludedPairs<B>,
    ) -> Result<B::Block> {
        let nd = on.block_shape(block).1;
        on.exclude_edges(block, src, nd, ex)
            .map_err(dev_err(EXCLUDE))
    }

    /// Every block of `batch`, sampled by `on`, without the edges of `ex`
    /// ([`DeviceEngine::exclude_block`]), before the batch is adopted.
    pub(crate) fn exclude_batch(
        on: &B,
        batch: &mut gpu_ops::DeviceBatch<B>,
        ex: &gpu_ops::ExcludedPairs<B>,
    ) -> Result<()> {
        for (block, src) in batch.blocks.iter_mut().zip(&batch.src_ids) {
            *block = Self::exclude_block(on, block, src, ex)?;
        }
        Ok(())
    }
}

/// What a failed exclusion is called.
pub(crate) const EXCLUDE: &str = "leaving the batch's edges out of its blocks (link.exclude)";

/// What the session asks of the weights' owner outside training: the model's
/// shape, its weights and Adam's state (checkpoints), inference (evaluation,
/// embeddings, predictions) and the device's counters. Object-safe, so the
/// session holds one whatever the backend.
pub(crate) trait ModelState: Send {
    /// One line naming the backend and device.
    fn describe(&self) -> String;
    /// The backend's kind.
    fn device_kind(&self) -> gpu_ops::DeviceKind;
    /// The model's configuration.
    fn model_config(&self) -> &ModelConfig;
    /// Parameter names, in the model's order.
    fn param_names(&self) -> Vec<String>;
    /// The model's parameter count, over every tensor.
    fn num_params(&self) -> usize;
    /// Optimizer steps taken (the weight version).
    fn version(&self) -> u64;
    /// The parameters on the host, in the model's order.
    fn params_to_host(&self) -> Result<Vec<Vec<f32>>>;
    /// Adam's moments `[m, v]` on the host.
    fn moments_to_host(&self) -> Result<[Vec<Vec<f32>>; 2]>;
    /// Replaces parameters, moments and step count (a checkpoint).
    fn load_state(
        &mut self,
        params: &[&[f32]],
        m: &[&[f32]],
        v: &[&[f32]],
        steps: u64,
    ) -> Result<()>;
    /// The outputs of the first `layers` layers for every vertex, by layer-wise
    /// full-graph inference (no dropout): `n × width` row-major. `layers` = the
    /// model's depth gives the logits; one less, the embeddings.
    fn full_graph_forward(&mut self, layers: usize) -> Result<Vec<f32>>;
    /// Logits (`seeds × classes`) of `seeds` on blocks sampled with the
    /// evaluation fanouts and `seed`.
    fn sampled_logits(&mut self, seeds: &[u32], seed: u64) -> Result<Vec<f32>>;
    /// A link model's scores of the pairs `(src[i], dst[i])` (local ids among
    /// `seeds`) from the seeds' embeddings on blocks sampled with the
    /// evaluation fanouts and `seed` (no dropout), decoded on the device.
    fn sampled_pair_scores(
        &mut self,
        seeds: &[u32],
        seed: u64,
        src: &[u32],
        dst: &[u32],
    ) -> Result<Vec<f32>>;
    /// A link model's scores of the pairs `(src[i], dst[i])` of rows of
    /// `rows` (`dim` wide embeddings), decoded on the device.
    fn score_pairs(
        &mut self,
        rows: &[f32],
        dim: usize,
        src: &[u32],
        dst: &[u32],
    ) -> Result<Vec<f32>>;
    /// Layer `l` (no dropout) over a host block (sharded full-graph
    /// evaluation): `num_dst × out_width`. Its input is `x`
    /// (`block.num_src() × in_width`) above layer 0; at layer 0 the features
    /// of the block's sources, each row scaled by `x`'s value when `x` is not
    /// empty (GCN's degree correction).
    fn layer_rows(&mut self, l: usize, block: &cpu_ops::Block, x: &[f32]) -> Result<Vec<f32>>;
    /// Output width of layer `l` (`None` past the last layer).
    fn layer_width(&self, l: usize) -> Option<usize>;
    /// Feature-cache statistics since the start.
    fn cache_stats(&self) -> CacheStats;
    /// Copies and synchronizations of the backend so far (training, evaluation
    /// and setup alike).
    fn transfer_stats(&self) -> gpu_ops::TransferStats;
    /// Bytes training batches moved host → device since the start.
    fn h2d_bytes(&self) -> u64;
    /// Whether input rows are sparse (`train.sparse_features`).
    fn sparse_input(&self) -> bool;
}

impl<B: Backend> ModelState for DeviceEngine<B> {
    fn describe(&self) -> String {
        let precision = match self.dev.precision() {
            gpu_ops::Precision::Fp32 => String::new(),
            p => format!(", {p} matrix products"),
        };
        let rows = match self.opts.feature_dtype {
            gpu_ops::FeatureDtype::F32 => String::new(),
            d => format!(", {d} feature rows"),
        };
        format!(
            "{} backend: {}{precision}{rows}",
            self.dev.kind(),
            self.dev.describe()
        )
    }

    fn device_kind(&self) -> gpu_ops::DeviceKind {
        self.dev.kind()
    }

    fn model_config(&self) -> &ModelConfig {
        self.model.config()
    }

    fn param_names(&self) -> Vec<String> {
        self.model.param_names().to_vec()
    }

    fn num_params(&self) -> usize {
        self.model.num_values()
    }

    fn version(&self) -> u64 {
        self.model.version()
    }

    fn params_to_host(&self) -> Result<Vec<Vec<f32>>> {
        self.model
            .params_to_host(&self.dev)
            .map_err(dev_err("parameters"))
    }

    fn moments_to_host(&self) -> Result<[Vec<Vec<f32>>; 2]> {
        self.model
            .moments_to_host(&self.dev)
            .map_err(dev_err("optimizer state"))
    }

    fn load_state(
        &mut self,
        params: &[&[f32]],
        m: &[&[f32]],
        v: &[&[f32]],
        steps: u64,
    ) -> Result<()> {
        let moments = gpu_ops::AdamMoments { m, v, steps };
        self.model
            .load(&self.dev, params, Some(moments))
            .map_err(dev_err("loading parameters"))
    }

    fn full_graph_forward(&mut self, layers: usize) -> Result<Vec<f32>> {
        let n = self.num_vertices;
        if self.full_block.is_none() {
            let g = &self.ds.graph;
            self.full_block = Some(
                self.dev
                    .block_from_host(n, g.offsets().as_slice(), g.indices().as_slice())
                    .map_err(dev_err("full-graph block"))?,
            );
        }
        let x = self.all_inputs()?;
        let Some(block) = self.full_block.as_ref() else {
            return Err(Error::invalid_argument(
                "full-graph block",
                "internal: not built",
            ));
        };
        let layers = layers.min(self.model.config().num_layers);
        if layers == 0 {
            return Err(Error::invalid_argument(
                "full-graph inference",
                "internal: no layer to apply",
            ));
        }
        let mut h = self
            .model
            .forward_layer(&self.dev, 0, block, x.layer())
            .map_err(dev_err("full-graph inference"))?;
        for l in 1..layers {
            h = self
                .model
                .forward_layer(&self.dev, l, block, &h)
                .map_err(dev_err("full-graph inference"))?;
        }
        self.recycle(x);
        let width = self.model.layer_out_dim(layers - 1).unwrap_or(0);
        self.dev
            .to_host(&h, n * width)
            .map_err(dev_err("full-graph rows"))
    }

    fn sampled_logits(&mut self, seeds: &[u32], seed: u64) -> Result<Vec<f32>> {
        let (batch, x) = self.sample_and_gather(seeds, true, seed)?;
        let fwd = self
            .model
            .forward(&self.dev, &batch.blocks, x.layer(), false, 0)
            .map_err(dev_err("forward"));
        self.recycle(x);
        let fwd = fwd?;
        self.dev
            .to_host(fwd.logits(), seeds.len() * self.num_classes)
            .map_err(dev_err("logits"))
    }

    fn sampled_pair_scores(
        &mut self,
        seeds: &[u32],
        seed: u64,
        src: &[u32],
        dst: &[u32],
    ) -> Result<Vec<f32>> {
        let (batch, x) = self.sample_and_gather(seeds, true, seed)?;
        let fwd = self
            .model
            .forward(&self.dev, &batch.blocks, x.layer(), false, 0)
            .map_err(dev_err("forward"));
        self.recycle(x);
        let fwd = fwd?;
        let dim = self.model.config().num_classes;
        self.decode(fwd.logits(), dim, src, dst)
    }

    fn score_pairs(
        &mut self,
        rows: &[f32],
        dim: usize,
        src: &[u32],
        dst: &[u32],
    ) -> Result<Vec<f32>> {
        let h = self
            .dev
            .to_device(rows)
            .map_err(dev_err("uploading embeddings"))?;
        self.decode(&h, dim, src, dst)
    }

    fn layer_rows(&mut self, l: usize, block: &cpu_ops::Block, x: &[f32]) -> Result<Vec<f32>> {
        let input = if l == 0 {
            let scale = (!x.is_empty()).then_some(x);
            self.scaled_rows(block.src_ids(), scale)?
        } else {
            let h = self
                .dev
                .to_device(x)
                .map_err(dev_err("uploading layer inputs"))?;
            input::Input::Dense(h)
        };
        let dev = &*self.dev;
        let b = dev
            .block_from_host(block.num_src(), block.indptr(), block.indices())
            .map_err(dev_err("uploading a shard block"))?;
        let out = self
            .model
            .forward_layer(dev, l, &b, input.layer())
            .map_err(dev_err("sharded full-graph inference"))?;
        let width = self
            .model
            .layer_out_dim(l)
            .ok_or_else(|| Error::invalid_argument("layer", format!("internal: no layer {l}")))?;
        dev.to_host(&out, block.num_dst() * width)
            .map_err(dev_err("downloading layer outputs"))
    }

    fn layer_width(&self, l: usize) -> Option<usize> {
        self.model.layer_out_dim(l)
    }

    fn cache_stats(&self) -> CacheStats {
        self.features
            .as_ref()
            .map(|f| self.dev.cache_stats(f))
            .unwrap_or_default()
    }

    fn transfer_stats(&self) -> gpu_ops::TransferStats {
        self.transfer_stats_all()
    }

    fn h2d_bytes(&self) -> u64 {
        self.h2d
    }

    fn sparse_input(&self) -> bool {
        self.opts.sparse
    }
}

impl<B: Backend> DeviceEngine<B> {
    /// From now on every input row (training and evaluation) comes from `rows`
    /// on the host and is uploaded, whatever the placement says about the
    /// gather; `None` goes back to the placement's gather.
    pub(crate) fn set_row_source(&mut self, rows: Option<Arc<dyn RowSource>>) {
        if rows.is_some() && self.opts.defer_features {
            // Loaded by a gather before the source came: release it.
            self.features = None;
        }
        self.rows = rows;
    }

    /// Records the engine's steps into `tracer` from now on: host steps as
    /// `sample` / `gather` slices on the calling thread's track, device work as
    /// `device sample` / `device step` slices on `acc`.
    pub(crate) fn set_tracer(&mut self, tracer: Tracer, acc: TrackId) {
        self.tracer = tracer;
        self.acc = acc;
    }

    /// The tracer and the accelerator track the engine records into.
    pub(crate) fn tracer(&self) -> (&Tracer, TrackId) {
        (&self.tracer, self.acc)
    }

    /// The dataset.
    pub(crate) fn dataset(&self) -> &Arc<Dataset> {
        &self.ds
    }
}
