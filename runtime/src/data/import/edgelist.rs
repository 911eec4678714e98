//! Edge-list importer (SNAP style).
//!
//! Format: one edge per line, `src dst` separated by spaces or tabs. Lines whose first
//! non-blank character is `#` or `%` are comments; blank lines are skipped; `\r\n`
//! line ends are fine. Columns after the second (weights, timestamps in SNAP's
//! temporal graphs) are ignored without being checked. Ids are non-negative decimal
//! integers.
//!
//! - Undirected (default): every edge is stored in both directions.
//! - Directed: `s d` is a message `s → d`, stored in row `d` (see [`CsrGraph`]).
//!
//! Either way repeated edges and self-loops are dropped
//! ([`BuildOptions::UNDIRECTED`], [`BuildOptions::DIRECTED`]).
//!
//! Without [`GraphImportOptions::relabel`] ids are used as given: `n` is the largest
//! id + 1 (or [`GraphImportOptions::num_vertices`], and then a larger id is an
//! error), and an id of `u32::MAX` (4,294,967,295) or more is an error suggesting
//! relabeling. With `relabel`, any `u64` ids are compacted to `0..n` in sorted order
//! (the `i`-th smallest id becomes `i`), so rows of `.npy` features and labels follow
//! that order; [`EdgeListGraph::original_ids`] maps back. `num_vertices`, if given,
//! must then be at least the number of distinct ids; the extra vertices are isolated.
//!
//! Compressed files are not read: a gzip file is detected and refused with a hint to
//! `gunzip` it first.
//!
//! Speed: lines are read into one reused buffer and parsed as bytes (no per-line
//! allocation); building the CSR is a counting sort (see `cpu_ops`).

use std::path::Path;

use cpu_ops::{BuildOptions, CsrGraph};
use rayon::prelude::*;

use super::attach::{dataset_from_graph, name_from_path, GraphImportOptions};
use super::edge_split::{attach_edge_split, EdgeSplitSource, IdMap};
use super::text::{id_token, show, Lines, Tokens};
use crate::data::dataset::Dataset;
use crate::error::{Error, Result};
use crate::progress::{Meter, NoProgress, Progress};

/// An imported edge list: the graph and, with `relabel`, the original ids.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeListGraph {
    /// The topology.
    pub graph: CsrGraph,
    /// With `relabel`: `original_ids[v]` is the id vertex `v` had in the file
    /// (sorted ascending). `None` when ids were used as given.
    pub original_ids: Option<Vec<u64>>,
}

/// Reads the edge list at `path` (format in the module doc). Uses `directed`,
/// `relabel` and `num_vertices` of `opts`.
pub fn read_edge_list(path: &Path, opts: &GraphImportOptions) -> Result<EdgeListGraph> {
    read_edge_list_with(path, opts, &NoProgress)
}

/// Bytes read between two progress reports of [`read_edge_list_with`].
const BYTES_PER_REPORT: u64 = 4 << 20;

