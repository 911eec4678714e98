//! Building the task graph: super-batch plans and batch shapes → tasks with
//! devices, dependencies, priorities and size estimates.
//!
//! The graph models what the runtime executes. The protocol itself is described
//! once, in the numbered steps of `runtime/src/orchestrate/pipeline.rs` ("runtime
//! step n" below); "engine step n" are those of `runtime/src/engine/hot.rs`,
//! "workers step n" those of `runtime/src/orchestrate/workers.rs`. Each task is
//! one piece of that work:
//!
//! | task | in the runtime |
//! |---|---|
//! | `SampleTop(b)` | runtime step 3: `Engine::prepare_top` (engine step 1), a super-batch ahead |
//! | `HotCompute(j, c)` | one CPU job (workers step 4: sample, gather, compute on one worker) |
//! | `HotInstall(j, c)` | runtime step 4: `Engine::hot_install` (engine step 3) at the first gate after the job's report |
//! | `HotLoad(b)` | runtime step 5, the gate; then the upload of the used positions and slab rows and the rows' selection (engine step 4) |
//! | `SampleBottom(b)`, `ColdGather(b)`, `ColdCompute(b)`, `Forward(b)`, `Backward(b)`, `OptimizerStep(b)` | runtime step 6: `Engine::train_prepared` (engine step 4) |
//! | `PublishWeights(b)` | runtime steps 2 and 7 |
//!
//! # Dependencies (finish-to-start)
//! For batch `b` of super-batch `j`, and chunk `c` of the queue of `j`:
//!
//! 1. `SampleTop(b)` ← `PublishWeights(last batch of j − D − 1)` (runtime step 3:
//!    `j` is launched when `j − D` starts, after `j − D − 1`'s publication; no
//!    edge for `j ≤ D`, launched at the start).
//! 2. `HotCompute(j, c)` ← every `SampleTop` of `j` (the queue is planned from
//!    their bottom destinations) and the edge of 1.
//! 3. `HotInstall(j, c)` ← `HotCompute(j, c)`. When it runs, and whether at all,
//!    is decided at run time: at the first gate after the computation finished,
//!    if its rows are newer than the slab's (runtime step 4; the simulator).
//! 4. `HotLoad(b)` ← `SampleTop(b)`. Which installed chunks it reads is the
//!    staleness rule's decision at run time, per chunk (runtime step 5), not an
//!    edge.
//! 5. `SampleBottom(b)` ← `SampleTop(b)`, `HotLoad(b)`: the gate decides which
//!    bottom destinations stay cold. Without a CPU part in the plan there is
//!    nothing to decide (the step-based placements): no edge from the gate, and
//!    the bottom hop is sampled with the top. `ColdGather(b)` ← `SampleBottom(b)`;
//!    `ColdCompute(b)` ← `ColdGather(b)`, `SampleBottom(b)` (it aggregates over
//!    the bottom block).
//! 6. `Forward(b)` ← `ColdCompute(b)`, `HotLoad(b)`, `OptimizerStep(b − 1)` (it
//!    runs at version `b`); `Backward(b)` ← `Forward(b)`; `OptimizerStep(b)` ←
//!    `Backward(b)`.
//! 7. `PublishWeights(b)` ← `OptimizerStep(b)`, after the last batch of every
//!    super-batch, and after every batch under [`Publication::EveryBatch`]
//!    (runtime step 2).
//!
//! # Priorities
//! `priority = 16 · (anchor + 1) + rank(kind)`, where the anchor is the batch the
//! task serves, except for work done one pipeline stage ahead on the accelerator's
//! in-order stream (sampling of `j` is anchored at the first batch of `j − D`, so
//! the stream samples a super-batch ahead before that batch's gate, as runtime
//! step 3 launches `j` before training `j − D`), and for hot chunks, always
//! anchored at the first batch of `j − D` with `SampleTop`'s rank (so they follow
//! the sampling they depend on). Work the runtime creates or schedules at a gate
//! (installs, urgent jobs, a publication for them) runs at priority 0.
//!
//! # Estimates and PCIe
//! With `hot_backward = "constant"` (the runtime's default), per task, and what
//! [`TaskGraph::pcie_bytes`] counts under the layer-based placement:
//! - `SampleTop`: the upper layers' edges; the bottom destinations' ids (4 B
//!   each) go to the host to plan the queue.
//! - `HotCompute`: `k · fanout` sampled edges, `k · (fanout + 1)` feature rows
//!   read from host memory, the bottom layer's flops; its result is `k` rows of
//!   [`ModelShape::hot_row_bytes`] in host staging. No PCIe.
//! - `HotInstall`: those rows, host → device, once per installed computation.
//! - `HotLoad`: 8 B per hot position used (position and slab row); the rows are
//!   selected on the device.
//! - `SampleBottom`: the cold destinations' edges; a skip mask of 1 B per bottom
//!   destination when some are hot.
//! - `ColdGather`: the cold inputs' rows the device cache does not hold.
//! - `PublishWeights`: layer 0's weights, device → host.
//!
//! A gate that leaves late vertices cold (`on_late = "compute"`) remakes the
//! estimates of the batch's `HotLoad`, `SampleBottom`, `ColdGather` and
//! `ColdCompute` ([`GraphBuilder`]'s `leave_cold`, from the simulator).

