//! The counter sampler: a background thread that records, every interval (100 ms by
//! default), the machine's CPU utilization, this process's CPU share and resident
//! memory, each accelerator's utilization and memory (through NVML, when the driver
//! library is there), and every registered [`Gauge`](super::Gauge).
//!
//! # Protocol
//! 1. [`CounterSampler::start`] probes the sources on the calling thread: `/proc`
//!    files that cannot be read or parsed, and NVML that cannot be loaded, are left
//!    out with one note each on the tracer ([`Tracer::notes`]) saying why.
//! 2. The thread samples once at once (a baseline for the CPU-time differences,
//!    memory, gauges), then waits on a channel with the interval as time-out: a
//!    time-out means "sample again"; a message or the sender's drop means "stop".
//! 3. [`CounterSampler::stop`] (or dropping the sampler) drops the sender and joins
//!    the thread, so stopping takes at most one sample's time, not an interval.
//!
//! Counter series (see `docs/tracing.md`): [`CPU_UTIL`], [`PROCESS_CPU`],
//! [`PROCESS_RSS_MIB`], `accN.util`, `accN.mem_used_mib`, and one per gauge.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::nvml::Nvml;
use super::procfs::{parse_proc_stat, parse_self_stat, parse_vm_rss, utilization, CpuTimes};
use super::recorder::Tracer;

/// Machine CPU utilization, percent of all CPUs (from `/proc/stat`).
pub const CPU_UTIL: &str = "cpu.util";
/// This process's CPU time, percent of all CPUs (from `/proc/self/stat`).
pub const PROCESS_CPU: &str = "process.cpu";
/// This process's resident memory, MiB (from `/proc/self/status`).
pub const PROCESS_RSS_MIB: &str = "process.rss_mib";
/// Conventional gauge name for the feature-cache hit rate (0..1).
pub const CACHE_HIT_RATE: &str = "cache.hit_rate";
/// Conventional gauge name for the current staleness gap (weight versions).
pub const STALENESS_GAP: &str = "staleness.gap";
/// Conventional counter name of the host synchronizations a device engine's
/// backend (its compute stream) has made so far (cumulative; the step executor
/// adds a sample per batch, so the difference over 8 batches is theirs).
pub const HOST_SYNCS: &str = "host.syncs";
/// Conventional counter name of the synchronizations of a device engine's
/// sampling sibling so far (`device.sample_ahead` on CUDA; cumulative, a
/// sample per batch): they wait for sampling kernels, not for training.
pub const SAMPLING_SYNCS: &str = "host.syncs.sampling";

/// How the note that NVML could not be loaded begins (a run on the host backend
/// leaves it out of what it prints).
pub const NO_ACCELERATOR_COUNTERS: &str = "accelerator counters not recorded";

/// Counter name of accelerator `i`'s utilization, percent.
pub fn acc_util_counter(i: u32) -> String {
    format!("acc{i}.util")
}

/// Counter name of accelerator `i`'s memory in use, MiB.
pub fn acc_mem_counter(i: u32) -> String {
    format!("acc{i}.mem_used_mib")
}

/// If `name` is an accelerator counter, its device index and kind (`"util"` or
/// `"mem_used_mib"`).
pub fn parse_acc_counter(name: &str) -> Option<(u32, &str)> {
    let rest = name.strip_prefix("acc")?;
    let (num, kind) = rest.split_once('.')?;
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    matches!(kind, "util" | "mem_used_mib").then_some((num.parse().ok()?, kind))
}

const MIB: f64 = 1024.0 * 1024.0;

/// How the sampler runs.
#[derive(Clone, Debug)]
pub struct SamplerOptions {
    /// Time between samples (at least 1 ms; default 100 ms).
    pub interval: Duration,
    /// Whether to try NVML for accelerator counters (default true).
    pub accelerator: bool,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(100),
            accelerator: true,
        }
    }
}

/// The running sampler; stops when [`CounterSampler::stop`] is called or it is
/// dropped.
pub struct CounterSampler {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for CounterSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CounterSampler")
            .field("running", &self.thread.is_some())
            .finish()
    }
}

