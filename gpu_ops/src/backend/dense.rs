//! [`DenseOps`]: dense math on row-major `f32` buffers, and the arguments its
//! ops take ([`DevMat`], [`Activation`], [`ActBackward`], [`XentInputs`],
//! [`LossSlot`], [`AdamStep`], [`AdamTensors`]) and return ([`LossStats`]).

use super::core::DeviceCore;
use super::memory::DeviceMemory;
use crate::error::{GpuOpsError, Result};

/// A hidden layer's activation, for the fused ops
/// ([`DenseOps::bias_act_dropout`], [`DenseOps::dropout_act_backward`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// [`DenseOps::relu`].
    Relu,
    /// [`DenseOps::elu`] with this `alpha`.
    Elu {
        /// ELU's `alpha` (finite, > 0).
        alpha: f32,
    },
}

/// Adam's hyper-parameters and step for one [`DenseOps::adam_step`] (PyTorch's
/// `Adam` with L2 weight decay: `g ← g + λθ`, bias-corrected moments).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator term.
    pub eps: f32,
    /// L2 weight decay `λ`.
    pub weight_decay: f32,
    /// The step number, starting at 1 (bias correction uses it).
    pub step: u64,
}

/// A row-major `rows × cols` matrix: the first `rows · cols` values of a device
/// buffer, read as stored or transposed ([`DevMat::t`]). The operands of
/// [`DenseOps::matmul`], which take their shapes and transposes from it.
pub struct DevMat<'a, B: DeviceCore> {
    buf: &'a B::Buf<f32>,
    rows: usize,
    cols: usize,
    trans: bool,
}

impl<B: DeviceCore> Clone for DevMat<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: DeviceCore> Copy for DevMat<'_, B> {}

impl<'a, B: DeviceCore> DevMat<'a, B> {
    /// `buf` read as `rows × cols`, row-major.
    pub fn new(buf: &'a B::Buf<f32>, rows: usize, cols: usize) -> Self {
        Self {
            buf,
            rows,
            cols,
            trans: false,
        }
    }

    /// The transpose (`cols × rows`), without moving data.
    pub fn t(self) -> Self {
        Self {
            trans: !self.trans,
            ..self
        }
    }

    /// `(rows, cols)` as read (after any transpose).
    pub fn shape(&self) -> (usize, usize) {
        if self.trans {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }

    /// The buffer, holding the matrix as stored (row-major, before any transpose).
    pub fn buf(&self) -> &'a B::Buf<f32> {
        self.buf
    }

    /// Whether the matrix is read transposed: the buffer holds its transpose.
    pub fn is_transposed(&self) -> bool {
        self.trans
    }

    /// `(m, n, k)` of the product `self · rhs`: `self` read as `m × k`, `rhs` as
    /// `k × n`. Errors: the columns of `self` differ from the rows of `rhs`
    /// ([`GpuOpsError::SizeMismatch`]).
    pub fn product_dims(&self, rhs: &DevMat<'_, B>) -> Result<(usize, usize, usize)> {
        let ((m, k), (kb, n)) = (self.shape(), rhs.shape());
        if k != kb {
            return Err(GpuOpsError::SizeMismatch {
                what: "matmul: rows of the right operand (the left one's columns)",
                expected: k,
                found: kb,
            });
        }
        Ok((m, n, k))
    }
}

/// How a hidden layer's output gradient goes back through its epilogue
/// ([`DenseOps::act_backward_bias_grad`]): through the dropout of the layer
/// above when `mask` is given, then through `act`, whose output was `y`.
pub struct ActBackward<'a, B: DeviceCore> {
    /// The dropout mask of the layer above (applied to this layer's output), if any.
    pub mask: Option<&'a B::Mask>,
    /// The activation's output, as many values as the gradient.
    pub y: &'a B::Buf<f32>,
    /// The activation.
    pub act: Activation,
}

/// The inputs of a softmax cross-entropy: `logits` (`rows × classes`, row-major)
/// against `labels` (one class per row). What
/// [`DenseOps::softmax_cross_entropy_deferred`] reads.
pub struct XentInputs<'a, B: DeviceCore> {
    /// The logits, `rows × classes` values.
    pub logits: &'a B::Buf<f32>,
    /// Number of rows.
    pub rows: usize,
    /// Number of classes (at least 1 when `rows > 0`).
    pub classes: usize,
    /// The label of each row, below `classes`.
    pub labels: &'a B::Buf<u32>,
}

