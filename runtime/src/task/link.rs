//! Link prediction's batches: positives, negatives, seeds, pair targets and
//! the edges kept out of the sampled blocks.
//!
//! # One training batch (items = indices into the training edges)
//! 1. **Positives**: edge `e` of the items is (`src[e]`, `dst[e]`), label 1.
//! 2. **Negatives**: `link.negatives` = `k` per positive, positive `i` (its
//!    place in the batch) and `j < k` giving (`src`, a destination drawn from
//!    the batch's seed at counter `i·k + j`), label 0 — uniform over the
//!    vertices or ∝ degree^0.75 (`link.negative_sampler`), by
//!    `cpu_ops::sample_negatives`, the counter-based draw the accelerator's
//!    kernel (`gpu_ops::LinkOps::sample_negatives`) makes too, so any backend
//!    draws the same. A negative may happen to be an edge of the graph, as in
//!    DGL and PyG.
//! 3. **Seeds**: every pair's endpoints, deduplicated in first-occurrence
//!    order (positives first); pairs hold local ids into the seeds.
//! 4. **Exclusion**: the positives as (destination, source) pairs, with
//!    `"reverse"` their reverses too, sorted: every sampled hop of the batch
//!    leaves those edges out, so no seed reads the edge it is asked about.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use cpu_ops::HostArray;

use super::{HostTarget, PairTargets, TaskBatch};

/// Which edges a training batch keeps out of its sampled blocks
/// (`link.exclude` resolved for the store).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exclude {
    /// Nothing.
    None,
    /// The positive edges.
    SelfEdges,
    /// The positive edges and their reverses.
    Reverse,
}

/// Where negatives' destinations come from: `num_vertices` vertices,
/// uniformly, or by a cumulative table (`cpu_ops::negative_cdf`).
#[derive(Clone, Debug)]
pub(crate) struct NegativeDist {
    /// The vertices drawn from.
    pub num_vertices: usize,
    /// `num_vertices + 1` cumulative weights; `None`: uniform.
    pub cdf: Option<Arc<Vec<u64>>>,
}

impl NegativeDist {
    /// `k` negative destinations for each source of `src`, drawn from `seed`
    /// (`cpu_ops::sample_negatives`).
    pub fn draw(&self, src: &[u32], k: usize, seed: u64) -> Vec<u32> {
        let mut out_src = vec![0u32; src.len() * k];
        let mut out_dst = vec![0u32; src.len() * k];
        cpu_ops::sample_negatives(
            self.num_vertices,
            k,
            src,
            seed,
            self.cdf.as_deref().map(Vec::as_slice),
            &mut out_src,
            &mut out_dst,
        )
        .expect("negative sampling arguments are checked when the task is made");
        out_dst
    }
}

/// Link prediction over a store's training edges (module doc).
#[derive(Clone, Debug)]
pub(crate) struct LinkTask {
    /// Sources of the training edges.
    pub src: HostArray<u32>,
    /// Destinations of the training edges.
    pub dst: HostArray<u32>,
    /// Negatives per positive (≥ 1).
    pub negatives: usize,
    /// Where they are drawn from.
    pub dist: NegativeDist,
    /// What a batch keeps out of its blocks.
    pub exclude: Exclude,
}

impl LinkTask {
    /// The batch of training edges `items` drawn with `seed` (module doc).
    pub fn batch<'a>(&self, items: &[u32], seed: u64) -> TaskBatch<'a> {
        let k = self.negatives;
        let src: Vec<u32> = items.iter().map(|&e| self.src[e as usize]).collect();
        let negatives = self.dist.draw(&src, k, seed);
        let positives = items
            .iter()
            .map(|&e| (self.src[e as usize], self.dst[e as usize]));
        let (seeds, pairs) = assemble(positives, k, |i, j| negatives[i * k + j]);
        let mut exclude = Vec::with_capacity(match self.exclude {
            Exclude::None => 0,
            Exclude::SelfEdges => items.len(),
            Exclude::Reverse => 2 * items.len(),
        });
        for &e in items {
            let (u, v) = (self.src[e as usize], self.dst[e as usize]);
            match self.exclude {
                Exclude::None => {}
                Exclude::SelfEdges => exclude.push((v, u)),
                Exclude::Reverse => {
                    exclude.push((v, u));
                    exclude.push((u, v));
                }
            }
        }
        exclude.sort_unstable();
        exclude.dedup();
        TaskBatch {
            seeds: Cow::Owned(seeds),
            target: HostTarget::Pairs(pairs),
            exclude,
        }
    }

