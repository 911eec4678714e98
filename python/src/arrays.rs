//! Arrays from Python: `numpy.asarray` of what the caller passed, checked and
//! handed to the runtime as [`HostArray`]s that view the array's buffer (kept
//! alive by a reference to the array) — no copy — when its layout allows.
//!
//! Rules (docs/python.md, "Shared or copied"):
//! 1. An array must be C-contiguous, aligned and in native byte order; otherwise
//!    it is a `DatasetError` naming it (`numpy.ascontiguousarray` makes a copy,
//!    a decision left to the caller) — unless its dtype is converted anyway (3).
//! 2. `float32` features, integer ids and labels of any width, `bool` masks
//!    are used in place (the runtime reinterprets 4- and 8-byte integers; it
//!    converts the other widths and says so).
//! 3. Other numeric dtypes (`float64` features, say) are converted once with
//!    `astype`, and the conversion is noted (`Dataset.conversions`).
//! 4. A dtype that does not fit (strings, complex numbers, floats as ids) is a
//!    `DatasetError` naming the field and the dtype.

use std::any::Any;
use std::sync::Arc;

use bytemuck::Pod;
use cpu_ops::HostArray;
use numpy::{
    Element, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use runtime::DatasetProblem;

use crate::errors::{dataset_error, dataset_invalid, to_py};

/// Keeps a Python object (the array whose buffer a [`HostArray`] views) alive.
struct PyOwner(#[allow(dead_code)] Py<PyAny>);

/// What an argument must hold.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// `float32` values (other numbers converted).
    Float32,
    /// Integers of any width (ids, offsets, labels).
    Int,
    /// Integers, or `bool` (a mask).
    IntOrBool,
}

/// `numpy.asarray(obj)` checked against `want` and rule 1 (module doc);
/// conversions are appended to `notes`.
pub(crate) fn array<'py>(
    obj: &Bound<'py, PyAny>,
    field: &str,
    want: Want,
    notes: &mut Vec<String>,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let py = obj.py();
    let np = py.import("numpy")?;
    let given_array = obj.cast::<PyUntypedArray>().is_ok();
    let a = np.call_method1("asarray", (obj,))?;
    let a = a
        .cast_into::<PyUntypedArray>()
        .map_err(|_| dataset_invalid(field, "numpy.asarray did not return an array"))?;
    let dtype = a.dtype();
    let (kind, size) = (dtype.kind(), dtype.itemsize());
    let native = dtype.is_native_byteorder().unwrap_or(true);
    let dname: String = dtype.str().map(|s| s.to_string()).unwrap_or_default();
    let numeric = matches!(kind, b'f' | b'i' | b'u');
    let target = match want {
        Want::Float32 if kind == b'f' && size == 4 && native => None,
        Want::Float32 if numeric => Some("float32"),
        Want::Float32 => {
            return Err(dataset_invalid(
                field,
                format!("dtype {dname}, expected float32 (or a number type, converted)"),
            ))
        }
        Want::Int | Want::IntOrBool if matches!(kind, b'i' | b'u') && native => None,
        Want::Int | Want::IntOrBool if matches!(kind, b'i' | b'u') => Some("int64"),
        Want::IntOrBool if kind == b'b' => None,
        Want::Int | Want::IntOrBool => {
            return Err(dataset_invalid(
                field,
                format!(
                    "dtype {dname}, expected an integer dtype{}",
                    if want == Want::IntOrBool {
                        " or bool"
                    } else {
                        ""
                    }
                ),
            ))
        }
    };
    if let Some(t) = target {
        let conv = a.call_method1("astype", (t,))?;
        notes.push(format!("{field}: {dname} → {t} (copied)"));
        return conv
            .cast_into::<PyUntypedArray>()
            .map_err(|_| dataset_invalid(field, "astype did not return an array"));
    }
    if !a.is_c_contiguous() || !a.is_aligned() {
        return Err(dataset_invalid(
            field,
            format!(
                "not a C-contiguous, aligned array (shape {:?}, strides {:?}); \
                 numpy.ascontiguousarray(...) makes one (a copy)",
                a.shape(),
                a.strides()
            ),
        ));
    }
    if !given_array {
        notes.push(format!("{field}: built from a {} (copied)", type_name(obj)));
    }
    Ok(a)
}

/// The Python type name of `obj`.
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}

/// Checks `a`'s number of dimensions.
pub(crate) fn expect_ndim(
    a: &Bound<'_, PyUntypedArray>,
    field: &str,
    ndim: usize,
    expected: &'static str,
) -> PyResult<()> {
    if a.ndim() != ndim {
        return Err(to_py(dataset_error(
            field,
            &[],
            DatasetProblem::Shape {
                expected,
                found: a.shape().to_vec(),
            },
        )));
    }
    Ok(())
}

