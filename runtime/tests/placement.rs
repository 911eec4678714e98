//! Step-based placements on the host backend: host and device sampling train on
//! the same batches, and config errors name their keys. (Every policy's
//! accuracy and bytes through `tandem bench orchestration`:
//! `runtime/src/cli/bench/orchestration.rs`'s tests.)

use std::path::Path;

use runtime::config::TrainConfig;
use runtime::{load_dataset, Trainer};

fn try_cfg(extra: &[&str]) -> runtime::Result<TrainConfig> {
    let mut sets: Vec<String> = vec![
        "model.kind=\"sage\"".into(),
        "model.hidden=32".into(),
        "train.epochs=3".into(),
        "train.batch_size=128".into(),
        "train.lr=0.01".into(),
        "data.synthetic.vertices=3000".into(),
        "data.synthetic.edges=20000".into(),
        "data.synthetic.classes=4".into(),
        "data.synthetic.dim=16".into(),
        "data.synthetic.homophily=0.9".into(),
        "data.synthetic.signal=0.4".into(),
        "device.kind=\"host\"".into(),
        // Every row (3000 × 16 × 4 B) fits: a device gather never reads the host.
        "device.cache_bytes=1000000".into(),
        "threads.compute=1".into(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    TrainConfig::from_toml_with_overrides("", Path::new("test"), &sets).and_then(|c| {
        c.validate()?;
        Ok(c)
    })
}

fn cfg(extra: &[&str]) -> TrainConfig {
    try_cfg(extra).expect("config")
}

#[test]
fn host_sampling_trains_on_the_same_batches_as_device_sampling() {
    // On the host backend both samplers are the same code with the same seeds, so
    // the losses agree exactly; a wrong seed or fanout would show here.
    let losses = |policy: &str| {
        let c = cfg(&[&format!("orchestration.policy=\"{policy}\"")]);
        let ds = load_dataset(&c).expect("dataset");
        let mut t = Trainer::new(ds, c).expect("trainer");
        t.train_epoch().expect("epoch").loss
    };
    let reference = losses("gpu-sample-gpu-gather");
    for p in [
        "cpu-sample-cpu-gather",
        "gpu-sample-cpu-gather",
        "cpu-sample-gpu-gather",
    ] {
        assert_eq!(losses(p), reference, "{p}");
    }
}

#[test]
fn config_errors_name_the_keys() {
    let err = |extra: &[&str]| try_cfg(extra).expect_err("should be refused").to_string();
    let e = err(&[
        "orchestration.policy=\"cpu-sample-gpu-gather\"",
        "orchestration.hot_ratio=0.2",
    ]);
    assert!(
        e.contains("orchestration.hot_ratio") && e.contains("orchestration.policy"),
        "{e}"
    );
    // The native host path is gone: its key is an unknown key.
    let e = err(&["device.host_engine=\"ops\""]);
    assert!(e.contains("host_engine"), "{e}");
    let e = err(&["orchestration.policy=\"cpu-gather\""]);
    assert!(e.contains("orchestration.policy"), "{e}");
}
