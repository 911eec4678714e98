//! The accelerator's side of layer-based orchestration (docs/orchestration.md
//! §11): the device hot-row slabs, their uploads, and a batch trained with hot
//! rows read from a slab.
//!
//! # Protocol
//! 1. **Sample the top a super-batch ahead**
//!    ([`LayerDevice::prepare_tops`](super::LayerDevice::prepare_tops), once
//!    per super-batch): the layers above the bottom of every batch are queued
//!    ([`Sampling::sample_queued_from`](gpu_ops::Sampling::sample_queued_from)
//!    from layer 1: layer `l` drawn with `derive_seed(seed, l)`, exactly as
//!    [`Sampling::sample`](gpu_ops::Sampling::sample) draws it, so the blocks
//!    are those a hop-by-hop [`Sampling::sample_hop`](gpu_ops::Sampling::sample_hop)
//!    makes), then one read of all their layer sizes and bottom destinations
//!    (block 1's sources) is started
//!    ([`Sampling::read_queued`](gpu_ops::Sampling::read_queued): into
//!    page-locked memory on CUDA). With `device.sample_ahead` this runs on the
//!    sampling sibling (its own stream, `engine/step_based.rs`), never on the
//!    compute stream, and the read's one synchronization is left to whoever
//!    calls [`TopsAhead::wait`] — the planner thread, which plans the CPU's
//!    queue from those ids; without it the engine's backend samples and reads
//!    at once (one synchronization of the compute stream per super-batch).
//!    [`LayerDevice::adopt_tops`](super::LayerDevice::adopt_tops) then keeps the
//!    blocks under their batches' keys, handed to the compute stream with
//!    [`Sampling::adopt_batch`](gpu_ops::Sampling::adopt_batch) (it waits for
//!    the sibling's work, and their memory is reused only after the compute
//!    stream's). Before: two `sample_hop`s and a download per batch, three
//!    synchronizations of the compute stream while the super-batch before
//!    trained on it.
//!
//!    **1b. The bottom hop, a super-batch ahead too**
//!    ([`LayerDevice::prepare_bottoms`](super::LayerDevice::prepare_bottoms),
//!    at the super-batch's launch, right after its plan is handled and its
//!    top layers adopted; only with `device.sample_ahead`): every batch's
//!    bottom hop is queued on the sampling sibling behind its top layers
//!    ([`Sampling::sample_hop_queued`](gpu_ops::Sampling::sample_hop_queued)
//!    from block 1's sources, `derive_seed(seed, 0)`), skipping the batch's
//!    *planned* hot positions (`hot_backward = "constant"`; none with
//!    `"aggregate"`) — its skip mask uploaded on the sibling's stream — and
//!    one read of their sizes (no ids) is started. The super-batch's first
//!    [`LayerDevice::train_prepared`](super::LayerDevice::train_prepared)
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
//!    go into the other. [`LayerDevice::hot_slab_reserve`](super::LayerDevice::hot_slab_reserve) (called when the queue of
//!    `j + 1` is planned, after every batch of `j − 1` was enqueued) grows the slab
//!    if needed and makes the copy stream wait for the compute stream's work so
//!    far, so no upload overwrites rows a queued batch of `j − 1` still reads.
//! 3. **Install** ([`LayerDevice::hot_install`](super::LayerDevice::hot_install)): a finished CPU chunk's rows go from
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
//! 4. **Train** ([`LayerDevice::train_prepared`](super::LayerDevice::train_prepared)) with a [`HotUse`]: upload the
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
//!    `executor/layer/losses.rs`). With `"aggregate"`
//!    nothing is skipped (the hot rows' gradient flows through the accelerator's
//!    own aggregate of their neighborhoods).
//!
//! 5. **The hot-row store** (reuse across super-batches, `scheduler::protocol`
//!    steps 3–4): one device buffer of rows indexed by relabeled hot id.
//!    [`LayerDevice::hot_keep`](super::LayerDevice::hot_keep) copies freshly
//!    installed slab rows into it and
//!    [`LayerDevice::hot_carry`](super::LayerDevice::hot_carry) copies stored
//!    rows into a newly reserved slab, so those rows are not computed again.
//!    Both are row gathers and scatters through a scratch buffer on the compute
//!    stream, ordered after the installs the compute stream already waits for
//!    and before every batch enqueued later. The store grows to the largest hot
//!    id kept (its old rows copied over); it is never read where the protocol
//!    has not kept a row.
//!
//! Device buffers of steps 2–5 are kept and grown on demand, so the steady state
//! allocates only what the model's own ops allocate.

use std::any::Any;
use std::sync::Arc;

use cpu_ops::derive_seed;
use gpu_ops::{Backend, DeferredStep, HotGrad, HotRows};

use super::{dev_err, take_at_least, DeviceEngine};
use crate::error::{Error, Result};
use crate::trace::Direction;

