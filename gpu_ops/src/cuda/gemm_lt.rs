//! GEMM through cuBLASLt with a restricted split-K reduction, behind the
//! `TANDEM_GEMM` environment variable; the default stays `cublasSgemm`.
//!
//! cuBLAS picks split-K for the skinny products of a SAGE step (weight gradients
//! `Xᵀ·G` with `k` = thousands of rows and `m × n` = 256 × 256: few output tiles)
//! and reduces the slices in a second kernel: `ncu` counted 6–7 such reduction
//! launches a batch (33–38 µs). cuBLASLt takes a preference that names the
//! reduction schemes allowed (`CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK`):
//!
//! - `TANDEM_GEMM=lt-inplace`: split-K only where the slices are added in the
//!   output buffer by the GEMM kernel itself (`CUBLASLT_REDUCTION_SCHEME_INPLACE`,
//!   serialized through counters in the workspace, so deterministic), or none:
//!   no separate reduction launch, the split-K parallelism kept;
//! - `TANDEM_GEMM=lt-nosplit`: no split-K at all (`..._NONE`): one launch,
//!   but a 256 × 256 output over a long `k` runs on few blocks;
//! - unset or `cublas`: `cublasSgemm`.
//!
//! Which of the three is fastest is measured, not known: run the CUDA parity
//! tests and an `ncu` window under each (`docs/gpu.md`). The algorithm
//! cuBLASLt's heuristic returns is kept per shape (a few dozen shapes a run), so
//! the heuristic runs once per shape.

use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use parking_lot::Mutex;

use super::alloc::{CudaBuf, Init};
use super::gemm::ColMajorGemm;
use crate::error::{GpuOpsError, Result};
use crate::Precision;

/// The environment variable that picks the GEMM path (module doc).
pub(crate) const GEMM_ENV: &str = "TANDEM_GEMM";
/// Workspace for the in-place reduction's counters and any algorithm that asks
/// for some (cuBLASLt never uses more than it is offered).
const WORKSPACE_BYTES: usize = 4 << 20;
/// Heuristic results kept before the cache is cleared.
const MAX_CACHED_SHAPES: usize = 4096;

/// Which library computes [`crate::DenseOps::matmul`] on CUDA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GemmPath {
    /// `cublasSgemm` (the default).
    Cublas,
    /// cuBLASLt, split-K reduced in place or not at all.
    LtInplace,
    /// cuBLASLt without split-K.
    LtNoSplit,
}

impl GemmPath {
    /// The path `value` of [`GEMM_ENV`] names (unset: [`GemmPath::Cublas`]).
    pub(crate) fn parse(value: Option<&str>) -> Result<Self> {
        match value.map(str::trim) {
            None | Some("") | Some("cublas") => Ok(Self::Cublas),
            Some("lt-inplace") => Ok(Self::LtInplace),
            Some("lt-nosplit") => Ok(Self::LtNoSplit),
            Some(other) => Err(GpuOpsError::InvalidArgument {
                name: GEMM_ENV,
                reason: format!(
                    "`{other}`: expected `cublas` (the default), `lt-inplace` or `lt-nosplit`"
                ),
            }),
        }
    }

    /// The path the environment asks for.
    pub(crate) fn from_env() -> Result<Self> {
        Self::parse(std::env::var(GEMM_ENV).ok().as_deref())
    }

    /// The reduction schemes cuBLASLt may use (`None` for `cublasSgemm`).
    fn reduction_mask(self) -> Option<u32> {
        use sys::cublasLtReductionScheme_t as R;
        match self {
            Self::Cublas => None,
            Self::LtInplace => Some(R::CUBLASLT_REDUCTION_SCHEME_INPLACE as u32),
            Self::LtNoSplit => Some(R::CUBLASLT_REDUCTION_SCHEME_NONE as u32),
        }
    }
}

