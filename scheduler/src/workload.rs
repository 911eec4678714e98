//! Simulated workloads: what each batch touches, from real sampled batches or
//! from a seeded synthetic generator, and the model and batch sizes the
//! simulator's cost estimates need ([`ModelShape`], [`BatchShape`]).
//!
//! A [`Workload`] keeps, per batch, the hot vertices its bottom layer needs (the
//! part that depends on the split) and the size of everything else. The
//! simulator asks it for a [`BatchShape`] under whatever split is in effect.
//!
//! One approximation: a hot vertex that is *not* CPU-computed (cached or, without
//! reuse, cold) adds `bottom_fanout` edges and `bottom_fanout + 1` inputs to its
//! batch's cold part, and cached inputs are estimated as `inputs ×
//! hot_input_fraction × cached / hot` (the hot inputs whose rows the cache holds).

use cpu_ops::{Rng, SampledBatch};

use crate::error::{invalid, Result, SchedulerError};
use crate::pipeline::{HotSplit, VertexClass};

/// Bytes of an `f32`.
const F32: u64 = 4;

/// The model dimensions the estimates need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelShape {
    /// Input feature width.
    pub feature_dim: u32,
    /// Hidden width (the bottom layer's output).
    pub hidden: u32,
    /// GNN layers (≥ 1).
    pub layers: u32,
    /// Fanout of the bottom layer (neighbors per hot vertex the CPU samples).
    pub bottom_fanout: u32,
}

impl ModelShape {
    /// A shape, after checking every field is at least 1.
    pub fn new(feature_dim: u32, hidden: u32, layers: u32, bottom_fanout: u32) -> Result<Self> {
        let m = Self {
            feature_dim,
            hidden,
            layers,
            bottom_fanout,
        };
        m.validate()?;
        Ok(m)
    }

    /// Checks every field is at least 1 (for shapes built field by field).
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("feature_dim", self.feature_dim),
            ("hidden", self.hidden),
            ("layers", self.layers),
            ("bottom_fanout", self.bottom_fanout),
        ] {
            if v == 0 {
                return Err(invalid(name, "at least 1", 0));
            }
        }
        Ok(())
    }

    /// Bytes of one input feature row.
    pub fn feature_row_bytes(&self) -> u64 {
        F32 * self.feature_dim as u64
    }

    /// Bytes of one hot row: layer 0's output for one vertex, as the CPU writes
    /// it to staging and the install uploads it into the slab (the runtime's
    /// `Engine::hot_width` values; with `hot_backward = "constant"` nothing else
    /// of a hot vertex crosses PCIe).
    pub fn hot_row_bytes(&self) -> u64 {
        F32 * self.hidden as u64
    }

    /// Bytes of the bottom layer's weights (what is published).
    pub fn bottom_weight_bytes(&self) -> u64 {
        F32 * self.feature_dim as u64 * self.hidden as u64
    }

    /// Number of weights (bottom layer `f × h`, each other layer `h × h`).
    pub fn parameters(&self) -> u64 {
        let (f, h) = (self.feature_dim as u64, self.hidden as u64);
        f * h + (self.layers as u64).saturating_sub(1) * h * h
    }
}

/// How big one batch is, split the way the cost estimates need (upper layers,
/// hot and cold bottom destinations).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchShape {
    /// Seed (output) vertices.
    pub seeds: u64,
    /// Destinations of the layers above the bottom, summed over layers.
    pub upper_dst: u64,
    /// Sampled edges of the layers above the bottom.
    pub upper_edges: u64,
    /// Bottom-layer destinations served by CPU embeddings.
    pub hot: u64,
    /// Bottom-layer destinations computed on the accelerator (cold and cached-hot).
    pub cold_dst: u64,
    /// Sampled bottom-layer edges of those destinations.
    pub cold_edges: u64,
    /// Distinct input vertices of those destinations (themselves included).
    pub cold_inputs: u64,
    /// Of those inputs, how many have their features in the device cache.
    pub cached_inputs: u64,
}

