//! GCN, GraphSAGE-mean and GAT on any [`Backend`]: the same math as
//! [`cpu_ops::Model`] (read its module doc for the formulas, parameter order and
//! initialization), composed from the backend's ops so that it runs on the GPU.
//!
//! A [`DeviceModel`] is made from a host [`cpu_ops::Model`] (so both start from the
//! same initialization) and keeps on the device: the parameters, their gradients and
//! Adam's moments. One training step is
//! 1. [`DeviceModel::forward`] over the batch's blocks (bottom first) from the
//!    gathered input rows, with dropout (layer `l` seeded `derive_seed(seed, l)`, as
//!    the host model), keeping what the backward needs;
//! 2. [`DenseOps::softmax_cross_entropy`](crate::DenseOps::softmax_cross_entropy) on
//!    the logits, giving `∂L/∂logits`;
//! 3. [`DeviceModel::backward`]: every parameter's gradient;
//! 4. [`DeviceModel::step`]: one Adam update of every tensor (PyTorch's `Adam`, L2
//!    weight decay), after which [`DeviceModel::version`] is one larger.
//!
//! [`DeviceModel::train_step`] does all four. [`DeviceModel::forward_layer`] applies
//! one layer without dropout, for layer-wise full-graph inference.
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
//!    neighbors: hot destinations also train layer 0 (issue 6's optional mode, in
//!    which the CPU would send its aggregate; here the accelerator has its own,
//!    since it computes layer 0 over the whole block).
//!
//! Per layer (`X` = input, `n_src`/`n_dst` from the block, `G` = gradient of the
//! output), with the host model's choice of order: aggregate first when
//! `d_in ≤ d_out`, else project first (`A (X·W)`):
//! - SAGE: `out = X_dst·W_self + A_mean(X)·W_neigh + b`;
//! - GCN: `out = Â X W + b` over the block with self-loops
//!   ([`Sampling::add_self_loops`](crate::Sampling::add_self_loops)) and `GcnNorm` aggregation;
//! - GAT: `z = X·W`, `o = gat(z) + b`; the last layer averages heads with one GEMM
//!   against the constant `H·F × F` matrix `S` (`S[h·F+f, f] = 1/H`), whose backward
//!   is `G·Sᵀ`.

#[cfg(test)]
mod tests;

use cpu_ops::{derive_seed, AdamConfig, AggregateKind, LayerSpec, Model, ModelConfig, ModelKind};

use crate::backend::{Activation, AdamStep, Backend, DevMat, GatSaved, LossStats};
use crate::error::{GpuOpsError, Result};

/// ELU's `α` in GAT hidden layers (as the host model).
const ELU_ALPHA: f32 = 1.0;

/// What one layer's forward keeps for its backward.
struct LayerFwd<B: Backend> {
    /// The layer input after dropout, and the mask (layers above 0, when training).
    dropped: Option<(B::Buf<f32>, B::Mask)>,
    /// GCN: the block with self-loops.
    aug: Option<B::Block>,
    /// GCN/SAGE aggregating first: `A X` (`n_dst × d_in`).
    agg: Option<B::Buf<f32>>,
    /// GAT: the projected sources `z = X·W` and the attention state.
    gat: Option<(B::Buf<f32>, GatSaved<B>)>,
    /// Hidden layers: the output after the activation.
    act: Option<B::Buf<f32>>,
}

/// How layer 0's backward treats the rows replaced by historical embeddings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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

/// Gradients of one layer's input and the layer's parameters.
type LayerGrad<B> = Option<<B as crate::DeviceCore>::Buf<f32>>;

/// A GNN model whose parameters, gradients and optimizer state live on a device.
pub struct DeviceModel<B: Backend> {
    cfg: ModelConfig,
    specs: Vec<LayerSpec>,
    params: Vec<B::Buf<f32>>,
    grads: Vec<B::Buf<f32>>,
    m: Vec<B::Buf<f32>>,
    v: Vec<B::Buf<f32>>,
    lens: Vec<usize>,
    names: Vec<String>,
    adam: AdamConfig,
    steps: u64,
    /// GAT: the head-averaging matrix `S` of the last layer.
    head_mean: Option<B::Buf<f32>>,
    /// Zero rows written over layer 0's output gradient at constant hot rows
    /// (zeroed once, grown when a batch has more hot rows).
    hot_zeros: Option<B::Buf<f32>>,
}

