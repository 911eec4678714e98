//! [`DeviceMemory`] for the CUDA backend: allocation from the caching allocator
//! (`alloc.rs`), pinned buffers (`pinned.rs`), host ↔ device copies, device copies
//! and fills.
//!
//! Copies name their stream. On a stream other than the compute stream, an upload or
//! download first waits for the buffer's `ready` event (so it runs after the zeroing
//! and the previous owner of a recycled block, see `alloc.rs`), and an upload marks
//! the buffer as used on that stream, so its block is reused only after that stream's
//! work. Ordering against other work of the caller's is the caller's, through events.

use cudarc::driver::result;

use super::alloc::{CudaBuf, Init};
use super::device::{CudaBackend, CudaEventHandle, CudaStreamHandle};
use super::driver::drv;
use super::pinned::CudaPinned;
use crate::backend::{DeviceCore, DeviceMemory, Elem};
use crate::error::{GpuOpsError, Result};

impl CudaBackend {
    /// Orders a copy of `buf` on `stream` (protocol step 3 of `alloc.rs`).
    fn order_on<T: Elem>(&self, stream: &CudaStreamHandle, buf: &CudaBuf<T>) -> Result<()> {
        if self.is_compute(stream) {
            Ok(())
        } else {
            buf.wait_ready_on(&stream.inner)
        }
    }

    /// Host → device, `dst[..src.len()] = src`, on `stream`.
    pub(crate) fn upload_slice<T: Elem>(
        &self,
        stream: &CudaStreamHandle,
        src: &[T],
        dst: &mut CudaBuf<T>,
    ) -> Result<()> {
        dst.check_len("upload destination (elements of the source)", src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        self.order_on(stream, dst)?;
        if !self.is_compute(stream) {
            dst.mark_foreign(&stream.inner);
        }
        // SAFETY: `dst` holds at least `src.len()` elements (checked). `src` is
        // pageable memory: the driver stages it before returning, so it may be reused
        // right after; the device-side write is ordered on `stream`.
        unsafe { result::memcpy_htod_async(dst.raw(), src, stream.cu()) }
            .map_err(drv("cuMemcpyHtoDAsync"))
    }

    /// The copy of both pinned uploads: `dst[offset..offset + n] = src[..n]` on
    /// `stream`, lengths already checked by the caller.
    fn pinned_to_device<T: Elem>(
        &self,
        stream: &CudaStreamHandle,
        src: &CudaPinned<T>,
        n: usize,
        dst: &mut CudaBuf<T>,
        offset: usize,
    ) -> Result<()> {
        debug_assert!(n <= src.len() && offset + n <= dst.len());
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        self.order_on(stream, dst)?;
        if !self.is_compute(stream) {
            dst.mark_foreign(&stream.inner);
        }
        let addr = dst.raw() + (offset * size_of::<T>()) as u64;
        // SAFETY: `dst` holds at least `offset + n` elements (checked by the caller),
        // so `addr` starts `n` valid elements; `src` holds at least `n` elements and
        // is pinned memory that stays allocated until the copy is done (its Drop and
        // its mutable view wait for the event recorded just below).
        unsafe { result::memcpy_htod_async(addr, &src.as_slice()[..n], stream.cu()) }
            .map_err(drv("cuMemcpyHtoDAsync"))?;
        src.record_copy(&stream.inner)
    }

    /// Device → host, `dst = src[..dst.len()]`; returns when the copy is done. On the
    /// compute stream this is a synchronization point (device faults are reported).
    pub(crate) fn download_slice<T: Elem>(
        &self,
        stream: &CudaStreamHandle,
        src: &CudaBuf<T>,
        dst: &mut [T],
    ) -> Result<()> {
        src.check_len("download source (elements of the destination)", dst.len())?;
        self.bind()?;
        if !dst.is_empty() {
            self.order_on(stream, src)?;
            // SAFETY: `src` holds at least `dst.len()` elements (checked); `dst` is
            // borrowed mutably until the stream is synchronized below, so the copy
            // finishes before the host can touch it again.
            unsafe { result::memcpy_dtoh_async(dst, src.raw(), stream.cu()) }
                .map_err(drv("cuMemcpyDtoHAsync"))?;
        }
        self.synchronize(stream)
    }

    /// Device → pinned host, `dst[..n] = src[..n]`, asynchronous on `stream`
    /// ([`crate::DeviceMemory::download_pinned`]); lengths already checked by
    /// the caller.
    fn device_to_pinned<T: Elem>(
        &self,
        stream: &CudaStreamHandle,
        src: &CudaBuf<T>,
        n: usize,
        dst: &mut CudaPinned<T>,
    ) -> Result<()> {
        debug_assert!(n <= src.len() && n <= dst.len());
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        self.order_on(stream, src)?;
        // Obligation 4: copies still reading or writing `dst` finish first.
        dst.order_after_copies(&stream.inner)?;
        let host = &mut dst.as_mut_slice()[..n];
        // SAFETY: `src` holds at least `n` device elements and `host` is `n`
        // elements of pinned memory (checked by the caller). The memory stays
        // allocated until the copy is done (the buffer's Drop and its mutable
        // view wait for the event recorded just below), earlier copies touching
        // it come first (the wait above), and the host reads it only after
        // waiting for an event recorded after this copy (the caller's
        // obligation 3).
        unsafe { result::memcpy_dtoh_async(host, src.raw(), stream.cu()) }
            .map_err(drv("cuMemcpyDtoHAsync"))?;
        dst.record_copy(&stream.inner)
    }

    /// `dst[..len] = src[..len]` on the compute stream.
    pub(crate) fn copy_buf<T: Elem>(
        &self,
        src: &CudaBuf<T>,
        dst: &mut CudaBuf<T>,
        len: usize,
    ) -> Result<()> {
        src.check_len("copy source", len)?;
        dst.check_len("copy destination", len)?;
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both buffers hold at least `len` elements (checked) and are distinct
        // (one is borrowed mutably); the copy is ordered on the compute stream.
        unsafe { result::memcpy_dtod_async(dst.raw(), src.raw(), len * size_of::<T>(), self.cu()) }
            .map_err(drv("cuMemcpyDtoDAsync"))
    }
}

impl DeviceMemory for CudaBackend {
    /// A zeroed buffer (caching allocator).
    fn alloc<T: Elem>(&self, len: usize) -> Result<CudaBuf<T>> {
        self.buf(len, Init::Zeroed, "buffer")
    }

