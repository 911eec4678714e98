//! [`DeviceMemory`]: allocation, pinned host buffers and copies, with the
//! ordering obligations of the asynchronous ones.

use super::core::DeviceCore;
use super::dtype::Elem;
use crate::error::Result;

/// Device memory: allocation, pinned host buffers, and copies between host and
/// device (ordered on a named stream) and within the device.
pub trait DeviceMemory: DeviceCore {
    /// A zeroed buffer of `len` elements (from the caching allocator on CUDA).
    fn alloc<T: Elem>(&self, len: usize) -> Result<Self::Buf<T>>;
    /// A buffer of `len` elements whose contents are unspecified: for outputs
    /// the next op overwrites (on CUDA no memset; the host backend fills it with
    /// `0xFF` bytes, NaN for `f32`, so a read before that write shows in tests).
    fn alloc_uninit<T: Elem>(&self, len: usize) -> Result<Self::Buf<T>>;
    /// Number of elements of `buf`.
    fn len<T: Elem>(&self, buf: &Self::Buf<T>) -> usize;
    /// A zeroed pinned host buffer of `len` elements.
    fn alloc_pinned<T: Elem>(&self, len: usize) -> Result<Self::Pinned<T>>;
    /// The host view of a pinned buffer.
    fn pinned_slice<'a, T: Elem>(&self, p: &'a Self::Pinned<T>) -> &'a [T];
    /// The mutable host view of a pinned buffer (the caller must not write while a
    /// copy from it is in flight: synchronize its stream first).
    fn pinned_slice_mut<'a, T: Elem>(&self, p: &'a mut Self::Pinned<T>) -> &'a mut [T];
    /// Host → device: `dst[..src.len()] = src`, ordered on `stream`.
    fn upload<T: Elem>(
        &self,
        stream: &Self::Stream,
        src: &[T],
        dst: &mut Self::Buf<T>,
    ) -> Result<()>;
    /// Pinned host → device, `dst[..src.len()] = src`, asynchronous on `stream`;
    /// the ordering obligations of [`DeviceMemory::upload_pinned_at`].
    fn upload_pinned<T: Elem>(
        &self,
        stream: &Self::Stream,
        src: &Self::Pinned<T>,
        dst: &mut Self::Buf<T>,
    ) -> Result<()>;
    /// Pinned host → device into a slice of a larger buffer:
    /// `dst[offset..offset + n] = src[..n]`, asynchronous on `stream` (e.g. rows a CPU
    /// worker computed, staged in pinned memory, placed at their row offset in a
    /// device-side table on a copy stream while compute runs).
    ///
    /// Ordering obligations (the same as [`DeviceMemory::upload_pinned`]'s):
    /// 1. The copy runs after earlier work on `stream` (on CUDA also after `dst`'s
    ///    allocation and zeroing, whatever stream it is).
    /// 2. Work on another stream that reads `dst[offset..offset + n]` must wait for
    ///    the copy: [`DeviceCore::record_event`] on `stream`, [`DeviceCore::wait_event`] on
    ///    the reader's stream.
    /// 3. Work on another stream that may still read or write that range must be
    ///    ordered before the copy the same way (its event waited for on `stream`).
    ///    Copies into disjoint ranges of one buffer need no ordering among themselves.
    /// 4. The host must not write `src[..n]` until the copy is done: synchronize
    ///    `stream`, or take [`DeviceMemory::pinned_slice_mut`], which on CUDA waits for the
    ///    last copy issued out of `src` (one event per pinned buffer: when copies from
    ///    one pinned buffer go to several streams, synchronize the others first).
    ///
    /// `n` beyond `src`'s length or `offset + n` beyond `dst`'s (also for `n = 0`,
    /// which copies nothing) is a
    /// [`GpuOpsError::SizeMismatch`](crate::GpuOpsError::SizeMismatch).
    fn upload_pinned_at<T: Elem>(
        &self,
        stream: &Self::Stream,
        src: &Self::Pinned<T>,
        n: usize,
        dst: &mut Self::Buf<T>,
        offset: usize,
    ) -> Result<()>;
    /// Device → host: `dst = src[..dst.len()]`; returns when the copy is done.
    fn download<T: Elem>(
        &self,
        stream: &Self::Stream,
        src: &Self::Buf<T>,
        dst: &mut [T],
    ) -> Result<()>;
    /// Device → pinned host, `dst[..n] = src[..n]`, asynchronous on `stream`: the call
    /// returns without waiting for the device (no synchronization; one download in
    /// [`TransferStats`](crate::TransferStats)). E.g. a parameter snapshot that the thread
    /// issuing training steps hands to CPU workers without waiting for the batches queued
    /// before it.
    ///
    /// Ordering obligations:
    /// 1. The copy reads `src[..n]` after earlier work on `stream` (on CUDA also
    ///    after `src`'s allocation and zeroing, whatever stream it is), and later
    ///    work on `stream` runs after it: an op that overwrites `src` on the same
    ///    stream afterwards (an optimizer step on the compute stream) does not
    ///    change what the copy reads.
    /// 2. Work on another stream that writes `src[..n]` must be ordered around the
    ///    copy through events, both ways: its event waited for on `stream` before
    ///    the call, or an event recorded on `stream` after the call waited for on
    ///    its stream. On a stream other than the compute stream `src` must also
    ///    outlive the copy (a dropped CUDA buffer's memory is reused in the compute
    ///    stream's order, which knows nothing of the copy).
    /// 3. The host must not read `dst[..n]` until the copy is done: record an event
    ///    on `stream` after the call and [`DeviceCore::wait_host`] on it (or
    ///    synchronize `stream`). [`DeviceMemory::pinned_slice`] does not wait;
    ///    [`DeviceMemory::pinned_slice_mut`] and dropping `dst` do (on CUDA, as
    ///    for uploads: one event per pinned buffer).
    /// 4. Copies already issued out of `dst` (uploads) or into it (earlier
    ///    downloads) finish before this one writes it: on CUDA `stream` waits for
    ///    the buffer's event on the device, without blocking the host.
    ///
    /// `n` beyond `src`'s or `dst`'s length is a
    /// [`GpuOpsError::SizeMismatch`](crate::GpuOpsError::SizeMismatch); `n = 0`
    /// copies nothing.
    fn download_pinned<T: Elem>(
        &self,
        stream: &Self::Stream,
        src: &Self::Buf<T>,
        n: usize,
        dst: &mut Self::Pinned<T>,
    ) -> Result<()>;
    /// Convenience: a new device buffer holding `src` (compute stream).
    fn to_device<T: Elem>(&self, src: &[T]) -> Result<Self::Buf<T>> {
        // The upload overwrites every element: no zeroing.
        let mut b = self.alloc_uninit(src.len())?;
        self.upload(self.stream(), src, &mut b)?;
        Ok(b)
    }
    /// Convenience: the first `len` elements of `src` on the host (compute stream).
    fn to_host<T: Elem>(&self, src: &Self::Buf<T>, len: usize) -> Result<Vec<T>> {
        let mut v = vec![T::default(); len];
        self.download(self.stream(), src, &mut v)?;
        Ok(v)
    }
    /// Device → device: `dst[..len] = src[..len]`.
    fn copy<T: Elem>(&self, src: &Self::Buf<T>, dst: &mut Self::Buf<T>, len: usize) -> Result<()>;
    /// `buf[..len] = 0`.
    fn fill_zero<T: Elem>(&self, buf: &mut Self::Buf<T>, len: usize) -> Result<()>;

    // ---- hand-over to another library (DLPack) ---------------------------------
    /// DLPack's device of this backend's buffers, `(device_type, device_id)`:
    /// `(1, 0)` (kDLCPU) on the host backend, `(2, ordinal)` (kDLCUDA) on CUDA.
    fn dlpack_device(&self) -> (i32, i32);
    /// The address of `buf`'s first element, for another library to read the
    /// buffer in place: a device pointer on CUDA, a host pointer on the host
    /// backend. Valid while `buf` lives.
    fn address<T: Elem>(&self, buf: &Self::Buf<T>) -> u64;
    /// Hands `buf` to work another library enqueues on `stream`, a raw CUDA
    /// stream handle of this device's primary context (`1` and `2` name CUDA's
    /// legacy and per-thread default streams):
    /// 1. `stream` waits for `ready` (an event of this backend recorded after
    ///    the buffer's last write) before the work it gets next;
    /// 2. when `buf` is dropped, its memory is reused only after the work
    ///    `stream` had enqueued by then.
    ///
    /// The host backend's work is done when its calls return: nothing to order.
    fn hand_over<T: Elem>(
        &self,
        buf: &mut Self::Buf<T>,
        ready: &Self::Event,
        stream: u64,
    ) -> Result<()>;
}
