//! The accelerator interface: one [`Backend`] trait made of op families, two
//! backends (`host`, `cuda`).
//!
//! # Families
//! [`DeviceCore`] is the base: the backend's handle types (`Buf<T>`, `Pinned<T>`,
//! `Stream`, `Event`, `Graph`, `Block`, `Features`, `Mask`), identity, settings,
//! streams and events. The others extend it: [`DeviceMemory`] (allocation and
//! copies), [`Sampling`] (topology, sampling, blocks), [`FeatureStore`] (feature
//! cache, gather, row selection), [`DenseOps`] (matrix products, activations, loss,
//! optimizer), [`GraphOps`] (aggregation, GAT) and [`SparseOps`] (sparse input
//! rows and their products). [`Backend`] is all of them, so generic code bounds on
//! `B: Backend` alone.
//!
//! # Contract
//! 1. **Streams.** Every op below runs on the backend's *compute stream*
//!    ([`DeviceCore::stream`]) in call order. Copies ([`DeviceMemory::upload`],
//!    [`DeviceMemory::download`]) name their stream, so a copy stream can overlap compute;
//!    order across streams with [`DeviceCore::record_event`] + [`DeviceCore::wait_event`].
//!    A host thread waits for one point of a stream with [`DeviceCore::wait_host`]
//!    on its event, e.g. for an asynchronous [`DeviceMemory::download_pinned`]
//!    issued by another thread.
//!    On the host backend every op completes before it returns (streams and events
//!    only keep time), which trivially satisfies every ordering obligation.
//! 2. **Shapes.** Matrices are row-major `f32`. An op reads the *prefix* of a buffer
//!    its shape arguments describe (`rows × cols` elements) and writes the prefix of
//!    its output, so a buffer may be longer than the op needs (buffers are reused
//!    across batches) and "the first `n_dst` rows" of a matrix is the same buffer with
//!    a smaller row count. A buffer shorter than required is a
//!    [`GpuOpsError::SizeMismatch`], never an out-of-bounds access.
//! 3. **Results** that the host needs (loss, counts) are returned by value: such an
//!    op synchronizes the compute stream.
//! 4. **Determinism.** The host backend is bit-deterministic for a seed. The CUDA
//!    backend is deterministic except where it says so (atomics in backward
//!    aggregation sum in any order); sampling and dropout use their own counter-based
//!    generators, so they agree with the host backend in distribution, not bit by bit.
//! 5. **Layer-based orchestration.** Two ops let a runtime mix CPU-computed
//!    embeddings into a device batch without a host round trip:
//!    [`Sampling::sample_hop`] samples a batch one hop at a time from destinations
//!    already on the device (hop by hop with `derive_seed(seed, l)` it reproduces
//!    [`Sampling::sample`]), with a skip mask for the destinations whose embedding
//!    comes from a CPU-computed table: they get no neighbors, so the device neither
//!    gathers nor aggregates their neighborhoods. [`DeviceMemory::upload_pinned_at`] copies
//!    those rows from pinned staging memory into their offset of a device buffer on a
//!    copy stream. The layers above the bottom are sampled ahead, a group of batches
//!    at a time, with [`Sampling::sample_queued_from`] (layer `l` still drawn with
//!    `derive_seed(seed, l)`), and [`Sampling::read_queued`] /
//!    [`Sampling::finish_read`] bring their sizes and bottom ids to the host with one
//!    synchronization, which another thread may wait for.

use std::fmt;
use std::sync::Arc;

use cpu_ops::{AggregateKind, CsrGraph, FeatureMatrix, SparseRows};

use crate::error::{GpuOpsError, Result};
pub use crate::kind::DeviceKind;

/// A hidden layer's activation, for the fused ops
/// ([`DenseOps::bias_act_dropout`], [`DenseOps::dropout_act_backward`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// [`DenseOps::relu`].
    Relu,
    /// [`DenseOps::elu`] with this `alpha`.
    Elu {
        /// ELU's `alpha` (finite, > 0).
        alpha: f32,
    },
}

/// The arithmetic of a backend's matrix products ([`DenseOps::matmul`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum Precision {
    /// IEEE single precision throughout.
    #[default]
    Fp32,
    /// TF32 products: the inputs rounded to 10 mantissa bits (nearest, ties to
    /// even), accumulation in fp32. CUDA: cuBLAS's `CUBLAS_TF32_TENSOR_OP_MATH`
    /// (tensor cores); host: the same rounding of the inputs before an fp32
    /// product, so that accuracy can be checked without a GPU.
    Tf32,
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Fp32 => "fp32",
            Self::Tf32 => "tf32",
        })
    }
}

/// `x` rounded to TF32 (10 explicit mantissa bits; nearest, ties to even), kept
/// in an `f32`. Infinities and NaN pass unchanged; a value that rounds past the
/// largest finite TF32 becomes infinite, as on the GPU.
pub fn round_to_tf32(x: f32) -> f32 {
    let bits = x.to_bits();
    if bits & 0x7F80_0000 == 0x7F80_0000 {
        return x;
    }
    // 13 mantissa bits go: add half of the last kept bit, less one unless that
    // bit is odd (ties to even), then clear them.
    let lsb = (bits >> 13) & 1;
    f32::from_bits(bits.wrapping_add(0x0FFF + lsb) & !0x1FFF)
}

/// How a backend stores feature rows ([`FeatureStore::load_features`]): the device
/// cache and the host rows it misses to. A gather always writes `f32` rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum FeatureDtype {
    /// IEEE single precision (4 bytes a value).
    #[default]
    F32,
    /// bfloat16 (2 bytes a value: `f32`'s exponent, 7 explicit mantissa bits;
    /// each value rounded to nearest, ties to even, when the features load). A
    /// gather reads half the bytes and widens to `f32` exactly; the device cache
    /// holds twice the rows for the same budget.
    Bf16,
}

impl FeatureDtype {
    /// Bytes of one stored value.
    pub fn value_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 => 2,
        }
    }
}

impl fmt::Display for FeatureDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        })
    }
}

/// `x` as bfloat16 bits: the upper 16 bits of `x` rounded to nearest, ties to
/// even. NaN stays NaN (quiet); a value that rounds past the largest finite
/// bfloat16 becomes infinite, as CUDA's `__float2bfloat16_rn` does.
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x0040) as u16;
    }
    let lsb = (bits >> 16) & 1;
    (bits.wrapping_add(0x7FFF + lsb) >> 16) as u16
}

/// The `f32` of bfloat16 bits `b` (exact).
pub fn bf16_bits_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Every value of `x` as bfloat16 bits ([`f32_to_bf16_bits`]), converted in
/// parallel.
pub fn to_bf16_bits(x: &[f32]) -> Vec<u16> {
    use rayon::prelude::*;
    x.par_iter().map(|&v| f32_to_bf16_bits(v)).collect()
}

/// `x` rounded to bfloat16 and widened back ([`f32_to_bf16_bits`]).
pub fn round_to_bf16(x: f32) -> f32 {
    bf16_bits_to_f32(f32_to_bf16_bits(x))
}

/// What every backend's [`Sampling::sample_queued_from`] checks of its
/// layers: at least one, `from` below their count, and no zero fanout from
/// layer `from` on.
pub(crate) fn check_fanouts_from(fanouts: &[u32], from: usize) -> Result<()> {
    use crate::error::GpuOpsError;
    if fanouts.is_empty() {
        return Err(GpuOpsError::InvalidArgument {
            name: "fanouts",
            reason: "at least one layer is needed".into(),
        });
    }
    if from >= fanouts.len() {
        return Err(GpuOpsError::InvalidArgument {
            name: "from",
            reason: format!(
                "layer {from} is not below the {} layers of the fanouts",
                fanouts.len()
            ),
        });
    }
    if let Some(l) = (from..fanouts.len()).find(|&l| fanouts[l] == 0) {
        return Err(GpuOpsError::InvalidArgument {
            name: "fanouts",
            reason: format!(
                "the fanout of layer {l} is 0; use ALL_NEIGHBORS ({}) to take every neighbor",
                cpu_ops::ALL_NEIGHBORS
            ),
        });
    }
    Ok(())
}

/// [`DenseOps::count_nonfinite`]'s bound on `n` (its count is 32 bits).
pub(crate) fn check_count_len(n: usize) -> Result<()> {
    if n > u32::MAX as usize {
        return Err(crate::error::GpuOpsError::InvalidArgument {
            name: "n",
            reason: format!("count_nonfinite counts below 2^32 values; got {n}"),
        });
    }
    Ok(())
}

