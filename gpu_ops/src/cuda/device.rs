//! [`CudaBackend`]: availability checks, context, the stream and event handles, the
//! fault word, and the cuBLAS handle. The ops live beside it, one file per family
//! ([`DeviceCore`](crate::DeviceCore)'s in `core.rs`).
//!
//! # Errors that happen on the device
//! A kernel cannot return an error. Where a kernel reads an index that lives in device
//! memory (ids to gather, labels, row indices), it checks the index, skips the bad one
//! (the output row becomes zeros) and records it in the backend's *fault word* (first
//! fault wins: code, value, limit). Every call that synchronizes the compute stream
//! ([`DeviceCore::synchronize`](crate::DeviceCore::synchronize) on it,
//! [`DeviceMemory::download`](crate::DeviceMemory::download), the loss, sampling,
//! unique relabeling) then reads the fault word and returns it as a typed
//! [`GpuOpsError::InvalidArgument`] naming the op, the value and the bound. Errors of
//! `Drop` implementations (see `alloc.rs`) are returned the same way.

use parking_lot::Mutex;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::cublas;
use cudarc::driver::result;
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};

use super::alloc::{CudaBuf, Init, Pool};
use super::driver::{blas_err, describe_driver_error, drv, panic_message};
use super::gemm_lt::{self, GemmLt, GemmPath};
use super::kernels::{require_nvrtc, Kernels, PtrMut};
use super::stats::AllocatorStats;
use crate::backend::DeviceKind;
use crate::error::{GpuOpsError, Result};

fn unavailable(reason: impl Into<String>) -> GpuOpsError {
    GpuOpsError::Unavailable {
        kind: DeviceKind::Cuda,
        reason: reason.into(),
    }
}

/// Why libcuda is unavailable.
const DRIVER_MISSING: &str =
    "libcuda.so (the NVIDIA driver) not found: no CUDA device on this machine";
/// Why libcublas is unavailable.
const CUBLAS_MISSING: &str = "libcublas.so (cuBLAS) not found: install CUDA 13 or the \
     `nvidia-cublas` 13 wheel and put its lib directory on LD_LIBRARY_PATH";

/// `Unavailable` naming the first missing library (driver, NVRTC, cuBLAS).
fn check_libraries() -> Result<()> {
    // SAFETY: `is_culib_present` only tries to dlopen the library under its known
    // names (closing it again); it has no other side effects.
    if !unsafe { sys::is_culib_present() } {
        return Err(unavailable(DRIVER_MISSING));
    }
    require_nvrtc()?;
    // SAFETY: as above, for libcublas.
    if !unsafe { cublas::sys::is_culib_present() } {
        return Err(unavailable(CUBLAS_MISSING));
    }
    Ok(())
}

/// Words of the fault record (code, value lo/hi, limit lo/hi, padding).
pub(crate) const FAULT_WORDS: usize = 8;

/// Fault codes (mirrored by `FAULT_*` in `kernels/common.cuh`).
fn fault_error(code: u32, value: u64, limit: u64) -> GpuOpsError {
    let (name, what) = match code {
        1 => (
            "ids",
            format!("gather: id {value} is not below the feature row count {limit}"),
        ),
        2 => (
            "idx",
            format!("index_select_rows: index {value} is not below the source row count {limit}"),
        ),
        3 => (
            "idx",
            format!("index_put_rows: index {value} is not below the destination row count {limit}"),
        ),
        4 => (
            "labels",
            format!("softmax_cross_entropy: label {value} is not below the class count {limit}"),
        ),
        5 => (
            "frontier",
            format!("sample: vertex {value} is not below the graph's vertex count {limit}"),
        ),
        6 => (
            "pairs",
            format!("pair scores: row id {value} is not below the embedding row count {limit}"),
        ),
        other => (
            "kernel",
            format!("unknown device fault code {other} (value {value}, limit {limit})"),
        ),
    };
    GpuOpsError::InvalidArgument {
        name,
        reason: format!("{what} (found on the device; the bad rows were skipped)"),
    }
}

/// A stream of the CUDA backend (the compute stream or one from
/// [`crate::DeviceCore::new_stream`]).
#[derive(Clone, Debug)]
pub struct CudaStreamHandle {
    pub(crate) inner: Arc<CudaStream>,
}

impl CudaStreamHandle {
    /// The raw stream.
    pub(crate) fn cu(&self) -> sys::CUstream {
        self.inner.cu_stream()
    }
}

/// A recorded point in a stream (timing enabled).
#[derive(Debug)]
pub struct CudaEventHandle {
    pub(crate) inner: CudaEvent,
}

/// A cuBLAS handle bound to the compute stream, and the math mode set on it.
struct BlasHandle(cublas::sys::cublasHandle_t, crate::Precision);

