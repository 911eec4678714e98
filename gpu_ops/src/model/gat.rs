//! GAT (`dgl.nn.GATConv`, no feature or attention dropout, no residual), ELU
//! (`α = 1`) between layers. `H` heads of width `F`: hidden layers have
//! `F = hidden / H` and concatenate heads; the top has `F = num_classes` and
//! averages them. Parameters: `weight` (`d_in × H·F`), `attn_src`, `attn_dst`
//! (`H × F`), all Xavier-normal with ReLU's gain (PyTorch's fans of a `(1, H, F)`
//! tensor for the attention vectors), and `bias` (`H·F`, zeros).
//!
//! - forward: `z = X·W` (all sources), `o = gat(block, z, a_src, a_dst)` (per-head
//!   edge softmax of `LeakyReLU_{0.2}(a_src·z_j + a_dst·z_i)`,
//!   [`GraphOps::gat_forward`](crate::GraphOps::gat_forward)), `out = o + b`; the
//!   top averages heads with one GEMM against the constant `H·F × F` matrix `S`
//!   (`S[h·F+f, f] = 1/H`, made on the device at first use).
//! - backward: the top's `∂o = G·Sᵀ` (hidden: `∂o = G`); `∂b = Σ_i ∂o_i`;
//!   `(∂z, ∂a_src, ∂a_dst) = gat_backward(∂o)`; `∂W = Xᵀ ∂z`; `∂X = ∂z Wᵀ`.

use std::sync::OnceLock;

use cpu_ops::{Init, LayerSpec, ModelConfig, GAT_NEGATIVE_SLOPE, RELU_GAIN};

use super::emit::{Edges, EmitBlock, GraphEmitter, Reduce, Reduction, Unary};
use super::layer::{internal, Layer, LayerCall, LayerDef, LayerGrad, ParamSpec, XMat};
use crate::backend::{Activation, Backend, DevMat, GatInputsDev, GatSaved};
use crate::error::Result;

/// ELU's `α` between GAT layers (PyTorch's `F.elu` default, as DGL's example).
const ELU_ALPHA: f32 = 1.0;

/// A GAT layer (module doc).
pub(crate) struct Gat<B: Backend> {
    spec: LayerSpec,
    /// The top layer's head-averaging matrix `S`, made at first use.
    head_mean: OnceLock<B::Buf<f32>>,
}

/// What the forward keeps: the projected sources and the attention state.
pub(crate) struct GatState<B: Backend> {
    z: B::Buf<f32>,
    saved: GatSaved<B>,
}

impl<B: Backend> Gat<B> {
    /// `S` (`H·F × F`, `S[h·F+f, f] = 1/H`) on `dev`.
    fn head_mean(&self, dev: &B) -> Result<&B::Buf<f32>> {
        if let Some(s) = self.head_mean.get() {
            return Ok(s);
        }
        let (h, f) = (self.spec.heads, self.spec.head_dim);
        let mut s = vec![0f32; h * f * f];
        for hh in 0..h {
            for ff in 0..f {
                s[(hh * f + ff) * f + ff] = 1.0 / h as f32;
            }
        }
        let buf = dev.to_device(&s)?;
        Ok(self.head_mean.get_or_init(|| buf))
    }

    /// The attention's inputs: this layer's heads over the projected sources `z`.
    fn attention_inputs<'a>(
        &self,
        z: &'a B::Buf<f32>,
        a_src: &'a B::Buf<f32>,
        a_dst: &'a B::Buf<f32>,
    ) -> GatInputsDev<'a, B> {
        GatInputsDev {
            heads: self.spec.heads,
            head_dim: self.spec.head_dim,
            z_src: z,
            a_src,
            a_dst,
        }
    }
}

impl<B: Backend> LayerDef for Gat<B> {
    fn new(cfg: &ModelConfig, at: LayerSpec) -> Self {
        let head_dim = if at.last {
            cfg.num_classes
        } else {
            // `ModelConfig::validate`: at least one head, dividing `hidden`.
            cfg.hidden / cfg.heads.max(1)
        };
        Self {
            spec: LayerSpec {
                heads: cfg.heads,
                head_dim,
                ..at
            },
            head_mean: OnceLock::new(),
        }
    }

    fn spec(&self) -> &LayerSpec {
        &self.spec
    }

    fn params(&self) -> Vec<ParamSpec> {
        let (h, f) = (self.spec.heads, self.spec.head_dim);
        let width = h * f;
        let attn = Init::XavierNormal {
            gain: RELU_GAIN,
            fan_in: width,
            fan_out: f,
        };
        vec![
            ParamSpec {
                name: "weight",
                shape: vec![self.spec.d_in, width],
                init: Init::XavierNormal {
                    gain: RELU_GAIN,
                    fan_in: self.spec.d_in,
                    fan_out: width,
                },
            },
            ParamSpec {
                name: "attn_src",
                shape: vec![h, f],
                init: attn,
            },
            ParamSpec {
                name: "attn_dst",
                shape: vec![h, f],
                init: attn,
            },
            ParamSpec {
                name: "bias",
                // Per head at the top, where heads are averaged after the bias.
                shape: if self.spec.last {
                    vec![h, f]
                } else {
                    vec![width]
                },
                init: Init::Zeros,
            },
        ]
    }

    fn bias(&self) -> usize {
        3
    }

    fn activation(&self) -> Activation {
        Activation::Elu { alpha: ELU_ALPHA }
    }