/// [`read_edge_list`], reporting to `progress` the phases `"reading"` (bytes of
/// the file) and `"graph"` (one unit: relabelling and the CSR build).
pub fn read_edge_list_with(
    path: &Path,
    opts: &GraphImportOptions,
    progress: &dyn Progress,
) -> Result<EdgeListGraph> {
    let mut lines = Lines::open(path)?;
    let size = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len();
    let reading = Meter::new(progress, "reading", size);
    let mut next_report = BYTES_PER_REPORT;
    let limit: u64 = match opts.num_vertices {
        Some(nv) if nv > u32::MAX as usize => {
            return Err(Error::invalid_argument(
                "num_vertices",
                format!("{nv} does not fit u32 vertex ids (at most {})", u32::MAX),
            ))
        }
        Some(nv) => nv as u64,
        None => u32::MAX as u64,
    };
    // Without relabel ids go straight to u32 pairs; with it, u64 pairs are kept
    // until the id set is known.
    let mut edges: Vec<(u32, u32)> = Vec::new();
    let mut wide: Vec<(u64, u64)> = Vec::new();
    let mut max_id: Option<u64> = None;
    loop {
        if lines.bytes() >= next_report {
            reading.set(lines.bytes());
            next_report = lines.bytes() + BYTES_PER_REPORT;
        }
        let Some((line_no, line)) = lines.next_line()? else {
            break;
        };
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
        let s = id_token(path, line_no, a, "source")?;
        let d = id_token(path, line_no, b, "destination")?;
        if opts.relabel {
            wide.push((s, d));
            continue;
        }
        let hi = s.max(d);
        if hi >= limit {
            let what = match opts.num_vertices {
                Some(nv) => format!(
                    "vertex id {hi} is out of range: num_vertices is {nv}, so ids must be below it"
                ),
                None => format!(
                    "vertex id {hi} does not fit u32 ids (at most {}); use relabel \
                     (`--relabel`) to compact arbitrary ids to 0..n",
                    u32::MAX - 1
                ),
            };
            return Err(Error::parse(path, line_no, what));
        }
        max_id = Some(max_id.map_or(hi, |m| m.max(hi)));
        edges.push((s as u32, d as u32));
    }
    // The file may have grown or shrunk since `metadata`: the phase ends at its size.
    reading.finish();
    let building = Meter::new(progress, "graph", 1);
    let (n, original_ids) = if opts.relabel {
        let (compact, ids) = relabel(&wide).map_err(|what| Error::format(path, what))?;
        drop(wide);
        edges = compact;
        let n = match opts.num_vertices {
            Some(nv) if nv < ids.len() => {
                return Err(Error::invalid_argument(
                    "num_vertices",
                    format!(
                        "{nv} is less than the {} distinct vertex ids in {}",
                        ids.len(),
                        path.display()
                    ),
                ))
            }
            Some(nv) => nv,
            None => ids.len(),
        };
        (n, Some(ids))
    } else {
        let n = match opts.num_vertices {
            Some(nv) => nv,
            None => {
                let n = max_id.map_or(0, |m| m as usize + 1);
                // Ids used as given make `largest id + 1` vertices. When that is far
                // more than the edges could touch, the ids are sparse labels, not
                // indices: refuse rather than allocate gigabytes of isolated vertices.
                if n > SPARSE_ID_FLOOR && n / 64 > edges.len() {
                    return Err(Error::format(
                        path,
                        format!(
                            "largest vertex id {} would make {n} vertices for only {} edges; \
                             the ids look sparse: pass --relabel to compact them, or \
                             --num-vertices to confirm the size",
                            n - 1,
                            edges.len()
                        ),
                    ));
                }
                n
            }
        };
        (n, None)
    };
    if n == 0 {
        return Err(Error::format(
            path,
            "the graph has no vertices: no edges found, and num_vertices is not given or 0",
        ));
    }
    let graph = graph_from_edges(n, &edges, opts.directed)
        .map_err(|e| Error::cpu_ops(path.display().to_string(), e))?;
    building.finish();
    Ok(EdgeListGraph {
        graph,
        original_ids,
    })
}

/// The CSR of `edges` over `n` vertices as edge lists are stored (module doc):
/// undirected — both directions — unless `directed`; repeated edges and self-loops
/// dropped either way. Shared with [`super::DatasetBuilder::symmetrize`].
pub(super) fn graph_from_edges(
    n: usize,
    edges: &[(u32, u32)],
    directed: bool,
) -> std::result::Result<CsrGraph, cpu_ops::CpuOpsError> {
    let build = if directed {
        BuildOptions::DIRECTED
    } else {
        BuildOptions::UNDIRECTED
    };
    CsrGraph::from_edges(n, edges, build)
}

/// Below this many vertices, ids are used as given however sparse they are.
const SPARSE_ID_FLOOR: usize = 1 << 24;

/// Compacted edges and the sorted original ids.
type Relabeled = (Vec<(u32, u32)>, Vec<u64>);

