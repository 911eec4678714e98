//! A batch's input rows as the model reads them: dense rows, gathered through
//! the device feature cache or uploaded from the host, or sparse rows (CSR) when
//! the features are sparse (`train.sparse_features`): layer 0 then multiplies
//! only the non-zeros ([`gpu_ops::SparseOps`]; WordNet's 1%-dense bag of words
//! trains about 10× faster so).
//!
//! # Sparse rows
//! 1. **Whether.** `train.sparse_features = "on"`, or `"auto"` with a density at
//!    most `train.sparse_threshold` (estimated on up to 4,096 evenly spaced
//!    rows), on a backend whose `supports_sparse()` is true (the host backend;
//!    CUDA loads dense rows, and the note says so).
//! 2. **The store.** The whole feature matrix as CSR, built on first use (a rank
//!    with partitioned features never builds it: its rows come from the
//!    exchange). On the host backend the device store shares the host copy.
//! 3. **A batch.** Device ids → `sparse_gather` from the store; host ids (a host
//!    gather placement) → the host copy's rows, uploaded; a row source (the
//!    feature exchange) → its sparse rows, uploaded. Uploads count their CSR
//!    bytes (8 per non-zero, 8 per row) host → device.
//! 4. **Full-graph inference** reads the store itself: its rows are the graph's
//!    vertices in order.

use std::sync::Arc;

use cpu_ops::{FeatureMatrix, SparseRows};
use gpu_ops::{Backend, LayerInput};

use super::{dev_err, take_at_least, DeviceEngine};
use crate::error::{Error, Result};

/// A batch's input rows on the device.
pub(crate) enum Input<B: Backend> {
    /// Row-major values.
    Dense(B::Buf<f32>),
    /// Sparse rows.
    Sparse(B::Sparse),
}

impl<B: Backend> Input<B> {
    /// The rows as the model takes them.
    pub fn layer(&self) -> LayerInput<'_, B> {
        match self {
            Self::Dense(x) => LayerInput::Dense(x),
            Self::Sparse(x) => LayerInput::Sparse(x),
        }
    }
}

/// Step 2: the whole feature matrix as sparse rows, on the host and the device.
pub(crate) struct SparseStore<B: Backend> {
    /// The host copy (host gathers read it).
    pub host: Arc<SparseRows<f32>>,
    /// The device store (batches are gathered from it).
    pub dev: B::Sparse,
}

/// Fraction of non-zero values of `f`, estimated on up to 4,096 evenly spaced
/// rows (step 1).
pub(crate) fn density(f: &FeatureMatrix) -> f64 {
    let n = f.num_rows();
    if n == 0 || f.dim() == 0 {
        return 1.0;
    }
    let step = n.div_ceil(4096);
    let (mut nz, mut total) = (0usize, 0usize);
    for r in (0..n).step_by(step) {
        let row = f.row(r);
        nz += row.iter().filter(|&&v| v != 0.0).count();
        total += row.len();
    }
    nz as f64 / total as f64
}

/// The non-zeros of `f`'s rows for which `keep` holds (the others empty): a
/// rank's own rows of partitioned features, read row by row.
pub(crate) fn sparse_rows_where(
    f: &FeatureMatrix,
    keep: impl Fn(usize) -> bool,
) -> Result<SparseRows<f32>> {
    let (n, dim) = (f.num_rows(), f.dim());
    let mut indptr = Vec::with_capacity(n + 1);
    let (mut cols, mut vals) = (Vec::new(), Vec::new());
    indptr.push(0u64);
    for v in 0..n {
        if keep(v) {
            for (c, &x) in f.row(v).iter().enumerate() {
                if x != 0.0 {
                    cols.push(c as u32);
                    vals.push(x);
                }
            }
        }
        indptr.push(cols.len() as u64);
    }
    SparseRows::from_parts(indptr, cols, vals, dim)
        .map_err(|e| Error::cpu_ops("sparse features", e))
}

/// Bytes of sparse rows as uploaded: column id and value per non-zero, one
/// offset per row.
pub(crate) fn sparse_bytes(r: &SparseRows<f32>) -> u64 {
    (r.nnz() * 8 + (r.num_rows() + 1) * 8) as u64
}

impl<B: Backend> DeviceEngine<B> {
    /// Step 2: the sparse store, built on first use.
    pub(super) fn sparse_store(&mut self) -> Result<&SparseStore<B>> {
        if self.sparse.is_none() {
            let f = &self.ds.features;
            let host = Arc::new(sparse_rows_where(f, |_| true)?);
            let dev = self
                .dev
                .sparse_from_host(Arc::clone(&host))
                .map_err(dev_err("loading sparse features"))?;
            self.sparse = Some(SparseStore { host, dev });
        }
        self.sparse
            .as_ref()
            .ok_or_else(|| Error::invalid_argument("sparse features", "internal: not loaded"))
    }

