//! What a simulation run reports: per batch, per super-batch, per piece of work,
//! and totals.
//!
//! The counts the protocol keeps ([`ProtocolStats`]: gaps, waits, cold work,
//! urgent and dropped jobs, installs) are the protocol's own, as the runtime's
//! `OrchestrationStats` will be; the simulator adds what only a clock knows
//! (busy, waiting and idle time, PCIe bytes), so a simulated run and a real one
//! can be read side by side.

use std::ops::Range;

use crate::cost::WorkKind;
use crate::monitor::MoveEvent;
use crate::pipeline::HotSplit;
use crate::placement::Device;
use crate::protocol::ProtocolStats;

/// One batch of a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BatchRecord {
    /// Global batch index.
    pub batch: u64,
    /// Its super-batch.
    pub super_batch: u64,
    /// When its gate opened.
    pub start_s: f64,
    /// When its step finished.
    pub end_s: f64,
    /// Accelerator time blocked at its gate.
    pub hot_wait_s: f64,
    /// Rows from the CPU it used.
    pub hot_used: u32,
    /// Late positions it left cold (`on_late = "compute"`).
    pub late_computed: u32,
    /// Urgent CPU jobs its gate queued (`on_late = "wait"`): promotions of
    /// chunks not computed yet and recomputations of stale ones.
    pub urgent_jobs: u32,
    /// Its largest reuse gap.
    pub max_gap: Option<u64>,
    /// Bytes its training step moved over PCIe.
    pub pcie_bytes: u64,
    /// Whether it trained on the bottom hop sampled at its launch.
    pub bottom_ahead: bool,
    /// When its loss was shown (`None`: never).
    pub shown_s: Option<f64>,
}

/// One read of deferred losses ([`crate::Action::QueueLossRead`]).
#[derive(Clone, Debug, PartialEq)]
pub struct LossReadRecord {
    /// The batches whose loss slots it read.
    pub batches: Range<usize>,
    /// The super-batch in progress when it was queued (its index in the run).
    pub super_batch: u64,
    /// When it was queued.
    pub queued_s: f64,
    /// When it was resolved (`None`: never).
    pub resolved_s: Option<f64>,
}

/// One mark of the measurement window ([`crate::Action::Mark`]).
#[derive(Clone, Debug, PartialEq)]
pub struct MarkRecord {
    /// The batch it is before.
    pub batch: usize,
    /// The window's start (else its end).
    pub start: bool,
    /// When it was taken.
    pub time_s: f64,
    /// Batches trained before it.
    pub trained: usize,
    /// Batches shown before it.
    pub shown: usize,
}

/// One super-batch window of a run (from the end of the previous super-batch,
/// or the run's first gate, to its own end, [`crate::Action::EndSuperBatch`]).
#[derive(Clone, Debug, PartialEq)]
pub struct SuperBatchRecord {
    /// Super-batch index.
    pub index: u64,
    /// Window start.
    pub start_s: f64,
    /// Window end.
    pub end_s: f64,
    /// Accelerator busy time in the window.
    pub acc_busy_s: f64,
    /// Accelerator time blocked at gates in the window.
    pub acc_wait_hot_s: f64,
    /// CPU worker-seconds busy on hot work in the window.
    pub cpu_hot_busy_s: f64,
    /// CPU worker-seconds idle in the window.
    pub cpu_idle_s: f64,
    /// Its hot queue's length.
    pub queue_len: usize,
    /// The split it was planned with.
    pub split: HotSplit,
    /// Regular jobs of its queue dropped unstarted.
    pub dropped_jobs: u32,
    /// Device cache bytes resident at its end.
    pub cache_bytes: u64,
    /// Its hot queue's rows computed, carried from earlier super-batches and
    /// used.
    pub hot: crate::protocol::SuperBatchHot,
}

/// One piece of work as it ran (with [`crate::SimConfig::record_trace`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// What it was.
    pub kind: WorkKind,
    /// Where it ran.
    pub device: Device,
    /// Start time.
    pub start_s: f64,
    /// End time.
    pub end_s: f64,
    /// The global batch, for [`WorkKind::SampleTop`], [`WorkKind::Train`] and
    /// urgent jobs (the batch whose gate sent them).
    pub batch: Option<u64>,
    /// The super-batch it served.
    pub super_batch: u64,
    /// The chunk, for [`WorkKind::HotCompute`] and [`WorkKind::Install`].
    pub chunk: Option<u32>,
    /// Its estimate's vertices ([`crate::Estimate::vertices`]: a computation's or
    /// an install's rows).
    pub vertices: u64,
    /// The version a publication published, a computation stamped, an install
    /// uploaded, or a batch trained at.
    pub version: Option<u64>,
    /// For an install: the index in the trace of the computation whose rows it
    /// uploads.
    pub source: Option<usize>,
    /// For a computation: queued by a gate (`Some(true)` a recomputation,
    /// `Some(false)` a promotion that ran first).
    pub urgent: Option<bool>,
}

/// Sums over a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimTotals {
    /// Time until the protocol finished (the "epoch time" of the workload).
    pub epoch_s: f64,
    /// Accelerator busy time.
    pub acc_busy_s: f64,
    /// CPU worker-seconds busy.
    pub cpu_busy_s: f64,
    /// `acc_busy_s / epoch_s`.
    pub acc_busy_fraction: f64,
    /// `cpu_busy_s / (cpu_workers · epoch_s)`.
    pub cpu_busy_fraction: f64,
    /// Accelerator time blocked at gates.
    pub acc_wait_hot_s: f64,
    /// Bytes moved over PCIe.
    pub pcie_bytes: u64,
    /// Largest device cache held at any time, bytes.
    pub max_cache_bytes: u64,
    /// Monitor moves.
    pub moves: u64,
}

/// The result of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct SimReport {
    /// Per batch.
    pub batches: Vec<BatchRecord>,
    /// Per super-batch.
    pub super_batches: Vec<SuperBatchRecord>,
    /// The monitor's moves, in order.
    pub moves: Vec<MoveEvent>,
    /// The protocol's counts (its gap histogram included).
    pub stats: ProtocolStats,
    /// Per hot vertex: how many times a batch left it cold because it was late.
    pub cold_computed: Vec<u64>,
    /// Sums.
    pub totals: SimTotals,
    /// Every piece of work, in start order (empty unless
    /// [`crate::SimConfig::record_trace`]).
    pub trace: Vec<Span>,
    /// Every read of deferred losses, in order.
    pub loss_reads: Vec<LossReadRecord>,
    /// The batches in the order their losses were shown.
    pub shown: Vec<usize>,
    /// The measurement window's marks, in order.
    pub marks: Vec<MarkRecord>,
    /// At a non-finite loss: the batch and the steps the version moved back.
    pub rewound: Option<(usize, u64)>,
}
