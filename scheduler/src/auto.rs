//! `orchestration.policy = "auto"`: choosing the placement — and, for the
//! layer-based one, the CPU's share of the hot set — from costs measured in the
//! first batches of a run. The runtime measures; this module decides.
//!
//! # Protocol
//! 1. **Probe the step-based placements.** Each trains a few batches (after a
//!    warm-up); the runtime reports the measured seconds per batch
//!    ([`Measured`]).
//! 2. **Probe the layer-based placement** at one CPU split `c₀` (the hot ids
//!    `0..c₀` are computed by the CPU): seconds per batch, the accelerator
//!    thread's seconds per batch outside hot waits, CPU worker-seconds and rows
//!    computed ([`LayerProbe`]), and, for every candidate split `c`, exact counts
//!    taken from the probe's own sampled batches: hot rows the CPU would compute
//!    per batch `R(c)` and hot positions the accelerator would skip per batch
//!    `E(c)` ([`SplitCounts`]).
//! 3. **Fit** ([`LayerFit`]), with `t_ref` the measured per-batch time of
//!    `gpu-sample-gpu-gather` (the same accelerator work with nothing skipped):
//!    - accelerator: each skipped position saves `s = (t_ref − t_acc(c₀)) / E_used(c₀)`
//!      seconds (`E_used` = positions that were not late), so
//!      `t_acc(c) = t_ref − s · E(c)`; a negative `s` means skipping costs more
//!      than it saves, and no split can win;
//!    - CPU: one worker computes a row in `r = busy / rows` seconds, so
//!      `t_cpu(c) = R(c) · r / workers`;
//!    - `t(c) = max(t_acc(c), t_cpu(c))`: the slower side sets the pace.
//! 4. **Propose** ([`LayerFit::propose`]) the split with the smallest predicted
//!    time; the runtime probes it (step 2) when it differs from `c₀` and is
//!    predicted to beat every measured time by more than the tie margin.
//!    Predictions only choose what to measure.
//! 5. **Choose** ([`choose`]) among *measured* candidates: the fastest, except
//!    that a candidate within the tie margin of it and earlier in the preference
//!    order wins (`gpu-sample-gpu-gather`, `cpu-sample-gpu-gather`,
//!    `gpu-sample-cpu-gather`, `cpu-sample-cpu-gather`, `layer`: fewer moving
//!    parts and a freer CPU for the same speed). The choice carries a one-line
//!    reason listing every measurement.

use crate::error::{invalid, Result};
use crate::placement::Orchestration;

/// Preference order for ties (step 5), most preferred first.
pub const PREFERENCE: [Orchestration; 5] = [
    Orchestration::GpuSampleGpuGather,
    Orchestration::CpuSampleGpuGather,
    Orchestration::GpuSampleCpuGather,
    Orchestration::CpuSampleCpuGather,
    Orchestration::Layer,
];

/// Default tie margin: candidates within 3% of the fastest are "as fast".
pub const DEFAULT_TIE: f64 = 0.03;

/// One measured candidate (steps 1, 2, 5).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measured {
    /// The placement.
    pub policy: Orchestration,
    /// CPU split (hot ids below it computed by the CPU); 0 for step-based ones.
    pub cpu_split: u32,
    /// Measured seconds per batch.
    pub per_batch_s: f64,
}

/// What the layer-based probe measured (step 2).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerProbe {
    /// The CPU split it ran with.
    pub cpu_split: u32,
    /// Measured seconds per batch.
    pub per_batch_s: f64,
    /// The accelerator thread's seconds per batch outside hot waits.
    pub acc_per_batch_s: f64,
    /// CPU worker-seconds spent on hot rows during the probe.
    pub cpu_busy_s: f64,
    /// Hot rows the CPU computed during the probe.
    pub rows_computed: u64,
    /// Hot positions the batches read during the probe.
    pub entries_read: u64,
    /// Of those, positions that were late (computed by the accelerator or
    /// waited for).
    pub entries_late: u64,
    /// CPU workers.
    pub workers: u32,
}

