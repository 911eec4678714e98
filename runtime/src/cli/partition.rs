//! `tandem partition`: a METIS k-way partition of a stored dataset's graph,
//! written as a `dist.partition_file` (feature `metis`), with the fraction of
//! edges it cuts next to the fraction contiguous ranges cut.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use crate::data::dataset::{open_dataset, Verify};
use crate::dist::write_partition_file;
use crate::error::{Error, Result};

#[derive(Debug, Args)]
pub(super) struct PartitionArgs {
    /// The dataset file (`.tds`).
    dataset: PathBuf,
    /// Number of parts (the ranks that will train with it).
    #[arg(long)]
    parts: usize,
    /// Where to write the partition (one part per line; written atomically).
    #[arg(short, long)]
    output: PathBuf,
    /// METIS's random seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Fraction of `g`'s edges whose endpoints lie in different parts.
fn cut_fraction(g: &cpu_ops::CsrGraph, part: impl Fn(usize) -> usize) -> f64 {
    let mut cut = 0usize;
    for u in 0..g.num_vertices() {
        cut += g
            .neighbors(u as u32)
            .iter()
            .filter(|&&v| part(v as usize) != part(u))
            .count();
    }
    cut as f64 / g.num_edges().max(1) as f64
}

pub(super) fn run(a: PartitionArgs) -> Result<()> {
    if a.parts == 0 {
        return Err(Error::invalid_argument("--parts", "expected at least 1"));
    }
    let ds = open_dataset(&a.dataset, Verify::Default)?;
    let t = Instant::now();
    let parts = partition(&ds.graph, a.parts, a.seed)?;
    let secs = t.elapsed().as_secs_f64();
    write_partition_file(&a.output, &parts)?;
    let n = ds.num_vertices();
    let mut sizes = vec![0usize; a.parts];
    for &p in &parts {
        sizes[p as usize] += 1;
    }
    let owner = |v: usize| crate::dist::owner(v, n, a.parts);
    println!(
        "{} vertices into {} parts in {secs:.2} s: sizes {}..{}; edges cut {:.1}% \
         (contiguous ranges: {:.1}%)",
        n,
        a.parts,
        sizes.iter().min().copied().unwrap_or(0),
        sizes.iter().max().copied().unwrap_or(0),
        100.0 * cut_fraction(&ds.graph, |v| parts[v] as usize),
        100.0 * cut_fraction(&ds.graph, owner),
    );
    println!(
        "wrote {} (train with dist.features = \"partitioned\", dist.partition_file = {:?})",
        a.output.display(),
        a.output.display().to_string()
    );
    Ok(())
}

#[cfg(feature = "metis")]
fn partition(g: &cpu_ops::CsrGraph, parts: usize, seed: u64) -> Result<Vec<u32>> {
    crate::dist::partition_graph(g, parts, seed)
}

#[cfg(not(feature = "metis"))]
fn partition(_g: &cpu_ops::CsrGraph, _parts: usize, _seed: u64) -> Result<Vec<u32>> {
    Err(Error::invalid_argument(
        "tandem partition",
        "this tandem was built without METIS: cargo build --release -p runtime \
         --features metis (METIS is compiled from the metis crate's vendored sources)",
    ))
}
