//! Fused GraphSAGE-mean layer 0 for hot vertices: sample, aggregate and project in
//! one single-threaded pass over the host feature matrix.
//!
//! In layer-based orchestration the CPU workers compute the bottom-layer output rows
//! of "hot" vertices from the features in host memory. Done with the generic pieces
//! (one-hop [`NeighborSampler`](crate::NeighborSampler),
//! [`gather_rows`](crate::gather_rows) of every source, then the generic layer 0,
//! `gpu_ops::Layer0` on the host backend) it copies every source row once and, when `d_in > d_out`, multiplies every *source* row by
//! `W_neigh` (project first), about `fanout + 1` times the work of the destinations.
//! [`SageHotKernel`] computes, for each destination `i`,
//!
//! ```text
//! out_i = act(x_i·W_self + mean_{j ∈ N(i)} x_j·W_neigh + b)
//!       = act([x_i | mean_{j ∈ N(i)} x_j] · [W_self; W_neigh] + b)
//! ```
//!
//! always aggregating first, so each sampled neighbor row is read once, in place,
//! and the only FLOPs are one `rows × 2·d_in × d_out` GEMM.
//!
//! # One call, step by step
//! 1. **Check** every size and id ([`CpuOpsError`] naming what is wrong; nothing is
//!    written to `out` on error).
//! 2. **Draw.** For every destination `d`, its sampled neighbors: exactly the draw of
//!    a one-layer `NeighborSampler::new(vec![fanout]).sample(graph, dst, seed, ..)`
//!    (the shared `sampler::draw_neighbors` with `Rng::for_stream(derive_seed(seed,
//!    0), d)`), appended to one index stream `[d₀, N(d₀).., d₁, N(d₁).., ..]`. A
//!    hot vertex's row is long and its sampled entries are scattered over it, so the
//!    loop first draws a destination's *positions* and prefetches the lines they
//!    fall on, then reads the ids a few destinations later (`SageHotKernel::draw`).
//! 3. For each block of `block_rows` destinations:
//!    1. **Aggregate.** Row `r` of the block buffer `A` (`rows × 2·d_in`) becomes
//!       `[x_d | mean N(d)]`: two [`SimdOps::gather_sum`] calls on the stream (the
//!       self row with weight 1, the neighbors with `1/|N(d)|`; zeros for an
//!       isolated vertex), whose `ahead` argument is the rest of the stream, so
//!       feature rows are prefetched 8 entries ahead across destinations and blocks.
//!    2. **Project.** `out[block] = A · [W_self; W_neigh]` with the crate's packed
//!       GEMM on the calling thread, written straight into the caller's rows.
//!    3. **Epilogue.** `out[block] += b`, then ReLU when asked, while the block is
//!       still in L2. (So `out` is read back once: it may be pinned host memory, but
//!       should not be write-combined.)
//!
//! The block is sized so that `A` takes about `BLOCK_BYTES` = 512 KiB (it is written
//! by the aggregation and read back by the GEMM's packing, so it should stay in L2;
//! 256 rows at `d_in = 100`, 128 at 512). The
//! stacked weights, the index stream, the block buffer and the draw state live in the
//! kernel and are reused: once they have grown to a call's size, a steady stream of
//! calls allocates nothing of its own (the GEMM engine, `matrixmultiply`, still
//! allocates its packing buffers per product). Stack the weights once per weight
//! version ([`SageHotKernel::new`] or [`SageHotKernel::set_weights`]).
//!
//! Destinations need not be distinct: each one is computed on its own, so a repeated
//! vertex gets the same row (the same draw) every time it is listed.
//!
//! Sums run in a different order than the reference path's (aggregate-then-project,
//! SIMD lanes), so results agree with it to rounding, not bit for bit. A call is
//! deterministic and single-threaded: it never enters rayon's pool, so each worker of
//! a pool can run its own kernel.

use std::time::{Duration, Instant};

use crate::error::{CpuOpsError, Result};
use crate::features::FeatureMatrix;
use crate::gather::prefetch;
use crate::graph::CsrGraph;
use crate::matmul::{matmul_serial, Accumulate, MatMut, MatRef};
use crate::rng::derive_seed;
use crate::sampler::{draw_neighbors, draw_positions, PositionSet};
use crate::simd::{Bf16Rows, GatherRows, Simd, SimdOps};

/// Target size of the block buffer `A` (`rows × 2·d_in` `f32`): half a core's L2
/// on the Zen 5 dev box. Measured with `tandem bench hot` (1 thread, hidden 256):
/// at `d_in = 512`, 128 and 256 rows were equal within noise and 32–64 rows 10–20%
/// slower (the GEMM's efficiency grows with `m`); at `d_in = 100`, 32–256 rows were
/// all within noise.
const BLOCK_BYTES: usize = 512 << 10;
/// Block rows are a multiple of this (the GEMM's 16-row micro-kernel) ...
const BLOCK_ROW_STEP: usize = 16;
/// ... between these bounds.
const MIN_BLOCK_ROWS: usize = 16;
const MAX_BLOCK_ROWS: usize = 256;
/// How many destinations stage A of the draw runs ahead of stage B (and the offsets
/// prefetch ahead of stage A).
const DRAW_AHEAD: usize = 4;
/// Neighbor ids per cache line.
const LINE_IDS: usize = 64 / std::mem::size_of::<u32>();
/// Lines prefetched of a row taken whole (the hardware prefetcher follows).
const ALL_PREFETCH_LINES: usize = 4;

