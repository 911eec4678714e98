//! The device loader's batches in Python: `tandem.DeviceBatch`, whose arrays
//! (`DeviceArray`) stay where the loader left them and are read in place
//! through DLPack (`torch.from_dlpack(batch.x)`), with the stream hand-over
//! of the protocol.
//!
//! # The hand-over (`DeviceArray.__dlpack__(stream=...)`)
//! 1. The consumer names its stream (PyTorch passes its current stream; `1`
//!    and `2` are CUDA's legacy and per-thread default streams; no stream
//!    means the legacy default stream, `-1` asks for no ordering).
//! 2. That stream waits for the batch's `ready` event (recorded after the
//!    batch's last kernel on the loader's stream): the consumer's later work
//!    reads finished data, and the host never blocks.
//! 3. The buffer remembers the stream: when the last owner lets go (the batch
//!    object and every tensor made from it), the loader's stream waits for
//!    the work that stream had by then before the memory is reused
//!    (`gpu_ops/src/cuda/alloc.rs`, step 3).
//!
//! On the host backend (`device="host-backend"`) the arrays are host memory
//! (DLPack's CPU device) and nothing needs ordering.

use std::sync::{Arc, Mutex};

use dlpark::ffi::{DLDataType, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned};
use dlpark::metadata::Fixed;
use dlpark::python::{export_dlpack, CudaStreamRequest, DlpackExporter, ExportRequest};
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};
use numpy::IntoPyArray;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use runtime::loader::{Backend, DeviceMiniBatch};

use crate::errors::to_py;

/// One array of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    NId,
    X,
    Indptr(usize),
    Indices(usize),
}

/// A batch shared by its Python objects and the DLPack tensors made from
/// them; dropped (buffers released in stream order) with the last.
trait Shared: Send + Sync {
    /// DLPack's `(device_type, device_id)` of the buffers.
    fn device(&self) -> (i32, i32);
    /// The address of `which`, after handing it to `stream` (`None`: no
    /// ordering asked).
    fn hand_over(&self, which: Which, stream: Option<u64>) -> runtime::Result<u64>;
}

/// A batch and the backend its buffers live on.
struct Held<B: Backend> {
    dev: Arc<B>,
    batch: Mutex<DeviceMiniBatch<B>>,
}

impl<B: Backend> Shared for Held<B> {
    fn device(&self) -> (i32, i32) {
        self.dev.dlpack_device()
    }

    fn hand_over(&self, which: Which, stream: Option<u64>) -> runtime::Result<u64> {
        let err = |source| runtime::Error::device("loader: handing a batch over (DLPack)", source);
        let mut b = self.batch.lock().unwrap_or_else(|p| p.into_inner());
        let b = &mut *b;
        let dev = &*self.dev;
        if let Some(s) = stream {
            match which {
                Which::NId => dev.hand_over(&mut b.n_id, &b.ready, s),
                Which::X => dev.hand_over(&mut b.x, &b.ready, s),
                Which::Indptr(h) | Which::Indices(h) => {
                    dev.hand_over_block(&mut b.hops[h].block, &b.ready, s)
                }
            }
            .map_err(err)?;
        }
        Ok(match which {
            Which::NId => dev.address(&b.n_id),
            Which::X => dev.address(&b.x),
            Which::Indptr(h) => dev.block_addresses(&b.hops[h].block).0,
            Which::Indices(h) => dev.block_addresses(&b.hops[h].block).1,
        })
    }
}

/// Element types of the arrays.
#[derive(Clone, Copy, Debug)]
enum Dtype {
    F32,
    I32,
    I64,
}

impl Dtype {
    fn dl(self) -> DLDataType {
        match self {
            Dtype::F32 => DLDataType::of::<f32>(),
            Dtype::I32 => DLDataType::of::<i32>(),
            Dtype::I64 => DLDataType::of::<i64>(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::I32 => "int32",
            Dtype::I64 => "int64",
        }
    }
}

/// One array of a `DeviceBatch`, read in place through DLPack:
/// `torch.from_dlpack(a)` (or `numpy.from_dlpack(a)` for the host backend's
/// arrays). Each `__dlpack__` call hands the array to the stream the
/// consumer names (module doc); the tensor it yields keeps the batch's
/// buffers alive.
#[pyclass(module = "tandem", name = "DeviceArray", frozen)]
pub(crate) struct DeviceArray {
    batch: Arc<dyn Shared>,
    which: Which,
    shape: Vec<i64>,
    dtype: Dtype,
}

/// What `export_dlpack` needs: the array and the address its hand-over gave.
struct Export<'a> {
    array: &'a DeviceArray,
    address: std::cell::Cell<u64>,
}

