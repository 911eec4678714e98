//! The recorder: [`Tracer`], a cheap handle that records slices, flows, counters
//! and instant events into per-thread shards.
//!
//! Hand-written rather than `tracing` with a Chrome layer: slices carry typed
//! arguments (epoch, batch, bytes, staleness gap) and flows that the summary, the
//! report and the tests read back, and a disabled tracer must cost one branch.
//!
//! # Cost
//! A disabled tracer (`Tracer::disabled()`, the default) holds no allocation; every
//! recording call is one `is_some` branch and returns. An enabled tracer takes the
//! time (`Instant::elapsed`, tens of nanoseconds) at the start and end of a slice
//! and, at its end, locks the recording thread's shard — a mutex only that thread
//! and the few threads hashed to the same shard ever take — to append the slice.
//! There is no process-wide lock per event; the track registry is locked once per
//! thread (when the thread first records) and when tracks are declared.
//!
//! # Tracks
//! Slices recorded without an explicit track go to the recording thread's own track,
//! created on first use and named after the thread: `cpu worker N` inside a rayon
//! pool (N = the pool's thread index), else its name if it has one, else
//! `cpu thread N`. Accelerator streams are tracks the user declares
//! ([`Tracer::declare_track`]) and records onto explicitly ([`Tracer::slice_on`],
//! [`Tracer::record_slice`]).
//!
//! # Flows
//! A [`FlowId`] from [`Tracer::flow`] is attached once as an outgoing end to the
//! producing slice ([`SliceGuard::flow_out`]) and once as an incoming end to the
//! consuming slice ([`SliceGuard::flow_in`]), on any threads, in either order. Each
//! end is placed at the middle of its slice. [`Tracer::collect`] pairs the ends;
//! an end whose partner has not been recorded yet waits for a later `collect`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::Instant;

use super::model::{
    Args, Counter, Device, Direction, Flow, FlowPoint, InstantEvent, Name, Nanos, Slice, Trace,
    Track, TrackId, TrackKind,
};

/// Process-wide source of per-thread keys (never reused, so a key identifies one
/// thread for the life of the process).
static NEXT_THREAD_KEY: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static THREAD_KEY: u64 = NEXT_THREAD_KEY.fetch_add(1, Ordering::Relaxed);
}

fn thread_key() -> u64 {
    THREAD_KEY.with(|k| *k)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock()
}

/// Records a trace. Cloning is cheap (an `Arc`); clones record into the same trace.
/// `Tracer::default()` is disabled.
#[derive(Clone, Default)]
pub struct Tracer {
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("enabled", &self.is_enabled())
            .finish()
    }
}

/// Identifies one flow (arrow) between two slices; see the module doc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowId {
    id: u64,
    name: &'static str,
}

impl FlowId {
    /// A flow id that records nothing (what a disabled tracer hands out).
    pub const NONE: FlowId = FlowId { id: 0, name: "" };

    /// The numeric id (0 for [`FlowId::NONE`]).
    pub fn id(self) -> u64 {
        self.id
    }
}

/// A value the counter sampler reads every tick and records as a counter of the
/// gauge's name (cache hit rate, staleness gap, ...). Setting it is one relaxed
/// atomic store. Cloning shares the value.
#[derive(Clone, Debug, Default)]
pub struct Gauge(Option<Arc<AtomicU64>>);

/// The bit pattern of an unset gauge (a NaN).
const UNSET: u64 = f64::NAN.to_bits();

impl Gauge {
    /// Sets the current value (a NaN clears it).
    pub fn set(&self, value: f64) {
        if let Some(a) = &self.0 {
            a.store(value.to_bits(), Ordering::Relaxed);
        }
    }

    /// Clears the value: the sampler records nothing for it until it is set again.
    pub fn clear(&self) {
        if let Some(a) = &self.0 {
            a.store(UNSET, Ordering::Relaxed);
        }
    }

