//! The kernels a layer calls, dispatched on the element type.
//!
//! `f32` goes to the SIMD fast paths ([`Simd::detect`]), every other [`Real`] to the
//! generic scalar twins. The check is a `TypeId` comparison; the casts that follow it
//! are `bytemuck` slice casts (no `unsafe`), or a safe `Any` downcast for the owned
//! GAT state.

use std::any::Any;

use crate::aggregate::{
    aggregate_backward, aggregate_backward_f32, aggregate_forward, aggregate_forward_f32,
    AggregateKind, BlockView,
};
use crate::attention::{
    gat_backward, gat_backward_f32, gat_forward, gat_forward_f32, GatForward, GatGrads, GatInputs,
};
use crate::error::{CpuOpsError, Result};
use crate::matmul::{matmul, matmul_nt, matmul_tn, Accumulate, MatMut, MatRef};
use crate::real::{is_f32, Real};
use crate::simd::Simd;

use super::ModelInput;

/// Moves a value of type `A` into type `B` when they are the same type.
fn same_type<A: 'static, B: 'static>(a: A) -> Result<B> {
    let boxed: Box<dyn Any> = Box::new(a);
    boxed
        .downcast::<B>()
        .map(|b| *b)
        .map_err(|_| CpuOpsError::InvalidArgument {
            name: "element type",
            reason: "internal type dispatch mismatch".into(),
        })
}

/// `out = A x` over `block` (see [`crate::aggregate`]).
pub(crate) fn agg_forward<T: Real>(
    block: &BlockView<'_>,
    kind: AggregateKind,
    x: &[T],
    dim: usize,
    out: &mut [T],
) -> Result<()> {
    if is_f32::<T>() {
        let (x, out) = (bytemuck::cast_slice(x), bytemuck::cast_slice_mut(out));
        return aggregate_forward_f32(Simd::detect(), block, kind, x, dim, out);
    }
    aggregate_forward(block, kind, x, dim, out)
}

/// `grad_x = Aᵀ grad_out` over `block`.
pub(crate) fn agg_backward<T: Real>(
    block: &BlockView<'_>,
    kind: AggregateKind,
    grad_out: &[T],
    dim: usize,
    grad_x: &mut [T],
) -> Result<()> {
    if is_f32::<T>() {
        let (g, gx) = (
            bytemuck::cast_slice(grad_out),
            bytemuck::cast_slice_mut(grad_x),
        );
        return aggregate_backward_f32(Simd::detect(), block, kind, g, dim, gx);
    }
    aggregate_backward(block, kind, grad_out, dim, grad_x)
}

fn inputs_f32<'a, T: Real>(inp: &GatInputs<'a, T>) -> GatInputs<'a, f32> {
    GatInputs {
        heads: inp.heads,
        head_dim: inp.head_dim,
        z_src: bytemuck::cast_slice(inp.z_src),
        a_src: bytemuck::cast_slice(inp.a_src),
        a_dst: bytemuck::cast_slice(inp.a_dst),
    }
}

/// GAT attention forward over `block`.
pub(crate) fn gat_fwd<T: Real>(
    block: &BlockView<'_>,
    inp: &GatInputs<'_, T>,
) -> Result<GatForward<T>> {
    if is_f32::<T>() {
        let f = gat_forward_f32(Simd::detect(), block, &inputs_f32(inp))?;
        return same_type(f);
    }
    gat_forward(block, inp)
}

/// GAT attention backward over `block`.
pub(crate) fn gat_bwd<T: Real>(
    block: &BlockView<'_>,
    inp: &GatInputs<'_, T>,
    fwd: &GatForward<T>,
    grad_out: &[T],
) -> Result<GatGrads<T>> {
    if is_f32::<T>() {
        let fwd32: &GatForward<f32> =
            (fwd as &dyn Any)
                .downcast_ref()
                .ok_or_else(|| CpuOpsError::InvalidArgument {
                    name: "element type",
                    reason: "internal type dispatch mismatch".into(),
                })?;
        let g = bytemuck::cast_slice(grad_out);
        let grads = gat_backward_f32(Simd::detect(), block, &inputs_f32(inp), fwd32, g)?;
        return same_type(grads);
    }
    gat_backward(block, inp, fwd, grad_out)
}

/// `C (+)= A · B`, `A`: `m × k`, `B`: `k × n`.
pub(crate) fn mm<T: Real>(
    a: &[T],
    m: usize,
    k: usize,
    b: &[T],
    n: usize,
    c: &mut [T],
    acc: Accumulate,
) -> Result<()> {
    matmul(
        MatRef::new(a, m, k)?,
        MatRef::new(b, k, n)?,
        MatMut::new(c, m, n)?,
        acc,
    )
}

/// `C = Aᵀ · B`, `A`: `k × m`, `B`: `k × n` (a weight gradient).
pub(crate) fn mm_tn<T: Real>(
    a: &[T],
    k: usize,
    m: usize,
    b: &[T],
    n: usize,
    c: &mut [T],
) -> Result<()> {
    matmul_tn(
        MatRef::new(a, k, m)?,
        MatRef::new(b, k, n)?,
        MatMut::new(c, m, n)?,
        Accumulate::No,
    )
}

/// `C (+)= A · Bᵀ`, `A`: `m × k`, `B`: `n × k` (an input gradient).
pub(crate) fn mm_nt<T: Real>(
    a: &[T],
    m: usize,
    k: usize,
    b: &[T],
    n: usize,
    c: &mut [T],
    acc: Accumulate,
) -> Result<()> {
    matmul_nt(
        MatRef::new(a, m, k)?,
        MatRef::new(b, n, k)?,
        MatMut::new(c, m, n)?,
        acc,
    )
}

/// `C (+)= X[..rows]·W`, `X`: a layer input of `d_in` columns, `W`: `d_in × n`
/// (sparse inputs run [`crate::SparseRows::spmm_rows`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn proj<T: Real>(
    x: ModelInput<'_, T>,
    rows: usize,
    d_in: usize,
    w: &[T],
    n: usize,
    c: &mut [T],
    acc: Accumulate,
) -> Result<()> {
    match x {
        ModelInput::Dense(x) => mm(dense_prefix(x, rows, d_in)?, rows, d_in, w, n, c, acc),
        ModelInput::Sparse(x) => x.spmm_rows(rows, w, n, c, acc),
    }
}

/// `dW = X[..rows]ᵀ·G`, `G`: `rows × n`, `dW`: `d_in × n` (a weight gradient;
/// sparse inputs run [`crate::SparseRows::spmm_tn_rows`]).
pub(crate) fn proj_tn<T: Real>(
    x: ModelInput<'_, T>,
    rows: usize,
    d_in: usize,
    g: &[T],
    n: usize,
    dw: &mut [T],
) -> Result<()> {
    match x {
        ModelInput::Dense(x) => mm_tn(dense_prefix(x, rows, d_in)?, rows, d_in, g, n, dw),
        ModelInput::Sparse(x) => x.spmm_tn_rows(rows, g, n, dw, Accumulate::No),
    }
}

/// The first `rows` rows of a dense `? × d_in` matrix.
fn dense_prefix<T>(x: &[T], rows: usize, d_in: usize) -> Result<&[T]> {
    let len = rows.saturating_mul(d_in);
    x.get(..len).ok_or(CpuOpsError::SizeMismatch {
        what: "layer input values (at least rows × d_in)",
        expected: len,
        found: x.len(),
    })
}