/// Element types a device buffer may hold.
///
/// Sealed: implemented for `f32`, `u32`, `u64`, `u16` (bfloat16 bits) and `u8`.
pub trait Elem: bytemuck::Pod + Default + Send + Sync + fmt::Debug + sealed::Sealed {}

impl Elem for f32 {}
impl Elem for u32 {}
impl Elem for u64 {}
impl Elem for u16 {}
impl Elem for u8 {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
    impl Sealed for u16 {}
    impl Sealed for u8 {}
}

/// Device memory, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Free now.
    pub free: usize,
    /// Total.
    pub total: usize,
}

/// Where a graph's topology lives for device-side sampling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum TopologyPlacement {
    /// Copied into device memory (fastest; costs `8(n+1) + 4m` bytes).
    #[default]
    Device,
    /// Left in (pinned) host memory and read zero-copy over the bus: large graphs.
    PinnedHost,
}

/// Hit and miss counts of a [`FeatureStore::gather`] through the feature cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Rows served from the device cache.
    pub hits: u64,
    /// Rows read from host memory.
    pub misses: u64,
    /// Rows held in the cache now.
    pub cached_rows: usize,
    /// Bytes the cached rows occupy (never above `budget_bytes`).
    pub cached_bytes: usize,
    /// The cache's byte budget.
    pub budget_bytes: usize,
}

impl CacheStats {
    /// `hits / (hits + misses)`, 0 when nothing was gathered.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// Host↔device copies made through a backend (per instance, since it was made):
/// uploads (including blocks built from host CSR), downloads (including
/// `block_to_host` and the asynchronous [`DeviceMemory::download_pinned`]), and
/// host-blocking synchronizations (the host backend counts downloads and
/// [`DeviceCore::synchronize`]; CUDA every stream synchronization, including
/// those inside ops that read a count or a loss back). A host wait on an event
/// ([`DeviceCore::wait_host`]) is counted apart, in `event_waits`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Host → device copies.
    pub uploads: u64,
    /// Bytes they moved.
    pub upload_bytes: u64,
    /// Device → host copies.
    pub downloads: u64,
    /// Bytes they moved.
    pub download_bytes: u64,
    /// Times the host waited for the device.
    pub syncs: u64,
    /// Times a host thread waited for an event ([`DeviceCore::wait_host`]; not
    /// in `syncs`: e.g. a CPU worker waiting for weights the accelerator thread
    /// published without waiting).
    pub event_waits: u64,
    /// Buffers zero-filled when allocated ([`DeviceMemory::alloc`]; on CUDA every
    /// zeroed pool allocation, ops' own included: one memset each, which a
    /// per-kernel profile does not show).
    pub zero_fills: u64,
}

impl TransferStats {
    /// `self − earlier`, field by field (saturating).
    pub fn since(&self, earlier: &TransferStats) -> TransferStats {
        TransferStats {
            uploads: self.uploads.saturating_sub(earlier.uploads),
            upload_bytes: self.upload_bytes.saturating_sub(earlier.upload_bytes),
            downloads: self.downloads.saturating_sub(earlier.downloads),
            download_bytes: self.download_bytes.saturating_sub(earlier.download_bytes),
            syncs: self.syncs.saturating_sub(earlier.syncs),
            event_waits: self.event_waits.saturating_sub(earlier.event_waits),
            zero_fills: self.zero_fills.saturating_sub(earlier.zero_fills),
        }
    }

    /// `self + other`, field by field (saturating): e.g. a backend and its
    /// [`Sampling::sampling_sibling`] together.
    pub fn plus(&self, other: &TransferStats) -> TransferStats {
        TransferStats {
            uploads: self.uploads.saturating_add(other.uploads),
            upload_bytes: self.upload_bytes.saturating_add(other.upload_bytes),
            downloads: self.downloads.saturating_add(other.downloads),
            download_bytes: self.download_bytes.saturating_add(other.download_bytes),
            syncs: self.syncs.saturating_add(other.syncs),
            event_waits: self.event_waits.saturating_add(other.event_waits),
            zero_fills: self.zero_fills.saturating_add(other.zero_fills),
        }
    }
}

/// The counters behind [`TransferStats`], shared by the backends (lock-free).
#[derive(Debug, Default)]
pub(crate) struct TransferCounter {
    uploads: std::sync::atomic::AtomicU64,
    upload_bytes: std::sync::atomic::AtomicU64,
    downloads: std::sync::atomic::AtomicU64,
    download_bytes: std::sync::atomic::AtomicU64,
    syncs: std::sync::atomic::AtomicU64,
    event_waits: std::sync::atomic::AtomicU64,
    zero_fills: std::sync::atomic::AtomicU64,
}

impl TransferCounter {
    /// Counts one upload of `bytes`.
    pub(crate) fn upload(&self, bytes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.uploads.fetch_add(1, Relaxed);
        self.upload_bytes.fetch_add(bytes as u64, Relaxed);
    }

    /// Counts one download of `bytes`.
    pub(crate) fn download(&self, bytes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.downloads.fetch_add(1, Relaxed);
        self.download_bytes.fetch_add(bytes as u64, Relaxed);
    }

    /// Counts one host-blocking synchronization.
    pub(crate) fn sync(&self) {
        self.syncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts one host wait on an event.
    pub(crate) fn event_wait(&self) {
        self.event_waits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts one zero-filled allocation.
    pub(crate) fn zero_fill(&self) {
        self.zero_fills
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The counts so far.
    pub(crate) fn get(&self) -> TransferStats {
        use std::sync::atomic::Ordering::Relaxed;
        TransferStats {
            uploads: self.uploads.load(Relaxed),
            upload_bytes: self.upload_bytes.load(Relaxed),
            downloads: self.downloads.load(Relaxed),
            download_bytes: self.download_bytes.load(Relaxed),
            syncs: self.syncs.load(Relaxed),
            event_waits: self.event_waits.load(Relaxed),
            zero_fills: self.zero_fills.load(Relaxed),
        }
    }
}

/// Adam's hyper-parameters and step for one [`DenseOps::adam_step`] (PyTorch's
/// `Adam` with L2 weight decay: `g ← g + λθ`, bias-corrected moments).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator term.
    pub eps: f32,
    /// L2 weight decay `λ`.
    pub weight_decay: f32,
    /// The step number, starting at 1 (bias correction uses it).
    pub step: u64,
}

/// A row-major `rows × cols` matrix: the first `rows · cols` values of a device
/// buffer, read as stored or transposed ([`DevMat::t`]). The operands of
/// [`DenseOps::matmul`], which take their shapes and transposes from it.
pub struct DevMat<'a, B: DeviceCore> {
    buf: &'a B::Buf<f32>,
    rows: usize,
    cols: usize,
    trans: bool,
}

impl<B: DeviceCore> Clone for DevMat<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: DeviceCore> Copy for DevMat<'_, B> {}

impl<'a, B: DeviceCore> DevMat<'a, B> {
    /// `buf` read as `rows × cols`, row-major.
    pub fn new(buf: &'a B::Buf<f32>, rows: usize, cols: usize) -> Self {
        Self {
            buf,
            rows,
            cols,
            trans: false,
        }
    }

    /// The transpose (`cols × rows`), without moving data.
    pub fn t(self) -> Self {
        Self {
            trans: !self.trans,
            ..self
        }
    }

    /// `(rows, cols)` as read (after any transpose).
    pub fn shape(&self) -> (usize, usize) {
        if self.trans {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }

    /// The buffer, holding the matrix as stored (row-major, before any transpose).
    pub fn buf(&self) -> &'a B::Buf<f32> {
        self.buf
    }

    /// Whether the matrix is read transposed: the buffer holds its transpose.
    pub fn is_transposed(&self) -> bool {
        self.trans
    }

    /// `(m, n, k)` of the product `self · rhs`: `self` read as `m × k`, `rhs` as
    /// `k × n`. Errors: the columns of `self` differ from the rows of `rhs`
    /// ([`GpuOpsError::SizeMismatch`]).
    pub fn product_dims(&self, rhs: &DevMat<'_, B>) -> Result<(usize, usize, usize)> {
        let ((m, k), (kb, n)) = (self.shape(), rhs.shape());
        if k != kb {
            return Err(GpuOpsError::SizeMismatch {
                what: "matmul: rows of the right operand (the left one's columns)",
                expected: k,
                found: kb,
            });
        }
        Ok((m, n, k))
    }
}

/// How a hidden layer's output gradient goes back through its epilogue
/// ([`DenseOps::act_backward_bias_grad`]): through the dropout of the layer
/// above when `mask` is given, then through `act`, whose output was `y`.
pub struct ActBackward<'a, B: DeviceCore> {
    /// The dropout mask of the layer above (applied to this layer's output), if any.
    pub mask: Option<&'a B::Mask>,
    /// The activation's output, as many values as the gradient.
    pub y: &'a B::Buf<f32>,
    /// The activation.
    pub act: Activation,
}

