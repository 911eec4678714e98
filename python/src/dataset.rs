//! `tandem.Dataset`: a graph with features, labels and a split, shared by
//! reference with every trainer that uses it (`Arc<runtime::Dataset>`).

use std::path::PathBuf;
use std::sync::Arc;

use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple, PyType};
use runtime::data::{
    generate_rmat, generate_sbm, import_ogb_dir_with, open_dataset, write_dataset, OgbOptions,
    RmatOptions, SbmOptions, SplitSpec, Verify,
};
use runtime::progress::NoProgress;
use runtime::DatasetBuilder;

use crate::arrays::{array, expect_ndim, mask, shared, with_int_array, Want};
use crate::errors::{dataset_invalid, to_py, IntoPy};

/// A node-classification dataset: topology (CSR, row `v` = the in-neighbors of
/// `v`), one feature row and one label per vertex, and a train / validation /
/// test split. Build one with `from_arrays`, `from_pyg`, `from_dgl`,
/// `from_ogb_dir`, `open`, `generate_sbm` or `generate_rmat`.
///
/// Arrays handed to `from_arrays` (and the tensors behind `from_pyg` /
/// `from_dgl`) are used in place where their layout allows — the dataset views
/// them and keeps them alive; do not modify them afterwards. `conversions`
/// lists every array that was converted (copied) instead.
#[pyclass(module = "tandem", name = "Dataset", frozen)]
pub(crate) struct Dataset {
    pub(crate) inner: Arc<runtime::Dataset>,
    conversions: Vec<String>,
}

impl Dataset {
    fn wrap(ds: runtime::Dataset) -> Self {
        Self::shared(Arc::new(ds))
    }

    /// A Python handle on a dataset shared with a trainer.
    pub(crate) fn shared(ds: Arc<runtime::Dataset>) -> Self {
        Self {
            inner: ds,
            conversions: Vec::new(),
        }
    }
}

/// `"0.6,0.2,rest"` as a split (errors name the argument).
fn split_spec(split: Option<&str>) -> PyResult<SplitSpec> {
    match split {
        None => Ok(SplitSpec::default()),
        Some(s) => s
            .parse::<SplitSpec>()
            .map_err(|e| to_py(runtime::Error::invalid_argument("split", e.to_string()))),
    }
}

