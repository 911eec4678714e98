//! Link-prediction splits: the positive edges of the training, validation and test
//! parts ([`EdgeList`]), optional fixed negatives, and the checks that keep held-out
//! edges out of the message-passing graph ([`EdgeSplit::validate`]).
//!
//! The dataset's `graph` is the message-passing graph. It holds every training edge
//! (both directions when the split is `symmetric`) and never a validation or test
//! edge, so a model sampled from it cannot read the answer.
//!
//! ```
//! use runtime::data::{generate_sbm, EdgeSplitSpec, SbmOptions};
//!
//! # fn main() -> runtime::Result<()> {
//! let ds = generate_sbm(&SbmOptions {
//!     num_vertices: 500,
//!     num_edges: 3000,
//!     edge_split: Some("0.85,0.05,0.1".parse::<EdgeSplitSpec>().unwrap()),
//!     ..SbmOptions::default()
//! })?;
//! let split = ds.edges.as_ref().unwrap();
//! assert!(split.symmetric);
//! // Every training edge is in the graph, no test edge is.
//! let (s, d) = split.train.get(0);
//! assert!(ds.graph.neighbors(d).contains(&s));
//! for (s, d) in split.test.iter() {
//!     assert!(!ds.graph.neighbors(d).contains(&s) && !ds.graph.neighbors(s).contains(&d));
//! }
//! # Ok(())
//! # }
//! ```

use std::borrow::Cow;

use cpu_ops::{CsrGraph, HostArray};
use rayon::prelude::*;

use crate::error::{DatasetProblem, Error, Result};

/// Positive edges of one split as parallel arrays of global vertex ids: edge `i` is
/// the message `src[i] → dst[i]` (the CSR entry "`src[i]` in row `dst[i]`").
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeList {
    /// Source vertex of each edge.
    pub src: HostArray<u32>,
    /// Destination vertex of each edge.
    pub dst: HostArray<u32>,
}

impl EdgeList {
    /// The edges `src[i] → dst[i]` (the arrays must have the same length, which
    /// [`EdgeSplit::validate`] checks).
    pub fn new(src: Vec<u32>, dst: Vec<u32>) -> Self {
        Self {
            src: src.into(),
            dst: dst.into(),
        }
    }

    /// The edges of `pairs`, `(src, dst)` each.
    pub fn from_pairs(pairs: &[(u32, u32)]) -> Self {
        let src = pairs.par_iter().map(|p| p.0).collect();
        let dst = pairs.par_iter().map(|p| p.1).collect();
        Self::new(src, dst)
    }

    /// Number of edges.
    pub fn len(&self) -> usize {
        self.src.len()
    }

    /// True when the list holds no edge.
    pub fn is_empty(&self) -> bool {
        self.src.is_empty()
    }

    /// Edge `i` as `(src, dst)`. Panics when `i` is out of range.
    pub fn get(&self, i: usize) -> (u32, u32) {
        (self.src[i], self.dst[i])
    }

    /// The edges in order, as `(src, dst)`.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (u32, u32)> + '_ {
        self.src.iter().copied().zip(self.dst.iter().copied())
    }
}

/// Link-prediction splits. The dataset's `graph` is the message-passing graph: it
/// holds the training edges (both directions when `symmetric`) and never a
/// validation or test edge.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeSplit {
    /// Training positives.
    pub train: EdgeList,
    /// Validation positives.
    pub val: EdgeList,
    /// Test positives.
    pub test: EdgeList,
    /// Optional fixed validation negatives: row `i` holds the negative destinations
    /// of positive `i` (`val.len() × k` ids, row-major; the positive's source is
    /// kept).
    pub val_neg: Option<HostArray<u32>>,
    /// Optional fixed test negatives, laid out as `val_neg`.
    pub test_neg: Option<HostArray<u32>>,
    /// The graph stores every training edge in both directions (an undirected
    /// graph); a held-out edge must then be absent in both directions too.
    pub symmetric: bool,
}

/// The parts of a split by name, for loops and messages.
const PARTS: [&str; 3] = ["train", "val", "test"];

impl EdgeSplit {
    /// The positives of `part` (`"train"`, `"val"` or `"test"`).
    fn part(&self, part: &str) -> &EdgeList {
        match part {
            "train" => &self.train,
            "val" => &self.val,
            _ => &self.test,
        }
    }

    /// Fixed negatives per validation positive (`None`: none stored).
    pub fn val_negatives_per_positive(&self) -> Option<usize> {
        per_positive(&self.val_neg, self.val.len())
    }

