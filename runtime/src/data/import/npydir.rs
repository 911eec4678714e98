//! Importer for a directory of `.npy` files in the layout [`crate::data::export`] writes:
//! `edge_index.npy`, `features.npy`, `labels.npy`, `{train,val,test}_mask.npy` and
//! an optional `meta.json`. Export followed by import is an exact round trip,
//! CSR included.
//!
//! 1. `features.npy` (`<f4` or `<f8`, `(n, d)`) fixes the vertex count `n`.
//! 2. `labels.npy` (any integer type, `(n,)`) and the three masks (`|b1` or 0/1
//!    integers, `(n,)`) must have `n` entries each.
//! 3. `edge_index.npy` (any integer type, `(2, E)`): column `j` is the message
//!    `edge_index[0, j] → edge_index[1, j]`, stored as `edge_index[0, j]` in row
//!    `edge_index[1, j]`. Edges are kept exactly as given: no symmetrizing, no
//!    deduplication (a PyG `edge_index` of an undirected graph already has both
//!    directions). When row 1 is sorted, as an export writes it, the CSR is built in
//!    column order, so neighbor order is preserved; otherwise columns are grouped by
//!    destination and each row is sorted.
//! 4. `meta.json`, when present, gives the name and `num_classes` and must agree
//!    with the arrays on `num_vertices`, `num_edges` and `feature_dim`. Without it the
//!    name is the directory's and `num_classes` is the largest label + 1.
//! 5. An edge split, when `meta.json` names one (`"edge_split": "symmetric"` or
//!    `"directed"`): `edge_split/{train,val,test}_{src,dst}.npy` (integer ids,
//!    `(E,)`, `src` and `dst` of a part equally long) and, where present,
//!    `edge_split/{val,test}_neg.npy` (`(E, k)`, one row per positive). A directory
//!    `edge_split/` without that key in `meta.json` is refused, since whether the
//!    graph is symmetric cannot be told from the arrays alone.
//! 6. The result passes [`Dataset::validate`] (for an edge split: no validation or
//!    test edge in the graph, every training edge in it).

use std::path::Path;

use cpu_ops::{BuildOptions, CsrGraph, HostArray};

use crate::data::dataset::{Dataset, EdgeList, EdgeSplit};
use crate::data::export::{edge_split_kind, EDGE_SPLIT_DIR};
use crate::data::npy;
use crate::error::{Error, Result};
use crate::progress::{Meter, NoProgress, Progress};

/// What `meta.json` says; every field is optional in the file.
#[derive(Debug, Default, PartialEq)]
struct Meta {
    name: Option<String>,
    num_vertices: Option<u64>,
    num_edges: Option<u64>,
    num_classes: Option<u64>,
    feature_dim: Option<u64>,
    edge_split: Option<String>,
}

/// Reads `dir` (layout in the module doc) back into a dataset.
pub fn import_npy_dir(dir: &Path) -> Result<Dataset> {
    import_npy_dir_with(dir, &NoProgress)
}

/// The arrays of the directory, in the order [`import_npy_dir_with`] reads them.
const ARRAY_FILES: [&str; 6] = [
    "features.npy",
    "labels.npy",
    "train_mask.npy",
    "val_mask.npy",
    "test_mask.npy",
    "edge_index.npy",
];

