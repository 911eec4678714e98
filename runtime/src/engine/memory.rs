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
//!    keeps ahead (`device.sample_ahead`, `engine/sibling.rs`: up to
//!    `AHEAD_BATCHES` = twice `SAMPLE_GROUP` = 16
//!    batches, each a block's local ids, 4 bytes an edge, its sources' ids, 4
//!    bytes a row, and its offsets, 8 bytes a destination). The layer path
//!    keeps two super-batches' blocks ahead instead — top layers and bottom
//!    hops (`executor/layer/device/` steps 1 and 1b), `2N` whole batches — which
//!    that bound covers for `orchestration.super_batch` `N ≤ 8`; step 8
//!    counts the `2N − 16` batches beyond it.
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
//!
//! # The layer path's hot rows ([`layer_bytes`])
//! 8. **Layer-based orchestration** keeps, beyond a step's working set, the
//!    device buffers of `executor/layer/device/` for a CPU share of at most `H` hot rows
//!    of layer 0's output width `W` (fp32: 4 bytes a value):
//!    - the two hot-row **slabs** (super-batches `j` and `j + 1`, pipeline
//!      depth 1), each grown to a queue's rows plus 25%; a queue is at most
//!      `Q = min(H, N · b₀)` rows, `N` batches per super-batch
//!      (`orchestration.super_batch`) of at most `b₀` bottom destinations
//!      each (step 4's sources of block 1); with bfloat16 feature rows each
//!      slab has a bfloat16 mirror of the same rows (2 bytes a value);
//!    - with `orchestration.reuse_across_superbatches`, the **store** of hot
//!      rows indexed by relabeled hot id, grown to the largest kept id plus
//!      25% (`H + H/4` rows);
//!    - the keep/carry **scratch** (up to `Q` rows plus 25%) and its two index
//!      buffers (4 bytes a row), and the **growth** transient: a slab or the
//!      store grows by allocating the new buffer before the old one is freed,
//!      so the largest old buffer is counted once more;
//!    - with `N > 8`, the **blocks** of the `2N − 16` batches sampled ahead
//!      beyond step 4's bound (`N` batches' top layers and bottom hops of the
//!      next super-batch and of the one training).
//!
//!    A fixed `layer` policy counts all of it at its whole hot set; with
//!    `policy = "auto"` the layer candidate gets the largest hot set whose
//!    bytes fit what the budget leaves after the other parts
//!    ([`rows_within`]), never an error.

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
    /// Step 8: the layer path's hot rows (0 without a fixed `layer` policy).
    pub layer: u64,
}

impl MemoryNeed {
    /// Everything.
    pub fn total(&self) -> u64 {
        self.topology + self.cache + self.model + self.batch + self.layer
    }
}

/// What sizes the layer path's device buffers besides the hot rows (step 8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerShape {
    /// Layer 0's output width `W` (values a hot row).
    pub width: u64,
    /// Batches per super-batch `N`.
    pub super_batch: u64,
    /// Bottom destinations of one batch at most, `b₀` ([`bottom_rows`]).
    pub bottom_rows: u64,
    /// Feature rows are bfloat16: each slab has a bfloat16 mirror.
    pub bf16: bool,
    /// Rows are kept across super-batches: the store exists.
    pub store: bool,
    /// Bytes of one batch's blocks ([`batch_block_bytes`]): the layer path
    /// keeps `2N` batches' blocks ahead, of which those beyond step 4's
    /// bound count here.
    pub batch_blocks: u64,
}

/// The layer path's device bytes for a CPU share of `H` hot rows (step 8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerBytes {
    /// Both slabs, with their bfloat16 mirrors.
    pub slabs: u64,
    /// The cross-super-batch store.
    pub store: u64,
    /// The keep/carry scratch rows and index buffers.
    pub scratch: u64,
    /// The largest buffer alive twice while it grows.
    pub growth: u64,
    /// The blocks of the `2N` batches sampled ahead beyond the
    /// `AHEAD_BATCHES` step 4 counts (`N > 8`).
    pub blocks: u64,
}

impl LayerBytes {
    /// Everything.
    pub fn total(&self) -> u64 {
        self.slabs
            .saturating_add(self.store)
            .saturating_add(self.scratch)
            .saturating_add(self.growth)
            .saturating_add(self.blocks)
    }
}

/// `rows` plus 25%: what `executor/layer/device/` allocates when a buffer grows to
/// `rows`.
fn grown(rows: u64) -> u64 {
    rows.saturating_add(rows / 4)
}

