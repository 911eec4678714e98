//! Datasets from in-memory arrays: [`DatasetBuilder`], for a program that holds its
//! data in memory (a service, or a host handing over NumPy or PyTorch buffers) and
//! wants a [`Dataset`] without writing files, checked as the importers check theirs.
//!
//! Steps of [`DatasetBuilder::build`]:
//!
//! 1. topology, either
//!    - a CSR ([`DatasetBuilder::csr`]): `indptr` (`n + 1` offsets) and `indices`;
//!      row `v` lists the in-neighbors of `v`, as in [`CsrGraph`]; `n` is
//!      `indptr.len() - 1`; or
//!    - an edge index ([`DatasetBuilder::edge_index`]) of shape `(2, E)` in PyG's
//!      convention: column `j` is the message `edge_index[0, j] → edge_index[1, j]`
//!      (source → target), so the target's row holds the source; `n` is
//!      [`DatasetBuilder::num_vertices`] when stated, else the number of feature
//!      rows, as in `tandem import npy` (which must then equal the number of
//!      labels).
//!
//!    Every count (feature rows, labels, masks, a stated vertex count) is
//!    compared before any id is checked against `n`, so a features matrix one
//!    row short is reported as that, not as an edge id out of range.
//!
//!    Without [`DatasetBuilder::symmetrize`] the edges are kept exactly as given
//!    (the `npy` importer's code: a PyG edge index of an undirected graph
//!    already holds both directions). With it every edge is stored in both
//!    directions and repeated edges and self-loops are dropped (the code of
//!    `tandem import edgelist` for undirected lists);
//! 2. features: `n × d` `f32` values in any memory layout (copied into the
//!    row-major [`FeatureMatrix`]), `d ≥ 1`, every value finite;
//! 3. labels: `n` non-negative integers; `num_classes` is
//!    [`DatasetBuilder::num_classes`] or, as the importers do, the largest label + 1;
//!    every label is below it;
//! 4. masks: three boolean arrays of `n` entries, disjoint
//!    ([`DatasetBuilder::masks`]), or a [`SplitSpec`] drawn over the labels with a
//!    seed exactly as the importers draw it ([`DatasetBuilder::split`]; default: the
//!    importers' 60% / 20% / rest, seed 0);
//! 5. [`Dataset::from_parts`]: [`Dataset::validate`] and
//!    [`Dataset::check_features`], as every importer ends;
//! 6. the link-prediction split, if any, either
//!    - given as arrays ([`DatasetBuilder::edge_split`]: `(src, dst)` pairs of the
//!      training, validation and test positives, and optionally fixed negatives,
//!      [`DatasetBuilder::edge_negatives`]); without a topology the training edges
//!      are the graph; or
//!    - held out of the graph at random ([`DatasetBuilder::split_edges`]:
//!      [`Dataset::split_edges`] with the seed an importer given the same seed
//!      uses);
//!
//!    either way symmetric when the builder symmetrizes, and checked by
//!    [`Dataset::with_edge_split`] (no validation or test edge in the graph,
//!    every training edge in it).
//!
//! # Arrays used in place
//! The `*_shared` setters take [`HostArray`]s (an owned vector, a memory map,
//! or a host language's buffer: [`HostArray::from_external`]) and use them
//! without copying where the element type allows: features as they are
//! ([`DatasetBuilder::features_shared`]), CSR offsets of 8-byte integers and
//! neighbor ids, labels of 4-byte integers (their values checked first, then
//! reinterpreted as `u64` / `u32`), masks of bytes. An array of another width is
//! converted once, and [`DatasetBuilder::copies`] names it.
//!
//! Every failure is an [`Error::Dataset`] naming the field, the element's position
//! where one is to blame, and a [`DatasetProblem`]: `features: length 3, expected 4
//! (the number of labels)` is a [`DatasetProblem::Count`], `edge_index[1, 17] = 9
//! is not below the vertex count 5` a [`DatasetProblem::OutOfRange`]. Setters
//! convert (and check what they can) at once; [`DatasetBuilder::build`] reports the
//! first failure.

use bytemuck::Pod;
use cpu_ops::{CsrGraph, FeatureMatrix, HostArray};
use ndarray::{ArrayView1, ArrayView2, AsArray, Ix2};
use rayon::prelude::*;

use super::attach::draw_split;
use super::edge_split::holdout_seed;
use super::edgelist::graph_from_edges;
use super::npydir::graph_from_edge_index;
use crate::data::dataset::{Dataset, EdgeList, EdgeSplit, EdgeSplitSpec, SplitSpec};
use crate::error::{DatasetProblem, Error, Result};

mod sealed {
    pub trait Sealed {}
}

