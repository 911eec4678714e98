//! The host backend's [`DenseOps`]: each op checks the prefixes it reads and
//! writes (contract item 2 of [`crate::Backend`]) and runs the `cpu_ops` kernel, the
//! `f32` SIMD path where one exists. Adam is written out here, operation for
//! operation as [`cpu_ops::Adam`] with L2 decay does it, so both give the same bits.

use cpu_ops::{DropoutMask, MatMut, MatRef, Transpose};
use rayon::prelude::*;

use crate::backend::{AdamStep, AdamTensors, DenseOps, DevMat, LossSlot, LossStats, XentInputs};
use crate::error::{GpuOpsError, Result};
use crate::host::buffer::{mul, prefix, prefix_mut, HostBuf};
use crate::host::HostBackend;

/// A dropout mask of the host backend (one bit per element, and `p`).
#[derive(Clone, Debug)]
pub struct HostMask(DropoutMask);

impl HostMask {
    /// The `cpu_ops` mask.
    pub fn mask(&self) -> &DropoutMask {
        &self.0
    }
}

fn transpose(t: bool) -> Transpose {
    if t {
        Transpose::Yes
    } else {
        Transpose::No
    }
}

fn accumulate(acc: bool) -> cpu_ops::Accumulate {
    if acc {
        cpu_ops::Accumulate::Yes
    } else {
        cpu_ops::Accumulate::No
    }
}

/// [`crate::DenseOps::matmul`]; with `tf32`, on copies of A and B rounded to TF32
/// ([`crate::round_to_tf32`]), accumulating in fp32 as tensor cores do.
pub(crate) fn matmul(
    a: DevMat<'_, HostBackend>,
    b: DevMat<'_, HostBackend>,
    c: &mut [f32],
    acc: bool,
    tf32: bool,
) -> Result<()> {
    let (m, n, k) = a.product_dims(&b)?;
    let (trans_a, trans_b) = (a.is_transposed(), b.is_transposed());
    let (a, b): (&[f32], &[f32]) = (a.buf(), b.buf());
    let a = prefix("gemm A (m × k)", a, mul("m × k", m, k)?)?;
    let b = prefix("gemm B (k × n)", b, mul("k × n", k, n)?)?;
    let rounded: Option<(Vec<f32>, Vec<f32>)> = tf32.then(|| {
        let r = |x: &[f32]| x.iter().map(|&v| crate::round_to_tf32(v)).collect();
        (r(a), r(b))
    });
    let (a, b) = match &rounded {
        Some((ra, rb)) => (ra.as_slice(), rb.as_slice()),
        None => (a, b),
    };
    let c = prefix_mut("gemm C (m × n)", c, mul("m × n", m, n)?)?;
    let (ar, ac) = if trans_a { (k, m) } else { (m, k) };
    let (br, bc) = if trans_b { (n, k) } else { (k, n) };
    cpu_ops::gemm(
        MatRef::new(a, ar, ac)?,
        transpose(trans_a),
        MatRef::new(b, br, bc)?,
        transpose(trans_b),
        MatMut::new(c, m, n)?,
        accumulate(acc),
    )?;
    Ok(())
}

/// [`crate::DenseOps::add_bias`].
pub(crate) fn add_bias(x: &mut [f32], rows: usize, cols: usize, bias: &[f32]) -> Result<()> {
    let x = prefix_mut(
        "add_bias x (rows × cols)",
        x,
        mul("rows × cols", rows, cols)?,
    )?;
    let bias = prefix("add_bias bias (cols)", bias, cols)?;
    cpu_ops::add_bias(MatMut::new(x, rows, cols)?, bias)?;
    Ok(())
}

