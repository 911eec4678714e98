//! Tests of what only the CUDA backend has: the caching allocator, copies on a second
//! stream into recycled blocks, device faults reported at the next synchronization,
//! zero-copy topology, multi-level scans, Floyd sampling on high-degree vertices, and
//! reproducibility per seed. The op-by-op comparison with the host reference is
//! `parity.rs`.
//!
//! Every test needs a GPU: without one (or without the CUDA libraries, or without the
//! `cuda` feature) each prints `skipped: <reason>` and passes.
// Without the feature every handle type is uninhabited, so code after the first
// backend call is statically unreachable.
#![cfg_attr(
    not(feature = "cuda"),
    allow(unreachable_code, unused_variables, unused_mut)
)]

use std::collections::{HashMap, HashSet};

use cpu_ops::{AggregateKind, BuildOptions, CsrGraph, Rng, ALL_NEIGHBORS};
use gpu_ops::prelude::*;
use gpu_ops::{CudaBackend, GpuOpsError, TopologyPlacement};

/// A backend of this test's own (tests run in parallel: a shared backend would
/// mix their allocator statistics and device-side errors), or `None` with the
/// reason printed.
fn dev() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(d) => Some(d),
        Err(reason) => {
            println!("skipped: {reason}");
            None
        }
    }
}

#[test]
fn dropped_buffers_are_reused_not_freed() {
    let Some(d) = dev() else { return };
    d.warm_up().unwrap();
    let len = 777_777usize;
    {
        let _first = d.alloc::<f32>(len).unwrap();
    }
    let before = d.allocator_stats();
    for _ in 0..10 {
        let b = d.alloc::<f32>(len).unwrap();
        assert_eq!(
            d.to_host::<f32>(&b, 3).unwrap(),
            vec![0.0; 3],
            "recycled blocks are zeroed"
        );
    }
    let after = d.allocator_stats();
    assert!(after.reuses >= before.reuses + 10, "{before:?} → {after:?}");
    assert!(after.cached_bytes >= len * 4);
    let freed = d.release_cached_memory().unwrap();
    assert!(freed >= len * 4);
    assert_eq!(d.allocator_stats().cached_bytes, 0);
}

#[test]
fn uploads_on_a_copy_stream_land_after_the_zeroing() {
    let Some(d) = dev() else { return };
    let copy = d.new_stream().unwrap();
    let mut rng = Rng::new(1);
    for round in 0..20 {
        let n = 100_000 + round;
        let v: Vec<u32> = (0..n).map(|_| rng.next_u32()).collect();
        // A recycled block: the memset on the compute stream must not overwrite the
        // upload on the copy stream.
        let mut b = d.alloc::<u32>(n).unwrap();
        d.upload(&copy, &v, &mut b).unwrap();
        let e = d.record_event(&copy).unwrap();
        d.wait_event(d.stream(), &e).unwrap();
        assert_eq!(d.to_host::<u32>(&b, n).unwrap(), v, "round {round}");
    }
}

#[test]
fn a_bad_row_index_is_reported_at_the_next_synchronization() {
    let Some(d) = dev() else { return };
    let src = d.to_device(&[1.0f32, 2.0, 3.0, 4.0]).unwrap(); // 2 rows of 2
    let idx = d.to_device(&[1u32, 5]).unwrap();
    let mut out = d.alloc::<f32>(4).unwrap();
    d.index_select_rows(&src, 2, &idx, 2, &mut out).unwrap();
    match d.synchronize(d.stream()) {
        Err(GpuOpsError::InvalidArgument { name, reason }) => {
            assert_eq!(name, "idx");
            assert!(
                reason.contains('5') && reason.contains("row count 2"),
                "{reason}"
            );
        }
        other => panic!("expected the device fault, got {other:?}"),
    }
    // Reported once; the good row was copied and the bad one zeroed.
    d.synchronize(d.stream()).unwrap();
    assert_eq!(d.to_host::<f32>(&out, 4).unwrap(), vec![3.0, 4.0, 0.0, 0.0]);
}

#[test]
fn relabel_handles_every_id_and_multi_level_scans() {
    let Some(d) = dev() else { return };
    let mut rng = Rng::new(2);
    // 3 M positions: a multi-tile scan (184 tiles of 16,384; their totals in one
    // block, then the add pass).
    let targets: Vec<u32> = vec![u32::MAX, 0, 17];
    let cands: Vec<u32> = (0..3_000_000)
        .map(|i| match i % 5 {
            0 => u32::MAX,
            1 => rng.below(1000) as u32,
            _ => rng.next_u32(),
        })
        .collect();
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
        .unique_relabel(
            &d.to_device(&targets).unwrap(),
            3,
            &d.to_device(&cands).unwrap(),
            cands.len(),
        )
        .unwrap();
    assert_eq!(n, unique.len());
    assert_eq!(d.to_host::<u32>(&u, n).unwrap(), unique);
    assert_eq!(d.to_host::<u32>(&l, cands.len()).unwrap(), local);
    // Repeated targets are an error.
    let dup = d.to_device(&[4u32, 9, 4]).unwrap();
    assert!(d.unique_relabel(&dup, 3, &dup, 0).is_err());
}

