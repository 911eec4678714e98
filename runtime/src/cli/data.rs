//! `tandem import | export | generate | info`.

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, Subcommand};

use super::progress::CliProgress;
use super::OutputArg;
use crate::data::dataset::{
    open_dataset, write_dataset, Dataset, EdgeSplitSpec, SplitSpec, Verify,
};
use crate::data::generate::{generate_rmat_with, generate_sbm_with, RmatOptions, SbmOptions};
use crate::data::import::{
    import_edge_list_with, import_metis_with, import_npy_dir_with, import_ogb_dir_with,
    import_wordnet_with, EdgeSplitFiles, EdgeSplitSource, FeatureSource, GraphImportOptions,
    LabelSource, OgbOptions, WordNetOptions,
};
use crate::error::{Error, Result};

#[derive(Debug, Subcommand)]
pub(super) enum ImportCmd {
    /// WordNet 3.0 from Debian's `wordnet-base` (synsets, pointers, lexicographer files).
    Wordnet(WordnetArgs),
    /// A METIS graph file (`n m [fmt]` header, 1-based adjacency lines).
    Metis(GraphFileArgs),
    /// A SNAP-style edge list (`src dst` per line, `#` comments).
    Edgelist(EdgeListArgs),
    /// A directory written by `tandem export --format npy`.
    Npy(NpyDirArgs),
    /// An OGB node-property dataset as the `ogb` package downloads it
    /// (`raw/*.csv.gz`, `split/<scheme>/`).
    Ogb(OgbArgs),
}

#[derive(Debug, Args)]
pub(super) struct OgbArgs {
    /// The dataset's directory (e.g. `dataset/ogbn_arxiv`).
    input: PathBuf,
    /// Keep edges as listed (`src → dst`) instead of storing both directions.
    #[arg(long)]
    directed: bool,
    /// The split scheme under `split/` (default: the only one there).
    #[arg(long)]
    split: Option<String>,
    #[command(flatten)]
    out: OutputArg,
}

#[derive(Debug, Args)]
pub(super) struct WordnetArgs {
    /// Directory holding `data.noun`, `data.verb`, `data.adj`, `data.adv`.
    #[arg(long, default_value = "/usr/share/wordnet")]
    dir: PathBuf,
    /// Bag-of-words feature dimension (vocabulary size).
    #[arg(long, default_value_t = 2000)]
    dim: usize,
    /// Split as TRAIN,VAL,TEST; each `N/class`, a fraction, or `rest`.
    #[arg(long, default_value = "100/class,0.1,rest")]
    split: SplitSpec,
    /// Seed of the split.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    out: OutputArg,
}

/// Where features and labels come from for graphs that carry none.
#[derive(Debug, Args)]
pub(super) struct AttachArgs {
    /// Features from a `.npy` file of shape (vertices, dim), f32 or f64.
    #[arg(long)]
    features: Option<PathBuf>,
    /// Dimension of generated class-correlated features (when --features is absent).
    #[arg(long, default_value_t = 64)]
    feature_dim: usize,
    /// Strength of the class signal in generated features.
    #[arg(long, default_value_t = 0.5)]
    signal: f32,
    /// Labels from a `.npy` integer vector of length `vertices`.
    #[arg(long)]
    labels: Option<PathBuf>,
    /// Number of classes of generated labels (regions grown over the graph).
    #[arg(long, default_value_t = 16)]
    classes: u32,
    /// Split as TRAIN,VAL,TEST; each `N/class`, a fraction, or `rest`.
    #[arg(long, default_value = "0.6,0.2,rest")]
    split: SplitSpec,
    /// Seed for generated parts and the split.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl AttachArgs {
    fn options(&self) -> GraphImportOptions {
        GraphImportOptions {
            features: match &self.features {
                Some(p) => FeatureSource::Npy(p.clone()),
                None => FeatureSource::Generated {
                    dim: self.feature_dim,
                    signal: self.signal,
                },
            },
            labels: match &self.labels {
                Some(p) => LabelSource::Npy(p.clone()),
                None => LabelSource::Generated {
                    num_classes: self.classes,
                },
            },
            split: self.split,
            seed: self.seed,
            ..GraphImportOptions::default()
        }
    }
}

#[derive(Debug, Args)]
pub(super) struct GraphFileArgs {
    /// The input file.
    input: PathBuf,
    #[command(flatten)]
    attach: AttachArgs,
    #[command(flatten)]
    out: OutputArg,
}

