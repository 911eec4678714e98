//! `tandem.NeighborLoader`: `runtime::loader::NeighborLoader` with Python's
//! arguments and iteration. Batches come out as numpy arrays over the
//! buffers the loader's worker filled (no copy; `x`'s buffer goes back to the
//! loader when numpy frees it); waiting for the next batch releases the GIL. `to_pyg` / `to_dgl_blocks` are in `tandem/_loader.py`.

use std::sync::Arc;

use numpy::ndarray::{Array2, ArrayView2};
use numpy::{IntoPyArray, PyArray2, PyArrayDescrMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyList;
use runtime::loader::{
    Batch as RtBatch, CudaBackend, DeviceLoader, DeviceMiniBatch, Epoch, FeatureDtype, Features,
    HostBackend, LoaderDevice, LoaderOptions, RowBuffers,
};

use crate::arrays::{array, ids, mask, Want};
use crate::dataset::Dataset;
use crate::device_batch::DeviceBatch;
use crate::errors::{to_py, IntoPy};

fn bad(name: &str, reason: impl Into<String>) -> PyErr {
    to_py(runtime::Error::invalid_argument(name, reason))
}

/// Fanouts from Python ints: `-1` takes every neighbor (PyG's spelling).
fn fanout_list(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<u32>> {
    let given: Vec<i64> = obj
        .extract()
        .map_err(|_| bad(name, "expected a list of ints, e.g. [15, 10, 5]"))?;
    given
        .iter()
        .enumerate()
        .map(|(i, &f)| match f {
            -1 => Ok(cpu_ops::ALL_NEIGHBORS),
            f if f >= 0 && f < i64::from(u32::MAX) => Ok(f as u32),
            f => Err(bad(
                name,
                format!("{name}[{i}] = {f}: expected a count >= 1, or -1 for every neighbor"),
            )),
        })
        .collect()
}

/// Where the loader's batches are built and live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    /// The host loader: numpy batches (`"auto"`, `"host"`, `"cpu"`).
    Host(LoaderDevice),
    /// The device loader on CUDA device `n`: `DeviceBatch`es.
    Cuda(usize),
    /// The device loader on the host backend (`"host-backend"`): the device
    /// path's `DeviceBatch`es in host memory, for a loop written for device
    /// batches on a machine without a GPU.
    HostBackend,
}

/// `"auto"`, `"host"` / `"cpu"`, `"cuda"` / `"cuda:N"`, `"host-backend"` (or
/// anything whose `str()` is one: a `torch.device`).
fn device(obj: &Bound<'_, PyAny>) -> PyResult<Where> {
    let s = obj.str()?.to_string();
    match s.as_str() {
        "auto" => Ok(Where::Host(LoaderDevice::Auto)),
        "host" | "cpu" => Ok(Where::Host(LoaderDevice::Host)),
        "cuda" | "gpu" => Ok(Where::Cuda(0)),
        "host-backend" => Ok(Where::HostBackend),
        other => other
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Where::Cuda)
            .ok_or_else(|| {
                bad(
                    "device",
                    format!(
                        "{other:?}: expected \"auto\", \"host\", \"cpu\", \"cuda\", \"cuda:N\" \
                         or \"host-backend\""
                    ),
                )
            }),
    }
}

/// The loader behind a `NeighborLoader`.
enum Inner {
    Host(runtime::loader::NeighborLoader),
    HostBackend(DeviceLoader<HostBackend>),
    Cuda(DeviceLoader<CudaBackend>),
}

/// `$e` with `$l` bound to whichever loader `$inner` holds.
macro_rules! each {
    ($inner:expr, $l:ident => $e:expr) => {
        match $inner {
            Inner::Host($l) => $e,
            Inner::HostBackend($l) => $e,
            Inner::Cuda($l) => $e,
        }
    };
}

/// One epoch of whichever loader.
enum AnyEpoch {
    Host(Epoch),
    HostBackend(Epoch<DeviceMiniBatch<HostBackend>>, Arc<HostBackend>),
    Cuda(Epoch<DeviceMiniBatch<CudaBackend>>, Arc<CudaBackend>),
}

/// A batch of whichever loader, before it becomes a Python object.
enum AnyBatch {
    Host(RtBatch),
    HostBackend(DeviceMiniBatch<HostBackend>, Arc<HostBackend>),
    Cuda(DeviceMiniBatch<CudaBackend>, Arc<CudaBackend>),
}

