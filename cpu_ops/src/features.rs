//! Row-major `f32` feature matrix (one row per vertex).

use crate::array::HostArray;
use crate::error::{CpuOpsError, Result};

/// A dense `num_rows × dim` matrix of `f32`, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct FeatureMatrix {
    data: HostArray<f32>,
    num_rows: usize,
    dim: usize,
}

impl FeatureMatrix {
    /// Wraps `data`, which must hold exactly `num_rows * dim` values.
    pub fn new(data: HostArray<f32>, num_rows: usize, dim: usize) -> Result<Self> {
        let expected = num_rows
            .checked_mul(dim)
            .ok_or_else(|| CpuOpsError::InvalidArgument {
                name: "num_rows * dim",
                reason: format!("{num_rows} × {dim} overflows"),
            })?;
        if data.len() != expected {
            return Err(CpuOpsError::SizeMismatch {
                what: "feature matrix values (num_rows × dim)",
                expected,
                found: data.len(),
            });
        }
        Ok(Self {
            data,
            num_rows,
            dim,
        })
    }

    /// Number of rows (vertices).
    pub fn num_rows(&self) -> usize {
        self.num_rows
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Row `i`. Panics if out of range.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    /// All values, row-major.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// The backing array.
    pub fn data(&self) -> &HostArray<f32> {
        &self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_size_check() {
        let m =
            FeatureMatrix::new((0..6).map(|x| x as f32).collect::<Vec<_>>().into(), 3, 2).unwrap();
        assert_eq!(m.row(1), &[2.0, 3.0]);
        assert!(FeatureMatrix::new(vec![0.0; 5].into(), 3, 2).is_err());
    }
}
