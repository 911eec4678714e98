//! The hybrid monitor in the executor (host backend): with a slow CPU it moves
//! hot vertices to the device cache and the accelerator waits far less; the cache
//! stays within `device.cache_bytes`; with a fast CPU it does not oscillate; the
//! staleness bound holds throughout.

use std::path::Path;
use std::time::Duration;

use runtime::config::TrainConfig;
use runtime::trainer::{load_dataset, Trainer};
use runtime::{InjectedFault, OrchestrationStats};

const CACHE_BYTES: usize = 64_000;

/// The tests measure time: run them one at a time, not competing for the cores.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn cfg(extra: &[&str]) -> TrainConfig {
    let cache = format!("device.cache_bytes={CACHE_BYTES}");
    let mut sets: Vec<String> = vec![
        "model.kind=\"sage\"".into(),
        "model.hidden=32".into(),
        "train.epochs=3".into(),
        "train.batch_size=64".into(),
        "train.lr=0.01".into(),
        "data.synthetic.vertices=4000".into(),
        "data.synthetic.edges=30000".into(),
        "data.synthetic.classes=4".into(),
        "data.synthetic.dim=16".into(),
        "device.kind=\"host\"".into(),
        "device.host_engine=\"ops\"".into(),
        "orchestration.policy=\"layer\"".into(),
        cache,
        "threads.compute=1".into(),
        "orchestration.hot_ratio=0.2".into(),
        "orchestration.super_batch=2".into(),
        "orchestration.staleness_bound=3".into(),
        "orchestration.on_late=\"wait\"".into(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    TrainConfig::from_toml_with_overrides("", Path::new("test"), &sets).expect("config")
}

/// Trains with `extra` settings and an optional slow CPU; returns the totals, the
/// trace's `monitor move` instants and the engine's cache statistics.
fn train(
    extra: &[&str],
    slow: Option<Duration>,
) -> (OrchestrationStats, Vec<(u64, f64)>, gpu_ops::CacheStats) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = cfg(extra);
    let ds = load_dataset(&c).expect("dataset");
    let mut t = Trainer::new(ds, c).expect("trainer");
    let tracer = runtime::trace::Tracer::new();
    t.set_tracer(tracer.clone());
    t.inject_orchestration_fault(slow.map(InjectedFault::SlowCpu));
    t.fit().expect("fit");
    let o = t.orchestration_totals().expect("orchestration ran").clone();
    let trace = tracer.collect();
    trace.validate().expect("valid trace");
    let moves = trace
        .instants
        .iter()
        .filter(|i| i.name == "monitor move")
        .map(|i| {
            let sb = i.args.super_batch.unwrap_or(u64::MAX);
            let signed = i
                .args
                .extra
                .iter()
                .find_map(|(k, v)| match &**k {
                    "to_cache" => Some(*v),
                    "to_cpu" => Some(-*v),
                    _ => None,
                })
                .unwrap_or(0.0);
            (sb, signed)
        })
        .collect();
    let cache = t.cache_stats().expect("device engine");
    (o, moves, cache)
}

#[test]
fn a_slow_cpu_moves_hot_vertices_to_the_cache_within_the_budget() {
    let slow = Some(Duration::from_micros(200));
    let (off, off_moves, _) = train(&["orchestration.monitor=false"], slow);
    let (on, on_moves, cache) = train(&["orchestration.monitor=true"], slow);
    eprintln!("monitor off: {}", off.summary());
    eprintln!("monitor on:  {}", on.summary());
    eprintln!("moves: {on_moves:?}");
    assert!(off_moves.is_empty() && !off.monitor);
    // Moves to the cache come early: within the first epoch's super-batches.
    assert!(on.monitor_moves_to_cache > 0, "{}", on.summary());
    let first = on_moves
        .iter()
        .find(|m| m.1 > 0.0)
        .expect("a move to the cache");
    assert!(first.0 <= 3, "first move after super-batch {}", first.0);
    assert_eq!(
        on_moves.len() as u64,
        on.monitor_moves_to_cache + on.monitor_moves_to_cpu
    );
    assert!(on.monitor_cached_rows > 0, "{}", on.summary());
    // How much waiting the moves save is a timing property, printed here and
    // measured by `tandem bench orchestration`; the decisions themselves are
    // tested deterministically (scripted windows on a manual clock) in
    // `orchestrate/monitor.rs`.
    eprintln!(
        "wait with the monitor {:.3} s vs without {:.3} s",
        on.wait_secs, off.wait_secs
    );
    // The cache never exceeds its budget, and the monitor's rows fit in it.
    assert!(cache.cached_bytes <= CACHE_BYTES, "{cache:?}");
    assert!(
        on.monitor_cached_rows as usize <= cache.cached_rows,
        "{cache:?}"
    );
    // The staleness bound still holds.
    assert!(on.gaps.max().unwrap_or(0) <= 3, "{}", on.summary());
}

#[test]
fn a_small_cache_caps_the_moves_at_its_budget() {
    // 100 rows of 64 bytes: far fewer than the hot vertices a slow CPU would shed.
    let (on, _, cache) = train(
        &["orchestration.monitor=true", "device.cache_bytes=6400"],
        Some(Duration::from_micros(200)),
    );
    assert!(on.monitor_moves_to_cache > 0, "{}", on.summary());
    assert!(on.monitor_cached_rows <= 100, "{}", on.summary());
    assert!(cache.cached_bytes <= 6400, "{cache:?}");
    assert!(on.gaps.max().unwrap_or(0) <= 3, "{}", on.summary());
}

#[test]
fn with_an_on_time_cpu_the_bound_and_the_budget_hold() {
    for on_late in ["wait", "compute"] {
        let l = format!("orchestration.on_late=\"{on_late}\"");
        let (on, moves, cache) = train(
            &[
                "orchestration.monitor=true",
                "train.epochs=4",
                // Two super-batches of slack: an on-time CPU never makes a batch wait.
                "orchestration.super_batch=4",
                "orchestration.staleness_bound=7",
                &l,
            ],
            None,
        );
        // Whether OS jitter on a shared machine triggers small moves is timing;
        // oscillation is tested on scripted windows in `orchestrate/monitor.rs`.
        eprintln!("{on_late}: {} {moves:?}", on.summary());
        assert_eq!(
            moves.len() as u64,
            on.monitor_moves_to_cache + on.monitor_moves_to_cpu,
            "{on_late}: every move is traced once"
        );
        assert!(cache.cached_bytes <= CACHE_BYTES, "{cache:?}");
        assert!(on.gaps.max().unwrap_or(0) <= 7, "{}", on.summary());
        assert!(on.hot_uses > 0, "{}", on.summary());
    }
}
