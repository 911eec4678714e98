//! Bounded staleness: weight versions, the reuse rule, and the gap histogram.
//!
//! The paper's artifact does not track versions; Tandem does, and the bound is a
//! guarantee, not a tendency.
//!
//! # The protocol, step by step
//! The protocol applies these rules ([`crate::protocol`]): steps 2 (publish), 4
//! (install), 5–7 (gate, late, train) there.
//!
//! 1. **Version.** The weight version is the number of optimizer steps taken. Batch
//!    `b` (global index) runs its forward and backward at version `b`; its optimizer
//!    step makes version `b + 1`.
//! 2. **Publish.** The accelerator publishes the bottom-layer weights to the CPU
//!    side together with their version (a device-to-host copy ordered after the
//!    step): at the start, after the last batch of every super-batch, and after
//!    every batch when the bound is below the on-time gap ([`crate::Publication`]).
//! 3. **Stamp.** A CPU hot job reads the newest published weights *once, when it
//!    starts*, and stamps every row of its chunk with that version `e`. Rows go
//!    into the super-batch's slab chunk by chunk; a chunk's slab rows only ever
//!    move to a newer version.
//! 4. **Check.** Before batch `b` reads its hot rows (the gate,
//!    [`crate::Action::Gate`]), it asks [`StalenessRule::decide`] for every
//!    chunk of its super-batch's queue that it reads, with the chunk's version (or
//!    none) and `v = b`: the chunk's rows may be used iff they exist and
//!    `v - e <= staleness_bound`.
//! 5. **Late.** Any other answer makes the chunk *late*, handled as `on_late`
//!    says (protocol step 6): `"wait"` blocks the accelerator after sending
//!    urgent work (a promotion of a chunk not computed yet, a recomputation of a
//!    stale one with weights published within the bound); `"compute"` leaves the
//!    chunk's vertices cold in this batch — the accelerator samples, gathers and
//!    computes them itself, at version `v` (gap 0).
//! 6. **Record.** Every reuse records its gap `v - e` in a [`GapHistogram`]; by
//!    steps 4–5 no recorded gap exceeds the bound.
//!
//! Nothing here reads a clock or locks: the rule is a pure function; the
//! protocol owns the chunks' versions, its driver the waiting.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::error::{Result, SchedulerError};

/// What the accelerator does with a late embedding (config key `on_late`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum OnLate {
    /// Block until a fresh-enough embedding exists (the default).
    #[default]
    Wait,
    /// Compute the vertex on the accelerator, as if it were cold.
    Compute,
}

impl OnLate {
    /// The accepted names.
    pub const NAMES: &'static [&'static str] = &["wait", "compute"];

    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Wait => "wait",
            Self::Compute => "compute",
        }
    }
}

impl FromStr for OnLate {
    type Err = SchedulerError;

    /// `"wait"` or `"compute"`; anything else is an error listing both.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "wait" => Ok(Self::Wait),
            "compute" => Ok(Self::Compute),
            other => Err(SchedulerError::UnknownVariant {
                name: "on_late",
                allowed: Self::NAMES,
                found: other.to_string(),
            }),
        }
    }
}

impl fmt::Display for OnLate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The answer of the rule for one vertex (step 4 of the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Use the historical embedding; record `gap`.
    Use {
        /// `current - embedding`.
        gap: u64,
    },
    /// Late, and `on_late = "wait"`: block until a fresh-enough embedding exists.
    Wait {
        /// The gap the existing embedding would have had (`None`: none exists).
        gap: Option<u64>,
    },
    /// Late, and `on_late = "compute"`: compute the vertex as cold in this batch.
    ComputeCold {
        /// The gap the existing embedding would have had (`None`: none exists).
        gap: Option<u64>,
    },
}

impl Decision {
    /// Whether the embedding may be used.
    pub fn is_use(&self) -> bool {
        matches!(self, Self::Use { .. })
    }
}

/// The reuse rule: `staleness_bound` (in optimizer steps) and `on_late`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StalenessRule {
    bound: u64,
    on_late: OnLate,
}

impl StalenessRule {
    /// A rule with the given bound (0 allows only embeddings computed with the
    /// current weights) and late policy.
    pub fn new(bound: u64, on_late: OnLate) -> Self {
        Self { bound, on_late }
    }

    /// The bound, in optimizer steps.
    pub fn bound(&self) -> u64 {
        self.bound
    }

    /// The late policy.
    pub fn on_late(&self) -> OnLate {
        self.on_late
    }

    /// The oldest version usable at version `current`.
    pub fn oldest_usable(&self, current: u64) -> u64 {
        current.saturating_sub(self.bound)
    }

