//! `tandem train`: train a GNN on the CPU from a TOML config (or the built-in
//! default), printing one line per epoch.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::trace::{summarize, write_chrome_trace, CounterSampler, SamplerOptions, Tracer};
use crate::trainer::{load_dataset, test_at_best_val, Trainer};

#[derive(Debug, Args)]
pub(super) struct TrainArgs {
    /// TOML configuration file (default: the built-in synthetic dataset and GraphSAGE).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override a configuration key, e.g. `--set train.epochs=5` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Do not print the effective configuration at start.
    #[arg(long)]
    quiet_config: bool,
    /// Record a Chrome/Perfetto trace of the run into FILE (JSON; written at the end,
    /// also when training fails) and print its summary.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

/// A one-line progress bar on stderr, drawn only when stderr is a terminal.
struct Progress {
    enabled: bool,
    epoch: usize,
}

impl Progress {
    fn update(&mut self, done: usize, total: usize) {
        if !self.enabled {
            return;
        }
        let width = 30;
        let filled = done * width / total.max(1);
        let mut err = std::io::stderr();
        let _ = write!(
            err,
            "\repoch {:>3} [{}{}] {done}/{total} batches",
            self.epoch,
            "=".repeat(filled),
            " ".repeat(width - filled)
        );
        if done == total {
            let _ = write!(err, "\r{}\r", " ".repeat(width + 40));
        }
        let _ = err.flush();
    }
}

fn fmt_acc(a: Option<f64>) -> String {
    a.map_or_else(|| "  -   ".into(), |x| format!("{:.4}", x))
}

pub(super) fn run(a: TrainArgs) -> Result<()> {
    let cfg = match &a.config {
        Some(p) => TrainConfig::load(p, &a.overrides)?,
        None => TrainConfig::from_toml_with_overrides("", "--set".as_ref(), &a.overrides)?,
    };
    if !a.quiet_config {
        println!("# effective configuration\n{}", cfg.to_toml());
    }
    let threads = cfg.train.threads;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::invalid_argument("train.threads", e.to_string()))?;
    let Some(path) = &a.trace else {
        return pool.install(|| train(cfg, Tracer::disabled()));
    };
    let tracer = Tracer::new();
    let sampler = CounterSampler::start(&tracer, SamplerOptions::default());
    for note in tracer.notes() {
        eprintln!("note: {note}");
    }
    let result = pool.install(|| train(cfg, tracer.clone()));
    sampler.stop();
    let trace = tracer.collect();
    let written = write_chrome_trace(path, &trace);
    println!("\n{}", summarize(&trace));
    match (&result, written) {
        (_, Ok(())) => println!("trace written to {}", path.display()),
        (Ok(()), Err(e)) => return Err(e),
        // Report the training error; the trace error goes to stderr.
        (Err(_), Err(e)) => eprintln!("error: writing the trace: {e}"),
    }
    result
}

fn train(cfg: TrainConfig, tracer: Tracer) -> Result<()> {
    let t = Instant::now();
    let ds = load_dataset(&cfg)?;
    println!(
        "{} (loaded in {:.2} s)",
        ds.summary(),
        t.elapsed().as_secs_f64()
    );
    let mut trainer = Trainer::new(ds, cfg)?;
    trainer.set_tracer(tracer);
    println!(
        "model: {} × {} layers, hidden {}, {} parameters; {} threads",
        trainer.config().model.kind,
        trainer.config().model.layers,
        trainer.config().model.hidden,
        trainer.model().num_params(),
        rayon::current_num_threads()
    );
    println!("epoch   loss     train    val      test     train s  eval s");
    let mut progress = Progress {
        enabled: std::io::stderr().is_terminal(),
        epoch: 0,
    };
    let stats = {
        let mut on_batch = |d: usize, n: usize| progress.update(d, n);
        trainer.fit(
            |s| {
                println!(
                    "{:>5}   {:.4}   {:.4}   {}   {}   {:>7.2}  {:>6.2}",
                    s.epoch,
                    s.loss,
                    s.train_acc,
                    fmt_acc(s.val_acc),
                    fmt_acc(s.test_acc),
                    s.train_secs,
                    s.eval_secs
                );
            },
            &mut on_batch,
        )?
    };
    let mean_train = if stats.len() > 1 {
        stats[1..].iter().map(|s| s.train_secs).sum::<f64>() / (stats.len() - 1) as f64
    } else {
        stats.first().map_or(0.0, |s| s.train_secs)
    };
    if let Some((e, acc)) = test_at_best_val(&stats) {
        println!(
            "test accuracy {acc:.4} at the best validation epoch {e}; mean epoch time {mean_train:.3} s (excluding epoch 0); total {:.1} s",
            progress_total(&stats)
        );
    }
    Ok(())
}

fn progress_total(stats: &[crate::trainer::EpochStats]) -> f64 {
    stats.iter().map(|s| s.train_secs + s.eval_secs).sum()
}