/// Time spent in each phase of [`SageHotKernel::compute_profiled`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HotProfile {
    /// Step 2: drawing the neighbors into the index stream.
    pub draw: Duration,
    /// Step 3.1: reading feature rows into the block buffers.
    pub aggregate: Duration,
    /// Steps 3.2–3.3: the GEMM, bias and activation.
    pub project: Duration,
}

impl HotProfile {
    /// Sum of the phases.
    pub fn total(&self) -> Duration {
        self.draw + self.aggregate + self.project
    }

    /// Adds `other`'s phases to these.
    pub fn add(&mut self, other: &HotProfile) {
        self.draw += other.draw;
        self.aggregate += other.aggregate;
        self.project += other.project;
    }
}

/// The feature rows the kernel reads: `f32`, or the bfloat16 host copy of a run
/// whose device stores bfloat16 rows (`device.feature_dtype = "bf16"`: half the
/// bytes per row, and the same rounded values the accelerator's layer 0 sees).
/// Sums run in `f32` either way.
#[derive(Clone, Copy, Debug)]
pub enum HotFeatures<'a> {
    /// One `f32` row per vertex.
    F32(&'a FeatureMatrix),
    /// One bfloat16 row per vertex (`dim` values each).
    Bf16(Bf16Rows<'a>),
}

impl<'a> From<&'a FeatureMatrix> for HotFeatures<'a> {
    fn from(f: &'a FeatureMatrix) -> Self {
        Self::F32(f)
    }
}

impl HotFeatures<'_> {
    /// Columns.
    pub fn dim(&self) -> usize {
        match self {
            Self::F32(f) => f.dim(),
            Self::Bf16(b) => b.dim,
        }
    }

    /// Bytes of one stored value (4 or 2).
    pub fn value_bytes(&self) -> usize {
        match self {
            Self::F32(_) => 4,
            Self::Bf16(_) => 2,
        }
    }

    /// Whole rows (`values / dim`; 0 for width 0).
    fn num_rows(&self) -> usize {
        match self {
            Self::F32(f) => f.num_rows(),
            Self::Bf16(b) => b.data.len().checked_div(b.dim).unwrap_or(0),
        }
    }
}

/// What one [`SageHotKernel::compute`] call computes: the layer-0 rows of `dst`
/// (global ids; repeats allowed), with neighbors drawn from `graph` as a one-layer
/// `NeighborSampler::new(vec![fanout]).sample(graph, dst, seed, ..)` would
/// ([`ALL_NEIGHBORS`](crate::ALL_NEIGHBORS) takes every neighbor), and ReLU applied
/// when `relu` (every layer but the last).
#[derive(Clone, Copy, Debug)]
pub struct HotRequest<'a> {
    /// The graph: row `v` lists the in-neighbors of `v`.
    pub graph: &'a CsrGraph,
    /// One row of `d_in` values per vertex of `graph` (`f32` or bfloat16).
    pub features: HotFeatures<'a>,
    /// The destinations, global ids.
    pub dst: &'a [u32],
    /// Neighbors drawn per destination (at least 1).
    pub fanout: u32,
    /// The draw's seed.
    pub seed: u64,
    /// Whether ReLU follows the bias.
    pub relu: bool,
}

/// The fused GraphSAGE-mean layer-0 kernel with its stacked weights and reusable
/// scratch (module doc). One per worker thread; `Clone` to make more.
#[derive(Clone, Debug)]
pub struct SageHotKernel {
    d_in: usize,
    d_out: usize,
    /// `[W_self; W_neigh]`, `2·d_in × d_out` row-major.
    weights: Vec<f32>,
    bias: Vec<f32>,
    simd: Simd,
    block_rows: usize,
    /// The index stream of step 2: per destination, itself then its sampled neighbors.
    stream: Vec<u32>,
    /// `starts[i]` is where destination `i`'s entries begin in `stream`;
    /// `dst.len() + 1` entries.
    starts: Vec<usize>,
    /// The block buffer `A` of step 3.1.
    block: Vec<f32>,
    /// State of the draws from long rows.
    draw_set: PositionSet,
    /// Per destination, what stage B of the draw has left to do.
    pending: Vec<Pending>,
}

/// The default block rows for a layer of input width `d_in` (module doc).
fn default_block_rows(d_in: usize) -> usize {
    let row_bytes = 2 * d_in.max(1) * std::mem::size_of::<f32>();
    let rows = (BLOCK_BYTES / row_bytes).clamp(MIN_BLOCK_ROWS, MAX_BLOCK_ROWS);
    rows / BLOCK_ROW_STEP * BLOCK_ROW_STEP
}

fn checked_mul(a: usize, b: usize, name: &'static str) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| CpuOpsError::InvalidArgument {
            name,
            reason: format!("{a} × {b} overflows"),
        })
}

