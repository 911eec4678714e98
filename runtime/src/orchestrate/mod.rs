//! Layer-based orchestration at run time (docs/orchestration.md §9): the CPU
//! computes hot vertices' bottom-layer embeddings a super-batch ahead while the
//! device engine trains, and every batch reuses them within the staleness bound.
//!
//! - [`hot_table`]: the versioned table of hot embeddings;
//! - [`hot_compute`]: published layer-0 weights and the CPU computation of a chunk;
//! - [`monitor`]: the hybrid monitor at run time ([`HybridMonitor`]): moves hot
//!   vertices between CPU computation and the device feature cache;
//! - [`pipeline`]: the executor ([`Orchestrator`]) — protocol in its module doc.

pub mod hot_compute;
pub mod hot_table;
pub mod monitor;
pub mod pipeline;

pub use hot_compute::{HotComputer, Published, Snapshot};
pub use hot_table::HotTable;
pub use monitor::HybridMonitor;
pub use pipeline::{InjectedFault, OrchestrationStats, Orchestrator};
