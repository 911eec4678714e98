//! Where work runs: the devices, the value of the config key `orchestration`,
//! and the four classic step-based placements (NeutronOrch §3, Figure 4 (a)–(d)).
//!
//! The layer-based policy (`orchestration = "layer"`, NeutronOrch §4.1) is not a
//! device map but a protocol: the CPU computes the hot vertices' bottom layer a
//! super-batch ahead and the accelerator everything else
//! ([`crate::protocol`]). The step-based baselines cut training by *step*
//! instead: every sampling on one device, every gather on one device, all
//! computation on the accelerator. The four combinations are DGL (CPU sample,
//! CPU gather), DGL-UVA (accelerator sample, CPU gather: features stay in host
//! memory), PaGraph (CPU sample, accelerator gather with a feature cache) and
//! GNNLab (both on the accelerator). None of them reuses historical embeddings.

use std::fmt;
use std::str::FromStr;

use crate::error::{Result, SchedulerError};

/// Where work runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    /// The host's worker threads.
    Cpu,
    /// The accelerator.
    Accelerator,
}

impl Device {
    /// The other device.
    pub fn other(self) -> Self {
        match self {
            Self::Cpu => Self::Accelerator,
            Self::Accelerator => Self::Cpu,
        }
    }

    /// Lower-case name, as traces print it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Accelerator => "accelerator",
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The value of the config key `orchestration`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
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

    /// The step-based placement this value selects (`None` for `"layer"`).
    pub fn step_based(self) -> Option<StepBased> {
        use Device::{Accelerator as Acc, Cpu};
        match self {
            Self::Layer => None,
            Self::CpuSampleCpuGather => Some(StepBased::new(Cpu, Cpu)),
            Self::GpuSampleCpuGather => Some(StepBased::new(Acc, Cpu)),
            Self::CpuSampleGpuGather => Some(StepBased::new(Cpu, Acc)),
            Self::GpuSampleGpuGather => Some(StepBased::new(Acc, Acc)),
        }
    }

    /// Whether the policy reuses CPU-computed historical embeddings (only
    /// `"layer"` does).
    pub fn reuses_embeddings(self) -> bool {
        self == Self::Layer
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

/// What a config asks for (the key `orchestration.policy`): `"auto"` (measure
/// the placements in the first batches and keep the fastest) or one placement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "String", into = "String")
)]
pub enum Policy {
    /// Measure the placements and keep the fastest.
    #[default]
    Auto,
    /// This placement.
    Fixed(Orchestration),
}

impl Policy {
    /// The fixed placement, `None` for `"auto"`.
    pub fn fixed(self) -> Option<Orchestration> {
        match self {
            Self::Auto => None,
            Self::Fixed(o) => Some(o),
        }
    }

    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Fixed(o) => o.name(),
        }
    }
}

impl FromStr for Policy {
    type Err = SchedulerError;

    /// `"auto"` or a name of [`Orchestration::NAMES`]; anything else is an
    /// error that lists them.
    fn from_str(s: &str) -> Result<Self> {
        if s == "auto" {
            return Ok(Self::Auto);
        }
        s.parse::<Orchestration>()
            .map(Self::Fixed)
            .map_err(|_| SchedulerError::UnknownVariant {
                name: "policy",
                allowed: POLICY_NAMES,
                found: s.to_string(),
            })
    }
}

/// The names [`Policy`] accepts.
pub const POLICY_NAMES: &[&str] = &[
    "auto",
    "layer",
    "cpu-sample-cpu-gather",
    "gpu-sample-cpu-gather",
    "cpu-sample-gpu-gather",
    "gpu-sample-gpu-gather",
];

impl TryFrom<String> for Policy {
    type Error = SchedulerError;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<Policy> for String {
    fn from(p: Policy) -> Self {
        p.name().to_string()
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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

    /// Where training (compute, gradients, the optimizer step) runs: always the
    /// accelerator.
    pub fn train_device(&self) -> Device {
        Device::Accelerator
    }

    /// The config name of the placement.
    pub fn name(&self) -> &'static str {
        match (self.sample, self.gather) {
            (Device::Cpu, Device::Cpu) => "cpu-sample-cpu-gather",
            (Device::Accelerator, Device::Cpu) => "gpu-sample-cpu-gather",
            (Device::Cpu, Device::Accelerator) => "cpu-sample-gpu-gather",
            (Device::Accelerator, Device::Accelerator) => "gpu-sample-gpu-gather",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_allowed_values() {
        for o in Orchestration::ALL {
            assert_eq!(o.name().parse::<Orchestration>().unwrap(), o);
            assert_eq!(o.to_string(), o.name());
            match o.step_based() {
                Some(p) => {
                    assert_eq!(p.name(), o.name());
                    assert!(!o.reuses_embeddings());
                }
                None => assert!(o == Orchestration::Layer && o.reuses_embeddings()),
            }
        }
        let e = "gpu-sample".parse::<Orchestration>().unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("`orchestration`"), "{msg}");
        for n in Orchestration::NAMES {
            assert!(msg.contains(n), "{msg}");
        }
        assert_eq!(Orchestration::default(), Orchestration::Layer);
    }

    #[test]
    fn sample_and_gather_go_where_the_name_says() {
        for sample in [Device::Cpu, Device::Accelerator] {
            for gather in [Device::Cpu, Device::Accelerator] {
                let p = StepBased::new(sample, gather);
                assert_eq!((p.sample_device(), p.gather_device()), (sample, gather));
                assert_eq!(p.train_device(), Device::Accelerator);
                let o: Orchestration = p.name().parse().unwrap();
                assert_eq!(o.step_based(), Some(p));
            }
        }
        assert_eq!(Device::Cpu.other(), Device::Accelerator);
        assert_eq!(Device::Accelerator.to_string(), "accelerator");
    }
}
