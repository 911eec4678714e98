//! [`ThreadGroup`]: `N` ranks as threads of one process. Hand-written because it
//! is a test double for MPI (deterministic rank-order sums, an abort that fails
//! the other ranks' collectives instead of hanging them), not infrastructure.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::{check_counts, Communicator};
use crate::error::{Error, Result};

/// A barrier that a rank can break: every waiter (and every later call) then
/// fails instead of waiting for a rank that will not come.
struct Barrier {
    n: usize,
    state: Mutex<BarrierState>,
    cv: Condvar,
}

struct BarrierState {
    arrived: usize,
    generation: u64,
    aborted: Option<usize>,
}

impl Barrier {
    fn wait(&self, rank: usize) -> Result<()> {
        let mut s = self.state.lock();
        if let Some(by) = s.aborted {
            return Err(aborted(rank, by));
        }
        let gen = s.generation;
        s.arrived += 1;
        if s.arrived == self.n {
            s.arrived = 0;
            s.generation += 1;
            self.cv.notify_all();
            return Ok(());
        }
        loop {
            self.cv.wait(&mut s);
            if s.generation != gen {
                return Ok(());
            }
            if let Some(by) = s.aborted {
                return Err(aborted(rank, by));
            }
        }
    }

    fn abort(&self, by: usize) {
        let mut s = self.state.lock();
        s.aborted.get_or_insert(by);
        self.cv.notify_all();
    }
}

fn aborted(rank: usize, by: usize) -> Error {
    Error::Dist {
        what: format!("rank {rank}: rank {by} left the job (it failed or ended early)"),
    }
}

/// One value per rank, deposited for a collective.
type Slot = Option<(Vec<u8>, Vec<usize>)>;

struct Shared {
    barrier: Barrier,
    slots: Mutex<Vec<Slot>>,
    /// Channels made by [`Communicator::duplicate`], in the order ranks ask.
    dups: Mutex<Vec<Arc<Shared>>>,
}

impl Shared {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            barrier: Barrier {
                n,
                state: Mutex::new(BarrierState {
                    arrived: 0,
                    generation: 0,
                    aborted: None,
                }),
                cv: Condvar::new(),
            },
            slots: Mutex::new(vec![None; n]),
            dups: Mutex::new(Vec::new()),
        })
    }
}

/// `N` ranks as threads of one process: [`ThreadGroup::new`] returns one
/// communicator per rank, to be moved into its thread. Sums add the ranks'
/// values in rank order, so every rank gets bit-identical results. A rank whose
/// communicator is dropped (it ended, or failed) or that calls
/// [`Communicator::abort`] makes every other rank's pending and later collectives
/// fail with [`Error::Dist`] instead of waiting forever.
pub struct ThreadGroup {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
    dups_made: AtomicUsize,
}

impl ThreadGroup {
    /// One communicator per rank, rank order; `ranks` must be at least 1.
    pub fn new(ranks: usize) -> Result<Vec<ThreadGroup>> {
        if ranks == 0 {
            return Err(Error::invalid_argument(
                "ranks",
                "expected at least 1 rank, found 0",
            ));
        }
        let shared = Shared::new(ranks);
        Ok((0..ranks)
            .map(|rank| ThreadGroup {
                rank,
                size: ranks,
                shared: Arc::clone(&shared),
                dups_made: AtomicUsize::new(0),
            })
            .collect())
    }

    /// Deposits this rank's bytes and counts, then calls `read` with every
    /// rank's (rank order) while all of them are deposited.
    fn exchange<T>(
        &self,
        bytes: Vec<u8>,
        counts: Vec<usize>,
        read: impl FnOnce(&[Slot]) -> T,
    ) -> Result<T> {
        self.shared.slots.lock()[self.rank] = Some((bytes, counts));
        self.shared.barrier.wait(self.rank)?;
        let out = read(&self.shared.slots.lock());
        // Nobody deposits the next collective's values before everyone has read.
        self.shared.barrier.wait(self.rank)?;
        Ok(out)
    }

