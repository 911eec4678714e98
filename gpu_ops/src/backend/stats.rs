//! What a backend reports about itself: device memory ([`MemoryInfo`]), the
//! feature cache's hits and occupancy ([`CacheStats`]), and the copies and
//! synchronizations it made ([`TransferStats`], counted by [`TransferCounter`]).

/// Device memory, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Free now.
    pub free: usize,
    /// Total.
    pub total: usize,
}

/// Hit and miss counts of a [`FeatureStore::gather`](crate::FeatureStore::gather) through
/// the feature cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Rows served from the device cache.
    pub hits: u64,
    /// Rows read from host memory.
    pub misses: u64,
    /// Rows held in the cache now.
    pub cached_rows: usize,
    /// Bytes the cached rows occupy (never above `budget_bytes`).
    pub cached_bytes: usize,
    /// The cache's byte budget.
    pub budget_bytes: usize,
}

impl CacheStats {
    /// `hits / (hits + misses)`, 0 when nothing was gathered.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// Host↔device copies made through a backend (per instance, since it was made): uploads
/// (including blocks built from host CSR), downloads (including `block_to_host` and the
/// asynchronous [`DeviceMemory::download_pinned`](crate::DeviceMemory::download_pinned)),
/// and host-blocking synchronizations (the host backend counts downloads and
/// [`DeviceCore::synchronize`](crate::DeviceCore::synchronize); CUDA every stream
/// synchronization, including those inside ops that read a count or a loss back). A host
/// wait on an event ([`DeviceCore::wait_host`](crate::DeviceCore::wait_host)) is counted
/// apart, in `event_waits`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Host → device copies.
    pub uploads: u64,
    /// Bytes they moved.
    pub upload_bytes: u64,
    /// Device → host copies.
    pub downloads: u64,
    /// Bytes they moved.
    pub download_bytes: u64,
    /// Times the host waited for the device.
    pub syncs: u64,
    /// Times a host thread waited for an event
    /// ([`DeviceCore::wait_host`](crate::DeviceCore::wait_host); not in `syncs`: e.g. a CPU
    /// worker waiting for weights the accelerator thread published without waiting).
    pub event_waits: u64,
    /// Buffers zero-filled when allocated
    /// ([`DeviceMemory::alloc`](crate::DeviceMemory::alloc); on CUDA every zeroed pool
    /// allocation, ops' own included: one memset each, which a per-kernel profile does not
    /// show).
    pub zero_fills: u64,
}

impl TransferStats {
    /// `self − earlier`, field by field (saturating).
    pub fn since(&self, earlier: &TransferStats) -> TransferStats {
        TransferStats {
            uploads: self.uploads.saturating_sub(earlier.uploads),
            upload_bytes: self.upload_bytes.saturating_sub(earlier.upload_bytes),
            downloads: self.downloads.saturating_sub(earlier.downloads),
            download_bytes: self.download_bytes.saturating_sub(earlier.download_bytes),
            syncs: self.syncs.saturating_sub(earlier.syncs),
            event_waits: self.event_waits.saturating_sub(earlier.event_waits),
            zero_fills: self.zero_fills.saturating_sub(earlier.zero_fills),
        }
    }

    /// `self + other`, field by field (saturating): e.g. a backend and its
    /// [`Sampling::sampling_sibling`](crate::Sampling::sampling_sibling) together.
    pub fn plus(&self, other: &TransferStats) -> TransferStats {
        TransferStats {
            uploads: self.uploads.saturating_add(other.uploads),
            upload_bytes: self.upload_bytes.saturating_add(other.upload_bytes),
            downloads: self.downloads.saturating_add(other.downloads),
            download_bytes: self.download_bytes.saturating_add(other.download_bytes),
            syncs: self.syncs.saturating_add(other.syncs),
            event_waits: self.event_waits.saturating_add(other.event_waits),
            zero_fills: self.zero_fills.saturating_add(other.zero_fills),
        }
    }
}

/// The counters behind [`TransferStats`], shared by the backends (lock-free).
#[derive(Debug, Default)]
pub(crate) struct TransferCounter {
    uploads: std::sync::atomic::AtomicU64,
    upload_bytes: std::sync::atomic::AtomicU64,
    downloads: std::sync::atomic::AtomicU64,
    download_bytes: std::sync::atomic::AtomicU64,
    syncs: std::sync::atomic::AtomicU64,
    event_waits: std::sync::atomic::AtomicU64,
    zero_fills: std::sync::atomic::AtomicU64,
}

impl TransferCounter {
    /// Counts one upload of `bytes`.
    pub(crate) fn upload(&self, bytes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.uploads.fetch_add(1, Relaxed);
        self.upload_bytes.fetch_add(bytes as u64, Relaxed);
    }

    /// Counts one download of `bytes`.
    pub(crate) fn download(&self, bytes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.downloads.fetch_add(1, Relaxed);
        self.download_bytes.fetch_add(bytes as u64, Relaxed);
    }

    /// Counts one host-blocking synchronization.
    pub(crate) fn sync(&self) {
        self.syncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts one host wait on an event.
    pub(crate) fn event_wait(&self) {
        self.event_waits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts one zero-filled allocation.
    pub(crate) fn zero_fill(&self) {
        self.zero_fills
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The counts so far.
    pub(crate) fn get(&self) -> TransferStats {
        use std::sync::atomic::Ordering::Relaxed;
        TransferStats {
            uploads: self.uploads.load(Relaxed),
            upload_bytes: self.upload_bytes.load(Relaxed),
            downloads: self.downloads.load(Relaxed),
            download_bytes: self.download_bytes.load(Relaxed),
            syncs: self.syncs.load(Relaxed),
            event_waits: self.event_waits.load(Relaxed),
            zero_fills: self.zero_fills.load(Relaxed),
        }
    }
}
