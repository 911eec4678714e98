//! Placement by memory budget: `device.topology = "auto"` and
//! `device.cache_bytes = "auto"` resolved from the device's free memory.
//!
//! 1. **Room.** What the device has free, or `device.memory_budget_bytes`
//!    when that is smaller, less a reserve: the engine's estimate of the model
//!    with Adam's state and a batch's working set (`engine/memory.rs`, the
//!    larger of a training batch — `train.batch_size`, `train.fanouts` — and an
//!    evaluation batch — `train.eval_batch_size`, `train.eval_fanouts` — at
//!    `model.hidden`, `model.layers`) plus [`DEVICE_HEADROOM_BYTES`] for the
//!    allocator's slack and kernel scratch. With an automatic cache, too little
//!    memory for the reserve is an error naming the limit and the keys that
//!    shrink the working set (with only the topology automatic it stays on the
//!    host and the engine's check judges the explicit cache).
//! 2. **Topology** (`"auto"`): on the device when its `8(n+1) + 4m` bytes fit
//!    in the room beside a requested cache (an explicit `device.cache_bytes`,
//!    clamped at the feature bytes; nothing with an automatic cache or under a
//!    budget, which shrinks the cache), else left in pinned host memory and
//!    sampled over the bus (UVA).
//! 3. **Cache** (`"auto"`): what the room leaves after the topology, at most
//!    every row; the engine fills it with the highest-degree (hottest) rows.
//!
//! With a fixed `layer` policy the working set also holds the layer path's
//! hot-row buffers at its whole hot set (slabs, store, scratch:
//! `engine/memory.rs` step 8, [`layer_bytes`](crate::engine::memory::layer_bytes)).
//! With `orchestration.policy = "auto"` and an automatic cache, the layer
//! candidate's buffers are set aside from the room of step 1 that the cache
//! and the topology would leave unused anyway ([`layer_reserve`]: the largest
//! CPU share of its hot set whose bytes fit there); the engine then gives the
//! candidate what is left after the cache (never an error). The cache is never
//! shrunk for the candidate: `auto`'s step-based candidates run with the cache
//! a fixed step-based policy gets, so choosing one never costs cache rows.
//! Where memory is tight the candidate gets less (or is skipped), which is
//! where a fixed `layer` policy, whose buffers count in the working set, may
//! trade cache for hot rows deliberately.
//!
//! The device-memory check (`engine/memory.rs`'s estimate, [`decide`]) then
//! runs on the resolved values, so a choice that cannot fit still fails before
//! anything is loaded: the placement builds the engine with what [`decide`]
//! returns. On the host backend there is no separate device memory: `"auto"` is
//! `"device"` (the host ignores it) and a cache of every row (nothing is
//! copied there), the same on every machine.

use cpu_ops::ModelConfig;
use gpu_ops::{FeatureDtype, TopologyPlacement};

use crate::data::dataset::Dataset;
use crate::engine::memory::{
    self, batch_block_bytes, bottom_rows, estimate, layer_bytes, rows_within, LayerShape,
    MemoryNeed,
};
use crate::error::{Error, Result};
use crate::trace::fmt_bytes;

/// Device memory an automatic choice leaves free beyond the engine's estimate
/// (step 1): the allocator's slack and kernel scratch.
pub const DEVICE_HEADROOM_BYTES: u64 = 1 << 30;

/// Bytes an automatic cache leaves to `policy = "auto"`'s layer candidate of
/// `hot_rows` hot rows shaped `shape`: the candidate's buffers at its largest
/// CPU share whose bytes fit in `spare`, the room an automatic cache would
/// leave unused anyway (module doc). Never taken from the cache: the
/// step-based candidates keep the cache a fixed step-based policy would get.
pub(crate) fn layer_reserve(spare: u64, hot_rows: u64, shape: &LayerShape) -> u64 {
    let rows = rows_within(spare, hot_rows, shape);
    layer_bytes(rows, shape).total()
}

/// Where the topology goes and how large the feature cache is ([`choose`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePlan {
    /// `device.topology`.
    pub topology: TopologyPlacement,
    /// `device.cache_bytes`.
    pub cache_bytes: u64,
}

/// Which of `device.topology` and `device.cache_bytes` are `"auto"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Auto {
    /// `device.topology = "auto"`.
    pub topology: bool,
    /// `device.cache_bytes = "auto"`.
    pub cache: bool,
}

