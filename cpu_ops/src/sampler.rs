//! Layered neighbor sampling into blocks (DGL's message-flow graphs, PyG's bipartite
//! subgraphs).
//!
//! A [`NeighborSampler`] with fanouts `[f0, f1, .., fL-1]` (DGL's order: `f0` is the
//! bottom/input layer) turns a list of seed vertices into `L` [`Block`]s. Sampling
//! starts at the seeds with `fL-1` and walks down; `blocks[0]` is the input layer and
//! the destinations of the last block are the seeds.
//!
//! # One batch, step by step
//! 1. **Stamp.** The seeds get local ids `0..seeds.len()` in a per-vertex array of
//!    [`SamplerScratch`] that holds `epoch_base + local_id`; a repeated seed is found
//!    here. Each block's sources start with its destinations, which are the block
//!    above's sources in the same order, so a vertex keeps its local id in every
//!    block it appears in and this one stamp serves all layers.
//!
//! Then for each layer, from the seeds down:
//! 2. **Count.** In parallel over chunks of destinations, `min(fanout, degree)` (0 for
//!    a destination a skip mask marks, see [`sample_hop`]); a sequential prefix sum
//!    makes the block's `indptr`.
//! 3. **Sample.** In parallel over chunks of destinations, each destination draws its
//!    neighbors without replacement with its own generator,
//!    `Rng::for_stream(derive_seed(seed, layer), dst_global_id)`, and writes their
//!    global ids, in row order, into its slice of the block's `indices`.
//! 4. **Relabel.** In destination order, each sampled global id is replaced by its
//!    local id: one load from the per-vertex array; a vertex seen for the first time
//!    gets the next free local id and is appended to `src_ids`.
//!
//! After the bottom layer the epoch base moves past every id handed out, so nothing
//! is cleared between batches (the array is zeroed only when the base would overflow
//! `u32`, every few thousand batches).
//!
//! Steps 2–3 run on rayon's pool; every random choice depends only on
//! `(seed, layer, destination id)` and step 4 only on the order of destinations, so a
//! batch is identical for any thread count. Step 4 is the sequential part: it runs on
//! the calling worker, chunk by chunk in order as soon as each chunk is sampled, while
//! the other workers keep sampling (and the relabeller samples too when it would
//! otherwise wait), so the two overlap.
//!
//! [`sample_hop`] runs steps 1–4 for a single layer from a given destination list, so
//! a caller can decide between hops which destinations to leave unsampled (a skip
//! mask: their rows stay empty and only the other destinations' neighbors become
//! sources). With `layer_seed = derive_seed(seed, l)` and no mask it returns exactly
//! layer `l` of [`NeighborSampler::sample`] for the same destinations.
//!
//! All of it is bound by memory latency (random rows of a graph much larger than the
//! caches), so both loops prefetch a few items ahead.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use rayon::prelude::*;

use crate::aggregate::BlockView;
use crate::error::{CpuOpsError, Result};
use crate::gather::prefetch;
use crate::graph::CsrGraph;
use crate::rng::{derive_seed, Rng};

/// A fanout that takes every neighbor of each destination (full-neighbor layer).
pub const ALL_NEIGHBORS: u32 = u32::MAX;

/// Destinations per parallel task.
const CHUNK: usize = 256;
/// How many edges ahead the relabel pass prefetches its per-vertex entry.
const RELABEL_PREFETCH: usize = 128;
/// How many destinations ahead the sampling loop prefetches its row.
const ROW_PREFETCH: usize = 16;
/// Lines of a row prefetched (the rest is left to the hardware prefetcher).
const ROW_PREFETCH_LINES: usize = 2;
/// Busy-wait rounds of the relabeller before it yields its core.
const SPINS_BEFORE_YIELD: u32 = 256;
/// Rows up to this degree are sampled with an on-stack bitmap of positions.
const BITMAP_MAX_DEGREE: usize = 4096;

/// Samples a fixed number of neighbors per destination, layer by layer (GraphSAGE /
/// DGL `MultiLayerNeighborSampler` semantics, without replacement).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeighborSampler {
    fanouts: Vec<u32>,
}

impl NeighborSampler {
    /// A sampler with one fanout per GNN layer, counted from the input (bottom) layer:
    /// `fanouts[0]` is the bottom hop and `fanouts.last()` the hop from the seeds.
    /// [`ALL_NEIGHBORS`] takes every neighbor.
    ///
    /// Fails with [`CpuOpsError::InvalidArgument`] for an empty list or a fanout of 0.
    pub fn new(fanouts: Vec<u32>) -> Result<Self> {
        if fanouts.is_empty() {
            return Err(CpuOpsError::InvalidArgument {
                name: "fanouts",
                reason: "at least one layer is needed".into(),
            });
        }
        if let Some(layer) = fanouts.iter().position(|&f| f == 0) {
            return Err(CpuOpsError::InvalidArgument {
                name: "fanouts",
                reason: format!(
                    "the fanout of layer {layer} is 0; use ALL_NEIGHBORS ({ALL_NEIGHBORS}) \
                     to take every neighbor"
                ),
            });
        }
        Ok(Self { fanouts })
    }

    /// The fanouts, bottom layer first.
    pub fn fanouts(&self) -> &[u32] {
        &self.fanouts
    }

    /// The number of layers (blocks per batch).
    pub fn num_layers(&self) -> usize {
        self.fanouts.len()
    }

    /// Samples the blocks of one batch.
    ///
    /// `seeds` must be distinct vertices of `graph`; `seed` fixes every random choice,
    /// whatever the number of threads. Parallel on rayon's current pool.
    pub fn sample(
        &self,
        graph: &CsrGraph,
        seeds: &[u32],
        seed: u64,
        scratch: &mut SamplerScratch,
    ) -> Result<SampledBatch> {
        let mut out = SampledBatch::default();
        self.sample_into(graph, seeds, seed, scratch, &mut out)?;
        Ok(out)
    }

    /// Like [`NeighborSampler::sample`], but reuses the buffers of `out` (a batch from
    /// an earlier call, or `SampledBatch::default()`), so a steady stream of batches
    /// allocates nothing. On error `out` is left as it was.
    pub fn sample_into(
        &self,
        graph: &CsrGraph,
        seeds: &[u32],
        seed: u64,
        scratch: &mut SamplerScratch,
        out: &mut SampledBatch,
    ) -> Result<()> {
        let n = graph.num_vertices();
        if let Some(&bad) = seeds.iter().find(|&&s| s as usize >= n) {
            return Err(CpuOpsError::VertexOutOfRange {
                context: "seed list",
                vertex: bad as u64,
                num_vertices: n,
            });
        }
        scratch.begin_batch(n)?;
        scratch.stamp(seeds, "seeds")?;
        let layers = self.fanouts.len();
        let SampledBatch {
            seeds: batch_seeds,
            blocks,
        } = out;
        batch_seeds.clear();
        batch_seeds.extend_from_slice(seeds);
        blocks.truncate(layers);
        blocks.resize_with(layers, Block::default);
        for layer in (0..layers).rev() {
            let (lower, upper) = blocks.split_at_mut(layer + 1);
            let frontier: &[u32] = match upper.first() {
                Some(above) => &above.src_ids,
                None => batch_seeds,
            };
            let layer_seed = derive_seed(seed, layer as u64);
            sample_layer(
                graph,
                frontier,
                self.fanouts[layer],
                layer_seed,
                None,
                scratch,
                &mut lower[layer],
            );
        }
        // Every local id handed out in this batch is below the bottom block's source
        // count; retire them all.
        scratch.base += blocks[0].src_ids.len() as u32;
        Ok(())
    }
}

