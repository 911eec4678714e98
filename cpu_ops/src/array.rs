//! `HostArray<T>`: a read-only array of plain data that is owned, a view into a
//! memory-mapped file, or a view of memory another owner keeps alive (a NumPy
//! array, a PyTorch tensor).
//!
//! The dataset store maps its file once and hands out `HostArray`s for the CSR
//! offsets, neighbor ids, features, labels and masks, so a 10 GB feature section is
//! paged in by the OS as rows are touched instead of being read up front. A host
//! language hands its buffers over the same way ([`HostArray::from_external`]):
//! the array holds the buffer's owner, so the elements are used in place.

use std::any::Any;
use std::fmt;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::Arc;

use bytemuck::Pod;
use memmap2::Mmap;

use crate::error::{CpuOpsError, Result};

/// A read-only slice of `T` backed by a shared `Vec<T>`, a shared memory map, or
/// memory an external owner keeps alive ([`HostArray::from_external`]).
///
/// Cloning is cheap either way: it clones an `Arc`, never the elements, so a
/// dataset cloned for several trainers (or handed to a device engine) holds one
/// copy of its arrays. [`HostArray::shares_storage`] tells whether two arrays
/// are views of the same elements.
pub struct HostArray<T: Pod> {
    repr: Repr<T>,
}

enum Repr<T> {
    /// Shared, never mutated after construction.
    Owned(Arc<Vec<T>>),
    Mapped {
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
    },
    /// `len` elements at `ptr`, valid while `owner` lives (the contract of
    /// [`HostArray::from_external`]).
    External {
        owner: Arc<dyn Any + Send + Sync>,
        ptr: NonNull<T>,
        len: usize,
    },
}

// SAFETY: every representation is read-only shared data. `Owned` and `Mapped`
// are `Send + Sync` as they are; `External` points at elements that
// `from_external`'s caller promised stay valid, unmodified and readable from any
// thread while `owner` (itself `Send + Sync`) lives, and `T: Pod` values are
// plain bytes.
unsafe impl<T: Pod + Send + Sync> Send for HostArray<T> {}
// SAFETY: as for `Send`: nothing is ever written through a `HostArray`.
unsafe impl<T: Pod + Send + Sync> Sync for HostArray<T> {}

impl<T: Pod> HostArray<T> {
    /// Wraps an owned vector. Clones of the array share it (no copy).
    pub fn from_vec(v: Vec<T>) -> Self {
        Self {
            repr: Repr::Owned(Arc::new(v)),
        }
    }

    /// Views `len` elements of `T` starting at byte `offset` of `map`.
    ///
    /// Fails when the region does not lie inside the mapping or is not aligned for `T`.
    pub fn from_mapped(map: Arc<Mmap>, offset: usize, len: usize) -> Result<Self> {
        let elem = std::any::type_name::<T>();
        let bytes =
            len.checked_mul(std::mem::size_of::<T>())
                .ok_or(CpuOpsError::BadMappedRegion {
                    offset,
                    len,
                    elem,
                    reason: "length overflows",
                })?;
        let end = offset
            .checked_add(bytes)
            .ok_or(CpuOpsError::BadMappedRegion {
                offset,
                len: bytes,
                elem,
                reason: "region end overflows",
            })?;
        if end > map.len() {
            return Err(CpuOpsError::BadMappedRegion {
                offset,
                len: bytes,
                elem,
                reason: "region extends past the end of the file",
            });
        }
        if bytemuck::try_cast_slice::<u8, T>(&map[offset..end]).is_err() {
            return Err(CpuOpsError::BadMappedRegion {
                offset,
                len: bytes,
                elem,
                reason: "region is not aligned for the element type",
            });
        }
        Ok(Self {
            repr: Repr::Mapped { map, offset, len },
        })
    }

    /// Views `len` elements at `ptr` that `owner` keeps alive, without copying
    /// them: a NumPy array's buffer with the array as its owner, say. Clones
    /// share `owner`; it is dropped with the last of them.
    ///
    /// # Safety
    /// `ptr` must point to `len` initialized elements of `T`, aligned for `T`,
    /// that stay valid and are not modified for as long as `owner` lives, and
    /// that may be read from any thread. (`ptr` may be dangling when `len` is 0.)
    pub unsafe fn from_external(
        owner: Arc<dyn Any + Send + Sync>,
        ptr: *const T,
        len: usize,
    ) -> Self {
        let ptr = match NonNull::new(ptr.cast_mut()) {
            Some(p) if len > 0 => p,
            _ => NonNull::dangling(),
        };
        Self {
            repr: Repr::External { owner, ptr, len },
        }
    }

