//! `orchestration.policy = "auto"`: which candidates to measure, in
//! what order, and what the measurements decide (`scheduler::choose`,
//! `scheduler::LayerFit`; the protocol is in `scheduler/src/auto.rs`).
//!
//! # Protocol (`placement/auto.rs` drives it over batch ranges of the first epoch(s))
//! 1. Each step-based placement trains `warm` batches, then `measure` timed
//!    batches; its seconds per batch are recorded.
//! 2. The layer-based placement (when the model has two layers or more and the
//!    hot set is not empty) trains one super-batch to fill its pipeline, then two
//!    timed super-batches, at the full hot set as CPU split; the executor reports
//!    a [`LayerProbe`] and [`SplitCounts`] for every candidate split (the hot set
//!    halved up to four times).
//! 3. The fit proposes a split; when it differs from the one measured and is
//!    predicted to beat every measurement by more than the tie margin, it is
//!    probed too (step 2 at that split). A fit that fails is reported in the
//!    reason, never fatal: the measurements still decide.
//! 4. [`Calibrator::finish`] chooses among the measured candidates.
//!
//! All candidates train the same model on the same batches in the session's
//! order, so calibration batches are ordinary training steps.

use std::collections::VecDeque;

use scheduler::{
    choose, Choice, LayerFit, LayerProbe, Measured, Orchestration, SplitCounts, DEFAULT_TIE,
};

use crate::error::{Error, Result};

/// Untimed batches before a step-based measurement.
pub const WARM_BATCHES: usize = 1;
/// Timed batches of a step-based measurement.
pub const MEASURE_BATCHES: usize = 4;
/// A step-based measurement ends after any timed batch once its mean per batch
/// is this many times the best measured so far: it cannot be chosen, and its
/// remaining batches would each cost the run that much (2026-11-26, 512
/// columns: the CPU-gather candidates took 205–210 ms per batch against 5.7).
pub const ABORT_RATIO: f64 = 4.0;
/// Timed super-batches of a layer-based measurement (after one to fill).
pub const MEASURE_SUPER_BATCHES: usize = 2;
/// Candidate splits: the hot set, then halved this many times.
pub const SPLIT_HALVINGS: u32 = 4;

/// The split of a layer-based step meaning "the whole hot set".
pub const ALL_HOT: u32 = u32::MAX;

/// The step-based placements, in the order they are measured.
pub const STEP_CANDIDATES: [Orchestration; 4] = [
    Orchestration::GpuSampleGpuGather,
    Orchestration::CpuSampleGpuGather,
    Orchestration::GpuSampleCpuGather,
    Orchestration::CpuSampleCpuGather,
];

/// One measurement to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeStep {
    /// A step-based placement: `warm` untimed batches, then `measure` timed.
    Fixed {
        /// The placement.
        policy: Orchestration,
        /// Untimed batches first.
        warm: usize,
        /// Timed batches.
        measure: usize,
    },
    /// The layer-based placement at CPU split `split`: `warm` untimed batches
    /// (one super-batch), then `measure` timed, then `tail` untimed (two
    /// super-batches: the pipeline launches one super-batch ahead and samples
    /// the one after it for the planner, so the last timed super-batch
    /// launches the first of the tail and samples the second, as in steady
    /// state, and the window holds one launch and one sampling per timed
    /// super-batch).
    Layer {
        /// Hot ids below it are computed by the CPU.
        split: u32,
        /// Untimed batches first.
        warm: usize,
        /// Timed batches.
        measure: usize,
        /// Untimed batches after.
        tail: usize,
    },
}

impl ProbeStep {
    /// Batches the step trains.
    pub fn batches(&self) -> usize {
        match *self {
            Self::Fixed { warm, measure, .. } => warm + measure,
            Self::Layer {
                warm,
                measure,
                tail,
                ..
            } => warm + measure + tail,
        }
    }
}

/// The calibration in progress (module doc).
#[derive(Debug)]
pub struct Calibrator {
    steps: VecDeque<ProbeStep>,
    measured: Vec<Measured>,
    super_batch: usize,
    hot: u32,
    notes: Vec<String>,
    /// A proposal was already probed (at most one).
    proposed: bool,
}

