//! Neighbor aggregation over a sampled block, forward and backward.
//!
//! A [`BlockView`] is DGL's message-flow graph as raw CSR slices: `num_src` source
//! vertices, `indptr` (`num_dst + 1` offsets) and `indices` (local source ids). The
//! destinations come first among the sources, so destination `i` is also source `i`
//! (`num_dst <= num_src`). Edge `e` in `indptr[i]..indptr[i+1]` carries the message
//! of source `j = indices[e]` to destination `i`; `N(i)` is that list (a source listed
//! twice counts twice).
//!
//! Degrees, both counted in the block and clamped to at least 1 where they divide:
//! `d_in(i) = |N(i)|` and `d_out(j)` = the number of edges whose source is `j`.
//!
//! Forward, `x` is `num_src × dim`, `h` is `num_dst × dim` (row-major):
//! - `Sum`:     `h_i = Σ_{j∈N(i)} x_j`
//! - `Mean`:    `h_i = (1 / d_in(i)) Σ_{j∈N(i)} x_j` (a destination without neighbors
//!   gets a zero row)
//! - `GcnNorm`: `h_i = Σ_{j∈N(i)} x_j / sqrt(d_out(j) · d_in(i))`, DGL's
//!   `GraphConv(norm="both")` on a block (before its weight and bias). The kernel adds
//!   no self-loops: a model that wants them puts them in the block.
//!
//! Every kind is linear, `h = A x` with `A_ij = Σ_{e=(j→i)} c_e` and `c_e = 1`,
//! `1/d_in(i)` or `1/sqrt(d_out(j)·d_in(i))`. Backward is the adjoint,
//! `grad_x = Aᵀ grad_h`: `grad_x_j = Σ_{e=(j→i)} c_e · grad_h_i`, a zero row for a
//! source no edge reads.
//!
//! Backward is a scatter-add in edge order; it runs as a gather instead, over the
//! block's transpose (per source, its `(dst, edge)` pairs in increasing edge order,
//! built once per block and cached). Each output row is then written by one thread
//! summing in one fixed order: the result is parallel, lock-free, and bit-identical
//! for every thread count.
//!
//! Each kernel has a generic scalar twin over [`Real`] ([`aggregate_forward`],
//! [`aggregate_backward`]; `f64` for gradient checks, the reference in tests) and an
//! `f32` fast path taking a [`Simd`] token ([`aggregate_forward_f32`],
//! [`aggregate_backward_f32`]). Both run the same driver; only the row primitive
//! [`SimdOps::gather_sum`] differs.

use std::ops::Range;
use std::sync::OnceLock;

use rayon::prelude::*;

use crate::error::{CpuOpsError, Result};
use crate::real::Real;
use crate::simd::{GatherRows, Scalar, Simd, SimdOps};

/// Which neighbor aggregation to compute (formulas in the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AggregateKind {
    /// `h_i = Σ_{j∈N(i)} x_j`.
    Sum,
    /// `h_i = Σ_{j∈N(i)} x_j / d_in(i)`; zero row without neighbors.
    Mean,
    /// `h_i = Σ_{j∈N(i)} x_j / sqrt(d_out(j) · d_in(i))`, degrees clamped to ≥ 1.
    GcnNorm,
}

/// A validated sampled block (message-flow graph) over borrowed CSR slices.
///
/// The transpose (per source, its destinations and edges) is built on first use by
/// a backward pass or by [`AggregateKind::GcnNorm`], then cached for the block's life.
#[derive(Debug)]
pub struct BlockView<'a> {
    num_src: usize,
    indptr: &'a [u64],
    indices: &'a [u32],
    transpose: OnceLock<Transpose>,
}

/// Per source `j`, entries `offsets[j]..offsets[j+1]` of `dst`/`edge` list the edges
/// reading `j`, in increasing edge (hence destination) order. `u32` throughout:
/// [`BlockView::new`] caps a block at `u32::MAX` edges.
#[derive(Debug)]
pub(crate) struct Transpose {
    offsets: Vec<u32>,
    dst: Vec<u32>,
    edge: Vec<u32>,
}

