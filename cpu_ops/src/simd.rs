//! Vector primitives with run-time CPU dispatch: AVX-512F, AVX2+FMA, or scalar.
//!
//! One interface, [`SimdOps`], whose methods all have scalar default bodies, so
//! the generic kernels in this crate run for any [`Real`] with [`Scalar`] (the
//! reference twin, also used in `f64` for gradient checks) and for `f32` with
//! [`Simd`], a `Copy` token proving that the CPU supports its [`SimdLevel`].
//!
//! 1. [`SimdLevel::detected`] queries the CPU once (`is_x86_feature_detected!`) and
//!    caches the answer; [`Simd::detect`] wraps it.
//! 2. [`Simd::new`] builds a token for any level the CPU supports and refuses the
//!    others, so tests can run every available level against the scalar twin.
//! 3. Each `Simd` method checks slice lengths, then calls the
//!    `#[target_feature]` body for its level (an `unsafe fn` whose only extra
//!    obligation is the CPU feature, which the token discharges).
//!
//! Primitives (`x`, `y`, `out` slices, scalars `a`, `post`):
//! - `axpy`: `y ← y + a·x`;  `scale`: `y ← a·y`;  `add`: `y ← y + x`;  `dot`: `Σ x_k y_k`;
//! - `gather_sum`: `out ← post · Σ_k w[idx_k] · rows[idx_k]` (row `r` of a row-major
//!   matrix with `dim` columns; `w` absent means all ones; no indices gives zeros).
//!   It is the inner loop of every aggregation: the AVX paths keep up to 128 (AVX-512)
//!   or 64 (AVX2) output columns in registers across all listed rows, and software-
//!   prefetch whole rows 8 entries ahead in the index stream, across calls (the
//!   `ahead` argument), since the rows are scattered in memory. Measured on the
//!   2-core Zen 4 (25k × 25 edges over 400k rows of 128 `f32`): without prefetch the
//!   forward gathers 6–8 GB/s, with it 20–25 GB/s; distances 4–16 and hints T0/T1/T2
//!   were within noise of each other, so did one column pass vs two for 256 columns.
//!
//! The SIMD paths fuse multiply and add and sum in a different order than the scalar
//! ones, so results agree to rounding, not bit for bit. Every path is deterministic:
//! the same inputs give the same bits on every call and thread count.

use std::fmt;
use std::sync::OnceLock;

use crate::error::{CpuOpsError, Result};
use crate::real::Real;

/// The instruction-set level a [`Simd`] token dispatches to, from slowest to fastest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// Portable Rust loops (what the compiler makes of them for the base target).
    Scalar,
    /// 256-bit AVX2 with fused multiply-add.
    Avx2Fma,
    /// 512-bit AVX-512F (masked tails).
    Avx512,
}

impl SimdLevel {
    /// All levels, slowest first.
    pub const ALL: [SimdLevel; 3] = [SimdLevel::Scalar, SimdLevel::Avx2Fma, SimdLevel::Avx512];

    /// The fastest level this CPU supports, detected on the first call and cached.
    pub fn detected() -> SimdLevel {
        static DETECTED: OnceLock<SimdLevel> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            SimdLevel::ALL
                .into_iter()
                .rev()
                .find(|l| l.is_supported())
                .unwrap_or(SimdLevel::Scalar)
        })
    }

    /// Whether this CPU can run this level.
    pub fn is_supported(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2Fma => {
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => std::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every level this CPU supports, slowest first (always starts with `Scalar`).
    pub fn available() -> Vec<SimdLevel> {
        SimdLevel::ALL
            .into_iter()
            .filter(|l| l.is_supported())
            .collect()
    }

    /// Short lower-case name (`scalar`, `avx2+fma`, `avx512f`).
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2Fma => "avx2+fma",
            SimdLevel::Avx512 => "avx512f",
        }
    }
}

impl fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Vector primitives over slices of `T`. Every method has a scalar default body;
/// [`Scalar`] uses them all, [`Simd`] overrides them for `f32`.
///
/// # Panics
/// Every method panics when slice lengths disagree as stated in its doc, the way
/// `copy_from_slice` does; the kernels check all sizes before calling them.
pub trait SimdOps<T: Real>: Copy + Send + Sync {
    /// `y ← y + a·x`. Panics if `x.len() != y.len()`.
    fn axpy(&self, a: T, x: &[T], y: &mut [T]) {
        assert_eq!(x.len(), y.len(), "axpy: x and y lengths differ");
        scalar::axpy(a, x, y);
    }

    /// `y ← a·y`.
    fn scale(&self, a: T, y: &mut [T]) {
        scalar::scale(a, y);
    }

    /// `y ← y + x`. Panics if `x.len() != y.len()`.
    fn add(&self, x: &[T], y: &mut [T]) {
        assert_eq!(x.len(), y.len(), "add: x and y lengths differ");
        scalar::add(x, y);
    }

    /// `Σ_k x_k·y_k`. Panics if `x.len() != y.len()`.
    fn dot(&self, x: &[T], y: &[T]) -> T {
        assert_eq!(x.len(), y.len(), "dot: x and y lengths differ");
        scalar::dot(x, y)
    }

