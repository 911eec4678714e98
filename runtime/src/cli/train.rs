//! `tandem train`: train a GNN (on a GPU, or on the host backend) from a TOML
//! config (or the built-in default), printing one line per epoch; with
//! `--out DIR`, save the effective configuration, per-epoch metrics and
//! checkpoints there; with `--resume`, continue from a checkpoint.
//!
//! Under an MPI launcher (`mpirun -np N tandem train ...`, a build with the
//! `mpi` feature) every process is one rank of a data-parallel job
//! (`runtime::dist`): rank 0 prints and writes `--out`; `--trace FILE` writes
//! one trace per rank (`FILE` with `.rank<r>` before the extension); a rank that
//! fails prints its error once and ends the whole job (`MPI_Abort`).
//!
//! Configuration layers: the `--config` file (or, with `--resume` and no
//! `--config`, the checkpoint's own configuration, or the built-in defaults), then
//! `TANDEM_<SECTION>__<KEY>` environment variables, then `--set` (see
//! `crate::config`).

use parking_lot::Mutex;
use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;

use super::progress::Tenths;
use crate::checkpoint::Checkpoint;
use crate::config::{env_overrides, Override, TrainConfig};
use crate::dist::{Communicator, Solo};
use crate::error::{Error, Result};
use crate::run_dir::RunDir;
use crate::session::control::{test_at_best_val, EpochStats};
use crate::session::control::{BatchMetrics, Callback, CancelToken, Control};
use crate::trace::{
    fmt_count, summarize, write_chrome_trace, CounterSampler, SamplerOptions, Tracer,
    NO_ACCELERATOR_COUNTERS,
};
use crate::TrainerBuilder;

#[derive(Debug, Args)]
pub(super) struct TrainArgs {
    /// TOML configuration file (default: the built-in synthetic dataset and GraphSAGE).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override a configuration key, e.g. `--set train.epochs=5` (repeatable;
    /// applied after `TANDEM_<SECTION>__<KEY>` environment variables).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Do not print the effective configuration at start.
    #[arg(long)]
    quiet_config: bool,
    /// Directory for the run's outputs (created): `config.toml` (effective),
    /// `metrics.jsonl` (one line per epoch) and `checkpoint.tck` (at the end and
    /// every `train.checkpoint_every` epochs).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Continue from a checkpoint (`checkpoint.tck` of an earlier `--out`); without
    /// `--config`, the checkpoint's configuration is the base.
    #[arg(long, value_name = "CHECKPOINT")]
    resume: Option<PathBuf>,
    /// Train on this device: shorthand for `--set device.kind=KIND`
    /// (`auto`, `host` or `cuda`).
    #[arg(long, value_name = "KIND")]
    device: Option<String>,
    /// Record a Chrome/Perfetto trace of the run into FILE (JSON; written at the end,
    /// also when training fails) and print its summary.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

/// Off a terminal, epochs of at least this many batches print a line at each
/// tenth (a link epoch on a large graph has tens of thousands of batches).
const LONG_EPOCH_BATCHES: usize = 2000;

/// The epoch's progress on stderr: a one-line indicatif bar of its batches when
/// stderr is a terminal, cleared at the end of the epoch (the epoch's line on
/// stdout follows); otherwise, for a long epoch ([`LONG_EPOCH_BATCHES`]), one
/// plain line per tenth with the time per batch so far. A shorter epoch's own
/// line is its progress.
struct Progress {
    /// This process prints (rank 0).
    lead: bool,
    terminal: bool,
    /// The bar of the epoch in progress.
    bar: Option<(usize, ProgressBar)>,
    /// Plain lines: the epoch, its first batch seen, the tenths printed, and
    /// when its first batch was seen.
    lines: Option<(usize, usize, Tenths, Instant)>,
}

impl Progress {
    fn new(lead: bool, terminal: bool) -> Self {
        Self {
            lead,
            terminal,
            bar: None,
            lines: None,
        }
    }

