//! Pruning hot destinations out of a batch's bottom block, so the accelerator
//! neither gathers nor aggregates what the CPU's historical embeddings replace
//! (NeutronOrch's split of the bottom layer; docs/orchestration.md §9).
//!
//! 1. Destinations keep their positions (a block's destinations are its first
//!    sources, and layer 1 reads layer 0's rows by position).
//! 2. A hot destination's row loses its in-edges; a cold one keeps them, in order.
//! 3. Sources past the destinations are kept only when a kept edge reads them,
//!    renumbered in order of first use; their global ids follow.
//!
//! Layer 0 then computes a hot destination's row from its own features only, and
//! the historical embedding overwrites it; cold rows are unchanged for SAGE and
//! GAT. (GCN's block-local normalization counts the destinations that read a
//! source, so pruning changes the scale of cold rows whose neighbors hot
//! destinations also sampled, like sampling only the cold destinations' bottom hop
//! would.)

/// The pruned block: `(indptr, indices, src_ids)`.
pub(crate) type Pruned = (Vec<u64>, Vec<u32>, Vec<u32>);

/// Block `(indptr, indices)` with sources `src_ids` (global ids, destinations
/// first) without the in-edges of the destinations at `hot` positions (each below
/// `num_dst`), and with unused sources dropped (protocol in the module doc).
/// Returns `None` when an index or position is out of range (a malformed block).
pub(crate) fn prune_hot_destinations(
    indptr: &[u64],
    indices: &[u32],
    src_ids: &[u32],
    hot: &[u32],
) -> Option<Pruned> {
    let nd = indptr.len().checked_sub(1)?;
    if src_ids.len() < nd {
        return None;
    }
    let mut is_hot = vec![false; nd];
    for &p in hot {
        *is_hot.get_mut(p as usize)? = true;
    }
    const UNSEEN: u32 = u32::MAX;
    let mut new_of = vec![UNSEEN; src_ids.len()];
    for (i, slot) in new_of.iter_mut().enumerate().take(nd) {
        *slot = i as u32;
    }
    let mut new_src: Vec<u32> = src_ids[..nd].to_vec();
    let mut new_indptr = Vec::with_capacity(nd + 1);
    let mut new_indices = Vec::with_capacity(indices.len());
    new_indptr.push(0u64);
    for (i, &hot_row) in is_hot.iter().enumerate() {
        if !hot_row {
            let (a, b) = (indptr[i] as usize, indptr[i + 1] as usize);
            for &j in indices.get(a..b)? {
                let slot = new_of.get_mut(j as usize)?;
                if *slot == UNSEEN {
                    *slot = new_src.len() as u32;
                    new_src.push(src_ids[j as usize]);
                }
                new_indices.push(*slot);
            }
        }
        new_indptr.push(new_indices.len() as u64);
    }
    Some((new_indptr, new_indices, new_src))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_rows_lose_their_edges_and_unused_sources_go() {
        // 3 destinations (global 10, 11, 12) and sources 13, 14, 15.
        let indptr = [0u64, 2, 4, 5];
        let indices = [3u32, 1, 4, 5, 3];
        let src = [10u32, 11, 12, 13, 14, 15];
        let (p, x, s) = prune_hot_destinations(&indptr, &indices, &src, &[1]).unwrap();
        assert_eq!(p, [0, 2, 2, 3]);
        // Row 0 reads 13 and 11, row 2 reads 13: source 14 and 15 (only read by
        // the hot row 1) are dropped.
        assert_eq!(s, [10, 11, 12, 13]);
        assert_eq!(x, [3, 1, 3]);
        // Global ids of every kept edge are unchanged.
        let global = |p: &[u64], x: &[u32], s: &[u32], i: usize| -> Vec<u32> {
            x[p[i] as usize..p[i + 1] as usize]
                .iter()
                .map(|&j| s[j as usize])
                .collect()
        };
        for i in [0, 2] {
            assert_eq!(global(&p, &x, &s, i), global(&indptr, &indices, &src, i));
        }
        // No hot rows: the block is unchanged.
        let (p0, x0, s0) = prune_hot_destinations(&indptr, &indices, &src, &[]).unwrap();
        assert_eq!((p0.as_slice(), x0.as_slice()), (&indptr[..], &indices[..]));
        assert_eq!(s0, [10, 11, 12, 13, 14, 15]);
    }

    #[test]
    fn malformed_input_is_refused() {
        let indptr = [0u64, 1];
        assert!(prune_hot_destinations(&indptr, &[7], &[1, 2], &[]).is_none());
        assert!(prune_hot_destinations(&indptr, &[1], &[1, 2], &[3]).is_none());
        assert!(prune_hot_destinations(&[], &[], &[], &[]).is_none());
    }
}
