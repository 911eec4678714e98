//! Data parallelism as a wrapper around a step executor: this process is rank
//! `r` of `N` of a job (`crate::dist`), and every global batch is trained by all
//! ranks together (`docs/distributed.md`).
//!
//! # One batch `k` (every rank, in the same order)
//! 1. Rank `r` takes its share of the batch: the seeds it owns with a partition
//!    file, else the `r`-th of `N` balanced slices. Its share samples with the
//!    batch's seed, so every vertex draws the neighbours it would draw in a
//!    one-rank run. An empty share still takes part in the feature exchange,
//!    which is collective.
//! 2. The share runs forward and backward on the device, without the update.
//! 3. One all-reduce per step sums a flat bucket: the gradients × (share rows /
//!    batch rows), then five scalars — loss × rows, correct predictions, ranks
//!    whose loss or gradient is not finite, ranks asked to cancel, ranks whose
//!    callbacks asked to stop. With the device-resident sum (`dist.reduce =
//!    "nccl"`) the bucket carries the scalars only and the gradients are summed
//!    on the device afterwards.
//! 4. Unless some rank was not finite, every rank applies the same Adam step
//!    to the same sum, so the ranks keep the same weights.
//! 5. A cancel or a callback's stop on any rank reaches every rank through the
//!    next step's bucket; every rank stops before the same batch.

mod device;
pub(crate) mod reduce;

use std::sync::Arc;

use gpu_ops::{Backend, GradReduce};

use super::StepExecutor;
use cpu_ops::SparseRows;

use crate::data::dataset::Dataset;
use crate::dist::features::PartitionedFeatures;
use crate::dist::{share, Communicator, DistReduce, DistStats};
use crate::engine::{ModelState, RowSource};
use crate::error::{Error, Result, StopCause};
use crate::executor::BatchRef;
use crate::executor::{BatchDone, DistSetup, EpochEnd, EpochRun, Executor, OnBatch};
use crate::trace::{Tracer, TrackId, CACHE_HIT_RATE};
use device::{apply_gradients, batch_gradients, grad_reduce, reduce_and_step, BatchGradients};
use reduce::ReduceOn;

/// Scalars at the end of a step's all-reduce bucket (module doc, step 3).
const BUCKET_SCALARS: usize = 5;

/// What the ranks agreed on in a step's all-reduce: some rank was asked to
/// cancel, some rank's callback asked to stop.
#[derive(Clone, Copy, Default)]
struct Agreed {
    cancel: bool,
    stop: bool,
}

/// The layout of one step's bucket (module doc, step 3).
#[derive(Clone, Copy)]
struct BucketShape {
    /// Gradient values in the bucket (0 when they are summed on the device).
    len: usize,
    /// This rank's rows of the batch.
    rows: usize,
    /// The whole batch's rows.
    global: usize,
    /// A callback on this rank asked to stop.
    stop: bool,
}

/// A distributed step's all-reduce, summed over the ranks.
struct Reduced {
    /// The whole batch's loss × rows.
    loss_sum: f64,
    /// The whole batch's correct predictions.
    correct: usize,
    /// Some rank's loss or gradient was not finite: no rank steps.
    bad: bool,
    agreed: Agreed,
}

/// A step executor as one rank of a job (module doc).
pub(crate) struct DataParallel<B: Backend> {
    inner: StepExecutor<B>,
    comm: Arc<dyn Communicator>,
    features: Option<Arc<crate::dist::features::PartitionedFeatures>>,
    /// The gradient all-reduces' counters (the exchanges keep their own).
    stats: DistStats,
    /// The step's all-reduce bucket.
    bucket: Vec<f32>,
    /// The gradients are summed on the device: the sum and the transport's
    /// line.
    device_reduce: Option<(Box<dyn GradReduce<B>>, String)>,
    tracer: Tracer,
}

impl<B: Backend> DataParallel<B> {
    /// `inner` as rank `setup.comm.rank()` (collective: with `dist.reduce`
    /// choosing NCCL every rank joins its communicator here).
    pub fn new(mut inner: StepExecutor<B>, setup: DistSetup) -> Result<Self> {
        let DistSetup {
            comm,
            features,
            local_sparse,
            reduce,
            host_copy_reduce,
        } = setup;
        if let Some(pf) = &features {
            let ds = Arc::clone(inner.engine_mut().dataset());
            let source = ExchangeRows::new(ds, Arc::clone(pf), local_sparse);
            inner.engine_mut().set_row_source(Some(Arc::new(source)));
        }
        let device_reduce = if host_copy_reduce {
            let channel = comm.duplicate()?;
            Some(grad_reduce(
                inner.engine_mut(),
                ReduceOn::HostCopy(channel),
            )?)
        } else {
            join_nccl(&mut inner, &*comm, reduce)?
        };
        Ok(Self {
            inner,
            comm,
            features,
            stats: DistStats::default(),
            bucket: Vec::new(),
            device_reduce,
            tracer: Tracer::disabled(),
        })
    }

