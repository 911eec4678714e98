//! Device buffers copied to the host without blocking the thread that asks:
//! a pool of page-locked sets, reused. The layer path publishes layer 0's
//! weights to its CPU workers through it (`executor/layer/device/`), and both
//! executors read their deferred losses through it (`engine/losses.rs`).
//!
//! A blocking `to_host` on the compute stream makes the calling thread wait
//! until the device has drained every batch queued before it, and the device
//! then idles while the host issues the next work (0.28 ms per super-batch of
//! the layer path on an H200, docs/records/2026-11-26-h200.md).
//!
//! # Protocol
//! 1. **Issue** (the thread that owns the compute stream): take a *set* of
//!    page-locked buffers, one per tensor, from the pool (a new set when the
//!    pool has none), [`DeviceMemory::download_pinned`](gpu_ops::DeviceMemory::download_pinned)
//!    each tensor into its buffer on the **compute stream**, record an event
//!    after the copies and return a [`PendingCopy`] holding the set and the
//!    event. Nothing waits. On the compute stream the copies run after the
//!    work that wrote the tensors and before the next work, which may write
//!    them again in place, so they read exactly what was there at the call.
//!    (On another stream they would need events both ways; the compute stream
//!    needs none.)
//! 2. **Resolve** (any thread, [`PendingCopy::resolve_copies`]): wait for the
//!    event ([`DeviceCore::wait_host`](gpu_ops::DeviceCore::wait_host), counted
//!    as an event wait, not a synchronization) and copy the values out.
//! 3. **Return.** The set goes back to the pool when the handle is dropped:
//!    after its resolution, or unresolved (a newer copy replaced it first). It
//!    is out of the pool from step 1 until then, so a later copy never writes a
//!    buffer a reader is reading. An unresolved set may come back with its
//!    copies still in flight; the next download into it is ordered after them
//!    on the device (`download_pinned`'s obligation 4) and is read only after a
//!    wait on its own event.
//!
//! The pool keeps every set it made: as many as were ever out at once, so a
//! steady run allocates no pinned memory after its first copies.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use gpu_ops::Backend;
use parking_lot::Mutex;

use super::dev_err;
use crate::error::Result;

/// Layer 0's parameters on their way to the host (protocol step 1; the layer
/// path's publication): a `Send` handle that any thread resolves once.
pub(crate) trait PendingParams: Send {
    /// Step 2: waits for the copies and returns layer 0's tensors, in the
    /// model's order; the buffers go back to the pool (step 3).
    fn resolve(self: Box<Self>) -> Result<Vec<Vec<f32>>>;
}

/// One page-locked buffer per tensor copied.
type Set<B, T> = Vec<<B as gpu_ops::DeviceCore>::Pinned<T>>;

/// A pool of pinned sets (step 3), of one element type: layer 0's `f32`
/// tensors, or the deferred losses' `u64` slot words.
pub(crate) struct PinnedPool<B: Backend, T: gpu_ops::Elem> {
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
    pub(crate) fn download(
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

impl<B: Backend, T: gpu_ops::Elem> PinnedPool<B, T> {
    /// Sets allocated so far (tests).
    #[cfg(test)]
    pub(crate) fn sets_made(&self) -> usize {
        self.made.load(Ordering::Relaxed)
    }

    /// The host address of buffer `i` of every set in the pool now (tests:
    /// which set a copy takes).
    #[cfg(test)]
    pub(crate) fn addresses(&self, dev: &B, i: usize) -> Vec<usize> {
        self.free
            .lock()
            .iter()
            .map(|set| dev.pinned_slice(&set[i]).as_ptr() as usize)
            .collect()
    }
}
