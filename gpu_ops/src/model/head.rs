//! The model's head: what the encoder's top layer feeds, and the training
//! target that goes with it.
//!
//! - [`Head::Classify`]: the top layer's outputs are class logits against
//!   [`Target::Labels`] (softmax cross-entropy), the node task.
//! - [`Head::Link`]: the top layer's outputs are embeddings (`num_classes`
//!   wide, the caller's embedding width; no softmax), and a [`Decoder`] scores
//!   pairs of them against [`Target::Pairs`] (binary cross-entropy on the
//!   scores), the link task. The encoder (SAGE, GCN, GAT) is the same either
//!   way.
//!
//! # The decoders (`d` = the embedding width)
//! - [`Decoder::Dot`]: `s = ⟨h_u, h_v⟩`, no parameters
//!   ([`LinkOps::pair_dot`](crate::LinkOps::pair_dot)).
//! - [`Decoder::Mlp`]: `z = h_u ⊙ h_v` ([`LinkOps::pair_hadamard`](crate::LinkOps::pair_hadamard)),
//!   `r = ReLU(z·W₀ + b₀)`, `s = r·W₁ + b₁` (DGL's `MLPPredictor` on the
//!   Hadamard product), with tensors `decoder.0.weight` (`d × d`, Xavier-uniform
//!   with ReLU's gain), `decoder.0.bias` (`d`, zeros), `decoder.1.weight`
//!   (`d × 1`, Xavier-uniform) and `decoder.1.bias` (`1`, zeros), stored
//!   `in × out` as the encoders' weights are. They follow the encoder's tensors
//!   in the model's parameter list, so gradients, Adam, checkpoints and
//!   gradient sums treat them like any other tensor.
//!
//! The backward turns `∂L/∂s` into the gradient of the embedding rows
//! (`num_dst × d`, every pair adding into both of its rows), which the
//! encoder's backward takes as the gradient of its output.

use cpu_ops::{Init, RELU_GAIN};

use super::emit::{GraphEmitter, Reduce, Unary};
use super::layer::{internal, ModelParam};
use crate::backend::{ActBackward, Activation, Backend, DevMat};
use crate::error::{GpuOpsError, Result};

/// How a link head scores a pair of embeddings (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum Decoder {
    /// The dot product of the two embeddings.
    #[default]
    Dot,
    /// `Linear(d, d) → ReLU → Linear(d, 1)` on their Hadamard product.
    Mlp,
}

/// What the encoder's top layer feeds (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Head {
    /// Class logits, softmax cross-entropy against node labels.
    #[default]
    Classify,
    /// Embeddings scored in pairs by a decoder, binary cross-entropy.
    Link(Decoder),
}

impl Head {
    /// The decoder of a link head.
    pub fn decoder(self) -> Option<Decoder> {
        match self {
            Head::Classify => None,
            Head::Link(d) => Some(d),
        }
    }

    /// The head's own tensors for embeddings of width `d` (after the
    /// encoder's, in this order).
    pub(crate) fn params(self, d: usize) -> Vec<ModelParam> {
        let Head::Link(Decoder::Mlp) = self else {
            return Vec::new();
        };
        let xavier = |gain, fan_out| Init::XavierUniform {
            gain,
            fan_in: d,
            fan_out,
        };
        [
            ("decoder.0.weight", vec![d, d], xavier(RELU_GAIN, d)),
            ("decoder.0.bias", vec![d], Init::Zeros),
            ("decoder.1.weight", vec![d, 1], xavier(1.0, 1)),
            ("decoder.1.bias", vec![1], Init::Zeros),
        ]
        .into_iter()
        .map(|(name, shape, init)| ModelParam {
            name: name.into(),
            len: shape.iter().product(),
            shape,
            init,
        })
        .collect()
    }
}

