//! Softmax cross-entropy over rows with integer labels, and accuracy.
//!
//! For logits `Z` (`B × C`, one row per example) and labels `y_i ∈ 0..C`:
//!
//! - forward, computed stably with the row maximum `m_i = max_j Z[i,j]`:
//!   `lse_i = m_i + ln Σ_j exp(Z[i,j] − m_i)`,
//!   `loss = (1/B) Σ_i (lse_i − Z[i, y_i])` (the mean negative log-likelihood);
//! - backward: `∂loss/∂Z[i,j] = (softmax(Z_i)_j − [j = y_i]) / B`
//!   with `softmax(Z_i)_j = exp(Z[i,j] − lse_i)`;
//! - accuracy: the count of rows whose arg-max (the first, on ties) equals `y_i`.
//!
//! Exponentials run in `T` (every exponent is `≤ 0`, so nothing overflows); the loss
//! is summed in `f64`. Large batches run on rayon's pool in fixed row blocks whose
//! partial sums are added in block order, so the result does not depend on the thread
//! count. A row with a NaN logit gives a NaN loss.

use rayon::prelude::*;

use crate::error::{CpuOpsError, Result};
use crate::matmul::{MatMut, MatRef};
use crate::real::Real;

/// Rows per task (and per partial sum).
const BLOCK_ROWS: usize = 256;
/// Batches with fewer logits than this run on the calling thread.
const PARALLEL_MIN_LEN: usize = 1 << 15;

/// What [`softmax_cross_entropy`] (or [`crate::bce_with_logits`]) measured over a batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossEntropy {
    /// Mean loss over the rows (0 for an empty batch).
    pub loss: f64,
    /// Rows whose arg-max equals the label.
    pub correct: usize,
    /// Number of rows.
    pub rows: usize,
}

impl CrossEntropy {
    /// `correct / rows` (0 for an empty batch).
    pub fn accuracy(&self) -> f64 {
        if self.rows == 0 {
            0.0
        } else {
            self.correct as f64 / self.rows as f64
        }
    }
}

fn check_labels(rows: usize, classes: usize, labels: &[u32]) -> Result<()> {
    if labels.len() != rows {
        return Err(CpuOpsError::SizeMismatch {
            what: "labels (one per row of logits)",
            expected: rows,
            found: labels.len(),
        });
    }
    if let Some((i, &l)) = labels
        .iter()
        .enumerate()
        .find(|&(_, &l)| l as usize >= classes)
    {
        return Err(CpuOpsError::InvalidArgument {
            name: "labels",
            reason: format!("label {l} of row {i} is not below the class count {classes}"),
        });
    }
    Ok(())
}

/// Index of the first maximum of a non-empty row (NaNs never win).
fn argmax<T: Real>(row: &[T]) -> usize {
    let mut best = 0;
    for (j, &v) in row.iter().enumerate().skip(1) {
        if v > row[best] {
            best = j;
        }
    }
    best
}

/// Loss sum and correct count of one block of rows; writes the block's gradient
/// rows (already divided by the batch size) when `grad` is given.
fn block<T: Real>(
    logits: &[T],
    labels: &[u32],
    classes: usize,
    inv_batch: T,
    mut grad: Option<&mut [T]>,
) -> (f64, usize) {
    let mut loss = 0.0f64;
    let mut correct = 0usize;
    for (i, (row, &label)) in logits.chunks_exact(classes).zip(labels).enumerate() {
        let label = label as usize;
        let best = argmax(row);
        let m = row[best];
        correct += usize::from(best == label);
        let sum: T = row.iter().map(|&z| (z - m).exp()).sum();
        let log_sum = sum.ln();
        // lse − z_y = (m − z_y) + ln Σ exp(z − m)
        loss += (m - row[label]).to_f64() + log_sum.to_f64();
        if let Some(g) = grad.as_deref_mut() {
            let g_row = &mut g[i * classes..(i + 1) * classes];
            let shift = m + log_sum;
            for (gv, &z) in g_row.iter_mut().zip(row) {
                *gv = (z - shift).exp() * inv_batch;
            }
            g_row[label] -= inv_batch;
        }
    }
    (loss, correct)
}

