//! Sparse input rows (CSR) and the two products a sparse layer-0 input needs.
//!
//! Bag-of-words features (WordNet: 2000 columns, ~1% non-zero) make the dense
//! layer-0 GEMMs multiply mostly zeros. [`SparseRows`] stores a row-major matrix
//! `X` (`m × K`) as CSR: row `i` holds the entries `indptr[i]..indptr[i+1]` of
//! `cols` / `vals`, with strictly increasing column ids (as [`SparseRows::from_dense`]
//! and [`SparseRows::gather`] produce them).
//!
//! ## Products (`W`: `K × n`, `G`: `m × n`, all dense row-major)
//! - [`SparseRows::spmm`] / [`SparseRows::spmm_rows`]: `Y = X[..r]·W`, row by row:
//!   `Y_i = Σ_{(k, v) ∈ row i} v · W_k` (an axpy of length `n` per non-zero; `f32`
//!   runs [`crate::Simd`]'s axpy). Cost `nnz · n` instead of `m · K · n`.
//! - [`SparseRows::spmm_tn`] / [`SparseRows::spmm_tn_rows`]: `dW = X[..r]ᵀ·G[..r]`,
//!   `dW_k = Σ_{i < r, X_ik ≠ 0} X_ik · G_i`. The rows of `X[..r]` are first
//!   transposed into CSC by a stable counting sort (entries of column `k` in
//!   increasing row order), then output row `k` is one axpy chain over its column.
//!
//! ## Determinism
//! Every output row (`Y_i` or `dW_k`) is written by exactly one rayon task, which
//! adds its terms in a fixed order (the CSR order of row `i`, or increasing row id
//! for column `k`, fixed by the stable transpose). No partial sums cross tasks, so
//! results are bit-identical on any number of threads. [`SparseRows::from_dense`]
//! and [`SparseRows::gather`] build per-chunk pieces in parallel and concatenate
//! them in chunk order, so their output does not depend on the thread count either.

use std::any::TypeId;

use rayon::prelude::*;

use crate::error::{CpuOpsError, Result};
use crate::matmul::Accumulate;
use crate::real::Real;
use crate::simd::{scalar, Simd, SimdOps};

/// Rows per rayon task when building or gathering.
const BUILD_ROWS: usize = 256;
/// Output rows per rayon task in the products (at least).
const MIN_TASK_ROWS: usize = 16;

/// A sparse `num_rows × num_cols` matrix stored as CSR rows (`u64` offsets, `u32`
/// column ids, strictly increasing within a row).
#[derive(Clone, Debug, PartialEq)]
pub struct SparseRows<T: Real> {
    indptr: Vec<u64>,
    cols: Vec<u32>,
    vals: Vec<T>,
    num_cols: usize,
}

fn overflow(name: &'static str, a: usize, b: usize) -> CpuOpsError {
    CpuOpsError::InvalidArgument {
        name,
        reason: format!("{a} × {b} overflows"),
    }
}

fn check_len(what: &'static str, found: usize, expected: usize) -> Result<()> {
    if found == expected {
        Ok(())
    } else {
        Err(CpuOpsError::SizeMismatch {
            what,
            expected,
            found,
        })
    }
}

/// Column ids are `u32`: at most `u32::MAX + 1` columns.
fn check_num_cols(num_cols: usize) -> Result<()> {
    if num_cols as u64 > u64::from(u32::MAX) + 1 {
        return Err(CpuOpsError::InvalidArgument {
            name: "num_cols",
            reason: format!("{num_cols} columns do not fit u32 column ids"),
        });
    }
    Ok(())
}

/// `y ← y + a·x` (SIMD for `f32`). `x` and `y` have equal lengths (checked by callers).
#[inline]
fn axpy<T: Real>(simd: Simd, a: T, x: &[T], y: &mut [T]) {
    if TypeId::of::<T>() == TypeId::of::<f32>() {
        let (x, y): (&[f32], &mut [f32]) = (bytemuck::cast_slice(x), bytemuck::cast_slice_mut(y));
        simd.axpy(bytemuck::cast::<T, f32>(a), x, y);
    } else {
        scalar::axpy(a, x, y);
    }
}

