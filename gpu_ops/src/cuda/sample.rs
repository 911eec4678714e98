//! Topology on the device, neighbor sampling, unique relabeling and blocks (kernels
//! in `kernels/sample.cu` and `kernels/aggregate.cu`).
//!
//! # One batch ([`crate::Sampling::sample`]), from the seeds down
//! 1. The seeds are checked on the host (in range, distinct) and uploaded.
//! 2. Per layer: `sample_count` writes `min(fanout, degree)` per destination; an
//!    in-place scan turns the counts into the block's `indptr`, whose last entry is
//!    the layer's edge count. The host does not read it: the edge buffers are sized
//!    by the bound `n · min(fanout, max degree)` and the kernels below read the count
//!    on the device. (A bound above `MAX_BOUNDED_EDGES` — e.g. `ALL_NEIGHBORS` on a
//!    graph with a huge hub — reads the count first instead: one more
//!    synchronization.)
//! 3. `sample_pick` fills the sampled neighbors' global ids (one warp per
//!    destination, Floyd's algorithm keyed by `(derive_seed(seed, layer), vertex)`,
//!    neighbors in the order of the graph's row; fanouts up to 32 keep the draws in
//!    registers, larger ones in a scratch buffer).
//! 4. [`CudaBackend::relabel`] makes the block's sources (destinations first, then new
//!    ids in first-occurrence order) and the local id of every edge. Its one
//!    synchronization reads three counts together (`relabel_counts`): the edges,
//!    the distinct destinations (the distinctness check) and the sources. The host
//!    needs the source count to size the next layer and the model's matrices, so
//!    this read stays: **one synchronization per layer** (three before, each
//!    followed by a fault-word read).
//! 5. The block's sources are the next layer's destinations. Its GCN source
//!    weights (`block_out_degree`, `block_src_weight`) are computed the first time
//!    a GCN aggregation reads them ([`CudaBackend::src_weights`]): SAGE and GAT
//!    batches skip that work (a memset and two launches per block).
//!
//! [`crate::Sampling::sample_hop`] runs steps 2–5 once from destinations already on
//! the device, with an optional skip mask that gives flagged destinations a count of
//! 0 in step 2 (so step 3 draws nothing for them and step 4 sees none of their
//! neighbors). Both paths share `sample_layer`, and layer `l` of a batch uses the key
//! `derive_seed(seed, l)`, so hop-by-hop sampling with those keys reproduces
//! `sample`.
//!
//! Everything but the random choices is a function of the input, so a batch is
//! reproducible for a seed on a given device; the draws differ from the host
//! sampler's (same distribution, another generator).

use cpu_ops::{BlockView, CsrGraph};

use super::alloc::{CudaBuf, Init};
use super::device::CudaBackend;
use super::kernels::{launch, Grid, Ptr, PtrMut};
use super::pinned::HostRegion;
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

/// A graph's CSR topology ready for [`crate::Backend::sample`].
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

/// The destinations of one sampled layer ([`CudaBackend::sample_layer`]): the
/// first `n` ids of `ids`, distinct (not checked before the relabel, which
/// reports a repeat naming them `name`), and an optional mask: a destination
/// flagged in `skip[..n]` gets no neighbors.
struct Frontier<'a> {
    ids: &'a CudaBuf<u32>,
    n: usize,
    skip: Option<&'a CudaBuf<u8>>,
    name: &'static str,
}

/// What [`CudaBackend::relabel`] returns.
struct Relabeled {
    /// The unique ids (targets first).
    unique: CudaBuf<u32>,
    /// Each live candidate's position in `unique` (sized by the capacity).
    local: CudaBuf<u32>,
    /// Entries of `unique`.
    n_unique: usize,
    /// Live candidates (entries of `local` written).
    n_candidates: usize,
}

impl CudaBackend {
    fn grid_t(&self, n: usize) -> Grid {
        Grid::threads_for(n as u64, self.kernels.max_blocks())
    }

    fn grid_w(&self, n: usize) -> Grid {
        Grid::warps_for(n as u64, self.kernels.max_blocks())
    }

