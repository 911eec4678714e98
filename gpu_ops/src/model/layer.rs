//! The layer interface every model kind implements.
//!
//! A layer kind is one type in its own file (`sage.rs`, `gcn.rs`, `gat.rs`)
//! implementing two traits:
//! - [`LayerDef`], backend-free: its shape ([`LayerSpec`]), its parameter tensors
//!   ([`ParamSpec`]: name, shape, initialization), which of them is the bias the
//!   model adds with the activation, the activation, and its graph for export
//!   ([`LayerDef::emit`] over a [`GraphEmitter`]);
//! - [`Layer<B>`] for every backend `B`: forward (returning the state its
//!   backward needs, [`Layer::State`]) and backward (the parameters' gradients,
//!   and the input's gradient when asked), composed from the backend's op
//!   families.
//!
//! `registry.rs` maps a model kind to its layer type (one line per kind) and
//! lays out a model's parameters.

use std::any::Any;

use cpu_ops::{Init, LayerSpec, ModelConfig};

use super::emit::{EmitBlock, GraphEmitter};
use crate::backend::{Activation, Backend, DevMat};
use crate::error::{GpuOpsError, Result};

/// One parameter tensor of a layer, as the layer declares it.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// The name within the layer (`"weight_self"`); the model's name is
    /// `layer{l}.{name}`.
    pub name: &'static str,
    /// The shape, row-major (an exported initializer's dimensions); the tensor
    /// holds the product of these values.
    pub shape: Vec<usize>,
    /// How [`ModelLayout::init_params`](super::ModelLayout::init_params) fills it.
    pub init: Init,
}

/// A backend-free layer: shape, parameters, epilogue and export (module doc).
pub trait LayerDef: Send + Sync {
    /// The layer at `at` of a model configured by `cfg`. `at` carries the
    /// layer's widths, whether it is the top, and where its tensors start, with
    /// `heads = 1` and `head_dim = d_out`; a kind with heads sets its own.
    fn new(cfg: &ModelConfig, at: LayerSpec) -> Self
    where
        Self: Sized;
    /// The layer's shape.
    fn spec(&self) -> &LayerSpec;
    /// Its parameter tensors, in order (checkpoints depend on names and order).
    fn params(&self) -> Vec<ParamSpec>;
    /// The index in [`LayerDef::params`] of the bias that a hidden layer's
    /// epilogue adds together with the activation (and the next layer's
    /// dropout), [`DenseOps::bias_act_dropout`](crate::DenseOps::bias_act_dropout).
    fn bias(&self) -> usize;
    /// The activation below the top layer.
    fn activation(&self) -> Activation;
    /// Emits the layer reading `h` (`num_src × d_in`) over `block`, bias
    /// included, activation not (the exporter adds [`LayerDef::activation`]
    /// below the top, as the model does); returns its output (`num_dst × d_out`).
    /// `params` are the names of the layer's tensors, declared by the caller with
    /// [`ParamSpec::shape`].
    fn emit(
        &self,
        g: &mut dyn GraphEmitter,
        params: &[String],
        h: &str,
        block: &EmitBlock,
    ) -> String;
}

/// A layer's input: dense rows on the device, or sparse rows (layer 0 only).
pub enum LayerInput<'a, B: Backend> {
    /// Row-major `f32` values.
    Dense(&'a B::Buf<f32>),
    /// Sparse rows ([`crate::SparseOps`]).
    Sparse(&'a B::Sparse),
}

impl<B: Backend> Clone for LayerInput<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for LayerInput<'_, B> {}

impl<'a, B: Backend> From<&'a B::Buf<f32>> for LayerInput<'a, B> {
    fn from(x: &'a B::Buf<f32>) -> Self {
        LayerInput::Dense(x)
    }
}

