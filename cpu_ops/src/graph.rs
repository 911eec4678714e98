//! CSR graph topology: `u64` row offsets and `u32` neighbor ids.
//!
//! Row `v` lists the vertices whose messages flow *into* `v` (its in-neighbors, the
//! ones a GNN layer aggregates over), which is what DGL samples by default. For an
//! undirected graph both directions are stored, so rows are plain adjacency lists.

use rayon::prelude::*;

use crate::array::HostArray;
use crate::error::{CpuOpsError, Result};

/// An immutable graph in compressed sparse row form.
#[derive(Clone, Debug, PartialEq)]
pub struct CsrGraph {
    offsets: HostArray<u64>,
    indices: HostArray<u32>,
}

/// How [`CsrGraph::from_edges`] treats the edge list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildOptions {
    /// Store every edge in both directions.
    pub symmetrize: bool,
    /// Drop repeated neighbors within a row.
    pub dedup: bool,
    /// Drop edges `(v, v)`.
    pub drop_self_loops: bool,
}

impl BuildOptions {
    /// Undirected simple graph: symmetrized, deduplicated, no self-loops.
    pub const UNDIRECTED: Self = Self {
        symmetrize: true,
        dedup: true,
        drop_self_loops: true,
    };
    /// Directed graph with duplicates and self-loops removed.
    pub const DIRECTED: Self = Self {
        symmetrize: false,
        dedup: true,
        drop_self_loops: true,
    };
}

impl CsrGraph {
    /// Builds a graph from its arrays, checking every invariant:
    /// `offsets` has `n + 1` entries, starts at 0, never decreases, ends at
    /// `indices.len()`, and every neighbor id is below `n`.
    pub fn new(offsets: HostArray<u64>, indices: HostArray<u32>) -> Result<Self> {
        let g = Self { offsets, indices };
        g.validate()?;
        Ok(g)
    }

    /// Checks the invariants listed in [`CsrGraph::new`] (parallel, O(V + E)).
    pub fn validate(&self) -> Result<()> {
        let off = self.offsets.as_slice();
        let idx = self.indices.as_slice();
        if off.is_empty() {
            return Err(CpuOpsError::InvalidCsr {
                what: "offsets array is empty (it needs num_vertices + 1 entries)".into(),
            });
        }
        let n = off.len() - 1;
        if n > u32::MAX as usize {
            return Err(CpuOpsError::InvalidCsr {
                what: format!("{n} vertices do not fit u32 vertex ids"),
            });
        }
        if off[0] != 0 {
            return Err(CpuOpsError::InvalidCsr {
                what: format!("offsets[0] is {}, expected 0", off[0]),
            });
        }
        if off[n] != idx.len() as u64 {
            return Err(CpuOpsError::InvalidCsr {
                what: format!(
                    "offsets[{n}] is {}, expected the number of neighbor entries {}",
                    off[n],
                    idx.len()
                ),
            });
        }
        if let Some(v) = (0..n).into_par_iter().find_any(|&v| off[v] > off[v + 1]) {
            return Err(CpuOpsError::InvalidCsr {
                what: format!(
                    "offsets decrease at vertex {v} ({} > {})",
                    off[v],
                    off[v + 1]
                ),
            });
        }
        if let Some(&bad) = idx.par_iter().find_any(|&&u| u as usize >= n) {
            return Err(CpuOpsError::VertexOutOfRange {
                context: "CSR neighbor list",
                vertex: bad as u64,
                num_vertices: n,
            });
        }
        Ok(())
    }

    /// Builds a graph with `num_vertices` vertices from `(src, dst)` edges.
    ///
    /// Edge `(s, d)` puts `s` in row `d` (and `d` in row `s` when symmetrizing).
    /// Rows come out sorted by neighbor id. Runs in O(V + E) with a counting sort.
    pub fn from_edges(
        num_vertices: usize,
        edges: &[(u32, u32)],
        opts: BuildOptions,
    ) -> Result<Self> {
        if num_vertices > u32::MAX as usize {
            return Err(CpuOpsError::InvalidArgument {
                name: "num_vertices",
                reason: format!("{num_vertices} does not fit u32 vertex ids"),
            });
        }
        if let Some(&(s, d)) = edges
            .par_iter()
            .find_any(|&&(s, d)| s as usize >= num_vertices || d as usize >= num_vertices)
        {
            let vertex = if s as usize >= num_vertices { s } else { d };
            return Err(CpuOpsError::VertexOutOfRange {
                context: "edge list",
                vertex: vertex as u64,
                num_vertices,
            });
        }
        let keep = |s: u32, d: u32| !(opts.drop_self_loops && s == d);

        // 1. Degrees, then prefix sums.
        let mut offsets = zeroed_vec::<u64>(num_vertices + 1, "CSR offsets")?;
        for &(s, d) in edges {
            if keep(s, d) {
                offsets[d as usize + 1] += 1;
                if opts.symmetrize && s != d {
                    offsets[s as usize + 1] += 1;
                }
            }
        }
        for v in 0..num_vertices {
            offsets[v + 1] += offsets[v];
        }
        // 2. Scatter.
        let total = offsets[num_vertices] as usize;
        let mut indices = zeroed_vec::<u32>(total, "CSR neighbor ids")?;
        let mut cursor = zeroed_vec::<u64>(num_vertices, "CSR build cursor")?;
        cursor.copy_from_slice(&offsets[..num_vertices]);
        for &(s, d) in edges {
            if keep(s, d) {
                let c = &mut cursor[d as usize];
                indices[*c as usize] = s;
                *c += 1;
                if opts.symmetrize && s != d {
                    let c = &mut cursor[s as usize];
                    indices[*c as usize] = d;
                    *c += 1;
                }
            }
        }
        drop(cursor);
        // 3. Sort each row (and dedup) in parallel.
        let mut rows = split_rows_mut(&mut indices, &offsets);
        let new_len: Vec<u64> = rows
            .par_iter_mut()
            .map(|row| {
                row.sort_unstable();
                if opts.dedup {
                    dedup_sorted(row) as u64
                } else {
                    row.len() as u64
                }
            })
            .collect();
        drop(rows);
        // 4. Compact rows that lost duplicates.
        if opts.dedup {
            let mut write = 0usize;
            let mut new_offsets = zeroed_vec::<u64>(num_vertices + 1, "CSR offsets")?;
            for v in 0..num_vertices {
                let start = offsets[v] as usize;
                let len = new_len[v] as usize;
                indices.copy_within(start..start + len, write);
                write += len;
                new_offsets[v + 1] = write as u64;
            }
            indices.truncate(write);
            indices.shrink_to_fit();
            offsets = new_offsets;
        }
        Ok(Self {
            offsets: offsets.into(),
            indices: indices.into(),
        })
    }