impl AnyEpoch {
    fn next_batch(&mut self) -> Option<runtime::Result<AnyBatch>> {
        Some(match self {
            AnyEpoch::Host(e) => e.next_batch()?.map(AnyBatch::Host),
            AnyEpoch::HostBackend(e, d) => e
                .next_batch()?
                .map(|b| AnyBatch::HostBackend(b, Arc::clone(d))),
            AnyEpoch::Cuda(e, d) => e.next_batch()?.map(|b| AnyBatch::Cuda(b, Arc::clone(d))),
        })
    }

    fn remaining(&self) -> usize {
        match self {
            AnyEpoch::Host(e) => e.remaining(),
            AnyEpoch::HostBackend(e, _) => e.remaining(),
            AnyEpoch::Cuda(e, _) => e.remaining(),
        }
    }
}

/// `"auto"` or a byte count.
fn cache_bytes(obj: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    if let Ok(s) = obj.extract::<String>() {
        if s == "auto" {
            return Ok(None);
        }
    }
    obj.extract::<u64>().map(Some).map_err(|_| {
        bad(
            "feature_cache_bytes",
            "expected \"auto\" or a byte count >= 0",
        )
    })
}

fn dtype(s: &str) -> PyResult<FeatureDtype> {
    match s {
        "f32" | "float32" => Ok(FeatureDtype::F32),
        "bf16" | "bfloat16" => Ok(FeatureDtype::Bf16),
        other => Err(bad(
            "feature_dtype",
            format!("{other:?}: expected \"f32\" or \"bf16\""),
        )),
    }
}

/// Seeds: vertex ids, or a boolean mask of every vertex.
fn seed_ids(obj: &Bound<'_, PyAny>, n: usize) -> PyResult<Vec<u32>> {
    let mut notes = Vec::new();
    let a = array(obj, "seeds", Want::IntOrBool, &mut notes)?;
    if a.dtype().kind() == b'b' {
        if a.len() != n {
            return Err(bad(
                "seeds",
                format!("a mask of {} entries; the graph has {n} vertices", a.len()),
            ));
        }
        let m = mask(a.as_any(), "seeds", n)?;
        return Ok(runtime::Dataset::ids_where(&m));
    }
    ids(a.as_any(), "seeds")
}

/// Mini-batches of sampled neighborhoods for a model of your own (PyG's
/// `NeighborLoader`, fed by Tandem's sampler and gather).
///
/// `fanouts` are neighbors per hop counted from the input layer (Tandem's and
/// DGL's order: `[15, 10, 5]` draws 5 for each seed, 10 for each vertex they
/// reach, 15 for each vertex those reach); `num_neighbors=` takes PyG's order
/// (the seeds' hop first) instead; `-1` takes every neighbor. `seeds` are
/// vertex ids or a boolean mask (default: the training vertices). Each
/// iteration is one epoch, sampled on the loader's own threads (`threads`, 0:
/// one per core) at most `prefetch` batches ahead; the batches depend only on
/// the seeds and `seed` (and the epoch's number). Breaking out of the loop
/// stops the workers. Bad arguments raise `ArgumentError` (or `DeviceError`)
/// before any work starts.
#[pyclass(module = "tandem", name = "NeighborLoader", frozen)]
pub(crate) struct NeighborLoader {
    inner: Inner,
}

