//! Driver and cuBLAS errors as [`GpuOpsError`]s naming the operation, and
//! panic payloads as text: the helpers every CUDA op file maps its failures
//! with (a leaf: it knows no CUDA type of this crate).

use std::any::Any;

use cudarc::cublas;
use cudarc::driver::result::DriverError;

use crate::error::GpuOpsError;

/// Maps a driver error to [`GpuOpsError::Driver`] naming the operation.
pub(crate) fn drv(op: &str) -> impl FnOnce(DriverError) -> GpuOpsError + '_ {
    move |e| GpuOpsError::Driver {
        op: op.to_string(),
        message: describe_driver_error(e),
    }
}

/// Maps a cuBLAS error to [`GpuOpsError::Driver`] naming the operation.
pub(crate) fn blas_err(op: &str) -> impl FnOnce(cublas::result::CublasError) -> GpuOpsError + '_ {
    move |e| GpuOpsError::Driver {
        op: op.to_string(),
        message: format!("{e:?}"),
    }
}

pub(crate) fn describe_driver_error(e: DriverError) -> String {
    match (e.error_name(), e.error_string()) {
        (Ok(name), Ok(text)) => format!("{} ({})", name.to_string_lossy(), text.to_string_lossy()),
        _ => format!("{:?}", e.0),
    }
}

/// The text of a panic payload.
pub(crate) fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}