impl Decoder {
    /// Emits the scores of pairs `(src[i], dst[i])` (`int64 [P]` row ids of
    /// `h`, `rows × d`) as `float [P]`; `params` are the names of the head's
    /// tensors (in the order of [`ModelLayout::head_params`](super::ModelLayout::head_params),
    /// none for [`Decoder::Dot`]), declared by the caller with their shapes.
    pub fn emit(
        self,
        g: &mut dyn GraphEmitter,
        params: &[String],
        h: &str,
        src: &str,
        dst: &str,
    ) -> String {
        let hu = g.gather_rows(h, src);
        let hv = g.gather_rows(h, dst);
        let z = g.mul(&hu, &hv);
        match self {
            Decoder::Dot => g.reduce(Reduce::Sum, &z, 1),
            Decoder::Mlp => {
                let a = g.matmul(&z, &params[0]);
                let a = g.add(&a, &params[1]);
                let r = g.unary(Unary::Relu, &a);
                let s = g.matmul(&r, &params[2]);
                let s = g.add(&s, &params[3]);
                g.reshape(&s, &[-1])
            }
        }
    }
}

/// A batch of vertex pairs to score, with their labels (the link task's
/// training target): `n` pairs `(src[i], dst[i])` of **local** ids among the
/// top block's destinations (the batch's seeds), `labels[i]` 1.0 for a
/// positive (an edge) and 0.0 for a negative.
pub struct PairBatch<'a, B: Backend> {
    /// First vertex of each pair.
    pub src: &'a B::Buf<u32>,
    /// Second vertex of each pair.
    pub dst: &'a B::Buf<u32>,
    /// 1.0 or 0.0 per pair.
    pub labels: &'a B::Buf<f32>,
    /// Number of pairs.
    pub n: usize,
}

/// What a training step fits: node labels (a [`Head::Classify`] model) or
/// labelled pairs (a [`Head::Link`] model).
pub enum Target<'a, B: Backend> {
    /// One class per seed.
    Labels(&'a B::Buf<u32>),
    /// Labelled pairs of seeds.
    Pairs(&'a PairBatch<'a, B>),
}

impl<B: Backend> Clone for Target<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for Target<'_, B> {}

/// What a decoder's forward keeps for its backward.
pub(crate) struct Decoded<B: Backend> {
    /// One score (logit) per pair.
    pub(crate) scores: B::Buf<f32>,
    /// The MLP's input `z` and hidden activation `r` (`n × d` each).
    mlp: Option<(B::Buf<f32>, B::Buf<f32>)>,
}

/// The pairs a decoder reads: ids into the embedding rows.
pub(crate) struct Pairs<'a, B: Backend> {
    pub(crate) src: &'a B::Buf<u32>,
    pub(crate) dst: &'a B::Buf<u32>,
    pub(crate) n: usize,
}

impl<B: Backend> Clone for Pairs<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for Pairs<'_, B> {}

impl<'a, B: Backend> From<&PairBatch<'a, B>> for Pairs<'a, B> {
    fn from(p: &PairBatch<'a, B>) -> Self {
        Self {
            src: p.src,
            dst: p.dst,
            n: p.n,
        }
    }
}

/// One decoder application: the decoder, its tensors, the embeddings (`rows ×
/// d`) and the pairs it scores.
pub(crate) struct DecoderCall<'a, B: Backend> {
    pub(crate) decoder: Decoder,
    /// The head's tensors ([`Head::params`] order).
    pub(crate) params: &'a [B::Buf<f32>],
    pub(crate) h: &'a B::Buf<f32>,
    pub(crate) rows: usize,
    pub(crate) d: usize,
    pub(crate) pairs: Pairs<'a, B>,
}

