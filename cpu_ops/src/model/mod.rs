//! GNN models on sampled blocks: GCN, GraphSAGE (mean) and GAT, forward and
//! hand-written backward, matching DGL 1.1.3's layers.
//!
//! A model of `L` layers runs on `L` blocks ([`BlockView`]s, bottom first): layer `l`
//! maps block `l`'s sources (`n_src × d_in`, row-major) to its destinations
//! (`n_dst × d_out`); destination `i` is source `i`, and block `l`'s destinations are
//! block `l+1`'s sources. `d_in` is `in_dim` for layer 0 and `hidden` above;
//! `d_out` is `hidden` below the last layer and `num_classes` for the last.
//! Weights are stored `d_in × d_out` row-major (the transpose of PyTorch's
//! `nn.Linear.weight`), so a projection is `X·W`.
//!
//! ## Model (DGL's `examples/pytorch/graphsage` convention, for every kind)
//! ```text
//! h⁰ = x
//! for l in 0..L:
//!     if l > 0: hˡ = dropout(hˡ)            (only when `train`; stream derive_seed(seed, l))
//!     hˡ⁺¹ = layer_l(block_l, hˡ)
//!     if l < L-1: hˡ⁺¹ = act(hˡ⁺¹)          (ReLU; ELU with α = 1 for GAT, as DGL's GAT example)
//! logits = hᴸ
//! ```
//! So dropout acts on every hidden representation (after its activation), never on
//! the raw features, and the logits have no activation. [`DropoutMask`]'s inverted
//! dropout keeps evaluation unscaled.
//!
//! ## Layers (`X` = layer input, `G = ∂L/∂out`, `A·` = an aggregation of
//! [`crate::aggregate_forward`], `Aᵀ` its adjoint)
//!
//! **GraphSAGE-mean** (`dgl.nn.SAGEConv(aggregator_type="mean")`), parameters
//! `W_self`, `W_neigh` (`d_in × d_out`), `b`:
//! - forward: `out_i = x_i·W_self + mean_{j∈N(i)} x_j·W_neigh + b` (`x_i` is source
//!   row `i`; an isolated destination's mean is 0). With `M = A_mean X`:
//!   `out = X_dst·W_self + M·W_neigh + b`, computed as `A_mean (X·W_neigh)` when
//!   `d_in > d_out` (DGL's `lin_before_mp`, cheaper), else `(A_mean X)·W_neigh`.
//! - backward: `∂b = Σ_i G_i`, `∂W_self = X_dstᵀ G`,
//!   `∂W_neigh = Xᵀ (A_meanᵀ G)` (or `Mᵀ G`),
//!   `∂X = A_meanᵀ (G W_neighᵀ)` plus `G W_selfᵀ` on the first `n_dst` rows.
//!
//! **GCN** (`dgl.nn.GraphConv(norm="both")` on a graph with self-loops added),
//! parameters `W` (`d_in × d_out`), `b`. Tandem's blocks have no self-loops, so the
//! model builds an *augmented block* per layer: destination `i`'s row is `N(i)`
//! followed by `i` itself (cached in [`Forward`]). With `d̃_in(i) = |N(i)| + 1` and
//! `d̃_out(j)` = the number of augmented-block edges reading source `j` (its sampled
//! out-degree in the block, plus 1 if `j < n_dst`):
//! - forward: `out_i = Σ_{j∈N(i)∪{i}} x_j·W / √(d̃_out(j)·d̃_in(i)) + b`, i.e.
//!   `out = Â X W + b` with `Â` the `GcnNorm` aggregation over the augmented block;
//!   `Â (X·W)` when `d_in > d_out` (as DGL), else `(Â X)·W`.
//! - backward: `∂b = Σ_i G_i`, `∂W = Xᵀ (Âᵀ G)` (or `(ÂX)ᵀ G`), `∂X = Âᵀ G Wᵀ`.
//!
//! **GAT** (`dgl.nn.GATConv`, no feature/attention dropout, no residual),
//! parameters `W` (`d_in × H·F`), `a_src`, `a_dst` (`H × F`), `b` (`H·F`); hidden
//! layers have `F = hidden / H` and concatenate heads, the last has `F = num_classes`
//! and averages heads:
//! - forward: `z = X·W` (all sources), `o = gat(block, z, a_src, a_dst)` (per-head
//!   edge softmax of `LeakyReLU_{0.2}(a_src·z_j + a_dst·z_i)`, see
//!   [`crate::gat_forward`]), `out = o + b` (hidden), or
//!   `logits_i = (1/H) Σ_h (o_{i,h} + b_h)` (last).
//! - backward: last layer `∂o_{i,h} = G_i / H` (hidden: `∂o = G`); `∂b = Σ_i ∂o_i`;
//!   `(∂z, ∂a_src, ∂a_dst) = gat_backward(∂o)`; `∂W = Xᵀ ∂z`; `∂X = ∂z Wᵀ`.
//!
//! Activations' backward reads their output (`∂x = ∂y·[y > 0]` for ReLU,
//! `∂x = ∂y·(y > 0 ? 1 : y + 1)` for ELU); dropout's reuses its mask. Layer 0 never
//! computes `∂X` (the features have no gradient).
//!
//! ## Sparse input
//! Layer 0 may read a [`SparseRows`] input ([`ModelInput::Sparse`], e.g. bag-of-words
//! features). Then layer 0 always projects first (`A (X·W)`, which equals `(A X)·W`
//! by associativity), computing `X·W` and `X_dst·W_self` with
//! [`SparseRows::spmm_rows`] and the weight gradients `Xᵀ(·)` with
//! [`SparseRows::spmm_tn_rows`]; `∂X` is never formed. Layers above are unchanged.
//!
//! ## Element types
//! Everything is generic over [`Real`]; `f32` runs the SIMD fast paths of the
//! aggregation and attention kernels, `f64` the scalar twins (used by the
//! finite-difference tests). All kernels are deterministic, so logits and gradients
//! are bit-identical on any number of rayon threads.
//!
//! ## Parameters
//! Order and names (`l` = layer index), with DGL's initialization (see [`crate::Init`]):
//! - GCN: `layer{l}.weight`, `layer{l}.bias`;
//! - SAGE: `layer{l}.weight_self`, `layer{l}.weight_neigh`, `layer{l}.bias`;
//! - GAT: `layer{l}.weight`, `layer{l}.attn_src`, `layer{l}.attn_dst`,
//!   `layer{l}.bias`.