use cpu_ops::SampledBatch;

use crate::error::{invalid, Result, SchedulerError};
use crate::pipeline::{HotSplit, PipelineConfig, Publication, SuperBatchPlan, VertexClass};
use crate::placement::Placement;
use crate::task::{Device, Estimate, LayerSpan, Task, TaskGraph, TaskKind};

/// Bytes of an `f32`.
const F32: u64 = 4;
/// Priority slots per anchor batch.
const SLOTS: u64 = 16;

/// The model dimensions the estimates need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelShape {
    /// Input feature width.
    pub feature_dim: u32,
    /// Hidden width (the bottom layer's output).
    pub hidden: u32,
    /// GNN layers (≥ 1).
    pub layers: u32,
    /// Fanout of the bottom layer (neighbors per hot vertex the CPU samples).
    pub bottom_fanout: u32,
}

impl ModelShape {
    /// A shape, after checking every field is at least 1.
    pub fn new(feature_dim: u32, hidden: u32, layers: u32, bottom_fanout: u32) -> Result<Self> {
        let m = Self {
            feature_dim,
            hidden,
            layers,
            bottom_fanout,
        };
        m.validate()?;
        Ok(m)
    }

    /// Checks every field is at least 1 (for shapes built field by field).
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("feature_dim", self.feature_dim),
            ("hidden", self.hidden),
            ("layers", self.layers),
            ("bottom_fanout", self.bottom_fanout),
        ] {
            if v == 0 {
                return Err(invalid(name, "at least 1", 0));
            }
        }
        Ok(())
    }

    /// Bytes of one input feature row.
    pub fn feature_row_bytes(&self) -> u64 {
        F32 * self.feature_dim as u64
    }

    /// Bytes of one hot row: layer 0's output for one vertex, as the CPU writes
    /// it to staging and the install uploads it into the slab (the runtime's
    /// `Engine::hot_width` values; with `hot_backward = "constant"` nothing else
    /// of a hot vertex crosses PCIe).
    pub fn hot_row_bytes(&self) -> u64 {
        F32 * self.hidden as u64
    }

    /// Bytes of the bottom layer's weights (what is published).
    pub fn bottom_weight_bytes(&self) -> u64 {
        F32 * self.feature_dim as u64 * self.hidden as u64
    }

    /// Number of weights (bottom layer `f × h`, each other layer `h × h`).
    pub fn parameters(&self) -> u64 {
        let (f, h) = (self.feature_dim as u64, self.hidden as u64);
        f * h + (self.layers as u64).saturating_sub(1) * h * h
    }
}

/// How big one batch is, split the way the task graph needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchShape {
    /// Seed (output) vertices.
    pub seeds: u64,
    /// Destinations of the layers above the bottom, summed over layers.
    pub upper_dst: u64,
    /// Sampled edges of the layers above the bottom.
    pub upper_edges: u64,
    /// Bottom-layer destinations served by CPU embeddings.
    pub hot: u64,
    /// Bottom-layer destinations computed on the accelerator (cold and cached-hot).
    pub cold_dst: u64,
    /// Sampled bottom-layer edges of those destinations.
    pub cold_edges: u64,
    /// Distinct input vertices of those destinations (themselves included).
    pub cold_inputs: u64,
    /// Of those inputs, how many have their features in the device cache.
    pub cached_inputs: u64,
}

impl BatchShape {
    /// The shape of a sampled batch under `split` (ids must be relabeled ones).
    /// The batch may be sampled in full: hot destinations' bottom edges are simply
    /// not counted.
    pub fn from_sampled(batch: &SampledBatch, split: &HotSplit) -> Self {
        let blocks = batch.blocks();
        let mut s = Self {
            seeds: batch.seeds().len() as u64,
            ..Self::default()
        };
        let Some(bottom) = blocks.first() else {
            return s;
        };
        for b in &blocks[1..] {
            s.upper_dst += b.num_dst() as u64;
            s.upper_edges += b.num_edges() as u64;
        }
        let src = bottom.src_ids();
        let mut input = vec![false; bottom.num_src()];
        for (j, &v) in bottom.dst_ids().iter().enumerate() {
            if split.class(v) == VertexClass::CpuHot {
                s.hot += 1;
                continue;
            }
            s.cold_dst += 1;
            input[j] = true;
            let nb = bottom.neighbors(j);
            s.cold_edges += nb.len() as u64;
            for &l in nb {
                input[l as usize] = true;
            }
        }
        for (l, _) in input.iter().enumerate().filter(|(_, &m)| m) {
            s.cold_inputs += 1;
            s.cached_inputs += u64::from(split.class(src[l]) == VertexClass::CachedHot);
        }
        s
    }
}

