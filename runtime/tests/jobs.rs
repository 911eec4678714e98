//! Many jobs in one process: the four-job service of
//! `examples/service_jobs.rs` run small, and checks that jobs share one copy of
//! the dataset — by pointer (every trainer's arrays are the shared ones) and by
//! the bytes the heap holds after building trainers (a counting allocator) — and
//! that core budgets, memory budgets, callback removal and the epoch API behave
//! as documented.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use runtime::{on_batch, Control, Error, Trainer, TrainerBuilder};

#[allow(dead_code)] // its `main` is the example's
#[path = "../../examples/service_jobs.rs"]
mod service_jobs;

use service_jobs::{dataset, job_config, run_service, shares};

/// Counts the bytes the heap holds (the system allocator does the work).
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator with the caller's
// arguments unchanged; the counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is the system allocator's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (so from the system one) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from the system allocator with `layout`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The tests of this file one at a time (the heap counter is process-wide).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn four_concurrent_jobs_share_one_dataset() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let r = run_service(600, 16, 2400, 2, dir.path()).expect("service");
    assert_eq!(r.jobs.len(), 4);
    for j in &r.jobs {
        assert!(j.shared, "job {} trained on a copy", j.name);
        assert!((0.0..=1.0).contains(&j.test_acc), "{j:?}");
    }
    // A: trained to the end and exported.
    assert_eq!(r.jobs[0].epochs, 2);
    assert!(dir.path().join("job-a.onnx").exists());
    // B: cancelled from the monitor thread right after its 3rd batch (the
    // callback waits for the monitor's answer), so before the 4th.
    let train = dataset(600, 16, 2400).unwrap().train_ids().len();
    let per_epoch = train.div_ceil(job_config(1).train.batch_size);
    let at = (3 / per_epoch, 3 % per_epoch);
    assert_eq!(r.jobs[1].cancelled_at, Some(at), "{:?}", r.jobs[1]);
    assert_eq!(r.jobs[1].epochs, at.0);
    assert!(
        r.jobs[1].note.contains("saw 3 batches"),
        "{}",
        r.jobs[1].note
    );
    // C: resumed to 2 epochs equals D bit for bit, then one more epoch.
    assert!(r.resumed_equals_reference);
    assert_eq!(r.jobs[2].epochs, 3);
    assert_eq!(r.jobs[3].epochs, 2);
}

/// Builds `jobs` trainers on `ds` (the last one given a clone of the dataset by
/// value) and returns them with the heap bytes they hold between them.
fn build_jobs(ds: &Arc<runtime::Dataset>, jobs: usize) -> (Vec<Trainer>, isize) {
    let before = LIVE.load(Ordering::Relaxed);
    let trainers: Vec<Trainer> = (0..jobs)
        .map(|i| {
            let b = TrainerBuilder::new(job_config(1)).threads(1);
            let b = if i + 1 == jobs {
                b.dataset(runtime::Dataset::clone(ds))
            } else {
                b.dataset(Arc::clone(ds))
            };
            b.build().expect("trainer")
        })
        .collect();
    (trainers, LIVE.load(Ordering::Relaxed) - before)
}

