//! Host data and kernels for Tandem.
//!
//! - [`HostArray`]: owned or memory-mapped plain-data arrays;
//! - [`CsrGraph`]: CSR topology (`u64` offsets, `u32` ids) and its builder;
//! - [`FeatureMatrix`]: row-major `f32` vertex features;
//! - [`Rng`]: the version-stable generator every seeded component uses;
//! - [`sampler`]: layered neighbor sampling into blocks (DGL's MFGs);
//! - [`gather`]: feature-row gather for a block's input vertices;
//! - dense layers' math: [`gemm`] and its named forms [`matmul`], [`matmul_tn`],
//!   [`matmul_nt`]; bias and activations ([`add_bias`], [`relu`], ...); [`dropout`];
//!   [`softmax_cross_entropy`]; the [`Adam`] and [`Sgd`] optimizers.
//!
//! No devices and no thread policy beyond rayon's global pool live here.

mod activation;
mod array;
mod dropout;
mod error;
mod features;
mod graph;
mod loss;
mod matmul;
mod optim;
mod real;
mod rng;

pub use activation::{
    add_bias, bias_grad, elu, elu_backward, leaky_relu, leaky_relu_backward, relu, relu_backward,
};
pub use array::HostArray;
pub use dropout::{dropout, DropoutMask};
pub use error::{CpuOpsError, Result};
pub use features::FeatureMatrix;
pub use graph::{BuildOptions, CsrGraph};
pub use loss::{accuracy_count, softmax_cross_entropy, CrossEntropy};
pub use matmul::{
    gemm, gemm_reference, matmul, matmul_nt, matmul_tn, Accumulate, MatMut, MatRef, Transpose,
};
pub use optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig, WeightDecay};
pub use real::Real;
pub use rng::{derive_seed, splitmix64, Rng};
