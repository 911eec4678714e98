//! Steps 1 and 1b of the layer path's device half (`device/mod.rs`): a
//! super-batch's top layers and bottom hops sampled a super-batch ahead on the
//! engine's sampling sibling (`engine/sibling.rs`), their reads, and their
//! hand-over to the compute stream.

use std::any::Any;
use std::sync::Arc;

use cpu_ops::derive_seed;
use gpu_ops::Backend;

use super::{internal, LayerEngine};
use crate::engine::{dev_err, DeviceEngine};
use crate::error::{Error, Result};

/// A batch whose top layers were sampled ahead (step 1).
pub(crate) struct PreparedTop<B: Backend> {
    /// Blocks `1..L` (bottom first).
    pub(super) blocks: Vec<B::Block>,
    /// Sources of blocks `1..L`; `src[0]` are block 0's destinations.
    pub(super) src: Vec<B::Buf<u32>>,
    /// Number of block 0's destinations.
    pub(super) num_bottom: usize,
}

/// A batch's bottom hop sampled ahead (step 1b), read and handed to the
/// compute stream.
pub(crate) struct PreparedBottom<B: Backend> {
    /// Block 0.
    pub(super) block: B::Block,
    /// Its sources (the rows to gather).
    pub(super) src: B::Buf<u32>,
    /// Their count.
    pub(super) n_src: usize,
    /// The positions its mask skipped, ascending (none: no mask).
    pub(super) skip: Vec<u32>,
    /// Whether the batch's excluded pairs (link prediction) left the block
    /// already, on the sampler's stream.
    pub(super) excluded: bool,
}

/// A super-batch's bottom hops queued on the sampling sibling (step 1b),
/// their one read in flight.
pub(crate) struct BottomsInFlight<B: Backend> {
    /// Each batch's key and the positions its mask skips (ascending).
    pub(super) batches: Vec<(u64, Vec<u32>)>,
    /// The masks the hops read (kept until the read is finished).
    pub(super) masks: Vec<B::Buf<u8>>,
    /// The sizes' read.
    pub(super) reading: B::Reading,
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
    /// (destination, source) pairs its blocks leave out (link prediction).
    pub exclude: &'a [(u32, u32)],
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
    batches: Vec<TopOf<B>>,
}

/// One batch of a [`Tops`].
struct TopOf<B: Backend> {
    key: u64,
    /// Its top blocks.
    batch: gpu_ops::DeviceBatch<B>,
    /// The pairs they leave out (link prediction).
    exclude: Vec<(u32, u32)>,
}

