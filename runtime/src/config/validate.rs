//! The configuration's ranges: [`TrainConfig::validate`] checks every key once
//! all layers are applied; an error names the key, the allowed range and the
//! value.

use super::*;
use crate::error::Result;

impl TrainConfig {
    /// Checks every range; errors name the key, the allowed range and the value.
    pub fn validate(&self) -> Result<()> {
        let m = &self.model;
        let t = &self.train;
        let s = &self.data.synthetic;
        in_range("model.layers", m.layers, 1, MAX_LAYERS)?;
        in_range("model.hidden", m.hidden, 1, MAX_HIDDEN)?;
        in_range("model.heads", m.heads, 1, MAX_HIDDEN)?;
        if m.kind == ModelKind::Gat && !m.hidden.is_multiple_of(m.heads) {
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

        if !(0.0..=1.0).contains(&t.sparse_threshold) {
            return Err(range_err(
                "train.sparse_threshold",
                "[0, 1]",
                t.sparse_threshold,
            ));
        }
        in_range("train.batch_size", t.batch_size, 1, MAX_BATCH)?;
        let l = &self.link;
        in_range("link.negatives", l.negatives, 1, MAX_NEGATIVES)?;
        in_range("link.eval_negatives", l.eval_negatives, 1, MAX_NEGATIVES)?;
        if l.metrics.is_empty() {
            return Err(range_err(
                "link.metrics",
                "at least one of \"mrr\", \"hits@K\", \"auc\"",
                "[]",
            ));
        }
        if let Some(bad) = l.metrics.iter().find(|m| LinkMetric::parse(m).is_none()) {
            return Err(range_err(
                "link.metrics",
                "\"mrr\", \"hits@K\" (K ≥ 1) or \"auc\"",
                format!("\"{bad}\""),
            ));
        }
        in_range("train.eval_batch_size", t.eval_batch_size, 1, MAX_BATCH)?;
        in_range("train.epochs", t.epochs, 1, MAX_EPOCHS)?;
        in_range("train.eval_every", t.eval_every, 0, TOML_INT_MAX)?;
        in_range(
            "train.checkpoint_every",
            t.checkpoint_every,
            0,
            TOML_INT_MAX,
        )?;
        in_range("train.seed", t.seed, 0, TOML_INT_MAX)?;
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
        if let Some(threads) = t.threads {
            in_range("train.threads", threads, 0, MAX_COMPUTE_THREADS)?;
            if self.threads.compute != 0 && self.threads.compute != threads {
                return Err(range_err(
                    "train.threads",
                    &format!(
                        "the same value as threads.compute = {} (train.threads is its deprecated spelling)",
                        self.threads.compute
                    ),
                    threads,
                ));
            }
        }
        in_range(
            "threads.compute",
            self.threads.compute,
            0,
            MAX_COMPUTE_THREADS,
        )?;
        in_range("device.ordinal", self.device.ordinal, 0, MAX_DEVICE_ORDINAL)?;
        if self.device.cache_bytes != super::CACHE_BYTES_AUTO {
            in_range(
                "device.cache_bytes",
                self.device.cache_bytes,
                0,
                TOML_INT_MAX,
            )?;
        }
        in_range(
            "device.memory_budget_bytes",
            self.device.memory_budget_bytes,
            0,
            TOML_INT_MAX,
        )?;
        // A lag of up to 1024 batches: the loss slots are 16 bytes each.
        in_range("device.loss_lag", self.device.loss_lag, 0, 1024)?;
        in_range("data.synthetic.seed", s.seed, 0, TOML_INT_MAX)?;
        self.validate_orchestration()?;
        self.validate_dist()?;
        if self.data.path.is_none() {
            in_range("data.synthetic.vertices", s.vertices, 2, u32::MAX)?;
            in_range("data.synthetic.edges", s.edges, 0, MAX_SYNTHETIC_VALUES)?;
            in_range("data.synthetic.classes", s.classes, 1, s.vertices)?;
            let values = s.vertices.checked_mul(s.dim);
            if s.dim == 0 || values.is_none_or(|v| v as u64 > MAX_SYNTHETIC_VALUES) {
                return Err(range_err(
                    "data.synthetic.dim",
                    "at least 1, with vertices × dim ≤ 2^58",
                    s.dim,
                ));
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

impl TrainConfig {
    /// Checks `[dist]`: ranges, and what partitioned features cannot serve.
    fn validate_dist(&self) -> Result<()> {
        let d = &self.dist;
        in_range(
            "dist.remote_cache_rows",
            d.remote_cache_rows,
            0,
            u32::MAX as usize,
        )?;
        if d.features == DistFeatures::Partitioned {
            if self.train.eval_mode == EvalMode::Full {
                return Err(range_err(
                    "train.eval_mode",
                    "\"sampled\" with dist.features = \"partitioned\" (full-graph \
                     evaluation reads every feature row)",
                    self.train.eval_mode,
                ));
            }
        } else if d.remote_cache_rows > 0 {
            return Err(range_err(
                "dist.remote_cache_rows",
                "0 unless dist.features = \"partitioned\"",
                d.remote_cache_rows,
            ));
        } else if let Some(p) = &d.partition_file {
            return Err(range_err(
                "dist.partition_file",
                "no partition file unless dist.features = \"partitioned\"",
                p.display(),
            ));
        }
        Ok(())
    }

    /// Checks `[orchestration]`: ranges, names, and that reuse has what it needs.
    fn validate_orchestration(&self) -> Result<()> {
        let o = &self.orchestration;
        if !(0.0..=1.0).contains(&o.hot_ratio) {
            return Err(range_err("orchestration.hot_ratio", "[0, 1]", o.hot_ratio));
        }
        in_range(
            "orchestration.presample_epochs",
            o.presample_epochs,
            1,
            MAX_PRESAMPLE_EPOCHS,
        )?;
        in_range(
            "orchestration.super_batch",
            o.super_batch,
            1,
            MAX_SUPER_BATCH,
        )?;
        in_range(
            "orchestration.cpu_workers",
            o.cpu_workers,
            1,
            MAX_COMPUTE_THREADS,
        )?;
        in_range(
            "orchestration.staleness_bound",
            o.staleness_bound,
            0,
            TOML_INT_MAX,
        )?;
        if o.policy != Policy::Fixed(Orchestration::Layer) && !o.is_auto() && o.hot_ratio > 0.0 {
            return Err(range_err(
                "orchestration.hot_ratio",
                &format!(
                    "0 with orchestration.policy = \"{}\": step-based placements do not reuse embeddings (only \"layer\" does)",
                    o.policy
                ),
                o.hot_ratio,
            ));
        }
        if o.hot_ratio > 0.0 && self.model.layers < 2 {
            return Err(range_err(
                "orchestration.hot_ratio",
                "0 for a 1-layer model (the bottom layer's output is the logits; reuse needs model.layers ≥ 2)",
                o.hot_ratio,
            ));
        }
        Ok(())
    }
}

/// Largest accepted `model.layers`.
pub const MAX_LAYERS: usize = 16;
/// Largest accepted `model.hidden` (and `model.heads`).
pub const MAX_HIDDEN: usize = 1 << 16;
/// Largest accepted `train.batch_size` / `train.eval_batch_size` (vertex ids are u32).
pub const MAX_BATCH: u32 = u32::MAX;
/// Largest accepted `link.negatives` and `link.eval_negatives`.
pub const MAX_NEGATIVES: usize = 1 << 16;
/// Largest accepted `train.epochs`.
pub const MAX_EPOCHS: usize = 1_000_000;
/// Largest integer TOML can hold (64-bit signed): the bound of counts and seeds
/// that must print back into the effective configuration.
pub const TOML_INT_MAX: u64 = i64::MAX as u64;
/// Largest synthetic edge count and `vertices × dim` (the generators' bound).
const MAX_SYNTHETIC_VALUES: u64 = 1 << 58;

/// Fails unless `lo ≤ v ≤ hi`, naming `key` and the inclusive range.
fn in_range<V, H>(key: &str, v: V, lo: u64, hi: H) -> Result<()>
where
    V: TryInto<u64> + std::fmt::Display + Copy,
    H: TryInto<u64>,
{
    let hi = hi.try_into().unwrap_or(u64::MAX);
    match v.try_into() {
        Ok(x) if (lo..=hi).contains(&x) => Ok(()),
        _ => Err(range_err(key, &format!("{lo}..={hi}"), v)),
    }
}
