//! Importer for an OGB node-property dataset as the `ogb` package leaves it after
//! download (`ogbn-arxiv`, `ogbn-products`, ...): a directory holding
//!
//! ```text
//! raw/num-node-list.csv.gz     one line: the vertex count n
//! raw/edge.csv.gz              one edge a line: `src,dst` (ids below n)
//! raw/node-feat.csv.gz         one line a vertex: d comma-separated numbers
//! raw/node-label.csv.gz        one line a vertex: a class id (`nan`: unlabeled)
//! split/<scheme>/train.csv.gz  one vertex id a line (valid.csv.gz, test.csv.gz too)
//! ```
//!
//! Each file may also be an uncompressed `.csv` of the same name; a `.gz` is read
//! through a streaming decoder (a gzip file is recognized by its magic bytes, so
//! the name alone does not decide).
//!
//! Steps of [`import_ogb_dir_with`]:
//! 1. `num-node-list` fixes `n` (`raw/num-edge-list.csv.gz`, when present, sizes
//!    the edge buffer; nothing else is read from it).
//! 2. `edge.csv`, streamed into one `(src, dst)` buffer; then the CSR: undirected
//!    by default — every edge in both directions, repeated edges and self-loops
//!    dropped, as OGB's loaders and the DGL/PyG examples make these graphs —, or
//!    with [`OgbOptions::directed`] kept as given (`src → dst`, stored in row
//!    `dst`). The edge buffer is dropped before the features are read.
//! 3. `node-feat.csv`, streamed into one `n × d` matrix (`d` from the first line).
//! 4. `node-label.csv`: one class id a vertex (`5` or `5.0`); `nan` marks an
//!    unlabeled vertex (ogbn-papers100M), stored as class 0 and allowed in no
//!    split. `num_classes` is the largest label + 1.
//! 5. The split of `split/<scheme>/` ([`OgbOptions::split`], or the one scheme
//!    present): masks from the three id lists; a vertex listed in two parts is an
//!    error naming both files.
//! 6. [`Dataset::from_parts`] checks the rest (finite features among them).
//!
//! Memory: the store's arrays plus the edge buffer (8 bytes an edge, dropped
//! before the features are read) and one line; nothing is held twice.
//!
//! Every malformed line is an [`Error::Parse`] naming the file and the 1-based
//! line; a missing file is an [`Error::Io`] naming it.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use cpu_ops::{BuildOptions, CsrGraph, FeatureMatrix};

use super::text::show;
use crate::data::dataset::Dataset;
use crate::error::{Error, Result};
use crate::progress::{Meter, NoProgress, Progress};

/// How to read an OGB directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OgbOptions {
    /// Keep edges as given (`src → dst`) instead of storing both directions.
    pub directed: bool,
    /// The split scheme (the folder under `split/`: `time`, `sales_ranking`,
    /// `species`, ...); `None`: the only one there.
    pub split: Option<String>,
}

/// Reads the OGB node-property dataset in `dir` (layout and steps in the module
/// doc), undirected, with its only split scheme.
pub fn import_ogb_dir(dir: &Path) -> Result<Dataset> {
    import_ogb_dir_with(dir, &OgbOptions::default(), &NoProgress)
}

