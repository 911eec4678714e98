//! Labels and features for graphs that come without them, made so that accuracy
//! means something: labels follow the topology and features follow the labels.

use std::collections::VecDeque;

use cpu_ops::{CsrGraph, FeatureMatrix, Rng};
use rayon::prelude::*;

use crate::progress::Meter;

/// Class-correlated features: class `c` gets a random center `μ_c` with N(0, 1)
/// entries; vertex `v` gets `signal · μ_{label(v)} + ε`, ε ~ N(0, 1) per entry.
/// With `signal` around 0.2–0.5 features alone classify poorly and neighbors help.
/// Deterministic for a seed whatever the thread count.
pub fn class_features(
    labels: &[u32],
    num_classes: u32,
    dim: usize,
    signal: f32,
    seed: u64,
) -> FeatureMatrix {
    class_features_metered(labels, num_classes, dim, signal, seed, None)
}

/// Rows per progress report of [`class_features_metered`].
const FEATURE_ROWS_PER_REPORT: usize = 1 << 14;

/// [`class_features`], adding each block of rows done to `meter`.
pub(crate) fn class_features_metered(
    labels: &[u32],
    num_classes: u32,
    dim: usize,
    signal: f32,
    seed: u64,
    meter: Option<&Meter<'_>>,
) -> FeatureMatrix {
    let mut crng = Rng::for_stream(seed, u64::MAX);
    let centers: Vec<f32> = (0..num_classes as usize * dim)
        .map(|_| crng.normal() as f32)
        .collect();
    let mut data = vec![0f32; labels.len() * dim];
    if dim > 0 {
        let block = FEATURE_ROWS_PER_REPORT * dim;
        data.par_chunks_mut(block)
            .enumerate()
            .for_each(|(b, rows)| {
                let first = b * FEATURE_ROWS_PER_REPORT;
                for (i, row) in rows.chunks_exact_mut(dim).enumerate() {
                    let v = first + i;
                    let mut rng = Rng::for_stream(seed, v as u64);
                    let c = labels[v] as usize;
                    let mu = &centers[c * dim..(c + 1) * dim];
                    let mut pairs = row.chunks_exact_mut(2);
                    let mut mus = mu.chunks_exact(2);
                    for (x, m) in (&mut pairs).zip(&mut mus) {
                        let (z1, z2) = rng.normal_pair();
                        x[0] = signal * m[0] + z1 as f32;
                        x[1] = signal * m[1] + z2 as f32;
                    }
                    if let ([x], [m]) = (pairs.into_remainder(), mus.remainder()) {
                        *x = signal * m + rng.normal() as f32;
                    }
                }
                if let Some(m) = meter {
                    m.add((rows.len() / dim) as u64);
                }
            });
    }
    FeatureMatrix::new(data.into(), labels.len(), dim)
        .unwrap_or_else(|_| unreachable!("data has labels.len() * dim values by construction"))
}

/// Labels that follow the graph: `num_classes` random seed vertices grow regions by
/// multi-source breadth-first search; each vertex takes the label of the region that
/// reaches it first. Vertices no region reaches (other components) get a random label.
pub fn region_labels(graph: &CsrGraph, num_classes: u32, seed: u64) -> Vec<u32> {
    let n = graph.num_vertices();
    let mut labels = vec![u32::MAX; n];
    if n == 0 || num_classes == 0 {
        return vec![0; n];
    }
    let mut rng = Rng::new(seed);
    let mut queue = VecDeque::new();
    for c in 0..num_classes.min(n as u32) {
        // Pick an unlabelled seed (bounded retries keep this O(classes) in practice).
        for _ in 0..64 {
            let v = rng.below(n as u64) as usize;
            if labels[v] == u32::MAX {
                labels[v] = c;
                queue.push_back(v as u32);
                break;
            }
        }
    }
    while let Some(u) = queue.pop_front() {
        let l = labels[u as usize];
        for &w in graph.neighbors(u) {
            if labels[w as usize] == u32::MAX {
                labels[w as usize] = l;
                queue.push_back(w);
            }
        }
    }
    for l in labels.iter_mut().filter(|l| **l == u32::MAX) {
        *l = rng.below(num_classes as u64) as u32;
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpu_ops::BuildOptions;

    #[test]
    fn features_are_class_correlated_and_deterministic() {
        let labels: Vec<u32> = (0..2000).map(|i| i % 2).collect();
        let f = class_features(&labels, 2, 16, 1.0, 5);
        assert_eq!(f, class_features(&labels, 2, 16, 1.0, 5));
        // Class means differ by about the center distance; within-class noise averages out.
        let mean = |c: u32| -> Vec<f32> {
            let mut m = vec![0f32; 16];
            for v in (0..2000).filter(|&v| labels[v] == c) {
                for (a, b) in m.iter_mut().zip(f.row(v)) {
                    *a += b / 1000.0;
                }
            }
            m
        };
        let (m0, m1) = (mean(0), mean(1));
        let dist: f32 = m0
            .iter()
            .zip(&m1)
            .map(|(a, b)| (a - b).powi(2))
            .sum::<f32>()
            .sqrt();
        assert!(dist > 2.0, "{dist}");
    }

    #[test]
    fn region_labels_are_homophilous_on_a_path() {
        let edges: Vec<(u32, u32)> = (0..999).map(|i| (i, i + 1)).collect();
        let g = CsrGraph::from_edges(1000, &edges, BuildOptions::UNDIRECTED).unwrap();
        let l = region_labels(&g, 4, 1);
        assert!(l.iter().all(|&x| x < 4));
        let same = edges
            .iter()
            .filter(|&&(a, b)| l[a as usize] == l[b as usize])
            .count();
        assert!(same >= 999 - 4, "{same}");
    }
}
