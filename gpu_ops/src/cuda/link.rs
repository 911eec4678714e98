//! [`LinkOps`] for the CUDA backend (kernels in `kernels/link.cu`): pair
//! scores with a warp per pair (the backwards add with float atomics), the
//! binary cross-entropy's per-pair terms summed by `math.cu`'s `xent_reduce`
//! (the softmax loss's fixed-order f64 sum and its deferred-loss guard),
//! negatives drawn with the host's counter-based generator (identical
//! vertices), and edge exclusion as flags, a scan and a compaction.

use super::alloc::{CudaBuf, Init};
use super::device::CudaBackend;
use super::kernels::{launch, Grid, PtrMut};
use super::sampling::CudaBlock;
use crate::backend::{
    check_exclude_dst, check_negatives, DeviceMemory, ExcludedPairs, LinkOps, LossSlot, LossStats,
    NegativeDist,
};
use crate::error::{GpuOpsError, Result};

/// The arguments every pair op checks: `dim ≥ 1` and `n` ids in `src` and
/// `dst`; returns the rows of `h` (`len(h) / dim`), the bound the kernels
/// check each id against.
fn pair_rows(
    h: &CudaBuf<f32>,
    dim: usize,
    src: &CudaBuf<u32>,
    dst: &CudaBuf<u32>,
    n: usize,
) -> Result<u64> {
    if dim == 0 {
        return Err(GpuOpsError::InvalidArgument {
            name: "dim",
            reason: "pair rows need at least one column".into(),
        });
    }
    src.check_len("pair sources (n)", n)?;
    dst.check_len("pair destinations (n)", n)?;
    Ok((h.len() / dim) as u64)
}

/// `n × dim`, or `InvalidArgument` on overflow.
fn pair_values(n: usize, dim: usize) -> Result<usize> {
    super::dense::elems("n × dim", n, dim)
}

impl CudaBackend {
    fn link_threads(&self, n: usize) -> Grid {
        Grid::threads_for(n as u64, self.kernels.max_blocks())
    }

    fn link_warps(&self, n: usize) -> Grid {
        Grid::warps_for(n as u64, self.kernels.max_blocks())
    }

    /// `bce_rows` then `xent_reduce` ([`CudaBackend::reduce_rows`]) into `out`
    /// (the f64 sum, then the correct count); `guard` may be null. `n > 0`,
    /// lengths checked.
    fn bce_into(
        &self,
        logits: &CudaBuf<f32>,
        labels: &CudaBuf<f32>,
        n: usize,
        grad: Option<&mut CudaBuf<f32>>,
        out: PtrMut<u64>,
        guard: PtrMut<u32>,
    ) -> Result<()> {
        let (grad, has_grad) = match grad {
            Some(g) => (g.ptr_mut(), 1u32),
            None => (PtrMut::null(), 0u32),
        };
        self.reduce_rows(n, out, guard, |row_loss, row_correct| {
            launch::bce_rows {
                logits: logits.ptr(),
                labels: labels.ptr(),
                n: n as u64,
                grad,
                has_grad,
                inv_n: (1.0 / n as f64) as f32,
                row_loss,
                row_correct,
            }
            .launch(&self.kernels, self.cu(), self.link_threads(n))
        })
    }

    /// The loss's argument checks.
    fn check_bce(
        logits: &CudaBuf<f32>,
        labels: &CudaBuf<f32>,
        n: usize,
        grad: Option<&CudaBuf<f32>>,
    ) -> Result<()> {
        logits.check_len("bce_with_logits logits (n)", n)?;
        labels.check_len("bce_with_logits labels (n)", n)?;
        if let Some(g) = grad {
            g.check_len("bce_with_logits gradient (n)", n)?;
        }
        Ok(())
    }

    /// A copy of `block` (nothing to exclude).
    fn copy_block(&self, block: &CudaBlock) -> Result<CudaBlock> {
        let mut indptr = self.buf::<u64>(block.num_dst + 1, Init::Uninit, "block indptr")?;
        self.copy(&block.indptr, &mut indptr, block.num_dst + 1)?;
        let mut indices = self.buf::<u32>(block.num_edges, Init::Uninit, "block indices")?;
        self.copy(&block.indices, &mut indices, block.num_edges)?;
        self.finish_block(
            block.num_src,
            block.num_dst,
            block.num_edges,
            indptr,
            indices,
        )
    }
}