impl BatchShape {
    /// The shape of a sampled batch under `split` (ids must be relabeled ones).
    /// The batch may be sampled in full: hot destinations' bottom edges are simply
    /// not counted.
    pub fn from_sampled(batch: &SampledBatch, split: &HotSplit) -> Self {
        let blocks = batch.blocks();
        let mut s = Self {
            seeds: batch.seeds().len() as u64,
            ..Self::default()
        };
        let Some(bottom) = blocks.first() else {
            return s;
        };
        for b in &blocks[1..] {
            s.upper_dst += b.num_dst() as u64;
            s.upper_edges += b.num_edges() as u64;
        }
        let src = bottom.src_ids();
        let mut input = vec![false; bottom.num_src()];
        for (j, &v) in bottom.dst_ids().iter().enumerate() {
            if split.class(v) == VertexClass::CpuHot {
                s.hot += 1;
                continue;
            }
            s.cold_dst += 1;
            input[j] = true;
            let nb = bottom.neighbors(j);
            s.cold_edges += nb.len() as u64;
            for &l in nb {
                input[l as usize] = true;
            }
        }
        for (l, _) in input.iter().enumerate().filter(|(_, &m)| m) {
            s.cold_inputs += 1;
            s.cached_inputs += u64::from(split.class(src[l]) == VertexClass::CachedHot);
        }
        s
    }

    /// This shape with `k` of its CPU-hot destinations computed by the accelerator
    /// instead: each adds `bottom_fanout` sampled edges and `bottom_fanout + 1`
    /// inputs read from host memory (the workload's approximation).
    pub fn with_cold(&self, k: u64, bottom_fanout: u32) -> Self {
        let k = k.min(self.hot);
        let fan = bottom_fanout as u64;
        Self {
            hot: self.hot - k,
            cold_dst: self.cold_dst + k,
            cold_edges: self.cold_edges + k * fan,
            cold_inputs: self.cold_inputs + k * (fan + 1),
            ..*self
        }
    }
}

/// One batch of a workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchDemand {
    /// Hot bottom-layer destinations (relabeled ids below the hot count), sorted
    /// and distinct.
    pub hot: Vec<u32>,
    /// The rest of the batch: the shape with every hot destination removed
    /// (`hot = 0`, `cached_inputs = 0`).
    pub cold: BatchShape,
}

/// Batches to simulate.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    hot_count: u32,
    hot_input_fraction: f64,
    batches: Vec<BatchDemand>,
}

impl Workload {
    /// A workload over hot set `0..hot_count`; `hot_input_fraction` (in `[0, 1]`)
    /// is the share of bottom-layer inputs that belong to the hot set. Fails if a
    /// batch lists a hot id `>= hot_count`, or not sorted and distinct.
    pub fn new(hot_count: u32, hot_input_fraction: f64, batches: Vec<BatchDemand>) -> Result<Self> {
        if !(0.0..=1.0).contains(&hot_input_fraction) {
            return Err(invalid(
                "hot_input_fraction",
                "a fraction in [0, 1]",
                hot_input_fraction,
            ));
        }
        for b in &batches {
            if let Some(&v) = b.hot.iter().find(|&&v| v >= hot_count) {
                return Err(SchedulerError::VertexOutOfRange {
                    context: "workload hot vertices",
                    vertex: v as u64,
                    num_vertices: hot_count as usize,
                });
            }
            if b.hot.windows(2).any(|w| w[0] >= w[1]) {
                return Err(invalid(
                    "workload hot vertices",
                    "sorted, distinct ids per batch",
                    format!("{:?}...", &b.hot[..b.hot.len().min(8)]),
                ));
            }
        }
        Ok(Self {
            hot_count,
            hot_input_fraction,
            batches,
        })
    }

