//! The protocol alone, driven with scripted events: it makes the decisions the
//! runtime's accelerator thread carries out (its driver,
//! `runtime/src/executor/layer/pipeline.rs`, decides nothing itself) in the
//! scenarios the runtime's tests cover (`runtime/tests/orchestration.rs`): a
//! late chunk under `on_late =
//! "wait"` gets an urgent job and the gate waits; under `"compute"` its
//! vertices stay cold; a stale ready chunk is recomputed after a publication;
//! a bound below the on-time gap publishes after every batch; jobs of finished
//! super-batches become droppable; a stop ends the epoch cleanly.

use std::ops::Range;

use scheduler::{
    Action, BottomHops, ChunkKey, Event, HotSplit, Job, LaunchedBatch, OnLate, PipelineConfig,
    Protocol, ProtocolConfig, Publication, ReportId, SchedulerError, SuperBatchHot, TrainBatch,
    Urgent,
};

/// `N = 2`, `D = 1`, chunks of at most 2: an on-time gap of 3.
fn pipeline() -> PipelineConfig {
    PipelineConfig::new(2, 1, 2).unwrap()
}

/// Bottom destinations of epoch batch `k`: its seed first (a relabeled id
/// outside the hot set), then hot ids of the hot set `0..4`.
fn bottom(k: usize) -> Vec<u32> {
    let hot: &[u32] = match k % 4 {
        0 => &[0, 1],
        1 => &[1, 2],
        2 => &[0, 3],
        _ => &[2, 3],
    };
    std::iter::once(100 + k as u32)
        .chain(hot.iter().copied())
        .collect()
}

/// A protocol and the actions it emitted, answering launches itself; its
/// publications' copies resolve as soon as they are polled.
struct Script {
    p: Protocol,
    log: Vec<Action>,
    /// The newest version published.
    published: u64,
}

impl Script {
    fn new(cfg: ProtocolConfig) -> Self {
        Self {
            p: Protocol::new(cfg),
            log: Vec::new(),
            published: 0,
        }
    }

    fn with(bound: u64, on_late: OnLate) -> Self {
        Self::new(ProtocolConfig::new(pipeline(), bound, on_late))
    }

    fn start(&mut self, batches: Range<usize>, version: u64) {
        self.p
            .handle(Event::EpochStarted {
                batches,
                version,
                loss_lag: 1,
                window: None,
            })
            .unwrap();
        self.published = version;
    }

    /// Polls, answering every launch (split: the whole hot set on the CPU),
    /// up to and including the next `Train`, `Wait` or `Finished`, or until the
    /// protocol awaits an answer; returns the actions polled.
    fn step(&mut self) -> Vec<Action> {
        self.step_to(|a| {
            matches!(
                a,
                Action::Train(_) | Action::Wait { .. } | Action::Finished { .. }
            )
        })
    }

    /// [`Script::step`], up to and including the first action `last` accepts.
    fn step_to(&mut self, last: impl Fn(&Action) -> bool) -> Vec<Action> {
        let mut out = Vec::new();
        while let Some(a) = self.p.poll().unwrap() {
            out.push(a.clone());
            self.log.push(a.clone());
            match a {
                Action::Launch {
                    super_batch,
                    batches,
                    ..
                } => self.p.handle(launched(super_batch, batches)).unwrap(),
                Action::Publish { version, .. } => {
                    self.published = version;
                    self.p
                        .handle(Event::PublicationResolved { version })
                        .unwrap();
                }
                a if last(&a) => break,
                _ => {}
            }
        }
        out
    }

    fn report(&mut self, super_batch: u64, chunk: u32, version: u64, rows: u32) {
        self.p
            .handle(Event::ChunkComputed {
                key: ChunkKey { super_batch, chunk },
                version,
                rows,
            })
            .unwrap();
    }

    fn trained(&mut self, batch: usize, version: u64) {
        self.p
            .handle(Event::BatchTrained { batch, version })
            .unwrap();
    }

    /// Steps to the next training order, which it returns.
    fn train(&mut self) -> TrainBatch {
        match self.step().pop() {
            Some(Action::Train(t)) => t,
            other => panic!("expected a training order, got {other:?}"),
        }
    }

    /// The regular jobs queued so far.
    fn regular_jobs(&self) -> Vec<&Job> {
        self.log
            .iter()
            .filter_map(|a| match a {
                Action::QueueJob(j) if j.urgent.is_none() => Some(j),
                _ => None,
            })
            .collect()
    }
}

/// The answer to the launch of `batches` (global super-batch `super_batch`):
/// each batch's [`bottom`], its seed first; the whole hot set on the CPU.
fn launched(super_batch: u64, batches: Range<usize>) -> Event {
    Event::Launched {
        super_batch,
        split: HotSplit::all_cpu(4),
        batches: batches
            .map(|k| LaunchedBatch {
                seeds: 1,
                bottom: bottom(k),
            })
            .collect(),
    }
}

fn key(super_batch: u64, chunk: u32) -> ChunkKey {
    ChunkKey { super_batch, chunk }
}

fn names(actions: &[Action]) -> Vec<&'static str> {
    actions.iter().map(Action::name).collect()
}

