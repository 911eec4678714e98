//! The task axis, beside the placement: what a batch is trained against and
//! how a model is evaluated. Placements and executors run any task through the
//! same batch interface ([`TaskBatch`]).
//!
//! - **Node classification** (`model.task = "node"`): a batch's items are
//!   training vertices; they are its seeds and their labels its target.
//! - **Link prediction** (`"link"`, [`link`]): a batch's items are training
//!   edges (positives); each gets `link.negatives` negatives that keep its
//!   source and draw a destination; the seeds are every endpoint, deduplicated
//!   in first-occurrence order; the target is every pair's local ids and label
//!   (1 positive, 0 negative); the batch's positive edges (and their reverses)
//!   are kept out of its sampled blocks (`link.exclude`).
//!
//! A task's batch is a pure function of its items and its seed, so every
//! executor, every rank and every look-ahead that materializes the same batch
//! trains the same thing.

pub(crate) mod link;
pub(crate) mod metrics;

use std::borrow::Cow;

pub use metrics::{LinkMetric, MetricValue};

/// What a batch is trained against, on the host (the engine uploads it).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum HostTarget {
    /// The seeds' labels (node classification: the engine reads them from the
    /// dataset).
    Labels,
    /// Vertex pairs to score (link prediction).
    Pairs(PairTargets),
}

/// Link prediction's target: pair `i` is (`src[i]`, `dst[i]`), local ids
/// among the batch's seeds, with label `labels[i]` (1.0 or 0.0).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PairTargets {
    /// Local id of each pair's source.
    pub src: Vec<u32>,
    /// Local id of each pair's destination.
    pub dst: Vec<u32>,
    /// 1.0 for a positive edge, 0.0 for a negative.
    pub labels: Vec<f32>,
}

impl PairTargets {
    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.src.len()
    }
}

/// One batch as an executor trains it ([`Task::batch`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TaskBatch<'a> {
    /// The vertices whose top-layer outputs the batch needs, in order.
    pub seeds: Cow<'a, [u32]>,
    /// What the outputs are trained against.
    pub target: HostTarget,
    /// Global (destination, source) pairs kept out of every sampled block of
    /// the batch, sorted and distinct (link prediction's exclusion).
    pub exclude: Vec<(u32, u32)>,
}

/// The task of a run (module doc).
#[derive(Clone, Debug)]
pub(crate) enum Task {
    /// Node classification.
    Node,
    /// Link prediction.
    Link(link::LinkTask),
}

impl Task {
    /// The batch of `items` (vertices or training-edge indices) drawn with
    /// `seed`.
    pub fn batch<'a>(&self, items: &'a [u32], seed: u64) -> TaskBatch<'a> {
        match self {
            Task::Node => TaskBatch {
                seeds: Cow::Borrowed(items),
                target: HostTarget::Labels,
                exclude: Vec::new(),
            },
            Task::Link(l) => l.batch(items, seed),
        }
    }

    /// Rows the loss of a batch of `items` items is taken over: its seeds
    /// (node) or its pairs (link).
    pub fn rows(&self, items: usize) -> usize {
        match self {
            Task::Node => items,
            Task::Link(l) => l.rows(items),
        }
    }

    /// Whether this is link prediction.
    pub fn is_link(&self) -> bool {
        matches!(self, Task::Link(_))
    }
}
