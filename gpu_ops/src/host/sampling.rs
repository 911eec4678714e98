//! The host backend's [`Sampling`]: [`cpu_ops::NeighborSampler`] and
//! [`cpu_ops::sample_hop`] on the graph kept in host memory, the first-occurrence
//! relabel of [`Sampling::unique_relabel`], and queued batches that are sampled at
//! once (nothing runs asynchronously here) but counted as CUDA counts them.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use cpu_ops::{CsrGraph, NeighborSampler, SamplerScratch};

use crate::backend::{DeviceBatch, DeviceCore, Sampling, TopologyPlacement};
use crate::error::{GpuOpsError, Result};
use crate::host::block::HostBlock;
use crate::host::buffer::{prefix, HostBuf};
use crate::host::HostBackend;

/// A graph ready for [`crate::Sampling::sample`] on the host backend.
///
/// It holds a clone of the [`CsrGraph`] (cheap for a memory-mapped graph, a copy for
/// an owned one) and a pool of sampler scratch arrays, one per concurrent `sample`
/// call: a call takes one (or makes one) and puts it back, so calls on several threads
/// never wait for each other.
#[derive(Debug)]
pub struct HostGraph {
    graph: CsrGraph,
    scratch: Mutex<Vec<SamplerScratch>>,
}

impl HostGraph {
    pub(crate) fn new(graph: &CsrGraph) -> Self {
        Self {
            graph: graph.clone(),
            scratch: Mutex::new(Vec::new()),
        }
    }

    /// The topology.
    pub fn graph(&self) -> &CsrGraph {
        &self.graph
    }

    /// A scratch from the pool, or a new one. (The lock only guards a push or a pop,
    /// which cannot leave the pool half-changed, so a poisoned lock is still usable.)
    fn take_scratch(&self) -> SamplerScratch {
        let mut pool = self.scratch.lock();
        pool.pop()
            .unwrap_or_else(|| SamplerScratch::new(self.graph.num_vertices()))
    }

    fn put_scratch(&self, s: SamplerScratch) {
        let mut pool = self.scratch.lock();
        pool.push(s);
    }
}

/// [`crate::Sampling::sample`]: layered sampling from `seeds` down, one block per
/// fanout (bottom first), deterministic for `seed` on any thread count.
pub(crate) fn sample(
    g: &HostGraph,
    seeds: &[u32],
    fanouts: &[u32],
    seed: u64,
) -> Result<DeviceBatch<HostBackend>> {
    let sampler = NeighborSampler::new(fanouts.to_vec())?;
    let mut scratch = g.take_scratch();
    let batch = sampler.sample(&g.graph, seeds, seed, &mut scratch);
    // The sampler leaves its scratch clean on success and on error.
    g.put_scratch(scratch);
    let (_, blocks) = batch?.into_parts();
    let mut out = DeviceBatch {
        blocks: Vec::with_capacity(blocks.len()),
        src_ids: Vec::with_capacity(blocks.len()),
        num_seeds: seeds.len(),
    };
    for b in blocks {
        let (_, src_ids, indptr, indices) = b.into_parts();
        out.blocks
            .push(HostBlock::new(src_ids.len(), indptr, indices)?);
        out.src_ids.push(HostBuf::from_vec(src_ids));
    }
    Ok(out)
}