    /// Steps 1–4 of batch `k`: (loss × rows, correct) of the whole batch and
    /// what the ranks agreed on.
    fn step(&mut self, run: &EpochRun<'_>, k: usize, stop: bool) -> Result<(f64, usize, Agreed)> {
        let (rank, ranks) = (self.comm.rank(), self.comm.size());
        let whole = run.batches[k];
        // A node batch's seeds go to the ranks that own their rows (with a
        // partition file); a link batch's edges are shared by range.
        let owned = match run.task.is_link() {
            false => self.features.as_ref().and_then(|f| f.seeds_of(whole)),
            true => None,
        };
        let mine: &[u32] = owned
            .as_deref()
            .unwrap_or(&whole[share(whole.len(), rank, ranks)]);
        let on_device = self.device_reduce.is_some();
        let g = if mine.is_empty() {
            if let Some(pf) = &self.features {
                // The exchange is collective: take part with no rows.
                pf.gather(run.ds, &[], &mut Vec::new())?;
            }
            BatchGradients {
                loss_sum: 0.0,
                correct: 0,
                flat: None,
            }
        } else {
            let before = ModelState::transfer_stats(self.inner.engine_mut());
            let tb = run.task.batch(mine, run.seed(k));
            let share = BatchRef::of(&tb, run.seed(k), run.epoch, k);
            let sampled = self.inner.sample(share)?;
            let placement = self.inner.placement();
            let engine = self.inner.engine_mut();
            let (stats, blocks) = super::device::train_sampled(
                engine, placement, sampled, share, false, None, before,
            )?;
            let stats = stats.ok_or_else(|| {
                crate::error::Error::invalid_argument(
                    "dist",
                    "internal: a data-parallel step read no loss",
                )
            })?;
            drop(blocks);
            if on_device {
                let loss_sum = stats.loss * share.rows() as f64;
                BatchGradients {
                    loss_sum: if loss_sum.is_finite() {
                        loss_sum
                    } else {
                        f64::NAN
                    },
                    correct: stats.correct,
                    flat: None,
                }
            } else {
                batch_gradients(engine, stats, share.rows())?
            }
        };
        let total = ModelState::num_params(self.inner.engine_mut());
        // On the device the bucket carries the scalars alone, so that every
        // rank knows whether to go on; the gradients are then summed, checked
        // and applied on the device.
        let (len, parts) = match (on_device, g.flat.as_deref()) {
            (true, _) => (0, Some(&[][..])),
            (false, f) => (total, f),
        };
        let shape = BucketShape {
            len,
            rows: run.task.rows(mine.len()),
            global: run.task.rows(whole.len()),
            stop,
        };
        let r = self.all_reduce(run, k, shape, &g, parts)?;
        if r.bad {
            return Ok((f64::NAN, r.correct, r.agreed));
        }
        let mut loss_sum = r.loss_sum;
        let tracer = run.tracer;
        if on_device {
            let weight =
                run.task.rows(mine.len()) as f32 / run.task.rows(whole.len()).max(1) as f32;
            let mut s = tracer
                .slice("device allreduce + step")
                .epoch(run.epoch as u64)
                .batch(k as u64);
            let bytes = 4 * total as u64;
            s.set_bytes(bytes);
            let t = run.clock.now();
            let (reduce, _) = self.device_reduce.as_ref().ok_or_else(|| {
                Error::invalid_argument(
                    "dist.reduce",
                    "internal: no device gradient reduction was set up",
                )
            })?;
            if !reduce_and_step(self.inner.engine_mut(), &**reduce, weight)? {
                loss_sum = f64::NAN;
            }
            self.stats.allreduce_bytes += bytes;
            self.stats.allreduce_secs += run.clock.now().saturating_sub(t).as_secs_f64();
        } else {
            let _step = tracer.slice("step").epoch(run.epoch as u64).batch(k as u64);
            let bucket = std::mem::take(&mut self.bucket);
            let applied = apply_gradients(self.inner.engine_mut(), &bucket[..total]);
            self.bucket = bucket;
            applied?;
        }
        Ok((loss_sum, r.correct, r.agreed))
    }