/// [`crate::DenseOps::bias_grad`].
pub(crate) fn bias_grad(
    dy: &[f32],
    rows: usize,
    cols: usize,
    dbias: &mut [f32],
    acc: bool,
) -> Result<()> {
    let dy = prefix(
        "bias_grad dy (rows × cols)",
        dy,
        mul("rows × cols", rows, cols)?,
    )?;
    let dbias = prefix_mut("bias_grad dbias (cols)", dbias, cols)?;
    cpu_ops::bias_grad(MatRef::new(dy, rows, cols)?, dbias, accumulate(acc))?;
    Ok(())
}

/// [`crate::DenseOps::relu`].
pub(crate) fn relu(x: &mut [f32], n: usize) -> Result<()> {
    cpu_ops::relu(prefix_mut("relu x", x, n)?);
    Ok(())
}

/// [`crate::DenseOps::relu_backward`].
pub(crate) fn relu_backward(y: &[f32], dy: &mut [f32], n: usize) -> Result<()> {
    let y = prefix("relu_backward y", y, n)?;
    cpu_ops::relu_backward(y, prefix_mut("relu_backward dy", dy, n)?)?;
    Ok(())
}

/// [`crate::DenseOps::elu`].
pub(crate) fn elu(x: &mut [f32], n: usize, alpha: f32) -> Result<()> {
    cpu_ops::elu(prefix_mut("elu x", x, n)?, f64::from(alpha))?;
    Ok(())
}

/// [`crate::DenseOps::elu_backward`].
pub(crate) fn elu_backward(y: &[f32], dy: &mut [f32], n: usize, alpha: f32) -> Result<()> {
    let y = prefix("elu_backward y", y, n)?;
    let dy = prefix_mut("elu_backward dy", dy, n)?;
    cpu_ops::elu_backward(y, dy, f64::from(alpha))?;
    Ok(())
}

/// [`crate::DenseOps::dropout`].
pub(crate) fn dropout(x: &mut [f32], n: usize, p: f32, seed: u64) -> Result<HostMask> {
    let x = prefix_mut("dropout x", x, n)?;
    Ok(HostMask(cpu_ops::dropout(x, f64::from(p), seed)?))
}

/// [`crate::DenseOps::dropout_backward`].
pub(crate) fn dropout_backward(mask: &HostMask, dy: &mut [f32], n: usize) -> Result<()> {
    if n != mask.0.len() {
        return Err(GpuOpsError::SizeMismatch {
            what: "dropout_backward n (the forward's n)",
            expected: mask.0.len(),
            found: n,
        });
    }
    mask.0.backward(prefix_mut("dropout_backward dy", dy, n)?)?;
    Ok(())
}

/// [`crate::DenseOps::softmax_cross_entropy`].
pub(crate) fn softmax_cross_entropy(
    logits: &[f32],
    rows: usize,
    classes: usize,
    labels: &[u32],
    grad: Option<&mut [f32]>,
) -> Result<LossStats> {
    let len = mul("rows × classes", rows, classes)?;
    let logits = prefix("softmax_cross_entropy logits (rows × classes)", logits, len)?;
    let labels = prefix("softmax_cross_entropy labels (rows)", labels, rows)?;
    let grad = match grad {
        Some(g) => Some(MatMut::new(
            prefix_mut("softmax_cross_entropy grad (rows × classes)", g, len)?,
            rows,
            classes,
        )?),
        None => None,
    };
    let ce = cpu_ops::softmax_cross_entropy(MatRef::new(logits, rows, classes)?, labels, grad)?;
    Ok(LossStats {
        loss: ce.loss,
        correct: ce.correct,
    })
}

/// Checks a deferred loss's slot (two words) and guard (one) before the loss
/// is computed, so a bad slot leaves the gradient unwritten.
pub(crate) fn check_loss_slot(
    dest: &LossSlot<'_, HostBackend>,
    guard: &HostBuf<u32>,
) -> Result<()> {
    prefix(
        "deferred loss slots (2 words per slot)",
        dest.out,
        2 * dest.slot + 2,
    )?;
    prefix("loss guard", guard, 1)?;
    Ok(())
}