    /// A workload from sampled batches whose ids are relabeled, with hot set
    /// `0..hot_count`.
    pub fn from_sampled(batches: &[SampledBatch], hot_count: u32) -> Result<Self> {
        let all = HotSplit::all_cpu(hot_count);
        let (mut inputs, mut hot_inputs) = (0u64, 0u64);
        let demands = batches
            .iter()
            .map(|b| {
                let mut cold = BatchShape::from_sampled(b, &all);
                let mut hot: Vec<u32> = b
                    .blocks()
                    .first()
                    .map(|blk| blk.dst_ids())
                    .unwrap_or(&[])
                    .iter()
                    .copied()
                    .filter(|&v| v < hot_count)
                    .collect();
                hot.sort_unstable();
                hot.dedup();
                cold.hot = 0;
                let ids = b.input_ids();
                inputs += ids.len() as u64;
                hot_inputs += ids.iter().filter(|&&v| v < hot_count).count() as u64;
                BatchDemand { hot, cold }
            })
            .collect();
        let frac = if inputs > 0 {
            hot_inputs as f64 / inputs as f64
        } else {
            0.0
        };
        Self::new(hot_count, frac, demands)
    }

    /// The hot set size.
    pub fn hot_count(&self) -> u32 {
        self.hot_count
    }

    /// The batches.
    pub fn batches(&self) -> &[BatchDemand] {
        &self.batches
    }

    /// The number of batches.
    pub fn len(&self) -> usize {
        self.batches.len()
    }

    /// Whether there are no batches.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// The shape of batch `b` under `split` (see the module doc).
    pub fn shape(&self, b: usize, split: &HotSplit, model: &ModelShape) -> Result<BatchShape> {
        let d = self.batches.get(b).ok_or_else(|| {
            invalid(
                "batch",
                format!("a batch index below {}", self.batches.len()),
                b,
            )
        })?;
        let mut s = d.cold;
        let fan = model.bottom_fanout as u64;
        for &v in &d.hot {
            if split.class(v) == VertexClass::CpuHot {
                s.hot += 1;
            } else {
                s.cold_dst += 1;
                s.cold_edges += fan;
                s.cold_inputs += fan + 1;
            }
        }
        if split.hot() > 0 {
            let cached_share = split.cached() as f64 / split.hot() as f64;
            s.cached_inputs = ((s.cold_inputs as f64 * self.hot_input_fraction * cached_share)
                .round() as u64)
                .min(s.cold_inputs);
        }
        Ok(s)
    }
}

/// A seeded synthetic workload: hot destinations drawn from a Zipf law over the
/// hot ids (id 0 hottest), everything else around fixed means.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SyntheticWorkload {
    /// Batches.
    pub batches: usize,
    /// Hot set size.
    pub hot_count: u32,
    /// Hot draws per batch (before deduplication).
    pub hot_draws: u32,
    /// Zipf exponent of hot-id popularity (0 = uniform).
    pub zipf_exponent: f64,
    /// Mean seeds per batch.
    pub seeds: u64,
    /// Mean upper-layer destinations per batch.
    pub upper_dst: u64,
    /// Mean upper-layer edges per batch.
    pub upper_edges: u64,
    /// Mean cold bottom destinations per batch.
    pub cold_dst: u64,
    /// Mean cold bottom edges per batch.
    pub cold_edges: u64,
    /// Mean cold bottom inputs per batch.
    pub cold_inputs: u64,
    /// Relative spread of the counts: each is scaled by a factor in `[1 - j, 1 + j]`.
    pub jitter: f64,
    /// Share of bottom inputs in the hot set.
    pub hot_input_fraction: f64,
    /// Generator seed.
    pub seed: u64,
}

impl SyntheticWorkload {
    /// A small GraphSAGE-like batch: 256 seeds, fanouts about [10, 10], 2,000 hot
    /// vertices with 300 draws per batch.
    pub fn small(batches: usize, seed: u64) -> Self {
        Self {
            batches,
            hot_count: 2000,
            hot_draws: 300,
            zipf_exponent: 0.8,
            seeds: 256,
            upper_dst: 256,
            upper_edges: 2560,
            cold_dst: 2000,
            cold_edges: 20_000,
            cold_inputs: 12_000,
            jitter: 0.2,
            hot_input_fraction: 0.3,
            seed,
        }
    }

