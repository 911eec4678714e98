//! One launched super-batch, as the protocol tracks it: its hot queue cut into
//! chunks, each chunk's state (pending, or ready at a version), claim and urgent
//! flag, and per batch which (position, queue index) pairs it reads and which
//! chunks (protocol steps 3–7).

use std::ops::Range;

use crate::error::{Result, SchedulerError};
use crate::pipeline::{HotSplit, PipelineConfig, SuperBatchPlan};
use crate::staleness::{Decision, GapHistogram, StalenessRule};

use super::event::{ChunkKey, ClaimId, Job, LaunchedBatch, TrainBatch};

/// Where a chunk stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChunkState {
    /// Queued or being computed.
    Pending,
    /// Its rows are in the slab, computed with weights of this version.
    Ready(u64),
}

impl ChunkState {
    /// The version of its rows (`None`: none yet).
    pub(crate) fn version(self) -> Option<u64> {
        match self {
            Self::Pending => None,
            Self::Ready(e) => Some(e),
        }
    }
}

/// One chunk of a launched super-batch's queue.
#[derive(Clone, Debug)]
pub(crate) struct Chunk {
    /// Queue positions (= slab rows).
    pub(crate) rows: Range<u32>,
    /// Its vertices (relabeled ids).
    pub(crate) vertices: Vec<u32>,
    pub(crate) state: ChunkState,
    pub(crate) claim: ClaimId,
    /// An urgent job for it is queued or running (cleared by an install).
    pub(crate) urgent: bool,
    /// Some batch read it already.
    pub(crate) read: bool,
}

/// A super-batch whose batches are sampled and whose queue is out.
#[derive(Clone, Debug)]
pub(crate) struct HotQueue {
    /// Global super-batch.
    pub(crate) global: u64,
    /// Index in the epoch.
    pub(crate) local: u64,
    pub(crate) slab: usize,
    /// Epoch batch indices.
    pub(crate) batches: Range<usize>,
    /// Per batch: (position among the bottom destinations, queue index) of its
    /// CPU-hot destinations.
    entries: Vec<Vec<(u32, u32)>>,
    /// Per batch: the chunks it reads, ascending.
    reads: Vec<Vec<u32>>,
    /// The chunk of each queue index.
    chunk_of: Vec<u32>,
    pub(crate) chunks: Vec<Chunk>,
}

/// Where a launch comes from: the super-batch, its slab and batches, the split.
pub(crate) struct LaunchSpec {
    pub(crate) global: u64,
    pub(crate) local: u64,
    pub(crate) slab: usize,
    pub(crate) batches: Range<usize>,
    pub(crate) split: HotSplit,
}

impl HotQueue {
    /// Plans the queue of a launched super-batch (step 3): the CPU-hot bottom
    /// destinations of its batches (seeds excluded), deduplicated, hottest first,
    /// cut into chunks as `pipeline` says; `claim` hands out a fresh claim per
    /// chunk.
    pub(crate) fn plan(
        spec: LaunchSpec,
        launched: &[LaunchedBatch],
        pipeline: &PipelineConfig,
        mut claim: impl FnMut() -> ClaimId,
    ) -> Result<Self> {
        if launched.len() != spec.batches.len() {
            return Err(SchedulerError::SizeMismatch {
                what: "launched batches",
                expected: spec.batches.len(),
                found: launched.len(),
            });
        }
        let cpu = spec.split.cpu();
        let own: Vec<Vec<u32>> = launched
            .iter()
            .map(|b| b.bottom.iter().skip(b.seeds).copied().collect())
            .collect();
        let plan = SuperBatchPlan::new(spec.local, spec.batches.start as u64, spec.split, &own);
        let queue = plan.queue;
        let mut chunk_of = vec![0u32; queue.len()];
        let chunks: Vec<Chunk> = pipeline
            .chunk_ranges(queue.len())
            .into_iter()
            .enumerate()
            .map(|(c, r)| {
                for q in r.clone() {
                    chunk_of[q] = c as u32;
                }
                Chunk {
                    rows: r.start as u32..r.end as u32,
                    vertices: queue[r].to_vec(),
                    state: ChunkState::Pending,
                    claim: claim(),
                    urgent: false,
                    read: false,
                }
            })
            .collect();
        let mut entries = Vec::with_capacity(launched.len());
        let mut reads = Vec::with_capacity(launched.len());
        for b in launched {
            let mut e = Vec::new();
            let mut r: Vec<u32> = Vec::new();
            for (p, &v) in b.bottom.iter().enumerate() {
                // A batch's seeds never take a hot row: their bottom rows are
                // computed on the accelerator, so layer 0 always trains on them.
                if p < b.seeds || v >= cpu {
                    continue;
                }
                let q = queue
                    .binary_search(&v)
                    .map_err(|_| SchedulerError::ProtocolInvariant {
                        what: format!("CPU-hot vertex {v} missing from its queue"),
                    })? as u32;
                e.push((p as u32, q));
                r.push(chunk_of[q as usize]);
            }
            r.sort_unstable();
            r.dedup();
            entries.push(e);
            reads.push(r);
        }
        Ok(Self {
            global: spec.global,
            local: spec.local,
            slab: spec.slab,
            batches: spec.batches,
            entries,
            reads,
            chunk_of,
            chunks,
        })
    }

