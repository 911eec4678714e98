//! [`crate::Sampling`] for the CUDA backend: topology on the device, neighbor
//! sampling, unique relabeling and blocks (kernels in `kernels/sample.cu` and
//! `kernels/aggregate.cu`).
//!
//! # One batch ([`crate::Sampling::sample`]), from the seeds down
//! 1. The seeds are checked on the host (in range, distinct) and uploaded.
//! 2. Per layer, **sized by bounds, nothing read**: the frontier has a capacity
//!    `n` (the seeds; below them, the sources' capacity of the layer above) and a
//!    live count on the device (the layer above's source count). `sample_count_scan`
//!    writes `min(fanout, degree)` per live destination and scans the counts in the
//!    same pass into the block's `indptr` (`n + 1` entries, constant past the live
//!    destinations; the last is the edge count): one launch up to 16,383
//!    destinations, three beyond (`scan.rs`). The edge buffers are sized by the
//!    bound `n · min(fanout, max degree)` and the kernels read the live count at
//!    `indptr[n]` on the device. (A bound above `MAX_BOUNDED_EDGES` — e.g.
//!    `ALL_NEIGHBORS` on a graph with a huge hub — reads the edge count first
//!    instead: one more synchronization.)
//! 3. `sample_pick` fills the sampled neighbors' global ids (one warp per
//!    destination, Floyd's algorithm keyed by `(derive_seed(seed, layer), vertex)`,
//!    neighbors in the order of the graph's row; fanouts up to 32 keep the draws in
//!    registers, larger ones in a scratch buffer).
//! 4. [`CudaBackend::relabel`] makes the block's sources (destinations first, then new
//!    ids in first-occurrence order) and the local id of every edge, into buffers
//!    sized by capacities: the sources' capacity is `min(n + edges bound, vertex
//!    count)`. `unique_insert`, `unique_flag_scan` (the first-occurrence flags
//!    scanned in the same pass: one launch up to 16,383 positions, three beyond)
//!    and `unique_scatter`, which also writes the layer's four counts (edges,
//!    distinct destinations, sources, destinations) into the batch's count buffer.
//! 5. The block's sources are the next layer's frontier, their count on the device
//!    its live count.
//!
//! After the last layer **one read** takes every layer's four counts (the
//! batch's one synchronization, not one a layer): the blocks get their
//! shapes, a repeated frontier id is reported (its distinct count falls short),
//! device faults (a vertex outside the graph) surface there. A block's buffers
//! are longer than its shape (the backend contract's prefixes); the GCN source
//! weights (`block_out_degree`, `block_src_weight`) are computed the first time a
//! GCN aggregation reads them ([`CudaBackend::src_weights`]).
//!
//! Launches per layer: `scan(n + 1) + 3 + scan(n + edges + 1)` kernels, where
//! `scan(m)` is 1 up to 16,384 values and 3 beyond, plus one memset of the hash
//! table: the counts and the first-occurrence flags are scanned in the pass that
//! writes them, the scan tiles hold 16,384 values, and the scatter writes the
//! layer's counts itself, so no separate count, flag or count-reading kernel runs.
//!
//! [`crate::Sampling::sample_hop`] runs steps 2–5 once from destinations already on
//! the device (their count known), with an optional skip mask that gives flagged
//! destinations a count of 0 in step 2 (so step 3 draws nothing for them and step 4
//! sees none of their neighbors), and reads the layer's counts at its end. Both paths
//! share `sample_layer`, and layer `l` of a batch uses the key `derive_seed(seed,
//! l)`, so hop-by-hop sampling with those keys reproduces `sample`.
//!
//! [`crate::Sampling::sample_hop_queued`] is `sample_hop` without the read: its
//! counts stay in the queued batch's count buffer and a later
//! `resolve_queued` or `read_queued` reads them with the other batches' (a
//! read copies no ids back for a hop: its sources stay on the device; a read
//! of hops only is finished by waiting for its copies' event, not by a
//! synchronization of the stream, which the allocator may have made wait for
//! another stream's work since, and keeps its pinned pair in a slot of its
//! own, `readback_hops`).
//!
//! [`crate::Sampling::sample_queued_from`] runs steps 1–5 for layers `from..` only
//! (the layer path's top layers). [`crate::Sampling::read_queued`] makes the one
//! read asynchronous: the queued batches' count buffers are gathered into one on
//! the device, copied with every batch's bottom sources (at their capacity: the
//! live count is among the counts being copied) into a page-locked pair kept on
//! the backend (`readback`, reused by the next read when large enough), and both
//! buffers' events are recorded after the copies; [`crate::Sampling::finish_read`]
//! synchronizes the stream (one synchronization, faults included) and cuts the
//! ids at the counts read. A reading dropped unfinished waits for its copies
//! before its pinned memory is freed.
//!
//! Everything but the random choices is a function of the input, so a batch is
//! reproducible for a seed on a given device; the draws differ from the host
//! sampler's (same distribution, another generator).

use cpu_ops::{BlockView, CsrGraph};

use super::alloc::{CudaBuf, Init};
use super::device::CudaBackend;
use super::kernels::{launch, Grid, Ptr, PtrMut};
use super::pinned::{CudaPinned, HostRegion};
use super::scan::scan_grid;
use crate::backend::{DeviceBatch, DeviceCore, TopologyPlacement};
use crate::error::{GpuOpsError, Result};

/// Largest `targets + candidates` of one relabel (positions and hash slots are u32).
const MAX_RELABEL: usize = 1 << 30;

/// Largest edge bound a layer is sized by without reading its edge count first
/// (16 M edges: ~0.6 GB of transient buffers at ~40 bytes per edge).
const MAX_BOUNDED_EDGES: usize = 1 << 24;