impl BatchShape {
    /// This shape with `k` of its CPU-hot destinations computed by the accelerator
    /// instead: each adds `bottom_fanout` sampled edges and `bottom_fanout + 1`
    /// inputs read from host memory (the workload's approximation).
    pub fn with_cold(&self, k: u64, bottom_fanout: u32) -> Self {
        let k = k.min(self.hot);
        let fan = bottom_fanout as u64;
        Self {
            hot: self.hot - k,
            cold_dst: self.cold_dst + k,
            cold_edges: self.cold_edges + k * fan,
            cold_inputs: self.cold_inputs + k * (fan + 1),
            ..*self
        }
    }
}

/// The ids of one batch's tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchTasks {
    /// Global batch index.
    pub batch: u64,
    /// [`TaskKind::SampleTop`].
    pub sample: usize,
    /// [`TaskKind::SampleBottom`].
    pub sample_bottom: usize,
    /// [`TaskKind::ColdGather`].
    pub cold_gather: usize,
    /// [`TaskKind::ColdCompute`].
    pub cold_compute: usize,
    /// [`TaskKind::HotLoad`].
    pub hot_load: usize,
    /// [`TaskKind::Forward`].
    pub forward: usize,
    /// [`TaskKind::Backward`].
    pub backward: usize,
    /// [`TaskKind::OptimizerStep`].
    pub step: usize,
    /// [`TaskKind::PublishWeights`] after its step, if it publishes
    /// ([`Publication`]; the last batch of a super-batch always does).
    pub publish: Option<usize>,
    /// The shape its estimates were made from.
    pub shape: BatchShape,
}

/// The ids of one hot chunk's tasks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkTasks {
    /// Chunk index within the queue.
    pub chunk: u32,
    /// Positions of its vertices in the plan's queue.
    pub range: std::ops::Range<usize>,
    /// [`TaskKind::HotCompute`].
    pub compute: usize,
    /// [`TaskKind::HotInstall`].
    pub install: usize,
}

/// The tasks one super-batch added.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuperBatchTasks {
    /// Super-batch index.
    pub index: u64,
    /// Its batches' tasks, in order.
    pub batches: Vec<BatchTasks>,
    /// Its queue's chunks, hottest first.
    pub chunks: Vec<ChunkTasks>,
    /// The [`TaskKind::PublishWeights`] after its last batch (the one queue
    /// `j + D + 1` waits for).
    pub publish: usize,
}

/// Appends super-batches to a growing [`TaskGraph`] under one placement.
#[derive(Debug)]
pub struct GraphBuilder<'p> {
    model: ModelShape,
    pipeline: PipelineConfig,
    placement: &'p dyn Placement,
    publication: Publication,
    graph: TaskGraph,
    next_super_batch: u64,
    next_batch: u64,
    /// `PublishWeights` of the last batch of every super-batch pushed so far.
    last_publish: Vec<usize>,
    last_step: Option<usize>,
}

impl<'p> GraphBuilder<'p> {
    /// An empty builder that publishes after every super-batch (see
    /// [`GraphBuilder::with_publication`]).
    pub fn new(model: ModelShape, pipeline: PipelineConfig, placement: &'p dyn Placement) -> Self {
        Self {
            model,
            pipeline,
            placement,
            publication: Publication::EverySuperBatch,
            graph: TaskGraph::new(),
            next_super_batch: 0,
            next_batch: 0,
            last_publish: Vec::new(),
            last_step: None,
        }
    }

    /// Publishes as `publication` says from the next super-batch on
    /// ([`Publication::for_bound`] gives the runtime's choice).
    pub fn with_publication(mut self, publication: Publication) -> Self {
        self.publication = publication;
        self
    }

    /// When weights are published.
    pub fn publication(&self) -> Publication {
        self.publication
    }

    /// The graph so far.
    pub fn graph(&self) -> &TaskGraph {
        &self.graph
    }

    /// The graph, consuming the builder.
    pub fn into_graph(self) -> TaskGraph {
        self.graph
    }

