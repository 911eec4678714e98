//! Stochastic block models, optionally degree-corrected.
//!
//! # Model
//!
//! 1. **Blocks.** The `n` pre-permutation vertex ids are cut into `C` contiguous
//!    blocks of `⌊n/C⌋` or `⌈n/C⌉` vertices (block `b` starts at `⌈b·n/C⌉`). A
//!    vertex's block is its class.
//! 2. **Edges, O(1) each.** A source is drawn uniformly from all vertices. With
//!    probability `homophily` the target is drawn from the source's block, otherwise
//!    uniformly from the vertices of the *other* blocks, so the fraction of edges
//!    inside a block is `homophily` itself (before deduplication); `1/C` gives an
//!    Erdős–Rényi graph, less gives a heterophilous one. With a single block every
//!    edge is inside it.
//! 3. **Degree heterogeneity (optional).** With `degree_skew = β > 0`, the position
//!    of an endpoint inside its (already chosen) block is `⌊size · U^{1/(1−β)}⌋`
//!    instead of uniform (`x ↦ x^{1/(1−β)}` is tabulated and interpolated). The vertex at rank `r` of a block then has expected degree
//!    ∝ `r^{−β}` (Zipf), so degrees have a power-law tail
//!    `P(deg > k) ∝ k^{−1/β}` (β = 0.5 gives the `k^{−3}` density of preferential
//!    attachment), while block membership and homophily are unchanged: a
//!    degree-corrected SBM at the cost of a table lookup per endpoint.
//! 4. **Permutation.** Ids go through a seeded random permutation, so neither
//!    blocks nor hubs are visible in id order.
//!
//! The edge list is symmetrized, deduplicated and stripped of self-loops, so the
//! graph has slightly fewer than `num_edges` undirected edges. Features are
//! [`class_features`](super::class_features) of the block labels.

use cpu_ops::Rng;

use super::assembly::{
    assemble, chunked_edges, draw_split, permuted_labels, random_permutation, Common,
};
use crate::data::dataset::{Dataset, EdgeSplitSpec, SplitSpec};
use crate::error::{Error, Result};
use crate::progress::{NoProgress, Progress};

/// Options of [`generate_sbm`]. See the module docs for the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SbmOptions {
    /// Number of vertices `n`, in `1..=2^32-1`.
    pub num_vertices: usize,
    /// Undirected edges drawn, before self-loops and repeats are dropped.
    pub num_edges: usize,
    /// Number of blocks (= classes) `C`, in `1..=num_vertices`.
    pub num_classes: u32,
    /// Fraction of edges drawn inside a block, in `[0, 1]`.
    pub homophily: f64,
    /// Degree heterogeneity `β` in `[0, 1)`: 0 is a plain SBM, larger values give
    /// heavier-tailed degrees (expected degree ∝ rank^−β within each block).
    pub degree_skew: f64,
    /// Feature dimension, at least 1.
    pub feature_dim: usize,
    /// Feature signal strength (see [`class_features`](super::class_features)), ≥ 0.
    pub signal: f32,
    /// Train/val/test split of the vertices.
    pub split: SplitSpec,
    /// Link prediction: the fractions of the edges held out as training,
    /// validation and test positives ([`Dataset::split_edges`], symmetric); `None`
    /// keeps every edge in the graph and no edge split.
    pub edge_split: Option<EdgeSplitSpec>,
    /// Seed of every random choice.
    pub seed: u64,
}

impl Default for SbmOptions {
    /// 2^16 vertices, 2^20 edges, 16 blocks, homophily 0.8, no degree skew, 64
    /// features with signal 0.3, 60/20/20 split.
    fn default() -> Self {
        Self {
            num_vertices: 1 << 16,
            num_edges: 1 << 20,
            num_classes: 16,
            homophily: 0.8,
            degree_skew: 0.0,
            feature_dim: 64,
            signal: 0.3,
            split: SplitSpec::default(),
            edge_split: None,
            seed: 0,
        }
    }
}

impl SbmOptions {
    fn common(&self) -> Common {
        Common {
            num_vertices: self.num_vertices,
            num_edges: self.num_edges,
            num_classes: self.num_classes,
            homophily: self.homophily,
            feature_dim: self.feature_dim,
            signal: self.signal,
            split: self.split,
            edge_split: self.edge_split,
            seed: self.seed,
        }
    }

    /// Checks every option; the error names the first bad one and its allowed range.
    pub fn validate(&self) -> Result<()> {
        self.common().validate()?;
        if !(0.0..1.0).contains(&self.degree_skew) {
            return Err(Error::invalid_argument(
                "degree_skew",
                format!("{}, expected a value in [0, 1)", self.degree_skew),
            ));
        }
        Ok(())
    }
}

