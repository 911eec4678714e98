//! `tandem infer`: full-graph inference of a checkpoint's weights, streamed
//! layer by layer to a `.npy` file ([`crate::Trainer::infer_to_file`]).

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use super::progress::CliProgress;
use crate::config::{env_overrides, Override, TrainConfig};
use crate::error::Result;
use crate::{Checkpoint, InferOutput, TrainerBuilder};

#[derive(Debug, Args)]
pub(super) struct InferArgs {
    /// The checkpoint (`checkpoint.tck` of `tandem train --out`); its
    /// configuration is the base (its `data.path` names the dataset).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Where to write the rows: an `n × width` `.npy` array of f32, written
    /// atomically (layer files beside it while it runs, removed after).
    #[arg(short, long)]
    output: PathBuf,
    /// Write the logits (`num_classes` columns) instead of the embeddings (the
    /// layer below the classifier, `model.hidden` columns).
    #[arg(long)]
    logits: bool,
    /// Override a configuration key (repeatable), e.g. `--set
    /// 'data.path="graph.tds"'` or `--set device.kind='"host"'`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
}

pub(super) fn run(a: InferArgs) -> Result<()> {
    let t = Instant::now();
    let mut layers = env_overrides(std::env::vars_os())?;
    for o in &a.overrides {
        layers.push(Override::from_set(o)?);
    }
    let ck = Checkpoint::read(&a.checkpoint)?;
    let cfg = TrainConfig::from_layers(&ck.config_toml, &a.checkpoint, &layers)?;
    let mut trainer = TrainerBuilder::new(cfg).build()?;
    trainer.restore(ck, &a.checkpoint)?;
    println!(
        "{} (loaded in {:.2} s)",
        trainer.dataset().summary(),
        t.elapsed().as_secs_f64()
    );
    println!("{}", trainer.device_note());
    let what = if a.logits {
        InferOutput::Logits
    } else {
        InferOutput::Embeddings
    };
    let t = Instant::now();
    let progress = CliProgress::stderr("infer");
    let r = trainer.infer_to_file_with(what, &a.output, &progress)?;
    println!(
        "wrote {}: {} × {} f32 {} at step {} ({} in {}, {} of layer files \
         written and removed) in {:.2} s",
        a.output.display(),
        r.rows,
        r.width,
        if a.logits { "logits" } else { "embeddings" },
        r.steps,
        crate::trace::fmt_count(r.layers, "layer"),
        crate::trace::fmt_count(r.blocks, "row block"),
        crate::trace::fmt_bytes(r.scratch_bytes),
        t.elapsed().as_secs_f64()
    );
    // `runtime/tests/memory.rs` reads this line.
    if let Some(peak) = crate::trace::peak_rss() {
        println!(
            "peak host memory {} ({peak} bytes, VmHWM)",
            crate::trace::fmt_bytes(peak)
        );
    }
    Ok(())
}