    /// Fixed negatives per test positive (`None`: none stored).
    pub fn test_negatives_per_positive(&self) -> Option<usize> {
        per_positive(&self.test_neg, self.test.len())
    }

    /// One line for `tandem info`: the sizes of the parts and the negatives.
    pub fn summary(&self) -> String {
        let neg = |k: Option<usize>| k.map_or("none".to_string(), |k| format!("{k}/positive"));
        format!(
            "edge split train/val/test = {}/{}/{} positive edges ({}), fixed negatives val {}, test {}",
            self.train.len(),
            self.val.len(),
            self.test.len(),
            if self.symmetric {
                "undirected: the graph stores training edges both ways"
            } else {
                "directed"
            },
            neg(self.val_negatives_per_positive()),
            neg(self.test_negatives_per_positive()),
        )
    }

    /// Checks the split against `graph` (errors are [`Error::Dataset`] on
    /// `edges.<part>...`, naming the element):
    ///
    /// 1. each part's `src` and `dst` have the same length, and no part is empty;
    /// 2. every id is below the vertex count;
    /// 3. every training positive is an edge of the graph (both directions when
    ///    `symmetric`);
    /// 4. no validation or test positive is an edge of the graph (in either
    ///    direction when `symmetric`), so in particular none is a training edge;
    /// 5. negatives, where given, hold a whole number `k ≥ 1` of ids per positive,
    ///    each below the vertex count.
    ///
    /// Parallel; O(E log d) for E positives with rows of degree d (a sorted copy of
    /// the neighbor ids is made first when the graph's rows are not sorted).
    pub fn validate(&self, graph: &CsrGraph) -> Result<()> {
        let n = graph.num_vertices();
        for part in PARTS {
            let list = self.part(part);
            if list.src.len() != list.dst.len() {
                return Err(Error::dataset(
                    format!("edges.{part}.dst"),
                    &[],
                    DatasetProblem::Count {
                        expected: list.src.len() as u64,
                        found: list.dst.len() as u64,
                        basis: "the length of its src array",
                    },
                ));
            }
            if list.is_empty() {
                return Err(Error::dataset(
                    format!("edges.{part}"),
                    &[],
                    DatasetProblem::Split {
                        what: "no edges; every part of an edge split needs at least one".into(),
                    },
                ));
            }
            for (side, ids) in [("src", &list.src), ("dst", &list.dst)] {
                check_ids(&format!("edges.{part}.{side}"), ids, n, |i| vec![i])?;
            }
        }
        let lookup = EdgeLookup::new(graph);
        let train = &self.train;
        let missing = (0..train.len()).into_par_iter().find_first(|&i| {
            let (s, d) = train.get(i);
            !lookup.contains(s, d) || (self.symmetric && !lookup.contains(d, s))
        });
        if let Some(i) = missing {
            let (s, d) = train.get(i);
            let what = if lookup.contains(s, d) {
                format!(
                    "({s}, {d}): the graph lacks its reverse {d} → {s}; a symmetric split \
                     stores every training edge in both directions"
                )
            } else {
                format!(
                    "({s}, {d}) is not an edge of the graph; the graph (message passing) holds \
                     every training edge"
                )
            };
            return Err(Error::dataset(
                "edges.train",
                &[i],
                DatasetProblem::Invalid { what },
            ));
        }
        for part in ["val", "test"] {
            let list = self.part(part);
            let in_graph = |(s, d): (u32, u32)| {
                lookup.contains(s, d) || (self.symmetric && lookup.contains(d, s))
            };
            if let Some(i) = (0..list.len())
                .into_par_iter()
                .find_first(|&i| in_graph(list.get(i)))
            {
                let (s, d) = list.get(i);
                let same =
                    |(a, b): (u32, u32)| (a, b) == (s, d) || (self.symmetric && (a, b) == (d, s));
                let what = match train.iter().position(same) {
                    Some(j) => format!(
                        "({s}, {d}) is also training edge edges.train[{j}]; validation and test \
                         edges never enter the sampled graph"
                    ),
                    None => format!(
                        "({s}, {d}) is an edge of the graph; validation and test edges never \
                         enter the sampled graph"
                    ),
                };
                return Err(Error::dataset(
                    format!("edges.{part}"),
                    &[i],
                    DatasetProblem::Invalid { what },
                ));
            }
        }
        for (part, neg) in [("val", &self.val_neg), ("test", &self.test_neg)] {
            let Some(neg) = neg else { continue };
            let positives = self.part(part).len();
            let field = format!("edges.{part}_neg");
            if neg.is_empty() || neg.len() % positives != 0 {
                return Err(Error::dataset(
                    field,
                    &[],
                    DatasetProblem::Invalid {
                        what: format!(
                            "length {}, expected a whole number k ≥ 1 of negatives for each of \
                             the {positives} positives of edges.{part} (k × {positives} ids)",
                            neg.len()
                        ),
                    },
                ));
            }
            let k = neg.len() / positives;
            check_ids(&field, neg, n, |i| vec![i / k, i % k])?;
        }
        Ok(())
    }
}

