//! METIS graph importer (the `.graph` format of gpmetis, described in the METIS
//! manual, section 4.1.1).
//!
//! 1. Lines whose first non-blank character is `%` are comments, anywhere.
//! 2. The header is `n m [fmt [ncon]]`: `n` vertices, `m` undirected edges. `fmt` is up
//!    to three 0/1 digits read from the right: edge weights, vertex weights, vertex
//!    sizes (`1`, `10`, `11`, `100`, `011`, ...). `ncon` is the number of weights per
//!    vertex (default 1; only allowed with vertex weights).
//! 3. Then exactly `n` vertex lines, line `i` for vertex `i` (1-based): the size if
//!    `fmt` has it, `ncon` weights if `fmt` has them, then the neighbors as 1-based
//!    ids, each followed by its edge weight if `fmt` has edge weights. A blank line is
//!    a vertex without neighbors. Sizes and weights must be non-negative integers
//!    and are checked, then dropped: Tandem keeps only the topology.
//! 4. Across all vertex lines there must be exactly `2m` neighbor entries. After the
//!    `n`-th vertex line only blank lines and comments may follow.
//!
//! The CSR stores each vertex's neighbor list as its row; the adjacency is
//! symmetrized, and repeated entries and self-loops are dropped
//! ([`BuildOptions::UNDIRECTED`]), so a valid METIS file (symmetric, simple) yields
//! exactly `2m` stored edges. Errors name the file and line.
//!
//! Compressed files are refused with a hint to `gunzip` them first (Debian's
//! `libmetis-doc` ships the example graphs uncompressed).

use std::path::Path;

use cpu_ops::{BuildOptions, CsrGraph};

use super::attach::{dataset_from_graph, name_from_path, GraphImportOptions};
use super::edge_split::{attach_edge_split, EdgeSplitSource, IdMap};
use super::text::{first_non_blank, parse_u64, show, Lines, Tokens};
use crate::data::dataset::Dataset;
use crate::error::{Error, Result};
use crate::progress::{Meter, NoProgress, Progress};

/// Bytes read between two progress reports of [`read_metis_with`].
const BYTES_PER_REPORT: u64 = 4 << 20;

/// What a METIS header declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    n: u64,
    m: u64,
    has_size: bool,
    ncon: usize,
    has_edge_weights: bool,
}

/// Reads the next line that is not a comment (`%`), with its 1-based number; `None`
/// at the end of the file.
fn next_content_line(lines: &mut Lines) -> Result<Option<(u64, &[u8])>> {
    loop {
        match lines.next_line()? {
            None => return Ok(None),
            Some((_, l)) if first_non_blank(l) == Some(b'%') => continue,
            Some(_) => break,
        }
    }
    // Return the line found above (the borrow checker rejects returning it from
    // inside the loop).
    Ok(Some(lines.current()))
}

fn parse_header(path: &Path, line_no: u64, line: &[u8]) -> Result<Header> {
    let bad = |what: String| Error::parse(path, line_no, what);
    let toks: Vec<&[u8]> = Tokens::new(line).collect();
    if toks.len() < 2 || toks.len() > 4 {
        return Err(bad(format!(
            "expected the header `n m [fmt [ncon]]`, found {} tokens",
            toks.len()
        )));
    }
    let num = |tok: &[u8], what: &str| {
        parse_u64(tok).ok_or_else(|| {
            bad(format!(
                "header: {what} `{}` is not a non-negative integer",
                show(tok)
            ))
        })
    };
    let n = num(toks[0], "vertex count n")?;
    let m = num(toks[1], "edge count m")?;
    if n >= u32::MAX as u64 {
        return Err(bad(format!(
            "header: {n} vertices do not fit u32 vertex ids (at most {})",
            u32::MAX - 1
        )));
    }
    let (mut has_size, mut has_vwgt, mut has_edge_weights) = (false, false, false);
    if let Some(fmt) = toks.get(2) {
        if fmt.len() > 3 || fmt.iter().any(|&c| c != b'0' && c != b'1') {
            return Err(bad(format!(
                "header: fmt `{}` must be up to three 0/1 digits (sizes, vertex weights, edge weights)",
                show(fmt)
            )));
        }
        let digit =
            |from_right: usize| fmt.len() > from_right && fmt[fmt.len() - 1 - from_right] == b'1';
        has_edge_weights = digit(0);
        has_vwgt = digit(1);
        has_size = digit(2);
    }
    let ncon = match toks.get(3) {
        None => usize::from(has_vwgt),
        Some(tok) => {
            let c = num(tok, "ncon")?;
            if !has_vwgt {
                return Err(bad(format!(
                    "header: ncon is {c} but fmt declares no vertex weights"
                )));
            }
            if c == 0 || c > 1024 {
                return Err(bad(format!("header: ncon {c} is outside 1..=1024")));
            }
            c as usize
        }
    };
    Ok(Header {
        n,
        m,
        has_size,
        ncon,
        has_edge_weights,
    })
}

