//! Running an exported graph through ONNX Runtime (the `ort` crate, cargo feature
//! `onnx-runtime`).
//!
//! 1. [`load_onnx_runtime`] loads `libonnxruntime` from a path (`ort::init_from`)
//!    and builds the process's one ONNX Runtime environment. Both happen once per
//!    process: a later call with the same path returns the same version, with a
//!    different path an error (a process holds one ONNX Runtime). A failed
//!    attempt keeps nothing, so a later call with a good path still loads.
//! 2. [`OrtModel::from_bytes`] / [`OrtModel::from_file`] make a session for a file
//!    written by [`super::export`] and read its [`OnnxSignature`].
//! 3. [`OrtModel::run`] checks a request (features and blocks) against the
//!    signature, hands the buffers to ONNX Runtime without copying the features,
//!    and returns the output rows.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;
use ort::session::{Session, SessionInputValue};
use ort::value::{Tensor, TensorRef};

use super::{check_request, OnnxBlock, OnnxSignature};
use crate::error::{Error, Result};

/// The loaded library (its canonical path and version) and the environment, set
/// by the first successful [`load_onnx_runtime`].
type Loaded = (PathBuf, String, Environment);

static RUNTIME: OnceLock<Loaded> = OnceLock::new();
/// Serializes loading attempts (a failed one leaves nothing behind, so a later
/// call with a good path can still load).
static LOADING: Mutex<()> = Mutex::new(());

fn ort_err(context: &str) -> impl Fn(ort::Error) -> Error + '_ {
    move |e| Error::OnnxRuntime {
        context: context.into(),
        what: e.to_string(),
    }
}

fn load(library: &Path) -> std::result::Result<Loaded, String> {
    if !library.is_file() {
        return Err(format!(
            "{} is not a file (the path of libonnxruntime.so, ONNX Runtime >= 1.30)",
            library.display()
        ));
    }
    let path = std::fs::canonicalize(library).map_err(|e| format!("{}: {e}", library.display()))?;
    // A library that is not ONNX Runtime may trip an assertion inside `ort`.
    let built = catch_unwind(AssertUnwindSafe(|| -> std::result::Result<_, String> {
        let builder = ort::init_from(&path).map_err(|e| e.to_string())?;
        let env = builder
            .with_name("tandem")
            .with_telemetry(false)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(env)
    }))
    .map_err(|_| format!("{}: loading it panicked", path.display()))??;
    let version = version_of(&path).unwrap_or_else(|| "(version unknown)".into());
    Ok((path, version, built))
}

/// The library's own version string (`OrtGetApiBase()->GetVersionString()`).
fn version_of(path: &Path) -> Option<String> {
    type GetApiBase = unsafe extern "C" fn() -> *const ort::sys::OrtApiBase;
    // SAFETY: `ort` has just loaded this library, so this only takes another
    // reference to it (no initializers run again).
    let lib = unsafe { libloading::Library::new(path) }.ok()?;
    // SAFETY: ONNX Runtime's C API declares `const OrtApiBase* OrtGetApiBase(void)`.
    let get = unsafe { lib.get::<GetApiBase>(b"OrtGetApiBase") }.ok()?;
    // SAFETY: the signature above; the result is checked for null below.
    let base = unsafe { get() };
    if base.is_null() {
        return None;
    }
    // SAFETY: `base` points to the library's static OrtApiBase, whose
    // `GetVersionString` returns a static NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(((*base).GetVersionString)()) };
    v.to_str().ok().map(str::to_string)
}

/// Loads ONNX Runtime from `library` (once per process, see the module doc) and
/// returns its version (e.g. `"1.31.1"`).
pub fn load_onnx_runtime(library: &Path) -> Result<String> {
    let (_, version, _) = environment(library)?;
    Ok(version.clone())
}