#[pymethods]
impl Dataset {
    /// A dataset from arrays (NumPy arrays, or anything `numpy.asarray` takes).
    ///
    /// - topology: `edge_index` — a `(2, E)` array or a `(src, dst)` pair, PyG's
    ///   convention (messages flow `src → dst`) — or `csr=(indptr, indices)`
    ///   (row `v` holds the in-neighbors of `v`); `symmetrize=True` stores every
    ///   edge both ways and drops repeats and self-loops;
    /// - `features`: `(n, d)`; `labels`: `(n,)` class ids (`num_classes`
    ///   defaults to the largest + 1);
    /// - `train`, `val`, `test`: boolean masks of `n` entries or arrays of
    ///   vertex ids; without any, `split` (`"0.6,0.2,rest"` by default; parts are
    ///   `N/class`, a fraction or `rest`) is drawn with `seed`;
    /// - link prediction (`model.task = "link"`): `edge_split` is either a dict
    ///   `{"train": e, "val": e, "test": e}` of positives (each a `(2, P)` array
    ///   or a `(src, dst)` pair; the graph must hold every training edge and no
    ///   validation or test edge; without `edge_index`/`csr` the training edges
    ///   are the graph), or three fractions `(0.85, 0.05, 0.1)` of the graph's
    ///   edges held out with `seed` (held-out edges leave the graph; the draw
    ///   `tandem import edgelist --edge-split` makes). `edge_negatives`
    ///   (`{"val": (P, k), "test": (P, k)}` destination ids, row `i` for
    ///   positive `i`) fixes the evaluation negatives, as OGB's link datasets do.
    ///
    /// C-contiguous `float32` features, integer ids and labels and `bool` masks
    /// are used in place; other numeric dtypes are converted once (see
    /// `conversions`); a non-contiguous array is a `DatasetError` (pass
    /// `numpy.ascontiguousarray(x)`, a copy). Every count and id is checked:
    /// errors are `DatasetError`s naming the array and element.
    #[classmethod]
    #[pyo3(signature = (num_vertices=None, *, features, labels, edge_index=None, csr=None,
        train=None, val=None, test=None, num_classes=None, symmetrize=false, split=None,
        seed=0, name="arrays", edge_split=None, edge_negatives=None))]
    #[allow(clippy::too_many_arguments)]
    fn from_arrays(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        num_vertices: Option<usize>,
        features: &Bound<'_, PyAny>,
        labels: &Bound<'_, PyAny>,
        edge_index: Option<&Bound<'_, PyAny>>,
        csr: Option<&Bound<'_, PyAny>>,
        train: Option<&Bound<'_, PyAny>>,
        val: Option<&Bound<'_, PyAny>>,
        test: Option<&Bound<'_, PyAny>>,
        num_classes: Option<u32>,
        symmetrize: bool,
        split: Option<&str>,
        seed: u64,
        name: &str,
        edge_split: Option<&Bound<'_, PyAny>>,
        edge_negatives: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut notes = Vec::new();
        let mut b = DatasetBuilder::new(name).symmetrize(symmetrize).seed(seed);
        if let Some(n) = num_vertices {
            b = b.num_vertices(n);
        }
        if let Some(c) = num_classes {
            b = b.num_classes(c);
        }

        // Features, in place when float32 and C-contiguous.
        let x = array(features, "features", Want::Float32, &mut notes)?;
        expect_ndim(&x, "features", 2, "(n, d): one row a vertex")?;
        let (rows, dim) = (x.shape()[0], x.shape()[1]);
        let x = x
            .cast::<PyArrayDyn<f32>>()
            .map_err(|_| dataset_invalid("features", "expected a float32 array"))?;
        let xs = shared(x);

        // Topology.
        b = match (edge_index, csr) {
            (Some(_), Some(_)) => {
                return Err(dataset_invalid(
                    "graph",
                    "both edge_index and csr given; pass one",
                ))
            }
            // The training edges of an edge split given as arrays are the graph.
            (None, None) if edge_split.is_some_and(|e| e.cast::<PyDict>().is_ok()) => b,
            (None, None) => {
                return Err(dataset_invalid(
                    "graph",
                    "not given: pass edge_index or csr",
                ))
            }
            (Some(ei), None) => edge_topology(b, ei, &mut notes)?,
            (None, Some(c)) => {
                let (indptr, indices): (Bound<'_, PyAny>, Bound<'_, PyAny>) = c
                    .extract()
                    .map_err(|_| dataset_invalid("csr", "expected a pair (indptr, indices)"))?;
                let p = array(&indptr, "indptr", Want::Int, &mut notes)?;
                expect_ndim(&p, "indptr", 1, "(n + 1,): offsets")?;
                let i = array(&indices, "indices", Want::Int, &mut notes)?;
                expect_ndim(&i, "indices", 1, "(nnz,): neighbor ids")?;
                with_int_array!(&p, pa => {
                    let pa = shared(pa);
                    with_int_array!(&i, ia => b.csr_shared(pa, shared(ia)),
                        else return Err(dataset_invalid("indices", "expected an integer array")))
                }, else return Err(dataset_invalid("indptr", "expected an integer array")))
            }
        };
        b = b.features_shared(xs, rows, dim);

        // Labels: OGB and PyG keep them as (n, 1) sometimes.
        let y = array(labels, "labels", Want::Int, &mut notes)?;
        let y = if y.ndim() == 2 && y.shape()[1] == 1 {
            y.call_method1("reshape", (-1,))?
                .cast_into::<numpy::PyUntypedArray>()
                .map_err(|_| dataset_invalid("labels", "reshape failed"))?
        } else {
            y
        };
        expect_ndim(&y, "labels", 1, "(n,): one class id a vertex")?;
        b = with_int_array!(&y, l => b.labels_shared(shared(l)),
            else return Err(dataset_invalid("labels", "expected an integer array")));

        // Split.
        if train.is_none() && val.is_none() && test.is_none() {
            b = b.split(split_spec(split)?);
        } else {
            let n = num_vertices.unwrap_or(rows);
            let part = |m: Option<&Bound<'_, PyAny>>, field: &str| match m {
                Some(m) => mask(m, field, n),
                None => Ok(cpu_ops::HostArray::from_vec(vec![0u8; n])),
            };
            b = b.masks_shared(
                part(train, "train")?,
                part(val, "val")?,
                part(test, "test")?,
            );
        }
        b = link_split(b, edge_split, edge_negatives, seed)?;
        notes.extend(b.copies().iter().map(|c| format!("{c} (copied)")));
        let ds = py.detach(move || b.build()).py_err()?;
        Ok(Self {
            inner: Arc::new(ds),
            conversions: notes,
        })
    }

    /// A dataset from a PyTorch Geometric `Data` object (duck-typed: anything
    /// with `x`, `y`, `edge_index` and optionally `train_mask` / `val_mask` /
    /// `test_mask` and `num_nodes`). `split_idx` is OGB's dict of id tensors
    /// (`{"train": ..., "valid": ..., "test": ...}`, from
    /// `get_idx_split()`); without it the masks are used, or the default split.
    /// Tensors cross through DLPack or `.numpy()` without a copy where the
    /// layout allows (CPU, contiguous). Imports neither torch nor PyG.
    #[classmethod]
    #[pyo3(signature = (data, split_idx=None))]
    fn from_pyg(
        cls: &Bound<'_, PyType>,
        data: &Bound<'_, PyAny>,
        split_idx: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let interop = cls.py().import("tandem._interop")?;
        let kwargs = interop.call_method1("pyg_arrays", (data, split_idx))?;
        let kwargs = kwargs.cast_into::<PyDict>()?;
        Ok(cls.call_method("from_arrays", (), Some(&kwargs))?.unbind())
    }

    /// A dataset from a DGL graph (duck-typed: `edges()`, `num_nodes()` and
    /// `ndata`): features, labels and masks from the `ndata` keys named (masks
    /// may be missing: then the default split). Imports neither torch nor DGL.
    #[classmethod]
    #[pyo3(signature = (graph, features="feat", labels="label", train="train_mask",
        val="val_mask", test="test_mask"))]
    fn from_dgl(
        cls: &Bound<'_, PyType>,
        graph: &Bound<'_, PyAny>,
        features: &str,
        labels: &str,
        train: &str,
        val: &str,
        test: &str,
    ) -> PyResult<Py<PyAny>> {
        let interop = cls.py().import("tandem._interop")?;
        let kwargs =
            interop.call_method1("dgl_arrays", (graph, features, labels, train, val, test))?;
        let kwargs = kwargs.cast_into::<PyDict>()?;
        Ok(cls.call_method("from_arrays", (), Some(&kwargs))?.unbind())
    }

    /// Reads an OGB node-property dataset as the `ogb` package leaves it after
    /// download (`raw/*.csv.gz`, `split/<scheme>/`), streamed; the same code as
    /// `tandem import ogb DIR`. Edges are stored both ways unless `directed`;
    /// `split` picks the scheme when there are several.
    #[staticmethod]
    #[pyo3(signature = (path, directed=false, split=None))]
    fn from_ogb_dir(
        py: Python<'_>,
        path: PathBuf,
        directed: bool,
        split: Option<String>,
    ) -> PyResult<Self> {
        let opts = OgbOptions { directed, split };
        let ds = py
            .detach(|| import_ogb_dir_with(&path, &opts, &NoProgress))
            .py_err()?;
        Ok(Self::wrap(ds))
    }

    /// Opens a `.tds` store (memory-mapped: nothing is read up front). With
    /// `verify=True` every checksum is checked, the features' too.
    #[staticmethod]
    #[pyo3(signature = (path, verify=false))]
    fn open(py: Python<'_>, path: PathBuf, verify: bool) -> PyResult<Self> {
        let v = if verify {
            Verify::Full
        } else {
            Verify::Default
        };
        let ds = py.detach(|| open_dataset(&path, v)).py_err()?;
        Ok(Self::wrap(ds))
    }

    /// Writes the dataset as a `.tds` store (under a temporary name, then
    /// renamed: a failure leaves nothing half-written).
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let ds = Arc::clone(&self.inner);
        py.detach(move || write_dataset(&path, &ds)).py_err()
    }

    /// A stochastic block model (blocks are classes; `homophily` of the edges
    /// stay inside a block), deterministic for a seed — `tandem generate sbm`.
    #[staticmethod]
    #[pyo3(signature = (vertices=100_000, edges=1_000_000, classes=16, dim=100,
        homophily=0.8, signal=0.5, split=None, seed=0))]
    #[allow(clippy::too_many_arguments)]
    fn generate_sbm(
        py: Python<'_>,
        vertices: usize,
        edges: usize,
        classes: u32,
        dim: usize,
        homophily: f64,
        signal: f32,
        split: Option<&str>,
        seed: u64,
    ) -> PyResult<Self> {
        let opts = SbmOptions {
            num_vertices: vertices,
            num_edges: edges,
            num_classes: classes,
            homophily,
            feature_dim: dim,
            signal,
            split: split_spec(split)?,
            seed,
            ..SbmOptions::default()
        };
        let ds = py.detach(|| generate_sbm(&opts)).py_err()?;
        Ok(Self::wrap(ds))
    }

    /// A power-law R-MAT graph with class-correlated features, deterministic
    /// for a seed — `tandem generate rmat`.
    #[staticmethod]
    #[pyo3(signature = (vertices=100_000, edges=1_000_000, classes=16, dim=100,
        a=0.57, b=0.19, c=0.19, signal=0.5, split=None, seed=0))]
    #[allow(clippy::too_many_arguments)]
    fn generate_rmat(
        py: Python<'_>,
        vertices: usize,
        edges: usize,
        classes: u32,
        dim: usize,
        a: f64,
        b: f64,
        c: f64,
        signal: f32,
        split: Option<&str>,
        seed: u64,
    ) -> PyResult<Self> {
        let opts = RmatOptions {
            num_vertices: vertices,
            num_edges: edges,
            a,
            b,
            c,
            num_classes: classes,
            feature_dim: dim,
            signal,
            split: split_spec(split)?,
            seed,
            ..RmatOptions::default()
        };
        let ds = py.detach(|| generate_rmat(&opts)).py_err()?;
        Ok(Self::wrap(ds))
    }

    /// The dataset's name.
    #[getter]
    fn name(&self) -> String {
        self.inner.name.clone()
    }

    /// Number of vertices.
    #[getter]
    fn num_vertices(&self) -> usize {
        self.inner.num_vertices()
    }

    /// Number of stored (directed) edges: an undirected edge counts twice.
    #[getter]
    fn num_edges(&self) -> usize {
        self.inner.graph.num_edges()
    }

    /// The link-prediction split, or `None`: a dict of `(2, P)` int64 arrays
    /// `"train"`, `"val"`, `"test"` (row 0 sources, row 1 destinations), with
    /// `"val_neg"` / `"test_neg"` `(P, k)` arrays when the store fixes the
    /// evaluation negatives. Copies (small beside the features).
    #[getter]
    fn edge_split<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(e) = &self.inner.edges else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        for (key, part) in [("train", &e.train), ("val", &e.val), ("test", &e.test)] {
            let mut a = ndarray::Array2::<i64>::zeros((2, part.len()));
            for (i, (s, t)) in part.iter().enumerate() {
                a[[0, i]] = i64::from(s);
                a[[1, i]] = i64::from(t);
            }
            d.set_item(key, a.into_pyarray(py))?;
        }
        for (key, neg, pos) in [
            ("val_neg", &e.val_neg, e.val.len()),
            ("test_neg", &e.test_neg, e.test.len()),
        ] {
            if let Some(neg) = neg {
                let flat: Vec<i64> = neg.as_slice().iter().map(|&v| i64::from(v)).collect();
                let k = flat.len() / pos.max(1);
                let a = ndarray::Array2::from_shape_vec((pos, k), flat)
                    .map_err(|e| to_py(runtime::Error::invalid_argument(key, e.to_string())))?;
                d.set_item(key, a.into_pyarray(py))?;
            }
        }
        Ok(Some(d))
    }

    /// Feature columns.
    #[getter]
    fn num_features(&self) -> usize {
        self.inner.features.dim()
    }

    /// Number of classes.
    #[getter]
    fn num_classes(&self) -> u32 {
        self.inner.num_classes
    }

    /// Training vertex ids (int64).
    #[getter]
    fn train_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        ids_array(py, &self.inner.train_mask)
    }

    /// Validation vertex ids (int64).
    #[getter]
    fn val_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        ids_array(py, &self.inner.val_mask)
    }

    /// Test vertex ids (int64).
    #[getter]
    fn test_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        ids_array(py, &self.inner.test_mask)
    }

    /// Sizes of the train, validation and test parts.
    #[getter]
    fn split_sizes(&self) -> (usize, usize, usize) {
        let count = |m: &[u8]| m.iter().filter(|&&b| b != 0).count();
        (
            count(&self.inner.train_mask),
            count(&self.inner.val_mask),
            count(&self.inner.test_mask),
        )
    }

    /// The feature matrix, `(n, d)` float32, read-only: a view of the
    /// dataset's own memory (the array given to `from_arrays`, or the store's
    /// mapped pages), not a copy.
    #[getter]
    fn features<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let ds = &slf.get().inner;
        let view = ndarray::ArrayView2::from_shape(
            (ds.num_vertices(), ds.features.dim()),
            ds.features.as_slice(),
        )
        .map_err(|e| dataset_invalid("features", e.to_string()))?;
        // SAFETY: the view's memory belongs to the dataset, which `slf` (the
        // array's base object) keeps alive; the array is made read-only below.
        let arr = unsafe { PyArray2::borrow_from_array(&view, slf.clone().into_any()) };
        arr.call_method(
            "setflags",
            (),
            Some(&[("write", false)].into_py_dict(slf.py())?),
        )?;
        Ok(arr.into_any())
    }

    /// The labels, `(n,)` uint32 (a copy).
    #[getter]
    fn labels<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        self.inner.labels.to_vec().into_pyarray(py)
    }

    /// The arrays that were converted (copied) instead of used in place, and how
    /// (`"features: float64 → float32 (copied)"`); empty when everything was shared.
    #[getter]
    fn conversions(&self) -> Vec<String> {
        self.conversions.clone()
    }

    /// One paragraph: sizes, classes, split (`tandem info`'s first line).
    fn summary(&self) -> String {
        self.inner.summary()
    }

    fn __repr__(&self) -> String {
        let d = &self.inner;
        format!(
            "Dataset(name={:?}, num_vertices={}, num_edges={}, num_features={}, num_classes={})",
            d.name,
            d.num_vertices(),
            d.graph.num_edges(),
            d.features.dim(),
            d.num_classes
        )
    }
}

