//! The error type of the `runtime` crate.
//!
//! [`Error`] is `#[non_exhaustive]`: a program matches the variants it acts on and
//! keeps a `_` arm. Variants carry structured fields (the field, key or file; the
//! index; what was expected and found) so a program can branch without reading
//! the text; every message is one line. Errors from the crates below (`cpu_ops`,
//! `gpu_ops`, `scheduler`, which `runtime` does not re-export) are kept as boxed
//! [`std::error::Error`] sources, so their types are not part of this API.

use std::path::{Path, PathBuf};

/// A boxed error source from a crate whose types `runtime` does not re-export.
pub type BoxedSource = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything the runtime reports to its caller. Messages are one line and name the
/// file, line, key or field involved and what was expected, so the CLI can print
/// them as they are.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system I/O error on a file.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A data file (a dataset store, an `.npy` array, a trace) is malformed: wrong
    /// magic, sizes that disagree, bad checksum. Checkpoints have their own
    /// variants ([`Error::CheckpointCorrupt`], [`Error::CheckpointMismatch`]), a
    /// configuration [`Error::Config`].
    #[error("{}: {what}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong and what was expected.
        what: String,
    },
    /// A text data file (an edge list, a label file) has a bad line.
    #[error("{}:{line}: {what}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong and what was expected.
        what: String,
    },
    /// A dataset's parts are inconsistent with each other or hold a bad value:
    /// `field` names the array (`features`, `labels`, `edge_index`, `indptr`,
    /// `train_mask`, ...), `index` the element to blame (empty: the array as a
    /// whole), `problem` what is wrong.
    #[error("invalid dataset: {field}{}{problem}", fmt_index(index))]
    Dataset {
        /// The array or part of the dataset.
        field: String,
        /// The element's position (`[1, 17]` for `edge_index[1, 17]`), empty when
        /// the whole array is to blame.
        index: Vec<usize>,
        /// What is wrong.
        problem: DatasetProblem,
    },
    /// A configuration problem: an unknown key, a bad value, TOML syntax.
    /// `origin` is where it came from (the file, `<toml string>`, `--set
    /// train.lr=-1` or `TANDEM_TRAIN__LR`; empty for a config built in code),
    /// `key` the dotted key (`train.lr`; empty for a syntax error).
    #[error("{}{problem}", fmt_config_place(origin, key))]
    Config {
        /// Where the text came from.
        origin: String,
        /// The dotted key.
        key: String,
        /// What is wrong.
        problem: ConfigProblem,
    },
    /// A checkpoint that is intact but does not fit this trainer: another model,
    /// dataset or (inside an epoch) seed or batch size. `field` names what differs
    /// (`model.hidden`, `dataset.vertices`, `tensor layer0.weight`, ...).
    #[error("{}: {field} is {expected} here but {found} in the checkpoint", path.display())]
    CheckpointMismatch {
        /// The checkpoint file.
        path: PathBuf,
        /// What differs.
        field: String,
        /// Its value in this trainer.
        expected: String,
        /// Its value in the checkpoint.
        found: String,
    },
    /// A checkpoint file that is not a readable Tandem checkpoint: wrong magic,
    /// another format version, bad checksum, truncated.
    #[error("{}: {what}", path.display())]
    CheckpointCorrupt {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A user-supplied argument (an API argument, a CLI option, an environment
    /// variable) is out of range.
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
         they were before this batch"
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
        /// The underlying error (a `cpu_ops` error).
        source: BoxedSource,
    },
    /// `device.kind = "cuda"` (or a `--device cuda` option) in a build of
    /// `runtime` without its `cuda` feature.
    #[error(
        "{context}: this build has no CUDA support (runtime was compiled without its `cuda` feature)"
    )]
    CudaNotCompiled {
        /// What asked for CUDA.
        context: String,
    },
    /// An error from the accelerator layer (a missing CUDA library, a failed kernel
    /// launch, ...), with what the runtime was doing.
    #[error("{context}: {source}")]
    Device {
        /// What the runtime was doing.
        context: String,
        /// The underlying error (a `gpu_ops` error).
        source: BoxedSource,
    },
    /// A scheduling decision failed (bad knob, or a bookkeeping bug it caught).
    #[error("{context}: {source}")]
    Scheduler {
        /// What the runtime was doing.
        context: String,
        /// The underlying error (a `scheduler` error).
        source: BoxedSource,
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
    /// The dataset file `data.path` names could not be opened or read: `source`
    /// says why (naming the file), `origin` which configuration layer set the
    /// path (the file, `--set data.path=…` or `TANDEM_DATA__PATH`).
    #[error("{source} (data.path, set by {origin})")]
    DataPath {
        /// The configuration layer that set `data.path`.
        origin: String,
        /// The error opening or reading the file.
        source: Box<Error>,
    },
    /// `Trainer::fit` found all `train.epochs` epochs trained already (`fit_epochs(n)` trains more).
    #[error("all {epochs} epochs of train.epochs are trained; fit_epochs(n) trains n more")]
    TrainingComplete {
        /// `train.epochs`.
        epochs: usize,
    },
}