/// Reads the METIS graph at `path` (format in the module doc) into a CSR.
pub fn read_metis(path: &Path) -> Result<CsrGraph> {
    read_metis_with(path, &NoProgress)
}

/// [`read_metis`], reporting to `progress` the phases `"reading"` (bytes of the
/// file) and `"graph"` (one unit: the CSR build), as the edge-list importer does.
pub fn read_metis_with(path: &Path, progress: &dyn Progress) -> Result<CsrGraph> {
    let mut lines = Lines::open(path)?;
    let size = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len();
    let reading = Meter::new(progress, "reading", size);
    let mut next_report = BYTES_PER_REPORT;
    // Skip comments and blank lines before the header.
    let (header_line, header) = loop {
        match next_content_line(&mut lines)? {
            None => {
                return Err(Error::format(
                    path,
                    "no header line `n m [fmt [ncon]]`: the file is empty",
                ))
            }
            Some((_, l)) if first_non_blank(l).is_none() => continue,
            Some((no, l)) => break (no, parse_header(path, no, l)?),
        }
    };
    let n = header.n;
    let prefix = usize::from(header.has_size) + header.ncon;
    let step = if header.has_edge_weights { 2 } else { 1 };
    let expected = header.m.checked_mul(2).ok_or_else(|| {
        Error::parse(
            path,
            header_line,
            format!("header: edge count {} overflows", header.m),
        )
    })?;
    let mut edges: Vec<(u32, u32)> = Vec::with_capacity(expected.min(1 << 28) as usize);
    let mut entries: u64 = 0;
    let mut v: u64 = 0;
    while v < n {
        if lines.bytes() >= next_report {
            reading.set(lines.bytes());
            next_report = lines.bytes() + BYTES_PER_REPORT;
        }
        let Some((line_no, line)) = next_content_line(&mut lines)? else {
            return Err(Error::parse(
                path,
                lines.line_no(),
                format!(
                    "the file ends after {v} vertex lines; the header (line {header_line}) declares {n} vertices"
                ),
            ));
        };
        let bad = |what: String| Error::parse(path, line_no, what);
        let mut toks = Tokens::new(line);
        for k in 0..prefix {
            let what = if header.has_size && k == 0 {
                "vertex size"
            } else {
                "vertex weight"
            };
            let tok = toks.next().ok_or_else(|| {
                bad(format!(
                    "vertex {}: expected {prefix} leading size/weight value(s) (fmt), found {k}",
                    v + 1
                ))
            })?;
            if parse_u64(tok).is_none() {
                return Err(bad(format!(
                    "vertex {}: {what} `{}` is not a non-negative integer",
                    v + 1,
                    show(tok)
                )));
            }
        }
        let dst = v as u32;
        let mut k = 0usize;
        for tok in toks {
            if k.is_multiple_of(step) {
                let u = parse_u64(tok).ok_or_else(|| {
                    bad(format!(
                        "vertex {}: neighbor `{}` is not a non-negative integer",
                        v + 1,
                        show(tok)
                    ))
                })?;
                if u == 0 || u > n {
                    return Err(bad(format!(
                        "vertex {}: neighbor id {u} is out of range 1..={n} (METIS ids are 1-based)",
                        v + 1
                    )));
                }
                edges.push(((u - 1) as u32, dst));
                entries += 1;
            } else if parse_u64(tok).is_none() {
                return Err(bad(format!(
                    "vertex {}: edge weight `{}` is not a non-negative integer",
                    v + 1,
                    show(tok)
                )));
            }
            k += 1;
        }
        if !k.is_multiple_of(step) {
            return Err(bad(format!(
                "vertex {}: fmt declares edge weights, but the last neighbor has no weight \
                 ({k} tokens after the vertex weights, expected neighbor/weight pairs)",
                v + 1
            )));
        }
        v += 1;
    }
    while let Some((line_no, line)) = next_content_line(&mut lines)? {
        if first_non_blank(line).is_some() {
            return Err(Error::parse(
                path,
                line_no,
                format!(
                    "more vertex lines than the {n} vertices the header (line {header_line}) declares"
                ),
            ));
        }
    }
    if entries != expected {
        return Err(Error::parse(
            path,
            header_line,
            format!(
                "the header declares {} edges, so 2m = {expected} adjacency entries are \
                 expected; the vertex lines hold {entries}",
                header.m
            ),
        ));
    }
    reading.finish();
    let building = Meter::new(progress, "graph", 1);
    let g = CsrGraph::from_edges(n as usize, &edges, BuildOptions::UNDIRECTED)
        .map_err(|e| Error::cpu_ops(path.display().to_string(), e))?;
    building.finish();
    Ok(g)
}

