//! `tandem._tandem`: the native half of the `tandem` Python package, a thin PyO3
//! layer over `runtime`'s public API. It converts and nothing more: arrays in
//! (used in place where the layout allows: `arrays.rs`), datasets (`dataset.rs`),
//! configuration from dicts and files (`config.rs`), the trainer with its
//! callbacks and Ctrl-C (`trainer.rs`), the mini-batch loader for a model of
//! the caller's own (`loader.rs`), and `runtime::Error` as Python
//! exceptions with the same messages (`errors.rs`). The pure-Python half
//! (`python/tandem/`) adds the PyG / DGL adapters and the progress bar.

mod arrays;
mod config;
mod dataset;
mod device_batch;
mod errors;
mod loader;
mod trainer;

use pyo3::prelude::*;

/// The native module (imported by `tandem/__init__.py`).
#[pymodule]
fn _tandem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<dataset::Dataset>()?;
    m.add_class::<trainer::Trainer>()?;
    m.add_class::<trainer::EpochRecord>()?;
    m.add_class::<trainer::BatchRecord>()?;
    m.add_class::<loader::NeighborLoader>()?;
    m.add_class::<loader::LoaderIter>()?;
    m.add_class::<loader::LoaderBatch>()?;
    m.add_class::<loader::Hop>()?;
    m.add_class::<device_batch::DeviceBatch>()?;
    m.add_class::<device_batch::DeviceHop>()?;
    m.add_class::<device_batch::DeviceArray>()?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CUDA_COMPILED", cfg!(feature = "cuda"))?;
    Ok(())
}
