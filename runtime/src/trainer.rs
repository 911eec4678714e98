//! The host training loop: sample → gather → forward → loss → backward → step, on
//! the CPU, for one dataset and one model, with validation and test accuracy.
//!
//! # One epoch
//! 1. Shuffle the training vertices with `(seed, epoch)`; cut batches of
//!    `train.batch_size` seeds.
//! 2. For batch `k`, *prepare* (sample blocks with the training fanouts, gather the
//!    input rows) and *compute* (forward with dropout, softmax cross-entropy on the
//!    seeds' labels, hand-written backward, Adam step). Preparing batch `k+1` runs
//!    concurrently with computing batch `k` (`rayon::join`), so sampling and gather
//!    hide behind the dense math; both still use the one rayon pool.
//! 3. Every `train.eval_every` epochs (and after the last), evaluate validation and
//!    test accuracy without dropout. `train.eval_mode = "full"` (default) applies
//!    each layer to the whole graph before the next — layer-wise full-neighbor
//!    inference, DGL's `inference` pattern: one pass gives every vertex's logits,
//!    and GCN's normalization uses full-graph degrees, independent of how the
//!    evaluated vertices are batched. `"sampled"` evaluates mini-batches of
//!    shuffled seeds sampled with `train.eval_fanouts`.
//!
//! Everything random derives from `train.seed` (initialization, shuffles, sampling,
//! dropout), so a run is reproducible; sampling does not depend on the thread count.

use std::time::Instant;

use cpu_ops::{
    accuracy_count, derive_seed, gather_rows, softmax_cross_entropy, Adam, AdamConfig, BlockView,
    CpuOpsError, MatMut, MatRef, Model, ModelConfig, ModelInput, NeighborSampler, Optimizer, Rng,
    SampledBatch, SamplerScratch, SparseRows, WeightDecay,
};

use crate::config::TrainConfig;
use crate::dataset::{open_dataset, Dataset, SplitSpec, Verify};
use crate::error::{Error, Result};
use crate::generate::{generate_sbm, SbmOptions};
use crate::trace::{FlowId, SliceGuard, Tracer};

/// What one epoch did.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochStats {
    /// 0-based epoch index.
    pub epoch: usize,
    /// Mean training loss over the epoch's batches (weighted by batch size).
    pub loss: f64,
    /// Training accuracy over the epoch's batches (with dropout, as trained).
    pub train_acc: f64,
    /// Validation accuracy, when evaluated this epoch.
    pub val_acc: Option<f64>,
    /// Test accuracy, when evaluated this epoch.
    pub test_acc: Option<f64>,
    /// Seconds spent training (sampling, gather, forward, backward, step).
    pub train_secs: f64,
    /// Seconds spent evaluating.
    pub eval_secs: f64,
    /// Number of training batches.
    pub batches: usize,
}

/// Loads the configured dataset, or generates the built-in synthetic one.
pub fn load_dataset(cfg: &TrainConfig) -> Result<Dataset> {
    match &cfg.data.path {
        Some(p) => open_dataset(p, Verify::Default),
        None => {
            let s = &cfg.data.synthetic;
            generate_sbm(&SbmOptions {
                num_vertices: s.vertices,
                num_edges: s.edges,
                num_classes: s.classes,
                homophily: s.homophily,
                feature_dim: s.dim,
                signal: s.signal,
                split: SplitSpec::default(),
                seed: s.seed,
                ..SbmOptions::default()
            })
        }
    }
}

/// Gathered input features of a batch, dense or sparse.
enum Inputs {
    Dense(Vec<f32>),
    Sparse(SparseRows<f32>),
}

impl Inputs {
    fn as_model_input(&self) -> ModelInput<'_, f32> {
        match self {
            Self::Dense(x) => ModelInput::Dense(x),
            Self::Sparse(x) => ModelInput::Sparse(x),
        }
    }
}

/// A prepared batch: its seeds, sampled blocks and gathered input features.
struct Prepared<'t> {
    seeds: Vec<u32>,
    batch: SampledBatch,
    x: Inputs,
    seed: u64,
    probe: Probe<'t>,
}

