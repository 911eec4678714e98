//! GAT edge attention over a sampled block (multi-head), forward and backward.
//!
//! Notation as in [`crate::aggregate`]: a [`BlockView`] with edges `e = (j → i)`,
//! destination `i` being source `i`. Inputs, for `H` heads of width `F`:
//! `z` (`num_src × H·F`, already projected; `z_{j,h}` is head `h`'s slice of row `j`),
//! `a_src`, `a_dst` (`H × F`). Per edge and head:
//!
//! - scores: `el_{j,h} = a_src_h · z_{j,h}`, `er_{i,h} = a_dst_h · z_{i,h}`,
//!   `u_{e,h} = el_{j,h} + er_{i,h}`, `s_{e,h} = LeakyReLU(u_{e,h})` with negative slope
//!   [`GAT_NEGATIVE_SLOPE`] (0.2);
//! - edge softmax over the edges into `i`: `α_{e,h} = exp(s_{e,h} − m_{i,h}) /
//!   Σ_{e'→i} exp(s_{e',h} − m_{i,h})`, `m_{i,h} = max_{e'→i} s_{e',h}` (stable);
//! - output: `out_{i,h} = Σ_{e=(j→i)} α_{e,h} z_{j,h}` (`num_dst × H·F`); a destination
//!   without edges outputs zeros.
//!
//! Backward, from `G = ∂L/∂out` (`num_dst × H·F`):
//!
//! 1. per destination `i` (in parallel): `g_{e,h} = G_{i,h} · z_{j,h}`,
//!    `ḡ_{i,h} = Σ_{e→i} α_{e,h} g_{e,h}`, `∂u_{e,h} = α_{e,h} (g_{e,h} − ḡ_{i,h}) ·
//!    LeakyReLU'(u_{e,h})` (1 for `u > 0`, else 0.2), `∂er_{i,h} = Σ_{e→i} ∂u_{e,h}`;
//! 2. per source `j` (in parallel, over the block's transpose in edge order):
//!    `∂el_{j,h} = Σ_{e=(j→·)} ∂u_{e,h}` and
//!    `∂z_{j,h} = Σ_{e=(j→i)} α_{e,h} G_{i,h} + ∂el_{j,h} a_src_h + [j < num_dst] ∂er_{j,h} a_dst_h`;
//! 3. `∂a_src_h = Σ_j ∂el_{j,h} z_{j,h}`, `∂a_dst_h = Σ_i ∂er_{i,h} z_{i,h}`, each
//!    summed over fixed row ranges in parallel, then the partial sums in range order.
//!
//! Every value is summed in an order that does not depend on the thread count, so
//! both passes are bit-for-bit deterministic. [`gat_forward`] / [`gat_backward`] are
//! the scalar twins for any [`Real`] (`f64` for finite differences); the `_f32`
//! versions run the loops over `F` (dot products and `axpy`) through [`Simd`].

use rayon::prelude::*;

use crate::aggregate::{check_matrix, min_rows_per_task, BlockView};
use crate::error::{CpuOpsError, Result};
use crate::real::Real;
use crate::simd::{Scalar, Simd, SimdOps};

/// Negative slope of the LeakyReLU applied to attention scores (DGL's default).
pub const GAT_NEGATIVE_SLOPE: f64 = 0.2;

/// Rows per partial sum in step 3 of the backward (fixed, for determinism).
const PART_ROWS: usize = 512;

/// The inputs of a GAT attention layer on one block (shapes in the module doc).
#[derive(Clone, Copy, Debug)]
pub struct GatInputs<'a, T> {
    /// Number of heads `H` (at least 1).
    pub heads: usize,
    /// Width `F` of each head (at least 1).
    pub head_dim: usize,
    /// Projected source features, `num_src × H·F`, row-major.
    pub z_src: &'a [T],
    /// Source attention vectors, `H × F`.
    pub a_src: &'a [T],
    /// Destination attention vectors, `H × F`.
    pub a_dst: &'a [T],
}

