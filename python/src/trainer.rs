//! `tandem.Trainer`: `runtime::Trainer` from Python.
//!
//! # Threads, the GIL and Ctrl-C
//! 1. `fit` trains on a thread of its own with the GIL released; the calling
//!    thread waits on a channel, waking every [`SIGNAL_POLL`] to run Python's
//!    signal handlers (`PyErr_CheckSignals`, which only the main thread may
//!    call).
//! 2. A handler that raises (Ctrl-C: `KeyboardInterrupt`) cancels the
//!    trainer's `CancelToken`: training stops before its next batch, the
//!    position is kept, the token is replaced by a fresh one and the exception
//!    is raised — the trainer stays usable (save, fit again: the epoch goes on
//!    where it stopped).
//! 3. Callbacks run on the training thread with the GIL taken for each call.
//!    Returning `False` stops training (`fit` returns the epochs completed); an
//!    exception stops it too and is re-raised by `fit` unchanged.
//! 4. `evaluate`, `embeddings`, `predict`, `infer_to_file`, checkpoints and
//!    ONNX export also release the GIL (they are not interruptible).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use numpy::{IntoPyArray, PyArray1, PyArray2};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use runtime::onnx::{ExportOptions, OnnxOutput};
use runtime::trace::{write_chrome_trace, CounterSampler, SamplerOptions, Trace, Tracer};
use runtime::{
    BatchMetrics, Callback, CallbackId, CancelToken, Control, EpochStats, Error, InferOutput,
    MetricValue, StopCause, TrainerBuilder,
};
use slot::Slot;

use crate::arrays::ids;
use crate::config::{overrides, train_config};
use crate::dataset::Dataset;
use crate::errors::{to_py, IntoPy};

/// How often the waiting thread runs Python's signal handlers during `fit`.
const SIGNAL_POLL: Duration = Duration::from_millis(20);

/// One slot shared between a callback and `fit` (an error to re-raise).
mod slot {
    use std::sync::{Arc, Mutex};

    /// A value one side stores and the other takes.
    pub(crate) struct Slot<T>(Arc<Mutex<Option<T>>>);

    impl<T> Clone for Slot<T> {
        fn clone(&self) -> Self {
            Self(Arc::clone(&self.0))
        }
    }

    impl<T> Default for Slot<T> {
        fn default() -> Self {
            Self(Arc::new(Mutex::new(None)))
        }
    }

    impl<T> Slot<T> {
        pub(crate) fn put(&self, v: T) {
            if let Ok(mut g) = self.0.lock() {
                g.get_or_insert(v);
            }
        }
        pub(crate) fn take(&self) -> Option<T> {
            self.0.lock().ok().and_then(|mut g| g.take())
        }
    }
}

/// What one epoch did (`runtime::EpochStats`): the mean training loss,
/// accuracies (validation and test only when evaluated that epoch, else
/// `None`), seconds spent training and evaluating, batches and optimizer steps.
#[pyclass(module = "tandem", name = "EpochRecord", frozen)]
#[derive(Clone)]
pub(crate) struct EpochRecord {
    #[pyo3(get)]
    epoch: usize,
    #[pyo3(get)]
    loss: f64,
    #[pyo3(get)]
    train_acc: f64,
    #[pyo3(get)]
    val_acc: Option<f64>,
    #[pyo3(get)]
    test_acc: Option<f64>,
    #[pyo3(get)]
    train_secs: f64,
    #[pyo3(get)]
    eval_secs: f64,
    #[pyo3(get)]
    batches: usize,
    #[pyo3(get)]
    steps: u64,
    #[pyo3(get)]
    skipped_batches: usize,
    /// A link model's validation metrics, in `link.metrics` order.
    val_metrics: Vec<(String, f64)>,
    /// A link model's test metrics.
    test_metrics: Vec<(String, f64)>,
}

/// Metric values as `(name, value)` pairs in their configured order.
fn metric_pairs(m: &[MetricValue]) -> Vec<(String, f64)> {
    m.iter().map(|m| (m.name.clone(), m.value)).collect()
}