impl<B: Backend> LayerEngine<B> {
    /// Step 1: queues the top layers of `batches` on the engine's look-ahead
    /// (`engine/sibling.rs`: on the sampling sibling when sampling ahead) and
    /// starts the read of their sizes and bottom sources, which whoever waits
    /// finishes (the planner thread).
    pub(super) fn prepare_tops_op(&mut self, batches: &[TopBatch<'_>]) -> Result<TopsAhead> {
        if self.engine.opts.fanouts.len() < 2 {
            return Err(Error::invalid_argument(
                "orchestration.hot_ratio",
                "embedding reuse needs at least two layers",
            ));
        }
        let tracer = self.engine.tracer.clone();
        let _s = tracer.slice_on(self.engine.acc, "sample top");
        let mut queued = Vec::with_capacity(batches.len());
        for b in batches {
            queued.push(self.engine.queue_ahead(b.seeds, b.seed, 1)?);
        }
        let reading = self.engine.read_ahead(queued, READ_TOPS)?;
        let on_sibling = reading.on_sibling();
        let keys: Vec<(u64, Vec<(u32, u32)>)> = batches
            .iter()
            .map(|b| (b.key, b.exclude.to_vec()))
            .collect();
        let finish = move || -> Result<TopsRead> {
            let read = reading.wait(READ_TOPS)?;
            if read.len() != keys.len() {
                return Err(internal(&format!(
                    "{} batches read for {} queued",
                    read.len(),
                    keys.len()
                )));
            }
            let mut bottoms = Vec::with_capacity(read.len());
            let mut kept = Vec::with_capacity(read.len());
            for ((key, exclude), (batch, ids)) in keys.into_iter().zip(read) {
                bottoms.push(ids);
                kept.push(TopOf {
                    key,
                    batch,
                    exclude,
                });
            }
            Ok(TopsRead {
                bottoms,
                tops: PreparedTops(Box::new(Tops::<B> { batches: kept })),
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
    /// the compute stream when the sibling sampled them. A link batch's
    /// excluded pairs leave its blocks first, on the stream that sampled them
    /// (their reads of the kept edge counts wait for sampling work only).
    pub(super) fn adopt_tops_op(&mut self, tops: PreparedTops) -> Result<()> {
        let tops = tops
            .0
            .downcast::<Tops<B>>()
            .map_err(|_| internal("top layers sampled by this engine"))?;
        let sampler = self.sampler();
        for TopOf {
            key,
            mut batch,
            exclude,
        } in tops.batches
        {
            // The table stays for the bottom hop (`take_bottom`).
            if let Some(ex) = self.engine.excluded(&sampler, &exclude)? {
                DeviceEngine::<B>::exclude_batch(&sampler, &mut batch, &ex)?;
                self.hot.excludes.insert(key, ex);
            }
            self.engine.adopt(&mut batch)?;
            let num_bottom = batch
                .blocks
                .first()
                .map(|b| self.engine.dev.block_shape(b).0)
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

    /// The backend that sampled ahead: the sampling sibling, else the
    /// engine's own.
    fn sampler(&self) -> Arc<B> {
        self.engine
            .sibling
            .sampler()
            .map_or_else(|| Arc::clone(&self.engine.dev), Arc::clone)
    }

    pub(super) fn discard_prepared_op(&mut self) {
        self.hot.prepared.clear();
        self.hot.bottoms.clear();
        self.hot.excludes.clear();
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
        let Some(sampler) = self.engine.sibling.sampler().map(Arc::clone) else {
            return Ok(());
        };
        if batches.is_empty() {
            return Ok(());
        }
        let tracer = self.engine.tracer.clone();
        let _s = tracer.slice_on(self.engine.acc, "sample bottom ahead");
        let fanout = self.engine.opts.fanouts[0];
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
                self.engine.h2d += nd as u64;
                Some(buf)
            };
            let dst = top.src.first().ok_or_else(|| internal("bottom ids"))?;
            queued.push(
                sampler
                    .sample_hop_queued(
                        &self.engine.graph,
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
    pub(super) fn take_bottom(&mut self, key: u64) -> Result<Option<PreparedBottom<B>>> {
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
                .engine
                .sibling
                .sampler()
                .map(Arc::clone)
                .ok_or_else(|| internal("the sampling sibling"))?;
            let read = {
                let _s = self.engine.tracer.slice_on(self.engine.acc, "bottom read");
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
                let excluded = match self.hot.excludes.get(&k) {
                    Some(ex) => {
                        DeviceEngine::<B>::exclude_batch(&sampler, &mut batch, ex)?;
                        true
                    }
                    None => false,
                };
                self.engine
                    .dev
                    .adopt_batch(&sampler, &mut batch)
                    .map_err(dev_err("handing the bottom hop to the compute stream"))?;
                let (Some(block), Some(src)) = (batch.blocks.pop(), batch.src_ids.pop()) else {
                    return Err(internal("a bottom hop"));
                };
                let n_src = self.engine.dev.block_shape(&block).0;
                self.hot.bottoms.insert(
                    k,
                    PreparedBottom {
                        block,
                        src,
                        n_src,
                        skip,
                        excluded,
                    },
                );
            }
        }
        Ok(self.hot.bottoms.remove(&key))
    }
}
