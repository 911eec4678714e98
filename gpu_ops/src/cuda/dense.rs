//! [`DenseOps`] for the CUDA backend: GEMM through cuBLAS, bias, activations, dropout, softmax
//! cross-entropy, Adam, and the deterministic column sums the bias and attention
//! gradients use (kernels in `kernels/math.cu`).
//!
//! The GEMM itself is cuBLAS `sgemm` on the column-major view of the row-major
//! product (`gemm.rs`), or cuBLASLt when `TANDEM_GEMM` asks for it (`gemm_lt.rs`).

use cudarc::cublas;

use super::alloc::{CudaBuf, Init};
use super::device::CudaBackend;
use super::driver::blas_err;
use super::gemm::{op, ColMajorGemm};
use super::kernels::{launch, Grid, Ptr, PtrMut};
use crate::backend::{
    ActBackward, Activation, AdamStep, AdamTensors, DenseOps, DevMat, LossSlot, LossStats,
    XentInputs,
};
use crate::error::{GpuOpsError, Result};

/// Rows per partial sum of the column reductions (fixed: the sum order is fixed).
const COLSUM_CHUNK_ROWS: usize = 256;
/// Threads per block of `act_backward_colsum` (`ACT_COLSUM_THREADS` in math.cu).
const ACT_COLSUM_THREADS: u32 = 256;
/// At most this many row chunks in `act_backward_colsum`: its last block adds
/// `chunks` partials per column, so few chunks keep that tail short.
const ACT_COLSUM_MAX_CHUNKS: usize = 64;

/// Rows per chunk of `act_backward_colsum` for `rows` rows: a multiple of 8
/// (one share per warp), at least 8, and few enough chunks
/// ([`ACT_COLSUM_MAX_CHUNKS`]). Fixed by `rows`, so the sum order is too.
fn act_colsum_chunk_rows(rows: usize) -> usize {
    rows.div_ceil(ACT_COLSUM_MAX_CHUNKS)
        .next_multiple_of(8)
        .max(8)
}
/// Threads of `xent_reduce` (`XENT_REDUCE_THREADS` in math.cu).
const XENT_REDUCE_THREADS: u32 = 256;
/// Stream index of dropout's keys (so a dropout seed never reuses another op's
/// stream of the same seed).
const DROPOUT_STREAM: u64 = 0x64_726f_706f_7574; // "dropout"

/// `rows × cols`, or `InvalidArgument` naming `what` on overflow.
pub(crate) fn elems(what: &'static str, rows: usize, cols: usize) -> Result<usize> {
    rows.checked_mul(cols)
        .ok_or_else(|| GpuOpsError::InvalidArgument {
            name: what,
            reason: format!("{rows} × {cols} overflows"),
        })
}

/// A dropout mask on the device: bit `i % 32` of word `i / 32` keeps element `i`.
pub struct CudaMask {
    pub(crate) words: CudaBuf<u32>,
    pub(crate) len: usize,
    pub(crate) scale: f32,
}

impl CudaMask {
    /// An error naming `what` unless the mask covers `n` elements.
    fn check_covers(&self, what: &'static str, n: usize) -> Result<()> {
        if n > self.len {
            return Err(GpuOpsError::SizeMismatch {
                what,
                expected: self.len,
                found: n,
            });
        }
        Ok(())
    }
}

impl std::fmt::Debug for CudaMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaMask")
            .field("len", &self.len)
            .field("scale", &self.scale)
            .finish()
    }
}

impl CudaBackend {
    fn grid_threads(&self, n: usize) -> Grid {
        Grid::threads_for(n as u64, self.kernels.max_blocks())
    }

    fn grid_warps(&self, n: usize) -> Grid {
        Grid::warps_for(n as u64, self.kernels.max_blocks())
    }