#[test]
fn an_epoch_launches_a_stage_ahead_and_gates_every_batch() {
    let mut s = Script::with(3, OnLate::Wait);
    s.start(0..4, 0);
    let first = s.step();
    assert_eq!(
        names(&first),
        [
            "Publish",
            "Launch",
            "SampleBottoms",
            "ReserveSlab",
            "QueueJob",
            "QueueJob",
            "Launch",
            "SampleBottoms",
            "ReserveSlab",
            "QueueJob",
            "QueueJob",
            "BeginSuperBatch",
            "Gate",
            "QueueJob",
            "Wait"
        ]
    );
    assert_eq!(
        first[0],
        Action::Publish {
            version: 0,
            reset: true
        }
    );
    assert_eq!(
        first[1],
        Action::Launch {
            super_batch: 0,
            local: 0,
            batches: 0..2
        }
    );
    // Its batches' bottom hops, a super-batch ahead, each skipping its
    // planned hot positions (its seed first, then two hot ids).
    assert_eq!(
        first[2],
        Action::SampleBottoms {
            super_batch: 0,
            batches: 0..2,
            skip: vec![vec![1, 2], vec![1, 2]]
        }
    );
    // Super-batch 0's queue: hot ids {0, 1, 2} of batches 0 and 1 (their seeds
    // 100 and 101 are not hot), cut into [0, 1] and [2]; slab 0.
    assert_eq!(
        first[3],
        Action::ReserveSlab {
            slab: 0,
            rows: 3,
            super_batch: 0
        }
    );
    let jobs = s.regular_jobs();
    assert_eq!(jobs.len(), 4);
    assert_eq!((jobs[0].key, jobs[0].rows.clone()), (key(0, 0), 0..2));
    assert_eq!(jobs[0].vertices, vec![0, 1]);
    assert_eq!(
        (jobs[1].key, jobs[1].vertices.clone()),
        (key(0, 1), vec![2])
    );
    // Super-batch 1 goes into slab 1: queue {0, 2, 3}.
    assert_eq!(
        first[8],
        Action::ReserveSlab {
            slab: 1,
            rows: 3,
            super_batch: 1
        }
    );
    assert_eq!(jobs[2].vertices, vec![0, 2]);
    // Every claim is fresh.
    let mut claims: Vec<_> = jobs.iter().map(|j| j.claim).collect();
    claims.dedup();
    assert_eq!(claims.len(), 4);
    assert_eq!(
        first[12],
        Action::Gate {
            batch: 0,
            version: 0
        }
    );
}

#[test]
fn wait_a_late_chunk_gets_an_urgent_duplicate_and_the_gate_waits() {
    let mut s = Script::with(3, OnLate::Wait);
    s.start(0..4, 0);
    let acts = s.step();
    // Batch 0 reads chunk 0 of super-batch 0 (positions 1 and 2): not computed.
    let regular = s.regular_jobs()[0].clone();
    let Action::QueueJob(urgent) = &acts[acts.len() - 2] else {
        panic!("{acts:?}")
    };
    assert_eq!(urgent.key, key(0, 0));
    assert_eq!(
        urgent.urgent,
        Some(Urgent {
            seq: 1,
            recompute: false,
            batch: 0
        })
    );
    // A promotion: it shares the regular job's claim (whichever starts first).
    assert_eq!(urgent.claim, regular.claim);
    assert_eq!(
        acts.last(),
        Some(&Action::Wait {
            batch: 0,
            late_chunks: 1,
            late_vertices: 2
        })
    );
    // Without a report the gate waits again, with no second urgent job.
    assert_eq!(names(&s.step()), ["Wait"]);
    // A report of another chunk installs it and the gate still waits.
    s.report(0, 1, 0, 1);
    assert_eq!(names(&s.step()), ["Install", "Wait"]);
    s.report(0, 0, 0, 2);
    let acts = s.step();
    assert_eq!(
        acts[0],
        Action::Install {
            report: ReportId(1),
            key: key(0, 0),
            slab: 0,
            rows: 0..2,
            version: 0
        }
    );
    let Action::Train(t) = &acts[1] else {
        panic!("{acts:?}")
    };
    assert_eq!((t.batch, t.version, t.slab), (0, 0, 0));
    assert_eq!(
        (t.positions.clone(), t.rows.clone()),
        (vec![1, 2], vec![0, 1])
    );
    assert!(t.cold.is_empty());
    assert_eq!((t.max_gap, t.first_reads.clone()), (Some(0), vec![0]));
    let stats = s.p.epoch_stats().unwrap();
    assert_eq!((stats.waited, stats.wait_batches), (2, 1));
    assert_eq!((stats.urgent_jobs, stats.recomputations), (1, 0));
    assert_eq!(
        (stats.hot_uses, stats.installs, stats.rows_installed),
        (2, 2, 3)
    );
    assert_eq!(stats.computed_cold, 0);
}

/// A concurrent driver hands reports in before every poll, so the report a gate
/// waits for may come in after the gate decided to wait and before the driver
/// polled the `Wait`: the `Wait` is withdrawn and the gate decides again (a
/// driver blocking on it would wait for a report it already handed in).
#[test]
fn a_report_handed_in_before_the_wait_is_polled_withdraws_it() {
    let mut s = Script::with(3, OnLate::Wait);
    s.start(0..4, 0);
    let acts = s.step_to(|a| matches!(a, Action::QueueJob(j) if j.urgent.is_some()));
    assert!(!names(&acts).contains(&"Wait"), "{acts:?}");
    // The regular job of chunk 0 (batch 0's late chunk) reports now.
    s.report(0, 0, 0, 2);
    let acts = s.step();
    assert_eq!(names(&acts), ["Install", "Train"]);
    let Action::Train(t) = &acts[1] else {
        panic!("{acts:?}")
    };
    assert_eq!((t.batch, t.positions.clone()), (0, vec![1, 2]));
    // A report the gate does not wait for (super-batch 1's) withdraws the Wait
    // too; the gate then waits again, with no second urgent job.
    s.trained(0, 1);
    let acts = s.step_to(|a| matches!(a, Action::QueueJob(j) if j.urgent.is_some()));
    assert_eq!(acts.last().map(Action::name), Some("QueueJob"), "{acts:?}");
    s.report(1, 0, 0, 2);
    assert_eq!(names(&s.step()), ["Install", "Wait"]);
}