    /// Whether an embedding of version `embedding` may be used at `current`.
    /// Fails if the embedding is newer than the current version (a bookkeeping bug
    /// in the caller: versions never run ahead).
    pub fn may_use(&self, embedding: u64, current: u64) -> Result<bool> {
        if embedding > current {
            return Err(SchedulerError::VersionAhead { embedding, current });
        }
        Ok(current - embedding <= self.bound)
    }

    /// The decision for a vertex whose table slot holds version `embedding`
    /// (`None`: never computed) when the accelerator is at version `current`.
    pub fn decide(&self, embedding: Option<u64>, current: u64) -> Result<Decision> {
        let gap = match embedding {
            Some(e) => {
                if self.may_use(e, current)? {
                    return Ok(Decision::Use { gap: current - e });
                }
                Some(current - e)
            }
            None => None,
        };
        Ok(match self.on_late {
            OnLate::Wait => Decision::Wait { gap },
            OnLate::Compute => Decision::ComputeCold { gap },
        })
    }
}

/// Gaps below this are counted in a dense array; larger ones (a bound of
/// thousands of steps is legal, if unusual) in a sorted map.
const DENSE_GAPS: usize = 4096;

/// Counts of reuse gaps, exact per gap value.
///
/// Gaps are bounded by the staleness bound, usually a few dozen steps, so small
/// gaps get one counter each; any gap, however large, is still counted exactly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GapHistogram {
    dense: Vec<u64>,
    sparse: BTreeMap<u64, u64>,
}