impl<T> GatInputs<'_, T> {
    fn validate(&self, block: &BlockView<'_>) -> Result<usize> {
        for (name, v) in [("heads", self.heads), ("head_dim", self.head_dim)] {
            if v == 0 {
                return Err(CpuOpsError::InvalidArgument {
                    name,
                    reason: "expected at least 1".into(),
                });
            }
        }
        let width =
            self.heads
                .checked_mul(self.head_dim)
                .ok_or_else(|| CpuOpsError::InvalidArgument {
                    name: "heads × head_dim",
                    reason: format!("{} × {} overflows", self.heads, self.head_dim),
                })?;
        check_matrix(
            "GAT z_src (num_src × heads·head_dim)",
            self.z_src.len(),
            block.num_src(),
            width,
        )?;
        check_matrix("GAT a_src (heads × head_dim)", self.a_src.len(), 1, width)?;
        check_matrix("GAT a_dst (heads × head_dim)", self.a_dst.len(), 1, width)?;
        if block.num_edges().checked_mul(self.heads).is_none() {
            return Err(CpuOpsError::InvalidArgument {
                name: "heads",
                reason: format!(
                    "{} edges × {} heads overflows",
                    block.num_edges(),
                    self.heads
                ),
            });
        }
        Ok(width)
    }
}

/// The buffers of a [`GatForward`], unchecked: what [`GatForward::into_parts`]
/// hands out and [`GatForward::from_parts`] checks and takes back (shapes as the
/// [`GatForward`] accessors of the same names lay them out).
#[derive(Clone, Debug, PartialEq)]
pub struct GatParts<T> {
    /// The output, `num_dst × heads·head_dim`.
    pub out: Vec<T>,
    /// Attention weights, edge-major, `num_edges × heads`.
    pub alpha: Vec<T>,
    /// Source scores, `num_src × heads`.
    pub el: Vec<T>,
    /// Destination scores, `num_dst × heads`.
    pub er: Vec<T>,
}

/// What [`gat_forward`] computes and [`gat_backward`] needs.
#[derive(Clone, Debug, PartialEq)]
pub struct GatForward<T> {
    heads: usize,
    head_dim: usize,
    num_src: usize,
    num_dst: usize,
    out: Vec<T>,
    alpha: Vec<T>,
    el: Vec<T>,
    er: Vec<T>,
}

impl<T: Real> GatForward<T> {
    /// The output, `num_dst × heads·head_dim`, row-major.
    pub fn out(&self) -> &[T] {
        &self.out
    }

    /// Takes the output, dropping the saved state.
    pub fn into_out(self) -> Vec<T> {
        self.out
    }

    /// Attention weights, edge-major: `alpha()[e * heads + h]` is `α_{e,h}`.
    pub fn alpha(&self) -> &[T] {
        &self.alpha
    }

    /// Number of heads.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// Width of each head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Source scores `el[j * heads + h] = a_src_h · z_{j,h}` (`num_src × heads`).
    pub fn el(&self) -> &[T] {
        &self.el
    }

    /// Destination scores `er[i * heads + h] = a_dst_h · z_{i,h}` (`num_dst × heads`).
    pub fn er(&self) -> &[T] {
        &self.er
    }

    /// Takes the state apart into its buffers, as the accessors lay them out.
    pub fn into_parts(self) -> GatParts<T> {
        GatParts {
            out: self.out,
            alpha: self.alpha,
            el: self.el,
            er: self.er,
        }
    }