    /// The same elements seen as `U`, a type of the same size and alignment
    /// (`i32` → `u32`, `i64` → `u64`, `bool` bytes → `u8`), sharing the storage:
    /// nothing is copied. `None` when the sizes or alignments differ.
    pub fn reinterpret<U: Pod>(self) -> Option<HostArray<U>>
    where
        T: Send + Sync,
    {
        if std::mem::size_of::<U>() != std::mem::size_of::<T>()
            || std::mem::align_of::<U>() != std::mem::align_of::<T>()
        {
            return None;
        }
        let repr = match self.repr {
            Repr::Mapped { map, offset, len } => Repr::Mapped { map, offset, len },
            Repr::External { owner, ptr, len } => Repr::External {
                owner,
                ptr: ptr.cast(),
                len,
            },
            Repr::Owned(v) => {
                let (ptr, len) = (v.as_ptr(), v.len());
                let owner: Arc<dyn Any + Send + Sync> = v;
                // SAFETY: `ptr` points at the `len` elements of the vector that
                // `owner` holds and never changes (it is shared, never mutated);
                // `U` has `T`'s size and alignment and is `Pod`, so every bit
                // pattern of a `T` is a valid `U`.
                return Some(unsafe { HostArray::from_external(owner, ptr.cast::<U>(), len) });
            }
        };
        Some(HostArray { repr })
    }

    /// The elements as a slice.
    pub fn as_slice(&self) -> &[T] {
        match &self.repr {
            Repr::Owned(v) => v.as_slice(),
            // SAFETY: `from_external`'s contract: `len` valid, aligned elements
            // kept alive and unmodified by `owner`, which `self` holds.
            Repr::External { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), *len)
            },
            Repr::Mapped { map, offset, len } => {
                let bytes = &map[*offset..*offset + *len * std::mem::size_of::<T>()];
                // Alignment and bounds were checked in `from_mapped`; the mapping is
                // immutable and kept alive by the Arc, so this cannot fail.
                bytemuck::cast_slice(bytes)
            }
        }
    }

    /// True when the data lives in a memory map rather than on the heap.
    pub fn is_mapped(&self) -> bool {
        matches!(self.repr, Repr::Mapped { .. })
    }

    /// Whether `self` and `other` view the same elements in memory (the same
    /// address and length): true for clones of one array, false for a copy
    /// (two empty arrays count as sharing).
    pub fn shares_storage(&self, other: &Self) -> bool {
        let (a, b) = (self.as_slice(), other.as_slice());
        a.len() == b.len() && std::ptr::eq(a.as_ptr(), b.as_ptr())
    }

    /// True when the elements belong to an external owner
    /// ([`HostArray::from_external`]).
    pub fn is_external(&self) -> bool {
        matches!(self.repr, Repr::External { .. })
    }

    /// Copies the data into an owned vector (or takes it when this is the only
    /// handle on an owned array).
    pub fn into_vec(self) -> Vec<T> {
        match self.repr {
            Repr::Owned(v) => Arc::try_unwrap(v).unwrap_or_else(|shared| shared.to_vec()),
            Repr::Mapped { .. } | Repr::External { .. } => self.as_slice().to_vec(),
        }
    }
}

impl<T: Pod> Deref for HostArray<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: Pod> Clone for HostArray<T> {
    fn clone(&self) -> Self {
        let repr = match &self.repr {
            Repr::Owned(v) => Repr::Owned(Arc::clone(v)),
            Repr::Mapped { map, offset, len } => Repr::Mapped {
                map: Arc::clone(map),
                offset: *offset,
                len: *len,
            },
            Repr::External { owner, ptr, len } => Repr::External {
                owner: Arc::clone(owner),
                ptr: *ptr,
                len: *len,
            },
        };
        Self { repr }
    }
}

impl<T: Pod> From<Vec<T>> for HostArray<T> {
    fn from(v: Vec<T>) -> Self {
        Self::from_vec(v)
    }
}

impl<T: Pod> fmt::Debug for HostArray<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostArray")
            .field("len", &self.len())
            .field("mapped", &self.is_mapped())
            .field("external", &self.is_external())
            .finish()
    }
}

