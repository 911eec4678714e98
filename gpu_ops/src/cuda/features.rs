//! Vertex features on the device: a row cache with a byte budget in front of host
//! rows read zero-copy, the counting gather, and device-side row selection (kernels
//! in `kernels/features.cu`).
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
//!   mapped, else copied to pinned memory (`pinned.rs`).
//!
//! A gather counts hits and misses on the device (per-block shared counters, one
//! atomic per block), reads the two counts back and adds them to the policy: so
//! [`crate::Backend::gather`] synchronizes the compute stream, and an id outside the
//! matrix is reported by that same call.

use cpu_ops::FeatureMatrix;
use cudarc::driver::result;

use super::alloc::{CudaBuf, Init};
use super::device::{drv, CudaBackend};
use super::kernels::{launch, Grid};
use super::math::elems;
use super::pinned::HostRegion;
use crate::backend::CacheStats;
use crate::cache::{CachePolicy, NO_SLOT};
use crate::error::{GpuOpsError, Result};

/// Features on the CUDA backend (module doc).
pub struct CudaFeatures {
    policy: CachePolicy,
    host: HostRegion<f32>,
    /// `slots × dim` cached rows (`store.len() / dim` slots allocated).
    store: CudaBuf<f32>,
    slot_map: CudaBuf<u32>,
}

impl std::fmt::Debug for CudaFeatures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaFeatures")
            .field("policy", &self.policy.stats())
            .field("host", &self.host)
            .field("store_len", &self.store.len())
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
        match self.policy.dim() {
            0 => usize::MAX,
            dim => self.store.len() / dim,
        }
    }
}

impl CudaBackend {
    fn grid_rows(&self, n: usize) -> Grid {
        Grid::warps_for(n as u64, self.kernels.max_blocks())
    }

    /// [`crate::Backend::load_features`].
    pub(crate) fn load_features_op(
        &self,
        features: &FeatureMatrix,
        cached: &[u32],
        budget_bytes: usize,
    ) -> Result<CudaFeatures> {
        let policy = CachePolicy::new(features.num_rows(), features.dim(), budget_bytes)?;
        policy.check_ids("cached", cached)?;
        if !self.info.can_map_host {
            return Err(GpuOpsError::InvalidArgument {
                name: "features",
                reason:
                    "this device cannot map host memory, which the feature cache needs for misses"
                        .into(),
            });
        }
        let host = HostRegion::new(
            &self.ctx,
            &self.compute.inner,
            features.data(),
            "feature rows",
        )?;
        let mut slot_map = self.pool.alloc_exact::<u32>(
            features.num_rows(),
            Init::Uninit,
            "feature cache slot map",
        )?;
        self.fill_bytes(&mut slot_map, features.num_rows(), 0xff)?;
        let store = self.buf::<f32>(0, Init::Uninit, "feature cache store")?;
        let mut f = CudaFeatures {
            policy,
            host,
            store,
            slot_map,
        };
        self.update_cache_op(&mut f, cached, &[])?;
        Ok(f)
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
        let mut bigger = self.pool.alloc_exact::<f32>(
            elems("cache rows × dim", rows, dim)?,
            Init::Uninit,
            "feature cache store",
        )?;
        self.copy_buf(&f.store, &mut bigger, used * dim)?;
        f.store = bigger;
        Ok(())
    }