/// Pairs as a dict (insertion order kept: the first is the selection metric).
fn metric_dict<'py>(py: Python<'py>, m: &[(String, f64)]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in m {
        d.set_item(k, v)?;
    }
    Ok(d)
}

impl From<&EpochStats> for EpochRecord {
    fn from(s: &EpochStats) -> Self {
        Self {
            epoch: s.epoch,
            loss: s.loss,
            train_acc: s.train_acc,
            val_acc: s.val_acc,
            test_acc: s.test_acc,
            train_secs: s.train_secs,
            eval_secs: s.eval_secs,
            batches: s.batches,
            steps: s.steps,
            skipped_batches: s.skipped_batches,
            val_metrics: metric_pairs(&s.val_metrics),
            test_metrics: metric_pairs(&s.test_metrics),
        }
    }
}

#[pymethods]
impl EpochRecord {
    /// A link model's validation metrics (`{"mrr": ..., "hits@10": ...,
    /// "auc": ...}` in `link.metrics` order), empty for a node model or an
    /// epoch without evaluation.
    #[getter]
    fn val_metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        metric_dict(py, &self.val_metrics)
    }

    /// A link model's test metrics, as `val_metrics`.
    #[getter]
    fn test_metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        metric_dict(py, &self.test_metrics)
    }

    fn __repr__(&self) -> String {
        let acc = |a: Option<f64>| a.map_or_else(|| "None".into(), |x| format!("{x:.4}"));
        if !self.val_metrics.is_empty() || !self.test_metrics.is_empty() {
            let m = |m: &[(String, f64)]| {
                let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k:?}: {v:.4}")).collect();
                format!("{{{}}}", parts.join(", "))
            };
            return format!(
                "EpochRecord(epoch={}, loss={:.4}, val_metrics={}, test_metrics={}, \
                 train_secs={:.3}, eval_secs={:.3})",
                self.epoch,
                self.loss,
                m(&self.val_metrics),
                m(&self.test_metrics),
                self.train_secs,
                self.eval_secs
            );
        }
        format!(
            "EpochRecord(epoch={}, loss={:.4}, train_acc={:.4}, val_acc={}, test_acc={}, \
             train_secs={:.3}, eval_secs={:.3})",
            self.epoch,
            self.loss,
            self.train_acc,
            acc(self.val_acc),
            acc(self.test_acc),
            self.train_secs,
            self.eval_secs
        )
    }
}

/// What one training batch did (`runtime::BatchMetrics`), as a callback's
/// `on_batch` sees it.
#[pyclass(module = "tandem", name = "BatchRecord", frozen, get_all)]
#[derive(Clone)]
pub(crate) struct BatchRecord {
    epoch: usize,
    batch: usize,
    batches: usize,
    batch_size: usize,
    loss: f64,
    accuracy: f64,
    seconds: f64,
    step: u64,
}

#[pymethods]
impl BatchRecord {
    fn __repr__(&self) -> String {
        format!(
            "BatchRecord(epoch={}, batch={}/{}, loss={:.4}, accuracy={:.4})",
            self.epoch, self.batch, self.batches, self.loss, self.accuracy
        )
    }
}

/// A Python callback: a callable (called after every epoch with an
/// `EpochRecord`) or an object with `on_batch` and/or `on_epoch` methods.
struct PyCallback {
    obj: Py<PyAny>,
    /// The first exception a call raised, for `fit` to re-raise.
    error: Slot<PyErr>,
}

impl PyCallback {
    /// Calls `method` (or the object itself for `on_epoch` of a callable) with
    /// `arg`; `False` or an exception stops.
    fn call<A>(&self, method: &str, arg: A) -> Control
    where
        A: for<'py> IntoPyObject<'py>,
    {
        Python::attach(|py| {
            let obj = self.obj.bind(py);
            let target = match obj.getattr(method) {
                Ok(m) => m,
                Err(_)
                    if method == "on_epoch"
                        && obj.is_callable()
                        && !obj.hasattr("on_batch").unwrap_or(false) =>
                {
                    obj.clone()
                }
                Err(_) => return Control::Continue,
            };
            match target.call1((arg,)) {
                Ok(r) => match r.extract::<bool>() {
                    Ok(false) if !r.is_none() => Control::Stop,
                    _ => Control::Continue,
                },
                Err(e) => {
                    self.error.put(e);
                    Control::Stop
                }
            }
        })
    }
}

