//! Does a run fit the device? An upper-bound estimate of what training will hold
//! in device memory, checked against what the device has free before anything is
//! loaded, so an oversized configuration fails at once with the keys that shrink
//! it instead of failing mid-epoch with an allocation error.
//!
//! 1. **Topology** (`device.topology = "device"`): `8 (n + 1) + 4 m` bytes.
//! 2. **Feature cache**: `min(device.cache_bytes, n · dim · 4)`.
//! 3. **Model**: every parameter four times (values, gradients, Adam's two
//!    moments).
//! 4. **A batch's working set**: with `B` seeds and fanouts `f_L-1 … f_0`, layer
//!    `l` has at most `min(n, B · Π_{k ≥ l} (1 + f_k))` sources (all neighbors:
//!    `n`); the gathered inputs, each layer's output and the buffers its forward
//!    and backward keep (counted as four per row, a conservative bound for GCN,
//!    SAGE and GAT), the sampled edges (16 bytes each), twice (a batch sampled
//!    ahead while one trains); plus the blocks of the batches a device sampler
//!    keeps ahead (`device.sample_ahead`: up to twice `SAMPLE_GROUP` = 16
//!    batches, each a block's local ids, 4 bytes an edge, its sources' ids, 4
//!    bytes a row, and its offsets, 8 bytes a destination).
//!
//! The need is the sum; it must not exceed the free memory. The host backend
//! reports the machine's available memory, so the check holds there too.
//!
//! # A memory budget (`device.memory_budget_bytes`)
//! A job sharing a device with others may be given a budget `M` (0: none). Then
//! (see [`plan`]):
//! 5. the fixed parts — topology, model, batch working set — must fit in `M`
//!    (else an error naming the budget and the keys that shrink each part);
//! 6. the feature cache gets `min(step 2, M − fixed)`: the budget caps the
//!    cache, which shrinks to what the budget leaves;
//! 7. the total with that cache must still be free on the device.

use cpu_ops::{ModelConfig, ALL_NEIGHBORS};

use crate::data::dataset::Dataset;
use crate::error::{Error, Result};
use crate::trace::fmt_bytes;

/// The estimate's parts, in bytes (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MemoryNeed {
    /// Step 1 (0 with the topology in host memory).
    pub topology: u64,
    /// Step 2.
    pub cache: u64,
    /// Step 3.
    pub model: u64,
    /// Step 4.
    pub batch: u64,
}

impl MemoryNeed {
    /// Everything.
    pub fn total(&self) -> u64 {
        self.topology + self.cache + self.model + self.batch
    }
}

/// Steps 1–4 for `ds` trained as `model` with `batch_size` seeds and `fanouts`
/// (bottom first), `cache_bytes` of feature cache and the topology on the device
/// when `topology_on_device`.
pub(crate) fn estimate(
    ds: &Dataset,
    model: &ModelConfig,
    num_params: usize,
    batch_size: usize,
    fanouts: &[u32],
    cache_bytes: u64,
    topology_on_device: bool,
) -> MemoryNeed {
    let n = ds.num_vertices() as u64;
    let m = ds.graph.num_edges() as u64;
    let dim = ds.features.dim() as u64;
    let topology = if topology_on_device {
        8 * (n + 1) + 4 * m
    } else {
        0
    };
    let cache = cache_bytes.min(n * dim * 4);
    let params = 4 * 4 * num_params as u64;
    // Rows per layer, from the seeds down (index l = sources of block l).
    let mut rows = vec![0u64; fanouts.len() + 1];
    let mut edges = 0u64;
    // Bytes of one batch's kept blocks.
    let mut kept = 0u64;
    rows[fanouts.len()] = (batch_size as u64).min(n);
    for l in (0..fanouts.len()).rev() {
        let dst = rows[l + 1];
        let (src, e) = if fanouts[l] == ALL_NEIGHBORS {
            (n, m.min(dst.saturating_mul(n)))
        } else {
            let f = u64::from(fanouts[l]);
            (
                dst.saturating_mul(1 + f).min(n),
                dst.saturating_mul(f).min(m),
            )
        };
        rows[l] = src;
        edges = edges.saturating_add(e);
        kept = kept.saturating_add(4 * e + 4 * src + 8 * (dst + 1));
    }
    let width = (model.hidden.max(model.num_classes) as u64).max(1);
    let mut floats = rows[0].saturating_mul(dim);
    for &r in &rows {
        floats = floats.saturating_add(r.saturating_mul(width).saturating_mul(4));
    }
    let ahead = (2 * crate::executor::step::SAMPLE_GROUP as u64).saturating_mul(kept);
    let batch = (2 * (floats.saturating_mul(4)).saturating_add(edges.saturating_mul(16)))
        .saturating_add(ahead);
    MemoryNeed {
        topology,
        cache,
        model: params,
        batch,
    }
}

/// Whether `need` fits in `free` bytes; the error says how much is needed, what
/// it is made of, and which keys reduce each part.
pub(crate) fn check(need: &MemoryNeed, free: u64, device: &str) -> Result<()> {
    if need.total() <= free {
        return Ok(());
    }
    Err(Error::invalid_argument(
        "device",
        format!(
            "this run needs about {} of memory on {device} but {} is free: feature cache {} \
             (device.cache_bytes), topology {} (device.topology = \"pinned-host\" keeps it in \
             host memory), batch working set {} (train.batch_size, train.fanouts, model.hidden), \
             model and optimizer state {} (model.hidden, model.layers)",
            fmt_bytes(need.total()),
            fmt_bytes(free),
            fmt_bytes(need.cache),
            fmt_bytes(need.topology),
            fmt_bytes(need.batch),
            fmt_bytes(need.model),
        ),
    ))
}

