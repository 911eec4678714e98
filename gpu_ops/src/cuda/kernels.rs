//! The kernel registry: `.cu` sources, NVRTC compilation, module cache and typed
//! launchers.
//!
//! # How a kernel is found and run
//! 1. **Sources.** Each op family is one file in `gpu_ops/kernels/` (embedded with
//!    `include_str!`), starting with `#include "common.cuh"`; the registry pastes the
//!    header in its place (plus a `#line` directive so NVRTC's log names the right
//!    file and line).
//! 2. **Compile lazily.** The first launch of a kernel compiles its family with NVRTC
//!    for the device's compute capability (`--gpu-architecture=compute_XY`); the PTX
//!    is cached per `(family, architecture)` for the whole process, the loaded
//!    module per backend (context). [`crate::CudaBackend::warm_up`] compiles all.
//! 3. **Typed launchers.** [`define_kernels!`] lists every kernel with its parameter
//!    names and Rust types; it generates the [`KernelId`] enum and one function per
//!    kernel in [`launch`] whose Rust signature fixes the argument count and types. A
//!    unit test parses every `extern "C" __global__` signature in the sources and
//!    checks it against this table name by name and type by type (pointer element
//!    type and constness included), so a launcher cannot drift from its kernel.
//! 4. **Grids.** [`Grid`] shapes launches: 256 threads per block, grid-stride loops in
//!    every kernel, a block count capped at 32 blocks per SM; an empty grid is not
//!    launched at all.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use cudarc::driver::result as dresult;
use cudarc::driver::{sys, CudaContext, CudaModule};
use cudarc::nvrtc::{self, CompileError, CompileOptions, Ptx};

use super::driver::{drv, panic_message};
use crate::backend::DeviceKind;
use crate::error::{GpuOpsError, Result};

/// The shared header every source includes.
pub(crate) const COMMON_HEADER: &str = include_str!("../../kernels/common.cuh");

/// One `.cu` file: a family of kernels compiled together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Family {
    /// `math.cu`: element-wise math, bias, activations, dropout, loss, Adam.
    Math,
    /// `features.cu`: gather through the cache, cache updates, row select/put.
    Features,
    /// `scan.cu`: prefix sums.
    Scan,
    /// `sample.cu`: neighbor sampling and unique relabeling.
    Sample,
    /// `aggregate.cu`: block degrees and aggregation forward/backward.
    Aggregate,
    /// `attention.cu`: GAT forward/backward.
    Attention,
    /// `link.cu`: pair scores, binary cross-entropy rows, negatives, edge exclusion.
    Link,
}

impl Family {
    /// Every family.
    pub(crate) const ALL: [Family; 7] = [
        Family::Math,
        Family::Features,
        Family::Scan,
        Family::Sample,
        Family::Aggregate,
        Family::Attention,
        Family::Link,
    ];

    /// The source file's name.
    pub(crate) fn file(self) -> &'static str {
        match self {
            Family::Math => "math.cu",
            Family::Features => "features.cu",
            Family::Scan => "scan.cu",
            Family::Sample => "sample.cu",
            Family::Aggregate => "aggregate.cu",
            Family::Attention => "attention.cu",
            Family::Link => "link.cu",
        }
    }

    /// The source as stored (with its `#include "common.cuh"` line).
    pub(crate) fn raw_source(self) -> &'static str {
        match self {
            Family::Math => include_str!("../../kernels/math.cu"),
            Family::Features => include_str!("../../kernels/features.cu"),
            Family::Scan => include_str!("../../kernels/scan.cu"),
            Family::Sample => include_str!("../../kernels/sample.cu"),
            Family::Aggregate => include_str!("../../kernels/aggregate.cu"),
            Family::Attention => include_str!("../../kernels/attention.cu"),
            Family::Link => include_str!("../../kernels/link.cu"),
        }
    }
}

