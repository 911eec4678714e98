//! Dense matrix multiply for the layers' forward and backward passes.
//!
//! All matrices are row-major. A dense layer `Y = X·W` (`X`: `M × K`, `W`: `K × N`)
//! needs three products:
//!
//! | pass            | product         | call                              |
//! |-----------------|-----------------|-----------------------------------|
//! | forward         | `Y  = X · W`    | [`matmul`]`(X, W, Y, ..)`         |
//! | weight gradient | `dW = Xᵀ · dY`  | [`matmul_tn`]`(X, dY, dW, ..)`    |
//! | input gradient  | `dX = dY · Wᵀ`  | [`matmul_nt`]`(dY, W, dX, ..)`    |
//!
//! Each takes an [`Accumulate`] flag: `No` writes `C = op(A)·op(B)` (C's old contents
//! are never read, so it may hold garbage or NaN), `Yes` computes `C += op(A)·op(B)`
//! (for gradients summed over several uses of a weight).
//!
//! ## Engine
//! `f32` and `f64` run on the `matrixmultiply` crate's packed, cache-blocked kernels
//! (runtime-detected: AVX-512 16 × 16 micro-kernels when built with rustc ≥ 1.89,
//! else AVX2/FMA), called single-threaded on tiles of `C` that rayon's pool runs in
//! parallel (see [`gemm`] for the tiling), so the GEMM shares the trainer's pool
//! instead of starting threads of its own. Every element of `C` is computed by the
//! same sequence of operations whatever the tiling, so the result does not depend
//! on the number of threads. `docs/dense.md` records the measured comparison with
//! `matrixmultiply`'s own threading, the `gemm` crate and OpenBLAS.
//!
//! [`gemm_reference`] is the plain triple loop every path is tested against.

use std::any::TypeId;

use rayon::prelude::*;

use crate::error::{CpuOpsError, Result};
use crate::features::FeatureMatrix;
use crate::real::Real;

/// A read-only row-major matrix view: `rows × cols` values in `data`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
}

/// A mutable row-major matrix view: `rows × cols` values in `data`.
#[derive(Debug)]
pub struct MatMut<'a, T> {
    data: &'a mut [T],
    rows: usize,
    cols: usize,
}

fn checked_len(rows: usize, cols: usize) -> Result<usize> {
    rows.checked_mul(cols)
        .ok_or_else(|| CpuOpsError::InvalidArgument {
            name: "rows * cols",
            reason: format!("{rows} × {cols} overflows"),
        })
}

impl<'a, T> MatRef<'a, T> {
    /// Views `data` as a `rows × cols` matrix; `data.len()` must be `rows * cols`.
    pub fn new(data: &'a [T], rows: usize, cols: usize) -> Result<Self> {
        let expected = checked_len(rows, cols)?;
        if data.len() != expected {
            return Err(CpuOpsError::SizeMismatch {
                what: "matrix values (rows × cols)",
                expected,
                found: data.len(),
            });
        }
        Ok(Self { data, rows, cols })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The values, row-major.
    pub fn data(&self) -> &'a [T] {
        self.data
    }
}

impl<'a> From<&'a FeatureMatrix> for MatRef<'a, f32> {
    /// Views a feature matrix (one row per vertex) as a `num_rows × dim` matrix.
    fn from(f: &'a FeatureMatrix) -> Self {
        Self {
            data: f.as_slice(),
            rows: f.num_rows(),
            cols: f.dim(),
        }
    }
}

impl<'a, T> MatMut<'a, T> {
    /// Views `data` as a `rows × cols` matrix; `data.len()` must be `rows * cols`.
    pub fn new(data: &'a mut [T], rows: usize, cols: usize) -> Result<Self> {
        let expected = checked_len(rows, cols)?;
        if data.len() != expected {
            return Err(CpuOpsError::SizeMismatch {
                what: "matrix values (rows × cols)",
                expected,
                found: data.len(),
            });
        }
        Ok(Self { data, rows, cols })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The values, row-major.
    pub fn data(&mut self) -> &mut [T] {
        self.data
    }

    /// A read-only view of the same matrix.
    pub fn view(&self) -> MatRef<'_, T> {
        MatRef {
            data: self.data,
            rows: self.rows,
            cols: self.cols,
        }
    }
}

