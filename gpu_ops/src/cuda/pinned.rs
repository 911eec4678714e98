//! Page-locked host memory: pinned staging buffers ([`CudaPinned`]) and host arrays
//! the device reads zero-copy ([`HostRegion`]: graph topology and feature rows left
//! in host memory).
//!
//! A [`HostRegion`] is made from a `cpu_ops::HostArray`:
//! 1. the array is cloned (an `Arc` of the map or of the owned vector, no copy, and
//!    `HostArray` is immutable) and its pages registered with
//!    `cuMemHostRegister(DEVICEMAP | PORTABLE | READ_ONLY)`; the clone keeps the
//!    memory alive for the region's life. Owned arrays are registered in place
//!    too, not copied to pinned memory: a papers100M-sized graph generated in
//!    memory would otherwise hold its 57 GB of features twice;
//! 2. an array the driver refuses to register is copied into a
//!    `cuMemHostAlloc(DEVICEMAP | PORTABLE)` allocation.
//!
//! Either way kernels get a device pointer (`cuMemHostGetDevicePointer`) and read the
//! rows over the bus. Dropping a region first synchronizes the compute stream, since
//! kernels may still be reading it.

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use bytemuck::Pod;
use cpu_ops::HostArray;
use cudarc::driver::result;
use cudarc::driver::{sys, CudaContext, CudaStream};

use super::driver::drv;
use super::kernels::Ptr;
use crate::backend::Elem;
use crate::error::{GpuOpsError, Result};

/// A zeroed, page-locked host buffer (`cuMemHostAlloc`, portable) for asynchronous
/// copies.
///
/// Each asynchronous copy out of it or into it records the buffer's event; the
/// mutable view and `Drop` wait for that event, so the host never overwrites or
/// frees memory a copy is still reading or writing, and a download into it first
/// makes its stream wait for the event ([`CudaPinned::order_after_copies`]).
pub struct CudaPinned<T: Elem> {
    ptr: NonNull<T>,
    len: usize,
    /// Recorded after each async copy from this buffer (null for an empty buffer).
    event: sys::CUevent,
    ctx: Arc<CudaContext>,
    _owns: PhantomData<T>,
}

// SAFETY: the buffer owns its allocation like a `Box<[T]>` (T: Send + Sync); the event
// is a driver handle usable from any thread.
unsafe impl<T: Elem> Send for CudaPinned<T> {}
// SAFETY: shared access only reads the memory (and records/waits on the event, which
// the driver serializes).
unsafe impl<T: Elem> Sync for CudaPinned<T> {}

impl<T: Elem> fmt::Debug for CudaPinned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaPinned")
            .field("len", &self.len)
            .finish()
    }
}

