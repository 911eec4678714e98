//! One epoch of a session, and `fit`: the batch order and seeds, the books each
//! trained batch updates (position, loss, callbacks, non-finite losses), the
//! epoch's evaluation, statistics and callbacks (module doc of `session`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cpu_ops::{derive_seed, Rng};

use super::control::{BatchMetrics, Callback, CallbackId, Control, EpochStats};
use super::Trainer;
use crate::checkpoint::Position;
use crate::error::{Error, Result, StopCause};
use crate::executor::{BatchDone, EpochEnd, EpochRun};
use crate::task::{MetricValue, Task};

/// What a batch with a non-finite loss does (`train.on_nonfinite`); its update
/// was never applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OnNonFinite {
    /// End training with [`Error::NonFinite`]; the position stays at the batch.
    Stop,
    /// Count it and go on with the next batch.
    Skip,
}

/// The books of the epoch in progress that each trained batch updates.
struct Books<'a> {
    pos: &'a mut Position,
    callbacks: &'a mut [(CallbackId, Box<dyn Callback>)],
    on_nonfinite: OnNonFinite,
    skipped: &'a mut usize,
    epoch: usize,
    batches: &'a [&'a [u32]],
    /// Rows a batch's loss is taken over ([`Task::rows`]).
    task: &'a Task,
}

impl Books<'_> {
    /// Adds a trained batch to the position and shows its metrics to the
    /// callbacks; returns whether one asked to stop. A batch whose loss is not
    /// finite is an [`Error::NonFinite`] (`Stop`), or only moves the position on
    /// and counts as skipped (`Skip`), without callbacks.
    fn batch(&mut self, d: &BatchDone) -> Result<bool> {
        let size = self.task.rows(self.batches[d.k].len());
        if !d.loss_sum.is_finite() {
            return match self.on_nonfinite {
                OnNonFinite::Stop => Err(Error::NonFinite {
                    epoch: self.epoch,
                    batch: d.k,
                    loss: d.loss_sum / size.max(1) as f64,
                }),
                OnNonFinite::Skip => {
                    self.pos.batch = d.k + 1;
                    *self.skipped += 1;
                    Ok(false)
                }
            };
        }
        self.pos.batch = d.k + 1;
        self.pos.loss_sum += d.loss_sum;
        self.pos.correct += d.correct as u64;
        self.pos.seen += size as u64;
        let metrics = BatchMetrics {
            epoch: self.epoch,
            batch: d.k,
            batches: self.batches.len(),
            batch_size: size,
            loss: d.loss_sum / size.max(1) as f64,
            accuracy: d.correct as f64 / size.max(1) as f64,
            seconds: d.seconds,
            step: d.version,
        };
        let mut stop = false;
        for (_, cb) in self.callbacks.iter_mut() {
            stop |= cb.on_batch(&metrics) == Control::Stop;
        }
        Ok(stop)
    }
}

impl Trainer {
    /// Trains the next epoch (or the rest of an interrupted one), evaluates when
    /// `train.eval_every` says so (and at epoch `train.epochs - 1`), calls the
    /// callbacks, and returns the epoch's statistics. A cancelled token or a
    /// callback's stop inside the epoch returns [`Error::Cancelled`]; the trainer
    /// then remembers the position, and the next call continues from there.
    ///
    /// `train.epochs` is [`Trainer::fit`]'s target, not a limit here: like one
    /// pass of a PyTorch/DGL training loop, each call trains one more epoch,
    /// past `train.epochs` too (epoch `train.epochs`, then the next, each with
    /// its own shuffle and seeds). Past it, only `train.eval_every` schedules
    /// an evaluation (call [`Trainer::evaluate_val_test`] for one).
    pub fn train_epoch(&mut self) -> Result<EpochStats> {
        let pool = Arc::clone(&self.pool);
        let target = self.cfg.train.epochs;
        pool.install(|| self.train_epoch_here(target))
    }