/// Exact per-batch counts for one candidate split, from sampled batches (step 2).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SplitCounts {
    /// The split (hot ids below it are computed by the CPU).
    pub split: u32,
    /// Hot rows the CPU computes per batch (queue length / batches).
    pub rows_per_batch: f64,
    /// Hot positions the accelerator skips per batch.
    pub entries_per_batch: f64,
}

/// The fitted layer-based cost (step 3).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerFit {
    /// `gpu-sample-gpu-gather`'s seconds per batch.
    pub ref_s: f64,
    /// Accelerator seconds saved per skipped position (negative: a loss).
    pub saving_per_entry_s: f64,
    /// Worker-seconds per CPU-computed row.
    pub cpu_row_s: f64,
    /// CPU workers.
    pub workers: u32,
}

fn finite_non_negative(name: &'static str, v: f64) -> Result<()> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(invalid(name, "a finite, non-negative number", v))
    }
}

impl LayerFit {
    /// Step 3 from `t_ref` (seconds per batch of `gpu-sample-gpu-gather`), the
    /// probe, and the probe split's counts.
    pub fn new(ref_s: f64, probe: &LayerProbe, at_probe: &SplitCounts) -> Result<Self> {
        finite_non_negative("ref_s", ref_s)?;
        finite_non_negative("acc_per_batch_s", probe.acc_per_batch_s)?;
        finite_non_negative("cpu_busy_s", probe.cpu_busy_s)?;
        finite_non_negative("entries_per_batch", at_probe.entries_per_batch)?;
        if probe.workers == 0 {
            return Err(invalid("workers", "at least one CPU worker", 0));
        }
        if at_probe.split != probe.cpu_split {
            return Err(invalid(
                "at_probe.split",
                format!("the probe's split {}", probe.cpu_split),
                at_probe.split,
            ));
        }
        if probe.entries_late > probe.entries_read {
            return Err(invalid(
                "entries_late",
                format!("at most entries_read = {}", probe.entries_read),
                probe.entries_late,
            ));
        }
        let used_share = if probe.entries_read == 0 {
            0.0
        } else {
            (probe.entries_read - probe.entries_late) as f64 / probe.entries_read as f64
        };
        let used = at_probe.entries_per_batch * used_share;
        let saving_per_entry_s = if used > 0.0 {
            (ref_s - probe.acc_per_batch_s) / used
        } else {
            0.0
        };
        let cpu_row_s = if probe.rows_computed > 0 {
            probe.cpu_busy_s / probe.rows_computed as f64
        } else {
            0.0
        };
        Ok(Self {
            ref_s,
            saving_per_entry_s,
            cpu_row_s,
            workers: probe.workers,
        })
    }

    /// Predicted seconds per batch at `c` (step 3).
    pub fn predict(&self, c: &SplitCounts) -> f64 {
        let acc = (self.ref_s - self.saving_per_entry_s * c.entries_per_batch).max(0.0);
        let cpu = c.rows_per_batch * self.cpu_row_s / self.workers.max(1) as f64;
        acc.max(cpu)
    }

    /// Step 4: the candidate with the smallest prediction, with it (ties: the
    /// smaller split). `None` when `candidates` is empty.
    pub fn propose(&self, candidates: &[SplitCounts]) -> Option<(u32, f64)> {
        candidates
            .iter()
            .map(|c| (c.split, self.predict(c)))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
    }
}

/// The decision (step 5).
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// The chosen placement.
    pub policy: Orchestration,
    /// Its CPU split (0 unless layer-based).
    pub cpu_split: u32,
    /// Its measured seconds per batch.
    pub per_batch_s: f64,
    /// One line: the choice, why, and every measurement.
    pub reason: String,
}

fn rank(p: Orchestration) -> usize {
    PREFERENCE
        .iter()
        .position(|&q| q == p)
        .unwrap_or(PREFERENCE.len())
}

