//! `tandem bench dist`: data-parallel training on 1, 2, 4, ... ranks of this
//! machine. The command runs each rank count as its own job (`mpirun -np N` of
//! this same binary with `--worker`; one rank runs alone, without MPI, as the
//! reference), reads rank 0's one-line JSON report, and prints epoch time and
//! the speed-up over one rank measured in the same run, with what the
//! collectives moved. Each rank gets `cores / N` compute threads, so every row
//! uses the same cores. `communities` runs partitioned features with a
//! partition file that gives class `c`'s vertices to rank `c mod N`: on the
//! built-in stochastic block model, whose blocks are its classes, that is the
//! community partition a graph partitioner (METIS) would find. `metis` (a build
//! with the `metis` feature) partitions the graph with METIS for each rank count.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use clap::Args;

use crate::cli::train::Job;
use crate::config::{env_overrides, DistFeatures, Override, TrainConfig};
use crate::error::{Error, Result};
use crate::session::control::test_at_best_val;
use crate::TrainerBuilder;

#[derive(Debug, Args)]
pub(crate) struct DistArgs {
    /// TOML configuration file (default: the built-in synthetic dataset).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override a configuration key (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Epochs per run; the mean epoch time leaves out epoch 0 when there are more.
    #[arg(long, default_value_t = 3)]
    epochs: usize,
    /// Rank counts to run, comma-separated.
    #[arg(long, default_value = "1,2,4", value_delimiter = ',')]
    ranks: Vec<usize>,
    /// Feature placements to run, comma-separated (`replicated`, `partitioned`:
    /// contiguous ranges, `communities`: partitioned by a partition file of the
    /// classes, `metis`: by a METIS partition, feature `metis`). Those evaluate
    /// by sampled batches; `full-sharded` and `full-replicated` run replicated
    /// features with full-graph evaluation (`dist.full_eval`), to compare the
    /// evaluation's time.
    #[arg(
        long,
        default_value = "replicated,partitioned,communities",
        value_delimiter = ','
    )]
    features: Vec<String>,
    /// `dist.remote_cache_rows` for the partitioned runs.
    #[arg(long, default_value_t = 2048)]
    remote_cache_rows: usize,
    /// Internal: run as one rank and print rank 0's report.
    #[arg(long, hide = true)]
    worker: bool,
}

/// Rank 0's report of one run.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Report {
    ranks: usize,
    threads: usize,
    epoch_secs: f64,
    allreduce_secs: f64,
    allreduce_bytes: u64,
    exchange_secs: f64,
    exchange_bytes: u64,
    remote_hit_rate: f64,
    test_acc: f64,
    epochs: usize,
    /// Mean seconds of an evaluation (the timed epochs').
    #[serde(default)]
    eval_secs: f64,
    /// The test split's chance level (`Dataset::chance_accuracy`).
    #[serde(default)]
    chance_acc: f64,
}

const REPORT: &str = "TANDEM-BENCH-DIST ";

fn config(a: &DistArgs) -> Result<TrainConfig> {
    let mut layers = env_overrides(std::env::vars_os())?;
    for o in &a.overrides {
        layers.push(Override::from_set(o)?);
    }
    layers.push(Override::from_set(&format!("train.epochs={}", a.epochs))?);
    match &a.config {
        Some(p) => TrainConfig::load_layered(p, &layers),
        None => TrainConfig::from_layers("", "built-in defaults".as_ref(), &layers),
    }
}