    /// The placement.
    pub fn placement(&self) -> &'p dyn Placement {
        self.placement
    }

    /// The model shape.
    pub fn model(&self) -> &ModelShape {
        &self.model
    }

    /// The priority of a batch task of `kind` for batch `b`, on `device`.
    fn batch_priority(&self, kind: TaskKind, b: u64, device: Device) -> u64 {
        let anchor = if kind == TaskKind::SampleTop && device == Device::Accelerator {
            self.lead_batch(self.pipeline.super_batch_of(b))
        } else {
            b
        };
        SLOTS * (anchor + 1) + kind.rank()
    }

    /// The priority of `SampleBottom(b)` on `device`: after the gate of `b`, or,
    /// when no gate decides anything (no CPU part), with the top, a stage ahead.
    fn sample_bottom_priority(&self, b: u64, device: Device, gated: bool) -> u64 {
        let kind = TaskKind::SampleBottom;
        if gated || device != Device::Accelerator {
            return self.batch_priority(kind, b, device);
        }
        SLOTS * (self.lead_batch(self.pipeline.super_batch_of(b)) + 1) + kind.rank()
    }

    /// The first batch of the super-batch during which `j` is prepared.
    fn lead_batch(&self, j: u64) -> u64 {
        self.pipeline.lead_super_batch(j) * self.pipeline.batches_per_super_batch() as u64
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        kind: TaskKind,
        batch: Option<u64>,
        super_batch: u64,
        chunk: Option<u32>,
        layers: LayerSpan,
        deps: Vec<usize>,
        est: Estimate,
        priority: Option<u64>,
    ) -> Result<usize> {
        let device = self.placement.device(kind);
        let priority =
            priority.unwrap_or_else(|| self.batch_priority(kind, batch.unwrap_or(0), device));
        self.graph.push(Task {
            id: 0,
            kind,
            device,
            batch,
            super_batch,
            chunk,
            layers,
            deps,
            est,
            priority,
        })
    }

    /// Appends the tasks of `plan` (the next super-batch) whose batches have
    /// `shapes` (one per batch, with `hot` equal to the plan's per-batch count).
    pub fn push_super_batch(
        &mut self,
        plan: &SuperBatchPlan,
        shapes: &[BatchShape],
    ) -> Result<SuperBatchTasks> {
        self.check(plan, shapes)?;
        let j = plan.index;
        let m = self.model;
        let top = m.layers - 1;
        let gate: Vec<usize> = self
            .pipeline
            .queue_gate(j)
            .and_then(|g| self.last_publish.get(g as usize).copied())
            .into_iter()
            .collect();
        let mut batches = Vec::with_capacity(shapes.len());
        for (k, s) in shapes.iter().enumerate() {
            let b = plan.batches.start + k as u64;
            let sample = self.push(
                TaskKind::SampleTop,
                Some(b),
                j,
                None,
                LayerSpan {
                    first: 1.min(top),
                    last: top,
                },
                gate.clone(),
                sample_top_estimate(s),
                None,
            )?;
            let hot_load = self.push(
                TaskKind::HotLoad,
                Some(b),
                j,
                None,
                LayerSpan::one(0),
                vec![sample],
                hot_load_estimate(&m, s),
                None,
            )?;
            // The gate decides which bottom destinations stay cold, so the bottom
            // hop is sampled after it — when there is a CPU part to decide about;
            // without one the batch is sampled whole, a stage ahead.
            let gated = plan.split.cpu() > 0;
            let mut bdeps = vec![sample];
            if gated {
                bdeps.push(hot_load);
            }
            let device = self.placement.device(TaskKind::SampleBottom);
            let priority = self.sample_bottom_priority(b, device, gated);
            let sample_bottom = self.push(
                TaskKind::SampleBottom,
                Some(b),
                j,
                None,
                LayerSpan::one(0),
                bdeps,
                sample_bottom_estimate(s),
                Some(priority),
            )?;
            let cold_gather = self.push(
                TaskKind::ColdGather,
                Some(b),
                j,
                None,
                LayerSpan::one(0),
                vec![sample_bottom],
                gather_estimate(&m, s),
                None,
            )?;
            let cold_compute = self.push(
                TaskKind::ColdCompute,
                Some(b),
                j,
                None,
                LayerSpan::one(0),
                vec![cold_gather, sample_bottom],
                cold_compute_estimate(&m, s),
                None,
            )?;
            let mut fdeps = vec![cold_compute, hot_load];
            fdeps.extend(self.last_step);
            let upper = LayerSpan {
                first: 1.min(top),
                last: top,
            };
            let (fwd, bwd) = train_estimates(&m, s);
            let forward =
                self.push(TaskKind::Forward, Some(b), j, None, upper, fdeps, fwd, None)?;
            let all = LayerSpan {
                first: 0,
                last: top,
            };
            let backward = self.push(
                TaskKind::Backward,
                Some(b),
                j,
                None,
                all,
                vec![forward],
                bwd,
                None,
            )?;
            let step = self.push(
                TaskKind::OptimizerStep,
                Some(b),
                j,
                None,
                all,
                vec![backward],
                step_estimate(&m),
                None,
            )?;
            let publish = if self.publication.publishes_after(k, shapes.len()) {
                Some(self.push(
                    TaskKind::PublishWeights,
                    Some(b),
                    j,
                    None,
                    LayerSpan::one(0),
                    vec![step],
                    publish_estimate(&m),
                    None,
                )?)
            } else {
                None
            };
            self.last_step = Some(step);
            batches.push(BatchTasks {
                batch: b,
                sample,
                sample_bottom,
                cold_gather,
                cold_compute,
                hot_load,
                forward,
                backward,
                step,
                publish,
                shape: *s,
            });
        }
        // Hot chunks: after all of this super-batch's sampling, and the gate.
        let mut chunk_deps: Vec<usize> = batches.iter().map(|t| t.sample).collect();
        chunk_deps.extend(gate.iter().copied());
        let chunk_priority = SLOTS * (self.lead_batch(j) + 1) + TaskKind::SampleTop.rank();
        let mut chunks = Vec::new();
        let pipeline = self.pipeline;
        for (c, (range, verts)) in plan.chunks(&pipeline).enumerate() {
            let k = verts.len() as u64;
            let compute = self.push(
                TaskKind::HotCompute,
                None,
                j,
                Some(c as u32),
                LayerSpan::one(0),
                chunk_deps.clone(),
                hot_chunk_estimate(&m, k),
                Some(chunk_priority),
            )?;
            let install = self.push(
                TaskKind::HotInstall,
                None,
                j,
                Some(c as u32),
                LayerSpan::one(0),
                vec![compute],
                hot_install_estimate(&m, k),
                Some(chunk_priority),
            )?;
            chunks.push(ChunkTasks {
                chunk: c as u32,
                range,
                compute,
                install,
            });
        }
        let publish = batches
            .last()
            .and_then(|t| t.publish)
            .ok_or_else(|| invalid("plan.batches", "a publication after the last batch", j))?;
        self.last_publish.push(publish);
        self.next_super_batch += 1;
        self.next_batch = plan.batches.end;
        Ok(SuperBatchTasks {
            index: j,
            batches,
            chunks,
            publish,
        })
    }

    /// Appends a task the runtime created while running (urgent hot work); its
    /// dependencies must be existing tasks.
    pub(crate) fn push_dynamic(&mut self, task: Task) -> Result<usize> {
        self.graph.push(task)
    }

    /// The gate of batch `t` left `late` of its hot destinations cold
    /// (`on_late = "compute"`): the accelerator samples, gathers and computes them
    /// itself, so its bottom-hop tasks grow (their estimates are remade from the
    /// shape with `late` hot destinations moved to the cold side).
    pub(crate) fn leave_cold(&mut self, t: &BatchTasks, late: u64) -> Result<()> {
        let m = self.model;
        let s = t.shape.with_cold(late.min(t.shape.hot), m.bottom_fanout);
        for (id, est) in [
            (t.hot_load, hot_load_estimate(&m, &s)),
            (t.sample_bottom, sample_bottom_estimate(&s)),
            (t.cold_gather, gather_estimate(&m, &s)),
            (t.cold_compute, cold_compute_estimate(&m, &s)),
        ] {
            let task = self
                .graph
                .get_mut(id)
                .ok_or_else(|| invalid("batch task", "a task of the graph", id))?;
            task.est = est;
        }
        Ok(())
    }

    fn check(&self, plan: &SuperBatchPlan, shapes: &[BatchShape]) -> Result<()> {
        self.model.validate()?;
        if plan.index != self.next_super_batch {
            return Err(invalid(
                "plan.index",
                format!("the next super-batch ({})", self.next_super_batch),
                plan.index,
            ));
        }
        if plan.batches.start != self.next_batch {
            return Err(invalid(
                "plan.batches",
                format!("to start at the next batch ({})", self.next_batch),
                plan.batches.start,
            ));
        }
        let n = (plan.batches.end - plan.batches.start) as usize;
        if n == 0 || n > self.pipeline.batches_per_super_batch() {
            return Err(invalid(
                "plan.batches",
                format!(
                    "1 to {} batches (the super-batch size)",
                    self.pipeline.batches_per_super_batch()
                ),
                n,
            ));
        }
        for (what, len) in [
            ("batch shapes", shapes.len()),
            ("plan.batch_hot", plan.batch_hot.len()),
            ("plan.first_use", plan.first_use.len()),
        ] {
            if len != n {
                return Err(SchedulerError::SizeMismatch {
                    what,
                    expected: n,
                    found: len,
                });
            }
        }
        for (k, (s, h)) in shapes.iter().zip(&plan.batch_hot).enumerate() {
            if s.hot != h.len() as u64 {
                return Err(SchedulerError::SizeMismatch {
                    what: if k == 0 {
                        "hot vertices of the first batch (shape vs plan)"
                    } else {
                        "hot vertices of a batch (shape vs plan)"
                    },
                    expected: h.len(),
                    found: s.hot as usize,
                });
            }
        }
        Ok(())
    }
}