    /// Rebuilds the state from its parts (e.g. kept in a device backend's buffers
    /// between forward and backward) for `heads` heads of width `head_dim` over a
    /// block of `num_src` sources and `num_dst` destinations. Checks that `out` is
    /// `num_dst × heads·head_dim`, `el` is `num_src × heads`, `er` is
    /// `num_dst × heads` and `alpha` holds whole edges (a multiple of `heads`);
    /// [`gat_backward`] checks `alpha` against the block.
    pub fn from_parts(
        heads: usize,
        head_dim: usize,
        num_src: usize,
        num_dst: usize,
        parts: GatParts<T>,
    ) -> Result<Self> {
        let GatParts { out, alpha, el, er } = parts;
        if heads == 0 || head_dim == 0 {
            return Err(CpuOpsError::InvalidArgument {
                name: "heads, head_dim",
                reason: format!("expected both at least 1, got {heads} and {head_dim}"),
            });
        }
        let width = heads
            .checked_mul(head_dim)
            .ok_or_else(|| CpuOpsError::InvalidArgument {
                name: "heads × head_dim",
                reason: format!("{heads} × {head_dim} overflows"),
            })?;
        check_matrix(
            "GAT saved out (num_dst × heads·head_dim)",
            out.len(),
            num_dst,
            width,
        )?;
        check_matrix("GAT saved el (num_src × heads)", el.len(), num_src, heads)?;
        check_matrix("GAT saved er (num_dst × heads)", er.len(), num_dst, heads)?;
        if !alpha.len().is_multiple_of(heads) {
            return Err(CpuOpsError::SizeMismatch {
                what: "GAT saved alpha (edges × heads)",
                expected: alpha.len() / heads * heads,
                found: alpha.len(),
            });
        }
        Ok(Self {
            heads,
            head_dim,
            num_src,
            num_dst,
            out,
            alpha,
            el,
            er,
        })
    }

    fn check(&self, block: &BlockView<'_>, inp: &GatInputs<'_, T>) -> Result<()> {
        let pairs = [
            ("GAT forward state: heads", inp.heads, self.heads),
            ("GAT forward state: head_dim", inp.head_dim, self.head_dim),
            ("GAT forward state: num_src", block.num_src(), self.num_src),
            ("GAT forward state: num_dst", block.num_dst(), self.num_dst),
            (
                "GAT forward state: edges × heads",
                block.num_edges().saturating_mul(self.heads),
                self.alpha.len(),
            ),
        ];
        for (what, expected, found) in pairs {
            if expected != found {
                return Err(CpuOpsError::SizeMismatch {
                    what,
                    expected,
                    found,
                });
            }
        }
        Ok(())
    }
}

/// Gradients of a GAT attention layer's inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct GatGrads<T> {
    /// `∂L/∂z_src`, `num_src × heads·head_dim`.
    pub z_src: Vec<T>,
    /// `∂L/∂a_src`, `heads × head_dim`.
    pub a_src: Vec<T>,
    /// `∂L/∂a_dst`, `heads × head_dim`.
    pub a_dst: Vec<T>,
}

fn leaky_slope<T: Real>(u: T) -> T {
    if u > T::ZERO {
        T::ONE
    } else {
        T::from_f64(GAT_NEGATIVE_SLOPE)
    }
}

/// Splits an edge-major buffer (`per_edge` values an edge) into one slice per
/// destination.
fn split_by_dst<'s, T>(
    buf: &'s mut [T],
    block: &BlockView<'_>,
    per_edge: usize,
) -> Vec<&'s mut [T]> {
    let mut parts = Vec::with_capacity(block.num_dst());
    let mut rest = buf;
    for i in 0..block.num_dst() {
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(block.in_degree(i) * per_edge);
        parts.push(part);
        rest = tail;
    }
    parts
}

/// `s[r, h] = a_h · z_{r,h}` for the first `rows` rows of `z`.
fn head_scores<T: Real, O: SimdOps<T>>(
    ops: O,
    z: &[T],
    a: &[T],
    rows: usize,
    heads: usize,
) -> Vec<T> {
    let width = a.len();
    let f = width / heads;
    let mut s = vec![T::ZERO; rows * heads];
    s.par_chunks_mut(heads)
        .zip(z[..rows * width].par_chunks(width))
        .with_min_len(min_rows_per_task(width))
        .for_each(|(s, zr)| {
            for (h, s) in s.iter_mut().enumerate() {
                *s = ops.dot(&a[h * f..(h + 1) * f], &zr[h * f..(h + 1) * f]);
            }
        });
    s
}