/// One hop of [`NeighborSampler::sample`]: the block whose destinations are `dst`,
/// `fanout` neighbors each ([`ALL_NEIGHBORS`] takes every one), drawn with the
/// per-layer seed `layer_seed`.
///
/// With `layer_seed = derive_seed(seed, l)` and `skip = None` the block equals layer
/// `l` of `NeighborSampler::sample(seed)` whose layer-`l` destinations are `dst` (every
/// destination draws from its own stream `Rng::for_stream(layer_seed, id)`), so
/// sampling hop by hop, each hop's destinations being the sources of the hop above,
/// reproduces the whole batch.
///
/// `skip`, when given, has one flag per destination: a destination with a non-zero
/// flag gets no neighbors (an empty `indptr` row), e.g. because its embedding comes
/// from elsewhere. Every other destination gets exactly the neighbors it gets without
/// the mask, and the sources are the destinations (in order) followed by the
/// neighbors of the unskipped destinations in first-occurrence order, so vertices only
/// skipped destinations would have read are not sources.
///
/// Errors: a vertex of `dst` outside `graph` ([`CpuOpsError::VertexOutOfRange`]); a
/// repeated destination or a `fanout` of 0 ([`CpuOpsError::InvalidArgument`] naming
/// `dst` or `fanout`); `skip.len() != dst.len()` ([`CpuOpsError::SizeMismatch`]
/// naming `skip`). `scratch` stays usable after an error. Parallel on rayon's current
/// pool, identical for any thread count.
pub fn sample_hop(
    graph: &CsrGraph,
    dst: &[u32],
    fanout: u32,
    layer_seed: u64,
    skip: Option<&[u8]>,
    scratch: &mut SamplerScratch,
) -> Result<Block> {
    let mut out = Block::default();
    sample_hop_into(graph, dst, fanout, layer_seed, skip, scratch, &mut out)?;
    Ok(out)
}

/// Like [`sample_hop`], but reuses the buffers of `out` (a block from an earlier call,
/// or `Block::default()`), so a steady stream of hops allocates nothing. On error
/// `out` is left as it was.
pub fn sample_hop_into(
    graph: &CsrGraph,
    dst: &[u32],
    fanout: u32,
    layer_seed: u64,
    skip: Option<&[u8]>,
    scratch: &mut SamplerScratch,
    out: &mut Block,
) -> Result<()> {
    if fanout == 0 {
        return Err(CpuOpsError::InvalidArgument {
            name: "fanout",
            reason: format!(
                "0 samples nothing; use ALL_NEIGHBORS ({ALL_NEIGHBORS}) to take every neighbor"
            ),
        });
    }
    if let Some(s) = skip {
        if s.len() != dst.len() {
            return Err(CpuOpsError::SizeMismatch {
                what: "skip (one flag per destination)",
                expected: dst.len(),
                found: s.len(),
            });
        }
    }
    let n = graph.num_vertices();
    if let Some(&bad) = dst.iter().find(|&&d| d as usize >= n) {
        return Err(CpuOpsError::VertexOutOfRange {
            context: "destination list",
            vertex: bad as u64,
            num_vertices: n,
        });
    }
    scratch.begin_batch(n)?;
    scratch.stamp(dst, "dst")?;
    sample_layer(graph, dst, fanout, layer_seed, skip, scratch, out);
    // Every local id handed out is below the block's source count; retire them all.
    scratch.base += out.src_ids.len() as u32;
    Ok(())
}

/// One layer of a sampled batch: a bipartite graph from source to destination
/// vertices (DGL's message-flow graph).
///
/// Local ids index `src_ids`. The destinations are the first `num_dst` sources, in the
/// order of the layer above's sources (or of the seeds); the other sources follow in
/// order of first appearance in `indices`. Sampled edges form a CSR over the
/// destinations: destination `j` aggregates from `indices[indptr[j]..indptr[j + 1]]`,
/// listed in the order they appear in the graph's row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Block {
    num_dst: usize,
    src_ids: Vec<u32>,
    indptr: Vec<u64>,
    indices: Vec<u32>,
}

impl Block {
    /// Number of destination vertices.
    pub fn num_dst(&self) -> usize {
        self.num_dst
    }

    /// Number of source vertices (destinations included).
    pub fn num_src(&self) -> usize {
        self.src_ids.len()
    }

    /// Number of sampled edges.
    pub fn num_edges(&self) -> usize {
        self.indices.len()
    }

    /// Global ids of all source vertices, destinations first.
    pub fn src_ids(&self) -> &[u32] {
        &self.src_ids
    }

    /// Global ids of the destination vertices (a prefix of [`Block::src_ids`]).
    pub fn dst_ids(&self) -> &[u32] {
        &self.src_ids[..self.num_dst]
    }

    /// Row offsets of the sampled edges (`num_dst + 1` entries).
    pub fn indptr(&self) -> &[u64] {
        &self.indptr
    }

    /// Local source ids of the sampled edges, grouped by destination.
    pub fn indices(&self) -> &[u32] {
        &self.indices
    }

    /// Local source ids sampled for local destination `dst`. Panics if
    /// `dst >= num_dst()`.
    pub fn neighbors(&self, dst: usize) -> &[u32] {
        &self.indices[self.indptr[dst] as usize..self.indptr[dst + 1] as usize]
    }

    /// Takes the block apart: `(num_dst, src_ids, indptr, indices)`.
    pub fn into_parts(self) -> (usize, Vec<u32>, Vec<u64>, Vec<u32>) {
        (self.num_dst, self.src_ids, self.indptr, self.indices)
    }
}

/// The output of [`NeighborSampler::sample`]: the seeds and one [`Block`] per layer,
/// `blocks[0]` being the input (bottom) layer.
///
/// Blocks chain: `blocks[i].dst_ids() == blocks[i + 1].src_ids()`, and the last
/// block's destinations are the seeds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SampledBatch {
    seeds: Vec<u32>,
    blocks: Vec<Block>,
}

impl SampledBatch {
    /// The seed vertices (the output rows of the model).
    pub fn seeds(&self) -> &[u32] {
        &self.seeds
    }

    /// The blocks, bottom (input) layer first.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// The vertices whose input features the batch needs: the bottom block's sources
    /// (the seeds for a batch without blocks).
    pub fn input_ids(&self) -> &[u32] {
        self.blocks.first().map_or(&self.seeds, |b| &b.src_ids)
    }