impl Calibrator {
    /// Measurements of the step-based placements and, when `layer`, of the
    /// layer-based one (at the whole hot set: [`ALL_HOT`], resolved by the
    /// trainer once the hot set is known, [`Calibrator::set_hot`]), with
    /// super-batches of `super_batch` batches.
    pub fn new(layer: bool, super_batch: usize) -> Self {
        let mut steps: VecDeque<ProbeStep> = STEP_CANDIDATES
            .iter()
            .map(|&policy| ProbeStep::Fixed {
                policy,
                warm: WARM_BATCHES,
                measure: MEASURE_BATCHES,
            })
            .collect();
        let super_batch = super_batch.max(1);
        if layer {
            steps.push_back(Self::layer_step(ALL_HOT, super_batch));
        }
        Self {
            steps,
            measured: Vec::new(),
            super_batch,
            hot: 0,
            notes: Vec::new(),
            proposed: false,
        }
    }

    fn layer_step(split: u32, n: usize) -> ProbeStep {
        ProbeStep::Layer {
            split,
            warm: n,
            measure: MEASURE_SUPER_BATCHES * n,
            tail: 2 * n,
        }
    }

    /// The hot set is `0..hot`; with none, the layer-based measurements are
    /// skipped (named in the reason).
    pub fn set_hot(&mut self, hot: u32) {
        self.hot = hot;
        if hot == 0 {
            let before = self.steps.len();
            self.steps.retain(|s| !matches!(s, ProbeStep::Layer { .. }));
            if self.steps.len() != before {
                self.notes
                    .push("no layer-based candidate: the hot set is empty".into());
            }
        }
    }

    /// The candidate splits whose counts the layer probe reports (step 2).
    pub fn candidate_splits(&self) -> Vec<u32> {
        let mut v: Vec<u32> = (0..=SPLIT_HALVINGS)
            .map(|h| self.hot >> h)
            .filter(|&c| c > 0)
            .collect();
        v.dedup();
        v
    }

    /// Shrinks the measurements to epochs of `epoch_len` batches (a measurement
    /// never spans two epochs): a step-based one keeps at least one timed batch
    /// (and its warm-up batch when there is room); a layer-based one needs its
    /// fill super-batch and one timed batch, else it is skipped with a note.
    pub fn fit_to_epoch(&mut self, epoch_len: usize) {
        let mut notes = Vec::new();
        self.steps.retain_mut(|s| match s {
            ProbeStep::Fixed { warm, measure, .. } => {
                if *warm + *measure > epoch_len {
                    *warm = (*warm).min(epoch_len.saturating_sub(1));
                    *measure = epoch_len.saturating_sub(*warm).max(1);
                }
                true
            }
            ProbeStep::Layer {
                warm,
                measure,
                tail,
                ..
            } => {
                if *warm + *measure + *tail <= epoch_len {
                    return true;
                }
                // With a shorter tail the last timed launches sample less
                // ahead, which short epochs accept.
                *tail = epoch_len.saturating_sub(*warm + *measure).min(*tail);
                if *warm + *measure <= epoch_len {
                    return true;
                }
                if epoch_len > *warm {
                    *measure = epoch_len - *warm;
                    return true;
                }
                notes.push(format!(
                    "skipped the layer-based measurement: an epoch has {epoch_len} batches, \
                     it needs more than one super-batch ({warm})"
                ));
                false
            }
        });
        self.notes.extend(notes);
    }

    /// The fastest measurement so far (`None` before the first).
    pub fn best_so_far(&self) -> Option<&Measured> {
        self.measured
            .iter()
            .min_by(|a, b| a.per_batch_s.total_cmp(&b.per_batch_s))
    }

