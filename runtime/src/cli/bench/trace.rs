//! `tandem bench trace`: what recording one trace slice costs, with the tracer
//! disabled (the default of a run without `--trace`: a branch and no clock read)
//! and enabled (a clock read at each end and a push into the thread's buffer).
//! `docs/tracing.md` quotes the numbers.

use std::fmt;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::trace::Tracer;

/// One tracer state's cost.
#[derive(Clone, Debug)]
pub struct TraceCost {
    /// Whether the tracer recorded.
    pub enabled: bool,
    /// Nanoseconds per slice (opened, given a batch and a byte count, closed).
    pub ns_per_slice: f64,
    /// Slices the trace held afterwards (0 when disabled).
    pub recorded: usize,
}

/// The report: the disabled tracer, then the enabled one.
#[derive(Clone, Debug)]
pub struct TraceBenchReport {
    /// Slices timed per tracer.
    pub slices: u64,
    /// Disabled, then enabled.
    pub costs: Vec<TraceCost>,
}

/// Records `slices` slices on a disabled and on an enabled tracer, timing each
/// loop.
pub fn bench_trace(slices: u64) -> Result<TraceBenchReport> {
    if slices == 0 {
        return Err(Error::invalid_argument("--slices", "expected at least 1"));
    }
    let costs = [Tracer::disabled(), Tracer::new()]
        .into_iter()
        .map(|t| {
            let start = Instant::now();
            for k in 0..slices {
                let mut g = t.slice("s").batch(k);
                g.set_bytes(k);
            }
            let ns = start.elapsed().as_nanos() as f64 / slices as f64;
            TraceCost {
                enabled: t.is_enabled(),
                ns_per_slice: ns,
                recorded: t.collect().slices.len(),
            }
        })
        .collect();
    Ok(TraceBenchReport { slices, costs })
}

impl fmt::Display for TraceBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "trace slices: {} per tracer, one thread", self.slices)?;
        writeln!(f, "  tracer     ns/slice  recorded")?;
        for c in &self.costs {
            let state = if c.enabled { "enabled" } else { "disabled" };
            writeln!(
                f,
                "  {state:<9}  {:>8.1}  {:>8}",
                c.ns_per_slice, c.recorded
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_enabled_tracer_records_every_slice_and_the_disabled_none() {
        let r = bench_trace(1000).unwrap();
        assert_eq!(r.costs.len(), 2);
        assert!(!r.costs[0].enabled && r.costs[0].recorded == 0);
        assert!(r.costs[1].enabled && r.costs[1].recorded == 1000);
        let text = r.to_string();
        assert!(
            text.contains("disabled") && text.contains("enabled"),
            "{text}"
        );
        assert!(bench_trace(0).is_err());
    }
}
