//! The accelerator interface: one [`Backend`] trait made of op families, two
//! backends (`host`, `cuda`).
//!
//! # Families
//! [`DeviceCore`] is the base: the backend's handle types (`Buf<T>`, `Pinned<T>`,
//! `Stream`, `Event`, `Graph`, `Block`, `Features`, `Mask`), identity, settings,
//! streams and events. The others extend it: [`DeviceMemory`] (allocation and
//! copies), [`Sampling`] (topology, sampling, blocks), [`FeatureStore`] (feature
//! cache, gather, row selection), [`DenseOps`] (matrix products, activations, loss,
//! optimizer), [`GraphOps`] (aggregation, GAT), [`SparseOps`] (sparse input
//! rows and their products) and [`LinkOps`] (link prediction: pair scores, the
//! binary cross-entropy, negative sampling, edge exclusion). [`Backend`] is all
//! of them, so generic code bounds on `B: Backend` alone.
//!
//! # Contract
//! 1. **Streams.** Every op runs on the backend's *compute stream*
//!    ([`DeviceCore::stream`]) in call order. Copies ([`DeviceMemory::upload`],
//!    [`DeviceMemory::download`]) name their stream, so a copy stream can overlap compute;
//!    order across streams with [`DeviceCore::record_event`] + [`DeviceCore::wait_event`].
//!    A host thread waits for one point of a stream with [`DeviceCore::wait_host`]
//!    on its event, e.g. for an asynchronous [`DeviceMemory::download_pinned`]
//!    issued by another thread.
//!    On the host backend every op completes before it returns (streams and events
//!    only keep time), which trivially satisfies every ordering obligation.
//! 2. **Shapes.** Matrices are row-major `f32`. An op reads the *prefix* of a buffer
//!    its shape arguments describe (`rows × cols` elements) and writes the prefix of
//!    its output, so a buffer may be longer than the op needs (buffers are reused
//!    across batches) and "the first `n_dst` rows" of a matrix is the same buffer with
//!    a smaller row count. A buffer shorter than required is a
//!    [`GpuOpsError::SizeMismatch`](crate::GpuOpsError::SizeMismatch), never an
//!    out-of-bounds access.
//! 3. **Results** that the host needs (loss, counts) are returned by value: such an
//!    op synchronizes the compute stream.
//! 4. **Determinism.** The host backend is bit-deterministic for a seed. The CUDA
//!    backend is deterministic except where it says so (atomics in backward
//!    aggregation sum in any order); sampling and dropout use their own counter-based
//!    generators, so they agree with the host backend in distribution, not bit by bit.
//! 5. **Layer-based orchestration.** These ops let a runtime mix CPU-computed
//!    embeddings into a device batch without a host round trip:
//!    [`Sampling::sample_hop`] samples a batch one hop at a time from destinations
//!    already on the device (hop by hop with `derive_seed(seed, l)` it reproduces
//!    [`Sampling::sample`]), with a skip mask for the destinations whose embedding
//!    comes from a CPU-computed table: they get no neighbors, so the device neither
//!    gathers nor aggregates their neighborhoods. [`DeviceMemory::upload_pinned_at`]
//!    copies those rows from pinned staging memory into their offset of a device
//!    buffer on a copy stream. The layers above the bottom are sampled ahead, a group
//!    of batches at a time, with [`Sampling::sample_queued_from`] (layer `l` still
//!    drawn with `derive_seed(seed, l)`), the bottom hops with
//!    [`Sampling::sample_hop_queued`], and [`Sampling::read_queued`] /
//!    [`Sampling::finish_read`] bring their sizes (and the top layers' bottom ids) to
//!    the host with one synchronization, or one event wait for hops only, which
//!    another thread may wait for.
//! 6. **Link prediction.** [`LinkOps`] scores pairs of embedding rows
//!    ([`LinkOps::pair_dot`], [`LinkOps::pair_hadamard`]) and adds their
//!    gradients back into the rows (float atomics on CUDA: last bits vary where
//!    rows repeat, as in the backward aggregation); [`LinkOps::bce_with_logits`]
//!    and [`LinkOps::bce_with_logits_deferred`] are the node task's two loss
//!    paths for binary labels, with the same slot and guard protocol.
//!    [`LinkOps::sample_negatives`] is the one exception to item 4's "same
//!    distribution": every backend draws the **same** vertices for a seed (one
//!    counter-based generator, `cpu_ops::hash_draw`, and an integer inverse-CDF
//!    search over a table made on the host), so a run's negatives do not depend
//!    on where they were drawn. [`LinkOps::exclude_edges`] removes the pairs of an
//!    [`ExcludedPairs`] table from a sampled block (sorted keys, bisection, a
//!    compaction by scan), which CUDA does with one read of the kept edge count.
//!
//! # Files
//! One file per family trait, with the types its ops take and return: `core.rs`
//! ([`DeviceCore`]), `memory.rs` ([`DeviceMemory`]), `sampling.rs` ([`Sampling`],
//! [`DeviceBatch`], [`TopologyPlacement`]), `features.rs` ([`FeatureStore`]),
//! `dense.rs` ([`DenseOps`], [`DevMat`], the loss and Adam arguments), `graph.rs`
//! ([`GraphOps`], the GAT inputs and gradients), `sparse.rs` ([`SparseOps`],
//! [`SparseShape`]) and `link.rs` ([`LinkOps`], [`NegativeDist`],
//! [`ExcludedPairs`]). Shared by several families: `dtype.rs` (buffer elements
//! [`Elem`], [`FeatureDtype`], [`Precision`], the bfloat16 and TF32 roundings) and
//! `stats.rs` ([`MemoryInfo`], [`CacheStats`], [`TransferStats`]). Both backends
//! keep the same file names, one per family: `host/{core,memory,sampling,...}.rs`
//! and `cuda/{core,memory,sampling,...}.rs`.