/// The deferred-loss protocol's write ([`check_loss_slot`] first): the loss
/// sum as the synchronous path's caller forms it (mean × rows) as f64 bits, the
/// correct count, and the guard set on a non-finite sum (never cleared here).
pub(crate) fn write_loss_slot(
    dest: LossSlot<'_, HostBackend>,
    guard: &mut HostBuf<u32>,
    stats: LossStats,
    rows: usize,
) {
    let sum = stats.loss * rows as f64;
    let words = &mut dest.out[2 * dest.slot..2 * dest.slot + 2];
    words[0] = sum.to_bits();
    words[1] = stats.correct as u64;
    if !sum.is_finite() {
        guard[0] = 1;
    }
}

/// Tensors with fewer elements than this are updated on the calling thread (as in
/// `cpu_ops::Adam`; the result is element-wise, so this only affects speed).
const ADAM_PARALLEL_MIN_LEN: usize = 1 << 16;
/// Elements per parallel Adam task.
const ADAM_CHUNK_LEN: usize = 1 << 14;

/// Checks Adam's hyper-parameters as [`cpu_ops::Adam::new`] does, plus `step ≥ 1`.
fn check_adam(hp: &AdamStep) -> Result<()> {
    let bad = |name: &'static str, v: f32, range: &str| GpuOpsError::InvalidArgument {
        name,
        reason: format!("must be finite and {range}, got {v}"),
    };
    let unit = |x: f32| (0.0..1.0).contains(&x);
    if !(hp.lr.is_finite() && hp.lr >= 0.0) {
        return Err(bad("lr", hp.lr, ">= 0"));
    }
    if !unit(hp.beta1) {
        return Err(bad("beta1", hp.beta1, "in [0, 1)"));
    }
    if !unit(hp.beta2) {
        return Err(bad("beta2", hp.beta2, "in [0, 1)"));
    }
    if !(hp.eps.is_finite() && hp.eps >= 0.0) {
        return Err(bad("eps", hp.eps, ">= 0"));
    }
    if !(hp.weight_decay.is_finite() && hp.weight_decay >= 0.0) {
        return Err(bad("weight_decay", hp.weight_decay, ">= 0"));
    }
    if hp.step == 0 {
        return Err(GpuOpsError::InvalidArgument {
            name: "step",
            reason: "Adam steps count from 1".into(),
        });
    }
    Ok(())
}

/// [`crate::DenseOps::adam_step`]: `cpu_ops::Adam`'s update with L2 decay, the scalar
/// factors computed in `f64` from the `f32` hyper-parameters, the element update in
/// `f32` in the same order of operations.
pub(crate) fn adam_step(
    hp: &AdamStep,
    param: &mut [f32],
    grad: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    n: usize,
) -> Result<()> {
    check_adam(hp)?;
    let param = prefix_mut("adam_step param", param, n)?;
    let grad = prefix("adam_step grad", grad, n)?;
    let m = prefix_mut("adam_step m", m, n)?;
    let v = prefix_mut("adam_step v", v, n)?;
    let (lr, beta1, beta2) = (f64::from(hp.lr), f64::from(hp.beta1), f64::from(hp.beta2));
    let t = hp.step.min(i32::MAX as u64) as i32;
    let bias1 = 1.0 - beta1.powi(t);
    let bias2_sqrt = (1.0 - beta2.powi(t)).sqrt();
    let step_size = (lr / bias1) as f32;
    let inv_bias2_sqrt = (1.0 / bias2_sqrt) as f32;
    let (b1, b2) = (beta1 as f32, beta2 as f32);
    let (one_b1, one_b2) = ((1.0 - beta1) as f32, (1.0 - beta2) as f32);
    let eps = f64::from(hp.eps) as f32;
    let l2 = f64::from(hp.weight_decay) as f32;
    let update = |p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]| {
        for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m).zip(v) {
            let g = g + l2 * *p;
            *m = b1 * *m + one_b1 * g;
            *v = b2 * *v + one_b2 * g * g;
            *p -= step_size * *m / (v.sqrt() * inv_bias2_sqrt + eps);
        }
    };
    if n < ADAM_PARALLEL_MIN_LEN {
        update(param, grad, m, v);
    } else {
        param
            .par_chunks_mut(ADAM_CHUNK_LEN)
            .zip(grad.par_chunks(ADAM_CHUNK_LEN))
            .zip(m.par_chunks_mut(ADAM_CHUNK_LEN))
            .zip(v.par_chunks_mut(ADAM_CHUNK_LEN))
            .for_each(|(((p, g), m), v)| update(p, g, m, v));
    }
    Ok(())
}

