//! `HostArray<T>`: a read-only array of plain data that is either owned or a view
//! into a memory-mapped file.
//!
//! The dataset store maps its file once and hands out `HostArray`s for the CSR
//! offsets, neighbor ids, features, labels and masks, so a 10 GB feature section is
//! paged in by the OS as rows are touched instead of being read up front.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use bytemuck::Pod;
use memmap2::Mmap;

use crate::error::{CpuOpsError, Result};

/// A read-only slice of `T` backed by a shared `Vec<T>` or by a shared memory map.
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
}

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

    /// The elements as a slice.
    pub fn as_slice(&self) -> &[T] {
        match &self.repr {
            Repr::Owned(v) => v.as_slice(),
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

    /// Copies the data into an owned vector (or takes it when this is the only
    /// handle on an owned array).
    pub fn into_vec(self) -> Vec<T> {
        match self.repr {
            Repr::Owned(v) => Arc::try_unwrap(v).unwrap_or_else(|shared| shared.to_vec()),
            Repr::Mapped { .. } => self.as_slice().to_vec(),
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

    #[test]
    fn mapped_rejects_out_of_bounds_and_misaligned() {
        let map = map_bytes(&[0u8; 64]);
        assert!(HostArray::<u64>::from_mapped(Arc::clone(&map), 8, 8).is_err());
        assert!(HostArray::<u64>::from_mapped(Arc::clone(&map), 3, 2).is_err());
        assert!(HostArray::<u64>::from_mapped(Arc::clone(&map), usize::MAX - 2, 2).is_err());
        assert!(HostArray::<u64>::from_mapped(map, 0, 8).is_ok());
    }
}
