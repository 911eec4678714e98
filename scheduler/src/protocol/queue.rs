//! One launched super-batch, as the protocol tracks it: its hot queue cut into
//! chunks, each chunk's state (pending, or ready at a version), claim and urgent
//! flag, and per batch which (position, queue index) pairs it reads and which
//! chunks (protocol steps 3–7).

use std::ops::Range;

use crate::error::{invalid, Result, SchedulerError};
use crate::pipeline::{HotSplit, PipelineConfig};
use crate::staleness::{Decision, GapHistogram, StalenessRule};

use super::event::{ChunkKey, ClaimId, Job, TrainBatch};
use super::plan::LaunchPlan;
#[cfg(test)]
use super::plan::LaunchedBatch;
use super::stats::SuperBatchHot;

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
    /// Its rows are carried from the hot-row store (rows computed for an
    /// earlier super-batch, [`Action::Carry`](super::Action::Carry)): no job
    /// computes them unless the gate finds them stale.
    pub(crate) carried: bool,
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
    /// Per batch: (position among the bottom destinations, slab row) of its
    /// CPU-hot destinations.
    entries: Vec<Vec<(u32, u32)>>,
    /// Per batch: the chunks it reads, ascending.
    reads: Vec<Vec<u32>>,
    /// The chunk of each slab row.
    chunk_of: Vec<u32>,
    pub(crate) chunks: Vec<Chunk>,
    /// Its counts so far (reported at its end).
    pub(crate) counts: SuperBatchHot,
}

/// What a launch may carry from the hot-row store (step 3, reuse across
/// super-batches): the store's version per vertex and the bound.
pub(crate) struct CarrySpec<'a> {
    /// Version of the store's row per relabeled hot id ([`NO_ROW`]: none).
    pub(crate) store: &'a [u64],
    /// The version the super-batch's first batch trains at, at most.
    pub(crate) first_version: u64,
    /// `staleness_bound`.
    pub(crate) bound: u64,
}

