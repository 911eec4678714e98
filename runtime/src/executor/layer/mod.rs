//! The layer-based executor (docs/orchestration.md §2, §9): the CPU computes
//! hot vertices' bottom-layer embeddings a super-batch ahead while the device
//! engine trains, and every batch reuses them within the staleness bound. The
//! decisions are `scheduler::protocol`'s; this module carries them out.
//!
//! - [`device`]: the strategy's device half over the engine's mechanisms
//!   ([`device::LayerEngine`]: hot-row slabs and store, the top layers and
//!   bottom hops sampled ahead, the batch trained with hot rows);
//! - [`pipeline`]: the protocol's driver on the accelerator thread
//!   ([`Orchestrator`]): engine calls, worker channels, claim flags, staging
//!   buffers, the clock and the trace;
//! - [`workers`]: the persistent CPU workers and their job channels;
//! - [`hot_compute`]: published layer-0 weights and the CPU computation of a chunk;
//! - [`monitor`]: the hybrid monitor at run time: moves hot vertices between CPU
//!   computation and the device feature cache;
//! - [`stats`]: what the pipeline did ([`OrchestrationStats`]).

pub(crate) mod device;
pub(crate) mod hot_compute;
pub(crate) mod monitor;
pub(crate) mod pipeline;
pub(crate) mod planner;
pub(crate) mod stats;
#[cfg(test)]
mod window_tests;
pub(crate) mod workers;

use gpu_ops::Backend;

use super::{DistSetup, EpochEnd, EpochRun, Executor, OnBatch};
use crate::engine::{DeviceEngine, ModelState};
use crate::error::{Error, Result};
use crate::trace::{Tracer, TrackId};
use device::{LayerEngine, LayerState};

pub(crate) use pipeline::{LayerOptions, LayerSetup, Orchestrator};
pub use stats::OrchestrationStats;
#[cfg(test)]
pub(crate) use workers::InjectedFault;

/// The super-batch pipeline over one device engine.
pub(crate) struct LayerExecutor<B: Backend> {
    engine: LayerEngine<B>,
    orch: Orchestrator,
}

/// What a [`LayerExecutor`] keeps while another strategy has its engine
/// (`policy = "auto"`): the pipeline (its hot set and workers) and the device
/// half's state (the hot-row store the protocol counts on).
pub(crate) struct ParkedLayer<B: Backend> {
    orch: Orchestrator,
    state: LayerState<B>,
}

impl<B: Backend> LayerExecutor<B> {
    /// `orch`'s pipeline over `engine`, with a fresh device half.
    pub fn new(engine: DeviceEngine<B>, orch: Orchestrator) -> Self {
        Self {
            engine: LayerEngine::new(engine, LayerState::default()),
            orch,
        }
    }

    /// A parked pipeline over `engine` again.
    pub fn resume(engine: DeviceEngine<B>, parked: ParkedLayer<B>) -> Self {
        Self {
            engine: LayerEngine::new(engine, parked.state),
            orch: parked.orch,
        }
    }

    /// The pipeline's state, to change its split or turn the monitor on.
    pub fn orchestrator_mut(&mut self) -> &mut Orchestrator {
        &mut self.orch
    }

    /// Gives the engine back and parks the rest (another strategy takes the
    /// engine over; the pipeline, its hot set, workers and store stay
    /// reusable). The rows the monitor moved into the feature cache go back
    /// first.
    pub fn park(mut self) -> Result<(DeviceEngine<B>, ParkedLayer<B>)> {
        self.orch.release_cache(&mut self.engine)?;
        let (engine, state) = self.engine.into_parts();
        Ok((
            engine,
            ParkedLayer {
                orch: self.orch,
                state,
            },
        ))
    }
}

impl<B: Backend> ParkedLayer<B> {
    /// A parked pipeline with a fresh device half.
    pub fn new(orch: Orchestrator) -> Self {
        Self {
            orch,
            state: LayerState::default(),
        }
    }

    /// The parked pipeline.
    pub fn orchestrator_mut(&mut self) -> &mut Orchestrator {
        &mut self.orch
    }
}

impl<B: Backend> Executor for LayerExecutor<B> {
    fn train(&mut self, run: &EpochRun<'_>, on_batch: &mut OnBatch<'_>) -> Result<EpochEnd> {
        self.orch.run_epoch(&mut self.engine, run, on_batch)
    }

    fn state(&mut self) -> &mut dyn ModelState {
        &mut self.engine.engine
    }

    fn state_ref(&self) -> &dyn ModelState {
        &self.engine.engine
    }

    fn set_tracer(&mut self, tracer: &Tracer, acc: TrackId) {
        self.engine.engine.set_tracer(tracer.clone(), acc);
        self.orch.set_tracer(tracer);
    }

    fn describe(&self) -> String {
        format!(
            "orchestration: layer ({} hot vertices, CPU split {}, {} CPU workers)",
            self.orch.hot_count(),
            self.orch.cpu_split(),
            self.orch.workers()
        )
    }

    fn orchestration(&self) -> Option<(Option<&OrchestrationStats>, &OrchestrationStats)> {
        Some((self.orch.last_epoch(), self.orch.totals()))
    }

    fn relabeling(&self) -> Option<&scheduler::Relabeling> {
        Some(self.orch.relabeling())
    }

    fn distribute(self: Box<Self>, setup: DistSetup) -> Result<Box<dyn Executor>> {
        Err(Error::invalid_argument(
            "orchestration.policy",
            format!(
                "distributed training ({} ranks) runs step-based placements: \
                 layer-based orchestration (policy = \"layer\" with hot_ratio > 0) \
                 across ranks is not built yet",
                setup.comm.size()
            ),
        ))
    }

    #[cfg(test)]
    fn inject_fault(&mut self, fault: Option<InjectedFault>) {
        self.orch.inject_fault(fault);
    }
}
