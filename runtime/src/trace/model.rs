//! The in-memory trace: tracks, slices, flows, counters and instant events, as the
//! recorder collects them ([`crate::trace::Tracer::collect`]) and the Chrome reader
//! parses them back ([`crate::trace::read_chrome_trace`]).
//!
//! Times are nanoseconds since the trace's epoch (the moment the tracer was made).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;

/// Nanoseconds since the trace's epoch.
pub type Nanos = u64;

/// A slice, counter, flow or arg name: usually a `&'static str`, owned when read
/// back from a file.
pub type Name = Cow<'static, str>;

/// Identifies a track (one timeline row: a CPU thread or an accelerator stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrackId(pub u32);

/// What a track's slices run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TrackKind {
    /// A host thread (one per CPU worker).
    Cpu,
    /// An accelerator stream (compute, copy).
    Accelerator,
}

impl TrackKind {
    /// `"cpu"` or `"acc"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Accelerator => "acc",
        }
    }
}

/// One timeline row.
#[derive(Clone, Debug, PartialEq)]
pub struct Track {
    /// Its id (unique within a trace).
    pub id: TrackId,
    /// Display name, e.g. `cpu worker 0` or `acc stream compute`.
    pub name: String,
    /// CPU thread or accelerator stream.
    pub kind: TrackKind,
}

/// Direction of a host/device transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Host to device (`"h2d"`).
    HostToDevice,
    /// Device to host (`"d2h"`).
    DeviceToHost,
}

impl Direction {
    /// `"h2d"` or `"d2h"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HostToDevice => "h2d",
            Self::DeviceToHost => "d2h",
        }
    }

    /// Parses `"h2d"` / `"d2h"`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "h2d" => Some(Self::HostToDevice),
            "d2h" => Some(Self::DeviceToHost),
            _ => None,
        }
    }
}

/// Where a piece of work ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// The host CPU (`"cpu"`).
    Cpu,
    /// Accelerator number `n` (`"acc0"`, `"acc1"`, ...).
    Accelerator(u32),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Accelerator(n) => write!(f, "acc{n}"),
        }
    }
}

impl Device {
    /// Parses `"cpu"` or `"accN"`.
    pub fn parse(s: &str) -> Option<Self> {
        if s == "cpu" {
            return Some(Self::Cpu);
        }
        let n = s.strip_prefix("acc")?;
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        n.parse().ok().map(Self::Accelerator)
    }
}

/// The arguments a slice or instant event carries. All optional; `extra` holds
/// further numeric arguments by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Args {
    /// 0-based epoch.
    pub epoch: Option<u64>,
    /// Batch index within the epoch.
    pub batch: Option<u64>,
    /// Super-batch index within the epoch.
    pub super_batch: Option<u64>,
    /// GNN layer (0 = input layer).
    pub layer: Option<u32>,
    /// Bytes moved or produced.
    pub bytes: Option<u64>,
    /// For transfers: which way `bytes` went.
    pub direction: Option<Direction>,
    /// Where the work ran.
    pub device: Option<Device>,
    /// Weight-version gap of a reused historical embedding (steps between the
    /// version it was computed with and the version that used it).
    pub staleness_gap: Option<u64>,
    /// Other numeric arguments.
    pub extra: Vec<(Name, f64)>,
}

/// A piece of work on a track: `[start, end]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Slice {
    /// The track it ran on.
    pub track: TrackId,
    /// Stage name (`sample`, `gather`, `forward`, ...).
    pub name: Name,
    /// Start time.
    pub start: Nanos,
    /// End time (≥ `start`).
    pub end: Nanos,
    /// Arguments.
    pub args: Args,
}

impl Slice {
    /// `end - start` (0 for a malformed slice whose end precedes its start).
    pub fn duration(&self) -> Nanos {
        self.end.saturating_sub(self.start)
    }
}

/// One end of a flow: a time inside a slice on a track. The flow binds to the
/// innermost slice of that track enclosing `ts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowPoint {
    /// The track.
    pub track: TrackId,
    /// A time inside the slice the arrow attaches to.
    pub ts: Nanos,
}

/// An arrow between slices: a dependency, usually across tracks (prepare of batch
/// `k` → compute of batch `k`; a CPU hot embedding → its use on the accelerator).
#[derive(Clone, Debug, PartialEq)]
pub struct Flow {
    /// Unique within a trace.
    pub id: u64,
    /// What the arrow means.
    pub name: Name,
    /// The producing slice.
    pub from: FlowPoint,
    /// The consuming slice.
    pub to: FlowPoint,
}

/// One sample of a counter series.
#[derive(Clone, Debug, PartialEq)]
pub struct Counter {
    /// Series name (`cpu.util`, `acc0.mem_used_mib`, ...).
    pub name: Name,
    /// When it was sampled.
    pub ts: Nanos,
    /// The value.
    pub value: f64,
}

