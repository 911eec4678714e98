//! [`OrtModel`] when Tandem is built without the `onnx-runtime` feature: the same
//! API, and every way in reports that ONNX Runtime support is not compiled in
//! (candle's pattern for a missing backend, so callers need no `cfg`).

use std::path::Path;

use super::{check_request, OnnxBlock, OnnxSignature};
use crate::error::{Error, Result};

fn not_compiled(library: &Path) -> Error {
    Error::OnnxRuntime {
        context: format!("loading ONNX Runtime from {}", library.display()),
        what: "Tandem was built without ONNX Runtime support \
               (rebuild with `--features runtime/onnx-runtime`)"
            .into(),
    }
}

/// Loads ONNX Runtime from `library` and returns its version; without the
/// `onnx-runtime` feature, always an error saying so.
pub fn load_onnx_runtime(library: &Path) -> Result<String> {
    Err(not_compiled(library))
}

/// An exported graph in an ONNX Runtime session; without the `onnx-runtime`
/// feature it cannot be made (every constructor returns an error).
#[derive(Debug)]
pub struct OrtModel {
    signature: OnnxSignature,
}

impl OrtModel {
    /// Without the `onnx-runtime` feature: an error saying so.
    pub fn from_bytes(library: &Path, _bytes: &[u8]) -> Result<Self> {
        Err(not_compiled(library))
    }

    /// Without the `onnx-runtime` feature: an error saying so.
    pub fn from_file(library: &Path, _path: &Path) -> Result<Self> {
        Err(not_compiled(library))
    }

    /// What the model expects and returns.
    pub fn signature(&self) -> &OnnxSignature {
        &self.signature
    }

    /// Runs the model (never reached without the `onnx-runtime` feature).
    pub fn run(&mut self, x: &[f32], blocks: &[OnnxBlock]) -> Result<Vec<f32>> {
        check_request(x, self.signature.in_dim, blocks)?;
        Err(Error::OnnxRuntime {
            context: "running the ONNX model".into(),
            what: "Tandem was built without ONNX Runtime support".into(),
        })
    }
}