    /// Step 3: this rank's part of the one all-reduce. The bucket holds its
    /// gradients (`shape.len` values, `parts`) × (`shape.rows` / `shape.global`
    /// rows), then the scalars; a rank with no rows or a non-finite loss sends
    /// zero gradients. Afterwards `self.bucket[..len]` holds the summed
    /// gradients.
    fn all_reduce(
        &mut self,
        run: &EpochRun<'_>,
        k: usize,
        shape: BucketShape,
        g: &BatchGradients,
        parts: Option<&[f32]>,
    ) -> Result<Reduced> {
        let BucketShape {
            len,
            rows,
            global,
            stop,
        } = shape;
        let bucket = &mut self.bucket;
        bucket.clear();
        bucket.resize(len + BUCKET_SCALARS, 0.0);
        let finite = g.loss_sum.is_finite() && (rows == 0 || parts.is_some());
        if let (Some(p), true) = (parts, finite) {
            let w = rows as f32 / global.max(1) as f32;
            for (dst, src) in bucket.iter_mut().zip(p) {
                *dst = src * w;
            }
        }
        bucket[len] = if finite { g.loss_sum as f32 } else { 0.0 };
        bucket[len + 1] = g.correct as f32;
        bucket[len + 2] = if finite { 0.0 } else { 1.0 };
        bucket[len + 3] = if run.cancel.is_cancelled() { 1.0 } else { 0.0 };
        bucket[len + 4] = if stop { 1.0 } else { 0.0 };
        {
            let mut reduce = run
                .tracer
                .slice("allreduce")
                .epoch(run.epoch as u64)
                .batch(k as u64);
            let bytes = std::mem::size_of_val(bucket.as_slice()) as u64;
            reduce.set_bytes(bytes);
            let t = run.clock.now();
            self.comm.all_reduce_sum(bucket)?;
            self.stats.allreduces += 1;
            self.stats.allreduce_bytes += bytes;
            self.stats.allreduce_secs += run.clock.now().saturating_sub(t).as_secs_f64();
        }
        Ok(Reduced {
            loss_sum: bucket[len] as f64,
            correct: bucket[len + 1].round() as usize,
            bad: bucket[len + 2] > 0.0,
            agreed: Agreed {
                cancel: bucket[len + 3] > 0.0,
                stop: bucket[len + 4] > 0.0,
            },
        })
    }
}

/// Sets the engine's gradient sum up over NCCL when `reduce` asks for it
/// (`"nccl"`, or `"auto"` with NCCL and a GPU on every rank; collective): the
/// flag first, so that every rank takes the same way, then rank 0's unique id.
/// Returns the transport's line, `None` for MPI.
#[allow(clippy::type_complexity)]
fn join_nccl<B: Backend>(
    inner: &mut StepExecutor<B>,
    comm: &dyn Communicator,
    reduce: DistReduce,
) -> Result<Option<(Box<dyn GradReduce<B>>, String)>> {
    let use_nccl = match reduce {
        DistReduce::Mpi => false,
        // Checked on each rank before (`nccl_lacks`): every rank can.
        DistReduce::Nccl => true,
        DistReduce::Auto => {
            let kind = ModelState::device_kind(inner.engine_mut());
            let here = nccl_lacks(kind).is_none();
            let mut able = [if here { 1.0 } else { 0.0 }];
            comm.all_reduce_sum_f64(&mut able)?;
            able[0] as usize == comm.size()
        }
    };
    if !use_nccl {
        return Ok(None);
    }
    // Byte 128 says whether rank 0 drew an id (else every rank fails alike).
    let mut buf = [0u8; 129];
    let mut drawn = None;
    if comm.rank() == 0 {
        match gpu_ops::nccl_unique_id() {
            Ok(id) => {
                buf[..128].copy_from_slice(&id.0);
                buf[128] = 1;
            }
            Err(e) => drawn = Some(e),
        }
    }
    comm.broadcast_bytes(0, &mut buf)?;
    if buf[128] != 1 {
        let why = drawn.map_or_else(|| "see rank 0's error".into(), |e| e.to_string());
        return Err(Error::Dist {
            what: format!("rank 0 could not draw an NCCL id: {why}"),
        });
    }
    let mut id = [0u8; 128];
    id.copy_from_slice(&buf[..128]);
    let on = ReduceOn::Nccl {
        rank: comm.rank(),
        ranks: comm.size(),
        id: gpu_ops::NcclId(id),
    };
    Ok(Some(grad_reduce(inner.engine_mut(), on)?))
}

/// Why a rank on a `kind` device cannot sum gradients over NCCL (`None`: it
/// can).
pub(crate) fn nccl_lacks(kind: gpu_ops::DeviceKind) -> Option<String> {
    if let Err(e) = gpu_ops::nccl_available() {
        return Some(match e {
            gpu_ops::GpuOpsError::Unavailable { reason, .. } => reason,
            e => e.to_string(),
        });
    }
    (kind != gpu_ops::DeviceKind::Cuda).then(|| {
        "NCCL sums gradients between GPUs and this rank trains on the host \
         (device.kind = \"cuda\" on every rank)"
            .to_string()
    })
}

