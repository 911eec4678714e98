//! R-MAT power-law graphs with planted, homophilous classes.
//!
//! # Model
//!
//! R-MAT (Chakrabarti, Zhan and Faloutsos, 2004) places each edge in a
//! `2^s × 2^s` adjacency matrix by descending `s` levels of quadrants, choosing
//! top-left, top-right, bottom-left, bottom-right with probabilities `a, b, c, d`.
//! Tandem's generator builds each edge as follows.
//!
//! 1. **Super-vertices.** The `n` vertices are `⌈n / C⌉` super-vertices of `C`
//!    vertices each (`C` = number of classes): pre-permutation vertex
//!    `x = S·C + k` is member `k` of super-vertex `S`, and its class is `k`.
//! 2. **R-MAT over super-vertices.** `(S, T)` is drawn by R-MAT at scale
//!    `s = ⌈log2 ⌈n / C⌉⌉`, two levels per 64-bit random draw. Level `l` uses its
//!    own `a_l, b_l, c_l, d_l`: the "noisy SKG" smoothing of Seshadhri, Pinar and
//!    Kolda (2013), `μ_l ~ U[-N, N]`, `b_l = b + μ_l`, `c_l = c + μ_l`,
//!    `a_l = a − 2μ_l·a/(a+d)`, `d_l = d − 2μ_l·d/(a+d)`, drawn once per graph. This
//!    removes the oscillating "staircase" of plain R-MAT degree distributions at no
//!    per-edge cost. The degree skew comes from these `s ≈ log2(n/C)` levels, so
//!    keep `n / C` in the thousands or more for a heavy tail. `N = noise · min(b, c, (a+d)/2)`, so every `noise ∈ [0, 1]`
//!    keeps all four probabilities in `[0, 1]`.
//! 3. **Planted classes.** The source member `k_u` is uniform in `0..C`. With
//!    probability `homophily` the target member is `k_v = k_u`, otherwise uniform
//!    among the other `C − 1` members. So the fraction of edges inside a class is
//!    `homophily` (before deduplication), classes have `n / C` vertices each (±1),
//!    and because members are uniform a vertex's degree says nothing about its class.
//!    With `C = 1` this is plain R-MAT.
//! 4. **Non-power-of-two sizes: rejection.** An edge with an endpoint outside
//!    `0..n` (a super-vertex id `≥ ⌈n/C⌉`, or a member past `n` in the last,
//!    partial super-vertex) is redrawn, so edges follow R-MAT *conditioned on*
//!    landing in range: no ids are folded onto others, and the degree distribution
//!    is that of R-MAT with its lowest-degree (highest-id) vertices cut off. R-MAT
//!    rarely sets high bits: a draw is in range whenever both top bits are 0, which
//!    has probability `a_0 ≈ a`, so even a count just above a power of two needs
//!    about `1/a` draws per edge (1.75 with the defaults), and typical counts
//!    fewer. After 64 failed draws (reachable only with extreme parameters such as
//!    `a ≈ 0`) the last draw is scaled into range (`S ↦ ⌊S·⌈n/C⌉ / 2^s⌋`) instead.
//! 5. **Permutation.** Ids go through a seeded random permutation, so id order
//!    reveals neither degree nor class.
//!
//! The edge list is symmetrized, deduplicated and stripped of self-loops
//! ([`BuildOptions::UNDIRECTED`](cpu_ops::BuildOptions::UNDIRECTED)), so the graph
//! has fewer than `num_edges` undirected edges: R-MAT concentrates edges on hubs,
//! and repeats among them are dropped (15–17% at mean degree 20–45). Repeats are
//! likelier inside a class (`C` member pairs share the in-class edges of a
//! super-vertex pair, `C(C−1)` share the rest), so the measured homophily ends a
//! little below the requested one (0.76–0.77 for 0.8 at that density).
//!
//! Why planted classes rather than R-MAT prefix bits as labels: the quadrant bits of
//! the two endpoints of an R-MAT edge are positively correlated only when
//! `a·d > b·c`. With the usual `0.57, 0.19, 0.19, 0.05` they are slightly
//! *anti*-correlated: the top bits agree on a fraction `a + d = 0.62` of the edges,
//! against `0.76² + 0.24² = 0.635` for independent labels with the same
//! edge-weighted class sizes. Prefix classes also differ in degree by orders of
//! magnitude, so degree would leak the label. Regions grown by breadth-first search
//! ([`region_labels`](super::region_labels)) on a plain R-MAT graph are unbalanced
//! and weakly homophilous (measured at 10^6 vertices, 12.5·10^6 edges, 47 regions:
//! edge homophily 0.20, one region holding 17% of the vertices). Planting the
//! classes as an extra, uniform "level" gives balanced classes, no degree leak, and
//! the homophily that was asked for.
//!
//! Features are [`class_features`](super::class_features) of the labels, so with a
//! weak `signal` a GNN that averages over neighbors beats a features-only model.