#[test]
fn building_jobs_copies_no_array_of_the_dataset() {
    let _g = serial();
    // 1 MiB of features and about as many bytes of neighbor ids.
    let ds = Arc::new(dataset(2048, 128, 160_000).unwrap());
    let features = std::mem::size_of_val(ds.features.as_slice()) as isize;
    let indices = std::mem::size_of_val(ds.graph.indices().as_slice()) as isize;
    assert!(
        features >= 1 << 20 && indices >= 1 << 19,
        "{features} {indices}"
    );
    let (trainers, held) = build_jobs(&ds, 4);
    for (i, t) in trainers.iter().enumerate() {
        // The first three hold the `Arc` itself; the fourth a clone of the
        // dataset, whose arrays are the same ones.
        assert_eq!(Arc::ptr_eq(t.shared_dataset(), &ds), i < 3, "job {i}");
        assert!(
            t.dataset()
                .features
                .data()
                .shares_storage(ds.features.data()),
            "job {i}"
        );
        assert!(
            t.dataset()
                .graph
                .indices()
                .shares_storage(ds.graph.indices()),
            "job {i}"
        );
        assert!(t.dataset().labels.shares_storage(&ds.labels), "job {i}");
    }
    assert!(trainers[..3].iter().all(|t| shares(t, &ds)));
    // A trainer holds its model, buffers and per-vertex books (a few bytes per
    // vertex), far below either array: one copy of the features or of the
    // topology, in any job, would exceed this.
    let per_job = held / 4;
    assert!(
        per_job < features.min(indices) / 2,
        "each job holds {per_job} bytes; features are {features}, neighbor ids {indices}"
    );
    drop(trainers);
}

#[test]
fn a_core_budget_or_a_shared_pool_sizes_the_compute_pool() {
    let _g = serial();
    let ds = Arc::new(dataset(300, 8, 900).unwrap());
    let t = TrainerBuilder::new(job_config(1))
        .dataset(Arc::clone(&ds))
        .threads(2)
        .build()
        .unwrap();
    assert_eq!(t.threads(), 2);
    let pool = Arc::new(
        runtime::rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap(),
    );
    let mut jobs: Vec<Trainer> = (0..2)
        .map(|_| {
            TrainerBuilder::new(job_config(1))
                .dataset(Arc::clone(&ds))
                .thread_pool(Arc::clone(&pool))
                .build()
                .unwrap()
        })
        .collect();
    // Both trainers hold the pool; they train on it.
    assert_eq!(Arc::strong_count(&pool), 3);
    for t in &mut jobs {
        assert_eq!(t.threads(), 3);
        assert_eq!(t.fit().unwrap().len(), 1);
    }
    // A pool is used as it is: a different size or pinning is refused.
    let refused = |b: TrainerBuilder| match b.dataset(Arc::clone(&ds)).build() {
        Err(Error::InvalidArgument { name, .. }) => name,
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("built"),
    };
    let b = TrainerBuilder::new(job_config(1))
        .threads(2)
        .thread_pool(Arc::clone(&pool));
    assert_eq!(refused(b), "threads.compute");
    let mut cfg = job_config(1);
    cfg.threads.pin = runtime::config::PinPolicy::Cores;
    let b = TrainerBuilder::new(cfg).thread_pool(Arc::clone(&pool));
    assert_eq!(refused(b), "threads.pin");
}

