//! The `host` backend: every [`Backend`] op on host threads through `cpu_ops`
//! (rayon's current pool, `f32` SIMD at the level [`Simd::detect`] finds).
//!
//! It runs everywhere and is the reference the CUDA backend is tested against
//! (`tests/parity.rs`). Buffers are host vectors ([`HostBuf`], also the pinned
//! type); every op completes before it returns, so streams and events only keep time
//! and every ordering obligation of the contract holds trivially. It is
//! bit-deterministic for a seed, whatever the thread count.
//!
//! Files by op family: [`buffer`](self::buffer) (buffers, streams, events, prefix
//! checks), `memory` (copies, `/proc/meminfo`), `block` (validated blocks with a
//! cached transpose), `sample` (sampling, relabel), `features` (feature cache, gather,
//! row selection), `math` (dense and graph math, loss, Adam), `sparse` (sparse
//! input rows and their products).

mod block;
mod buffer;
mod dense;
mod features;
mod memory;
mod pool;
mod sampling;
mod sparse;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cpu_ops::{AggregateKind, CsrGraph, FeatureMatrix, Simd, SparseRows};

use crate::backend::{
    AdamStep, AdamTensors, Backend, CacheStats, DenseOps, DevMat, DeviceBatch, DeviceCore,
    DeviceKind, DeviceMemory, Elem, FeatureDtype, FeatureStore, GatGradsDev, GatInputsDev,
    GatSaved, GraphOps, LossSlot, LossStats, MemoryInfo, Sampling, SparseOps, SparseShape,
    TopologyPlacement, XentInputs,
};
use crate::error::{GpuOpsError, Result};

pub use block::HostBlock;
pub use buffer::{HostBuf, HostEvent, HostStream};
pub use dense::HostMask;
pub use features::HostFeatures;
pub use sampling::HostGraph;
use sampling::{HostQueued, HostReading};
pub use sparse::HostSparse;

/// The host backend (see the module doc). Cheap to create; holds no threads of its
/// own (ops run on rayon's current pool).
#[derive(Debug)]
pub struct HostBackend {
    simd: Simd,
    /// [`crate::Precision::Tf32`] when set (rounds GEMM inputs).
    tf32: std::sync::atomic::AtomicBool,
    compute: HostStream,
    next_stream: AtomicU64,
    transfers: crate::backend::TransferCounter,
    /// Storage of dropped buffers, reused by later allocations (`host/pool.rs`).
    pool: Arc<pool::HostPool>,
}

impl HostBackend {
    /// A backend using the fastest SIMD level of this CPU.
    pub fn new() -> Self {
        Self::with_simd(Simd::detect())
    }

    /// A backend using a chosen SIMD level (e.g. [`Simd::scalar`] in tests).
    pub fn with_simd(simd: Simd) -> Self {
        Self {
            simd,
            tf32: std::sync::atomic::AtomicBool::new(false),
            compute: HostStream::new(0),
            next_stream: AtomicU64::new(1),
            transfers: crate::backend::TransferCounter::default(),
            pool: Arc::default(),
        }
    }

