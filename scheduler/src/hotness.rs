//! Hotness: how often training will touch each vertex, and the order that follows.
//!
//! Two policies score the vertices; [`crate::Relabeling::by_score`] then turns the
//! scores into a relabeling whose id prefix is the hot set.
//!
//! - **Pre-sampling** (GNNLab's method, NeutronOrch §4.1.2): run `epochs` epochs of
//!   the training sampler over the training vertices, exactly as training will (same
//!   fanouts, same batch size, shuffled seeds), and count for every vertex the number
//!   of batches that touch it in the bottom layer. A vertex counts at most once per
//!   batch (blocks deduplicate their vertices).
//! - **Degree** (PaGraph's cheap alternative): the score is the vertex's number of
//!   stored neighbors; no sampling at all.
//! - **PCIe value** ([`crate::pcie_value`]): one pre-sampling
//!   pass counts both sides of the bottom block, and a vertex scores the feature
//!   bytes it alone makes the accelerator read per µs of CPU time
//!   ([`crate::pcie_values`], with [`RowCost::REFERENCE`] scaled to the model's
//!   layer 0 by [`RowCost::for_layer`] when the runtime builds the policy). Its
//!   ranking depends only on the ratio of the row cost's two terms, not their
//!   scale, so a reference cost ranks as a measured one of the same shape would; the hot
//!   set's size is still `hot_ratio`'s, corrected at run time by the time
//!   monitor. A vertex that saves nothing (no batch needs its layer-0 row) is
//!   never hot.
//!
//! # Pre-sampling, step by step
//! For each epoch `e` in `0..epochs`:
//! 1. The epoch's seed is `s_e = derive_seed(seed, e)`; the training vertices are
//!    shuffled with `Rng::new(s_e)` and cut into batches of `batch_size` (the last
//!    one may be short).
//! 2. Batch `b` is sampled with the training sampler and seed `derive_seed(s_e, b + 1)`.
//! 3. Every vertex of the bottom block's [`Touch`] side gets `+1`.
//!
//! The batches are sampled in parallel (rayon's current pool; the counts are
//! atomic sums, so their order does not matter): one thread took 3.3 s for 3
//! epochs of 188 batches on 2.4 M vertices (H200 host, 2026-11-26), the cost of
//! `policy = "auto"`'s first layer measurement. The result depends only on
//! `(graph, train_ids, fanouts, batch_size, epochs, seed)`, never on the thread
//! count (the sampler's promise).

use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};

use cpu_ops::{derive_seed, CsrGraph, NeighborSampler, Rng, SamplerScratch};
use rayon::prelude::*;

use crate::error::{invalid, Result, SchedulerError};
use crate::RowCost;

/// Which side of the bottom block pre-sampling counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Touch {
    /// The bottom block's sources: the vertices whose *input features* the batch reads
    /// (GNNLab's count, and what a feature cache wants). The default.
    #[default]
    BottomInputs,
    /// The bottom block's destinations: the vertices whose *bottom-layer embedding* the
    /// batch needs (exactly the reuse opportunities of a historical embedding). A
    /// subset of the inputs of the same batch, so the two rankings agree closely.
    BottomOutputs,
}

/// How vertices are scored for hotness.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HotnessPolicy {
    /// Count touches over `epochs` epochs of pre-sampling (see the module doc).
    PreSample {
        /// Epochs of pre-sampling (`K`, at least 1).
        epochs: u32,
        /// Which side of the bottom block is counted.
        touch: Touch,
    },
    /// Score by degree (number of stored neighbors).
    Degree,
    /// PCIe bytes saved per CPU µs, from `epochs` epochs of pre-sampling of
    /// both bottom sides (module doc).
    PcieValue {
        /// Epochs of pre-sampling (at least 1).
        epochs: u32,
        /// The CPU's cost per hot row.
        cost: RowCost,
    },
}

/// How vertices are ranked hot (the config key `hotness`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum Hotness {
    /// Count, over `presample_epochs` epochs of the training sampler, the batches
    /// whose bottom block touches each vertex (GNNLab's method).
    #[default]
    Presample,
    /// The stored degree (no sampling).
    Degree,
    /// PCIe bytes saved per CPU µs (pre-sampling both sides of the bottom
    /// block; [`crate::pcie_values`]).
    Pcie,
}

