//! Relabeling vertices by hotness, so the hot set is an id prefix (XGNN's trick).
//!
//! A [`Relabeling`] is a permutation of the vertex ids (with its inverse) plus a
//! cut: after relabeling, `new_id < cut` means hot, a single comparison in every
//! sampler and gather loop. The runtime relabels once, before training:
//!
//! 1. score the vertices ([`crate::HotnessPolicy::scores`]);
//! 2. `let r = Relabeling::by_score(&scores, hot_ratio)?`;
//! 3. relabel the topology with [`Relabeling::apply_graph`], every per-vertex array
//!    (features with `row_len = dim`, labels and masks with `row_len = 1`) with
//!    [`Relabeling::apply_rows`], and id lists (training / validation / test
//!    vertices) with [`Relabeling::map_ids`];
//! 4. report results in the user's ids with [`Relabeling::old_id`] (or
//!    [`Relabeling::inverse`] applied to the arrays).

use cpu_ops::CsrGraph;

use crate::error::{invalid, Result, SchedulerError};
use crate::hotness::hotness_order;

/// A permutation of `0..n` and its inverse: `new_of_old[old_of_new[i]] == i`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permutation {
    new_of_old: Vec<u32>,
    old_of_new: Vec<u32>,
}

impl Permutation {
    /// The identity on `0..n`.
    pub fn identity(n: u32) -> Self {
        let ids: Vec<u32> = (0..n).collect();
        Self {
            new_of_old: ids.clone(),
            old_of_new: ids,
        }
    }

    /// The permutation that puts `old_of_new[i]` at new id `i`; fails unless
    /// `old_of_new` holds every id of `0..len` exactly once.
    pub fn from_old_of_new(old_of_new: Vec<u32>) -> Result<Self> {
        let n = old_of_new.len();
        if n > u32::MAX as usize {
            return Err(invalid("old_of_new", "at most u32::MAX ids", n));
        }
        let mut new_of_old = vec![u32::MAX; n];
        for (new, &old) in old_of_new.iter().enumerate() {
            let slot = new_of_old.get_mut(old as usize).ok_or_else(|| {
                SchedulerError::NotAPermutation {
                    what: "old_of_new",
                    len: n,
                    reason: format!("entry {new} is {old}, expected < {n}"),
                }
            })?;
            if *slot != u32::MAX {
                return Err(SchedulerError::NotAPermutation {
                    what: "old_of_new",
                    len: n,
                    reason: format!("id {old} appears at {} and {new}", *slot),
                });
            }
            *slot = new as u32;
        }
        Ok(Self {
            new_of_old,
            old_of_new,
        })
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.old_of_new.len()
    }

    /// Whether it permutes nothing.
    pub fn is_empty(&self) -> bool {
        self.old_of_new.is_empty()
    }

    /// `new_of_old[old]`: the new id of every old id.
    pub fn new_of_old(&self) -> &[u32] {
        &self.new_of_old
    }

    /// `old_of_new[new]`: the old id of every new id.
    pub fn old_of_new(&self) -> &[u32] {
        &self.old_of_new
    }

    /// The inverse permutation (maps new ids back to old ones).
    pub fn inverse(&self) -> Self {
        Self {
            new_of_old: self.old_of_new.clone(),
            old_of_new: self.new_of_old.clone(),
        }
    }

    /// The graph with every vertex renamed: row `new` is old row `old_of_new[new]`
    /// with its neighbors renamed and sorted (as [`CsrGraph::from_edges`] leaves rows).
    pub fn apply_graph(&self, graph: &CsrGraph) -> Result<CsrGraph> {
        let n = graph.num_vertices();
        if n != self.len() {
            return Err(SchedulerError::SizeMismatch {
                what: "graph vertices vs relabeling",
                expected: self.len(),
                found: n,
            });
        }
        let mut offsets = Vec::with_capacity(n + 1);
        let mut indices = Vec::with_capacity(graph.num_edges());
        offsets.push(0u64);
        for &old in &self.old_of_new {
            let start = indices.len();
            indices.extend(
                graph
                    .neighbors(old)
                    .iter()
                    .map(|&u| self.new_of_old[u as usize]),
            );
            indices[start..].sort_unstable();
            offsets.push(indices.len() as u64);
        }
        Ok(CsrGraph::new(offsets.into(), indices.into())?)
    }

