//! The error type of `cpu_ops`.

/// Everything that can go wrong in host data structures and kernels.
///
/// Variants carry structured fields so callers (the dataset reader, the CLI) can
/// add the file or key they were working on.
#[derive(Debug, thiserror::Error)]
pub enum CpuOpsError {
    /// A CSR structure is malformed (offsets not monotone, sizes disagree, ...).
    #[error("invalid CSR graph: {what}")]
    InvalidCsr {
        /// What is wrong, in words.
        what: String,
    },
    /// A vertex id is not below the number of vertices.
    #[error(
        "{context}: vertex id {vertex} is out of range (the graph has {num_vertices} vertices)"
    )]
    VertexOutOfRange {
        /// Where the id came from (an edge, a seed list, ...).
        context: &'static str,
        /// The offending id.
        vertex: u64,
        /// The number of vertices.
        num_vertices: usize,
    },
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
    /// A region of a mapped file cannot be viewed as the element type.
    #[error("mapped array at byte offset {offset} with {len} bytes cannot hold {elem}: {reason}")]
    BadMappedRegion {
        /// Byte offset in the mapping.
        offset: usize,
        /// Length in bytes.
        len: usize,
        /// The element type name.
        elem: &'static str,
        /// Why (misaligned, past the end, length not a multiple of the element size).
        reason: &'static str,
    },
    /// An argument is outside its allowed range.
    #[error("invalid argument `{name}`: {reason}")]
    InvalidArgument {
        /// The argument's name.
        name: &'static str,
        /// What was expected.
        reason: String,
    },
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, CpuOpsError>;