mod core;
mod dense;
mod dtype;
mod features;
mod graph;
mod link;
mod memory;
mod sampling;
mod sparse;
mod stats;

pub use self::core::DeviceCore;
pub(crate) use dense::check_count_len;
pub use dense::{
    ActBackward, Activation, AdamStep, AdamTensors, DenseOps, DevMat, LossSlot, LossStats,
    XentInputs,
};
pub use dtype::{
    bf16_bits_to_f32, f32_to_bf16_bits, round_to_bf16, round_to_tf32, to_bf16_bits,
    to_bf16_bits_into, Elem, FeatureDtype, Precision,
};
pub use features::FeatureStore;
pub use graph::{GatGradsDev, GatInputsDev, GatSaved, GraphOps};
pub(crate) use link::{check_exclude_dst, check_negatives};
pub use link::{ExcludedPairs, LinkOps, NegativeDist};
pub use memory::DeviceMemory;
pub(crate) use sampling::check_fanouts_from;
pub use sampling::{DeviceBatch, Sampling, TopologyPlacement};
pub use sparse::{SparseOps, SparseShape};
pub(crate) use stats::TransferCounter;
pub use stats::{CacheStats, MemoryInfo, TransferStats};

use crate::error::Result;
pub use crate::kind::DeviceKind;

/// The accelerator: memory, streams, events and the ops of sample → gather → train.
///
/// Implemented by [`crate::HostBackend`] (always) and [`crate::CudaBackend`] (the
/// `cuda` feature; without it, or without a GPU, its constructor returns
/// [`crate::GpuOpsError::Unavailable`]). Shapes and ordering: the module doc.
///
/// The ops live in one trait per family ([`DeviceCore`], [`DeviceMemory`], [`Sampling`],
/// [`FeatureStore`], [`DenseOps`], [`GraphOps`], [`SparseOps`], [`LinkOps`]); this trait is all of them
/// plus the collective reduce, so generic code bounds on `B: Backend` and calls any op.
/// Code calling ops on a concrete backend imports the families (`use gpu_ops::prelude::*`).
pub trait Backend:
    DeviceCore + DeviceMemory + Sampling + FeatureStore + DenseOps + GraphOps + SparseOps + LinkOps
{
    /// Joins rank `rank` of `ranks` to the NCCL communicator of `id` on this
    /// device (collective: every rank calls it with the same `id`, from
    /// [`crate::nccl_unique_id`] on rank 0). Errors: NCCL missing, a backend
    /// that is not CUDA (the default), or NCCL's own error.
    fn nccl_reduce(
        &self,
        rank: usize,
        ranks: usize,
        id: &crate::NcclId,
    ) -> Result<Box<dyn crate::GradReduce<Self>>>
    where
        Self: Sized,
    {
        let _ = (rank, ranks, id);
        Err(crate::error::GpuOpsError::Unavailable {
            kind: self.kind(),
            reason: format!(
                "NCCL reduces CUDA device buffers; the {} backend has none",
                self.kind()
            ),
        })
    }
}
