//! The graph ops a layer emits for export ([`GraphEmitter`]), and the edge-list
//! helpers the layers share.
//!
//! A layer's [`LayerDef::emit`](super::LayerDef::emit) writes the same formulas
//! its forward computes as a dataflow graph of named values (ONNX in `runtime`,
//! which implements this trait over its protobuf builder). Every value is a
//! `String` name; every op returns the name of the value it made. Tensors are
//! row-major `float` unless an op says `int64`.
//!
//! Every aggregation is "gather the source rows of the edges, combine them into
//! their destination rows": [`GraphEmitter::gather_rows`] then
//! [`GraphEmitter::scatter_rows`] into zeros. That needs no sorted edges and no
//! CSR, so one graph runs a sampled block and the whole graph alike.

use crate::backend::Activation;

/// How [`GraphEmitter::scatter_rows`] combines rows landing on the same index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// Sum.
    Add,
    /// Maximum.
    Max,
}

/// A one-input elementwise op ([`GraphEmitter::unary`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unary {
    /// `max(x, 0)`.
    Relu,
    /// `√x`.
    Sqrt,
    /// `1 / x`.
    Reciprocal,
    /// `eˣ`.
    Exp,
}

/// A reduction over one axis ([`GraphEmitter::reduce`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// Sum.
    Sum,
    /// Mean.
    Mean,
}

/// One block as graph values: edge lists of local ids and the destination count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmitBlock {
    /// `int64 [E]`: local source id of each edge.
    pub src: String,
    /// `int64 [E]`: local destination id of each edge.
    pub dst: String,
    /// `int64 [1]`: destinations (the first sources).
    pub num_dst: String,
}

/// The graph ops the layers emit (module doc). Implemented by `runtime`'s ONNX
/// builder; the names in brackets are the ONNX ops.
pub trait GraphEmitter {
    /// `a · b` (`MatMul`).
    fn matmul(&mut self, a: &str, b: &str) -> String;
    /// `a + b`, broadcasting (`Add`).
    fn add(&mut self, a: &str, b: &str) -> String;
    /// `a − b`, broadcasting (`Sub`).
    fn sub(&mut self, a: &str, b: &str) -> String;
    /// `a · b` elementwise, broadcasting (`Mul`).
    fn mul(&mut self, a: &str, b: &str) -> String;
    /// `a / b` elementwise, broadcasting (`Div`).
    fn div(&mut self, a: &str, b: &str) -> String;
    /// Rows `idx` (`int64`) of `data` (`Gather` on axis 0).
    fn gather_rows(&mut self, data: &str, idx: &str) -> String;
    /// `data` with `updates` row `e` combined into row `idx[e]` by `reduction`;
    /// `idx` is `int64 [E, 1]` (`ScatterND`).
    fn scatter_rows(
        &mut self,
        data: &str,
        idx: &str,
        updates: &str,
        reduction: Reduction,
    ) -> String;
    /// `x` with a new axis of size 1 at `axis` (`Unsqueeze`).
    fn unsqueeze(&mut self, x: &str, axis: i64) -> String;
    /// `x` reshaped to `shape` (`0` keeps that input dimension, `-1` infers one;
    /// `Reshape`).
    fn reshape(&mut self, x: &str, shape: &[i64]) -> String;
    /// The row count of `x` as `int64 [1]` (`Shape` of the first axis).
    fn rows_of(&mut self, x: &str) -> String;
    /// The shape of `x` as `int64` (`Shape`): for a vector, its length as `[1]`.
    fn shape_of(&mut self, x: &str) -> String;
    /// A `float` tensor filled with `value`, of shape `rows` (an `int64 [1]`
    /// value) followed by the fixed `tail` dimensions (`ConstantOfShape`).
    fn filled(&mut self, rows: &str, tail: &[i64], value: f32) -> String;
    /// The first `n` rows of `x` (`n`: `int64 [1]`; `Slice`).
    fn first_rows(&mut self, x: &str, n: &str) -> String;
    /// `0, 1, …, n − 1` as `int64` (`n`: `int64 [1]`; `Range`).
    fn arange(&mut self, n: &str) -> String;
    /// `a` and `b` joined along axis 0 (`Concat`).
    fn concat0(&mut self, a: &str, b: &str) -> String;
    /// A one-input elementwise op.
    fn unary(&mut self, op: Unary, x: &str) -> String;
    /// ELU with `alpha` (`Elu`).
    fn elu(&mut self, x: &str, alpha: f32) -> String;
    /// Leaky ReLU with slope `alpha` below 0 (`LeakyRelu`).
    fn leaky_relu(&mut self, x: &str, alpha: f32) -> String;
    /// `max(x, value)` elementwise (`Max` with a scalar constant).
    fn max_scalar(&mut self, x: &str, value: f32) -> String;
    /// `x` reduced over `axis`, which is dropped (`ReduceSum`, `ReduceMean`).
    fn reduce(&mut self, op: Reduce, x: &str, axis: i64) -> String;
    /// A hidden layer's activation of `x` ([`Activation`]).
    fn activation(&mut self, act: Activation, x: &str) -> String {
        match act {
            Activation::Relu => self.unary(Unary::Relu, x),
            Activation::Elu { alpha } => self.elu(x, alpha),
        }
    }
}

/// A block's edges with `dst` as the `[E, 1]` index [`GraphEmitter::scatter_rows`]
/// wants (made once per layer).
pub(crate) struct Edges<'a> {
    pub(crate) block: &'a EmitBlock,
    pub(crate) dst_idx: String,
}

impl<'a> Edges<'a> {
    pub(crate) fn new(g: &mut dyn GraphEmitter, block: &'a EmitBlock) -> Self {
        let dst_idx = g.unsqueeze(&block.dst, 1);
        Self { block, dst_idx }
    }

    /// Number of edges into each destination, as `float [num_dst]`.
    pub(crate) fn in_degree(&self, g: &mut dyn GraphEmitter) -> String {
        let ones = ones_like_edges(g, &self.block.dst);
        let zeros = g.filled(&self.block.num_dst, &[], 0.0);
        g.scatter_rows(&zeros, &self.dst_idx, &ones, Reduction::Add)
    }

    /// `Σ_{e→i} y_{src(e)}` for every destination `i`: `num_dst × width`.
    pub(crate) fn sum(&self, g: &mut dyn GraphEmitter, y: &str, width: usize) -> String {
        let msg = g.gather_rows(y, &self.block.src);
        let zeros = g.filled(&self.block.num_dst, &[width as i64], 0.0);
        g.scatter_rows(&zeros, &self.dst_idx, &msg, Reduction::Add)
    }
}

/// `float` ones, one per edge of `edge_list`.
pub(crate) fn ones_like_edges(g: &mut dyn GraphEmitter, edge_list: &str) -> String {
    let e = g.shape_of(edge_list);
    g.filled(&e, &[], 1.0)
}
