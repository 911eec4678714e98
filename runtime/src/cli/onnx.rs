//! `tandem export-model`: a checkpoint's model as an ONNX graph (docs/onnx.md).

use std::path::PathBuf;

use clap::Args;

use crate::error::Result;
use crate::onnx::{export_checkpoint, kind_name, ExportOptions, OnnxOutput, OnnxSignature, OPSET};

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
    /// the classifier, after its activation; the graph then reads one block
    /// fewer); a link-prediction model: `embeddings` (the encoder's output) or
    /// `scores` (the decoder's, of pairs `pair_src`, `pair_dst`).
    #[arg(long = "output", default_value = "logits")]
    kind: OnnxOutput,
}

pub(super) fn run(a: ExportModelArgs) -> Result<()> {
    let opts = ExportOptions {
        output: a.kind,
        ..ExportOptions::default()
    };
    let cfg = export_checkpoint(&a.checkpoint, &opts, &a.out)?;
    let written = std::fs::read(&a.out).map_err(|e| crate::error::Error::io(&a.out, e))?;
    let blocks = OnnxSignature::of(&written)?.num_blocks;
    let bytes = written.len();
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
