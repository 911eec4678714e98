//! [`FeatureStore`] for the CUDA backend: a row cache with a byte budget in front of
//! host rows read zero-copy, the counting gather, and device-side row selection
//! (kernels in `kernels/features.cu`).
//!
//! The bookkeeping is the shared [`CachePolicy`] (which vertex sits in which slot,
//! occupancy, hit/miss counters); this file mirrors its decisions on the device:
//! - the **slot map** (`u32` per vertex, [`NO_SLOT`] when not cached) is what the
//!   gather kernel reads; an update clears the map entries of evicted vertices
//!   (`cache_evict`), then copies the new rows from host memory into their slots and
//!   sets their entries (`cache_insert`), in that order on the compute stream, so a
//!   gather before the update sees the old cache and one after sees the new;
//! - the **store** holds `slots_used × dim` rows (an exact allocation that grows
//!   geometrically up to `capacity_rows × dim`, so it never exceeds the budget);
//! - the **host rows** are the feature matrix, registered in place when it is memory
//!   mapped, else copied to pinned memory (`pinned.rs`); with bfloat16 features
//!   ([`FeatureDtype::Bf16`]) a converted copy in pinned memory, half the size, and a
//!   bfloat16 store, read by `gather_rows_bf16`, which widens to `f32` (half the
//!   bytes over the bus and from the cache).
//!
//! A gather counts hits and misses on the device (per-block shared counters, one
//! atomic per block) into running totals that live on the device, then enqueues an
//! asynchronous copy of the totals into a pinned mirror. It does not synchronize:
//! [`crate::FeatureStore::cache_stats`] reads the mirror, which is current as of the
//! compute stream's last synchronization (in a training step, the loss read after
//! the gather), and an id outside the matrix is a device fault reported at that
//! synchronization. (Reading the two counts back in every gather would cost one
//! `cuStreamSynchronize` and a fault-word copy per batch.)

use cpu_ops::FeatureMatrix;

use super::alloc::{CudaBuf, Init};
use super::dense::elems;
use super::device::CudaBackend;
use super::driver::drv;
use super::kernels::{launch, Grid, PtrMut};
use super::pinned::{CudaPinned, HostRegion};
use crate::backend::{to_bf16_bits, CacheStats, Elem, FeatureDtype, FeatureStore};
use crate::cache::{CachePolicy, NO_SLOT};
use crate::error::{GpuOpsError, Result};

/// The host rows and the cache store (`slots × dim` cached rows; `store.len() /
/// dim` slots allocated), in the stored type.
enum Rows {
    /// `f32` rows: the host rows are the feature matrix itself.
    F32 {
        host: HostRegion<f32>,
        store: CudaBuf<f32>,
    },
    /// bfloat16 rows: a pinned, converted copy of the matrix (half its bytes)
    /// and a bfloat16 store.
    Bf16 {
        host: HostRegion<u16>,
        store: CudaBuf<u16>,
    },
}

/// Features on the CUDA backend (module doc).
pub struct CudaFeatures {
    policy: CachePolicy,
    rows: Rows,
    slot_map: CudaBuf<u32>,
    /// Hits and misses since load, on the device (the gathers add to them).
    counters: CudaBuf<u64>,
    /// Their pinned mirror, refreshed by an asynchronous copy after every gather.
    mirror: CudaPinned<u64>,
    /// The mirror's totals at the last reset.
    zero: parking_lot::Mutex<[u64; 2]>,
}

impl CudaFeatures {
    /// Hits and misses since load, as of the compute stream's last
    /// synchronization (or later).
    fn totals(&self) -> [u64; 2] {
        let p = self.mirror.host_ptr();
        // SAFETY: the mirror holds 2 u64s for this value's life. The device may be
        // writing them (an enqueued copy): volatile reads of aligned u64s see the
        // old or the new totals, both valid counts.
        unsafe {
            [
                std::ptr::read_volatile(p),
                std::ptr::read_volatile(p.add(1)),
            ]
        }
    }
}