    /// The SIMD level its kernels run at.
    pub fn simd(&self) -> Simd {
        self.simd
    }
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl DeviceCore for HostBackend {
    type Buf<T: Elem> = HostBuf<T>;
    type Pinned<T: Elem> = HostBuf<T>;
    type Stream = HostStream;
    type Event = HostEvent;
    type Graph = HostGraph;
    type Block = HostBlock;
    type Features = HostFeatures;
    type Mask = HostMask;

    fn kind(&self) -> DeviceKind {
        DeviceKind::Host
    }

    fn set_precision(&self, precision: crate::Precision) -> Result<()> {
        self.tf32.store(
            precision == crate::Precision::Tf32,
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(())
    }

    fn precision(&self) -> crate::Precision {
        if self.tf32.load(std::sync::atomic::Ordering::Relaxed) {
            crate::Precision::Tf32
        } else {
            crate::Precision::Fp32
        }
    }

    fn describe(&self) -> String {
        let mem = match memory::memory_info() {
            Ok(m) => format!("{:.1} GiB memory", m.total as f64 / (1u64 << 30) as f64),
            Err(_) => "memory size unknown".into(),
        };
        format!(
            "host CPU: {} rayon threads, SIMD {}, {mem}",
            rayon::current_num_threads(),
            self.simd.level()
        )
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        memory::memory_info()
    }

    fn transfer_stats(&self) -> crate::backend::TransferStats {
        self.transfers.get()
    }

    fn stream(&self) -> &HostStream {
        &self.compute
    }

    fn new_stream(&self) -> Result<HostStream> {
        Ok(HostStream::new(
            self.next_stream.fetch_add(1, Ordering::Relaxed),
        ))
    }

    fn record_event(&self, _stream: &HostStream) -> Result<HostEvent> {
        Ok(HostEvent::now())
    }

    fn wait_event(&self, _stream: &HostStream, _event: &HostEvent) -> Result<()> {
        // The event's work completed before it was recorded.
        Ok(())
    }

    fn elapsed_ms(&self, start: &HostEvent, end: &HostEvent) -> Result<f32> {
        Ok(end.ms_since(start))
    }

    fn synchronize(&self, _stream: &HostStream) -> Result<()> {
        self.transfers.sync();
        Ok(())
    }

    fn wait_host(&self, _event: &HostEvent) -> Result<()> {
        // The event's work completed before it was recorded.
        self.transfers.event_wait();
        Ok(())
    }
}

impl DeviceMemory for HostBackend {
    fn alloc<T: Elem>(&self, len: usize) -> Result<HostBuf<T>> {
        self.transfers.zero_fill();
        HostBuf::zeroed_in(&self.pool, len)
    }

    /// Unspecified contents (a reused block's old values). With debug
    /// assertions, poisoned with `0xFF` bytes (NaN for `f32`): a read before
    /// the write the contract requires gives NaN (or an out-of-range integer)
    /// in tests.
    fn alloc_uninit<T: Elem>(&self, len: usize) -> Result<HostBuf<T>> {
        HostBuf::uninit_in(&self.pool, len)
    }

    fn len<T: Elem>(&self, buf: &HostBuf<T>) -> usize {
        buf.as_slice().len()
    }

    fn alloc_pinned<T: Elem>(&self, len: usize) -> Result<HostBuf<T>> {
        HostBuf::zeroed(len)
    }

    fn pinned_slice<'a, T: Elem>(&self, p: &'a HostBuf<T>) -> &'a [T] {
        p.as_slice()
    }

    fn pinned_slice_mut<'a, T: Elem>(&self, p: &'a mut HostBuf<T>) -> &'a mut [T] {
        p.as_mut_slice()
    }

    fn upload<T: Elem>(&self, _stream: &HostStream, src: &[T], dst: &mut HostBuf<T>) -> Result<()> {
        memory::upload(src, dst)?;
        self.transfers.upload(std::mem::size_of_val(src));
        Ok(())
    }

    fn upload_pinned<T: Elem>(
        &self,
        _stream: &HostStream,
        src: &HostBuf<T>,
        dst: &mut HostBuf<T>,
    ) -> Result<()> {
        memory::upload(src, dst)?;
        self.transfers.upload(std::mem::size_of_val(src.as_slice()));
        Ok(())
    }

    fn upload_pinned_at<T: Elem>(
        &self,
        _stream: &HostStream,
        src: &HostBuf<T>,
        n: usize,
        dst: &mut HostBuf<T>,
        offset: usize,
    ) -> Result<()> {
        memory::upload_at(src, n, dst, offset)?;
        self.transfers.upload(n * std::mem::size_of::<T>());
        Ok(())
    }

    fn download<T: Elem>(
        &self,
        _stream: &HostStream,
        src: &HostBuf<T>,
        dst: &mut [T],
    ) -> Result<()> {
        memory::download(src, dst)?;
        self.transfers.download(std::mem::size_of_val(dst));
        self.transfers.sync();
        Ok(())
    }

    /// Copied at once (so every ordering obligation holds); counted as a
    /// download without a synchronization, as on CUDA.
    fn download_pinned<T: Elem>(
        &self,
        _stream: &HostStream,
        src: &HostBuf<T>,
        n: usize,
        dst: &mut HostBuf<T>,
    ) -> Result<()> {
        memory::download_pinned(src, n, dst)?;
        self.transfers.download(n * std::mem::size_of::<T>());
        Ok(())
    }

    fn copy<T: Elem>(&self, src: &HostBuf<T>, dst: &mut HostBuf<T>, len: usize) -> Result<()> {
        memory::copy(src, dst, len)
    }

    fn fill_zero<T: Elem>(&self, buf: &mut HostBuf<T>, len: usize) -> Result<()> {
        memory::fill_zero(buf, len)
    }
}

