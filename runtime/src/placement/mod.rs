//! Placement: `[orchestration]` and `[device]` resolved into the executor that
//! trains, in one place (entered once, by the session's constructor).
//!
//! 1. **Backend.** `device.kind` opens a GPU or the host backend
//!    ([`open_backend`]; `"auto"` falls back to the host and says why).
//! 2. **Memory, then the engine.** The device's memory is divided before
//!    anything is loaded ([`budget::decide`]: `"auto"` topology and cache, the
//!    budget, the layer path's hot rows; an error naming the keys that shrink
//!    the run when it cannot fit), then the dataset and the model go onto it
//!    with those decisions (`engine::DeviceEngine`).
//! 3. **Strategy.** `orchestration.policy` picks the executor
//!    (`crate::executor`):
//!    - a step-based policy → a `StepExecutor` with that placement
//!      (`scheduler::Orchestration::step_based`, the one mapping);
//!    - `"layer"` with `hot_ratio > 0` → a `LayerExecutor` (hot set scored and
//!      relabeled here; with `hot_ratio = 0` nothing is reused and it is the
//!      all-accelerator step placement);
//!    - `"auto"` → an `AutoExecutor` ([`auto`]): it measures the candidates in
//!      the first batches and keeps the fastest. On the host backend there is
//!      nothing to place (sampling, gathering and training share the CPU and
//!      its memory; no bus to save), so `"auto"` is `gpu-sample-gpu-gather`
//!      there, the fastest host placement, and the run stays reproducible.
//!
//! What a key does where it does not apply is said in the note (one line the
//! session prints and `Trainer::device_note` returns), never silently.

pub(crate) mod auto;
pub(crate) mod budget;
pub(crate) mod calibrator;
pub(crate) mod drift;
#[cfg(test)]
mod memory_tests;
pub(crate) mod task;

use std::sync::Arc;

use cpu_ops::{derive_seed, ModelConfig};
use gpu_ops::Backend;
use scheduler::{Device, Orchestration, StepBased};

use crate::clock::SharedClock;
use crate::config::{PinPolicy, SparseFeatures, TrainConfig};
use crate::data::dataset::Dataset;
use crate::engine::{density, DeviceEngine, EngineOptions, ModelState};
use crate::error::{Error, Result};
use crate::executor::layer::{LayerExecutor, LayerOptions, LayerSetup, Orchestrator};
use crate::executor::step::StepExecutor;
use crate::executor::Executor;
use budget::{LayerReserve, MemoryDecision, MemoryRequest};

pub use auto::AUTO_HOT_RATIO;

/// Where a policy samples and gathers (`scheduler::Orchestration::step_based`,
/// the one mapping); `"layer"` samples and gathers on the accelerator (its CPU
/// work is the hot-vertex compute).
pub(crate) fn step_placement(o: Orchestration) -> StepBased {
    o.step_based()
        .unwrap_or(StepBased::new(Device::Accelerator, Device::Accelerator))
}

/// The layer pipeline's options from `[orchestration]`; `hotness = "pcie"`
/// ranks with the CPU row cost of `model`'s layer 0 over rows of `dtype`
/// ([`scheduler::RowCost::for_layer`]).
fn layer_options(
    o: &crate::config::OrchestrationSection,
    model: &cpu_ops::ModelConfig,
    dtype: gpu_ops::FeatureDtype,
    task: crate::config::TaskKind,
) -> Result<LayerOptions> {
    let row_cost = scheduler::RowCost::for_layer(model.in_dim, model.hidden, dtype.value_bytes());
    Ok(LayerOptions {
        hotness: scheduler::HotnessPolicy::new(o.hotness, o.presample_epochs)
            .map_err(|source| Error::scheduler("orchestration.hotness", source))?
            .with_row_cost(row_cost),
        hot_ratio: o.hot_ratio,
        super_batch: o.super_batch,
        staleness_bound: o.staleness_bound,
        on_late: o.on_late,
        hot_grad: o.hot_backward.for_task(task),
        monitor: o.monitor,
        monitor_control: o.monitor_control,
        cpu_workers: o.cpu_workers,
        reuse: o.reuse_across_superbatches,
    })
}