impl<T: Elem> CudaPinned<T> {
    /// A zeroed pinned buffer of `len` elements.
    pub(crate) fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| GpuOpsError::InvalidArgument {
                name: "len",
                reason: format!("{len} pinned elements of {} bytes overflow", size_of::<T>()),
            })?;
        if bytes == 0 {
            return Ok(Self {
                ptr: NonNull::dangling(),
                len,
                event: std::ptr::null_mut(),
                ctx: ctx.clone(),
                _owns: PhantomData,
            });
        }
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(drv("cuEventCreate"))?;
        // SAFETY: a plain allocation of `bytes` bytes in the bound context.
        let raw = match unsafe { result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE) } {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: the event was just created and is not used.
                let _ = unsafe { result::event::destroy(event) };
                return Err(drv("cuMemHostAlloc")(e));
            }
        };
        let Some(ptr) = NonNull::new(raw as *mut T) else {
            // SAFETY: as above.
            let _ = unsafe { result::event::destroy(event) };
            return Err(GpuOpsError::Driver {
                op: "cuMemHostAlloc".into(),
                message: "returned a null pointer".into(),
            });
        };
        // SAFETY: `ptr` points to `bytes` writable bytes just allocated; all-zero bytes
        // are a valid `T` (T: Pod).
        unsafe { std::ptr::write_bytes(ptr.as_ptr() as *mut u8, 0, bytes) };
        Ok(Self {
            ptr,
            len,
            event,
            ctx: ctx.clone(),
            _owns: PhantomData,
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The host view.
    pub(crate) fn as_slice(&self) -> &[T] {
        // SAFETY: `ptr` is valid for `len` initialized elements (zeroed at creation,
        // then written only through `as_mut_slice` or by device→host copies that the
        // caller synchronized); for len 0 it is a dangling, aligned pointer.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The mutable host view (call [`CudaPinned::wait_copies`] first, so no copy is
    /// still reading what the host is about to overwrite).
    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The host address, for a device → host copy into the buffer (record it with
    /// [`CudaPinned::record_copy`], so `Drop` waits for it too).
    pub(crate) fn host_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// Blocks until every recorded copy out of the buffer has finished.
    pub(crate) fn wait_copies(&self) -> Result<()> {
        if self.event.is_null() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: the event is live and owned by this buffer.
        unsafe { result::event::synchronize(self.event) }.map_err(drv("cuEventSynchronize"))
    }

    /// Makes later work on `stream` wait (on the device) for every recorded copy
    /// out of or into the buffer.
    pub(crate) fn order_after_copies(&self, stream: &CudaStream) -> Result<()> {
        if self.event.is_null() {
            return Ok(());
        }
        // SAFETY: the event is live and owned by this buffer (an event never
        // recorded counts as complete); the wait only adds an ordering edge.
        unsafe {
            result::stream::wait_event(
                stream.cu_stream(),
                self.event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(drv("cuStreamWaitEvent"))
    }

    /// Records that a copy reading or writing the buffer was enqueued on `stream`.
    pub(crate) fn record_copy(&self, stream: &CudaStream) -> Result<()> {
        if self.event.is_null() {
            return Ok(());
        }
        // SAFETY: the event is live; recording it only marks the stream's position.
        unsafe { result::event::record(self.event, stream.cu_stream()) }
            .map_err(drv("cuEventRecord"))
    }
}

impl<T: Elem> Drop for CudaPinned<T> {
    fn drop(&mut self) {
        if self.event.is_null() {
            return;
        }
        // Errors cannot be returned from Drop; waiting is what matters, and a failed
        // wait means the context is broken anyway.
        let _ = self.wait_copies();
        // SAFETY: no copy reads the memory any more (waited above); the pointer came
        // from cuMemHostAlloc and the event from cuEventCreate, both owned here.
        unsafe {
            let _ = result::free_host(self.ptr.as_ptr() as *mut c_void);
            let _ = result::event::destroy(self.event);
        }
    }
}

/// How a [`HostRegion`] holds its memory.
enum Backing<T: Pod> {
    /// Nothing (0 bytes).
    Empty,
    /// A mapped `HostArray` registered in place; the clone keeps the mapping alive.
    Registered {
        host: *mut c_void,
        _keep: HostArray<T>,
    },
    /// A copy in `cuMemHostAlloc` memory.
    Copied { host: *mut c_void },
}

/// Host memory the device reads directly (zero-copy), see the module doc.
pub(crate) struct HostRegion<T: Pod> {
    dev: u64,
    len: usize,
    backing: Backing<T>,
    compute: Arc<CudaStream>,
}

// SAFETY: the region owns (or keeps alive) read-only host memory; the raw pointers
// are only passed to driver calls. HostArray<T> is Send + Sync for T: Pod.
unsafe impl<T: Pod> Send for HostRegion<T> {}
// SAFETY: shared access never writes the memory.
unsafe impl<T: Pod> Sync for HostRegion<T> {}

impl<T: Pod> fmt::Debug for HostRegion<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = match self.backing {
            Backing::Empty => "empty",
            Backing::Registered { .. } => "registered in place",
            Backing::Copied { .. } => "copied to pinned memory",
        };
        f.debug_struct("HostRegion")
            .field("len", &self.len)
            .field("backing", &how)
            .finish()
    }
}

impl<T: Pod> HostRegion<T> {
    /// Makes `array` readable by kernels on `compute`'s context (see the module doc).
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        compute: &Arc<CudaStream>,
        array: &HostArray<T>,
        what: &str,
    ) -> Result<Self> {
        let len = array.len();
        let bytes = std::mem::size_of_val(array.as_slice());
        let mut region = Self {
            dev: 0,
            len,
            backing: Backing::Empty,
            compute: compute.clone(),
        };
        if bytes == 0 {
            return Ok(region);
        }
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        {
            let keep = array.clone();
            let host = keep.as_slice().as_ptr() as *mut c_void;
            let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP
                | sys::CU_MEMHOSTREGISTER_PORTABLE
                | sys::CU_MEMHOSTREGISTER_READ_ONLY;
            // SAFETY: `host..host + bytes` is the array (mapped, or a shared owned
            // vector) kept alive by `keep` for the region's life and never written
            // (HostArray has no mutable access); the device only reads it.
            let registered = unsafe { sys::cuMemHostRegister_v2(host, bytes, flags) }.result();
            if registered.is_ok() {
                region.backing = Backing::Registered { host, _keep: keep };
                region.dev = device_pointer(host, what)?;
                return Ok(region);
            }
            // Fall through: copy instead (e.g. a driver that refuses file mappings).
            drop(keep);
        }
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: a plain allocation of `bytes` bytes in the bound context.
        let host = unsafe { result::malloc_host(bytes, flags) }
            .map_err(drv(&format!("cuMemHostAlloc ({what}, {bytes} bytes)")))?;
        region.backing = Backing::Copied { host };
        // SAFETY: `host` holds `bytes` writable bytes, the source slice as many
        // readable ones, and the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                array.as_slice().as_ptr() as *const u8,
                host as *mut u8,
                bytes,
            )
        };
        region.dev = device_pointer(host, what)?;
        Ok(region)
    }

    /// The device-side address of the first element (0 when empty).
    pub(crate) fn ptr(&self) -> Ptr<T> {
        Ptr::new(self.dev)
    }

    /// Whether the array was registered in place (no copy).
    pub(crate) fn is_registered(&self) -> bool {
        matches!(self.backing, Backing::Registered { .. })
    }
}

/// `cuMemHostGetDevicePointer` of a registered / mapped host address.
fn device_pointer(host: *mut c_void, what: &str) -> Result<u64> {
    let mut dev: sys::CUdeviceptr = 0;
    // SAFETY: `host` is page-locked, device-mapped memory of the bound context; the
    // call only writes `dev`.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) }
        .result()
        .map_err(drv(&format!("cuMemHostGetDevicePointer ({what})")))?;
    Ok(dev)
}

impl<T: Pod> Drop for HostRegion<T> {
    fn drop(&mut self) {
        if matches!(self.backing, Backing::Empty) {
            return;
        }
        // Kernels on the compute stream may still read the region.
        let _ = self.compute.context().bind_to_thread();
        let _ = self.compute.synchronize();
        match self.backing {
            Backing::Empty => {}
            Backing::Registered { host, .. } => {
                // SAFETY: `host` was registered by `new` and nothing reads it any more.
                let _ = unsafe { sys::cuMemHostUnregister(host) };
            }
            Backing::Copied { host } => {
                // SAFETY: `host` came from cuMemHostAlloc in `new` and nothing reads it.
                let _ = unsafe { result::free_host(host) };
            }
        }
    }
}
