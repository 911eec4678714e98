//! What simulated work costs: the work a simulated resource does ([`Work`]: its
//! kind, device and size estimate), a rate-based cost model, random scripts
//! around it, and hand-written scripts.
//!
//! A [`CostSource`] answers one question: how many seconds does this piece of
//! work take on its device? StarPU's simulation mode answers it from calibrated
//! per-kernel models; here the default is a roofline-style sum ([`CostModel`]),
//! [`RandomCosts`] perturbs any source with a seeded generator (for property
//! tests over many scripts), and [`Scripted`] wraps a closure (for tests that
//! need exact costs).
//!
//! # The work, and its estimate
//! One [`Work`] per thing the simulator's resources do, as the protocol's
//! actions and the CPU jobs ask (with `hot_backward = "constant"`, the runtime's
//! default):
//! - [`WorkKind::SampleTop`] (accelerator, one per batch of an
//!   [`crate::Action::Launch`]): the layers above the bottom; the bottom
//!   destinations' ids (4 B each) go to the host to plan the queue.
//! - [`WorkKind::HotCompute`] (one CPU worker, one job): `k · fanout` sampled
//!   edges, `k · (fanout + 1)` feature rows read from host memory, the bottom
//!   layer's flops; `k` rows of [`ModelShape::hot_row_bytes`] into staging.
//! - [`WorkKind::Install`] (accelerator, [`crate::Action::Install`]): those rows,
//!   host → device.
//! - [`WorkKind::SampleBottom`] (accelerator, one per batch of an
//!   [`crate::Action::SampleBottoms`]): the bottom hop of the batch's
//!   destinations other than its planned hot ones, a super-batch ahead; the
//!   skip mask (1 B per bottom destination when some are hot) goes up.
//! - [`WorkKind::Train`] (accelerator, [`crate::Action::Train`]): the used hot
//!   positions and slab rows (8 B each) go up; the bottom hop of the
//!   destinations left cold is sampled in the step (with its skip mask) unless
//!   the batch trains on the one sampled ahead
//!   ([`crate::TrainBatch::bottom_ahead`], [`Work::train_bottom_ahead`]),
//!   their inputs gathered (rows the device cache lacks cross PCIe) and
//!   computed; the upper layers forward, every layer backward, the optimizer
//!   step. `est.vertices` counts the bottom destinations the accelerator
//!   computes.
//! - [`WorkKind::Publish`] (accelerator, [`crate::Action::Publish`]): layer 0's
//!   weights, device → host: the publication's copy, resolved when it ends.
//! - [`WorkKind::LossRead`] (accelerator, [`crate::Action::QueueLossRead`]):
//!   the batches' loss slots (two 8-byte words each), device → host; its
//!   resolution waits for it.

use cpu_ops::Rng;

use crate::error::{invalid, Result};
use crate::placement::Device;
use crate::workload::{BatchShape, ModelShape};

/// Bytes of an `f32`.
const F32: u64 = 4;

/// What a piece of simulated work is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkKind {
    /// One batch's top layers, sampled at its super-batch's launch.
    SampleTop,
    /// One batch's bottom hop, sampled at its super-batch's launch.
    SampleBottom,
    /// One CPU job: a chunk's rows.
    HotCompute,
    /// One chunk's rows into the device slab.
    Install,
    /// One batch's training step, gate to optimizer step.
    Train,
    /// Layer 0's weights to the host.
    Publish,
    /// Deferred losses to the host.
    LossRead,
}

impl WorkKind {
    /// Snake-case name, as traces print it.
    pub fn name(self) -> &'static str {
        match self {
            Self::SampleTop => "sample_top",
            Self::SampleBottom => "sample_bottom",
            Self::HotCompute => "hot_compute",
            Self::Install => "install",
            Self::Train => "train",
            Self::Publish => "publish",
            Self::LossRead => "loss_read",
        }
    }

    /// The device that does it.
    pub fn device(self) -> Device {
        match self {
            Self::HotCompute => Device::Cpu,
            _ => Device::Accelerator,
        }
    }
}

impl std::fmt::Display for WorkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Estimated size of a piece of work: what a cost model turns into seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    /// Vertices it handles (destinations computed, rows moved, seeds sampled).
    pub vertices: u64,
    /// Neighbor entries it aggregates over (or samples).
    pub edges: u64,
    /// Neighbor entries it samples (charged at the device's sampling rate).
    pub sampled_edges: u64,
    /// Floating-point operations.
    pub flops: f64,
    /// Bytes it reads and writes in the memory of its own device.
    pub mem_bytes: u64,
    /// Bytes it moves between host and device.
    pub pcie_bytes: u64,
}

