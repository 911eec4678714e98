//! The device-resident data-parallel step (`dist.reduce = "nccl"`): which
//! [`GradReduce`] sums a rank's gradients without leaving the device
//! ([`ReduceOn`]), and [`CopyReduce`], the same sum through host copies over
//! any [`Communicator`] (it checks that step on the host backend, where NCCL
//! cannot run).

use std::sync::Arc;

use gpu_ops::{check_reduce_args, Backend, GpuOpsError, GradReduce, NcclId};
use parking_lot::Mutex;

use crate::dist::Communicator;

/// Which transport sums a rank's gradients ([`super::device::grad_reduce`]).
pub enum ReduceOn {
    /// NCCL between the ranks' GPUs: rank `rank` of `ranks`, joining the
    /// communicator of `id` (drawn by rank 0, broadcast to every rank).
    Nccl {
        /// This rank.
        rank: usize,
        /// Ranks in the job.
        ranks: usize,
        /// NCCL's unique id, the same on every rank.
        id: NcclId,
    },
    /// Downloads, sums over `comm` on the host, uploads ([`CopyReduce`]).
    HostCopy(Arc<dyn Communicator>),
}

/// Sums device buffers over a [`Communicator`] through host copies: the
/// device-resident step's reference, for backends without NCCL.
pub struct CopyReduce {
    comm: Arc<dyn Communicator>,
    flat: Mutex<Vec<f32>>,
}

impl CopyReduce {
    /// Over `comm` (collectives on it must not interleave with another
    /// thread's: pass a duplicate when others use it).
    pub fn new(comm: Arc<dyn Communicator>) -> Self {
        Self {
            comm,
            flat: Mutex::new(Vec::new()),
        }
    }
}

impl<B: Backend> GradReduce<B> for CopyReduce {
    fn describe(&self) -> String {
        format!(
            "host copies summed over {} ranks (rank {})",
            self.comm.size(),
            self.comm.rank()
        )
    }

    fn all_reduce_sum(
        &self,
        dev: &B,
        bufs: &mut [B::Buf<f32>],
        lens: &[usize],
    ) -> gpu_ops::Result<()> {
        check_reduce_args(dev, bufs, lens)?;
        let mut flat = self.flat.lock();
        flat.clear();
        for (b, &n) in bufs.iter().zip(lens) {
            flat.extend(dev.to_host(b, n)?);
        }
        self.comm
            .all_reduce_sum(&mut flat)
            .map_err(|e| GpuOpsError::Driver {
                op: "all-reduce over the communicator".into(),
                message: e.to_string(),
            })?;
        let mut at = 0;
        for (b, &n) in bufs.iter_mut().zip(lens) {
            dev.upload(dev.stream(), &flat[at..at + n], b)?;
            at += n;
        }
        Ok(())
    }
}
