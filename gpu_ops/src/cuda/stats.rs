//! Counters of the CUDA backend's caching allocator (shared by the real backend and
//! the stand-in compiled without the `cuda` feature).

/// What the caching allocator holds and how often it reached the driver.
///
/// Sizes are *size-class* bytes (what was taken from the driver), so `live_bytes`
/// can exceed the sum of the requested lengths by up to a quarter (see the
/// allocator's size classes in `docs/gpu.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes in buffers handed out and not yet dropped.
    pub live_bytes: usize,
    /// Bytes in the free lists (dropped buffers kept for reuse).
    pub cached_bytes: usize,
    /// The largest `live_bytes + cached_bytes` seen.
    pub peak_bytes: usize,
    /// Requests served from a free list.
    pub reuses: u64,
    /// Requests that called `cuMemAlloc`.
    pub device_allocs: u64,
    /// Blocks given back with `cuMemFree` (cache releases and shutdown).
    pub device_frees: u64,
    /// Requests zeroed with a memset (`DeviceMemory::alloc`; `alloc_uninit` skips
    /// it): per batch, the memsets a profile of kernels alone does not show.
    pub zeroed: u64,
}

impl AllocatorStats {
    /// `reuses / (reuses + device_allocs)`, 0 before the first request.
    pub fn reuse_rate(&self) -> f64 {
        let total = self.reuses + self.device_allocs;
        if total == 0 {
            0.0
        } else {
            self.reuses as f64 / total as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_rate_counts_free_list_hits() {
        assert_eq!(AllocatorStats::default().reuse_rate(), 0.0);
        let s = AllocatorStats {
            reuses: 3,
            device_allocs: 1,
            ..Default::default()
        };
        assert_eq!(s.reuse_rate(), 0.75);
    }
}
