//! The steps both generators share: option checks, the random vertex permutation,
//! chunked parallel edge generation, and assembling the [`Dataset`].
//!
//! Determinism: every random choice comes from a stream derived from the user's
//! seed with a fixed tag ([`Stream`]). Edges are generated in chunks of
//! [`EDGE_CHUNK`] edges, chunk `i` with `Rng::for_stream(derive_seed(seed, EDGES), i)`,
//! so the edge list is the same whatever the rayon thread count; the CSR builder,
//! [`class_features`] and [`SplitSpec::apply`] are deterministic too.

use cpu_ops::{derive_seed, BuildOptions, CsrGraph, Rng};
use rayon::prelude::*;

#[cfg(doc)]
use super::features::class_features;
use super::features::class_features_metered;
use crate::data::dataset::{Dataset, EdgeSplitSpec, SplitSpec};
use crate::error::{Error, Result};
use crate::progress::{Meter, Progress};

/// Edges per generation chunk. Fixed: changing it changes every generated graph.
pub(crate) const EDGE_CHUNK: usize = 1 << 16;

/// Runs `f` on a fresh rayon pool of `threads` workers (determinism tests).
#[cfg(test)]
pub(crate) fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
        .install(f)
}

/// Most edges a generator accepts (the edge list alone would take 2 EiB beyond it).
pub(crate) const MAX_EDGES: usize = 1 << 58;

/// Most feature values (`num_vertices × feature_dim`) a generator accepts.
pub(crate) const MAX_FEATURE_VALUES: usize = 1 << 58;

/// Tags of the independent random streams derived from the user's seed.
#[derive(Clone, Copy, Debug)]
#[repr(u64)]
pub(crate) enum Stream {
    /// Base of the per-chunk edge streams.
    Edges = 1,
    /// The vertex permutation.
    Permutation = 2,
    /// Class-feature centers and noise.
    Features = 3,
    /// The train/val/test split.
    Split = 4,
    /// R-MAT per-level parameter noise.
    LevelNoise = 5,
    /// The held-out edges of a link-prediction split.
    EdgeSplit = 6,
}

impl Stream {
    /// The seed of this stream for the user's `seed`.
    pub(crate) fn seed(self, seed: u64) -> u64 {
        derive_seed(seed, self as u64)
    }
}

/// The options every generator has, borrowed from its own options struct.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Common {
    pub num_vertices: usize,
    pub num_edges: usize,
    pub num_classes: u32,
    pub homophily: f64,
    pub feature_dim: usize,
    pub signal: f32,
    pub split: SplitSpec,
    pub edge_split: Option<EdgeSplitSpec>,
    pub seed: u64,
}

impl Common {
    /// Checks the shared options; errors name the option and its allowed range.
    pub(crate) fn validate(&self) -> Result<()> {
        let n = self.num_vertices;
        if n == 0 || n > u32::MAX as usize {
            return Err(Error::invalid_argument(
                "num_vertices",
                format!("{n}, expected 1..=2^32-1 (vertex ids are u32)"),
            ));
        }
        if self.num_edges > MAX_EDGES {
            return Err(Error::invalid_argument(
                "num_edges",
                format!("{}, expected 0..=2^58", self.num_edges),
            ));
        }
        if self.num_classes == 0 || self.num_classes as usize > n {
            return Err(Error::invalid_argument(
                "num_classes",
                format!(
                    "{}, expected 1..=num_vertices ({n}) so that every class has a vertex",
                    self.num_classes
                ),
            ));
        }
        check_probability("homophily", self.homophily)?;
        if self.feature_dim == 0
            || n.checked_mul(self.feature_dim)
                .is_none_or(|v| v > MAX_FEATURE_VALUES)
        {
            return Err(Error::invalid_argument(
                "feature_dim",
                format!(
                    "{}, expected at least 1 and num_vertices × feature_dim ≤ 2^58",
                    self.feature_dim
                ),
            ));
        }
        if !self.signal.is_finite() || self.signal < 0.0 {
            return Err(Error::invalid_argument(
                "signal",
                format!("{}, expected a finite value ≥ 0", self.signal),
            ));
        }
        if let Some(spec) = &self.edge_split {
            spec.validate()?;
        }
        Ok(())
    }
}

/// Fails unless `p` is a probability in `[0, 1]` (NaN is refused).
pub(crate) fn check_probability(name: &str, p: f64) -> Result<()> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(Error::invalid_argument(
            name,
            format!("{p}, expected a probability in [0, 1]"),
        ))
    }
}

