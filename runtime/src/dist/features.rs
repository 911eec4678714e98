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

use cpu_ops::SparseRows;
use parking_lot::Mutex;

use super::{owner, ranks_agree, share, Communicator, DistStats};
use crate::data::dataset::Dataset;
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
    /// The same rows as sparse rows, when the trainer reads sparse features
    /// (then the exchange moves sparse rows and `cache` is empty).
    sparse_cache: Option<SparseRows<f32>>,
    /// Dense rows travel as bfloat16 bits, two to a `u32` word.
    bf16: bool,
    stats: Mutex<DistStats>,
}

/// Where [`PartitionedFeatures`] writes fetched rows: f32 values, or bfloat16
/// bits (a device that stores bfloat16 rows uploads them as they are).
enum RowsOut<'a> {
    F32(&'a mut Vec<f32>),
    Bf16(&'a mut Vec<u16>),
}

impl RowsOut<'_> {
    fn resize(&mut self, n: usize) {
        match self {
            Self::F32(v) => v.resize(n, 0.0),
            Self::Bf16(v) => v.resize(n, 0),
        }
    }

    /// Row `i` (of `row.len()` values) from f32 values (rounded for bfloat16).
    fn put(&mut self, i: usize, row: &[f32]) {
        let d = row.len();
        match self {
            Self::F32(v) => v[i * d..(i + 1) * d].copy_from_slice(row),
            Self::Bf16(v) => {
                for (o, &x) in v[i * d..(i + 1) * d].iter_mut().zip(row) {
                    *o = gpu_ops::f32_to_bf16_bits(x);
                }
            }
        }
    }

    /// Row `i` from bfloat16 bits (widened exactly for f32).
    fn put_bits(&mut self, i: usize, row: &[u16]) {
        let d = row.len();
        match self {
            Self::F32(v) => {
                for (o, &b) in v[i * d..(i + 1) * d].iter_mut().zip(row) {
                    *o = gpu_ops::bf16_bits_to_f32(b);
                }
            }
            Self::Bf16(v) => v[i * d..(i + 1) * d].copy_from_slice(row),
        }
    }
}

/// Whether `rank` owns row `v`: by the partition map `parts` when there is one
/// (a vertex past its end is nobody's), else by its contiguous range `own`.
pub(crate) fn owned_by(parts: Option<&[u32]>, own: &Range<usize>, rank: usize, v: usize) -> bool {
    match parts {
        Some(p) => p.get(v).is_some_and(|&r| r as usize == rank),
        None => own.contains(&v),
    }
}

/// Row `i` of `m`: its column ids and values.
fn sparse_row(m: &SparseRows<f32>, i: usize) -> (&[u32], &[f32]) {
    let p = m.indptr();
    let (a, b) = (p[i] as usize, p[i + 1] as usize);
    (&m.col_ids()[a..b], &m.values()[a..b])
}

impl PartitionedFeatures {
    /// Collective: every rank builds its view at the same time, and the remote
    /// cache (`cache_rows` rows of the highest-degree vertices this rank does not
    /// own) is filled with one exchange. `parts` (a partition file's map, one
    /// rank per vertex) replaces the contiguous ranges; the ranks check that
    /// they hold the same map. With `sparse` (the trainer's sparse rows of the
    /// features, of which this rank reads only its own), rows travel and are
    /// cached as sparse rows ([`PartitionedFeatures::gather_sparse`]). With
    /// `bf16` (a device engine storing bfloat16 rows, which rounds every row it
    /// uploads), dense rows travel as bfloat16: half the bytes, and the same
    /// values once uploaded.
    pub(crate) fn new(
        ds: &Dataset,
        comm: Arc<dyn Communicator>,
        cache_rows: usize,
        parts: Option<Vec<u32>>,
        sparse: Option<&SparseRows<f32>>,
        bf16: bool,
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
            sparse_cache: None,
            bf16,
            stats: Mutex::new(DistStats::default()),
        };
        let cached: Vec<u32> = if cache_rows == 0 {
            Vec::new()
        } else {
            ds.degree_order()
                .into_iter()
                .filter(|&v| !me.owns(v as usize))
                .take(cache_rows)
                .collect()
        };
        // Every rank runs the fill exchange, even with nothing to cache.
        let mut rows = Vec::new();
        match sparse {
            Some(local) => me.sparse_cache = Some(me.fetch_sparse(local, &cached, false)?.0),
            None => {
                me.fetch(ds, &cached, RowsOut::F32(&mut rows), false)?;
            }
        }
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

