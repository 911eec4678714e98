//! Host-backend memory: "device" memory is host RAM (its size from `/proc/meminfo`),
//! and copies between host slices and buffers are `memcpy`s that finish before they
//! return.

use crate::backend::{Elem, MemoryInfo};
use crate::error::{GpuOpsError, Result};
use crate::host::buffer::{prefix, prefix_mut, HostBuf};

/// Where the kernel reports memory.
const MEMINFO: &str = "/proc/meminfo";

/// Free (`MemAvailable`) and total (`MemTotal`) host memory, from `/proc/meminfo`.
pub(crate) fn memory_info() -> Result<MemoryInfo> {
    let text = std::fs::read_to_string(MEMINFO).map_err(|e| GpuOpsError::Driver {
        op: format!("read {MEMINFO}"),
        message: e.to_string(),
    })?;
    parse_meminfo(&text)
}

/// Parses `/proc/meminfo` text (`Key:   <n> kB` lines): `MemAvailable` and `MemTotal`.
pub(crate) fn parse_meminfo(text: &str) -> Result<MemoryInfo> {
    let field = |key: &str| -> Result<usize> {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .ok_or_else(|| GpuOpsError::Driver {
                op: format!("parse {MEMINFO}"),
                message: format!("no `{key}:` line"),
            })?;
        let bad = || GpuOpsError::Driver {
            op: format!("parse {MEMINFO}"),
            message: format!("`{key}:{line}`: expected `<number> kB`"),
        };
        let mut words = line.split_whitespace();
        let kib: usize = words.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        if words.next() != Some("kB") || words.next().is_some() {
            return Err(bad());
        }
        kib.checked_mul(1024).ok_or_else(bad)
    };
    Ok(MemoryInfo {
        free: field("MemAvailable")?,
        total: field("MemTotal")?,
    })
}

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

/// [`crate::DenseOps::widen_bf16`].
pub(crate) fn widen_bf16(src: &HostBuf<u16>, n: usize, out: &mut HostBuf<f32>) -> Result<()> {
    let s = prefix("widen_bf16 source", src, n)?;
    for (o, &b) in prefix_mut("widen_bf16 output", out, n)?.iter_mut().zip(s) {
        *o = crate::bf16_bits_to_f32(b);
    }
    Ok(())
}

/// [`crate::DenseOps::widen_bf16_at`].
pub(crate) fn widen_bf16_at(
    src: &HostBuf<u16>,
    src_at: usize,
    n: usize,
    out: &mut HostBuf<f32>,
    out_at: usize,
) -> Result<()> {
    let s = prefix("widen_bf16_at source", src, src_at.saturating_add(n))?;
    let o = prefix_mut("widen_bf16_at output", out, out_at.saturating_add(n))?;
    for (o, &b) in o[out_at..].iter_mut().zip(&s[src_at..]) {
        *o = crate::bf16_bits_to_f32(b);
    }
    Ok(())
}

/// [`crate::DenseOps::scale`].
pub(crate) fn scale(x: &mut HostBuf<f32>, n: usize, alpha: f32) -> Result<()> {
    for v in prefix_mut("scale x", x, n)? {
        *v *= alpha;
    }
    Ok(())
}

/// [`crate::DenseOps::count_nonfinite`].
pub(crate) fn count_nonfinite(x: &HostBuf<f32>, n: usize, count: &mut HostBuf<u32>) -> Result<()> {
    crate::backend::check_count_len(n)?;
    let bad = prefix("count_nonfinite x", x, n)?
        .iter()
        .filter(|v| !v.is_finite())
        .count();
    let c = &mut prefix_mut("count_nonfinite count", count, 1)?[0];
    *c = c.wrapping_add(bad as u32);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo() {
        let text = "MemTotal:       24542964 kB\nMemFree:         1000 kB\n\
                    MemAvailable:   20000000 kB\nBuffers:  1 kB\n";
        let m = parse_meminfo(text).unwrap();
        assert_eq!(m.total, 24_542_964 * 1024);
        assert_eq!(m.free, 20_000_000 * 1024);
    }

    #[test]
    fn malformed_meminfo_is_an_error_naming_the_key() {
        for (text, key) in [
            ("MemTotal: 10 kB\n", "MemAvailable"),
            ("MemAvailable: x kB\nMemTotal: 10 kB\n", "MemAvailable"),
            ("MemAvailable: 5 kB\nMemTotal: 10 MB\n", "MemTotal"),
            ("MemAvailable: 5\nMemTotal: 10 kB\n", "MemAvailable"),
        ] {
            let err = parse_meminfo(text).unwrap_err().to_string();
            assert!(err.contains(key) && err.contains(MEMINFO), "{err}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_machine() {
        let m = memory_info().unwrap();
        assert!(m.total > 0 && m.free <= m.total, "{m:?}");
    }

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
