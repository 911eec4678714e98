//! CPU computation of hot vertices' bottom-layer embeddings, and the weights it
//! uses.
//!
//! # Protocol (one chunk of a super-batch's hot queue)
//! 1. Read the newest [`Published`] layer-0 weights *once* (resolving them if
//!    the accelerator thread published them pending); their version `e` stamps
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
use crate::engine::PendingParams;
use crate::error::{Error, Result};

/// Layer 0's weights as of one optimizer step.
#[derive(Debug)]
pub struct Snapshot {
    /// The weight version (optimizer steps taken).
    pub version: u64,
    /// Layer 0's tensors, in the model's order.
    pub tensors: Vec<Vec<f32>>,
}

/// Layer 0's weights of one publication: ready, or still on their way from
/// the device.
enum Weights {
    /// Copies queued by the accelerator thread, not waited for yet.
    Pending(Box<dyn PendingParams>),
    /// Resolved (or published ready).
    Ready(Arc<Snapshot>),
    /// The resolution failed; the worker that tried reported why.
    Failed,
}

/// One publication: its version and its weights, resolved once.
struct Publication {
    version: u64,
    weights: Mutex<Weights>,
}

impl Publication {
    fn new(version: u64, weights: Weights) -> Arc<Self> {
        Arc::new(Self {
            version,
            weights: Mutex::new(weights),
        })
    }

    /// The snapshot, resolving the pending copies if no reader has yet (one
    /// reader at a time: the others wait for it and share its result).
    fn snapshot(&self) -> Result<Arc<Snapshot>> {
        let mut w = self.weights.lock();
        let pending = match std::mem::replace(&mut *w, Weights::Failed) {
            Weights::Ready(s) => {
                *w = Weights::Ready(Arc::clone(&s));
                return Ok(s);
            }
            Weights::Failed => {
                return Err(Error::Worker {
                    worker: "hot workers".into(),
                    what: format!(
                        "layer 0's weights of version {} could not be read back from the \
                         device (the worker that tried first reported why)",
                        self.version
                    ),
                })
            }
            Weights::Pending(p) => p,
        };
        // On an error the publication stays `Failed`.
        let snapshot = Arc::new(Snapshot {
            version: self.version,
            tensors: pending.resolve()?,
        });
        *w = Weights::Ready(Arc::clone(&snapshot));
        Ok(snapshot)
    }
}

/// The newest published layer-0 weights, shared by the accelerator thread
/// (publisher) and the CPU workers (readers).
///
/// A publication may arrive *pending* ([`Published::publish_pending`]: the
/// accelerator thread queued the copies and did not wait for them,
/// `engine/pinned.rs`); the first reader that needs it resolves it — waiting
/// for the device and copying the tensors out — and every later reader of that
/// version shares the result. A failed resolution is that reader's error (its
/// job fails, which ends the epoch), and later readers of the version get an
/// error too; nothing panics.
pub struct Published {
    newest: Mutex<Arc<Publication>>,
}

impl std::fmt::Debug for Published {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = Arc::clone(&self.newest.lock());
        let state = match &*p.weights.lock() {
            Weights::Pending(_) => "pending",
            Weights::Ready(_) => "ready",
            Weights::Failed => "failed",
        };
        f.debug_struct("Published")
            .field("version", &p.version)
            .field("weights", &state)
            .finish()
    }
}

impl Published {
    /// Starts with `snapshot`.
    pub fn new(snapshot: Snapshot) -> Self {
        Self {
            newest: Mutex::new(Publication::new(
                snapshot.version,
                Weights::Ready(Arc::new(snapshot)),
            )),
        }
    }

    /// Replaces the newest publication with the weights of `version` still on
    /// their way from the device (the version only moves forward; an older one
    /// is dropped, giving its buffers back).
    pub(crate) fn publish_pending(&self, version: u64, pending: Box<dyn PendingParams>) {
        let mut cur = self.newest.lock();
        if version >= cur.version {
            *cur = Publication::new(version, Weights::Pending(pending));
        }
    }

    /// Replaces the snapshot whatever its version (a checkpoint was loaded).
    pub fn reset(&self, snapshot: Snapshot) {
        *self.newest.lock() =
            Publication::new(snapshot.version, Weights::Ready(Arc::new(snapshot)));
    }

    /// The newest snapshot, resolved if it was pending (see the type's doc).
    pub fn newest(&self) -> Result<Arc<Snapshot>> {
        // The outer lock only for the handle: a reader waiting for the device
        // does not hold up a publication.
        let p = Arc::clone(&self.newest.lock());
        p.snapshot()
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
    //! `f32` matrix otherwise: the same rows as the fused kernel on each. A
    //! pending publication is resolved once, by the first reader; its failure
    //! is an error for every reader, never a panic.

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

    /// A pending publication that counts its resolutions (and fails when
    /// `fail`).
    struct Scripted {
        tensors: Vec<Vec<f32>>,
        fail: bool,
        resolved: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl crate::engine::PendingParams for Scripted {
        fn resolve(self: Box<Self>) -> Result<Vec<Vec<f32>>> {
            self.resolved
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.fail {
                return Err(Error::device(
                    "reading back layer 0's published parameters",
                    gpu_ops::GpuOpsError::Driver {
                        op: "cuEventSynchronize".into(),
                        message: "injected".into(),
                    },
                ));
            }
            Ok(self.tensors)
        }
    }

    fn scripted(fail: bool) -> (Box<Scripted>, Arc<std::sync::atomic::AtomicUsize>) {
        let resolved = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let s = Box::new(Scripted {
            tensors: vec![vec![1.0, 2.0], vec![3.0]],
            fail,
            resolved: Arc::clone(&resolved),
        });
        (s, resolved)
    }

    #[test]
    fn a_pending_publication_is_resolved_once_and_shared() {
        let published = Arc::new(Published::new(Snapshot {
            version: 0,
            tensors: vec![vec![0.0; 2], vec![0.0]],
        }));
        let (pending, resolved) = scripted(false);
        published.publish_pending(4, pending);
        // An older version never replaces a newer one.
        let (old, old_resolved) = scripted(false);
        published.publish_pending(3, old);
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let p = Arc::clone(&published);
                std::thread::spawn(move || p.newest().unwrap())
            })
            .collect();
        let got: Vec<Arc<Snapshot>> = readers.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(resolved.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(old_resolved.load(std::sync::atomic::Ordering::SeqCst), 0);
        for s in &got {
            assert!(Arc::ptr_eq(s, &got[0]), "each reader resolved its own copy");
            assert_eq!(s.version, 4);
            assert_eq!(s.tensors, vec![vec![1.0, 2.0], vec![3.0]]);
        }
        // A reset replaces it whatever the version (a checkpoint was loaded).
        published.reset(Snapshot {
            version: 1,
            tensors: vec![],
        });
        assert_eq!(published.newest().unwrap().version, 1);
    }

    #[test]
    fn a_failed_resolution_is_an_error_for_every_reader() {
        let published = Published::new(Snapshot {
            version: 0,
            tensors: vec![],
        });
        let (pending, resolved) = scripted(true);
        published.publish_pending(2, pending);
        let first = published.newest().unwrap_err().to_string();
        assert!(first.contains("injected"), "{first}");
        let later = published.newest().unwrap_err().to_string();
        assert!(later.contains("version 2"), "{later}");
        assert_eq!(resolved.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(format!("{published:?}").contains("failed"));
        // The next publication works again.
        let (pending, _) = scripted(false);
        published.publish_pending(3, pending);
        assert_eq!(published.newest().unwrap().version, 3);
    }
}