/// Where a deferred loss goes: words `2·slot` and `2·slot + 1` of `out` (the
/// f64 bits of the loss sum, then the correct count), read batches later
/// ([`DenseOps::softmax_cross_entropy_deferred`]).
pub struct LossSlot<'a, B: DeviceCore> {
    /// The slot words, at least `2·slot + 2`.
    pub out: &'a mut B::Buf<u64>,
    /// Which slot of `out` this batch writes.
    pub slot: usize,
}

/// The tensors of a whole-model Adam update ([`DenseOps::adam_step_all`]):
/// tensor `i` is `params[i][..lens[i]]`, its gradient `grads[i]` and its
/// moments `m[i]`, `v[i]`; the five slices have one entry per tensor.
pub struct AdamTensors<'a, B: DeviceCore> {
    /// The parameters, updated in place.
    pub params: &'a mut [B::Buf<f32>],
    /// Their gradients.
    pub grads: &'a [B::Buf<f32>],
    /// First moments, updated in place.
    pub m: &'a mut [B::Buf<f32>],
    /// Second moments, updated in place.
    pub v: &'a mut [B::Buf<f32>],
    /// The length of each tensor.
    pub lens: &'a [usize],
}

impl<B: DeviceCore> AdamTensors<'_, B> {
    /// The number of tensors, or [`GpuOpsError::InvalidArgument`] when the
    /// slices disagree on it.
    pub fn count(&self) -> Result<usize> {
        let t = self.lens.len();
        let (p, g, m, v) = (
            self.params.len(),
            self.grads.len(),
            self.m.len(),
            self.v.len(),
        );
        if p != t || g != t || m != t || v != t {
            return Err(GpuOpsError::InvalidArgument {
                name: "adam_step_all",
                reason: format!(
                    "{p} parameters, {g} gradients, {m} first and {v} second moments for {t} lengths"
                ),
            });
        }
        Ok(t)
    }
}

/// Mean loss and correct count of [`DenseOps::softmax_cross_entropy`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossStats {
    /// Mean cross-entropy over the rows.
    pub loss: f64,
    /// Rows whose arg-max equals the label.
    pub correct: usize,
}

/// [`DenseOps::count_nonfinite`]'s bound on `n` (its count is 32 bits).
pub(crate) fn check_count_len(n: usize) -> Result<()> {
    if n > u32::MAX as usize {
        return Err(crate::error::GpuOpsError::InvalidArgument {
            name: "n",
            reason: format!("count_nonfinite counts below 2^32 values; got {n}"),
        });
    }
    Ok(())
}