/// `Σ_r c[r, h] z_{r,h}` over the first `rows` rows, as an `H × F` vector; partial
/// sums over fixed ranges of [`PART_ROWS`] rows, added in range order.
fn head_weighted_sum<T: Real, O: SimdOps<T>>(
    ops: O,
    c: &[T],
    z: &[T],
    rows: usize,
    heads: usize,
    width: usize,
) -> Vec<T> {
    let f = width / heads;
    let parts: Vec<Vec<T>> = (0..rows.div_ceil(PART_ROWS))
        .into_par_iter()
        .map(|p| {
            let mut acc = vec![T::ZERO; width];
            for r in p * PART_ROWS..((p + 1) * PART_ROWS).min(rows) {
                let zr = &z[r * width..(r + 1) * width];
                for h in 0..heads {
                    let seg = h * f..(h + 1) * f;
                    ops.axpy(c[r * heads + h], &zr[seg.clone()], &mut acc[seg]);
                }
            }
            acc
        })
        .collect();
    let mut total = vec![T::ZERO; width];
    for p in &parts {
        ops.add(p, &mut total);
    }
    total
}

fn forward_with<T: Real, O: SimdOps<T>>(
    ops: O,
    block: &BlockView<'_>,
    inp: &GatInputs<'_, T>,
) -> Result<GatForward<T>> {
    let width = inp.validate(block)?;
    let (heads, f) = (inp.heads, inp.head_dim);
    let (num_src, num_dst) = (block.num_src(), block.num_dst());
    let z = inp.z_src;
    let el = head_scores(ops, z, inp.a_src, num_src, heads);
    let er = head_scores(ops, z, inp.a_dst, num_dst, heads);
    let mut alpha = vec![T::ZERO; block.num_edges() * heads];
    let mut out = vec![T::ZERO; num_dst * width];
    let avg_deg = block.num_edges() / num_dst.max(1) + 1;
    out.par_chunks_mut(width)
        .zip(split_by_dst(&mut alpha, block, heads))
        .with_min_len(min_rows_per_task(width * avg_deg))
        .enumerate()
        .for_each(|(i, (out_i, al))| {
            let nbrs = block.neighbors(i);
            if nbrs.is_empty() {
                return;
            }
            let er_i = &er[i * heads..(i + 1) * heads];
            for (k, &j) in nbrs.iter().enumerate() {
                let el_j = &el[j as usize * heads..(j as usize + 1) * heads];
                for h in 0..heads {
                    let u = el_j[h] + er_i[h];
                    al[k * heads + h] = u * leaky_slope(u);
                }
            }
            for h in 0..heads {
                let m = (1..nbrs.len()).fold(al[h], |m, k| m.max(al[k * heads + h]));
                let mut sum = T::ZERO;
                for k in 0..nbrs.len() {
                    let p = (al[k * heads + h] - m).exp();
                    al[k * heads + h] = p;
                    sum += p;
                }
                for k in 0..nbrs.len() {
                    al[k * heads + h] /= sum;
                }
            }
            for (k, &j) in nbrs.iter().enumerate() {
                let zj = &z[j as usize * width..(j as usize + 1) * width];
                for h in 0..heads {
                    let seg = h * f..(h + 1) * f;
                    ops.axpy(al[k * heads + h], &zj[seg.clone()], &mut out_i[seg]);
                }
            }
        });
    Ok(GatForward {
        heads,
        head_dim: f,
        num_src,
        num_dst,
        out,
        alpha,
        el,
        er,
    })
}