/// A [`HostArray`] over `a`'s buffer, holding `a` (rule 2 of the module doc:
/// `a` is C-contiguous, aligned, native and of element type `T`).
pub(crate) fn shared<T: Element + Pod + Send + Sync>(a: &Bound<'_, PyArrayDyn<T>>) -> HostArray<T> {
    let len = a.len();
    let ptr = a.data() as *const T;
    let owner: Arc<dyn Any + Send + Sync> = Arc::new(PyOwner(a.clone().into_any().unbind()));
    // SAFETY: `a` is a C-contiguous, aligned array of `len` native `T`s (checked
    // by `array` and by the cast to `PyArrayDyn<T>`); `owner` holds a reference
    // to it, so its buffer lives as long as the HostArray. That nobody writes
    // to it meanwhile is the documented contract of `Dataset.from_arrays`
    // (docs/python.md: the dataset views the arrays it was given).
    unsafe { HostArray::from_external(owner, ptr, len) }
}

/// Calls `$body` with `$a` bound to `$arr` cast to the `PyArrayDyn<T>` of its
/// integer dtype (the `array` checks made it one of them, or bool for masks).
macro_rules! with_int_array {
    ($arr:expr, $a:ident => $body:expr, else $other:expr) => {{
        let arr = $arr;
        if let Ok($a) = arr.cast::<numpy::PyArrayDyn<i64>>() {
            $body
        } else if let Ok($a) = arr.cast::<numpy::PyArrayDyn<i32>>() {
            $body
        } else if let Ok($a) = arr.cast::<numpy::PyArrayDyn<u64>>() {
            $body
        } else if let Ok($a) = arr.cast::<numpy::PyArrayDyn<u32>>() {
            $body
        } else if let Ok($a) = arr.cast::<numpy::PyArrayDyn<i16>>() {
            $body
        } else if let Ok($a) = arr.cast::<numpy::PyArrayDyn<u16>>() {
            $body
        } else if let Ok($a) = arr.cast::<numpy::PyArrayDyn<i8>>() {
            $body
        } else if let Ok($a) = arr.cast::<numpy::PyArrayDyn<u8>>() {
            $body
        } else {
            $other
        }
    }};
}
pub(crate) use with_int_array;

/// Vertex ids from Python (a sequence or an integer array) as `u32`, each
/// non-negative; `field` names them in errors. (The trainer checks them
/// against the vertex count.)
pub(crate) fn ids(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<Vec<u32>> {
    let mut notes = Vec::new();
    let a = array(obj, field, Want::Int, &mut notes)?;
    expect_ndim(&a, field, 1, "(k,): one id a row")?;
    with_int_array!(&a, t => {
        let view = t.readonly();
        let s = view.as_slice().map_err(|e| dataset_invalid(field, e.to_string()))?;
        to_u32(s, field)
    }, else Err(dataset_invalid(field, "expected an integer array")))
}

/// `s` as `u32` ids, naming the first negative or too large one.
fn to_u32<T: runtime::data::ArrayInt>(s: &[T], field: &str) -> PyResult<Vec<u32>> {
    s.iter()
        .enumerate()
        .map(|(i, &v)| {
            let w = v.widen();
            u32::try_from(w).map_err(|_| {
                let problem = if w < 0 {
                    DatasetProblem::Negative { value: w }
                } else {
                    DatasetProblem::OutOfRange {
                        value: w,
                        bound: u32::MAX as u64 + 1,
                        bound_name: "the u32 vertex id limit",
                    }
                };
                to_py(dataset_error(field, &[i], problem))
            })
        })
        .collect()
}

/// A mask from a bool array (used in place) or from an array of ids (a mask of
/// `n` bytes built from them: ids must be below `n`).
pub(crate) fn mask(obj: &Bound<'_, PyAny>, field: &str, n: usize) -> PyResult<HostArray<u8>> {
    let mut notes = Vec::new();
    let a = array(obj, field, Want::IntOrBool, &mut notes)?;
    expect_ndim(&a, field, 1, "(n,) bools, or (k,) vertex ids")?;
    if a.dtype().kind() == b'b' {
        let b = a
            .cast::<PyArrayDyn<bool>>()
            .map_err(|_| dataset_invalid(field, "expected a bool array"))?;
        return Ok(bool_bytes(b));
    }
    let ids = ids(a.as_any(), field)?;
    let mut m = vec![0u8; n];
    for (i, &v) in ids.iter().enumerate() {
        let Some(slot) = m.get_mut(v as usize) else {
            return Err(to_py(dataset_error(
                field,
                &[i],
                DatasetProblem::OutOfRange {
                    value: v.into(),
                    bound: n as u64,
                    bound_name: "the vertex count",
                },
            )));
        };
        *slot = 1;
    }
    Ok(HostArray::from_vec(m))
}

/// A NumPy bool array's bytes (0 or 1 each) in place.
fn bool_bytes(b: &Bound<'_, PyArrayDyn<bool>>) -> HostArray<u8> {
    let len = b.len();
    let ptr = b.data() as *const u8;
    let owner: Arc<dyn Any + Send + Sync> = Arc::new(PyOwner(b.clone().into_any().unbind()));
    // SAFETY: as in `shared`: a C-contiguous array of `len` bools, one byte
    // each (NumPy stores `True` as 1 and `False` as 0), held by `owner`.
    unsafe { HostArray::from_external(owner, ptr, len) }
}
