//! The row-major product as a column-major GEMM: the arguments cuBLAS and
//! cuBLASLt take for `C = op(A)·op(B)` on row-major buffers ([`ColMajorGemm`]).
//! Both GEMM paths read it (`dense.rs`'s `cublasSgemm` and `gemm_lt.rs`); it is a
//! leaf of its own because the backend struct (`device.rs`) holds the cuBLASLt
//! path, and `dense.rs` depends on `device.rs`.
//!
//! # The mapping
//! Buffers are row-major; cuBLAS is column-major. A row-major `r × c` matrix is the
//! column-major `c × r` matrix (its transpose) with leading dimension `c`. So
//! `C = op(A)·op(B)` (row-major, `m × n`) is computed as the column-major product
//! `Cᵀ = op(B)ᵀ·op(A)ᵀ` (`n × m`, ld `n`): cuBLAS gets `B` first with its transpose
//! flag as given (`B` stored `k × n` → no transpose, ld `n`; stored `n × k` →
//! transpose, ld `k`), then `A` likewise (`m × k` → ld `k`; `k × m` → transpose,
//! ld `m`), and `β = 1` to accumulate. [`ColMajorGemm::from_row_major`] does this and
//! a unit test checks it against a reference column-major GEMM for every transpose.

use cudarc::cublas::sys::cublasOperation_t;

use crate::error::{GpuOpsError, Result};

/// The arguments of one column-major `sgemm` computing a row-major product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ColMajorGemm {
    /// Transpose flag of the first operand (the row-major `B`).
    pub(crate) op_first: bool,
    /// Transpose flag of the second operand (the row-major `A`).
    pub(crate) op_second: bool,
    /// Column-major `m` (= row-major `n`).
    pub(crate) m: i32,
    /// Column-major `n` (= row-major `m`).
    pub(crate) n: i32,
    /// Shared dimension.
    pub(crate) k: i32,
    /// Leading dimension of the first operand.
    pub(crate) ld_first: i32,
    /// Leading dimension of the second operand.
    pub(crate) ld_second: i32,
    /// Leading dimension of the result.
    pub(crate) ldc: i32,
}

impl ColMajorGemm {
    /// The mapping in the module doc; `InvalidArgument` when a size exceeds `i32`.
    pub(crate) fn from_row_major(
        trans_a: bool,
        trans_b: bool,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<Self> {
        let fit = |name: &'static str, v: usize| {
            i32::try_from(v).map_err(|_| GpuOpsError::InvalidArgument {
                name,
                reason: format!("{v} exceeds cuBLAS's 32-bit dimensions"),
            })
        };
        let (m, n, k) = (fit("m", m)?, fit("n", n)?, fit("k", k)?);
        Ok(Self {
            op_first: trans_b,
            op_second: trans_a,
            m: n,
            n: m,
            k,
            ld_first: if trans_b { k } else { n }.max(1),
            ld_second: if trans_a { m } else { k }.max(1),
            ldc: n.max(1),
        })
    }
}

/// cuBLAS's transpose flag for `t`.
pub(crate) fn op(t: bool) -> cublasOperation_t {
    if t {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Column-major `C = op(X)·op(Y)` (+ `beta`·C) with `p`'s sizes, transposes
    /// and leading dimensions (`X` its first operand, `Y` its second), as cuBLAS's
    /// sgemm defines it.
    fn sgemm_col_major(p: &ColMajorGemm, x: &[f64], y: &[f64], beta: f64, c: &mut [f64]) {
        let (tx, ty) = (p.op_first, p.op_second);
        let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
        let (ldx, ldy, ldc) = (p.ld_first as usize, p.ld_second as usize, p.ldc as usize);
        // Element (r, col) of a column-major matrix with leading dimension ld.
        let at = |v: &[f64], ld: usize, r: usize, col: usize| v[col * ld + r];
        for j in 0..n {
            for i in 0..m {
                let mut s = 0.0;
                for l in 0..k {
                    let xv = if tx {
                        at(x, ldx, l, i)
                    } else {
                        at(x, ldx, i, l)
                    };
                    let yv = if ty {
                        at(y, ldy, j, l)
                    } else {
                        at(y, ldy, l, j)
                    };
                    s += xv * yv;
                }
                c[j * ldc + i] = s + beta * c[j * ldc + i];
            }
        }
    }

    #[test]
    fn row_major_gemm_maps_onto_column_major_sgemm() {
        let mut rng = cpu_ops::Rng::new(3);
        for (m, n, k) in [(1, 1, 1), (3, 5, 7), (8, 2, 5), (4, 9, 1)] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                for acc in [false, true] {
                    let a: Vec<f64> = (0..m * k).map(|_| rng.next_f64() - 0.5).collect();
                    let b: Vec<f64> = (0..k * n).map(|_| rng.next_f64() - 0.5).collect();
                    let c0: Vec<f64> = (0..m * n).map(|_| rng.next_f64() - 0.5).collect();
                    // Reference, row-major: A is m×k (k×m when ta), B is k×n (n×k).
                    let a_at = |i: usize, l: usize| if ta { a[l * m + i] } else { a[i * k + l] };
                    let b_at = |l: usize, j: usize| if tb { b[j * k + l] } else { b[l * n + j] };
                    let mut want = c0.clone();
                    for i in 0..m {
                        for j in 0..n {
                            let s: f64 = (0..k).map(|l| a_at(i, l) * b_at(l, j)).sum();
                            want[i * n + j] = s + if acc { c0[i * n + j] } else { 0.0 };
                        }
                    }
                    let p = ColMajorGemm::from_row_major(ta, tb, m, n, k).unwrap();
                    let mut got = c0.clone();
                    sgemm_col_major(&p, &b, &a, if acc { 1.0 } else { 0.0 }, &mut got);
                    for (g, w) in got.iter().zip(&want) {
                        assert!((g - w).abs() < 1e-12, "m={m} n={n} k={k} ta={ta} tb={tb}");
                    }
                }
            }
        }
    }

    #[test]
    fn oversized_gemm_dimensions_are_errors() {
        assert!(ColMajorGemm::from_row_major(false, false, 1 << 31, 1, 1).is_err());
        assert!(ColMajorGemm::from_row_major(false, false, 1, 1, 1 << 31).is_err());
    }
}
