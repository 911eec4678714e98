//! Parity: neighbor sampling and first-occurrence relabelling.

use std::collections::{HashMap, HashSet};

use cpu_ops::{
    derive_seed, AggregateKind, BuildOptions, CsrGraph, NeighborSampler, Rng, SamplerScratch,
    ALL_NEIGHBORS,
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

/// `sample_queued` + `resolve_queued` of several batches: the blocks `sample`
/// makes for each, with one synchronization for the whole group (and none to
/// queue them); a bad seed is an error when queued, a group of none is empty.
pub(crate) fn queued_batches_resolve_to_sampled_ones_in_one_read<B: Backend>(d: &B) {
    let mut rng = Rng::new(15);
    let g = random_graph(&mut rng, 500, 4000);
    let dg = d.load_graph(&g, TopologyPlacement::Device).unwrap();
    let fanouts = [5u32, 3, 4];
    let batches: Vec<(Vec<u32>, u64)> = (0..5u64)
        .map(|k| {
            let mut s: Vec<u32> = (0..500).collect();
            rng.shuffle(&mut s);
            s.truncate(1 + 20 * k as usize);
            (s, 40 + k)
        })
        .collect();
    let before = d.transfer_stats();
    let queued: Vec<B::Queued> = batches
        .iter()
        .map(|(s, k)| d.sample_queued(&dg, s, &fanouts, *k).unwrap())
        .collect();
    assert_eq!(
        d.transfer_stats().since(&before).syncs,
        0,
        "queueing synchronized"
    );
    let resolved = d.resolve_queued(queued).unwrap();
    assert_eq!(
        d.transfer_stats().since(&before).syncs,
        1,
        "one read for the group"
    );
    assert_eq!(resolved.len(), batches.len());
    for ((seeds, k), got) in batches.iter().zip(&resolved) {
        let want = d.sample(&dg, seeds, &fanouts, *k).unwrap();
        assert_eq!(got.num_seeds, seeds.len());
        for l in 0..fanouts.len() {
            let shape = d.block_shape(&got.blocks[l]);
            assert_eq!(shape, d.block_shape(&want.blocks[l]), "layer {l}");
            assert_eq!(
                d.block_to_host(&got.blocks[l]).unwrap(),
                d.block_to_host(&want.blocks[l]).unwrap(),
                "layer {l}"
            );
            assert_eq!(
                down(d, &got.src_ids[l], shape.0),
                down(d, &want.src_ids[l], shape.0),
                "layer {l}: sources"
            );
        }
    }
    assert!(d.sample_queued(&dg, &[500], &fanouts, 1).is_err());
    assert!(d.sample_queued(&dg, &[3, 3], &fanouts, 1).is_err());
    assert!(d.resolve_queued(Vec::new()).unwrap().is_empty());
}

/// Layers `1..` of a batch, queued (`sample_queued_from`) and read with one
/// synchronization (`read_queued`, then `finish_read` on another thread), are
/// the blocks hop-by-hop `sample_hop` with `derive_seed(seed, l)` makes — so
/// the layer path's top layers are the same sampled ahead or hop by hop — and
/// `sample`'s blocks `1..`, with block 0's destinations on the host; on random
/// graphs, seeds, fanouts and batch sizes, on the backend and on its sampling
/// sibling.
pub(crate) fn top_layers_read_ahead_equal_hop_by_hop<B: Backend>(d: &B) {
    let mut rng = Rng::new(23);
    let sibling = d.sampling_sibling().unwrap();
    for case in 0..6u64 {
        let g = random_graph(&mut rng, 300 + 40 * case as usize, 2500);
        let n = g.num_vertices();
        let dg = d.load_graph(&g, TopologyPlacement::Device).unwrap();
        // The sibling reads the graph once its upload is done.
        d.synchronize(d.stream()).unwrap();
        let layers = 2 + rng.below(3) as usize;
        let fanouts: Vec<u32> = (0..layers)
            .map(|_| match rng.below(6) {
                0 => ALL_NEIGHBORS,
                f => f as u32,
            })
            .collect();
        let batches: Vec<(Vec<u32>, u64)> = (0..1 + rng.below(5))
            .map(|_| {
                let mut s: Vec<u32> = (0..n as u32).collect();
                rng.shuffle(&mut s);
                s.truncate(1 + rng.below(40) as usize);
                (s, rng.next_u64())
            })
            .collect();
        // Queued and read on the backend itself, then on its sibling (adopted).
        let samplers: Vec<&B> = std::iter::once(d).chain(sibling.as_ref()).collect();
        for (si, s) in samplers.into_iter().enumerate() {
            let what = format!("case {case}, fanouts {fanouts:?}, sampler {si}");
            // Both backends' counts (once when the backend samples itself).
            let stats = || match si {
                0 => d.transfer_stats(),
                _ => d.transfer_stats().plus(&s.transfer_stats()),
            };
            let before = stats();
            let syncs = || stats().since(&before).syncs;
            let queued: Vec<B::Queued> = batches
                .iter()
                .map(|(seeds, k)| s.sample_queued_from(&dg, seeds, &fanouts, 1, *k).unwrap())
                .collect();
            let reading = s.read_queued(queued).unwrap();
            assert_eq!(
                syncs(),
                0,
                "{what}: queueing or starting the read synchronized"
            );
            let read = std::thread::scope(|t| t.spawn(|| s.finish_read(reading)).join())
                .unwrap()
                .unwrap();
            assert_eq!(syncs(), 1, "{what}: one read for the group");
            assert_eq!(read.len(), batches.len());
            for ((seeds, k), (mut got, bottom)) in batches.iter().zip(read) {
                if si > 0 {
                    d.adopt_batch(s, &mut got).unwrap();
                }
                assert_eq!(got.num_seeds, seeds.len());
                assert_eq!(got.blocks.len(), layers - 1, "{what}");
                let whole = d.sample(&dg, seeds, &fanouts, *k).unwrap();
                let mut frontier = d.to_device(seeds).unwrap();
                let mut n_dst = seeds.len();
                for l in (1..layers).rev() {
                    let (block, src, ns) = d
                        .sample_hop(
                            &dg,
                            &frontier,
                            n_dst,
                            fanouts[l],
                            derive_seed(*k, l as u64),
                            None,
                        )
                        .unwrap();
                    let b = &got.blocks[l - 1];
                    assert_eq!(d.block_shape(b), d.block_shape(&block), "{what}: layer {l}");
                    assert_eq!(
                        d.block_to_host(b).unwrap(),
                        d.block_to_host(&block).unwrap(),
                        "{what}: layer {l}"
                    );
                    assert_eq!(
                        d.block_to_host(b).unwrap(),
                        d.block_to_host(&whole.blocks[l]).unwrap(),
                        "{what}: layer {l} of sample"
                    );
                    let src_host = down(d, &src, ns);
                    assert_eq!(
                        down(d, &got.src_ids[l - 1], ns),
                        src_host,
                        "{what}: layer {l}"
                    );
                    if l == 1 {
                        assert_eq!(bottom, src_host, "{what}: bottom destinations");
                    }
                    frontier = src;
                    n_dst = ns;
                }
            }
        }
    }
    // A read of nothing waits for nothing; bad layers and seeds fail when queued.
    let g = random_graph(&mut rng, 100, 500);
    let dg = d.load_graph(&g, TopologyPlacement::Device).unwrap();
    d.synchronize(d.stream()).unwrap();
    let before = d.transfer_stats();
    let empty = d.read_queued(Vec::new()).unwrap();
    assert!(d.finish_read(empty).unwrap().is_empty());
    assert_eq!(d.transfer_stats().since(&before).syncs, 0);
    assert!(d.sample_queued_from(&dg, &[1, 2], &[3, 4], 2, 1).is_err());
    assert!(d.sample_queued_from(&dg, &[1, 2], &[3, 0], 1, 1).is_err());
    assert!(d.sample_queued_from(&dg, &[100], &[3, 4], 1, 1).is_err());
    assert!(d.sample_queued_from(&dg, &[5, 5], &[3, 4], 1, 1).is_err());
    // A fanout of 0 below `from` is never sampled.
    assert!(d.sample_queued_from(&dg, &[1, 2], &[0, 4], 1, 1).is_ok());
    if let (DeviceKind::Cuda, Some(s)) = (d.kind(), sibling.as_ref()) {
        // Only the backend whose stream copies may finish its read.
        let q = s.sample_queued_from(&dg, &[1, 2], &[3, 4], 1, 1).unwrap();
        let r = s.read_queued(vec![q]).unwrap();
        assert!(d.finish_read(r).is_err());
    }
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

/// A block read back: `(src_ids, indptr, indices)`.
fn block_on_host<B: Backend>(d: &B, block: &B::Block, src: &B::Buf<u32>) -> HostHop {
    let (ns, nd, ne) = d.block_shape(block);
    let (indptr, indices) = d.block_to_host(block).unwrap();
    assert_eq!((indptr.len(), indices.len()), (nd + 1, ne));
    HostHop {
        num_dst: nd,
        src: down(d, src, ns),
        indptr,
        indices,
    }
}

/// A sampled hop on the host, for comparisons.
#[derive(Debug, PartialEq)]
struct HostHop {
    num_dst: usize,
    src: Vec<u32>,
    indptr: Vec<u64>,
    indices: Vec<u32>,
}

impl HostHop {
    /// Global ids of destination `i`'s sampled neighbors.
    fn row(&self, i: usize) -> Vec<u32> {
        let (a, b) = (self.indptr[i] as usize, self.indptr[i + 1] as usize);
        self.indices[a..b]
            .iter()
            .map(|&l| self.src[l as usize])
            .collect()
    }
}

pub(crate) fn sample_hop_reproduces_sample<B: Backend>(d: &B) {
    let mut rng = Rng::new(16);
    let g = random_graph(&mut rng, 400, 3000);
    let dg = d.load_graph(&g, TopologyPlacement::Device).unwrap();
    let mut seeds: Vec<u32> = (0..400).collect();
    rng.shuffle(&mut seeds);
    let seeds = &seeds[..31];
    for (fanouts, seed) in [
        (vec![6u32], 5u64),
        (vec![4, 3], 99),
        (vec![ALL_NEIGHBORS, 2], 7),
        (vec![1, 1, 5], 1234),
    ] {
        let batch = d.sample(&dg, seeds, &fanouts, seed).unwrap();
        // Destinations in a padded buffer: only the prefix counts.
        let mut dst = input_u32(d, seeds, 399);
        let mut n_dst = seeds.len();
        let mut host_dst = seeds.to_vec();
        for l in (0..fanouts.len()).rev() {
            let ls = derive_seed(seed, l as u64);
            let (block, src, n_src) = d
                .sample_hop(&dg, &dst, n_dst, fanouts[l], ls, None)
                .unwrap();
            let got = block_on_host(d, &block, &src);
            assert_eq!(got.src.len(), n_src);
            let want = block_on_host(d, &batch.blocks[l], &batch.src_ids[l]);
            assert_eq!(got, want, "{fanouts:?} layer {l}: hop vs sample");
            assert_eq!(&got.src[..n_dst], &host_dst[..], "destinations first");
            if d.kind() == DeviceKind::Host {
                let hop = cpu_ops::sample_hop(
                    &g,
                    &host_dst,
                    fanouts[l],
                    ls,
                    None,
                    &mut SamplerScratch::new(0),
                )
                .unwrap();
                assert_eq!(got.src, hop.src_ids());
                assert_eq!(got.indptr, hop.indptr());
                assert_eq!(got.indices, hop.indices());
            }
            host_dst = got.src;
            dst = src;
            n_dst = n_src;
        }
    }
}

pub(crate) fn sample_hop_skip_mask<B: Backend>(d: &B) {
    let mut rng = Rng::new(17);
    let g = random_graph(&mut rng, 600, 5000);
    let dg = d.load_graph(&g, TopologyPlacement::Device).unwrap();
    let mut pool: Vec<u32> = (0..600).collect();
    rng.shuffle(&mut pool);
    for (case, (n, fanout, p_skip)) in [
        (1usize, 3u32, 1.0f64),
        (97, 4, 0.4),
        (300, ALL_NEIGHBORS, 0.6),
        (290, 2, 0.0),
        (200, 9, 1.0),
    ]
    .into_iter()
    .enumerate()
    {
        let ids = &pool[..n];
        let skip: Vec<u8> = (0..n)
            .map(|_| {
                if rng.next_f64() < p_skip {
                    1 + rng.below(255) as u8
                } else {
                    0
                }
            })
            .collect();
        // Padding of the mask is set: it must be ignored.
        let mut padded = skip.clone();
        padded.extend([1u8; PAD]);
        let mask = d.to_device(&padded).unwrap();
        let dst = input_u32(d, ids, 0);
        let ls = derive_seed(31 + case as u64, 0);
        let (b_full, s_full, _) = d.sample_hop(&dg, &dst, n, fanout, ls, None).unwrap();
        let full = block_on_host(d, &b_full, &s_full);
        let (b_mask, s_mask, n_src) = d.sample_hop(&dg, &dst, n, fanout, ls, Some(&mask)).unwrap();
        let masked = block_on_host(d, &b_mask, &s_mask);
        assert_eq!(masked.num_dst, n);
        assert_eq!(masked.src.len(), n_src);
        // Expected sources: the destinations, then what the unskipped rows of the
        // unmasked hop read, in first-occurrence order.
        let mut want_src = ids.to_vec();
        let mut seen: HashSet<u32> = ids.iter().copied().collect();
        for (i, &flag) in skip.iter().enumerate() {
            let row = masked.row(i);
            if flag != 0 {
                assert!(
                    row.is_empty(),
                    "case {case}: skipped destination {i} has edges"
                );
                continue;
            }
            let want = full.row(i);
            assert_eq!(row, want, "case {case}: destination {i}");
            for v in want {
                if seen.insert(v) {
                    want_src.push(v);
                }
            }
        }
        assert_eq!(masked.src, want_src, "case {case}: sources");
        if p_skip == 0.0 {
            assert_eq!(masked, full, "case {case}: an all-zero mask is no mask");
        }
        if p_skip == 1.0 {
            assert_eq!((masked.src.len(), masked.indices.len()), (n, 0));
        }
        if d.kind() == DeviceKind::Host {
            let hop = cpu_ops::sample_hop(
                &g,
                ids,
                fanout,
                ls,
                Some(&skip),
                &mut SamplerScratch::new(0),
            )
            .unwrap();
            assert_eq!(masked.src, hop.src_ids());
            assert_eq!(masked.indptr, hop.indptr());
        }
    }
}

pub(crate) fn sample_hop_errors<B: Backend>(d: &B) {
    let mut rng = Rng::new(18);
    let g = random_graph(&mut rng, 100, 600);
    let dg = d.load_graph(&g, TopologyPlacement::Device).unwrap();
    let dst = d.to_device(&[5u32, 9, 2, 40]).unwrap();
    let mask3 = d.to_device(&[0u8, 1, 0]).unwrap();
    assert_size_mismatch("n_dst > dst", d.sample_hop(&dg, &dst, 5, 3, 0, None));
    assert_size_mismatch(
        "skip < n_dst",
        d.sample_hop(&dg, &dst, 4, 3, 0, Some(&mask3)),
    );
    assert!(d.sample_hop(&dg, &dst, 4, 0, 0, None).is_err(), "fanout 0");
    let repeated = d.to_device(&[5u32, 9, 5]).unwrap();
    assert!(
        d.sample_hop(&dg, &repeated, 3, 3, 0, None).is_err(),
        "repeated destination"
    );
    let outside = d.to_device(&[5u32, 100]).unwrap();
    assert!(
        d.sample_hop(&dg, &outside, 2, 3, 0, None).is_err(),
        "destination outside the graph"
    );
    // Prefixes: a 3-flag mask serves 3 destinations; nothing is left behind by the
    // failed calls, and an empty hop is an empty block.
    let (b, _, n_src) = d.sample_hop(&dg, &dst, 3, 3, 0, Some(&mask3)).unwrap();
    let (_, nd, _) = d.block_shape(&b);
    assert_eq!(nd, 3);
    assert!(n_src >= 3);
    let (b, _, n_src) = d.sample_hop(&dg, &dst, 0, 3, 0, None).unwrap();
    assert_eq!((d.block_shape(&b), n_src), ((0, 0, 0), 0));
    assert_eq!(d.block_to_host(&b).unwrap().0, vec![0]);
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

/// `sample_hop_queued` (the layer path's bottom hop sampled a super-batch
/// ahead) is `sample_hop` with the same arguments, bit for bit, masked or not:
/// queued without a synchronization, read with the top layers' kind of one
/// read for the group (`read_queued` / `finish_read` on another thread, no
/// ids copied back) or with `resolve_queued` (one synchronization); on the backend and on its
/// sampling sibling (the destinations and the mask written on its stream,
/// the hops adopted). A read of hops only is finished with one event wait,
/// no synchronization. Bad arguments fail when queued.
#[allow(clippy::type_complexity)]
pub(crate) fn queued_hops_equal_sample_hop<B: Backend>(d: &B) {
    let mut rng = Rng::new(29);
    let g = random_graph(&mut rng, 500, 4000);
    let dg = d.load_graph(&g, TopologyPlacement::Device).unwrap();
    d.synchronize(d.stream()).unwrap();
    let sibling = d.sampling_sibling().unwrap();
    let samplers: Vec<&B> = std::iter::once(d).chain(sibling.as_ref()).collect();
    for (si, s) in samplers.into_iter().enumerate() {
        let hops: Vec<(Vec<u32>, Option<Vec<u8>>, u32, u64)> = (0..4)
            .map(|h| {
                let mut ids: Vec<u32> = (0..500).collect();
                rng.shuffle(&mut ids);
                ids.truncate(1 + rng.below(150) as usize);
                let mask = (h % 2 == 1).then(|| {
                    ids.iter()
                        .map(|_| u8::from(rng.next_f64() < 0.4))
                        .collect::<Vec<u8>>()
                });
                let fanout = if h == 2 { ALL_NEIGHBORS } else { 1 + h as u32 };
                (ids, mask, fanout, rng.next_u64())
            })
            .collect();
        for resolve in [false, true] {
            let what = format!("sampler {si}, resolve {resolve}");
            // Both backends' counts (once when the backend samples itself).
            let stats = || match si {
                0 => d.transfer_stats(),
                _ => d.transfer_stats().plus(&s.transfer_stats()),
            };
            // Inputs on the sampler's own stream, as the layer path writes them.
            let inputs: Vec<(B::Buf<u32>, Option<B::Buf<u8>>)> = hops
                .iter()
                .map(|(ids, mask, _, _)| {
                    let dst = s.to_device(ids).unwrap();
                    let m = mask.as_ref().map(|m| s.to_device(m).unwrap());
                    (dst, m)
                })
                .collect();
            let before = stats();
            let syncs = || stats().since(&before).syncs;
            let queued: Vec<B::Queued> = hops
                .iter()
                .zip(&inputs)
                .map(|((ids, _, fanout, key), (dst, m))| {
                    s.sample_hop_queued(&dg, dst, ids.len(), *fanout, *key, m.as_ref())
                        .unwrap()
                })
                .collect();
            assert_eq!(syncs(), 0, "{what}: queued without a synchronization");
            let got: Vec<_> = if resolve {
                s.resolve_queued(queued).unwrap()
            } else {
                let reading = s.read_queued(queued).unwrap();
                assert_eq!(syncs(), 0, "{what}: the read started without one");
                let read = std::thread::scope(|t| t.spawn(|| s.finish_read(reading)).join())
                    .unwrap()
                    .unwrap();
                read.into_iter()
                    .map(|(b, ids)| {
                        assert!(ids.is_empty(), "{what}: no ids copied back for a hop");
                        b
                    })
                    .collect()
            };
            // resolve_queued synchronizes once; a read of hops only waits
            // for its copies' event instead.
            let waits = stats().since(&before).event_waits;
            match resolve {
                true => assert_eq!((syncs(), waits), (1, 0), "{what}: one read"),
                false => assert_eq!((syncs(), waits), (0, 1), "{what}: one event wait"),
            }
            for (((ids, mask, fanout, key), mut batch), (dst, m)) in
                hops.iter().zip(got).zip(&inputs)
            {
                if si > 0 {
                    d.adopt_batch(s, &mut batch).unwrap();
                }
                assert_eq!(
                    (batch.blocks.len(), batch.src_ids.len(), batch.num_seeds),
                    (1, 1, ids.len()),
                    "{what}"
                );
                let (block, src, ns) = s
                    .sample_hop(&dg, dst, ids.len(), *fanout, *key, m.as_ref())
                    .unwrap();
                let b = &batch.blocks[0];
                assert_eq!(d.block_shape(b), s.block_shape(&block), "{what}");
                assert_eq!(d.block_shape(b).0, ns, "{what}");
                assert_eq!(
                    d.block_to_host(b).unwrap(),
                    s.block_to_host(&block).unwrap(),
                    "{what}, mask {}",
                    mask.is_some()
                );
                assert_eq!(down(d, &batch.src_ids[0], ns), down(s, &src, ns), "{what}");
            }
        }
    }
    // What the host can check fails when queued.
    let dst = d.to_device(&[1u32, 2, 3]).unwrap();
    let short = d.to_device(&[0u8; 2]).unwrap();
    assert!(d.sample_hop_queued(&dg, &dst, 3, 0, 1, None).is_err());
    assert!(d.sample_hop_queued(&dg, &dst, 4, 2, 1, None).is_err());
    assert!(d
        .sample_hop_queued(&dg, &dst, 3, 2, 1, Some(&short))
        .is_err());
}