/// Edge counts of a block, `num_dst × num_src`, via Sum aggregation of the identity.
fn counts(d: &CudaBackend, block: &<CudaBackend as gpu_ops::DeviceCore>::Block) -> Vec<f32> {
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
    d.to_host::<f32>(&out, nd * ns).unwrap()
}

#[test]
fn sampling_is_reproducible_and_placement_independent() {
    let Some(d) = dev() else { return };
    let mut rng = Rng::new(3);
    let n = 2000;
    let edges: Vec<(u32, u32)> = (0..20_000)
        .map(|_| (rng.below(n) as u32, rng.below(n) as u32))
        .collect();
    let g = CsrGraph::from_edges(n as usize, &edges, BuildOptions::UNDIRECTED).unwrap();
    let on_dev = d.load_graph(&g, TopologyPlacement::Device).unwrap();
    let on_host = d.load_graph(&g, TopologyPlacement::PinnedHost).unwrap();
    let seeds: Vec<u32> = (0..300).map(|i| i * 5).collect();
    let fanouts = [5u32, 10, ALL_NEIGHBORS];
    let a = d.sample(&on_dev, &seeds, &fanouts, 7).unwrap();
    let b = d.sample(&on_dev, &seeds, &fanouts, 7).unwrap();
    let c = d.sample(&on_host, &seeds, &fanouts, 7).unwrap();
    for l in 0..fanouts.len() {
        let ns = d.block_shape(&a.blocks[l]).0;
        let ids = d.to_host::<u32>(&a.src_ids[l], ns).unwrap();
        for other in [&b, &c] {
            assert_eq!(d.block_shape(&other.blocks[l]), d.block_shape(&a.blocks[l]));
            assert_eq!(
                d.to_host::<u32>(&other.src_ids[l], ns).unwrap(),
                ids,
                "layer {l}"
            );
            assert_eq!(
                counts(&d, &other.blocks[l]),
                counts(&d, &a.blocks[l]),
                "layer {l}"
            );
        }
    }
}

#[test]
fn floyd_sampling_on_a_hub_picks_distinct_neighbors_in_row_order() {
    let Some(d) = dev() else { return };
    // Vertex 0 is adjacent to everyone else.
    let n = 5001u32;
    let edges: Vec<(u32, u32)> = (1..n).map(|v| (0, v)).collect();
    let g = CsrGraph::from_edges(n as usize, &edges, BuildOptions::UNDIRECTED).unwrap();
    let dg = d.load_graph(&g, TopologyPlacement::Device).unwrap();
    let mut seen_first = HashSet::new();
    for seed in 0..8u64 {
        let batch = d.sample(&dg, &[0], &[3000], seed).unwrap();
        let (ns, nd, ne) = d.block_shape(&batch.blocks[0]);
        assert_eq!((nd, ne), (1, 3000));
        let ids = d.to_host::<u32>(&batch.src_ids[0], ns).unwrap();
        assert_eq!(ns, 3001, "3000 distinct neighbors plus the destination");
        let picked = &ids[1..];
        assert!(picked.iter().all(|&v| (1..n).contains(&v)));
        // Row order: the graph's rows are sorted, so picks come out increasing.
        assert!(
            picked.windows(2).all(|w| w[0] < w[1]),
            "seed {seed}: not in row order"
        );
        seen_first.insert(picked[0]);
    }
    assert!(seen_first.len() > 1, "different seeds, different samples");
}

