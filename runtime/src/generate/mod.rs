//! Synthetic graphs for benchmarks and tests: R-MAT (power-law) and stochastic
//! block models, with labels and class-correlated features.

mod features;

pub use features::{class_features, region_labels};
