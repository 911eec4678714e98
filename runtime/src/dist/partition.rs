//! Partition files (`dist.partition_file`): which rank owns each vertex (its
//! feature row, and the seeds of every batch it trains). The format is METIS's
//! (`gpmetis` writes `graph.part.N`): a text file with one line per vertex, in
//! vertex order, holding the vertex's part, an integer in `0..ranks`. From Python:
//! `numpy.savetxt(path, parts, fmt="%d")`.
//!
//! With the `metis` feature, `partition_graph` computes one with METIS's
//! k-way partitioner (`tandem partition`).

use std::io::Write;
use std::path::Path;

use crate::atomic::write_file_atomically;
use crate::error::{Error, Result};

/// Reads a partition of `n` vertices into `ranks` parts; every error names the
/// file and, where there is one, the line.
pub fn read_partition_file(path: &Path, n: usize, ranks: usize) -> Result<Vec<u32>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut parts = Vec::with_capacity(n);
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() {
            // Trailing blank lines are fine; a blank line inside is not.
            if text.lines().skip(i).all(|l| l.trim().is_empty()) {
                break;
            }
            return Err(Error::format(
                path,
                format!(
                    "line {}: empty; expected one part (0..{ranks}) per line",
                    i + 1
                ),
            ));
        }
        let p: u64 = t.parse().map_err(|_| {
            Error::format(
                path,
                format!(
                    "line {}: `{t}` is not a part number; expected an integer in 0..{ranks} \
                     (one per vertex, METIS format)",
                    i + 1
                ),
            )
        })?;
        if p >= ranks as u64 {
            return Err(Error::format(
                path,
                format!(
                    "line {}: part {p}, but the job has {ranks} ranks (parts 0..{ranks})",
                    i + 1
                ),
            ));
        }
        parts.push(p as u32);
    }
    if parts.len() != n {
        return Err(Error::format(
            path,
            format!(
                "{} parts, expected one per vertex of the dataset ({n})",
                parts.len()
            ),
        ));
    }
    Ok(parts)
}

/// Writes `parts` in the format [`read_partition_file`] reads (to a temporary
/// name, then renamed).
pub fn write_partition_file(path: &Path, parts: &[u32]) -> Result<()> {
    write_file_atomically(path, |w| {
        for p in parts {
            writeln!(w, "{p}").map_err(|e| Error::io(path, e))?;
        }
        Ok(())
    })
}

