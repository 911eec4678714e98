//! Layer 0 alone with given weights: what a CPU worker computes for hot
//! vertices (historical embeddings) with a published snapshot of layer 0's
//! tensors, for any model kind, through the same generic layer the model trains.
//!
//! [`Layer0`] keeps the weights on its backend between calls
//! ([`Layer0::set_weights`] when a newer version is published);
//! [`layer0_rows`] is the one-shot form. (GraphSAGE also has the fused
//! `cpu_ops::SageHotKernel`, which the tests compare with this.)

use std::sync::Arc;

use cpu_ops::{BlockView, LayerSpec, ModelConfig, ModelInput};

use super::head::Head;
use super::layer::{internal, DynLayer, LayerCall, LayerInput, ModelParam};
use super::registry::{arch, check_lens};
use crate::backend::Backend;
use crate::error::Result;

/// Layer `layer` alone over `block` with its tensors `params`, without dropout,
/// bias and activation included below the top
/// ([`DeviceModel::forward_layer`](super::DeviceModel::forward_layer)).
pub(crate) fn layer_alone<B: Backend>(
    dev: &B,
    layer: &dyn DynLayer<B>,
    params: &[B::Buf<f32>],
    block: &B::Block,
    x: LayerInput<'_, B>,
) -> Result<B::Buf<f32>> {
    let spec = *layer.spec();
    let (ns, nd, _) = dev.block_shape(block);
    x.check(dev, "layer input (num_src × d_in)", ns, spec.d_in)?;
    let call = LayerCall {
        params,
        block,
        x,
        num_src: ns,
        num_dst: nd,
    };
    let (mut out, _) = layer.forward_dyn(dev, &call, spec.last)?;
    if !spec.last {
        let bias = params
            .get(layer.bias())
            .ok_or_else(|| internal("bias index past the layer's tensors"))?;
        dev.bias_act_dropout(&mut out, nd, spec.d_out, bias, layer.activation(), None)?;
    }
    Ok(out)
}

/// Layer 0 of a model of some configuration, with its weights on a backend.
pub struct Layer0<B: Backend> {
    layer: Box<dyn DynLayer<B>>,
    params: Vec<ModelParam>,
    bufs: Vec<B::Buf<f32>>,
}

impl<B: Backend> Layer0<B> {
    /// Layer 0 of a model of `cfg` (validated) holding `tensors` (layer 0's, in
    /// [`ModelLayout::params`](super::ModelLayout::params) order: e.g. a
    /// published snapshot; count and lengths checked).
    pub fn new(dev: &B, cfg: &ModelConfig, tensors: &[Vec<f32>]) -> Result<Self> {
        let a = arch::<B>(cfg, Head::Classify)?;
        let range = a.layer_params(0)?;
        let params = a.params[range].to_vec();
        let layer = a
            .layers
            .into_iter()
            .next()
            .ok_or_else(|| internal("a model without layers"))?;
        let refs: Vec<&[f32]> = tensors.iter().map(Vec::as_slice).collect();
        check_lens(&params, "layer 0's tensors", &refs)?;
        let bufs = refs
            .iter()
            .map(|t| dev.to_device(t))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layer,
            params,
            bufs,
        })
    }

    /// Replaces the weights with `tensors` of the same shapes (a newer version),
    /// reusing the buffers. On error the old weights stay.
    pub fn set_weights(&mut self, dev: &B, tensors: &[Vec<f32>]) -> Result<()> {
        let refs: Vec<&[f32]> = tensors.iter().map(Vec::as_slice).collect();
        check_lens(&self.params, "layer 0's tensors", &refs)?;
        for (dst, src) in self.bufs.iter_mut().zip(refs) {
            dev.upload(dev.stream(), src, dst)?;
        }
        Ok(())
    }

    /// The layer's shape.
    pub fn spec(&self) -> &LayerSpec {
        self.layer.spec()
    }

    /// The layer over `block` from `x` (`num_src × d_in`, dense or sparse) on the
    /// device: `num_dst × d_out`, activation included below the top.
    pub fn forward<'x>(
        &self,
        dev: &B,
        block: &B::Block,
        x: impl Into<LayerInput<'x, B>>,
    ) -> Result<B::Buf<f32>> {
        layer_alone(dev, &*self.layer, &self.bufs, block, x.into())
    }

    /// [`Layer0::forward`] from host data: `block` and rows `x`
    /// (`num_src(block)` rows of `in_dim`, dense or sparse), returning
    /// `num_dst(block) × d_out` values on the host. (On the host backend the
    /// block and the rows are copied once into backend buffers; a caller that
    /// gathers straight into a [`crate::HostBuf`] can call
    /// [`Layer0::forward`] instead.)
    pub fn rows(&self, dev: &B, block: &BlockView<'_>, x: ModelInput<'_, f32>) -> Result<Vec<f32>> {
        let b = dev.block_from_host(block.num_src(), block.indptr(), block.indices())?;
        let out = match x {
            ModelInput::Dense(x) => self.forward(dev, &b, &dev.to_device(x)?)?,
            ModelInput::Sparse(x) => {
                let xs = dev.sparse_from_host(Arc::new(x.clone()))?;
                self.forward(dev, &b, LayerInput::Sparse(&xs))?
            }
        };
        dev.to_host(&out, block.num_dst() * self.spec().d_out)
    }
}

/// Layer 0 of a model of `cfg` with the tensors `tensors` (layer 0's, in
/// [`ModelLayout::params`](super::ModelLayout::params) order: e.g. a published
/// snapshot of older weights) over `block`, from host input rows `x`
/// (`num_src(block)` rows of `in_dim`, dense or sparse): `num_dst(block) × d_out`
/// values on the host, activation included below the top —
/// [`DeviceModel::forward_layer`](super::DeviceModel::forward_layer)`(0, ..)` of
/// a model holding those weights. One-shot [`Layer0::rows`].
pub fn layer0_rows<B: Backend>(
    dev: &B,
    cfg: &ModelConfig,
    tensors: &[Vec<f32>],
    block: &BlockView<'_>,
    x: ModelInput<'_, f32>,
) -> Result<Vec<f32>> {
    Layer0::new(dev, cfg, tensors)?.rows(dev, block, x)
}
