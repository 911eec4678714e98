//! Export a [`Dataset`] as a directory of `.npy` files for Python tools (DGL, PyG),
//! read back by [`crate::data::import::import_npy_dir`].
//!
//! | file | dtype, shape | content |
//! |---|---|---|
//! | `edge_index.npy` | `int64 (2, E)` | row 0 = source, row 1 = destination; one column per stored CSR entry, in CSR order (grouped by destination) |
//! | `features.npy` | `float32 (n, d)` | one row per vertex |
//! | `labels.npy` | `int64 (n,)` | class ids below `num_classes` |
//! | `train_mask.npy`, `val_mask.npy`, `test_mask.npy` | `bool (n,)` | the split |
//! | `meta.json` | | `format`, `name`, `num_vertices`, `num_edges`, `num_classes`, `feature_dim`; with an edge split also `edge_split` (`"symmetric"` or `"directed"`) |
//! | `edge_split/{train,val,test}_{src,dst}.npy` | `int64 (E,)` | with an edge split: the positive edges of each part, `src[i] → dst[i]` |
//! | `edge_split/{val,test}_neg.npy` | `int64 (E, k)` | where the split has fixed negatives: row `i` holds the `k` negative destinations of positive `i` (its source kept) |
//!
//! `E` counts stored entries: an undirected edge appears twice, once per direction,
//! which is what both DGL and PyG expect for an undirected graph. A column
//! `(s, d)` is the CSR entry "`s` in row `d`": a message `s → d`.
//!
//! The directory is written atomically: into a temporary sibling that replaces
//! `dir` only when every file is complete.
//!
//! Loading it in Python:
//!
//! ```python
//! import json, numpy as np, torch
//!
//! d = "cora_npy"
//! meta = json.load(open(f"{d}/meta.json"))
//! ei = torch.from_numpy(np.load(f"{d}/edge_index.npy"))    # (2, E) int64
//! x = torch.from_numpy(np.load(f"{d}/features.npy"))       # (n, d) float32
//! y = torch.from_numpy(np.load(f"{d}/labels.npy"))         # (n,) int64
//! masks = {k: torch.from_numpy(np.load(f"{d}/{k}_mask.npy")) for k in ("train", "val", "test")}
//!
//! # DGL: messages flow src -> dst, as in Tandem.
//! import dgl
//! g = dgl.graph((ei[0], ei[1]), num_nodes=meta["num_vertices"])
//! g.ndata["feat"], g.ndata["label"] = x, y
//! for k, m in masks.items():
//!     g.ndata[f"{k}_mask"] = m
//!
//! # PyG: edge_index is (2, E) with row 0 = source, row 1 = target.
//! from torch_geometric.data import Data
//! data = Data(x=x, edge_index=ei, y=y, num_nodes=meta["num_vertices"],
//!             train_mask=masks["train"], val_mask=masks["val"], test_mask=masks["test"])
//!
//! # Link prediction: edge_index is the message-passing graph (training edges only);
//! # each part's positives as a (2, E) edge_label_index, as PyG's RandomLinkSplit.
//! if "edge_split" in meta:
//!     part = lambda p: torch.stack([torch.from_numpy(np.load(f"{d}/edge_split/{p}_{s}.npy"))
//!                                   for s in ("src", "dst")])
//!     train_pos, val_pos, test_pos = part("train"), part("val"), part("test")
//! ```

use std::io::Write;
use std::path::Path;

use crate::atomic::{write_dir_atomically, write_file_atomically};
use crate::data::dataset::{Dataset, EdgeSplit};
use crate::data::npy;
use crate::error::{Error, Result};

/// The value of `format` in `meta.json`.
pub const NPY_DIR_FORMAT: &str = "tandem-npy-1";

/// Writes `ds` to the directory `dir` (created or replaced atomically) as the `.npy`
/// files and `meta.json` listed in the module doc (`edge_split/` only when the
/// dataset has an edge split).
pub fn export_npy(ds: &Dataset, dir: &Path) -> Result<()> {
    ds.validate()?;
    let g = &ds.graph;
    let n = ds.num_vertices();
    let e = g.num_edges();
    write_dir_atomically(dir, |tmp| {
        let offsets = g.offsets().as_slice();
        let src = g.indices().iter().map(|&s| s as i64);
        let dst = offsets
            .windows(2)
            .enumerate()
            .flat_map(|(v, w)| std::iter::repeat_n(v as i64, (w[1] - w[0]) as usize));
        npy::write_i64(&tmp.join("edge_index.npy"), &[2, e], src.chain(dst))?;
        npy::write_f32_matrix(
            &tmp.join("features.npy"),
            ds.features.as_slice(),
            n,
            ds.features.dim(),
        )?;
        npy::write_i64(
            &tmp.join("labels.npy"),
            &[n],
            ds.labels.iter().map(|&l| l as i64),
        )?;
        npy::write_bool(&tmp.join("train_mask.npy"), &ds.train_mask)?;
        npy::write_bool(&tmp.join("val_mask.npy"), &ds.val_mask)?;
        npy::write_bool(&tmp.join("test_mask.npy"), &ds.test_mask)?;
        if let Some(split) = &ds.edges {
            write_edge_split(split, &tmp.join(EDGE_SPLIT_DIR))?;
        }
        let meta = serde_json::to_string_pretty(&Meta {
            format: NPY_DIR_FORMAT,
            name: &ds.name,
            num_vertices: n,
            num_edges: e,
            num_classes: ds.num_classes,
            feature_dim: ds.features.dim(),
            edge_split: ds.edges.as_ref().map(|e| edge_split_kind(e.symmetric)),
        })
        .map_err(|err| Error::invalid_argument("meta.json", err.to_string()))?
            + "\n";
        let meta_path = tmp.join("meta.json");
        write_file_atomically(&meta_path, |w| {
            w.write_all(meta.as_bytes())
                .map_err(|err| Error::io(&meta_path, err))
        })
    })
}

