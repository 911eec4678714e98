//! Partitioned features (`dist.features = "partitioned"`): rank `r` of `N` reads
//! only the feature rows it owns — `share(n, r, N)`, or the vertices a partition
//! file gives it (`dist.partition_file`) — and gets every other row a
//! batch needs from its owner, in one exchange per batch (an all-to-all of the
//! requested ids, then one of the rows), or from a cache of the remote rows of
//! the highest-degree vertices (the device feature cache's policy), filled once
//! when training starts.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::{owner, ranks_agree, share, Communicator, DistStats};
use crate::dataset::Dataset;
use crate::error::{Error, Result};

/// A rank's view of partitioned features; see the module doc.
pub(crate) struct PartitionedFeatures {
    /// The exchange's own channel (it runs beside the gradient all-reduce).
    comm: Arc<dyn Communicator>,
    n: usize,
    dim: usize,
    /// This rank's rows without a partition file.
    own: Range<usize>,
    /// The partition file's owner of every vertex (`None`: contiguous ranges).
    parts: Option<Vec<u32>>,
    /// Cache slot of each vertex (`u32::MAX`: not cached).
    slot: Vec<u32>,
    /// Cached remote rows, `slot` order.
    cache: Vec<f32>,
    stats: Mutex<DistStats>,
}

impl PartitionedFeatures {
    /// Collective: every rank builds its view at the same time, and the remote
    /// cache (`cache_rows` rows of the highest-degree vertices this rank does not
    /// own) is filled with one exchange. `parts` (a partition file's map, one
    /// rank per vertex) replaces the contiguous ranges; the ranks check that
    /// they hold the same map.
    pub(crate) fn new(
        ds: &Dataset,
        comm: Arc<dyn Communicator>,
        cache_rows: usize,
        parts: Option<Vec<u32>>,
    ) -> Result<Self> {
        let n = ds.num_vertices();
        let (rank, ranks) = (comm.rank(), comm.size());
        if let Some(p) = &parts {
            let bad = p.len() != n || p.iter().any(|&r| r as usize >= ranks);
            let h = if bad {
                // Disagree on purpose: every rank then reports the error.
                u64::from(rank as u32) + 1
            } else {
                xxhash_rust::xxh3::xxh3_64(bytemuck::cast_slice(p))
            };
            if !ranks_agree(&*comm, h)? || bad {
                return Err(Error::Dist {
                    what: format!(
                        "rank {rank}: the ranks' partition files differ (dist.partition_file \
                         must hold the same {n} parts in 0..{ranks} on every rank)"
                    ),
                });
            }
        }
        let own = share(n, rank, ranks);
        let mut me = Self {
            comm,
            n,
            dim: ds.features.dim(),
            own,
            parts,
            slot: Vec::new(),
            cache: Vec::new(),
            stats: Mutex::new(DistStats::default()),
        };
        let cached: Vec<u32> = if cache_rows == 0 {
            Vec::new()
        } else {
            crate::engine::degree_order(ds)
                .into_iter()
                .filter(|&v| !me.owns(v as usize))
                .take(cache_rows)
                .collect()
        };
        // Every rank runs the fill exchange, even with nothing to cache.
        let mut rows = Vec::new();
        me.fetch(ds, &cached, &mut rows, false)?;
        if !cached.is_empty() {
            me.slot = vec![u32::MAX; n];
            for (i, &v) in cached.iter().enumerate() {
                me.slot[v as usize] = i as u32;
            }
        }
        me.cache = rows;
        *me.stats.lock() = DistStats::default();
        Ok(me)
    }

    /// The rows this rank owns without a partition file.
    #[cfg(test)]
    pub(crate) fn own(&self) -> Range<usize> {
        self.own.clone()
    }

    /// Whether this rank owns row `v` (`v < n`).
    fn owns(&self, v: usize) -> bool {
        match &self.parts {
            Some(p) => p[v] as usize == self.comm.rank(),
            None => self.own.contains(&v),
        }
    }

    /// The rank that owns row `v` (`v < n`).
    fn owner_of(&self, v: usize) -> usize {
        match &self.parts {
            Some(p) => p[v] as usize,
            None => owner(v, self.n, self.comm.size()),
        }
    }

