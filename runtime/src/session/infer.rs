//! Full-graph inference streamed layer by layer through files, so its memory is
//! the store plus a bounded working set instead of an activation matrix of every
//! vertex: what [`Trainer::infer_to_file`] (`tandem infer`) and
//! `train.eval_mode = "full"` run.
//!
//! The protocol, per layer `l` of the `L` computed:
//!
//! 1. **Row blocks.** The destination vertices (every vertex; at the last layer
//!    of an evaluation only the validation and test vertices) are cut, in id
//!    order, into blocks whose one-hop input — the block's vertices and all
//!    their in-neighbors — holds at most [`BLOCK_INPUT_ROWS`] rows (a vertex
//!    whose neighbors alone exceed that is a block by itself).
//! 2. **One block.** Its one-hop block takes every neighbor
//!    (`cpu_ops::sample_hop` with `ALL_NEIGHBORS`, neighbors in CSR order, as
//!    the whole-graph block of in-memory inference has them); its input rows
//!    are the features (layer 0, read from the store) or the rows of layer
//!    `l − 1`'s file; the engine applies layer `l` to them (no dropout) and
//!    hands back the block's output rows. GCN normalizes by each source's
//!    degree in the graph, not in the block: its input rows are scaled by
//!    √(block degree / graph degree), as sharded evaluation does.
//! 3. **Layer files.** Below the last layer, the blocks' rows are appended to
//!    a scratch file (`n × width` little-endian f32, no header), written under
//!    a temporary name and renamed when complete (`crate::atomic`); the next
//!    layer reads the rows each block needs with positioned reads (not a
//!    memory map: see `LayerFile`), so the file's pages stay in the page
//!    cache and out of the process's resident set. The file of layer `l − 1`
//!    is removed once layer `l` is complete; every scratch file is removed on
//!    error too.
//! 4. **Last layer.** Its rows go to the consumer: the output `.npy` file
//!    (`n × width` `<f4`, written atomically) or the evaluation's correct
//!    counts.
//!
//! Peak memory beyond the store: one block's input, block and output rows, a
//! few bytes a vertex (the sampler's marks; GCN's degrees), and the pages of
//! the layer files (page cache, not resident in the process). Disk: at most two layer files at a time beside
//! the output (`n × hidden × 4` bytes each), or in the system's temporary
//! directory for an evaluation.
//!
//! The outputs equal in-memory full-graph inference ([`Trainer::full_graph_logits`],
//! [`Trainer::embedding_table`]) bit for bit for GraphSAGE and GAT, whose rows
//! do not depend on the block they are computed in; GCN's rescaled inputs agree
//! to float rounding (relative 1e-5 in the tests).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cpu_ops::{BlockView, MatRef, SamplerScratch, ALL_NEIGHBORS};

use super::Trainer;
use crate::atomic::write_file_atomically;
use crate::error::{Error, Result};
use crate::progress::{NoProgress, Progress};

/// Most input rows (a block's vertices and their neighbors) one block reads
/// (protocol step 1): 2^16 rows, 32 MiB of fp32 input at 128 columns, 64 MiB
/// at a hidden width of 256 (the engine's copies and the layer's outputs come
/// on top; the host backend's buffer pool keeps freed blocks by size class).
pub const BLOCK_INPUT_ROWS: usize = 1 << 16;

/// What [`Trainer::infer_to_file`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InferOutput {
    /// The output of the layer below the classifier ([`crate::Embeddings`]):
    /// `model.hidden` columns (the input features for a 1-layer model).
    Embeddings,
    /// The classifier's logits: `num_classes` columns.
    Logits,
}

/// What a streamed inference did ([`Trainer::infer_to_file`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InferReport {
    /// Rows written (every vertex).
    pub rows: usize,
    /// Columns of each row.
    pub width: usize,
    /// Layers applied (0 for the embeddings of a 1-layer model: its features).
    pub layers: usize,
    /// Row blocks computed over all layers.
    pub blocks: usize,
    /// Bytes of layer files written and removed again (below the last layer).
    pub scratch_bytes: u64,
    /// The weight version (optimizer steps) the rows were computed at.
    pub steps: u64,
}