/// A METIS k-way partition of `g` into `parts` parts of balanced vertex counts
/// (METIS's default 3% imbalance) with few edges between parts, seeded by
/// `seed`. METIS needs an undirected graph without self-loops: the adjacency
/// handed to it is `g`'s, symmetrized, without self-loops and duplicates (the
/// partition of a directed graph is that of its undirected version).
#[cfg(feature = "metis")]
pub fn partition_graph(g: &cpu_ops::CsrGraph, parts: usize, seed: u64) -> Result<Vec<u32>> {
    let n = g.num_vertices();
    if parts == 0 {
        return Err(Error::invalid_argument("parts", "expected at least 1"));
    }
    if parts == 1 || n == 0 {
        return Ok(vec![0; n]);
    }
    let too_large = |what: &str| {
        Error::invalid_argument(
            "graph",
            format!("{what} exceeds METIS's 32-bit indices (this build's `idx_t`)"),
        )
    };
    let nparts = metis::Idx::try_from(parts).map_err(|_| too_large("the part count"))?;
    metis::Idx::try_from(n).map_err(|_| too_large("the vertex count"))?;
    // Symmetrize: every edge in both directions, then sort and dedup each row.
    let mut degree = vec![0usize; n];
    for u in 0..n as u32 {
        for &v in g.neighbors(u) {
            if v != u {
                degree[u as usize] += 1;
                degree[v as usize] += 1;
            }
        }
    }
    let mut start = Vec::with_capacity(n + 1);
    start.push(0usize);
    for d in &degree {
        start.push(start.last().copied().unwrap_or(0) + d);
    }
    let total = start[n];
    metis::Idx::try_from(total).map_err(|_| too_large("twice the edge count"))?;
    let mut adj = vec![0 as metis::Idx; total];
    let mut fill = start[..n].to_vec();
    for u in 0..n as u32 {
        for &v in g.neighbors(u) {
            if v != u {
                adj[fill[u as usize]] = v as metis::Idx;
                fill[u as usize] += 1;
                adj[fill[v as usize]] = u as metis::Idx;
                fill[v as usize] += 1;
            }
        }
    }
    let mut xadj: Vec<metis::Idx> = Vec::with_capacity(n + 1);
    let mut adjncy: Vec<metis::Idx> = Vec::with_capacity(total);
    xadj.push(0);
    for u in 0..n {
        let row = &mut adj[start[u]..start[u + 1]];
        row.sort_unstable();
        let mut last = None;
        for &v in row.iter() {
            if last != Some(v) {
                adjncy.push(v);
                last = Some(v);
            }
        }
        // Fits: at most `total`, checked above.
        xadj.push(adjncy.len() as metis::Idx);
    }
    drop(adj);
    let mut part = vec![0 as metis::Idx; n];
    let metis_err = |e: &dyn std::fmt::Display| Error::Dist {
        what: format!("METIS could not partition the graph: {e}"),
    };
    metis::Graph::new(1, nparts, &xadj, &adjncy)
        .map_err(|e| metis_err(&e))?
        .set_option(metis::option::Seed((seed & 0x7FFF_FFFF) as metis::Idx))
        .part_kway(&mut part)
        .map_err(|e| metis_err(&e))?;
    Ok(part.into_iter().map(|p| p as u32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_partition_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.part.3");
        let parts = vec![0u32, 2, 1, 1, 0];
        write_partition_file(&path, &parts).unwrap();
        assert_eq!(read_partition_file(&path, 5, 3).unwrap(), parts);
        // Trailing blank lines and spaces are fine (METIS ends with a newline).
        std::fs::write(&path, " 0\n2 \n1\n1\n0\n\n\n").unwrap();
        assert_eq!(read_partition_file(&path, 5, 3).unwrap(), parts);
    }

    /// METIS on two dense communities joined by one edge finds them, balanced,
    /// on a directed input with self-loops and duplicate edges.
    #[cfg(feature = "metis")]
    #[test]
    fn metis_finds_two_communities() {
        use cpu_ops::{BuildOptions, CsrGraph};
        let mut edges = Vec::new();
        for c in 0..2u32 {
            for i in 0..20u32 {
                // A clique (one direction only, and self-loops); interleaved ids:
                // community c holds the ids ≡ c (mod 2).
                for j in i..20u32 {
                    edges.push((2 * i + c, 2 * j + c));
                }
            }
        }
        edges.push((0, 1));
        edges.push((0, 1));
        let g = CsrGraph::from_edges(
            40,
            &edges,
            BuildOptions {
                symmetrize: false,
                dedup: false,
                drop_self_loops: false,
            },
        )
        .unwrap();
        let parts = partition_graph(&g, 2, 7).unwrap();
        assert_eq!(parts.len(), 40);
        let counts = [0u32, 1].map(|p| parts.iter().filter(|&&x| x == p).count());
        assert_eq!(counts, [20, 20], "{parts:?}");
        for v in 0..40 {
            assert_eq!(parts[v] == parts[0], v % 2 == 0, "{parts:?}");
        }
        assert_eq!(partition_graph(&g, 1, 0).unwrap(), vec![0; 40]);
        assert!(partition_graph(&g, 0, 0).is_err());
    }

    #[test]
    fn bad_partition_files_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.txt");
        for (text, n, want) in [
            (
                "0\n1\n",
                3,
                "2 parts, expected one per vertex of the dataset (3)",
            ),
            ("0\n1\n1\n0\n", 3, "4 parts"),
            ("0\n3\n1\n", 3, "line 2: part 3, but the job has 3 ranks"),
            ("0\n-1\n1\n", 3, "line 2: `-1` is not a part number"),
            ("0\nx\n1\n", 3, "line 2: `x` is not a part number"),
            ("0\n\n1\n", 3, "line 2: empty"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = read_partition_file(&path, n, 3).unwrap_err().to_string();
            assert!(e.contains("p.txt") && e.contains(want), "{text:?}: {e}");
        }
        let e = read_partition_file(&dir.path().join("missing"), 3, 3)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing"), "{e}");
    }
}
