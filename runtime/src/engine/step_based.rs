//! One training batch under a step-based placement (NeutronOrch §3, Figure 4
//! (a)–(d); `orchestration.policy`), as `executor/step/mod.rs` drives it. Training
//! always runs on the device; sampling and gathering run where the executor's
//! [`StepBased`] placement says:
//!
//! 1. **sample** — on the host: `cpu_ops::NeighborSampler` with the training fanouts
//!    and the batch's seed (the host backend's sampler is the same code, so on it every
//!    placement trains on identical blocks); on the device:
//!    [`Sampling::sample`](gpu_ops::Sampling::sample), and with a host gather the input
//!    ids are downloaded.
//! 2. **gather** — on the host: `cpu_ops::gather_rows` into a reused buffer; on the
//!    device: [`FeatureStore::gather`](gpu_ops::FeatureStore::gather) through the
//!    feature cache (misses read host rows).
//! 3. **device step** — host-sampled blocks are uploaded
//!    ([`Sampling::block_from_host`](gpu_ops::Sampling::block_from_host); the input ids
//!    too when the device gathers), host-gathered rows are uploaded
//!    ([`DeviceMemory::upload`](gpu_ops::DeviceMemory::upload)), the labels are
//!    uploaded, and the model takes its step.
//!
//! **Sampling ahead** (`device.sample_ahead`): the step executor samples batch
//! `k + 1` right after batch `k`'s step is queued (`executor/step/mod.rs`); a
//! device sampler queues a group of batches ahead instead
//! ([`DeviceEngine::queue_on_device`], no synchronization) and reads their layer
//! sizes in one read when the first of them is due
//! ([`DeviceEngine::resolve_on_device`]). On CUDA
//! the engine then samples on a second stream ([`Sampling::sampling_sibling`](gpu_ops::Sampling::sampling_sibling),
//! its own allocator and fault word), so its kernels and its per-layer
//! synchronizations overlap batch `k`'s backward and Adam;
//! [`Sampling::adopt_batch`](gpu_ops::Sampling::adopt_batch) orders the compute
//! stream after it. [`DeviceEngine::train_sampled`] hands batch `k`'s blocks
//! back so that they live until batch `k + 1` is sampled: the sibling cannot
//! reuse their memory (which would make it wait for the backward).
//!
//! Every upload and every feature-cache miss adds its bytes to the engine's
//! host → device counter; the batch's share goes on its `device step` slice. Host
//! steps are `sample` / `gather` slices on the calling thread's (CPU) track, device
//! work `device sample` / `device step` slices on the accelerator track, so the
//! trace's busy fractions show where each placement spends its time.

use std::sync::Arc;

use cpu_ops::{gather_rows, CsrGraph, NeighborSampler, SampledBatch, SamplerScratch};
use gpu_ops::Backend;
use scheduler::{Device, StepBased};

use super::input::Input;
use super::{dev_err, record_copies, take_at_least, DeviceEngine};
use crate::data::dataset::Dataset;
use crate::error::{Error, Result};
use crate::trace::Direction;

/// What the host needs for the steps placed on it: the dataset (shared, not
/// copied), a sampler and its scratch (made on first host sampling), and the
/// reused gather buffer.
pub(crate) struct HostSide {
    ds: Arc<Dataset>,
    sampling: Option<(NeighborSampler, SamplerScratch)>,
    /// The reused host gather buffer.
    pub(super) rows: Vec<f32>,
    /// The same rows as bfloat16 bits, for an upload of half the bytes.
    bits: Vec<u16>,
}

impl HostSide {
    /// The host side over `ds`.
    pub(super) fn new(ds: Arc<Dataset>) -> Self {
        Self {
            ds,
            sampling: None,
            rows: Vec::new(),
            bits: Vec::new(),
        }
    }

    /// The dataset.
    pub(super) fn ds(&self) -> &Arc<Dataset> {
        &self.ds
    }