/// An element type of the id, offset and label arrays a [`DatasetBuilder`] takes:
/// any primitive integer (`u32`, `i64` as NumPy and PyTorch default to, `usize`,
/// ...). Negative values are refused, naming their position.
pub trait ArrayInt: Copy + Send + Sync + sealed::Sealed {
    /// The value, widened without loss.
    fn widen(self) -> i128;
}

macro_rules! array_int {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl ArrayInt for $t {
            #[inline]
            fn widen(self) -> i128 {
                self as i128
            }
        }
    )*};
}
array_int!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize);

/// Where the topology comes from (step 1 of the module doc).
#[derive(Debug)]
enum Topology {
    /// A checked CSR.
    Csr(CsrGraph),
    /// The two rows of an edge index, each id below `u32::MAX` (the vertex count is
    /// known at build).
    EdgeIndex { src: Vec<u32>, dst: Vec<u32> },
}

/// Where the masks come from (step 4 of the module doc).
#[derive(Debug)]
enum Masks {
    Given([HostArray<u8>; 3]),
    Split(SplitSpec),
}

/// Where the edge split comes from (step 6 of the module doc).
#[derive(Debug)]
enum EdgeSource {
    /// `(src, dst)` of the training, validation and test positives.
    Given([(Vec<u32>, Vec<u32>); 3]),
    /// Held out of the graph with this seed.
    Holdout(EdgeSplitSpec, u64),
}

/// Fixed negatives of one part: the ids row-major, and the shape `(rows, k)`.
type Negatives = (Vec<u32>, [usize; 2]);

/// Builds a [`Dataset`] from in-memory arrays (steps and checks in the module
/// doc). Arrays are passed as anything that views as an `ndarray` array: an
/// [`ndarray::ArrayView`], a `&Array`, a `&Vec` or a slice for 1-D arrays.
///
/// ```
/// use runtime::ndarray::{array, Array2};
/// use runtime::DatasetBuilder;
///
/// # fn main() -> runtime::Result<()> {
/// // A path 0 - 1 - 2 - 3 given once per edge, symmetrized as `import edgelist` does.
/// let edge_index = array![[0i64, 1, 2], [1, 2, 3]];
/// let features = Array2::from_shape_fn((4, 2), |(v, c)| (v + c) as f32);
/// let ds = DatasetBuilder::new("path")
///     .edge_index(&edge_index)
///     .symmetrize(true)
///     .features(&features)
///     .labels(&[0u32, 0, 1, 1])
///     .masks(&[true, false, false, true], &[false, true, false, false], &[false, false, true, false])
///     .build()?;
/// assert_eq!(ds.num_vertices(), 4);
/// assert_eq!(ds.graph.neighbors(1), &[0, 2]); // both directions
/// assert_eq!(ds.num_classes, 2);
/// assert_eq!(ds.train_ids(), vec![0, 3]);
///
/// // Errors name the field and the element, as fields a program can match.
/// use runtime::{DatasetProblem, Error};
/// let err = DatasetBuilder::new("bad")
///     .edge_index(&array![[0i64, 1], [1, 9]])
///     .features(&features)
///     .labels(&[0u32, 0, 1, 1])
///     .build()
///     .unwrap_err();
/// assert!(matches!(
///     &err,
///     Error::Dataset { field, index, problem: DatasetProblem::OutOfRange { value: 9, bound: 4, .. } }
///         if field == "edge_index" && index == &[1, 1]
/// ));
/// assert_eq!(
///     err.to_string(),
///     "invalid dataset: edge_index[1, 1] = 9 is not below the vertex count 4"
/// );
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct DatasetBuilder {
    name: String,
    graph: Option<Topology>,
    symmetrize: bool,
    features: Option<FeatureMatrix>,
    labels: Option<HostArray<u32>>,
    num_classes: Option<u32>,
    num_vertices: Option<usize>,
    masks: Masks,
    seed: u64,
    edges: Option<EdgeSource>,
    negatives: Option<[Negatives; 2]>,
    /// The first failure of a setter, reported by `build`.
    error: Option<Error>,
    /// What a `*_shared` setter had to convert (copy).
    copies: Vec<String>,
}