/// Synchronizations are counted as the CUDA backend makes them (`cuda/sample.rs`),
/// so that tests of the sampling protocol hold on both: a batch's sizes reaching
/// the host is one (`sample`, `sample_hop`, `unique_relabel`, each
/// `resolve_queued` call), `sample_queued` none.
impl Sampling for HostBackend {
    /// Sampled at once (nothing runs asynchronously here).
    type Queued = HostQueued;
    /// The batches, already on the host.
    type Reading = HostReading;

    /// The topology stays in host memory whatever `placement` asks: on this backend
    /// both placements are the same memory.
    fn load_graph(&self, graph: &CsrGraph, _placement: TopologyPlacement) -> Result<HostGraph> {
        Ok(HostGraph::new(graph))
    }

    fn sample(
        &self,
        graph: &HostGraph,
        seeds: &[u32],
        fanouts: &[u32],
        seed: u64,
    ) -> Result<DeviceBatch<Self>> {
        let batch = sampling::sample(graph, seeds, fanouts, seed)?;
        // The layer sizes reach the host: the CUDA backend's one read a batch.
        self.transfers.sync();
        Ok(batch)
    }

    fn sample_queued_from(
        &self,
        graph: &HostGraph,
        seeds: &[u32],
        fanouts: &[u32],
        from: usize,
        seed: u64,
    ) -> Result<HostQueued> {
        let batch = if from == 0 {
            sampling::sample(graph, seeds, fanouts, seed)
        } else {
            sampling::sample_from(graph, seeds, fanouts, from, seed)
        }?;
        Ok(HostQueued {
            batch,
            read_ids: true,
        })
    }

    fn sample_hop_queued(
        &self,
        graph: &HostGraph,
        dst: &HostBuf<u32>,
        n_dst: usize,
        fanout: u32,
        layer_seed: u64,
        skip: Option<&HostBuf<u8>>,
    ) -> Result<HostQueued> {
        let (block, src, _) = sampling::sample_hop(graph, dst, n_dst, fanout, layer_seed, skip)?;
        Ok(HostQueued {
            batch: DeviceBatch {
                blocks: vec![block],
                src_ids: vec![src],
                num_seeds: n_dst,
            },
            read_ids: false,
        })
    }

    fn resolve_queued(&self, queued: Vec<HostQueued>) -> Result<Vec<DeviceBatch<Self>>> {
        if !queued.is_empty() {
            // One read of every batch's sizes.
            self.transfers.sync();
        }
        Ok(queued.into_iter().map(|q| q.batch).collect())
    }

    /// Counts the downloads CUDA starts here: every batch's bottom sources
    /// (none for a queued hop).
    fn read_queued(&self, queued: Vec<HostQueued>) -> Result<HostReading> {
        for q in queued.iter().filter(|q| q.read_ids) {
            let n = q
                .batch
                .blocks
                .first()
                .map_or(0, |blk| self.block_shape(blk).0);
            self.transfers.download(n * 4);
        }
        Ok(HostReading(queued))
    }

    fn finish_read(&self, reading: HostReading) -> Result<Vec<(DeviceBatch<Self>, Vec<u32>)>> {
        let batches = reading.0;
        if batches.iter().any(|q| q.read_ids) {
            // The one wait for every batch's sizes and bottom sources.
            self.transfers.sync();
        } else if !batches.is_empty() {
            // Hops only: CUDA waits for the copies' event.
            self.transfers.event_wait();
        }
        batches
            .into_iter()
            .map(|HostQueued { batch: b, read_ids }| {
                let n = b.blocks.first().map_or(0, |blk| self.block_shape(blk).0);
                let ids = match b.src_ids.first() {
                    Some(src) if read_ids => buffer::prefix("bottom sources", src, n)?.to_vec(),
                    _ => Vec::new(),
                };
                Ok((b, ids))
            })
            .collect()
    }

