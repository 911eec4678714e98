//! Vertex embeddings: what a trained model says about every vertex, as a service
//! serves it.
//!
//! An embedding is the output of the layer below the classifier (layer `L-2` of an
//! `L`-layer model, after its activation, without dropout), computed by layer-wise
//! full-neighbor inference over the whole graph: each layer is applied to every
//! vertex with all its neighbors before the next, which is what DGL users get from
//! `model.inference(g, x)` with the last layer left out, and GCN's normalization
//! uses full-graph degrees. Width: `model.hidden` (GAT: heads concatenated). A
//! 1-layer model has no hidden layer; its "layer below the classifier" is the input,
//! so its embeddings are the input features.
//!
//! [`Embeddings`] is an immutable snapshot shared by reference count: clone it to
//! as many request handlers as needed while the trainer trains on (it does not
//! change when the weights do; [`Embeddings::steps`] says which weight version made
//! it).

use std::sync::Arc;

use crate::error::{Error, Result};

/// Every vertex's embedding at one weight version (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Embeddings {
    dim: usize,
    steps: u64,
    data: Arc<[f32]>,
}

impl Embeddings {
    /// A snapshot of `data` (`num_vertices × dim`, row-major) made at weight
    /// version `steps`; `dim` must divide the length.
    pub fn new(data: Vec<f32>, dim: usize, steps: u64) -> Result<Self> {
        if dim == 0 || !data.len().is_multiple_of(dim) {
            return Err(Error::invalid_argument(
                "dim",
                format!("{dim} does not divide the {} embedding values", data.len()),
            ));
        }
        Ok(Self {
            dim,
            steps,
            data: data.into(),
        })
    }

    /// Values per vertex.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Vertices covered (all of the dataset's).
    pub fn num_vertices(&self) -> usize {
        self.data.len() / self.dim
    }

    /// The weight version (optimizer steps) the snapshot was computed at.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// All rows, `num_vertices × dim`, row-major.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// The row of vertex `v`, or `None` when `v` is out of range.
    pub fn row(&self, v: u32) -> Option<&[f32]> {
        let start = (v as usize).checked_mul(self.dim)?;
        self.data.get(start..start + self.dim)
    }

    /// The rows of `ids`, in order, concatenated (`ids.len() × dim`). An id out of
    /// range is an error naming its position and the vertex count.
    pub fn gather(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(ids.len() * self.dim);
        for (i, &v) in ids.iter().enumerate() {
            let row = self.row(v).ok_or_else(|| {
                Error::invalid_argument(
                    "ids",
                    format!(
                        "vertex id {v} at position {i} is out of range: the dataset has {} vertices (ids 0..{})",
                        self.num_vertices(),
                        self.num_vertices()
                    ),
                )
            })?;
            out.extend_from_slice(row);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_returns_rows_in_order_and_refuses_bad_ids() {
        let e = Embeddings::new((0..12).map(|x| x as f32).collect(), 3, 5).unwrap();
        assert_eq!((e.num_vertices(), e.dim(), e.steps()), (4, 3, 5));
        assert_eq!(
            e.gather(&[3, 0, 3]).unwrap(),
            vec![9.0, 10.0, 11.0, 0.0, 1.0, 2.0, 9.0, 10.0, 11.0]
        );
        assert!(e.gather(&[]).unwrap().is_empty());
        let err = e.gather(&[1, 4]).unwrap_err().to_string();
        assert!(
            err.contains("ids") && err.contains("4 at position 1") && err.contains("4 vertices"),
            "{err}"
        );
        assert!(e.row(u32::MAX).is_none());
        assert!(Embeddings::new(vec![0.0; 5], 2, 0).is_err());
        assert!(Embeddings::new(vec![], 0, 0).is_err());
    }
}
