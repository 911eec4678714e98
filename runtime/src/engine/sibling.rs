//! The sampling sibling (`device.sample_ahead`): a second backend on the same
//! device, with its own stream, allocator and fault word, so that batches
//! sampled ahead overlap the work queued on the compute stream; and the one
//! look-ahead mechanism both executors sample ahead with.
//!
//! # Sampling ahead
//! 1. **Queue** ([`DeviceEngine::queue_ahead`]): a batch's layers `from..L`
//!    are enqueued on the sibling (on the engine's backend where there is
//!    none) with [`Sampling::sample_queued_from`](gpu_ops::Sampling::sample_queued_from)
//!    (layer `l` drawn with `derive_seed(seed, l)`, so the blocks are those
//!    [`Sampling::sample`](gpu_ops::Sampling::sample) makes), their buffers
//!    sized by bounds; nothing is read.
//! 2. **Read** a group of queued batches with one synchronization, in one of
//!    two ways, because the two executors need different things back:
//!    - [`DeviceEngine::resolve_ahead`] reads their layer sizes at once, on
//!      the calling thread (the step executor: a group of up to
//!      [`SAMPLE_GROUP`] whole batches, read when its first batch is due);
//!    - [`DeviceEngine::read_ahead`] starts a read of their sizes *and* their
//!      bottom ids into page-locked memory, which [`GroupRead::wait`]
//!      finishes on any thread (the layer executor: a super-batch's top
//!      layers, whose bottom ids the planner thread waits for).
//! 3. **Adopt** ([`DeviceEngine::adopt`]): each batch is handed to the compute
//!    stream, which waits for the sibling's work; the sibling reuses its
//!    memory only after the compute stream's work queued before the drop.
//!
//! What a look-ahead keeps alive is counted once, in `engine/memory.rs` step
//! 4: up to [`AHEAD_BATCHES`] batches' blocks, whichever executor sampled them.

use std::sync::Arc;

use gpu_ops::Backend;

use super::{dev_err, DeviceEngine};
use crate::error::Result;

/// Batches the step executor's device sampler queues ahead at once: their
/// layer sizes come back in one read, so sampling synchronizes once per this
/// many batches.
pub(crate) const SAMPLE_GROUP: usize = 8;

/// The most batches whose blocks a look-ahead keeps alive at once: a group
/// being trained from and the next one queued (`2 · SAMPLE_GROUP`); the layer
/// path's two super-batches of `N` batches each fit it for `N ≤ 8`, and
/// `engine/memory.rs` step 8 counts the batches beyond.
pub(crate) const AHEAD_BATCHES: usize = 2 * SAMPLE_GROUP;

/// The backend's sampling sibling (module doc).
pub(crate) struct Sibling<B: Backend> {
    /// Made on first use; `None` where the backend has none (then the
    /// engine's backend samples). Shared with reads in flight
    /// ([`GroupRead`]), which another thread may finish.
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
    pub(crate) fn sampler(&self) -> Option<&Arc<B>> {
        self.sampler.as_ref()
    }

    /// The transfers of the sampling sibling.
    pub(crate) fn transfer_stats(&self) -> gpu_ops::TransferStats {
        self.sampler
            .as_ref()
            .map(|s| s.transfer_stats())
            .unwrap_or_default()
    }
}

/// A read of queued batches in flight (step 2, [`DeviceEngine::read_ahead`]).
pub(crate) struct GroupRead<B: Backend> {
    sampler: Arc<B>,
    reading: B::Reading,
    /// The sibling sampled them (the batches need adopting).
    on_sibling: bool,
}

impl<B: Backend> GroupRead<B> {
    /// Waits for the read (one synchronization of the sampling stream for the
    /// whole group), on any thread: every batch with its bottom sources' ids,
    /// in queue order, not yet adopted ([`DeviceEngine::adopt`]).
    #[allow(clippy::type_complexity)]
    pub(crate) fn wait(
        self,
        what: &'static str,
    ) -> Result<Vec<(gpu_ops::DeviceBatch<B>, Vec<u32>)>> {
        self.sampler
            .finish_read(self.reading)
            .map_err(dev_err(what))
    }

    /// Whether the batches came from the sampling sibling.
    pub(crate) fn on_sibling(&self) -> bool {
        self.on_sibling
    }
}

