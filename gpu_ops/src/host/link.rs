//! The host backend's [`LinkOps`]: each op checks the prefixes it reads and
//! writes (contract item 2 of [`crate::Backend`]) and runs `cpu_ops`' link
//! function (`cpu_ops::pair_dot`, ..., `cpu_ops::exclude_edges`), the scalar
//! twins of `kernels/link.cu`. Results are bit-deterministic; negatives are the
//! ones CUDA draws for the same seed.

use crate::backend::{
    check_exclude_dst, check_negatives, ExcludedPairs, LinkOps, LossSlot, LossStats, NegativeDist,
};
use crate::error::Result;
use crate::host::block::HostBlock;
use crate::host::buffer::{mul, prefix, prefix_mut, HostBuf};
use crate::host::dense::{check_loss_slot, write_loss_slot};
use crate::host::HostBackend;

/// The first `n` ids of `src` and `dst`.
fn pairs<'a>(
    src: &'a HostBuf<u32>,
    dst: &'a HostBuf<u32>,
    n: usize,
) -> Result<(&'a [u32], &'a [u32])> {
    Ok((
        prefix("pair sources (n)", src, n)?,
        prefix("pair destinations (n)", dst, n)?,
    ))
}

/// [`LinkOps::bce_with_logits`] on the prefixes.
fn bce(
    logits: &HostBuf<f32>,
    labels: &HostBuf<f32>,
    n: usize,
    dlogits: Option<&mut HostBuf<f32>>,
) -> Result<LossStats> {
    let logits = prefix("bce_with_logits logits (n)", logits, n)?;
    let labels = prefix("bce_with_logits labels (n)", labels, n)?;
    let grad = match dlogits {
        Some(g) => Some(prefix_mut("bce_with_logits gradient (n)", g, n)?),
        None => None,
    };
    let ce = cpu_ops::bce_with_logits(logits, labels, grad)?;
    Ok(LossStats {
        loss: ce.loss,
        correct: ce.correct,
    })
}

/// Synchronizations are counted where CUDA makes them: the loss read of
/// `bce_with_logits` and the kept-edge count of `exclude_edges`.
impl LinkOps for HostBackend {
    fn pair_dot(
        &self,
        h: &HostBuf<f32>,
        dim: usize,
        src: &HostBuf<u32>,
        dst: &HostBuf<u32>,
        n: usize,
        out: &mut HostBuf<f32>,
    ) -> Result<()> {
        let (src, dst) = pairs(src, dst, n)?;
        let out = prefix_mut("pair_dot output (n)", out, n)?;
        cpu_ops::pair_dot(h, dim, src, dst, out)?;
        Ok(())
    }

    fn pair_dot_backward(
        &self,
        h: &HostBuf<f32>,
        dim: usize,
        src: &HostBuf<u32>,
        dst: &HostBuf<u32>,
        n: usize,
        dscore: &HostBuf<f32>,
        dh: &mut HostBuf<f32>,
    ) -> Result<()> {
        let (src, dst) = pairs(src, dst, n)?;
        let dscore = prefix("pair_dot_backward score gradient (n)", dscore, n)?;
        cpu_ops::pair_dot_backward(h, dim, src, dst, dscore, dh)?;
        Ok(())
    }

    fn pair_hadamard(
        &self,
        h: &HostBuf<f32>,
        dim: usize,
        src: &HostBuf<u32>,
        dst: &HostBuf<u32>,
        n: usize,
        out: &mut HostBuf<f32>,
    ) -> Result<()> {
        let (src, dst) = pairs(src, dst, n)?;
        let out = prefix_mut(
            "pair_hadamard output (n × dim)",
            out,
            mul("n × dim", n, dim)?,
        )?;
        cpu_ops::pair_hadamard(h, dim, src, dst, out)?;
        Ok(())
    }

    fn pair_hadamard_backward(
        &self,
        h: &HostBuf<f32>,
        dim: usize,
        src: &HostBuf<u32>,
        dst: &HostBuf<u32>,
        n: usize,
        dz: &HostBuf<f32>,
        dh: &mut HostBuf<f32>,
    ) -> Result<()> {
        let (src, dst) = pairs(src, dst, n)?;
        let dz = prefix(
            "pair_hadamard_backward gradient (n × dim)",
            dz,
            mul("n × dim", n, dim)?,
        )?;
        cpu_ops::pair_hadamard_backward(h, dim, src, dst, dz, dh)?;
        Ok(())
    }

    fn bce_with_logits(
        &self,
        logits: &HostBuf<f32>,
        labels: &HostBuf<f32>,
        n: usize,
        dlogits: Option<&mut HostBuf<f32>>,
    ) -> Result<LossStats> {
        let stats = bce(logits, labels, n, dlogits)?;
        // The result reaches the host: what a device's synchronization is.
        self.transfers.sync();
        Ok(stats)
    }

    /// Computed at once, written to the slot as the protocol says: no
    /// synchronization is counted.
    fn bce_with_logits_deferred(
        &self,
        logits: &HostBuf<f32>,
        labels: &HostBuf<f32>,
        n: usize,
        dlogits: &mut HostBuf<f32>,
        dest: LossSlot<'_, Self>,
        guard: &mut HostBuf<u32>,
    ) -> Result<()> {
        check_loss_slot(&dest, guard)?;
        let stats = bce(logits, labels, n, Some(dlogits))?;
        write_loss_slot(dest, guard, stats, n);
        Ok(())
    }

    fn sample_negatives(
        &self,
        num_vertices: usize,
        per_positive: usize,
        src: &HostBuf<u32>,
        n_pos: usize,
        seed: u64,
        dist: &NegativeDist<Self>,
        out_src: &mut HostBuf<u32>,
        out_dst: &mut HostBuf<u32>,
    ) -> Result<()> {
        let total = check_negatives(num_vertices, per_positive, n_pos, dist)?;
        let src = prefix("sample_negatives sources (n_pos)", src, n_pos)?;
        let cdf = match dist.cdf() {
            Some(c) => Some(prefix(
                "negative table (num_vertices + 1)",
                c,
                num_vertices + 1,
            )?),
            None => None,
        };
        let out_src = prefix_mut("negative sources (n_pos × k)", out_src, total)?;
        let out_dst = prefix_mut("negative destinations (n_pos × k)", out_dst, total)?;
        cpu_ops::sample_negatives(num_vertices, per_positive, src, seed, cdf, out_src, out_dst)?;
        Ok(())
    }

    fn exclude_edges(
        &self,
        block: &HostBlock,
        src_ids: &HostBuf<u32>,
        num_dst: usize,
        excluded: &ExcludedPairs<Self>,
    ) -> Result<HostBlock> {
        check_exclude_dst(block.num_dst(), num_dst)?;
        let ids = prefix(
            "exclude_edges source ids (num_src)",
            src_ids,
            block.num_src(),
        )?;
        let keys = prefix("excluded pair keys", excluded.keys(), excluded.len())?;
        let (indptr, indices) = cpu_ops::exclude_edges(block.view(), ids, keys)?;
        // CUDA reads the kept edge count.
        self.transfers.sync();
        HostBlock::new(block.num_src(), indptr, indices)
    }
}
