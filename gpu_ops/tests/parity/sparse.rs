//! Sparse rows ([`gpu_ops::SparseOps`]): gather by device ids, `X·W` and `Xᵀ·G`
//! against scalar `f64` loops on random odd-sized inputs; a backend without
//! them (CUDA, for now) says so and answers `Unsupported`.

use std::sync::Arc;

use cpu_ops::{Rng, SparseRows};
use gpu_ops::{Backend, GpuOpsError};

use crate::helpers::{assert_close, input, input_u32, output, read};

/// A `rows × cols` matrix with about `density` of its values non-zero.
fn random_sparse(rng: &mut Rng, rows: usize, cols: usize, density: f64) -> Vec<f32> {
    (0..rows * cols)
        .map(|_| {
            if rng.next_f64() < density {
                rng.next_f32() * 2.0 - 1.0
            } else {
                0.0
            }
        })
        .collect()
}

pub(crate) fn sparse_rows_gather_and_products<B: Backend>(d: &B) {
    let mut rng = Rng::new(77);
    let (m, cols) = (53, 37);
    let x = random_sparse(&mut rng, m, cols, 0.15);
    let rows = Arc::new(SparseRows::from_dense(&x, m, cols).unwrap());
    if !d.supports_sparse() {
        match d.sparse_from_host(rows) {
            Err(GpuOpsError::Unsupported { .. }) => return,
            Err(e) => panic!("expected Unsupported, got {e:?}"),
            Ok(_) => panic!("supports_sparse() is false but sparse_from_host worked"),
        }
    }
    let all = d.sparse_from_host(rows).unwrap();
    let s = d.sparse_shape(&all);
    assert_eq!((s.rows, s.cols), (m, cols));
    // A batch: repeated and shuffled rows, some empty.
    let ids: Vec<u32> = (0..41).map(|_| rng.below(m as u64) as u32).collect();
    let batch = d
        .sparse_gather(&all, &input_u32(d, &ids, u32::MAX), ids.len())
        .unwrap();
    assert_eq!(d.sparse_shape(&batch).rows, ids.len());
    let xb: Vec<f64> = ids
        .iter()
        .flat_map(|&i| x[i as usize * cols..(i as usize + 1) * cols].to_vec())
        .map(f64::from)
        .collect();
    for (rows, n) in [(41, 7), (23, 1), (1, 19), (0, 5)] {
        let w = rng_vec(&mut rng, cols * n);
        let mut want = vec![0f64; rows * n];
        for i in 0..rows {
            for k in 0..cols {
                for j in 0..n {
                    want[i * n + j] += xb[i * cols + k] * f64::from(w[k * n + j]);
                }
            }
        }
        let mut out = output(d, &vec![0.0; rows * n]);
        d.spmm(&batch, rows, &input(d, &w), n, &mut out, false)
            .unwrap();
        assert_close("spmm", &read(d, &out, rows * n, "spmm"), &want, 1e-5);
        let g = rng_vec(&mut rng, rows * n);
        let mut want_dw = vec![0f64; cols * n];
        for i in 0..rows {
            for k in 0..cols {
                for j in 0..n {
                    want_dw[k * n + j] += xb[i * cols + k] * f64::from(g[i * n + j]);
                }
            }
        }
        let base = rng_vec(&mut rng, cols * n);
        let mut dw = output(d, &base);
        d.spmm_tn(&batch, rows, &input(d, &g), n, &mut dw, true)
            .unwrap();
        let want_acc: Vec<f64> = want_dw
            .iter()
            .zip(&base)
            .map(|(a, &b)| a + f64::from(b))
            .collect();
        assert_close(
            "spmm_tn +=",
            &read(d, &dw, cols * n, "spmm_tn"),
            &want_acc,
            1e-5,
        );
    }
    // Ids past the matrix and products past the rows are errors.
    let bad = input_u32(d, &[0, m as u32], 0);
    assert!(d.sparse_gather(&all, &bad, 2).is_err());
    let mut out = output(d, &vec![0.0; 64]);
    assert!(d
        .spmm(
            &batch,
            ids.len() + 1,
            &input(d, &vec![0.0; cols]),
            1,
            &mut out,
            false
        )
        .is_err());
}

fn rng_vec(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.next_f32() * 2.0 - 1.0).collect()
}
