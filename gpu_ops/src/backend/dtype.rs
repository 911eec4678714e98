//! Element and number types of the backends: what a device buffer may hold
//! ([`Elem`]), how feature rows are stored ([`FeatureDtype`]), the arithmetic of
//! matrix products ([`Precision`]), and the bfloat16 / TF32 roundings the host
//! backend and the tests share with the GPU.

use std::fmt;

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

/// The arithmetic of a backend's matrix products
/// ([`DenseOps::matmul`](crate::DenseOps::matmul)).
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

/// How a backend stores feature rows
/// ([`FeatureStore::load_features`](crate::FeatureStore::load_features)): the device cache
/// and the host rows it misses to. A gather always writes `f32` rows.
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

impl FeatureDtype {
    /// The name configs and the Python package use: `"f32"` or `"bf16"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        }
    }
}

impl fmt::Display for FeatureDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
    let mut out = vec![0u16; x.len()];
    to_bf16_bits_into(x, &mut out);
    out
}

/// [`to_bf16_bits`] into `out` (one value per value of `x`), in parallel on
/// rayon's current pool.
///
/// # Panics
/// When `out` and `x` differ in length (a caller's bug, not input).
pub fn to_bf16_bits_into(x: &[f32], out: &mut [u16]) {
    use rayon::prelude::*;
    assert_eq!(x.len(), out.len(), "to_bf16_bits_into: lengths differ");
    out.par_iter_mut()
        .zip(x.par_iter())
        .for_each(|(o, &v)| *o = f32_to_bf16_bits(v));
}

/// `x` rounded to bfloat16 and widened back ([`f32_to_bf16_bits`]).
pub fn round_to_bf16(x: f32) -> f32 {
    bf16_bits_to_f32(f32_to_bf16_bits(x))
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
