//! [`Sampling`]: topology on the device ([`TopologyPlacement`]), layered and
//! hop-by-hop neighbor sampling, queued batches and their reads, and blocks
//! ([`DeviceBatch`]).

use cpu_ops::CsrGraph;

use super::core::DeviceCore;
use crate::error::Result;

/// Where a graph's topology lives for device-side sampling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum TopologyPlacement {
    /// Copied into device memory (fastest; costs `8(n+1) + 4m` bytes).
    #[default]
    Device,
    /// Left in (pinned) host memory and read zero-copy over the bus: large graphs.
    PinnedHost,
}

/// A sampled mini-batch on a device: blocks bottom first (block `l` feeds layer `l`),
/// as [`cpu_ops::SampledBatch`] lays them out.
pub struct DeviceBatch<B: DeviceCore> {
    /// The blocks, bottom first; block `l`'s destinations are block `l+1`'s sources,
    /// and the last block's destinations are the seeds.
    pub blocks: Vec<B::Block>,
    /// Global ids of each block's sources (`src_ids[l]` has `num_src(blocks[l])`
    /// entries, destinations first). `src_ids[0]` are the rows to gather.
    pub src_ids: Vec<B::Buf<u32>>,
    /// Number of seeds.
    pub num_seeds: usize,
}

/// What every backend's [`Sampling::sample_queued_from`] checks of its
/// layers: at least one, `from` below their count, and no zero fanout from
/// layer `from` on.
pub(crate) fn check_fanouts_from(fanouts: &[u32], from: usize) -> Result<()> {
    use crate::error::GpuOpsError;
    if fanouts.is_empty() {
        return Err(GpuOpsError::InvalidArgument {
            name: "fanouts",
            reason: "at least one layer is needed".into(),
        });
    }
    if from >= fanouts.len() {
        return Err(GpuOpsError::InvalidArgument {
            name: "from",
            reason: format!(
                "layer {from} is not below the {} layers of the fanouts",
                fanouts.len()
            ),
        });
    }
    if let Some(l) = (from..fanouts.len()).find(|&l| fanouts[l] == 0) {
        return Err(GpuOpsError::InvalidArgument {
            name: "fanouts",
            reason: format!(
                "the fanout of layer {l} is 0; use ALL_NEIGHBORS ({}) to take every neighbor",
                cpu_ops::ALL_NEIGHBORS
            ),
        });
    }
    Ok(())
}