/// A heuristic query's identity: the column-major problem, the math mode and
/// the operands' alignments (an algorithm chosen for aligned buffers may refuse
/// less aligned ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ShapeKey {
    gemm: ColMajorGemmKey,
    tf32: bool,
    accumulate: bool,
    align: [u32; 3],
}

/// The largest power of two up to 256 that divides `ptr` (bytes): the
/// alignment the heuristic may assume of a buffer there.
fn alignment(ptr: u64) -> u32 {
    if ptr == 0 {
        256
    } else {
        1u32 << ptr.trailing_zeros().min(8)
    }
}

/// [`ColMajorGemm`]'s fields, hashable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ColMajorGemmKey([i32; 6], bool, bool);

impl From<&ColMajorGemm> for ColMajorGemmKey {
    fn from(p: &ColMajorGemm) -> Self {
        Self(
            [p.m, p.n, p.k, p.ld_first, p.ld_second, p.ldc],
            p.op_first,
            p.op_second,
        )
    }
}

/// A cuBLASLt handle, its workspace and the algorithms chosen so far.
pub(crate) struct GemmLt {
    handle: sys::cublasLtHandle_t,
    path: GemmPath,
    workspace: CudaBuf<u8>,
    algos: Mutex<HashMap<ShapeKey, sys::cublasLtMatmulAlgo_t>>,
}

// SAFETY: the handle is used only through `&self` methods that cuBLASLt allows
// from any thread (cuBLASLt handles are thread-safe for matmul and heuristic
// calls); the algorithm cache is behind a mutex.
unsafe impl Send for GemmLt {}
// SAFETY: as above.
unsafe impl Sync for GemmLt {}

fn lt_err(op: &'static str) -> impl FnOnce(lt::CublasError) -> GpuOpsError {
    move |e| GpuOpsError::Driver {
        op: op.to_string(),
        message: format!("{e:?}"),
    }
}

/// Descriptors of one call, destroyed on drop.
struct Descs {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: Vec<sys::cublasLtMatrixLayout_t>,
    pref: Option<sys::cublasLtMatmulPreference_t>,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by cuBLASLt, is destroyed once,
        // and no call uses it any more.
        unsafe {
            let _ = lt::destroy_matmul_desc(self.desc);
            for &l in &self.layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
            if let Some(p) = self.pref {
                let _ = lt::destroy_matmul_pref(p);
            }
        }
    }
}

