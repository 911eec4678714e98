//! Tandem's runtime: the library a training service embeds, and the `tandem`
//! CLI (feature `cli`).
//!
//! The public API is the names re-exported here and seven modules: [`config`] (the
//! configuration schema), [`data`] (datasets: store, importers, generators,
//! export), [`dist`] (data-parallel jobs), [`loader`] (sampled mini-batches for
//! a model trained elsewhere), [`onnx`] (export and serving),
//! [`trace`] (Chrome traces, summaries, utilization), [`progress`] (progress
//! reports of generation and import to a caller's sink), and `cli`. Everything else
//! — the session, the placement module, the executors, the device engine — is
//! internal; `docs/architecture.md` maps it.
//!
//! Dependency direction: `cpu_ops` ← `gpu_ops` ← `scheduler` ← `runtime`.
//!
//! # Training from a program
//! [`TrainerBuilder`] (from a [`config::TrainConfig`], a TOML string or a file;
//! optionally an in-memory [`Dataset`] — from arrays with
//! [`DatasetBuilder`] —, callbacks, a [`CancelToken`], `verbose`) → [`Trainer`]:
//! - [`Trainer::fit`] trains up to `train.epochs`; [`Trainer::fit_epochs`] `n`
//!   more; [`Trainer::train_epoch`] trains one epoch; [`Trainer::evaluate`] / [`Trainer::evaluate_val_test`] measure
//!   accuracy;
//! - [`Trainer::embeddings`] returns the output of the layer below the classifier
//!   for given vertices (full-neighbor inference, as DGL's `model.inference`
//!   without the last layer) as an `ids × hidden` [`ndarray::Array2`],
//!   [`Trainer::embedding_table`] a shareable snapshot for all of them;
//!   [`Trainer::predict`] / [`Trainer::full_graph_logits`] the logits of given /
//!   all vertices; [`Trainer::infer_to_file`] writes either for every vertex to
//!   a `.npy` file, streamed layer by layer in row blocks (memory: the store and
//!   one block, not a matrix of every vertex);
//! - [`Trainer::save_checkpoint`] / [`Trainer::load_checkpoint`]: a resumed run is
//!   bit-identical to an uninterrupted one;
//! - [`Trainer::export_onnx`] writes the model as an ONNX graph that takes the
//!   features and each layer's block (a sampled batch or the whole graph);
//!   [`onnx::OrtModel`] runs it through ONNX Runtime (feature `onnx-runtime`);
//! - [`Callback`]s see [`BatchMetrics`] and [`EpochStats`] and may stop training;
//!   a [`CancelToken`] stops it from another thread within one batch
//!   ([`Error::Cancelled`]).
//!
//! Nothing is global: each trainer owns its model and its place in training,
//! prints nothing unless asked, and reports failures as [`Error`] values.
//!
//! # Many jobs in one process
//! A service trains several jobs at once on one copy of the data and a share of
//! the machine:
//! - [`TrainerBuilder::dataset`] takes a [`Dataset`] or an `Arc<Dataset>`; jobs
//!   given clones of one `Arc` share its arrays ([`Trainer::shared_dataset`];
//!   [`cpu_ops::HostArray`] clones share their elements, so nothing below the
//!   trainer copies them either);
//! - [`TrainerBuilder::threads`] is a job's core budget (its own pool of that
//!   many workers), [`TrainerBuilder::thread_pool`] runs it on a rayon pool
//!   shared with other jobs ([`rayon`] is re-exported); without either, each
//!   trainer builds a pool over all cores;
//! - on a GPU, [`TrainerBuilder::device_ordinal`] picks the device and
//!   [`TrainerBuilder::device_memory_budget`] bounds what the job plans to use
//!   there (`device.memory_budget_bytes`); `device.kind` defaults to `"auto"`,
//!   so set `"host"` to keep a job off a GPU;
//! - callbacks can be removed again ([`Trainer::add_callback`] returns a
//!   [`CallbackId`] for [`Trainer::remove_callback`]; [`Trainer::clear_callbacks`]),
//!   which drops what they own (a channel's sender) while the trainer lives on;
//! - [`Trainer::fit`] trains up to `train.epochs` and afterwards returns
//!   [`Error::TrainingComplete`]; [`Trainer::fit_epochs`] trains `n` more;
//!   [`Trainer::train_epoch`] trains one more epoch, past `train.epochs` too.
//!
//! `examples/service_jobs.rs` runs four jobs this way.
//!
//! # Devices and the `cuda` feature
//! `device.kind` defaults to `"auto"`: a trainer takes a usable CUDA GPU when the
//! build has CUDA and one is there, else the host backend, so the same service
//! moves to a GPU on a GPU machine without asking. Set `device.kind = "host"` to
//! stay on the CPU, or build without the `cuda` feature (on by default):
//! `runtime = { default-features = false }` compiles no CUDA code (no cudarc);
//! `"auto"` is then always the host and `"cuda"` is [`Error::CudaNotCompiled`].
//! `default-features = false, features = ["cuda"]` is the library with CUDA and
//! without the CLI.
//!
//! # Errors
//! [`Error`] is `#[non_exhaustive]`; every message is one line. The variants a
//! program branches on carry structured fields:
//! - [`Error::Dataset`] (`field`, `index`, a [`DatasetProblem`]: a count that
//!   disagrees with the vertex count, an id out of range, a non-finite feature,
//!   masks that overlap, a bad split, ...);
//! - [`Error::Config`] (`origin`, `key`, a [`ConfigProblem`]: unknown key, bad
//!   value with expected and found, TOML syntax with line and column);
//! - [`Error::CheckpointMismatch`] (an intact checkpoint of another model or
//!   dataset: `field`, `expected`, `found`) and [`Error::CheckpointCorrupt`];
//! - [`Error::Cancelled`], [`Error::NonFinite`], [`Error::CudaNotCompiled`].
//!
//! Errors of the crates below (`cpu_ops`, `gpu_ops`, `scheduler`) are boxed
//! sources ([`BoxedSource`]) of [`Error::CpuOps`], [`Error::Device`] and
//! [`Error::Scheduler`]; their types are not part of this API.
//!
//! ```
//! use runtime::{on_epoch, CancelToken, Control, TrainerBuilder};
//!
//! # fn main() -> runtime::Result<()> {
//! let toml = r#"
//!     [data.synthetic]
//!     vertices = 600
//!     edges = 3000
//!     classes = 3
//!     dim = 8
//!     [model]
//!     hidden = 16
//!     [train]
//!     epochs = 3
//!     batch_size = 128
//!     [threads]
//!     compute = 1
//! "#;
//! let cancel = CancelToken::new();
//! let mut trainer = TrainerBuilder::from_toml(toml)?
//!     .callback(on_epoch(|s| {
//!         assert!(s.loss.is_finite());
//!         Control::Continue
//!     }))
//!     .cancel_token(cancel.clone())
//!     .build()?;
//! let stats = trainer.fit()?;
//! assert_eq!(stats.len(), 3);
//!
//! // Embeddings of vertices 0 and 5: a 2 × hidden matrix; their logits.
//! let emb = trainer.embeddings(&[0, 5])?;
//! assert_eq!(emb.dim(), (2, 16));
//! assert_eq!(trainer.predict(&[0, 5])?.dim(), (2, 3));
//! assert!(trainer.embeddings(&[600]).is_err()); // ids are checked
//!
//! // Checkpoint and restore into a fresh trainer.
//! let path = std::env::temp_dir().join(format!("tandem-doc-{}.tck", std::process::id()));
//! trainer.save_checkpoint(&path)?;
//! let mut again = TrainerBuilder::from_toml(toml)?.build()?;
//! again.load_checkpoint(&path)?;
//! assert_eq!(again.embeddings(&[0, 5])?, emb);
//! std::fs::remove_file(&path).ok();
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

