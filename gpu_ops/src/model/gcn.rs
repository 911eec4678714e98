//! GCN (`dgl.nn.GraphConv(norm="both")` on a graph with self-loops), ReLU between
//! layers. Parameters: `weight` (`d_in × d_out`, Xavier-uniform, gain 1), `bias`
//! (`d_out`, zeros).
//!
//! Blocks have no self-loops, so each call builds the *augmented block*
//! ([`Sampling::add_self_loops`](crate::Sampling::add_self_loops)): destination
//! `i` reads `N(i)` then itself. With `d̃_in(i) = |N(i)| + 1` and `d̃_out(j)` the
//! augmented edges reading source `j` (clamped to 1):
//! - forward: `out_i = Σ_{j∈N(i)∪{i}} x_j·W / √(d̃_out(j)·d̃_in(i)) + b`, i.e.
//!   `Â X W + b` with `Â` the `GcnNorm` aggregation; `(Â X)·W` when
//!   `d_in ≤ d_out`, else `Â (X·W)` (always for a sparse input).
//! - backward: `∂b = Σ_i G_i`, `∂W = Xᵀ (Âᵀ G)` (or `(Â X)ᵀ G`), `∂X = Âᵀ G Wᵀ`.

use cpu_ops::{AggregateKind, Init, LayerSpec, ModelConfig};

use super::emit::{Edges, EmitBlock, GraphEmitter, Reduction, Unary};
use super::layer::{internal, Layer, LayerCall, LayerDef, LayerGrad, LayerInput, ParamSpec, XMat};
use crate::backend::{Activation, Backend, DevMat};
use crate::error::Result;

const NORM: AggregateKind = AggregateKind::GcnNorm;

/// A GCN layer (module doc).
pub(crate) struct Gcn {
    spec: LayerSpec,
}

/// What the forward keeps: the augmented block, and `Â X` when it aggregated
/// first.
pub(crate) struct GcnState<B: Backend> {
    aug: B::Block,
    agg: Option<B::Buf<f32>>,
}

impl LayerDef for Gcn {
    fn new(_cfg: &ModelConfig, at: LayerSpec) -> Self {
        Self { spec: at }
    }

    fn spec(&self) -> &LayerSpec {
        &self.spec
    }

    fn params(&self) -> Vec<ParamSpec> {
        let (d_in, d_out) = (self.spec.d_in, self.spec.d_out);
        vec![
            ParamSpec {
                name: "weight",
                shape: vec![d_in, d_out],
                init: Init::XavierUniform {
                    gain: 1.0,
                    fan_in: d_in,
                    fan_out: d_out,
                },
            },
            ParamSpec {
                name: "bias",
                shape: vec![d_out],
                init: Init::Zeros,
            },
        ]
    }

    fn bias(&self) -> usize {
        1
    }

    fn activation(&self) -> Activation {
        Activation::Relu
    }

    /// `Â_ij = 1/√(d̃_out(j)·d̃_in(i))` per augmented edge, as scatter-adds of
    /// ones over the edge lists.
    fn emit(
        &self,
        g: &mut dyn GraphEmitter,
        params: &[String],
        h: &str,
        block: &EmitBlock,
    ) -> String {
        let (d_in, d_out) = (self.spec.d_in, self.spec.d_out);
        let (w, bias) = (&params[0], &params[1]);
        // The augmented edge list: the block's edges, then a self-loop per
        // destination.
        let loops = g.arange(&block.num_dst);
        let aug = EmitBlock {
            src: g.concat0(&block.src, &loops),
            dst: g.concat0(&block.dst, &loops),
            num_dst: block.num_dst.clone(),
        };
        let e = Edges::new(g, &aug);
        // d̃_out over all sources (clamped to 1 for sources no edge reads).
        let num_src = g.rows_of(h);
        let ones = super::emit::ones_like_edges(g, &aug.src);
        let zeros = g.filled(&num_src, &[], 0.0);
        let src_idx = g.unsqueeze(&aug.src, 1);
        let d_out_deg = g.scatter_rows(&zeros, &src_idx, &ones, Reduction::Add);
        let d_out_deg = g.max_scalar(&d_out_deg, 1.0);
        let src_w = g.unary(Unary::Sqrt, &d_out_deg);
        let src_w = g.unary(Unary::Reciprocal, &src_w);
        let src_w = g.unsqueeze(&src_w, 1);
        // d̃_in ≥ 1 always (the self-loop).
        let d_in_deg = e.in_degree(g);
        let dst_w = g.unary(Unary::Sqrt, &d_in_deg);
        let dst_w = g.unary(Unary::Reciprocal, &dst_w);
        let dst_w = g.unsqueeze(&dst_w, 1);
        let norm_agg = |g: &mut dyn GraphEmitter, y: &str, width: usize| {
            let scaled = g.mul(y, &src_w);
            let s = e.sum(g, &scaled, width);
            g.mul(&s, &dst_w)
        };
        let out = if d_in > d_out {
            let p = g.matmul(h, w);
            norm_agg(g, &p, d_out)
        } else {
            let a = norm_agg(g, h, d_in);
            g.matmul(&a, w)
        };
        g.add(&out, bias)
    }
}