/// Host memory for CPU-computed hot rows that [`LayerDevice::hot_install`](super::LayerDevice::hot_install)
/// uploads: page-locked on CUDA (so the upload is asynchronous), plain memory on
/// the host backend.
pub trait HotStaging: Send {
    /// Rows it holds (each [`LayerDevice::hot_width`](super::LayerDevice::hot_width) values).
    fn capacity_rows(&self) -> usize;
    /// The host view, `capacity_rows × width` values. Waits until no upload still
    /// reads the buffer.
    fn rows_mut(&mut self) -> &mut [f32];
    /// Makes the first `rows` rows written through [`rows_mut`](Self::rows_mut)
    /// ready to upload: a staging buffer of bfloat16 feature rows narrows them
    /// (round to nearest even) into its page-locked bfloat16 half, waiting
    /// until no upload still reads it; an fp32 one has nothing to do. Call it
    /// after writing, before [`LayerDevice::hot_install`](super::LayerDevice::hot_install).
    fn seal(&mut self, rows: usize);
    /// The concrete type, for the engine that made it.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// What a [`Staging`] uploads.
enum StagingRows<B: Backend> {
    /// fp32 rows, written and uploaded in place.
    F32(B::Pinned<f32>),
    /// bfloat16 rows: written as fp32 into `wide`, narrowed into `narrow` by
    /// [`HotStaging::seal`] (`sealed` rows), uploaded from there.
    Bf16 {
        wide: Vec<f32>,
        narrow: B::Pinned<u16>,
        sealed: usize,
    },
}

/// A [`HotStaging`] of a [`DeviceEngine`] on backend `B`.
pub(crate) struct Staging<B: Backend> {
    dev: Arc<B>,
    buf: StagingRows<B>,
    rows: usize,
    width: usize,
}

impl<B: Backend> HotStaging for Staging<B> {
    fn capacity_rows(&self) -> usize {
        self.rows
    }

    fn rows_mut(&mut self) -> &mut [f32] {
        match &mut self.buf {
            StagingRows::F32(buf) => self.dev.pinned_slice_mut(buf),
            StagingRows::Bf16 { wide, sealed, .. } => {
                *sealed = 0;
                wide
            }
        }
    }

    fn seal(&mut self, rows: usize) {
        if let StagingRows::Bf16 {
            wide,
            narrow,
            sealed,
        } = &mut self.buf
        {
            let n = (rows.min(self.rows)) * self.width;
            let dst = self.dev.pinned_slice_mut(narrow);
            for (d, &x) in dst[..n].iter_mut().zip(&wide[..n]) {
                *d = gpu_ops::f32_to_bf16_bits(x);
            }
            *sealed = rows.min(self.rows);
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Which hot rows a batch uses (step 4): `positions[i]` (a position among block
/// 0's destinations) takes row `rows[i]` of slab `slab`.
#[derive(Clone, Copy, Debug)]
pub struct HotUse<'a> {
    /// The slab (`super-batch % 2`).
    pub slab: usize,
    /// Distinct positions among block 0's destinations.
    pub positions: &'a [u32],
    /// Slab row of each position.
    pub rows: &'a [u32],
    /// How layer 0's backward treats the hot rows.
    pub grad: HotGrad,
}

/// A batch whose top layers were sampled ahead (step 1).
pub(crate) struct PreparedTop<B: Backend> {
    /// Blocks `1..L` (bottom first).
    blocks: Vec<B::Block>,
    /// Sources of blocks `1..L`; `src[0]` are block 0's destinations.
    src: Vec<B::Buf<u32>>,
    /// Number of block 0's destinations.
    num_bottom: usize,
}

/// A batch's bottom hop sampled ahead (step 1b), read and handed to the
/// compute stream.
pub(crate) struct PreparedBottom<B: Backend> {
    /// Block 0.
    block: B::Block,
    /// Its sources (the rows to gather).
    src: B::Buf<u32>,
    /// Their count.
    n_src: usize,
    /// The positions its mask skipped, ascending (none: no mask).
    skip: Vec<u32>,
}

/// A super-batch's bottom hops queued on the sampling sibling (step 1b),
/// their one read in flight.
pub(crate) struct BottomsInFlight<B: Backend> {
    /// Each batch's key and the positions its mask skips (ascending).
    batches: Vec<(u64, Vec<u32>)>,
    /// The masks the hops read (kept until the read is finished).
    masks: Vec<B::Buf<u8>>,
    /// The sizes' read.
    reading: B::Reading,
}

/// One batch whose bottom hop
/// [`LayerDevice::prepare_bottoms`](super::LayerDevice::prepare_bottoms)
/// samples ahead.
#[derive(Clone, Copy, Debug)]
pub struct BottomBatch<'a> {
    /// Its key (its top layers are kept under it).
    pub key: u64,
    /// Its sampling seed.
    pub seed: u64,
    /// The positions among its bottom destinations to skip: its planned hot
    /// positions with `hot_backward = "constant"`, none with `"aggregate"`.
    pub skip: &'a [u32],
}

/// How the bottom hops of trained batches were sampled (step 1b).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BottomCounts {
    /// Trained from a bottom hop sampled ahead.
    pub ahead: u64,
    /// Sampled again at train time: the hop sampled ahead skipped other
    /// positions than the batch trains with (late chunks left cold under
    /// `on_late = "compute"`).
    pub resampled: u64,
}

/// What a failed read of the top layers is called.
const READ_TOPS: &str = "reading the top layers' sizes and bottom destinations";

/// What a failed read of the bottom hops is called.
const READ_BOTTOMS: &str = "reading the bottom hops' sizes";

/// One batch whose top layers
/// [`LayerDevice::prepare_tops`](super::LayerDevice::prepare_tops) samples.
#[derive(Clone, Copy, Debug)]
pub struct TopBatch<'a> {
    /// The key [`LayerDevice::train_prepared`](super::LayerDevice::train_prepared)
    /// finds it by.
    pub key: u64,
    /// Its seeds.
    pub seeds: &'a [u32],
    /// Its sampling seed.
    pub seed: u64,
}

/// The top layers of a super-batch's batches, sampled (step 1), with their
/// bottom destinations on their way to the host: [`TopsAhead::wait`] reads
/// them, on any thread.
pub struct TopsAhead(Ahead);

/// Where a [`TopsAhead`] stands.
enum Ahead {
    /// Read already (sampled on the engine's backend).
    Read(TopsRead),
    /// In flight on the sampling sibling: the closure waits for the read.
    Later(Box<dyn FnOnce() -> Result<TopsRead> + Send>),
}

impl TopsAhead {
    /// Waits for the read (one synchronization of the sampling stream for the
    /// whole super-batch) and returns the batches' bottom destinations.
    pub fn wait(self) -> Result<TopsRead> {
        match self.0 {
            Ahead::Read(r) => Ok(r),
            Ahead::Later(f) => f(),
        }
    }
}

impl std::fmt::Debug for TopsAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Ahead::Read(_) => "TopsAhead(read)",
            Ahead::Later(_) => "TopsAhead(in flight)",
        })
    }
}