/// Where a graph's topology lives.
enum Topology {
    /// Copied into device memory.
    Device {
        indptr: CudaBuf<u64>,
        indices: CudaBuf<u32>,
    },
    /// Left in host memory, read zero-copy.
    Host {
        indptr: HostRegion<u64>,
        indices: HostRegion<u32>,
    },
}

/// A graph's CSR topology ready for [`crate::Sampling::sample`].
pub struct CudaGraph {
    num_vertices: usize,
    num_edges: usize,
    /// The largest row: with the fanout it bounds a layer's edges.
    max_degree: u64,
    topo: Topology,
}

impl std::fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let place = match &self.topo {
            Topology::Device { .. } => "device".to_string(),
            Topology::Host { indices, .. } => format!(
                "pinned host ({})",
                if indices.is_registered() {
                    "registered"
                } else {
                    "copied"
                }
            ),
        };
        f.debug_struct("CudaGraph")
            .field("num_vertices", &self.num_vertices)
            .field("num_edges", &self.num_edges)
            .field("placement", &place)
            .finish()
    }
}

impl CudaGraph {
    fn ptrs(&self) -> (Ptr<u64>, Ptr<u32>) {
        match &self.topo {
            Topology::Device { indptr, indices } => (indptr.ptr(), indices.ptr()),
            Topology::Host { indptr, indices } => (indptr.ptr(), indices.ptr()),
        }
    }
}

/// A block (message-flow graph) on the device: CSR over the destinations with local
/// source ids, plus per-source out-degrees and GCN source weights.
pub struct CudaBlock {
    pub(crate) num_src: usize,
    pub(crate) num_dst: usize,
    pub(crate) num_edges: usize,
    /// `num_dst + 1` offsets.
    pub(crate) indptr: CudaBuf<u64>,
    /// `num_edges` local source ids.
    pub(crate) indices: CudaBuf<u32>,
    /// `1 / sqrt(max(d_out(j), 1))` per source, made on first use.
    pub(crate) src_w: std::sync::OnceLock<CudaBuf<f32>>,
}

impl std::fmt::Debug for CudaBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBlock")
            .field("num_src", &self.num_src)
            .field("num_dst", &self.num_dst)
            .field("num_edges", &self.num_edges)
            .finish()
    }
}

/// The destinations of one sampled layer ([`CudaBackend::sample_layer`]): `ids`
/// holds `cap` slots, of which the first `live` (a device count; `None`: all
/// `cap`) are the destinations, distinct (not checked before the relabel, whose
/// counts tell: [`LayerOut::finish`] reports a repeat), and an optional mask: a
/// destination flagged in `skip[..cap]` gets no neighbors.
struct Frontier<'a> {
    ids: &'a CudaBuf<u32>,
    cap: usize,
    live: Option<Ptr<u64>>,
    skip: Option<&'a CudaBuf<u8>>,
}

/// One layer on the device before its counts are read: every buffer is sized by
/// a capacity, the live sizes are in `counts` (`unique_scatter`'s four words:
/// edges, distinct destinations, sources, destinations).
struct LayerOut {
    /// `cap_dst + 1` offsets (constant past the live destinations).
    indptr: CudaBuf<u64>,
    /// `cap_edges` local source ids.
    local: CudaBuf<u32>,
    /// `cap_src` global source ids, destinations first.
    unique: CudaBuf<u32>,
    cap_dst: usize,
    cap_edges: usize,
    cap_src: usize,
}

/// A batch enqueued by [`crate::Sampling::sample_queued`]: its layers (top
/// first) and the buffer holding their counts, four a layer, unread.
pub struct CudaQueued {
    layers_rev: Vec<LayerOut>,
    counts: CudaBuf<u64>,
    num_seeds: usize,
    /// The lowest layer sampled ([`crate::Sampling::sample_queued_from`]).
    from: usize,
    /// Whether [`crate::Sampling::read_queued`] copies its bottom sources to
    /// the host (not for a hop: [`crate::Sampling::sample_hop_queued`]).
    read_ids: bool,
    /// What the "not distinct" error calls the top layer's destinations.
    frontier: &'static str,
}

impl CudaQueued {
    /// The batch from its layers' counts as read (four a layer, top first).
    fn finish(self, dev: &CudaBackend, counts: &[u64]) -> Result<DeviceBatch<CudaBackend>> {
        let layers = self.layers_rev.len();
        let mut blocks = Vec::with_capacity(layers);
        let mut src_ids = Vec::with_capacity(layers);
        for (i, layer_out) in self.layers_rev.into_iter().enumerate() {
            let layer = self.from + layers - 1 - i;
            let c: [u64; 4] = counts
                .get(4 * i..4 * i + 4)
                .and_then(|c| c.try_into().ok())
                .ok_or_else(|| in_layer(layer, internal_counts()))?;
            let (block, src, _) = layer_out
                .finish(dev, c, self.frontier)
                .map_err(|e| in_layer(layer, e))?;
            blocks.push(block);
            src_ids.push(src);
        }
        blocks.reverse();
        src_ids.reverse();
        Ok(DeviceBatch {
            blocks,
            src_ids,
            num_seeds: self.num_seeds,
        })
    }
}

/// A read of queued batches in flight ([`crate::Sampling::read_queued`]): the
/// batches, and the pinned counts and bottom sources their copies go to (`None`
/// for no batch); dropped unfinished, the pinned buffers wait for the copies.
pub struct CudaReading {
    queued: Vec<CudaQueued>,
    pinned: Option<(CudaPinned<u64>, CudaPinned<u32>)>,
    /// Where each batch's bottom sources start in the pinned ids.
    ids_at: Vec<usize>,
    /// The stream that copies (the backend that may finish the read).
    stream: usize,
}

impl std::fmt::Debug for CudaReading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaReading")
            .field("batches", &self.queued.len())
            .finish()
    }
}

impl std::fmt::Debug for CudaQueued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaQueued")
            .field("layers", &self.layers_rev.len())
            .field("num_seeds", &self.num_seeds)
            .finish()
    }
}