    /// Whether a step-based measurement ends after `timed` of its `measure`
    /// timed batches, which took `secs`: when their mean is more than
    /// [`ABORT_RATIO`] times `best` (the best per-batch time measured so far),
    /// and batches remain.
    pub fn cut_short(best: Option<f64>, timed: usize, measure: usize, secs: f64) -> bool {
        timed > 0 && timed < measure && best.is_some_and(|b| secs / timed as f64 > ABORT_RATIO * b)
    }

    /// The next measurement, if any remain.
    pub fn next(&self) -> Option<ProbeStep> {
        self.steps.front().copied()
    }

    /// Whether nothing remains to measure.
    #[cfg(test)]
    pub fn done(&self) -> bool {
        self.steps.is_empty()
    }

    /// Records the step-based measurement at the front (step 1).
    pub fn record_fixed(&mut self, per_batch_s: f64) -> Result<()> {
        match self.steps.front().copied() {
            Some(ProbeStep::Fixed { policy, .. }) => {
                self.steps.pop_front();
                self.measured.push(Measured {
                    policy,
                    cpu_split: 0,
                    per_batch_s,
                });
                Ok(())
            }
            other => Err(out_of_order("a step-based measurement", other)),
        }
    }

    /// Adds `note` to the reason line (e.g. what device memory did to the
    /// layer-based candidate).
    pub fn note(&mut self, note: String) {
        self.notes.push(note);
    }

    /// Skips the measurement at the front (it could not run: e.g. an epoch too
    /// short for a layer-based probe), saying why in the reason.
    pub fn skip(&mut self, why: &str) {
        if let Some(s) = self.steps.pop_front() {
            self.notes.push(format!("skipped {s:?}: {why}"));
        }
    }

    /// Records the layer-based measurement at the front (step 2) and, from the fit
    /// against `gpu-sample-gpu-gather`, queues the proposed split when it is worth
    /// measuring (step 3).
    pub fn record_layer(&mut self, probe: LayerProbe, counts: &[SplitCounts]) -> Result<()> {
        match self.steps.front().copied() {
            Some(ProbeStep::Layer { .. }) => {
                self.steps.pop_front();
            }
            other => return Err(out_of_order("a layer-based measurement", other)),
        }
        self.measured.push(Measured {
            policy: Orchestration::Layer,
            cpu_split: probe.cpu_split,
            per_batch_s: probe.per_batch_s,
        });
        if self.proposed {
            return Ok(());
        }
        let reference = self
            .measured
            .iter()
            .find(|m| m.policy == Orchestration::GpuSampleGpuGather)
            .map(|m| m.per_batch_s);
        let best = self
            .measured
            .iter()
            .map(|m| m.per_batch_s)
            .fold(f64::INFINITY, f64::min);
        let (Some(reference), Some(at_probe)) = (
            reference,
            counts.iter().find(|c| c.split == probe.cpu_split),
        ) else {
            self.notes
                .push("no layer fit: gpu-sample-gpu-gather or the probe's counts missing".into());
            return Ok(());
        };
        match LayerFit::new(reference, &probe, at_probe) {
            Ok(fit) => {
                if let Some((split, t)) = fit.propose(counts) {
                    self.notes.push(format!(
                        "layer fit: {:.3} µs saved per skipped row, {:.3} µs per CPU row; best split {split} predicted {:.3} ms",
                        fit.saving_per_entry_s * 1e6,
                        fit.cpu_row_s * 1e6,
                        t * 1e3
                    ));
                    if split != probe.cpu_split && t < best * (1.0 - DEFAULT_TIE) {
                        self.proposed = true;
                        self.steps
                            .push_back(Self::layer_step(split, self.super_batch));
                    }
                }
            }
            Err(e) => self.notes.push(format!("no layer fit: {e}")),
        }
        Ok(())
    }

    /// Step 4: the choice among the measured candidates, with every note. With
    /// nothing measured (no batch to measure on), `gpu-sample-gpu-gather`.
    pub fn finish(&self) -> Result<Choice> {
        if self.measured.is_empty() {
            return Ok(Choice {
                policy: Orchestration::GpuSampleGpuGather,
                cpu_split: 0,
                per_batch_s: 0.0,
                reason: "gpu-sample-gpu-gather (nothing could be measured)".into(),
            });
        }
        let mut c = choose(&self.measured, DEFAULT_TIE)
            .map_err(|source| Error::scheduler("orchestration.policy = \"auto\"", source))?;
        for n in &self.notes {
            c.reason.push_str("; ");
            c.reason.push_str(n);
        }
        Ok(c)
    }
}

