//! GCN, GraphSAGE-mean and GAT written once, generic over the [`Backend`] op
//! families, so the same layers train on the host backend and on CUDA, and
//! export to ONNX from the same files.
//!
//! # How a layer is defined (design note)
//! Each model kind is one file beside this one — `sage.rs`, `gcn.rs`, `gat.rs` —
//! holding one type that implements
//! - [`LayerDef`] (backend-free): the layer's [`LayerSpec`], its parameter tensors
//!   ([`ParamSpec`]: name, shape, [`cpu_ops::Init`]; checkpoints and golden tests
//!   depend on names and order), which tensor is the bias, the hidden activation,
//!   and [`LayerDef::emit`], its export graph over a [`GraphEmitter`] (which
//!   `runtime` implements with ONNX);
//! - [`Layer<B>`] for every backend: `forward` (returning its typed
//!   [`Layer::State`]) and `backward` (its tensors' gradients, and `∂X` when
//!   asked), from the backend's ops. Inputs are [`LayerInput::Dense`] or, for layer 0,
//!   [`LayerInput::Sparse`]; [`XMat`] runs the projections `X·W` and `Xᵀ·G` on either.
//!
//! **To add a model kind:** write `newkind.rs` here with its type and the two
//! impls (`mod newkind;` below), and add one line to `registry` in `registry.rs`
//! (`ModelKind::NewKind => Box::new(NewKind::new(cfg, at)),`). Nothing in
//! `gpu_ops` or the ONNX export matches on the kind: [`DeviceModel`],
//! [`ModelLayout`] (names, shapes, initialization, export) and [`Layer0`] go
//! through the traits. Outside, the kind needs its `cpu_ops::ModelKind` variant
//! and its name in the configuration (`runtime`'s `model.kind` parser and
//! `onnx::kind_name`).
//!
//! # The model around the layers
//! [`DeviceModel`] keeps, on the device, the parameters (in layer order, named
//! `layer{l}.{name}`), their gradients and Adam's moments, the weight version,
//! and the epilogue between layers: below the top, the layer's bias, its
//! activation and the next layer's dropout in one fused op
//! ([`DenseOps::bias_act_dropout`](crate::DenseOps::bias_act_dropout)). It is made
//! by [`DeviceModel::new`] (DGL's initialization from a seed, each tensor from
//! its own stream: [`ModelLayout::init_params`]) or [`DeviceModel::from_params`]
//! (e.g. a checkpoint's tensors). One training step is
//! 1. [`DeviceModel::forward`] over the batch's blocks (bottom first) from the
//!    gathered input rows, with dropout of the hidden representation entering
//!    layer `l ≥ 1` seeded `derive_seed(seed, l)`, keeping what the backward needs;
//! 2. [`DenseOps::softmax_cross_entropy`](crate::DenseOps::softmax_cross_entropy) on
//!    the logits, giving `∂L/∂logits`;
//! 3. [`DeviceModel::backward`]: every parameter's gradient;
//! 4. [`DeviceModel::step`]: one Adam update of every tensor (PyTorch's `Adam`, L2
//!    weight decay), after which [`DeviceModel::version`] is one larger.
//!
//! [`DeviceModel::train_step`] does all four. Steps 2–4 depend on the model's
//! [`Head`] and the step's [`Target`]: node labels ([`Head::Classify`],
//! [`Target::Labels`], the softmax loss above) or labelled pairs of seeds
//! ([`Head::Link`], [`Target::Pairs`]: the top layer's outputs are
//! embeddings, a [`Decoder`] scores the pairs, and
//! [`LinkOps::bce_with_logits`](crate::LinkOps::bce_with_logits) is the loss,
//! whose gradient flows back through the decoder into the embedding rows and
//! then through the encoder's backward; `head.rs` has the formulas). A link
//! model scores pairs of embeddings from [`DeviceModel::forward`] or
//! [`DeviceModel::forward_layer`] with [`DeviceModel::score_pairs`].
//! [`DeviceModel::forward_layer`] applies
//! one layer without dropout, for layer-wise full-graph inference; [`Layer0`]
//! and [`layer0_rows`] apply layer 0 with given weights (a published snapshot)
//! to rows gathered on the host: the CPU's hot rows, for any kind.
//!
//! # The deferred loss (no synchronization in a step)
//! [`DeviceModel::train_step`] reads the loss before the backward (one
//! synchronization per batch, so that a non-finite loss skips the update).
//! [`DeviceModel::train_step_deferred`] queues the whole step without reading
//! anything:
//! 1. the loss sum and correct count go to slot `slot` of the caller's buffer
//!    ([`DenseOps::softmax_cross_entropy_deferred`](crate::DenseOps::softmax_cross_entropy_deferred),
//!    or [`LinkOps::bce_with_logits_deferred`](crate::LinkOps::bce_with_logits_deferred)
//!    for pairs); a non-finite sum sets the model's **guard** word on the device;
//! 2. the backward always runs;
//! 3. the update is one [`DenseOps::adam_step_all`](crate::DenseOps::adam_step_all)
//!    that does nothing while the guard is set. The guard is sticky: every step
//!    queued after a non-finite loss is skipped too, so the weights stay those
//!    before the bad batch however late the host reads the loss;
//! 4. the version counts the step at once. The caller reads the slots later (one
//!    download for many batches); at a non-finite loss it calls
//!    [`DeviceModel::rewind_skipped`] with the number of steps queued from that
//!    batch on (all skipped): the version moves back to the last applied step
//!    and the guard is cleared, so training can go on from there.
//!
//! # Sparse input
//! Layer 0 may read sparse rows ([`LayerInput::Sparse`], [`crate::SparseOps`]), e.g.
//! bag-of-words features: it then always projects first (`A (X·W)`), computing
//! `X·W` with [`crate::SparseOps::spmm`] and the weight gradients `Xᵀ·G` with
//! [`crate::SparseOps::spmm_tn`]; `∂X` is never formed. Every method taking the
//! model input accepts `&B::Buf<f32>` (dense) or a [`LayerInput`].
//!
//! # Historical embeddings of hot vertices
//! [`DeviceModel::forward_hot`], [`DeviceModel::backward`] and
//! [`DeviceModel::train_step_hot`] take [`HotRows`]: rows of layer 0's output
//! (after its activation) computed elsewhere — the CPU, with older weights — for
//! some of block 0's destinations (= block 1's sources), by position.
//! 1. Layer 0 runs over the whole block as usual.
//! 2. After its activation, the rows at `positions` are overwritten with the given
//!    embeddings ([`crate::FeatureStore::index_put_rows`]), before layer 1's dropout;
//!    layers above read them like any other row.
//! 3. In the backward, with [`HotGrad::Constant`] (the paper's default) the
//!    gradient rows at those positions are zeroed before layer 0's backward:
//!    historical embeddings are constants, so hot destinations contribute nothing
//!    to layer 0's gradients. With [`HotGrad::Aggregate`] the rows keep their
//!    gradient, masked by the *historical* rows' activation, and layer 0's backward
//!    runs through the accelerator's own aggregate of those destinations' sampled
//!    neighbors: hot destinations also train layer 0 (the optional mode in which
//!    the CPU would send its aggregate; here the accelerator has its own, since it
//!    computes layer 0 over the whole block).