impl LayerOut {
    /// The block, its sources and their count, from the layer's four counts as
    /// read (checked against the capacities; `frontier` names the destinations in
    /// the "not distinct" error).
    fn finish(
        self,
        dev: &CudaBackend,
        [edges, distinct, n_src, n_dst]: [u64; 4],
        frontier: &'static str,
    ) -> Result<(CudaBlock, CudaBuf<u32>, usize)> {
        let within = |v: u64, cap: usize| usize::try_from(v).ok().filter(|&v| v <= cap);
        let (Some(n_dst), Some(edges), Some(n_src)) = (
            within(n_dst, self.cap_dst),
            within(edges, self.cap_edges),
            within(n_src, self.cap_src),
        ) else {
            return Err(GpuOpsError::InvalidArgument {
                name: "num_candidates",
                reason: format!(
                    "internal: a sampled layer counts {n_dst} destinations, {edges} edges and \
                     {n_src} sources on the device, more than the {}, {} and {} sized for",
                    self.cap_dst, self.cap_edges, self.cap_src
                ),
            });
        };
        if distinct as usize != n_dst {
            return Err(GpuOpsError::InvalidArgument {
                name: frontier,
                reason: format!("must be distinct: only {distinct} of its {n_dst} ids are"),
            });
        }
        let block = dev.finish_block(n_src, n_dst, edges, self.indptr, self.local)?;
        Ok((block, self.unique, n_src))
    }
}

/// Ids on the device for a relabel: `ids[..n]`, of which the first
/// `*live` are live when `live` is a device count (`None`: all `n`).
#[derive(Clone, Copy)]
struct LiveIds<'a> {
    ids: &'a CudaBuf<u32>,
    n: usize,
    live: Option<Ptr<u64>>,
}

/// What [`CudaBackend::relabel`] leaves on the device.
struct Relabeled {
    /// The unique ids (targets first), `unique_cap` slots.
    unique: CudaBuf<u32>,
    /// Each live candidate's position in `unique` (sized by the capacity).
    local: CudaBuf<u32>,
}

impl CudaBackend {
    fn grid_t(&self, n: usize) -> Grid {
        Grid::threads_for(n as u64, self.kernels.max_blocks())
    }

    fn grid_w(&self, n: usize) -> Grid {
        Grid::warps_for(n as u64, self.kernels.max_blocks())
    }

    /// One layer (steps 2–4 of the module doc) from `frontier`, drawing `fanout`
    /// neighbors per destination with `layer_key`; the four counts go to
    /// `counts[..4]`, unread. Callers check `fanout > 0` and the buffer lengths.
    fn sample_layer(
        &self,
        graph: &CudaGraph,
        frontier: Frontier<'_>,
        fanout: u32,
        layer_key: u64,
        counts: PtrMut<u64>,
    ) -> Result<LayerOut> {
        let Frontier {
            ids: frontier,
            cap: n,
            live: live_dst,
            skip,
        } = frontier;
        let (g_indptr, g_indices) = graph.ptrs();
        let nv = graph.num_vertices as u64;
        let live_dst_ptr = live_dst.unwrap_or(Ptr::null());
        // 2. counts → indptr, in one pass per tile.
        let mut indptr = self.buf::<u64>(n + 1, Init::Uninit, "block indptr")?;
        let grid = scan_grid(n + 1)?;
        let mut sums = self.tile_sums::<u64>(grid)?;
        launch::sample_count_scan {
            graph_indptr: g_indptr,
            num_vertices: nv,
            frontier: frontier.ptr(),
            n: n as u64,
            live_n: live_dst_ptr,
            fanout,
            skip: skip.map_or(Ptr::null(), CudaBuf::ptr),
            indptr: indptr.ptr_mut(),
            tile_sums: sums.as_mut().map_or(PtrMut::null(), CudaBuf::ptr_mut),
            fault: self.fault_ptr(),
        }
        .launch(&self.kernels, self.cu(), grid)?;
        self.finish_scan(&mut indptr, n + 1, sums)?;
        // The layer's edges are at most n · min(fanout, max degree): size by that and
        // let the kernels read the count at indptr[n], or read it first when the
        // bound is too loose to allocate.
        let bound = (n as u64)
            .checked_mul(u64::from(fanout).min(graph.max_degree))
            .and_then(|b| usize::try_from(b).ok())
            .filter(|&b| b <= MAX_BOUNDED_EDGES && n + b <= MAX_RELABEL);
        let (cap, live) = match bound {
            Some(b) => (b, Some(indptr.ptr().offset(n))),
            None => (self.read_edge_count(&indptr, n)?, None),
        };
        // 3. sampled neighbors (global ids); fanouts up to 32 keep their draws in
        // registers and need no scratch.
        let mut positions = if fanout > 32 {
            Some(self.buf::<u32>(cap, Init::Uninit, "sampling positions")?)
        } else {
            None
        };
        let mut nbrs = self.buf::<u32>(cap, Init::Uninit, "sampled neighbors")?;
        launch::sample_pick {
            graph_indptr: g_indptr,
            graph_indices: g_indices,
            num_vertices: nv,
            frontier: frontier.ptr(),
            n: n as u64,
            live_n: live_dst_ptr,
            layer_key,
            block_indptr: indptr.ptr(),
            positions: positions.as_mut().map_or(PtrMut::null(), CudaBuf::ptr_mut),
            nbrs: nbrs.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.grid_w(n))?;
        drop(positions);
        // 4. sources and local ids. The sources are distinct vertices, so at most
        // the vertex count (a bad id beyond is a fault the read reports).
        let cap_src = (n + cap).min(graph.num_vertices.max(1));
        let r = self.relabel(
            LiveIds {
                ids: frontier,
                n,
                live: live_dst,
            },
            LiveIds {
                ids: &nbrs,
                n: cap,
                live,
            },
            cap_src,
            counts,
        )?;
        Ok(LayerOut {
            indptr,
            local: r.local,
            unique: r.unique,
            cap_dst: n,
            cap_edges: cap,
            cap_src,
        })
    }

