//! `orchestration.policy = "auto"` end to end on the host backend: every
//! candidate is measured on the first batches, the choice is applied and
//! recorded, and training goes on with it. Which candidate wins depends on this
//! machine's timing, so the tests check the protocol, not the winner (the
//! decision itself is tested on scripted costs in `scheduler/src/auto.rs` and
//! `runtime/src/auto.rs`).

use std::path::Path;

use runtime::config::TrainConfig;
use runtime::trace::Tracer;
use runtime::trainer::{load_dataset, test_at_best_val, Trainer};

fn cfg(extra: &[&str]) -> TrainConfig {
    let mut sets: Vec<String> = vec![
        "model.kind=\"sage\"".into(),
        "model.hidden=16".into(),
        "train.epochs=3".into(),
        "train.batch_size=64".into(),
        "train.lr=0.01".into(),
        "train.fanouts=[5,5]".into(),
        "data.synthetic.vertices=4000".into(),
        "data.synthetic.edges=30000".into(),
        "data.synthetic.classes=4".into(),
        "data.synthetic.dim=16".into(),
        "data.synthetic.homophily=0.9".into(),
        "data.synthetic.signal=0.4".into(),
        "device.kind=\"host\"".into(),
        "device.host_engine=\"ops\"".into(),
        "threads.compute=1".into(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    TrainConfig::from_toml_with_overrides("", Path::new("test"), &sets).expect("config")
}

fn trainer(c: TrainConfig) -> Trainer {
    let ds = load_dataset(&c).expect("dataset");
    Trainer::new(ds, c).expect("trainer")
}

const STEP_BASED: [&str; 4] = [
    "gpu-sample-gpu-gather",
    "cpu-sample-gpu-gather",
    "gpu-sample-cpu-gather",
    "cpu-sample-cpu-gather",
];

#[test]
fn auto_is_the_default_and_measures_every_candidate_then_trains_with_its_choice() {
    let c = cfg(&[]);
    assert_eq!(c.orchestration.policy, runtime::config::PolicyName::Auto);
    let mut t = trainer(c);
    let tracer = Tracer::new();
    t.set_tracer(tracer.clone());
    assert!(t.auto_choice().is_none(), "nothing measured yet");
    let stats = t.fit().expect("fit");
    let choice = t.auto_choice().expect("auto decided").clone();
    for name in STEP_BASED {
        assert!(
            choice.reason.contains(name),
            "{name} not measured: {}",
            choice.reason
        );
    }
    assert!(
        choice.reason.contains("layer (cpu split"),
        "layer not measured: {}",
        choice.reason
    );
    // 38 batches an epoch: the measurements (4 × 5 step-based batches, 12
    // layer-based) take the first epoch and may spill into the second; the last
    // trains only with the choice.
    assert!(stats[0].calibrating);
    assert!(!stats.last().expect("epochs").calibrating);
    assert!(choice.per_batch_s > 0.0);
    // The choice is on the trace.
    let trace = tracer.collect();
    assert!(
        trace.instants.iter().any(|i| i.name == "auto choice"),
        "no auto choice instant"
    );
    // Every calibration batch trained the model: accuracy as usual.
    let (_, acc) = test_at_best_val(&stats).expect("evaluated");
    assert!(acc > 0.6, "test accuracy {acc}");
}

#[test]
fn auto_on_a_one_layer_model_measures_only_step_based_placements() {
    let mut t = trainer(cfg(&["model.layers=1", "train.fanouts=[5]"]));
    t.fit().expect("fit");
    let choice = t.auto_choice().expect("auto decided");
    assert!(
        !choice.reason.contains("layer (cpu split"),
        "{}",
        choice.reason
    );
    assert!(!choice.reason.starts_with("layer"), "{}", choice.reason);
}

#[test]
fn auto_on_the_native_host_path_is_the_native_trainer() {
    let mut t = trainer(cfg(&["device.host_engine=\"native\""]));
    let stats = t.fit().expect("fit");
    assert!(t.auto_choice().is_none());
    assert!(stats.iter().all(|s| !s.calibrating));
    assert!(t.device_note().contains("host"), "{}", t.device_note());
}