    /// An error for a vertex id beyond the dataset.
    fn check_id(&self, v: u32) -> Result<()> {
        if v as usize >= self.n {
            return Err(Error::invalid_argument(
                "feature ids",
                format!(
                    "vertex {v} is out of range: the dataset has {} vertices",
                    self.n
                ),
            ));
        }
        Ok(())
    }

    /// An error unless this rank owns row `v`, which rank `from` asked for.
    fn check_asked(&self, from: usize, v: u32) -> Result<()> {
        if v as usize >= self.n || !self.owns(v as usize) {
            let rank = self.comm.rank();
            return Err(Error::Dist {
                what: format!(
                    "rank {from} asked rank {rank} for feature row {v}, which rank {rank} \
                     does not own"
                ),
            });
        }
        Ok(())
    }

    /// Adds one exchange (started at `t`) to the statistics.
    fn record(&self, t: Instant, bytes: u64, remote: u64, hits: u64) {
        let mut s = self.stats.lock();
        s.exchanges += 1;
        s.exchange_bytes += bytes;
        s.exchange_secs += t.elapsed().as_secs_f64();
        s.remote_rows += remote;
        s.remote_cache_hits += hits;
    }

    /// Whether this rank owns row `v` (`v < n`).
    fn owns(&self, v: usize) -> bool {
        owned_by(self.parts.as_deref(), &self.own, self.comm.rank(), v)
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
        match &self.sparse_cache {
            Some(m) => m.num_rows(),
            None => self.cache.len() / self.dim.max(1),
        }
    }

    /// What the exchanges moved so far.
    pub(crate) fn stats(&self) -> DistStats {
        *self.stats.lock()
    }

    /// Collective: writes the rows of `ids` (distinct vertices) into `out`
    /// (`ids.len() × dim`, resized), reading own rows from `ds`, cached rows from
    /// the cache and the rest from their owners. Returns the bytes exchanged.
    pub(crate) fn gather(&self, ds: &Dataset, ids: &[u32], out: &mut Vec<f32>) -> Result<u64> {
        self.fetch(ds, ids, RowsOut::F32(out), true)
    }

    /// Collective: [`PartitionedFeatures::gather`] as bfloat16 bits (own and
    /// cached rows rounded here; rows that travelled as bfloat16 copied as they
    /// came, never widened).
    pub(crate) fn gather_bf16(&self, ds: &Dataset, ids: &[u32], out: &mut Vec<u16>) -> Result<u64> {
        self.fetch(ds, ids, RowsOut::Bf16(out), true)
    }

    /// Collective: [`PartitionedFeatures::gather`] for sparse rows: own rows
    /// from `local`, cached rows from the sparse cache, the rest from their
    /// owners in one exchange of requests, then one of each row's column ids
    /// (after its length) and one of its values. Returns the rows of `ids` in
    /// order and the bytes exchanged.
    pub(crate) fn gather_sparse(
        &self,
        local: &SparseRows<f32>,
        ids: &[u32],
    ) -> Result<(SparseRows<f32>, u64)> {
        if self.sparse_cache.is_none() {
            return Err(Error::Dist {
                what: "internal: sparse rows asked of dense partitioned features".into(),
            });
        }
        self.fetch_sparse(local, ids, true)
    }