    /// Number of vertices.
    pub fn num_vertices(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Number of stored (directed) neighbor entries; an undirected edge counts twice.
    pub fn num_edges(&self) -> usize {
        self.indices.len()
    }

    /// The neighbors of `v`. Panics if `v` is out of range (callers check ids first).
    pub fn neighbors(&self, v: u32) -> &[u32] {
        let v = v as usize;
        let off = self.offsets.as_slice();
        &self.indices[off[v] as usize..off[v + 1] as usize]
    }

    /// The number of neighbors of `v`.
    pub fn degree(&self, v: u32) -> usize {
        let off = self.offsets.as_slice();
        (off[v as usize + 1] - off[v as usize]) as usize
    }

    /// The row offsets (`num_vertices + 1` entries).
    pub fn offsets(&self) -> &HostArray<u64> {
        &self.offsets
    }

    /// The concatenated neighbor lists.
    pub fn indices(&self) -> &HostArray<u32> {
        &self.indices
    }

    /// Iterates `(src, dst)` pairs: for each row `dst`, each stored neighbor `src`.
    pub fn edges(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        (0..self.num_vertices() as u32)
            .flat_map(move |d| self.neighbors(d).iter().map(move |&s| (s, d)))
    }
}

/// A zeroed vector, or an error naming `what` when the allocation is refused
/// (instead of aborting the process on a size that came from user input).
fn zeroed_vec<T: Clone + Default>(len: usize, what: &'static str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| CpuOpsError::InvalidArgument {
            name: what,
            reason: format!("cannot allocate {len} × {} bytes", std::mem::size_of::<T>()),
        })?;
    v.resize(len, T::default());
    Ok(v)
}

/// Splits `indices` into one mutable slice per row.
fn split_rows_mut<'a>(indices: &'a mut [u32], offsets: &[u64]) -> Vec<&'a mut [u32]> {
    let mut rows = Vec::with_capacity(offsets.len().saturating_sub(1));
    let mut rest = indices;
    for w in offsets.windows(2) {
        let (row, tail) = rest.split_at_mut((w[1] - w[0]) as usize);
        rows.push(row);
        rest = tail;
    }
    rows
}

/// Removes consecutive repeats in a sorted slice in place; returns the new length.
fn dedup_sorted(row: &mut [u32]) -> usize {
    if row.is_empty() {
        return 0;
    }
    let mut w = 1;
    for r in 1..row.len() {
        if row[r] != row[w - 1] {
            row[w] = row[r];
            w += 1;
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_edges_undirected_dedups_and_drops_self_loops() {
        let edges = [(0, 1), (1, 0), (1, 2), (2, 2), (0, 1), (3, 1)];
        let g = CsrGraph::from_edges(5, &edges, BuildOptions::UNDIRECTED).unwrap();
        assert_eq!(g.num_vertices(), 5);
        assert_eq!(g.neighbors(0), &[1]);
        assert_eq!(g.neighbors(1), &[0, 2, 3]);
        assert_eq!(g.neighbors(2), &[1]);
        assert_eq!(g.neighbors(3), &[1]);
        assert_eq!(g.neighbors(4), &[] as &[u32]);
        assert_eq!(g.num_edges(), 6);
        g.validate().unwrap();
    }

    #[test]
    fn from_edges_directed_keeps_in_neighbors() {
        let edges = [(0, 1), (2, 1), (1, 0)];
        let g = CsrGraph::from_edges(3, &edges, BuildOptions::DIRECTED).unwrap();
        assert_eq!(g.neighbors(1), &[0, 2]);
        assert_eq!(g.neighbors(0), &[1]);
        assert_eq!(g.degree(2), 0);
        let back: Vec<_> = g.edges().collect();
        assert_eq!(back, vec![(1, 0), (0, 1), (2, 1)]);
    }

    #[test]
    fn from_edges_rejects_out_of_range() {
        let err = CsrGraph::from_edges(2, &[(0, 2)], BuildOptions::DIRECTED).unwrap_err();
        assert!(err.to_string().contains("vertex id 2"), "{err}");
    }

    #[test]
    fn new_rejects_bad_arrays() {
        let bad = [
            (vec![], vec![]),
            (vec![1, 1], vec![0]),
            (vec![0, 2, 1], vec![0, 1]),
            (vec![0, 1, 3], vec![0, 1]),
            (vec![0, 1, 2], vec![0, 5]),
        ];
        for (o, i) in bad {
            assert!(
                CsrGraph::new(o.clone().into(), i.clone().into()).is_err(),
                "{o:?} {i:?}"
            );
        }
        CsrGraph::new(vec![0, 1, 2].into(), vec![1, 0].into()).unwrap();
    }
}
