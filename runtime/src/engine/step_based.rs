//! One training batch under a step-based placement (NeutronOrch §3, Figure 4
//! (a)–(d); `orchestration.policy`). Training always runs on the device; sampling
//! and gathering run where [`EngineOptions::placement`] says:
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
//! **Sampling ahead** (`device.sample_ahead`): when the trainer names the next
//! batch ([`Engine::set_next_batch`](super::Engine::set_next_batch)), the engine
//! samples it right after this batch's step is queued. On CUDA the step's
//! backward and Adam kernels are still running then, and the next batch is
//! sampled on a second stream ([`Sampling::sampling_sibling`](gpu_ops::Sampling::sampling_sibling),
//! its own allocator and fault word), so its kernels and its per-layer
//! synchronizations overlap them; [`Sampling::adopt_batch`](gpu_ops::Sampling::adopt_batch)
//! orders the compute stream after it. A host sampler's next batch likewise
//! overlaps the device's backward. This batch's blocks stay alive until the next
//! batch is sampled, so the sibling cannot reuse their memory (which would make
//! it wait for the backward). The next batch trains on exactly the blocks it
//! would have sampled when its turn came (same seeds, same seed); a batch whose
//! seeds differ from the ones sampled ahead samples afresh.
//!
//! Every upload and every feature-cache miss adds its bytes to the engine's
//! host → device counter; the batch's share goes on its `device step` slice. Host
//! steps are `sample` / `gather` slices on the calling thread's (CPU) track, device
//! work `device sample` / `device step` slices on the accelerator track, so the
//! trace's busy fractions show where each placement spends its time.

use std::sync::Arc;

use cpu_ops::{gather_rows, CsrGraph, NeighborSampler, SampledBatch, SamplerScratch};
use gpu_ops::Backend;
use scheduler::Device;

use super::{dev_err, record_copies, take_at_least, DeviceEngine, Engine};
use crate::dataset::Dataset;
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
enum Sampled<B: Backend> {
    Host(SampledBatch),
    Device(gpu_ops::DeviceBatch<B>),
}

/// What sampling ahead keeps between batches (the module doc).
pub(crate) struct Ahead<B: Backend> {
    /// The batch sampled ahead, with the seeds and seed it was sampled for
    /// (device batches already adopted). Declared before `sampler`, which made
    /// it, so it drops first.
    ready: Option<(Vec<u32>, u64, Sampled<B>)>,
    /// The batch the trainer runs next ([`Engine::set_next_batch`](super::Engine::set_next_batch)).
    next: Option<(Vec<u32>, u64)>,
    /// The backend's sampling sibling, made on first device sampling; `None`
    /// where the backend has none (then the engine's backend samples).
    sampler: Option<B>,
    /// Whether `sampler` was asked for.
    asked: bool,
    /// Batches that trained on blocks sampled ahead.
    pub(super) used: u64,
    /// The trace track of device sampling ahead (`acc sample`), declared on
    /// first use.
    track: Option<crate::trace::TrackId>,
}

impl<B: Backend> Default for Ahead<B> {
    fn default() -> Self {
        Self {
            ready: None,
            next: None,
            sampler: None,
            asked: false,
            used: 0,
            track: None,
        }
    }
}

impl<B: Backend> Ahead<B> {
    /// The batch sampled ahead for exactly `seeds` and `seed`, if any; a batch
    /// sampled for other seeds is dropped.
    fn take(&mut self, seeds: &[u32], seed: u64) -> Option<Sampled<B>> {
        let (s, k, b) = self.ready.take()?;
        (k == seed && s == seeds).then(|| {
            self.used += 1;
            b
        })
    }

    /// Forgets the batch sampled ahead and the next batch's seeds (a new tracer,
    /// placement or epoch order makes them stale).
    pub(super) fn clear(&mut self) {
        self.ready = None;
        self.next = None;
    }

    /// A new tracer: the `acc sample` track is declared again on first use.
    pub(super) fn set_tracer(&mut self) {
        self.track = None;
    }