impl LinkOps for CudaBackend {
    fn pair_dot(
        &self,
        h: &CudaBuf<f32>,
        dim: usize,
        src: &CudaBuf<u32>,
        dst: &CudaBuf<u32>,
        n: usize,
        out: &mut CudaBuf<f32>,
    ) -> Result<()> {
        let rows = pair_rows(h, dim, src, dst, n)?;
        out.check_len("pair_dot output (n)", n)?;
        launch::pair_dot {
            h: h.ptr(),
            rows,
            dim: dim as u64,
            src: src.ptr(),
            dst: dst.ptr(),
            n: n as u64,
            out: out.ptr_mut(),
            fault: self.fault_ptr(),
        }
        .launch(&self.kernels, self.cu(), self.link_warps(n))
    }

    fn pair_dot_backward(
        &self,
        h: &CudaBuf<f32>,
        dim: usize,
        src: &CudaBuf<u32>,
        dst: &CudaBuf<u32>,
        n: usize,
        dscore: &CudaBuf<f32>,
        dh: &mut CudaBuf<f32>,
    ) -> Result<()> {
        let rows = pair_rows(h, dim, src, dst, n)?.min((dh.len() / dim) as u64);
        dscore.check_len("pair_dot_backward score gradient (n)", n)?;
        launch::pair_dot_backward {
            h: h.ptr(),
            rows,
            dim: dim as u64,
            src: src.ptr(),
            dst: dst.ptr(),
            n: n as u64,
            dscore: dscore.ptr(),
            dh: dh.ptr_mut(),
            fault: self.fault_ptr(),
        }
        .launch(&self.kernels, self.cu(), self.link_warps(n))
    }

    fn pair_hadamard(
        &self,
        h: &CudaBuf<f32>,
        dim: usize,
        src: &CudaBuf<u32>,
        dst: &CudaBuf<u32>,
        n: usize,
        out: &mut CudaBuf<f32>,
    ) -> Result<()> {
        let rows = pair_rows(h, dim, src, dst, n)?;
        out.check_len("pair_hadamard output (n × dim)", pair_values(n, dim)?)?;
        launch::pair_hadamard {
            h: h.ptr(),
            rows,
            dim: dim as u64,
            src: src.ptr(),
            dst: dst.ptr(),
            n: n as u64,
            out: out.ptr_mut(),
            fault: self.fault_ptr(),
        }
        .launch(&self.kernels, self.cu(), self.link_warps(n))
    }

    fn pair_hadamard_backward(
        &self,
        h: &CudaBuf<f32>,
        dim: usize,
        src: &CudaBuf<u32>,
        dst: &CudaBuf<u32>,
        n: usize,
        dz: &CudaBuf<f32>,
        dh: &mut CudaBuf<f32>,
    ) -> Result<()> {
        let rows = pair_rows(h, dim, src, dst, n)?.min((dh.len() / dim) as u64);
        dz.check_len(
            "pair_hadamard_backward gradient (n × dim)",
            pair_values(n, dim)?,
        )?;
        launch::pair_hadamard_backward {
            h: h.ptr(),
            rows,
            dim: dim as u64,
            src: src.ptr(),
            dst: dst.ptr(),
            n: n as u64,
            dz: dz.ptr(),
            dh: dh.ptr_mut(),
            fault: self.fault_ptr(),
        }
        .launch(&self.kernels, self.cu(), self.link_warps(n))
    }

    /// Mean loss and correct count (synchronizes).
    fn bce_with_logits(
        &self,
        logits: &CudaBuf<f32>,
        labels: &CudaBuf<f32>,
        n: usize,
        dlogits: Option<&mut CudaBuf<f32>>,
    ) -> Result<LossStats> {
        Self::check_bce(logits, labels, n, dlogits.as_deref())?;
        if n == 0 {
            return Ok(LossStats {
                loss: 0.0,
                correct: 0,
            });
        }
        self.read_loss(n, |totals| {
            self.bce_into(logits, labels, n, dlogits, totals, PtrMut::null())
        })
    }