/// The inputs of a softmax cross-entropy: `logits` (`rows × classes`, row-major)
/// against `labels` (one class per row). What
/// [`DenseOps::softmax_cross_entropy_deferred`] reads.
pub struct XentInputs<'a, B: DeviceCore> {
    /// The logits, `rows × classes` values.
    pub logits: &'a B::Buf<f32>,
    /// Number of rows.
    pub rows: usize,
    /// Number of classes (at least 1 when `rows > 0`).
    pub classes: usize,
    /// The label of each row, below `classes`.
    pub labels: &'a B::Buf<u32>,
}

/// Where a deferred loss goes: words `2·slot` and `2·slot + 1` of `out` (the
/// f64 bits of the loss sum, then the correct count), read batches later
/// ([`DenseOps::softmax_cross_entropy_deferred`]).
pub struct LossSlot<'a, B: DeviceCore> {
    /// The slot words, at least `2·slot + 2`.
    pub out: &'a mut B::Buf<u64>,
    /// Which slot of `out` this batch writes.
    pub slot: usize,
}

/// The tensors of a whole-model Adam update ([`DenseOps::adam_step_all`]):
/// tensor `i` is `params[i][..lens[i]]`, its gradient `grads[i]` and its
/// moments `m[i]`, `v[i]`; the five slices have one entry per tensor.
pub struct AdamTensors<'a, B: DeviceCore> {
    /// The parameters, updated in place.
    pub params: &'a mut [B::Buf<f32>],
    /// Their gradients.
    pub grads: &'a [B::Buf<f32>],
    /// First moments, updated in place.
    pub m: &'a mut [B::Buf<f32>],
    /// Second moments, updated in place.
    pub v: &'a mut [B::Buf<f32>],
    /// The length of each tensor.
    pub lens: &'a [usize],
}

impl<B: DeviceCore> AdamTensors<'_, B> {
    /// The number of tensors, or [`GpuOpsError::InvalidArgument`] when the
    /// slices disagree on it.
    pub fn count(&self) -> Result<usize> {
        let t = self.lens.len();
        let (p, g, m, v) = (
            self.params.len(),
            self.grads.len(),
            self.m.len(),
            self.v.len(),
        );
        if p != t || g != t || m != t || v != t {
            return Err(GpuOpsError::InvalidArgument {
                name: "adam_step_all",
                reason: format!(
                    "{p} parameters, {g} gradients, {m} first and {v} second moments for {t} lengths"
                ),
            });
        }
        Ok(t)
    }
}

/// Mean loss and correct count of [`DenseOps::softmax_cross_entropy`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossStats {
    /// Mean cross-entropy over the rows.
    pub loss: f64,
    /// Rows whose arg-max equals the label.
    pub correct: usize,
}

/// A sampled mini-batch on a device: blocks bottom first (block `l` feeds layer `l`),
/// as [`cpu_ops::SampledBatch`] lays them out.
pub struct DeviceBatch<B: DeviceCore> {
    /// The blocks, bottom first; block `l`'s destinations are block `l+1`'s sources,
    /// and the last block's destinations are the seeds.
    pub blocks: Vec<B::Block>,
    /// Global ids of each block's sources (`src_ids[l]` has `num_src(blocks[l])`
    /// entries, destinations first). `src_ids[0]` are the rows to gather.
    pub src_ids: Vec<B::Buf<u32>>,
    /// Number of seeds.
    pub num_seeds: usize,
}

/// The inputs of a GAT attention layer on one block, on a device: `heads` heads
/// of width `head_dim` and the buffers they are read from
/// ([`cpu_ops::GatInputs`]' shapes, as prefixes of the buffers). What
/// [`GraphOps::gat_forward`] and [`GraphOps::gat_backward`] read.
pub struct GatInputsDev<'a, B: DeviceCore> {
    /// Number of heads `H` (at least 1).
    pub heads: usize,
    /// Width `F` of each head (at least 1).
    pub head_dim: usize,
    /// Projected source features, `num_src × H·F`, row-major.
    pub z_src: &'a B::Buf<f32>,
    /// Source attention vectors, `H × F`.
    pub a_src: &'a B::Buf<f32>,
    /// Destination attention vectors, `H × F`.
    pub a_dst: &'a B::Buf<f32>,
}

/// Saved state of [`GraphOps::gat_forward`], consumed by [`GraphOps::gat_backward`].
pub struct GatSaved<B: DeviceCore> {
    /// Attention output, `num_dst × heads·head_dim`.
    pub out: B::Buf<f32>,
    /// Per-edge, per-head attention weights, `num_edges × heads`.
    pub alpha: B::Buf<f32>,
    /// Source scores `a_src · z_j`, `num_src × heads`.
    pub el: B::Buf<f32>,
    /// Destination scores `a_dst · z_i`, `num_dst × heads`.
    pub er: B::Buf<f32>,
}

/// Gradients of [`GraphOps::gat_backward`].
pub struct GatGradsDev<B: DeviceCore> {
    /// `∂L/∂z_src`, `num_src × heads·head_dim`.
    pub z_src: B::Buf<f32>,
    /// `∂L/∂a_src`, `heads × head_dim`.
    pub a_src: B::Buf<f32>,
    /// `∂L/∂a_dst`, `heads × head_dim`.
    pub a_dst: B::Buf<f32>,
}

/// The base of every op family: a backend's handle types, its identity and
/// settings, and its streams and events.
///
/// Every other family ([`DeviceMemory`], [`Sampling`], [`FeatureStore`],
/// [`DenseOps`], [`GraphOps`]) extends it, and [`Backend`] is all of them.
/// Implemented by [`crate::HostBackend`] and [`crate::CudaBackend`].
pub trait DeviceCore: Send + Sync + Sized + 'static {
    /// A buffer of `T` in device memory.
    type Buf<T: Elem>: Send + Sync;
    /// Page-locked host memory the device reads and writes directly.
    type Pinned<T: Elem>: Send + Sync;
    /// An ordered queue of work.
    type Stream: Send + Sync;
    /// A point in a stream, for ordering and timing.
    type Event: Send + Sync;
    /// Topology ready for [`Sampling::sample`].
    type Graph: Send + Sync;
    /// A block (message-flow graph) ready for aggregation, forward and backward.
    type Block: Send + Sync;
    /// Vertex features: a device row cache with a byte budget in front of host rows.
    type Features: Send + Sync;
    /// A dropout mask.
    type Mask: Send + Sync;

    // ---- identity -------------------------------------------------------------
    /// Which backend this is.
    fn kind(&self) -> DeviceKind;
    /// One line naming the device (model, memory, compute capability or SIMD level).
    fn describe(&self) -> String;
    /// Free and total device memory.
    fn memory_info(&self) -> Result<MemoryInfo>;
    /// Copies and synchronizations so far ([`TransferStats`]).
    fn transfer_stats(&self) -> TransferStats;
    /// Sets the arithmetic of this backend's later [`DenseOps::matmul`] calls
    /// (this instance only).
    fn set_precision(&self, precision: Precision) -> Result<()>;
    /// The arithmetic of [`DenseOps::matmul`] now.
    fn precision(&self) -> Precision;

    // ---- streams and events ---------------------------------------------------
    /// The compute stream every op runs on.
    fn stream(&self) -> &Self::Stream;
    /// A new stream (for copies that overlap compute).
    fn new_stream(&self) -> Result<Self::Stream>;
    /// Records an event at the current end of `stream`.
    fn record_event(&self, stream: &Self::Stream) -> Result<Self::Event>;
    /// Makes later work on `stream` wait for `event`.
    fn wait_event(&self, stream: &Self::Stream, event: &Self::Event) -> Result<()>;
    /// Milliseconds between two completed events.
    fn elapsed_ms(&self, start: &Self::Event, end: &Self::Event) -> Result<f32>;
    /// Blocks until all work on `stream` is done.
    fn synchronize(&self, stream: &Self::Stream) -> Result<()>;
    /// Blocks the calling thread until the work before `event` on its stream is
    /// done, e.g. a CPU worker waiting for a [`DeviceMemory::download_pinned`]
    /// that the thread issuing device work recorded `event` after. Counted in
    /// [`TransferStats::event_waits`], not in `syncs`. Only the event's own
    /// error is returned: device faults (the CUDA backend's fault word) and
    /// errors kept from `Drop` stay for the next [`DeviceCore::synchronize`] of
    /// the stream, on the thread that issues its work. The host backend returns
    /// at once (its work completed before the event was recorded).
    fn wait_host(&self, event: &Self::Event) -> Result<()>;
}