impl<T: Real> SparseRows<T> {
    /// Wraps CSR parts, checking them: `indptr` starts at 0, is non-decreasing and
    /// ends at `cols.len() == vals.len()`; every column id is below `num_cols` and
    /// column ids increase strictly within a row.
    pub fn from_parts(
        indptr: Vec<u64>,
        cols: Vec<u32>,
        vals: Vec<T>,
        num_cols: usize,
    ) -> Result<Self> {
        check_num_cols(num_cols)?;
        let bad = |what: String| Err(CpuOpsError::InvalidCsr { what });
        if indptr.first() != Some(&0) {
            return bad("indptr must start with 0".into());
        }
        check_len("sparse values (one per column id)", vals.len(), cols.len())?;
        if indptr.last().copied() != Some(cols.len() as u64) {
            return bad(format!(
                "indptr ends at {:?}, but there are {} entries",
                indptr.last(),
                cols.len()
            ));
        }
        for (i, w) in indptr.windows(2).enumerate() {
            if w[0] > w[1] {
                return bad(format!("indptr decreases at row {i}"));
            }
            let row = &cols[w[0] as usize..w[1] as usize];
            if row.windows(2).any(|c| c[0] >= c[1]) {
                return bad(format!("column ids of row {i} are not strictly increasing"));
            }
            if let Some(&c) = row.last() {
                if c as usize >= num_cols {
                    return bad(format!("row {i}: column {c} is not below {num_cols}"));
                }
            }
        }
        Ok(Self {
            indptr,
            cols,
            vals,
            num_cols,
        })
    }

    /// The non-zeros of the dense row-major `rows × cols` matrix `data`
    /// ([`CpuOpsError::SizeMismatch`] unless `data.len() == rows * cols`). Built in
    /// parallel over chunks of rows.
    pub fn from_dense(data: &[T], rows: usize, cols: usize) -> Result<Self> {
        check_num_cols(cols)?;
        let len = rows
            .checked_mul(cols)
            .ok_or_else(|| overflow("rows * cols", rows, cols))?;
        check_len("dense matrix values (rows × cols)", data.len(), len)?;
        if cols == 0 {
            return Ok(Self {
                indptr: vec![0; rows + 1],
                cols: Vec::new(),
                vals: Vec::new(),
                num_cols: 0,
            });
        }
        let pieces: Vec<(Vec<u64>, Vec<u32>, Vec<T>)> = data
            .par_chunks(BUILD_ROWS * cols)
            .map(|chunk| {
                let mut counts = Vec::with_capacity(chunk.len() / cols);
                let (mut c, mut v) = (Vec::new(), Vec::new());
                for row in chunk.chunks_exact(cols) {
                    for (k, &x) in row.iter().enumerate() {
                        if x != T::ZERO {
                            // k < cols ≤ u32::MAX + 1 (checked above).
                            c.push(k as u32);
                            v.push(x);
                        }
                    }
                    counts.push(c.len() as u64);
                }
                (counts, c, v)
            })
            .collect();
        Ok(Self::concat(pieces, rows, cols))
    }

