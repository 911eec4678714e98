//! Layer 0's weights published to the CPU workers without blocking the
//! accelerator thread (issue 22, item 2): [`LayerDevice::publish_layer0`](super::LayerDevice::publish_layer0).
//!
//! Before, a publication downloaded each tensor with `to_host`, a blocking copy
//! on the compute stream: the accelerator thread waited until the device had
//! drained every batch queued before it, and the device then idled while the
//! host issued the next work (0.28 ms per super-batch on the H200).
//!
//! # Protocol
//! 1. **Issue** (the accelerator thread): take a *set* of page-locked buffers,
//!    one per layer-0 tensor, from the engine's pool (a new set when the pool
//!    has none), [`DeviceMemory::download_pinned`](gpu_ops::DeviceMemory::download_pinned)
//!    each tensor into its buffer on the **compute stream**, record an event
//!    after the copies and return a [`PendingParams`] holding the set and the
//!    event. Nothing waits. On the compute stream the copies run after the
//!    optimizer step that made this version and before the next one, which
//!    updates the parameters in place, so they read exactly this version. (On
//!    another stream they would need events both ways; the compute stream
//!    needs none.)
//! 2. **Resolve** (a CPU worker, [`PendingParams::resolve`]): wait for the
//!    event ([`DeviceCore::wait_host`](gpu_ops::DeviceCore::wait_host), counted
//!    as an event wait, not a synchronization) and copy the tensors out.
//! 3. **Return.** The set goes back to the pool when the handle is dropped:
//!    after its resolution, or unresolved (a newer publication replaced it
//!    first). It is out of the pool from step 1 until then, so a later
//!    publication never writes a buffer a worker is reading. An unresolved set
//!    may come back with its copies still in flight; the next download into it
//!    is ordered after them on the device (`download_pinned`'s obligation 4)
//!    and is read only after a wait on its own event.
//!
//! The pool keeps every set it made: as many as were ever out at once (in the
//! pipeline, the one `Published` holds plus those workers are copying out), so
//! a steady run allocates no pinned memory after its first publications.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use gpu_ops::Backend;
use parking_lot::Mutex;

use super::{dev_err, DeviceEngine};
use crate::error::Result;

/// Layer 0's parameters on their way to the host (protocol step 1): a `Send`
/// handle that any thread resolves once.
pub(crate) trait PendingParams: Send {
    /// Step 2: waits for the copies and returns layer 0's tensors, in the
    /// model's order; the buffers go back to the pool (step 3).
    fn resolve(self: Box<Self>) -> Result<Vec<Vec<f32>>>;
}

/// One page-locked buffer per tensor copied.
type Set<B, T> = Vec<<B as gpu_ops::DeviceCore>::Pinned<T>>;

/// The engine's pool of pinned sets (step 3), of one element type: layer 0's
/// `f32` tensors, or the deferred losses' `u64` slot words
/// ([`DeviceEngine::queue_loss_read`](super::DeviceEngine::queue_loss_read)).
pub(super) struct PinnedPool<B: Backend, T: gpu_ops::Elem> {
    free: Arc<Mutex<Vec<Set<B, T>>>>,
    /// Sets allocated so far.
    made: AtomicUsize,
}

impl<B: Backend, T: gpu_ops::Elem> Default for PinnedPool<B, T> {
    fn default() -> Self {
        Self {
            free: Arc::default(),
            made: AtomicUsize::new(0),
        }
    }
}