    /// One layer (steps 2–5 of the module doc) from `frontier`, drawing `fanout`
    /// neighbors per destination with `layer_key`: returns
    /// `(block, src_ids, num_src)`. Callers check `fanout > 0` and the buffer
    /// lengths.
    fn sample_layer(
        &self,
        graph: &CudaGraph,
        frontier: Frontier<'_>,
        fanout: u32,
        layer_key: u64,
    ) -> Result<(CudaBlock, CudaBuf<u32>, usize)> {
        let Frontier {
            ids: frontier,
            n,
            skip,
            name: frontier_name,
        } = frontier;
        let (g_indptr, g_indices) = graph.ptrs();
        let nv = graph.num_vertices as u64;
        // 2. counts → indptr.
        let mut indptr = self.buf::<u64>(n + 1, Init::Uninit, "block indptr")?;
        launch::sample_count {
            graph_indptr: g_indptr,
            num_vertices: nv,
            frontier: frontier.ptr(),
            n: n as u64,
            fanout,
            skip: skip.map_or(Ptr::null(), CudaBuf::ptr),
            counts: indptr.ptr_mut(),
            fault: self.fault_ptr(),
        }
        .launch(&self.kernels, self.cu(), self.grid_t(n + 1))?;
        self.scan_u64_in_place(&mut indptr, n + 1)?;
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
            layer_key,
            block_indptr: indptr.ptr(),
            positions: positions.as_mut().map_or(PtrMut::null(), CudaBuf::ptr_mut),
            nbrs: nbrs.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.grid_w(n))?;
        drop(positions);
        // 4. sources and local ids (the layer's one synchronization).
        let r = self.relabel(frontier, n, &nbrs, cap, live, frontier_name)?;
        // 5. the block.
        let block = self.finish_block(r.n_unique, n, r.n_candidates, indptr, r.local)?;
        Ok((block, r.unique, r.n_unique))
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

    /// Unique ids of `targets[..n_t] ++ candidates[..n_live]` (targets first, then
    /// first occurrences) and each candidate's position among them; see
    /// `sample.cu`. `n_live` is the device count `live` (at most `n_c`) when given,
    /// else `n_c`; the buffers are sized by `n_c`, and the one synchronization reads
    /// the live count, the distinct targets and the unique count together.
    /// `targets_name` names the targets in a "not distinct" error.
    fn relabel(
        &self,
        targets: &CudaBuf<u32>,
        n_t: usize,
        candidates: &CudaBuf<u32>,
        n_c: usize,
        live: Option<Ptr<u64>>,
        targets_name: &'static str,
    ) -> Result<Relabeled> {
        targets.check_len("unique_relabel targets", n_t)?;
        candidates.check_len("unique_relabel candidates", n_c)?;
        let total = n_t
            .checked_add(n_c)
            .filter(|&t| t <= MAX_RELABEL)
            .ok_or_else(|| GpuOpsError::InvalidArgument {
                name: "num_candidates",
                reason: format!("{n_t} targets + {n_c} candidates exceed the device relabel limit of {MAX_RELABEL}"),
            })?;
        if total == 0 {
            let empty = || self.buf::<u32>(0, Init::Uninit, "relabel output");
            return Ok(Relabeled {
                unique: empty()?,
                local: empty()?,
                n_unique: 0,
                n_candidates: 0,
            });
        }
        let live_ptr = live.unwrap_or(Ptr::null());
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
            b: candidates.ptr(),
            n_b: n_c as u64,
            live_b: live_ptr,
            keys,
            min_pos: keys.offset(cap + 1),
            cap: cap as u64,
            slot_of: slot_of.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.grid_t(total))?;
        // unique_flag writes all total + 1 flags (0 past the live positions), so the
        // scan's entry at `total` is the unique count.
        let mut ranks = self.buf::<u32>(total + 1, Init::Uninit, "relabel ranks")?;
        launch::unique_flag {
            slot_of: slot_of.ptr(),
            min_pos,
            n_a: n_t as u64,
            n_b: n_c as u64,
            live_b: live_ptr,
            flags: ranks.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.grid_t(total + 1))?;
        self.scan_u32_in_place(&mut ranks, total + 1)?;
        let mut counts = self.buf::<u64>(3, Init::Uninit, "relabel counts")?;
        launch::relabel_counts {
            live_b: live_ptr,
            n_b: n_c as u64,
            ranks: ranks.ptr(),
            n_a: n_t as u64,
            out: counts.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), Grid::exact(1, 32))?;
        let [n_live, distinct, n_unique] = self.read_n::<u64, 3>(&counts, 0)?;
        let n_live = usize::try_from(n_live)
            .ok()
            .filter(|&l| l <= n_c)
            .ok_or_else(|| GpuOpsError::InvalidArgument {
                name: "num_candidates",
                reason: format!(
                    "internal: {n_live} candidates on the device, more than the {n_c} sized for"
                ),
            })?;
        if distinct as usize != n_t {
            return Err(GpuOpsError::InvalidArgument {
                name: targets_name,
                reason: format!("must be distinct: only {distinct} of its {n_t} ids are"),
            });
        }
        let n_unique = n_unique as usize;
        let mut unique = self.buf::<u32>(n_unique, Init::Uninit, "unique ids")?;
        let mut local = self.buf::<u32>(n_c, Init::Uninit, "local ids")?;
        launch::unique_scatter {
            a: targets.ptr(),
            n_a: n_t as u64,
            b: candidates.ptr(),
            n_b: n_c as u64,
            live_b: live_ptr,
            slot_of: slot_of.ptr(),
            min_pos,
            ranks: ranks.ptr(),
            unique: unique.ptr_mut(),
            local: local.ptr_mut(),
        }
        .launch(&self.kernels, self.cu(), self.grid_t(total))?;
        Ok(Relabeled {
            unique,
            local,
            n_unique,
            n_candidates: n_live,
        })
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