    /// The queue's length (rows of its slab).
    pub(crate) fn len(&self) -> usize {
        self.chunk_of.len()
    }

    /// The regular job of chunk `c` (step 3).
    pub(crate) fn regular_job(&self, c: usize) -> Job {
        let chunk = &self.chunks[c];
        Job {
            key: self.key(c),
            local: self.local,
            rows: chunk.rows.clone(),
            vertices: chunk.vertices.clone(),
            claim: chunk.claim,
            urgent: None,
        }
    }

    /// The key of chunk `c`.
    pub(crate) fn key(&self, c: usize) -> ChunkKey {
        ChunkKey {
            super_batch: self.global,
            chunk: c as u32,
        }
    }

    /// The chunks batch `i` (of this super-batch) reads whose rows may not be
    /// used at version `b` (step 5): none yet, or older than `rule` allows.
    pub(crate) fn late(&self, i: usize, b: u64, rule: &StalenessRule) -> Result<Vec<u32>> {
        let mut late = Vec::new();
        for &c in &self.reads[i] {
            if !rule
                .decide(self.chunks[c as usize].state.version(), b)?
                .is_use()
            {
                late.push(c);
            }
        }
        Ok(late)
    }

    /// Batch `i`'s hot positions in the chunks `late` (ascending).
    pub(crate) fn late_positions(&self, i: usize, late: &[u32]) -> u64 {
        self.entries[i]
            .iter()
            .filter(|(_, q)| late.binary_search(&self.chunk_of[*q as usize]).is_ok())
            .count() as u64
    }

