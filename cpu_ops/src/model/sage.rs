//! GraphSAGE-mean layer (`dgl.nn.SAGEConv(aggregator_type="mean")`); formulas in the
//! module doc of [`crate::model`]. Parameters: `W_self`, `W_neigh` (`d_in × d_out`),
//! `b` (`d_out`).

use super::kernel::{agg_backward, agg_forward, mm, mm_nt, mm_tn, proj, proj_tn};
use super::{LayerSpec, LayerState, ModelInput};
use crate::activation::{add_bias, bias_grad};
use crate::aggregate::{AggregateKind, BlockView};
use crate::error::Result;
use crate::matmul::{Accumulate, MatMut, MatRef};
use crate::real::Real;

const MEAN: AggregateKind = AggregateKind::Mean;

/// `out = X_dst·W_self + A_mean(X)·W_neigh + b`; returns `out` (`n_dst × d_out`).
/// A sparse `x` always projects first.
pub(super) fn forward<T: Real>(
    spec: &LayerSpec,
    params: &[Vec<T>],
    block: &BlockView<'_>,
    x: ModelInput<'_, T>,
) -> Result<(Vec<T>, LayerState<T>)> {
    let (w_self, w_neigh, bias) = (&params[0], &params[1], &params[2]);
    let (d_in, d_out) = (spec.d_in, spec.d_out);
    let (ns, nd) = (block.num_src(), block.num_dst());
    let mut out = vec![T::ZERO; nd * d_out];
    let mut agg = Vec::new();
    match x {
        ModelInput::Dense(x) if d_in <= d_out => {
            agg = vec![T::ZERO; nd * d_in];
            agg_forward(block, MEAN, x, d_in, &mut agg)?;
            mm(&agg, nd, d_in, w_neigh, d_out, &mut out, Accumulate::No)?;
        }
        _ => {
            // Project first: A_mean (X·W_neigh).
            let mut p = vec![T::ZERO; ns * d_out];
            proj(x, ns, d_in, w_neigh, d_out, &mut p, Accumulate::No)?;
            agg_forward(block, MEAN, &p, d_out, &mut out)?;
        }
    }
    proj(x, nd, d_in, w_self, d_out, &mut out, Accumulate::Yes)?;
    add_bias(MatMut::new(&mut out, nd, d_out)?, bias)?;
    Ok((out, LayerState::Sage { agg }))
}

/// Writes the gradients of `W_self`, `W_neigh`, `b` into `grads[0..3]` and returns
/// `∂X` (`n_src × d_in`) when `need_dx`.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward<T: Real>(
    spec: &LayerSpec,
    params: &[Vec<T>],
    block: &BlockView<'_>,
    x: ModelInput<'_, T>,
    agg: &[T],
    g: &[T],
    grads: &mut [Vec<T>],
    need_dx: bool,
) -> Result<Option<Vec<T>>> {
    let (w_self, w_neigh) = (&params[0], &params[1]);
    let (d_in, d_out) = (spec.d_in, spec.d_out);
    let (ns, nd) = (block.num_src(), block.num_dst());
    let [dw_self, dw_neigh, db, ..] = grads else {
        return Err(super::internal("a SAGE layer has three parameter tensors"));
    };
    bias_grad(MatRef::new(g, nd, d_out)?, db, Accumulate::No)?;
    proj_tn(x, nd, d_in, g, d_out, dw_self)?;
    let mut dx = None;
    if d_in > d_out || x.is_sparse() {
        let mut dp = vec![T::ZERO; ns * d_out];
        agg_backward(block, MEAN, g, d_out, &mut dp)?;
        proj_tn(x, ns, d_in, &dp, d_out, dw_neigh)?;
        if need_dx {
            let mut d = vec![T::ZERO; ns * d_in];
            mm_nt(&dp, ns, d_out, w_neigh, d_in, &mut d, Accumulate::No)?;
            dx = Some(d);
        }
    } else {
        mm_tn(agg, nd, d_in, g, d_out, dw_neigh)?;
        if need_dx {
            let mut dm = vec![T::ZERO; nd * d_in];
            mm_nt(g, nd, d_out, w_neigh, d_in, &mut dm, Accumulate::No)?;
            let mut d = vec![T::ZERO; ns * d_in];
            agg_backward(block, MEAN, &dm, d_in, &mut d)?;
            dx = Some(d);
        }
    }
    if let Some(d) = dx.as_mut() {
        mm_nt(
            g,
            nd,
            d_out,
            w_self,
            d_in,
            &mut d[..nd * d_in],
            Accumulate::Yes,
        )?;
    }
    Ok(dx)
}
