//! The error type of `scheduler`.

use cpu_ops::CpuOpsError;

/// Everything that can go wrong when the scheduler is handed its inputs.
///
/// The scheduler decides and never executes, so its errors are all about input:
/// a knob out of range, an unknown policy name, arrays whose sizes disagree, a
/// version from the future. Variants carry the field's name and what was expected
/// so the runtime can prefix the config key or file it came from.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    // --- configuration -------------------------------------------------------
    /// A numeric or structural argument is outside its allowed range.
    #[error("invalid `{name}`: expected {expected}, found {found}")]
    InvalidArgument {
        /// The field's name (a config key where there is one).
        name: &'static str,
        /// What was expected, in words.
        expected: String,
        /// What was given.
        found: String,
    },
    /// A string naming a policy is not one of the allowed names.
    #[error("invalid `{name}`: expected one of {}, found {found:?}", allowed.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(" | "))]
    UnknownVariant {
        /// The field's name (`orchestration`, `on_late`, `hotness`).
        name: &'static str,
        /// The names accepted.
        allowed: &'static [&'static str],
        /// The string given.
        found: String,
    },

    // --- data ----------------------------------------------------------------
    /// Two sizes that must agree do not.
    #[error("{what}: expected {expected}, found {found}")]
    SizeMismatch {
        /// Which size.
        what: &'static str,
        /// The size required.
        expected: usize,
        /// The size given.
        found: usize,
    },
    /// A vertex id is not below the number of vertices.
    #[error("{context}: vertex id {vertex} is out of range (expected < {num_vertices})")]
    VertexOutOfRange {
        /// Where the id came from.
        context: &'static str,
        /// The offending id.
        vertex: u64,
        /// The number of vertices.
        num_vertices: usize,
    },
    /// An array that must be a permutation of `0..n` is not.
    #[error("{what} is not a permutation of 0..{len}: {reason}")]
    NotAPermutation {
        /// Which array.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The first defect found.
        reason: String,
    },

    // --- versions and the protocol ----------------------------------------------
    /// A historical embedding claims a weight version newer than the current one.
    #[error(
        "embedding version {embedding} is newer than the current weight version {current} \
         (versions count optimizer steps and only grow)"
    )]
    VersionAhead {
        /// The embedding's version.
        embedding: u64,
        /// The current version.
        current: u64,
    },
    /// An event the protocol does not expect in its current state (a driver
    /// that answers out of turn).
    #[error("protocol: unexpected {event} event ({state})")]
    UnexpectedEvent {
        /// The event's name.
        event: &'static str,
        /// What the protocol was doing or waiting for.
        state: String,
    },
    /// A rule of the protocol would be broken (a row past the staleness bound, a
    /// batch ahead of its version): a bug, refused rather than carried out.
    #[error("protocol invariant broken: {what}")]
    ProtocolInvariant {
        /// What would have happened.
        what: String,
    },

    /// A simulation reached a point where nothing could happen any more (the
    /// protocol waits for a report no CPU job will send).
    #[error("simulation stalled at {time_s} s: {what}")]
    SimulationStalled {
        /// Simulated time when nothing could run any more.
        time_s: f64,
        /// What was waiting.
        what: String,
    },

    // --- below us --------------------------------------------------------------
    /// Pre-sampling failed in the sampler.
    #[error("pre-sampling: {0}")]
    Sampling(#[from] CpuOpsError),
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, SchedulerError>;

/// An [`SchedulerError::InvalidArgument`] from displayable parts.
pub(crate) fn invalid(
    name: &'static str,
    expected: impl Into<String>,
    found: impl std::fmt::Display,
) -> SchedulerError {
    SchedulerError::InvalidArgument {
        name,
        expected: expected.into(),
        found: found.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_field_and_the_allowed_values() {
        let e = SchedulerError::UnknownVariant {
            name: "on_late",
            allowed: &["wait", "compute"],
            found: "skip".into(),
        };
        assert_eq!(
            e.to_string(),
            "invalid `on_late`: expected one of \"wait\" | \"compute\", found \"skip\""
        );
        let e = invalid("hot_ratio", "a number in [0, 1]", 1.5);
        assert_eq!(
            e.to_string(),
            "invalid `hot_ratio`: expected a number in [0, 1], found 1.5"
        );
    }
}