// SAFETY: the handle is only used under the backend's mutex (cuBLAS handles must not
// be used by two threads at once, but may move between threads).
unsafe impl Send for BlasHandle {}

/// What the device said about itself at start.
#[derive(Clone, Debug)]
pub(crate) struct DeviceInfo {
    pub(crate) ordinal: usize,
    pub(crate) name: String,
    pub(crate) cc: (u32, u32),
    pub(crate) total_mem: usize,
    pub(crate) sm_count: u32,
    pub(crate) can_map_host: bool,
}

/// The CUDA backend: one device (context), one compute stream, a caching allocator,
/// lazily compiled kernels and a cuBLAS handle.
///
/// [`CudaBackend::new`] returns [`GpuOpsError::Unavailable`] (never panics) when the
/// driver, NVRTC or cuBLAS library is missing, there is no device, or the ordinal is
/// out of range. Determinism and the other contracts: `docs/gpu.md`.
pub struct CudaBackend {
    pub(crate) fault: CudaBuf<u32>,
    /// The block counter of `act_backward_colsum` (its last block sums the
    /// partials): 0 between launches, each launch leaves it at 0. Launches on
    /// the compute stream only, so one word serves them all in order.
    pub(crate) ticket: CudaBuf<u32>,
    /// The multi-tensor Adam table last uploaded (its words and the buffer):
    /// `DenseOps::adam_step_all` reuses it while the parameters keep their buffers.
    pub(crate) adam_table: Mutex<Option<(Vec<u64>, CudaBuf<u64>)>>,
    blas: Mutex<BlasHandle>,
    /// cuBLASLt for `DenseOps::matmul` when `TANDEM_GEMM` asks for it
    /// (`gemm_lt.rs`); `None`: `cublasSgemm`.
    pub(crate) gemm_lt: Option<GemmLt>,
    pub(crate) kernels: Kernels,
    pub(crate) pool: Arc<Pool>,
    pub(crate) compute: CudaStreamHandle,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) info: DeviceInfo,
    /// Copies and synchronizations of this instance.
    pub(crate) transfers: crate::backend::TransferCounter,
    /// The pinned counts and bottom sources of the last finished
    /// `Sampling::read_queued`, reused by the next (`sampling.rs`).
    pub(crate) readback: Mutex<Option<ReadbackPair>>,
    /// The same for reads of queued hops only (their sizes): a slot of their
    /// own, so the two kinds of read, both in flight once a super-batch on
    /// the layer path, never take each other's pair and reallocate
    /// (`cuMemFreeHost` synchronizes).
    pub(crate) readback_hops: Mutex<Option<ReadbackPair>>,
}

/// Pinned layer counts and bottom sources of a queued read (`sampling.rs`).
pub(crate) type ReadbackPair = (
    super::pinned::CudaPinned<u64>,
    super::pinned::CudaPinned<u32>,
);

impl fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.info)
            .finish_non_exhaustive()
    }
}

impl CudaBackend {
    /// Opens CUDA device `ordinal`.
    ///
    /// Errors: [`GpuOpsError::Unavailable`] naming the missing library (libcuda,
    /// libnvrtc, libcublas), "no device", or the device count for a bad ordinal;
    /// [`GpuOpsError::Driver`] when a driver call fails on a present device.
    pub fn new(ordinal: usize) -> Result<Self> {
        check_libraries()?;
        match catch_unwind(AssertUnwindSafe(|| Self::open(ordinal))) {
            Ok(r) => r,
            Err(p) => Err(unavailable(format!(
                "the CUDA libraries failed to load: {}",
                panic_message(&*p)
            ))),
        }
    }