    /// `out ← post · Σ_k w[idx_k] · src.data[idx_k*dim .. (idx_k+1)*dim]`, weight 1
    /// when `src.weights` is `None`; `out` is all zeros when `idx` is empty.
    ///
    /// `ahead` lists the rows the next calls will read (e.g. the rest of a CSR index
    /// array): SIMD levels prefetch from it across call boundaries; it is never read
    /// through, so its entries need not be valid rows.
    ///
    /// Panics unless `out.len() == dim`, every row `idx_k` lies inside `src.data`,
    /// and (with weights) every `idx_k < weights.len()`.
    fn gather_sum(
        &self,
        src: GatherRows<'_, T>,
        idx: &[u32],
        ahead: &[u32],
        post: T,
        out: &mut [T],
    ) {
        let _ = ahead;
        check_gather(&src, idx, out.len());
        scalar::gather_sum(src, idx, post, out);
    }
}

/// The matrix [`SimdOps::gather_sum`] reads rows from.
#[derive(Clone, Copy, Debug)]
pub struct GatherRows<'a, T> {
    /// Row-major values, `dim` per row.
    pub data: &'a [T],
    /// Columns.
    pub dim: usize,
    /// Per-row weights (`weights[r]` scales row `r`), or `None` for all ones.
    pub weights: Option<&'a [T]>,
}

/// A row-major matrix of bfloat16 values (the upper 16 bits of an IEEE `f32`,
/// as the device stores rows with `device.feature_dtype = "bf16"`), read by
/// [`Simd::gather_sum_bf16`].
#[derive(Clone, Copy, Debug)]
pub struct Bf16Rows<'a> {
    /// Row-major bfloat16 bit patterns, `dim` per row.
    pub data: &'a [u16],
    /// Columns.
    pub dim: usize,
}

/// The `f32` a bfloat16 bit pattern stands for (exact: a shift into the upper half).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// The scalar reference: plain loops for any [`Real`] (all [`SimdOps`] defaults).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scalar;

impl<T: Real> SimdOps<T> for Scalar {}

/// A token for one [`SimdLevel`] the CPU supports; its `f32` [`SimdOps`] methods
/// dispatch to that level's code. Build it with [`Simd::detect`] (the fastest) or
/// [`Simd::new`] (a chosen level, e.g. in tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Simd {
    level: SimdLevel,
}

impl Simd {
    /// The fastest level of this CPU ([`SimdLevel::detected`]).
    pub fn detect() -> Self {
        Self {
            level: SimdLevel::detected(),
        }
    }

    /// A token for `level`, or [`CpuOpsError::InvalidArgument`] if the CPU lacks it.
    pub fn new(level: SimdLevel) -> Result<Self> {
        if level.is_supported() {
            Ok(Self { level })
        } else {
            Err(CpuOpsError::InvalidArgument {
                name: "simd level",
                reason: format!(
                    "this CPU does not support {level} (best available: {})",
                    SimdLevel::detected()
                ),
            })
        }
    }

    /// The portable scalar level (always available).
    pub fn scalar() -> Self {
        Self {
            level: SimdLevel::Scalar,
        }
    }

    /// The level this token dispatches to.
    pub fn level(self) -> SimdLevel {
        self.level
    }

    /// [`SimdOps::gather_sum`] over bfloat16 rows, summing in `f32`:
    /// `out ← post · Σ_k widen(src.data[idx_k*dim .. (idx_k+1)*dim])`, zeros for an
    /// empty `idx`. Half the bytes of the `f32` gather per row; every value is
    /// widened exactly, so the result is the `f32` gather of the widened rows up to
    /// the order of the sums. `ahead` as in [`SimdOps::gather_sum`].
    ///
    /// Panics unless `out.len() == dim` and every row `idx_k` lies inside `src.data`.
    pub fn gather_sum_bf16(
        &self,
        src: Bf16Rows<'_>,
        idx: &[u32],
        ahead: &[u32],
        post: f32,
        out: &mut [f32],
    ) {
        check_gather(
            &GatherRows::<u16> {
                data: src.data,
                dim: src.dim,
                weights: None,
            },
            idx,
            out.len(),
        );
        match self.level {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU supports the level (token); `check_gather` established
            // the bounds the function's contract asks for.
            SimdLevel::Avx512 => unsafe { x86::gather_sum_bf16_avx512(src, idx, ahead, post, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            SimdLevel::Avx2Fma => unsafe { x86::gather_sum_bf16_avx2(src, idx, ahead, post, out) },
            _ => scalar::gather_sum_bf16(src, idx, post, out),
        }
    }
}

impl SimdOps<f32> for Simd {
    fn axpy(&self, a: f32, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), y.len(), "axpy: x and y lengths differ");
        match self.level {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Simd` with this level exists only if the CPU supports it.
            SimdLevel::Avx512 => unsafe { x86::axpy_avx512(a, x, y) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            SimdLevel::Avx2Fma => unsafe { x86::axpy_avx2(a, x, y) },
            _ => scalar::axpy(a, x, y),
        }
    }

    fn scale(&self, a: f32, y: &mut [f32]) {
        match self.level {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Simd` with this level exists only if the CPU supports it.
            SimdLevel::Avx512 => unsafe { x86::scale_avx512(a, y) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            SimdLevel::Avx2Fma => unsafe { x86::scale_avx2(a, y) },
            _ => scalar::scale(a, y),
        }
    }

    fn add(&self, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), y.len(), "add: x and y lengths differ");
        match self.level {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Simd` with this level exists only if the CPU supports it.
            SimdLevel::Avx512 => unsafe { x86::axpy_avx512(1.0, x, y) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            SimdLevel::Avx2Fma => unsafe { x86::axpy_avx2(1.0, x, y) },
            _ => scalar::add(x, y),
        }
    }

    fn dot(&self, x: &[f32], y: &[f32]) -> f32 {
        assert_eq!(x.len(), y.len(), "dot: x and y lengths differ");
        match self.level {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Simd` with this level exists only if the CPU supports it.
            SimdLevel::Avx512 => unsafe { x86::dot_avx512(x, y) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            SimdLevel::Avx2Fma => unsafe { x86::dot_avx2(x, y) },
            _ => scalar::dot(x, y),
        }
    }