/// Dense math on row-major `f32` buffers: matrix products, bias, activations,
/// dropout, the loss, the optimizer step and elementwise helpers.
pub trait DenseOps: DeviceMemory {
    /// `C = A·B` (`+ C` when `accumulate`; without it `C`'s old values are never
    /// read) for views that carry their shapes and transposes: with `A` read as
    /// `m × k` and `B` as `k × n` ([`DevMat::product_dims`]), `C` is the row-major
    /// `m × n` prefix of `c`. Errors: the columns of `a` differ from the rows of
    /// `b`, or a buffer holds fewer values than its matrix
    /// ([`GpuOpsError::SizeMismatch`]).
    fn matmul(
        &self,
        a: DevMat<'_, Self>,
        b: DevMat<'_, Self>,
        c: &mut Self::Buf<f32>,
        accumulate: bool,
    ) -> Result<()>;
    /// `x[r] += bias` for `r < rows` (`x` is `rows × cols`).
    fn add_bias(
        &self,
        x: &mut Self::Buf<f32>,
        rows: usize,
        cols: usize,
        bias: &Self::Buf<f32>,
    ) -> Result<()>;
    /// `dbias (+)= Σ_r dy[r]`.
    fn bias_grad(
        &self,
        dy: &Self::Buf<f32>,
        rows: usize,
        cols: usize,
        dbias: &mut Self::Buf<f32>,
        accumulate: bool,
    ) -> Result<()>;
    /// In-place ReLU on `x[..n]`.
    fn relu(&self, x: &mut Self::Buf<f32>, n: usize) -> Result<()>;
    /// `dy[i] *= [y[i] > 0]`.
    fn relu_backward(&self, y: &Self::Buf<f32>, dy: &mut Self::Buf<f32>, n: usize) -> Result<()>;
    /// In-place ELU(α) on `x[..n]`.
    fn elu(&self, x: &mut Self::Buf<f32>, n: usize, alpha: f32) -> Result<()>;
    /// ELU backward from the output `y`.
    fn elu_backward(
        &self,
        y: &Self::Buf<f32>,
        dy: &mut Self::Buf<f32>,
        n: usize,
        alpha: f32,
    ) -> Result<()>;
    /// Inverted dropout with probability `p` on `x[..n]`, stream `seed`.
    fn dropout(&self, x: &mut Self::Buf<f32>, n: usize, p: f32, seed: u64) -> Result<Self::Mask>;
    /// Applies `mask` (and its scale) to `dy[..n]`.
    fn dropout_backward(&self, mask: &Self::Mask, dy: &mut Self::Buf<f32>, n: usize) -> Result<()>;
    /// A hidden layer's bias, activation and dropout in one pass:
    /// `x = act(x + bias)` over the row-major `rows × cols` matrix (kept: the
    /// activation's backward reads it), then, when `dropout` is `Some((p, seed,
    /// out))`, `out[..rows · cols]` = [`DenseOps::dropout`] of `x` with `(p, seed)`,
    /// whose mask is returned. Equal, bit for bit, to [`DenseOps::add_bias`],
    /// [`DenseOps::relu`] / [`DenseOps::elu`], [`DeviceMemory::copy`] and
    /// [`DenseOps::dropout`] in that order — which is the default; CUDA runs one
    /// kernel that reads `x` once instead of four times.
    fn bias_act_dropout(
        &self,
        x: &mut Self::Buf<f32>,
        rows: usize,
        cols: usize,
        bias: &Self::Buf<f32>,
        act: Activation,
        dropout: Option<(f32, u64, &mut Self::Buf<f32>)>,
    ) -> Result<Option<Self::Mask>> {
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| GpuOpsError::InvalidArgument {
                name: "rows × cols",
                reason: format!("{rows} × {cols} overflows"),
            })?;
        self.add_bias(x, rows, cols, bias)?;
        match act {
            Activation::Relu => self.relu(x, n)?,
            Activation::Elu { alpha } => self.elu(x, n, alpha)?,
        }
        match dropout {
            None => Ok(None),
            Some((p, seed, out)) => {
                self.copy(x, out, n)?;
                self.dropout(out, n, p, seed).map(Some)
            }
        }
    }
    /// [`DenseOps::dropout_backward`] of `dy[..n]`, then the activation's backward
    /// from its output `y` ([`DenseOps::relu_backward`] / [`DenseOps::elu_backward`]),
    /// in one pass on CUDA; bit for bit the two calls (the default).
    fn dropout_act_backward(
        &self,
        mask: &Self::Mask,
        y: &Self::Buf<f32>,
        dy: &mut Self::Buf<f32>,
        n: usize,
        act: Activation,
    ) -> Result<()> {
        self.dropout_backward(mask, dy, n)?;
        self.activation_backward(y, dy, n, act)
    }
    /// A hidden layer's backward below the layer above, with its bias gradient:
    /// `dy[..rows·cols]` (row-major) goes through
    /// [`DenseOps::dropout_act_backward`] when `back.mask` is given, else
    /// [`DenseOps::activation_backward`], then `dbias[..cols]` is overwritten
    /// with its column sums ([`DenseOps::bias_grad`]). The default makes those
    /// calls (the host backend's results, bit for bit); CUDA makes one launch
    /// (`act_backward_colsum`: the gradient bit for bit, the column sums in
    /// another fixed order, so they may differ from `bias_grad`'s in the last
    /// bits, and run to run they do not).
    fn act_backward_bias_grad(
        &self,
        back: ActBackward<'_, Self>,
        dy: &mut Self::Buf<f32>,
        rows: usize,
        cols: usize,
        dbias: &mut Self::Buf<f32>,
    ) -> Result<()> {
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| GpuOpsError::InvalidArgument {
                name: "rows × cols",
                reason: format!("{rows} × {cols} overflows"),
            })?;
        match back.mask {
            Some(mask) => self.dropout_act_backward(mask, back.y, dy, n, back.act)?,
            None => self.activation_backward(back.y, dy, n, back.act)?,
        }
        self.bias_grad(dy, rows, cols, dbias, false)
    }
    /// `act`'s backward from its output `y`: [`DenseOps::relu_backward`] or
    /// [`DenseOps::elu_backward`].
    fn activation_backward(
        &self,
        y: &Self::Buf<f32>,
        dy: &mut Self::Buf<f32>,
        n: usize,
        act: Activation,
    ) -> Result<()> {
        match act {
            Activation::Relu => self.relu_backward(y, dy, n),
            Activation::Elu { alpha } => self.elu_backward(y, dy, n, alpha),
        }
    }
    /// Mean softmax cross-entropy of `logits` (`rows × classes`) against `labels`,
    /// writing `(softmax − onehot)/rows` into `grad` when given. Synchronizes.
    fn softmax_cross_entropy(
        &self,
        logits: &Self::Buf<f32>,
        rows: usize,
        classes: usize,
        labels: &Self::Buf<u32>,
        grad: Option<&mut Self::Buf<f32>>,
    ) -> Result<LossStats>;
    /// One Adam update of `param[..n]` from `grad`, with moments `m`, `v`.
    fn adam_step(
        &self,
        hp: &AdamStep,
        param: &mut Self::Buf<f32>,
        grad: &Self::Buf<f32>,
        m: &mut Self::Buf<f32>,
        v: &mut Self::Buf<f32>,
        n: usize,
    ) -> Result<()>;
    /// [`DenseOps::softmax_cross_entropy`] of `inp` (with the gradient, into
    /// `grad`) without reading the result: the loss **sum** (its f64 bits) and
    /// the correct count go to `dest`'s slot, to be read batches later, many
    /// slots in one download; a non-finite sum sets `guard[0] = 1`, which
    /// nothing but the caller clears and which [`DenseOps::adam_step_all`]
    /// obeys. No synchronization on CUDA (the deferred-loss protocol,
    /// `model/mod.rs`).
    fn softmax_cross_entropy_deferred(
        &self,
        inp: &XentInputs<'_, Self>,
        grad: &mut Self::Buf<f32>,
        dest: LossSlot<'_, Self>,
        guard: &mut Self::Buf<u32>,
    ) -> Result<()>;
    /// One Adam update of every tensor of `t` — element for element what
    /// [`DenseOps::adam_step`] does to each — and none at all when `guard` is
    /// given and `guard[0] != 0` (a non-finite loss). The default reads the guard
    /// (a synchronization) and calls `adam_step` per tensor; CUDA makes one
    /// launch that reads the guard on the device.
    fn adam_step_all(
        &self,
        hp: &AdamStep,
        t: AdamTensors<'_, Self>,
        guard: Option<&Self::Buf<u32>>,
    ) -> Result<()> {
        let count = t.count()?;
        if let Some(g) = guard {
            if self.to_host(g, 1)?[0] != 0 {
                return Ok(());
            }
        }
        let AdamTensors {
            params,
            grads,
            m,
            v,
            lens,
        } = t;
        for i in 0..count {
            self.adam_step(hp, &mut params[i], &grads[i], &mut m[i], &mut v[i], lens[i])?;
        }
        Ok(())
    }

    // ---- elementwise helpers ----------------------------------------------------
    /// `out[i] = f32(src[i])` for `i < n`: bfloat16 bits widened exactly
    /// ([`bf16_bits_to_f32`](crate::bf16_bits_to_f32)), e.g. rows uploaded as bfloat16
    /// (half the bytes) and widened on the device.
    fn widen_bf16(&self, src: &Self::Buf<u16>, n: usize, out: &mut Self::Buf<f32>) -> Result<()>;
    /// `out[out_at + i] = f32(src[src_at + i])` for `i < n`:
    /// [`widen_bf16`](Self::widen_bf16) on parts of buffers, e.g. bfloat16 hot-row
    /// embeddings uploaded into one region of a slab and widened in place of its fp32 rows.
    /// Either offset may be unaligned.
    fn widen_bf16_at(
        &self,
        src: &Self::Buf<u16>,
        src_at: usize,
        n: usize,
        out: &mut Self::Buf<f32>,
        out_at: usize,
    ) -> Result<()>;
    /// `x[..n] *= alpha` (an IEEE single-precision product per value, as on the
    /// host), e.g. a rank's gradients weighted by its share of the batch.
    fn scale(&self, x: &mut Self::Buf<f32>, n: usize, alpha: f32) -> Result<()>;
    /// `count[0] += ` the number of non-finite values (NaN, ±∞) in `x[..n]`, on
    /// the compute stream: e.g. whether summed gradients may be applied, with one
    /// read of `count` after checking every buffer. `n` must be below 2³² (the
    /// count wraps modulo 2³²).
    fn count_nonfinite(
        &self,
        x: &Self::Buf<f32>,
        n: usize,
        count: &mut Self::Buf<u32>,
    ) -> Result<()>;
}