/// Blocks of `ids` (step 1): consecutive runs whose vertices plus in-edges
/// stay within `max_rows` (a run of one vertex may exceed it).
fn row_blocks(offsets: &[u64], ids: &[u32], max_rows: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut rows = 0usize;
    for (i, &v) in ids.iter().enumerate() {
        let v = v as usize;
        let need = 1 + (offsets[v + 1] - offsets[v]) as usize;
        if i > start && rows + need > max_rows {
            out.push(start..i);
            start = i;
            rows = 0;
        }
        rows += need;
    }
    if start < ids.len() {
        out.push(start..ids.len());
    }
    out
}

/// A layer file (step 3), read row by row with positioned reads; removed when
/// dropped.
///
/// Not memory-mapped: a block reads scattered rows of the whole file, and the
/// kernel maps file pages 64 KiB around every fault (`fault_around_bytes`), so
/// a mapping had every page of the file resident after a few blocks (3.4 GiB
/// peak for a 1.2 GB store and a 1.9 GiB layer file at 2M vertices, whatever
/// `MADV_DONTNEED` released between blocks). Positioned reads copy only the
/// rows asked for.
struct LayerFile {
    path: PathBuf,
    width: usize,
    file: Option<File>,
}

impl LayerFile {
    /// Opens `path`, which must hold `rows × width` f32 values.
    fn open(path: PathBuf, rows: usize, width: usize) -> Result<Self> {
        let mut me = Self {
            path,
            width,
            file: None,
        };
        let file = File::open(&me.path).map_err(|e| Error::io(&me.path, e))?;
        let len = file.metadata().map_err(|e| Error::io(&me.path, e))?.len();
        let want = (rows * width * 4) as u64;
        if len != want {
            return Err(Error::format(
                &me.path,
                format!(
                    "layer file of {rows} rows × {width} f32 should be {want} bytes, found {len} \
                     (changed while inference ran?)"
                ),
            ));
        }
        me.file = Some(file);
        Ok(me)
    }

    /// Reads the rows of `ids` into `out` (`ids.len() × width`), on the
    /// current rayon pool's threads.
    fn gather(&self, ids: &[u32], out: &mut Vec<f32>) -> Result<()> {
        use rayon::prelude::*;
        let w = self.width;
        out.clear();
        out.resize(ids.len() * w, 0.0);
        let Some(file) = &self.file else {
            return Ok(());
        };
        out.par_chunks_mut(w.max(1) * 256)
            .zip(ids.par_chunks(256))
            .try_for_each(|(rows, ids)| {
                for (row, &v) in rows.chunks_mut(w).zip(ids) {
                    read_row(file, (v as usize * w * 4) as u64, row)?;
                }
                Ok::<(), std::io::Error>(())
            })
            .map_err(|e| Error::io(&self.path, e))
    }
}

/// Reads one little-endian f32 row at byte `offset` of `file` into `row`.
fn read_row(file: &File, offset: u64, row: &mut [f32]) -> std::io::Result<()> {
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(row);
    #[cfg(unix)]
    std::os::unix::fs::FileExt::read_exact_at(file, bytes, offset)?;
    #[cfg(windows)]
    {
        let mut done = 0;
        while done < bytes.len() {
            let n = std::os::windows::fs::FileExt::seek_read(
                file,
                &mut bytes[done..],
                offset + done as u64,
            )?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            done += n;
        }
    }
    if cfg!(target_endian = "big") {
        for v in row.iter_mut() {
            *v = f32::from_bits(u32::from_le(v.to_bits()));
        }
    }
    Ok(())
}

impl Drop for LayerFile {
    fn drop(&mut self) {
        self.file = None;
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A scratch file's path beside `dir/stem`, unique in this process.
fn layer_path(dir: &Path, stem: &str, layer: usize) -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(format!(
        ".{stem}.layer{layer}-{}-{n}.f32",
        std::process::id()
    ))
}

/// Removes a path on drop unless disarmed (a layer file between its rename
/// and its [`LayerFile`]).
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Receives each last-layer block's destinations and rows, in order.
type LastLayerSink<'a> = dyn FnMut(&[u32], &[f32]) -> Result<()> + 'a;

/// Where the streamed layers go: scratch files and the last layer's consumer.
struct Plan<'a> {
    /// Layers to apply (≥ 1).
    layers: usize,
    /// The last layer's destinations (sorted, unique); `None`: every vertex.
    last_ids: Option<&'a [u32]>,
    /// Directory and name stem of the layer files.
    dir: &'a Path,
    stem: &'a str,
    /// Rows a block may read (step 1).
    max_rows: usize,
    progress: &'a dyn Progress,
}

