//! Training checkpoints (`.tck`): everything needed to continue a run exactly
//! where it stopped.
//!
//! # Format, version 1 (all integers and floats little-endian)
//! ```text
//! magic        8 bytes   "TANDEMCK"
//! version      u32       1
//! config       u64 length, then that many bytes of UTF-8 TOML (the effective config)
//! dataset      5 × u64   vertices, stored edges, feature dim, classes, training vertices
//! position     u64 epoch, u64 batch, f64 loss sum, u64 correct, u64 seen, f64 seconds
//! steps        u64       optimizer steps taken (the weight version)
//! tensors      u64 count, then per tensor:
//!                u32 name length, name (UTF-8), u64 element count n,
//!                n × f32 parameter values,
//!                and when steps > 0: n × f32 Adam first moment, n × f32 second moment
//! checksum     u64       xxh3-64 of every byte before it
//! ```
//! `position` says how far the interrupted epoch got: `batch` batches of epoch
//! `epoch` are trained (0 at an epoch boundary), with their summed loss, correct
//! count, seen seeds and training seconds, so the epoch's statistics after a resume
//! are those of an uninterrupted run.
//!
//! Files are written atomically (temporary name, then rename); a reader checks the magic, the
//! version and the checksum before anything else, then every length against the
//! bytes that remain, so a truncated, corrupt or foreign file is an error naming
//! the file and what is wrong, never a panic or a huge allocation.

use std::io::Write;
use std::path::Path;

use cpu_ops::ModelConfig;
use gpu_ops::model::ModelLayout;
use xxhash_rust::xxh3::xxh3_64;

use crate::atomic::write_file_atomically;
use crate::config::TrainConfig;
use crate::data::dataset::Dataset;
use crate::error::{Error, Result};

/// The first 8 bytes of every checkpoint.
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"TANDEMCK";
/// The format version this build writes and reads.
pub const CHECKPOINT_VERSION: u32 = 1;

/// The sizes of the dataset a checkpoint was trained on; a checkpoint only loads
/// into a trainer whose dataset has the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatasetShape {
    /// Vertices.
    pub vertices: u64,
    /// Stored (directed) edges.
    pub edges: u64,
    /// Feature dimension.
    pub dim: u64,
    /// Classes.
    pub classes: u64,
    /// Training vertices.
    pub train: u64,
}

impl DatasetShape {
    /// The shape of `ds`.
    pub fn of(ds: &Dataset) -> Self {
        let train = ds.train_mask.iter().filter(|&&m| m == 1).count();
        Self {
            vertices: ds.num_vertices() as u64,
            edges: ds.graph.num_edges() as u64,
            dim: ds.features.dim() as u64,
            classes: u64::from(ds.num_classes),
            train: train as u64,
        }
    }
}

/// Where training stands: the next epoch and how far into it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Position {
    /// 0-based epoch in progress (= epochs completed).
    pub epoch: usize,
    /// Batches of `epoch` already trained.
    pub batch: usize,
    /// Their summed loss (loss × batch size, summed in batch order).
    pub loss_sum: f64,
    /// Their correctly classified seeds.
    pub correct: u64,
    /// Their seeds.
    pub seen: u64,
    /// Seconds spent training them.
    pub train_secs: f64,
}

/// One parameter tensor with its optimizer state.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorState {
    /// The model's name for it (`layer0.weight`, ...).
    pub name: String,
    /// Parameter values.
    pub values: Vec<f32>,
    /// Adam's first moment (empty before the first step).
    pub m: Vec<f32>,
    /// Adam's second moment (empty before the first step).
    pub v: Vec<f32>,
}

/// A training state: what [`Checkpoint::write`] saves and [`Checkpoint::read`]
/// returns. `Trainer::save_checkpoint` / `Trainer::load_checkpoint` are the usual
/// way in and out.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The effective configuration of the run, as TOML.
    pub config_toml: String,
    /// The dataset's sizes.
    pub dataset: DatasetShape,
    /// How far training got.
    pub position: Position,
    /// Optimizer steps taken.
    pub steps: u64,
    /// Parameters and moments, in the model's order.
    pub tensors: Vec<TensorState>,
}

fn put_u64(out: &mut Vec<u8>, x: u64) {
    out.extend_from_slice(&x.to_le_bytes());
}