    /// Total sampled edges over all blocks.
    pub fn num_sampled_edges(&self) -> usize {
        self.blocks.iter().map(Block::num_edges).sum()
    }

    /// Takes the batch apart: `(seeds, blocks)`.
    pub fn into_parts(self) -> (Vec<u32>, Vec<Block>) {
        (self.seeds, self.blocks)
    }

    /// Leaves out of every block the edges whose `(destination, source)` pair
    /// of global ids is in `excluded` (sorted pair keys,
    /// [`sorted_pair_keys`](crate::sorted_pair_keys)); the other edges keep
    /// their order ([`exclude_edges`](crate::exclude_edges)), and the vertices
    /// stay (a block's sources and destinations are unchanged). Returns how
    /// many edges left.
    ///
    /// Errors: `excluded` not sorted.
    pub fn exclude_edges(&mut self, excluded: &[u64]) -> Result<usize> {
        let mut removed = 0;
        for b in &mut self.blocks {
            let view = BlockView::new(b.src_ids.len(), &b.indptr, &b.indices)?;
            let (indptr, indices) = crate::link::exclude_edges(&view, &b.src_ids, excluded)?;
            removed += b.indices.len() - indices.len();
            b.indptr = indptr;
            b.indices = indices;
        }
        Ok(removed)
    }
}

/// Reusable per-vertex state of the sampler: one `u32` per vertex holding
/// `epoch_base + local_id` for vertices already placed in the current layer.
///
/// Create it once per sampling thread with the graph's vertex count and pass it to
/// every [`NeighborSampler::sample`] call. It works with any graph; a larger one grows
/// it. Nothing is cleared between layers: the epoch base moves past the ids used, and
/// the array is zeroed only when the base would overflow (every few thousand batches).
#[derive(Clone, Debug)]
pub struct SamplerScratch {
    mark: Vec<u32>,
    base: u32,
    /// `(start, end)` of each destination's row in the graph's `indices`.
    rows: Vec<(u64, u64)>,
}

impl SamplerScratch {
    /// Scratch for graphs of up to `num_vertices` vertices.
    pub fn new(num_vertices: usize) -> Self {
        Self {
            mark: vec![0; num_vertices],
            base: 1,
            rows: Vec::new(),
        }
    }

    /// The number of vertices it holds state for.
    pub fn capacity(&self) -> usize {
        self.mark.len()
    }

    /// Makes room for a batch on a graph of `n` vertices: at most `n` local ids.
    fn begin_batch(&mut self, n: usize) -> Result<()> {
        if n >= u32::MAX as usize {
            return Err(CpuOpsError::InvalidArgument {
                name: "graph",
                reason: format!("the sampler supports fewer than {} vertices", u32::MAX),
            });
        }
        if self.mark.len() < n {
            self.mark.resize(n, 0);
        }
        if self.base as u64 + n as u64 > u32::MAX as u64 {
            self.mark.fill(0);
            self.base = 1;
        }
        Ok(())
    }

    /// Gives the vertices `ids` (the seeds, or one hop's destinations) local ids
    /// `0..len` (step 1); fails on a repeated vertex, naming the list `name`.
    fn stamp(&mut self, ids: &[u32], name: &'static str) -> Result<()> {
        let base = self.base;
        for (i, &d) in ids.iter().enumerate() {
            let m = &mut self.mark[d as usize];
            if *m >= base {
                // Retire the ids stamped so far so the next batch starts clean.
                self.base = base + i as u32;
                return Err(CpuOpsError::InvalidArgument {
                    name,
                    reason: format!("vertex {d} appears more than once"),
                });
            }
            *m = base + i as u32;
        }
        Ok(())
    }
}

/// Relabels `indices` (global ids) to local ids in place, appending newly seen
/// vertices to `src_ids`, whose length is the next free local id (step 4).
///
/// The loop is branch-free: whether a vertex is new is a coin flip the branch
/// predictor cannot learn, and a mispredict would cancel the loads in flight. The id
/// is written past the end unconditionally and the end advances by 0 or 1.
fn relabel(mark: &mut [u32], base: u32, indices: &mut [u32], src_ids: &mut Vec<u32>) {
    let start = src_ids.len();
    src_ids.resize(start + indices.len(), 0);
    let mut n = start;
    for &v in indices.iter().take(RELABEL_PREFETCH) {
        if let Some(m) = mark.get(v as usize) {
            prefetch(m);
        }
    }
    for e in 0..indices.len() {
        if let Some(&ahead) = indices.get(e + RELABEL_PREFETCH) {
            if let Some(m) = mark.get(ahead as usize) {
                prefetch(m);
            }
        }
        let v = indices[e];
        let m = mark[v as usize];
        let is_new = m < base;
        let local = if is_new { n as u32 } else { m - base };
        mark[v as usize] = base + local;
        src_ids[n] = v;
        n += is_new as usize;
        indices[e] = local;
    }
    src_ids.truncate(n);
}

