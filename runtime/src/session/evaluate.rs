//! What the session computes from the weights without training them:
//! validation and test accuracy, logits and predictions, embeddings.
//!
//! - **Full-graph** (`train.eval_mode = "full"`, predictions, embeddings): every
//!   layer is applied to the whole graph before the next (layer-wise
//!   full-neighbor inference, DGL's `inference` pattern), on the executor's
//!   device. Evaluation streams it in row blocks through layer files
//!   (`session/infer.rs`, as [`Trainer::infer_to_file`] does); predictions and
//!   embeddings, which return every vertex's rows anyway, compute it in memory
//!   with the whole graph as one block. In a job over several machines (`dist.full_eval`) it is sharded:
//!   rank `r` computes every layer's rows of its vertex range over the one-hop
//!   block of that range, the ranks exchange the hidden rows after each layer
//!   below the top (one all-gather), and the correct counts are summed. GCN
//!   normalizes by each source's degree in the whole graph: its input rows are
//!   scaled by √(block degree / graph degree) to undo the block's own
//!   normalization (equal to full-graph inference up to rounding).
//! - **Sampled** (`"sampled"`, [`Trainer::evaluate`]): mini-batches of shuffled
//!   seeds sampled with `train.eval_fanouts`, no dropout; in a job every rank
//!   evaluates its share of every batch and the counts are summed.

use std::sync::Arc;

use cpu_ops::{accuracy_count, derive_seed, BlockView, MatRef, Rng, SamplerScratch};
use ndarray::Array2;

use super::Trainer;
use crate::config::EvalMode;
use crate::dist::share;
use crate::embedding::Embeddings;
use crate::error::{Error, Result};

fn kernel(context: &'static str) -> impl Fn(cpu_ops::CpuOpsError) -> Error {
    move |e| Error::cpu_ops(context, e)
}

/// This rank's one-hop block for sharded full-graph evaluation.
pub(super) struct ShardBlock {
    /// Every neighbor of the rank's vertex range.
    block: cpu_ops::Block,
    /// GCN only: each source's input scale, √(block degree / graph degree).
    scale: Option<Vec<f32>>,
}

impl Trainer {
    /// Logits of every vertex by layer-wise full-graph inference (no dropout): a
    /// `num_vertices × num_classes` matrix, row `v` for vertex `v`. Computed anew
    /// on every call; [`Trainer::predict`] keeps them per weight version.
    pub fn full_graph_logits(&mut self) -> Result<Array2<f32>> {
        let n = self.ds.num_vertices();
        let c = self.ds.num_classes as usize;
        let flat = self.full_graph_logits_flat()?;
        Array2::from_shape_vec((n, c), flat).map_err(|e| Error::Worker {
            worker: "full-graph inference".into(),
            what: format!("internal: its logits are not {n} × {c}: {e}"),
        })
    }

    /// [`Trainer::full_graph_logits`], row-major in one vector.
    fn full_graph_logits_flat(&mut self) -> Result<Vec<f32>> {
        self.no_logits_for_links("full-graph logits")?;
        self.check_every_row("full-graph logits")?;
        let layers = self.cfg.model.layers;
        let pool = Arc::clone(&self.pool);
        pool.install(|| self.state()?.full_graph_forward(layers))
    }

    /// The logits of `ids` (each below the vertex count), in order: an `ids.len()
    /// × num_classes` matrix, the rows of [`Trainer::full_graph_logits`] (the
    /// predicted class of a row is its largest entry). The full-graph logits are
    /// computed once per weight version and kept until the next training step or
    /// checkpoint load, so serving many requests costs one inference.
    pub fn predict(&mut self, ids: &[u32]) -> Result<Array2<f32>> {
        self.check_ids(ids)?;
        if self.logits.is_none() {
            let flat = self.full_graph_logits_flat()?;
            let c = self.ds.num_classes as usize;
            self.logits = Some(Embeddings::new(flat, c, self.steps())?);
        }
        match &self.logits {
            Some(table) => table.gather(ids),
            None => unreachable!("computed above"),
        }
    }

