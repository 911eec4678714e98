//! A host-backend block: an owned CSR validated once, kept next to its
//! [`cpu_ops::BlockView`] so the view's cached transpose (built by the first backward
//! pass or `GcnNorm` forward) lives as long as the block and is shared by every op.
//!
//! The view borrows the CSR it sits next to; `self_cell` owns both and hands out the
//! view only with a lifetime tied to the block, so no `unsafe` is needed here.

use cpu_ops::BlockView;
use self_cell::self_cell;

use crate::error::{GpuOpsError, Result};

/// The owned CSR of a block.
#[derive(Debug)]
struct Csr {
    num_src: usize,
    indptr: Vec<u64>,
    indices: Vec<u32>,
}

/// `BlockView` under the single-lifetime name `self_cell` needs.
type View<'a> = BlockView<'a>;

self_cell!(
    /// The CSR and the validated view over it.
    struct Cell {
        owner: Csr,
        #[covariant]
        dependent: View,
    }
    impl {Debug}
);

/// A block (message-flow graph) of the host backend: `num_dst + 1` offsets, edge
/// sources below `num_src`, destinations first among the sources; validated once.
#[derive(Debug)]
pub struct HostBlock {
    cell: Cell,
}

impl HostBlock {
    /// Validates and takes ownership of a block's CSR ([`BlockView::new`]'s checks:
    /// `indptr` starts at 0, never decreases and ends at `indices.len()`,
    /// `num_dst <= num_src`, every index below `num_src`).
    pub(crate) fn new(num_src: usize, indptr: Vec<u64>, indices: Vec<u32>) -> Result<Self> {
        let csr = Csr {
            num_src,
            indptr,
            indices,
        };
        let cell = Cell::try_new(csr, |c| BlockView::new(c.num_src, &c.indptr, &c.indices))?;
        Ok(Self { cell })
    }

    /// [`crate::Sampling::add_self_loops`]: destination `i` reads `N(i)` then source
    /// `i` itself (the augmented block `cpu_ops`' GCN layer builds).
    pub(crate) fn with_self_loops(&self) -> Result<Self> {
        let (nd, view) = (self.num_dst(), self.view());
        if nd > u32::MAX as usize {
            return Err(GpuOpsError::InvalidArgument {
                name: "block",
                reason: format!("{nd} destinations do not fit u32 source ids"),
            });
        }
        let mut indptr = Vec::with_capacity(nd + 1);
        let mut indices = Vec::with_capacity(self.num_edges() + nd);
        indptr.push(0u64);
        for i in 0..nd {
            indices.extend_from_slice(view.neighbors(i));
            indices.push(i as u32);
            indptr.push(indices.len() as u64);
        }
        Self::new(self.num_src(), indptr, indices)
    }

    /// The validated view (its transpose is built once and cached).
    pub fn view(&self) -> &BlockView<'_> {
        self.cell.borrow_dependent()
    }

    /// Number of sources.
    pub fn num_src(&self) -> usize {
        self.cell.borrow_owner().num_src
    }

    /// Number of destinations.
    pub fn num_dst(&self) -> usize {
        self.view().num_dst()
    }

    /// Number of edges.
    pub fn num_edges(&self) -> usize {
        self.view().num_edges()
    }

    /// The offsets (`num_dst + 1` entries).
    pub fn indptr(&self) -> &[u64] {
        &self.cell.borrow_owner().indptr
    }

    /// The local source id of every edge.
    pub fn indices(&self) -> &[u32] {
        &self.cell.borrow_owner().indices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_once_and_exposes_the_csr() {
        let b = HostBlock::new(4, vec![0, 2, 2, 3], vec![1, 3, 0]).unwrap();
        assert_eq!((b.num_src(), b.num_dst(), b.num_edges()), (4, 3, 3));
        assert_eq!(b.indptr(), &[0, 2, 2, 3]);
        assert_eq!(b.indices(), &[1, 3, 0]);
        assert_eq!(b.view().neighbors(0), &[1, 3]);
        // The transpose is built on demand and stays with the block.
        assert_eq!(b.view().out_degree(3), 1);
        assert_eq!(b.view().out_degree(2), 0);
        let moved = b;
        assert_eq!(moved.view().out_degree(0), 1);
    }

    #[test]
    fn self_loops_follow_each_neighbor_list() {
        let b = HostBlock::new(5, vec![0, 2, 2, 3], vec![4, 1, 0]).unwrap();
        let a = b.with_self_loops().unwrap();
        assert_eq!(a.num_src(), 5);
        assert_eq!(a.indptr(), &[0, 3, 4, 6]);
        assert_eq!(a.indices(), &[4, 1, 0, 1, 0, 2]);
    }

    #[test]
    fn malformed_blocks_are_errors() {
        for (num_src, indptr, indices) in [
            (4, vec![], vec![]),
            (4, vec![1, 1], vec![]),
            (4, vec![0, 2, 1], vec![0, 0]),
            (4, vec![0, 1], vec![4]),
            (1, vec![0, 0, 0], vec![]),
            (4, vec![0, 3], vec![0, 1]),
        ] {
            let err = HostBlock::new(num_src, indptr.clone(), indices.clone()).unwrap_err();
            assert!(
                matches!(err, GpuOpsError::CpuOps(_)),
                "{indptr:?} {indices:?}: {err}"
            );
        }
    }
}
