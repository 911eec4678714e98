//! Drawing a link-prediction split from a graph's own edges: [`EdgeSplitSpec`] (the
//! three fractions) and [`Dataset::split_edges`].
//!
//! Steps of [`Dataset::split_edges`] on a graph of `E` distinct edges:
//!
//! 1. The edges, each once: every stored entry `s → d` (row `d`), with repeats
//!    dropped; for a `symmetric` graph an edge and its reverse are one edge, listed
//!    as `(min, max)`.
//! 2. Counts: `round(val · E)` validation and `round(test · E)` test edges, the rest
//!    training; each part must get at least one edge.
//! 3. A partial Fisher–Yates shuffle with `Rng::new(seed)` moves a uniformly random
//!    sample of the held-out edges to the front: validation first, then test. Only
//!    the held-out count is drawn, so the training edges keep the graph's order.
//! 4. The graph is rebuilt from the training edges alone (both directions when
//!    `symmetric`), so no held-out edge stays in it in either direction.
//!
//! Deterministic for a seed, whatever the rayon thread count.

use std::str::FromStr;

use cpu_ops::{BuildOptions, CsrGraph, Rng};
use rayon::prelude::*;

use super::edges::{EdgeList, EdgeLookup, EdgeSplit};
use super::Dataset;
use crate::error::{DatasetProblem, Error, Result};

/// The fractions of a graph's edges that go to training, validation and test
/// (`"0.85,0.05,0.1"`): each positive, together 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EdgeSplitSpec {
    /// Fraction of training edges (they stay in the graph).
    pub train: f64,
    /// Fraction of validation edges (removed from the graph).
    pub val: f64,
    /// Fraction of test edges (removed from the graph).
    pub test: f64,
}

/// How far the fractions' sum may be from 1 (decimal fractions such as
/// `0.85 + 0.05 + 0.1` are not exact in binary).
const SUM_TOLERANCE: f64 = 1e-6;

impl EdgeSplitSpec {
    /// The spec `[train, val, test]`, checked ([`EdgeSplitSpec::validate`]).
    pub fn new(fractions: [f64; 3]) -> Result<Self> {
        let [train, val, test] = fractions;
        let spec = Self { train, val, test };
        spec.validate()?;
        Ok(spec)
    }

    /// Checks that every fraction is a finite number above 0 and that they add up
    /// to 1; the error names `edge_split` and the value.
    pub fn validate(&self) -> Result<()> {
        let parts = [
            ("train", self.train),
            ("val", self.val),
            ("test", self.test),
        ];
        for (name, f) in parts {
            if f < 0.0 {
                return Err(Error::invalid_argument(
                    "edge_split",
                    format!("the {name} fraction {f} is negative, expected a number in (0, 1)"),
                ));
            }
            if !f.is_finite() {
                return Err(Error::invalid_argument(
                    "edge_split",
                    format!("the {name} fraction is {f}, expected a number in (0, 1)"),
                ));
            }
            if f == 0.0 {
                return Err(Error::invalid_argument(
                    "edge_split",
                    format!("the {name} fraction is 0; every part needs edges"),
                ));
            }
        }
        let sum = self.train + self.val + self.test;
        if (sum - 1.0).abs() > SUM_TOLERANCE {
            return Err(Error::invalid_argument(
                "edge_split",
                format!(
                    "the fractions {},{},{} add up to {sum}, expected 1",
                    self.train, self.val, self.test
                ),
            ));
        }
        Ok(())
    }

    /// The validation and test counts for `edges` edges (step 2 of the module
    /// doc); an error when a part would get none.
    fn counts(&self, edges: usize) -> Result<(usize, usize)> {
        let val = (self.val * edges as f64).round() as usize;
        let test = (self.test * edges as f64).round() as usize;
        let train = edges.saturating_sub(val + test);
        for (name, k, f) in [
            ("training", train, self.train),
            ("validation", val, self.val),
            ("test", test, self.test),
        ] {
            if k == 0 {
                return Err(Error::dataset(
                    "edge_split",
                    &[],
                    DatasetProblem::Split {
                        what: format!(
                            "the graph has {edges} edges, and {f} of them gives no {name} edge; \
                             every part needs at least one"
                        ),
                    },
                ));
            }
        }
        Ok((val, test))
    }
}

