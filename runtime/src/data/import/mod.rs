//! Importers from real-world formats into [`crate::data::dataset::Dataset`].
//!
//! - [`import_wordnet`]: WordNet 3.0 data files (synsets, pointers, lexicographer
//!   classes, bag-of-words glosses);
//! - [`import_metis`]: METIS `.graph` files (topology only);
//! - [`import_edge_list`]: SNAP-style edge lists (topology only);
//! - [`import_npy_dir`]: a directory of `.npy` arrays, as [`crate::data::export`] writes;
//! - [`import_ogb_dir`]: an OGB node-property dataset as the `ogb` package downloads it;
//! - [`DatasetBuilder`]: in-memory arrays (`ndarray` views, slices), no files.
//!
//! Topology-only formats get labels, features and a split from
//! [`GraphImportOptions`] (from `.npy` files or generated), and optionally a
//! link-prediction split ([`EdgeSplitSource`]: held out at random, or from files).
//!
//! ```
//! use runtime::data::{import_edge_list, GraphImportOptions};
//!
//! # fn main() -> runtime::Result<()> {
//! let path = std::env::temp_dir().join(format!("tandem-doc-{}.txt", std::process::id()));
//! std::fs::write(&path, "# a triangle and a tail\n0 1\n1 2\n2 0\n2 3\n").unwrap();
//! // Undirected by default: each edge stored both ways; labels, features and the
//! // split generated (GraphImportOptions says how).
//! let ds = import_edge_list(&path, &GraphImportOptions::default())?;
//! assert_eq!((ds.num_vertices(), ds.graph.num_edges()), (4, 8));
//! std::fs::remove_file(&path).ok();
//! # Ok(())
//! # }
//! ```

mod arrays;
mod attach;
mod edge_split;
mod edgelist;
mod metis;
mod npydir;
mod ogb;
mod text;
pub mod wordnet;

pub use arrays::{ArrayInt, DatasetBuilder};
pub use attach::{dataset_from_graph, FeatureSource, GraphImportOptions, LabelSource};
pub use edge_split::{EdgeSplitFiles, EdgeSplitSource};
pub use edgelist::{
    import_edge_list, import_edge_list_with, read_edge_list, read_edge_list_with, EdgeListGraph,
};
pub use metis::{import_metis, import_metis_with, read_metis, read_metis_with};
pub use npydir::{import_npy_dir, import_npy_dir_with};
pub use ogb::{import_ogb_dir, import_ogb_dir_with, OgbOptions};
pub use wordnet::{import_wordnet, import_wordnet_with, WordNetOptions};