/// The [`crate::Sampling`] family (module doc), on the helpers above.
impl crate::backend::Sampling for CudaBackend {
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

    /// Layered sampling (module doc).
    fn sample(
        &self,
        graph: &CudaGraph,
        seeds: &[u32],
        fanouts: &[u32],
        seed: u64,
    ) -> Result<DeviceBatch<Self>> {
        if fanouts.is_empty() {
            return Err(GpuOpsError::InvalidArgument {
                name: "fanouts",
                reason: "at least one layer is needed".into(),
            });
        }
        if let Some(l) = fanouts.iter().position(|&f| f == 0) {
            return Err(GpuOpsError::InvalidArgument {
                name: "fanouts",
                reason: format!(
                    "the fanout of layer {l} is 0; use ALL_NEIGHBORS ({}) to take every neighbor",
                    cpu_ops::ALL_NEIGHBORS
                ),
            });
        }
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
        let mut blocks_rev = Vec::with_capacity(fanouts.len());
        let mut srcs_rev: Vec<CudaBuf<u32>> = Vec::with_capacity(fanouts.len());
        let mut n = seeds.len();
        for layer in (0..fanouts.len()).rev() {
            let frontier = srcs_rev.last().unwrap_or(&seed_buf);
            let layer_key = cpu_ops::derive_seed(seed, layer as u64);
            let (block, src, n_src) = self
                .sample_layer(
                    graph,
                    Frontier {
                        ids: frontier,
                        n,
                        skip: None,
                        name: "frontier",
                    },
                    fanouts[layer],
                    layer_key,
                )
                .map_err(|e| match e {
                    GpuOpsError::InvalidArgument {
                        name: "fanout",
                        reason,
                    } => GpuOpsError::InvalidArgument {
                        name: "fanouts",
                        reason: format!("layer {layer}: {reason}"),
                    },
                    e => e,
                })?;
            blocks_rev.push(block);
            srcs_rev.push(src);
            n = n_src;
        }
        blocks_rev.reverse();
        srcs_rev.reverse();
        Ok(DeviceBatch {
            blocks: blocks_rev,
            src_ids: srcs_rev,
            num_seeds: seeds.len(),
        })
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
            n: n_dst,
            skip,
            name: "dst",
        };
        self.sample_layer(graph, frontier, fanout, layer_seed)
    }

    fn unique_relabel(
        &self,
        targets: &CudaBuf<u32>,
        num_targets: usize,
        candidates: &CudaBuf<u32>,
        num_candidates: usize,
    ) -> Result<(CudaBuf<u32>, CudaBuf<u32>, usize)> {
        let r = self.relabel(
            targets,
            num_targets,
            candidates,
            num_candidates,
            None,
            "targets",
        )?;
        Ok((r.unique, r.local, r.n_unique))
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
}
