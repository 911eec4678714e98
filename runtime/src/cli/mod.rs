//! The `tandem` command line: import, export, generate, inspect, benchmark, train,
//! export a trained model (ONNX), infer every vertex's rows and report on traces.
//!
//! Every subcommand maps onto a library function; this module only parses
//! arguments, prints results and turns errors into one-line messages.

mod bench;
mod data;
mod infer;
mod onnx;
mod partition;
mod progress;
mod report;
mod train;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::error::Result;

/// Tandem: CPU+GPU graph neural network training.
#[derive(Debug, Parser)]
#[command(name = "tandem", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Import a graph from a real-world format into a Tandem dataset file.
    #[command(subcommand)]
    Import(data::ImportCmd),
    /// Write a stored dataset out for other tools (DGL, PyG).
    Export(data::ExportArgs),
    /// Generate a synthetic dataset (R-MAT power-law or stochastic block model).
    #[command(subcommand)]
    Generate(data::GenerateCmd),
    /// Print a dataset's sizes and check its integrity.
    Info(data::InfoArgs),
    /// Partition a dataset's graph with METIS for `dist.partition_file` (build
    /// with the `metis` feature).
    Partition(partition::PartitionArgs),
    /// Measure sampling, gather, aggregation and matrix-multiply throughput.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// Train a GNN (default: built-in synthetic graph, GraphSAGE).
    Train(train::TrainArgs),
    /// Export a checkpoint's model as an ONNX graph (logits or embeddings) that
    /// takes the features and each layer's block: sampled batches or the whole graph.
    ExportModel(onnx::ExportModelArgs),
    /// Full-graph inference of a checkpoint's weights (embeddings or logits of
    /// every vertex), streamed layer by layer to a `.npy` file.
    Infer(infer::InferArgs),
    /// Summarize a trace from `train --trace` (and draw utilization over time).
    Report(report::ReportArgs),
}

/// The exit status of a command stopped by Ctrl-C (128 + SIGINT, as a shell
/// reports a process the signal ended).
pub const INTERRUPTED: u8 = 130;

/// Parses the process arguments, runs the command and reports errors on stderr.
/// A run stopped by Ctrl-C (its cancel token) has said so already and exits with
/// [`INTERRUPTED`], without an `error:` line.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(crate::Error::Cancelled {
            cause: crate::StopCause::Token,
            ..
        }) => ExitCode::from(INTERRUPTED),
        Err(e) => {
            eprintln!("error: {e}");
            if let Some(hint) = advice(&e) {
                eprintln!("hint: {hint}");
            }
            ExitCode::FAILURE
        }
    }
}

/// What a person at the command line can do about `e`, where the CLI knows more
/// than the library's message says (the library's messages give no CLI advice).
pub fn advice(e: &crate::Error) -> Option<&'static str> {
    match e {
        crate::Error::NonFinite { .. } => Some(
            "train.on_nonfinite = \"skip-batch\" trains on without such batches; check the \
             features for NaN with `tandem info --verify`, or lower train.lr",
        ),
        crate::Error::DataPath { .. } => Some(
            "a relative data.path in a config file is taken from that file's folder; one \
             given with --set or TANDEM_DATA__PATH from the current directory",
        ),
        crate::Error::CudaNotCompiled { .. } => Some(
            "build with runtime's `cuda` feature (on by default), or set device.kind = \"host\"",
        ),
        _ => None,
    }
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Import(c) => data::import(c),
        Command::Export(a) => data::export(a),
        Command::Generate(c) => data::generate(c),
        Command::Info(a) => data::info(a),
        Command::Partition(a) => partition::run(a),
        Command::Bench(c) => bench::run(c),
        Command::Train(a) => train::run(a),
        Command::ExportModel(a) => onnx::run(a),
        Command::Infer(a) => infer::run(a),
        Command::Report(a) => report::run(a),
    }
}

/// The output path argument shared by commands that write a dataset.
#[derive(Debug, clap::Args)]
struct OutputArg {
    /// Where to write the dataset (`.tds`); written atomically.
    #[arg(short, long)]
    output: PathBuf,
}

/// Per-layer fanouts from the command line, input layer first (DGL order).
#[derive(Clone, Debug, PartialEq)]
struct Fanouts(Vec<u32>);

/// Parses `"25,10,5"` into fanouts; `-1` or `all` means every neighbor.
fn parse_fanouts(s: &str) -> std::result::Result<Fanouts, String> {
    s.split(',')
        .map(|t| {
            let t = t.trim();
            if t == "-1" || t == "all" {
                return Ok(cpu_ops::ALL_NEIGHBORS);
            }
            match t.parse::<u32>() {
                Ok(0) | Err(_) => Err(format!(
                    "`{t}` in `{s}`: expected comma-separated positive fanouts (or -1/all)"
                )),
                Ok(k) => Ok(k),
            }
        })
        .collect::<std::result::Result<Vec<u32>, String>>()
        .map(Fanouts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn fanouts_parse() {
        assert_eq!(parse_fanouts("25,10,5").unwrap().0, vec![25, 10, 5]);
        assert_eq!(
            parse_fanouts("-1, 3").unwrap().0,
            vec![cpu_ops::ALL_NEIGHBORS, 3]
        );
        assert!(parse_fanouts("0,1").is_err());
        assert!(parse_fanouts("a").is_err());
    }

    /// The CLI's advice for a non-finite loss lives here, not in the library's
    /// message.
    #[test]
    fn a_non_finite_loss_gets_cli_advice() {
        let e = crate::Error::NonFinite {
            epoch: 0,
            batch: 3,
            loss: f64::INFINITY,
        };
        let hint = super::advice(&e).expect("advice");
        assert!(hint.contains("tandem info --verify") && hint.contains("skip-batch"));
        assert!(!e.to_string().contains("tandem"));
        let other = crate::Error::invalid_argument("x", "y");
        assert!(super::advice(&other).is_none());
    }
}