impl Transpose {
    /// Counting sort, sequential, O(num_src + edges): count, prefix-sum to segment
    /// ends, then place edges from last to first, moving each source's end down.
    fn build(b: &BlockView<'_>) -> Self {
        let n = b.num_src;
        let num_edges = b.indices.len();
        let mut offsets = vec![0u32; n + 1];
        for &j in b.indices {
            offsets[j as usize + 1] += 1;
        }
        for j in 0..n {
            offsets[j + 1] += offsets[j];
        }
        // Now offsets[j + 1] is the end of source j's segment.
        let mut dst = vec![0u32; num_edges];
        let mut edge = vec![0u32; num_edges];
        for i in (0..b.num_dst()).rev() {
            for e in b.edge_range(i).rev() {
                let slot = &mut offsets[b.indices[e] as usize + 1];
                *slot -= 1;
                let p = *slot as usize;
                // `BlockView::new` checked that destination and edge ids fit u32.
                dst[p] = i as u32;
                edge[p] = e as u32;
            }
        }
        // Now offsets[j + 1] is the start of source j's segment: shift down one.
        offsets.copy_within(1.., 0);
        offsets[n] = num_edges as u32;
        Self { offsets, dst, edge }
    }

    /// Entries of source `j`.
    fn range(&self, j: usize) -> Range<usize> {
        self.offsets[j] as usize..self.offsets[j + 1] as usize
    }

    /// Number of edges reading source `j`.
    pub(crate) fn out_degree(&self, j: usize) -> usize {
        self.range(j).len()
    }

    /// Destinations reading source `j`, in edge order.
    pub(crate) fn dsts(&self, j: usize) -> &[u32] {
        &self.dst[self.range(j)]
    }

    /// Destinations reading the sources after `j`: what the next rows will read.
    pub(crate) fn dsts_after(&self, j: usize) -> &[u32] {
        &self.dst[self.offsets[j + 1] as usize..]
    }

    /// Edge ids reading source `j`, in increasing order.
    pub(crate) fn edges(&self, j: usize) -> &[u32] {
        &self.edge[self.range(j)]
    }
}

impl<'a> BlockView<'a> {
    /// Validates and wraps a block: `indptr` non-empty, starting at 0, never
    /// decreasing and ending at `indices.len()`; `num_dst = indptr.len() - 1` at most
    /// `num_src`; fewer than 2³² edges; every index below `num_src`. Runs in
    /// O(dst + edges).
    pub fn new(num_src: usize, indptr: &'a [u64], indices: &'a [u32]) -> Result<Self> {
        let Some((&last, _)) = indptr.split_last() else {
            return Err(CpuOpsError::InvalidCsr {
                what: "block indptr is empty (it needs num_dst + 1 entries)".into(),
            });
        };
        let num_dst = indptr.len() - 1;
        if indptr[0] != 0 {
            return Err(CpuOpsError::InvalidCsr {
                what: format!("block indptr[0] is {}, expected 0", indptr[0]),
            });
        }
        if last != indices.len() as u64 {
            return Err(CpuOpsError::InvalidCsr {
                what: format!(
                    "block indptr[{num_dst}] is {last}, expected the number of indices {}",
                    indices.len()
                ),
            });
        }
        if let Some(i) = indptr.windows(2).position(|w| w[0] > w[1]) {
            return Err(CpuOpsError::InvalidCsr {
                what: format!(
                    "block indptr decreases at destination {i} ({} > {})",
                    indptr[i],
                    indptr[i + 1]
                ),
            });
        }
        if num_dst > num_src {
            return Err(CpuOpsError::InvalidCsr {
                what: format!(
                    "block has {num_dst} destinations but only {num_src} sources \
                     (destinations must be the first sources)"
                ),
            });
        }
        if indices.len() >= u32::MAX as usize {
            return Err(CpuOpsError::InvalidCsr {
                what: format!("{} block edges do not fit u32 edge ids", indices.len()),
            });
        }
        if let Some(&bad) = indices.par_iter().find_first(|&&j| j as usize >= num_src) {
            return Err(CpuOpsError::VertexOutOfRange {
                context: "block indices",
                vertex: bad as u64,
                num_vertices: num_src,
            });
        }
        Ok(Self {
            num_src,
            indptr,
            indices,
            transpose: OnceLock::new(),
        })
    }

