//! Link-prediction splits for the topology importers ([`EdgeSplitSource`]): held out
//! at random from the imported graph, or read from text files beside it.
//!
//! Split files (`--val-edges`, `--test-edges`) are edge lists in the graph file's
//! format: `src dst` per line, `#`/`%` comments, blank lines skipped, columns after
//! the second ignored. Their ids are the graph file's ids (mapped like them under
//! `relabel`). The graph file then holds the training edges: every edge of the
//! imported graph is a training positive. Negatives files (`--val-negatives`,
//! `--test-negatives`) hold one line per positive of the matching split file, in the
//! same order: the `k` negative destinations of that positive, the same `k ≥ 1` on
//! every line.
//!
//! Every file is read line by line into the split's arrays (no other per-line
//! memory). A bad line is an error naming the file and line: an id that is not a
//! number or not a vertex of the graph, a held-out edge that is in the graph file
//! (in either direction for an undirected graph), a negatives line of another
//! length than the first.

use std::path::{Path, PathBuf};

use cpu_ops::{derive_seed, CsrGraph, HostArray};

use super::text::{id_token, show, Lines, Tokens};
use crate::data::dataset::{Dataset, EdgeList, EdgeLookup, EdgeSplit, EdgeSplitSpec};
use crate::error::{Error, Result};

/// Where an imported graph's link-prediction split comes from
/// ([`super::GraphImportOptions::edge_split`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum EdgeSplitSource {
    /// No edge split.
    #[default]
    None,
    /// Hold out validation and test edges of the graph at random
    /// ([`Dataset::split_edges`], with the edge-split stream of the import seed).
    Holdout(EdgeSplitSpec),
    /// Read validation and test edges (and negatives) from files; every edge of
    /// the graph file is a training edge. Edge lists only.
    Files(EdgeSplitFiles),
}

/// The split files of [`EdgeSplitSource::Files`] (format in the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeSplitFiles {
    /// Validation positives.
    pub val: PathBuf,
    /// Test positives.
    pub test: PathBuf,
    /// Fixed validation negatives, one line per validation positive.
    pub val_negatives: Option<PathBuf>,
    /// Fixed test negatives, one line per test positive.
    pub test_negatives: Option<PathBuf>,
}

/// The seed stream of a held-out split (beside the label, feature and split streams
/// of [`super::attach`]).
const EDGE_SPLIT_STREAM: u64 = 4;

/// The seed of a held-out split for the import seed `seed` (shared with
/// [`super::DatasetBuilder::split_edges`], so both draw the same split).
pub(super) fn holdout_seed(seed: u64) -> u64 {
    derive_seed(seed, EDGE_SPLIT_STREAM)
}

/// How the graph file's ids map to vertices: as given below `n`, or through the
/// sorted original ids of `relabel`.
pub(super) enum IdMap<'a> {
    /// Ids used as given; `n` vertices.
    Given(usize),
    /// `original[v]` is vertex `v`'s id in the file (sorted).
    Relabeled(&'a [u64]),
}

impl IdMap<'_> {
    /// The vertex of file id `id`, or the reason there is none.
    fn vertex(&self, id: u64) -> std::result::Result<u32, String> {
        match self {
            IdMap::Given(n) if id < *n as u64 => Ok(id as u32),
            IdMap::Given(n) => Err(format!(
                "vertex id {id} is out of range: the graph has {n} vertices, so ids must be below it"
            )),
            IdMap::Relabeled(ids) => ids.binary_search(&id).map(|v| v as u32).map_err(|_| {
                format!(
                    "vertex id {id} does not occur in the graph file; relabel numbers only the \
                     graph's ids"
                )
            }),
        }
    }
}

/// Adds the split `source` asks for to `ds`, whose graph was imported from
/// `graph_file` with ids `ids` and the import seed `seed`; `symmetric`: the graph
/// is undirected.
pub(super) fn attach_edge_split(
    ds: Dataset,
    source: &EdgeSplitSource,
    seed: u64,
    symmetric: bool,
    graph_file: &Path,
    ids: IdMap,
) -> Result<Dataset> {
    match source {
        EdgeSplitSource::None => Ok(ds),
        EdgeSplitSource::Holdout(spec) => ds.split_edges(spec, symmetric, holdout_seed(seed)),
        EdgeSplitSource::Files(files) => {
            let split = read_split_files(files, &ds.graph, symmetric, graph_file, &ids)?;
            ds.with_edge_split(split)
        }
    }
}

/// Reads the split files (module doc) against `graph`; the training positives are
/// the graph's edges, each once.
fn read_split_files(
    files: &EdgeSplitFiles,
    graph: &CsrGraph,
    symmetric: bool,
    graph_file: &Path,
    ids: &IdMap,
) -> Result<EdgeSplit> {
    let lookup = EdgeLookup::new(graph);
    let val = read_positives(&files.val, &lookup, symmetric, graph_file, ids)?;
    let test = read_positives(&files.test, &lookup, symmetric, graph_file, ids)?;
    let negatives = |path: &Option<PathBuf>, positives: &EdgeList, of: &Path| {
        path.as_ref()
            .map(|p| read_negatives(p, positives.len(), of, ids))
            .transpose()
    };
    let val_neg = negatives(&files.val_negatives, &val, &files.val)?;
    let test_neg = negatives(&files.test_negatives, &test, &files.test)?;
    drop(lookup);
    let train = EdgeList::from_pairs(&crate::data::dataset::edge_pairs(graph, symmetric));
    Ok(EdgeSplit {
        train,
        val,
        test,
        val_neg,
        test_neg,
        symmetric,
    })
}