    /// One epoch of a run that ends at epoch `target` (evaluated after epoch
    /// `target - 1`).
    fn train_epoch_here(&mut self, target: usize) -> Result<EpochStats> {
        let epoch = self.pos.epoch as u64;
        self.tracer
            .instant(crate::trace::EPOCH_INSTANT, |a| a.epoch = Some(epoch));
        self.stop_requested = false;
        self.embeddings = None;
        self.logits = None;
        let calibrating = self.exec.calibrating();
        let stop_at_end = self.train_batches()?;
        self.check_ranks_agree()?;
        let pos = std::mem::take(&mut self.pos);
        let e = pos.epoch;
        self.pos.epoch = e + 1;
        let every = self.cfg.train.eval_every;
        let eval_now = e + 1 == target || (every > 0 && (e + 1).is_multiple_of(every));
        let t = self.clock.now();
        let (mut val_acc, mut test_acc) = (None, None);
        let [mut val_metrics, mut test_metrics]: [Vec<MetricValue>; 2] = Default::default();
        if eval_now {
            if self.link.is_some() {
                [val_metrics, test_metrics] = self.evaluate_link_here()?;
            } else {
                let (v, t) = self.evaluate_val_test_here()?;
                // An empty split has no accuracy (not 0).
                val_acc = Some(v).filter(|_| !self.splits.val.is_empty());
                test_acc = Some(t).filter(|_| !self.splits.test.is_empty());
            }
        }
        let seen = pos.seen.max(1) as f64;
        let stats = EpochStats {
            epoch: e,
            loss: pos.loss_sum / seen,
            train_acc: pos.correct as f64 / seen,
            val_acc,
            test_acc,
            val_metrics,
            test_metrics,
            train_secs: pos.train_secs,
            eval_secs: self.clock.now().saturating_sub(t).as_secs_f64(),
            batches: pos.batch,
            steps: self.steps(),
            orchestration: self.orchestration_stats().cloned(),
            calibrating,
            skipped_batches: std::mem::take(&mut self.skipped),
            auto_choice: match (calibrating, self.exec.auto_choice()) {
                (true, Some(c)) => Some(c.reason.clone()),
                _ => None,
            },
        };
        if self.verbose {
            if let Some(reason) = &stats.auto_choice {
                eprintln!("orchestration.policy = \"auto\": {reason}");
            }
            eprintln!("epoch {e}: {}", stats.summary());
            if let Some(o) = &stats.orchestration {
                eprintln!("  {}", o.summary());
            }
        }
        let mut stop = stop_at_end;
        for (_, cb) in &mut self.callbacks {
            stop |= cb.on_epoch(&stats) == Control::Stop;
        }
        if self.dist.ranks() > 1 {
            // Every rank ends together: a stop asked on any rank ends them all.
            let mut any = [if stop { 1.0 } else { 0.0 }];
            self.dist.comm.all_reduce_sum_f64(&mut any)?;
            stop = any[0] > 0.0;
        }
        self.stop_requested = stop;
        Ok(stats)
    }

    /// Epoch `epoch`'s seed and its shuffled training vertices, which the
    /// executor trains in `train.batch_size` batches (batch `k` seeded
    /// `derive_seed(base, k)`).
    fn epoch_order(&self, epoch: usize) -> (u64, Vec<u32>) {
        let base = derive_seed(self.cfg.train.seed, 1000 + epoch as u64);
        let mut order = self.splits.train.clone();
        Rng::new(base).shuffle(&mut order);
        (base, order)
    }

    /// Trains the remaining batches of the epoch in progress. Returns whether a
    /// callback asked to stop after the last batch; a cancel or a stop before it
    /// is [`Error::Cancelled`].
    fn train_batches(&mut self) -> Result<bool> {
        let t = self.clock.now();
        let epoch = self.pos.epoch;
        let (base, order) = self.epoch_order(epoch);
        let batches: Vec<&[u32]> = order.chunks(self.cfg.train.batch_size).collect();
        let total = batches.len();
        let Self {
            ds,
            exec,
            pos,
            callbacks,
            cancel,
            tracer,
            acc_track,
            on_nonfinite,
            skipped,
            clock,
            task,
            ..
        } = self;
        let run = EpochRun {
            ds,
            batches: &batches,
            start: pos.batch.min(total),
            end: total,
            mark: None,
            base_seed: base,
            epoch,
            tracer,
            acc_track: *acc_track,
            cancel,
            clock: &**clock,
            task,
        };
        let mut books = Books {
            pos,
            callbacks,
            on_nonfinite: *on_nonfinite,
            skipped,
            epoch,
            batches: &batches,
            task,
        };
        let end = exec.train(&run, &mut |d: &BatchDone| books.batch(d));
        books.pos.train_secs += clock.now().saturating_sub(t).as_secs_f64();
        match end? {
            EpochEnd::Finished(stop) => Ok(stop),
            EpochEnd::Stopped(k, cause) => Err(Error::Cancelled {
                epoch,
                batch: k,
                cause,
            }),
        }
    }

