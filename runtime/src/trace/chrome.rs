//! Chrome Trace OutEvent Format (JSON), as Perfetto (<https://ui.perfetto.dev>) and
//! `chrome://tracing` open it: the writer and a reader that parses such a file back
//! into a [`Trace`]. `docs/tracing.md` describes the layout.
//!
//! * CPU tracks are threads of process 1 (`tandem cpu`), accelerator tracks threads
//!   of process 2 (`tandem accelerator`); `tid` is the track id, named by
//!   `thread_name` metadata (`ph: "M"`) and ordered by `thread_sort_index`.
//! * Slices are complete events (`ph: "X"`, `ts` and `dur` in microseconds with
//!   nanosecond decimals), their arguments in `args`.
//! * Flows are `ph: "s"` / `ph: "f"` pairs with the flow id in `id`, each placed
//!   inside the slice it binds to (`"bp": "e"` on the finish: bind to the enclosing
//!   slice).
//! * Counters are `ph: "C"` with `args: {"value": v}` (series named `acc…` under
//!   process 2, the rest under process 1); instant events `ph: "i"` with `s: "t"`.
//! * `otherData` carries the format version and the trace's notes.

use std::io::Write;
use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use super::model::{
    Args, Counter, Device, Direction, Flow, FlowPoint, InstantEvent, Nanos, Slice, Trace, Track,
    TrackId, TrackKind,
};
use crate::atomic::write_file_atomically;
use crate::error::{Error, Result};

/// Process id of CPU tracks.
const CPU_PID: u64 = 1;
/// Process id of accelerator tracks.
const ACC_PID: u64 = 2;
/// `otherData.format_version` written and accepted.
pub const FORMAT_VERSION: u64 = 1;

fn pid_of(kind: TrackKind) -> u64 {
    match kind {
        TrackKind::Cpu => CPU_PID,
        TrackKind::Accelerator => ACC_PID,
    }
}

/// Nanoseconds → microseconds (the format's unit), exact to the nanosecond when
/// parsed back for any time below 2^51 ns (26 days).
fn us(ns: Nanos) -> f64 {
    ns as f64 / 1000.0
}

/// A slice's or instant's `args`, as written (absent fields are left out; the
/// extra numeric arguments follow the named ones).
#[derive(Serialize)]
struct ArgsOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    batch: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    super_batch: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    layer: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dir: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    staleness_gap: Option<u64>,
    #[serde(flatten)]
    extra: std::collections::BTreeMap<&'a str, f64>,
}

impl<'a> From<&'a Args> for ArgsOut<'a> {
    fn from(a: &'a Args) -> Self {
        Self {
            epoch: a.epoch,
            batch: a.batch,
            super_batch: a.super_batch,
            layer: a.layer,
            bytes: a.bytes,
            dir: a.direction.map(|d| d.as_str()),
            device: a.device.map(|d| d.to_string()),
            staleness_gap: a.staleness_gap,
            extra: a.extra.iter().map(|(k, v)| (k.as_ref(), *v)).collect(),
        }
    }
}

/// Metadata arguments (`ph: "M"`).
#[derive(Serialize)]
#[serde(untagged)]
enum MetaArgs<'a> {
    Name { name: &'a str },
    SortIndex { sort_index: u64 },
}

/// A counter's arguments.
#[derive(Serialize)]
struct CounterArgs {
    value: f64,
}

/// Any event's arguments.
#[derive(Serialize)]
#[serde(untagged)]
enum EventArgs<'a> {
    Meta(MetaArgs<'a>),
    Args(ArgsOut<'a>),
    Counter(CounterArgs),
}

/// One Trace OutEvent Format event (module doc); fields an event kind does not use
/// are left out.
#[derive(Serialize)]
struct OutEvent<'a> {
    ph: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'static str>,
    pid: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    tid: Option<u32>,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bp: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<EventArgs<'a>>,
}

impl<'a> OutEvent<'a> {
    fn new(ph: &'static str, pid: u64, name: &'a str) -> Self {
        Self {
            ph,
            s: None,
            pid,
            tid: None,
            name,
            cat: None,
            id: None,
            ts: None,
            dur: None,
            bp: None,
            args: None,
        }
    }
}

