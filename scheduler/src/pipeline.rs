//! Super-batch planning: which batches form a super-batch, which hot vertices its
//! queue holds, and when the CPU may compute that queue. These are the rules the
//! protocol plans with ([`crate::protocol`], steps 2, 3, 7 and 9 there), which the
//! runtime and the simulator both drive.
//!
//! # The pipeline, step by step
//! With `N` batches per super-batch and pipeline depth `D` (NeutronOrch uses
//! `D = 1`):
//!
//! 1. **Cut.** Batch `b` (a global index; it trains at weight version `b`) belongs
//!    to super-batch `b / N`.
//! 2. **Split.** Super-batch `j` is planned with the [`HotSplit`] in effect for it:
//!    hot ids `0..cpu` are computed by the CPU, hot ids `cpu..hot` are in the
//!    device feature cache and treated as cold, the rest are cold.
//! 3. **Sample early.** The accelerator samples the layers above the bottom of
//!    the batches of super-batch `j` as soon as super-batch `j - D` starts (before
//!    training it), so the bottom-layer destinations of `j` are known one pipeline
//!    stage ahead. The bottom hop itself is sampled when the batch trains, after
//!    its staleness gate has decided which destinations stay cold.
//! 4. **Queue.** The queue of `j` is the set of CPU-hot vertices that its batches'
//!    bottom layer touches, deduplicated and sorted by id, which after relabeling is
//!    hotness order ([`SuperBatchPlan::new`]), cut into chunks of at most
//!    `hot_chunk` vertices, and into at least `min_chunks` (the CPU workers) when
//!    it is long enough ([`PipelineConfig::chunk_ranges`]).
//! 5. **Compute ahead.** The CPU may start queue `j` once super-batch `j - D - 1`
//!    has finished (its last batch's weights are published), i.e. while the
//!    accelerator trains super-batches `j - D ..= j - 1`; it works through the queue
//!    in chunks, hottest first, each chunk with the newest weights published when
//!    the chunk starts. Queues `0..=D` may start at once. Weights are published at
//!    the start and after every super-batch, or after every batch when the
//!    staleness bound is below the on-time gap of step 7 ([`Publication`]).
//! 6. **Drop late work.** A chunk of queue `j` not started by the time every batch
//!    of `j` has passed its hot-embedding gate is dropped: nobody would read it.
//! 7. **Bound.** If the CPU keeps up, an embedding of queue `j` has version at least
//!    `(j - D) · N` and is used at most at version `(j + 1) · N - 1`, so its gap is
//!    at most [`PipelineConfig::on_time_gap`] `= (D + 1) · N - 1` (the paper's
//!    "two super-batches" for `D = 1`). A staleness bound below that makes the
//!    staleness rule step in even when the CPU is on time.
//! 8. **Moves.** A split change decided after super-batch `k` finishes (the
//!    monitor's) takes effect from super-batch `k + 1 + D`, the first whose
//!    sampling and queue have not started ([`PipelineConfig::effective_from`]).

use std::ops::Range;

use crate::error::{invalid, Result};

/// Deepest pipeline accepted: the accelerator keeps `D + 1` super-batches of
/// sampled blocks alive, so depth is memory.
pub const MAX_PIPELINE_DEPTH: usize = 16;

/// Where a hot vertex's bottom-layer embedding comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VertexClass {
    /// Computed by the CPU (historical embedding).
    CpuHot,
    /// Hot, but its features live in the device cache and the accelerator computes it.
    CachedHot,
    /// Not hot: gathered and computed by the accelerator.
    Cold,
}

/// The hot set `0..hot` (relabeled ids) split into the CPU part `0..cpu` and the
/// device-cache part `cpu..hot`. The monitor moves the boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HotSplit {
    hot: u32,
    cpu: u32,
}

impl HotSplit {
    /// A split with `cpu <= hot`.
    pub fn new(hot: u32, cpu: u32) -> Result<Self> {
        if cpu > hot {
            return Err(invalid(
                "cpu",
                format!("at most the hot count ({hot})"),
                cpu,
            ));
        }
        Ok(Self { hot, cpu })
    }

    /// Every hot vertex computed by the CPU (the start of training).
    pub fn all_cpu(hot: u32) -> Self {
        Self { hot, cpu: hot }
    }

    /// The number of hot vertices.
    pub fn hot(&self) -> u32 {
        self.hot
    }

    /// The number computed by the CPU (ids `0..cpu`).
    pub fn cpu(&self) -> u32 {
        self.cpu
    }

    /// The number in the device feature cache (ids `cpu..hot`).
    pub fn cached(&self) -> u32 {
        self.hot - self.cpu
    }