/// Reads one `/proc` file (the real file system in a run, scripted contents in
/// the tests, so that they do not depend on how the machine accounts time).
type ProcReader = Box<dyn FnMut(&str) -> Result<String, String> + Send>;

/// What the sampler reads, and the previous CPU-time reading.
struct Sources {
    proc: bool,
    read: ProcReader,
    nvml: Option<Nvml>,
    prev: Option<(CpuTimes, Option<u64>)>,
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))
}

impl Sources {
    /// Probes the sources, noting on `tracer` each that is left out and why.
    fn probe(tracer: &Tracer, opts: &SamplerOptions) -> Self {
        Self::probe_with(tracer, opts, Box::new(read))
    }

    /// [`Sources::probe`] reading `/proc` through `read`.
    fn probe_with(tracer: &Tracer, opts: &SamplerOptions, mut read: ProcReader) -> Self {
        let proc = match read("/proc/stat")
            .and_then(|t| parse_proc_stat(&t).map_err(|e| format!("/proc/stat: {e}")))
        {
            Ok(_) => true,
            Err(e) => {
                tracer.note(format!("CPU and memory counters not recorded: {e}"));
                false
            }
        };
        let nvml = if opts.accelerator {
            match Nvml::load() {
                Ok(n) => Some(n),
                Err(e) => {
                    tracer.note(format!("{NO_ACCELERATOR_COUNTERS}: NVML unavailable ({e})"));
                    None
                }
            }
        } else {
            None
        };
        Self {
            proc,
            read,
            nvml,
            prev: None,
        }
    }

    /// Takes one sample of everything into `tracer`.
    fn tick(&mut self, tracer: &Tracer) {
        if self.proc {
            let read = &mut self.read;
            let machine = read("/proc/stat").and_then(|t| parse_proc_stat(&t)).ok();
            let me = read("/proc/self/stat")
                .and_then(|t| parse_self_stat(&t))
                .ok();
            if let (Some(now), Some((before, me_before))) = (machine, self.prev) {
                if let Some((m, p)) = utilization(before, now, me_before, me) {
                    tracer.counter(CPU_UTIL, m);
                    if let Some(p) = p {
                        tracer.counter(PROCESS_CPU, p);
                    }
                }
            }
            self.prev = machine.map(|m| (m, me));
            if let Ok(rss) = (self.read)("/proc/self/status").and_then(|t| parse_vm_rss(&t)) {
                tracer.counter(PROCESS_RSS_MIB, rss as f64 / MIB);
            }
        }
        if let Some(nvml) = &self.nvml {
            for s in nvml.sample() {
                if let Some(u) = s.util_percent {
                    tracer.counter(acc_util_counter(s.index), u);
                }
                if let Some(m) = s.mem_used {
                    tracer.counter(acc_mem_counter(s.index), m as f64 / MIB);
                }
            }
        }
        for (name, g) in tracer.gauges() {
            if let Some(v) = g.get() {
                tracer.counter(name, v);
            }
        }
    }
}

impl CounterSampler {
    /// Starts sampling into `tracer` (a disabled tracer starts nothing). Sources
    /// that are unavailable are noted on the tracer; if the thread cannot be
    /// spawned, that is noted too and no counters are recorded.
    pub fn start(tracer: &Tracer, opts: SamplerOptions) -> Self {
        let idle = Self {
            stop: None,
            thread: None,
        };
        if !tracer.is_enabled() {
            return idle;
        }
        let interval = opts.interval.max(Duration::from_millis(1));
        let mut sources = Sources::probe(tracer, &opts);
        let (tx, rx) = mpsc::channel::<()>();
        let t = tracer.clone();
        let spawned = std::thread::Builder::new()
            .name("tandem counter sampler".into())
            .spawn(move || loop {
                sources.tick(&t);
                match rx.recv_timeout(interval) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                        // A last sample at the stop: every run has one at each end,
                        // however the thread was scheduled in between.
                        sources.tick(&t);
                        break;
                    }
                }
            });
        match spawned {
            Ok(h) => Self {
                stop: Some(tx),
                thread: Some(h),
            },
            Err(e) => {
                tracer.note(format!(
                    "counters not recorded: cannot start the sampler thread: {e}"
                ));
                idle
            }
        }
    }

    /// Whether a sampler thread is running.
    pub fn is_running(&self) -> bool {
        self.thread.is_some()
    }

    /// Stops the thread and waits for it (at most one sample's time).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        drop(self.stop.take());
        if let Some(h) = self.thread.take() {
            // A panic in the sampler thread only loses counters; don't propagate.
            let _ = h.join();
        }
    }
}

