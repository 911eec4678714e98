//! Traces of real (tiny) training runs: the file `tandem train --trace` writes loads
//! back with a valid structure, and its summary is consistent.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

use clap::Parser;
use runtime::cli::{run, Cli};
use runtime::config::TrainConfig;
use runtime::trace::{
    read_chrome_trace, summarize, write_chrome_trace, CounterSampler, SamplerOptions, Trace,
    Tracer, TrackKind, CPU_UTIL, PROCESS_RSS_MIB,
};
use runtime::{load_dataset, Trainer};
use serde_json::Value;

const TINY: [&str; 9] = [
    "data.synthetic.vertices=3000",
    "data.synthetic.edges=15000",
    "data.synthetic.dim=16",
    "data.synthetic.classes=4",
    "model.hidden=16",
    "train.batch_size=256",
    "train.epochs=2",
    "train.threads=2",
    "train.fanouts=[5, 5]",
];

fn tiny_config() -> TrainConfig {
    let sets: Vec<String> = TINY.iter().map(|s| s.to_string()).collect();
    TrainConfig::from_toml_with_overrides("", "--set".as_ref(), &sets).unwrap()
}

/// Trains the tiny config with tracing on and returns the collected trace and the
/// number of training batches per epoch.
fn traced_training() -> (Trace, usize) {
    let cfg = tiny_config();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let tracer = Tracer::new();
    let sampler = CounterSampler::start(
        &tracer,
        SamplerOptions {
            interval: Duration::from_millis(5),
            accelerator: true,
        },
    );
    let stats = pool.install(|| {
        let ds = load_dataset(&cfg).unwrap();
        let mut t = Trainer::new(ds, cfg).unwrap();
        t.set_tracer(tracer.clone());
        t.fit().unwrap()
    });
    sampler.stop();
    (tracer.collect(), stats[0].batches)
}

/// Structural checks done directly on the JSON, independent of the reader.
fn check_json(path: &Path) {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().expect("traceEvents array");
    let mut declared = BTreeSet::new();
    for e in events {
        if e["ph"] == "M" && e["name"] == "thread_name" {
            declared.insert((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()));
        }
    }
    assert!(!declared.is_empty());
    let mut last_counter: HashMap<String, f64> = HashMap::new();
    let mut slices: HashMap<(u64, u64), Vec<(f64, f64)>> = HashMap::new();
    for e in events {
        match e["ph"].as_str().unwrap() {
            "X" => {
                let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
                assert!(declared.contains(&key), "slice on undeclared track: {e}");
                let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
                assert!(ts >= 0.0 && dur >= 0.0, "{e}");
                slices.entry(key).or_default().push((ts, ts + dur));
            }
            "C" => {
                let name = e["name"].as_str().unwrap().to_string();
                let ts = e["ts"].as_f64().unwrap();
                assert!(e["args"]["value"].as_f64().unwrap().is_finite());
                if let Some(prev) = last_counter.insert(name, ts) {
                    assert!(ts >= prev, "counter goes back in time: {e}");
                }
            }
            _ => {}
        }
    }
    // Each flow end lies inside a slice of its track.
    for e in events {
        if e["ph"] == "s" || e["ph"] == "f" {
            let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
            let ts = e["ts"].as_f64().unwrap();
            let inside = slices
                .get(&key)
                .is_some_and(|v| v.iter().any(|&(s, end)| s <= ts && ts <= end));
            assert!(inside, "flow end outside every slice: {e}");
        }
    }
}