/// Where a batch's trace slices go: the tracer, the batch's epoch and index, and
/// the flow from its preparation to its compute. With a disabled tracer, recording
/// is a no-op.
#[derive(Clone, Copy)]
struct Probe<'t> {
    tracer: &'t Tracer,
    epoch: u64,
    batch: u64,
    flow: FlowId,
}

impl<'t> Probe<'t> {
    fn new(tracer: &'t Tracer, epoch: usize, batch: usize) -> Self {
        Self {
            tracer,
            epoch: epoch as u64,
            batch: batch as u64,
            flow: tracer.flow("prepare→compute"),
        }
    }

    /// Starts slice `name` with this batch's epoch and index.
    fn slice(&self, name: &'static str) -> SliceGuard<'t> {
        self.tracer.slice(name).epoch(self.epoch).batch(self.batch)
    }
}

/// Fraction of non-zero values, estimated on up to 4096 evenly spaced rows.
fn feature_density(f: &cpu_ops::FeatureMatrix) -> f64 {
    let n = f.num_rows();
    if n == 0 || f.dim() == 0 {
        return 1.0;
    }
    let step = n.div_ceil(4096);
    let (mut nz, mut total) = (0usize, 0usize);
    for r in (0..n).step_by(step) {
        let row = f.row(r);
        nz += row.iter().filter(|&&v| v != 0.0).count();
        total += row.len();
    }
    nz as f64 / total as f64
}

/// A model being trained on a dataset.
pub struct Trainer {
    ds: Dataset,
    cfg: TrainConfig,
    model: Model<f32>,
    opt: Adam<f32>,
    sampler: NeighborSampler,
    eval_sampler: NeighborSampler,
    scratch: SamplerScratch,
    sparse: Option<SparseRows<f32>>,
    train_ids: Vec<u32>,
    val_ids: Vec<u32>,
    test_ids: Vec<u32>,
    epoch: usize,
    tracer: Tracer,
}

fn kernel(context: &'static str) -> impl Fn(CpuOpsError) -> Error {
    move |e| Error::cpu_ops(context, e)
}

impl Trainer {
    /// Builds the model and optimizer for `ds` as `cfg` says.
    pub fn new(ds: Dataset, cfg: TrainConfig) -> Result<Self> {
        cfg.validate()?;
        let mcfg = ModelConfig {
            kind: cfg.model_kind()?,
            in_dim: ds.features.dim(),
            hidden: cfg.model.hidden,
            num_classes: ds.num_classes as usize,
            num_layers: cfg.model.layers,
            heads: cfg.model.heads,
            dropout: cfg.model.dropout,
        };
        let model = Model::new(&mcfg, derive_seed(cfg.train.seed, 1)).map_err(kernel("model"))?;
        let opt = Adam::new(AdamConfig {
            lr: cfg.train.lr,
            weight_decay: cfg.train.weight_decay,
            decay: WeightDecay::L2,
            ..AdamConfig::default()
        })
        .map_err(kernel("optimizer"))?;
        let sampler =
            NeighborSampler::new(cfg.train_fanouts()?).map_err(kernel("train.fanouts"))?;
        let eval_sampler =
            NeighborSampler::new(cfg.eval_fanouts()?).map_err(kernel("train.eval_fanouts"))?;
        let train_ids = ds.train_ids();
        if train_ids.is_empty() {
            return Err(Error::InvalidDataset {
                what: format!("dataset `{}` has no training vertices", ds.name),
            });
        }
        let sparse = match cfg.train.sparse_features.as_str() {
            "on" => true,
            "auto" => feature_density(&ds.features) <= cfg.train.sparse_threshold,
            _ => false,
        };
        let sparse = if sparse {
            let f = &ds.features;
            Some(
                SparseRows::from_dense(f.as_slice(), f.num_rows(), f.dim())
                    .map_err(kernel("sparse features"))?,
            )
        } else {
            None
        };
        Ok(Self {
            scratch: SamplerScratch::new(ds.num_vertices()),
            sparse,
            val_ids: ds.val_ids(),
            test_ids: ds.test_ids(),
            train_ids,
            ds,
            cfg,
            model,
            opt,
            sampler,
            eval_sampler,
            epoch: 0,
            tracer: Tracer::disabled(),
        })
    }

