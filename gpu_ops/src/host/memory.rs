//! The host backend's [`DeviceMemory`]: "device" memory is host RAM (its size is
//! read in `core.rs`), allocations come from the backend's pool (`pool.rs`), and
//! copies between host slices and buffers are `memcpy`s that finish before they
//! return (each counted in the backend's [`crate::TransferStats`] as the CUDA
//! backend counts its copies).

use crate::backend::{DeviceMemory, Elem};
use crate::error::Result;
use crate::host::buffer::{prefix, prefix_mut, HostBuf};
use crate::host::core::HostStream;
use crate::host::HostBackend;

/// `dst[..src.len()] = src`.
pub(crate) fn upload<T: Elem>(src: &[T], dst: &mut HostBuf<T>) -> Result<()> {
    prefix_mut("upload destination (source length)", dst, src.len())?.copy_from_slice(src);
    Ok(())
}

/// `dst[offset..offset + n] = src[..n]`.
pub(crate) fn upload_at<T: Elem>(
    src: &[T],
    n: usize,
    dst: &mut HostBuf<T>,
    offset: usize,
) -> Result<()> {
    let src = prefix("upload_pinned_at source (n)", src, n)?;
    // An overflowing end saturates, which no buffer reaches.
    let end = offset.saturating_add(n);
    prefix_mut("upload_pinned_at destination (offset + n)", dst, end)?[offset..]
        .copy_from_slice(src);
    Ok(())
}

/// `dst = src[..dst.len()]`.
pub(crate) fn download<T: Elem>(src: &HostBuf<T>, dst: &mut [T]) -> Result<()> {
    dst.copy_from_slice(prefix(
        "download source (destination length)",
        src,
        dst.len(),
    )?);
    Ok(())
}

/// `dst[..n] = src[..n]` ([`crate::DeviceMemory::download_pinned`]).
pub(crate) fn download_pinned<T: Elem>(
    src: &HostBuf<T>,
    n: usize,
    dst: &mut HostBuf<T>,
) -> Result<()> {
    let s = prefix("download_pinned source (n)", src, n)?;
    prefix_mut("download_pinned destination (n)", dst, n)?.copy_from_slice(s);
    Ok(())
}

/// `dst[..len] = src[..len]`.
pub(crate) fn copy<T: Elem>(src: &HostBuf<T>, dst: &mut HostBuf<T>, len: usize) -> Result<()> {
    let s = prefix("copy source", src, len)?;
    prefix_mut("copy destination", dst, len)?.copy_from_slice(s);
    Ok(())
}

/// `buf[..len] = 0`.
pub(crate) fn fill_zero<T: Elem>(buf: &mut HostBuf<T>, len: usize) -> Result<()> {
    prefix_mut("fill_zero buffer", buf, len)?.fill(<T as bytemuck::Zeroable>::zeroed());
    Ok(())
}

impl DeviceMemory for HostBackend {
    fn alloc<T: Elem>(&self, len: usize) -> Result<HostBuf<T>> {
        self.transfers.zero_fill();
        HostBuf::zeroed_in(&self.pool, len)
    }

    /// Unspecified contents (a reused block's old values). With debug
    /// assertions, poisoned with `0xFF` bytes (NaN for `f32`): a read before
    /// the write the contract requires gives NaN (or an out-of-range integer)
    /// in tests.
    fn alloc_uninit<T: Elem>(&self, len: usize) -> Result<HostBuf<T>> {
        HostBuf::uninit_in(&self.pool, len)
    }

    fn len<T: Elem>(&self, buf: &HostBuf<T>) -> usize {
        buf.as_slice().len()
    }

    fn alloc_pinned<T: Elem>(&self, len: usize) -> Result<HostBuf<T>> {
        HostBuf::zeroed(len)
    }