    /// An error naming the first id in `ids` that is not below the vertex count.
    pub(super) fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let n = self.ds.num_vertices();
        match ids.iter().enumerate().find(|(_, &v)| v as usize >= n) {
            Some((i, &v)) => Err(Error::invalid_argument(
                "ids",
                format!(
                    "vertex id {v} at position {i} is out of range: the dataset has {n} vertices (ids 0..{n})"
                ),
            )),
            None => Ok(()),
        }
    }

    /// Full-graph computations read every feature row: an error on a rank that
    /// holds only its partition.
    pub(super) fn check_every_row(&self, what: &str) -> Result<()> {
        if self.dist.features.is_some() {
            return Err(Error::invalid_argument(
                "dist.features",
                format!(
                    "{what} read every feature row, and this rank holds only its partition \
                     (dist.features = \"partitioned\"); compute them in a one-rank run from \
                     the checkpoint"
                ),
            ));
        }
        Ok(())
    }

    /// In a distributed job, checks that every rank holds the same weights (they
    /// apply the same steps to the same summed gradients; a difference is a bug
    /// or a rank that trained something else).
    pub(super) fn check_ranks_agree(&self) -> Result<()> {
        if self.dist.ranks() <= 1 {
            return Ok(());
        }
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for t in self.params()? {
            h.update(bytemuck::cast_slice(&t));
        }
        if !crate::dist::ranks_agree(&*self.dist.comm, h.digest())? {
            return Err(Error::Dist {
                what: format!(
                    "rank {}: the ranks' weights differ after epoch {} (they must apply the \
                     same steps)",
                    self.dist.comm.rank(),
                    self.pos.epoch
                ),
            });
        }
        Ok(())
    }

    /// Every vertex's embedding at the current weights: the output of the layer
    /// below the classifier by full-neighbor, layer-wise inference over the whole
    /// graph (see [`crate::Embeddings`]). Computed once per weight version and
    /// cached until the next training step or checkpoint load; the snapshot is
    /// cheap to clone and can be served from other threads.
    pub fn embedding_table(&mut self) -> Result<Embeddings> {
        if let Some(e) = &self.embeddings {
            return Ok(e.clone());
        }
        self.check_every_row("embeddings")?;
        let layers = self.embedding_layers();
        let n = self.ds.num_vertices();
        let e = if layers == 0 {
            let f = &self.ds.features;
            Embeddings::new(f.as_slice().to_vec(), f.dim(), self.steps())?
        } else {
            let pool = Arc::clone(&self.pool);
            let h = pool.install(|| self.state()?.full_graph_forward(layers))?;
            let dim = h.len() / n.max(1);
            Embeddings::new(h, dim, self.steps())?
        };
        self.embeddings = Some(e.clone());
        Ok(e)
    }

    /// The embeddings of `ids` (each below the vertex count), in order: an
    /// `ids.len() × dim` matrix, where `dim` is `model.hidden` (the input feature
    /// width for a 1-layer model). See [`Trainer::embedding_table`].
    pub fn embeddings(&mut self, ids: &[u32]) -> Result<Array2<f32>> {
        self.check_ids(ids)?;
        self.embedding_table()?.gather(ids)
    }

    /// The layers whose output is a vertex's embedding: those below the
    /// classifier, or a link-prediction model's whole encoder.
    pub(super) fn embedding_layers(&self) -> usize {
        if self.link.is_some() {
            self.cfg.model.layers
        } else {
            self.cfg.model.layers - 1
        }
    }

    /// An error naming what a link-prediction model does not have: class
    /// logits (`what`).
    pub(super) fn no_logits_for_links(&self, what: &str) -> Result<()> {
        if self.link.is_some() {
            return Err(Error::invalid_argument(
                "model.task",
                format!(
                    "{what}: a link-prediction model (model.task = \"link\") has no class \
                     logits; use Trainer::score_edges or the embeddings"
                ),
            ));
        }
        Ok(())
    }

    /// Accuracy of `logits` (all vertices) on `ids` (what the in-memory
    /// full-graph evaluation computed; the streamed one is tested against it).
    #[cfg(test)]
    pub(super) fn accuracy_on(&self, logits: &[f32], ids: &[u32]) -> Result<f64> {
        if ids.is_empty() {
            return Ok(0.0);
        }
        Ok(self.correct_on(logits, 0, ids)? as f64 / ids.len() as f64)
    }

    /// Correct predictions among `ids`, whose logits are rows `v − first` of
    /// `logits` (`num_classes` wide).
    fn correct_on(&self, logits: &[f32], first: usize, ids: &[u32]) -> Result<usize> {
        let c = self.ds.num_classes as usize;
        let rows: Vec<f32> = ids
            .iter()
            .flat_map(|&v| {
                let r = v as usize - first;
                logits[r * c..(r + 1) * c].iter().copied()
            })
            .collect();
        accuracy_count(
            MatRef::new(&rows, ids.len(), c).map_err(kernel("logits"))?,
            &self.labels_of(ids),
        )
        .map_err(kernel("accuracy"))
    }

    fn labels_of(&self, ids: &[u32]) -> Vec<u32> {
        ids.iter().map(|&s| self.ds.labels[s as usize]).collect()
    }

    /// Validation and test accuracy, as `train.eval_mode` says (a
    /// link-prediction model: [`Trainer::evaluate_link`]).
    pub fn evaluate_val_test(&mut self) -> Result<(f64, f64)> {
        self.no_logits_for_links("Trainer::evaluate_val_test (accuracy)")?;
        let pool = Arc::clone(&self.pool);
        pool.install(|| self.evaluate_val_test_here())
    }

    pub(super) fn evaluate_val_test_here(&mut self) -> Result<(f64, f64)> {
        let tracer = self.tracer.clone();
        let _eval = tracer
            .slice_on(self.eval_track, "eval")
            .epoch(self.pos.epoch as u64);
        if self.cfg.train.eval_mode == EvalMode::Full {
            if self.dist.shard_full_eval {
                return self.evaluate_full_sharded();
            }
            // Streamed through layer files: no activation matrix of every
            // vertex (`session/infer.rs`).
            self.evaluate_full_streamed()
        } else {
            let (v, t) = (self.splits.val.clone(), self.splits.test.clone());
            Ok((self.evaluate_here(&v)?, self.evaluate_here(&t)?))
        }
    }

    /// Full-graph validation and test accuracy in a distributed job, sharded
    /// (module doc).
    fn evaluate_full_sharded(&mut self) -> Result<(f64, f64)> {
        let (rank, ranks) = self.rank();
        let n = self.ds.num_vertices();
        let own = share(n, rank, ranks);
        let shard = match self.dist.shard_block.take() {
            Some(s) => s,
            None => {
                let _s = self.tracer.slice("shard block");
                self.shard_block(own.clone())?
            }
        };
        let out = self.shard_forward(&shard);
        self.dist.shard_block = Some(shard);
        let out = out?;
        let mut counts = [0.0f64; 2];
        for (slot, ids) in counts.iter_mut().zip([&self.splits.val, &self.splits.test]) {
            let mine: Vec<u32> = ids
                .iter()
                .copied()
                .filter(|&v| own.contains(&(v as usize)))
                .collect();
            *slot = self.correct_on(&out, own.start, &mine)? as f64;
        }
        self.dist.comm.all_reduce_sum_f64(&mut counts)?;
        let acc = |k: f64, ids: &[u32]| {
            if ids.is_empty() {
                0.0
            } else {
                k / ids.len() as f64
            }
        };
        Ok((
            acc(counts[0], &self.splits.val),
            acc(counts[1], &self.splits.test),
        ))
    }

    /// Every layer over this rank's shard block, the hidden rows exchanged
    /// between layers: the logits of the rank's vertex range.
    fn shard_forward(&mut self, shard: &ShardBlock) -> Result<Vec<f32>> {
        let ShardBlock { block, scale } = shard;
        let n = self.ds.num_vertices();
        let ranks = self.dist.ranks();
        let src = block.src_ids();
        let scale_rows = |x: &mut [f32], dim: usize| {
            if let Some(s) = scale {
                for (row, &c) in x.chunks_mut(dim).zip(s) {
                    row.iter_mut().for_each(|v| *v *= c);
                }
            }
        };
        let layers = self.cfg.model.layers;
        let (comm, tracer) = (Arc::clone(&self.dist.comm), self.tracer.clone());
        let mut h: Vec<f32> = Vec::new();
        let mut out = Vec::new();
        for l in 0..layers {
            // Layer 0 reads the features of the block's sources (GCN: scaled).
            let x = if l == 0 {
                scale.clone().unwrap_or_default()
            } else {
                let dim = h.len() / n.max(1);
                let mut x = Vec::with_capacity(src.len() * dim);
                for &v in src {
                    x.extend_from_slice(&h[v as usize * dim..(v as usize + 1) * dim]);
                }
                scale_rows(&mut x, dim);
                x
            };
            out = self.state()?.layer_rows(l, block, &x)?;
            if l + 1 < layers {
                // Every rank's rows, in rank (= vertex) order.
                let mut s = tracer.slice("allgather");
                s.set_bytes((out.len() * 4 * ranks) as u64);
                let send: Vec<f32> = (0..ranks).flat_map(|_| out.iter().copied()).collect();
                let (all, _) = comm.all_to_all_f32(&send, &vec![out.len(); ranks])?;
                h = all;
            }
        }
        Ok(out)
    }

    /// The one-hop block of the vertices `own` (every neighbor) and, for GCN,
    /// each source's input scale: its normalization reads the source's degree in
    /// the block, self loops included; inference over the whole graph reads its
    /// degree in the graph.
    fn shard_block(&self, own: std::ops::Range<usize>) -> Result<ShardBlock> {
        let g = &self.ds.graph;
        let n = g.num_vertices();
        let dst: Vec<u32> = (own.start as u32..own.end as u32).collect();
        let mut scratch = SamplerScratch::new(n);
        let block = cpu_ops::sample_hop(g, &dst, cpu_ops::ALL_NEIGHBORS, 0, None, &mut scratch)
            .map_err(kernel("full-graph block of this rank's vertices"))?;
        let view = BlockView::new(block.num_src(), block.indptr(), block.indices())
            .map_err(kernel("full-graph block"))?;
        let nd = dst.len();
        let scale = (self.cfg.model.kind == cpu_ops::ModelKind::Gcn).then(|| {
            let mut deg = vec![0u32; n];
            for &v in g.indices().iter() {
                deg[v as usize] += 1;
            }
            block
                .src_ids()
                .iter()
                .enumerate()
                .map(|(j, &v)| {
                    let in_block = view.out_degree(j) + usize::from(j < nd);
                    let in_graph = deg[v as usize] as usize + 1;
                    (in_block as f64 / in_graph as f64).sqrt() as f32
                })
                .collect()
        });
        Ok(ShardBlock { block, scale })
    }

    /// Accuracy on `ids` by mini-batches sampled with the evaluation fanouts (seeds
    /// shuffled, so batches are random subsets), no dropout. Ids must be below the
    /// vertex count.
    pub fn evaluate(&mut self, ids: &[u32]) -> Result<f64> {
        self.no_logits_for_links("Trainer::evaluate (accuracy)")?;
        let n = self.ds.num_vertices();
        if let Some((i, &v)) = ids.iter().enumerate().find(|(_, &v)| v as usize >= n) {
            return Err(Error::invalid_argument(
                "ids",
                format!(
                    "vertex id {v} at position {i} is out of range: the dataset has {n} vertices"
                ),
            ));
        }
        let pool = Arc::clone(&self.pool);
        pool.install(|| self.evaluate_here(ids))
    }

    fn evaluate_here(&mut self, ids: &[u32]) -> Result<f64> {
        if ids.is_empty() {
            return Ok(0.0);
        }
        let mut ids = ids.to_vec();
        Rng::new(derive_seed(self.cfg.train.seed, 6_000_000)).shuffle(&mut ids);
        let mut correct = 0usize;
        let c = self.ds.num_classes as usize;
        let (rank, ranks) = self.rank();
        for (k, whole) in ids.chunks(self.cfg.train.eval_batch_size).enumerate() {
            let seed = derive_seed(self.cfg.train.seed, 7_000_000 + k as u64);
            // Each rank evaluates its share of every batch; the counts are summed.
            let owned = self.dist.features.as_ref().and_then(|f| f.seeds_of(whole));
            let chunk = owned
                .as_deref()
                .unwrap_or(&whole[share(whole.len(), rank, ranks)]);
            if chunk.is_empty() {
                if let Some(pf) = &self.dist.features {
                    // The exchange is collective: take part with no rows.
                    pf.gather(&self.ds, &[], &mut Vec::new())?;
                }
                continue;
            }
            let logits = self.state()?.sampled_logits(chunk, seed)?;
            correct += accuracy_count(
                MatRef::new(&logits, chunk.len(), c).map_err(kernel("logits"))?,
                &self.labels_of(chunk),
            )
            .map_err(kernel("accuracy"))?;
        }
        if ranks > 1 {
            let mut sum = [correct as f64];
            self.dist.comm.all_reduce_sum_f64(&mut sum)?;
            correct = sum[0] as usize;
        }
        Ok(correct as f64 / ids.len() as f64)
    }
}