/// [`crate::DenseOps::widen_bf16`].
pub(crate) fn widen_bf16(src: &HostBuf<u16>, n: usize, out: &mut HostBuf<f32>) -> Result<()> {
    let s = prefix("widen_bf16 source", src, n)?;
    for (o, &b) in prefix_mut("widen_bf16 output", out, n)?.iter_mut().zip(s) {
        *o = crate::bf16_bits_to_f32(b);
    }
    Ok(())
}

/// [`crate::DenseOps::widen_bf16_at`].
pub(crate) fn widen_bf16_at(
    src: &HostBuf<u16>,
    src_at: usize,
    n: usize,
    out: &mut HostBuf<f32>,
    out_at: usize,
) -> Result<()> {
    let s = prefix("widen_bf16_at source", src, src_at.saturating_add(n))?;
    let o = prefix_mut("widen_bf16_at output", out, out_at.saturating_add(n))?;
    for (o, &b) in o[out_at..].iter_mut().zip(&s[src_at..]) {
        *o = crate::bf16_bits_to_f32(b);
    }
    Ok(())
}

/// [`crate::DenseOps::scale`].
pub(crate) fn scale(x: &mut HostBuf<f32>, n: usize, alpha: f32) -> Result<()> {
    for v in prefix_mut("scale x", x, n)? {
        *v *= alpha;
    }
    Ok(())
}

/// [`crate::DenseOps::count_nonfinite`].
pub(crate) fn count_nonfinite(x: &HostBuf<f32>, n: usize, count: &mut HostBuf<u32>) -> Result<()> {
    crate::backend::check_count_len(n)?;
    let bad = prefix("count_nonfinite x", x, n)?
        .iter()
        .filter(|v| !v.is_finite())
        .count();
    let c = &mut prefix_mut("count_nonfinite count", count, 1)?[0];
    *c = c.wrapping_add(bad as u32);
    Ok(())
}

impl DenseOps for HostBackend {
    fn widen_bf16(&self, src: &HostBuf<u16>, n: usize, out: &mut HostBuf<f32>) -> Result<()> {
        widen_bf16(src, n, out)
    }

    fn widen_bf16_at(
        &self,
        src: &HostBuf<u16>,
        src_at: usize,
        n: usize,
        out: &mut HostBuf<f32>,
        out_at: usize,
    ) -> Result<()> {
        widen_bf16_at(src, src_at, n, out, out_at)
    }

    fn scale(&self, x: &mut HostBuf<f32>, n: usize, alpha: f32) -> Result<()> {
        scale(x, n, alpha)
    }

    fn count_nonfinite(&self, x: &HostBuf<f32>, n: usize, count: &mut HostBuf<u32>) -> Result<()> {
        count_nonfinite(x, n, count)
    }

    fn matmul(
        &self,
        a: DevMat<'_, Self>,
        b: DevMat<'_, Self>,
        c: &mut HostBuf<f32>,
        accumulate: bool,
    ) -> Result<()> {
        let tf32 = self.tf32.load(std::sync::atomic::Ordering::Relaxed);
        matmul(a, b, c, accumulate, tf32)
    }