/// [`crate::Sampling::sample_queued_from`] with `from > 0`: layers
/// `from..fanouts.len()` hop by hop from the seeds down ([`cpu_ops::sample_hop`]
/// with `derive_seed(seed, l)`, which is layer `l` of [`sample`]), blocks bottom
/// first.
pub(crate) fn sample_from(
    g: &HostGraph,
    seeds: &[u32],
    fanouts: &[u32],
    from: usize,
    seed: u64,
) -> Result<DeviceBatch<HostBackend>> {
    crate::backend::check_fanouts_from(fanouts, from)?;
    let n = g.graph.num_vertices();
    if let Some(&bad) = seeds.iter().find(|&&s| s as usize >= n) {
        return Err(GpuOpsError::InvalidArgument {
            name: "seeds",
            reason: format!("seed {bad} is not below the vertex count {n}"),
        });
    }
    let layers = fanouts.len() - from;
    let mut blocks_rev = Vec::with_capacity(layers);
    let mut src_rev: Vec<Vec<u32>> = Vec::with_capacity(layers);
    let mut scratch = g.take_scratch();
    let mut result = Ok(());
    for l in (from..fanouts.len()).rev() {
        let dst = src_rev.last().map_or(seeds, Vec::as_slice);
        let layer_seed = cpu_ops::derive_seed(seed, l as u64);
        match cpu_ops::sample_hop(&g.graph, dst, fanouts[l], layer_seed, None, &mut scratch) {
            Ok(block) => {
                let (_, src_ids, indptr, indices) = block.into_parts();
                blocks_rev.push((src_ids.len(), indptr, indices));
                src_rev.push(src_ids);
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    // The sampler leaves its scratch clean on success and on error.
    g.put_scratch(scratch);
    result?;
    let mut out = DeviceBatch {
        blocks: Vec::with_capacity(layers),
        src_ids: Vec::with_capacity(layers),
        num_seeds: seeds.len(),
    };
    for ((n_src, indptr, indices), src_ids) in blocks_rev.into_iter().zip(src_rev).rev() {
        out.blocks.push(HostBlock::new(n_src, indptr, indices)?);
        out.src_ids.push(HostBuf::from_vec(src_ids));
    }
    Ok(out)
}

/// A batch queued on the host backend ([`crate::Sampling::sample_queued_from`],
/// [`crate::Sampling::sample_hop_queued`]): sampled when it was queued.
pub struct HostQueued {
    pub(crate) batch: DeviceBatch<HostBackend>,
    /// Whether a read brings its bottom sources to the host (not for a hop).
    pub(crate) read_ids: bool,
}

impl std::fmt::Debug for HostQueued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostQueued")
            .field("blocks", &self.batch.blocks.len())
            .field("read_ids", &self.read_ids)
            .finish()
    }
}

/// A read of queued batches ([`crate::Sampling::read_queued`]) on the host
/// backend: the batches, sampled when they were queued.
pub struct HostReading(pub(crate) Vec<HostQueued>);

impl std::fmt::Debug for HostReading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostReading")
            .field("batches", &self.0.len())
            .finish()
    }
}

/// [`crate::Sampling::sample_hop`]: [`cpu_ops::sample_hop`] from `dst[..n_dst]`, with
/// the first `n_dst` flags of `skip`. Returns `(block, src_ids, num_src)`.
pub(crate) fn sample_hop(
    g: &HostGraph,
    dst: &HostBuf<u32>,
    n_dst: usize,
    fanout: u32,
    layer_seed: u64,
    skip: Option<&HostBuf<u8>>,
) -> Result<(HostBlock, HostBuf<u32>, usize)> {
    let dst = prefix("sample_hop dst", dst, n_dst)?;
    let skip = match skip {
        Some(s) => Some(prefix(
            "sample_hop skip (one flag per destination)",
            s,
            n_dst,
        )?),
        None => None,
    };
    let mut scratch = g.take_scratch();
    let block = cpu_ops::sample_hop(&g.graph, dst, fanout, layer_seed, skip, &mut scratch);
    // The sampler leaves its scratch clean on success and on error.
    g.put_scratch(scratch);
    let (_, src_ids, indptr, indices) = block?.into_parts();
    let n_src = src_ids.len();
    Ok((
        HostBlock::new(n_src, indptr, indices)?,
        HostBuf::from_vec(src_ids),
        n_src,
    ))
}

/// A hasher for `u32` keys: one multiply by a 64-bit odd constant (Fibonacci
/// hashing), plenty for vertex ids and much cheaper than SipHash.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.0 = (u64::from(v) ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// [`crate::Sampling::unique_relabel`]: `targets[..num_targets]` (distinct) first,
/// then the other ids of `candidates[..num_candidates]` in first-occurrence order;
/// `local[c]` is candidate `c`'s position in that list.
pub(crate) fn unique_relabel(
    targets: &HostBuf<u32>,
    num_targets: usize,
    candidates: &HostBuf<u32>,
    num_candidates: usize,
) -> Result<(HostBuf<u32>, HostBuf<u32>, usize)> {
    let targets = prefix("unique_relabel targets", targets, num_targets)?;
    let candidates = prefix("unique_relabel candidates", candidates, num_candidates)?;
    if num_targets.saturating_add(num_candidates) > u32::MAX as usize {
        return Err(GpuOpsError::InvalidArgument {
            name: "num_targets + num_candidates",
            reason: format!("{num_targets} + {num_candidates} ids do not fit u32 local ids"),
        });
    }
    let mut pos: HashMap<u32, u32, BuildHasherDefault<IdHasher>> = HashMap::default();
    pos.reserve(num_targets + num_candidates);
    let mut unique = Vec::with_capacity(num_targets + num_candidates);
    for (i, &t) in targets.iter().enumerate() {
        if let Some(&first) = pos.get(&t) {
            return Err(GpuOpsError::InvalidArgument {
                name: "targets",
                reason: format!(
                    "vertex {t} appears at positions {first} and {i}; targets must be distinct"
                ),
            });
        }
        // Fits u32: checked above.
        pos.insert(t, i as u32);
        unique.push(t);
    }
    let mut local = Vec::with_capacity(num_candidates);
    for &c in candidates {
        let next = unique.len() as u32;
        let id = *pos.entry(c).or_insert(next);
        if id == next {
            unique.push(c);
        }
        local.push(id);
    }
    let n = unique.len();
    Ok((HostBuf::from_vec(unique), HostBuf::from_vec(local), n))
}

