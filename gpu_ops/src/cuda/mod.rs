//! The CUDA backend ([`CudaBackend`]), behind the `cuda` cargo feature.
//!
//! With the feature (the default) this is cudarc with dynamic loading: NVRTC-compiled
//! kernels from `gpu_ops/kernels/*.cu`, cuBLAS for GEMM, a caching allocator, pinned
//! and zero-copy host memory. It builds without CUDA installed; [`CudaBackend::new`]
//! reports a missing library or device as [`crate::GpuOpsError::Unavailable`].
//! Without the feature, a stand-in with the same API (an uninhabited type) compiles
//! instead, so code generic over [`crate::Backend`] needs no `cfg`.
//!
//! Files, by concern: `device.rs` (the backend: context, streams, events, faults),
//! `alloc.rs` (caching allocator, device buffers), `pinned.rs` (pinned and zero-copy
//! host memory), `kernels.rs` (kernel registry, NVRTC, typed launchers), `transfer.rs`
//! (copies), `scan.rs` (prefix sums), `sample.rs` (topology, sampling, relabel,
//! blocks), `features.rs` (feature cache, gather, row selection), `math.rs` (dense
//! math), `aggregate.rs` (aggregation, GAT), `backend_impl.rs` (the trait impl).
//! Design notes: `docs/gpu.md`.

mod stats;

pub use stats::AllocatorStats;

#[cfg(feature = "cuda")]
mod aggregate;
#[cfg(feature = "cuda")]
mod alloc;
#[cfg(feature = "cuda")]
mod backend_impl;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod features;
#[cfg(feature = "cuda")]
mod kernels;
#[cfg(feature = "cuda")]
mod math;
#[cfg(feature = "cuda")]
mod pinned;
#[cfg(feature = "cuda")]
mod sample;
#[cfg(feature = "cuda")]
mod scan;
#[cfg(feature = "cuda")]
mod transfer;

#[cfg(feature = "cuda")]
pub use device::CudaBackend;

#[cfg(not(feature = "cuda"))]
mod disabled;
#[cfg(not(feature = "cuda"))]
pub use disabled::CudaBackend;