mod gat;
mod gcn;
mod kernel;
mod sage;
#[cfg(test)]
mod tests;

use crate::activation::{elu, elu_backward, relu, relu_backward};
use crate::aggregate::{check_matrix, BlockView};
use crate::attention::GatForward;
use crate::dropout::{dropout, DropoutMask};
use crate::error::{CpuOpsError, Result};
use crate::real::Real;
use crate::rng::derive_seed;
use crate::sparse::SparseRows;

use crate::init::{Init, RELU_GAIN};

/// ELU's `α` in GAT hidden layers (PyTorch's `F.elu` default).
const ELU_ALPHA: f64 = 1.0;

/// The input of layer 0: dense row-major values or sparse rows.
#[derive(Clone, Copy, Debug)]
pub enum ModelInput<'a, T: Real> {
    /// `num_src(blocks[0]) × in_dim` values, row-major.
    Dense(&'a [T]),
    /// `num_src(blocks[0])` rows of `in_dim` columns.
    Sparse(&'a SparseRows<T>),
}

impl<T: Real> ModelInput<'_, T> {
    /// Whether this is [`ModelInput::Sparse`].
    pub fn is_sparse(&self) -> bool {
        matches!(self, ModelInput::Sparse(_))
    }

    /// Checks the shape: `rows × cols`.
    fn check(&self, rows: usize, cols: usize) -> Result<()> {
        match self {
            ModelInput::Dense(x) => check_matrix(
                "model input (num_src of the first block × in_dim)",
                x.len(),
                rows,
                cols,
            ),
            ModelInput::Sparse(x) => {
                for (what, expected, found) in [
                    (
                        "sparse model input rows (num_src of the first block)",
                        rows,
                        x.num_rows(),
                    ),
                    ("sparse model input columns (in_dim)", cols, x.num_cols()),
                ] {
                    if expected != found {
                        return Err(CpuOpsError::SizeMismatch {
                            what,
                            expected,
                            found,
                        });
                    }
                }
                Ok(())
            }
        }
    }
}