impl<B: Backend> DecoderCall<'_, B> {
    /// The MLP's four tensors.
    fn mlp(&self) -> Result<[&B::Buf<f32>; 4]> {
        match self.params {
            [w0, b0, w1, b1] => Ok([w0, b0, w1, b1]),
            _ => Err(internal("an MLP decoder has four tensors")),
        }
    }

    /// The scores of the pairs, and what the backward needs.
    pub(crate) fn forward(&self, dev: &B) -> Result<Decoded<B>> {
        let (h, d, Pairs { src, dst, n }) = (self.h, self.d, self.pairs);
        let mut scores = dev.alloc_uninit(n)?;
        match self.decoder {
            Decoder::Dot => {
                dev.pair_dot(h, d, src, dst, n, &mut scores)?;
                Ok(Decoded { scores, mlp: None })
            }
            Decoder::Mlp => {
                let [w0, b0, w1, b1] = self.mlp()?;
                let mut z = dev.alloc_uninit(n * d)?;
                dev.pair_hadamard(h, d, src, dst, n, &mut z)?;
                let mut r = dev.alloc_uninit(n * d)?;
                dev.matmul(DevMat::new(&z, n, d), DevMat::new(w0, d, d), &mut r, false)?;
                dev.bias_act_dropout(&mut r, n, d, b0, Activation::Relu, None)?;
                dev.matmul(
                    DevMat::new(&r, n, d),
                    DevMat::new(w1, d, 1),
                    &mut scores,
                    false,
                )?;
                dev.add_bias(&mut scores, n, 1, b1)?;
                Ok(Decoded {
                    scores,
                    mlp: Some((z, r)),
                })
            }
        }
    }

    /// The backward of [`DecoderCall::forward`] from `dscores` (one per pair):
    /// the head's tensors' gradients go to `grads` (overwritten, [`Head::params`]
    /// order), and the gradient of the embeddings is returned (`rows × d`, zero
    /// where no pair reads a row).
    pub(crate) fn backward(
        &self,
        dev: &B,
        saved: &Decoded<B>,
        dscores: &B::Buf<f32>,
        grads: &mut [B::Buf<f32>],
    ) -> Result<B::Buf<f32>> {
        let (h, d, Pairs { src, dst, n }) = (self.h, self.d, self.pairs);
        let mut dh = dev.alloc(self.rows * d)?;
        match (self.decoder, &saved.mlp) {
            (Decoder::Dot, _) => dev.pair_dot_backward(h, d, src, dst, n, dscores, &mut dh)?,
            (Decoder::Mlp, Some((z, r))) => {
                let [w0, _, w1, _] = self.mlp()?;
                let [dw0, db0, dw1, db1] = grads else {
                    return Err(internal("an MLP decoder has four gradients"));
                };
                // s = r·W₁ + b₁
                dev.matmul(
                    DevMat::new(r, n, d).t(),
                    DevMat::new(dscores, n, 1),
                    dw1,
                    false,
                )?;
                dev.bias_grad(dscores, n, 1, db1, false)?;
                let mut dr = dev.alloc_uninit(n * d)?;
                dev.matmul(
                    DevMat::new(dscores, n, 1),
                    DevMat::new(w1, d, 1).t(),
                    &mut dr,
                    false,
                )?;
                // r = ReLU(z·W₀ + b₀)
                let back = ActBackward {
                    mask: None,
                    y: r,
                    act: Activation::Relu,
                };
                dev.act_backward_bias_grad(back, &mut dr, n, d, db0)?;
                dev.matmul(DevMat::new(z, n, d).t(), DevMat::new(&dr, n, d), dw0, false)?;
                let mut dz = dev.alloc_uninit(n * d)?;
                dev.matmul(
                    DevMat::new(&dr, n, d),
                    DevMat::new(w0, d, d).t(),
                    &mut dz,
                    false,
                )?;
                dev.pair_hadamard_backward(h, d, src, dst, n, &dz, &mut dh)?;
            }
            (Decoder::Mlp, None) => {
                return Err(internal("an MLP decoder's forward state is missing"))
            }
        }
        Ok(dh)
    }
}

/// The error of a target the model's head does not fit.
pub(crate) fn target_mismatch(head: Head, target: &str) -> GpuOpsError {
    GpuOpsError::InvalidArgument {
        name: "target",
        reason: format!("a model with the {head:?} head does not train on {target}"),
    }
}