/// Whether an operand enters the product as stored (`No`) or transposed (`Yes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transpose {
    /// Use the matrix as stored.
    No,
    /// Use its transpose.
    Yes,
}

/// Whether the product overwrites `C` (`No`) or is added to it (`Yes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accumulate {
    /// `C = op(A)·op(B)`; C's old values are not read.
    No,
    /// `C += op(A)·op(B)`.
    Yes,
}

/// `C (+)= A · B` with `A`: `m × k`, `B`: `k × n`, `C`: `m × n` (the forward pass).
pub fn matmul<T: Real>(
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: MatMut<'_, T>,
    acc: Accumulate,
) -> Result<()> {
    gemm(a, Transpose::No, b, Transpose::No, c, acc)
}

/// `C (+)= Aᵀ · B` with `A`: `k × m`, `B`: `k × n`, `C`: `m × n` (weight gradient
/// `dW = Xᵀ·dY`: the reduction runs over the batch rows).
pub fn matmul_tn<T: Real>(
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: MatMut<'_, T>,
    acc: Accumulate,
) -> Result<()> {
    gemm(a, Transpose::Yes, b, Transpose::No, c, acc)
}

/// `C (+)= A · Bᵀ` with `A`: `m × k`, `B`: `n × k`, `C`: `m × n` (input gradient
/// `dX = dY·Wᵀ`).
pub fn matmul_nt<T: Real>(
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: MatMut<'_, T>,
    acc: Accumulate,
) -> Result<()> {
    gemm(a, Transpose::No, b, Transpose::Yes, c, acc)
}

/// The logical shape of a product: `(m, k, n)` from `op(A)`: `m × k`, `op(B)`: `k × n`,
/// checked against `C`: `m × n`.
fn product_shape<T>(
    a: &MatRef<'_, T>,
    ta: Transpose,
    b: &MatRef<'_, T>,
    tb: Transpose,
    c_rows: usize,
    c_cols: usize,
) -> Result<(usize, usize, usize)> {
    let (m, k) = match ta {
        Transpose::No => (a.rows, a.cols),
        Transpose::Yes => (a.cols, a.rows),
    };
    let (kb, n) = match tb {
        Transpose::No => (b.rows, b.cols),
        Transpose::Yes => (b.cols, b.rows),
    };
    if kb != k {
        return Err(CpuOpsError::SizeMismatch {
            what: "matmul: inner dimension of op(B) (must equal that of op(A))",
            expected: k,
            found: kb,
        });
    }
    if c_rows != m {
        return Err(CpuOpsError::SizeMismatch {
            what: "matmul: rows of C (must equal rows of op(A))",
            expected: m,
            found: c_rows,
        });
    }
    if c_cols != n {
        return Err(CpuOpsError::SizeMismatch {
            what: "matmul: columns of C (must equal columns of op(B))",
            expected: n,
            found: c_cols,
        });
    }
    Ok((m, k, n))
}

/// Row and column strides of `op(X)` for a row-major `X`.
fn strides<T>(x: &MatRef<'_, T>, t: Transpose) -> (isize, isize) {
    // Row-major storage: element (i, j) of X at i*cols + j. Slice lengths never
    // exceed isize::MAX, so neither does cols.
    let cols = x.cols as isize;
    match t {
        Transpose::No => (cols, 1),
        Transpose::Yes => (1, cols),
    }
}

/// Products smaller than this many multiply-adds run on the calling thread.
const PARALLEL_MIN_MACS: usize = 1 << 18;
/// Multiply-adds per row tile a tall product aims for at least.
const TILE_MACS: usize = 1 << 23;
/// Row-tile granularity for tall products (matrixmultiply's `MC` for f32).
const MIN_TILE_ROWS: usize = 64;
/// Tile sizes are multiples of the micro-kernel's 16 × 16 register tile.
const KERNEL_WIDTH: usize = 16;