/// `otherData`.
#[derive(Serialize)]
struct OtherData<'a> {
    producer: &'static str,
    format_version: u64,
    notes: &'a [String],
}

/// The whole file.
#[derive(Serialize)]
struct ChromeFile<'a> {
    #[serde(rename = "displayTimeUnit")]
    display_time_unit: &'static str,
    #[serde(rename = "otherData")]
    other_data: OtherData<'a>,
    #[serde(rename = "traceEvents")]
    trace_events: Vec<OutEvent<'a>>,
}

/// Every event of `trace`, in the order the writer emits them.
fn events(trace: &Trace) -> Vec<OutEvent<'_>> {
    let mut out = Vec::new();
    let kind_of = |id: TrackId| trace.track(id).map_or(TrackKind::Cpu, |t| t.kind);
    fn meta<'m>(pid: u64, tid: u32, name: &'static str, args: MetaArgs<'m>) -> OutEvent<'m> {
        let mut e = OutEvent::new("M", pid, name);
        e.tid = Some(tid);
        e.args = Some(EventArgs::Meta(args));
        e
    }
    for (pid, name) in [(CPU_PID, "tandem cpu"), (ACC_PID, "tandem accelerator")] {
        if trace.tracks.iter().any(|t| pid_of(t.kind) == pid) {
            out.push(meta(pid, 0, "process_name", MetaArgs::Name { name }));
            out.push(meta(
                pid,
                0,
                "process_sort_index",
                MetaArgs::SortIndex { sort_index: pid },
            ));
        }
    }
    for t in &trace.tracks {
        let pid = pid_of(t.kind);
        out.push(meta(
            pid,
            t.id.0,
            "thread_name",
            MetaArgs::Name { name: &t.name },
        ));
        out.push(meta(
            pid,
            t.id.0,
            "thread_sort_index",
            MetaArgs::SortIndex {
                sort_index: u64::from(t.id.0),
            },
        ));
    }
    for sl in &trace.slices {
        let kind = kind_of(sl.track);
        let mut e = OutEvent::new("X", pid_of(kind), &sl.name);
        e.tid = Some(sl.track.0);
        e.cat = Some(kind.as_str());
        e.ts = Some(us(sl.start));
        e.dur = Some(us(sl.duration()));
        e.args = Some(EventArgs::Args((&sl.args).into()));
        out.push(e);
    }
    for f in &trace.flows {
        for (ph, p) in [("s", f.from), ("f", f.to)] {
            let mut e = OutEvent::new(ph, pid_of(kind_of(p.track)), &f.name);
            e.tid = Some(p.track.0);
            e.cat = Some("flow");
            e.id = Some(f.id);
            e.ts = Some(us(p.ts));
            if ph == "f" {
                e.bp = Some("e");
            }
            out.push(e);
        }
    }
    for c in &trace.counters {
        let pid = if c.name.starts_with("acc") {
            ACC_PID
        } else {
            CPU_PID
        };
        let mut e = OutEvent::new("C", pid, &c.name);
        e.ts = Some(us(c.ts));
        e.args = Some(EventArgs::Counter(CounterArgs { value: c.value }));
        out.push(e);
    }
    for i in &trace.instants {
        let mut e = OutEvent::new("i", pid_of(kind_of(i.track)), &i.name);
        e.s = Some("t");
        e.tid = Some(i.track.0);
        e.ts = Some(us(i.ts));
        e.args = Some(EventArgs::Args((&i.args).into()));
        out.push(e);
    }
    out
}

/// Writes `trace` to `path` as Chrome trace JSON, atomically (every event and
/// the envelope through serde).
pub fn write_chrome_trace(path: &Path, trace: &Trace) -> Result<()> {
    let io = |e: std::io::Error| Error::io(path, e);
    let json_err = |e: serde_json::Error| Error::io(path, std::io::Error::other(e));
    let file = ChromeFile {
        display_time_unit: "ms",
        other_data: OtherData {
            producer: "tandem",
            format_version: FORMAT_VERSION,
            notes: &trace.notes,
        },
        trace_events: events(trace),
    };
    write_file_atomically(path, |w| {
        serde_json::to_writer(&mut *w, &file).map_err(json_err)?;
        writeln!(w).map_err(io)
    })
}