    /// A per-vertex array (`row_len` values per vertex, row-major) with its rows in
    /// new-id order: row `new` of the result is row `old_of_new[new]` of `data`.
    pub fn apply_rows<T: Copy>(&self, data: &[T], row_len: usize) -> Result<Vec<T>> {
        if row_len == 0 {
            return Err(invalid("row_len", "at least 1 value per vertex", 0));
        }
        let want = self.len().checked_mul(row_len).ok_or_else(|| {
            invalid(
                "row_len",
                "a row length whose total size fits usize",
                row_len,
            )
        })?;
        if data.len() != want {
            return Err(SchedulerError::SizeMismatch {
                what: "per-vertex array length (vertices × row_len)",
                expected: want,
                found: data.len(),
            });
        }
        let mut out = Vec::with_capacity(want);
        for &old in &self.old_of_new {
            let o = old as usize * row_len;
            out.extend_from_slice(&data[o..o + row_len]);
        }
        Ok(out)
    }

    /// Renames a list of old ids (training vertices, seeds); fails on an id `>= n`.
    pub fn map_ids(&self, old_ids: &[u32]) -> Result<Vec<u32>> {
        old_ids
            .iter()
            .map(|&v| {
                self.new_of_old
                    .get(v as usize)
                    .copied()
                    .ok_or(SchedulerError::VertexOutOfRange {
                        context: "ids to relabel",
                        vertex: v as u64,
                        num_vertices: self.len(),
                    })
            })
            .collect()
    }
}

/// A hotness relabeling: a [`Permutation`] that sorts vertices hottest first, and
/// the number of hot vertices (`new_id < hot_count()` is hot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relabeling {
    perm: Permutation,
    hot: u32,
}

impl Relabeling {
    /// Relabels by score (higher is hotter; ties by old id) and makes the hottest
    /// `floor(hot_ratio × n)` vertices hot. `hot_ratio` must be in `[0, 1]`; 0
    /// disables embedding reuse (an empty hot set).
    pub fn by_score<S: Ord + Copy>(scores: &[S], hot_ratio: f64) -> Result<Self> {
        let hot = hot_count(scores.len(), hot_ratio)?;
        let perm = Permutation::from_old_of_new(hotness_order(scores)?)?;
        Ok(Self { perm, hot })
    }

    /// A relabeling from an explicit permutation and hot count (`hot <= n`).
    pub fn new(perm: Permutation, hot: u32) -> Result<Self> {
        if hot as usize > perm.len() {
            return Err(invalid(
                "hot",
                format!("at most the number of vertices ({})", perm.len()),
                hot,
            ));
        }
        Ok(Self { perm, hot })
    }

    /// The permutation.
    pub fn permutation(&self) -> &Permutation {
        &self.perm
    }

    /// The number of vertices.
    pub fn num_vertices(&self) -> usize {
        self.perm.len()
    }

    /// The number of hot vertices: new ids `0..hot_count()`.
    pub fn hot_count(&self) -> u32 {
        self.hot
    }

    /// Whether the vertex with this *new* id is hot.
    #[inline]
    pub fn is_hot(&self, new_id: u32) -> bool {
        new_id < self.hot
    }

    /// The new id of an old id (panics if `old >= n`; use [`Permutation::map_ids`]
    /// for ids from outside).
    #[inline]
    pub fn new_id(&self, old: u32) -> u32 {
        self.perm.new_of_old[old as usize]
    }

    /// The old id of a new id (panics if `new >= n`).
    #[inline]
    pub fn old_id(&self, new: u32) -> u32 {
        self.perm.old_of_new[new as usize]
    }

    /// The inverse permutation, to bring relabeled arrays back to the user's ids.
    pub fn inverse(&self) -> Permutation {
        self.perm.inverse()
    }

    /// See [`Permutation::apply_graph`].
    pub fn apply_graph(&self, graph: &CsrGraph) -> Result<CsrGraph> {
        self.perm.apply_graph(graph)
    }

    /// See [`Permutation::apply_rows`].
    pub fn apply_rows<T: Copy>(&self, data: &[T], row_len: usize) -> Result<Vec<T>> {
        self.perm.apply_rows(data, row_len)
    }

    /// See [`Permutation::map_ids`].
    pub fn map_ids(&self, old_ids: &[u32]) -> Result<Vec<u32>> {
        self.perm.map_ids(old_ids)
    }
}

/// `floor(ratio × n)`, after checking `ratio` is a number in `[0, 1]`.
pub fn hot_count(n: usize, ratio: f64) -> Result<u32> {
    if !(0.0..=1.0).contains(&ratio) {
        return Err(invalid("hot_ratio", "a number in [0, 1]", ratio));
    }
    if n > u32::MAX as usize {
        return Err(invalid("num_vertices", "at most u32::MAX", n));
    }
    Ok(((ratio * n as f64).floor() as usize).min(n) as u32)
}