/// `source` with its `#include "common.cuh"` line replaced by the header and a `#line`
/// directive that restores `file`'s own line numbers.
pub(crate) fn expand_source(file: &str, source: &str) -> String {
    const INCLUDE: &str = "#include \"common.cuh\"";
    match source.find(INCLUDE) {
        Some(at) => {
            // The include's own line number: the rest of that line (empty) keeps it.
            let line = source[..at].matches('\n').count() + 1;
            let mut out = String::with_capacity(source.len() + COMMON_HEADER.len() + 64);
            out.push_str(&source[..at]);
            out.push_str(&format!("#line 1 \"common.cuh\"\n{COMMON_HEADER}\n"));
            out.push_str(&format!("#line {line} \"{file}\"\n"));
            out.push_str(&source[at + INCLUDE.len()..]);
            out
        }
        None => source.to_string(),
    }
}

/// `--gpu-architecture` value for a compute capability.
pub(crate) fn arch_option(cc: (u32, u32)) -> String {
    format!("--gpu-architecture=compute_{}{}", cc.0, cc.1)
}

/// `Unavailable` unless libnvrtc can be loaded.
pub(crate) fn require_nvrtc() -> Result<()> {
    // SAFETY: `is_culib_present` only tries to dlopen libnvrtc under its known names
    // (and closes it again); it has no other side effects.
    if unsafe { nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(GpuOpsError::Unavailable {
            kind: DeviceKind::Cuda,
            reason: NVRTC_MISSING.to_string(),
        })
    }
}

/// Why NVRTC is unavailable.
pub(crate) const NVRTC_MISSING: &str = "libnvrtc.so (NVRTC, the CUDA runtime compiler) not found: \
     install CUDA 13 or the `nvidia-cuda-nvrtc` 13.0 wheel and put its lib directory on \
     LD_LIBRARY_PATH";

/// Compiles one CUDA C++ source (`name` is used in the log and the error) to PTX for
/// compute capability `cc`. Needs libnvrtc, not a device.
pub(crate) fn compile_to_ptx(name: &str, source: &str, cc: (u32, u32)) -> Result<Ptx> {
    require_nvrtc()?;
    if source.contains('\0') {
        return Err(GpuOpsError::InvalidArgument {
            name: "source",
            reason: format!("kernel source `{name}` contains a NUL byte"),
        });
    }
    let opts = CompileOptions {
        options: vec![arch_option(cc), "--std=c++17".to_string()],
        name: Some(name.to_string()),
        ..Default::default()
    };
    let compiled = catch_unwind(AssertUnwindSafe(|| {
        nvrtc::compile_ptx_with_opts(source, opts)
    }));
    match compiled {
        Ok(Ok(ptx)) => Ok(ptx),
        Ok(Err(CompileError::CompileError { log, .. })) => Err(GpuOpsError::Compile {
            kernel: name.to_string(),
            log: log.to_string_lossy().into_owned(),
        }),
        Ok(Err(other)) => Err(GpuOpsError::Driver {
            op: format!("NVRTC compile {name}"),
            message: format!("{other:?}"),
        }),
        Err(panic) => Err(GpuOpsError::Driver {
            op: format!("NVRTC compile {name}"),
            message: format!("NVRTC panicked: {}", panic_message(&*panic)),
        }),
    }
}

/// PTX by family and compute capability.
type PtxCache = Mutex<HashMap<(Family, (u32, u32)), Ptx>>;

/// Process-wide PTX cache: each family is compiled once per architecture.
fn ptx_cache() -> &'static PtxCache {
    static CACHE: OnceLock<PtxCache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The PTX of `family` for `cc` (compiled on first request).
pub(crate) fn family_ptx(family: Family, cc: (u32, u32)) -> Result<Ptx> {
    if let Some(p) = ptx_cache().lock().get(&(family, cc)) {
        return Ok(p.clone());
    }
    // Compile outside the lock (seconds for a big family); a race compiles twice.
    let ptx = compile_to_ptx(
        family.file(),
        &expand_source(family.file(), family.raw_source()),
        cc,
    )?;
    ptx_cache().lock().insert((family, cc), ptx.clone());
    Ok(ptx)
}

/// A read-only device pointer kernel argument (`const T*` in the kernel).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ptr<T>(u64, PhantomData<*const T>);

/// A writable device pointer kernel argument (`T*` in the kernel).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PtrMut<T>(u64, PhantomData<*mut T>);