impl<'a, B: Backend> LayerInput<'a, B> {
    /// The dense buffer, or an error naming `what` needs it (sparse input is
    /// read only through projections).
    pub fn dense(self, what: &'static str) -> Result<&'a B::Buf<f32>> {
        match self {
            LayerInput::Dense(x) => Ok(x),
            LayerInput::Sparse(_) => Err(GpuOpsError::InvalidArgument {
                name: "sparse input",
                reason: format!("{what} needs dense rows (sparse rows are layer 0's input only)"),
            }),
        }
    }

    /// Whether this is [`LayerInput::Sparse`].
    pub fn is_sparse(&self) -> bool {
        matches!(self, LayerInput::Sparse(_))
    }

    /// Checks that the input holds at least `rows × cols` (dense) or `rows` rows
    /// of `cols` columns (sparse); `what` names it in the error.
    pub(crate) fn check(
        &self,
        dev: &B,
        what: &'static str,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        match self {
            LayerInput::Dense(x) => {
                let need = rows.saturating_mul(cols);
                if dev.len(*x) < need {
                    return Err(GpuOpsError::SizeMismatch {
                        what,
                        expected: need,
                        found: dev.len(*x),
                    });
                }
            }
            LayerInput::Sparse(x) => {
                let s = dev.sparse_shape(x);
                if s.cols != cols {
                    return Err(GpuOpsError::SizeMismatch {
                        what: "sparse input columns (the layer's input width)",
                        expected: cols,
                        found: s.cols,
                    });
                }
                if s.rows < rows {
                    return Err(GpuOpsError::SizeMismatch {
                        what: "sparse input rows (at least the block's sources)",
                        expected: rows,
                        found: s.rows,
                    });
                }
            }
        }
        Ok(())
    }
}

/// The first `rows` rows of a layer input of `cols` columns: the left operand of
/// the projections `X·W` and `Xᵀ·G`, which run [`DenseOps::matmul`] on dense
/// rows and [`SparseOps::spmm`] / [`SparseOps::spmm_tn`] on sparse rows.
///
/// [`DenseOps::matmul`]: crate::DenseOps::matmul
/// [`SparseOps::spmm`]: crate::SparseOps::spmm
/// [`SparseOps::spmm_tn`]: crate::SparseOps::spmm_tn
pub struct XMat<'a, B: Backend> {
    x: LayerInput<'a, B>,
    rows: usize,
    cols: usize,
}

impl<B: Backend> Clone for XMat<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for XMat<'_, B> {}

impl<'a, B: Backend> XMat<'a, B> {
    /// `x`'s first `rows` rows, `cols` wide.
    pub fn new(x: LayerInput<'a, B>, rows: usize, cols: usize) -> Self {
        Self { x, rows, cols }
    }

    /// `out (+)= X·W` for `w`: `cols × n` (`+=` when `accumulate`).
    pub fn times(
        self,
        dev: &B,
        w: &B::Buf<f32>,
        n: usize,
        out: &mut B::Buf<f32>,
        accumulate: bool,
    ) -> Result<()> {
        match self.x {
            LayerInput::Dense(x) => dev.matmul(
                DevMat::new(x, self.rows, self.cols),
                DevMat::new(w, self.cols, n),
                out,
                accumulate,
            ),
            LayerInput::Sparse(x) => dev.spmm(x, self.rows, w, n, out, accumulate),
        }
    }

    /// `dw (+)= Xᵀ·G` for `g`: `rows × n` (`+=` when `accumulate`).
    pub fn t_times(
        self,
        dev: &B,
        g: &B::Buf<f32>,
        n: usize,
        dw: &mut B::Buf<f32>,
        accumulate: bool,
    ) -> Result<()> {
        match self.x {
            LayerInput::Dense(x) => dev.matmul(
                DevMat::new(x, self.rows, self.cols).t(),
                DevMat::new(g, self.rows, n),
                dw,
                accumulate,
            ),
            LayerInput::Sparse(x) => dev.spmm_tn(x, self.rows, g, n, dw, accumulate),
        }
    }
}

/// What one layer call reads: its tensors, its block and its input.
pub struct LayerCall<'a, B: Backend> {
    /// The layer's tensors, in [`LayerDef::params`] order.
    pub params: &'a [B::Buf<f32>],
    /// The block (`num_src` sources, `num_dst` destinations).
    pub block: &'a B::Block,
    /// The input, `num_src × d_in`.
    pub x: LayerInput<'a, B>,
    /// Sources of the block.
    pub num_src: usize,
    /// Destinations of the block.
    pub num_dst: usize,
}

