//! How a caller watches and steers a training run: per-batch and per-epoch
//! callbacks ([`Callback`], [`BatchMetrics`]), stop requests ([`Control`]) and
//! cancellation from another thread ([`CancelToken`]).
//!
//! # Protocol
//! 1. Before each training batch the trainer checks its [`CancelToken`]; when it is
//!    cancelled, [`crate::Trainer::train_epoch`] returns
//!    [`crate::Error::Cancelled`] with [`crate::StopCause::Token`] before computing that
//!    batch, so a cancel takes effect within one batch.
//! 2. After each batch's optimizer step, every callback's [`Callback::on_batch`]
//!    sees its [`BatchMetrics`]. If any returns [`Control::Stop`], the epoch stops
//!    there: `train_epoch` returns `Cancelled` with [`crate::StopCause::Callback`], and
//!    [`crate::Trainer::fit`] returns `Ok` with the epochs completed.
//! 3. After each epoch (and its scheduled evaluation), [`Callback::on_epoch`] sees
//!    the [`EpochStats`]; [`Control::Stop`] makes `fit` return after that epoch.
//! 4. A stopped or cancelled trainer stays consistent: it remembers the batch it
//!    stopped at, the next `train_epoch` continues the interrupted epoch from there,
//!    and the result is bit-identical to an uninterrupted run (every random choice
//!    derives from `(seed, epoch, batch)`). A checkpoint taken in between keeps the
//!    position too.
//!
//! Callbacks run on the thread that calls the trainer, between batches; a slow
//! callback slows training.
//!
//! # A callback's life
//! A trainer keeps its callbacks until they are removed
//! ([`crate::Trainer::remove_callback`] with the [`CallbackId`] that
//! [`crate::Trainer::add_callback`] returned, or
//! [`crate::Trainer::clear_callbacks`]) or the trainer is dropped. This matters
//! for a callback that owns something another thread waits on — typically the
//! sending half of a channel whose receiver collects metrics: the receiver's
//! loop (`for m in rx`) ends only when every sender is dropped, so while the
//! trainer holds the callback, the consumer waits. Remove the callback when the
//! job is done with it, and the consumer finishes while the trainer lives on
//! (to evaluate, export or train more).
//!
//! ```
//! use runtime::{on_batch, CancelToken, Control, Error, StopCause, TrainerBuilder};
//!
//! # fn main() -> runtime::Result<()> {
//! let toml = "[data.synthetic]\nvertices = 400\nedges = 2000\nclasses = 2\ndim = 4\n\
//!             [model]\nhidden = 8\n[train]\nbatch_size = 64\n[threads]\ncompute = 1\n";
//! let cancel = CancelToken::new();
//! let stopper = cancel.clone();
//! let mut trainer = TrainerBuilder::from_toml(toml)?
//!     // Cancel from "another thread" after the third batch.
//!     .callback(on_batch(move |m| {
//!         if m.batch == 2 {
//!             stopper.cancel();
//!         }
//!         Control::Continue
//!     }))
//!     .cancel_token(cancel)
//!     .build()?;
//! match trainer.train_epoch() {
//!     Err(Error::Cancelled { batch, cause: StopCause::Token, .. }) => assert_eq!(batch, 3),
//!     other => panic!("{other:?}"),
//! }
//! # Ok(())
//! # }
//! ```

pub use crate::cancel::CancelToken;
use crate::executor::layer::stats::OrchestrationStats;
use crate::task::MetricValue;

/// What one training batch did, as [`Callback::on_batch`] sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchMetrics {
    /// 0-based epoch.
    pub epoch: usize,
    /// 0-based batch index within the epoch.
    pub batch: usize,
    /// Batches in this epoch.
    pub batches: usize,
    /// Seeds (training vertices) in this batch.
    pub batch_size: usize,
    /// Mean softmax cross-entropy over the batch's seeds.
    pub loss: f64,
    /// Training accuracy on the batch's seeds (with dropout, as trained).
    pub accuracy: f64,
    /// Wall-clock seconds of this batch's step (forward, backward, optimizer; the
    /// next batch's sampling and gather overlap with it).
    pub seconds: f64,
    /// Optimizer steps taken so far, this batch's included (the weight version).
    pub step: u64,
}