pub(super) fn run(a: DistArgs) -> Result<()> {
    if a.worker {
        return worker(&a);
    }
    if a.ranks.is_empty() || a.ranks.contains(&0) {
        return Err(Error::invalid_argument(
            "--ranks",
            "expected rank counts ≥ 1, e.g. 1,2,4",
        ));
    }
    // (placement, partition, full-graph evaluation's dist.full_eval).
    let features: Vec<(DistFeatures, PartFile, Option<&str>)> = a
        .features
        .iter()
        .map(|f| match f.as_str() {
            "replicated" => Ok((DistFeatures::Replicated, PartFile::Ranges, None)),
            "partitioned" => Ok((DistFeatures::Partitioned, PartFile::Ranges, None)),
            "communities" => Ok((DistFeatures::Partitioned, PartFile::Classes, None)),
            "metis" if cfg!(feature = "metis") => {
                Ok((DistFeatures::Partitioned, PartFile::Metis, None))
            }
            "metis" => Err(Error::invalid_argument(
                "--features",
                "`metis` needs a build with the `metis` feature",
            )),
            "full-sharded" => Ok((DistFeatures::Replicated, PartFile::Ranges, Some("sharded"))),
            "full-replicated" => Ok((
                DistFeatures::Replicated,
                PartFile::Ranges,
                Some("replicated"),
            )),
            other => Err(Error::invalid_argument(
                "--features",
                format!(
                    "expected replicated, partitioned, communities, metis, full-sharded or \
                     full-replicated, found `{other}`"
                ),
            )),
        })
        .collect::<Result<_>>()?;
    let mut cfg = config(&a)?;
    cfg.train.eval_mode = crate::config::EvalMode::Sampled;
    cfg.validate()?;
    if !cfg!(feature = "mpi") && a.ranks.iter().any(|&n| n > 1) {
        return Err(Error::invalid_argument(
            "--ranks",
            "more than one rank needs a build with the `mpi` feature \
             (cargo build --release -p runtime --features mpi)",
        ));
    }
    let exe = std::env::current_exe()
        .map_err(|e| Error::io(std::path::Path::new("the tandem executable"), e))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "{} per run, train.batch_size {} (global), {} shared by the ranks of each run",
        crate::trace::fmt_count(a.epochs, "epoch"),
        cfg.train.batch_size,
        crate::trace::fmt_count(cores, "core")
    );
    // The community partition files, one per rank count, in a directory that
    // goes away with the command.
    let parts_dir = tempfile::tempdir()
        .map_err(|e| Error::io(std::path::Path::new("a temporary directory"), e))?;
    let ds = if features
        .iter()
        .any(|&(_, file, _)| file != PartFile::Ranges)
    {
        Some(crate::session::load_dataset(&cfg)?)
    } else {
        None
    };
    println!(
        "features         ranks  threads/rank  epoch s  speed-up  all-reduce s/ep  all-reduce MB/ep/rank  \
         exchanged MB/ep/rank  remote hit  test acc  eval s  eval speed-up"
    );
    let mut chance = None;
    for (f, by_file, full_eval) in features {
        let mut reference: Option<(f64, f64)> = None;
        for &n in &a.ranks {
            let threads = (cores / n).max(1);
            let mut cmd = if n == 1 {
                Command::new(&exe)
            } else {
                let mut c = Command::new("mpirun");
                // (--allow-run-as-root only matters to root, as in containers.)
                c.args([
                    "--allow-run-as-root",
                    "--oversubscribe",
                    "-np",
                    &n.to_string(),
                ])
                .arg(&exe);
                c
            };
            cmd.args([
                "bench",
                "dist",
                "--worker",
                "--epochs",
                &a.epochs.to_string(),
            ]);
            if let Some(p) = &a.config {
                cmd.arg("--config").arg(p);
            }
            for o in &a.overrides {
                cmd.args(["--set", o]);
            }
            // Both spellings: a config file's deprecated `train.threads` must
            // agree with threads.compute.
            cmd.args(["--set", &format!("train.threads={threads}")]);
            cmd.args(["--set", &format!("threads.compute={threads}")]);
            // Partitioned features evaluate by sampled batches; so do the
            // replicated runs, so their accuracies compare (unless the run
            // measures full-graph evaluation).
            match full_eval {
                None => cmd.args(["--set", "train.eval_mode=\"sampled\""]),
                Some(how) => cmd.args([
                    "--set",
                    "train.eval_mode=\"full\"",
                    "--set",
                    &format!("dist.full_eval=\"{how}\""),
                ]),
            };
            cmd.args(["--set", &format!("dist.features=\"{f}\"")]);
            if f == DistFeatures::Partitioned {
                cmd.args([
                    "--set",
                    &format!("dist.remote_cache_rows={}", a.remote_cache_rows),
                ]);
            }
            if let (Some(ds), true) = (&ds, by_file != PartFile::Ranges) {
                let path = parts_dir
                    .path()
                    .join(format!("{}.part.{n}", by_file.name()));
                let parts: Vec<u32> = match by_file {
                    PartFile::Metis => metis_parts(ds, n)?,
                    _ => ds.labels.iter().map(|&c| c % n as u32).collect(),
                };
                crate::dist::write_partition_file(&path, &parts)?;
                let quoted = toml::Value::String(path.to_string_lossy().into_owned()).to_string();
                cmd.args(["--set", &format!("dist.partition_file={quoted}")]);
            }
            let out = cmd.output().map_err(|e| {
                Error::io(
                    if n == 1 {
                        exe.as_path()
                    } else {
                        "mpirun".as_ref()
                    },
                    e,
                )
            })?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            let line = stdout.lines().find_map(|l| l.strip_prefix(REPORT));
            let (true, Some(line)) = (out.status.success(), line) else {
                return Err(Error::Dist {
                    what: format!(
                        "the {n}-rank run failed ({}):\n{}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    ),
                });
            };
            let r: Report = serde_json::from_str(line).map_err(|e| Error::Dist {
                what: format!("the {n}-rank run's report `{line}`: {e}"),
            })?;
            let (base, eval_base) = *reference.get_or_insert((r.epoch_secs, r.eval_secs));
            chance.get_or_insert(r.chance_acc);
            let per_epoch = |x: f64| x / r.epochs.max(1) as f64;
            let name = match (full_eval, by_file) {
                (Some(how), _) => format!("full-{how}"),
                (None, PartFile::Ranges) => f.name().to_string(),
                (None, file) => file.name().to_string(),
            };
            println!(
                "{:<16} {:>5}  {:>12}  {:>7.3}  {:>7.2}×  {:>15.4}  {:>21.2}  {:>20.2}  {:>9.1}%  {:>8.4}  \
                 {:>6.3}  {:>12.2}×",
                name,
                r.ranks,
                r.threads,
                r.epoch_secs,
                base / r.epoch_secs,
                per_epoch(r.allreduce_secs),
                per_epoch(r.allreduce_bytes as f64) / 1e6,
                per_epoch(r.exchange_bytes as f64) / 1e6,
                100.0 * r.remote_hit_rate,
                r.test_acc,
                r.eval_secs,
                eval_base / r.eval_secs
            );
        }
    }
    if let Some(c) = chance {
        println!("test acc against chance {c:.4} (the test split's most frequent class)");
    }
    Ok(())
}