impl HotnessPolicy {
    /// The names accepted by [`HotnessPolicy::from_name`].
    pub const NAMES: &'static [&'static str] = &["presample", "degree", "pcie"];

    /// The policy of `hotness`, with `presample_epochs` as `K` for pre-sampling
    /// (ignored for degree order; at least 1 for pre-sampling).
    pub fn new(hotness: Hotness, presample_epochs: u32) -> Result<Self> {
        match hotness {
            Hotness::Presample => Self::from_name("presample", presample_epochs),
            Hotness::Degree => Ok(Self::Degree),
            Hotness::Pcie => Self::from_name("pcie", presample_epochs),
        }
    }

    /// Parses the config key `hotness` (`"presample"`, `"degree"` or
    /// `"pcie"`), with `presample_epochs` as `K` for pre-sampling (ignored for
    /// degree order).
    pub fn from_name(name: &str, presample_epochs: u32) -> Result<Self> {
        match name {
            "presample" | "pcie" => {
                if presample_epochs == 0 {
                    return Err(invalid(
                        "presample_epochs",
                        "at least 1 epoch of pre-sampling",
                        presample_epochs,
                    ));
                }
                Ok(if name == "pcie" {
                    Self::PcieValue {
                        epochs: presample_epochs,
                        cost: RowCost::REFERENCE,
                    }
                } else {
                    Self::PreSample {
                        epochs: presample_epochs,
                        touch: Touch::BottomInputs,
                    }
                })
            }
            "degree" => Ok(Self::Degree),
            other => Err(SchedulerError::UnknownVariant {
                name: "hotness",
                allowed: Self::NAMES,
                found: other.to_string(),
            }),
        }
    }

    /// Scores every vertex of `graph` under this policy. `sampler`, `train_ids`,
    /// `batch_size` and `seed` are what training will use (unused by degree order).
    pub fn scores(
        &self,
        graph: &CsrGraph,
        sampler: &NeighborSampler,
        train_ids: &[u32],
        batch_size: usize,
        seed: u64,
    ) -> Result<Vec<u64>> {
        self.scores_with(graph, sampler, train_ids, batch_size, seed, &|_, _| {})
    }

    /// [`HotnessPolicy::scores`], reporting the pre-sampling pass's progress
    /// to `progress` as `(batches done, batches in all)` (the protocol of
    /// [`presample_sides_with`]; degree order reports nothing).
    pub fn scores_with(
        &self,
        graph: &CsrGraph,
        sampler: &NeighborSampler,
        train_ids: &[u32],
        batch_size: usize,
        seed: u64,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<Vec<u64>> {
        let run = |epochs| PresampleRun {
            graph,
            sampler,
            train_ids,
            batch_size,
            epochs,
            seed,
        };
        match *self {
            Self::PreSample { epochs, touch } => {
                let [counts] = presample_sides_with(&run(epochs), [touch], progress)?;
                Ok(counts.into_iter().map(u64::from).collect())
            }
            Self::Degree => Ok(degree_scores(graph)),
            Self::PcieValue { epochs, cost } => {
                let [in_uses, out_uses]: [Vec<u32>; 2] = presample_sides_with(
                    &run(epochs),
                    [Touch::BottomInputs, Touch::BottomOutputs],
                    progress,
                )?;
                let n = graph.num_vertices();
                let values = crate::pcie_values(
                    graph,
                    &crate::ValueInputs {
                        out_uses: &out_uses,
                        in_uses: &in_uses,
                        // Which rows the device caches is the monitor's to
                        // decide at run time: none at setup.
                        cached: &vec![false; n],
                        fanout: sampler.fanouts().first().copied().unwrap_or(1).max(1),
                        // Uniform across vertices: scales every value alike.
                        row_bytes: 1,
                        cost,
                    },
                )?;
                Ok(values.iter().map(|&v| value_score(v)).collect())
            }
        }
    }

    /// This policy with the CPU row cost the PCIe value ranks by (e.g.
    /// [`RowCost::for_layer`] of the trained model); other policies ignore it.
    pub fn with_row_cost(self, row_cost: RowCost) -> Self {
        match self {
            Self::PcieValue { epochs, .. } => Self::PcieValue {
                epochs,
                cost: row_cost,
            },
            other => other,
        }
    }

    /// Whether a score of 0 means "never hot" (the PCIe value: nothing saved).
    pub fn zero_is_cold(&self) -> bool {
        matches!(self, Self::PcieValue { .. })
    }
}