/// Bottom destinations of one batch of `batch_size` seeds with `fanouts`
/// (bottom first) on `n` vertices, at most: the sources of block 1 (the seeds
/// themselves with one layer).
pub fn bottom_rows(n: u64, batch_size: usize, fanouts: &[u32]) -> u64 {
    let rows = layer_rows(n, batch_size, fanouts);
    // No fanouts (no block): the seeds.
    rows.get(1).copied().unwrap_or(rows[0])
}

/// Rows of each layer of one batch of `batch_size` seeds with `fanouts`
/// (bottom first) on `n` vertices, at most: index `l` holds the sources of
/// block `l` (index `fanouts.len()` the seeds). Every destination is a source
/// too, so a layer has at most `dst · (1 + fanout)` rows, and never more than
/// the graph's vertices.
fn layer_rows(n: u64, batch_size: usize, fanouts: &[u32]) -> Vec<u64> {
    let mut rows = vec![0u64; fanouts.len() + 1];
    rows[fanouts.len()] = (batch_size as u64).min(n);
    for l in (0..fanouts.len()).rev() {
        rows[l] = if fanouts[l] == ALL_NEIGHBORS {
            n
        } else {
            rows[l + 1].saturating_mul(1 + u64::from(fanouts[l])).min(n)
        };
    }
    rows
}

/// Sampled edges of one batch whose layers hold `rows` ([`layer_rows`]) on a
/// graph of `n` vertices and `m` edges, at most, and the bytes of its blocks
/// as step 4 keeps them ahead: 4 bytes an edge (local ids), 4 a source row
/// (ids) and 8 a destination (offsets).
fn block_sizes(n: u64, m: u64, rows: &[u64], fanouts: &[u32]) -> (u64, u64) {
    let mut edges = 0u64;
    let mut kept = 0u64;
    for l in (0..fanouts.len()).rev() {
        let (src, dst) = (rows[l], rows[l + 1]);
        let e = if fanouts[l] == ALL_NEIGHBORS {
            m.min(dst.saturating_mul(n))
        } else {
            dst.saturating_mul(u64::from(fanouts[l])).min(m)
        };
        edges = edges.saturating_add(e);
        kept = kept.saturating_add(4 * e + 4 * src + 8 * (dst + 1));
    }
    (edges, kept)
}

/// Bytes of one batch's blocks as step 4 keeps them ahead, for `batch_size`
/// seeds with `fanouts` on a graph of `n` vertices and `m` edges
/// ([`LayerShape::batch_blocks`]).
pub fn batch_block_bytes(n: u64, m: u64, batch_size: usize, fanouts: &[u32]) -> u64 {
    block_sizes(n, m, &layer_rows(n, batch_size, fanouts), fanouts).1
}

/// Step 8: the device bytes of the layer path's hot-row buffers for a CPU
/// share of at most `hot_rows` rows of `shape` (all 0 without hot rows). The
/// one estimate the engine's check, the automatic placement and `"auto"`'s
/// layer candidate use.
pub fn layer_bytes(hot_rows: u64, shape: &LayerShape) -> LayerBytes {
    if hot_rows == 0 || shape.width == 0 {
        return LayerBytes::default();
    }
    let queue = hot_rows.min(
        shape
            .super_batch
            .max(1)
            .saturating_mul(shape.bottom_rows.max(1)),
    );
    let row = shape.width.saturating_mul(4);
    let mirror = if shape.bf16 { shape.width * 2 } else { 0 };
    let slab = grown(queue).saturating_mul(row.saturating_add(mirror));
    let (store, scratch) = if shape.store {
        let store_rows = grown(hot_rows);
        (
            store_rows.saturating_mul(row),
            // Scratch rows, the `to` ids (a carry's rows), the `from` ids
            // (a grow copies every old store row's id).
            grown(queue)
                .saturating_mul(row)
                .saturating_add(grown(queue).saturating_mul(4))
                .saturating_add(grown(store_rows.max(queue)).saturating_mul(4)),
        )
    } else {
        (0, 0)
    };
    let beyond = (2 * shape.super_batch).saturating_sub(super::sibling::AHEAD_BATCHES as u64);
    LayerBytes {
        slabs: slab.saturating_mul(2),
        store,
        scratch,
        growth: slab.max(store),
        blocks: beyond.saturating_mul(shape.batch_blocks),
    }
}

