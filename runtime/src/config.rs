//! The training configuration: one TOML file, with `--set key=value` overrides.
//!
//! Every section and key is optional; missing ones take the defaults below. Unknown
//! keys, wrong types and out-of-range values are errors that name the key (with the
//! file it came from). The effective configuration can be printed back as TOML
//! ([`TrainConfig::to_toml`]), which is what `tandem train` prints at start.
//!
//! ```toml
//! [data]
//! path = "wordnet.tds"      # omit for the built-in synthetic graph ([data.synthetic])
//!
//! [model]
//! kind = "sage"             # "gcn" | "sage" | "gat"
//! layers = 2
//! hidden = 256
//! heads = 4                 # GAT only; hidden must be a multiple
//! dropout = 0.5
//!
//! [train]
//! fanouts = [10, 10]        # per layer, input layer first (DGL order); -1 = all
//! batch_size = 1024
//! epochs = 20
//! lr = 0.003
//! ```

use std::path::{Path, PathBuf};

use cpu_ops::{ModelKind, ALL_NEIGHBORS};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The whole training configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Which dataset to train on.
    pub data: DataConfig,
    /// The model.
    pub model: ModelSection,
    /// The training loop.
    pub train: TrainSection,
}

/// `[data]`: a stored dataset, or the built-in synthetic graph.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// A `.tds` dataset; when absent, `synthetic` is generated in-process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// The built-in dataset's parameters.
    pub synthetic: SyntheticConfig,
}

/// `[data.synthetic]`: a stochastic block model with class-correlated features.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SyntheticConfig {
    /// Vertices.
    pub vertices: usize,
    /// Undirected edges drawn.
    pub edges: usize,
    /// Classes (= blocks).
    pub classes: u32,
    /// Feature dimension.
    pub dim: usize,
    /// Fraction of edges inside a class, in [0, 1].
    pub homophily: f64,
    /// Class signal strength in the features (≥ 0).
    pub signal: f32,
    /// Seed of the generated graph.
    pub seed: u64,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        Self {
            vertices: 50_000,
            edges: 400_000,
            classes: 16,
            dim: 64,
            homophily: 0.6,
            signal: 0.1,
            seed: 0,
        }
    }
}

/// `[model]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// `"gcn"`, `"sage"` or `"gat"`.
    pub kind: String,
    /// Number of GNN layers (≥ 1); equals the number of fanouts.
    pub layers: usize,
    /// Hidden width (≥ 1).
    pub hidden: usize,
    /// Attention heads (GAT; `hidden` must be a multiple).
    pub heads: usize,
    /// Dropout probability on hidden activations, in [0, 1).
    pub dropout: f32,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            kind: "sage".into(),
            layers: 2,
            hidden: 256,
            heads: 4,
            dropout: 0.5,
        }
    }
}

/// `[train]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Sampling fanout per layer, input layer first; -1 takes every neighbor.
    pub fanouts: Vec<i64>,
    /// How validation/test accuracy is computed: `"full"` applies each layer to the
    /// whole graph before the next (layer-wise full-neighbor inference, as DGL's
    /// `inference`; exact GCN normalization with full-graph degrees), `"sampled"`
    /// runs mini-batches of `eval_batch_size` seeds sampled with `eval_fanouts`.
    pub eval_mode: String,
    /// Fanouts for `eval_mode = "sampled"`; empty means every neighbor at every layer.
    pub eval_fanouts: Vec<i64>,
    /// Seeds per training batch (≥ 1).
    pub batch_size: usize,
    /// Seeds per evaluation batch (≥ 1).
    pub eval_batch_size: usize,
    /// Epochs (≥ 1).
    pub epochs: usize,
    /// Adam learning rate (> 0).
    pub lr: f64,
    /// L2 weight decay added to the gradient, as `torch.optim.Adam` (≥ 0).
    pub weight_decay: f64,
    /// Evaluate validation and test accuracy every this many epochs (0: only at the end).
    pub eval_every: usize,
    /// Input-feature representation for the first layer: `"auto"` keeps a sparse
    /// (CSR) copy when at most `sparse_threshold` of the values are non-zero (e.g.
    /// bag-of-words features), `"on"` always, `"off"` never. Results are the same
    /// either way up to float rounding; sparse skips the multiplications by zero.
    pub sparse_features: String,
    /// Density at or below which `sparse_features = "auto"` goes sparse, in [0, 1].
    pub sparse_threshold: f64,
    /// Seed of initialization, shuffling, sampling and dropout.
    pub seed: u64,
    /// Worker threads (0: all cores).
    pub threads: usize,
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            fanouts: vec![10, 10],
            eval_mode: "full".into(),
            eval_fanouts: Vec::new(),
            batch_size: 1024,
            eval_batch_size: 4096,
            epochs: 10,
            lr: 0.003,
            weight_decay: 0.0,
            eval_every: 1,
            sparse_features: "auto".into(),
            sparse_threshold: 0.1,
            seed: 0,
            threads: 0,
        }
    }
}