/// Device memory: allocation, pinned host buffers, and copies between host and
/// device (ordered on a named stream) and within the device.
pub trait DeviceMemory: DeviceCore {
    /// A zeroed buffer of `len` elements (from the caching allocator on CUDA).
    fn alloc<T: Elem>(&self, len: usize) -> Result<Self::Buf<T>>;
    /// A buffer of `len` elements whose contents are unspecified: for outputs
    /// the next op overwrites (on CUDA no memset; the host backend fills it with
    /// `0xFF` bytes, NaN for `f32`, so a read before that write shows in tests).
    fn alloc_uninit<T: Elem>(&self, len: usize) -> Result<Self::Buf<T>>;
    /// Number of elements of `buf`.
    fn len<T: Elem>(&self, buf: &Self::Buf<T>) -> usize;
    /// A zeroed pinned host buffer of `len` elements.
    fn alloc_pinned<T: Elem>(&self, len: usize) -> Result<Self::Pinned<T>>;
    /// The host view of a pinned buffer.
    fn pinned_slice<'a, T: Elem>(&self, p: &'a Self::Pinned<T>) -> &'a [T];
    /// The mutable host view of a pinned buffer (the caller must not write while a
    /// copy from it is in flight: synchronize its stream first).
    fn pinned_slice_mut<'a, T: Elem>(&self, p: &'a mut Self::Pinned<T>) -> &'a mut [T];
    /// Host → device: `dst[..src.len()] = src`, ordered on `stream`.
    fn upload<T: Elem>(
        &self,
        stream: &Self::Stream,
        src: &[T],
        dst: &mut Self::Buf<T>,
    ) -> Result<()>;
    /// Pinned host → device, `dst[..src.len()] = src`, asynchronous on `stream`;
    /// the ordering obligations of [`DeviceMemory::upload_pinned_at`].
    fn upload_pinned<T: Elem>(
        &self,
        stream: &Self::Stream,
        src: &Self::Pinned<T>,
        dst: &mut Self::Buf<T>,
    ) -> Result<()>;
    /// Pinned host → device into a slice of a larger buffer:
    /// `dst[offset..offset + n] = src[..n]`, asynchronous on `stream` (e.g. rows a CPU
    /// worker computed, staged in pinned memory, placed at their row offset in a
    /// device-side table on a copy stream while compute runs).
    ///
    /// Ordering obligations (the same as [`DeviceMemory::upload_pinned`]'s):
    /// 1. The copy runs after earlier work on `stream` (on CUDA also after `dst`'s
    ///    allocation and zeroing, whatever stream it is).
    /// 2. Work on another stream that reads `dst[offset..offset + n]` must wait for
    ///    the copy: [`DeviceCore::record_event`] on `stream`, [`DeviceCore::wait_event`] on
    ///    the reader's stream.
    /// 3. Work on another stream that may still read or write that range must be
    ///    ordered before the copy the same way (its event waited for on `stream`).
    ///    Copies into disjoint ranges of one buffer need no ordering among themselves.
    /// 4. The host must not write `src[..n]` until the copy is done: synchronize
    ///    `stream`, or take [`DeviceMemory::pinned_slice_mut`], which on CUDA waits for the
    ///    last copy issued out of `src` (one event per pinned buffer: when copies from
    ///    one pinned buffer go to several streams, synchronize the others first).
    ///
    /// `n` beyond `src`'s length or `offset + n` beyond `dst`'s (also for `n = 0`,
    /// which copies nothing) is a
    /// [`GpuOpsError::SizeMismatch`](crate::GpuOpsError::SizeMismatch).
    fn upload_pinned_at<T: Elem>(
        &self,
        stream: &Self::Stream,
        src: &Self::Pinned<T>,
        n: usize,
        dst: &mut Self::Buf<T>,
        offset: usize,
    ) -> Result<()>;
    /// Device → host: `dst = src[..dst.len()]`; returns when the copy is done.
    fn download<T: Elem>(
        &self,
        stream: &Self::Stream,
        src: &Self::Buf<T>,
        dst: &mut [T],
    ) -> Result<()>;
    /// Device → pinned host, `dst[..n] = src[..n]`, asynchronous on `stream`:
    /// the call returns without waiting for the device (no synchronization; one
    /// download in [`TransferStats`]). E.g. a parameter snapshot that the thread
    /// issuing training steps hands to CPU workers without waiting for the
    /// batches queued before it.
    ///
    /// Ordering obligations:
    /// 1. The copy reads `src[..n]` after earlier work on `stream` (on CUDA also
    ///    after `src`'s allocation and zeroing, whatever stream it is), and later
    ///    work on `stream` runs after it: an op that overwrites `src` on the same
    ///    stream afterwards (an optimizer step on the compute stream) does not
    ///    change what the copy reads.
    /// 2. Work on another stream that writes `src[..n]` must be ordered around the
    ///    copy through events, both ways: its event waited for on `stream` before
    ///    the call, or an event recorded on `stream` after the call waited for on
    ///    its stream. On a stream other than the compute stream `src` must also
    ///    outlive the copy (a dropped CUDA buffer's memory is reused in the compute
    ///    stream's order, which knows nothing of the copy).
    /// 3. The host must not read `dst[..n]` until the copy is done: record an event
    ///    on `stream` after the call and [`DeviceCore::wait_host`] on it (or
    ///    synchronize `stream`). [`DeviceMemory::pinned_slice`] does not wait;
    ///    [`DeviceMemory::pinned_slice_mut`] and dropping `dst` do (on CUDA, as
    ///    for uploads: one event per pinned buffer).
    /// 4. Copies already issued out of `dst` (uploads) or into it (earlier
    ///    downloads) finish before this one writes it: on CUDA `stream` waits for
    ///    the buffer's event on the device, without blocking the host.
    ///
    /// `n` beyond `src`'s or `dst`'s length is a
    /// [`GpuOpsError::SizeMismatch`](crate::GpuOpsError::SizeMismatch); `n = 0`
    /// copies nothing.
    fn download_pinned<T: Elem>(
        &self,
        stream: &Self::Stream,
        src: &Self::Buf<T>,
        n: usize,
        dst: &mut Self::Pinned<T>,
    ) -> Result<()>;
    /// Convenience: a new device buffer holding `src` (compute stream).
    fn to_device<T: Elem>(&self, src: &[T]) -> Result<Self::Buf<T>> {
        // The upload overwrites every element: no zeroing.
        let mut b = self.alloc_uninit(src.len())?;
        self.upload(self.stream(), src, &mut b)?;
        Ok(b)
    }
    /// Convenience: the first `len` elements of `src` on the host (compute stream).
    fn to_host<T: Elem>(&self, src: &Self::Buf<T>, len: usize) -> Result<Vec<T>> {
        let mut v = vec![T::default(); len];
        self.download(self.stream(), src, &mut v)?;
        Ok(v)
    }
    /// Device → device: `dst[..len] = src[..len]`.
    fn copy<T: Elem>(&self, src: &Self::Buf<T>, dst: &mut Self::Buf<T>, len: usize) -> Result<()>;
    /// `buf[..len] = 0`.
    fn fill_zero<T: Elem>(&self, buf: &mut Self::Buf<T>, len: usize) -> Result<()>;
}