    /// Per head, edge scores `LeakyReLU_{0.2}(a_src·z_j + a_dst·z_i)`, softmax
    /// over each destination's in-edges (minus the per-destination maximum, by
    /// scatter-max), `o_i = Σ α z_j`; `o + b`, heads concatenated (hidden) or
    /// averaged (top). A destination without edges gets `b` (its `o` is 0).
    fn emit(
        &self,
        g: &mut dyn GraphEmitter,
        params: &[String],
        h: &str,
        block: &EmitBlock,
    ) -> String {
        let (heads, f) = (self.spec.heads, self.spec.head_dim);
        let width = heads * f;
        let (w, a_src, a_dst, bias) = (&params[0], &params[1], &params[2], &params[3]);
        let e = Edges::new(g, block);
        let z = g.matmul(h, w);
        let z3 = g.reshape(&z, &[0, heads as i64, f as i64]);
        let score = |g: &mut dyn GraphEmitter, a: &str| {
            let p = g.mul(&z3, a);
            g.reduce(Reduce::Sum, &p, 2)
        };
        let el = score(g, a_src);
        let er = score(g, a_dst);
        let el_e = g.gather_rows(&el, &block.src);
        let er_e = g.gather_rows(&er, &block.dst);
        let u = g.add(&el_e, &er_e);
        let s = g.leaky_relu(&u, GAT_NEGATIVE_SLOPE as f32);
        let lowest = g.filled(&block.num_dst, &[heads as i64], f32::NEG_INFINITY);
        let m = g.scatter_rows(&lowest, &e.dst_idx, &s, Reduction::Max);
        let m_e = g.gather_rows(&m, &block.dst);
        let shifted = g.sub(&s, &m_e);
        let p = g.unary(Unary::Exp, &shifted);
        let zeros = g.filled(&block.num_dst, &[heads as i64], 0.0);
        let den = g.scatter_rows(&zeros, &e.dst_idx, &p, Reduction::Add);
        let den_e = g.gather_rows(&den, &block.dst);
        let alpha = g.div(&p, &den_e);
        let alpha = g.unsqueeze(&alpha, 2);
        let z_e = g.gather_rows(&z3, &block.src);
        let msg = g.mul(&z_e, &alpha);
        let zeros = g.filled(&block.num_dst, &[heads as i64, f as i64], 0.0);
        let o = g.scatter_rows(&zeros, &e.dst_idx, &msg, Reduction::Add);
        if self.spec.last {
            let ob = g.add(&o, bias);
            g.reduce(Reduce::Mean, &ob, 1)
        } else {
            let o = g.reshape(&o, &[0, width as i64]);
            g.add(&o, bias)
        }
    }
}

impl<B: Backend> Layer<B> for Gat<B> {
    type State = GatState<B>;

    fn forward(
        &self,
        dev: &B,
        call: &LayerCall<'_, B>,
        with_bias: bool,
    ) -> Result<(B::Buf<f32>, GatState<B>)> {
        let [w, a_src, a_dst, bias, ..] = call.params else {
            return Err(internal("a GAT layer has four tensors"));
        };
        let spec = &self.spec;
        let (ns, nd) = (call.num_src, call.num_dst);
        let width = spec.width();
        let mut z = dev.alloc_uninit(ns * width)?;
        XMat::new(call.x, ns, spec.d_in).times(dev, w, width, &mut z, false)?;
        let saved = dev.gat_forward(call.block, &self.attention_inputs(&z, a_src, a_dst))?;
        let mut o = dev.alloc_uninit(nd * width)?;
        dev.copy(&saved.out, &mut o, nd * width)?;
        if with_bias {
            dev.add_bias(&mut o, nd, width, bias)?;
        }
        let out = if spec.last {
            let s = self.head_mean(dev)?;
            let mut out = dev.alloc_uninit(nd * spec.d_out)?;
            dev.matmul(
                DevMat::new(&o, nd, width),
                DevMat::new(s, width, spec.d_out),
                &mut out,
                false,
            )?;
            out
        } else {
            o
        };
        Ok((out, GatState { z, saved }))
    }

    fn backward(
        &self,
        dev: &B,
        call: &LayerCall<'_, B>,
        state: &GatState<B>,
        grad: LayerGrad<'_, B>,
    ) -> Result<Option<B::Buf<f32>>> {
        let [w, a_src, a_dst, ..] = call.params else {
            return Err(internal("a GAT layer has four tensors"));
        };
        let [dw, da_src, da_dst, db, ..] = grad.grads else {
            return Err(internal("a GAT layer has four gradients"));
        };
        let spec = &self.spec;
        let (ns, nd, g) = (call.num_src, call.num_dst, grad.g);
        let width = spec.width();
        let spread;
        let d_o = if spec.last {
            let s = self.head_mean(dev)?;
            let mut d = dev.alloc_uninit(nd * width)?;
            dev.matmul(
                DevMat::new(g, nd, spec.d_out),
                DevMat::new(s, width, spec.d_out).t(),
                &mut d,
                false,
            )?;
            spread = d;
            &spread
        } else {
            g
        };
        if !grad.bias_done {
            dev.bias_grad(d_o, nd, width, db, false)?;
        }
        let inp = self.attention_inputs(&state.z, a_src, a_dst);
        let gg = dev.gat_backward(call.block, &inp, &state.saved, d_o)?;
        dev.copy(&gg.a_src, da_src, width)?;
        dev.copy(&gg.a_dst, da_dst, width)?;
        XMat::new(call.x, ns, spec.d_in).t_times(dev, &gg.z_src, width, dw, false)?;
        if !grad.need_dx {
            return Ok(None);
        }
        let mut dx = dev.alloc_uninit(ns * spec.d_in)?;
        dev.matmul(
            DevMat::new(&gg.z_src, ns, width),
            DevMat::new(w, spec.d_in, width).t(),
            &mut dx,
            false,
        )?;
        Ok(Some(dx))
    }
}