    /// Draws the workload.
    pub fn generate(&self) -> Result<Workload> {
        if !(0.0..1.0).contains(&self.jitter) {
            return Err(invalid("jitter", "a fraction in [0, 1)", self.jitter));
        }
        if !(self.zipf_exponent.is_finite() && self.zipf_exponent >= 0.0) {
            return Err(invalid(
                "zipf_exponent",
                "a finite exponent >= 0",
                self.zipf_exponent,
            ));
        }
        if self.hot_count == 0 && self.hot_draws > 0 {
            return Err(invalid(
                "hot_draws",
                "0 when the hot set is empty",
                self.hot_draws,
            ));
        }
        let cdf: Vec<f64> = {
            let mut acc = 0.0;
            let mut c: Vec<f64> = (0..self.hot_count)
                .map(|i| {
                    acc += 1.0 / ((i + 1) as f64).powf(self.zipf_exponent);
                    acc
                })
                .collect();
            for x in &mut c {
                *x /= acc;
            }
            c
        };
        let mut rng = Rng::new(self.seed);
        let jit = |rng: &mut Rng, mean: u64| -> u64 {
            let f = 1.0 + self.jitter * (2.0 * rng.next_f64() - 1.0);
            (mean as f64 * f).round() as u64
        };
        let mut batches = Vec::with_capacity(self.batches);
        for _ in 0..self.batches {
            let mut hot: Vec<u32> = (0..self.hot_draws)
                .map(|_| {
                    let u = rng.next_f64();
                    cdf.partition_point(|&c| c <= u).min(cdf.len() - 1) as u32
                })
                .collect();
            hot.sort_unstable();
            hot.dedup();
            let cold = BatchShape {
                seeds: jit(&mut rng, self.seeds),
                upper_dst: jit(&mut rng, self.upper_dst),
                upper_edges: jit(&mut rng, self.upper_edges),
                hot: 0,
                cold_dst: jit(&mut rng, self.cold_dst),
                cold_edges: jit(&mut rng, self.cold_edges),
                cold_inputs: jit(&mut rng, self.cold_inputs),
                cached_inputs: 0,
            };
            batches.push(BatchDemand { hot, cold });
        }
        Workload::new(self.hot_count, self.hot_input_fraction, batches)
    }
}

#[cfg(test)]
mod tests {
    use cpu_ops::{BuildOptions, CsrGraph, NeighborSampler, SamplerScratch, ALL_NEIGHBORS};

    use super::*;

    #[test]
    fn shape_of_a_sampled_batch_splits_the_bottom_layer() {
        // Star around 0 plus a path 1-2-3.
        let edges = [(0, 1), (0, 2), (0, 3), (1, 2), (2, 3), (3, 4)];
        let g = CsrGraph::from_edges(5, &edges, BuildOptions::UNDIRECTED).unwrap();
        let sampler = NeighborSampler::new(vec![ALL_NEIGHBORS, ALL_NEIGHBORS]).unwrap();
        let batch = sampler
            .sample(&g, &[4], 1, &mut SamplerScratch::new(5))
            .unwrap();
        // Top block: 4 ← {3}. Bottom block: dst {4, 3}, 3 ← {0, 2, 4}, 4 ← {3}.
        let split = HotSplit::new(3, 1).unwrap(); // 0 CPU-hot, 1..3 cached
        let s = BatchShape::from_sampled(&batch, &split);
        assert_eq!(s.seeds, 1);
        assert_eq!((s.upper_dst, s.upper_edges), (1, 1));
        assert_eq!(s.hot, 0);
        assert_eq!(s.cold_dst, 2);
        assert_eq!(s.cold_edges, 4);
        assert_eq!(s.cold_inputs, 4); // 4, 3, 0, 2
        assert_eq!(s.cached_inputs, 1); // 2
        let hot3 = HotSplit::all_cpu(4); // 3 is CPU-hot now
        let s = BatchShape::from_sampled(&batch, &hot3);
        assert_eq!(
            (s.hot, s.cold_dst, s.cold_edges, s.cold_inputs),
            (1, 1, 1, 2)
        );
    }