impl DatasetBuilder {
    /// A builder for a dataset called `name` (nothing given yet; split 60% / 20% /
    /// rest with seed 0 unless told otherwise).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            graph: None,
            symmetrize: false,
            features: None,
            labels: None,
            num_classes: None,
            num_vertices: None,
            masks: Masks::Split(SplitSpec::default()),
            seed: 0,
            edges: None,
            negatives: None,
            error: None,
            copies: Vec::new(),
        }
    }

    /// The topology as a CSR: `indptr` has `n + 1` non-decreasing offsets from 0 to
    /// `indices.len()`, and `indices[indptr[v]..indptr[v + 1]]` are the
    /// in-neighbors of `v` (each below `n`). Replaces an earlier topology.
    pub fn csr<'a, P, I>(
        mut self,
        indptr: impl AsArray<'a, P>,
        indices: impl AsArray<'a, I>,
    ) -> Self
    where
        P: ArrayInt + 'a,
        I: ArrayInt + 'a,
    {
        let g = csr_graph(indptr.into(), indices.into());
        if let Some(g) = self.keep(g) {
            self.graph = Some(Topology::Csr(g));
        }
        self
    }

    /// The topology as an edge index of shape `(2, E)`, PyG's convention: row 0
    /// holds sources, row 1 targets, and messages flow source → target (so the
    /// target's row in the CSR holds the source). Ids must be below the number of
    /// feature rows, the vertex count. Replaces an earlier topology.
    pub fn edge_index<'a, T>(mut self, edge_index: impl AsArray<'a, T, Ix2>) -> Self
    where
        T: ArrayInt + 'a,
    {
        let ei: ArrayView2<T> = edge_index.into();
        let rows = if ei.nrows() == 2 {
            edge_rows(ei.row(0), ei.row(1))
        } else {
            Err(Error::dataset(
                "edge_index",
                &[],
                DatasetProblem::Shape {
                    expected: "(2, E): row 0 = sources, row 1 = targets",
                    found: vec![ei.nrows(), ei.ncols()],
                },
            ))
        };
        if let Some((src, dst)) = self.keep(rows) {
            self.graph = Some(Topology::EdgeIndex { src, dst });
        }
        self
    }

    /// [`DatasetBuilder::edge_index`] with its two rows as separate arrays of one
    /// length (`src[j] → dst[j]`), as DGL's `graph.edges()` returns them; errors
    /// name them `edge_index[0, j]` and `edge_index[1, j]` as `edge_index` does.
    pub fn edge_lists<'a, T>(mut self, src: impl AsArray<'a, T>, dst: impl AsArray<'a, T>) -> Self
    where
        T: ArrayInt + 'a,
    {
        let (src, dst): (ArrayView1<T>, ArrayView1<T>) = (src.into(), dst.into());
        let rows = if src.len() == dst.len() {
            edge_rows(src, dst)
        } else {
            Err(count(
                "edge_index",
                src.len() as u64,
                dst.len() as u64,
                "the sources; row 1 needs one target a source",
            ))
        };
        if let Some((src, dst)) = self.keep(rows) {
            self.graph = Some(Topology::EdgeIndex { src, dst });
        }
        self
    }

    /// Whether to store every edge in both directions, dropping repeated edges and
    /// self-loops, as `tandem import edgelist` does for undirected lists (default
    /// `false`: the topology is kept exactly as given). Applies to either topology.
    pub fn symmetrize(mut self, symmetrize: bool) -> Self {
        self.symmetrize = symmetrize;
        self
    }

    /// Vertex features: row `v` belongs to vertex `v`. Any memory layout (C, Fortran,
    /// strided); the values are copied row-major and must be finite.
    pub fn features<'a>(mut self, features: impl AsArray<'a, f32, Ix2>) -> Self {
        let f = feature_matrix(features.into());
        if let Some(f) = self.keep(f) {
            self.features = Some(f);
        }
        self
    }

    /// Vertex labels (class ids from 0), one per vertex.
    pub fn labels<'a, L>(mut self, labels: impl AsArray<'a, L>) -> Self
    where
        L: ArrayInt + 'a,
    {
        let l = checked(
            labels.into(),
            u32::MAX as i128,
            "labels",
            |i| vec![i],
            "the u32 label limit",
        );
        if let Some(l) = self.keep(l) {
            self.labels = Some(HostArray::from_vec(l));
        }
        self
    }

    /// [`DatasetBuilder::features`] without a copy: `data` holds `rows × dim`
    /// values row-major and becomes the dataset's feature matrix as it is (an
    /// external buffer stays with its owner). Checked as `features` checks:
    /// `dim ≥ 1`, every value finite.
    pub fn features_shared(mut self, data: HostArray<f32>, rows: usize, dim: usize) -> Self {
        let f = check_features(&data, rows, dim).and_then(|()| {
            FeatureMatrix::new(data, rows, dim).map_err(|e| Error::cpu_ops("features", e))
        });
        if let Some(f) = self.keep(f) {
            self.features = Some(f);
        }
        self
    }

    /// [`DatasetBuilder::csr`] over arrays used in place where their element
    /// types allow (module doc, "Arrays used in place"): 8-byte `indptr`
    /// (`i64`, `u64`) and 4-byte `indices` (`i32`, `u32`) are checked, then
    /// shared; other widths are converted. Same checks and messages as `csr`.
    pub fn csr_shared<P, I>(mut self, indptr: HostArray<P>, indices: HostArray<I>) -> Self
    where
        P: ArrayInt + Pod,
        I: ArrayInt + Pod,
    {
        let g = csr_graph_shared(indptr, indices, &mut self.copies);
        if let Some(g) = self.keep(g) {
            self.graph = Some(Topology::Csr(g));
        }
        self
    }

    /// [`DatasetBuilder::labels`] over an array used in place when its
    /// elements are 4 bytes wide (`i32`, `u32`; checked, then shared), converted
    /// otherwise.
    pub fn labels_shared<L: ArrayInt + Pod>(mut self, labels: HostArray<L>) -> Self {
        let l = shared_ints(
            labels,
            u32::MAX as i128,
            "labels",
            |i| vec![i],
            "the u32 label limit",
            &mut self.copies,
        );
        if let Some(l) = self.keep(l) {
            self.labels = Some(l);
        }
        self
    }

    /// [`DatasetBuilder::masks`] over byte arrays used in place (a NumPy bool
    /// array's buffer: 1 for `true`, 0 for `false`). Any other byte value is a
    /// [`DatasetProblem::Invalid`] at build.
    pub fn masks_shared(
        mut self,
        train: HostArray<u8>,
        val: HostArray<u8>,
        test: HostArray<u8>,
    ) -> Self {
        self.masks = Masks::Given([train, val, test]);
        self
    }

    /// The fields a `*_shared` setter converted instead of using in place, with
    /// the conversion (`indptr: i32 → u64`); empty when every array is shared.
    pub fn copies(&self) -> &[String] {
        &self.copies
    }

    /// The number of classes (default: the largest label + 1).
    pub fn num_classes(mut self, num_classes: u32) -> Self {
        self.num_classes = Some(num_classes);
        self
    }

    /// The number of vertices, stated (default: the CSR's, or for an edge index
    /// the number of feature rows). Every array is checked against it before any
    /// vertex id is: features with one row too few are a
    /// [`DatasetProblem::Count`] on `features`, not an edge id out of range.
    pub fn num_vertices(mut self, num_vertices: usize) -> Self {
        self.num_vertices = Some(num_vertices);
        self
    }

    /// The train, validation and test masks (`true` = in that part), one entry per
    /// vertex each; no vertex may be in two parts. Replaces a split.
    pub fn masks<'a>(
        mut self,
        train: impl AsArray<'a, bool>,
        val: impl AsArray<'a, bool>,
        test: impl AsArray<'a, bool>,
    ) -> Self {
        let u8s = |m: ArrayView1<bool>| {
            HostArray::from_vec(m.iter().map(|&b| b as u8).collect::<Vec<u8>>())
        };
        self.masks = Masks::Given([u8s(train.into()), u8s(val.into()), u8s(test.into())]);
        self
    }

    /// Draws the masks with `split` over the labels, as the importers do (with the
    /// same [`DatasetBuilder::seed`] an importer given the same labels draws the
    /// same masks). Replaces masks.
    pub fn split(mut self, split: SplitSpec) -> Self {
        self.masks = Masks::Split(split);
        self
    }

    /// The seed of the split (default 0; unused with [`DatasetBuilder::masks`]).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The link-prediction split as arrays: the `(src, dst)` ids of the training,
    /// validation and test positives (edge `i` is `src[i] → dst[i]`). The graph
    /// must hold every training edge and no validation or test edge (in either
    /// direction with [`DatasetBuilder::symmetrize`]); without a topology the
    /// training edges are the graph, as an edge index. Replaces
    /// [`DatasetBuilder::split_edges`].
    pub fn edge_split<'a, T, A>(mut self, train: (A, A), val: (A, A), test: (A, A)) -> Self
    where
        T: ArrayInt + 'a,
        A: AsArray<'a, T>,
    {
        let mut parts = Vec::with_capacity(3);
        for (name, (src, dst)) in [("train", train), ("val", val), ("test", test)] {
            let ids = |a: A, side: &str| {
                checked(
                    a.into(),
                    u32::MAX as i128,
                    &format!("edges.{name}.{side}"),
                    |i| vec![i],
                    "the u32 vertex id limit",
                )
            };
            let pair = ids(src, "src").and_then(|s| ids(dst, "dst").map(|d| (s, d)));
            match self.keep(pair) {
                Some(p) => parts.push(p),
                None => return self,
            }
        }
        if let Ok(parts) = parts.try_into() {
            self.edges = Some(EdgeSource::Given(parts));
        }
        self
    }

    /// Fixed negatives for the validation and test positives of
    /// [`DatasetBuilder::edge_split`]: arrays of shape `(positives, k)`, row `i`
    /// holding the `k ≥ 1` negative destinations of positive `i` (its source is
    /// kept).
    pub fn edge_negatives<'a, T, A>(mut self, val_neg: A, test_neg: A) -> Self
    where
        T: ArrayInt + 'a,
        A: AsArray<'a, T, Ix2>,
    {
        let one = |a: A, field: &str| -> Result<Negatives> {
            let a: ArrayView2<T> = a.into();
            let (rows, k) = a.dim();
            let flat: Vec<T> = a.iter().copied().collect();
            let ids = checked(
                ArrayView1::from(&flat),
                u32::MAX as i128,
                field,
                |i| vec![i / k.max(1), i % k.max(1)],
                "the u32 vertex id limit",
            )?;
            Ok((ids, [rows, k]))
        };
        let both = one(val_neg, "edges.val_neg")
            .and_then(|v| one(test_neg, "edges.test_neg").map(|t| [v, t]));
        if let Some(both) = self.keep(both) {
            self.negatives = Some(both);
        }
        self
    }

    /// Holds out `[train, val, test]` fractions of the graph's edges as the
    /// link-prediction split with `seed` ([`Dataset::split_edges`]; symmetric with
    /// [`DatasetBuilder::symmetrize`]). The same graph, fractions and seed give
    /// the split `tandem import edgelist --edge-split F --seed S` draws. Replaces
    /// [`DatasetBuilder::edge_split`].
    pub fn split_edges(mut self, fractions: [f64; 3], seed: u64) -> Self {
        if let Some(spec) = self.keep(EdgeSplitSpec::new(fractions)) {
            self.edges = Some(EdgeSource::Holdout(spec, seed));
        }
        self
    }

    /// Checks everything and assembles the dataset (steps in the module doc).
    pub fn build(self) -> Result<Dataset> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let missing = |field: &str| Err(Error::dataset(field, &[], DatasetProblem::Missing));
        let topology = match (self.graph, &self.edges) {
            (Some(t), _) => t,
            // The training edges are the graph.
            (None, Some(EdgeSource::Given([(src, dst), _, _]))) => Topology::EdgeIndex {
                src: src.clone(),
                dst: dst.clone(),
            },
            (None, _) => return missing("graph"),
        };
        let Some(features) = self.features else {
            return missing("features");
        };
        let Some(labels) = self.labels else {
            return missing("labels");
        };

        // Counts first (every array against one vertex count), ids after.
        let (n, basis) = match (&topology, self.num_vertices) {
            (Topology::Csr(g), Some(stated)) => {
                if g.num_vertices() != stated {
                    return Err(count(
                        "indptr",
                        stated as u64 + 1,
                        g.num_vertices() as u64 + 1,
                        "num_vertices + 1",
                    ));
                }
                (stated, "num_vertices")
            }
            (Topology::Csr(g), None) => (g.num_vertices(), "the vertices of the CSR"),
            (Topology::EdgeIndex { .. }, Some(stated)) => (stated, "num_vertices"),
            (Topology::EdgeIndex { .. }, None) => {
                // No stated count: feature rows and labels must agree before either
                // is taken as the vertex count.
                if features.num_rows() != labels.len() {
                    return Err(count(
                        "features",
                        labels.len() as u64,
                        features.num_rows() as u64,
                        "the number of labels; DatasetBuilder::num_vertices states the count",
                    ));
                }
                (features.num_rows(), "the feature rows")
            }
        };
        if features.num_rows() != n {
            return Err(count(
                "features",
                n as u64,
                features.num_rows() as u64,
                basis,
            ));
        }
        if labels.len() != n {
            return Err(count("labels", n as u64, labels.len() as u64, basis));
        }
        if let Masks::Given(masks) = &self.masks {
            for (name, m) in MASK_NAMES.iter().zip(masks) {
                if m.len() != n {
                    return Err(count(name, n as u64, m.len() as u64, basis));
                }
            }
        }
        if n == 0 {
            return Err(Error::dataset_invalid(
                "graph",
                "0 vertices; the graph needs at least one",
            ));
        }
        if n > u32::MAX as usize {
            return Err(Error::dataset_invalid(
                "graph",
                format!("{n} vertices do not fit u32 vertex ids"),
            ));
        }

        // 1. Topology (2. the features' values were checked by `features`).
        let graph = match topology {
            Topology::Csr(g) if self.symmetrize => {
                let edges: Vec<(u32, u32)> = g.edges().collect();
                graph_from_edges(n, &edges, false).map_err(|e| Error::cpu_ops("csr", e))?
            }
            Topology::Csr(g) => g,
            Topology::EdgeIndex { src, dst } => {
                let out = |&v: &u32| v as usize >= n;
                if let Some(j) = (0..src.len())
                    .into_par_iter()
                    .find_first(|&j| out(&src[j]) || out(&dst[j]))
                {
                    let (row, v) = if out(&src[j]) {
                        (0, src[j])
                    } else {
                        (1, dst[j])
                    };
                    return Err(Error::dataset(
                        "edge_index",
                        &[row, j],
                        DatasetProblem::OutOfRange {
                            value: v.into(),
                            bound: n as u64,
                            bound_name: "the vertex count",
                        },
                    ));
                }
                let built = if self.symmetrize {
                    let edges: Vec<(u32, u32)> = src.into_iter().zip(dst).collect();
                    graph_from_edges(n, &edges, false)
                } else {
                    graph_from_edge_index(&src, &dst, n)
                };
                built.map_err(|e| Error::cpu_ops("edge_index", e))?
            }
        };

        // 3. Labels.
        let num_classes = match self.num_classes {
            Some(0) => {
                return Err(Error::dataset_invalid(
                    "num_classes",
                    "0; there must be at least one class",
                ))
            }
            Some(c) => c,
            None => labels.iter().max().map_or(1, |&m| m + 1),
        };
        if let Some(i) = labels.par_iter().position_first(|&l| l >= num_classes) {
            return Err(Error::dataset(
                "labels",
                &[i],
                DatasetProblem::OutOfRange {
                    value: labels[i].into(),
                    bound: num_classes.into(),
                    bound_name: "num_classes",
                },
            ));
        }

        // 4. Masks.
        let masks = match self.masks {
            Masks::Given(masks) => {
                check_disjoint(&masks, n)?;
                masks
            }
            Masks::Split(spec) => {
                draw_split(&spec, &labels, num_classes, self.seed)?.map(HostArray::from_vec)
            }
        };

        // 5. The importers' last step.
        let ds =
            Dataset::from_shared_parts(self.name, graph, features, labels, num_classes, masks)?;

        // 6. The edge split.
        let symmetric = self.symmetrize;
        match (self.edges, self.negatives) {
            (None, None) => Ok(ds),
            (None, Some(_)) => Err(Error::dataset_invalid(
                "edges",
                "negatives were given without the positives (DatasetBuilder::edge_split)",
            )),
            (Some(EdgeSource::Holdout(..)), Some(_)) => Err(Error::dataset_invalid(
                "edges",
                "fixed negatives need the positives they belong to, given with \
                 DatasetBuilder::edge_split, not drawn by DatasetBuilder::split_edges",
            )),
            (Some(EdgeSource::Holdout(spec, seed)), None) => {
                ds.split_edges(&spec, symmetric, holdout_seed(seed))
            }
            (Some(EdgeSource::Given([train, val, test])), negatives) => {
                let (val_neg, test_neg) = match negatives {
                    None => (None, None),
                    Some([v, t]) => (
                        Some(negatives_for("edges.val_neg", v, val.0.len())?),
                        Some(negatives_for("edges.test_neg", t, test.0.len())?),
                    ),
                };
                let list = |(src, dst): (Vec<u32>, Vec<u32>)| EdgeList::new(src, dst);
                ds.with_edge_split(EdgeSplit {
                    train: list(train),
                    val: list(val),
                    test: list(test),
                    val_neg,
                    test_neg,
                    symmetric,
                })
            }
        }
    }

    /// `Some(value)`, or `None` after remembering the first error for `build`.
    fn keep<T>(&mut self, r: Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.error.get_or_insert(e);
                None
            }
        }
    }
}

