//! `tandem report TRACE [--svg OUT.svg]`: print the summary of a trace written by
//! `tandem train --trace`, and optionally draw utilization over time.

use std::path::PathBuf;

use clap::Args;

use crate::error::Result;
use crate::trace::{read_chrome_trace, summarize, write_utilization_svg};

#[derive(Debug, Args)]
pub(super) struct ReportArgs {
    /// A trace file (Chrome trace JSON from `tandem train --trace`).
    trace: PathBuf,
    /// Also write a picture of utilization over time (CPU and accelerator
    /// counters, per-track busy fraction) to this SVG file; written atomically.
    #[arg(long, value_name = "OUT.svg")]
    svg: Option<PathBuf>,
}

pub(super) fn run(a: ReportArgs) -> Result<()> {
    let trace = read_chrome_trace(&a.trace)?;
    print!("{}", summarize(&trace));
    if let Some(svg) = &a.svg {
        write_utilization_svg(svg, &trace)?;
        println!("utilization picture written to {}", svg.display());
    }
    Ok(())
}
