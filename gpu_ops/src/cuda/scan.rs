//! Device prefix sums: the host side of `kernels/scan.cu` (tiles of 16,384 values,
//! one block each: a single launch up to 16,384 values, else a tile pass, a scan of
//! the tile totals — one block up to 2^28 values — and an add pass), and small
//! synchronous reads of single values.
//!
//! Fused producers (`sample_count_scan`, `unique_flag_scan` in `sample.cu`) run
//! the tile pass themselves: [`scan_grid`] shapes their launch and
//! `finish_scan` does the rest of a multi-tile scan.

use cudarc::driver::result;

use super::alloc::{CudaBuf, Init};
use super::device::CudaBackend;
use super::driver::drv;
use super::kernels::{launch, Grid, PtrMut};
use crate::backend::Elem;
use crate::error::{GpuOpsError, Result};

/// Values per scan tile (`SCAN_TILE` in common.cuh).
pub(crate) const TILE: u64 = 16_384;
/// Threads per scan block (`SCAN_THREADS` in common.cuh).
const TILE_THREADS: u32 = 1024;

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

/// The launch of a tile pass over `n` values: one block of `SCAN_THREADS` per tile
/// (`Grid::blocks` = the tile count; 0 for `n = 0`).
pub(crate) fn scan_grid(n: usize) -> Result<Grid> {
    Ok(Grid::exact(tiles(n)?, TILE_THREADS))
}

/// Kernel launches of one device scan of `n` values (a fused tile pass counts as
/// one): 0 for none, 1 up to one tile, else the tile pass, the scan of the tile
/// totals and the add pass.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn scan_launches(n: u64) -> u32 {
    match n.div_ceil(TILE) {
        0 => 0,
        1 => 1,
        t => 2 + scan_launches(t),
    }
}

/// An element type the scan kernels exist for: its tile pass (`scan_*_tiles`,
/// in place) and its add pass (`scan_*_add`).
pub(crate) trait ScanElem: Elem {
    /// Scans each tile of `buf[..n]` in place, writing tile totals to `tile_sums`
    /// (null for a single tile).
    fn tiles(
        be: &CudaBackend,
        buf: &mut CudaBuf<Self>,
        n: usize,
        tile_sums: PtrMut<Self>,
        grid: Grid,
    ) -> Result<()>;
    /// Adds each tile's scanned offset in `offsets` to `buf[..n]`.
    fn add(
        be: &CudaBackend,
        buf: &mut CudaBuf<Self>,
        n: usize,
        offsets: &CudaBuf<Self>,
        grid: Grid,
    ) -> Result<()>;
}

/// [`ScanElem`] for one type from its two kernels' launchers.
macro_rules! scan_elem {
    ($t:ty, $tiles:ident, $add:ident) => {
        impl ScanElem for $t {
            fn tiles(
                be: &CudaBackend,
                buf: &mut CudaBuf<Self>,
                n: usize,
                tile_sums: PtrMut<Self>,
                grid: Grid,
            ) -> Result<()> {
                launch::$tiles {
                    input: buf.ptr(),
                    n: n as u64,
                    out: buf.ptr_mut(),
                    tile_sums,
                }
                .launch(&be.kernels, be.cu(), grid)
            }
            fn add(
                be: &CudaBackend,
                buf: &mut CudaBuf<Self>,
                n: usize,
                offsets: &CudaBuf<Self>,
                grid: Grid,
            ) -> Result<()> {
                launch::$add {
                    out: buf.ptr_mut(),
                    n: n as u64,
                    tile_offsets: offsets.ptr(),
                }
                .launch(&be.kernels, be.cu(), grid)
            }
        }
    };
}
scan_elem!(u32, scan_u32_tiles, scan_u32_add);
scan_elem!(u64, scan_u64_tiles, scan_u64_add);

impl CudaBackend {
    /// Tile totals for a scan of `grid.blocks` tiles: `None` for a single tile
    /// (its kernel is given a null `tile_sums`).
    pub(crate) fn tile_sums<T: Elem>(&self, grid: Grid) -> Result<Option<CudaBuf<T>>> {
        if grid.blocks <= 1 {
            return Ok(None);
        }
        self.buf::<T>(grid.blocks as usize, Init::Uninit, "scan tile sums")
            .map(Some)
    }

    /// Exclusive prefix sum of `buf[..n]` in place, on the compute stream.
    pub(crate) fn scan_in_place<T: ScanElem>(&self, buf: &mut CudaBuf<T>, n: usize) -> Result<()> {
        buf.check_len("scan input", n)?;
        let grid = scan_grid(n)?;
        let mut sums = self.tile_sums::<T>(grid)?;
        T::tiles(
            self,
            buf,
            n,
            sums.as_mut().map_or(PtrMut::null(), CudaBuf::ptr_mut),
            grid,
        )?;
        self.finish_scan(buf, n, sums)
    }

    /// The rest of a multi-tile scan of `buf[..n]` whose tile pass wrote the
    /// per-tile scans and `sums` (nothing for a single tile).
    pub(crate) fn finish_scan<T: ScanElem>(
        &self,
        buf: &mut CudaBuf<T>,
        n: usize,
        sums: Option<CudaBuf<T>>,
    ) -> Result<()> {
        let Some(mut sums) = sums else {
            return Ok(());
        };
        let t = sums.len();
        self.scan_in_place(&mut sums, t)?;
        T::add(
            self,
            buf,
            n,
            &sums,
            Grid::threads_for(n as u64, self.kernels.max_blocks()),
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_up_to_a_tile_are_one_launch() {
        assert_eq!(scan_launches(0), 0);
        assert_eq!(scan_launches(1), 1);
        assert_eq!(scan_launches(TILE), 1);
        assert_eq!(scan_launches(TILE + 1), 3);
        assert_eq!(scan_launches(TILE * TILE), 3);
        assert_eq!(scan_launches(TILE * TILE + 1), 5);
        assert_eq!(scan_grid(0).unwrap().blocks, 0);
        assert_eq!(scan_grid(TILE as usize).unwrap().blocks, 1);
        assert_eq!(scan_grid(TILE as usize + 1).unwrap().blocks, 2);
    }
}
