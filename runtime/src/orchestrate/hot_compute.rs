//! CPU computation of hot vertices' bottom-layer embeddings, and the weights it
//! uses.
//!
//! # Protocol (one chunk of a super-batch's hot queue)
//! 1. Read the newest [`Published`] layer-0 weights *once*; their version `e` stamps
//!    every row of the chunk (staleness step 3).
//! 2. Mark the chunk's vertices pending at `e` in the [`HotTable`].
//! 3. Sample one hop from the chunk's vertices (user ids) with the bottom fanout
//!    (`cpu_ops::NeighborSampler`, seeded per chunk).
//! 4. Gather the sources' feature rows from host memory.
//! 5. Apply layer 0 with the snapshot ([`cpu_ops::Model::forward_layer_with`],
//!    activation included).
//! 6. Write the rows with version `e` (the table keeps the newer of two writes),
//!    clear the pending marks, wake waiters.

use std::sync::{Arc, Mutex};

use cpu_ops::{gather_rows, BlockView, Model, ModelInput, NeighborSampler, SamplerScratch};

use crate::dataset::Dataset;
use crate::error::{Error, Result};

use super::hot_table::HotTable;

/// Layer 0's weights as of one optimizer step.
#[derive(Debug)]
pub struct Snapshot {
    /// The weight version (optimizer steps taken).
    pub version: u64,
    /// Layer 0's tensors, in the model's order.
    pub tensors: Vec<Vec<f32>>,
}

/// The newest published layer-0 weights, shared by the accelerator thread
/// (publisher) and the CPU workers (readers).
#[derive(Debug)]
pub struct Published {
    newest: Mutex<Arc<Snapshot>>,
}

impl Published {
    /// Starts with `snapshot`.
    pub fn new(snapshot: Snapshot) -> Self {
        Self {
            newest: Mutex::new(Arc::new(snapshot)),
        }
    }

    /// Replaces the snapshot (the version only moves forward).
    pub fn publish(&self, snapshot: Snapshot) {
        let mut cur = self.newest.lock().unwrap_or_else(|p| p.into_inner());
        if snapshot.version >= cur.version {
            *cur = Arc::new(snapshot);
        }
    }

    /// The newest snapshot.
    pub fn newest(&self) -> Arc<Snapshot> {
        Arc::clone(&self.newest.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// What one CPU worker needs to compute hot rows: the dataset (user ids), a model
/// of the right shape (for layer 0's spec; its own weights are not used), the
/// bottom layer's one-hop sampler, and the relabeling's old ids.
pub struct HotComputer<'a> {
    /// The dataset, in user ids.
    pub ds: &'a Dataset,
    /// A model with the trained model's configuration.
    pub model: &'a Model<f32>,
    /// One hop with the bottom fanout.
    pub sampler: NeighborSampler,
    /// `old_of_new[relabeled id]` = user id.
    pub old_of_new: &'a [u32],
}

impl HotComputer<'_> {
    /// Computes the rows of `chunk` (relabeled hot ids) with `weights` and writes
    /// them to `table` (steps 2–6); returns the number of rows written.
    pub fn compute(
        &self,
        chunk: &[u32],
        weights: &Snapshot,
        seed: u64,
        table: &HotTable,
        scratch: &mut SamplerScratch,
        buf: &mut Vec<f32>,
    ) -> Result<usize> {
        table.set_pending(chunk, Some(weights.version));
        let rows = self.rows(chunk, weights, seed, scratch, buf);
        let written = rows.map(|r| table.write(chunk, &r, weights.version));
        table.set_pending(chunk, None);
        written
    }

    fn rows(
        &self,
        chunk: &[u32],
        weights: &Snapshot,
        seed: u64,
        scratch: &mut SamplerScratch,
        buf: &mut Vec<f32>,
    ) -> Result<Vec<f32>> {
        let kernel = |what: &'static str| move |e| Error::cpu_ops(what, e);
        let seeds: Vec<u32> = chunk
            .iter()
            .map(|&v| {
                self.old_of_new.get(v as usize).copied().ok_or_else(|| {
                    Error::invalid_argument(
                        "hot chunk",
                        format!("internal: relabeled id {v} past the vertex count"),
                    )
                })
            })
            .collect::<Result<_>>()?;
        let batch = self
            .sampler
            .sample(&self.ds.graph, &seeds, seed, scratch)
            .map_err(kernel("hot sampling"))?;
        let ids = batch.input_ids();
        buf.resize(ids.len() * self.ds.features.dim(), 0.0);
        gather_rows(&self.ds.features, ids, buf).map_err(kernel("hot gather"))?;
        let b = &batch.blocks()[0];
        let view =
            BlockView::new(b.num_src(), b.indptr(), b.indices()).map_err(kernel("hot block"))?;
        self.model
            .forward_layer_with(0, &weights.tensors, &view, ModelInput::Dense(buf))
            .map_err(kernel("hot compute"))
    }
}
