//! The end-of-run summary of a trace: per-stage and per-track busy time, CPU and
//! accelerator overlap, bytes over PCIe, cache hit rate, staleness histogram and
//! utilization averages — computed by [`summarize`], printed by its `Display` as a
//! table a person reads in ten seconds.
//!
//! Definitions (also in `docs/tracing.md`):
//! * **wall**: first slice start to last slice end.
//! * **stage busy**: the sum of the durations of the slices with that name, over all
//!   tracks (so a stage running on two tracks at once can exceed 100% of wall).
//! * **track busy**: the union of the track's slices (nested slices count once);
//!   idle = wall − busy.
//! * **cpu busy / acc busy**: time when at least one CPU (accelerator) track is
//!   busy; **≥2 cpu** when at least two CPU tracks are; **overlap** when a CPU and
//!   an accelerator track are busy at once.
//! * **h2d / d2h**: bytes of slices whose `dir` argument says so (or, without one,
//!   that are named `h2d` / `d2h`), and the bandwidth while they ran.
//! * **staleness**: histogram of `staleness_gap` over slices and instant events.
//! * **utilization**: plain means of the counter samples.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use super::model::{top_level_slices, Direction, Nanos, Trace, TrackId, TrackKind};
use super::recorder::HOST_BACKEND;
use super::sampler::{
    parse_acc_counter, CACHE_HIT_RATE, CPU_UTIL, NO_ACCELERATOR_COUNTERS, PROCESS_CPU,
    PROCESS_RSS_MIB,
};

/// Totals of one stage (slice name).
#[derive(Clone, Debug, PartialEq)]
pub struct StageStats {
    /// The slice name.
    pub name: String,
    /// Number of slices.
    pub count: u64,
    /// Sum of their durations.
    pub busy: Nanos,
    /// Sum of their `bytes` arguments.
    pub bytes: u64,
}

/// Busy time of one track.
#[derive(Clone, Debug, PartialEq)]
pub struct TrackStats {
    /// The track.
    pub id: TrackId,
    /// Its name.
    pub name: String,
    /// CPU or accelerator.
    pub kind: TrackKind,
    /// Union of its slices.
    pub busy: Nanos,
    /// Number of slices on it.
    pub slices: u64,
}

/// Transfers in one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TransferStats {
    /// Number of transfer slices.
    pub count: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Sum of their durations.
    pub busy: Nanos,
}

/// Statistics of one counter series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeriesStats {
    /// Number of samples.
    pub samples: u64,
    /// Mean of the samples.
    pub mean: f64,
    /// Largest sample.
    pub max: f64,
    /// Last sample.
    pub last: f64,
}

/// Counters of one accelerator.
#[derive(Clone, Debug, PartialEq)]
pub struct AccStats {
    /// Device index.
    pub index: u32,
    /// Utilization, percent.
    pub util: Option<SeriesStats>,
    /// Memory in use, MiB.
    pub mem_mib: Option<SeriesStats>,
}

/// The summary of a trace; see the module doc for the definitions.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// First slice start.
    pub start: Nanos,
    /// Last slice end − first slice start.
    pub wall: Nanos,
    /// Number of slices.
    pub slices: u64,
    /// Per stage, busiest first.
    pub stages: Vec<StageStats>,
    /// Per track, in track order.
    pub tracks: Vec<TrackStats>,
    /// Time at least one CPU track is busy.
    pub cpu_busy: Nanos,
    /// Time at least two CPU tracks are busy.
    pub cpu_parallel: Nanos,
    /// Time at least one accelerator track is busy (`None`: no accelerator tracks).
    pub acc_busy: Option<Nanos>,
    /// Time a CPU and an accelerator track are both busy (`None`: no accelerator
    /// tracks).
    pub overlap: Option<Nanos>,
    /// Host → device transfers.
    pub h2d: TransferStats,
    /// Device → host transfers.
    pub d2h: TransferStats,
    /// The `cache.hit_rate` counter.
    pub cache_hit_rate: Option<SeriesStats>,
    /// Staleness gap → number of reuses with that gap.
    pub staleness: BTreeMap<u64, u64>,
    /// The `cpu.util` counter (machine, percent).
    pub cpu_util: Option<SeriesStats>,
    /// The `process.cpu` counter (percent of the machine).
    pub process_cpu: Option<SeriesStats>,
    /// The `process.rss_mib` counter.
    pub rss_mib: Option<SeriesStats>,
    /// Per accelerator with counters, by index.
    pub accelerators: Vec<AccStats>,
    /// The trace's notes.
    pub notes: Vec<String>,
    /// Every accelerator track is the host backend's ([`HOST_BACKEND`]): the
    /// run had no accelerator, and the summary says what the CPU did in those
    /// terms (no transfer rates, no accelerator counters).
    pub host_backend: bool,
}

