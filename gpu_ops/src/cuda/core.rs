//! [`DeviceCore`] for [`CudaBackend`]: its associated types — each defined in
//! its op family's file, the stream and event handles in `device.rs` — and the
//! core methods (kind, description, streams, events, synchronization, memory
//! info, precision). Kept apart from `device.rs` so that the backend struct does
//! not depend on every op file.

use cudarc::driver::{result, sys};

use super::alloc::CudaBuf;
use super::dense::CudaMask;
use super::device::{CudaBackend, CudaEventHandle, CudaStreamHandle};
use super::driver::drv;
use super::features::CudaFeatures;
use super::pinned::CudaPinned;
use super::sampling::{CudaBlock, CudaGraph};
use crate::backend::{DeviceCore, DeviceKind, Elem, MemoryInfo};
use crate::error::Result;

impl DeviceCore for CudaBackend {
    type Buf<T: Elem> = CudaBuf<T>;
    type Pinned<T: Elem> = CudaPinned<T>;
    type Stream = CudaStreamHandle;
    type Event = CudaEventHandle;
    type Graph = CudaGraph;
    type Block = CudaBlock;
    type Features = CudaFeatures;
    type Mask = CudaMask;

    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn describe(&self) -> String {
        let i = &self.info;
        format!(
            "{} (cuda:{}), compute capability {}.{}, {} SMs, {:.1} GiB",
            i.name,
            i.ordinal,
            i.cc.0,
            i.cc.1,
            i.sm_count,
            i.total_mem as f64 / (1u64 << 30) as f64
        )
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        self.bind()?;
        let (free, total) = result::mem_get_info().map_err(drv("cuMemGetInfo"))?;
        Ok(MemoryInfo { free, total })
    }

    /// Sets the cuBLAS math mode of this backend's handle: TF32 tensor-core
    /// products (`CUBLAS_TF32_TENSOR_OP_MATH`) or the default fp32.
    fn set_precision(&self, precision: crate::Precision) -> Result<()> {
        self.set_blas_math(precision)
    }

    /// The math mode set by [`DeviceCore::set_precision`].
    fn precision(&self) -> crate::Precision {
        self.blas_math()
    }

    fn transfer_stats(&self) -> crate::backend::TransferStats {
        let mut t = self.transfers.get();
        t.zero_fills = self.allocator_stats().zeroed;
        t
    }

    fn stream(&self) -> &CudaStreamHandle {
        &self.compute
    }

    fn new_stream(&self) -> Result<CudaStreamHandle> {
        let inner = self.ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        Ok(CudaStreamHandle { inner })
    }

    fn record_event(&self, stream: &CudaStreamHandle) -> Result<CudaEventHandle> {
        let inner = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("cuEventCreate"))?;
        inner.record(&stream.inner).map_err(drv("cuEventRecord"))?;
        Ok(CudaEventHandle { inner })
    }

    fn wait_event(&self, stream: &CudaStreamHandle, event: &CudaEventHandle) -> Result<()> {
        stream
            .inner
            .wait(&event.inner)
            .map_err(drv("cuStreamWaitEvent"))
    }

    fn elapsed_ms(&self, start: &CudaEventHandle, end: &CudaEventHandle) -> Result<f32> {
        start
            .inner
            .elapsed_ms(&end.inner)
            .map_err(drv("cuEventElapsedTime"))
    }

    fn synchronize(&self, stream: &CudaStreamHandle) -> Result<()> {
        if self.is_compute(stream) {
            return self.sync_compute();
        }
        self.transfers.sync();
        self.bind()?;
        stream
            .inner
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        match self.pool.take_deferred() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// `cuEventSynchronize`. The fault word and the deferred error slot are
    /// left alone: they belong to the thread issuing compute work, which reads
    /// them at its next synchronization.
    fn wait_host(&self, event: &CudaEventHandle) -> Result<()> {
        self.transfers.event_wait();
        event.inner.synchronize().map_err(drv("cuEventSynchronize"))
    }
}
