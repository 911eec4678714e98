//! Element-wise parts of a dense layer: bias and activations, forward and backward.
//!
//! Matrices are row-major `rows × cols`; `b` is a bias of length `cols`; `dY` is the
//! gradient of the loss with respect to a layer's output `Y`.
//!
//! | op          | forward                                 | backward (in place on `dY`)           |
//! |-------------|-----------------------------------------|---------------------------------------|
//! | bias        | `Y[i,j] = X[i,j] + b[j]`                | `db[j] = Σ_i dY[i,j]`, `dX = dY`      |
//! | ReLU        | `y = max(x, 0)`                         | `dx = dy · [y > 0]`                   |
//! | LeakyReLU   | `y = x` if `x > 0`, else `s·x` (`s ≥ 0`)| `dx = dy` if `y > 0`, else `s·dy`     |
//! | ELU         | `y = x` if `x > 0`, else `α(eˣ − 1)`    | `dx = dy` if `y > 0`, else `(y + α)·dy` |
//!
//! The backward passes read the *output* `y`, which is all a layer needs to keep:
//! `y > 0 ⇔ x > 0` for all three (this is why `s ≥ 0` and `α > 0` are required), and
//! ELU's derivative `α·eˣ` equals `y + α` for `x ≤ 0`.
//!
//! ReLU and LeakyReLU propagate NaN in the forward pass; a NaN output gives a zero
//! (ReLU) or `s`-scaled (LeakyReLU) gradient.
//!
//! Large inputs run on rayon's pool in fixed-size chunks; the chunking never changes
//! the result (the column sums of [`bias_grad`] are summed in a fixed block order,
//! whatever the thread count).

use rayon::prelude::*;

use crate::error::{CpuOpsError, Result};
use crate::matmul::{Accumulate, MatMut, MatRef};
use crate::real::Real;

/// Inputs with fewer elements than this run on the calling thread.
const PARALLEL_MIN_LEN: usize = 1 << 16;
/// Elements per parallel task.
const CHUNK_LEN: usize = 1 << 14;
/// Rows per partial sum in [`bias_grad`] (fixed so the sum order is fixed).
const BIAS_GRAD_BLOCK_ROWS: usize = 256;

/// Applies `f` to `x` in chunks, on rayon's pool when `x` is large.
fn for_each_chunk<T: Real>(x: &mut [T], f: impl Fn(&mut [T]) + Send + Sync) {
    if x.len() < PARALLEL_MIN_LEN {
        f(x);
    } else {
        x.par_chunks_mut(CHUNK_LEN).for_each(f);
    }
}

/// Applies `f(y_chunk, dy_chunk)` to matching chunks of `y` and `dy`.
fn for_each_chunk_pair<T: Real>(y: &[T], dy: &mut [T], f: impl Fn(&[T], &mut [T]) + Send + Sync) {
    if dy.len() < PARALLEL_MIN_LEN {
        f(y, dy);
    } else {
        y.par_chunks(CHUNK_LEN)
            .zip(dy.par_chunks_mut(CHUNK_LEN))
            .for_each(|(y, dy)| f(y, dy));
    }
}

/// `x > 0` (false for NaN).
#[inline]
fn positive<T: Real>(x: T) -> bool {
    x > T::ZERO
}

fn check_same_len(what: &'static str, expected: usize, found: usize) -> Result<()> {
    if expected != found {
        return Err(CpuOpsError::SizeMismatch {
            what,
            expected,
            found,
        });
    }
    Ok(())
}

