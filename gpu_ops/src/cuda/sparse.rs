//! Sparse input rows on CUDA ([`SparseOps`]): not implemented yet. The backend
//! says so ([`SparseOps::supports_sparse`] is `false`) and every op returns
//! [`GpuOpsError::Unsupported`], so a runtime loads dense feature rows on CUDA.
//! (A cuSPARSE or hand-written CSR × dense kernel would go here.)

use std::sync::Arc;

use cpu_ops::SparseRows;

use super::alloc::CudaBuf;
use super::device::CudaBackend;
use crate::backend::{DeviceKind, SparseOps, SparseShape};
use crate::error::{GpuOpsError, Result};

/// Sparse rows on CUDA: no value can exist (the ops are not implemented), so a
/// method that receives one is unreachable.
#[derive(Debug)]
pub enum CudaSparse {}

fn unsupported<T>() -> Result<T> {
    Err(GpuOpsError::Unsupported {
        kind: DeviceKind::Cuda,
        op: "sparse rows (load dense feature rows instead)",
    })
}

impl SparseOps for CudaBackend {
    type Sparse = CudaSparse;

    fn supports_sparse(&self) -> bool {
        false
    }

    fn sparse_from_host(&self, rows: Arc<SparseRows<f32>>) -> Result<CudaSparse> {
        let _ = rows;
        unsupported()
    }

    fn sparse_gather(&self, src: &CudaSparse, _: &CudaBuf<u32>, _: usize) -> Result<CudaSparse> {
        match *src {}
    }

    fn sparse_shape(&self, x: &CudaSparse) -> SparseShape {
        match *x {}
    }

    fn spmm(
        &self,
        x: &CudaSparse,
        _: usize,
        _: &CudaBuf<f32>,
        _: usize,
        _: &mut CudaBuf<f32>,
        _: bool,
    ) -> Result<()> {
        match *x {}
    }

    fn spmm_tn(
        &self,
        x: &CudaSparse,
        _: usize,
        _: &CudaBuf<f32>,
        _: usize,
        _: &mut CudaBuf<f32>,
        _: bool,
    ) -> Result<()> {
        match *x {}
    }
}