#[cfg(test)]
mod tests {
    use cpu_ops::{BuildOptions, Rng};

    use super::*;
    use crate::hotness::degree_scores;

    fn random_graph(n: u32, m: usize, seed: u64) -> CsrGraph {
        let mut rng = Rng::new(seed);
        let edges: Vec<(u32, u32)> = (0..m)
            .map(|_| (rng.below(n as u64) as u32, rng.below(n as u64) as u32))
            .collect();
        CsrGraph::from_edges(n as usize, &edges, BuildOptions::UNDIRECTED).unwrap()
    }

    #[test]
    fn relabel_and_inverse_round_trip_graph_rows_and_ids() {
        let g = random_graph(200, 900, 3);
        let r = Relabeling::by_score(&degree_scores(&g), 0.2).unwrap();
        let g2 = r.apply_graph(&g).unwrap();
        assert_eq!(g2.num_edges(), g.num_edges());
        // Edges map one to one.
        for (s, d) in g.edges() {
            assert!(g2.neighbors(r.new_id(d)).contains(&r.new_id(s)));
        }
        let back = r.inverse().apply_graph(&g2).unwrap();
        assert_eq!(back, g);

        let feats: Vec<f32> = (0..200 * 3).map(|i| i as f32).collect();
        let f2 = r.apply_rows(&feats, 3).unwrap();
        for new in 0..200u32 {
            let old = r.old_id(new) as usize;
            assert_eq!(&f2[new as usize * 3..][..3], &feats[old * 3..][..3]);
        }
        assert_eq!(r.inverse().apply_rows(&f2, 3).unwrap(), feats);

        let ids = [5u32, 0, 199];
        let mapped = r.map_ids(&ids).unwrap();
        assert_eq!(r.inverse().map_ids(&mapped).unwrap(), ids);
        for (&o, &n) in ids.iter().zip(&mapped) {
            assert_eq!(r.old_id(n), o);
        }
    }

    #[test]
    fn hot_set_is_an_id_prefix_of_the_hottest_vertices() {
        let g = random_graph(300, 1500, 8);
        let scores = degree_scores(&g);
        let r = Relabeling::by_score(&scores, 0.1).unwrap();
        assert_eq!(r.hot_count(), 30);
        let g2 = r.apply_graph(&g).unwrap();
        // After relabeling, degree is non-increasing in the new id, so every hot
        // vertex is at least as hot as every cold one.
        let min_hot = (0..30).map(|v| g2.degree(v)).min().unwrap();
        let max_cold = (30..300).map(|v| g2.degree(v)).max().unwrap();
        assert!(min_hot >= max_cold, "{min_hot} < {max_cold}");
        assert!((0..299).all(|v| g2.degree(v) >= g2.degree(v + 1)));
        assert!(r.is_hot(29) && !r.is_hot(30));
    }

    #[test]
    fn hot_ratio_zero_gives_an_empty_hot_set_and_one_gives_all() {
        let scores = [3u64, 1, 2];
        let r = Relabeling::by_score(&scores, 0.0).unwrap();
        assert_eq!(r.hot_count(), 0);
        assert!((0..3).all(|v| !r.is_hot(v)));
        assert_eq!(Relabeling::by_score(&scores, 1.0).unwrap().hot_count(), 3);
        assert_eq!(hot_count(10, 0.25).unwrap(), 2);
        for bad in [-0.1, 1.5, f64::NAN] {
            let e = Relabeling::by_score(&scores, bad).unwrap_err();
            assert!(e.to_string().contains("hot_ratio"), "{e}");
        }
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let e = Permutation::from_old_of_new(vec![0, 2, 2]).unwrap_err();
        assert!(e.to_string().contains("appears at 1 and 2"), "{e}");
        let e = Permutation::from_old_of_new(vec![0, 3, 1]).unwrap_err();
        assert!(e.to_string().contains("expected < 3"), "{e}");
        let p = Permutation::identity(3);
        assert!(p.apply_rows(&[1.0f32; 5], 2).is_err());
        assert!(p.apply_rows(&[1.0f32; 3], 0).is_err());
        assert!(p.map_ids(&[3]).is_err());
        let g = random_graph(4, 4, 1);
        assert!(p.apply_graph(&g).is_err());
        assert!(Relabeling::new(p, 4).is_err());
    }
}
