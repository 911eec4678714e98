//! GCN layer (`dgl.nn.GraphConv(norm="both")` with self-loops); formulas in the
//! module doc of [`crate::model`]. Parameters: `W` (`d_in × d_out`), `b` (`d_out`).

use super::kernel::{agg_backward, agg_forward, mm, mm_nt, mm_tn, proj, proj_tn};
use super::{LayerSpec, LayerState, ModelInput};
use crate::activation::{add_bias, bias_grad};
use crate::aggregate::{AggregateKind, BlockView};
use crate::error::Result;
use crate::matmul::{Accumulate, MatMut, MatRef};
use crate::real::Real;

const NORM: AggregateKind = AggregateKind::GcnNorm;

/// The augmented block's CSR: destination `i` reads `N(i)` then `i` itself.
pub(super) fn with_self_loops(block: &BlockView<'_>) -> (Vec<u64>, Vec<u32>) {
    let nd = block.num_dst();
    let mut indptr = Vec::with_capacity(nd + 1);
    let mut indices = Vec::with_capacity(block.num_edges() + nd);
    indptr.push(0u64);
    for i in 0..nd {
        indices.extend_from_slice(block.neighbors(i));
        // Truncation only past 2³² destinations, where the augmented block has more
        // than u32::MAX edges and `BlockView::new` rejects it.
        indices.push(i as u32);
        indptr.push(indices.len() as u64);
    }
    (indptr, indices)
}

/// `out = Â X W + b` over the augmented block; returns `out` (`n_dst × d_out`).
/// A sparse `x` always projects first.
pub(super) fn forward<T: Real>(
    spec: &LayerSpec,
    params: &[Vec<T>],
    block: &BlockView<'_>,
    x: ModelInput<'_, T>,
) -> Result<(Vec<T>, LayerState<T>)> {
    let (w, bias) = (&params[0], &params[1]);
    let (d_in, d_out) = (spec.d_in, spec.d_out);
    let (ns, nd) = (block.num_src(), block.num_dst());
    let (indptr, indices) = with_self_loops(block);
    let aug = BlockView::new(ns, &indptr, &indices)?;
    let mut out = vec![T::ZERO; nd * d_out];
    let mut agg = Vec::new();
    match x {
        ModelInput::Dense(x) if d_in <= d_out => {
            agg = vec![T::ZERO; nd * d_in];
            agg_forward(&aug, NORM, x, d_in, &mut agg)?;
            mm(&agg, nd, d_in, w, d_out, &mut out, Accumulate::No)?;
        }
        _ => {
            let mut p = vec![T::ZERO; ns * d_out];
            proj(x, ns, d_in, w, d_out, &mut p, Accumulate::No)?;
            agg_forward(&aug, NORM, &p, d_out, &mut out)?;
        }
    }
    add_bias(MatMut::new(&mut out, nd, d_out)?, bias)?;
    Ok((
        out,
        LayerState::Gcn {
            indptr,
            indices,
            agg,
        },
    ))
}

/// Writes the gradients of `W`, `b` into `grads[0..2]` and returns `∂X`
/// (`n_src × d_in`) when `need_dx`. `aug` is the forward's augmented block and `Â X`.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward<T: Real>(
    spec: &LayerSpec,
    params: &[Vec<T>],
    block: &BlockView<'_>,
    x: ModelInput<'_, T>,
    (indptr, indices, agg): (&[u64], &[u32], &[T]),
    g: &[T],
    grads: &mut [Vec<T>],
    need_dx: bool,
) -> Result<Option<Vec<T>>> {
    let w = &params[0];
    let (d_in, d_out) = (spec.d_in, spec.d_out);
    let (ns, nd) = (block.num_src(), block.num_dst());
    let aug = BlockView::new(ns, indptr, indices)?;
    let [dw, db, ..] = grads else {
        return Err(super::internal("a GCN layer has two parameter tensors"));
    };
    bias_grad(MatRef::new(g, nd, d_out)?, db, Accumulate::No)?;
    if d_in > d_out || x.is_sparse() {
        let mut dp = vec![T::ZERO; ns * d_out];
        agg_backward(&aug, NORM, g, d_out, &mut dp)?;
        proj_tn(x, ns, d_in, &dp, d_out, dw)?;
        if !need_dx {
            return Ok(None);
        }
        let mut dx = vec![T::ZERO; ns * d_in];
        mm_nt(&dp, ns, d_out, w, d_in, &mut dx, Accumulate::No)?;
        Ok(Some(dx))
    } else {
        mm_tn(agg, nd, d_in, g, d_out, dw)?;
        if !need_dx {
            return Ok(None);
        }
        let mut da = vec![T::ZERO; nd * d_in];
        mm_nt(g, nd, d_out, w, d_in, &mut da, Accumulate::No)?;
        let mut dx = vec![T::ZERO; ns * d_in];
        agg_backward(&aug, NORM, &da, d_in, &mut dx)?;
        Ok(Some(dx))
    }
}
