//! One dataset and one model on one `gpu_ops` backend (the host backend or CUDA):
//! the device-level mechanisms every executor composes (`crate::executor`).
//!
//! A [`DeviceEngine`] holds the topology (device memory or pinned host memory),
//! the feature store with its cache of the highest-degree rows
//! (`device.cache_bytes`), the labels, the [`DeviceModel`] — parameters,
//! gradients and Adam's state: the weights of the run, held nowhere else — and
//! the reused buffers of its steps. Its methods are grouped by the client that
//! calls them:
//! - `engine/step_based.rs`: one batch under a step-based placement (sample and
//!   gather on the host or the device, upload what the host made, train), for
//!   `executor/step/mod.rs` and `executor/step/data_parallel.rs`;
//! - `engine/hot.rs`: the hot-row slabs and the batch trained with them, behind
//!   [`LayerDevice`], for the layer-based pipeline (`executor/layer/`);
//!   `engine/publish.rs`: layer 0's weights published to its CPU workers
//!   without waiting for the device;
//! - this file: setup, the gather, evaluation and the weights, behind
//!   [`ModelState`], for the session;
//! - `engine/reduce.rs`: the device-resident gradient sum of a data-parallel step.
//!
//! Every batch counts the bytes it moved host → device ([`ModelState::h2d_bytes`]).
//! Evaluation runs on the device too: layer-wise full-graph inference (the whole
//! graph as one block per layer) or sampled mini-batches.

mod hot;
mod input;
pub(crate) mod memory;
mod publish;
mod reduce;
mod step_based;

pub(crate) use hot::{
    BottomBatch, BottomCounts, HotStaging, HotUse, PreparedTops, TopBatch, TopsAhead,
};
pub(crate) use input::{density, sparse_rows_where};
pub(crate) use publish::PendingParams;
pub(crate) use reduce::{CopyReduce, ReduceOn};
pub(crate) use step_based::{BatchRef, PendingLosses, Sampled};

use std::sync::Arc;

use cpu_ops::{AdamConfig, ModelConfig};
use gpu_ops::{Backend, CacheStats, DeviceModel, GpuOpsError, TopologyPlacement};

use crate::data::dataset::Dataset;
use crate::error::{Error, Result};
use crate::trace::{Tracer, TrackId, TrackKind};

use step_based::HostSide;

/// One rank's part of a data-parallel step ([`DeviceEngine::batch_gradients`]).
pub struct BatchGradients {
    /// Loss × rows (NaN when the loss or a gradient is not finite).
    pub loss_sum: f64,
    /// Correct predictions.
    pub correct: usize,
    /// Every parameter's gradient, concatenated in parameter order (`None`
    /// when not finite).
    pub flat: Option<Vec<f32>>,
}

/// How to set a [`DeviceEngine`] up.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Training fanouts, bottom first.
    pub fanouts: Vec<u32>,
    /// Evaluation fanouts, bottom first.
    pub eval_fanouts: Vec<u32>,
    /// Feature-cache budget in bytes.
    pub cache_bytes: usize,
    /// The most device memory the engine may plan for (0: what is free); the
    /// feature cache shrinks to fit it (`engine/memory.rs`, [`memory::plan`]).
    pub memory_budget: u64,
    /// Where the topology lives (when not [`EngineOptions::auto`]).
    pub topology: TopologyPlacement,
    /// Which of the topology and the cache size the engine chooses from the
    /// free device memory (`placement/budget.rs`).
    pub auto: crate::placement::budget::Auto,
    /// Adam's hyper-parameters.
    pub adam: AdamConfig,
    /// The seed the weights are initialized from.
    pub init_seed: u64,
    /// Seeds per training batch (sizes the memory check, `engine/memory.rs`).
    pub batch_size: usize,
    /// Seeds per evaluation batch (sizes the working set an `"auto"`
    /// placement reserves, `placement/budget.rs`).
    pub eval_batch_size: usize,
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
    /// Sample device batches on a sibling stream (`device.sample_ahead`:
    /// `executor/step/mod.rs` samples the next batch while this one trains).
    pub sample_ahead: bool,
    /// The layer path's hot rows to make room for (`engine/memory.rs` step 8;
    /// [`LayerReserve::default`]: none).
    pub layer: LayerReserve,
}