/// [`import_npy_dir`], reporting to `progress` the phase `"reading"`: bytes of
/// the six arrays, advanced as each is read and checked (`edge_index.npy` last,
/// with the CSR build).
pub fn import_npy_dir_with(dir: &Path, progress: &dyn Progress) -> Result<Dataset> {
    if !dir.is_dir() {
        return Err(Error::io(
            dir,
            std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
        ));
    }
    let meta_path = dir.join("meta.json");
    let meta = if meta_path.exists() {
        let text = std::fs::read(&meta_path).map_err(|e| Error::io(&meta_path, e))?;
        parse_meta(&text).map_err(|what| Error::format(&meta_path, what))?
    } else {
        Meta::default()
    };

    // A missing array is reported by its reader below, by name.
    let size = |name: &str| std::fs::metadata(dir.join(name)).map_or(0, |m| m.len());
    let reading = Meter::new(
        progress,
        "reading",
        ARRAY_FILES.iter().map(|f| size(f)).sum(),
    );
    let features_path = dir.join("features.npy");
    let features = npy::read_f32_matrix(&features_path)?;
    reading.add(size("features.npy"));
    let n = features.num_rows();
    let per_vertex = |name: &str, len: usize| -> Result<()> {
        if len != n {
            return Err(Error::format(
                &dir.join(name),
                format!("{len} entries, expected one per vertex: features.npy has {n} rows"),
            ));
        }
        Ok(())
    };
    let labels = npy::read_labels(&dir.join("labels.npy"))?;
    per_vertex("labels.npy", labels.len())?;
    reading.add(size("labels.npy"));
    let mut masks = Vec::with_capacity(3);
    for name in ["train_mask.npy", "val_mask.npy", "test_mask.npy"] {
        let m = npy::read_mask(&dir.join(name))?;
        per_vertex(name, m.len())?;
        masks.push(m);
        reading.add(size(name));
    }
    let edge_path = dir.join("edge_index.npy");
    let graph = read_edge_index(&edge_path, n)?;
    reading.finish();

    let check = |key: &str, found: Option<u64>, actual: usize, source: &str| -> Result<()> {
        match found {
            Some(v) if v != actual as u64 => Err(Error::format(
                &meta_path,
                format!("`{key}` is {v}, but {source} has {actual}"),
            )),
            _ => Ok(()),
        }
    };
    check("num_vertices", meta.num_vertices, n, "features.npy")?;
    check(
        "num_edges",
        meta.num_edges,
        graph.num_edges(),
        "edge_index.npy",
    )?;
    check(
        "feature_dim",
        meta.feature_dim,
        features.dim(),
        "features.npy",
    )?;
    let num_classes = match meta.num_classes {
        Some(c) => u32::try_from(c).map_err(|_| {
            Error::format(&meta_path, format!("`num_classes` {c} does not fit u32"))
        })?,
        None => labels.iter().max().map_or(1, |&m| m + 1),
    };
    let name = meta.name.unwrap_or_else(|| {
        dir.file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "imported".into())
    });
    let masks: [Vec<u8>; 3] = masks
        .try_into()
        .unwrap_or_else(|_| unreachable!("three masks were pushed"));
    let split_dir = dir.join(EDGE_SPLIT_DIR);
    let symmetric = match meta.edge_split.as_deref() {
        None if split_dir.exists() => {
            return Err(Error::format(
                &meta_path,
                format!(
                    "`edge_split` is missing, but {} exists: say `\"edge_split\": \"symmetric\"` \
                     (the graph stores training edges both ways) or `\"directed\"`",
                    split_dir.display()
                ),
            ))
        }
        None => None,
        Some(kind) if kind == edge_split_kind(true) => Some(true),
        Some(kind) if kind == edge_split_kind(false) => Some(false),
        Some(kind) => {
            return Err(Error::format(
                &meta_path,
                format!("`edge_split` is \"{kind}\", expected \"symmetric\" or \"directed\""),
            ))
        }
    };
    let ds = Dataset::from_parts(name, graph, features, labels, num_classes, masks)?;
    match symmetric {
        None => Ok(ds),
        Some(symmetric) => {
            let split = read_edge_split(&split_dir, n, symmetric)?;
            ds.with_edge_split(split)
        }
    }
}

/// Reads the `edge_split/` files of `dir` (step 5 of the module doc) over `n`
/// vertices.
fn read_edge_split(dir: &Path, n: usize, symmetric: bool) -> Result<EdgeSplit> {
    let bound = format!("the vertex count {n} (features.npy rows)");
    let list = |part: &str| -> Result<EdgeList> {
        let read = |side: &str| {
            let path = dir.join(format!("{part}_{side}.npy"));
            npy::read_vertex_ids(&path, 1, "(E,)", n, &bound).map(|(ids, _)| (path, ids))
        };
        let (_, src) = read("src")?;
        let (dst_path, dst) = read("dst")?;
        if src.len() != dst.len() {
            return Err(Error::format(
                &dst_path,
                format!(
                    "{} ids, expected one per source in {part}_src.npy ({})",
                    dst.len(),
                    src.len()
                ),
            ));
        }
        Ok(EdgeList::new(src, dst))
    };
    let (train, val, test) = (list("train")?, list("val")?, list("test")?);
    let negatives = |part: &str, positives: usize| -> Result<Option<HostArray<u32>>> {
        let path = dir.join(format!("{part}_neg.npy"));
        if !path.exists() {
            return Ok(None);
        }
        let (ids, shape) = npy::read_vertex_ids(&path, 2, "(E, k)", n, &bound)?;
        if shape[0] != positives || shape[1] == 0 {
            return Err(Error::format(
                &path,
                format!(
                    "shape ({}, {}), expected ({positives}, k) with k ≥ 1: one row of negatives \
                     per positive in {part}_src.npy",
                    shape[0], shape[1]
                ),
            ));
        }
        Ok(Some(ids.into()))
    };
    Ok(EdgeSplit {
        val_neg: negatives("val", val.len())?,
        test_neg: negatives("test", test.len())?,
        train,
        val,
        test,
        symmetric,
    })
}