    fn open(ordinal: usize) -> Result<Self> {
        result::init().map_err(|e| {
            unavailable(format!(
                "cuInit failed ({}): no usable CUDA device on this machine",
                describe_driver_error(e)
            ))
        })?;
        let count = result::device::get_count().map_err(drv("cuDeviceGetCount"))?;
        let count = usize::try_from(count).unwrap_or(0);
        if count == 0 {
            return Err(unavailable(
                "no CUDA device found (cuDeviceGetCount returned 0)",
            ));
        }
        if ordinal >= count {
            return Err(unavailable(format!(
                "device ordinal {ordinal} does not exist: this machine has {count} CUDA device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("cuDevicePrimaryCtxRetain"))?;
        let attr = |a: sys::CUdevice_attribute, what: &'static str| -> Result<i32> {
            ctx.attribute(a).map_err(drv(what))
        };
        use sys::CUdevice_attribute as A;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("cuDeviceGetAttribute"))?;
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().map_err(drv("cuDeviceGetName"))?,
            cc: (major.max(0) as u32, minor.max(0) as u32),
            total_mem: ctx.total_mem().map_err(drv("cuDeviceTotalMem"))?,
            sm_count: attr(
                A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                "cuDeviceGetAttribute",
            )?
            .max(1) as u32,
            can_map_host: attr(
                A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY,
                "cuDeviceGetAttribute",
            )? != 0
                && attr(
                    A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
                    "cuDeviceGetAttribute",
                )? != 0,
        };
        let compute = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        let pool = Pool::new(ctx.clone(), compute.clone());
        let kernels = Kernels::new(ctx.clone(), info.cc, info.sm_count.saturating_mul(32));
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let handle = cublas::result::create_handle().map_err(blas_err("cublasCreate"))?;
        let blas = BlasHandle(handle, crate::Precision::Fp32);
        // SAFETY: `handle` is the live handle just created; `compute` is a live stream
        // of the bound context.
        unsafe { cublas::result::set_stream(handle, compute.cu_stream() as _) }
            .map_err(blas_err("cublasSetStream"))?;
        let fault = pool.alloc::<u32>(FAULT_WORDS, Init::Zeroed, "fault word")?;
        let ticket = pool.alloc::<u32>(1, Init::Zeroed, "column-sum ticket")?;
        let gemm_lt = match GemmPath::from_env()? {
            GemmPath::Cublas => None,
            path => Some(GemmLt::new(path, gemm_lt::workspace(&pool))?),
        };
        Ok(Self {
            fault,
            ticket,
            adam_table: Mutex::new(None),
            blas: Mutex::new(blas),
            gemm_lt,
            kernels,
            pool,
            compute: CudaStreamHandle { inner: compute },
            ctx,
            info,
            transfers: crate::backend::TransferCounter::default(),
            readback: Mutex::new(None),
            readback_hops: Mutex::new(None),
        })
    }

    /// Compiles and loads every kernel now (otherwise each family compiles on first
    /// use), e.g. before a timed run.
    pub fn warm_up(&self) -> Result<()> {
        self.kernels.warm_up()
    }

    /// The caching allocator's counters.
    pub fn allocator_stats(&self) -> AllocatorStats {
        self.pool.stats()
    }

    /// Frees the allocator's cached blocks (after the compute stream has finished
    /// with them); returns the bytes given back to the driver.
    pub fn release_cached_memory(&self) -> Result<usize> {
        self.pool.release_cached()
    }

    /// The device's compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.info.cc
    }

    /// Compiles every kernel family with NVRTC for compute capability `cc` (no device
    /// needed, only libnvrtc); returns `(file, PTX bytes)` per family. Used by the CI's
    /// NVRTC check and useful to validate kernels on a new toolkit.
    pub fn compile_kernels(cc: (u32, u32)) -> Result<Vec<(String, usize)>> {
        use super::kernels::{family_ptx, Family};
        Family::ALL
            .iter()
            .map(|f| {
                let ptx = family_ptx(*f, cc)?;
                let bytes = ptx.as_bytes().map_or(0, <[u8]>::len);
                Ok((f.file().to_string(), bytes))
            })
            .collect()
    }

    /// Compiles one CUDA C++ source with the backend's NVRTC options (the shared
    /// header is available as `#include "common.cuh"`) for compute capability `cc`;
    /// returns the PTX text. A compile error is [`GpuOpsError::Compile`] with NVRTC's
    /// log.
    pub fn compile_source(name: &str, source: &str, cc: (u32, u32)) -> Result<String> {
        use super::kernels::{compile_to_ptx, expand_source};
        let ptx = compile_to_ptx(name, &expand_source(name, source), cc)?;
        let text = ptx
            .as_bytes()
            .map(|b| {
                String::from_utf8_lossy(b)
                    .trim_end_matches('\0')
                    .to_string()
            })
            .unwrap_or_default();
        Ok(text)
    }

    // ---- internals used by the op files -------------------------------------------

