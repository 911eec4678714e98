//! Importers from real-world formats into [`crate::dataset::Dataset`].
//!
//! - [`import_wordnet`]: WordNet 3.0 data files (synsets, pointers, lexicographer
//!   classes, bag-of-words glosses);
//! - [`import_metis`]: METIS `.graph` files (topology only);
//! - [`import_edge_list`]: SNAP-style edge lists (topology only);
//! - [`import_npy_dir`]: a directory of `.npy` arrays, as [`crate::export`] writes;
//! - [`DatasetBuilder`]: in-memory arrays (`ndarray` views, slices), no files.
//!
//! Topology-only formats get labels, features and a split from
//! [`GraphImportOptions`] (from `.npy` files or generated).

mod arrays;
mod attach;
mod edgelist;
mod metis;
mod npydir;
pub mod wordnet;

pub use arrays::{ArrayInt, DatasetBuilder};
pub use attach::{dataset_from_graph, FeatureSource, GraphImportOptions, LabelSource};
pub use edgelist::{import_edge_list, read_edge_list, EdgeListGraph};
pub use metis::{import_metis, read_metis};
pub use npydir::import_npy_dir;
pub use wordnet::{import_wordnet, WordNetOptions};