/// Reads a `(2, E)` edge index over `n` vertices into a CSR (step 3 of the module doc).
fn read_edge_index(path: &Path, n: usize) -> Result<CsrGraph> {
    let (vals, rows, e) = npy::read_index_matrix(path)?;
    if rows != 2 {
        return Err(Error::format(
            path,
            format!(
                "expected shape (2, E) (row 0 = source, row 1 = destination), found ({rows}, {e})"
            ),
        ));
    }
    let (src, dst) = vals.split_at(e);
    if let Some(j) = (0..e).find(|&j| src[j] >= n as u64 || dst[j] >= n as u64) {
        return Err(Error::format(
            path,
            format!(
                "column {j}: edge ({}, {}) has a vertex id not below the vertex count {n} \
                 (features.npy rows)",
                src[j], dst[j]
            ),
        ));
    }
    graph_from_edge_index(src, dst, n).map_err(|e| Error::cpu_ops(path.display().to_string(), e))
}

/// The CSR of a `(2, E)` edge index split into its rows `src` and `dst` (ids below
/// `n`, checked by the caller), edges kept exactly as given (step 3 of the module
/// doc). Shared with [`super::DatasetBuilder::edge_index`].
pub(super) fn graph_from_edge_index<T: Copy + Into<u64>>(
    src: &[T],
    dst: &[T],
    n: usize,
) -> std::result::Result<CsrGraph, cpu_ops::CpuOpsError> {
    let id = |v: T| v.into() as u32;
    if dst.windows(2).all(|w| w[0].into() <= w[1].into()) {
        let mut offsets = vec![0u64; n + 1];
        for &d in dst {
            offsets[d.into() as usize + 1] += 1;
        }
        for v in 0..n {
            offsets[v + 1] += offsets[v];
        }
        let indices: Vec<u32> = src.iter().map(|&s| id(s)).collect();
        CsrGraph::new(offsets.into(), indices.into())
    } else {
        let edges: Vec<(u32, u32)> = src.iter().zip(dst).map(|(&s, &d)| (id(s), id(d))).collect();
        let keep_all = BuildOptions {
            symmetrize: false,
            dedup: false,
            drop_self_loops: false,
        };
        CsrGraph::from_edges(n, &edges, keep_all)
    }
}

/// Parses the flat JSON object of `meta.json`. Unknown keys are ignored; known keys
/// must have the right type.
fn parse_meta(text: &[u8]) -> std::result::Result<Meta, String> {
    let mut p = Json { s: text, pos: 0 };
    let mut meta = Meta::default();
    p.expect(b'{')?;
    if p.peek() == Some(b'}') {
        p.pos += 1;
    } else {
        loop {
            let key = p.string()?;
            p.expect(b':')?;
            let value = p.value()?;
            let int = |v: &JsonValue| match v {
                JsonValue::Int(i) => Ok(*i),
                _ => Err(format!(
                    "`{key}` must be a non-negative integer, found {v:?}"
                )),
            };
            match key.as_str() {
                "name" => match value {
                    JsonValue::Str(s) => meta.name = Some(s),
                    v => return Err(format!("`name` must be a string, found {v:?}")),
                },
                "num_vertices" => meta.num_vertices = Some(int(&value)?),
                "num_edges" => meta.num_edges = Some(int(&value)?),
                "num_classes" => meta.num_classes = Some(int(&value)?),
                "feature_dim" => meta.feature_dim = Some(int(&value)?),
                "edge_split" => match value {
                    JsonValue::Str(s) => meta.edge_split = Some(s),
                    v => {
                        return Err(format!(
                            "`edge_split` must be \"symmetric\" or \"directed\", found {v:?}"
                        ))
                    }
                },
                _ => {}
            }
            match p.peek() {
                Some(b',') => p.pos += 1,
                Some(b'}') => {
                    p.pos += 1;
                    break;
                }
                _ => return Err(format!("expected ',' or '}}' at byte {}", p.pos)),
            }
        }
    }
    if p.peek().is_some() {
        return Err(format!(
            "unexpected text after the object at byte {}",
            p.pos
        ));
    }
    Ok(meta)
}

#[derive(Debug)]
enum JsonValue {
    Str(String),
    Int(u64),
    /// Any other scalar (negative or fractional number, true, false, null).
    Other,
}

