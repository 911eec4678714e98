//! Gradient all-reduce between GPUs over NCCL (cudarc's `nccl` bindings, loaded
//! dynamically like the rest of CUDA). One communicator per backend instance,
//! made collectively from an id that rank 0 draws and the job broadcasts; every
//! all-reduce runs on the backend's compute stream, so it is ordered after the
//! backward that produced the gradients and before the optimizer step that reads
//! them, with no host synchronization. The communicator is held as NCCL's raw
//! handle rather than cudarc's `Comm`, whose `Drop` panics on an NCCL error.

use std::mem::MaybeUninit;

use cudarc::nccl::{result as nccl, sys as nsys};

use super::alloc::CudaBuf;
use super::device::CudaBackend;
use crate::backend::Backend;
use crate::error::{GpuOpsError, Result};
use crate::reduce::{check_reduce_args, GradReduce, NcclId};

fn nccl_err(op: &'static str) -> impl FnOnce(nccl::NcclError) -> GpuOpsError {
    move |e| GpuOpsError::Driver {
        op: op.to_string(),
        message: format!("{:?}", e.0),
    }
}

/// A fresh NCCL unique id (rank 0 of a job draws it).
pub(crate) fn unique_id() -> Result<NcclId> {
    super::nccl_available()?;
    let id = nccl::get_uniqueid().map_err(nccl_err("ncclGetUniqueId"))?;
    Ok(NcclId(id.internal.map(|c| c as u8)))
}

/// An NCCL communicator bound to one [`CudaBackend`]'s device and stream.
pub(crate) struct NcclReduce {
    comm: nsys::ncclComm_t,
    stream: nsys::cudaStream_t,
    rank: usize,
    ranks: usize,
    version: i32,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time;
// the engine that owns this value calls it under its own `&mut`/lock.
unsafe impl Send for NcclReduce {}

impl NcclReduce {
    /// Rank `rank` of `ranks` joins the communicator of `id` (collective: blocks
    /// until every rank has joined) on `dev`'s device.
    pub(crate) fn new(dev: &CudaBackend, rank: usize, ranks: usize, id: &NcclId) -> Result<Self> {
        super::nccl_available()?;
        if rank >= ranks {
            return Err(GpuOpsError::InvalidArgument {
                name: "rank",
                reason: format!("rank {rank} of a communicator of {ranks} ranks"),
            });
        }
        let (Ok(nranks), Ok(me)) = (i32::try_from(ranks), i32::try_from(rank)) else {
            return Err(GpuOpsError::InvalidArgument {
                name: "ranks",
                reason: format!("{ranks} ranks do not fit NCCL's int"),
            });
        };
        dev.bind()?;
        let version = nccl::get_nccl_version().map_err(nccl_err("ncclGetVersion"))?;
        let uid = nsys::ncclUniqueId {
            internal: id.0.map(|b| b as ::core::ffi::c_char),
        };
        let mut comm = MaybeUninit::uninit();
        // SAFETY: `comm` is a valid out-pointer; the id is 128 bytes as NCCL
        // defines it; the device's context is current on this thread.
        unsafe { nccl::comm_init_rank(comm.as_mut_ptr(), nranks, uid, me) }
            .map_err(nccl_err("ncclCommInitRank"))?;
        // SAFETY: initialized by the successful call above.
        let comm = unsafe { comm.assume_init() };
        Ok(Self {
            comm,
            stream: dev.cu() as nsys::cudaStream_t,
            rank,
            ranks,
            version,
        })
    }
}

impl GradReduce<CudaBackend> for NcclReduce {
    fn describe(&self) -> String {
        let v = self.version;
        // NCCL_VERSION_CODE is major * 10000 + minor * 100 + patch from 2.9 on.
        format!(
            "NCCL {}.{}.{}, rank {} of {}",
            v / 10000,
            v / 100 % 100,
            v % 100,
            self.rank,
            self.ranks
        )
    }

    fn all_reduce_sum(
        &self,
        dev: &CudaBackend,
        bufs: &mut [CudaBuf<f32>],
        lens: &[usize],
    ) -> Result<()> {
        check_reduce_args(dev, bufs, lens)?;
        if dev.cu() as nsys::cudaStream_t != self.stream {
            return Err(GpuOpsError::InvalidArgument {
                name: "dev",
                reason: "the NCCL communicator belongs to another CUDA backend".into(),
            });
        }
        dev.bind()?;
        nccl::group_start().map_err(nccl_err("ncclGroupStart"))?;
        let mut first_err = None;
        for (b, &n) in bufs.iter_mut().zip(lens) {
            if n == 0 {
                continue;
            }
            let p = b.raw() as *mut ::core::ffi::c_void;
            // SAFETY: `p` holds at least `n` f32 values (checked above); the
            // reduction is in place on the compute stream, which orders it with
            // every other use of the buffer.
            let r = unsafe {
                nccl::all_reduce(
                    p,
                    p,
                    n,
                    nsys::ncclDataType_t::ncclFloat32,
                    nsys::ncclRedOp_t::ncclSum,
                    self.comm,
                    self.stream,
                )
            };
            if let Err(e) = r {
                first_err.get_or_insert(nccl_err("ncclAllReduce")(e));
                break;
            }
        }
        // The group must be closed even after a failed enqueue.
        let end = nccl::group_end().map_err(nccl_err("ncclGroupEnd"));
        match first_err {
            Some(e) => Err(e),
            None => end.map(|_| ()),
        }
    }
}

/// The umbrella trait: every family is implemented in its file (`core.rs`,
/// `memory.rs`, `sampling.rs`, `features.rs`, `dense.rs`, `graph.rs`, `sparse.rs`);
/// this adds the collective reduce.
impl Backend for CudaBackend {
    fn nccl_reduce(
        &self,
        rank: usize,
        ranks: usize,
        id: &NcclId,
    ) -> Result<Box<dyn GradReduce<Self>>> {
        Ok(Box::new(NcclReduce::new(self, rank, ranks, id)?))
    }
}

impl Drop for NcclReduce {
    fn drop(&mut self) {
        // SAFETY: the handle came from ncclCommInitRank and is destroyed once.
        // An error here cannot be reported (drop) and leaves nothing to undo.
        let _ = unsafe { nccl::comm_destroy(self.comm) };
    }
}
