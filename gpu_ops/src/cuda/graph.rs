//! [`GraphOps`] for the CUDA backend: neighbor aggregation (sum, mean,
//! GCN-normalized) and GAT attention on device blocks, the host side of
//! `kernels/aggregate.cu` and `kernels/attention.cu`.
//!
//! Forward passes write each output row from one warp, summing its edges in CSR
//! order: deterministic. Backward passes scatter into the sources with float
//! `atomicAdd` (the output is zeroed first), so the order of the additions — and the
//! last bits of `grad_x`, GAT's `∂z` and `∂a_src` — can change from run to run. The
//! attention-vector gradients are then reduced in a fixed order (`colsum`).

use cpu_ops::AggregateKind;

use super::alloc::{CudaBuf, Init};
use super::dense::elems;
use super::device::CudaBackend;
use super::kernels::{launch, Grid, Ptr};
use super::sampling::CudaBlock;
use crate::backend::{GatGradsDev, GatInputsDev, GatSaved, GraphOps};
use crate::error::{GpuOpsError, Result};

/// `KIND_*` of aggregate.cu.
fn kind_code(kind: AggregateKind) -> u32 {
    match kind {
        AggregateKind::Sum => 0,
        AggregateKind::Mean => 1,
        AggregateKind::GcnNorm => 2,
    }
}

/// `heads · head_dim` with both at least 1.
fn gat_width(heads: usize, head_dim: usize) -> Result<usize> {
    for (name, v) in [("heads", heads), ("head_dim", head_dim)] {
        if v == 0 {
            return Err(GpuOpsError::InvalidArgument {
                name,
                reason: "expected at least 1".into(),
            });
        }
    }
    elems("heads × head_dim", heads, head_dim)
}

impl CudaBackend {
    fn warps(&self, n: usize) -> Grid {
        Grid::warps_for(n as u64, self.kernels.max_blocks())
    }

    /// The source weights an aggregation of `kind` reads: GCN's (made on first
    /// use), else none (the kernels read them only for GCN).
    fn weights_for(&self, block: &CudaBlock, kind: AggregateKind) -> Result<Ptr<f32>> {
        match kind {
            AggregateKind::GcnNorm => self.src_weights(block),
            _ => Ok(Ptr::null()),
        }
    }
}

impl GraphOps for CudaBackend {
    /// `out = A x` ([`cpu_ops::aggregate_forward`]'s semantics).
    fn aggregate_forward(
        &self,
        block: &CudaBlock,
        kind: AggregateKind,
        x: &CudaBuf<f32>,
        dim: usize,
        out: &mut CudaBuf<f32>,
    ) -> Result<()> {
        x.check_len(
            "aggregate input (num_src × dim values)",
            elems("num_src × dim", block.num_src, dim)?,
        )?;
        out.check_len(
            "aggregate output (num_dst × dim values)",
            elems("num_dst × dim", block.num_dst, dim)?,
        )?;
        if dim == 0 {
            return Ok(());
        }
        let src_w = self.weights_for(block, kind)?;
        launch::aggregate_forward {
            indptr: block.indptr.ptr(),
            indices: block.indices.ptr(),
            src_w,
            num_dst: block.num_dst as u64,
            dim: dim as u64,
            kind: kind_code(kind),
            x: x.ptr(),
            out: out.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.warps(block.num_dst))
    }

    /// `grad_x = Aᵀ grad_out` (all `num_src` rows overwritten; atomics, see the
    /// module doc).
    fn aggregate_backward(
        &self,
        block: &CudaBlock,
        kind: AggregateKind,
        grad_out: &CudaBuf<f32>,
        dim: usize,
        grad_x: &mut CudaBuf<f32>,
    ) -> Result<()> {
        grad_out.check_len(
            "aggregate output gradient (num_dst × dim values)",
            elems("num_dst × dim", block.num_dst, dim)?,
        )?;
        let n_x = elems("num_src × dim", block.num_src, dim)?;
        grad_x.check_len("aggregate input gradient (num_src × dim values)", n_x)?;
        if dim == 0 {
            return Ok(());
        }
        self.fill_bytes(grad_x, n_x, 0)?;
        let src_w = self.weights_for(block, kind)?;
        launch::aggregate_backward {
            indptr: block.indptr.ptr(),
            indices: block.indices.ptr(),
            src_w,
            num_dst: block.num_dst as u64,
            dim: dim as u64,
            kind: kind_code(kind),
            grad_out: grad_out.ptr(),
            grad_x: grad_x.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.warps(block.num_dst))
    }

