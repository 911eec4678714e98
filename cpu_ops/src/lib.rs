//! Host data and kernels for Tandem.
//!
//! - [`HostArray`]: owned, memory-mapped or externally owned plain-data arrays;
//! - [`CsrGraph`]: CSR topology (`u64` offsets, `u32` ids) and its builder;
//! - [`FeatureMatrix`]: row-major `f32` vertex features;
//! - [`Rng`]: the version-stable generator every seeded component uses;
//! - [`Simd`] / [`SimdOps`]: vector primitives with run-time AVX-512 / AVX2 / scalar dispatch;
//! - [`sampler`]: layered neighbor sampling into blocks (DGL's MFGs), a batch at a
//!   time or one hop at a time with a skip mask ([`sample_hop`]);
//! - [`gather`]: feature-row gather for a block's input vertices;
//! - [`BlockView`] (a validated view of a block's CSR, with its cached transpose) and
//!   [`aggregate_forward`] / [`aggregate_backward`]: sum, mean and GCN-normalized
//!   aggregation over a block, with `f32` SIMD fast paths;
//! - [`gat_forward`] / [`gat_backward`]: multi-head GAT edge attention over a block;
//! - dense layers' math: [`gemm`] and its named forms [`matmul`], [`matmul_tn`],
//!   [`matmul_nt`]; bias and activations ([`add_bias`], [`relu`], ...); [`dropout`];
//!   [`softmax_cross_entropy`]; the [`Adam`] and [`Sgd`] optimizers;
//! - link prediction's host math (`link`): the pair decoders' products
//!   ([`pair_dot`], [`pair_hadamard`] and their backwards),
//!   [`bce_with_logits`], negative sampling ([`sample_negatives`],
//!   [`negative_cdf`]) and [`exclude_edges`];
//! - [`SparseRows`]: CSR input rows with the sparse products `X·W` and `Xᵀ·G` of a
//!   sparse layer-0 input;
//! - a model's configuration ([`ModelConfig`], [`ModelKind`], [`LayerSpec`],
//!   [`ModelInput`]) and DGL's parameter initializers ([`Init`]); the models
//!   themselves (GCN, GraphSAGE, GAT) are written once in `gpu_ops::model`, over
//!   the kernels here (through `gpu_ops`' host backend) and CUDA's;
//! - [`hot_layer`]: [`SageHotKernel`], GraphSAGE-mean layer 0 for a list of
//!   destinations fused from sampling to output rows (hot vertices computed on CPU).
//!
//! No devices and no thread policy beyond rayon's global pool live here.

#![deny(missing_docs)]

mod activation;
mod aggregate;
mod array;
mod attention;
mod dropout;
mod error;
mod features;
pub mod gather;
mod graph;
pub mod hot_layer;
mod init;
mod link;
mod loss;
mod matmul;
mod model_config;
mod optim;
mod real;
mod rng;
pub mod sampler;
mod simd;
mod sparse;

pub use activation::{
    add_bias, bias_grad, elu, elu_backward, leaky_relu, leaky_relu_backward, relu, relu_backward,
};
pub use aggregate::{
    aggregate_backward, aggregate_backward_f32, aggregate_forward, aggregate_forward_f32,
    AggregateKind, BlockView,
};
pub use array::HostArray;
pub use attention::{
    gat_backward, gat_backward_f32, gat_forward, gat_forward_f32, GatForward, GatGrads, GatInputs,
    GatParts, GAT_NEGATIVE_SLOPE,
};
pub use dropout::{dropout, DropoutMask};
pub use error::{CpuOpsError, Result};
pub use features::FeatureMatrix;
pub use gather::{gather_rows, gather_rows_into_vec};
pub use graph::{BuildOptions, CsrGraph};
pub use hot_layer::{HotFeatures, HotProfile, HotRequest, SageHotKernel};
pub use init::{Init, RELU_GAIN};
pub use link::{
    bce_with_logits, exclude_edges, negative_cdf, negative_vertex, pair_dot, pair_dot_backward,
    pair_hadamard, pair_hadamard_backward, pair_key, sample_negatives, sorted_pair_keys,
    NEGATIVE_STREAM,
};
pub use loss::{accuracy_count, softmax_cross_entropy, CrossEntropy};
pub use matmul::{
    gemm, gemm_reference, matmul, matmul_nt, matmul_tn, Accumulate, MatMut, MatRef, Transpose,
};
pub use model_config::{LayerSpec, ModelConfig, ModelInput, ModelKind};
pub use optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig, WeightDecay};
pub use real::Real;
pub use rng::{derive_seed, hash_draw, hash_key, mix64, splitmix64, uniform_below, Rng};
pub use sampler::{
    sample_hop, sample_hop_into, Block, NeighborSampler, SampledBatch, SamplerScratch,
    ALL_NEIGHBORS,
};
pub use simd::{bf16_to_f32, Bf16Rows, GatherRows, Scalar, Simd, SimdLevel, SimdOps};
pub use sparse::SparseRows;