/// The layer path's hot rows the engine makes room for (`engine/memory.rs`
/// step 8): a fixed layer policy's whole hot set (`hot_ratio` of the `n`,
/// rounded up: at least the relabeled hot ids), which must fit; `"auto"`'s
/// layer candidate (its `hot_ratio`, [`AUTO_HOT_RATIO`] when 0; only with two
/// layers or more), which shrinks to fit; else none.
fn layer_reserve(o: &crate::config::OrchestrationSection, n: usize, layers: usize) -> LayerReserve {
    let ratio = if o.reuses_embeddings() {
        o.hot_ratio
    } else if o.is_auto() && layers >= 2 {
        if o.hot_ratio > 0.0 {
            o.hot_ratio
        } else {
            AUTO_HOT_RATIO
        }
    } else {
        return LayerReserve::default();
    };
    LayerReserve {
        hot_rows: (ratio * n as f64).ceil().min(n as f64) as u64,
        super_batch: o.super_batch,
        store: o.reuse_across_superbatches,
        fixed: !o.is_auto(),
    }
}

/// Where setup reports besides its result: the progress of long phases (the
/// hot set's pre-sampling pass, phase `"presample"`) and the tracer its
/// slices go into (`hotness scores`). Default: nowhere.
#[derive(Clone)]
pub(crate) struct SetupSinks {
    /// Progress reports (`crate::progress`).
    pub progress: Arc<dyn crate::progress::Progress>,
    /// The tracer.
    pub tracer: crate::trace::Tracer,
}

impl Default for SetupSinks {
    fn default() -> Self {
        Self {
            progress: Arc::new(crate::progress::NoProgress),
            tracer: crate::trace::Tracer::disabled(),
        }
    }
}

/// What the session needs to build its executor.
pub(crate) struct PlacementInput<'a> {
    /// The validated configuration.
    pub cfg: &'a TrainConfig,
    /// The dataset.
    pub ds: &'a Arc<Dataset>,
    /// The model's configuration (its weights are initialized on the device
    /// from `train.seed`).
    pub model: &'a ModelConfig,
    /// The training vertices.
    pub train_ids: &'a [u32],
    /// Added to `device.ordinal` (a rank's local rank).
    pub gpu_offset: usize,
    /// Threads of the session's compute pool (hot workers are pinned after
    /// them with `threads.pin = "cores"`).
    pub pool_threads: usize,
    /// The clock every measurement reads (the session's).
    pub clock: SharedClock,
    /// `"auto"` measures on the host backend too (tests of its mechanics, on
    /// a scripted clock or the wall's); else only on a GPU.
    pub measure_on_host: bool,
    /// Where setup reports.
    pub sinks: &'a SetupSinks,
}

/// The executor and the note saying what was chosen and why.
pub(crate) struct Placed {
    /// The executor.
    pub exec: Box<dyn Executor>,
    /// One line: the device, why it was chosen, what applies where.
    pub note: String,
}

