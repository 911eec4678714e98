//! The layer path's hot rows under a device memory budget (`engine/memory.rs`
//! step 8) on the host backend, with `device.memory_budget_bytes` as the
//! limit (no wall clock): `"auto"` shrinks or skips its layer candidate and
//! trains; a fixed `layer` policy that cannot fit fails before loading,
//! naming `orchestration.hot_ratio`; the monitor never grows the CPU share
//! past the hot set the memory was checked for.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpu_ops::TopologyPlacement;
use scheduler::{
    HotSplit, Monitor, MonitorConfig, Observation, Orchestration, PipelineConfig, ShareConfig,
};

use crate::clock::ManualClock;
use crate::config::TrainConfig;
use crate::data::dataset::Dataset;
use crate::engine::memory::{batch_block_bytes, bottom_rows, estimate, layer_bytes, LayerShape};
use crate::error::Error;
use crate::trace::Tracer;
use crate::{load_dataset, Trainer};

/// A small graph on the host backend (`session/tests.rs`'s layer run).
const BASE: &[&str] = &[
    "model.kind=\"sage\"",
    "model.hidden=32",
    "train.epochs=3",
    "train.batch_size=128",
    "train.lr=0.01",
    "data.synthetic.vertices=4000",
    "data.synthetic.edges=30000",
    "data.synthetic.classes=4",
    "data.synthetic.dim=16",
    "data.synthetic.homophily=0.9",
    "data.synthetic.signal=0.4",
    "device.kind=\"host\"",
    "device.cache_bytes=32000",
    "threads.compute=1",
    "orchestration.hot_ratio=0.2",
];

fn config(extra: &[&str]) -> TrainConfig {
    let sets: Vec<String> = BASE.iter().chain(extra).map(|s| s.to_string()).collect();
    TrainConfig::from_toml_with_overrides("", Path::new("test"), &sets).expect("config")
}

/// What the engine's check counts for `c` on `ds`, as `DeviceEngine::new`
/// computes it: the parts but the cache and the layer path, the cache, and
/// the layer path's shape with its whole hot set.
struct Need {
    fixed: u64,
    cache: u64,
    shape: LayerShape,
    hot: u64,
}

fn need_of(c: &TrainConfig, ds: &Dataset) -> Need {
    let model = c
        .model_config(ds.features.dim(), ds.num_classes as usize)
        .expect("model");
    let layout = gpu_ops::ModelLayout::new(&model).expect("layout");
    let params: usize = layout.params().iter().map(|p| p.len).sum();
    let fanouts = c.train_fanouts().expect("fanouts");
    let on_device = c
        .device
        .topology
        .fixed()
        .unwrap_or(TopologyPlacement::Device)
        == TopologyPlacement::Device;
    let need = estimate(
        ds,
        &model,
        params,
        c.train.batch_size,
        &fanouts,
        c.device.cache_bytes,
        on_device,
    );
    let n = ds.num_vertices() as u64;
    Need {
        fixed: need.total() - need.cache,
        cache: need.cache,
        shape: LayerShape {
            width: layout.layer_specs()[0].d_out as u64,
            super_batch: c.orchestration.super_batch as u64,
            bottom_rows: bottom_rows(n, c.train.batch_size, &fanouts),
            bf16: false,
            store: c.orchestration.reuse_across_superbatches,
            batch_blocks: batch_block_bytes(
                n,
                ds.graph.num_edges() as u64,
                c.train.batch_size,
                &fanouts,
            ),
        },
        hot: (c.orchestration.hot_ratio * n as f64).ceil() as u64,
    }
}

/// `"auto"` measuring on the host on a scripted clock (1 ms a batch whatever
/// the placement) under `budget`: the trainer's note, the choice, the trace,
/// and the `layer_rows_limit` the `layer setup` slice recorded (if any).
fn auto_under(budget: u64) -> (String, scheduler::Choice, crate::trace::Trace) {
    let set = format!("device.memory_budget_bytes={budget}");
    let c = config(&["orchestration.policy=\"auto\"", set.as_str()]);
    let ds = load_dataset(&c).expect("dataset");
    let clock = ManualClock::new();
    let mut t =
        Trainer::measuring_on_host_with_clock(ds, c, Arc::new(clock.clone())).expect("trainer");
    let tracer = Tracer::new();
    t.set_tracer(tracer.clone());
    t.add_callback(Box::new(crate::on_batch(move |_| {
        clock.advance(Duration::from_millis(1));
        crate::Control::Continue
    })));
    let stats = t.fit().expect("auto trains");
    assert_eq!(stats.len(), 3);
    let choice = t.auto_choice().expect("auto decided").clone();
    (t.device_note().to_string(), choice, tracer.collect())
}

fn arg(args: &crate::trace::Args, key: &str) -> Option<f64> {
    args.extra.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
}