/// The negatives of a part with `positives` positives, checked for shape: one row
/// per positive, at least one column.
fn negatives_for(
    field: &str,
    (ids, [rows, k]): Negatives,
    positives: usize,
) -> Result<HostArray<u32>> {
    if rows != positives || k == 0 {
        return Err(Error::dataset(
            field,
            &[],
            DatasetProblem::Shape {
                expected: "(positives, k) with k ≥ 1: one row of negatives per positive",
                found: vec![rows, k],
            },
        ));
    }
    Ok(ids.into())
}

/// The two rows of an edge index as `u32` ids (each below `u32::MAX`; the vertex
/// count is checked at build).
fn edge_rows<T: ArrayInt>(src: ArrayView1<T>, dst: ArrayView1<T>) -> Result<(Vec<u32>, Vec<u32>)> {
    let limit = u32::MAX as i128;
    let beyond = "the u32 vertex id limit";
    let src = checked(src, limit, "edge_index", |j| vec![0, j], beyond)?;
    let dst = checked(dst, limit, "edge_index", |j| vec![1, j], beyond)?;
    Ok((src, dst))
}

/// The names of the three masks, in order.
const MASK_NAMES: [&str; 3] = ["train_mask", "val_mask", "test_mask"];

/// A [`DatasetProblem::Count`] on `field`.
fn count(field: &str, expected: u64, found: u64, basis: &'static str) -> Error {
    Error::dataset(
        field,
        &[],
        DatasetProblem::Count {
            expected,
            found,
            basis,
        },
    )
}