    fn sampling_sibling(&self) -> Result<Option<Self>> {
        let sibling = Self::with_simd(self.simd);
        sibling.set_precision(self.precision())?;
        Ok(Some(sibling))
    }

    fn sample_hop(
        &self,
        graph: &HostGraph,
        dst: &HostBuf<u32>,
        n_dst: usize,
        fanout: u32,
        layer_seed: u64,
        skip: Option<&HostBuf<u8>>,
    ) -> Result<(HostBlock, HostBuf<u32>, usize)> {
        let hop = sampling::sample_hop(graph, dst, n_dst, fanout, layer_seed, skip)?;
        self.transfers.sync();
        Ok(hop)
    }

    fn unique_relabel(
        &self,
        targets: &HostBuf<u32>,
        num_targets: usize,
        candidates: &HostBuf<u32>,
        num_candidates: usize,
    ) -> Result<(HostBuf<u32>, HostBuf<u32>, usize)> {
        let r = sampling::unique_relabel(targets, num_targets, candidates, num_candidates)?;
        self.transfers.sync();
        Ok(r)
    }

    fn block_from_host(
        &self,
        num_src: usize,
        indptr: &[u64],
        indices: &[u32],
    ) -> Result<HostBlock> {
        let b = HostBlock::new(num_src, indptr.to_vec(), indices.to_vec())?;
        self.transfers
            .upload(std::mem::size_of_val(indptr) + std::mem::size_of_val(indices));
        Ok(b)
    }

    fn add_self_loops(&self, block: &HostBlock) -> Result<HostBlock> {
        block.with_self_loops()
    }

    fn block_to_host(&self, block: &HostBlock) -> Result<(Vec<u64>, Vec<u32>)> {
        let out = (block.indptr().to_vec(), block.indices().to_vec());
        self.transfers.download(out.0.len() * 8 + out.1.len() * 4);
        self.transfers.sync();
        Ok(out)
    }

    fn block_shape(&self, block: &HostBlock) -> (usize, usize, usize) {
        (block.num_src(), block.num_dst(), block.num_edges())
    }
}

impl FeatureStore for HostBackend {
    fn load_features(
        &self,
        features: &FeatureMatrix,
        cached: &[u32],
        budget_bytes: usize,
        dtype: FeatureDtype,
    ) -> Result<HostFeatures> {
        HostFeatures::load(features, cached, budget_bytes, dtype)
    }

    fn update_cache(&self, f: &mut HostFeatures, insert: &[u32], evict: &[u32]) -> Result<usize> {
        f.update(insert, evict)
    }

    fn is_cached(&self, f: &HostFeatures, v: u32) -> bool {
        f.policy().is_cached(v)
    }

    fn feature_dim(&self, f: &HostFeatures) -> usize {
        f.policy().dim()
    }

    fn gather(
        &self,
        f: &HostFeatures,
        ids: &HostBuf<u32>,
        n: usize,
        out: &mut HostBuf<f32>,
    ) -> Result<()> {
        f.gather(ids, n, out)
    }

    fn cache_stats(&self, f: &HostFeatures) -> CacheStats {
        f.policy().stats()
    }

    fn reset_cache_stats(&self, f: &HostFeatures) {
        f.policy().reset_stats()
    }

    fn index_select_rows(
        &self,
        src: &HostBuf<f32>,
        dim: usize,
        idx: &HostBuf<u32>,
        n: usize,
        out: &mut HostBuf<f32>,
    ) -> Result<()> {
        features::index_select_rows(src, dim, idx, n, out)
    }

    fn index_put_rows(
        &self,
        src: &HostBuf<f32>,
        dim: usize,
        idx: &HostBuf<u32>,
        n: usize,
        dst: &mut HostBuf<f32>,
    ) -> Result<()> {
        features::index_put_rows(src, dim, idx, n, dst)
    }
}