/// A minimal JSON reader for flat objects of strings and numbers.
struct Json<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Json<'_> {
    fn peek(&mut self) -> Option<u8> {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
        self.s.get(self.pos).copied()
    }

    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(format!("expected '{}' at byte {}", c as char, self.pos))
        }
    }

    fn hex4(&mut self) -> std::result::Result<u32, String> {
        let h = self
            .s
            .get(self.pos..self.pos + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or_else(|| format!("bad \\u escape at byte {}", self.pos))?;
        self.pos += 4;
        Ok(h)
    }

    fn string(&mut self) -> std::result::Result<String, String> {
        self.expect(b'"')?;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let Some(&c) = self.s.get(self.pos) else {
                return Err("unterminated string".into());
            };
            self.pos += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let Some(&e) = self.s.get(self.pos) else {
                        return Err("unterminated escape".into());
                    };
                    self.pos += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&hi)
                                && self.s[self.pos..].starts_with(b"\\u")
                            {
                                self.pos += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(format!(
                                        "bad surrogate pair before byte {}",
                                        self.pos
                                    ));
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            char::from_u32(code)
                                .ok_or_else(|| format!("bad \\u escape before byte {}", self.pos))?
                        }
                        _ => return Err(format!("bad escape at byte {}", self.pos - 1)),
                    };
                    let mut b = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut b).as_bytes());
                }
                c => out.push(c),
            }
        }
        String::from_utf8(out).map_err(|_| "string is not valid UTF-8".into())
    }

    fn value(&mut self) -> std::result::Result<JsonValue, String> {
        match self.peek() {
            Some(b'"') => Ok(JsonValue::Str(self.string()?)),
            Some(_) => {
                let start = self.pos;
                while self.pos < self.s.len()
                    && !matches!(self.s[self.pos], b',' | b'}' | b']')
                    && !self.s[self.pos].is_ascii_whitespace()
                {
                    self.pos += 1;
                }
                let tok = String::from_utf8_lossy(&self.s[start..self.pos]).into_owned();
                if tok.is_empty() {
                    return Err(format!("expected a value at byte {start}"));
                }
                Ok(match tok.parse::<u64>() {
                    Ok(i) => JsonValue::Int(i),
                    Err(_) => JsonValue::Other,
                })
            }
            None => Err("expected a value, found the end of the file".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::export::export_npy;
    use crate::data::export::tests::odd_dataset;
    use crate::data::import::{import_edge_list, import_metis, GraphImportOptions};

    #[test]
    fn export_import_round_trip_is_exact() {
        let d = tempfile::tempdir().unwrap();
        let ds = odd_dataset();
        let out = d.path().join("odd");
        export_npy(&ds, &out).unwrap();
        let back = import_npy_dir(&out).unwrap();
        assert_eq!(
            back.graph.offsets().as_slice(),
            ds.graph.offsets().as_slice()
        );
        assert_eq!(
            back.graph.indices().as_slice(),
            ds.graph.indices().as_slice()
        );
        assert_eq!(back, ds);

        // Imported real-format graphs round-trip too (directed and undirected).
        let el = d.path().join("el.txt");
        std::fs::write(&el, "0 1\n1 2\n2 0\n3 1\n5 4\n").unwrap();
        for directed in [false, true] {
            let opts = GraphImportOptions {
                directed,
                ..Default::default()
            };
            let ds = import_edge_list(&el, &opts).unwrap();
            export_npy(&ds, &out).unwrap();
            assert_eq!(import_npy_dir(&out).unwrap(), ds);
        }
        let mg = d.path().join("m.graph");
        std::fs::write(&mg, "4 3\n2 3\n1\n1 4\n3\n").unwrap();
        let ds = import_metis(&mg, &GraphImportOptions::default()).unwrap();
        export_npy(&ds, &out).unwrap();
        assert_eq!(import_npy_dir(&out).unwrap(), ds);
    }

    #[test]
    fn npy_import_reports_the_bytes_of_its_arrays() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("odd");
        export_npy(&odd_dataset(), &out).unwrap();
        let rec = crate::progress::testing::Recorder::default();
        let ds = import_npy_dir_with(&out, &rec).unwrap();
        assert_eq!(ds, import_npy_dir(&out).unwrap());
        let bytes: u64 = ARRAY_FILES
            .iter()
            .map(|f| std::fs::metadata(out.join(f)).unwrap().len())
            .sum();
        assert_eq!(rec.check(), vec![("reading".to_string(), bytes)]);
        // One report per array after the first 0 (an array may add nothing new
        // only when it is empty).
        assert!(rec.0.lock().len() >= 2);
    }

    #[test]
    fn pyg_style_directory_without_meta() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("pyg");
        std::fs::create_dir(&dir).unwrap();
        // Unsorted destinations, int32 ids, integer masks, f8 features.
        npy::write_i64(
            &dir.join("edge_index.npy"),
            &[2, 4],
            [2i64, 0, 1, 0, 0, 2, 0, 1],
        )
        .unwrap();
        npy::write_f32_matrix(&dir.join("features.npy"), &[1.0; 6], 3, 2).unwrap();
        npy::write_i64(&dir.join("labels.npy"), &[3], [1i64, 0, 3]).unwrap();
        npy::write_i64(&dir.join("train_mask.npy"), &[3], [1i64, 0, 0]).unwrap();
        npy::write_bool(&dir.join("val_mask.npy"), &[0, 1, 0]).unwrap();
        npy::write_bool(&dir.join("test_mask.npy"), &[0, 0, 1]).unwrap();
        let ds = import_npy_dir(&dir).unwrap();
        assert_eq!(ds.name, "pyg");
        assert_eq!(ds.num_classes, 4);
        assert_eq!(ds.graph.neighbors(0), &[1, 2]);
        assert_eq!(ds.graph.neighbors(1), &[0]);
        assert_eq!(ds.graph.neighbors(2), &[0]);
        assert_eq!(ds.train_mask.as_slice(), &[1, 0, 0]);

        // Errors name the file.
        npy::write_i64(&dir.join("edge_index.npy"), &[2, 1], [0i64, 3]).unwrap();
        let e = import_npy_dir(&dir).unwrap_err().to_string();
        assert!(
            e.contains("edge_index.npy") && e.contains("column 0"),
            "{e}"
        );
        npy::write_i64(&dir.join("edge_index.npy"), &[1, 2], [0i64, 1]).unwrap();
        let e = import_npy_dir(&dir).unwrap_err().to_string();
        assert!(
            e.contains("edge_index.npy") && e.contains("expected shape (2, E)"),
            "{e}"
        );
        npy::write_i64(&dir.join("edge_index.npy"), &[2, 1], [0i64, 1]).unwrap();
        npy::write_bool(&dir.join("val_mask.npy"), &[0, 1]).unwrap();
        let e = import_npy_dir(&dir).unwrap_err().to_string();
        assert!(e.contains("val_mask.npy") && e.contains("2 entries"), "{e}");
        npy::write_bool(&dir.join("val_mask.npy"), &[0, 1, 0]).unwrap();
        std::fs::write(dir.join("meta.json"), r#"{"num_vertices": 4}"#).unwrap();
        let e = import_npy_dir(&dir).unwrap_err().to_string();
        assert!(
            e.contains("meta.json") && e.contains("`num_vertices` is 4"),
            "{e}"
        );
        std::fs::write(dir.join("meta.json"), r#"{"num_vertices": 3, "name": 5}"#).unwrap();
        assert!(import_npy_dir(&dir)
            .unwrap_err()
            .to_string()
            .contains("`name` must be a string"));
        std::fs::remove_file(dir.join("meta.json")).unwrap();
        std::fs::remove_file(dir.join("labels.npy")).unwrap();
        assert!(import_npy_dir(&dir)
            .unwrap_err()
            .to_string()
            .contains("labels.npy"));
        assert!(import_npy_dir(&d.path().join("missing")).is_err());
    }

    #[test]
    fn meta_parser() {
        let m = parse_meta(
            br#" { "name" : "a\"b\\c\/\u00e9\ud83d\ude00\n", "num_vertices": 3, "x": [1], "num_edges":0,
                  "num_classes": 2, "feature_dim": 8, "flag": true } "#,
        );
        // Arrays are not supported values.
        assert!(m.is_err());
        let m = parse_meta(
            br#" { "name" : "a\"b\\c\/\u00e9\ud83d\ude00\n", "num_vertices": 3, "num_edges":0,
                  "num_classes": 2, "feature_dim": 8, "flag": true } "#,
        )
        .unwrap();
        assert_eq!(m.name.as_deref(), Some("a\"b\\c/é\u{1F600}\n"));
        assert_eq!(
            (m.num_vertices, m.num_edges, m.num_classes, m.feature_dim),
            (Some(3), Some(0), Some(2), Some(8))
        );
        assert_eq!(parse_meta(b"{}").unwrap(), Meta::default());
        for bad in [
            &b""[..],
            b"{",
            b"{\"a\" 1}",
            b"{\"num_edges\": -1}",
            b"{\"a\": \"x}",
            b"{} x",
        ] {
            assert!(parse_meta(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