use pyo3::types::IntoPyDict;

/// The ids where `mask` is set, as an int64 array.
fn ids_array<'py>(py: Python<'py>, mask: &[u8]) -> Bound<'py, PyArray1<i64>> {
    let ids: Vec<i64> = mask
        .iter()
        .enumerate()
        .filter(|(_, &m)| m != 0)
        .map(|(v, _)| v as i64)
        .collect();
    ids.into_pyarray(py)
}

/// `edge_index` as a `(2, E)` array or a `(src, dst)` pair.
fn edge_topology(
    b: DatasetBuilder,
    ei: &Bound<'_, PyAny>,
    notes: &mut Vec<String>,
) -> PyResult<DatasetBuilder> {
    if let Ok(pair) = ei.cast::<PyTuple>() {
        let (src, dst): (Bound<'_, PyAny>, Bound<'_, PyAny>) = pair.extract().map_err(|_| {
            dataset_invalid("edge_index", "expected a (2, E) array or a pair (src, dst)")
        })?;
        let s = array(&src, "edge_index", Want::Int, notes)?;
        expect_ndim(&s, "edge_index", 1, "(E,) sources and (E,) targets")?;
        let d = array(&dst, "edge_index", Want::Int, notes)?;
        expect_ndim(&d, "edge_index", 1, "(E,) sources and (E,) targets")?;
        // One integer type for both rows: the narrower converts.
        let d = if d.dtype().is_equiv_to(&s.dtype()) {
            d
        } else {
            d.call_method1("astype", (s.dtype(),))?
                .cast_into::<numpy::PyUntypedArray>()
                .map_err(|_| dataset_invalid("edge_index", "astype failed"))?
        };
        return with_int_array!(&s, sa => {
            let sv = sa.readonly();
            let dv = d.cast::<PyArrayDyn<_>>().map_err(|_| dataset_invalid("edge_index", "row 1's dtype"))?.readonly();
            let (sv, dv) = (sv.as_array(), dv.as_array());
            let sv = sv.into_dimensionality::<ndarray::Ix1>().map_err(|e| dataset_invalid("edge_index", e.to_string()))?;
            let dv = dv.into_dimensionality::<ndarray::Ix1>().map_err(|e| dataset_invalid("edge_index", e.to_string()))?;
            Ok(b.edge_lists(sv, dv))
        }, else Err(dataset_invalid("edge_index", "expected an integer array")));
    }
    let a = array(ei, "edge_index", Want::Int, notes)?;
    expect_ndim(
        &a,
        "edge_index",
        2,
        "(2, E): row 0 = sources, row 1 = targets",
    )?;
    with_int_array!(&a, t => {
        let v = t.readonly();
        let v = v.as_array().into_dimensionality::<ndarray::Ix2>().map_err(|e| dataset_invalid("edge_index", e.to_string()))?;
        Ok(b.edge_index(v))
    }, else Err(dataset_invalid("edge_index", "expected an integer array")))
}

