//! Behaviour kept across refactors: for a fixed seed on the host backend, every
//! placement gives the losses and weights recorded in `tests/golden/placements.txt`
//! (recorded at `240270e`, before the executor / placement reorganisation).
//!
//! Each case trains a small synthetic graph for two epochs on one thread and
//! compares, bit for bit, every epoch's mean loss and a hash of every parameter's
//! bits (plus the parameters' sum, to tell a near miss from a different run).
//! The layer-based case is deterministic by construction: all-neighbour bottom
//! sampling, no dropout, staleness bound 0 and `on_late = "wait"`, so every hot
//! row is computed from the current weights whatever the workers' timing.
//!
//! `TANDEM_RECORD_GOLDEN=1 cargo test -p runtime --test golden` rewrites the file
//! (only when a change of behaviour is deliberate; say so in the commit).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use runtime::config::TrainConfig;
use runtime::TrainerBuilder;

/// The cases: a name and the overrides on top of [`base`].
const CASES: &[(&str, &[&str])] = &[
    (
        "sage cpu-sample-cpu-gather",
        &["orchestration.policy=\"cpu-sample-cpu-gather\""],
    ),
    (
        "sage gpu-sample-cpu-gather",
        &["orchestration.policy=\"gpu-sample-cpu-gather\""],
    ),
    (
        "sage cpu-sample-gpu-gather",
        &["orchestration.policy=\"cpu-sample-gpu-gather\""],
    ),
    (
        "sage gpu-sample-gpu-gather",
        &["orchestration.policy=\"gpu-sample-gpu-gather\""],
    ),
    (
        "sage layer",
        &[
            "orchestration.policy=\"layer\"",
            "orchestration.hot_ratio=0.3",
            "orchestration.staleness_bound=0",
            "orchestration.on_late=\"wait\"",
            "orchestration.super_batch=4",
            "train.fanouts=[-1, 5]",
            "model.dropout=0.0",
        ],
    ),
    (
        "sage gpu-sample-gpu-gather sample_ahead",
        &[
            "orchestration.policy=\"gpu-sample-gpu-gather\"",
            "device.sample_ahead=true",
        ],
    ),
    (
        "gcn gpu-sample-gpu-gather",
        &[
            "model.kind=\"gcn\"",
            "orchestration.policy=\"gpu-sample-gpu-gather\"",
        ],
    ),
    (
        "gat gpu-sample-gpu-gather",
        &[
            "model.kind=\"gat\"",
            "model.heads=2",
            "orchestration.policy=\"gpu-sample-gpu-gather\"",
        ],
    ),
    (
        "sage gpu-sample-gpu-gather tf32 bf16",
        &[
            "orchestration.policy=\"gpu-sample-gpu-gather\"",
            "device.feature_dtype=\"bf16\"",
            "model.precision=\"tf32\"",
        ],
    ),
];

fn base(extra: &[&str]) -> TrainConfig {
    let mut sets: Vec<String> = vec![
        "model.kind=\"sage\"".into(),
        "model.hidden=32".into(),
        "train.epochs=2".into(),
        "train.batch_size=128".into(),
        "train.fanouts=[5, 5]".into(),
        "train.lr=0.01".into(),
        "data.synthetic.vertices=3000".into(),
        "data.synthetic.edges=20000".into(),
        "data.synthetic.classes=4".into(),
        "data.synthetic.dim=16".into(),
        "data.synthetic.homophily=0.9".into(),
        "data.synthetic.signal=0.4".into(),
        "device.kind=\"host\"".into(),
        // Half the rows (3000 × 16 × 4 B = 192 kB) fit the cache.
        "device.cache_bytes=96000".into(),
        "threads.compute=1".into(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    let c = TrainConfig::from_toml_with_overrides("", Path::new("golden"), &sets).expect("config");
    c.validate().expect("valid config");
    c
}

/// One case's record: a line per epoch loss, a line per parameter tensor.
fn record(name: &str, extra: &[&str]) -> String {
    let mut t = TrainerBuilder::new(base(extra)).build().expect("trainer");
    let stats = t.fit().expect("fit");
    let mut out = format!("case {name}\n");
    for s in &stats {
        writeln!(
            out,
            "loss {} {:016x} {:.6}",
            s.epoch,
            s.loss.to_bits(),
            s.loss
        )
        .unwrap();
    }
    for p in &t.checkpoint().expect("checkpoint").tensors {
        let bits: Vec<u8> = p
            .values
            .iter()
            .flat_map(|v| v.to_bits().to_le_bytes())
            .collect();
        let sum: f64 = p.values.iter().map(|&v| f64::from(v)).sum();
        writeln!(
            out,
            "param {} {} {:016x} {:.6}",
            p.name,
            p.values.len(),
            xxhash_rust::xxh3::xxh3_64(&bits),
            sum
        )
        .unwrap();
    }
    out
}

fn golden_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/placements.txt")
}

#[test]
fn every_placement_trains_the_recorded_losses_and_weights() {
    let got: String = CASES.iter().map(|(n, e)| record(n, e)).collect();
    if std::env::var_os("TANDEM_RECORD_GOLDEN").is_some() {
        std::fs::create_dir_all(golden_path().parent().unwrap()).unwrap();
        std::fs::write(golden_path(), &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(golden_path()).expect("tests/golden/placements.txt");
    let (want_cases, got_cases) = (split(&want), split(&got));
    assert_eq!(
        want_cases.iter().map(|c| c.0).collect::<Vec<_>>(),
        got_cases.iter().map(|c| c.0).collect::<Vec<_>>(),
        "the recorded cases"
    );
    let mut bad = Vec::new();
    for ((name, w), (_, g)) in want_cases.iter().zip(&got_cases) {
        if w != g {
            bad.push(format!("{name}:\n--- recorded\n{w}--- now\n{g}"));
        }
    }
    assert!(bad.is_empty(), "behaviour changed:\n{}", bad.join("\n"));
}

/// The file's cases: (name, its lines).
fn split(text: &str) -> Vec<(&str, String)> {
    let mut out: Vec<(&str, String)> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("case ") {
            out.push((name, String::new()));
        } else if let Some((_, body)) = out.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}
