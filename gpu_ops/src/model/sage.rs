//! GraphSAGE-mean (`dgl.nn.SAGEConv(aggregator_type="mean")`), ReLU between
//! layers. Parameters: `weight_self`, `weight_neigh` (`d_in × d_out`, Xavier-
//! uniform with ReLU's gain), `bias` (`d_out`, zeros).
//!
//! - forward: `out = X_dst·W_self + A_mean(X)·W_neigh + b` (`X_dst`: the first
//!   `num_dst` rows; an isolated destination's mean is 0), aggregating first
//!   (`(A X)·W`) when `d_in ≤ d_out`, else projecting first (`A (X·W)`, DGL's
//!   `lin_before_mp`); a sparse input always projects first.
//! - backward: `∂b = Σ_i G_i`, `∂W_self = X_dstᵀ G`, `∂W_neigh = Xᵀ (Aᵀ G)` (or
//!   `(A X)ᵀ G`), `∂X = Aᵀ (G W_neighᵀ)` plus `G W_selfᵀ` on the first `num_dst`
//!   rows.

use cpu_ops::{AggregateKind, Init, LayerSpec, ModelConfig, RELU_GAIN};

use super::emit::{Edges, EmitBlock, GraphEmitter, Unary};
use super::layer::{internal, Layer, LayerCall, LayerDef, LayerGrad, LayerInput, ParamSpec, XMat};
use crate::backend::{Activation, Backend, DevMat};
use crate::error::Result;

const MEAN: AggregateKind = AggregateKind::Mean;

/// A GraphSAGE-mean layer (module doc).
pub(crate) struct Sage {
    spec: LayerSpec,
}

/// What the forward keeps: `A X` when it aggregated first.
pub(crate) struct SageState<B: Backend> {
    agg: Option<B::Buf<f32>>,
}

impl LayerDef for Sage {
    fn new(_cfg: &ModelConfig, at: LayerSpec) -> Self {
        Self { spec: at }
    }

    fn spec(&self) -> &LayerSpec {
        &self.spec
    }

    fn params(&self) -> Vec<ParamSpec> {
        let (d_in, d_out) = (self.spec.d_in, self.spec.d_out);
        let w = Init::XavierUniform {
            gain: RELU_GAIN,
            fan_in: d_in,
            fan_out: d_out,
        };
        vec![
            ParamSpec {
                name: "weight_self",
                shape: vec![d_in, d_out],
                init: w,
            },
            ParamSpec {
                name: "weight_neigh",
                shape: vec![d_in, d_out],
                init: w,
            },
            ParamSpec {
                name: "bias",
                shape: vec![d_out],
                init: Init::Zeros,
            },
        ]
    }

    fn bias(&self) -> usize {
        2
    }

    fn activation(&self) -> Activation {
        Activation::Relu
    }

    fn emit(
        &self,
        g: &mut dyn GraphEmitter,
        params: &[String],
        h: &str,
        block: &EmitBlock,
    ) -> String {
        let (d_in, d_out) = (self.spec.d_in, self.spec.d_out);
        let (w_self, w_neigh, bias) = (&params[0], &params[1], &params[2]);
        let e = Edges::new(g, block);
        let deg = e.in_degree(g);
        let clamped = g.max_scalar(&deg, 1.0);
        let inv = g.unary(Unary::Reciprocal, &clamped);
        let inv = g.unsqueeze(&inv, 1);
        let neigh = if d_in > d_out {
            let p = g.matmul(h, w_neigh);
            let s = e.sum(g, &p, d_out);
            g.mul(&s, &inv)
        } else {
            let s = e.sum(g, h, d_in);
            let m = g.mul(&s, &inv);
            g.matmul(&m, w_neigh)
        };
        let x_dst = g.first_rows(h, &block.num_dst);
        let own = g.matmul(&x_dst, w_self);
        let out = g.add(&neigh, &own);
        g.add(&out, bias)
    }
}