/// Topology on the device, neighbor sampling and blocks (message-flow graphs).
pub trait Sampling: DeviceCore {
    /// A batch queued by [`Sampling::sample_queued`]: its kernels enqueued, its
    /// layer sizes still on the device until [`Sampling::resolve_queued`].
    type Queued: Send;
    /// The read of a group of queued batches in flight
    /// ([`Sampling::read_queued`]), until [`Sampling::finish_read`].
    type Reading: Send;
    /// Makes `graph` readable by [`Sampling::sample`] from `placement`.
    fn load_graph(&self, graph: &CsrGraph, placement: TopologyPlacement) -> Result<Self::Graph>;
    /// Layered neighbor sampling without replacement from `seeds` (top) downwards,
    /// `fanouts[l]` neighbors per destination for block `l` (bottom first, DGL's
    /// order; [`cpu_ops::ALL_NEIGHBORS`] takes all). Each block's sources are its
    /// destinations followed by the new vertices ([`Sampling::unique_relabel`]).
    fn sample(
        &self,
        graph: &Self::Graph,
        seeds: &[u32],
        fanouts: &[u32],
        seed: u64,
    ) -> Result<DeviceBatch<Self>>;
    /// [`Sampling::sample`] without a synchronization: the batch is enqueued
    /// (buffers sized by bounds) and its layer sizes stay on the device until
    /// [`Sampling::resolve_queued`] reads them. The host checks (fanouts, seeds in
    /// range and distinct) happen here; a layer whose edge bound is too loose to
    /// allocate still reads its edge count (one synchronization), as `sample` does.
    /// The blocks are those `sample` makes for the same arguments.
    /// [`Sampling::sample_queued_from`] from layer 0.
    fn sample_queued(
        &self,
        graph: &Self::Graph,
        seeds: &[u32],
        fanouts: &[u32],
        seed: u64,
    ) -> Result<Self::Queued> {
        self.sample_queued_from(graph, seeds, fanouts, 0, seed)
    }
    /// [`Sampling::sample_queued`] of layers `from..fanouts.len()` only: the
    /// blocks those layers of `sample(graph, seeds, fanouts, seed)` are (layer
    /// `l` drawn with `derive_seed(seed, l)`, `fanouts[l]` neighbors a
    /// destination), the layers below `from` not sampled. Resolved, the batch
    /// holds `fanouts.len() − from` blocks, layer `from`'s first, and its
    /// `src_ids[0]` are the destinations of layer `from − 1`: e.g. a batch's top
    /// layers sampled a super-batch ahead, its bottom hop later with
    /// [`Sampling::sample_hop`] and `derive_seed(seed, 0)` (the layer-based
    /// pipeline). Errors: those of `sample_queued` for the layers sampled, and
    /// `from` not below `fanouts.len()`.
    fn sample_queued_from(
        &self,
        graph: &Self::Graph,
        seeds: &[u32],
        fanouts: &[u32],
        from: usize,
        seed: u64,
    ) -> Result<Self::Queued>;
    /// The batches of earlier [`Sampling::sample_queued`] calls on this backend, in
    /// order, with **one synchronization for all of them** (one read of every
    /// batch's layer sizes): what lets a sampler running ahead read the sizes of
    /// several batches at once. The first error (a device fault, a repeated
    /// frontier id) fails the call. `sample` is `sample_queued` then
    /// `resolve_queued` of that one batch.
    fn resolve_queued(&self, queued: Vec<Self::Queued>) -> Result<Vec<DeviceBatch<Self>>>;
    /// Starts [`Sampling::resolve_queued`]'s one read without waiting for it:
    /// every queued batch's layer sizes and its bottom sources (`src_ids[0]`,
    /// read at the capacity the batch was sized by, as the sizes are not known
    /// yet) are copied into page-locked host memory, asynchronously on this
    /// backend's stream. Nothing synchronizes. [`Sampling::finish_read`] on this
    /// backend waits for the copy, on any thread: e.g. a planner thread waits
    /// for the bottom ids while the thread that queued them issues other work.
    /// A reading dropped unfinished waits for its copy first.
    fn read_queued(&self, queued: Vec<Self::Queued>) -> Result<Self::Reading>;
    /// The batches of a [`Sampling::read_queued`] of this backend, in order,
    /// each with its bottom sources on the host (`src_ids[0]`'s first
    /// `num_src(blocks[0])` ids), after **one synchronization** for all of them
    /// (none for a reading of no batch). The batches are those
    /// [`Sampling::resolve_queued`] returns; its errors, and on CUDA a reading
    /// another backend started (its copies are on that backend's stream). A
    /// reading of [`Sampling::sample_hop_queued`] hops only waits for its
    /// copies' event instead (an event wait, no synchronization: on CUDA the
    /// stream may since wait for another's work through the allocator), and
    /// a device fault of their kernels surfaces at the backend's next
    /// synchronization.
    #[allow(clippy::type_complexity)]
    fn finish_read(&self, reading: Self::Reading) -> Result<Vec<(DeviceBatch<Self>, Vec<u32>)>>;
    /// One hop of [`Sampling::sample`] from device-resident destinations: the block
    /// whose destinations are `dst[..n_dst]` (distinct), `fanout` neighbors each
    /// ([`cpu_ops::ALL_NEIGHBORS`] takes all), drawn with the per-layer seed
    /// `layer_seed`. Returns `(block, src_ids, num_src)`: the block, its sources'
    /// global ids (destinations first, then new ids in first-occurrence order) and
    /// their count.
    ///
    /// Determinism: with `layer_seed = cpu_ops::derive_seed(seed, l)` and no mask the
    /// block is layer `l` of [`Sampling::sample`]`(seed)` on the same backend with
    /// these destinations, so hop by hop (each hop's `dst` being the sources of the
    /// hop above) reproduces `sample`; on the host backend it is
    /// [`cpu_ops::sample_hop`].
    ///
    /// `skip` (`n_dst` flags, a prefix of the buffer): a destination whose flag is
    /// non-zero gets no neighbors (an empty row), so neither its neighborhood nor
    /// sources only it would read enter the block; every other destination's
    /// neighbors are those it gets without the mask. This lets a caller decide on the
    /// device which bottom destinations take their embedding from elsewhere before
    /// sampling their hop, with no host round trip.
    ///
    /// Errors: `n_dst` beyond `dst`'s length or `skip` shorter than `n_dst`
    /// ([`GpuOpsError::SizeMismatch`](crate::GpuOpsError::SizeMismatch)), a fanout of
    /// 0, a repeated destination or one outside the graph. Synchronizes (as `sample`
    /// does per layer).
    #[allow(clippy::type_complexity)]
    fn sample_hop(
        &self,
        graph: &Self::Graph,
        dst: &Self::Buf<u32>,
        n_dst: usize,
        fanout: u32,
        layer_seed: u64,
        skip: Option<&Self::Buf<u8>>,
    ) -> Result<(Self::Block, Self::Buf<u32>, usize)>;
    /// [`Sampling::sample_hop`] without a synchronization: the hop's kernels
    /// are enqueued (its buffers sized by bounds, as
    /// [`Sampling::sample_queued_from`]'s layers are) and its sizes stay on the
    /// device until [`Sampling::resolve_queued`] or [`Sampling::read_queued`] /
    /// [`Sampling::finish_read`] read them, together with other queued batches
    /// (one synchronization for all). Resolved, the batch holds one block (the
    /// one `sample_hop` makes for the same arguments, bit for bit on the same
    /// backend), its sources as `src_ids[0]` and `num_seeds = n_dst`; a read
    /// copies no ids back for it (`finish_read`'s id vector is empty: the
    /// sources stay on the device; a read of hops only takes an event wait,
    /// not a synchronization). `dst[..n_dst]` and `skip[..n_dst]` must not
    /// change until the hop is resolved (on CUDA they are read in stream order:
    /// write them on this backend's stream before the call). The layer path
    /// samples each batch's bottom hop a super-batch ahead with it, masked by
    /// the batch's planned hot positions. Errors: those of `sample_hop` that
    /// the host can check here (lengths, a fanout of 0); a repeated or
    /// out-of-range destination here (host backend) or when the hop is
    /// resolved (CUDA).
    fn sample_hop_queued(
        &self,
        graph: &Self::Graph,
        dst: &Self::Buf<u32>,
        n_dst: usize,
        fanout: u32,
        layer_seed: u64,
        skip: Option<&Self::Buf<u8>>,
    ) -> Result<Self::Queued>;
    /// Unique ids of `targets ++ candidates` with the targets first in their order
    /// (they must be distinct) and the other ids in first-occurrence order, plus the
    /// position of each candidate in that list. Returns `(unique, local, n_unique)`.
    #[allow(clippy::type_complexity)]
    fn unique_relabel(
        &self,
        targets: &Self::Buf<u32>,
        num_targets: usize,
        candidates: &Self::Buf<u32>,
        num_candidates: usize,
    ) -> Result<(Self::Buf<u32>, Self::Buf<u32>, usize)>;
    /// A block from host CSR (`indptr` of `num_dst + 1` entries, `indices` below
    /// `num_src`); validated.
    fn block_from_host(
        &self,
        num_src: usize,
        indptr: &[u64],
        indices: &[u32],
    ) -> Result<Self::Block>;
    /// The block with a self-loop per destination: destination `i` reads `N(i)`
    /// followed by source `i` (GCN's augmented block; `cpu_ops`' GCN layer builds
    /// the same on the host).
    fn add_self_loops(&self, block: &Self::Block) -> Result<Self::Block>;
    /// A block's CSR on the host: `(indptr, indices)` (`num_dst + 1` offsets and
    /// `num_edges` local source ids). Synchronizes.
    fn block_to_host(&self, block: &Self::Block) -> Result<(Vec<u64>, Vec<u32>)>;
    /// `(num_src, num_dst, num_edges)` of a block.
    fn block_shape(&self, block: &Self::Block) -> (usize, usize, usize);
    /// The addresses of a block's CSR arrays, `(indptr, indices)`: `num_dst +
    /// 1` u64 offsets and `num_edges` u32 local source ids, as
    /// [`DeviceMemory::address`](crate::DeviceMemory::address) gives a
    /// buffer's.
    fn block_addresses(&self, block: &Self::Block) -> (u64, u64);
    /// [`DeviceMemory::hand_over`](crate::DeviceMemory::hand_over) of both of
    /// a block's CSR arrays.
    fn hand_over_block(
        &self,
        block: &mut Self::Block,
        ready: &Self::Event,
        stream: u64,
    ) -> Result<()>;
    /// A second backend on the same device to sample ahead with: its ops run on
    /// their own stream, with their own allocator and fault word, so a batch it
    /// samples (and the synchronizations that sampling needs) overlaps the work
    /// this backend has queued. It reads graphs this backend loaded. Hand each of
    /// its batches over with [`Sampling::adopt_batch`] before this backend uses it.
    ///
    /// `None` (the default) where the backend has no sibling; callers then sample
    /// on this backend. The host backend returns a second host backend: nothing
    /// runs asynchronously there, so it only keeps callers on the same path.
    fn sampling_sibling(&self) -> Result<Option<Self>> {
        Ok(None)
    }
    /// Hands `batch`, sampled by `from` (this backend's
    /// [`Sampling::sampling_sibling`]), to this backend: this backend's stream
    /// waits for everything `from` has enqueued so far, and when the batch's
    /// buffers are dropped, `from` reuses their memory only after this backend's
    /// work enqueued before the drop. Keep `from` alive while the batch lives.
    /// A no-op where nothing runs asynchronously (the host backend).
    fn adopt_batch(&self, from: &Self, batch: &mut DeviceBatch<Self>) -> Result<()> {
        let _ = (from, batch);
        Ok(())
    }
}
