//! Data-parallel training over several ranks (`[dist]`, `docs/distributed.md`).
//!
//! A [`Communicator`] connects the ranks of one job. [`Solo`] is the one-process
//! job (what a trainer uses unless told otherwise), [`ThreadGroup`] runs `N` ranks
//! as threads of one process (tests, single-machine experiments), and
//! `MpiCommunicator` (cargo feature `mpi`) carries the collectives over MPI between
//! processes and machines (`mpirun -np N tandem train`).
//!
//! What the trainer does with one (see [`crate::Trainer::set_communicator`]):
//! every rank cuts the same shuffled epoch order into the same global batches of
//! `train.batch_size`; rank `r` of `N` trains the `r`-th of `N` balanced slices of
//! each batch, with the batch's seed, so every vertex draws the neighbours it would
//! draw in a one-rank run. Each rank's gradients are weighted by its share of the
//! batch and summed with one all-reduce per step (one flat bucket, which also
//! carries the loss, accuracy, non-finite and cancel flags); every rank then
//! applies the same Adam step, so the ranks hold the same weights, and `N` ranks
//! train the model one rank trains, up to the summation order.
//!
//! ```
//! use runtime::dist::{Communicator, ThreadGroup};
//!
//! let ranks = ThreadGroup::new(3).unwrap();
//! let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
//!     let handles: Vec<_> = ranks
//!         .into_iter()
//!         .map(|c| s.spawn(move || {
//!             let mut v = vec![c.rank() as f32, 1.0];
//!             c.all_reduce_sum(&mut v).unwrap();
//!             v
//!         }))
//!         .collect();
//!     handles.into_iter().map(|h| h.join().unwrap()).collect()
//! });
//! assert!(sums.iter().all(|v| v == &[3.0, 3.0]));
//! ```

use std::sync::Arc;

use crate::error::{Error, Result};

pub(crate) mod features;
#[cfg(feature = "mpi")]
mod mpi;
pub mod partition;
mod threads;

#[cfg(feature = "mpi")]
pub use self::mpi::{MpiCommunicator, MpiRuntime};
#[cfg(feature = "metis")]
pub use partition::partition_graph;
pub use partition::{read_partition_file, write_partition_file};
pub use threads::ThreadGroup;

/// `dist.reduce`: how gradients are summed across ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DistReduce {
    /// NCCL when every rank trains on a GPU and loads NCCL, else MPI.
    #[default]
    Auto,
    /// MPI `Allreduce` (host memory).
    Mpi,
    /// NCCL between GPUs: the gradients are summed on the device (every rank
    /// needs `device.kind = "cuda"` and `libnccl.so`, else a one-line error).
    Nccl,
}

impl std::fmt::Display for DistReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Mpi => "mpi",
            Self::Nccl => "nccl",
        })
    }
}

/// The ranks of one job and the collectives between them. Every collective must
/// be called by every rank, in the same order; [`Communicator::duplicate`] gives
/// an independent channel for collectives issued from another thread.
pub trait Communicator: Send + Sync {
    /// This rank, in `0..size()`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn size(&self) -> usize;

    /// This rank among the ranks on its machine (MPI: its rank in
    /// `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`): a rank on a device engine
    /// built by [`crate::TrainerBuilder`] uses GPU `device.ordinal + local_rank`.
    fn local_rank(&self) -> usize;

    /// Replaces `buf` with the element-wise sum of every rank's `buf` (same length
    /// on every rank); every rank gets the same values.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()>;

    /// Element-wise sum of `f64` values (counts, losses), like
    /// [`Communicator::all_reduce_sum`].
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()>;

    /// Makes every rank's `buf` (same length on every rank) equal rank
    /// `root`'s: a sum of bytes as `f64` (exact: one rank contributes each
    /// value, the others zeros), which every communicator already has; it is
    /// used once per job (NCCL's 128-byte id), where `MPI_Bcast` would save
    /// nothing that matters.
    fn broadcast_bytes(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        if root >= self.size() {
            return Err(Error::Dist {
                what: format!("broadcast from rank {root} of {} ranks", self.size()),
            });
        }
        let mine = self.rank() == root;
        let mut v: Vec<f64> = buf
            .iter()
            .map(|&b| if mine { b as f64 } else { 0.0 })
            .collect();
        self.all_reduce_sum_f64(&mut v)?;
        for (b, x) in buf.iter_mut().zip(v) {
            *b = x as u8;
        }
        Ok(())
    }

