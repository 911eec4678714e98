//! Parity: neighbor sampling and first-occurrence relabelling.

use std::collections::{HashMap, HashSet};

use cpu_ops::{
    AggregateKind, BuildOptions, CsrGraph, NeighborSampler, Rng, SamplerScratch, ALL_NEIGHBORS,
};
use gpu_ops::{Backend, DeviceKind, TopologyPlacement};

use crate::helpers::*;

/// A random undirected simple graph with degrees from 0 to a few dozen.
pub(crate) fn random_graph(rng: &mut Rng, n: usize, edges: usize) -> CsrGraph {
    let e: Vec<(u32, u32)> = (0..edges)
        .map(|_| {
            // Skewed: low ids are hubs.
            let s = (rng.below(n as u64) * rng.below(n as u64) / n as u64) as u32;
            (s, rng.below(n as u64) as u32)
        })
        .collect();
    CsrGraph::from_edges(n, &e, BuildOptions::UNDIRECTED).unwrap()
}

/// Edge counts of a block as a dense `num_dst × num_src` matrix, read through the
/// backend: `Sum` aggregation of the identity.
pub(crate) fn block_counts<B: Backend>(d: &B, block: &B::Block) -> Vec<f32> {
    let (ns, nd, _) = d.block_shape(block);
    let mut eye = vec![0.0f32; ns * ns];
    for j in 0..ns {
        eye[j * ns + j] = 1.0;
    }
    let mut out = d.alloc::<f32>(nd * ns).unwrap();
    d.aggregate_forward(
        block,
        AggregateKind::Sum,
        &d.to_device(&eye).unwrap(),
        ns,
        &mut out,
    )
    .unwrap();
    down(d, &out, nd * ns)
}