/// Topology on the device, neighbor sampling and blocks (message-flow graphs).
pub trait Sampling: DeviceCore {
    /// A batch queued by [`Sampling::sample_queued`]: its kernels enqueued, its
    /// layer sizes still on the device until [`Sampling::resolve_queued`].
    type Queued: Send;
    /// The read of a group of queued batches in flight
    /// ([`Sampling::read_queued`]), until [`Sampling::finish_read`].
    type Reading: Send;
    /// Makes `graph` readable by [`Sampling::sample`] from `placement`.
    fn load_graph(&self, graph: &CsrGraph, placement: TopologyPlacement) -> Result<Self::Graph>;
    /// Layered neighbor sampling without replacement from `seeds` (top) downwards,
    /// `fanouts[l]` neighbors per destination for block `l` (bottom first, DGL's
    /// order; [`cpu_ops::ALL_NEIGHBORS`] takes all). Each block's sources are its
    /// destinations followed by the new vertices ([`Sampling::unique_relabel`]).
    fn sample(
        &self,
        graph: &Self::Graph,
        seeds: &[u32],
        fanouts: &[u32],
        seed: u64,
    ) -> Result<DeviceBatch<Self>>;
    /// [`Sampling::sample`] without a synchronization: the batch is enqueued
    /// (buffers sized by bounds) and its layer sizes stay on the device until
    /// [`Sampling::resolve_queued`] reads them. The host checks (fanouts, seeds in
    /// range and distinct) happen here; a layer whose edge bound is too loose to
    /// allocate still reads its edge count (one synchronization), as `sample` does.
    /// The blocks are those `sample` makes for the same arguments.
    /// [`Sampling::sample_queued_from`] from layer 0.
    fn sample_queued(
        &self,
        graph: &Self::Graph,
        seeds: &[u32],
        fanouts: &[u32],
        seed: u64,
    ) -> Result<Self::Queued> {
        self.sample_queued_from(graph, seeds, fanouts, 0, seed)
    }
    /// [`Sampling::sample_queued`] of layers `from..fanouts.len()` only: the
    /// blocks those layers of `sample(graph, seeds, fanouts, seed)` are (layer
    /// `l` drawn with `derive_seed(seed, l)`, `fanouts[l]` neighbors a
    /// destination), the layers below `from` not sampled. Resolved, the batch
    /// holds `fanouts.len() − from` blocks, layer `from`'s first, and its
    /// `src_ids[0]` are the destinations of layer `from − 1`: e.g. a batch's top
    /// layers sampled a super-batch ahead, its bottom hop later with
    /// [`Sampling::sample_hop`] and `derive_seed(seed, 0)` (the layer-based
    /// pipeline). Errors: those of `sample_queued` for the layers sampled, and
    /// `from` not below `fanouts.len()`.
    fn sample_queued_from(
        &self,
        graph: &Self::Graph,
        seeds: &[u32],
        fanouts: &[u32],
        from: usize,
        seed: u64,
    ) -> Result<Self::Queued>;
    /// The batches of earlier [`Sampling::sample_queued`] calls on this backend, in
    /// order, with **one synchronization for all of them** (one read of every
    /// batch's layer sizes): what lets a sampler running ahead read the sizes of
    /// several batches at once. The first error (a device fault, a repeated
    /// frontier id) fails the call. `sample` is `sample_queued` then
    /// `resolve_queued` of that one batch.
    fn resolve_queued(&self, queued: Vec<Self::Queued>) -> Result<Vec<DeviceBatch<Self>>>;
    /// Starts [`Sampling::resolve_queued`]'s one read without waiting for it:
    /// every queued batch's layer sizes and its bottom sources (`src_ids[0]`,
    /// read at the capacity the batch was sized by, as the sizes are not known
    /// yet) are copied into page-locked host memory, asynchronously on this
    /// backend's stream. Nothing synchronizes. [`Sampling::finish_read`] on this
    /// backend waits for the copy, on any thread: e.g. a planner thread waits
    /// for the bottom ids while the thread that queued them issues other work.
    /// A reading dropped unfinished waits for its copy first.
    fn read_queued(&self, queued: Vec<Self::Queued>) -> Result<Self::Reading>;
    /// The batches of a [`Sampling::read_queued`] of this backend, in order,
    /// each with its bottom sources on the host (`src_ids[0]`'s first
    /// `num_src(blocks[0])` ids), after **one synchronization** for all of them
    /// (none for a reading of no batch). The batches are those
    /// [`Sampling::resolve_queued`] returns; its errors, and on CUDA a reading
    /// another backend started (its copies are on that backend's stream). A
    /// reading of [`Sampling::sample_hop_queued`] hops only waits for its
    /// copies' event instead (an event wait, no synchronization: on CUDA the
    /// stream may since wait for another's work through the allocator), and
    /// a device fault of their kernels surfaces at the backend's next
    /// synchronization.
    #[allow(clippy::type_complexity)]
    fn finish_read(&self, reading: Self::Reading) -> Result<Vec<(DeviceBatch<Self>, Vec<u32>)>>;
    /// One hop of [`Sampling::sample`] from device-resident destinations: the block
    /// whose destinations are `dst[..n_dst]` (distinct), `fanout` neighbors each
    /// ([`cpu_ops::ALL_NEIGHBORS`] takes all), drawn with the per-layer seed
    /// `layer_seed`. Returns `(block, src_ids, num_src)`: the block, its sources'
    /// global ids (destinations first, then new ids in first-occurrence order) and
    /// their count.
    ///
    /// Determinism: with `layer_seed = cpu_ops::derive_seed(seed, l)` and no mask the
    /// block is layer `l` of [`Sampling::sample`]`(seed)` on the same backend with
    /// these destinations, so hop by hop (each hop's `dst` being the sources of the
    /// hop above) reproduces `sample`; on the host backend it is
    /// [`cpu_ops::sample_hop`].
    ///
    /// `skip` (`n_dst` flags, a prefix of the buffer): a destination whose flag is
    /// non-zero gets no neighbors (an empty row), so neither its neighborhood nor
    /// sources only it would read enter the block; every other destination's
    /// neighbors are those it gets without the mask. This lets a caller decide on the
    /// device which bottom destinations take their embedding from elsewhere before
    /// sampling their hop, with no host round trip.
    ///
    /// Errors: `n_dst` beyond `dst`'s length or `skip` shorter than `n_dst`
    /// ([`GpuOpsError::SizeMismatch`](crate::GpuOpsError::SizeMismatch)), a fanout of
    /// 0, a repeated destination or one outside the graph. Synchronizes (as `sample`
    /// does per layer).
    #[allow(clippy::type_complexity)]
    fn sample_hop(
        &self,
        graph: &Self::Graph,
        dst: &Self::Buf<u32>,
        n_dst: usize,
        fanout: u32,
        layer_seed: u64,
        skip: Option<&Self::Buf<u8>>,
    ) -> Result<(Self::Block, Self::Buf<u32>, usize)>;
    /// [`Sampling::sample_hop`] without a synchronization: the hop's kernels
    /// are enqueued (its buffers sized by bounds, as
    /// [`Sampling::sample_queued_from`]'s layers are) and its sizes stay on the
    /// device until [`Sampling::resolve_queued`] or [`Sampling::read_queued`] /
    /// [`Sampling::finish_read`] read them, together with other queued batches
    /// (one synchronization for all). Resolved, the batch holds one block (the
    /// one `sample_hop` makes for the same arguments, bit for bit on the same
    /// backend), its sources as `src_ids[0]` and `num_seeds = n_dst`; a read
    /// copies no ids back for it (`finish_read`'s id vector is empty: the
    /// sources stay on the device; a read of hops only takes an event wait,
    /// not a synchronization). `dst[..n_dst]` and `skip[..n_dst]` must not
    /// change until the hop is resolved (on CUDA they are read in stream order:
    /// write them on this backend's stream before the call). The layer path
    /// samples each batch's bottom hop a super-batch ahead with it, masked by
    /// the batch's planned hot positions. Errors: those of `sample_hop` that
    /// the host can check here (lengths, a fanout of 0); a repeated or
    /// out-of-range destination here (host backend) or when the hop is
    /// resolved (CUDA).
    fn sample_hop_queued(
        &self,
        graph: &Self::Graph,
        dst: &Self::Buf<u32>,
        n_dst: usize,
        fanout: u32,
        layer_seed: u64,
        skip: Option<&Self::Buf<u8>>,
    ) -> Result<Self::Queued>;
    /// Unique ids of `targets ++ candidates` with the targets first in their order
    /// (they must be distinct) and the other ids in first-occurrence order, plus the
    /// position of each candidate in that list. Returns `(unique, local, n_unique)`.
    #[allow(clippy::type_complexity)]
    fn unique_relabel(
        &self,
        targets: &Self::Buf<u32>,
        num_targets: usize,
        candidates: &Self::Buf<u32>,
        num_candidates: usize,
    ) -> Result<(Self::Buf<u32>, Self::Buf<u32>, usize)>;
    /// A block from host CSR (`indptr` of `num_dst + 1` entries, `indices` below
    /// `num_src`); validated.
    fn block_from_host(
        &self,
        num_src: usize,
        indptr: &[u64],
        indices: &[u32],
    ) -> Result<Self::Block>;
    /// The block with a self-loop per destination: destination `i` reads `N(i)`
    /// followed by source `i` (GCN's augmented block; `cpu_ops`' GCN layer builds
    /// the same on the host).
    fn add_self_loops(&self, block: &Self::Block) -> Result<Self::Block>;
    /// A block's CSR on the host: `(indptr, indices)` (`num_dst + 1` offsets and
    /// `num_edges` local source ids). Synchronizes.
    fn block_to_host(&self, block: &Self::Block) -> Result<(Vec<u64>, Vec<u32>)>;
    /// `(num_src, num_dst, num_edges)` of a block.
    fn block_shape(&self, block: &Self::Block) -> (usize, usize, usize);
    /// A second backend on the same device to sample ahead with: its ops run on
    /// their own stream, with their own allocator and fault word, so a batch it
    /// samples (and the synchronizations that sampling needs) overlaps the work
    /// this backend has queued. It reads graphs this backend loaded. Hand each of
    /// its batches over with [`Sampling::adopt_batch`] before this backend uses it.
    ///
    /// `None` (the default) where the backend has no sibling; callers then sample
    /// on this backend. The host backend returns a second host backend: nothing
    /// runs asynchronously there, so it only keeps callers on the same path.
    fn sampling_sibling(&self) -> Result<Option<Self>> {
        Ok(None)
    }
    /// Hands `batch`, sampled by `from` (this backend's
    /// [`Sampling::sampling_sibling`]), to this backend: this backend's stream
    /// waits for everything `from` has enqueued so far, and when the batch's
    /// buffers are dropped, `from` reuses their memory only after this backend's
    /// work enqueued before the drop. Keep `from` alive while the batch lives.
    /// A no-op where nothing runs asynchronously (the host backend).
    fn adopt_batch(&self, from: &Self, batch: &mut DeviceBatch<Self>) -> Result<()> {
        let _ = (from, batch);
        Ok(())
    }
}