    /// The class of a relabeled vertex id.
    #[inline]
    pub fn class(&self, id: u32) -> VertexClass {
        if id < self.cpu {
            VertexClass::CpuHot
        } else if id < self.hot {
            VertexClass::CachedHot
        } else {
            VertexClass::Cold
        }
    }
}

/// The shape of the pipeline: super-batch size, depth and CPU chunk size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipelineConfig {
    batches_per_super_batch: usize,
    depth: usize,
    hot_chunk: usize,
    min_chunks: usize,
}

impl PipelineConfig {
    /// `N` batches per super-batch (≥ 1), depth `D` (≤ [`MAX_PIPELINE_DEPTH`]; 0
    /// means no overlap: the CPU starts queue `j` only when super-batch `j` starts),
    /// and at most `hot_chunk` vertices per CPU task (≥ 1; each chunk gets one
    /// version). Queues are cut into at least one chunk; see
    /// [`PipelineConfig::with_min_chunks`].
    pub fn new(batches_per_super_batch: usize, depth: usize, hot_chunk: usize) -> Result<Self> {
        if batches_per_super_batch == 0 {
            return Err(invalid(
                "super_batch",
                "at least 1 batch per super-batch",
                0,
            ));
        }
        if depth > MAX_PIPELINE_DEPTH {
            return Err(invalid(
                "pipeline_depth",
                format!("at most {MAX_PIPELINE_DEPTH} super-batches"),
                depth,
            ));
        }
        if hot_chunk == 0 {
            return Err(invalid("hot_chunk", "at least 1 vertex per CPU task", 0));
        }
        Ok(Self {
            batches_per_super_batch,
            depth,
            hot_chunk,
            min_chunks: 1,
        })
    }

    /// Cut every queue into at least `min_chunks` chunks (when it has that many
    /// vertices), so a short queue still keeps that many CPU workers busy: set it
    /// to the number of CPU workers. Without it, a queue of 65 vertices with
    /// `hot_chunk = 64` is one long task and one short one, and its latency is a
    /// whole chunk's even with idle workers.
    pub fn with_min_chunks(mut self, min_chunks: usize) -> Result<Self> {
        if min_chunks == 0 {
            return Err(invalid("min_chunks", "at least 1 chunk per queue", 0));
        }
        self.min_chunks = min_chunks;
        Ok(self)
    }

    /// `N`.
    pub fn batches_per_super_batch(&self) -> usize {
        self.batches_per_super_batch
    }

    /// `D`.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Largest number of vertices per CPU hot task.
    pub fn hot_chunk(&self) -> usize {
        self.hot_chunk
    }

    /// Smallest number of chunks per queue (when the queue is that long).
    pub fn min_chunks(&self) -> usize {
        self.min_chunks
    }

    /// How a queue of `len` vertices is cut: `max(ceil(len / hot_chunk),
    /// min(min_chunks, len))` consecutive ranges of near-equal size, hottest first.
    pub fn chunk_ranges(&self, len: usize) -> Vec<Range<usize>> {
        if len == 0 {
            return Vec::new();
        }
        let n = len.div_ceil(self.hot_chunk).max(self.min_chunks.min(len));
        let (base, extra) = (len / n, len % n);
        let mut start = 0;
        (0..n)
            .map(|i| {
                let end = start + base + usize::from(i < extra);
                let r = start..end;
                start = end;
                r
            })
            .collect()
    }

    /// The super-batch of global batch `batch` (step 1).
    pub fn super_batch_of(&self, batch: u64) -> u64 {
        batch / self.batches_per_super_batch as u64
    }

    /// The global batches of super-batch `j` when there are `total` batches.
    pub fn batches_of(&self, j: u64, total: u64) -> Range<u64> {
        let n = self.batches_per_super_batch as u64;
        let start = j.saturating_mul(n).min(total);
        start..start.saturating_add(n).min(total)
    }

    /// The number of super-batches covering `total` batches.
    pub fn num_super_batches(&self, total: u64) -> u64 {
        total.div_ceil(self.batches_per_super_batch as u64)
    }

    /// The super-batch that must *finish* before queue `j` may start (step 5), or
    /// `None` when it may start at once.
    pub fn queue_gate(&self, j: u64) -> Option<u64> {
        j.checked_sub(self.depth as u64 + 1)
    }

    /// The first super-batch that a split decided after super-batch `k` finished
    /// applies to (step 8).
    pub fn effective_from(&self, k: u64) -> u64 {
        k + 1 + self.depth as u64
    }

    /// The super-batch during which the batches of `j` are sampled and its queue
    /// work begins: `max(j - D, 0)` (steps 3 and 5).
    pub fn lead_super_batch(&self, j: u64) -> u64 {
        j.saturating_sub(self.depth as u64)
    }