/// The layers above the bottom; the result is their blocks and the bottom
/// destinations (the sources of the lowest of them), whose ids go to the host
/// to plan the hot queue.
fn sample_top_estimate(s: &BatchShape) -> Estimate {
    let edges = s.upper_edges;
    let vertices = s.seeds + s.upper_dst;
    let bottom_ids = 4 * (s.hot + s.cold_dst);
    Estimate {
        vertices,
        edges,
        sampled_edges: edges,
        mem_bytes: 12 * edges + 8 * vertices,
        out_bytes: 4 * edges + 12 * vertices + bottom_ids,
        host_write_bytes: bottom_ids,
        ..Estimate::default()
    }
}

/// The bottom hop of the cold destinations; the result is the bottom block and its
/// input ids. With hot destinations to skip, a mask of one byte per bottom
/// destination goes to the device first.
fn sample_bottom_estimate(s: &BatchShape) -> Estimate {
    let edges = s.cold_edges;
    let mask = if s.hot > 0 { s.hot + s.cold_dst } else { 0 };
    Estimate {
        vertices: s.cold_dst,
        edges,
        sampled_edges: edges,
        mem_bytes: 12 * edges + 8 * s.cold_dst,
        out_bytes: 4 * edges + 12 * s.cold_dst + 4 * s.cold_inputs,
        host_read_bytes: mask,
        ..Estimate::default()
    }
}

fn gather_estimate(m: &ModelShape, s: &BatchShape) -> Estimate {
    let row = m.feature_row_bytes();
    Estimate {
        vertices: s.cold_inputs,
        mem_bytes: 2 * row * s.cold_inputs,
        out_bytes: row * s.cold_inputs,
        host_read_bytes: row * (s.cold_inputs - s.cached_inputs.min(s.cold_inputs)),
        ..Estimate::default()
    }
}

