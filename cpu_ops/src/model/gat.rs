//! GAT layer (`dgl.nn.GATConv`); formulas in the module doc of [`crate::model`].
//! Parameters: `W` (`d_in × H·F`), `a_src`, `a_dst` (`H × F`), `b` (`H·F`).

use super::kernel::{gat_bwd, gat_fwd, mm_nt, proj, proj_tn};
use super::{LayerSpec, LayerState, ModelInput};
use crate::activation::{add_bias, bias_grad};
use crate::aggregate::BlockView;
use crate::attention::{GatForward, GatInputs};
use crate::error::Result;
use crate::matmul::{Accumulate, MatMut, MatRef};
use crate::real::Real;

fn inputs<'a, T>(spec: &LayerSpec, params: &'a [Vec<T>], z: &'a [T]) -> GatInputs<'a, T> {
    GatInputs {
        heads: spec.heads,
        head_dim: spec.head_dim,
        z_src: z,
        a_src: &params[1],
        a_dst: &params[2],
    }
}

/// `z = X·W`, `o = gat(z)`, `out = o + b` (hidden) or the head mean of `o + b`
/// (last layer); returns `out` (`n_dst × d_out`).
pub(super) fn forward<T: Real>(
    spec: &LayerSpec,
    params: &[Vec<T>],
    block: &BlockView<'_>,
    x: ModelInput<'_, T>,
) -> Result<(Vec<T>, LayerState<T>)> {
    let (w, bias) = (&params[0], &params[3]);
    let width = spec.heads * spec.head_dim;
    let (ns, nd) = (block.num_src(), block.num_dst());
    let mut z = vec![T::ZERO; ns * width];
    proj(x, ns, spec.d_in, w, width, &mut z, Accumulate::No)?;
    let attn = gat_fwd(block, &inputs(spec, params, &z))?;
    let mut o = attn.out().to_vec();
    add_bias(MatMut::new(&mut o, nd, width)?, bias)?;
    let out = if spec.last {
        head_mean(&o, nd, spec.heads, spec.head_dim)
    } else {
        o
    };
    Ok((out, LayerState::Gat { z, attn }))
}

/// `out_i = (1/H) Σ_h o_{i,h}` for `o`: `rows × H·F`.
fn head_mean<T: Real>(o: &[T], rows: usize, heads: usize, f: usize) -> Vec<T> {
    let inv = T::from_f64(1.0 / heads as f64);
    let mut out = vec![T::ZERO; rows * f];
    for (out_i, o_i) in out.chunks_exact_mut(f).zip(o.chunks_exact(heads * f)) {
        for o_h in o_i.chunks_exact(f) {
            for (a, &v) in out_i.iter_mut().zip(o_h) {
                *a += v;
            }
        }
        for a in out_i.iter_mut() {
            *a *= inv;
        }
    }
    out
}

/// Writes the gradients of `W`, `a_src`, `a_dst`, `b` into `grads[0..4]` and returns
/// `∂X` (`n_src × d_in`) when `need_dx`.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward<T: Real>(
    spec: &LayerSpec,
    params: &[Vec<T>],
    block: &BlockView<'_>,
    x: ModelInput<'_, T>,
    z: &[T],
    attn: &GatForward<T>,
    g: &[T],
    grads: &mut [Vec<T>],
    need_dx: bool,
) -> Result<Option<Vec<T>>> {
    let w = &params[0];
    let (h, f) = (spec.heads, spec.head_dim);
    let width = h * f;
    let (ns, nd) = (block.num_src(), block.num_dst());
    let [dw, da_src, da_dst, db, ..] = grads else {
        return Err(super::internal("a GAT layer has four parameter tensors"));
    };
    // ∂o: the last layer spreads G_i / H over the heads.
    let spread;
    let d_o: &[T] = if spec.last {
        let inv = T::from_f64(1.0 / h as f64);
        spread = g
            .chunks_exact(f)
            .flat_map(|g_i| (0..h).flat_map(move |_| g_i.iter().map(move |&v| v * inv)))
            .collect::<Vec<T>>();
        &spread
    } else {
        g
    };
    bias_grad(MatRef::new(d_o, nd, width)?, db, Accumulate::No)?;
    let gg = gat_bwd(block, &inputs(spec, params, z), attn, d_o)?;
    *da_src = gg.a_src;
    *da_dst = gg.a_dst;
    proj_tn(x, ns, spec.d_in, &gg.z_src, width, dw)?;
    if !need_dx {
        return Ok(None);
    }
    let mut dx = vec![T::ZERO; ns * spec.d_in];
    mm_nt(&gg.z_src, ns, width, w, spec.d_in, &mut dx, Accumulate::No)?;
    Ok(Some(dx))
}