/// [`import_ogb_dir`] with options, reporting to `progress` the phases
/// `"edges"` (edges read, when `num-edge-list` gives their number, else
/// reported once at the end), `"features"` and `"labels"` (vertices).
pub fn import_ogb_dir_with(
    dir: &Path,
    opts: &OgbOptions,
    progress: &dyn Progress,
) -> Result<Dataset> {
    if !dir.is_dir() {
        return Err(Error::io(
            dir,
            std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
        ));
    }
    let raw = dir.join("raw");
    let n = read_count(&find(&raw, "num-node-list")?)?;
    if n == 0 || n > u32::MAX as u64 {
        return Err(Error::parse(
            &find(&raw, "num-node-list")?,
            1,
            format!("{n} vertices: expected between 1 and 2^32 - 1"),
        ));
    }
    let n = n as usize;
    let edge_hint = match find(&raw, "num-edge-list") {
        Ok(p) => Some(read_count(&p)?),
        Err(_) => None,
    };
    let scheme = split_dir(dir, opts.split.as_deref())?;

    let graph = read_graph(&find(&raw, "edge")?, n, edge_hint, opts.directed, progress)?;
    let features = read_features(&find(&raw, "node-feat")?, n, progress)?;
    let (labels, unlabeled) = read_labels(&find(&raw, "node-label")?, n, progress)?;
    let num_classes = labels.iter().max().map_or(1, |&m| m + 1);
    let masks = read_split(&scheme, n, &unlabeled)?;
    let name = dir
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "ogb".into());
    Dataset::from_parts(name, graph, features, labels, num_classes, masks)
}

/// `dir/<stem>.csv.gz`, or `dir/<stem>.csv` when only that exists; the error
/// names the `.csv.gz` the layout expects.
fn find(dir: &Path, stem: &str) -> Result<PathBuf> {
    let gz = dir.join(format!("{stem}.csv.gz"));
    if gz.is_file() {
        return Ok(gz);
    }
    let plain = dir.join(format!("{stem}.csv"));
    if plain.is_file() {
        return Ok(plain);
    }
    Err(Error::io(
        &gz,
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "not found (an OGB node-property directory has raw/num-node-list, edge, \
             node-feat and node-label .csv.gz files and split/<scheme>/)",
        ),
    ))
}

/// The scheme folder under `dir/split`: `name`, or the only folder there.
fn split_dir(dir: &Path, name: Option<&str>) -> Result<PathBuf> {
    let split = dir.join("split");
    if let Some(name) = name {
        let p = split.join(name);
        if !p.is_dir() {
            return Err(Error::io(
                &p,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such split scheme"),
            ));
        }
        return Ok(p);
    }
    let entries = std::fs::read_dir(&split).map_err(|e| Error::io(&split, e))?;
    let mut schemes: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    schemes.sort();
    match schemes.len() {
        1 => Ok(schemes.remove(0)),
        0 => Err(Error::format(
            &split,
            "no split scheme folder (expected split/<scheme>/train.csv.gz, ...)",
        )),
        _ => {
            let names: Vec<String> = schemes
                .iter()
                .filter_map(|p| p.file_name().map(|s| s.to_string_lossy().into_owned()))
                .collect();
            Err(Error::format(
                &split,
                format!(
                    "{} split schemes ({}); choose one (`--split NAME`, OgbOptions::split)",
                    names.len(),
                    names.join(", ")
                ),
            ))
        }
    }
}

/// Lines of a `.csv` or `.csv.gz` file, read into one reused buffer.
struct CsvLines {
    path: PathBuf,
    reader: Box<dyn BufRead>,
    buf: Vec<u8>,
    line_no: u64,
}

impl CsvLines {
    /// Opens `path`, decompressing when it starts with gzip's magic bytes.
    fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let mut plain = BufReader::with_capacity(1 << 16, file);
        let gz = plain
            .fill_buf()
            .map_err(|e| Error::io(path, e))?
            .starts_with(&[0x1f, 0x8b]);
        let reader: Box<dyn BufRead> = if gz {
            let decoder: Box<dyn Read> = Box::new(flate2::bufread::MultiGzDecoder::new(plain));
            Box::new(BufReader::with_capacity(1 << 20, decoder))
        } else {
            Box::new(plain)
        };
        Ok(Self {
            path: path.to_path_buf(),
            reader,
            buf: Vec::with_capacity(4096),
            line_no: 0,
        })
    }

    /// The next line without its line end, with its 1-based number; `None` at
    /// the end. A decompression failure names the file and the line it reached.
    fn next_line(&mut self) -> Result<Option<(u64, &[u8])>> {
        self.buf.clear();
        let got = self.reader.read_until(b'\n', &mut self.buf).map_err(|e| {
            Error::parse(
                &self.path,
                self.line_no + 1,
                format!("cannot read the file here: {e}"),
            )
        })?;
        if got == 0 {
            return Ok(None);
        }
        self.line_no += 1;
        while matches!(self.buf.last(), Some(b'\n' | b'\r')) {
            self.buf.pop();
        }
        Ok(Some((self.line_no, &self.buf)))
    }

    /// The next line that is not blank.
    fn next_record(&mut self) -> Result<Option<(u64, &[u8])>> {
        loop {
            let no = match self.next_line()? {
                Some((no, _)) => no,
                None => return Ok(None),
            };
            if self.buf.iter().any(|b| !b.is_ascii_whitespace()) {
                return Ok(Some((no, &self.buf)));
            }
        }
    }
}

