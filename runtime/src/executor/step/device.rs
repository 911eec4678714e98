//! The step-based strategy's device half: one training batch under a
//! step-based placement (NeutronOrch §3, Figure 4 (a)–(d);
//! `orchestration.policy`), as `executor/step/mod.rs` drives it, over the
//! engine's mechanisms (`crate::engine`). Training
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
//! device sampler queues a group of batches ahead instead, on the engine's
//! sampling sibling (`engine/sibling.rs`), so its kernels and its
//! synchronizations overlap batch `k`'s backward and Adam. [`train_sampled`]
//! hands batch `k`'s blocks back so that they live until batch `k + 1` is
//! sampled: the sibling cannot reuse their memory (which would make it wait
//! for the backward).
//!
//! Every upload and every feature-cache miss adds its bytes to the engine's
//! host → device counter; the batch's share goes on its `device step` slice. Host
//! steps are `sample` / `gather` slices on the calling thread's (CPU) track, device
//! work `device sample` / `device step` slices on the accelerator track, so the
//! trace's busy fractions show where each placement spends its time.

use cpu_ops::{CsrGraph, NeighborSampler, SampledBatch, SamplerScratch};
use gpu_ops::Backend;
use scheduler::{Device, StepBased};

use crate::engine::{dev_err, record_copies, DeviceEngine, EXCLUDE};
use crate::error::{Error, Result};
use crate::executor::BatchRef;
use crate::trace::Direction;

/// The host sampler of the placements that sample on the CPU: made on first
/// use with the training fanouts, with its scratch.
#[derive(Default)]
pub(crate) struct HostSampler {
    sampling: Option<(NeighborSampler, SamplerScratch)>,
}

