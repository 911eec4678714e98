//! Options shared by the topology-only importers (METIS, edge lists), and turning an
//! imported graph into a [`Dataset`]: labels and features from `.npy` files or
//! generated, then a seeded split.
//!
//! Steps of [`dataset_from_graph`]:
//!
//! 1. labels: read from `.npy` ([`crate::data::npy::read_labels`], `num_classes = max + 1`)
//!    or grown from the topology with [`region_labels`];
//! 2. features: read from `.npy` ([`crate::data::npy::read_f32_matrix`]) or drawn around
//!    per-class centers with [`class_features`] (which uses the labels of step 1,
//!    wherever they came from);
//! 3. masks: [`SplitSpec::apply`] on the labels.
//!
//! Each step uses its own stream of `seed`, so e.g. changing the feature dimension
//! leaves the labels and the split unchanged. `.npy` row counts must equal the
//! vertex count. With [`GraphImportOptions::relabel`], row `i` of an `.npy` file
//! belongs to the `i`-th smallest original vertex id.

use std::path::{Path, PathBuf};

use cpu_ops::{derive_seed, CsrGraph};

use super::edge_split::EdgeSplitSource;
use crate::data::dataset::{Dataset, SplitSpec};
use crate::data::generate::{class_features, region_labels};
use crate::data::npy;
use crate::error::{Error, Result};

/// Where vertex features come from.
#[derive(Clone, Debug, PartialEq)]
pub enum FeatureSource {
    /// A float `.npy` file of shape `(num_vertices, d)` (`<f4`, or `<f8` narrowed).
    Npy(PathBuf),
    /// Class-correlated Gaussian features ([`class_features`]).
    Generated {
        /// Feature dimension.
        dim: usize,
        /// Scale of the class centers against unit noise (0.2–0.5: the graph helps).
        signal: f32,
    },
}

/// Where vertex labels come from.
#[derive(Clone, Debug, PartialEq)]
pub enum LabelSource {
    /// An integer `.npy` file of shape `(num_vertices,)`; `num_classes = max + 1`.
    Npy(PathBuf),
    /// Topology-following labels ([`region_labels`]).
    Generated {
        /// Number of classes (at least 1).
        num_classes: u32,
    },
}

/// Options of [`import_metis`](super::import_metis) and
/// [`import_edge_list`](super::import_edge_list).
///
/// `directed`, `relabel` and `num_vertices` apply to edge lists only; a METIS file
/// is undirected with ids `1..=n` fixed by its header, so they are ignored there.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphImportOptions {
    /// Vertex features.
    pub features: FeatureSource,
    /// Vertex labels.
    pub labels: LabelSource,
    /// Train/val/test split drawn over the labels.
    pub split: SplitSpec,
    /// Base seed for generated labels, features and the split.
    pub seed: u64,
    /// Edge lists: `false` stores every edge in both directions; `true` keeps
    /// `src dst` as one message `src → dst`, stored in row `dst`.
    pub directed: bool,
    /// Edge lists: compact arbitrary `u64` ids to `0..n` in sorted order.
    pub relabel: bool,
    /// Edge lists: the vertex count, when the file does not mention every vertex
    /// (isolated ones at the end). Without it `n` is the largest id + 1 (or the
    /// number of distinct ids with `relabel`).
    pub num_vertices: Option<usize>,
    /// The link-prediction split (default none): held out of the graph at random,
    /// or, for edge lists, read from files ([`EdgeSplitSource`]).
    pub edge_split: EdgeSplitSource,
}

impl Default for GraphImportOptions {
    /// 64 generated features with signal 0.3, 8 generated classes, a 60/20/20 split,
    /// seed 0, undirected, ids used as given, no edge split.
    fn default() -> Self {
        Self {
            features: FeatureSource::Generated {
                dim: 64,
                signal: 0.3,
            },
            labels: LabelSource::Generated { num_classes: 8 },
            split: SplitSpec::default(),
            seed: 0,
            directed: false,
            relabel: false,
            num_vertices: None,
            edge_split: EdgeSplitSource::None,
        }
    }
}

/// Seed streams of the three steps.
const LABEL_STREAM: u64 = 1;
const FEATURE_STREAM: u64 = 2;
const SPLIT_STREAM: u64 = 3;

fn check_rows(path: &Path, what: &str, rows: usize, n: usize) -> Result<()> {
    if rows != n {
        return Err(Error::format(
            path,
            format!("{what} has {rows} rows, expected one per vertex: the graph has {n} vertices"),
        ));
    }
    Ok(())
}