    fn draw_bar(&mut self, m: &BatchMetrics) {
        let (done, total) = (m.batch + 1, m.batches);
        if self.bar.as_ref().is_none_or(|(e, _)| *e != m.epoch) {
            let bar =
                ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "epoch {prefix:>3} [{bar:30}] {pos}/{len} batches ({elapsed}, eta {eta})",
            ) {
                bar.set_style(style.progress_chars("= "));
            }
            bar.set_prefix(m.epoch.to_string());
            if let Some((_, old)) = self.bar.replace((m.epoch, bar)) {
                old.finish_and_clear();
            }
        }
        if let Some((_, bar)) = &self.bar {
            bar.set_position(done as u64);
            if done >= total {
                bar.finish_and_clear();
            }
        }
    }

    fn print_line(&mut self, m: &BatchMetrics) {
        if self.lines.as_ref().is_none_or(|l| l.0 != m.epoch) {
            self.lines = Some((m.epoch, m.batch, Tenths::new(), Instant::now()));
        }
        if let Some((epoch, first, tenths, started)) = &mut self.lines {
            let secs = started.elapsed().as_secs_f64();
            if let Some(line) = tenth_line(*epoch, m.batch, m.batches, *first, tenths, secs) {
                eprintln!("{line}");
            }
        }
    }
}

/// The plain progress line of batch `k` (0-based) of an epoch of `total`
/// batches, when it crosses another tenth ([`Tenths`]), `secs` after batch
/// `first` was seen; the last tenth is left to the epoch's row.
fn tenth_line(
    epoch: usize,
    k: usize,
    total: usize,
    first: usize,
    tenths: &mut Tenths,
    secs: f64,
) -> Option<String> {
    let done = k + 1;
    let tenth = tenths
        .cross(done as u64, total as u64)
        .filter(|&t| t < 10)?;
    let seen = done.saturating_sub(first).max(1);
    Some(format!(
        "epoch {epoch}: {:>3}% ({done}/{total} batches) {secs:.1} s, {:.2} ms a batch",
        tenth * 10,
        1e3 * secs / seen as f64
    ))
}

impl Callback for Progress {
    fn on_batch(&mut self, m: &BatchMetrics) -> Control {
        if self.lead {
            if self.terminal {
                self.draw_bar(m);
            } else if m.batches >= LONG_EPOCH_BATCHES {
                self.print_line(m);
            }
        }
        Control::Continue
    }
}

fn fmt_acc(a: Option<f64>) -> String {
    a.map_or_else(|| "  -   ".into(), |x| format!("{:.4}", x))
}

/// This process's part in a job: alone, or one rank over MPI.
pub(super) struct Job {
    pub(super) comm: Arc<dyn Communicator>,
    /// MPI stays initialized while this lives (dropped after every communicator).
    #[cfg(feature = "mpi")]
    _mpi: Option<crate::dist::MpiRuntime>,
}

impl Job {
    /// Alone, or (under an MPI launcher, `mpi` feature) one rank of the job.
    pub(super) fn start() -> Result<Self> {
        if !crate::dist::launched_by_mpi() {
            return Ok(Self {
                comm: Arc::new(Solo),
                #[cfg(feature = "mpi")]
                _mpi: None,
            });
        }
        #[cfg(feature = "mpi")]
        {
            let mpi = crate::dist::MpiRuntime::init()?;
            Ok(Self {
                comm: mpi.world(),
                _mpi: Some(mpi),
            })
        }
        #[cfg(not(feature = "mpi"))]
        {
            Err(Error::Dist {
                what: "this process was started by an MPI launcher, but this tandem was built \
                       without the `mpi` feature: every process would train alone and write \
                       the same outputs; build with `cargo build --release -p runtime \
                       --features mpi` (see README)"
                    .into(),
            })
        }
    }
}

/// `FILE` for rank `r` of a job of `n > 1` ranks: `trace.json` → `trace.rank1.json`.
fn rank_path(path: &std::path::Path, rank: usize, ranks: usize) -> PathBuf {
    if ranks <= 1 {
        return path.to_path_buf();
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.rank{rank}.{}", ext.to_string_lossy()),
        None => format!("{stem}.rank{rank}"),
    };
    path.with_file_name(name)
}