/// Resolves `[device]` and `[orchestration]` into an executor (module doc).
pub(crate) fn place(input: &PlacementInput<'_>) -> Result<Placed> {
    let cfg = input.cfg;
    let ordinal = u32::try_from(cfg.device.ordinal as usize + input.gpu_offset)
        .map_err(|_| Error::invalid_argument("device.ordinal", "too large"))?;
    let (exec, note) = match open_backend(&cfg.device, ordinal)? {
        Opened::Cuda(dev) => {
            let (e, memory, sparse) = engine(*dev, input)?;
            let note = format!("device: {}{sparse}", e.describe());
            (strategy(e, memory.layer_rows, input)?, note)
        }
        Opened::Host(dev, why) => {
            let (e, memory, sparse) = engine(dev, input)?;
            let mut note = format!("device: {} ({why}){sparse}", e.describe());
            if cfg.orchestration.is_auto() && !input.measure_on_host {
                note.push_str(
                    "; orchestration.policy = \"auto\" on the host backend: sampling, \
                     gathering and training all on the CPU (one device: nothing to place)",
                );
                let p = step_placement(Orchestration::GpuSampleGpuGather);
                let exec = StepExecutor::new(e, p, cfg.device.sample_ahead);
                return Ok(Placed {
                    exec: Box::new(exec),
                    note,
                });
            }
            (strategy(e, memory.layer_rows, input)?, note)
        }
    };
    // (`device.sample_ahead`, on by default, does not apply to the layer-based
    // pipeline, which samples each super-batch's top layers ahead itself.)
    Ok(Placed { exec, note })
}

/// Step 2: the memory decided for `dev`, the engine built with it, and what
/// the note says of the input rows (`train.sparse_features`: sparse rows
/// where the backend has the ops) and of the memory's `"auto"` choices.
fn engine<B: Backend>(
    dev: B,
    input: &PlacementInput<'_>,
) -> Result<(DeviceEngine<B>, MemoryDecision, String)> {
    let cfg = input.cfg;
    let t = &cfg.train;
    let wanted = match t.sparse_features {
        SparseFeatures::On => true,
        SparseFeatures::Off => false,
        SparseFeatures::Auto => density(&input.ds.features) <= t.sparse_threshold,
    };
    let sparse = wanted && dev.supports_sparse();
    let mut note = match (wanted, sparse) {
        (true, false) => format!(
            "; train.sparse_features: the {} backend has no sparse ops, input rows are dense",
            dev.kind()
        ),
        (true, true) => "; sparse input rows".to_string(),
        _ => String::new(),
    };
    let on_cuda = dev.kind() == gpu_ops::DeviceKind::Cuda;
    let fanouts = cfg.train_fanouts()?;
    let eval_fanouts = cfg.eval_fanouts()?;
    let request = MemoryRequest {
        // On the host there is no device memory to divide
        // (`placement/budget.rs`): `"auto"` is the device topology (ignored
        // there) and every row cached (nothing is copied).
        auto: budget::Auto {
            topology: on_cuda && cfg.device.topology.fixed().is_none(),
            cache: on_cuda && cfg.device.cache_bytes == crate::config::CACHE_BYTES_AUTO,
        },
        topology: cfg
            .device
            .topology
            .fixed()
            .unwrap_or(gpu_ops::TopologyPlacement::Device),
        cache_bytes: cfg.device.cache_bytes,
        budget: cfg.device.memory_budget_bytes,
        batch_size: t.batch_size,
        fanouts: fanouts.clone(),
        eval_batch_size: t.eval_batch_size,
        eval_fanouts: eval_fanouts.clone(),
        feature_dtype: cfg.device.feature_dtype,
        // (`"auto"` on the host backend measures nothing unless a test asks
        // it to: no layer candidate to make room for.)
        layer: if cfg.orchestration.is_auto() && !on_cuda && !input.measure_on_host {
            LayerReserve::default()
        } else {
            layer_reserve(&cfg.orchestration, input.ds.num_vertices(), fanouts.len())
        },
    };
    let free = dev
        .memory_info()
        .map_err(|source| Error::device("device memory", source))?
        .free as u64;
    let memory = budget::decide(&request, input.ds, input.model, free, &dev.describe())?;
    let engine = DeviceEngine::new(
        dev,
        input.ds,
        input.model,
        EngineOptions {
            fanouts,
            eval_fanouts,
            cache_bytes: usize::try_from(memory.cache_bytes).unwrap_or(usize::MAX),
            topology: memory.topology,
            adam: cpu_ops::AdamConfig {
                lr: t.lr,
                weight_decay: t.weight_decay,
                decay: cpu_ops::WeightDecay::L2,
                ..cpu_ops::AdamConfig::default()
            },
            init_seed: derive_seed(t.seed, 1),
            precision: cfg.model.precision.resolve(on_cuda, cfg.model.kind),
            // A rank with partitioned features gets its rows from the exchange
            // (`executor/step/data_parallel/`): the device never holds them all.
            defer_features: cfg.dist.features == crate::config::DistFeatures::Partitioned,
            feature_dtype: cfg.device.feature_dtype,
            sparse,
            sample_ahead: cfg.device.sample_ahead,
            loss_lag: loss_lag(cfg, on_cuda),
            head: cfg.head(),
        },
    )?;
    if let Some(n) = &memory.note {
        note.push_str(n);
    }
    Ok((engine, memory, note))
}