/// What one layer's backward writes: the parameters' gradients, from the
/// gradient of its output.
pub struct LayerGrad<'a, B: Backend> {
    /// `∂L/∂out` (`num_dst × d_out`), the output before any activation.
    pub g: &'a B::Buf<f32>,
    /// The gradients of the layer's tensors, overwritten, in
    /// [`LayerDef::params`] order.
    pub grads: &'a mut [B::Buf<f32>],
    /// Whether to return `∂L/∂x` (`num_src × d_in`; never for layer 0).
    pub need_dx: bool,
    /// Whether the gradient of the [`LayerDef::bias`] tensor (the column sums
    /// of `g`) is already written: below the top the model computes it with the
    /// activation's backward ([`DenseOps::act_backward_bias_grad`](crate::DenseOps::act_backward_bias_grad)),
    /// and the layer leaves it.
    pub bias_done: bool,
}

/// A layer's math on backend `B` (module doc).
pub trait Layer<B: Backend>: LayerDef {
    /// What the forward keeps for the backward.
    type State: Send + Sync + 'static;
    /// The layer over `call`: `num_dst × d_out` values, with the bias added only
    /// when `with_bias` (below the top, the model adds it with the activation).
    fn forward(
        &self,
        dev: &B,
        call: &LayerCall<'_, B>,
        with_bias: bool,
    ) -> Result<(B::Buf<f32>, Self::State)>;
    /// Writes the gradients of the layer's tensors into `grad.grads` and returns
    /// `∂L/∂x` when `grad.need_dx`, given the same `call` as the forward and its
    /// state.
    fn backward(
        &self,
        dev: &B,
        call: &LayerCall<'_, B>,
        state: &Self::State,
        grad: LayerGrad<'_, B>,
    ) -> Result<Option<B::Buf<f32>>>;
}

/// A layer's saved state, type-erased (each layer downcasts its own).
pub(crate) type State = Box<dyn Any + Send + Sync>;

/// [`Layer`] with its state erased, so that a model holds its layers as trait
/// objects. Implemented for every [`Layer`].
pub(crate) trait DynLayer<B: Backend>: LayerDef {
    /// [`Layer::forward`].
    fn forward_dyn(
        &self,
        dev: &B,
        call: &LayerCall<'_, B>,
        with_bias: bool,
    ) -> Result<(B::Buf<f32>, State)>;
    /// [`Layer::backward`] from a state made by [`DynLayer::forward_dyn`].
    fn backward_dyn(
        &self,
        dev: &B,
        call: &LayerCall<'_, B>,
        state: &State,
        grad: LayerGrad<'_, B>,
    ) -> Result<Option<B::Buf<f32>>>;
}

impl<B: Backend, L: Layer<B>> DynLayer<B> for L {
    fn forward_dyn(
        &self,
        dev: &B,
        call: &LayerCall<'_, B>,
        with_bias: bool,
    ) -> Result<(B::Buf<f32>, State)> {
        let (out, state) = self.forward(dev, call, with_bias)?;
        Ok((out, Box::new(state)))
    }

    fn backward_dyn(
        &self,
        dev: &B,
        call: &LayerCall<'_, B>,
        state: &State,
        grad: LayerGrad<'_, B>,
    ) -> Result<Option<B::Buf<f32>>> {
        let state = state
            .downcast_ref::<L::State>()
            .ok_or_else(|| internal("a layer's state came from another layer kind"))?;
        self.backward(dev, call, state, grad)
    }
}

/// An internal invariant broke (a bug, reported instead of a panic).
pub(crate) fn internal(what: &str) -> GpuOpsError {
    GpuOpsError::InvalidArgument {
        name: "device model internals",
        reason: what.into(),
    }
}

/// One parameter tensor of a model ([`ModelLayout::params`](super::ModelLayout::params)).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelParam {
    /// `layer{l}.{name}`.
    pub name: String,
    /// The shape ([`ParamSpec::shape`]).
    pub shape: Vec<usize>,
    /// Values: the product of the shape.
    pub len: usize,
    /// How it is initialized.
    pub init: Init,
}