    /// Where a read of `queued` keeps its pinned pair: reads of hops only
    /// (sizes) in their own slot.
    fn readback_slot(
        &self,
        queued: &[CudaQueued],
    ) -> &parking_lot::Mutex<Option<super::device::ReadbackPair>> {
        if queued.iter().any(|q| q.read_ids) {
            &self.readback
        } else {
            &self.readback_hops
        }
    }

    /// A hop's checks ([`crate::Sampling::sample_hop`], `sample_hop_queued`):
    /// a fanout above 0, `dst` and `skip` holding `n_dst` entries; its
    /// frontier and a buffer for its four counts.
    fn hop_frontier<'a>(
        &self,
        dst: &'a CudaBuf<u32>,
        n_dst: usize,
        fanout: u32,
        skip: Option<&'a CudaBuf<u8>>,
    ) -> Result<(Frontier<'a>, CudaBuf<u64>)> {
        if fanout == 0 {
            return Err(GpuOpsError::InvalidArgument {
                name: "fanout",
                reason: format!(
                    "0 samples nothing; use ALL_NEIGHBORS ({}) to take every neighbor",
                    cpu_ops::ALL_NEIGHBORS
                ),
            });
        }
        dst.check_len("sample_hop dst", n_dst)?;
        if let Some(s) = skip {
            s.check_len("sample_hop skip (one flag per destination)", n_dst)?;
        }
        let frontier = Frontier {
            ids: dst,
            cap: n_dst,
            live: None,
            skip,
        };
        let counts = self.buf::<u64>(4, Init::Uninit, "layer counts")?;
        Ok((frontier, counts))
    }

    /// The edge count at `indptr[n]`, read (a synchronization) and checked against
    /// the device limits.
    fn read_edge_count(&self, indptr: &CudaBuf<u64>, n: usize) -> Result<usize> {
        let edges = self.read_at(indptr, n)?;
        usize::try_from(edges)
            .ok()
            .filter(|&e| {
                e < u32::MAX as usize && n.checked_add(e).is_some_and(|t| t <= MAX_RELABEL)
            })
            .ok_or_else(|| GpuOpsError::InvalidArgument {
                name: "fanout",
                reason: format!(
                    "{n} destinations sample {edges} edges; a device block holds fewer than 2^30"
                ),
            })
    }

    /// Unique ids of the live `targets[..n_t] ++ candidates[..n_c]` (targets
    /// first, then first occurrences; `live_t` / `live_c`: device counts of the
    /// live entries, `None` = all) into `unique_cap` slots, and each candidate's
    /// position among them; see `sample.cu`. Nothing is read: `unique_scatter`
    /// writes the four counts to `counts[..4]` (live candidates, distinct targets,
    /// unique ids, live targets) for the caller to read.
    fn relabel(
        &self,
        targets: LiveIds<'_>,
        candidates: LiveIds<'_>,
        unique_cap: usize,
        counts: PtrMut<u64>,
    ) -> Result<Relabeled> {
        let LiveIds {
            ids: targets,
            n: n_t,
            live: live_t,
        } = targets;
        let LiveIds {
            ids: candidates,
            n: n_c,
            live: live_c,
        } = candidates;
        targets.check_len("unique_relabel targets", n_t)?;
        candidates.check_len("unique_relabel candidates", n_c)?;
        let total = n_t
            .checked_add(n_c)
            .filter(|&t| t <= MAX_RELABEL)
            .ok_or_else(|| GpuOpsError::InvalidArgument {
                name: "num_candidates",
                reason: format!("{n_t} targets + {n_c} candidates exceed the device relabel limit of {MAX_RELABEL}"),
            })?;
        let (live_t, live_c) = (live_t.unwrap_or(Ptr::null()), live_c.unwrap_or(Ptr::null()));
        let cap = (2 * total).next_power_of_two().max(64);
        // The hash keys and the first positions side by side, both all ones: one
        // allocation and one memset.
        let mut table = self.buf::<u32>(2 * (cap + 1), Init::Uninit, "relabel hash table")?;
        self.fill_bytes(&mut table, 2 * (cap + 1), 0xff)?;
        let (keys, min_pos) = (table.ptr_mut(), table.ptr().offset(cap + 1));
        let mut slot_of = self.buf::<u32>(total, Init::Uninit, "relabel slots")?;
        launch::unique_insert {
            a: targets.ptr(),
            n_a: n_t as u64,
            live_a: live_t,
            b: candidates.ptr(),
            n_b: n_c as u64,
            live_b: live_c,
            keys,
            min_pos: keys.offset(cap + 1),
            cap: cap as u64,
            slot_of: slot_of.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.grid_t(total))?;
        // The flags of all total + 1 positions (0 past the live ones) scanned in
        // the same pass, so ranks[total] is the unique count.
        let mut ranks = self.buf::<u32>(total + 1, Init::Uninit, "relabel ranks")?;
        let grid = scan_grid(total + 1)?;
        let mut sums = self.tile_sums::<u32>(grid)?;
        launch::unique_flag_scan {
            slot_of: slot_of.ptr(),
            min_pos,
            n_a: n_t as u64,
            live_a: live_t,
            n_b: n_c as u64,
            live_b: live_c,
            ranks: ranks.ptr_mut(),
            tile_sums: sums.as_mut().map_or(PtrMut::null(), CudaBuf::ptr_mut),
        }
        .launch(&self.kernels, self.cu(), grid)?;
        self.finish_scan(&mut ranks, total + 1, sums)?;
        let mut unique = self.buf::<u32>(unique_cap, Init::Uninit, "unique ids")?;
        let mut local = self.buf::<u32>(n_c, Init::Uninit, "local ids")?;
        // At least one thread: it writes the counts.
        launch::unique_scatter {
            a: targets.ptr(),
            n_a: n_t as u64,
            live_a: live_t,
            b: candidates.ptr(),
            n_b: n_c as u64,
            live_b: live_c,
            slot_of: slot_of.ptr(),
            min_pos,
            ranks: ranks.ptr(),
            unique_cap: unique_cap as u64,
            unique: unique.ptr_mut(),
            local: local.ptr_mut(),
            counts,
        }
        .launch(&self.kernels, self.cu(), self.grid_t(total.max(1)))?;
        Ok(Relabeled { unique, local })
    }

    /// `n` u64 counts of `buf` in one read (one synchronization; device faults
    /// are reported there).
    fn read_counts(&self, buf: &CudaBuf<u64>, n: usize) -> Result<Vec<u64>> {
        crate::backend::DeviceMemory::to_host(self, buf, n)
    }

    /// `dst[at..at + len] = src[..len]`, device to device on the compute stream.
    fn copy_at(
        &self,
        src: &CudaBuf<u64>,
        dst: &mut CudaBuf<u64>,
        at: usize,
        len: usize,
    ) -> Result<()> {
        src.check_len("copy source", len)?;
        dst.check_len("copy destination end", at.saturating_add(len))?;
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        let to = dst.raw() + (at * size_of::<u64>()) as u64;
        // SAFETY: both ranges lie in their buffers (checked above); the copy is
        // ordered on the compute stream after the kernels that wrote `src`.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                to,
                src.raw(),
                len * size_of::<u64>(),
                self.cu(),
            )
        }
        .map_err(super::driver::drv("cuMemcpyDtoDAsync"))
    }

    /// A block from device CSR (its GCN weights are made on first use).
    pub(crate) fn finish_block(
        &self,
        num_src: usize,
        num_dst: usize,
        num_edges: usize,
        indptr: CudaBuf<u64>,
        indices: CudaBuf<u32>,
    ) -> Result<CudaBlock> {
        Ok(CudaBlock {
            num_src,
            num_dst,
            num_edges,
            indptr,
            indices,
            src_w: std::sync::OnceLock::new(),
        })
    }

    /// The block's GCN source weights `1 / sqrt(max(d_out(j), 1))`, computed on
    /// the compute stream the first time they are asked for.
    pub(crate) fn src_weights(&self, block: &CudaBlock) -> Result<Ptr<f32>> {
        if let Some(w) = block.src_w.get() {
            return Ok(w.ptr());
        }
        let mut out_deg = self.buf::<u32>(block.num_src, Init::Zeroed, "block out-degrees")?;
        launch::block_out_degree {
            indices: block.indices.ptr(),
            num_edges: block.num_edges as u64,
            out_deg: out_deg.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.grid_t(block.num_edges))?;
        let mut src_w = self.buf::<f32>(block.num_src, Init::Uninit, "block source weights")?;
        launch::block_src_weight {
            out_deg: out_deg.ptr(),
            num_src: block.num_src as u64,
            src_w: src_w.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.grid_t(block.num_src))?;
        // Another thread may have set it meanwhile: either buffer is right.
        let _ = block.src_w.set(src_w);
        block
            .src_w
            .get()
            .map(CudaBuf::ptr)
            .ok_or_else(|| GpuOpsError::InvalidArgument {
                name: "block",
                reason: "internal: GCN source weights not kept".into(),
            })
    }
}

