//! One loader batch: the hops sampled from its seeds (module doc of
//! `loader`), the input vertices' feature rows and the seeds' labels, and the
//! per-hop counts and COO edges PyG's `NeighborLoader` output is laid out by.

use cpu_ops::{derive_seed, gather_rows, sample_hop, SamplerScratch};

use crate::data::Dataset;
use crate::error::{Error, Result};

use super::pool::RowBuffers;
use super::FeatureDtype;

/// The gathered input features: one row per input vertex (`n_id`), row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum Features {
    /// f32 values.
    F32(Vec<f32>),
    /// bfloat16 bit patterns (each value rounded to nearest, ties to even).
    Bf16(Vec<u16>),
}

impl Features {
    /// Values held (rows × dim).
    pub fn len(&self) -> usize {
        match self {
            Features::F32(v) => v.len(),
            Features::Bf16(v) => v.len(),
        }
    }

    /// Whether no value is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type held.
    pub fn dtype(&self) -> FeatureDtype {
        match self {
            Features::F32(_) => FeatureDtype::F32,
            Features::Bf16(_) => FeatureDtype::Bf16,
        }
    }
}

/// The edges of one hop: a CSR over the destinations (every vertex reached
/// before this hop; those sampled at an earlier hop have empty rows) whose
/// entries are local source ids (indices into the batch's `n_id`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hop {
    /// Destinations: the vertices reached before this hop (`n_id[..num_dst]`).
    pub num_dst: usize,
    /// Sources: the vertices reached up to this hop (`n_id[..num_src]`).
    pub num_src: usize,
    /// The first destination sampled at this hop (earlier ones have no edges
    /// here): the seeds' hop starts at 0.
    pub first_sampled: usize,
    /// Row offsets, `num_dst + 1` entries.
    pub indptr: Vec<u64>,
    /// Local source ids, grouped by destination.
    pub indices: Vec<u32>,
}

impl Hop {
    /// Sampled edges.
    pub fn num_edges(&self) -> usize {
        self.indices.len()
    }
}

/// One mini-batch (module doc of `loader`).
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Its index in the epoch.
    pub index: usize,
    /// Seeds: the first `num_seeds` entries of `n_id`.
    pub num_seeds: usize,
    /// Input vertices (global ids): the seeds, then each hop's new vertices.
    pub n_id: Vec<u32>,
    /// The hops from the seeds outwards (`hops[0]` is the seeds' hop, the
    /// last fanout).
    pub hops: Vec<Hop>,
    /// Feature columns.
    pub dim: usize,
    /// Row `i` is vertex `n_id[i]`'s feature row.
    pub x: Features,
    /// The seeds' class labels.
    pub y: Vec<u32>,
    /// [`Batch::coo_edges`], when the loader was asked to build it
    /// ([`super::LoaderOptions::edge_index`]).
    pub edge_index: Option<[Vec<i64>; 2]>,
}

impl Batch {
    /// Vertices first reached at each hop, the seeds first: PyG's
    /// `num_sampled_nodes` (`len = hops + 1`, summing to `n_id.len()`).
    pub fn num_sampled_nodes(&self) -> Vec<usize> {
        let mut out = vec![self.num_seeds];
        out.extend(self.hops.iter().map(|h| h.num_src - h.num_dst));
        out
    }

    /// Edges sampled at each hop, the seeds' hop first: PyG's
    /// `num_sampled_edges`.
    pub fn num_sampled_edges(&self) -> Vec<usize> {
        self.hops.iter().map(Hop::num_edges).collect()
    }

    /// Every sampled edge as `(source, destination)` local ids, the seeds' hop
    /// first and each hop in destination order: PyG's `edge_index` (row 0 the
    /// neighbor a message comes from, row 1 the vertex it goes to), as int64.
    pub fn coo_edges(&self) -> [Vec<i64>; 2] {
        let total = self.hops.iter().map(Hop::num_edges).sum();
        let (mut src, mut dst) = (Vec::with_capacity(total), Vec::with_capacity(total));
        for hop in &self.hops {
            src.extend(hop.indices.iter().map(|&s| i64::from(s)));
            for d in hop.first_sampled..hop.num_dst {
                let n = (hop.indptr[d + 1] - hop.indptr[d]) as usize;
                dst.extend(std::iter::repeat_n(d as i64, n));
            }
        }
        [src, dst]
    }
}

