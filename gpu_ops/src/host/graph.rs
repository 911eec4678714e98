//! The host backend's [`GraphOps`]: aggregation and GAT attention over a block,
//! each op checking the prefixes it reads and writes and running `cpu_ops`' `f32`
//! SIMD kernel at the backend's level.

use cpu_ops::{AggregateKind, GatForward, GatInputs, GatParts, Simd};

use crate::backend::{GatGradsDev, GatInputsDev, GatSaved, GraphOps};
use crate::error::Result;
use crate::host::block::HostBlock;
use crate::host::buffer::{mul, prefix, prefix_mut, HostBuf};
use crate::host::HostBackend;

/// [`crate::GraphOps::aggregate_forward`].
pub(crate) fn aggregate_forward(
    simd: Simd,
    block: &HostBlock,
    kind: AggregateKind,
    x: &[f32],
    dim: usize,
    out: &mut [f32],
) -> Result<()> {
    let x = prefix(
        "aggregate input (num_src × dim)",
        x,
        mul("num_src × dim", block.num_src(), dim)?,
    )?;
    let out = prefix_mut(
        "aggregate output (num_dst × dim)",
        out,
        mul("num_dst × dim", block.num_dst(), dim)?,
    )?;
    cpu_ops::aggregate_forward_f32(simd, block.view(), kind, x, dim, out)?;
    Ok(())
}

/// [`crate::GraphOps::aggregate_backward`].
pub(crate) fn aggregate_backward(
    simd: Simd,
    block: &HostBlock,
    kind: AggregateKind,
    grad_out: &[f32],
    dim: usize,
    grad_x: &mut [f32],
) -> Result<()> {
    let grad_out = prefix(
        "aggregate output gradient (num_dst × dim)",
        grad_out,
        mul("num_dst × dim", block.num_dst(), dim)?,
    )?;
    let grad_x = prefix_mut(
        "aggregate input gradient (num_src × dim)",
        grad_x,
        mul("num_src × dim", block.num_src(), dim)?,
    )?;
    cpu_ops::aggregate_backward_f32(simd, block.view(), kind, grad_out, dim, grad_x)?;
    Ok(())
}

/// The GAT inputs' prefixes; `width = heads · head_dim`.
fn gat_inputs<'a>(
    block: &HostBlock,
    inp: &GatInputsDev<'a, HostBackend>,
) -> Result<(GatInputs<'a, f32>, usize)> {
    let GatInputsDev {
        heads,
        head_dim,
        z_src,
        a_src,
        a_dst,
    } = *inp;
    let width = mul("heads × head_dim", heads, head_dim)?;
    let inp = GatInputs {
        heads,
        head_dim,
        z_src: prefix(
            "GAT z_src (num_src × heads·head_dim)",
            z_src,
            mul("num_src × width", block.num_src(), width)?,
        )?,
        a_src: prefix("GAT a_src (heads × head_dim)", a_src, width)?,
        a_dst: prefix("GAT a_dst (heads × head_dim)", a_dst, width)?,
    };
    Ok((inp, width))
}

/// [`crate::GraphOps::gat_forward`].
pub(crate) fn gat_forward(
    simd: Simd,
    block: &HostBlock,
    inp: &GatInputsDev<'_, HostBackend>,
) -> Result<GatSaved<HostBackend>> {
    let (inp, _) = gat_inputs(block, inp)?;
    let fwd = cpu_ops::gat_forward_f32(simd, block.view(), &inp)?;
    let GatParts { out, alpha, el, er } = fwd.into_parts();
    Ok(GatSaved {
        out: out.into(),
        alpha: alpha.into(),
        el: el.into(),
        er: er.into(),
    })
}

/// [`crate::GraphOps::gat_backward`].
pub(crate) fn gat_backward(
    simd: Simd,
    block: &HostBlock,
    inp: &GatInputsDev<'_, HostBackend>,
    saved: &GatSaved<HostBackend>,
    grad_out: &[f32],
) -> Result<GatGradsDev<HostBackend>> {
    let (inp, width) = gat_inputs(block, inp)?;
    let (heads, head_dim) = (inp.heads, inp.head_dim);
    let (ns, nd, ne) = (block.num_src(), block.num_dst(), block.num_edges());
    let grad_out = prefix(
        "GAT output gradient (num_dst × heads·head_dim)",
        grad_out,
        mul("num_dst × width", nd, width)?,
    )?;
    let part = |what, buf: &HostBuf<f32>, len| prefix(what, buf, len).map(<[f32]>::to_vec);
    let parts = GatParts {
        out: part(
            "GAT saved out (num_dst × heads·head_dim)",
            &saved.out,
            mul("num_dst × width", nd, width)?,
        )?,
        alpha: part(
            "GAT saved alpha (edges × heads)",
            &saved.alpha,
            mul("edges × heads", ne, heads)?,
        )?,
        el: part(
            "GAT saved el (num_src × heads)",
            &saved.el,
            mul("num_src × heads", ns, heads)?,
        )?,
        er: part(
            "GAT saved er (num_dst × heads)",
            &saved.er,
            mul("num_dst × heads", nd, heads)?,
        )?,
    };
    let fwd = GatForward::from_parts(heads, head_dim, ns, nd, parts)?;
    let g = cpu_ops::gat_backward_f32(simd, block.view(), &inp, &fwd, grad_out)?;
    Ok(GatGradsDev {
        z_src: g.z_src.into(),
        a_src: g.a_src.into(),
        a_dst: g.a_dst.into(),
    })
}

impl GraphOps for HostBackend {
    fn aggregate_forward(
        &self,
        block: &HostBlock,
        kind: AggregateKind,
        x: &HostBuf<f32>,
        dim: usize,
        out: &mut HostBuf<f32>,
    ) -> Result<()> {
        aggregate_forward(self.simd, block, kind, x, dim, out)
    }

    fn aggregate_backward(
        &self,
        block: &HostBlock,
        kind: AggregateKind,
        grad_out: &HostBuf<f32>,
        dim: usize,
        grad_x: &mut HostBuf<f32>,
    ) -> Result<()> {
        aggregate_backward(self.simd, block, kind, grad_out, dim, grad_x)
    }

    fn gat_forward(
        &self,
        block: &HostBlock,
        inp: &GatInputsDev<'_, Self>,
    ) -> Result<GatSaved<Self>> {
        gat_forward(self.simd, block, inp)
    }

    fn gat_backward(
        &self,
        block: &HostBlock,
        inp: &GatInputsDev<'_, Self>,
        saved: &GatSaved<Self>,
        grad_out: &HostBuf<f32>,
    ) -> Result<GatGradsDev<Self>> {
        gat_backward(self.simd, block, inp, saved, grad_out)
    }
}
