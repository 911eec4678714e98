//! The four classic step-based placements (NeutronOrch §3, Figure 4 (a)–(d)).
//!
//! Training is cut by *step*: every sampling task runs on one device, every gather
//! task on one device, and all computation on the accelerator. The four
//! combinations are DGL (CPU sample, CPU gather), DGL-UVA (accelerator sample, CPU
//! gather: features stay in host memory), PaGraph (CPU sample, accelerator gather
//! with a feature cache) and GNNLab (both on the accelerator). None of them reuses
//! historical embeddings: the runtime gives them an empty hot queue.

use super::Placement;
use crate::task::{Device, Step, TaskKind};

/// A step-based placement: sampling on `sample`, gathering on `gather`, training
/// on the accelerator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepBased {
    sample: Device,
    gather: Device,
}

impl StepBased {
    /// The placement with sampling on `sample` and gathering on `gather`.
    pub fn new(sample: Device, gather: Device) -> Self {
        Self { sample, gather }
    }

    /// Where sampling runs.
    pub fn sample_device(&self) -> Device {
        self.sample
    }

    /// Where gathering runs.
    pub fn gather_device(&self) -> Device {
        self.gather
    }
}

impl Placement for StepBased {
    fn name(&self) -> &'static str {
        match (self.sample, self.gather) {
            (Device::Cpu, Device::Cpu) => "cpu-sample-cpu-gather",
            (Device::Accelerator, Device::Cpu) => "gpu-sample-cpu-gather",
            (Device::Cpu, Device::Accelerator) => "cpu-sample-gpu-gather",
            (Device::Accelerator, Device::Accelerator) => "gpu-sample-gpu-gather",
        }
    }

    fn device(&self, kind: TaskKind) -> Device {
        match kind.step() {
            Step::Sample => self.sample,
            Step::Gather => self.gather,
            Step::Train => Device::Accelerator,
        }
    }

    fn reuses_embeddings(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_and_gather_go_where_the_name_says() {
        for sample in [Device::Cpu, Device::Accelerator] {
            for gather in [Device::Cpu, Device::Accelerator] {
                let p = StepBased::new(sample, gather);
                assert_eq!(p.device(TaskKind::SampleTop), sample);
                assert_eq!(p.device(TaskKind::SampleBottom), sample);
                assert_eq!(p.device(TaskKind::ColdGather), gather);
                assert_eq!(p.device(TaskKind::Forward), Device::Accelerator);
                assert_eq!(p.device(TaskKind::HotCompute), Device::Accelerator);
                assert!(!p.reuses_embeddings());
                assert_eq!((p.sample_device(), p.gather_device()), (sample, gather));
            }
        }
    }
}
