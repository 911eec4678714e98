//! [`FeatureStore`]: vertex features behind a device row cache, the gather
//! through it, and device-side row selection.

use cpu_ops::FeatureMatrix;

use super::core::DeviceCore;
use super::dtype::FeatureDtype;
use super::stats::CacheStats;
use crate::error::Result;

/// Vertex features behind a device row cache, the gather through it, and
/// device-side row selection.
pub trait FeatureStore: DeviceCore {
    /// Features for [`FeatureStore::gather`]: rows of `cached` (hottest first) are copied
    /// into a device cache up to `budget_bytes` (rows past the budget are left out);
    /// the rest stay in host memory (pinned / registered on CUDA) and are read over
    /// the bus on a miss. With [`FeatureDtype::Bf16`] both hold bfloat16 rows
    /// (converted here: on CUDA a pinned copy of half the matrix's size) and the
    /// gather widens them to `f32`.
    fn load_features(
        &self,
        features: &FeatureMatrix,
        cached: &[u32],
        budget_bytes: usize,
        dtype: FeatureDtype,
    ) -> Result<Self::Features>;
    /// Changes the cached set: evicts `evict`, then inserts `insert` in order while
    /// the budget allows. Returns how many of `insert` were cached. Never exceeds the
    /// budget.
    fn update_cache(&self, f: &mut Self::Features, insert: &[u32], evict: &[u32]) -> Result<usize>;
    /// Whether vertex `v`'s row is in the device cache.
    fn is_cached(&self, f: &Self::Features, v: u32) -> bool;
    /// Feature width.
    fn feature_dim(&self, f: &Self::Features) -> usize;
    /// `out[r] = features[ids[r]]` for `r < n`, through the cache; counts hits/misses.
    /// Need not synchronize: on CUDA an id outside the matrix is a device fault
    /// reported by the next synchronizing call (the host backend reports it here),
    /// and the counts reach [`FeatureStore::cache_stats`] at that synchronization.
    fn gather(
        &self,
        f: &Self::Features,
        ids: &Self::Buf<u32>,
        n: usize,
        out: &mut Self::Buf<f32>,
    ) -> Result<()>;
    /// Hit/miss counts since load (or the last reset), as of the last
    /// synchronization, and the cache's occupancy. Never synchronizes.
    fn cache_stats(&self, f: &Self::Features) -> CacheStats;
    /// Zeroes the hit/miss counters.
    fn reset_cache_stats(&self, f: &Self::Features);
    /// `out[r] = src[idx[r]]` for `r < n` (rows of width `dim`; device-side row
    /// selection, e.g. picking a layer's rows by local id).
    fn index_select_rows(
        &self,
        src: &Self::Buf<f32>,
        dim: usize,
        idx: &Self::Buf<u32>,
        n: usize,
        out: &mut Self::Buf<f32>,
    ) -> Result<()>;
    /// `dst[idx[r]] = src[r]` for `r < n` (rows of width `dim`; `idx` distinct), e.g.
    /// placing historical embeddings of hot vertices into a layer's output.
    fn index_put_rows(
        &self,
        src: &Self::Buf<f32>,
        dim: usize,
        idx: &Self::Buf<u32>,
        n: usize,
        dst: &mut Self::Buf<f32>,
    ) -> Result<()>;
}
