//! [`SparseOps`]: sparse input rows (CSR) on a device and the two products a
//! sparse layer-0 input needs.

use std::sync::Arc;

use cpu_ops::SparseRows;

use super::memory::DeviceMemory;
use crate::error::Result;

/// The shape of sparse rows on a device ([`SparseOps::sparse_shape`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SparseShape {
    /// Rows.
    pub rows: usize,
    /// Columns (the feature width).
    pub cols: usize,
    /// Stored non-zeros.
    pub nnz: usize,
}

/// Sparse input rows (CSR, [`cpu_ops::SparseRows`]' layout) on a device, and the
/// two products a sparse layer-0 input needs: `Y = X[..rows]·W` and
/// `dW = X[..rows]ᵀ·G` (layer 0 never needs `∂X`).
///
/// E.g. bag-of-words features (WordNet: 2000 columns, ~1% non-zero), for which the dense
/// layer-0 products multiply mostly zeros. A backend that does not implement them says so
/// with [`SparseOps::supports_sparse`] `= false`, and every op then returns
/// [`GpuOpsError::Unsupported`](crate::GpuOpsError::Unsupported): the caller loads dense
/// rows instead (the CUDA backend, for now).
///
/// The products are plain IEEE single precision whatever
/// [`DeviceCore::precision`](crate::DeviceCore::precision) says (TF32 applies to
/// [`DenseOps::matmul`](crate::DenseOps::matmul) only). On the host backend they are
/// [`SparseRows::spmm_rows`] and [`SparseRows::spmm_tn_rows`]: deterministic, bit for bit,
/// on any thread count.
pub trait SparseOps: DeviceMemory {
    /// Sparse rows (CSR) on the device.
    type Sparse: Send + Sync;
    /// Whether the ops below are implemented (`false`: each returns
    /// [`GpuOpsError::Unsupported`](crate::GpuOpsError::Unsupported)).
    fn supports_sparse(&self) -> bool;
    /// `rows` on the device: the whole feature matrix (to gather batches from
    /// with [`SparseOps::sparse_gather`]) or a batch's rows gathered on the host.
    /// The host backend shares `rows` without copying.
    fn sparse_from_host(&self, rows: Arc<SparseRows<f32>>) -> Result<Self::Sparse>;
    /// The rows `ids[0], …, ids[n − 1]` of `src`, in that order (e.g. a batch's
    /// input rows by the device ids of block 0's sources). An id that is not a
    /// row of `src` is an error.
    fn sparse_gather(
        &self,
        src: &Self::Sparse,
        ids: &Self::Buf<u32>,
        n: usize,
    ) -> Result<Self::Sparse>;
    /// Rows, columns and non-zeros of `x`.
    fn sparse_shape(&self, x: &Self::Sparse) -> SparseShape;
    /// `out (+)= X[..rows]·W` for `w`: `cols × n` and `out`: `rows × n`
    /// (row-major prefixes; `+=` when `accumulate`).
    fn spmm(
        &self,
        x: &Self::Sparse,
        rows: usize,
        w: &Self::Buf<f32>,
        n: usize,
        out: &mut Self::Buf<f32>,
        accumulate: bool,
    ) -> Result<()>;
    /// `dw (+)= X[..rows]ᵀ·G` for `g`: `rows × n` and `dw`: `cols × n` (a weight
    /// gradient; `+=` when `accumulate`).
    fn spmm_tn(
        &self,
        x: &Self::Sparse,
        rows: usize,
        g: &Self::Buf<f32>,
        n: usize,
        dw: &mut Self::Buf<f32>,
        accumulate: bool,
    ) -> Result<()>;
}
