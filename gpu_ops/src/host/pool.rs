//! The host backend's caching allocator, as the CUDA backend has its own
//! (`cuda/alloc.rs`): the storage a dropped [`HostBuf`](super::HostBuf) gives
//! back is kept, by element type and size class, and the next allocation of
//! that class takes it instead of asking the system allocator. (Kept here
//! rather than left to a general allocator because glibc hands large freed
//! blocks back to the kernel — `munmap`, and `MADV_DONTNEED` on the per-thread
//! arenas rayon's workers allocate from — so a training step that allocates
//! and frees its activations every batch page-faults them in again each time:
//! the default run took 0.77 s per epoch without the pool, 0.34 with it.)
//!
//! # Protocol
//! 1. A request for `len` elements of `T` is rounded up to its class: the next
//!    multiple of a quarter of the largest power of two at most `len` (at most
//!    25% more), for requests of at least [`MIN_POOLED_BYTES`]; smaller ones go
//!    to the system allocator (it serves them from warm memory).
//! 2. A free block of that `(T, class)` is taken when there is one; otherwise a
//!    new vector of the class's capacity is allocated.
//! 3. On drop, a buffer whose capacity is a class goes back to the pool, unless
//!    the pool would then hold more than its limit (the block is freed).
//!
//! The pool belongs to one backend and its buffers (each holds an `Arc`); it
//! is freed when the last of them goes.

use std::any::{Any, TypeId};
use std::collections::HashMap;

use parking_lot::Mutex;

/// Smallest request, in bytes, the pool serves.
pub const MIN_POOLED_BYTES: usize = 64 << 10;

/// Bytes the pool holds at most (free blocks beyond it are freed).
pub const POOL_LIMIT_BYTES: usize = 2 << 30;

/// Free blocks by element type and class (module doc). A free block keeps the
/// values it held, so an allocation whose contents the caller overwrites
/// (`alloc_uninit`) takes it without writing it first.
#[derive(Default)]
pub(crate) struct HostPool {
    inner: Mutex<Free>,
}

#[derive(Default)]
struct Free {
    /// Free vectors (capacity = the class), as `Vec<T>` behind `Any`.
    blocks: HashMap<(TypeId, usize), Vec<Box<dyn Any + Send>>>,
    /// Bytes of every free block.
    bytes: usize,
    /// Requests served from a free block, and from the system.
    hits: u64,
    misses: u64,
}

impl std::fmt::Debug for HostPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.inner.lock();
        write!(
            f,
            "HostPool {{ free bytes: {}, hits: {}, misses: {} }}",
            g.bytes, g.hits, g.misses
        )
    }
}

/// The class of a request of `len` elements of `size` bytes (step 1), `None`
/// below [`MIN_POOLED_BYTES`].
pub(crate) fn class_of(len: usize, size: usize) -> Option<usize> {
    if len.saturating_mul(size) < MIN_POOLED_BYTES || len < 8 {
        return None;
    }
    let quarter = (1usize << (usize::BITS - 1 - len.leading_zeros())) / 4;
    Some(len.div_ceil(quarter) * quarter)
}

/// Whether `cap` is a class boundary (only such blocks return to the pool).
fn is_class(cap: usize, size: usize) -> bool {
    class_of(cap, size) == Some(cap)
}

impl HostPool {
    /// Step 2: a vector with room for `len` elements: a free block of its class
    /// (with the values it held when freed), or a new, empty one.
    pub fn take<T: Send + 'static>(&self, len: usize) -> Vec<T> {
        let size = std::mem::size_of::<T>().max(1);
        let Some(class) = class_of(len, size) else {
            return Vec::with_capacity(len);
        };
        {
            let mut g = self.inner.lock();
            let found = g
                .blocks
                .get_mut(&(TypeId::of::<T>(), class))
                .and_then(Vec::pop)
                .and_then(|b| b.downcast::<Vec<T>>().ok());
            if let Some(v) = found {
                g.bytes -= v.capacity() * size;
                g.hits += 1;
                return *v;
            }
            g.misses += 1;
        }
        Vec::with_capacity(class)
    }

    /// Step 3: keeps `v` (its storage and its values) for a later request of
    /// its class.
    pub fn give<T: Send + 'static>(&self, v: Vec<T>) {
        let size = std::mem::size_of::<T>().max(1);
        let cap = v.capacity();
        if !is_class(cap, size) {
            return;
        }
        let bytes = cap * size;
        let mut g = self.inner.lock();
        if g.bytes + bytes > POOL_LIMIT_BYTES {
            return;
        }
        g.bytes += bytes;
        g.blocks
            .entry((TypeId::of::<T>(), cap))
            .or_default()
            .push(Box::new(v));
    }

    /// (Requests served from a free block, requests served by the system,
    /// bytes held free.)
    #[cfg(test)]
    pub fn stats(&self) -> (u64, u64, usize) {
        let g = self.inner.lock();
        (g.hits, g.misses, g.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_by_at_most_a_quarter_and_are_their_own_class() {
        assert_eq!(class_of(100, 4), None, "small requests are not pooled");
        for len in [
            16_384usize,
            16_385,
            20_000,
            24_577,
            1 << 20,
            (1 << 20) + 1,
            3_000_001,
        ] {
            let c = class_of(len, 4).unwrap();
            assert!(c >= len && c - len <= len / 4, "{len} -> {c}");
            assert_eq!(class_of(c, 4), Some(c), "{len} -> {c}");
        }
    }

    #[test]
    fn a_freed_block_serves_the_next_request_of_its_class_and_type() {
        let pool = HostPool::default();
        let mut v: Vec<f32> = pool.take(20_000);
        let cap = v.capacity();
        v.resize(20_000, 1.0);
        let ptr = v.as_ptr();
        pool.give(v);
        assert_eq!(pool.stats(), (0, 1, cap * 4));
        // Another type of the same size does not take it.
        let u: Vec<u32> = pool.take(20_000);
        assert_ne!(u.as_ptr() as *const f32, ptr);
        // The same type and class does, with the values it held.
        let w: Vec<f32> = pool.take(19_000);
        assert_eq!((w.as_ptr(), w.len(), w.capacity()), (ptr, 20_000, cap));
        assert_eq!(pool.stats().0, 1);
        // A vector that is not a class boundary is freed, not kept.
        pool.give(Vec::<f32>::with_capacity(20_001));
        assert_eq!(pool.stats().2, 0);
    }
}
