//! Link prediction in the session (`model.task = "link"`): the validation and
//! test sets, their evaluation, and scoring edges for a caller.
//!
//! # Evaluation
//! 1. **Sets** (made once, when the trainer is built): every validation or
//!    test positive with `k` negatives that keep its source — the store's fixed
//!    negatives when it has them, else `link.eval_negatives` destinations drawn
//!    uniformly with the same counter-based draw training uses, from
//!    `derive_seed(train.seed, EVAL_NEGATIVES + split)`: fixed per split and
//!    seed, so every epoch and every run ranks against the same negatives.
//! 2. **Scores**, as `train.eval_mode` says:
//!    - `"sampled"` (the default): batches of `train.eval_batch_size`
//!      positives with their negatives; the seeds are their endpoints
//!      (deduplicated), sampled with `train.eval_fanouts`, encoded and scored
//!      by the decoder on the executor's device (no dropout);
//!    - `"full"`: the encoder's output rows of every vertex the set names,
//!      by streamed full-graph inference (`session/infer.rs`: the layers below
//!      the last through layer files, the last over those vertices only), then
//!      scored by the decoder in chunks.
//! 3. **Metrics** (`link.metrics`, `task/metrics.rs`): MRR, Hits@K, AUC.
//!
//! In a job of several ranks every rank evaluates every set (the same scores
//! everywhere; no collective).

use std::collections::HashMap;
use std::sync::Arc;

use cpu_ops::derive_seed;

use super::Trainer;
use crate::config::EvalMode;
use crate::data::dataset::Dataset;
use crate::error::{Error, Result};
use crate::task::link::{assemble, NegativeDist};
use crate::task::{metrics, LinkMetric, MetricValue};

/// The stream of `train.seed` evaluation negatives are drawn from (plus the
/// split: 0 validation, 1 test).
const EVAL_NEGATIVES: u64 = 8_000_000;

/// The stream of `train.seed` sampled-evaluation batches sample with.
const EVAL_BATCHES: u64 = 9_000_000;

/// Most pairs scored at once by full-graph evaluation and
/// [`Trainer::score_edges`].
const SCORE_CHUNK: usize = 1 << 16;

/// A validation or test set as evaluation ranks it (module doc, step 1).
#[derive(Clone, Debug)]
pub(super) struct EvalSet {
    /// The positives' sources.
    pub src: Vec<u32>,
    /// The positives' destinations.
    pub dst: Vec<u32>,
    /// `k` negative destinations per positive, in positive order.
    pub neg: Vec<u32>,
    /// Negatives per positive.
    pub k: usize,
}

/// What link evaluation needs (made once).
#[derive(Clone, Debug)]
pub(super) struct LinkEval {
    /// The validation and test sets.
    pub sets: [EvalSet; 2],
    /// `link.metrics`, parsed.
    pub metrics: Vec<LinkMetric>,
}

impl LinkEval {
    /// Step 1 for `ds` (which has an edge split).
    pub fn new(
        ds: &Dataset,
        eval_negatives: usize,
        seed: u64,
        metrics: Vec<LinkMetric>,
    ) -> Result<Self> {
        let split = ds.edges.as_ref().ok_or_else(|| {
            Error::invalid_argument("model.task", "internal: a link task without an edge split")
        })?;
        let n = ds.num_vertices();
        let make =
            |which: u64, list: &crate::data::EdgeList, fixed: Option<&cpu_ops::HostArray<u32>>| {
                let (src, dst): (Vec<u32>, Vec<u32>) = list.iter().unzip();
                match fixed {
                    Some(neg) if !src.is_empty() => EvalSet {
                        k: neg.len() / src.len(),
                        neg: neg.as_slice().to_vec(),
                        src,
                        dst,
                    },
                    _ => {
                        let uniform = NegativeDist {
                            num_vertices: n,
                            cdf: None,
                        };
                        let k = eval_negatives;
                        let neg = uniform.draw(&src, k, derive_seed(seed, EVAL_NEGATIVES + which));
                        EvalSet { src, dst, neg, k }
                    }
                }
            };
        Ok(Self {
            sets: [
                make(0, &split.val, split.val_neg.as_ref()),
                make(1, &split.test, split.test_neg.as_ref()),
            ],
            metrics,
        })
    }
}

impl Trainer {
    /// The link task's evaluation, or an error naming the method a node
    /// classifier has instead.
    fn link_eval(&self, what: &str) -> Result<&LinkEval> {
        self.link.as_ref().ok_or_else(|| {
            Error::invalid_argument(
                "model.task",
                format!("{what} scores edges of a link-prediction model (model.task = \"link\")"),
            )
        })
    }

