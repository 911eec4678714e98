//! [`TrainerBuilder`]: the library's way to a [`Trainer`], for programs that embed
//! training (a service, a notebook kernel, a test).
//!
//! 1. Start from a [`TrainConfig`] value, a TOML string or a TOML file (the
//!    builder reads no environment variables: `TANDEM_` overrides are the CLI's;
//!    apply [`crate::config::env_overrides`] yourself if you want them).
//! 2. Optionally pass an in-memory [`Dataset`] — by value, or as an
//!    `Arc<Dataset>` that several trainers share without copying (otherwise
//!    `[data]` says what to load or generate) —, callbacks, a cancel token,
//!    `verbose(true)` to get one line per epoch on stderr (nothing is printed
//!    otherwise), a progress sink for long setup phases
//!    ([`TrainerBuilder::progress`]) and a tracer that records setup too
//!    ([`TrainerBuilder::tracer`]).
//! 3. Optionally bound what the job takes from the machine: a core budget
//!    ([`TrainerBuilder::threads`]) or a rayon pool shared with other jobs
//!    ([`TrainerBuilder::thread_pool`]), and for a GPU job its device
//!    ([`TrainerBuilder::device_ordinal`]) and a device-memory budget
//!    ([`TrainerBuilder::device_memory_budget`]).
//! 4. [`TrainerBuilder::build`] validates the configuration, builds the compute
//!    pool (`[threads]`) unless one was passed, loads or generates the dataset on
//!    that pool, and builds the model and optimizer. Every failure is a typed
//!    [`crate::Error`].
//!
//! # Many jobs in one process
//! A service running several jobs at once gives each the same `Arc<Dataset>`
//! (one copy of the arrays, whatever the number of jobs: every trainer, executor
//! and host-backend engine shares them) and a share of the cores: either a
//! budget each (`threads(n)`: each trainer builds its own pool of `n` workers)
//! or one pool for all (`thread_pool(pool)`: the jobs' work interleaves on its
//! workers). Without either, each trainer builds a pool over all cores and
//! concurrent jobs oversubscribe the CPU. The layer-based pipeline
//! (`orchestration.policy = "layer"`) adds `orchestration.cpu_workers` threads
//! of its own to either. `examples/service_jobs.rs` runs four such jobs.
//!
//! ```
//! use runtime::config::TrainConfig;
//! use runtime::data::{generate_sbm, SbmOptions};
//! use runtime::TrainerBuilder;
//!
//! # fn main() -> runtime::Result<()> {
//! let mut cfg = TrainConfig::default();
//! cfg.train.epochs = 1;
//! cfg.model.hidden = 8;
//! cfg.threads.compute = 1;
//! // Train on an in-memory dataset instead of what `[data]` names.
//! let ds = generate_sbm(&SbmOptions {
//!     num_vertices: 400,
//!     num_edges: 2000,
//!     num_classes: 2,
//!     feature_dim: 4,
//!     ..SbmOptions::default()
//! })?;
//! let mut trainer = TrainerBuilder::new(cfg).dataset(ds).build()?;
//! assert_eq!(trainer.fit()?.len(), 1);
//! # Ok(())
//! # }
//! ```

use std::path::Path;
use std::sync::Arc;

use crate::config::TrainConfig;
use crate::data::dataset::Dataset;
use crate::dist::Communicator;
use crate::error::{Error, Result};
use rayon::ThreadPool;

use crate::config::PinPolicy;
use crate::pool::build_pool;
use crate::session::control::{Callback, CancelToken};
use crate::session::{load_dataset, Trainer};

/// Configures and builds a [`Trainer`] (see the module doc).
pub struct TrainerBuilder {
    cfg: TrainConfig,
    dataset: Option<Arc<Dataset>>,
    pool: Option<Arc<ThreadPool>>,
    callbacks: Vec<Box<dyn Callback>>,
    cancel: Option<CancelToken>,
    verbose: bool,
    checkpoint: Option<std::path::PathBuf>,
    communicator: Option<Arc<dyn Communicator>>,
    progress: Option<Arc<dyn crate::progress::Progress>>,
    tracer: Option<crate::trace::Tracer>,
}

impl TrainerBuilder {
    /// A builder for `cfg` (validated by [`TrainerBuilder::build`]).
    pub fn new(cfg: TrainConfig) -> Self {
        Self {
            cfg,
            dataset: None,
            pool: None,
            callbacks: Vec::new(),
            cancel: None,
            verbose: false,
            checkpoint: None,
            communicator: None,
            progress: None,
            tracer: None,
        }
    }

