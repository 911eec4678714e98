//! [`DeviceCore`], the base of every op family: a backend's handle types, its
//! identity and settings, and its streams and events.

use super::dtype::{Elem, Precision};
use super::stats::{MemoryInfo, TransferStats};
use crate::error::Result;
use crate::kind::DeviceKind;

/// The base of every op family: a backend's handle types, its identity and
/// settings, and its streams and events.
///
/// Every other family ([`DeviceMemory`](crate::DeviceMemory),
/// [`Sampling`](crate::Sampling), [`FeatureStore`](crate::FeatureStore),
/// [`DenseOps`](crate::DenseOps), [`GraphOps`](crate::GraphOps),
/// [`SparseOps`](crate::SparseOps), [`LinkOps`](crate::LinkOps)) extends it, and [`Backend`](crate::Backend) is all of
/// them. Implemented by [`crate::HostBackend`] and [`crate::CudaBackend`].
pub trait DeviceCore: Send + Sync + Sized + 'static {
    /// A buffer of `T` in device memory.
    type Buf<T: Elem>: Send + Sync;
    /// Page-locked host memory the device reads and writes directly.
    type Pinned<T: Elem>: Send + Sync;
    /// An ordered queue of work.
    type Stream: Send + Sync;
    /// A point in a stream, for ordering and timing.
    type Event: Send + Sync;
    /// Topology ready for [`Sampling::sample`](crate::Sampling::sample).
    type Graph: Send + Sync;
    /// A block (message-flow graph) ready for aggregation, forward and backward.
    type Block: Send + Sync;
    /// Vertex features: a device row cache with a byte budget in front of host rows.
    type Features: Send + Sync;
    /// A dropout mask.
    type Mask: Send + Sync;

    // ---- identity -------------------------------------------------------------
    /// Which backend this is.
    fn kind(&self) -> DeviceKind;
    /// One line naming the device (model, memory, compute capability or SIMD level).
    fn describe(&self) -> String;
    /// Free and total device memory.
    fn memory_info(&self) -> Result<MemoryInfo>;
    /// Copies and synchronizations so far ([`TransferStats`]).
    fn transfer_stats(&self) -> TransferStats;
    /// Sets the arithmetic of this backend's later
    /// [`DenseOps::matmul`](crate::DenseOps::matmul) calls (this instance only).
    fn set_precision(&self, precision: Precision) -> Result<()>;
    /// The arithmetic of [`DenseOps::matmul`](crate::DenseOps::matmul) now.
    fn precision(&self) -> Precision;

    // ---- streams and events ---------------------------------------------------
    /// The compute stream every op runs on.
    fn stream(&self) -> &Self::Stream;
    /// A new stream (for copies that overlap compute).
    fn new_stream(&self) -> Result<Self::Stream>;
    /// Records an event at the current end of `stream`.
    fn record_event(&self, stream: &Self::Stream) -> Result<Self::Event>;
    /// Makes later work on `stream` wait for `event`.
    fn wait_event(&self, stream: &Self::Stream, event: &Self::Event) -> Result<()>;
    /// Milliseconds between two completed events.
    fn elapsed_ms(&self, start: &Self::Event, end: &Self::Event) -> Result<f32>;
    /// Blocks until all work on `stream` is done.
    fn synchronize(&self, stream: &Self::Stream) -> Result<()>;
    /// Blocks the calling thread until the work before `event` on its stream is done, e.g.
    /// a CPU worker waiting for a
    /// [`DeviceMemory::download_pinned`](crate::DeviceMemory::download_pinned) that the
    /// thread issuing device work recorded `event` after. Counted in
    /// [`TransferStats::event_waits`], not in `syncs`. Only the event's own error is
    /// returned: device faults (the CUDA backend's fault word) and errors kept from `Drop`
    /// stay for the next [`DeviceCore::synchronize`] of the stream, on the thread that
    /// issues its work. The host backend returns at once (its work completed before the
    /// event was recorded).
    fn wait_host(&self, event: &Self::Event) -> Result<()>;
}