    /// The dataset.
    pub fn dataset(&self) -> &Dataset {
        &self.ds
    }

    /// The model.
    pub fn model(&self) -> &Model<f32> {
        &self.model
    }

    /// The configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// The sparse copy of the features, when the trainer uses one.
    pub fn sparse_features(&self) -> Option<&SparseRows<f32>> {
        self.sparse.as_ref()
    }

    /// Optimizer steps taken so far (the weight version).
    pub fn steps(&self) -> u64 {
        self.opt.version()
    }

    /// Records training into `tracer` from now on: slices `sample`, `gather` (with
    /// `bytes`), `forward`, `loss`, `backward`, `step` (each with `epoch` and
    /// `batch`) and `eval` (with `epoch`), and a flow from each batch's gather to its
    /// forward. A disabled tracer (the default) records nothing.
    pub fn set_tracer(&mut self, tracer: Tracer) {
        self.tracer = tracer;
    }

    /// The tracer training records into.
    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    // The tracing probe made this one argument longer than clippy's limit.
    #[allow(clippy::too_many_arguments)]
    fn prepare<'t>(
        ds: &Dataset,
        sparse: Option<&SparseRows<f32>>,
        sampler: &NeighborSampler,
        scratch: &mut SamplerScratch,
        seeds: Vec<u32>,
        seed: u64,
        mut buf: Vec<f32>,
        probe: Probe<'t>,
    ) -> Result<Prepared<'t>> {
        let sampling = probe.slice("sample");
        let batch = sampler
            .sample(&ds.graph, &seeds, seed, scratch)
            .map_err(kernel("sampling"))?;
        drop(sampling);
        let mut gathering = probe.slice("gather");
        gathering.flow_out(probe.flow);
        let x = match sparse {
            Some(s) => Inputs::Sparse(s.gather(batch.input_ids()).map_err(kernel("gather"))?),
            None => {
                // Reuse the buffer of a finished batch: a fresh allocation of tens of
                // megabytes per batch costs page faults and TLB shootdowns. The gather
                // overwrites every value, so only a grown tail is zero-filled.
                let ids = batch.input_ids();
                buf.resize(ids.len() * ds.features.dim(), 0.0);
                gather_rows(&ds.features, ids, &mut buf).map_err(kernel("gather"))?;
                Inputs::Dense(buf)
            }
        };
        gathering.set_bytes(match &x {
            Inputs::Dense(v) => std::mem::size_of_val(v.as_slice()) as u64,
            Inputs::Sparse(r) => (r.nnz() * 8 + (r.num_rows() + 1) * 8) as u64,
        });
        drop(gathering);
        Ok(Prepared {
            seeds,
            batch,
            x,
            seed,
            probe,
        })
    }

    fn views(batch: &SampledBatch) -> Result<Vec<BlockView<'_>>> {
        batch
            .blocks()
            .iter()
            .map(|b| BlockView::new(b.num_src(), b.indptr(), b.indices()))
            .collect::<std::result::Result<_, _>>()
            .map_err(kernel("block"))
    }

    fn labels_of(ds: &Dataset, seeds: &[u32]) -> Vec<u32> {
        seeds.iter().map(|&s| ds.labels[s as usize]).collect()
    }

    /// One training step on a prepared batch; returns (loss sum, correct).
    fn compute(
        ds: &Dataset,
        model: &mut Model<f32>,
        opt: &mut Adam<f32>,
        p: &Prepared,
    ) -> Result<(f64, usize)> {
        let mut forward = p.probe.slice("forward");
        forward.flow_in(p.probe.flow);
        let views = Self::views(&p.batch)?;
        let fwd = model
            .forward_input(&views, p.x.as_model_input(), true, p.seed)
            .map_err(kernel("forward"))?;
        drop(forward);
        let loss = p.probe.slice("loss");
        let (n, c) = (p.seeds.len(), ds.num_classes as usize);
        let labels = Self::labels_of(ds, &p.seeds);
        let mut grad = vec![0f32; n * c];
        let ce = softmax_cross_entropy(
            MatRef::new(fwd.logits(), n, c).map_err(kernel("logits"))?,
            &labels,
            Some(MatMut::new(&mut grad, n, c).map_err(kernel("logits"))?),
        )
        .map_err(kernel("loss"))?;
        drop(loss);
        let backward = p.probe.slice("backward");
        let grads = model
            .backward_input(&views, p.x.as_model_input(), &fwd, &grad)
            .map_err(kernel("backward"))?;
        drop(backward);
        let _step = p.probe.slice("step");
        let grad_refs: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
        opt.step(&mut model.params_mut(), &grad_refs)
            .map_err(kernel("optimizer step"))?;
        Ok((ce.loss * n as f64, ce.correct))
    }

    /// Trains one epoch; `progress(done, total)` is called after every batch.
    /// Returns (mean loss, train accuracy, seconds, batches).
    pub fn train_epoch(
        &mut self,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<(f64, f64, f64, usize)> {
        let t = Instant::now();
        let epoch = self.epoch;
        let base = derive_seed(self.cfg.train.seed, 1000 + epoch as u64);
        let mut order = self.train_ids.clone();
        Rng::new(base).shuffle(&mut order);
        let batches: Vec<Vec<u32>> = order
            .chunks(self.cfg.train.batch_size)
            .map(<[u32]>::to_vec)
            .collect();
        let total = batches.len();
        let Self {
            ds,
            model,
            opt,
            sampler,
            scratch,
            sparse,
            tracer,
            ..
        } = self;
        let sparse = sparse.as_ref();
        let tracer = &*tracer;
        let mut next = Some(Self::prepare(
            ds,
            sparse,
            sampler,
            scratch,
            batches[0].clone(),
            derive_seed(base, 0),
            Vec::new(),
            Probe::new(tracer, epoch, 0),
        )?);
        let mut spare: Vec<f32> = Vec::new();
        let (mut loss_sum, mut correct, mut seen) = (0.0, 0usize, 0usize);
        for k in 0..total {
            let cur = next.take().ok_or_else(|| Error::InvalidDataset {
                what: "internal: batch pipeline lost a batch".into(),
            })?;
            let upcoming = batches.get(k + 1).cloned();
            let buf = std::mem::take(&mut spare);
            let (prepared, step) = rayon::join(
                || {
                    upcoming
                        .map(|s| {
                            let seed = derive_seed(base, k as u64 + 1);
                            let probe = Probe::new(tracer, epoch, k + 1);
                            Self::prepare(ds, sparse, sampler, scratch, s, seed, buf, probe)
                        })
                        .transpose()
                },
                || Self::compute(ds, model, opt, &cur),
            );
            let (l, c) = step?;
            next = prepared?;
            loss_sum += l;
            correct += c;
            seen += cur.seeds.len();
            if let Inputs::Dense(v) = cur.x {
                spare = v;
            }
            progress(k + 1, total);
        }
        self.epoch += 1;
        Ok((
            loss_sum / seen.max(1) as f64,
            correct as f64 / seen.max(1) as f64,
            t.elapsed().as_secs_f64(),
            total,
        ))
    }

    /// Logits of every vertex by layer-wise full-graph inference (no dropout).
    pub fn full_graph_logits(&self) -> Result<Vec<f32>> {
        let g = &self.ds.graph;
        let n = g.num_vertices();
        let views = (0..self.cfg.model.layers)
            .map(|_| BlockView::new(n, g.offsets(), g.indices()))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(kernel("full-graph block"))?;
        let x = match &self.sparse {
            Some(s) => ModelInput::Sparse(s),
            None => ModelInput::Dense(self.ds.features.as_slice()),
        };
        let fwd = self
            .model
            .forward_input(&views, x, false, 0)
            .map_err(kernel("full-graph inference"))?;
        Ok(fwd.into_logits())
    }

    /// Accuracy of `logits` (all vertices) on `ids`.
    fn accuracy_on(&self, logits: &[f32], ids: &[u32]) -> Result<f64> {
        if ids.is_empty() {
            return Ok(0.0);
        }
        let c = self.ds.num_classes as usize;
        let rows: Vec<f32> = ids
            .iter()
            .flat_map(|&v| logits[v as usize * c..(v as usize + 1) * c].iter().copied())
            .collect();
        let correct = accuracy_count(
            MatRef::new(&rows, ids.len(), c).map_err(kernel("logits"))?,
            &Self::labels_of(&self.ds, ids),
        )
        .map_err(kernel("accuracy"))?;
        Ok(correct as f64 / ids.len() as f64)
    }

    /// Validation and test accuracy, as `train.eval_mode` says.
    pub fn evaluate_val_test(&mut self) -> Result<(f64, f64)> {
        if self.cfg.train.eval_mode == "full" {
            let logits = self.full_graph_logits()?;
            Ok((
                self.accuracy_on(&logits, &self.val_ids)?,
                self.accuracy_on(&logits, &self.test_ids)?,
            ))
        } else {
            let (v, t) = (self.val_ids.clone(), self.test_ids.clone());
            Ok((self.evaluate(&v)?, self.evaluate(&t)?))
        }
    }

    /// Accuracy on `ids` by mini-batches sampled with the evaluation fanouts (seeds
    /// shuffled, so batches are random subsets), no dropout.
    pub fn evaluate(&mut self, ids: &[u32]) -> Result<f64> {
        if ids.is_empty() {
            return Ok(0.0);
        }
        let mut ids = ids.to_vec();
        Rng::new(derive_seed(self.cfg.train.seed, 6_000_000)).shuffle(&mut ids);
        let mut correct = 0usize;
        // Evaluation shows as one `eval` slice; its batches are not traced.
        let untraced = Tracer::disabled();
        for (k, chunk) in ids.chunks(self.cfg.train.eval_batch_size).enumerate() {
            let p = Self::prepare(
                &self.ds,
                self.sparse.as_ref(),
                &self.eval_sampler,
                &mut self.scratch,
                chunk.to_vec(),
                derive_seed(self.cfg.train.seed, 7_000_000 + k as u64),
                Vec::new(),
                Probe::new(&untraced, 0, k),
            )?;
            let views = Self::views(&p.batch)?;
            let fwd = self
                .model
                .forward_input(&views, p.x.as_model_input(), false, 0)
                .map_err(kernel("forward"))?;
            let c = self.ds.num_classes as usize;
            let labels = Self::labels_of(&self.ds, chunk);
            correct += accuracy_count(
                MatRef::new(fwd.logits(), chunk.len(), c).map_err(kernel("logits"))?,
                &labels,
            )
            .map_err(kernel("accuracy"))?;
        }
        Ok(correct as f64 / ids.len() as f64)
    }

    /// Trains `train.epochs` epochs, evaluating as configured; `on_epoch` sees each
    /// epoch's statistics and `progress(done, total)` each batch.
    pub fn fit(
        &mut self,
        mut on_epoch: impl FnMut(&EpochStats),
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<EpochStats>> {
        let epochs = self.cfg.train.epochs;
        let every = self.cfg.train.eval_every;
        let mut all = Vec::with_capacity(epochs);
        for e in 0..epochs {
            let (loss, train_acc, train_secs, batches) = self.train_epoch(progress)?;
            let eval_now = e + 1 == epochs || (every > 0 && (e + 1) % every == 0);
            let t = Instant::now();
            let (val_acc, test_acc) = if eval_now {
                let tracer = self.tracer.clone();
                let _eval = tracer.slice("eval").epoch(e as u64);
                let (v, t) = self.evaluate_val_test()?;
                (Some(v), Some(t))
            } else {
                (None, None)
            };
            let stats = EpochStats {
                epoch: e,
                loss,
                train_acc,
                val_acc,
                test_acc,
                train_secs,
                eval_secs: t.elapsed().as_secs_f64(),
                batches,
            };
            on_epoch(&stats);
            all.push(stats);
        }
        Ok(all)
    }
}

/// The test accuracy at the epoch with the best validation accuracy (the usual
/// model-selection rule), with that epoch.
pub fn test_at_best_val(stats: &[EpochStats]) -> Option<(usize, f64)> {
    stats
        .iter()
        .filter_map(|s| Some((s.epoch, s.val_acc?, s.test_acc?)))
        .fold(None, |best: Option<(usize, f64, f64)>, cur| match best {
            Some(b) if b.1 >= cur.1 => Some(b),
            _ => Some(cur),
        })
        .map(|(e, _, t)| (e, t))
}