/// A uniformly random permutation of `0..n` (`n ≤ 2^32 - 1`), from the seed's
/// permutation stream.
pub(crate) fn random_permutation(n: usize, seed: u64) -> Vec<u32> {
    debug_assert!(n <= u32::MAX as usize);
    let mut perm: Vec<u32> = (0..n as u32).collect();
    Rng::new(Stream::Permutation.seed(seed)).shuffle(&mut perm);
    perm
}

/// Generates `num_edges` edges in parallel: chunk `i` (of [`EDGE_CHUNK`] edges) is
/// filled by `fill` with its own generator `Rng::for_stream(edge_seed, i)`.
/// Reports phase `"edges"` (edges drawn) to `progress`, once per chunk.
pub(crate) fn chunked_edges<F>(
    num_edges: usize,
    seed: u64,
    progress: &dyn Progress,
    fill: F,
) -> Vec<(u32, u32)>
where
    F: Fn(&mut Rng, &mut [(u32, u32)]) + Sync,
{
    let edge_seed = Stream::Edges.seed(seed);
    let mut edges = vec![(0u32, 0u32); num_edges];
    let meter = Meter::new(progress, "edges", num_edges as u64);
    edges
        .par_chunks_mut(EDGE_CHUNK)
        .enumerate()
        .for_each(|(i, chunk)| {
            fill(&mut Rng::for_stream(edge_seed, i as u64), chunk);
            meter.add(chunk.len() as u64);
        });
    meter.finish();
    edges
}

/// Labels of the permuted graph: vertex `perm[x]` gets `class_of(x)`.
pub(crate) fn permuted_labels(perm: &[u32], class_of: impl Fn(usize) -> u32) -> Vec<u32> {
    let mut labels = vec![0u32; perm.len()];
    for (x, &p) in perm.iter().enumerate() {
        labels[p as usize] = class_of(x);
    }
    labels
}

/// Draws the split (first, so a bad split fails before the expensive part).
pub(crate) fn draw_split(common: &Common, labels: &[u32]) -> Result<[Vec<u8>; 3]> {
    common
        .split
        .apply(labels, common.num_classes, Stream::Split.seed(common.seed))
}

/// Builds the undirected simple graph from `edges` (consumed and freed before the
/// features are allocated) and assembles the dataset, holding out edges when
/// `common.edge_split` asks ([`Dataset::split_edges`], symmetric, on the seed's
/// edge-split stream). Reports phases `"graph"` (one unit: the CSR build),
/// `"features"` (vertices) and, with an edge split, `"edge split"` (one unit) to
/// `progress`.
pub(crate) fn assemble(
    name: &str,
    common: &Common,
    edges: Vec<(u32, u32)>,
    labels: Vec<u32>,
    masks: [Vec<u8>; 3],
    progress: &dyn Progress,
) -> Result<Dataset> {
    let meter = Meter::new(progress, "graph", 1);
    let graph = CsrGraph::from_edges(common.num_vertices, &edges, BuildOptions::UNDIRECTED)
        .map_err(|e| Error::cpu_ops(format!("building the {name} graph"), e))?;
    drop(edges);
    meter.finish();
    let meter = Meter::new(progress, "features", labels.len() as u64);
    let features = class_features_metered(
        &labels,
        common.num_classes,
        common.feature_dim,
        common.signal,
        Stream::Features.seed(common.seed),
        Some(&meter),
    );
    meter.finish();
    let ds = Dataset::from_parts(
        name.to_string(),
        graph,
        features,
        labels,
        common.num_classes,
        masks,
    )?;
    match &common.edge_split {
        None => Ok(ds),
        Some(spec) => {
            let meter = Meter::new(progress, "edge split", 1);
            let ds = ds.split_edges(spec, true, Stream::EdgeSplit.seed(common.seed))?;
            meter.finish();
            Ok(ds)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::NoProgress;

    #[test]
    fn chunked_edges_do_not_depend_on_thread_count() {
        let gen = || {
            chunked_edges(3 * EDGE_CHUNK + 17, 5, &NoProgress, |rng, chunk| {
                for e in chunk {
                    *e = (rng.next_u32(), rng.next_u32());
                }
            })
        };
        let pool = |k| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(k)
                .build()
                .unwrap()
        };
        let one = pool(1).install(gen);
        assert_eq!(one, pool(2).install(gen));
        assert_eq!(one.len(), 3 * EDGE_CHUNK + 17);
        // Chunks use different streams.
        assert_ne!(one[0], one[EDGE_CHUNK]);
    }

    #[test]
    fn permutation_is_a_permutation() {
        let p = random_permutation(1000, 3);
        let mut s = p.clone();
        s.sort_unstable();
        assert_eq!(s, (0..1000).collect::<Vec<u32>>());
        assert_ne!(p, s);
        assert_eq!(p, random_permutation(1000, 3));
    }
}