impl Drop for CounterSampler {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acc_counter_names_round_trip() {
        assert_eq!(parse_acc_counter(&acc_util_counter(3)), Some((3, "util")));
        assert_eq!(
            parse_acc_counter(&acc_mem_counter(0)),
            Some((0, "mem_used_mib"))
        );
        assert_eq!(parse_acc_counter("acc.util"), None);
        assert_eq!(parse_acc_counter("acc0.power"), None);
        assert_eq!(parse_acc_counter(CPU_UTIL), None);
    }

    /// A scripted `/proc`: reading `i` of `/proc/stat` and `/proc/self/stat`
    /// is `readings[i]` (machine user, system, idle ticks; this process's
    /// ticks, or `None` where its file cannot be read). `/proc/self/status`
    /// says 2 MiB resident. The probe takes one `/proc/stat` reading first.
    fn scripted(readings: Vec<(u64, u64, u64, Option<u64>)>) -> ProcReader {
        let mut stat = 0usize;
        let mut me = 0usize;
        Box::new(move |path: &str| match path {
            "/proc/stat" => {
                // The probe's reading repeats the first one.
                let (u, s, i, _) = readings[stat.saturating_sub(1).min(readings.len() - 1)];
                stat += 1;
                Ok(format!("cpu  {u} 0 {s} {i} 0 0 0 0 0 0\ncpu0 1 2 3 4\n"))
            }
            "/proc/self/stat" => {
                let ticks = readings[me.min(readings.len() - 1)].3;
                me += 1;
                let t = ticks.ok_or("/proc/self/stat: gone")?;
                Ok(format!("7 (a (b) c) S 1 1 1 0 -1 0 0 0 0 0 {t} 0 0 0"))
            }
            "/proc/self/status" => Ok("Name:\tx\nVmRSS:\t    2048 kB\n".into()),
            other => Err(format!("{other}: not scripted")),
        })
    }

    /// Four samples over a scripted `/proc`: a utilization and a process share
    /// per pair of readings, computed from the differences; a pair whose
    /// machine total went backwards (as idle and iowait accounting can on a
    /// virtual machine) records no utilization rather than a wrong one; a
    /// process reading that fails leaves only its share out. Memory and the
    /// gauge are recorded at every sample.
    #[test]
    fn samples_cpu_memory_and_gauges() {
        let t = Tracer::new();
        let hit = t.gauge(CACHE_HIT_RATE);
        hit.set(0.75);
        let opts = SamplerOptions {
            interval: Duration::from_secs(3600),
            accelerator: false,
        };
        let mut sources = Sources::probe_with(
            &t,
            &opts,
            scripted(vec![
                (100, 100, 800, Some(10)),
                // +200 ticks, 150 busy; this process +50.
                (200, 150, 850, Some(60)),
                // +100 ticks, 50 busy; the process's file cannot be read.
                (230, 170, 900, None),
                // The total goes back by 10 ticks.
                (230, 170, 890, Some(80)),
            ]),
        );
        for _ in 0..4 {
            sources.tick(&t);
        }
        let tr = t.collect();
        tr.validate().unwrap();
        assert!(t.notes().is_empty(), "{:?}", t.notes());
        assert_eq!(tr.counter_series(CACHE_HIT_RATE).count(), 4);
        assert!(tr.counter_series(CACHE_HIT_RATE).all(|c| c.value == 0.75));
        let util: Vec<f64> = tr.counter_series(CPU_UTIL).map(|c| c.value).collect();
        assert_eq!(util, vec![75.0, 50.0]);
        let me: Vec<f64> = tr.counter_series(PROCESS_CPU).map(|c| c.value).collect();
        assert_eq!(me, vec![25.0]);
        let rss: Vec<f64> = tr
            .counter_series(PROCESS_RSS_MIB)
            .map(|c| c.value)
            .collect();
        assert_eq!(rss, vec![2.0; 4]);
    }