/// Mean softmax cross-entropy of `logits` (`B × C`) against `labels` (`B` values in
/// `0..C`), the correct-prediction count, and, when `grad` is given (`B × C`), the
/// gradient `(softmax − onehot) / B` written into it (see the module docs).
///
/// Errors: `SizeMismatch` when `labels` or `grad` do not match `logits`;
/// `InvalidArgument` for a label `≥ C`, or `C = 0` with a non-empty batch.
pub fn softmax_cross_entropy<T: Real>(
    logits: MatRef<'_, T>,
    labels: &[u32],
    grad: Option<MatMut<'_, T>>,
) -> Result<CrossEntropy> {
    let (rows, classes) = (logits.rows(), logits.cols());
    check_labels(rows, classes, labels)?;
    let mut grad = grad;
    if let Some(g) = &grad {
        if (g.rows(), g.cols()) != (rows, classes) {
            return Err(CpuOpsError::SizeMismatch {
                what: "gradient values (must have the logits' shape)",
                expected: rows * classes,
                found: g.rows() * g.cols(),
            });
        }
    }
    if rows == 0 {
        return Ok(CrossEntropy {
            loss: 0.0,
            correct: 0,
            rows: 0,
        });
    }
    // rows > 0 and every label < classes, so classes > 0 here.
    let inv_batch = T::from_f64(1.0 / rows as f64);
    let z = logits.data();
    let block_len = BLOCK_ROWS * classes;
    let grad_data = grad.as_mut().map(|g| g.data());
    let partials: Vec<(f64, usize)> = if z.len() < PARALLEL_MIN_LEN {
        match grad_data {
            Some(g) => z
                .chunks(block_len)
                .zip(labels.chunks(BLOCK_ROWS))
                .zip(g.chunks_mut(block_len))
                .map(|((z, l), g)| block(z, l, classes, inv_batch, Some(g)))
                .collect(),
            None => z
                .chunks(block_len)
                .zip(labels.chunks(BLOCK_ROWS))
                .map(|(z, l)| block(z, l, classes, inv_batch, None))
                .collect(),
        }
    } else {
        match grad_data {
            Some(g) => z
                .par_chunks(block_len)
                .zip(labels.par_chunks(BLOCK_ROWS))
                .zip(g.par_chunks_mut(block_len))
                .map(|((z, l), g)| block(z, l, classes, inv_batch, Some(g)))
                .collect(),
            None => z
                .par_chunks(block_len)
                .zip(labels.par_chunks(BLOCK_ROWS))
                .map(|(z, l)| block(z, l, classes, inv_batch, None))
                .collect(),
        }
    };
    let (loss_sum, correct) = partials
        .iter()
        .fold((0.0, 0), |(l, c), &(bl, bc)| (l + bl, c + bc));
    Ok(CrossEntropy {
        loss: loss_sum / rows as f64,
        correct,
        rows,
    })
}