/// One piece of simulated work (module doc).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Work {
    /// What it is.
    pub kind: WorkKind,
    /// Where it runs ([`WorkKind::device`]).
    pub device: Device,
    /// The global batch, for batch work.
    pub batch: Option<u64>,
    /// The super-batch it serves.
    pub super_batch: u64,
    /// Its size.
    pub est: Estimate,
}

impl Work {
    fn new(kind: WorkKind, batch: Option<u64>, super_batch: u64, est: Estimate) -> Self {
        Self {
            kind,
            device: kind.device(),
            batch,
            super_batch,
            est,
        }
    }

    /// Batch `batch`'s top layers (of super-batch `super_batch`).
    pub fn sample_top(s: &BatchShape, batch: u64, super_batch: u64) -> Self {
        let edges = s.upper_edges;
        let vertices = s.seeds + s.upper_dst;
        let est = Estimate {
            vertices,
            edges,
            sampled_edges: edges,
            mem_bytes: 12 * edges + 8 * vertices,
            pcie_bytes: 4 * (s.hot + s.cold_dst),
            ..Estimate::default()
        };
        Self::new(WorkKind::SampleTop, Some(batch), super_batch, est)
    }

    /// A CPU job of `k` vertices: one hop with the bottom fanout, the neighbors'
    /// input features from host memory, the bottom layer (the runtime's
    /// `HotComputer::compute_into`).
    pub fn hot_compute(m: &ModelShape, k: u64, super_batch: u64) -> Self {
        let edges = k * m.bottom_fanout as u64;
        let row = m.feature_row_bytes();
        let (f, h) = (m.feature_dim as f64, m.hidden as f64);
        let est = Estimate {
            vertices: k,
            edges,
            sampled_edges: edges,
            flops: edges as f64 * f + 2.0 * k as f64 * f * h,
            mem_bytes: (12 * edges + 8 * k) + 3 * row * (edges + k) + m.hot_row_bytes() * k,
            pcie_bytes: 0,
        };
        Self::new(WorkKind::HotCompute, None, super_batch, est)
    }

    /// The upload of a chunk of `k` rows into the slab.
    pub fn install(m: &ModelShape, k: u64, super_batch: u64) -> Self {
        let bytes = m.hot_row_bytes() * k;
        let est = Estimate {
            vertices: k,
            mem_bytes: bytes,
            pcie_bytes: bytes,
            ..Estimate::default()
        };
        Self::new(WorkKind::Install, None, super_batch, est)
    }

    /// Batch `batch`'s bottom hop with shape `s` (its planned hot
    /// destinations skipped), sampled ahead.
    pub fn sample_bottom(s: &BatchShape, batch: u64, super_batch: u64) -> Self {
        let est = Estimate {
            vertices: s.cold_dst,
            edges: s.cold_edges,
            sampled_edges: s.cold_edges,
            mem_bytes: 12 * s.cold_edges + 8 * s.cold_dst,
            pcie_bytes: Self::skip_mask_bytes(s),
            ..Estimate::default()
        };
        Self::new(WorkKind::SampleBottom, Some(batch), super_batch, est)
    }

    /// The skip mask of a bottom hop: a byte per bottom destination when
    /// some are hot.
    fn skip_mask_bytes(s: &BatchShape) -> u64 {
        if s.hot > 0 {
            s.hot + s.cold_dst
        } else {
            0
        }
    }

    /// Batch `batch`'s step with shape `s` (its hot destinations the rows used,
    /// the late ones moved to the cold side, [`BatchShape::with_cold`]), its
    /// bottom hop sampled in the step.
    pub fn train(m: &ModelShape, s: &BatchShape, batch: u64, super_batch: u64) -> Self {
        Self::train_with(m, s, batch, super_batch, true)
    }

    /// [`Work::train`] on the bottom hop sampled ahead
    /// ([`Work::sample_bottom`]): no sampling, no skip mask.
    pub fn train_bottom_ahead(
        m: &ModelShape,
        s: &BatchShape,
        batch: u64,
        super_batch: u64,
    ) -> Self {
        Self::train_with(m, s, batch, super_batch, false)
    }