    /// The current value, if set.
    pub fn get(&self) -> Option<f64> {
        let v = f64::from_bits(self.0.as_ref()?.load(Ordering::Relaxed));
        (!v.is_nan()).then_some(v)
    }
}

/// One end of a flow as recorded, waiting to be paired.
struct FlowEnd {
    id: u64,
    name: &'static str,
    outgoing: bool,
    point: FlowPoint,
}

/// Events recorded by the threads hashed to one shard.
#[derive(Default)]
struct Shard {
    /// Thread key → its track, for the threads of this shard that have one.
    threads: Vec<(u64, TrackId)>,
    slices: Vec<Slice>,
    flow_ends: Vec<FlowEnd>,
    counters: Vec<Counter>,
    instants: Vec<InstantEvent>,
}

struct Inner {
    epoch: Instant,
    shards: Box<[Mutex<Shard>]>,
    tracks: Mutex<Vec<Track>>,
    next_track: AtomicU32,
    unnamed_threads: AtomicU32,
    next_flow: AtomicU64,
    /// Flow ends recorded before a `collect` whose partner had not arrived yet.
    pending_flows: Mutex<Vec<FlowEnd>>,
    gauges: Mutex<Vec<(Name, Gauge)>>,
    notes: Mutex<Vec<String>>,
    /// What accelerator tracks declared from now on are named after in place of
    /// `acc stream` / `acc` ([`Tracer::name_accelerator`]).
    accelerator: Mutex<Option<String>>,
}

impl Inner {
    fn now(&self) -> Nanos {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Runs `f` on the calling thread's shard, with the thread's key.
    fn with_shard<R>(&self, f: impl FnOnce(&mut Shard, u64) -> R) -> R {
        let key = thread_key();
        let mut shard = lock(&self.shards[(key as usize) % self.shards.len()]);
        f(&mut shard, key)
    }

    /// The track of thread `key` (whose shard is `shard`), created on first use.
    fn thread_track(&self, shard: &mut Shard, key: u64) -> TrackId {
        if let Some(&(_, t)) = shard.threads.iter().find(|(k, _)| *k == key) {
            return t;
        }
        let base = match (std::thread::current().name(), rayon::current_thread_index()) {
            (_, Some(i)) => format!("cpu worker {i}"),
            (Some(n), None) => n.to_string(),
            (None, None) => format!(
                "cpu thread {}",
                self.unnamed_threads.fetch_add(1, Ordering::Relaxed)
            ),
        };
        let id = self.add_track(base, TrackKind::Cpu);
        shard.threads.push((key, id));
        id
    }

    /// Declares a track; a name already taken gets a ` (2)`, ` (3)`, ... suffix.
    fn add_track(&self, base: String, kind: TrackKind) -> TrackId {
        let base = match (kind, lock(&self.accelerator).as_deref()) {
            (TrackKind::Accelerator, Some(device)) => accelerator_name(&base, device),
            _ => base,
        };
        let mut tracks = lock(&self.tracks);
        let mut name = base.clone();
        let mut n = 2;
        while tracks.iter().any(|t| t.name == name) {
            name = format!("{base} ({n})");
            n += 1;
        }
        let id = TrackId(self.next_track.fetch_add(1, Ordering::Relaxed));
        tracks.push(Track { id, name, kind });
        id
    }
}

impl Tracer {
    /// An enabled tracer whose epoch (time 0) is now.
    pub fn new() -> Self {
        let n = std::thread::available_parallelism().map_or(4, |n| n.get());
        let shards = (n * 2).next_power_of_two().clamp(4, 256);
        Self {
            inner: Some(Arc::new(Inner {
                epoch: Instant::now(),
                shards: (0..shards).map(|_| Mutex::default()).collect(),
                tracks: Mutex::default(),
                next_track: AtomicU32::new(0),
                unnamed_threads: AtomicU32::new(0),
                next_flow: AtomicU64::new(1),
                pending_flows: Mutex::default(),
                gauges: Mutex::default(),
                notes: Mutex::default(),
                accelerator: Mutex::default(),
            })),
        }
    }