    fn reduce<T: bytemuck::Pod + std::ops::AddAssign>(&self, buf: &mut [T]) -> Result<()> {
        let len = buf.len();
        let sum = self.exchange(bytemuck::cast_slice(buf).to_vec(), vec![len], |slots| {
            let mut sum = vec![T::zeroed(); len];
            let mut mismatch = None;
            for (r, slot) in slots.iter().enumerate() {
                let (b, c) = slot.as_ref().expect("every rank deposited");
                if c[0] != len {
                    mismatch = Some((r, c[0]));
                    continue;
                }
                let vals: Vec<T> = bytemuck::pod_collect_to_vec(b);
                for (s, v) in sum.iter_mut().zip(vals) {
                    *s += v;
                }
            }
            (sum, mismatch)
        })?;
        if let (_, Some((r, other))) = &sum {
            return Err(Error::Dist {
                what: format!(
                    "all-reduce: rank {} holds {len} values, rank {r} {other}",
                    self.rank
                ),
            });
        }
        buf.copy_from_slice(&sum.0);
        Ok(())
    }

    fn all_to_all<T: bytemuck::Pod>(
        &self,
        send: &[T],
        send_counts: &[usize],
    ) -> Result<(Vec<T>, Vec<usize>)> {
        check_counts("send_counts", send.len(), send_counts, self.size)?;
        let me = self.rank;
        self.exchange(
            bytemuck::cast_slice(send).to_vec(),
            send_counts.to_vec(),
            |slots| {
                let mut out = Vec::new();
                let mut counts = Vec::with_capacity(slots.len());
                for slot in slots {
                    let (b, c) = slot.as_ref().expect("every rank deposited");
                    let vals: Vec<T> = bytemuck::pod_collect_to_vec(b);
                    let start: usize = c[..me].iter().sum();
                    out.extend_from_slice(&vals[start..start + c[me]]);
                    counts.push(c[me]);
                }
                (out, counts)
            },
        )
    }
}

impl Drop for ThreadGroup {
    fn drop(&mut self) {
        // A rank that leaves (done or failed) must not leave others waiting.
        self.shared.barrier.abort(self.rank);
    }
}