fn range_err(key: &str, expected: &str, found: impl std::fmt::Display) -> Error {
    Error::invalid_argument(key, format!("expected {expected}, found {found}"))
}

fn fanouts(key: &str, v: &[i64]) -> Result<Vec<u32>> {
    v.iter()
        .map(|&f| match f {
            -1 => Ok(ALL_NEIGHBORS),
            1..=0xFFFF_FFFE => Ok(f as u32),
            _ => Err(range_err(key, "positive fanouts or -1 (all neighbors)", f)),
        })
        .collect()
}

impl TrainConfig {
    /// Parses a TOML string; `origin` names it in errors (a file path or "--set").
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self> {
        Self::from_toml_with_overrides(text, origin, &[])
    }

    /// Parses a TOML string and applies `key=value` overrides (dotted keys, values in
    /// TOML syntax; a bare word is taken as a string), then validates.
    pub fn from_toml_with_overrides(
        text: &str,
        origin: &Path,
        overrides: &[String],
    ) -> Result<Self> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| Error::format(origin, e.to_string()))?;
        for o in overrides {
            apply_override(&mut table, o)?;
        }
        let cfg: TrainConfig = table
            .try_into()
            .map_err(|e: toml::de::Error| Error::format(origin, e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads a TOML file (see [`TrainConfig::from_toml_with_overrides`]).
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_toml_with_overrides(&text, path, overrides)
    }

    /// The effective configuration as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot print config: {e}\n"))
    }

    /// The model kind.
    pub fn model_kind(&self) -> Result<ModelKind> {
        match self.model.kind.as_str() {
            "gcn" => Ok(ModelKind::Gcn),
            "sage" => Ok(ModelKind::Sage),
            "gat" => Ok(ModelKind::Gat),
            other => Err(range_err(
                "model.kind",
                "\"gcn\", \"sage\" or \"gat\"",
                format!("\"{other}\""),
            )),
        }
    }

    /// Training fanouts as the sampler takes them.
    pub fn train_fanouts(&self) -> Result<Vec<u32>> {
        fanouts("train.fanouts", &self.train.fanouts)
    }

    /// Evaluation fanouts (every neighbor when not configured).
    pub fn eval_fanouts(&self) -> Result<Vec<u32>> {
        if self.train.eval_fanouts.is_empty() {
            Ok(vec![ALL_NEIGHBORS; self.model.layers])
        } else {
            fanouts("train.eval_fanouts", &self.train.eval_fanouts)
        }
    }

    /// Checks every range; errors name the key, the allowed range and the value.
    pub fn validate(&self) -> Result<()> {
        self.model_kind()?;
        let m = &self.model;
        let t = &self.train;
        let s = &self.data.synthetic;
        if m.layers == 0 {
            return Err(range_err("model.layers", "at least 1", m.layers));
        }
        if m.hidden == 0 {
            return Err(range_err("model.hidden", "at least 1", m.hidden));
        }
        if m.heads == 0 {
            return Err(range_err("model.heads", "at least 1", m.heads));
        }
        if m.kind == "gat" && !m.hidden.is_multiple_of(m.heads) {
            return Err(range_err(
                "model.hidden",
                &format!("a multiple of model.heads = {}", m.heads),
                m.hidden,
            ));
        }
        if !(0.0..1.0).contains(&m.dropout) {
            return Err(range_err(
                "model.dropout",
                "a probability in [0, 1)",
                m.dropout,
            ));
        }
        let f = self.train_fanouts()?;
        if f.len() != m.layers {
            return Err(range_err(
                "train.fanouts",
                &format!("one fanout per layer (model.layers = {})", m.layers),
                format!("{} fanouts", f.len()),
            ));
        }
        let ef = self.eval_fanouts()?;
        if ef.len() != m.layers {
            return Err(range_err(
                "train.eval_fanouts",
                &format!(
                    "empty or one fanout per layer (model.layers = {})",
                    m.layers
                ),
                format!("{} fanouts", ef.len()),
            ));
        }
        if t.eval_mode != "full" && t.eval_mode != "sampled" {
            return Err(range_err(
                "train.eval_mode",
                "\"full\" or \"sampled\"",
                format!("\"{}\"", t.eval_mode),
            ));
        }
        if !["auto", "on", "off"].contains(&t.sparse_features.as_str()) {
            return Err(range_err(
                "train.sparse_features",
                "\"auto\", \"on\" or \"off\"",
                format!("\"{}\"", t.sparse_features),
            ));
        }
        if !(0.0..=1.0).contains(&t.sparse_threshold) {
            return Err(range_err(
                "train.sparse_threshold",
                "[0, 1]",
                t.sparse_threshold,
            ));
        }
        if t.batch_size == 0 {
            return Err(range_err("train.batch_size", "at least 1", t.batch_size));
        }
        if t.eval_batch_size == 0 {
            return Err(range_err(
                "train.eval_batch_size",
                "at least 1",
                t.eval_batch_size,
            ));
        }
        if t.epochs == 0 {
            return Err(range_err("train.epochs", "at least 1", t.epochs));
        }
        if !(t.lr > 0.0 && t.lr.is_finite()) {
            return Err(range_err("train.lr", "a finite number > 0", t.lr));
        }
        if !(t.weight_decay >= 0.0 && t.weight_decay.is_finite()) {
            return Err(range_err(
                "train.weight_decay",
                "a finite number ≥ 0",
                t.weight_decay,
            ));
        }
        if self.data.path.is_none() {
            if s.vertices < 2 || s.vertices > u32::MAX as usize {
                return Err(range_err("data.synthetic.vertices", "2..2^32", s.vertices));
            }
            if s.classes == 0 {
                return Err(range_err("data.synthetic.classes", "at least 1", s.classes));
            }
            if s.dim == 0 {
                return Err(range_err("data.synthetic.dim", "at least 1", s.dim));
            }
            if !(0.0..=1.0).contains(&s.homophily) {
                return Err(range_err("data.synthetic.homophily", "[0, 1]", s.homophily));
            }
            if !(s.signal >= 0.0 && s.signal.is_finite()) {
                return Err(range_err(
                    "data.synthetic.signal",
                    "a finite number ≥ 0",
                    s.signal,
                ));
            }
        }
        Ok(())
    }
}