impl Auto {
    /// Whether anything is chosen here.
    pub fn any(self) -> bool {
        self.topology || self.cache
    }
}

/// What the run asks for and how large its parts are, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    /// Which keys are `"auto"`.
    pub auto: Auto,
    /// The topology when not automatic.
    pub topology: TopologyPlacement,
    /// The cache when not automatic.
    pub cache_bytes: u64,
    /// The topology on the device: `8(n+1) + 4m`.
    pub topology_bytes: u64,
    /// Every feature row in the device's dtype.
    pub rows_bytes: u64,
    /// The model with Adam's state plus a batch's working set
    /// (`engine/memory.rs`), and a fixed `layer` policy's hot-row buffers.
    pub working_set: u64,
    /// `policy = "auto"`'s layer candidate: its hot rows and their shape.
    pub layer: Option<(u64, LayerShape)>,
}

/// Steps 1–3: the resolved placement and the note clause that prints it with
/// the numbers. `free` is what the device has free, `budget` is
/// `device.memory_budget_bytes` (0: none).
pub(crate) fn choose(req: &Request, free: u64, budget: u64) -> Result<(DevicePlan, String)> {
    let fixed = DevicePlan {
        topology: req.topology,
        cache_bytes: req.cache_bytes,
    };
    if !req.auto.any() {
        return Ok((fixed, String::new()));
    }
    let budgeted = budget > 0 && budget < free;
    let available = if budgeted { budget } else { free };
    let reserve = req.working_set.saturating_add(DEVICE_HEADROOM_BYTES);
    if req.auto.cache && reserve > available {
        let (key, what) = if budgeted {
            ("device.memory_budget_bytes", "the budget")
        } else {
            ("device", "the device's free memory")
        };
        return Err(Error::invalid_argument(
            key,
            format!(
                "{} ({what}) leaves no room to place the topology and feature cache \
                 automatically: the model and a batch's working set need about {} plus {} \
                 headroom (train.batch_size, train.eval_batch_size, train.fanouts, \
                 model.hidden, model.layers shrink it)",
                fmt_bytes(available),
                fmt_bytes(req.working_set),
                fmt_bytes(DEVICE_HEADROOM_BYTES),
            ),
        ));
    }
    let mut room = available.saturating_sub(reserve);
    let layer = match req.layer {
        Some((rows, shape)) if req.auto.cache => {
            // What the cache cannot use: the room past every row and the
            // topology (when it may go on the device).
            let topology = if req.auto.topology || req.topology == TopologyPlacement::Device {
                req.topology_bytes
            } else {
                0
            };
            let spare = room.saturating_sub(req.rows_bytes).saturating_sub(topology);
            layer_reserve(spare, rows, &shape)
        }
        _ => 0,
    };
    room -= layer;
    let beside = if req.auto.cache || budget > 0 {
        0
    } else {
        req.cache_bytes.min(req.rows_bytes)
    };
    let topology = if !req.auto.topology {
        req.topology
    } else if req.topology_bytes.saturating_add(beside) <= room {
        TopologyPlacement::Device
    } else {
        TopologyPlacement::PinnedHost
    };
    let on_device = if topology == TopologyPlacement::Device {
        req.topology_bytes
    } else {
        0
    };
    let cache_bytes = if req.auto.cache {
        room.saturating_sub(on_device).min(req.rows_bytes)
    } else {
        req.cache_bytes
    };
    let mut parts = Vec::new();
    if req.auto.topology {
        parts.push(format!(
            "device.topology = \"auto\" chose \"{}\" (topology {})",
            match topology {
                TopologyPlacement::Device => "device",
                TopologyPlacement::PinnedHost => "pinned-host",
            },
            fmt_bytes(req.topology_bytes)
        ));
    }
    if req.auto.cache {
        parts.push(format!(
            "device.cache_bytes = \"auto\" chose {} ({:.1}% of the {} of feature rows, \
             hottest first)",
            fmt_bytes(cache_bytes),
            100.0 * cache_bytes as f64 / req.rows_bytes.max(1) as f64,
            fmt_bytes(req.rows_bytes)
        ));
    }
    let layer_clause = if layer > 0 {
        format!(", {} for the layer candidate's hot rows", fmt_bytes(layer))
    } else {
        String::new()
    };
    let note = format!(
        "; {} from {} {} less {} working set{layer_clause} and {} headroom",
        parts.join(", "),
        fmt_bytes(available),
        if budgeted {
            "of device.memory_budget_bytes"
        } else {
            "free"
        },
        fmt_bytes(req.working_set),
        fmt_bytes(DEVICE_HEADROOM_BYTES)
    );
    Ok((
        DevicePlan {
            topology,
            cache_bytes,
        },
        note,
    ))
}