/// `neg.len() / positives` for stored negatives.
fn per_positive(neg: &Option<HostArray<u32>>, positives: usize) -> Option<usize> {
    neg.as_ref().map(|a| a.len() / positives.max(1))
}

/// Fails on the first id of `ids` not below `n`, naming `field` at `index(i)`.
fn check_ids(
    field: &str,
    ids: &[u32],
    n: usize,
    index: impl Fn(usize) -> Vec<usize>,
) -> Result<()> {
    match ids.par_iter().position_first(|&v| v as usize >= n) {
        Some(i) => Err(Error::dataset(
            field,
            &index(i),
            DatasetProblem::OutOfRange {
                value: ids[i].into(),
                bound: n as u64,
                bound_name: "the vertex count",
            },
        )),
        None => Ok(()),
    }
}

/// Answers "is `src → dst` an edge of the graph" by binary search in row `dst`:
/// on the graph's own rows when each is sorted (as every builder in Tandem makes
/// them), else on a sorted copy of the neighbor ids.
pub(crate) struct EdgeLookup<'g> {
    offsets: &'g [u64],
    indices: Cow<'g, [u32]>,
}

impl<'g> EdgeLookup<'g> {
    /// A lookup over `graph` (a parallel scan, and a sorted copy when rows are
    /// unsorted).
    pub(crate) fn new(graph: &'g CsrGraph) -> Self {
        let offsets = graph.offsets().as_slice();
        let indices = graph.indices().as_slice();
        let row = |v: usize| offsets[v] as usize..offsets[v + 1] as usize;
        let sorted = (0..graph.num_vertices())
            .into_par_iter()
            .all(|v| indices[row(v)].windows(2).all(|w| w[0] <= w[1]));
        let indices = if sorted {
            Cow::Borrowed(indices)
        } else {
            let mut copy = indices.to_vec();
            let mut rows: Vec<&mut [u32]> = Vec::with_capacity(graph.num_vertices());
            let mut rest = copy.as_mut_slice();
            for w in offsets.windows(2) {
                let (r, tail) = rest.split_at_mut((w[1] - w[0]) as usize);
                rows.push(r);
                rest = tail;
            }
            rows.par_iter_mut().for_each(|r| r.sort_unstable());
            Cow::Owned(copy)
        };
        Self { offsets, indices }
    }

    /// The sorted in-neighbors of `v`.
    pub(crate) fn row(&self, v: u32) -> &[u32] {
        let v = v as usize;
        &self.indices[self.offsets[v] as usize..self.offsets[v + 1] as usize]
    }

