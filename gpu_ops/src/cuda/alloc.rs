//! The caching device allocator and the device buffer type.
//!
//! Training asks for the same few buffer shapes every batch; `cuMemAlloc` /
//! `cuMemFree` cost tens of microseconds each and `cuMemFree` synchronizes the
//! device. So a dropped [`CudaBuf`] does not free its memory: the block goes back to a
//! free list of its *size class*, and the next request of that class reuses it.
//!
//! # Protocol
//! 1. **Size classes.** A request of `b` bytes takes a block of `size_class(b)`
//!    bytes: at least 512; up to 256 MiB, the next quarter-octave step
//!    (`2^k · {1, 1.25, 1.5, 1.75}`, at most 25 % slack); above, the next multiple of
//!    2 MiB. Blocks are reused only within their class.
//! 2. **Stream order.** The pool is ordered on the backend's *compute stream*: a
//!    block dropped while compute work still uses it is safe to hand out again,
//!    because everything the next owner does on the compute stream runs after that
//!    work. Zeroing a new buffer is a `cuMemsetD8Async` on the compute stream.
//! 3. **Other streams.** Each buffer carries a `ready` event recorded on the compute
//!    stream when it was handed out; a copy on another stream first waits for it
//!    (so it runs after the zeroing and after the previous owner). A buffer used on
//!    another stream remembers that stream (one of the backend's, or another
//!    library's it was handed to); when it is dropped, the compute stream
//!    waits for that stream's work before the block can be reused.
//! 4. **Out of memory.** When `cuMemAlloc` fails, the pool synchronizes the compute
//!    stream, frees every cached block and tries once more; if that fails too the
//!    request returns [`GpuOpsError::OutOfMemory`].
//! 5. **Errors without a caller.** A driver error inside `Drop` cannot be returned;
//!    it is kept in the pool's *deferred error* slot and returned by the backend's
//!    next synchronizing call, and the block involved is leaked rather than reused.

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::{sys, CudaContext, CudaStream};

use super::driver::drv;
use super::kernels::{Ptr, PtrMut};
use super::stats::AllocatorStats;
use crate::backend::Elem;
use crate::error::{GpuOpsError, Result};

/// Smallest block handed out, in bytes.
const MIN_CLASS: usize = 512;
/// Requests above this many bytes round up to [`LARGE_GRANULE`] instead of a
/// quarter-octave step.
const LARGE_CLASS: usize = 256 << 20;
/// Granule of large blocks.
const LARGE_GRANULE: usize = 2 << 20;

/// The size class of a request of `bytes` bytes (`None` on overflow).
pub(crate) fn size_class(bytes: usize) -> Option<usize> {
    if bytes <= MIN_CLASS {
        return Some(MIN_CLASS);
    }
    if bytes > LARGE_CLASS {
        return bytes.checked_next_multiple_of(LARGE_GRANULE);
    }
    // p <= bytes < 2p with p >= 512, so step >= 128.
    let p = 1usize << (usize::BITS - 1 - bytes.leading_zeros());
    let step = p / 4;
    Some(bytes.div_ceil(step) * step)
}

/// Whether a new buffer's contents are zeroed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Init {
    /// `cuMemsetD8Async` to 0 on the compute stream.
    Zeroed,
    /// Left as the previous owner wrote it (for outputs a kernel overwrites fully).
    Uninit,
}

/// A CUDA event handle owned by the pool.
#[derive(Clone, Copy, Debug)]
struct RawEvent(sys::CUevent);

// SAFETY: a CUevent is an opaque driver handle; the driver API may be called with it
// from any thread.
unsafe impl Send for RawEvent {}

#[derive(Default)]
struct PoolState {
    free: HashMap<usize, Vec<sys::CUdeviceptr>>,
    events: Vec<RawEvent>,
    stats: AllocatorStats,
}