impl SageHotKernel {
    /// A kernel for a SAGE layer 0 of shape `d_in → d_out` with `tensors` in the
    /// model's parameter order (`layer0.weight_self`, `layer0.weight_neigh`,
    /// `layer0.bias`, as `gpu_ops::ModelLayout` lists them): `W_self`
    /// (`d_in × d_out`), `W_neigh` (`d_in × d_out`), `b` (`d_out`). Stacks the
    /// weights; runs at the fastest SIMD level of this CPU.
    ///
    /// Fails with [`CpuOpsError::InvalidArgument`] for a zero width and with
    /// [`CpuOpsError::SizeMismatch`] for a wrong tensor count or length.
    pub fn new(tensors: &[Vec<f32>], d_in: usize, d_out: usize) -> Result<Self> {
        if d_in == 0 {
            return Err(CpuOpsError::InvalidArgument {
                name: "d_in",
                reason: "expected at least 1".into(),
            });
        }
        if d_out == 0 {
            return Err(CpuOpsError::InvalidArgument {
                name: "d_out",
                reason: "expected at least 1".into(),
            });
        }
        let w_len = checked_mul(checked_mul(2, d_in, "d_in")?, d_out, "d_in × d_out")?;
        let mut k = Self {
            d_in,
            d_out,
            weights: vec![0.0; w_len],
            bias: vec![0.0; d_out],
            simd: Simd::detect(),
            block_rows: default_block_rows(d_in),
            stream: Vec::new(),
            starts: Vec::new(),
            block: Vec::new(),
            draw_set: PositionSet::default(),
            pending: Vec::new(),
        };
        k.set_weights(tensors)?;
        Ok(k)
    }

    /// Replaces the weights with a newer version of the same shape (same order and
    /// lengths as [`SageHotKernel::new`]), reusing the stacked buffer. On error the
    /// old weights stay.
    pub fn set_weights(&mut self, tensors: &[Vec<f32>]) -> Result<()> {
        let [w_self, w_neigh, bias] = tensors else {
            return Err(CpuOpsError::SizeMismatch {
                what: "SAGE layer tensors (W_self, W_neigh, b)",
                expected: 3,
                found: tensors.len(),
            });
        };
        let half = self.d_in * self.d_out;
        for (t, what) in [
            (w_self, "W_self values (d_in × d_out)"),
            (w_neigh, "W_neigh values (d_in × d_out)"),
        ] {
            if t.len() != half {
                return Err(CpuOpsError::SizeMismatch {
                    what,
                    expected: half,
                    found: t.len(),
                });
            }
        }
        if bias.len() != self.d_out {
            return Err(CpuOpsError::SizeMismatch {
                what: "bias values (d_out)",
                expected: self.d_out,
                found: bias.len(),
            });
        }
        let (top, bottom) = self.weights.split_at_mut(half);
        top.copy_from_slice(w_self);
        bottom.copy_from_slice(w_neigh);
        self.bias.copy_from_slice(bias);
        Ok(())
    }

    /// The same kernel running the aggregation at `simd`'s level (e.g.
    /// `Simd::scalar()` for the reference twin). The GEMM engine picks its own level.
    pub fn with_simd(mut self, simd: Simd) -> Self {
        self.simd = simd;
        self
    }

    /// Sets the destinations per block (step 3; the default keeps the block buffer
    /// near 512 KiB). Fails with [`CpuOpsError::InvalidArgument`] for 0.
    pub fn set_block_rows(&mut self, rows: usize) -> Result<()> {
        if rows == 0 {
            return Err(CpuOpsError::InvalidArgument {
                name: "block rows",
                reason: "expected at least 1".into(),
            });
        }
        self.block_rows = rows;
        Ok(())
    }

    /// Input width.
    pub fn d_in(&self) -> usize {
        self.d_in
    }

    /// Output width.
    pub fn d_out(&self) -> usize {
        self.d_out
    }

    /// Destinations per block.
    pub fn block_rows(&self) -> usize {
        self.block_rows
    }

    /// The SIMD token the aggregation runs with.
    pub fn simd(&self) -> Simd {
        self.simd
    }

    /// Writes the rows `req` asks for to `out` (`req.dst.len() × d_out`,
    /// row-major; written directly, e.g. a pinned staging buffer).
    ///
    /// Errors, checked before anything is written: [`CpuOpsError::InvalidArgument`]
    /// for a fanout of 0; [`CpuOpsError::SizeMismatch`] when the features are not
    /// `num_vertices × d_in` or `out` is not `dst.len() × d_out`;
    /// [`CpuOpsError::VertexOutOfRange`] for a destination that is not a vertex.
    pub fn compute(&mut self, req: HotRequest<'_>, out: &mut [f32]) -> Result<()> {
        self.run(req, out, None)
    }

    /// [`SageHotKernel::compute`], also timing its phases (a few clock reads per
    /// block; for benchmarks).
    pub fn compute_profiled(&mut self, req: HotRequest<'_>, out: &mut [f32]) -> Result<HotProfile> {
        let mut profile = HotProfile::default();
        self.run(req, out, Some(&mut profile))?;
        Ok(profile)
    }