    fn fetch_sparse(
        &self,
        local: &SparseRows<f32>,
        ids: &[u32],
        use_cache: bool,
    ) -> Result<(SparseRows<f32>, u64)> {
        /// Where row `i` of the result comes from.
        enum From {
            Own(usize),
            Cache(usize),
            /// (owner, position among the rows asked of it)
            Remote(usize, usize),
        }
        let t = Instant::now();
        let (ranks, rank) = (self.comm.size(), self.comm.rank());
        let mut wanted: Vec<Vec<u32>> = vec![Vec::new(); ranks];
        let mut from = Vec::with_capacity(ids.len());
        let (mut remote, mut hits) = (0u64, 0u64);
        for &v in ids {
            let vu = v as usize;
            self.check_id(v)?;
            if self.owns(vu) {
                from.push(From::Own(vu));
                continue;
            }
            remote += 1;
            match (self.slot.get(vu), &self.sparse_cache) {
                (Some(&s), Some(_)) if use_cache && s != u32::MAX => {
                    hits += 1;
                    from.push(From::Cache(s as usize));
                }
                _ => {
                    let o = self.owner_of(vu);
                    from.push(From::Remote(o, wanted[o].len()));
                    wanted[o].push(v);
                }
            }
        }
        let counts: Vec<usize> = wanted.iter().map(Vec::len).collect();
        let requests: Vec<u32> = wanted.iter().flatten().copied().collect();
        let (asked, asked_counts) = self.comm.all_to_all_u32(&requests, &counts)?;
        // The reply to each rank: per row its length then its column ids; and
        // its values.
        let (mut meta, mut vals) = (Vec::new(), Vec::new());
        let (mut meta_counts, mut val_counts) = (vec![0usize; ranks], vec![0usize; ranks]);
        for (to, range) in ranges(&asked_counts).enumerate() {
            for &v in &asked[range] {
                self.check_asked(to, v)?;
                let (c, x) = sparse_row(local, v as usize);
                meta.push(c.len() as u32);
                meta.extend_from_slice(c);
                vals.extend_from_slice(x);
                meta_counts[to] += 1 + c.len();
                val_counts[to] += c.len();
            }
        }
        let (got_meta, got_meta_counts) = self.comm.all_to_all_u32(&meta, &meta_counts)?;
        let (got_vals, got_val_counts) = self.comm.all_to_all_f32(&vals, &val_counts)?;
        // Each received row as (start of its column ids in got_meta, start of
        // its values in got_vals, length), by owner.
        let bad = |src: usize, what: &str| Error::Dist {
            what: format!("rank {src} sent rank {rank} malformed sparse rows: {what}"),
        };
        let mut received: Vec<Vec<(usize, usize, usize)>> = Vec::with_capacity(ranks);
        for (src, (mr, vr)) in ranges(&got_meta_counts)
            .zip(ranges(&got_val_counts))
            .enumerate()
        {
            let (mut at, mut val_at) = (mr.start, vr.start);
            let mut rows = Vec::with_capacity(wanted[src].len());
            while at < mr.end {
                let len = got_meta[at] as usize;
                if at + 1 + len > mr.end || val_at + len > vr.end {
                    return Err(bad(src, "a row runs past the message"));
                }
                rows.push((at + 1, val_at, len));
                at += 1 + len;
                val_at += len;
            }
            if rows.len() != wanted[src].len() || val_at != vr.end {
                return Err(bad(
                    src,
                    &format!("{} rows for {} asked", rows.len(), wanted[src].len()),
                ));
            }
            received.push(rows);
        }
        let mut indptr = Vec::with_capacity(ids.len() + 1);
        indptr.push(0u64);
        let (mut cols, mut values) = (Vec::new(), Vec::new());
        for f in &from {
            let (c, x): (&[u32], &[f32]) = match *f {
                From::Own(v) => sparse_row(local, v),
                From::Cache(s) => match &self.sparse_cache {
                    Some(cache) => sparse_row(cache, s),
                    None => (&[], &[]),
                },
                From::Remote(o, k) => {
                    let (c0, v0, len) = received[o][k];
                    (&got_meta[c0..c0 + len], &got_vals[v0..v0 + len])
                }
            };
            cols.extend_from_slice(c);
            values.extend_from_slice(x);
            indptr.push(cols.len() as u64);
        }
        let rows = SparseRows::from_parts(indptr, cols, values, self.dim)
            .map_err(|e| Error::cpu_ops("exchanged sparse rows", e))?;
        let bytes = (requests.len() + asked.len() + meta.len() + got_meta.len()) as u64 * 4
            + (vals.len() + got_vals.len()) as u64 * 4;
        self.record(t, bytes, remote, hits);
        Ok((rows, bytes))
    }