    /// Number of source vertices (rows of the input features).
    pub fn num_src(&self) -> usize {
        self.num_src
    }

    /// Number of destination vertices (rows of the output).
    pub fn num_dst(&self) -> usize {
        self.indptr.len() - 1
    }

    /// Number of edges.
    pub fn num_edges(&self) -> usize {
        self.indices.len()
    }

    /// The offsets (`num_dst + 1` entries).
    pub fn indptr(&self) -> &'a [u64] {
        self.indptr
    }

    /// The local source ids of all edges.
    pub fn indices(&self) -> &'a [u32] {
        self.indices
    }

    /// Edge ids of destination `i` (panics if `i >= num_dst`).
    pub fn edge_range(&self, i: usize) -> Range<usize> {
        self.indptr[i] as usize..self.indptr[i + 1] as usize
    }

    /// Source ids of destination `i`, `N(i)` (panics if `i >= num_dst`).
    pub fn neighbors(&self, i: usize) -> &'a [u32] {
        &self.indices[self.edge_range(i)]
    }

    /// Source ids of the destinations after `i`: what the next rows will read.
    fn neighbors_after(&self, i: usize) -> &'a [u32] {
        &self.indices[self.indptr[i + 1] as usize..]
    }

    /// `d_in(i)`: edges into destination `i`, not clamped (panics if `i >= num_dst`).
    pub fn in_degree(&self, i: usize) -> usize {
        self.edge_range(i).len()
    }

    /// `d_out(j)`: edges reading source `j`, not clamped (builds the transpose on
    /// first use; panics if `j >= num_src`).
    pub fn out_degree(&self, j: usize) -> usize {
        self.transpose().out_degree(j)
    }

    /// The transpose, built on first use.
    pub(crate) fn transpose(&self) -> &Transpose {
        self.transpose.get_or_init(|| Transpose::build(self))
    }

    /// Builds the cached transpose now (e.g. outside a timed region).
    pub fn prepare_transpose(&self) {
        self.transpose();
    }
}

/// Checks that a row-major matrix has `rows × cols` values.
pub(crate) fn check_matrix(what: &'static str, len: usize, rows: usize, cols: usize) -> Result<()> {
    let expected = rows
        .checked_mul(cols)
        .ok_or_else(|| CpuOpsError::InvalidArgument {
            name: what,
            reason: format!("{rows} × {cols} overflows"),
        })?;
    if len != expected {
        return Err(CpuOpsError::SizeMismatch {
            what,
            expected,
            found: len,
        });
    }
    Ok(())
}

/// Rows per rayon task so that a task touches at least a few thousand values.
pub(crate) fn min_rows_per_task(values_per_row: usize) -> usize {
    (4096 / values_per_row.max(1)).max(1)
}

/// `1 / max(d, 1)` or `1 / sqrt(max(d, 1))`, computed in `f64`.
fn inv_degree<T: Real>(d: usize, sqrt: bool) -> T {
    let d = d.max(1) as f64;
    T::from_f64(if sqrt { 1.0 / d.sqrt() } else { 1.0 / d })
}