#[pymethods]
impl NeighborLoader {
    #[new]
    #[pyo3(signature = (dataset, fanouts=None, batch_size=None, seeds=None, shuffle=true,
        device=None, feature_cache_bytes=None, feature_dtype="f32", prefetch=2, seed=0,
        *, num_neighbors=None, threads=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        dataset: PyRef<'_, Dataset>,
        fanouts: Option<&Bound<'_, PyAny>>,
        batch_size: Option<usize>,
        seeds: Option<&Bound<'_, PyAny>>,
        shuffle: bool,
        device: Option<Bound<'_, PyAny>>,
        feature_cache_bytes: Option<&Bound<'_, PyAny>>,
        feature_dtype: &str,
        prefetch: usize,
        seed: u64,
        num_neighbors: Option<&Bound<'_, PyAny>>,
        threads: usize,
    ) -> PyResult<Self> {
        let fanouts = match (fanouts, num_neighbors) {
            (Some(f), None) => fanout_list(f, "fanouts")?,
            (None, Some(n)) => {
                let mut f = fanout_list(n, "num_neighbors")?;
                f.reverse();
                f
            }
            (None, None) => return Err(bad("fanouts", "required (or num_neighbors=)")),
            (Some(_), Some(_)) => {
                return Err(bad(
                    "fanouts",
                    "give fanouts (input layer first) or num_neighbors (seeds first), not both",
                ))
            }
        };
        let batch_size = batch_size.ok_or_else(|| bad("batch_size", "required"))?;
        let ds = std::sync::Arc::clone(&dataset.inner);
        let seeds = seeds.map(|s| seed_ids(s, ds.num_vertices())).transpose()?;
        let device = match device {
            Some(d) => self::device(&d)?,
            None => Where::Host(LoaderDevice::Auto),
        };
        let feature_cache_bytes = match feature_cache_bytes {
            Some(c) => cache_bytes(c)?,
            None => None,
        };
        let feature_dtype = dtype(feature_dtype)?;
        let opts = LoaderOptions {
            seeds,
            shuffle,
            device: match device {
                Where::Host(d) => d,
                Where::Cuda(n) => LoaderDevice::Cuda(n),
                Where::HostBackend => LoaderDevice::Host,
            },
            feature_cache_bytes,
            feature_dtype,
            prefetch,
            seed,
            threads,
            edge_index: true,
            ..LoaderOptions::new(fanouts, batch_size)
        };
        if !matches!(device, Where::Host(_)) && ds.num_vertices() > i32::MAX as usize {
            return Err(bad(
                "device",
                format!(
                    "the device loader hands ids out as int32; the graph has {} vertices",
                    ds.num_vertices()
                ),
            ));
        }
        let inner = py
            .detach(move || match device {
                Where::Host(_) => runtime::loader::NeighborLoader::new(ds, opts).map(Inner::Host),
                Where::HostBackend => {
                    DeviceLoader::new(HostBackend::new(), ds, opts).map(Inner::HostBackend)
                }
                Where::Cuda(n) => CudaBackend::new(n)
                    .map_err(|source| {
                        runtime::Error::device(format!("device = \"cuda:{n}\""), source)
                    })
                    .and_then(|dev| DeviceLoader::new(dev, ds, opts))
                    .map(Inner::Cuda),
            })
            .py_err()?;
        Ok(Self { inner })
    }

    /// The next epoch's batches (epochs count from 0).
    fn __iter__(&self) -> LoaderIter {
        self.iter(match &self.inner {
            Inner::Host(l) => AnyEpoch::Host(l.epoch()),
            Inner::HostBackend(l) => AnyEpoch::HostBackend(l.epoch(), l.device_handle()),
            Inner::Cuda(l) => AnyEpoch::Cuda(l.epoch(), l.device_handle()),
        })
    }

    /// Epoch `epoch`'s batches, without moving the epoch counter.
    fn epoch(&self, epoch: usize) -> LoaderIter {
        self.iter(match &self.inner {
            Inner::Host(l) => AnyEpoch::Host(l.epoch_at(epoch)),
            Inner::HostBackend(l) => AnyEpoch::HostBackend(l.epoch_at(epoch), l.device_handle()),
            Inner::Cuda(l) => AnyEpoch::Cuda(l.epoch_at(epoch), l.device_handle()),
        })
    }

    /// Batches per epoch.
    fn __len__(&self) -> usize {
        each!(&self.inner, l => l.num_batches())
    }

    /// Fanouts, input layer first.
    #[getter]
    fn fanouts(&self) -> Vec<i64> {
        each!(&self.inner, l => l.fanouts())
            .iter()
            .map(|&f| {
                if f == cpu_ops::ALL_NEIGHBORS {
                    -1
                } else {
                    i64::from(f)
                }
            })
            .collect()
    }

    /// Where the loader runs and why (one line).
    #[getter]
    fn note(&self) -> String {
        each!(&self.inner, l => l.note().to_string())
    }

    /// Batches built so far, every epoch together.
    #[getter]
    fn batches_built(&self) -> usize {
        each!(&self.inner, l => l.batches_built())
    }

    /// Batches whose feature rows went into a buffer an earlier batch's `x`
    /// gave back when numpy freed it, rather than a new allocation (host
    /// batches only).
    #[getter]
    fn rows_reused(&self) -> usize {
        match &self.inner {
            Inner::Host(l) => l.buffers().reused(),
            _ => 0,
        }
    }

    /// Worker threads running now (0 once no epoch is being iterated).
    #[getter]
    fn workers_running(&self) -> usize {
        each!(&self.inner, l => l.workers_running())
    }

    fn __repr__(&self) -> String {
        format!(
            "NeighborLoader(fanouts={:?}, seeds={}, batches={}, feature_dtype={:?}; {})",
            self.fanouts(),
            each!(&self.inner, l => l.seeds().len()),
            self.__len__(),
            each!(&self.inner, l => l.feature_dtype().name()),
            self.note()
        )
    }
}