    /// `out[c] (+)= Σ_r w(r, c) x[r, c]` over a row-major `rows × cols` matrix, in a
    /// fixed order; `w(r, c) = weights[r · stride + c / div]` when given, else 1.
    pub(crate) fn colsum(
        &self,
        x: Ptr<f32>,
        rows: usize,
        cols: usize,
        weights: Option<(Ptr<f32>, usize, usize)>,
        out: PtrMut<f32>,
        accumulate: bool,
    ) -> Result<()> {
        if cols == 0 {
            return Ok(());
        }
        let chunks = rows.div_ceil(COLSUM_CHUNK_ROWS);
        let mut partial = self.buf::<f32>(
            elems("chunks × cols", chunks, cols)?,
            Init::Uninit,
            "column sum partials",
        )?;
        let (w, has_w, stride, div) = match weights {
            Some((w, stride, div)) => (w, 1u32, stride as u64, div.max(1) as u64),
            None => (Ptr::null(), 0u32, 0u64, 1u64),
        };
        launch::colsum_partial {
            x,
            rows: rows as u64,
            cols: cols as u64,
            chunk_rows: COLSUM_CHUNK_ROWS as u64,
            w,
            has_w,
            w_stride: stride,
            w_div: div,
            partial: partial.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.grid_threads(chunks * cols))?;
        launch::colsum_finish {
            partial: partial.ptr(),
            chunks: chunks as u64,
            cols: cols as u64,
            out,
            accumulate: u32::from(accumulate),
        }
        .launch(&self.kernels, self.cu(), self.grid_threads(cols))
    }

    fn check_alpha(alpha: f32) -> Result<()> {
        if !(alpha.is_finite() && alpha > 0.0) {
            return Err(GpuOpsError::InvalidArgument {
                name: "alpha",
                reason: format!("ELU alpha must be finite and > 0, got {alpha}"),
            });
        }
        Ok(())
    }

    /// Dropout's keep threshold and scale for probability `p` (as
    /// `cpu_ops::dropout`: keep when the 16-bit draw >= round(p · 2^16)).
    fn dropout_params(p: f32) -> Result<(u32, f32)> {
        if !(0.0..=1.0).contains(&p) {
            return Err(GpuOpsError::InvalidArgument {
                name: "p",
                reason: format!("dropout probability must be in [0, 1], got {p}"),
            });
        }
        let p64 = f64::from(p);
        let threshold = (p64 * 65_536.0).round() as u32;
        let scale = if p < 1.0 {
            (1.0 / (1.0 - p64)) as f32
        } else {
            0.0
        };
        Ok((threshold, scale))
    }

    /// The kernels' activation code (0 ReLU, 1 ELU) and alpha.
    fn activation_code(act: Activation) -> Result<(u32, f32)> {
        match act {
            Activation::Relu => Ok((0, 0.0)),
            Activation::Elu { alpha } => {
                Self::check_alpha(alpha)?;
                Ok((1, alpha))
            }
        }
    }
}

/// Adam's hyper-parameters: finite; `lr, eps, weight_decay >= 0`; `β ∈ [0, 1)`;
/// `step >= 1`.
fn check_adam(hp: &AdamStep) -> Result<()> {
    let bad = |name: &'static str, v: f32, range: &str| {
        Err(GpuOpsError::InvalidArgument {
            name,
            reason: format!("must be finite and {range}, got {v}"),
        })
    };
    if !(hp.lr.is_finite() && hp.lr >= 0.0) {
        return bad("lr", hp.lr, ">= 0");
    }
    if !(hp.beta1.is_finite() && (0.0..1.0).contains(&hp.beta1)) {
        return bad("beta1", hp.beta1, "in [0, 1)");
    }
    if !(hp.beta2.is_finite() && (0.0..1.0).contains(&hp.beta2)) {
        return bad("beta2", hp.beta2, "in [0, 1)");
    }
    if !(hp.eps.is_finite() && hp.eps >= 0.0) {
        return bad("eps", hp.eps, ">= 0");
    }
    if !(hp.weight_decay.is_finite() && hp.weight_decay >= 0.0) {
        return bad("weight_decay", hp.weight_decay, ">= 0");
    }
    if hp.step == 0 {
        return Err(GpuOpsError::InvalidArgument {
            name: "step",
            reason: "Adam steps count from 1 (bias correction divides by 1 − β^step)".into(),
        });
    }
    Ok(())
}

impl DenseOps for CudaBackend {
    /// [`crate::DenseOps::widen_bf16`].
    fn widen_bf16(&self, src: &CudaBuf<u16>, n: usize, out: &mut CudaBuf<f32>) -> Result<()> {
        src.check_len("widen_bf16 source", n)?;
        out.check_len("widen_bf16 output", n)?;
        if n == 0 {
            return Ok(());
        }
        launch::widen_bf16 {
            src: src.ptr(),
            n: n as u64,
            out: out.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.grid_threads(n.div_ceil(2)))
    }

