//! Device prefix sums: the host side of `kernels/scan.cu` (a tile pass, a recursive
//! scan of the tile totals, an add pass), and small synchronous reads of single
//! values.

use cudarc::driver::result;

use super::alloc::{CudaBuf, Init};
use super::device::CudaBackend;
use super::driver::drv;
use super::kernels::{launch, Grid};
use crate::backend::Elem;
use crate::error::{GpuOpsError, Result};

/// Values per scan tile (`SCAN_TILE` in scan.cu).
const TILE: u64 = 1024;
/// Threads per scan block (`SCAN_THREADS` in scan.cu).
const TILE_THREADS: u32 = 256;

/// Tiles for `n` values, as a grid dimension.
fn tiles(n: usize) -> Result<u32> {
    u32::try_from((n as u64).div_ceil(TILE))
        .ok()
        .filter(|&t| t <= i32::MAX as u32)
        .ok_or_else(|| GpuOpsError::InvalidArgument {
            name: "n",
            reason: format!("{n} values are too many for one device scan"),
        })
}

impl CudaBackend {
    /// Exclusive prefix sum of `buf[..n]` in place, on the compute stream.
    pub(crate) fn scan_u32_in_place(&self, buf: &mut CudaBuf<u32>, n: usize) -> Result<()> {
        buf.check_len("scan input", n)?;
        let t = tiles(n)?;
        if t == 0 {
            return Ok(());
        }
        let mut sums = self.buf::<u32>(t as usize, Init::Uninit, "scan tile sums")?;
        let input = buf.ptr();
        launch::scan_u32_tiles {
            input,
            n: n as u64,
            out: buf.ptr_mut(),
            tile_sums: sums.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), Grid::exact(t, TILE_THREADS))?;
        if t > 1 {
            self.scan_u32_in_place(&mut sums, t as usize)?;
            launch::scan_u32_add {
                out: buf.ptr_mut(),
                n: n as u64,
                tile_offsets: sums.ptr(),
            }
            .launch(
                &self.kernels,
                self.cu(),
                Grid::threads_for(n as u64, self.kernels.max_blocks()),
            )?;
        }
        Ok(())
    }

    /// Exclusive prefix sum of `buf[..n]` in place, on the compute stream.
    pub(crate) fn scan_u64_in_place(&self, buf: &mut CudaBuf<u64>, n: usize) -> Result<()> {
        buf.check_len("scan input", n)?;
        let t = tiles(n)?;
        if t == 0 {
            return Ok(());
        }
        let mut sums = self.buf::<u64>(t as usize, Init::Uninit, "scan tile sums")?;
        let input = buf.ptr();
        launch::scan_u64_tiles {
            input,
            n: n as u64,
            out: buf.ptr_mut(),
            tile_sums: sums.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), Grid::exact(t, TILE_THREADS))?;
        if t > 1 {
            self.scan_u64_in_place(&mut sums, t as usize)?;
            launch::scan_u64_add {
                out: buf.ptr_mut(),
                n: n as u64,
                tile_offsets: sums.ptr(),
            }
            .launch(
                &self.kernels,
                self.cu(),
                Grid::threads_for(n as u64, self.kernels.max_blocks()),
            )?;
        }
        Ok(())
    }

    /// `buf[at]`, read after the compute stream finishes (then device faults and
    /// deferred errors are checked, as at every synchronization).
    pub(crate) fn read_at<T: Elem>(&self, buf: &CudaBuf<T>, at: usize) -> Result<T> {
        self.read_n::<T, 1>(buf, at).map(|[v]| v)
    }

    /// `buf[at..at + N]` in one read (one synchronization), checked as
    /// [`CudaBackend::read_at`].
    pub(crate) fn read_n<T: Elem, const N: usize>(
        &self,
        buf: &CudaBuf<T>,
        at: usize,
    ) -> Result<[T; N]> {
        buf.check_len("read range end", at.saturating_add(N))?;
        self.bind()?;
        let mut v = [T::default(); N];
        let addr = buf.raw() + (at * size_of::<T>()) as u64;
        // SAFETY: `addr` starts N elements of `buf` (checked above); the copy is
        // ordered on the compute stream after every write to them, and the stream
        // is synchronized before `v` is read.
        unsafe { result::memcpy_dtoh_async(&mut v[..], addr, self.cu()) }
            .map_err(drv("cuMemcpyDtoHAsync"))?;
        self.sync_compute()?;
        Ok(v)
    }

    /// Fills `buf[..len]` with the byte `value` (compute stream).
    pub(crate) fn fill_bytes<T: Elem>(
        &self,
        buf: &mut CudaBuf<T>,
        len: usize,
        value: u8,
    ) -> Result<()> {
        self.fill_bytes_at(buf, 0, len, value)
    }

    /// `buf[at..at + len]` set to bytes `value` on the compute stream.
    pub(crate) fn fill_bytes_at<T: Elem>(
        &self,
        buf: &mut CudaBuf<T>,
        at: usize,
        len: usize,
        value: u8,
    ) -> Result<()> {
        buf.check_len("fill range end", at.saturating_add(len))?;
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        let addr = buf.raw() + (at * size_of::<T>()) as u64;
        // SAFETY: `buf` holds at least `at + len` elements (checked), so `addr`
        // starts `len` of them; the memset is ordered on the compute stream.
        unsafe { result::memset_d8_async(addr, value, len * size_of::<T>(), self.cu()) }
            .map_err(drv("cuMemsetD8Async"))
    }
}