impl GapHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one reuse with `gap`.
    pub fn record(&mut self, gap: u64) {
        self.record_n(gap, 1);
    }

    /// Records `n` reuses with `gap`.
    pub fn record_n(&mut self, gap: u64, n: u64) {
        if n == 0 {
            return;
        }
        match usize::try_from(gap) {
            Ok(g) if g < DENSE_GAPS => {
                if g >= self.dense.len() {
                    self.dense.resize(g + 1, 0);
                }
                self.dense[g] += n;
            }
            _ => *self.sparse.entry(gap).or_insert(0) += n,
        }
    }

    /// `(gap, count)` for every gap recorded at least once, ascending.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.dense
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(g, &c)| (g as u64, c))
            .chain(self.sparse.iter().map(|(&g, &c)| (g, c)))
    }

    /// The number of reuses recorded.
    pub fn total(&self) -> u64 {
        self.buckets().map(|(_, c)| c).sum()
    }

    /// The largest gap recorded (`None` when empty).
    pub fn max(&self) -> Option<u64> {
        self.sparse
            .keys()
            .next_back()
            .copied()
            .or_else(|| self.dense.iter().rposition(|&c| c > 0).map(|g| g as u64))
    }

    /// The mean gap (`None` when empty).
    pub fn mean(&self) -> Option<f64> {
        let total = self.total();
        (total > 0).then(|| {
            let sum: f64 = self.buckets().map(|(g, c)| g as f64 * c as f64).sum();
            sum / total as f64
        })
    }

    /// The smallest gap `g` such that at least a fraction `q` (in `[0, 1]`) of the
    /// reuses have a gap `<= g` (`None` when empty).
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let want = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (g, c) in self.buckets() {
            seen += c;
            if seen >= want {
                return Some(g);
            }
        }
        self.max()
    }

    /// The count of reuses with exactly `gap`.
    pub fn count(&self, gap: u64) -> u64 {
        match usize::try_from(gap) {
            Ok(g) if g < DENSE_GAPS => self.dense.get(g).copied().unwrap_or(0),
            _ => self.sparse.get(&gap).copied().unwrap_or(0),
        }
    }

    /// Counts in power-of-two ranges for a short summary: `(lo, hi, count)` with
    /// ranges `0..=0, 1..=1, 2..=3, 4..=7, ...`, empty ranges left out.
    pub fn log2_buckets(&self) -> Vec<(u64, u64, u64)> {
        let mut out: Vec<(u64, u64, u64)> = Vec::new();
        for (g, c) in self.buckets() {
            let (lo, hi) = if g == 0 {
                (0, 0)
            } else {
                let lo = 1u64 << (63 - g.leading_zeros());
                (lo, lo | (lo - 1))
            };
            match out.last_mut() {
                Some(last) if last.0 == lo => last.2 += c,
                _ => out.push((lo, hi, c)),
            }
        }
        out
    }

    /// Adds every count of `other` (for per-worker or per-epoch histograms).
    pub fn merge(&mut self, other: &GapHistogram) {
        for (g, c) in other.buckets() {
            self.record_n(g, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_uses_within_the_bound_and_applies_on_late_beyond() {
        let wait = StalenessRule::new(3, OnLate::Wait);
        assert_eq!(wait.decide(Some(10), 10).unwrap(), Decision::Use { gap: 0 });
        assert_eq!(wait.decide(Some(7), 10).unwrap(), Decision::Use { gap: 3 });
        assert_eq!(
            wait.decide(Some(6), 10).unwrap(),
            Decision::Wait { gap: Some(4) }
        );
        assert_eq!(wait.decide(None, 0).unwrap(), Decision::Wait { gap: None });
        let compute = StalenessRule::new(3, OnLate::Compute);
        assert_eq!(
            compute.decide(Some(6), 10).unwrap(),
            Decision::ComputeCold { gap: Some(4) }
        );
        assert_eq!(
            compute.decide(None, 10).unwrap(),
            Decision::ComputeCold { gap: None }
        );
        assert!(matches!(
            wait.decide(Some(11), 10),
            Err(SchedulerError::VersionAhead {
                embedding: 11,
                current: 10
            })
        ));
        assert_eq!(wait.oldest_usable(10), 7);
        assert_eq!(wait.oldest_usable(1), 0);
        let exact = StalenessRule::new(0, OnLate::Wait);
        assert!(exact.may_use(5, 5).unwrap() && !exact.may_use(4, 5).unwrap());
    }

    #[test]
    fn rule_never_allows_a_gap_beyond_the_bound() {
        for bound in 0..6 {
            let r = StalenessRule::new(bound, OnLate::Compute);
            for cur in 0..20u64 {
                for e in 0..=cur {
                    let d = r.decide(Some(e), cur).unwrap();
                    assert_eq!(d.is_use(), cur - e <= bound, "{bound} {cur} {e}");
                }
            }
        }
    }

    #[test]
    fn on_late_parses() {
        assert_eq!("wait".parse::<OnLate>().unwrap(), OnLate::Wait);
        assert_eq!("compute".parse::<OnLate>().unwrap(), OnLate::Compute);
        let e = "skip".parse::<OnLate>().unwrap_err().to_string();
        assert!(
            e.contains("on_late") && e.contains("\"wait\" | \"compute\""),
            "{e}"
        );
        assert_eq!(OnLate::Compute.to_string(), "compute");
    }

    #[test]
    fn histogram_records_merges_and_summarizes() {
        let mut h = GapHistogram::new();
        assert_eq!((h.max(), h.mean(), h.quantile(0.5)), (None, None, None));
        for g in [0, 0, 1, 3, 3, 3, 6] {
            h.record(g);
        }
        assert_eq!(h.total(), 7);
        assert_eq!(h.max(), Some(6));
        assert_eq!(h.count(3), 3);
        assert_eq!(h.count(99), 0);
        assert!((h.mean().unwrap() - 16.0 / 7.0).abs() < 1e-12);
        assert_eq!(h.quantile(0.5), Some(3));
        assert_eq!(h.quantile(0.0), Some(0));
        assert_eq!(h.quantile(1.0), Some(6));
        assert_eq!(
            h.buckets().collect::<Vec<_>>(),
            vec![(0, 2), (1, 1), (3, 3), (6, 1)]
        );
        assert_eq!(
            h.log2_buckets(),
            vec![(0, 0, 2), (1, 1, 1), (2, 3, 3), (4, 7, 1)]
        );
        let mut other = GapHistogram::new();
        other.record_n(9, 4);
        other.record_n(2, 0);
        h.merge(&other);
        assert_eq!(h.max(), Some(9));
        assert_eq!(h.total(), 11);
        let mut small = GapHistogram::new();
        small.record(1);
        small.merge(&h);
        assert_eq!(small.total(), 12);
        assert_eq!(small.count(1), 2);
        // Huge gaps are counted exactly, without a huge allocation.
        let mut big = GapHistogram::new();
        big.record(u64::MAX);
        big.record_n(10_000, 2);
        big.record(3);
        assert_eq!(big.max(), Some(u64::MAX));
        assert_eq!(big.count(10_000), 2);
        assert_eq!(big.quantile(0.5), Some(10_000));
        assert_eq!(
            big.log2_buckets(),
            vec![(2, 3, 1), (8192, 16383, 2), (1 << 63, u64::MAX, 1)]
        );
        small.merge(&big);
        assert_eq!(small.total(), 16);
        assert_eq!(small.max(), Some(u64::MAX));
    }
}