    fn add_bias(
        &self,
        x: &mut HostBuf<f32>,
        rows: usize,
        cols: usize,
        bias: &HostBuf<f32>,
    ) -> Result<()> {
        add_bias(x, rows, cols, bias)
    }

    fn bias_grad(
        &self,
        dy: &HostBuf<f32>,
        rows: usize,
        cols: usize,
        dbias: &mut HostBuf<f32>,
        accumulate: bool,
    ) -> Result<()> {
        bias_grad(dy, rows, cols, dbias, accumulate)
    }

    fn relu(&self, x: &mut HostBuf<f32>, n: usize) -> Result<()> {
        relu(x, n)
    }

    fn relu_backward(&self, y: &HostBuf<f32>, dy: &mut HostBuf<f32>, n: usize) -> Result<()> {
        relu_backward(y, dy, n)
    }

    fn elu(&self, x: &mut HostBuf<f32>, n: usize, alpha: f32) -> Result<()> {
        elu(x, n, alpha)
    }

    fn elu_backward(
        &self,
        y: &HostBuf<f32>,
        dy: &mut HostBuf<f32>,
        n: usize,
        alpha: f32,
    ) -> Result<()> {
        elu_backward(y, dy, n, alpha)
    }

    fn dropout(&self, x: &mut HostBuf<f32>, n: usize, p: f32, seed: u64) -> Result<HostMask> {
        dropout(x, n, p, seed)
    }

    fn dropout_backward(&self, mask: &HostMask, dy: &mut HostBuf<f32>, n: usize) -> Result<()> {
        dropout_backward(mask, dy, n)
    }

    fn softmax_cross_entropy(
        &self,
        logits: &HostBuf<f32>,
        rows: usize,
        classes: usize,
        labels: &HostBuf<u32>,
        grad: Option<&mut HostBuf<f32>>,
    ) -> Result<LossStats> {
        let stats = softmax_cross_entropy(
            logits,
            rows,
            classes,
            labels,
            grad.map(|g| g.as_mut_slice()),
        )?;
        // The result reaches the host: what a device's synchronization is.
        self.transfers.sync();
        Ok(stats)
    }

    /// Computed at once (the host has nothing to overlap), written to the slot
    /// as the protocol says: no synchronization is counted.
    fn softmax_cross_entropy_deferred(
        &self,
        inp: &XentInputs<'_, Self>,
        grad: &mut HostBuf<f32>,
        dest: LossSlot<'_, Self>,
        guard: &mut HostBuf<u32>,
    ) -> Result<()> {
        check_loss_slot(&dest, guard)?;
        let s = softmax_cross_entropy(
            inp.logits,
            inp.rows,
            inp.classes,
            inp.labels,
            Some(grad.as_mut_slice()),
        )?;
        write_loss_slot(dest, guard, s, inp.rows);
        Ok(())
    }

    /// The guard is host memory: read without a synchronization.
    fn adam_step_all(
        &self,
        hp: &AdamStep,
        t: AdamTensors<'_, Self>,
        guard: Option<&HostBuf<u32>>,
    ) -> Result<()> {
        let count = t.count()?;
        if guard.is_some_and(|g| g.as_slice().first().is_some_and(|&w| w != 0)) {
            return Ok(());
        }
        let AdamTensors {
            params,
            grads,
            m,
            v,
            lens,
        } = t;
        for i in 0..count {
            adam_step(hp, &mut params[i], &grads[i], &mut m[i], &mut v[i], lens[i])?;
        }
        Ok(())
    }

    fn adam_step(
        &self,
        hp: &AdamStep,
        param: &mut HostBuf<f32>,
        grad: &HostBuf<f32>,
        m: &mut HostBuf<f32>,
        v: &mut HostBuf<f32>,
        n: usize,
    ) -> Result<()> {
        adam_step(hp, param, grad, m, v, n)
    }
}