#[test]
fn compute_a_late_chunk_stays_cold_and_nothing_waits() {
    let mut s = Script::with(3, OnLate::Compute);
    s.start(0..4, 0);
    // No chunk is computed yet.
    let t = s.train();
    // Batch 0 reads only chunk 0: both its hot positions stay cold.
    assert_eq!((t.positions.clone(), t.cold.clone()), (vec![], vec![1, 2]));
    assert_eq!(t.max_gap, None);
    s.trained(0, 1);
    s.report(0, 1, 0, 1);
    let t = s.train();
    // Batch 1 reads vertex 1 (chunk 0, late, cold) and vertex 2 (chunk 1: the
    // report above, of version 0, installed at its gate; gap 1).
    assert_eq!((t.positions.clone(), t.rows.clone()), (vec![2], vec![2]));
    assert_eq!((t.cold.clone(), t.max_gap), (vec![1], Some(1)));
    assert!(!s.log.iter().any(|a| matches!(a, Action::Wait { .. })));
    assert!(!s
        .log
        .iter()
        .any(|a| matches!(a, Action::QueueJob(j) if j.urgent.is_some())));
    let stats = s.p.epoch_stats().unwrap();
    assert_eq!(
        (stats.computed_cold, stats.hot_uses, stats.urgent_jobs),
        (3, 1, 0)
    );
    assert_eq!(stats.gaps.count(1), 1);
}

#[test]
fn a_stale_ready_chunk_is_recomputed_after_a_publication() {
    // Bound 0 with one publication per super-batch: the rows computed with the
    // weights of version 0 are stale at batch 1.
    let mut cfg = ProtocolConfig::new(pipeline(), 0, OnLate::Wait);
    cfg.publication = Publication::EverySuperBatch;
    let mut s = Script::new(cfg);
    s.start(0..4, 0);
    s.step();
    s.report(0, 0, 0, 2);
    s.report(0, 1, 0, 1);
    let acts = s.step();
    assert_eq!(names(&acts), ["Install", "Install", "Train"]);
    s.trained(0, 1);
    let acts = s.step();
    assert_eq!(
        names(&acts),
        [
            "ShowLosses",
            "Gate",
            "Publish",
            "QueueJob",
            "QueueJob",
            "Wait"
        ]
    );
    assert_eq!(
        acts[2],
        Action::Publish {
            version: 1,
            reset: false
        }
    );
    let regular = s.regular_jobs()[0].claim;
    let Action::QueueJob(re) = &acts[3] else {
        panic!()
    };
    assert_eq!(
        (re.key, re.urgent.map(|u| u.recompute)),
        (key(0, 0), Some(true))
    );
    // A recomputation has a claim of its own: the regular job's claim was taken.
    assert_ne!(re.claim, regular);
    // A late report of the old computation is no newer: discarded.
    s.report(0, 0, 0, 2);
    assert_eq!(names(&s.step()), ["Discard", "Wait"]);
    s.report(0, 0, 1, 2);
    assert_eq!(names(&s.step()), ["Install", "Wait"]);
    s.report(0, 1, 1, 1);
    let acts = s.step();
    let Some(Action::Train(t)) = acts.last() else {
        panic!("{acts:?}")
    };
    assert_eq!((t.version, t.max_gap), (1, Some(0)));
    let stats = s.p.epoch_stats().unwrap();
    // Batch 0's gate promoted chunk 0 before its rows came.
    assert_eq!((stats.recomputations, stats.urgent_jobs), (2, 3));
    assert_eq!((stats.publications, stats.discarded), (2, 1));
    assert_eq!(stats.gaps.max(), Some(0));
}

#[test]
fn a_bound_below_the_on_time_gap_publishes_after_every_batch() {
    for (bound, every_batch) in [(1, true), (2, true), (3, false), (9, false)] {
        let mut s = Script::with(bound, OnLate::Compute);
        s.start(0..4, 0);
        let mut publications = Vec::new();
        for k in 0..4 {
            let t = s.train();
            assert_eq!(t.batch, k);
            s.trained(k, k as u64 + 1);
            let pre: Vec<Action> = std::iter::from_fn(|| s.p.poll().unwrap())
                .take_while(|a| !matches!(a, Action::Gate { .. } | Action::Finished { .. }))
                .collect();
            publications.extend(pre.iter().filter_map(|a| match a {
                Action::Publish { version, .. } => Some(*version),
                _ => None,
            }));
            s.log.extend(pre);
        }
        let want: Vec<u64> = if every_batch {
            vec![1, 2, 3, 4]
        } else {
            vec![2, 4]
        };
        assert_eq!(publications, want, "bound {bound}");
    }
}

#[test]
fn jobs_of_finished_super_batches_become_droppable() {
    let mut s = Script::with(3, OnLate::Compute);
    s.start(0..6, 0);
    s.train();
    s.trained(0, 1);
    s.train();
    s.trained(1, 2);
    // After super-batch 0's last batch: retire it, publish, end it.
    let acts: Vec<Action> = std::iter::from_fn(|| s.p.poll().unwrap())
        .take_while(|a| !matches!(a, Action::Gate { .. }))
        .collect();
    assert_eq!(
        acts,
        vec![
            Action::ShowLosses {
                batches: 1..2,
                rewind: 0
            },
            Action::Retire { below: 1 },
            Action::Publish {
                version: 2,
                reset: false
            },
            Action::EndSuperBatch {
                super_batch: 0,
                local: 0,
                observe: false,
                hot: SuperBatchHot {
                    queue_rows: 3,
                    ..SuperBatchHot::default()
                },
            },
            Action::BeginSuperBatch {
                super_batch: 1,
                local: 1
            },
            Action::Launch {
                super_batch: 2,
                local: 2,
                batches: 4..6
            },
        ]
    );
    assert_eq!(s.p.retired_below(), 1);
    let jobs: Vec<Job> = s.regular_jobs().into_iter().cloned().collect();
    for j in &jobs {
        assert_eq!(j.droppable(1), j.key.super_batch == 0, "{j:?}");
    }
    // A report of a finished super-batch is only given back.
    s.report(0, 0, 0, 2);
    let acts = s.p.poll().unwrap();
    assert!(matches!(acts, Some(Action::Discard { .. })), "{acts:?}");
    s.p.handle(Event::JobDropped { key: key(0, 1) }).unwrap();
    assert_eq!(s.p.epoch_stats().unwrap().dropped_jobs, 1);
}