/// Synchronizations are counted as the CUDA backend makes them (`cuda/sampling.rs`),
/// so that tests of the sampling protocol hold on both: a batch's sizes reaching
/// the host is one (`sample`, `sample_hop`, `unique_relabel`, each
/// `resolve_queued` call), `sample_queued` none.
impl Sampling for HostBackend {
    /// Sampled at once (nothing runs asynchronously here).
    type Queued = HostQueued;
    /// The batches, already on the host.
    type Reading = HostReading;

    /// The topology stays in host memory whatever `placement` asks: on this backend
    /// both placements are the same memory.
    fn load_graph(&self, graph: &CsrGraph, _placement: TopologyPlacement) -> Result<HostGraph> {
        Ok(HostGraph::new(graph))
    }

    fn sample(
        &self,
        graph: &HostGraph,
        seeds: &[u32],
        fanouts: &[u32],
        seed: u64,
    ) -> Result<DeviceBatch<Self>> {
        let batch = sample(graph, seeds, fanouts, seed)?;
        // The layer sizes reach the host: the CUDA backend's one read a batch.
        self.transfers.sync();
        Ok(batch)
    }

    fn sample_queued_from(
        &self,
        graph: &HostGraph,
        seeds: &[u32],
        fanouts: &[u32],
        from: usize,
        seed: u64,
    ) -> Result<HostQueued> {
        let batch = if from == 0 {
            sample(graph, seeds, fanouts, seed)
        } else {
            sample_from(graph, seeds, fanouts, from, seed)
        }?;
        Ok(HostQueued {
            batch,
            read_ids: true,
        })
    }

    fn sample_hop_queued(
        &self,
        graph: &HostGraph,
        dst: &HostBuf<u32>,
        n_dst: usize,
        fanout: u32,
        layer_seed: u64,
        skip: Option<&HostBuf<u8>>,
    ) -> Result<HostQueued> {
        let (block, src, _) = sample_hop(graph, dst, n_dst, fanout, layer_seed, skip)?;
        Ok(HostQueued {
            batch: DeviceBatch {
                blocks: vec![block],
                src_ids: vec![src],
                num_seeds: n_dst,
            },
            read_ids: false,
        })
    }

    fn resolve_queued(&self, queued: Vec<HostQueued>) -> Result<Vec<DeviceBatch<Self>>> {
        if !queued.is_empty() {
            // One read of every batch's sizes.
            self.transfers.sync();
        }
        Ok(queued.into_iter().map(|q| q.batch).collect())
    }

    /// Counts the downloads CUDA starts here: every batch's bottom sources
    /// (none for a queued hop).
    fn read_queued(&self, queued: Vec<HostQueued>) -> Result<HostReading> {
        for q in queued.iter().filter(|q| q.read_ids) {
            let n = q
                .batch
                .blocks
                .first()
                .map_or(0, |blk| self.block_shape(blk).0);
            self.transfers.download(n * 4);
        }
        Ok(HostReading(queued))
    }

    fn finish_read(&self, reading: HostReading) -> Result<Vec<(DeviceBatch<Self>, Vec<u32>)>> {
        let batches = reading.0;
        if batches.iter().any(|q| q.read_ids) {
            // The one wait for every batch's sizes and bottom sources.
            self.transfers.sync();
        } else if !batches.is_empty() {
            // Hops only: CUDA waits for the copies' event.
            self.transfers.event_wait();
        }
        batches
            .into_iter()
            .map(|HostQueued { batch: b, read_ids }| {
                let n = b.blocks.first().map_or(0, |blk| self.block_shape(blk).0);
                let ids = match b.src_ids.first() {
                    Some(src) if read_ids => prefix("bottom sources", src, n)?.to_vec(),
                    _ => Vec::new(),
                };
                Ok((b, ids))
            })
            .collect()
    }

    fn sampling_sibling(&self) -> Result<Option<Self>> {
        let sibling = Self::with_simd(self.simd);
        sibling.set_precision(self.precision())?;
        Ok(Some(sibling))
    }

    fn sample_hop(
        &self,
        graph: &HostGraph,
        dst: &HostBuf<u32>,
        n_dst: usize,
        fanout: u32,
        layer_seed: u64,
        skip: Option<&HostBuf<u8>>,
    ) -> Result<(HostBlock, HostBuf<u32>, usize)> {
        let hop = sample_hop(graph, dst, n_dst, fanout, layer_seed, skip)?;
        self.transfers.sync();
        Ok(hop)
    }