/// Compacts the ids of `wide` to `0..k` in sorted order; returns the edges and the
/// sorted distinct ids. `Err` when more than `u32::MAX - 1` distinct ids remain.
///
/// Two strategies, both O(E) memory beyond the input:
/// - dense ids (largest id below twice the number of endpoints, or below 2^20): one
///   `u32` table indexed by id marks the ids present, then holds their ranks;
/// - sparse ids: the `(id, endpoint)` pairs are sorted and ranks scattered back.
///
/// (Binary-searching each endpoint in the sorted id list is simpler but misses the
/// cache on every probe: about 5x slower on 25M edges.)
fn relabel(wide: &[(u64, u64)]) -> std::result::Result<Relabeled, String> {
    let endpoints = wide.len() * 2;
    let max = wide.par_iter().map(|&(s, d)| s.max(d)).max().unwrap_or(0);
    let too_many = |k: usize| {
        format!(
            "{k} distinct vertex ids do not fit u32 vertex ids (at most {})",
            u32::MAX - 1
        )
    };
    if (max as u128) < (endpoints as u128).saturating_mul(2).max(1 << 20) {
        let mut table = vec![0u32; max as usize + 1];
        for &(s, d) in wide {
            table[s as usize] = 1;
            table[d as usize] = 1;
        }
        let mut ids = Vec::new();
        for (id, t) in table.iter_mut().enumerate() {
            if *t != 0 {
                *t = ids.len() as u32;
                ids.push(id as u64);
            }
        }
        if ids.len() >= u32::MAX as usize {
            return Err(too_many(ids.len()));
        }
        let edges = wide
            .par_iter()
            .map(|&(s, d)| (table[s as usize], table[d as usize]))
            .collect();
        Ok((edges, ids))
    } else {
        let mut keyed: Vec<(u64, u64)> = wide
            .par_iter()
            .enumerate()
            .flat_map_iter(|(i, &(s, d))| [(s, 2 * i as u64), (d, 2 * i as u64 + 1)])
            .collect();
        keyed.par_sort_unstable();
        let mut edges = vec![(0u32, 0u32); wide.len()];
        let mut ids: Vec<u64> = Vec::new();
        for &(id, slot) in &keyed {
            if ids.last() != Some(&id) {
                ids.push(id);
            }
            let rank = (ids.len() - 1) as u32;
            let e = &mut edges[(slot / 2) as usize];
            if slot % 2 == 0 {
                e.0 = rank;
            } else {
                e.1 = rank;
            }
        }
        if ids.len() >= u32::MAX as usize {
            return Err(too_many(ids.len()));
        }
        ids.shrink_to_fit();
        Ok((edges, ids))
    }
}

/// Imports the edge list at `path` as a dataset named after the file stem, with
/// features, labels, split and edge split from `opts` (see
/// [`GraphImportOptions`]).
pub fn import_edge_list(path: &Path, opts: &GraphImportOptions) -> Result<Dataset> {
    import_edge_list_with(path, opts, &NoProgress)
}