/// What is wrong with a dataset ([`Error::Dataset`]).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum DatasetProblem {
    /// The array was not given (to a [`crate::DatasetBuilder`]).
    Missing,
    /// The array's length (rows, for a matrix) disagrees with the vertex count.
    Count {
        /// The length it must have.
        expected: u64,
        /// Its length.
        found: u64,
        /// Where the expected count comes from (`num_vertices`, `the vertices of
        /// the CSR`, ...).
        basis: &'static str,
    },
    /// The array has the wrong shape.
    Shape {
        /// The shape it must have.
        expected: &'static str,
        /// Its shape.
        found: Vec<usize>,
    },
    /// An id, offset or label is negative.
    Negative {
        /// The value.
        value: i128,
    },
    /// An id, offset or label is not below its bound (a vertex id not below the
    /// vertex count, a label not below `num_classes`).
    OutOfRange {
        /// The value.
        value: i128,
        /// The exclusive bound.
        bound: u64,
        /// What the bound is (`the vertex count`, `num_classes`, ...).
        bound_name: &'static str,
    },
    /// A feature value is NaN or infinite.
    NonFinite {
        /// The value.
        value: f32,
    },
    /// A vertex is in two of the train / validation / test parts (`index` is the
    /// vertex; `field` the first part).
    Overlap {
        /// The other part (`val_mask`, `test_mask`).
        other: &'static str,
    },
    /// The train / validation / test split cannot be drawn or is empty where it
    /// must not be.
    Split {
        /// What is wrong.
        what: String,
    },
    /// Any other inconsistency, described.
    Invalid {
        /// What is wrong.
        what: String,
    },
}

impl std::fmt::Display for DatasetProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing => write!(f, ": not given"),
            Self::Count {
                expected,
                found,
                basis,
            } => write!(f, ": length {found}, expected {expected} ({basis})"),
            Self::Shape { expected, found } => {
                let dims: Vec<String> = found.iter().map(usize::to_string).collect();
                write!(f, ": shape ({}), expected {expected}", dims.join(", "))
            }
            Self::Negative { value } => write!(f, " = {value} is negative"),
            Self::OutOfRange {
                value,
                bound,
                bound_name,
            } => write!(f, " = {value} is not below {bound_name} {bound}"),
            Self::NonFinite { value } => write!(f, " = {value} is not a finite number"),
            Self::Overlap { other } => {
                write!(f, ": also in {other}; the parts must be disjoint")
            }
            Self::Split { what } | Self::Invalid { what } => write!(f, ": {}", one_line(what)),
        }
    }
}

/// What is wrong with a configuration ([`Error::Config`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigProblem {
    /// The key is not part of the schema.
    UnknownKey {
        /// The keys allowed there (`expected one of ...`), as the parser says it.
        expected: String,
    },
    /// The key's value has the wrong type or is out of range.
    BadValue {
        /// What was expected (a type, a range, a list of names).
        expected: String,
        /// The value given.
        found: String,
    },
    /// The text is not valid TOML.
    Syntax {
        /// 1-based line.
        line: usize,
        /// 1-based column (in characters).
        column: usize,
        /// The parser's message.
        what: String,
    },
}

impl std::fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownKey { expected } => write!(f, "unknown key; {}", one_line(expected)),
            Self::BadValue { expected, found } => {
                write!(
                    f,
                    "expected {}, found {}",
                    one_line(expected),
                    one_line(found)
                )
            }
            Self::Syntax { line, column, what } => {
                write!(f, "line {line}, column {column}: {}", one_line(what))
            }
        }
    }
}

