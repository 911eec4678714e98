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
//! it). [`Embeddings::view`] shows it as an `ndarray` matrix without copying;
//! [`Embeddings::gather`] copies the rows of requested vertices into one.
//!
//! ```
//! use runtime::TrainerBuilder;
//!
//! # fn main() -> runtime::Result<()> {
//! let toml = "[data.synthetic]\nvertices = 300\nedges = 1500\nclasses = 2\ndim = 4\n\
//!             [model]\nhidden = 8\n[train]\nepochs = 1\n[threads]\ncompute = 1\n";
//! let mut trainer = TrainerBuilder::from_toml(toml)?.build()?;
//! trainer.fit()?;
//! let table = trainer.embedding_table()?; // a snapshot: cheap to clone, shareable
//! assert_eq!((table.num_vertices(), table.dim()), (300, 8));
//! let rows = table.gather(&[0, 7])?; // 2 × 8
//! assert_eq!(rows.row(1), table.view().row(7));
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use ndarray::{Array2, ArrayView2};

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

    /// All rows as a `num_vertices × dim` matrix, without copying.
    pub fn view(&self) -> ArrayView2<'_, f32> {
        ArrayView2::from_shape((self.num_vertices(), self.dim), &self.data)
            .unwrap_or_else(|_| unreachable!("dim divides the length (checked by `new`)"))
    }

    /// All rows copied into an owned `num_vertices × dim` matrix.
    pub fn to_array(&self) -> Array2<f32> {
        self.view().to_owned()
    }

    /// The rows of `ids`, in order: an `ids.len() × dim` matrix. An id out of range
    /// is an error naming its position and the vertex count.
    pub fn gather(&self, ids: &[u32]) -> Result<Array2<f32>> {
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
        Ok(Array2::from_shape_vec((ids.len(), self.dim), out)
            .unwrap_or_else(|_| unreachable!("one row of `dim` values per id")))
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
            ndarray::array![[9.0, 10.0, 11.0], [0.0, 1.0, 2.0], [9.0, 10.0, 11.0]]
        );
        assert_eq!(e.gather(&[]).unwrap().dim(), (0, 3));
        assert_eq!(e.view().dim(), (4, 3));
        assert_eq!(e.view().row(2).as_slice(), e.row(2));
        assert_eq!(e.to_array().as_slice(), Some(e.as_slice()));
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
