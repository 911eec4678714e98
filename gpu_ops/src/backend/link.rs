//! [`LinkOps`]: link prediction on a device — the pair decoders' row products,
//! the binary cross-entropy on logits, negative sampling and the exclusion of a
//! batch's own edges from its sampled blocks — and the tables two of them read
//! ([`NegativeDist`], [`ExcludedPairs`]), made once on the host and uploaded.
//!
//! The formulas are `cpu_ops`' (`cpu_ops::pair_dot`, `cpu_ops::bce_with_logits`,
//! `cpu_ops::sample_negatives`, `cpu_ops::exclude_edges`, whose module doc
//! spells them out); the host backend runs those functions.

use super::core::DeviceCore;
use super::dense::{DenseOps, LossSlot, LossStats};
use super::sampling::Sampling;
use crate::error::{GpuOpsError, Result};

/// The distribution negatives are drawn from ([`LinkOps::sample_negatives`]):
/// uniform over `num_vertices` vertices, or `∝ degree^power` through a
/// cumulative table of `num_vertices + 1` integers on the device
/// (`cpu_ops::negative_cdf`). Made once by [`LinkOps::negative_dist`] (or
/// [`NegativeDist::uniform`]).
pub struct NegativeDist<B: DeviceCore> {
    num_vertices: usize,
    cdf: Option<B::Buf<u64>>,
}

impl<B: DeviceCore> NegativeDist<B> {
    /// Uniform over `num_vertices` vertices (1 to 2³²).
    pub fn uniform(num_vertices: usize) -> Result<Self> {
        check_vertices(num_vertices)?;
        Ok(Self {
            num_vertices,
            cdf: None,
        })
    }

    /// The vertices negatives are drawn from.
    pub fn num_vertices(&self) -> usize {
        self.num_vertices
    }

    /// The cumulative table (`num_vertices + 1` values), `None` when uniform.
    pub fn cdf(&self) -> Option<&B::Buf<u64>> {
        self.cdf.as_ref()
    }
}

/// Edges to leave out of sampled blocks ([`LinkOps::exclude_edges`]): the
/// sorted, distinct `cpu_ops::pair_key`s of `(destination, source)` pairs of
/// global ids, on the device. Made once per batch by [`LinkOps::excluded_pairs`].
pub struct ExcludedPairs<B: DeviceCore> {
    keys: B::Buf<u64>,
    n: usize,
}

impl<B: DeviceCore> ExcludedPairs<B> {
    /// The sorted keys (the first [`ExcludedPairs::len`] values).
    pub fn keys(&self) -> &B::Buf<u64> {
        &self.keys
    }