/// Applies one `a.b.c=value` override to a TOML table.
fn apply_override(table: &mut toml::Table, assignment: &str) -> Result<()> {
    let Some((key, raw)) = assignment.split_once('=') else {
        return Err(Error::invalid_argument(
            "--set",
            format!("`{assignment}`: expected key=value, e.g. train.epochs=5"),
        ));
    };
    let key = key.trim();
    let raw = raw.trim();
    // Parse the value as TOML; a bare word becomes a string.
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(Error::invalid_argument(
            "--set",
            format!("`{key}` is not a dotted key"),
        ));
    }
    let mut cur = table;
    for p in &parts[..parts.len() - 1] {
        let entry = cur
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = entry.as_table_mut().ok_or_else(|| {
            Error::invalid_argument("--set", format!("`{key}`: `{p}` is not a table"))
        })?;
    }
    cur.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<TrainConfig> {
        TrainConfig::from_toml(s, Path::new("t.toml"))
    }

    #[test]
    fn empty_file_gives_defaults_and_round_trips() {
        let c = parse("").unwrap();
        assert_eq!(c, TrainConfig::default());
        let back = parse(&c.to_toml()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_the_key() {
        let e = parse("[train]\nepoch = 3\n").unwrap_err().to_string();
        assert!(e.contains("t.toml") && e.contains("epoch"), "{e}");
        let e = parse("[model]\nhidden = \"big\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.toml") && e.contains("hidden"), "{e}");
        let e = parse("[nope]\n").unwrap_err().to_string();
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn ranges_are_checked() {
        for (toml, key) in [
            ("[model]\nkind = \"mlp\"", "model.kind"),
            ("[model]\ndropout = 1.0", "model.dropout"),
            ("[model]\nlayers = 3", "train.fanouts"),
            (
                "[model]\nkind = \"gat\"\nhidden = 10\nheads = 4",
                "model.hidden",
            ),
            ("[train]\nfanouts = [10, 0]", "train.fanouts"),
            ("[train]\nlr = 0.0", "train.lr"),
            ("[train]\neval_mode = \"exact\"", "train.eval_mode"),
            ("[train]\nbatch_size = 0", "train.batch_size"),
            (
                "[data.synthetic]\nhomophily = 2.0",
                "data.synthetic.homophily",
            ),
        ] {
            let e = parse(toml).unwrap_err().to_string();
            assert!(e.contains(key), "{toml}: {e}");
        }
    }

    #[test]
    fn overrides_apply_with_toml_values() {
        let c = TrainConfig::from_toml_with_overrides(
            "[train]\nepochs = 3\n",
            Path::new("t.toml"),
            &[
                "train.epochs=7".into(),
                "model.kind=gcn".into(),
                "train.fanouts=[5,-1]".into(),
                "data.path=\"x.tds\"".into(),
            ],
        )
        .unwrap();
        assert_eq!(c.train.epochs, 7);
        assert_eq!(c.model.kind, "gcn");
        assert_eq!(c.train_fanouts().unwrap(), vec![5, ALL_NEIGHBORS]);
        assert_eq!(c.data.path.as_deref(), Some(Path::new("x.tds")));
        let e = TrainConfig::from_toml_with_overrides("", Path::new("t"), &["x".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--set"), "{e}");
    }
}
