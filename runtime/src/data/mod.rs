//! Graph datasets on disk and in memory: the `.tds` store ([`open_dataset`],
//! [`write_dataset`]), importers of real data (WordNet, METIS meshes, SNAP edge
//! lists, `.npy` directories), generators at scale (R-MAT, SBM), export for DGL and
//! PyG ([`export_npy`]), arrays in ([`DatasetBuilder`]), and `.npy` files
//! ([`npy`]).
//!
//! ```
//! use runtime::data::{generate_sbm, open_dataset, write_dataset, SbmOptions, Verify};
//!
//! # fn main() -> runtime::Result<()> {
//! let ds = generate_sbm(&SbmOptions { num_vertices: 300, num_edges: 900, ..SbmOptions::default() })?;
//! let path = std::env::temp_dir().join(format!("tandem-doc-{}.tds", std::process::id()));
//! write_dataset(&path, &ds)?; // atomic: a temporary name, then a rename
//! let back = open_dataset(&path, Verify::Full)?; // memory-mapped, every checksum checked
//! assert_eq!(back.num_vertices(), 300);
//! assert_eq!(back.features.as_slice(), ds.features.as_slice());
//! std::fs::remove_file(&path).ok();
//! # Ok(())
//! # }
//! ```

pub(crate) mod dataset;
pub(crate) mod export;
pub(crate) mod generate;
pub(crate) mod import;
pub mod npy;

pub use dataset::{
    open_dataset, parse_dataset_bytes, write_dataset, Amount, Dataset, EdgeList, EdgeSplit,
    EdgeSplitSpec, SplitSpec, Verify, FORMAT_VERSION, MAGIC,
};
pub use export::export_npy;
pub use generate::{
    class_features, edge_homophily, generate_rmat, generate_rmat_with, generate_sbm,
    generate_sbm_with, region_labels, GraphStats, RmatOptions, SbmOptions,
};
pub use import::{
    dataset_from_graph, import_edge_list, import_edge_list_with, import_metis, import_metis_with,
    import_npy_dir, import_npy_dir_with, import_ogb_dir, import_ogb_dir_with, import_wordnet,
    import_wordnet_with, read_edge_list, read_edge_list_with, read_metis, read_metis_with,
    ArrayInt, DatasetBuilder, EdgeListGraph, EdgeSplitFiles, EdgeSplitSource, FeatureSource,
    GraphImportOptions, LabelSource, OgbOptions, WordNetOptions,
};