    /// Distinct pairs.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether no pair is excluded.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

fn check_vertices(num_vertices: usize) -> Result<()> {
    if num_vertices == 0 || num_vertices as u64 > 1 << 32 {
        return Err(GpuOpsError::InvalidArgument {
            name: "num_vertices",
            reason: format!("negatives are drawn from 1 to 2^32 vertices, got {num_vertices}"),
        });
    }
    Ok(())
}

/// Link prediction's ops: scores of vertex pairs from their embedding rows and
/// the gradients back into those rows, the binary cross-entropy of the scores
/// (synchronous, or into a deferred loss slot), negatives drawn on the device
/// identically on every backend, and blocks without a batch's own edges.
///
/// Pair ops read pairs `(src[i], dst[i])`, `i < n`, of row ids into a row-major
/// `h` of `dim` columns (`dim ≥ 1`); an id must be below `len(h) / dim`
/// (the host backend returns an error; CUDA skips the pair and reports the id
/// through its fault word at the next synchronization). Their backwards *add*
/// into `dh`; on CUDA with float atomics, so the sums' last bits vary run to
/// run where rows repeat (as the aggregation backward's do).
pub trait LinkOps: DenseOps + Sampling {
    /// `out[i] = ⟨h[src[i]], h[dst[i]]⟩` for `i < n`.
    fn pair_dot(
        &self,
        h: &Self::Buf<f32>,
        dim: usize,
        src: &Self::Buf<u32>,
        dst: &Self::Buf<u32>,
        n: usize,
        out: &mut Self::Buf<f32>,
    ) -> Result<()>;
    /// `dh[src[i]] += dscore[i]·h[dst[i]]` and `dh[dst[i]] += dscore[i]·h[src[i]]`
    /// for `i < n` (accumulates).
    #[allow(clippy::too_many_arguments)]
    fn pair_dot_backward(
        &self,
        h: &Self::Buf<f32>,
        dim: usize,
        src: &Self::Buf<u32>,
        dst: &Self::Buf<u32>,
        n: usize,
        dscore: &Self::Buf<f32>,
        dh: &mut Self::Buf<f32>,
    ) -> Result<()>;
    /// Row `i` of `out` (`n × dim`) `= h[src[i]] ⊙ h[dst[i]]`.
    fn pair_hadamard(
        &self,
        h: &Self::Buf<f32>,
        dim: usize,
        src: &Self::Buf<u32>,
        dst: &Self::Buf<u32>,
        n: usize,
        out: &mut Self::Buf<f32>,
    ) -> Result<()>;
    /// `dh[src[i]] += dz[i] ⊙ h[dst[i]]` and `dh[dst[i]] += dz[i] ⊙ h[src[i]]`
    /// for `i < n` (`dz` is `n × dim`; accumulates).
    #[allow(clippy::too_many_arguments)]
    fn pair_hadamard_backward(
        &self,
        h: &Self::Buf<f32>,
        dim: usize,
        src: &Self::Buf<u32>,
        dst: &Self::Buf<u32>,
        n: usize,
        dz: &Self::Buf<f32>,
        dh: &mut Self::Buf<f32>,
    ) -> Result<()>;
    /// Mean binary cross-entropy of `logits[..n]` against `labels[..n]` (1.0
    /// positive, 0.0 negative), numerically stable for any logit; `correct`
    /// counts `(logit > 0) = (label > 0.5)`; `(σ(logit) − label) / n` goes into
    /// `dlogits` when given. Synchronizes.
    fn bce_with_logits(
        &self,
        logits: &Self::Buf<f32>,
        labels: &Self::Buf<f32>,
        n: usize,
        dlogits: Option<&mut Self::Buf<f32>>,
    ) -> Result<LossStats>;
    /// [`LinkOps::bce_with_logits`] (with the gradient, into `dlogits`) without
    /// reading the result, exactly as
    /// [`DenseOps::softmax_cross_entropy_deferred`] does it: the loss **sum** (its
    /// f64 bits) and the correct count go to `dest`'s slot; a non-finite sum sets
    /// `guard[0] = 1`, which the guarded [`DenseOps::adam_step_all`] obeys. No
    /// synchronization on CUDA.
    fn bce_with_logits_deferred(
        &self,
        logits: &Self::Buf<f32>,
        labels: &Self::Buf<f32>,
        n: usize,
        dlogits: &mut Self::Buf<f32>,
        dest: LossSlot<'_, Self>,
        guard: &mut Self::Buf<u32>,
    ) -> Result<()>;
    /// The distribution `∝ degree^power` over `degrees.len()` vertices (a
    /// cumulative table made on the host by `cpu_ops::negative_cdf`, uploaded);
    /// `power = 0` is [`NegativeDist::uniform`] (the same draws a table of equal
    /// weights gives). Errors: no vertex, more than 2³², `power` not finite and
    /// `≥ 0`, every degree 0.
    fn negative_dist(&self, degrees: &[u32], power: f32) -> Result<NegativeDist<Self>> {
        if power == 0.0 {
            return NegativeDist::uniform(degrees.len());
        }
        let cdf = cpu_ops::negative_cdf(degrees, f64::from(power))?;
        Ok(NegativeDist {
            num_vertices: degrees.len(),
            cdf: Some(self.to_device(&cdf)?),
        })
    }
    /// `per_positive` negatives for each of the `n_pos` positives whose sources
    /// are `src[..n_pos]`: `out_src[i·k + j] = src[i]` and `out_dst[i·k + j]` a
    /// vertex drawn from `dist` with the counter-based generator at `(seed,
    /// i·k + j)` (`k = per_positive`; `cpu_ops::sample_negatives`). Every backend
    /// draws the same vertices for the same arguments (integer arithmetic only).
    /// Errors: `num_vertices` not `dist`'s, outputs shorter than `n_pos · k`.
    #[allow(clippy::too_many_arguments)]
    fn sample_negatives(
        &self,
        num_vertices: usize,
        per_positive: usize,
        src: &Self::Buf<u32>,
        n_pos: usize,
        seed: u64,
        dist: &NegativeDist<Self>,
        out_src: &mut Self::Buf<u32>,
        out_dst: &mut Self::Buf<u32>,
    ) -> Result<()>;
    /// The excluded-pair table of `pairs`, each `(destination, source)` in
    /// global ids (e.g. a batch's positive edges and their reverses), sorted and
    /// deduplicated on the host (`cpu_ops::sorted_pair_keys`), uploaded.
    fn excluded_pairs(&self, pairs: &[(u32, u32)]) -> Result<ExcludedPairs<Self>> {
        let keys = cpu_ops::sorted_pair_keys(pairs);
        Ok(ExcludedPairs {
            n: keys.len(),
            keys: self.to_device(&keys)?,
        })
    }
    /// `block` without its edges whose pair of global ids (the destination's,
    /// the source's) is in `excluded`; `src_ids` holds the global id of each of
    /// the block's sources (destinations first: a
    /// [`DeviceBatch::src_ids`](crate::DeviceBatch::src_ids) entry) and
    /// `num_dst` is the block's destination count (checked). The other edges
    /// keep their order (`cpu_ops::exclude_edges`). Synchronizes on CUDA (one
    /// read of the kept edge count).
    fn exclude_edges(
        &self,
        block: &Self::Block,
        src_ids: &Self::Buf<u32>,
        num_dst: usize,
        excluded: &ExcludedPairs<Self>,
    ) -> Result<Self::Block>;
}

/// The checks every backend's [`LinkOps::sample_negatives`] makes before
/// drawing: `num_vertices` is `dist`'s, and `n_pos · k` fits.
pub(crate) fn check_negatives<B: DeviceCore>(
    num_vertices: usize,
    per_positive: usize,
    n_pos: usize,
    dist: &NegativeDist<B>,
) -> Result<usize> {
    check_vertices(num_vertices)?;
    if num_vertices != dist.num_vertices {
        return Err(GpuOpsError::SizeMismatch {
            what: "sample_negatives num_vertices (the distribution's vertex count)",
            expected: dist.num_vertices,
            found: num_vertices,
        });
    }
    n_pos
        .checked_mul(per_positive)
        .filter(|&t| t as u64 <= u32::MAX as u64)
        .ok_or_else(|| GpuOpsError::InvalidArgument {
            name: "per_positive",
            reason: format!("{n_pos} positives × {per_positive} negatives exceed 2^32 - 1 pairs"),
        })
}

/// The checks [`LinkOps::exclude_edges`] makes on the host: `num_dst` is the
/// block's.
pub(crate) fn check_exclude_dst(block_dst: usize, num_dst: usize) -> Result<()> {
    if block_dst != num_dst {
        return Err(GpuOpsError::SizeMismatch {
            what: "exclude_edges num_dst (the block's destinations)",
            expected: block_dst,
            found: num_dst,
        });
    }
    Ok(())
}