impl GemmLt {
    /// A handle for `path` (not [`GemmPath::Cublas`]) with its workspace from
    /// `alloc`; `Unavailable` when libcublasLt is missing.
    pub(crate) fn new(
        path: GemmPath,
        alloc: impl FnOnce(usize) -> Result<CudaBuf<u8>>,
    ) -> Result<Self> {
        if path == GemmPath::Cublas {
            return Err(GpuOpsError::InvalidArgument {
                name: GEMM_ENV,
                reason: "internal: cuBLASLt asked for the cublasSgemm path".into(),
            });
        }
        // SAFETY: only checks whether the library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuOpsError::Unavailable {
                kind: crate::DeviceKind::Cuda,
                reason: format!(
                    "{GEMM_ENV}={path:?} needs libcublasLt.so (CUDA 13), which was not found \
                     on the library path; unset {GEMM_ENV} to use cublasSgemm"
                ),
            });
        }
        let handle = lt::create_handle().map_err(lt_err("cublasLtCreate"))?;
        let workspace = match alloc(WORKSPACE_BYTES) {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: the handle was just created and is not used elsewhere.
                let _ = unsafe { lt::destroy_handle(handle) };
                return Err(e);
            }
        };
        Ok(Self {
            handle,
            path,
            workspace,
            algos: Mutex::new(HashMap::new()),
        })
    }

    /// `C = op(X)·op(Y) (+ C)` column-major as `p` describes it (`X` the first
    /// operand at `first`, `Y` the second at `second`, `C` at `c`), on
    /// `stream`, in `precision`'s math.
    pub(crate) fn matmul(
        &self,
        p: &ColMajorGemm,
        (first, second, c): (u64, u64, u64),
        accumulate: bool,
        precision: Precision,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<()> {
        use cudarc::cublas::sys::cublasOperation_t as Op;
        use sys::cublasLtMatmulDescAttributes_t as D;
        let tf32 = precision == Precision::Tf32;
        let compute = if tf32 {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let f32_t = sys::cudaDataType::CUDA_R_32F;
        let desc =
            lt::create_matmul_desc(compute, f32_t).map_err(lt_err("cublasLtMatmulDescCreate"))?;
        let mut d = Descs {
            desc,
            layouts: Vec::with_capacity(3),
            pref: None,
        };
        let op = |t: bool| if t { Op::CUBLAS_OP_T } else { Op::CUBLAS_OP_N };
        for (attr, t) in [
            (D::CUBLASLT_MATMUL_DESC_TRANSA, p.op_first),
            (D::CUBLASLT_MATMUL_DESC_TRANSB, p.op_second),
        ] {
            let v = op(t);
            // SAFETY: the descriptor is live; the attribute is a cublasOperation_t
            // passed by address with its size.
            unsafe {
                lt::set_matmul_desc_attribute(
                    d.desc,
                    attr,
                    (&v as *const Op).cast(),
                    std::mem::size_of::<Op>(),
                )
            }
            .map_err(lt_err("cublasLtMatmulDescSetAttribute"))?;
        }
        // Stored shapes (column-major rows × cols) of X, Y and C.
        let (m, n, k) = (p.m as u64, p.n as u64, p.k as u64);
        let x_shape = if p.op_first { (k, m) } else { (m, k) };
        let y_shape = if p.op_second { (n, k) } else { (k, n) };
        for ((rows, cols), ld) in [
            (x_shape, p.ld_first),
            (y_shape, p.ld_second),
            ((m, n), p.ldc),
        ] {
            let l = lt::create_matrix_layout(f32_t, rows, cols, i64::from(ld))
                .map_err(lt_err("cublasLtMatrixLayoutCreate"))?;
            d.layouts.push(l);
        }
        let (lx, ly, lc) = (d.layouts[0], d.layouts[1], d.layouts[2]);
        let key = ShapeKey {
            gemm: p.into(),
            tf32,
            accumulate,
            align: [alignment(first), alignment(second), alignment(c)],
        };
        let cached = self.algos.lock().get(&key).copied();
        let algo = match cached {
            Some(a) => a,
            None => {
                let a = self.heuristic(&mut d, (lx, ly, lc), key.align)?;
                let mut algos = self.algos.lock();
                if algos.len() >= MAX_CACHED_SHAPES {
                    algos.clear();
                }
                algos.insert(key, a);
                a
            }
        };
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        // SAFETY: live handle and descriptors; X, Y and C hold what their layouts
        // describe (the caller checked the buffers against p); alpha and beta are
        // host scalars (the default pointer mode) alive for the call; the
        // workspace holds WORKSPACE_BYTES on this device; the stream belongs to
        // the handle's context. With beta = 0, C is not read.
        unsafe {
            lt::matmul(
                self.handle,
                d.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                first as *const c_void,
                lx,
                second as *const c_void,
                ly,
                c as *const c_void,
                lc,
                c as *mut c_void,
                lc,
                &algo,
                self.workspace.raw() as *mut c_void,
                WORKSPACE_BYTES,
                stream as sys::cudaStream_t,
            )
        }
        .map_err(lt_err("cublasLtMatmul"))
    }

    /// The fastest algorithm cuBLASLt proposes for the problem in `d`, among
    /// those using the path's reduction schemes and the workspace.
    fn heuristic(
        &self,
        d: &mut Descs,
        (lx, ly, lc): (
            sys::cublasLtMatrixLayout_t,
            sys::cublasLtMatrixLayout_t,
            sys::cublasLtMatrixLayout_t,
        ),
        [ax, ay, ac]: [u32; 3],
    ) -> Result<sys::cublasLtMatmulAlgo_t> {
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        let pref = lt::create_matmul_pref().map_err(lt_err("cublasLtMatmulPreferenceCreate"))?;
        d.pref = Some(pref);
        let ws = WORKSPACE_BYTES as u64;
        let mask = self.path.reduction_mask().unwrap_or(0);
        // SAFETY: live preference; each value is passed by address with its
        // size (u64 for the workspace, u32 for the mask and the alignments, as
        // cuBLASLt documents).
        unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
            .map_err(lt_err("cublasLtMatmulPreferenceSetAttribute"))?;
            lt::set_matmul_pref_attribute(
                pref,
                P::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                (&mask as *const u32).cast(),
                std::mem::size_of::<u32>(),
            )
            .map_err(lt_err("cublasLtMatmulPreferenceSetAttribute"))?;
            for (attr, a) in [
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, ax),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, ay),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, ac),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, ac),
            ] {
                lt::set_matmul_pref_attribute(
                    pref,
                    attr,
                    (&a as *const u32).cast(),
                    std::mem::size_of::<u32>(),
                )
                .map_err(lt_err("cublasLtMatmulPreferenceSetAttribute"))?;
            }
        }
        // SAFETY: live handle, descriptor, layouts and preference.
        let found =
            unsafe { lt::get_matmul_algo_heuristic(self.handle, d.desc, lx, ly, lc, lc, pref) }
                .map_err(lt_err("cublasLtMatmulAlgoGetHeuristic"))?;
        Ok(found.algo)
    }
}

