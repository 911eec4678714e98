//! Host-backend memory objects: buffers, streams and events, and the prefix checks
//! every op runs before it touches a buffer (contract item 2 of [`crate::Backend`]).

use std::ops::{Deref, DerefMut};
use std::time::Instant;

use crate::backend::Elem;
use crate::error::{GpuOpsError, Result};

/// A "device" buffer of the host backend: a host vector (also its pinned buffer).
///
/// Derefs to the whole slice, so tests and host code can read it directly.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostBuf<T: Elem>(Vec<T>);

impl<T: Elem> HostBuf<T> {
    /// Wraps a vector.
    pub fn from_vec(v: Vec<T>) -> Self {
        Self(v)
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
        Ok(Self(v))
    }

    /// A buffer of `len` elements filled with `0xFF` bytes (NaN for `f32`,
    /// the maximum for integers): [`crate::DeviceMemory::alloc_uninit`] on the host,
    /// so that an op reading what it should have written first shows in tests.
    pub fn poisoned(len: usize) -> Result<Self> {
        let mut b = Self::zeroed(len)?;
        bytemuck::cast_slice_mut::<T, u8>(&mut b.0).fill(0xFF);
        Ok(b)
    }

    /// Takes the vector out.
    pub fn into_vec(self) -> Vec<T> {
        self.0
    }

    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        &self.0
    }

    /// The elements, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.0
    }
}

impl<T: Elem> Deref for HostBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T: Elem> DerefMut for HostBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.0
    }
}

impl<T: Elem> From<Vec<T>> for HostBuf<T> {
    fn from(v: Vec<T>) -> Self {
        Self(v)
    }
}

/// A host-backend stream: work on it completes before the call returns, so it only
/// carries an id (for traces).
#[derive(Debug, PartialEq, Eq)]
pub struct HostStream {
    id: u64,
}

impl HostStream {
    pub(crate) fn new(id: u64) -> Self {
        Self { id }
    }

    /// The stream's number (0 is the compute stream).
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// A host-backend event: the moment it was recorded (all earlier work is done by then).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostEvent {
    at: Instant,
}

impl HostEvent {
    pub(crate) fn now() -> Self {
        Self { at: Instant::now() }
    }

    /// When it was recorded.
    pub fn instant(&self) -> Instant {
        self.at
    }

    /// Milliseconds from `start` to `self` (negative when `start` is later, as CUDA's
    /// `cuEventElapsedTime` reports).
    pub(crate) fn ms_since(&self, start: &HostEvent) -> f32 {
        match self.at.checked_duration_since(start.at) {
            Some(d) => (d.as_secs_f64() * 1e3) as f32,
            None => -((start.at - self.at).as_secs_f64() * 1e3) as f32,
        }
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

    #[test]
    fn event_time_is_signed() {
        let a = HostEvent::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = HostEvent::now();
        assert!(b.ms_since(&a) >= 2.0);
        assert!(a.ms_since(&b) <= -2.0);
        assert_eq!(a.ms_since(&a), 0.0);
    }
}
