//! The layer-based strategy's device half (docs/orchestration.md §11): the
//! hot-row slabs and their uploads, the top layers and bottom hops sampled a
//! super-batch ahead, the hot-row store, and a batch trained with hot rows read
//! from a slab, over the engine's mechanisms ([`crate::engine::DeviceEngine`]:
//! the model, the feature cache, the sampling sibling, the loss slots).
//! [`LayerEngine`] holds the engine and this state; [`LayerDevice`] is what the
//! pipeline (`executor/layer/pipeline.rs`) and the monitor ask of it.
//!
//! Files: `slabs.rs` (steps 2, 3, 5), `ahead.rs` (steps 1, 1b), `train.rs`
//! (step 4), this file (the trait, the state, layer 0's publication).
//!
//! # Protocol
//! 1. **Sample the top a super-batch ahead**
//!    ([`LayerDevice::prepare_tops`](LayerDevice::prepare_tops), once
//!    per super-batch): the layers above the bottom of every batch are queued
//!    ([`Sampling::sample_queued_from`](gpu_ops::Sampling::sample_queued_from)
//!    from layer 1: layer `l` drawn with `derive_seed(seed, l)`, exactly as
//!    [`Sampling::sample`](gpu_ops::Sampling::sample) draws it, so the blocks
//!    are those a hop-by-hop [`Sampling::sample_hop`](gpu_ops::Sampling::sample_hop)
//!    makes), then one read of all their layer sizes and bottom destinations
//!    (block 1's sources) is started
//!    ([`Sampling::read_queued`](gpu_ops::Sampling::read_queued): into
//!    page-locked memory on CUDA). With `device.sample_ahead` this runs on the
//!    sampling sibling (its own stream, `engine/sibling.rs`), never on the
//!    compute stream, and the read's one synchronization is left to whoever
//!    calls [`TopsAhead::wait`] — the planner thread, which plans the CPU's
//!    queue from those ids; without it the engine's backend samples and reads
//!    at once (one synchronization of the compute stream per super-batch).
//!    [`LayerDevice::adopt_tops`](LayerDevice::adopt_tops) then keeps the
//!    blocks under their batches' keys, handed to the compute stream with
//!    [`Sampling::adopt_batch`](gpu_ops::Sampling::adopt_batch) (it waits for
//!    the sibling's work, and their memory is reused only after the compute
//!    stream's). Before: two `sample_hop`s and a download per batch, three
//!    synchronizations of the compute stream while the super-batch before
//!    trained on it.
//!
//!    **1b. The bottom hop, a super-batch ahead too**
//!    ([`LayerDevice::prepare_bottoms`](LayerDevice::prepare_bottoms),
//!    at the super-batch's launch, right after its plan is handled and its
//!    top layers adopted; only with `device.sample_ahead`): every batch's
//!    bottom hop is queued on the sampling sibling behind its top layers
//!    ([`Sampling::sample_hop_queued`](gpu_ops::Sampling::sample_hop_queued)
//!    from block 1's sources, `derive_seed(seed, 0)`), skipping the batch's
//!    *planned* hot positions (`hot_backward = "constant"`; none with
//!    `"aggregate"`) — its skip mask uploaded on the sibling's stream — and
//!    one read of their sizes (no ids) is started. The super-batch's first
//!    [`LayerDevice::train_prepared`](LayerDevice::train_prepared)
//!    finishes that read — a wait for its copies' event, queued a super-batch
//!    before, not a synchronization of either stream — and hands the hops to
//!    the compute stream ([`Sampling::adopt_batch`](gpu_ops::Sampling::adopt_batch)). A
//!    batch that trains with the positions its hop skipped uses it; one that
//!    trains with others (late chunks left cold under `on_late = "compute"`)
//!    samples its hop again as step 4 describes, counted in
//!    [`BottomCounts::resampled`]. Before: one `sample_hop` per batch on the
//!    compute stream, one synchronization of it each. The two super-batches'
//!    bottom hops alive at once (`2N` batches' block 0) are within
//!    `engine/memory.rs` step 4's blocks kept ahead for `N ≤ 8`, and step 8
//!    counts the batches beyond. (The event,
//!    not the stream: on CUDA the sibling's stream also waits, through its
//!    allocator, for compute work that dropped its buffers — `cuda/alloc.rs`
//!    step 3 — so synchronizing it at the super-batch's first batch would
//!    wait for the batches queued before, once losses are not read every
//!    step.)
//! 2. **Slabs.** Two device buffers of `rows × width` (`width` = layer 0's output
//!    width). Super-batch `j` reads slab `j % 2` while the CPU's rows for `j + 1`
//!    go into the other. [`LayerDevice::hot_slab_reserve`](LayerDevice::hot_slab_reserve) (called when the queue of
//!    `j + 1` is planned, after every batch of `j − 1` was enqueued) grows the slab
//!    if needed and makes the copy stream wait for the compute stream's work so
//!    far, so no upload overwrites rows a queued batch of `j − 1` still reads.
//! 3. **Install** ([`LayerDevice::hot_install`](LayerDevice::hot_install)): a finished CPU chunk's rows go from
//!    its [`HotStaging`] buffer (page-locked on CUDA) into the slab at the chunk's
//!    first queue position, asynchronously on the copy stream; an event recorded
//!    after the copy is waited for by the compute stream, so every batch enqueued
//!    later reads the rows (a GPU-side wait: the host thread does not block). The
//!    staging buffer's host view waits for the copy before it can be rewritten.
//!    With bfloat16 feature rows (`device.feature_dtype = "bf16"`) the worker
//!    narrows its fp32 rows into the staging buffer's bfloat16 half
//!    ([`HotStaging::seal`], round to nearest even, as
//!    [`f32_to_bf16_bits`](gpu_ops::f32_to_bf16_bits)); the install uploads
//!    those (half the bytes) into the slab's bfloat16 mirror at the same
//!    position, and the compute stream, after waiting for the copy, widens
//!    them into the slab's fp32 rows
//!    ([`DenseOps::widen_bf16_at`](gpu_ops::DenseOps::widen_bf16_at)). Each
//!    chunk has its own region of the mirror, which step 2's wait protects
//!    from the next super-batch's uploads, so no upload overwrites bits not
//!    yet widened.
//! 4. **Train** ([`LayerDevice::train_prepared`](LayerDevice::train_prepared)) with a [`HotUse`]: upload the
//!    batch's hot positions and slab rows (8 bytes per hot destination) into
//!    reused buffers; take the bottom hop sampled ahead (step 1b) when it
//!    skipped exactly these positions, else upload the skip mask (1 byte per
//!    bottom destination) and sample the
//!    bottom hop with the hot destinations skipped (`hot_backward = "constant"`:
//!    the accelerator neither gathers nor aggregates their neighborhoods — no
//!    host round trip); gather the remaining inputs through the feature cache;
//!    select the hot rows from the slab on the device; forward with them in
//!    place of layer 0's outputs; loss, backward, step — with a loss slot
//!    (`device.loss_lag` > 1) the loss goes to the slot and the step is
//!    guarded, nothing read ([`gpu_ops::DeviceModel::train_step_hot_deferred`];
//!    `engine/losses.rs`). With `"aggregate"`
//!    nothing is skipped (the hot rows' gradient flows through the accelerator's
//!    own aggregate of their neighborhoods).
//!
//! 5. **The hot-row store** (reuse across super-batches, `scheduler::protocol`
//!    steps 3–4): one device buffer of rows indexed by relabeled hot id.
//!    [`LayerDevice::hot_keep`](LayerDevice::hot_keep) copies freshly
//!    installed slab rows into it and
//!    [`LayerDevice::hot_carry`](LayerDevice::hot_carry) copies stored
//!    rows into a newly reserved slab, so those rows are not computed again.
//!    Both are row gathers and scatters through a scratch buffer on the compute
//!    stream, ordered after the installs the compute stream already waits for
//!    and before every batch enqueued later. The store grows to the largest hot
//!    id kept (its old rows copied over); it is never read where the protocol
//!    has not kept a row.
//!
//! Device buffers of steps 2–5 are kept and grown on demand, so the steady state
//! allocates only what the model's own ops allocate.

