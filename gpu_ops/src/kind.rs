//! Which backend a device is (a leaf: errors name it too).

use std::fmt;

/// Which backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// Host threads through `cpu_ops` (always available).
    Host,
    /// An NVIDIA GPU through cudarc.
    Cuda,
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Host => "host",
            Self::Cuda => "cuda",
        })
    }
}