    /// The sampler with the training fanouts, made on first use.
    fn sampler(
        &mut self,
        fanouts: &[u32],
    ) -> Result<(&mut NeighborSampler, &mut SamplerScratch, &CsrGraph)> {
        if self.sampling.is_none() {
            let s = NeighborSampler::new(fanouts.to_vec())
                .map_err(|e| Error::cpu_ops("train.fanouts", e))?;
            self.sampling = Some((s, SamplerScratch::new(self.ds.num_vertices())));
        }
        let (s, scratch) = self.sampling.as_mut().ok_or_else(|| missing("sampler"))?;
        Ok((s, scratch, &self.ds.graph))
    }
}

fn missing(what: &str) -> Error {
    Error::invalid_argument(
        "orchestration.policy",
        format!("internal: the engine was built without the host {what}"),
    )
}

/// Bytes of a host block as uploaded: `indptr` (u64) and `indices` (u32).
fn block_bytes(b: &cpu_ops::Block) -> u64 {
    (b.indptr().len() * 8 + b.indices().len() * 4) as u64
}

/// A batch's blocks as sampled: on the host or on the device.
pub(crate) enum Sampled<B: Backend> {
    /// Sampled on the host.
    Host(SampledBatch),
    /// Sampled on the device.
    Device(gpu_ops::DeviceBatch<B>),
}

/// One training batch as the step executor names it: its seeds, its sampling
/// seed, and where it stands (its slices carry the epoch and batch index).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchRef<'a> {
    /// The batch's seeds.
    pub seeds: &'a [u32],
    /// Its sampling seed.
    pub seed: u64,
    /// The epoch.
    pub epoch: usize,
    /// The batch index in the epoch.
    pub k: usize,
}

impl BatchRef<'_> {
    /// `slice` with this batch's epoch and index.
    pub fn tag<'t>(&self, slice: crate::trace::SliceGuard<'t>) -> crate::trace::SliceGuard<'t> {
        slice.epoch(self.epoch as u64).batch(self.k as u64)
    }
}

/// The backend's sampling sibling (`device.sample_ahead`): a second stream in the
/// same context, with its own allocator and fault word, so that a batch sampled
/// while the previous one trains overlaps its kernels.
pub(crate) struct Sibling<B: Backend> {
    /// Made on first device sampling; `None` where the backend has none (then
    /// the engine's backend samples). Shared with the reads of the layer
    /// path's top layers in flight (`engine/hot.rs` step 1), which a planner
    /// thread finishes.
    sampler: Option<Arc<B>>,
    /// Whether `sampler` was asked for.
    asked: bool,
}

impl<B: Backend> Default for Sibling<B> {
    fn default() -> Self {
        Self {
            sampler: None,
            asked: false,
        }
    }
}

impl<B: Backend> Sibling<B> {
    /// The sampling sibling, once opened (`None`: the engine's backend samples).
    pub(super) fn sampler(&self) -> Option<&Arc<B>> {
        self.sampler.as_ref()
    }

    /// The transfers of the sampling sibling.
    pub(super) fn transfer_stats(&self) -> gpu_ops::TransferStats {
        self.sampler
            .as_ref()
            .map(|s| s.transfer_stats())
            .unwrap_or_default()
    }
}

/// Blocks on the device and, when the device gathers, the input ids.
type Uploaded<B> = (
    Vec<<B as gpu_ops::DeviceCore>::Block>,
    Option<<B as gpu_ops::DeviceCore>::Buf<u32>>,
);

impl<B: Backend> DeviceEngine<B> {
    /// [`DeviceEngine::gather`] of a training batch, whose feature-cache misses'
    /// rows [`DeviceEngine::settle_gather_misses`] adds to the host → device
    /// counter after the step. The counts are not read here: on CUDA they reach
    /// `cache_stats` at the next synchronization (the loss read), so reading them
    /// now would cost one more per batch.
    pub(super) fn gather_counted(&mut self, ids: &B::Buf<u32>, n: usize) -> Result<Input<B>> {
        // Current: the last batch (or evaluation) ended with a synchronization.
        self.misses_before = Some(super::ModelState::cache_stats(self).misses);
        self.gather_input(ids, n)
    }

    /// Adds the rows the batch's gather read from host memory (cache misses
    /// since [`DeviceEngine::gather_counted`]) to the host → device counter.
    /// Call after the step's synchronization.
    pub(super) fn settle_gather_misses(&mut self) {
        if let Some(before) = self.misses_before.take() {
            let misses = super::ModelState::cache_stats(self)
                .misses
                .saturating_sub(before);
            self.h2d += misses * self.host.ds().features.dim() as u64 * 4;
        }
    }