/// Vertex features behind a device row cache, the gather through it, and
/// device-side row selection.
pub trait FeatureStore: DeviceCore {
    /// Features for [`FeatureStore::gather`]: rows of `cached` (hottest first) are copied
    /// into a device cache up to `budget_bytes` (rows past the budget are left out);
    /// the rest stay in host memory (pinned / registered on CUDA) and are read over
    /// the bus on a miss. With [`FeatureDtype::Bf16`] both hold bfloat16 rows
    /// (converted here: on CUDA a pinned copy of half the matrix's size) and the
    /// gather widens them to `f32`.
    fn load_features(
        &self,
        features: &FeatureMatrix,
        cached: &[u32],
        budget_bytes: usize,
        dtype: FeatureDtype,
    ) -> Result<Self::Features>;
    /// Changes the cached set: evicts `evict`, then inserts `insert` in order while
    /// the budget allows. Returns how many of `insert` were cached. Never exceeds the
    /// budget.
    fn update_cache(&self, f: &mut Self::Features, insert: &[u32], evict: &[u32]) -> Result<usize>;
    /// Whether vertex `v`'s row is in the device cache.
    fn is_cached(&self, f: &Self::Features, v: u32) -> bool;
    /// Feature width.
    fn feature_dim(&self, f: &Self::Features) -> usize;
    /// `out[r] = features[ids[r]]` for `r < n`, through the cache; counts hits/misses.
    /// Need not synchronize: on CUDA an id outside the matrix is a device fault
    /// reported by the next synchronizing call (the host backend reports it here),
    /// and the counts reach [`FeatureStore::cache_stats`] at that synchronization.
    fn gather(
        &self,
        f: &Self::Features,
        ids: &Self::Buf<u32>,
        n: usize,
        out: &mut Self::Buf<f32>,
    ) -> Result<()>;
    /// Hit/miss counts since load (or the last reset), as of the last
    /// synchronization, and the cache's occupancy. Never synchronizes.
    fn cache_stats(&self, f: &Self::Features) -> CacheStats;
    /// Zeroes the hit/miss counters.
    fn reset_cache_stats(&self, f: &Self::Features);
    /// `out[r] = src[idx[r]]` for `r < n` (rows of width `dim`; device-side row
    /// selection, e.g. picking a layer's rows by local id).
    fn index_select_rows(
        &self,
        src: &Self::Buf<f32>,
        dim: usize,
        idx: &Self::Buf<u32>,
        n: usize,
        out: &mut Self::Buf<f32>,
    ) -> Result<()>;
    /// `dst[idx[r]] = src[r]` for `r < n` (rows of width `dim`; `idx` distinct), e.g.
    /// placing historical embeddings of hot vertices into a layer's output.
    fn index_put_rows(
        &self,
        src: &Self::Buf<f32>,
        dim: usize,
        idx: &Self::Buf<u32>,
        n: usize,
        dst: &mut Self::Buf<f32>,
    ) -> Result<()>;
}