fn forward_with<T: Real, O: SimdOps<T>>(
    ops: O,
    block: &BlockView<'_>,
    kind: AggregateKind,
    x: &[T],
    dim: usize,
    out: &mut [T],
) -> Result<()> {
    check_matrix(
        "aggregate input (num_src × dim)",
        x.len(),
        block.num_src(),
        dim,
    )?;
    check_matrix(
        "aggregate output (num_dst × dim)",
        out.len(),
        block.num_dst(),
        dim,
    )?;
    if dim == 0 {
        return Ok(());
    }
    // Per-source weight 1/sqrt(d_out(j)) for GcnNorm; the destination factor is `post`.
    let src_w: Option<Vec<T>> = match kind {
        AggregateKind::GcnNorm => {
            let tr = block.transpose();
            Some(
                (0..block.num_src())
                    .into_par_iter()
                    .map(|j| inv_degree(tr.out_degree(j), true))
                    .collect(),
            )
        }
        AggregateKind::Sum | AggregateKind::Mean => None,
    };
    let avg_deg = block.num_edges() / block.num_dst().max(1) + 1;
    out.par_chunks_mut(dim)
        .with_min_len(min_rows_per_task(dim * avg_deg))
        .enumerate()
        .for_each(|(i, row)| {
            let nbrs = block.neighbors(i);
            let post = match kind {
                AggregateKind::Sum => T::ONE,
                AggregateKind::Mean => inv_degree(nbrs.len(), false),
                AggregateKind::GcnNorm => inv_degree(nbrs.len(), true),
            };
            let src = GatherRows {
                data: x,
                dim,
                weights: src_w.as_deref(),
            };
            ops.gather_sum(src, nbrs, block.neighbors_after(i), post, row);
        });
    Ok(())
}

fn backward_with<T: Real, O: SimdOps<T>>(
    ops: O,
    block: &BlockView<'_>,
    kind: AggregateKind,
    grad_out: &[T],
    dim: usize,
    grad_x: &mut [T],
) -> Result<()> {
    check_matrix(
        "aggregate output gradient (num_dst × dim)",
        grad_out.len(),
        block.num_dst(),
        dim,
    )?;
    check_matrix(
        "aggregate input gradient (num_src × dim)",
        grad_x.len(),
        block.num_src(),
        dim,
    )?;
    if dim == 0 {
        return Ok(());
    }
    let tr = block.transpose();
    // Per-destination weight; for GcnNorm the source factor is `post`.
    let dst_w: Option<Vec<T>> = match kind {
        AggregateKind::Sum => None,
        AggregateKind::Mean | AggregateKind::GcnNorm => {
            let sqrt = kind == AggregateKind::GcnNorm;
            Some(
                (0..block.num_dst())
                    .into_par_iter()
                    .map(|i| inv_degree(block.in_degree(i), sqrt))
                    .collect(),
            )
        }
    };
    let avg_deg = block.num_edges() / block.num_src().max(1) + 1;
    grad_x
        .par_chunks_mut(dim)
        .with_min_len(min_rows_per_task(dim * avg_deg))
        .enumerate()
        .for_each(|(j, row)| {
            let post = match kind {
                AggregateKind::GcnNorm => inv_degree(tr.out_degree(j), true),
                AggregateKind::Sum | AggregateKind::Mean => T::ONE,
            };
            let src = GatherRows {
                data: grad_out,
                dim,
                weights: dst_w.as_deref(),
            };
            ops.gather_sum(src, tr.dsts(j), tr.dsts_after(j), post, row);
        });
    Ok(())
}

/// Forward aggregation, scalar twin for any [`Real`]: `out = A x` (module doc).
///
/// `x` is `num_src × dim` and `out` is `num_dst × dim`, row-major; every row of
/// `out` is overwritten. Wrong sizes give [`CpuOpsError::SizeMismatch`].
pub fn aggregate_forward<T: Real>(
    block: &BlockView<'_>,
    kind: AggregateKind,
    x: &[T],
    dim: usize,
    out: &mut [T],
) -> Result<()> {
    forward_with(Scalar, block, kind, x, dim, out)
}