    /// Step 7: batch `i`'s training order at version `b`, every position of the
    /// chunks `cold` (ascending) left cold; the gap of every row used is recorded
    /// in `gaps`. Fails if a row used is past the bound or from the future: the
    /// gate (step 5) lets no such row through, so that is a bug.
    pub(crate) fn train(
        &mut self,
        i: usize,
        b: u64,
        rule: &StalenessRule,
        cold: &[u32],
        gaps: &mut GapHistogram,
    ) -> Result<TrainBatch> {
        let skip = |c: u32| cold.binary_search(&c).is_ok();
        let entries = &self.entries[i];
        let mut positions = Vec::with_capacity(entries.len());
        let mut rows = Vec::with_capacity(entries.len());
        let mut cold_positions = Vec::new();
        let mut max_gap = None;
        for &(p, q) in entries {
            let c = self.chunk_of[q as usize];
            if skip(c) {
                cold_positions.push(p);
                continue;
            }
            let state = self.chunks[c as usize].state;
            let gap = match rule.decide(state.version(), b)? {
                Decision::Use { gap } => gap,
                _ => {
                    return Err(SchedulerError::ProtocolInvariant {
                        what: format!(
                            "chunk {c} of super-batch {} passed the gate of version {b} as \
                             {state:?} (bound {})",
                            self.global,
                            rule.bound()
                        ),
                    })
                }
            };
            gaps.record(gap);
            max_gap = max_gap.max(Some(gap));
            positions.push(p);
            rows.push(q);
        }
        let mut first_reads = Vec::new();
        for &c in &self.reads[i] {
            let chunk = &mut self.chunks[c as usize];
            if !skip(c) && !chunk.read {
                chunk.read = true;
                first_reads.push(c);
            }
        }
        Ok(TrainBatch {
            batch: self.batches.start + i,
            version: b,
            super_batch: self.global,
            local: self.local,
            slab: self.slab,
            positions,
            rows,
            cold: cold_positions,
            max_gap,
            first_reads,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::staleness::OnLate;

    fn queue() -> HotQueue {
        // Split: 0..6 CPU-hot, 6..8 cached. Two batches, 1 seed each.
        let launched = vec![
            LaunchedBatch {
                seeds: 1,
                bottom: vec![2, 5, 0, 7, 20],
            },
            LaunchedBatch {
                seeds: 1,
                bottom: vec![0, 3, 5, 9],
            },
        ];
        let pipe = PipelineConfig::new(2, 1, 2).unwrap();
        let mut next = 0;
        HotQueue::plan(
            LaunchSpec {
                global: 7,
                local: 1,
                slab: 1,
                batches: 2..4,
                split: HotSplit::new(8, 6).unwrap(),
            },
            &launched,
            &pipe,
            || {
                next += 1;
                ClaimId(next)
            },
        )
        .unwrap()
    }

    #[test]
    fn plan_skips_seeds_and_cached_vertices_and_cuts_chunks() {
        let q = queue();
        // Seeds 2 and 0 are left out (0 still comes from batch 0's position 2).
        assert_eq!(q.len(), 3);
        let chunks: Vec<(Range<u32>, Vec<u32>)> = q
            .chunks
            .iter()
            .map(|c| (c.rows.clone(), c.vertices.clone()))
            .collect();
        assert_eq!(chunks, vec![(0..2, vec![0, 3]), (2..3, vec![5])]);
        assert_eq!(q.entries, vec![vec![(1, 2), (2, 0)], vec![(1, 1), (2, 2)]]);
        assert_eq!(q.reads, vec![vec![0, 1], vec![0, 1]]);
        let job = q.regular_job(1);
        assert_eq!(
            job.key,
            ChunkKey {
                super_batch: 7,
                chunk: 1
            }
        );
        assert_eq!(
            (job.rows, job.vertices, job.claim),
            (2..3, vec![5], ClaimId(2))
        );
        let bad = HotQueue::plan(
            LaunchSpec {
                global: 0,
                local: 0,
                slab: 0,
                batches: 0..3,
                split: HotSplit::all_cpu(4),
            },
            &[LaunchedBatch::default()],
            &PipelineConfig::new(2, 1, 2).unwrap(),
            || ClaimId(0),
        );
        assert!(bad.is_err());
    }

    #[test]
    fn gate_and_training_order() {
        let mut q = queue();
        let rule = StalenessRule::new(2, OnLate::Compute);
        assert_eq!(q.late(0, 10, &rule).unwrap(), vec![0, 1]);
        q.chunks[0].state = ChunkState::Ready(8);
        q.chunks[1].state = ChunkState::Ready(7);
        assert_eq!(q.late(0, 10, &rule).unwrap(), vec![1]);
        assert_eq!(q.late_positions(0, &[1]), 1);
        let mut gaps = GapHistogram::new();
        let t = q.train(0, 10, &rule, &[1], &mut gaps).unwrap();
        assert_eq!((t.batch, t.version, t.slab), (2, 10, 1));
        assert_eq!((t.positions, t.rows, t.cold), (vec![2], vec![0], vec![1]));
        assert_eq!((t.max_gap, t.first_reads), (Some(2), vec![0]));
        assert_eq!(gaps.total(), 1);
        // A late chunk not left cold is a bug the training order refuses.
        assert!(matches!(
            q.train(1, 10, &rule, &[], &mut gaps),
            Err(SchedulerError::ProtocolInvariant { .. })
        ));
        // Rows from the future are refused too.
        q.chunks[1].state = ChunkState::Ready(11);
        assert!(q.train(1, 10, &rule, &[], &mut gaps).is_err());
    }
}