fn put_f32s(out: &mut Vec<u8>, xs: &[f32]) {
    out.reserve(xs.len() * 4);
    for x in xs {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Reads fields in order, naming the field and offset when the bytes run out.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let left = (self.bytes.len() - self.pos) as u64;
        if n > left {
            return Err(Error::checkpoint_corrupt(
                self.path,
                format!(
                    "truncated checkpoint: {what} needs {n} bytes at offset {}, {left} remain",
                    self.pos
                ),
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn usize(&mut self, what: &str) -> Result<usize> {
        let x = self.u64(what)?;
        usize::try_from(x).map_err(|_| {
            Error::checkpoint_corrupt(self.path, format!("{what} = {x} does not fit this machine"))
        })
    }

    fn f64(&mut self, what: &str) -> Result<f64> {
        Ok(f64::from_bits(self.u64(what)?))
    }

    fn string(&mut self, len: u64, what: &str) -> Result<String> {
        let b = self.take(len, what)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| Error::checkpoint_corrupt(self.path, format!("{what} is not UTF-8")))
    }

    fn f32s(&mut self, n: u64, what: &str) -> Result<Vec<f32>> {
        let b = self.take(n.saturating_mul(4), what)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

impl Checkpoint {
    /// The checkpoint's bytes (format above).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&CHECKPOINT_MAGIC);
        out.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        put_u64(&mut out, self.config_toml.len() as u64);
        out.extend_from_slice(self.config_toml.as_bytes());
        let d = &self.dataset;
        for x in [d.vertices, d.edges, d.dim, d.classes, d.train] {
            put_u64(&mut out, x);
        }
        let p = &self.position;
        put_u64(&mut out, p.epoch as u64);
        put_u64(&mut out, p.batch as u64);
        put_u64(&mut out, p.loss_sum.to_bits());
        put_u64(&mut out, p.correct);
        put_u64(&mut out, p.seen);
        put_u64(&mut out, p.train_secs.to_bits());
        put_u64(&mut out, self.steps);
        put_u64(&mut out, self.tensors.len() as u64);
        for t in &self.tensors {
            out.extend_from_slice(&(t.name.len() as u32).to_le_bytes());
            out.extend_from_slice(t.name.as_bytes());
            put_u64(&mut out, t.values.len() as u64);
            put_f32s(&mut out, &t.values);
            if self.steps > 0 {
                put_f32s(&mut out, &t.m);
                put_f32s(&mut out, &t.v);
            }
        }
        let sum = xxh3_64(&out);
        put_u64(&mut out, sum);
        out
    }

    /// Parses checkpoint bytes; `path` names the source in errors.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let bad = |what: String| Err(Error::checkpoint_corrupt(path, what));
        if bytes.len() < 8 || bytes[..8] != CHECKPOINT_MAGIC {
            return bad(format!(
                "not a Tandem checkpoint: expected the magic bytes {:?} at the start",
                std::str::from_utf8(&CHECKPOINT_MAGIC).unwrap_or("TANDEMCK")
            ));
        }
        if bytes.len() < 8 + 4 + 8 {
            return bad(format!(
                "truncated checkpoint: {} bytes, fewer than a header and checksum",
                bytes.len()
            ));
        }
        let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if version != CHECKPOINT_VERSION {
            return bad(format!(
                "checkpoint format version {version}, this build reads version {CHECKPOINT_VERSION}"
            ));
        }
        let (body, tail) = bytes.split_at(bytes.len() - 8);
        let mut stored = [0u8; 8];
        stored.copy_from_slice(tail);
        let (stored, actual) = (u64::from_le_bytes(stored), xxh3_64(body));
        if stored != actual {
            return bad(format!(
                "checksum mismatch (stored {stored:016x}, computed {actual:016x}): the file is corrupt or truncated"
            ));
        }
        let mut r = Reader {
            bytes: body,
            pos: 12,
            path,
        };
        let config_len = r.u64("config length")?;
        let config_toml = r.string(config_len, "config")?;
        let dataset = DatasetShape {
            vertices: r.u64("dataset vertices")?,
            edges: r.u64("dataset edges")?,
            dim: r.u64("dataset dim")?,
            classes: r.u64("dataset classes")?,
            train: r.u64("dataset training vertices")?,
        };
        let position = Position {
            epoch: r.usize("epoch")?,
            batch: r.usize("batch")?,
            loss_sum: r.f64("loss sum")?,
            correct: r.u64("correct count")?,
            seen: r.u64("seen count")?,
            train_secs: r.f64("training seconds")?,
        };
        let steps = r.u64("optimizer steps")?;
        let count = r.u64("tensor count")?;
        // Each tensor takes at least 12 bytes: bound the count before allocating.
        let left = (r.bytes.len() - r.pos) as u64;
        if count > left / 12 {
            return bad(format!(
                "{count} tensors cannot fit in the {left} bytes that remain"
            ));
        }
        let mut tensors = Vec::with_capacity(count as usize);
        for i in 0..count {
            let name_len = r.u32(&format!("tensor {i} name length"))?;
            let name = r.string(u64::from(name_len), &format!("tensor {i} name"))?;
            let n = r.u64(&format!("tensor `{name}` length"))?;
            let values = r.f32s(n, &format!("tensor `{name}` values"))?;
            let (m, v) = if steps > 0 {
                (
                    r.f32s(n, &format!("tensor `{name}` first moment"))?,
                    r.f32s(n, &format!("tensor `{name}` second moment"))?,
                )
            } else {
                (Vec::new(), Vec::new())
            };
            tensors.push(TensorState { name, values, m, v });
        }
        if r.pos != body.len() {
            return bad(format!(
                "{} unexpected bytes after the last tensor",
                body.len() - r.pos
            ));
        }
        Ok(Self {
            config_toml,
            dataset,
            position,
            steps,
            tensors,
        })
    }

    /// Writes the checkpoint to `path` atomically.
    pub fn write(&self, path: &Path) -> Result<()> {
        let bytes = self.to_bytes();
        write_file_atomically(path, |w| {
            w.write_all(&bytes).map_err(|e| Error::io(path, e))
        })
    }

    /// Reads and checks a checkpoint file.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(&bytes, path)
    }

    /// The trained model alone: its configuration (from the saved configuration
    /// and dataset sizes) and its parameter tensors (names and lengths checked
    /// against the configured model's layout). No dataset is needed, e.g. to
    /// export it (`tandem export-model`), or to build a device model
    /// (`gpu_ops::DeviceModel::from_params`).
    pub fn model_params(&self, path: &Path) -> Result<(ModelConfig, gpu_ops::Head, Vec<&[f32]>)> {
        let cfg = self.config(path)?;
        let (dim, classes) = (self.dataset.dim, self.dataset.classes);
        let (Ok(dim), Ok(classes)) = (usize::try_from(dim), usize::try_from(classes)) else {
            return Err(Error::checkpoint_corrupt(
                path,
                format!("feature dim {dim} or class count {classes} does not fit usize"),
            ));
        };
        let mcfg = cfg.model_config(dim, classes)?;
        let head = cfg.head();
        let layout = ModelLayout::with_head(&mcfg, head)
            .map_err(|e| Error::device(path.display().to_string(), e))?;
        let expected = layout.params();
        // The layout comes from the checkpoint's own configuration: tensors that
        // disagree with it mean a damaged (or hand-edited) file.
        if expected.len() != self.tensors.len() {
            return Err(Error::checkpoint_corrupt(
                path,
                format!(
                    "{} parameter tensors, its configured model has {}",
                    self.tensors.len(),
                    expected.len()
                ),
            ));
        }
        for (p, t) in expected.iter().zip(&self.tensors) {
            if t.name != p.name || t.values.len() != p.len {
                return Err(Error::checkpoint_corrupt(
                    path,
                    format!(
                        "tensor `{}` has {} values, its configured model expects `{}` with {}",
                        t.name,
                        t.values.len(),
                        p.name,
                        p.len
                    ),
                ));
            }
        }
        let params = self.tensors.iter().map(|t| t.values.as_slice()).collect();
        Ok((mcfg, head, params))
    }

    /// The run's configuration, parsed (errors name the checkpoint file).
    pub fn config(&self, path: &Path) -> Result<TrainConfig> {
        TrainConfig::from_toml(&self.config_toml, path)
    }

    /// Checks that this checkpoint fits a trainer with configuration `cfg`, dataset
    /// shape `shape` and parameter tensors `params` (name, length), and that its
    /// optimizer state is complete. Errors name `path` and the first mismatch.
    pub fn check_fits(
        &self,
        path: &Path,
        cfg: &TrainConfig,
        shape: &DatasetShape,
        params: &[(String, usize)],
    ) -> Result<()> {
        let saved = self.config(path)?;
        let (a, b) = (&saved.model, &cfg.model);
        for (key, was, now) in [
            ("model.kind", a.kind.to_string(), b.kind.to_string()),
            ("model.layers", a.layers.to_string(), b.layers.to_string()),
            ("model.hidden", a.hidden.to_string(), b.hidden.to_string()),
            ("model.heads", a.heads.to_string(), b.heads.to_string()),
        ] {
            if was != now {
                return Err(Error::checkpoint_mismatch(path, key, now, was));
            }
        }
        let d = &self.dataset;
        for (what, was, now) in [
            ("dataset vertices", d.vertices, shape.vertices),
            ("dataset stored edges", d.edges, shape.edges),
            ("dataset feature dim", d.dim, shape.dim),
            ("dataset classes", d.classes, shape.classes),
            ("dataset training vertices", d.train, shape.train),
        ] {
            if was != now {
                return Err(Error::checkpoint_mismatch(path, what, now, was));
            }
        }
        if self.tensors.len() != params.len() {
            return Err(Error::checkpoint_mismatch(
                path,
                "parameter tensors",
                params.len(),
                self.tensors.len(),
            ));
        }
        for (i, (t, (name, len))) in self.tensors.iter().zip(params).enumerate() {
            if &t.name != name || t.values.len() != *len {
                return Err(tensor_mismatch(path, i, (name, *len), t));
            }
            if self.steps > 0 && (t.m.len() != *len || t.v.len() != *len) {
                return Err(Error::checkpoint_corrupt(
                    path,
                    format!("tensor `{name}`: optimizer moments of the wrong length"),
                ));
            }
        }
        // The batch list of a part-done epoch depends on the seed and batch size:
        // a checkpoint taken inside an epoch needs the same ones.
        if self.position.batch > 0 {
            for (key, was, now) in [
                ("train.seed", saved.train.seed, cfg.train.seed),
                (
                    "train.batch_size",
                    saved.train.batch_size as u64,
                    cfg.train.batch_size as u64,
                ),
            ] {
                if was != now {
                    return Err(Error::checkpoint_mismatch(path, key, now, was));
                }
            }
            let batches = shape.train.div_ceil(cfg.train.batch_size as u64);
            if self.position.batch as u64 > batches {
                return Err(Error::checkpoint_mismatch(
                    path,
                    "position batch",
                    format!("at most the epoch's {batches} batches"),
                    self.position.batch,
                ));
            }
        }
        Ok(())
    }
}

/// Tensor `i` of the checkpoint, `t`, is not the `(name, len)` this model has there.
fn tensor_mismatch(path: &Path, i: usize, (name, len): (&str, usize), t: &TensorState) -> Error {
    Error::checkpoint_mismatch(
        path,
        format!("tensor {i}"),
        format!("`{name}` with {len} values"),
        format!("`{}` with {} values", t.name, t.values.len()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(steps: u64) -> Checkpoint {
        let moments = |n: usize, k: f32| {
            if steps > 0 {
                (0..n).map(|i| i as f32 * k).collect()
            } else {
                Vec::new()
            }
        };
        Checkpoint {
            config_toml: TrainConfig::default().to_toml(),
            dataset: DatasetShape {
                vertices: 10,
                edges: 20,
                dim: 3,
                classes: 2,
                train: 5,
            },
            position: Position {
                epoch: 2,
                batch: 1,
                loss_sum: 0.1 + 0.2,
                correct: 3,
                seen: 4,
                train_secs: 1.5,
            },
            steps,
            tensors: vec![
                TensorState {
                    name: "layer0.weight".into(),
                    values: vec![1.0, -0.0, f32::MIN_POSITIVE, 3.5e-39],
                    m: moments(4, 0.5),
                    v: moments(4, 0.25),
                },
                TensorState {
                    name: "layer0.bias".into(),
                    values: vec![],
                    m: moments(0, 1.0),
                    v: moments(0, 1.0),
                },
            ],
        }
    }

    #[test]
    fn round_trips_bit_exactly_with_and_without_moments() {
        let d = tempfile::tempdir().unwrap();
        for steps in [0, 7] {
            let c = sample(steps);
            let p = d.path().join(format!("c{steps}.tck"));
            c.write(&p).unwrap();
            let back = Checkpoint::read(&p).unwrap();
            assert_eq!(back, c);
            assert_eq!(back.tensors[0].values[1].to_bits(), (-0.0f32).to_bits());
            assert_eq!(back.config(&p).unwrap(), TrainConfig::default());
        }
    }

    #[test]
    fn damaged_files_are_errors_naming_the_file_and_the_problem() {
        let p = Path::new("run/ck.tck");
        let good = sample(3).to_bytes();
        let err = |b: &[u8]| match Checkpoint::from_bytes(b, p) {
            Err(e @ Error::CheckpointCorrupt { .. }) => {
                assert!(matches!(&e, Error::CheckpointCorrupt { path, .. } if path == p));
                e.to_string()
            }
            other => panic!("expected CheckpointCorrupt, got {other:?}"),
        };
        let e = err(b"PK\x03\x04 something else");
        assert!(
            e.contains("run/ck.tck") && e.contains("not a Tandem checkpoint"),
            "{e}"
        );
        let e = err(&good[..10]);
        assert!(e.contains("truncated"), "{e}");
        let e = err(&good[..good.len() - 1]);
        assert!(e.contains("checksum"), "{e}");
        let mut flipped = good.clone();
        flipped[40] ^= 1;
        assert!(err(&flipped).contains("checksum"));
        let mut v2 = good.clone();
        v2[8] = 2;
        let e = err(&v2);
        assert!(
            e.contains("version 2") && e.contains("reads version 1"),
            "{e}"
        );
        // Consistent checksum but lying lengths: a huge tensor count.
        let mut lie = good[..good.len() - 8].to_vec();
        // magic, version, config length and text, dataset, position, steps.
        let count_at = 8 + 4 + 8 + sample(3).config_toml.len() + 5 * 8 + 6 * 8 + 8;
        lie[count_at..count_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let sum = xxh3_64(&lie);
        lie.extend_from_slice(&sum.to_le_bytes());
        let e = err(&lie);
        assert!(e.contains("tensors cannot fit"), "{e}");
    }

    #[test]
    fn mismatches_name_what_differs() {
        let c = sample(3);
        let p = Path::new("ck.tck");
        let cfg = TrainConfig::default();
        let shape = c.dataset;
        let params = vec![("layer0.weight".to_string(), 4), ("layer0.bias".into(), 0)];
        c.check_fits(p, &cfg, &shape, &params).unwrap();
        let mismatch = |r: Result<()>| match r {
            Err(Error::CheckpointMismatch {
                path,
                field,
                expected,
                found,
            }) => {
                assert_eq!(path, p);
                (field, expected, found)
            }
            other => panic!("expected CheckpointMismatch, got {other:?}"),
        };
        let mut other = cfg.clone();
        other.model.hidden = 8;
        let e = c.check_fits(p, &other, &shape, &params);
        assert_eq!(
            mismatch(e),
            ("model.hidden".into(), "8".into(), "256".into())
        );
        let e = c.check_fits(p, &cfg, &DatasetShape { dim: 4, ..shape }, &params);
        assert_eq!(mismatch(e).0, "dataset feature dim");
        let e = c.check_fits(
            p,
            &cfg,
            &shape,
            &[("layer0.weight".into(), 5), ("x".into(), 0)],
        );
        let (field, expected, found) = mismatch(e);
        assert_eq!(field, "tensor 0");
        assert!(expected.contains("with 5 values") && found.contains("with 4 values"));
        let mut seeded = cfg.clone();
        seeded.train.seed = 9;
        let e = c.check_fits(p, &seeded, &shape, &params);
        assert_eq!(mismatch(e), ("train.seed".into(), "9".into(), "0".into()));
        // At an epoch boundary the seed may change (fine-tuning with new shuffles).
        let boundary = Checkpoint {
            position: Position {
                batch: 0,
                ..c.position
            },
            ..c.clone()
        };
        boundary.check_fits(p, &seeded, &shape, &params).unwrap();
    }

    #[test]
    fn the_model_alone_is_rebuilt_from_config_shape_and_tensors() {
        let cfg = TrainConfig::default();
        let mcfg = cfg.model_config(3, 2).unwrap();
        let layout = ModelLayout::new(&mcfg).unwrap();
        let tensors = layout
            .param_names()
            .into_iter()
            .zip(layout.init_params(11))
            .map(|(name, p)| TensorState {
                name,
                values: p.iter().map(|v| v + 0.25).collect(),
                m: Vec::new(),
                v: Vec::new(),
            })
            .collect::<Vec<_>>();
        let c = Checkpoint {
            steps: 0,
            tensors,
            ..sample(0)
        };
        let p = Path::new("ck.tck");
        let (got_cfg, _, params) = c.model_params(p).unwrap();
        assert_eq!(got_cfg, mcfg);
        assert_eq!(params.len(), c.tensors.len());
        for (got, t) in params.iter().zip(&c.tensors) {
            assert_eq!(*got, t.values.as_slice(), "{}", t.name);
        }
        let mut renamed = c.clone();
        renamed.tensors[1].name = "layer0.other".into();
        let e = renamed.model_params(p).unwrap_err();
        assert!(e.to_string().contains("layer0.other"), "{e}");
        let mut cut = c.clone();
        cut.tensors[0].values.pop();
        let e = cut.model_params(p).unwrap_err();
        assert!(e.to_string().contains("layer0.weight"), "{e}");
        let short = Checkpoint {
            tensors: c.tensors[..2].to_vec(),
            ..c
        };
        let e = short.model_params(p).unwrap_err();
        assert!(e.to_string().contains("parameter tensors"), "{e}");
    }
}
