//! `runtime::Error` as Python exceptions: one class per kind a program branches
//! on, each message the error's `Display` — the text the `tandem` CLI prints
//! after `error: ` — and the structured fields as attributes.
//!
//! ```text
//! TandemError                 every runtime error (I/O, parse, argument, ...)
//! ├── ConfigError             key, origin
//! ├── DatasetError            field, index, problem
//! ├── CheckpointError         path
//! ├── ArgumentError           name (also a ValueError)
//! ├── DeviceError
//! └── NonFiniteError          epoch, batch, loss
//! ```

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use runtime::{DatasetProblem, Error};

create_exception!(
    tandem,
    TandemError,
    PyException,
    "Every error Tandem reports; the message is the one the `tandem` CLI prints."
);
create_exception!(
    tandem,
    ConfigError,
    TandemError,
    "A configuration problem: an unknown key, a bad value, TOML syntax. `key` is the dotted key \
     (empty for a syntax error), `origin` where the text came from (a file, `<config dict>`, \
     `overrides`)."
);
create_exception!(
    tandem,
    DatasetError,
    TandemError,
    "Dataset arrays that disagree or hold a bad value. `field` names the array (`features`, \
     `labels`, `edge_index`, ...), `index` the element to blame (a tuple; empty for the whole \
     array), `problem` what is wrong."
);
create_exception!(
    tandem,
    CheckpointError,
    TandemError,
    "A checkpoint that is corrupt, or intact but of another model or dataset; `path` names it."
);
create_exception!(
    tandem,
    ArgumentError,
    TandemError,
    "An argument out of range (a fanout of 0, a seed that is not a vertex, an unknown device); \
     `name` is the argument. Also a `ValueError`."
);
create_exception!(
    tandem,
    DeviceError,
    TandemError,
    "The accelerator failed or is missing (a CUDA library, a kernel launch), or CUDA was asked \
     for in a build without it."
);
create_exception!(
    tandem,
    NonFiniteError,
    TandemError,
    "A batch's loss was NaN or infinite (`train.on_nonfinite = \"stop\"`); the weights are those \
     before batch `batch` of epoch `epoch`, and the trainer stays usable."
);

/// Adds the exception classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TandemError", py.get_type::<TandemError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("DatasetError", py.get_type::<DatasetError>())?;
    m.add("CheckpointError", py.get_type::<CheckpointError>())?;
    m.add("ArgumentError", argument_error_type(py)?)?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add("NonFiniteError", py.get_type::<NonFiniteError>())?;
    Ok(())
}

/// `ArgumentError`, made a `ValueError` too (`except ValueError` catches it,
/// as Python code expects of a bad argument).
fn argument_error_type(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyType>> {
    let t = py.get_type::<ArgumentError>();
    let bases = PyTuple::new(
        py,
        [py.get_type::<TandemError>(), py.get_type::<PyValueError>()],
    )?;
    t.setattr("__bases__", bases)?;
    Ok(t)
}

/// `problem`'s text without the separator `Display` puts before it.
fn problem_text(problem: &DatasetProblem) -> String {
    let s = problem.to_string();
    s.trim_start_matches([':', ' ', '=']).to_string()
}

/// The Python exception for `e`, with its message and fields.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    Python::attach(|py| {
        let (err, attrs): (PyErr, Vec<(&str, Py<PyAny>)>) = match &e {
            Error::Config { origin, key, .. } => (
                ConfigError::new_err(msg),
                vec![("key", str_obj(py, key)), ("origin", str_obj(py, origin))],
            ),
            Error::Dataset {
                field,
                index,
                problem,
            } => {
                let index = PyTuple::new(py, index.iter().copied())
                    .map(|t| t.into_any().unbind())
                    .unwrap_or_else(|_| py.None());
                (
                    DatasetError::new_err(msg),
                    vec![
                        ("field", str_obj(py, field)),
                        ("index", index),
                        ("problem", str_obj(py, &problem_text(problem))),
                    ],
                )
            }
            Error::CheckpointMismatch { path, .. } | Error::CheckpointCorrupt { path, .. } => (
                CheckpointError::new_err(msg),
                vec![("path", str_obj(py, &path.display().to_string()))],
            ),
            Error::InvalidArgument { name, .. } => (
                ArgumentError::new_err(msg),
                vec![("name", str_obj(py, name))],
            ),
            Error::Device { .. } | Error::CudaNotCompiled { .. } => {
                (DeviceError::new_err(msg), Vec::new())
            }
            Error::NonFinite { epoch, batch, loss } => (
                NonFiniteError::new_err(msg),
                vec![
                    ("epoch", int_obj(py, *epoch)),
                    ("batch", int_obj(py, *batch)),
                    (
                        "loss",
                        pyo3::types::PyFloat::new(py, *loss).into_any().unbind(),
                    ),
                ],
            ),
            Error::Io { path, .. } | Error::Format { path, .. } | Error::Parse { path, .. } => (
                TandemError::new_err(msg),
                vec![("path", str_obj(py, &path.display().to_string()))],
            ),
            _ => (TandemError::new_err(msg), Vec::new()),
        };
        let value = err.value(py);
        for (name, v) in attrs {
            // An attribute that cannot be set leaves the message intact.
            let _ = value.setattr(name, v);
        }
        err
    })
}

fn str_obj(py: Python<'_>, s: &str) -> Py<PyAny> {
    pyo3::types::PyString::new(py, s).into_any().unbind()
}

fn int_obj(py: Python<'_>, v: usize) -> Py<PyAny> {
    v.into_pyobject(py)
        .map(|o| o.into_any().unbind())
        .unwrap_or_else(|_| py.None())
}

/// `runtime::Result` into `PyResult`.
pub(crate) trait IntoPy<T> {
    /// The value, or the Python exception for the error.
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for runtime::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// A [`DatasetError`] built as the runtime builds one: `invalid dataset:
/// {field}: {what}`.
pub(crate) fn dataset_invalid(field: &str, what: impl Into<String>) -> PyErr {
    to_py(dataset_error(
        field,
        &[],
        DatasetProblem::Invalid { what: what.into() },
    ))
}

/// A runtime dataset error (formatted by the runtime).
pub(crate) fn dataset_error(field: &str, index: &[usize], problem: DatasetProblem) -> Error {
    Error::Dataset {
        field: field.to_string(),
        index: index.to_vec(),
        problem,
    }
}