/// A PCIe value (bytes per µs, ≥ 0) as an integer score in exactly its order:
/// the bits of a non-negative `f64` order as its value (0 for nothing saved).
fn value_score(v: f64) -> u64 {
    if v > 0.0 {
        v.to_bits()
    } else {
        0
    }
}

impl FromStr for HotnessPolicy {
    type Err = SchedulerError;

    /// `"presample"` (with K = 3 epochs, the default) or `"degree"`.
    fn from_str(s: &str) -> Result<Self> {
        Self::from_name(s, DEFAULT_PRESAMPLE_EPOCHS)
    }
}

/// Pre-sampling epochs when the config does not say (GNNLab uses a few).
pub const DEFAULT_PRESAMPLE_EPOCHS: u32 = 3;

/// Counts, per vertex, the pre-sampled batches whose bottom block touches it (the
/// protocol of the module doc). `train_ids` must be distinct vertices of `graph`.
pub fn presample_counts(
    graph: &CsrGraph,
    sampler: &NeighborSampler,
    train_ids: &[u32],
    batch_size: usize,
    epochs: u32,
    seed: u64,
    touch: Touch,
) -> Result<Vec<u32>> {
    let [counts] = presample_sides(graph, sampler, train_ids, batch_size, epochs, seed, [touch])?;
    Ok(counts)
}

/// [`presample_counts`] for several sides in one pre-sampling pass (the
/// batches are sampled once): one count per vertex per side, in `touches`' order.
pub fn presample_sides<const K: usize>(
    graph: &CsrGraph,
    sampler: &NeighborSampler,
    train_ids: &[u32],
    batch_size: usize,
    epochs: u32,
    seed: u64,
    touches: [Touch; K],
) -> Result<[Vec<u32>; K]> {
    presample_sides_with(
        &PresampleRun {
            graph,
            sampler,
            train_ids,
            batch_size,
            epochs,
            seed,
        },
        touches,
        &|_, _| {},
    )
}

/// What one pre-sampling pass runs: training's graph, sampler, vertices, batch
/// size and seed, over `epochs` epochs ([`presample_sides_with`]).
#[derive(Clone, Copy)]
pub struct PresampleRun<'a> {
    /// The graph training samples.
    pub graph: &'a CsrGraph,
    /// Training's sampler (its fanouts).
    pub sampler: &'a NeighborSampler,
    /// The training vertices.
    pub train_ids: &'a [u32],
    /// Training's batch size.
    pub batch_size: usize,
    /// Epochs to pre-sample (at least 1).
    pub epochs: u32,
    /// Training's seed.
    pub seed: u64,
}