#[cfg(test)]
impl EngineOptions {
    /// Unit tests' options: `fanouts` for training and evaluation, batches of
    /// `batch_size`, no feature cache, no budget, fp32 everything, evaluation
    /// batches of 1; override fields with `..EngineOptions::for_tests(..)`.
    pub(crate) fn for_tests(fanouts: Vec<u32>, batch_size: usize) -> Self {
        EngineOptions {
            eval_fanouts: fanouts.clone(),
            fanouts,
            cache_bytes: 0,
            memory_budget: 0,
            topology: TopologyPlacement::Device,
            auto: Default::default(),
            eval_batch_size: 1,
            adam: AdamConfig::default(),
            init_seed: 1,
            batch_size,
            precision: gpu_ops::Precision::Fp32,
            defer_features: false,
            feature_dtype: gpu_ops::FeatureDtype::F32,
            sparse: false,
            sample_ahead: false,
            layer: LayerReserve::default(),
        }
    }
}

/// The device memory the layer path's hot rows may take
/// ([`EngineOptions::layer`]; `engine/memory.rs` step 8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerReserve {
    /// Hot vertices the CPU may compute at most (the hot set: the monitor
    /// never moves the CPU share past it); 0: no layer path.
    pub hot_rows: u64,
    /// Batches per super-batch (`orchestration.super_batch`).
    pub super_batch: usize,
    /// Rows are kept across super-batches (the store,
    /// `orchestration.reuse_across_superbatches`).
    pub store: bool,
    /// `true`: a fixed `layer` policy, whose hot set must fit or the engine
    /// fails naming `orchestration.hot_ratio`; `false`: `policy = "auto"`'s
    /// layer candidate, shrunk to what the memory leaves
    /// ([`DeviceEngine::layer_rows_limit`]).
    pub fixed: bool,
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

/// A dataset and a model on one backend.
pub struct DeviceEngine<B: Backend> {
    dev: std::sync::Arc<B>,
    /// The sampling sibling (`device.sample_ahead`). Declared before `graph` so
    /// it drops first: the sibling reads the graph.
    sibling: step_based::Sibling<B>,
    graph: B::Graph,
    /// The device feature store (`None` until first needed with
    /// [`EngineOptions::defer_features`]).
    features: Option<B::Features>,
    /// Input rows from the host instead of the device store
    /// ([`DeviceEngine::set_row_source`]).
    rows: Option<Arc<dyn RowSource>>,
    /// Sparse feature rows (`train.sparse_features`; built on first use).
    sparse: Option<input::SparseStore<B>>,
    model: DeviceModel<B>,
    opts: EngineOptions,
    /// The dataset's labels (shared with it, not copied).
    labels: cpu_ops::HostArray<u32>,
    num_classes: usize,
    num_vertices: usize,
    /// Reused gather buffer (grown on demand; ops read prefixes).
    x: Option<B::Buf<f32>>,
    /// Reused device buffer of host-gathered rows uploaded as bfloat16.
    bits: Option<B::Buf<u16>>,
    /// The whole graph as one block, for full-graph inference (built on first use).
    full_block: Option<B::Block>,
    /// Hot-row slabs, copy stream, reused buffers and batches sampled ahead
    /// (`engine/hot.rs`).
    hot: hot::HotDevice<B>,
    /// Pinned buffers of layer 0's asynchronous publications (`engine/publish.rs`).
    publish: publish::PinnedPool<B, f32>,
    /// The dataset and sampler for steps placed on the host.
    host: HostSide,
    /// The gradient sum of the device-resident data-parallel step.
    reduce: Option<Box<dyn gpu_ops::GradReduce<B>>>,
    /// Host → device bytes of training batches so far.
    h2d: u64,
    /// Cache misses before the current batch's gather: its miss rows are added
    /// to `h2d` after the step's synchronization
    /// ([`DeviceEngine::settle_gather_misses`]).
    misses_before: Option<u64>,
    /// Batches between a step and the read of its loss (`device.loss_lag`
    /// resolved; 1: every loss read at once).
    loss_lag: usize,
    /// The deferred losses' slots (`2 · loss_lag` words; made on first use).
    loss_slots: Option<B::Buf<u64>>,
    /// Page-locked sets the deferred losses are read into
    /// ([`DeviceEngine::queue_loss_read`]).
    loss_reads: publish::PinnedPool<B, u64>,
    tracer: Tracer,
    acc: TrackId,
    /// What `device.memory_budget_bytes` changed, for the device note.
    budget_note: Option<String>,
    /// The most hot rows the layer path may compute on the CPU within the
    /// memory checked at setup ([`DeviceEngine::layer_rows_limit`]).
    layer_rows: u64,
}

