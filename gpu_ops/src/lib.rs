//! The accelerator layer of Tandem: one [`Backend`] interface (device memory,
//! streams, events, pinned host buffers, and the ops of sample → gather → train),
//! made of one trait per op family ([`DeviceCore`], [`DeviceMemory`], [`Sampling`],
//! [`FeatureStore`], [`DenseOps`], [`GraphOps`], [`SparseOps`], [`LinkOps`]; all in
//! [`prelude`]), with two
//! implementations:
//! - `host`: the same ops on host threads through `cpu_ops` — runs everywhere and is
//!   the reference every CUDA op is tested against;
//! - `cuda` (cargo feature, on by default): cudarc with dynamic loading, NVRTC-compiled
//!   kernels from `kernels/*.cu`, cuBLAS, a caching allocator. It builds without CUDA
//!   installed and reports a missing library or device at run time.

#![deny(missing_docs)]

mod backend;
mod cache;
mod cuda;
mod error;
mod host;
mod kind;
pub mod model;
mod reduce;

pub use backend::{
    bf16_bits_to_f32, f32_to_bf16_bits, round_to_bf16, round_to_tf32, to_bf16_bits,
    to_bf16_bits_into, ActBackward, Activation, AdamStep, AdamTensors, Backend, CacheStats,
    DenseOps, DevMat, DeviceBatch, DeviceCore, DeviceKind, DeviceMemory, Elem, ExcludedPairs,
    FeatureDtype, FeatureStore, GatGradsDev, GatInputsDev, GatSaved, GraphOps, LinkOps, LossSlot,
    LossStats, MemoryInfo, NegativeDist, Precision, Sampling, SparseOps, SparseShape,
    TopologyPlacement, TransferStats, XentInputs,
};
pub use cache::{CachePolicy, CacheUpdate, NO_SLOT};
pub use cuda::{nccl_available, nccl_unique_id, AllocatorStats, CudaBackend};
pub use error::{GpuOpsError, Result};
pub use host::{
    HostBackend, HostBlock, HostBuf, HostEvent, HostFeatures, HostGraph, HostMask, HostSparse,
    HostStream,
};
pub use model::{
    layer0_rows, AdamMoments, Decoder, DeferredStep, DeviceForward, DeviceModel, Head, HotGrad,
    HotRows, Layer0, LayerInput, ModelLayout, PairBatch, Target,
};
pub use reduce::{check_reduce_args, GradReduce, NcclId};

/// The backend traits, for code that calls ops on a concrete backend
/// ([`HostBackend`], [`CudaBackend`]): `use gpu_ops::prelude::*;` brings every op
/// family into scope. (Code generic over `B: Backend` needs only [`Backend`].)
pub mod prelude {
    pub use crate::backend::{
        Backend, DenseOps, DevMat, DeviceCore, DeviceMemory, FeatureStore, GraphOps, LinkOps,
        Sampling, SparseOps,
    };
}