/// `e` with the layer it happened in, where it names the fanouts.
fn in_layer(layer: usize, e: GpuOpsError) -> GpuOpsError {
    match e {
        GpuOpsError::InvalidArgument {
            name: "fanout",
            reason,
        } => GpuOpsError::InvalidArgument {
            name: "fanouts",
            reason: format!("layer {layer}: {reason}"),
        },
        e => e,
    }
}

/// A count read back that is not what was written.
fn internal_counts() -> GpuOpsError {
    GpuOpsError::InvalidArgument {
        name: "num_candidates",
        reason: "internal: the device counts read back are not the ones sized for".into(),
    }
}

/// The [`crate::Sampling`] family (module doc), on the helpers above.
impl crate::backend::Sampling for CudaBackend {
    type Queued = CudaQueued;
    type Reading = CudaReading;

    /// Uploads (or maps) a graph's topology.
    fn load_graph(&self, graph: &CsrGraph, placement: TopologyPlacement) -> Result<CudaGraph> {
        let offsets = graph.offsets();
        let max_degree = offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        if max_degree > u32::MAX as u64 {
            return Err(GpuOpsError::InvalidArgument {
                name: "graph",
                reason: format!(
                    "a vertex has {max_degree} neighbors; the device sampler supports up to {}",
                    u32::MAX
                ),
            });
        }
        let topo = match placement {
            TopologyPlacement::Device => {
                let mut indptr =
                    self.pool
                        .alloc_exact::<u64>(offsets.len(), Init::Uninit, "graph offsets")?;
                self.upload_slice(&self.compute, offsets.as_slice(), &mut indptr)?;
                let idx = graph.indices();
                let mut indices =
                    self.pool
                        .alloc_exact::<u32>(idx.len(), Init::Uninit, "graph indices")?;
                self.upload_slice(&self.compute, idx.as_slice(), &mut indices)?;
                Topology::Device { indptr, indices }
            }
            TopologyPlacement::PinnedHost => {
                if !self.info.can_map_host {
                    return Err(GpuOpsError::InvalidArgument {
                        name: "placement",
                        reason: "this device cannot map host memory; use TopologyPlacement::Device"
                            .into(),
                    });
                }
                let inner = &self.compute.inner;
                Topology::Host {
                    indptr: HostRegion::new(&self.ctx, inner, offsets, "graph offsets")?,
                    indices: HostRegion::new(&self.ctx, inner, graph.indices(), "graph indices")?,
                }
            }
        };
        Ok(CudaGraph {
            num_vertices: graph.num_vertices(),
            num_edges: graph.num_edges(),
            max_degree,
            topo,
        })
    }