impl Trainer {
    /// Full-graph inference streamed layer by layer (module doc): writes every
    /// vertex's embeddings or logits to `path` as an `n × width` `.npy` array
    /// of little-endian f32 (`numpy.load(path, mmap_mode="r")` reads it
    /// without loading it), atomically. Layer files go beside `path` and are
    /// removed. Equals [`Trainer::embedding_table`] / [`Trainer::full_graph_logits`]
    /// (module doc for the tolerance) without holding any matrix of every vertex.
    pub fn infer_to_file(&mut self, what: InferOutput, path: &Path) -> Result<InferReport> {
        self.infer_to_file_with(what, path, &NoProgress)
    }

    /// [`Trainer::infer_to_file`], reporting each layer's progress (phase
    /// `"layer L/N"`, in vertices) to `progress`.
    pub fn infer_to_file_with(
        &mut self,
        what: InferOutput,
        path: &Path,
        progress: &dyn Progress,
    ) -> Result<InferReport> {
        self.infer_to_file_blocked(what, path, progress, BLOCK_INPUT_ROWS)
    }

    pub(super) fn infer_to_file_blocked(
        &mut self,
        what: InferOutput,
        path: &Path,
        progress: &dyn Progress,
        max_rows: usize,
    ) -> Result<InferReport> {
        self.check_every_row("full-graph inference")?;
        let n = self.ds.num_vertices();
        let steps = self.steps();
        let layers = match what {
            InferOutput::Logits => {
                self.no_logits_for_links("logits")?;
                self.cfg.model.layers
            }
            InferOutput::Embeddings => self.embedding_layers(),
        };
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let stem = path
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "infer".into());
        if layers == 0 {
            // A 1-layer model's embeddings are its input features.
            let ds = Arc::clone(&self.ds);
            let f = &ds.features;
            let width = f.dim();
            write_npy_rows(path, n, width, |w| {
                for chunk in f.as_slice().chunks(width * 4096) {
                    write_f32s(w, chunk).map_err(|e| Error::io(path, e))?;
                }
                Ok(())
            })?;
            return Ok(InferReport {
                rows: n,
                width,
                layers: 0,
                blocks: 0,
                scratch_bytes: 0,
                steps,
            });
        }
        let width = self.layer_width(layers - 1)?;
        let plan = Plan {
            layers,
            last_ids: None,
            dir: &dir,
            stem: &stem,
            max_rows,
            progress,
        };
        let pool = Arc::clone(&self.pool);
        let mut report = None;
        write_npy_rows(path, n, width, |w| {
            let r = pool.install(|| {
                self.stream_layers(&plan, &mut |_, rows| {
                    write_f32s(w, rows).map_err(|e| Error::io(path, e))
                })
            })?;
            report = Some(r);
            Ok(())
        })?;
        let (blocks, scratch_bytes) = report.unwrap_or_default();
        Ok(InferReport {
            rows: n,
            width,
            layers,
            blocks,
            scratch_bytes,
            steps,
        })
    }

    /// Validation and test accuracy by streamed full-graph inference (module
    /// doc): the layers below the last over every vertex through layer files in
    /// the system's temporary directory, the last over the validation and test
    /// vertices only.
    pub(super) fn evaluate_full_streamed(&mut self) -> Result<(f64, f64)> {
        let mut val = self.splits.val.clone();
        let mut test = self.splits.test.clone();
        val.sort_unstable();
        test.sort_unstable();
        let mut ids: Vec<u32> = val.iter().chain(&test).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        let dir = std::env::temp_dir();
        let plan = Plan {
            layers: self.cfg.model.layers,
            last_ids: Some(&ids),
            dir: &dir,
            stem: "tandem-eval",
            max_rows: BLOCK_INPUT_ROWS,
            progress: &NoProgress,
        };
        let c = self.ds.num_classes as usize;
        let ds = Arc::clone(&self.ds);
        let (mut right_val, mut right_test) = (0usize, 0usize);
        let mut count = |dst: &[u32], rows: &[f32]| -> Result<()> {
            for (split, right) in [(&val, &mut right_val), (&test, &mut right_test)] {
                let mut sel = Vec::new();
                let mut labels = Vec::new();
                for (i, &v) in dst.iter().enumerate() {
                    if split.binary_search(&v).is_ok() {
                        sel.extend_from_slice(&rows[i * c..(i + 1) * c]);
                        labels.push(ds.labels[v as usize]);
                    }
                }
                if !labels.is_empty() {
                    let m = MatRef::new(&sel, labels.len(), c)
                        .map_err(|e| Error::cpu_ops("logits", e))?;
                    *right += cpu_ops::accuracy_count(m, &labels)
                        .map_err(|e| Error::cpu_ops("accuracy", e))?;
                }
            }
            Ok(())
        };
        self.stream_layers(&plan, &mut count)?;
        let acc = |k: usize, n: usize| if n == 0 { 0.0 } else { k as f64 / n as f64 };
        Ok((
            acc(right_val, self.splits.val.len()),
            acc(right_test, self.splits.test.len()),
        ))
    }

    /// The top layer's output rows of `ids` (sorted, distinct), in that
    /// order, by streamed full-graph inference (module doc; the layers below
    /// the last through layer files in the system's temporary directory):
    /// `ids.len() × width` values.
    pub(super) fn last_layer_rows(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        let dir = std::env::temp_dir();
        let plan = Plan {
            layers: self.cfg.model.layers,
            last_ids: Some(ids),
            dir: &dir,
            stem: "tandem-rows",
            max_rows: BLOCK_INPUT_ROWS,
            progress: &NoProgress,
        };
        let mut rows = Vec::new();
        let mut keep = |_: &[u32], out: &[f32]| -> Result<()> {
            rows.extend_from_slice(out);
            Ok(())
        };
        self.stream_layers(&plan, &mut keep)?;
        Ok(rows)
    }

    /// Output width of layer `l`.
    fn layer_width(&self, l: usize) -> Result<usize> {
        self.state_ref()?
            .layer_width(l)
            .ok_or_else(|| Error::invalid_argument("layer", format!("internal: no layer {l}")))
    }

    /// Protocol steps 1–4 under `plan`; `last` receives each last-layer block's
    /// destinations and rows, in order. Returns (blocks, scratch bytes).
    fn stream_layers(
        &mut self,
        plan: &Plan<'_>,
        last: &mut LastLayerSink<'_>,
    ) -> Result<(usize, u64)> {
        let ds = Arc::clone(&self.ds);
        let g = &ds.graph;
        let n = g.num_vertices();
        let offsets = g.offsets().as_slice();
        let all: Vec<u32> = (0..n as u32).collect();
        // GCN: each vertex's degree as a source in the whole graph (+1 self loop).
        let graph_deg = (self.cfg.model.kind == cpu_ops::ModelKind::Gcn).then(|| {
            let mut deg = vec![1u32; n];
            for &v in g.indices().iter() {
                deg[v as usize] += 1;
            }
            deg
        });
        let mut scratch = SamplerScratch::new(n);
        let mut prev: Option<LayerFile> = None;
        let (mut blocks, mut scratch_bytes) = (0usize, 0u64);
        let mut x = Vec::new();
        for l in 0..plan.layers {
            let is_last = l + 1 == plan.layers;
            let dst_all: &[u32] = match (is_last, plan.last_ids) {
                (true, Some(ids)) => ids,
                _ => &all,
            };
            let cuts = row_blocks(offsets, dst_all, plan.max_rows);
            blocks += cuts.len();
            let phase = format!("layer {}/{}", l + 1, plan.layers);
            let total = dst_all.len() as u64;
            plan.progress.update(&phase, 0, total);
            let width = self.layer_width(l)?;
            let tracer = self.tracer.clone();
            let mut compute =
                |me: &mut Trainer, dst: &[u32], x: &mut Vec<f32>| -> Result<Vec<f32>> {
                    let _s = tracer.slice("infer block");
                    let block = cpu_ops::sample_hop(g, dst, ALL_NEIGHBORS, 0, None, &mut scratch)
                        .map_err(|e| Error::cpu_ops("full-graph block", e))?;
                    let scale = match &graph_deg {
                        Some(deg) => {
                            let view =
                                BlockView::new(block.num_src(), block.indptr(), block.indices())
                                    .map_err(|e| Error::cpu_ops("full-graph block", e))?;
                            let nd = dst.len();
                            Some(
                                block
                                    .src_ids()
                                    .iter()
                                    .enumerate()
                                    .map(|(j, &v)| {
                                        let in_block = view.out_degree(j) + usize::from(j < nd);
                                        (in_block as f64 / deg[v as usize] as f64).sqrt() as f32
                                    })
                                    .collect::<Vec<f32>>(),
                            )
                        }
                        None => None,
                    };
                    match &prev {
                        None => {
                            x.clear();
                            if let Some(s) = scale {
                                x.extend_from_slice(&s);
                            }
                        }
                        Some(file) => {
                            file.gather(block.src_ids(), x)?;
                            if let Some(s) = &scale {
                                let w = file.width;
                                for (row, &c) in x.chunks_mut(w).zip(s) {
                                    row.iter_mut().for_each(|v| *v *= c);
                                }
                            }
                        }
                    }
                    let out = me.state()?.layer_rows(l, &block, x)?;
                    if out.len() != dst.len() * width {
                        return Err(Error::invalid_argument(
                            "full-graph inference",
                            format!(
                                "internal: layer {l} gave {} values for {} rows of width {width}",
                                out.len(),
                                dst.len()
                            ),
                        ));
                    }
                    Ok(out)
                };
            if is_last {
                let mut done = 0u64;
                for r in &cuts {
                    let dst = &dst_all[r.clone()];
                    let out = compute(self, dst, &mut x)?;
                    last(dst, &out)?;
                    done += dst.len() as u64;
                    plan.progress.update(&phase, done, total);
                }
            } else {
                let path = layer_path(plan.dir, plan.stem, l);
                let mut written = RemoveOnDrop(None);
                write_file_atomically(&path, |w| {
                    let mut done = 0u64;
                    for r in &cuts {
                        let dst = &dst_all[r.clone()];
                        let out = compute(self, dst, &mut x)?;
                        write_f32s(w, &out).map_err(|e| Error::io(&path, e))?;
                        done += dst.len() as u64;
                        plan.progress.update(&phase, done, total);
                    }
                    Ok(())
                })?;
                written.0 = Some(path.clone());
                scratch_bytes += (n * width * 4) as u64;
                // The next layer reads this one; the previous file goes.
                let next = LayerFile::open(path, n, width);
                written.0 = None;
                prev = Some(next?);
            }
        }
        drop(prev);
        Ok((blocks, scratch_bytes))
    }
}