fn cold_compute_estimate(m: &ModelShape, s: &BatchShape) -> Estimate {
    let (f, h) = (m.feature_dim as f64, m.hidden as f64);
    Estimate {
        vertices: s.cold_dst,
        edges: s.cold_edges,
        flops: s.cold_edges as f64 * f + 2.0 * s.cold_dst as f64 * f * h,
        mem_bytes: m.feature_row_bytes() * (s.cold_edges + s.cold_dst)
            + F32 * h as u64 * s.cold_dst,
        out_bytes: F32 * m.hidden as u64 * s.cold_dst,
        ..Estimate::default()
    }
}

fn hot_load_estimate(m: &ModelShape, s: &BatchShape) -> Estimate {
    // The rows are in the slab already (HotInstall): per hot position only the
    // position and its slab row (2 × u32) go up; the rows are selected on the
    // device.
    Estimate {
        vertices: s.hot,
        mem_bytes: 2 * m.hot_row_bytes() * s.hot,
        out_bytes: m.hot_row_bytes() * s.hot,
        host_read_bytes: 8 * s.hot,
        ..Estimate::default()
    }
}

/// Forward and backward estimates (backward ≈ twice the forward, plus the bottom
/// layer's weight gradient over every bottom destination).
fn train_estimates(m: &ModelShape, s: &BatchShape) -> (Estimate, Estimate) {
    let (f, h) = (m.feature_dim as f64, m.hidden as f64);
    let fwd_flops = s.upper_edges as f64 * h + 2.0 * s.upper_dst as f64 * h * h;
    let act = F32 * m.hidden as u64 * (s.upper_dst + s.upper_edges);
    let fwd = Estimate {
        vertices: s.upper_dst,
        edges: s.upper_edges,
        flops: fwd_flops,
        mem_bytes: act,
        out_bytes: F32 * s.seeds,
        ..Estimate::default()
    };
    let bottom = (s.hot + s.cold_dst) as f64;
    let bwd = Estimate {
        vertices: s.upper_dst + s.hot + s.cold_dst,
        edges: s.upper_edges + s.cold_edges,
        flops: 2.0 * fwd_flops + 2.0 * bottom * f * h,
        mem_bytes: 2 * act + m.feature_row_bytes() * (s.hot + s.cold_dst),
        out_bytes: F32 * m.parameters(),
        ..Estimate::default()
    };
    (fwd, bwd)
}

fn step_estimate(m: &ModelShape) -> Estimate {
    let p = m.parameters();
    Estimate {
        flops: 10.0 * p as f64,
        mem_bytes: 16 * p,
        ..Estimate::default()
    }
}

/// The bottom layer's weights go to host memory: their bytes are counted as the
/// task's host writes (its result is already where its readers are).
pub(crate) fn publish_estimate(m: &ModelShape) -> Estimate {
    let w = m.bottom_weight_bytes();
    Estimate {
        mem_bytes: w,
        host_write_bytes: w,
        ..Estimate::default()
    }
}

/// The estimate of a hot chunk of `k` vertices: one CPU job that samples one hop
/// with the bottom fanout, reads the neighbors' input features from host memory
/// and runs the bottom layer (the runtime's `HotComputer::compute_into`).
pub(crate) fn hot_chunk_estimate(m: &ModelShape, k: u64) -> Estimate {
    let edges = k * m.bottom_fanout as u64;
    let row = m.feature_row_bytes();
    let (f, h) = (m.feature_dim as f64, m.hidden as f64);
    Estimate {
        vertices: k,
        edges,
        sampled_edges: edges,
        flops: edges as f64 * f + 2.0 * k as f64 * f * h,
        mem_bytes: (12 * edges + 8 * k) + 3 * row * (edges + k) + m.hot_row_bytes() * k,
        out_bytes: m.hot_row_bytes() * k,
        host_read_bytes: row * (edges + k),
        ..Estimate::default()
    }
}

/// The install of a chunk of `k` rows into the device slab. Its PCIe bytes are
/// the rows its [`TaskKind::HotCompute`] wrote (that task's result, counted on the
/// edge when the computation ran on the other device: `k × hot_row_bytes`).
pub(crate) fn hot_install_estimate(m: &ModelShape, k: u64) -> Estimate {
    Estimate {
        vertices: k,
        mem_bytes: m.hot_row_bytes() * k,
        ..Estimate::default()
    }
}

#[cfg(test)]
mod tests {
    use cpu_ops::{BuildOptions, CsrGraph, NeighborSampler, SamplerScratch, ALL_NEIGHBORS};

    use super::*;
    use crate::placement::Orchestration;

