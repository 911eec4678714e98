//! The CUDA backend's stand-in for builds without the `cuda` feature: the same public
//! API, an uninhabited type (no value can exist, so every method body is
//! `match self.never {}`), and a constructor that explains why it is unavailable.
//! Code generic over [`Backend`] compiles unchanged.
//!
//! Every handle type is [`Never`], so each op family is implemented by
//! `uninhabited!` from a one-line signature per method (argument types only).

use std::sync::Arc;

use cpu_ops::{AggregateKind, CsrGraph, FeatureMatrix, SparseRows};

use super::stats::AllocatorStats;
use crate::backend::{
    AdamStep, Backend, CacheStats, DenseOps, DevMat, DeviceBatch, DeviceCore, DeviceKind,
    DeviceMemory, Elem, ExcludedPairs, FeatureDtype, FeatureStore, GatGradsDev, GatInputsDev,
    GatSaved, GraphOps, LinkOps, LossSlot, LossStats, MemoryInfo, NegativeDist, Precision,
    Sampling, SparseOps, SparseShape, TopologyPlacement, TransferStats, XentInputs,
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

/// Implements op families for the uninhabited [`CudaBackend`]: each `type` is
/// [`Never`]; each `fn name[generics](argument types) -> ret;` becomes a method
/// taking `&self` and those arguments whose body is `match self.never {}`.
macro_rules! uninhabited {
    ($(impl $family:ident {
        $(type $ty:ident $(<$tp:ident: $tb:ident>)?;)*
        $(fn $name:ident $([$($gen:tt)*])? ($($arg:ty),*) $(-> $ret:ty)?;)*
    })*) => {$(
        impl $family for CudaBackend {
            $(type $ty $(<$tp: $tb>)? = Never;)*
            $(fn $name $(<$($gen)*>)? (&self, $(_: $arg),*) $(-> $ret)? {
                match self.never {}
            })*
        }
    )*};
}

uninhabited! {
    impl DeviceCore {
        type Buf<T: Elem>;
        type Pinned<T: Elem>;
        type Stream;
        type Event;
        type Graph;
        type Block;
        type Features;
        type Mask;
        fn kind() -> DeviceKind;
        fn describe() -> String;
        fn memory_info() -> Result<MemoryInfo>;
        fn transfer_stats() -> TransferStats;
        fn set_precision(Precision) -> Result<()>;
        fn precision() -> Precision;
        fn stream() -> &Never;
        fn new_stream() -> Result<Never>;
        fn record_event(&Never) -> Result<Never>;
        fn wait_event(&Never, &Never) -> Result<()>;
        fn elapsed_ms(&Never, &Never) -> Result<f32>;
        fn synchronize(&Never) -> Result<()>;
        fn wait_host(&Never) -> Result<()>;
    }
    impl DeviceMemory {
        fn alloc[T: Elem](usize) -> Result<Never>;
        fn alloc_uninit[T: Elem](usize) -> Result<Never>;
        fn len[T: Elem](&Never) -> usize;
        fn alloc_pinned[T: Elem](usize) -> Result<Never>;
        fn pinned_slice['a, T: Elem](&'a Never) -> &'a [T];
        fn pinned_slice_mut['a, T: Elem](&'a mut Never) -> &'a mut [T];
        fn upload[T: Elem](&Never, &[T], &mut Never) -> Result<()>;
        fn upload_pinned[T: Elem](&Never, &Never, &mut Never) -> Result<()>;
        fn upload_pinned_at[T: Elem](&Never, &Never, usize, &mut Never, usize) -> Result<()>;
        fn download[T: Elem](&Never, &Never, &mut [T]) -> Result<()>;
        fn download_pinned[T: Elem](&Never, &Never, usize, &mut Never) -> Result<()>;
        fn copy[T: Elem](&Never, &mut Never, usize) -> Result<()>;
        fn fill_zero[T: Elem](&mut Never, usize) -> Result<()>;
        fn dlpack_device() -> (i32, i32);
        fn address[T: Elem](&Never) -> u64;
        fn hand_over[T: Elem](&mut Never, &Never, u64) -> Result<()>;
    }
    impl Sampling {
        type Queued;
        type Reading;
        fn load_graph(&CsrGraph, TopologyPlacement) -> Result<Never>;
        fn sample(&Never, &[u32], &[u32], u64) -> Result<DeviceBatch<Self>>;
        fn sample_queued_from(&Never, &[u32], &[u32], usize, u64) -> Result<Never>;
        fn resolve_queued(Vec<Never>) -> Result<Vec<DeviceBatch<Self>>>;
        fn read_queued(Vec<Never>) -> Result<Never>;
        fn finish_read(Never) -> Result<Vec<(DeviceBatch<Self>, Vec<u32>)>>;
        fn sample_hop(&Never, &Never, usize, u32, u64, Option<&Never>)
            -> Result<(Never, Never, usize)>;
        fn sample_hop_queued(&Never, &Never, usize, u32, u64, Option<&Never>) -> Result<Never>;
        fn unique_relabel(&Never, usize, &Never, usize) -> Result<(Never, Never, usize)>;
        fn block_from_host(usize, &[u64], &[u32]) -> Result<Never>;
        fn add_self_loops(&Never) -> Result<Never>;
        fn block_to_host(&Never) -> Result<(Vec<u64>, Vec<u32>)>;
        fn block_shape(&Never) -> (usize, usize, usize);
        fn block_addresses(&Never) -> (u64, u64);
        fn hand_over_block(&mut Never, &Never, u64) -> Result<()>;
    }
    impl FeatureStore {
        fn load_features(&FeatureMatrix, &[u32], usize, FeatureDtype) -> Result<Never>;
        fn update_cache(&mut Never, &[u32], &[u32]) -> Result<usize>;
        fn is_cached(&Never, u32) -> bool;
        fn feature_dim(&Never) -> usize;
        fn gather(&Never, &Never, usize, &mut Never) -> Result<()>;
        fn cache_stats(&Never) -> CacheStats;
        fn reset_cache_stats(&Never);
        fn index_select_rows(&Never, usize, &Never, usize, &mut Never) -> Result<()>;
        fn index_put_rows(&Never, usize, &Never, usize, &mut Never) -> Result<()>;
    }
    impl DenseOps {
        fn matmul(DevMat<'_, Self>, DevMat<'_, Self>, &mut Never, bool) -> Result<()>;
        fn add_bias(&mut Never, usize, usize, &Never) -> Result<()>;
        fn bias_grad(&Never, usize, usize, &mut Never, bool) -> Result<()>;
        fn relu(&mut Never, usize) -> Result<()>;
        fn relu_backward(&Never, &mut Never, usize) -> Result<()>;
        fn elu(&mut Never, usize, f32) -> Result<()>;
        fn elu_backward(&Never, &mut Never, usize, f32) -> Result<()>;
        fn dropout(&mut Never, usize, f32, u64) -> Result<Never>;
        fn dropout_backward(&Never, &mut Never, usize) -> Result<()>;
        fn softmax_cross_entropy(&Never, usize, usize, &Never, Option<&mut Never>)
            -> Result<LossStats>;
        fn adam_step(&AdamStep, &mut Never, &Never, &mut Never, &mut Never, usize) -> Result<()>;
        fn softmax_cross_entropy_deferred(&XentInputs<'_, Self>, &mut Never, LossSlot<'_, Self>,
            &mut Never) -> Result<()>;
        fn widen_bf16(&Never, usize, &mut Never) -> Result<()>;
        fn widen_bf16_at(&Never, usize, usize, &mut Never, usize) -> Result<()>;
        fn scale(&mut Never, usize, f32) -> Result<()>;
        fn count_nonfinite(&Never, usize, &mut Never) -> Result<()>;
    }
    impl GraphOps {
        fn aggregate_forward(&Never, AggregateKind, &Never, usize, &mut Never) -> Result<()>;
        fn aggregate_backward(&Never, AggregateKind, &Never, usize, &mut Never) -> Result<()>;
        fn gat_forward(&Never, &GatInputsDev<'_, Self>) -> Result<GatSaved<Self>>;
        fn gat_backward(&Never, &GatInputsDev<'_, Self>, &GatSaved<Self>, &Never)
            -> Result<GatGradsDev<Self>>;
    }
    impl SparseOps {
        type Sparse;
        fn supports_sparse() -> bool;
        fn sparse_from_host(Arc<SparseRows<f32>>) -> Result<Never>;
        fn sparse_gather(&Never, &Never, usize) -> Result<Never>;
        fn sparse_shape(&Never) -> SparseShape;
        fn spmm(&Never, usize, &Never, usize, &mut Never, bool) -> Result<()>;
        fn spmm_tn(&Never, usize, &Never, usize, &mut Never, bool) -> Result<()>;
    }
    impl LinkOps {
        fn pair_dot(&Never, usize, &Never, &Never, usize, &mut Never) -> Result<()>;
        fn pair_dot_backward(&Never, usize, &Never, &Never, usize, &Never, &mut Never)
            -> Result<()>;
        fn pair_hadamard(&Never, usize, &Never, &Never, usize, &mut Never) -> Result<()>;
        fn pair_hadamard_backward(&Never, usize, &Never, &Never, usize, &Never, &mut Never)
            -> Result<()>;
        fn bce_with_logits(&Never, &Never, usize, Option<&mut Never>) -> Result<LossStats>;
        fn bce_with_logits_deferred(&Never, &Never, usize, &mut Never, LossSlot<'_, Self>,
            &mut Never) -> Result<()>;
        fn sample_negatives(usize, usize, &Never, usize, u64, &NegativeDist<Self>, &mut Never,
            &mut Never) -> Result<()>;
        fn exclude_edges(&Never, &Never, usize, &ExcludedPairs<Self>) -> Result<Never>;
    }
}

/// The collective reduce keeps its default (unreachable here).
impl Backend for CudaBackend {}

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