/// A point event on a track (a decision, a wait, a reuse of a stale embedding).
#[derive(Clone, Debug, PartialEq)]
pub struct InstantEvent {
    /// The track.
    pub track: TrackId,
    /// Event name.
    pub name: Name,
    /// When.
    pub ts: Nanos,
    /// Arguments.
    pub args: Args,
}

/// A whole trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// Declared tracks, by id.
    pub tracks: Vec<Track>,
    /// Slices, ordered by start time.
    pub slices: Vec<Slice>,
    /// Flows, ordered by id.
    pub flows: Vec<Flow>,
    /// Counter samples, ordered by time.
    pub counters: Vec<Counter>,
    /// Instant events, ordered by time.
    pub instants: Vec<InstantEvent>,
    /// Remarks about the recording (e.g. why accelerator counters are missing).
    pub notes: Vec<String>,
}

impl Trace {
    /// The track with id `id`.
    pub fn track(&self, id: TrackId) -> Option<&Track> {
        self.tracks.iter().find(|t| t.id == id)
    }

    /// `[first slice start, last slice end]`, or `None` without slices.
    pub fn span(&self) -> Option<(Nanos, Nanos)> {
        let start = self.slices.iter().map(|s| s.start).min()?;
        let end = self.slices.iter().map(|s| s.end).max()?;
        Some((start, end))
    }

    /// Names of the counter series, in order of first appearance.
    pub fn counter_names(&self) -> Vec<&str> {
        let mut seen = HashSet::new();
        self.counters
            .iter()
            .map(|c| c.name.as_ref())
            .filter(|n| seen.insert(*n))
            .collect()
    }

    /// The samples of counter `name`, in time order.
    pub fn counter_series<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Counter> + 'a {
        self.counters.iter().filter(move |c| c.name == name)
    }

    /// Puts slices, counters and instants in time order and flows in id order (the
    /// order the writer emits and [`Trace::validate`] expects for counters).
    pub fn sort(&mut self) {
        self.slices
            .sort_by(|a, b| (a.start, b.end, a.track).cmp(&(b.start, a.end, b.track)));
        self.counters.sort_by_key(|c| c.ts);
        self.instants.sort_by_key(|i| i.ts);
        self.flows.sort_by_key(|f| f.id);
        self.tracks.sort_by_key(|t| t.id);
    }

    /// Checks the structure: unique tracks; every slice and instant on a declared
    /// track; `start <= end`; slices on one track nest (no partial overlap); each
    /// counter series in non-decreasing time order with finite values; unique flow
    /// ids, each end inside a slice of its track, the arrow not going back in time.
    /// Returns the first problem found, in words.
    pub fn validate(&self) -> Result<(), String> {
        let mut ids = HashSet::new();
        for t in &self.tracks {
            if !ids.insert(t.id) {
                return Err(format!("track id {} is declared twice", t.id.0));
            }
            if t.name.is_empty() {
                return Err(format!("track id {} has an empty name", t.id.0));
            }
        }
        for s in &self.slices {
            if !ids.contains(&s.track) {
                return Err(format!(
                    "slice `{}` at {} ns is on track {}, which is not declared",
                    s.name, s.start, s.track.0
                ));
            }
            if s.start > s.end {
                return Err(format!(
                    "slice `{}` on track {} ends ({} ns) before it starts ({} ns)",
                    s.name, s.track.0, s.end, s.start
                ));
            }
        }
        for i in &self.instants {
            if !ids.contains(&i.track) {
                return Err(format!(
                    "instant `{}` at {} ns is on track {}, which is not declared",
                    i.name, i.ts, i.track.0
                ));
            }
        }
        let tops = top_level_slices(self);
        if let Some((track, (a, b))) = tops.partial {
            return Err(format!(
                "slices `{a}` and `{b}` on track {} overlap without nesting",
                track.0
            ));
        }
        let mut last: HashMap<&str, Nanos> = HashMap::new();
        for c in &self.counters {
            if !c.value.is_finite() {
                return Err(format!(
                    "counter `{}` at {} ns has a non-finite value",
                    c.name, c.ts
                ));
            }
            if let Some(prev) = last.insert(c.name.as_ref(), c.ts) {
                if c.ts < prev {
                    return Err(format!(
                        "counter `{}` goes back in time ({} ns after {} ns)",
                        c.name, c.ts, prev
                    ));
                }
            }
        }
        let mut flow_ids = HashSet::new();
        for f in &self.flows {
            if !flow_ids.insert(f.id) {
                return Err(format!("flow id {} is used twice", f.id));
            }
            for (end, p) in [("start", f.from), ("end", f.to)] {
                if !tops.encloses(p) {
                    return Err(format!(
                        "flow {} (`{}`): its {end} at {} ns on track {} is inside no slice",
                        f.id, f.name, p.ts, p.track.0
                    ));
                }
            }
            if f.to.ts < f.from.ts {
                return Err(format!(
                    "flow {} (`{}`) goes back in time ({} ns → {} ns)",
                    f.id, f.name, f.from.ts, f.to.ts
                ));
            }
        }
        Ok(())
    }
}

