//! The CUDA backend ([`CudaBackend`]), behind the `cuda` cargo feature.
//!
//! With the feature (the default) this is cudarc with dynamic loading: NVRTC-compiled
//! kernels from `gpu_ops/kernels/*.cu`, cuBLAS for GEMM, a caching allocator, pinned
//! and zero-copy host memory. It builds without CUDA installed; [`CudaBackend::new`]
//! reports a missing library or device as [`crate::GpuOpsError::Unavailable`].
//! Without the feature, a stand-in with the same API (an uninhabited type) compiles
//! instead, so code generic over [`crate::Backend`] needs no `cfg`.
//!
//! Files, one per op family with the trait's file name (`backend/`), each holding
//! the family's impl for [`CudaBackend`]: `core.rs` ([`crate::DeviceCore`]: the
//! handle types, streams, events, synchronization, memory info, precision),
//! `memory.rs` ([`crate::DeviceMemory`]: allocation and copies), `sampling.rs`
//! ([`crate::Sampling`]: topology, sampling, relabel, blocks, queued reads),
//! `features.rs` ([`crate::FeatureStore`]: feature cache, gather, row selection),
//! `dense.rs` ([`crate::DenseOps`]: dense math, loss, Adam), `graph.rs`
//! ([`crate::GraphOps`]: aggregation, GAT), `sparse.rs` ([`crate::SparseOps`]:
//! not implemented, reported as such) and `link.rs` ([`crate::LinkOps`]: pair
//! scores, binary cross-entropy, negatives, edge exclusion); `nccl.rs` adds the umbrella
//! [`crate::Backend`] (its collective reduce over NCCL).
//!
//! Beside them, the backend's own pieces: `device.rs` (the backend struct:
//! availability checks, context, stream and event handles, the fault word, the
//! cuBLAS handle), `alloc.rs` (caching allocator, device buffers), `pinned.rs`
//! (pinned and zero-copy host memory), `kernels.rs` (kernel registry, NVRTC, typed
//! launch arguments), `scan.rs` (prefix sums), `gemm.rs` (the row-major product as
//! a column-major GEMM), `gemm_lt.rs` (the opt-in cuBLASLt GEMM path), `driver.rs`
//! (driver and cuBLAS errors) and `stats.rs` (the allocator's counters, shared with
//! `disabled.rs`, the stand-in compiled without the feature).
//! Design notes: `docs/gpu.md`.

mod stats;

pub use stats::AllocatorStats;

#[cfg(feature = "cuda")]
mod alloc;
#[cfg(feature = "cuda")]
mod core;
#[cfg(feature = "cuda")]
mod dense;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod driver;
#[cfg(feature = "cuda")]
mod features;
#[cfg(feature = "cuda")]
mod gemm;
#[cfg(feature = "cuda")]
mod gemm_lt;
#[cfg(feature = "cuda")]
mod graph;
#[cfg(feature = "cuda")]
mod kernels;
#[cfg(feature = "cuda")]
mod link;
#[cfg(feature = "cuda")]
mod memory;
#[cfg(feature = "cuda")]
mod nccl;
#[cfg(feature = "cuda")]
mod pinned;
#[cfg(feature = "cuda")]
mod sampling;
#[cfg(feature = "cuda")]
mod scan;
#[cfg(feature = "cuda")]
mod sparse;

#[cfg(feature = "cuda")]
pub use device::CudaBackend;

/// Why NCCL cannot be used here.
const NCCL_MISSING: &str = "libnccl.so (NCCL) not found: install NCCL 2 (Debian: \
     libnccl2, or the `nvidia-nccl-cu13` wheel) and put its lib directory on LD_LIBRARY_PATH";

/// Whether NCCL can be loaded (`libnccl.so`, opened and closed again): `Ok`, or
/// [`crate::GpuOpsError::Unavailable`] naming the library (always, without the
/// `cuda` feature).
pub fn nccl_available() -> crate::Result<()> {
    #[cfg(feature = "cuda")]
    // SAFETY: `is_culib_present` only tries to dlopen libnccl under its known
    // names (closing it again); it has no other side effects.
    let present = unsafe { cudarc::nccl::sys::is_culib_present() };
    #[cfg(not(feature = "cuda"))]
    let present = false;
    if present {
        return Ok(());
    }
    #[cfg(feature = "cuda")]
    {
        // NCCL's packages (Debian's libnccl2, the pip wheel) ship only
        // `libnccl.so.2`, a name cudarc does not try.
        // SAFETY: loading NCCL runs no initialization beyond the dynamic
        // linker's; the handle is dropped (closed) at once.
        if unsafe { libloading::Library::new("libnccl.so.2") }.is_ok() {
            return Err(crate::GpuOpsError::Unavailable {
                kind: crate::DeviceKind::Cuda,
                reason: "libnccl.so.2 is installed but libnccl.so, the name cudarc loads, \
                         is not: link libnccl.so to it in a directory on LD_LIBRARY_PATH"
                    .into(),
            });
        }
    }
    Err(crate::GpuOpsError::Unavailable {
        kind: crate::DeviceKind::Cuda,
        reason: NCCL_MISSING.into(),
    })
}

/// A fresh NCCL unique id, for rank 0 of a job to broadcast before every rank
/// calls [`crate::Backend::nccl_reduce`]. Errors: NCCL missing (as
/// [`nccl_available`]), or NCCL's own error.
pub fn nccl_unique_id() -> crate::Result<crate::NcclId> {
    #[cfg(feature = "cuda")]
    return nccl::unique_id();
    #[cfg(not(feature = "cuda"))]
    nccl_available().map(|()| crate::NcclId([0; 128]))
}

#[cfg(not(feature = "cuda"))]
mod disabled;
#[cfg(not(feature = "cuda"))]
pub use disabled::CudaBackend;

#[cfg(test)]
mod tests {
    /// `TANDEM_EXPECT_NCCL` = `missing` (no NCCL), `so2` (only `libnccl.so.2` on
    /// the library path, as NCCL's packages install it) or `present` (a
    /// `libnccl.so` too) asserts the case; unset, any answer must name the
    /// library in one line.
    #[test]
    fn nccl_presence_is_one_line_naming_the_library() {
        let got = super::nccl_available();
        let msg = got
            .as_ref()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!msg.contains('\n'), "{msg}");
        assert!(got.is_ok() || msg.contains("libnccl.so"), "{msg}");
        match std::env::var("TANDEM_EXPECT_NCCL").as_deref() {
            Ok("missing") => assert!(msg.contains("libnccl.so (NCCL) not found"), "{msg}"),
            Ok("so2") => assert!(msg.contains("libnccl.so.2 is installed"), "{msg}"),
            Ok("present") => assert!(got.is_ok(), "{msg}"),
            Ok(other) => panic!("TANDEM_EXPECT_NCCL = {other:?}: expected missing|so2|present"),
            Err(_) => {}
        }
    }
}