/// Who owns which rows in a partitioned run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PartFile {
    /// Contiguous ranges (no file).
    Ranges,
    /// Class `c` to rank `c mod N`.
    Classes,
    /// METIS's k-way partition.
    Metis,
}

impl PartFile {
    fn name(self) -> &'static str {
        match self {
            Self::Ranges => "ranges",
            Self::Classes => "communities",
            Self::Metis => "metis",
        }
    }
}

#[cfg(feature = "metis")]
fn metis_parts(ds: &crate::data::dataset::Dataset, n: usize) -> Result<Vec<u32>> {
    crate::dist::partition_graph(&ds.graph, n, 0)
}

#[cfg(not(feature = "metis"))]
fn metis_parts(_ds: &crate::data::dataset::Dataset, _n: usize) -> Result<Vec<u32>> {
    Err(Error::invalid_argument(
        "--features",
        "`metis` needs a build with the `metis` feature",
    ))
}

/// One rank: trains and, on rank 0, prints the report line.
fn worker(a: &DistArgs) -> Result<()> {
    let job = Job::start()?;
    let comm = Arc::clone(&job.comm);
    let result = (|| {
        let cfg = config(a)?;
        let mut t = TrainerBuilder::new(cfg)
            .communicator(Arc::clone(&comm))
            .build()?;
        let stats = t.fit()?;
        let timed = if stats.len() > 1 {
            &stats[1..]
        } else {
            &stats[..]
        };
        let epoch_secs =
            timed.iter().map(|s| s.train_secs).sum::<f64>() / timed.len().max(1) as f64;
        let d = t.dist_stats();
        let report = Report {
            ranks: comm.size(),
            threads: t.threads(),
            epoch_secs,
            allreduce_secs: d.allreduce_secs,
            allreduce_bytes: d.allreduce_bytes,
            exchange_secs: d.exchange_secs,
            exchange_bytes: d.exchange_bytes,
            remote_hit_rate: d.remote_hit_rate(),
            test_acc: test_at_best_val(&stats).map_or(f64::NAN, |(_, acc)| acc),
            epochs: stats.len(),
            eval_secs: timed.iter().map(|s| s.eval_secs).sum::<f64>() / timed.len().max(1) as f64,
            chance_acc: t.dataset().chance_accuracy(&t.dataset().test_ids()),
        };
        if comm.rank() == 0 {
            let json = serde_json::to_string(&report).map_err(|e| Error::Dist {
                what: format!("encoding the report: {e}"),
            })?;
            println!("{REPORT}{json}");
        }
        Ok(())
    })();
    if let (Err(e), true) = (&result, comm.size() > 1) {
        crate::cli::train::stderr_line(&format!(
            "error: rank {} of {}: {e}",
            comm.rank(),
            comm.size()
        ));
        comm.abort(1);
    }
    drop(comm);
    drop(job);
    result
}
