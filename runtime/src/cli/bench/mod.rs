//! `tandem bench sample | gather | aggregate | gemm | backend | hot | trace |
//! orchestration | dist | scale | eval`: throughput against a reference measured in
//! the same run. Numbers and their interpretation live in `docs/performance.md`.
//!
//! The benchmarks live here, compiled only with the `cli` feature, rather than in a
//! crate of their own: they reach crate-internal helpers (atomic writes, NVML, peak
//! memory, the trainer's placement note) and ship with the binary that runs them.
//!
//! - [`sample::bench_sample`]: layered neighbor sampling, in sampled edges per second;
//! - [`gather::bench_gather`]: feature-row gather, in GB/s next to the machine's limits
//!   measured in the same run (a plain parallel row copy and a streaming memcpy);
//! - [`aggregate::bench_aggregate`] and [`gemm::bench_gemm`]: block aggregation and
//!   dense matrix products at the layer shapes, against a streaming copy and the FMA
//!   peak;
//! - [`backend::bench_backend`]: sampling, cached/uncached gather and GEMM on an
//!   accelerator backend, next to a device-to-device copy;
//! - [`loader::bench_loader`]: the device loader's batches per second against
//!   the host loader's (`tandem.NeighborLoader`'s) on the same seeds;
//! - [`hot::bench_hot`]: hot vertices' layer-0 rows, the generic sample + gather +
//!   layer path against the fused [`cpu_ops::SageHotKernel`], per worker;
//! - [`trace::bench_trace`]: what recording a trace slice costs, tracer off and on;
//! - [`orchestration::bench_orchestration`]: one training config under the five
//!   placements (epoch time, busy fractions, host → device bytes, accuracy);
//! - [`regimes::bench_regimes`]: the placements across device-cache sizes and
//!   feature widths on generated R-MAT graphs, with layer-based's speed-up over
//!   the best step-based placement per regime;
//! - [`scale::bench_scale`]: one large generated graph end to end (generation,
//!   store, training, evaluation) with the time and peak memory of each phase;
//! - [`dist`]: data-parallel training on 1, 2, 4 ranks under `mpirun`.
//!
//! Each times real work on the caller's data, on rayon's current pool, and returns a
//! report whose `Display` is a short table; nothing is printed while it runs.

mod aggregate;
mod backend;
mod dist;
mod gather;
mod gemm;
mod hot;
mod loader;
mod orchestration;
mod regimes;
mod sample;
mod scale;
mod trace;

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, Subcommand};
use cpu_ops::{CsrGraph, FeatureMatrix};
use rayon::prelude::*;

use super::{parse_fanouts, Fanouts};
use crate::config::{env_overrides, Override, TrainConfig};
use crate::data::dataset::{open_dataset, SplitSpec, Verify};
use crate::data::generate::{generate_rmat, RmatOptions};
use crate::error::{Error, Result};
use aggregate::bench_aggregate;
use backend::{bench_backend, BackendBenchOptions};
use gather::bench_gather;
use gemm::{bench_gemm, GemmShape, LAYER_SHAPES};
use hot::{bench_hot, HotBenchOptions};
use orchestration::bench_orchestration;
use regimes::{bench_regimes, fmt_percent, parse_row_dtype, row_dtype_names, RegimeOptions};
use sample::bench_sample;
use scale::{bench_scale, ScaleOptions};