pub(crate) fn sampling_structure<B: Backend>(d: &B) {
    let mut rng = Rng::new(14);
    let g = random_graph(&mut rng, 400, 3000);
    let dg = d.load_graph(&g, TopologyPlacement::Device).unwrap();
    let mut seeds: Vec<u32> = (0..400).collect();
    rng.shuffle(&mut seeds);
    let seeds = &seeds[..23];
    for fanouts in [vec![4u32, 3], vec![ALL_NEIGHBORS, 2], vec![1, 1, 5]] {
        let batch = d.sample(&dg, seeds, &fanouts, 99).unwrap();
        assert_eq!(batch.num_seeds, seeds.len());
        assert_eq!(batch.blocks.len(), fanouts.len());
        assert_eq!(batch.src_ids.len(), fanouts.len());
        let mut above: Vec<u32> = seeds.to_vec();
        for l in (0..fanouts.len()).rev() {
            let (ns, nd, ne) = d.block_shape(&batch.blocks[l]);
            let src = down(d, &batch.src_ids[l], ns);
            assert_eq!(nd, above.len(), "layer {l}: destinations");
            assert_eq!(
                &src[..nd],
                &above[..],
                "layer {l}: destinations are the first sources"
            );
            assert_eq!(
                src.iter().collect::<HashSet<_>>().len(),
                ns,
                "layer {l}: distinct sources"
            );
            let counts = block_counts(d, &batch.blocks[l]);
            let mut edges = 0;
            let mut read_by_some = vec![false; ns];
            for i in 0..nd {
                let v = src[i];
                let mut picked = HashSet::new();
                for j in 0..ns {
                    let c = counts[i * ns + j];
                    assert!(
                        c == 0.0 || c == 1.0,
                        "layer {l}: dst {v} reads a source {c} times"
                    );
                    if c == 1.0 {
                        let u = src[j];
                        assert!(
                            g.neighbors(v).contains(&u),
                            "layer {l}: {u} → {v} is not an edge"
                        );
                        picked.insert(u);
                        read_by_some[j] = true;
                    }
                }
                let want = g.degree(v).min(fanouts[l] as usize);
                assert_eq!(
                    picked.len(),
                    want,
                    "layer {l}: dst {v} with degree {}",
                    g.degree(v)
                );
                edges += picked.len();
            }
            assert_eq!(edges, ne);
            assert!(
                read_by_some[nd..].iter().all(|&r| r),
                "layer {l}: a source no edge reads"
            );
            above = src;
        }
        // Another seed draws another sample (degrees exceed the fanouts here).
        let other = d.sample(&dg, seeds, &fanouts, 100).unwrap();
        if fanouts[fanouts.len() - 1] != ALL_NEIGHBORS {
            let top = fanouts.len() - 1;
            let ns = d.block_shape(&batch.blocks[top]).0;
            let ns2 = d.block_shape(&other.blocks[top]).0;
            let c1 = block_counts(d, &batch.blocks[top]);
            let c2 = block_counts(d, &other.blocks[top]);
            let a = down(d, &batch.src_ids[top], ns);
            let b = down(d, &other.src_ids[top], ns2);
            assert!(
                ns != ns2 || a != b || c1 != c2,
                "seeds 99 and 100 sampled the same block"
            );
        }
        if d.kind() == DeviceKind::Host {
            // Deterministic per seed, and exactly cpu_ops' sample.
            let again = d.sample(&dg, seeds, &fanouts, 99).unwrap();
            let sampler = NeighborSampler::new(fanouts.clone()).unwrap();
            let want = sampler
                .sample(&g, seeds, 99, &mut SamplerScratch::new(400))
                .unwrap();
            for l in 0..fanouts.len() {
                let ns = d.block_shape(&batch.blocks[l]).0;
                assert_eq!(down(d, &batch.src_ids[l], ns), want.blocks()[l].src_ids());
                assert_eq!(down(d, &again.src_ids[l], ns), want.blocks()[l].src_ids());
                assert_eq!(
                    block_counts(d, &batch.blocks[l]),
                    block_counts(d, &again.blocks[l])
                );
            }
        }
    }
    // Bad seeds and fanouts are errors.
    assert!(d.sample(&dg, &[400], &[2], 0).is_err());
    assert!(d.sample(&dg, &[3, 3], &[2], 0).is_err());
    assert!(d.sample(&dg, &[3], &[], 0).is_err());
    assert!(d.sample(&dg, &[3], &[0], 0).is_err());
}

pub(crate) fn unique_relabel_contract<B: Backend>(d: &B) {
    let mut rng = Rng::new(15);
    for (nt, nc, range) in [
        (0, 0, 10),
        (1, 0, 10),
        (0, 9, 4),
        (17, 301, 90),
        (200, 5000, 100_000),
    ] {
        let mut pool: Vec<u32> = (0..range).collect();
        rng.shuffle(&mut pool);
        let targets = pool[..nt].to_vec();
        let cands: Vec<u32> = (0..nc).map(|_| rng.below(range as u64) as u32).collect();
        // The reference: targets first, then first occurrences.
        let mut pos: HashMap<u32, u32> = HashMap::new();
        let mut unique = Vec::new();
        for &t in &targets {
            pos.insert(t, unique.len() as u32);
            unique.push(t);
        }
        let local: Vec<u32> = cands
            .iter()
            .map(|&c| {
                *pos.entry(c).or_insert_with(|| {
                    unique.push(c);
                    unique.len() as u32 - 1
                })
            })
            .collect();
        let (u, l, n) = d
            .unique_relabel(&input_u32(d, &targets, 7), nt, &input_u32(d, &cands, 7), nc)
            .unwrap();
        assert_eq!(n, unique.len());
        let (u, l) = (down(d, &u, n), down(d, &l, nc));
        assert_eq!(u, unique);
        assert_eq!(l, local);
        for (c, &k) in cands.iter().zip(&l) {
            assert_eq!(u[k as usize], *c, "local ids point at their ids");
        }
    }
}