/// The layer family of a [`Model`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// `GraphConv(norm="both")` with self-loops, ReLU between layers.
    Gcn,
    /// `SAGEConv(aggregator_type="mean")`, ReLU between layers.
    Sage,
    /// `GATConv` with `heads` heads, ELU between layers, heads averaged at the top.
    Gat,
}

/// The shape and hyper-parameters of a [`Model`].
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Layer family.
    pub kind: ModelKind,
    /// Input feature width (at least 1).
    pub in_dim: usize,
    /// Hidden width (at least 1 when `num_layers > 1`; for GAT the concatenation of
    /// all heads, so a multiple of `heads`).
    pub hidden: usize,
    /// Number of classes: the width of the logits (at least 1).
    pub num_classes: usize,
    /// Number of layers (at least 1), one block each.
    pub num_layers: usize,
    /// Attention heads (GAT only, at least 1; ignored otherwise).
    pub heads: usize,
    /// Dropout probability on hidden representations, in `[0, 1)`.
    pub dropout: f32,
}

impl ModelConfig {
    /// Checks the fields ([`CpuOpsError::InvalidArgument`] naming the first bad
    /// one): at least one layer, `in_dim` and `num_classes` at least 1, `hidden`
    /// at least 1 with more than one layer, `dropout` in `[0, 1)`, and for GAT at
    /// least one head dividing `hidden`.
    pub fn validate(&self) -> Result<()> {
        let bad =
            |name: &'static str, reason: String| Err(CpuOpsError::InvalidArgument { name, reason });
        if self.num_layers == 0 {
            return bad("num_layers", "a model needs at least 1 layer".into());
        }
        if self.in_dim == 0 {
            return bad("in_dim", "expected at least 1".into());
        }
        if self.num_classes == 0 {
            return bad("num_classes", "expected at least 1".into());
        }
        if self.num_layers > 1 && self.hidden == 0 {
            return bad(
                "hidden",
                "expected at least 1 with more than one layer".into(),
            );
        }
        if !(self.dropout.is_finite() && (0.0..1.0).contains(&self.dropout)) {
            return bad(
                "dropout",
                format!("expected a value in [0, 1), got {}", self.dropout),
            );
        }
        if self.kind == ModelKind::Gat {
            if self.heads == 0 {
                return bad("heads", "GAT needs at least 1 head".into());
            }
            if self.num_layers > 1 && !self.hidden.is_multiple_of(self.heads) {
                return bad(
                    "hidden",
                    format!(
                        "{} is not a multiple of heads = {}",
                        self.hidden, self.heads
                    ),
                );
            }
        }
        Ok(())
    }
}

/// One layer's shape ([`Model::layer_specs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerSpec {
    /// Input width.
    pub d_in: usize,
    /// Output width (GAT's last layer: `num_classes`, after averaging heads).
    pub d_out: usize,
    /// GAT heads (1 otherwise).
    pub heads: usize,
    /// GAT head width `F` (`d_out` otherwise).
    pub head_dim: usize,
    /// Whether this is the top layer (logits, no activation; GAT averages heads).
    pub last: bool,
    /// Index of the layer's first tensor in the parameter list.
    pub first_param: usize,
}

impl LayerSpec {
    /// `heads × head_dim`: the width of a GAT layer's projection (`d_out` otherwise).
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }
}

/// What a layer's forward keeps for its backward.
#[derive(Debug)]
enum LayerState<T> {
    /// GCN: the augmented block (with self-loops); `agg = Â X` when aggregating first
    /// (empty when projecting first).
    Gcn {
        indptr: Vec<u64>,
        indices: Vec<u32>,
        agg: Vec<T>,
    },
    /// SAGE: `agg = A_mean X` when aggregating first (empty when projecting first).
    Sage { agg: Vec<T> },
    /// GAT: the projected sources and the attention kernel's state.
    Gat { z: Vec<T>, attn: GatForward<T> },
}

/// One layer's part of a [`Forward`].
#[derive(Debug)]
struct LayerCache<T> {
    /// The layer input after dropout and its mask, when dropout ran.
    dropped: Option<(Vec<T>, DropoutMask)>,
    state: LayerState<T>,
    /// Hidden layers: the output after the activation (empty for the last layer).
    act: Vec<T>,
}