    /// A builder for a TOML configuration (missing keys take their defaults);
    /// errors name the key and call the source `<toml string>`.
    pub fn from_toml(text: &str) -> Result<Self> {
        Ok(Self::new(TrainConfig::from_toml(
            text,
            Path::new("<toml string>"),
        )?))
    }

    /// A builder for a TOML configuration file; errors name the file, and a
    /// relative `data.path` in it is taken from the file's folder
    /// ([`TrainConfig::load`]).
    pub fn from_file(path: &Path) -> Result<Self> {
        Ok(Self::new(TrainConfig::load(path, &[])?))
    }

    /// Trains on `ds` instead of what `[data]` names (checked with
    /// [`Dataset::validate`] and [`Dataset::check_features`] at build).
    ///
    /// `ds` is a [`Dataset`] (moved in) or an `Arc<Dataset>`: jobs given clones
    /// of one `Arc` share its arrays — the trainer, its executor and a host
    /// engine hold the `Arc` or cheap clones of its arrays
    /// ([`cpu_ops::HostArray`] clones share their elements), never a copy. A
    /// CUDA engine still uploads what it places on the GPU (topology, cached
    /// rows) and, for arrays not read from a memory-mapped store, a pinned host
    /// copy of the features.
    pub fn dataset(mut self, ds: impl Into<Arc<Dataset>>) -> Self {
        self.dataset = Some(ds.into());
        self
    }

    /// The job's core budget: its compute pool gets `threads` workers
    /// (`threads.compute`; 0: one per core). Concurrent jobs whose budgets add
    /// up to the machine's cores do not oversubscribe it.
    pub fn threads(mut self, threads: usize) -> Self {
        self.cfg.threads.compute = threads;
        self
    }