fn dev_err(context: &'static str) -> impl Fn(GpuOpsError) -> Error {
    move |source| Error::device(context, source)
}

/// `buf`'s buffer, taken out, when it holds at least `n` elements; else a new
/// one a quarter larger (so slowly growing sizes do not reallocate per call),
/// not zeroed: for outputs the caller overwrites (reused gather and upload
/// buffers).
fn take_at_least<B: Backend, T: gpu_ops::Elem>(
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
    /// Loads `ds` (topology, features with a cache of the highest-degree rows,
    /// labels) and `model` onto `dev`.
    pub fn new(
        dev: B,
        ds: &Arc<Dataset>,
        model: &ModelConfig,
        mut opts: EngineOptions,
    ) -> Result<Self> {
        let layout = gpu_ops::ModelLayout::new(model).map_err(dev_err("model"))?;
        let num_params = layout.params().iter().map(|p| p.len).sum();
        let free = dev.memory_info().map_err(dev_err("device memory"))?.free as u64;
        let n = ds.num_vertices() as u64;
        // The layer path's hot rows (`engine/memory.rs` step 8).
        let shape = memory::LayerShape {
            width: layout.layer_specs().first().map_or(0, |s| s.d_out) as u64,
            super_batch: opts.layer.super_batch as u64,
            bottom_rows: memory::bottom_rows(n, opts.batch_size, &opts.fanouts),
            bf16: matches!(opts.feature_dtype, gpu_ops::FeatureDtype::Bf16),
            store: opts.layer.store,
            batch_blocks: memory::batch_block_bytes(
                n,
                ds.graph.num_edges() as u64,
                opts.batch_size,
                &opts.fanouts,
            ),
        };
        let want = opts.layer.hot_rows;
        let fixed_layer = if opts.layer.fixed {
            memory::layer_bytes(want, &shape).total()
        } else {
            0
        };
        // `"auto"` placement: topology and cache from the free memory, less the
        // working set (`placement/budget.rs`).
        let working_set = {
            let train = memory::estimate(
                ds,
                model,
                num_params,
                opts.batch_size,
                &opts.fanouts,
                0,
                false,
            );
            let eval = memory::estimate(
                ds,
                model,
                num_params,
                opts.eval_batch_size,
                &opts.eval_fanouts,
                0,
                false,
            );
            train.total().max(eval.total()) + fixed_layer
        };
        let (chosen, mut auto_note) = crate::placement::budget::choose(
            &crate::placement::budget::Request {
                auto: opts.auto,
                topology: opts.topology,
                cache_bytes: opts.cache_bytes as u64,
                topology_bytes: 8 * (n + 1) + 4 * ds.graph.num_edges() as u64,
                rows_bytes: n * ds.features.dim() as u64 * opts.feature_dtype.value_bytes() as u64,
                working_set,
                layer: (!opts.layer.fixed && want > 0).then_some((want, shape)),
            },
            free,
            opts.memory_budget,
        )?;
        opts.topology = chosen.topology;
        opts.cache_bytes = usize::try_from(chosen.cache_bytes).unwrap_or(usize::MAX);
        // Fail before loading anything when the run cannot fit.
        let need = memory::MemoryNeed {
            layer: fixed_layer,
            ..memory::estimate(
                ds,
                model,
                num_params,
                opts.batch_size,
                &opts.fanouts,
                opts.cache_bytes as u64,
                opts.topology == TopologyPlacement::Device,
            )
        };
        let cache = memory::plan(&need, free, opts.memory_budget, &dev.describe())?;
        // `"auto"`'s layer candidate: the largest hot set that fits what the
        // rest leaves (`engine/memory.rs` step 8).
        let layer_rows = if opts.layer.fixed {
            want
        } else {
            // Under a budget, what it leaves (the budget is what the job may
            // plan for); else the free memory less the allocator's headroom
            // (`placement/budget.rs`), which the hot rows must not eat.
            let budgeted = opts.memory_budget > 0 && opts.memory_budget < free;
            let limit = if budgeted {
                opts.memory_budget
            } else {
                free.saturating_sub(crate::placement::budget::DEVICE_HEADROOM_BYTES)
            };
            let rest = memory::MemoryNeed { cache, ..need }.total();
            let room = limit.saturating_sub(rest);
            let rows = memory::rows_within(room, want, &shape);
            if rows < want {
                auto_note.push_str(&format!(
                    "; the layer candidate of orchestration.policy = \"auto\" keeps {rows} of \
                     {want} hot rows: their slabs and store ({}) fit the {} of {} left after \
                     the topology, the feature cache and the working set",
                    crate::trace::fmt_bytes(memory::layer_bytes(rows, &shape).total()),
                    crate::trace::fmt_bytes(room),
                    if budgeted {
                        "device.memory_budget_bytes"
                    } else {
                        "the free device memory (less 1 GiB of headroom)"
                    },
                ));
            }
            rows
        };
        if cache < need.cache {
            opts.cache_bytes = usize::try_from(cache).unwrap_or(usize::MAX);
            auto_note.push_str(&format!(
                "; device.memory_budget_bytes = {} leaves the feature cache {} of the {} \
                 device.cache_bytes asks for",
                opts.memory_budget,
                crate::trace::fmt_bytes(cache),
                crate::trace::fmt_bytes(need.cache)
            ));
        }
        let budget_note = (!auto_note.is_empty()).then_some(auto_note);
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
        let dm =
            DeviceModel::new(&dev, model, opts.init_seed, opts.adam).map_err(dev_err("model"))?;
        let host = HostSide::new(Arc::clone(ds));
        let tracer = Tracer::disabled();
        Ok(Self {
            host,
            h2d: 0,
            misses_before: None,
            budget_note,
            loss_lag: 1,
            loss_slots: None,
            loss_reads: publish::PinnedPool::default(),
            layer_rows,
            acc: tracer.declare_track("acc", TrackKind::Accelerator),
            tracer,
            graph,
            features,
            rows: None,
            sparse: None,
            model: dm,
            labels: ds.labels.clone(),
            num_classes: ds.num_classes as usize,
            num_vertices: ds.num_vertices(),
            x: None,
            bits: None,
            full_block: None,
            hot: hot::HotDevice::default(),
            publish: publish::PinnedPool::default(),
            sibling: step_based::Sibling::default(),
            reduce: None,
            opts,
            dev: std::sync::Arc::new(dev),
        })
    }

    /// What `"auto"` placement chose (`placement/budget.rs`, with the
    /// numbers) and what `device.memory_budget_bytes` changed (the feature
    /// cache it shrank), as clauses of the device note; `None` when nothing.
    pub fn budget_note(&self) -> Option<&str> {
        self.budget_note.as_deref()
    }

    /// The most hot rows the layer path may compute on the CPU within the
    /// device memory checked at setup (`engine/memory.rs` step 8): a fixed
    /// `layer` policy's whole hot set (the check failed otherwise), or the
    /// largest share of `policy = "auto"`'s layer candidate that fits (0:
    /// none fits, the candidate is skipped).
    pub fn layer_rows_limit(&self) -> u64 {
        self.layer_rows
    }

    /// The device feature store, loaded on first use.
    fn features(&mut self) -> Result<&mut B::Features> {
        if self.features.is_none() {
            let f = load_features(&*self.dev, self.host.ds(), &self.opts)?;
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
        let need = n * self.host.ds().features.dim();
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

    fn labels_of(&self, seeds: &[u32]) -> Vec<u32> {
        seeds.iter().map(|&s| self.labels[s as usize]).collect()
    }
}

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
            let g = &self.host.ds().graph;
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

/// What the layer-based pipeline (`executor/layer/`) and its monitor ask of the
/// device: the hot-row slabs and their installs (`engine/hot.rs`), the top
/// layers sampled a super-batch ahead, the batch trained with hot rows, layer
/// 0's weights for the CPU workers, and the feature cache the monitor moves
/// rows into. Object-safe: the pipeline's threads are not generic.
pub(crate) trait LayerDevice: Send {
    /// Optimizer steps taken.
    fn version(&self) -> u64;
    /// Layer 0's output width (the width of a hot row).
    fn hot_width(&self) -> usize;
    /// A staging buffer for `rows` CPU-computed hot rows (page-locked on a GPU).
    fn new_staging(&self, rows: usize) -> Result<Box<dyn HotStaging>>;
    /// Makes hot-row slab `slab` (0 or 1) hold at least `rows` rows and orders
    /// later installs after every batch enqueued so far (`engine/hot.rs` step 2).
    fn hot_slab_reserve(&mut self, slab: usize, rows: usize) -> Result<()>;
    /// Uploads the first `n` rows of `staging` into `slab` from row `row0`,
    /// asynchronously; batches enqueued later read them (`engine/hot.rs` step 3).
    fn hot_install(
        &mut self,
        slab: usize,
        row0: usize,
        n: usize,
        staging: &mut dyn HotStaging,
    ) -> Result<()>;
    /// Copies rows `rows` of slab `slab` into the hot-row store at `vertices`
    /// (one per row), after the installs before it (`engine/hot.rs` step 5).
    fn hot_keep(&mut self, slab: usize, rows: &[u32], vertices: &[u32]) -> Result<()>;
    /// Copies the hot-row store's rows `vertices` into slab `slab` at `rows`,
    /// before every batch enqueued later (`engine/hot.rs` step 5).
    fn hot_carry(&mut self, slab: usize, rows: &[u32], vertices: &[u32]) -> Result<()>;
    /// Samples the layers above the bottom of `batches` (each drawn as a
    /// whole batch sampled with its seed would be) and starts one read of
    /// their sizes and block 0's destinations: on the sampling sibling with
    /// `device.sample_ahead`, where [`TopsAhead::wait`] (on any thread) does
    /// the read's one synchronization (`engine/hot.rs` step 1).
    fn prepare_tops(&mut self, batches: &[TopBatch<'_>]) -> Result<TopsAhead>;
    /// Keeps the batches of `tops` (from this engine's
    /// [`LayerDevice::prepare_tops`]) under their keys for
    /// [`LayerDevice::train_prepared`], handed to the compute stream.
    fn adopt_tops(&mut self, tops: PreparedTops) -> Result<()>;
    /// Samples the bottom hop of `batches` (their top layers adopted) a
    /// super-batch ahead on the sampling sibling, each skipping its planned
    /// positions, and starts one read of their sizes; the super-batch's first
    /// [`LayerDevice::train_prepared`] finishes it (a wait for the
    /// read's event, no synchronization). Nothing without `device.sample_ahead`
    /// (`engine/hot.rs` step 1b).
    fn prepare_bottoms(&mut self, batches: &[BottomBatch<'_>]) -> Result<()>;
    /// How the bottom hops of the batches trained so far were sampled
    /// (`engine/hot.rs` step 1b).
    fn bottom_counts(&self) -> BottomCounts {
        BottomCounts::default()
    }
    /// Trains the batch kept under `key` with `hot`'s slab rows replacing layer
    /// 0's outputs at its positions; then forgets it. Returns (loss × rows,
    /// correct) — or, with `deferred = Some(slot)`, nothing: the step reads
    /// nothing, its loss goes to loss slot `slot` (below
    /// [`LayerDevice::loss_lag`]) for [`LayerDevice::queue_loss_read`], and a
    /// non-finite loss makes the device skip this step and every later one
    /// until [`LayerDevice::rewind_skipped`] (the version moves on at once).
    fn train_prepared(
        &mut self,
        key: u64,
        batch: (&[u32], u64),
        hot: &HotUse<'_>,
        deferred: Option<usize>,
    ) -> Result<Option<(f64, usize)>>;
    /// Batches between a step and the read of its loss (`device.loss_lag`
    /// resolved, at least 1).
    fn loss_lag(&self) -> usize;
    /// Loss slots `0..n` on their way to the host, queued after every step so
    /// far without waiting for them.
    fn queue_loss_read(&mut self, n: usize) -> Result<Box<dyn PendingLosses>>;
    /// After a non-finite deferred loss: the version moves back by the
    /// `skipped` steps the device did not apply, and the guard is cleared.
    fn rewind_skipped(&mut self, skipped: usize) -> Result<()>;
    /// Forgets every kept batch.
    fn discard_prepared(&mut self);
    /// Layer 0's parameter tensors, copied to the host: one blocking download
    /// per tensor, which waits for every batch queued (the epoch's start).
    fn layer0_params(&self) -> Result<Vec<Vec<f32>>>;
    /// Layer 0's parameter tensors at the current version on their way to the
    /// host, without waiting for the device: the copies are queued on the
    /// compute stream after the steps so far and before the next, and the
    /// returned handle, resolved on any thread, waits for them
    /// (`engine/publish.rs`). One download per tensor, no synchronization.
    fn publish_layer0(&self) -> Result<Box<dyn PendingParams>>;
    /// Evicts `evict`'s rows from the device feature cache, then caches
    /// `insert`'s (user ids): returns how many entries of `insert` are cached
    /// afterwards. The cache never exceeds its budget.
    fn update_cache(&mut self, insert: &[u32], evict: &[u32]) -> Result<usize>;
    /// Feature-cache statistics.
    fn cache_stats(&self) -> CacheStats;
    /// Bytes of one feature row as the device stores it (`device.feature_dtype`).
    fn row_bytes(&self) -> u64;
    /// How the device stores feature rows (`device.feature_dtype`); the CPU's hot
    /// rows read the same values (a bfloat16 host copy for `Bf16`).
    fn feature_dtype(&self) -> gpu_ops::FeatureDtype {
        gpu_ops::FeatureDtype::F32
    }
    /// Bytes training batches moved host → device since the start.
    fn h2d_bytes(&self) -> u64;
    /// Copies and synchronizations so far.
    fn transfer_stats(&self) -> gpu_ops::TransferStats;
}

impl<B: Backend> LayerDevice for DeviceEngine<B> {
    fn version(&self) -> u64 {
        self.model.version()
    }

    fn hot_width(&self) -> usize {
        self.hot_width_op()
    }

    fn new_staging(&self, rows: usize) -> Result<Box<dyn HotStaging>> {
        self.new_staging_op(rows)
    }

    fn hot_slab_reserve(&mut self, slab: usize, rows: usize) -> Result<()> {
        self.hot_slab_reserve_op(slab, rows)
    }

    fn hot_install(
        &mut self,
        slab: usize,
        row0: usize,
        n: usize,
        staging: &mut dyn HotStaging,
    ) -> Result<()> {
        self.hot_install_op(slab, row0, n, staging)
    }

    fn hot_keep(&mut self, slab: usize, rows: &[u32], vertices: &[u32]) -> Result<()> {
        self.hot_store_copy_op(slab, rows, vertices, true)
    }

    fn hot_carry(&mut self, slab: usize, rows: &[u32], vertices: &[u32]) -> Result<()> {
        self.hot_store_copy_op(slab, rows, vertices, false)
    }

    fn prepare_tops(&mut self, batches: &[TopBatch<'_>]) -> Result<TopsAhead> {
        self.prepare_tops_op(batches)
    }

    fn adopt_tops(&mut self, tops: PreparedTops) -> Result<()> {
        self.adopt_tops_op(tops)
    }

    fn prepare_bottoms(&mut self, batches: &[BottomBatch<'_>]) -> Result<()> {
        self.prepare_bottoms_op(batches)
    }

    fn bottom_counts(&self) -> BottomCounts {
        self.bottom_counts_op()
    }

    fn train_prepared(
        &mut self,
        key: u64,
        batch: (&[u32], u64),
        hot: &HotUse<'_>,
        deferred: Option<usize>,
    ) -> Result<Option<(f64, usize)>> {
        self.train_prepared_op(key, batch, hot, deferred)
    }

    fn loss_lag(&self) -> usize {
        self.loss_lag
    }

    fn queue_loss_read(&mut self, n: usize) -> Result<Box<dyn PendingLosses>> {
        DeviceEngine::queue_loss_read(self, n)
    }

    fn rewind_skipped(&mut self, skipped: usize) -> Result<()> {
        DeviceEngine::rewind_skipped(self, skipped)
    }

    fn discard_prepared(&mut self) {
        self.discard_prepared_op();
    }

    fn layer0_params(&self) -> Result<Vec<Vec<f32>>> {
        self.layer0_tensors()?
            .iter()
            .map(|p| self.dev.to_host(p, self.dev.len(p)))
            .collect::<std::result::Result<_, _>>()
            .map_err(dev_err("publishing layer 0's parameters"))
    }

    fn publish_layer0(&self) -> Result<Box<dyn PendingParams>> {
        self.publish_layer0_op()
    }

    fn update_cache(&mut self, insert: &[u32], evict: &[u32]) -> Result<usize> {
        let dev = Arc::clone(&self.dev);
        dev.update_cache(self.features()?, insert, evict)
            .map_err(dev_err("updating the feature cache"))
    }

    fn cache_stats(&self) -> CacheStats {
        ModelState::cache_stats(self)
    }

    fn row_bytes(&self) -> u64 {
        (self.host.ds().features.dim() * self.opts.feature_dtype.value_bytes()) as u64
    }

    fn feature_dtype(&self) -> gpu_ops::FeatureDtype {
        self.opts.feature_dtype
    }

    fn h2d_bytes(&self) -> u64 {
        self.h2d
    }

    fn transfer_stats(&self) -> gpu_ops::TransferStats {
        self.transfer_stats_all()
    }
}

/// The data-parallel step's halves (`executor/step/data_parallel.rs`).
impl<B: Backend> DeviceEngine<B> {
    /// Sums the gradients of the device-resident data-parallel step over `on`
    /// from now on (collective for NCCL: every rank calls it). Returns one line
    /// naming the transport.
    pub(crate) fn set_grad_reduce(&mut self, on: ReduceOn) -> Result<String> {
        let r: Box<dyn gpu_ops::GradReduce<B>> = match on {
            ReduceOn::Nccl { rank, ranks, id } => self
                .dev
                .nccl_reduce(rank, ranks, &id)
                .map_err(dev_err("joining the NCCL communicator"))?,
            ReduceOn::HostCopy(comm) => Box::new(CopyReduce::new(comm)),
        };
        let line = r.describe();
        self.reduce = Some(r);
        Ok(line)
    }

    /// The downloaded gradients of a step run without its update: (loss × rows,
    /// correct, gradients flattened in parameter order), the gradients `None`
    /// and the loss NaN when either is not finite.
    pub(crate) fn batch_gradients(
        &mut self,
        stats: gpu_ops::LossStats,
        rows: usize,
    ) -> Result<BatchGradients> {
        let mut loss_sum = stats.loss * rows as f64;
        let flat = if loss_sum.is_finite() {
            let flat: Vec<f32> = self
                .model
                .grads_to_host(&self.dev)
                .map_err(dev_err("downloading the gradients"))?
                .into_iter()
                .flatten()
                .collect();
            if flat.iter().all(|g| g.is_finite()) {
                Some(flat)
            } else {
                loss_sum = f64::NAN;
                None
            }
        } else {
            None
        };
        Ok(BatchGradients {
            loss_sum,
            correct: stats.correct,
            flat,
        })
    }

    /// Replaces the gradients with `flat` (the ranks' sum, in
    /// [`DeviceEngine::batch_gradients`]' layout) and takes one optimizer step.
    pub(crate) fn apply_gradients(&mut self, flat: &[f32]) -> Result<()> {
        self.model
            .set_grads(&self.dev, flat)
            .map_err(dev_err("uploading the summed gradients"))?;
        self.model
            .step(&self.dev)
            .map_err(dev_err("optimizer step"))
    }

    /// The device-resident second half: every gradient × `weight` (this rank's
    /// share of the batch; 0 for a rank without rows), summed over the ranks on
    /// the device, then one optimizer step. Returns `false`, with no step, when
    /// the sum holds a NaN or infinity (the same answer on every rank). Errors
    /// without [`DeviceEngine::set_grad_reduce`].
    pub(crate) fn reduce_and_step(&mut self, weight: f32) -> Result<bool> {
        let Some(reduce) = self.reduce.as_deref() else {
            return Err(Error::invalid_argument(
                "dist.reduce",
                "internal: no device gradient reduction was set up",
            ));
        };
        let dev = &*self.dev;
        self.model
            .scale_grads(dev, weight)
            .map_err(dev_err("weighting the gradients"))?;
        self.model
            .reduce_grads(dev, reduce)
            .map_err(dev_err("summing the gradients over the ranks"))?;
        let bad = self
            .model
            .nonfinite_grads(dev)
            .map_err(dev_err("checking the summed gradients"))?;
        if bad > 0 {
            return Ok(false);
        }
        self.model.step(dev).map_err(dev_err("optimizer step"))?;
        Ok(true)
    }

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
        self.host.ds()
    }
}
