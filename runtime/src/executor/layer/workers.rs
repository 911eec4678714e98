//! The CPU hot-row workers: threads that live as long as the trainer's
//! orchestrator, computing chunks of hot queues into staging buffers.
//!
//! # Protocol
//! 1. **Start** once ([`HotWorkers::start`]): `cpu_workers` threads, each with its
//!    own sampler scratch and a 1-thread rayon pool (its kernels must not queue
//!    behind the accelerator thread's rayon work), pinned to cores after the
//!    compute pool's when `threads.pin = "cores"`; `2 × workers + 2` staging
//!    buffers from the engine go into a free list.
//! 2. **Jobs** arrive on two crossbeam channels, urgent and regular; a worker
//!    takes an urgent job whenever one is waiting (biased choice), else blocks on
//!    both. Closing = dropping the senders; nothing polls.
//! 3. **Claim.** A regular job below the protocol's [`scheduler::Action::Retire`]
//!    watermark ([`scheduler::Job::droppable`]: every batch reading it has
//!    trained, or its epoch ended) is dropped unstarted and reported as such.
//!    Every job of one computation of a chunk (its regular job and an urgent
//!    duplicate promoting it) shares one claim flag: the first worker to claim
//!    it computes, the others skip it silently (protocol step 9).
//! 4. **Compute** with a staging buffer from the free list (blocking until the
//!    accelerator returns one) and the newest published weights, read once
//!    (the first worker to read a pending publication waits for its copies
//!    and copies it out; the others share that; a failure is this job's); the
//!    result (rows, version, busy time on the shared clock) goes back on the done
//!    channel with the staging buffer. Errors and panics (caught) are reported the
//!    same way, so the accelerator thread never waits for a message that cannot
//!    come.
//! 5. **Stop** when the orchestrator drops: the job senders close, every worker
//!    finishes at most its current chunk, and the threads are joined.

use parking_lot::Mutex;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{select, unbounded, Receiver, Sender};
use scheduler::ChunkKey;

use super::device::HotStaging;
use crate::error::{Error, Result};
use crate::trace::{FlowId, Tracer, TrackId};

use super::hot_compute::{HotComputer, HotScratch, Published};
use crate::clock::SharedClock;

/// A fault injected into a CPU worker (tests of the shutdown protocol and of the
/// monitor; only unit tests construct one, through `Trainer`'s test seam).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
pub enum InjectedFault {
    /// The worker returns an error after this many jobs.
    ErrorAfter(u64),
    /// The worker panics after this many jobs.
    PanicAfter(u64),
    /// The worker sleeps this long per vertex of every chunk, counted as busy
    /// time (a slow CPU).
    SlowCpu(Duration),
}

/// One CPU job: the protocol's order and what the driver added to carry it out.
pub(crate) struct Job {
    /// The protocol's job (its chunk, relabeled vertices, claim and urgency).
    pub order: scheduler::Job,
    /// The vertices' user ids, in queue order.
    pub ids: Arc<[u32]>,
    /// The sampling seed of the chunk's one hop.
    pub seed: u64,
    /// The flag of `order.claim`, shared by every job of one computation of the
    /// chunk; the first to set it computes.
    pub claim: Arc<AtomicBool>,
    /// Trace flow from the computation to the first batch reading it.
    pub flow: FlowId,
}

/// How a job ended.
pub(crate) enum Outcome {
    /// `rows` rows computed with weights of `version`, in `staging`.
    Rows {
        version: u64,
        rows: usize,
        staging: Box<dyn HotStaging>,
    },
    /// Not started: below the retire watermark.
    Dropped,
    /// The worker failed (error or panic).
    Failed(Error),
}

/// A job's report.
pub(crate) struct Done {
    pub key: ChunkKey,
    pub outcome: Outcome,
    /// Seconds of worker time it took (shared clock, injected slowness included).
    pub busy_secs: f64,
}

/// State the workers share with the orchestrator.
pub(crate) struct WorkerShared {
    pub published: Published,
    /// The newest [`scheduler::Action::Retire`] watermark: regular jobs of
    /// global super-batches below it are dropped.
    pub retired: Arc<AtomicU64>,
    pub fault: Mutex<Option<InjectedFault>>,
    pub clock: SharedClock,
    /// Where the workers' slices go, and each worker's track.
    pub tracer: Mutex<(Tracer, Vec<TrackId>)>,
}