/// A super-batch's top layers, read ([`TopsAhead::wait`]).
#[derive(Debug)]
pub struct TopsRead {
    /// Per batch, in order: block 0's destinations (global ids), in position
    /// order.
    pub bottoms: Vec<Vec<u32>>,
    /// The blocks, for
    /// [`LayerDevice::adopt_tops`](super::LayerDevice::adopt_tops).
    pub tops: PreparedTops,
}

/// Sampled top layers of an engine, not yet handed to it
/// ([`LayerDevice::adopt_tops`](super::LayerDevice::adopt_tops)).
pub struct PreparedTops(Box<dyn Any + Send>);

impl std::fmt::Debug for PreparedTops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PreparedTops")
    }
}

/// What a [`PreparedTops`] holds for an engine on backend `B`.
struct Tops<B: Backend> {
    /// Each batch's key and its top blocks.
    batches: Vec<(u64, gpu_ops::DeviceBatch<B>)>,
    /// Whether the sampling sibling sampled them.
    on_sibling: bool,
}

/// The engine's device state for hot rows (steps 2–4).
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

impl<B: Backend> DeviceEngine<B> {
    /// Layer 0's output width.
    pub(super) fn hot_width_op(&self) -> usize {
        self.model.layer_out_dim(0).unwrap_or(0)
    }

    /// Whether hot rows are staged and uploaded as bfloat16 (step 3): with
    /// bfloat16 feature rows.
    pub(super) fn hot_bf16(&self) -> bool {
        matches!(self.opts.feature_dtype, gpu_ops::FeatureDtype::Bf16)
    }

    pub(super) fn new_staging_op(&self, rows: usize) -> Result<Box<dyn HotStaging>> {
        let n = rows
            .checked_mul(self.hot_width_op())
            .ok_or_else(|| Error::invalid_argument("hot staging", "size overflows"))?;
        let what = "hot-row staging (pinned host memory)";
        let buf = if self.hot_bf16() {
            StagingRows::Bf16 {
                wide: vec![0.0; n],
                narrow: self.dev.alloc_pinned::<u16>(n).map_err(dev_err(what))?,
                sealed: 0,
            }
        } else {
            StagingRows::F32(self.dev.alloc_pinned::<f32>(n).map_err(dev_err(what))?)
        };
        Ok(Box::new(Staging {
            dev: Arc::clone(&self.dev),
            buf,
            rows,
            width: self.hot_width_op(),
        }))
    }