    fn train_with(
        m: &ModelShape,
        s: &BatchShape,
        batch: u64,
        super_batch: u64,
        sample_bottom: bool,
    ) -> Self {
        let (f, h) = (m.feature_dim as f64, m.hidden as f64);
        let row = m.feature_row_bytes();
        // Hot rows: positions and slab rows up, rows selected on the device.
        let hot_mem = 2 * m.hot_row_bytes() * s.hot;
        let (mask, sampled_edges, bottom_mem) = if sample_bottom {
            let b = Self::sample_bottom(s, batch, super_batch).est;
            (b.pcie_bytes, b.sampled_edges, b.mem_bytes)
        } else {
            (0, 0, 0)
        };
        // The gather and compute of the cold destinations.
        let gather_mem = 2 * row * s.cold_inputs;
        let host_rows = s.cold_inputs - s.cached_inputs.min(s.cold_inputs);
        let cold_flops = s.cold_edges as f64 * f + 2.0 * s.cold_dst as f64 * f * h;
        let cold_mem = row * (s.cold_edges + s.cold_dst) + F32 * m.hidden as u64 * s.cold_dst;
        // The upper layers, backward (≈ twice the forward, plus the bottom
        // layer's weight gradient over every bottom destination), the step.
        let fwd_flops = s.upper_edges as f64 * h + 2.0 * s.upper_dst as f64 * h * h;
        let act = F32 * m.hidden as u64 * (s.upper_dst + s.upper_edges);
        let bottom = (s.hot + s.cold_dst) as f64;
        let bwd_flops = 2.0 * fwd_flops + 2.0 * bottom * f * h;
        let bwd_mem = 2 * act + row * (s.hot + s.cold_dst);
        let p = m.parameters();
        let est = Estimate {
            vertices: s.cold_dst,
            edges: s.upper_edges + s.cold_edges,
            sampled_edges,
            flops: cold_flops + fwd_flops + bwd_flops + 10.0 * p as f64,
            mem_bytes: hot_mem + bottom_mem + gather_mem + cold_mem + act + bwd_mem + 16 * p,
            pcie_bytes: 8 * s.hot + mask + row * host_rows,
        };
        Self::new(WorkKind::Train, Some(batch), super_batch, est)
    }

    /// Layer 0's weights to the host.
    pub fn publish(m: &ModelShape, super_batch: u64) -> Self {
        let w = m.bottom_weight_bytes();
        let est = Estimate {
            mem_bytes: w,
            pcie_bytes: w,
            ..Estimate::default()
        };
        Self::new(WorkKind::Publish, None, super_batch, est)
    }

    /// The read of `batches` batches' deferred losses.
    pub fn loss_read(batches: u64, super_batch: u64) -> Self {
        let bytes = 16 * batches;
        let est = Estimate {
            vertices: batches,
            mem_bytes: bytes,
            pcie_bytes: bytes,
            ..Estimate::default()
        };
        Self::new(WorkKind::LossRead, None, super_batch, est)
    }
}

/// Durations of work.
pub trait CostSource {
    /// Seconds `work` takes on `work.device`. Must be finite and non-negative
    /// (the simulator checks).
    fn duration(&mut self, work: &Work) -> f64;
}

