//! Graph datasets: topology, features, labels, the train/val/test split of the
//! vertices and, for link prediction, of the edges (`edges`, `holdout`), and their
//! on-disk store (`store`).
//!
//! ```
//! use runtime::data::{open_dataset, write_dataset, Verify};
//! use runtime::data::{generate_sbm, SbmOptions};
//!
//! # fn main() -> runtime::Result<()> {
//! let ds = generate_sbm(&SbmOptions { num_vertices: 300, num_edges: 900, ..SbmOptions::default() })?;
//! let path = std::env::temp_dir().join(format!("tandem-doc-{}.tds", std::process::id()));
//! write_dataset(&path, &ds)?; // atomic: a temporary name, then a rename
//! let back = open_dataset(&path, Verify::Full)?; // memory-mapped, every checksum checked
//! assert_eq!(back.num_vertices(), 300);
//! assert_eq!(back.features.as_slice(), ds.features.as_slice());
//! std::fs::remove_file(&path).ok();
//! # Ok(())
//! # }
//! ```

mod edges;
mod holdout;
mod split;
mod store;

pub(crate) use edges::EdgeLookup;
pub use edges::{EdgeList, EdgeSplit};
pub(crate) use holdout::edge_pairs;
pub use holdout::EdgeSplitSpec;
pub use split::{Amount, SplitSpec};
pub use store::{open_dataset, parse_dataset_bytes, write_dataset, Verify, FORMAT_VERSION, MAGIC};

use cpu_ops::{CsrGraph, FeatureMatrix, HostArray};

use crate::error::{DatasetProblem, Error, Result};

/// A graph dataset. Every per-vertex array has `num_vertices` entries. The vertex
/// labels and masks serve node classification; `edges`, when present, serves link
/// prediction.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// A short name (the importer's source or the generator's model).
    pub name: String,
    /// Topology; row `v` holds the in-neighbors of `v`.
    pub graph: CsrGraph,
    /// One feature row per vertex.
    pub features: FeatureMatrix,
    /// One class label per vertex, each below `num_classes`.
    pub labels: HostArray<u32>,
    /// Number of classes.
    pub num_classes: u32,
    /// 1 where the vertex is a training vertex, else 0.
    pub train_mask: HostArray<u8>,
    /// 1 where the vertex is a validation vertex, else 0.
    pub val_mask: HostArray<u8>,
    /// 1 where the vertex is a test vertex, else 0.
    pub test_mask: HostArray<u8>,
    /// The link-prediction split (`None`: no link task possible). When present,
    /// `graph` is the message-passing graph: it holds the training edges and never
    /// a validation or test edge ([`EdgeSplit::validate`]).
    pub edges: Option<EdgeSplit>,
}

impl Dataset {
    /// Vertices in decreasing degree order (ties by id): the device feature
    /// cache's fill order.
    pub(crate) fn degree_order(&self) -> Vec<u32> {
        let g = &self.graph;
        let mut ids: Vec<u32> = (0..g.num_vertices() as u32).collect();
        ids.sort_by_key(|&v| (std::cmp::Reverse(g.degree(v)), v));
        ids
    }

    /// Assembles a dataset from owned parts (`masks` = train, val, test), without
    /// an edge split, and checks that they agree ([`Dataset::validate`]); every
    /// importer and generator ends here ([`Dataset::split_edges`] and
    /// [`Dataset::with_edge_split`] add an edge split).
    pub fn from_parts(
        name: String,
        graph: CsrGraph,
        features: FeatureMatrix,
        labels: Vec<u32>,
        num_classes: u32,
        masks: [Vec<u8>; 3],
    ) -> Result<Self> {
        let masks = masks.map(HostArray::from_vec);
        Self::from_shared_parts(name, graph, features, labels.into(), num_classes, masks)
    }

    /// [`Dataset::from_parts`] over arrays that may be shared (memory-mapped,
    /// or buffers of an external owner: [`HostArray::from_external`]); nothing
    /// is copied.
    pub fn from_shared_parts(
        name: String,
        graph: CsrGraph,
        features: FeatureMatrix,
        labels: HostArray<u32>,
        num_classes: u32,
        masks: [HostArray<u8>; 3],
    ) -> Result<Self> {
        let [train_mask, val_mask, test_mask] = masks;
        let ds = Self {
            name,
            graph,
            features,
            labels,
            num_classes,
            train_mask,
            val_mask,
            test_mask,
            edges: None,
        };
        ds.validate()?;
        ds.check_features()?;
        Ok(ds)
    }

    /// Number of vertices.
    pub fn num_vertices(&self) -> usize {
        self.graph.num_vertices()
    }

    /// The first feature value that is not a finite number: `(row, column,
    /// value)` (a parallel scan of the whole matrix).
    pub fn first_non_finite_feature(&self) -> Option<(usize, usize, f32)> {
        use rayon::prelude::*;
        let dim = self.features.dim().max(1);
        let data = self.features.as_slice();
        let i = data.par_iter().position_first(|x| !x.is_finite())?;
        Some((i / dim, i % dim, data[i]))
    }