/// Per track, the outermost slices as disjoint sorted intervals, and the first
/// partially overlapping pair found (if any).
pub(crate) struct TopLevel<'a> {
    /// Track → sorted, disjoint `[start, end]` of its outermost slices.
    pub(crate) intervals: HashMap<TrackId, Vec<(Nanos, Nanos)>>,
    /// A track with two slices that overlap without nesting.
    partial: Option<(TrackId, (&'a str, &'a str))>,
}

impl TopLevel<'_> {
    /// Whether `p.ts` lies inside a slice of `p.track`.
    pub(crate) fn encloses(&self, p: FlowPoint) -> bool {
        let Some(iv) = self.intervals.get(&p.track) else {
            return false;
        };
        let k = iv.partition_point(|&(s, _)| s <= p.ts);
        k > 0 && iv[k - 1].1 >= p.ts
    }
}

/// Computes [`TopLevel`] for `trace`.
pub(crate) fn top_level_slices(trace: &Trace) -> TopLevel<'_> {
    let mut by_track: HashMap<TrackId, Vec<&Slice>> = HashMap::new();
    for s in &trace.slices {
        by_track.entry(s.track).or_default().push(s);
    }
    let mut intervals = HashMap::new();
    let mut partial = None;
    for (track, mut list) in by_track {
        list.sort_by(|a, b| (a.start, b.end).cmp(&(b.start, a.end)));
        let mut tops: Vec<(Nanos, Nanos)> = Vec::new();
        // The chain of open slices containing the current one, innermost last.
        let mut open: Vec<&Slice> = Vec::new();
        for s in list {
            while open.last().is_some_and(|o| o.end <= s.start) {
                open.pop();
            }
            if let Some(o) = open.last() {
                if s.end > o.end && partial.is_none() {
                    partial = Some((track, (o.name.as_ref(), s.name.as_ref())));
                }
            } else {
                tops.push((s.start, s.end));
            }
            open.push(s);
        }
        intervals.insert(track, tops);
    }
    TopLevel { intervals, partial }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(track: u32, name: &'static str, start: Nanos, end: Nanos) -> Slice {
        Slice {
            track: TrackId(track),
            name: name.into(),
            start,
            end,
            args: Args::default(),
        }
    }

    fn two_tracks() -> Trace {
        Trace {
            tracks: vec![
                Track {
                    id: TrackId(0),
                    name: "cpu worker 0".into(),
                    kind: TrackKind::Cpu,
                },
                Track {
                    id: TrackId(1),
                    name: "acc stream compute".into(),
                    kind: TrackKind::Accelerator,
                },
            ],
            slices: vec![
                slice(0, "prepare", 0, 100),
                slice(0, "sample", 10, 40),
                slice(0, "gather", 40, 90),
                slice(1, "forward", 120, 200),
            ],
            ..Trace::default()
        }
    }

    #[test]
    fn a_good_trace_validates() {
        let mut t = two_tracks();
        t.flows.push(Flow {
            id: 1,
            name: "prepare→compute".into(),
            from: FlowPoint {
                track: TrackId(0),
                ts: 65,
            },
            to: FlowPoint {
                track: TrackId(1),
                ts: 160,
            },
        });
        t.validate().unwrap();
        assert_eq!(t.span(), Some((0, 200)));
    }

    #[test]
    fn validate_names_each_problem() {
        let mut t = two_tracks();
        t.slices.push(slice(7, "lost", 0, 1));
        assert!(t.validate().unwrap_err().contains("track 7"));

        let mut t = two_tracks();
        t.slices.push(slice(1, "backwards", 300, 250));
        assert!(t.validate().unwrap_err().contains("ends (250 ns) before"));

        let mut t = two_tracks();
        t.slices.push(slice(0, "straddle", 95, 110));
        let e = t.validate().unwrap_err();
        assert!(e.contains("overlap without nesting"), "{e}");

        let mut t = two_tracks();
        for (ts, v) in [(10, 1.0), (5, 2.0)] {
            t.counters.push(Counter {
                name: "cpu.util".into(),
                ts,
                value: v,
            });
        }
        assert!(t.validate().unwrap_err().contains("back in time"));

        let mut t = two_tracks();
        t.flows.push(Flow {
            id: 3,
            name: "f".into(),
            from: FlowPoint {
                track: TrackId(0),
                ts: 105,
            },
            to: FlowPoint {
                track: TrackId(1),
                ts: 150,
            },
        });
        assert!(t.validate().unwrap_err().contains("inside no slice"));
    }

    #[test]
    fn device_and_direction_round_trip() {
        for d in [Device::Cpu, Device::Accelerator(0), Device::Accelerator(12)] {
            assert_eq!(Device::parse(&d.to_string()), Some(d));
        }
        assert_eq!(Device::parse("acc"), None);
        assert_eq!(Device::parse("acc-1"), None);
        assert_eq!(Device::parse("gpu0"), None);
        for d in [Direction::HostToDevice, Direction::DeviceToHost] {
            assert_eq!(Direction::parse(d.as_str()), Some(d));
        }
    }
}
