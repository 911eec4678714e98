//! The layer-based task graph: what one batch (and one super-batch's hot queue)
//! becomes, as data — a model of what the runtime executes, whose protocol is
//! the numbered steps of `runtime/src/orchestrate/pipeline.rs` (the mapping of
//! tasks to those steps is in [`crate::GraphBuilder`]'s module doc).
//!
//! Each batch is split by *layer* as well as by *step* (NeutronOrch §4.1.1):
//!
//! | kind | scope | what it does |
//! |---|---|---|
//! | [`TaskKind::HotCompute`] | hot chunk | one CPU job: samples one hop for a chunk of the super-batch's hot queue, reads its neighbors' input features, and runs the bottom layer with the newest published weights → rows stamped with that version |
//! | [`TaskKind::HotInstall`] | hot chunk | uploads the chunk's rows once into the super-batch's device slab (a copy, ordered before later batches) |
//! | [`TaskKind::SampleTop`] | batch | samples the layers above the bottom, a super-batch ahead; its last hop's sources are the bottom destinations |
//! | [`TaskKind::HotLoad`] | batch | the staleness gate, per chunk; uploads the batch's used hot positions and slab rows (8 bytes each) and selects the rows from the slab |
//! | [`TaskKind::SampleBottom`] | batch | after the gate: samples the bottom hop of the destinations left cold (the usable hot ones are skipped) |
//! | [`TaskKind::ColdGather`] | batch | gathers the cold destinations' input features (device cache or host) |
//! | [`TaskKind::ColdCompute`] | batch | bottom-layer forward for the cold destinations |
//! | [`TaskKind::Forward`] | batch | the layers above the bottom, and the loss |
//! | [`TaskKind::Backward`] | batch | every layer's gradients (the bottom layer's included, NeutronOrch moves it to the accelerator) |
//! | [`TaskKind::OptimizerStep`] | batch | applies the gradients: the weight version goes from `b` to `b + 1` |
//! | [`TaskKind::PublishWeights`] | batch | copies the new bottom-layer weights to the CPU side: after a super-batch's last batch, or after every batch ([`crate::Publication`]) |
//!
//! A hot chunk is *one* task, as it is one job in the runtime (`runtime/src/
//! orchestrate/workers.rs`, step 4): one worker samples, gathers and computes the
//! chunk with one read of the published weights. Three tasks (sample, gather,
//! compute) would let the simulated workers interleave chunks — a worker freed by
//! one chunk's sampling taking another chunk's — which the runtime never does, so
//! chunk latency and CPU occupancy would not be the runtime's, and a promotion
//! would have to move a chain instead of a job.
//!
//! A task's device comes from a [`crate::Placement`] (the graph is built by
//! [`crate::GraphBuilder`]); its dependencies are finish-to-start edges. The
//! *hot* edge (a [`TaskKind::HotLoad`] needs the rows some [`TaskKind::HotInstall`]
//! put in the slab) is deliberately not a static edge: which chunks are ready,
//! and whether their version may be used, is the staleness rule's decision at
//! run time ([`crate::StalenessRule`], per chunk), and so is when an install runs
//! (at the first gate after its computation finished).

use std::fmt;

use crate::error::{Result, SchedulerError};

/// Where a task runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    /// The host's worker threads.
    Cpu,
    /// The accelerator (one in-order stream).
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

/// What a task does (see the table in the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaskKind {
    /// Sample the layers above the bottom.
    SampleTop,
    /// Sample the bottom hop of the destinations the gate left cold.
    SampleBottom,
    /// One hot chunk end to end on one worker: one-hop sampling, feature reads
    /// and the bottom-layer forward (historical embeddings).
    HotCompute,
    /// A hot chunk's rows into the device slab, once per computation.
    HotInstall,
    /// The staleness gate; the batch's hot rows selected from the slab.
    HotLoad,
    /// Cold destinations' input features.
    ColdGather,
    /// Cold destinations' bottom-layer forward.
    ColdCompute,
    /// Upper layers' forward and the loss.
    Forward,
    /// Gradients of every layer.
    Backward,
    /// Weight update (version `b` → `b + 1`).
    OptimizerStep,
    /// Bottom-layer weights to the CPU side.
    PublishWeights,
}

