//! The loader's batches against a scalar reference read from the dataset's
//! arrays, its determinism, and its shutdown (counted in batches, never timed).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::*;
use crate::data::{generate_sbm, SbmOptions};

fn dataset() -> Arc<Dataset> {
    Arc::new(
        generate_sbm(&SbmOptions {
            num_vertices: 400,
            num_edges: 3000,
            num_classes: 4,
            feature_dim: 6,
            ..SbmOptions::default()
        })
        .expect("sbm"),
    )
}

fn options(fanouts: &[u32], batch_size: usize) -> LoaderOptions {
    LoaderOptions {
        device: LoaderDevice::Host,
        threads: 2,
        edge_index: true,
        ..LoaderOptions::new(fanouts.to_vec(), batch_size)
    }
}

fn all(loader: &NeighborLoader) -> Vec<Batch> {
    loader.epoch().collect::<Result<Vec<_>>>().expect("epoch")
}

/// Checks one batch against the dataset with plain loops: every field the
/// module doc promises.
fn check_batch(ds: &Dataset, fanouts: &[u32], b: &Batch) {
    let n_id = &b.n_id;
    let local: HashMap<u32, usize> = n_id.iter().enumerate().map(|(i, &v)| (v, i)).collect();
    assert_eq!(local.len(), n_id.len(), "n_id repeats a vertex");
    assert_eq!(b.hops.len(), fanouts.len());
    // Seeds first; each hop's destinations are the vertices reached before it.
    let mut reached = b.num_seeds;
    let mut first_sampled = 0;
    for (h, hop) in b.hops.iter().enumerate() {
        let fanout = fanouts[fanouts.len() - 1 - h] as usize;
        assert_eq!(hop.num_dst, reached, "hop {h} destinations");
        assert_eq!(hop.first_sampled, first_sampled);
        assert!(hop.num_src >= hop.num_dst && hop.num_src <= n_id.len());
        assert_eq!(hop.indptr.len(), hop.num_dst + 1);
        let mut new_sources = HashSet::new();
        for d in 0..hop.num_dst {
            let row = &hop.indices[hop.indptr[d] as usize..hop.indptr[d + 1] as usize];
            let dst = n_id[d];
            if d < first_sampled {
                assert!(row.is_empty(), "hop {h}: vertex {dst} sampled twice");
                continue;
            }
            let neighbors = ds.graph.neighbors(dst);
            assert_eq!(row.len(), fanout.min(neighbors.len()), "hop {h} row {d}");
            let mut seen = HashSet::new();
            for &s in row {
                let s = s as usize;
                assert!(s < hop.num_src, "local id {s} past the hop's sources");
                assert!(
                    neighbors.contains(&n_id[s]),
                    "sampled edge {} -> {dst} is not in the graph",
                    n_id[s]
                );
                assert!(seen.insert(s), "neighbor drawn twice (without replacement)");
                if s >= hop.num_dst {
                    new_sources.insert(s);
                }
            }
        }
        // The new sources are exactly the ids handed out at this hop.
        assert_eq!(new_sources.len(), hop.num_src - hop.num_dst);
        first_sampled = hop.num_dst;
        reached = hop.num_src;
    }
    assert_eq!(reached, n_id.len());
    // Features are the dataset's rows, labels the seeds'.
    let dim = ds.features.dim();
    assert_eq!(b.dim, dim);
    let Features::F32(x) = &b.x else {
        panic!("f32 rows expected")
    };
    for (i, &v) in n_id.iter().enumerate() {
        assert_eq!(&x[i * dim..(i + 1) * dim], ds.features.row(v as usize));
    }
    for (i, &s) in n_id[..b.num_seeds].iter().enumerate() {
        assert_eq!(b.y[i], ds.labels[s as usize]);
    }
    // PyG's layout: counts per hop, COO edges hop by hop in destination order.
    let nodes = b.num_sampled_nodes();
    assert_eq!(nodes.iter().sum::<usize>(), n_id.len());
    let [src, dst] = b.coo_edges();
    if let Some(built) = &b.edge_index {
        assert_eq!(built, &[src.clone(), dst.clone()]);
    }
    assert_eq!(src.len(), b.num_sampled_edges().iter().sum::<usize>());
    let mut e = 0;
    for hop in &b.hops {
        for d in 0..hop.num_dst {
            for &s in &hop.indices[hop.indptr[d] as usize..hop.indptr[d + 1] as usize] {
                assert_eq!((src[e], dst[e]), (i64::from(s), d as i64));
                e += 1;
            }
        }
    }
}