mod emit;
mod gat;
mod gcn;
mod head;
mod layer;
mod layer0;
mod registry;
mod sage;
#[cfg(test)]
mod tests;

use cpu_ops::{derive_seed, AdamConfig, LayerSpec, ModelConfig};

use crate::backend::{
    ActBackward, AdamStep, AdamTensors, Backend, LossSlot, LossStats, XentInputs,
};
use crate::error::{GpuOpsError, Result};
use head::{target_mismatch, Decoded, DecoderCall, Pairs};
use layer::{internal, DynLayer, State};
use layer0::layer_alone;
use registry::{arch, check_lens, init_params, Arch};

pub use emit::{EmitBlock, GraphEmitter, Reduce, Reduction, Unary};
pub use head::{Decoder, Head, PairBatch, Target};
pub use layer::{Layer, LayerCall, LayerDef, LayerGrad, LayerInput, ModelParam, ParamSpec, XMat};
pub use layer0::{layer0_rows, Layer0};
pub use registry::ModelLayout;

/// What one layer's forward keeps for its backward.
struct LayerFwd<B: Backend> {
    /// The layer input after dropout, and the mask (layers above 0, when training).
    dropped: Option<(B::Buf<f32>, B::Mask)>,
    /// The layer's own state ([`Layer::State`]).
    state: State,
    /// Hidden layers: the output after the activation.
    act: Option<B::Buf<f32>>,
}

/// How layer 0's backward treats the rows replaced by historical embeddings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum HotGrad {
    /// Constants: no gradient flows into layer 0 through them (the paper).
    #[default]
    Constant,
    /// Their gradient flows into layer 0 through the accelerator's aggregate of
    /// their sampled neighbors, masked by the historical activation.
    Aggregate,
}

/// Historical embeddings for some of layer 0's outputs (module doc, "Historical
/// embeddings of hot vertices").
pub struct HotRows<'a, B: Backend> {
    /// Distinct positions in block 0's destinations, `n` of them.
    pub positions: &'a B::Buf<u32>,
    /// `n × layer_out_dim(0)` rows: layer 0's output after its activation.
    pub rows: &'a B::Buf<f32>,
    /// Number of hot rows.
    pub n: usize,
    /// How the backward treats them.
    pub grad: HotGrad,
}

/// A deferred step's extras ([`DeviceModel::train_step_hot_deferred`]):
/// historical rows for some of layer 0's outputs, and the slot its loss goes to.
pub struct DeferredStep<'a, B: Backend> {
    /// The historical rows, if any.
    pub hot: Option<&'a HotRows<'a, B>>,
    /// Where the batch's loss sum and correct count go.
    pub dest: LossSlot<'a, B>,
}

/// The result of [`DeviceModel::forward`]: the logits and what the backward needs.
pub struct DeviceForward<B: Backend> {
    layers: Vec<LayerFwd<B>>,
    /// `(num_src, num_dst)` of each block.
    shapes: Vec<(usize, usize)>,
    logits: B::Buf<f32>,
    /// Positions of layer 0's outputs replaced by historical embeddings (a copy),
    /// and how many.
    hot: Option<(B::Buf<u32>, usize, HotGrad)>,
}

impl<B: Backend> DeviceForward<B> {
    /// The logits, `rows() × num_classes`, on the device.
    pub fn logits(&self) -> &B::Buf<f32> {
        &self.logits
    }

    /// Rows of the logits (destinations of the last block).
    pub fn rows(&self) -> usize {
        self.shapes.last().map_or(0, |s| s.1)
    }
}