impl Drop for GemmLt {
    fn drop(&mut self) {
        // SAFETY: the handle is live, owned here and no longer used (the backend
        // synchronized its stream before dropping this).
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// A workspace buffer of `bytes` from the backend's pool.
pub(crate) fn workspace(
    pool: &std::sync::Arc<super::alloc::Pool>,
) -> impl FnOnce(usize) -> Result<CudaBuf<u8>> + '_ {
    move |bytes| pool.alloc::<u8>(bytes, Init::Uninit, "cuBLASLt workspace")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The variable's values: unset and `cublas` keep cublasSgemm; the two
    /// cuBLASLt paths allow in-place reduction or none; anything else is an
    /// error naming the variable and the values it takes.
    #[test]
    fn gemm_path_parses_the_environment_value() {
        assert_eq!(GemmPath::parse(None).unwrap(), GemmPath::Cublas);
        assert_eq!(GemmPath::parse(Some("cublas")).unwrap(), GemmPath::Cublas);
        assert_eq!(
            GemmPath::parse(Some(" lt-inplace ")).unwrap(),
            GemmPath::LtInplace
        );
        assert_eq!(
            GemmPath::parse(Some("lt-nosplit")).unwrap(),
            GemmPath::LtNoSplit
        );
        let e = GemmPath::parse(Some("splitk")).unwrap_err().to_string();
        assert!(e.contains(GEMM_ENV) && e.contains("lt-inplace"), "{e}");
        assert_eq!(GemmPath::Cublas.reduction_mask(), None);
        assert_eq!(GemmPath::LtNoSplit.reduction_mask(), Some(0));
        assert_eq!(GemmPath::LtInplace.reduction_mask(), Some(1));
    }

    /// Alignments: the lowest set bit, capped at 256 (the heuristic's default).
    #[test]
    fn alignment_is_the_lowest_set_bit_up_to_256() {
        assert_eq!(alignment(0x7f00_0000_0000), 256);
        assert_eq!(alignment(0x7f00_0000_0104), 4);
        assert_eq!(alignment(0x7f00_0000_0110), 16);
        assert_eq!(alignment(0x7f00_0000_0180), 128);
        assert_eq!(alignment(0), 256);
    }
}