/// Samples one block whose destinations are `frontier`, already stamped with local
/// ids `0..frontier.len()` (steps 2–4 of the module doc). Destinations whose `skip`
/// flag is non-zero (`skip.len() == frontier.len()`, checked by the caller) are given
/// an empty row, so they draw nothing and add no sources.
fn sample_layer(
    graph: &CsrGraph,
    frontier: &[u32],
    fanout: u32,
    layer_seed: u64,
    skip: Option<&[u8]>,
    scratch: &mut SamplerScratch,
    block: &mut Block,
) {
    let num_dst = frontier.len();
    let offsets = graph.offsets().as_slice();
    let indices = graph.indices().as_slice();
    block.num_dst = num_dst;
    block.src_ids.clear();
    block.src_ids.extend_from_slice(frontier);

    // 2. Count.
    let fanout64 = fanout as u64;
    let indptr = &mut block.indptr;
    indptr.clear();
    indptr.resize(num_dst + 1, 0);
    let rows = &mut scratch.rows;
    rows.clear();
    rows.resize(num_dst, (0, 0));
    indptr[1..]
        .par_chunks_mut(CHUNK)
        .zip(rows.par_chunks_mut(CHUNK))
        .zip(frontier.par_chunks(CHUNK))
        .enumerate()
        .for_each(|(chunk, ((counts, rows), dst))| {
            let skip = skip.map(|s| &s[chunk * CHUNK..chunk * CHUNK + dst.len()]);
            for (i, ((c, r), &d)) in counts.iter_mut().zip(rows).zip(dst).enumerate() {
                let d = d as usize;
                let start = offsets[d];
                // A skipped destination samples from an empty row.
                let end = match skip {
                    Some(s) if s[i] != 0 => start,
                    _ => offsets[d + 1],
                };
                *r = (start, end);
                *c = (end - start).min(fanout64);
            }
        });
    for j in 0..num_dst {
        indptr[j + 1] += indptr[j];
    }
    let total = indptr[num_dst] as usize;
    block.indices.clear();
    block.indices.resize(total, 0);

    // 3 + 4. Sample chunks in parallel; relabel them in order on this thread as they
    // complete. Each chunk's slice sits behind a mutex that is taken by its sampler
    // and, once `done` is set, by the relabeller: never contended for long.
    let num_chunks = num_dst.div_ceil(CHUNK);
    let mut slices: Vec<Mutex<&mut [u32]>> = Vec::with_capacity(num_chunks);
    let mut rest: &mut [u32] = &mut block.indices;
    for c in 0..num_chunks {
        let lo = indptr[c * CHUNK];
        let hi = indptr[((c + 1) * CHUNK).min(num_dst)];
        let (head, tail) = rest.split_at_mut((hi - lo) as usize);
        slices.push(Mutex::new(head));
        rest = tail;
    }
    let done: Vec<AtomicBool> = (0..num_chunks).map(|_| AtomicBool::new(false)).collect();
    let next_chunk = AtomicUsize::new(0);
    let fanout = fanout as usize;
    let base = scratch.base;
    let mark = &mut scratch.mark[..];
    let rows = &scratch.rows[..];

    // Claims and samples chunks until none is left unclaimed; returns false when
    // there was nothing to claim.
    let sample_one = || -> bool {
        let c = next_chunk.fetch_add(1, Ordering::Relaxed);
        if c >= num_chunks {
            return false;
        }
        let range = c * CHUNK..((c + 1) * CHUNK).min(num_dst);
        // Marks the chunk done even if sampling panics, so the relabeller never waits
        // forever; the scope rethrows the panic when it ends.
        let _done = SetOnDrop(&done[c]);
        let mut guard = lock(&slices[c]);
        sample_chunk(
            indices,
            &frontier[range.clone()],
            &rows[range],
            fanout,
            layer_seed,
            &mut guard,
        );
        true
    };

    let src_ids = &mut block.src_ids;
    let helpers = rayon::current_num_threads()
        .saturating_sub(1)
        .min(num_chunks);
    rayon::scope(|s| {
        for _ in 0..helpers {
            s.spawn(|_| while sample_one() {});
        }
        for c in 0..num_chunks {
            let mut idle = 0u32;
            while !done[c].load(Ordering::Acquire) {
                if sample_one() {
                    continue;
                }
                // Another worker is finishing chunk `c` (a few microseconds), unless
                // the OS descheduled it: then give it the core.
                idle += 1;
                if idle < SPINS_BEFORE_YIELD {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            let mut guard = lock(&slices[c]);
            relabel(mark, base, &mut guard, src_ids);
        }
    });
}

/// Sets a flag (with release ordering) when dropped.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Locks a chunk's slice; a poisoned lock (a panicking sampler) still holds valid data.
fn lock<'a, 'b>(m: &'a Mutex<&'b mut [u32]>) -> parking_lot::MutexGuard<'a, &'b mut [u32]> {
    m.lock()
}

/// Samples every destination of a chunk into `out` (their concatenated slices).
fn sample_chunk(
    indices: &[u32],
    dst: &[u32],
    rows: &[(u64, u64)],
    fanout: usize,
    layer_seed: u64,
    out: &mut [u32],
) {
    const LINE_IDS: usize = 64 / std::mem::size_of::<u32>();
    let prefetch_row = |(start, end): (u64, u64)| {
        let row = &indices[start as usize..end as usize];
        for id in row.iter().step_by(LINE_IDS).take(ROW_PREFETCH_LINES) {
            prefetch(id);
        }
    };
    for &r in rows.iter().take(ROW_PREFETCH) {
        prefetch_row(r);
    }
    let mut set = PositionSet::default();
    let mut pos = 0usize;
    for (i, (&d, &(start, end))) in dst.iter().zip(rows).enumerate() {
        if let Some(&ahead) = rows.get(i + ROW_PREFETCH) {
            prefetch_row(ahead);
        }
        let row = &indices[start as usize..end as usize];
        let k = row.len().min(fanout);
        draw_neighbors(row, d, layer_seed, &mut out[pos..pos + k], &mut set);
        pos += k;
    }
}

/// Draws the sampled neighbors of destination `dst`, whose graph row is `row`, into
/// `out` (step 3 for one destination), where `out.len()` is `min(fanout, row.len())`:
/// the whole row when it fits, else `out.len()` entries at distinct uniformly chosen
/// positions, in row order, drawn with `Rng::for_stream(layer_seed, dst)`.
///
/// This is the one definition of a destination's sample: the layered sampler and the
/// fused hot-vertex kernel ([`crate::hot_layer`], through [`draw_positions`]) both
/// use it, so they agree on every draw. `set` is reusable state of the draws from
/// long rows.
///
/// Panics if `out.len() > row.len()`.
pub(crate) fn draw_neighbors(
    row: &[u32],
    dst: u32,
    layer_seed: u64,
    out: &mut [u32],
    set: &mut PositionSet,
) {
    assert!(
        out.len() <= row.len(),
        "draw_neighbors: {} draws from a row of {}",
        out.len(),
        row.len()
    );
    if out.len() == row.len() {
        out.copy_from_slice(row);
        return;
    }
    let k = out.len();
    draw(row.len(), k, dst, layer_seed, set, |o, p| out[o] = row[p]);
}

/// The row positions behind [`draw_neighbors`] when it draws (`out.len() < n`, `n`
/// the row's length): `out[o]` is the position in the row of the `o`-th sampled
/// neighbor, ascending, so `row[out[o]]` is what `draw_neighbors` writes. For callers
/// that prefetch the sampled entries of a long row before reading them.
///
/// Panics unless `out.len() < n` and every position fits `u32` (`n ≤ 2³²`).
pub(crate) fn draw_positions(
    n: usize,
    dst: u32,
    layer_seed: u64,
    out: &mut [u32],
    set: &mut PositionSet,
) {
    assert!(
        out.len() < n && n - 1 <= u32::MAX as usize,
        "draw_positions: {} draws from a row of {n}",
        out.len()
    );
    let k = out.len();
    draw(n, k, dst, layer_seed, set, |o, p| out[o] = p as u32);
}

/// Draws `k < n` distinct positions of a row of `n` entries with `dst`'s generator
/// and hands them to `emit(o, position)` in ascending order, `o = 0..k`.
fn draw(
    n: usize,
    k: usize,
    dst: u32,
    layer_seed: u64,
    set: &mut PositionSet,
    emit: impl FnMut(usize, usize),
) {
    let mut rng = Rng::for_stream(layer_seed, dst as u64);
    if n <= BITMAP_MAX_DEGREE {
        sample_bitmap(n, k, &mut rng, emit);
    } else {
        sample_sparse(n, k, &mut rng, set, emit);
    }
}

/// Emits `k < n <= BITMAP_MAX_DEGREE` distinct uniformly chosen positions of a row of
/// `n`, ascending (Floyd's algorithm on a bitmap; when more than half the row is
/// taken, the left-out positions are drawn instead).
fn sample_bitmap(n: usize, k: usize, rng: &mut Rng, mut emit: impl FnMut(usize, usize)) {
    let complement = 2 * k > n;
    let m = if complement { n - k } else { k };
    let mut bits = [0u64; BITMAP_MAX_DEGREE / 64];
    for j in n - m..n {
        let t = rng.below(j as u64 + 1) as usize;
        let p = if bits[t / 64] >> (t % 64) & 1 == 1 {
            j
        } else {
            t
        };
        bits[p / 64] |= 1 << (p % 64);
    }
    let words = n.div_ceil(64);
    let mut o = 0;
    for (w, &word) in bits[..words].iter().enumerate() {
        let mut word = if complement { !word } else { word };
        if w + 1 == words && !n.is_multiple_of(64) {
            word &= (1u64 << (n % 64)) - 1;
        }
        while word != 0 {
            emit(o, w * 64 + word.trailing_zeros() as usize);
            o += 1;
            word &= word - 1;
        }
    }
    debug_assert_eq!(o, k);
}

/// Emits `k < n` distinct uniformly chosen positions of a long row of `n`, ascending
/// (Floyd's algorithm on a hash set).
fn sample_sparse(
    n: usize,
    k: usize,
    rng: &mut Rng,
    set: &mut PositionSet,
    mut emit: impl FnMut(usize, usize),
) {
    let n = n as u64;
    set.reset(k);
    for j in n - k as u64..n {
        let t = rng.below(j + 1);
        if !set.insert(t) {
            set.insert(j);
        }
    }
    set.chosen.sort_unstable();
    for (o, &p) in set.chosen.iter().enumerate() {
        emit(o, p as usize);
    }
}

/// A small open-addressing set of row positions (stored `+ 1`, 0 is empty), with the
/// positions also kept in insertion order: the reusable state of
/// [`draw_neighbors`] on rows longer than `BITMAP_MAX_DEGREE`.
#[derive(Clone, Debug, Default)]
pub(crate) struct PositionSet {
    table: Vec<u64>,
    chosen: Vec<u64>,
    shift: u32,
}

impl PositionSet {
    /// Empties the set and sizes it for `k` insertions (load factor ≤ 1/2).
    fn reset(&mut self, k: usize) {
        let cap = (2 * k).next_power_of_two().max(16);
        self.table.clear();
        self.table.resize(cap, 0);
        self.chosen.clear();
        self.shift = 64 - cap.trailing_zeros();
    }

    /// Inserts `p`; false if it was already there.
    fn insert(&mut self, p: u64) -> bool {
        let mask = self.table.len() - 1;
        let mut i = (p.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize;
        loop {
            let slot = self.table[i];
            if slot == 0 {
                self.table[i] = p + 1;
                self.chosen.push(p);
                return true;
            }
            if slot == p + 1 {
                return false;
            }
            i = (i + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::*;
    use crate::graph::BuildOptions;

    /// A random graph with `n` vertices and about `n * avg_deg` stored entries, plus
    /// a few hubs of degree > `BITMAP_MAX_DEGREE` when `hubs` (to reach the sparse
    /// path) and some isolated vertices.
    fn random_graph(
        n: usize,
        avg_deg: usize,
        hubs: bool,
        opts: BuildOptions,
        seed: u64,
    ) -> CsrGraph {
        let mut r = Rng::new(seed);
        let mut edges: Vec<(u32, u32)> = (0..n * avg_deg / 2)
            .map(|_| (r.below(n as u64 / 2 + 1) as u32, r.below(n as u64) as u32))
            .collect();
        if hubs {
            for h in 0..3u32 {
                edges.extend((0..n as u32).filter(|v| v % 7 != 0).map(|v| (v, h)));
            }
        }
        CsrGraph::from_edges(n, &edges, opts).unwrap()
    }

    /// Distinct random seeds.
    fn random_seeds(n: usize, count: usize, seed: u64) -> Vec<u32> {
        let mut ids: Vec<u32> = (0..n as u32).collect();
        Rng::new(seed).shuffle(&mut ids);
        ids.truncate(count);
        ids
    }

    /// Checks every structural and sampling invariant of `batch`.
    fn check_batch(g: &CsrGraph, sampler: &NeighborSampler, seeds: &[u32], batch: &SampledBatch) {
        let blocks = batch.blocks();
        assert_eq!(blocks.len(), sampler.num_layers());
        assert_eq!(batch.seeds(), seeds);
        assert_eq!(blocks.last().unwrap().dst_ids(), seeds);
        assert_eq!(batch.input_ids(), blocks[0].src_ids());
        for w in blocks.windows(2) {
            assert_eq!(w[0].dst_ids(), w[1].src_ids(), "blocks must chain");
        }
        let mut total = 0;
        for (layer, b) in blocks.iter().enumerate() {
            let fanout = sampler.fanouts()[layer] as usize;
            let unique: HashSet<u32> = b.src_ids().iter().copied().collect();
            assert_eq!(unique.len(), b.num_src(), "src_ids must be unique");
            assert_eq!(b.indptr().len(), b.num_dst() + 1);
            assert_eq!(b.indptr()[0], 0);
            assert_eq!(*b.indptr().last().unwrap() as usize, b.num_edges());
            // Every source past the destinations is used by some edge, and they
            // appear in order of first use.
            let mut first_use = Vec::new();
            let mut seen = vec![false; b.num_src()];
            for &l in b.indices() {
                assert!((l as usize) < b.num_src(), "local id out of range");
                if !seen[l as usize] {
                    seen[l as usize] = true;
                    if l as usize >= b.num_dst() {
                        first_use.push(l);
                    }
                }
            }
            let expected: Vec<u32> = (b.num_dst() as u32..b.num_src() as u32).collect();
            assert_eq!(
                first_use, expected,
                "new sources in order of first appearance"
            );
            for j in 0..b.num_dst() {
                let d = b.dst_ids()[j];
                let row = g.neighbors(d);
                let got: Vec<u32> = b
                    .neighbors(j)
                    .iter()
                    .map(|&l| b.src_ids()[l as usize])
                    .collect();
                assert_eq!(got.len(), row.len().min(fanout), "fanout of vertex {d}");
                if row.len() <= fanout {
                    assert_eq!(got, row, "a low-degree vertex takes all its neighbors");
                }
                // Rows are sorted and duplicate-free, and samples keep row order,
                // so sampled ids are strictly increasing members of the row.
                assert!(
                    got.windows(2).all(|w| w[0] < w[1]),
                    "duplicate or unordered neighbors of {d}: {got:?}"
                );
                for s in &got {
                    assert!(
                        row.binary_search(s).is_ok(),
                        "edge {s} -> {d} is not in the graph"
                    );
                }
            }
            total += b.num_edges();
        }
        assert_eq!(batch.num_sampled_edges(), total);
    }

    #[test]
    fn new_validates_fanouts() {
        assert!(NeighborSampler::new(vec![]).is_err());
        let err = NeighborSampler::new(vec![5, 0, 3]).unwrap_err();
        assert!(
            matches!(
                err,
                CpuOpsError::InvalidArgument {
                    name: "fanouts",
                    ..
                }
            ),
            "{err}"
        );
        let s = NeighborSampler::new(vec![25, 10, ALL_NEIGHBORS]).unwrap();
        assert_eq!(s.num_layers(), 3);
        assert_eq!(s.fanouts(), &[25, 10, ALL_NEIGHBORS]);
    }

    #[test]
    fn sampler_invariants_on_random_graphs() {
        let configs: [(&[u32], usize); 6] = [
            (&[5], 64),
            (&[25, 10, 5], 100),
            (&[3, 3], 1),
            (&[2, ALL_NEIGHBORS], 50),
            (&[40, 100], 30),
            (&[1, 1, 1, 1], 200),
        ];
        let mut scratch = SamplerScratch::new(0);
        for (gi, (n, deg, hubs)) in [
            (50, 4, false),
            (3000, 12, true),
            (20_000, 30, false),
            (7000, 3, true),
        ]
        .into_iter()
        .enumerate()
        {
            for opts in [BuildOptions::UNDIRECTED, BuildOptions::DIRECTED] {
                let g = random_graph(n, deg, hubs, opts, gi as u64);
                for (ci, &(fanouts, batch)) in configs.iter().enumerate() {
                    let sampler = NeighborSampler::new(fanouts.to_vec()).unwrap();
                    let seeds = random_seeds(n, batch.min(n), (gi * 10 + ci) as u64);
                    let batch = sampler.sample(&g, &seeds, ci as u64, &mut scratch).unwrap();
                    check_batch(&g, &sampler, &seeds, &batch);
                }
            }
        }
    }

    #[test]
    fn hubs_take_the_sparse_path() {
        let g = random_graph(10_000, 5, true, BuildOptions::UNDIRECTED, 3);
        assert!(g.degree(0) > BITMAP_MAX_DEGREE);
        for fanouts in [vec![10], vec![100], vec![5000]] {
            let sampler = NeighborSampler::new(fanouts).unwrap();
            let seeds = [0, 1, 2, 3];
            let batch = sampler
                .sample(&g, &seeds, 9, &mut SamplerScratch::new(10))
                .unwrap();
            check_batch(&g, &sampler, &seeds, &batch);
        }
    }

    #[test]
    fn multi_edges_are_sampled_by_position() {
        // Vertex 0 has neighbor 1 three times and neighbor 2 twice.
        let opts = BuildOptions {
            symmetrize: false,
            dedup: false,
            drop_self_loops: false,
        };
        let mut edges = vec![(1, 0), (1, 0), (1, 0), (2, 0), (2, 0), (3, 0), (0, 0)];
        edges.extend((4..40).map(|v| (v, 0)));
        let g = CsrGraph::from_edges(40, &edges, opts).unwrap();
        let row = g.neighbors(0).to_vec();
        let mut scratch = SamplerScratch::new(40);
        let mut hits = HashMap::new();
        for fanouts in [vec![ALL_NEIGHBORS], vec![43], vec![100]] {
            let s = NeighborSampler::new(fanouts).unwrap();
            let b = s.sample(&g, &[0], 1, &mut scratch).unwrap();
            let got: Vec<u32> = b.blocks()[0]
                .neighbors(0)
                .iter()
                .map(|&l| b.blocks()[0].src_ids()[l as usize])
                .collect();
            assert_eq!(got, row, "taking all keeps every parallel edge");
        }
        let s = NeighborSampler::new(vec![20]).unwrap();
        for seed in 0..2000 {
            let b = s.sample(&g, &[0], seed, &mut scratch).unwrap();
            let blk = &b.blocks()[0];
            let got: Vec<u32> = blk
                .neighbors(0)
                .iter()
                .map(|&l| blk.src_ids()[l as usize])
                .collect();
            assert_eq!(got.len(), 20);
            for v in [1u32, 2] {
                let c = got.iter().filter(|&&x| x == v).count();
                assert!(
                    c <= row.iter().filter(|&&x| x == v).count(),
                    "position sampled twice"
                );
                *hits.entry((v, c)).or_insert(0) += 1;
            }
            // Relabelled sources stay unique even with parallel edges.
            let unique: HashSet<u32> = blk.src_ids().iter().copied().collect();
            assert_eq!(unique.len(), blk.num_src());
        }
        // Every multiplicity of the parallel edges actually occurs.
        for c in 0..=3 {
            assert!(hits.get(&(1, c)).copied().unwrap_or(0) > 0, "{hits:?}");
        }
    }

    #[test]
    fn same_seed_same_batch_on_any_thread_count() {
        let g = random_graph(30_000, 20, true, BuildOptions::UNDIRECTED, 5);
        let sampler = NeighborSampler::new(vec![15, 10, 5]).unwrap();
        let seeds = random_seeds(30_000, 700, 1);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut scratch = SamplerScratch::new(30_000);
                let mut out = SampledBatch::default();
                // A reused scratch and output must not change the result.
                sampler
                    .sample_into(&g, &seeds[..100], 3, &mut scratch, &mut out)
                    .unwrap();
                sampler
                    .sample_into(&g, &seeds, 42, &mut scratch, &mut out)
                    .unwrap();
                out
            })
        };
        let one = run(1);
        check_batch(&g, &sampler, &seeds, &one);
        assert_eq!(one, run(2));
        assert_eq!(one, run(3));
        let fresh = sampler
            .sample(&g, &seeds, 42, &mut SamplerScratch::new(1))
            .unwrap();
        assert_eq!(one, fresh);
        let other = sampler
            .sample(&g, &seeds, 43, &mut SamplerScratch::new(1))
            .unwrap();
        assert_ne!(one.blocks()[0].indices(), other.blocks()[0].indices());
        assert_ne!(one.input_ids(), other.input_ids());
    }

    #[test]
    fn bad_seeds_are_errors_and_leave_the_scratch_usable() {
        let g = random_graph(500, 8, false, BuildOptions::UNDIRECTED, 8);
        let sampler = NeighborSampler::new(vec![4, 4]).unwrap();
        let mut scratch = SamplerScratch::new(500);
        let err = sampler.sample(&g, &[1, 500], 0, &mut scratch).unwrap_err();
        assert!(
            matches!(err, CpuOpsError::VertexOutOfRange { vertex: 500, .. }),
            "{err}"
        );
        let err = sampler
            .sample(&g, &[1, 2, 3, 2], 0, &mut scratch)
            .unwrap_err();
        assert!(
            matches!(err, CpuOpsError::InvalidArgument { name: "seeds", .. }),
            "{err}"
        );
        assert!(err.to_string().contains("vertex 2"), "{err}");
        // The failed call stamped 1, 2 and 3; they must not leak into the next batch.
        let seeds = [3, 2, 1, 4];
        let after = sampler.sample(&g, &seeds, 0, &mut scratch).unwrap();
        check_batch(&g, &sampler, &seeds, &after);
        assert_eq!(
            after,
            sampler
                .sample(&g, &seeds, 0, &mut SamplerScratch::new(0))
                .unwrap()
        );
        // A failed `sample_into` leaves the output batch alone.
        let mut out = after.clone();
        assert!(sampler
            .sample_into(&g, &[7, 7], 1, &mut scratch, &mut out)
            .is_err());
        assert_eq!(out, after);
        // No seeds: empty blocks.
        let empty = sampler.sample(&g, &[], 0, &mut scratch).unwrap();
        assert!(empty
            .blocks()
            .iter()
            .all(|b| b.num_src() == 0 && b.indptr() == [0]));
    }

    #[test]
    fn scratch_grows_and_survives_epoch_wraparound() {
        let small = random_graph(100, 6, false, BuildOptions::UNDIRECTED, 1);
        let big = random_graph(5000, 6, false, BuildOptions::UNDIRECTED, 2);
        let sampler = NeighborSampler::new(vec![5, 5]).unwrap();
        let mut scratch = SamplerScratch::new(100);
        let mut reference = SamplerScratch::new(0);
        for (i, g) in [&small, &big, &small, &big].into_iter().enumerate() {
            let seeds = random_seeds(g.num_vertices(), 50, i as u64);
            let got = sampler.sample(g, &seeds, 7, &mut scratch).unwrap();
            assert_eq!(got, sampler.sample(g, &seeds, 7, &mut reference).unwrap());
        }
        assert_eq!(scratch.capacity(), 5000);
        // Force the epoch base close to overflow: the next batches must reset it.
        scratch.base = u32::MAX - 3000;
        for i in 0..3 {
            let seeds = random_seeds(5000, 300, i);
            let got = sampler.sample(&big, &seeds, i, &mut scratch).unwrap();
            check_batch(&big, &sampler, &seeds, &got);
            assert_eq!(
                got,
                sampler
                    .sample(&big, &seeds, i, &mut SamplerScratch::new(0))
                    .unwrap()
            );
        }
    }

    /// Global ids of the neighbors of local destination `j`.
    fn global_row(b: &Block, j: usize) -> Vec<u32> {
        b.neighbors(j)
            .iter()
            .map(|&l| b.src_ids()[l as usize])
            .collect()
    }

    #[test]
    fn hop_by_hop_equals_sample() {
        let mut scratch = SamplerScratch::new(0);
        let mut hop_scratch = SamplerScratch::new(0);
        let configs: [&[u32]; 5] = [&[5], &[3, 7], &[25, 10, 5], &[ALL_NEIGHBORS, 2], &[1, 4, 2]];
        for (gi, (n, deg, hubs)) in [(60, 4, false), (4000, 12, true), (9000, 25, false)]
            .into_iter()
            .enumerate()
        {
            let g = random_graph(n, deg, hubs, BuildOptions::UNDIRECTED, 40 + gi as u64);
            for (ci, fanouts) in configs.iter().enumerate() {
                let sampler = NeighborSampler::new(fanouts.to_vec()).unwrap();
                let seeds = random_seeds(n, 300.min(n / 2), (gi * 10 + ci) as u64);
                let seed = 1000 + ci as u64;
                let batch = sampler.sample(&g, &seeds, seed, &mut scratch).unwrap();
                let mut dst = seeds.clone();
                // Reusing one output block across hops must not matter either.
                let mut out = Block::default();
                for l in (0..fanouts.len()).rev() {
                    let ls = derive_seed(seed, l as u64);
                    let hop = sample_hop(&g, &dst, fanouts[l], ls, None, &mut hop_scratch).unwrap();
                    assert_eq!(
                        &hop,
                        &batch.blocks()[l],
                        "graph {gi}, {fanouts:?}, layer {l}"
                    );
                    sample_hop_into(&g, &dst, fanouts[l], ls, None, &mut hop_scratch, &mut out)
                        .unwrap();
                    assert_eq!(out, hop);
                    // An all-zero mask is no mask.
                    let zeros = vec![0u8; dst.len()];
                    let masked =
                        sample_hop(&g, &dst, fanouts[l], ls, Some(&zeros), &mut hop_scratch)
                            .unwrap();
                    assert_eq!(masked, hop);
                    dst = hop.src_ids().to_vec();
                }
            }
        }
    }

    #[test]
    fn skip_empties_rows_and_drops_their_only_sources() {
        let g = random_graph(5000, 10, true, BuildOptions::UNDIRECTED, 77);
        let mut scratch = SamplerScratch::new(5000);
        let mut r = Rng::new(5);
        for (case, (num_dst, fanout, p_skip)) in [
            (700, 6, 0.3),
            (700, ALL_NEIGHBORS, 0.5),
            (1, 3, 1.0),
            (600, 15, 1.0),
            (257, 2, 0.9),
        ]
        .into_iter()
        .enumerate()
        {
            let dst = random_seeds(5000, num_dst, 200 + case as u64);
            let skip: Vec<u8> = (0..num_dst)
                .map(|_| {
                    if r.next_f64() < p_skip {
                        1 + r.below(255) as u8
                    } else {
                        0
                    }
                })
                .collect();
            let ls = derive_seed(case as u64, 3);
            let full = sample_hop(&g, &dst, fanout, ls, None, &mut scratch).unwrap();
            let masked = sample_hop(&g, &dst, fanout, ls, Some(&skip), &mut scratch).unwrap();
            assert_eq!(masked.num_dst(), num_dst);
            assert_eq!(masked.dst_ids(), &dst[..]);
            assert_eq!(masked.indptr().len(), num_dst + 1);
            // The expected sources: destinations, then the new ids of the unskipped
            // rows of the unmasked block in first-occurrence order.
            let mut want_src = dst.clone();
            let mut seen: HashSet<u32> = dst.iter().copied().collect();
            let mut edges = 0;
            for (j, &flag) in skip.iter().enumerate() {
                if flag != 0 {
                    assert!(
                        masked.neighbors(j).is_empty(),
                        "case {case}: skipped row {j}"
                    );
                    continue;
                }
                let row = global_row(&full, j);
                assert_eq!(global_row(&masked, j), row, "case {case}: row {j}");
                edges += row.len();
                for v in row {
                    if seen.insert(v) {
                        want_src.push(v);
                    }
                }
            }
            assert_eq!(masked.num_edges(), edges);
            assert_eq!(masked.src_ids(), &want_src[..], "case {case}: sources");
            if p_skip < 1.0 {
                assert!(
                    masked.num_src() < full.num_src(),
                    "case {case}: some sources are read only by skipped rows"
                );
            }
            if skip.iter().all(|&s| s != 0) {
                assert_eq!(masked.num_src(), num_dst);
                assert_eq!(masked.num_edges(), 0);
            }
        }
    }

    #[test]
    fn bad_hops_are_errors_and_leave_scratch_and_output_alone() {
        let g = random_graph(500, 8, false, BuildOptions::UNDIRECTED, 8);
        let mut scratch = SamplerScratch::new(500);
        let err = sample_hop(&g, &[1, 500], 4, 0, None, &mut scratch).unwrap_err();
        assert!(
            matches!(err, CpuOpsError::VertexOutOfRange { vertex: 500, .. }),
            "{err}"
        );
        let err = sample_hop(&g, &[1, 2, 3, 2], 4, 0, None, &mut scratch).unwrap_err();
        assert!(
            matches!(err, CpuOpsError::InvalidArgument { name: "dst", .. }),
            "{err}"
        );
        assert!(err.to_string().contains("vertex 2"), "{err}");
        let err = sample_hop(&g, &[1, 2], 4, 0, Some(&[0, 1, 0]), &mut scratch).unwrap_err();
        assert!(
            matches!(
                err,
                CpuOpsError::SizeMismatch {
                    expected: 2,
                    found: 3,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("skip"), "{err}");
        let err = sample_hop(&g, &[1, 2], 0, 0, None, &mut scratch).unwrap_err();
        assert!(
            matches!(err, CpuOpsError::InvalidArgument { name: "fanout", .. }),
            "{err}"
        );
        // The failed calls leak nothing into the next hop.
        let dst = [3, 2, 1, 4];
        let ok = sample_hop(&g, &dst, 4, 9, Some(&[0, 1, 0, 0]), &mut scratch).unwrap();
        assert_eq!(
            ok,
            sample_hop(
                &g,
                &dst,
                4,
                9,
                Some(&[0, 1, 0, 0]),
                &mut SamplerScratch::new(0)
            )
            .unwrap()
        );
        let mut out = ok.clone();
        assert!(sample_hop_into(&g, &[7, 7], 4, 9, None, &mut scratch, &mut out).is_err());
        assert!(sample_hop_into(&g, &[7], 4, 9, Some(&[]), &mut scratch, &mut out).is_err());
        assert_eq!(out, ok);
        // No destinations: an empty block.
        let empty = sample_hop(&g, &[], 4, 9, Some(&[]), &mut scratch).unwrap();
        assert_eq!((empty.num_src(), empty.indptr()), (0, &[0u64][..]));
    }

    /// Samples `fanout` of the `deg` neighbors of one vertex `trials` times and checks
    /// the per-neighbor counts with a chi-square test (far tail: > 6 sigma).
    fn assert_uniform(deg: u32, fanout: u32, trials: u64) {
        let edges: Vec<(u32, u32)> = (1..=deg).map(|v| (v, 0)).collect();
        let g = CsrGraph::from_edges(deg as usize + 1, &edges, BuildOptions::DIRECTED).unwrap();
        let sampler = NeighborSampler::new(vec![fanout]).unwrap();
        let mut scratch = SamplerScratch::new(g.num_vertices());
        let mut counts = vec![0u64; deg as usize + 1];
        let mut out = SampledBatch::default();
        for t in 0..trials {
            sampler
                .sample_into(&g, &[0], t, &mut scratch, &mut out)
                .unwrap();
            let b = &out.blocks()[0];
            for &l in b.neighbors(0) {
                counts[b.src_ids()[l as usize] as usize] += 1;
            }
        }
        let expected = trials as f64 * fanout as f64 / deg as f64;
        let chi2: f64 = counts[1..]
            .iter()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum();
        // Without replacement the variance per cell is smaller by (1 - k/n), which
        // only makes the statistic smaller.
        let df = (deg - 1) as f64;
        assert!(
            chi2 < df + 6.0 * (2.0 * df).sqrt(),
            "deg {deg} fanout {fanout}: chi2 {chi2:.1} with {df} dof; counts {counts:?}"
        );
        let min = *counts[1..].iter().min().unwrap() as f64;
        assert!(
            min > 0.5 * expected,
            "a neighbor is starved: {min} vs {expected}"
        );
    }

    #[test]
    fn positions_are_the_drawn_neighbors() {
        let mut set = PositionSet::default();
        let mut r = Rng::new(4);
        for n in [2, 3, 63, 64, 65, 200, 4096, 4097, 9000] {
            let row: Vec<u32> = (0..n).map(|_| r.next_u32()).collect();
            for k in [1, n / 3, n / 2 + 1, n - 1] {
                let k = k.clamp(1, n - 1);
                for dst in [0, 7, 123_456] {
                    let mut ids = vec![0; k];
                    draw_neighbors(&row, dst, 99, &mut ids, &mut set);
                    let mut pos = vec![0; k];
                    draw_positions(n, dst, 99, &mut pos, &mut set);
                    assert!(pos.windows(2).all(|w| w[0] < w[1]), "n {n} k {k}");
                    let mapped: Vec<u32> = pos.iter().map(|&p| row[p as usize]).collect();
                    assert_eq!(mapped, ids, "n {n} k {k} dst {dst}");
                }
            }
        }
    }

    #[test]
    fn sampling_is_roughly_uniform() {
        assert_uniform(10, 3, 20_000); // Floyd on a bitmap
        assert_uniform(30, 25, 20_000); // complement: drop 5 of 30
        assert_uniform(64, 63, 5_000);
        assert_uniform(65, 7, 20_000); // second bitmap word
        assert_uniform(5000, 40, 5_000); // sparse path (hash set)
    }

    /// `SampledBatch::exclude_edges` against a plain filter of each block's
    /// edges by their pair of global ids: a random half of the batch's edges
    /// and some pairs that are in no block, both directions of each.
    #[test]
    fn a_batch_leaves_out_exactly_the_excluded_pairs() {
        let g = random_graph(3000, 12, true, BuildOptions::UNDIRECTED, 7);
        let sampler = NeighborSampler::new(vec![10, 5, 3]).unwrap();
        let mut scratch = SamplerScratch::new(g.num_vertices());
        let seeds = random_seeds(3000, 64, 9);
        let batch = sampler.sample(&g, &seeds, 11, &mut scratch).unwrap();
        let mut r = Rng::new(5);
        let mut pairs = Vec::new();
        for b in batch.blocks() {
            for i in 0..b.num_dst() {
                for &j in b.neighbors(i) {
                    if r.below(2) == 0 {
                        let (d, s) = (b.src_ids()[i], b.src_ids()[j as usize]);
                        pairs.extend([(d, s), (s, d)]);
                    }
                }
            }
        }
        pairs.extend((0..50).map(|_| (r.below(3000) as u32, r.below(3000) as u32)));
        let set: HashSet<(u32, u32)> = pairs.iter().copied().collect();
        let mut out = batch.clone();
        let removed = out.exclude_edges(&crate::sorted_pair_keys(&pairs)).unwrap();
        let mut expected_removed = 0;
        for (b, e) in batch.blocks().iter().zip(out.blocks()) {
            assert_eq!(e.src_ids(), b.src_ids());
            assert_eq!(e.num_dst(), b.num_dst());
            assert_eq!(e.indptr().len(), b.num_dst() + 1);
            for i in 0..b.num_dst() {
                let kept: Vec<u32> = b
                    .neighbors(i)
                    .iter()
                    .copied()
                    .filter(|&j| !set.contains(&(b.src_ids()[i], b.src_ids()[j as usize])))
                    .collect();
                expected_removed += b.neighbors(i).len() - kept.len();
                assert_eq!(e.neighbors(i), &kept[..], "destination {i}");
            }
        }
        assert!(expected_removed > 0);
        assert_eq!(removed, expected_removed);
        assert!(out.exclude_edges(&[3, 1]).is_err(), "unsorted keys");
    }
}