#[test]
fn a_memory_budget_shrinks_the_cache_and_refuses_what_cannot_fit() {
    let _g = serial();
    let ds = Arc::new(dataset(1000, 16, 4000).unwrap());
    let feature_bytes = (1000 * 16 * 4) as u64;
    let build = |cache: u64, budget: u64| {
        let mut cfg = job_config(1);
        cfg.device.cache_bytes = cache;
        TrainerBuilder::new(cfg)
            .dataset(Arc::clone(&ds))
            .threads(1)
            .device_memory_budget(budget)
            .build()
    };
    // No budget: the cache holds every row.
    let whole = build(feature_bytes, 0).unwrap();
    assert_eq!(whole.cache_stats().cached_rows, 1000);
    // A budget of 0 is "none"; one that leaves room for part of the cache gets
    // part of it.
    let roomy = build(feature_bytes, 1 << 40).unwrap();
    assert_eq!(roomy.cache_stats().cached_rows, 1000);
    // Find the fixed need: the smallest budget that builds with no cache is
    // refused one byte lower, naming the key.
    let too_small = match build(feature_bytes, 1) {
        Err(Error::InvalidArgument { name, reason }) => (name, reason),
        other => panic!("{:?}", other.map(|_| ())),
    };
    assert_eq!(too_small.0, "device.memory_budget_bytes", "{}", too_small.1);
    let mut lo = 1u64;
    let mut hi = 1u64 << 40;
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if build(0, mid).is_ok() {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let fixed = hi;
    // With the fixed need plus half the features, half the rows fit.
    let half = build(feature_bytes, fixed + feature_bytes / 2).unwrap();
    let rows = half.cache_stats().cached_rows;
    assert!(rows > 0 && rows < 1000, "{rows}");
    // The device note says so; without the cut it says nothing of the budget.
    assert!(
        half.device_note().contains("device.memory_budget_bytes"),
        "{}",
        half.device_note()
    );
    assert!(!roomy.device_note().contains("memory_budget"));
    assert!(
        half.cache_stats().budget_bytes as u64 <= feature_bytes / 2,
        "{:?}",
        half.cache_stats()
    );
}

#[test]
fn removing_a_callback_closes_its_channel_while_the_trainer_lives() {
    let _g = serial();
    let ds = Arc::new(dataset(300, 8, 900).unwrap());
    let mut t = TrainerBuilder::new(job_config(2))
        .dataset(ds)
        .threads(1)
        .build()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let id = t.add_callback(Box::new(on_batch(move |m| {
        let _ = tx.send(m.batch);
        Control::Continue
    })));
    let other = t.add_callback(Box::new(on_batch(|_| Control::Continue)));
    assert_ne!(id, other);
    assert_eq!(t.num_callbacks(), 2);
    t.train_epoch().unwrap();
    let seen = rx.try_iter().count();
    assert!(seen > 0);
    // Removed, the callback (and its sender) is handed back; dropping it closes
    // the channel though the trainer is alive.
    let cb = t.remove_callback(id).expect("was added");
    assert!(t.remove_callback(id).is_none(), "removed once");
    drop(cb);
    assert!(rx.recv().is_err(), "the channel is closed");
    t.train_epoch().unwrap();
    assert_eq!(t.num_callbacks(), 1);
    t.clear_callbacks();
    assert_eq!(t.num_callbacks(), 0);
}

#[test]
fn fit_after_the_last_epoch_is_explicit_and_fit_epochs_trains_more() {
    let _g = serial();
    let ds = Arc::new(dataset(300, 8, 900).unwrap());
    // Evaluated only at the end of a run (train.epochs, or fit_epochs' last).
    let mut cfg = job_config(2);
    cfg.train.eval_every = 0;
    let build = || {
        TrainerBuilder::new(cfg.clone())
            .dataset(Arc::clone(&ds))
            .threads(1)
            .build()
            .unwrap()
    };
    let mut t = build();
    let first = t.fit().unwrap();
    assert_eq!(first.len(), 2);
    // fit after train.epochs: nothing trained, an error to match on.
    let steps = t.steps();
    match t.fit() {
        Err(Error::TrainingComplete { epochs }) => assert_eq!(epochs, 2),
        other => panic!("{:?}", other.map(|s| s.len())),
    }
    assert_eq!((t.epoch(), t.steps()), (2, steps));
    // fit_epochs(n): n more, evaluated after the last; 0 trains nothing.
    assert!(t.fit_epochs(0).unwrap().is_empty());
    let more = t.fit_epochs(2).unwrap();
    assert_eq!(more.iter().map(|s| s.epoch).collect::<Vec<_>>(), vec![2, 3]);
    assert!(more[0].val_acc.is_none() && more[1].val_acc.is_some());
    assert_eq!(t.epoch(), 4);
    // train_epoch past train.epochs trains epoch after epoch too, and is the
    // same as fit_epochs(1): two trainers taking either path agree.
    let mut u = build();
    u.fit().unwrap();
    let a = u.train_epoch().unwrap();
    let b = u.train_epoch().unwrap();
    assert_eq!((a.epoch, b.epoch, u.epoch()), (2, 3, 4));
    assert!(a.val_acc.is_none() && b.val_acc.is_none(), "eval_every = 0");
    assert_eq!(u.params().unwrap(), t.params().unwrap());
}