    #[test]
    fn shape_of_a_sampled_batch_splits_the_bottom_layer() {
        // Star around 0 plus a path 1-2-3.
        let edges = [(0, 1), (0, 2), (0, 3), (1, 2), (2, 3), (3, 4)];
        let g = CsrGraph::from_edges(5, &edges, BuildOptions::UNDIRECTED).unwrap();
        let sampler = NeighborSampler::new(vec![ALL_NEIGHBORS, ALL_NEIGHBORS]).unwrap();
        let batch = sampler
            .sample(&g, &[4], 1, &mut SamplerScratch::new(5))
            .unwrap();
        // Top block: 4 ← {3}. Bottom block: dst {4, 3}, 3 ← {0, 2, 4}, 4 ← {3}.
        let split = HotSplit::new(3, 1).unwrap(); // 0 CPU-hot, 1..3 cached
        let s = BatchShape::from_sampled(&batch, &split);
        assert_eq!(s.seeds, 1);
        assert_eq!((s.upper_dst, s.upper_edges), (1, 1));
        assert_eq!(s.hot, 0);
        assert_eq!(s.cold_dst, 2);
        assert_eq!(s.cold_edges, 4);
        assert_eq!(s.cold_inputs, 4); // 4, 3, 0, 2
        assert_eq!(s.cached_inputs, 1); // 2
        let hot3 = HotSplit::all_cpu(4); // 3 is CPU-hot now
        let s = BatchShape::from_sampled(&batch, &hot3);
        assert_eq!(
            (s.hot, s.cold_dst, s.cold_edges, s.cold_inputs),
            (1, 1, 1, 2)
        );
    }

    fn plan_and_shapes(j: u64, n: usize, split: HotSplit) -> (SuperBatchPlan, Vec<BatchShape>) {
        let bottom: Vec<Vec<u32>> = (0..n as u32)
            .map(|k| vec![0, k % 3 + 1, 4 + k, 9])
            .collect();
        let plan = SuperBatchPlan::new(j, j * n as u64, split, &bottom);
        let shapes = plan
            .batch_hot
            .iter()
            .map(|h| BatchShape {
                seeds: 8,
                upper_dst: 16,
                upper_edges: 40,
                hot: h.len() as u64,
                cold_dst: 4 - h.len() as u64,
                cold_edges: 10,
                cold_inputs: 12,
                cached_inputs: 2,
            })
            .collect();
        (plan, shapes)
    }

    #[test]
    fn builder_wires_the_pipeline_dependencies() {
        let m = ModelShape::new(16, 8, 3, 5).unwrap();
        let pipe = PipelineConfig::new(2, 1, 2).unwrap();
        let placement = Orchestration::Layer.placement();
        let mut b = GraphBuilder::new(m, pipe, placement.as_ref());
        let split = HotSplit::all_cpu(4);
        let mut sbs = Vec::new();
        for j in 0..4 {
            let (plan, shapes) = plan_and_shapes(j, 2, split);
            sbs.push(b.push_super_batch(&plan, &shapes).unwrap());
        }
        let g = b.graph();
        let t = |id: usize| &g.tasks()[id];
        // Queue 0 and 1 have no gate; queue 2 waits for super-batch 0's publication.
        let pub0 = sbs[0].publish;
        assert_eq!(sbs[0].batches[1].publish, Some(pub0));
        assert_eq!(
            sbs[0].batches[0].publish, None,
            "one publication per super-batch"
        );
        assert!(!t(sbs[1].chunks[0].compute).deps.contains(&pub0));
        let c2 = t(sbs[2].chunks[0].compute);
        assert!(c2.deps.contains(&pub0));
        assert!(c2.deps.contains(&sbs[2].batches[0].sample));
        assert!(c2.deps.contains(&sbs[2].batches[1].sample));
        assert!(t(sbs[2].batches[0].sample).deps.contains(&pub0));
        // The install follows its chunk's computation.
        assert_eq!(
            t(sbs[2].chunks[0].install).deps,
            vec![sbs[2].chunks[0].compute]
        );
        // A batch: top sampled ahead, then the gate, then the bottom hop, gather,
        // compute of what the gate left cold.
        let b3 = &sbs[1].batches[1];
        assert_eq!(t(b3.hot_load).deps, vec![b3.sample]);
        assert_eq!(t(b3.sample_bottom).deps, vec![b3.sample, b3.hot_load]);
        assert_eq!(t(b3.cold_gather).deps, vec![b3.sample_bottom]);
        assert_eq!(
            t(b3.cold_compute).deps,
            vec![b3.cold_gather, b3.sample_bottom]
        );
        // Forward of batch 3 runs at version 3: after step 2.
        assert!(t(b3.forward).deps.contains(&sbs[1].batches[0].step));
        // Queue of super-batch 1: vertices {0, 1, 2} in chunks of 2.
        assert_eq!(sbs[1].chunks.len(), 2);
        assert_eq!(sbs[1].chunks[0].range, 0..2);
        assert_eq!(sbs[1].chunks[1].range, 2..3);
        // Sampling of super-batch 2 comes before training super-batch 1 on the
        // accelerator's stream, and after super-batch 0's training; the gate
        // comes before the bottom hop.
        let p = |id: usize| g.tasks()[id].priority;
        assert!(p(sbs[2].batches[1].sample) < p(sbs[1].batches[0].hot_load));
        assert!(p(sbs[2].batches[0].sample) > p(pub0));
        assert!(p(b3.hot_load) < p(b3.sample_bottom));
        // Hot chunks follow the sampling they need.
        assert!(p(sbs[2].chunks[0].compute) >= p(sbs[2].batches[1].sample));
        g.topological_order().unwrap();
        // PCIe: a chunk's rows go up once, with its install; a batch's hot load
        // moves 8 bytes per hot position; the computation itself moves nothing.
        let chunk = &sbs[1].chunks[0];
        assert_eq!(g.pcie_bytes(chunk.install), 2 * 4 * m.hidden as u64);
        assert_eq!(g.pcie_bytes(chunk.compute), 0);
        let b0 = &sbs[0].batches[0];
        assert_eq!(b0.shape.hot, 2);
        assert_eq!(g.pcie_bytes(b0.hot_load), 16);
        // The skip mask, one byte per bottom destination.
        assert_eq!(g.pcie_bytes(b0.sample_bottom), 4);
        assert_eq!(g.pcie_bytes(pub0), m.bottom_weight_bytes());
        // The bottom destinations' ids go to the host to plan the queue.
        assert_eq!(g.pcie_bytes(b0.sample), 4 * 4);
    }

