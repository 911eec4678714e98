//! CPU computation of hot vertices' bottom-layer embeddings, and the weights it
//! uses.
//!
//! # Protocol (one chunk of a super-batch's hot queue)
//! 1. Read the newest [`Published`] layer-0 weights *once*; their version `e` stamps
//!    the whole chunk (staleness step 3).
//! 2. Sample one hop from the chunk's vertices (user ids) with the bottom fanout
//!    (`cpu_ops` sampler semantics, seeded per chunk).
//! 3. Aggregate and transform straight from the host feature matrix into the
//!    chunk's staging buffer (the rows the engine uploads): GraphSAGE through the
//!    fused kernel (`cpu_ops::SageHotKernel`, tested against the generic layer;
//!    it reads the bfloat16 host copy when the device stores bfloat16 rows),
//!    other models through `gather_rows` and the generic layer 0 on the host
//!    backend ([`gpu_ops::Layer0`]: the layer the model trains, activation
//!    included).

use std::sync::Arc;

use parking_lot::Mutex;

use cpu_ops::{
    gather_rows, Bf16Rows, BlockView, HotFeatures, HotRequest, ModelConfig, ModelInput, ModelKind,
    NeighborSampler, SageHotKernel, SamplerScratch,
};

use crate::data::dataset::Dataset;
use crate::error::{Error, Result};

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
        let mut cur = self.newest.lock();
        if snapshot.version >= cur.version {
            *cur = Arc::new(snapshot);
        }
    }

    /// Replaces the snapshot whatever its version (a checkpoint was loaded).
    pub fn reset(&self, snapshot: Snapshot) {
        *self.newest.lock() = Arc::new(snapshot);
    }

    /// The newest snapshot.
    pub fn newest(&self) -> Arc<Snapshot> {
        Arc::clone(&self.newest.lock())
    }
}

/// What one CPU worker needs to compute hot rows: the dataset (user ids), the
/// model's configuration (layer 0's shape) and the bottom layer's one-hop
/// sampler.
pub struct HotComputer {
    /// The dataset, in user ids.
    pub ds: Arc<Dataset>,
    /// The feature rows rounded to bfloat16 (`f32_to_bf16_bits`, one row per
    /// vertex), when the device stores bfloat16 rows: GraphSAGE's fused kernel
    /// reads these (half the bytes, the values the accelerator's layer 0 sees).
    pub bf16_rows: Option<Arc<[u16]>>,
    /// The trained model's configuration.
    pub model: ModelConfig,
    /// One hop with the bottom fanout.
    pub sampler: NeighborSampler,
}

/// A worker's reusable buffers, and its layer 0 with the weights of the
/// version it last computed with: the fused GraphSAGE kernel, or the generic
/// layer on the host backend.
pub struct HotScratch {
    sampler: SamplerScratch,
    gathered: Vec<f32>,
    sage: Option<(u64, SageHotKernel)>,
    generic: Option<(u64, gpu_ops::Layer0<gpu_ops::HostBackend>)>,
    host: gpu_ops::HostBackend,
}

impl HotScratch {
    /// Buffers for a graph of `num_vertices` vertices.
    pub fn new(num_vertices: usize) -> Self {
        Self {
            sampler: SamplerScratch::new(num_vertices),
            gathered: Vec::new(),
            sage: None,
            generic: None,
            host: gpu_ops::HostBackend::new(),
        }
    }
}

impl HotComputer {
    /// Layer 0's output width.
    pub fn width(&self) -> usize {
        self.model.hidden
    }

    /// Steps 2–3: the rows of `ids` (user ids) with `weights`, written to
    /// `out[..ids.len() × width]`.
    pub fn compute_into(
        &self,
        ids: &[u32],
        weights: &Snapshot,
        seed: u64,
        scratch: &mut HotScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let kernel = |what: &'static str| move |e| Error::cpu_ops(what, e);
        let need = ids.len() * self.width();
        if out.len() < need {
            return Err(Error::invalid_argument(
                "hot staging",
                format!(
                    "internal: {} values for {} rows of {}",
                    out.len(),
                    ids.len(),
                    self.width()
                ),
            ));
        }
        if self.model.kind == ModelKind::Sage {
            return self.compute_sage(ids, weights, seed, scratch, &mut out[..need]);
        }
        let batch = self
            .sampler
            .sample(&self.ds.graph, ids, seed, &mut scratch.sampler)
            .map_err(kernel("hot sampling"))?;
        let src = batch.input_ids();
        let buf = &mut scratch.gathered;
        buf.resize(src.len() * self.ds.features.dim(), 0.0);
        gather_rows(&self.ds.features, src, buf).map_err(kernel("hot gather"))?;
        let b = &batch.blocks()[0];
        let view =
            BlockView::new(b.num_src(), b.indptr(), b.indices()).map_err(kernel("hot block"))?;
        let device = |e| Error::device("hot compute", e);
        let layer = match &mut scratch.generic {
            Some((v, l)) if *v == weights.version => l,
            Some((v, l)) => {
                l.set_weights(&scratch.host, &weights.tensors)
                    .map_err(device)?;
                *v = weights.version;
                l
            }
            slot @ None => {
                let l = gpu_ops::Layer0::new(&scratch.host, &self.model, &weights.tensors)
                    .map_err(device)?;
                &mut slot.insert((weights.version, l)).1
            }
        };
        let rows = layer
            .rows(&scratch.host, &view, ModelInput::Dense(buf))
            .map_err(device)?;
        out[..need].copy_from_slice(&rows[..need]);
        Ok(())
    }