/// The worker threads and their channels.
pub(crate) struct HotWorkers {
    urgent: Option<Sender<Job>>,
    regular: Option<Sender<Job>>,
    done: Receiver<Done>,
    free: Sender<Box<dyn HotStaging>>,
    shared: Arc<WorkerShared>,
    handles: Vec<JoinHandle<()>>,
}

/// Worker `i`'s loop input.
struct WorkerCtx {
    index: usize,
    computer: Arc<HotComputer>,
    shared: Arc<WorkerShared>,
    urgent: Receiver<Job>,
    regular: Receiver<Job>,
    done: Sender<Done>,
    free: Receiver<Box<dyn HotStaging>>,
    pin: Option<usize>,
}

impl HotWorkers {
    /// Step 1: `count` workers computing with `computer`, staging buffers of
    /// `chunk_rows` rows each from `staging`.
    pub(crate) fn start(
        count: usize,
        computer: HotComputer,
        shared: Arc<WorkerShared>,
        chunk_rows: usize,
        mut staging: impl FnMut(usize) -> Result<Box<dyn HotStaging>>,
        pin_from: Option<usize>,
    ) -> Result<Self> {
        let count = count.max(1);
        let (urgent_tx, urgent_rx) = unbounded::<Job>();
        let (regular_tx, regular_rx) = unbounded::<Job>();
        let (done_tx, done_rx) = unbounded::<Done>();
        let (free_tx, free_rx) = unbounded::<Box<dyn HotStaging>>();
        for _ in 0..2 * count + 2 {
            free_tx
                .send(staging(chunk_rows)?)
                .map_err(|_| Error::Worker {
                    worker: "hot workers".into(),
                    what: "internal: staging list closed".into(),
                })?;
        }
        let computer = Arc::new(computer);
        let mut handles = Vec::with_capacity(count);
        for index in 0..count {
            let ctx = WorkerCtx {
                index,
                computer: Arc::clone(&computer),
                shared: Arc::clone(&shared),
                urgent: urgent_rx.clone(),
                regular: regular_rx.clone(),
                done: done_tx.clone(),
                free: free_rx.clone(),
                pin: pin_from.map(|p| p + index),
            };
            let h = std::thread::Builder::new()
                .name(format!("tandem-hot-{index}"))
                .spawn(move || worker(ctx))
                .map_err(|e| Error::Worker {
                    worker: format!("hot worker {index}"),
                    what: format!("could not start: {e}"),
                })?;
            handles.push(h);
        }
        Ok(Self {
            urgent: Some(urgent_tx),
            regular: Some(regular_tx),
            done: done_rx,
            free: free_tx,
            shared,
            handles,
        })
    }

    /// What the workers share.
    pub(crate) fn shared(&self) -> &Arc<WorkerShared> {
        &self.shared
    }

    /// Routes the workers' slices to `tracer`, worker `i` on `tracks[i]`.
    pub(crate) fn set_trace(&self, tracer: &Tracer, tracks: &[TrackId]) {
        *self.shared.tracer.lock() = (tracer.clone(), tracks.to_vec());
    }

    /// Queues a job (step 2).
    pub(crate) fn push(&self, job: Job) -> Result<()> {
        let tx = if job.order.urgent.is_some() {
            &self.urgent
        } else {
            &self.regular
        };
        tx.as_ref()
            .ok_or_else(stopped)?
            .send(job)
            .map_err(|_| self.why_stopped())
    }

    /// The error that stopped the workers: a failure report still waiting, or
    /// "every worker has stopped".
    fn why_stopped(&self) -> Error {
        while let Ok(d) = self.done.try_recv() {
            if let Outcome::Failed(e) = d.outcome {
                return e;
            }
        }
        stopped()
    }

    /// The next report, if one is waiting.
    pub(crate) fn try_done(&self) -> Option<Done> {
        self.done.try_recv().ok()
    }

    /// Blocks for the next report.
    pub(crate) fn wait_done(&self) -> Result<Done> {
        self.done.recv().map_err(|_| self.why_stopped())
    }

    /// Gives a staging buffer back to the free list.
    pub(crate) fn recycle(&self, staging: Box<dyn HotStaging>) {
        // The workers hold the receiver as long as `self` lives.
        let _ = self.free.send(staging);
    }
}

fn stopped() -> Error {
    Error::Worker {
        worker: "hot workers".into(),
        what: "every worker has stopped".into(),
    }
}

