//! What a simulation run reports: per batch, per super-batch, per task, and totals.
//!
//! The runtime's end-of-run summary and trace use the same quantities (waits by
//! cause, busy and idle time, PCIe bytes, reuse gaps, late vertices, monitor
//! moves), so a simulated run and a real one can be read side by side.

use crate::monitor::MoveEvent;
use crate::pipeline::HotSplit;
use crate::staleness::GapHistogram;
use crate::task::{Device, TaskKind};

/// One batch of a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BatchRecord {
    /// Global batch index.
    pub batch: u64,
    /// Its super-batch.
    pub super_batch: u64,
    /// When the previous batch finished (0 for the first).
    pub start_s: f64,
    /// When its optimizer step finished.
    pub end_s: f64,
    /// Accelerator time waiting at its hot-embedding gate.
    pub hot_wait_s: f64,
    /// Accelerator time waiting for its other inputs (sampling, gathering).
    pub other_wait_s: f64,
    /// CPU embeddings it used.
    pub hot_used: u32,
    /// Late vertices it computed cold (`on_late = "compute"`): the batch's vertices
    /// in the chunks its gate found late.
    pub late_computed: u32,
    /// Urgent CPU jobs its gate sent (`on_late = "wait"`): one per late chunk,
    /// a promotion of a chunk not computed yet or a recomputation of a stale one.
    pub urgent_tasks: u32,
    /// Its largest reuse gap.
    pub max_gap: Option<u64>,
    /// Bytes its tasks moved over PCIe (chunk installs are the queue's, not a
    /// batch's, unless its gate sent them).
    pub pcie_bytes: u64,
}

/// One super-batch window of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct SuperBatchRecord {
    /// Super-batch index.
    pub index: u64,
    /// Window start (the previous super-batch's end).
    pub start_s: f64,
    /// Window end (its last publication).
    pub end_s: f64,
    /// Accelerator busy time in the window.
    pub acc_busy_s: f64,
    /// Accelerator time waiting at hot gates in the window.
    pub acc_wait_hot_s: f64,
    /// Accelerator time waiting for other inputs in the window.
    pub acc_wait_other_s: f64,
    /// CPU worker-seconds busy in the window.
    pub cpu_busy_s: f64,
    /// Of which on hot-embedding work.
    pub cpu_hot_busy_s: f64,
    /// CPU worker-seconds idle in the window.
    pub cpu_idle_s: f64,
    /// Its hot queue's length.
    pub queue_len: usize,
    /// The split it was planned with.
    pub split: HotSplit,
    /// Hot chunks of its queue dropped as useless (pipeline step 6).
    pub dropped_chunks: u32,
    /// Device cache bytes resident at its end.
    pub cache_bytes: u64,
}

/// One task as it ran (with [`crate::SimConfig::record_trace`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskSpan {
    /// Task id.
    pub id: usize,
    /// Kind.
    pub kind: TaskKind,
    /// Device.
    pub device: Device,
    /// Batch, for batch tasks and run-time tasks of a batch.
    pub batch: Option<u64>,
    /// Super-batch.
    pub super_batch: u64,
    /// The chunk of the super-batch's queue, for hot-chunk tasks.
    pub chunk: Option<u32>,
    /// Start time.
    pub start_s: f64,
    /// End time.
    pub end_s: f64,
    /// The weight version a hot computation stamped, an install uploaded, or a
    /// publication published.
    pub version: Option<u64>,
    /// For a hot computation or install: its chunk's vertices.
    pub hot_vertices: Vec<u32>,
    /// Whether it was dropped and did nothing: a chunk nobody would read
    /// (pipeline step 6), or an install of rows no newer than the slab's.
    pub dropped: bool,
    /// Whether it was created at run time by a gate (urgent work).
    pub dynamic: bool,
    /// Its dependencies (the graph's edges; which installs a gate reads is the
    /// staleness rule's decision, not an edge).
    pub deps: Vec<usize>,
}

/// Sums over a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimTotals {
    /// Time until the last task finished (the "epoch time" of the workload).
    pub epoch_s: f64,
    /// Accelerator busy time.
    pub acc_busy_s: f64,
    /// CPU worker-seconds busy.
    pub cpu_busy_s: f64,
    /// `acc_busy_s / epoch_s`.
    pub acc_busy_fraction: f64,
    /// `cpu_busy_s / (cpu_workers · epoch_s)`.
    pub cpu_busy_fraction: f64,
    /// Accelerator time waiting at hot gates.
    pub acc_wait_hot_s: f64,
    /// Accelerator time waiting for other inputs.
    pub acc_wait_other_s: f64,
    /// Bytes moved over PCIe.
    pub pcie_bytes: u64,
    /// CPU embeddings used.
    pub hot_uses: u64,
    /// Late vertices computed cold.
    pub late_computed: u64,
    /// Urgent CPU jobs sent (promotions and recomputations).
    pub urgent_tasks: u64,
    /// Hot chunks dropped.
    pub dropped_chunks: u64,
    /// Hot rows uploaded into the device slabs (once per installed chunk).
    pub rows_installed: u64,
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
    /// Every reuse gap.
    pub gaps: GapHistogram,
    /// Per hot vertex: how many times it was computed cold because it was late.
    pub cold_computed: Vec<u64>,
    /// Sums.
    pub totals: SimTotals,
    /// Every task, in start order (empty unless [`crate::SimConfig::record_trace`]).
    pub trace: Vec<TaskSpan>,
}