impl std::fmt::Debug for CudaFeatures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (dtype, host, store_len) = match &self.rows {
            Rows::F32 { host, store } => ("f32", format!("{host:?}"), store.len()),
            Rows::Bf16 { host, store } => ("bf16", format!("{host:?}"), store.len()),
        };
        f.debug_struct("CudaFeatures")
            .field("policy", &self.policy.stats())
            .field("dtype", &dtype)
            .field("host", &host)
            .field("store_len", &store_len)
            .finish()
    }
}

impl CudaFeatures {
    /// The shared cache policy (slot map, occupancy, counters).
    pub fn policy(&self) -> &CachePolicy {
        &self.policy
    }

    /// Slots the store has room for.
    fn store_slots(&self) -> usize {
        let len = match &self.rows {
            Rows::F32 { store, .. } => store.len(),
            Rows::Bf16 { store, .. } => store.len(),
        };
        match self.policy.dim() {
            0 => usize::MAX,
            dim => len / dim,
        }
    }
}

impl CudaBackend {
    fn grid_rows(&self, n: usize) -> Grid {
        Grid::warps_for(n as u64, self.kernels.max_blocks())
    }

    /// The gathers' grid: a warp per group of 32 rows (`GATHER_GROUP`).
    fn grid_gather(&self, n: usize) -> Grid {
        Grid::warps_for(n.div_ceil(32) as u64, self.kernels.max_blocks())
    }

    /// Grows the store (before the policy changes) so `extra` more slots fit, never
    /// past the capacity.
    fn reserve_slots(&self, f: &mut CudaFeatures, extra: usize) -> Result<()> {
        let dim = f.policy.dim();
        if dim == 0 {
            return Ok(());
        }
        let cap = f.policy.capacity_rows();
        let used = f.policy.slots_used();
        let need = used.saturating_add(extra).min(cap);
        let have = f.store_slots();
        if need <= have {
            return Ok(());
        }
        let rows = need.max(have.saturating_mul(2)).min(cap);
        let len = elems("cache rows × dim", rows, dim)?;
        match &mut f.rows {
            Rows::F32 { store, .. } => self.grow(store, len, used * dim),
            Rows::Bf16 { store, .. } => self.grow(store, len, used * dim),
        }
    }

    /// Replaces `store` by an exact allocation of `len` values holding its first
    /// `keep`.
    fn grow<T: Elem>(&self, store: &mut CudaBuf<T>, len: usize, keep: usize) -> Result<()> {
        let mut bigger = self
            .pool
            .alloc_exact::<T>(len, Init::Uninit, "feature cache store")?;
        self.copy_buf(store, &mut bigger, keep)?;
        *store = bigger;
        Ok(())
    }

    fn to_device_u32(&self, v: &[u32]) -> Result<CudaBuf<u32>> {
        let mut b = self.buf::<u32>(v.len(), Init::Uninit, "index list")?;
        self.upload_slice(&self.compute, v, &mut b)?;
        Ok(b)
    }
}

impl FeatureStore for CudaBackend {
    fn load_features(
        &self,
        features: &FeatureMatrix,
        cached: &[u32],
        budget_bytes: usize,
        dtype: FeatureDtype,
    ) -> Result<CudaFeatures> {
        let policy = CachePolicy::for_features(features, dtype, budget_bytes, cached)?;
        if !self.info.can_map_host {
            return Err(GpuOpsError::InvalidArgument {
                name: "features",
                reason:
                    "this device cannot map host memory, which the feature cache needs for misses"
                        .into(),
            });
        }
        let rows = match dtype {
            FeatureDtype::F32 => Rows::F32 {
                host: HostRegion::new(
                    &self.ctx,
                    &self.compute.inner,
                    features.data(),
                    "feature rows",
                )?,
                store: self.buf::<f32>(0, Init::Uninit, "feature cache store")?,
            },
            FeatureDtype::Bf16 => Rows::Bf16 {
                host: HostRegion::new(
                    &self.ctx,
                    &self.compute.inner,
                    &cpu_ops::HostArray::from(to_bf16_bits(features.as_slice())),
                    "bfloat16 feature rows",
                )?,
                store: self.buf::<u16>(0, Init::Uninit, "feature cache store")?,
            },
        };
        let mut slot_map = self.pool.alloc_exact::<u32>(
            features.num_rows(),
            Init::Uninit,
            "feature cache slot map",
        )?;
        self.fill_bytes(&mut slot_map, features.num_rows(), 0xff)?;
        let mut f = CudaFeatures {
            policy,
            rows,
            slot_map,
            counters: self.buf::<u64>(2, Init::Zeroed, "gather counters")?,
            mirror: CudaPinned::new(&self.ctx, 2)?,
            zero: parking_lot::Mutex::new([0; 2]),
        };
        self.update_cache(&mut f, cached, &[])?;
        Ok(f)
    }