    /// Step 1: every check of [`SageHotKernel::compute`].
    fn check(&self, req: &HotRequest<'_>, out_len: usize) -> Result<()> {
        let HotRequest {
            graph,
            features,
            dst,
            fanout,
            ..
        } = *req;
        if fanout == 0 {
            return Err(CpuOpsError::InvalidArgument {
                name: "fanout",
                reason: format!(
                    "0 samples no neighbor; use ALL_NEIGHBORS ({}) to take every neighbor",
                    crate::ALL_NEIGHBORS
                ),
            });
        }
        if features.dim() != self.d_in {
            return Err(CpuOpsError::SizeMismatch {
                what: "feature columns (the layer's d_in)",
                expected: self.d_in,
                found: features.dim(),
            });
        }
        let n = graph.num_vertices();
        if let HotFeatures::Bf16(b) = features {
            if !b.data.len().is_multiple_of(b.dim.max(1)) {
                return Err(CpuOpsError::SizeMismatch {
                    what: "bfloat16 feature values (a whole number of rows)",
                    expected: b.data.len() / b.dim.max(1) * b.dim,
                    found: b.data.len(),
                });
            }
        }
        if features.num_rows() != n {
            return Err(CpuOpsError::SizeMismatch {
                what: "feature rows (one per graph vertex)",
                expected: n,
                found: features.num_rows(),
            });
        }
        let expected = checked_mul(dst.len(), self.d_out, "dst")?;
        if out_len != expected {
            return Err(CpuOpsError::SizeMismatch {
                what: "hot output values (destinations × d_out)",
                expected,
                found: out_len,
            });
        }
        if let Some(&bad) = dst.iter().find(|&&d| d as usize >= n) {
            return Err(CpuOpsError::VertexOutOfRange {
                context: "hot destinations",
                vertex: bad as u64,
                num_vertices: n,
            });
        }
        Ok(())
    }

    fn run(
        &mut self,
        req: HotRequest<'_>,
        out: &mut [f32],
        mut profile: Option<&mut HotProfile>,
    ) -> Result<()> {
        self.check(&req, out.len())?;
        let HotRequest {
            graph,
            features,
            dst,
            fanout,
            seed,
            relu,
        } = req;
        let clock = |on: bool| on.then(Instant::now);
        let elapsed = |t: Option<Instant>| t.map_or(Duration::ZERO, |t| t.elapsed());
        let timed = profile.is_some();

        let t = clock(timed);
        self.draw(graph, dst, fanout as usize, derive_seed(seed, 0));
        if let Some(p) = profile.as_deref_mut() {
            p.draw += elapsed(t);
        }

        let (d_in, d_out) = (self.d_in, self.d_out);
        let width = 2 * d_in;
        let rows = self.block_rows.min(dst.len()).max(1);
        if self.block.len() < rows * width {
            self.block.resize(rows * width, 0.0);
        }
        let w = MatRef::new(&self.weights, width, d_out)?;
        for (b, out_block) in out.chunks_mut(rows * d_out).enumerate() {
            let first = b * rows;
            let n = out_block.len() / d_out;

            // 3.1 Aggregate.
            let t = clock(timed);
            let a = &mut self.block[..n * width];
            for (r, a_row) in a.chunks_exact_mut(width).enumerate() {
                let (lo, hi) = (self.starts[first + r], self.starts[first + r + 1]);
                let (x_self, mean) = a_row.split_at_mut(d_in);
                let (own, nbrs) = self.stream[lo..hi].split_at(1);
                let post = if nbrs.is_empty() {
                    0.0
                } else {
                    1.0 / nbrs.len() as f32
                };
                let (after_own, after_nbrs) = (&self.stream[lo + 1..], &self.stream[hi..]);
                match features {
                    HotFeatures::F32(f) => {
                        let src = GatherRows {
                            data: f.as_slice(),
                            dim: d_in,
                            weights: None,
                        };
                        self.simd.gather_sum(src, own, after_own, 1.0, x_self);
                        self.simd.gather_sum(src, nbrs, after_nbrs, post, mean);
                    }
                    HotFeatures::Bf16(src) => {
                        self.simd.gather_sum_bf16(src, own, after_own, 1.0, x_self);
                        self.simd.gather_sum_bf16(src, nbrs, after_nbrs, post, mean);
                    }
                }
            }
            if let Some(p) = profile.as_deref_mut() {
                p.aggregate += elapsed(t);
            }

            // 3.2 Project, 3.3 epilogue.
            let t = clock(timed);
            let a = MatRef::new(&self.block[..n * width], n, width)?;
            matmul_serial(a, w, MatMut::new(out_block, n, d_out)?, Accumulate::No)?;
            for row in out_block.chunks_exact_mut(d_out) {
                self.simd.add(&self.bias, row);
                if relu {
                    for v in row.iter_mut() {
                        *v = if *v < 0.0 { 0.0 } else { *v };
                    }
                }
            }
            if let Some(p) = profile.as_deref_mut() {
                p.project += elapsed(t);
            }
        }
        Ok(())
    }