/// The values of `a` as `T`, each in `0..limit`; the first that is not is a
/// [`DatasetProblem::Negative`] or [`DatasetProblem::OutOfRange`] (bound `limit`,
/// called `beyond`) on `field` at `index(i)`. (Contiguous arrays are scanned in
/// parallel.)
fn checked<A: ArrayInt, T: TryFrom<i128> + Send>(
    a: ArrayView1<A>,
    limit: i128,
    field: &str,
    index: impl Fn(usize) -> Vec<usize>,
    beyond: &'static str,
) -> Result<Vec<T>> {
    let ok = |x: &A| (0..limit).contains(&x.widen());
    let bad = match a.as_slice() {
        Some(s) => s.par_iter().position_first(|x| !ok(x)),
        None => a.iter().position(|x| !ok(x)),
    };
    if let Some(i) = bad {
        return Err(not_in_range(a[i].widen(), limit, field, &index(i), beyond));
    }
    // In range, so the conversion cannot fail.
    let narrow = |x: &A| T::try_from(x.widen()).unwrap_or_else(|_| unreachable!("checked"));
    Ok(match a.as_slice() {
        Some(s) => s.par_iter().map(narrow).collect(),
        None => a.iter().map(narrow).collect(),
    })
}

/// [`DatasetProblem::Negative`] or [`DatasetProblem::OutOfRange`] for `value`
/// outside `0..limit` (`beyond` names the bound).
fn not_in_range(
    value: i128,
    limit: i128,
    field: &str,
    index: &[usize],
    beyond: &'static str,
) -> Error {
    let problem = if value < 0 {
        DatasetProblem::Negative { value }
    } else {
        DatasetProblem::OutOfRange {
            value,
            bound: u64::try_from(limit).unwrap_or(u64::MAX),
            bound_name: beyond,
        }
    };
    Error::dataset(field, index, problem)
}