/// `C (+)= op(A) · op(B)`, the general form behind [`matmul`], [`matmul_tn`] and
/// [`matmul_nt`].
///
/// Tiling (2 threads and more; products under 2¹⁸ multiply-adds run on the calling
/// thread):
/// - a tall `C` (`m ≥ 4 · threads · 64`: forward and input gradient) is cut into up
///   to `4 · threads` row tiles (at least one per thread, at least 2²³ multiply-adds
///   each): more tiles than threads, so a thread slowed by a neighbour's load does
///   not hold up the product;
/// - a short `C` (weight gradient, long reduction) into one tile per thread along its
///   longer side, because every tile packs its share of both operands over the whole
///   inner dimension.
///
/// Each tile is one single-threaded packed GEMM over the whole inner dimension, so no
/// partial sums are combined and the result is the same on any thread count.
pub fn gemm<T: Real>(
    a: MatRef<'_, T>,
    ta: Transpose,
    b: MatRef<'_, T>,
    tb: Transpose,
    c: MatMut<'_, T>,
    acc: Accumulate,
) -> Result<()> {
    let (m, k, n) = product_shape(&a, ta, &b, tb, c.rows, c.cols)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if acc == Accumulate::No {
            c.data.fill(T::ZERO);
        }
        return Ok(());
    }
    let (rsa, csa) = strides(&a, ta);
    let (rsb, csb) = strides(&b, tb);
    let beta = match acc {
        Accumulate::No => 0.0,
        Accumulate::Yes => 1.0,
    };
    let p = Problem {
        m,
        k,
        n,
        rsa,
        csa,
        rsb,
        csb,
        beta,
    };
    if TypeId::of::<T>() == TypeId::of::<f32>() {
        let (a, b, c) = (
            cast::<T, f32>(a.data)?,
            cast::<T, f32>(b.data)?,
            cast_mut(c.data)?,
        );
        run_tiled(&p, a, b, c, |t, a, b, c| {
            // SAFETY: `run_tiled` hands out a tile inside C and the A rows / B columns
            // it reads; A, B and C were checked to hold m×k, k×n and m×n values for
            // these strides, so every access is in bounds, and tiles are disjoint.
            unsafe {
                matrixmultiply::sgemm(
                    t.rows,
                    p.k,
                    t.cols,
                    1.0,
                    a,
                    p.rsa,
                    p.csa,
                    b,
                    p.rsb,
                    p.csb,
                    p.beta as f32,
                    c,
                    t.rsc,
                    1,
                )
            }
        });
        Ok(())
    } else if TypeId::of::<T>() == TypeId::of::<f64>() {
        let (a, b, c) = (
            cast::<T, f64>(a.data)?,
            cast::<T, f64>(b.data)?,
            cast_mut(c.data)?,
        );
        run_tiled(&p, a, b, c, |t, a, b, c| {
            // SAFETY: as for f32 above.
            unsafe {
                matrixmultiply::dgemm(
                    t.rows, p.k, t.cols, 1.0, a, p.rsa, p.csa, b, p.rsb, p.csb, p.beta, c, t.rsc, 1,
                )
            }
        });
        Ok(())
    } else {
        gemm_reference_unchecked(&p, a.data, b.data, c.data);
        Ok(())
    }
}

/// `C (+)= A · B` in `f32` on the calling thread: one packed `matrixmultiply` GEMM
/// (the engine of [`gemm`]), never cut into rayon tiles. For kernels that are
/// themselves one task per worker, such as the fused hot-vertex layer
/// ([`crate::hot_layer`]), where tiles would only add scheduling and steal the other
/// workers' cores. Same checks and errors as [`matmul`].
pub(crate) fn matmul_serial(
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    c: MatMut<'_, f32>,
    acc: Accumulate,
) -> Result<()> {
    let (m, k, n) = product_shape(&a, Transpose::No, &b, Transpose::No, c.rows, c.cols)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if acc == Accumulate::No {
            c.data.fill(0.0);
        }
        return Ok(());
    }
    let beta = match acc {
        Accumulate::No => 0.0,
        Accumulate::Yes => 1.0,
    };
    // SAFETY: `product_shape` and the views' constructors established that A, B and
    // C hold m×k, k×n and m×n row-major values, so with these strides every access
    // of the product is in bounds; C does not alias A or B (`&mut` borrow).
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.data.as_ptr(),
            k as isize,
            1,
            b.data.as_ptr(),
            n as isize,
            1,
            beta,
            c.data.as_mut_ptr(),
            n as isize,
            1,
        )
    };
    Ok(())
}