    /// A tracer that records nothing.
    pub fn disabled() -> Self {
        Self { inner: None }
    }

    /// Whether this tracer records.
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Nanoseconds since the tracer's epoch (0 when disabled).
    pub fn now(&self) -> Nanos {
        self.inner.as_ref().map_or(0, |i| i.now())
    }

    /// Declares a track (e.g. `acc stream compute`, [`TrackKind::Accelerator`]) to
    /// record onto with [`Tracer::slice_on`]. When disabled, returns a dummy id.
    pub fn declare_track(&self, name: impl Into<String>, kind: TrackKind) -> TrackId {
        match &self.inner {
            Some(i) => i.add_track(name.into(), kind),
            None => TrackId(u32::MAX),
        }
    }

    /// Names the accelerator tracks declared from now on after `device`: a
    /// track declared as `acc stream compute` or `acc sample`
    /// ([`TrackKind::Accelerator`]) is named `{device} compute`,
    /// `{device} sample`. A trainer whose device engine is the host backend sets
    /// `host backend`, so a CPU-only run's trace names no accelerator stream.
    pub fn name_accelerator(&self, device: &str) {
        if let Some(i) = &self.inner {
            *lock(&i.accelerator) = Some(device.to_string());
        }
    }

    /// The calling thread's own track, created on first use (see the module doc).
    /// When disabled, returns a dummy id.
    pub fn thread_track(&self) -> TrackId {
        match &self.inner {
            Some(i) => i.with_shard(|s, key| i.thread_track(s, key)),
            None => TrackId(u32::MAX),
        }
    }