impl NeighborLoader {
    fn iter(&self, epoch: AnyEpoch) -> LoaderIter {
        LoaderIter {
            epoch: Some(epoch),
            buffers: match &self.inner {
                Inner::Host(l) => Some(Arc::clone(l.buffers())),
                _ => None,
            },
        }
    }
}

/// One epoch of a `NeighborLoader`. `close()` (or dropping it, or breaking
/// out of a `for` loop over the loader) stops its worker. (Dropping joins the
/// worker with the GIL held: the worker never takes the GIL, and it ends
/// within the hop it is sampling.)
#[pyclass(module = "tandem", name = "LoaderIter")]
pub(crate) struct LoaderIter {
    epoch: Option<AnyEpoch>,
    /// Where a host batch's `x` goes back when numpy frees it.
    buffers: Option<Arc<RowBuffers>>,
}

#[pymethods]
impl LoaderIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(mut slf: PyRefMut<'_, Self>, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let Some(mut epoch) = slf.epoch.take() else {
            return Ok(None);
        };
        let (epoch, item) = py.detach(move || {
            let item = epoch.next_batch();
            (epoch, item)
        });
        match item {
            None => Ok(None),
            Some(Err(e)) => Err(to_py(e)),
            Some(Ok(b)) => {
                slf.epoch = Some(epoch);
                Ok(Some(match b {
                    AnyBatch::Host(b) => {
                        // Host epochs always carry their loader's buffers.
                        let buffers = slf
                            .buffers
                            .clone()
                            .unwrap_or_else(|| Arc::new(RowBuffers::new(1)));
                        Py::new(py, LoaderBatch::new(py, b, &buffers)?)?.into_any()
                    }
                    AnyBatch::HostBackend(b, d) => {
                        Py::new(py, DeviceBatch::new(py, d, b)?)?.into_any()
                    }
                    AnyBatch::Cuda(b, d) => Py::new(py, DeviceBatch::new(py, d, b)?)?.into_any(),
                }))
            }
        }
    }

    /// Batches not yet taken.
    fn __len__(&self) -> usize {
        self.epoch.as_ref().map_or(0, AnyEpoch::remaining)
    }

    /// Stops the worker now and waits for it to end.
    fn close(&mut self, py: Python<'_>) {
        if let Some(epoch) = self.epoch.take() {
            py.detach(move || drop(epoch));
        }
    }
}

/// The owner of a batch's feature rows, numpy's base object of `x`: when
/// numpy frees the array (and every tensor made from it without a copy), the
/// rows go back to the loader for a later batch (`runtime/src/loader/pool.rs`).
#[pyclass(module = "tandem", name = "_LoaderRows", frozen)]
struct Rows {
    x: Features,
    buffers: Arc<RowBuffers>,
}

impl Drop for Rows {
    fn drop(&mut self) {
        let x = std::mem::replace(&mut self.x, Features::F32(Vec::new()));
        self.buffers.give(x);
    }
}

impl Rows {
    /// `x` as a `(rows, dim)` numpy array whose base object owns it.
    fn array(
        py: Python<'_>,
        x: Features,
        shape: (usize, usize),
        buffers: &Arc<RowBuffers>,
    ) -> PyResult<Py<PyAny>> {
        let shape_err = |e: numpy::ndarray::ShapeError| bad("loader", e.to_string());
        let owner = Bound::new(
            py,
            Rows {
                x,
                buffers: Arc::clone(buffers),
            },
        )?;
        let base = owner.clone().into_any();
        let array = match &owner.get().x {
            Features::F32(v) => {
                let view = ArrayView2::from_shape(shape, v.as_slice()).map_err(shape_err)?;
                // SAFETY: the view points into `owner`'s buffer, which numpy's
                // array keeps alive as its base object; the buffer is never
                // resized or moved while `owner` lives (frozen, dropped whole).
                unsafe { PyArray2::borrow_from_array(&view, base) }.into_any()
            }
            Features::Bf16(v) => {
                let view = ArrayView2::from_shape(shape, v.as_slice()).map_err(shape_err)?;
                // SAFETY: as for the f32 rows above.
                unsafe { PyArray2::borrow_from_array(&view, base) }.into_any()
            }
        };
        Ok(array.unbind())
    }
}

/// One sampled hop: `indptr` (int64, `num_dst + 1`) and `indices` (uint32,
/// local source ids) form a CSR over the destinations `n_id[:num_dst]`;
/// rows before `first_sampled` are empty (those vertices were sampled at an
/// earlier hop).
#[pyclass(module = "tandem", name = "Hop", frozen, get_all)]
pub(crate) struct Hop {
    num_dst: usize,
    num_src: usize,
    first_sampled: usize,
    indptr: Py<PyAny>,
    indices: Py<PyAny>,
}

