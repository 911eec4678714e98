//! The planner thread: the host work of a super-batch's launch (protocol step
//! 3), done a super-batch ahead so the accelerator thread's `launch` only
//! issues device work and hands in a finished plan.
//!
//! What a launch computes on the host, and what it cost on the accelerator
//! thread before this thread took it (H200, 2026-11-26, products-scale R-MAT,
//! split 30 k; `../shared/gpu-runs/2026-11-26/RESULTS.md`): the relabel of the
//! batches' ~123 k bottom destinations (0.95 ms), the queue's deduplication and
//! chunking (0.9 ms) and a binary search per CPU-hot position (1.1 ms; 4.8 ms at
//! split 120 k, 7.0 ms at 480 k) — 45% of the epoch, with the GPU idle.
//!
//! # Protocol (one epoch; the driver is `pipeline.rs`)
//! 1. **Start** ([`Planner::spawn`]): one scoped thread per epoch run, with the
//!    relabeling, the plan's limit (the hot set: any split the monitor may
//!    answer with is at most it) and the candidate splits to count (`policy =
//!    "auto"`). It lives inside the run's `std::thread::scope`, so it is joined
//!    before the run returns, whatever happened.
//! 2. **Submit** ([`Planner::submit`]): once the protocol's launch of
//!    super-batch `g` is answered and its jobs are queued, the driver samples
//!    the top layers of `g + 1`'s batches on the device
//!    (`LayerDevice::prepare_tops`, which queues them and starts one read of
//!    their sizes and bottom destinations) and submits the read; the run's
//!    first launch submits `g` and `g + 1` before it waits for `g`'s plan.
//!    With `device.sample_ahead` the read is still in flight on the sampling
//!    stream: the thread waits for it (a `sample wait` slice; the read's one
//!    synchronization, which the accelerator thread never makes) before it
//!    plans, and the sampled blocks go back with the plan. Requests are
//!    answered in order.
//! 3. **Plan** ([`plan`], on the thread): relabel each batch's destinations, count
//!    the candidate splits, and build the [`LaunchPlan`] for every split up to
//!    the limit — the pure, split-independent part of protocol step 3. Nothing
//!    here touches the protocol's state: claims, slabs and jobs stay the
//!    protocol's. Each plan is a `plan` slice on the `planner` track.
//! 4. **Take** ([`Planner::take`]): at the launch of `g` the driver takes `g`'s
//!    plan (submitted a super-batch earlier, so normally ready; a block is
//!    traced as `plan wait`), hands its sampled blocks to the device
//!    (`LayerDevice::adopt_tops`) and answers [`scheduler::Event::Planned`] with the
//!    split it plans with; the protocol cuts the plan at that split (linear, no
//!    search). The actions are those [`scheduler::Event::Launched`] with the
//!    same batches gives (`scheduler/tests/protocol_script.rs`).
//! 5. **Errors**: a failed or panicking plan is answered with its error, which
//!    ends the epoch as the driver's error; a thread that is gone answers
//!    [`Planner::take`] with an error, never a hang.
//! 6. **End**: the driver drops the planner (its request channel closes), the
//!    thread finishes the plan in hand and exits, and the scope joins it. Plans
//!    never taken (the run stopped, or its last launches) are dropped with the
//!    device's prepared batches (`LayerDevice::discard_prepared`).

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use scheduler::{LaunchPlan, LaunchedBatch, Relabeling};

use super::device::{PreparedTops, TopsAhead};
use crate::error::{Error, Result};
use crate::trace::{Tracer, TrackId};

/// One launched super-batch's batches as the device sampled them.
pub(crate) struct PlanRequest {
    /// Global super-batch.
    pub super_batch: u64,
    /// Per batch: its seed count and its bottom destinations (user ids), in
    /// position order (empty while `ahead` still reads them).
    pub batches: Vec<(usize, Vec<u32>)>,
    /// The device's read of the bottom destinations, when still in flight
    /// (`device.sample_ahead`): the thread waits for it (step 2) and fills
    /// `batches`' lists, and the sampled blocks go back with the plan.
    pub ahead: Option<TopsAhead>,
}