/// The plain triple-loop `C (+)= op(A) · op(B)`: the reference every GEMM path is
/// tested against (and what the GPU kernels' parity tests compare with). Same
/// contract and errors as [`gemm`]; sums in `T` in index order.
pub fn gemm_reference<T: Real>(
    a: MatRef<'_, T>,
    ta: Transpose,
    b: MatRef<'_, T>,
    tb: Transpose,
    c: MatMut<'_, T>,
    acc: Accumulate,
) -> Result<()> {
    let (m, k, n) = product_shape(&a, ta, &b, tb, c.rows, c.cols)?;
    let (rsa, csa) = strides(&a, ta);
    let (rsb, csb) = strides(&b, tb);
    let beta = match acc {
        Accumulate::No => 0.0,
        Accumulate::Yes => 1.0,
    };
    let p = Problem {
        m,
        k,
        n,
        rsa,
        csa,
        rsb,
        csb,
        beta,
    };
    gemm_reference_unchecked(&p, a.data, b.data, c.data);
    Ok(())
}

/// A checked product: logical sizes, operand strides (in elements) and `beta`
/// (0 or 1; C is row-major and contiguous).
struct Problem {
    m: usize,
    k: usize,
    n: usize,
    rsa: isize,
    csa: isize,
    rsb: isize,
    csb: isize,
    beta: f64,
}

fn gemm_reference_unchecked<T: Real>(p: &Problem, a: &[T], b: &[T], c: &mut [T]) {
    // Strides are 1 or a column count of an in-bounds matrix: non-negative.
    let (rsa, csa, rsb, csb) = (
        p.rsa as usize,
        p.csa as usize,
        p.rsb as usize,
        p.csb as usize,
    );
    for i in 0..p.m {
        for j in 0..p.n {
            let mut s = T::ZERO;
            for l in 0..p.k {
                s += a[i * rsa + l * csa] * b[l * rsb + j * csb];
            }
            let out = &mut c[i * p.n + j];
            *out = if p.beta == 0.0 { s } else { *out + s };
        }
    }
}

/// One tile of C handed to the kernel: its size and C's row stride.
struct Tile {
    rows: usize,
    cols: usize,
    rsc: isize,
}

/// A pointer that may cross to rayon's threads. Each task derives from it only the
/// tile it owns (C) or reads shared, immutable data (A, B).
#[derive(Clone, Copy)]
struct SendPtr<P>(P);
// SAFETY: the pointers are only dereferenced inside `run_tiled`'s scope, while the
// borrowed slices they come from are alive; C tiles are disjoint and A, B are only read.
unsafe impl<P> Send for SendPtr<P> {}
// SAFETY: as above.
unsafe impl<P> Sync for SendPtr<P> {}

/// Cuts C into tiles (see [`gemm`]) and runs `kernel(tile, a, b, c)` on each, where
/// the pointers are advanced to the tile's first row of op(A), first column of op(B)
/// and first element of C.
fn run_tiled<E, F>(p: &Problem, a: &[E], b: &[E], c: &mut [E], kernel: F)
where
    E: Copy + Send + Sync,
    F: Fn(&Tile, *const E, *const E, *mut E) + Sync,
{
    let threads = rayon::current_num_threads().max(1);
    let macs = p.m.saturating_mul(p.k).saturating_mul(p.n);
    let (tile_rows, tile_cols) = if threads == 1 || macs < PARALLEL_MIN_MACS {
        (p.m, p.n)
    } else if p.m >= 4 * threads * MIN_TILE_ROWS {
        // Tall C (forward, input gradient): up to 4 row tiles per thread (fewer for
        // small products, since each tile re-packs B), in whole 64-row blocks.
        let tiles = (macs / TILE_MACS).clamp(threads, 4 * threads);
        let rows = p.m.div_ceil(tiles).next_multiple_of(MIN_TILE_ROWS);
        (rows, p.n)
    } else if p.m >= p.n {
        // Short C with a long reduction (weight gradient): one tile per thread,
        // since every tile packs its share of both operands over the whole k.
        (p.m.div_ceil(threads).next_multiple_of(KERNEL_WIDTH), p.n)
    } else {
        (p.m, p.n.div_ceil(threads).next_multiple_of(KERNEL_WIDTH))
    };
    let a_ptr = SendPtr(a.as_ptr());
    let b_ptr = SendPtr(b.as_ptr());
    let c_ptr = SendPtr(c.as_mut_ptr());
    let rsc = p.n as isize;
    let row_starts = (0..p.m).step_by(tile_rows);
    let tiles: Vec<(usize, usize)> = row_starts
        .flat_map(|i| (0..p.n).step_by(tile_cols).map(move |j| (i, j)))
        .collect();
    let run = |&(i, j): &(usize, usize)| {
        let tile = Tile {
            rows: tile_rows.min(p.m - i),
            cols: tile_cols.min(p.n - j),
            rsc,
        };
        // Copy the wrappers whole so the closure captures the Send + Sync wrappers,
        // not their raw-pointer fields.
        let (a_ptr, b_ptr, c_ptr) = (a_ptr, b_ptr, c_ptr);
        // SAFETY: i < m and j < n, so the offsets stay inside A (row i of op(A)),
        // B (column j of op(B)) and C (element (i, j)); strides are those of the
        // checked views.
        let (ta, tb, tc) = unsafe {
            (
                a_ptr.0.offset(i as isize * p.rsa),
                b_ptr.0.offset(j as isize * p.csb),
                c_ptr.0.add(i * p.n + j),
            )
        };
        kernel(&tile, ta, tb, tc);
    };
    if tiles.len() == 1 {
        tiles.iter().for_each(run);
    } else {
        tiles.par_iter().for_each(run);
    }
}