impl FromStr for EdgeSplitSpec {
    type Err = String;
    /// `"TRAIN,VAL,TEST"` fractions, e.g. `"0.85,0.05,0.1"`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let [train, val, test] = parts.as_slice() else {
            return Err(format!(
                "`{s}`: expected three comma-separated fractions TRAIN,VAL,TEST that add up to 1"
            ));
        };
        let num = |p: &str| {
            p.parse::<f64>()
                .map_err(|_| format!("`{s}`: `{p}` is not a number"))
        };
        Self::new([num(train)?, num(val)?, num(test)?]).map_err(|e| match e {
            Error::InvalidArgument { reason, .. } => format!("`{s}`: {reason}"),
            e => e.to_string(),
        })
    }
}

impl std::fmt::Display for EdgeSplitSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{},{},{}", self.train, self.val, self.test)
    }
}

/// The graph's edges, each once (step 1 of the module doc), in row order.
pub(crate) fn edge_pairs(graph: &CsrGraph, symmetric: bool) -> Vec<(u32, u32)> {
    let lookup = EdgeLookup::new(graph);
    (0..graph.num_vertices() as u32)
        .into_par_iter()
        .flat_map_iter(|d| {
            let row = lookup.row(d);
            let lookup = &lookup;
            row.iter()
                .enumerate()
                .filter(move |&(k, &s)| k == 0 || row[k - 1] != s)
                .filter_map(move |(_, &s)| {
                    if !symmetric || s <= d {
                        Some((s, d))
                    } else if !lookup.contains(d, s) {
                        // Stored one way only: row `s` will not list it.
                        Some((d, s))
                    } else {
                        None
                    }
                })
        })
        .collect()
}

/// The training graph and the split of `graph`'s edges (module doc).
pub(crate) fn hold_out(
    graph: &CsrGraph,
    symmetric: bool,
    spec: &EdgeSplitSpec,
    seed: u64,
) -> Result<(CsrGraph, EdgeSplit)> {
    spec.validate()?;
    let mut pairs = edge_pairs(graph, symmetric);
    let (val, test) = spec.counts(pairs.len())?;
    let held = val + test;
    let mut rng = Rng::new(seed);
    for i in 0..held {
        let j = i + rng.below((pairs.len() - i) as u64) as usize;
        pairs.swap(i, j);
    }
    let opts = BuildOptions {
        symmetrize: symmetric,
        dedup: false,
        drop_self_loops: false,
    };
    let train_graph = CsrGraph::from_edges(graph.num_vertices(), &pairs[held..], opts)
        .map_err(|e| Error::cpu_ops("the training graph of an edge split", e))?;
    let split = EdgeSplit {
        train: EdgeList::from_pairs(&pairs[held..]),
        val: EdgeList::from_pairs(&pairs[..val]),
        test: EdgeList::from_pairs(&pairs[val..held]),
        val_neg: None,
        test_neg: None,
        symmetric,
    };
    Ok((train_graph, split))
}

impl Dataset {
    /// Holds out validation and test edges of the graph as `spec` says, with `seed`
    /// (steps in the module doc): the graph keeps only the training edges, and
    /// [`Dataset::edges`] holds the three parts. `symmetric`: the graph is
    /// undirected (every edge stored both ways), so an edge and its reverse are one
    /// edge and leave the graph together. A dataset that already has an edge split
    /// is refused.
    pub fn split_edges(mut self, spec: &EdgeSplitSpec, symmetric: bool, seed: u64) -> Result<Self> {
        if self.edges.is_some() {
            return Err(Error::dataset_invalid(
                "edges",
                "the dataset already has an edge split",
            ));
        }
        let (graph, split) = hold_out(&self.graph, symmetric, spec, seed)?;
        self.graph = graph;
        self.with_edge_split(split)
    }