    /// Makes the context current on this thread.
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))
    }

    /// The raw compute stream.
    pub(crate) fn cu(&self) -> sys::CUstream {
        self.compute.cu()
    }

    /// A buffer from the pool.
    pub(crate) fn buf<T: crate::Elem>(
        &self,
        len: usize,
        init: Init,
        what: &str,
    ) -> Result<CudaBuf<T>> {
        self.pool.alloc(len, init, what)
    }

    /// The fault word as a kernel argument. Kernels only write it through atomics
    /// (and the winner's detail words), so handing it to several launches is fine.
    pub(crate) fn fault_ptr(&self) -> PtrMut<u32> {
        PtrMut::new(self.fault.raw())
    }

    /// The cuBLAS handle (locked: one user at a time).
    /// cuBLAS's math mode for `precision` ([`DeviceCore::set_precision`](crate::DeviceCore::set_precision)).
    pub(crate) fn set_blas_math(&self, precision: crate::Precision) -> Result<()> {
        use cublas::sys::cublasMath_t as M;
        self.bind()?;
        let mut h = self.blas.lock();
        let mode = match precision {
            crate::Precision::Fp32 => M::CUBLAS_DEFAULT_MATH,
            crate::Precision::Tf32 => M::CUBLAS_TF32_TENSOR_OP_MATH,
        };
        // SAFETY: `h.0` is this backend's live handle, used under its mutex.
        unsafe { cublas::sys::cublasSetMathMode(h.0, mode) }
            .result()
            .map_err(blas_err("cublasSetMathMode"))?;
        h.1 = precision;
        Ok(())
    }

    /// The math mode set by [`CudaBackend::set_blas_math`].
    pub(crate) fn blas_math(&self) -> crate::Precision {
        self.blas.lock().1
    }

    pub(crate) fn with_blas<R>(&self, f: impl FnOnce(cublas::sys::cublasHandle_t) -> R) -> R {
        let h = self.blas.lock();
        f(h.0)
    }

    /// Is `s` the compute stream?
    pub(crate) fn is_compute(&self, s: &CudaStreamHandle) -> bool {
        s.cu() == self.cu()
    }

    /// Synchronizes the compute stream, then returns a deferred error or a device
    /// fault if there is one (clearing it).
    pub(crate) fn sync_compute(&self) -> Result<()> {
        self.transfers.sync();
        self.bind()?;
        self.compute
            .inner
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        self.check_errors()
    }

    /// Reads the fault word (the compute stream must be synchronized) and the
    /// deferred error slot.
    pub(crate) fn check_errors(&self) -> Result<()> {
        if let Some(e) = self.pool.take_deferred() {
            return Err(e);
        }
        let fault = &self.fault;
        let mut words = [0u32; FAULT_WORDS];
        // SAFETY: the fault buffer holds FAULT_WORDS u32s; the compute stream (its
        // only writer) is synchronized, so the synchronous copy reads a settled value.
        unsafe { result::memcpy_dtoh_sync(&mut words[..], fault.raw()) }
            .map_err(drv("cuMemcpyDtoH (fault word)"))?;
        if words[0] == 0 {
            return Ok(());
        }
        // SAFETY: as above; clearing the word re-arms it for the next fault.
        unsafe { result::memset_d8_sync(fault.raw(), 0, FAULT_WORDS * 4) }
            .map_err(drv("cuMemsetD8 (fault word)"))?;
        let value = words[1] as u64 | (words[2] as u64) << 32;
        let limit = words[3] as u64 | (words[4] as u64) << 32;
        Err(fault_error(words[0], value, limit))
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Let queued work finish before the handle, modules and buffers go away.
        if self.bind().is_ok() {
            let _ = self.compute.inner.synchronize();
            let h = self.blas.get_mut();
            // SAFETY: the handle is live, owned by this backend and no longer used.
            let _ = unsafe { cublas::result::destroy_handle(h.0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::DeviceCore;

    /// On a machine without the NVIDIA driver (like the CI's), the constructor names
    /// libcuda and does not panic; with a driver it opens the device or explains why
    /// not (still without panicking).
    #[test]
    fn new_reports_a_missing_driver_without_panicking() {
        // SAFETY: only tries to dlopen libcuda.
        let driver = unsafe { sys::is_culib_present() };
        match CudaBackend::new(0) {
            Err(GpuOpsError::Unavailable { kind, reason }) => {
                assert_eq!(kind, DeviceKind::Cuda);
                assert!(!reason.contains('\n'), "one line: {reason}");
                if !driver {
                    assert!(reason.contains("libcuda"), "{reason}");
                    assert_eq!(reason, DRIVER_MISSING);
                }
            }
            Ok(b) => {
                assert!(driver);
                assert!(b.describe().contains("compute capability"));
            }
            Err(e) => assert!(driver, "without a driver only Unavailable is possible: {e}"),
        }
    }

    #[test]
    fn a_bad_ordinal_is_unavailable_not_a_panic() {
        // SAFETY: only tries to dlopen libcuda.
        let driver = unsafe { sys::is_culib_present() };
        match CudaBackend::new(usize::MAX) {
            Err(GpuOpsError::Unavailable { reason, .. }) => {
                if driver {
                    assert!(
                        reason.contains("does not exist")
                            || reason.contains("no ")
                            || reason.contains("not found"),
                        "{reason}"
                    );
                } else {
                    assert!(reason.contains("libcuda"), "{reason}");
                }
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }

    #[test]
    fn fault_codes_name_the_argument_and_the_bound() {
        let e = fault_error(1, 42, 10).to_string();
        assert!(
            e.contains("`ids`") && e.contains("42") && e.contains("10"),
            "{e}"
        );
        let e = fault_error(4, 7, 3).to_string();
        assert!(e.contains("`labels`") && e.contains("class count 3"), "{e}");
        let e = fault_error(99, 1, 2).to_string();
        assert!(e.contains("unknown device fault code 99"), "{e}");
    }
}