/// Builds a dataset named `name` on `graph`: labels, features and split as `opts`
/// says (see the module doc), then [`Dataset::validate`].
pub fn dataset_from_graph(
    name: String,
    graph: CsrGraph,
    opts: &GraphImportOptions,
) -> Result<Dataset> {
    let n = graph.num_vertices();
    let (labels, num_classes) = match &opts.labels {
        LabelSource::Npy(path) => {
            let labels = npy::read_labels(path)?;
            check_rows(path, "the label array", labels.len(), n)?;
            let num_classes = labels.iter().max().map_or(1, |&m| m + 1);
            (labels, num_classes)
        }
        LabelSource::Generated { num_classes } => {
            if *num_classes == 0 {
                return Err(Error::invalid_argument("num_classes", "must be at least 1"));
            }
            let seed = derive_seed(opts.seed, LABEL_STREAM);
            (region_labels(&graph, *num_classes, seed), *num_classes)
        }
    };
    let features = match &opts.features {
        FeatureSource::Npy(path) => {
            let f = npy::read_f32_matrix(path)?;
            check_rows(path, "the feature matrix", f.num_rows(), n)?;
            f
        }
        FeatureSource::Generated { dim, signal } => {
            if !signal.is_finite() {
                return Err(Error::invalid_argument(
                    "signal",
                    format!("{signal} is not a finite number"),
                ));
            }
            let seed = derive_seed(opts.seed, FEATURE_STREAM);
            class_features(&labels, num_classes, *dim, *signal, seed)
        }
    };
    let masks = draw_split(&opts.split, &labels, num_classes, opts.seed)?;
    Dataset::from_parts(name, graph, features, labels, num_classes, masks)
}

/// Step 3: the train/val/test masks `split` draws over `labels` from the split
/// stream of `seed` (shared with [`super::DatasetBuilder`], so an in-memory dataset
/// with the same labels, split and seed gets the importers' masks).
pub(super) fn draw_split(
    split: &SplitSpec,
    labels: &[u32],
    num_classes: u32,
    seed: u64,
) -> Result<[Vec<u8>; 3]> {
    split.apply(labels, num_classes, derive_seed(seed, SPLIT_STREAM))
}

/// The dataset name for an imported file: its stem (`mdual.graph` → `mdual`).
pub(crate) fn name_from_path(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "imported".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpu_ops::BuildOptions;

    fn ring(n: u32) -> CsrGraph {
        let edges: Vec<(u32, u32)> = (0..n).map(|i| (i, (i + 1) % n)).collect();
        CsrGraph::from_edges(n as usize, &edges, BuildOptions::UNDIRECTED).unwrap()
    }

    #[test]
    fn generated_everything_is_seeded_and_valid() {
        let opts = GraphImportOptions {
            labels: LabelSource::Generated { num_classes: 3 },
            features: FeatureSource::Generated {
                dim: 5,
                signal: 0.5,
            },
            seed: 7,
            ..Default::default()
        };
        let a = dataset_from_graph("r".into(), ring(100), &opts).unwrap();
        assert_eq!(a.features.dim(), 5);
        assert_eq!(a.num_classes, 3);
        assert_eq!(a.train_ids().len(), 60);
        assert_eq!(a, dataset_from_graph("r".into(), ring(100), &opts).unwrap());
        // Changing the feature dimension leaves labels and split alone.
        let b = dataset_from_graph(
            "r".into(),
            ring(100),
            &GraphImportOptions {
                features: FeatureSource::Generated {
                    dim: 9,
                    signal: 0.5,
                },
                ..opts.clone()
            },
        )
        .unwrap();
        assert_eq!((a.labels, a.train_mask), (b.labels, b.train_mask));
        let zero = GraphImportOptions {
            labels: LabelSource::Generated { num_classes: 0 },
            ..opts
        };
        assert!(dataset_from_graph("r".into(), ring(10), &zero).is_err());
    }

    #[test]
    fn npy_labels_and_features_are_checked_against_the_vertex_count() {
        let d = tempfile::tempdir().unwrap();
        let lp = d.path().join("labels.npy");
        npy::write_i64(&lp, &[4], [0i64, 2, 2, 1]).unwrap();
        let fp = d.path().join("feat.npy");
        npy::write_f32_matrix(&fp, &[0.5; 8], 4, 2).unwrap();
        let opts = GraphImportOptions {
            labels: LabelSource::Npy(lp.clone()),
            features: FeatureSource::Npy(fp.clone()),
            ..Default::default()
        };
        let ds = dataset_from_graph("r".into(), ring(4), &opts).unwrap();
        assert_eq!(ds.labels.as_slice(), &[0, 2, 2, 1]);
        assert_eq!(ds.num_classes, 3);
        assert_eq!(ds.features.as_slice(), &[0.5; 8]);
        let e = dataset_from_graph("r".into(), ring(5), &opts)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("labels.npy") && e.contains("4 rows") && e.contains("5 vertices"),
            "{e}"
        );
        let e = dataset_from_graph(
            "r".into(),
            ring(5),
            &GraphImportOptions {
                labels: LabelSource::Generated { num_classes: 2 },
                ..opts
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("feat.npy") && e.contains("4 rows"), "{e}");
    }
}