    /// Starts a slice on the calling thread's track; it ends when the guard drops.
    #[inline]
    pub fn slice(&self, name: &'static str) -> SliceGuard<'_> {
        self.start_slice(None, name)
    }

    /// Starts a slice on a declared track; it ends when the guard drops.
    #[inline]
    pub fn slice_on(&self, track: TrackId, name: &'static str) -> SliceGuard<'_> {
        self.start_slice(Some(track), name)
    }

    #[inline]
    fn start_slice(&self, track: Option<TrackId>, name: &'static str) -> SliceGuard<'_> {
        SliceGuard {
            active: self.inner.as_deref().map(|inner| ActiveSlice {
                inner,
                track,
                name,
                start: inner.now(),
                args: Args::default(),
                flows: Vec::new(),
            }),
        }
    }

    /// Records a finished slice with explicit times (e.g. accelerator work timed by
    /// stream events).
    pub fn record_slice(&self, slice: Slice) {
        if let Some(i) = &self.inner {
            i.with_shard(|s, _| s.slices.push(slice));
        }
    }

    /// A new flow id; attach it to one producing and one consuming slice.
    pub fn flow(&self, name: &'static str) -> FlowId {
        match &self.inner {
            Some(i) => FlowId {
                id: i.next_flow.fetch_add(1, Ordering::Relaxed),
                name,
            },
            None => FlowId::NONE,
        }
    }

    /// Records the outgoing end of `flow` at an explicit point (inside a slice).
    pub fn flow_out_at(&self, flow: FlowId, point: FlowPoint) {
        self.flow_end(flow, true, point);
    }

    /// Records the incoming end of `flow` at an explicit point (inside a slice).
    pub fn flow_in_at(&self, flow: FlowId, point: FlowPoint) {
        self.flow_end(flow, false, point);
    }

    fn flow_end(&self, flow: FlowId, outgoing: bool, point: FlowPoint) {
        if let (Some(i), true) = (&self.inner, flow.id != 0) {
            i.with_shard(|s, _| {
                s.flow_ends.push(FlowEnd {
                    id: flow.id,
                    name: flow.name,
                    outgoing,
                    point,
                })
            });
        }
    }

    /// Records a counter sample now.
    pub fn counter(&self, name: impl Into<Name>, value: f64) {
        if let Some(i) = &self.inner {
            let ts = i.now();
            let c = Counter {
                name: name.into(),
                ts,
                value,
            };
            i.with_shard(|s, _| s.counters.push(c));
        }
    }

    /// Records a counter sample at an explicit time.
    pub fn counter_at(&self, name: impl Into<Name>, ts: Nanos, value: f64) {
        if let Some(i) = &self.inner {
            let c = Counter {
                name: name.into(),
                ts,
                value,
            };
            i.with_shard(|s, _| s.counters.push(c));
        }
    }

    /// Records an instant event on the calling thread's track; `args` fills in its
    /// arguments (called only when enabled).
    pub fn instant(&self, name: &'static str, args: impl FnOnce(&mut Args)) {
        if let Some(i) = &self.inner {
            let ts = i.now();
            let mut a = Args::default();
            args(&mut a);
            i.with_shard(|s, key| {
                let track = i.thread_track(s, key);
                s.instants.push(InstantEvent {
                    track,
                    name: name.into(),
                    ts,
                    args: a,
                });
            });
        }
    }

    /// Records an instant event on a declared track.
    pub fn instant_on(&self, track: TrackId, name: &'static str, args: impl FnOnce(&mut Args)) {
        if let Some(i) = &self.inner {
            let ts = i.now();
            let mut a = Args::default();
            args(&mut a);
            i.with_shard(|s, _| {
                s.instants.push(InstantEvent {
                    track,
                    name: name.into(),
                    ts,
                    args: a,
                });
            });
        }
    }

    /// A gauge the counter sampler records under `name`; asking twice for one name
    /// gives the same gauge. Disabled: a gauge that records nothing.
    pub fn gauge(&self, name: &'static str) -> Gauge {
        let Some(i) = &self.inner else {
            return Gauge(None);
        };
        let mut gauges = lock(&i.gauges);
        if let Some((_, g)) = gauges.iter().find(|(n, _)| n == name) {
            return g.clone();
        }
        let g = Gauge(Some(Arc::new(AtomicU64::new(UNSET))));
        gauges.push((name.into(), g.clone()));
        g
    }

    /// The registered gauges.
    pub(crate) fn gauges(&self) -> Vec<(Name, Gauge)> {
        self.inner
            .as_ref()
            .map_or_else(Vec::new, |i| lock(&i.gauges).clone())
    }

    /// Adds a remark that travels with the trace (e.g. why some counters are
    /// missing).
    pub fn note(&self, text: impl Into<String>) {
        if let Some(i) = &self.inner {
            lock(&i.notes).push(text.into());
        }
    }

    /// The remarks so far.
    pub fn notes(&self) -> Vec<String> {
        self.inner
            .as_ref()
            .map_or_else(Vec::new, |i| lock(&i.notes).clone())
    }

    /// Takes everything recorded so far (slices still open are not included) and
    /// returns it as a sorted [`Trace`]; later events go into the next `collect`.
    pub fn collect(&self) -> Trace {
        let Some(i) = &self.inner else {
            return Trace::default();
        };
        let mut t = Trace::default();
        let mut ends = std::mem::take(&mut *lock(&i.pending_flows));
        for shard in i.shards.iter() {
            let mut s = lock(shard);
            t.slices.append(&mut s.slices);
            t.counters.append(&mut s.counters);
            t.instants.append(&mut s.instants);
            ends.append(&mut s.flow_ends);
        }
        t.tracks = lock(&i.tracks).clone();
        t.notes = lock(&i.notes).clone();
        let (flows, pending) = pair_flows(ends);
        t.flows = flows;
        *lock(&i.pending_flows) = pending;
        t.sort();
        t
    }
}

/// What [`Tracer::name_accelerator`] is given on the host backend: its
/// accelerator tracks are named `host backend compute`, `host backend sample`.
pub const HOST_BACKEND: &str = "host backend";

/// `name` with its leading `acc stream` or `acc` (a whole word) replaced by
/// `device`: `acc stream compute` → `host backend compute`.
fn accelerator_name(name: &str, device: &str) -> String {
    for prefix in ["acc stream", "acc"] {
        if let Some(rest) = name.strip_prefix(prefix) {
            if rest.is_empty() || rest.starts_with(' ') {
                return format!("{device}{rest}");
            }
        }
    }
    name.to_string()
}

/// Pairs flow ends by id: complete flows, and the ends still waiting for a partner.
/// A second outgoing (or incoming) end for one id is dropped.
fn pair_flows(ends: Vec<FlowEnd>) -> (Vec<Flow>, Vec<FlowEnd>) {
    let mut by_id: HashMap<u64, (Option<FlowEnd>, Option<FlowEnd>)> = HashMap::new();
    for e in ends {
        let slot = by_id.entry(e.id).or_default();
        let side = if e.outgoing { &mut slot.0 } else { &mut slot.1 };
        if side.is_none() {
            *side = Some(e);
        }
    }
    let (mut flows, mut pending) = (Vec::new(), Vec::new());
    for (id, pair) in by_id {
        match pair {
            (Some(from), Some(to)) => flows.push(Flow {
                id,
                name: from.name.into(),
                from: from.point,
                to: to.point,
            }),
            (a, b) => pending.extend(a.into_iter().chain(b)),
        }
    }
    (flows, pending)
}

/// An open slice; records it (on its track, with its arguments and flow ends) when
/// dropped. Does nothing for a disabled tracer.
#[must_use = "the slice ends when the guard is dropped"]
pub struct SliceGuard<'a> {
    active: Option<ActiveSlice<'a>>,
}

struct ActiveSlice<'a> {
    inner: &'a Inner,
    track: Option<TrackId>,
    name: &'static str,
    start: Nanos,
    args: Args,
    /// (flow, outgoing).
    flows: Vec<(FlowId, bool)>,
}

impl SliceGuard<'_> {
    /// Sets the `batch` argument.
    #[inline]
    pub fn batch(mut self, batch: u64) -> Self {
        if let Some(a) = &mut self.active {
            a.args.batch = Some(batch);
        }
        self
    }

