//! `Real`: the float types kernels are written for.
//!
//! Production paths run in `f32` (with SIMD where it pays); every kernel also has a
//! plain scalar version generic over `Real`, so the same code runs in `f64` for
//! finite-difference gradient checks and serves as the reference the SIMD paths are
//! tested against.

use std::fmt::Debug;
use std::iter::Sum;
use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

/// A floating-point element type (`f32` or `f64`).
pub trait Real:
    bytemuck::Pod
    + Copy
    + Debug
    + Default
    + PartialOrd
    + Send
    + Sync
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + Sum
    + 'static
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// Converts from `f64` (rounding for `f32`).
    fn from_f64(x: f64) -> Self;
    /// Converts to `f64`.
    fn to_f64(self) -> f64;
    /// `e^self`.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// `ln(1 + self)`, accurate for small `self`.
    fn ln_1p(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// The larger of two values (NaN-ignoring as `f32::max`).
    fn max(self, other: Self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// `self * a + b` (fused where the hardware has it).
    fn mul_add(self, a: Self, b: Self) -> Self;
}

macro_rules! impl_real {
    ($t:ty) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline]
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline]
            fn ln_1p(self) -> Self {
                <$t>::ln_1p(self)
            }
            #[inline]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline]
            fn max(self, other: Self) -> Self {
                <$t>::max(self, other)
            }
            #[inline]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline]
            fn mul_add(self, a: Self, b: Self) -> Self {
                <$t>::mul_add(self, a, b)
            }
        }
    };
}

impl_real!(f32);
impl_real!(f64);

/// True when `T` is `f32`: the check kernels use to take their SIMD fast paths
/// (followed by a `bytemuck` cast, which the equal types make exact).
pub(crate) fn is_f32<T: Real>() -> bool {
    std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn softplus<T: Real>(x: T) -> T {
        (T::ONE + x.exp()).ln()
    }

    #[test]
    fn generic_code_runs_in_both_precisions() {
        let a = softplus(0.5f32).to_f64();
        let b = softplus(0.5f64);
        assert!((a - b).abs() < 1e-6);
        assert_eq!(f32::from_f64(2.0).mul_add(3.0, 1.0), 7.0);
    }
}