    /// Gathers the rows of `ids` on the host into the reused host buffer that
    /// [`DeviceEngine::upload_gathered`] reads: bfloat16 bits (`host.bits`)
    /// when the device takes bfloat16 rows (`device.feature_dtype = "bf16"`),
    /// else f32 values (`host.rows`). Rows come from the row source when there
    /// is one (an `exchange` slice with its bytes; bfloat16 rows that travelled
    /// as bfloat16 are never widened on the host), else from the dataset.
    /// Returns the number of values.
    pub(super) fn gather_on_host(&mut self, ids: &[u32]) -> Result<usize> {
        let bf16 = self.opts.feature_dtype == gpu_ops::FeatureDtype::Bf16;
        let hs = &mut self.host;
        let features = &hs.ds.features;
        match &self.rows {
            Some(src) => {
                let mut x = self.tracer.slice("exchange");
                let bytes = if bf16 {
                    src.gather_bf16(ids, &mut hs.bits)?
                } else {
                    src.gather(ids, &mut hs.rows)?
                };
                x.set_bytes(bytes);
            }
            None => {
                hs.rows.resize(ids.len() * features.dim(), 0.0);
                gather_rows(features, ids, &mut hs.rows)
                    .map_err(|e| Error::cpu_ops("gather", e))?;
                if bf16 {
                    hs.bits.clear();
                    hs.bits
                        .extend(hs.rows.iter().map(|&v| gpu_ops::f32_to_bf16_bits(v)));
                }
            }
        }
        Ok(ids.len() * features.dim())
    }

    /// Uploads the `need` values [`DeviceEngine::gather_on_host`] left into the
    /// reused input buffer. Bfloat16 rows travel as bfloat16 (half the bytes,
    /// rounded as the device's bfloat16 store rounds, so every placement trains
    /// on the same values) and are widened on the device.
    pub(super) fn upload_gathered(&mut self, need: usize) -> Result<B::Buf<f32>> {
        let mut x = take_at_least(&*self.dev, &mut self.x, need, "input buffer")?;
        if self.opts.feature_dtype == gpu_ops::FeatureDtype::Bf16 {
            let host = self.host.bits.get(..need).ok_or_else(|| {
                Error::invalid_argument("gathered rows", "internal: fewer than needed")
            })?;
            let mut bits =
                take_at_least(&*self.dev, &mut self.bits, need, "bfloat16 input buffer")?;
            let up = self
                .dev
                .upload(self.dev.stream(), host, &mut bits)
                .and_then(|()| self.dev.widen_bf16(&bits, need, &mut x))
                .map_err(dev_err("uploading gathered rows as bfloat16"));
            self.bits = Some(bits);
            up?;
            self.h2d += (need * 2) as u64;
        } else {
            let host = self.host.rows.get(..need).ok_or_else(|| {
                Error::invalid_argument("gathered rows", "internal: fewer than needed")
            })?;
            self.dev
                .upload(self.dev.stream(), host, &mut x)
                .map_err(dev_err("uploading gathered rows"))?;
            self.h2d += (need * 4) as u64;
        }
        Ok(x)
    }

    /// Uploads a host-sampled batch's blocks (and, for a device gather, its input
    /// ids). Returns the blocks and the device ids.
    fn upload_blocks(&mut self, batch: &SampledBatch, with_ids: bool) -> Result<Uploaded<B>> {
        let mut blocks = Vec::with_capacity(batch.blocks().len());
        for b in batch.blocks() {
            blocks.push(
                self.dev
                    .block_from_host(b.num_src(), b.indptr(), b.indices())
                    .map_err(dev_err("uploading sampled blocks"))?,
            );
            self.h2d += block_bytes(b);
        }
        let ids = if with_ids {
            let ids = batch.input_ids();
            self.h2d += (ids.len() * 4) as u64;
            Some(
                self.dev
                    .to_device(ids)
                    .map_err(dev_err("uploading input ids"))?,
            )
        } else {
            None
        };
        Ok((blocks, ids))
    }