    /// Runs the job's compute (build, training, evaluation, inference) on
    /// `pool` instead of a pool of its own, e.g. one pool shared by every job
    /// of a service. The pool is used as it is: `threads.compute` must be 0 or
    /// its size, and `threads.pin` must be `"none"` (pin the pool's threads
    /// when you build it); otherwise [`TrainerBuilder::build`] refuses.
    pub fn thread_pool(mut self, pool: Arc<ThreadPool>) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Which GPU a GPU job uses (`device.ordinal`, CUDA's ordinal). Note that
    /// `device.kind` defaults to `"auto"`: set it to `"host"` to keep a job
    /// off the GPU on a machine that has one.
    pub fn device_ordinal(mut self, ordinal: u32) -> Self {
        self.cfg.device.ordinal = ordinal;
        self
    }

    /// The most device memory this job's engine may plan for
    /// (`device.memory_budget_bytes`; 0: whatever the device has free): its
    /// topology, model and batch working set must fit, and its feature cache
    /// gets at most what they leave. Jobs sharing a GPU whose budgets add up
    /// to its memory leave each other room.
    pub fn device_memory_budget(mut self, bytes: u64) -> Self {
        self.cfg.device.memory_budget_bytes = bytes;
        self
    }

    /// Adds one callback.
    pub fn callback(mut self, callback: impl Callback + 'static) -> Self {
        self.callbacks.push(Box::new(callback));
        self
    }

    /// Adds callbacks, in order.
    pub fn callbacks(mut self, callbacks: impl IntoIterator<Item = Box<dyn Callback>>) -> Self {
        self.callbacks.extend(callbacks);
        self
    }

    /// The token that cancels training (keep a clone to cancel from elsewhere);
    /// default: a fresh token nobody else holds.
    pub fn cancel_token(mut self, token: CancelToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// Whether to print the dataset and model at build and one line per epoch, on
    /// stderr (default: silent).
    pub fn verbose(mut self, verbose: bool) -> Self {
        self.verbose = verbose;
        self
    }

    /// Where [`Trainer::fit`] writes checkpoints: every `train.checkpoint_every`
    /// epochs, on a cancel and at the end (default: nowhere).
    pub fn checkpoint_to(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.checkpoint = Some(path.into());
        self
    }

    /// Trains as one rank of a data-parallel job ([`crate::dist`],
    /// [`Trainer::set_communicator`]); default: alone. Building is then
    /// collective: every rank builds at the same time. On a GPU, the ranks of
    /// one machine use GPUs `device.ordinal`, `device.ordinal + 1`, … (by
    /// [`Communicator::local_rank`]): launch at most as many ranks per machine
    /// as it has GPUs.
    pub fn communicator(mut self, comm: Arc<dyn Communicator>) -> Self {
        self.communicator = Some(comm);
        self
    }

    /// Where [`TrainerBuilder::build`] reports the progress of its long
    /// phases (default: nowhere): the layer path's hot-set pre-sampling pass
    /// (`orchestration.hotness = "presample"` or `"pcie"`, phase
    /// `"presample"`, in batches), which takes seconds on a large graph. The
    /// protocol is [`crate::progress`]'s, as for the importers.
    pub fn progress(mut self, sink: impl crate::progress::Progress + 'static) -> Self {
        self.progress = Some(Arc::new(sink));
        self
    }

    /// Records into `tracer` from the start, setup included (its `hotness
    /// scores` slice), as [`Trainer::set_tracer`] does from when it is called.
    pub fn tracer(mut self, tracer: crate::trace::Tracer) -> Self {
        self.tracer = Some(tracer);
        self
    }

    /// The configuration the trainer will use.
    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// Validates and builds (see the module doc).
    pub fn build(self) -> Result<Trainer> {
        let Self {
            cfg,
            dataset,
            pool,
            callbacks,
            cancel,
            verbose,
            checkpoint,
            communicator,
            progress,
            tracer,
        } = self;
        cfg.validate()?;
        let pool = match pool {
            Some(pool) => {
                check_given_pool(&cfg, &pool)?;
                pool
            }
            None => Arc::new(build_pool(
                cfg.compute_threads(),
                cfg.threads.pin == PinPolicy::Cores,
            )?),
        };
        let ds = match dataset {
            Some(ds) => {
                ds.validate()?;
                ds.check_features()?;
                ds
            }
            None => Arc::new(pool.install(|| load_dataset(&cfg))?),
        };
        if verbose {
            eprintln!("{}", ds.summary());
        }
        // Ranks on one machine take one GPU each, from `device.ordinal` on.
        let gpu_offset = communicator
            .as_ref()
            .filter(|c| c.size() > 1)
            .map_or(0, |c| c.local_rank());
        let mut sinks = crate::placement::SetupSinks::default();
        if let Some(p) = progress {
            sinks.progress = p;
        }
        if let Some(t) = &tracer {
            sinks.tracer = t.clone();
        }
        let mut trainer = Trainer::with_pool(ds, cfg, pool, gpu_offset, sinks)?;
        if let Some(t) = tracer {
            trainer.set_tracer(t);
        }
        if let Some(comm) = communicator {
            trainer.set_communicator(comm)?;
        }
        for cb in callbacks {
            trainer.add_callback(cb);
        }
        if let Some(token) = cancel {
            trainer.set_cancel_token(token);
        }
        trainer.set_verbose(verbose);
        trainer.set_checkpoint_path(checkpoint);
        if verbose {
            let c = trainer.config();
            eprintln!(
                "model: {} × {}, hidden {}, {} parameters; {}",
                c.model.kind,
                crate::trace::fmt_count(c.model.layers, "layer"),
                c.model.hidden,
                trainer.num_params(),
                crate::trace::fmt_count(trainer.threads(), "thread")
            );
        }
        Ok(trainer)
    }
}

/// A pool passed with [`TrainerBuilder::thread_pool`] is used as it is: the
/// `[threads]` keys that would shape a pool of the trainer's own must not ask
/// for something else.
fn check_given_pool(cfg: &TrainConfig, pool: &ThreadPool) -> Result<()> {
    let size = pool.current_num_threads();
    let compute = cfg.compute_threads();
    if compute != 0 && compute != size {
        return Err(Error::invalid_argument(
            "threads.compute",
            format!(
                "{compute}, but the pool passed with TrainerBuilder::thread_pool has {size} \
                 threads; leave threads.compute at 0 or make the two agree"
            ),
        ));
    }
    if cfg.threads.pin != PinPolicy::None {
        return Err(Error::invalid_argument(
            "threads.pin",
            "the pool passed with TrainerBuilder::thread_pool is used as it is; pin its \
             threads when building it, or set threads.pin = \"none\"",
        ));
    }
    Ok(())
}