impl<C: CostSource + ?Sized> CostSource for &mut C {
    fn duration(&mut self, work: &Work) -> f64 {
        (**self).duration(work)
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

    /// Seconds for an estimate on this device (PCIe excluded).
    fn seconds(&self, e: &Estimate) -> f64 {
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

    /// Seconds for `work` on its device, its PCIe bytes included.
    pub fn seconds(&self, work: &Work) -> f64 {
        self.rates(work.device).seconds(&work.est)
            + work.est.pcie_bytes as f64 / self.pcie_bytes_per_s
    }
}

impl CostSource for CostModel {
    fn duration(&mut self, work: &Work) -> f64 {
        self.seconds(work)
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
    fn duration(&mut self, work: &Work) -> f64 {
        let base = self.inner.duration(work);
        let u = self.rng.next_f64() * 2.0 - 1.0;
        let mut factor = (u * self.log_spread).exp();
        if self.rng.next_f64() < self.spike_probability {
            factor *= self.spike_factor;
        }
        base * factor
    }
}

/// Costs from a closure `work -> seconds`.
pub struct Scripted<F>(pub F);

impl<F: FnMut(&Work) -> f64> CostSource for Scripted<F> {
    fn duration(&mut self, work: &Work) -> f64 {
        (self.0)(work)
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

    fn work(kind: WorkKind, device: Device, est: Estimate) -> Work {
        Work {
            kind,
            device,
            batch: Some(0),
            super_batch: 0,
            est,
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
            pcie_bytes: 100,
            ..Estimate::default()
        };
        let w = work(WorkKind::SampleTop, Device::Cpu, est);
        assert!((m.seconds(&w) - (1.0 + 2.0 + 2.0 + 2.0 + 2.0)).abs() < 1e-12);
        // Only sampled edges cost sampling time (aggregated ones do not).
        let aggregated = Estimate {
            sampled_edges: 0,
            pcie_bytes: 0,
            ..est
        };
        let w = work(WorkKind::HotCompute, Device::Cpu, aggregated);
        assert!((m.seconds(&w) - 5.0).abs() < 1e-12);
        let w = work(WorkKind::Train, Device::Accelerator, aggregated);
        assert!((m.seconds(&w) - 0.22).abs() < 1e-12);
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
    fn estimates_move_what_the_module_doc_says_over_pcie() {
        let m = ModelShape::new(16, 8, 3, 5).unwrap();
        let s = BatchShape {
            seeds: 8,
            upper_dst: 16,
            upper_edges: 40,
            hot: 2,
            cold_dst: 2,
            cold_edges: 10,
            cold_inputs: 12,
            cached_inputs: 2,
        };
        assert_eq!(Work::sample_top(&s, 3, 1).est.pcie_bytes, 4 * 4);
        assert_eq!(Work::sample_top(&s, 3, 1).device, Device::Accelerator);
        let hot = Work::hot_compute(&m, 2, 1);
        assert_eq!((hot.device, hot.est.pcie_bytes), (Device::Cpu, 0));
        assert_eq!(hot.est.sampled_edges, 10);
        assert_eq!(Work::install(&m, 2, 1).est.pcie_bytes, 2 * 4 * 8);
        assert_eq!(Work::publish(&m, 1).est.pcie_bytes, m.bottom_weight_bytes());
        // Positions and rows (8 B per hot row), the mask, the host rows.
        let t = Work::train(&m, &s, 3, 1);
        assert_eq!(t.est.pcie_bytes, 16 + 4 + 10 * m.feature_row_bytes());
        assert_eq!(t.est.vertices, 2);
        // A late vertex left cold: one fewer position, more bottom work.
        let late = Work::train(&m, &s.with_cold(1, m.bottom_fanout), 3, 1);
        assert_eq!(late.est.vertices, 3);
        assert_eq!(late.est.sampled_edges, 15);
        assert!(late.est.flops > t.est.flops);
        assert_eq!(late.est.pcie_bytes, 8 + 4 + 16 * m.feature_row_bytes());
        // The bottom hop sampled ahead: its sampling and mask move out of the
        // step, the rest stays.
        let bottom = Work::sample_bottom(&s, 3, 1);
        let ahead = Work::train_bottom_ahead(&m, &s, 3, 1);
        assert_eq!((bottom.est.sampled_edges, bottom.est.pcie_bytes), (10, 4));
        assert_eq!(ahead.est.sampled_edges, 0);
        assert_eq!(
            ahead.est.pcie_bytes + bottom.est.pcie_bytes,
            t.est.pcie_bytes
        );
        assert_eq!(ahead.est.mem_bytes + bottom.est.mem_bytes, t.est.mem_bytes);
        assert_eq!((ahead.est.flops, ahead.est.vertices), (t.est.flops, 2));
        assert_eq!(Work::loss_read(4, 1).est.pcie_bytes, 64);
    }

    #[test]
    fn random_costs_are_seeded_and_bounded() {
        let w = work(WorkKind::Train, Device::Accelerator, Estimate::default());
        let base = Scripted(|_: &Work| 1.0);
        let mut a = RandomCosts::new(base, 5, 2.0, 0.0, 1.0).unwrap();
        let xs: Vec<f64> = (0..1000).map(|_| a.duration(&w)).collect();
        assert!(xs.iter().all(|&x| (0.5..=2.0).contains(&x)), "{xs:?}");
        assert!(xs.iter().any(|&x| x < 0.8) && xs.iter().any(|&x| x > 1.5));
        let mut b = RandomCosts::new(Scripted(|_: &Work| 1.0), 5, 2.0, 0.0, 1.0).unwrap();
        let ys: Vec<f64> = (0..1000).map(|_| b.duration(&w)).collect();
        assert_eq!(xs, ys);
        let mut spiky = RandomCosts::new(Scripted(|_: &Work| 1.0), 5, 1.0, 1.0, 10.0).unwrap();
        assert_eq!(spiky.duration(&w), 10.0);
        assert!(RandomCosts::new(CostModel::reference(), 0, 0.5, 0.0, 1.0).is_err());
        assert!(RandomCosts::new(CostModel::reference(), 0, 1.0, 2.0, 1.0).is_err());
        assert!(RandomCosts::new(CostModel::reference(), 0, 1.0, 0.0, 0.1).is_err());
    }
}
