//! Host-backend sparse rows ([`crate::SparseOps`]): a shared
//! [`cpu_ops::SparseRows`] and its two products, run by `cpu_ops`' kernels
//! (row-parallel, SIMD axpy; bit-deterministic on any thread count).

use std::sync::Arc;

use cpu_ops::{Accumulate, SparseRows};

use crate::backend::{SparseOps, SparseShape};
use crate::error::{GpuOpsError, Result};
use crate::host::buffer::{mul, prefix, prefix_mut, HostBuf};
use crate::host::HostBackend;

/// Sparse rows on the host backend: CSR rows shared (not copied) with whoever
/// made them.
#[derive(Clone, Debug)]
pub struct HostSparse {
    rows: Arc<SparseRows<f32>>,
}

impl HostSparse {
    /// Wraps shared rows.
    pub(crate) fn new(rows: Arc<SparseRows<f32>>) -> Self {
        Self { rows }
    }

    /// The rows.
    pub fn rows(&self) -> &SparseRows<f32> {
        &self.rows
    }

    /// [`crate::SparseOps::sparse_shape`].
    pub(crate) fn shape(&self) -> SparseShape {
        SparseShape {
            rows: self.rows.num_rows(),
            cols: self.rows.num_cols(),
            nnz: self.rows.nnz(),
        }
    }

    /// [`crate::SparseOps::sparse_gather`].
    pub(crate) fn gather(&self, ids: &[u32], n: usize) -> Result<Self> {
        let ids = prefix("sparse gather ids", ids, n)?;
        Ok(Self::new(Arc::new(self.rows.gather(ids)?)))
    }

    fn check_rows(&self, rows: usize) -> Result<()> {
        if rows > self.rows.num_rows() {
            return Err(GpuOpsError::SizeMismatch {
                what: "sparse product rows (at most the sparse matrix's rows)",
                expected: self.rows.num_rows(),
                found: rows,
            });
        }
        Ok(())
    }

    /// [`crate::SparseOps::spmm`].
    pub(crate) fn spmm(
        &self,
        rows: usize,
        w: &[f32],
        n: usize,
        out: &mut [f32],
        acc: bool,
    ) -> Result<()> {
        self.check_rows(rows)?;
        let cols = self.rows.num_cols();
        let w = prefix("spmm W (cols × n)", w, mul("cols × n", cols, n)?)?;
        let out = prefix_mut("spmm output (rows × n)", out, mul("rows × n", rows, n)?)?;
        self.rows.spmm_rows(rows, w, n, out, accumulate(acc))?;
        Ok(())
    }

    /// [`crate::SparseOps::spmm_tn`].
    pub(crate) fn spmm_tn(
        &self,
        rows: usize,
        g: &[f32],
        n: usize,
        dw: &mut [f32],
        acc: bool,
    ) -> Result<()> {
        self.check_rows(rows)?;
        let cols = self.rows.num_cols();
        let g = prefix("spmm_tn G (rows × n)", g, mul("rows × n", rows, n)?)?;
        let dw = prefix_mut("spmm_tn dW (cols × n)", dw, mul("cols × n", cols, n)?)?;
        self.rows.spmm_tn_rows(rows, g, n, dw, accumulate(acc))?;
        Ok(())
    }
}

fn accumulate(acc: bool) -> Accumulate {
    if acc {
        Accumulate::Yes
    } else {
        Accumulate::No
    }
}

impl SparseOps for HostBackend {
    type Sparse = HostSparse;

    fn supports_sparse(&self) -> bool {
        true
    }

    fn sparse_from_host(&self, rows: Arc<SparseRows<f32>>) -> Result<HostSparse> {
        Ok(HostSparse::new(rows))
    }

    fn sparse_gather(&self, src: &HostSparse, ids: &HostBuf<u32>, n: usize) -> Result<HostSparse> {
        src.gather(ids, n)
    }

    fn sparse_shape(&self, x: &HostSparse) -> SparseShape {
        x.shape()
    }

    fn spmm(
        &self,
        x: &HostSparse,
        rows: usize,
        w: &HostBuf<f32>,
        n: usize,
        out: &mut HostBuf<f32>,
        accumulate: bool,
    ) -> Result<()> {
        x.spmm(rows, w, n, out, accumulate)
    }

    fn spmm_tn(
        &self,
        x: &HostSparse,
        rows: usize,
        g: &HostBuf<f32>,
        n: usize,
        dw: &mut HostBuf<f32>,
        accumulate: bool,
    ) -> Result<()> {
        x.spmm_tn(rows, g, n, dw, accumulate)
    }
}

#[cfg(test)]
mod tests {
    //! The host backend's sparse ops against plain scalar loops on random,
    //! odd-sized inputs.

    use std::sync::Arc;

    use cpu_ops::{Rng, SparseRows};

    use crate::prelude::*;
    use crate::HostBackend;

    /// A `rows × cols` matrix with about `density` of its values non-zero.
    fn random_dense(rng: &mut Rng, rows: usize, cols: usize, density: f64) -> Vec<f32> {
        (0..rows * cols)
            .map(|_| {
                if rng.next_f64() < density {
                    rng.normal() as f32
                } else {
                    0.0
                }
            })
            .collect()
    }

    fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.normal() as f32).collect()
    }

    /// `X[..rows]·W` in f64, scalar.
    fn spmm_ref(x: &[f32], cols: usize, rows: usize, w: &[f32], n: usize) -> Vec<f64> {
        let mut out = vec![0f64; rows * n];
        for i in 0..rows {
            for k in 0..cols {
                for j in 0..n {
                    out[i * n + j] += f64::from(x[i * cols + k]) * f64::from(w[k * n + j]);
                }
            }
        }
        out
    }

    /// `X[..rows]ᵀ·G` in f64, scalar.
    fn spmm_tn_ref(x: &[f32], cols: usize, rows: usize, g: &[f32], n: usize) -> Vec<f64> {
        let mut out = vec![0f64; cols * n];
        for i in 0..rows {
            for k in 0..cols {
                for j in 0..n {
                    out[k * n + j] += f64::from(x[i * cols + k]) * f64::from(g[i * n + j]);
                }
            }
        }
        out
    }

    fn close(what: &str, got: &[f32], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(
                (f64::from(g) - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "{what}[{i}]: {g} vs {w}"
            );
        }
    }

    #[test]
    fn sparse_products_match_the_scalar_reference() {
        let dev = HostBackend::new();
        assert!(dev.supports_sparse());
        let mut rng = Rng::new(31);
        for (m, cols, n, rows, density) in [
            (37, 53, 7, 37, 0.1),
            (29, 11, 13, 17, 0.5),
            (1, 3, 1, 1, 1.0),
            (19, 23, 5, 0, 0.2),
            (41, 67, 9, 40, 0.0),
        ] {
            let x = random_dense(&mut rng, m, cols, density);
            let sparse = SparseRows::from_dense(&x, m, cols).expect("csr");
            let xs = dev.sparse_from_host(Arc::new(sparse)).expect("sparse");
            let shape = dev.sparse_shape(&xs);
            assert_eq!((shape.rows, shape.cols), (m, cols));
            assert_eq!(shape.nnz, x.iter().filter(|&&v| v != 0.0).count());
            let w = random(&mut rng, cols * n);
            let wd = dev.to_device(&w).expect("w");
            // Buffers longer than needed: only the prefix is written.
            let mut out = dev.to_device(&vec![7f32; rows * n + 3]).expect("out");
            dev.spmm(&xs, rows, &wd, n, &mut out, false).expect("spmm");
            let got = dev.to_host(&out, rows * n + 3).expect("out");
            close("spmm", &got[..rows * n], &spmm_ref(&x, cols, rows, &w, n));
            assert_eq!(&got[rows * n..], &[7.0; 3]);
            // Accumulate adds to what is there.
            let base = random(&mut rng, rows * n);
            let mut acc = dev.to_device(&base).expect("acc");
            dev.spmm(&xs, rows, &wd, n, &mut acc, true)
                .expect("spmm +=");
            let want: Vec<f64> = spmm_ref(&x, cols, rows, &w, n)
                .iter()
                .zip(&base)
                .map(|(a, &b)| a + f64::from(b))
                .collect();
            close("spmm +=", &dev.to_host(&acc, rows * n).expect("acc"), &want);

            let g = random(&mut rng, rows * n);
            let gd = dev.to_device(&g).expect("g");
            let mut dw = dev.alloc(cols * n).expect("dw");
            dev.spmm_tn(&xs, rows, &gd, n, &mut dw, false)
                .expect("spmm_tn");
            close(
                "spmm_tn",
                &dev.to_host(&dw, cols * n).expect("dw"),
                &spmm_tn_ref(&x, cols, rows, &g, n),
            );
            let before = dev.to_host(&dw, cols * n).expect("dw");
            dev.spmm_tn(&xs, rows, &gd, n, &mut dw, true)
                .expect("spmm_tn +=");
            let twice: Vec<f64> = before.iter().map(|&v| 2.0 * f64::from(v)).collect();
            close(
                "spmm_tn +=",
                &dev.to_host(&dw, cols * n).expect("dw"),
                &twice,
            );
        }
    }

    #[test]
    fn sparse_gather_picks_rows_by_device_ids() {
        let dev = HostBackend::new();
        let mut rng = Rng::new(8);
        let (m, cols) = (31, 17);
        let x = random_dense(&mut rng, m, cols, 0.3);
        let xs = dev
            .sparse_from_host(Arc::new(SparseRows::from_dense(&x, m, cols).expect("csr")))
            .expect("sparse");
        let ids: Vec<u32> = (0..23).map(|_| rng.below(m as u64) as u32).collect();
        // One id past n: not read.
        let mut with_tail = ids.clone();
        with_tail.push(u32::MAX);
        let idd = dev.to_device(&with_tail).expect("ids");
        let got = dev.sparse_gather(&xs, &idd, ids.len()).expect("gather");
        assert_eq!(dev.sparse_shape(&got).rows, ids.len());
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| x[i as usize * cols..(i as usize + 1) * cols].to_vec())
            .collect();
        assert_eq!(got.rows().to_dense(), want);
        // Errors: an id outside the matrix, n past the ids, rows past the matrix.
        assert!(dev.sparse_gather(&xs, &idd, ids.len() + 1).is_err());
        assert!(dev.sparse_gather(&xs, &idd, ids.len() + 2).is_err());
        let w = dev.to_device(&vec![0f32; cols * 2]).expect("w");
        let mut out = dev.alloc(64 * 2).expect("out");
        let e = dev.spmm(&got, 24, &w, 2, &mut out, false).unwrap_err();
        assert!(e.to_string().contains("sparse product rows"), "{e}");
        let short = dev.to_device(&vec![0f32; cols * 2 - 1]).expect("w");
        assert!(dev.spmm(&got, 3, &short, 2, &mut out, false).is_err());
    }
}