/// Fields of a CSV line, trimmed of blanks.
fn fields(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|&b| b == b',').map(<[u8]>::trim_ascii)
}

/// A non-negative integer field (`12`, or `12.0` as pandas writes integers it
/// read as floats).
fn parse_id(tok: &[u8]) -> Option<u64> {
    let int = tok.strip_suffix(b".0").unwrap_or(tok);
    super::text::parse_u64(int)
}

/// The number on the first line of a one-number file (`num-node-list`).
fn read_count(path: &Path) -> Result<u64> {
    let mut lines = CsvLines::open(path)?;
    let Some((no, line)) = lines.next_record()? else {
        return Err(Error::parse(
            path,
            1,
            "empty file; expected one line with a count",
        ));
    };
    // A heterogeneous dataset lists one count per node type on this line.
    let toks: Vec<&[u8]> = fields(line).collect();
    match toks.as_slice() {
        [one] => parse_id(one).ok_or_else(|| {
            Error::parse(
                path,
                no,
                format!("`{}` is not a non-negative integer", show(one)),
            )
        }),
        _ => Err(Error::parse(
            path,
            no,
            format!(
                "{} fields; expected one count (heterogeneous OGB datasets are not supported)",
                toks.len()
            ),
        )),
    }
}

/// Step 2 of the module doc.
fn read_graph(
    path: &Path,
    n: usize,
    hint: Option<u64>,
    directed: bool,
    progress: &dyn Progress,
) -> Result<CsrGraph> {
    let mut lines = CsvLines::open(path)?;
    let cap = hint.unwrap_or(0).min(1 << 34) as usize;
    let meter = Meter::new(progress, "edges", hint.unwrap_or(0));
    let mut edges: Vec<(u32, u32)> = Vec::with_capacity(cap);
    while let Some((no, line)) = lines.next_record()? {
        let mut it = fields(line);
        let (Some(s), Some(d), None) = (it.next(), it.next(), it.next()) else {
            let k = fields(line).count();
            return Err(Error::parse(
                path,
                no,
                format!("{k} fields; expected `src,dst`"),
            ));
        };
        let id = |tok: &[u8], what: &str| -> Result<u32> {
            match parse_id(tok) {
                Some(v) if v < n as u64 => Ok(v as u32),
                Some(v) => Err(Error::parse(
                    path,
                    no,
                    format!("{what} vertex id {v} is not below the vertex count {n}"),
                )),
                None => Err(Error::parse(
                    path,
                    no,
                    format!(
                        "{what} vertex id `{}` is not a non-negative integer",
                        show(tok)
                    ),
                )),
            }
        };
        edges.push((id(s, "source")?, id(d, "target")?));
        if hint.is_some() && edges.len().is_multiple_of(1 << 16) {
            meter.set((edges.len() as u64).min(hint.unwrap_or(0)));
        }
    }
    meter.finish();
    let build = if directed {
        BuildOptions::DIRECTED
    } else {
        BuildOptions::UNDIRECTED
    };
    CsrGraph::from_edges(n, &edges, build)
        .map_err(|e| Error::cpu_ops(path.display().to_string(), e))
}