    /// Step 2.
    pub(super) fn hot_slab_reserve_op(&mut self, slab: usize, rows: usize) -> Result<()> {
        if slab > 1 {
            return Err(Error::invalid_argument(
                "hot slab",
                format!("internal: slab {slab} (there are 2)"),
            ));
        }
        let width = self.hot_width_op();
        let dev = Arc::clone(&self.dev);
        if self.hot.copy.is_none() {
            self.hot.copy = Some(dev.new_stream().map_err(dev_err("copy stream"))?);
        }
        if self.hot.slab_rows[slab] < rows {
            let cap = rows + rows / 4;
            // Not zeroed: a batch reads only rows of chunks installed into
            // the slab (`scheduler::protocol` steps 4–7, driven by
            // `executor/layer/pipeline.rs`).
            self.hot.slabs[slab] = Some(
                dev.alloc_uninit(cap.max(1) * width)
                    .map_err(dev_err("hot-row slab"))?,
            );
            self.hot.slab_rows[slab] = cap;
            if self.hot_bf16() {
                self.hot.narrow[slab] = Some(
                    dev.alloc_uninit(cap.max(1) * width)
                        .map_err(dev_err("hot-row slab (bfloat16 mirror)"))?,
                );
            }
        }
        // Later uploads wait for every batch enqueued so far (which may still read
        // this slab's previous rows).
        let ev = dev
            .record_event(dev.stream())
            .map_err(dev_err("hot slab event"))?;
        let copy = self
            .hot
            .copy
            .as_ref()
            .ok_or_else(|| internal("copy stream"))?;
        dev.wait_event(copy, &ev)
            .map_err(dev_err("hot slab event"))?;
        Ok(())
    }

    /// Step 3.
    pub(super) fn hot_install_op(
        &mut self,
        slab: usize,
        row0: usize,
        n: usize,
        staging: &mut dyn HotStaging,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let width = self.hot_width_op();
        let st = staging
            .as_any_mut()
            .downcast_mut::<Staging<B>>()
            .ok_or_else(|| internal("a staging buffer of this engine"))?;
        if n > st.rows {
            return Err(Error::invalid_argument(
                "hot install",
                format!("internal: {n} rows from a staging buffer of {}", st.rows),
            ));
        }
        if slab > 1 || row0 + n > self.hot.slab_rows[slab] {
            return Err(Error::invalid_argument(
                "hot install",
                format!(
                    "internal: rows {row0}..{} of slab {slab} ({} rows reserved)",
                    row0 + n,
                    self.hot.slab_rows.get(slab).copied().unwrap_or(0)
                ),
            ));
        }
        let dev = Arc::clone(&self.dev);
        let copy = self
            .hot
            .copy
            .as_ref()
            .ok_or_else(|| internal("copy stream"))?;
        let dst = self.hot.slabs[slab]
            .as_mut()
            .ok_or_else(|| internal("hot slab"))?;
        let bytes = match &st.buf {
            StagingRows::F32(buf) => {
                dev.upload_pinned_at(copy, buf, n * width, dst, row0 * width)
                    .map_err(dev_err("uploading hot rows"))?;
                4
            }
            StagingRows::Bf16 { narrow, sealed, .. } => {
                if n > *sealed {
                    return Err(Error::invalid_argument(
                        "hot install",
                        format!("internal: {n} rows of a staging buffer with {sealed} sealed"),
                    ));
                }
                let mirror = self.hot.narrow[slab]
                    .as_mut()
                    .ok_or_else(|| internal("hot slab (bfloat16 mirror)"))?;
                dev.upload_pinned_at(copy, narrow, n * width, mirror, row0 * width)
                    .map_err(dev_err("uploading hot rows"))?;
                2
            }
        };
        let ev = dev
            .record_event(copy)
            .map_err(dev_err("hot install event"))?;
        dev.wait_event(dev.stream(), &ev)
            .map_err(dev_err("hot install event"))?;
        if let (StagingRows::Bf16 { .. }, Some(mirror)) = (&st.buf, self.hot.narrow[slab].as_ref())
        {
            let dst = self.hot.slabs[slab]
                .as_mut()
                .ok_or_else(|| internal("hot slab"))?;
            dev.widen_bf16_at(mirror, row0 * width, n * width, dst, row0 * width)
                .map_err(dev_err("widening hot rows"))?;
        }
        self.h2d += (n * width * bytes) as u64;
        Ok(())
    }