    /// Rows of a batch of `items` positives: its pairs.
    pub fn rows(&self, items: usize) -> usize {
        items * (1 + self.negatives)
    }
}

/// Seeds and pair targets of `positives` (in order, label 1) followed by `k`
/// negatives each (positive `i`'s source with destination `negative(i, j)`,
/// label 0): every endpoint deduplicated in first-occurrence order, pairs in
/// local ids. Training batches and evaluation batches are both made here.
pub(crate) fn assemble(
    positives: impl ExactSizeIterator<Item = (u32, u32)>,
    k: usize,
    mut negative: impl FnMut(usize, usize) -> u32,
) -> (Vec<u32>, PairTargets) {
    let n = positives.len();
    let mut seeds: Vec<u32> = Vec::with_capacity(2 * n);
    let mut local: HashMap<u32, u32> = HashMap::with_capacity(n * (2 + k));
    let mut id = |v: u32, seeds: &mut Vec<u32>| -> u32 {
        *local.entry(v).or_insert_with(|| {
            seeds.push(v);
            (seeds.len() - 1) as u32
        })
    };
    let mut pairs = PairTargets {
        src: Vec::with_capacity(n * (1 + k)),
        dst: Vec::with_capacity(n * (1 + k)),
        labels: Vec::with_capacity(n * (1 + k)),
    };
    let mut sources = Vec::with_capacity(n);
    for (u, v) in positives {
        let (a, b) = (id(u, &mut seeds), id(v, &mut seeds));
        pairs.src.push(a);
        pairs.dst.push(b);
        pairs.labels.push(1.0);
        sources.push(a);
    }
    for (i, &a) in sources.iter().enumerate() {
        for j in 0..k {
            let b = id(negative(i, j), &mut seeds);
            pairs.src.push(a);
            pairs.dst.push(b);
            pairs.labels.push(0.0);
        }
    }
    (seeds, pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(exclude: Exclude, k: usize) -> LinkTask {
        LinkTask {
            src: vec![0u32, 2, 4, 0].into(),
            dst: vec![1u32, 3, 5, 2].into(),
            negatives: k,
            dist: NegativeDist {
                num_vertices: 6,
                cdf: None,
            },
            exclude,
        }
    }

    #[test]
    fn a_batch_has_its_positives_then_k_negatives_each_over_deduplicated_seeds() {
        let t = task(Exclude::Reverse, 2);
        let b = t.batch(&[3, 1], 9);
        let HostTarget::Pairs(p) = &b.target else {
            panic!("pairs")
        };
        assert_eq!(p.len(), t.rows(2));
        // Positives first, in item order, labelled 1.
        let global = |l: u32| b.seeds[l as usize];
        assert_eq!((global(p.src[0]), global(p.dst[0])), (0, 2));
        assert_eq!((global(p.src[1]), global(p.dst[1])), (2, 3));
        assert_eq!(&p.labels[..2], &[1.0, 1.0]);
        // Negatives keep their positive's source, labelled 0.
        for i in 0..2 {
            for j in 0..2 {
                let q = 2 + i * 2 + j;
                assert_eq!(p.src[q], p.src[i]);
                assert_eq!(p.labels[q], 0.0);
                assert!(global(p.dst[q]) < 6);
            }
        }
        // Seeds distinct, every pair's endpoints among them.
        let mut s = b.seeds.to_vec();
        s.sort_unstable();
        s.dedup();
        assert_eq!(s.len(), b.seeds.len());
        // The positives and their reverses are excluded, sorted.
        assert_eq!(b.exclude, vec![(0, 2), (2, 0), (2, 3), (3, 2)]);
        // Deterministic for the seed; another seed draws other negatives
        // somewhere in a larger batch.
        assert_eq!(t.batch(&[3, 1], 9), b);
        let many: Vec<u32> = (0..4).collect();
        assert_ne!(t.batch(&many, 9), t.batch(&many, 10));
    }

    #[test]
    fn exclusion_follows_the_mode() {
        assert!(task(Exclude::None, 1).batch(&[0], 1).exclude.is_empty());
        assert_eq!(
            task(Exclude::SelfEdges, 1).batch(&[0], 1).exclude,
            vec![(1, 0)]
        );
    }
}