/// [`import_edge_list`], reporting to `progress` the phases of
/// [`read_edge_list_with`], then `"attach"` (one unit: labels, features, split)
/// and, with [`GraphImportOptions::edge_split`], `"edge split"` (one unit).
pub fn import_edge_list_with(
    path: &Path,
    opts: &GraphImportOptions,
    progress: &dyn Progress,
) -> Result<Dataset> {
    let g = read_edge_list_with(path, opts, progress)?;
    let n = g.graph.num_vertices();
    let attaching = Meter::new(progress, "attach", 1);
    let ds = dataset_from_graph(name_from_path(path), g.graph, opts)?;
    attaching.finish();
    if opts.edge_split == EdgeSplitSource::None {
        return Ok(ds);
    }
    let splitting = Meter::new(progress, "edge split", 1);
    let ids = match &g.original_ids {
        Some(ids) => IdMap::Relabeled(ids),
        None => IdMap::Given(n),
    };
    let ds = attach_edge_split(ds, &opts.edge_split, opts.seed, !opts.directed, path, ids)?;
    splitting.finish();
    Ok(ds)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sparse_large_ids_without_relabel_are_refused_with_a_hint() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sparse.txt");
        std::fs::write(&p, "0 4000000000\n1 2\n").unwrap();
        let err = read_edge_list(&p, &GraphImportOptions::default()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("sparse.txt") && msg.contains("--relabel"),
            "{msg}"
        );
        let ok = GraphImportOptions {
            relabel: true,
            ..GraphImportOptions::default()
        };
        assert_eq!(read_edge_list(&p, &ok).unwrap().graph.num_vertices(), 4);
    }

    use super::*;
    use std::path::PathBuf;

    #[test]
    fn import_progress_is_monotone_and_reaches_every_total() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("big.txt");
        // Over two report intervals of bytes, so "reading" has intermediate reports.
        let mut text = String::from("# header\n");
        let mut v = 0u64;
        while (text.len() as u64) < 2 * BYTES_PER_REPORT + 1000 {
            text.push_str(&format!("{} {}\n", v % 50_000, (v * 7 + 1) % 50_000));
            v += 1;
        }
        std::fs::write(&p, &text).unwrap();
        let rec = crate::progress::testing::Recorder::default();
        let ds = import_edge_list_with(&p, &GraphImportOptions::default(), &rec).unwrap();
        assert_eq!(
            ds,
            import_edge_list(&p, &GraphImportOptions::default()).unwrap()
        );
        let phases = rec.check();
        assert_eq!(
            phases,
            vec![
                ("reading".to_string(), text.len() as u64),
                ("graph".to_string(), 1),
                ("attach".to_string(), 1),
            ]
        );
        let reading = rec.0.lock().iter().filter(|r| r.0 == "reading").count();
        assert!(reading >= 4, "{reading} reports while reading");
    }

    fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn rows(g: &CsrGraph) -> Vec<Vec<u32>> {
        (0..g.num_vertices() as u32)
            .map(|v| g.neighbors(v).to_vec())
            .collect()
    }

    fn err(r: Result<EdgeListGraph>) -> String {
        r.unwrap_err().to_string()
    }

    const SNAP: &str = "# Directed graph (each unordered pair of nodes is saved once)\n\
                        # FromNodeId\tToNodeId\n\
                        0\t1\n\
                        \n\
                        % another comment style\n\
                        1\t2\r\n  \
                        2 0 17 extra columns\n\
                        3 3\n\
                        0 1\n";

    #[test]
    fn undirected_symmetrizes_and_drops_duplicates_and_self_loops() {
        let d = tempfile::tempdir().unwrap();
        let p = file(d.path(), "g.txt", SNAP);
        let g = read_edge_list(&p, &GraphImportOptions::default()).unwrap();
        assert_eq!(g.original_ids, None);
        assert_eq!(
            rows(&g.graph),
            vec![vec![1, 2], vec![0, 2], vec![0, 1], vec![]]
        );
    }

    #[test]
    fn directed_stores_messages_in_the_destination_row() {
        let d = tempfile::tempdir().unwrap();
        let p = file(d.path(), "g.txt", SNAP);
        let opts = GraphImportOptions {
            directed: true,
            ..Default::default()
        };
        let g = read_edge_list(&p, &opts).unwrap().graph;
        // 0→1, 1→2, 2→0: row d holds s.
        assert_eq!(rows(&g), vec![vec![2], vec![0], vec![1], vec![]]);
        let with_n = GraphImportOptions {
            num_vertices: Some(6),
            ..opts
        };
        assert_eq!(read_edge_list(&p, &with_n).unwrap().graph.num_vertices(), 6);
    }

    #[test]
    fn relabel_compacts_sorted_ids() {
        let d = tempfile::tempdir().unwrap();
        let p = file(
            d.path(),
            "big.txt",
            "# ids beyond u32\n18446744073709551615 5\n5 9000000000\n9000000000 18446744073709551615\n",
        );
        let e = err(read_edge_list(&p, &GraphImportOptions::default()));
        assert!(
            e.contains("big.txt:2:") && e.contains("18446744073709551615") && e.contains("relabel"),
            "{e}"
        );
        let opts = GraphImportOptions {
            relabel: true,
            directed: true,
            ..Default::default()
        };
        let g = read_edge_list(&p, &opts).unwrap();
        assert_eq!(g.original_ids, Some(vec![5, 9_000_000_000, u64::MAX]));
        // u64::MAX→5 is 2→0, 5→9e9 is 0→1, 9e9→MAX is 1→2.
        assert_eq!(rows(&g.graph), vec![vec![2], vec![0], vec![1]]);
        let more = GraphImportOptions {
            num_vertices: Some(5),
            ..opts.clone()
        };
        assert_eq!(read_edge_list(&p, &more).unwrap().graph.num_vertices(), 5);
        let fewer = GraphImportOptions {
            num_vertices: Some(2),
            ..opts
        };
        assert!(err(read_edge_list(&p, &fewer)).contains("less than the 3 distinct"));
    }

    #[test]
    fn dense_and_sparse_relabel_agree() {
        let mut rng = cpu_ops::Rng::new(11);
        let small: Vec<(u64, u64)> = (0..5000)
            .map(|_| (rng.below(3000), rng.below(3000)))
            .collect();
        // The same ids spread far apart take the sorting path.
        let spread = |x: u64| x * 1_000_003 + (1 << 40);
        let big: Vec<(u64, u64)> = small.iter().map(|&(s, d)| (spread(s), spread(d))).collect();
        let (e1, ids1) = relabel(&small).unwrap();
        let (e2, ids2) = relabel(&big).unwrap();
        assert_eq!(e1, e2);
        assert_eq!(ids2, ids1.iter().map(|&x| spread(x)).collect::<Vec<_>>());
        assert!(ids1.windows(2).all(|w| w[0] < w[1]));
        for (&(s, d), &(a, b)) in small.iter().zip(&e1) {
            assert_eq!((ids1[a as usize], ids1[b as usize]), (s, d));
        }
        assert_eq!(relabel(&[]).unwrap(), (vec![], vec![]));
    }

    #[test]
    fn bad_lines_name_file_and_line() {
        let d = tempfile::tempdir().unwrap();
        let cases = [
            ("0 1\n1\n", ":2:", "found one token `1`"),
            ("0 1\n# c\n1 x2\n", ":3:", "destination vertex id `x2`"),
            ("-1 2\n", ":1:", "source vertex id `-1`"),
            ("0 1.5\n", ":1:", "`1.5`"),
            ("0 99999999999999999999999\n", ":1:", "exceeds"),
            ("0 4294967295\n", ":1:", "does not fit u32"),
        ];
        for (text, line, want) in cases {
            let p = file(d.path(), "bad.txt", text);
            let e = err(read_edge_list(&p, &GraphImportOptions::default()));
            assert!(
                e.contains("bad.txt") && e.contains(line) && e.contains(want),
                "{text:?}: {e}"
            );
        }
        // Out of range for an explicit vertex count.
        let p = file(d.path(), "n.txt", "0 1\n1 7\n");
        let opts = GraphImportOptions {
            num_vertices: Some(5),
            ..Default::default()
        };
        let e = err(read_edge_list(&p, &opts));
        assert!(
            e.contains("n.txt:2:") && e.contains("vertex id 7 is out of range"),
            "{e}"
        );
        // Nothing but comments.
        let p = file(d.path(), "empty.txt", "# nothing\n\n");
        assert!(err(read_edge_list(&p, &GraphImportOptions::default()))
            .contains("no vertices: no edges found"));
        // gzip is refused with a hint.
        let p = d.path().join("g.txt.gz");
        std::fs::write(&p, [0x1f, 0x8b, 8, 0]).unwrap();
        assert!(err(read_edge_list(&p, &GraphImportOptions::default())).contains("gunzip"));
    }

    #[test]
    fn import_builds_a_valid_dataset() {
        let d = tempfile::tempdir().unwrap();
        let text: String = (0..50).map(|i| format!("{i} {}\n", (i + 1) % 50)).collect();
        let p = file(d.path(), "ring.tsv", &text);
        let ds = import_edge_list(&p, &GraphImportOptions::default()).unwrap();
        assert_eq!(ds.name, "ring");
        assert_eq!(ds.num_vertices(), 50);
        assert_eq!(ds.graph.num_edges(), 100);
        assert_eq!(ds.features.dim(), 64);
    }
}