impl Communicator for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    /// Every thread rank is on this machine.
    fn local_rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        self.reduce(buf)
    }

    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        self.reduce(buf)
    }

    fn all_to_all_u32(
        &self,
        send: &[u32],
        send_counts: &[usize],
    ) -> Result<(Vec<u32>, Vec<usize>)> {
        self.all_to_all(send, send_counts)
    }

    fn all_to_all_f32(
        &self,
        send: &[f32],
        send_counts: &[usize],
    ) -> Result<(Vec<f32>, Vec<usize>)> {
        self.all_to_all(send, send_counts)
    }

    fn duplicate(&self) -> Result<Arc<dyn Communicator>> {
        let k = self.dups_made.fetch_add(1, Ordering::Relaxed);
        let shared = {
            let mut dups = self.shared.dups.lock();
            while dups.len() <= k {
                dups.push(Shared::new(self.size));
            }
            Arc::clone(&dups[k])
        };
        // Collective, like MPI_Comm_dup: no rank uses the channel before all have it.
        self.shared.barrier.wait(self.rank)?;
        Ok(Arc::new(ThreadGroup {
            rank: self.rank,
            size: self.size,
            shared,
            dups_made: AtomicUsize::new(0),
        }))
    }

    fn concurrent(&self) -> bool {
        true
    }

    fn abort(&self, _code: i32) {
        self.shared.barrier.abort(self.rank);
        for d in self.shared.dups.lock().iter() {
            d.barrier.abort(self.rank);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Send>(n: usize, f: impl Fn(ThreadGroup) -> T + Sync) -> Vec<T> {
        let ranks = ThreadGroup::new(n).unwrap();
        std::thread::scope(|s| {
            let hs: Vec<_> = ranks.into_iter().map(|c| s.spawn(|| f(c))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn sums_are_identical_on_every_rank() {
        let out = run(4, |c| {
            let mut v: Vec<f32> = (0..5).map(|i| 0.1 * (i + c.rank()) as f32).collect();
            c.all_reduce_sum(&mut v).unwrap();
            let mut w = vec![c.rank() as f64];
            c.all_reduce_sum_f64(&mut w).unwrap();
            (v, w)
        });
        for (v, w) in &out {
            assert_eq!(v.to_vec(), out[0].0);
            assert_eq!(w, &[6.0]);
        }
        let expect: Vec<f32> = (0..5)
            .map(|i| (0..4).fold(0f32, |s, r| s + 0.1 * (i + r) as f32))
            .collect();
        assert_eq!(out[0].0, expect);
    }

    #[test]
    fn all_to_all_routes_every_part_to_its_rank() {
        let out = run(3, |c| {
            // Rank r sends d+1 copies of 10r + d to rank d.
            let counts: Vec<usize> = (0..3).map(|d| d + 1).collect();
            let send: Vec<u32> = (0..3)
                .flat_map(|d| std::iter::repeat_n((10 * c.rank() + d) as u32, d + 1))
                .collect();
            c.all_to_all_u32(&send, &counts).unwrap()
        });
        for (d, (vals, counts)) in out.iter().enumerate() {
            assert_eq!(counts, &vec![d + 1; 3]);
            let expect: Vec<u32> = (0..3)
                .flat_map(|r| std::iter::repeat_n((10 * r + d) as u32, d + 1))
                .collect();
            assert_eq!(vals, &expect);
        }
    }

    #[test]
    fn a_rank_that_leaves_fails_the_others_instead_of_hanging_them() {
        let out = run(3, |c| {
            if c.rank() == 1 {
                c.abort(1);
                return None;
            }
            let mut v = vec![1.0f32];
            Some(c.all_reduce_sum(&mut v).unwrap_err().to_string())
        });
        for e in out.into_iter().flatten() {
            assert!(e.contains("rank 1 left the job"), "{e}");
        }
        // Dropping a communicator (a rank that returned early) does the same.
        let out = run(2, |c| {
            if c.rank() == 0 {
                drop(c);
                return None;
            }
            let dup = c.duplicate();
            Some(dup.err().map(|e| e.to_string()))
        });
        assert!(out[1]
            .as_ref()
            .unwrap()
            .as_ref()
            .unwrap()
            .contains("rank 0 left"));
    }

    #[test]
    fn duplicates_are_independent_channels() {
        let out = run(2, |c| {
            let d = c.duplicate().unwrap();
            // Collectives on the two channels from two threads at once.
            std::thread::scope(|s| {
                let a = s.spawn(|| {
                    let mut v = vec![1.0f32; 3];
                    for _ in 0..50 {
                        c.all_reduce_sum(&mut v).unwrap();
                    }
                    v
                });
                let b = s.spawn(|| {
                    let mut n = 0usize;
                    for _ in 0..50 {
                        let (got, _) = d.all_to_all_u32(&[d.rank() as u32; 2], &[1, 1]).unwrap();
                        n += got.len();
                    }
                    n
                });
                (a.join().unwrap(), b.join().unwrap())
            })
        });
        for (v, n) in out {
            assert_eq!(v, vec![2f32.powi(50); 3]);
            assert_eq!(n, 100);
        }
    }

    #[test]
    fn mismatched_lengths_are_errors_naming_the_ranks() {
        let out = run(2, |c| {
            let mut v = vec![0f32; 1 + c.rank()];
            c.all_reduce_sum(&mut v).unwrap_err().to_string()
        });
        assert!(
            out[0].contains("rank 0 holds 1 values, rank 1 2"),
            "{}",
            out[0]
        );
    }
}