    /// The largest gap an on-time CPU can produce: `(D + 1) · N - 1` (step 7).
    pub fn on_time_gap(&self) -> u64 {
        ((self.depth + 1) * self.batches_per_super_batch) as u64 - 1
    }
}

/// When the accelerator publishes layer 0's weights to the CPU workers (step 5;
/// step 2 of [`crate::protocol`]). Weights are
/// always published at the start, and before an urgent recomputation that needs
/// newer ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Publication {
    /// After the last batch of every super-batch: one download per super-batch.
    #[default]
    EverySuperBatch,
    /// After every batch: chunks started later read fresher weights.
    EveryBatch,
}

impl Publication {
    /// The runtime's rule: after every batch when `staleness_bound` is below
    /// [`PipelineConfig::on_time_gap`] (rows of an on-time CPU would otherwise be
    /// late), after every super-batch otherwise.
    pub fn for_bound(pipeline: &PipelineConfig, staleness_bound: u64) -> Self {
        if staleness_bound < pipeline.on_time_gap() {
            Self::EveryBatch
        } else {
            Self::EverySuperBatch
        }
    }

    /// Whether batch `k` of a super-batch of `len` batches publishes after its step.
    pub fn publishes_after(self, k: usize, len: usize) -> bool {
        match self {
            Self::EveryBatch => true,
            Self::EverySuperBatch => k + 1 == len,
        }
    }
}

/// One super-batch's plan: its batches, its split, and its hot queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuperBatchPlan {
    /// The super-batch index.
    pub index: u64,
    /// Its global batches.
    pub batches: Range<u64>,
    /// The split in effect for it.
    pub split: HotSplit,
    /// CPU-hot bottom-layer vertices of its batches, deduplicated, hottest first.
    pub queue: Vec<u32>,
    /// Per batch: its CPU-hot bottom-layer vertices, sorted.
    pub batch_hot: Vec<Vec<u32>>,
    /// Per batch: how many queue vertices it is the first batch of the super-batch
    /// to use.
    pub first_use: Vec<u32>,
}

impl SuperBatchPlan {
    /// Plans super-batch `index` whose batches start at global batch `first_batch`;
    /// `bottom[k]` lists the bottom-layer destinations (relabeled ids) of its
    /// `k`-th batch, in any order, repeats allowed (steps 2 and 4).
    pub fn new<B: AsRef<[u32]>>(
        index: u64,
        first_batch: u64,
        split: HotSplit,
        bottom: &[B],
    ) -> Self {
        let mut batch_hot: Vec<Vec<u32>> = bottom
            .iter()
            .map(|b| {
                let mut h: Vec<u32> = b
                    .as_ref()
                    .iter()
                    .copied()
                    .filter(|&v| split.class(v) == VertexClass::CpuHot)
                    .collect();
                h.sort_unstable();
                h.dedup();
                h
            })
            .collect();
        let mut seen = vec![false; split.cpu() as usize];
        let mut first_use = Vec::with_capacity(batch_hot.len());
        for h in &mut batch_hot {
            let mut fresh = 0u32;
            for &v in h.iter() {
                let s = &mut seen[v as usize];
                fresh += u32::from(!*s);
                *s = true;
            }
            first_use.push(fresh);
        }
        let queue: Vec<u32> = (0..split.cpu()).filter(|&v| seen[v as usize]).collect();
        Self {
            index,
            batches: first_batch..first_batch + bottom.len() as u64,
            split,
            queue,
            batch_hot,
            first_use,
        }
    }