/// Reads a Chrome trace JSON file written by [`write_chrome_trace`] (or any file
/// using the same subset of the format) and checks its structure
/// ([`Trace::validate`]). Errors name the file, the event and what was expected.
pub fn read_chrome_trace(path: &Path) -> Result<Trace> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    parse_chrome_trace(&text).map_err(|what| Error::format(path, what))
}

/// Parses Chrome trace JSON text; the error says what is wrong.
pub fn parse_chrome_trace(text: &str) -> std::result::Result<Trace, String> {
    let root: Value =
        serde_json::from_str(text).map_err(|e| format!("not a JSON document: {e}"))?;
    let (events, other) = match &root {
        Value::Array(a) => (a, None),
        Value::Object(o) => match o.get("traceEvents") {
            Some(Value::Array(a)) => (a, o.get("otherData")),
            Some(_) => return Err("`traceEvents` is not an array".into()),
            None => {
                return Err("expected a Chrome trace: an object with a `traceEvents` array".into())
            }
        },
        _ => return Err("expected a Chrome trace: an object with a `traceEvents` array".into()),
    };
    let mut t = Trace::default();
    if let Some(other) = other {
        read_other_data(other, &mut t)?;
    }
    // Flow ends by id: (name, start, finish).
    let mut flows: std::collections::BTreeMap<u64, (String, Option<FlowPoint>, Option<FlowPoint>)> =
        Default::default();
    for (k, e) in events.iter().enumerate() {
        let ev = Event::new(k, e)?;
        match ev.ph {
            "M" => {
                if ev.str("name")? == "thread_name" {
                    let kind = match ev.u64("pid")? {
                        CPU_PID => TrackKind::Cpu,
                        ACC_PID => TrackKind::Accelerator,
                        p => {
                            return Err(ev.err(format!(
                                "`pid` {p}: expected {CPU_PID} (cpu) or {ACC_PID} (accelerator)"
                            )))
                        }
                    };
                    let name = ev
                        .args()?
                        .and_then(|a| a.get("name"))
                        .and_then(Value::as_str)
                        .ok_or_else(|| ev.err("missing string `args.name`".into()))?;
                    t.tracks.push(Track {
                        id: ev.track()?,
                        name: name.to_string(),
                        kind,
                    });
                }
            }
            "X" => {
                let start = ev.time("ts")?;
                let dur = ev.time("dur")?;
                t.slices.push(Slice {
                    track: ev.track()?,
                    name: ev.str("name")?.to_string().into(),
                    start,
                    end: start.saturating_add(dur),
                    args: ev.slice_args()?,
                });
            }
            "s" | "f" => {
                let id = ev.u64("id")?;
                let point = FlowPoint {
                    track: ev.track()?,
                    ts: ev.time("ts")?,
                };
                let slot = flows
                    .entry(id)
                    .or_insert_with(|| (String::new(), None, None));
                let side = if ev.ph == "s" {
                    slot.0 = ev.str("name")?.to_string();
                    &mut slot.1
                } else {
                    &mut slot.2
                };
                if side.replace(point).is_some() {
                    return Err(ev.err(format!("flow id {id} has a second `{}` event", ev.ph)));
                }
            }
            "C" => {
                let value = ev
                    .args()?
                    .and_then(|a| a.get("value"))
                    .and_then(Value::as_f64)
                    .ok_or_else(|| ev.err("missing number `args.value`".into()))?;
                t.counters.push(Counter {
                    name: ev.str("name")?.to_string().into(),
                    ts: ev.time("ts")?,
                    value,
                });
            }
            "i" | "I" => t.instants.push(InstantEvent {
                track: ev.track()?,
                name: ev.str("name")?.to_string().into(),
                ts: ev.time("ts")?,
                args: ev.slice_args()?,
            }),
            other => {
                return Err(ev.err(format!(
                    "phase `{other}` is not part of Tandem's trace format \
                     (expected one of M, X, s, f, C, i)"
                )))
            }
        }
    }
    for (id, (name, from, to)) in flows {
        match (from, to) {
            (Some(from), Some(to)) => t.flows.push(Flow {
                id,
                name: name.into(),
                from,
                to,
            }),
            (Some(_), None) => return Err(format!("flow id {id} has a start but no finish")),
            _ => return Err(format!("flow id {id} has a finish but no start")),
        }
    }
    t.sort();
    t.validate()?;
    Ok(t)
}