    fn gather_sum(
        &self,
        src: GatherRows<'_, f32>,
        idx: &[u32],
        ahead: &[u32],
        post: f32,
        out: &mut [f32],
    ) {
        check_gather(&src, idx, out.len());
        match self.level {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU supports the level (token); `check_gather` established
            // the bounds the function's contract asks for.
            SimdLevel::Avx512 => unsafe { x86::gather_sum_avx512(src, idx, ahead, post, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            SimdLevel::Avx2Fma => unsafe { x86::gather_sum_avx2(src, idx, ahead, post, out) },
            _ => scalar::gather_sum(src, idx, post, out),
        }
    }
}

/// Panics unless a `gather_sum` call stays in bounds (see [`SimdOps::gather_sum`]).
fn check_gather<T>(src: &GatherRows<'_, T>, idx: &[u32], out_len: usize) {
    let dim = src.dim;
    assert_eq!(out_len, dim, "gather_sum: out.len() must equal dim");
    let Some(max) = idx.iter().copied().max() else {
        return;
    };
    let end = (max as usize)
        .checked_add(1)
        .and_then(|n| n.checked_mul(dim));
    assert!(
        end.is_some_and(|e| e <= src.data.len()),
        "gather_sum: row {max} of width {dim} is outside a matrix of {} values",
        src.data.len()
    );
    if let Some(w) = src.weights {
        assert!(
            (max as usize) < w.len(),
            "gather_sum: row {max} has no weight (only {})",
            w.len()
        );
    }
}

/// Scalar bodies, generic over [`Real`]: the defaults of [`SimdOps`] and the
/// reference the vector paths are tested against.
pub(crate) mod scalar {
    use super::GatherRows;
    use crate::real::Real;

    pub(crate) fn axpy<T: Real>(a: T, x: &[T], y: &mut [T]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y += a * x;
        }
    }

    pub(crate) fn scale<T: Real>(a: T, y: &mut [T]) {
        for y in y {
            *y *= a;
        }
    }

    pub(crate) fn add<T: Real>(x: &[T], y: &mut [T]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y += x;
        }
    }

    pub(crate) fn dot<T: Real>(x: &[T], y: &[T]) -> T {
        x.iter().zip(y).fold(T::ZERO, |s, (&a, &b)| s + a * b)
    }

    /// Caller has checked bounds (`check_gather`).
    pub(crate) fn gather_sum<T: Real>(src: GatherRows<'_, T>, idx: &[u32], post: T, out: &mut [T]) {
        let dim = src.dim;
        out.fill(T::ZERO);
        for &j in idx {
            let j = j as usize;
            let row = &src.data[j * dim..(j + 1) * dim];
            match src.weights {
                Some(w) => axpy(w[j], row, out),
                None => add(row, out),
            }
        }
        scale(post, out);
    }

    /// The bfloat16 gather; caller has checked bounds (`check_gather`).
    pub(crate) fn gather_sum_bf16(
        src: super::Bf16Rows<'_>,
        idx: &[u32],
        post: f32,
        out: &mut [f32],
    ) {
        let dim = src.dim;
        out.fill(0.0);
        for &j in idx {
            let j = j as usize;
            for (o, &b) in out.iter_mut().zip(&src.data[j * dim..(j + 1) * dim]) {
                *o += super::bf16_to_f32(b);
            }
        }
        scale(post, out);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Bf16Rows, GatherRows};

    /// How many stream entries ahead `gather_sum` prefetches rows (tuning: module doc).
    const PREFETCH_AHEAD: usize = 8;

    /// Mask of the low `r` lanes of 16 (`r <= 16`).
    #[inline]
    fn mask16(r: usize) -> __mmask16 {
        if r >= 16 {
            0xFFFF
        } else {
            ((1u32 << r) - 1) as __mmask16
        }
    }

    /// Lane mask (all-ones lanes) selecting the low `r` of 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn mask8(r: usize) -> __m256i {
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(r.min(8) as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }

    /// `y ← y + a·x` over `min(x.len(), y.len())` elements.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn axpy_avx512(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
        let va = _mm512_set1_ps(a);
        let mut i = 0;
        while i < n {
            let m = mask16(n - i);
            // SAFETY: the lanes `m` selects are `i..min(i + 16, n)`, inside both
            // slices; masked-off lanes are neither read nor written (no fault).
            unsafe {
                let vx = _mm512_maskz_loadu_ps(m, xp.add(i));
                let vy = _mm512_maskz_loadu_ps(m, yp.add(i));
                _mm512_mask_storeu_ps(yp.add(i), m, _mm512_fmadd_ps(va, vx, vy));
            }
            i += 16;
        }
    }

    /// `y ← a·y`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scale_avx512(a: f32, y: &mut [f32]) {
        let n = y.len();
        let yp = y.as_mut_ptr();
        let va = _mm512_set1_ps(a);
        let mut i = 0;
        while i < n {
            let m = mask16(n - i);
            // SAFETY: lanes `i..min(i + 16, n)` are inside `y`; others are masked off.
            unsafe {
                let vy = _mm512_maskz_loadu_ps(m, yp.add(i));
                _mm512_mask_storeu_ps(yp.add(i), m, _mm512_mul_ps(va, vy));
            }
            i += 16;
        }
    }

    /// `Σ x_k·y_k` over `min(x.len(), y.len())` elements (four accumulators).
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dot_avx512(x: &[f32], y: &[f32]) -> f32 {
        let n = x.len().min(y.len());
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut i = 0;
        while i + 64 <= n {
            for (v, a) in acc.iter_mut().enumerate() {
                // SAFETY: `i + 16 * v + 16 <= i + 64 <= n`, inside both slices.
                unsafe {
                    let vx = _mm512_loadu_ps(xp.add(i + 16 * v));
                    let vy = _mm512_loadu_ps(yp.add(i + 16 * v));
                    *a = _mm512_fmadd_ps(vx, vy, *a);
                }
            }
            i += 64;
        }
        while i < n {
            let m = mask16(n - i);
            // SAFETY: lanes `i..min(i + 16, n)` are inside both slices; others masked.
            unsafe {
                let vx = _mm512_maskz_loadu_ps(m, xp.add(i));
                let vy = _mm512_maskz_loadu_ps(m, yp.add(i));
                acc[0] = _mm512_fmadd_ps(vx, vy, acc[0]);
            }
            i += 16;
        }
        let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        _mm512_reduce_add_ps(s)
    }

    /// AVX-512 body of `gather_sum`: column blocks of up to 128 (8 registers), each
    /// accumulated over the whole index list; the first block prefetches whole rows
    /// `PREFETCH_AHEAD` entries ahead in the stream `idx` then `ahead`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `out.len() == src.dim`; every `j` in `idx` has
    /// `(j + 1) * src.dim <= src.data.len()` and, with weights, `j < weights.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gather_sum_avx512(
        src: GatherRows<'_, f32>,
        idx: &[u32],
        ahead: &[u32],
        post: f32,
        out: &mut [f32],
    ) {
        let dim = src.dim;
        let mut c = 0;
        while c < dim {
            let width = (dim - c).min(128);
            let nv = width.div_ceil(16);
            let last = mask16(width - (nv - 1) * 16);
            let pf = if c == 0 { dim } else { 0 };
            let a = GatherArgs {
                out: out.as_mut_ptr(),
                rows: src.data.as_ptr(),
                dim,
                col: c,
                idx,
                ahead,
                w: src.weights,
                post,
                prefetch: pf,
            };
            // SAFETY: columns `c..c + width` lie inside `out` and inside every listed
            // row (`c + width <= dim`); the row/weight bounds are the caller's.
            unsafe {
                match nv {
                    1 => gather_block_avx512::<1>(&a, last),
                    2 => gather_block_avx512::<2>(&a, last),
                    3 => gather_block_avx512::<3>(&a, last),
                    4 => gather_block_avx512::<4>(&a, last),
                    5 => gather_block_avx512::<5>(&a, last),
                    6 => gather_block_avx512::<6>(&a, last),
                    7 => gather_block_avx512::<7>(&a, last),
                    _ => gather_block_avx512::<8>(&a, last),
                }
            }
            c += width;
        }
    }

    /// Shared arguments of the column-block bodies (rows of `T`: `f32` or bfloat16
    /// bits).
    struct GatherArgs<'a, T> {
        out: *mut f32,
        rows: *const T,
        dim: usize,
        col: usize,
        idx: &'a [u32],
        /// Rows of the following calls, for prefetching only.
        ahead: &'a [u32],
        w: Option<&'a [f32]>,
        post: f32,
        /// Values of each row to prefetch `PREFETCH_AHEAD` entries ahead (0: none).
        prefetch: usize,
    }

    impl<T> GatherArgs<'_, T> {
        /// Prefetches the first `self.prefetch` values of the row at position `t` of
        /// the stream `idx` then `ahead` (nothing past its end) into L1.
        #[inline]
        fn prefetch_entry(&self, t: usize) {
            let n = self.idx.len();
            let next = if t < n {
                self.idx.get(t)
            } else {
                self.ahead.get(t - n)
            };
            let Some(&j) = next else {
                return;
            };
            let p = self.rows.wrapping_add((j as usize).wrapping_mul(self.dim));
            let mut o = 0;
            while o < self.prefetch {
                // SAFETY: a prefetch is a hint; it never faults, whatever the address.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o) as *const i8) };
                o += 64 / std::mem::size_of::<T>();
            }
        }
    }

    /// One column block of `NV` vectors; lanes of the last vector per `last`.
    ///
    /// # Safety
    /// AVX-512F; columns `a.col .. a.col + 16 * (NV - 1) + popcount(last)` lie inside
    /// `a.out` (of `a.dim` values) and inside every row `a.idx` lists; with weights,
    /// every listed `j < w.len()`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn gather_block_avx512<const NV: usize>(a: &GatherArgs<'_, f32>, last: __mmask16) {
        let mut acc = [_mm512_setzero_ps(); NV];
        for (k, &j) in a.idx.iter().enumerate() {
            if a.prefetch > 0 {
                a.prefetch_entry(k + PREFETCH_AHEAD);
            }
            let wj = match a.w {
                // SAFETY: `j < w.len()` (contract).
                Some(w) => unsafe { *w.get_unchecked(j as usize) },
                None => 1.0,
            };
            let vw = _mm512_set1_ps(wj);
            // SAFETY: row `j` starts at `j * dim` inside `rows` (contract).
            let p = unsafe { a.rows.add(j as usize * a.dim + a.col) };
            for (v, acc) in acc.iter_mut().enumerate() {
                let m = if v + 1 == NV { last } else { 0xFFFF };
                // SAFETY: the selected lanes are columns inside row `j` (contract).
                let x = unsafe { _mm512_maskz_loadu_ps(m, p.add(16 * v)) };
                *acc = _mm512_fmadd_ps(vw, x, *acc);
            }
        }
        let vp = _mm512_set1_ps(a.post);
        for (v, acc) in acc.iter().enumerate() {
            let m = if v + 1 == NV { last } else { 0xFFFF };
            // SAFETY: the selected lanes are columns inside `out` (contract).
            unsafe { _mm512_mask_storeu_ps(a.out.add(a.col + 16 * v), m, _mm512_mul_ps(*acc, vp)) };
        }
    }

    /// `y ← y + a·x` over `min(x.len(), y.len())` elements.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn axpy_avx2(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n`, inside both slices.
            unsafe {
                let vx = _mm256_loadu_ps(xp.add(i));
                let vy = _mm256_loadu_ps(yp.add(i));
                _mm256_storeu_ps(yp.add(i), _mm256_fmadd_ps(va, vx, vy));
            }
            i += 8;
        }
        for k in i..n {
            y[k] = a.mul_add(x[k], y[k]);
        }
    }

    /// `y ← a·y`.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scale_avx2(a: f32, y: &mut [f32]) {
        let n = y.len();
        let yp = y.as_mut_ptr();
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n`, inside `y`.
            unsafe { _mm256_storeu_ps(yp.add(i), _mm256_mul_ps(va, _mm256_loadu_ps(yp.add(i)))) };
            i += 8;
        }
        for v in &mut y[i..] {
            *v *= a;
        }
    }

    /// `Σ x_k·y_k` over `min(x.len(), y.len())` elements (four accumulators).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_avx2(x: &[f32], y: &[f32]) -> f32 {
        let n = x.len().min(y.len());
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (v, a) in acc.iter_mut().enumerate() {
                // SAFETY: `i + 8 * v + 8 <= i + 32 <= n`, inside both slices.
                unsafe {
                    let vx = _mm256_loadu_ps(xp.add(i + 8 * v));
                    let vy = _mm256_loadu_ps(yp.add(i + 8 * v));
                    *a = _mm256_fmadd_ps(vx, vy, *a);
                }
            }
            i += 32;
        }
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n`, inside both slices.
            unsafe {
                let vx = _mm256_loadu_ps(xp.add(i));
                let vy = _mm256_loadu_ps(yp.add(i));
                acc[0] = _mm256_fmadd_ps(vx, vy, acc[0]);
            }
            i += 8;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_add_ss(h, _mm_shuffle_ps::<0b01>(h, h));
        let mut total = _mm_cvtss_f32(h);
        for k in i..n {
            total = x[k].mul_add(y[k], total);
        }
        total
    }

    /// AVX2 body of `gather_sum`: column blocks of up to 64 (8 registers).
    ///
    /// # Safety
    /// As [`gather_sum_avx512`], with AVX2 and FMA instead of AVX-512F.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gather_sum_avx2(
        src: GatherRows<'_, f32>,
        idx: &[u32],
        ahead: &[u32],
        post: f32,
        out: &mut [f32],
    ) {
        let dim = src.dim;
        let mut c = 0;
        while c < dim {
            let width = (dim - c).min(64);
            let nv = width.div_ceil(8);
            let last = width - (nv - 1) * 8;
            let pf = if c == 0 { dim } else { 0 };
            let a = GatherArgs {
                out: out.as_mut_ptr(),
                rows: src.data.as_ptr(),
                dim,
                col: c,
                idx,
                ahead,
                w: src.weights,
                post,
                prefetch: pf,
            };
            // SAFETY: columns `c..c + width` lie inside `out` and inside every listed
            // row (`c + width <= dim`); the row/weight bounds are the caller's.
            unsafe {
                match nv {
                    1 => gather_block_avx2::<1>(&a, last),
                    2 => gather_block_avx2::<2>(&a, last),
                    3 => gather_block_avx2::<3>(&a, last),
                    4 => gather_block_avx2::<4>(&a, last),
                    5 => gather_block_avx2::<5>(&a, last),
                    6 => gather_block_avx2::<6>(&a, last),
                    7 => gather_block_avx2::<7>(&a, last),
                    _ => gather_block_avx2::<8>(&a, last),
                }
            }
            c += width;
        }
    }

    /// One column block of `NV` 8-lane vectors, the last holding `last` (1..=8) lanes.
    ///
    /// # Safety
    /// AVX2+FMA; columns `a.col .. a.col + 8 * (NV - 1) + last` lie inside `a.out`
    /// and inside every row `a.idx` lists; with weights, every listed `j < w.len()`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn gather_block_avx2<const NV: usize>(a: &GatherArgs<'_, f32>, last: usize) {
        let tail = mask8(last);
        let full_last = last == 8;
        let mut acc = [_mm256_setzero_ps(); NV];
        for (k, &j) in a.idx.iter().enumerate() {
            if a.prefetch > 0 {
                a.prefetch_entry(k + PREFETCH_AHEAD);
            }
            let wj = match a.w {
                // SAFETY: `j < w.len()` (contract).
                Some(w) => unsafe { *w.get_unchecked(j as usize) },
                None => 1.0,
            };
            let vw = _mm256_set1_ps(wj);
            // SAFETY: row `j` starts at `j * dim` inside `rows` (contract).
            let p = unsafe { a.rows.add(j as usize * a.dim + a.col) };
            for (v, acc) in acc.iter_mut().enumerate() {
                // SAFETY: full vectors and the masked lanes of the last one are columns
                // inside row `j` (contract); masked-off lanes are not read.
                let x = unsafe {
                    if v + 1 < NV || full_last {
                        _mm256_loadu_ps(p.add(8 * v))
                    } else {
                        _mm256_maskload_ps(p.add(8 * v), tail)
                    }
                };
                *acc = _mm256_fmadd_ps(vw, x, *acc);
            }
        }
        let vp = _mm256_set1_ps(a.post);
        for (v, acc) in acc.iter().enumerate() {
            let y = _mm256_mul_ps(*acc, vp);
            // SAFETY: as for the loads, on `out`.
            unsafe {
                if v + 1 < NV || full_last {
                    _mm256_storeu_ps(a.out.add(a.col + 8 * v), y);
                } else {
                    _mm256_maskstore_ps(a.out.add(a.col + 8 * v), tail, y);
                }
            }
        }
    }

    /// Widens 16 bfloat16 values at `p` (the low `n` of them; the rest are 0).
    ///
    /// # Safety
    /// AVX-512F; `p .. p + n` is readable (`n <= 16`).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn widen16(p: *const u16, n: usize) -> __m512 {
        let half = if n >= 16 {
            // SAFETY: 16 values readable (contract).
            unsafe { _mm256_loadu_si256(p as *const __m256i) }
        } else {
            let mut buf = [0u16; 16];
            // SAFETY: `n` values readable (contract); `buf` holds 16.
            unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n) };
            // SAFETY: `buf` is 32 bytes.
            unsafe { _mm256_loadu_si256(buf.as_ptr() as *const __m256i) }
        };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(half)))
    }

    /// Widens 8 bfloat16 values at `p` (the low `n` of them; the rest are 0).
    ///
    /// # Safety
    /// AVX2; `p .. p + n` is readable (`n <= 8`).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn widen8(p: *const u16, n: usize) -> __m256 {
        let half = if n >= 8 {
            // SAFETY: 8 values readable (contract).
            unsafe { _mm_loadu_si128(p as *const __m128i) }
        } else {
            let mut buf = [0u16; 8];
            // SAFETY: `n` values readable (contract); `buf` holds 8.
            unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n) };
            // SAFETY: `buf` is 16 bytes.
            unsafe { _mm_loadu_si128(buf.as_ptr() as *const __m128i) }
        };
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(half)))
    }

    /// AVX-512 body of `Simd::gather_sum_bf16`: column blocks of up to 128
    /// (8 registers of 16 `f32` accumulators), rows widened on load.
    ///
    /// # Safety
    /// AVX-512F; `out.len() == src.dim`; every `j` in `idx` has
    /// `(j + 1) * src.dim <= src.data.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gather_sum_bf16_avx512(
        src: Bf16Rows<'_>,
        idx: &[u32],
        ahead: &[u32],
        post: f32,
        out: &mut [f32],
    ) {
        let dim = src.dim;
        let mut c = 0;
        while c < dim {
            let width = (dim - c).min(128);
            let nv = width.div_ceil(16);
            let last = width - (nv - 1) * 16;
            let a = GatherArgs {
                out: out.as_mut_ptr(),
                rows: src.data.as_ptr(),
                dim,
                col: c,
                idx,
                ahead,
                w: None,
                post,
                prefetch: if c == 0 { dim } else { 0 },
            };
            // SAFETY: columns `c..c + width` lie inside `out` and every listed row.
            unsafe {
                match nv {
                    1 => gather_block_bf16_avx512::<1>(&a, last),
                    2 => gather_block_bf16_avx512::<2>(&a, last),
                    3 => gather_block_bf16_avx512::<3>(&a, last),
                    4 => gather_block_bf16_avx512::<4>(&a, last),
                    5 => gather_block_bf16_avx512::<5>(&a, last),
                    6 => gather_block_bf16_avx512::<6>(&a, last),
                    7 => gather_block_bf16_avx512::<7>(&a, last),
                    _ => gather_block_bf16_avx512::<8>(&a, last),
                }
            }
            c += width;
        }
    }

    /// One column block of `NV` vectors of bfloat16 rows, the last holding `last`
    /// (1..=16) lanes.
    ///
    /// # Safety
    /// AVX-512F; columns `a.col .. a.col + 16 * (NV - 1) + last` lie inside `a.out`
    /// and inside every row `a.idx` lists.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn gather_block_bf16_avx512<const NV: usize>(a: &GatherArgs<'_, u16>, last: usize) {
        let mut acc = [_mm512_setzero_ps(); NV];
        for (k, &j) in a.idx.iter().enumerate() {
            if a.prefetch > 0 {
                a.prefetch_entry(k + PREFETCH_AHEAD);
            }
            // SAFETY: row `j` starts at `j * dim` inside `rows` (contract).
            let p = unsafe { a.rows.add(j as usize * a.dim + a.col) };
            for (v, acc) in acc.iter_mut().enumerate() {
                let n = if v + 1 == NV { last } else { 16 };
                // SAFETY: `n` values from column `a.col + 16 v` lie inside row `j`.
                let x = unsafe { widen16(p.add(16 * v), n) };
                *acc = _mm512_add_ps(x, *acc);
            }
        }
        let vp = _mm512_set1_ps(a.post);
        for (v, acc) in acc.iter().enumerate() {
            let m = mask16(if v + 1 == NV { last } else { 16 });
            // SAFETY: the selected lanes are columns inside `out` (contract).
            unsafe { _mm512_mask_storeu_ps(a.out.add(a.col + 16 * v), m, _mm512_mul_ps(*acc, vp)) };
        }
    }

    /// AVX2 body of `Simd::gather_sum_bf16`: column blocks of up to 64.
    ///
    /// # Safety
    /// As [`gather_sum_bf16_avx512`], with AVX2 and FMA instead of AVX-512F.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gather_sum_bf16_avx2(
        src: Bf16Rows<'_>,
        idx: &[u32],
        ahead: &[u32],
        post: f32,
        out: &mut [f32],
    ) {
        let dim = src.dim;
        let mut c = 0;
        while c < dim {
            let width = (dim - c).min(64);
            let nv = width.div_ceil(8);
            let last = width - (nv - 1) * 8;
            let a = GatherArgs {
                out: out.as_mut_ptr(),
                rows: src.data.as_ptr(),
                dim,
                col: c,
                idx,
                ahead,
                w: None,
                post,
                prefetch: if c == 0 { dim } else { 0 },
            };
            // SAFETY: columns `c..c + width` lie inside `out` and every listed row.
            unsafe {
                match nv {
                    1 => gather_block_bf16_avx2::<1>(&a, last),
                    2 => gather_block_bf16_avx2::<2>(&a, last),
                    3 => gather_block_bf16_avx2::<3>(&a, last),
                    4 => gather_block_bf16_avx2::<4>(&a, last),
                    5 => gather_block_bf16_avx2::<5>(&a, last),
                    6 => gather_block_bf16_avx2::<6>(&a, last),
                    7 => gather_block_bf16_avx2::<7>(&a, last),
                    _ => gather_block_bf16_avx2::<8>(&a, last),
                }
            }
            c += width;
        }
    }

    /// One column block of `NV` 8-lane vectors of bfloat16 rows, the last holding
    /// `last` (1..=8) lanes.
    ///
    /// # Safety
    /// AVX2+FMA; columns `a.col .. a.col + 8 * (NV - 1) + last` lie inside `a.out`
    /// and inside every row `a.idx` lists.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn gather_block_bf16_avx2<const NV: usize>(a: &GatherArgs<'_, u16>, last: usize) {
        let tail = mask8(last);
        let mut acc = [_mm256_setzero_ps(); NV];
        for (k, &j) in a.idx.iter().enumerate() {
            if a.prefetch > 0 {
                a.prefetch_entry(k + PREFETCH_AHEAD);
            }
            // SAFETY: row `j` starts at `j * dim` inside `rows` (contract).
            let p = unsafe { a.rows.add(j as usize * a.dim + a.col) };
            for (v, acc) in acc.iter_mut().enumerate() {
                let n = if v + 1 == NV { last } else { 8 };
                // SAFETY: `n` values from column `a.col + 8 v` lie inside row `j`.
                let x = unsafe { widen8(p.add(8 * v), n) };
                *acc = _mm256_add_ps(x, *acc);
            }
        }
        let vp = _mm256_set1_ps(a.post);
        for (v, acc) in acc.iter().enumerate() {
            let y = _mm256_mul_ps(*acc, vp);
            // SAFETY: the stored lanes are columns inside `out` (contract).
            unsafe {
                if v + 1 < NV || last == 8 {
                    _mm256_storeu_ps(a.out.add(a.col + 8 * v), y);
                } else {
                    _mm256_maskstore_ps(a.out.add(a.col + 8 * v), tail, y);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    const LENS: [usize; 12] = [0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 100, 129];

    fn rand_vec(rng: &mut Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.next_f32() * 2.0 - 1.0).collect()
    }

    fn close(a: f32, b: f32, scale: f32) -> bool {
        (a - b).abs() <= 1e-5 * (1.0 + scale)
    }

    fn assert_close(got: &[f32], want: &[f32], scale: f32, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(close(g, w, scale), "{what}[{k}]: {g} vs {w}");
        }
    }

    #[test]
    fn detection_is_consistent() {
        let best = SimdLevel::detected();
        assert!(best.is_supported());
        assert_eq!(SimdLevel::available().last(), Some(&best));
        assert_eq!(SimdLevel::available()[0], SimdLevel::Scalar);
        assert_eq!(Simd::detect().level(), best);
        for l in SimdLevel::ALL {
            assert_eq!(Simd::new(l).is_ok(), l.is_supported(), "{l}");
        }
    }

    #[test]
    fn every_level_matches_scalar_on_odd_lengths() {
        let mut rng = Rng::new(11);
        for level in SimdLevel::available() {
            let s = Simd::new(level).unwrap();
            for n in LENS {
                let x = rand_vec(&mut rng, n);
                let y0 = rand_vec(&mut rng, n);
                let a = rng.next_f32() * 4.0 - 2.0;
                let what = format!("{level} n={n}");

                let (mut y, mut r) = (y0.clone(), y0.clone());
                s.axpy(a, &x, &mut y);
                Scalar.axpy(a, &x, &mut r);
                assert_close(&y, &r, 2.0, &format!("axpy {what}"));

                let (mut y, mut r) = (y0.clone(), y0.clone());
                s.scale(a, &mut y);
                Scalar.scale(a, &mut r);
                assert_close(&y, &r, 2.0, &format!("scale {what}"));

                let (mut y, mut r) = (y0.clone(), y0.clone());
                s.add(&x, &mut y);
                Scalar.add(&x, &mut r);
                assert_close(&y, &r, 2.0, &format!("add {what}"));

                let d = s.dot(&x, &y0);
                let dr: f32 = Scalar.dot(&x, &y0);
                assert!(close(d, dr, n as f32), "dot {what}: {d} vs {dr}");
            }
        }
    }

    #[test]
    fn gather_sum_matches_scalar_with_and_without_weights() {
        let mut rng = Rng::new(12);
        let nrows = 37;
        for level in SimdLevel::available() {
            let s = Simd::new(level).unwrap();
            for dim in [1, 3, 7, 15, 16, 17, 31, 33, 64, 100, 128, 129, 256, 300] {
                let rows = rand_vec(&mut rng, nrows * dim);
                let w = rand_vec(&mut rng, nrows);
                for len in [0, 1, 2, 5, 9, 40] {
                    let idx: Vec<u32> = (0..len).map(|_| rng.below(nrows as u64) as u32).collect();
                    for weights in [None, Some(w.as_slice())] {
                        let mut got = vec![f32::NAN; dim];
                        let mut want = vec![f32::NAN; dim];
                        let src = GatherRows {
                            data: &rows,
                            dim,
                            weights,
                        };
                        // Garbage `ahead` entries are only prefetched, never read.
                        let ahead = [u32::MAX, 3, 1 << 30];
                        s.gather_sum(src, &idx, &ahead, 0.75, &mut got);
                        Scalar.gather_sum(src, &idx, &ahead, 0.75, &mut want);
                        let what = format!("{level} dim={dim} len={len} w={}", weights.is_some());
                        assert_close(&got, &want, len as f32, &what);
                    }
                }
            }
        }
    }

    /// Round-to-nearest-even bfloat16 bits of `x` (finite inputs), as the device's
    /// `f32_to_bf16_bits` rounds.
    fn to_bf16(x: f32) -> u16 {
        let b = x.to_bits();
        ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
    }

    #[test]
    fn bf16_gather_matches_the_f32_gather_of_the_widened_rows() {
        let mut rng = Rng::new(13);
        let nrows = 41;
        for level in SimdLevel::available() {
            let s = Simd::new(level).unwrap();
            for dim in [
                1, 3, 7, 8, 9, 15, 16, 17, 33, 64, 100, 128, 129, 256, 300, 512,
            ] {
                let bits: Vec<u16> = rand_vec(&mut rng, nrows * dim)
                    .into_iter()
                    .map(to_bf16)
                    .collect();
                let wide: Vec<f32> = bits.iter().map(|&b| bf16_to_f32(b)).collect();
                for len in [0, 1, 2, 5, 9, 40] {
                    let idx: Vec<u32> = (0..len).map(|_| rng.below(nrows as u64) as u32).collect();
                    let mut got = vec![f32::NAN; dim];
                    let mut want = vec![f32::NAN; dim];
                    let ahead = [u32::MAX, 3, 1 << 30];
                    s.gather_sum_bf16(Bf16Rows { data: &bits, dim }, &idx, &ahead, 0.75, &mut got);
                    let src = GatherRows {
                        data: &wide,
                        dim,
                        weights: None,
                    };
                    Scalar.gather_sum(src, &idx, &ahead, 0.75, &mut want);
                    assert_close(
                        &got,
                        &want,
                        len as f32,
                        &format!("{level} dim={dim} len={len}"),
                    );
                }
            }
        }
        // Widening is exact.
        for x in [0.0f32, -0.0, 1.0, -2.5, 3.0e38, 1.0e-38] {
            assert_eq!(bf16_to_f32(to_bf16(x)).to_bits() >> 16, to_bf16(x) as u32);
        }
    }

    #[test]
    #[should_panic(expected = "outside a matrix")]
    fn bf16_gather_refuses_out_of_range_rows() {
        let bits = vec![0u16; 8];
        let mut out = vec![0.0f32; 4];
        Simd::detect().gather_sum_bf16(
            Bf16Rows {
                data: &bits,
                dim: 4,
            },
            &[2],
            &[],
            1.0,
            &mut out,
        );
    }

    #[test]
    #[should_panic(expected = "outside a matrix")]
    fn gather_sum_refuses_out_of_range_rows() {
        let rows = vec![0.0f32; 8];
        let mut out = vec![0.0f32; 4];
        let src = GatherRows {
            data: &rows,
            dim: 4,
            weights: None,
        };
        Simd::detect().gather_sum(src, &[0, 2], &[], 1.0, &mut out);
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn axpy_refuses_length_mismatch() {
        let mut y = vec![0.0f32; 4];
        Simd::detect().axpy(1.0, &[1.0; 5], &mut y);
    }
}