impl<T> Ptr<T> {
    /// Wraps a device address.
    pub(crate) fn new(addr: u64) -> Self {
        Self(addr, PhantomData)
    }
    /// The null pointer (for arguments a flag marks as absent).
    pub(crate) fn null() -> Self {
        Self(0, PhantomData)
    }
    /// Offset by `elems` elements.
    pub(crate) fn offset(self, elems: usize) -> Self {
        Self(self.0 + (elems * size_of::<T>()) as u64, PhantomData)
    }
}

impl<T> PtrMut<T> {
    /// Wraps a device address.
    pub(crate) fn new(addr: u64) -> Self {
        Self(addr, PhantomData)
    }
    /// The same address as a pointer to `U` (e.g. a `u64` word that holds f64 bits).
    pub(crate) fn cast<U>(self) -> PtrMut<U> {
        PtrMut(self.0, PhantomData)
    }
    /// The null pointer (for arguments a flag marks as absent).
    pub(crate) fn null() -> Self {
        Self(0, PhantomData)
    }
    /// Offset by `elems` elements.
    pub(crate) fn offset(self, elems: usize) -> Self {
        Self(self.0 + (elems * size_of::<T>()) as u64, PhantomData)
    }
}

/// A launch shape: `blocks × threads` (1-D), no dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grid {
    /// Blocks (0: nothing to do, the launch is skipped).
    pub(crate) blocks: u32,
    /// Threads per block.
    pub(crate) threads: u32,
}

impl Grid {
    /// Threads per block of every kernel but the fixed-shape ones.
    pub(crate) const THREADS: u32 = 256;
    /// Warps per block.
    const WARPS: u64 = Self::THREADS as u64 / 32;

    /// One thread per item (grid-stride beyond `max_blocks` blocks).
    pub(crate) fn threads_for(items: u64, max_blocks: u32) -> Self {
        let blocks = items.div_ceil(Self::THREADS as u64).min(max_blocks as u64) as u32;
        Self {
            blocks,
            threads: Self::THREADS,
        }
    }

    /// One warp per item (warp-stride beyond `max_blocks` blocks).
    pub(crate) fn warps_for(items: u64, max_blocks: u32) -> Self {
        let blocks = items.div_ceil(Self::WARPS).min(max_blocks as u64) as u32;
        Self {
            blocks,
            threads: Self::THREADS,
        }
    }

    /// Exactly `blocks` blocks of `threads` threads (kernels with a fixed shape).
    pub(crate) fn exact(blocks: u32, threads: u32) -> Self {
        Self { blocks, threads }
    }
}

/// A loaded function handle (valid while its module is cached by the registry).
#[derive(Clone, Copy, Debug)]
struct RawFunction(sys::CUfunction);

// SAFETY: a CUfunction is an opaque driver handle usable from any thread.
unsafe impl Send for RawFunction {}

/// One backend's kernels: modules loaded into its context, functions by id.
pub(crate) struct Kernels {
    ctx: Arc<CudaContext>,
    cc: (u32, u32),
    max_blocks: u32,
    modules: Mutex<HashMap<Family, Arc<CudaModule>>>,
    functions: Mutex<Vec<Option<RawFunction>>>,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("cc", &self.cc)
            .field("max_blocks", &self.max_blocks)
            .finish_non_exhaustive()
    }
}

impl Kernels {
    /// A registry for `ctx`, compiling for compute capability `cc`; grids are capped
    /// at `max_blocks` blocks.
    pub(crate) fn new(ctx: Arc<CudaContext>, cc: (u32, u32), max_blocks: u32) -> Self {
        Self {
            ctx,
            cc,
            max_blocks: max_blocks.max(1),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(vec![None; KernelId::ALL.len()]),
        }
    }

    /// The grid cap.
    pub(crate) fn max_blocks(&self) -> u32 {
        self.max_blocks
    }

    /// Loads (compiling if needed) every family.
    pub(crate) fn warm_up(&self) -> Result<()> {
        for id in KernelId::ALL {
            self.function(*id)?;
        }
        Ok(())
    }