/// The largest CPU share of at most `max_rows` hot rows whose
/// [`layer_bytes`] fit in `room` bytes (0 when not even one row fits).
pub fn rows_within(room: u64, max_rows: u64, shape: &LayerShape) -> u64 {
    if layer_bytes(max_rows, shape).total() <= room {
        return max_rows;
    }
    // `layer_bytes` grows with the rows: the largest fitting count by bisection.
    let (mut lo, mut hi) = (0u64, max_rows);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if layer_bytes(mid, shape).total() <= room {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
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
    let rows = layer_rows(n, batch_size, fanouts);
    let (edges, kept) = block_sizes(n, m, &rows, fanouts);
    let width = (model.hidden.max(model.num_classes) as u64).max(1);
    let mut floats = rows[0].saturating_mul(dim);
    for &r in &rows {
        floats = floats.saturating_add(r.saturating_mul(width).saturating_mul(4));
    }
    let ahead = (super::sibling::AHEAD_BATCHES as u64).saturating_mul(kept);
    let batch = (2 * (floats.saturating_mul(4)).saturating_add(edges.saturating_mul(16)))
        .saturating_add(ahead);
    MemoryNeed {
        topology,
        cache,
        model: params,
        batch,
        layer: 0,
    }
}

/// Whether `need` fits in `free` bytes; the error says how much is needed, what
/// it is made of, and which keys reduce each part.
pub(crate) fn check(need: &MemoryNeed, free: u64, device: &str) -> Result<()> {
    if need.total() <= free {
        return Ok(());
    }
    let without_layer = MemoryNeed { layer: 0, ..*need };
    if need.layer > 0 && without_layer.total() <= free {
        return Err(layer_error(need, free, &format!("what {device} has free")));
    }
    Err(Error::invalid_argument(
        "device",
        format!(
            "this run needs about {} of memory on {device} but {} is free: feature cache {} \
             (device.cache_bytes), topology {} (device.topology = \"pinned-host\" keeps it in \
             host memory), batch working set {} (train.batch_size, train.fanouts, model.hidden), \
             model and optimizer state {} (model.hidden, model.layers){}",
            fmt_bytes(need.total()),
            fmt_bytes(free),
            fmt_bytes(need.cache),
            fmt_bytes(need.topology),
            fmt_bytes(need.batch),
            fmt_bytes(need.model),
            layer_clause(need),
        ),
    ))
}

/// The layer part of a "does not fit" message (empty without one).
fn layer_clause(need: &MemoryNeed) -> String {
    if need.layer == 0 {
        return String::new();
    }
    format!(
        ", layer-based hot rows {} (orchestration.hot_ratio, orchestration.super_batch)",
        fmt_bytes(need.layer)
    )
}

/// A fixed `layer` policy whose hot rows (step 8) are what does not fit in
/// `limit` bytes (`what` names the limit).
fn layer_error(need: &MemoryNeed, limit: u64, what: &str) -> Error {
    let others = need.total() - need.layer;
    let cache = if need.cache > 0 {
        format!(
            "a feature cache of {} included (device.cache_bytes)",
            fmt_bytes(need.cache)
        )
    } else {
        "with no feature cache".to_string()
    };
    Error::invalid_argument(
        "orchestration.hot_ratio",
        format!(
            "the layer-based hot set does not fit in device memory: its slabs and hot-row \
             store need about {} beside the {} the rest of this run needs ({cache}), {} in \
             all, but the limit is {} ({what}); lower orchestration.hot_ratio (or \
             orchestration.super_batch, or set orchestration.reuse_across_superbatches = \
             false), or use orchestration.policy = \"auto\", which shrinks the hot set to fit",
            fmt_bytes(need.layer),
            fmt_bytes(others),
            fmt_bytes(need.total()),
            fmt_bytes(limit),
        ),
    )
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
        if need.layer > 0 && fixed.total() - need.layer <= budget {
            return Err(layer_error(
                &fixed,
                budget,
                &format!("device.memory_budget_bytes = {budget}"),
            ));
        }
        return Err(Error::invalid_argument(
            "device.memory_budget_bytes",
            format!(
                "{} is below what this run needs without a feature cache, about {}: \
                 topology {} (device.topology = \"pinned-host\" keeps it in host memory), \
                 batch working set {} (train.batch_size, train.fanouts, model.hidden), \
                 model and optimizer state {} (model.hidden, model.layers){}",
                fmt_bytes(budget),
                fmt_bytes(fixed.total()),
                fmt_bytes(fixed.topology),
                fmt_bytes(fixed.batch),
                fmt_bytes(fixed.model),
                layer_clause(&fixed),
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
            layer: 0,
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
            layer: 0,
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

    /// Step 8's parts: nothing without hot rows or width, the queue bounded
    /// by the super-batch, no store without reuse, and the largest share
    /// within a room found exactly.
    #[test]
    fn the_layer_parts_follow_the_keys_that_set_them() {
        let shape = LayerShape {
            width: 100,
            super_batch: 4,
            bottom_rows: 1000,
            bf16: false,
            store: true,
            batch_blocks: 10_000,
        };
        assert_eq!(layer_bytes(0, &shape), LayerBytes::default());
        let small = layer_bytes(100, &shape);
        // 125 rows of 400 bytes per slab, 125 in the store.
        assert_eq!(small.slabs, 2 * 125 * 400);
        assert_eq!(small.store, 125 * 400);
        // Above N · b₀ = 4000 rows the slabs stop growing, the store does not.
        let a = layer_bytes(4000, &shape);
        let b = layer_bytes(40_000, &shape);
        assert_eq!(a.slabs, b.slabs);
        assert_eq!(b.store, 50_000 * 400);
        let bf16 = layer_bytes(
            4000,
            &LayerShape {
                bf16: true,
                ..shape
            },
        );
        assert_eq!(bf16.slabs, a.slabs / 4 * 6);
        let no_store = layer_bytes(
            4000,
            &LayerShape {
                store: false,
                ..shape
            },
        );
        assert_eq!((no_store.store, no_store.scratch), (0, 0));
        assert_eq!(no_store.slabs, a.slabs);
        // Up to N = 8 the blocks kept ahead are within step 4's bound; past
        // it, every batch beyond 16 counts.
        assert_eq!(a.blocks, 0);
        let eight = LayerShape {
            super_batch: 8,
            ..shape
        };
        assert_eq!(layer_bytes(4000, &eight).blocks, 0);
        let twelve = LayerShape {
            super_batch: 12,
            ..shape
        };
        assert_eq!(layer_bytes(4000, &twelve).blocks, 8 * 10_000);
        for room in [0, 1, 100_000, 2_000_000, 10_000_000, u64::MAX] {
            let r = rows_within(room, 40_000, &shape);
            assert!(layer_bytes(r, &shape).total() <= room);
            if r < 40_000 {
                assert!(layer_bytes(r + 1, &shape).total() > room, "{room}: {r}");
            }
        }
        assert_eq!(bottom_rows(1000, 64, &[5, 5]), 384);
        assert_eq!(bottom_rows(1000, 64, &[5]), 64);
        assert_eq!(bottom_rows(1000, 64, &[5, ALL_NEIGHBORS]), 1000);
        assert_eq!(bottom_rows(1000, 64, &[5, 10, 5]), 1000);
    }

    /// A fixed layer policy's hot rows that do not fit are an error naming
    /// `orchestration.hot_ratio`, the bytes and the limit; under a budget the
    /// cache shrinks first.
    #[test]
    fn hot_rows_that_do_not_fit_name_the_hot_ratio() {
        let need = MemoryNeed {
            topology: 1000,
            cache: 5000,
            model: 200,
            batch: 800,
            layer: 3000,
        };
        // Budget 6000: fixed 5000 fits, the cache gets 1000.
        assert_eq!(plan(&need, u64::MAX, 6000, "d").unwrap(), 1000);
        for (free, budget, limit) in [(u64::MAX, 4999, 4999), (9999, 0, 9999)] {
            let e = plan(&need, free, budget, "d").unwrap_err();
            assert!(
                matches!(&e, Error::InvalidArgument { name, .. } if name == "orchestration.hot_ratio"),
                "{e}"
            );
            let msg = e.to_string();
            assert!(msg.contains(&fmt_bytes(3000)), "{msg}");
            assert!(msg.contains(&fmt_bytes(limit)), "{msg}");
        }
        // Without the layer part it would not fit either: the general error,
        // which lists the layer part too.
        let e = plan(&need, u64::MAX, 1999, "d").unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { name, .. } if name == "device.memory_budget_bytes"),
            "{e}"
        );
        assert!(e.to_string().contains("orchestration.hot_ratio"), "{e}");
    }
}