/// Step 5: the fastest measured candidate, preferring an earlier one of
/// [`PREFERENCE`] within `tie` (a fraction) of the fastest.
pub fn choose(measured: &[Measured], tie: f64) -> Result<Choice> {
    if !(tie.is_finite() && (0.0..1.0).contains(&tie)) {
        return Err(invalid("tie", "a fraction in [0, 1)", tie));
    }
    for m in measured {
        if !(m.per_batch_s.is_finite() && m.per_batch_s > 0.0) {
            return Err(invalid(
                "per_batch_s",
                format!("a positive time for {}", m.policy.name()),
                m.per_batch_s,
            ));
        }
    }
    let fastest = measured
        .iter()
        .min_by(|a, b| a.per_batch_s.total_cmp(&b.per_batch_s))
        .ok_or_else(|| invalid("measured", "at least one measured candidate", 0))?;
    let limit = fastest.per_batch_s * (1.0 + tie);
    let chosen = measured
        .iter()
        .filter(|m| m.per_batch_s <= limit)
        .min_by(|a, b| {
            rank(a.policy)
                .cmp(&rank(b.policy))
                .then(a.per_batch_s.total_cmp(&b.per_batch_s))
        })
        .unwrap_or(fastest);
    let list: Vec<String> = measured
        .iter()
        .map(|m| {
            let split = if m.policy == Orchestration::Layer {
                format!(" (cpu split {})", m.cpu_split)
            } else {
                String::new()
            };
            format!("{}{split} {:.3} ms", m.policy.name(), m.per_batch_s * 1e3)
        })
        .collect();
    let why = if chosen.policy == fastest.policy && chosen.cpu_split == fastest.cpu_split {
        "fastest".to_string()
    } else {
        format!(
            "within {:.0}% of the fastest ({}) and preferred",
            tie * 100.0,
            fastest.policy.name()
        )
    };
    Ok(Choice {
        policy: chosen.policy,
        cpu_split: chosen.cpu_split,
        per_batch_s: chosen.per_batch_s,
        reason: format!(
            "{} ({why}); measured per batch: {}",
            chosen.policy.name(),
            list.join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use Orchestration as O;

    fn m(policy: Orchestration, ms: f64) -> Measured {
        Measured {
            policy,
            cpu_split: if policy == O::Layer { 100 } else { 0 },
            per_batch_s: ms * 1e-3,
        }
    }

    #[test]
    fn picks_the_cheapest_under_scripted_costs() {
        // The H100 products numbers of RESULTS.md (per batch, 188 batches/epoch).
        let c = choose(
            &[
                m(O::GpuSampleGpuGather, 1.94),
                m(O::CpuSampleGpuGather, 7.16),
                m(O::GpuSampleCpuGather, 23.9),
                m(O::CpuSampleCpuGather, 30.2),
                m(O::Layer, 25.9),
            ],
            DEFAULT_TIE,
        )
        .unwrap();
        assert_eq!(c.policy, O::GpuSampleGpuGather);
        assert!(c.reason.contains("fastest"), "{}", c.reason);
        // A regime where layer is 1.4x faster.
        let c = choose(
            &[m(O::GpuSampleGpuGather, 14.0), m(O::Layer, 10.0)],
            DEFAULT_TIE,
        )
        .unwrap();
        assert_eq!((c.policy, c.cpu_split), (O::Layer, 100));
    }

    #[test]
    fn ties_go_to_the_preferred_placement() {
        let c = choose(
            &[m(O::Layer, 1.00), m(O::GpuSampleGpuGather, 1.02)],
            DEFAULT_TIE,
        )
        .unwrap();
        assert_eq!(c.policy, O::GpuSampleGpuGather);
        assert!(c.reason.contains("preferred"), "{}", c.reason);
        // Outside the margin the faster one wins.
        let c = choose(
            &[m(O::Layer, 1.00), m(O::GpuSampleGpuGather, 1.05)],
            DEFAULT_TIE,
        )
        .unwrap();
        assert_eq!(c.policy, O::Layer);
    }

    #[test]
    fn bad_measurements_are_errors_naming_the_field() {
        assert!(choose(&[], 0.03).is_err());
        let e = choose(&[m(O::Layer, f64::NAN)], 0.03).unwrap_err();
        assert!(e.to_string().contains("per_batch_s"), "{e}");
        assert!(choose(&[m(O::Layer, 1.0)], 1.5).is_err());
    }

    fn counts(split: u32, rows: f64, entries: f64) -> SplitCounts {
        SplitCounts {
            split,
            rows_per_batch: rows,
            entries_per_batch: entries,
        }
    }

    fn probe(split: u32, acc_ms: f64, busy_s: f64, rows: u64, read: u64, late: u64) -> LayerProbe {
        LayerProbe {
            cpu_split: split,
            per_batch_s: acc_ms * 1e-3,
            acc_per_batch_s: acc_ms * 1e-3,
            cpu_busy_s: busy_s,
            rows_computed: rows,
            entries_read: read,
            entries_late: late,
            workers: 4,
        }
    }

    #[test]
    fn fit_recovers_scripted_rates_and_proposes_the_balanced_split() {
        // Scripted truth: ref 10 ms, each skipped position saves 1 µs, a CPU row
        // costs 8 µs of one worker, 4 workers.
        let truth = LayerFit {
            ref_s: 10e-3,
            saving_per_entry_s: 1e-6,
            cpu_row_s: 8e-6,
            workers: 4,
        };
        let cands = [
            counts(1000, 500.0, 2000.0),
            counts(2000, 1500.0, 4000.0),
            counts(4000, 4000.0, 6000.0),
            counts(8000, 9000.0, 7000.0),
        ];
        // Probe at 2000: acc = 10 − 4 = 6 ms; 10 batches → 15,000 rows, 0.12 s busy.
        let c0 = cands[1];
        let p = probe(2000, truth.predict(&c0) * 1e3, 0.12, 15_000, 40_000, 0);
        let fit = LayerFit::new(10e-3, &p, &c0).unwrap();
        assert!((fit.saving_per_entry_s - 1e-6).abs() < 1e-12);
        assert!((fit.cpu_row_s - 8e-6).abs() < 1e-12);
        // Predictions: 1000 → max(8, 1) = 8 ms; 2000 → max(6, 3) = 6; 4000 →
        // max(4, 8) = 8; 8000 → max(3, 18) = 18. The balanced split is 2000.
        let (split, t) = fit.propose(&cands).unwrap();
        assert_eq!(split, 2000);
        assert!((t - 6e-3).abs() < 1e-9);
    }

    #[test]
    fn late_positions_do_not_count_as_savings_and_a_loss_proposes_the_smallest() {
        // Half the positions were late; the accelerator still saved 2 ms: 1 µs
        // per used position.
        let c0 = counts(2000, 1500.0, 4000.0);
        let p = probe(2000, 8.0, 0.1, 10_000, 40_000, 20_000);
        let fit = LayerFit::new(10e-3, &p, &c0).unwrap();
        assert!((fit.saving_per_entry_s - 1e-6).abs() < 1e-12);
        // Skipping cost more than it saved: every split predicts ≥ ref, the
        // smallest is proposed (the runtime then keeps the step-based choice).
        let p = probe(2000, 12.0, 0.1, 10_000, 40_000, 0);
        let fit = LayerFit::new(10e-3, &p, &c0).unwrap();
        assert!(fit.saving_per_entry_s < 0.0);
        let (split, t) = fit.propose(&[counts(1000, 500.0, 2000.0), c0]).unwrap();
        assert_eq!(split, 1000);
        assert!(t >= 10e-3);
    }

    #[test]
    fn fit_rejects_inconsistent_probes() {
        let c0 = counts(2000, 1.0, 1.0);
        let mut p = probe(2000, 1.0, 0.1, 1, 10, 11);
        assert!(LayerFit::new(1e-3, &p, &c0).is_err());
        p.entries_late = 0;
        p.workers = 0;
        assert!(LayerFit::new(1e-3, &p, &c0).is_err());
        p.workers = 1;
        assert!(LayerFit::new(1e-3, &p, &counts(3, 1.0, 1.0)).is_err());
        assert!(LayerFit::new(f64::INFINITY, &p, &c0).is_err());
    }
}