/// Dense math on row-major `f32` buffers: matrix products, bias, activations,
/// dropout, the loss, the optimizer step and elementwise helpers.
pub trait DenseOps: DeviceMemory {
    /// `C = A·B` (`+ C` when `accumulate`; without it `C`'s old values are never
    /// read) for views that carry their shapes and transposes: with `A` read as
    /// `m × k` and `B` as `k × n` ([`DevMat::product_dims`]), `C` is the row-major
    /// `m × n` prefix of `c`. Errors: the columns of `a` differ from the rows of
    /// `b`, or a buffer holds fewer values than its matrix
    /// ([`GpuOpsError::SizeMismatch`](crate::GpuOpsError::SizeMismatch)).
    fn matmul(
        &self,
        a: DevMat<'_, Self>,
        b: DevMat<'_, Self>,
        c: &mut Self::Buf<f32>,
        accumulate: bool,
    ) -> Result<()>;
    /// `x[r] += bias` for `r < rows` (`x` is `rows × cols`).
    fn add_bias(
        &self,
        x: &mut Self::Buf<f32>,
        rows: usize,
        cols: usize,
        bias: &Self::Buf<f32>,
    ) -> Result<()>;
    /// `dbias (+)= Σ_r dy[r]`.
    fn bias_grad(
        &self,
        dy: &Self::Buf<f32>,
        rows: usize,
        cols: usize,
        dbias: &mut Self::Buf<f32>,
        accumulate: bool,
    ) -> Result<()>;
    /// In-place ReLU on `x[..n]`.
    fn relu(&self, x: &mut Self::Buf<f32>, n: usize) -> Result<()>;
    /// `dy[i] *= [y[i] > 0]`.
    fn relu_backward(&self, y: &Self::Buf<f32>, dy: &mut Self::Buf<f32>, n: usize) -> Result<()>;
    /// In-place ELU(α) on `x[..n]`.
    fn elu(&self, x: &mut Self::Buf<f32>, n: usize, alpha: f32) -> Result<()>;
    /// ELU backward from the output `y`.
    fn elu_backward(
        &self,
        y: &Self::Buf<f32>,
        dy: &mut Self::Buf<f32>,
        n: usize,
        alpha: f32,
    ) -> Result<()>;
    /// Inverted dropout with probability `p` on `x[..n]`, stream `seed`.
    fn dropout(&self, x: &mut Self::Buf<f32>, n: usize, p: f32, seed: u64) -> Result<Self::Mask>;
    /// Applies `mask` (and its scale) to `dy[..n]`.
    fn dropout_backward(&self, mask: &Self::Mask, dy: &mut Self::Buf<f32>, n: usize) -> Result<()>;
    /// A hidden layer's bias, activation and dropout in one pass:
    /// `x = act(x + bias)` over the row-major `rows × cols` matrix (kept: the
    /// activation's backward reads it), then, when `dropout` is `Some((p, seed,
    /// out))`, `out[..rows · cols]` = [`DenseOps::dropout`] of `x` with `(p, seed)`,
    /// whose mask is returned. Equal, bit for bit, to [`DenseOps::add_bias`],
    /// [`DenseOps::relu`] / [`DenseOps::elu`], [`DeviceMemory::copy`] and
    /// [`DenseOps::dropout`] in that order — which is the default; CUDA runs one
    /// kernel that reads `x` once instead of four times.
    fn bias_act_dropout(
        &self,
        x: &mut Self::Buf<f32>,
        rows: usize,
        cols: usize,
        bias: &Self::Buf<f32>,
        act: Activation,
        dropout: Option<(f32, u64, &mut Self::Buf<f32>)>,
    ) -> Result<Option<Self::Mask>> {
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| GpuOpsError::InvalidArgument {
                name: "rows × cols",
                reason: format!("{rows} × {cols} overflows"),
            })?;
        self.add_bias(x, rows, cols, bias)?;
        match act {
            Activation::Relu => self.relu(x, n)?,
            Activation::Elu { alpha } => self.elu(x, n, alpha)?,
        }
        match dropout {
            None => Ok(None),
            Some((p, seed, out)) => {
                self.copy(x, out, n)?;
                self.dropout(out, n, p, seed).map(Some)
            }
        }
    }
    /// [`DenseOps::dropout_backward`] of `dy[..n]`, then the activation's backward
    /// from its output `y` ([`DenseOps::relu_backward`] / [`DenseOps::elu_backward`]),
    /// in one pass on CUDA; bit for bit the two calls (the default).
    fn dropout_act_backward(
        &self,
        mask: &Self::Mask,
        y: &Self::Buf<f32>,
        dy: &mut Self::Buf<f32>,
        n: usize,
        act: Activation,
    ) -> Result<()> {
        self.dropout_backward(mask, dy, n)?;
        self.activation_backward(y, dy, n, act)
    }
    /// A hidden layer's backward below the layer above, with its bias gradient:
    /// `dy[..rows·cols]` (row-major) goes through
    /// [`DenseOps::dropout_act_backward`] when `back.mask` is given, else
    /// [`DenseOps::activation_backward`], then `dbias[..cols]` is overwritten
    /// with its column sums ([`DenseOps::bias_grad`]). The default makes those
    /// calls (the host backend's results, bit for bit); CUDA makes one launch
    /// (`act_backward_colsum`: the gradient bit for bit, the column sums in
    /// another fixed order, so they may differ from `bias_grad`'s in the last
    /// bits, and run to run they do not).
    fn act_backward_bias_grad(
        &self,
        back: ActBackward<'_, Self>,
        dy: &mut Self::Buf<f32>,
        rows: usize,
        cols: usize,
        dbias: &mut Self::Buf<f32>,
    ) -> Result<()> {
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| GpuOpsError::InvalidArgument {
                name: "rows × cols",
                reason: format!("{rows} × {cols} overflows"),
            })?;
        match back.mask {
            Some(mask) => self.dropout_act_backward(mask, back.y, dy, n, back.act)?,
            None => self.activation_backward(back.y, dy, n, back.act)?,
        }
        self.bias_grad(dy, rows, cols, dbias, false)
    }
    /// `act`'s backward from its output `y`: [`DenseOps::relu_backward`] or
    /// [`DenseOps::elu_backward`].
    fn activation_backward(
        &self,
        y: &Self::Buf<f32>,
        dy: &mut Self::Buf<f32>,
        n: usize,
        act: Activation,
    ) -> Result<()> {
        match act {
            Activation::Relu => self.relu_backward(y, dy, n),
            Activation::Elu { alpha } => self.elu_backward(y, dy, n, alpha),
        }
    }
    /// Mean softmax cross-entropy of `logits` (`rows × classes`) against `labels`,
    /// writing `(softmax − onehot)/rows` into `grad` when given. Synchronizes.
    fn softmax_cross_entropy(
        &self,
        logits: &Self::Buf<f32>,
        rows: usize,
        classes: usize,
        labels: &Self::Buf<u32>,
        grad: Option<&mut Self::Buf<f32>>,
    ) -> Result<LossStats>;
    /// One Adam update of `param[..n]` from `grad`, with moments `m`, `v`.
    fn adam_step(
        &self,
        hp: &AdamStep,
        param: &mut Self::Buf<f32>,
        grad: &Self::Buf<f32>,
        m: &mut Self::Buf<f32>,
        v: &mut Self::Buf<f32>,
        n: usize,
    ) -> Result<()>;
    /// [`DenseOps::softmax_cross_entropy`] of `inp` (with the gradient, into
    /// `grad`) without reading the result: the loss **sum** (its f64 bits) and
    /// the correct count go to `dest`'s slot, to be read batches later, many
    /// slots in one download; a non-finite sum sets `guard[0] = 1`, which
    /// nothing but the caller clears and which [`DenseOps::adam_step_all`]
    /// obeys. No synchronization on CUDA (the deferred-loss protocol,
    /// `model/mod.rs`).
    fn softmax_cross_entropy_deferred(
        &self,
        inp: &XentInputs<'_, Self>,
        grad: &mut Self::Buf<f32>,
        dest: LossSlot<'_, Self>,
        guard: &mut Self::Buf<u32>,
    ) -> Result<()>;
    /// One Adam update of every tensor of `t` — element for element what
    /// [`DenseOps::adam_step`] does to each — and none at all when `guard` is
    /// given and `guard[0] != 0` (a non-finite loss). The default reads the guard
    /// (a synchronization) and calls `adam_step` per tensor; CUDA makes one
    /// launch that reads the guard on the device.
    fn adam_step_all(
        &self,
        hp: &AdamStep,
        t: AdamTensors<'_, Self>,
        guard: Option<&Self::Buf<u32>>,
    ) -> Result<()> {
        let count = t.count()?;
        if let Some(g) = guard {
            if self.to_host(g, 1)?[0] != 0 {
                return Ok(());
            }
        }
        let AdamTensors {
            params,
            grads,
            m,
            v,
            lens,
        } = t;
        for i in 0..count {
            self.adam_step(hp, &mut params[i], &grads[i], &mut m[i], &mut v[i], lens[i])?;
        }
        Ok(())
    }

    // ---- elementwise helpers ----------------------------------------------------
    /// `out[i] = f32(src[i])` for `i < n`: bfloat16 bits widened exactly
    /// ([`bf16_bits_to_f32`]), e.g. rows uploaded as bfloat16 (half the bytes)
    /// and widened on the device.
    fn widen_bf16(&self, src: &Self::Buf<u16>, n: usize, out: &mut Self::Buf<f32>) -> Result<()>;
    /// `out[out_at + i] = f32(src[src_at + i])` for `i < n`: [`widen_bf16`](Self::widen_bf16)
    /// on parts of buffers, e.g. bfloat16 hot-row embeddings uploaded into one
    /// region of a slab and widened in place of its fp32 rows. Either offset may be
    /// unaligned.
    fn widen_bf16_at(
        &self,
        src: &Self::Buf<u16>,
        src_at: usize,
        n: usize,
        out: &mut Self::Buf<f32>,
        out_at: usize,
    ) -> Result<()>;
    /// `x[..n] *= alpha` (an IEEE single-precision product per value, as on the
    /// host), e.g. a rank's gradients weighted by its share of the batch.
    fn scale(&self, x: &mut Self::Buf<f32>, n: usize, alpha: f32) -> Result<()>;
    /// `count[0] += ` the number of non-finite values (NaN, ±∞) in `x[..n]`, on
    /// the compute stream: e.g. whether summed gradients may be applied, with one
    /// read of `count` after checking every buffer. `n` must be below 2³² (the
    /// count wraps modulo 2³²).
    fn count_nonfinite(
        &self,
        x: &Self::Buf<f32>,
        n: usize,
        count: &mut Self::Buf<u32>,
    ) -> Result<()>;
}

/// Graph math over a block: aggregation and GAT attention, forward and backward.
pub trait GraphOps: DeviceCore {
    /// `out = A x` over `block` (`x` is `num_src × dim`, `out` `num_dst × dim`),
    /// [`cpu_ops::aggregate_forward`]'s semantics.
    fn aggregate_forward(
        &self,
        block: &Self::Block,
        kind: AggregateKind,
        x: &Self::Buf<f32>,
        dim: usize,
        out: &mut Self::Buf<f32>,
    ) -> Result<()>;
    /// `grad_x = Aᵀ grad_out` (all `num_src` rows overwritten).
    fn aggregate_backward(
        &self,
        block: &Self::Block,
        kind: AggregateKind,
        grad_out: &Self::Buf<f32>,
        dim: usize,
        grad_x: &mut Self::Buf<f32>,
    ) -> Result<()>;
    /// GAT edge attention over `block` ([`cpu_ops::gat_forward`]'s semantics).
    fn gat_forward(
        &self,
        block: &Self::Block,
        inp: &GatInputsDev<'_, Self>,
    ) -> Result<GatSaved<Self>>;
    /// GAT attention backward from `grad_out` (`num_dst × heads·head_dim`), with
    /// the inputs and saved state of the forward ([`cpu_ops::gat_backward`]'s
    /// semantics).
    fn gat_backward(
        &self,
        block: &Self::Block,
        inp: &GatInputsDev<'_, Self>,
        saved: &GatSaved<Self>,
        grad_out: &Self::Buf<f32>,
    ) -> Result<GatGradsDev<Self>>;
}