    /// A `/proc/stat` that does not parse leaves the CPU and memory counters
    /// out with one note naming the file; the gauges are still sampled.
    #[test]
    fn an_unreadable_proc_is_noted_once_and_left_out() {
        let t = Tracer::new();
        t.gauge(STALENESS_GAP).set(2.0);
        let opts = SamplerOptions {
            interval: Duration::from_secs(3600),
            accelerator: false,
        };
        let read: ProcReader = Box::new(|path: &str| Ok(format!("{path} has no cpu line\n")));
        let mut sources = Sources::probe_with(&t, &opts, read);
        sources.tick(&t);
        sources.tick(&t);
        let notes = t.notes();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("/proc/stat"), "{notes:?}");
        let tr = t.collect();
        assert_eq!(tr.counter_series(CPU_UTIL).count(), 0);
        assert_eq!(tr.counter_series(PROCESS_RSS_MIB).count(), 0);
        assert_eq!(tr.counter_series(STALENESS_GAP).count(), 2);
    }

    /// On this machine's real `/proc` (where there is one): the readings parse,
    /// memory is recorded at each sample and any utilization is in range. How
    /// many utilizations there are depends on how the kernel accounts time
    /// between two readings, so it is only bounded.
    #[test]
    fn the_real_proc_gives_counters_in_range() {
        if !std::path::Path::new("/proc/stat").exists() {
            eprintln!("skipping: no /proc/stat here");
            return;
        }
        let t = Tracer::new();
        let opts = SamplerOptions {
            interval: Duration::from_secs(3600),
            accelerator: false,
        };
        let mut sources = Sources::probe(&t, &opts);
        sources.tick(&t);
        sources.tick(&t);
        let tr = t.collect();
        assert!(t.notes().is_empty(), "{:?}", t.notes());
        let util: Vec<f64> = tr.counter_series(CPU_UTIL).map(|c| c.value).collect();
        assert!(util.len() <= 1, "{util:?}");
        assert!(util.iter().all(|u| (0.0..=100.0).contains(u)), "{util:?}");
        assert!(tr
            .counter_series(PROCESS_CPU)
            .all(|c| (0.0..=100.0).contains(&c.value)));
        assert_eq!(tr.counter_series(PROCESS_RSS_MIB).count(), 2);
        assert!(tr.counter_series(PROCESS_RSS_MIB).all(|c| c.value > 1.0));
    }

    /// The thread samples once at the start and once at the stop; stopping
    /// wakes it instead of waiting out the interval (an hour here: a stop that
    /// waited would leave a third sample). Nothing is recorded after the stop.
    #[test]
    fn stop_wakes_the_thread_with_a_sample_at_each_end() {
        let t = Tracer::new();
        let hit = t.gauge(CACHE_HIT_RATE);
        hit.set(0.5);
        let s = CounterSampler::start(
            &t,
            SamplerOptions {
                interval: Duration::from_secs(3600),
                accelerator: true,
            },
        );
        assert!(s.is_running());
        drop(s);
        let tr = t.collect();
        assert_eq!(
            tr.counter_series(CACHE_HIT_RATE).count(),
            2,
            "{:?}",
            tr.counters
        );
        if Nvml::load().is_err() {
            let notes = t.notes();
            assert_eq!(
                notes
                    .iter()
                    .filter(|n| n.contains("NVML unavailable"))
                    .count(),
                1,
                "{notes:?}"
            );
        }
        // The thread is joined: nothing can be recorded any more.
        assert!(t.collect().counters.is_empty());
    }

    #[test]
    fn disabled_tracer_starts_no_thread() {
        let s = CounterSampler::start(&Tracer::disabled(), SamplerOptions::default());
        assert!(!s.is_running());
    }
}
