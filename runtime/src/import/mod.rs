//! Importers from real-world formats into [`crate::dataset::Dataset`].

pub mod wordnet;

pub use wordnet::{import_wordnet, WordNetOptions};