fn environment(library: &Path) -> Result<&'static Loaded> {
    let fail = |what: String| Error::OnnxRuntime {
        context: format!("loading ONNX Runtime from {}", library.display()),
        what,
    };
    let loaded = match RUNTIME.get() {
        Some(l) => l,
        None => {
            let _guard = LOADING.lock().unwrap_or_else(|p| p.into_inner());
            match RUNTIME.get() {
                Some(l) => l,
                None => {
                    let l = load(library).map_err(fail)?;
                    RUNTIME.get_or_init(|| l)
                }
            }
        }
    };
    let same = std::fs::canonicalize(library).is_ok_and(|p| p == loaded.0);
    if !same {
        return Err(fail(format!(
            "this process already loaded ONNX Runtime from {}",
            loaded.0.display()
        )));
    }
    Ok(loaded)
}

/// An exported graph in an ONNX Runtime session (CPU execution provider).
#[derive(Debug)]
pub struct OrtModel {
    session: Session,
    signature: OnnxSignature,
}

impl OrtModel {
    /// Loads ONNX Runtime from `library` (see [`load_onnx_runtime`]) and a session
    /// for the model `bytes` (a file written by [`super::export`]).
    pub fn from_bytes(library: &Path, bytes: &[u8]) -> Result<Self> {
        let signature = OnnxSignature::of(bytes)?;
        let (_, _, env) = environment(library)?;
        let context = "creating an ONNX Runtime session";
        let session = Session::builder(env)
            .map_err(ort_err(context))?
            .with_intra_op_spinning(false)
            .map_err(|e| ort_err(context)(e.into()))?
            .commit_from_memory(bytes)
            .map_err(ort_err(context))?;
        Ok(Self { session, signature })
    }

    /// [`OrtModel::from_bytes`] with the model read from `path`.
    pub fn from_file(library: &Path, path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(library, &bytes)
    }

    /// What the model expects and returns.
    pub fn signature(&self) -> &OnnxSignature {
        &self.signature
    }

    /// Runs the model on `x` (`num_src(blocks[0]) × in_dim`, row-major) and
    /// `blocks` (bottom first, [`OnnxSignature::num_blocks`] of them); returns the
    /// output, `num_dst(last block) × out_dim` row-major.
    pub fn run(&mut self, x: &[f32], blocks: &[OnnxBlock]) -> Result<Vec<f32>> {
        let sig = &self.signature;
        if blocks.len() != sig.num_blocks {
            return Err(Error::invalid_argument(
                "blocks",
                format!(
                    "{} blocks, the model reads {} (one per layer it computes)",
                    blocks.len(),
                    sig.num_blocks
                ),
            ));
        }
        let rows = check_request(x, sig.in_dim, blocks)?;
        let context = "running the ONNX model";
        let err = ort_err(context);
        let mut inputs: Vec<(String, SessionInputValue<'_>)> =
            Vec::with_capacity(1 + 3 * blocks.len());
        let x_rows = x.len() / sig.in_dim;
        inputs.push((
            "x".into(),
            TensorRef::from_array_view(([x_rows, sig.in_dim], x))
                .map_err(&err)?
                .into(),
        ));
        for (l, b) in blocks.iter().enumerate() {
            for (name, ids) in [("src", &b.src), ("dst", &b.dst)] {
                inputs.push((
                    format!("{name}_{l}"),
                    TensorRef::from_array_view(([ids.len()], ids.as_slice()))
                        .map_err(&err)?
                        .into(),
                ));
            }
            inputs.push((
                format!("num_dst_{l}"),
                Tensor::from_array(([1usize], vec![b.num_dst as i64]))
                    .map_err(&err)?
                    .into(),
            ));
        }
        let name = sig.output.as_str();
        let out_dim = sig.out_dim;
        let outputs = self.session.run(inputs).map_err(&err)?;
        let value = outputs.get(name).ok_or_else(|| Error::OnnxRuntime {
            context: context.into(),
            what: format!("the model returned no `{name}`"),
        })?;
        let (shape, data) = value.try_extract_tensor::<f32>().map_err(&err)?;
        if shape.len() != 2 || shape[0] != rows as i64 || shape[1] != out_dim as i64 {
            return Err(Error::OnnxRuntime {
                context: context.into(),
                what: format!("`{name}` has shape {shape}, expected [{rows}, {out_dim}]"),
            });
        }
        Ok(data.to_vec())
    }
}