#[test]
fn the_epoch_ends_retiring_everything_and_the_next_continues_the_numbering() {
    let mut s = Script::with(3, OnLate::Compute);
    s.start(0..5, 7);
    let mut ends = Vec::new();
    for k in 0..5 {
        let t = s.train();
        assert_eq!((t.batch, t.version), (k, 7 + k as u64));
        s.trained(k, 8 + k as u64);
    }
    let rest = s.step();
    for a in &s.log {
        if let Action::EndSuperBatch { local, observe, .. } = a {
            ends.push((*local, *observe));
        }
    }
    // Three super-batches (the last has one batch): only the middle is observed.
    assert_eq!(ends, vec![(0, false), (1, true), (2, false)]);
    // The last super-batch's retirement retires the whole epoch.
    assert_eq!(
        names(&rest),
        [
            "ShowLosses",
            "Retire",
            "Publish",
            "EndSuperBatch",
            "Finished"
        ]
    );
    assert_eq!(rest[1], Action::Retire { below: 3 });
    assert_eq!(s.p.retired_below(), 3);
    let Action::Finished { stats, stopped } = &rest[4] else {
        panic!("{rest:?}")
    };
    assert!(!stopped);
    assert_eq!(stats.computed_cold, 10);
    assert!(!s.p.running());
    assert_eq!(s.p.poll().unwrap(), None);
    // The next epoch (after an interruption at batch 2) numbers on from 3.
    s.start(2..4, 12);
    let acts = s.step();
    assert!(acts.contains(&Action::Launch {
        super_batch: 3,
        local: 0,
        batches: 2..4
    }));
    let t = match acts.last() {
        Some(Action::Train(t)) => t.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!((t.batch, t.version, t.slab), (2, 12, 1));
}

#[test]
fn a_batch_s_own_seeds_never_read_hot_rows() {
    let mut s = Script::with(3, OnLate::Compute);
    s.start(0..2, 0);
    s.p.poll().unwrap();
    s.p.poll().unwrap();
    // Seeds: the first two destinations, both hot; then hot 2 and cold 9.
    s.p.handle(Event::Launched {
        super_batch: 0,
        split: HotSplit::all_cpu(4),
        batches: vec![
            LaunchedBatch {
                seeds: 2,
                bottom: vec![0, 1, 2, 9],
            },
            LaunchedBatch {
                seeds: 1,
                bottom: vec![3, 0],
            },
        ],
    })
    .unwrap();
    let acts = s.step();
    // Queue: 2 (batch 0, position 2) and 0 (batch 1, position 1): {0, 2}.
    assert!(acts.contains(&Action::ReserveSlab {
        slab: 0,
        rows: 2,
        super_batch: 0
    }));
    let Some(Action::Train(t)) = acts.last() else {
        panic!("{acts:?}")
    };
    assert_eq!(t.cold, vec![2]);
}

#[test]
fn a_stop_turns_pending_installs_into_discards_and_finishes() {
    let mut s = Script::with(0, OnLate::Wait);
    s.start(0..4, 0);
    assert_eq!(names(&s.step()).last(), Some(&"Wait"));
    s.report(0, 0, 0, 2);
    s.report(1, 1, 0, 1);
    s.p.handle(Event::Stop).unwrap();
    let acts: Vec<Action> = std::iter::from_fn(|| s.p.poll().unwrap()).collect();
    assert_eq!(names(&acts), ["Discard", "Discard", "Retire", "Finished"]);
    assert_eq!(acts[2], Action::Retire { below: 2 });
    let Action::Finished { stats, stopped } = &acts[3] else {
        panic!()
    };
    assert!(*stopped);
    assert_eq!((stats.installs, stats.discarded, stats.jobs), (0, 2, 2));
    assert!(!s.p.running());
}

#[test]
fn out_of_turn_events_and_rows_from_the_future_are_refused() {
    let mut s = Script::with(3, OnLate::Wait);
    assert!(matches!(
        s.p.handle(Event::BatchTrained {
            batch: 0,
            version: 1
        }),
        Err(SchedulerError::UnexpectedEvent { .. })
    ));
    s.start(0..4, 5);
    s.p.poll().unwrap();
    assert!(matches!(s.p.poll().unwrap(), Some(Action::Launch { .. })));
    // Awaiting the launch: nothing to do, and no other answer fits.
    assert_eq!(s.p.poll().unwrap(), None);
    let e =
        s.p.handle(Event::Launched {
            super_batch: 1,
            split: HotSplit::all_cpu(4),
            batches: vec![],
        })
        .unwrap_err();
    assert!(e.to_string().contains("Launched"), "{e}");
    assert!(s
        .p
        .handle(Event::BatchTrained {
            batch: 0,
            version: 6
        })
        .is_err());
    // The right answer with the wrong number of batches.
    assert!(s
        .p
        .handle(Event::Launched {
            super_batch: 0,
            split: HotSplit::all_cpu(4),
            batches: vec![LaunchedBatch::default()],
        })
        .is_err());
    let mut s = Script::with(3, OnLate::Wait);
    s.start(0..4, 5);
    s.step();
    // Rows computed with weights newer than the current ones.
    let e =
        s.p.handle(Event::ChunkComputed {
            key: key(0, 0),
            version: 6,
            rows: 2,
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            SchedulerError::VersionAhead {
                embedding: 6,
                current: 5
            }
        ),
        "{e}"
    );
    // A training answer more than one step ahead.
    let mut s = Script::with(3, OnLate::Compute);
    s.start(0..4, 0);
    s.train();
    assert!(s
        .p
        .handle(Event::BatchTrained {
            batch: 0,
            version: 2
        })
        .is_err());
    // A skipped step (a non-finite loss) leaves the version.
    s.trained(0, 0);
    assert_eq!(s.train().version, 0);
}

/// Drives one epoch of random batches to its end, answering every launch with
/// `answer` (the split changes per super-batch as a monitor's would), every job
/// with a report at the current version and every training order with a
/// step; returns every action polled.
fn drive_random(
    seed: u64,
    answer: impl Fn(u64, HotSplit, Vec<LaunchedBatch>) -> Event,
) -> Vec<Action> {
    let mut rng = cpu_ops::Rng::new(seed);
    let (hot, batches) = (200u32, 11usize);
    let bottoms: Vec<LaunchedBatch> = (0..batches)
        .map(|_| {
            let n = 1 + rng.below(120) as usize;
            LaunchedBatch {
                seeds: 1 + rng.below(n as u64) as usize,
                bottom: (0..n).map(|_| rng.below(2 * hot as u64) as u32).collect(),
            }
        })
        .collect();
    let splits: Vec<u32> = (0..8).map(|_| rng.below(hot as u64 + 1) as u32).collect();
    let bound = rng.below(6);
    let on_late = if rng.below(2) == 0 {
        OnLate::Wait
    } else {
        OnLate::Compute
    };
    let mut p = Protocol::new(ProtocolConfig::new(
        PipelineConfig::new(3, 1, 16).unwrap(),
        bound,
        on_late,
    ));
    p.handle(Event::EpochStarted {
        batches: 0..batches,
        version: 0,
        loss_lag: 1,
        window: None,
    })
    .unwrap();
    let (mut log, mut version, mut jobs) = (Vec::new(), 0u64, Vec::new());
    // The newest publication (its copies resolve at once): jobs read it.
    let mut published = 0u64;
    loop {
        let Some(a) = p.poll().unwrap() else {
            // A wait with no job running: report the oldest queued job.
            let j: Job = jobs.remove(0);
            p.handle(Event::ChunkComputed {
                key: j.key,
                version: published,
                rows: j.vertices.len() as u32,
            })
            .unwrap();
            continue;
        };
        log.push(a.clone());
        match a {
            Action::Launch {
                super_batch,
                batches,
                ..
            } => {
                let split = HotSplit::new(hot, splits[super_batch as usize % 8]).unwrap();
                let b = bottoms[batches].to_vec();
                p.handle(answer(super_batch, split, b)).unwrap();
            }
            Action::QueueJob(j) => jobs.push(j),
            Action::Publish { version: v, .. } => {
                published = v;
                p.handle(Event::PublicationResolved { version: v }).unwrap();
            }
            Action::Wait { .. } if !jobs.is_empty() => {
                let j = jobs.remove(0);
                p.handle(Event::ChunkComputed {
                    key: j.key,
                    version: published,
                    rows: j.vertices.len() as u32,
                })
                .unwrap();
            }
            Action::Train(t) => {
                // Every other chunk is computed before the step, the rest late.
                if t.batch % 2 == 0 {
                    for j in jobs.drain(..) {
                        p.handle(Event::ChunkComputed {
                            key: j.key,
                            version: published,
                            rows: j.vertices.len() as u32,
                        })
                        .unwrap();
                    }
                }
                version += 1;
                p.handle(Event::BatchTrained {
                    batch: t.batch,
                    version,
                })
                .unwrap();
            }
            Action::Finished { .. } => return log,
            _ => {}
        }
    }
}

#[test]
fn a_launch_answered_with_a_plan_made_ahead_gives_the_same_actions() {
    use scheduler::LaunchPlan;
    let mut reused = 0;
    for seed in 0..60 {
        let launched = drive_random(seed, |super_batch, split, batches| Event::Launched {
            super_batch,
            split,
            batches,
        });
        // The driver's planner thread: planned for the whole hot set, before
        // the split is known; the protocol cuts it at the split.
        let planned = drive_random(seed, |super_batch, split, batches| Event::Planned {
            super_batch,
            split,
            plan: LaunchPlan::new(&batches, split.hot()),
        });
        reused += launched
            .iter()
            .filter(|a| matches!(a, Action::Train(t) if !t.positions.is_empty()))
            .count();
        assert_eq!(launched, planned, "seed {seed}");
    }
    assert!(reused > 60, "{reused} batches read hot rows");
}

#[test]
fn a_plan_for_a_smaller_split_is_refused() {
    use scheduler::LaunchPlan;
    let mut s = Script::with(3, OnLate::Compute);
    s.start(0..2, 0);
    assert!(matches!(s.p.poll().unwrap(), Some(Action::Publish { .. })));
    assert!(matches!(s.p.poll().unwrap(), Some(Action::Launch { .. })));
    let batches: Vec<LaunchedBatch> = (0..2)
        .map(|k| LaunchedBatch {
            seeds: 1,
            bottom: bottom(k),
        })
        .collect();
    let e =
        s.p.handle(Event::Planned {
            super_batch: 0,
            split: HotSplit::all_cpu(4),
            plan: LaunchPlan::new(&batches, 2),
        })
        .unwrap_err();
    assert!(e.to_string().contains("launch plan"), "{e}");
}

/// Runs epoch `batches` from `version` with every job computed at once with
/// the newest published weights; returns the actions and the version at the end.
fn run_epoch_computing_at_once(
    p: &mut Protocol,
    batches: Range<usize>,
    mut version: u64,
) -> (Vec<Action>, u64) {
    p.handle(Event::EpochStarted {
        batches,
        version,
        loss_lag: 1,
        window: None,
    })
    .unwrap();
    let mut log = Vec::new();
    // The newest publication (its copies resolve at once): jobs read it.
    let mut published = version;
    while let Some(a) = p.poll().unwrap() {
        log.push(a.clone());
        match a {
            Action::Launch {
                super_batch,
                batches,
                ..
            } => p.handle(launched(super_batch, batches)).unwrap(),
            Action::Publish { version: v, .. } => {
                published = v;
                p.handle(Event::PublicationResolved { version: v }).unwrap();
            }
            Action::QueueJob(j) => p
                .handle(Event::ChunkComputed {
                    key: j.key,
                    version: published,
                    rows: j.vertices.len() as u32,
                })
                .unwrap(),
            Action::Train(t) => {
                version = t.version + 1;
                p.handle(Event::BatchTrained {
                    batch: t.batch,
                    version,
                })
                .unwrap();
            }
            Action::Finished { .. } => break,
            _ => {}
        }
    }
    (log, version)
}

#[test]
fn rows_are_kept_across_super_batches_within_the_bound_and_dropped_at_an_epoch_start() {
    // N = 2, D = 1: rows computed at a super-batch's launch-ahead are 2 steps
    // old at the next super-batch's first batch. Bound 5 leaves room.
    let cfg = ProtocolConfig::new(pipeline(), 5, OnLate::Wait).with_reuse(true);
    assert!(cfg.reuses_across_super_batches());
    let mut p = Protocol::new(cfg);
    let (log, v) = run_epoch_computing_at_once(&mut p, 0..8, 0);
    let carries: Vec<&Action> = log
        .iter()
        .filter(|a| matches!(a, Action::Carry { .. }))
        .collect();
    assert!(!carries.is_empty(), "{:?}", names(&log));
    // The epoch's first launch carries nothing: the store is empty at an
    // epoch's start.
    for a in &carries {
        let Action::Carry { super_batch, .. } = a else {
            unreachable!()
        };
        assert!(*super_batch >= 1, "{a:?}");
    }
    let Some(Action::Finished { stats, .. }) = log.last() else {
        panic!()
    };
    assert!(stats.rows_carried > 0 && stats.rows_kept > 0);
    assert!(stats.gaps.max().unwrap() <= 5);
    // Every batch's hot rows are used: none is late (none waits), and the
    // per-super-batch counts add up.
    assert_eq!(stats.wait_batches, 0);
    let hot: Vec<SuperBatchHot> = log
        .iter()
        .filter_map(|a| match a {
            Action::EndSuperBatch { hot, .. } => Some(*hot),
            _ => None,
        })
        .collect();
    assert_eq!(hot.len(), 4);
    assert_eq!(
        hot.iter().map(|h| h.carried_rows).sum::<u64>(),
        stats.rows_carried
    );
    assert_eq!(hot.iter().map(|h| h.uses).sum::<u64>(), stats.hot_uses);
    // Carried rows are not queued: rows computed + carried = rows queued.
    assert_eq!(
        hot.iter().map(|h| h.queue_rows).sum::<u64>(),
        stats.rows_computed + stats.rows_carried
    );
    // Next epoch (global super-batches 4..8): its first launch carries
    // nothing again, though the rows of the epoch before would be in bound.
    let (log2, _) = run_epoch_computing_at_once(&mut p, 0..8, v);
    let first_launch: Vec<&Action> = log2
        .iter()
        .skip_while(|a| !matches!(a, Action::Launch { .. }))
        .skip(1)
        .take_while(|a| !matches!(a, Action::Launch { .. }))
        .collect();
    assert!(!first_launch.is_empty());
    assert!(first_launch
        .iter()
        .all(|a| !matches!(a, Action::Carry { .. })));
    assert!(log2
        .iter()
        .any(|a| matches!(a, Action::Carry { super_batch, .. } if *super_batch > 4)));
    // A bound without room (below D · N = 2) keeps nothing: the actions are
    // exactly those without reuse.
    for bound in [0, 1] {
        let on = ProtocolConfig::new(pipeline(), bound, OnLate::Wait).with_reuse(true);
        assert!(!on.reuses_across_super_batches());
        let (a, _) = run_epoch_computing_at_once(&mut Protocol::new(on), 0..8, 0);
        let off = ProtocolConfig::new(pipeline(), bound, OnLate::Wait);
        let (b, _) = run_epoch_computing_at_once(&mut Protocol::new(off), 0..8, 0);
        assert_eq!(a, b, "bound {bound}");
    }
}

/// `Protocol::planned_positions`: each batch's hot positions are known once
/// its super-batch's launch is answered (the layer path samples the bottom
/// hops ahead with them as skip masks), until the super-batch ends; under
/// `"wait"` they are the training order's positions, under `"compute"` a late
/// chunk's positions move to `cold` (positions ∪ cold = planned).
#[test]
fn planned_positions_are_the_trained_ones_unless_late_chunks_stay_cold() {
    for on_late in [OnLate::Wait, OnLate::Compute] {
        let mut s = Script::with(3, on_late);
        assert_eq!(s.p.planned_positions(0), None, "no epoch");
        s.start(0..4, 0);
        assert_eq!(s.p.planned_positions(0), None, "not launched yet");
        // Up to the first gate: super-batches 0 and 1 launched.
        s.step_to(|a| matches!(a, Action::Gate { .. }));
        // Every batch's bottom is its seed then two hot ids: positions 1 and 2.
        let planned = vec![vec![1, 2], vec![1, 2]];
        assert_eq!(s.p.planned_positions(0), Some(planned.clone()));
        assert_eq!(s.p.planned_positions(1), Some(planned.clone()));
        assert_eq!(s.p.planned_positions(2), None, "super-batch 2 is not");
        let mut version = 0;
        for k in 0..4usize {
            let sb = (k / 2) as u64;
            let t = loop {
                let acts = s.step();
                match acts.last() {
                    Some(Action::Train(t)) => break t.clone(),
                    Some(Action::Wait { .. }) => {
                        // Compute every chunk of the super-batch at this version.
                        let chunks = s
                            .regular_jobs()
                            .iter()
                            .filter(|j| j.key.super_batch == sb)
                            .map(|j| (j.key.chunk, j.vertices.len() as u32))
                            .collect::<Vec<_>>();
                        for (c, rows) in chunks {
                            s.report(sb, c, s.published, rows);
                        }
                    }
                    other => panic!("{other:?}"),
                }
            };
            let want = &s.p.planned_positions(sb).unwrap()[k % 2];
            let mut got: Vec<u32> = t.positions.iter().chain(&t.cold).copied().collect();
            got.sort_unstable();
            assert_eq!(&got, want, "{on_late:?}, batch {k}");
            match on_late {
                OnLate::Wait => assert!(t.cold.is_empty()),
                OnLate::Compute if k == 0 => assert_eq!(t.positions, Vec::<u32>::new()),
                OnLate::Compute => {}
            }
            version += 1;
            s.trained(k, version);
        }
        // Super-batch 0 ended: its plan is gone.
        s.step_to(|a| matches!(a, Action::Finished { .. }));
        assert_eq!(s.p.planned_positions(0), None);
        assert_eq!(s.p.planned_positions(1), None, "the epoch is over");
    }
}

/// Drives epoch `batches` under loss lag `lag` with window `window`, every
/// launch answered, no CPU job computed (every hot position left cold), every
/// step answered with the next version and every loss read with `nonfinite`
/// (if in it); once it logs the line `stop.0` the driver hands in `stop.1`.
/// Returns the steps' slots, the loss reads, shows and marks and the end, as
/// lines.
fn drive_losses(
    batches: Range<usize>,
    lag: usize,
    window: Option<Range<usize>>,
    nonfinite: Option<usize>,
    stop: Option<(&str, Event)>,
) -> Vec<String> {
    let cfg = ProtocolConfig::new(pipeline(), 3, OnLate::Compute);
    let mut p = Protocol::new(cfg.with_bottoms(BottomHops::AtTrain));
    p.handle(Event::EpochStarted {
        batches,
        version: 0,
        loss_lag: lag,
        window,
    })
    .unwrap();
    let mut out: Vec<String> = Vec::new();
    while let Some(a) = p.poll().unwrap() {
        let logged = out.len();
        match a {
            Action::Launch {
                super_batch,
                batches,
                ..
            } => p.handle(launched(super_batch, batches)).unwrap(),
            Action::Train(t) => {
                out.push(format!("train {} slot {:?}", t.batch, t.loss_slot));
                p.handle(Event::BatchTrained {
                    batch: t.batch,
                    version: t.version + 1,
                })
                .unwrap();
            }
            Action::QueueLossRead { batches } => out.push(format!("queue {batches:?}")),
            Action::ResolveLossRead { batches } => {
                out.push(format!("resolve {batches:?}"));
                let nonfinite = nonfinite.filter(|b| batches.contains(b));
                p.handle(Event::LossesRead { nonfinite }).unwrap();
            }
            Action::ShowLosses { batches, rewind } => {
                out.push(format!("show {batches:?} rewind {rewind}"))
            }
            Action::Mark { batch, start } => out.push(format!("mark {batch} {start}")),
            Action::Finished { stopped, .. } => out.push(format!("finished {stopped}")),
            _ => {}
        }
        if let Some((_, e)) = stop
            .as_ref()
            .filter(|s| out.len() > logged && out[logged] == s.0)
        {
            p.handle(e.clone()).unwrap();
        }
    }
    out
}

/// `L = 3` over super-batches of `N = 2`: one read per super-batch, queued
/// at its end and resolved at the next one's; a mark flushes first (the read
/// in flight, then the batches pending); the epoch's end flushes the rest.
#[test]
fn a_loss_lag_reads_once_per_super_batch_and_flushes_before_a_mark_and_at_the_end() {
    let got = drive_losses(0..6, 3, Some(3..6), None, None);
    let want = [
        "train 0 slot Some(0)",
        "train 1 slot Some(1)",
        "queue 0..2",
        "train 2 slot Some(0)",
        // The window opens before batch 3: everything trained is shown.
        "resolve 0..2",
        "show 0..2 rewind 0",
        "queue 2..3",
        "resolve 2..3",
        "show 2..3 rewind 0",
        "mark 3 true",
        "train 3 slot Some(0)",
        "queue 3..4",
        "train 4 slot Some(0)",
        "train 5 slot Some(1)",
        // It closes after batch 5, the epoch's last.
        "resolve 3..4",
        "show 3..4 rewind 0",
        "queue 4..6",
        "resolve 4..6",
        "show 4..6 rewind 0",
        "mark 6 false",
        "finished false",
    ];
    assert_eq!(got, want);
    // `L = 1`: every step reads its own loss; each batch is shown right after
    // its answer and the mark after it.
    let got = drive_losses(0..4, 1, Some(1..2), None, None);
    let want = [
        "train 0 slot None",
        "mark 1 true",
        "show 0..1 rewind 0",
        "train 1 slot None",
        "mark 2 false",
        "show 1..2 rewind 0",
        "train 2 slot None",
        "show 2..3 rewind 0",
        "train 3 slot None",
        "show 3..4 rewind 0",
        "finished false",
    ];
    assert_eq!(got, want);
    // `L = 2 = N`: the L-th batch's read is the super-batch's; none at its end.
    let got = drive_losses(0..4, 2, None, None, None);
    let queued: Vec<&String> = got.iter().filter(|l| l.starts_with("queue")).collect();
    assert_eq!(queued, ["queue 0..2", "queue 2..4"]);
}

/// A stop (a cancellation, a callback's) shows every batch trained before
/// the epoch finishes; an abort (the driver failed) reads nothing more.
#[test]
fn a_stop_under_a_loss_lag_flushes_and_an_abort_does_not() {
    let got = drive_losses(
        0..8,
        3,
        None,
        None,
        Some(("train 4 slot Some(0)", Event::Stop)),
    );
    assert_eq!(
        got[got.len() - 7..],
        [
            "train 4 slot Some(0)",
            "resolve 2..4",
            "show 2..4 rewind 0",
            "queue 4..5",
            "resolve 4..5",
            "show 4..5 rewind 0",
            "finished true",
        ]
    );
    let got = drive_losses(
        0..8,
        3,
        None,
        None,
        Some(("train 4 slot Some(0)", Event::Abort)),
    );
    assert_eq!(
        got[got.len() - 2..],
        ["train 4 slot Some(0)", "finished true"]
    );
    // A callback's stop while the flush before a mark shows batches: the
    // flush goes on, then the mark, then the end.
    let stop = Some(("show 2..4 rewind 0", Event::Stop));
    let got = drive_losses(0..8, 3, Some(5..8), None, stop);
    assert_eq!(
        got[got.len() - 7..],
        [
            "resolve 2..4",
            "show 2..4 rewind 0",
            "queue 4..5",
            "resolve 4..5",
            "show 4..5 rewind 0",
            "mark 5 true",
            "finished true",
        ]
    );
}

/// A non-finite loss: the device skipped its step and every one after it, so
/// the version moves back by all of them; its read's batches up to it are
/// shown, nothing after it, and the epoch ends.
#[test]
fn a_non_finite_loss_under_a_lag_rewinds_every_skipped_step_and_ends_the_epoch() {
    // Batch 1 is read with batch 0 at super-batch 1's end, after batch 3.
    let got = drive_losses(0..8, 3, None, Some(1), None);
    assert_eq!(
        got[got.len() - 4..],
        [
            "train 3 slot Some(1)",
            "resolve 0..2",
            "show 0..2 rewind 3",
            "finished true",
        ]
    );
}

/// Step 2: a job reads the newest publication once its copies resolved, so a
/// report of weights whose copies had not resolved is refused, as one from
/// the future is; a resolution of a version never published too.
#[test]
fn rows_of_weights_whose_copies_had_not_resolved_are_refused() {
    let mut p = Protocol::new(ProtocolConfig::new(pipeline(), 3, OnLate::Compute));
    p.handle(Event::EpochStarted {
        batches: 0..4,
        version: 0,
        loss_lag: 1,
        window: None,
    })
    .unwrap();
    let mut published = Vec::new();
    while published.len() < 2 {
        match p.poll().unwrap().expect("an action") {
            Action::Launch {
                super_batch,
                batches,
                ..
            } => p.handle(launched(super_batch, batches)).unwrap(),
            Action::Publish { version, .. } => published.push(version),
            Action::Train(t) => p
                .handle(Event::BatchTrained {
                    batch: t.batch,
                    version: t.version + 1,
                })
                .unwrap(),
            _ => {}
        }
    }
    // The reset at 0, then version 2 after super-batch 0: not resolved yet.
    assert_eq!(published, [0, 2]);
    let report = |version| Event::ChunkComputed {
        key: key(1, 0),
        version,
        rows: 2,
    };
    let e = p.handle(report(2)).unwrap_err();
    assert!(e.to_string().contains("had not resolved"), "{e}");
    assert!(p.handle(Event::PublicationResolved { version: 3 }).is_err());
    p.handle(Event::PublicationResolved { version: 2 }).unwrap();
    p.handle(report(2)).unwrap();
    assert!(matches!(p.poll().unwrap(), Some(Action::Install { .. })));
}

/// Step 3: the bottom hops go out right after the launch's answer, each
/// skipping its batch's planned positions (or nothing); step 7: a batch
/// trains on its own iff it trains with exactly those positions.
#[test]
fn a_batch_trains_on_its_bottom_hop_sampled_ahead_iff_its_positions_are_the_planned_ones() {
    for bottoms in [
        BottomHops::SkipPlanned,
        BottomHops::SkipNothing,
        BottomHops::AtTrain,
    ] {
        let cfg = ProtocolConfig::new(pipeline(), 3, OnLate::Compute).with_bottoms(bottoms);
        let mut s = Script::new(cfg);
        s.start(0..4, 0);
        // Nothing computed: batch 0's planned positions 1 and 2 stay cold.
        let t = s.train();
        assert_eq!((t.positions.clone(), t.cold.clone()), (vec![], vec![1, 2]));
        assert_eq!(
            t.bottom_ahead,
            bottoms == BottomHops::SkipNothing,
            "{bottoms:?}"
        );
        s.trained(0, 1);
        // Both chunks of super-batch 0 in: batch 1 uses its planned positions.
        s.report(0, 0, 0, 2);
        s.report(0, 1, 0, 1);
        let t = s.train();
        assert_eq!((t.positions.clone(), t.cold.clone()), (vec![1, 2], vec![]));
        assert_eq!(
            t.bottom_ahead,
            bottoms != BottomHops::AtTrain,
            "{bottoms:?}"
        );
        let hops: Vec<&Action> = s
            .log
            .iter()
            .filter(|a| matches!(a, Action::SampleBottoms { .. }))
            .collect();
        match bottoms {
            BottomHops::AtTrain => assert!(hops.is_empty()),
            _ => {
                let skip = if bottoms == BottomHops::SkipPlanned {
                    vec![vec![1, 2], vec![1, 2]]
                } else {
                    vec![vec![], vec![]]
                };
                assert_eq!(
                    hops[0],
                    &Action::SampleBottoms {
                        super_batch: 0,
                        batches: 0..2,
                        skip
                    }
                );
                assert_eq!(hops.len(), 2, "super-batches 0 and 1 launched");
            }
        }
    }
}