impl Drop for HotWorkers {
    /// Step 5.
    fn drop(&mut self) {
        self.urgent.take();
        self.regular.take();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// The next job: urgent first (step 2). `None` once both channels closed.
fn next_job(urgent: &Receiver<Job>, regular: &Receiver<Job>) -> Option<Job> {
    if let Ok(j) = urgent.try_recv() {
        return Some(j);
    }
    // Either may be closed; then only the other can still deliver.
    select! {
        recv(urgent) -> j => j.ok().or_else(|| regular.recv().ok()),
        recv(regular) -> j => j.ok().or_else(|| urgent.recv().ok()),
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".into())
}

/// Steps 2–4 for one worker.
fn worker(ctx: WorkerCtx) {
    let name = format!("hot worker {}", ctx.index);
    if let Some(core) = ctx.pin {
        // Pinning is best effort for hot workers: an unpinned worker still works.
        let _ = crate::pool::pin_current_thread(core);
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build();
    let mut scratch = HotScratch::new(ctx.computer.ds.num_vertices());
    let mut jobs_done = 0u64;
    while let Some(job) = next_job(&ctx.urgent, &ctx.regular) {
        let key = job.order.key;
        if job
            .order
            .droppable(ctx.shared.retired.load(Ordering::Acquire))
        {
            let _ = ctx.done.send(Done {
                key,
                outcome: Outcome::Dropped,
                busy_secs: 0.0,
            });
            continue;
        }
        if job.claim.swap(true, Ordering::AcqRel) {
            continue;
        }
        let Ok(staging) = ctx.free.recv() else { return };
        let start = ctx.shared.clock.now();
        let fault = *ctx.shared.fault.lock();
        let result = match (&pool, fault) {
            (Err(e), _) => Err(Error::Worker {
                worker: name.clone(),
                what: format!("could not build its thread pool: {e}"),
            }),
            (_, Some(InjectedFault::ErrorAfter(n))) if jobs_done >= n => Err(Error::Worker {
                worker: name.clone(),
                what: "injected failure".into(),
            }),
            (Ok(pool), _) => {
                let r = catch_unwind(AssertUnwindSafe(|| {
                    if let Some(InjectedFault::PanicAfter(n)) = fault {
                        if jobs_done >= n {
                            panic!("injected panic in {name}");
                        }
                    }
                    compute(&ctx, &job, staging, &mut scratch, pool, fault)
                }));
                match r {
                    Ok(r) => r,
                    Err(p) => Err(Error::Worker {
                        worker: name.clone(),
                        what: format!("panicked: {}", panic_message(&*p)),
                    }),
                }
            }
        };
        jobs_done += 1;
        let busy_secs = (ctx.shared.clock.now().saturating_sub(start)).as_secs_f64();
        let outcome = match result {
            Ok((version, rows, staging)) => Outcome::Rows {
                version,
                rows,
                staging,
            },
            Err(e) => Outcome::Failed(e),
        };
        let failed = matches!(outcome, Outcome::Failed(_));
        let _ = ctx.done.send(Done {
            key,
            outcome,
            busy_secs,
        });
        if failed {
            return;
        }
    }
}

/// Step 4: one chunk.
fn compute(
    ctx: &WorkerCtx,
    job: &Job,
    mut staging: Box<dyn HotStaging>,
    scratch: &mut HotScratch,
    pool: &rayon::ThreadPool,
    fault: Option<InjectedFault>,
) -> Result<(u64, usize, Box<dyn HotStaging>)> {
    let weights = ctx.shared.published.newest()?;
    let (tracer, track) = {
        let t = ctx.shared.tracer.lock();
        (t.0.clone(), t.1.get(ctx.index).copied())
    };
    let mut slice = track.map(|track| {
        tracer
            .slice_on(track, "hot compute")
            .super_batch(job.order.key.super_batch)
    });
    if let Some(s) = slice.as_mut() {
        s.flow_out(job.flow);
    }
    if job.ids.len() > staging.capacity_rows() {
        return Err(Error::invalid_argument(
            "hot chunk",
            format!(
                "internal: {} rows for a staging buffer of {}",
                job.ids.len(),
                staging.capacity_rows()
            ),
        ));
    }
    if let Some(InjectedFault::SlowCpu(per_vertex)) = fault {
        std::thread::sleep(per_vertex.saturating_mul(job.ids.len() as u32));
    }
    pool.install(|| {
        ctx.computer
            .compute_into(&job.ids, &weights, job.seed, scratch, staging.rows_mut())
    })?;
    staging.seal(job.ids.len());
    drop(slice);
    Ok((weights.version, job.ids.len(), staging))
}