    /// Step 3: the input rows of `ids` (device ids, `n` of them): sparse or
    /// dense, from the device store or, with a row source, from the host.
    pub(crate) fn gather_input(&mut self, ids: &B::Buf<u32>, n: usize) -> Result<Input<B>> {
        if !self.opts.sparse {
            return Ok(Input::Dense(self.gather(ids, n)?));
        }
        if self.rows.is_some() {
            let host_ids = self
                .dev
                .to_host(ids, n)
                .map_err(dev_err("downloading input ids"))?;
            return self.host_input(&host_ids).map(|(x, _)| x);
        }
        let dev = Arc::clone(&self.dev);
        let store = self.sparse_store()?;
        let x = dev
            .sparse_gather(&store.dev, ids, n)
            .map_err(dev_err("gathering sparse rows"))?;
        Ok(Input::Sparse(x))
    }

    /// Step 3 on the host: the rows of `ids` (host ids) gathered on the host —
    /// from the row source when there is one — and uploaded. Returns the rows
    /// and the host bytes gathered (an `exchange` slice records what crossed
    /// between ranks).
    pub(crate) fn host_input(&mut self, ids: &[u32]) -> Result<(Input<B>, u64)> {
        if !self.opts.sparse {
            let values = self.gather_on_host(ids)?;
            return Ok((
                Input::Dense(self.upload_gathered(values)?),
                (values * 4) as u64,
            ));
        }
        let source = self.rows.clone();
        let rows = match source {
            Some(src) => {
                let mut x = self.tracer.slice("exchange");
                match src.gather_sparse(ids)? {
                    Some((rows, bytes)) => {
                        x.set_bytes(bytes);
                        rows
                    }
                    None => {
                        // A source without sparse rows: dense rows, then sparse.
                        let mut dense = Vec::new();
                        x.set_bytes(src.gather(ids, &mut dense)?);
                        let dim = self.ds.features.dim();
                        SparseRows::from_dense(&dense, ids.len(), dim)
                            .map_err(|e| Error::cpu_ops("sparse input rows", e))?
                    }
                }
            }
            None => self
                .sparse_store()?
                .host
                .gather(ids)
                .map_err(|e| Error::cpu_ops("sparse gather", e))?,
        };
        let bytes = sparse_bytes(&rows);
        let x = self
            .dev
            .sparse_from_host(Arc::new(rows))
            .map_err(dev_err("uploading sparse rows"))?;
        self.h2d += bytes;
        Ok((Input::Sparse(x), bytes))
    }

    /// [`DeviceEngine::gather`] of a training batch, whose feature-cache misses'
    /// rows [`DeviceEngine::settle_gather_misses`] adds to the host → device
    /// counter after the step. The counts are not read here: on CUDA they reach
    /// `cache_stats` at the next synchronization (the loss read), so reading them
    /// now would cost one more per batch.
    pub(crate) fn gather_counted(&mut self, ids: &B::Buf<u32>, n: usize) -> Result<Input<B>> {
        // Current: the last batch (or evaluation) ended with a synchronization.
        self.misses_before = Some(super::ModelState::cache_stats(self).misses);
        self.gather_input(ids, n)
    }

    /// Adds the rows the batch's gather read from host memory (cache misses
    /// since [`DeviceEngine::gather_counted`]) to the host → device counter.
    /// Call after the step's synchronization.
    pub(crate) fn settle_gather_misses(&mut self) {
        if let Some(before) = self.misses_before.take() {
            let misses = super::ModelState::cache_stats(self)
                .misses
                .saturating_sub(before);
            self.h2d += misses * self.ds.features.dim() as u64 * 4;
        }
    }

    /// Gathers the rows of `ids` on the host into the reused host buffer that
    /// [`DeviceEngine::upload_gathered`] reads: bfloat16 bits (`host_bits`)
    /// when the device takes bfloat16 rows (`device.feature_dtype = "bf16"`),
    /// else f32 values (`host_rows`). Rows come from the row source when there
    /// is one (an `exchange` slice with its bytes; bfloat16 rows that travelled
    /// as bfloat16 are never widened on the host), else from the dataset.
    /// Returns the number of values.
    pub(crate) fn gather_on_host(&mut self, ids: &[u32]) -> Result<usize> {
        let bf16 = self.opts.feature_dtype == gpu_ops::FeatureDtype::Bf16;
        let features = &self.ds.features;
        match &self.rows {
            Some(src) => {
                let mut x = self.tracer.slice("exchange");
                let bytes = if bf16 {
                    src.gather_bf16(ids, &mut self.host_bits)?
                } else {
                    src.gather(ids, &mut self.host_rows)?
                };
                x.set_bytes(bytes);
            }
            None => {
                self.host_rows.resize(ids.len() * features.dim(), 0.0);
                cpu_ops::gather_rows(features, ids, &mut self.host_rows)
                    .map_err(|e| Error::cpu_ops("gather", e))?;
                if bf16 {
                    self.host_bits.clear();
                    self.host_bits
                        .extend(self.host_rows.iter().map(|&v| gpu_ops::f32_to_bf16_bits(v)));
                }
            }
        }
        Ok(ids.len() * features.dim())
    }