    /// Sets the next batch (`None`: none known).
    pub(super) fn set_next(&mut self, next: Option<(&[u32], u64)>) {
        self.next = next.map(|(s, k)| (s.to_vec(), k));
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
    pub(super) fn gather_counted(&mut self, ids: &B::Buf<u32>, n: usize) -> Result<B::Buf<f32>> {
        // Current: the last batch (or evaluation) ended with a synchronization.
        self.misses_before = Some(self.cache_stats().misses);
        self.gather(ids, n)
    }

    /// Adds the rows the batch's gather read from host memory (cache misses
    /// since [`DeviceEngine::gather_counted`]) to the host → device counter.
    /// Call after the step's synchronization.
    pub(super) fn settle_gather_misses(&mut self) {
        if let Some(before) = self.misses_before.take() {
            let misses = self.cache_stats().misses.saturating_sub(before);
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

    /// Samples `seeds` on the device: on the sampling sibling when sampling
    /// ahead (the batch handed over to the engine's backend), else on the
    /// engine's backend.
    fn sample_on_device(&mut self, seeds: &[u32], seed: u64) -> Result<gpu_ops::DeviceBatch<B>> {
        if self.opts.sample_ahead && !self.ahead.asked {
            self.ahead.asked = true;
            self.ahead.sampler = self
                .dev
                .sampling_sibling()
                .map_err(dev_err("opening the sampling stream (device.sample_ahead)"))?;
        }
        let fanouts = &self.opts.fanouts;
        match &self.ahead.sampler {
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

    /// Samples `seeds` where the placement samples (host or device).
    fn sample_placed(&mut self, seeds: &[u32], seed: u64, host: bool) -> Result<Sampled<B>> {
        if host {
            let (sampler, scratch, graph) = self.host.sampler(&self.opts.fanouts)?;
            let b = sampler
                .sample(graph, seeds, seed, scratch)
                .map_err(|e| Error::cpu_ops("sampling", e))?;
            Ok(Sampled::Host(b))
        } else {
            Ok(Sampled::Device(self.sample_on_device(seeds, seed)?))
        }
    }

    /// Samples the batch named by [`Engine::set_next_batch`](super::Engine::set_next_batch)
    /// now (the module doc): a `sample` slice on the calling thread's track or
    /// a `device sample` slice on the `acc sample` track. An error drops the
    /// batch: it samples again when it trains and reports the error then.
    fn sample_next(&mut self, host: bool) {
        let Some((seeds, seed)) = self.ahead.next.take() else {
            return;
        };
        let tracer = self.tracer.clone();
        let before = self.transfer_stats_all();
        let mut slice = if host {
            tracer.slice("sample")
        } else {
            let track = *self.ahead.track.get_or_insert_with(|| {
                tracer.declare_track("acc sample", crate::trace::TrackKind::Accelerator)
            });
            tracer.slice_on(track, "device sample")
        };
        self.ahead.ready = self
            .sample_placed(&seeds, seed, host)
            .ok()
            .map(|b| (seeds, seed, b));
        let copies = self.transfer_stats_all().since(&before);
        record_copies(slice.args_mut(), &copies);
    }

    /// The transfers of the engine's backend and its sampling sibling.
    pub(super) fn transfer_stats_all(&self) -> gpu_ops::TransferStats {
        self.dev.transfer_stats().plus(&self.ahead.transfer_stats())
    }

    /// Trains one batch under the engine's placement (the module doc's steps).
    pub(super) fn train_batch_placed(&mut self, seeds: &[u32], seed: u64) -> Result<(f64, usize)> {
        let stats = self.run_batch_placed(seeds, seed, true)?;
        Ok((stats.loss * seeds.len() as f64, stats.correct))
    }

    /// One batch under the engine's placement, up to the gradients (`step =
    /// false`: the model keeps them for a data-parallel all-reduce) or with the
    /// step (`true`).
    pub(super) fn run_batch_placed(
        &mut self,
        seeds: &[u32],
        seed: u64,
        step: bool,
    ) -> Result<gpu_ops::LossStats> {
        let tracer = self.tracer.clone();
        let acc = self.acc;
        let start = self.h2d;
        let copies_before = self.transfer_stats_all();
        let host_sample = self.opts.placement.sample_device() == Device::Cpu;
        // A row source (partitioned features) gathers on the host.
        let host_gather = self.rows.is_some() || self.opts.placement.gather_device() == Device::Cpu;

        // 1. Sample (or take the batch sampled ahead for these seeds).
        let sampled = match self.ahead.take(seeds, seed) {
            // Sampled where the placement said then (the same as now: a new
            // placement clears it).
            Some(b) => b,
            None => {
                let _s = if host_sample {
                    tracer.slice("sample")
                } else {
                    tracer.slice_on(acc, "device sample")
                };
                self.sample_placed(seeds, seed, host_sample)?
            }
        };
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

        // 2. Gather on the host.
        let mut values = 0;
        if host_gather {
            let mut g = tracer.slice("gather");
            let ids = match (&host_batch, &host_ids) {
                (Some(b), _) => b.input_ids(),
                (None, Some(ids)) => ids.as_slice(),
                (None, None) => return Err(missing("input ids")),
            };
            values = self.gather_on_host(ids)?;
            g.set_bytes((values * 4) as u64);
        }

        // 3. Upload what the host made, gather on the device if placed there, train.
        let mut slice = tracer.slice_on(acc, "device step");
        let (blocks, dev_ids) = match (host_batch, dev_batch) {
            (Some(hb), _) => self.upload_blocks(&hb, !host_gather)?,
            (None, Some(db)) => {
                let ids = db.src_ids.into_iter().next();
                (db.blocks, ids)
            }
            (None, None) => return Err(missing("batch")),
        };
        let x = if host_gather {
            self.upload_gathered(values)?
        } else {
            let ids = dev_ids.ok_or_else(|| missing("input ids"))?;
            let n_in = self.dev.block_shape(&blocks[0]).0;
            self.gather_counted(&ids, n_in)?
        };
        let labels = self.labels_of(seeds);
        self.h2d += (labels.len() * 4) as u64;
        let stats = self
            .dev
            .to_device(&labels)
            .map_err(dev_err("labels"))
            .and_then(|labels| {
                if step {
                    self.model.train_step(&self.dev, &blocks, &x, &labels, seed)
                } else {
                    self.model
                        .forward_backward(&self.dev, &blocks, &x, &labels, seed)
                }
                .map_err(dev_err("training step"))
            });
        self.x = Some(x);
        self.settle_gather_misses();
        slice.set_transfer(Direction::HostToDevice, self.h2d - start);
        // What the whole batch, sampling included, cost.
        let copies = self.transfer_stats_all().since(&copies_before);
        record_copies(slice.args_mut(), &copies);
        drop(slice);
        if stats.is_ok() {
            self.sample_next(host_sample);
        }
        // Only now: the sibling must not reuse this batch's blocks (module doc).
        drop(blocks);
        stats
    }
}

#[cfg(test)]
mod tests {
    use cpu_ops::{Model, ModelConfig, ModelKind};
    use gpu_ops::{HostBackend, TopologyPlacement};

    use super::*;
    use crate::engine::EngineOptions;
    use crate::generate::{generate_sbm, SbmOptions};

    fn engine(ds: &Arc<Dataset>, ahead: bool, sample: Device) -> DeviceEngine<HostBackend> {
        let model = Model::new(
            &ModelConfig {
                kind: ModelKind::Sage,
                in_dim: 8,
                hidden: 8,
                num_classes: 4,
                num_layers: 2,
                heads: 1,
                dropout: 0.5,
            },
            3,
        )
        .unwrap();
        DeviceEngine::new(
            HostBackend::new(),
            ds,
            &model,
            EngineOptions {
                fanouts: vec![4, 3],
                eval_fanouts: vec![4, 3],
                cache_bytes: 4000,
                topology: TopologyPlacement::Device,
                adam: cpu_ops::AdamConfig::default(),
                placement: scheduler::StepBased::new(sample, Device::Accelerator),
                batch_size: 64,
                precision: gpu_ops::Precision::Fp32,
                defer_features: false,
                feature_dtype: gpu_ops::FeatureDtype::F32,
                sample_ahead: ahead,
            },
        )
        .unwrap()
    }

    /// A batch trains on the blocks of its own seeds and seed whatever the
    /// engine sampled ahead: a hint naming other seeds, another seed or no
    /// batch leaves the losses and weights of a run without hints, and only
    /// hints that came true count as sampled ahead.
    #[test]
    fn only_a_batch_sampled_for_the_same_seeds_and_seed_is_used() {
        let ds = Arc::new(
            generate_sbm(&SbmOptions {
                num_vertices: 1000,
                num_edges: 6000,
                num_classes: 4,
                feature_dim: 8,
                ..SbmOptions::default()
            })
            .unwrap(),
        );
        let ids: Vec<u32> = (0..640).collect();
        let batches: Vec<&[u32]> = ids.chunks(64).collect();
        let seed_of = |k: usize| 100 + k as u64;
        for sample in [Device::Accelerator, Device::Cpu] {
            let mut plain = engine(&ds, false, sample);
            let mut hinted = engine(&ds, true, sample);
            let mut came_true = 0;
            for (k, seeds) in batches.iter().enumerate() {
                let next = batches.get(k + 1).map(|s| (*s, seed_of(k + 1)));
                let hint = match k % 4 {
                    // The right batch.
                    0 | 1 => next,
                    // The right seeds with another seed.
                    2 => next.map(|(s, _)| (s, 7)),
                    // Other seeds with the right seed.
                    _ => next.map(|(_, k)| (batches[0], k)),
                };
                came_true += u64::from(k % 4 < 2 && next.is_some());
                hinted.set_next_batch(hint);
                plain.set_next_batch(next);
                let a = plain.train_batch(seeds, seed_of(k)).unwrap();
                let b = hinted.train_batch(seeds, seed_of(k)).unwrap();
                assert_eq!(a, b, "{sample:?}: batch {k}");
            }
            assert_eq!(plain.batches_sampled_ahead(), 0, "off: hints ignored");
            assert_eq!(hinted.batches_sampled_ahead(), came_true, "{sample:?}");
            assert_eq!(
                plain.params_to_host().unwrap(),
                hinted.params_to_host().unwrap()
            );
        }
    }
}