#[pymethods]
impl Hop {
    fn __repr__(&self) -> String {
        format!(
            "Hop(num_dst={}, num_src={}, first_sampled={})",
            self.num_dst, self.num_src, self.first_sampled
        )
    }
}

/// A mini-batch: `batch_size` seeds (the first entries of `n_id`), `n_id`
/// (int64 input vertex ids), `x` (their feature rows: float32, or uint16
/// bfloat16 bits for `feature_dtype="bf16"`), `y` (int64 seed labels),
/// `edge_index` (int64 `(2, E)`, PyG's layout), `num_sampled_nodes` /
/// `num_sampled_edges` (per hop) and `hops`. `to_pyg()` and
/// `to_dgl_blocks()` build PyG's and DGL's structures from it.
#[pyclass(module = "tandem", name = "LoaderBatch", frozen, get_all)]
pub(crate) struct LoaderBatch {
    index: usize,
    batch_size: usize,
    n_id: Py<PyAny>,
    x: Py<PyAny>,
    y: Py<PyAny>,
    edge_index: Py<PyAny>,
    num_sampled_nodes: Vec<usize>,
    num_sampled_edges: Vec<usize>,
    hops: Py<PyAny>,
    feature_dtype: &'static str,
}

impl LoaderBatch {
    fn new(py: Python<'_>, b: RtBatch, buffers: &Arc<RowBuffers>) -> PyResult<Self> {
        let num_sampled_nodes = b.num_sampled_nodes();
        let num_sampled_edges = b.num_sampled_edges();
        let rows = b.n_id.len();
        let RtBatch {
            index,
            num_seeds,
            n_id,
            hops,
            dim,
            x,
            y,
            edge_index,
        } = b;
        let shape_err = |e: numpy::ndarray::ShapeError| bad("loader", e.to_string());
        let feature_dtype = x.dtype().name();
        let x = Rows::array(py, x, (rows, dim), buffers)?;
        let [src, dst] = edge_index.unwrap_or_default();
        let e = src.len();
        let mut coo = src;
        coo.extend_from_slice(&dst);
        drop(dst);
        let edge_index = Array2::from_shape_vec((2, e), coo)
            .map_err(shape_err)?
            .into_pyarray(py)
            .into_any()
            .unbind();
        let n_id: Vec<i64> = n_id.iter().map(|&v| i64::from(v)).collect();
        let y: Vec<i64> = y.iter().map(|&v| i64::from(v)).collect();
        let hops = hops
            .into_iter()
            .map(|h| {
                let indptr: Vec<i64> = bytemuck::allocation::cast_vec(h.indptr);
                Hop {
                    num_dst: h.num_dst,
                    num_src: h.num_src,
                    first_sampled: h.first_sampled,
                    indptr: indptr.into_pyarray(py).into_any().unbind(),
                    indices: h.indices.into_pyarray(py).into_any().unbind(),
                }
            })
            .collect::<Vec<_>>();
        Ok(Self {
            index,
            batch_size: num_seeds,
            n_id: n_id.into_pyarray(py).into_any().unbind(),
            x,
            y: y.into_pyarray(py).into_any().unbind(),
            edge_index,
            num_sampled_nodes,
            num_sampled_edges,
            hops: PyList::new(py, hops)?.into_any().unbind(),
            feature_dtype,
        })
    }
}

#[pymethods]
impl LoaderBatch {
    /// A `torch_geometric.data.Data` laid out as PyG's `NeighborLoader`'s
    /// batches (`docs/python.md`).
    fn to_pyg<'py>(slf: PyRef<'py, Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("tandem._loader")?.call_method1("to_pyg", (slf,))
    }

    /// DGL blocks (one per layer, input layer first) as DGL's
    /// `NeighborSampler` yields them.
    fn to_dgl_blocks<'py>(slf: PyRef<'py, Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("tandem._loader")?
            .call_method1("to_dgl_blocks", (slf,))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let n = self
            .n_id
            .bind(py)
            .len()
            .map(|n| n.to_string())
            .unwrap_or_default();
        format!(
            "LoaderBatch(index={}, batch_size={}, nodes={n}, num_sampled_nodes={:?}, \
             num_sampled_edges={:?}, feature_dtype={:?})",
            self.index,
            self.batch_size,
            self.num_sampled_nodes,
            self.num_sampled_edges,
            self.feature_dtype
        )
    }
}