    fn module(&self, family: Family) -> Result<Arc<CudaModule>> {
        let mut modules = self.modules.lock();
        if let Some(m) = modules.get(&family) {
            return Ok(m.clone());
        }
        let ptx = family_ptx(family, self.cc)?;
        let m = self
            .ctx
            .load_module(ptx)
            .map_err(drv(&format!("cuModuleLoadData {}", family.file())))?;
        modules.insert(family, m.clone());
        Ok(m)
    }

    fn function(&self, id: KernelId) -> Result<sys::CUfunction> {
        let slot = id as usize;
        if let Some(f) = self.functions.lock()[slot] {
            return Ok(f.0);
        }
        let module = self.module(id.family())?;
        let f = module
            .load_function(id.name())
            .map_err(drv(&format!("cuModuleGetFunction {}", id.name())))?;
        let raw = f.cu_function();
        // `module` stays in `self.modules` for the registry's life, so `raw` stays valid.
        self.functions.lock()[slot] = Some(RawFunction(raw));
        Ok(raw)
    }

    /// Launches `id` on `stream` with `params` (pointers to the argument values, in
    /// kernel order; the typed launch arguments in [`launch`] build them).
    fn launch(
        &self,
        id: KernelId,
        grid: Grid,
        stream: sys::CUstream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        if grid.blocks == 0 {
            return Ok(());
        }
        let f = self.function(id)?;
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: `f` is a live function of a module this registry keeps loaded;
        // `params` holds one pointer per kernel parameter, each to a value of the
        // parameter's exact type (the typed launch arguments' fields, checked against the
        // kernel source by `signatures_match_the_sources`), alive for this call (the
        // driver copies them before returning). Device pointers among them come from
        // buffers the caller checked to be long enough for the grid-stride bounds the
        // kernel is given.
        unsafe {
            dresult::launch_kernel(
                f,
                (grid.blocks, 1, 1),
                (grid.threads, 1, 1),
                0,
                stream,
                params,
            )
        }
        // The operation's name is formatted only on failure (not per launch).
        .map_err(|e| drv(&format!("cuLaunchKernel {}", id.name()))(e))
    }
}

/// Declares every kernel: family, name and parameters (name: Rust type). Generates
/// [`KernelId`] and the typed launch arguments in [`launch`].
macro_rules! define_kernels {
    ($( $family:ident { $( $name:ident ( $( $arg:ident : $ty:ty ),* $(,)? ); )* } )*) => {
        /// Every kernel of every family (the variant is the kernel's C name).
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub(crate) enum KernelId { $( $( $name, )* )* }

        impl KernelId {
            /// All kernels, in declaration order.
            pub(crate) const ALL: &'static [KernelId] = &[ $( $( KernelId::$name, )* )* ];

            /// The family (source file) holding the kernel.
            pub(crate) fn family(self) -> Family {
                match self { $( $( KernelId::$name => Family::$family, )* )* }
            }

            /// The kernel's C name.
            pub(crate) fn name(self) -> &'static str {
                match self { $( $( KernelId::$name => stringify!($name), )* )* }
            }

            /// `(parameter name, Rust type)` in order, as declared.
            #[cfg_attr(not(test), allow(dead_code))]
            pub(crate) fn params(self) -> &'static [(&'static str, &'static str)] {
                match self { $( $( KernelId::$name => &[ $( (stringify!($arg), stringify!($ty)), )* ], )* )* }
            }
        }

        /// One struct per kernel, named as the kernel, whose fields are its arguments
        /// by name: `launch::name { arg: value, .. }.launch(kernels, stream, grid)`.
        pub(crate) mod launch {
            #[allow(unused_imports)]
            use super::{Grid, Kernels, KernelId, Ptr, PtrMut};
            use std::ffi::c_void;
            use cudarc::driver::sys::CUstream;
            use crate::error::Result;
            $( $(
                #[doc = concat!("The arguments of `", stringify!($name), "` (", stringify!($family), " family).")]
                #[allow(non_camel_case_types)]
                pub(crate) struct $name {
                    $( pub(crate) $arg: $ty, )*
                }

                impl $name {
                    /// Launches the kernel with these arguments on `stream` over `grid`.
                    pub(crate) fn launch(
                        self,
                        k: &Kernels,
                        stream: CUstream,
                        grid: Grid,
                    ) -> Result<()> {
                        let mut params: [*mut c_void; [$( stringify!($arg) ),*].len()] =
                            [ $( &self.$arg as *const $ty as *mut c_void, )* ];
                        k.launch(KernelId::$name, grid, stream, &mut params)
                    }
                }
            )* )*
        }
    };
}