impl TaskKind {
    /// Every kind, in the order of one batch's program.
    pub const ALL: [TaskKind; 11] = [
        Self::HotCompute,
        Self::HotInstall,
        Self::SampleTop,
        Self::HotLoad,
        Self::SampleBottom,
        Self::ColdGather,
        Self::ColdCompute,
        Self::Forward,
        Self::Backward,
        Self::OptimizerStep,
        Self::PublishWeights,
    ];

    /// Snake-case name, as traces print it.
    pub fn name(self) -> &'static str {
        match self {
            Self::SampleTop => "sample_top",
            Self::SampleBottom => "sample_bottom",
            Self::HotCompute => "hot_compute",
            Self::HotInstall => "hot_install",
            Self::HotLoad => "hot_load",
            Self::ColdGather => "cold_gather",
            Self::ColdCompute => "cold_compute",
            Self::Forward => "forward",
            Self::Backward => "backward",
            Self::OptimizerStep => "optimizer_step",
            Self::PublishWeights => "publish_weights",
        }
    }

    /// Which classic step the kind belongs to: sampling, gathering, or training
    /// (compute and weight movement). Step-based placements map by this.
    pub fn step(self) -> Step {
        match self {
            Self::SampleTop | Self::SampleBottom => Step::Sample,
            Self::ColdGather => Step::Gather,
            _ => Step::Train,
        }
    }

    /// Whether the task works on a super-batch's hot queue (rather than a batch).
    pub fn is_hot_chunk(self) -> bool {
        matches!(self, Self::HotCompute | Self::HotInstall)
    }

    /// Position within a batch's (or chunk's) program, for priorities.
    pub(crate) fn rank(self) -> u64 {
        Self::ALL.iter().position(|&k| k == self).unwrap_or(0) as u64
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The classic steps of sample-based training (NeutronOrch §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Neighbor sampling.
    Sample,
    /// Feature gathering.
    Gather,
    /// Computation, gradients, weight updates.
    Train,
}

/// The GNN layers a task touches, bottom layer = 0, both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerSpan {
    /// The lowest layer.
    pub first: u32,
    /// The highest layer.
    pub last: u32,
}

impl LayerSpan {
    /// One layer.
    pub fn one(layer: u32) -> Self {
        Self {
            first: layer,
            last: layer,
        }
    }

    /// Whether the span contains the bottom layer.
    pub fn has_bottom(&self) -> bool {
        self.first == 0
    }
}

/// Estimated size of a task: what a cost model turns into seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    /// Vertices it handles (destinations computed, rows gathered, seeds sampled).
    pub vertices: u64,
    /// Neighbor entries it aggregates over (or samples).
    pub edges: u64,
    /// Neighbor entries it samples (charged at the device's sampling rate).
    pub sampled_edges: u64,
    /// Floating-point operations.
    pub flops: f64,
    /// Bytes it reads and writes in the memory of its own device.
    pub mem_bytes: u64,
    /// Size of its result, which crosses PCIe when a consumer runs on the other device.
    pub out_bytes: u64,
    /// Bytes of host-resident data it reads (features not in the device cache, hot
    /// embeddings): they cross PCIe when the task runs on the accelerator.
    pub host_read_bytes: u64,
    /// Bytes it writes to host memory (published weights): they cross PCIe when the
    /// task runs on the accelerator.
    pub host_write_bytes: u64,
}

/// One node of the task graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    /// Its index in the graph.
    pub id: usize,
    /// What it does.
    pub kind: TaskKind,
    /// Where it runs.
    pub device: Device,
    /// The global batch index for batch tasks (it trains at weight version `batch`);
    /// `None` for hot-queue chunks.
    pub batch: Option<u64>,
    /// The super-batch it belongs to (for hot chunks: the super-batch whose queue
    /// it computes).
    pub super_batch: u64,
    /// The chunk of the hot queue, for hot-chunk tasks.
    pub chunk: Option<u32>,
    /// The layers it touches.
    pub layers: LayerSpan,
    /// Tasks that must finish before it starts.
    pub deps: Vec<usize>,
    /// Its estimated size.
    pub est: Estimate,
    /// Program-order key: on each device, among ready tasks the smallest
    /// `(priority, id)` runs first; the accelerator runs strictly in this order.
    pub priority: u64,
}

/// Tasks with dependencies; ids are indices.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaskGraph {
    tasks: Vec<Task>,
    /// Per task, the tasks that depend on it, ascending.
    users: Vec<Vec<usize>>,
}