impl DenseOps for HostBackend {
    fn widen_bf16(&self, src: &HostBuf<u16>, n: usize, out: &mut HostBuf<f32>) -> Result<()> {
        memory::widen_bf16(src, n, out)
    }

    fn widen_bf16_at(
        &self,
        src: &HostBuf<u16>,
        src_at: usize,
        n: usize,
        out: &mut HostBuf<f32>,
        out_at: usize,
    ) -> Result<()> {
        memory::widen_bf16_at(src, src_at, n, out, out_at)
    }

    fn scale(&self, x: &mut HostBuf<f32>, n: usize, alpha: f32) -> Result<()> {
        memory::scale(x, n, alpha)
    }

    fn count_nonfinite(&self, x: &HostBuf<f32>, n: usize, count: &mut HostBuf<u32>) -> Result<()> {
        memory::count_nonfinite(x, n, count)
    }

    fn matmul(
        &self,
        a: DevMat<'_, Self>,
        b: DevMat<'_, Self>,
        c: &mut HostBuf<f32>,
        accumulate: bool,
    ) -> Result<()> {
        let tf32 = self.tf32.load(std::sync::atomic::Ordering::Relaxed);
        dense::matmul(a, b, c, accumulate, tf32)
    }

    fn add_bias(
        &self,
        x: &mut HostBuf<f32>,
        rows: usize,
        cols: usize,
        bias: &HostBuf<f32>,
    ) -> Result<()> {
        dense::add_bias(x, rows, cols, bias)
    }

    fn bias_grad(
        &self,
        dy: &HostBuf<f32>,
        rows: usize,
        cols: usize,
        dbias: &mut HostBuf<f32>,
        accumulate: bool,
    ) -> Result<()> {
        dense::bias_grad(dy, rows, cols, dbias, accumulate)
    }

    fn relu(&self, x: &mut HostBuf<f32>, n: usize) -> Result<()> {
        dense::relu(x, n)
    }

    fn relu_backward(&self, y: &HostBuf<f32>, dy: &mut HostBuf<f32>, n: usize) -> Result<()> {
        dense::relu_backward(y, dy, n)
    }

    fn elu(&self, x: &mut HostBuf<f32>, n: usize, alpha: f32) -> Result<()> {
        dense::elu(x, n, alpha)
    }

    fn elu_backward(
        &self,
        y: &HostBuf<f32>,
        dy: &mut HostBuf<f32>,
        n: usize,
        alpha: f32,
    ) -> Result<()> {
        dense::elu_backward(y, dy, n, alpha)
    }

    fn dropout(&self, x: &mut HostBuf<f32>, n: usize, p: f32, seed: u64) -> Result<HostMask> {
        dense::dropout(x, n, p, seed)
    }

    fn dropout_backward(&self, mask: &HostMask, dy: &mut HostBuf<f32>, n: usize) -> Result<()> {
        dense::dropout_backward(mask, dy, n)
    }

    fn softmax_cross_entropy(
        &self,
        logits: &HostBuf<f32>,
        rows: usize,
        classes: usize,
        labels: &HostBuf<u32>,
        grad: Option<&mut HostBuf<f32>>,
    ) -> Result<LossStats> {
        let stats = dense::softmax_cross_entropy(
            logits,
            rows,
            classes,
            labels,
            grad.map(|g| g.as_mut_slice()),
        )?;
        // The result reaches the host: what a device's synchronization is.
        self.transfers.sync();
        Ok(stats)
    }

    /// Computed at once (the host has nothing to overlap), written to the slot
    /// as the protocol says: no synchronization is counted.
    fn softmax_cross_entropy_deferred(
        &self,
        inp: &XentInputs<'_, Self>,
        grad: &mut HostBuf<f32>,
        dest: LossSlot<'_, Self>,
        guard: &mut HostBuf<u32>,
    ) -> Result<()> {
        let LossSlot { out, slot } = dest;
        let found = out.len();
        let words = out.as_mut_slice().get_mut(2 * slot..2 * slot + 2).ok_or(
            GpuOpsError::SizeMismatch {
                what: "deferred loss slots (2 words per slot)",
                expected: 2 * slot + 2,
                found,
            },
        )?;
        let flag = guard
            .as_mut_slice()
            .first_mut()
            .ok_or(GpuOpsError::SizeMismatch {
                what: "loss guard",
                expected: 1,
                found: 0,
            })?;
        let s = dense::softmax_cross_entropy(
            inp.logits,
            inp.rows,
            inp.classes,
            inp.labels,
            Some(grad.as_mut_slice()),
        )?;
        // The sum as the synchronous path's caller forms it (mean × rows).
        let sum = s.loss * inp.rows as f64;
        words[0] = sum.to_bits();
        words[1] = s.correct as u64;
        if !sum.is_finite() {
            *flag = 1;
        }
        Ok(())
    }