    /// With a partition file, the seeds of `batch` this rank owns (it trains
    /// them, so their own rows and most of their neighbours' are local);
    /// `None` with contiguous ranges (the batch is split by position).
    pub(crate) fn seeds_of(&self, batch: &[u32]) -> Option<Vec<u32>> {
        let p = self.parts.as_ref()?;
        let rank = self.comm.rank() as u32;
        Some(
            batch
                .iter()
                .copied()
                .filter(|&v| p.get(v as usize) == Some(&rank))
                .collect(),
        )
    }

    /// Rows cached from other ranks.
    #[cfg(test)]
    pub(crate) fn cached_rows(&self) -> usize {
        self.cache.len() / self.dim.max(1)
    }

    /// What the exchanges moved so far.
    pub(crate) fn stats(&self) -> DistStats {
        *self.stats.lock()
    }

    /// Collective: writes the rows of `ids` (distinct vertices) into `out`
    /// (`ids.len() × dim`, resized), reading own rows from `ds`, cached rows from
    /// the cache and the rest from their owners. Returns the bytes exchanged.
    pub(crate) fn gather(&self, ds: &Dataset, ids: &[u32], out: &mut Vec<f32>) -> Result<u64> {
        self.fetch(ds, ids, out, true)
    }

    fn fetch(&self, ds: &Dataset, ids: &[u32], out: &mut Vec<f32>, use_cache: bool) -> Result<u64> {
        let t = Instant::now();
        let (dim, ranks, rank) = (self.dim, self.comm.size(), self.comm.rank());
        out.resize(ids.len() * dim, 0.0);
        // Requests grouped by owner: (position in `ids`, vertex).
        let mut wanted: Vec<Vec<(usize, u32)>> = vec![Vec::new(); ranks];
        let (mut remote, mut hits) = (0u64, 0u64);
        for (i, &v) in ids.iter().enumerate() {
            let vu = v as usize;
            if vu >= self.n {
                return Err(Error::invalid_argument(
                    "feature ids",
                    format!(
                        "vertex {v} is out of range: the dataset has {} vertices",
                        self.n
                    ),
                ));
            }
            let dst = &mut out[i * dim..(i + 1) * dim];
            if self.owns(vu) {
                dst.copy_from_slice(ds.features.row(vu));
                continue;
            }
            remote += 1;
            match self.slot.get(vu) {
                Some(&s) if use_cache && s != u32::MAX => {
                    hits += 1;
                    let s = s as usize;
                    dst.copy_from_slice(&self.cache[s * dim..(s + 1) * dim]);
                }
                _ => wanted[self.owner_of(vu)].push((i, v)),
            }
        }
        let counts: Vec<usize> = wanted.iter().map(Vec::len).collect();
        let requests: Vec<u32> = wanted.iter().flatten().map(|&(_, v)| v).collect();
        let (asked, asked_counts) = self.comm.all_to_all_u32(&requests, &counts)?;
        let mut rows = Vec::with_capacity(asked.len() * dim);
        for (from, range) in ranges(&asked_counts).enumerate() {
            for &v in &asked[range] {
                if v as usize >= self.n || !self.owns(v as usize) {
                    return Err(Error::Dist {
                        what: format!(
                            "rank {from} asked rank {rank} for feature row {v}, which rank \
                             {rank} does not own"
                        ),
                    });
                }
                rows.extend_from_slice(ds.features.row(v as usize));
            }
        }
        let row_counts: Vec<usize> = asked_counts.iter().map(|c| c * dim).collect();
        let (got, got_counts) = self.comm.all_to_all_f32(&rows, &row_counts)?;
        for (src, (want, count)) in wanted.iter().zip(&got_counts).enumerate() {
            if *count != want.len() * dim {
                return Err(Error::Dist {
                    what: format!(
                        "rank {src} sent rank {rank} {count} feature values for {} rows of {dim}",
                        want.len()
                    ),
                });
            }
        }
        for (k, &(i, _)) in wanted.iter().flatten().enumerate() {
            out[i * dim..(i + 1) * dim].copy_from_slice(&got[k * dim..(k + 1) * dim]);
        }
        let bytes = (requests.len() + asked.len()) as u64 * 4 + (rows.len() + got.len()) as u64 * 4;
        let mut s = self.stats.lock();
        s.exchanges += 1;
        s.exchange_bytes += bytes;
        s.exchange_secs += t.elapsed().as_secs_f64();
        s.remote_rows += remote;
        s.remote_cache_hits += hits;
        Ok(bytes)
    }
}

