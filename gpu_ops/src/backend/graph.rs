//! [`GraphOps`]: aggregation and GAT attention over a block, and the GAT
//! inputs, saved state and gradients on a device.

use cpu_ops::AggregateKind;

use super::core::DeviceCore;
use crate::error::Result;

/// The inputs of a GAT attention layer on one block, on a device: `heads` heads
/// of width `head_dim` and the buffers they are read from
/// ([`cpu_ops::GatInputs`]' shapes, as prefixes of the buffers). What
/// [`GraphOps::gat_forward`] and [`GraphOps::gat_backward`] read.
pub struct GatInputsDev<'a, B: DeviceCore> {
    /// Number of heads `H` (at least 1).
    pub heads: usize,
    /// Width `F` of each head (at least 1).
    pub head_dim: usize,
    /// Projected source features, `num_src × H·F`, row-major.
    pub z_src: &'a B::Buf<f32>,
    /// Source attention vectors, `H × F`.
    pub a_src: &'a B::Buf<f32>,
    /// Destination attention vectors, `H × F`.
    pub a_dst: &'a B::Buf<f32>,
}

/// Saved state of [`GraphOps::gat_forward`], consumed by [`GraphOps::gat_backward`].
pub struct GatSaved<B: DeviceCore> {
    /// Attention output, `num_dst × heads·head_dim`.
    pub out: B::Buf<f32>,
    /// Per-edge, per-head attention weights, `num_edges × heads`.
    pub alpha: B::Buf<f32>,
    /// Source scores `a_src · z_j`, `num_src × heads`.
    pub el: B::Buf<f32>,
    /// Destination scores `a_dst · z_i`, `num_dst × heads`.
    pub er: B::Buf<f32>,
}

/// Gradients of [`GraphOps::gat_backward`].
pub struct GatGradsDev<B: DeviceCore> {
    /// `∂L/∂z_src`, `num_src × heads·head_dim`.
    pub z_src: B::Buf<f32>,
    /// `∂L/∂a_src`, `heads × head_dim`.
    pub a_src: B::Buf<f32>,
    /// `∂L/∂a_dst`, `heads × head_dim`.
    pub a_dst: B::Buf<f32>,
}

/// Graph math over a block: aggregation and GAT attention, forward and backward.
pub trait GraphOps: DeviceCore {
    /// `out = A x` over `block` (`x` is `num_src × dim`, `out` `num_dst × dim`),
    /// [`cpu_ops::aggregate_forward`]'s semantics.
    fn aggregate_forward(
        &self,
        block: &Self::Block,
        kind: AggregateKind,
        x: &Self::Buf<f32>,
        dim: usize,
        out: &mut Self::Buf<f32>,
    ) -> Result<()>;
    /// `grad_x = Aᵀ grad_out` (all `num_src` rows overwritten).
    fn aggregate_backward(
        &self,
        block: &Self::Block,
        kind: AggregateKind,
        grad_out: &Self::Buf<f32>,
        dim: usize,
        grad_x: &mut Self::Buf<f32>,
    ) -> Result<()>;
    /// GAT edge attention over `block` ([`cpu_ops::gat_forward`]'s semantics).
    fn gat_forward(
        &self,
        block: &Self::Block,
        inp: &GatInputsDev<'_, Self>,
    ) -> Result<GatSaved<Self>>;
    /// GAT attention backward from `grad_out` (`num_dst × heads·head_dim`), with
    /// the inputs and saved state of the forward ([`cpu_ops::gat_backward`]'s
    /// semantics).
    fn gat_backward(
        &self,
        block: &Self::Block,
        inp: &GatInputsDev<'_, Self>,
        saved: &GatSaved<Self>,
        grad_out: &Self::Buf<f32>,
    ) -> Result<GatGradsDev<Self>>;
}
