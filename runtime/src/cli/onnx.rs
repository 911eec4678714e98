//! `tandem export-model`: a checkpoint's model as an ONNX graph (docs/onnx.md).

use std::path::PathBuf;

use clap::Args;

use crate::error::Result;
use crate::onnx::{export_checkpoint, kind_name, ExportOptions, OnnxOutput, OPSET};

#[derive(Debug, Args)]
pub(super) struct ExportModelArgs {
    /// A checkpoint written by `tandem train` (`run/checkpoint.tck`); the model is
    /// rebuilt from its configuration and dataset sizes, no dataset needed.
    #[arg(long)]
    checkpoint: PathBuf,
    /// Where to write the ONNX file (`model.onnx`); written atomically.
    #[arg(short = 'o', long = "out")]
    out: PathBuf,
    /// What the graph returns: `logits`, or `embeddings` (the hidden layer below
    /// the classifier, after its activation; the graph then reads one block fewer).
    #[arg(long = "output", default_value = "logits")]
    kind: OnnxOutput,
}

pub(super) fn run(a: ExportModelArgs) -> Result<()> {
    let opts = ExportOptions { output: a.kind };
    let cfg = export_checkpoint(&a.checkpoint, &opts, &a.out)?;
    let blocks = match a.kind {
        OnnxOutput::Logits => cfg.num_layers,
        OnnxOutput::Embeddings => cfg.num_layers - 1,
    };
    let bytes = std::fs::metadata(&a.out).map(|m| m.len()).unwrap_or(0);
    println!(
        "wrote {} ({bytes} bytes): {} model, {}, output `{}`, opset {OPSET}; \
         inputs x (rows × {}), then src_l, dst_l, num_dst_l for blocks l = 0..{blocks}",
        a.out.display(),
        kind_name(cfg.kind),
        crate::trace::fmt_count(cfg.num_layers, "layer"),
        a.kind,
        cfg.in_dim,
    );
    Ok(())
}