define_kernels! {
    Math {
        add_bias(x: PtrMut<f32>, bias: Ptr<f32>, rows: u64, cols: u64);
        colsum_partial(x: Ptr<f32>, rows: u64, cols: u64, chunk_rows: u64, w: Ptr<f32>,
                       has_w: u32, w_stride: u64, w_div: u64, partial: PtrMut<f32>);
        colsum_finish(partial: Ptr<f32>, chunks: u64, cols: u64, out: PtrMut<f32>,
                      accumulate: u32);
        widen_bf16(src: Ptr<u16>, n: u64, out: PtrMut<f32>);
        count_nonfinite(x: Ptr<f32>, n: u64, count: PtrMut<u32>);
        scale_in_place(x: PtrMut<f32>, n: u64, alpha: f32);
        relu_forward(x: PtrMut<f32>, n: u64);
        relu_backward(y: Ptr<f32>, dy: PtrMut<f32>, n: u64);
        elu_forward(x: PtrMut<f32>, n: u64, alpha: f32);
        elu_backward(y: Ptr<f32>, dy: PtrMut<f32>, n: u64, alpha: f32);
        dropout_forward(x: PtrMut<f32>, n: u64, threshold: u32, scale: f32, key: u64,
                        mask: PtrMut<u32>);
        dropout_backward(mask: Ptr<u32>, dy: PtrMut<f32>, n: u64, scale: f32);
        bias_act_dropout(x: PtrMut<f32>, bias: Ptr<f32>, rows: u64, cols: u64, act: u32,
                         alpha: f32, has_drop: u32, threshold: u32, scale: f32, key: u64,
                         out: PtrMut<f32>, mask: PtrMut<u32>);
        dropout_act_backward(mask: Ptr<u32>, y: Ptr<f32>, dy: PtrMut<f32>, n: u64, scale: f32,
                             act: u32, alpha: f32);
        act_backward_colsum(mask: Ptr<u32>, has_mask: u32, y: Ptr<f32>, dy: PtrMut<f32>,
                            rows: u64, cols: u64, scale: f32, act: u32, alpha: f32,
                            chunk_rows: u64, partial: PtrMut<f32>, ticket: PtrMut<u32>,
                            out: PtrMut<f32>, accumulate: u32);
        xent_rows(logits: Ptr<f32>, rows: u64, classes: u64, labels: Ptr<u32>,
                  grad: PtrMut<f32>, has_grad: u32, inv_rows: f32, row_loss: PtrMut<f32>,
                  row_correct: PtrMut<u32>, fault: PtrMut<u32>);
        xent_reduce(row_loss: Ptr<f32>, row_correct: Ptr<u32>, rows: u64,
                    out_loss: PtrMut<f64>, out_correct: PtrMut<u64>, guard: PtrMut<u32>);
        adam_step(param: PtrMut<f32>, grad: Ptr<f32>, m: PtrMut<f32>, v: PtrMut<f32>, n: u64,
                  beta1: f32, beta2: f32, one_minus_beta1: f32, one_minus_beta2: f32,
                  eps: f32, weight_decay: f32, step_size: f32, inv_bias2_sqrt: f32);
        adam_multi(table: Ptr<u64>, tensors: u32, total: u64, guard: Ptr<u32>,
                   beta1: f32, beta2: f32, one_minus_beta1: f32, one_minus_beta2: f32,
                   eps: f32, weight_decay: f32, step_size: f32, inv_bias2_sqrt: f32);
    }
    Features {
        gather_rows(slot_map: Ptr<u32>, cache: Ptr<f32>, host_rows: Ptr<f32>, ids: Ptr<u32>,
                    n: u64, num_rows: u64, dim: u64, out: PtrMut<f32>,
                    counters: PtrMut<u64>, fault: PtrMut<u32>);
        cache_evict(slot_map: PtrMut<u32>, ids: Ptr<u32>, n: u64);
        gather_rows_bf16(slot_map: Ptr<u32>, cache: Ptr<u16>, host_rows: Ptr<u16>,
                         ids: Ptr<u32>, n: u64, num_rows: u64, dim: u64, out: PtrMut<f32>,
                         counters: PtrMut<u64>, fault: PtrMut<u32>);
        cache_insert(host_rows: Ptr<f32>, ids: Ptr<u32>, slots: Ptr<u32>, n: u64, dim: u64,
                     cache: PtrMut<f32>, slot_map: PtrMut<u32>);
        cache_insert_bf16(host_rows: Ptr<u16>, ids: Ptr<u32>, slots: Ptr<u32>, n: u64,
                          dim: u64, cache: PtrMut<u16>, slot_map: PtrMut<u32>);
        index_select_rows(src: Ptr<f32>, src_rows: u64, dim: u64, idx: Ptr<u32>, n: u64,
                          out: PtrMut<f32>, fault: PtrMut<u32>);
        index_put_rows(src: Ptr<f32>, dim: u64, idx: Ptr<u32>, n: u64, dst: PtrMut<f32>,
                       dst_rows: u64, fault: PtrMut<u32>);
    }
    Scan {
        scan_u32_tiles(input: Ptr<u32>, n: u64, out: PtrMut<u32>, tile_sums: PtrMut<u32>);
        scan_u32_add(out: PtrMut<u32>, n: u64, tile_offsets: Ptr<u32>);
        scan_u64_tiles(input: Ptr<u64>, n: u64, out: PtrMut<u64>, tile_sums: PtrMut<u64>);
        scan_u64_add(out: PtrMut<u64>, n: u64, tile_offsets: Ptr<u64>);
    }
    Sample {
        sample_count_scan(graph_indptr: Ptr<u64>, num_vertices: u64, frontier: Ptr<u32>,
                          n: u64, live_n: Ptr<u64>, fanout: u32, skip: Ptr<u8>,
                          indptr: PtrMut<u64>, tile_sums: PtrMut<u64>, fault: PtrMut<u32>);
        sample_pick(graph_indptr: Ptr<u64>, graph_indices: Ptr<u32>, num_vertices: u64,
                    frontier: Ptr<u32>, n: u64, live_n: Ptr<u64>, layer_key: u64,
                    block_indptr: Ptr<u64>, positions: PtrMut<u32>, nbrs: PtrMut<u32>);
        unique_insert(a: Ptr<u32>, n_a: u64, live_a: Ptr<u64>, b: Ptr<u32>, n_b: u64,
                      live_b: Ptr<u64>, keys: PtrMut<u32>, min_pos: PtrMut<u32>, cap: u64,
                      slot_of: PtrMut<u32>);
        unique_flag_scan(slot_of: Ptr<u32>, min_pos: Ptr<u32>, n_a: u64, live_a: Ptr<u64>,
                         n_b: u64, live_b: Ptr<u64>, ranks: PtrMut<u32>,
                         tile_sums: PtrMut<u32>);
        unique_scatter(a: Ptr<u32>, n_a: u64, live_a: Ptr<u64>, b: Ptr<u32>, n_b: u64,
                       live_b: Ptr<u64>, slot_of: Ptr<u32>, min_pos: Ptr<u32>,
                       ranks: Ptr<u32>, unique_cap: u64, unique: PtrMut<u32>,
                       local: PtrMut<u32>, counts: PtrMut<u64>);
    }
    Aggregate {
        block_out_degree(indices: Ptr<u32>, num_edges: u64, out_deg: PtrMut<u32>);
        block_src_weight(out_deg: Ptr<u32>, num_src: u64, src_w: PtrMut<f32>);
        aggregate_forward(indptr: Ptr<u64>, indices: Ptr<u32>, src_w: Ptr<f32>, num_dst: u64,
                          dim: u64, kind: u32, x: Ptr<f32>, out: PtrMut<f32>);
        aggregate_backward(indptr: Ptr<u64>, indices: Ptr<u32>, src_w: Ptr<f32>,
                           num_dst: u64, dim: u64, kind: u32, grad_out: Ptr<f32>,
                           grad_x: PtrMut<f32>);
        block_add_self_loops(indptr: Ptr<u64>, indices: Ptr<u32>, num_dst: u64,
                             new_indptr: PtrMut<u64>, new_indices: PtrMut<u32>);
    }
    Attention {
        gat_scores(z: Ptr<f32>, rows: u64, heads: u64, head_dim: u64, a: Ptr<f32>,
                   s: PtrMut<f32>);
        gat_softmax(indptr: Ptr<u64>, indices: Ptr<u32>, num_dst: u64, heads: u64,
                    el: Ptr<f32>, er: Ptr<f32>, alpha: PtrMut<f32>);
        gat_aggregate(indptr: Ptr<u64>, indices: Ptr<u32>, num_dst: u64, heads: u64,
                      head_dim: u64, alpha: Ptr<f32>, z: Ptr<f32>, out: PtrMut<f32>);
        gat_backward_dst(indptr: Ptr<u64>, indices: Ptr<u32>, num_dst: u64, heads: u64,
                         head_dim: u64, z: Ptr<f32>, grad_out: Ptr<f32>, alpha: Ptr<f32>,
                         el: Ptr<f32>, er: Ptr<f32>, du: PtrMut<f32>, der: PtrMut<f32>);
        gat_backward_src(indptr: Ptr<u64>, indices: Ptr<u32>, num_dst: u64, heads: u64,
                         head_dim: u64, alpha: Ptr<f32>, grad_out: Ptr<f32>, du: Ptr<f32>,
                         gz: PtrMut<f32>, del: PtrMut<f32>);
        gat_backward_finish(gz: PtrMut<f32>, del: Ptr<f32>, der: Ptr<f32>, a_src: Ptr<f32>,
                            a_dst: Ptr<f32>, num_src: u64, num_dst: u64, heads: u64,
                            head_dim: u64);
    }
    Link {
        pair_dot(h: Ptr<f32>, rows: u64, dim: u64, src: Ptr<u32>, dst: Ptr<u32>, n: u64,
                 out: PtrMut<f32>, fault: PtrMut<u32>);
        pair_dot_backward(h: Ptr<f32>, rows: u64, dim: u64, src: Ptr<u32>, dst: Ptr<u32>,
                          n: u64, dscore: Ptr<f32>, dh: PtrMut<f32>, fault: PtrMut<u32>);
        pair_hadamard(h: Ptr<f32>, rows: u64, dim: u64, src: Ptr<u32>, dst: Ptr<u32>, n: u64,
                      out: PtrMut<f32>, fault: PtrMut<u32>);
        pair_hadamard_backward(h: Ptr<f32>, rows: u64, dim: u64, src: Ptr<u32>, dst: Ptr<u32>,
                               n: u64, dz: Ptr<f32>, dh: PtrMut<f32>, fault: PtrMut<u32>);
        bce_rows(logits: Ptr<f32>, labels: Ptr<f32>, n: u64, grad: PtrMut<f32>, has_grad: u32,
                 inv_n: f32, row_loss: PtrMut<f32>, row_correct: PtrMut<u32>);
        negative_draw(src: Ptr<u32>, n_pos: u64, k: u64, key: u64, num_vertices: u64,
                      cdf: Ptr<u64>, has_cdf: u32, out_src: PtrMut<u32>, out_dst: PtrMut<u32>);
        exclude_flag(indptr: Ptr<u64>, indices: Ptr<u32>, num_dst: u64, src_ids: Ptr<u32>,
                     keys: Ptr<u64>, n_keys: u64, flags: PtrMut<u32>);
        exclude_compact(indptr: Ptr<u64>, indices: Ptr<u32>, num_dst: u64, num_edges: u64,
                        pos: Ptr<u32>, new_indptr: PtrMut<u64>, new_indices: PtrMut<u32>);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(name, [(param name, normalized type)])` of every `extern "C" __global__` in
    /// `source`; types normalized to the Rust spelling (`Ptr<f32>`, `PtrMut<u32>`,
    /// `u64`, ...).
    fn parse_kernels(source: &str) -> Vec<(String, Vec<(String, String)>)> {
        const MARK: &str = "extern \"C\" __global__ void ";
        let mut out = Vec::new();
        let mut rest = source;
        while let Some(at) = rest.find(MARK) {
            let mut after = &rest[at + MARK.len()..];
            // `__launch_bounds__(N)` may stand between `void` and the name.
            if let Some(b) = after.strip_prefix("__launch_bounds__(") {
                let close = b.find(')').expect("unclosed __launch_bounds__");
                after = b[close + 1..].trim_start();
            }
            let open = after.find('(').expect("kernel without a parameter list");
            let name = after[..open].trim().to_string();
            let close = after.find(')').expect("unclosed parameter list");
            let params = after[open + 1..close]
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let is_const = p.starts_with("const ");
                    let p = p.trim_start_matches("const ");
                    let is_ptr = p.contains('*');
                    let p = p.replace('*', " ");
                    let mut words: Vec<&str> = p.split_whitespace().collect();
                    let pname = words.pop().expect("parameter without a name").to_string();
                    let base = match words.join(" ").as_str() {
                        "float" => "f32",
                        "double" => "f64",
                        "u8" => "u8",
                        "u16" => "u16",
                        "u32" => "u32",
                        "u64" => "u64",
                        other => panic!("kernel {name}: unsupported parameter type `{other}`"),
                    };
                    let ty = match (is_ptr, is_const) {
                        (true, true) => format!("Ptr<{base}>"),
                        (true, false) => format!("PtrMut<{base}>"),
                        (false, _) => base.to_string(),
                    };
                    (pname, ty)
                })
                .collect();
            out.push((name, params));
            rest = &after[close..];
        }
        out
    }

    #[test]
    fn signatures_match_the_sources() {
        let mut declared: Vec<&str> = KernelId::ALL.iter().map(|k| k.name()).collect();
        declared.sort_unstable();
        let mut found = Vec::new();
        for family in Family::ALL {
            for (name, params) in parse_kernels(family.raw_source()) {
                let id = KernelId::ALL
                    .iter()
                    .find(|k| k.name() == name)
                    .unwrap_or_else(|| {
                        panic!("{}: kernel `{name}` is not declared", family.file())
                    });
                assert_eq!(
                    id.family(),
                    family,
                    "kernel `{name}` declared in the wrong family"
                );
                let want: Vec<(String, String)> = id
                    .params()
                    .iter()
                    .map(|(n, t)| (n.to_string(), t.replace(' ', "")))
                    .collect();
                assert_eq!(params, want, "kernel `{name}`: source vs declaration");
                found.push(name);
            }
        }
        found.sort_unstable();
        let found: Vec<&str> = found.iter().map(String::as_str).collect();
        assert_eq!(found, declared, "declared kernels missing from the sources");
    }

    #[test]
    fn expanded_sources_keep_line_numbers() {
        let src = "// a\n#include \"common.cuh\"\nint x;\n";
        let out = expand_source("t.cu", src);
        assert!(out.contains("#line 1 \"common.cuh\""));
        assert!(out.contains("typedef unsigned int u32;"));
        // The include was line 2 of t.cu, so `int x;` stays line 3.
        assert!(out.contains("#line 2 \"t.cu\"\n\nint x;"), "{out}");
        assert!(!out.lines().any(|l| l.trim_start().starts_with("#include")));
    }

    #[test]
    fn grids_cover_the_work_and_skip_empty_launches() {
        assert_eq!(Grid::threads_for(0, 100).blocks, 0);
        assert_eq!(Grid::warps_for(0, 100).blocks, 0);
        assert_eq!(Grid::threads_for(1, 100).blocks, 1);
        assert_eq!(Grid::threads_for(257, 100).blocks, 2);
        assert_eq!(Grid::threads_for(1 << 40, 100).blocks, 100);
        assert_eq!(Grid::warps_for(8, 100).blocks, 1);
        assert_eq!(Grid::warps_for(9, 100).blocks, 2);
        assert_eq!(Grid::warps_for(u64::MAX, 7).blocks, 7);
    }
}