/// The device memory the layer path's hot rows may take (`engine/memory.rs`
/// step 8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerReserve {
    /// Hot vertices the CPU may compute at most (the hot set: the monitor
    /// never moves the CPU share past it); 0: no layer path.
    pub hot_rows: u64,
    /// Batches per super-batch (`orchestration.super_batch`).
    pub super_batch: usize,
    /// Rows are kept across super-batches (the store,
    /// `orchestration.reuse_across_superbatches`).
    pub store: bool,
    /// `true`: a fixed `layer` policy, whose hot set must fit or the run
    /// fails naming `orchestration.hot_ratio`; `false`: `policy = "auto"`'s
    /// layer candidate, shrunk to what the memory leaves
    /// ([`MemoryDecision::layer_rows`]).
    pub fixed: bool,
}

/// What the run asks of the device's memory, in config terms
/// ([`decide`]).
#[derive(Clone, Debug)]
pub(crate) struct MemoryRequest {
    /// Which of `device.topology` and `device.cache_bytes` are `"auto"`.
    pub auto: Auto,
    /// `device.topology` when not automatic.
    pub topology: TopologyPlacement,
    /// `device.cache_bytes` when not automatic.
    pub cache_bytes: u64,
    /// `device.memory_budget_bytes` (0: none).
    pub budget: u64,
    /// `train.batch_size` and `train.fanouts`.
    pub batch_size: usize,
    /// Training fanouts, bottom first.
    pub fanouts: Vec<u32>,
    /// `train.eval_batch_size` and `train.eval_fanouts`.
    pub eval_batch_size: usize,
    /// Evaluation fanouts, bottom first.
    pub eval_fanouts: Vec<u32>,
    /// `device.feature_dtype`.
    pub feature_dtype: FeatureDtype,
    /// The layer path's hot rows to make room for ([`LayerReserve::default`]:
    /// none).
    pub layer: LayerReserve,
}

/// What the placement decided for the device's memory: the engine is built
/// with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MemoryDecision {
    /// `device.topology` resolved.
    pub topology: TopologyPlacement,
    /// `device.cache_bytes` resolved, under the budget.
    pub cache_bytes: u64,
    /// The most hot rows the layer path may compute on the CPU within the
    /// memory checked here: a fixed `layer` policy's whole hot set (the check
    /// failed otherwise), or the largest share of `policy = "auto"`'s layer
    /// candidate that fits (0: none fits, the candidate is skipped).
    pub layer_rows: u64,
    /// What `"auto"` keys chose and what the budget changed, as clauses of
    /// the device note (`None`: nothing).
    pub note: Option<String>,
}

