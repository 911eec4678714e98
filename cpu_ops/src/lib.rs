//! Host data and kernels for Tandem.
//!
//! - [`HostArray`]: owned or memory-mapped plain-data arrays;
//! - [`CsrGraph`]: CSR topology (`u64` offsets, `u32` ids) and its builder;
//! - [`FeatureMatrix`]: row-major `f32` vertex features;
//! - [`Rng`]: the version-stable generator every seeded component uses;
//! - [`sampler`]: layered neighbor sampling into blocks (DGL's MFGs);
//! - [`gather`]: feature-row gather for a block's input vertices.
//!
//! No devices and no thread policy beyond rayon's global pool live here.

mod array;
mod error;
mod features;
pub mod gather;
mod graph;
mod real;
mod rng;
pub mod sampler;

pub use array::HostArray;
pub use error::{CpuOpsError, Result};
pub use features::FeatureMatrix;
pub use gather::{gather_rows, gather_rows_into_vec};
pub use graph::{BuildOptions, CsrGraph};
pub use real::Real;
pub use rng::{derive_seed, splitmix64, Rng};
pub use sampler::{Block, NeighborSampler, SampledBatch, SamplerScratch, ALL_NEIGHBORS};
