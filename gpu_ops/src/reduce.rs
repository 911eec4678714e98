//! Summing gradients over the ranks of a data-parallel job where they are: on
//! the device. [`GradReduce`] is what the trainer's device ranks call once per
//! step; NCCL implements it for the CUDA backend
//! ([`crate::Backend::nccl_reduce`]), and any host collective can implement it
//! by copying (the trainer's tests do, to check the device-resident step on the
//! host backend).

use crate::backend::Backend;
use crate::error::{GpuOpsError, Result};

/// NCCL's unique id (`ncclUniqueId`, 128 bytes): rank 0 makes it with
/// [`crate::nccl_unique_id`] and every rank passes the same bytes to
/// [`crate::Backend::nccl_reduce`] (the trainer broadcasts it over MPI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclId(pub [u8; 128]);

/// An all-reduce of device buffers between the ranks of a job.
pub trait GradReduce<B: Backend>: Send {
    /// One line naming the transport (e.g. "NCCL 2.27.5, rank 0 of 2").
    fn describe(&self) -> String;
    /// Replaces `bufs[i][..lens[i]]` on every rank by its sum over the ranks, in
    /// place, ordered after the work already enqueued on `dev`'s compute stream
    /// and before the work enqueued later. Collective: every rank calls it with
    /// the same `lens`.
    fn all_reduce_sum(&self, dev: &B, bufs: &mut [B::Buf<f32>], lens: &[usize]) -> Result<()>;
}

/// `lens` is one length per buffer, each within its buffer.
pub fn check_reduce_args<B: Backend>(dev: &B, bufs: &[B::Buf<f32>], lens: &[usize]) -> Result<()> {
    if bufs.len() != lens.len() {
        return Err(GpuOpsError::SizeMismatch {
            what: "all-reduce lengths (one per buffer)",
            expected: bufs.len(),
            found: lens.len(),
        });
    }
    for (b, &n) in bufs.iter().zip(lens) {
        if dev.len(b) < n {
            return Err(GpuOpsError::SizeMismatch {
                what: "all-reduce buffer",
                expected: n,
                found: dev.len(b),
            });
        }
    }
    Ok(())
}