    /// Joins per-chunk pieces (row end offsets relative to the piece) in order.
    fn concat(pieces: Vec<(Vec<u64>, Vec<u32>, Vec<T>)>, rows: usize, num_cols: usize) -> Self {
        let nnz = pieces.iter().map(|p| p.1.len()).sum();
        let mut indptr = Vec::with_capacity(rows + 1);
        let mut cols = Vec::with_capacity(nnz);
        let mut vals = Vec::with_capacity(nnz);
        indptr.push(0u64);
        for (ends, c, v) in pieces {
            let base = cols.len() as u64;
            indptr.extend(ends.iter().map(|e| base + e));
            cols.extend_from_slice(&c);
            vals.extend_from_slice(&v);
        }
        Self {
            indptr,
            cols,
            vals,
            num_cols,
        }
    }

    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        self.indptr.len() - 1
    }

    /// Number of columns.
    pub fn num_cols(&self) -> usize {
        self.num_cols
    }

    /// Number of stored entries.
    pub fn nnz(&self) -> usize {
        self.cols.len()
    }

    /// `nnz / (num_rows · num_cols)` (0 for an empty matrix).
    pub fn density(&self) -> f64 {
        let cells = self.num_rows() as f64 * self.num_cols as f64;
        if cells == 0.0 {
            0.0
        } else {
            self.nnz() as f64 / cells
        }
    }

    /// The CSR offsets (`num_rows + 1`).
    pub fn indptr(&self) -> &[u64] {
        &self.indptr
    }

    /// The column ids of all entries, row by row.
    pub fn col_ids(&self) -> &[u32] {
        &self.cols
    }

    /// The values of all entries, row by row.
    pub fn values(&self) -> &[T] {
        &self.vals
    }

    /// Row `i`'s column ids and values.
    fn row(&self, i: usize) -> (&[u32], &[T]) {
        let (a, b) = (self.indptr[i] as usize, self.indptr[i + 1] as usize);
        (&self.cols[a..b], &self.vals[a..b])
    }

    /// The dense row-major `num_rows × num_cols` matrix.
    pub fn to_dense(&self) -> Vec<T> {
        let mut out = vec![T::ZERO; self.num_rows() * self.num_cols];
        if self.num_cols == 0 {
            return out;
        }
        out.par_chunks_mut(self.num_cols)
            .enumerate()
            .for_each(|(i, o)| {
                let (c, v) = self.row(i);
                for (&k, &x) in c.iter().zip(v) {
                    o[k as usize] = x;
                }
            });
        out
    }

    /// The matrix of rows `ids[0], ids[1], ...` of `self`, in that order
    /// ([`CpuOpsError::VertexOutOfRange`] for an id that is not a row). Parallel over
    /// chunks of ids.
    pub fn gather(&self, ids: &[u32]) -> Result<SparseRows<T>> {
        let n = self.num_rows();
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= n) {
            return Err(CpuOpsError::VertexOutOfRange {
                context: "sparse row gather",
                vertex: u64::from(bad),
                num_vertices: n,
            });
        }
        let pieces: Vec<(Vec<u64>, Vec<u32>, Vec<T>)> = ids
            .par_chunks(BUILD_ROWS)
            .map(|chunk| {
                let mut ends = Vec::with_capacity(chunk.len());
                let (mut c, mut v) = (Vec::new(), Vec::new());
                for &i in chunk {
                    let (rc, rv) = self.row(i as usize);
                    c.extend_from_slice(rc);
                    v.extend_from_slice(rv);
                    ends.push(c.len() as u64);
                }
                (ends, c, v)
            })
            .collect();
        Ok(Self::concat(pieces, ids.len(), self.num_cols))
    }

    /// `out (+)= X·W` for `w`: `num_cols × n` and `out`: `num_rows × n`
    /// (see the module doc).
    pub fn spmm(&self, w: &[T], n: usize, out: &mut [T], acc: Accumulate) -> Result<()> {
        self.spmm_rows(self.num_rows(), w, n, out, acc)
    }

    /// `out (+)= X[..rows]·W`: the product of the first `rows` rows only, `out`:
    /// `rows × n` (SAGE's self term reads the destination rows, a prefix).
    pub fn spmm_rows(
        &self,
        rows: usize,
        w: &[T],
        n: usize,
        out: &mut [T],
        acc: Accumulate,
    ) -> Result<()> {
        self.check_rows(rows)?;
        let w_len = self
            .num_cols
            .checked_mul(n)
            .ok_or_else(|| overflow("n", self.num_cols, n))?;
        check_len("spmm: W values (num_cols × n)", w.len(), w_len)?;
        let out_len = rows.checked_mul(n).ok_or_else(|| overflow("n", rows, n))?;
        check_len("spmm: output values (rows × n)", out.len(), out_len)?;
        if n == 0 {
            return Ok(());
        }
        let simd = Simd::detect();
        out.par_chunks_mut(n)
            .enumerate()
            .with_min_len(MIN_TASK_ROWS)
            .for_each(|(i, o)| {
                if acc == Accumulate::No {
                    o.fill(T::ZERO);
                }
                let (c, v) = self.row(i);
                for (&k, &x) in c.iter().zip(v) {
                    let k = k as usize;
                    axpy(simd, x, &w[k * n..(k + 1) * n], o);
                }
            });
        Ok(())
    }

    /// `dw (+)= Xᵀ·G` for `g`: `num_rows × n` and `dw`: `num_cols × n` (a weight
    /// gradient; see the module doc).
    pub fn spmm_tn(&self, g: &[T], n: usize, dw: &mut [T], acc: Accumulate) -> Result<()> {
        self.spmm_tn_rows(self.num_rows(), g, n, dw, acc)
    }

    /// `dw (+)= X[..rows]ᵀ·G` for `g`: `rows × n` and `dw`: `num_cols × n`.
    pub fn spmm_tn_rows(
        &self,
        rows: usize,
        g: &[T],
        n: usize,
        dw: &mut [T],
        acc: Accumulate,
    ) -> Result<()> {
        self.check_rows(rows)?;
        if rows as u64 > u64::from(u32::MAX) + 1 {
            return Err(CpuOpsError::InvalidArgument {
                name: "rows",
                reason: format!("{rows} rows do not fit the transpose's u32 row ids"),
            });
        }
        let g_len = rows.checked_mul(n).ok_or_else(|| overflow("n", rows, n))?;
        check_len("spmm_tn: G values (rows × n)", g.len(), g_len)?;
        let dw_len = self
            .num_cols
            .checked_mul(n)
            .ok_or_else(|| overflow("n", self.num_cols, n))?;
        check_len("spmm_tn: dW values (num_cols × n)", dw.len(), dw_len)?;
        if n == 0 {
            return Ok(());
        }
        let (col_ptr, row_ids, vals) = self.transpose_prefix(rows);
        let simd = Simd::detect();
        dw.par_chunks_mut(n)
            .enumerate()
            .with_min_len(MIN_TASK_ROWS)
            .for_each(|(k, o)| {
                if acc == Accumulate::No {
                    o.fill(T::ZERO);
                }
                let (a, b) = (col_ptr[k], col_ptr[k + 1]);
                for (&r, &x) in row_ids[a..b].iter().zip(&vals[a..b]) {
                    let r = r as usize;
                    axpy(simd, x, &g[r * n..(r + 1) * n], o);
                }
            });
        Ok(())
    }

    fn check_rows(&self, rows: usize) -> Result<()> {
        if rows > self.num_rows() {
            return Err(CpuOpsError::SizeMismatch {
                what: "sparse product rows (at most the matrix's rows)",
                expected: self.num_rows(),
                found: rows,
            });
        }
        Ok(())
    }

    /// CSC of the first `rows` rows by a stable counting sort: column offsets, row
    /// ids (increasing within a column) and values. `rows ≤ u32::MAX + 1` (checked by
    /// the caller).
    fn transpose_prefix(&self, rows: usize) -> (Vec<usize>, Vec<u32>, Vec<T>) {
        let end = self.indptr[rows] as usize;
        let mut col_ptr = vec![0usize; self.num_cols + 1];
        for &c in &self.cols[..end] {
            col_ptr[c as usize + 1] += 1;
        }
        for k in 0..self.num_cols {
            col_ptr[k + 1] += col_ptr[k];
        }
        let mut next = col_ptr.clone();
        let mut row_ids = vec![0u32; end];
        let mut vals = vec![T::ZERO; end];
        for i in 0..rows {
            let (c, v) = self.row(i);
            for (&k, &x) in c.iter().zip(v) {
                let slot = &mut next[k as usize];
                row_ids[*slot] = i as u32;
                vals[*slot] = x;
                *slot += 1;
            }
        }
        (col_ptr, row_ids, vals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::{gemm_reference, MatMut, MatRef, Transpose};
    use crate::rng::Rng;

    /// A dense `rows × cols` matrix with about `density` of its cells non-zero, and
    /// every third row empty.
    fn random_dense<T: Real>(rng: &mut Rng, rows: usize, cols: usize, density: f64) -> Vec<T> {
        let mut d = vec![T::ZERO; rows * cols];
        for i in 0..rows {
            if i % 3 == 2 {
                continue;
            }
            for k in 0..cols {
                if rng.next_f64() < density {
                    d[i * cols + k] = T::from_f64(rng.next_f64() * 2.0 - 1.0);
                }
            }
        }
        d
    }

    fn rand_vec<T: Real>(rng: &mut Rng, n: usize) -> Vec<T> {
        (0..n)
            .map(|_| T::from_f64(rng.next_f64() * 2.0 - 1.0))
            .collect()
    }

    fn close<T: Real>(got: &[T], want: &[T], tol: f64, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (k, (a, b)) in got.iter().zip(want).enumerate() {
            let (a, b) = (a.to_f64(), b.to_f64());
            assert!(
                (a - b).abs() <= tol * (1.0 + b.abs()),
                "{what}[{k}]: {a} vs {b}"
            );
        }
    }

    const SHAPES: [(usize, usize, usize); 6] = [
        (1, 1, 1),
        (33, 17, 65),
        (7, 40, 3),
        (64, 200, 16),
        (0, 5, 4),
        (9, 0, 3),
    ];

    fn check_products<T: Real>(tol: f64) {
        let mut rng = Rng::new(1);
        for &(m, k, n) in &SHAPES {
            for density in [0.01, 0.1, 0.5] {
                let dense: Vec<T> = random_dense(&mut rng, m, k, density);
                let x = SparseRows::from_dense(&dense, m, k).unwrap();
                assert_eq!((x.num_rows(), x.num_cols()), (m, k));
                assert_eq!(x.to_dense(), dense);
                let w: Vec<T> = rand_vec(&mut rng, k * n);
                let g: Vec<T> = rand_vec(&mut rng, m * n);
                let what = format!("{m}x{k}x{n} density {density}");
                for acc in [Accumulate::No, Accumulate::Yes] {
                    for rows in [m, m / 2] {
                        // Forward: out = X[..rows]·W.
                        let init: Vec<T> = rand_vec(&mut rng, rows * n);
                        let mut want = init.clone();
                        gemm_reference(
                            MatRef::new(&dense[..rows * k], rows, k).unwrap(),
                            Transpose::No,
                            MatRef::new(&w, k, n).unwrap(),
                            Transpose::No,
                            MatMut::new(&mut want, rows, n).unwrap(),
                            acc,
                        )
                        .unwrap();
                        let mut got = init;
                        x.spmm_rows(rows, &w, n, &mut got, acc).unwrap();
                        close(&got, &want, tol, &format!("spmm {what} rows {rows}"));
                        // Weight gradient: dW = X[..rows]ᵀ·G[..rows].
                        let init: Vec<T> = rand_vec(&mut rng, k * n);
                        let mut want = init.clone();
                        gemm_reference(
                            MatRef::new(&dense[..rows * k], rows, k).unwrap(),
                            Transpose::Yes,
                            MatRef::new(&g[..rows * n], rows, n).unwrap(),
                            Transpose::No,
                            MatMut::new(&mut want, k, n).unwrap(),
                            acc,
                        )
                        .unwrap();
                        let mut got = init;
                        x.spmm_tn_rows(rows, &g[..rows * n], n, &mut got, acc)
                            .unwrap();
                        close(&got, &want, tol, &format!("spmm_tn {what} rows {rows}"));
                    }
                }
            }
        }
    }

    #[test]
    fn sparse_products_match_dense_f64() {
        check_products::<f64>(1e-12);
    }

    #[test]
    fn sparse_products_match_dense_f32() {
        check_products::<f32>(1e-5);
    }

    #[test]
    fn sparse_gather_density_and_parts() {
        let mut rng = Rng::new(2);
        let (m, k) = (700, 31);
        let dense: Vec<f64> = random_dense(&mut rng, m, k, 0.2);
        let x = SparseRows::from_dense(&dense, m, k).unwrap();
        let nnz = dense.iter().filter(|&&v| v != 0.0).count();
        assert_eq!(x.nnz(), nnz);
        assert!((x.density() - nnz as f64 / (m * k) as f64).abs() < 1e-15);
        let ids: Vec<u32> = (0..900).map(|_| rng.below(m as u64) as u32).collect();
        let gx = x.gather(&ids).unwrap();
        let gd = gx.to_dense();
        for (r, &i) in ids.iter().enumerate() {
            assert_eq!(
                &gd[r * k..(r + 1) * k],
                &dense[i as usize * k..(i as usize + 1) * k]
            );
        }
        assert_eq!(x.gather(&[]).unwrap().num_rows(), 0);
        assert!(matches!(
            x.gather(&[0, m as u32]),
            Err(CpuOpsError::VertexOutOfRange { vertex: 700, .. })
        ));
        let again = SparseRows::from_parts(
            x.indptr().to_vec(),
            x.col_ids().to_vec(),
            x.values().to_vec(),
            k,
        )
        .unwrap();
        assert_eq!(again, x);
        assert!(SparseRows::<f32>::from_parts(vec![0, 2], vec![1, 1], vec![1.0; 2], 3).is_err());
        assert!(SparseRows::<f32>::from_parts(vec![0, 1], vec![3], vec![1.0], 3).is_err());
        assert!(SparseRows::<f32>::from_parts(vec![1], vec![], vec![], 3).is_err());
        assert!(SparseRows::<f32>::from_parts(vec![0, 1], vec![0], vec![], 3).is_err());
        assert_eq!(
            SparseRows::<f32>::from_dense(&[], 0, 0).unwrap().density(),
            0.0
        );
    }

    #[test]
    fn sparse_wrong_sizes_are_errors() {
        let x = SparseRows::from_dense(&[1.0f32, 0.0, 0.0, 2.0, 0.0, 3.0], 2, 3).unwrap();
        let size = |r: Result<()>| matches!(r, Err(CpuOpsError::SizeMismatch { .. }));
        let mut out = vec![0f32; 4];
        assert!(size(x.spmm(&[0.0; 5], 2, &mut out, Accumulate::No)));
        assert!(size(x.spmm(&[0.0; 6], 2, &mut out[1..], Accumulate::No)));
        assert!(size(x.spmm_rows(3, &[0.0; 6], 2, &mut out, Accumulate::No)));
        let mut dw = vec![0f32; 6];
        assert!(size(x.spmm_tn(&[0.0; 3], 2, &mut dw, Accumulate::No)));
        assert!(size(x.spmm_tn(&[0.0; 4], 2, &mut dw[1..], Accumulate::No)));
        assert!(size(x.spmm_tn_rows(
            1,
            &[0.0; 4],
            2,
            &mut dw,
            Accumulate::No
        )));
        assert!(x
            .spmm_tn_rows(1, &[1.0; 2], 2, &mut dw, Accumulate::No)
            .is_ok());
        assert_eq!(dw, [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
        assert!(size(SparseRows::from_dense(&[1.0f32; 5], 2, 3).map(|_| ())));
        assert!(SparseRows::from_dense(&[1.0f32; 0], usize::MAX, 2).is_err());
    }

    #[test]
    fn sparse_products_are_identical_on_1_and_2_threads() {
        let mut rng = Rng::new(3);
        let (m, k, n) = (3000, 500, 33);
        let dense: Vec<f32> = random_dense(&mut rng, m, k, 0.05);
        let w: Vec<f32> = rand_vec(&mut rng, k * n);
        let g: Vec<f32> = rand_vec(&mut rng, m * n);
        let ids: Vec<u32> = (0..2000).map(|_| rng.below(m as u64) as u32).collect();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let x = SparseRows::from_dense(&dense, m, k).unwrap();
                let gx = x.gather(&ids).unwrap();
                let mut y = vec![0f32; m * n];
                x.spmm(&w, n, &mut y, Accumulate::No).unwrap();
                let mut dw = vec![0f32; k * n];
                x.spmm_tn(&g, n, &mut dw, Accumulate::No).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                (gx, bits(&y), bits(&dw))
            })
        };
        assert!(run(1) == run(2));
    }
}