/// [`presample_sides`], reporting progress to `progress` as `(done, total)`
/// pre-sampled batches: `(0, total)` first, then one report per batch in
/// order (serialized across threads, so `done` never decreases), the last
/// `(total, total)` when the pass succeeds. Large graphs spend seconds here
/// before the first epoch.
pub fn presample_sides_with<const K: usize>(
    run: &PresampleRun<'_>,
    touches: [Touch; K],
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<[Vec<u32>; K]> {
    let PresampleRun {
        graph,
        sampler,
        train_ids,
        batch_size,
        epochs,
        seed,
    } = *run;
    if batch_size == 0 {
        return Err(invalid("batch_size", "at least 1", 0));
    }
    if epochs == 0 {
        return Err(invalid("presample_epochs", "at least 1", 0));
    }
    let n = graph.num_vertices();
    if let Some(&bad) = train_ids.iter().find(|&&v| v as usize >= n) {
        return Err(SchedulerError::VertexOutOfRange {
            context: "training vertices",
            vertex: bad as u64,
            num_vertices: n,
        });
    }
    // 1. Every epoch's order, then every batch with its seed.
    let orders: Vec<Vec<u32>> = (0..epochs)
        .map(|epoch| {
            let mut order = train_ids.to_vec();
            Rng::new(derive_seed(seed, epoch as u64)).shuffle(&mut order);
            order
        })
        .collect();
    let batches: Vec<(u64, &[u32])> = orders
        .iter()
        .enumerate()
        .flat_map(|(epoch, order)| {
            let epoch_seed = derive_seed(seed, epoch as u64);
            order
                .chunks(batch_size)
                .enumerate()
                .map(move |(b, seeds)| (derive_seed(epoch_seed, b as u64 + 1), seeds))
        })
        .collect();
    let counts: [Vec<AtomicU32>; K] =
        std::array::from_fn(|_| (0..n).map(|_| AtomicU32::new(0)).collect());
    let total = batches.len() as u64;
    progress(0, total);
    // Batches done; reported under the lock so reports stay in order.
    let done = std::sync::Mutex::new(0u64);
    batches.par_iter().try_for_each_init(
        || (SamplerScratch::new(n), cpu_ops::SampledBatch::default()),
        |(scratch, batch), &(batch_seed, seeds)| -> Result<()> {
            // 2. Sample as training will.
            sampler.sample_into(graph, seeds, batch_seed, scratch, batch)?;
            // 3. Count each asked side of the bottom block.
            for (touch, counts) in touches.iter().zip(&counts) {
                let touched: &[u32] = match (touch, batch.blocks().first()) {
                    (Touch::BottomInputs, _) => batch.input_ids(),
                    (Touch::BottomOutputs, Some(bottom)) => bottom.dst_ids(),
                    (Touch::BottomOutputs, None) => batch.seeds(),
                };
                for &v in touched {
                    counts[v as usize].fetch_add(1, Ordering::Relaxed);
                }
            }
            let mut d = done
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *d += 1;
            progress(*d, total);
            Ok(())
        },
    )?;
    Ok(counts.map(|c| c.into_iter().map(AtomicU32::into_inner).collect()))
}

/// Degree scores: the number of stored neighbors of every vertex.
pub fn degree_scores(graph: &CsrGraph) -> Vec<u64> {
    graph
        .offsets()
        .as_slice()
        .windows(2)
        .map(|w| w[1] - w[0])
        .collect()
}

/// The vertices ordered hottest first: by score descending, ties by id ascending
/// (so the order is a deterministic permutation of `0..scores.len()`). Fails when
/// there are more scores than `u32` ids.
pub fn hotness_order<S: Ord + Copy>(scores: &[S]) -> Result<Vec<u32>> {
    let n = u32::try_from(scores.len())
        .map_err(|_| invalid("scores", "at most u32::MAX vertices", scores.len()))?;
    let mut order: Vec<u32> = (0..n).collect();
    order.sort_by(|&a, &b| scores[b as usize].cmp(&scores[a as usize]).then(a.cmp(&b)));
    Ok(order)
}

#[cfg(test)]
mod tests {
    use cpu_ops::{BuildOptions, ALL_NEIGHBORS};

    use super::*;

    /// A path 0-1-2-3-4-5 plus a chord 1-4 and an isolated vertex 6.
    fn small_graph() -> CsrGraph {
        let edges = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (1, 4)];
        CsrGraph::from_edges(7, &edges, BuildOptions::UNDIRECTED).unwrap()
    }

    /// Vertices within `hops` of `v` (itself included), by breadth-first search.
    fn ball(g: &CsrGraph, v: u32, hops: usize) -> Vec<u32> {
        let mut seen = vec![false; g.num_vertices()];
        seen[v as usize] = true;
        let mut frontier = vec![v];
        for _ in 0..hops {
            let mut next = Vec::new();
            for &u in &frontier {
                for &w in g.neighbors(u) {
                    if !seen[w as usize] {
                        seen[w as usize] = true;
                        next.push(w);
                    }
                }
            }
            frontier = next;
        }
        (0..g.num_vertices() as u32)
            .filter(|&u| seen[u as usize])
            .collect()
    }

    #[test]
    fn presample_counts_match_a_direct_count_with_full_fanout_single_seed_batches() {
        // With every neighbor taken and one seed per batch, a batch's bottom inputs
        // are exactly the seed's `layers`-hop ball, whatever the shuffle.
        let g = small_graph();
        let train = [0u32, 2, 5, 6];
        for layers in 1..=3 {
            let sampler = NeighborSampler::new(vec![ALL_NEIGHBORS; layers]).unwrap();
            let epochs = 4;
            let got =
                presample_counts(&g, &sampler, &train, 1, epochs, 9, Touch::BottomInputs).unwrap();
            let mut want = vec![0u32; 7];
            for &t in &train {
                for v in ball(&g, t, layers) {
                    want[v as usize] += epochs;
                }
            }
            assert_eq!(got, want, "layers {layers}");
            // Outputs of the bottom block: the (layers - 1)-hop ball.
            let got =
                presample_counts(&g, &sampler, &train, 1, epochs, 9, Touch::BottomOutputs).unwrap();
            let mut want = vec![0u32; 7];
            for &t in &train {
                for v in ball(&g, t, layers - 1) {
                    want[v as usize] += epochs;
                }
            }
            assert_eq!(got, want, "outputs, layers {layers}");
        }
    }

    #[test]
    fn presample_counts_do_not_depend_on_the_thread_count() {
        // 2,000 vertices, random edges, many batches: one thread and four give
        // the same counts.
        let mut rng = Rng::new(5);
        let edges: Vec<(u32, u32)> = (0..10_000)
            .map(|_| (rng.below(2000) as u32, rng.below(2000) as u32))
            .collect();
        let g = CsrGraph::from_edges(2000, &edges, BuildOptions::UNDIRECTED).unwrap();
        let train: Vec<u32> = (0..1500).collect();
        let sampler = NeighborSampler::new(vec![3, 5]).unwrap();
        let count = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| {
                    presample_counts(&g, &sampler, &train, 16, 3, 11, Touch::BottomInputs).unwrap()
                })
        };
        let one = count(1);
        assert!(one.iter().any(|&c| c > 0));
        assert_eq!(one, count(4));
    }

    #[test]
    fn presample_counts_match_a_direct_count_with_one_batch_per_epoch() {
        // One batch holding every training vertex: each vertex of the union of the
        // balls counts once per epoch.
        let g = small_graph();
        let train = [0u32, 3];
        let sampler = NeighborSampler::new(vec![ALL_NEIGHBORS; 2]).unwrap();
        let got = presample_counts(&g, &sampler, &train, 8, 3, 1, Touch::BottomInputs).unwrap();
        let mut want = vec![0u32; 7];
        let mut union: Vec<u32> = train.iter().flat_map(|&t| ball(&g, t, 2)).collect();
        union.sort_unstable();
        union.dedup();
        for v in union {
            want[v as usize] = 3;
        }
        assert_eq!(got, want);
    }

    #[test]
    fn presample_counts_equal_the_sampler_run_by_hand_with_small_fanouts() {
        // Random fanouts: replay the protocol of the module doc with the sampler.
        let g = small_graph();
        let train = [0u32, 1, 2, 3, 4, 5];
        let sampler = NeighborSampler::new(vec![1, 2]).unwrap();
        let got = presample_counts(&g, &sampler, &train, 4, 2, 77, Touch::BottomInputs).unwrap();
        let mut want = vec![0u32; 7];
        let mut scratch = SamplerScratch::new(7);
        for e in 0..2u64 {
            let es = derive_seed(77, e);
            let mut order = train.to_vec();
            Rng::new(es).shuffle(&mut order);
            for (b, seeds) in order.chunks(4).enumerate() {
                let batch = sampler
                    .sample(&g, seeds, derive_seed(es, b as u64 + 1), &mut scratch)
                    .unwrap();
                for &v in batch.input_ids() {
                    want[v as usize] += 1;
                }
            }
        }
        assert_eq!(got, want);
        // Every seed is its own input, once per batch it is in (once per epoch).
        for &t in &train {
            assert!(got[t as usize] >= 2, "{got:?}");
        }
        assert_eq!(got[6], 0);
    }

    #[test]
    fn presample_rejects_bad_input() {
        let g = small_graph();
        let s = NeighborSampler::new(vec![2]).unwrap();
        let e = presample_counts(&g, &s, &[0], 0, 1, 0, Touch::BottomInputs).unwrap_err();
        assert!(e.to_string().contains("batch_size"), "{e}");
        let e = presample_counts(&g, &s, &[0], 1, 0, 0, Touch::BottomInputs).unwrap_err();
        assert!(e.to_string().contains("presample_epochs"), "{e}");
        let e = presample_counts(&g, &s, &[9], 1, 1, 0, Touch::BottomInputs).unwrap_err();
        assert!(e.to_string().contains("vertex id 9"), "{e}");
        let e = presample_counts(&g, &s, &[1, 1], 2, 1, 0, Touch::BottomInputs).unwrap_err();
        assert!(matches!(e, SchedulerError::Sampling(_)), "{e}");
    }

    #[test]
    fn degree_order_is_a_valid_permutation_hottest_first() {
        let g = small_graph();
        let scores = degree_scores(&g);
        assert_eq!(scores, vec![1, 3, 2, 2, 3, 1, 0]);
        let order = hotness_order(&scores).unwrap();
        assert_eq!(order, vec![1, 4, 2, 3, 0, 5, 6]);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..7).collect::<Vec<_>>());
        assert!(order
            .windows(2)
            .all(|w| scores[w[0] as usize] >= scores[w[1] as usize]));
    }

    #[test]
    fn policy_names_parse_and_unknown_names_list_the_allowed_ones() {
        assert_eq!(
            "degree".parse::<HotnessPolicy>().unwrap(),
            HotnessPolicy::Degree
        );
        assert_eq!(
            HotnessPolicy::from_name("presample", 5).unwrap(),
            HotnessPolicy::PreSample {
                epochs: 5,
                touch: Touch::BottomInputs
            }
        );
        let e = "pagerank".parse::<HotnessPolicy>().unwrap_err();
        assert!(
            e.to_string()
                .contains("\"presample\" | \"degree\" | \"pcie\""),
            "{e}"
        );
        let e = HotnessPolicy::from_name("presample", 0).unwrap_err();
        assert!(e.to_string().contains("presample_epochs"), "{e}");
        let g = small_graph();
        let s = NeighborSampler::new(vec![2]).unwrap();
        let by_degree = HotnessPolicy::Degree.scores(&g, &s, &[], 1, 0).unwrap();
        assert_eq!(by_degree, degree_scores(&g));
        assert_eq!(
            HotnessPolicy::new(Hotness::Pcie, 2).unwrap(),
            HotnessPolicy::PcieValue {
                epochs: 2,
                cost: RowCost::REFERENCE
            }
        );
        assert!(HotnessPolicy::from_name("pcie", 0).is_err());
        let cost = RowCost::for_layer(100, 64, 4);
        assert_eq!(
            HotnessPolicy::new(Hotness::Pcie, 2)
                .unwrap()
                .with_row_cost(cost),
            HotnessPolicy::PcieValue { epochs: 2, cost }
        );
        assert_eq!(
            HotnessPolicy::Degree.with_row_cost(cost),
            HotnessPolicy::Degree
        );
    }

    fn random_graph() -> (CsrGraph, Vec<u32>) {
        let mut rng = Rng::new(9);
        // Skewed: a third of the edges land on the first 50 vertices.
        let edges: Vec<(u32, u32)> = (0..8_000)
            .map(|i| {
                let dst = if i % 3 == 0 {
                    rng.below(50)
                } else {
                    rng.below(1500)
                };
                (rng.below(1500) as u32, dst as u32)
            })
            .collect();
        let g = CsrGraph::from_edges(1500, &edges, BuildOptions::UNDIRECTED).unwrap();
        (g, (0..300).collect())
    }

    #[test]
    fn one_pass_over_both_sides_counts_what_two_passes_do() {
        let (g, train) = random_graph();
        let sampler = NeighborSampler::new(vec![4, 3]).unwrap();
        let both = [Touch::BottomInputs, Touch::BottomOutputs];
        let [ins, outs] = presample_sides(&g, &sampler, &train, 32, 2, 7, both).unwrap();
        let one = |t| presample_counts(&g, &sampler, &train, 32, 2, 7, t).unwrap();
        assert_eq!(ins, one(Touch::BottomInputs));
        assert_eq!(outs, one(Touch::BottomOutputs));
        assert_ne!(ins, outs);
    }

    #[test]
    fn pcie_scores_order_vertices_as_their_pcie_values_and_zero_saves_nothing() {
        let (g, train) = random_graph();
        let sampler = NeighborSampler::new(vec![4, 3]).unwrap();
        let policy = HotnessPolicy::from_name("pcie", 2).unwrap();
        assert!(policy.zero_is_cold());
        assert!(!HotnessPolicy::Degree.zero_is_cold());
        let scores = policy.scores(&g, &sampler, &train, 32, 7).unwrap();
        let one = |t| presample_counts(&g, &sampler, &train, 32, 2, 7, t).unwrap();
        let (ins, outs) = (one(Touch::BottomInputs), one(Touch::BottomOutputs));
        let values = crate::pcie_values(
            &g,
            &crate::ValueInputs {
                out_uses: &outs,
                in_uses: &ins,
                cached: &vec![false; g.num_vertices()],
                fanout: 4,
                row_bytes: 256,
                cost: RowCost::REFERENCE,
            },
        )
        .unwrap();
        // The same order as the values (row bytes scale them all alike), and
        // the vertices that save nothing are exactly those no batch needs.
        let order = hotness_order(&scores).unwrap();
        let saving = crate::pcie_value_order(&values);
        assert!(saving.len() > 100 && saving.len() < g.num_vertices());
        assert_eq!(&order[..saving.len()], &saving[..]);
        for v in 0..g.num_vertices() {
            assert_eq!(scores[v] == 0, outs[v] == 0, "vertex {v}");
        }
        // Not the touch-count order: the value weighs what a vertex alone saves.
        let by_touch = hotness_order(&ins).unwrap();
        assert_ne!(&order[..100], &by_touch[..100]);
    }

    /// Progress reports start at `(0, total)`, never decrease (the pass runs
    /// on several threads) and end at `(total, total)`, one per batch; the
    /// counts are those of the pass without a sink.
    #[test]
    fn presample_progress_is_monotone_and_ends_at_the_total() {
        let g = small_graph();
        let sampler = NeighborSampler::new(vec![2, 2]).unwrap();
        let train: Vec<u32> = (0..7).collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let seen = std::sync::Mutex::new(Vec::new());
        let sink = |done: u64, total: u64| seen.lock().unwrap().push((done, total));
        let got = pool
            .install(|| {
                presample_sides_with(
                    &PresampleRun {
                        graph: &g,
                        sampler: &sampler,
                        train_ids: &train,
                        batch_size: 2,
                        epochs: 3,
                        seed: 5,
                    },
                    [Touch::BottomInputs],
                    &sink,
                )
            })
            .unwrap();
        let seen = seen.into_inner().unwrap();
        // 3 epochs of ceil(7 / 2) = 4 batches.
        let total = 12;
        assert_eq!(seen.len(), total as usize + 1);
        assert_eq!(seen[0], (0, total));
        assert_eq!(*seen.last().unwrap(), (total, total));
        assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0 && w[1].1 == total));
        let plain = presample_counts(&g, &sampler, &train, 2, 3, 5, Touch::BottomInputs).unwrap();
        assert_eq!(got[0], plain);
        // Through the policy; degree order has no pass and reports nothing.
        let mut reports = 0;
        let count = std::sync::Mutex::new(&mut reports);
        let policy = HotnessPolicy::new(Hotness::Presample, 2).unwrap();
        policy
            .scores_with(&g, &sampler, &train, 2, 5, &|_, _| {
                **count.lock().unwrap() += 1
            })
            .unwrap();
        assert_eq!(reports, 2 * 4 + 1);
        let mut none = 0;
        let count = std::sync::Mutex::new(&mut none);
        HotnessPolicy::Degree
            .scores_with(&g, &sampler, &train, 2, 5, &|_, _| {
                **count.lock().unwrap() += 1
            })
            .unwrap();
        assert_eq!(none, 0);
    }
}