    /// No read: the loss sum and correct count stay in `out[2·slot..]` and a
    /// non-finite sum sets the guard, all on the compute stream.
    fn bce_with_logits_deferred(
        &self,
        logits: &CudaBuf<f32>,
        labels: &CudaBuf<f32>,
        n: usize,
        dlogits: &mut CudaBuf<f32>,
        dest: LossSlot<'_, Self>,
        guard: &mut CudaBuf<u32>,
    ) -> Result<()> {
        let LossSlot { out, slot } = dest;
        out.check_len("deferred loss slots (2 words per slot)", 2 * slot + 2)?;
        guard.check_len("loss guard", 1)?;
        Self::check_bce(logits, labels, n, Some(dlogits))?;
        if n == 0 {
            return self.fill_bytes_at(out, 2 * slot, 2, 0);
        }
        self.bce_into(
            logits,
            labels,
            n,
            Some(dlogits),
            out.ptr_mut().offset(2 * slot),
            guard.ptr_mut(),
        )
    }

    fn sample_negatives(
        &self,
        num_vertices: usize,
        per_positive: usize,
        src: &CudaBuf<u32>,
        n_pos: usize,
        seed: u64,
        dist: &NegativeDist<Self>,
        out_src: &mut CudaBuf<u32>,
        out_dst: &mut CudaBuf<u32>,
    ) -> Result<()> {
        let total = check_negatives(num_vertices, per_positive, n_pos, dist)?;
        src.check_len("sample_negatives sources (n_pos)", n_pos)?;
        out_src.check_len("negative sources (n_pos × k)", total)?;
        out_dst.check_len("negative destinations (n_pos × k)", total)?;
        let (cdf, has_cdf) = match dist.cdf() {
            Some(c) => {
                c.check_len("negative table (num_vertices + 1)", num_vertices + 1)?;
                (c.ptr(), 1u32)
            }
            None => (super::kernels::Ptr::null(), 0u32),
        };
        launch::negative_draw {
            src: src.ptr(),
            n_pos: n_pos as u64,
            k: per_positive as u64,
            key: cpu_ops::hash_key(seed, cpu_ops::NEGATIVE_STREAM),
            num_vertices: num_vertices as u64,
            cdf,
            has_cdf,
            out_src: out_src.ptr_mut(),
            out_dst: out_dst.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.link_threads(total))
    }

    /// Flags (a warp per destination, bisection in the keys), an exclusive
    /// scan of `num_edges + 1` flags, one read of the kept count, then the
    /// compaction into buffers of the exact size.
    fn exclude_edges(
        &self,
        block: &CudaBlock,
        src_ids: &CudaBuf<u32>,
        num_dst: usize,
        excluded: &ExcludedPairs<Self>,
    ) -> Result<CudaBlock> {
        check_exclude_dst(block.num_dst, num_dst)?;
        src_ids.check_len("exclude_edges source ids (num_src)", block.num_src)?;
        excluded
            .keys()
            .check_len("excluded pair keys", excluded.len())?;
        let ne = block.num_edges;
        if ne >= u32::MAX as usize {
            return Err(GpuOpsError::InvalidArgument {
                name: "block",
                reason: format!("{ne} edges do not fit the u32 scan of the exclusion"),
            });
        }
        if excluded.is_empty() || ne == 0 {
            return self.copy_block(block);
        }
        let mut pos = self.buf::<u32>(ne + 1, Init::Uninit, "exclusion flags")?;
        self.fill_bytes_at(&mut pos, ne, 1, 0)?;
        launch::exclude_flag {
            indptr: block.indptr.ptr(),
            indices: block.indices.ptr(),
            num_dst: block.num_dst as u64,
            src_ids: src_ids.ptr(),
            keys: excluded.keys().ptr(),
            n_keys: excluded.len() as u64,
            flags: pos.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.link_warps(block.num_dst))?;
        self.scan_in_place(&mut pos, ne + 1)?;
        let kept = self.read_at(&pos, ne)? as usize;
        let mut indptr = self.buf::<u64>(block.num_dst + 1, Init::Uninit, "block indptr")?;
        let mut indices = self.buf::<u32>(kept, Init::Uninit, "block indices")?;
        launch::exclude_compact {
            indptr: block.indptr.ptr(),
            indices: block.indices.ptr(),
            num_dst: block.num_dst as u64,
            num_edges: ne as u64,
            pos: pos.ptr(),
            new_indptr: indptr.ptr_mut(),
            new_indices: indices.ptr_mut(),
        }
        .launch(
            &self.kernels,
            self.cu(),
            self.link_threads(ne.max(block.num_dst + 1)),
        )?;
        self.finish_block(block.num_src, block.num_dst, kept, indptr, indices)
    }
}