    /// Uploads the `need` values [`DeviceEngine::gather_on_host`] left into the
    /// reused input buffer. Bfloat16 rows travel as bfloat16 (half the bytes,
    /// rounded as the device's bfloat16 store rounds, so every placement trains
    /// on the same values) and are widened on the device.
    pub(crate) fn upload_gathered(&mut self, need: usize) -> Result<B::Buf<f32>> {
        let mut x = take_at_least(&*self.dev, &mut self.x, need, "input buffer")?;
        if self.opts.feature_dtype == gpu_ops::FeatureDtype::Bf16 {
            let host = self.host_bits.get(..need).ok_or_else(|| {
                Error::invalid_argument("gathered rows", "internal: fewer than needed")
            })?;
            let mut bits =
                take_at_least(&*self.dev, &mut self.bits, need, "bfloat16 input buffer")?;
            let up = self
                .dev
                .upload(self.dev.stream(), host, &mut bits)
                .and_then(|()| self.dev.widen_bf16(&bits, need, &mut x))
                .map_err(dev_err("uploading gathered rows as bfloat16"));
            self.bits = Some(bits);
            up?;
            self.h2d += (need * 2) as u64;
        } else {
            let host = self.host_rows.get(..need).ok_or_else(|| {
                Error::invalid_argument("gathered rows", "internal: fewer than needed")
            })?;
            self.dev
                .upload(self.dev.stream(), host, &mut x)
                .map_err(dev_err("uploading gathered rows"))?;
            self.h2d += (need * 4) as u64;
        }
        Ok(x)
    }

    /// Keeps a dense input buffer for the next gather.
    pub(crate) fn recycle(&mut self, x: Input<B>) {
        if let Input::Dense(x) = x {
            self.x = Some(x);
        }
    }

    /// The input rows of every vertex, in vertex order (step 4 for sparse
    /// rows; the device gather of all ids for dense ones).
    pub(super) fn all_inputs(&mut self) -> Result<Input<B>> {
        let n = self.num_vertices;
        if self.opts.sparse && self.rows.is_none() {
            let dev = Arc::clone(&self.dev);
            let store = self.sparse_store()?;
            let all = Arc::clone(&store.host);
            return Ok(Input::Sparse(
                dev.sparse_from_host(all)
                    .map_err(dev_err("sparse features"))?,
            ));
        }
        let all: Vec<u32> = (0..n as u32).collect();
        let ids = self.dev.to_device(&all).map_err(dev_err("vertex ids"))?;
        self.gather_input(&ids, n)
    }

    /// The rows of `ids` (host ids) of the feature matrix, each scaled by
    /// `scale` when given: a shard block's layer-0 input (sharded full-graph
    /// evaluation), dense or sparse as training reads them.
    pub(super) fn scaled_rows(&mut self, ids: &[u32], scale: Option<&[f32]>) -> Result<Input<B>> {
        if !self.opts.sparse {
            let dim = self.ds.features.dim();
            let mut x = vec![0.0f32; ids.len() * dim];
            cpu_ops::gather_rows(&self.ds.features, ids, &mut x)
                .map_err(|e| Error::cpu_ops("input rows", e))?;
            if let Some(s) = scale {
                for (row, &c) in x.chunks_mut(dim.max(1)).zip(s) {
                    row.iter_mut().for_each(|v| *v *= c);
                }
            }
            let mut buf = take_at_least(&*self.dev, &mut self.x, x.len(), "input rows")?;
            self.dev
                .upload(self.dev.stream(), &x, &mut buf)
                .map_err(dev_err("uploading input rows"))?;
            return Ok(Input::Dense(buf));
        }
        let mut rows = self
            .sparse_store()?
            .host
            .gather(ids)
            .map_err(|e| Error::cpu_ops("sparse input rows", e))?;
        if let Some(c) = scale {
            let lens = rows.indptr().windows(2).map(|w| (w[1] - w[0]) as usize);
            let vals: Vec<f32> = lens
                .zip(c)
                .flat_map(|(k, &c)| std::iter::repeat_n(c, k))
                .zip(rows.values())
                .map(|(c, &v)| c * v)
                .collect();
            rows = SparseRows::from_parts(
                rows.indptr().to_vec(),
                rows.col_ids().to_vec(),
                vals,
                rows.num_cols(),
            )
            .map_err(|e| Error::cpu_ops("scaled sparse input rows", e))?;
        }
        let x = self
            .dev
            .sparse_from_host(Arc::new(rows))
            .map_err(dev_err("uploading sparse rows"))?;
        Ok(Input::Sparse(x))
    }
}