/// What one batch is built from.
pub(crate) struct BatchSpec<'a> {
    pub ds: &'a Dataset,
    /// Bottom first.
    pub fanouts: &'a [u32],
    pub seeds: &'a [u32],
    pub index: usize,
    /// `derive_seed(epoch seed, index)`.
    pub seed: u64,
    pub feature_dtype: FeatureDtype,
    /// Build the batch's COO edges too.
    pub edge_index: bool,
    /// Where the feature rows come from and the bf16 path's scratch goes.
    pub buffers: &'a RowBuffers,
}

/// Samples, gathers and labels one batch on rayon's current pool; `stop` is
/// asked between hops (`None` back: stopped).
pub(crate) fn build(
    spec: &BatchSpec<'_>,
    scratch: &mut SamplerScratch,
    stop: &dyn Fn() -> bool,
) -> Result<Option<Batch>> {
    let ds = spec.ds;
    let mut n_id = spec.seeds.to_vec();
    let mut hops = Vec::with_capacity(spec.fanouts.len());
    let mut first_sampled = 0;
    let mut skip = Vec::new();
    for (h, &fanout) in spec.fanouts.iter().rev().enumerate() {
        if stop() {
            return Ok(None);
        }
        skip.clear();
        skip.resize(n_id.len(), 1u8);
        skip[first_sampled..].fill(0);
        let block = sample_hop(
            &ds.graph,
            &n_id,
            fanout,
            derive_seed(spec.seed, h as u64),
            Some(&skip),
            scratch,
        )
        .map_err(|e| Error::cpu_ops("loader: sampling", e))?;
        let (num_dst, src_ids, indptr, indices) = block.into_parts();
        hops.push(Hop {
            num_dst,
            num_src: src_ids.len(),
            first_sampled,
            indptr,
            indices,
        });
        first_sampled = num_dst;
        n_id = src_ids;
    }
    let dim = ds.features.dim();
    let len = n_id.len() * dim;
    // A kept buffer is overwritten whole by the gather (`pool.rs`).
    let (mut rows, fresh) = spec.buffers.take_f32(len);
    if fresh {
        advise_huge_pages(&mut rows);
    }
    gather_rows(&ds.features, &n_id, &mut rows)
        .map_err(|e| Error::cpu_ops("loader: gathering features", e))?;
    let x = match spec.feature_dtype {
        FeatureDtype::F32 => Features::F32(rows),
        FeatureDtype::Bf16 => {
            let (mut bits, _) = spec.buffers.take_bf16(len);
            gpu_ops::to_bf16_bits_into(&rows, &mut bits);
            spec.buffers.give(Features::F32(rows));
            Features::Bf16(bits)
        }
    };
    let labels = ds.labels.as_slice();
    let y = spec.seeds.iter().map(|&s| labels[s as usize]).collect();
    let mut batch = Batch {
        index: spec.index,
        num_seeds: spec.seeds.len(),
        n_id,
        hops,
        dim,
        x,
        y,
        edge_index: None,
    };
    if spec.edge_index {
        batch.edge_index = Some(batch.coo_edges());
    }
    Ok(Some(batch))
}

/// Below this size a buffer is left to ordinary pages.
const HUGE_PAGE_MIN_BYTES: usize = 8 << 20;

/// Asks the kernel to back `buf` with transparent huge pages (Linux, where
/// they are enabled for `madvise`d memory), before anything writes to it.
///
/// A batch's rows are a fresh buffer when none was given back (`pool.rs`):
/// hundreds of MB at 2000 columns. Glibc maps such a buffer anew each
/// time and every 4 KiB page then faults on its first write, which on a
/// WordNet batch (33 k rows, 261 MB, 64 k faults) took longer than the gather
/// itself; 2 MiB pages take 512 times fewer faults. Advice only: a kernel
/// without huge pages ignores it, and the contents are unchanged either way.
fn advise_huge_pages(buf: &mut [f32]) {
    let bytes = std::mem::size_of_val(buf);
    if bytes < HUGE_PAGE_MIN_BYTES {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = buf.as_mut_ptr() as usize;
        let first = start.next_multiple_of(HUGE);
        let end = (start + bytes) / HUGE * HUGE;
        if end > first {
            // SAFETY: [first, end) lies inside `buf`, a live allocation this
            // function borrows mutably; MADV_HUGEPAGE changes how the pages are
            // backed, never their contents, and its failure is harmless.
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
            }
        }
    }
}
