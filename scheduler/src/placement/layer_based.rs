//! NeutronOrch's hotness-aware layer-based placement (§4.1).
//!
//! The split is by layer, not by step: the CPU owns the bottom layer of the *hot*
//! vertices end to end (one-hop sampling, feature reads from host memory, forward
//! with the newest published weights), because it holds the features and so skips
//! the gather and ships small embeddings instead of wide feature rows. Everything
//! else runs on the accelerator: the upload of each computed chunk into a device
//! slab, sampling of the upper layers and (after the staleness gate) of the cold
//! bottom vertices, their gather (device feature cache first) and compute, the
//! upper layers, the whole backward pass (the bottom layer's too, so no gradient
//! goes back to the CPU), the optimizer step, and the publication of the new
//! bottom-layer weights (a device-to-host copy issued on the accelerator's stream).

use super::Placement;
use crate::task::{Device, TaskKind};

/// The layer-based placement (`orchestration = "layer"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerBased;

impl Placement for LayerBased {
    fn name(&self) -> &'static str {
        "layer"
    }

    fn device(&self, kind: TaskKind) -> Device {
        match kind {
            TaskKind::HotCompute => Device::Cpu,
            TaskKind::HotInstall
            | TaskKind::SampleTop
            | TaskKind::SampleBottom
            | TaskKind::HotLoad
            | TaskKind::ColdGather
            | TaskKind::ColdCompute
            | TaskKind::Forward
            | TaskKind::Backward
            | TaskKind::OptimizerStep
            | TaskKind::PublishWeights => Device::Accelerator,
        }
    }

    fn reuses_embeddings(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_bottom_layer_on_the_cpu_everything_else_on_the_accelerator() {
        let p = LayerBased;
        for k in TaskKind::ALL {
            let want = if k == TaskKind::HotCompute {
                Device::Cpu
            } else {
                Device::Accelerator
            };
            assert_eq!(p.device(k), want, "{k}");
        }
        assert!(p.reuses_embeddings());
    }
}