/// The median of `times` (the upper one for an even count); zero when empty.
fn median(times: &[std::time::Duration]) -> std::time::Duration {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

/// `amount / time`, or 0 for a zero time.
fn per_second(amount: f64, time: std::time::Duration) -> f64 {
    let secs = time.as_secs_f64();
    if secs > 0.0 {
        amount / secs
    } else {
        0.0
    }
}

#[derive(Debug, Subcommand)]
pub(super) enum BenchCmd {
    /// Layered neighbor sampling: sampled edges per second.
    Sample(SampleArgs),
    /// Feature-row gather: GB/s next to a plain memcpy row gather.
    Gather(GatherArgs),
    /// Block aggregation (mean, f32) forward/backward: GB/s next to a streaming copy.
    Aggregate(AggregateArgs),
    /// Dense matrix multiply at the GNN layer shapes: GFLOP/s next to the FMA peak.
    Gemm(GemmArgs),
    /// The accelerator backend (`--device host | cuda`): sampling edges/s, gather
    /// GB/s (device cache hits and host reads) next to a device-to-device copy,
    /// GEMM GFLOP/s.
    Backend(BackendArgs),
    /// The mini-batch loader for a model of the user's own (`--device host |
    /// cuda`): the device loader's batches per second (sample + gather on the
    /// backend) against the host loader's on the same seeds, and the ratio.
    Loader(LoaderArgs),
    /// Hot vertices' SAGE layer-0 rows on the CPU: the generic sample + gather +
    /// layer path against the fused kernel (µs/row, GB/s, GFLOP/s, speed-up).
    Hot(HotArgs),
    /// What recording one trace slice costs, tracer disabled and enabled (ns).
    Trace(TraceArgs),
    /// One training config under the five placements (`orchestration.policy`):
    /// epoch time, accelerator and CPU busy fractions, host→device bytes per
    /// epoch, test accuracy at the best validation epoch. With `--regimes`: the
    /// same across feature widths × device-cache fractions × feature row dtypes
    /// on generated R-MAT graphs, with layer-based's speed-up over the best
    /// step-based placement.
    Orchestration(OrchestrationArgs),
    /// Data-parallel training on 1, 2, 4 ranks of this machine (`mpirun`; a
    /// build with the `mpi` feature): epoch time and speed-up over one rank,
    /// all-reduce time and bytes, exchanged feature bytes and the remote-row
    /// cache's hit rate, replicated and partitioned features.
    Dist(dist::DistArgs),
    /// One large generated R-MAT graph end to end (papers100M-sized by default:
    /// 111M vertices, 1.6B edges, 128 columns, 172 classes, 1.2M training
    /// vertices): generation time and peak host memory, training epochs of SAGE
    /// 3×256 [15,10,5] batch 1024, accuracy, peak host and device memory; a table
    /// and one JSON line.
    Scale(ScaleArgs),
    /// Validation and test accuracy of a checkpoint's weights under one
    /// evaluation setting (`--set train.eval_fanouts=[…]`, `train.eval_mode`,
    /// `train.eval_batch_size`): accuracy, evaluation time, resident memory
    /// before and peak during the evaluation (run once per setting, each in its
    /// own process, to compare settings on the same weights).
    Eval(EvalArgs),
}

#[derive(Debug, Args)]
pub(super) struct EvalArgs {
    /// The checkpoint (`checkpoint.tck` of `tandem train --out`); its
    /// configuration is the base.
    #[arg(long)]
    checkpoint: PathBuf,
    /// Override a configuration key (repeatable), e.g.
    /// `--set 'train.eval_fanouts=[25,25]'`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
}

/// ogbn-papers100M's size: vertices, undirected edges, classes, and its split
/// (1,207,179 / 125,265 / 214,338 of the vertices).
const PAPERS_VERTICES: usize = 111_059_956;
const PAPERS_EDGES: usize = 1_615_685_872;
const PAPERS_CLASSES: u32 = 172;
const PAPERS_SPLIT: &str = "0.010870,0.001128,0.001930";

/// The training `tandem bench scale` runs unless `--set` says otherwise (the
/// published papers100M comparisons: SALIENT, DGL).
const SCALE_TRAINING: &[&str] = &[
    "model.kind=\"sage\"",
    "model.layers=3",
    "model.hidden=256",
    "train.fanouts=[15,10,5]",
    "train.batch_size=1024",
    "train.lr=0.003",
    "train.eval_every=0",
];

#[derive(Debug, Args)]
pub(super) struct ScaleArgs {
    /// Vertices of the generated graph (default: ogbn-papers100M's).
    #[arg(long, default_value_t = PAPERS_VERTICES)]
    vertices: usize,
    /// Undirected edges drawn (stored twice, repeats dropped; default: papers100M's).
    #[arg(long, default_value_t = PAPERS_EDGES)]
    edges: usize,
    /// Halve the vertices and edges (the half-size run).
    #[arg(long)]
    half: bool,
    /// Feature columns.
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// Classes.
    #[arg(long, default_value_t = PAPERS_CLASSES)]
    classes: u32,
    /// Strength of the class signal in the features (as `tandem generate`).
    #[arg(long, default_value_t = 0.5)]
    signal: f32,
    /// Split as TRAIN,VAL,TEST; each `N/class`, a fraction, or `rest`
    /// (default: papers100M's fractions).
    #[arg(long, default_value = PAPERS_SPLIT)]
    split: SplitSpec,
    /// Seed of the graph.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the store here and train from the file (memory-mapped); without it
    /// the graph is trained from memory.
    #[arg(long)]
    store: Option<PathBuf>,
    /// Keep the `--store` file afterwards.
    #[arg(long, requires = "store")]
    keep_store: bool,
    /// On a GPU: set `device.topology` and `device.cache_bytes` to `"auto"`
    /// (topology first when it fits, the cache takes what the free memory leaves
    /// after the estimated working set; printed). Ignored on the host backend.
    #[arg(long)]
    fit_device: bool,
    /// Epochs (`train.epochs`).
    #[arg(long, default_value_t = 2)]
    epochs: usize,
    /// TOML configuration file on top of the benchmark's training defaults (its
    /// `[data]` is not used).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override a configuration key (repeatable), e.g. `--set device.cache_bytes=0`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Also write the JSON line here (atomically).
    #[arg(long)]
    json: Option<PathBuf>,
}

fn run_scale(a: &ScaleArgs) -> Result<()> {
    if a.epochs == 0 {
        return Err(Error::invalid_argument(
            "--epochs",
            "expected at least 1, found 0",
        ));
    }
    let (vertices, edges) = if a.half {
        (a.vertices / 2, a.edges / 2)
    } else {
        (a.vertices, a.edges)
    };
    let mut layers: Vec<Override> = SCALE_TRAINING
        .iter()
        .map(|s| Override::from_set(s))
        .collect::<Result<_>>()?;
    layers.push(Override::from_set(&format!("train.epochs={}", a.epochs))?);
    layers.extend(env_overrides(std::env::vars_os())?);
    for o in &a.overrides {
        layers.push(Override::from_set(o)?);
    }
    let mut cfg = match &a.config {
        Some(p) => TrainConfig::load_layered(p, &layers)?,
        None => TrainConfig::from_layers("", "bench scale defaults".as_ref(), &layers)?,
    };
    cfg.data.path = None;
    if cfg.train.eval_fanouts.is_empty() {
        // Evaluate with the training fanouts, as this benchmark always has (its
        // GPU predictions and `--fit-device`'s reserve assume that working set):
        // the default floor of 20 a layer (`train.eval_fanouts`) makes a 4096-seed
        // evaluation batch of a 3-layer model ~9× larger in the engine's estimate.
        cfg.train.eval_fanouts = cfg.train.fanouts.clone();
    }
    let opts = ScaleOptions {
        graph: RmatOptions {
            num_vertices: vertices,
            num_edges: edges,
            num_classes: a.classes,
            feature_dim: a.dim,
            signal: a.signal,
            split: a.split,
            seed: a.seed,
            ..RmatOptions::default()
        },
        store: a.store.clone(),
        keep_store: a.keep_store,
        fit_device: a.fit_device,
    };
    let started = Instant::now();
    let report = bench_scale(&cfg, &opts, |phase| {
        eprintln!("[{:>7.1} s] {phase}", started.elapsed().as_secs_f64());
    })?;
    print!("{report}");
    let line = report.json_line();
    println!("{line}");
    if let Some(path) = &a.json {
        crate::atomic::write_file_atomically(path, |w| {
            use std::io::Write as _;
            writeln!(w, "{line}").map_err(|e| Error::io(path, e))
        })?;
    }
    Ok(())
}

#[derive(Debug, Args)]
pub(super) struct OrchestrationArgs {
    /// TOML configuration file (default: the built-in synthetic dataset; with
    /// `--regimes`, the built-in config on a generated R-MAT graph).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override a configuration key, e.g. `--set train.batch_size=256` (repeatable).
    /// With `--regimes`, `--set model.precision="tf32"` runs every regime with TF32
    /// matrix products (the table and its JSON lines record the precision).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Epochs per policy (the config's `train.epochs` is replaced; the default
    /// keeps the run short).
    #[arg(long, default_value_t = 2)]
    epochs: usize,
    #[command(flatten)]
    regimes: RegimeArgs,
}

/// `--regimes` and its options (ignored without it).
#[derive(Debug, Args)]
struct RegimeArgs {
    /// Compare the placements across feature widths × device-cache fractions ×
    /// feature row dtypes, on an R-MAT graph generated in memory (the config's
    /// `[data]` is not used). Every run has the config's `model.precision`: TF32
    /// with `--set model.precision="tf32"`.
    #[arg(long)]
    regimes: bool,
    /// Feature widths, comma-separated.
    #[arg(
        long,
        default_value = "100,512",
        requires = "regimes",
        allow_hyphen_values = true
    )]
    dims: String,
    /// Fractions of the stored feature bytes (vertices × dim × 4 for f32 rows, × 2
    /// for bf16) the device cache holds, comma-separated, each in [0, 1] (1: every
    /// row fits; the same fraction of the rows in either dtype).
    #[arg(
        long,
        default_value = "1,0.2,0.05,0",
        requires = "regimes",
        allow_hyphen_values = true
    )]
    cache_fractions: String,
    /// Feature row dtypes (`device.feature_dtype`), comma-separated: `f32`, `bf16`.
    /// The matrix products are the config's `model.precision` in every regime
    /// (TF32: `--set model.precision="tf32"`).
    #[arg(
        long,
        default_value = "f32",
        requires = "regimes",
        allow_hyphen_values = true
    )]
    row_dtypes: String,
    /// Vertices of the generated graph.
    #[arg(long, default_value_t = 20_000, requires = "regimes")]
    vertices: usize,
    /// Undirected edges drawn for the generated graph (stored twice, repeats dropped).
    #[arg(long, default_value_t = 200_000, requires = "regimes")]
    edges: usize,
    /// Classes of the generated graph.
    #[arg(long, default_value_t = 16, requires = "regimes")]
    classes: u32,
    /// Split as TRAIN,VAL,TEST; each `N/class`, a fraction, or `rest`.
    #[arg(long, default_value = "0.6,0.2,rest", requires = "regimes")]
    split: SplitSpec,
    /// Seed of the generated graph (the same for every width).
    #[arg(long, default_value_t = 0, requires = "regimes")]
    seed: u64,
    /// Also write the table as JSON lines here (atomically).
    #[arg(long, requires = "regimes")]
    json: Option<PathBuf>,
}