    /// [`crate::DenseOps::widen_bf16_at`]: the same kernel on offset pointers
    /// (it handles unaligned sources and stores one value at a time).
    fn widen_bf16_at(
        &self,
        src: &CudaBuf<u16>,
        src_at: usize,
        n: usize,
        out: &mut CudaBuf<f32>,
        out_at: usize,
    ) -> Result<()> {
        src.check_len("widen_bf16_at source", src_at.saturating_add(n))?;
        out.check_len("widen_bf16_at output", out_at.saturating_add(n))?;
        if n == 0 {
            return Ok(());
        }
        launch::widen_bf16 {
            src: src.ptr().offset(src_at),
            n: n as u64,
            out: out.ptr_mut().offset(out_at),
        }
        .launch(&self.kernels, self.cu(), self.grid_threads(n.div_ceil(2)))
    }

    fn scale(&self, x: &mut CudaBuf<f32>, n: usize, alpha: f32) -> Result<()> {
        x.check_len("scale x", n)?;
        if n == 0 {
            return Ok(());
        }
        launch::scale_in_place {
            x: x.ptr_mut(),
            n: n as u64,
            alpha,
        }
        .launch(&self.kernels, self.cu(), self.grid_threads(n))
    }

    fn count_nonfinite(&self, x: &CudaBuf<f32>, n: usize, count: &mut CudaBuf<u32>) -> Result<()> {
        crate::backend::check_count_len(n)?;
        x.check_len("count_nonfinite x", n)?;
        count.check_len("count_nonfinite count", 1)?;
        if n == 0 {
            return Ok(());
        }
        launch::count_nonfinite {
            x: x.ptr(),
            n: n as u64,
            count: count.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.grid_threads(n))
    }

    /// `C = A·B` (`+ C` when accumulating), row-major, via cuBLAS.
    fn matmul(
        &self,
        a: DevMat<'_, Self>,
        b: DevMat<'_, Self>,
        c: &mut CudaBuf<f32>,
        accumulate: bool,
    ) -> Result<()> {
        let (m, n, k) = a.product_dims(&b)?;
        let (trans_a, trans_b) = (a.is_transposed(), b.is_transposed());
        let (a, b) = (a.buf(), b.buf());
        a.check_len("gemm A (m × k values)", elems("m × k", m, k)?)?;
        b.check_len("gemm B (k × n values)", elems("k × n", k, n)?)?;
        let mn = elems("m × n", m, n)?;
        c.check_len("gemm C (m × n values)", mn)?;
        if mn == 0 {
            return Ok(());
        }
        if k == 0 {
            // An empty sum: C = 0, or C unchanged when accumulating.
            return if accumulate {
                Ok(())
            } else {
                self.fill_bytes(c, mn, 0)
            };
        }
        let p = ColMajorGemm::from_row_major(trans_a, trans_b, m, n, k)?;
        self.bind()?;
        if let Some(lt) = &self.gemm_lt {
            // The opt-in cuBLASLt path (`TANDEM_GEMM`, gemm_lt.rs): the same
            // column-major problem, split-K restricted.
            let ptrs = (b.raw(), a.raw(), c.raw());
            return lt.matmul(&p, ptrs, accumulate, self.blas_math(), self.cu());
        }
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        self.with_blas(|h| {
            // SAFETY: `h` is this backend's live handle, bound to the compute stream
            // (so the product is ordered after earlier ops). A, B and C hold at least
            // m·k, k·n and m·n values (checked), which is what the column-major view
            // of `p` reads and writes; alpha and beta live on the host for the call
            // (pointer mode host). With beta = 0, C is not read.
            unsafe {
                cublas::result::sgemm(
                    h,
                    op(p.op_first),
                    op(p.op_second),
                    p.m,
                    p.n,
                    p.k,
                    &alpha,
                    b.raw() as *const f32,
                    p.ld_first,
                    a.raw() as *const f32,
                    p.ld_second,
                    &beta,
                    c.raw() as *mut f32,
                    p.ldc,
                )
            }
        })
        .map_err(blas_err("cublasSgemm"))
    }