use cpu_ops::Rng;

use super::assembly::{
    assemble, check_probability, chunked_edges, draw_split, permuted_labels, random_permutation,
    Common, Stream,
};
use crate::data::dataset::{Dataset, EdgeSplitSpec, SplitSpec};
use crate::error::{Error, Result};
use crate::progress::{NoProgress, Progress};

/// Draws per edge before falling back to scaling an out-of-range draw into range.
const MAX_DRAWS: u32 = 64;

/// Options of [`generate_rmat`]. See the module docs for the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmatOptions {
    /// Number of vertices `n`, in `1..=2^32-1`; need not be a power of two.
    pub num_vertices: usize,
    /// Undirected edges drawn, before self-loops and repeats are dropped.
    pub num_edges: usize,
    /// Probability of the top-left quadrant (both endpoints in the low half).
    pub a: f64,
    /// Probability of the top-right quadrant.
    pub b: f64,
    /// Probability of the bottom-left quadrant. `d = 1 − a − b − c`.
    pub c: f64,
    /// Per-level parameter noise in `[0, 1]`, relative to the largest noise that
    /// keeps all probabilities valid; 0 is plain R-MAT.
    pub noise: f64,
    /// Number of classes `C`, in `1..=num_vertices`.
    pub num_classes: u32,
    /// Fraction of edges drawn inside a class, in `[0, 1]` (`1 / C` is no
    /// correlation; below that the graph is heterophilous).
    pub homophily: f64,
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

impl Default for RmatOptions {
    /// 2^16 vertices, 2^20 edges, Graph500's `a, b, c = 0.57, 0.19, 0.19`, noise
    /// 0.5, 16 classes, homophily 0.8, 64 features with signal 0.3, 60/20/20 split.
    fn default() -> Self {
        Self {
            num_vertices: 1 << 16,
            num_edges: 1 << 20,
            a: 0.57,
            b: 0.19,
            c: 0.19,
            noise: 0.5,
            num_classes: 16,
            homophily: 0.8,
            feature_dim: 64,
            signal: 0.3,
            split: SplitSpec::default(),
            edge_split: None,
            seed: 0,
        }
    }
}

impl RmatOptions {
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
        check_probability("a", self.a)?;
        check_probability("b", self.b)?;
        check_probability("c", self.c)?;
        let sum = self.a + self.b + self.c;
        if sum > 1.0 + 1e-9 {
            return Err(Error::invalid_argument(
                "a + b + c",
                format!("{sum}, expected at most 1 (d = 1 − a − b − c)"),
            ));
        }
        check_probability("noise", self.noise)
    }
}

/// Cumulative quadrant thresholds of each R-MAT level, scaled to `2^32`: a 32-bit
/// uniform `r` picks top-left if `r < t[0]`, top-right if `r < t[1]`, bottom-left if
/// `r < t[2]`, else bottom-right.
#[derive(Clone, Debug, PartialEq)]
struct Levels {
    thresholds: Vec<[u64; 3]>,
}

impl Levels {
    /// `scale` levels with noisy-SKG parameters drawn from `seed`'s noise stream.
    fn new(opts: &RmatOptions, scale: u32) -> Self {
        let (a, b, c) = (opts.a, opts.b, opts.c);
        let d = (1.0 - a - b - c).max(0.0);
        let max_mu = opts.noise * b.min(c).min((a + d) / 2.0);
        let mut rng = Rng::new(Stream::LevelNoise.seed(opts.seed));
        let thresholds = (0..scale)
            .map(|_| {
                let mu = max_mu * (2.0 * rng.next_f64() - 1.0);
                let shrink = if a + d > 0.0 { 2.0 * mu / (a + d) } else { 0.0 };
                let p = [a - shrink * a, b + mu, c + mu];
                let scaled = |x: f64| ((x.clamp(0.0, 1.0) * 4_294_967_296.0).round()) as u64;
                [
                    scaled(p[0]),
                    scaled(p[0] + p[1]),
                    scaled(p[0] + p[1] + p[2]),
                ]
            })
            .collect();
        Self { thresholds }
    }

