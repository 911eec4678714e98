//! Tandem's decisions, with no threads and no clocks: hotness, the layer-based
//! task graph, placement policies, super-batch planning, staleness rules, the
//! hybrid monitor, and a deterministic simulator to test them together.
//!
//! - hotness: [`HotnessPolicy`] (pre-sampling or degree order) scores vertices;
//!   [`Relabeling`] makes the hot set an id prefix and relabels graphs and arrays;
//! - the task graph: [`Task`], [`TaskKind`], [`Device`], [`TaskGraph`], built per
//!   super-batch by [`GraphBuilder`] from [`SuperBatchPlan`]s and [`BatchShape`]s;
//! - placements: the [`Placement`] trait, [`LayerBased`] and [`StepBased`],
//!   selected by [`Orchestration`] (the config key `orchestration`);
//! - the pipeline: [`PipelineConfig`] (super-batch size, depth), [`HotSplit`]
//!   (CPU part / cached part of the hot set), [`SuperBatchPlan`] (hot queues),
//!   [`Publication`] (when weights go to the CPU);
//! - staleness: [`StalenessRule`], [`OnLate`], [`GapHistogram`];
//! - the protocol: [`Protocol`] consumes [`Event`]s and emits [`Action`]s (module
//!   [`protocol`]: the super-batch pipeline's decisions as a state machine);
//! - the monitor: [`Monitor`], [`Observation`], [`MoveEvent`];
//! - `policy = "auto"`: [`choose`] among measured placements, [`LayerFit`] to
//!   propose the layer-based split worth measuring;
//! - simulation: [`CostSource`] ([`CostModel`], [`RandomCosts`], [`Scripted`]),
//!   [`Workload`], [`simulate`] — a model of the runtime's protocol, whose one
//!   description is the numbered steps of `runtime/src/orchestrate/pipeline.rs`.
//!
//! The design is in `docs/orchestration.md`.

#![deny(missing_docs)]

mod auto;
mod builder;
mod cost;
mod error;
mod hotness;
mod monitor;
mod pipeline;
mod placement;
pub mod protocol;
mod relabel;
mod report;
mod sim;
mod staleness;
mod task;
mod workload;

pub use auto::{
    choose, Choice, LayerFit, LayerProbe, Measured, SplitCounts, DEFAULT_TIE, PREFERENCE,
};
pub use builder::{BatchShape, BatchTasks, ChunkTasks, GraphBuilder, ModelShape, SuperBatchTasks};
pub use cost::{CostModel, CostSource, DeviceRates, RandomCosts, Scripted};
pub use error::{Result, SchedulerError};
pub use hotness::{
    degree_scores, hotness_order, presample_counts, HotnessPolicy, Touch, DEFAULT_PRESAMPLE_EPOCHS,
};
pub use monitor::{Direction, Monitor, MonitorConfig, MoveEvent, MoveReason, Observation};
pub use pipeline::{
    HotSplit, PipelineConfig, Publication, SuperBatchPlan, VertexClass, MAX_PIPELINE_DEPTH,
};
pub use placement::{LayerBased, Orchestration, Placement, StepBased};
pub use protocol::{
    Action, ChunkKey, ClaimId, Event, Job, LaunchedBatch, Protocol, ProtocolConfig, ProtocolStats,
    ReportId, TrainBatch, Urgent,
};
pub use relabel::{hot_count, Permutation, Relabeling};
pub use report::{BatchRecord, SimReport, SimTotals, SuperBatchRecord, TaskSpan};
pub use sim::{simulate, SimConfig};
pub use staleness::{Decision, GapHistogram, OnLate, StalenessRule};
pub use task::{Device, Estimate, LayerSpan, Step, Task, TaskGraph, TaskKind};
pub use workload::{BatchDemand, SyntheticWorkload, Workload};