    /// Whether the graph stores `src` in row `dst` (ids below the vertex count).
    pub(crate) fn contains(&self, src: u32, dst: u32) -> bool {
        self.row(dst).binary_search(&src).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpu_ops::BuildOptions;

    /// A 6-cycle whose training graph lacks the edges 0-3 (val) and 1-4 (test).
    fn cycle() -> (CsrGraph, EdgeSplit) {
        let train = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0)];
        let g = CsrGraph::from_edges(6, &train, BuildOptions::UNDIRECTED).unwrap();
        let split = EdgeSplit {
            train: EdgeList::from_pairs(&train),
            val: EdgeList::from_pairs(&[(0, 3)]),
            test: EdgeList::from_pairs(&[(1, 4), (2, 5)]),
            val_neg: Some(vec![2, 4].into()),
            test_neg: None,
            symmetric: true,
        };
        (g, split)
    }

    fn err(g: &CsrGraph, s: &EdgeSplit) -> String {
        s.validate(g).unwrap_err().to_string()
    }

    #[test]
    fn a_good_split_passes_and_summarises() {
        let (g, s) = cycle();
        s.validate(&g).unwrap();
        assert_eq!(s.val_negatives_per_positive(), Some(2));
        assert_eq!(s.test_negatives_per_positive(), None);
        assert_eq!(s.train.iter().nth(1), Some((1, 2)));
        assert_eq!(s.train.iter().len(), 6);
        let text = s.summary();
        assert!(
            text.contains("6/1/2 positive edges") && text.contains("val 2/positive"),
            "{text}"
        );
    }

    #[test]
    fn each_rule_names_the_field_and_element() {
        let (g, good) = cycle();
        let mut s = good.clone();
        s.val = EdgeList::new(vec![], vec![]);
        assert_eq!(
            err(&g, &s),
            "invalid dataset: edges.val: no edges; every part of an edge split needs at least one"
        );
        let mut s = good.clone();
        s.test = EdgeList::new(vec![1, 2], vec![4]);
        assert!(err(&g, &s).starts_with("invalid dataset: edges.test.dst: length 1, expected 2"));
        let mut s = good.clone();
        s.test = EdgeList::from_pairs(&[(1, 4), (2, 9)]);
        assert_eq!(
            err(&g, &s),
            "invalid dataset: edges.test.dst[1] = 9 is not below the vertex count 6"
        );
        // A test edge that is a training edge, given in the other direction.
        let mut s = good.clone();
        s.test = EdgeList::from_pairs(&[(1, 4), (3, 2)]);
        let e = err(&g, &s);
        assert!(
            e.starts_with(
                "invalid dataset: edges.test[1]: (3, 2) is also training edge edges.train[2]"
            ) && e.contains("never enter the sampled graph"),
            "{e}"
        );
        // Symmetric: a held-out edge whose reverse only is stored (a one-way extra
        // edge 2 → 5 beside the training edges) is refused too.
        let mut both: Vec<(u32, u32)> = good
            .train
            .iter()
            .flat_map(|(s, d)| [(s, d), (d, s)])
            .collect();
        both.push((2, 5));
        let extra = CsrGraph::from_edges(6, &both, BuildOptions::DIRECTED).unwrap();
        let mut s = good.clone();
        s.test = EdgeList::from_pairs(&[(5, 2)]);
        assert!(err(&extra, &s).contains("edges.test[0]: (5, 2) is an edge of the graph"));
        // Directed: the reverse of a training edge is a legitimate held-out edge
        // when the graph does not store it.
        let dg = CsrGraph::from_edges(
            6,
            &good.train.iter().collect::<Vec<_>>(),
            BuildOptions::DIRECTED,
        )
        .unwrap();
        let mut s = good.clone();
        s.symmetric = false;
        s.test = EdgeList::from_pairs(&[(3, 2)]);
        s.validate(&dg).unwrap();
        // A training edge missing from the graph, or missing one direction.
        let mut s = good.clone();
        s.train = EdgeList::from_pairs(&[(0, 1), (0, 2)]);
        assert!(err(&g, &s).contains("edges.train[1]: (0, 2) is not an edge of the graph"));
        assert!(err(&dg, &good).contains("edges.train[0]: (0, 1): the graph lacks its reverse"));
        // A held-out edge in the graph that no training positive names.
        let mut s = good.clone();
        s.train = EdgeList::from_pairs(&[(0, 1)]);
        let e = err(&g, &{
            let mut t = s.clone();
            t.val = EdgeList::from_pairs(&[(2, 1)]);
            t
        });
        assert!(
            e.contains("edges.val[0]: (2, 1) is an edge of the graph"),
            "{e}"
        );
        // Negatives: a whole number per positive, ids in range.
        let mut s = good.clone();
        s.val_neg = Some(vec![].into());
        assert!(err(&g, &s).starts_with("invalid dataset: edges.val_neg: length 0, expected"));
        s.test_neg = Some(vec![0, 1, 2].into());
        s.val_neg = None;
        assert!(err(&g, &s).contains("edges.test_neg: length 3"));
        s.test_neg = Some(vec![0, 1, 2, 6].into());
        assert_eq!(
            err(&g, &s),
            "invalid dataset: edges.test_neg[1, 1] = 6 is not below the vertex count 6"
        );
    }

    #[test]
    fn lookup_sorts_unsorted_rows() {
        // Row 0 holds 2, 1 (unsorted) and a duplicate 2.
        let g = CsrGraph::new(vec![0, 3, 3, 4].into(), vec![2, 1, 2, 0].into()).unwrap();
        let l = EdgeLookup::new(&g);
        assert_eq!(l.row(0), &[1, 2, 2]);
        assert!(l.contains(1, 0) && l.contains(2, 0) && l.contains(0, 2));
        assert!(!l.contains(0, 0) && !l.contains(0, 1));
        let sorted = CsrGraph::from_edges(3, &[(0, 1)], BuildOptions::UNDIRECTED).unwrap();
        assert!(matches!(EdgeLookup::new(&sorted).indices, Cow::Borrowed(_)));
    }
}