impl<B: Backend> DeviceEngine<B> {
    /// Opens the sampling sibling on first use when sampling ahead
    /// (`device.sample_ahead`).
    pub(crate) fn open_sibling(&mut self) -> Result<()> {
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

    /// The backend that samples ahead: the sibling, else the engine's own.
    fn ahead_sampler(&mut self) -> Result<Arc<B>> {
        self.open_sibling()?;
        Ok(self
            .sibling
            .sampler
            .as_ref()
            .map_or_else(|| Arc::clone(&self.dev), Arc::clone))
    }

    /// Step 1: enqueues layers `from..` of `seeds`' batch (training fanouts)
    /// without reading anything; the seeds' upload counts as host → device
    /// bytes.
    pub(crate) fn queue_ahead(
        &mut self,
        seeds: &[u32],
        seed: u64,
        from: usize,
    ) -> Result<B::Queued> {
        let sampler = self.ahead_sampler()?;
        let q = sampler
            .sample_queued_from(&self.graph, seeds, &self.opts.fanouts, from, seed)
            .map_err(dev_err("sampling"))?;
        if from > 0 {
            self.h2d += (seeds.len() * 4) as u64;
        }
        Ok(q)
    }

    /// Step 2, read at once: the batches of [`DeviceEngine::queue_ahead`], in
    /// order, with one synchronization for all of them, each without the pairs
    /// of its `excludes` entry ([`DeviceEngine::exclude_batch`], on the
    /// sampler's stream), adopted (step 3).
    pub(crate) fn resolve_ahead(
        &mut self,
        queued: Vec<B::Queued>,
        excludes: &[&[(u32, u32)]],
    ) -> Result<Vec<gpu_ops::DeviceBatch<B>>> {
        let sampler = self.ahead_sampler()?;
        let mut batches = sampler
            .resolve_queued(queued)
            .map_err(dev_err("sampling"))?;
        for (b, exclude) in batches.iter_mut().zip(excludes) {
            if let Some(ex) = self.excluded(&sampler, exclude)? {
                Self::exclude_batch(&sampler, b, &ex)?;
            }
        }
        for b in &mut batches {
            self.adopt(b)?;
        }
        Ok(batches)
    }

    /// Step 2, read later: starts one read of the queued batches' sizes and
    /// bottom ids; [`GroupRead::wait`] finishes it on any thread. Where there
    /// is no sibling the engine's own stream holds the batches and the read is
    /// finished by whoever waits as well.
    pub(crate) fn read_ahead(
        &mut self,
        queued: Vec<B::Queued>,
        what: &'static str,
    ) -> Result<GroupRead<B>> {
        let sampler = self.ahead_sampler()?;
        let reading = sampler.read_queued(queued).map_err(dev_err(what))?;
        Ok(GroupRead {
            on_sibling: self.sibling.sampler.is_some(),
            sampler,
            reading,
        })
    }

    /// Step 3: hands `batch`, sampled by the sibling, to the compute stream
    /// (nothing where the engine's own backend sampled it).
    pub(crate) fn adopt(&self, batch: &mut gpu_ops::DeviceBatch<B>) -> Result<()> {
        match &self.sibling.sampler {
            Some(s) => self
                .dev
                .adopt_batch(s, batch)
                .map_err(dev_err("handing a sampled batch to the compute stream")),
            None => Ok(()),
        }
    }

    /// Samples `seeds` on the device now: on the sampling sibling when
    /// sampling ahead (the batch adopted), else on the engine's backend;
    /// without the pairs `exclude` ([`DeviceEngine::exclude_batch`], on the
    /// sampler's stream).
    pub(crate) fn sample_on_device(
        &mut self,
        seeds: &[u32],
        seed: u64,
        exclude: &[(u32, u32)],
    ) -> Result<gpu_ops::DeviceBatch<B>> {
        let sampler = self.ahead_sampler()?;
        let mut b = sampler
            .sample(&self.graph, seeds, &self.opts.fanouts, seed)
            .map_err(dev_err("sampling"))?;
        if let Some(ex) = self.excluded(&sampler, exclude)? {
            Self::exclude_batch(&sampler, &mut b, &ex)?;
        }
        self.adopt(&mut b)?;
        Ok(b)
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
    pub(crate) fn transfer_stats_all(&self) -> gpu_ops::TransferStats {
        self.dev
            .transfer_stats()
            .plus(&self.sibling.transfer_stats())
    }
}