impl<B: Backend> Layer<B> for Gcn {
    type State = GcnState<B>;

    fn forward(
        &self,
        dev: &B,
        call: &LayerCall<'_, B>,
        with_bias: bool,
    ) -> Result<(B::Buf<f32>, GcnState<B>)> {
        let [w, bias, ..] = call.params else {
            return Err(internal("a GCN layer has two tensors"));
        };
        let (d_in, d_out) = (self.spec.d_in, self.spec.d_out);
        let (ns, nd) = (call.num_src, call.num_dst);
        let aug = dev.add_self_loops(call.block)?;
        let mut out = dev.alloc_uninit(nd * d_out)?;
        let mut agg_kept = None;
        match call.x {
            LayerInput::Dense(x) if d_in <= d_out => {
                let mut agg = dev.alloc_uninit(nd * d_in)?;
                dev.aggregate_forward(&aug, NORM, x, d_in, &mut agg)?;
                dev.matmul(
                    DevMat::new(&agg, nd, d_in),
                    DevMat::new(w, d_in, d_out),
                    &mut out,
                    false,
                )?;
                agg_kept = Some(agg);
            }
            x => {
                let mut proj = dev.alloc_uninit(ns * d_out)?;
                XMat::new(x, ns, d_in).times(dev, w, d_out, &mut proj, false)?;
                dev.aggregate_forward(&aug, NORM, &proj, d_out, &mut out)?;
            }
        }
        if with_bias {
            dev.add_bias(&mut out, nd, d_out, bias)?;
        }
        Ok((out, GcnState { aug, agg: agg_kept }))
    }

    fn backward(
        &self,
        dev: &B,
        call: &LayerCall<'_, B>,
        state: &GcnState<B>,
        grad: LayerGrad<'_, B>,
    ) -> Result<Option<B::Buf<f32>>> {
        let [w, ..] = call.params else {
            return Err(internal("a GCN layer has two tensors"));
        };
        let [dw, db, ..] = grad.grads else {
            return Err(internal("a GCN layer has two gradients"));
        };
        let (d_in, d_out) = (self.spec.d_in, self.spec.d_out);
        let (ns, nd, g) = (call.num_src, call.num_dst, grad.g);
        if !grad.bias_done {
            dev.bias_grad(g, nd, d_out, db, false)?;
        }
        match &state.agg {
            None => {
                let mut dp = dev.alloc_uninit(ns * d_out)?;
                dev.aggregate_backward(&state.aug, NORM, g, d_out, &mut dp)?;
                XMat::new(call.x, ns, d_in).t_times(dev, &dp, d_out, dw, false)?;
                if !grad.need_dx {
                    return Ok(None);
                }
                let mut d = dev.alloc_uninit(ns * d_in)?;
                dev.matmul(
                    DevMat::new(&dp, ns, d_out),
                    DevMat::new(w, d_in, d_out).t(),
                    &mut d,
                    false,
                )?;
                Ok(Some(d))
            }
            Some(agg) => {
                dev.matmul(
                    DevMat::new(agg, nd, d_in).t(),
                    DevMat::new(g, nd, d_out),
                    dw,
                    false,
                )?;
                if !grad.need_dx {
                    return Ok(None);
                }
                let mut dm = dev.alloc_uninit(nd * d_in)?;
                dev.matmul(
                    DevMat::new(g, nd, d_out),
                    DevMat::new(w, d_in, d_out).t(),
                    &mut dm,
                    false,
                )?;
                let mut d = dev.alloc_uninit(ns * d_in)?;
                dev.aggregate_backward(&state.aug, NORM, &dm, d_in, &mut d)?;
                Ok(Some(d))
            }
        }
    }
}