fn internal(what: &str) -> GpuOpsError {
    GpuOpsError::InvalidArgument {
        name: "device model internals",
        reason: what.into(),
    }
}

impl<B: Backend> DeviceModel<B> {
    /// Uploads `model`'s parameters; zero gradients and moments; `adam`'s
    /// hyper-parameters (only L2 weight decay is supported on devices).
    pub fn from_host(dev: &B, model: &Model<f32>, adam: AdamConfig) -> Result<Self> {
        if adam.decay != cpu_ops::WeightDecay::L2 {
            return Err(GpuOpsError::InvalidArgument {
                name: "adam.decay",
                reason: "device models implement Adam with L2 weight decay only".into(),
            });
        }
        let cfg = model.config().clone();
        let specs = model.layer_specs().to_vec();
        let host = model.params();
        let expected: usize = match cfg.kind {
            ModelKind::Gcn => 2,
            ModelKind::Sage => 3,
            ModelKind::Gat => 4,
        } * cfg.num_layers;
        if host.len() != expected {
            return Err(internal("host model has an unexpected number of tensors"));
        }
        let lens: Vec<usize> = host.iter().map(|p| p.len()).collect();
        let mut params = Vec::with_capacity(host.len());
        let (mut grads, mut m, mut v) = (Vec::new(), Vec::new(), Vec::new());
        for p in &host {
            params.push(dev.to_device(p)?);
            grads.push(dev.alloc(p.len())?);
            m.push(dev.alloc(p.len())?);
            v.push(dev.alloc(p.len())?);
        }
        let head_mean = match (cfg.kind, specs.last()) {
            (ModelKind::Gat, Some(top)) => {
                let (h, f) = (top.heads, top.head_dim);
                let mut s = vec![0f32; h * f * f];
                for hh in 0..h {
                    for ff in 0..f {
                        s[(hh * f + ff) * f + ff] = 1.0 / h as f32;
                    }
                }
                Some(dev.to_device(&s)?)
            }
            _ => None,
        };
        Ok(Self {
            cfg,
            specs,
            params,
            grads,
            m,
            v,
            lens,
            names: model.param_names(),
            adam,
            steps: 0,
            head_mean,
            hot_zeros: None,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Optimizer steps taken (the weight version).
    pub fn version(&self) -> u64 {
        self.steps
    }

    /// Parameter names, in order (as [`cpu_ops::Model::param_names`]).
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
        let spec = self.specs.get(l).ok_or(GpuOpsError::InvalidArgument {
            name: "layer",
            reason: format!("the model has {} layers", self.specs.len()),
        })?;
        let end = self
            .specs
            .get(l + 1)
            .map_or(self.params.len(), |s| s.first_param);
        Ok(spec.first_param..end)
    }

    /// Replaces all parameters (and optionally Adam's moments and step count), e.g.
    /// from a checkpoint. Lengths must match.
    pub fn load(
        &mut self,
        dev: &B,
        params: &[&[f32]],
        moments: Option<AdamMoments<'_>>,
    ) -> Result<()> {
        let check = |what: &'static str, got: &[&[f32]]| -> Result<()> {
            if got.len() != self.lens.len() {
                return Err(GpuOpsError::SizeMismatch {
                    what,
                    expected: self.lens.len(),
                    found: got.len(),
                });
            }
            for (p, &n) in got.iter().zip(&self.lens) {
                if p.len() != n {
                    return Err(GpuOpsError::SizeMismatch {
                        what,
                        expected: n,
                        found: p.len(),
                    });
                }
            }
            Ok(())
        };
        check("parameter tensors", params)?;
        if let Some(a) = &moments {
            check("first moments", a.m)?;
            check("second moments", a.v)?;
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
        if blocks.len() != self.specs.len() {
            return Err(GpuOpsError::SizeMismatch {
                what: "blocks (one per model layer)",
                expected: self.specs.len(),
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
    /// (`num_src(blocks[0]) × in_dim`). Dropout runs only when `train`.
    pub fn forward(
        &self,
        dev: &B,
        blocks: &[B::Block],
        x: &B::Buf<f32>,
        train: bool,
        seed: u64,
    ) -> Result<DeviceForward<B>> {
        self.forward_hot(dev, blocks, x, train, seed, None)
    }

    /// [`DeviceModel::forward`] with layer 0's outputs at `hot.positions` replaced
    /// by `hot.rows` (module doc). Needs at least two layers when `hot` is given.
    pub fn forward_hot(
        &self,
        dev: &B,
        blocks: &[B::Block],
        x: &B::Buf<f32>,
        train: bool,
        seed: u64,
        hot: Option<&HotRows<'_, B>>,
    ) -> Result<DeviceForward<B>> {
        let shapes = self.check_blocks(dev, blocks)?;
        let hot = match hot {
            Some(h) if h.n > 0 => Some(self.check_hot(dev, &shapes, h)?),
            _ => None,
        };
        let need = shapes[0].0 * self.cfg.in_dim;
        if dev.len(x) < need {
            return Err(GpuOpsError::SizeMismatch {
                what: "model input (num_src of the first block × in_dim)",
                expected: need,
                found: dev.len(x),
            });
        }
        let p = if train { self.cfg.dropout } else { 0.0 };
        let mut layers: Vec<LayerFwd<B>> = Vec::with_capacity(self.specs.len());
        let mut logits = None;
        // Layer l's dropped input, made by layer l − 1's fused bias/activation/dropout.
        let mut next_dropped: Option<(B::Buf<f32>, B::Mask)> = None;
        for (l, (spec, block)) in self.specs.iter().zip(blocks).enumerate() {
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
                (Some((h, _)), _) => h,
                (None, None) => x,
                (None, Some(below)) => below.act.as_ref().ok_or_else(|| internal("missing act"))?,
            };
            // Below the top the bias is added by the fused op below.
            let (out, mut state) =
                self.layer_forward(dev, spec, block, input, ns, nd, spec.last)?;
            state.dropped = dropped;
            if spec.last {
                logits = Some(out);
            } else {
                let mut out = out;
                let hot_here = l == 0 && hot.is_some();
                let bias = self.bias_of(spec);
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
                            self.activation(),
                            Some((p, key, &mut h)),
                        )?
                        .ok_or_else(|| internal("no dropout mask"))?;
                    next_dropped = Some((h, mask));
                } else {
                    dev.bias_act_dropout(&mut out, nd, spec.d_out, bias, self.activation(), None)?;
                }
                if let (0, Some(h)) = (l, &hot) {
                    dev.index_put_rows(h.rows, spec.d_out, h.positions, h.n, &mut out)?;
                }
                state.act = Some(out);
            }
            layers.push(state);
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
        let Some(spec) = self.specs.first().filter(|s| !s.last) else {
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
    /// `x` is `num_src(block) × d_in`, the result `num_dst(block) × d_out`.
    pub fn forward_layer(
        &self,
        dev: &B,
        l: usize,
        block: &B::Block,
        x: &B::Buf<f32>,
    ) -> Result<B::Buf<f32>> {
        let spec = *self.specs.get(l).ok_or(GpuOpsError::InvalidArgument {
            name: "layer",
            reason: format!("the model has {} layers", self.specs.len()),
        })?;
        let (ns, nd, _) = dev.block_shape(block);
        if dev.len(x) < ns * spec.d_in {
            return Err(GpuOpsError::SizeMismatch {
                what: "layer input (num_src × d_in)",
                expected: ns * spec.d_in,
                found: dev.len(x),
            });
        }
        let (mut out, _) = self.layer_forward(dev, &spec, block, x, ns, nd, spec.last)?;
        if !spec.last {
            let bias = self.bias_of(&spec);
            dev.bias_act_dropout(&mut out, nd, spec.d_out, bias, self.activation(), None)?;
        }
        Ok(out)
    }

    /// Output width of layer `l`.
    pub fn layer_out_dim(&self, l: usize) -> Option<usize> {
        self.specs.get(l).map(|s| s.d_out)
    }

    /// The hidden layers' activation.
    fn activation(&self) -> Activation {
        match self.cfg.kind {
            ModelKind::Gat => Activation::Elu { alpha: ELU_ALPHA },
            ModelKind::Gcn | ModelKind::Sage => Activation::Relu,
        }
    }

    /// Layer `spec`'s bias.
    fn bias_of(&self, spec: &LayerSpec) -> &B::Buf<f32> {
        let bias = match self.cfg.kind {
            ModelKind::Sage => 2,
            ModelKind::Gcn => 1,
            ModelKind::Gat => 3,
        };
        &self.params[spec.first_param + bias]
    }

    /// Layer `spec` on `x`; adds its bias only when `with_bias` (the hidden
    /// layers' bias goes with their activation, [`Backend::bias_act_dropout`]).
    #[allow(clippy::too_many_arguments)]
    fn layer_forward(
        &self,
        dev: &B,
        spec: &LayerSpec,
        block: &B::Block,
        x: &B::Buf<f32>,
        ns: usize,
        nd: usize,
        with_bias: bool,
    ) -> Result<(B::Buf<f32>, LayerFwd<B>)> {
        let p = &self.params[spec.first_param..];
        let (d_in, d_out) = (spec.d_in, spec.d_out);
        let mut state = LayerFwd {
            dropped: None,
            aug: None,
            agg: None,
            gat: None,
            act: None,
        };
        let out = match self.cfg.kind {
            ModelKind::Sage | ModelKind::Gcn => {
                let sage = self.cfg.kind == ModelKind::Sage;
                let (kind, w_agg, bias) = if sage {
                    (AggregateKind::Mean, &p[1], &p[2])
                } else {
                    (AggregateKind::GcnNorm, &p[0], &p[1])
                };
                let aug = if sage {
                    None
                } else {
                    Some(dev.add_self_loops(block)?)
                };
                let agg_block = aug.as_ref().unwrap_or(block);
                let mut out = dev.alloc_uninit(nd * d_out)?;
                if d_in <= d_out {
                    let mut agg = dev.alloc_uninit(nd * d_in)?;
                    dev.aggregate_forward(agg_block, kind, x, d_in, &mut agg)?;
                    dev.matmul(
                        DevMat::new(&agg, nd, d_in),
                        DevMat::new(w_agg, d_in, d_out),
                        &mut out,
                        false,
                    )?;
                    state.agg = Some(agg);
                } else {
                    let mut proj = dev.alloc_uninit(ns * d_out)?;
                    dev.matmul(
                        DevMat::new(x, ns, d_in),
                        DevMat::new(w_agg, d_in, d_out),
                        &mut proj,
                        false,
                    )?;
                    dev.aggregate_forward(agg_block, kind, &proj, d_out, &mut out)?;
                }
                if sage {
                    dev.matmul(
                        DevMat::new(x, nd, d_in),
                        DevMat::new(&p[0], d_in, d_out),
                        &mut out,
                        true,
                    )?;
                }
                if with_bias {
                    dev.add_bias(&mut out, nd, d_out, bias)?;
                }
                state.aug = aug;
                out
            }
            ModelKind::Gat => {
                let (w, a_src, a_dst, bias) = (&p[0], &p[1], &p[2], &p[3]);
                let width = spec.width();
                let mut z = dev.alloc_uninit(ns * width)?;
                dev.matmul(
                    DevMat::new(x, ns, d_in),
                    DevMat::new(w, d_in, width),
                    &mut z,
                    false,
                )?;
                let saved = dev.gat_forward(block, spec.heads, spec.head_dim, &z, a_src, a_dst)?;
                let mut o = dev.alloc_uninit(nd * width)?;
                dev.copy(&saved.out, &mut o, nd * width)?;
                if with_bias {
                    dev.add_bias(&mut o, nd, width, bias)?;
                }
                state.gat = Some((z, saved));
                if spec.last {
                    let s = self
                        .head_mean
                        .as_ref()
                        .ok_or_else(|| internal("missing head-mean matrix"))?;
                    let mut out = dev.alloc_uninit(nd * d_out)?;
                    dev.matmul(
                        DevMat::new(&o, nd, width),
                        DevMat::new(s, width, d_out),
                        &mut out,
                        false,
                    )?;
                    out
                } else {
                    o
                }
            }
        };
        Ok((out, state))
    }

    /// Backward pass: fills every parameter's gradient (read them with
    /// [`DeviceModel::grads_to_host`] or apply them with [`DeviceModel::step`]),
    /// given `grad_logits` (`rows × num_classes`) and the [`DeviceForward`] of the
    /// same `blocks` and `x`.
    pub fn backward(
        &mut self,
        dev: &B,
        blocks: &[B::Block],
        x: &B::Buf<f32>,
        fwd: &DeviceForward<B>,
        grad_logits: &B::Buf<f32>,
    ) -> Result<()> {
        let shapes = self.check_blocks(dev, blocks)?;
        if shapes != fwd.shapes {
            return Err(GpuOpsError::InvalidArgument {
                name: "blocks",
                reason: "differ from the blocks of the forward pass".into(),
            });
        }
        let top = shapes.len() - 1;
        let need = shapes[top].1 * self.cfg.num_classes;
        if dev.len(grad_logits) < need {
            return Err(GpuOpsError::SizeMismatch {
                what: "logit gradient (num_dst of the last block × num_classes)",
                expected: need,
                found: dev.len(grad_logits),
            });
        }
        let mut g_owned: Option<B::Buf<f32>> = None;
        for l in (0..self.specs.len()).rev() {
            let spec = self.specs[l];
            let (ns, nd) = shapes[l];
            let cache = &fwd.layers[l];
            if let Some(g) = g_owned.as_mut() {
                if let (0, Some((pos, n, HotGrad::Constant))) = (l, &fwd.hot) {
                    // Historical embeddings are constants: no gradient flows into
                    // layer 0 through the hot rows.
                    let need = n * spec.d_out;
                    if self.hot_zeros.as_ref().is_none_or(|z| dev.len(z) < need) {
                        self.hot_zeros = Some(dev.alloc(need + need / 4)?);
                    }
                    let zeros = self.hot_zeros.as_ref().ok_or_else(|| internal("zeros"))?;
                    dev.index_put_rows(zeros, spec.d_out, pos, *n, g)?;
                }
                // (Zeroing those rows before or after the activation's backward
                // is the same: it maps a zero gradient to zero.)
                // Layer l + 1's dropout fused this activation's backward with its
                // own (below), when it had one.
                let fused = fwd.layers.get(l + 1).is_some_and(|c| c.dropped.is_some());
                if !fused {
                    let act = cache.act.as_ref().ok_or_else(|| internal("missing act"))?;
                    dev.activation_backward(act, g, nd * spec.d_out, self.activation())?;
                }
            }
            let input = match (&cache.dropped, l) {
                (Some((h, _)), _) => h,
                (None, 0) => x,
                (None, _) => fwd.layers[l - 1]
                    .act
                    .as_ref()
                    .ok_or_else(|| internal("missing act"))?,
            };
            let g = g_owned.as_ref().unwrap_or(grad_logits);
            let dx = self.layer_backward(dev, &spec, &blocks[l], cache, input, g, ns, nd, l > 0)?;
            if let Some(mut dx) = dx {
                if let Some((_, mask)) = &cache.dropped {
                    // The dropout's backward and layer l − 1's activation's in
                    // one pass (its output is this layer's input before dropout).
                    let below = l
                        .checked_sub(1)
                        .and_then(|k| fwd.layers[k].act.as_ref())
                        .ok_or_else(|| internal("dropout below layer 0"))?;
                    let n = ns * spec.d_in;
                    dev.dropout_act_backward(mask, below, &mut dx, n, self.activation())?;
                }
                g_owned = Some(dx);
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn layer_backward(
        &mut self,
        dev: &B,
        spec: &LayerSpec,
        block: &B::Block,
        cache: &LayerFwd<B>,
        x: &B::Buf<f32>,
        g: &B::Buf<f32>,
        ns: usize,
        nd: usize,
        need_dx: bool,
    ) -> Result<LayerGrad<B>> {
        let (d_in, d_out) = (spec.d_in, spec.d_out);
        let first = spec.first_param;
        let p = &self.params[first..];
        let grads = &mut self.grads[first..];
        match self.cfg.kind {
            ModelKind::Sage | ModelKind::Gcn => {
                let sage = self.cfg.kind == ModelKind::Sage;
                let (kind, agg_block, w_agg) = if sage {
                    (AggregateKind::Mean, block, &p[1])
                } else {
                    let aug = cache.aug.as_ref().ok_or_else(|| internal("missing aug"))?;
                    (AggregateKind::GcnNorm, aug, &p[0])
                };
                let (gi_agg, gi_bias) = if sage { (1, 2) } else { (0, 1) };
                dev.bias_grad(g, nd, d_out, &mut grads[gi_bias], false)?;
                if sage {
                    dev.matmul(
                        DevMat::new(x, nd, d_in).t(),
                        DevMat::new(g, nd, d_out),
                        &mut grads[0],
                        false,
                    )?;
                }
                let mut dx = None;
                match &cache.agg {
                    None => {
                        let mut dp = dev.alloc_uninit(ns * d_out)?;
                        dev.aggregate_backward(agg_block, kind, g, d_out, &mut dp)?;
                        dev.matmul(
                            DevMat::new(x, ns, d_in).t(),
                            DevMat::new(&dp, ns, d_out),
                            &mut grads[gi_agg],
                            false,
                        )?;
                        if need_dx {
                            let mut d = dev.alloc_uninit(ns * d_in)?;
                            dev.matmul(
                                DevMat::new(&dp, ns, d_out),
                                DevMat::new(w_agg, d_in, d_out).t(),
                                &mut d,
                                false,
                            )?;
                            dx = Some(d);
                        }
                    }
                    Some(agg) => {
                        dev.matmul(
                            DevMat::new(agg, nd, d_in).t(),
                            DevMat::new(g, nd, d_out),
                            &mut grads[gi_agg],
                            false,
                        )?;
                        if need_dx {
                            let mut dm = dev.alloc_uninit(nd * d_in)?;
                            dev.matmul(
                                DevMat::new(g, nd, d_out),
                                DevMat::new(w_agg, d_in, d_out).t(),
                                &mut dm,
                                false,
                            )?;
                            let mut d = dev.alloc_uninit(ns * d_in)?;
                            dev.aggregate_backward(agg_block, kind, &dm, d_in, &mut d)?;
                            dx = Some(d);
                        }
                    }
                }
                if sage {
                    if let Some(d) = dx.as_mut() {
                        dev.matmul(
                            DevMat::new(g, nd, d_out),
                            DevMat::new(&p[0], d_in, d_out).t(),
                            d,
                            true,
                        )?;
                    }
                }
                Ok(dx)
            }
            ModelKind::Gat => {
                let (w, a_src, a_dst) = (&p[0], &p[1], &p[2]);
                let (h, f) = (spec.heads, spec.head_dim);
                let width = spec.width();
                let (z, saved) = cache
                    .gat
                    .as_ref()
                    .ok_or_else(|| internal("missing GAT state"))?;
                let spread;
                let d_o = if spec.last {
                    let s = self
                        .head_mean
                        .as_ref()
                        .ok_or_else(|| internal("missing head-mean matrix"))?;
                    let mut d = dev.alloc_uninit(nd * width)?;
                    dev.matmul(
                        DevMat::new(g, nd, d_out),
                        DevMat::new(s, width, d_out).t(),
                        &mut d,
                        false,
                    )?;
                    spread = d;
                    &spread
                } else {
                    g
                };
                dev.bias_grad(d_o, nd, width, &mut grads[3], false)?;
                let gg = dev.gat_backward(block, h, f, z, a_src, a_dst, saved, d_o)?;
                dev.copy(&gg.a_src, &mut grads[1], width)?;
                dev.copy(&gg.a_dst, &mut grads[2], width)?;
                dev.matmul(
                    DevMat::new(x, ns, d_in).t(),
                    DevMat::new(&gg.z_src, ns, width),
                    &mut grads[0],
                    false,
                )?;
                if !need_dx {
                    return Ok(None);
                }
                let mut dx = dev.alloc_uninit(ns * d_in)?;
                dev.matmul(
                    DevMat::new(&gg.z_src, ns, width),
                    DevMat::new(w, d_in, width).t(),
                    &mut dx,
                    false,
                )?;
                Ok(Some(dx))
            }
        }
    }

    /// One Adam update of every parameter from the current gradients.
    pub fn step(&mut self, dev: &B) -> Result<()> {
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
        for i in 0..self.params.len() {
            dev.adam_step(
                &hp,
                &mut self.params[i],
                &self.grads[i],
                &mut self.m[i],
                &mut self.v[i],
                self.lens[i],
            )?;
        }
        Ok(())
    }

    /// Forward (with dropout), loss against `labels` (one per seed) and backward,
    /// without the step: the gradients stay in the model for
    /// [`DeviceModel::grads_to_host`], [`DeviceModel::set_grads`] and
    /// [`DeviceModel::step`] (data-parallel training sums them over the ranks in
    /// between). A non-finite loss skips the backward.
    pub fn forward_backward(
        &mut self,
        dev: &B,
        blocks: &[B::Block],
        x: &B::Buf<f32>,
        labels: &B::Buf<u32>,
        seed: u64,
    ) -> Result<LossStats> {
        self.forward_backward_hot(dev, blocks, x, labels, seed, None)
    }

    /// [`DeviceModel::forward_backward`] with historical embeddings
    /// ([`DeviceModel::forward_hot`]).
    fn forward_backward_hot(
        &mut self,
        dev: &B,
        blocks: &[B::Block],
        x: &B::Buf<f32>,
        labels: &B::Buf<u32>,
        seed: u64,
        hot: Option<&HotRows<'_, B>>,
    ) -> Result<LossStats> {
        let fwd = self.forward_hot(dev, blocks, x, true, seed, hot)?;
        let rows = fwd.rows();
        let classes = self.cfg.num_classes;
        let mut dlogits = dev.alloc_uninit(rows * classes)?;
        let stats =
            dev.softmax_cross_entropy(&fwd.logits, rows, classes, labels, Some(&mut dlogits))?;
        if stats.loss.is_finite() {
            self.backward(dev, blocks, x, &fwd, &dlogits)?;
        }
        Ok(stats)
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

    /// Forward (with dropout), loss against `labels` (one per seed), backward and one
    /// Adam step; returns the batch's loss and correct count. A non-finite loss
    /// skips the backward and the step (the version does not move).
    pub fn train_step(
        &mut self,
        dev: &B,
        blocks: &[B::Block],
        x: &B::Buf<f32>,
        labels: &B::Buf<u32>,
        seed: u64,
    ) -> Result<LossStats> {
        self.train_step_hot(dev, blocks, x, labels, seed, None)
    }

    /// [`DeviceModel::train_step`] with historical embeddings for some of layer 0's
    /// outputs ([`DeviceModel::forward_hot`]; their gradient rows are zeroed).
    pub fn train_step_hot(
        &mut self,
        dev: &B,
        blocks: &[B::Block],
        x: &B::Buf<f32>,
        labels: &B::Buf<u32>,
        seed: u64,
        hot: Option<&HotRows<'_, B>>,
    ) -> Result<LossStats> {
        let stats = self.forward_backward_hot(dev, blocks, x, labels, seed, hot)?;
        if stats.loss.is_finite() {
            self.step(dev)?;
        }
        // A NaN or infinite loss: no backward, no step; the weights stay as they
        // were (the caller sees the loss and decides).
        Ok(stats)
    }
}