/// The shape of sparse rows on a device ([`SparseOps::sparse_shape`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SparseShape {
    /// Rows.
    pub rows: usize,
    /// Columns (the feature width).
    pub cols: usize,
    /// Stored non-zeros.
    pub nnz: usize,
}

/// Sparse input rows (CSR, [`cpu_ops::SparseRows`]' layout) on a device, and the
/// two products a sparse layer-0 input needs: `Y = X[..rows]·W` and
/// `dW = X[..rows]ᵀ·G` (layer 0 never needs `∂X`).
///
/// E.g. bag-of-words features (WordNet: 2000 columns, ~1% non-zero), for which
/// the dense layer-0 products multiply mostly zeros. A backend that does not
/// implement them says so with [`SparseOps::supports_sparse`] `= false`, and every
/// op then returns [`GpuOpsError::Unsupported`]: the caller loads dense rows
/// instead (the CUDA backend, for now).
///
/// The products are plain IEEE single precision whatever
/// [`DeviceCore::precision`] says (TF32 applies to [`DenseOps::matmul`] only). On
/// the host backend they are [`SparseRows::spmm_rows`] and
/// [`SparseRows::spmm_tn_rows`]: deterministic, bit for bit, on any thread count.
pub trait SparseOps: DeviceMemory {
    /// Sparse rows (CSR) on the device.
    type Sparse: Send + Sync;
    /// Whether the ops below are implemented (`false`: each returns
    /// [`GpuOpsError::Unsupported`]).
    fn supports_sparse(&self) -> bool;
    /// `rows` on the device: the whole feature matrix (to gather batches from
    /// with [`SparseOps::sparse_gather`]) or a batch's rows gathered on the host.
    /// The host backend shares `rows` without copying.
    fn sparse_from_host(&self, rows: Arc<SparseRows<f32>>) -> Result<Self::Sparse>;
    /// The rows `ids[0], …, ids[n − 1]` of `src`, in that order (e.g. a batch's
    /// input rows by the device ids of block 0's sources). An id that is not a
    /// row of `src` is an error.
    fn sparse_gather(
        &self,
        src: &Self::Sparse,
        ids: &Self::Buf<u32>,
        n: usize,
    ) -> Result<Self::Sparse>;
    /// Rows, columns and non-zeros of `x`.
    fn sparse_shape(&self, x: &Self::Sparse) -> SparseShape;
    /// `out (+)= X[..rows]·W` for `w`: `cols × n` and `out`: `rows × n`
    /// (row-major prefixes; `+=` when `accumulate`).
    fn spmm(
        &self,
        x: &Self::Sparse,
        rows: usize,
        w: &Self::Buf<f32>,
        n: usize,
        out: &mut Self::Buf<f32>,
        accumulate: bool,
    ) -> Result<()>;
    /// `dw (+)= X[..rows]ᵀ·G` for `g`: `rows × n` and `dw`: `cols × n` (a weight
    /// gradient; `+=` when `accumulate`).
    fn spmm_tn(
        &self,
        x: &Self::Sparse,
        rows: usize,
        g: &Self::Buf<f32>,
        n: usize,
        dw: &mut Self::Buf<f32>,
        accumulate: bool,
    ) -> Result<()>;
}

/// The accelerator: memory, streams, events and the ops of sample → gather → train.
///
/// Implemented by [`crate::HostBackend`] (always) and [`crate::CudaBackend`] (the
/// `cuda` feature; without it, or without a GPU, its constructor returns
/// [`crate::GpuOpsError::Unavailable`]). Shapes and ordering: the module doc.
///
/// The ops live in one trait per family ([`DeviceCore`], [`DeviceMemory`],
/// [`Sampling`], [`FeatureStore`], [`DenseOps`], [`GraphOps`], [`SparseOps`]); this
/// trait is all of them plus the collective reduce, so generic code bounds on `B: Backend` and
/// calls any op. Code calling ops on a concrete backend imports the families
/// (`use gpu_ops::prelude::*`).
pub trait Backend:
    DeviceCore + DeviceMemory + Sampling + FeatureStore + DenseOps + GraphOps + SparseOps
{
    /// Joins rank `rank` of `ranks` to the NCCL communicator of `id` on this
    /// device (collective: every rank calls it with the same `id`, from
    /// [`crate::nccl_unique_id`] on rank 0). Errors: NCCL missing, a backend
    /// that is not CUDA (the default), or NCCL's own error.
    fn nccl_reduce(
        &self,
        rank: usize,
        ranks: usize,
        id: &crate::NcclId,
    ) -> Result<Box<dyn crate::GradReduce<Self>>>
    where
        Self: Sized,
    {
        let _ = (rank, ranks, id);
        Err(crate::error::GpuOpsError::Unavailable {
            kind: self.kind(),
            reason: format!(
                "NCCL reduces CUDA device buffers; the {} backend has none",
                self.kind()
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{bf16_bits_to_f32, f32_to_bf16_bits, round_to_bf16, round_to_tf32};

    /// Rounding to `mantissa` explicit bits in `f64`: the nearest multiple of the
    /// value's unit in the last place (ties to even), or ±inf past the largest
    /// finite value.
    fn reference_bits(x: f32, mantissa: i32) -> f32 {
        if !x.is_finite() || x == 0.0 {
            return x;
        }
        let biased = ((x.to_bits() >> 23) & 0xFF) as i32;
        // Subnormals share the smallest normal exponent.
        let e = biased.max(1) - 127;
        let ulp = 2f64.powi(e - mantissa);
        ((f64::from(x) / ulp).round_ties_even() * ulp) as f32
    }

    /// TF32 rounding in `f64` (10 explicit mantissa bits).
    fn reference(x: f32) -> f32 {
        reference_bits(x, 10)
    }

    #[test]
    fn bf16_rounding_matches_the_f64_reference() {
        let mut rng = cpu_ops::Rng::new(6);
        let mut cases: Vec<f32> = (0..200_000)
            .map(|_| f32::from_bits(rng.next_u64() as u32))
            .collect();
        // Ties (the dropped 16 bits exactly half), both parities, and the edges.
        for m in [0x8000u32, 0x1_8000, 0x7F_8000, 0x7E_8000] {
            for e in [1u32, 100, 127, 200, 254] {
                cases.push(f32::from_bits((e << 23) | m));
                cases.push(-f32::from_bits((e << 23) | m));
            }
        }
        cases.extend([
            f32::MAX,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(0x8000),
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.0 + f32::EPSILON,
        ]);
        for x in cases {
            let b = f32_to_bf16_bits(x);
            if x.is_nan() {
                assert!(bf16_bits_to_f32(b).is_nan(), "{:#010x}", x.to_bits());
                continue;
            }
            let (got, want) = (round_to_bf16(x), reference_bits(x, 7));
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{x:e} ({:#010x}): got {got:e}, want {want:e}",
                x.to_bits()
            );
            // Widening is exact: the bits are the f32's upper half.
            assert_eq!(got.to_bits(), u32::from(b) << 16);
        }
        assert_eq!(round_to_bf16(f32::MAX), f32::INFINITY);
        assert_eq!(round_to_bf16(1.0), 1.0);
    }

    #[test]
    fn tf32_rounding_matches_the_f64_reference() {
        let mut rng = cpu_ops::Rng::new(5);
        let mut cases: Vec<f32> = (0..200_000)
            .map(|_| f32::from_bits(rng.next_u64() as u32))
            .collect();
        // Ties (the dropped bits exactly half), both parities, and the edges.
        for m in [
            0x1000u32,
            0x3000,
            0x2000 | 0x1000,
            0x7F_F000,
            0x7F_E000 | 0x1000,
        ] {
            for e in [1u32, 100, 127, 200, 254] {
                cases.push(f32::from_bits((e << 23) | m));
                cases.push(-f32::from_bits((e << 23) | m));
            }
        }
        cases.extend([
            f32::MAX,
            -f32::MAX,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(0x1FFF),
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.0,
            1.0 + f32::EPSILON,
        ]);
        for x in cases {
            if x.is_nan() {
                assert!(round_to_tf32(x).is_nan());
                continue;
            }
            let (got, want) = (round_to_tf32(x), reference(x));
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{x:e} ({:#010x}): got {got:e}, want {want:e}",
                x.to_bits()
            );
            assert_eq!(got.to_bits() & 0x1FFF, 0, "{x:e}: low 13 bits left");
        }
        assert_eq!(round_to_tf32(f32::MAX), f32::INFINITY);
    }
}
