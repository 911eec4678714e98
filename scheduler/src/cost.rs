//! Task costs for the simulator: a rate-based cost model, random scripts around
//! it, and hand-written scripts.
//!
//! A [`CostSource`] answers one question: how many seconds does this task take on
//! its device, given the bytes it moves over PCIe under the current placement
//! ([`crate::TaskGraph::pcie_bytes`])? StarPU's simulation mode answers it from
//! calibrated per-kernel models; here the default is a roofline-style sum
//! ([`CostModel`]), [`RandomCosts`] perturbs any source with a seeded generator
//! (for property tests over many scripts), and [`Scripted`] wraps a closure (for
//! tests that need exact costs).

use cpu_ops::Rng;

use crate::error::{invalid, Result};
use crate::task::{Device, Task};

/// Durations of tasks.
pub trait CostSource {
    /// Seconds `task` takes on `task.device` when it moves `pcie_bytes` over PCIe.
    /// Must be finite and non-negative (the simulator checks).
    fn duration(&mut self, task: &Task, pcie_bytes: u64) -> f64;
}

impl<C: CostSource + ?Sized> CostSource for &mut C {
    fn duration(&mut self, task: &Task, pcie_bytes: u64) -> f64 {
        (**self).duration(task, pcie_bytes)
    }
}

/// Throughputs of one device (for the CPU: of one worker thread).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceRates {
    /// Floating-point operations per second.
    pub flops_per_s: f64,
    /// Bytes per second to and from the device's own memory (random-row access).
    pub mem_bytes_per_s: f64,
    /// Sampled neighbor entries per second.
    pub sample_edges_per_s: f64,
    /// Fixed cost per task (kernel launch, queue hand-off).
    pub task_overhead_s: f64,
}

impl DeviceRates {
    fn validate(&self, device: &'static str) -> Result<()> {
        for (name, v) in [
            ("flops_per_s", self.flops_per_s),
            ("mem_bytes_per_s", self.mem_bytes_per_s),
            ("sample_edges_per_s", self.sample_edges_per_s),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(invalid(
                    name,
                    format!("a positive finite rate for the {device}"),
                    v,
                ));
            }
        }
        if !(self.task_overhead_s.is_finite() && self.task_overhead_s >= 0.0) {
            return Err(invalid(
                "task_overhead_s",
                format!("a non-negative finite time for the {device}"),
                self.task_overhead_s,
            ));
        }
        Ok(())
    }

    /// Seconds for the work of `task` on this device (PCIe excluded).
    fn seconds(&self, task: &Task) -> f64 {
        let e = &task.est;
        self.task_overhead_s
            + e.flops / self.flops_per_s
            + e.mem_bytes as f64 / self.mem_bytes_per_s
            + e.sampled_edges as f64 / self.sample_edges_per_s
    }
}

/// A roofline-style cost model: compute, memory traffic, sampling and PCIe add up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    /// One CPU worker.
    pub cpu: DeviceRates,
    /// The accelerator.
    pub accelerator: DeviceRates,
    /// Host↔device bytes per second.
    pub pcie_bytes_per_s: f64,
}

impl CostModel {
    /// Rough rates of the machines in `FACTS.md`: one Zen 4 core per CPU worker
    /// (≈ 230 GFLOP/s peak, ≈ 6 GB/s random-row gather, ≈ 40 M sampled edges/s) and
    /// an H100 (≈ 50 TFLOP/s fp32 reached, ≈ 2 TB/s, ≈ 2 G sampled edges/s, 5 µs
    /// per launch), over PCIe 5 (≈ 25 GB/s). For shapes of simulations, not for
    /// predictions.
    pub fn reference() -> Self {
        Self {
            cpu: DeviceRates {
                flops_per_s: 2.3e11,
                mem_bytes_per_s: 6.0e9,
                sample_edges_per_s: 4.0e7,
                task_overhead_s: 2e-6,
            },
            accelerator: DeviceRates {
                flops_per_s: 5.0e13,
                mem_bytes_per_s: 2.0e12,
                sample_edges_per_s: 2.0e9,
                task_overhead_s: 5e-6,
            },
            pcie_bytes_per_s: 2.5e10,
        }
    }

    /// Checks every rate is positive and finite.
    pub fn validate(&self) -> Result<()> {
        self.cpu.validate("cpu")?;
        self.accelerator.validate("accelerator")?;
        if !(self.pcie_bytes_per_s.is_finite() && self.pcie_bytes_per_s > 0.0) {
            return Err(invalid(
                "pcie_bytes_per_s",
                "a positive finite rate",
                self.pcie_bytes_per_s,
            ));
        }
        Ok(())
    }

    /// The rates of `device`.
    pub fn rates(&self, device: Device) -> &DeviceRates {
        match device {
            Device::Cpu => &self.cpu,
            Device::Accelerator => &self.accelerator,
        }
    }

    /// Seconds for `task` on its device, moving `pcie_bytes`.
    pub fn seconds(&self, task: &Task, pcie_bytes: u64) -> f64 {
        self.rates(task.device).seconds(task) + pcie_bytes as f64 / self.pcie_bytes_per_s
    }
}

impl CostSource for CostModel {
    fn duration(&mut self, task: &Task, pcie_bytes: u64) -> f64 {
        self.seconds(task, pcie_bytes)
    }
}

/// Another source's costs, each multiplied by a random factor: log-uniform in
/// `[1 / spread, spread]`, and with probability `spike_probability` also by
/// `spike_factor` (a straggler). Seeded, so a script is replayed exactly.
#[derive(Clone, Debug)]
pub struct RandomCosts<C> {
    inner: C,
    rng: Rng,
    log_spread: f64,
    spike_probability: f64,
    spike_factor: f64,
}

