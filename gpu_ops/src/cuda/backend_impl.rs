//! `impl Backend for CudaBackend`: each trait method forwards to the op family file
//! that implements it (`transfer.rs`, `sample.rs`, `features.rs`, `math.rs`,
//! `aggregate.rs`).

use cpu_ops::{AggregateKind, CsrGraph, FeatureMatrix};

use super::alloc::{CudaBuf, Init};
use super::device::{CudaBackend, CudaEventHandle, CudaStreamHandle};
use super::features::CudaFeatures;
use super::math::CudaMask;
use super::pinned::CudaPinned;
use super::sample::{CudaBlock, CudaGraph};
use crate::backend::{
    Activation, AdamStep, Backend, CacheStats, DeviceBatch, DeviceKind, Elem, FeatureDtype,
    GatGradsDev, GatSaved, LossStats, MemoryInfo, TopologyPlacement,
};
use crate::error::Result;

impl Backend for CudaBackend {
    type Buf<T: Elem> = CudaBuf<T>;
    type Pinned<T: Elem> = CudaPinned<T>;
    type Stream = CudaStreamHandle;
    type Event = CudaEventHandle;
    type Graph = CudaGraph;
    type Block = CudaBlock;
    type Features = CudaFeatures;
    type Mask = CudaMask;

    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn nccl_reduce(
        &self,
        rank: usize,
        ranks: usize,
        id: &crate::NcclId,
    ) -> Result<Box<dyn crate::GradReduce<Self>>> {
        Ok(Box::new(super::NcclReduce::new(self, rank, ranks, id)?))
    }

    fn describe(&self) -> String {
        self.describe_device()
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        self.memory()
    }

    fn set_precision(&self, precision: crate::Precision) -> Result<()> {
        self.set_math_mode(precision)
    }

    fn precision(&self) -> crate::Precision {
        self.math_mode()
    }

    fn transfer_stats(&self) -> crate::backend::TransferStats {
        let mut t = self.transfers.get();
        t.zero_fills = self.allocator_stats().zeroed;
        t
    }

    fn stream(&self) -> &CudaStreamHandle {
        &self.compute
    }

    fn new_stream(&self) -> Result<CudaStreamHandle> {
        self.create_stream()
    }

    fn record_event(&self, stream: &CudaStreamHandle) -> Result<CudaEventHandle> {
        self.record(stream)
    }

    fn wait_event(&self, stream: &CudaStreamHandle, event: &CudaEventHandle) -> Result<()> {
        self.wait(stream, event)
    }

    fn elapsed_ms(&self, start: &CudaEventHandle, end: &CudaEventHandle) -> Result<f32> {
        self.elapsed(start, end)
    }

    fn synchronize(&self, stream: &CudaStreamHandle) -> Result<()> {
        self.sync_stream(stream)
    }

    fn alloc<T: Elem>(&self, len: usize) -> Result<CudaBuf<T>> {
        self.alloc_zeroed(len)
    }

    fn alloc_uninit<T: Elem>(&self, len: usize) -> Result<CudaBuf<T>> {
        self.buf(len, Init::Uninit, "buffer")
    }

    fn len<T: Elem>(&self, buf: &CudaBuf<T>) -> usize {
        buf.len()
    }

    fn alloc_pinned<T: Elem>(&self, len: usize) -> Result<CudaPinned<T>> {
        self.alloc_pinned_buf(len)
    }