/// Reinterprets `&[T]` as `&[E]` when `T` is `E` (checked by the caller with `TypeId`).
fn cast<T: Real, E: Real>(x: &[T]) -> Result<&[E]> {
    bytemuck::try_cast_slice(x).map_err(|_| CpuOpsError::InvalidArgument {
        name: "T",
        reason: "element type dispatch failed".into(),
    })
}

/// Mutable twin of [`cast`].
fn cast_mut<T: Real, E: Real>(x: &mut [T]) -> Result<&mut [E]> {
    bytemuck::try_cast_slice_mut(x).map_err(|_| CpuOpsError::InvalidArgument {
        name: "T",
        reason: "element type dispatch failed".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn random<T: Real>(rng: &mut Rng, len: usize) -> Vec<T> {
        (0..len)
            .map(|_| T::from_f64(rng.next_f64() * 2.0 - 1.0))
            .collect()
    }

    /// Checks gemm against gemm_reference for all four transpose combinations and
    /// both accumulate modes on an `m × k × n` product.
    fn check<T: Real>(m: usize, k: usize, n: usize, tol: f64) {
        let mut rng = Rng::new((m * 1_000_003 + k * 1009 + n) as u64);
        for ta in [Transpose::No, Transpose::Yes] {
            for tb in [Transpose::No, Transpose::Yes] {
                let a_data = random::<T>(&mut rng, m * k);
                let b_data = random::<T>(&mut rng, k * n);
                let (ar, ac) = if ta == Transpose::No { (m, k) } else { (k, m) };
                let (br, bc) = if tb == Transpose::No { (k, n) } else { (n, k) };
                let a = MatRef::new(&a_data, ar, ac).unwrap();
                let b = MatRef::new(&b_data, br, bc).unwrap();
                for acc in [Accumulate::No, Accumulate::Yes] {
                    let init = random::<T>(&mut rng, m * n);
                    let mut want = init.clone();
                    let mut got = if acc == Accumulate::No {
                        vec![T::from_f64(f64::NAN); m * n]
                    } else {
                        init.clone()
                    };
                    gemm_reference(a, ta, b, tb, MatMut::new(&mut want, m, n).unwrap(), acc)
                        .unwrap();
                    gemm(a, ta, b, tb, MatMut::new(&mut got, m, n).unwrap(), acc).unwrap();
                    for (idx, (w, g)) in want.iter().zip(&got).enumerate() {
                        let (w, g) = (w.to_f64(), g.to_f64());
                        let bound = tol * (1.0 + (k as f64).sqrt()) * (1.0 + w.abs());
                        assert!(
                            (w - g).abs() <= bound,
                            "{m}x{k}x{n} {ta:?} {tb:?} {acc:?} at {idx}: want {w} got {g}"
                        );
                    }
                }
            }
        }
    }

    /// The odd shapes, then ones that take each tiling path on 2+ threads: wide and
    /// short (column tiles), short with m ≥ n (row tiles, one per thread), tall (4
    /// row tiles per thread), and a long reduction.
    const SHAPES: [(usize, usize, usize); 9] = [
        (1, 1, 1),
        (3, 5, 7),
        (33, 17, 65),
        (129, 257, 31),
        (2, 300, 1),
        (200, 64, 300),
        (300, 100, 200),
        (1000, 40, 70),
        (17, 3000, 33),
    ];

    #[test]
    fn f32_matches_reference_on_odd_shapes() {
        for (m, k, n) in SHAPES {
            check::<f32>(m, k, n, 1e-5);
        }
    }

    #[test]
    fn f64_matches_reference_on_odd_shapes() {
        for (m, k, n) in SHAPES {
            check::<f64>(m, k, n, 1e-13);
        }
    }

    #[test]
    fn named_variants_are_the_right_transposes() {
        // A = [[1,2],[3,4]], B = [[5,6],[7,8]]
        let a = [1.0f64, 2.0, 3.0, 4.0];
        let b = [5.0f64, 6.0, 7.0, 8.0];
        let (a, b) = (
            MatRef::new(&a, 2, 2).unwrap(),
            MatRef::new(&b, 2, 2).unwrap(),
        );
        let mut c = [0.0f64; 4];
        matmul(a, b, MatMut::new(&mut c, 2, 2).unwrap(), Accumulate::No).unwrap();
        assert_eq!(c, [19.0, 22.0, 43.0, 50.0]);
        matmul_tn(a, b, MatMut::new(&mut c, 2, 2).unwrap(), Accumulate::No).unwrap();
        assert_eq!(c, [26.0, 30.0, 38.0, 44.0]);
        matmul_nt(a, b, MatMut::new(&mut c, 2, 2).unwrap(), Accumulate::Yes).unwrap();
        assert_eq!(c, [26.0 + 17.0, 30.0 + 23.0, 38.0 + 39.0, 44.0 + 53.0]);
    }

    #[test]
    fn serial_matches_reference_on_odd_shapes() {
        let mut rng = Rng::new(6);
        for (m, k, n) in SHAPES
            .into_iter()
            .chain([(64, 200, 256), (0, 3, 2), (2, 0, 3)])
        {
            let a_data = random::<f32>(&mut rng, m * k);
            let b_data = random::<f32>(&mut rng, k * n);
            let a = MatRef::new(&a_data, m, k).unwrap();
            let b = MatRef::new(&b_data, k, n).unwrap();
            for acc in [Accumulate::No, Accumulate::Yes] {
                let init = random::<f32>(&mut rng, m * n);
                let mut want = init.clone();
                let mut got = if acc == Accumulate::No {
                    vec![f32::NAN; m * n]
                } else {
                    init
                };
                gemm_reference(
                    a,
                    Transpose::No,
                    b,
                    Transpose::No,
                    MatMut::new(&mut want, m, n).unwrap(),
                    acc,
                )
                .unwrap();
                matmul_serial(a, b, MatMut::new(&mut got, m, n).unwrap(), acc).unwrap();
                for (idx, (w, g)) in want.iter().zip(&got).enumerate() {
                    let bound = 1e-5 * (1.0 + (k as f32).sqrt()) * (1.0 + w.abs());
                    assert!((w - g).abs() <= bound, "{m}x{k}x{n} {acc:?} at {idx}");
                }
            }
        }
        let x = [0.0f32; 12];
        let mut y = [0.0f32; 12];
        let a34 = MatRef::new(&x, 3, 4).unwrap();
        let r = matmul_serial(a34, a34, MatMut::new(&mut y, 3, 4).unwrap(), Accumulate::No);
        assert!(matches!(
            r,
            Err(CpuOpsError::SizeMismatch {
                expected: 4,
                found: 3,
                ..
            })
        ));
    }

    #[test]
    fn result_does_not_depend_on_thread_count() {
        let mut rng = Rng::new(5);
        let (m, k, n) = (700, 129, 200);
        let a_data = random::<f32>(&mut rng, m * k);
        let b_data = random::<f32>(&mut rng, k * n);
        let a = MatRef::new(&a_data, m, k).unwrap();
        let b = MatRef::new(&b_data, k, n).unwrap();
        let mut outs = Vec::new();
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut c = vec![0.0f32; m * n];
            pool.install(|| {
                matmul(a, b, MatMut::new(&mut c, m, n).unwrap(), Accumulate::No).unwrap()
            });
            outs.push(c);
        }
        assert!(outs.windows(2).all(|w| w[0] == w[1]));
    }

    #[test]
    fn feature_matrix_view() {
        let f = FeatureMatrix::new(
            crate::array::HostArray::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            3,
            2,
        )
        .unwrap();
        let x = MatRef::from(&f);
        assert_eq!((x.rows(), x.cols()), (3, 2));
        let w = [1.0f32, -1.0];
        let mut y = [0.0f32; 3];
        matmul(
            x,
            MatRef::new(&w, 2, 1).unwrap(),
            MatMut::new(&mut y, 3, 1).unwrap(),
            Accumulate::No,
        )
        .unwrap();
        assert_eq!(y, [-1.0, -1.0, -1.0]);
    }

    #[test]
    fn empty_dimensions() {
        let a: [f32; 0] = [];
        let mut c = [f32::NAN; 6];
        // k = 0: C = 0, or unchanged when accumulating.
        let ar = MatRef::new(&a, 2, 0).unwrap();
        let br = MatRef::new(&a, 0, 3).unwrap();
        matmul(ar, br, MatMut::new(&mut c, 2, 3).unwrap(), Accumulate::No).unwrap();
        assert_eq!(c, [0.0; 6]);
        c[0] = 5.0;
        matmul(ar, br, MatMut::new(&mut c, 2, 3).unwrap(), Accumulate::Yes).unwrap();
        assert_eq!(c[0], 5.0);
        // m = 0
        let b = [1.0f32; 6];
        let mut e: [f32; 0] = [];
        matmul(
            MatRef::new(&a, 0, 2).unwrap(),
            MatRef::new(&b, 2, 3).unwrap(),
            MatMut::new(&mut e, 0, 3).unwrap(),
            Accumulate::No,
        )
        .unwrap();
    }

    #[test]
    fn bad_shapes_are_size_mismatch() {
        let x = [0.0f32; 12];
        let mut y = [0.0f32; 12];
        assert!(matches!(
            MatRef::new(&x, 5, 3),
            Err(CpuOpsError::SizeMismatch {
                expected: 15,
                found: 12,
                ..
            })
        ));
        assert!(matches!(
            MatMut::new(&mut y, 2, 5),
            Err(CpuOpsError::SizeMismatch { .. })
        ));
        assert!(matches!(
            MatRef::new(&x, usize::MAX, 2),
            Err(CpuOpsError::InvalidArgument { .. })
        ));
        let a34 = MatRef::new(&x, 3, 4).unwrap();
        let a43 = MatRef::new(&x, 4, 3).unwrap();
        let a26 = MatRef::new(&x, 2, 6).unwrap();
        // inner mismatch: (3×4)·(3×4)
        let r = matmul(a34, a34, MatMut::new(&mut y, 3, 4).unwrap(), Accumulate::No);
        assert!(matches!(
            r,
            Err(CpuOpsError::SizeMismatch {
                expected: 4,
                found: 3,
                ..
            })
        ));
        // C of the wrong shape: (3×4)·(4×3) is 3×3, C is 3×4.
        let r = matmul(a34, a43, MatMut::new(&mut y, 3, 4).unwrap(), Accumulate::No);
        assert!(matches!(r, Err(CpuOpsError::SizeMismatch { .. })));
        // Aᵀ·B: (4×3)ᵀ(2×6) inner 4 vs 2.
        let r = matmul_tn(a43, a26, MatMut::new(&mut y, 3, 4).unwrap(), Accumulate::No);
        assert!(matches!(r, Err(CpuOpsError::SizeMismatch { .. })));
        // A·Bᵀ: (3×4)(2×6)ᵀ inner 4 vs 6.
        let r = matmul_nt(a34, a26, MatMut::new(&mut y, 3, 4).unwrap(), Accumulate::No);
        assert!(matches!(r, Err(CpuOpsError::SizeMismatch { .. })));
        let r = gemm_reference(
            a34,
            Transpose::No,
            a34,
            Transpose::No,
            MatMut::new(&mut y, 3, 4).unwrap(),
            Accumulate::No,
        );
        assert!(matches!(r, Err(CpuOpsError::SizeMismatch { .. })));
    }
}