    /// All-to-all with varying counts: `send` holds, in rank order, the
    /// `send_counts[d]` values for rank `d`. Returns what every rank sent to this
    /// one, in rank order, and how many came from each.
    fn all_to_all_u32(&self, send: &[u32], send_counts: &[usize])
        -> Result<(Vec<u32>, Vec<usize>)>;

    /// [`Communicator::all_to_all_u32`] for `f32` values.
    fn all_to_all_f32(&self, send: &[f32], send_counts: &[usize])
        -> Result<(Vec<f32>, Vec<usize>)>;

    /// A new channel over the same ranks whose collectives do not interleave with
    /// this one's (collective: every rank calls it).
    fn duplicate(&self) -> Result<Arc<dyn Communicator>>;

    /// Whether collectives on two channels may run at once on two threads (MPI:
    /// the library granted `MPI_THREAD_MULTIPLE`). When not, the trainer does not
    /// overlap the feature exchange with the gradient all-reduce.
    fn concurrent(&self) -> bool;

    /// Ends the job after this rank failed (and printed its error), so the other
    /// ranks are never left waiting in a collective: over MPI, `MPI_Abort`
    /// stops every process with exit code `code` and does not return; a
    /// [`ThreadGroup`] makes the other ranks' collectives fail with
    /// [`Error::Dist`]; [`Solo`] has nobody to stop.
    fn abort(&self, code: i32);
}

/// Whether an MPI launcher started this process (`mpirun`/`mpiexec` of Open MPI
/// or MPICH, or Slurm's `srun --mpi=pmi2|pmix`): the environment names a rank.
/// A process started without one trains alone, without initializing MPI.
pub fn launched_by_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"]
        .iter()
        .any(|k| std::env::var_os(k).is_some())
}

/// The one-process job: rank 0 of 1; collectives are identities.
#[derive(Clone, Copy, Debug, Default)]
pub struct Solo;

impl Communicator for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn local_rank(&self) -> usize {
        0
    }
    fn all_reduce_sum(&self, _buf: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_f64(&self, _buf: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn all_to_all_u32(
        &self,
        send: &[u32],
        send_counts: &[usize],
    ) -> Result<(Vec<u32>, Vec<usize>)> {
        check_counts("send_counts", send.len(), send_counts, 1)?;
        Ok((send.to_vec(), send_counts.to_vec()))
    }
    fn all_to_all_f32(
        &self,
        send: &[f32],
        send_counts: &[usize],
    ) -> Result<(Vec<f32>, Vec<usize>)> {
        check_counts("send_counts", send.len(), send_counts, 1)?;
        Ok((send.to_vec(), send_counts.to_vec()))
    }
    fn duplicate(&self) -> Result<Arc<dyn Communicator>> {
        Ok(Arc::new(Solo))
    }
    fn concurrent(&self) -> bool {
        true
    }
    fn abort(&self, _code: i32) {}
}

/// Checks that `counts` has one entry per rank and sums to `len`.
pub(crate) fn check_counts(what: &str, len: usize, counts: &[usize], ranks: usize) -> Result<()> {
    if counts.len() != ranks {
        return Err(Error::invalid_argument(
            what,
            format!(
                "expected one count per rank ({ranks}), found {}",
                counts.len()
            ),
        ));
    }
    let total: usize = counts.iter().sum();
    if total != len {
        return Err(Error::invalid_argument(
            what,
            format!("the counts sum to {total}, but the buffer holds {len} values"),
        ));
    }
    Ok(())
}

/// The slice of `len` items rank `rank` of `ranks` takes: balanced contiguous
/// ranges, `[rank·len/N, (rank+1)·len/N)`.
pub fn share(len: usize, rank: usize, ranks: usize) -> std::ops::Range<usize> {
    let at = |r: usize| ((r as u128 * len as u128) / ranks as u128) as usize;
    at(rank)..at(rank + 1)
}

/// Whether every rank passed the same `value` (collective; compares 20 bits of
/// it, with their square, in one `f64` all-reduce, exact below 2^53).
pub(crate) fn ranks_agree(comm: &dyn Communicator, value: u64) -> Result<bool> {
    let h = (value & 0xF_FFFF) as f64;
    let mut sums = [h, h * h, 1.0];
    comm.all_reduce_sum_f64(&mut sums)?;
    Ok(sums[0] == sums[2] * h && sums[1] == sums[2] * h * h)
}

/// The rank that owns item `v` of `len` under [`share`] (the inverse mapping).
pub fn owner(v: usize, len: usize, ranks: usize) -> usize {
    // share(len, r) starts at floor(r·len/N); the owner is the largest r with
    // floor(r·len/N) <= v, i.e. r = floor(((v + 1)·N - 1) / len).
    let r = (((v as u128 + 1) * ranks as u128 - 1) / len as u128) as usize;
    r.min(ranks - 1)
}

/// What a trainer's collectives moved and cost (this rank's view), summed over
/// its life; [`crate::Trainer::dist_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DistStats {
    /// Gradient all-reduces (one per step).
    pub allreduces: u64,
    /// Bytes this rank contributed to them.
    pub allreduce_bytes: u64,
    /// Seconds spent in them (waiting for the slowest rank included).
    pub allreduce_secs: f64,
    /// Feature exchanges (partitioned features: one per batch, training and
    /// evaluation).
    pub exchanges: u64,
    /// Bytes this rank sent and received in them (requests and rows).
    pub exchange_bytes: u64,
    /// Seconds spent in them.
    pub exchange_secs: f64,
    /// Input rows this rank's batches needed that another rank owns.
    pub remote_rows: u64,
    /// Of those, rows served from the remote-row cache.
    pub remote_cache_hits: u64,
}