/// Adam's state for [`DeviceModel::load`]: moments per tensor and the step count.
#[derive(Clone, Copy, Debug)]
pub struct AdamMoments<'a> {
    /// First moments, one slice per parameter tensor.
    pub m: &'a [&'a [f32]],
    /// Second moments, one slice per parameter tensor.
    pub v: &'a [&'a [f32]],
    /// Optimizer steps taken.
    pub steps: u64,
}

/// A GNN model whose parameters, gradients and optimizer state live on a device.
pub struct DeviceModel<B: Backend> {
    arch: Arch<dyn DynLayer<B>>,
    params: Vec<B::Buf<f32>>,
    grads: Vec<B::Buf<f32>>,
    m: Vec<B::Buf<f32>>,
    v: Vec<B::Buf<f32>>,
    lens: Vec<usize>,
    names: Vec<String>,
    adam: AdamConfig,
    steps: u64,
    /// Zero rows written over layer 0's output gradient at constant hot rows
    /// (zeroed once, grown when a batch has more hot rows).
    hot_zeros: Option<B::Buf<f32>>,
    /// The deferred loss's guard word (module doc; made on first use, zeroed).
    guard: Option<B::Buf<u32>>,
}

impl<B: Backend> DeviceModel<B> {
    /// A model of `cfg` (validated; errors name the field) initialized
    /// deterministically from `seed` ([`ModelLayout::init_params`]: DGL's
    /// initializers, tensor `i` from stream `i`) — with zero gradients and moments and
    /// `adam`'s hyper-parameters (only L2 weight decay is supported on devices).
    /// Its head is [`Head::Classify`].
    pub fn new(dev: &B, cfg: &ModelConfig, seed: u64, adam: AdamConfig) -> Result<Self> {
        Self::with_head(dev, cfg, Head::Classify, seed, adam)
    }

    /// [`DeviceModel::new`] with `head`: for [`Head::Link`] the top layer's
    /// `cfg.num_classes` outputs are the embedding width, and a
    /// [`Decoder::Mlp`]'s tensors follow the encoder's (streams after the
    /// encoder's: the encoder starts as it does under [`Head::Classify`]).
    pub fn with_head(
        dev: &B,
        cfg: &ModelConfig,
        head: Head,
        seed: u64,
        adam: AdamConfig,
    ) -> Result<Self> {
        let arch = arch::<B>(cfg, head)?;
        let values = init_params(&arch.params, seed);
        let refs: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
        Self::with_params(dev, arch, &refs, adam)
    }

    /// A model of `cfg` holding `params` (in [`ModelLayout::params`] order, e.g.
    /// a checkpoint's tensors; lengths checked), zero gradients and moments.
    pub fn from_params(
        dev: &B,
        cfg: &ModelConfig,
        params: &[&[f32]],
        adam: AdamConfig,
    ) -> Result<Self> {
        Self::from_params_with_head(dev, cfg, Head::Classify, params, adam)
    }

    /// [`DeviceModel::from_params`] with `head` (the head's tensors last, as
    /// [`ModelLayout::with_head`] lists them).
    pub fn from_params_with_head(
        dev: &B,
        cfg: &ModelConfig,
        head: Head,
        params: &[&[f32]],
        adam: AdamConfig,
    ) -> Result<Self> {
        Self::with_params(dev, arch::<B>(cfg, head)?, params, adam)
    }