/// `device.loss_lag` resolved: `0` is 8 on CUDA and 1 on the host backend
/// (where a read costs nothing); `train.on_nonfinite = "skip-batch"` reads
/// every loss at once (a skipped batch must not skip the ones queued after it).
fn loss_lag(cfg: &TrainConfig, on_cuda: bool) -> usize {
    if cfg.train.on_nonfinite == crate::config::OnNonFiniteKind::SkipBatch {
        return 1;
    }
    match cfg.device.loss_lag {
        0 if on_cuda => 8,
        0 => 1,
        n => n as usize,
    }
}

/// Step 3: the executor of `orchestration.policy` over `engine`; `layer_rows`
/// is the most hot rows step 2 found room for.
fn strategy<B: Backend>(
    engine: DeviceEngine<B>,
    layer_rows: u64,
    input: &PlacementInput<'_>,
) -> Result<Box<dyn Executor>> {
    let cfg = input.cfg;
    let o = &cfg.orchestration;
    let pin_from = (cfg.threads.pin == PinPolicy::Cores).then_some(input.pool_threads);
    let ahead = cfg.device.sample_ahead;
    Ok(match o.policy.fixed() {
        None => {
            let mut layer =
                layer_options(o, input.model, cfg.device.feature_dtype, cfg.model.task)?;
            if layer.hot_ratio <= 0.0 {
                layer.hot_ratio = AUTO_HOT_RATIO;
            }
            let plan = auto::LayerPlan {
                opts: layer,
                ds: Arc::clone(input.ds),
                model: input.model.clone(),
                fanouts: cfg.train_fanouts()?,
                train_ids: input.train_ids.to_vec(),
                batch_size: cfg.train.batch_size,
                seed: cfg.train.seed,
                pin_from,
                progress: Arc::clone(&input.sinks.progress),
            };
            let clock = Arc::clone(&input.clock);
            Box::new(auto::AutoExecutor::new(
                engine, layer_rows, plan, ahead, clock,
            ))
        }
        Some(_) if o.reuses_embeddings() => {
            let mut orch = Orchestrator::new(&LayerSetup {
                opts: &layer_options(o, input.model, cfg.device.feature_dtype, cfg.model.task)?,
                ds: input.ds,
                model: input.model,
                fanouts: &cfg.train_fanouts()?,
                train_ids: input.train_ids,
                batch_size: cfg.train.batch_size,
                seed: cfg.train.seed,
                progress: &*input.sinks.progress,
                tracer: &input.sinks.tracer,
            })?;
            orch.pin_workers_from(pin_from);
            orch.set_clock(Arc::clone(&input.clock));
            Box::new(LayerExecutor::new(engine, orch))
        }
        Some(policy) => Box::new(StepExecutor::new(engine, step_placement(policy), ahead)),
    })
}

/// The backend a `[device]` section asks for: a GPU, or the host backend with
/// the reason the host was taken.
enum Opened {
    /// A CUDA device (never built without the `cuda` feature: the stand-in
    /// backend has no values).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Cuda(Box<gpu_ops::CudaBackend>),
    /// The host backend, and why.
    Host(gpu_ops::HostBackend, String),
}