impl<B: Backend> Layer<B> for Sage {
    type State = SageState<B>;

    fn forward(
        &self,
        dev: &B,
        call: &LayerCall<'_, B>,
        with_bias: bool,
    ) -> Result<(B::Buf<f32>, SageState<B>)> {
        let [w_self, w_neigh, bias, ..] = call.params else {
            return Err(internal("a SAGE layer has three tensors"));
        };
        let (d_in, d_out) = (self.spec.d_in, self.spec.d_out);
        let (ns, nd) = (call.num_src, call.num_dst);
        let mut out = dev.alloc_uninit(nd * d_out)?;
        let mut state = SageState { agg: None };
        match call.x {
            LayerInput::Dense(x) if d_in <= d_out => {
                let mut agg = dev.alloc_uninit(nd * d_in)?;
                dev.aggregate_forward(call.block, MEAN, x, d_in, &mut agg)?;
                dev.matmul(
                    DevMat::new(&agg, nd, d_in),
                    DevMat::new(w_neigh, d_in, d_out),
                    &mut out,
                    false,
                )?;
                state.agg = Some(agg);
            }
            x => {
                let mut proj = dev.alloc_uninit(ns * d_out)?;
                XMat::new(x, ns, d_in).times(dev, w_neigh, d_out, &mut proj, false)?;
                dev.aggregate_forward(call.block, MEAN, &proj, d_out, &mut out)?;
            }
        }
        XMat::new(call.x, nd, d_in).times(dev, w_self, d_out, &mut out, true)?;
        if with_bias {
            dev.add_bias(&mut out, nd, d_out, bias)?;
        }
        Ok((out, state))
    }

    fn backward(
        &self,
        dev: &B,
        call: &LayerCall<'_, B>,
        state: &SageState<B>,
        grad: LayerGrad<'_, B>,
    ) -> Result<Option<B::Buf<f32>>> {
        let [w_self, w_neigh, ..] = call.params else {
            return Err(internal("a SAGE layer has three tensors"));
        };
        let [dw_self, dw_neigh, db, ..] = grad.grads else {
            return Err(internal("a SAGE layer has three gradients"));
        };
        let (d_in, d_out) = (self.spec.d_in, self.spec.d_out);
        let (ns, nd, g) = (call.num_src, call.num_dst, grad.g);
        if !grad.bias_done {
            dev.bias_grad(g, nd, d_out, db, false)?;
        }
        XMat::new(call.x, nd, d_in).t_times(dev, g, d_out, dw_self, false)?;
        let mut dx = None;
        match &state.agg {
            None => {
                let mut dp = dev.alloc_uninit(ns * d_out)?;
                dev.aggregate_backward(call.block, MEAN, g, d_out, &mut dp)?;
                XMat::new(call.x, ns, d_in).t_times(dev, &dp, d_out, dw_neigh, false)?;
                if grad.need_dx {
                    let mut d = dev.alloc_uninit(ns * d_in)?;
                    dev.matmul(
                        DevMat::new(&dp, ns, d_out),
                        DevMat::new(w_neigh, d_in, d_out).t(),
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
                    dw_neigh,
                    false,
                )?;
                if grad.need_dx {
                    let mut dm = dev.alloc_uninit(nd * d_in)?;
                    dev.matmul(
                        DevMat::new(g, nd, d_out),
                        DevMat::new(w_neigh, d_in, d_out).t(),
                        &mut dm,
                        false,
                    )?;
                    let mut d = dev.alloc_uninit(ns * d_in)?;
                    dev.aggregate_backward(call.block, MEAN, &dm, d_in, &mut d)?;
                    dx = Some(d);
                }
            }
        }
        if let Some(d) = dx.as_mut() {
            dev.matmul(
                DevMat::new(g, nd, d_out),
                DevMat::new(w_self, d_in, d_out).t(),
                d,
                true,
            )?;
        }
        Ok(dx)
    }
}