    /// Validation and test metrics (`link.metrics`, in order) of a
    /// link-prediction model, as `train.eval_mode` says (module doc).
    pub fn evaluate_link(&mut self) -> Result<[Vec<MetricValue>; 2]> {
        let pool = Arc::clone(&self.pool);
        pool.install(|| self.evaluate_link_here())
    }

    /// [`Trainer::evaluate_link`] on the calling thread's pool.
    pub(super) fn evaluate_link_here(&mut self) -> Result<[Vec<MetricValue>; 2]> {
        let eval = self.link_eval("link evaluation")?.clone();
        let mut out: [Vec<MetricValue>; 2] = Default::default();
        for (slot, set) in out.iter_mut().zip(&eval.sets) {
            let (pos, neg) = match self.cfg.train.eval_mode {
                EvalMode::Sampled => self.set_scores_sampled(set)?,
                EvalMode::Full => self.set_scores_full(set)?,
            };
            *slot = metrics::compute(&eval.metrics, &pos, &neg, set.k);
        }
        Ok(out)
    }

    /// Step 2, sampled: (positive scores, negative scores in positive order).
    fn set_scores_sampled(&mut self, set: &EvalSet) -> Result<(Vec<f32>, Vec<f32>)> {
        let b = self.cfg.train.eval_batch_size.max(1);
        let k = set.k;
        let mut pos = Vec::with_capacity(set.src.len());
        let mut neg = Vec::with_capacity(set.neg.len());
        for (c, start) in (0..set.src.len()).step_by(b).enumerate() {
            let end = (start + b).min(set.src.len());
            let positives = (start..end).map(|i| (set.src[i], set.dst[i]));
            let (seeds, pairs) = assemble(positives, k, |i, j| set.neg[(start + i) * k + j]);
            let seed = derive_seed(self.cfg.train.seed, EVAL_BATCHES + c as u64);
            let scores = self
                .state()?
                .sampled_pair_scores(&seeds, seed, &pairs.src, &pairs.dst)?;
            let m = end - start;
            pos.extend_from_slice(&scores[..m]);
            neg.extend_from_slice(&scores[m..]);
        }
        Ok((pos, neg))
    }

    /// Step 2, full: the encoder's rows of every vertex `set` names, then the
    /// decoder.
    fn set_scores_full(&mut self, set: &EvalSet) -> Result<(Vec<f32>, Vec<f32>)> {
        let k = set.k;
        let src: Vec<u32> = set
            .src
            .iter()
            .copied()
            .chain(set.src.iter().flat_map(|&u| std::iter::repeat_n(u, k)))
            .collect();
        let dst: Vec<u32> = set.dst.iter().chain(&set.neg).copied().collect();
        let scores = self.score_pairs_full(&src, &dst)?;
        let m = set.src.len();
        Ok((scores[..m].to_vec(), scores[m..].to_vec()))
    }

    /// The decoder's scores of pairs `(src[i], dst[i])` (global ids) on the
    /// encoder's full-graph rows of the vertices they name (streamed, module
    /// doc step 2).
    fn score_pairs_full(&mut self, src: &[u32], dst: &[u32]) -> Result<Vec<f32>> {
        let mut ids: Vec<u32> = src.iter().chain(dst).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        let rows = self.last_layer_rows(&ids)?;
        let dim = rows.len() / ids.len().max(1);
        let local: HashMap<u32, u32> = ids
            .iter()
            .enumerate()
            .map(|(i, &v)| (v, i as u32))
            .collect();
        let mut out = Vec::with_capacity(src.len());
        for (s, d) in src.chunks(SCORE_CHUNK).zip(dst.chunks(SCORE_CHUNK)) {
            let ls: Vec<u32> = s.iter().map(|v| local[v]).collect();
            let ld: Vec<u32> = d.iter().map(|v| local[v]).collect();
            out.extend(self.state()?.score_pairs(&rows, dim, &ls, &ld)?);
        }
        Ok(out)
    }

    /// The decoder's score (a logit: the model's belief that the edge exists,
    /// before the sigmoid) of every pair `(src[i], dst[i])`, from the
    /// encoder's full-graph output rows (streamed layer by layer: memory is
    /// the store plus the rows of the vertices named). A link-prediction model
    /// only; ids are checked.
    pub fn score_edges(&mut self, src: &[u32], dst: &[u32]) -> Result<Vec<f32>> {
        self.link_eval("Trainer::score_edges")?;
        if src.len() != dst.len() {
            return Err(Error::invalid_argument(
                "dst",
                format!("{} destinations for {} sources", dst.len(), src.len()),
            ));
        }
        self.check_ids(src)?;
        self.check_ids(dst)?;
        if src.is_empty() {
            return Ok(Vec::new());
        }
        let pool = Arc::clone(&self.pool);
        pool.install(|| self.score_pairs_full(src, dst))
    }
}