impl Callback for PyCallback {
    fn on_batch(&mut self, m: &BatchMetrics) -> Control {
        self.call(
            "on_batch",
            BatchRecord {
                epoch: m.epoch,
                batch: m.batch,
                batches: m.batches,
                batch_size: m.batch_size,
                loss: m.loss,
                accuracy: m.accuracy,
                seconds: m.seconds,
                step: m.step,
            },
        )
    }

    fn on_epoch(&mut self, s: &EpochStats) -> Control {
        self.call("on_epoch", EpochRecord::from(s))
    }
}

/// The trace being recorded (`trace=path`): events are collected after each
/// `fit` and the whole trace so far is written to `path`.
struct Tracing {
    path: PathBuf,
    tracer: Tracer,
    sampler: Option<CounterSampler>,
    so_far: Trace,
}

/// Trains a GNN on a dataset: `runtime::Trainer`, configured as `tandem train`
/// is configured.
///
/// `Trainer(dataset=None, config=None, *, overrides=None, verbose=False,
/// trace=None, **more)`:
///
/// - `dataset`: a `tandem.Dataset`, or `None` for what the config's `[data]`
///   section names (a `.tds` path, or the built-in synthetic graph);
/// - `config`: `None` (defaults), a dict of sections
///   (`{"model": {"kind": "gat"}, "train": {"epochs": 5}}`) or the path of a
///   TOML file — the same keys, validation and messages as `tandem train
///   --config` (`docs/config.md`);
/// - `overrides`: dotted keys applied after it (`{"train.lr": 0.01}`), as
///   `--set`; keyword arguments do the same with `__` between levels
///   (`train__lr=0.01`);
/// - `verbose`: a progress bar and one line per epoch on `sys.stderr`
///   (nothing is printed otherwise);
/// - `trace`: a path: record a Chrome/Perfetto trace, written after each `fit`.
///
/// Bad configuration raises `ConfigError` (`key`, `origin`), a bad dataset
/// `DatasetError`. Training releases the GIL; Ctrl-C stops within one batch
/// and raises `KeyboardInterrupt`, leaving the trainer usable.
#[pyclass(module = "tandem", name = "Trainer")]
pub(crate) struct Trainer {
    /// Behind a mutex only because a Python object must be `Sync`; PyO3's
    /// borrow rules already keep calls from overlapping.
    inner: Mutex<runtime::Trainer>,
    verbose: bool,
    tracing: Option<Tracing>,
}