/// Cells of the tabulated skewed-position inverse CDF.
const SKEW_CELLS: usize = 1 << 12;

/// The inverse CDF `x ↦ x^k` of a skewed position in `[0, 1)`, tabulated at
/// `SKEW_CELLS + 1` points and linearly interpolated: a `powf` per endpoint would
/// cost more than the rest of the edge. The interpolation error is far below one
/// vertex position except in the first cell, whose values all map to position 0 or 1.
#[derive(Clone, Debug)]
struct SkewTable {
    values: Vec<f64>,
}

impl SkewTable {
    fn new(k: f64) -> Self {
        let values = (0..=SKEW_CELLS)
            .map(|i| (i as f64 / SKEW_CELLS as f64).powf(k))
            .collect();
        Self { values }
    }

    /// `U^k` for a uniform `U` in `[0, 1)` (to interpolation accuracy).
    #[inline]
    fn sample(&self, rng: &mut Rng) -> f64 {
        const FRAC_BITS: u32 = 64 - SKEW_CELLS.trailing_zeros();
        let r = rng.next_u64();
        let cell = (r >> FRAC_BITS) as usize;
        let frac = (r & ((1 << FRAC_BITS) - 1)) as f64 * (1.0 / (1u64 << FRAC_BITS) as f64);
        let (lo, hi) = (self.values[cell], self.values[cell + 1]);
        lo + frac * (hi - lo)
    }
}

/// The block layout of pre-permutation ids and the per-endpoint draws.
#[derive(Clone, Debug)]
struct Blocks {
    n: u64,
    classes: u64,
    homophily: f64,
    /// Positions drawn as `U^{1/(1−β)}`, or `None` for uniform positions.
    skew: Option<SkewTable>,
}

impl Blocks {
    fn new(opts: &SbmOptions) -> Self {
        Self {
            n: opts.num_vertices as u64,
            classes: opts.num_classes as u64,
            homophily: opts.homophily,
            skew: (opts.degree_skew > 0.0).then(|| SkewTable::new(1.0 / (1.0 - opts.degree_skew))),
        }
    }

    /// The block of id `x`.
    #[inline]
    fn block_of(&self, x: u64) -> u64 {
        ((x as u128 * self.classes as u128) / self.n as u128) as u64
    }

    /// The first id of block `b` (`b ≤ C`; `start(C) = n`).
    #[inline]
    fn start(&self, b: u64) -> u64 {
        ((b as u128 * self.n as u128).div_ceil(self.classes as u128)) as u64
    }

    /// A vertex of the block that contains `x`: `x` itself, or a skewed position.
    #[inline]
    fn place(&self, x: u64, rng: &mut Rng) -> u64 {
        match &self.skew {
            None => x,
            Some(table) => {
                let b = self.block_of(x);
                let (start, end) = (self.start(b), self.start(b + 1));
                let size = end - start;
                let p = (size as f64 * table.sample(rng)) as u64;
                start + p.min(size - 1)
            }
        }
    }

    /// One edge `(u, v)` of pre-permutation ids.
    #[inline]
    fn edge(&self, rng: &mut Rng) -> (u64, u64) {
        let x = rng.below(self.n);
        let b = self.block_of(x);
        let (start, end) = (self.start(b), self.start(b + 1));
        let size = end - start;
        let t = if self.classes == 1 || rng.next_f64() < self.homophily {
            start + rng.below(size)
        } else {
            let r = rng.below(self.n - size);
            if r >= start {
                r + size
            } else {
                r
            }
        };
        (self.place(x, rng), self.place(t, rng))
    }
}

/// Generates a stochastic block model graph with class-correlated features and a
/// split (see the module docs). The dataset is named `"sbm"`. Deterministic for
/// `opts.seed` whatever the rayon thread count.
pub fn generate_sbm(opts: &SbmOptions) -> Result<Dataset> {
    generate_sbm_with(opts, &NoProgress)
}