mod ahead;
mod slabs;
mod train;

pub(crate) use ahead::{BottomBatch, BottomCounts, PreparedTops, TopBatch, TopsAhead};
pub(crate) use slabs::HotStaging;
pub(crate) use train::HotUse;

use gpu_ops::{Backend, CacheStats};

use crate::engine::{
    dev_err, take_at_least, DeviceEngine, LossReads, ModelState, PendingCopy, PendingLosses,
    PendingParams, PinnedPool,
};
use crate::error::{Error, Result};
use crate::executor::BatchRef;

use ahead::{BottomsInFlight, PreparedBottom, PreparedTop};

/// What the layer-based pipeline (`executor/layer/`) and its monitor ask of the
/// device: the hot-row slabs and their installs (`executor/layer/device/`), the top
/// layers sampled a super-batch ahead, the batch trained with hot rows, layer
/// 0's weights for the CPU workers, and the feature cache the monitor moves
/// rows into. Object-safe: the pipeline's threads are not generic.
pub(crate) trait LayerDevice: LossReads + Send {
    /// Optimizer steps taken.
    fn version(&self) -> u64;
    /// Layer 0's output width (the width of a hot row).
    fn hot_width(&self) -> usize;
    /// A staging buffer for `rows` CPU-computed hot rows (page-locked on a GPU).
    fn new_staging(&self, rows: usize) -> Result<Box<dyn HotStaging>>;
    /// Makes hot-row slab `slab` (0 or 1) hold at least `rows` rows and orders
    /// later installs after every batch enqueued so far (`executor/layer/device/` step 2).
    fn hot_slab_reserve(&mut self, slab: usize, rows: usize) -> Result<()>;
    /// Uploads the first `n` rows of `staging` into `slab` from row `row0`,
    /// asynchronously; batches enqueued later read them (`executor/layer/device/` step 3).
    fn hot_install(
        &mut self,
        slab: usize,
        row0: usize,
        n: usize,
        staging: &mut dyn HotStaging,
    ) -> Result<()>;
    /// Copies rows `rows` of slab `slab` into the hot-row store at `vertices`
    /// (one per row), after the installs before it (`executor/layer/device/` step 5).
    fn hot_keep(&mut self, slab: usize, rows: &[u32], vertices: &[u32]) -> Result<()>;
    /// Copies the hot-row store's rows `vertices` into slab `slab` at `rows`,
    /// before every batch enqueued later (`executor/layer/device/` step 5).
    fn hot_carry(&mut self, slab: usize, rows: &[u32], vertices: &[u32]) -> Result<()>;
    /// Samples the layers above the bottom of `batches` (each drawn as a
    /// whole batch sampled with its seed would be) and starts one read of
    /// their sizes and block 0's destinations: on the sampling sibling with
    /// `device.sample_ahead`, where [`TopsAhead::wait`] (on any thread) does
    /// the read's one synchronization (`executor/layer/device/` step 1).
    fn prepare_tops(&mut self, batches: &[TopBatch<'_>]) -> Result<TopsAhead>;
    /// Keeps the batches of `tops` (from this engine's
    /// [`LayerDevice::prepare_tops`]) under their keys for
    /// [`LayerDevice::train_prepared`], handed to the compute stream.
    fn adopt_tops(&mut self, tops: PreparedTops) -> Result<()>;
    /// Samples the bottom hop of `batches` (their top layers adopted) a
    /// super-batch ahead on the sampling sibling, each skipping its planned
    /// positions, and starts one read of their sizes; the super-batch's first
    /// [`LayerDevice::train_prepared`] finishes it (a wait for the
    /// read's event, no synchronization). Nothing without `device.sample_ahead`
    /// (`executor/layer/device/` step 1b).
    fn prepare_bottoms(&mut self, batches: &[BottomBatch<'_>]) -> Result<()>;
    /// How the bottom hops of the batches trained so far were sampled
    /// (`executor/layer/device/` step 1b).
    fn bottom_counts(&self) -> BottomCounts {
        BottomCounts::default()
    }
    /// Trains the batch kept under `key` (`batch`: its seeds and seed, its
    /// target and the edges its blocks leave out) with `hot`'s slab rows
    /// replacing layer 0's outputs at its positions; then forgets it. Returns
    /// (loss × rows, correct) — or, with `deferred = Some(slot)`, nothing: the
    /// step reads nothing, its loss goes to loss slot `slot` (below
    /// [`LayerDevice::loss_lag`]) for [`LossReads::queue_loss_read`], and a
    /// non-finite loss makes the device skip this step and every later one
    /// until [`LossReads::rewind_skipped`] (the version moves on at once).
    fn train_prepared(
        &mut self,
        key: u64,
        batch: BatchRef<'_>,
        hot: &HotUse<'_>,
        deferred: Option<usize>,
    ) -> Result<Option<(f64, usize)>>;
    /// Batches between a step and the read of its loss (`device.loss_lag`
    /// resolved, at least 1).
    fn loss_lag(&self) -> usize;
    /// Forgets every kept batch.
    fn discard_prepared(&mut self);
    /// Layer 0's parameter tensors, copied to the host: one blocking download
    /// per tensor, which waits for every batch queued (the epoch's start).
    fn layer0_params(&self) -> Result<Vec<Vec<f32>>>;
    /// Layer 0's parameter tensors at the current version on their way to the
    /// host, without waiting for the device: the copies are queued on the
    /// compute stream after the steps so far and before the next, and the
    /// returned handle, resolved on any thread, waits for them
    /// (`engine/pinned.rs`). One download per tensor, no synchronization.
    fn publish_layer0(&self) -> Result<Box<dyn PendingParams>>;
    /// Evicts `evict`'s rows from the device feature cache, then caches
    /// `insert`'s (user ids): returns how many entries of `insert` are cached
    /// afterwards. The cache never exceeds its budget.
    fn update_cache(&mut self, insert: &[u32], evict: &[u32]) -> Result<usize>;
    /// Feature-cache statistics.
    fn cache_stats(&self) -> CacheStats;
    /// Bytes of one feature row as the device stores it (`device.feature_dtype`).
    fn row_bytes(&self) -> u64;
    /// How the device stores feature rows (`device.feature_dtype`); the CPU's hot
    /// rows read the same values (a bfloat16 host copy for `Bf16`).
    fn feature_dtype(&self) -> gpu_ops::FeatureDtype {
        gpu_ops::FeatureDtype::F32
    }
    /// Bytes training batches moved host → device since the start.
    fn h2d_bytes(&self) -> u64;
    /// Copies and synchronizations so far.
    fn transfer_stats(&self) -> gpu_ops::TransferStats;
}

/// The engine with the layer path's device state: what a
/// [`LayerExecutor`](super::LayerExecutor) trains on. The state is kept when
/// `policy = "auto"` hands the engine to a step-based candidate
/// ([`LayerEngine::into_parts`]), so the hot-row store the protocol counts on
/// is still there when the pipeline comes back.
pub(crate) struct LayerEngine<B: Backend> {
    /// The mechanisms (model, feature cache, sampling sibling, loss slots).
    pub(crate) engine: DeviceEngine<B>,
    /// Slabs, store, buffers and batches sampled ahead.
    hot: HotDevice<B>,
    /// Pinned sets of layer 0's asynchronous publications.
    publish: PinnedPool<B, f32>,
}

/// A [`LayerEngine`]'s own state, kept apart from its engine
/// ([`LayerEngine::into_parts`]).
pub(crate) struct LayerState<B: Backend> {
    hot: HotDevice<B>,
    publish: PinnedPool<B, f32>,
}

impl<B: Backend> Default for LayerState<B> {
    fn default() -> Self {
        Self {
            hot: HotDevice::default(),
            publish: PinnedPool::default(),
        }
    }
}

impl<B: Backend> LayerEngine<B> {
    /// `engine` with `state` (a fresh [`LayerState::default`] or one kept by
    /// [`LayerEngine::into_parts`]).
    pub fn new(engine: DeviceEngine<B>, state: LayerState<B>) -> Self {
        Self {
            engine,
            hot: state.hot,
            publish: state.publish,
        }
    }

    /// The engine and the layer path's state, apart. Batches sampled ahead
    /// are forgotten (they belong to the run that stopped).
    pub fn into_parts(mut self) -> (DeviceEngine<B>, LayerState<B>) {
        self.discard_prepared_op();
        (
            self.engine,
            LayerState {
                hot: self.hot,
                publish: self.publish,
            },
        )
    }

    /// Layer 0's parameters at the current version on their way to the host
    /// (`engine/pinned.rs`: one download per tensor into a pinned set on the
    /// compute stream, an event after them; nothing waits).
    fn publish_layer0_op(&self) -> Result<Box<dyn PendingParams>> {
        let dev = &self.engine.dev;
        let params = self.engine.layer0_tensors()?;
        let lens = params.iter().map(|p| dev.len(p)).collect();
        let tensors: Vec<&B::Buf<f32>> = params.iter().collect();
        let what = "publishing layer 0's parameters";
        let copy: PendingCopy<B, f32> = self.publish.download(dev, &tensors, lens, what)?;
        Ok(Box::new(copy))
    }

    /// Pinned sets the publication pool has allocated (tests).
    #[cfg(test)]
    pub(crate) fn publish_sets_made(&self) -> usize {
        self.publish.sets_made()
    }

    /// The host address of tensor `i` of every set in the publication pool
    /// now (tests: which set a publication takes).
    #[cfg(test)]
    pub(crate) fn publish_pool_addresses(&self, i: usize) -> Vec<usize> {
        self.publish.addresses(&self.engine.dev, i)
    }

    /// Event waits of the sampling sibling so far (tests: step 1b's reads).
    #[cfg(test)]
    pub(crate) fn sampling_event_waits(&self) -> u64 {
        self.engine.sibling.transfer_stats().event_waits
    }

    /// Slab `slab`'s rows, copied to the host (tests).
    #[cfg(test)]
    pub(crate) fn hot_slab_to_host(&self, slab: usize) -> Result<Vec<f32>> {
        let buf = self.hot.slabs[slab]
            .as_ref()
            .ok_or_else(|| internal("hot slab"))?;
        let n = self.hot.slab_rows[slab] * self.hot_width_op();
        self.engine.dev.to_host(buf, n).map_err(dev_err("hot slab"))
    }

    /// Device bytes the hot-row buffers hold now: (both slabs with their
    /// bfloat16 mirrors, the store, the keep/carry scratch and index
    /// buffers), from the buffers' lengths (tests of `engine/memory.rs`
    /// step 8).
    #[cfg(test)]
    pub(crate) fn hot_alloc_bytes(&self) -> (u64, u64, u64) {
        fn bytes<B: Backend, T: gpu_ops::Elem>(dev: &B, b: &Option<B::Buf<T>>) -> u64 {
            b.as_ref()
                .map_or(0, |b| (dev.len(b) * std::mem::size_of::<T>()) as u64)
        }
        let d = &*self.engine.dev;
        let h = &self.hot;
        let slabs = (0..2)
            .map(|i| bytes(d, &h.slabs[i]) + bytes(d, &h.narrow[i]))
            .sum();
        let scratch = bytes(d, &h.copy_rows) + bytes(d, &h.copy_from) + bytes(d, &h.copy_to);
        (slabs, bytes(d, &h.store), scratch)
    }
}

impl<B: Backend> LossReads for LayerEngine<B> {
    fn queue_loss_read(&mut self, n: usize) -> Result<Box<dyn PendingLosses>> {
        self.engine.queue_loss_read(n)
    }

    fn rewind_skipped(&mut self, skipped: usize) -> Result<()> {
        self.engine.rewind_skipped(skipped)
    }
}

impl<B: Backend> LayerDevice for LayerEngine<B> {
    fn version(&self) -> u64 {
        self.engine.model.version()
    }

    fn hot_width(&self) -> usize {
        self.hot_width_op()
    }

    fn new_staging(&self, rows: usize) -> Result<Box<dyn HotStaging>> {
        self.new_staging_op(rows)
    }

    fn hot_slab_reserve(&mut self, slab: usize, rows: usize) -> Result<()> {
        self.hot_slab_reserve_op(slab, rows)
    }

    fn hot_install(
        &mut self,
        slab: usize,
        row0: usize,
        n: usize,
        staging: &mut dyn HotStaging,
    ) -> Result<()> {
        self.hot_install_op(slab, row0, n, staging)
    }

    fn hot_keep(&mut self, slab: usize, rows: &[u32], vertices: &[u32]) -> Result<()> {
        self.hot_store_copy_op(slab, rows, vertices, true)
    }

    fn hot_carry(&mut self, slab: usize, rows: &[u32], vertices: &[u32]) -> Result<()> {
        self.hot_store_copy_op(slab, rows, vertices, false)
    }

    fn prepare_tops(&mut self, batches: &[TopBatch<'_>]) -> Result<TopsAhead> {
        self.prepare_tops_op(batches)
    }

    fn adopt_tops(&mut self, tops: PreparedTops) -> Result<()> {
        self.adopt_tops_op(tops)
    }

    fn prepare_bottoms(&mut self, batches: &[BottomBatch<'_>]) -> Result<()> {
        self.prepare_bottoms_op(batches)
    }

    fn bottom_counts(&self) -> BottomCounts {
        self.bottom_counts_op()
    }

    fn train_prepared(
        &mut self,
        key: u64,
        batch: BatchRef<'_>,
        hot: &HotUse<'_>,
        deferred: Option<usize>,
    ) -> Result<Option<(f64, usize)>> {
        self.train_prepared_op(key, batch, hot, deferred)
    }

    fn loss_lag(&self) -> usize {
        self.engine.loss_lag()
    }

    fn discard_prepared(&mut self) {
        self.discard_prepared_op();
    }

    fn layer0_params(&self) -> Result<Vec<Vec<f32>>> {
        let dev = &self.engine.dev;
        self.engine
            .layer0_tensors()?
            .iter()
            .map(|p| dev.to_host(p, dev.len(p)))
            .collect::<std::result::Result<_, _>>()
            .map_err(dev_err("publishing layer 0's parameters"))
    }

    fn publish_layer0(&self) -> Result<Box<dyn PendingParams>> {
        self.publish_layer0_op()
    }

    fn update_cache(&mut self, insert: &[u32], evict: &[u32]) -> Result<usize> {
        self.engine.update_cache(insert, evict)
    }

    fn cache_stats(&self) -> CacheStats {
        ModelState::cache_stats(&self.engine)
    }

    fn row_bytes(&self) -> u64 {
        (self.engine.dataset().features.dim() * self.engine.opts.feature_dtype.value_bytes()) as u64
    }

    fn feature_dtype(&self) -> gpu_ops::FeatureDtype {
        self.engine.opts.feature_dtype
    }

    fn h2d_bytes(&self) -> u64 {
        self.engine.h2d
    }

    fn transfer_stats(&self) -> gpu_ops::TransferStats {
        self.engine.transfer_stats_all()
    }
}

/// The layer path's device state (steps 1–5).
pub(crate) struct HotDevice<B: Backend> {
    slabs: [Option<B::Buf<f32>>; 2],
    slab_rows: [usize; 2],
    copy: Option<B::Stream>,
    positions: Option<B::Buf<u32>>,
    rows_idx: Option<B::Buf<u32>>,
    mask: Option<B::Buf<u8>>,
    rows: Option<B::Buf<f32>>,
    labels: Option<B::Buf<u32>>,
    prepared: std::collections::HashMap<u64, PreparedTop<B>>,
    /// Step 5: the store, its rows, and the gather/scatter scratch.
    store: Option<B::Buf<f32>>,
    store_rows: usize,
    copy_from: Option<B::Buf<u32>>,
    copy_to: Option<B::Buf<u32>>,
    copy_rows: Option<B::Buf<f32>>,
    /// Step 3 with bfloat16 rows: each slab's bfloat16 mirror.
    narrow: [Option<B::Buf<u16>>; 2],
    /// Step 1b: bottom hops whose read is in flight (a super-batch each).
    bottoms_in_flight: Vec<BottomsInFlight<B>>,
    /// Step 1b: bottom hops read, under their batches' keys.
    bottoms: std::collections::HashMap<u64, PreparedBottom<B>>,
    /// Step 1b's counts.
    bottom_counts: BottomCounts,
    /// Link prediction: the table of the pairs each adopted batch leaves out
    /// of its blocks, uploaded once on the sampler's stream (its top layers
    /// left them at adoption; its bottom hop leaves them when it is read),
    /// under its key until it trains.
    excludes: std::collections::HashMap<u64, gpu_ops::ExcludedPairs<B>>,
}

impl<B: Backend> Default for HotDevice<B> {
    fn default() -> Self {
        Self {
            slabs: [None, None],
            slab_rows: [0, 0],
            copy: None,
            positions: None,
            rows_idx: None,
            mask: None,
            rows: None,
            labels: None,
            prepared: std::collections::HashMap::new(),
            store: None,
            store_rows: 0,
            copy_from: None,
            copy_to: None,
            copy_rows: None,
            narrow: [None, None],
            bottoms_in_flight: Vec::new(),
            bottoms: std::collections::HashMap::new(),
            bottom_counts: BottomCounts::default(),
            excludes: std::collections::HashMap::new(),
        }
    }
}

/// `buf` with room for `n` elements, left in place ([`take_at_least`], not
/// zeroed: every caller overwrites the prefix it reads, an upload or a row
/// selection, and the host backend's poison would show one that did not).
fn reserve<B: Backend, T: gpu_ops::Elem>(
    dev: &B,
    buf: &mut Option<B::Buf<T>>,
    n: usize,
    what: &'static str,
) -> Result<()> {
    *buf = Some(take_at_least(dev, buf, n, what)?);
    Ok(())
}

/// Uploads `src` into the reused buffer `buf` (grown when needed).
fn upload_into<B: Backend, T: gpu_ops::Elem>(
    dev: &B,
    buf: &mut Option<B::Buf<T>>,
    src: &[T],
    what: &'static str,
) -> Result<()> {
    reserve(dev, buf, src.len().max(1), what)?;
    let b = buf.as_mut().ok_or_else(|| internal(what))?;
    dev.upload(dev.stream(), src, b).map_err(dev_err(what))
}

fn internal(what: &str) -> Error {
    Error::invalid_argument("orchestration", format!("internal: {what} missing"))
}

#[cfg(test)]
#[path = "publish_tests.rs"]
mod publish_tests;
#[cfg(test)]
mod tests;