    /// `x[r] += bias` for `r < rows`.
    fn add_bias(
        &self,
        x: &mut CudaBuf<f32>,
        rows: usize,
        cols: usize,
        bias: &CudaBuf<f32>,
    ) -> Result<()> {
        let n = elems("rows × cols", rows, cols)?;
        x.check_len("add_bias x (rows × cols values)", n)?;
        bias.check_len("add_bias bias (cols values)", cols)?;
        launch::add_bias {
            x: x.ptr_mut(),
            bias: bias.ptr(),
            rows: rows as u64,
            cols: cols as u64,
        }
        .launch(&self.kernels, self.cu(), self.grid_threads(n))
    }

    /// `dbias (+)= Σ_r dy[r]`.
    fn bias_grad(
        &self,
        dy: &CudaBuf<f32>,
        rows: usize,
        cols: usize,
        dbias: &mut CudaBuf<f32>,
        accumulate: bool,
    ) -> Result<()> {
        dy.check_len(
            "bias_grad dy (rows × cols values)",
            elems("rows × cols", rows, cols)?,
        )?;
        dbias.check_len("bias_grad dbias (cols values)", cols)?;
        self.colsum(dy.ptr(), rows, cols, None, dbias.ptr_mut(), accumulate)
    }

    fn relu(&self, x: &mut CudaBuf<f32>, n: usize) -> Result<()> {
        x.check_len("relu x", n)?;
        launch::relu_forward {
            x: x.ptr_mut(),
            n: n as u64,
        }
        .launch(&self.kernels, self.cu(), self.grid_threads(n))
    }

    fn relu_backward(&self, y: &CudaBuf<f32>, dy: &mut CudaBuf<f32>, n: usize) -> Result<()> {
        y.check_len("relu_backward y", n)?;
        dy.check_len("relu_backward dy", n)?;
        launch::relu_backward {
            y: y.ptr(),
            dy: dy.ptr_mut(),
            n: n as u64,
        }
        .launch(&self.kernels, self.cu(), self.grid_threads(n))
    }

    fn elu(&self, x: &mut CudaBuf<f32>, n: usize, alpha: f32) -> Result<()> {
        Self::check_alpha(alpha)?;
        x.check_len("elu x", n)?;
        launch::elu_forward {
            x: x.ptr_mut(),
            n: n as u64,
            alpha,
        }
        .launch(&self.kernels, self.cu(), self.grid_threads(n))
    }

    fn elu_backward(
        &self,
        y: &CudaBuf<f32>,
        dy: &mut CudaBuf<f32>,
        n: usize,
        alpha: f32,
    ) -> Result<()> {
        Self::check_alpha(alpha)?;
        y.check_len("elu_backward y", n)?;
        dy.check_len("elu_backward dy", n)?;
        launch::elu_backward {
            y: y.ptr(),
            dy: dy.ptr_mut(),
            n: n as u64,
            alpha,
        }
        .launch(&self.kernels, self.cu(), self.grid_threads(n))
    }

    /// Inverted dropout (mask from `(seed, index)`, module doc of `math.cu`).
    fn dropout(&self, x: &mut CudaBuf<f32>, n: usize, p: f32, seed: u64) -> Result<CudaMask> {
        let (threshold, scale) = Self::dropout_params(p)?;
        x.check_len("dropout x", n)?;
        let words = n.div_ceil(32);
        let mut mask = self.buf::<u32>(words, Init::Uninit, "dropout mask")?;
        let key = cpu_ops::derive_seed(seed, DROPOUT_STREAM);
        launch::dropout_forward {
            x: x.ptr_mut(),
            n: n as u64,
            threshold,
            scale,
            key,
            mask: mask.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.grid_warps(words))?;
        Ok(CudaMask {
            words: mask,
            len: n,
            scale,
        })
    }