#[test]
fn a_training_trace_round_trips_with_valid_structure() {
    let (trace, batches) = traced_training();
    let epochs = 2;
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("train.json");
    write_chrome_trace(&path, &trace).unwrap();
    check_json(&path);
    let back = read_chrome_trace(&path).unwrap();
    assert_eq!(back, trace, "the reader gives back what was written");
    back.validate().unwrap();

    // Tracks: the accelerator's part, here the host backend's and named so,
    // its sampling-ahead track (`device.sample_ahead`, on by default), the
    // evaluation's, and the pool workers'.
    let acc: Vec<_> = back
        .tracks
        .iter()
        .filter(|t| t.kind == TrackKind::Accelerator)
        .collect();
    assert_eq!(acc.len(), 2, "{:?}", back.tracks);
    assert_eq!(acc[0].name, "host backend compute");
    assert_eq!(acc[1].name, "host backend sample");
    let eval_track = back
        .tracks
        .iter()
        .find(|t| t.name == "evaluation")
        .expect("the evaluation's track");
    assert!(back
        .tracks
        .iter()
        .filter(|t| t.kind == TrackKind::Cpu && t.id != eval_track.id)
        .all(|t| t.name.starts_with("cpu worker ")));
    // Every eval slice is on the evaluation's track; one epoch start each.
    assert!(back
        .slices
        .iter()
        .filter(|s| s.name == "eval")
        .all(|s| s.track == eval_track.id));
    let starts: Vec<u64> = back
        .instants
        .iter()
        .filter(|i| i.name == runtime::trace::EPOCH_INSTANT)
        .filter_map(|i| i.args.epoch)
        .collect();
    assert_eq!(starts, (0..epochs as u64).collect::<Vec<_>>());

    // Stages: one slice per batch and epoch on the accelerator tracks, each with
    // its epoch and batch: every batch but an epoch's first sampled ahead.
    let count = |n: &str| back.slices.iter().filter(|s| s.name == n).count();
    for stage in ["device sample", "device step"] {
        assert_eq!(count(stage), batches * epochs, "{stage}");
    }
    assert_eq!(count("eval"), epochs);
    for s in back.slices.iter().filter(|s| s.name != "eval") {
        // Batches sampled ahead and the reads of their queued groups' sizes
        // (`sample read`) are on the sampling track.
        let ahead = s.name == "device sample" && s.args.batch != Some(0);
        let on = if ahead || s.name == "sample read" {
            acc[1].id
        } else {
            acc[0].id
        };
        assert_eq!(s.track, on, "{s:?}");
        assert!(s.args.batch.unwrap() < batches as u64);
        assert!(s.args.epoch.unwrap() < epochs as u64);
        assert!(s.start <= s.end);
    }
    // A device step records what it moved host → device: at least the labels.
    for s in back.slices.iter().filter(|s| s.name == "device step") {
        let b = s.args.bytes.unwrap();
        assert!(b > 0 && b.is_multiple_of(4), "{b}");
    }

    // Counters: sampled at the start and at the stop at least (in between as the
    // scheduler allows), monotone per series. CPU utilisation is a difference of
    // two samples: at most one per pair, none for a pair over which the
    // machine's CPU total did not advance (how often it advances depends on the
    // machine: the sampler's unit tests check the values on scripted readings).
    if Path::new("/proc/stat").exists() {
        let samples = back.counter_series(PROCESS_RSS_MIB).count();
        assert!(samples >= 2, "{samples} samples");
        let util: Vec<f64> = back.counter_series(CPU_UTIL).map(|c| c.value).collect();
        assert!(
            util.len() < samples,
            "{} utilizations of {samples} samples",
            util.len()
        );
        assert!(util.iter().all(|u| (0.0..=100.0).contains(u)), "{util:?}");
    }

    // The summary agrees with the slices.
    let s = summarize(&back);
    let (start, end) = back.span().unwrap();
    assert_eq!(s.wall, end - start);
    assert_eq!(s.slices as usize, back.slices.len());
    for t in &s.tracks {
        assert!(
            t.busy <= s.wall,
            "{} busy {} > wall {}",
            t.name,
            t.busy,
            s.wall
        );
    }
    assert!(s.cpu_busy <= s.wall && s.cpu_parallel <= s.cpu_busy);
    let cpu = || s.tracks.iter().filter(|t| t.kind == TrackKind::Cpu);
    assert!(s.cpu_busy >= cpu().map(|t| t.busy).max().unwrap());
    assert!(s.cpu_busy <= cpu().map(|t| t.busy).sum());
    let stage_total: u64 = s.stages.iter().map(|st| st.busy).sum();
    let slice_total: u64 = back.slices.iter().map(|sl| sl.duration()).sum();
    assert_eq!(stage_total, slice_total);
    assert!(s.acc_busy.is_some_and(|b| b > 0 && b <= s.wall));
    assert!(s.staleness.is_empty());
    let text = s.to_string();
    assert!(text.contains("no reuse recorded"), "{text}");
    assert!(text.contains("device step"), "{text}");
    // The host backend's terms: its copies, no transfer rate.
    assert!(s.host_backend);
    assert!(
        text.contains("into the host backend's buffers") && !text.contains("GB/s"),
        "{text}"
    );
}

#[test]
fn disabled_tracing_records_nothing_during_training() {
    let cfg = tiny_config();
    let ds = load_dataset(&cfg).unwrap();
    let mut t = Trainer::new(ds, cfg).unwrap();
    assert!(!t.tracer().is_enabled());
    t.train_epoch().unwrap();
    assert_eq!(t.tracer().collect(), Trace::default());
}

fn cli(args: &[&str]) -> runtime::Result<()> {
    run(Cli::try_parse_from(args).unwrap())
}

#[test]
fn tandem_train_trace_then_report() {
    let d = tempfile::tempdir().unwrap();
    let trace = d.path().join("run.json");
    let svg = d.path().join("util.svg");
    let trace_s = trace.to_str().unwrap();
    let mut args = vec!["tandem", "train", "--quiet-config", "--trace", trace_s];
    for s in TINY {
        args.extend(["--set", s]);
    }
    cli(&args).unwrap();
    let t = read_chrome_trace(&trace).unwrap();
    assert!(t.slices.iter().any(|s| s.name == "device step"));
    cli(&["tandem", "report", trace_s, "--svg", svg.to_str().unwrap()]).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.contains("busy per track"));
    // Only the two outputs: no temporaries left behind.
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);

    // A report on a malformed file names the file and the problem.
    let bad = d.path().join("bad.json");
    std::fs::write(&bad, "{\"traceEvents\": [{\"ph\": \"X\"}]}").unwrap();
    let e = cli(&["tandem", "report", bad.to_str().unwrap()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad.json") && e.contains("missing"), "{e}");
}

#[test]
fn a_failed_run_still_writes_its_trace() {
    let d = tempfile::tempdir().unwrap();
    let trace = d.path().join("failed.json");
    let missing = d.path().join("missing.tds");
    let set = format!("data.path=\"{}\"", missing.display());
    let r = cli(&[
        "tandem",
        "train",
        "--quiet-config",
        "--trace",
        trace.to_str().unwrap(),
        "--set",
        &set,
    ]);
    let e = r.unwrap_err().to_string();
    assert!(e.contains("missing.tds"), "{e}");
    let t = read_chrome_trace(&trace).unwrap();
    assert!(t.slices.is_empty());
}
