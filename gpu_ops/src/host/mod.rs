//! The `host` backend: every [`Backend`] op on host threads through `cpu_ops`
//! (rayon's current pool, `f32` SIMD at the level [`Simd::detect`] finds).
//!
//! It runs everywhere and is the reference the CUDA backend is tested against
//! (`tests/parity.rs`). Buffers are host vectors ([`HostBuf`], also the pinned
//! type); every op completes before it returns, so streams and events only keep time
//! and every ordering obligation of the contract holds trivially. It is
//! bit-deterministic for a seed, whatever the thread count.
//!
//! Files, one per op family with the trait's file name (`backend/`), each holding the
//! family's impl for [`HostBackend`]: `core` ([`DeviceCore`](crate::DeviceCore): streams,
//! events, identity, precision), `memory` ([`DeviceMemory`](crate::DeviceMemory): copies,
//! `/proc/meminfo`), `sampling` ([`Sampling`](crate::Sampling): sampling, relabel, queued
//! batches), `features` ([`FeatureStore`](crate::FeatureStore): feature cache, gather, row
//! selection), `dense` ([`DenseOps`](crate::DenseOps): matrix products, activations, loss,
//! Adam, elementwise helpers), `graph` ([`GraphOps`](crate::GraphOps): aggregation, GAT),
//! `sparse` ([`SparseOps`](crate::SparseOps): sparse input rows and their products) and
//! `link` ([`LinkOps`](crate::LinkOps): pair scores, binary cross-entropy, negatives,
//! edge exclusion).
//! Beside them, the backend's own pieces: `buffer` (buffers and the prefix checks every op
//! runs), `pool` (the caching allocator behind the buffers) and `block` (validated blocks
//! with a cached transpose). This file holds the backend struct and the umbrella
//! [`Backend`].

mod block;
mod buffer;
mod core;
mod dense;
mod features;
mod graph;
mod link;
mod memory;
mod pool;
mod sampling;
mod sparse;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use cpu_ops::Simd;

use crate::backend::Backend;

pub use self::core::{HostEvent, HostStream};
pub use block::HostBlock;
pub use buffer::HostBuf;
pub use dense::HostMask;
pub use features::HostFeatures;
pub use sampling::HostGraph;
pub use sparse::HostSparse;

/// The host backend (see the module doc). Cheap to create; holds no threads of its
/// own (ops run on rayon's current pool).
#[derive(Debug)]
pub struct HostBackend {
    simd: Simd,
    /// [`crate::Precision::Tf32`] when set (rounds GEMM inputs).
    tf32: std::sync::atomic::AtomicBool,
    compute: HostStream,
    next_stream: AtomicU64,
    transfers: crate::backend::TransferCounter,
    /// Storage of dropped buffers, reused by later allocations (`host/pool.rs`).
    pool: Arc<pool::HostPool>,
}

impl HostBackend {
    /// A backend using the fastest SIMD level of this CPU.
    pub fn new() -> Self {
        Self::with_simd(Simd::detect())
    }

    /// A backend using a chosen SIMD level (e.g. [`Simd::scalar`] in tests).
    pub fn with_simd(simd: Simd) -> Self {
        Self {
            simd,
            tf32: std::sync::atomic::AtomicBool::new(false),
            compute: HostStream::new(0),
            next_stream: AtomicU64::new(1),
            transfers: crate::backend::TransferCounter::default(),
            pool: Arc::default(),
        }
    }

    /// The SIMD level its kernels run at.
    pub fn simd(&self) -> Simd {
        self.simd
    }
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for HostBackend {}
