//! Importers from real-world formats into [`crate::dataset::Dataset`].