/// Writes `line` and a newline to stderr in one `write` call: under `mpirun`
/// the ranks' stderr and Open MPI's own messages share one stream, and a line
/// written piece by piece (as `eprintln!` formats it) can be split by another
/// process's output.
pub(super) fn stderr_line(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

pub(super) fn run(a: TrainArgs) -> Result<()> {
    let job = Job::start()?;
    let comm = Arc::clone(&job.comm);
    let (rank, ranks) = (comm.rank(), comm.size());
    if ranks > 1 {
        // A panicking rank must not leave the others waiting in a collective.
        let hook_comm = Arc::clone(&comm);
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            stderr_line(&format!("rank {rank} of {ranks} panicked:"));
            default_hook(info);
            hook_comm.abort(101);
        }));
    }
    let result = run_rank(a, Arc::clone(&comm));
    if let (Err(e), true) = (&result, ranks > 1) {
        // Printed once, by the rank that failed; MPI_Abort ends every rank.
        stderr_line(&format!("error: rank {rank} of {ranks}: {e}"));
        comm.abort(1);
    }
    drop(comm);
    drop(job);
    result
}

fn run_rank(a: TrainArgs, comm: Arc<dyn Communicator>) -> Result<()> {
    let lead = comm.rank() == 0;
    let mut layers = env_overrides(std::env::vars_os())?;
    if let Some(kind) = &a.device {
        layers.push(Override::from_set(&format!("device.kind=\"{kind}\""))?);
    }
    for o in &a.overrides {
        layers.push(Override::from_set(o)?);
    }
    let cfg = match (&a.config, &a.resume) {
        (Some(p), _) => TrainConfig::load_layered(p, &layers)?,
        (None, Some(ck)) => {
            let c = Checkpoint::read(ck)?;
            TrainConfig::from_layers(&c.config_toml, ck, &layers)?
        }
        (None, None) => TrainConfig::from_layers("", "built-in defaults".as_ref(), &layers)?,
    };
    if !a.quiet_config && lead {
        println!("# effective configuration\n{}", cfg.to_toml());
    }
    let Some(path) = a.trace.clone() else {
        return train(a, cfg, Tracer::disabled(), comm);
    };
    let path = rank_path(&path, comm.rank(), comm.size());
    let tracer = Tracer::new();
    // Its notes (a counter it cannot record) are printed once the device is
    // known (`train`).
    let sampler = CounterSampler::start(&tracer, SamplerOptions::default());
    let result = train(a, cfg, tracer.clone(), comm);
    sampler.stop();
    let trace = tracer.collect();
    let written = write_chrome_trace(&path, &trace);
    if lead {
        println!("\n{}", summarize(&trace));
    }
    match (&result, written) {
        (_, Ok(())) => println!("trace written to {}", path.display()),
        (Ok(()), Err(e)) => return Err(e),
        // Report the training error; the trace error goes to stderr.
        (Err(_), Err(e)) => eprintln!("error: writing the trace: {e}"),
    }
    result
}