/// The edges of split file `path`; an edge of the graph is an error naming the
/// line.
fn read_positives(
    path: &Path,
    lookup: &EdgeLookup,
    symmetric: bool,
    graph_file: &Path,
    ids: &IdMap,
) -> Result<EdgeList> {
    let mut lines = Lines::open(path)?;
    let (mut src, mut dst) = (Vec::new(), Vec::new());
    while let Some((line_no, line)) = lines.next_line()? {
        let mut toks = Tokens::new(line);
        let Some(a) = toks.next() else { continue };
        if a[0] == b'#' || a[0] == b'%' {
            continue;
        }
        let Some(b) = toks.next() else {
            return Err(Error::parse(
                path,
                line_no,
                format!(
                    "expected two vertex ids `src dst`, found one token `{}`",
                    show(a)
                ),
            ));
        };
        let vertex = |tok: &[u8], what: &str| {
            let id = id_token(path, line_no, tok, what)?;
            ids.vertex(id)
                .map_err(|what| Error::parse(path, line_no, what))
        };
        let (s, d) = (vertex(a, "source")?, vertex(b, "destination")?);
        if lookup.contains(s, d) || (symmetric && lookup.contains(d, s)) {
            return Err(Error::parse(
                path,
                line_no,
                format!(
                    "edge ({}, {}) is an edge of the graph file {}, so a training edge; \
                     validation and test edges never enter the sampled graph",
                    show(a),
                    show(b),
                    graph_file.display()
                ),
            ));
        }
        src.push(s);
        dst.push(d);
    }
    if src.is_empty() {
        return Err(Error::format(
            path,
            "no edges: a split file needs at least one `src dst` line",
        ));
    }
    Ok(EdgeList::new(src, dst))
}