impl Export<'_> {
    fn managed<M: ManagedTensorBase>(&self) -> PyResult<Managed<M>> {
        let a = self.array;
        let ctx: Box<Arc<dyn Shared>> = Box::new(Arc::clone(&a.batch));
        let meta = |e: dlpark::metadata::Error| PyValueError::new_err(e.to_string());
        let data = self.address.get() as *mut std::ffi::c_void;
        let device = self.device();
        let dtype = a.dtype.dl();
        Ok(match a.shape[..] {
            [n] => {
                let mut init = Fixed::new([n], [1])
                    .prepare_as::<M>()
                    .map_err(meta)?
                    .initialize(ctx);
                init.set_data(data).set_device(device).set_dtype(dtype);
                // SAFETY: `data` is the address of a live buffer of the batch
                // (`n` elements of `dtype`) that `ctx` keeps alive until the
                // consumer's deleter runs; the stride is explicit.
                unsafe { init.finish() }
            }
            [rows, cols] => {
                let mut init = Fixed::new([rows, cols], [cols, 1])
                    .prepare_as::<M>()
                    .map_err(meta)?
                    .initialize(ctx);
                init.set_data(data).set_device(device).set_dtype(dtype);
                // SAFETY: as above, `rows × cols` elements, row-major.
                unsafe { init.finish() }
            }
            _ => {
                return Err(PyValueError::new_err(
                    "a DeviceArray has one or two dimensions",
                ))
            }
        })
    }
}

impl DlpackExporter for Export<'_> {
    fn device(&self) -> DLDevice {
        let (device_type, device_id) = self.array.batch.device();
        DLDevice {
            device_type: DLDeviceType(device_type as u32),
            device_id,
        }
    }

    fn flags(&self) -> DlpackFlags {
        DlpackFlags::empty()
    }

    fn prepare_export(&self, _py: Python<'_>, request: &ExportRequest<'_>) -> PyResult<()> {
        let stream = if self.array.batch.device().0 == 2 {
            match request.cuda_stream()? {
                CudaStreamRequest::NoSync => None,
                CudaStreamRequest::Omitted | CudaStreamRequest::LegacyDefault => Some(1),
                CudaStreamRequest::PerThreadDefault => Some(2),
                CudaStreamRequest::Pointer(p) => Some(p as u64),
            }
        } else {
            None
        };
        let address = self
            .array
            .batch
            .hand_over(self.array.which, stream)
            .map_err(to_py)?;
        self.address.set(address);
        Ok(())
    }

    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensor>> {
        self.managed()
    }

    fn export_versioned(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        self.managed()
    }
}

#[pymethods]
impl DeviceArray {
    /// A DLPack capsule of the array, handed to `stream` (module doc).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let request = ExportRequest::parse(stream.as_ref(), max_version, dl_device, copy)?;
        let export = Export {
            array: self,
            address: std::cell::Cell::new(0),
        };
        export_dlpack(&export, py, request)
    }

    /// `(device_type, device_id)`: `(2, ordinal)` on CUDA, `(1, 0)` in host
    /// memory.
    fn __dlpack_device__(&self) -> (i32, i32) {
        self.batch.device()
    }

    /// The array's shape.
    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.shape.clone()
    }

    /// The element type's numpy name (`float32`, `int32`, `int64`).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    fn __repr__(&self) -> String {
        format!(
            "DeviceArray(shape={:?}, dtype={}, device={:?})",
            self.shape,
            self.dtype.name(),
            self.batch.device()
        )
    }
}

/// One hop of a `DeviceBatch`: `indptr` (int64, `num_dst + 1`) and
/// `indices` (int32 local source ids) form a CSR over the destinations
/// `n_id[:num_dst]`; rows before `first_sampled` are empty.
#[pyclass(module = "tandem", name = "DeviceHop", frozen, get_all)]
pub(crate) struct DeviceHop {
    num_dst: usize,
    num_src: usize,
    first_sampled: usize,
    num_edges: usize,
    indptr: Py<DeviceArray>,
    indices: Py<DeviceArray>,
}

