//! The host backend's [`DeviceCore`]: its handle types, identity and settings
//! (its memory read from `/proc/meminfo`), and streams and events that only keep
//! time (every op completes before it returns, so every ordering obligation holds
//! trivially).

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::backend::{DeviceCore, DeviceKind, Elem, MemoryInfo};
use crate::error::{GpuOpsError, Result};
use crate::host::block::HostBlock;
use crate::host::buffer::HostBuf;
use crate::host::dense::HostMask;
use crate::host::features::HostFeatures;
use crate::host::sampling::HostGraph;
use crate::host::HostBackend;

/// Where the kernel reports memory.
const MEMINFO: &str = "/proc/meminfo";

/// Free (`MemAvailable`) and total (`MemTotal`) host memory, from `/proc/meminfo`.
pub(crate) fn memory_info() -> Result<MemoryInfo> {
    let text = std::fs::read_to_string(MEMINFO).map_err(|e| GpuOpsError::Driver {
        op: format!("read {MEMINFO}"),
        message: e.to_string(),
    })?;
    parse_meminfo(&text)
}

/// Parses `/proc/meminfo` text (`Key:   <n> kB` lines): `MemAvailable` and `MemTotal`.
pub(crate) fn parse_meminfo(text: &str) -> Result<MemoryInfo> {
    let field = |key: &str| -> Result<usize> {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .ok_or_else(|| GpuOpsError::Driver {
                op: format!("parse {MEMINFO}"),
                message: format!("no `{key}:` line"),
            })?;
        let bad = || GpuOpsError::Driver {
            op: format!("parse {MEMINFO}"),
            message: format!("`{key}:{line}`: expected `<number> kB`"),
        };
        let mut words = line.split_whitespace();
        let kib: usize = words.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        if words.next() != Some("kB") || words.next().is_some() {
            return Err(bad());
        }
        kib.checked_mul(1024).ok_or_else(bad)
    };
    Ok(MemoryInfo {
        free: field("MemAvailable")?,
        total: field("MemTotal")?,
    })
}

/// A host-backend stream: work on it completes before the call returns, so it only
/// carries an id (for traces).
#[derive(Debug, PartialEq, Eq)]
pub struct HostStream {
    id: u64,
}

impl HostStream {
    pub(crate) fn new(id: u64) -> Self {
        Self { id }
    }

    /// The stream's number (0 is the compute stream).
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// A host-backend event: the moment it was recorded (all earlier work is done by then).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostEvent {
    at: Instant,
}

impl HostEvent {
    pub(crate) fn now() -> Self {
        Self { at: Instant::now() }
    }

    /// When it was recorded.
    pub fn instant(&self) -> Instant {
        self.at
    }

    /// Milliseconds from `start` to `self` (negative when `start` is later, as CUDA's
    /// `cuEventElapsedTime` reports).
    pub(crate) fn ms_since(&self, start: &HostEvent) -> f32 {
        match self.at.checked_duration_since(start.at) {
            Some(d) => (d.as_secs_f64() * 1e3) as f32,
            None => -((start.at - self.at).as_secs_f64() * 1e3) as f32,
        }
    }
}

impl DeviceCore for HostBackend {
    type Buf<T: Elem> = HostBuf<T>;
    type Pinned<T: Elem> = HostBuf<T>;
    type Stream = HostStream;
    type Event = HostEvent;
    type Graph = HostGraph;
    type Block = HostBlock;
    type Features = HostFeatures;
    type Mask = HostMask;

    fn kind(&self) -> DeviceKind {
        DeviceKind::Host
    }

    fn set_precision(&self, precision: crate::Precision) -> Result<()> {
        self.tf32.store(
            precision == crate::Precision::Tf32,
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(())
    }

    fn precision(&self) -> crate::Precision {
        if self.tf32.load(std::sync::atomic::Ordering::Relaxed) {
            crate::Precision::Tf32
        } else {
            crate::Precision::Fp32
        }
    }

    fn describe(&self) -> String {
        let mem = match memory_info() {
            Ok(m) => format!("{:.1} GiB memory", m.total as f64 / (1u64 << 30) as f64),
            Err(_) => "memory size unknown".into(),
        };
        format!(
            "host CPU: {} rayon threads, SIMD {}, {mem}",
            rayon::current_num_threads(),
            self.simd.level()
        )
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        memory_info()
    }

    fn transfer_stats(&self) -> crate::backend::TransferStats {
        self.transfers.get()
    }

    fn stream(&self) -> &HostStream {
        &self.compute
    }

    fn new_stream(&self) -> Result<HostStream> {
        Ok(HostStream::new(
            self.next_stream.fetch_add(1, Ordering::Relaxed),
        ))
    }

    fn record_event(&self, _stream: &HostStream) -> Result<HostEvent> {
        Ok(HostEvent::now())
    }

    fn wait_event(&self, _stream: &HostStream, _event: &HostEvent) -> Result<()> {
        // The event's work completed before it was recorded.
        Ok(())
    }

    fn elapsed_ms(&self, start: &HostEvent, end: &HostEvent) -> Result<f32> {
        Ok(end.ms_since(start))
    }

    fn synchronize(&self, _stream: &HostStream) -> Result<()> {
        self.transfers.sync();
        Ok(())
    }

    fn wait_host(&self, _event: &HostEvent) -> Result<()> {
        // The event's work completed before it was recorded.
        self.transfers.event_wait();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo() {
        let text = "MemTotal:       24542964 kB\nMemFree:         1000 kB\n\
                    MemAvailable:   20000000 kB\nBuffers:  1 kB\n";
        let m = parse_meminfo(text).unwrap();
        assert_eq!(m.total, 24_542_964 * 1024);
        assert_eq!(m.free, 20_000_000 * 1024);
    }

    #[test]
    fn malformed_meminfo_is_an_error_naming_the_key() {
        for (text, key) in [
            ("MemTotal: 10 kB\n", "MemAvailable"),
            ("MemAvailable: x kB\nMemTotal: 10 kB\n", "MemAvailable"),
            ("MemAvailable: 5 kB\nMemTotal: 10 MB\n", "MemTotal"),
            ("MemAvailable: 5\nMemTotal: 10 kB\n", "MemAvailable"),
        ] {
            let err = parse_meminfo(text).unwrap_err().to_string();
            assert!(err.contains(key) && err.contains(MEMINFO), "{err}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_machine() {
        let m = memory_info().unwrap();
        assert!(m.total > 0 && m.free <= m.total, "{m:?}");
    }

    #[test]
    fn event_time_is_signed() {
        let a = HostEvent::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = HostEvent::now();
        assert!(b.ms_since(&a) >= 2.0);
        assert!(a.ms_since(&b) <= -2.0);
        assert_eq!(a.ms_since(&a), 0.0);
    }
}