    /// One R-MAT draw: `(row, column)`, each below `2^scale`.
    #[inline]
    fn draw(&self, rng: &mut Rng) -> (u64, u64) {
        let (mut u, mut v) = (0u64, 0u64);
        let mut bits = 0u64;
        for (l, t) in self.thresholds.iter().enumerate() {
            if l % 2 == 0 {
                bits = rng.next_u64();
            }
            let r = bits & 0xFFFF_FFFF;
            bits >>= 32;
            let row = r >= t[1];
            let col = (r >= t[0] && r < t[1]) || r >= t[2];
            u = (u << 1) | row as u64;
            v = (v << 1) | col as u64;
        }
        (u, v)
    }
}

/// Vertex-id layout of the super-vertex construction (pre-permutation).
#[derive(Clone, Copy, Debug)]
struct Layout {
    n: u64,
    classes: u64,
    supers: u64,
    scale: u32,
    homophily: f64,
}

impl Layout {
    fn new(opts: &RmatOptions) -> Self {
        let n = opts.num_vertices as u64;
        let classes = opts.num_classes as u64;
        let supers = n.div_ceil(classes);
        let scale = if supers <= 1 {
            0
        } else {
            64 - (supers - 1).leading_zeros()
        };
        Self {
            n,
            classes,
            supers,
            scale,
            homophily: opts.homophily,
        }
    }

    /// The target member for source member `ku`.
    #[inline]
    fn target_member(&self, ku: u64, rng: &mut Rng) -> u64 {
        if self.classes == 1 || rng.next_f64() < self.homophily {
            ku
        } else {
            let k = rng.below(self.classes - 1);
            k + (k >= ku) as u64
        }
    }

    /// One edge `(u, v)` of pre-permutation ids, both below `n`.
    #[inline]
    fn edge(&self, levels: &Levels, rng: &mut Rng) -> (u64, u64) {
        let mut draws = 0;
        loop {
            let (su, sv) = levels.draw(rng);
            draws += 1;
            let in_range = su < self.supers && sv < self.supers;
            if !in_range && draws < MAX_DRAWS {
                continue;
            }
            let ku = rng.below(self.classes);
            let kv = self.target_member(ku, rng);
            if in_range {
                let (u, v) = (su * self.classes + ku, sv * self.classes + kv);
                if u < self.n && v < self.n {
                    return (u, v);
                }
                if draws < MAX_DRAWS {
                    continue;
                }
            }
            return (self.fallback(su, ku), self.fallback(sv, kv));
        }
    }

    /// Scales an out-of-range super-vertex `s < 2^scale` into range and wraps
    /// member `k` into the (possibly partial) super-vertex.
    fn fallback(&self, s: u64, k: u64) -> u64 {
        let s = if s < self.supers {
            s
        } else {
            ((s as u128 * self.supers as u128) >> self.scale) as u64
        };
        let base = s * self.classes;
        base + k % (self.n - base).min(self.classes)
    }
}

/// Generates an R-MAT graph with planted classes, class-correlated features and a
/// split (see the module docs). The dataset is named `"rmat"`. Deterministic for
/// `opts.seed` whatever the rayon thread count.
pub fn generate_rmat(opts: &RmatOptions) -> Result<Dataset> {
    generate_rmat_with(opts, &NoProgress)
}