    /// One kernel (`bias_act_dropout`).
    fn bias_act_dropout(
        &self,
        x: &mut CudaBuf<f32>,
        rows: usize,
        cols: usize,
        bias: &CudaBuf<f32>,
        act: Activation,
        dropout: Option<(f32, u64, &mut CudaBuf<f32>)>,
    ) -> Result<Option<CudaMask>> {
        let n = elems("rows × cols", rows, cols)?;
        x.check_len("bias_act_dropout x (rows × cols values)", n)?;
        bias.check_len("bias_act_dropout bias (cols values)", cols)?;
        let (act_code, alpha) = Self::activation_code(act)?;
        let words = n.div_ceil(32);
        let (has_drop, threshold, scale, key, out, mut mask) = match dropout {
            Some((p, seed, out)) => {
                let (threshold, scale) = Self::dropout_params(p)?;
                out.check_len("bias_act_dropout out (rows × cols values)", n)?;
                let mask = self.buf::<u32>(words, Init::Uninit, "dropout mask")?;
                let key = cpu_ops::derive_seed(seed, DROPOUT_STREAM);
                (1u32, threshold, scale, key, out.ptr_mut(), Some(mask))
            }
            None => (0u32, 0, 0.0, 0, PtrMut::null(), None),
        };
        launch::bias_act_dropout {
            x: x.ptr_mut(),
            bias: bias.ptr(),
            rows: rows as u64,
            cols: cols as u64,
            act: act_code,
            alpha,
            has_drop,
            threshold,
            scale,
            key,
            out,
            mask: mask.as_mut().map_or(PtrMut::null(), CudaBuf::ptr_mut),
        }
        .launch(&self.kernels, self.cu(), self.grid_warps(words))?;
        Ok(mask.map(|words| CudaMask {
            words,
            len: n,
            scale,
        }))
    }

    /// One kernel (`dropout_act_backward`).
    fn dropout_act_backward(
        &self,
        mask: &CudaMask,
        y: &CudaBuf<f32>,
        dy: &mut CudaBuf<f32>,
        n: usize,
        act: Activation,
    ) -> Result<()> {
        mask.check_covers("dropout_act_backward n (elements the mask covers)", n)?;
        y.check_len("dropout_act_backward y", n)?;
        dy.check_len("dropout_act_backward dy", n)?;
        let (act_code, alpha) = Self::activation_code(act)?;
        launch::dropout_act_backward {
            mask: mask.words.ptr(),
            y: y.ptr(),
            dy: dy.ptr_mut(),
            n: n as u64,
            scale: mask.scale,
            act: act_code,
            alpha,
        }
        .launch(&self.kernels, self.cu(), self.grid_threads(n))
    }

    /// One kernel (`act_backward_colsum`): the gradient as the unfused ops, the
    /// column sums in chunks of `act_colsum_chunk_rows` rows.
    fn act_backward_bias_grad(
        &self,
        back: ActBackward<'_, Self>,
        dy: &mut CudaBuf<f32>,
        rows: usize,
        cols: usize,
        dbias: &mut CudaBuf<f32>,
    ) -> Result<()> {
        let n = elems("rows × cols", rows, cols)?;
        if let Some(mask) = back.mask {
            mask.check_covers(
                "act_backward_bias_grad rows × cols (elements the mask covers)",
                n,
            )?;
        }
        back.y
            .check_len("act_backward_bias_grad y (rows × cols values)", n)?;
        dy.check_len("act_backward_bias_grad dy (rows × cols values)", n)?;
        dbias.check_len("act_backward_bias_grad dbias (cols values)", cols)?;
        let (act, alpha) = Self::activation_code(back.act)?;
        if cols == 0 {
            return Ok(());
        }
        let chunk_rows = act_colsum_chunk_rows(rows);
        let chunks = rows.div_ceil(chunk_rows);
        let items = chunks * cols.div_ceil(32);
        let mut partial = self.buf::<f32>(
            elems("chunks × cols", chunks, cols)?.max(1),
            Init::Uninit,
            "column sum partials",
        )?;
        let blocks = items.clamp(1, self.kernels.max_blocks() as usize) as u32;
        launch::act_backward_colsum {
            mask: back.mask.map_or(Ptr::null(), |m| m.words.ptr()),
            has_mask: u32::from(back.mask.is_some()),
            y: back.y.ptr(),
            dy: dy.ptr_mut(),
            rows: rows as u64,
            cols: cols as u64,
            scale: back.mask.map_or(1.0, |m| m.scale),
            act,
            alpha,
            chunk_rows: chunk_rows as u64,
            partial: partial.ptr_mut(),
            ticket: PtrMut::new(self.ticket.raw()),
            out: dbias.ptr_mut(),
            accumulate: 0,
        }
        .launch(
            &self.kernels,
            self.cu(),
            Grid::exact(blocks, ACT_COLSUM_THREADS),
        )
    }