    /// Sets the `epoch` argument.
    #[inline]
    pub fn epoch(mut self, epoch: u64) -> Self {
        if let Some(a) = &mut self.active {
            a.args.epoch = Some(epoch);
        }
        self
    }

    /// Sets the `super_batch` argument.
    #[inline]
    pub fn super_batch(mut self, super_batch: u64) -> Self {
        if let Some(a) = &mut self.active {
            a.args.super_batch = Some(super_batch);
        }
        self
    }

    /// Sets the `layer` argument.
    #[inline]
    pub fn layer(mut self, layer: u32) -> Self {
        if let Some(a) = &mut self.active {
            a.args.layer = Some(layer);
        }
        self
    }

    /// Sets the `device` argument.
    #[inline]
    pub fn device(mut self, device: Device) -> Self {
        if let Some(a) = &mut self.active {
            a.args.device = Some(device);
        }
        self
    }

    /// Fills in arguments with `f` (called only when enabled).
    #[inline]
    pub fn args(mut self, f: impl FnOnce(&mut Args)) -> Self {
        if let Some(a) = &mut self.active {
            f(&mut a.args);
        }
        self
    }

    /// The arguments, to set while the slice is open (`None` when disabled).
    #[inline]
    pub fn args_mut(&mut self) -> Option<&mut Args> {
        self.active.as_mut().map(|a| &mut a.args)
    }

    /// Sets the `bytes` argument (e.g. bytes gathered).
    #[inline]
    pub fn set_bytes(&mut self, bytes: u64) {
        if let Some(a) = &mut self.active {
            a.args.bytes = Some(bytes);
        }
    }

    /// Marks the slice as a transfer of `bytes` in direction `dir`.
    #[inline]
    pub fn set_transfer(&mut self, dir: Direction, bytes: u64) {
        if let Some(a) = &mut self.active {
            a.args.bytes = Some(bytes);
            a.args.direction = Some(dir);
        }
    }