/// Step 2 on the thread: waits for `req`'s bottom destinations when they are
/// still being read (a `sample wait` slice), puts them into its batches, and
/// returns the sampled blocks to hand back.
fn wait_bottoms(inputs: &PlanInputs<'_>, req: &mut PlanRequest) -> Result<Option<PreparedTops>> {
    let Some(ahead) = req.ahead.take() else {
        return Ok(None);
    };
    let read = {
        let _slice = inputs.trace.map(|(t, track)| {
            t.slice_on(track, "sample wait")
                .super_batch(req.super_batch)
        });
        ahead.wait()?
    };
    if read.bottoms.len() != req.batches.len() {
        return Err(failed(format!(
            "super-batch {}: {} batches read for {} submitted",
            req.super_batch,
            read.bottoms.len(),
            req.batches.len()
        )));
    }
    for ((_, ids), bottom) in req.batches.iter_mut().zip(read.bottoms) {
        *ids = bottom;
    }
    Ok(Some(read.tops))
}

/// A finished plan.
#[derive(Debug, PartialEq)]
pub(crate) struct PlanReady {
    /// Global super-batch.
    pub super_batch: u64,
    /// The batches planned for every split up to the limit.
    pub plan: LaunchPlan,
    /// Per candidate split: (distinct CPU-hot destinations, hot positions)
    /// over the batches, seeds included (`policy = "auto"`'s counts).
    pub counts: Vec<(u64, u64)>,
}

/// What every plan of a run is made with.
#[derive(Clone, Copy)]
pub(crate) struct PlanInputs<'a> {
    /// User id → relabeled id.
    pub relabeling: &'a Relabeling,
    /// Plans serve splits whose CPU part is at most this.
    pub limit: u32,
    /// Candidate splits to count (empty: none).
    pub count_splits: &'a [u32],
    /// Fails the plan of this global super-batch (tests: an error surfaces).
    pub fail_at: Option<u64>,
    /// Where the thread's `plan` slices go (the `planner` track).
    pub trace: Option<(&'a Tracer, TrackId)>,
}