/// `numpy.asarray(obj)` of integer vertex ids as an owned int64 array (a copy:
/// edge splits are small beside features; ids are checked by the builder,
/// negative ones included).
fn ids_i64(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<ndarray::ArrayD<i64>> {
    let np = obj.py().import("numpy")?;
    let a = np.call_method1("asarray", (obj,))?;
    let kind: String = a.getattr("dtype")?.getattr("kind")?.extract()?;
    if !matches!(kind.as_str(), "i" | "u") {
        return Err(dataset_invalid(
            field,
            format!("dtype kind `{kind}`, expected integer vertex ids"),
        ));
    }
    let a = a
        .call_method1("astype", ("int64",))?
        .cast_into::<PyArrayDyn<i64>>()
        .map_err(|_| dataset_invalid(field, "expected an integer array"))?;
    let owned = a.readonly().as_array().to_owned();
    Ok(owned)
}

/// A `(2, P)` array or `(src, dst)` pair of vertex ids as two int64 arrays.
fn id_pair(
    obj: &Bound<'_, PyAny>,
    field: &str,
) -> PyResult<(ndarray::Array1<i64>, ndarray::Array1<i64>)> {
    let bad_shape = |shape: &[usize]| {
        dataset_invalid(
            field,
            format!("shape {shape:?}, expected (2, P) or a pair (src, dst)"),
        )
    };
    let row = |a: &Bound<'_, PyAny>| -> PyResult<ndarray::Array1<i64>> {
        let a = ids_i64(a, field)?;
        let shape = a.shape().to_vec();
        a.into_dimensionality::<ndarray::Ix1>()
            .map_err(|_| bad_shape(&shape))
    };
    if let Ok(pair) = obj.cast::<PyTuple>() {
        let (s, d): (Bound<'_, PyAny>, Bound<'_, PyAny>) = pair
            .extract()
            .map_err(|_| dataset_invalid(field, "expected a (2, P) array or a pair (src, dst)"))?;
        return Ok((row(&s)?, row(&d)?));
    }
    let a = ids_i64(obj, field)?;
    let shape = a.shape().to_vec();
    match a.into_dimensionality::<ndarray::Ix2>() {
        Ok(a) if a.nrows() == 2 => Ok((a.row(0).to_owned(), a.row(1).to_owned())),
        _ => Err(bad_shape(&shape)),
    }
}