impl<C: CostSource> RandomCosts<C> {
    /// Perturbs `inner` with generator `Rng::new(seed)`. `spread >= 1`,
    /// `spike_probability` in `[0, 1]`, `spike_factor >= 1`.
    pub fn new(
        inner: C,
        seed: u64,
        spread: f64,
        spike_probability: f64,
        spike_factor: f64,
    ) -> Result<Self> {
        if !(spread.is_finite() && spread >= 1.0) {
            return Err(invalid("spread", "a finite factor >= 1", spread));
        }
        if !(0.0..=1.0).contains(&spike_probability) {
            return Err(invalid(
                "spike_probability",
                "a probability in [0, 1]",
                spike_probability,
            ));
        }
        if !(spike_factor.is_finite() && spike_factor >= 1.0) {
            return Err(invalid(
                "spike_factor",
                "a finite factor >= 1",
                spike_factor,
            ));
        }
        Ok(Self {
            inner,
            rng: Rng::new(seed),
            log_spread: spread.ln(),
            spike_probability,
            spike_factor,
        })
    }
}

impl<C: CostSource> CostSource for RandomCosts<C> {
    fn duration(&mut self, task: &Task, pcie_bytes: u64) -> f64 {
        let base = self.inner.duration(task, pcie_bytes);
        let u = self.rng.next_f64() * 2.0 - 1.0;
        let mut factor = (u * self.log_spread).exp();
        if self.rng.next_f64() < self.spike_probability {
            factor *= self.spike_factor;
        }
        base * factor
    }
}

/// Costs from a closure `(task, pcie_bytes) -> seconds`.
pub struct Scripted<F>(pub F);

impl<F: FnMut(&Task, u64) -> f64> CostSource for Scripted<F> {
    fn duration(&mut self, task: &Task, pcie_bytes: u64) -> f64 {
        (self.0)(task, pcie_bytes)
    }
}

impl<F> std::fmt::Debug for Scripted<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scripted(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::{Estimate, LayerSpan, TaskKind};

    fn task(kind: TaskKind, device: Device, est: Estimate) -> Task {
        Task {
            id: 0,
            kind,
            device,
            batch: Some(0),
            super_batch: 0,
            chunk: None,
            layers: LayerSpan::one(0),
            deps: vec![],
            est,
            priority: 0,
        }
    }

    #[test]
    fn model_adds_compute_memory_sampling_and_pcie() {
        let m = CostModel {
            cpu: DeviceRates {
                flops_per_s: 10.0,
                mem_bytes_per_s: 100.0,
                sample_edges_per_s: 5.0,
                task_overhead_s: 1.0,
            },
            accelerator: DeviceRates {
                flops_per_s: 1000.0,
                mem_bytes_per_s: 1000.0,
                sample_edges_per_s: 1000.0,
                task_overhead_s: 0.0,
            },
            pcie_bytes_per_s: 50.0,
        };
        m.validate().unwrap();
        let est = Estimate {
            flops: 20.0,
            mem_bytes: 200,
            edges: 10,
            sampled_edges: 10,
            ..Estimate::default()
        };
        let t = task(TaskKind::SampleTop, Device::Cpu, est);
        assert!((m.seconds(&t, 100) - (1.0 + 2.0 + 2.0 + 2.0 + 2.0)).abs() < 1e-12);
        // Only sampled edges cost sampling time (aggregated ones do not).
        let aggregated = Estimate {
            sampled_edges: 0,
            ..est
        };
        let t = task(TaskKind::ColdCompute, Device::Cpu, aggregated);
        assert!((m.seconds(&t, 0) - 5.0).abs() < 1e-12);
        let t = task(TaskKind::ColdCompute, Device::Accelerator, aggregated);
        assert!((m.seconds(&t, 0) - 0.22).abs() < 1e-12);
        let mut bad = m;
        bad.accelerator.flops_per_s = 0.0;
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("flops_per_s"));
        CostModel::reference().validate().unwrap();
    }

    #[test]
    fn random_costs_are_seeded_and_bounded() {
        let t = task(TaskKind::Forward, Device::Accelerator, Estimate::default());
        let base = Scripted(|_: &Task, _| 1.0);
        let mut a = RandomCosts::new(base, 5, 2.0, 0.0, 1.0).unwrap();
        let xs: Vec<f64> = (0..1000).map(|_| a.duration(&t, 0)).collect();
        assert!(xs.iter().all(|&x| (0.5..=2.0).contains(&x)), "{xs:?}");
        assert!(xs.iter().any(|&x| x < 0.8) && xs.iter().any(|&x| x > 1.5));
        let mut b = RandomCosts::new(Scripted(|_: &Task, _| 1.0), 5, 2.0, 0.0, 1.0).unwrap();
        let ys: Vec<f64> = (0..1000).map(|_| b.duration(&t, 0)).collect();
        assert_eq!(xs, ys);
        let mut spiky = RandomCosts::new(Scripted(|_: &Task, _| 1.0), 5, 1.0, 1.0, 10.0).unwrap();
        assert_eq!(spiky.duration(&t, 0), 10.0);
        assert!(RandomCosts::new(CostModel::reference(), 0, 0.5, 0.0, 1.0).is_err());
        assert!(RandomCosts::new(CostModel::reference(), 0, 1.0, 2.0, 1.0).is_err());
        assert!(RandomCosts::new(CostModel::reference(), 0, 1.0, 0.0, 0.1).is_err());
    }
}