    /// Step 2: fills `stream` and `starts` for checked destinations.
    ///
    /// A two-stage software pipeline, because a hot vertex's row is long and its
    /// sampled entries are scattered over it: stage A draws destination `i`'s row
    /// positions ([`draw_positions`], pure arithmetic on the row length) into its
    /// slots and prefetches the lines they point at; stage B, `DRAW_AHEAD`
    /// destinations later, replaces each position by the neighbor id stored there.
    /// The offsets are prefetched `DRAW_AHEAD` destinations before stage A.
    fn draw(&mut self, graph: &CsrGraph, dst: &[u32], fanout: usize, layer_seed: u64) {
        let offsets = graph.offsets().as_slice();
        let indices = graph.indices().as_slice();
        self.stream.clear();
        self.starts.clear();
        self.pending.clear();
        for i in 0..dst.len() + DRAW_AHEAD {
            if let Some(&ahead) = dst.get(i + DRAW_AHEAD) {
                prefetch(&offsets[ahead as usize]);
            }
            // Stage A.
            if let Some(&d) = dst.get(i) {
                let (start, end) = (
                    offsets[d as usize] as usize,
                    offsets[d as usize + 1] as usize,
                );
                let n = end - start;
                let k = n.min(fanout);
                self.starts.push(self.stream.len());
                self.stream.push(d);
                let at = self.stream.len();
                self.stream.resize(at + k, 0);
                let slots = &mut self.stream[at..];
                let pending = if k == n {
                    // Take the whole row: prefetch its first lines, copy in stage B.
                    for id in indices[start..end]
                        .iter()
                        .step_by(LINE_IDS)
                        .take(ALL_PREFETCH_LINES)
                    {
                        prefetch(id);
                    }
                    Pending::All(start)
                } else if n - 1 <= u32::MAX as usize {
                    draw_positions(n, d, layer_seed, slots, &mut self.draw_set);
                    let mut last_line = usize::MAX;
                    for &p in slots.iter() {
                        let e = start + p as usize;
                        if e / LINE_IDS != last_line {
                            last_line = e / LINE_IDS;
                            prefetch(&indices[e]);
                        }
                    }
                    Pending::Positions(start)
                } else {
                    // Positions past u32 (a row of over 2³² entries): draw directly.
                    let row = &indices[start..end];
                    draw_neighbors(row, d, layer_seed, slots, &mut self.draw_set);
                    Pending::Done
                };
                self.pending.push(pending);
            }
            // Stage B.
            if let Some(j) = i.checked_sub(DRAW_AHEAD) {
                let lo = self.starts[j] + 1;
                let hi = self.starts.get(j + 1).copied().unwrap_or(self.stream.len());
                let slots = &mut self.stream[lo..hi];
                match self.pending[j] {
                    Pending::Positions(start) => {
                        for s in slots.iter_mut() {
                            *s = indices[start + *s as usize];
                        }
                    }
                    Pending::All(start) => {
                        slots.copy_from_slice(&indices[start..start + slots.len()])
                    }
                    Pending::Done => {}
                }
            }
        }
        self.starts.push(self.stream.len());
    }
}

/// What stage B of the draw still has to do for one destination.
#[derive(Clone, Copy, Debug)]
enum Pending {
    /// Its slots hold row positions; the row starts at this entry of the graph's
    /// indices.
    Positions(usize),
    /// It takes its whole row, which starts here.
    All(usize),
    /// Its slots hold the neighbor ids already.
    Done,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::BlockView;
    use crate::gather::gather_rows_into_vec;
    use crate::graph::BuildOptions;
    use crate::init::{Init, RELU_GAIN};
    use crate::rng::Rng;
    use crate::sampler::{NeighborSampler, SamplerScratch, ALL_NEIGHBORS};
    use crate::simd::{bf16_to_f32, SimdLevel};

    /// A graph of `n` vertices with every kind of row: isolated vertices (every
    /// 11th), short rows (degree 1..=12, so below, at and above small fanouts), and
    /// when `hub`, vertex 1 with a row longer than the sampler's bitmap path.
    fn graph(n: usize, hub: bool, seed: u64) -> CsrGraph {
        let mut r = Rng::new(seed);
        let mut edges = Vec::new();
        for v in 0..n as u32 {
            if v.is_multiple_of(11) {
                continue;
            }
            let deg = 1 + r.below(12) as u32;
            for _ in 0..deg {
                let u = r.below(n as u64) as u32;
                if !u.is_multiple_of(11) {
                    edges.push((u, v));
                }
            }
        }
        if hub {
            edges.extend(
                (2..n as u32)
                    .filter(|u| !u.is_multiple_of(11))
                    .map(|u| (u, 1)),
            );
        }
        CsrGraph::from_edges(n, &edges, BuildOptions::DIRECTED).unwrap()
    }

    fn features(n: usize, dim: usize, seed: u64) -> FeatureMatrix {
        let mut r = Rng::new(seed);
        let data: Vec<f32> = (0..n * dim).map(|_| r.next_f32() * 2.0 - 1.0).collect();
        FeatureMatrix::new(data.into(), n, dim).unwrap()
    }

    /// A SAGE layer 0 of `d_in → d_out`: `W_self`, `W_neigh` initialized as the
    /// model does (Xavier-uniform, ReLU's gain, streams 0 and 1 of `seed`), and a
    /// random (non-zero) bias.
    fn layer0(d_in: usize, d_out: usize, seed: u64) -> Vec<Vec<f32>> {
        let w = Init::XavierUniform {
            gain: RELU_GAIN,
            fan_in: d_in,
            fan_out: d_out,
        };
        let mut r = Rng::new(seed ^ 0xb1a5);
        vec![
            w.fill(d_in * d_out, seed, 0),
            w.fill(d_in * d_out, seed, 1),
            (0..d_out).map(|_| r.next_f32() - 0.5).collect(),
        ]
    }

