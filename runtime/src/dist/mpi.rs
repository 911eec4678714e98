//! The MPI communicator (cargo feature `mpi`, Open MPI or MPICH through the `mpi`
//! crate). MPI's default error handler stays in place: a failed MPI call ends
//! the whole job, so these collectives return errors only for arguments MPI
//! cannot express (counts above `i32::MAX`).

use std::sync::Arc;

use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Equivalence};
use mpi::Threading;

use super::{check_counts, Communicator};
use crate::error::{Error, Result};

/// MPI, initialized for the life of this value (dropping it finalizes MPI: drop
/// every [`MpiCommunicator`] first).
pub struct MpiRuntime {
    universe: Universe,
    threading: Threading,
}

impl MpiRuntime {
    /// Initializes MPI asking for `MPI_THREAD_MULTIPLE`; the trainer calls MPI
    /// from its compute pool, so anything below `MPI_THREAD_SERIALIZED` is an
    /// error. Errors when MPI was already initialized.
    pub fn init() -> Result<Self> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| Error::Dist {
                what: "MPI was already initialized in this process".into(),
            })?;
        if matches!(threading, Threading::Single | Threading::Funneled) {
            return Err(Error::Dist {
                what: format!(
                    "the MPI library grants only {threading:?} threading; Tandem calls MPI from \
                     worker threads and needs at least MPI_THREAD_SERIALIZED"
                ),
            });
        }
        Ok(Self {
            universe,
            threading,
        })
    }

    /// The world communicator (every rank of the job).
    pub fn world(&self) -> Arc<dyn Communicator> {
        let comm = self.universe.world();
        let local = comm.split_shared(comm.rank()).rank() as usize;
        Arc::new(MpiCommunicator {
            comm,
            multiple: self.threading == Threading::Multiple,
            local,
        })
    }

    /// The threading level the library granted.
    pub fn threading(&self) -> &'static str {
        match self.threading {
            Threading::Single => "single",
            Threading::Funneled => "funneled",
            Threading::Serialized => "serialized",
            Threading::Multiple => "multiple",
        }
    }
}

/// An MPI communicator; see [`MpiRuntime::world`].
pub struct MpiCommunicator {
    comm: SimpleCommunicator,
    /// `MPI_THREAD_MULTIPLE` was granted.
    multiple: bool,
    /// The rank among this machine's ranks.
    local: usize,
}

// SAFETY: an MPI communicator handle is process-global state that MPI lets any
// thread use once the library is initialized above MPI_THREAD_FUNNELED (checked
// by MpiRuntime::init); with MPI_THREAD_SERIALIZED the trainer never issues two
// collectives at once (`concurrent()` is false).
unsafe impl Send for MpiCommunicator {}
// SAFETY: as for Send: the handle is only read; MPI serializes what it must.
unsafe impl Sync for MpiCommunicator {}

fn count(what: &str, n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error::Dist {
        what: format!("{what}: {n} values exceed MPI's count limit (2^31 - 1)"),
    })
}

fn displs(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0i32, |at, &c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect()
}

impl MpiCommunicator {
    fn all_to_all_v<T: Equivalence + Copy + Default>(
        &self,
        send: &[T],
        send_counts: &[usize],
    ) -> Result<(Vec<T>, Vec<usize>)> {
        check_counts("send_counts", send.len(), send_counts, self.size())?;
        count("all-to-all send buffer", send.len())?;
        let sc: Vec<i32> = send_counts
            .iter()
            .map(|&c| count("all-to-all count", c))
            .collect::<Result<_>>()?;
        let mut rc = vec![0i32; sc.len()];
        self.comm.all_to_all_into(&sc[..], &mut rc[..]);
        let total: i64 = rc.iter().map(|&c| c as i64).sum();
        count("all-to-all receive buffer", total as usize)?;
        let mut recv = vec![T::default(); total as usize];
        let (sd, rd) = (displs(&sc), displs(&rc));
        {
            let sendp = Partition::new(send, &sc[..], &sd[..]);
            let mut recvp = PartitionMut::new(&mut recv[..], &rc[..], &rd[..]);
            self.comm.all_to_all_varcount_into(&sendp, &mut recvp);
        }
        Ok((recv, rc.iter().map(|&c| c as usize).collect()))
    }
}

impl Communicator for MpiCommunicator {
    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    fn size(&self) -> usize {
        self.comm.size() as usize
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        count("all-reduce buffer", buf.len())?;
        let send = buf.to_vec();
        self.comm
            .all_reduce_into(&send[..], buf, mpi::collective::SystemOperation::sum());
        Ok(())
    }

    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        count("all-reduce buffer", buf.len())?;
        let send = buf.to_vec();
        self.comm
            .all_reduce_into(&send[..], buf, mpi::collective::SystemOperation::sum());
        Ok(())
    }

    fn all_to_all_u32(
        &self,
        send: &[u32],
        send_counts: &[usize],
    ) -> Result<(Vec<u32>, Vec<usize>)> {
        self.all_to_all_v(send, send_counts)
    }

    fn all_to_all_f32(
        &self,
        send: &[f32],
        send_counts: &[usize],
    ) -> Result<(Vec<f32>, Vec<usize>)> {
        self.all_to_all_v(send, send_counts)
    }

    fn duplicate(&self) -> Result<Arc<dyn Communicator>> {
        Ok(Arc::new(MpiCommunicator {
            comm: self.comm.duplicate(),
            multiple: self.multiple,
            local: self.local,
        }))
    }

    fn concurrent(&self) -> bool {
        self.multiple
    }

    fn local_rank(&self) -> usize {
        self.local
    }

    fn abort(&self, code: i32) {
        self.comm.abort(code)
    }
}
