//! Summary statistics of a labelled graph: degree distribution and edge homophily,
//! for generator reports and tests.

use std::fmt;

use cpu_ops::CsrGraph;
use rayon::prelude::*;

use crate::data::dataset::Dataset;

/// Degree and label statistics of a dataset's graph.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphStats {
    /// Number of vertices.
    pub num_vertices: usize,
    /// Stored (directed) neighbor entries; an undirected edge counts twice.
    pub stored_edges: usize,
    /// Mean degree (`stored_edges / num_vertices`).
    pub mean_degree: f64,
    /// Median degree.
    pub median_degree: usize,
    /// 99th-percentile degree.
    pub p99_degree: usize,
    /// Largest degree.
    pub max_degree: usize,
    /// Vertices with no neighbor.
    pub isolated: usize,
    /// Fraction of edges whose endpoints share a label (see [`edge_homophily`]).
    pub edge_homophily: f64,
}

impl GraphStats {
    /// Computes the statistics of `ds` (parallel, O(V log V + E)).
    pub fn of(ds: &Dataset) -> Self {
        let g = &ds.graph;
        let n = g.num_vertices();
        let mut deg: Vec<usize> = (0..n as u32).into_par_iter().map(|v| g.degree(v)).collect();
        deg.par_sort_unstable();
        let pct = |p: f64| {
            if n == 0 {
                0
            } else {
                deg[((n - 1) as f64 * p).round() as usize]
            }
        };
        Self {
            num_vertices: n,
            stored_edges: g.num_edges(),
            mean_degree: g.num_edges() as f64 / n.max(1) as f64,
            median_degree: pct(0.5),
            p99_degree: pct(0.99),
            max_degree: deg.last().copied().unwrap_or(0),
            isolated: deg.partition_point(|&d| d == 0),
            edge_homophily: edge_homophily(g, &ds.labels),
        }
    }
}

impl fmt::Display for GraphStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} vertices, {} stored edges ({} undirected); degree mean {:.2}, \
             median {}, p99 {}, max {}; {} isolated; edge homophily {:.4}",
            self.num_vertices,
            self.stored_edges,
            self.stored_edges / 2,
            self.mean_degree,
            self.median_degree,
            self.p99_degree,
            self.max_degree,
            self.isolated,
            self.edge_homophily,
        )
    }
}

/// Fraction of stored edges `(u, v)` with `labels[u] == labels[v]` (0 for a graph
/// without edges). For a symmetric graph this is the undirected edge homophily.
/// Panics if `labels` is shorter than the number of vertices.
pub fn edge_homophily(graph: &CsrGraph, labels: &[u32]) -> f64 {
    let n = graph.num_vertices();
    assert!(labels.len() >= n, "one label per vertex");
    let same: usize = (0..n as u32)
        .into_par_iter()
        .map(|v| {
            let l = labels[v as usize];
            graph
                .neighbors(v)
                .iter()
                .filter(|&&u| labels[u as usize] == l)
                .count()
        })
        .sum();
    same as f64 / graph.num_edges().max(1) as f64
}

/// Test-only evidence that labels follow the graph: accuracy on the test vertices of
/// a nearest-class-centroid classifier (centroids from the training vertices) on
/// raw features, and on features averaged over each vertex and its neighbors (one
/// GNN-like mean-aggregation hop). Returns `(features_only, one_hop)`.
#[cfg(test)]
pub(crate) fn centroid_accuracies(ds: &Dataset) -> (f64, f64) {
    let (n, d, c) = (
        ds.num_vertices(),
        ds.features.dim(),
        ds.num_classes as usize,
    );
    let agg: Vec<f32> = (0..n as u32)
        .flat_map(|v| {
            let nb = ds.graph.neighbors(v);
            let mut row = ds.features.row(v as usize).to_vec();
            for &u in nb {
                for (a, b) in row.iter_mut().zip(ds.features.row(u as usize)) {
                    *a += b;
                }
            }
            row.iter_mut().for_each(|a| *a /= (nb.len() + 1) as f32);
            row
        })
        .collect();
    let accuracy = |x: &[f32]| {
        let mut cent = vec![0f64; c * d];
        let mut cnt = vec![0usize; c];
        for v in ds.train_ids() {
            let l = ds.labels[v as usize] as usize;
            cnt[l] += 1;
            for (k, &f) in x[v as usize * d..][..d].iter().enumerate() {
                cent[l * d + k] += f as f64;
            }
        }
        for l in 0..c {
            cent[l * d..][..d]
                .iter_mut()
                .for_each(|m| *m /= cnt[l].max(1) as f64);
        }
        let test = ds.test_ids();
        let right = test
            .iter()
            .filter(|&&v| {
                let row = &x[v as usize * d..][..d];
                let best = (0..c)
                    .min_by(|&p, &q| {
                        let dist = |l: usize| -> f64 {
                            row.iter()
                                .zip(&cent[l * d..][..d])
                                .map(|(&a, &m)| (a as f64 - m).powi(2))
                                .sum()
                        };
                        dist(p).total_cmp(&dist(q))
                    })
                    .unwrap_or(0);
                best == ds.labels[v as usize] as usize
            })
            .count();
        right as f64 / test.len().max(1) as f64
    };
    (accuracy(ds.features.as_slice()), accuracy(&agg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpu_ops::{BuildOptions, FeatureMatrix};

    #[test]
    fn stats_of_a_star() {
        let edges: Vec<(u32, u32)> = (1..5).map(|i| (0, i)).collect();
        let graph = CsrGraph::from_edges(6, &edges, BuildOptions::UNDIRECTED).unwrap();
        let ds = Dataset {
            name: "star".into(),
            graph,
            features: FeatureMatrix::new(vec![0.0; 6].into(), 6, 1).unwrap(),
            labels: vec![0, 0, 0, 1, 1, 1].into(),
            num_classes: 2,
            train_mask: vec![0; 6].into(),
            val_mask: vec![0; 6].into(),
            test_mask: vec![0; 6].into(),
            edges: None,
        };
        let s = GraphStats::of(&ds);
        assert_eq!(s.stored_edges, 8);
        assert_eq!(s.max_degree, 4);
        assert_eq!(s.median_degree, 1);
        assert_eq!(s.isolated, 1);
        assert!((s.edge_homophily - 0.5).abs() < 1e-12, "{s}");
    }
}