impl<B: Backend> Executor for DataParallel<B> {
    fn train(&mut self, run: &EpochRun<'_>, on_batch: &mut OnBatch<'_>) -> Result<EpochEnd> {
        let epoch_len = run.batches.len();
        let mut agreed = Agreed::default();
        let mut pending_stop = false;
        for k in run.start..run.end.min(epoch_len) {
            if agreed.cancel {
                return Ok(EpochEnd::Stopped(k, StopCause::Token));
            }
            if agreed.stop {
                return Ok(EpochEnd::Stopped(k, StopCause::Callback));
            }
            let t = run.clock.now();
            let (loss_sum, correct, now) = self.step(run, k, pending_stop)?;
            agreed = now;
            if run.tracer.is_enabled() {
                let hit = ModelState::cache_stats(self.inner.engine_mut()).hit_rate();
                run.tracer.counter(CACHE_HIT_RATE, hit);
            }
            let done = BatchDone {
                k,
                loss_sum,
                correct,
                seconds: run.clock.now().saturating_sub(t).as_secs_f64(),
                version: ModelState::version(self.inner.engine_mut()),
            };
            if on_batch(&done)? {
                if k + 1 < epoch_len {
                    // Stops with every rank, after the next batch.
                    pending_stop = true;
                } else {
                    return Ok(EpochEnd::Finished(true));
                }
            }
        }
        Ok(EpochEnd::Finished(pending_stop))
    }

    fn state(&mut self) -> &mut dyn ModelState {
        self.inner.state()
    }

    fn state_ref(&self) -> &dyn ModelState {
        self.inner.state_ref()
    }

    fn set_tracer(&mut self, tracer: &Tracer, acc: TrackId) {
        self.tracer = tracer.clone();
        self.inner.set_tracer(tracer, acc);
    }

    fn describe(&self) -> String {
        let mut line = format!(
            "orchestration: {}, rank {} of {}",
            self.inner.placement().name(),
            self.comm.rank(),
            self.comm.size()
        );
        if self.features.is_some() {
            line.push_str(
                "; dist.features = \"partitioned\": input rows are gathered on the host \
                 through the feature exchange and uploaded",
            );
        }
        if let Some((_, t)) = &self.device_reduce {
            line.push_str(&format!("; gradients summed on the device over {t}"));
        }
        line
    }

    fn dist_stats(&self) -> Option<DistStats> {
        let mut s = self.stats;
        if let Some(f) = &self.features {
            let x = f.stats();
            s.exchanges = x.exchanges;
            s.exchange_bytes = x.exchange_bytes;
            s.exchange_secs = x.exchange_secs;
            s.remote_rows = x.remote_rows;
            s.remote_cache_hits = x.remote_cache_hits;
        }
        Some(s)
    }

    fn distribute(self: Box<Self>, _setup: DistSetup) -> Result<Box<dyn Executor>> {
        Err(Error::invalid_argument(
            "communicator",
            "set it once, before training: the ranks must start from the same weights",
        ))
    }
}

/// A device engine's input rows through a rank's partitioned features
/// ([`crate::engine::RowSource`]): dense rows, or sparse ones from the rank's
/// sparse copy of its own rows.
pub(crate) struct ExchangeRows {
    ds: Arc<Dataset>,
    features: Arc<PartitionedFeatures>,
    local: Option<Arc<SparseRows<f32>>>,
}

impl ExchangeRows {
    /// Rows of `ds` through `features`; sparse rows when `local` (this rank's
    /// own rows, the others empty) is given.
    pub(crate) fn new(
        ds: Arc<Dataset>,
        features: Arc<PartitionedFeatures>,
        local: Option<Arc<SparseRows<f32>>>,
    ) -> Self {
        Self {
            ds,
            features,
            local,
        }
    }
}

impl RowSource for ExchangeRows {
    fn gather(&self, ids: &[u32], out: &mut Vec<f32>) -> Result<u64> {
        self.features.gather(&self.ds, ids, out)
    }

    fn gather_bf16(&self, ids: &[u32], out: &mut Vec<u16>) -> Result<u64> {
        self.features.gather_bf16(&self.ds, ids, out)
    }

    fn gather_sparse(&self, ids: &[u32]) -> Result<Option<(SparseRows<f32>, u64)>> {
        self.local
            .as_deref()
            .map(|local| self.features.gather_sparse(local, ids))
            .transpose()
    }
}