/// The subdirectory that holds the edge split.
pub(crate) const EDGE_SPLIT_DIR: &str = "edge_split";

/// `meta.json`'s `edge_split` value for a symmetric or directed split.
pub(crate) fn edge_split_kind(symmetric: bool) -> &'static str {
    if symmetric {
        "symmetric"
    } else {
        "directed"
    }
}

/// Writes the `edge_split/` files of the module doc into `dir` (created).
fn write_edge_split(split: &EdgeSplit, dir: &Path) -> Result<()> {
    std::fs::create_dir(dir).map_err(|e| Error::io(dir, e))?;
    fn ids(a: &[u32]) -> impl Iterator<Item = i64> + '_ {
        a.iter().map(|&v| v as i64)
    }
    for (part, list) in [
        ("train", &split.train),
        ("val", &split.val),
        ("test", &split.test),
    ] {
        for (side, a) in [("src", &list.src), ("dst", &list.dst)] {
            let path = dir.join(format!("{part}_{side}.npy"));
            npy::write_i64(&path, &[a.len()], ids(a))?;
        }
    }
    for (part, neg, positives) in [
        ("val", &split.val_neg, split.val.len()),
        ("test", &split.test_neg, split.test.len()),
    ] {
        if let Some(neg) = neg {
            let k = neg.len() / positives.max(1);
            npy::write_i64(
                &dir.join(format!("{part}_neg.npy")),
                &[positives, k],
                ids(neg),
            )?;
        }
    }
    Ok(())
}

/// `meta.json` (module doc).
#[derive(serde::Serialize)]
struct Meta<'a> {
    format: &'a str,
    name: &'a str,
    num_vertices: usize,
    num_edges: usize,
    num_classes: u32,
    feature_dim: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    edge_split: Option<&'static str>,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::data::npy::{
        read_f32_matrix, read_header, read_index_matrix, read_labels, read_mask, Dtype,
    };
    use cpu_ops::{CsrGraph, FeatureMatrix};

    /// A small dataset whose CSR rows are unsorted and hold a duplicate and a
    /// self-loop, so an exact round trip cannot come from re-sorting.
    pub(crate) fn odd_dataset() -> Dataset {
        let graph =
            CsrGraph::new(vec![0, 3, 3, 5, 6].into(), vec![2, 1, 2, 3, 0, 3].into()).unwrap();
        Dataset {
            name: "odd \"name\"\\\n\u{1}é \u{1F600}".into(),
            graph,
            features: FeatureMatrix::new(
                (0..12).map(|i| i as f32 / 3.0).collect::<Vec<_>>().into(),
                4,
                3,
            )
            .unwrap(),
            labels: vec![0, 4, 2, 0].into(),
            num_classes: 6,
            train_mask: vec![1, 0, 0, 0].into(),
            val_mask: vec![0, 1, 0, 0].into(),
            test_mask: vec![0, 0, 0, 1].into(),
            edges: None,
        }
    }

    #[test]
    fn writes_the_documented_files() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("out");
        let ds = odd_dataset();
        export_npy(&ds, &out).unwrap();
        let (ei, rows, cols) = read_index_matrix(&out.join("edge_index.npy")).unwrap();
        assert_eq!((rows, cols), (2, 6));
        assert_eq!(ei, vec![2, 1, 2, 3, 0, 3, 0, 0, 0, 2, 2, 3]);
        assert_eq!(
            read_header(&out.join("edge_index.npy")).unwrap().dtype,
            Dtype::I64
        );
        assert_eq!(
            read_header(&out.join("labels.npy")).unwrap().dtype,
            Dtype::I64
        );
        assert_eq!(
            read_header(&out.join("val_mask.npy")).unwrap().dtype,
            Dtype::Bool
        );
        assert_eq!(
            read_f32_matrix(&out.join("features.npy")).unwrap(),
            ds.features
        );
        assert_eq!(
            read_labels(&out.join("labels.npy")).unwrap(),
            vec![0, 4, 2, 0]
        );
        assert_eq!(
            read_mask(&out.join("test_mask.npy")).unwrap(),
            vec![0, 0, 0, 1]
        );
        let meta = std::fs::read_to_string(out.join("meta.json")).unwrap();
        assert!(
            meta.contains(r#""name": "odd \"name\"\\\n\u0001é 😀""#),
            "{meta}"
        );
        assert!(meta.contains("\"num_edges\": 6") && meta.contains("\"feature_dim\": 3"));
        // Exporting again replaces the directory; nothing else is left beside it.
        export_npy(&ds, &out).unwrap();
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 7);
    }

    #[test]
    fn invalid_dataset_is_refused_before_writing() {
        let d = tempfile::tempdir().unwrap();
        let mut ds = odd_dataset();
        ds.labels = vec![0, 9, 0, 0].into();
        assert!(export_npy(&ds, &d.path().join("out")).is_err());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }
}
