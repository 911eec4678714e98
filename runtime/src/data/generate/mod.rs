//! Synthetic graphs for benchmarks and tests: R-MAT (power-law) and stochastic
//! block models, with labels and class-correlated features.
//!
//! Both generators ([`generate_rmat`], [`generate_sbm`]) work the same way:
//!
//! 1. Validate the options; an error names the option and its allowed range.
//! 2. Draw a random permutation of the vertex ids, and plant the classes on the
//!    pre-permutation ids (R-MAT: member index inside a super-vertex; SBM: block),
//!    so classes have `n / C` vertices each (±1). Draw the train/val/test split.
//! 3. Generate `num_edges` edges in parallel chunks of a fixed size, chunk `i` from
//!    its own random stream, writing permuted ids. Each model sends a chosen
//!    fraction (`homophily`) of the edges inside a class.
//! 4. Build the CSR graph: symmetrized, deduplicated, no self-loops.
//! 5. Features: [`class_features`] of the labels (a class center times `signal`
//!    plus unit Gaussian noise), so a weak signal leaves room for a GNN to gain by
//!    aggregating homophilous neighbors.
//!
//! Everything is deterministic for a seed whatever the rayon thread count.
//! [`GraphStats`] reports degrees and the measured edge homophily.
//!
//! ```
//! use runtime::data::{generate_rmat, RmatOptions};
//!
//! # fn main() -> runtime::Result<()> {
//! let ds = generate_rmat(&RmatOptions {
//!     num_vertices: 1000,
//!     num_edges: 5000,
//!     num_classes: 4,
//!     feature_dim: 8,
//!     seed: 7,
//!     ..RmatOptions::default()
//! })?;
//! assert_eq!((ds.num_vertices(), ds.features.dim(), ds.num_classes), (1000, 8, 4));
//! // Deterministic for a seed.
//! let again = generate_rmat(&RmatOptions { num_vertices: 1000, num_edges: 5000,
//!     num_classes: 4, feature_dim: 8, seed: 7, ..RmatOptions::default() })?;
//! assert_eq!(ds.graph.indices().as_slice(), again.graph.indices().as_slice());
//! # Ok(())
//! # }
//! ```

mod assembly;
mod features;
mod rmat;
mod sbm;
mod stats;

pub use features::{class_features, region_labels};
pub use rmat::{generate_rmat, generate_rmat_with, RmatOptions};
pub use sbm::{generate_sbm, generate_sbm_with, SbmOptions};
pub use stats::{edge_homophily, GraphStats};