/// The negatives file `path` for the `positives` edges of split file `of`.
fn read_negatives(path: &Path, positives: usize, of: &Path, ids: &IdMap) -> Result<HostArray<u32>> {
    let mut lines = Lines::open(path)?;
    let mut out = Vec::new();
    let (mut rows, mut k) = (0usize, 0usize);
    while let Some((line_no, line)) = lines.next_line()? {
        let mut toks = Tokens::new(line).peekable();
        match toks.peek() {
            None => continue,
            Some(t) if t[0] == b'#' || t[0] == b'%' => continue,
            Some(_) => {}
        }
        let before = out.len();
        for tok in toks {
            let id = id_token(path, line_no, tok, "negative")?;
            out.push(
                ids.vertex(id)
                    .map_err(|what| Error::parse(path, line_no, what))?,
            );
        }
        let got = out.len() - before;
        if rows == 0 {
            k = got;
        } else if got != k {
            return Err(Error::parse(
                path,
                line_no,
                format!("{got} negatives, expected {k} like the first line"),
            ));
        }
        rows += 1;
        if rows > positives {
            return Err(Error::parse(
                path,
                line_no,
                format!(
                    "more lines than the {positives} positives of {}: one line per positive",
                    of.display()
                ),
            ));
        }
    }
    if rows != positives {
        return Err(Error::format(
            path,
            format!(
                "{rows} lines of negatives, expected one per positive of {} ({positives})",
                of.display()
            ),
        ));
    }
    Ok(out.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::import::{import_edge_list, import_metis, GraphImportOptions};

    fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// A 12-cycle and its chords: enough edges for every part of a small split.
    fn ring_text() -> String {
        (0..12).map(|i| format!("{i} {}\n", (i + 1) % 12)).collect()
    }

    fn opts(edge_split: EdgeSplitSource) -> GraphImportOptions {
        GraphImportOptions {
            edge_split,
            ..GraphImportOptions::default()
        }
    }

    #[test]
    fn files_give_the_split_and_the_graph_file_the_training_edges() {
        let d = tempfile::tempdir().unwrap();
        let g = file(d.path(), "g.txt", &ring_text());
        let files = EdgeSplitFiles {
            val: file(d.path(), "val.txt", "# held out\n0 6\n"),
            test: file(d.path(), "test.txt", "1 7\n2 8\n"),
            val_negatives: Some(file(d.path(), "vn.txt", "3 4 5\n")),
            test_negatives: None,
        };
        let ds = import_edge_list(&g, &opts(EdgeSplitSource::Files(files.clone()))).unwrap();
        let s = ds.edges.as_ref().unwrap();
        assert!(s.symmetric);
        assert_eq!((s.train.len(), s.val.len(), s.test.len()), (12, 1, 2));
        assert_eq!(s.val.get(0), (0, 6));
        assert_eq!(s.val_neg.as_deref(), Some(&[3, 4, 5][..]));
        assert_eq!(ds.graph.num_edges(), 24);

        // Relabeled ids map through the graph's ids.
        let big = file(d.path(), "big.txt", "10 20\n20 30\n30 40\n40 10\n");
        let relabeled = EdgeSplitFiles {
            val: file(d.path(), "rv.txt", "10 30\n"),
            test: file(d.path(), "rt.txt", "20 40\n"),
            val_negatives: None,
            test_negatives: None,
        };
        let o = GraphImportOptions {
            relabel: true,
            ..opts(EdgeSplitSource::Files(relabeled))
        };
        let ds = import_edge_list(&big, &o).unwrap();
        let s = ds.edges.unwrap();
        assert_eq!((s.val.get(0), s.test.get(0)), ((0, 2), (1, 3)));
    }

    #[test]
    fn bad_split_files_name_the_file_and_line() {
        let d = tempfile::tempdir().unwrap();
        let g = file(d.path(), "g.txt", &ring_text());
        let ok_val = file(d.path(), "val.txt", "0 6\n");
        let case = |test: &str, negatives: Option<&str>, want: &str| {
            let files = EdgeSplitFiles {
                val: ok_val.clone(),
                test: file(d.path(), "test.txt", test),
                val_negatives: None,
                test_negatives: negatives.map(|t| file(d.path(), "tn.txt", t)),
            };
            let e = import_edge_list(&g, &opts(EdgeSplitSource::Files(files)))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{test:?} {negatives:?}: {e}");
        };
        // A test edge that is a training edge, in the reverse direction.
        case(
            "1 7\n# c\n3 2\n",
            None,
            "test.txt:3: edge (3, 2) is an edge of the graph file",
        );
        case("1 7\n1 x\n", None, "test.txt:2: destination vertex id `x`");
        case(
            "1 7\n1 12\n",
            None,
            "test.txt:2: vertex id 12 is out of range",
        );
        case("1 7\n5\n", None, "test.txt:2: expected two vertex ids");
        case("# nothing\n", None, "test.txt: no edges");
        case(
            "1 7\n2 8\n",
            Some("0 1\n0\n"),
            "tn.txt:2: 1 negatives, expected 2",
        );
        case(
            "1 7\n2 8\n",
            Some("0 1\n"),
            "tn.txt: 1 lines of negatives, expected one per positive",
        );
        case(
            "1 7\n",
            Some("0\n1\n"),
            "tn.txt:2: more lines than the 1 positives",
        );
        case(
            "1 7\n",
            Some("99\n"),
            "tn.txt:1: vertex id 99 is out of range",
        );
        // Split files are for edge lists; METIS takes a held-out split only.
        let m = file(d.path(), "m.graph", "3 3\n2 3\n1 3\n1 2\n");
        let files = EdgeSplitFiles {
            val: ok_val.clone(),
            test: ok_val.clone(),
            val_negatives: None,
            test_negatives: None,
        };
        let e = import_metis(&m, &opts(EdgeSplitSource::Files(files)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("edge_split") && e.contains("edge lists"), "{e}");
    }

    #[test]
    fn holdout_is_seeded_and_directed_lists_split_each_direction() {
        let d = tempfile::tempdir().unwrap();
        let text: String = (0..200)
            .map(|i| format!("{i} {}\n", (i + 1) % 200))
            .collect();
        let g = file(d.path(), "g.txt", &text);
        let spec: EdgeSplitSpec = "0.8,0.1,0.1".parse().unwrap();
        let a = import_edge_list(&g, &opts(EdgeSplitSource::Holdout(spec))).unwrap();
        let b = import_edge_list(&g, &opts(EdgeSplitSource::Holdout(spec))).unwrap();
        assert_eq!(a, b);
        let s = a.edges.as_ref().unwrap();
        assert_eq!((s.train.len(), s.val.len(), s.test.len()), (160, 20, 20));
        assert_eq!(a.graph.num_edges(), 320);
        let c = import_edge_list(
            &g,
            &GraphImportOptions {
                seed: 1,
                ..opts(EdgeSplitSource::Holdout(spec))
            },
        )
        .unwrap();
        assert_ne!(c.edges, a.edges);
        let directed = GraphImportOptions {
            directed: true,
            ..opts(EdgeSplitSource::Holdout(spec))
        };
        let dd = import_edge_list(&g, &directed).unwrap();
        let s = dd.edges.unwrap();
        assert!(!s.symmetric);
        assert_eq!(dd.graph.num_edges(), s.train.len());
        // The metis importer holds out too (always undirected).
        let m = file(d.path(), "m.graph", &metis_ring(40));
        let ds = import_metis(&m, &opts(EdgeSplitSource::Holdout(spec))).unwrap();
        assert!(ds.edges.unwrap().symmetric);
    }

    /// A METIS file of an `n`-cycle.
    fn metis_ring(n: usize) -> String {
        let mut t = format!("{n} {n}\n");
        for v in 0..n {
            t.push_str(&format!("{} {}\n", (v + n - 1) % n + 1, (v + 1) % n + 1));
        }
        t
    }
}
