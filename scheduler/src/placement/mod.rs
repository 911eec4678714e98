//! Placement policies: which device runs each kind of task.
//!
//! One trait, [`Placement`], and its variants side by side: the layer-based policy
//! of NeutronOrch ([`LayerBased`]) and the four classic step-based ones
//! ([`StepBased`]). All map the *same* task graph; only devices change. The config
//! key `orchestration` picks one by name ([`Orchestration`]).

mod layer_based;
mod step_based;

use std::fmt;
use std::str::FromStr;

pub use layer_based::LayerBased;
pub use step_based::StepBased;

use crate::error::{Result, SchedulerError};
use crate::task::{Device, TaskKind};

/// A placement policy: a device for every task kind.
pub trait Placement: fmt::Debug + Send + Sync {
    /// The config name of the policy (`"layer"`, `"cpu-sample-gpu-gather"`, ...).
    fn name(&self) -> &'static str;

    /// The device that runs tasks of `kind`.
    fn device(&self, kind: TaskKind) -> Device;

    /// Whether the policy reuses CPU-computed historical embeddings for hot
    /// vertices. The task graph has the same shape under every placement, but when
    /// the policy does not reuse (the step-based baselines), the runtime and the
    /// simulator plan with an empty CPU part of the hot set (`HotSplit::new(hot,
    /// 0)`: the hot set is then a static device feature cache, as in PaGraph and
    /// GNNLab), so there is no hot queue and no [`TaskKind::HotLoad`] work.
    fn reuses_embeddings(&self) -> bool;
}

/// The value of the config key `orchestration`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Orchestration {
    /// NeutronOrch's hotness-aware layer-based policy (the default).
    #[default]
    Layer,
    /// Sampling and gathering on the CPU (DGL).
    CpuSampleCpuGather,
    /// Sampling on the accelerator, gathering on the CPU (DGL-UVA style).
    GpuSampleCpuGather,
    /// Sampling on the CPU, gathering on the accelerator (PaGraph).
    CpuSampleGpuGather,
    /// Sampling and gathering on the accelerator (GNNLab).
    GpuSampleGpuGather,
}

impl Orchestration {
    /// Every policy, the default first.
    pub const ALL: [Orchestration; 5] = [
        Self::Layer,
        Self::CpuSampleCpuGather,
        Self::GpuSampleCpuGather,
        Self::CpuSampleGpuGather,
        Self::GpuSampleGpuGather,
    ];

    /// The accepted names, in the order of [`Orchestration::ALL`].
    pub const NAMES: &'static [&'static str] = &[
        "layer",
        "cpu-sample-cpu-gather",
        "gpu-sample-cpu-gather",
        "cpu-sample-gpu-gather",
        "gpu-sample-gpu-gather",
    ];

    /// The config name.
    pub fn name(self) -> &'static str {
        let i = Self::ALL.iter().position(|&o| o == self).unwrap_or(0);
        Self::NAMES[i]
    }

    /// The placement this value selects.
    pub fn placement(self) -> Box<dyn Placement> {
        match self {
            Self::Layer => Box::new(LayerBased),
            Self::CpuSampleCpuGather => Box::new(StepBased::new(Device::Cpu, Device::Cpu)),
            Self::GpuSampleCpuGather => Box::new(StepBased::new(Device::Accelerator, Device::Cpu)),
            Self::CpuSampleGpuGather => Box::new(StepBased::new(Device::Cpu, Device::Accelerator)),
            Self::GpuSampleGpuGather => {
                Box::new(StepBased::new(Device::Accelerator, Device::Accelerator))
            }
        }
    }
}

impl FromStr for Orchestration {
    type Err = SchedulerError;

    /// Parses a name of [`Orchestration::NAMES`]; anything else is an error that
    /// lists them.
    fn from_str(s: &str) -> Result<Self> {
        Self::NAMES
            .iter()
            .position(|&n| n == s)
            .map(|i| Self::ALL[i])
            .ok_or_else(|| SchedulerError::UnknownVariant {
                name: "orchestration",
                allowed: Self::NAMES,
                found: s.to_string(),
            })
    }
}

impl fmt::Display for Orchestration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_allowed_values() {
        for o in Orchestration::ALL {
            assert_eq!(o.name().parse::<Orchestration>().unwrap(), o);
            assert_eq!(o.placement().name(), o.name());
            assert_eq!(o.to_string(), o.name());
        }
        let e = "gpu-sample".parse::<Orchestration>().unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("`orchestration`"), "{msg}");
        for n in Orchestration::NAMES {
            assert!(msg.contains(n), "{msg}");
        }
        assert_eq!(Orchestration::default(), Orchestration::Layer);
    }
}
