//! The CUDA backend's stand-in for builds without the `cuda` feature: the same public
//! API, an uninhabited type (no value can exist, so every method body is
//! `match self.never {}`), and a constructor that explains why it is unavailable.
//! Code generic over [`Backend`] compiles unchanged.

use cpu_ops::{AggregateKind, CsrGraph, FeatureMatrix};

use super::stats::AllocatorStats;
use crate::backend::{
    AdamStep, Backend, CacheStats, DeviceBatch, DeviceKind, Elem, FeatureDtype, GatGradsDev,
    GatSaved, LossStats, MemoryInfo, TopologyPlacement,
};
use crate::error::{GpuOpsError, Result};

/// A type with no values: every handle of the stand-in backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Never {}

/// Why the stand-in is unavailable.
const NOT_COMPILED: &str = "this build of Tandem was compiled without the `cuda` feature";

fn not_compiled<T>() -> Result<T> {
    Err(GpuOpsError::Unavailable {
        kind: DeviceKind::Cuda,
        reason: NOT_COMPILED.to_string(),
    })
}

/// The CUDA backend, compiled out: [`CudaBackend::new`] always returns
/// [`GpuOpsError::Unavailable`] saying the `cuda` feature is off.
#[derive(Debug)]
pub struct CudaBackend {
    never: Never,
}

impl CudaBackend {
    /// Always [`GpuOpsError::Unavailable`]: the `cuda` feature is off.
    pub fn new(ordinal: usize) -> Result<Self> {
        let _ = ordinal;
        not_compiled()
    }

    /// Compiles and loads every kernel (unreachable: no value exists).
    pub fn warm_up(&self) -> Result<()> {
        match self.never {}
    }

    /// The caching allocator's counters (unreachable: no value exists).
    pub fn allocator_stats(&self) -> AllocatorStats {
        match self.never {}
    }

    /// Frees the allocator's cached blocks (unreachable: no value exists).
    pub fn release_cached_memory(&self) -> Result<usize> {
        match self.never {}
    }

    /// The device's compute capability (unreachable: no value exists).
    pub fn compute_capability(&self) -> (u32, u32) {
        match self.never {}
    }

    /// Always [`GpuOpsError::Unavailable`]: the kernels are not compiled in.
    pub fn compile_kernels(cc: (u32, u32)) -> Result<Vec<(String, usize)>> {
        let _ = cc;
        not_compiled()
    }

    /// Always [`GpuOpsError::Unavailable`]: NVRTC is not compiled in.
    pub fn compile_source(name: &str, source: &str, cc: (u32, u32)) -> Result<String> {
        let _ = (name, source, cc);
        not_compiled()
    }
}

impl Backend for CudaBackend {
    type Buf<T: Elem> = Never;
    type Pinned<T: Elem> = Never;
    type Stream = Never;
    type Event = Never;
    type Graph = Never;
    type Block = Never;
    type Features = Never;
    type Mask = Never;

