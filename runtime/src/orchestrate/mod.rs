//! Layer-based orchestration at run time (docs/orchestration.md §11): the CPU
//! computes hot vertices' bottom-layer embeddings a super-batch ahead while the
//! device engine trains, and every batch reuses them within the staleness bound.
//!
//! - [`pipeline`]: the executor ([`Orchestrator`]) — the protocol, in one place;
//! - [`workers`]: the persistent CPU workers and their job channels;
//! - [`hot_compute`]: published layer-0 weights and the CPU computation of a chunk;
//! - [`monitor`]: the hybrid monitor at run time ([`HybridMonitor`]): moves hot
//!   vertices between CPU computation and the device feature cache;
//! - [`clock`]: the injectable clock every measurement reads.

pub mod clock;
pub mod hot_compute;
pub mod monitor;
pub mod pipeline;
pub mod workers;

pub use pipeline::{OrchestrationStats, Orchestrator};
pub use workers::InjectedFault;
