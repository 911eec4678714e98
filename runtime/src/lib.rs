//! Tandem's runtime: the dataset store and importers, generators, and (as they
//! land) the executor, trainer and CLI.
//!
//! Dependency direction: `cpu_ops` ← `gpu_ops` ← `scheduler` ← `runtime`.

pub mod atomic;
pub mod bench;
pub mod cli;
pub mod config;
pub mod dataset;
mod error;
pub mod export;
pub mod generate;
pub mod import;
pub mod npy;
pub mod trace;
pub mod engine;
pub mod trainer;

pub use error::{Error, Result};