impl HostSampler {
    /// The sampler, made on first use.
    fn get(
        &mut self,
        fanouts: &[u32],
        num_vertices: usize,
    ) -> Result<(&mut NeighborSampler, &mut SamplerScratch)> {
        if self.sampling.is_none() {
            let s = NeighborSampler::new(fanouts.to_vec())
                .map_err(|e| Error::cpu_ops("train.fanouts", e))?;
            self.sampling = Some((s, SamplerScratch::new(num_vertices)));
        }
        let (s, scratch) = self.sampling.as_mut().ok_or_else(|| missing("sampler"))?;
        Ok((s, scratch))
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

/// Blocks on the device and, when the device gathers, the input ids.
type Uploaded<B> = (
    Vec<<B as gpu_ops::DeviceCore>::Block>,
    Option<<B as gpu_ops::DeviceCore>::Buf<u32>>,
);

impl HostSampler {
    /// Step 1: samples `seeds` with `seed` where `placement` samples (the host
    /// sampler or the device), with the training fanouts, and leaves the pairs
    /// `exclude` (link prediction's; global ids) out of every block where it
    /// sampled: so a device synchronizes for it on the stream that sampled,
    /// never on the compute stream of a host-sampled batch.
    pub(crate) fn sample_placed<B: Backend>(
        &mut self,
        engine: &mut DeviceEngine<B>,
        placement: StepBased,
        seeds: &[u32],
        seed: u64,
        exclude: &[(u32, u32)],
    ) -> Result<Sampled<B>> {
        if placement.sample_device() == Device::Cpu {
            let graph: &CsrGraph = &engine.dataset().graph;
            let (sampler, scratch) = self.get(&engine.opts.fanouts, graph.num_vertices())?;
            let mut b = sampler
                .sample(graph, seeds, seed, scratch)
                .map_err(|e| Error::cpu_ops("sampling", e))?;
            if !exclude.is_empty() {
                b.exclude_edges(&cpu_ops::sorted_pair_keys(exclude))
                    .map_err(|e| Error::cpu_ops(EXCLUDE, e))?;
            }
            Ok(Sampled::Host(b))
        } else {
            Ok(Sampled::Device(
                engine.sample_on_device(seeds, seed, exclude)?,
            ))
        }
    }
}

/// Uploads a host-sampled batch's blocks (and, for a device gather, its input
/// ids). Returns the blocks and the device ids.
fn upload_blocks<B: Backend>(
    e: &mut DeviceEngine<B>,
    batch: &SampledBatch,
    with_ids: bool,
) -> Result<Uploaded<B>> {
    let mut blocks = Vec::with_capacity(batch.blocks().len());
    for b in batch.blocks() {
        blocks.push(
            e.dev
                .block_from_host(b.num_src(), b.indptr(), b.indices())
                .map_err(dev_err("uploading sampled blocks"))?,
        );
        e.h2d += block_bytes(b);
    }
    let ids = if with_ids {
        let ids = batch.input_ids();
        e.h2d += (ids.len() * 4) as u64;
        Some(
            e.dev
                .to_device(ids)
                .map_err(dev_err("uploading input ids"))?,
        )
    } else {
        None
    };
    Ok((blocks, ids))
}

/// Steps 2 and 3 for a batch sampled by [`HostSampler::sample_placed`]:
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
/// (below [`DeviceEngine::loss_lag`]), read later through
/// `engine/losses.rs`, and the statistics are `None`.
pub(crate) fn train_sampled<B: Backend>(
    e: &mut DeviceEngine<B>,
    placement: StepBased,
    sampled: Sampled<B>,
    batch: BatchRef<'_>,
    step: bool,
    deferred: Option<usize>,
    copies_before: gpu_ops::TransferStats,
) -> Result<(Option<gpu_ops::LossStats>, Vec<B::Block>)> {
    if deferred.is_some() && !step {
        return Err(missing("a loss slot for a full step"));
    }
    let BatchRef { seeds, seed, .. } = batch;
    let tracer = e.tracer.clone();
    let acc = e.acc;
    let start = e.h2d;
    let host_gather = e.rows.is_some() || placement.gather_device() == Device::Cpu;
    let (host_batch, dev_batch) = match sampled {
        Sampled::Host(b) => (Some(b), None),
        Sampled::Device(b) => (None, Some(b)),
    };
    let mut host_ids: Option<Vec<u32>> = None;
    if let (Some(b), true) = (&dev_batch, host_gather) {
        let n_in = e.dev.block_shape(&b.blocks[0]).0;
        host_ids = Some(
            e.dev
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
        let (x, bytes) = e.host_input(ids)?;
        g.set_bytes(bytes);
        host_x = Some(x);
    }

    // 3. Upload what the host made, gather on the device if placed there, train.
    let mut slice = batch.tag(tracer.slice_on(acc, "device step"));
    let (blocks, dev_ids) = match (host_batch, dev_batch) {
        // Link prediction's excluded pairs left the blocks where they were
        // sampled (`HostSampler::sample_placed`).
        (Some(hb), _) => upload_blocks(e, &hb, !host_gather)?,
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
            let n_in = e.dev.block_shape(&blocks[0]).0;
            e.gather_counted(&ids, n_in)?
        }
    };
    let stats = e.upload_target(seeds, batch.target).and_then(|target| {
        let dev = &e.dev;
        let (model, losses) = (&mut e.model, &mut e.losses);
        target.with(|t| {
            match deferred {
                Some(slot) => {
                    let dest = losses.slot(dev, slot)?;
                    model
                        .train_step_deferred(dev, &blocks, x.layer(), t, seed, dest)
                        .map(|()| None)
                }
                None if step => model.train_step(dev, &blocks, x.layer(), t, seed).map(Some),
                None => model
                    .forward_backward(dev, &blocks, x.layer(), t, seed)
                    .map(Some),
            }
            .map_err(dev_err("training step"))
        })
    });
    e.recycle(x);
    e.settle_gather_misses();
    slice.set_transfer(Direction::HostToDevice, e.h2d - start);
    // What the whole batch, sampling included, cost.
    let copies = e.transfer_stats_all().since(&copies_before);
    record_copies(slice.args_mut(), &copies);
    drop(slice);
    Ok((stats?, blocks))
}
