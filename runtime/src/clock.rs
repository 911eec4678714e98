//! The one clock of the runtime: every duration that decides something or is
//! reported (batch and epoch times, the hybrid monitor's windows, `policy =
//! "auto"`'s measurements, the all-reduce time of a data-parallel step) is read
//! from a [`SharedClock`], so tests run those decisions on scripted time
//! ([`ManualClock`]) instead of the wall clock. A leaf: it imports nothing from
//! the crate. (Trace timestamps keep their own origin in `trace/recorder.rs`:
//! they order slices, they decide nothing.)
//!
//! A hand-written trait rather than a crate: the runtime only needs "seconds since
//! an origin", shared across threads, and a test double that advances on demand.

#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A monotonic clock: time since the clock's origin.
pub trait Clock: Send + Sync {
    /// Time since the origin.
    fn now(&self) -> Duration;
}

/// The wall clock ([`Instant`]), origin at creation.
#[derive(Debug)]
pub struct WallClock {
    origin: Instant,
}

impl WallClock {
    /// A clock starting now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for WallClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for WallClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock that moves only when told ([`ManualClock::advance`]); clones share
/// the time (tests).
#[cfg(test)]
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

#[cfg(test)]
impl ManualClock {
    /// A clock at 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let n = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(n, Ordering::AcqRel);
    }
}

#[cfg(test)]
impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Acquire))
    }
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// The wall clock as a [`SharedClock`].
pub fn wall_clock() -> SharedClock {
    Arc::new(WallClock::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told_and_clones_share_it() {
        let c = ManualClock::new();
        let d = c.clone();
        assert_eq!(c.now(), Duration::ZERO);
        d.advance(Duration::from_millis(5));
        assert_eq!(c.now(), Duration::from_millis(5));
    }

    #[test]
    fn wall_clock_is_monotonic() {
        let c = WallClock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
    }
}