/// Step 3 of the module doc.
fn read_features(path: &Path, n: usize, progress: &dyn Progress) -> Result<FeatureMatrix> {
    let mut lines = CsvLines::open(path)?;
    let meter = Meter::new(progress, "features", n as u64);
    let mut data: Vec<f32> = Vec::new();
    let mut dim = 0usize;
    let mut rows = 0usize;
    while let Some((no, line)) = lines.next_record()? {
        if rows == n {
            return Err(Error::parse(
                path,
                no,
                format!("more feature rows than the {n} vertices of num-node-list"),
            ));
        }
        let before = data.len();
        for tok in fields(line) {
            let v = std::str::from_utf8(tok)
                .ok()
                .and_then(|s| s.parse::<f32>().ok())
                .ok_or_else(|| {
                    Error::parse(
                        path,
                        no,
                        format!(
                            "column {}: `{}` is not a number",
                            data.len() - before + 1,
                            show(tok)
                        ),
                    )
                })?;
            if !v.is_finite() {
                return Err(Error::parse(
                    path,
                    no,
                    format!(
                        "column {}: {v} is not a finite number",
                        data.len() - before + 1
                    ),
                ));
            }
            data.push(v);
        }
        let got = data.len() - before;
        if rows == 0 {
            dim = got;
            data.reserve_exact(n.saturating_mul(dim).saturating_sub(data.len()));
        } else if got != dim {
            return Err(Error::parse(
                path,
                no,
                format!("{got} columns; expected {dim} as on line 1"),
            ));
        }
        rows += 1;
        if rows.is_multiple_of(1 << 14) {
            meter.set(rows as u64);
        }
    }
    if rows != n {
        return Err(Error::parse(
            path,
            lines.line_no,
            format!("{rows} feature rows; expected {n} (num-node-list)"),
        ));
    }
    meter.finish();
    FeatureMatrix::new(data.into(), n, dim)
        .map_err(|e| Error::cpu_ops(path.display().to_string(), e))
}

/// Step 4 of the module doc: the labels and which vertices are unlabeled.
fn read_labels(path: &Path, n: usize, progress: &dyn Progress) -> Result<(Vec<u32>, Vec<bool>)> {
    let mut lines = CsvLines::open(path)?;
    let meter = Meter::new(progress, "labels", n as u64);
    let mut labels = Vec::with_capacity(n);
    let mut unlabeled = vec![false; n];
    while let Some((no, line)) = lines.next_record()? {
        if labels.len() == n {
            return Err(Error::parse(
                path,
                no,
                format!("more labels than the {n} vertices of num-node-list"),
            ));
        }
        let toks: Vec<&[u8]> = fields(line).collect();
        let [tok] = toks.as_slice() else {
            return Err(Error::parse(
                path,
                no,
                format!(
                    "{} columns; expected one class id (multi-label datasets such as \
                     ogbn-proteins are not supported)",
                    toks.len()
                ),
            ));
        };
        if tok.eq_ignore_ascii_case(b"nan") {
            unlabeled[labels.len()] = true;
            labels.push(0);
            continue;
        }
        match parse_id(tok) {
            Some(c) if c < u32::MAX as u64 => labels.push(c as u32),
            _ => {
                return Err(Error::parse(
                    path,
                    no,
                    format!(
                        "`{}` is not a class id (a non-negative integer, or nan)",
                        show(tok)
                    ),
                ))
            }
        }
    }
    if labels.len() != n {
        return Err(Error::parse(
            path,
            lines.line_no,
            format!("{} labels; expected {n} (num-node-list)", labels.len()),
        ));
    }
    meter.finish();
    Ok((labels, unlabeled))
}