impl Summary {
    /// Largest staleness gap recorded.
    pub fn max_staleness(&self) -> Option<u64> {
        self.staleness.keys().next_back().copied()
    }

    /// Number of reuses recorded (events with a `staleness_gap`).
    pub fn reuses(&self) -> u64 {
        self.staleness.values().sum()
    }
}

fn series(trace: &Trace, name: &str) -> Option<SeriesStats> {
    let mut s: Option<SeriesStats> = None;
    let mut sum = 0.0;
    for c in trace.counter_series(name) {
        sum += c.value;
        s = Some(match s {
            None => SeriesStats {
                samples: 1,
                mean: 0.0,
                max: c.value,
                last: c.value,
            },
            Some(p) => SeriesStats {
                samples: p.samples + 1,
                mean: 0.0,
                max: p.max.max(c.value),
                last: c.value,
            },
        });
    }
    s.map(|s| SeriesStats {
        mean: sum / s.samples as f64,
        ..s
    })
}

/// Time covered by `≥ 1` and `≥ 2` of the CPU intervals, `≥ 1` of the accelerator
/// intervals, and by both kinds at once. Each track's intervals must be disjoint.
fn sweep(intervals: &[(Nanos, Nanos, TrackKind)]) -> (Nanos, Nanos, Nanos, Nanos) {
    let mut events: Vec<(Nanos, i32, TrackKind)> = Vec::with_capacity(intervals.len() * 2);
    for &(s, e, k) in intervals {
        if e > s {
            events.push((s, 1, k));
            events.push((e, -1, k));
        }
    }
    // Ends before starts at the same time: touching intervals do not overlap.
    events.sort_by_key(|&(t, d, _)| (t, d));
    let (mut cpu, mut acc) = (0i32, 0i32);
    let (mut cpu_any, mut cpu_two, mut acc_any, mut both) = (0, 0, 0, 0);
    let mut last = events.first().map_or(0, |e| e.0);
    for (t, d, k) in events {
        let dt = t - last;
        if cpu >= 1 {
            cpu_any += dt;
        }
        if cpu >= 2 {
            cpu_two += dt;
        }
        if acc >= 1 {
            acc_any += dt;
        }
        if cpu >= 1 && acc >= 1 {
            both += dt;
        }
        match k {
            TrackKind::Cpu => cpu += d,
            TrackKind::Accelerator => acc += d,
        }
        last = t;
    }
    (cpu_any, cpu_two, acc_any, both)
}

