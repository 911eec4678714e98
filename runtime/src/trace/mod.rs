//! Profiling: a trace recorder, counter sampler, Chrome/Perfetto trace files, the
//! end-of-run summary and the utilization picture. `docs/tracing.md` describes the
//! file format and the summary.
//!
//! * [`Tracer`] records slices (stage work on a track), flows (arrows between
//!   slices on different tracks), counters and instant events. One track per CPU
//!   thread (from the recording thread) and per accelerator stream (declared). A
//!   disabled tracer costs one branch per call; there is no global tracer.
//! * [`CounterSampler`] records CPU, memory, accelerator (NVML) and gauge counters
//!   from a background thread.
//! * [`write_chrome_trace`] / [`read_chrome_trace`] store a [`Trace`] as Chrome
//!   trace JSON, which Perfetto opens.
//! * [`summarize`] gives the [`Summary`] (printed as a table), and
//!   `write_utilization_svg` (cargo feature `svg`) the utilization-over-time
//!   picture.
//!
//! ```
//! use runtime::trace::{summarize, Tracer, TrackKind};
//! let tracer = Tracer::new();
//! let copy = tracer.declare_track("acc stream copy", TrackKind::Accelerator);
//! let ready = tracer.flow("gather→h2d");
//! {
//!     let mut g = tracer.slice("gather").batch(0);
//!     g.set_bytes(4096);
//!     g.flow_out(ready);
//! }
//! {
//!     let mut c = tracer.slice_on(copy, "h2d").batch(0);
//!     c.set_transfer(runtime::trace::Direction::HostToDevice, 4096);
//!     c.flow_in(ready);
//! }
//! let trace = tracer.collect();
//! trace.validate().unwrap();
//! assert_eq!(summarize(&trace).h2d.bytes, 4096);
//! ```

mod chrome;
mod model;
pub(crate) mod nvml;
mod procfs;
mod recorder;
mod report;
mod sampler;
mod summary;

pub use chrome::{parse_chrome_trace, read_chrome_trace, write_chrome_trace, FORMAT_VERSION};
pub use model::{
    Args, Counter, Device, Direction, Flow, FlowPoint, InstantEvent, Name, Nanos, Slice, Trace,
    Track, TrackId, TrackKind,
};
pub use procfs::{current_rss, peak_rss, reset_peak_rss};
pub use recorder::{FlowId, Gauge, SliceGuard, Tracer, HOST_BACKEND};
#[cfg(feature = "svg")]
pub use report::{render_utilization_svg, write_utilization_svg};
pub use report::{utilization_series, Series, UtilizationSeries, DEFAULT_BINS, EPOCH_INSTANT};
pub use sampler::{
    acc_mem_counter, acc_util_counter, parse_acc_counter, CounterSampler, SamplerOptions,
    CACHE_HIT_RATE, CPU_UTIL, HOST_SYNCS, NO_ACCELERATOR_COUNTERS, PROCESS_CPU, PROCESS_RSS_MIB,
    SAMPLING_SYNCS, STALENESS_GAP,
};
pub use summary::{
    fmt_bytes, fmt_count, summarize, AccStats, SeriesStats, StageStats, Summary, TrackStats,
    TransferStats,
};