/// What one epoch did, as [`Callback::on_epoch`] and `Trainer::fit` report it,
/// and as `tandem train --out` writes it to `metrics.jsonl`, one JSON object
/// per epoch (the fields up to `steps`; non-finite numbers as `null`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EpochStats {
    /// 0-based epoch index.
    pub epoch: usize,
    /// Mean training loss over the epoch's batches (weighted by batch size).
    pub loss: f64,
    /// Training accuracy over the epoch's batches (with dropout, as trained).
    pub train_acc: f64,
    /// Validation accuracy, when evaluated this epoch (`None` also when the
    /// dataset's validation split is empty).
    pub val_acc: Option<f64>,
    /// Test accuracy, when evaluated this epoch (`None` also when the test
    /// split is empty).
    pub test_acc: Option<f64>,
    /// Link prediction: the validation metrics (`link.metrics`, in order),
    /// when evaluated this epoch (empty otherwise, and for node
    /// classification, whose accuracies are `val_acc` and `test_acc`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub val_metrics: Vec<MetricValue>,
    /// Link prediction: the test metrics, as `val_metrics`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub test_metrics: Vec<MetricValue>,
    /// Seconds spent training (sampling, gather, forward, backward, step).
    pub train_secs: f64,
    /// Seconds spent evaluating.
    pub eval_secs: f64,
    /// Number of training batches.
    pub batches: usize,
    /// Optimizer steps taken by the end of the epoch (the weight version).
    pub steps: u64,
    /// What layer-based orchestration did this epoch (`None` without embedding
    /// reuse): staleness gaps, waits, vertices computed cold, CPU jobs.
    #[serde(skip)]
    pub orchestration: Option<OrchestrationStats>,
    /// `policy = "auto"` was still measuring placements during this epoch.
    #[serde(skip)]
    pub calibrating: bool,
    /// What `policy = "auto"` chose, and why, in the epoch it decided.
    #[serde(skip)]
    pub auto_choice: Option<String>,
    /// Batches skipped for a non-finite loss (`train.on_nonfinite = "skip-batch"`).
    #[serde(skip)]
    pub skipped_batches: usize,
}

impl EpochStats {
    /// The validation figure best-epoch selection reads: the accuracy, or
    /// the first link metric.
    pub fn selection_val(&self) -> Option<f64> {
        self.val_acc
            .or_else(|| self.val_metrics.first().map(|m| m.value))
    }

    /// The test figure beside [`EpochStats::selection_val`].
    pub fn selection_test(&self) -> Option<f64> {
        self.test_acc
            .or_else(|| self.test_metrics.first().map(|m| m.value))
    }

    /// One line: loss, training accuracy, validation and test accuracy (or
    /// link metrics), times.
    pub fn summary(&self) -> String {
        let acc = |a: Option<f64>| a.map_or_else(|| "-".into(), |x| format!("{x:.4}"));
        let metrics = |split: &str, m: &[MetricValue]| {
            m.iter()
                .map(|v| format!("{split} {} {:.4}", v.name, v.value))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let eval = if self.val_metrics.is_empty() && self.test_metrics.is_empty() {
            format!(
                "val acc {}, test acc {}",
                acc(self.val_acc),
                acc(self.test_acc)
            )
        } else {
            format!(
                "{}, {}",
                metrics("val", &self.val_metrics),
                metrics("test", &self.test_metrics)
            )
        };
        format!(
            "loss {:.4}, train acc {:.4}, {eval}, {:.2} s train, {:.2} s eval",
            self.loss, self.train_acc, self.train_secs, self.eval_secs
        )
    }
}

/// The test accuracy at the epoch with the best validation accuracy (the usual
/// model-selection rule), with that epoch.
///
/// For link prediction the rule reads the first of `link.metrics` (MRR by
/// default) where node classification reads the accuracy.
pub fn test_at_best_val(stats: &[EpochStats]) -> Option<(usize, f64)> {
    stats
        .iter()
        .filter_map(|s| Some((s.epoch, s.selection_val()?, s.selection_test()?)))
        .fold(None, |best: Option<(usize, f64, f64)>, cur| match best {
            Some(b) if b.1 >= cur.1 => Some(b),
            _ => Some(cur),
        })
        .map(|(e, _, t)| (e, t))
}

/// Names a callback added with [`crate::Trainer::add_callback`], for
/// [`crate::Trainer::remove_callback`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallbackId(pub(crate) u64);

/// A callback's answer: go on, or stop training.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Control {
    /// Keep training.
    #[default]
    Continue,
    /// Stop (see the module doc for where training stops).
    Stop,
}