#[test]
fn batches_match_a_scalar_reference() {
    let ds = dataset();
    let fanouts = [4, 3, 2];
    let loader = NeighborLoader::new(Arc::clone(&ds), options(&fanouts, 37)).unwrap();
    let batches = all(&loader);
    assert_eq!(batches.len(), loader.num_batches());
    // Every training vertex is a seed exactly once per epoch.
    let mut seeds: Vec<u32> = batches
        .iter()
        .flat_map(|b| b.n_id[..b.num_seeds].to_vec())
        .collect();
    seeds.sort_unstable();
    assert_eq!(seeds, ds.train_ids());
    for (k, b) in batches.iter().enumerate() {
        assert_eq!(b.index, k);
        check_batch(&ds, &fanouts, b);
    }
}

#[test]
fn bf16_rows_are_the_rounded_f32_rows() {
    let ds = dataset();
    let mut o = options(&[3, 3], 50);
    o.feature_dtype = FeatureDtype::Bf16;
    let b16 = all(&NeighborLoader::new(Arc::clone(&ds), o).unwrap());
    let b32 = all(&NeighborLoader::new(Arc::clone(&ds), options(&[3, 3], 50)).unwrap());
    for (a, b) in b16.iter().zip(&b32) {
        assert_eq!(a.n_id, b.n_id);
        let (Features::Bf16(x16), Features::F32(x32)) = (&a.x, &b.x) else {
            panic!("dtypes")
        };
        let want: Vec<u16> = x32.iter().map(|&v| gpu_ops::f32_to_bf16_bits(v)).collect();
        assert_eq!(x16, &want);
    }
}

/// Same seeds and seed: the same batches, whatever the prefetch and thread
/// count; another seed or epoch: other batches.
#[test]
fn batches_are_deterministic_for_a_seed() {
    let ds = dataset();
    let run = |prefetch: usize, threads: usize, seed: u64| {
        let mut o = options(&[5, 4], 64);
        o.prefetch = prefetch;
        o.threads = threads;
        o.seed = seed;
        let l = NeighborLoader::new(Arc::clone(&ds), o).unwrap();
        (all(&l), all(&l))
    };
    let (a0, a1) = run(1, 1, 7);
    let (b0, b1) = run(4, 2, 7);
    assert_eq!(a0, b0);
    assert_eq!(a1, b1);
    assert_ne!(a0, a1, "epochs differ");
    let (c0, _) = run(2, 2, 8);
    assert_ne!(a0, c0, "seeds differ");
    // Without shuffling the seeds keep their given order.
    let mut o = options(&[2], 10);
    o.shuffle = false;
    o.seeds = Some((100..130).collect());
    let b = all(&NeighborLoader::new(Arc::clone(&ds), o).unwrap());
    assert_eq!(b[0].n_id[..10], (100..110).collect::<Vec<u32>>()[..]);
}