    fn dropout_backward(&self, mask: &CudaMask, dy: &mut CudaBuf<f32>, n: usize) -> Result<()> {
        mask.check_covers("dropout_backward n (elements the mask covers)", n)?;
        dy.check_len("dropout_backward dy", n)?;
        launch::dropout_backward {
            mask: mask.words.ptr(),
            dy: dy.ptr_mut(),
            n: n as u64,
            scale: mask.scale,
        }
        .launch(&self.kernels, self.cu(), self.grid_threads(n))
    }

    /// Mean softmax cross-entropy and correct count (synchronizes).
    fn softmax_cross_entropy(
        &self,
        logits: &CudaBuf<f32>,
        rows: usize,
        classes: usize,
        labels: &CudaBuf<u32>,
        grad: Option<&mut CudaBuf<f32>>,
    ) -> Result<LossStats> {
        let inp = XentInputs {
            logits,
            rows,
            classes,
            labels,
        };
        if rows == 0 {
            self.check_xent(&inp, grad.as_deref())?;
            return Ok(LossStats {
                loss: 0.0,
                correct: 0,
            });
        }
        self.read_loss(rows, |totals| {
            self.xent_into(&inp, grad, totals, PtrMut::null())
        })
    }

    /// No read: the loss sum and correct count stay in `out[2·slot..]` and a
    /// non-finite sum sets the guard, all on the compute stream.
    fn softmax_cross_entropy_deferred(
        &self,
        inp: &XentInputs<'_, Self>,
        grad: &mut CudaBuf<f32>,
        dest: LossSlot<'_, Self>,
        guard: &mut CudaBuf<u32>,
    ) -> Result<()> {
        let LossSlot { out, slot } = dest;
        out.check_len("deferred loss slots (2 words per slot)", 2 * slot + 2)?;
        guard.check_len("loss guard", 1)?;
        if inp.rows == 0 {
            self.check_xent(inp, Some(grad))?;
            self.fill_bytes_at(out, 2 * slot, 2, 0)?;
            return Ok(());
        }
        self.xent_into(
            inp,
            Some(grad),
            out.ptr_mut().offset(2 * slot),
            guard.ptr_mut(),
        )
    }

    /// One launch for every tensor (`adam_multi`), the guard read on the device.
    /// The table of addresses and offsets is uploaded when it changes (the
    /// parameters of a model keep their buffers, so once per model).
    fn adam_step_all(
        &self,
        hp: &AdamStep,
        tensors: AdamTensors<'_, Self>,
        guard: Option<&CudaBuf<u32>>,
    ) -> Result<()> {
        check_adam(hp)?;
        let t = tensors.count()?;
        let AdamTensors {
            params,
            grads,
            m,
            v,
            lens,
        } = tensors;
        if t > u32::MAX as usize {
            return Err(GpuOpsError::InvalidArgument {
                name: "adam_step_all",
                reason: format!("{t} tensors; one launch takes up to 2^32 − 1"),
            });
        }
        let mut table = Vec::with_capacity(5 * t + 1);
        let mut offsets = Vec::with_capacity(t + 1);
        let mut total = 0usize;
        for i in 0..t {
            let n = lens[i];
            params[i].check_len("adam param", n)?;
            grads[i].check_len("adam grad", n)?;
            m[i].check_len("adam first moment", n)?;
            v[i].check_len("adam second moment", n)?;
            table.extend([params[i].raw(), grads[i].raw(), m[i].raw(), v[i].raw()]);
            offsets.push(total as u64);
            total += n;
        }
        offsets.push(total as u64);
        table.extend(offsets);
        if total == 0 {
            return Ok(());
        }
        let f = AdamFactors::of(hp);
        let mut cached = self.adam_table.lock();
        let fresh = match cached.as_ref() {
            Some((words, _)) => *words != table,
            None => true,
        };
        if fresh {
            let mut buf = self.buf::<u64>(table.len(), Init::Uninit, "adam table")?;
            self.upload_slice(&self.compute, &table, &mut buf)?;
            *cached = Some((table, buf));
        }
        let dev_table =
            cached
                .as_ref()
                .map(|(_, b)| b.ptr())
                .ok_or_else(|| GpuOpsError::InvalidArgument {
                    name: "adam_step_all",
                    reason: "internal: the table was not kept".into(),
                })?;
        launch::adam_multi {
            table: dev_table,
            tensors: t as u32,
            total: total as u64,
            guard: guard.map_or(Ptr::null(), CudaBuf::ptr),
            beta1: hp.beta1,
            beta2: hp.beta2,
            one_minus_beta1: f.one_minus_beta1,
            one_minus_beta2: f.one_minus_beta2,
            eps: hp.eps,
            weight_decay: hp.weight_decay,
            step_size: f.step_size,
            inv_bias2_sqrt: f.inv_bias2_sqrt,
        }
        .launch(&self.kernels, self.cu(), self.grid_threads(total))
    }

