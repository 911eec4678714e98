//! Cross-crate integration tests live in this package's `[[test]]` targets
//! (`data_path.rs`, `fuzz_smoke.rs`); the library itself is empty.