/// Rows given back are overwritten by later batches: every batch equals the
/// one a loader that never recycles builds (f32 and bf16, buffers shorter and
/// longer than the next batch's rows), and the buffers were reused.
#[test]
fn recycled_rows_give_the_same_batches() {
    let ds = dataset();
    for dtype in [FeatureDtype::F32, FeatureDtype::Bf16] {
        let mut o = options(&[4, 3], 29);
        o.feature_dtype = dtype;
        o.prefetch = 1;
        let want = all(&NeighborLoader::new(Arc::clone(&ds), o.clone()).unwrap());
        let l = NeighborLoader::new(Arc::clone(&ds), o).unwrap();
        let mut got = Vec::new();
        for b in l.epoch() {
            let mut b = b.expect("batch");
            let x = std::mem::replace(&mut b.x, Features::F32(Vec::new()));
            got.push((b, x.clone()));
            // Scribble over the buffer first: a stale value would show.
            let x = match x {
                Features::F32(mut v) => {
                    v.fill(f32::NAN);
                    Features::F32(v)
                }
                Features::Bf16(mut v) => {
                    v.fill(0xFFFF);
                    Features::Bf16(v)
                }
            };
            l.recycle(x);
        }
        assert_eq!(got.len(), want.len());
        for ((b, x), w) in got.iter().zip(&want) {
            assert_eq!(&b.n_id, &w.n_id);
            assert_eq!(x, &w.x, "{dtype:?}: batch {} rows differ", b.index);
        }
        let sizes: HashSet<usize> = want.iter().map(|b| b.x.len()).collect();
        assert!(sizes.len() > 1, "batches of one size test no growth");
        assert!(
            l.buffers().reused() >= want.len() - 2,
            "{}",
            l.buffers().reused()
        );
    }
}

/// Dropping an epoch after one batch stops its worker: it built no more than
/// the batch taken plus `prefetch`, and it has ended.
#[test]
fn dropping_an_epoch_stops_its_worker() {
    let ds = dataset();
    let mut o = options(&[3], 1);
    o.prefetch = 2;
    let loader = NeighborLoader::new(ds, o).unwrap();
    assert!(loader.num_batches() > 100);
    {
        let mut epoch = loader.epoch();
        assert_eq!(loader.workers_running(), 1);
        epoch.next().unwrap().unwrap();
    }
    assert_eq!(loader.workers_running(), 0);
    let built = loader.batches_built();
    assert!((1..=3).contains(&built), "built {built}");
    // A full epoch afterwards builds every batch.
    let n = all(&loader).len();
    assert_eq!(n, loader.num_batches());
    assert_eq!(loader.batches_built(), built + n);
}

#[test]
fn bad_arguments_are_named_before_any_work() {
    let ds = dataset();
    let err = |o: LoaderOptions| {
        NeighborLoader::new(Arc::clone(&ds), o)
            .unwrap_err()
            .to_string()
    };
    let msg = err(options(&[], 8));
    assert!(msg.contains("`fanouts`"), "{msg}");
    let msg = err(options(&[3, 0], 8));
    assert!(msg.contains("fanouts[1] is 0"), "{msg}");
    let msg = err(options(&[3], 0));
    assert!(msg.contains("`batch_size`"), "{msg}");
    let mut o = options(&[3], 8);
    o.prefetch = 0;
    assert!(err(o).contains("`prefetch`"));
    let mut o = options(&[3], 8);
    o.seeds = Some(vec![1, 400]);
    let msg = err(o);
    assert!(
        msg.contains("`seeds`") && msg.contains("seeds[1] = 400"),
        "{msg}"
    );
    let mut o = options(&[3], 8);
    o.seeds = Some(vec![5, 6, 5]);
    assert!(err(o).contains("seeds[2] = 5 repeats seeds[0]"));
    let mut o = options(&[3], 8);
    o.seeds = Some(Vec::new());
    assert!(err(o).contains("no seed vertices"));
    // A CUDA device on a machine without one (or a build without CUDA).
    let mut o = options(&[3], 8);
    o.device = LoaderDevice::Cuda(0);
    o.feature_cache_bytes = Some(1);
    let msg = err(o);
    assert!(msg.contains("cuda:0"), "{msg}");
}

#[test]
fn the_host_note_says_why() {
    let ds = dataset();
    let mut o = options(&[2], 8);
    o.device = LoaderDevice::Auto;
    o.feature_cache_bytes = Some(1 << 20);
    let l = NeighborLoader::new(ds, o).unwrap();
    assert!(l.note().contains("gives host batches"));
    assert!(l.note().contains("feature_cache_bytes unused"));
}
