//! Link-prediction metrics on host scores: every validation or test positive
//! is scored against its own negatives.
//!
//! - **MRR** (as ogbl-citation2): a positive's rank among its negatives is `1 +`
//!   the average of the optimistic rank (negatives scored strictly above it)
//!   and the pessimistic one (negatives scored at least as high), so ties cost
//!   half; the metric is the mean of `1 / rank`.
//! - **Hits@K** (as ogbl-collab): the share of positives scored strictly above
//!   the K-th highest score among all the split's negatives (every positive
//!   counts when there are fewer than K negatives).
//! - **AUC**: the probability that a positive outscores a negative, ties
//!   counting half (the Mann–Whitney statistic over all pairs), from one sort.

use serde::{Deserialize, Serialize};

/// One metric of `link.metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkMetric {
    /// Mean reciprocal rank of each positive among its own negatives.
    Mrr,
    /// The share of positives scored above the K-th best negative.
    HitsAt(usize),
    /// The area under the ROC curve, positives against negatives.
    Auc,
}

impl LinkMetric {
    /// Parses one `link.metrics` entry.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "mrr" => Some(Self::Mrr),
            "auc" => Some(Self::Auc),
            _ => s
                .strip_prefix("hits@")
                .and_then(|k| k.parse::<usize>().ok())
                .filter(|&k| k >= 1)
                .map(Self::HitsAt),
        }
    }

    /// Its name in `link.metrics`.
    pub fn name(self) -> String {
        match self {
            Self::Mrr => "mrr".into(),
            Self::Auc => "auc".into(),
            Self::HitsAt(k) => format!("hits@{k}"),
        }
    }
}

/// One metric's value, named as in `link.metrics`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricValue {
    /// `"mrr"`, `"hits@K"` or `"auc"`.
    pub name: String,
    /// Its value, in [0, 1].
    pub value: f64,
}

/// Mean reciprocal rank of `pos[i]` among `neg[i·k..(i+1)·k]`.
pub(crate) fn mrr(pos: &[f32], neg: &[f32], k: usize) -> f64 {
    if pos.is_empty() || k == 0 {
        return 0.0;
    }
    let total: f64 = pos
        .iter()
        .zip(neg.chunks_exact(k))
        .map(|(&p, negs)| {
            let above = negs.iter().filter(|&&n| n > p).count() as f64;
            let at_least = negs.iter().filter(|&&n| n >= p).count() as f64;
            1.0 / (1.0 + 0.5 * (above + at_least))
        })
        .sum();
    total / pos.len() as f64
}

/// Share of `pos` scored strictly above the `k`-th highest of `neg`.
pub(crate) fn hits_at(pos: &[f32], neg: &[f32], k: usize) -> f64 {
    if pos.is_empty() {
        return 0.0;
    }
    if neg.len() < k {
        return 1.0;
    }
    let mut sorted = neg.to_vec();
    // The k-th highest: a partial selection, descending.
    let (_, kth, _) = sorted.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    let threshold = *kth;
    pos.iter().filter(|&&p| p > threshold).count() as f64 / pos.len() as f64
}

/// Area under the ROC curve of `pos` against `neg` (ties half).
pub(crate) fn auc(pos: &[f32], neg: &[f32]) -> f64 {
    if pos.is_empty() || neg.is_empty() {
        return 0.0;
    }
    let mut all: Vec<(f32, bool)> = pos
        .iter()
        .map(|&s| (s, true))
        .chain(neg.iter().map(|&s| (s, false)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Sum of the positives' ranks (1-based, ties averaged).
    let mut rank_sum = 0.0f64;
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j < all.len() && all[j].0.total_cmp(&all[i].0).is_eq() {
            j += 1;
        }
        let avg = (i + 1 + j) as f64 / 2.0;
        rank_sum += avg * all[i..j].iter().filter(|e| e.1).count() as f64;
        i = j;
    }
    let (p, n) = (pos.len() as f64, neg.len() as f64);
    (rank_sum - p * (p + 1.0) / 2.0) / (p * n)
}

/// The metrics of `which` for scores of `pos` (one per positive) and `neg`
/// (`k` per positive, in positive order).
pub(crate) fn compute(
    which: &[LinkMetric],
    pos: &[f32],
    neg: &[f32],
    k: usize,
) -> Vec<MetricValue> {
    which
        .iter()
        .map(|&m| MetricValue {
            name: m.name(),
            value: match m {
                LinkMetric::Mrr => mrr(pos, neg, k),
                LinkMetric::HitsAt(h) => hits_at(pos, neg, h),
                LinkMetric::Auc => auc(pos, neg),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mrr_ranks_each_positive_among_its_own_negatives_with_ties_costing_half() {
        // Positive 0 beats both its negatives (rank 1); positive 1 is beaten
        // by one (rank 2); positive 2 ties one and is beaten by none (rank 1.5).
        let pos = [0.9, 0.5, 0.3];
        let neg = [0.1, 0.2, 0.7, 0.1, 0.3, 0.0];
        let want = (1.0 + 0.5 + 1.0 / 1.5) / 3.0;
        assert!((mrr(&pos, &neg, 2) - want).abs() < 1e-12);
        assert_eq!(mrr(&[], &[], 2), 0.0);
    }

    #[test]
    fn hits_counts_positives_strictly_above_the_kth_best_negative() {
        let neg = [0.1, 0.8, 0.5, 0.3];
        // 2nd best negative: 0.5.
        assert_eq!(hits_at(&[0.9, 0.5, 0.6, 0.2], &neg, 2), 0.5);
        // 1st best: 0.8.
        assert_eq!(hits_at(&[0.9, 0.5, 0.6, 0.2], &neg, 1), 0.25);
        // Fewer negatives than K: every positive is a hit.
        assert_eq!(hits_at(&[0.0], &neg, 10), 1.0);
    }

    #[test]
    fn auc_is_the_share_of_pairs_a_positive_wins_with_ties_half() {
        assert_eq!(auc(&[1.0, 2.0], &[0.0, 0.5]), 1.0);
        assert_eq!(auc(&[0.0], &[1.0]), 0.0);
        assert_eq!(auc(&[1.0], &[1.0]), 0.5);
        // Against a brute-force count on random scores with ties.
        let mut r = cpu_ops::Rng::new(7);
        let pos: Vec<f32> = (0..57).map(|_| (r.next_u64() % 20) as f32).collect();
        let neg: Vec<f32> = (0..91).map(|_| (r.next_u64() % 20) as f32).collect();
        let mut wins = 0.0;
        for &p in &pos {
            for &n in &neg {
                wins += if p > n {
                    1.0
                } else if p == n {
                    0.5
                } else {
                    0.0
                };
            }
        }
        let want = wins / (pos.len() * neg.len()) as f64;
        assert!((auc(&pos, &neg) - want).abs() < 1e-12);
    }

    #[test]
    fn compute_names_each_metric_as_configured() {
        let which = [LinkMetric::Mrr, LinkMetric::HitsAt(1), LinkMetric::Auc];
        let m = compute(&which, &[1.0], &[0.0, 0.5], 2);
        let names: Vec<&str> = m.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["mrr", "hits@1", "auc"]);
        assert!(m.iter().all(|v| v.value == 1.0));
    }
}