/// The topology, the feature cache and the layer path's hot rows of `req`
/// for `model` on `ds`, on a device with `free` bytes free named `device`
/// (module doc, then `engine/memory.rs`'s check): an error naming the keys
/// that shrink the run when it cannot fit.
pub(crate) fn decide(
    req: &MemoryRequest,
    ds: &Dataset,
    model: &ModelConfig,
    free: u64,
    device: &str,
) -> Result<MemoryDecision> {
    let layout =
        gpu_ops::ModelLayout::new(model).map_err(|source| Error::device("model", source))?;
    let num_params = layout.params().iter().map(|p| p.len).sum();
    let n = ds.num_vertices() as u64;
    let m = ds.graph.num_edges() as u64;
    // The layer path's hot rows (`engine/memory.rs` step 8).
    let shape = LayerShape {
        width: layout.layer_specs().first().map_or(0, |s| s.d_out) as u64,
        super_batch: req.layer.super_batch as u64,
        bottom_rows: bottom_rows(n, req.batch_size, &req.fanouts),
        bf16: matches!(req.feature_dtype, FeatureDtype::Bf16),
        store: req.layer.store,
        batch_blocks: batch_block_bytes(n, m, req.batch_size, &req.fanouts),
    };
    let want = req.layer.hot_rows;
    let fixed_layer = if req.layer.fixed {
        layer_bytes(want, &shape).total()
    } else {
        0
    };
    // Steps 1–3: topology and cache from the free memory, less the working set.
    let working_set = {
        let train = estimate(
            ds,
            model,
            num_params,
            req.batch_size,
            &req.fanouts,
            0,
            false,
        );
        let eval = estimate(
            ds,
            model,
            num_params,
            req.eval_batch_size,
            &req.eval_fanouts,
            0,
            false,
        );
        train.total().max(eval.total()) + fixed_layer
    };
    let (chosen, mut note) = choose(
        &Request {
            auto: req.auto,
            topology: req.topology,
            cache_bytes: req.cache_bytes,
            topology_bytes: 8 * (n + 1) + 4 * m,
            rows_bytes: n * ds.features.dim() as u64 * req.feature_dtype.value_bytes() as u64,
            working_set,
            layer: (!req.layer.fixed && want > 0).then_some((want, shape)),
        },
        free,
        req.budget,
    )?;
    // Fail before loading anything when the run cannot fit.
    let need = MemoryNeed {
        layer: fixed_layer,
        ..estimate(
            ds,
            model,
            num_params,
            req.batch_size,
            &req.fanouts,
            chosen.cache_bytes,
            chosen.topology == TopologyPlacement::Device,
        )
    };
    let cache = memory::plan(&need, free, req.budget, device)?;
    // `"auto"`'s layer candidate: the largest hot set that fits what the
    // rest leaves (`engine/memory.rs` step 8).
    let layer_rows = if req.layer.fixed {
        want
    } else {
        // Under a budget, what it leaves (the budget is what the job may plan
        // for); else the free memory less the allocator's headroom, which the
        // hot rows must not eat.
        let budgeted = req.budget > 0 && req.budget < free;
        let limit = if budgeted {
            req.budget
        } else {
            free.saturating_sub(DEVICE_HEADROOM_BYTES)
        };
        let rest = MemoryNeed { cache, ..need }.total();
        let room = limit.saturating_sub(rest);
        let rows = rows_within(room, want, &shape);
        if rows < want {
            note.push_str(&format!(
                "; the layer candidate of orchestration.policy = \"auto\" keeps {rows} of \
                 {want} hot rows: their slabs and store ({}) fit the {} of {} left after \
                 the topology, the feature cache and the working set",
                fmt_bytes(layer_bytes(rows, &shape).total()),
                fmt_bytes(room),
                if budgeted {
                    "device.memory_budget_bytes"
                } else {
                    "the free device memory (less 1 GiB of headroom)"
                },
            ));
        }
        rows
    };
    let mut cache_bytes = chosen.cache_bytes;
    if cache < need.cache {
        cache_bytes = cache;
        note.push_str(&format!(
            "; device.memory_budget_bytes = {} leaves the feature cache {} of the {} \
             device.cache_bytes asks for",
            req.budget,
            fmt_bytes(cache),
            fmt_bytes(need.cache)
        ));
    }
    Ok(MemoryDecision {
        topology: chosen.topology,
        cache_bytes,
        layer_rows,
        note: (!note.is_empty()).then_some(note),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1_000_000_000;
    const H: u64 = DEVICE_HEADROOM_BYTES;

    fn req(topology: bool, cache: bool) -> Request {
        Request {
            auto: Auto { topology, cache },
            topology: TopologyPlacement::Device,
            cache_bytes: 4 * G,
            topology_bytes: 12 * G,
            rows_bytes: 57 * G,
            working_set: 5 * G,
            layer: None,
        }
    }

    #[test]
    fn papers100m_sized_plans_on_an_h100_an_h200_and_a_small_card() {
        // 12.4 GB of topology, 56.9 GB of fp32 rows, a 12 GB reserve.
        let r = Request {
            auto: Auto {
                topology: true,
                cache: true,
            },
            topology: TopologyPlacement::Device,
            cache_bytes: 0,
            topology_bytes: 12_400_000_000,
            rows_bytes: 56_900_000_000,
            working_set: 12 * G - H,
            layer: None,
        };
        let (p, _) = choose(&r, 79 * G, 0).unwrap();
        assert_eq!(p.topology, TopologyPlacement::Device);
        assert_eq!(p.cache_bytes, 79 * G - 12 * G - 12_400_000_000);
        let (p, _) = choose(&r, 140 * G, 0).unwrap();
        assert_eq!(p.cache_bytes, 56_900_000_000);
        let (p, _) = choose(&r, 20 * G, 0).unwrap();
        assert_eq!(
            p,
            DevicePlan {
                topology: TopologyPlacement::PinnedHost,
                cache_bytes: 8 * G
            }
        );
    }

    #[test]
    fn nothing_automatic_keeps_the_keys_as_given() {
        let (p, note) = choose(&req(false, false), 2 * G, 0).unwrap();
        assert_eq!(p.topology, TopologyPlacement::Device);
        assert_eq!(p.cache_bytes, 4 * G);
        assert!(note.is_empty());
    }

    #[test]
    fn the_topology_goes_on_the_device_when_it_fits_else_pinned_host() {
        // Room 60 − 5 − H: the 12 GB topology fits; the cache takes the rest.
        let (p, note) = choose(&req(true, true), 60 * G, 0).unwrap();
        assert_eq!(p.topology, TopologyPlacement::Device);
        assert_eq!(p.cache_bytes, 60 * G - 5 * G - H - 12 * G);
        assert!(note.contains("chose \"device\""), "{note}");
        assert!(note.contains("device.cache_bytes = \"auto\""), "{note}");
        // 16 GB free: room 11 − H < 12 GB, so the topology stays on the host and
        // the cache gets the whole room.
        let (p, note) = choose(&req(true, true), 16 * G, 0).unwrap();
        assert_eq!(p.topology, TopologyPlacement::PinnedHost);
        assert_eq!(p.cache_bytes, 16 * G - 5 * G - H);
        assert!(note.contains("\"pinned-host\""), "{note}");
        // Exactly enough for the topology: device, no cache left.
        let (p, _) = choose(&req(true, true), 17 * G + H, 0).unwrap();
        assert_eq!((p.topology, p.cache_bytes), (TopologyPlacement::Device, 0));
        // An explicit cache must fit beside the topology: 20 GB free, room
        // 15 − H ≥ 12 but 12 + 4 does not fit, so pinned-host keeps the cache.
        let (p, _) = choose(&req(true, false), 20 * G, 0).unwrap();
        assert_eq!(
            (p.topology, p.cache_bytes),
            (TopologyPlacement::PinnedHost, 4 * G)
        );
        let (p, _) = choose(&req(true, false), 22 * G + H, 0).unwrap();
        assert_eq!(p.topology, TopologyPlacement::Device);
    }

    #[test]
    fn the_cache_takes_what_is_left_clamped_at_the_feature_bytes() {
        // 141 GB free: every row fits beside the topology.
        let (p, note) = choose(&req(true, true), 141 * G, 0).unwrap();
        assert_eq!(p.cache_bytes, 57 * G);
        assert!(note.contains("100.0%"), "{note}");
        // A fixed pinned-host topology leaves the whole room to the cache.
        let mut r = req(false, true);
        r.topology = TopologyPlacement::PinnedHost;
        let (p, _) = choose(&r, 40 * G, 0).unwrap();
        assert_eq!(p.topology, TopologyPlacement::PinnedHost);
        assert_eq!(p.cache_bytes, 40 * G - 5 * G - H);
        // A fixed device topology is subtracted even when it leaves nothing.
        let (p, _) = choose(&req(false, true), 10 * G, 0).unwrap();
        assert_eq!((p.topology, p.cache_bytes), (TopologyPlacement::Device, 0));
    }

    /// A fixed layer policy's buffers count in the working set and shrink an
    /// automatic cache by as much; `"auto"`'s layer candidate takes only the
    /// room an automatic cache leaves unused, shrunk to the largest CPU share
    /// that fits, and never shrinks the cache.
    #[test]
    fn the_layer_path_counts_in_the_working_set() {
        fn r_without_layer() -> Request {
            let mut r = req(false, true);
            r.topology = TopologyPlacement::PinnedHost;
            r
        }
        let shape = LayerShape {
            width: 256,
            super_batch: 4,
            bottom_rows: 20_000,
            bf16: false,
            store: true,
            batch_blocks: 0,
        };
        let mut r = req(false, true);
        r.topology = TopologyPlacement::PinnedHost;
        let (without, _) = choose(&r, 40 * G, 0).unwrap();
        let bytes = layer_bytes(400_000, &shape).total();
        r.working_set += bytes;
        let (with, _) = choose(&r, 40 * G, 0).unwrap();
        assert_eq!(without.cache_bytes - with.cache_bytes, bytes);
        // `"auto"`: the candidate takes only what the cache leaves unused.
        // 40 GB less 5 GB working set and 1 GiB headroom cannot hold 57 GB of
        // rows: nothing is spare, the cache keeps all the room.
        let mut a = req(false, true);
        a.topology = TopologyPlacement::PinnedHost;
        a.layer = Some((400_000, shape));
        let (p, _) = choose(&a, 40 * G, 0).unwrap();
        assert_eq!(p.cache_bytes, without.cache_bytes);
        // 80 GB: every row cached, the candidate whole in the spare room.
        let (full, _) = choose(&r_without_layer(), 80 * G, 0).unwrap();
        let (p, note) = choose(&a, 80 * G, 0).unwrap();
        assert_eq!(p.cache_bytes, 57 * G);
        assert_eq!(full.cache_bytes, p.cache_bytes);
        assert!(note.contains("layer candidate"), "{note}");
        // A spare room of 1 GB past the rows: the candidate shrinks to what
        // fits in it and the cache still holds every row.
        let (p, note) = choose(&a, 5 * G + H + 57 * G + G, 0).unwrap();
        assert_eq!(p.cache_bytes, 57 * G);
        let rows = rows_within(G, 400_000, &shape);
        assert!(rows > 0 && rows < 400_000, "{rows}");
        assert!(note.contains("layer candidate"), "{note}");
        // Never an error: no room leaves the candidate nothing.
        let (p, _) = choose(&a, 5 * G + H, 0).unwrap();
        assert_eq!(p.cache_bytes, 0);
        // With an explicit cache nothing is set aside here (the engine gives
        // the candidate what the cache leaves).
        let mut e = req(true, false);
        e.layer = Some((400_000, shape));
        assert_eq!(
            choose(&e, 60 * G, 0).unwrap(),
            choose(&req(true, false), 60 * G, 0).unwrap()
        );
    }

    #[test]
    fn a_budget_smaller_than_free_memory_wins() {
        let (p, note) = choose(&req(true, true), 80 * G, 30 * G).unwrap();
        assert_eq!(p.topology, TopologyPlacement::Device);
        assert_eq!(p.cache_bytes, 30 * G - 5 * G - H - 12 * G);
        assert!(note.contains("of device.memory_budget_bytes"), "{note}");
        // Under a budget the topology comes first: the explicit cache shrinks
        // to fit later (engine/memory.rs), it does not push the topology out.
        let (p, _) = choose(&req(true, false), 80 * G, 18 * G + H).unwrap();
        assert_eq!(p.topology, TopologyPlacement::Device);
        // A budget above the free memory changes nothing.
        let (a, _) = choose(&req(true, true), 40 * G, 0).unwrap();
        let (b, note) = choose(&req(true, true), 40 * G, 100 * G).unwrap();
        assert_eq!(a, b);
        assert!(note.contains(" free "), "{note}");
    }

    #[test]
    fn too_little_for_the_working_set_is_an_error_naming_the_limit() {
        let e = choose(&req(true, true), 80 * G, 5 * G).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { name, .. } if name == "device.memory_budget_bytes"),
            "{e}"
        );
        assert!(e.to_string().contains("train.batch_size"), "{e}");
        let e = choose(&req(false, true), 6 * G, 0).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { name, .. } if name == "device"),
            "{e}"
        );
        // An automatic topology beside an explicit cache does not fail here: it
        // stays on the host, and the engine's check (`engine/memory.rs`) judges
        // the explicit cache.
        let (p, _) = choose(&req(true, false), 6 * G, 0).unwrap();
        assert_eq!(
            (p.topology, p.cache_bytes),
            (TopologyPlacement::PinnedHost, 4 * G)
        );
        // Exactly the reserve: it fits, with nothing left for topology or cache.
        let (p, _) = choose(&req(true, true), 5 * G + H, 0).unwrap();
        assert_eq!(
            (p.topology, p.cache_bytes),
            (TopologyPlacement::PinnedHost, 0)
        );
    }
}