    /// [`crate::Backend::update_cache`]: policy first, then the device mirror.
    pub(crate) fn update_cache_op(
        &self,
        f: &mut CudaFeatures,
        insert: &[u32],
        evict: &[u32],
    ) -> Result<usize> {
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
            launch::cache_evict(
                &self.kernels,
                self.cu(),
                Grid::threads_for(cleared.len() as u64, self.kernels.max_blocks()),
                f.slot_map.ptr_mut(),
                ids.ptr(),
                cleared.len() as u64,
            )?;
        }
        if !up.filled.is_empty() {
            let (ids, slots): (Vec<u32>, Vec<u32>) = up.filled.iter().copied().unzip();
            debug_assert!(slots
                .iter()
                .all(|&s| s != NO_SLOT && (s as usize) < f.store_slots()));
            let (ids, slots) = (self.to_device_u32(&ids)?, self.to_device_u32(&slots)?);
            launch::cache_insert(
                &self.kernels,
                self.cu(),
                self.grid_rows(up.filled.len()),
                f.host.ptr(),
                ids.ptr(),
                slots.ptr(),
                up.filled.len() as u64,
                f.policy.dim() as u64,
                f.store.ptr_mut(),
                f.slot_map.ptr_mut(),
            )?;
        }
        Ok(up.cached)
    }

    fn to_device_u32(&self, v: &[u32]) -> Result<CudaBuf<u32>> {
        let mut b = self.buf::<u32>(v.len(), Init::Uninit, "index list")?;
        self.upload_slice(&self.compute, v, &mut b)?;
        Ok(b)
    }

    /// [`crate::Backend::gather`] (synchronizes; see the module doc).
    pub(crate) fn gather_op(
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
        let mut counters = self.buf::<u64>(2, Init::Zeroed, "gather counters")?;
        launch::gather_rows(
            &self.kernels,
            self.cu(),
            self.grid_rows(n),
            f.slot_map.ptr(),
            f.store.ptr(),
            f.host.ptr(),
            ids.ptr(),
            n as u64,
            f.policy.num_vertices() as u64,
            dim as u64,
            out.ptr_mut(),
            counters.ptr_mut(),
            self.fault_ptr(),
        )?;
        let mut counts = [0u64; 2];
        self.bind()?;
        // SAFETY: `counters` holds 2 u64s; the copy is ordered after the gather on the
        // compute stream, which `sync_compute` synchronizes before `counts` is read.
        unsafe { result::memcpy_dtoh_async(&mut counts[..], counters.raw(), self.cu()) }
            .map_err(drv("cuMemcpyDtoHAsync (gather counters)"))?;
        self.sync_compute()?;
        f.policy.record(counts[0], counts[1]);
        Ok(())
    }

    /// [`crate::Backend::cache_stats`].
    pub(crate) fn cache_stats_of(&self, f: &CudaFeatures) -> CacheStats {
        f.policy.stats()
    }

    /// [`crate::Backend::reset_cache_stats`].
    pub(crate) fn reset_cache_stats_of(&self, f: &CudaFeatures) {
        f.policy.reset_stats();
    }

    /// [`crate::Backend::is_cached`].
    pub(crate) fn is_cached_in(&self, f: &CudaFeatures, v: u32) -> bool {
        f.policy.is_cached(v)
    }

    /// [`crate::Backend::feature_dim`].
    pub(crate) fn feature_dim_of(&self, f: &CudaFeatures) -> usize {
        f.policy.dim()
    }

    /// `out[r] = src[idx[r]]`; a bad index is a device fault (reported at the next
    /// synchronization; the row becomes zeros).
    pub(crate) fn index_select_op(
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
        launch::index_select_rows(
            &self.kernels,
            self.cu(),
            self.grid_rows(n),
            src.ptr(),
            (src.len() / dim) as u64,
            dim as u64,
            idx.ptr(),
            n as u64,
            out.ptr_mut(),
            self.fault_ptr(),
        )
    }

    /// `dst[idx[r]] = src[r]`; a bad index is a device fault (reported at the next
    /// synchronization; the row is skipped).
    pub(crate) fn index_put_op(
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
        launch::index_put_rows(
            &self.kernels,
            self.cu(),
            self.grid_rows(n),
            src.ptr(),
            dim as u64,
            idx.ptr(),
            n as u64,
            dst.ptr_mut(),
            dst_rows,
            self.fault_ptr(),
        )
    }
}