/// The caching allocator of one backend (one context, one compute stream).
pub(crate) struct Pool {
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    state: Mutex<PoolState>,
    deferred: Mutex<Option<GpuOpsError>>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool ordered on `compute`.
    pub(crate) fn new(ctx: Arc<CudaContext>, compute: Arc<CudaStream>) -> Arc<Self> {
        Arc::new(Self {
            ctx,
            compute,
            state: Mutex::new(PoolState::default()),
            deferred: Mutex::new(None),
        })
    }

    fn state(&self) -> MutexGuard<'_, PoolState> {
        // A panic while holding the lock leaves the lists consistent (every update is
        // a single push or pop), so a poisoned lock is still usable.
        self.state.lock()
    }

    /// The counters.
    pub(crate) fn stats(&self) -> AllocatorStats {
        self.state().stats
    }

    /// Keeps `err` for the next synchronizing call (the first one wins).
    pub(crate) fn defer(&self, err: GpuOpsError) {
        let mut slot = self.deferred.lock();
        if slot.is_none() {
            *slot = Some(err);
        }
    }

    /// Takes the deferred error, if any.
    pub(crate) fn take_deferred(&self) -> Option<GpuOpsError> {
        self.deferred.lock().take()
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))
    }

    /// A buffer of `len` elements; `what` names it in an out-of-memory error.
    pub(crate) fn alloc<T: Elem>(
        self: &Arc<Self>,
        len: usize,
        init: Init,
        what: &str,
    ) -> Result<CudaBuf<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            GpuOpsError::InvalidArgument {
                name: "len",
                reason: format!("{len} elements of {} bytes overflow", size_of::<T>()),
            }
        })?;
        if bytes == 0 {
            return Ok(CudaBuf::empty(self.clone()));
        }
        let class = size_class(bytes).ok_or_else(|| GpuOpsError::InvalidArgument {
            name: "len",
            reason: format!("{bytes} bytes overflow the allocator's size classes"),
        })?;
        self.bind()?;
        let (ptr, event) = {
            let mut st = self.state();
            let reused = st.free.get_mut(&class).and_then(Vec::pop);
            let event = st.events.pop();
            if reused.is_some() {
                st.stats.reuses += 1;
                st.stats.cached_bytes -= class;
            }
            (reused, event)
        };
        let ptr = match ptr {
            Some(p) => p,
            None => match self.device_alloc(class, what) {
                Ok(p) => p,
                Err(e) => {
                    if let Some(ev) = event {
                        self.state().events.push(ev);
                    }
                    return Err(e);
                }
            },
        };
        let event = match event {
            Some(e) => e,
            None => match result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING) {
                Ok(e) => RawEvent(e),
                Err(e) => {
                    self.give_back(ptr, class, None);
                    return Err(drv("cuEventCreate")(e));
                }
            },
        };
        self.finish_alloc(ptr, class, false, event, len, init)
    }

    /// A long-lived buffer of exactly `len` elements (rounded up to 512 bytes) that
    /// bypasses the size classes: `cuMemAlloc` now, `cuMemFree` when dropped (after
    /// the compute stream is done with it). For big, rarely replaced buffers (the
    /// feature cache, a graph's topology) whose class slack would waste memory.
    pub(crate) fn alloc_exact<T: Elem>(
        self: &Arc<Self>,
        len: usize,
        init: Init,
        what: &str,
    ) -> Result<CudaBuf<T>> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .and_then(|b| b.checked_next_multiple_of(MIN_CLASS))
            .ok_or_else(|| GpuOpsError::InvalidArgument {
                name: "len",
                reason: format!("{len} elements of {} bytes overflow", size_of::<T>()),
            })?;
        if bytes == 0 {
            return Ok(CudaBuf::empty(self.clone()));
        }
        self.bind()?;
        let ptr = self.device_alloc(bytes, what)?;
        let event = match self.state().events.pop() {
            Some(e) => e,
            None => match result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING) {
                Ok(e) => RawEvent(e),
                Err(e) => {
                    // SAFETY: the block was just allocated and nothing uses it.
                    let _ = unsafe { result::free_sync(ptr) };
                    return Err(drv("cuEventCreate")(e));
                }
            },
        };
        self.finish_alloc(ptr, bytes, true, event, len, init)
    }

    /// Accounts a new buffer, zeroes it if asked and records its `ready` event.
    fn finish_alloc<T: Elem>(
        self: &Arc<Self>,
        ptr: sys::CUdeviceptr,
        class: usize,
        exact: bool,
        event: RawEvent,
        len: usize,
        init: Init,
    ) -> Result<CudaBuf<T>> {
        {
            let mut st = self.state();
            st.stats.live_bytes += class;
            st.stats.zeroed += u64::from(init == Init::Zeroed);
            st.stats.peak_bytes = st
                .stats
                .peak_bytes
                .max(st.stats.live_bytes + st.stats.cached_bytes);
        }
        let buf = CudaBuf {
            raw: ptr,
            len,
            class,
            exact,
            ready: event.0,
            foreign: Vec::new(),
            pool: self.clone(),
            _elem: PhantomData,
        };
        let cu = self.compute.cu_stream();
        if init == Init::Zeroed {
            // SAFETY: `ptr` is a live block of `class >= len * size_of::<T>()` bytes
            // owned by `buf`; the memset is ordered on the compute stream after the
            // previous owner's work (protocol step 2).
            unsafe { result::memset_d8_async(ptr, 0, len * size_of::<T>(), cu) }
                .map_err(drv("cuMemsetD8Async"))?;
        }
        // SAFETY: `ready` is a live event of this context; recording it on the live
        // compute stream has no other effect.
        unsafe { result::event::record(buf.ready, cu) }.map_err(drv("cuEventRecord"))?;
        Ok(buf)
    }

    /// `cuMemAlloc` of `class` bytes, releasing the cache and retrying once on OOM.
    fn device_alloc(&self, class: usize, what: &str) -> Result<sys::CUdeviceptr> {
        // SAFETY: a plain allocation in the bound context.
        match unsafe { result::malloc_sync(class) } {
            Ok(p) => {
                self.state().stats.device_allocs += 1;
                return Ok(p);
            }
            Err(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => {}
            Err(e) => return Err(drv("cuMemAlloc")(e)),
        }
        self.release_cached()?;
        // SAFETY: as above.
        match unsafe { result::malloc_sync(class) } {
            Ok(p) => {
                self.state().stats.device_allocs += 1;
                Ok(p)
            }
            Err(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => {
                let available = result::mem_get_info().map(|(free, _)| free).unwrap_or(0);
                Err(GpuOpsError::OutOfMemory {
                    what: what.to_string(),
                    requested: class,
                    available,
                })
            }
            Err(e) => Err(drv("cuMemAlloc")(e)),
        }
    }

    /// Frees every cached block (after the compute stream has finished with them).
    /// Returns the bytes given back to the driver.
    pub(crate) fn release_cached(&self) -> Result<usize> {
        self.bind()?;
        self.compute
            .synchronize()
            .map_err(drv("cuStreamSynchronize (releasing cached blocks)"))?;
        let blocks: Vec<(usize, sys::CUdeviceptr)> = {
            let mut st = self.state();
            let blocks = st
                .free
                .drain()
                .flat_map(|(class, ptrs)| ptrs.into_iter().map(move |p| (class, p)))
                .collect();
            st.stats.cached_bytes = 0;
            blocks
        };
        let mut freed = 0;
        let mut first_err = None;
        for (class, p) in blocks {
            // SAFETY: `p` is a block of this pool that no buffer owns and that the
            // compute stream (its only user) has finished with.
            match unsafe { result::free_sync(p) } {
                Ok(()) => {
                    freed += class;
                    self.state().stats.device_frees += 1;
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(drv("cuMemFree")(e)),
            None => Ok(freed),
        }
    }

    /// Puts a block (and its event) back on the free lists.
    fn give_back(&self, ptr: sys::CUdeviceptr, class: usize, event: Option<RawEvent>) {
        let mut st = self.state();
        st.free.entry(class).or_default().push(ptr);
        st.stats.cached_bytes += class;
        if let Some(e) = event {
            st.events.push(e);
        }
    }

    /// The end of a buffer's life (protocol steps 3 and 5).
    fn release(
        &self,
        ptr: sys::CUdeviceptr,
        class: usize,
        exact: bool,
        ready: sys::CUevent,
        foreign: &[OtherStream],
    ) {
        self.state().stats.live_bytes -= class;
        let ordered = (|| -> Result<()> {
            if foreign.is_empty() {
                return Ok(());
            }
            self.bind()?;
            for s in foreign {
                // SAFETY: `ready` is a live event of this context and `s`, `compute`
                // are live streams of it; record + wait only add an ordering edge.
                unsafe {
                    result::event::record(ready, s.cu_stream()).map_err(drv("cuEventRecord"))?;
                    result::stream::wait_event(
                        self.compute.cu_stream(),
                        ready,
                        sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                    )
                    .map_err(drv("cuStreamWaitEvent"))?;
                }
            }
            Ok(())
        })();
        match ordered {
            Ok(()) if exact => {
                let freed = self.bind().and_then(|()| {
                    self.compute
                        .synchronize()
                        .map_err(drv("cuStreamSynchronize (freeing an exact block)"))?;
                    // SAFETY: the block is owned by the dropped buffer and the compute
                    // stream (ordered after every other user above) is idle.
                    unsafe { result::free_sync(ptr) }.map_err(drv("cuMemFree"))
                });
                let mut st = self.state();
                st.events.push(RawEvent(ready));
                match freed {
                    Ok(()) => st.stats.device_frees += 1,
                    Err(e) => {
                        drop(st);
                        self.defer(e);
                    }
                }
            }
            Ok(()) => self.give_back(ptr, class, Some(RawEvent(ready))),
            // The block may still be in use on a stream we could not order after:
            // leak it rather than hand it out again.
            Err(e) => self.defer(e),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Every buffer is gone (each holds an Arc of the pool); free the cache.
        if let Err(e) = self.release_cached() {
            // Nobody is left to report to; the context's teardown reclaims the memory.
            let _ = e;
        }
        let events = std::mem::take(&mut self.state().events);
        for e in events {
            // SAFETY: the pool owns these events and nothing waits on them any more.
            let _ = unsafe { result::event::destroy(e.0) };
        }
    }
}

/// A stream other than the compute stream that used a buffer: one of this
/// backend's, or another library's (a raw handle, e.g. PyTorch's current
/// stream after a DLPack hand-over; CUDA's legacy and per-thread default
/// streams are the handles 1 and 2).
#[derive(Clone)]
pub(crate) enum OtherStream {
    Ours(Arc<CudaStream>),
    Foreign(usize),
}

impl OtherStream {
    fn cu_stream(&self) -> sys::CUstream {
        match self {
            OtherStream::Ours(s) => s.cu_stream(),
            OtherStream::Foreign(raw) => *raw as sys::CUstream,
        }
    }
}

/// A buffer of `T` in device memory, from the caching allocator (see the module doc).
///
/// Buffers are created by the backend (`alloc`, `to_device`, and the ops that return
/// new buffers); dropping one returns its block to the pool.
pub struct CudaBuf<T: Elem> {
    raw: sys::CUdeviceptr,
    len: usize,
    class: usize,
    /// An exact block (freed on drop instead of cached).
    exact: bool,
    ready: sys::CUevent,
    foreign: Vec<OtherStream>,
    pool: Arc<Pool>,
    _elem: PhantomData<T>,
}

// SAFETY: the buffer owns its block; the raw pointer and event are driver handles
// used only through driver calls, which are thread-safe, and device-side access is
// ordered by streams, not by which host thread holds the buffer.
unsafe impl<T: Elem> Send for CudaBuf<T> {}
// SAFETY: `&CudaBuf` only allows enqueuing reads of the block (and recording its
// event), which the driver serializes.
unsafe impl<T: Elem> Sync for CudaBuf<T> {}

impl<T: Elem> fmt::Debug for CudaBuf<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBuf")
            .field("ptr", &format_args!("{:#x}", self.raw))
            .field("len", &self.len)
            .field("class", &self.class)
            .finish()
    }
}

impl<T: Elem> CudaBuf<T> {
    fn empty(pool: Arc<Pool>) -> Self {
        Self {
            raw: 0,
            len: 0,
            class: 0,
            exact: false,
            ready: std::ptr::null_mut(),
            foreign: Vec::new(),
            pool,
            _elem: PhantomData,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address (0 for an empty buffer).
    pub(crate) fn raw(&self) -> sys::CUdeviceptr {
        self.raw
    }

    /// A read-only kernel argument.
    pub(crate) fn ptr(&self) -> Ptr<T> {
        Ptr::new(self.raw)
    }

    /// A writable kernel argument (`&mut` so the borrow checker sees the write).
    pub(crate) fn ptr_mut(&mut self) -> PtrMut<T> {
        PtrMut::new(self.raw)
    }

    /// `SizeMismatch` unless the buffer holds at least `needed` elements.
    pub(crate) fn check_len(&self, what: &'static str, needed: usize) -> Result<()> {
        if self.len < needed {
            return Err(GpuOpsError::SizeMismatch {
                what,
                expected: needed,
                found: self.len,
            });
        }
        Ok(())
    }

    /// Makes `stream` wait until the buffer is ready (protocol step 3); a no-op for
    /// an empty buffer.
    pub(crate) fn wait_ready_on(&self, stream: &CudaStream) -> Result<()> {
        if self.raw == 0 {
            return Ok(());
        }
        // SAFETY: `ready` is a live event of the stream's context; the wait only adds
        // an ordering edge.
        unsafe {
            result::stream::wait_event(
                stream.cu_stream(),
                self.ready,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(drv("cuStreamWaitEvent"))
    }

    /// Remembers that work on `stream` (not the compute stream) used the buffer.
    pub(crate) fn mark_foreign(&mut self, stream: &Arc<CudaStream>) {
        if !self
            .foreign
            .iter()
            .any(|s| s.cu_stream() == stream.cu_stream())
        {
            self.foreign.push(OtherStream::Ours(stream.clone()));
        }
    }

    /// Remembers that work on another library's stream (a raw handle of this
    /// context) used the buffer (protocol step 3).
    pub(crate) fn mark_foreign_raw(&mut self, stream: u64) {
        let raw = OtherStream::Foreign(stream as usize);
        if !self
            .foreign
            .iter()
            .any(|s| s.cu_stream() == raw.cu_stream())
        {
            self.foreign.push(raw);
        }
    }
}

impl<T: Elem> Drop for CudaBuf<T> {
    fn drop(&mut self) {
        if self.raw != 0 {
            self.pool
                .release(self.raw, self.class, self.exact, self.ready, &self.foreign);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_bound_the_slack_and_are_stable() {
        assert_eq!(size_class(1), Some(512));
        assert_eq!(size_class(512), Some(512));
        assert_eq!(size_class(513), Some(640));
        assert_eq!(size_class(1024), Some(1024));
        assert_eq!(size_class(1025), Some(1280));
        assert_eq!(size_class(3 << 20), Some(3 << 20));
        assert_eq!(size_class((3 << 20) + 1), Some(7 << 19));
        assert_eq!(size_class(LARGE_CLASS), Some(LARGE_CLASS));
        assert_eq!(
            size_class(LARGE_CLASS + 1),
            Some(LARGE_CLASS + LARGE_GRANULE)
        );
        assert_eq!(size_class(usize::MAX), None);
        let mut b = 1usize;
        while b < (1 << 34) {
            for x in [b, b + 1, b + b / 3, 2 * b - 1] {
                let c = size_class(x).unwrap();
                assert!(c >= x, "class {c} below request {x}");
                // Classes are fixed points: a block serves every request of its class.
                assert_eq!(size_class(c), Some(c));
                if x > MIN_CLASS {
                    assert!(c - x <= x / 4, "class {c} wastes more than 25% of {x}");
                }
            }
            b = b * 3 / 2 + 1;
        }
    }
}