/// `X[i, j] += b[j]` for every row `i`; `bias.len()` must equal `x.cols()`.
pub fn add_bias<T: Real>(mut x: MatMut<'_, T>, bias: &[T]) -> Result<()> {
    let cols = x.cols();
    check_same_len("bias length (columns of X)", cols, bias.len())?;
    if cols == 0 {
        return Ok(());
    }
    let rows_per_chunk = (CHUNK_LEN / cols).max(1);
    let add_rows = |chunk: &mut [T]| {
        for row in chunk.chunks_exact_mut(cols) {
            for (v, &b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
    };
    let data = x.data();
    if data.len() < PARALLEL_MIN_LEN {
        add_rows(data);
    } else {
        data.par_chunks_mut(rows_per_chunk * cols)
            .for_each(add_rows);
    }
    Ok(())
}

/// Bias gradient: `db[j] (+)= Σ_i dY[i, j]` (the column sums of `dY`);
/// `dbias.len()` must equal `dy.cols()`.
///
/// Rows are summed in blocks of 256 and the block sums added in block order, so the
/// result is the same on any thread count.
pub fn bias_grad<T: Real>(dy: MatRef<'_, T>, dbias: &mut [T], acc: Accumulate) -> Result<()> {
    let cols = dy.cols();
    check_same_len("bias gradient length (columns of dY)", cols, dbias.len())?;
    if acc == Accumulate::No {
        dbias.fill(T::ZERO);
    }
    if cols == 0 {
        return Ok(());
    }
    let block_sum = |block: &[T]| {
        let mut s = vec![T::ZERO; cols];
        for row in block.chunks_exact(cols) {
            for (a, &v) in s.iter_mut().zip(row) {
                *a += v;
            }
        }
        s
    };
    let block_len = BIAS_GRAD_BLOCK_ROWS * cols;
    let partials: Vec<Vec<T>> = if dy.data().len() < PARALLEL_MIN_LEN {
        dy.data().chunks(block_len).map(block_sum).collect()
    } else {
        dy.data().par_chunks(block_len).map(block_sum).collect()
    };
    for p in partials {
        for (d, v) in dbias.iter_mut().zip(p) {
            *d += v;
        }
    }
    Ok(())
}

/// ReLU forward in place: `x = max(x, 0)` (NaN stays NaN).
pub fn relu<T: Real>(x: &mut [T]) {
    for_each_chunk(x, |c| {
        // A select, not a conditional store, so LLVM vectorizes it.
        for v in c {
            *v = if *v < T::ZERO { T::ZERO } else { *v };
        }
    });
}

/// ReLU backward in place: `dy *= [y > 0]`, where `y` is the forward output.
pub fn relu_backward<T: Real>(y: &[T], dy: &mut [T]) -> Result<()> {
    check_same_len(
        "ReLU gradient length (length of the output)",
        y.len(),
        dy.len(),
    )?;
    for_each_chunk_pair(y, dy, |y, dy| {
        for (g, &o) in dy.iter_mut().zip(y) {
            *g = if positive(o) { *g } else { T::ZERO };
        }
    });
    Ok(())
}

fn check_slope(slope: f64) -> Result<()> {
    if !(slope.is_finite() && slope >= 0.0) {
        return Err(CpuOpsError::InvalidArgument {
            name: "slope",
            reason: format!("must be finite and >= 0, got {slope}"),
        });
    }
    Ok(())
}

/// LeakyReLU forward in place: `x = x` if `x > 0`, else `slope · x`; `slope ≥ 0`.
pub fn leaky_relu<T: Real>(x: &mut [T], slope: f64) -> Result<()> {
    check_slope(slope)?;
    let s = T::from_f64(slope);
    for_each_chunk(x, |c| {
        for v in c {
            if *v < T::ZERO {
                *v *= s;
            }
        }
    });
    Ok(())
}

/// LeakyReLU backward in place: `dy *= 1` where `y > 0`, else `*= slope`.
pub fn leaky_relu_backward<T: Real>(y: &[T], dy: &mut [T], slope: f64) -> Result<()> {
    check_slope(slope)?;
    check_same_len(
        "LeakyReLU gradient length (length of the output)",
        y.len(),
        dy.len(),
    )?;
    let s = T::from_f64(slope);
    for_each_chunk_pair(y, dy, |y, dy| {
        for (g, &o) in dy.iter_mut().zip(y) {
            if !positive(o) {
                *g *= s;
            }
        }
    });
    Ok(())
}

fn check_alpha(alpha: f64) -> Result<()> {
    if !(alpha.is_finite() && alpha > 0.0) {
        return Err(CpuOpsError::InvalidArgument {
            name: "alpha",
            reason: format!("must be finite and > 0, got {alpha}"),
        });
    }
    Ok(())
}

/// ELU forward in place: `x = x` if `x > 0`, else `alpha · (eˣ − 1)`; `alpha > 0`.
pub fn elu<T: Real>(x: &mut [T], alpha: f64) -> Result<()> {
    check_alpha(alpha)?;
    let a = T::from_f64(alpha);
    for_each_chunk(x, |c| {
        for v in c {
            if !positive(*v) {
                *v = a * (v.exp() - T::ONE);
            }
        }
    });
    Ok(())
}

/// ELU backward in place: `dy *= 1` where `y > 0`, else `*= y + alpha`.
pub fn elu_backward<T: Real>(y: &[T], dy: &mut [T], alpha: f64) -> Result<()> {
    check_alpha(alpha)?;
    check_same_len(
        "ELU gradient length (length of the output)",
        y.len(),
        dy.len(),
    )?;
    let a = T::from_f64(alpha);
    for_each_chunk_pair(y, dy, |y, dy| {
        for (g, &o) in dy.iter_mut().zip(y) {
            if !positive(o) {
                *g *= o + a;
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn random(rng: &mut Rng, len: usize) -> Vec<f64> {
        (0..len).map(|_| rng.next_f64() * 4.0 - 2.0).collect()
    }

    /// Lengths around the parallel threshold and chunk boundaries.
    const LENS: [usize; 6] = [0, 1, 7, 1000, PARALLEL_MIN_LEN + 3, 3 * CHUNK_LEN + 1];

    #[test]
    fn bias_add_and_grad_match_scalar_loops() {
        let mut rng = Rng::new(11);
        for (rows, cols) in [(1, 1), (3, 5), (33, 65), (1000, 129), (2049, 33)] {
            let x: Vec<f64> = random(&mut rng, rows * cols);
            let b: Vec<f64> = random(&mut rng, cols);
            let mut y = x.clone();
            add_bias(MatMut::new(&mut y, rows, cols).unwrap(), &b).unwrap();
            let mut y32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            let b32: Vec<f32> = b.iter().map(|&v| v as f32).collect();
            add_bias(MatMut::new(&mut y32, rows, cols).unwrap(), &b32).unwrap();
            for i in 0..rows {
                for j in 0..cols {
                    assert_eq!(y[i * cols + j], x[i * cols + j] + b[j]);
                    assert_eq!(y32[i * cols + j], x[i * cols + j] as f32 + b32[j]);
                }
            }
            let mut want = vec![0.0f64; cols];
            for i in 0..rows {
                for j in 0..cols {
                    want[j] += x[i * cols + j];
                }
            }
            let dy = MatRef::new(&x, rows, cols).unwrap();
            let mut got = vec![f64::NAN; cols];
            bias_grad(dy, &mut got, Accumulate::No).unwrap();
            for (w, g) in want.iter().zip(&got) {
                assert!((w - g).abs() < 1e-12 * (1.0 + rows as f64), "{w} {g}");
            }
            let mut acc = vec![1.0f64; cols];
            bias_grad(dy, &mut acc, Accumulate::Yes).unwrap();
            for (a, g) in acc.iter().zip(&got) {
                assert!((a - (g + 1.0)).abs() < 1e-12 * (1.0 + rows as f64));
            }
            let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            let mut g32 = vec![0.0f32; cols];
            bias_grad(
                MatRef::new(&x32, rows, cols).unwrap(),
                &mut g32,
                Accumulate::No,
            )
            .unwrap();
            for (w, g) in want.iter().zip(&g32) {
                assert!((w - *g as f64).abs() < 1e-4 * (1.0 + rows as f64).sqrt());
            }
        }
    }

    #[test]
    fn bias_grad_does_not_depend_on_thread_count() {
        let mut rng = Rng::new(12);
        let (rows, cols) = (3000, 47);
        let x: Vec<f32> = (0..rows * cols).map(|_| rng.next_f32() - 0.5).collect();
        let mut outs = Vec::new();
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut g = vec![0.0f32; cols];
            pool.install(|| {
                bias_grad(MatRef::new(&x, rows, cols).unwrap(), &mut g, Accumulate::No)
            })
            .unwrap();
            outs.push(g);
        }
        assert_eq!(outs[0], outs[1]);
    }

    #[test]
    fn activations_match_scalar_loops() {
        let mut rng = Rng::new(13);
        let (slope, alpha) = (0.01, 1.3);
        for len in LENS {
            let x = random(&mut rng, len);
            let dy = random(&mut rng, len);
            let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            let dy32: Vec<f32> = dy.iter().map(|&v| v as f32).collect();

            let mut y = x.clone();
            relu(&mut y);
            let mut y32 = x32.clone();
            relu(&mut y32);
            let mut g = dy.clone();
            relu_backward(&y, &mut g).unwrap();
            let mut g32 = dy32.clone();
            relu_backward(&y32, &mut g32).unwrap();
            for i in 0..len {
                let (want_y, want_g) = if x[i] > 0.0 {
                    (x[i], dy[i])
                } else {
                    (0.0, 0.0)
                };
                assert_eq!((y[i], g[i]), (want_y, want_g));
                let (want_y, want_g) = if x32[i] > 0.0 {
                    (x32[i], dy32[i])
                } else {
                    (0.0, 0.0)
                };
                assert_eq!((y32[i], g32[i]), (want_y, want_g));
            }

            let mut y = x.clone();
            leaky_relu(&mut y, slope).unwrap();
            let mut g = dy.clone();
            leaky_relu_backward(&y, &mut g, slope).unwrap();
            let mut y32 = x32.clone();
            leaky_relu(&mut y32, slope).unwrap();
            let mut g32 = dy32.clone();
            leaky_relu_backward(&y32, &mut g32, slope).unwrap();
            for i in 0..len {
                let (d, d32) = if x[i] > 0.0 {
                    (1.0, 1.0)
                } else {
                    (slope, slope as f32)
                };
                assert_eq!((y[i], g[i]), (x[i] * d, dy[i] * d));
                assert_eq!((y32[i], g32[i]), (x32[i] * d32, dy32[i] * d32));
            }

            let mut y = x.clone();
            elu(&mut y, alpha).unwrap();
            let mut g = dy.clone();
            elu_backward(&y, &mut g, alpha).unwrap();
            let mut y32 = x32.clone();
            elu(&mut y32, alpha).unwrap();
            let mut g32 = dy32.clone();
            elu_backward(&y32, &mut g32, alpha).unwrap();
            for i in 0..len {
                let (want_y, d) = if x[i] > 0.0 {
                    (x[i], 1.0)
                } else {
                    (alpha * (x[i].exp() - 1.0), alpha * x[i].exp())
                };
                assert!((y[i] - want_y).abs() < 1e-14 && (g[i] - dy[i] * d).abs() < 1e-14);
                assert!((y32[i] as f64 - want_y).abs() < 1e-6);
                assert!((g32[i] as f64 - dy[i] * d).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn elu_gradient_matches_finite_difference() {
        let alpha = 0.7;
        for x0 in [-3.0f64, -0.5, -1e-3, 0.25, 2.0] {
            let h = 1e-6;
            let f = |x: f64| {
                let mut v = [x];
                elu(&mut v, alpha).unwrap();
                v[0]
            };
            let fd = (f(x0 + h) - f(x0 - h)) / (2.0 * h);
            let y = [f(x0)];
            let mut g = [1.0];
            elu_backward(&y, &mut g, alpha).unwrap();
            assert!((g[0] - fd).abs() < 1e-8, "{x0}: {} vs {fd}", g[0]);
        }
    }

    #[test]
    fn nan_propagates_forward() {
        let mut x = [f32::NAN, -1.0];
        relu(&mut x);
        assert!(x[0].is_nan() && x[1] == 0.0);
    }

    #[test]
    fn bad_arguments_are_errors() {
        let mut x = [0.0f32; 6];
        let y = [0.0f32; 5];
        assert!(matches!(
            add_bias(MatMut::new(&mut x, 2, 3).unwrap(), &[0.0; 2]),
            Err(CpuOpsError::SizeMismatch {
                expected: 3,
                found: 2,
                ..
            })
        ));
        let mut db = [0.0f32; 4];
        assert!(matches!(
            bias_grad(MatRef::new(&y, 1, 5).unwrap(), &mut db, Accumulate::No),
            Err(CpuOpsError::SizeMismatch { .. })
        ));
        assert!(matches!(
            relu_backward(&y, &mut x),
            Err(CpuOpsError::SizeMismatch { .. })
        ));
        assert!(matches!(
            leaky_relu_backward(&y, &mut x, 0.1),
            Err(CpuOpsError::SizeMismatch { .. })
        ));
        assert!(matches!(
            elu_backward(&y, &mut x, 1.0),
            Err(CpuOpsError::SizeMismatch { .. })
        ));
        assert!(matches!(
            leaky_relu(&mut x, -0.1),
            Err(CpuOpsError::InvalidArgument { .. })
        ));
        assert!(matches!(
            elu(&mut x, 0.0),
            Err(CpuOpsError::InvalidArgument { .. })
        ));
        assert!(matches!(
            elu(&mut x, f64::NAN),
            Err(CpuOpsError::InvalidArgument { .. })
        ));
    }
}