impl<T: Pod + PartialEq> PartialEq for HostArray<T> {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn map_bytes(bytes: &[u8]) -> Arc<Mmap> {
        let mut f = tempfile_in_target();
        f.write_all(bytes).unwrap();
        f.flush().unwrap();
        // SAFETY: the file is private to this test and not modified while mapped.
        Arc::new(unsafe { Mmap::map(&f) }.unwrap())
    }

    fn tempfile_in_target() -> std::fs::File {
        let dir = std::env::temp_dir();
        let path = dir.join(format!(
            "cpu_ops_array_{}_{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    #[test]
    fn owned_and_mapped_agree() {
        let vals: Vec<u32> = (0..100).collect();
        let mut bytes = vec![0u8; 8];
        bytes.extend_from_slice(bytemuck::cast_slice(&vals));
        let map = map_bytes(&bytes);
        let mapped = HostArray::<u32>::from_mapped(map, 8, 100).unwrap();
        let owned = HostArray::from_vec(vals.clone());
        assert!(mapped.is_mapped());
        assert_eq!(mapped, owned);
        assert_eq!(mapped.clone().into_vec(), vals);
    }

    #[test]
    fn clones_share_the_elements_and_copies_do_not() {
        let a = HostArray::from_vec((0..1000u32).collect::<Vec<_>>());
        let b = a.clone();
        assert!(a.shares_storage(&b));
        assert_eq!(a.as_slice().as_ptr(), b.as_slice().as_ptr());
        let copy = HostArray::from_vec(a.as_slice().to_vec());
        assert_eq!(copy, a);
        assert!(!copy.shares_storage(&a));
        // Taking the vector out of a shared array copies it, leaving the other intact.
        let v = b.into_vec();
        assert_ne!(v.as_ptr(), a.as_slice().as_ptr());
        assert_eq!(v, a.as_slice());
        // The last handle gives its vector up without a copy.
        let ptr = a.as_slice().as_ptr();
        let owned = a.into_vec();
        assert_eq!(owned.as_ptr(), ptr);
    }

    /// An external buffer is used in place and lives as long as the last array
    /// viewing it; reinterpreting shares the storage of every representation.
    #[test]
    fn external_buffers_are_viewed_in_place_and_kept_alive() {
        struct Owner(Vec<i32>, Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Owner {
            fn drop(&mut self) {
                self.1.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let owner = Arc::new(Owner((0..10).collect(), Arc::clone(&dropped)));
        let ptr = owner.0.as_ptr();
        // SAFETY: the vector inside `owner` is never modified and lives with it.
        let a = unsafe { HostArray::from_external(owner, ptr, 10) };
        assert!(a.is_external() && !a.is_mapped());
        assert_eq!(a.as_slice().as_ptr(), ptr);
        let b = a.clone();
        assert!(a.shares_storage(&b));
        let u: HostArray<u32> = a.reinterpret().unwrap();
        assert_eq!(u.as_slice().as_ptr() as usize, ptr as usize);
        assert_eq!(u[9], 9);
        assert!(u.clone().reinterpret::<u64>().is_none());
        drop(b);
        assert!(!dropped.load(std::sync::atomic::Ordering::SeqCst));
        drop(u);
        assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));

        // Owned and mapped arrays reinterpret without a copy too.
        let owned = HostArray::from_vec(vec![-1i64, 2]);
        let p = owned.as_slice().as_ptr() as usize;
        let r: HostArray<u64> = owned.reinterpret().unwrap();
        assert_eq!((r.as_slice().as_ptr() as usize, r[0]), (p, u64::MAX));
        let map = map_bytes(&[1u8; 16]);
        let m = HostArray::<i32>::from_mapped(map, 0, 4).unwrap();
        assert!(m.reinterpret::<f32>().unwrap().is_mapped());
        // An empty external array may come with a dangling pointer.
        // SAFETY: no element is read.
        let e = unsafe { HostArray::<f32>::from_external(Arc::new(()), std::ptr::null(), 0) };
        assert!(e.is_empty());
    }

    #[test]
    fn mapped_rejects_out_of_bounds_and_misaligned() {
        let map = map_bytes(&[0u8; 64]);
        assert!(HostArray::<u64>::from_mapped(Arc::clone(&map), 8, 8).is_err());
        assert!(HostArray::<u64>::from_mapped(Arc::clone(&map), 3, 2).is_err());
        assert!(HostArray::<u64>::from_mapped(Arc::clone(&map), usize::MAX - 2, 2).is_err());
        assert!(HostArray::<u64>::from_mapped(map, 0, 8).is_ok());
    }
}