/// `a` as `T`, each value in `0..limit` (checked as [`checked`] checks): the
/// same storage when `A` and `T` have one width (non-negative values below
/// `limit` have the same bits), else a converted copy noted in `copies`.
fn shared_ints<A: ArrayInt + Pod, T: Pod + TryFrom<i128> + Send>(
    a: HostArray<A>,
    limit: i128,
    field: &str,
    index: impl Fn(usize) -> Vec<usize>,
    beyond: &'static str,
    copies: &mut Vec<String>,
) -> Result<HostArray<T>> {
    if std::mem::size_of::<A>() == std::mem::size_of::<T>() {
        let ok = |x: &A| (0..limit).contains(&x.widen());
        if let Some(i) = a.par_iter().position_first(|x| !ok(x)) {
            return Err(not_in_range(a[i].widen(), limit, field, &index(i), beyond));
        }
        if let Some(shared) = a.clone().reinterpret::<T>() {
            return Ok(shared);
        }
    }
    copies.push(format!(
        "{field}: {} → {}",
        std::any::type_name::<A>(),
        std::any::type_name::<T>()
    ));
    checked(ArrayView1::from(a.as_slice()), limit, field, index, beyond).map(HostArray::from_vec)
}

/// A checked CSR over shared arrays (step 1 of the module doc, without copies
/// where the widths allow); errors name `indptr` or `indices` as
/// [`csr_graph`]'s do.
fn csr_graph_shared<P: ArrayInt + Pod, I: ArrayInt + Pod>(
    indptr: HostArray<P>,
    indices: HostArray<I>,
    copies: &mut Vec<String>,
) -> Result<CsrGraph> {
    let n = check_indptr_len(indptr.len())?;
    let offsets: HostArray<u64> = shared_ints(
        indptr,
        u64::MAX as i128 + 1,
        "indptr",
        |v| vec![v],
        "the u64 offset limit",
        copies,
    )?;
    check_offsets(&offsets, indices.len())?;
    let ids: HostArray<u32> = shared_ints(
        indices,
        n as i128,
        "indices",
        |k| vec![k],
        "the vertex count",
        copies,
    )?;
    CsrGraph::new(offsets, ids).map_err(|e| Error::cpu_ops("csr", e))
}