impl<B: Backend, T: gpu_ops::Elem> PinnedPool<B, T> {
    /// Step 1 for `tensors` (their first `lens[i]` elements each): a pooled set
    /// (or a new one), every copy queued on the compute stream, an event after
    /// them; `what` names the copy in errors.
    pub(super) fn download(
        &self,
        dev: &Arc<B>,
        tensors: &[&B::Buf<T>],
        lens: Vec<usize>,
        what: &'static str,
    ) -> Result<PendingCopy<B, T>> {
        let fits = |set: &Set<B, T>| {
            set.len() == lens.len()
                && set
                    .iter()
                    .zip(&lens)
                    .all(|(b, &n)| dev.pinned_slice(b).len() >= n)
        };
        let taken = self.free.lock().pop().filter(fits);
        let mut set = match taken {
            Some(set) => set,
            None => {
                self.made.fetch_add(1, Ordering::Relaxed);
                lens.iter()
                    .map(|&n| dev.alloc_pinned::<T>(n))
                    .collect::<std::result::Result<_, _>>()
                    .map_err(dev_err(what))?
            }
        };
        let stream = dev.stream();
        for ((p, b), &n) in tensors.iter().zip(&mut set).zip(&lens) {
            dev.download_pinned(stream, p, n, b)
                .map_err(dev_err(what))?;
        }
        let event = dev.record_event(stream).map_err(dev_err(what))?;
        Ok(PendingCopy {
            dev: Arc::clone(dev),
            event,
            set,
            lens,
            what,
            pool: Arc::clone(&self.free),
        })
    }
}

/// A copy in flight (step 1's result): resolved once, on any thread.
pub(crate) struct PendingCopy<B: Backend, T: gpu_ops::Elem> {
    dev: Arc<B>,
    /// Recorded on the compute stream after the copies.
    event: B::Event,
    set: Set<B, T>,
    /// Each tensor's length (a prefix of its buffer).
    lens: Vec<usize>,
    /// Names the copy in errors.
    what: &'static str,
    pool: Arc<Mutex<Vec<Set<B, T>>>>,
}

impl<B: Backend, T: gpu_ops::Elem> PendingCopy<B, T> {
    /// Step 2: waits for the copies (an event wait, not a synchronization)
    /// and returns each tensor's elements; the set goes back to the pool when
    /// `self` is dropped (step 3).
    pub(crate) fn resolve_copies(&self) -> Result<Vec<Vec<T>>> {
        self.dev
            .wait_host(&self.event)
            .map_err(dev_err(self.what))?;
        Ok(self
            .set
            .iter()
            .zip(&self.lens)
            .map(|(b, &n)| self.dev.pinned_slice(b)[..n].to_vec())
            .collect())
    }
}

impl<B: Backend> PendingParams for PendingCopy<B, f32> {
    fn resolve(self: Box<Self>) -> Result<Vec<Vec<f32>>> {
        self.resolve_copies()
    }
}

impl<B: Backend, T: gpu_ops::Elem> Drop for PendingCopy<B, T> {
    /// Step 3.
    fn drop(&mut self) {
        self.pool.lock().push(std::mem::take(&mut self.set));
    }
}

impl<B: Backend> DeviceEngine<B> {
    /// Layer 0's parameter tensors on the device, in the model's order.
    pub(super) fn layer0_tensors(&self) -> Result<&[B::Buf<f32>]> {
        let range = self
            .model
            .layer_params(0)
            .map_err(dev_err("layer 0's parameters"))?;
        Ok(&self.model.params()[range])
    }

    /// Step 1 ([`LayerDevice::publish_layer0`](super::LayerDevice::publish_layer0)).
    pub(super) fn publish_layer0_op(&self) -> Result<Box<dyn PendingParams>> {
        let params = self.layer0_tensors()?;
        let lens = params.iter().map(|p| self.dev.len(p)).collect();
        let tensors: Vec<&B::Buf<f32>> = params.iter().collect();
        let what = "publishing layer 0's parameters";
        Ok(Box::new(
            self.publish.download(&self.dev, &tensors, lens, what)?,
        ))
    }

    /// Pinned sets the publication pool has allocated (tests).
    #[cfg(test)]
    pub(crate) fn publish_sets_made(&self) -> usize {
        self.publish.made.load(Ordering::Relaxed)
    }

    /// The host address of tensor `i` of every set in the pool now (tests:
    /// which set a publication takes).
    #[cfg(test)]
    pub(crate) fn publish_pool_addresses(&self, i: usize) -> Vec<usize> {
        self.publish
            .free
            .lock()
            .iter()
            .map(|set| self.dev.pinned_slice(&set[i]).as_ptr() as usize)
            .collect()
    }
}

#[cfg(test)]
#[path = "publish_tests.rs"]
mod tests;
