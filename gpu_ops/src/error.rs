//! The error type of `gpu_ops`.

use crate::kind::DeviceKind;

/// Everything that can go wrong on a device.
#[derive(Debug, thiserror::Error)]
pub enum GpuOpsError {
    /// The backend cannot be used on this machine: the binary was built without it,
    /// a library is missing (`library` names it: `libcuda.so`, `libnvrtc.so`,
    /// `libcublas.so`), or there is no device.
    #[error("{kind} backend unavailable: {reason}")]
    Unavailable {
        /// The backend asked for.
        kind: DeviceKind,
        /// Why, in one line (names the missing library when that is the cause).
        reason: String,
    },
    /// The backend does not implement this op (yet); the caller can check first
    /// (e.g. [`crate::SparseOps::supports_sparse`]) and take another path.
    #[error("{kind} backend does not implement {op}")]
    Unsupported {
        /// The backend.
        kind: DeviceKind,
        /// The op or op family (`"sparse rows"`).
        op: &'static str,
    },
    /// A driver, NVRTC or cuBLAS call failed.
    #[error("{op}: {message}")]
    Driver {
        /// The operation (`cuMemAlloc`, `compile gather.cu`, ...).
        op: String,
        /// The driver's message.
        message: String,
    },
    /// A kernel source failed to compile; `log` is NVRTC's log.
    #[error("kernel `{kernel}` failed to compile:\n{log}")]
    Compile {
        /// The `.cu` file.
        kernel: String,
        /// NVRTC's log.
        log: String,
    },
    /// An allocation would exceed a memory budget or the device's memory.
    #[error("out of device memory: {what} needs {requested} bytes, {available} available")]
    OutOfMemory {
        /// What was being allocated.
        what: String,
        /// Bytes asked for.
        requested: usize,
        /// Bytes left (budget or device).
        available: usize,
    },
    /// Two sizes that must agree do not.
    #[error("{what}: expected {expected}, found {found}")]
    SizeMismatch {
        /// Which size.
        what: &'static str,
        /// The size required.
        expected: usize,
        /// The size given.
        found: usize,
    },
    /// An argument is outside its allowed range.
    #[error("invalid argument `{name}`: {reason}")]
    InvalidArgument {
        /// The argument's name.
        name: &'static str,
        /// What was expected.
        reason: String,
    },
    /// A host kernel (the host backend, or a host-side step) failed.
    #[error(transparent)]
    CpuOps(#[from] cpu_ops::CpuOpsError),
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, GpuOpsError>;