/// Backward aggregation, scalar twin for any [`Real`]: `grad_x = Aᵀ grad_out`.
///
/// `grad_out` is `num_dst × dim`, `grad_x` is `num_src × dim` and fully
/// overwritten (rows no edge reads become zero). Parallel and deterministic.
pub fn aggregate_backward<T: Real>(
    block: &BlockView<'_>,
    kind: AggregateKind,
    grad_out: &[T],
    dim: usize,
    grad_x: &mut [T],
) -> Result<()> {
    backward_with(Scalar, block, kind, grad_out, dim, grad_x)
}

/// [`aggregate_forward`] for `f32` at the level of `simd` (pass [`Simd::detect`]).
pub fn aggregate_forward_f32(
    simd: Simd,
    block: &BlockView<'_>,
    kind: AggregateKind,
    x: &[f32],
    dim: usize,
    out: &mut [f32],
) -> Result<()> {
    forward_with(simd, block, kind, x, dim, out)
}

/// [`aggregate_backward`] for `f32` at the level of `simd` (pass [`Simd::detect`]).
pub fn aggregate_backward_f32(
    simd: Simd,
    block: &BlockView<'_>,
    kind: AggregateKind,
    grad_out: &[f32],
    dim: usize,
    grad_x: &mut [f32],
) -> Result<()> {
    backward_with(simd, block, kind, grad_out, dim, grad_x)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::rng::Rng;
    use crate::simd::SimdLevel;

    pub(crate) const DIMS: [usize; 10] = [1, 3, 7, 15, 16, 17, 31, 33, 100, 129];
    const KINDS: [AggregateKind; 3] = [
        AggregateKind::Sum,
        AggregateKind::Mean,
        AggregateKind::GcnNorm,
    ];

    /// A random block: about a quarter of the destinations have no neighbors, the
    /// others up to `max_deg` (repeats possible), and some sources are never read.
    pub(crate) fn random_block(
        rng: &mut Rng,
        num_dst: usize,
        num_src: usize,
        max_deg: u64,
    ) -> (Vec<u64>, Vec<u32>) {
        let mut indptr = vec![0u64];
        let mut indices = Vec::new();
        // Leave the last quarter of the sources unread.
        let readable = (num_src - num_src / 4).max(1) as u64;
        for _ in 0..num_dst {
            if rng.below(4) != 0 {
                for _ in 0..rng.below(max_deg) + 1 {
                    indices.push(rng.below(readable) as u32);
                }
            }
            indptr.push(indices.len() as u64);
        }
        (indptr, indices)
    }

    pub(crate) fn rand_vec<T: Real>(rng: &mut Rng, n: usize) -> Vec<T> {
        (0..n)
            .map(|_| T::from_f64(rng.next_f64() * 2.0 - 1.0))
            .collect()
    }

    /// Coefficient `c_e` of edge `e = (j → i)`, straight from the definition.
    fn coef(kind: AggregateKind, indptr: &[u64], indices: &[u32], i: usize, j: u32) -> f64 {
        let d_in = (indptr[i + 1] - indptr[i]).max(1) as f64;
        let d_out = indices.iter().filter(|&&s| s == j).count().max(1) as f64;
        match kind {
            AggregateKind::Sum => 1.0,
            AggregateKind::Mean => 1.0 / d_in,
            AggregateKind::GcnNorm => 1.0 / (d_out * d_in).sqrt(),
        }
    }

    /// Sequential scatter reference: forward and backward in edge order, in f64.
    fn reference(
        kind: AggregateKind,
        num_src: usize,
        indptr: &[u64],
        indices: &[u32],
        x: &[f64],
        g: &[f64],
        dim: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let num_dst = indptr.len() - 1;
        let mut out = vec![0.0; num_dst * dim];
        let mut gx = vec![0.0; num_src * dim];
        for i in 0..num_dst {
            for e in indptr[i] as usize..indptr[i + 1] as usize {
                let j = indices[e];
                let c = coef(kind, indptr, indices, i, j);
                let j = j as usize;
                for k in 0..dim {
                    out[i * dim + k] += c * x[j * dim + k];
                    gx[j * dim + k] += c * g[i * dim + k];
                }
            }
        }
        (out, gx)
    }

    fn assert_close<A: Real, B: Real>(got: &[A], want: &[B], tol: f64, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        let scale = want.iter().fold(1.0f64, |m, v| m.max(v.to_f64().abs()));
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            let (g, w) = (g.to_f64(), w.to_f64());
            assert!((g - w).abs() <= tol * scale, "{what}[{k}]: {g} vs {w}");
        }
    }

    fn fwd<T: Real>(b: &BlockView<'_>, kind: AggregateKind, x: &[T], dim: usize) -> Vec<T> {
        let mut out = vec![T::from_f64(f64::NAN); b.num_dst() * dim];
        aggregate_forward(b, kind, x, dim, &mut out).unwrap();
        out
    }

    fn bwd<T: Real>(b: &BlockView<'_>, kind: AggregateKind, g: &[T], dim: usize) -> Vec<T> {
        let mut gx = vec![T::from_f64(f64::NAN); b.num_src() * dim];
        aggregate_backward(b, kind, g, dim, &mut gx).unwrap();
        gx
    }

    #[test]
    fn small_example_by_hand() {
        // dst 0 <- {0, 1, 2}; dst 1 <- {2}; dst 2 <- {} ; 4 sources (source 3 unread).
        let indptr = [0u64, 3, 4, 4];
        let indices = [0u32, 1, 2, 2];
        let b = BlockView::new(4, &indptr, &indices).unwrap();
        let x = [1.0f64, 2.0, 4.0, 8.0];
        assert_eq!(fwd(&b, AggregateKind::Sum, &x, 1), [7.0, 4.0, 0.0]);
        let mean = fwd(&b, AggregateKind::Mean, &x, 1);
        assert_close(&mean, &[7.0 / 3.0, 4.0, 0.0], 1e-15, "mean");
        // d_out = [1, 1, 2, 0], d_in = [3, 1, 0].
        let s3 = 3f64.sqrt();
        let want = [(1.0 + 2.0 + 4.0 / 2f64.sqrt()) / s3, 4.0 / 2f64.sqrt(), 0.0];
        assert_close(&fwd(&b, AggregateKind::GcnNorm, &x, 1), &want, 1e-15, "gcn");
        assert_eq!(b.out_degree(2), 2);
        assert_eq!(b.out_degree(3), 0);
        let g = [1.0f64, 10.0, 100.0];
        assert_eq!(bwd(&b, AggregateKind::Sum, &g, 1), [1.0, 1.0, 11.0, 0.0]);
        assert_close(
            &bwd(&b, AggregateKind::Mean, &g, 1),
            &[1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0 + 10.0, 0.0],
            1e-15,
            "mean bwd",
        );
    }

    #[test]
    fn scalar_twin_matches_edge_order_reference_in_f64() {
        let mut rng = Rng::new(21);
        for (num_dst, num_src) in [(1, 1), (5, 9), (40, 90)] {
            let (indptr, indices) = random_block(&mut rng, num_dst, num_src, 7);
            let b = BlockView::new(num_src, &indptr, &indices).unwrap();
            for dim in [1, 3, 17] {
                let x: Vec<f64> = rand_vec(&mut rng, num_src * dim);
                let g: Vec<f64> = rand_vec(&mut rng, num_dst * dim);
                for kind in KINDS {
                    let (out, gx) = reference(kind, num_src, &indptr, &indices, &x, &g, dim);
                    let what = format!("{kind:?} dst={num_dst} dim={dim}");
                    assert_close(&fwd(&b, kind, &x, dim), &out, 1e-13, &what);
                    assert_close(&bwd(&b, kind, &g, dim), &gx, 1e-13, &what);
                }
            }
        }
    }

    #[test]
    fn backward_is_the_adjoint_of_forward() {
        let mut rng = Rng::new(22);
        let (num_dst, num_src) = (60, 150);
        let (indptr, indices) = random_block(&mut rng, num_dst, num_src, 12);
        let b = BlockView::new(num_src, &indptr, &indices).unwrap();
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        for dim in [1, 7, 33] {
            let x: Vec<f64> = rand_vec(&mut rng, num_src * dim);
            let g: Vec<f64> = rand_vec(&mut rng, num_dst * dim);
            for kind in KINDS {
                let lhs = dot(&g, &fwd(&b, kind, &x, dim));
                let rhs = dot(&bwd(&b, kind, &g, dim), &x);
                assert!(
                    (lhs - rhs).abs() <= 1e-12 * (1.0 + lhs.abs()),
                    "{kind:?} dim={dim}: {lhs} vs {rhs}"
                );
                // Also through the f32 fast path at the best level.
                let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
                let gf: Vec<f32> = g.iter().map(|&v| v as f32).collect();
                let mut of = vec![0f32; num_dst * dim];
                let mut gxf = vec![0f32; num_src * dim];
                aggregate_forward_f32(Simd::detect(), &b, kind, &xf, dim, &mut of).unwrap();
                aggregate_backward_f32(Simd::detect(), &b, kind, &gf, dim, &mut gxf).unwrap();
                let lhs: f64 = gf.iter().zip(&of).map(|(&a, &c)| a as f64 * c as f64).sum();
                let rhs: f64 = gxf
                    .iter()
                    .zip(&xf)
                    .map(|(&a, &c)| a as f64 * c as f64)
                    .sum();
                assert!(
                    (lhs - rhs).abs() <= 1e-4 * (1.0 + lhs.abs()),
                    "f32 {kind:?} dim={dim}: {lhs} vs {rhs}"
                );
            }
        }
    }

    #[test]
    fn every_simd_level_matches_the_scalar_twin() {
        let mut rng = Rng::new(23);
        let (num_dst, num_src) = (37, 81);
        let (indptr, indices) = random_block(&mut rng, num_dst, num_src, 30);
        let b = BlockView::new(num_src, &indptr, &indices).unwrap();
        assert!(
            (0..num_dst).any(|i| b.in_degree(i) == 0),
            "want isolated dsts"
        );
        assert!(
            (0..num_src).any(|j| b.out_degree(j) == 0),
            "want unread srcs"
        );
        for dim in DIMS {
            let x: Vec<f32> = rand_vec(&mut rng, num_src * dim);
            let g: Vec<f32> = rand_vec(&mut rng, num_dst * dim);
            let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            let g64: Vec<f64> = g.iter().map(|&v| v as f64).collect();
            for kind in KINDS {
                let want_out = fwd(&b, kind, &x, dim);
                let want_gx = bwd(&b, kind, &g, dim);
                let exact_out = fwd(&b, kind, &x64, dim);
                let exact_gx = bwd(&b, kind, &g64, dim);
                assert_close(&want_out, &exact_out, 1e-5, "scalar f32 fwd vs f64");
                assert_close(&want_gx, &exact_gx, 1e-5, "scalar f32 bwd vs f64");
                for level in SimdLevel::available() {
                    let s = Simd::new(level).unwrap();
                    let what = format!("{level} {kind:?} dim={dim}");
                    let mut out = vec![f32::NAN; num_dst * dim];
                    aggregate_forward_f32(s, &b, kind, &x, dim, &mut out).unwrap();
                    assert_close(&out, &want_out, 1e-5, &format!("fwd {what}"));
                    let mut gx = vec![f32::NAN; num_src * dim];
                    aggregate_backward_f32(s, &b, kind, &g, dim, &mut gx).unwrap();
                    assert_close(&gx, &want_gx, 1e-5, &format!("bwd {what}"));
                }
            }
        }
    }

    #[test]
    fn backward_is_bitwise_deterministic_across_thread_counts() {
        let mut rng = Rng::new(24);
        let (num_dst, num_src, dim) = (3000, 9000, 33);
        let (indptr, indices) = random_block(&mut rng, num_dst, num_src, 25);
        let g: Vec<f32> = rand_vec(&mut rng, num_dst * dim);
        let g64: Vec<f64> = rand_vec(&mut rng, num_dst * dim);
        let run = |threads: usize, level: SimdLevel, kind: AggregateKind| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let b = BlockView::new(num_src, &indptr, &indices).unwrap();
                let mut gx = vec![0f32; num_src * dim];
                aggregate_backward_f32(Simd::new(level).unwrap(), &b, kind, &g, dim, &mut gx)
                    .unwrap();
                let gx64 = bwd(&b, kind, &g64, dim);
                (
                    gx.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    gx64.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                )
            })
        };
        for kind in KINDS {
            for level in SimdLevel::available() {
                assert!(
                    run(1, level, kind) == run(2, level, kind),
                    "{level} {kind:?}"
                );
            }
        }
    }

    #[test]
    fn malformed_blocks_are_errors() {
        let idx = [0u32, 1];
        assert!(matches!(
            BlockView::new(2, &[], &idx),
            Err(CpuOpsError::InvalidCsr { .. })
        ));
        assert!(BlockView::new(2, &[1, 2], &idx).is_err(), "indptr[0] != 0");
        assert!(
            BlockView::new(2, &[0, 1], &idx).is_err(),
            "does not end at len"
        );
        assert!(
            BlockView::new(2, &[0, 2, 1, 2], &idx).is_err(),
            "decreasing"
        );
        assert!(
            BlockView::new(2, &[0, 1, 1, 2], &idx).is_err(),
            "3 dsts > 2 srcs"
        );
        assert!(matches!(
            BlockView::new(1, &[0, 2], &idx),
            Err(CpuOpsError::VertexOutOfRange { vertex: 1, .. })
        ));
        // An empty block is fine.
        let b = BlockView::new(0, &[0], &[]).unwrap();
        assert_eq!((b.num_dst(), b.num_edges()), (0, 0));
    }

    #[test]
    fn wrong_sizes_are_errors_not_panics() {
        let indptr = [0u64, 2, 3];
        let indices = [0u32, 2, 1];
        let b = BlockView::new(3, &indptr, &indices).unwrap();
        let s = Simd::detect();
        let dim = 4;
        let x = vec![0f32; 3 * dim];
        let mut out = vec![0f32; 2 * dim];
        let size_err = |r: Result<()>| matches!(r, Err(CpuOpsError::SizeMismatch { .. }));
        for kind in KINDS {
            assert!(size_err(aggregate_forward_f32(
                s,
                &b,
                kind,
                &x[1..],
                dim,
                &mut out
            )));
            assert!(size_err(aggregate_forward_f32(
                s,
                &b,
                kind,
                &x,
                dim,
                &mut out[1..]
            )));
            assert!(size_err(aggregate_forward(&b, kind, &x, dim + 1, &mut out)));
            assert!(size_err(aggregate_backward_f32(
                s, &b, kind, &x, dim, &mut out
            )));
            let mut gx = vec![0f32; 3 * dim];
            assert!(size_err(aggregate_backward(
                &b,
                kind,
                &out,
                dim,
                &mut gx[2..]
            )));
            assert!(aggregate_backward(&b, kind, &out, dim, &mut gx).is_ok());
        }
        let r = aggregate_forward(&b, AggregateKind::Sum, &x, usize::MAX, &mut out);
        assert!(matches!(r, Err(CpuOpsError::InvalidArgument { .. })));
    }
}