/// Step 5 of the module doc: train, val, test masks from `scheme`'s id lists.
fn read_split(scheme: &Path, n: usize, unlabeled: &[bool]) -> Result<[Vec<u8>; 3]> {
    // Which part (1, 2, 3) holds each vertex, and from which line.
    let mut part = vec![0u8; n];
    let mut masks = [vec![0u8; n], vec![0u8; n], vec![0u8; n]];
    let files = ["train", "valid", "test"];
    for (k, stem) in files.iter().enumerate() {
        let path = find(scheme, stem)?;
        let mut lines = CsvLines::open(&path)?;
        let path = path.as_path();
        while let Some((no, line)) = lines.next_record()? {
            let tok = line.trim_ascii();
            let v = match parse_id(tok) {
                Some(v) if v < n as u64 => v as usize,
                Some(v) => {
                    return Err(Error::parse(
                        path,
                        no,
                        format!("vertex id {v} is not below the vertex count {n}"),
                    ))
                }
                None => {
                    return Err(Error::parse(
                        path,
                        no,
                        format!("`{}` is not a vertex id", show(tok)),
                    ))
                }
            };
            if unlabeled[v] {
                return Err(Error::parse(
                    path,
                    no,
                    format!("vertex {v} has no label (nan in node-label)"),
                ));
            }
            match part[v] {
                0 => {
                    part[v] = k as u8 + 1;
                    masks[k][v] = 1;
                }
                p if p == k as u8 + 1 => {}
                p => {
                    return Err(Error::parse(
                        path,
                        no,
                        format!(
                            "vertex {v} is also in {}.csv.gz; the parts must be disjoint",
                            files[p as usize - 1]
                        ),
                    ))
                }
            }
        }
    }
    Ok(masks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Writes `text` to `path`, gzip-compressed when the name ends in `.gz`.
    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let f = File::create(path).unwrap();
        if path.extension().is_some_and(|e| e == "gz") {
            let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
            gz.write_all(text.as_bytes()).unwrap();
            gz.finish().unwrap();
        } else {
            let mut f = f;
            f.write_all(text.as_bytes()).unwrap();
        }
    }

    /// A 6-vertex OGB directory: a path 0-1-2-3-4-5 listed once per edge, two
    /// features a vertex, labels 0/1, one split scheme.
    fn small(dir: &Path) {
        write(&dir.join("raw/num-node-list.csv.gz"), "6\n");
        write(&dir.join("raw/num-edge-list.csv.gz"), "5\n");
        write(&dir.join("raw/edge.csv.gz"), "0,1\n1,2\n2,3\n3,4\n4,5\n");
        let feat: String = (0..6).map(|v| format!("{v}.5,-{v}\n")).collect();
        write(&dir.join("raw/node-feat.csv.gz"), &feat);
        write(&dir.join("raw/node-label.csv.gz"), "0\n0\n0\n1\n1\n1\n");
        write(&dir.join("split/time/train.csv.gz"), "0\n5\n");
        write(&dir.join("split/time/valid.csv.gz"), "1\n4\n");
        write(&dir.join("split/time/test.csv.gz"), "2\n3\n");
    }

    #[test]
    fn reads_an_ogb_directory() {
        let d = tempfile::tempdir().unwrap();
        small(d.path());
        let seen = parking_lot::Mutex::new(Vec::new());
        let sink = |phase: &str, done: u64, total: u64| {
            seen.lock().push((phase.to_string(), done, total));
        };
        let ds = import_ogb_dir_with(d.path(), &OgbOptions::default(), &sink).unwrap();
        assert_eq!((ds.num_vertices(), ds.graph.num_edges()), (6, 10));
        assert_eq!(ds.graph.neighbors(1), &[0, 2]);
        assert_eq!(ds.features.row(3), &[3.5, -3.0]);
        assert_eq!(ds.num_classes, 2);
        assert_eq!(
            (ds.train_ids(), ds.val_ids(), ds.test_ids()),
            (vec![0, 5], vec![1, 4], vec![2, 3])
        );
        let seen = seen.into_inner();
        assert!(seen.contains(&("edges".into(), 5, 5)), "{seen:?}");
        assert!(seen.contains(&("labels".into(), 6, 6)), "{seen:?}");

        // Directed: each edge once, src -> dst stored in row dst.
        let opts = OgbOptions {
            directed: true,
            split: Some("time".into()),
        };
        let ds = import_ogb_dir_with(d.path(), &opts, &NoProgress).unwrap();
        assert_eq!(ds.graph.num_edges(), 5);
        assert_eq!(ds.graph.neighbors(1), &[0]);
    }

    #[test]
    fn plain_csv_files_and_unlabeled_vertices_are_read() {
        let d = tempfile::tempdir().unwrap();
        small(d.path());
        std::fs::remove_file(d.path().join("raw/node-label.csv.gz")).unwrap();
        write(
            &d.path().join("raw/node-label.csv"),
            "0.0\n0\n1\n1\nnan\n1\n",
        );
        std::fs::remove_file(d.path().join("raw/num-edge-list.csv.gz")).unwrap();
        write(&d.path().join("split/time/valid.csv.gz"), "1\n");
        let ds = import_ogb_dir(d.path()).unwrap();
        assert_eq!(&ds.labels[..], &[0, 0, 1, 1, 0, 1]);
        assert_eq!(ds.val_ids(), vec![1]);
    }

    /// Every malformed file is one line naming the file and the line.
    #[test]
    fn malformed_files_name_file_and_line() {
        let cases: [(&str, &str, &str); 9] = [
            (
                "raw/edge.csv.gz",
                "0,1\n1,x\n",
                "edge.csv.gz:2: target vertex id `x` is not a non-negative integer",
            ),
            (
                "raw/edge.csv.gz",
                "0,1\n1,9\n",
                "edge.csv.gz:2: target vertex id 9 is not below the vertex count 6",
            ),
            (
                "raw/edge.csv.gz",
                "0,1,2\n",
                "edge.csv.gz:1: 3 fields; expected `src,dst`",
            ),
            (
                "raw/node-feat.csv.gz",
                "1,2\n1\n",
                "node-feat.csv.gz:2: 1 columns; expected 2 as on line 1",
            ),
            (
                "raw/node-feat.csv.gz",
                "1,2\n1,nan\n",
                "node-feat.csv.gz:2: column 2: NaN is not a finite number",
            ),
            (
                "raw/node-feat.csv.gz",
                "1,2\n",
                "node-feat.csv.gz:1: 1 feature rows; expected 6 (num-node-list)",
            ),
            (
                "raw/node-label.csv.gz",
                "0\n1,1\n",
                "node-label.csv.gz:2: 2 columns; expected one class id",
            ),
            (
                "split/time/test.csv.gz",
                "2\n0\n",
                "test.csv.gz:2: vertex 0 is also in train.csv.gz",
            ),
            (
                "split/time/test.csv.gz",
                "-1\n",
                "test.csv.gz:1: `-1` is not a vertex id",
            ),
        ];
        for (file, text, want) in cases {
            let d = tempfile::tempdir().unwrap();
            small(d.path());
            write(&d.path().join(file), text);
            let e = import_ogb_dir(d.path()).unwrap_err().to_string();
            assert!(e.contains(want), "{file}: {e}\nwanted {want}");
            assert!(!e.contains('\n'), "{e}");
        }
        // A missing file and a truncated gzip stream.
        let d = tempfile::tempdir().unwrap();
        small(d.path());
        std::fs::remove_file(d.path().join("raw/node-feat.csv.gz")).unwrap();
        let e = import_ogb_dir(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("raw/node-feat.csv.gz") && e.contains("not found"),
            "{e}"
        );
        let d = tempfile::tempdir().unwrap();
        small(d.path());
        let p = d.path().join("raw/edge.csv.gz");
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 6]).unwrap();
        let e = import_ogb_dir(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("edge.csv.gz:") && e.contains("cannot read"),
            "{e}"
        );
        // Two split schemes and none chosen.
        let d = tempfile::tempdir().unwrap();
        small(d.path());
        write(&d.path().join("split/random/train.csv.gz"), "0\n");
        let e = import_ogb_dir(d.path()).unwrap_err().to_string();
        assert!(e.contains("2 split schemes (random, time)"), "{e}");
    }
}