    /// A backend on the same device (the primary context, so device pointers are
    /// shared) with its own stream, pool and fault word. This backend's stream
    /// is synchronized first, so the sibling can read every graph loaded so far.
    fn sampling_sibling(&self) -> Result<Option<Self>> {
        self.sync_compute()?;
        Ok(Some(Self::new(self.info.ordinal)?))
    }

    /// Orders this backend's compute stream after `from`'s (an event recorded
    /// there, waited for here: `DeviceCore::record_event` / `wait_event`, both
    /// backends being on the same primary context) and marks the batch's
    /// buffers as used on this stream, so `from`'s pool orders their reuse after
    /// this stream's work (`alloc.rs`, protocol step 3).
    fn adopt_batch(&self, from: &Self, batch: &mut DeviceBatch<Self>) -> Result<()> {
        // Dropping the event right after the wait is allowed: the wait keeps the
        // recorded point, and the driver releases the event once it completes.
        let sampled = from.record_event(&from.compute)?;
        self.wait_event(&self.compute, &sampled)?;
        let stream = &self.compute.inner;
        for b in &mut batch.blocks {
            b.indptr.mark_foreign(stream);
            b.indices.mark_foreign(stream);
        }
        for ids in &mut batch.src_ids {
            ids.mark_foreign(stream);
        }
        Ok(())
    }

    /// Layered sampling (module doc): [`crate::Sampling::sample_queued`] and the
    /// one read of [`crate::Sampling::resolve_queued`].
    fn sample(
        &self,
        graph: &CudaGraph,
        seeds: &[u32],
        fanouts: &[u32],
        seed: u64,
    ) -> Result<DeviceBatch<Self>> {
        let queued = self.sample_queued(graph, seeds, fanouts, seed)?;
        self.resolve_queued(vec![queued])?
            .pop()
            .ok_or_else(internal_counts)
    }

