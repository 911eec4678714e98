//! Parameter initialization as DGL 1.1.3's layers do it (PyTorch's `nn.init`),
//! for the models of `gpu_ops` (which declare each tensor's [`Init`] in their
//! layer files).
//!
//! - `GraphConv`: `xavier_uniform_(weight)` (gain 1), zero bias;
//! - `SAGEConv`: `xavier_uniform_(fc_self.weight, gain=√2)` and the same for
//!   `fc_neigh`, zero bias;
//! - `GATConv`: `xavier_normal_(fc.weight, gain=√2)`, `xavier_normal_(attn_l/attn_r,
//!   gain=√2)` with PyTorch's fans for a `(1, H, F)` tensor (`fan_in = H·F`,
//!   `fan_out = F`), zero bias.
//!
//! Xavier-uniform draws from `U(−a, a)`, `a = gain·√(6 / (fan_in + fan_out))`;
//! Xavier-normal from `N(0, σ²)`, `σ = gain·√(2 / (fan_in + fan_out))`. Every
//! tensor draws from its own stream `Rng::for_stream(seed, tensor index)`, in `f64`,
//! then rounds to `T` (so `f32` and `f64` fills of the same stream agree up to
//! rounding).

use crate::real::Real;
use crate::rng::Rng;

/// PyTorch's `calculate_gain("relu")`.
pub const RELU_GAIN: f64 = std::f64::consts::SQRT_2;

/// How a tensor is filled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Xavier-uniform with this gain and fans.
    XavierUniform {
        /// The gain (`1` or [`RELU_GAIN`]).
        gain: f64,
        /// PyTorch's `fan_in`.
        fan_in: usize,
        /// PyTorch's `fan_out`.
        fan_out: usize,
    },
    /// Xavier-normal with this gain and fans.
    XavierNormal {
        /// The gain (`1` or [`RELU_GAIN`]).
        gain: f64,
        /// PyTorch's `fan_in`.
        fan_in: usize,
        /// PyTorch's `fan_out`.
        fan_out: usize,
    },
    /// All zeros.
    Zeros,
}

impl Init {
    /// `len` values drawn from stream `stream` of `seed` (a model's tensor `i`
    /// uses stream `i`, counted over all layers).
    pub fn fill<T: Real>(self, len: usize, seed: u64, stream: u64) -> Vec<T> {
        let mut rng = Rng::for_stream(seed, stream);
        match self {
            Init::XavierUniform {
                gain,
                fan_in,
                fan_out,
            } => {
                let a = gain * (6.0 / (fan_in + fan_out).max(1) as f64).sqrt();
                (0..len)
                    .map(|_| T::from_f64((rng.next_f64() * 2.0 - 1.0) * a))
                    .collect()
            }
            Init::XavierNormal {
                gain,
                fan_in,
                fan_out,
            } => {
                let std = gain * (2.0 / (fan_in + fan_out).max(1) as f64).sqrt();
                (0..len).map(|_| T::from_f64(rng.normal() * std)).collect()
            }
            Init::Zeros => vec![T::ZERO; len],
        }
    }
}