/// Summarizes `trace`.
pub fn summarize(trace: &Trace) -> Summary {
    let (start, end) = trace.span().unwrap_or((0, 0));
    let mut stages: Vec<StageStats> = Vec::new();
    let mut stage_index: HashMap<&str, usize> = HashMap::new();
    let mut per_track: HashMap<TrackId, u64> = HashMap::new();
    let (mut h2d, mut d2h) = (TransferStats::default(), TransferStats::default());
    let mut staleness = BTreeMap::new();
    for s in &trace.slices {
        let k = *stage_index.entry(s.name.as_ref()).or_insert_with(|| {
            stages.push(StageStats {
                name: s.name.to_string(),
                count: 0,
                busy: 0,
                bytes: 0,
            });
            stages.len() - 1
        });
        let st = &mut stages[k];
        st.count += 1;
        st.busy += s.duration();
        st.bytes += s.args.bytes.unwrap_or(0);
        *per_track.entry(s.track).or_default() += 1;
        let dir = s.args.direction.or(match s.name.as_ref() {
            "h2d" => Some(Direction::HostToDevice),
            "d2h" => Some(Direction::DeviceToHost),
            _ => None,
        });
        if let Some(dir) = dir {
            let t = match dir {
                Direction::HostToDevice => &mut h2d,
                Direction::DeviceToHost => &mut d2h,
            };
            t.count += 1;
            t.bytes += s.args.bytes.unwrap_or(0);
            t.busy += s.duration();
        }
        if let Some(g) = s.args.staleness_gap {
            *staleness.entry(g).or_insert(0) += 1;
        }
    }
    for i in &trace.instants {
        if let Some(g) = i.args.staleness_gap {
            *staleness.entry(g).or_insert(0) += 1;
        }
    }
    stages.sort_by(|a, b| b.busy.cmp(&a.busy).then_with(|| a.name.cmp(&b.name)));

    let tops = top_level_slices(trace);
    let mut intervals = Vec::new();
    let mut tracks = Vec::new();
    for t in &trace.tracks {
        let iv = tops.intervals.get(&t.id).map_or(&[][..], Vec::as_slice);
        intervals.extend(iv.iter().map(|&(s, e)| (s, e, t.kind)));
        tracks.push(TrackStats {
            id: t.id,
            name: t.name.clone(),
            kind: t.kind,
            busy: iv.iter().map(|&(s, e)| e - s).sum(),
            slices: per_track.get(&t.id).copied().unwrap_or(0),
        });
    }
    let (cpu_busy, cpu_parallel, acc_busy, both) = sweep(&intervals);
    let has_acc = trace
        .tracks
        .iter()
        .any(|t| t.kind == TrackKind::Accelerator);

    let mut acc_ids: Vec<u32> = trace
        .counter_names()
        .into_iter()
        .filter_map(|n| parse_acc_counter(n).map(|(i, _)| i))
        .collect();
    acc_ids.sort_unstable();
    acc_ids.dedup();
    let accelerators = acc_ids
        .into_iter()
        .map(|i| AccStats {
            index: i,
            util: series(trace, &super::sampler::acc_util_counter(i)),
            mem_mib: series(trace, &super::sampler::acc_mem_counter(i)),
        })
        .collect();

    Summary {
        start,
        wall: end - start,
        slices: trace.slices.len() as u64,
        stages,
        tracks,
        cpu_busy,
        cpu_parallel,
        acc_busy: has_acc.then_some(acc_busy),
        overlap: has_acc.then_some(both),
        h2d,
        d2h,
        cache_hit_rate: series(trace, CACHE_HIT_RATE),
        staleness,
        cpu_util: series(trace, CPU_UTIL),
        process_cpu: series(trace, PROCESS_CPU),
        rss_mib: series(trace, PROCESS_RSS_MIB),
        accelerators,
        notes: trace.notes.clone(),
        host_backend: has_acc
            && trace
                .tracks
                .iter()
                .filter(|t| t.kind == TrackKind::Accelerator)
                .all(|t| t.name.starts_with(HOST_BACKEND)),
    }
}

/// `n` and the noun, plural unless `n` is 1: `1 layer`, `2 layers`, `0 threads`,
/// `3 batches` (`noun` is the singular; the plural adds `es` after `ch`, `sh`,
/// `s` and `x`, else `s`).
pub fn fmt_count(n: usize, noun: &str) -> String {
    if n == 1 {
        return format!("1 {noun}");
    }
    let es = ["ch", "sh", "s", "x"].iter().any(|end| noun.ends_with(end));
    format!("{n} {noun}{}", if es { "es" } else { "s" })
}