/// Writes `rows × width` f32 values as little-endian bytes.
fn write_f32s<W: Write>(w: &mut W, values: &[f32]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(values.len().min(1 << 16) * 4);
    for chunk in values.chunks(1 << 16) {
        buf.clear();
        for v in chunk {
            buf.extend_from_slice(&v.to_le_bytes());
        }
        w.write_all(&buf)?;
    }
    Ok(())
}

/// Writes an `n × width` `<f4` `.npy` file atomically: the header, then what
/// `fill` writes (exactly `n × width` values; checked).
fn write_npy_rows<F>(path: &Path, n: usize, width: usize, fill: F) -> Result<()>
where
    F: FnOnce(&mut std::io::BufWriter<File>) -> Result<()>,
{
    write_file_atomically(path, |w| {
        let header = crate::data::npy::header_bytes(crate::data::npy::Dtype::F32, &[n, width]);
        w.write_all(&header).map_err(|e| Error::io(path, e))?;
        fill(w)?;
        w.flush().map_err(|e| Error::io(path, e))?;
        let written = w
            .get_ref()
            .metadata()
            .map_err(|e| Error::io(path, e))?
            .len();
        let want = (header.len() + n * width * 4) as u64;
        if written != want {
            return Err(Error::format(
                path,
                format!("internal: wrote {written} bytes, expected {want} for {n} × {width} f32"),
            ));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TrainConfig;
    use crate::progress::testing::Recorder;
    use crate::{load_dataset, Trainer};

    fn trainer(extra: &[&str]) -> Trainer {
        let mut sets: Vec<String> = [
            "model.hidden=16",
            "model.heads=2",
            "train.epochs=1",
            "train.batch_size=256",
            "train.lr=0.01",
            "train.fanouts=[4,4]",
            "data.synthetic.vertices=1500",
            "data.synthetic.edges=9000",
            "data.synthetic.classes=3",
            "data.synthetic.dim=8",
            "device.kind=\"host\"",
            "threads.compute=1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        sets.extend(extra.iter().map(|s| s.to_string()));
        let c = TrainConfig::from_toml_with_overrides("", Path::new("test"), &sets).unwrap();
        let ds = load_dataset(&c).unwrap();
        let mut t = Trainer::new(ds, c).unwrap();
        t.fit().unwrap();
        t
    }

    fn read(path: &Path) -> (usize, usize, Vec<f32>) {
        let m = crate::data::npy::read_f32_matrix(path).unwrap();
        (m.num_rows(), m.dim(), m.as_slice().to_vec())
    }

    /// What is left in `dir` besides `keep`.
    fn leftovers(dir: &Path, keep: &[&str]) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !keep.contains(&n.as_str()))
            .collect()
    }

    fn assert_close(kind: &str, what: &str, got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{kind} {what}");
        if kind == "gcn" {
            // Rescaled inputs: equal up to float rounding.
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
            for (i, (a, b)) in got.iter().zip(want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * scale,
                    "{kind} {what}: value {i}: streamed {a} vs in memory {b}"
                );
            }
        } else {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(bits(got) == bits(want), "{kind} {what}: not bit-identical");
        }
    }

    /// Streamed in many small blocks, the rows are those of in-memory
    /// inference: bit for bit for SAGE and GAT, to rounding for GCN; the
    /// evaluation's accuracy is the in-memory one; no layer file is left.
    #[test]
    fn streamed_inference_matches_in_memory_inference() {
        for (kind, layers) in [("sage", 2usize), ("sage", 3), ("gcn", 3), ("gat", 2)] {
            let fanouts = format!("train.fanouts={:?}", vec![4; layers]);
            let mut t = trainer(&[
                &format!("model.kind=\"{kind}\""),
                &format!("model.layers={layers}"),
                &fanouts,
            ]);
            let d = tempfile::tempdir().unwrap();
            let (logits, emb) = (d.path().join("logits.npy"), d.path().join("emb.npy"));
            let rec = Recorder::default();
            let r = t
                .infer_to_file_blocked(InferOutput::Logits, &logits, &rec, 200)
                .unwrap();
            let phases: Vec<String> = rec.check().into_iter().map(|(p, _)| p).collect();
            assert_eq!(phases.len(), layers, "{phases:?}");
            assert_eq!(phases[0], format!("layer 1/{layers}"));
            assert!(
                r.blocks > 2 * layers,
                "{kind}: {r:?} should need many blocks"
            );
            assert_eq!((r.rows, r.width, r.layers), (1500, 3, layers));
            assert_eq!(
                r.scratch_bytes,
                ((layers - 1) * 1500 * t.layer_width(0).unwrap() * 4) as u64
            );
            let (n, w, got) = read(&logits);
            assert_eq!((n, w), (1500, 3));
            let want = t.full_graph_logits().unwrap();
            assert_close(kind, "logits", &got, want.as_slice().unwrap());

            let r = t
                .infer_to_file_blocked(InferOutput::Embeddings, &emb, &NoProgress, 200)
                .unwrap();
            let (n, w, got) = read(&emb);
            let table = t.embedding_table().unwrap();
            assert_eq!((n, w, r.width), (1500, table.dim(), table.dim()));
            assert_close(kind, "embeddings", &got, table.as_slice());
            assert_eq!(
                leftovers(d.path(), &["logits.npy", "emb.npy"]),
                Vec::<String>::new()
            );

            // Full-graph evaluation, streamed, against the in-memory logits.
            let all = t.full_graph_logits().unwrap();
            let flat = all.as_slice().unwrap();
            let (val, test) = t.evaluate_full_streamed().unwrap();
            let (v, te) = (t.splits.val.clone(), t.splits.test.clone());
            let (want_val, want_test) = (
                t.accuracy_on(flat, &v).unwrap(),
                t.accuracy_on(flat, &te).unwrap(),
            );
            if kind == "gcn" {
                assert!(
                    (val - want_val).abs() <= 2.0 / v.len() as f64,
                    "{kind}: {val} vs {want_val}"
                );
                assert!(
                    (test - want_test).abs() <= 2.0 / te.len() as f64,
                    "{kind}: {test} vs {want_test}"
                );
            } else {
                assert_eq!((val, test), (want_val, want_test), "{kind}");
            }
        }
    }

    #[test]
    fn a_one_layer_model_writes_its_features_as_embeddings() {
        let mut t = trainer(&["model.layers=1", "train.fanouts=[4]"]);
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("e.npy");
        let r = t.infer_to_file(InferOutput::Embeddings, &p).unwrap();
        assert_eq!((r.layers, r.width, r.blocks), (0, 8, 0));
        let (n, w, got) = read(&p);
        assert_eq!((n, w), (1500, 8));
        assert_eq!(got.as_slice(), t.dataset().features.as_slice());
        // And its logits are one streamed layer.
        let r = t.infer_to_file(InferOutput::Logits, &p).unwrap();
        assert_eq!((r.layers, r.width, r.scratch_bytes), (1, 3, 0));
        let want = t.full_graph_logits().unwrap();
        assert_eq!(read(&p).2, want.as_slice().unwrap());
    }

    /// An output that cannot be written is an error naming the file, and
    /// nothing is left behind (no layer file, no temporary, the old output
    /// untouched).
    #[test]
    fn io_errors_name_the_file_and_leave_nothing_behind() {
        let mut t = trainer(&[]);
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("no-such-dir").join("out.npy");
        let e = t
            .infer_to_file(InferOutput::Logits, &missing)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no-such-dir"), "{e}");
        // A layer file that is not what was written is refused by name.
        let p = d.path().join("short.f32");
        std::fs::write(&p, [0u8; 12]).unwrap();
        let e = LayerFile::open(p.clone(), 2, 2).err().unwrap().to_string();
        assert!(
            e.contains("short.f32") && e.contains("16 bytes, found 12"),
            "{e}"
        );
        assert!(
            !p.exists(),
            "a refused layer file is removed like any other"
        );
        // The old output stays when the new one fails mid-way: a read-only
        // directory makes the first layer file fail.
        let out = d.path().join("keep.npy");
        std::fs::write(&out, b"old").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let ro = d.path().join("ro");
            std::fs::create_dir(&ro).unwrap();
            let target = ro.join("x.npy");
            std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
            let denied = File::create(ro.join("probe")).is_err(); // root ignores modes
            if denied {
                let e = t
                    .infer_to_file(InferOutput::Logits, &target)
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("/ro/"), "{e}");
            }
            std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        assert_eq!(std::fs::read(&out).unwrap(), b"old");
        assert_eq!(
            leftovers(d.path(), &["keep.npy", "ro"]),
            Vec::<String>::new()
        );
    }

    #[test]
    fn row_blocks_cover_the_ids_in_order_within_the_row_budget() {
        // Degrees 3, 0, 5, 1, 9 (offsets of a 5-vertex graph).
        let offsets = [0u64, 3, 3, 8, 9, 18];
        let ids: Vec<u32> = (0..5).collect();
        let b = row_blocks(&offsets, &ids, 7);
        // 4 + 1 rows; 5 + 6 > 7 → cut; 6 + 2 > 7 → cut; 2 + 10 > 7 → cut.
        assert_eq!(b, vec![0..2, 2..3, 3..4, 4..5]);
        assert_eq!(row_blocks(&offsets, &ids, 1000), vec![0..5]);
        assert!(row_blocks(&offsets, &[], 7).is_empty());
        assert_eq!(row_blocks(&offsets, &[4, 1], 7), vec![0..1, 1..2]);
    }
}