pub(crate) mod atomic;
pub(crate) mod cancel;
pub(crate) mod checkpoint;
#[cfg(feature = "cli")]
pub mod cli;
pub(crate) mod clock;
pub mod config;
pub mod data;
pub mod dist;
pub(crate) mod embedding;
pub(crate) mod engine;
mod error;
pub(crate) mod executor;
pub mod loader;
pub mod onnx;
pub(crate) mod placement;
pub(crate) mod pool;
pub mod progress;
#[cfg(feature = "cli")]
pub(crate) mod run_dir;
pub(crate) mod session;
pub(crate) mod task;
pub mod trace;

pub use checkpoint::{Checkpoint, DatasetShape, Position, TensorState};
pub use data::{Dataset, DatasetBuilder};
pub use embedding::Embeddings;
pub use error::{BoxedSource, ConfigProblem, DatasetProblem, Error, Result, StopCause};
pub use executor::OrchestrationStats;
/// The `ndarray` version the array-taking and array-returning API uses.
pub use ndarray;
/// The `rayon` version of [`TrainerBuilder::thread_pool`]'s pool.
pub use rayon;
pub use session::builder::TrainerBuilder;
pub use session::control::{
    on_batch, on_epoch, test_at_best_val, BatchMetrics, Callback, CallbackId, CancelToken, Control,
    EpochStats,
};
pub use session::{load_dataset, InferOutput, InferReport, Trainer};
pub use task::{LinkMetric, MetricValue};