/// Number of rows of `logits` (`B × C`) whose arg-max (first on ties) equals the
/// label; errors as [`softmax_cross_entropy`].
pub fn accuracy_count<T: Real>(logits: MatRef<'_, T>, labels: &[u32]) -> Result<usize> {
    let (rows, classes) = (logits.rows(), logits.cols());
    check_labels(rows, classes, labels)?;
    if rows == 0 {
        return Ok(0);
    }
    let count = |(z, l): (&[T], &[u32])| {
        z.chunks_exact(classes)
            .zip(l)
            .filter(|(row, &label)| argmax(row) == label as usize)
            .count()
    };
    let z = logits.data();
    Ok(if z.len() < PARALLEL_MIN_LEN {
        z.chunks(BLOCK_ROWS * classes)
            .zip(labels.chunks(BLOCK_ROWS))
            .map(count)
            .sum()
    } else {
        z.par_chunks(BLOCK_ROWS * classes)
            .zip(labels.par_chunks(BLOCK_ROWS))
            .map(count)
            .sum()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Textbook cross-entropy in f64: −ln(softmax(z)_y), averaged.
    fn reference(z: &[f64], classes: usize, labels: &[u32]) -> (f64, Vec<f64>) {
        let rows = labels.len();
        let mut loss = 0.0;
        let mut grad = vec![0.0; z.len()];
        for i in 0..rows {
            let row = &z[i * classes..(i + 1) * classes];
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
            for j in 0..classes {
                let p = (row[j] - m).exp() / s;
                grad[i * classes + j] =
                    (p - if j == labels[i] as usize { 1.0 } else { 0.0 }) / rows as f64;
            }
            loss += -((row[labels[i] as usize] - m).exp() / s).ln();
        }
        (loss / rows as f64, grad)
    }

    fn random_problem(rng: &mut Rng, rows: usize, classes: usize) -> (Vec<f64>, Vec<u32>) {
        let z = (0..rows * classes).map(|_| rng.normal() * 3.0).collect();
        let y = (0..rows)
            .map(|_| rng.below(classes as u64) as u32)
            .collect();
        (z, y)
    }

    #[test]
    fn matches_reference_f64_and_f32() {
        let mut rng = Rng::new(21);
        for (rows, classes) in [(1, 1), (3, 5), (33, 47), (257, 7), (600, 64)] {
            let (z, y) = random_problem(&mut rng, rows, classes);
            let (want_loss, want_grad) = reference(&z, classes, &y);
            let mut g = vec![0.0f64; rows * classes];
            let ce = softmax_cross_entropy(
                MatRef::new(&z, rows, classes).unwrap(),
                &y,
                Some(MatMut::new(&mut g, rows, classes).unwrap()),
            )
            .unwrap();
            assert!((ce.loss - want_loss).abs() < 1e-12 * (1.0 + want_loss));
            for (a, b) in g.iter().zip(&want_grad) {
                assert!((a - b).abs() < 1e-15, "{a} {b}");
            }
            let z32: Vec<f32> = z.iter().map(|&v| v as f32).collect();
            let mut g32 = vec![0.0f32; rows * classes];
            let ce32 = softmax_cross_entropy(
                MatRef::new(&z32, rows, classes).unwrap(),
                &y,
                Some(MatMut::new(&mut g32, rows, classes).unwrap()),
            )
            .unwrap();
            assert!((ce32.loss - want_loss).abs() < 1e-5 * (1.0 + want_loss));
            for (a, b) in g32.iter().zip(&want_grad) {
                assert!((*a as f64 - b).abs() < 1e-6 / rows as f64 + 1e-7);
            }
            let correct = (0..rows)
                .filter(|&i| argmax(&z[i * classes..(i + 1) * classes]) == y[i] as usize)
                .count();
            assert_eq!(ce.correct, correct);
            assert_eq!(ce32.correct, correct);
            assert_eq!(ce.rows, rows);
            let no_grad =
                softmax_cross_entropy(MatRef::new(&z, rows, classes).unwrap(), &y, None).unwrap();
            assert_eq!(no_grad, ce);
            let acc = accuracy_count(MatRef::new(&z, rows, classes).unwrap(), &y).unwrap();
            assert_eq!(acc, correct);
        }
    }

    #[test]
    fn gradient_matches_finite_differences_f64() {
        let mut rng = Rng::new(22);
        let (rows, classes) = (5, 7);
        let (z, y) = random_problem(&mut rng, rows, classes);
        let loss = |z: &[f64]| {
            softmax_cross_entropy(MatRef::new(z, rows, classes).unwrap(), &y, None)
                .unwrap()
                .loss
        };
        let mut g = vec![0.0; rows * classes];
        softmax_cross_entropy(
            MatRef::new(&z, rows, classes).unwrap(),
            &y,
            Some(MatMut::new(&mut g, rows, classes).unwrap()),
        )
        .unwrap();
        let h = 1e-5;
        let mut zp = z.clone();
        let (mut num, mut den) = (0.0f64, 0.0f64);
        for idx in 0..z.len() {
            zp[idx] = z[idx] + h;
            let up = loss(&zp);
            zp[idx] = z[idx] - h;
            let down = loss(&zp);
            zp[idx] = z[idx];
            let fd = (up - down) / (2.0 * h);
            num += (fd - g[idx]).powi(2);
            den += g[idx].powi(2);
        }
        let rel = (num / den).sqrt();
        assert!(rel < 1e-6, "relative error {rel}");
    }

    #[test]
    fn stable_for_huge_logits() {
        let z = [1e30f32, 0.0, -1e30, 1000.0, 1001.0, 999.0];
        let mut g = [0.0f32; 6];
        let ce = softmax_cross_entropy(
            MatRef::new(&z, 2, 3).unwrap(),
            &[0, 0],
            Some(MatMut::new(&mut g, 2, 3).unwrap()),
        )
        .unwrap();
        assert!(ce.loss.is_finite() && g.iter().all(|v| v.is_finite()));
        // Row 0 is certain and right (loss 0); row 1 (label 0, max 1001):
        // lse − z₀ = 1001 + ln(e⁻¹ + 1 + e⁻²) − 1000.
        let row1 = 1.0 + ((-1.0f64).exp() + 1.0 + (-2.0f64).exp()).ln();
        assert!(
            (ce.loss - row1 / 2.0).abs() < 1e-5,
            "{} {}",
            ce.loss,
            row1 / 2.0
        );
        assert_eq!(ce.correct, 1);
        assert_eq!(g[0], 0.0);
    }

    #[test]
    fn parallel_blocks_match_serial_and_thread_count() {
        let mut rng = Rng::new(23);
        let (rows, classes) = (3000, 47);
        let (z, y) = random_problem(&mut rng, rows, classes);
        let z: Vec<f32> = z.iter().map(|&v| v as f32).collect();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut g = vec![0.0f32; rows * classes];
            let ce = pool
                .install(|| {
                    softmax_cross_entropy(
                        MatRef::new(&z, rows, classes).unwrap(),
                        &y,
                        Some(MatMut::new(&mut g, rows, classes).unwrap()),
                    )
                })
                .unwrap();
            (ce, g)
        };
        let a = run(1);
        assert_eq!(a, run(3));
        // Against the f64 reference.
        let z64: Vec<f64> = z.iter().map(|&v| v as f64).collect();
        let (want, _) = reference(&z64, classes, &y);
        assert!((a.0.loss - want).abs() < 1e-5 * want);
        assert_eq!(
            accuracy_count(MatRef::new(&z, rows, classes).unwrap(), &y).unwrap(),
            a.0.correct
        );
    }

    #[test]
    fn bad_inputs_are_errors() {
        let z = [0.0f32; 6];
        let m = MatRef::new(&z, 2, 3).unwrap();
        assert!(matches!(
            softmax_cross_entropy(m, &[0], None),
            Err(CpuOpsError::SizeMismatch {
                expected: 2,
                found: 1,
                ..
            })
        ));
        assert!(matches!(
            softmax_cross_entropy(m, &[0, 3], None),
            Err(CpuOpsError::InvalidArgument { .. })
        ));
        assert!(matches!(
            accuracy_count(m, &[0, 1, 2]),
            Err(CpuOpsError::SizeMismatch { .. })
        ));
        let mut g = [0.0f32; 6];
        assert!(matches!(
            softmax_cross_entropy(m, &[0, 1], Some(MatMut::new(&mut g, 3, 2).unwrap())),
            Err(CpuOpsError::SizeMismatch { .. })
        ));
        let empty: [f32; 0] = [];
        let ce = softmax_cross_entropy(MatRef::new(&empty, 0, 3).unwrap(), &[], None).unwrap();
        assert_eq!((ce.loss, ce.rows, ce.accuracy()), (0.0, 0, 0.0));
        assert!(matches!(
            softmax_cross_entropy(MatRef::new(&empty, 2, 0).unwrap(), &[0, 0], None),
            Err(CpuOpsError::InvalidArgument { .. })
        ));
    }
}