    /// Opens the sampling sibling on first use when sampling ahead
    /// (`device.sample_ahead`; the step path's device sampler and the layer
    /// path's top layers, `engine/hot.rs` step 1).
    pub(super) fn open_sibling(&mut self) -> Result<()> {
        if self.opts.sample_ahead && !self.sibling.asked {
            self.sibling.asked = true;
            self.sibling.sampler = self
                .dev
                .sampling_sibling()
                .map_err(dev_err("opening the sampling stream (device.sample_ahead)"))?
                .map(Arc::new);
        }
        Ok(())
    }

    /// Enqueues the device sampling of `seeds` without reading anything
    /// ([`Sampling::sample_queued`](gpu_ops::Sampling::sample_queued)), on the
    /// sampling sibling when sampling ahead, else on the engine's backend.
    /// [`DeviceEngine::resolve_on_device`] reads a group of them at once.
    pub(crate) fn queue_on_device(&mut self, seeds: &[u32], seed: u64) -> Result<B::Queued> {
        self.open_sibling()?;
        let sampler = self.sibling.sampler.as_deref().unwrap_or(&*self.dev);
        sampler
            .sample_queued(&self.graph, seeds, &self.opts.fanouts, seed)
            .map_err(dev_err("sampling"))
    }

    /// The batches of [`DeviceEngine::queue_on_device`], in order, with one
    /// synchronization for all of them, handed to the engine's backend.
    pub(crate) fn resolve_on_device(
        &mut self,
        queued: Vec<B::Queued>,
    ) -> Result<Vec<gpu_ops::DeviceBatch<B>>> {
        match &self.sibling.sampler {
            Some(s) => {
                let mut batches = s.resolve_queued(queued).map_err(dev_err("sampling"))?;
                for b in &mut batches {
                    self.dev
                        .adopt_batch(s, b)
                        .map_err(dev_err("handing a sampled batch to the compute stream"))?;
                }
                Ok(batches)
            }
            None => self.dev.resolve_queued(queued).map_err(dev_err("sampling")),
        }
    }

    /// Samples `seeds` on the device: on the sampling sibling when sampling
    /// ahead (the batch handed over to the engine's backend), else on the
    /// engine's backend.
    fn sample_on_device(&mut self, seeds: &[u32], seed: u64) -> Result<gpu_ops::DeviceBatch<B>> {
        self.open_sibling()?;
        let fanouts = &self.opts.fanouts;
        match &self.sibling.sampler {
            Some(s) => {
                let mut b = s
                    .sample(&self.graph, seeds, fanouts, seed)
                    .map_err(dev_err("sampling"))?;
                self.dev
                    .adopt_batch(s, &mut b)
                    .map_err(dev_err("handing a sampled batch to the compute stream"))?;
                Ok(b)
            }
            None => self
                .dev
                .sample(&self.graph, seeds, fanouts, seed)
                .map_err(dev_err("sampling")),
        }
    }

    /// Step 1: samples `seeds` with `seed` where `placement` samples (the host
    /// sampler or the device), with the training fanouts.
    pub(crate) fn sample_placed(
        &mut self,
        placement: StepBased,
        seeds: &[u32],
        seed: u64,
    ) -> Result<Sampled<B>> {
        if placement.sample_device() == Device::Cpu {
            let (sampler, scratch, graph) = self.host.sampler(&self.opts.fanouts)?;
            let b = sampler
                .sample(graph, seeds, seed, scratch)
                .map_err(|e| Error::cpu_ops("sampling", e))?;
            Ok(Sampled::Host(b))
        } else {
            Ok(Sampled::Device(self.sample_on_device(seeds, seed)?))
        }
    }

    /// Batches between a step and the read of its loss (`device.loss_lag`
    /// resolved, at least 1).
    pub(crate) fn loss_lag(&self) -> usize {
        self.loss_lag
    }

    /// Sets [`DeviceEngine::loss_lag`] (0 counts as 1).
    pub(crate) fn set_loss_lag(&mut self, lag: usize) {
        self.loss_lag = lag.max(1);
        self.loss_slots = None;
    }