    /// One Adam step (PyTorch `Adam`, L2 decay), factors computed in f64 as
    /// `cpu_ops::Adam` does.
    fn adam_step(
        &self,
        hp: &AdamStep,
        param: &mut CudaBuf<f32>,
        grad: &CudaBuf<f32>,
        m: &mut CudaBuf<f32>,
        v: &mut CudaBuf<f32>,
        n: usize,
    ) -> Result<()> {
        check_adam(hp)?;
        param.check_len("adam param", n)?;
        grad.check_len("adam grad", n)?;
        m.check_len("adam first moment", n)?;
        v.check_len("adam second moment", n)?;
        let f = AdamFactors::of(hp);
        launch::adam_step {
            param: param.ptr_mut(),
            grad: grad.ptr(),
            m: m.ptr_mut(),
            v: v.ptr_mut(),
            n: n as u64,
            beta1: hp.beta1,
            beta2: hp.beta2,
            one_minus_beta1: f.one_minus_beta1,
            one_minus_beta2: f.one_minus_beta2,
            eps: hp.eps,
            weight_decay: hp.weight_decay,
            step_size: f.step_size,
            inv_bias2_sqrt: f.inv_bias2_sqrt,
        }
        .launch(&self.kernels, self.cu(), self.grid_threads(n))
    }
}

/// Adam's per-step factors, computed in f64 as `cpu_ops::Adam` does.
struct AdamFactors {
    one_minus_beta1: f32,
    one_minus_beta2: f32,
    step_size: f32,
    inv_bias2_sqrt: f32,
}

impl AdamFactors {
    fn of(hp: &AdamStep) -> Self {
        let t = hp.step.min(i32::MAX as u64) as i32;
        let (b1, b2) = (f64::from(hp.beta1), f64::from(hp.beta2));
        let bias1 = 1.0 - b1.powi(t);
        let bias2_sqrt = (1.0 - b2.powi(t)).sqrt();
        Self {
            one_minus_beta1: (1.0 - b1) as f32,
            one_minus_beta2: (1.0 - b2) as f32,
            step_size: (f64::from(hp.lr) / bias1) as f32,
            inv_bias2_sqrt: (1.0 / bias2_sqrt) as f32,
        }
    }
}

impl CudaBackend {
    /// The mean loss and correct count of `rows > 0` rows that `write` puts
    /// into two device words (the f64 bits of the loss sum, then the count),
    /// read with one synchronization.
    pub(crate) fn read_loss(
        &self,
        rows: usize,
        write: impl FnOnce(PtrMut<u64>) -> Result<()>,
    ) -> Result<LossStats> {
        let mut totals = self.buf::<u64>(2, Init::Uninit, "loss totals")?;
        write(totals.ptr_mut())?;
        let mut out = [0u64; 2];
        self.download_slice(&self.compute, &totals, &mut out)?;
        Ok(LossStats {
            loss: f64::from_bits(out[0]) / rows as f64,
            correct: out[1] as usize,
        })
    }

    /// The argument checks of the softmax cross-entropy.
    fn check_xent(&self, inp: &XentInputs<'_, Self>, grad: Option<&CudaBuf<f32>>) -> Result<usize> {
        let &XentInputs {
            logits,
            rows,
            classes,
            labels,
        } = inp;
        let n = elems("rows × classes", rows, classes)?;
        logits.check_len("softmax_cross_entropy logits (rows × classes values)", n)?;
        labels.check_len("softmax_cross_entropy labels (one per row)", rows)?;
        if let Some(g) = grad {
            g.check_len("softmax_cross_entropy grad (rows × classes values)", n)?;
        }
        if rows > 0 && classes == 0 {
            return Err(GpuOpsError::InvalidArgument {
                name: "classes",
                reason: format!("{rows} rows need at least one class"),
            });
        }
        Ok(n)
    }

