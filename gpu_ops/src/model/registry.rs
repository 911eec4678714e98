//! The registry of model kinds and a model's parameter layout: [`registry`]
//! maps a [`ModelKind`] to its layer type (one line per kind), [`arch`] builds a
//! model's layers and parameter list for a backend (the layers' tensors, then
//! its head's: [`Head::params`]), and [`ModelLayout`] is the same without a
//! device (names `layer{l}.{name}` in layer order, then `decoder.{i}.{name}`;
//! initialization), which export and checkpoints need.

use std::ops::Range;

use cpu_ops::{LayerSpec, ModelConfig, ModelKind};

use super::gat::Gat;
use super::gcn::Gcn;
use super::head::Head;
use super::layer::{DynLayer, LayerDef, ModelParam};
use super::sage::Sage;
use crate::backend::Backend;
use crate::error::{GpuOpsError, Result};
use crate::HostBackend;

/// The registry: a layer of `cfg.kind` at `at` (one line per model kind). To add
/// a kind: its file beside this one, its `ModelKind` variant, and its line here.
fn registry<B: Backend>(cfg: &ModelConfig, at: LayerSpec) -> Box<dyn DynLayer<B>> {
    match cfg.kind {
        ModelKind::Gcn => Box::new(Gcn::new(cfg, at)),
        ModelKind::Sage => Box::new(Sage::new(cfg, at)),
        ModelKind::Gat => Box::new(Gat::<B>::new(cfg, at)),
    }
}

/// Layers and parameters of a model (shared by [`ModelLayout`] and the device
/// model, which hold their layers as different trait objects).
pub(crate) struct Arch<L: ?Sized> {
    pub(crate) cfg: ModelConfig,
    pub(crate) layers: Vec<Box<L>>,
    pub(crate) specs: Vec<LayerSpec>,
    /// The layers' tensors, then the head's.
    pub(crate) params: Vec<ModelParam>,
    pub(crate) head: Head,
    /// Where the head's tensors start in `params`.
    pub(crate) head_at: usize,
}

impl<L: ?Sized> Arch<L> {
    /// Indices of layer `l`'s tensors in the parameter list.
    pub(crate) fn layer_params(&self, l: usize) -> Result<Range<usize>> {
        let spec = self.specs.get(l).ok_or(GpuOpsError::InvalidArgument {
            name: "layer",
            reason: format!("the model has {} layers", self.specs.len()),
        })?;
        let end = self
            .specs
            .get(l + 1)
            .map_or(self.head_at, |s| s.first_param);
        Ok(spec.first_param..end)
    }

    /// Indices of the head's tensors in the parameter list (empty for a head
    /// without tensors).
    pub(crate) fn head_params(&self) -> Range<usize> {
        self.head_at..self.params.len()
    }
}

/// The layers and parameter list of `cfg` (validated) with `head`, with layers
/// for `B`.
pub(crate) fn arch<B: Backend>(cfg: &ModelConfig, head: Head) -> Result<Arch<dyn DynLayer<B>>> {
    cfg.validate()?;
    let n = cfg.num_layers;
    let mut arch = Arch {
        cfg: cfg.clone(),
        layers: Vec::with_capacity(n),
        specs: Vec::with_capacity(n),
        params: Vec::new(),
        head,
        head_at: 0,
    };
    for l in 0..n {
        let last = l + 1 == n;
        let d_out = if last { cfg.num_classes } else { cfg.hidden };
        let at = LayerSpec {
            d_in: if l == 0 { cfg.in_dim } else { cfg.hidden },
            d_out,
            heads: 1,
            head_dim: d_out,
            last,
            first_param: arch.params.len(),
        };
        let layer = registry::<B>(cfg, at);
        for p in layer.params() {
            let len = p.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            let len = len.ok_or_else(|| GpuOpsError::InvalidArgument {
                name: "model shape",
                reason: format!("layer{l}.{} of shape {:?} overflows", p.name, p.shape),
            })?;
            arch.params.push(ModelParam {
                name: format!("layer{l}.{}", p.name),
                shape: p.shape,
                len,
                init: p.init,
            });
        }
        arch.specs.push(*layer.spec());
        arch.layers.push(layer);
    }
    arch.head_at = arch.params.len();
    // The embeddings are the top layer's outputs: `num_classes` wide.
    arch.params.extend(head.params(cfg.num_classes));
    Ok(arch)
}