fn backward_with<T: Real, O: SimdOps<T>>(
    ops: O,
    block: &BlockView<'_>,
    inp: &GatInputs<'_, T>,
    fwd: &GatForward<T>,
    grad_out: &[T],
) -> Result<GatGrads<T>> {
    let width = inp.validate(block)?;
    fwd.check(block, inp)?;
    let (heads, f) = (inp.heads, inp.head_dim);
    let (num_src, num_dst) = (block.num_src(), block.num_dst());
    check_matrix(
        "GAT output gradient (num_dst × heads·head_dim)",
        grad_out.len(),
        num_dst,
        width,
    )?;
    let z = inp.z_src;
    let alpha = &fwd.alpha;
    let avg_deg = block.num_edges() / num_dst.max(1) + 1;

    // 1. Per destination: ∂u per edge and head, ∂er per destination and head.
    let mut du = vec![T::ZERO; block.num_edges() * heads];
    let mut der = vec![T::ZERO; num_dst * heads];
    der.par_chunks_mut(heads)
        .zip(split_by_dst(&mut du, block, heads))
        .with_min_len(min_rows_per_task(width * avg_deg))
        .enumerate()
        .for_each(|(i, (der_i, du_i))| {
            let nbrs = block.neighbors(i);
            if nbrs.is_empty() {
                return;
            }
            let e0 = block.edge_range(i).start;
            let al = &alpha[e0 * heads..(e0 + nbrs.len()) * heads];
            let g_i = &grad_out[i * width..(i + 1) * width];
            for (k, &j) in nbrs.iter().enumerate() {
                let zj = &z[j as usize * width..(j as usize + 1) * width];
                for h in 0..heads {
                    let seg = h * f..(h + 1) * f;
                    du_i[k * heads + h] = ops.dot(&g_i[seg.clone()], &zj[seg]);
                }
            }
            for h in 0..heads {
                let gbar = (0..nbrs.len())
                    .fold(T::ZERO, |s, k| s + al[k * heads + h] * du_i[k * heads + h]);
                let mut acc = T::ZERO;
                for (k, &j) in nbrs.iter().enumerate() {
                    let u = fwd.el[j as usize * heads + h] + fwd.er[i * heads + h];
                    let v = al[k * heads + h] * (du_i[k * heads + h] - gbar) * leaky_slope(u);
                    du_i[k * heads + h] = v;
                    acc += v;
                }
                der_i[h] = acc;
            }
        });

    // 2. Per source, over the transpose: ∂z and ∂el.
    let tr = block.transpose();
    let mut gz = vec![T::ZERO; num_src * width];
    let mut del = vec![T::ZERO; num_src * heads];
    let avg_out = block.num_edges() / num_src.max(1) + 1;
    gz.par_chunks_mut(width)
        .zip(del.par_chunks_mut(heads))
        .with_min_len(min_rows_per_task(width * avg_out))
        .enumerate()
        .for_each(|(j, (gz_j, del_j))| {
            for (&i, &e) in tr.dsts(j).iter().zip(tr.edges(j)) {
                let e = e as usize;
                let g_i = &grad_out[i as usize * width..(i as usize + 1) * width];
                for h in 0..heads {
                    let seg = h * f..(h + 1) * f;
                    ops.axpy(alpha[e * heads + h], &g_i[seg.clone()], &mut gz_j[seg]);
                    del_j[h] += du[e * heads + h];
                }
            }
            for h in 0..heads {
                let seg = h * f..(h + 1) * f;
                ops.axpy(del_j[h], &inp.a_src[seg.clone()], &mut gz_j[seg.clone()]);
                if j < num_dst {
                    ops.axpy(der[j * heads + h], &inp.a_dst[seg.clone()], &mut gz_j[seg]);
                }
            }
        });

    // 3. Attention vectors.
    let a_src = head_weighted_sum(ops, &del, z, num_src, heads, width);
    let a_dst = head_weighted_sum(ops, &der, z, num_dst, heads, width);
    Ok(GatGrads {
        z_src: gz,
        a_src,
        a_dst,
    })
}

/// GAT attention forward, scalar twin for any [`Real`] (formulas in the module doc).
pub fn gat_forward<T: Real>(
    block: &BlockView<'_>,
    inp: &GatInputs<'_, T>,
) -> Result<GatForward<T>> {
    forward_with(Scalar, block, inp)
}

/// GAT attention backward, scalar twin: gradients of `z_src`, `a_src` and `a_dst`
/// given `grad_out` (`num_dst × heads·head_dim`) and the forward's saved state.
pub fn gat_backward<T: Real>(
    block: &BlockView<'_>,
    inp: &GatInputs<'_, T>,
    fwd: &GatForward<T>,
    grad_out: &[T],
) -> Result<GatGrads<T>> {
    backward_with(Scalar, block, inp, fwd, grad_out)
}