    fn pinned_slice<'a, T: Elem>(&self, p: &'a HostBuf<T>) -> &'a [T] {
        p.as_slice()
    }

    fn pinned_slice_mut<'a, T: Elem>(&self, p: &'a mut HostBuf<T>) -> &'a mut [T] {
        p.as_mut_slice()
    }

    fn upload<T: Elem>(&self, _stream: &HostStream, src: &[T], dst: &mut HostBuf<T>) -> Result<()> {
        upload(src, dst)?;
        self.transfers.upload(std::mem::size_of_val(src));
        Ok(())
    }

    fn upload_pinned<T: Elem>(
        &self,
        _stream: &HostStream,
        src: &HostBuf<T>,
        dst: &mut HostBuf<T>,
    ) -> Result<()> {
        upload(src, dst)?;
        self.transfers.upload(std::mem::size_of_val(src.as_slice()));
        Ok(())
    }

    fn upload_pinned_at<T: Elem>(
        &self,
        _stream: &HostStream,
        src: &HostBuf<T>,
        n: usize,
        dst: &mut HostBuf<T>,
        offset: usize,
    ) -> Result<()> {
        upload_at(src, n, dst, offset)?;
        self.transfers.upload(n * std::mem::size_of::<T>());
        Ok(())
    }

    fn download<T: Elem>(
        &self,
        _stream: &HostStream,
        src: &HostBuf<T>,
        dst: &mut [T],
    ) -> Result<()> {
        download(src, dst)?;
        self.transfers.download(std::mem::size_of_val(dst));
        self.transfers.sync();
        Ok(())
    }

    /// Copied at once (so every ordering obligation holds); counted as a
    /// download without a synchronization, as on CUDA.
    fn download_pinned<T: Elem>(
        &self,
        _stream: &HostStream,
        src: &HostBuf<T>,
        n: usize,
        dst: &mut HostBuf<T>,
    ) -> Result<()> {
        download_pinned(src, n, dst)?;
        self.transfers.download(n * std::mem::size_of::<T>());
        Ok(())
    }

    fn copy<T: Elem>(&self, src: &HostBuf<T>, dst: &mut HostBuf<T>, len: usize) -> Result<()> {
        copy(src, dst, len)
    }

    fn fill_zero<T: Elem>(&self, buf: &mut HostBuf<T>, len: usize) -> Result<()> {
        fill_zero(buf, len)
    }

    fn dlpack_device(&self) -> (i32, i32) {
        (1, 0)
    }

    fn address<T: Elem>(&self, buf: &HostBuf<T>) -> u64 {
        buf.as_slice().as_ptr() as u64
    }

    fn hand_over<T: Elem>(
        &self,
        _buf: &mut HostBuf<T>,
        _ready: &Self::Event,
        _stream: u64,
    ) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::GpuOpsError;

    #[test]
    fn copies_check_lengths() {
        let mut b = HostBuf::<u32>::zeroed(4).unwrap();
        upload(&[1, 2, 3], &mut b).unwrap();
        assert_eq!(b.as_slice(), &[1, 2, 3, 0]);
        assert!(matches!(
            upload(&[0; 5], &mut b),
            Err(GpuOpsError::SizeMismatch {
                expected: 5,
                found: 4,
                ..
            })
        ));
        let mut out = [0u32; 2];
        download(&b, &mut out).unwrap();
        assert_eq!(out, [1, 2]);
        assert!(download(&b, &mut [0u32; 5]).is_err());
        let mut c = HostBuf::<u32>::zeroed(3).unwrap();
        copy(&b, &mut c, 3).unwrap();
        assert_eq!(c.as_slice(), &[1, 2, 3]);
        assert!(copy(&b, &mut c, 4).is_err());
        fill_zero(&mut b, 2).unwrap();
        assert_eq!(b.as_slice(), &[0, 0, 3, 0]);
        assert!(fill_zero(&mut b, 5).is_err());
        upload_at(&[7, 8, 9], 2, &mut b, 2).unwrap();
        assert_eq!(b.as_slice(), &[0, 0, 7, 8]);
        upload_at(&[5], 0, &mut b, 4).unwrap();
        assert_eq!(b.as_slice(), &[0, 0, 7, 8]);
        for (n, offset, expected) in [(4, 0, 4), (2, 3, 5), (0, 5, 5), (1, usize::MAX, usize::MAX)]
        {
            let err = upload_at(&[1, 2, 3], n, &mut b, offset).unwrap_err();
            let ok = matches!(err, GpuOpsError::SizeMismatch { expected: e, .. } if e == expected);
            assert!(ok, "n {n} offset {offset}: {err}");
        }
        assert_eq!(b.as_slice(), &[0, 0, 7, 8]);
    }
}