/// The result of [`Model::forward`]: the logits and what [`Model::backward`] needs.
#[derive(Debug)]
pub struct Forward<T: Real = f32> {
    /// A copy of the model input (`None` after [`Model::forward_lean`]).
    input: Option<Vec<T>>,
    layers: Vec<LayerCache<T>>,
    /// `(num_src, num_dst)` of each block, to check the blocks given to backward.
    shapes: Vec<(usize, usize)>,
    logits: Vec<T>,
}

impl<T: Real> Forward<T> {
    /// The logits, `num_dst(last block) × num_classes`, row-major.
    pub fn logits(&self) -> &[T] {
        &self.logits
    }

    /// Takes the logits, dropping the saved state.
    pub fn into_logits(self) -> Vec<T> {
        self.logits
    }

    /// The output of hidden layer `l` after its activation (before any dropout of
    /// the layer above), `num_dst(block l) × width` row-major, where `width` is
    /// `hidden`; `None` for the last layer (see [`Forward::logits`]) or past it.
    pub fn hidden(&self, l: usize) -> Option<&[T]> {
        if l + 1 < self.layers.len() {
            Some(&self.layers[l].act)
        } else {
            None
        }
    }

    /// The input of layer `l` (after dropout), given the model input `x`.
    fn layer_input<'s>(&'s self, l: usize, x: ModelInput<'s, T>) -> ModelInput<'s, T> {
        match &self.layers[l].dropped {
            Some((h, _)) => ModelInput::Dense(h),
            None if l == 0 => x,
            None => ModelInput::Dense(&self.layers[l - 1].act),
        }
    }
}

/// A GNN model's parameters (see the module doc for the math and parameter order).
#[derive(Clone, Debug)]
pub struct Model<T: Real = f32> {
    cfg: ModelConfig,
    layers: Vec<LayerSpec>,
    params: Vec<Vec<T>>,
    names: Vec<String>,
}

/// An internal invariant broke (a bug, reported instead of a panic).
fn internal(what: &str) -> CpuOpsError {
    CpuOpsError::InvalidArgument {
        name: "model internals",
        reason: what.into(),
    }
}

fn checked_mul(a: usize, b: usize, name: &'static str) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| CpuOpsError::InvalidArgument {
            name,
            reason: format!("{a} × {b} overflows"),
        })
}