/// A budget where the layer candidate's hot set fits only partly: `"auto"`
/// cuts it to what fits (said in the note, the reason and the trace), never
/// measures or chooses a CPU split past it, and trains.
#[test]
fn auto_cuts_the_layer_candidate_to_the_budget_and_trains() {
    let c = config(&["orchestration.policy=\"auto\""]);
    let ds = load_dataset(&c).expect("dataset");
    let need = need_of(&c, &ds);
    assert!(need.hot > 100, "{}", need.hot);
    // Room for the buffers of a third of the hot set.
    let third = need.hot / 3;
    let budget = need.fixed + need.cache + layer_bytes(third, &need.shape).total();
    let (note, choice, trace) = auto_under(budget);
    let limit =
        crate::engine::memory::rows_within(budget - need.fixed - need.cache, need.hot, &need.shape);
    assert_eq!(limit, third);
    assert!(
        note.contains(&format!("keeps {limit} of {} hot rows", need.hot)),
        "{note}"
    );
    assert!(
        choice
            .reason
            .contains(&format!("cut to {limit} of {} rows", need.hot)),
        "{}",
        choice.reason
    );
    let setup = trace
        .slices
        .iter()
        .find(|s| s.name == "layer setup")
        .expect("the layer candidate was measured");
    assert_eq!(arg(&setup.args, "layer_rows_limit"), Some(limit as f64));
    let probes: Vec<f64> = trace
        .slices
        .iter()
        .filter_map(|s| arg(&s.args, "layer cpu_split"))
        .collect();
    assert!(!probes.is_empty(), "no layer probe");
    assert!(
        probes.iter().all(|&s| s <= limit as f64),
        "{probes:?} > {limit}"
    );
    let decided = trace
        .instants
        .iter()
        .find(|i| i.name == "auto choice")
        .expect("auto choice");
    assert_eq!(arg(&decided.args, "layer_rows_limit"), Some(limit as f64));
    if choice.policy == Orchestration::Layer {
        assert!(u64::from(choice.cpu_split) <= limit, "{choice:?}");
    }
}

/// A budget with no room beside the cache: the layer candidate is skipped
/// (said in the reason), a step-based placement is chosen, training runs.
#[test]
fn auto_skips_a_layer_candidate_with_no_room() {
    let c = config(&["orchestration.policy=\"auto\""]);
    let ds = load_dataset(&c).expect("dataset");
    let need = need_of(&c, &ds);
    let (_, choice, trace) = auto_under(need.fixed + need.cache);
    assert_ne!(choice.policy, Orchestration::Layer);
    assert!(
        choice.reason.contains("no layer-based candidate"),
        "{}",
        choice.reason
    );
    assert!(!trace.slices.iter().any(|s| s.name == "layer setup"));
}

/// A fixed layer policy: a budget one byte short of its hot rows beside the
/// rest (the cache shrunk to nothing) fails before anything is loaded, naming
/// `orchestration.hot_ratio`, the bytes and the budget; exactly enough trains.
#[test]
fn a_fixed_layer_policy_beyond_the_budget_names_the_hot_ratio() {
    let c = config(&["orchestration.policy=\"layer\""]);
    let ds = load_dataset(&c).expect("dataset");
    let need = need_of(&c, &ds);
    let layer = layer_bytes(need.hot, &need.shape).total();
    let exact = need.fixed + layer;
    let short = format!("device.memory_budget_bytes={}", exact - 1);
    let c = config(&["orchestration.policy=\"layer\"", short.as_str()]);
    let e = Trainer::new(load_dataset(&c).expect("dataset"), c)
        .err()
        .expect("refused");
    assert!(
        matches!(&e, Error::InvalidArgument { name, .. } if name == "orchestration.hot_ratio"),
        "{e}"
    );
    let msg = e.to_string();
    for part in [
        crate::trace::fmt_bytes(layer),
        crate::trace::fmt_bytes(exact - 1),
        "device.memory_budget_bytes".to_string(),
    ] {
        assert!(msg.contains(&part), "{part}: {msg}");
    }
    let enough = format!("device.memory_budget_bytes={exact}");
    let c = config(&[
        "orchestration.policy=\"layer\"",
        "train.epochs=1",
        enough.as_str(),
    ]);
    let mut t = Trainer::new(load_dataset(&c).expect("dataset"), c).expect("fits exactly");
    t.fit().expect("trains");
}

/// Observations that always reward a larger CPU share (time mode) or an idle
/// CPU with no hot wait (balance mode): the monitor grows the share up to the
/// hot set it started with and never past it, so the rows the engine checked
/// (`engine/memory.rs` step 8, the hot set) bound what the layer path holds.
#[test]
fn the_monitor_never_grows_the_cpu_share_past_the_hot_set() {
    let pipeline = PipelineConfig::new(2, 1, 256).expect("pipeline");
    for time in [true, false] {
        let cfg = MonitorConfig {
            time: time.then(ShareConfig::default),
            ..MonitorConfig::with_budget(1 << 30)
        };
        let hot = 100;
        let mut m = Monitor::new(cfg, pipeline, HotSplit::new(hot, 10).expect("split"), 64)
            .expect("monitor");
        let mut largest = 0;
        for k in 0..400u64 {
            let cpu = m.split_for(k).cpu();
            largest = largest.max(m.split().cpu());
            // Time: shorter with more CPU rows. Balance: the CPU idles, no wait.
            let obs = Observation {
                super_batch: k,
                duration_s: 1.0 - 0.005 * f64::from(cpu),
                acc_busy_s: 0.5,
                acc_wait_hot_s: 0.0,
                cpu_workers: 2,
                cpu_hot_busy_s: 0.1,
                cpu_idle_s: 1.5,
                free_device_bytes: 1 << 30,
            };
            m.observe(&obs).expect("observe");
            assert!(m.split().cpu() <= hot, "time {time}: {:?}", m.split());
            assert!(m.split().hot() <= hot, "time {time}: {:?}", m.split());
        }
        assert_eq!(
            largest, hot,
            "time {time}: the share never reached the hot set"
        );
    }
}