    fn kind(&self) -> DeviceKind {
        match self.never {}
    }
    fn describe(&self) -> String {
        match self.never {}
    }
    fn memory_info(&self) -> Result<MemoryInfo> {
        match self.never {}
    }
    fn set_precision(&self, _precision: crate::Precision) -> Result<()> {
        match self.never {}
    }
    fn precision(&self) -> crate::Precision {
        match self.never {}
    }
    fn transfer_stats(&self) -> crate::backend::TransferStats {
        match self.never {}
    }
    fn stream(&self) -> &Never {
        match self.never {}
    }
    fn new_stream(&self) -> Result<Never> {
        match self.never {}
    }
    fn record_event(&self, _: &Never) -> Result<Never> {
        match self.never {}
    }
    fn wait_event(&self, _: &Never, _: &Never) -> Result<()> {
        match self.never {}
    }
    fn elapsed_ms(&self, _: &Never, _: &Never) -> Result<f32> {
        match self.never {}
    }
    fn synchronize(&self, _: &Never) -> Result<()> {
        match self.never {}
    }
    fn alloc<T: Elem>(&self, _: usize) -> Result<Never> {
        match self.never {}
    }
    fn alloc_uninit<T: Elem>(&self, _: usize) -> Result<Never> {
        match self.never {}
    }
    fn len<T: Elem>(&self, _: &Never) -> usize {
        match self.never {}
    }
    fn alloc_pinned<T: Elem>(&self, _: usize) -> Result<Never> {
        match self.never {}
    }
    fn pinned_slice<'a, T: Elem>(&self, _: &'a Never) -> &'a [T] {
        match self.never {}
    }
    fn pinned_slice_mut<'a, T: Elem>(&self, _: &'a mut Never) -> &'a mut [T] {
        match self.never {}
    }
    fn upload<T: Elem>(&self, _: &Never, _: &[T], _: &mut Never) -> Result<()> {
        match self.never {}
    }
    fn upload_pinned<T: Elem>(&self, _: &Never, _: &Never, _: &mut Never) -> Result<()> {
        match self.never {}
    }
    fn upload_pinned_at<T: Elem>(
        &self,
        _: &Never,
        _: &Never,
        _: usize,
        _: &mut Never,
        _: usize,
    ) -> Result<()> {
        match self.never {}
    }
    fn download<T: Elem>(&self, _: &Never, _: &Never, _: &mut [T]) -> Result<()> {
        match self.never {}
    }
    fn copy<T: Elem>(&self, _: &Never, _: &mut Never, _: usize) -> Result<()> {
        match self.never {}
    }
    fn fill_zero<T: Elem>(&self, _: &mut Never, _: usize) -> Result<()> {
        match self.never {}
    }
    fn widen_bf16(&self, _: &Never, _: usize, _: &mut Never) -> Result<()> {
        match self.never {}
    }
    fn scale(&self, _: &mut Never, _: usize, _: f32) -> Result<()> {
        match self.never {}
    }
    fn count_nonfinite(&self, _: &Never, _: usize, _: &mut Never) -> Result<()> {
        match self.never {}
    }
    fn load_graph(&self, _: &CsrGraph, _: TopologyPlacement) -> Result<Never> {
        match self.never {}
    }
    fn sample(&self, _: &Never, _: &[u32], _: &[u32], _: u64) -> Result<DeviceBatch<Self>> {
        match self.never {}
    }
    fn sample_hop(
        &self,
        _: &Never,
        _: &Never,
        _: usize,
        _: u32,
        _: u64,
        _: Option<&Never>,
    ) -> Result<(Never, Never, usize)> {
        match self.never {}
    }
    fn unique_relabel(
        &self,
        _: &Never,
        _: usize,
        _: &Never,
        _: usize,
    ) -> Result<(Never, Never, usize)> {
        match self.never {}
    }
    fn block_from_host(&self, _: usize, _: &[u64], _: &[u32]) -> Result<Never> {
        match self.never {}
    }
    fn add_self_loops(&self, _: &Never) -> Result<Never> {
        match self.never {}
    }
    fn block_to_host(&self, _: &Never) -> Result<(Vec<u64>, Vec<u32>)> {
        match self.never {}
    }
    fn block_shape(&self, _: &Never) -> (usize, usize, usize) {
        match self.never {}
    }
    fn load_features(
        &self,
        _: &FeatureMatrix,
        _: &[u32],
        _: usize,
        _: FeatureDtype,
    ) -> Result<Never> {
        match self.never {}
    }
    fn update_cache(&self, _: &mut Never, _: &[u32], _: &[u32]) -> Result<usize> {
        match self.never {}
    }
    fn is_cached(&self, _: &Never, _: u32) -> bool {
        match self.never {}
    }
    fn feature_dim(&self, _: &Never) -> usize {
        match self.never {}
    }
    fn gather(&self, _: &Never, _: &Never, _: usize, _: &mut Never) -> Result<()> {
        match self.never {}
    }
    fn cache_stats(&self, _: &Never) -> CacheStats {
        match self.never {}
    }
    fn reset_cache_stats(&self, _: &Never) {
        match self.never {}
    }
    fn index_select_rows(
        &self,
        _: &Never,
        _: usize,
        _: &Never,
        _: usize,
        _: &mut Never,
    ) -> Result<()> {
        match self.never {}
    }
    fn index_put_rows(
        &self,
        _: &Never,
        _: usize,
        _: &Never,
        _: usize,
        _: &mut Never,
    ) -> Result<()> {
        match self.never {}
    }
    fn gemm(
        &self,
        _: bool,
        _: bool,
        _: usize,
        _: usize,
        _: usize,
        _: &Never,
        _: &Never,
        _: &mut Never,
        _: bool,
    ) -> Result<()> {
        match self.never {}
    }
    fn aggregate_forward(
        &self,
        _: &Never,
        _: AggregateKind,
        _: &Never,
        _: usize,
        _: &mut Never,
    ) -> Result<()> {
        match self.never {}
    }
    fn aggregate_backward(
        &self,
        _: &Never,
        _: AggregateKind,
        _: &Never,
        _: usize,
        _: &mut Never,
    ) -> Result<()> {
        match self.never {}
    }
    fn gat_forward(
        &self,
        _: &Never,
        _: usize,
        _: usize,
        _: &Never,
        _: &Never,
        _: &Never,
    ) -> Result<GatSaved<Self>> {
        match self.never {}
    }
    fn gat_backward(
        &self,
        _: &Never,
        _: usize,
        _: usize,
        _: &Never,
        _: &Never,
        _: &Never,
        _: &GatSaved<Self>,
        _: &Never,
    ) -> Result<GatGradsDev<Self>> {
        match self.never {}
    }
    fn add_bias(&self, _: &mut Never, _: usize, _: usize, _: &Never) -> Result<()> {
        match self.never {}
    }
    fn bias_grad(&self, _: &Never, _: usize, _: usize, _: &mut Never, _: bool) -> Result<()> {
        match self.never {}
    }
    fn relu(&self, _: &mut Never, _: usize) -> Result<()> {
        match self.never {}
    }
    fn relu_backward(&self, _: &Never, _: &mut Never, _: usize) -> Result<()> {
        match self.never {}
    }
    fn elu(&self, _: &mut Never, _: usize, _: f32) -> Result<()> {
        match self.never {}
    }
    fn elu_backward(&self, _: &Never, _: &mut Never, _: usize, _: f32) -> Result<()> {
        match self.never {}
    }
    fn dropout(&self, _: &mut Never, _: usize, _: f32, _: u64) -> Result<Never> {
        match self.never {}
    }
    fn dropout_backward(&self, _: &Never, _: &mut Never, _: usize) -> Result<()> {
        match self.never {}
    }
    fn softmax_cross_entropy(
        &self,
        _: &Never,
        _: usize,
        _: usize,
        _: &Never,
        _: Option<&mut Never>,
    ) -> Result<LossStats> {
        match self.never {}
    }
    fn adam_step(
        &self,
        _: &AdamStep,
        _: &mut Never,
        _: &Never,
        _: &mut Never,
        _: &mut Never,
        _: usize,
    ) -> Result<()> {
        match self.never {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_names_the_missing_feature() {
        match CudaBackend::new(0) {
            Err(GpuOpsError::Unavailable { kind, reason }) => {
                assert_eq!(kind, DeviceKind::Cuda);
                assert!(reason.contains("without the `cuda` feature"), "{reason}");
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert!(matches!(
            CudaBackend::compile_kernels((9, 0)),
            Err(GpuOpsError::Unavailable { .. })
        ));
    }
}