    /// The guard is host memory: read without a synchronization.
    fn adam_step_all(
        &self,
        hp: &AdamStep,
        t: AdamTensors<'_, Self>,
        guard: Option<&HostBuf<u32>>,
    ) -> Result<()> {
        let count = t.count()?;
        if guard.is_some_and(|g| g.as_slice().first().is_some_and(|&w| w != 0)) {
            return Ok(());
        }
        let AdamTensors {
            params,
            grads,
            m,
            v,
            lens,
        } = t;
        for i in 0..count {
            dense::adam_step(hp, &mut params[i], &grads[i], &mut m[i], &mut v[i], lens[i])?;
        }
        Ok(())
    }

    fn adam_step(
        &self,
        hp: &AdamStep,
        param: &mut HostBuf<f32>,
        grad: &HostBuf<f32>,
        m: &mut HostBuf<f32>,
        v: &mut HostBuf<f32>,
        n: usize,
    ) -> Result<()> {
        dense::adam_step(hp, param, grad, m, v, n)
    }
}

impl GraphOps for HostBackend {
    fn aggregate_forward(
        &self,
        block: &HostBlock,
        kind: AggregateKind,
        x: &HostBuf<f32>,
        dim: usize,
        out: &mut HostBuf<f32>,
    ) -> Result<()> {
        dense::aggregate_forward(self.simd, block, kind, x, dim, out)
    }

    fn aggregate_backward(
        &self,
        block: &HostBlock,
        kind: AggregateKind,
        grad_out: &HostBuf<f32>,
        dim: usize,
        grad_x: &mut HostBuf<f32>,
    ) -> Result<()> {
        dense::aggregate_backward(self.simd, block, kind, grad_out, dim, grad_x)
    }

    fn gat_forward(
        &self,
        block: &HostBlock,
        inp: &GatInputsDev<'_, Self>,
    ) -> Result<GatSaved<Self>> {
        dense::gat_forward(self.simd, block, inp)
    }

    fn gat_backward(
        &self,
        block: &HostBlock,
        inp: &GatInputsDev<'_, Self>,
        saved: &GatSaved<Self>,
        grad_out: &HostBuf<f32>,
    ) -> Result<GatGradsDev<Self>> {
        dense::gat_backward(self.simd, block, inp, saved, grad_out)
    }
}

impl SparseOps for HostBackend {
    type Sparse = HostSparse;

    fn supports_sparse(&self) -> bool {
        true
    }

    fn sparse_from_host(&self, rows: Arc<SparseRows<f32>>) -> Result<HostSparse> {
        Ok(HostSparse::new(rows))
    }

    fn sparse_gather(&self, src: &HostSparse, ids: &HostBuf<u32>, n: usize) -> Result<HostSparse> {
        src.gather(ids, n)
    }

    fn sparse_shape(&self, x: &HostSparse) -> SparseShape {
        x.shape()
    }

    fn spmm(
        &self,
        x: &HostSparse,
        rows: usize,
        w: &HostBuf<f32>,
        n: usize,
        out: &mut HostBuf<f32>,
        accumulate: bool,
    ) -> Result<()> {
        x.spmm(rows, w, n, out, accumulate)
    }

    fn spmm_tn(
        &self,
        x: &HostSparse,
        rows: usize,
        g: &HostBuf<f32>,
        n: usize,
        dw: &mut HostBuf<f32>,
        accumulate: bool,
    ) -> Result<()> {
        x.spmm_tn(rows, g, n, dw, accumulate)
    }
}

impl Backend for HostBackend {}