    /// GAT attention forward ([`cpu_ops::gat_forward`]'s semantics).
    fn gat_forward(
        &self,
        block: &CudaBlock,
        inp: &GatInputsDev<'_, Self>,
    ) -> Result<GatSaved<CudaBackend>> {
        let GatInputsDev {
            heads,
            head_dim,
            z_src,
            a_src,
            a_dst,
        } = *inp;
        let width = gat_width(heads, head_dim)?;
        z_src.check_len(
            "GAT z_src (num_src × heads·head_dim values)",
            elems("num_src × width", block.num_src, width)?,
        )?;
        a_src.check_len("GAT a_src (heads × head_dim values)", width)?;
        a_dst.check_len("GAT a_dst (heads × head_dim values)", width)?;
        let (ns, nd, ne) = (block.num_src, block.num_dst, block.num_edges);
        let mut el =
            self.buf::<f32>(elems("num_src × heads", ns, heads)?, Init::Uninit, "GAT el")?;
        let mut er =
            self.buf::<f32>(elems("num_dst × heads", nd, heads)?, Init::Uninit, "GAT er")?;
        let mut alpha = self.buf::<f32>(
            elems("num_edges × heads", ne, heads)?,
            Init::Uninit,
            "GAT alpha",
        )?;
        let mut out = self.buf::<f32>(
            elems("num_dst × width", nd, width)?,
            Init::Uninit,
            "GAT output",
        )?;
        let (h, f) = (heads as u64, head_dim as u64);
        launch::gat_scores {
            z: z_src.ptr(),
            rows: ns as u64,
            heads: h,
            head_dim: f,
            a: a_src.ptr(),
            s: el.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.warps(ns * heads))?;
        launch::gat_scores {
            z: z_src.ptr(),
            rows: nd as u64,
            heads: h,
            head_dim: f,
            a: a_dst.ptr(),
            s: er.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.warps(nd * heads))?;
        launch::gat_softmax {
            indptr: block.indptr.ptr(),
            indices: block.indices.ptr(),
            num_dst: nd as u64,
            heads: h,
            el: el.ptr(),
            er: er.ptr(),
            alpha: alpha.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.warps(nd * heads))?;
        launch::gat_aggregate {
            indptr: block.indptr.ptr(),
            indices: block.indices.ptr(),
            num_dst: nd as u64,
            heads: h,
            head_dim: f,
            alpha: alpha.ptr(),
            z: z_src.ptr(),
            out: out.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.warps(nd))?;
        Ok(GatSaved { out, alpha, el, er })
    }

    /// GAT attention backward ([`cpu_ops::gat_backward`]'s semantics; steps in
    /// attention.cu).
    fn gat_backward(
        &self,
        block: &CudaBlock,
        inp: &GatInputsDev<'_, Self>,
        saved: &GatSaved<CudaBackend>,
        grad_out: &CudaBuf<f32>,
    ) -> Result<GatGradsDev<CudaBackend>> {
        let GatInputsDev {
            heads,
            head_dim,
            z_src,
            a_src,
            a_dst,
        } = *inp;
        let width = gat_width(heads, head_dim)?;
        let (ns, nd, ne) = (block.num_src, block.num_dst, block.num_edges);
        let n_z = elems("num_src × width", ns, width)?;
        z_src.check_len("GAT z_src (num_src × heads·head_dim values)", n_z)?;
        a_src.check_len("GAT a_src (heads × head_dim values)", width)?;
        a_dst.check_len("GAT a_dst (heads × head_dim values)", width)?;
        grad_out.check_len(
            "GAT output gradient (num_dst × heads·head_dim values)",
            elems("num_dst × width", nd, width)?,
        )?;
        saved.alpha.check_len(
            "GAT saved alpha (num_edges × heads values)",
            elems("num_edges × heads", ne, heads)?,
        )?;
        saved.el.check_len(
            "GAT saved el (num_src × heads values)",
            elems("num_src × heads", ns, heads)?,
        )?;
        saved.er.check_len(
            "GAT saved er (num_dst × heads values)",
            elems("num_dst × heads", nd, heads)?,
        )?;
        let (h, f) = (heads as u64, head_dim as u64);
        // 1. ∂u per edge, ∂er per destination.
        let mut du = self.buf::<f32>(ne * heads, Init::Uninit, "GAT du")?;
        let mut der = self.buf::<f32>(nd * heads, Init::Uninit, "GAT der")?;
        launch::gat_backward_dst {
            indptr: block.indptr.ptr(),
            indices: block.indices.ptr(),
            num_dst: nd as u64,
            heads: h,
            head_dim: f,
            z: z_src.ptr(),
            grad_out: grad_out.ptr(),
            alpha: saved.alpha.ptr(),
            el: saved.el.ptr(),
            er: saved.er.ptr(),
            du: du.ptr_mut(),
            der: der.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.warps(nd * heads))?;
        // 2. ∂z and ∂el (scatter), then the attention-vector terms of ∂z.
        let mut gz = self.buf::<f32>(n_z, Init::Zeroed, "GAT dz")?;
        let mut del = self.buf::<f32>(ns * heads, Init::Zeroed, "GAT del")?;
        launch::gat_backward_src {
            indptr: block.indptr.ptr(),
            indices: block.indices.ptr(),
            num_dst: nd as u64,
            heads: h,
            head_dim: f,
            alpha: saved.alpha.ptr(),
            grad_out: grad_out.ptr(),
            du: du.ptr(),
            gz: gz.ptr_mut(),
            del: del.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.warps(nd))?;
        launch::gat_backward_finish {
            gz: gz.ptr_mut(),
            del: del.ptr(),
            der: der.ptr(),
            a_src: a_src.ptr(),
            a_dst: a_dst.ptr(),
            num_src: ns as u64,
            num_dst: nd as u64,
            heads: h,
            head_dim: f,
        }
        .launch(
            &self.kernels,
            self.cu(),
            Grid::threads_for(n_z as u64, self.kernels.max_blocks()),
        )?;
        // 3. ∂a_src = Σ_j ∂el_j z_j, ∂a_dst = Σ_i ∂er_i z_i (fixed-order sums).
        let mut ga_src = self.buf::<f32>(width, Init::Uninit, "GAT da_src")?;
        let mut ga_dst = self.buf::<f32>(width, Init::Uninit, "GAT da_dst")?;
        let z: Ptr<f32> = z_src.ptr();
        self.colsum(
            z,
            ns,
            width,
            Some((del.ptr(), heads, head_dim)),
            ga_src.ptr_mut(),
            false,
        )?;
        self.colsum(
            z,
            nd,
            width,
            Some((der.ptr(), heads, head_dim)),
            ga_dst.ptr_mut(),
            false,
        )?;
        Ok(GatGradsDev {
            z_src: gz,
            a_src: ga_src,
            a_dst: ga_dst,
        })
    }
}