impl DistStats {
    /// Remote rows served by the cache, as a fraction (0 with none needed).
    pub fn remote_hit_rate(&self) -> f64 {
        if self.remote_rows == 0 {
            0.0
        } else {
            self.remote_cache_hits as f64 / self.remote_rows as f64
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn shares_cover_every_item_once_and_owner_inverts_them() {
        for len in [0usize, 1, 2, 3, 7, 10, 1000, 1001] {
            for ranks in 1..=5 {
                let mut next = 0;
                for r in 0..ranks {
                    let s = share(len, r, ranks);
                    assert_eq!(s.start, next, "len {len} ranks {ranks} rank {r}");
                    assert!(s.len() <= len.div_ceil(ranks));
                    for v in s.clone() {
                        assert_eq!(owner(v, len, ranks), r, "len {len} ranks {ranks} v {v}");
                    }
                    next = s.end;
                }
                assert_eq!(next, len);
            }
        }
    }

    #[test]
    fn broadcast_gives_every_rank_the_roots_bytes() {
        let groups = ThreadGroup::new(3).unwrap();
        let got: Vec<Vec<u8>> = std::thread::scope(|s| {
            let hs: Vec<_> = groups
                .into_iter()
                .map(|c| {
                    s.spawn(move || {
                        let mut b: Vec<u8> = (0..=255u8).map(|x| x ^ c.rank() as u8).collect();
                        c.broadcast_bytes(1, &mut b).unwrap();
                        assert!(c.broadcast_bytes(3, &mut b).is_err());
                        b
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want: Vec<u8> = (0..=255u8).map(|x| x ^ 1).collect();
        assert!(got.iter().all(|b| *b == want));
    }

    #[test]
    fn solo_is_the_identity_and_checks_counts() {
        let mut v = vec![1.0f32, 2.0];
        Solo.all_reduce_sum(&mut v).unwrap();
        assert_eq!(v, [1.0, 2.0]);
        let (got, counts) = Solo.all_to_all_u32(&[4, 5], &[2]).unwrap();
        assert_eq!((got, counts), (vec![4, 5], vec![2]));
        let err = Solo.all_to_all_u32(&[4, 5], &[1]).unwrap_err().to_string();
        assert!(
            err.contains("send_counts") && err.contains("sum to 1"),
            "{err}"
        );
        let err = Solo
            .all_to_all_f32(&[4.0], &[1, 0])
            .unwrap_err()
            .to_string();
        assert!(err.contains("one count per rank (1)"), "{err}");
    }
}