/// Steps 5–7: the feature-cache bytes the engine may use for `need` under a
/// budget of `budget` bytes (0: no budget, the cache `need.cache` as
/// requested) on a device with `free` bytes free.
pub(crate) fn plan(need: &MemoryNeed, free: u64, budget: u64, device: &str) -> Result<u64> {
    if budget == 0 {
        check(need, free, device)?;
        return Ok(need.cache);
    }
    let fixed = MemoryNeed { cache: 0, ..*need };
    if fixed.total() > budget {
        return Err(Error::invalid_argument(
            "device.memory_budget_bytes",
            format!(
                "{} is below what this run needs without a feature cache, about {}: \
                 topology {} (device.topology = \"pinned-host\" keeps it in host memory), \
                 batch working set {} (train.batch_size, train.fanouts, model.hidden), \
                 model and optimizer state {} (model.hidden, model.layers)",
                fmt_bytes(budget),
                fmt_bytes(fixed.total()),
                fmt_bytes(fixed.topology),
                fmt_bytes(fixed.batch),
                fmt_bytes(fixed.model),
            ),
        ));
    }
    let granted = MemoryNeed {
        cache: need.cache.min(budget - fixed.total()),
        ..*need
    };
    check(&granted, free, device)?;
    Ok(granted.cache)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::generate::{generate_sbm, SbmOptions};
    use cpu_ops::ModelKind;

    fn ds() -> Dataset {
        generate_sbm(&SbmOptions {
            num_vertices: 1000,
            num_edges: 4000,
            feature_dim: 10,
            ..SbmOptions::default()
        })
        .unwrap()
    }

    fn cfg(hidden: usize) -> ModelConfig {
        ModelConfig {
            kind: ModelKind::Sage,
            in_dim: 10,
            hidden,
            num_classes: 4,
            num_layers: 2,
            heads: 1,
            dropout: 0.0,
        }
    }

    #[test]
    fn the_parts_follow_the_keys_that_set_them() {
        let d = ds();
        let m = d.graph.num_edges() as u64;
        let a = estimate(&d, &cfg(16), 1000, 64, &[5, 5], u64::MAX, true);
        assert_eq!(a.topology, 8 * 1001 + 4 * m);
        assert_eq!(a.cache, 1000 * 10 * 4, "capped at the feature bytes");
        assert_eq!(a.model, 16 * 1000);
        // Pinned-host topology and a small cache remove those parts.
        let b = estimate(&d, &cfg(16), 1000, 64, &[5, 5], 400, false);
        assert_eq!((b.topology, b.cache), (0, 400));
        assert_eq!(b.batch, a.batch);
        // Bigger batches, fanouts and widths need more; everything is bounded by n.
        let c = estimate(&d, &cfg(64), 1000, 256, &[10, 10], 0, false);
        assert!(c.batch > b.batch);
        let all = estimate(&d, &cfg(16), 1000, 64, &[ALL_NEIGHBORS, 5], 0, false);
        let huge = estimate(&d, &cfg(16), 1000, 1_000_000, &[ALL_NEIGHBORS, 5], 0, false);
        assert!(huge.batch >= all.batch);
        // (The blocks of 16 batches sampled ahead: at most 8 bytes an edge of
        // each of the two layers, 8 a source row and 16 a destination.)
        let ahead = 16 * (8 * m + 8 * 1000 + 16 * 1001);
        assert!(huge.batch < 2 * (1000 * 10 + 3 * 1000 * 16 * 4) * 4 + 2 * 16 * 2 * m + ahead + 1);
    }

    #[test]
    fn a_budget_caps_the_cache_and_refuses_what_cannot_fit() {
        let need = MemoryNeed {
            topology: 1000,
            cache: 5000,
            model: 200,
            batch: 800,
        };
        let plenty = u64::MAX;
        // No budget: the cache as requested.
        assert_eq!(plan(&need, plenty, 0, "d").unwrap(), 5000);
        // A budget above the need changes nothing.
        assert_eq!(plan(&need, plenty, 7000, "d").unwrap(), 5000);
        assert_eq!(plan(&need, plenty, 1 << 40, "d").unwrap(), 5000);
        // Below it, the cache gets what the fixed 2000 bytes leave.
        assert_eq!(plan(&need, plenty, 6999, "d").unwrap(), 4999);
        assert_eq!(plan(&need, plenty, 2500, "d").unwrap(), 500);
        assert_eq!(plan(&need, plenty, 2000, "d").unwrap(), 0);
        // A budget below the fixed parts is an error naming the budget.
        let e = plan(&need, plenty, 1999, "d").unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { name, .. } if name == "device.memory_budget_bytes"),
            "{e}"
        );
        // The device must still have the planned total free.
        assert_eq!(plan(&need, 2500, 2500, "d").unwrap(), 500);
        let e = plan(&need, 2499, 2500, "d").unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { name, .. } if name == "device"),
            "{e}"
        );
        let e = plan(&need, 6999, 0, "d").unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { name, .. } if name == "device"));
    }

    #[test]
    fn too_little_memory_is_an_error_naming_the_keys() {
        let need = MemoryNeed {
            topology: 1 << 30,
            cache: 4 << 30,
            model: 1 << 20,
            batch: 2 << 30,
        };
        assert!(check(&need, need.total(), "the GPU").is_ok());
        let e = check(&need, 6 << 30, "the GPU").unwrap_err().to_string();
        for key in [
            "device.cache_bytes",
            "device.topology",
            "train.batch_size",
            "model.hidden",
            "7.00 GiB",
            "6.00 GiB",
        ] {
            assert!(e.contains(key), "{key}: {e}");
        }
    }
}
