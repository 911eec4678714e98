//! Partition files (`dist.partition_file`): which rank owns each vertex (its
//! feature row, and the seeds of every batch it trains). The format is METIS's
//! (`gpmetis` writes `graph.part.N`): a text file with one line per vertex, in
//! vertex order, holding the vertex's part, an integer in `0..ranks`. From Python:
//! `numpy.savetxt(path, parts, fmt="%d")`.

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