/// [`generate_sbm`], reporting to `progress` the phases `"edges"` (edges drawn),
/// `"graph"` (one unit: the CSR build) and `"features"` (vertices), in that order,
/// then `"edge split"` (one unit) with [`SbmOptions::edge_split`].
pub fn generate_sbm_with(opts: &SbmOptions, progress: &dyn Progress) -> Result<Dataset> {
    opts.validate()?;
    let common = opts.common();
    let blocks = Blocks::new(opts);
    let perm = random_permutation(opts.num_vertices, opts.seed);
    let labels = permuted_labels(&perm, |x| blocks.block_of(x as u64) as u32);
    let masks = draw_split(&common, &labels)?;
    let edges = chunked_edges(opts.num_edges, opts.seed, progress, |rng, chunk| {
        for e in chunk {
            let (u, v) = blocks.edge(rng);
            *e = (perm[u as usize], perm[v as usize]);
        }
    });
    drop(perm);
    assemble("sbm", &common, edges, labels, masks, progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::dataset::{open_dataset, write_dataset, Verify};
    use crate::data::generate::assembly::{in_pool, EDGE_CHUNK};
    use crate::data::generate::stats::{centroid_accuracies, GraphStats};

    fn small() -> SbmOptions {
        SbmOptions {
            num_vertices: 10_007,
            num_edges: 2 * EDGE_CHUNK + 999,
            num_classes: 7,
            feature_dim: 8,
            seed: 3,
            ..SbmOptions::default()
        }
    }

    #[test]
    fn progress_reaches_every_total() {
        let o = SbmOptions {
            num_vertices: 3000,
            num_edges: 20_000,
            feature_dim: 4,
            ..SbmOptions::default()
        };
        let rec = crate::progress::testing::Recorder::default();
        let ds = generate_sbm_with(&o, &rec).unwrap();
        assert_eq!(ds, generate_sbm(&o).unwrap());
        let phases: Vec<String> = rec.check().into_iter().map(|p| p.0).collect();
        assert_eq!(phases, ["edges", "graph", "features"]);
    }

    #[test]
    fn deterministic_across_thread_counts_and_seeded() {
        for skew in [0.0, 0.5] {
            let o = SbmOptions {
                degree_skew: skew,
                ..small()
            };
            let one = in_pool(1, || generate_sbm(&o).unwrap());
            let two = in_pool(2, || generate_sbm(&o).unwrap());
            assert_eq!(one, two);
            let other = generate_sbm(&SbmOptions { seed: 4, ..o }).unwrap();
            assert_ne!(one.graph, other.graph);
            assert_ne!(one.labels, other.labels);
        }
    }

    #[test]
    fn blocks_tile_the_ids() {
        for (n, c) in [
            (10u64, 3u64),
            (7, 7),
            (1, 1),
            (1000, 1),
            (4_000_000_000, 47),
        ] {
            let b = Blocks {
                n,
                classes: c,
                homophily: 0.5,
                skew: None,
            };
            assert_eq!(b.start(0), 0);
            assert_eq!(b.start(c), n);
            for k in 0..c {
                let (s, e) = (b.start(k), b.start(k + 1));
                assert!(e - s == n / c || e - s == n / c + 1);
                assert_eq!(b.block_of(s), k);
                assert_eq!(b.block_of(e - 1), k);
            }
        }
    }

    #[test]
    fn skew_table_matches_powf() {
        for k in [1.25, 2.0, 10.0] {
            let t = SkewTable::new(k);
            let mut rng = Rng::new(1);
            let mut below_half = 0;
            for _ in 0..100_000 {
                let x = t.sample(&mut rng);
                assert!((0.0..1.0).contains(&x), "{x}");
                below_half += (x < 0.5) as u32;
            }
            // P(U^k < 1/2) = 2^{-1/k}.
            let want = 0.5f64.powf(1.0 / k) * 100_000.0;
            assert!(
                (below_half as f64 - want).abs() < 600.0,
                "{k}: {below_half} vs {want}"
            );
            for x in [0.3, 0.77, 0.999] {
                let i = (x * SKEW_CELLS as f64) as usize;
                let f = x * SKEW_CELLS as f64 - i as f64;
                let interp = t.values[i] + f * (t.values[i + 1] - t.values[i]);
                assert!(
                    (interp - x.powf(k)).abs() < 1e-5 * x.powf(k).max(1e-3),
                    "{k} {x}"
                );
            }
        }
    }

    #[test]
    fn sizes_labels_and_homophily_match_the_request() {
        for h in [0.8, 0.3] {
            let o = SbmOptions {
                homophily: h,
                ..small()
            };
            let ds = generate_sbm(&o).unwrap();
            let s = GraphStats::of(&ds);
            assert_eq!(ds.name, "sbm");
            assert_eq!(ds.num_vertices(), o.num_vertices);
            let undirected = s.stored_edges / 2;
            assert!(
                undirected <= o.num_edges && undirected as f64 > 0.98 * o.num_edges as f64,
                "{s}"
            );
            assert!((s.edge_homophily - h).abs() < 0.01, "{s}");
            let mut count = vec![0usize; o.num_classes as usize];
            for &l in ds.labels.iter() {
                count[l as usize] += 1;
            }
            let per = o.num_vertices / o.num_classes as usize;
            assert!(count.iter().all(|&k| k == per || k == per + 1), "{count:?}");
            // Plain SBM degrees are Poisson-like: no hubs.
            assert!((s.max_degree as f64) < 3.0 * s.mean_degree, "{s}");
        }
    }

    #[test]
    fn degree_skew_gives_hubs_and_keeps_homophily() {
        let o = SbmOptions {
            degree_skew: 0.6,
            ..small()
        };
        let ds = generate_sbm(&o).unwrap();
        let s = GraphStats::of(&ds);
        assert!(s.max_degree as f64 > 20.0 * s.mean_degree, "{s}");
        assert!((s.median_degree as f64) < s.mean_degree, "{s}");
        assert!((s.edge_homophily - o.homophily).abs() < 0.03, "{s}");
    }

    #[test]
    fn one_hop_aggregation_beats_features_alone() {
        let ds = generate_sbm(&SbmOptions {
            num_vertices: 4000,
            num_edges: 40_000,
            num_classes: 4,
            feature_dim: 16,
            signal: 0.25,
            ..SbmOptions::default()
        })
        .unwrap();
        let (raw, hop) = centroid_accuracies(&ds);
        assert!(hop > raw + 0.1, "features only {raw}, one hop {hop}");
    }

    #[test]
    fn single_block_and_single_vertex() {
        let ds = generate_sbm(&SbmOptions {
            num_vertices: 500,
            num_edges: 3000,
            num_classes: 1,
            homophily: 0.0,
            feature_dim: 2,
            ..SbmOptions::default()
        })
        .unwrap();
        assert_eq!(GraphStats::of(&ds).edge_homophily, 1.0);
        let one = generate_sbm(&SbmOptions {
            num_vertices: 1,
            num_edges: 10,
            num_classes: 1,
            feature_dim: 2,
            // One vertex trains; the other parts cannot draw any.
            split: "1,0,0".parse().unwrap(),
            ..SbmOptions::default()
        })
        .unwrap();
        assert_eq!(one.graph.num_edges(), 0);
    }

    #[test]
    fn round_trips_through_the_store() {
        let ds = generate_sbm(&SbmOptions {
            num_vertices: 3000,
            num_edges: 20_000,
            degree_skew: 0.5,
            ..SbmOptions::default()
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sbm.tds");
        write_dataset(&p, &ds).unwrap();
        assert_eq!(open_dataset(&p, Verify::Full).unwrap(), ds);
    }

    /// ogbn-products scale. Run with
    /// `cargo test --release -p runtime --lib products_scale -- --ignored --nocapture`.
    #[test]
    #[ignore = "large: 2.4M vertices, 62M edges, 100-dim features, about 1.5 GB"]
    fn sbm_products_scale() {
        let t = std::time::Instant::now();
        let o = SbmOptions {
            num_vertices: 2_400_000,
            num_edges: 62_000_000,
            num_classes: 47,
            degree_skew: 0.5,
            feature_dim: 100,
            ..SbmOptions::default()
        };
        let ds = generate_sbm(&o).unwrap();
        let s = GraphStats::of(&ds);
        eprintln!("sbm at products scale in {:.1?}: {s}", t.elapsed());
        assert!((s.edge_homophily - o.homophily).abs() < 0.01, "{s}");
        assert!(s.stored_edges as f64 > 0.98 * 124e6, "{s}");
    }

    #[test]
    fn bad_options_name_the_option() {
        let o = small();
        let cases: Vec<(SbmOptions, &str)> = vec![
            (
                SbmOptions {
                    num_vertices: 0,
                    ..o
                },
                "num_vertices",
            ),
            (
                SbmOptions {
                    num_vertices: 1 << 32,
                    ..o
                },
                "num_vertices",
            ),
            (
                SbmOptions {
                    num_edges: usize::MAX,
                    ..o
                },
                "num_edges",
            ),
            (
                SbmOptions {
                    num_classes: 0,
                    ..o
                },
                "num_classes",
            ),
            (
                SbmOptions {
                    homophily: -0.5,
                    ..o
                },
                "homophily",
            ),
            (
                SbmOptions {
                    degree_skew: 1.0,
                    ..o
                },
                "degree_skew",
            ),
            (
                SbmOptions {
                    feature_dim: 0,
                    ..o
                },
                "feature_dim",
            ),
            (SbmOptions { signal: -1.0, ..o }, "signal"),
        ];
        for (bad, name) in cases {
            let msg = generate_sbm(&bad).unwrap_err().to_string();
            assert!(msg.contains(name), "expected `{name}` in: {msg}");
            assert!(msg.contains("expected"), "{msg}");
        }
    }
}