    /// The loss sums and correct counts of deferred slots `0..n`, in one
    /// download (one synchronization, after every step queued so far).
    pub(crate) fn read_loss_slots(&mut self, n: usize) -> Result<Vec<(f64, usize)>> {
        let slots = self
            .loss_slots
            .as_ref()
            .ok_or_else(|| missing("loss slots"))?;
        let words = self
            .dev
            .to_host(slots, 2 * n)
            .map_err(dev_err("reading the batches' losses"))?;
        Ok(loss_words(&words))
    }

    /// The deferred slots `0..n` on their way to the host, without waiting:
    /// one download into page-locked memory queued on the compute stream
    /// after every step so far (`engine/publish.rs`'s pool and event). The
    /// slots may be written again at once: the next steps are queued after the
    /// copy. Resolving the handle waits for the copy only (an event wait, not
    /// a synchronization of the stream), so the device keeps the work queued
    /// after it.
    pub(crate) fn queue_loss_read(&mut self, n: usize) -> Result<Box<dyn PendingLosses>> {
        let slots = self
            .loss_slots
            .as_ref()
            .ok_or_else(|| missing("loss slots"))?;
        let what = "reading the batches' losses";
        let copy = self
            .loss_reads
            .download(&self.dev, &[slots], vec![2 * n], what)?;
        Ok(Box::new(copy))
    }

    /// Checks `slot` against [`DeviceEngine::loss_lag`] and makes the slots on
    /// first use.
    pub(super) fn ensure_loss_slot(&mut self, slot: usize) -> Result<()> {
        if slot >= self.loss_lag {
            return Err(missing("a loss slot below the loss lag"));
        }
        if self.loss_slots.is_none() {
            self.loss_slots = Some(
                self.dev
                    .alloc(2 * self.loss_lag)
                    .map_err(dev_err("loss slots"))?,
            );
        }
        Ok(())
    }

    /// After a non-finite deferred loss: the `skipped` steps queued from that
    /// batch on were not applied; the version moves back by as many and the
    /// model's guard is cleared.
    pub(crate) fn rewind_skipped(&mut self, skipped: usize) -> Result<()> {
        self.model
            .rewind_skipped(&self.dev, skipped as u64)
            .map_err(dev_err("clearing the loss guard"))
    }

    /// Host synchronizations so far: of the engine's backend (its compute
    /// stream; sampling too when there is no sibling) and of the sampling
    /// sibling (`device.sample_ahead` on CUDA: they wait for sampling kernels
    /// only).
    pub(crate) fn syncs_by_stream(&self) -> (u64, u64) {
        (
            self.dev.transfer_stats().syncs,
            self.sibling.transfer_stats().syncs,
        )
    }

    /// The transfers of the engine's backend and its sampling sibling.
    pub(super) fn transfer_stats_all(&self) -> gpu_ops::TransferStats {
        self.dev
            .transfer_stats()
            .plus(&self.sibling.transfer_stats())
    }