/// [`gat_forward`] for `f32`, loops over the head width at the level of `simd`.
pub fn gat_forward_f32(
    simd: Simd,
    block: &BlockView<'_>,
    inp: &GatInputs<'_, f32>,
) -> Result<GatForward<f32>> {
    forward_with(simd, block, inp)
}

/// [`gat_backward`] for `f32`, loops over the head width at the level of `simd`.
pub fn gat_backward_f32(
    simd: Simd,
    block: &BlockView<'_>,
    inp: &GatInputs<'_, f32>,
    fwd: &GatForward<f32>,
    grad_out: &[f32],
) -> Result<GatGrads<f32>> {
    backward_with(simd, block, inp, fwd, grad_out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::tests::{rand_vec, random_block, DIMS};
    use crate::aggregate::{aggregate_forward, AggregateKind};
    use crate::rng::Rng;
    use crate::simd::SimdLevel;

    struct Case<T> {
        num_src: usize,
        indptr: Vec<u64>,
        indices: Vec<u32>,
        heads: usize,
        f: usize,
        z: Vec<T>,
        a_src: Vec<T>,
        a_dst: Vec<T>,
        g: Vec<T>,
    }

    impl<T: Real> Case<T> {
        fn new(
            rng: &mut Rng,
            num_dst: usize,
            num_src: usize,
            max_deg: u64,
            heads: usize,
            f: usize,
        ) -> Self {
            let (indptr, indices) = random_block(rng, num_dst, num_src, max_deg);
            let w = heads * f;
            Self {
                num_src,
                indptr,
                indices,
                heads,
                f,
                z: rand_vec(rng, num_src * w),
                a_src: rand_vec(rng, w),
                a_dst: rand_vec(rng, w),
                g: rand_vec(rng, num_dst * w),
            }
        }

        fn block(&self) -> BlockView<'_> {
            BlockView::new(self.num_src, &self.indptr, &self.indices).unwrap()
        }

        fn inputs(&self) -> GatInputs<'_, T> {
            GatInputs {
                heads: self.heads,
                head_dim: self.f,
                z_src: &self.z,
                a_src: &self.a_src,
                a_dst: &self.a_dst,
            }
        }

        fn to_f32(&self) -> Case<f32> {
            let c = |v: &[T]| v.iter().map(|x| x.to_f64() as f32).collect();
            Case {
                num_src: self.num_src,
                indptr: self.indptr.clone(),
                indices: self.indices.clone(),
                heads: self.heads,
                f: self.f,
                z: c(&self.z),
                a_src: c(&self.a_src),
                a_dst: c(&self.a_dst),
                g: c(&self.g),
            }
        }
    }

    fn assert_close(got: &[f32], want: &[f32], tol: f64, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs() as f64));
        for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(
                ((g - w).abs() as f64) <= tol * scale,
                "{what}[{k}]: {g} vs {w}"
            );
        }
    }

    #[test]
    fn softmax_is_normalized_and_isolated_dsts_are_zero() {
        let mut rng = Rng::new(31);
        let c: Case<f64> = Case::new(&mut rng, 30, 70, 9, 3, 5);
        let b = c.block();
        let fwd = gat_forward(&b, &c.inputs()).unwrap();
        let w = c.heads * c.f;
        let mut isolated = 0;
        for i in 0..b.num_dst() {
            let r = b.edge_range(i);
            if r.is_empty() {
                isolated += 1;
                assert!(fwd.out()[i * w..(i + 1) * w].iter().all(|&v| v == 0.0));
                continue;
            }
            for h in 0..c.heads {
                let s: f64 = r.clone().map(|e| fwd.alpha()[e * c.heads + h]).sum();
                assert!((s - 1.0).abs() < 1e-12, "dst {i} head {h}: {s}");
            }
        }
        assert!(isolated > 0);
    }

    #[test]
    fn zero_attention_vectors_give_mean_aggregation() {
        let mut rng = Rng::new(32);
        let mut c: Case<f64> = Case::new(&mut rng, 20, 50, 8, 2, 4);
        c.a_src.fill(0.0);
        c.a_dst.fill(0.0);
        let b = c.block();
        let out = gat_forward(&b, &c.inputs()).unwrap().into_out();
        let mut mean = vec![0.0; b.num_dst() * 8];
        aggregate_forward(&b, AggregateKind::Mean, &c.z, 8, &mut mean).unwrap();
        for (a, m) in out.iter().zip(&mean) {
            assert!((a - m).abs() < 1e-12);
        }
    }

    /// `z_src`, `a_src` or `a_dst` of a case.
    fn param(c: &mut Case<f64>, which: usize) -> &mut Vec<f64> {
        match which {
            0 => &mut c.z,
            1 => &mut c.a_src,
            _ => &mut c.a_dst,
        }
    }

    #[test]
    fn gradients_match_finite_differences_in_f64() {
        let mut rng = Rng::new(33);
        for (num_dst, num_src, heads, f) in [(5, 9, 2, 3), (4, 4, 1, 1), (7, 12, 3, 2)] {
            let mut c: Case<f64> = Case::new(&mut rng, num_dst, num_src, 5, heads, f);
            // Scale up scores so the softmax is far from uniform.
            for v in c.a_src.iter_mut().chain(c.a_dst.iter_mut()) {
                *v *= 2.0;
            }
            let (indptr, indices, g) = (c.indptr.clone(), c.indices.clone(), c.g.clone());
            let b = BlockView::new(num_src, &indptr, &indices).unwrap();
            let fwd = gat_forward(&b, &c.inputs()).unwrap();
            let grads = gat_backward(&b, &c.inputs(), &fwd, &g).unwrap();
            let loss = |c: &Case<f64>| -> f64 {
                let out = gat_forward(&b, &c.inputs()).unwrap().into_out();
                out.iter().zip(&g).map(|(o, g)| o * g).sum()
            };
            let eps = 1e-6;
            for (which, analytic) in [grads.z_src, grads.a_src, grads.a_dst].iter().enumerate() {
                for (k, &an) in analytic.iter().enumerate() {
                    let orig = param(&mut c, which)[k];
                    param(&mut c, which)[k] = orig + eps;
                    let up = loss(&c);
                    param(&mut c, which)[k] = orig - eps;
                    let down = loss(&c);
                    param(&mut c, which)[k] = orig;
                    let fd = (up - down) / (2.0 * eps);
                    let rel = (fd - an).abs() / fd.abs().max(an.abs()).max(1e-2);
                    assert!(
                        rel < 1e-4,
                        "tensor {which} entry {k} ({num_dst}x{num_src} H={heads} F={f}): \
                         fd {fd} vs analytic {an}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_simd_level_matches_the_scalar_twin() {
        let mut rng = Rng::new(34);
        for f in DIMS {
            let heads = if f > 64 { 1 } else { 3 };
            let c64: Case<f64> = Case::new(&mut rng, 23, 47, 12, heads, f);
            let c = c64.to_f32();
            let b = c.block();
            let want_fwd = gat_forward(&b, &c.inputs()).unwrap();
            let want = gat_backward(&b, &c.inputs(), &want_fwd, &c.g).unwrap();
            for level in SimdLevel::available() {
                let s = Simd::new(level).unwrap();
                let what = format!("{level} H={heads} F={f}");
                let got_fwd = gat_forward_f32(s, &b, &c.inputs()).unwrap();
                assert_close(got_fwd.out(), want_fwd.out(), 2e-5, &format!("out {what}"));
                assert_close(
                    got_fwd.alpha(),
                    want_fwd.alpha(),
                    2e-5,
                    &format!("α {what}"),
                );
                let got = gat_backward_f32(s, &b, &c.inputs(), &got_fwd, &c.g).unwrap();
                assert_close(&got.z_src, &want.z_src, 5e-5, &format!("∂z {what}"));
                assert_close(&got.a_src, &want.a_src, 5e-5, &format!("∂a_src {what}"));
                assert_close(&got.a_dst, &want.a_dst, 5e-5, &format!("∂a_dst {what}"));
            }
        }
    }

    #[test]
    fn backward_is_bitwise_deterministic_across_thread_counts() {
        let mut rng = Rng::new(35);
        let c: Case<f32> = Case::new(&mut rng, 1500, 4000, 20, 4, 16);
        let run = |threads: usize, level: SimdLevel| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let b = c.block();
                let s = Simd::new(level).unwrap();
                let fwd = gat_forward_f32(s, &b, &c.inputs()).unwrap();
                let gr = gat_backward_f32(s, &b, &c.inputs(), &fwd, &c.g).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                (
                    bits(fwd.out()),
                    bits(&gr.z_src),
                    bits(&gr.a_src),
                    bits(&gr.a_dst),
                )
            })
        };
        for level in SimdLevel::available() {
            assert!(run(1, level) == run(2, level), "{level}");
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let mut rng = Rng::new(36);
        let c: Case<f32> = Case::new(&mut rng, 6, 10, 4, 2, 3);
        let b = c.block();
        let s = Simd::detect();
        let ok = c.inputs();
        let fwd = gat_forward_f32(s, &b, &ok).unwrap();
        let bad = [
            GatInputs { heads: 0, ..ok },
            GatInputs { head_dim: 0, ..ok },
            GatInputs { heads: 3, ..ok },
            GatInputs {
                z_src: &c.z[1..],
                ..ok
            },
            GatInputs {
                a_src: &c.a_src[1..],
                ..ok
            },
            GatInputs { a_dst: &c.z, ..ok },
            GatInputs {
                heads: usize::MAX,
                ..ok
            },
        ];
        for inp in &bad {
            assert!(gat_forward_f32(s, &b, inp).is_err(), "{inp:?}");
            assert!(gat_backward(&b, inp, &fwd, &c.g).is_err(), "{inp:?}");
        }
        assert!(matches!(
            gat_backward_f32(s, &b, &ok, &fwd, &c.g[1..]),
            Err(CpuOpsError::SizeMismatch { .. })
        ));
        // Saved state from another block.
        let other: Case<f32> = Case::new(&mut rng, 6, 10, 4, 2, 3);
        let ob = other.block();
        let ofwd = gat_forward_f32(s, &ob, &other.inputs()).unwrap();
        if ob.num_edges() != b.num_edges() {
            assert!(gat_backward_f32(s, &b, &ok, &ofwd, &c.g).is_err());
        }
        assert!(gat_backward_f32(s, &b, &ok, &fwd, &c.g).is_ok());
    }

    #[test]
    fn state_round_trips_through_its_parts() {
        let mut rng = Rng::new(37);
        let c: Case<f32> = Case::new(&mut rng, 9, 21, 6, 2, 5);
        let b = c.block();
        let s = Simd::detect();
        let fwd = gat_forward_f32(s, &b, &c.inputs()).unwrap();
        let want = gat_backward_f32(s, &b, &c.inputs(), &fwd, &c.g).unwrap();
        assert_eq!(fwd.el().len(), 21 * 2);
        assert_eq!(fwd.er().len(), 9 * 2);
        let parts = fwd.clone().into_parts();
        let back = GatForward::from_parts(2, 5, 21, 9, parts.clone()).unwrap();
        assert_eq!(back, fwd);
        let got = gat_backward_f32(s, &b, &c.inputs(), &back, &c.g).unwrap();
        assert_eq!(got, want);
        // Wrong sizes are errors naming the part.
        let short = |v: &Vec<f32>| v[1..].to_vec();
        assert!(GatForward::from_parts(0, 5, 21, 9, parts.clone()).is_err());
        let bad = [
            GatParts {
                out: short(&parts.out),
                ..parts.clone()
            },
            GatParts {
                alpha: short(&parts.alpha),
                ..parts.clone()
            },
            GatParts {
                el: short(&parts.el),
                ..parts.clone()
            },
            GatParts {
                er: short(&parts.er),
                ..parts.clone()
            },
        ];
        for p in bad {
            assert!(GatForward::from_parts(2, 5, 21, 9, p).is_err());
        }
    }
}