/// A checked CSR (step 1 of the module doc); errors name `indptr` or `indices`.
fn csr_graph<P: ArrayInt, I: ArrayInt>(
    indptr: ArrayView1<P>,
    indices: ArrayView1<I>,
) -> Result<CsrGraph> {
    let n = check_indptr_len(indptr.len())?;
    let offsets: Vec<u64> = checked(
        indptr,
        u64::MAX as i128 + 1,
        "indptr",
        |v| vec![v],
        "the u64 offset limit",
    )?;
    check_offsets(&offsets, indices.len())?;
    let ids: Vec<u32> = checked(
        indices,
        n as i128,
        "indices",
        |k| vec![k],
        "the vertex count",
    )?;
    CsrGraph::new(offsets.into(), ids.into()).map_err(|e| Error::cpu_ops("csr", e))
}

/// The vertex count of an `indptr` of `len` entries (at least one; ids fit `u32`).
fn check_indptr_len(len: usize) -> Result<usize> {
    if len == 0 {
        return Err(Error::dataset_invalid(
            "indptr",
            "empty; it needs num_vertices + 1 entries",
        ));
    }
    let n = len - 1;
    if n > u32::MAX as usize {
        return Err(Error::dataset_invalid(
            "indptr",
            format!("{n} vertices do not fit u32 vertex ids"),
        ));
    }
    Ok(n)
}