fn out_of_order(what: &str, found: Option<ProbeStep>) -> Error {
    Error::invalid_argument(
        "orchestration.policy = \"auto\"",
        format!("internal: {what} recorded while the next step is {found:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use Orchestration as O;

    fn run_fixed(c: &mut Calibrator, ms: [f64; 4]) {
        for t in ms {
            let Some(ProbeStep::Fixed { .. }) = c.next() else {
                panic!("expected a step-based step, got {:?}", c.next());
            };
            c.record_fixed(t * 1e-3).unwrap();
        }
    }

    fn counts(c: &Calibrator, per_split: impl Fn(u32) -> (f64, f64)) -> Vec<SplitCounts> {
        c.candidate_splits()
            .into_iter()
            .map(|s| {
                let (rows, entries) = per_split(s);
                SplitCounts {
                    split: s,
                    rows_per_batch: rows,
                    entries_per_batch: entries,
                }
            })
            .collect()
    }

    #[test]
    fn a_fast_gpu_keeps_the_all_gpu_placement() {
        let mut c = Calibrator::new(true, 4);
        c.set_hot(1600);
        assert_eq!(c.candidate_splits(), vec![1600, 800, 400, 200, 100]);
        run_fixed(&mut c, [2.0, 7.0, 24.0, 30.0]);
        assert!(matches!(
            c.next(),
            Some(ProbeStep::Layer {
                split: ALL_HOT,
                warm: 4,
                measure: 8,
                tail: 8
            })
        ));
        let k = counts(&c, |s| (s as f64, 2.0 * s as f64));
        // The layer path costs more accelerator time than it saves.
        let probe = LayerProbe {
            cpu_split: 1600,
            per_batch_s: 4e-3,
            acc_per_batch_s: 4e-3,
            cpu_busy_s: 0.05,
            rows_computed: 12_800,
            entries_read: 25_600,
            entries_late: 0,
            workers: 4,
        };
        c.record_layer(probe, &k).unwrap();
        assert!(c.done(), "no proposal worth probing: {:?}", c.next());
        let ch = c.finish().unwrap();
        assert_eq!(ch.policy, O::GpuSampleGpuGather);
        assert!(ch.reason.contains("layer fit"), "{}", ch.reason);
    }

    #[test]
    fn a_cpu_bound_layer_probe_proposes_a_smaller_split_and_measures_it() {
        let mut c = Calibrator::new(true, 4);
        c.set_hot(1600);
        run_fixed(&mut c, [14.0, 20.0, 40.0, 50.0]);
        // Rows grow faster than entries with the split (the hottest are shared).
        let k = counts(&c, |s| (s as f64 * 5.0, s as f64 * 4.0));
        // Probe at 1600: the accelerator would save 1 µs per entry (14 − 6.4 ms),
        // but the CPU needs 8000 rows × 10 µs / 4 = 20 ms.
        let probe = LayerProbe {
            cpu_split: 1600,
            per_batch_s: 20e-3,
            acc_per_batch_s: 14e-3 - 6400.0 * 1e-6,
            cpu_busy_s: 8000.0 * 8.0 * 10e-6,
            rows_computed: 8000 * 8,
            entries_read: 6400 * 8,
            entries_late: 0,
            workers: 4,
        };
        c.record_layer(probe, &k).unwrap();
        // Prediction at 400: acc 14 − 1.6 = 12.4 ms, cpu 2000 × 10 µs / 4 = 5 ms.
        // At 800: acc 10.8, cpu 10 → 10.8 ms (the best), below 14 × 0.97.
        assert_eq!(
            c.next(),
            Some(ProbeStep::Layer {
                split: 800,
                warm: 4,
                measure: 8,
                tail: 8
            })
        );
        let probe2 = LayerProbe {
            cpu_split: 800,
            per_batch_s: 11e-3,
            ..probe
        };
        c.record_layer(probe2, &k).unwrap();
        assert!(c.done(), "only one proposal is probed");
        let ch = c.finish().unwrap();
        assert_eq!((ch.policy, ch.cpu_split), (O::Layer, 800));
    }

    #[test]
    fn no_hot_set_measures_only_step_based_and_order_is_checked() {
        let mut c = Calibrator::new(false, 4);
        assert!(c.candidate_splits().is_empty());
        assert!(c
            .record_layer(
                LayerProbe {
                    cpu_split: 1,
                    per_batch_s: 1.0,
                    acc_per_batch_s: 1.0,
                    cpu_busy_s: 0.0,
                    rows_computed: 0,
                    entries_read: 0,
                    entries_late: 0,
                    workers: 1
                },
                &[]
            )
            .is_err());
        run_fixed(&mut c, [3.0, 2.0, 5.0, 6.0]);
        assert!(c.done());
        assert_eq!(c.finish().unwrap().policy, O::CpuSampleGpuGather);
        assert!(c.record_fixed(1.0).is_err());
    }

    #[test]
    fn measurements_shrink_to_short_epochs() {
        let mut c = Calibrator::new(true, 4);
        c.fit_to_epoch(3);
        assert_eq!(
            c.next(),
            Some(ProbeStep::Fixed {
                policy: O::GpuSampleGpuGather,
                warm: 1,
                measure: 2
            })
        );
        // The layer-based step needs its fill super-batch (4) and one more.
        assert_eq!(c.steps.len(), 4);
        assert!(c.notes[0].contains("layer-based"), "{:?}", c.notes);
        let mut c = Calibrator::new(true, 4);
        c.fit_to_epoch(1);
        assert_eq!(
            c.next(),
            Some(ProbeStep::Fixed {
                policy: O::GpuSampleGpuGather,
                warm: 0,
                measure: 1
            })
        );
        let mut c = Calibrator::new(true, 4);
        c.fit_to_epoch(7);
        assert_eq!(c.steps.back().map(ProbeStep::batches), Some(7));
        // Nothing measured: the all-accelerator placement.
        let c = Calibrator::new(false, 4);
        let ch = c.finish().unwrap();
        assert_eq!(ch.policy, O::GpuSampleGpuGather);
        assert!(c.best_so_far().is_none());
    }

    #[test]
    fn a_skipped_step_is_named_in_the_reason() {
        let mut c = Calibrator::new(true, 4);
        run_fixed(&mut c, [1.0, 2.0, 3.0, 4.0]);
        c.skip("the epoch has too few batches left");
        assert!(c.done());
        let ch = c.finish().unwrap();
        assert!(ch.reason.contains("too few batches"), "{}", ch.reason);
        // An empty hot set drops the layer-based step.
        let mut c = Calibrator::new(true, 4);
        c.set_hot(0);
        run_fixed(&mut c, [1.0, 2.0, 3.0, 4.0]);
        assert!(c.done());
        assert!(c.finish().unwrap().reason.contains("hot set is empty"));
    }

    #[test]
    fn a_step_based_measurement_far_slower_than_the_best_ends_early() {
        let best = Some(0.005);
        // 30 ms after one timed batch of four against 5 ms: it cannot be chosen.
        assert!(Calibrator::cut_short(best, 1, 4, 0.030));
        // 4× is not more than 4×; 15 ms a batch goes on.
        assert!(!Calibrator::cut_short(best, 1, 4, 0.020));
        assert!(!Calibrator::cut_short(best, 2, 4, 0.030));
        // The last batch ends it anyway; nothing measured yet compares with nothing.
        assert!(!Calibrator::cut_short(best, 4, 4, 1.0));
        assert!(!Calibrator::cut_short(None, 1, 4, 1.0));
        assert!(!Calibrator::cut_short(best, 0, 4, 1.0));
    }
}