    /// [`crate::FeatureStore::update_cache`]: policy first, then the device mirror.
    fn update_cache(&self, f: &mut CudaFeatures, insert: &[u32], evict: &[u32]) -> Result<usize> {
        f.policy.check_ids("evict", evict)?;
        f.policy.check_ids("insert", insert)?;
        let cleared: Vec<u32> = evict
            .iter()
            .copied()
            .filter(|&v| f.policy.is_cached(v))
            .collect();
        self.reserve_slots(f, insert.len())?;
        let up = f.policy.update(insert, evict)?;
        if !cleared.is_empty() {
            let ids = self.to_device_u32(&cleared)?;
            launch::cache_evict {
                slot_map: f.slot_map.ptr_mut(),
                ids: ids.ptr(),
                n: cleared.len() as u64,
            }
            .launch(
                &self.kernels,
                self.cu(),
                Grid::threads_for(cleared.len() as u64, self.kernels.max_blocks()),
            )?;
        }
        if !up.filled.is_empty() {
            let (ids, slots): (Vec<u32>, Vec<u32>) = up.filled.iter().copied().unzip();
            debug_assert!(slots
                .iter()
                .all(|&s| s != NO_SLOT && (s as usize) < f.store_slots()));
            let (ids, slots) = (self.to_device_u32(&ids)?, self.to_device_u32(&slots)?);
            let (grid, n, dim) = (
                self.grid_rows(up.filled.len()),
                up.filled.len() as u64,
                f.policy.dim() as u64,
            );
            // The two kernels take the same arguments over different row types.
            macro_rules! insert {
                ($kernel:ident, $host:expr, $store:expr) => {
                    launch::$kernel {
                        host_rows: $host.ptr(),
                        ids: ids.ptr(),
                        slots: slots.ptr(),
                        n,
                        dim,
                        cache: $store.ptr_mut(),
                        slot_map: f.slot_map.ptr_mut(),
                    }
                    .launch(&self.kernels, self.cu(), grid)?
                };
            }
            match &mut f.rows {
                Rows::F32 { host, store } => insert!(cache_insert, host, store),
                Rows::Bf16 { host, store } => insert!(cache_insert_bf16, host, store),
            }
        }
        Ok(up.cached)
    }

    fn is_cached(&self, f: &CudaFeatures, v: u32) -> bool {
        f.policy.is_cached(v)
    }

    fn feature_dim(&self, f: &CudaFeatures) -> usize {
        f.policy.dim()
    }

