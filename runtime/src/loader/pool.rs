//! Feature buffers kept for the next batches. A batch's rows are hundreds of MB
//! at thousands of columns (WordNet's 2,000: 33 k rows, 261 MB), and a fresh
//! buffer costs the kernel's zeroing and page faults on every batch; a buffer
//! the consumer gives back ([`super::NeighborLoader::recycle`], or the Python
//! package when numpy frees a batch's `x`) is resident and is overwritten
//! instead. Its own code: a bounded free list of `Vec`s, which no pooling crate
//! offers for buffers whose owner is another language's object.
//!
//! # Rules
//! - [`RowBuffers::take_f32`] / [`RowBuffers::take_bf16`] hand out a buffer of
//!   exactly `len` values: a kept one when there is one (its old values stay
//!   where the caller overwrites them; only growth is zero-filled), else a
//!   new zeroed one. The loader's gather writes every value it hands out.
//! - [`RowBuffers::give`] keeps at most `keep` buffers of each type (the
//!   loader's `prefetch + 1`: every batch that can exist at once); more are
//!   freed. A buffer never given back (the consumer kept the batch) is simply
//!   the consumer's.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::Features;

/// The kept feature buffers of one loader (module doc).
#[derive(Debug)]
pub struct RowBuffers {
    f32s: Mutex<Vec<Vec<f32>>>,
    bf16s: Mutex<Vec<Vec<u16>>>,
    keep: usize,
    reused: AtomicUsize,
}

impl RowBuffers {
    /// Keeps at most `keep` buffers of each element type.
    pub fn new(keep: usize) -> Self {
        Self {
            f32s: Mutex::new(Vec::new()),
            bf16s: Mutex::new(Vec::new()),
            keep,
            reused: AtomicUsize::new(0),
        }
    }

    /// An f32 buffer of `len` values and whether it is new (module doc).
    pub fn take_f32(&self, len: usize) -> (Vec<f32>, bool) {
        self.take(&self.f32s, len)
    }

    /// A bfloat16 buffer of `len` values and whether it is new.
    pub fn take_bf16(&self, len: usize) -> (Vec<u16>, bool) {
        self.take(&self.bf16s, len)
    }

    /// Gives a batch's features back for a later batch.
    pub fn give(&self, x: Features) {
        match x {
            Features::F32(v) => self.keep_one(&self.f32s, v),
            Features::Bf16(v) => self.keep_one(&self.bf16s, v),
        }
    }

    /// Buffers handed out again rather than allocated, since the loader was made.
    pub fn reused(&self) -> usize {
        self.reused.load(Ordering::Relaxed)
    }

    /// Buffers kept now (both types).
    pub fn kept(&self) -> usize {
        self.f32s.lock().len() + self.bf16s.lock().len()
    }

    fn take<T: Copy + Default>(&self, list: &Mutex<Vec<Vec<T>>>, len: usize) -> (Vec<T>, bool) {
        // The largest kept buffer: the least growth to zero-fill.
        let kept = {
            let mut l = list.lock();
            let best = (0..l.len()).max_by_key(|&i| l[i].capacity());
            best.map(|i| l.swap_remove(i))
        };
        match kept {
            Some(mut v) => {
                if v.len() >= len {
                    v.truncate(len);
                } else {
                    v.resize(len, T::default());
                }
                self.reused.fetch_add(1, Ordering::Relaxed);
                (v, false)
            }
            None => (vec![T::default(); len], true),
        }
    }

    fn keep_one<T>(&self, list: &Mutex<Vec<Vec<T>>>, v: Vec<T>) {
        if v.capacity() == 0 {
            return;
        }
        let mut l = list.lock();
        if l.len() < self.keep {
            l.push(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_buffer_is_handed_out_again_at_the_asked_length() {
        let p = RowBuffers::new(2);
        let (mut a, fresh) = p.take_f32(1000);
        assert!(fresh);
        assert_eq!(a.len(), 1000);
        a.fill(7.0);
        let ptr = a.as_ptr();
        p.give(Features::F32(a));
        // Shorter: the same allocation, truncated.
        let (b, fresh) = p.take_f32(600);
        assert!(!fresh);
        assert_eq!((b.len(), b.as_ptr()), (600, ptr));
        p.give(Features::F32(b));
        // Longer than it holds: the growth is zero-filled.
        let (c, fresh) = p.take_f32(1200);
        assert!(!fresh);
        assert_eq!(c.len(), 1200);
        assert!(c[600..].iter().all(|&v| v == 0.0));
        assert_eq!(p.reused(), 2);
        // The other type has its own list.
        let (d, fresh) = p.take_bf16(10);
        assert!(fresh);
        assert_eq!(d, vec![0u16; 10]);
    }

    #[test]
    fn at_most_keep_buffers_are_kept() {
        let p = RowBuffers::new(2);
        for _ in 0..5 {
            p.give(Features::F32(vec![1.0; 8]));
            p.give(Features::Bf16(vec![1; 8]));
        }
        assert_eq!(p.kept(), 4);
        p.give(Features::F32(Vec::new()));
        assert_eq!(p.kept(), 4, "an empty buffer is not kept");
        let none = RowBuffers::new(0);
        none.give(Features::F32(vec![1.0; 8]));
        assert_eq!(none.kept(), 0);
    }
}