    /// Step 5: `store[vertices[i]] = slab[rows[i]]` (`keep`) or
    /// `slab[rows[i]] = store[vertices[i]]` (carry).
    pub(super) fn hot_store_copy_op(
        &mut self,
        slab: usize,
        rows: &[u32],
        vertices: &[u32],
        keep: bool,
    ) -> Result<()> {
        let what = if keep { "hot keep" } else { "hot carry" };
        let n = rows.len();
        if vertices.len() != n {
            return Err(Error::invalid_argument(
                what,
                format!("internal: {n} slab rows but {} store rows", vertices.len()),
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let slab_rows = self.hot.slab_rows.get(slab).copied().unwrap_or(0);
        if let Some(&r) = rows.iter().find(|&&r| r as usize >= slab_rows) {
            return Err(Error::invalid_argument(
                what,
                format!("internal: row {r} of slab {slab} ({slab_rows} rows reserved)"),
            ));
        }
        let need = vertices.iter().max().map_or(0, |&v| v as usize + 1);
        if !keep && need > self.hot.store_rows {
            return Err(Error::invalid_argument(
                what,
                format!(
                    "internal: store row {} past the {} kept",
                    need - 1,
                    self.hot.store_rows
                ),
            ));
        }
        let width = self.hot_width_op();
        let dev = Arc::clone(&self.dev);
        if need > self.hot.store_rows {
            // Grow, keeping the rows stored so far.
            let cap = need + need / 4;
            let mut grown = dev
                .alloc_uninit::<f32>(cap * width)
                .map_err(dev_err("hot-row store"))?;
            if let Some(old) = self.hot.store.as_ref() {
                let old_rows = self.hot.store_rows;
                let ids: Vec<u32> = (0..old_rows as u32).collect();
                upload_into(&*dev, &mut self.hot.copy_from, &ids, "hot store rows")?;
                let idx = self
                    .hot
                    .copy_from
                    .as_ref()
                    .ok_or_else(|| internal("rows"))?;
                dev.index_select_rows(old, width, idx, old_rows, &mut grown)
                    .map_err(dev_err("growing the hot-row store"))?;
            }
            self.hot.store = Some(grown);
            self.hot.store_rows = cap;
        }
        let (from, to) = if keep {
            (rows, vertices)
        } else {
            (vertices, rows)
        };
        upload_into(&*dev, &mut self.hot.copy_from, from, "hot copy rows")?;
        upload_into(&*dev, &mut self.hot.copy_to, to, "hot copy rows")?;
        self.h2d += (n * 8) as u64;
        reserve(
            &*dev,
            &mut self.hot.copy_rows,
            n * width,
            "hot copy scratch",
        )?;
        let from_idx = self
            .hot
            .copy_from
            .as_ref()
            .ok_or_else(|| internal("rows"))?;
        let to_idx = self.hot.copy_to.as_ref().ok_or_else(|| internal("rows"))?;
        let scratch = self
            .hot
            .copy_rows
            .as_mut()
            .ok_or_else(|| internal("scratch"))?;
        let slab_buf = self.hot.slabs[slab]
            .as_mut()
            .ok_or_else(|| internal("hot slab"))?;
        let store = self.hot.store.as_mut().ok_or_else(|| internal("store"))?;
        if keep {
            dev.index_select_rows(slab_buf, width, from_idx, n, scratch)
                .map_err(dev_err(what))?;
            dev.index_put_rows(scratch, width, to_idx, n, store)
                .map_err(dev_err(what))?;
        } else {
            dev.index_select_rows(store, width, from_idx, n, scratch)
                .map_err(dev_err(what))?;
            dev.index_put_rows(scratch, width, to_idx, n, slab_buf)
                .map_err(dev_err(what))?;
        }
        Ok(())
    }

    /// Event waits of the sampling sibling so far (tests: step 1b's reads).
    #[cfg(test)]
    pub(crate) fn sampling_event_waits(&self) -> u64 {
        self.sibling.transfer_stats().event_waits
    }

    /// Slab `slab`'s rows, copied to the host (tests).
    #[cfg(test)]
    pub(crate) fn hot_slab_to_host(&self, slab: usize) -> Result<Vec<f32>> {
        let buf = self.hot.slabs[slab]
            .as_ref()
            .ok_or_else(|| internal("hot slab"))?;
        let n = self.hot.slab_rows[slab] * self.hot_width_op();
        self.dev.to_host(buf, n).map_err(dev_err("hot slab"))
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
        let d = &*self.dev;
        let h = &self.hot;
        let slabs = (0..2)
            .map(|i| bytes(d, &h.slabs[i]) + bytes(d, &h.narrow[i]))
            .sum();
        let scratch = bytes(d, &h.copy_rows) + bytes(d, &h.copy_from) + bytes(d, &h.copy_to);
        (slabs, bytes(d, &h.store), scratch)
    }

    /// Step 1: queues the top layers of `batches` and starts the read of their
    /// sizes and bottom sources (on the sampling sibling when sampling ahead,
    /// where the read is finished by whoever waits; else on the engine's
    /// backend, finished here).
    pub(super) fn prepare_tops_op(&mut self, batches: &[TopBatch<'_>]) -> Result<TopsAhead> {
        let fanouts = self.opts.fanouts.clone();
        if fanouts.len() < 2 {
            return Err(Error::invalid_argument(
                "orchestration.hot_ratio",
                "embedding reuse needs at least two layers",
            ));
        }
        self.open_sibling()?;
        let tracer = self.tracer.clone();
        let _s = tracer.slice_on(self.acc, "sample top");
        let on_sibling = self.sibling.sampler().is_some();
        let sampler = self
            .sibling
            .sampler()
            .map_or_else(|| Arc::clone(&self.dev), Arc::clone);
        let mut queued = Vec::with_capacity(batches.len());
        for b in batches {
            queued.push(
                sampler
                    .sample_queued_from(&self.graph, b.seeds, &fanouts, 1, b.seed)
                    .map_err(dev_err("sampling the top layers"))?,
            );
            self.h2d += (b.seeds.len() * 4) as u64;
        }
        let reading = sampler.read_queued(queued).map_err(dev_err(READ_TOPS))?;
        let keys: Vec<u64> = batches.iter().map(|b| b.key).collect();
        let finish = move || -> Result<TopsRead> {
            let read = sampler.finish_read(reading).map_err(dev_err(READ_TOPS))?;
            if read.len() != keys.len() {
                return Err(internal(&format!(
                    "{} batches read for {} queued",
                    read.len(),
                    keys.len()
                )));
            }
            let mut bottoms = Vec::with_capacity(read.len());
            let mut kept = Vec::with_capacity(read.len());
            for (key, (batch, ids)) in keys.into_iter().zip(read) {
                bottoms.push(ids);
                kept.push((key, batch));
            }
            Ok(TopsRead {
                bottoms,
                tops: PreparedTops(Box::new(Tops::<B> {
                    batches: kept,
                    on_sibling,
                })),
            })
        };
        if on_sibling {
            Ok(TopsAhead(Ahead::Later(Box::new(finish))))
        } else {
            finish().map(|r| TopsAhead(Ahead::Read(r)))
        }
    }

    /// Step 1's end: keeps the batches of `tops` for
    /// [`LayerDevice::train_prepared`](super::LayerDevice::train_prepared), handed to
    /// the compute stream when the sibling sampled them.
    pub(super) fn adopt_tops_op(&mut self, tops: PreparedTops) -> Result<()> {
        let tops = tops
            .0
            .downcast::<Tops<B>>()
            .map_err(|_| internal("top layers sampled by this engine"))?;
        let Tops {
            batches,
            on_sibling,
        } = *tops;
        for (key, mut batch) in batches {
            if on_sibling {
                let from = self
                    .sibling
                    .sampler()
                    .ok_or_else(|| internal("the sampling sibling"))?;
                self.dev
                    .adopt_batch(from, &mut batch)
                    .map_err(dev_err("handing the top layers to the compute stream"))?;
            }
            let num_bottom = batch
                .blocks
                .first()
                .map(|b| self.dev.block_shape(b).0)
                .ok_or_else(|| internal("a top layer"))?;
            self.hot.prepared.insert(
                key,
                PreparedTop {
                    blocks: batch.blocks,
                    src: batch.src_ids,
                    num_bottom,
                },
            );
        }
        Ok(())
    }

    pub(super) fn discard_prepared_op(&mut self) {
        self.hot.prepared.clear();
        self.hot.bottoms.clear();
        // A reading dropped unfinished waits for its copies first.
        self.hot.bottoms_in_flight.clear();
    }

    /// Step 1b's counts so far.
    pub(super) fn bottom_counts_op(&self) -> BottomCounts {
        self.hot.bottom_counts
    }

    /// Step 1b: queues the bottom hop of every batch of `batches` (their top
    /// layers adopted already) on the sampling sibling, each with its skip
    /// mask uploaded on the sibling's stream, and starts one read of their
    /// sizes (no ids). Nothing synchronizes. Without the sibling
    /// (`device.sample_ahead` off) nothing happens: the batches sample their
    /// bottom hop when they train.
    pub(super) fn prepare_bottoms_op(&mut self, batches: &[BottomBatch<'_>]) -> Result<()> {
        let Some(sampler) = self.sibling.sampler().map(Arc::clone) else {
            return Ok(());
        };
        if batches.is_empty() {
            return Ok(());
        }
        let tracer = self.tracer.clone();
        let _s = tracer.slice_on(self.acc, "sample bottom ahead");
        let fanout = self.opts.fanouts[0];
        let what = "sampling the bottom hop ahead";
        let mut queued = Vec::with_capacity(batches.len());
        let mut masks = Vec::new();
        let mut kept = Vec::with_capacity(batches.len());
        for b in batches {
            let top = self.hot.prepared.get(&b.key).ok_or_else(|| {
                Error::invalid_argument(
                    "prepared batch",
                    format!("internal: no top layers were adopted under key {}", b.key),
                )
            })?;
            let nd = top.num_bottom;
            let mut skip = b.skip.to_vec();
            skip.sort_unstable();
            skip.dedup();
            if let Some(&p) = skip.iter().find(|&&p| p as usize >= nd) {
                return Err(Error::invalid_argument(
                    "hot rows",
                    format!("internal: planned position {p} past the {nd} bottom destinations"),
                ));
            }
            let mask = if skip.is_empty() {
                None
            } else {
                let mut flags = vec![0u8; nd];
                for &p in &skip {
                    flags[p as usize] = 1;
                }
                let mut buf = sampler
                    .alloc_uninit::<u8>(nd)
                    .map_err(dev_err("hot skip mask"))?;
                sampler
                    .upload(sampler.stream(), &flags, &mut buf)
                    .map_err(dev_err("hot skip mask"))?;
                self.h2d += nd as u64;
                Some(buf)
            };
            let dst = top.src.first().ok_or_else(|| internal("bottom ids"))?;
            queued.push(
                sampler
                    .sample_hop_queued(
                        &self.graph,
                        dst,
                        nd,
                        fanout,
                        derive_seed(b.seed, 0),
                        mask.as_ref(),
                    )
                    .map_err(dev_err(what))?,
            );
            masks.extend(mask);
            kept.push((b.key, skip));
        }
        let reading = sampler.read_queued(queued).map_err(dev_err(READ_BOTTOMS))?;
        self.hot.bottoms_in_flight.push(BottomsInFlight {
            batches: kept,
            masks,
            reading,
        });
        Ok(())
    }

    /// Step 1b's end for the batch kept under `key`: its bottom hop sampled
    /// ahead, if any. The first batch of a super-batch finishes the read of
    /// all its hops (a wait for the read's event, queued a super-batch ago;
    /// no synchronization) and hands them to the compute stream.
    fn take_bottom(&mut self, key: u64) -> Result<Option<PreparedBottom<B>>> {
        let at = self
            .hot
            .bottoms_in_flight
            .iter()
            .position(|f| f.batches.iter().any(|(k, _)| *k == key));
        if let Some(at) = at {
            let BottomsInFlight {
                batches,
                masks,
                reading,
            } = self.hot.bottoms_in_flight.remove(at);
            let sampler = self
                .sibling
                .sampler()
                .map(Arc::clone)
                .ok_or_else(|| internal("the sampling sibling"))?;
            let read = {
                let _s = self.tracer.slice_on(self.acc, "bottom read");
                sampler
                    .finish_read(reading)
                    .map_err(dev_err(READ_BOTTOMS))?
            };
            drop(masks);
            if read.len() != batches.len() {
                return Err(internal(&format!(
                    "{} bottom hops read for {} queued",
                    read.len(),
                    batches.len()
                )));
            }
            for ((k, skip), (mut batch, _)) in batches.into_iter().zip(read) {
                self.dev
                    .adopt_batch(&sampler, &mut batch)
                    .map_err(dev_err("handing the bottom hop to the compute stream"))?;
                let (Some(block), Some(src)) = (batch.blocks.pop(), batch.src_ids.pop()) else {
                    return Err(internal("a bottom hop"));
                };
                let n_src = self.dev.block_shape(&block).0;
                self.hot.bottoms.insert(
                    k,
                    PreparedBottom {
                        block,
                        src,
                        n_src,
                        skip,
                    },
                );
            }
        }
        Ok(self.hot.bottoms.remove(&key))
    }

    /// Step 4.
    pub(super) fn train_prepared_op(
        &mut self,
        key: u64,
        (seeds, seed): (&[u32], u64),
        hot: &HotUse<'_>,
        deferred: Option<usize>,
    ) -> Result<Option<(f64, usize)>> {
        if let Some(slot) = deferred {
            self.ensure_loss_slot(slot)?;
        }
        let top = self.hot.prepared.remove(&key).ok_or_else(|| {
            Error::invalid_argument(
                "prepared batch",
                format!("internal: no batch was prepared under key {key}"),
            )
        })?;
        let n_hot = hot.positions.len();
        if hot.rows.len() != n_hot {
            return Err(Error::invalid_argument(
                "hot rows",
                format!(
                    "internal: {n_hot} positions but {} slab rows",
                    hot.rows.len()
                ),
            ));
        }
        let nd = top.num_bottom;
        if let Some(&p) = hot.positions.iter().find(|&&p| p as usize >= nd) {
            return Err(Error::invalid_argument(
                "hot rows",
                format!("internal: position {p} past the {nd} bottom destinations"),
            ));
        }
        let slab_rows = self.hot.slab_rows.get(hot.slab).copied().unwrap_or(0);
        if let Some(&r) = hot.rows.iter().find(|&&r| r as usize >= slab_rows) {
            return Err(Error::invalid_argument(
                "hot rows",
                format!("internal: slab row {r} past the {slab_rows} reserved"),
            ));
        }
        let tracer = self.tracer.clone();
        let acc = self.acc;
        let start = self.h2d;
        let dev = Arc::clone(&self.dev);
        let width = self.hot_width_op();
        let mut step = tracer.slice_on(acc, "device step");
        // Positions and slab rows (the skip mask only where the hop is
        // sampled now, below).
        let skip = n_hot > 0 && hot.grad == HotGrad::Constant;
        if n_hot > 0 {
            upload_into(
                &*dev,
                &mut self.hot.positions,
                hot.positions,
                "hot positions",
            )?;
            upload_into(&*dev, &mut self.hot.rows_idx, hot.rows, "hot slab rows")?;
            self.h2d += (n_hot * 8) as u64;
        }
        // The bottom hop, hot destinations skipped: sampled ahead (step 1b)
        // when it skipped the positions this batch trains with, else now.
        let mut want: Vec<u32> = if skip {
            hot.positions.to_vec()
        } else {
            Vec::new()
        };
        want.sort_unstable();
        let ahead = self.take_bottom(key)?;
        let resampled = ahead.is_some();
        let (block0, src0, ns0) = match ahead {
            Some(b) if b.skip == want => {
                self.hot.bottom_counts.ahead += 1;
                (b.block, b.src, b.n_src)
            }
            _ => {
                let mut s = tracer.slice_on(acc, "sample bottom");
                if resampled {
                    self.hot.bottom_counts.resampled += 1;
                    if let Some(a) = s.args_mut() {
                        a.extra.push(("bottom_resampled".into(), 1.0));
                    }
                }
                if skip {
                    let mut mask = vec![0u8; nd];
                    for &p in hot.positions {
                        mask[p as usize] = 1;
                    }
                    upload_into(&*dev, &mut self.hot.mask, &mask, "hot skip mask")?;
                    self.h2d += nd as u64;
                }
                let bottom_dst = top.src.first().ok_or_else(|| internal("bottom ids"))?;
                dev.sample_hop(
                    &self.graph,
                    bottom_dst,
                    nd,
                    self.opts.fanouts[0],
                    derive_seed(seed, 0),
                    if skip { self.hot.mask.as_ref() } else { None },
                )
                .map_err(dev_err("sampling the bottom hop"))?
            }
        };
        let x = self.gather_counted(&src0, ns0)?;
        let mut blocks = Vec::with_capacity(top.blocks.len() + 1);
        blocks.push(block0);
        blocks.extend(top.blocks);
        let labels = self.labels_of(seeds);
        self.h2d += (labels.len() * 4) as u64;
        let result = (|| -> Result<Option<gpu_ops::LossStats>> {
            upload_into(&*dev, &mut self.hot.labels, &labels, "labels")?;
            if n_hot > 0 {
                reserve(&*dev, &mut self.hot.rows, n_hot * width, "hot rows")?;
                let slab = self.hot.slabs[hot.slab]
                    .as_ref()
                    .ok_or_else(|| internal("hot slab"))?;
                let idx = self.hot.rows_idx.as_ref().ok_or_else(|| internal("rows"))?;
                let out = self.hot.rows.as_mut().ok_or_else(|| internal("rows"))?;
                dev.index_select_rows(slab, width, idx, n_hot, out)
                    .map_err(dev_err("selecting hot rows"))?;
            }
            let labels = self.hot.labels.as_ref().ok_or_else(|| internal("labels"))?;
            let rows = match (n_hot > 0, &self.hot.positions, &self.hot.rows) {
                (true, Some(p), Some(r)) => Some(HotRows {
                    positions: p,
                    rows: r,
                    n: n_hot,
                    grad: hot.grad,
                }),
                _ => None,
            };
            match (deferred, self.loss_slots.as_mut()) {
                (Some(slot), Some(out)) => {
                    let step = DeferredStep {
                        hot: rows.as_ref(),
                        dest: gpu_ops::LossSlot { out, slot },
                    };
                    self.model
                        .train_step_hot_deferred(&*dev, &blocks, x.layer(), labels, seed, step)
                        .map(|()| None)
                }
                _ => self
                    .model
                    .train_step_hot(&*dev, &blocks, x.layer(), labels, seed, rows.as_ref())
                    .map(Some),
            }
            .map_err(dev_err("training step"))
        })();
        self.recycle(x);
        self.settle_gather_misses();
        step.set_transfer(Direction::HostToDevice, self.h2d - start);
        Ok(result?.map(|stats| (stats.loss * seeds.len() as f64, stats.correct)))
    }
}