/// A comma-separated list parsed item by item; errors name `flag`.
fn parse_list<T: std::str::FromStr>(flag: &str, s: &str, what: &str) -> Result<Vec<T>> {
    parse_list_with(flag, s, what, |t| t.parse::<T>().ok())
}

/// A comma-separated list parsed item by item with `parse` (`None`: not `what`);
/// errors name `flag`.
fn parse_list_with<T>(
    flag: &str,
    s: &str,
    what: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>> {
    s.split(',')
        .map(|t| {
            let t = t.trim();
            parse(t).ok_or_else(|| {
                Error::invalid_argument(flag, format!("`{t}` in `{s}` is not {what}"))
            })
        })
        .collect()
}

impl RegimeArgs {
    /// The bench's options; malformed or out-of-range lists are errors naming
    /// `--dims`, `--cache-fractions` or `--row-dtypes`.
    fn options(&self, epochs: usize) -> Result<RegimeOptions> {
        let opts = RegimeOptions {
            dims: parse_list("--dims", &self.dims, "a positive integer")?,
            cache_fractions: parse_list(
                "--cache-fractions",
                &self.cache_fractions,
                "a number in [0, 1]",
            )?,
            row_dtypes: parse_list_with(
                "--row-dtypes",
                &self.row_dtypes,
                &format!("a row dtype; expected one of {}", row_dtype_names()),
                parse_row_dtype,
            )?,
            graph: RmatOptions {
                num_vertices: self.vertices,
                num_edges: self.edges,
                num_classes: self.classes,
                // `tandem generate rmat`'s default, so a graph matches one it writes.
                signal: 0.5,
                split: self.split,
                seed: self.seed,
                ..RmatOptions::default()
            },
            epochs,
        };
        opts.validate()?;
        Ok(opts)
    }
}

fn run_orchestration(a: &OrchestrationArgs) -> Result<()> {
    // Flag values are checked before any config file is read or anything runs.
    let regimes = if a.regimes.regimes {
        Some(a.regimes.options(a.epochs)?)
    } else {
        None
    };
    let mut layers = env_overrides(std::env::vars_os())?;
    for o in &a.overrides {
        layers.push(Override::from_set(o)?);
    }
    let cfg = match &a.config {
        Some(p) => TrainConfig::load_layered(p, &layers)?,
        None => TrainConfig::from_layers("", "built-in defaults".as_ref(), &layers)?,
    };
    let Some(opts) = regimes else {
        print!("{}", bench_orchestration(&cfg, Some(a.epochs))?);
        return Ok(());
    };
    let report = bench_regimes(&cfg, &opts, |dim, fraction, dtype, r| {
        eprintln!(
            "dim {dim}, cache {}, {dtype} rows: {} {:.3} s/epoch",
            fmt_percent(fraction),
            r.policy,
            r.epoch_secs
        );
    })?;
    print!("{report}");
    if let Some(path) = &a.regimes.json {
        report.write_json(path)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Prints a benchmark graph's size and how long it took to make (from `t`).
fn print_graph(ds: &crate::data::Dataset, t: Instant) {
    println!(
        "graph: {} vertices, {} stored edges, {} features/vertex (ready in {:.1} s)",
        ds.num_vertices(),
        ds.graph.num_edges(),
        ds.features.dim(),
        t.elapsed().as_secs_f64()
    );
}

/// The backend and the graph of `bench backend` and `bench loader`.
#[derive(Debug, Args)]
pub(super) struct DeviceGraphArgs {
    /// `host` or `cuda`.
    #[arg(long, default_value = "host")]
    device: String,
    /// CUDA ordinal.
    #[arg(long, default_value_t = 0)]
    ordinal: usize,
    /// Benchmark on this dataset instead of a generated R-MAT graph.
    #[arg(long)]
    dataset: Option<PathBuf>,
    /// Vertices of the generated graph.
    #[arg(long, default_value_t = 1_000_000)]
    vertices: usize,
    /// Undirected edges of the generated graph (stored twice).
    #[arg(long, default_value_t = 15_000_000)]
    edges: usize,
    /// Feature columns (f32) of the generated graph.
    #[arg(long, default_value_t = 128)]
    dim: usize,
}

impl DeviceGraphArgs {
    /// The dataset (opened, or an R-MAT graph generated with `classes` classes
    /// and `seed`), after printing its size.
    fn dataset(&self, classes: u32, seed: u64) -> Result<crate::data::Dataset> {
        let t = Instant::now();
        let ds = match &self.dataset {
            Some(p) => open_dataset(p, Verify::Default)?,
            None => generate_rmat(&RmatOptions {
                num_vertices: self.vertices,
                num_edges: self.edges,
                num_classes: classes,
                feature_dim: self.dim,
                split: SplitSpec::default(),
                seed,
                ..RmatOptions::default()
            })?,
        };
        print_graph(&ds, t);
        Ok(ds)
    }

    /// Runs `host` with the host backend or `cuda` with CUDA device
    /// `--ordinal`, as `--device` says.
    fn run<R>(
        &self,
        host: impl FnOnce(gpu_ops::HostBackend) -> Result<R>,
        cuda: impl FnOnce(gpu_ops::CudaBackend) -> Result<R>,
    ) -> Result<R> {
        match self.device.as_str() {
            "host" => host(gpu_ops::HostBackend::new()),
            "cuda" if cfg!(not(feature = "cuda")) => Err(Error::CudaNotCompiled {
                context: "--device cuda".into(),
            }),
            "cuda" => cuda(
                gpu_ops::CudaBackend::new(self.ordinal)
                    .map_err(|source| Error::device("--device cuda", source))?,
            ),
            other => Err(Error::invalid_argument(
                "--device",
                format!("expected \"host\" or \"cuda\", got \"{other}\""),
            )),
        }
    }
}

#[derive(Debug, Args)]
pub(super) struct BackendArgs {
    #[command(flatten)]
    on: DeviceGraphArgs,
    /// Fanout per layer, input layer first (DGL order).
    #[arg(long, default_value = "25,10,5", value_parser = parse_fanouts)]
    fanouts: Fanouts,
    /// Seeds per sampling batch.
    #[arg(long, default_value_t = 1024)]
    batch_size: usize,
    /// Sampling batches per repetition.
    #[arg(long, default_value_t = 20)]
    batches: usize,
    /// Rows gathered per repetition.
    #[arg(long, default_value_t = 100_000)]
    rows: usize,
    /// GEMM shape `m,k,n`.
    #[arg(long, default_value = "100000,128,256")]
    gemm: String,
    /// Timed repetitions.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Seed of the generated data and of the batches.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Debug, Args)]
pub(super) struct LoaderArgs {
    #[command(flatten)]
    on: DeviceGraphArgs,
    /// Fanout per layer, input layer first (DGL order).
    #[arg(long, default_value = "15,10,5", value_parser = parse_fanouts)]
    fanouts: Fanouts,
    /// Seeds per batch.
    #[arg(long, default_value_t = 1024)]
    batch_size: usize,
    /// Timed batches per loader.
    #[arg(long, default_value_t = 50)]
    batches: usize,
    /// Device feature-cache bytes (default: the loader's own choice).
    #[arg(long)]
    cache_bytes: Option<u64>,
    /// Feature row dtype: f32 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Batches built ahead.
    #[arg(long, default_value_t = 2)]
    prefetch: usize,
    #[command(flatten)]
    pool: PoolArgs,
}

#[derive(Debug, Args)]
pub(super) struct HotArgs {
    /// Vertices of the generated R-MAT graph.
    #[arg(long, default_value_t = 1_000_000)]
    vertices: usize,
    /// Undirected edges of the generated graph (stored twice).
    #[arg(long, default_value_t = 15_000_000)]
    edges: usize,
    /// Feature columns (f32): layer 0's input width.
    #[arg(long, default_value_t = 100)]
    dim: usize,
    /// Layer 0's output width.
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// Bottom-layer fanout.
    #[arg(long, default_value_t = 25)]
    fanout: u32,
    /// Hot destinations: the highest-degree vertices.
    #[arg(long, default_value_t = 20_000)]
    rows: usize,
    /// Destinations per worker task (the orchestrator's hot chunk).
    #[arg(long, default_value_t = 256)]
    chunk: usize,
    /// Worker threads (1: one worker's throughput).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Destinations per GEMM block of the fused kernel (default: sized for L2).
    #[arg(long)]
    block_rows: Option<usize>,
    /// Timed repetitions.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Seed of the generated data, the model and the sampling.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Row dtype the CPU kernel reads: `f32`, or `bf16` (also times the kernel on
    /// the bfloat16 copy of the rows, against the `f32` kernel in the same run).
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
    dtype: String,
}

fn run_hot(a: &HotArgs) -> Result<()> {
    let t = Instant::now();
    let ds = generate_rmat(&RmatOptions {
        num_vertices: a.vertices,
        num_edges: a.edges,
        num_classes: 1,
        feature_dim: a.dim,
        split: SplitSpec::default(),
        seed: a.seed,
        ..RmatOptions::default()
    })?;
    print_graph(&ds, t);
    let o = HotBenchOptions {
        hidden: a.hidden,
        fanout: a.fanout,
        rows: a.rows,
        chunk: a.chunk,
        threads: a.threads,
        reps: a.reps,
        block_rows: a.block_rows,
        seed: a.seed,
        bf16: a.dtype == "bf16",
    };
    println!("{}", bench_hot(&ds.graph, &ds.features, &o)?);
    Ok(())
}

#[derive(Debug, Args)]
pub(super) struct AggregateArgs {
    /// Destination vertices of the block.
    #[arg(long, default_value_t = 25_000)]
    dst: usize,
    /// Sampled neighbors per destination.
    #[arg(long, default_value_t = 25)]
    fanout: usize,
    /// Source vertices of the block (rows of the input matrix).
    #[arg(long, default_value_t = 400_000)]
    src: usize,
    /// Feature columns (f32).
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// Timed repetitions (best and median are reported).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    #[command(flatten)]
    pool: PoolArgs,
}

#[derive(Debug, Args)]
pub(super) struct GemmArgs {
    /// Shapes as M×K×N triples `m,k,n;m,k,n` (default: the layer shapes in use).
    #[arg(long)]
    shapes: Option<String>,
    /// Timed repetitions per shape.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    #[command(flatten)]
    pool: PoolArgs,
}

fn parse_shapes(s: &str) -> Result<Vec<GemmShape>> {
    s.split(';')
        .map(|t| {
            let v: Vec<usize> = t
                .split(',')
                .map(|x| x.trim().parse::<usize>())
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| {
                    Error::invalid_argument("--shapes", format!("`{t}`: expected m,k,n"))
                })?;
            match v[..] {
                [m, k, n] if m > 0 && k > 0 && n > 0 => Ok(GemmShape { m, k, n }),
                _ => Err(Error::invalid_argument(
                    "--shapes",
                    format!("`{t}`: expected three positive integers m,k,n"),
                )),
            }
        })
        .collect()
}

#[derive(Debug, Args)]
pub(super) struct PoolArgs {
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Seed of the generated data and of the batches.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Debug, Args)]
pub(super) struct TraceArgs {
    /// Slices recorded per tracer.
    #[arg(long, default_value_t = 2_000_000)]
    slices: u64,
}

#[derive(Debug, Args)]
pub(super) struct SampleArgs {
    /// Benchmark on this dataset instead of a generated R-MAT graph.
    #[arg(long)]
    dataset: Option<PathBuf>,
    /// Generate a uniform random graph (`--edges` pairs of uniformly drawn
    /// vertices, stored in both directions) instead of an R-MAT graph: the
    /// reference workload of `docs/performance.md` with `--edges 12500000`.
    #[arg(long, conflicts_with = "dataset")]
    uniform: bool,
    /// Vertices of the generated graph.
    #[arg(long, default_value_t = 1_000_000)]
    vertices: usize,
    /// Undirected edges of the generated graph (stored twice).
    #[arg(long, default_value_t = 15_000_000)]
    edges: usize,
    /// Fanout per layer, input layer first (DGL order).
    #[arg(long, default_value = "25,10,5", value_parser = parse_fanouts)]
    fanouts: Fanouts,
    /// Seeds per batch.
    #[arg(long, default_value_t = 1024)]
    batch_size: usize,
    /// Timed batches.
    #[arg(long, default_value_t = 200)]
    batches: usize,
    #[command(flatten)]
    pool: PoolArgs,
}

#[derive(Debug, Args)]
pub(super) struct GatherArgs {
    /// Benchmark on this dataset's features instead of a generated matrix.
    #[arg(long)]
    dataset: Option<PathBuf>,
    /// Rows of the generated matrix.
    #[arg(long, default_value_t = 1_000_000)]
    rows: usize,
    /// Columns (f32) of the generated matrix; 128 gives 512-byte rows.
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// Rows gathered per batch.
    #[arg(long, default_value_t = 100_000)]
    batch_rows: usize,
    /// Timed batches per method.
    #[arg(long, default_value_t = 20)]
    batches: usize,
    #[command(flatten)]
    pool: PoolArgs,
}

fn set_threads(threads: Option<usize>) -> Result<()> {
    if let Some(t) = threads {
        if t == 0 {
            return Err(Error::invalid_argument("--threads", "expected at least 1"));
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global()
            .map_err(|e| Error::invalid_argument("--threads", e.to_string()))?;
    }
    Ok(())
}

fn sample_graph(a: &SampleArgs) -> Result<CsrGraph> {
    let t = Instant::now();
    let g = match &a.dataset {
        Some(p) => open_dataset(p, Verify::Default)?.graph,
        None if a.uniform => uniform_graph(a.vertices, a.edges, a.pool.seed)?,
        None => {
            let opts = RmatOptions {
                num_vertices: a.vertices,
                num_edges: a.edges,
                num_classes: 1,
                feature_dim: 1,
                split: SplitSpec::default(),
                seed: a.pool.seed,
                ..RmatOptions::default()
            };
            generate_rmat(&opts)?.graph
        }
    };
    println!(
        "graph: {} vertices, {} stored edges (ready in {:.1} s)",
        g.num_vertices(),
        g.num_edges(),
        t.elapsed().as_secs_f64()
    );
    Ok(g)
}

/// `edges` pairs of uniformly drawn vertices among `vertices`, stored in both
/// directions (repeats and self-loops dropped).
fn uniform_graph(vertices: usize, edges: usize, seed: u64) -> Result<CsrGraph> {
    let n = u32::try_from(vertices)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| Error::invalid_argument("--vertices", "expected 1 ..= 2^32 − 1"))?;
    let mut r = cpu_ops::Rng::new(seed);
    let pairs: Vec<(u32, u32)> = (0..edges)
        .map(|_| {
            let (a, b) = (r.below(u64::from(n)), r.below(u64::from(n)));
            (a as u32, b as u32)
        })
        .collect();
    CsrGraph::from_edges(vertices, &pairs, cpu_ops::BuildOptions::UNDIRECTED)
        .map_err(|e| Error::cpu_ops("uniform graph", e))
}

fn gather_features(a: &GatherArgs) -> Result<FeatureMatrix> {
    match &a.dataset {
        Some(p) => Ok(open_dataset(p, Verify::Default)?.features),
        None => {
            let mut data = vec![0f32; a.rows * a.dim];
            data.par_iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = (i % 1021) as f32);
            FeatureMatrix::new(data.into(), a.rows, a.dim)
                .map_err(|e| Error::cpu_ops("generated feature matrix", e))
        }
    }
}

/// `tandem bench eval`: one evaluation of a checkpoint's weights, measured.
fn run_eval(a: &EvalArgs) -> Result<()> {
    let mut layers = env_overrides(std::env::vars_os())?;
    for o in &a.overrides {
        layers.push(Override::from_set(o)?);
    }
    let ck = crate::Checkpoint::read(&a.checkpoint)?;
    let cfg = TrainConfig::from_layers(&ck.config_toml, &a.checkpoint, &layers)?;
    let setting = match cfg.train.eval_mode {
        crate::config::EvalMode::Full => "full".to_string(),
        crate::config::EvalMode::Sampled => {
            let f: Vec<String> = cfg
                .eval_fanouts()?
                .iter()
                .map(|&f| match f {
                    cpu_ops::ALL_NEIGHBORS => "all".to_string(),
                    f => f.to_string(),
                })
                .collect();
            format!(
                "sampled [{}] batch {}",
                f.join(", "),
                cfg.train.eval_batch_size
            )
        }
    };
    let mut trainer = crate::TrainerBuilder::new(cfg).build()?;
    trainer.restore(ck, &a.checkpoint)?;
    let before = crate::trace::current_rss();
    let reset = crate::trace::reset_peak_rss();
    let t = Instant::now();
    let (val, test) = trainer.evaluate_val_test()?;
    let secs = t.elapsed().as_secs_f64();
    let peak = crate::trace::peak_rss().filter(|_| reset);
    let mib = |b: Option<u64>| {
        b.map_or("n/a".into(), |b| {
            format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
        })
    };
    let chance = trainer
        .dataset()
        .chance_accuracy(&trainer.dataset().test_ids());
    println!(
        "eval {setting}: val {val:.4} test {test:.4} (chance {chance:.4}), {secs:.2} s, rss \
         before {}, peak {} (+{})",
        mib(before),
        mib(peak),
        mib(peak.zip(before).map(|(p, b)| p.saturating_sub(b)))
    );
    Ok(())
}

pub(super) fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Eval(a) => run_eval(&a)?,
        BenchCmd::Sample(a) => {
            set_threads(a.pool.threads)?;
            let g = sample_graph(&a)?;
            let report = bench_sample(&g, &a.fanouts.0, a.batch_size, a.batches, a.pool.seed)?;
            println!("threads: {}\n{report}", rayon::current_num_threads());
        }
        BenchCmd::Gather(a) => {
            set_threads(a.pool.threads)?;
            let f = gather_features(&a)?;
            println!(
                "features: {} rows × {} f32 ({:.0} MiB)",
                f.num_rows(),
                f.dim(),
                (f.num_rows() * f.dim() * 4) as f64 / (1 << 20) as f64
            );
            let report = bench_gather(&f, a.batch_rows, a.batches, a.pool.seed)?;
            println!("threads: {}\n{report}", rayon::current_num_threads());
        }
        BenchCmd::Aggregate(a) => {
            set_threads(a.pool.threads)?;
            let report = bench_aggregate(a.dst, a.fanout, a.src, a.dim, a.reps, a.pool.seed)
                .map_err(|e| Error::cpu_ops("bench aggregate", e))?;
            println!("threads: {}\n{report}", rayon::current_num_threads());
        }
        BenchCmd::Backend(a) => run_backend(&a)?,
        BenchCmd::Loader(a) => run_loader(&a)?,
        BenchCmd::Hot(a) => run_hot(&a)?,
        BenchCmd::Trace(a) => print!("{}", trace::bench_trace(a.slices)?),
        BenchCmd::Orchestration(a) => run_orchestration(&a)?,
        BenchCmd::Dist(a) => dist::run(a)?,
        BenchCmd::Scale(a) => run_scale(&a)?,
        BenchCmd::Gemm(a) => {
            set_threads(a.pool.threads)?;
            let shapes = match &a.shapes {
                Some(s) => parse_shapes(s)?,
                None => LAYER_SHAPES.to_vec(),
            };
            let report = bench_gemm(&shapes, a.reps)?;
            println!("threads: {}\n{report}", rayon::current_num_threads());
        }
    }
    Ok(())
}