    /// GraphSAGE's layer 0 through the fused kernel: neighbors drawn as the
    /// sampler draws them, their rows averaged straight from the feature matrix,
    /// one GEMM against the stacked weights, bias and ReLU (`cpu_ops::hot_layer`).
    fn compute_sage(
        &self,
        ids: &[u32],
        weights: &Snapshot,
        seed: u64,
        scratch: &mut HotScratch,
        out: &mut [f32],
    ) -> Result<()> {
        let kernel = |what: &'static str| move |e| Error::cpu_ops(what, e);
        let d_in = self.ds.features.dim();
        let d_out = self.width();
        let fresh = match &mut scratch.sage {
            Some((v, k)) if *v == weights.version => k,
            Some((v, k)) => {
                k.set_weights(&weights.tensors)
                    .map_err(kernel("hot kernel weights"))?;
                *v = weights.version;
                k
            }
            slot @ None => {
                let k = SageHotKernel::new(&weights.tensors, d_in, d_out)
                    .map_err(kernel("hot kernel weights"))?;
                &mut slot.insert((weights.version, k)).1
            }
        };
        let fanout = self.sampler.fanouts().first().copied().ok_or_else(|| {
            Error::invalid_argument("train.fanouts", "orchestration needs a bottom fanout")
        })?;
        // Layer 0 is below the top (orchestration needs two layers): ReLU.
        let req = HotRequest {
            graph: &self.ds.graph,
            features: match &self.bf16_rows {
                Some(bits) => HotFeatures::Bf16(Bf16Rows {
                    data: bits,
                    dim: d_in,
                }),
                None => (&self.ds.features).into(),
            },
            dst: ids,
            fanout,
            seed,
            relu: true,
        };
        fresh.compute(req, out).map_err(kernel("hot compute"))
    }
}

#[cfg(test)]
mod tests {
    //! The worker's GraphSAGE path reads the bfloat16 copy when it has one, and the
    //! `f32` matrix otherwise: the same rows as the fused kernel on each.

    use super::*;
    use crate::data::generate::{generate_sbm, SbmOptions};
    use cpu_ops::{Bf16Rows, HotFeatures, HotRequest, SageHotKernel};
    use gpu_ops::ModelLayout;

    #[test]
    fn sage_rows_read_the_bf16_copy_when_there_is_one() {
        let ds = Arc::new(
            generate_sbm(&SbmOptions {
                num_vertices: 1500,
                num_edges: 12_000,
                num_classes: 3,
                feature_dim: 24,
                ..SbmOptions::default()
            })
            .unwrap(),
        );
        let model = ModelConfig {
            kind: ModelKind::Sage,
            in_dim: 24,
            hidden: 16,
            num_classes: 3,
            num_layers: 2,
            heads: 1,
            dropout: 0.0,
        };
        let layout = ModelLayout::new(&model).unwrap();
        let tensors = layout.init_params(5)[layout.layer_params(0).unwrap()].to_vec();
        let snapshot = Snapshot {
            version: 3,
            tensors: tensors.clone(),
        };
        let bits: Arc<[u16]> = gpu_ops::to_bf16_bits(ds.features.as_slice()).into();
        let ids: Vec<u32> = (0..200).map(|i| i * 7).collect();
        let rows = |bf16: Option<Arc<[u16]>>| {
            let c = HotComputer {
                ds: Arc::clone(&ds),
                bf16_rows: bf16,
                model: model.clone(),
                sampler: NeighborSampler::new(vec![10]).unwrap(),
            };
            let mut out = vec![f32::NAN; ids.len() * 16];
            let mut scratch = HotScratch::new(ds.num_vertices());
            c.compute_into(&ids, &snapshot, 9, &mut scratch, &mut out)
                .unwrap();
            out
        };
        let kernel = |features: HotFeatures<'_>| {
            let mut out = vec![f32::NAN; ids.len() * 16];
            SageHotKernel::new(&tensors, 24, 16)
                .unwrap()
                .compute(
                    HotRequest {
                        graph: &ds.graph,
                        features,
                        dst: &ids,
                        fanout: 10,
                        seed: 9,
                        relu: true,
                    },
                    &mut out,
                )
                .unwrap();
            out
        };
        let half = rows(Some(Arc::clone(&bits)));
        let full = rows(None);
        assert_eq!(
            half,
            kernel(HotFeatures::Bf16(Bf16Rows {
                data: &bits,
                dim: 24
            }))
        );
        assert_eq!(full, kernel((&ds.features).into()));
        assert_ne!(half, full, "the bf16 copy was not read");
    }
}