/// `[1, 17]` for an index, nothing for none.
fn fmt_index(index: &[usize]) -> String {
    if index.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = index.iter().map(usize::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// `origin: key `k`: `, leaving out the parts that are empty.
fn fmt_config_place(origin: &str, key: &str) -> String {
    let mut out = String::new();
    if !origin.is_empty() {
        out.push_str(origin);
        out.push_str(": ");
    }
    if !key.is_empty() {
        out.push_str(&format!("key `{key}`: "));
    }
    out
}

/// `s` with line breaks folded into spaces (messages stay one line).
fn one_line(s: &str) -> String {
    if s.contains('\n') {
        s.split_whitespace().collect::<Vec<_>>().join(" ")
    } else {
        s.to_string()
    }
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

    /// A dataset problem in `field` at `index` (empty: the whole field).
    pub(crate) fn dataset(
        field: impl Into<String>,
        index: &[usize],
        problem: DatasetProblem,
    ) -> Self {
        Self::Dataset {
            field: field.into(),
            index: index.to_vec(),
            problem,
        }
    }

    /// A dataset inconsistency in `field` described by `what`.
    pub(crate) fn dataset_invalid(field: impl Into<String>, what: impl Into<String>) -> Self {
        Self::dataset(field, &[], DatasetProblem::Invalid { what: what.into() })
    }

    /// A bad configuration value at `key` (origin filled in by the config layers).
    pub(crate) fn config_value(
        key: impl Into<String>,
        expected: impl Into<String>,
        found: impl Into<String>,
    ) -> Self {
        Self::Config {
            origin: String::new(),
            key: key.into(),
            problem: ConfigProblem::BadValue {
                expected: expected.into(),
                found: found.into(),
            },
        }
    }

    /// A corrupt checkpoint at `path`.
    pub(crate) fn checkpoint_corrupt(path: &Path, what: impl Into<String>) -> Self {
        Self::CheckpointCorrupt {
            path: path.to_path_buf(),
            what: what.into(),
        }
    }

    /// A checkpoint at `path` whose `field` is `found` where this trainer has
    /// `expected`.
    pub(crate) fn checkpoint_mismatch(
        path: &Path,
        field: impl Into<String>,
        expected: impl ToString,
        found: impl ToString,
    ) -> Self {
        Self::CheckpointMismatch {
            path: path.to_path_buf(),
            field: field.into(),
            expected: expected.to_string(),
            found: found.to_string(),
        }
    }

    /// Wraps a kernel error with context.
    pub(crate) fn cpu_ops(context: impl Into<String>, source: cpu_ops::CpuOpsError) -> Self {
        Self::CpuOps {
            context: context.into(),
            source: Box::new(source),
        }
    }

    /// Wraps an accelerator-layer error with context. A kernel error from the
    /// host math inside it becomes [`Error::CpuOps`].
    pub fn device(context: impl Into<String>, source: gpu_ops::GpuOpsError) -> Self {
        match source {
            gpu_ops::GpuOpsError::CpuOps(e) => Self::cpu_ops(context, e),
            source => Self::Device {
                context: context.into(),
                source: Box::new(source),
            },
        }
    }

    /// Wraps a scheduler error with context.
    pub(crate) fn scheduler(context: impl Into<String>, source: scheduler::SchedulerError) -> Self {
        Self::Scheduler {
            context: context.into(),
            source: Box::new(source),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Errors cross threads (a service's job runner) and box into `dyn Error`;
    /// a `Result` stays small (clippy's `result_large_err` bound is 128 bytes).
    #[test]
    fn the_error_is_send_sync_static_and_small() {
        fn check<T: Send + Sync + 'static + std::error::Error>() {}
        check::<Error>();
        assert!(
            std::mem::size_of::<Error>() < 128,
            "{}",
            std::mem::size_of::<Error>()
        );
    }

    /// The library's non-finite message gives no CLI advice (the CLI adds it).
    #[test]
    fn non_finite_names_the_batch_and_gives_no_cli_advice() {
        let e = Error::NonFinite {
            epoch: 2,
            batch: 7,
            loss: f64::NAN,
        };
        assert!(matches!(
            e,
            Error::NonFinite {
                epoch: 2,
                batch: 7,
                ..
            }
        ));
        let m = e.to_string();
        assert!(m.contains("epoch 2, batch 7") && m.contains("NaN"), "{m}");
        assert!(!m.contains("tandem") && !m.contains('\n'), "{m}");
    }

    /// Sources from the crates below are boxed, still reachable as
    /// `Error::source`, and a kernel error inside a device error keeps its kind.
    #[test]
    fn sources_of_lower_crates_are_boxed() {
        let kernel = cpu_ops::CpuOpsError::InvalidArgument {
            name: "x",
            reason: "bad".into(),
        };
        let e = Error::device("gather", gpu_ops::GpuOpsError::CpuOps(kernel));
        assert!(
            matches!(&e, Error::CpuOps { context, .. } if context == "gather"),
            "{e:?}"
        );
        assert!(std::error::Error::source(&e).is_some());
        let e = Error::scheduler(
            "plan",
            scheduler::SchedulerError::InvalidArgument {
                name: "y",
                expected: "a".into(),
                found: "b".into(),
            },
        );
        assert!(matches!(&e, Error::Scheduler { .. }), "{e:?}");
        assert!(std::error::Error::source(&e).is_some());
    }

    /// Dataset and config messages are one line, whatever their parts hold.
    #[test]
    fn messages_are_one_line() {
        let e = Error::dataset_invalid("graph", "two\nlines");
        assert_eq!(e.to_string(), "invalid dataset: graph: two lines");
        let e = Error::Config {
            origin: "t.toml".into(),
            key: String::new(),
            problem: ConfigProblem::Syntax {
                line: 3,
                column: 6,
                what: "expected a value\n".into(),
            },
        };
        assert_eq!(e.to_string(), "t.toml: line 3, column 6: expected a value");
    }
}