impl<T: Real> Model<T> {
    /// Validates `cfg` ([`CpuOpsError::InvalidArgument`] naming the field) and
    /// initializes the parameters as DGL does (Xavier weights, zero biases; see the
    /// module doc), deterministically from `seed`.
    pub fn new(cfg: &ModelConfig, seed: u64) -> Result<Self> {
        cfg.validate()?;
        let n = cfg.num_layers;
        let mut layers = Vec::with_capacity(n);
        let mut params: Vec<Vec<T>> = Vec::new();
        let mut names = Vec::new();
        for l in 0..n {
            let last = l + 1 == n;
            let d_in = if l == 0 { cfg.in_dim } else { cfg.hidden };
            let d_out = if last { cfg.num_classes } else { cfg.hidden };
            let (heads, head_dim) = match cfg.kind {
                ModelKind::Gat if last => (cfg.heads, cfg.num_classes),
                ModelKind::Gat => (cfg.heads, cfg.hidden / cfg.heads),
                ModelKind::Gcn | ModelKind::Sage => (1, d_out),
            };
            let width = checked_mul(heads, head_dim, "heads")?;
            let w_len = checked_mul(d_in, width, "in_dim")?;
            layers.push(LayerSpec {
                d_in,
                d_out,
                heads,
                head_dim,
                last,
                first_param: params.len(),
            });
            let uniform = |gain| Init::XavierUniform {
                gain,
                fan_in: d_in,
                fan_out: d_out,
            };
            let tensors: Vec<(&str, usize, Init)> = match cfg.kind {
                ModelKind::Gcn => vec![
                    ("weight", w_len, uniform(1.0)),
                    ("bias", d_out, Init::Zeros),
                ],
                ModelKind::Sage => vec![
                    ("weight_self", w_len, uniform(RELU_GAIN)),
                    ("weight_neigh", w_len, uniform(RELU_GAIN)),
                    ("bias", d_out, Init::Zeros),
                ],
                ModelKind::Gat => {
                    let attn = Init::XavierNormal {
                        gain: RELU_GAIN,
                        fan_in: width,
                        fan_out: head_dim,
                    };
                    let fc = Init::XavierNormal {
                        gain: RELU_GAIN,
                        fan_in: d_in,
                        fan_out: width,
                    };
                    vec![
                        ("weight", w_len, fc),
                        ("attn_src", width, attn),
                        ("attn_dst", width, attn),
                        ("bias", width, Init::Zeros),
                    ]
                }
            };
            for (name, len, init) in tensors {
                let stream = params.len() as u64;
                params.push(init.fill(len, seed, stream));
                names.push(format!("layer{l}.{name}"));
            }
        }
        Ok(Self {
            cfg: cfg.clone(),
            layers,
            params,
            names,
        })
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The number of scalar parameters.
    pub fn num_params(&self) -> usize {
        self.params.iter().map(Vec::len).sum()
    }

    /// The parameter tensors, in the fixed order of the module doc.
    pub fn params(&self) -> Vec<&[T]> {
        self.params.iter().map(Vec::as_slice).collect()
    }

    /// The parameter tensors, mutable, in the same order as [`Model::params`].
    pub fn params_mut(&mut self) -> Vec<&mut [T]> {
        self.params.iter_mut().map(Vec::as_mut_slice).collect()
    }

    /// The names of the parameter tensors (`"layer0.weight"`, ...), in order.
    pub fn param_names(&self) -> Vec<String> {
        self.names.clone()
    }

    /// Every layer's shape, bottom first (what a device model composes the same
    /// layers from).
    pub fn layer_specs(&self) -> &[LayerSpec] {
        &self.layers
    }

    /// The parameter tensors of layer `l` (a snapshot to publish), in order.
    pub fn layer_params(&self, l: usize) -> Result<&[Vec<T>]> {
        let spec = self
            .layers
            .get(l)
            .ok_or_else(|| CpuOpsError::InvalidArgument {
                name: "layer",
                reason: format!("the model has {} layers", self.layers.len()),
            })?;
        let end = self
            .layers
            .get(l + 1)
            .map_or(self.params.len(), |s| s.first_param);
        Ok(&self.params[spec.first_param..end])
    }

    /// Layer `l` alone over `block` with the given tensors of that layer (e.g. a
    /// snapshot of older weights; same order and lengths as
    /// [`Model::layer_params`]), without dropout; the activation is applied below
    /// the top layer. `x` is `num_src × d_in`; the result `num_dst × d_out`.
    pub fn forward_layer_with(
        &self,
        l: usize,
        params: &[Vec<T>],
        block: &BlockView<'_>,
        x: ModelInput<'_, T>,
    ) -> Result<Vec<T>> {
        let own = self.layer_params(l)?;
        if params.len() != own.len() {
            return Err(CpuOpsError::SizeMismatch {
                what: "tensors of the layer",
                expected: own.len(),
                found: params.len(),
            });
        }
        for (p, o) in params.iter().zip(own) {
            if p.len() != o.len() {
                return Err(CpuOpsError::SizeMismatch {
                    what: "a tensor of the layer",
                    expected: o.len(),
                    found: p.len(),
                });
            }
        }
        let spec = &self.layers[l];
        x.check(block.num_src(), spec.d_in)?;
        let (mut out, _) = match self.cfg.kind {
            ModelKind::Gcn => gcn::forward(spec, params, block, x)?,
            ModelKind::Sage => sage::forward(spec, params, block, x)?,
            ModelKind::Gat => gat::forward(spec, params, block, x)?,
        };
        if !spec.last {
            match self.cfg.kind {
                ModelKind::Gat => elu(&mut out, ELU_ALPHA)?,
                ModelKind::Gcn | ModelKind::Sage => relu(&mut out),
            }
        }
        Ok(out)
    }

    /// Checks that `blocks` fit the model: one per layer, chained
    /// (`num_dst(l) == num_src(l+1)`).
    fn check_blocks(&self, blocks: &[BlockView<'_>]) -> Result<()> {
        if blocks.len() != self.layers.len() {
            return Err(CpuOpsError::SizeMismatch {
                what: "blocks (one per model layer)",
                expected: self.layers.len(),
                found: blocks.len(),
            });
        }
        for pair in blocks.windows(2) {
            if pair[0].num_dst() != pair[1].num_src() {
                return Err(CpuOpsError::SizeMismatch {
                    what: "sources of a block (must equal the destinations of the block below)",
                    expected: pair[0].num_dst(),
                    found: pair[1].num_src(),
                });
            }
        }
        Ok(())
    }

    /// Forward pass over `blocks` (bottom first, one per layer) from `x`
    /// (`num_src(blocks[0]) × in_dim`, row-major). Dropout runs only when `train`,
    /// seeded by `seed` (layer `l` uses `derive_seed(seed, l)`). The result keeps a
    /// copy of `x` and every intermediate [`Model::backward`] needs.
    pub fn forward(
        &self,
        blocks: &[BlockView<'_>],
        x: &[T],
        train: bool,
        seed: u64,
    ) -> Result<Forward<T>> {
        let mut fwd = self.forward_lean(blocks, x, train, seed)?;
        fwd.input = Some(x.to_vec());
        Ok(fwd)
    }

    /// [`Model::forward`] without copying `x` into the result (for a large input
    /// layer); its backward is [`Model::backward_with_input`] with the same `x`.
    pub fn forward_lean(
        &self,
        blocks: &[BlockView<'_>],
        x: &[T],
        train: bool,
        seed: u64,
    ) -> Result<Forward<T>> {
        self.forward_input(blocks, ModelInput::Dense(x), train, seed)
    }

    /// [`Model::forward_lean`] from a dense or sparse input (`num_src(blocks[0])`
    /// rows of `in_dim` columns); keeps no copy of `x`. Its backward is
    /// [`Model::backward_input`] with the same `x`.
    pub fn forward_input(
        &self,
        blocks: &[BlockView<'_>],
        x: ModelInput<'_, T>,
        train: bool,
        seed: u64,
    ) -> Result<Forward<T>> {
        self.check_blocks(blocks)?;
        x.check(blocks[0].num_src(), self.cfg.in_dim)?;
        let p = if train {
            f64::from(self.cfg.dropout)
        } else {
            0.0
        };
        let mut fwd = Forward {
            input: None,
            layers: Vec::with_capacity(self.layers.len()),
            shapes: blocks.iter().map(|b| (b.num_src(), b.num_dst())).collect(),
            logits: Vec::new(),
        };
        for (l, (spec, block)) in self.layers.iter().zip(blocks).enumerate() {
            let dropped = if l > 0 && p > 0.0 {
                let mut h = fwd.layers[l - 1].act.clone();
                let mask = dropout(&mut h, p, derive_seed(seed, l as u64))?;
                Some((h, mask))
            } else {
                None
            };
            let input = match &dropped {
                Some((h, _)) => ModelInput::Dense(h),
                None if l == 0 => x,
                None => ModelInput::Dense(&fwd.layers[l - 1].act),
            };
            let params = &self.params[spec.first_param..];
            let (mut out, state) = match self.cfg.kind {
                ModelKind::Gcn => gcn::forward(spec, params, block, input)?,
                ModelKind::Sage => sage::forward(spec, params, block, input)?,
                ModelKind::Gat => gat::forward(spec, params, block, input)?,
            };
            let act = if spec.last {
                fwd.logits = out;
                Vec::new()
            } else {
                match self.cfg.kind {
                    ModelKind::Gat => elu(&mut out, ELU_ALPHA)?,
                    ModelKind::Gcn | ModelKind::Sage => relu(&mut out),
                }
                out
            };
            fwd.layers.push(LayerCache {
                dropped,
                state,
                act,
            });
        }
        Ok(fwd)
    }

    /// Backward pass: the gradients of every parameter, in [`Model::params`] order,
    /// given `grad_logits = ∂L/∂logits` (`num_dst(last block) × num_classes`) and the
    /// result of [`Model::forward`] on the same `blocks`.
    pub fn backward(
        &self,
        blocks: &[BlockView<'_>],
        fwd: &Forward<T>,
        grad_logits: &[T],
    ) -> Result<Vec<Vec<T>>> {
        let x = fwd
            .input
            .as_deref()
            .ok_or_else(|| CpuOpsError::InvalidArgument {
                name: "fwd",
                reason: "made by forward_lean, which keeps no input: use backward_with_input"
                    .into(),
            })?;
        self.backward_with_input(blocks, x, fwd, grad_logits)
    }

    /// [`Model::backward`] with the model input `x` given again (required after
    /// [`Model::forward_lean`]; `x` must be the input of that forward).
    pub fn backward_with_input(
        &self,
        blocks: &[BlockView<'_>],
        x: &[T],
        fwd: &Forward<T>,
        grad_logits: &[T],
    ) -> Result<Vec<Vec<T>>> {
        self.backward_input(blocks, ModelInput::Dense(x), fwd, grad_logits)
    }

    /// [`Model::backward_with_input`] for a dense or sparse input: `x` must be the
    /// input of the [`Model::forward_input`] that made `fwd` (same variant).
    pub fn backward_input(
        &self,
        blocks: &[BlockView<'_>],
        x: ModelInput<'_, T>,
        fwd: &Forward<T>,
        grad_logits: &[T],
    ) -> Result<Vec<Vec<T>>> {
        self.check_blocks(blocks)?;
        x.check(blocks[0].num_src(), self.cfg.in_dim)?;
        if fwd.layers.len() != self.layers.len() {
            return Err(CpuOpsError::SizeMismatch {
                what: "layers of the forward result",
                expected: self.layers.len(),
                found: fwd.layers.len(),
            });
        }
        for (b, &(num_src, num_dst)) in blocks.iter().zip(&fwd.shapes) {
            for (what, expected, found) in [
                (
                    "block sources (must match the forward pass)",
                    num_src,
                    b.num_src(),
                ),
                (
                    "block destinations (must match the forward pass)",
                    num_dst,
                    b.num_dst(),
                ),
            ] {
                if expected != found {
                    return Err(CpuOpsError::SizeMismatch {
                        what,
                        expected,
                        found,
                    });
                }
            }
        }
        let top = blocks.len() - 1;
        check_matrix(
            "logit gradient (num_dst of the last block × num_classes)",
            grad_logits.len(),
            blocks[top].num_dst(),
            self.cfg.num_classes,
        )?;
        let mut grads: Vec<Vec<T>> = self.params.iter().map(|p| vec![T::ZERO; p.len()]).collect();
        let mut g = grad_logits.to_vec();
        for l in (0..self.layers.len()).rev() {
            let spec = &self.layers[l];
            let cache = &fwd.layers[l];
            if !spec.last {
                match self.cfg.kind {
                    ModelKind::Gat => elu_backward(&cache.act, &mut g, ELU_ALPHA)?,
                    ModelKind::Gcn | ModelKind::Sage => relu_backward(&cache.act, &mut g)?,
                }
            }
            let input = fwd.layer_input(l, x);
            let params = &self.params[spec.first_param..];
            let out_grads = &mut grads[spec.first_param..];
            let need_dx = l > 0;
            let kind_matches = matches!(
                (self.cfg.kind, &cache.state),
                (ModelKind::Gcn, LayerState::Gcn { .. })
                    | (ModelKind::Sage, LayerState::Sage { .. })
                    | (ModelKind::Gat, LayerState::Gat { .. })
            );
            if !kind_matches {
                return Err(CpuOpsError::InvalidArgument {
                    name: "fwd",
                    reason: "forward result of a different model kind".into(),
                });
            }
            let dx = match &cache.state {
                LayerState::Gcn {
                    indptr,
                    indices,
                    agg,
                } => gcn::backward(
                    spec,
                    params,
                    &blocks[l],
                    input,
                    (indptr, indices, agg),
                    &g,
                    out_grads,
                    need_dx,
                )?,
                LayerState::Sage { agg } => {
                    sage::backward(spec, params, &blocks[l], input, agg, &g, out_grads, need_dx)?
                }
                LayerState::Gat { z, attn } => gat::backward(
                    spec, params, &blocks[l], input, z, attn, &g, out_grads, need_dx,
                )?,
            };
            if let Some(mut dx) = dx {
                if let Some((_, mask)) = &cache.dropped {
                    mask.backward(&mut dx)?;
                }
                g = dx;
            }
        }
        Ok(grads)
    }
}