/// Observes a training run. Both methods default to doing nothing.
///
/// Closures adapt with [`on_batch`] and [`on_epoch`].
pub trait Callback: Send {
    /// After every training batch's optimizer step.
    fn on_batch(&mut self, metrics: &BatchMetrics) -> Control {
        let _ = metrics;
        Control::Continue
    }

    /// After every epoch, with its evaluation when one was scheduled.
    fn on_epoch(&mut self, stats: &EpochStats) -> Control {
        let _ = stats;
        Control::Continue
    }
}

/// A [`Callback`] from a per-batch closure (see [`on_batch`]).
pub struct OnBatch<F>(F);

impl<F: FnMut(&BatchMetrics) -> Control + Send> Callback for OnBatch<F> {
    fn on_batch(&mut self, metrics: &BatchMetrics) -> Control {
        (self.0)(metrics)
    }
}

/// A [`Callback`] from a per-epoch closure (see [`on_epoch`]).
pub struct OnEpoch<F>(F);

impl<F: FnMut(&EpochStats) -> Control + Send> Callback for OnEpoch<F> {
    fn on_epoch(&mut self, stats: &EpochStats) -> Control {
        (self.0)(stats)
    }
}

/// A callback that calls `f` after every batch.
pub fn on_batch<F: FnMut(&BatchMetrics) -> Control + Send>(f: F) -> OnBatch<F> {
    OnBatch(f)
}

/// A callback that calls `f` after every epoch.
pub fn on_epoch<F: FnMut(&EpochStats) -> Control + Send>(f: F) -> OnEpoch<F> {
    OnEpoch(f)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn closure_callbacks_answer_only_their_event() {
        let seen = std::sync::atomic::AtomicUsize::new(0);
        let mut b = on_batch(|m: &BatchMetrics| {
            seen.fetch_add(m.batch_size, Ordering::Relaxed);
            if m.batch == 1 {
                Control::Stop
            } else {
                Control::Continue
            }
        });
        let m = BatchMetrics {
            epoch: 0,
            batch: 0,
            batches: 2,
            batch_size: 3,
            loss: 1.0,
            accuracy: 0.5,
            seconds: 0.1,
            step: 1,
        };
        assert_eq!(b.on_batch(&m), Control::Continue);
        assert_eq!(
            b.on_batch(&BatchMetrics {
                batch: 1,
                ..m.clone()
            }),
            Control::Stop
        );
        let stats = EpochStats {
            epoch: 0,
            loss: 1.0,
            train_acc: 0.5,
            val_acc: None,
            test_acc: None,
            val_metrics: Vec::new(),
            test_metrics: Vec::new(),
            train_secs: 0.0,
            eval_secs: 0.0,
            batches: 2,
            steps: 2,
            orchestration: None,
            calibrating: false,
            auto_choice: None,
            skipped_batches: 0,
        };
        assert_eq!(b.on_epoch(&stats), Control::Continue);
        assert_eq!(seen.load(Ordering::Relaxed), 6);
        let mut e = on_epoch(|_: &EpochStats| Control::Stop);
        assert_eq!(e.on_batch(&m), Control::Continue);
        assert_eq!(e.on_epoch(&stats), Control::Stop);
    }
}