    fn pinned_slice<'a, T: Elem>(&self, p: &'a CudaPinned<T>) -> &'a [T] {
        p.as_slice()
    }

    fn pinned_slice_mut<'a, T: Elem>(&self, p: &'a mut CudaPinned<T>) -> &'a mut [T] {
        // Waiting for in-flight copies can only fail if the context is broken; the
        // error is then kept for the next synchronizing call and the view returned
        // without waiting (the trait requires the caller to have synchronized).
        if let Err(e) = p.wait_copies() {
            self.pool.defer(e);
        }
        p.as_mut_slice()
    }

    fn upload<T: Elem>(
        &self,
        stream: &CudaStreamHandle,
        src: &[T],
        dst: &mut CudaBuf<T>,
    ) -> Result<()> {
        self.transfers.upload(std::mem::size_of_val(src));
        self.upload_slice(stream, src, dst)
    }

    fn upload_pinned<T: Elem>(
        &self,
        stream: &CudaStreamHandle,
        src: &CudaPinned<T>,
        dst: &mut CudaBuf<T>,
    ) -> Result<()> {
        self.transfers.upload(src.len() * std::mem::size_of::<T>());
        self.upload_from_pinned(stream, src, dst)
    }

    fn upload_pinned_at<T: Elem>(
        &self,
        stream: &CudaStreamHandle,
        src: &CudaPinned<T>,
        n: usize,
        dst: &mut CudaBuf<T>,
        offset: usize,
    ) -> Result<()> {
        self.transfers.upload(n * std::mem::size_of::<T>());
        self.upload_from_pinned_at(stream, src, n, dst, offset)
    }

    fn download<T: Elem>(
        &self,
        stream: &CudaStreamHandle,
        src: &CudaBuf<T>,
        dst: &mut [T],
    ) -> Result<()> {
        self.transfers.download(std::mem::size_of_val(dst));
        self.download_slice(stream, src, dst)
    }

    fn to_device<T: Elem>(&self, src: &[T]) -> Result<CudaBuf<T>> {
        // No zeroing: the upload overwrites every element.
        let mut b = self.buf(src.len(), Init::Uninit, "buffer")?;
        self.upload_slice(&self.compute, src, &mut b)?;
        Ok(b)
    }

    fn copy<T: Elem>(&self, src: &CudaBuf<T>, dst: &mut CudaBuf<T>, len: usize) -> Result<()> {
        self.copy_buf(src, dst, len)
    }

    fn fill_zero<T: Elem>(&self, buf: &mut CudaBuf<T>, len: usize) -> Result<()> {
        self.fill_bytes(buf, len, 0)
    }

    fn widen_bf16(&self, src: &CudaBuf<u16>, n: usize, out: &mut CudaBuf<f32>) -> Result<()> {
        self.widen_bf16_op(src, n, out)
    }

    fn scale(&self, x: &mut CudaBuf<f32>, n: usize, alpha: f32) -> Result<()> {
        self.scale_op(x, n, alpha)
    }

    fn count_nonfinite(&self, x: &CudaBuf<f32>, n: usize, count: &mut CudaBuf<u32>) -> Result<()> {
        self.count_nonfinite_op(x, n, count)
    }

    fn load_graph(&self, graph: &CsrGraph, placement: TopologyPlacement) -> Result<CudaGraph> {
        self.load_graph_op(graph, placement)
    }

    fn sample(
        &self,
        graph: &CudaGraph,
        seeds: &[u32],
        fanouts: &[u32],
        seed: u64,
    ) -> Result<DeviceBatch<Self>> {
        self.sample_batch(graph, seeds, fanouts, seed)
    }

    fn sample_hop(
        &self,
        graph: &CudaGraph,
        dst: &CudaBuf<u32>,
        n_dst: usize,
        fanout: u32,
        layer_seed: u64,
        skip: Option<&CudaBuf<u8>>,
    ) -> Result<(CudaBlock, CudaBuf<u32>, usize)> {
        self.sample_hop_op(graph, dst, n_dst, fanout, layer_seed, skip)
    }

    fn unique_relabel(
        &self,
        targets: &CudaBuf<u32>,
        num_targets: usize,
        candidates: &CudaBuf<u32>,
        num_candidates: usize,
    ) -> Result<(CudaBuf<u32>, CudaBuf<u32>, usize)> {
        self.relabel(targets, num_targets, candidates, num_candidates, "targets")
    }

    fn block_from_host(
        &self,
        num_src: usize,
        indptr: &[u64],
        indices: &[u32],
    ) -> Result<CudaBlock> {
        self.transfers
            .upload(std::mem::size_of_val(indptr) + std::mem::size_of_val(indices));
        self.block_from_host_op(num_src, indptr, indices)
    }

    fn add_self_loops(&self, block: &CudaBlock) -> Result<CudaBlock> {
        self.add_self_loops_op(block)
    }

    fn block_to_host(&self, block: &CudaBlock) -> Result<(Vec<u64>, Vec<u32>)> {
        Ok((
            self.to_host(&block.indptr, block.num_dst + 1)?,
            self.to_host(&block.indices, block.num_edges)?,
        ))
    }

    fn block_shape(&self, block: &CudaBlock) -> (usize, usize, usize) {
        (block.num_src, block.num_dst, block.num_edges)
    }

    fn load_features(
        &self,
        features: &FeatureMatrix,
        cached: &[u32],
        budget_bytes: usize,
        dtype: FeatureDtype,
    ) -> Result<CudaFeatures> {
        self.load_features_op(features, cached, budget_bytes, dtype)
    }

    fn update_cache(&self, f: &mut CudaFeatures, insert: &[u32], evict: &[u32]) -> Result<usize> {
        self.update_cache_op(f, insert, evict)
    }

    fn is_cached(&self, f: &CudaFeatures, v: u32) -> bool {
        self.is_cached_in(f, v)
    }

    fn feature_dim(&self, f: &CudaFeatures) -> usize {
        self.feature_dim_of(f)
    }

    fn gather(
        &self,
        f: &CudaFeatures,
        ids: &CudaBuf<u32>,
        n: usize,
        out: &mut CudaBuf<f32>,
    ) -> Result<()> {
        self.gather_op(f, ids, n, out)
    }

    fn cache_stats(&self, f: &CudaFeatures) -> CacheStats {
        self.cache_stats_of(f)
    }

    fn reset_cache_stats(&self, f: &CudaFeatures) {
        self.reset_cache_stats_of(f)
    }

    fn index_select_rows(
        &self,
        src: &CudaBuf<f32>,
        dim: usize,
        idx: &CudaBuf<u32>,
        n: usize,
        out: &mut CudaBuf<f32>,
    ) -> Result<()> {
        self.index_select_op(src, dim, idx, n, out)
    }

    fn index_put_rows(
        &self,
        src: &CudaBuf<f32>,
        dim: usize,
        idx: &CudaBuf<u32>,
        n: usize,
        dst: &mut CudaBuf<f32>,
    ) -> Result<()> {
        self.index_put_op(src, dim, idx, n, dst)
    }

    fn gemm(
        &self,
        trans_a: bool,
        trans_b: bool,
        m: usize,
        n: usize,
        k: usize,
        a: &CudaBuf<f32>,
        b: &CudaBuf<f32>,
        c: &mut CudaBuf<f32>,
        accumulate: bool,
    ) -> Result<()> {
        self.gemm_op(trans_a, trans_b, m, n, k, a, b, c, accumulate)
    }

    fn aggregate_forward(
        &self,
        block: &CudaBlock,
        kind: AggregateKind,
        x: &CudaBuf<f32>,
        dim: usize,
        out: &mut CudaBuf<f32>,
    ) -> Result<()> {
        self.aggregate_forward_op(block, kind, x, dim, out)
    }

    fn aggregate_backward(
        &self,
        block: &CudaBlock,
        kind: AggregateKind,
        grad_out: &CudaBuf<f32>,
        dim: usize,
        grad_x: &mut CudaBuf<f32>,
    ) -> Result<()> {
        self.aggregate_backward_op(block, kind, grad_out, dim, grad_x)
    }

    fn gat_forward(
        &self,
        block: &CudaBlock,
        heads: usize,
        head_dim: usize,
        z_src: &CudaBuf<f32>,
        a_src: &CudaBuf<f32>,
        a_dst: &CudaBuf<f32>,
    ) -> Result<GatSaved<Self>> {
        self.gat_forward_op(block, heads, head_dim, z_src, a_src, a_dst)
    }

    fn gat_backward(
        &self,
        block: &CudaBlock,
        heads: usize,
        head_dim: usize,
        z_src: &CudaBuf<f32>,
        a_src: &CudaBuf<f32>,
        a_dst: &CudaBuf<f32>,
        saved: &GatSaved<Self>,
        grad_out: &CudaBuf<f32>,
    ) -> Result<GatGradsDev<Self>> {
        self.gat_backward_op(block, heads, head_dim, z_src, a_src, a_dst, saved, grad_out)
    }

    fn add_bias(
        &self,
        x: &mut CudaBuf<f32>,
        rows: usize,
        cols: usize,
        bias: &CudaBuf<f32>,
    ) -> Result<()> {
        self.add_bias_op(x, rows, cols, bias)
    }

    fn bias_grad(
        &self,
        dy: &CudaBuf<f32>,
        rows: usize,
        cols: usize,
        dbias: &mut CudaBuf<f32>,
        accumulate: bool,
    ) -> Result<()> {
        self.bias_grad_op(dy, rows, cols, dbias, accumulate)
    }

    fn relu(&self, x: &mut CudaBuf<f32>, n: usize) -> Result<()> {
        self.relu_op(x, n)
    }

    fn relu_backward(&self, y: &CudaBuf<f32>, dy: &mut CudaBuf<f32>, n: usize) -> Result<()> {
        self.relu_backward_op(y, dy, n)
    }

    fn elu(&self, x: &mut CudaBuf<f32>, n: usize, alpha: f32) -> Result<()> {
        self.elu_op(x, n, alpha)
    }

    fn elu_backward(
        &self,
        y: &CudaBuf<f32>,
        dy: &mut CudaBuf<f32>,
        n: usize,
        alpha: f32,
    ) -> Result<()> {
        self.elu_backward_op(y, dy, n, alpha)
    }

    fn dropout(&self, x: &mut CudaBuf<f32>, n: usize, p: f32, seed: u64) -> Result<CudaMask> {
        self.dropout_op(x, n, p, seed)
    }

    fn bias_act_dropout(
        &self,
        x: &mut CudaBuf<f32>,
        rows: usize,
        cols: usize,
        bias: &CudaBuf<f32>,
        act: Activation,
        dropout: Option<(f32, u64, &mut CudaBuf<f32>)>,
    ) -> Result<Option<CudaMask>> {
        self.bias_act_dropout_op(x, rows, cols, bias, act, dropout)
    }

    fn dropout_act_backward(
        &self,
        mask: &CudaMask,
        y: &CudaBuf<f32>,
        dy: &mut CudaBuf<f32>,
        n: usize,
        act: Activation,
    ) -> Result<()> {
        self.dropout_act_backward_op(mask, y, dy, n, act)
    }

    fn dropout_backward(&self, mask: &CudaMask, dy: &mut CudaBuf<f32>, n: usize) -> Result<()> {
        self.dropout_backward_op(mask, dy, n)
    }

    fn softmax_cross_entropy(
        &self,
        logits: &CudaBuf<f32>,
        rows: usize,
        classes: usize,
        labels: &CudaBuf<u32>,
        grad: Option<&mut CudaBuf<f32>>,
    ) -> Result<LossStats> {
        self.softmax_xent_op(logits, rows, classes, labels, grad)
    }

    fn adam_step(
        &self,
        hp: &AdamStep,
        param: &mut CudaBuf<f32>,
        grad: &CudaBuf<f32>,
        m: &mut CudaBuf<f32>,
        v: &mut CudaBuf<f32>,
        n: usize,
    ) -> Result<()> {
        self.adam_op(hp, param, grad, m, v, n)
    }
}
