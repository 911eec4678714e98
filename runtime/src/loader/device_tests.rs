//! The device loader on the host backend: the host loader's batches bit for
//! bit, through any cache size, bf16 stores widened, its memory plan, its
//! refusals and its shutdown (counted in batches, never timed).

use std::sync::Arc;

use gpu_ops::{HostBackend, TopologyPlacement};

use super::*;
use crate::data::{generate_sbm, SbmOptions};

fn dataset() -> Arc<Dataset> {
    Arc::new(
        generate_sbm(&SbmOptions {
            num_vertices: 500,
            num_edges: 4000,
            num_classes: 5,
            feature_dim: 7,
            ..SbmOptions::default()
        })
        .expect("sbm"),
    )
}

fn options(fanouts: &[u32], batch_size: usize) -> LoaderOptions {
    LoaderOptions {
        device: LoaderDevice::Host,
        threads: 2,
        seed: 11,
        ..LoaderOptions::new(fanouts.to_vec(), batch_size)
    }
}

fn host_epoch(ds: &Arc<Dataset>, o: &LoaderOptions, epoch: usize) -> Vec<Batch> {
    let l = NeighborLoader::new(Arc::clone(ds), o.clone()).expect("host loader");
    l.epoch_at(epoch)
        .collect::<Result<_>>()
        .expect("host epoch")
}

fn device_epoch(l: &DeviceLoader<HostBackend>, epoch: usize) -> Vec<Batch> {
    l.epoch_at(epoch)
        .map(|b| b.and_then(|b| b.to_host(l.device())))
        .collect::<Result<_>>()
        .expect("device epoch")
}

#[test]
fn batches_equal_the_host_loaders_through_any_cache() {
    let ds = dataset();
    let full = (ds.num_vertices() * ds.features.dim() * 4) as u64;
    for (fanouts, batch) in [(vec![4, 3], 64), (vec![cpu_ops::ALL_NEIGHBORS, 2, 5], 97)] {
        let o = options(&fanouts, batch);
        for cache in [0, full / 3, full] {
            let mut od = o.clone();
            od.feature_cache_bytes = Some(cache);
            let l = DeviceLoader::new(HostBackend::new(), Arc::clone(&ds), od).unwrap();
            assert_eq!(l.memory_plan().cache_bytes, cache);
            for epoch in [0, 3] {
                let want = host_epoch(&ds, &o, epoch);
                let got = device_epoch(&l, epoch);
                assert_eq!(got.len(), l.num_batches());
                assert_eq!(
                    got, want,
                    "fanouts {fanouts:?}, cache {cache}, epoch {epoch}"
                );
            }
            let s = l.cache_stats();
            let rows: u64 = [0, 3]
                .into_iter()
                .flat_map(|epoch| host_epoch(&ds, &o, epoch))
                .map(|b| b.n_id.len() as u64)
                .sum();
            assert_eq!(s.hits + s.misses, rows, "every gathered row counted once");
            match cache {
                0 => assert_eq!(s.hits, 0),
                c if c == full => assert_eq!(s.misses, 0),
                _ => assert!(s.hits > 0 && s.misses > 0, "{s:?}"),
            }
        }
    }
}

#[test]
fn a_bf16_store_gives_the_rows_rounded_to_bf16() {
    let ds = dataset();
    let mut o = options(&[3, 3], 50);
    let want = host_epoch(&ds, &o, 1);
    o.feature_dtype = FeatureDtype::Bf16;
    o.feature_cache_bytes = Some(1000);
    let l = DeviceLoader::new(HostBackend::new(), Arc::clone(&ds), o).unwrap();
    assert_eq!(
        l.memory_plan().feature_bytes,
        (ds.num_vertices() * ds.features.dim() * 2) as u64
    );
    let got = device_epoch(&l, 1);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!((&g.n_id, &g.hops, &g.y), (&w.n_id, &w.hops, &w.y));
        let (Features::F32(gx), Features::F32(wx)) = (&g.x, &w.x) else {
            panic!("f32 rows expected");
        };
        let rounded: Vec<f32> = wx.iter().map(|&v| gpu_ops::round_to_bf16(v)).collect();
        assert_eq!(gx, &rounded);
    }
}

#[test]
fn the_memory_plan_puts_the_topology_first_and_caps_the_cache() {
    let ds = dataset();
    let n = ds.num_vertices() as u64;
    let topo = 8 * (n + 1) + 4 * ds.graph.num_edges() as u64;
    let rows = n * ds.features.dim() as u64 * 4;
    // Plenty: topology on the device, the cache capped at the matrix.
    let p = plan_memory(&ds, FeatureDtype::F32, None, 1 << 40);
    assert_eq!(p.topology, TopologyPlacement::Device);
    assert_eq!(
        (p.topology_bytes, p.cache_bytes, p.feature_bytes),
        (topo, rows, rows)
    );
    // Exactly four topologies free: on the device, half the rest cached.
    let p = plan_memory(&ds, FeatureDtype::F32, None, 4 * topo);
    assert_eq!(p.topology, TopologyPlacement::Device);
    assert_eq!(p.cache_bytes, (3 * topo / 2).min(rows));
    // One byte less: the topology stays in host memory.
    let p = plan_memory(&ds, FeatureDtype::F32, None, 4 * topo - 1);
    assert_eq!(p.topology, TopologyPlacement::PinnedHost);
    assert_eq!(p.cache_bytes, ((4 * topo - 1) / 2).min(rows));
    // An asked budget is kept (below the matrix); bf16 halves the matrix.
    let p = plan_memory(&ds, FeatureDtype::Bf16, Some(100), 1 << 40);
    assert_eq!((p.cache_bytes, p.feature_bytes), (100, rows / 2));
    let p = plan_memory(&ds, FeatureDtype::Bf16, Some(u64::MAX), u64::MAX);
    assert_eq!(p.cache_bytes, rows / 2);
}

#[test]
fn bad_options_are_refused_before_any_work() {
    let ds = dataset();
    let err = |o: LoaderOptions| {
        DeviceLoader::new(HostBackend::new(), Arc::clone(&ds), o)
            .unwrap_err()
            .to_string()
    };
    let mut o = options(&[3, 0], 8);
    assert!(err(o.clone()).contains("fanouts[1] is 0"));
    o = options(&[3], 8);
    o.seeds = Some(vec![3, 500]);
    assert!(err(o).contains("seeds[1] = 500 is not a vertex"));
    o = options(&[3], 8);
    o.feature_cache_bytes = Some(u64::MAX);
    let msg = err(o);
    assert!(
        msg.contains("`feature_cache_bytes`") && msg.contains("bytes free"),
        "{msg}"
    );
}

#[test]
fn dropping_an_epoch_stops_its_worker_within_the_prefetch() {
    let ds = dataset();
    let mut o = options(&[5, 5], 10);
    o.prefetch = 2;
    let l = DeviceLoader::new(HostBackend::new(), ds, o).unwrap();
    assert!(l.num_batches() > 10);
    let mut e = l.epoch();
    let first = e.next().expect("a batch").expect("built");
    assert_eq!((first.index, first.num_seeds), (0, 10));
    drop(e);
    assert_eq!(l.workers_running(), 0);
    // The one taken, `prefetch` ahead, and at most one in the worker's hands.
    assert!(l.batches_built() <= 1 + 2 + 1, "{}", l.batches_built());
    assert!(l.note().contains("feature cache"), "{}", l.note());
}