/// CSR offsets start at 0, never decrease and end at the number of indices.
fn check_offsets(offsets: &[u64], num_indices: usize) -> Result<()> {
    let n = offsets.len() - 1;
    if offsets[0] != 0 {
        return Err(Error::dataset(
            "indptr",
            &[0],
            DatasetProblem::Invalid {
                what: format!("{}, expected 0", offsets[0]),
            },
        ));
    }
    if let Some(v) = (0..n)
        .into_par_iter()
        .find_first(|&v| offsets[v] > offsets[v + 1])
    {
        return Err(Error::dataset(
            "indptr",
            &[v + 1],
            DatasetProblem::Invalid {
                what: format!(
                    "{} is less than indptr[{v}] = {}; offsets must not decrease",
                    offsets[v + 1],
                    offsets[v]
                ),
            },
        ));
    }
    if offsets[n] != num_indices as u64 {
        return Err(Error::dataset(
            "indptr",
            &[n],
            DatasetProblem::Invalid {
                what: format!(
                    "{}, expected the number of indices {num_indices}",
                    offsets[n]
                ),
            },
        ));
    }
    Ok(())
}

/// `x` copied row-major, checked: at least one column, every value finite.
fn feature_matrix(x: ArrayView2<f32>) -> Result<FeatureMatrix> {
    let (rows, dim) = x.dim();
    let data: Vec<f32> = match x.as_slice() {
        Some(s) => s.to_vec(),
        None => x.iter().copied().collect(),
    };
    check_features(&data, rows, dim)?;
    FeatureMatrix::new(data.into(), rows, dim).map_err(|e| Error::cpu_ops("features", e))
}

/// Row-major features `data` of `rows × dim`: at least one column, every value
/// finite (the values are only read).
fn check_features(data: &[f32], rows: usize, dim: usize) -> Result<()> {
    if dim == 0 {
        return Err(Error::dataset(
            "features",
            &[],
            DatasetProblem::Shape {
                expected: "(n, d) with d ≥ 1: every vertex needs at least one feature",
                found: vec![rows, 0],
            },
        ));
    }
    if let Some(i) = data.par_iter().position_first(|v| !v.is_finite()) {
        return Err(Error::dataset(
            "features",
            &[i / dim, i % dim],
            DatasetProblem::NonFinite { value: data[i] },
        ));
    }
    Ok(())
}

/// Step 4 for given masks (their lengths were checked with the other counts): no
/// vertex in two parts.
fn check_disjoint(masks: &[HostArray<u8>; 3], n: usize) -> Result<()> {
    let [a, b, c] = masks;
    if let Some(v) = (0..n)
        .into_par_iter()
        .find_first(|&v| a[v] > 1 || b[v] > 1 || c[v] > 1 || a[v] + b[v] + c[v] > 1)
    {
        // A shared mask may hold any byte: anything but 0/1 is named first.
        if let Some((name, m)) = MASK_NAMES.iter().zip(masks).find(|(_, m)| m[v] > 1) {
            return Err(Error::dataset(
                *name,
                &[v],
                DatasetProblem::Invalid {
                    what: format!("{}, expected 0 or 1", m[v]),
                },
            ));
        }
        let both: Vec<&str> = MASK_NAMES
            .iter()
            .zip(masks)
            .filter(|(_, m)| m[v] == 1)
            .map(|(name, _)| *name)
            .collect();
        return Err(Error::dataset(
            both[0],
            &[v],
            DatasetProblem::Overlap { other: both[1] },
        ));
    }
    Ok(())
}