    /// `xent_rows` then `xent_reduce` into `out_loss` (the f64 sum) and the
    /// next word (the correct count); `guard` may be null. `rows > 0`.
    fn xent_into(
        &self,
        inp: &XentInputs<'_, Self>,
        grad: Option<&mut CudaBuf<f32>>,
        out: PtrMut<u64>,
        guard: PtrMut<u32>,
    ) -> Result<()> {
        self.check_xent(inp, grad.as_deref())?;
        let &XentInputs {
            logits,
            rows,
            classes,
            labels,
        } = inp;
        let (grad_ptr, has_grad) = match grad {
            Some(g) => (g.ptr_mut(), 1u32),
            None => (PtrMut::null(), 0u32),
        };
        self.reduce_rows(rows, out, guard, |row_loss, row_correct| {
            launch::xent_rows {
                logits: logits.ptr(),
                rows: rows as u64,
                classes: classes as u64,
                labels: labels.ptr(),
                grad: grad_ptr,
                has_grad,
                inv_rows: (1.0 / rows as f64) as f32,
                row_loss,
                row_correct,
                fault: self.fault_ptr(),
            }
            .launch(&self.kernels, self.cu(), self.grid_warps(rows))
        })
    }

    /// A loss over `rows > 0` rows: `per_row` writes each row's loss and
    /// correct flag into the two buffers it is given, then `xent_reduce` sums
    /// them (fixed order, f64) into `out` (the sum's bits, then the count),
    /// setting `guard` (unless null) on a non-finite sum.
    pub(crate) fn reduce_rows(
        &self,
        rows: usize,
        out: PtrMut<u64>,
        guard: PtrMut<u32>,
        per_row: impl FnOnce(PtrMut<f32>, PtrMut<u32>) -> Result<()>,
    ) -> Result<()> {
        let mut row_loss = self.buf::<f32>(rows, Init::Uninit, "loss per row")?;
        let mut row_correct = self.buf::<u32>(rows, Init::Uninit, "correct per row")?;
        per_row(row_loss.ptr_mut(), row_correct.ptr_mut())?;
        launch::xent_reduce {
            row_loss: row_loss.ptr(),
            row_correct: row_correct.ptr(),
            rows: rows as u64,
            out_loss: out.cast(),
            out_correct: out.offset(1),
            guard,
        }
        .launch(
            &self.kernels,
            self.cu(),
            Grid::exact(1, XENT_REDUCE_THREADS),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fused column sums' chunks: a multiple of 8 rows (one share per
    /// warp), at least 8, at most `ACT_COLSUM_MAX_CHUNKS` of them, covering
    /// every row.
    #[test]
    fn act_colsum_chunks_are_few_and_split_by_warp() {
        for rows in [
            0usize,
            1,
            7,
            8,
            63,
            64,
            512,
            513,
            1024,
            6001,
            60_000,
            1 << 24,
        ] {
            let c = act_colsum_chunk_rows(rows);
            assert!(c >= 8 && c.is_multiple_of(8), "{rows}: {c}");
            assert!(rows.div_ceil(c) <= ACT_COLSUM_MAX_CHUNKS, "{rows}: {c}");
            assert!(rows.div_ceil(c) * c >= rows);
        }
        assert_eq!(act_colsum_chunk_rows(1024), 16);
    }

    #[test]
    fn adam_hyper_parameters_are_checked() {
        let ok = AdamStep {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            step: 1,
        };
        assert!(check_adam(&ok).is_ok());
        for (bad, name) in [
            (AdamStep { step: 0, ..ok }, "step"),
            (AdamStep { lr: -1.0, ..ok }, "lr"),
            (AdamStep { beta1: 1.0, ..ok }, "beta1"),
            (
                AdamStep {
                    beta2: f32::NAN,
                    ..ok
                },
                "beta2",
            ),
            (AdamStep { eps: -1e-8, ..ok }, "eps"),
            (
                AdamStep {
                    weight_decay: f32::INFINITY,
                    ..ok
                },
                "weight_decay",
            ),
        ] {
            match check_adam(&bad) {
                Err(GpuOpsError::InvalidArgument { name: got, .. }) => assert_eq!(got, name),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