/// [`generate_rmat`], reporting to `progress` the phases `"edges"` (edges drawn),
/// `"graph"` (one unit: the CSR build) and `"features"` (vertices), in that order,
/// then `"edge split"` (one unit) with [`RmatOptions::edge_split`].
pub fn generate_rmat_with(opts: &RmatOptions, progress: &dyn Progress) -> Result<Dataset> {
    opts.validate()?;
    let common = opts.common();
    let layout = Layout::new(opts);
    let levels = Levels::new(opts, layout.scale);
    let perm = random_permutation(opts.num_vertices, opts.seed);
    let labels = permuted_labels(&perm, |x| (x as u64 % layout.classes) as u32);
    let masks = draw_split(&common, &labels)?;
    let edges = chunked_edges(opts.num_edges, opts.seed, progress, |rng, chunk| {
        for e in chunk {
            let (u, v) = layout.edge(&levels, rng);
            *e = (perm[u as usize], perm[v as usize]);
        }
    });
    drop(perm);
    assemble("rmat", &common, edges, labels, masks, progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::dataset::{open_dataset, write_dataset, Verify};
    use crate::data::generate::assembly::{in_pool, EDGE_CHUNK};
    use crate::data::generate::stats::{centroid_accuracies, GraphStats};

    fn small() -> RmatOptions {
        RmatOptions {
            num_vertices: 12_345,
            num_edges: 2 * EDGE_CHUNK + 1234,
            num_classes: 5,
            feature_dim: 8,
            seed: 7,
            ..RmatOptions::default()
        }
    }

    #[test]
    fn progress_is_monotone_and_reaches_every_total() {
        let o = small();
        let rec = crate::progress::testing::Recorder::default();
        let ds = in_pool(2, || generate_rmat_with(&o, &rec).unwrap());
        assert_eq!(ds, generate_rmat(&o).unwrap());
        assert_eq!(
            rec.check(),
            vec![
                ("edges".to_string(), o.num_edges as u64),
                ("graph".to_string(), 1),
                ("features".to_string(), o.num_vertices as u64),
            ]
        );
        // One report per edge chunk: intermediate values, not just 0 and the total.
        let edges = rec.0.lock().iter().filter(|r| r.0 == "edges").count();
        assert_eq!(edges, 1 + o.num_edges.div_ceil(EDGE_CHUNK));
    }

    #[test]
    fn deterministic_across_thread_counts_and_seeded() {
        let o = small();
        let one = in_pool(1, || generate_rmat(&o).unwrap());
        let two = in_pool(2, || generate_rmat(&o).unwrap());
        assert_eq!(one, two);
        let other = generate_rmat(&RmatOptions { seed: 8, ..o }).unwrap();
        assert_ne!(one.graph, other.graph);
        assert_ne!(one.labels, other.labels);
        assert_ne!(one.features, other.features);
    }

    #[test]
    fn sizes_degrees_labels_and_homophily() {
        let o = small();
        let ds = generate_rmat(&o).unwrap();
        let s = GraphStats::of(&ds);
        assert_eq!(ds.name, "rmat");
        assert_eq!(ds.num_vertices(), o.num_vertices);
        let undirected = s.stored_edges / 2;
        assert!(
            undirected <= o.num_edges && undirected as f64 > 0.8 * o.num_edges as f64,
            "{s}"
        );
        // Heavy tail: hubs far above the mean, median below it.
        assert!(s.max_degree as f64 > 20.0 * s.mean_degree, "{s}");
        assert!((s.median_degree as f64) < s.mean_degree, "{s}");
        // Repeats are likelier inside a class, so deduplication lowers homophily a little.
        assert!(
            s.edge_homophily <= o.homophily && s.edge_homophily > o.homophily - 0.05,
            "{s}"
        );
        // Balanced classes, all present.
        let mut count = vec![0usize; o.num_classes as usize];
        for &l in ds.labels.iter() {
            count[l as usize] += 1;
        }
        let per = o.num_vertices / o.num_classes as usize;
        assert!(count.iter().all(|&k| k == per || k == per + 1), "{count:?}");
        // The permutation hides degree: both halves of the id range get similar edge mass.
        let half = o.num_vertices as u32 / 2;
        let mass = |r: std::ops::Range<u32>| r.map(|v| ds.graph.degree(v)).sum::<usize>() as f64;
        let ratio = mass(0..half) / mass(half..o.num_vertices as u32);
        assert!((0.6..1.6).contains(&ratio), "{ratio}");
    }

    #[test]
    fn one_hop_aggregation_beats_features_alone() {
        let ds = generate_rmat(&RmatOptions {
            num_vertices: 4000,
            num_edges: 40_000,
            num_classes: 4,
            feature_dim: 16,
            signal: 0.25,
            ..RmatOptions::default()
        })
        .unwrap();
        let (raw, hop) = centroid_accuracies(&ds);
        assert!(hop > raw + 0.1, "features only {raw}, one hop {hop}");
    }

    #[test]
    fn plain_rmat_with_one_class_and_power_of_two_size() {
        let o = RmatOptions {
            num_vertices: 1 << 12,
            num_edges: 1 << 15,
            num_classes: 1,
            noise: 0.0,
            ..RmatOptions::default()
        };
        let ds = generate_rmat(&o).unwrap();
        let s = GraphStats::of(&ds);
        assert_eq!(s.edge_homophily, 1.0);
        assert!(s.max_degree as f64 > 20.0 * s.mean_degree, "{s}");
        assert!(s.isolated > 0, "{s}");
    }

    #[test]
    fn tiny_and_extreme_graphs_stay_in_range() {
        for (n, classes, a, b, c) in [
            (1, 1, 0.57, 0.19, 0.19),
            (2, 2, 0.57, 0.19, 0.19),
            (3, 1, 0.57, 0.19, 0.19),
            (1025, 3, 0.57, 0.19, 0.19),
            // High ids almost always: exercises the fallback.
            (1025, 1, 0.0, 0.0, 0.0),
            (1000, 7, 0.25, 0.25, 0.25),
        ] {
            let o = RmatOptions {
                num_vertices: n,
                num_edges: 5000,
                num_classes: classes,
                a,
                b,
                c,
                feature_dim: 2,
                // A few vertices all train: 60% / 20% / rest would leave a
                // part without any (an error naming it).
                split: if n < 10 {
                    "1,0,0".parse().unwrap()
                } else {
                    SplitSpec::default()
                },
                ..RmatOptions::default()
            };
            let ds = generate_rmat(&o).unwrap();
            assert_eq!(ds.num_vertices(), n);
            ds.validate().unwrap();
        }
    }

    #[test]
    fn levels_without_noise_are_exact_and_noisy_levels_stay_valid() {
        let o = RmatOptions::default();
        let plain = Levels::new(&RmatOptions { noise: 0.0, ..o }, 3);
        let t = |p: f64| (p * 4_294_967_296.0).round() as u64;
        assert_eq!(plain.thresholds[0], [t(0.57), t(0.76), t(0.95)]);
        let noisy = Levels::new(&RmatOptions { noise: 1.0, ..o }, 20);
        let mut distinct = std::collections::HashSet::new();
        for th in &noisy.thresholds {
            assert!(
                th[0] <= th[1] && th[1] <= th[2] && th[2] <= 1 << 32,
                "{th:?}"
            );
            distinct.insert(th[0]);
        }
        assert!(distinct.len() > 10);
    }

    #[test]
    fn round_trips_through_the_store() {
        let ds = generate_rmat(&RmatOptions {
            num_vertices: 3000,
            num_edges: 20_000,
            ..RmatOptions::default()
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("rmat.tds");
        write_dataset(&p, &ds).unwrap();
        assert_eq!(open_dataset(&p, Verify::Full).unwrap(), ds);
    }

    /// ogbn-products scale. Run with
    /// `cargo test --release -p runtime --lib products_scale -- --ignored --nocapture`.
    #[test]
    #[ignore = "large: 2.4M vertices, 62M edges, 100-dim features, about 1.5 GB"]
    fn rmat_products_scale() {
        let t = std::time::Instant::now();
        let ds = generate_rmat(&RmatOptions {
            num_vertices: 2_400_000,
            num_edges: 62_000_000,
            num_classes: 47,
            feature_dim: 100,
            ..RmatOptions::default()
        })
        .unwrap();
        let s = GraphStats::of(&ds);
        eprintln!("rmat at products scale in {:.1?}: {s}", t.elapsed());
        assert!(s.max_degree as f64 > 100.0 * s.mean_degree, "{s}");
        assert!(s.stored_edges as f64 > 0.8 * 124e6, "{s}");
    }

    #[test]
    fn bad_options_name_the_option() {
        let o = small();
        let cases: Vec<(RmatOptions, &str)> = vec![
            (
                RmatOptions {
                    num_vertices: 0,
                    ..o
                },
                "num_vertices",
            ),
            (
                RmatOptions {
                    num_vertices: 1 << 32,
                    ..o
                },
                "num_vertices",
            ),
            (RmatOptions { a: 1.5, ..o }, "`a`"),
            (RmatOptions { b: -0.1, ..o }, "`b`"),
            (RmatOptions { c: f64::NAN, ..o }, "`c`"),
            (
                RmatOptions {
                    a: 0.5,
                    b: 0.3,
                    c: 0.3,
                    ..o
                },
                "a + b + c",
            ),
            (RmatOptions { noise: 2.0, ..o }, "noise"),
            (
                RmatOptions {
                    num_classes: 0,
                    ..o
                },
                "num_classes",
            ),
            (
                RmatOptions {
                    num_classes: 20_000,
                    ..o
                },
                "num_classes",
            ),
            (
                RmatOptions {
                    homophily: 1.1,
                    ..o
                },
                "homophily",
            ),
            (
                RmatOptions {
                    feature_dim: 0,
                    ..o
                },
                "feature_dim",
            ),
            (
                RmatOptions {
                    signal: f32::INFINITY,
                    ..o
                },
                "signal",
            ),
            (
                RmatOptions {
                    split: "0.7,0.7,rest".parse().unwrap(),
                    ..o
                },
                "split",
            ),
        ];
        for (bad, name) in cases {
            let msg = generate_rmat(&bad).unwrap_err().to_string();
            assert!(msg.contains(name), "expected `{name}` in: {msg}");
            assert!(
                msg.contains("expected") || msg.contains("more than"),
                "{msg}"
            );
        }
    }
}
