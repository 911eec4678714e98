//! The error type of the `runtime` crate.

use std::path::{Path, PathBuf};

use cpu_ops::CpuOpsError;

/// Everything the runtime reports to its caller. Messages name the file, line or
/// key involved and what was expected, so the CLI can print them as they are.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system I/O error on a file.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A binary file is malformed: wrong magic, sizes that disagree, bad checksum.
    #[error("{}: {what}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong and what was expected.
        what: String,
    },
    /// A text file has a bad line.
    #[error("{}:{line}: {what}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong and what was expected.
        what: String,
    },
    /// A dataset's parts are inconsistent with each other.
    #[error("invalid dataset: {what}")]
    InvalidDataset {
        /// What is wrong.
        what: String,
    },
    /// A user-supplied argument or option is out of range.
    #[error("invalid value for `{name}`: {reason}")]
    InvalidArgument {
        /// The option or field name.
        name: String,
        /// What was expected.
        reason: String,
    },
    /// Training stopped early, by the cancel token or a callback. The trainer stays
    /// consistent: the next `train_epoch` continues from `batch` of `epoch`.
    #[error("training stopped before batch {batch} of epoch {epoch}: {cause}")]
    Cancelled {
        /// The 0-based epoch that was interrupted.
        epoch: usize,
        /// Batches of that epoch already trained (the next one to train).
        batch: usize,
        /// Why.
        cause: StopCause,
    },
    /// A batch's loss was NaN or infinite (`train.on_nonfinite = "stop"`). Its
    /// update was not applied: the weights are those after batch `batch − 1`, and
    /// the trainer's position is `batch` of `epoch`.
    #[error(
        "epoch {epoch}, batch {batch}: the loss is {loss}; training stopped with the weights as \
         they were before this batch (train.on_nonfinite = \"skip-batch\" trains on without it; \
         check the features for NaN with `tandem info --verify`, or lower train.lr)"
    )]
    NonFinite {
        /// The 0-based epoch.
        epoch: usize,
        /// The batch of that epoch whose loss was not finite.
        batch: usize,
        /// The loss value (NaN or ±inf).
        loss: f64,
    },
    /// A collective between the ranks of a distributed job failed (another rank
    /// ended, or the MPI library reported an error).
    #[error("distributed job: {what}")]
    Dist {
        /// What failed, naming the collective and the rank.
        what: String,
    },
    /// An error from the host kernels, with the context it happened in.
    #[error("{context}: {source}")]
    CpuOps {
        /// What the runtime was doing (often a file path).
        context: String,
        /// The underlying error.
        source: CpuOpsError,
    },
    /// An error from the accelerator layer (a missing CUDA library, a failed kernel
    /// launch, ...), with what the runtime was doing.
    #[error("{context}: {source}")]
    Device {
        /// What the runtime was doing.
        context: String,
        /// The underlying error.
        source: gpu_ops::GpuOpsError,
    },
    /// A scheduling decision failed (bad knob, or a bookkeeping bug it caught).
    #[error("{context}: {source}")]
    Scheduler {
        /// What the runtime was doing.
        context: String,
        /// The underlying error.
        source: scheduler::SchedulerError,
    },
    /// ONNX Runtime failed: its library could not be loaded, or it refused or
    /// failed to run a model (`runtime::onnx::OrtModel`).
    #[error("{context}: {what}")]
    OnnxRuntime {
        /// What the runtime was doing.
        context: String,
        /// ONNX Runtime's message.
        what: String,
    },
    /// A worker thread of the orchestration pipeline failed or panicked.
    #[error("orchestration worker `{worker}` failed: {what}")]
    Worker {
        /// Which worker.
        worker: String,
        /// Its error, or the panic message.
        what: String,
    },
    /// `Trainer::fit` found all `train.epochs` epochs trained already (`fit_epochs(n)` trains more).
    #[error("all {epochs} epochs of train.epochs are trained; fit_epochs(n) trains n more")]
    TrainingComplete {
        /// `train.epochs`.
        epochs: usize,
    },
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// A malformed-file error on `path`.
    pub fn format(path: &Path, what: impl Into<String>) -> Self {
        Self::Format {
            path: path.to_path_buf(),
            what: what.into(),
        }
    }

    /// A bad line in a text file.
    pub fn parse(path: &Path, line: u64, what: impl Into<String>) -> Self {
        Self::Parse {
            path: path.to_path_buf(),
            line,
            what: what.into(),
        }
    }

    /// An out-of-range argument.
    pub fn invalid_argument(name: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            name: name.into(),
            reason: reason.into(),
        }
    }

    /// Wraps a kernel error with context.
    pub fn cpu_ops(context: impl Into<String>, source: CpuOpsError) -> Self {
        Self::CpuOps {
            context: context.into(),
            source,
        }
    }
}

/// Why training stopped early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopCause {
    /// The trainer's [`crate::CancelToken`] was cancelled.
    Token,
    /// A [`crate::Callback`] returned [`crate::Control::Stop`].
    Callback,
}

impl std::fmt::Display for StopCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Token => "cancel token",
            Self::Callback => "a callback asked to stop",
        })
    }
}