/// Opens the backend `device` asks for: `kind = "cuda"` a GPU or an error naming
/// what is missing ([`Error::CudaNotCompiled`] in a build without the `cuda`
/// feature); `"auto"` a GPU when one is usable, else the host backend (the reason
/// says why; always the host without the feature); `"host"` the host backend.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn open_backend(device: &crate::config::DeviceSection, ordinal: u32) -> Result<Opened> {
    use crate::config::DeviceKind;
    let host = |why: String| Ok(Opened::Host(gpu_ops::HostBackend::new(), why));
    match device.kind {
        DeviceKind::Host => host("device.kind = \"host\"".into()),
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Auto => host("device.kind = \"auto\": built without the `cuda` feature".into()),
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => Err(Error::CudaNotCompiled {
            context: "device.kind = \"cuda\"".into(),
        }),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda | DeviceKind::Auto => match gpu_ops::CudaBackend::new(ordinal as usize) {
            Ok(dev) => Ok(Opened::Cuda(Box::new(dev))),
            Err(e) if device.kind == DeviceKind::Auto => {
                host(format!("device.kind = \"auto\": no usable GPU — {e}"))
            }
            Err(source) => Err(Error::device("device.kind = \"cuda\"", source)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DeviceKind, DeviceSection};

    fn open(kind: DeviceKind) -> Result<Opened> {
        let device = DeviceSection {
            kind,
            ..DeviceSection::default()
        };
        open_backend(&device, 0)
    }

    /// The layer path's rows are counted for a fixed layer policy (which must
    /// fit) and `"auto"`'s layer candidate (which shrinks), with the store only
    /// when rows are kept across super-batches; for nothing else.
    #[test]
    fn the_layer_reserve_follows_the_policy() {
        let o = |sets: &[&str]| {
            let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
            TrainConfig::from_toml_with_overrides("", std::path::Path::new("t"), &sets)
                .expect("config")
                .orchestration
        };
        let layer = [
            "orchestration.policy=\"layer\"",
            "orchestration.hot_ratio=0.2",
        ];
        let r = layer_reserve(&o(&layer), 1001, 2);
        assert_eq!((r.hot_rows, r.store, r.fixed), (201, true, true));
        assert_eq!(r.super_batch, o(&layer).super_batch);
        let mut off = layer.to_vec();
        off.push("orchestration.reuse_across_superbatches=false");
        let r = layer_reserve(&o(&off), 1001, 2);
        assert_eq!((r.hot_rows, r.store), (201, false));
        let none = [
            "orchestration.policy=\"layer\"",
            "orchestration.hot_ratio=0",
        ];
        assert_eq!(layer_reserve(&o(&none), 1001, 2), LayerReserve::default());
        let step = ["orchestration.policy=\"gpu-sample-gpu-gather\""];
        assert_eq!(layer_reserve(&o(&step), 1001, 2), LayerReserve::default());
        let auto = ["orchestration.policy=\"auto\"", "orchestration.hot_ratio=0"];
        let r = layer_reserve(&o(&auto), 1000, 3);
        assert_eq!((r.hot_rows, r.fixed), (200, false));
        assert_eq!(layer_reserve(&o(&auto), 1000, 1), LayerReserve::default());
    }

    /// `hot_backward = "auto"` (the default) is `"aggregate"` for link
    /// prediction and `"constant"` for node classification; a set value is
    /// kept for either task.
    #[test]
    fn hot_backward_auto_follows_the_task() {
        let grad = |sets: &[&str]| {
            let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
            let cfg = TrainConfig::from_toml_with_overrides("", std::path::Path::new("t"), &sets)
                .expect("config");
            let model = cfg.model_config(100, 7).expect("model");
            layer_options(
                &cfg.orchestration,
                &model,
                gpu_ops::FeatureDtype::F32,
                cfg.model.task,
            )
            .expect("options")
            .hot_grad
        };
        let link = "model.task=\"link\"";
        assert_eq!(grad(&[]), gpu_ops::HotGrad::Constant);
        assert_eq!(grad(&[link]), gpu_ops::HotGrad::Aggregate);
        for (set, want) in [
            (
                "orchestration.hot_backward=\"constant\"",
                gpu_ops::HotGrad::Constant,
            ),
            (
                "orchestration.hot_backward=\"aggregate\"",
                gpu_ops::HotGrad::Aggregate,
            ),
        ] {
            assert_eq!(grad(&[set]), want);
            assert_eq!(grad(&[set, link]), want);
        }
    }

    /// `hotness = "pcie"` ranks with the row cost of the trained model's layer
    /// 0 over rows of the configured dtype; other policies carry no cost.
    #[test]
    fn pcie_hotness_ranks_with_the_models_layer0_cost() {
        let sets: Vec<String> = vec!["orchestration.hotness=\"pcie\"".into()];
        let cfg = TrainConfig::from_toml_with_overrides("", std::path::Path::new("t"), &sets)
            .expect("config");
        let model = cfg.model_config(100, 7).expect("model");
        for dtype in [gpu_ops::FeatureDtype::F32, gpu_ops::FeatureDtype::Bf16] {
            let opts =
                layer_options(&cfg.orchestration, &model, dtype, cfg.model.task).expect("options");
            assert_eq!(
                opts.hotness,
                scheduler::HotnessPolicy::PcieValue {
                    epochs: cfg.orchestration.presample_epochs,
                    cost: scheduler::RowCost::for_layer(100, model.hidden, dtype.value_bytes()),
                }
            );
        }
        let presample = TrainConfig::default();
        let opts = layer_options(
            &presample.orchestration,
            &model,
            gpu_ops::FeatureDtype::Bf16,
            presample.model.task,
        )
        .expect("options");
        assert!(!opts.hotness.zero_is_cold());
    }

    /// `"host"` is the host backend in every build.
    #[test]
    fn host_opens_the_host_backend() {
        assert!(matches!(open(DeviceKind::Host), Ok(Opened::Host(..))));
    }

    /// Without the `cuda` feature, `"cuda"` is [`Error::CudaNotCompiled`] (not a
    /// device error from the stand-in backend) and `"auto"` takes the host,
    /// saying why.
    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_the_cuda_feature_cuda_is_refused_and_auto_is_the_host() {
        let e = open(DeviceKind::Cuda).err().expect("refused");
        assert!(
            matches!(&e, Error::CudaNotCompiled { context } if context.contains("device.kind")),
            "{e:?}"
        );
        assert!(!e.to_string().contains('\n'), "{e}");
        match open(DeviceKind::Auto) {
            Ok(Opened::Host(_, why)) => {
                assert!(why.contains("without the `cuda` feature"), "{why}")
            }
            Ok(Opened::Cuda(_)) => panic!("a GPU in a build without CUDA"),
            Err(e) => panic!("auto failed: {e}"),
        }
    }

    /// With the feature, a machine without a usable GPU gives a device error for
    /// `"cuda"` (its source boxed, not a `gpu_ops` type in the API) and the host
    /// for `"auto"`.
    #[cfg(feature = "cuda")]
    #[test]
    fn with_the_cuda_feature_and_no_gpu_cuda_is_a_device_error() {
        if gpu_ops::CudaBackend::new(0).is_ok() {
            eprintln!("skipped: a GPU is usable here");
            return;
        }
        let e = open(DeviceKind::Cuda).err().expect("refused");
        assert!(matches!(&e, Error::Device { .. }), "{e:?}");
        assert!(std::error::Error::source(&e).is_some());
        assert!(matches!(open(DeviceKind::Auto), Ok(Opened::Host(..))));
    }
}