    fn with_params(
        dev: &B,
        arch: Arch<dyn DynLayer<B>>,
        host: &[&[f32]],
        adam: AdamConfig,
    ) -> Result<Self> {
        if adam.decay != cpu_ops::WeightDecay::L2 {
            return Err(GpuOpsError::InvalidArgument {
                name: "adam.decay",
                reason: "device models implement Adam with L2 weight decay only".into(),
            });
        }
        check_lens(&arch.params, "parameter tensors", host)?;
        let lens: Vec<usize> = host.iter().map(|p| p.len()).collect();
        let mut params = Vec::with_capacity(host.len());
        let (mut grads, mut m, mut v) = (Vec::new(), Vec::new(), Vec::new());
        for p in host {
            params.push(dev.to_device(p)?);
            grads.push(dev.alloc(p.len())?);
            m.push(dev.alloc(p.len())?);
            v.push(dev.alloc(p.len())?);
        }
        let names = arch.params.iter().map(|p| p.name.clone()).collect();
        Ok(Self {
            arch,
            params,
            grads,
            m,
            v,
            lens,
            names,
            adam,
            steps: 0,
            hot_zeros: None,
            guard: None,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.arch.cfg
    }

    /// The model's head.
    pub fn head(&self) -> Head {
        self.arch.head
    }

    /// Every layer's shape, bottom first.
    pub fn layer_specs(&self) -> &[LayerSpec] {
        &self.arch.specs
    }

    /// Optimizer steps taken (the weight version).
    pub fn version(&self) -> u64 {
        self.steps
    }

    /// Parameter names, in order ([`ModelLayout::param_names`]).
    pub fn param_names(&self) -> &[String] {
        &self.names
    }

    /// The parameters, copied to the host, in order.
    pub fn params_to_host(&self, dev: &B) -> Result<Vec<Vec<f32>>> {
        self.params
            .iter()
            .zip(&self.lens)
            .map(|(p, &n)| dev.to_host(p, n))
            .collect()
    }

    /// Adam's moments `[m, v]`, copied to the host, in parameter order.
    pub fn moments_to_host(&self, dev: &B) -> Result<[Vec<Vec<f32>>; 2]> {
        let get = |bufs: &[B::Buf<f32>]| -> Result<Vec<Vec<f32>>> {
            bufs.iter()
                .zip(&self.lens)
                .map(|(p, &n)| dev.to_host(p, n))
                .collect()
        };
        Ok([get(&self.m)?, get(&self.v)?])
    }

    /// The gradients of the last [`DeviceModel::backward`], copied to the host.
    pub fn grads_to_host(&self, dev: &B) -> Result<Vec<Vec<f32>>> {
        self.grads
            .iter()
            .zip(&self.lens)
            .map(|(p, &n)| dev.to_host(p, n))
            .collect()
    }

    /// The device buffers of the parameters (e.g. to publish layer 0's weights).
    pub fn params(&self) -> &[B::Buf<f32>] {
        &self.params
    }

    /// Indices of layer `l`'s tensors in [`DeviceModel::params`].
    pub fn layer_params(&self, l: usize) -> Result<std::ops::Range<usize>> {
        self.arch.layer_params(l)
    }

    /// Replaces all parameters (and optionally Adam's moments and step count), e.g.
    /// from a checkpoint. Lengths must match.
    pub fn load(
        &mut self,
        dev: &B,
        params: &[&[f32]],
        moments: Option<AdamMoments<'_>>,
    ) -> Result<()> {
        check_lens(&self.arch.params, "parameter tensors", params)?;
        if let Some(a) = &moments {
            check_lens(&self.arch.params, "first moments", a.m)?;
            check_lens(&self.arch.params, "second moments", a.v)?;
        }
        for (dst, src) in self.params.iter_mut().zip(params) {
            dev.upload(dev.stream(), src, dst)?;
        }
        if let Some(a) = moments {
            for (dst, src) in self.m.iter_mut().zip(a.m) {
                dev.upload(dev.stream(), src, dst)?;
            }
            for (dst, src) in self.v.iter_mut().zip(a.v) {
                dev.upload(dev.stream(), src, dst)?;
            }
            self.steps = a.steps;
        }
        Ok(())
    }

    fn check_blocks(&self, dev: &B, blocks: &[B::Block]) -> Result<Vec<(usize, usize)>> {
        let n = self.arch.specs.len();
        if blocks.len() != n {
            return Err(GpuOpsError::SizeMismatch {
                what: "blocks (one per model layer)",
                expected: n,
                found: blocks.len(),
            });
        }
        let shapes: Vec<(usize, usize)> = blocks
            .iter()
            .map(|b| {
                let (s, d, _) = dev.block_shape(b);
                (s, d)
            })
            .collect();
        for pair in shapes.windows(2) {
            if pair[0].1 != pair[1].0 {
                return Err(GpuOpsError::SizeMismatch {
                    what: "sources of a block (must equal the destinations of the block below)",
                    expected: pair[0].1,
                    found: pair[1].0,
                });
            }
        }
        Ok(shapes)
    }

    /// Forward pass over `blocks` (bottom first) from `x`
    /// (`num_src(blocks[0]) × in_dim`, dense or sparse). Dropout runs only when
    /// `train`.
    pub fn forward<'x>(
        &self,
        dev: &B,
        blocks: &[B::Block],
        x: impl Into<LayerInput<'x, B>>,
        train: bool,
        seed: u64,
    ) -> Result<DeviceForward<B>> {
        self.forward_hot(dev, blocks, x, train, seed, None)
    }

    /// [`DeviceModel::forward`] with layer 0's outputs at `hot.positions` replaced
    /// by `hot.rows` (module doc). Needs at least two layers when `hot` is given.
    pub fn forward_hot<'x>(
        &self,
        dev: &B,
        blocks: &[B::Block],
        x: impl Into<LayerInput<'x, B>>,
        train: bool,
        seed: u64,
        hot: Option<&HotRows<'_, B>>,
    ) -> Result<DeviceForward<B>> {
        let x = x.into();
        let shapes = self.check_blocks(dev, blocks)?;
        let hot = match hot {
            Some(h) if h.n > 0 => Some(self.check_hot(dev, &shapes, h)?),
            _ => None,
        };
        x.check(
            dev,
            "model input (num_src of the first block × in_dim)",
            shapes[0].0,
            self.arch.cfg.in_dim,
        )?;
        let p = if train { self.arch.cfg.dropout } else { 0.0 };
        let mut layers: Vec<LayerFwd<B>> = Vec::with_capacity(self.arch.specs.len());
        let mut logits = None;
        // Layer l's dropped input, made by layer l − 1's fused bias/activation/dropout.
        let mut next_dropped: Option<(B::Buf<f32>, B::Mask)> = None;
        for (l, (layer, block)) in self.arch.layers.iter().zip(blocks).enumerate() {
            let spec = self.arch.specs[l];
            let (ns, nd) = shapes[l];
            let dropped = match (next_dropped.take(), layers.last()) {
                (Some(d), _) => Some(d),
                // Below: layer 0 with hot rows, put in after its activation.
                (None, Some(below)) if p > 0.0 => {
                    let prev = below.act.as_ref().ok_or_else(|| internal("missing act"))?;
                    let n = ns * spec.d_in;
                    let mut h = dev.alloc_uninit(n)?;
                    dev.copy(prev, &mut h, n)?;
                    let mask = dev.dropout(&mut h, n, p, derive_seed(seed, l as u64))?;
                    Some((h, mask))
                }
                (None, _) => None,
            };
            let input = match (&dropped, layers.last()) {
                (Some((h, _)), _) => LayerInput::Dense(h),
                (None, None) => x,
                (None, Some(below)) => {
                    LayerInput::Dense(below.act.as_ref().ok_or_else(|| internal("missing act"))?)
                }
            };
            let range = self.arch.layer_params(l)?;
            let call = layer::LayerCall {
                params: &self.params[range.clone()],
                block,
                x: input,
                num_src: ns,
                num_dst: nd,
            };
            // Below the top the bias is added by the fused op below.
            let (out, state) = layer.forward_dyn(dev, &call, spec.last)?;
            let mut fwd = LayerFwd {
                dropped,
                state,
                act: None,
            };
            if spec.last {
                logits = Some(out);
            } else {
                let mut out = out;
                let hot_here = l == 0 && hot.is_some();
                let bias = &self.params[range.start + layer.bias()];
                let act = layer.activation();
                if p > 0.0 && !hot_here {
                    // Bias, activation and the next layer's dropout in one pass.
                    let n = nd * spec.d_out;
                    let mut h = dev.alloc_uninit(n)?;
                    let key = derive_seed(seed, l as u64 + 1);
                    let mask = dev
                        .bias_act_dropout(
                            &mut out,
                            nd,
                            spec.d_out,
                            bias,
                            act,
                            Some((p, key, &mut h)),
                        )?
                        .ok_or_else(|| internal("no dropout mask"))?;
                    next_dropped = Some((h, mask));
                } else {
                    dev.bias_act_dropout(&mut out, nd, spec.d_out, bias, act, None)?;
                }
                if let (0, Some(h)) = (l, &hot) {
                    dev.index_put_rows(h.rows, spec.d_out, h.positions, h.n, &mut out)?;
                }
                fwd.act = Some(out);
            }
            layers.push(fwd);
        }
        let hot = match hot {
            Some(h) => {
                let mut pos = dev.alloc_uninit(h.n)?;
                dev.copy(h.positions, &mut pos, h.n)?;
                Some((pos, h.n, h.grad))
            }
            None => None,
        };
        Ok(DeviceForward {
            layers,
            shapes,
            logits: logits.ok_or_else(|| internal("no layers"))?,
            hot,
        })
    }