    fn fetch(
        &self,
        ds: &Dataset,
        ids: &[u32],
        mut out: RowsOut<'_>,
        use_cache: bool,
    ) -> Result<u64> {
        let t = Instant::now();
        let (dim, ranks, rank) = (self.dim, self.comm.size(), self.comm.rank());
        out.resize(ids.len() * dim);
        // Requests grouped by owner: (position in `ids`, vertex).
        let mut wanted: Vec<Vec<(usize, u32)>> = vec![Vec::new(); ranks];
        let (mut remote, mut hits) = (0u64, 0u64);
        for (i, &v) in ids.iter().enumerate() {
            let vu = v as usize;
            self.check_id(v)?;
            if self.owns(vu) {
                out.put(i, ds.features.row(vu));
                continue;
            }
            remote += 1;
            match self.slot.get(vu) {
                Some(&s) if use_cache && s != u32::MAX => {
                    hits += 1;
                    let s = s as usize;
                    out.put(i, &self.cache[s * dim..(s + 1) * dim]);
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
                self.check_asked(from, v)?;
                rows.extend_from_slice(ds.features.row(v as usize));
            }
        }
        let row_counts: Vec<usize> = asked_counts.iter().map(|c| c * dim).collect();
        // The rows received from each owner, in request order.
        let at = |k: usize| k * dim..(k + 1) * dim;
        let positions = wanted.iter().flatten().map(|&(i, _)| i);
        let (sent_words, got_words) = if self.bf16 {
            let (words, word_counts) = pack_bf16(&rows, &row_counts);
            let (w, wc) = self.comm.all_to_all_u32(&words, &word_counts)?;
            let want: Vec<usize> = wanted.iter().map(|w| w.len() * dim).collect();
            let got = unpack_bf16(&w, &wc, &want).map_err(|src| Error::Dist {
                what: format!(
                    "rank {src} sent rank {rank} {} bfloat16 words for {} rows of {dim}",
                    wc[src],
                    wanted[src].len()
                ),
            })?;
            for (k, i) in positions.enumerate() {
                out.put_bits(i, &got[at(k)]);
            }
            (words.len(), w.len())
        } else {
            let (got, counts) = self.comm.all_to_all_f32(&rows, &row_counts)?;
            for (src, (want, count)) in wanted.iter().zip(&counts).enumerate() {
                if *count != want.len() * dim {
                    return Err(Error::Dist {
                        what: format!(
                            "rank {src} sent rank {rank} {count} feature values for {} rows \
                             of {dim}",
                            want.len()
                        ),
                    });
                }
            }
            for (k, i) in positions.enumerate() {
                out.put(i, &got[at(k)]);
            }
            (rows.len(), got.len())
        };
        let bytes = (requests.len() + asked.len()) as u64 * 4 + (sent_words + got_words) as u64 * 4;
        self.record(t, bytes, remote, hits);
        Ok(bytes)
    }
}

/// `values` (segments of `counts` values, one per rank) as bfloat16 bits, two
/// to a `u32` word (the earlier value in the low half); an odd segment ends with
/// a zero half. Returns the words and each segment's word count.
fn pack_bf16(values: &[f32], counts: &[usize]) -> (Vec<u32>, Vec<usize>) {
    let mut words = Vec::with_capacity(values.len() / 2 + counts.len());
    let mut word_counts = Vec::with_capacity(counts.len());
    for r in ranges(counts) {
        let seg = &values[r];
        for pair in seg.chunks(2) {
            let lo = u32::from(gpu_ops::f32_to_bf16_bits(pair[0]));
            let hi = pair
                .get(1)
                .map_or(0, |&x| u32::from(gpu_ops::f32_to_bf16_bits(x)));
            words.push(lo | hi << 16);
        }
        word_counts.push(seg.len().div_ceil(2));
    }
    (words, word_counts)
}

/// The inverse of [`pack_bf16`]: segments of `want[r]` bfloat16 values from
/// `words` (segments of `counts[r]` words). `Err(r)`: rank `r`'s segment has
/// the wrong length.
fn unpack_bf16(
    words: &[u32],
    counts: &[usize],
    want: &[usize],
) -> std::result::Result<Vec<u16>, usize> {
    let mut out = Vec::with_capacity(want.iter().sum());
    for (src, (r, &n)) in ranges(counts).zip(want).enumerate() {
        if r.len() != n.div_ceil(2) {
            return Err(src);
        }
        let start = out.len();
        for &w in &words[r] {
            out.push(w as u16);
            out.push((w >> 16) as u16);
        }
        out.truncate(start + n);
    }
    Ok(out)
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
    use crate::data::generate::{generate_sbm, SbmOptions};
    use crate::dist::ThreadGroup;

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
        // A third of the values zero, so that sparse rows differ in length.
        let mut ds = dataset();
        let mut x = ds.features.as_slice().to_vec();
        for (i, v) in x.iter_mut().enumerate() {
            if i % 3 == 0 {
                *v = 0.0;
            }
        }
        ds.features = cpu_ops::FeatureMatrix::new(x.into(), 300, 5).unwrap();
        for (cache_rows, sparse, bf16) in [
            (0usize, false, false),
            (40, false, false),
            (0, true, false),
            (40, true, false),
            (0, false, true),
            (40, false, true),
        ] {
            let ranks = ThreadGroup::new(3).unwrap();
            let ds = &ds;
            let out: Vec<(Vec<f32>, Vec<u32>, DistStats)> = std::thread::scope(|s| {
                let hs: Vec<_> = ranks
                    .into_iter()
                    .map(|c| {
                        s.spawn(move || {
                            let r = c.rank();
                            let local = poisoned(ds, share(300, r, 3));
                            let rows = sparse.then(|| {
                                SparseRows::from_dense(local.features.as_slice(), 300, 5).unwrap()
                            });
                            let pf = PartitionedFeatures::new(
                                &local,
                                Arc::new(c),
                                cache_rows,
                                None,
                                rows.as_ref(),
                                bf16,
                            )
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
                                match &rows {
                                    Some(m) => {
                                        let (got, bytes) = pf.gather_sparse(m, &ids).unwrap();
                                        assert!(bytes > 0 || ids.is_empty() || round == 0);
                                        buf = got.to_dense();
                                    }
                                    None => {
                                        pf.gather(&local, &ids, &mut buf).unwrap();
                                        // The same rows as bfloat16 bits: every
                                        // row rounded once, remote ones that
                                        // travelled as bfloat16 passed on.
                                        let mut bits = vec![7u16; 3];
                                        pf.gather_bf16(&local, &ids, &mut bits).unwrap();
                                        let want: Vec<u16> = buf
                                            .iter()
                                            .map(|&x| gpu_ops::f32_to_bf16_bits(x))
                                            .collect();
                                        assert_eq!(bits, want, "bf16 {bf16}");
                                    }
                                }
                                all.extend(buf);
                                ids_all.extend(ids);
                            }
                            (all, ids_all, pf.stats())
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (r, (rows, ids, stats)) in out.iter().enumerate() {
                let mut expect = cpu_ops::gather_rows_into_vec(&ds.features, ids).unwrap();
                if bf16 {
                    // Rows from other ranks arrive as bfloat16 (width 5: every
                    // other row ends in half a word).
                    for (k, &v) in ids.iter().enumerate() {
                        if !share(300, r, 3).contains(&(v as usize)) {
                            for x in &mut expect[k * 5..(k + 1) * 5] {
                                *x = gpu_ops::round_to_bf16(*x);
                            }
                        }
                    }
                }
                assert_eq!(
                    rows, &expect,
                    "cache {cache_rows}, sparse {sparse}, bf16 {bf16}"
                );
                // Dense rows are fetched twice a round (f32 and bfloat16).
                assert_eq!(stats.exchanges, if sparse { 4 } else { 8 });
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
        let pf = PartitionedFeatures::new(&ds, Arc::new(crate::dist::Solo), 10, None, None, false)
            .unwrap();
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