    /// The request for `dst` of `g` and `f`.
    fn req<'a>(
        g: &'a CsrGraph,
        f: &'a FeatureMatrix,
        dst: &'a [u32],
        fanout: u32,
        seed: u64,
        relu: bool,
    ) -> HotRequest<'a> {
        HotRequest {
            graph: g,
            features: f.into(),
            dst,
            fanout,
            seed,
            relu,
        }
    }

    /// The path the kernel replaces, in plain `f64` scalar code: the one-hop
    /// sampler's block, the gathered rows of its sources, and for destination `i`
    /// `act(x_i·W_self + mean_{j∈N(i)} x_j·W_neigh + b)` (an isolated
    /// destination's mean is 0; ReLU when `req.relu`).
    fn reference(t: &[Vec<f32>], d_out: usize, req: HotRequest<'_>) -> Vec<f32> {
        let HotRequest {
            graph: g,
            features: f,
            dst,
            fanout,
            seed,
            relu,
        } = req;
        let d_in = f.dim();
        // bfloat16 rows: the reference computes on their exact `f32` values.
        let f = match f {
            HotFeatures::F32(f) => f.clone(),
            HotFeatures::Bf16(b) => {
                let wide: Vec<f32> = b.data.iter().map(|&x| bf16_to_f32(x)).collect();
                FeatureMatrix::new(wide.into(), b.data.len() / d_in, d_in).unwrap()
            }
        };
        let sampler = NeighborSampler::new(vec![fanout]).unwrap();
        let mut scratch = SamplerScratch::new(g.num_vertices());
        let batch = sampler.sample(g, dst, seed, &mut scratch).unwrap();
        let x = gather_rows_into_vec(&f, batch.input_ids()).unwrap();
        let b = &batch.blocks()[0];
        let view = BlockView::new(b.num_src(), b.indptr(), b.indices()).unwrap();
        let lin = |j: usize, w: &[f32], k: usize| -> f64 {
            (0..d_in)
                .map(|c| f64::from(x[j * d_in + c]) * f64::from(w[c * d_out + k]))
                .sum()
        };
        let mut out = Vec::with_capacity(dst.len() * d_out);
        for i in 0..view.num_dst() {
            let nb = view.neighbors(i);
            for k in 0..d_out {
                let mean = if nb.is_empty() {
                    0.0
                } else {
                    nb.iter().map(|&j| lin(j as usize, &t[1], k)).sum::<f64>() / nb.len() as f64
                };
                let v = lin(i, &t[0], k) + mean + f64::from(t[2][k]);
                out.push((if relu { v.max(0.0) } else { v }) as f32);
            }
        }
        out
    }

    fn assert_close(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "{what}[{k}]: got {g}, want {w}"
            );
        }
    }

    /// Distinct random vertices, always including the isolated 0 and the hub 1.
    fn destinations(n: usize, count: usize, seed: u64) -> Vec<u32> {
        let mut ids: Vec<u32> = (2..n as u32).collect();
        Rng::new(seed).shuffle(&mut ids);
        ids.truncate(count - 2);
        ids.insert(count / 3, 0);
        ids.insert(count / 2, 1);
        ids
    }

    /// Round-to-nearest-even bfloat16 bits (finite inputs), as the device rounds.
    fn to_bf16(x: f32) -> u16 {
        let b = x.to_bits();
        ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
    }

    /// bfloat16 rows: every SIMD level and block size against the `f64` scalar
    /// reference on the rounded inputs (tolerance 1e-5 relative, as for `f32`
    /// rows: the inputs are exact, only the sums' order differs), and against the
    /// same kernel on the `f32` rows the bfloat16 ones were rounded from (within
    /// bfloat16's rounding: 2⁻⁸ relative per input value).
    #[test]
    fn bf16_rows_match_the_reference_on_rounded_inputs() {
        let n = 3000;
        let g = graph(n, true, 21);
        let levels = SimdLevel::available();
        let mut case = 0u64;
        for (d_in, d_out) in [(7, 13), (33, 20), (100, 33), (16, 16), (129, 9)] {
            let f = features(n, d_in, 40 + d_in as u64);
            let bits: Vec<u16> = f.as_slice().iter().map(|&x| to_bf16(x)).collect();
            let rows = Bf16Rows {
                data: &bits,
                dim: d_in,
            };
            let dst = destinations(n, 120, case);
            let tensors = &layer0(d_in, d_out, 7 + d_in as u64);
            for fanout in [1, 10, ALL_NEIGHBORS] {
                case += 1;
                let r = HotRequest {
                    features: HotFeatures::Bf16(rows),
                    ..req(&g, &f, &dst, fanout, 300 + case, true)
                };
                let want = reference(tensors, d_out, r);
                let mut fp32 = vec![0.0; dst.len() * d_out];
                SageHotKernel::new(tensors, d_in, d_out)
                    .unwrap()
                    .compute(req(&g, &f, &dst, fanout, 300 + case, true), &mut fp32)
                    .unwrap();
                for &level in &levels {
                    let mut k = SageHotKernel::new(tensors, d_in, d_out)
                        .unwrap()
                        .with_simd(Simd::new(level).unwrap());
                    for block in [5, default_block_rows(d_in)] {
                        k.set_block_rows(block).unwrap();
                        let mut got = vec![f32::NAN; dst.len() * d_out];
                        k.compute(r, &mut got).unwrap();
                        let what =
                            format!("bf16 {d_in}→{d_out} fanout {fanout} {level} rows {block}");
                        assert_close(&got, &want, &what);
                        // Rounding the inputs moves each output by at most about
                        // 2⁻⁸ × Σ|x·w| (here ≲ 0.05 for these scales).
                        let worst = got
                            .iter()
                            .zip(&fp32)
                            .map(|(a, b)| (a - b).abs())
                            .fold(0.0f32, f32::max);
                        assert!(worst < 0.05, "{what}: {worst} from the f32 rows");
                    }
                }
            }
        }
        // A bfloat16 matrix that is not whole rows, or not one row per vertex.
        let t = layer0(7, 4, 1);
        let mut k = SageHotKernel::new(&t, 7, 4).unwrap();
        let f = features(n, 7, 2);
        let bits = vec![0u16; n * 7 - 3];
        let mut out = vec![0.0; 8];
        let bad = HotRequest {
            features: HotFeatures::Bf16(Bf16Rows {
                data: &bits,
                dim: 7,
            }),
            ..req(&g, &f, &[1, 2], 5, 1, true)
        };
        let e = k.compute(bad, &mut out).unwrap_err();
        assert!(e.to_string().contains("whole number of rows"), "{e}");
        let bits = vec![0u16; (n - 1) * 7];
        let bad = HotRequest {
            features: HotFeatures::Bf16(Bf16Rows {
                data: &bits,
                dim: 7,
            }),
            ..req(&g, &f, &[1, 2], 5, 1, true)
        };
        let e = k.compute(bad, &mut out).unwrap_err();
        assert!(e.to_string().contains("one per graph vertex"), "{e}");
    }

    #[test]
    fn matches_the_reference_path() {
        let n = 5000;
        let g = graph(n, true, 1);
        assert!(g.degree(1) > 4096, "the hub must take the sparse draw");
        let levels = SimdLevel::available();
        let mut case = 0;
        for (d_in, d_out) in [(7, 13), (13, 7), (33, 100), (100, 33), (16, 16)] {
            let f = features(n, d_in, d_in as u64);
            let dst = destinations(n, 150, case);
            for relu in [true, false] {
                let tensors = &layer0(d_in, d_out, (d_in * d_out) as u64);
                for fanout in [1, 5, 12, 25, ALL_NEIGHBORS] {
                    case += 1;
                    let seed = 100 + case;
                    let r = req(&g, &f, &dst, fanout, seed, relu);
                    let want = reference(tensors, d_out, r);
                    // Every SIMD level in turn, and block sizes that leave a partial
                    // last block as well as the default (one block here).
                    let level = levels[case as usize % levels.len()];
                    let mut k = SageHotKernel::new(tensors, d_in, d_out)
                        .unwrap()
                        .with_simd(Simd::new(level).unwrap());
                    for rows in [16, 7, default_block_rows(d_in)] {
                        k.set_block_rows(rows).unwrap();
                        let mut got = vec![f32::NAN; dst.len() * d_out];
                        k.compute(r, &mut got).unwrap();
                        let what = format!(
                            "{d_in}→{d_out} relu {relu} fanout {fanout} {level} rows {rows}"
                        );
                        assert_close(&got, &want, &what);
                    }
                }
            }
        }
    }

    #[test]
    fn every_simd_level_matches_the_scalar_twin() {
        let n = 800;
        let g = graph(n, false, 2);
        for d_in in [1, 7, 13, 33, 100, 129] {
            let d_out = 19;
            let f = features(n, d_in, 3);
            let tensors = &layer0(d_in, d_out, 4);
            let dst = destinations(n, 97, d_in as u64);
            let mut scalar = SageHotKernel::new(tensors, d_in, d_out)
                .unwrap()
                .with_simd(Simd::scalar());
            let mut want = vec![0.0; dst.len() * d_out];
            scalar
                .compute(req(&g, &f, &dst, 5, 9, true), &mut want)
                .unwrap();
            for level in SimdLevel::available() {
                let mut k = SageHotKernel::new(tensors, d_in, d_out)
                    .unwrap()
                    .with_simd(Simd::new(level).unwrap());
                let mut got = vec![0.0; dst.len() * d_out];
                k.compute(req(&g, &f, &dst, 5, 9, true), &mut got).unwrap();
                assert_close(&got, &want, &format!("d_in {d_in} {level}"));
            }
        }
    }

    #[test]
    fn repeated_destinations_get_the_same_row() {
        let n = 400;
        let g = graph(n, false, 5);
        let f = features(n, 13, 6);
        let t = layer0(13, 8, 7);
        let mut k = SageHotKernel::new(&t, 13, 8).unwrap();
        let dst = [5u32, 9, 5, 30, 9, 5];
        let mut got = vec![0.0; dst.len() * 8];
        k.compute(req(&g, &f, &dst, 3, 11, true), &mut got).unwrap();
        let want = reference(&t, 8, req(&g, &f, &[5, 9, 30], 3, 11, true));
        for (i, &d) in dst.iter().enumerate() {
            let j = [5, 9, 30].iter().position(|&x| x == d).unwrap();
            assert_close(
                &got[i * 8..(i + 1) * 8],
                &want[j * 8..(j + 1) * 8],
                &format!("row {i} (vertex {d})"),
            );
        }
    }

    #[test]
    fn scratch_and_weights_are_reused() {
        let n = 600;
        let g = graph(n, true, 8);
        let f = features(n, 33, 9);
        let (old, new) = (layer0(33, 20, 10), layer0(33, 20, 11));
        let dst = destinations(n, 300, 12);
        let mut k = SageHotKernel::new(&old, 33, 20).unwrap();
        let mut out = vec![0.0; dst.len() * 20];
        // A long call, a short one, then the long one again with newer weights.
        k.compute(req(&g, &f, &dst, ALL_NEIGHBORS, 1, true), &mut out)
            .unwrap();
        assert_close(
            &out,
            &reference(&old, 20, req(&g, &f, &dst, ALL_NEIGHBORS, 1, true)),
            "first call",
        );
        k.compute(req(&g, &f, &dst[..3], 4, 2, true), &mut out[..60])
            .unwrap();
        assert_close(
            &out[..60],
            &reference(&old, 20, req(&g, &f, &dst[..3], 4, 2, true)),
            "short call",
        );
        k.set_weights(&new).unwrap();
        k.compute(req(&g, &f, &dst, 10, 3, true), &mut out).unwrap();
        assert_close(
            &out,
            &reference(&new, 20, req(&g, &f, &dst, 10, 3, true)),
            "new weights",
        );
        // Nothing to do is fine.
        k.compute(req(&g, &f, &[], 10, 3, true), &mut []).unwrap();
    }

    #[test]
    fn bad_inputs_are_errors_that_name_the_problem() {
        let n = 50;
        let g = graph(n, false, 13);
        let f = features(n, 6, 14);
        let t = layer0(6, 4, 15);
        let msg = |e: CpuOpsError| e.to_string();

        // Construction.
        let e = SageHotKernel::new(&t[..2], 6, 4).unwrap_err();
        assert!(
            matches!(
                e,
                CpuOpsError::SizeMismatch {
                    expected: 3,
                    found: 2,
                    ..
                }
            ),
            "{e}"
        );
        assert!(msg(e).contains("W_self, W_neigh, b"));
        for (i, name) in [(0, "W_self"), (1, "W_neigh"), (2, "bias")] {
            let mut bad = t.clone();
            bad[i].pop();
            let e = SageHotKernel::new(&bad, 6, 4).unwrap_err();
            assert!(matches!(e, CpuOpsError::SizeMismatch { .. }), "{name}: {e}");
            assert!(msg(e).contains(name), "{name}");
        }
        let e = SageHotKernel::new(&t, 7, 4).unwrap_err();
        assert!(msg(e).contains("W_self values (d_in × d_out): expected 28, found 24"));
        for (d_in, d_out, name) in [(0, 4, "d_in"), (6, 0, "d_out")] {
            let e = SageHotKernel::new(&t, d_in, d_out).unwrap_err();
            assert!(
                matches!(e, CpuOpsError::InvalidArgument { name: got, .. } if got == name),
                "{e}"
            );
        }

        // A failed weight update keeps the old weights.
        let mut k = SageHotKernel::new(&t, 6, 4).unwrap();
        let mut want = vec![0.0; 8];
        k.compute(req(&g, &f, &[3, 4], 5, 1, true), &mut want)
            .unwrap();
        let mut bad = t.clone();
        bad[1] = vec![7.0; 23];
        assert!(k.set_weights(&bad).is_err());
        assert!(k.set_block_rows(0).is_err());

        // Compute: every check, and `out` untouched on error.
        let mut out = vec![-3.0f32; 8];
        let e = k
            .compute(req(&g, &f, &[3, 50], 5, 1, true), &mut out)
            .unwrap_err();
        assert!(
            matches!(
                e,
                CpuOpsError::VertexOutOfRange {
                    context: "hot destinations",
                    vertex: 50,
                    num_vertices: 50
                }
            ),
            "{e}"
        );
        let e = k
            .compute(req(&g, &f, &[3, 4], 5, 1, true), &mut out[..7])
            .unwrap_err();
        assert!(
            matches!(
                e,
                CpuOpsError::SizeMismatch {
                    what: "hot output values (destinations × d_out)",
                    expected: 8,
                    found: 7
                }
            ),
            "{e}"
        );
        let wide = features(n, 7, 16);
        let e = k
            .compute(req(&g, &wide, &[3, 4], 5, 1, true), &mut out)
            .unwrap_err();
        assert!(
            matches!(
                e,
                CpuOpsError::SizeMismatch {
                    what: "feature columns (the layer's d_in)",
                    expected: 6,
                    found: 7
                }
            ),
            "{e}"
        );
        let short = features(n - 1, 6, 17);
        let e = k
            .compute(req(&g, &short, &[3, 4], 5, 1, true), &mut out)
            .unwrap_err();
        assert!(
            matches!(
                e,
                CpuOpsError::SizeMismatch {
                    what: "feature rows (one per graph vertex)",
                    expected: 50,
                    found: 49
                }
            ),
            "{e}"
        );
        let e = k
            .compute(req(&g, &f, &[3, 4], 0, 1, true), &mut out)
            .unwrap_err();
        assert!(
            matches!(e, CpuOpsError::InvalidArgument { name: "fanout", .. }),
            "{e}"
        );
        assert!(out.iter().all(|&x| x == -3.0), "out was written on error");

        // Still the old weights.
        k.compute(req(&g, &f, &[3, 4], 5, 1, true), &mut out)
            .unwrap();
        assert_eq!(out, want);
    }
}