#[derive(Debug, Args)]
pub(super) struct EdgeListArgs {
    /// The input file.
    input: PathBuf,
    /// Keep edges directed (`s d` is a message s → d) instead of symmetrizing.
    #[arg(long)]
    directed: bool,
    /// Compact arbitrary ids to 0..n in sorted order.
    #[arg(long)]
    relabel: bool,
    /// Number of vertices (default: largest id + 1).
    #[arg(long)]
    num_vertices: Option<usize>,
    /// Link prediction: hold out TRAIN,VAL,TEST fractions of the edges (e.g.
    /// 0.85,0.05,0.1), drawn with --seed; held-out edges leave the graph.
    #[arg(long, conflicts_with_all = ["val_edges", "test_edges"])]
    edge_split: Option<EdgeSplitSpec>,
    /// Link prediction: validation edges (`src dst` per line); the input file then
    /// holds the training edges.
    #[arg(long, requires = "test_edges")]
    val_edges: Option<PathBuf>,
    /// Link prediction: test edges (`src dst` per line).
    #[arg(long, requires = "val_edges")]
    test_edges: Option<PathBuf>,
    /// Fixed negatives of the validation edges: one line of k ids per edge.
    #[arg(long, requires = "val_edges")]
    val_negatives: Option<PathBuf>,
    /// Fixed negatives of the test edges: one line of k ids per edge.
    #[arg(long, requires = "test_edges")]
    test_negatives: Option<PathBuf>,
    #[command(flatten)]
    attach: AttachArgs,
    #[command(flatten)]
    out: OutputArg,
}

impl EdgeListArgs {
    /// The edge split the options ask for.
    fn edge_split(&self) -> EdgeSplitSource {
        match (&self.edge_split, &self.val_edges, &self.test_edges) {
            (Some(spec), _, _) => EdgeSplitSource::Holdout(*spec),
            (None, Some(val), Some(test)) => EdgeSplitSource::Files(EdgeSplitFiles {
                val: val.clone(),
                test: test.clone(),
                val_negatives: self.val_negatives.clone(),
                test_negatives: self.test_negatives.clone(),
            }),
            _ => EdgeSplitSource::None,
        }
    }
}

#[derive(Debug, Args)]
pub(super) struct NpyDirArgs {
    /// The directory.
    input: PathBuf,
    #[command(flatten)]
    out: OutputArg,
}

#[derive(Debug, Args)]
pub(super) struct ExportArgs {
    /// The dataset file.
    dataset: PathBuf,
    /// Output format (only `npy` for now).
    #[arg(long, default_value = "npy")]
    format: String,
    /// Output directory; replaced atomically.
    #[arg(short, long)]
    output: PathBuf,
}

#[derive(Debug, Subcommand)]
pub(super) enum GenerateCmd {
    /// Power-law graph by recursive matrix (R-MAT) edge placement.
    Rmat(RmatArgs),
    /// Stochastic block model: blocks are classes, `homophily` of edges stay inside.
    Sbm(SbmArgs),
}

#[derive(Debug, Args)]
pub(super) struct CommonGenArgs {
    /// Number of vertices.
    #[arg(long, default_value_t = 100_000)]
    vertices: usize,
    /// Number of undirected edges to draw (duplicates and self-loops are dropped).
    #[arg(long, default_value_t = 1_000_000)]
    edges: usize,
    /// Number of classes.
    #[arg(long, default_value_t = 16)]
    classes: u32,
    /// Feature dimension.
    #[arg(long, default_value_t = 100)]
    dim: usize,
    /// Strength of the class signal in the features.
    #[arg(long, default_value_t = 0.5)]
    signal: f32,
    /// Split as TRAIN,VAL,TEST; each `N/class`, a fraction, or `rest`.
    #[arg(long, default_value = "0.6,0.2,rest")]
    split: SplitSpec,
    /// Link prediction: hold out TRAIN,VAL,TEST fractions of the edges (e.g.
    /// 0.85,0.05,0.1); held-out edges leave the graph.
    #[arg(long)]
    edge_split: Option<EdgeSplitSpec>,
    /// Seed; the same seed gives the same dataset on any thread count.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    out: OutputArg,
}

#[derive(Debug, Args)]
pub(super) struct RmatArgs {
    #[command(flatten)]
    common: CommonGenArgs,
    /// R-MAT quadrant probabilities a, b, c (d = 1 - a - b - c).
    #[arg(long, default_value_t = 0.57)]
    a: f64,
    #[arg(long, default_value_t = 0.19)]
    /// Probability b.
    b: f64,
    /// Probability c.
    #[arg(long, default_value_t = 0.19)]
    c: f64,
}

#[derive(Debug, Args)]
pub(super) struct SbmArgs {
    #[command(flatten)]
    common: CommonGenArgs,
    /// Fraction of edges inside a block.
    #[arg(long, default_value_t = 0.8)]
    homophily: f64,
}

#[derive(Debug, Args)]
pub(super) struct InfoArgs {
    /// The dataset file.
    dataset: PathBuf,
    /// Also verify the feature checksum (reads the whole file).
    #[arg(long)]
    verify: bool,
}