/// A one-rank NCCL communicator on this GPU: the sum over one rank is the
/// identity, zero lengths are skipped, bad lengths are errors before NCCL is
/// called, and the line names NCCL's version. Skipped without NCCL (unless
/// `TANDEM_REQUIRE_NCCL` is set, as a GPU run that must exercise NCCL sets it).
#[test]
fn a_one_rank_nccl_communicator_sums_in_place() {
    let Some(d) = dev() else { return };
    if let Err(e) = gpu_ops::nccl_available() {
        assert!(std::env::var_os("TANDEM_REQUIRE_NCCL").is_none(), "{e}");
        println!("skipped: {e}");
        return;
    }
    let id = gpu_ops::nccl_unique_id().unwrap();
    let reduce = d.nccl_reduce(0, 1, &id).unwrap();
    let line = reduce.describe();
    assert!(
        line.starts_with("NCCL 2.") && line.ends_with("rank 0 of 1"),
        "{line}"
    );
    let mut rng = Rng::new(3);
    let a: Vec<f32> = (0..100_003).map(|_| rng.next_f32() - 0.5).collect();
    let b: Vec<f32> = (0..7).map(|_| rng.next_f32()).collect();
    let mut bufs = vec![d.to_device(&a).unwrap(), d.to_device(&b).unwrap()];
    reduce.all_reduce_sum(&d, &mut bufs, &[a.len(), 0]).unwrap();
    assert_eq!(d.to_host::<f32>(&bufs[0], a.len()).unwrap(), a);
    assert_eq!(d.to_host::<f32>(&bufs[1], b.len()).unwrap(), b);
    assert!(reduce.all_reduce_sum(&d, &mut bufs, &[a.len()]).is_err());
    assert!(reduce.all_reduce_sum(&d, &mut bufs, &[a.len(), 8]).is_err());
    // Another backend's buffers are refused.
    let other = dev().unwrap();
    let mut theirs = vec![other.to_device(&b).unwrap()];
    assert!(reduce
        .all_reduce_sum(&other, &mut theirs, &[b.len()])
        .is_err());
    assert!(d.nccl_reduce(1, 1, &id).is_err());
}

/// `sampling_sibling` + `adopt_batch` (the engine's `device.sample_ahead`): a
/// batch sampled on the sibling's stream and handed over equals the batch
/// sampled here; and a batch dropped while this stream still has work queued
/// that reads it is not overwritten by the sibling's next batch, which may
/// recycle its blocks (the reads are queued behind busy work, the batch
/// dropped at once, the next batch sampled, and only then are the reads
/// checked).
#[test]
fn a_batch_sampled_on_the_sibling_stream_is_the_batch_sampled_here() {
    let Some(d) = dev() else { return };
    let mut rng = Rng::new(5);
    let n = 5000u32;
    let edges: Vec<(u32, u32)> = (0..60_000)
        .map(|_| {
            (
                rng.below(u64::from(n)) as u32,
                rng.below(u64::from(n)) as u32,
            )
        })
        .collect();
    let g = CsrGraph::from_edges(n as usize, &edges, BuildOptions::UNDIRECTED).unwrap();
    let graph = d.load_graph(&g, TopologyPlacement::Device).unwrap();
    let s = d
        .sampling_sibling()
        .unwrap()
        .expect("CUDA has a sampling sibling");
    let fanouts = [10u32, 5, 3];
    let seeds_of = |k: u32| -> Vec<u32> { (0..400).map(|i| (i * 11 + k * 7) % n).collect() };
    // Work that keeps this backend's stream busy.
    let busy_len = 1 << 24;
    let mut busy = d.alloc::<f32>(busy_len).unwrap();
    let mut keep_busy = || {
        for _ in 0..20 {
            d.scale(&mut busy, busy_len, 1.0).unwrap();
        }
    };
    type Copies = Vec<(
        <CudaBackend as DeviceCore>::Block,
        <CudaBackend as DeviceCore>::Buf<u32>,
        usize,
    )>;
    let mut read: Vec<(u32, Copies)> = Vec::new();
    for k in 0..12u32 {
        keep_busy();
        let mut b = s
            .sample(&graph, &seeds_of(k), &fanouts, u64::from(k))
            .unwrap();
        d.adopt_batch(&s, &mut b).unwrap();
        keep_busy();
        // Reads of the batch on this stream, queued behind the busy work.
        let copies: Copies = (0..fanouts.len())
            .map(|l| {
                let ns = d.block_shape(&b.blocks[l]).0;
                let mut ids = d.alloc::<u32>(ns).unwrap();
                d.copy::<u32>(&b.src_ids[l], &mut ids, ns).unwrap();
                (d.add_self_loops(&b.blocks[l]).unwrap(), ids, ns)
            })
            .collect();
        drop(b);
        read.push((k, copies));
    }
    for (k, copies) in read {
        let want = d
            .sample(&graph, &seeds_of(k), &fanouts, u64::from(k))
            .unwrap();
        for (l, (block, ids, ns)) in copies.iter().enumerate() {
            assert_eq!(d.block_shape(&want.blocks[l]).0, *ns, "batch {k} layer {l}");
            assert_eq!(
                d.to_host::<u32>(ids, *ns).unwrap(),
                d.to_host::<u32>(&want.src_ids[l], *ns).unwrap(),
                "batch {k} layer {l}: source ids"
            );
            let loops = d.add_self_loops(&want.blocks[l]).unwrap();
            assert_eq!(
                d.block_to_host(block).unwrap(),
                d.block_to_host(&loops).unwrap(),
                "batch {k} layer {l}: block"
            );
        }
    }
    let stats = s.allocator_stats();
    assert!(
        stats.reuses > 0,
        "the sibling's pool recycles blocks: {stats:?}"
    );
    s.synchronize(s.stream()).unwrap();
}
