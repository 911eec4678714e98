//! Tandem's decisions, with no threads and no clocks: hotness, placements,
//! super-batch planning, staleness rules, the super-batch protocol as a state
//! machine, the hybrid monitor, and a deterministic simulator that drives the
//! protocol with a cost model.
//!
//! - hotness: [`HotnessPolicy`] (pre-sampling or degree order) scores vertices;
//!   [`Relabeling`] makes the hot set an id prefix and relabels graphs and arrays;
//! - placements: [`Orchestration`] (the config key `orchestration`), [`Device`],
//!   the step-based baselines [`StepBased`];
//! - the pipeline: [`PipelineConfig`] (super-batch size, depth), [`HotSplit`]
//!   (CPU part / cached part of the hot set), [`SuperBatchPlan`] (hot queues),
//!   [`Publication`] (when weights go to the CPU);
//! - staleness: [`StalenessRule`], [`OnLate`], [`GapHistogram`];
//! - the protocol: [`Protocol`] consumes [`Event`]s and emits [`Action`]s (module
//!   [`protocol`], whose numbered steps are the one description of the
//!   super-batch pipeline), counting [`ProtocolStats`];
//! - the monitor: [`Monitor`], [`Observation`], [`MoveEvent`];
//! - `policy = "auto"`: [`choose`] among measured placements, [`LayerFit`] to
//!   propose the layer-based split worth measuring;
//! - simulation: [`simulate`] drives the [`Protocol`] on simulated CPU workers
//!   and an accelerator thread, with durations from a [`CostSource`]
//!   ([`CostModel`], [`RandomCosts`], [`Scripted`]) for a [`Workload`].
//!
//! The design is in `docs/orchestration.md`.

#![deny(missing_docs)]

mod auto;
mod cost;
mod error;
mod hotness;
mod monitor;
mod pcie_value;
mod pipeline;
mod placement;
pub mod protocol;
mod relabel;
mod report;
mod share;
mod sim;
mod staleness;
mod workload;

pub use auto::{
    choose, Choice, LayerFit, LayerProbe, Measured, SplitCounts, DEFAULT_TIE, PREFERENCE,
};
pub use cost::{
    CostModel, CostSource, DeviceRates, Estimate, RandomCosts, Scripted, Work, WorkKind,
};
pub use error::{Result, SchedulerError};
pub use hotness::{
    degree_scores, hotness_order, presample_counts, presample_sides, presample_sides_with, Hotness,
    HotnessPolicy, PresampleRun, Touch, DEFAULT_PRESAMPLE_EPOCHS,
};
pub use monitor::{Direction, Monitor, MonitorConfig, MoveEvent, MoveReason, Observation};
pub use pcie_value::{pcie_value_order, pcie_values, size_by_throughput, RowCost, ValueInputs};
pub use pipeline::{
    HotSplit, PipelineConfig, Publication, SuperBatchPlan, VertexClass, MAX_PIPELINE_DEPTH,
};
pub use placement::{Device, Orchestration, Policy, StepBased, POLICY_NAMES};
pub use protocol::{
    Action, BottomHops, ChunkKey, ClaimId, Event, Job, LaunchPlan, LaunchedBatch, Protocol,
    ProtocolConfig, ProtocolStats, ReportId, SuperBatchHot, TrainBatch, Urgent,
};
pub use relabel::{hot_count, Permutation, Relabeling};
pub use report::{
    BatchRecord, LossReadRecord, MarkRecord, SimReport, SimTotals, Span, SuperBatchRecord,
};
pub use share::{MonitorControl, ShareConfig, ShareController, SharePhase};
pub use sim::{simulate, SimConfig};
pub use staleness::{Decision, GapHistogram, OnLate, StalenessRule};
pub use workload::{BatchDemand, BatchShape, ModelShape, SyntheticWorkload, Workload};