    /// Trains until `train.epochs` epochs are complete (continuing an interrupted
    /// epoch or a loaded checkpoint), evaluating as configured, and returns the
    /// statistics of the epochs it trained. Callbacks see every batch and epoch; a
    /// callback's stop ends `fit` early with `Ok` (see `session::control`); a
    /// cancelled token is [`Error::Cancelled`].
    ///
    /// With a checkpoint path ([`Trainer::set_checkpoint_path`]) it also writes a
    /// checkpoint every `train.checkpoint_every` epochs (before the last), when a
    /// cancel stops it (the position inside the epoch, for a bit-exact resume),
    /// when a non-finite loss stops it ([`Error::NonFinite`]: the weights before
    /// that batch), and at the end.
    ///
    /// Called when all `train.epochs` epochs are trained already (a second
    /// `fit`, or a checkpoint of a finished run), it trains nothing and returns
    /// [`Error::TrainingComplete`]; [`Trainer::fit_epochs`] trains more.
    pub fn fit(&mut self) -> Result<Vec<EpochStats>> {
        let epochs = self.cfg.train.epochs;
        if self.pos.epoch >= epochs {
            return Err(Error::TrainingComplete { epochs });
        }
        self.fit_until(epochs)
    }

    /// Trains `n` more epochs — the rest of an interrupted epoch counting as the
    /// first — whether or not that goes past `train.epochs` (as Keras'
    /// `fit(epochs=…, initial_epoch=…)` or another pass of a PyTorch loop), and
    /// returns their statistics. Everything else is [`Trainer::fit`]'s:
    /// callbacks, a callback's stop (`Ok` with the epochs done), cancellation,
    /// checkpoints (every `train.checkpoint_every` epochs and at the end), and
    /// an evaluation after the last of the `n` epochs. `n = 0` trains nothing.
    pub fn fit_epochs(&mut self, n: usize) -> Result<Vec<EpochStats>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        self.fit_until(self.pos.epoch + n)
    }

    /// [`Trainer::fit`] up to epoch `target` (exclusive).
    fn fit_until(&mut self, target: usize) -> Result<Vec<EpochStats>> {
        let mut all = Vec::new();
        let every = self.cfg.train.checkpoint_every;
        while self.pos.epoch < target {
            let pool = Arc::clone(&self.pool);
            match pool.install(|| self.train_epoch_here(target)) {
                Ok(s) => all.push(s),
                Err(Error::Cancelled {
                    cause: StopCause::Callback,
                    ..
                }) => break,
                Err(e @ (Error::Cancelled { .. } | Error::NonFinite { .. })) => {
                    // The position inside the epoch and the last good weights.
                    if let Some(p) = self.checkpoint_path.clone() {
                        self.save_checkpoint(&p)?;
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
            if self.stop_requested {
                break;
            }
            let done = self.pos.epoch;
            if let Some(p) = self.checkpoint_path.clone() {
                if done < target && every > 0 && done.is_multiple_of(every) {
                    self.save_checkpoint(&p)?;
                }
            }
        }
        if let Some(p) = self.checkpoint_path.clone() {
            self.save_checkpoint(&p)?;
        }
        Ok(all)
    }

    /// Where [`Trainer::fit`] writes its checkpoints (`None`: nowhere).
    pub fn set_checkpoint_path(&mut self, path: Option<PathBuf>) {
        self.checkpoint_path = path;
    }

    /// Where [`Trainer::fit`] writes its checkpoints.
    pub fn checkpoint_path(&self) -> Option<&Path> {
        self.checkpoint_path.as_deref()
    }
}