/// A model's layers and parameter list from its configuration alone (no device,
/// no values): what export, checkpoints and initialization need.
pub struct ModelLayout {
    arch: Arch<dyn LayerDef>,
}

impl ModelLayout {
    /// Validates `cfg` and lays out its layers and tensors ([`Head::Classify`]).
    pub fn new(cfg: &ModelConfig) -> Result<Self> {
        Self::with_head(cfg, Head::Classify)
    }

    /// Validates `cfg` and lays out its layers and tensors, then `head`'s
    /// (a link head's decoder, after the layers'), as
    /// [`DeviceModel::with_head`](super::DeviceModel::with_head) holds them.
    pub fn with_head(cfg: &ModelConfig, head: Head) -> Result<Self> {
        // Layers are backend-free but for their math; any backend's will do.
        let a = arch::<HostBackend>(cfg, head)?;
        let layers = a
            .layers
            .into_iter()
            .map(|l| -> Box<dyn LayerDef> { l })
            .collect();
        Ok(Self {
            arch: Arch {
                cfg: a.cfg,
                layers,
                specs: a.specs,
                params: a.params,
                head: a.head,
                head_at: a.head_at,
            },
        })
    }

    /// The head.
    pub fn head(&self) -> Head {
        self.arch.head
    }

    /// Indices of the head's tensors in [`ModelLayout::params`] (the
    /// decoder's, for a [`Decoder::Mlp`](super::Decoder::Mlp) link head; empty
    /// otherwise): what an exporter declares for [`Decoder::emit`](super::Decoder::emit).
    pub fn head_params(&self) -> Range<usize> {
        self.arch.head_params()
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.arch.cfg
    }

    /// Layer `l`, bottom first.
    pub fn layer(&self, l: usize) -> Option<&dyn LayerDef> {
        self.arch.layers.get(l).map(|b| &**b)
    }

    /// Every layer's shape, bottom first.
    pub fn layer_specs(&self) -> &[LayerSpec] {
        &self.arch.specs
    }

    /// Every parameter tensor, in order.
    pub fn params(&self) -> &[ModelParam] {
        &self.arch.params
    }

    /// The parameter names, in order (`layer0.weight`, ..., then the head's,
    /// `decoder.0.weight`, ...).
    pub fn param_names(&self) -> Vec<String> {
        self.arch.params.iter().map(|p| p.name.clone()).collect()
    }

    /// Indices of layer `l`'s tensors in [`ModelLayout::params`].
    pub fn layer_params(&self, l: usize) -> Result<Range<usize>> {
        self.arch.layer_params(l)
    }

    /// Freshly initialized parameters, deterministically from `seed`: tensor `i`
    /// drawn from stream `i` by its [`Init`](cpu_ops::Init) (what [`DeviceModel::new`](super::DeviceModel::new)
    /// holds for the same configuration and seed).
    pub fn init_params(&self, seed: u64) -> Vec<Vec<f32>> {
        init_params(&self.arch.params, seed)
    }

    /// Checks that `params` are this model's tensors: as many, with their lengths.
    pub fn check_params(&self, params: &[&[f32]]) -> Result<()> {
        check_lens(&self.arch.params, "parameter tensors", params)
    }
}

/// [`ModelLayout::init_params`].
pub(crate) fn init_params(params: &[ModelParam], seed: u64) -> Vec<Vec<f32>> {
    params
        .iter()
        .enumerate()
        .map(|(i, p)| p.init.fill(p.len, seed, i as u64))
        .collect()
}

/// Checks that `got` has one slice per parameter with its length.
pub(crate) fn check_lens(params: &[ModelParam], what: &'static str, got: &[&[f32]]) -> Result<()> {
    if got.len() != params.len() {
        return Err(GpuOpsError::SizeMismatch {
            what,
            expected: params.len(),
            found: got.len(),
        });
    }
    for (g, p) in got.iter().zip(params) {
        if g.len() != p.len {
            return Err(GpuOpsError::SizeMismatch {
                what,
                expected: p.len,
                found: g.len(),
            });
        }
    }
    Ok(())
}