fn save(ds: &Dataset, out: &OutputArg, started: Instant) -> Result<()> {
    let built = started.elapsed();
    write_dataset(&out.output, ds)?;
    println!("{}", ds.summary());
    println!(
        "wrote {} in {:.2} s (built in {:.2} s)",
        out.output.display(),
        started.elapsed().as_secs_f64(),
        built.as_secs_f64()
    );
    Ok(())
}

pub(super) fn import(cmd: ImportCmd) -> Result<()> {
    let t = Instant::now();
    match cmd {
        ImportCmd::Wordnet(a) => {
            let opts = WordNetOptions {
                dir: a.dir,
                feature_dim: a.dim,
                split: a.split,
                seed: a.seed,
            };
            let progress = CliProgress::stderr("import wordnet");
            save(&import_wordnet_with(&opts, &progress)?, &a.out, t)
        }
        ImportCmd::Metis(a) => {
            let progress = CliProgress::stderr("import metis");
            let ds = import_metis_with(&a.input, &a.attach.options(), &progress)?;
            save(&ds, &a.out, t)
        }
        ImportCmd::Edgelist(a) => {
            let opts = GraphImportOptions {
                directed: a.directed,
                relabel: a.relabel,
                num_vertices: a.num_vertices,
                edge_split: a.edge_split(),
                ..a.attach.options()
            };
            let progress = CliProgress::stderr("import edgelist");
            save(
                &import_edge_list_with(&a.input, &opts, &progress)?,
                &a.out,
                t,
            )
        }
        ImportCmd::Npy(a) => {
            let progress = CliProgress::stderr("import npy");
            save(&import_npy_dir_with(&a.input, &progress)?, &a.out, t)
        }
        ImportCmd::Ogb(a) => {
            let opts = OgbOptions {
                directed: a.directed,
                split: a.split,
            };
            let progress = CliProgress::stderr("import ogb");
            save(&import_ogb_dir_with(&a.input, &opts, &progress)?, &a.out, t)
        }
    }
}

pub(super) fn export(a: ExportArgs) -> Result<()> {
    if a.format != "npy" {
        return Err(Error::invalid_argument(
            "--format",
            format!("`{}` is not supported; expected `npy`", a.format),
        ));
    }
    let ds = open_dataset(&a.dataset, Verify::Default)?;
    crate::data::export::export_npy(&ds, &a.output)?;
    println!("exported {} to {}", a.dataset.display(), a.output.display());
    Ok(())
}

pub(super) fn generate(cmd: GenerateCmd) -> Result<()> {
    let t = Instant::now();
    match cmd {
        GenerateCmd::Rmat(a) => {
            let c = &a.common;
            let opts = RmatOptions {
                num_vertices: c.vertices,
                num_edges: c.edges,
                a: a.a,
                b: a.b,
                c: a.c,
                num_classes: c.classes,
                feature_dim: c.dim,
                signal: c.signal,
                split: c.split,
                edge_split: c.edge_split,
                seed: c.seed,
                ..RmatOptions::default()
            };
            let progress = CliProgress::stderr("generate rmat");
            save(&generate_rmat_with(&opts, &progress)?, &c.out, t)
        }
        GenerateCmd::Sbm(a) => {
            let c = &a.common;
            let opts = SbmOptions {
                num_vertices: c.vertices,
                num_edges: c.edges,
                num_classes: c.classes,
                homophily: a.homophily,
                feature_dim: c.dim,
                signal: c.signal,
                split: c.split,
                edge_split: c.edge_split,
                seed: c.seed,
                ..SbmOptions::default()
            };
            let progress = CliProgress::stderr("generate sbm");
            save(&generate_sbm_with(&opts, &progress)?, &c.out, t)
        }
    }
}

pub(super) fn info(a: InfoArgs) -> Result<()> {
    let verify = if a.verify {
        Verify::Full
    } else {
        Verify::Default
    };
    let t = Instant::now();
    let ds = open_dataset(&a.dataset, verify)?;
    println!("{}", ds.summary());
    let degs: Vec<usize> = (0..ds.num_vertices() as u32)
        .map(|v| ds.graph.degree(v))
        .collect();
    let max = degs.iter().copied().max().unwrap_or(0);
    let isolated = degs.iter().filter(|&&d| d == 0).count();
    println!(
        "degree: mean {:.2}, max {max}, isolated vertices {isolated}",
        ds.graph.num_edges() as f64 / ds.num_vertices().max(1) as f64
    );
    println!(
        "checked {} ({}) in {:.2} s",
        a.dataset.display(),
        if a.verify {
            "all checksums"
        } else {
            "all checksums but features"
        },
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
