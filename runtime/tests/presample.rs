//! The layer path's pre-sampling pass at setup reports its progress through
//! [`TrainerBuilder::progress`] (the importers' protocol, `runtime::progress`)
//! and records a `hotness scores` slice into [`TrainerBuilder::tracer`].

use std::path::Path;
use std::sync::{Arc, Mutex};

use runtime::config::TrainConfig;
use runtime::trace::Tracer;
use runtime::TrainerBuilder;

fn cfg(extra: &[&str]) -> TrainConfig {
    let base = [
        "model.kind=\"sage\"",
        "model.hidden=16",
        "train.epochs=1",
        "train.batch_size=64",
        "data.synthetic.vertices=2000",
        "data.synthetic.edges=12000",
        "data.synthetic.classes=4",
        "data.synthetic.dim=8",
        "device.kind=\"host\"",
        "threads.compute=2",
        "orchestration.policy=\"layer\"",
        "orchestration.hot_ratio=0.2",
    ];
    let sets: Vec<String> = base.iter().chain(extra).map(|s| s.to_string()).collect();
    TrainConfig::from_toml_with_overrides("", Path::new("test"), &sets).expect("config")
}

type Seen = Arc<Mutex<Vec<(String, u64, u64)>>>;

fn build(extra: &[&str]) -> (Seen, Tracer) {
    let seen: Seen = Arc::default();
    let sink = {
        let seen = Arc::clone(&seen);
        move |phase: &str, done: u64, total: u64| {
            seen.lock().unwrap().push((phase.to_string(), done, total));
        }
    };
    let tracer = Tracer::new();
    let mut t = TrainerBuilder::new(cfg(extra))
        .progress(sink)
        .tracer(tracer.clone())
        .build()
        .expect("trainer");
    t.fit().expect("trains");
    (seen, tracer)
}

/// Presample hotness: reports start at 0, never decrease, end at the total
/// (the pass's batches: 3 epochs of the training vertices in batches of 64),
/// and the slice records that many batches.
#[test]
fn presampling_reports_monotone_progress_ending_at_the_total() {
    let (seen, tracer) = build(&["orchestration.hotness=\"presample\""]);
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "no progress reported");
    assert!(seen.iter().all(|(p, _, _)| p == "presample"), "{seen:?}");
    let total = seen[0].2;
    assert!(total > 3, "{seen:?}");
    assert_eq!(seen[0].1, 0);
    assert!(seen.windows(2).all(|w| w[0].1 <= w[1].1 && w[1].2 == total));
    assert_eq!(seen.last().map(|s| (s.1, s.2)), Some((total, total)));
    assert_eq!(seen.len() as u64, total + 1);
    let trace = tracer.collect();
    let slice = trace
        .slices
        .iter()
        .find(|s| s.name == "hotness scores")
        .expect("a hotness scores slice");
    let batches = slice
        .args
        .extra
        .iter()
        .find(|(k, _)| k == "presample_batches")
        .map(|(_, v)| *v);
    assert_eq!(batches, Some(total as f64));
}

/// Degree order has no pass: nothing is reported, the slice still says
/// where setup's time went.
#[test]
fn degree_hotness_reports_nothing() {
    let (seen, tracer) = build(&["orchestration.hotness=\"degree\""]);
    assert!(seen.lock().unwrap().is_empty());
    assert!(tracer
        .collect()
        .slices
        .iter()
        .any(|s| s.name == "hotness scores"));
}