fn run_loader(a: &LoaderArgs) -> Result<()> {
    let dtype = parse_row_dtype(&a.dtype).ok_or_else(|| {
        Error::invalid_argument(
            "--dtype",
            format!("\"{}\": expected one of {}", a.dtype, row_dtype_names()),
        )
    })?;
    let ds = std::sync::Arc::new(a.on.dataset(RmatOptions::default().num_classes, a.pool.seed)?);
    let o = loader::LoaderBenchOptions {
        fanouts: a.fanouts.0.clone(),
        batch_size: a.batch_size,
        batches: a.batches,
        threads: a.pool.threads.unwrap_or(0),
        cache_bytes: a.cache_bytes,
        dtype,
        prefetch: a.prefetch,
        seed: a.pool.seed,
    };
    let report = a.on.run(
        |d| loader::bench_loader(d, &ds, &o),
        |d| loader::bench_loader(d, &ds, &o),
    )?;
    println!("{report}");
    Ok(())
}

fn run_backend(a: &BackendArgs) -> Result<()> {
    let gemm = parse_shapes(&a.gemm)?;
    let [shape] = gemm.as_slice() else {
        return Err(Error::invalid_argument(
            "--gemm",
            "expected one shape m,k,n",
        ));
    };
    let ds = a.on.dataset(1, a.seed)?;
    let o = BackendBenchOptions {
        batch_size: a.batch_size,
        batches: a.batches,
        fanouts: a.fanouts.0.clone(),
        gather_rows: a.rows,
        gemm: (shape.m, shape.k, shape.n),
        reps: a.reps,
        seed: a.seed,
    };
    let report = a.on.run(
        |d| bench_backend(&d, &ds.graph, &ds.features, &o),
        |d| bench_backend(&d, &ds.graph, &ds.features, &o),
    )?;
    println!("{report}");
    Ok(())
}