    fn unique_relabel(
        &self,
        targets: &HostBuf<u32>,
        num_targets: usize,
        candidates: &HostBuf<u32>,
        num_candidates: usize,
    ) -> Result<(HostBuf<u32>, HostBuf<u32>, usize)> {
        let r = unique_relabel(targets, num_targets, candidates, num_candidates)?;
        self.transfers.sync();
        Ok(r)
    }

    fn block_from_host(
        &self,
        num_src: usize,
        indptr: &[u64],
        indices: &[u32],
    ) -> Result<HostBlock> {
        let b = HostBlock::new(num_src, indptr.to_vec(), indices.to_vec())?;
        self.transfers
            .upload(std::mem::size_of_val(indptr) + std::mem::size_of_val(indices));
        Ok(b)
    }

    fn add_self_loops(&self, block: &HostBlock) -> Result<HostBlock> {
        block.with_self_loops()
    }

    fn block_to_host(&self, block: &HostBlock) -> Result<(Vec<u64>, Vec<u32>)> {
        let out = (block.indptr().to_vec(), block.indices().to_vec());
        self.transfers.download(out.0.len() * 8 + out.1.len() * 4);
        self.transfers.sync();
        Ok(out)
    }

    fn block_shape(&self, block: &HostBlock) -> (usize, usize, usize) {
        (block.num_src(), block.num_dst(), block.num_edges())
    }

    fn block_addresses(&self, block: &HostBlock) -> (u64, u64) {
        (
            block.indptr().as_ptr() as u64,
            block.indices().as_ptr() as u64,
        )
    }

    fn hand_over_block(
        &self,
        _block: &mut HostBlock,
        _ready: &Self::Event,
        _stream: u64,
    ) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpu_ops::BuildOptions;

    fn buf(v: &[u32]) -> HostBuf<u32> {
        HostBuf::from_vec(v.to_vec())
    }

    #[test]
    fn relabel_puts_targets_first_then_first_occurrences() {
        let (u, l, n) =
            unique_relabel(&buf(&[7, 3, 99]), 2, &buf(&[5, 3, 9, 5, 7, 1, 0]), 6).unwrap();
        assert_eq!(n, 5);
        assert_eq!(&u[..n], &[7, 3, 5, 9, 1]);
        assert_eq!(&l[..6], &[2, 1, 3, 2, 0, 4]);
        let (u, l, n) = unique_relabel(&buf(&[]), 0, &buf(&[4, 4]), 2).unwrap();
        assert_eq!((&u[..n], &l[..2]), (&[4][..], &[0, 0][..]));
    }

    #[test]
    fn relabel_rejects_repeated_targets_and_short_buffers() {
        let err = unique_relabel(&buf(&[1, 2, 1]), 3, &buf(&[]), 0).unwrap_err();
        let named = matches!(&err, GpuOpsError::InvalidArgument { name: "targets", reason }
            if reason.contains("vertex 1"));
        assert!(named, "{err}");
        assert!(matches!(
            unique_relabel(&buf(&[1]), 2, &buf(&[]), 0),
            Err(GpuOpsError::SizeMismatch {
                expected: 2,
                found: 1,
                ..
            })
        ));
        assert!(matches!(
            unique_relabel(&buf(&[1]), 1, &buf(&[3]), 2),
            Err(GpuOpsError::SizeMismatch {
                expected: 2,
                found: 1,
                ..
            })
        ));
    }

    #[test]
    fn sampling_reuses_scratch_and_reports_bad_seeds() {
        let edges: Vec<(u32, u32)> = (0..50).map(|v| (v, (v * 7 + 3) % 50)).collect();
        let g = CsrGraph::from_edges(50, &edges, BuildOptions::UNDIRECTED).unwrap();
        let hg = HostGraph::new(&g);
        let a = sample(&hg, &[1, 2, 3], &[2, 3], 9).unwrap();
        let b = sample(&hg, &[1, 2, 3], &[2, 3], 9).unwrap();
        assert_eq!(a.blocks.len(), 2);
        assert_eq!(a.num_seeds, 3);
        for (x, y) in a.blocks.iter().zip(&b.blocks) {
            assert_eq!((x.indptr(), x.indices()), (y.indptr(), y.indices()));
        }
        assert_eq!(hg.scratch.lock().len(), 1, "one scratch reused");
        assert!(matches!(
            sample(&hg, &[50], &[2], 0),
            Err(GpuOpsError::CpuOps(
                cpu_ops::CpuOpsError::VertexOutOfRange { .. }
            ))
        ));
        assert!(sample(&hg, &[4, 4], &[2], 0).is_err());
        assert!(sample(&hg, &[4], &[], 0).is_err());
        assert!(sample(&hg, &[4], &[0], 0).is_err());
        // The pool still works after errors.
        let c = sample(&hg, &[1, 2, 3], &[2, 3], 9).unwrap();
        assert_eq!(c.blocks[0].indices(), a.blocks[0].indices());
    }
}