    /// Checks hot rows against the blocks' shapes (positions are checked by
    /// [`FeatureStore::index_put_rows`](crate::FeatureStore::index_put_rows)).
    fn check_hot<'h>(
        &self,
        dev: &B,
        shapes: &[(usize, usize)],
        hot: &'h HotRows<'h, B>,
    ) -> Result<&'h HotRows<'h, B>> {
        let Some(spec) = self.arch.specs.first().filter(|s| !s.last) else {
            return Err(GpuOpsError::InvalidArgument {
                name: "hot rows",
                reason: "historical embeddings replace layer 0's output, which needs a layer above it (model.layers ≥ 2)".into(),
            });
        };
        if hot.n > shapes[0].1 {
            return Err(GpuOpsError::SizeMismatch {
                what: "hot rows (at most num_dst of block 0)",
                expected: shapes[0].1,
                found: hot.n,
            });
        }
        if dev.len(hot.rows) < hot.n * spec.d_out {
            return Err(GpuOpsError::SizeMismatch {
                what: "hot rows (n × layer 0's output width)",
                expected: hot.n * spec.d_out,
                found: dev.len(hot.rows),
            });
        }
        if dev.len(hot.positions) < hot.n {
            return Err(GpuOpsError::SizeMismatch {
                what: "hot positions",
                expected: hot.n,
                found: dev.len(hot.positions),
            });
        }
        Ok(hot)
    }

    /// Layer `l` alone, without dropout, activation included below the top:
    /// `x` is `num_src(block) × d_in` (dense, or sparse rows), the result
    /// `num_dst(block) × d_out`.
    pub fn forward_layer<'x>(
        &self,
        dev: &B,
        l: usize,
        block: &B::Block,
        x: impl Into<LayerInput<'x, B>>,
    ) -> Result<B::Buf<f32>> {
        let layer = self
            .arch
            .layers
            .get(l)
            .ok_or(GpuOpsError::InvalidArgument {
                name: "layer",
                reason: format!("the model has {} layers", self.arch.layers.len()),
            })?;
        let range = self.arch.layer_params(l)?;
        layer_alone(dev, &**layer, &self.params[range], block, x.into())
    }

    /// Output width of layer `l`.
    pub fn layer_out_dim(&self, l: usize) -> Option<usize> {
        self.arch.specs.get(l).map(|s| s.d_out)
    }

    /// Backward pass: fills every layer's tensors' gradients (read them with
    /// [`DeviceModel::grads_to_host`] or apply them with [`DeviceModel::step`]),
    /// given `grad_logits` (`rows × num_classes`: the gradient of the top
    /// layer's output, logits or a link head's embeddings) and the
    /// [`DeviceForward`] of the same `blocks` and `x`. A link head's decoder
    /// tensors get theirs from the training entry points
    /// ([`DeviceModel::forward_backward`] and the steps).
    pub fn backward<'x>(
        &mut self,
        dev: &B,
        blocks: &[B::Block],
        x: impl Into<LayerInput<'x, B>>,
        fwd: &DeviceForward<B>,
        grad_logits: &B::Buf<f32>,
    ) -> Result<()> {
        let x = x.into();
        let shapes = self.check_blocks(dev, blocks)?;
        if shapes != fwd.shapes {
            return Err(GpuOpsError::InvalidArgument {
                name: "blocks",
                reason: "differ from the blocks of the forward pass".into(),
            });
        }
        let top = shapes.len() - 1;
        let need = shapes[top].1 * self.arch.cfg.num_classes;
        if dev.len(grad_logits) < need {
            return Err(GpuOpsError::SizeMismatch {
                what: "logit gradient (num_dst of the last block × num_classes)",
                expected: need,
                found: dev.len(grad_logits),
            });
        }
        let mut g_owned: Option<B::Buf<f32>> = None;
        for l in (0..self.arch.specs.len()).rev() {
            let spec = self.arch.specs[l];
            let layer = &self.arch.layers[l];
            let (ns, nd) = shapes[l];
            let cache = &fwd.layers[l];
            let range = self.arch.layer_params(l)?;
            let mut bias_done = false;
            if let Some(g) = g_owned.as_mut() {
                let act = cache.act.as_ref().ok_or_else(|| internal("missing act"))?;
                // Layer l + 1's dropout, applied to this layer's output.
                let mask = fwd
                    .layers
                    .get(l + 1)
                    .and_then(|c| c.dropped.as_ref())
                    .map(|(_, m)| m);
                let n = nd * spec.d_out;
                if let (0, Some((pos, hot, HotGrad::Constant))) = (l, &fwd.hot) {
                    // Historical embeddings are constants: no gradient flows into
                    // layer 0 through the hot rows. The dropout's backward, the
                    // rows zeroed, the activation's backward (where there is no
                    // dropout above), and the layer its own bias gradient: the
                    // order of the ops before the fused one below.
                    if let Some(mask) = mask {
                        dev.dropout_act_backward(mask, act, g, n, layer.activation())?;
                    }
                    let need = hot * spec.d_out;
                    if self.hot_zeros.as_ref().is_none_or(|z| dev.len(z) < need) {
                        self.hot_zeros = Some(dev.alloc(need + need / 4)?);
                    }
                    let zeros = self.hot_zeros.as_ref().ok_or_else(|| internal("zeros"))?;
                    dev.index_put_rows(zeros, spec.d_out, pos, *hot, g)?;
                    if mask.is_none() {
                        dev.activation_backward(act, g, n, layer.activation())?;
                    }
                } else {
                    // The dropout's backward (if any), the activation's and the
                    // bias gradient: one launch on CUDA.
                    let back = ActBackward {
                        mask,
                        y: act,
                        act: layer.activation(),
                    };
                    let db = &mut self.grads[range.start + layer.bias()];
                    dev.act_backward_bias_grad(back, g, nd, spec.d_out, db)?;
                    bias_done = true;
                }
            }
            let input = match (&cache.dropped, l) {
                (Some((h, _)), _) => LayerInput::Dense(h),
                (None, 0) => x,
                (None, _) => LayerInput::Dense(
                    fwd.layers[l - 1]
                        .act
                        .as_ref()
                        .ok_or_else(|| internal("missing act"))?,
                ),
            };
            let g = g_owned.as_ref().unwrap_or(grad_logits);
            let call = LayerCall {
                params: &self.params[range.clone()],
                block: &blocks[l],
                x: input,
                num_src: ns,
                num_dst: nd,
            };
            let grad = LayerGrad {
                g,
                grads: &mut self.grads[range],
                need_dx: l > 0,
                bias_done,
            };
            let dx = layer.backward_dyn(dev, &call, &cache.state, grad)?;
            if let Some(dx) = dx {
                // Through this layer's dropout and layer l − 1's activation at
                // the top of the next iteration, with layer l − 1's bias gradient.
                g_owned = Some(dx);
            }
        }
        Ok(())
    }

    /// One Adam update of every parameter from the current gradients (one
    /// launch on CUDA: [`DenseOps::adam_step_all`](crate::DenseOps::adam_step_all)).
    pub fn step(&mut self, dev: &B) -> Result<()> {
        self.step_guarded(dev, false)
    }

    /// [`DeviceModel::step`], skipped on the device while the guard is set
    /// when `guarded` (module doc, the deferred loss).
    fn step_guarded(&mut self, dev: &B, guarded: bool) -> Result<()> {
        self.steps += 1;
        let a = &self.adam;
        let hp = AdamStep {
            lr: a.lr as f32,
            beta1: a.beta1 as f32,
            beta2: a.beta2 as f32,
            eps: a.eps as f32,
            weight_decay: a.weight_decay as f32,
            step: self.steps,
        };
        let guard = if guarded { self.guard.as_ref() } else { None };
        let tensors = AdamTensors {
            params: &mut self.params,
            grads: &self.grads,
            m: &mut self.m,
            v: &mut self.v,
            lens: &self.lens,
        };
        dev.adam_step_all(&hp, tensors, guard)
    }

    /// Forward, loss against `target`, backward and a guarded Adam step, queued
    /// without reading anything (module doc, the deferred loss): the loss sum
    /// and the correct count of the batch go to `dest`'s slot (`out[2·slot]`
    /// and `out[2·slot + 1]`). The version moves on at once; see
    /// [`DeviceModel::rewind_skipped`].
    pub fn train_step_deferred<'x>(
        &mut self,
        dev: &B,
        blocks: &[B::Block],
        x: impl Into<LayerInput<'x, B>>,
        target: Target<'_, B>,
        seed: u64,
        dest: LossSlot<'_, B>,
    ) -> Result<()> {
        let step = DeferredStep { hot: None, dest };
        self.train_step_hot_deferred(dev, blocks, x, target, seed, step)
    }

    /// [`DeviceModel::train_step_deferred`] with historical embeddings for some
    /// of layer 0's outputs (`step.hot`, as [`DeviceModel::train_step_hot`]
    /// takes them), the loss going to `step.dest`.
    pub fn train_step_hot_deferred<'x>(
        &mut self,
        dev: &B,
        blocks: &[B::Block],
        x: impl Into<LayerInput<'x, B>>,
        target: Target<'_, B>,
        seed: u64,
        step: DeferredStep<'_, B>,
    ) -> Result<()> {
        let DeferredStep { hot, dest } = step;
        let x = x.into();
        self.check_target(target)?;
        if self.guard.is_none() {
            self.guard = Some(dev.alloc(1)?);
        }
        let fwd = self.forward_hot(dev, blocks, x, true, seed, hot)?;
        let rows = fwd.rows();
        let grad = match target {
            Target::Labels(labels) => {
                let classes = self.arch.cfg.num_classes;
                let mut dlogits = dev.alloc_uninit(rows * classes)?;
                let guard = self.guard.as_mut().ok_or_else(|| internal("loss guard"))?;
                let inp = XentInputs {
                    logits: &fwd.logits,
                    rows,
                    classes,
                    labels,
                };
                dev.softmax_cross_entropy_deferred(&inp, &mut dlogits, dest, guard)?;
                dlogits
            }
            Target::Pairs(p) => {
                let call = Self::decoder_call(&self.arch, &self.params, &fwd.logits, rows, p)?;
                let saved = call.forward(dev)?;
                let mut dscores = dev.alloc_uninit(p.n)?;
                let guard = self.guard.as_mut().ok_or_else(|| internal("loss guard"))?;
                dev.bce_with_logits_deferred(
                    &saved.scores,
                    p.labels,
                    p.n,
                    &mut dscores,
                    dest,
                    guard,
                )?;
                let head = self.arch.head_params();
                call.backward(dev, &saved, &dscores, &mut self.grads[head])?
            }
        };
        self.backward(dev, blocks, x, &fwd, &grad)?;
        self.step_guarded(dev, true)
    }

    /// An error unless `target` is what the model's head trains on.
    fn check_target(&self, target: Target<'_, B>) -> Result<()> {
        match (self.arch.head, target) {
            (Head::Classify, Target::Labels(_)) | (Head::Link(_), Target::Pairs(_)) => Ok(()),
            (head, Target::Labels(_)) => Err(target_mismatch(head, "node labels")),
            (head, Target::Pairs(_)) => Err(target_mismatch(head, "pairs")),
        }
    }

    /// The decoder of a link model applied to `pairs` of rows of `h` (`rows` of
    /// them, `num_classes` wide).
    fn decoder_call<'a>(
        arch: &Arch<dyn DynLayer<B>>,
        params: &'a [B::Buf<f32>],
        h: &'a B::Buf<f32>,
        rows: usize,
        pairs: impl Into<Pairs<'a, B>>,
    ) -> Result<DecoderCall<'a, B>> {
        let decoder = arch
            .head
            .decoder()
            .ok_or_else(|| target_mismatch(arch.head, "pairs"))?;
        Ok(DecoderCall {
            decoder,
            params: &params[arch.head_params()],
            h,
            rows,
            d: arch.cfg.num_classes,
            pairs: pairs.into(),
        })
    }

    /// The decoder's scores (logits) of the pairs `(src[i], dst[i])`, `i < n`,
    /// of rows of the embeddings `h` (`dim` = the model's `num_classes` wide):
    /// e.g. the outputs of [`DeviceModel::forward`] (`logits()`) or of the top
    /// layer's [`DeviceModel::forward_layer`], for evaluation and inference.
    /// Errors: a model without a link head, `dim` not the embedding width, the
    /// pair ops' errors.
    pub fn score_pairs(
        &self,
        dev: &B,
        h: &B::Buf<f32>,
        dim: usize,
        src: &B::Buf<u32>,
        dst: &B::Buf<u32>,
        n: usize,
    ) -> Result<B::Buf<f32>> {
        let d = self.arch.cfg.num_classes;
        if dim != d {
            return Err(GpuOpsError::SizeMismatch {
                what: "score_pairs dim (the embedding width, num_classes)",
                expected: d,
                found: dim,
            });
        }
        let rows = dev.len(h) / d;
        let pairs = Pairs { src, dst, n };
        let call = Self::decoder_call(&self.arch, &self.params, h, rows, pairs)?;
        Ok(call.forward(dev)?.scores)
    }

    /// After a non-finite loss read from a deferred step: `skipped` steps were
    /// queued from that batch on and none was applied (the guard). The version
    /// moves back by `skipped` and the guard is cleared.
    pub fn rewind_skipped(&mut self, dev: &B, skipped: u64) -> Result<()> {
        self.steps = self.steps.saturating_sub(skipped);
        if let Some(g) = self.guard.as_mut() {
            dev.fill_zero(g, 1)?;
        }
        Ok(())
    }

    /// Forward (with dropout), loss against `target` (labels: one per seed) and
    /// backward, without the step: the gradients stay in the model for
    /// [`DeviceModel::grads_to_host`], [`DeviceModel::set_grads`] and
    /// [`DeviceModel::step`] (data-parallel training sums them over the ranks in
    /// between). A non-finite loss skips the backward.
    pub fn forward_backward<'x>(
        &mut self,
        dev: &B,
        blocks: &[B::Block],
        x: impl Into<LayerInput<'x, B>>,
        target: Target<'_, B>,
        seed: u64,
    ) -> Result<LossStats> {
        self.forward_backward_hot(dev, blocks, x.into(), target, seed, None)
    }

    /// [`DeviceModel::forward_backward`] with historical embeddings
    /// ([`DeviceModel::forward_hot`]).
    fn forward_backward_hot(
        &mut self,
        dev: &B,
        blocks: &[B::Block],
        x: LayerInput<'_, B>,
        target: Target<'_, B>,
        seed: u64,
        hot: Option<&HotRows<'_, B>>,
    ) -> Result<LossStats> {
        self.check_target(target)?;
        let fwd = self.forward_hot(dev, blocks, x, true, seed, hot)?;
        let rows = fwd.rows();
        match target {
            Target::Labels(labels) => {
                let classes = self.arch.cfg.num_classes;
                let mut dlogits = dev.alloc_uninit(rows * classes)?;
                let stats = dev.softmax_cross_entropy(
                    &fwd.logits,
                    rows,
                    classes,
                    labels,
                    Some(&mut dlogits),
                )?;
                if stats.loss.is_finite() {
                    self.backward(dev, blocks, x, &fwd, &dlogits)?;
                }
                Ok(stats)
            }
            Target::Pairs(p) => {
                let call = Self::decoder_call(&self.arch, &self.params, &fwd.logits, rows, p)?;
                let saved: Decoded<B> = call.forward(dev)?;
                let mut dscores = dev.alloc_uninit(p.n)?;
                let stats =
                    dev.bce_with_logits(&saved.scores, p.labels, p.n, Some(&mut dscores))?;
                if stats.loss.is_finite() {
                    let head = self.arch.head_params();
                    let dh = call.backward(dev, &saved, &dscores, &mut self.grads[head])?;
                    self.backward(dev, blocks, x, &fwd, &dh)?;
                }
                Ok(stats)
            }
        }
    }

    /// Values in all parameters together (the length of a flat gradient).
    pub fn num_values(&self) -> usize {
        self.lens.iter().sum()
    }

    /// Overwrites every gradient from `flat`: the parameters' gradients
    /// concatenated in [`DeviceModel::param_names`] order
    /// ([`DeviceModel::num_values`] values).
    pub fn set_grads(&mut self, dev: &B, flat: &[f32]) -> Result<()> {
        if flat.len() != self.num_values() {
            return Err(GpuOpsError::SizeMismatch {
                what: "flat gradient (every parameter's values)",
                expected: self.num_values(),
                found: flat.len(),
            });
        }
        let mut at = 0;
        for (g, &n) in self.grads.iter_mut().zip(&self.lens) {
            dev.upload(dev.stream(), &flat[at..at + n], g)?;
            at += n;
        }
        Ok(())
    }

    /// Multiplies every gradient by `alpha` on the device (a rank's share of
    /// the batch before the ranks' sum; `alpha = 0` zeroes them, NaN included).
    pub fn scale_grads(&mut self, dev: &B, alpha: f32) -> Result<()> {
        for (g, &n) in self.grads.iter_mut().zip(&self.lens) {
            if alpha == 0.0 {
                dev.fill_zero(g, n)?;
            } else {
                dev.scale(g, n, alpha)?;
            }
        }
        Ok(())
    }

    /// Sums the gradients over the ranks of `reduce`, in place on the device.
    pub fn reduce_grads(&mut self, dev: &B, reduce: &dyn crate::GradReduce<B>) -> Result<()> {
        reduce.all_reduce_sum(dev, &mut self.grads, &self.lens)
    }

    /// How many gradient values are NaN or ±∞ (one read of a device counter).
    pub fn nonfinite_grads(&self, dev: &B) -> Result<u64> {
        let mut count = dev.to_device(&[0u32])?;
        for (g, &n) in self.grads.iter().zip(&self.lens) {
            dev.count_nonfinite(g, n, &mut count)?;
        }
        Ok(dev.to_host(&count, 1)?[0] as u64)
    }

    /// Forward (with dropout), loss against `target` (node labels, one per
    /// seed, or labelled pairs of seeds: the model's head decides), backward and
    /// one Adam step; returns the batch's loss and correct count (rows or
    /// pairs). A non-finite loss skips the backward and the step (the version
    /// does not move).
    pub fn train_step<'x>(
        &mut self,
        dev: &B,
        blocks: &[B::Block],
        x: impl Into<LayerInput<'x, B>>,
        target: Target<'_, B>,
        seed: u64,
    ) -> Result<LossStats> {
        self.train_step_hot(dev, blocks, x, target, seed, None)
    }

    /// [`DeviceModel::train_step`] with historical embeddings for some of layer 0's
    /// outputs ([`DeviceModel::forward_hot`]; their gradient rows are zeroed).
    pub fn train_step_hot<'x>(
        &mut self,
        dev: &B,
        blocks: &[B::Block],
        x: impl Into<LayerInput<'x, B>>,
        target: Target<'_, B>,
        seed: u64,
        hot: Option<&HotRows<'_, B>>,
    ) -> Result<LossStats> {
        let stats = self.forward_backward_hot(dev, blocks, x.into(), target, seed, hot)?;
        if stats.loss.is_finite() {
            self.step(dev)?;
        }
        // A NaN or infinite loss: no backward, no step; the weights stay as they
        // were (the caller sees the loss and decides).
        Ok(stats)
    }
}