    /// Steps 1–5 of the module doc for layers `from..` (top first), nothing
    /// read; layer `l` keyed by `derive_seed(seed, l)` as in a whole batch.
    fn sample_queued_from(
        &self,
        graph: &CudaGraph,
        seeds: &[u32],
        fanouts: &[u32],
        from: usize,
        seed: u64,
    ) -> Result<CudaQueued> {
        crate::backend::check_fanouts_from(fanouts, from)?;
        if let Some(&bad) = seeds.iter().find(|&&s| s as usize >= graph.num_vertices) {
            return Err(GpuOpsError::InvalidArgument {
                name: "seeds",
                reason: format!(
                    "seed {bad} is not below the vertex count {}",
                    graph.num_vertices
                ),
            });
        }
        let mut sorted = seeds.to_vec();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(GpuOpsError::InvalidArgument {
                name: "seeds",
                reason: format!(
                    "seed {} appears more than once (seeds must be distinct)",
                    w[0]
                ),
            });
        }
        let mut seed_buf = self.buf::<u32>(seeds.len(), Init::Uninit, "seeds")?;
        self.upload_slice(&self.compute, seeds, &mut seed_buf)?;
        // Every layer's four counts in one buffer, read once.
        let layers = fanouts.len() - from;
        let mut counts = self.buf::<u64>(4 * layers, Init::Uninit, "layer counts")?;
        let mut layers_rev: Vec<LayerOut> = Vec::with_capacity(layers);
        for layer in (from..fanouts.len()).rev() {
            let slot = layers_rev.len();
            let frontier = match layers_rev.last() {
                // The sources of the layer above, their count on the device.
                Some(above) => Frontier {
                    ids: &above.unique,
                    cap: above.cap_src,
                    live: Some(counts.ptr().offset(4 * (slot - 1) + 2)),
                    skip: None,
                },
                None => Frontier {
                    ids: &seed_buf,
                    cap: seeds.len(),
                    live: None,
                    skip: None,
                },
            };
            let layer_key = cpu_ops::derive_seed(seed, layer as u64);
            let out = self
                .sample_layer(
                    graph,
                    frontier,
                    fanouts[layer],
                    layer_key,
                    counts.ptr_mut().offset(4 * slot),
                )
                .map_err(|e| in_layer(layer, e))?;
            layers_rev.push(out);
        }
        Ok(CudaQueued {
            layers_rev,
            counts,
            num_seeds: seeds.len(),
            from,
            read_ids: true,
            frontier: "frontier",
        })
    }

    /// [`crate::Sampling::sample_hop`]'s checks and steps 2–5 with its mask,
    /// its four counts left on the device for the read that resolves it.
    fn sample_hop_queued(
        &self,
        graph: &CudaGraph,
        dst: &CudaBuf<u32>,
        n_dst: usize,
        fanout: u32,
        layer_seed: u64,
        skip: Option<&CudaBuf<u8>>,
    ) -> Result<CudaQueued> {
        let (frontier, mut counts) = self.hop_frontier(dst, n_dst, fanout, skip)?;
        let out = self.sample_layer(graph, frontier, fanout, layer_seed, counts.ptr_mut())?;
        Ok(CudaQueued {
            layers_rev: vec![out],
            counts,
            num_seeds: n_dst,
            from: 0,
            read_ids: false,
            frontier: "dst",
        })
    }

    /// One read of every queued batch's counts (their count buffers copied into
    /// one on the device first), then the blocks.
    fn resolve_queued(&self, queued: Vec<CudaQueued>) -> Result<Vec<DeviceBatch<Self>>> {
        let lens: Vec<usize> = queued.iter().map(|q| 4 * q.layers_rev.len()).collect();
        let read = match queued.as_slice() {
            [] => return Ok(Vec::new()),
            [one] => self.read_counts(&one.counts, lens[0])?,
            many => {
                let total = lens.iter().sum();
                let mut all = self.buf::<u64>(total, Init::Uninit, "queued layer counts")?;
                let mut at = 0;
                for (q, &len) in many.iter().zip(&lens) {
                    self.copy_at(&q.counts, &mut all, at, len)?;
                    at += len;
                }
                self.read_counts(&all, total)?
            }
        };
        let mut out = Vec::with_capacity(queued.len());
        let mut at = 0;
        for (q, len) in queued.into_iter().zip(lens) {
            out.push(q.finish(self, &read[at..at + len])?);
            at += len;
        }
        Ok(out)
    }

    /// Every batch's counts gathered into one device buffer and copied with
    /// the bottom layers' sources (at their capacity) into the pinned pair
    /// (kept from the last finished read when large enough), on the compute
    /// stream; both buffers' events recorded after the copies.
    fn read_queued(&self, queued: Vec<CudaQueued>) -> Result<CudaReading> {
        let lens: Vec<usize> = queued.iter().map(|q| 4 * q.layers_rev.len()).collect();
        let id_caps: Vec<usize> = queued
            .iter()
            .map(|q| match q.layers_rev.last() {
                Some(l) if q.read_ids => l.cap_src,
                _ => 0,
            })
            .collect();
        let (n_counts, n_ids) = (lens.iter().sum::<usize>(), id_caps.iter().sum::<usize>());
        let stream = self.cu() as usize;
        if queued.is_empty() {
            return Ok(CudaReading {
                queued,
                pinned: None,
                ids_at: Vec::new(),
                stream,
            });
        }
        let slot = self.readback_slot(&queued);
        let (mut counts, mut ids) = match slot.lock().take() {
            Some((c, i)) if c.len() >= n_counts && i.len() >= n_ids => (c, i),
            _ => (
                CudaPinned::<u64>::new(&self.ctx, n_counts + n_counts / 4)?,
                CudaPinned::<u32>::new(&self.ctx, n_ids + n_ids / 4)?,
            ),
        };
        self.bind()?;
        // The counts side by side on the device, then one copy of them.
        let gathered;
        let all = match queued.as_slice() {
            [one] => &one.counts,
            many => {
                let mut buf = self.buf::<u64>(n_counts, Init::Uninit, "queued layer counts")?;
                let mut at = 0;
                for (q, &len) in many.iter().zip(&lens) {
                    self.copy_at(&q.counts, &mut buf, at, len)?;
                    at += len;
                }
                gathered = buf;
                &gathered
            }
        };
        // SAFETY: `counts` holds at least `n_counts` values and `all` as many
        // (checked when sized); the copy is ordered on the compute stream after
        // the kernels that wrote them; the pinned buffer is owned by the reading
        // returned, whose `finish_read` synchronizes this stream before the host
        // reads it and whose `Drop` waits for the event recorded below.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                &mut counts.as_mut_slice()[..n_counts],
                all.raw(),
                self.cu(),
            )
        }
        .map_err(super::driver::drv("cuMemcpyDtoHAsync"))?;
        let mut ids_at = Vec::with_capacity(queued.len());
        let mut at = 0;
        for (q, &cap) in queued.iter().zip(&id_caps) {
            ids_at.push(at);
            if let (Some(bottom), true) = (q.layers_rev.last(), cap > 0) {
                bottom.unique.check_len("bottom sources", cap)?;
                // SAFETY: as above; `ids[at..at + cap]` lies in the buffer
                // (sized by the sum of the capacities) and `unique` holds `cap`.
                unsafe {
                    cudarc::driver::result::memcpy_dtoh_async(
                        &mut ids.as_mut_slice()[at..at + cap],
                        bottom.unique.raw(),
                        self.cu(),
                    )
                }
                .map_err(super::driver::drv("cuMemcpyDtoHAsync"))?;
            }
            at += cap;
        }
        counts.record_copy(&self.compute.inner)?;
        ids.record_copy(&self.compute.inner)?;
        self.transfers.download(n_counts * 8 + n_ids * 4);
        Ok(CudaReading {
            queued,
            pinned: Some((counts, ids)),
            ids_at,
            stream,
        })
    }

    /// One synchronization of the compute stream (the copies of
    /// [`crate::Sampling::read_queued`] and any fault of the sampling kernels
    /// before them) — for a read of hops only, a wait for the copies' event —
    /// then the blocks from the counts and the bottom sources from the pinned
    /// ids; the pinned pair is kept for the next read.
    fn finish_read(&self, reading: CudaReading) -> Result<Vec<(DeviceBatch<Self>, Vec<u32>)>> {
        let CudaReading {
            queued,
            pinned,
            ids_at,
            stream,
        } = reading;
        if stream != self.cu() as usize {
            return Err(GpuOpsError::InvalidArgument {
                name: "reading",
                reason: "finished on another backend than the one whose stream read it".into(),
            });
        }
        let Some((counts, ids)) = pinned else {
            return Ok(Vec::new());
        };
        let slot = self.readback_slot(&queued);
        if queued.iter().any(|q| q.read_ids) {
            self.sync_compute()?;
        } else {
            // Hops only (sizes, no ids): wait for the copies' event, not the
            // stream, which may since wait for the compute stream's work
            // through the allocator (`alloc.rs` step 3). A fault of the hops'
            // kernels surfaces at this backend's next synchronization.
            counts.wait_copies()?;
            self.transfers.event_wait();
            if let Some(e) = self.pool.take_deferred() {
                return Err(e);
            }
        }
        let mut out = Vec::with_capacity(queued.len());
        let mut at = 0;
        let (all, all_ids) = (counts.as_slice(), ids.as_slice());
        for (q, &id_at) in queued.into_iter().zip(&ids_at) {
            let len = 4 * q.layers_rev.len();
            let c = all.get(at..at + len).ok_or_else(internal_counts)?;
            at += len;
            let read_ids = q.read_ids;
            let batch = q.finish(self, c)?;
            let n = batch.blocks.first().map_or(0, |b| b.num_src);
            let bottom = if read_ids {
                all_ids
                    .get(id_at..id_at + n)
                    .ok_or_else(internal_counts)?
                    .to_vec()
            } else {
                Vec::new()
            };
            out.push((batch, bottom));
        }
        let mut kept = slot.lock();
        let larger = kept
            .as_ref()
            .is_none_or(|(c, i)| c.len() <= counts.len() && i.len() <= ids.len());
        if larger {
            *kept = Some((counts, ids));
        }
        Ok(out)
    }

    /// One hop from device-resident destinations: checks what the host can check
    /// without a synchronization (lengths, fanout), then steps 2–5 of the module
    /// doc with `skip` as `sample_count`'s mask. A destination outside the graph is
    /// a device fault reported at the layer's count read; a repeated one fails the
    /// relabel's distinctness check.
    fn sample_hop(
        &self,
        graph: &CudaGraph,
        dst: &CudaBuf<u32>,
        n_dst: usize,
        fanout: u32,
        layer_seed: u64,
        skip: Option<&CudaBuf<u8>>,
    ) -> Result<(CudaBlock, CudaBuf<u32>, usize)> {
        let (frontier, mut counts) = self.hop_frontier(dst, n_dst, fanout, skip)?;
        let out = self.sample_layer(graph, frontier, fanout, layer_seed, counts.ptr_mut())?;
        let c = self.read_n::<u64, 4>(&counts, 0)?;
        out.finish(self, c, "dst")
    }

    fn unique_relabel(
        &self,
        targets: &CudaBuf<u32>,
        num_targets: usize,
        candidates: &CudaBuf<u32>,
        num_candidates: usize,
    ) -> Result<(CudaBuf<u32>, CudaBuf<u32>, usize)> {
        let total = num_targets.saturating_add(num_candidates);
        let mut counts = self.buf::<u64>(4, Init::Uninit, "relabel counts")?;
        let r = self.relabel(
            LiveIds {
                ids: targets,
                n: num_targets,
                live: None,
            },
            LiveIds {
                ids: candidates,
                n: num_candidates,
                live: None,
            },
            total,
            counts.ptr_mut(),
        )?;
        let [_, distinct, n_unique, _] = self.read_n::<u64, 4>(&counts, 0)?;
        if distinct as usize != num_targets {
            return Err(GpuOpsError::InvalidArgument {
                name: "targets",
                reason: format!("must be distinct: only {distinct} of its {num_targets} ids are"),
            });
        }
        let n_unique = usize::try_from(n_unique)
            .ok()
            .filter(|&n| n <= total)
            .ok_or_else(internal_counts)?;
        Ok((r.unique, r.local, n_unique))
    }

    /// A block from host CSR, validated by `cpu_ops::BlockView::new`.
    fn block_from_host(
        &self,
        num_src: usize,
        indptr: &[u64],
        indices: &[u32],
    ) -> Result<CudaBlock> {
        BlockView::new(num_src, indptr, indices)?;
        self.transfers
            .upload(std::mem::size_of_val(indptr) + std::mem::size_of_val(indices));
        let num_dst = indptr.len() - 1;
        let mut d_indptr = self.buf::<u64>(indptr.len(), Init::Uninit, "block indptr")?;
        self.upload_slice(&self.compute, indptr, &mut d_indptr)?;
        let mut d_indices = self.buf::<u32>(indices.len(), Init::Uninit, "block indices")?;
        self.upload_slice(&self.compute, indices, &mut d_indices)?;
        self.finish_block(num_src, num_dst, indices.len(), d_indptr, d_indices)
    }

    /// The block with a self-loop appended to every destination's row.
    fn add_self_loops(&self, block: &CudaBlock) -> Result<CudaBlock> {
        let edges = block
            .num_edges
            .checked_add(block.num_dst)
            .filter(|&e| e < u32::MAX as usize)
            .ok_or_else(|| GpuOpsError::InvalidArgument {
                name: "block",
                reason: format!(
                    "{} edges plus {} self-loops do not fit u32 edge ids",
                    block.num_edges, block.num_dst
                ),
            })?;
        let mut indptr = self.buf::<u64>(block.num_dst + 1, Init::Uninit, "block indptr")?;
        let mut indices = self.buf::<u32>(edges, Init::Uninit, "block indices")?;
        launch::block_add_self_loops {
            indptr: block.indptr.ptr(),
            indices: block.indices.ptr(),
            num_dst: block.num_dst as u64,
            new_indptr: indptr.ptr_mut(),
            new_indices: indices.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.grid_w(block.num_dst + 1))?;
        self.finish_block(block.num_src, block.num_dst, edges, indptr, indices)
    }

    fn block_to_host(&self, block: &CudaBlock) -> Result<(Vec<u64>, Vec<u32>)> {
        Ok((
            crate::backend::DeviceMemory::to_host(self, &block.indptr, block.num_dst + 1)?,
            crate::backend::DeviceMemory::to_host(self, &block.indices, block.num_edges)?,
        ))
    }

    fn block_shape(&self, block: &CudaBlock) -> (usize, usize, usize) {
        (block.num_src, block.num_dst, block.num_edges)
    }

    fn block_addresses(&self, block: &CudaBlock) -> (u64, u64) {
        (block.indptr.raw(), block.indices.raw())
    }

    fn hand_over_block(
        &self,
        block: &mut CudaBlock,
        ready: &super::device::CudaEventHandle,
        stream: u64,
    ) -> Result<()> {
        use crate::backend::DeviceMemory;
        self.hand_over(&mut block.indptr, ready, stream)?;
        self.hand_over(&mut block.indices, ready, stream)
    }
}