    /// The queue cut into CPU tasks as `pipeline` says
    /// ([`PipelineConfig::chunk_ranges`]): `(positions in the queue, vertices)`.
    pub fn chunks<'s>(
        &'s self,
        pipeline: &PipelineConfig,
    ) -> impl Iterator<Item = (Range<usize>, &'s [u32])> + 's {
        pipeline
            .chunk_ranges(self.queue.len())
            .into_iter()
            .map(move |r| (r.clone(), &self.queue[r]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_classifies_by_prefix() {
        let s = HotSplit::new(10, 6).unwrap();
        assert_eq!(s.class(0), VertexClass::CpuHot);
        assert_eq!(s.class(5), VertexClass::CpuHot);
        assert_eq!(s.class(6), VertexClass::CachedHot);
        assert_eq!(s.class(9), VertexClass::CachedHot);
        assert_eq!(s.class(10), VertexClass::Cold);
        assert_eq!(s.cached(), 4);
        assert!(HotSplit::new(3, 4).is_err());
        let none = HotSplit::all_cpu(0);
        assert_eq!(none.class(0), VertexClass::Cold);
    }

    #[test]
    fn queue_is_the_deduplicated_cpu_hot_bottom_in_hotness_order() {
        let split = HotSplit::new(8, 5).unwrap();
        let bottom = vec![vec![7u32, 3, 3, 20, 1], vec![1, 4, 6, 30], vec![0, 3]];
        let p = SuperBatchPlan::new(2, 6, split, &bottom);
        assert_eq!(p.queue, vec![0, 1, 3, 4]);
        assert_eq!(p.batch_hot, vec![vec![1, 3], vec![1, 4], vec![0, 3]]);
        assert_eq!(p.first_use, vec![2, 1, 1]);
        assert_eq!(p.batches, 6..9);
        let pipe = PipelineConfig::new(3, 1, 3).unwrap();
        let chunks: Vec<&[u32]> = p.chunks(&pipe).map(|c| c.1).collect();
        assert_eq!(chunks, vec![&[0, 1][..], &[3, 4][..]]);
        let pipe = pipe.with_min_chunks(8).unwrap();
        assert_eq!(p.chunks(&pipe).count(), 4);
        // Hot ratio 0: no queue at all.
        let empty = SuperBatchPlan::new(0, 0, HotSplit::all_cpu(0), &bottom);
        assert!(empty.queue.is_empty() && empty.first_use.iter().all(|&f| f == 0));
    }

    #[test]
    fn pipeline_arithmetic() {
        let p = PipelineConfig::new(4, 1, 64).unwrap();
        assert_eq!(p.super_batch_of(7), 1);
        assert_eq!(p.batches_of(2, 10), 8..10);
        assert_eq!(p.batches_of(5, 10), 10..10);
        assert_eq!(p.num_super_batches(10), 3);
        assert_eq!(p.queue_gate(0), None);
        assert_eq!(p.queue_gate(1), None);
        assert_eq!(p.queue_gate(2), Some(0));
        assert_eq!(p.effective_from(3), 5);
        assert_eq!(p.lead_super_batch(3), 2);
        assert_eq!(p.lead_super_batch(0), 0);
        assert_eq!(p.on_time_gap(), 7);
        let p0 = PipelineConfig::new(4, 0, 1).unwrap();
        assert_eq!(p0.queue_gate(1), Some(0));
        assert_eq!(p0.on_time_gap(), 3);
        for (n, d, c, key) in [
            (0, 1, 1, "super_batch"),
            (1, 99, 1, "pipeline_depth"),
            (1, 1, 0, "hot_chunk"),
        ] {
            let e = PipelineConfig::new(n, d, c).unwrap_err();
            assert!(e.to_string().contains(key), "{e}");
        }
        assert!(p.with_min_chunks(0).is_err());
    }

    #[test]
    fn publication_follows_the_bound_against_the_on_time_gap() {
        let p = PipelineConfig::new(4, 1, 64).unwrap();
        assert_eq!(Publication::for_bound(&p, 7), Publication::EverySuperBatch);
        assert_eq!(Publication::for_bound(&p, 99), Publication::EverySuperBatch);
        assert_eq!(Publication::for_bound(&p, 6), Publication::EveryBatch);
        assert_eq!(Publication::for_bound(&p, 0), Publication::EveryBatch);
        let every_sb = Publication::EverySuperBatch;
        assert_eq!(
            (0..4)
                .map(|k| every_sb.publishes_after(k, 4))
                .collect::<Vec<_>>(),
            vec![false, false, false, true]
        );
        assert!(every_sb.publishes_after(1, 2));
        assert!((0..4).all(|k| Publication::EveryBatch.publishes_after(k, 4)));
    }

    #[test]
    fn chunk_ranges_cover_the_queue_evenly() {
        let p = PipelineConfig::new(1, 1, 64).unwrap();
        assert!(p.chunk_ranges(0).is_empty());
        assert_eq!(p.chunk_ranges(65), vec![0..33, 33..65]);
        let p4 = p.with_min_chunks(4).unwrap();
        assert_eq!(p4.chunk_ranges(10), vec![0..3, 3..6, 6..8, 8..10]);
        assert_eq!(p4.chunk_ranges(2), vec![0..1, 1..2]);
        for len in [1, 7, 64, 200, 1000] {
            let r = p4.chunk_ranges(len);
            assert_eq!(r.first().unwrap().start, 0);
            assert_eq!(r.last().unwrap().end, len);
            assert!(r.windows(2).all(|w| w[0].end == w[1].start));
            assert!(r.iter().all(|c| !c.is_empty() && c.len() <= 64));
        }
    }
}