/// Step 3: the plan of `req`.
pub(crate) fn plan(inputs: &PlanInputs<'_>, req: PlanRequest) -> Result<PlanReady> {
    if inputs.fail_at == Some(req.super_batch) {
        return Err(failed(format!(
            "injected failure planning super-batch {}",
            req.super_batch
        )));
    }
    let n = inputs.relabeling.num_vertices();
    let launched = req
        .batches
        .into_iter()
        .map(|(seeds, mut ids)| {
            if let Some(&v) = ids.iter().find(|&&v| v as usize >= n) {
                return Err(failed(format!(
                    "bottom destination {v} of super-batch {} is not a vertex ({n} vertices)",
                    req.super_batch
                )));
            }
            for v in &mut ids {
                *v = inputs.relabeling.new_id(*v);
            }
            Ok(LaunchedBatch { seeds, bottom: ids })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(PlanReady {
        super_batch: req.super_batch,
        counts: count_splits(inputs.count_splits, &launched),
        plan: LaunchPlan::new(&launched, inputs.limit),
    })
}

/// `policy = "auto"`: what each candidate split would cost in these batches
/// (rows the CPU would compute, hot positions the accelerator would skip).
pub(crate) fn count_splits(splits: &[u32], launched: &[LaunchedBatch]) -> Vec<(u64, u64)> {
    if splits.is_empty() {
        return Vec::new();
    }
    let mut all: Vec<u32> = launched.iter().flat_map(|b| &b.bottom).copied().collect();
    all.sort_unstable();
    all.dedup();
    splits
        .iter()
        .map(|&c| {
            let rows = all.partition_point(|&v| v < c) as u64;
            let entries = launched
                .iter()
                .map(|b| b.bottom.iter().filter(|&&v| v < c).count() as u64)
                .sum::<u64>();
            (rows, entries)
        })
        .collect()
}

fn failed(what: impl Into<String>) -> Error {
    Error::Worker {
        worker: "planner".into(),
        what: what.into(),
    }
}

/// The accelerator thread's end of the planner (module doc).
pub(crate) struct Planner {
    requests: Option<Sender<PlanRequest>>,
    ready: Receiver<Result<(PlanReady, Option<PreparedTops>)>>,
    /// Super-batches submitted and not taken, oldest first.
    in_flight: VecDeque<u64>,
}

/// Counts the planner threads alive (tests check none outlives its run).
struct Alive(Arc<AtomicUsize>);

impl Alive {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(count)
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Planner {
    /// Step 1: starts the thread in `scope`; `alive` counts it while it runs.
    pub fn spawn<'scope, 'env>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        inputs: PlanInputs<'env>,
        alive: Arc<AtomicUsize>,
    ) -> Result<Self> {
        let (requests, inbox) = crossbeam_channel::unbounded::<PlanRequest>();
        let (outbox, ready) = crossbeam_channel::unbounded();
        let alive = Alive::new(alive);
        std::thread::Builder::new()
            .name("tandem-planner".into())
            .spawn_scoped(scope, move || {
                let _alive = alive;
                for mut req in inbox {
                    let g = req.super_batch;
                    let _slice = inputs
                        .trace
                        .map(|(t, track)| t.slice_on(track, "plan").super_batch(g));
                    let out = catch_unwind(AssertUnwindSafe(|| {
                        let tops = wait_bottoms(&inputs, &mut req)?;
                        plan(&inputs, req).map(|ready| (ready, tops))
                    }))
                    .unwrap_or_else(|p| {
                        let msg = p
                            .downcast_ref::<&str>()
                            .map(|s| (*s).to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "a panic".into());
                        Err(failed(format!("planning super-batch {g} panicked: {msg}")))
                    });
                    if outbox.send(out).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| failed(format!("cannot start the planner thread: {e}")))?;
        Ok(Self {
            requests: Some(requests),
            ready,
            in_flight: VecDeque::new(),
        })
    }

    /// Whether `super_batch` was submitted and not taken yet.
    pub fn pending(&self, super_batch: u64) -> bool {
        self.in_flight.contains(&super_batch)
    }

    /// Step 2.
    pub fn submit(&mut self, req: PlanRequest) -> Result<()> {
        let g = req.super_batch;
        let sent = self
            .requests
            .as_ref()
            .is_some_and(|tx| tx.send(req).is_ok());
        if !sent {
            return Err(failed("the planner thread is gone"));
        }
        self.in_flight.push_back(g);
        Ok(())
    }

    /// Whether the oldest plan in flight is ready (taking it will not block).
    pub fn ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Step 4: `super_batch`'s plan, which must be the oldest in flight, and
    /// its sampled blocks when the thread waited for their read; blocks until
    /// it is ready.
    pub fn take(&mut self, super_batch: u64) -> Result<(PlanReady, Option<PreparedTops>)> {
        match self.in_flight.front() {
            Some(&g) if g == super_batch => {}
            front => {
                return Err(Error::invalid_argument(
                    "orchestration",
                    format!(
                        "internal: the plan of super-batch {super_batch} was taken while \
                         {front:?} is the oldest in flight"
                    ),
                ))
            }
        }
        self.in_flight.pop_front();
        let ready = match self.ready.try_recv() {
            Ok(r) => r,
            Err(TryRecvError::Empty) => self
                .ready
                .recv()
                .map_err(|_| failed("the planner thread ended before answering"))?,
            Err(TryRecvError::Disconnected) => {
                return Err(failed("the planner thread ended before answering"))
            }
        }?;
        if ready.0.super_batch != super_batch {
            return Err(failed(format!(
                "answered super-batch {} for {super_batch}",
                ready.0.super_batch
            )));
        }
        Ok(ready)
    }
}

impl Drop for Planner {
    /// Step 6: closes the request channel so the thread ends.
    fn drop(&mut self) {
        self.requests = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpu_ops::Rng;

    fn relabeling(n: usize, seed: u64) -> Relabeling {
        let mut rng = Rng::new(seed);
        let scores: Vec<u64> = (0..n).map(|_| rng.below(1000)).collect();
        Relabeling::by_score(&scores, 0.3).unwrap()
    }

    fn request(rng: &mut Rng, g: u64, n: u32) -> PlanRequest {
        PlanRequest {
            ahead: None,
            super_batch: g,
            batches: (0..1 + rng.below(4))
                .map(|_| {
                    let len = rng.below(300) as usize;
                    let seeds = rng.below(len as u64 + 1) as usize;
                    (
                        seeds,
                        (0..len).map(|_| rng.below(n as u64) as u32).collect(),
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn the_thread_s_plans_equal_the_inline_computation() {
        let n = 5000u32;
        let r = relabeling(n as usize, 3);
        let splits = [r.hot_count(), r.hot_count() / 2, 7];
        let inputs = PlanInputs {
            relabeling: &r,
            limit: r.hot_count(),
            count_splits: &splits,
            fail_at: None,
            trace: None,
        };
        let alive = Arc::new(AtomicUsize::new(0));
        let mut rng = Rng::new(9);
        let requests: Vec<PlanRequest> = (0..40).map(|g| request(&mut rng, g, n)).collect();
        // Inline: relabel as the driver used to, then what the protocol did
        // with `Event::Launched` and the split counts the driver kept.
        let expected: Vec<PlanReady> = requests
            .iter()
            .map(|q| {
                let launched: Vec<LaunchedBatch> = q
                    .batches
                    .iter()
                    .map(|(seeds, ids)| LaunchedBatch {
                        seeds: *seeds,
                        bottom: ids.iter().map(|&v| r.new_id(v)).collect(),
                    })
                    .collect();
                PlanReady {
                    super_batch: q.super_batch,
                    plan: LaunchPlan::new(&launched, r.hot_count()),
                    counts: count_splits(&splits, &launched),
                }
            })
            .collect();
        std::thread::scope(|s| {
            let mut p = Planner::spawn(s, inputs, Arc::clone(&alive)).unwrap();
            // One ahead, as the driver submits.
            let mut it = requests.into_iter();
            p.submit(it.next().unwrap()).unwrap();
            for (g, want) in expected.iter().enumerate() {
                if let Some(q) = it.next() {
                    p.submit(q).unwrap();
                }
                assert!(p.pending(g as u64));
                let (got, tops) = p.take(g as u64).unwrap();
                assert_eq!(&got, want, "super-batch {g}");
                assert!(tops.is_none(), "no device read to hand back");
            }
        });
        assert_eq!(alive.load(Ordering::Acquire), 0);
    }

    #[test]
    fn a_failed_or_out_of_order_plan_is_an_error_not_a_hang() {
        let r = relabeling(100, 1);
        let alive = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|s| {
            let inputs = PlanInputs {
                relabeling: &r,
                limit: r.hot_count(),
                count_splits: &[],
                fail_at: Some(1),
                trace: None,
            };
            let mut p = Planner::spawn(s, inputs, Arc::clone(&alive)).unwrap();
            let req = |g| PlanRequest {
                super_batch: g,
                batches: vec![(1, vec![3, 4, 5])],
                ahead: None,
            };
            p.submit(req(0)).unwrap();
            p.submit(req(1)).unwrap();
            assert!(p.take(1).is_err(), "taken out of order");
            let mut p = Planner::spawn(s, inputs, Arc::clone(&alive)).unwrap();
            p.submit(req(0)).unwrap();
            p.submit(req(1)).unwrap();
            p.submit(PlanRequest {
                super_batch: 2,
                batches: vec![(0, vec![100])],
                ahead: None,
            })
            .unwrap();
            assert!(p.take(0).is_ok());
            let e = p.take(1).unwrap_err().to_string();
            assert!(e.contains("planner") && e.contains("injected"), "{e}");
            let e = p.take(2).unwrap_err().to_string();
            assert!(e.contains("not a vertex"), "{e}");
        });
        // Dropping the planners closed their channels; the scope joined both.
        assert_eq!(alive.load(Ordering::Acquire), 0);
    }
}