    /// [`crate::FeatureStore::gather`] (does not synchronize; see the module doc).
    fn gather(
        &self,
        f: &CudaFeatures,
        ids: &CudaBuf<u32>,
        n: usize,
        out: &mut CudaBuf<f32>,
    ) -> Result<()> {
        let dim = f.policy.dim();
        ids.check_len("gather ids", n)?;
        out.check_len("gather out (n × dim values)", elems("n × dim", n, dim)?)?;
        if n == 0 {
            return Ok(());
        }
        // The kernels add to the running totals (atomics, like the fault word).
        let counters = PtrMut::new(f.counters.raw());
        let (grid, rows) = (self.grid_gather(n), f.policy.num_vertices() as u64);
        // The two kernels take the same arguments over different row types.
        macro_rules! gather {
            ($kernel:ident, $host:expr, $store:expr) => {
                launch::$kernel {
                    slot_map: f.slot_map.ptr(),
                    cache: $store.ptr(),
                    host_rows: $host.ptr(),
                    ids: ids.ptr(),
                    n: n as u64,
                    num_rows: rows,
                    dim: dim as u64,
                    out: out.ptr_mut(),
                    counters,
                    fault: self.fault_ptr(),
                }
                .launch(&self.kernels, self.cu(), grid)?
            };
        }
        match &f.rows {
            Rows::F32 { host, store } => gather!(gather_rows, host, store),
            Rows::Bf16 { host, store } => gather!(gather_rows_bf16, host, store),
        }
        self.bind()?;
        // SAFETY: the mirror and the counters hold 2 u64s each and live as long as
        // `f`; the copy is ordered after the gather on the compute stream, and the
        // mirror's event (recorded next) makes its `Drop` wait for the copy.
        unsafe {
            cudarc::driver::sys::cuMemcpyDtoHAsync_v2(
                f.mirror.host_ptr().cast(),
                f.counters.raw(),
                2 * size_of::<u64>(),
                self.cu(),
            )
        }
        .result()
        .map_err(drv("cuMemcpyDtoHAsync (gather counters)"))?;
        f.mirror.record_copy(&self.compute.inner)
    }

    /// The counts as of the last synchronization.
    fn cache_stats(&self, f: &CudaFeatures) -> CacheStats {
        let [hits, misses] = f.totals();
        let zero = *f.zero.lock();
        CacheStats {
            hits: hits.saturating_sub(zero[0]),
            misses: misses.saturating_sub(zero[1]),
            ..f.policy.stats()
        }
    }

    fn reset_cache_stats(&self, f: &CudaFeatures) {
        *f.zero.lock() = f.totals();
        f.policy.reset_stats();
    }

    /// `out[r] = src[idx[r]]`; a bad index is a device fault (reported at the next
    /// synchronization; the row becomes zeros).
    fn index_select_rows(
        &self,
        src: &CudaBuf<f32>,
        dim: usize,
        idx: &CudaBuf<u32>,
        n: usize,
        out: &mut CudaBuf<f32>,
    ) -> Result<()> {
        idx.check_len("index_select_rows idx", n)?;
        out.check_len(
            "index_select_rows out (n × dim values)",
            elems("n × dim", n, dim)?,
        )?;
        if dim == 0 {
            return Ok(());
        }
        launch::index_select_rows {
            src: src.ptr(),
            src_rows: (src.len() / dim) as u64,
            dim: dim as u64,
            idx: idx.ptr(),
            n: n as u64,
            out: out.ptr_mut(),
            fault: self.fault_ptr(),
        }
        .launch(&self.kernels, self.cu(), self.grid_rows(n))
    }

    /// `dst[idx[r]] = src[r]`; a bad index is a device fault (reported at the next
    /// synchronization; the row is skipped).
    fn index_put_rows(
        &self,
        src: &CudaBuf<f32>,
        dim: usize,
        idx: &CudaBuf<u32>,
        n: usize,
        dst: &mut CudaBuf<f32>,
    ) -> Result<()> {
        src.check_len(
            "index_put_rows src (n × dim values)",
            elems("n × dim", n, dim)?,
        )?;
        idx.check_len("index_put_rows idx", n)?;
        if dim == 0 {
            return Ok(());
        }
        let dst_rows = (dst.len() / dim) as u64;
        launch::index_put_rows {
            src: src.ptr(),
            dim: dim as u64,
            idx: idx.ptr(),
            n: n as u64,
            dst: dst.ptr_mut(),
            dst_rows,
            fault: self.fault_ptr(),
        }
        .launch(&self.kernels, self.cu(), self.grid_rows(n))
    }
}