impl TaskGraph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a task (its `id` is overwritten with its index, which is returned).
    /// Dependencies must name existing tasks (so a graph built by `push` alone is
    /// acyclic; [`TaskGraph::topological_order`] checks graphs built otherwise).
    pub fn push(&mut self, mut task: Task) -> Result<usize> {
        let id = self.tasks.len();
        if let Some(&dep) = task.deps.iter().find(|&&d| d >= id) {
            return Err(SchedulerError::BadDependency { task: id, dep });
        }
        task.id = id;
        for &d in &task.deps {
            self.users[d].push(id);
        }
        self.tasks.push(task);
        self.users.push(Vec::new());
        Ok(id)
    }

    /// A graph from tasks given in any order; ids must be `0..n` in position and
    /// dependencies must name tasks of the graph (cycles are found by
    /// [`TaskGraph::topological_order`]).
    pub fn from_tasks(tasks: Vec<Task>) -> Result<Self> {
        let n = tasks.len();
        for (i, t) in tasks.iter().enumerate() {
            if t.id != i {
                return Err(SchedulerError::SizeMismatch {
                    what: "task id vs position",
                    expected: i,
                    found: t.id,
                });
            }
            if let Some(&dep) = t.deps.iter().find(|&&d| d >= n || d == i) {
                return Err(SchedulerError::BadDependency { task: i, dep });
            }
        }
        let mut users = vec![Vec::new(); n];
        for t in &tasks {
            for &d in &t.deps {
                users[d].push(t.id);
            }
        }
        Ok(Self { tasks, users })
    }

    /// The tasks, by id.
    pub fn tasks(&self) -> &[Task] {
        &self.tasks
    }

    /// One task, to change its estimate at run time (a gate leaving late hot
    /// vertices cold).
    pub(crate) fn get_mut(&mut self, id: usize) -> Option<&mut Task> {
        self.tasks.get_mut(id)
    }

    /// One task (`None` past the end).
    pub fn get(&self, id: usize) -> Option<&Task> {
        self.tasks.get(id)
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether there are no tasks.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// An order in which every task comes after its dependencies (Kahn's algorithm,
    /// smallest `(priority, id)` first among the ready ones), or the cycle error.
    pub fn topological_order(&self) -> Result<Vec<usize>> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let n = self.tasks.len();
        let mut missing = vec![0usize; n];
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
        for t in &self.tasks {
            missing[t.id] = t.deps.len();
            for &d in &t.deps {
                users[d].push(t.id);
            }
        }
        let mut ready: BinaryHeap<Reverse<(u64, usize)>> = self
            .tasks
            .iter()
            .filter(|t| t.deps.is_empty())
            .map(|t| Reverse((t.priority, t.id)))
            .collect();
        let mut order = Vec::with_capacity(n);
        while let Some(Reverse((_, id))) = ready.pop() {
            order.push(id);
            for &u in &users[id] {
                missing[u] -= 1;
                if missing[u] == 0 {
                    ready.push(Reverse((self.tasks[u].priority, u)));
                }
            }
        }
        if order.len() < n {
            let task = (0..n).find(|&i| missing[i] > 0).unwrap_or(0);
            return Err(SchedulerError::Cycle { task });
        }
        Ok(order)
    }

    /// Bytes task `id` moves over PCIe under the current placement: its host reads
    /// and writes when it runs on the accelerator, plus the results of its
    /// dependencies that ran on the other device — each result crosses once, with
    /// its first user (lowest id) on this device.
    ///
    /// So a hot chunk's rows cross once, at its [`TaskKind::HotInstall`] (the
    /// result of its [`TaskKind::HotCompute`] on the CPU), and a
    /// [`TaskKind::HotLoad`] moves only its positions and slab rows. A
    /// [`TaskKind::HotCompute`]'s own edges carry nothing: they order it after
    /// the sampling that fixes its queue and the publication it reads, but what it
    /// reads (the queue's ids, features, published weights) is host data.
    pub fn pcie_bytes(&self, id: usize) -> u64 {
        let Some(t) = self.tasks.get(id) else {
            return 0;
        };
        let own = match t.device {
            Device::Accelerator => t.est.host_read_bytes + t.est.host_write_bytes,
            Device::Cpu => 0,
        };
        if t.kind == TaskKind::HotCompute {
            return own;
        }
        let first_here = |d: usize| {
            self.users[d]
                .iter()
                .find(|&&u| self.tasks[u].device == t.device)
                .is_some_and(|&u| u == id)
        };
        own + t
            .deps
            .iter()
            .filter_map(|&d| self.tasks.get(d))
            .filter(|d| d.device != t.device && first_here(d.id))
            .map(|d| d.est.out_bytes)
            .sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(kind: TaskKind, deps: Vec<usize>) -> Task {
        Task {
            id: 0,
            kind,
            device: Device::Accelerator,
            batch: Some(0),
            super_batch: 0,
            chunk: None,
            layers: LayerSpan::one(0),
            deps,
            est: Estimate::default(),
            priority: 0,
        }
    }

    #[test]
    fn push_rejects_forward_edges_and_orders_topologically() {
        let mut g = TaskGraph::new();
        let a = g.push(task(TaskKind::SampleTop, vec![])).unwrap();
        let b = g.push(task(TaskKind::ColdGather, vec![a])).unwrap();
        assert!(matches!(
            g.push(task(TaskKind::Forward, vec![5])),
            Err(SchedulerError::BadDependency { task: 2, dep: 5 })
        ));
        g.push(task(TaskKind::Forward, vec![a, b])).unwrap();
        assert_eq!(g.topological_order().unwrap(), vec![0, 1, 2]);
    }

    #[test]
    fn cycles_are_found() {
        let mut t0 = task(TaskKind::Forward, vec![1]);
        t0.id = 0;
        let mut t1 = task(TaskKind::Backward, vec![0]);
        t1.id = 1;
        let g = TaskGraph::from_tasks(vec![t0, t1]).unwrap();
        assert!(matches!(
            g.topological_order(),
            Err(SchedulerError::Cycle { .. })
        ));
        let mut self_loop = task(TaskKind::Forward, vec![0]);
        self_loop.id = 0;
        assert!(TaskGraph::from_tasks(vec![self_loop]).is_err());
    }

    #[test]
    fn pcie_bytes_count_cross_device_edges_and_host_traffic() {
        let mut g = TaskGraph::new();
        let mut s = task(TaskKind::ColdGather, vec![]);
        s.device = Device::Cpu;
        s.est.out_bytes = 100;
        s.est.host_read_bytes = 7; // local to the CPU: not PCIe
        let s = g.push(s).unwrap();
        let mut c = task(TaskKind::ColdCompute, vec![s]);
        c.est.host_read_bytes = 5;
        let c = g.push(c).unwrap();
        assert_eq!(g.pcie_bytes(s), 0);
        assert_eq!(g.pcie_bytes(c), 105);
        assert_eq!(g.pcie_bytes(99), 0);
        // A result crosses once: a second user on the same device reads the copy.
        let f = g.push(task(TaskKind::Forward, vec![s, c])).unwrap();
        assert_eq!(g.pcie_bytes(f), 0);
        // A hot chunk: the computation's edges carry nothing (it reads host data);
        // its rows cross once, into the install.
        let mut hc = task(TaskKind::HotCompute, vec![c]);
        hc.device = Device::Cpu;
        hc.est.out_bytes = 512;
        let hc = g.push(hc).unwrap();
        let hi = g.push(task(TaskKind::HotInstall, vec![hc])).unwrap();
        assert_eq!(g.pcie_bytes(hc), 0);
        assert_eq!(g.pcie_bytes(hi), 512);
    }

    #[test]
    fn kinds_map_to_steps() {
        assert_eq!(TaskKind::SampleTop.step(), Step::Sample);
        assert_eq!(TaskKind::SampleBottom.step(), Step::Sample);
        assert_eq!(TaskKind::ColdGather.step(), Step::Gather);
        assert_eq!(TaskKind::HotCompute.step(), Step::Train);
        assert!(TaskKind::HotCompute.is_hot_chunk() && TaskKind::HotInstall.is_hot_chunk());
        assert!(!TaskKind::HotLoad.is_hot_chunk());
        assert_eq!(TaskKind::HotInstall.step(), Step::Train);
        let ranks: Vec<u64> = TaskKind::ALL.iter().map(|k| k.rank()).collect();
        assert_eq!(ranks, (0..11).collect::<Vec<_>>());
    }
}