    /// Sets the dataset's edge split (replacing any) and checks it against the
    /// graph ([`EdgeSplit::validate`]).
    pub fn with_edge_split(mut self, split: EdgeSplit) -> Result<Self> {
        split.validate(&self.graph)?;
        self.edges = Some(split);
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_name_the_problem() {
        let s: EdgeSplitSpec = "0.85, 0.05,0.1".parse().unwrap();
        assert_eq!((s.train, s.val, s.test), (0.85, 0.05, 0.1));
        assert_eq!(s.to_string(), "0.85,0.05,0.1");
        let bad = |text: &str, want: &str| {
            let e = text.parse::<EdgeSplitSpec>().unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        };
        bad("0.8,0.1", "three comma-separated");
        bad("0.8,0.1,x", "`x` is not a number");
        bad("0.9,0.05,0.1", "add up to 1.05");
        bad("1.1,-0.05,-0.05", "the val fraction -0.05 is negative");
        bad("0.9,0.1,0", "the test fraction is 0");
        bad("NaN,0.5,0.5", "the train fraction is NaN");
        let e = EdgeSplitSpec::new([0.5, 0.5, 0.5]).unwrap_err().to_string();
        assert!(e.starts_with("invalid value for `edge_split`"), "{e}");
    }

    fn ring(n: u32) -> CsrGraph {
        let e: Vec<(u32, u32)> = (0..n).map(|i| (i, (i + 1) % n)).collect();
        CsrGraph::from_edges(n as usize, &e, BuildOptions::UNDIRECTED).unwrap()
    }

    #[test]
    fn pairs_list_each_edge_once() {
        let g = ring(5);
        let p = edge_pairs(&g, true);
        assert_eq!(p, vec![(0, 1), (1, 2), (2, 3), (0, 4), (3, 4)]);
        assert_eq!(edge_pairs(&g, false).len(), 10);
        // Unsorted rows with a repeat, and an edge stored one way only (2 → 0).
        let odd = CsrGraph::new(vec![0, 3, 4, 4].into(), vec![2, 1, 1, 0].into()).unwrap();
        assert_eq!(edge_pairs(&odd, false), vec![(1, 0), (2, 0), (0, 1)]);
        assert_eq!(edge_pairs(&odd, true), vec![(0, 2), (0, 1)]);
    }

    #[test]
    fn hold_out_removes_held_edges_both_ways_and_is_seeded() {
        let g = ring(1000);
        let spec = EdgeSplitSpec::new([0.8, 0.1, 0.1]).unwrap();
        let (tg, s) = hold_out(&g, true, &spec, 7).unwrap();
        assert_eq!((s.train.len(), s.val.len(), s.test.len()), (800, 100, 100));
        assert_eq!(tg.num_edges(), 1600);
        s.validate(&tg).unwrap();
        let again = hold_out(&g, true, &spec, 7).unwrap();
        assert_eq!((&tg, &s), (&again.0, &again.1));
        let other = hold_out(&g, true, &spec, 8).unwrap().1;
        assert_ne!(other.val, s.val);
        // Every edge is in exactly one part.
        let mut all: Vec<(u32, u32)> = s
            .train
            .iter()
            .chain(s.val.iter())
            .chain(s.test.iter())
            .collect();
        all.sort_unstable();
        assert_eq!(all, {
            let mut p = edge_pairs(&g, true);
            p.sort_unstable();
            p
        });
        // Directed: a held-out edge leaves only its own direction.
        let (dg, ds) = hold_out(&g, false, &spec, 7).unwrap();
        assert_eq!(ds.train.len() + ds.val.len() + ds.test.len(), 2000);
        assert_eq!(dg.num_edges(), ds.train.len());
        ds.validate(&dg).unwrap();
    }

    #[test]
    fn a_graph_too_small_for_a_part_is_refused() {
        let spec = EdgeSplitSpec::new([0.85, 0.05, 0.1]).unwrap();
        let e = hold_out(&ring(6), true, &spec, 0).unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid dataset: edge_split: the graph has 6 edges, and 0.05 of them gives no \
             validation edge; every part needs at least one"
        );
    }
}
