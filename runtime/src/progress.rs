//! Progress of long phases (generation, import), reported to a caller-supplied
//! [`Progress`] sink. The library itself never prints: without a sink
//! ([`NoProgress`]) nothing is reported. The `tandem` CLI turns reports into
//! progress bars on a terminal and plain lines otherwise.
//!
//! Protocol, per phase (e.g. `"edges"`, then `"graph"`, then `"features"`):
//!
//! 1. The first report of a phase has `done == 0`.
//! 2. `done` never decreases within a phase, and never exceeds `total`, even when
//!    the work runs on several threads (reports are serialized).
//! 3. The last report of a phase has `done == total`; the next report, if any,
//!    belongs to the next phase.

use parking_lot::Mutex;

/// Receives progress reports. See the module docs for the protocol.
///
/// Closures `Fn(&str, u64, u64) + Send + Sync` are sinks:
///
/// ```
/// use runtime::data::{generate_rmat_with, RmatOptions};
/// use std::sync::Mutex;
///
/// # fn main() -> runtime::Result<()> {
/// let seen = Mutex::new(Vec::new());
/// let sink = |phase: &str, done: u64, total: u64| {
///     seen.lock().unwrap().push((phase.to_string(), done, total));
/// };
/// let opts = RmatOptions { num_vertices: 1000, num_edges: 5000, ..RmatOptions::default() };
/// generate_rmat_with(&opts, &sink)?;
/// let seen = seen.into_inner().unwrap();
/// assert_eq!(seen.last().unwrap(), &("features".to_string(), 1000, 1000));
/// # Ok(())
/// # }
/// ```
pub trait Progress: Send + Sync {
    /// Phase `phase` has done `done` of `total` units (edges, bytes, vertices).
    fn update(&self, phase: &str, done: u64, total: u64);
}

impl<F: Fn(&str, u64, u64) + Send + Sync> Progress for F {
    fn update(&self, phase: &str, done: u64, total: u64) {
        self(phase, done, total)
    }
}

/// The sink that ignores every report (what the functions without `_with` use).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn update(&self, _: &str, _: u64, _: u64) {}
}

/// One phase's counter: reports 0 at creation, serializes [`Meter::add`] from
/// several threads so reports stay monotone, and reports `total` at
/// [`Meter::finish`] (once).
pub(crate) struct Meter<'a> {
    sink: &'a dyn Progress,
    phase: &'static str,
    total: u64,
    done: Mutex<u64>,
}

impl<'a> Meter<'a> {
    /// Starts `phase` of `total` units (reports `0 / total`).
    pub(crate) fn new(sink: &'a dyn Progress, phase: &'static str, total: u64) -> Self {
        sink.update(phase, 0, total);
        Self {
            sink,
            phase,
            total,
            done: Mutex::new(0),
        }
    }

    /// `n` more units done (clamped to the total).
    pub(crate) fn add(&self, n: u64) {
        let mut done = self.done.lock();
        let next = (*done + n).min(self.total);
        if next != *done {
            *done = next;
            self.sink.update(self.phase, next, self.total);
        }
    }

    /// Sets `done` to `to` when that is more than done so far (clamped to the total).
    pub(crate) fn set(&self, to: u64) {
        let done = *self.done.lock();
        if to > done {
            self.add(to - done);
        }
    }

    /// The phase is complete: reports `total / total` unless already reported.
    pub(crate) fn finish(self) {
        let done = *self.done.lock();
        // A phase of 0 units is complete with the 0 / 0 that `new` reported.
        if done < self.total {
            self.add(self.total - done);
        }
    }
}

/// Test helper: a sink that records every report, and checks of the protocol.
#[cfg(test)]
pub(crate) mod testing {
    use super::Progress;
    use parking_lot::Mutex;

    /// Records `(phase, done, total)` in order.
    #[derive(Default)]
    pub(crate) struct Recorder(pub(crate) Mutex<Vec<(String, u64, u64)>>);

    impl Progress for Recorder {
        fn update(&self, phase: &str, done: u64, total: u64) {
            self.0.lock().push((phase.to_string(), done, total));
        }
    }

    impl Recorder {
        /// Asserts the module-doc protocol and returns the phases in order with
        /// their totals.
        pub(crate) fn check(&self) -> Vec<(String, u64)> {
            let seen = self.0.lock();
            let mut phases: Vec<(String, u64)> = Vec::new();
            let mut last: Option<&(String, u64, u64)> = None;
            for r in seen.iter() {
                let (phase, done, total) = r;
                assert!(done <= total, "{r:?} exceeds its total");
                match last {
                    Some((p, d, t)) if p == phase => {
                        assert_eq!(t, total, "total of {phase} changed");
                        assert!(done > d, "{phase}: {done} after {d} is not increasing");
                    }
                    prev => {
                        if let Some((p, d, t)) = prev {
                            assert_eq!(d, t, "phase {p} ended at {d} of {t}");
                        }
                        assert_eq!(*done, 0, "phase {phase} did not start at 0");
                        phases.push((phase.clone(), *total));
                    }
                }
                last = Some(r);
            }
            let (p, d, t) = last.expect("no progress reported");
            assert_eq!(d, t, "last phase {p} ended at {d} of {t}");
            phases
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::Recorder;
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn meter_reports_are_monotone_from_many_threads_and_reach_the_total() {
        let rec = Recorder::default();
        let m = Meter::new(&rec, "work", 10_000);
        (0..1000).into_par_iter().for_each(|_| m.add(7));
        m.finish();
        assert_eq!(rec.check(), vec![("work".to_string(), 10_000)]);
    }

    #[test]
    fn finish_reports_the_total_once_and_set_never_goes_back() {
        let rec = Recorder::default();
        let m = Meter::new(&rec, "a", 5);
        m.set(3);
        m.set(2);
        m.finish();
        let m = Meter::new(&rec, "b", 0);
        m.finish();
        assert_eq!(
            *rec.0.lock(),
            vec![
                ("a".to_string(), 0, 5),
                ("a".to_string(), 3, 5),
                ("a".to_string(), 5, 5),
                ("b".to_string(), 0, 0),
            ]
        );
        rec.check();
    }
}
