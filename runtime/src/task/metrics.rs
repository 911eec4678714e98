//! Link-prediction metrics on host scores: every validation or test positive
//! is scored against its own negatives.
//!
//! - **MRR** (as ogbl-citation2): a positive's rank among its negatives is `1 +`
//!   the average of the optimistic rank (negatives scored strictly above it)
//!   and the pessimistic one (negatives scored at least as high), so ties cost
//!   half; the metric is the mean of `1 / rank`.
//! - **Hits@K** (as ogbl-citation2's `hits@K_list`): the share of positives
//!   whose rank among their own negatives, the same rank as MRR's, is at most
//!   K. With 100 negatives a positive a random model scores draws a rank
//!   uniform in 1..=101, so chance is about K / 101 (0.099 for Hits@10).
//!   (ogbl-collab's Hits@K, which pools every positive's negatives and needs
//!   a positive above the K-th best of them all, suits a shared negative set,
//!   not per-positive negatives.)
//! - **AUC**: the probability that a positive outscores a negative, ties
//!   counting half (the Mann–Whitney statistic over all pairs), from one sort.

use serde::{Deserialize, Serialize};

/// One metric of `link.metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkMetric {
    /// Mean reciprocal rank of each positive among its own negatives.
    Mrr,
    /// The share of positives ranked at most K among their own negatives.
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

/// The rank of each `pos[i]` among `neg[i·k..(i+1)·k]`: `1 +` the mean of the
/// negatives scored strictly above it and those scored at least as high (ties
/// cost half).
fn ranks<'a>(pos: &'a [f32], neg: &'a [f32], k: usize) -> impl Iterator<Item = f64> + 'a {
    pos.iter()
        .zip(neg.chunks_exact(k.max(1)))
        .map(|(&p, negs)| {
            let above = negs.iter().filter(|&&n| n > p).count() as f64;
            let at_least = negs.iter().filter(|&&n| n >= p).count() as f64;
            1.0 + 0.5 * (above + at_least)
        })
}

/// Mean reciprocal rank of `pos[i]` among `neg[i·k..(i+1)·k]`.
pub(crate) fn mrr(pos: &[f32], neg: &[f32], k: usize) -> f64 {
    if pos.is_empty() || k == 0 {
        return 0.0;
    }
    ranks(pos, neg, k).map(|r| 1.0 / r).sum::<f64>() / pos.len() as f64
}

/// Share of `pos[i]` ranked at most `h` among `neg[i·k..(i+1)·k]`.
pub(crate) fn hits_at(pos: &[f32], neg: &[f32], k: usize, h: usize) -> f64 {
    if pos.is_empty() || k == 0 {
        return 0.0;
    }
    let hits = ranks(pos, neg, k).filter(|&r| r <= h as f64).count();
    hits as f64 / pos.len() as f64
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
                LinkMetric::HitsAt(h) => hits_at(pos, neg, k, h),
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
    fn hits_counts_positives_ranked_at_most_k_among_their_own_negatives() {
        // Ranks: 1 (beats both), 2 (one above), 1.5 (one tie), 3 (both above).
        let pos = [0.9, 0.5, 0.3, 0.0];
        let neg = [0.1, 0.2, 0.7, 0.1, 0.3, 0.0, 0.4, 0.6];
        assert_eq!(hits_at(&pos, &neg, 2, 1), 0.25);
        assert_eq!(hits_at(&pos, &neg, 2, 2), 0.75);
        assert_eq!(hits_at(&pos, &neg, 2, 3), 1.0);
        assert_eq!(hits_at(&[], &[], 2, 1), 0.0);
        // Against the brute-force rank on random scores with ties: a hit is
        // a positive with fewer than h negatives strictly above it, ties half.
        let mut r = cpu_ops::Rng::new(3);
        let k = 9;
        let pos: Vec<f32> = (0..200).map(|_| (r.next_u64() % 7) as f32).collect();
        let neg: Vec<f32> = (0..200 * k).map(|_| (r.next_u64() % 7) as f32).collect();
        for h in [1, 3, 10] {
            let want = pos
                .iter()
                .enumerate()
                .filter(|&(i, &p)| {
                    let row = &neg[i * k..(i + 1) * k];
                    let gt = row.iter().filter(|&&n| n > p).count();
                    let eq = row.iter().filter(|&&n| n == p).count();
                    2 * gt + eq + 2 <= 2 * h
                })
                .count() as f64
                / pos.len() as f64;
            assert_eq!(hits_at(&pos, &neg, k, h), want, "h = {h}");
        }
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