    /// Sets the `staleness_gap` argument.
    #[inline]
    pub fn set_staleness_gap(&mut self, gap: u64) {
        if let Some(a) = &mut self.active {
            a.args.staleness_gap = Some(gap);
        }
    }

    /// Makes this slice the producer (arrow tail) of `flow`.
    #[inline]
    pub fn flow_out(&mut self, flow: FlowId) {
        if let (Some(a), true) = (&mut self.active, flow.id != 0) {
            a.flows.push((flow, true));
        }
    }

    /// Makes this slice the consumer (arrow head) of `flow`.
    #[inline]
    pub fn flow_in(&mut self, flow: FlowId) {
        if let (Some(a), true) = (&mut self.active, flow.id != 0) {
            a.flows.push((flow, false));
        }
    }

    /// Ends the slice now (same as dropping the guard).
    #[inline]
    pub fn end(self) {}
}

impl Drop for SliceGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(a) = self.active.take() {
            a.record();
        }
    }
}

impl ActiveSlice<'_> {
    fn record(self) {
        let inner = self.inner;
        let end = inner.now();
        inner.with_shard(|s, key| {
            let track = match self.track {
                Some(t) => t,
                None => inner.thread_track(s, key),
            };
            let mid = self.start + (end - self.start) / 2;
            for (f, outgoing) in self.flows {
                s.flow_ends.push(FlowEnd {
                    id: f.id,
                    name: f.name,
                    outgoing,
                    point: FlowPoint { track, ts: mid },
                });
            }
            s.slices.push(Slice {
                track,
                name: self.name.into(),
                start: self.start,
                end,
                args: self.args,
            });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracer_is_send_sync_and_cheap_to_clone() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tracer>();
        assert_send_sync::<Gauge>();
        assert_eq!(std::mem::size_of::<Tracer>(), std::mem::size_of::<usize>());
    }

    #[test]
    fn disabled_records_nothing() {
        let t = Tracer::disabled();
        {
            let mut g = t.slice("x").batch(3);
            g.set_bytes(10);
            assert!(g.args_mut().is_none());
            let f = t.flow("f");
            assert_eq!(f, FlowId::NONE);
            g.flow_out(f);
        }
        t.counter("c", 1.0);
        t.instant("i", |_| panic!("args closure must not run when disabled"));
        t.gauge("g").set(1.0);
        assert!(t.gauge("g").get().is_none());
        t.note("n");
        assert_eq!(t.collect(), Trace::default());
        assert!(t.notes().is_empty());
    }

    #[test]
    fn threads_get_named_tracks_and_slices_nest() {
        let t = Tracer::new();
        std::thread::scope(|s| {
            for name in ["alpha", "beta"] {
                let t = t.clone();
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn_scoped(s, move || {
                        let _outer = t.slice("outer").batch(7);
                        let mut inner = t.slice("inner");
                        inner.set_bytes(64);
                    })
                    .unwrap();
            }
        });
        let tr = t.collect();
        tr.validate().unwrap();
        let mut names: Vec<&str> = tr.tracks.iter().map(|t| t.name.as_str()).collect();
        names.sort();
        assert_eq!(names, ["alpha", "beta"]);
        assert_eq!(tr.slices.len(), 4);
        for track in &tr.tracks {
            let mine: Vec<&Slice> = tr.slices.iter().filter(|s| s.track == track.id).collect();
            assert_eq!(mine.len(), 2);
            let outer = mine.iter().find(|s| s.name == "outer").unwrap();
            let inner = mine.iter().find(|s| s.name == "inner").unwrap();
            assert!(outer.start <= inner.start && inner.end <= outer.end);
            assert_eq!(outer.args.batch, Some(7));
            assert_eq!(inner.args.bytes, Some(64));
        }
        // Collected events are gone; a second collect has only the tracks.
        let again = t.collect();
        assert!(again.slices.is_empty());
        assert_eq!(again.tracks.len(), 2);
    }

    #[test]
    fn rayon_workers_are_cpu_workers() {
        let t = Tracer::new();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        pool.broadcast(|_| {
            let _g = t.slice("work");
        });
        let tr = t.collect();
        let mut names: Vec<&str> = tr.tracks.iter().map(|t| t.name.as_str()).collect();
        names.sort();
        assert_eq!(names, ["cpu worker 0", "cpu worker 1"]);
        assert!(tr.tracks.iter().all(|t| t.kind == TrackKind::Cpu));
    }

    #[test]
    fn duplicate_track_names_get_suffixes() {
        let t = Tracer::new();
        let a = t.declare_track("acc stream copy", TrackKind::Accelerator);
        let b = t.declare_track("acc stream copy", TrackKind::Accelerator);
        assert_ne!(a, b);
        let tr = t.collect();
        let names: Vec<&str> = tr.tracks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["acc stream copy", "acc stream copy (2)"]);
        // Named after the host backend from then on.
        t.name_accelerator("host backend");
        t.declare_track("acc stream compute", TrackKind::Accelerator);
        t.declare_track("acc sample", TrackKind::Accelerator);
        t.declare_track("acc", TrackKind::Accelerator);
        t.declare_track("accumulate", TrackKind::Accelerator);
        t.declare_track("acc planner", TrackKind::Cpu);
        let tail: Vec<String> = t.collect().tracks[2..]
            .iter()
            .map(|t| t.name.clone())
            .collect();
        assert_eq!(
            tail,
            [
                "host backend compute",
                "host backend sample",
                "host backend",
                "accumulate",
                "acc planner"
            ]
        );
    }

    #[test]
    fn flows_pair_across_threads_and_wait_for_their_partner() {
        let t = Tracer::new();
        let acc = t.declare_track("acc stream compute", TrackKind::Accelerator);
        let f = t.flow("prepare→compute");
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut g = t.slice("gather");
                g.flow_out(f);
                std::thread::sleep(std::time::Duration::from_millis(1));
            });
        });
        // Only the tail so far: no flow yet, but it is kept.
        let first = t.collect();
        assert!(first.flows.is_empty());
        {
            let mut g = t.slice_on(acc, "forward");
            g.flow_in(f);
        }
        let second = t.collect();
        assert_eq!(second.flows.len(), 1);
        let fl = &second.flows[0];
        assert_eq!(fl.id, f.id());
        assert_eq!(fl.name, "prepare→compute");
        assert_eq!(fl.to.track, acc);
        assert!(fl.from.ts <= fl.to.ts);
        let fwd = &second.slices[0];
        assert!(fwd.start <= fl.to.ts && fl.to.ts <= fwd.end);
        let gather = first.slices.iter().find(|s| s.name == "gather").unwrap();
        assert_eq!(fl.from.track, gather.track);
        assert!(gather.start <= fl.from.ts && fl.from.ts <= gather.end);
    }

    #[test]
    fn counters_instants_gauges_and_notes() {
        let t = Tracer::new();
        t.counter("cpu.util", 10.0);
        t.counter_at("cpu.util", 5, 3.0);
        t.instant("reuse", |a| a.staleness_gap = Some(2));
        let g = t.gauge("cache.hit_rate");
        assert!(g.get().is_none());
        g.set(0.5);
        assert_eq!(t.gauge("cache.hit_rate").get(), Some(0.5));
        assert_eq!(t.gauges().len(), 1);
        g.clear();
        assert!(g.get().is_none());
        t.note("hello");
        let tr = t.collect();
        assert_eq!(tr.counters.len(), 2);
        assert_eq!(tr.counters[0].ts, 5, "counters come out in time order");
        assert_eq!(tr.instants.len(), 1);
        assert_eq!(tr.instants[0].args.staleness_gap, Some(2));
        assert_eq!(tr.notes, ["hello"]);
        tr.validate().unwrap();
    }
}