#[pymethods]
impl DeviceHop {
    fn __repr__(&self) -> String {
        format!(
            "DeviceHop(num_dst={}, num_src={}, first_sampled={}, num_edges={})",
            self.num_dst, self.num_src, self.first_sampled, self.num_edges
        )
    }
}

/// A mini-batch left on the device: the host `LoaderBatch`'s layout with
/// `n_id` (int32), `x` (float32 rows) and each hop's CSR as `DeviceArray`s
/// (read them with `torch.from_dlpack`), `y` (int64 seed labels, numpy: the
/// seeds are known on the host) and the counts. `to_pyg()` and
/// `to_dgl_blocks()` build PyG's `Data` and DGL's blocks on the arrays' device.
#[pyclass(module = "tandem", name = "DeviceBatch", frozen, get_all)]
pub(crate) struct DeviceBatch {
    index: usize,
    batch_size: usize,
    num_nodes: usize,
    n_id: Py<DeviceArray>,
    x: Py<DeviceArray>,
    y: Py<PyAny>,
    num_sampled_nodes: Vec<usize>,
    num_sampled_edges: Vec<usize>,
    hops: Vec<Py<DeviceHop>>,
}

impl DeviceBatch {
    /// Wraps a device loader's batch.
    pub(crate) fn new<B: Backend>(
        py: Python<'_>,
        dev: Arc<B>,
        b: DeviceMiniBatch<B>,
    ) -> PyResult<Self> {
        let mut num_sampled_nodes = vec![b.num_seeds];
        num_sampled_nodes.extend(b.hops.iter().map(|h| h.num_src - h.num_dst));
        let num_sampled_edges: Vec<usize> = b.hops.iter().map(|h| h.num_edges).collect();
        let shapes: Vec<(usize, usize, usize, usize)> = b
            .hops
            .iter()
            .map(|h| (h.num_dst, h.num_src, h.first_sampled, h.num_edges))
            .collect();
        let (index, batch_size, num_nodes, dim) = (b.index, b.num_seeds, b.num_nodes, b.dim);
        let y: Vec<i64> = b.y.iter().map(|&v| i64::from(v)).collect();
        let shared: Arc<dyn Shared> = Arc::new(Held {
            dev,
            batch: Mutex::new(b),
        });
        let array = |which, shape: Vec<usize>, dtype| {
            Py::new(
                py,
                DeviceArray {
                    batch: Arc::clone(&shared),
                    which,
                    shape: shape.into_iter().map(|d| d as i64).collect(),
                    dtype,
                },
            )
        };
        let hops = shapes
            .iter()
            .enumerate()
            .map(|(h, &(num_dst, num_src, first_sampled, num_edges))| {
                Py::new(
                    py,
                    DeviceHop {
                        num_dst,
                        num_src,
                        first_sampled,
                        num_edges,
                        indptr: array(Which::Indptr(h), vec![num_dst + 1], Dtype::I64)?,
                        indices: array(Which::Indices(h), vec![num_edges], Dtype::I32)?,
                    },
                )
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Self {
            index,
            batch_size,
            num_nodes,
            n_id: array(Which::NId, vec![num_nodes], Dtype::I32)?,
            x: array(Which::X, vec![num_nodes, dim], Dtype::F32)?,
            y: y.into_pyarray(py).into_any().unbind(),
            num_sampled_nodes,
            num_sampled_edges,
            hops,
        })
    }
}

#[pymethods]
impl DeviceBatch {
    /// A `torch_geometric.data.Data` on the arrays' device, laid out as PyG's
    /// `NeighborLoader`'s batches (`docs/python.md`).
    fn to_pyg<'py>(slf: PyRef<'py, Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("tandem._loader")?
            .call_method1("device_to_pyg", (slf,))
    }

    /// DGL blocks (one per layer, input layer first) on the arrays' device,
    /// as DGL's `NeighborSampler` yields them.
    fn to_dgl_blocks<'py>(slf: PyRef<'py, Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("tandem._loader")?
            .call_method1("device_to_dgl_blocks", (slf,))
    }

    fn __repr__(&self) -> String {
        format!(
            "DeviceBatch(index={}, batch_size={}, nodes={}, num_sampled_nodes={:?}, \
             num_sampled_edges={:?})",
            self.index,
            self.batch_size,
            self.num_nodes,
            self.num_sampled_nodes,
            self.num_sampled_edges
        )
    }
}