/// `1.50 GiB`, `12.0 MiB`, `512 B`.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v >= 100.0 {
        format!("{v:.0} {}", UNITS[u])
    } else if v >= 10.0 {
        format!("{v:.1} {}", UNITS[u])
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

fn secs(ns: Nanos) -> f64 {
    ns as f64 / 1e9
}

/// `part` as a percentage of `whole` (0 when `whole` is 0).
fn pct(part: Nanos, whole: Nanos) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

fn fmt_transfer(name: &str, t: &TransferStats) -> String {
    if t.count == 0 {
        return format!("{name} none");
    }
    let rate = if t.busy > 0 {
        format!(", {:.2} GB/s while copying", t.bytes as f64 / t.busy as f64)
    } else {
        String::new()
    };
    let plural = if t.count == 1 { "copy" } else { "copies" };
    format!(
        "{name} {} in {} {plural}{rate}",
        fmt_bytes(t.bytes),
        t.count
    )
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ncpu, nacc) = self.tracks.iter().fold((0, 0), |(c, a), t| match t.kind {
            TrackKind::Cpu => (c + 1, a),
            TrackKind::Accelerator => (c, a + 1),
        });
        // What the accelerator tracks are called: the host backend's are the CPU's.
        let acc = if self.host_backend {
            HOST_BACKEND
        } else {
            "acc"
        };
        writeln!(
            f,
            "trace summary: {:.3} s wall, {} tracks ({ncpu} cpu, {nacc} {acc}), {} slices",
            secs(self.wall),
            self.tracks.len(),
            self.slices
        )?;
        if !self.stages.is_empty() {
            let w = self
                .stages
                .iter()
                .map(|s| s.name.len())
                .max()
                .unwrap_or(5)
                .max(5);
            writeln!(
                f,
                "  {:<w$}  {:>7}  {:>9}  {:>7}  {:>9}  {:>10}",
                "stage", "count", "busy s", "% wall", "mean ms", "bytes"
            )?;
            for s in &self.stages {
                let bytes = if s.bytes > 0 {
                    fmt_bytes(s.bytes)
                } else {
                    "-".into()
                };
                writeln!(
                    f,
                    "  {:<w$}  {:>7}  {:>9.3}  {:>6.1}%  {:>9.3}  {:>10}",
                    s.name,
                    s.count,
                    secs(s.busy),
                    pct(s.busy, self.wall),
                    s.busy as f64 / 1e6 / s.count.max(1) as f64,
                    bytes
                )?;
            }
        }
        if !self.tracks.is_empty() {
            let w = self
                .tracks
                .iter()
                .map(|t| t.name.len())
                .max()
                .unwrap_or(5)
                .max(5);
            writeln!(
                f,
                "  {:<w$}  {:>4}  {:>9}  {:>9}  {:>7}",
                "track", "kind", "busy s", "idle s", "busy"
            )?;
            for t in &self.tracks {
                writeln!(
                    f,
                    "  {:<w$}  {:>4}  {:>9.3}  {:>9.3}  {:>6.1}%",
                    t.name,
                    t.kind.as_str(),
                    secs(t.busy),
                    secs(self.wall.saturating_sub(t.busy)),
                    pct(t.busy, self.wall)
                )?;
            }
        }
        write!(
            f,
            "  overlap      cpu busy {:.3} s ({:.1}%), ≥2 cpu tracks {:.3} s ({:.1}%)",
            secs(self.cpu_busy),
            pct(self.cpu_busy, self.wall),
            secs(self.cpu_parallel),
            pct(self.cpu_parallel, self.wall)
        )?;
        match (self.acc_busy, self.overlap) {
            (Some(a), Some(o)) => writeln!(
                f,
                "; {acc} busy {:.3} s ({:.1}%); cpu ∧ {acc} {:.3} s ({:.1}% of wall)",
                secs(a),
                pct(a, self.wall),
                secs(o),
                pct(o, self.wall)
            )?,
            _ => writeln!(f, "; no accelerator tracks")?,
        }
        if self.host_backend {
            // Host memory to host memory: a copy, not a transfer with a rate.
            let copied = |t: &TransferStats| match t.count {
                0 => "none".to_string(),
                n => format!(
                    "{} in {}",
                    fmt_bytes(t.bytes),
                    fmt_count(n as usize, "copy")
                ),
            };
            writeln!(
                f,
                "  copies       into the host backend's buffers {}; out of them {}",
                copied(&self.h2d),
                copied(&self.d2h)
            )?;
        } else {
            writeln!(
                f,
                "  transfers    {}; {}",
                fmt_transfer("h2d", &self.h2d),
                fmt_transfer("d2h", &self.d2h)
            )?;
        }
        match &self.cache_hit_rate {
            Some(c) => writeln!(
                f,
                "  cache        hit rate last {:.3}, mean {:.3} ({} samples)",
                c.last, c.mean, c.samples
            )?,
            None => writeln!(f, "  cache        hit rate not recorded")?,
        }
        if self.staleness.is_empty() {
            writeln!(f, "  staleness    no reuse recorded")?;
        } else {
            let mean = self.staleness.iter().map(|(g, n)| g * n).sum::<u64>() as f64
                / self.reuses() as f64;
            write!(
                f,
                "  staleness    {} reuses, max gap {}, mean {mean:.2}; gap:count",
                self.reuses(),
                self.max_staleness().unwrap_or(0)
            )?;
            for (k, (g, n)) in self.staleness.iter().enumerate() {
                if k == 12 {
                    write!(f, " …")?;
                    break;
                }
                write!(f, " {g}:{n}")?;
            }
            writeln!(f)?;
        }
        let mut util = Vec::new();
        match &self.cpu_util {
            Some(c) => util.push(format!("cpu {:.1}% mean (max {:.1}%)", c.mean, c.max)),
            None => util.push("cpu not recorded".into()),
        }
        if let Some(p) = &self.process_cpu {
            util.push(format!("process {:.1}%", p.mean));
        }
        if let Some(r) = &self.rss_mib {
            util.push(format!(
                "rss peak {}",
                fmt_bytes((r.max * 1024.0 * 1024.0) as u64)
            ));
        }
        writeln!(f, "  utilization  {}", util.join(", "))?;
        if self.accelerators.is_empty() && !self.host_backend {
            writeln!(f, "               accelerator not recorded")?;
        }
        for a in &self.accelerators {
            let u = a.util.map_or("util not recorded".into(), |u| {
                format!("{:.1}% mean", u.mean)
            });
            let m = a.mem_mib.map_or(String::new(), |m| {
                format!(
                    ", memory peak {}",
                    fmt_bytes((m.max * 1024.0 * 1024.0) as u64)
                )
            });
            writeln!(f, "               acc{} {u}{m}", a.index)?;
        }
        for n in &self.notes {
            // Without an accelerator, why its counters are missing is no news.
            if self.host_backend && n.starts_with(NO_ACCELERATOR_COUNTERS) {
                continue;
            }
            writeln!(f, "  note         {n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::model::{Args, Counter, InstantEvent, Slice, Track};

    #[test]
    fn counts_are_plural_unless_one() {
        assert_eq!(fmt_count(1, "layer"), "1 layer");
        assert_eq!(fmt_count(2, "layer"), "2 layers");
        assert_eq!(fmt_count(0, "thread"), "0 threads");
        assert_eq!(fmt_count(1, "batch"), "1 batch");
        assert_eq!(fmt_count(3, "batch"), "3 batches");
    }

    fn slice(track: u32, name: &'static str, start: Nanos, end: Nanos, args: Args) -> Slice {
        Slice {
            track: TrackId(track),
            name: name.into(),
            start,
            end,
            args,
        }
    }

    /// Two CPU workers and a copy and a compute stream, times in ms (×1e6 ns):
    /// ```text
    /// cpu 0   [sample 0-10][gather 10-30]      [sample 40-50]
    /// cpu 1          [prep 5----------------35] (with nested sample 5-15)
    /// copy                     [h2d 25-35]
    /// compute                        [forward 30-------60] [d2h 60-70 on copy]
    /// ```
    fn hand_made() -> Trace {
        let ms = 1_000_000u64;
        let tr = |id: u32, name: &str, kind| Track {
            id: TrackId(id),
            name: name.into(),
            kind,
        };
        let bytes = |b: u64| Args {
            bytes: Some(b),
            ..Args::default()
        };
        let mut t = Trace {
            tracks: vec![
                tr(0, "cpu worker 0", TrackKind::Cpu),
                tr(1, "cpu worker 1", TrackKind::Cpu),
                tr(2, "acc stream copy", TrackKind::Accelerator),
                tr(3, "acc stream compute", TrackKind::Accelerator),
            ],
            slices: vec![
                slice(0, "sample", 0, 10 * ms, Args::default()),
                slice(0, "gather", 10 * ms, 30 * ms, bytes(4096)),
                slice(0, "sample", 40 * ms, 50 * ms, Args::default()),
                slice(1, "prep", 5 * ms, 35 * ms, Args::default()),
                slice(1, "sample", 5 * ms, 15 * ms, Args::default()),
                slice(2, "h2d", 25 * ms, 35 * ms, bytes(3 << 30)),
                slice(3, "forward", 30 * ms, 60 * ms, Args::default()),
                slice(
                    2,
                    "copy",
                    60 * ms,
                    70 * ms,
                    Args {
                        bytes: Some(1 << 20),
                        direction: Some(Direction::DeviceToHost),
                        staleness_gap: Some(0),
                        ..Args::default()
                    },
                ),
            ],
            notes: vec!["a note".into()],
            ..Trace::default()
        };
        for (ts, v) in [(0, 20.0), (ms, 40.0), (2 * ms, 90.0)] {
            t.counters.push(Counter {
                name: CPU_UTIL.into(),
                ts,
                value: v,
            });
            t.counters.push(Counter {
                name: "acc0.util".into(),
                ts,
                value: v / 2.0,
            });
            t.counters.push(Counter {
                name: CACHE_HIT_RATE.into(),
                ts,
                value: v / 100.0,
            });
        }
        for g in [1, 2, 2] {
            t.instants.push(InstantEvent {
                track: TrackId(3),
                name: "reuse".into(),
                ts: 45 * ms,
                args: Args {
                    staleness_gap: Some(g),
                    ..Args::default()
                },
            });
        }
        t.sort();
        t.validate().unwrap();
        t
    }

    #[test]
    fn exact_numbers_on_a_hand_made_trace() {
        let ms = 1_000_000u64;
        let s = summarize(&hand_made());
        assert_eq!((s.start, s.wall, s.slices), (0, 70 * ms, 8));
        let stage = |n: &str| s.stages.iter().find(|st| st.name == n).unwrap().clone();
        assert_eq!(stage("sample").count, 3);
        assert_eq!(stage("sample").busy, 30 * ms);
        assert_eq!(stage("gather").bytes, 4096);
        let order: Vec<&str> = s.stages.iter().map(|st| st.name.as_str()).collect();
        assert_eq!(
            order,
            ["forward", "prep", "sample", "gather", "copy", "h2d"],
            "busiest first, ties by name"
        );
        let busy: Vec<Nanos> = s.tracks.iter().map(|t| t.busy).collect();
        // cpu1: prep 5-35 with a nested sample counted once.
        assert_eq!(busy, [40 * ms, 30 * ms, 20 * ms, 30 * ms]);
        assert_eq!(s.tracks[1].slices, 2);
        // CPU busy: 0-35 and 40-50; both CPU tracks: 5-30.
        assert_eq!(s.cpu_busy, 45 * ms);
        assert_eq!(s.cpu_parallel, 25 * ms);
        // Accelerator busy 25-70; overlap with CPU: 25-35 and 40-50.
        assert_eq!(s.acc_busy, Some(45 * ms));
        assert_eq!(s.overlap, Some(20 * ms));
        assert_eq!(
            s.h2d,
            TransferStats {
                count: 1,
                bytes: 3 << 30,
                busy: 10 * ms
            }
        );
        assert_eq!(
            s.d2h,
            TransferStats {
                count: 1,
                bytes: 1 << 20,
                busy: 10 * ms
            }
        );
        let c = s.cache_hit_rate.unwrap();
        assert_eq!((c.samples, c.last, c.max), (3, 0.9, 0.9));
        assert!((c.mean - 0.5).abs() < 1e-12);
        assert_eq!(
            s.staleness
                .iter()
                .map(|(&g, &n)| (g, n))
                .collect::<Vec<_>>(),
            [(0, 1), (1, 1), (2, 2)]
        );
        assert_eq!(s.max_staleness(), Some(2));
        assert!((s.cpu_util.unwrap().mean - 50.0).abs() < 1e-12);
        assert_eq!(s.accelerators.len(), 1);
        assert!((s.accelerators[0].util.unwrap().mean - 25.0).abs() < 1e-12);
        assert!(s.process_cpu.is_none() && s.rss_mib.is_none());
        for t in &s.tracks {
            assert!(t.busy <= s.wall);
        }

        let text = s.to_string();
        for want in [
            "trace summary: 0.070 s wall, 4 tracks (2 cpu, 2 acc), 8 slices",
            "cpu busy 0.045 s (64.3%), ≥2 cpu tracks 0.025 s (35.7%)",
            "cpu ∧ acc 0.020 s (28.6% of wall)",
            "h2d 3.00 GiB in 1 copy, 322.12 GB/s while copying",
            "d2h 1.00 MiB in 1 copy, 0.10 GB/s",
            "hit rate last 0.900, mean 0.500 (3 samples)",
            "4 reuses, max gap 2, mean 1.25; gap:count 0:1 1:1 2:2",
            "cpu 50.0% mean (max 90.0%)",
            "acc0 25.0% mean",
            "note         a note",
        ] {
            assert!(text.contains(want), "missing `{want}` in\n{text}");
        }
        // The sample row: 3 slices, 30 ms busy, 42.9% of 70 ms, 10 ms mean.
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("sample"))
            .unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols, ["sample", "3", "0.030", "42.9%", "10.000", "-"]);
    }

    #[test]
    fn empty_and_cpu_only_traces() {
        let s = summarize(&Trace::default());
        assert_eq!((s.wall, s.cpu_busy, s.slices), (0, 0, 0));
        let text = s.to_string();
        assert!(text.contains("no reuse recorded"), "{text}");
        assert!(text.contains("hit rate not recorded"), "{text}");
        assert!(text.contains("no accelerator tracks"), "{text}");
        assert!(text.contains("accelerator not recorded"), "{text}");

        let mut t = hand_made();
        t.tracks.retain(|t| t.kind == TrackKind::Cpu);
        t.slices.retain(|s| s.track.0 < 2);
        t.instants.clear();
        let s = summarize(&t);
        assert_eq!((s.acc_busy, s.overlap), (None, None));
        assert_eq!(s.wall, 50 * 1_000_000);
        assert_eq!(s.h2d, TransferStats::default());
        assert!(s.to_string().contains("h2d none; d2h none"));
    }

    #[test]
    fn bytes_format() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
        assert_eq!(fmt_bytes(12 << 20), "12.0 MiB");
        assert_eq!(fmt_bytes(300 << 30), "300 GiB");
    }
}