/// Runs `f` on a thread of its own while this thread waits with the GIL
/// released, running Python's signal handlers every [`SIGNAL_POLL`]; a handler's
/// exception cancels `token` (step 2 of the module doc) and is returned beside
/// `f`'s result.
fn interruptible<T: Send>(
    py: Python<'_>,
    token: &CancelToken,
    f: impl FnOnce() -> T + Send,
) -> (T, Option<PyErr>) {
    let (tx, rx) = crossbeam_channel::bounded::<()>(1);
    let mut raised = None;
    let out = std::thread::scope(|s| {
        let worker = s.spawn(move || {
            let out = f();
            let _ = tx.send(());
            out
        });
        loop {
            let waited = py.detach(|| rx.recv_timeout(SIGNAL_POLL));
            if !matches!(waited, Err(crossbeam_channel::RecvTimeoutError::Timeout)) {
                break;
            }
            if raised.is_none() {
                if let Err(e) = py.check_signals() {
                    token.cancel();
                    raised = Some(e);
                }
            }
        }
        worker.join()
    });
    match out {
        Ok(v) => (v, raised),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

#[pymethods]
impl Trainer {
    #[new]
    #[pyo3(signature = (dataset=None, config=None, *, overrides=None, verbose=false, trace=None, **more))]
    fn new(
        py: Python<'_>,
        dataset: Option<PyRef<'_, Dataset>>,
        config: Option<&Bound<'_, PyAny>>,
        overrides: Option<&Bound<'_, PyDict>>,
        verbose: bool,
        trace: Option<PathBuf>,
        more: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let layers = self::overrides(overrides, more)?;
        let cfg = train_config(config, &layers)?;
        let mut builder = TrainerBuilder::new(cfg);
        if let Some(ds) = &dataset {
            builder = builder.dataset(Arc::clone(&ds.inner));
        }
        let tracing = trace.map(|path| {
            let tracer = Tracer::new();
            let sampler = CounterSampler::start(&tracer, SamplerOptions::default());
            Tracing {
                path,
                tracer,
                sampler: Some(sampler),
                so_far: Trace::default(),
            }
        });
        if let Some(t) = &tracing {
            builder = builder.tracer(t.tracer.clone());
        }
        let inner = py.detach(move || builder.build()).py_err()?;
        Ok(Self {
            inner: Mutex::new(inner),
            verbose,
            tracing,
        })
    }

    /// Trains until `train.epochs` epochs are complete — or, with `epochs`, that
    /// many more (past `train.epochs` too) — evaluating as configured, and
    /// returns the `EpochRecord`s of the epochs trained.
    ///
    /// `callback`: a callable called after every epoch with its `EpochRecord`,
    /// or an object with `on_batch(BatchRecord)` and/or
    /// `on_epoch(EpochRecord)`; returning `False` stops training (the epochs
    /// completed are returned), an exception stops it and propagates
    /// unchanged. Ctrl-C stops within one batch and raises `KeyboardInterrupt`;
    /// the next `fit` continues from there, bit-identically.
    #[pyo3(signature = (epochs=None, callback=None))]
    fn fit(
        &mut self,
        py: Python<'_>,
        epochs: Option<usize>,
        callback: Option<Py<PyAny>>,
    ) -> PyResult<Vec<EpochRecord>> {
        let token = CancelToken::new();
        let verbose = self.verbose;
        let trainer = self.tm();
        trainer.set_cancel_token(token.clone());
        let mut added: Vec<(CallbackId, Slot<PyErr>)> = Vec::new();
        let mut add = |trainer: &mut runtime::Trainer, obj: Py<PyAny>| {
            let error = Slot::default();
            let id = trainer.add_callback(Box::new(PyCallback {
                obj,
                error: error.clone(),
            }));
            added.push((id, error));
        };
        if verbose {
            let total = epochs.unwrap_or_else(|| {
                trainer
                    .config()
                    .train
                    .epochs
                    .saturating_sub(trainer.epoch())
            });
            let bar = py
                .import("tandem._progress")?
                .call_method1("ProgressBar", (total,))?;
            add(trainer, bar.unbind());
        }
        if let Some(cb) = callback {
            add(trainer, cb);
        }
        let (result, interrupt) = interruptible(py, &token, || match epochs {
            Some(n) => trainer.fit_epochs(n),
            None => trainer.fit(),
        });
        for (id, _) in &added {
            trainer.remove_callback(*id);
        }
        trainer.set_cancel_token(CancelToken::new());
        self.write_trace()?;
        if let Some(e) = interrupt {
            return Err(e);
        }
        for (_, error) in &added {
            if let Some(e) = error.take() {
                return Err(e);
            }
        }
        match result {
            Ok(stats) => Ok(stats.iter().map(EpochRecord::from).collect()),
            Err(Error::Cancelled {
                cause: StopCause::Callback,
                ..
            }) => Ok(Vec::new()),
            Err(e) => Err(to_py(e)),
        }
    }

    /// Accuracy without dropout: of `ids` (a float), or with no ids the
    /// validation and test accuracy (a pair), as `train.eval_mode` says.
    #[pyo3(signature = (ids=None))]
    fn evaluate(&mut self, py: Python<'_>, ids: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
        let trainer = self.tm();
        match ids {
            None => {
                let pair = py.detach(move || trainer.evaluate_val_test()).py_err()?;
                Ok(pair.into_pyobject(py)?.into_any().unbind())
            }
            Some(ids) => {
                let ids = self::ids(ids, "ids")?;
                let acc = py.detach(move || trainer.evaluate(&ids)).py_err()?;
                Ok(acc.into_pyobject(py)?.into_any().unbind())
            }
        }
    }

    /// A link model's validation and test metrics (a pair of dicts, in
    /// `link.metrics` order), as `train.eval_mode` says: each held-out edge
    /// ranked against its negatives (the store's fixed ones, or a fixed
    /// uniform draw).
    fn evaluate_link<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyDict>)> {
        let trainer = self.tm();
        let [v, t] = py.detach(move || trainer.evaluate_link()).py_err()?;
        Ok((
            metric_dict(py, &metric_pairs(&v))?,
            metric_dict(py, &metric_pairs(&t))?,
        ))
    }

    /// A link model's score (a logit) of every pair `(src[i], dst[i])`:
    /// a float32 array of `len(src)`, from full-neighbor inference.
    fn score_edges<'py>(
        &mut self,
        py: Python<'py>,
        src: &Bound<'py, PyAny>,
        dst: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        let (src, dst) = (ids(src, "src")?, ids(dst, "dst")?);
        let trainer = self.tm();
        let out = py
            .detach(move || trainer.score_edges(&src, &dst))
            .py_err()?;
        Ok(out.into_pyarray(py))
    }

    /// The output of the layer below the classifier (full-neighbor inference)
    /// for `ids`, or for every vertex: an `(len(ids), hidden)` float32 array.
    #[pyo3(signature = (ids=None))]
    fn embeddings<'py>(
        &mut self,
        py: Python<'py>,
        ids: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let trainer = self.tm();
        let out = match ids {
            None => py.detach(move || trainer.embedding_table().map(|t| t.to_array())),
            Some(ids) => {
                let ids = self::ids(ids, "ids")?;
                py.detach(move || trainer.embeddings(&ids))
            }
        }
        .py_err()?;
        Ok(out.into_pyarray(py))
    }

    /// The logits of `ids` (full-neighbor inference): `(len(ids), classes)`.
    fn predict<'py>(
        &mut self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let ids = self::ids(ids, "ids")?;
        let trainer = self.tm();
        let out = py.detach(move || trainer.predict(&ids)).py_err()?;
        Ok(out.into_pyarray(py))
    }

    /// Writes every vertex's embeddings (`what="embeddings"`) or logits
    /// (`"logits"`) to a `.npy` file, streamed layer by layer (memory: the
    /// store and one row block); returns `(rows, columns)`.
    #[pyo3(signature = (path, what="embeddings"))]
    fn infer_to_file(
        &mut self,
        py: Python<'_>,
        path: PathBuf,
        what: &str,
    ) -> PyResult<(usize, usize)> {
        let what = match what {
            "embeddings" => InferOutput::Embeddings,
            "logits" => InferOutput::Logits,
            other => {
                return Err(to_py(Error::invalid_argument(
                    "what",
                    format!("`{other}`; expected \"embeddings\" or \"logits\""),
                )))
            }
        };
        let trainer = self.tm();
        let r = py
            .detach(move || trainer.infer_to_file(what, &path))
            .py_err()?;
        Ok((r.rows, r.width))
    }

    /// Writes a checkpoint (weights, optimizer, position, configuration);
    /// written under a temporary name, then renamed.
    fn save_checkpoint(&mut self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let trainer = self.tm();
        py.detach(move || trainer.save_checkpoint(&path)).py_err()
    }

    /// Restores a checkpoint of the same model and dataset: training goes on
    /// bit-identically. A mismatch or corruption raises `CheckpointError`.
    fn load_checkpoint(&mut self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let trainer = self.tm();
        py.detach(move || trainer.load_checkpoint(&path)).py_err()
    }

    /// Writes the model as an ONNX graph returning `"logits"`, `"embeddings"`
    /// or (a link model) `"scores"` (`docs/onnx.md`).
    #[pyo3(signature = (path, output="logits"))]
    fn export_onnx(&mut self, py: Python<'_>, path: PathBuf, output: &str) -> PyResult<()> {
        let output = output
            .parse::<OnnxOutput>()
            .map_err(|e| to_py(Error::invalid_argument("output", e)))?;
        // The head comes from the trained model's configuration.
        let opts = ExportOptions {
            output,
            ..Default::default()
        };
        let trainer = self.tm();
        py.detach(move || trainer.export_onnx(&path, &opts))
            .py_err()
    }

    /// One line: the device training runs on and why (`device.kind = "auto"`
    /// names what was missing when it took the host).
    #[getter]
    fn device_note(&self) -> String {
        self.t().device_note().to_string()
    }

    /// One line: the placement that trains (`orchestration.policy`).
    #[getter]
    fn placement_note(&self) -> String {
        self.t().placement_note()
    }

    /// Completed epochs.
    #[getter]
    fn epoch(&self) -> usize {
        self.t().epoch()
    }

    /// Batches of the epoch in progress already trained (0 between epochs).
    #[getter]
    fn batch_in_epoch(&self) -> usize {
        self.t().batch_in_epoch()
    }

    /// Optimizer steps taken (the weight version).
    #[getter]
    fn steps(&self) -> u64 {
        self.t().steps()
    }

    /// Worker threads of the compute pool.
    #[getter]
    fn threads(&self) -> usize {
        self.t().threads()
    }

    /// The model's parameter count.
    #[getter]
    fn num_params(&self) -> usize {
        self.t().num_params()
    }

    /// The effective configuration as TOML (what `tandem train` prints).
    #[getter]
    fn config_toml(&self) -> String {
        self.t().config().to_toml()
    }

    /// The parameters at the current weights, by name (float32 arrays, copies).
    fn params<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let t = self.t();
        let values = t.params().py_err()?;
        for (name, v) in t.param_names().into_iter().zip(values) {
            let arr: Bound<'py, PyArray1<f32>> = v.into_pyarray(py);
            d.set_item(name, arr)?;
        }
        Ok(d)
    }

    /// The dataset trained on (shared, not copied).
    #[getter]
    fn dataset(&self) -> Dataset {
        Dataset::shared(Arc::clone(self.t().shared_dataset()))
    }

    fn __repr__(&self) -> String {
        let t = self.t();
        let c = t.config();
        format!(
            "Trainer(model={} x {} layers, hidden {}, epoch {}, {})",
            c.model.kind,
            c.model.layers,
            c.model.hidden,
            t.epoch(),
            t.device_note()
        )
    }
}

impl Trainer {
    /// The trainer, for a call that only reads it.
    fn t(&self) -> MutexGuard<'_, runtime::Trainer> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The trainer, for a call that changes it (no lock: `&mut self`).
    fn tm(&mut self) -> &mut runtime::Trainer {
        self.inner.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds the events since the last call to the trace and writes it whole.
    fn write_trace(&mut self) -> PyResult<()> {
        let Some(t) = &mut self.tracing else {
            return Ok(());
        };
        let new = t.tracer.collect();
        t.so_far.tracks = new.tracks;
        t.so_far.slices.extend(new.slices);
        t.so_far.flows.extend(new.flows);
        t.so_far.counters.extend(new.counters);
        t.so_far.instants.extend(new.instants);
        t.so_far.notes = new.notes;
        write_chrome_trace(&t.path, &t.so_far).py_err()
    }
}

impl Drop for Trainer {
    fn drop(&mut self) {
        if let Some(s) = self.tracing.as_mut().and_then(|t| t.sampler.take()) {
            s.stop();
        }
    }
}