fn train(
    a: TrainArgs,
    cfg: TrainConfig,
    tracer: Tracer,
    comm: Arc<dyn Communicator>,
) -> Result<()> {
    let t = Instant::now();
    let (rank, ranks) = (comm.rank(), comm.size());
    let lead = rank == 0;
    // Only rank 0 prints and writes; the others train in silence.
    macro_rules! say {
        ($($arg:tt)*) => { if lead { println!($($arg)*); } };
    }
    // Ctrl-C cancels between batches; with --out the position is checkpointed so
    // `--resume` continues exactly there, and the process exits with status 130
    // (`cli::main`). A second Ctrl-C while that happens exits at once.
    let cancel = CancelToken::new();
    let on_signal = cancel.clone();
    if let Err(e) = ctrlc::set_handler(move || {
        if on_signal.is_cancelled() {
            std::process::exit(i32::from(super::INTERRUPTED));
        }
        on_signal.cancel();
    }) {
        eprintln!("note: Ctrl-C will not stop training cleanly: {e}");
    }
    // Link prediction's val/test columns hold the first of `link.metrics`.
    let first_metric = (cfg.model.task == crate::config::TaskKind::Link)
        .then(|| cfg.link.metrics.first().cloned().unwrap_or_default());
    let mut builder = TrainerBuilder::new(cfg)
        .callback(Progress::new(lead, std::io::stderr().is_terminal()))
        .cancel_token(cancel)
        .communicator(comm)
        .tracer(tracer.clone());
    if lead {
        // The layer path's pre-sampling pass, as the importers report theirs.
        builder = builder.progress(super::progress::CliProgress::stderr("train setup"));
    }
    let mut trainer = builder.build()?;
    // The failure test of `docs/distributed.md`: this rank fails while the
    // others wait in the first step's all-reduce.
    if std::env::var("TANDEM_TEST_FAIL_RANK")
        .ok()
        .and_then(|r| r.parse().ok())
        == Some(rank)
    {
        return Err(Error::Dist {
            what: format!("injected failure on rank {rank} (TANDEM_TEST_FAIL_RANK)"),
        });
    }
    if ranks > 1 {
        say!(
            "data-parallel over {ranks} ranks: each trains 1/{ranks} of every batch of {} \
             (dist.features = \"{}\", gradients summed over MPI)",
            trainer.config().train.batch_size,
            trainer.config().dist.features
        );
    }
    say!(
        "{} (loaded in {:.2} s)",
        trainer.dataset().summary(),
        t.elapsed().as_secs_f64()
    );
    say!(
        "model: {} × {}, hidden {}, {} parameters; {}",
        trainer.config().model.kind,
        fmt_count(trainer.config().model.layers, "layer"),
        trainer.config().model.hidden,
        trainer.num_params(),
        fmt_count(trainer.threads(), "thread")
    );
    say!("{}", trainer.device_note());
    if lead {
        for note in tracer.notes() {
            // Without an accelerator, why its counters are missing is no news.
            if !(trainer.on_host() && note.starts_with(NO_ACCELERATOR_COUNTERS)) {
                eprintln!("note: {note}");
            }
        }
        for (split, ids) in [
            ("validation", trainer.dataset().val_ids()),
            ("test", trainer.dataset().test_ids()),
        ] {
            if ids.is_empty() {
                say!("note: the {split} split is empty: no {split} accuracy is reported");
            }
        }
    }
    if let Some(ck) = &a.resume {
        trainer.load_checkpoint(ck)?;
        say!(
            "resumed from {} at epoch {}, batch {} ({} optimizer steps)",
            ck.display(),
            trainer.epoch(),
            trainer.batch_in_epoch(),
            trainer.steps()
        );
    }
    let run_dir = match &a.out {
        Some(dir) if lead => Some(RunDir::create(
            dir,
            trainer.config(),
            a.resume.as_ref().map(|_| trainer.epoch()),
        )?),
        _ => None,
    };
    let epochs = trainer.config().train.epochs;
    if trainer.epoch() >= epochs {
        say!(
            "nothing to train: already at epoch {} of train.epochs = {epochs}",
            trainer.epoch()
        );
    }
    // `fit` writes the checkpoints (every `train.checkpoint_every` epochs, on
    // Ctrl-C and at the end); the callback prints each epoch and records it.
    let checkpoint = run_dir.as_ref().map(RunDir::checkpoint_path);
    let out_dir = run_dir.as_ref().map(|r| r.path().to_path_buf());
    trainer.set_checkpoint_path(checkpoint.clone());
    let failed: Arc<Mutex<Option<Error>>> = Arc::default();
    if lead {
        trainer.add_callback(Box::new(EpochLines {
            run_dir,
            failed: Arc::clone(&failed),
        }));
    }
    match &first_metric {
        Some(m) => say!("epoch   loss     train    val {m:<5}test {m:<4}train s  eval s"),
        None => say!("epoch   loss     train    val      test     train s  eval s"),
    }
    let result = match trainer.fit() {
        // Said above ("nothing to train"): the run ends with what it has.
        Err(Error::TrainingComplete { .. }) => Ok(Vec::new()),
        r => r,
    };
    if let Some(e) = failed.lock().take() {
        return Err(e);
    }
    let stats = match result {
        Ok(stats) => stats,
        Err(e @ Error::NonFinite { .. }) if !lead => return Err(e),
        Err(e @ Error::Cancelled { .. }) if !lead => return Err(e),
        Err(e @ Error::NonFinite { .. }) => {
            if let Some(path) = &checkpoint {
                eprintln!(
                    "stopped: the last good state (epoch {}, batch {}) is checkpointed in {}",
                    trainer.epoch(),
                    trainer.batch_in_epoch(),
                    path.display()
                );
            }
            return Err(e);
        }
        Err(e @ Error::Cancelled { .. }) => {
            match &checkpoint {
                Some(path) => eprintln!(
                    "interrupted: checkpoint at epoch {}, batch {} written to {}; \
                     continue with --resume {}",
                    trainer.epoch(),
                    trainer.batch_in_epoch(),
                    path.display(),
                    path.display()
                ),
                None => eprintln!(
                    "interrupted at epoch {}, batch {} (nothing saved: no --out)",
                    trainer.epoch(),
                    trainer.batch_in_epoch()
                ),
            }
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    if let Some(n) = Some(trainer.batches_sampled_ahead()).filter(|&n| n > 0) {
        say!(
            "{} trained on blocks sampled ahead (device.sample_ahead)",
            fmt_count(usize::try_from(n).unwrap_or(usize::MAX), "batch")
        );
    }
    if ranks > 1 {
        let d = trainer.dist_stats();
        say!(
            "rank 0: {} all-reduces, {:.1} MB, {:.2} s; {} feature exchanges, {:.1} MB, {:.2} s, \
             remote rows {} ({:.1}% from the cache)",
            d.allreduces,
            d.allreduce_bytes as f64 / 1e6,
            d.allreduce_secs,
            d.exchanges,
            d.exchange_bytes as f64 / 1e6,
            d.exchange_secs,
            d.remote_rows,
            100.0 * d.remote_hit_rate()
        );
    }
    if let Some(dir) = &out_dir {
        println!(
            "wrote {}, metrics.jsonl and {} to {}",
            crate::run_dir::CONFIG_FILE,
            crate::run_dir::CHECKPOINT_FILE,
            dir.display()
        );
    }
    let what = first_metric
        .as_deref()
        .map_or("accuracy".to_string(), |m| m.to_string());
    match test_at_best_val(&stats) {
        Some((e, acc)) => say!(
            "test {what} {acc:.4} at the best validation epoch {e}; {}; total {:.1} s",
            epoch_time_line(&stats),
            progress_total(&stats)
        ),
        None if !stats.is_empty() => say!(
            "{}; total {:.1} s",
            epoch_time_line(&stats),
            progress_total(&stats)
        ),
        None => {}
    }
    // The run's peak resident memory (mapped store pages it touched included):
    // `runtime/tests/memory.rs` reads this line.
    if let Some(peak) = crate::trace::peak_rss() {
        say!(
            "peak host memory {} ({peak} bytes, VmHWM)",
            crate::trace::fmt_bytes(peak)
        );
    }
    Ok(())
}

/// Prints one line per epoch (with orchestration's and `"auto"`'s lines) and
/// records it in the run directory; a failed write stops training and is
/// reported after `fit` returns.
struct EpochLines {
    run_dir: Option<RunDir>,
    failed: Arc<Mutex<Option<Error>>>,
}

impl Callback for EpochLines {
    fn on_epoch(&mut self, s: &EpochStats) -> Control {
        println!(
            "{:>5}   {:.4}   {:.4}   {}   {}   {:>7.2}  {:>6.2}",
            s.epoch,
            s.loss,
            s.train_acc,
            fmt_acc(s.selection_val()),
            fmt_acc(s.selection_test()),
            s.train_secs,
            s.eval_secs
        );
        for (split, m) in [("val", &s.val_metrics), ("test", &s.test_metrics)] {
            if m.len() > 1 {
                let all: Vec<String> = m
                    .iter()
                    .map(|v| format!("{} {:.4}", v.name, v.value))
                    .collect();
                println!("        {split}: {}", all.join(", "));
            }
        }
        if let Some(o) = &s.orchestration {
            println!("        {}", o.summary());
        }
        if s.skipped_batches > 0 {
            println!(
                "        {} batch(es) skipped for a non-finite loss (train.on_nonfinite = \"skip-batch\")",
                s.skipped_batches
            );
        }
        if s.calibrating {
            match &s.auto_choice {
                Some(reason) => println!("        orchestration.policy = \"auto\" chose {reason}"),
                None => println!("        orchestration.policy = \"auto\": still measuring"),
            }
        }
        if let Some(run) = &mut self.run_dir {
            if let Err(e) = run.record(s) {
                *self.failed.lock() = Some(e);
                return Control::Stop;
            }
        }
        Control::Continue
    }
}

fn progress_total(stats: &[EpochStats]) -> f64 {
    stats.iter().map(|s| s.train_secs + s.eval_secs).sum()
}

/// The summary's epoch time: the mean over the epochs after the first (which
/// pays one-time costs: presampling, first-use allocations, `policy = "auto"`'s
/// measurements), or the one epoch's time when only one ran.
fn epoch_time_line(stats: &[EpochStats]) -> String {
    match stats {
        [] => "no epoch trained".into(),
        [one] => format!("epoch time {:.3} s (one epoch)", one.train_secs),
        [_, rest @ ..] => format!(
            "mean epoch time {:.3} s (excluding epoch 0)",
            rest.iter().map(|s| s.train_secs).sum::<f64>() / rest.len() as f64
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(train_secs: f64) -> EpochStats {
        EpochStats {
            epoch: 0,
            loss: 1.0,
            train_acc: 0.5,
            val_acc: None,
            test_acc: None,
            val_metrics: Vec::new(),
            test_metrics: Vec::new(),
            train_secs,
            eval_secs: 0.0,
            batches: 1,
            steps: 1,
            orchestration: None,
            calibrating: false,
            auto_choice: None,
            skipped_batches: 0,
        }
    }

    #[test]
    fn a_long_epoch_prints_one_line_per_tenth_with_the_time_per_batch() {
        let mut tenths = Tenths::new();
        let lines: Vec<String> = (0..49_061)
            .filter_map(|k| tenth_line(2, k, 49_061, 0, &mut tenths, 0.002 * (k + 1) as f64))
            .collect();
        // Tenths 1..=9: the epoch's own row says 100%.
        assert_eq!(lines.len(), 9, "{lines:?}");
        assert_eq!(
            lines[0],
            "epoch 2:  10% (4907/49061 batches) 9.8 s, 2.00 ms a batch"
        );
        assert!(lines[8].starts_with("epoch 2:  90% (44155/49061 batches)"));
        // A resumed epoch times the batches it trained, not those before.
        let line = tenth_line(0, 1899, 2000, 1000, &mut Tenths::new(), 4.5).expect("a line");
        assert!(line.ends_with("5.00 ms a batch"), "{line}");
        assert_eq!(
            tenth_line(0, 5, 0, 0, &mut Tenths::new(), 1.0),
            None,
            "an empty epoch"
        );
    }

    #[test]
    fn the_epoch_time_excludes_epoch_0_only_when_there_are_others() {
        assert_eq!(
            epoch_time_line(&[epoch(2.0)]),
            "epoch time 2.000 s (one epoch)"
        );
        assert_eq!(
            epoch_time_line(&[epoch(9.0), epoch(1.0), epoch(2.0)]),
            "mean epoch time 1.500 s (excluding epoch 0)"
        );
        assert_eq!(epoch_time_line(&[]), "no epoch trained");
    }
}