    fn alloc_uninit<T: Elem>(&self, len: usize) -> Result<CudaBuf<T>> {
        self.buf(len, Init::Uninit, "buffer")
    }

    fn len<T: Elem>(&self, buf: &CudaBuf<T>) -> usize {
        buf.len()
    }

    /// A zeroed pinned host buffer.
    fn alloc_pinned<T: Elem>(&self, len: usize) -> Result<CudaPinned<T>> {
        CudaPinned::new(&self.ctx, len)
    }

    fn pinned_slice<'a, T: Elem>(&self, p: &'a CudaPinned<T>) -> &'a [T] {
        p.as_slice()
    }

    fn pinned_slice_mut<'a, T: Elem>(&self, p: &'a mut CudaPinned<T>) -> &'a mut [T] {
        // Waiting for in-flight copies can only fail if the context is broken; the
        // error is then kept for the next synchronizing call and the view returned
        // without waiting (the trait requires the caller to have synchronized).
        if let Err(e) = p.wait_copies() {
            self.pool.defer(e);
        }
        p.as_mut_slice()
    }

    fn upload<T: Elem>(
        &self,
        stream: &CudaStreamHandle,
        src: &[T],
        dst: &mut CudaBuf<T>,
    ) -> Result<()> {
        self.transfers.upload(std::mem::size_of_val(src));
        self.upload_slice(stream, src, dst)
    }

    /// Pinned host → device, asynchronous on `stream`.
    fn upload_pinned<T: Elem>(
        &self,
        stream: &CudaStreamHandle,
        src: &CudaPinned<T>,
        dst: &mut CudaBuf<T>,
    ) -> Result<()> {
        self.transfers.upload(src.len() * std::mem::size_of::<T>());
        dst.check_len(
            "upload destination (elements of the pinned source)",
            src.len(),
        )?;
        self.pinned_to_device(stream, src, src.len(), dst, 0)
    }

    /// Pinned host → device into a slice, `dst[offset..offset + n] = src[..n]`,
    /// asynchronous on `stream` ([`crate::DeviceMemory::upload_pinned_at`]).
    fn upload_pinned_at<T: Elem>(
        &self,
        stream: &CudaStreamHandle,
        src: &CudaPinned<T>,
        n: usize,
        dst: &mut CudaBuf<T>,
        offset: usize,
    ) -> Result<()> {
        self.transfers.upload(n * std::mem::size_of::<T>());
        if n > src.len() {
            return Err(GpuOpsError::SizeMismatch {
                what: "upload_pinned_at source (n)",
                expected: n,
                found: src.len(),
            });
        }
        // An overflowing end saturates, which no buffer reaches.
        dst.check_len(
            "upload_pinned_at destination (offset + n)",
            offset.saturating_add(n),
        )?;
        self.pinned_to_device(stream, src, n, dst, offset)
    }

    fn download<T: Elem>(
        &self,
        stream: &CudaStreamHandle,
        src: &CudaBuf<T>,
        dst: &mut [T],
    ) -> Result<()> {
        self.transfers.download(std::mem::size_of_val(dst));
        self.download_slice(stream, src, dst)
    }

    /// Device → pinned host, asynchronous on `stream`
    /// ([`crate::DeviceMemory::download_pinned`]): one download, no
    /// synchronization.
    fn download_pinned<T: Elem>(
        &self,
        stream: &CudaStreamHandle,
        src: &CudaBuf<T>,
        n: usize,
        dst: &mut CudaPinned<T>,
    ) -> Result<()> {
        src.check_len("download_pinned source (n)", n)?;
        if n > dst.len() {
            return Err(GpuOpsError::SizeMismatch {
                what: "download_pinned destination (n)",
                expected: n,
                found: dst.len(),
            });
        }
        self.transfers.download(n * std::mem::size_of::<T>());
        self.device_to_pinned(stream, src, n, dst)
    }

    fn to_device<T: Elem>(&self, src: &[T]) -> Result<CudaBuf<T>> {
        // No zeroing: the upload overwrites every element.
        let mut b = self.buf(src.len(), Init::Uninit, "buffer")?;
        self.upload_slice(&self.compute, src, &mut b)?;
        Ok(b)
    }

    fn copy<T: Elem>(&self, src: &CudaBuf<T>, dst: &mut CudaBuf<T>, len: usize) -> Result<()> {
        self.copy_buf(src, dst, len)
    }

    fn fill_zero<T: Elem>(&self, buf: &mut CudaBuf<T>, len: usize) -> Result<()> {
        self.fill_bytes(buf, len, 0)
    }

    fn dlpack_device(&self) -> (i32, i32) {
        (2, self.info.ordinal as i32)
    }

    fn address<T: Elem>(&self, buf: &CudaBuf<T>) -> u64 {
        buf.raw()
    }

    fn hand_over<T: Elem>(
        &self,
        buf: &mut CudaBuf<T>,
        ready: &CudaEventHandle,
        stream: u64,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: `ready` is a live event of this context and `stream` a stream
        // handle of it the caller vouches for; the wait only adds an ordering edge.
        unsafe {
            result::stream::wait_event(
                stream as usize as cudarc::driver::sys::CUstream,
                ready.inner.cu_event(),
                cudarc::driver::sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(drv("cuStreamWaitEvent (handing a buffer over)"))?;
        buf.mark_foreign_raw(stream);
        Ok(())
    }
}