    #[test]
    fn synthetic_workloads_are_seeded_and_zipfian() {
        let w = SyntheticWorkload::small(200, 1).generate().unwrap();
        assert_eq!(w, SyntheticWorkload::small(200, 1).generate().unwrap());
        assert_ne!(w, SyntheticWorkload::small(200, 2).generate().unwrap());
        let mut freq = vec![0u32; 2000];
        for b in w.batches() {
            assert!(b.hot.windows(2).all(|x| x[0] < x[1]));
            for &v in &b.hot {
                freq[v as usize] += 1;
            }
        }
        let head: u32 = freq[..100].iter().sum();
        let tail: u32 = freq[1900..].iter().sum();
        assert!(head > 4 * tail, "{head} vs {tail}");
    }

    #[test]
    fn shapes_follow_the_split() {
        let m = ModelShape::new(8, 4, 2, 5).unwrap();
        let cold = BatchShape {
            cold_dst: 10,
            cold_edges: 50,
            cold_inputs: 40,
            ..BatchShape::default()
        };
        let w = Workload::new(
            10,
            0.5,
            vec![BatchDemand {
                hot: vec![1, 4, 8],
                cold,
            }],
        )
        .unwrap();
        let all_cpu = w.shape(0, &HotSplit::all_cpu(10), &m).unwrap();
        assert_eq!(
            (all_cpu.hot, all_cpu.cold_dst, all_cpu.cached_inputs),
            (3, 10, 0)
        );
        let half = w.shape(0, &HotSplit::new(10, 5).unwrap(), &m).unwrap();
        assert_eq!(half.hot, 2);
        assert_eq!(half.cold_dst, 11);
        assert_eq!(half.cold_edges, 55);
        assert_eq!(half.cold_inputs, 46);
        assert_eq!(half.cached_inputs, 12); // 46 · 0.5 · 0.5 = 11.5
        let none = w.shape(0, &HotSplit::all_cpu(0), &m).unwrap();
        assert_eq!(none.hot, 0);
        assert!(w.shape(1, &HotSplit::all_cpu(0), &m).is_err());
        assert!(Workload::new(5, 0.5, w.batches().to_vec()).is_err());
        assert!(Workload::new(10, 1.5, vec![]).is_err());
    }

    #[test]
    fn workloads_from_sampled_batches() {
        let edges: Vec<(u32, u32)> = (0..30).map(|i| (i, (i * 7 + 3) % 30)).collect();
        let g = CsrGraph::from_edges(30, &edges, BuildOptions::UNDIRECTED).unwrap();
        let s = NeighborSampler::new(vec![3, 3]).unwrap();
        let mut scratch = SamplerScratch::new(30);
        let batches: Vec<_> = (0..3u32)
            .map(|k| {
                s.sample(&g, &[k * 4, k * 4 + 1], k as u64, &mut scratch)
                    .unwrap()
            })
            .collect();
        let w = Workload::from_sampled(&batches, 10).unwrap();
        assert_eq!(w.len(), 3);
        for (d, b) in w.batches().iter().zip(&batches) {
            let want: Vec<u32> = {
                let mut h: Vec<u32> = b.blocks()[0]
                    .dst_ids()
                    .iter()
                    .copied()
                    .filter(|&v| v < 10)
                    .collect();
                h.sort_unstable();
                h
            };
            assert_eq!(d.hot, want);
            assert_eq!(d.cold.hot, 0);
            let full = BatchShape::from_sampled(b, &HotSplit::all_cpu(10));
            assert_eq!(d.cold.cold_dst, full.cold_dst);
            assert_eq!(
                d.cold.cold_dst + d.hot.len() as u64,
                b.blocks()[0].num_dst() as u64
            );
        }
    }
}
