//! Host-backend buffers ([`HostBuf`], the device and the pinned type), and the
//! prefix checks every op runs before it touches a buffer (contract item 2 of
//! [`crate::Backend`]). Streams and events are in `core.rs`.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use super::pool::HostPool;
use crate::backend::Elem;
use crate::error::{GpuOpsError, Result};

/// A "device" buffer of the host backend: a host vector (also its pinned buffer).
/// A buffer the backend allocated gives its storage back to the backend's pool
/// when dropped (`host/pool.rs`).
///
/// Derefs to the whole slice, so tests and host code can read it directly.
#[derive(Clone, Default)]
pub struct HostBuf<T: Elem> {
    data: Vec<T>,
    pool: Option<Arc<HostPool>>,
}

impl<T: Elem> std::fmt::Debug for HostBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("HostBuf").field(&self.data).finish()
    }
}

impl<T: Elem + PartialEq> PartialEq for HostBuf<T> {
    fn eq(&self, other: &Self) -> bool {
        self.data == other.data
    }
}

impl<T: Elem> Drop for HostBuf<T> {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give(std::mem::take(&mut self.data));
        }
    }
}

impl<T: Elem> HostBuf<T> {
    /// Wraps a vector.
    pub fn from_vec(v: Vec<T>) -> Self {
        Self {
            data: v,
            pool: None,
        }
    }

    /// Storage for `len` values from `pool` (returned to it on drop): a free
    /// block with whatever values it held, or a new, empty vector.
    fn storage_in(pool: &Arc<HostPool>, len: usize) -> Result<Vec<T>> {
        let mut data: Vec<T> = pool.take(len);
        data.try_reserve_exact(len.saturating_sub(data.len()))
            .map_err(|_| GpuOpsError::OutOfMemory {
                what: format!("host buffer of {len} {}", std::any::type_name::<T>()),
                requested: len.saturating_mul(std::mem::size_of::<T>()),
                available: 0,
            })?;
        Ok(data)
    }

    /// `len` zeros in storage from `pool` (returned to it on drop).
    pub(crate) fn zeroed_in(pool: &Arc<HostPool>, len: usize) -> Result<Self> {
        let mut data = Self::storage_in(pool, len)?;
        data.clear();
        data.resize(len, T::zeroed());
        Ok(Self {
            data,
            pool: Some(Arc::clone(pool)),
        })
    }

    /// `len` values the caller overwrites, in storage from `pool`: a reused
    /// block keeps its old values (no write: what `alloc_uninit` is for);
    /// only values the block never held are zeroed. With debug assertions
    /// (tests) every value is `0xFF` bytes instead, as [`HostBuf::poisoned`],
    /// so that an op reading what it should have written first shows.
    pub(crate) fn uninit_in(pool: &Arc<HostPool>, len: usize) -> Result<Self> {
        let mut data = Self::storage_in(pool, len)?;
        if data.len() >= len {
            data.truncate(len);
        } else {
            data.resize(len, T::zeroed());
        }
        if cfg!(debug_assertions) {
            bytemuck::cast_slice_mut::<T, u8>(&mut data).fill(0xFF);
        }
        Ok(Self {
            data,
            pool: Some(Arc::clone(pool)),
        })
    }

    /// A buffer of `len` zeros, or [`GpuOpsError::OutOfMemory`] when the allocation
    /// fails (the pages are zeroed by the allocator, so a large buffer costs nothing
    /// until it is touched).
    pub fn zeroed(len: usize) -> Result<Self> {
        let v = bytemuck::allocation::try_zeroed_slice_box::<T>(len)
            .map_err(|()| GpuOpsError::OutOfMemory {
                what: format!("host buffer of {len} {}", std::any::type_name::<T>()),
                requested: len.saturating_mul(std::mem::size_of::<T>()),
                available: 0,
            })?
            .into_vec();
        Ok(Self::from_vec(v))
    }

    /// A buffer of `len` elements filled with `0xFF` bytes (NaN for `f32`,
    /// the maximum for integers): [`crate::DeviceMemory::alloc_uninit`] on the host,
    /// so that an op reading what it should have written first shows in tests.
    pub fn poisoned(len: usize) -> Result<Self> {
        let mut b = Self::zeroed(len)?;
        bytemuck::cast_slice_mut::<T, u8>(&mut b.data).fill(0xFF);
        Ok(b)
    }

    /// Takes the vector out (its storage leaves the pool).
    pub fn into_vec(mut self) -> Vec<T> {
        self.pool = None;
        std::mem::take(&mut self.data)
    }

    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        &self.data
    }

    /// The elements, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.data
    }
}

impl<T: Elem> Deref for HostBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.data
    }
}

impl<T: Elem> DerefMut for HostBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.data
    }
}

impl<T: Elem> From<Vec<T>> for HostBuf<T> {
    fn from(v: Vec<T>) -> Self {
        Self::from_vec(v)
    }
}

/// `a · b`, or `InvalidArgument` naming the product.
pub(crate) fn mul(name: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| GpuOpsError::InvalidArgument {
            name,
            reason: format!("{a} × {b} overflows usize"),
        })
}

/// The first `len` elements of `buf`, or `SizeMismatch { what, expected: len, .. }`.
pub(crate) fn prefix<'a, T>(what: &'static str, buf: &'a [T], len: usize) -> Result<&'a [T]> {
    buf.get(..len).ok_or(GpuOpsError::SizeMismatch {
        what,
        expected: len,
        found: buf.len(),
    })
}

/// Mutable [`prefix`].
pub(crate) fn prefix_mut<'a, T>(
    what: &'static str,
    buf: &'a mut [T],
    len: usize,
) -> Result<&'a mut [T]> {
    let found = buf.len();
    buf.get_mut(..len).ok_or(GpuOpsError::SizeMismatch {
        what,
        expected: len,
        found,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_buffers_and_prefixes() {
        let mut b = HostBuf::<f32>::zeroed(5).unwrap();
        assert_eq!(b.as_slice(), &[0.0; 5]);
        b[2] = 1.5;
        assert_eq!(prefix("x", &b, 3).unwrap(), &[0.0, 0.0, 1.5]);
        assert!(matches!(
            prefix("x", &b, 6),
            Err(GpuOpsError::SizeMismatch {
                what: "x",
                expected: 6,
                found: 5
            })
        ));
        assert_eq!(prefix_mut("y", &mut b, 0).unwrap().len(), 0);
        assert!(prefix_mut("y", &mut b, 7).is_err());
        assert!(matches!(
            HostBuf::<u64>::zeroed(usize::MAX / 4),
            Err(GpuOpsError::OutOfMemory { .. })
        ));
        assert!(matches!(
            mul("m × k", usize::MAX, 2),
            Err(GpuOpsError::InvalidArgument { name: "m × k", .. })
        ));
    }
}