/// Consecutive ranges of lengths `counts`.
fn ranges(counts: &[usize]) -> impl Iterator<Item = Range<usize>> + '_ {
    counts.iter().scan(0usize, |at, &c| {
        let r = *at..*at + c;
        *at += c;
        Some(r)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::ThreadGroup;
    use crate::generate::{generate_sbm, SbmOptions};

    fn dataset() -> Dataset {
        generate_sbm(&SbmOptions {
            num_vertices: 300,
            num_edges: 2000,
            num_classes: 3,
            feature_dim: 5,
            ..SbmOptions::default()
        })
        .unwrap()
    }

    /// `ds` with every row outside `keep` replaced by NaN: a rank that reads a
    /// row it does not own would carry NaN into its output.
    fn poisoned(ds: &Dataset, keep: Range<usize>) -> Dataset {
        let mut ds = ds.clone();
        let dim = ds.features.dim();
        let mut vals = ds.features.as_slice().to_vec();
        for (v, row) in vals.chunks_mut(dim).enumerate() {
            if !keep.contains(&v) {
                row.fill(f32::NAN);
            }
        }
        ds.features = cpu_ops::FeatureMatrix::new(vals.into(), ds.num_vertices(), dim).unwrap();
        ds
    }

    #[test]
    fn every_rank_gets_the_rows_it_asks_for_without_reading_foreign_rows() {
        let ds = dataset();
        for cache_rows in [0usize, 40] {
            let ranks = ThreadGroup::new(3).unwrap();
            let ds = &ds;
            let out: Vec<(Vec<f32>, Vec<u32>, DistStats)> = std::thread::scope(|s| {
                let hs: Vec<_> = ranks
                    .into_iter()
                    .map(|c| {
                        s.spawn(move || {
                            let r = c.rank();
                            let local = poisoned(ds, share(300, r, 3));
                            let pf =
                                PartitionedFeatures::new(&local, Arc::new(c), cache_rows, None)
                                    .unwrap();
                            assert_eq!(pf.cached_rows(), cache_rows);
                            // Rank r asks for a different mix each round, some
                            // rounds nothing at all.
                            let mut all = Vec::new();
                            let mut ids_all = Vec::new();
                            for round in 0..4u32 {
                                let ids: Vec<u32> = if round == r as u32 {
                                    Vec::new()
                                } else {
                                    (0..300u32)
                                        .filter(|v| (v * 7 + round + r as u32).is_multiple_of(5))
                                        .collect()
                                };
                                let mut buf = Vec::new();
                                pf.gather(&local, &ids, &mut buf).unwrap();
                                all.extend(buf);
                                ids_all.extend(ids);
                            }
                            (all, ids_all, pf.stats())
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (rows, ids, stats) in &out {
                let expect = cpu_ops::gather_rows_into_vec(&ds.features, ids).unwrap();
                assert_eq!(rows, &expect, "cache {cache_rows}");
                assert_eq!(stats.exchanges, 4);
                assert!(stats.remote_rows > 0);
                if cache_rows == 0 {
                    assert_eq!(stats.remote_cache_hits, 0);
                } else {
                    assert!(stats.remote_cache_hits > 0);
                }
            }
        }
    }

    #[test]
    fn one_rank_owns_everything_and_exchanges_nothing() {
        let ds = dataset();
        let pf = PartitionedFeatures::new(&ds, Arc::new(crate::dist::Solo), 10, None).unwrap();
        assert_eq!(pf.own(), 0..300);
        assert_eq!(pf.cached_rows(), 0);
        let mut buf = Vec::new();
        let bytes = pf.gather(&ds, &[3, 1, 299], &mut buf).unwrap();
        assert_eq!(bytes, 0);
        assert_eq!(
            buf,
            cpu_ops::gather_rows_into_vec(&ds.features, &[3, 1, 299]).unwrap()
        );
        let err = pf.gather(&ds, &[300], &mut buf).unwrap_err().to_string();
        assert!(err.contains("vertex 300 is out of range"), "{err}");
    }
}