    /// Checks that every feature is a finite number (a NaN or an infinity would
    /// otherwise train with a NaN loss); the error names the row and column. Reads
    /// the whole matrix: [`Dataset::from_parts`] (every importer and generator) and
    /// [`crate::TrainerBuilder::dataset`] call it, a stored dataset only when
    /// opened with [`crate::data::dataset::Verify::Full`].
    pub fn check_features(&self) -> Result<()> {
        match self.first_non_finite_feature() {
            Some((row, col, value)) => Err(Error::dataset(
                "features",
                &[row, col],
                DatasetProblem::NonFinite { value },
            )),
            None => Ok(()),
        }
    }

    /// Checks that the parts agree: sizes, label range, masks are 0/1 and
    /// disjoint, and the edge split, if any, against the graph
    /// ([`EdgeSplit::validate`]). (The graph's own invariants are checked when it
    /// is built; the features' values by [`Dataset::check_features`].)
    pub fn validate(&self) -> Result<()> {
        let n = self.num_vertices();
        let count = |field: &str, found: usize| {
            Err(Error::dataset(
                field,
                &[],
                DatasetProblem::Count {
                    expected: n as u64,
                    found: found as u64,
                    basis: "the vertices of the graph",
                },
            ))
        };
        if self.features.num_rows() != n {
            return count("features", self.features.num_rows());
        }
        if self.labels.len() != n {
            return count("labels", self.labels.len());
        }
        if self.num_classes == 0 {
            return Err(Error::dataset_invalid(
                "num_classes",
                "0; there must be at least one class",
            ));
        }
        if let Some((v, &l)) = self
            .labels
            .iter()
            .enumerate()
            .find(|(_, &l)| l >= self.num_classes)
        {
            return Err(Error::dataset(
                "labels",
                &[v],
                DatasetProblem::OutOfRange {
                    value: l.into(),
                    bound: self.num_classes.into(),
                    bound_name: "num_classes",
                },
            ));
        }
        let masks = [
            ("train_mask", &self.train_mask),
            ("val_mask", &self.val_mask),
            ("test_mask", &self.test_mask),
        ];
        for (name, mask) in masks {
            if mask.len() != n {
                return count(name, mask.len());
            }
            if let Some((v, &m)) = mask.iter().enumerate().find(|(_, &m)| m > 1) {
                return Err(Error::dataset(
                    name,
                    &[v],
                    DatasetProblem::Invalid {
                        what: format!("{m}, expected 0 or 1"),
                    },
                ));
            }
        }
        if let Some(v) = (0..n).find(|&v| {
            self.train_mask[v] as u32 + self.val_mask[v] as u32 + self.test_mask[v] as u32 > 1
        }) {
            let both: Vec<&str> = masks
                .iter()
                .filter(|(_, m)| m[v] == 1)
                .map(|(name, _)| *name)
                .collect();
            return Err(Error::dataset(
                both[0],
                &[v],
                DatasetProblem::Overlap { other: both[1] },
            ));
        }
        if let Some(split) = &self.edges {
            split.validate(&self.graph)?;
        }
        Ok(())
    }

    /// Ids of the vertices whose mask entry is 1.
    pub fn ids_where(mask: &[u8]) -> Vec<u32> {
        mask.iter()
            .enumerate()
            .filter(|(_, &m)| m != 0)
            .map(|(v, _)| v as u32)
            .collect()
    }

    /// Training vertex ids.
    pub fn train_ids(&self) -> Vec<u32> {
        Self::ids_where(&self.train_mask)
    }

    /// Validation vertex ids.
    pub fn val_ids(&self) -> Vec<u32> {
        Self::ids_where(&self.val_mask)
    }

    /// Test vertex ids.
    pub fn test_ids(&self) -> Vec<u32> {
        Self::ids_where(&self.test_mask)
    }

    /// The accuracy of always answering the most frequent label among `ids`: the
    /// chance level a measured accuracy is read against (on 172 balanced
    /// classes about 0.006; on a skewed test split the largest class's share).
    /// 0 for no ids.
    pub fn chance_accuracy(&self, ids: &[u32]) -> f64 {
        let mut counts = vec![0usize; self.num_classes as usize];
        for &v in ids {
            if let Some(c) = self
                .labels
                .get(v as usize)
                .and_then(|&l| counts.get_mut(l as usize))
            {
                *c += 1;
            }
        }
        let most = counts.into_iter().max().unwrap_or(0);
        if ids.is_empty() {
            0.0
        } else {
            most as f64 / ids.len() as f64
        }
    }

    /// A one-paragraph description (sizes, classes, split, edge split) for
    /// `tandem info`.
    pub fn summary(&self) -> String {
        let feat_bytes = self.features.as_slice().len() * 4;
        let edges = self
            .edges
            .as_ref()
            .map_or(String::new(), |e| format!("; {}", e.summary()));
        format!(
            "dataset `{}`: {} vertices, {} stored edges ({} undirected if symmetric), \
             {} features/vertex ({:.1} MiB), {} classes, split train/val/test = {}/{}/{}{edges}",
            self.name,
            self.num_vertices(),
            self.graph.num_edges(),
            self.graph.num_edges() / 2,
            self.features.dim(),
            feat_bytes as f64 / (1 << 20) as f64,
            self.num_classes,
            self.train_mask.iter().filter(|&&m| m != 0).count(),
            self.val_mask.iter().filter(|&&m| m != 0).count(),
            self.test_mask.iter().filter(|&&m| m != 0).count(),
        )
    }
}