/// A store slot without a row.
pub(crate) const NO_ROW: u64 = u64::MAX;

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
    /// chunk. ([`HotQueue::from_plan`] with a plan made inline.)
    #[cfg(test)]
    pub(crate) fn plan(
        spec: LaunchSpec,
        launched: &[LaunchedBatch],
        pipeline: &PipelineConfig,
        claim: impl FnMut() -> ClaimId,
    ) -> Result<Self> {
        let plan = LaunchPlan::new(launched, spec.split.cpu());
        Self::from_plan(spec, &plan, pipeline, claim)
    }

    /// Step 3 from a [`LaunchPlan`]: its union cut at the split's CPU part is
    /// the queue (a prefix, so union indices are queue indices), cut into
    /// chunks as `pipeline` says; per batch its positions in the queue and the
    /// chunks they read. Linear in the plan's entries, no search.
    #[cfg(test)]
    pub(crate) fn from_plan(
        spec: LaunchSpec,
        plan: &LaunchPlan,
        pipeline: &PipelineConfig,
        claim: impl FnMut() -> ClaimId,
    ) -> Result<Self> {
        Self::from_plan_carrying(spec, plan, pipeline, None, claim)
    }

    /// [`HotQueue::from_plan`], carrying from the store every queued vertex
    /// whose stored row is fresh enough for the last batch of this
    /// super-batch that reads it (`carry`; reuse across super-batches): the
    /// rows to compute come first in the slab, cut into chunks as `pipeline`
    /// says, then the carried rows, one chunk per stored version (ready at it).
    /// Without `carry`, or with nothing to carry, the queue is
    /// [`HotQueue::from_plan`]'s.
    pub(crate) fn from_plan_carrying(
        spec: LaunchSpec,
        plan: &LaunchPlan,
        pipeline: &PipelineConfig,
        carry: Option<CarrySpec<'_>>,
        mut claim: impl FnMut() -> ClaimId,
    ) -> Result<Self> {
        if plan.batches() != spec.batches.len() {
            return Err(SchedulerError::SizeMismatch {
                what: "launched batches",
                expected: spec.batches.len(),
                found: plan.batches(),
            });
        }
        let cpu = spec.split.cpu();
        if cpu > plan.limit() {
            return Err(invalid(
                "launch plan",
                format!("a plan for CPU splits up to {} (the split's CPU part)", cpu),
                format!("a plan made for splits up to {}", plan.limit()),
            ));
        }
        let len = plan.queue_len(cpu);
        let queue = &plan.union()[..len];
        // Reuse across super-batches: the stored version of each queue index
        // fresh enough for the last batch reading it (versions only grow, so
        // the upper bound `first_version + i` of batch `i`'s version is safe).
        let mut kept: Vec<Option<u64>> = Vec::new();
        if let Some(c) = &carry {
            let mut last_read = vec![0u64; len];
            for i in 0..plan.batches() {
                for &(_, q) in plan.entries_of(i) {
                    if let Some(l) = last_read.get_mut(q as usize) {
                        *l = i as u64;
                    }
                }
            }
            kept = queue
                .iter()
                .zip(&last_read)
                .map(|(&v, &i)| {
                    let e = c.store.get(v as usize).copied().unwrap_or(NO_ROW);
                    (e != NO_ROW && e.saturating_add(c.bound) >= c.first_version + i).then_some(e)
                })
                .collect();
        }
        // Slab row of each queue index: computed rows first (queue order),
        // then carried ones by version, newest first.
        let mut carried: Vec<(u64, u32)> = kept
            .iter()
            .enumerate()
            .filter_map(|(q, e)| e.map(|e| (e, q as u32)))
            .collect();
        carried.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let computed = len - carried.len();
        let mut row_of: Vec<u32> = Vec::new();
        let mut order: Vec<u32> = Vec::with_capacity(len);
        if !carried.is_empty() {
            row_of = vec![0u32; len];
            order.extend((0..len as u32).filter(|&q| kept[q as usize].is_none()));
            order.extend(carried.iter().map(|&(_, q)| q));
            for (r, &q) in order.iter().enumerate() {
                row_of[q as usize] = r as u32;
            }
        }
        let vertex_at = |r: usize| -> u32 {
            if order.is_empty() {
                queue[r]
            } else {
                queue[order[r] as usize]
            }
        };
        let mut chunk_of = vec![0u32; len];
        let mut chunks: Vec<Chunk> = pipeline
            .chunk_ranges(computed)
            .into_iter()
            .enumerate()
            .map(|(c, r)| {
                chunk_of[r.clone()].fill(c as u32);
                Chunk {
                    rows: r.start as u32..r.end as u32,
                    vertices: r.clone().map(vertex_at).collect(),
                    state: ChunkState::Pending,
                    claim: claim(),
                    urgent: false,
                    read: false,
                    carried: false,
                }
            })
            .collect();
        let mut r = computed;
        while r < len {
            let e = carried[r - computed].0;
            let end = r + carried[r - computed..].partition_point(|&(v, _)| v == e);
            let c = chunks.len() as u32;
            chunk_of[r..end].fill(c);
            chunks.push(Chunk {
                rows: r as u32..end as u32,
                vertices: (r..end).map(vertex_at).collect(),
                state: ChunkState::Ready(e),
                claim: claim(),
                urgent: false,
                read: false,
                carried: true,
            });
            r = end;
        }
        let row = |q: u32| -> u32 {
            if row_of.is_empty() {
                q
            } else {
                row_of[q as usize]
            }
        };
        let mut entries = Vec::with_capacity(plan.batches());
        let mut reads = Vec::with_capacity(plan.batches());
        let mut hit = vec![false; chunks.len()];
        for i in 0..plan.batches() {
            // A batch's seeds never take a hot row (the plan left them out):
            // their bottom rows are computed on the accelerator, so layer 0
            // always trains on them.
            let e: Vec<(u32, u32)> = plan
                .entries_of(i)
                .iter()
                .copied()
                .filter(|&(_, q)| (q as usize) < len)
                .map(|(p, q)| (p, row(q)))
                .collect();
            for &(_, q) in &e {
                hit[chunk_of[q as usize] as usize] = true;
            }
            let r: Vec<u32> = hit
                .iter_mut()
                .enumerate()
                .filter_map(|(c, h)| std::mem::take(h).then_some(c as u32))
                .collect();
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
            counts: SuperBatchHot {
                queue_rows: len as u64,
                carried_rows: (len - computed) as u64,
                ..SuperBatchHot::default()
            },
        })
    }

    /// The carried chunks' slab rows and vertices (for
    /// [`Action::Carry`](super::Action::Carry)), in slab-row order.
    pub(crate) fn carried(&self) -> (Vec<u32>, Vec<u32>) {
        let mut rows = Vec::new();
        let mut vertices = Vec::new();
        for c in self.chunks.iter().filter(|c| c.carried) {
            rows.extend(c.rows.clone());
            vertices.extend_from_slice(&c.vertices);
        }
        (rows, vertices)
    }

    /// Per batch, the positions among its bottom destinations that take a
    /// slab row when no chunk is left cold (step 7 with nothing late), in
    /// plan order.
    pub(crate) fn planned_positions(&self) -> Vec<Vec<u32>> {
        self.entries
            .iter()
            .map(|e| e.iter().map(|&(p, _)| p).collect())
            .collect()
    }

    /// Whether batch `i` trains with exactly its planned positions
    /// ([`HotQueue::planned_positions`]).
    pub(crate) fn trains_as_planned(&self, i: usize, positions: &[u32]) -> bool {
        self.entries[i]
            .iter()
            .map(|&(p, _)| p)
            .eq(positions.iter().copied())
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
        self.counts.uses += positions.len() as u64;
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
            bottom_ahead: false,
            loss_slot: None,
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

    /// A queue, per batch its (position, queue index) pairs, per batch the
    /// chunks it reads.
    type Reference = (Vec<u32>, Vec<Vec<(u32, u32)>>, Vec<Vec<u32>>);

    /// The queue as the protocol planned it before [`LaunchPlan`] (a
    /// `SuperBatchPlan` and a binary search per position), kept as the
    /// reference the plan must equal.
    fn reference(launched: &[LaunchedBatch], cpu: u32, pipe: &PipelineConfig) -> Reference {
        use crate::pipeline::SuperBatchPlan;
        let own: Vec<Vec<u32>> = launched
            .iter()
            .map(|b| b.bottom.iter().skip(b.seeds).copied().collect())
            .collect();
        let split = HotSplit::new(cpu.max(1) * 2, cpu).unwrap();
        let queue = SuperBatchPlan::new(0, 0, split, &own).queue;
        let mut chunk_of = vec![0u32; queue.len()];
        for (c, r) in pipe.chunk_ranges(queue.len()).into_iter().enumerate() {
            for q in r {
                chunk_of[q] = c as u32;
            }
        }
        let mut entries = Vec::new();
        let mut reads = Vec::new();
        for b in launched {
            let (mut e, mut r) = (Vec::new(), Vec::new());
            for (p, &v) in b.bottom.iter().enumerate() {
                if p < b.seeds || v >= cpu {
                    continue;
                }
                let q = queue.binary_search(&v).unwrap() as u32;
                e.push((p as u32, q));
                r.push(chunk_of[q as usize]);
            }
            r.sort_unstable();
            r.dedup();
            entries.push(e);
            reads.push(r);
        }
        (queue, entries, reads)
    }

    #[test]
    fn a_plan_cut_at_any_split_is_the_reference_queue() {
        let mut rng = cpu_ops::Rng::new(11);
        for round in 0..200 {
            let ids = 1 + rng.below(3000) as u32;
            let launched: Vec<LaunchedBatch> = (0..1 + rng.below(5))
                .map(|_| {
                    let n = rng.below(400) as usize;
                    LaunchedBatch {
                        seeds: rng.below(n as u64 + 1) as usize,
                        bottom: (0..n).map(|_| rng.below(ids as u64) as u32).collect(),
                    }
                })
                .collect();
            let limit = rng.below(ids as u64 + 1) as u32;
            let plan = LaunchPlan::new(&launched, limit);
            for cpu in [0, limit / 3, limit / 2, limit] {
                let pipe = PipelineConfig::new(launched.len(), 1, 8).unwrap();
                let q = HotQueue::from_plan(
                    LaunchSpec {
                        global: 0,
                        local: 0,
                        slab: 0,
                        batches: 0..launched.len(),
                        split: HotSplit::new(limit.max(cpu), cpu).unwrap(),
                    },
                    &plan,
                    &pipe,
                    || ClaimId(0),
                )
                .unwrap();
                let (queue, entries, reads) = reference(&launched, cpu, &pipe);
                let got: Vec<u32> = q.chunks.iter().flat_map(|c| c.vertices.clone()).collect();
                let what = format!("round {round}, limit {limit}, cpu {cpu}");
                assert_eq!(got, queue, "{what}");
                assert_eq!(q.entries, entries, "{what}");
                assert_eq!(q.reads, reads, "{what}");
            }
            // A split past the plan's limit is refused, not mis-planned.
            let over = HotQueue::from_plan(
                LaunchSpec {
                    global: 0,
                    local: 0,
                    slab: 0,
                    batches: 0..launched.len(),
                    split: HotSplit::all_cpu(limit + 1),
                },
                &plan,
                &PipelineConfig::new(1, 1, 8).unwrap(),
                || ClaimId(0),
            );
            assert!(over.is_err());
        }
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