/// Imports the METIS graph at `path` as a dataset named after the file stem, with
/// features, labels and split from `opts` (its `directed`, `relabel` and
/// `num_vertices` are ignored: see [`GraphImportOptions`]).
pub fn import_metis(path: &Path, opts: &GraphImportOptions) -> Result<Dataset> {
    import_metis_with(path, opts, &NoProgress)
}

/// [`import_metis`], reporting to `progress` the phases of [`read_metis_with`],
/// then `"attach"` (one unit: labels, features, split).
pub fn import_metis_with(
    path: &Path,
    opts: &GraphImportOptions,
    progress: &dyn Progress,
) -> Result<Dataset> {
    if let EdgeSplitSource::Files(_) = opts.edge_split {
        return Err(Error::invalid_argument(
            "edge_split",
            "split files are read for edge lists only (`import edgelist`); a METIS graph \
             takes a held-out split (EdgeSplitSource::Holdout, `--edge-split`)",
        ));
    }
    let graph = read_metis_with(path, progress)?;
    let n = graph.num_vertices();
    let attaching = Meter::new(progress, "attach", 1);
    let ds = dataset_from_graph(name_from_path(path), graph, opts)?;
    attaching.finish();
    if opts.edge_split == EdgeSplitSource::None {
        return Ok(ds);
    }
    let splitting = Meter::new(progress, "edge split", 1);
    let ds = attach_edge_split(ds, &opts.edge_split, opts.seed, true, path, IdMap::Given(n))?;
    splitting.finish();
    Ok(ds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn file(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join("g.graph");
        std::fs::write(&p, text).unwrap();
        p
    }

    fn rows(g: &CsrGraph) -> Vec<Vec<u32>> {
        (0..g.num_vertices() as u32)
            .map(|v| g.neighbors(v).to_vec())
            .collect()
    }

    /// The 7-vertex, 11-edge example graph of the METIS manual (figure 2).
    const MANUAL: &str = "7 11\n5 3 2\n1 3 4\n5 4 2 1\n2 3 6 7\n1 3 6\n5 4 7\n6 4\n";
    fn manual_rows() -> Vec<Vec<u32>> {
        vec![
            vec![1, 2, 4],
            vec![0, 2, 3],
            vec![0, 1, 3, 4],
            vec![1, 2, 5, 6],
            vec![0, 2, 5],
            vec![3, 4, 6],
            vec![3, 5],
        ]
    }

    #[test]
    fn plain_graph_with_comments() {
        let d = tempfile::tempdir().unwrap();
        let text = format!(
            "% a comment\n  %% another\n{}% trailing comment\n\n",
            MANUAL.replacen("\n", "\n% inside\n", 2)
        );
        let g = read_metis(&file(d.path(), &text)).unwrap();
        assert_eq!(rows(&g), manual_rows());
        assert_eq!(g.num_edges(), 22);
    }

    #[test]
    fn weighted_formats_skip_weights() {
        let d = tempfile::tempdir().unwrap();
        // Edge weights (fmt 1).
        let ew = "7 11 1\n5 1 3 2 2 1\n1 1 3 2 4 1\n5 3 4 2 2 2 1 2\n2 1 3 2 6 2 7 5\n\
                  1 1 3 3 6 2\n5 2 4 2 7 6\n6 6 4 5\n";
        assert_eq!(
            rows(&read_metis(&file(d.path(), ew)).unwrap()),
            manual_rows()
        );
        // Sizes, 3 vertex weights and edge weights (fmt 111, ncon 3).
        let all = "7 11 111 3\n9 4 5 6 5 1 3 2 2 1\n9 2 2 2 1 1 3 2 4 1\n9 5 2 2 5 3 4 2 2 2 1 2\n\
                   9 3 1 0 2 1 3 2 6 2 7 5\n9 1 1 1 1 1 3 3 6 2\n9 6 3 3 5 2 4 2 7 6\n9 2 2 2 6 6 4 5\n";
        assert_eq!(
            rows(&read_metis(&file(d.path(), all)).unwrap()),
            manual_rows()
        );
        // Vertex weights only, written `010` with two constraints; a blank vertex line.
        let vw = "3 1 010 2\n1 1 2\n4 4 1\n0 0\n";
        let g = read_metis(&file(d.path(), vw)).unwrap();
        assert_eq!(rows(&g), vec![vec![1], vec![0], vec![]]);
        let isolated = "3 1\n3\n\n1\n";
        let g = read_metis(&file(d.path(), isolated)).unwrap();
        assert_eq!(rows(&g), vec![vec![2], vec![], vec![0]]);
    }

    #[test]
    fn bad_inputs_name_file_and_line() {
        let d = tempfile::tempdir().unwrap();
        let cases: &[(&str, &str, &str)] = &[
            (
                "3 1\n2\n1 0\n\n",
                ":3:",
                "neighbor id 0 is out of range 1..=3",
            ),
            (
                "3 1\n2\n1 4\n\n",
                ":3:",
                "neighbor id 4 is out of range 1..=3",
            ),
            (
                "3 1\n2\n1\n",
                ":3:",
                "the file ends after 2 vertex lines; the header (line 1) declares 3 vertices",
            ),
            (
                "3 1\n2\n1\n\n3\n",
                ":5:",
                "more vertex lines than the 3 vertices",
            ),
            (
                "3 2\n2\n1\n\n",
                ":1:",
                "2m = 4 adjacency entries are expected; the vertex lines hold 2",
            ),
            (
                "3 1\n2 3\n1\n1\n",
                ":1:",
                "2m = 2 adjacency entries are expected; the vertex lines hold 4",
            ),
            (
                "3 1\n2\n1 x\n\n",
                ":3:",
                "neighbor `x` is not a non-negative integer",
            ),
            ("3 1\n2\n-1\n\n", ":3:", "neighbor `-1`"),
            ("3 x\n", ":1:", "edge count m `x`"),
            ("3\n", ":1:", "found 1 tokens"),
            ("3 1 2\n", ":1:", "fmt `2` must be up to three 0/1 digits"),
            (
                "3 1 0 2\n",
                ":1:",
                "ncon is 2 but fmt declares no vertex weights",
            ),
            (
                "3 1 1\n2 1\n1\n\n",
                ":3:",
                "the last neighbor has no weight",
            ),
            ("3 1 1\n2 w\n1 1\n\n", ":2:", "edge weight `w`"),
            (
                "2 1 10 2\n1 2\n5\n",
                ":3:",
                "expected 2 leading size/weight value(s) (fmt), found 1",
            ),
            ("2 1 110\nq 1 2\n1 1 1\n", ":2:", "vertex size `q`"),
            ("% only a comment\n", "", "no header line"),
        ];
        for (text, line, want) in cases {
            let e = read_metis(&file(d.path(), text)).unwrap_err().to_string();
            assert!(
                e.contains("g.graph") && e.contains(line) && e.contains(want),
                "{text:?}: got `{e}`, want `{line}` and `{want}`"
            );
        }
    }

    #[test]
    fn import_builds_a_dataset() {
        let d = tempfile::tempdir().unwrap();
        let ds = import_metis(&file(d.path(), MANUAL), &GraphImportOptions::default()).unwrap();
        assert_eq!(ds.name, "g");
        assert_eq!(ds.num_vertices(), 7);
        assert_eq!(ds.graph.num_edges(), 22);
    }

    fn metis_example(name: &str) -> Option<PathBuf> {
        let p = Path::new("/usr/share/doc/libmetis-dev/examples/graphs").join(name);
        if p.exists() {
            return Some(p);
        }
        if std::env::var("TANDEM_REQUIRE_METIS").as_deref() == Ok("1") {
            panic!(
                "{} is missing and TANDEM_REQUIRE_METIS=1: `apt-get install -y libmetis-doc`",
                p.display()
            );
        }
        eprintln!(
            "skipping: {} not found (install it with `apt-get install -y libmetis-doc`; \
             set TANDEM_REQUIRE_METIS=1 to make this a failure)",
            p.display()
        );
        None
    }

    #[test]
    fn real_mdual_graph() {
        let Some(p) = metis_example("mdual.graph") else {
            return;
        };
        let t = std::time::Instant::now();
        let g = read_metis(&p).unwrap();
        eprintln!("mdual.graph read in {:?}", t.elapsed());
        assert_eq!(g.num_vertices(), 258_569);
        assert_eq!(g.num_edges(), 2 * 513_132);
        // Symmetric: u in row v iff v in row u.
        for v in (0..g.num_vertices() as u32).step_by(97) {
            for &u in g.neighbors(v) {
                assert!(g.neighbors(u).binary_search(&v).is_ok());
            }
        }
        let t = std::time::Instant::now();
        let ds = import_metis(&p, &GraphImportOptions::default()).unwrap();
        eprintln!(
            "mdual.graph imported (64 generated features, 8 classes) in {:?}",
            t.elapsed()
        );
        assert_eq!(ds.graph, g);
    }

    #[test]
    fn real_multi_constraint_test_mgraph() {
        // `766 1314 010 2`: two vertex weights per line.
        let Some(p) = metis_example("test.mgraph") else {
            return;
        };
        let g = read_metis(&p).unwrap();
        assert_eq!(g.num_vertices(), 766);
        assert_eq!(g.num_edges(), 2 * 1314);
    }

    #[test]
    fn metis_import_reports_reading_graph_and_attach() {
        let d = tempfile::tempdir().unwrap();
        // A ring of 800k vertices (~11 MB): over two report intervals of bytes.
        let n = 800_000u64;
        let mut text = format!("% a ring\n{n} {n}\n");
        for v in 1..=n {
            let (a, b) = (
                if v == 1 { n } else { v - 1 },
                if v == n { 1 } else { v + 1 },
            );
            text.push_str(&format!("{a} {b}\n"));
        }
        assert!(text.len() as u64 > 2 * BYTES_PER_REPORT);
        let p = file(d.path(), &text);
        let rec = crate::progress::testing::Recorder::default();
        let opts = GraphImportOptions::default();
        let ds = import_metis_with(&p, &opts, &rec).unwrap();
        assert_eq!(ds, import_metis(&p, &opts).unwrap());
        assert_eq!(ds.graph.num_edges(), 2 * n as usize);
        assert_eq!(
            rec.check(),
            vec![
                ("reading".to_string(), text.len() as u64),
                ("graph".to_string(), 1),
                ("attach".to_string(), 1),
            ]
        );
        let reports = rec.0.lock().iter().filter(|r| r.0 == "reading").count();
        assert!(reports >= 4, "0, two intervals and the end: {reports}");
    }
}