    /// Steps 2 and 3 for a batch sampled by [`DeviceEngine::sample_placed`]:
    /// gather where `placement` gathers (on the host whenever a row source
    /// gives the rows), upload what the host made, and train — the whole
    /// step (`step = true`) or up to the gradients, which the model keeps for
    /// a data-parallel all-reduce. Returns the loss statistics and the batch's
    /// blocks, which the caller drops only after it sampled the next batch
    /// (the sibling must not recycle their memory while the backward runs).
    /// The `device step` slice records the copies and synchronizations since
    /// `copies_before` (taken before the batch was sampled: the whole batch).
    ///
    /// With `deferred = Some(slot)` (and `step`) nothing is read: the step is
    /// [`gpu_ops::DeviceModel::train_step_deferred`] into loss slot `slot`
    /// (below [`DeviceEngine::loss_lag`]), read later by
    /// [`DeviceEngine::read_loss_slots`], and the statistics are `None`.
    pub(crate) fn train_sampled(
        &mut self,
        placement: StepBased,
        sampled: Sampled<B>,
        batch: BatchRef<'_>,
        step: bool,
        deferred: Option<usize>,
        copies_before: gpu_ops::TransferStats,
    ) -> Result<(Option<gpu_ops::LossStats>, Vec<B::Block>)> {
        if let Some(slot) = deferred {
            if !step {
                return Err(missing("a loss slot for a full step"));
            }
            self.ensure_loss_slot(slot)?;
        }
        let BatchRef { seeds, seed, .. } = batch;
        let tracer = self.tracer.clone();
        let acc = self.acc;
        let start = self.h2d;
        let host_gather = self.rows.is_some() || placement.gather_device() == Device::Cpu;
        let (host_batch, dev_batch) = match sampled {
            Sampled::Host(b) => (Some(b), None),
            Sampled::Device(b) => (None, Some(b)),
        };
        let mut host_ids: Option<Vec<u32>> = None;
        if let (Some(b), true) = (&dev_batch, host_gather) {
            let n_in = self.dev.block_shape(&b.blocks[0]).0;
            host_ids = Some(
                self.dev
                    .to_host(&b.src_ids[0], n_in)
                    .map_err(dev_err("downloading input ids"))?,
            );
        }

        // 2. Gather on the host (and upload what it gathered).
        let mut host_x = None;
        if host_gather {
            let mut g = batch.tag(tracer.slice("gather"));
            let ids = match (&host_batch, &host_ids) {
                (Some(b), _) => b.input_ids(),
                (None, Some(ids)) => ids.as_slice(),
                (None, None) => return Err(missing("input ids")),
            };
            let (x, bytes) = self.host_input(ids)?;
            g.set_bytes(bytes);
            host_x = Some(x);
        }

        // 3. Upload what the host made, gather on the device if placed there, train.
        let mut slice = batch.tag(tracer.slice_on(acc, "device step"));
        let (blocks, dev_ids) = match (host_batch, dev_batch) {
            (Some(hb), _) => self.upload_blocks(&hb, !host_gather)?,
            (None, Some(db)) => {
                let ids = db.src_ids.into_iter().next();
                (db.blocks, ids)
            }
            (None, None) => return Err(missing("batch")),
        };
        let x = match host_x {
            Some(x) => x,
            None => {
                let ids = dev_ids.ok_or_else(|| missing("input ids"))?;
                let n_in = self.dev.block_shape(&blocks[0]).0;
                self.gather_counted(&ids, n_in)?
            }
        };
        let labels = self.labels_of(seeds);
        self.h2d += (labels.len() * 4) as u64;
        let stats = self
            .dev
            .to_device(&labels)
            .map_err(dev_err("labels"))
            .and_then(|labels| {
                match (deferred, self.loss_slots.as_mut()) {
                    (Some(slot), Some(out)) => self
                        .model
                        .train_step_deferred(
                            &self.dev,
                            &blocks,
                            x.layer(),
                            &labels,
                            seed,
                            gpu_ops::LossSlot { out, slot },
                        )
                        .map(|()| None),
                    _ if step => self
                        .model
                        .train_step(&self.dev, &blocks, x.layer(), &labels, seed)
                        .map(Some),
                    _ => self
                        .model
                        .forward_backward(&self.dev, &blocks, x.layer(), &labels, seed)
                        .map(Some),
                }
                .map_err(dev_err("training step"))
            });
        self.recycle(x);
        self.settle_gather_misses();
        slice.set_transfer(Direction::HostToDevice, self.h2d - start);
        // What the whole batch, sampling included, cost.
        let copies = self.transfer_stats_all().since(&copies_before);
        record_copies(slice.args_mut(), &copies);
        drop(slice);
        Ok((stats?, blocks))
    }
}

/// Deferred slot words as (loss sum, correct count) pairs.
fn loss_words(words: &[u64]) -> Vec<(f64, usize)> {
    words
        .chunks_exact(2)
        .map(|w| (f64::from_bits(w[0]), w[1] as usize))
        .collect()
}

/// Deferred losses on their way to the host
/// ([`DeviceEngine::queue_loss_read`]): a `Send` handle resolved once.
pub(crate) trait PendingLosses: Send {
    /// Waits for the copy and returns each slot's (loss sum, correct count),
    /// in slot order.
    fn resolve(self: Box<Self>) -> Result<Vec<(f64, usize)>>;
}

impl<B: Backend> PendingLosses for super::publish::PendingCopy<B, u64> {
    fn resolve(self: Box<Self>) -> Result<Vec<(f64, usize)>> {
        let words = self.resolve_copies()?;
        Ok(loss_words(words.first().map_or(&[][..], |w| w)))
    }
}
