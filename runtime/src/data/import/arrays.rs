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
//!      (source → target), so the target's row holds the source; `n` is the
//!      number of feature rows, as in `tandem import npy`.
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
//!    [`Dataset::check_features`], as every importer ends.
//!
//! Every failure is an [`Error::InvalidDataset`] whose message starts with the
//! field, and an element's position where one is to blame: `features: 3 rows for 4
//! vertices`, `edge_index[1, 17] = 9 is not below the vertex count 5`. Setters
//! convert (and check what they can) at once; [`DatasetBuilder::build`] reports the
//! first failure.

use cpu_ops::{CsrGraph, FeatureMatrix};
use ndarray::{ArrayView1, ArrayView2, AsArray, Ix2};
use rayon::prelude::*;

use super::attach::draw_split;
use super::edgelist::graph_from_edges;
use super::npydir::graph_from_edge_index;
use crate::data::dataset::{Dataset, SplitSpec};
use crate::error::{Error, Result};

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
    Given([Vec<u8>; 3]),
    Split(SplitSpec),
}

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
/// // Errors name the field and the element.
/// let err = DatasetBuilder::new("bad")
///     .edge_index(&array![[0i64, 1], [1, 9]])
///     .features(&features)
///     .labels(&[0u32, 0, 1, 1])
///     .build()
///     .unwrap_err();
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
    labels: Option<Vec<u32>>,
    num_classes: Option<u32>,
    masks: Masks,
    seed: u64,
    /// The first failure of a setter, reported by `build`.
    error: Option<Error>,
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
            masks: Masks::Split(SplitSpec::default()),
            seed: 0,
            error: None,
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
            let limit = u32::MAX as i128;
            let beyond = format!("does not fit u32 vertex ids (at most {})", u32::MAX - 1);
            checked(ei.row(0), limit, |j| format!("edge_index[0, {j}]"), &beyond).and_then(|src| {
                checked(ei.row(1), limit, |j| format!("edge_index[1, {j}]"), &beyond)
                    .map(|dst| (src, dst))
            })
        } else {
            Err(invalid(format!(
                "edge_index: shape ({}, {}), expected (2, E): row 0 = sources, row 1 = targets",
                ei.nrows(),
                ei.ncols()
            )))
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
        let beyond = format!("is too large (labels must be below {})", u32::MAX);
        let l = checked(
            labels.into(),
            u32::MAX as i128,
            |i| format!("labels[{i}]"),
            &beyond,
        );
        if let Some(l) = self.keep(l) {
            self.labels = Some(l);
        }
        self
    }

    /// The number of classes (default: the largest label + 1).
    pub fn num_classes(mut self, num_classes: u32) -> Self {
        self.num_classes = Some(num_classes);
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
        let u8s = |m: ArrayView1<bool>| m.iter().map(|&b| b as u8).collect::<Vec<u8>>();
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

    /// Checks everything and assembles the dataset (steps in the module doc).
    pub fn build(self) -> Result<Dataset> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let Some(topology) = self.graph else {
            return Err(invalid(
                "graph: not given (DatasetBuilder::csr or DatasetBuilder::edge_index)",
            ));
        };
        let Some(features) = self.features else {
            return Err(invalid("features: not given (DatasetBuilder::features)"));
        };
        let Some(labels) = self.labels else {
            return Err(invalid("labels: not given (DatasetBuilder::labels)"));
        };

        // 1. Topology.
        let n = match &topology {
            Topology::Csr(g) => g.num_vertices(),
            Topology::EdgeIndex { .. } => features.num_rows(),
        };
        if n == 0 {
            return Err(invalid(match topology {
                Topology::Csr(_) => "indptr: 1 entry, so 0 vertices; the graph needs at least one",
                Topology::EdgeIndex { .. } => {
                    "features: 0 rows, so 0 vertices; the graph needs at least one"
                }
            }));
        }
        if n > u32::MAX as usize {
            return Err(invalid(format!(
                "features: {n} rows do not fit u32 vertex ids"
            )));
        }
        // 2. Features (their values were checked by `features`).
        if features.num_rows() != n {
            return Err(invalid(format!(
                "features: {} rows for {n} vertices",
                features.num_rows()
            )));
        }
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
                    return Err(invalid(format!(
                        "edge_index[{row}, {j}] = {v} is not below the vertex count {n}"
                    )));
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
        if labels.len() != n {
            return Err(invalid(format!(
                "labels: {} entries for {n} vertices",
                labels.len()
            )));
        }
        let num_classes = match self.num_classes {
            Some(0) => return Err(invalid("num_classes: 0; there must be at least one class")),
            Some(c) => c,
            None => labels.iter().max().map_or(1, |&m| m + 1),
        };
        if let Some(i) = labels.par_iter().position_first(|&l| l >= num_classes) {
            return Err(invalid(format!(
                "labels[{i}] = {} is not below num_classes {num_classes}",
                labels[i]
            )));
        }

        // 4. Masks.
        let masks = match self.masks {
            Masks::Given(masks) => {
                check_masks(&masks, n)?;
                masks
            }
            Masks::Split(spec) => draw_split(&spec, &labels, num_classes, self.seed)?,
        };

        // 5. The importers' last step.
        Dataset::from_parts(self.name, graph, features, labels, num_classes, masks)
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

/// An [`Error::InvalidDataset`] saying `what`.
fn invalid(what: impl Into<String>) -> Error {
    Error::InvalidDataset { what: what.into() }
}

/// The values of `a` as `T`, each in `0..limit`; the first that is not is an
/// error `{name(i)} = {value} is negative` or `{name(i)} = {value} {beyond}`.
/// (Contiguous arrays are scanned in parallel.)
fn checked<A: ArrayInt, T: TryFrom<i128> + Send>(
    a: ArrayView1<A>,
    limit: i128,
    name: impl Fn(usize) -> String,
    beyond: &str,
) -> Result<Vec<T>> {
    let ok = |x: &A| (0..limit).contains(&x.widen());
    let bad = match a.as_slice() {
        Some(s) => s.par_iter().position_first(|x| !ok(x)),
        None => a.iter().position(|x| !ok(x)),
    };
    if let Some(i) = bad {
        let v = a[i].widen();
        let why = if v < 0 { "is negative" } else { beyond };
        return Err(invalid(format!("{} = {v} {why}", name(i))));
    }
    // In range, so the conversion cannot fail.
    let narrow = |x: &A| T::try_from(x.widen()).unwrap_or_else(|_| unreachable!("checked"));
    Ok(match a.as_slice() {
        Some(s) => s.par_iter().map(narrow).collect(),
        None => a.iter().map(narrow).collect(),
    })
}

/// A checked CSR (step 1 of the module doc); errors name `indptr` or `indices`.
fn csr_graph<P: ArrayInt, I: ArrayInt>(
    indptr: ArrayView1<P>,
    indices: ArrayView1<I>,
) -> Result<CsrGraph> {
    if indptr.is_empty() {
        return Err(invalid("indptr: empty; it needs num_vertices + 1 entries"));
    }
    let n = indptr.len() - 1;
    if n > u32::MAX as usize {
        return Err(invalid(format!(
            "indptr: {n} vertices do not fit u32 vertex ids"
        )));
    }
    let offsets: Vec<u64> = checked(indptr, u64::MAX as i128 + 1, |v| format!("indptr[{v}]"), "")?;
    if offsets[0] != 0 {
        return Err(invalid(format!("indptr[0] = {}, expected 0", offsets[0])));
    }
    if let Some(v) = (0..n)
        .into_par_iter()
        .find_first(|&v| offsets[v] > offsets[v + 1])
    {
        return Err(invalid(format!(
            "indptr[{}] = {} is less than indptr[{v}] = {}; offsets must not decrease",
            v + 1,
            offsets[v + 1],
            offsets[v]
        )));
    }
    if offsets[n] != indices.len() as u64 {
        return Err(invalid(format!(
            "indptr[{n}] = {}, expected the number of indices {}",
            offsets[n],
            indices.len()
        )));
    }
    let beyond = format!("is not below the vertex count {n}");
    let ids: Vec<u32> = checked(indices, n as i128, |k| format!("indices[{k}]"), &beyond)?;
    CsrGraph::new(offsets.into(), ids.into()).map_err(|e| Error::cpu_ops("csr", e))
}

/// `x` copied row-major, checked: at least one column, every value finite.
fn feature_matrix(x: ArrayView2<f32>) -> Result<FeatureMatrix> {
    let (rows, dim) = x.dim();
    if dim == 0 {
        return Err(invalid(format!(
            "features: shape ({rows}, 0); every vertex needs at least one feature"
        )));
    }
    let data: Vec<f32> = match x.as_slice() {
        Some(s) => s.to_vec(),
        None => x.iter().copied().collect(),
    };
    if let Some(i) = data.par_iter().position_first(|v| !v.is_finite()) {
        return Err(invalid(format!(
            "features[{}, {}] = {} is not a finite number",
            i / dim,
            i % dim,
            data[i]
        )));
    }
    FeatureMatrix::new(data.into(), rows, dim).map_err(|e| Error::cpu_ops("features", e))
}

/// Step 4 for given masks: `n` entries each, no vertex in two parts.
fn check_masks(masks: &[Vec<u8>; 3], n: usize) -> Result<()> {
    const NAMES: [&str; 3] = ["train_mask", "val_mask", "test_mask"];
    for (name, m) in NAMES.iter().zip(masks) {
        if m.len() != n {
            return Err(invalid(format!(
                "{name}: {} entries for {n} vertices",
                m.len()
            )));
        }
    }
    let [a, b, c] = masks;
    if let Some(v) = (0..n)
        .into_par_iter()
        .find_first(|&v| a[v] + b[v] + c[v] > 1)
    {
        let both: Vec<&str> = NAMES
            .iter()
            .zip(masks)
            .filter(|(_, m)| m[v] == 1)
            .map(|(name, _)| *name)
            .collect();
        return Err(invalid(format!(
            "{}: vertex {v} is in both; the parts must be disjoint",
            both[..2].join(" and ")
        )));
    }
    Ok(())
}