/// A `(P, k)` array of negative destination ids as int64.
fn id_matrix(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<ndarray::Array2<i64>> {
    let a = ids_i64(obj, field)?;
    let shape = a.shape().to_vec();
    a.into_dimensionality::<ndarray::Ix2>().map_err(|_| {
        dataset_invalid(
            field,
            format!("shape {shape:?}, expected (P, k): k negatives a positive"),
        )
    })
}

/// `from_arrays`' `edge_split` and `edge_negatives` onto the builder.
fn link_split(
    b: DatasetBuilder,
    edge_split: Option<&Bound<'_, PyAny>>,
    edge_negatives: Option<&Bound<'_, PyAny>>,
    seed: u64,
) -> PyResult<DatasetBuilder> {
    let Some(es) = edge_split else {
        return match edge_negatives {
            Some(_) => Err(dataset_invalid(
                "edge_negatives",
                "given without edge_split: pass the positives as a dict of arrays",
            )),
            None => Ok(b),
        };
    };
    if let Ok(d) = es.cast::<PyDict>() {
        let part = |key: &str| -> PyResult<(ndarray::Array1<i64>, ndarray::Array1<i64>)> {
            let field = format!("edge_split[{key:?}]");
            match d.get_item(key)? {
                Some(v) => id_pair(&v, &field),
                None => Err(dataset_invalid(
                    "edge_split",
                    format!("no key {key:?}: expected the keys \"train\", \"val\", \"test\""),
                )),
            }
        };
        for k in d.keys() {
            let k: String = k.extract().unwrap_or_default();
            if !matches!(k.as_str(), "train" | "val" | "test") {
                return Err(dataset_invalid(
                    "edge_split",
                    format!("unknown key {k:?}: expected \"train\", \"val\", \"test\""),
                ));
            }
        }
        let (tr, va, te) = (part("train")?, part("val")?, part("test")?);
        let mut b = b.edge_split(
            (tr.0.view(), tr.1.view()),
            (va.0.view(), va.1.view()),
            (te.0.view(), te.1.view()),
        );
        if let Some(neg) = edge_negatives {
            let neg = neg.cast::<PyDict>().map_err(|_| {
                dataset_invalid(
                    "edge_negatives",
                    "expected a dict {\"val\": (P, k), \"test\": (P, k)}",
                )
            })?;
            let m = |key: &str| -> PyResult<ndarray::Array2<i64>> {
                match neg.get_item(key)? {
                    Some(v) => id_matrix(&v, &format!("edge_negatives[{key:?}]")),
                    None => Err(dataset_invalid(
                        "edge_negatives",
                        format!("no key {key:?}: expected the keys \"val\", \"test\""),
                    )),
                }
            };
            let (v, t) = (m("val")?, m("test")?);
            b = b.edge_negatives(v.view(), t.view());
        }
        return Ok(b);
    }
    if edge_negatives.is_some() {
        return Err(dataset_invalid(
            "edge_negatives",
            "fixed negatives need positives given as arrays (edge_split as a dict)",
        ));
    }
    let f: (f64, f64, f64) = es.extract().map_err(|_| {
        dataset_invalid(
            "edge_split",
            "expected a dict {\"train\": e, \"val\": e, \"test\": e} of edge arrays or three fractions (train, val, test)",
        )
    })?;
    Ok(b.split_edges([f.0, f.1, f.2], seed))
}