fn read_other_data(other: &Value, t: &mut Trace) -> std::result::Result<(), String> {
    if let Some(v) = other.get("format_version") {
        match v.as_u64() {
            Some(FORMAT_VERSION) => {}
            _ => {
                return Err(format!(
                    "`otherData.format_version` is {v}; this reader understands {FORMAT_VERSION}"
                ))
            }
        }
    }
    if let Some(notes) = other.get("notes") {
        let notes = notes
            .as_array()
            .ok_or("`otherData.notes` is not an array of strings")?;
        for n in notes {
            t.notes.push(
                n.as_str()
                    .ok_or("`otherData.notes` is not an array of strings")?
                    .to_string(),
            );
        }
    }
    Ok(())
}

/// One event being parsed, for typed field access with errors that say which.
struct Event<'a> {
    index: usize,
    ph: &'a str,
    obj: &'a Map<String, Value>,
}

impl<'a> Event<'a> {
    fn new(index: usize, v: &'a Value) -> std::result::Result<Self, String> {
        let obj = v
            .as_object()
            .ok_or_else(|| format!("event {index}: expected a JSON object"))?;
        let ph = obj
            .get("ph")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("event {index}: missing string `ph` (the phase)"))?;
        Ok(Self { index, ph, obj })
    }

    fn err(&self, what: String) -> String {
        let name = self.obj.get("name").and_then(Value::as_str);
        match name {
            Some(n) => format!("event {} (ph `{}`, `{n}`): {what}", self.index, self.ph),
            None => format!("event {} (ph `{}`): {what}", self.index, self.ph),
        }
    }

    fn str(&self, key: &str) -> std::result::Result<&'a str, String> {
        self.obj
            .get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| self.err(format!("missing string `{key}`")))
    }

    fn u64(&self, key: &str) -> std::result::Result<u64, String> {
        self.obj
            .get(key)
            .and_then(Value::as_u64)
            .ok_or_else(|| self.err(format!("missing non-negative integer `{key}`")))
    }

    fn track(&self) -> std::result::Result<TrackId, String> {
        let tid = self.u64("tid")?;
        u32::try_from(tid)
            .map(TrackId)
            .map_err(|_| self.err(format!("`tid` {tid} is out of range (expected < 2^32)")))
    }

    /// A time field in microseconds → nanoseconds.
    fn time(&self, key: &str) -> std::result::Result<Nanos, String> {
        let v = self
            .obj
            .get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| self.err(format!("missing number `{key}` (microseconds)")))?;
        if !(0.0..1.0e15).contains(&v) {
            return Err(self.err(format!(
                "`{key}` is {v}: expected a non-negative time in microseconds"
            )));
        }
        Ok((v * 1000.0).round() as Nanos)
    }

    fn args(&self) -> std::result::Result<Option<&'a Map<String, Value>>, String> {
        match self.obj.get("args") {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(_) => Err(self.err("`args` is not an object".into())),
        }
    }

    fn slice_args(&self) -> std::result::Result<Args, String> {
        let mut a = Args::default();
        let Some(m) = self.args()? else {
            return Ok(a);
        };
        for (k, v) in m {
            let int = || {
                v.as_u64()
                    .ok_or_else(|| self.err(format!("`args.{k}` is {v}: expected an integer ≥ 0")))
            };
            match k.as_str() {
                "epoch" => a.epoch = Some(int()?),
                "batch" => a.batch = Some(int()?),
                "super_batch" => a.super_batch = Some(int()?),
                "layer" => {
                    a.layer = Some(
                        u32::try_from(int()?)
                            .map_err(|_| self.err(format!("`args.layer` {v} is too large")))?,
                    )
                }
                "bytes" => a.bytes = Some(int()?),
                "staleness_gap" => a.staleness_gap = Some(int()?),
                "dir" => {
                    a.direction = Some(v.as_str().and_then(Direction::parse).ok_or_else(|| {
                        self.err(format!("`args.dir` is {v}: expected \"h2d\" or \"d2h\""))
                    })?)
                }
                "device" => {
                    a.device = Some(v.as_str().and_then(Device::parse).ok_or_else(|| {
                        self.err(format!(
                            "`args.device` is {v}: expected \"cpu\" or \"accN\""
                        ))
                    })?)
                }
                _ => {
                    let x = v
                        .as_f64()
                        .ok_or_else(|| self.err(format!("`args.{k}` is {v}: expected a number")))?;
                    a.extra.push((k.clone().into(), x));
                }
            }
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_trace() -> Trace {
        let mut t = Trace {
            tracks: vec![
                Track {
                    id: TrackId(0),
                    name: "cpu worker 0".into(),
                    kind: TrackKind::Cpu,
                },
                Track {
                    id: TrackId(1),
                    name: "acc stream copy \"h2d\"".into(),
                    kind: TrackKind::Accelerator,
                },
            ],
            notes: vec!["accelerator counters not recorded: no NVML".into()],
            ..Trace::default()
        };
        t.slices.push(Slice {
            track: TrackId(0),
            name: "gather".into(),
            start: 1_001,
            end: 2_000_003,
            args: Args {
                epoch: Some(0),
                batch: Some(4),
                bytes: Some(123_456),
                device: Some(Device::Cpu),
                extra: vec![("rows".into(), 12.5)],
                ..Args::default()
            },
        });
        t.slices.push(Slice {
            track: TrackId(1),
            name: "h2d".into(),
            start: 2_100_000,
            end: 2_500_000,
            args: Args {
                bytes: Some(123_456),
                direction: Some(Direction::HostToDevice),
                device: Some(Device::Accelerator(0)),
                super_batch: Some(1),
                layer: Some(0),
                staleness_gap: Some(1),
                ..Args::default()
            },
        });
        t.flows.push(Flow {
            id: 9,
            name: "prepare→compute".into(),
            from: FlowPoint {
                track: TrackId(0),
                ts: 1_000_502,
            },
            to: FlowPoint {
                track: TrackId(1),
                ts: 2_300_000,
            },
        });
        for (ts, v) in [(0, 12.5), (100_000_000, 99.0)] {
            t.counters.push(Counter {
                name: "cpu.util".into(),
                ts,
                value: v,
            });
            t.counters.push(Counter {
                name: "acc0.util".into(),
                ts: ts + 1,
                value: v / 2.0,
            });
        }
        t.instants.push(InstantEvent {
            track: TrackId(1),
            name: "reuse".into(),
            ts: 2_200_000,
            args: Args {
                staleness_gap: Some(2),
                ..Args::default()
            },
        });
        t.sort();
        t
    }

    #[test]
    fn write_then_read_gives_the_same_trace() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.json");
        let t = sample_trace();
        t.validate().unwrap();
        write_chrome_trace(&p, &t).unwrap();
        let back = read_chrome_trace(&p).unwrap();
        assert_eq!(back, t);
        // Only the target is left (the temporary was renamed).
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
        // Perfetto needs these exact spellings.
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(v["displayTimeUnit"], "ms");
        let ev = v["traceEvents"].as_array().unwrap();
        let phases: std::collections::BTreeSet<&str> =
            ev.iter().map(|e| e["ph"].as_str().unwrap()).collect();
        assert_eq!(
            phases.into_iter().collect::<Vec<_>>(),
            ["C", "M", "X", "f", "i", "s"]
        );
        let gather = ev.iter().find(|e| e["name"] == "gather").unwrap();
        assert_eq!(gather["ts"].as_f64(), Some(1.001));
        assert_eq!(gather["dur"].as_f64(), Some(1999.002));
        assert_eq!(gather["pid"], 1);
        let fin = ev.iter().find(|e| e["ph"] == "f").unwrap();
        assert_eq!(fin["bp"], "e");
        assert_eq!(fin["pid"], 2);
    }

    #[test]
    fn reader_rejects_malformed_files_naming_the_problem() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("bad.json");
        let cases: &[(&str, &str)] = &[
            ("{\"traceEvents\": [", "not a JSON document"),
            ("{\"events\": []}", "`traceEvents` array"),
            ("{\"traceEvents\": 3}", "not an array"),
            ("{\"traceEvents\": [3]}", "event 0: expected a JSON object"),
            (
                "{\"traceEvents\": [{\"name\": \"x\"}]}",
                "missing string `ph`",
            ),
            (
                r#"{"traceEvents": [{"ph":"M","pid":1,"tid":0,"name":"thread_name","args":{"name":"w"}},
                   {"ph":"X","pid":1,"tid":0,"name":"forward","ts":5}]}"#,
                "event 1 (ph `X`, `forward`): missing number `dur`",
            ),
            (
                r#"{"traceEvents": [{"ph":"X","pid":1,"tid":3,"name":"forward","ts":5,"dur":1}]}"#,
                "on track 3, which is not declared",
            ),
            (
                r#"{"traceEvents": [{"ph":"M","pid":1,"tid":0,"name":"thread_name","args":{"name":"w"}},
                   {"ph":"X","pid":1,"tid":0,"name":"forward","ts":-5,"dur":1}]}"#,
                "`ts` is -5",
            ),
            (
                r#"{"traceEvents": [{"ph":"B","pid":1,"tid":0,"name":"x","ts":1}]}"#,
                "phase `B` is not part",
            ),
            (
                r#"{"traceEvents": [{"ph":"M","pid":7,"tid":0,"name":"thread_name","args":{"name":"w"}}]}"#,
                "`pid` 7",
            ),
            (
                r#"{"traceEvents": [{"ph":"M","pid":1,"tid":0,"name":"thread_name","args":{"name":"w"}},
                   {"ph":"X","pid":1,"tid":0,"name":"h2d","ts":1,"dur":1,"args":{"dir":"up"}}]}"#,
                "`args.dir` is \"up\"",
            ),
            (
                r#"{"traceEvents": [{"ph":"M","pid":1,"tid":0,"name":"thread_name","args":{"name":"w"}},
                   {"ph":"X","pid":1,"tid":0,"name":"a","ts":1,"dur":10},
                   {"ph":"s","pid":1,"tid":0,"name":"f","id":1,"ts":2}]}"#,
                "flow id 1 has a start but no finish",
            ),
            (
                r#"{"traceEvents": [{"ph":"C","pid":1,"name":"cpu.util","ts":1,"args":{"v":3}}]}"#,
                "missing number `args.value`",
            ),
            (
                r#"{"otherData":{"format_version":2},"traceEvents":[]}"#,
                "format_version",
            ),
        ];
        for (text, want) in cases {
            std::fs::write(&p, text).unwrap();
            let e = read_chrome_trace(&p).unwrap_err().to_string();
            assert!(e.starts_with(&p.display().to_string()), "{e}");
            assert!(e.contains(want), "expected `{want}` in: {e}");
        }
        let missing = d.path().join("missing.json");
        let e = read_chrome_trace(&missing).unwrap_err().to_string();
        assert!(e.contains("missing.json"), "{e}");
    }

    #[test]
    fn reader_accepts_the_bare_array_form() {
        let t = parse_chrome_trace(
            r#"[{"ph":"M","pid":2,"tid":4,"name":"thread_name","args":{"name":"acc stream compute"}},
                {"ph":"X","pid":2,"tid":4,"name":"forward","ts":1.5,"dur":2}]"#,
        )
        .unwrap();
        assert_eq!(t.tracks[0].kind, TrackKind::Accelerator);
        assert_eq!((t.slices[0].start, t.slices[0].end), (1_500, 3_500));
    }
}