    #[test]
    fn publication_every_batch_adds_one_per_batch() {
        let m = ModelShape::new(16, 8, 2, 5).unwrap();
        let pipe = PipelineConfig::new(3, 1, 2).unwrap();
        let layer = Orchestration::Layer.placement();
        let mut b =
            GraphBuilder::new(m, pipe, layer.as_ref()).with_publication(Publication::EveryBatch);
        assert_eq!(b.publication(), Publication::EveryBatch);
        let split = HotSplit::all_cpu(4);
        let mut sbs = Vec::new();
        for j in 0..3 {
            let (plan, shapes) = plan_and_shapes(j, 3, split);
            sbs.push(b.push_super_batch(&plan, &shapes).unwrap());
        }
        let g = b.graph();
        for t in sbs.iter().flat_map(|s| &s.batches) {
            let publish = t.publish.unwrap();
            assert_eq!(g.tasks()[publish].deps, vec![t.step]);
        }
        // Queue 2 still waits for the last publication of super-batch 0.
        assert_eq!(sbs[0].publish, sbs[0].batches[2].publish.unwrap());
        assert!(g.tasks()[sbs[2].chunks[0].compute]
            .deps
            .contains(&sbs[0].publish));
    }

    #[test]
    fn late_vertices_left_cold_grow_the_bottom_hop() {
        let m = ModelShape::new(16, 8, 2, 5).unwrap();
        let pipe = PipelineConfig::new(2, 1, 2).unwrap();
        let layer = Orchestration::Layer.placement();
        let mut b = GraphBuilder::new(m, pipe, layer.as_ref());
        let (plan, shapes) = plan_and_shapes(0, 2, HotSplit::all_cpu(4));
        let sb = b.push_super_batch(&plan, &shapes).unwrap();
        let t = sb.batches[0];
        let est = |b: &GraphBuilder, id: usize| b.graph().tasks()[id].est;
        let (hl, sbot, cg) = (
            est(&b, t.hot_load),
            est(&b, t.sample_bottom),
            est(&b, t.cold_gather),
        );
        b.leave_cold(&t, 1).unwrap();
        let after = |id: usize| est(&b, id);
        assert_eq!(after(t.hot_load).vertices, hl.vertices - 1);
        assert_eq!(after(t.hot_load).host_read_bytes, hl.host_read_bytes - 8);
        assert_eq!(after(t.sample_bottom).sampled_edges, sbot.sampled_edges + 5);
        assert_eq!(after(t.cold_gather).vertices, cg.vertices + 6);
        assert_eq!(
            after(t.cold_gather).host_read_bytes,
            cg.host_read_bytes + 6 * m.feature_row_bytes()
        );
        // Every hot vertex late: no positions, no mask.
        b.leave_cold(&t, 2).unwrap();
        assert_eq!(est(&b, t.hot_load).host_read_bytes, 0);
        assert_eq!(est(&b, t.sample_bottom).host_read_bytes, 0);
    }

    #[test]
    fn builder_rejects_inconsistent_input() {
        let m = ModelShape::new(16, 8, 2, 5).unwrap();
        let pipe = PipelineConfig::new(2, 1, 2).unwrap();
        let layer = Orchestration::Layer.placement();
        let mut b = GraphBuilder::new(m, pipe, layer.as_ref());
        let (plan, shapes) = plan_and_shapes(1, 2, HotSplit::all_cpu(4));
        let e = b.push_super_batch(&plan, &shapes).unwrap_err();
        assert!(e.to_string().contains("plan.index"), "{e}");
        let (plan, mut shapes) = plan_and_shapes(0, 2, HotSplit::all_cpu(4));
        shapes[1].hot += 1;
        assert!(b.push_super_batch(&plan, &shapes).is_err());
        assert!(b.push_super_batch(&plan, &shapes[..1]).is_err());
        let (plan, shapes) = plan_and_shapes(0, 3, HotSplit::all_cpu(4));
        assert!(b.push_super_batch(&plan, &shapes).is_err());
        assert!(ModelShape::new(0, 1, 1, 1).is_err());
    }
}
