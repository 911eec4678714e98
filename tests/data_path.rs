//! The host data path end to end: generate or import → store (atomic write, mmap
//! read) → export/import round trip → sample blocks → gather features.

use cpu_ops::{gather_rows, NeighborSampler, SamplerScratch};
use runtime::data::export_npy;
use runtime::data::import_npy_dir;
use runtime::data::{generate_rmat, generate_sbm, RmatOptions, SbmOptions};
use runtime::data::{open_dataset, write_dataset, Dataset, Verify};

fn sbm() -> Dataset {
    generate_sbm(&SbmOptions {
        num_vertices: 5000,
        num_edges: 40_000,
        num_classes: 5,
        homophily: 0.8,
        feature_dim: 16,
        signal: 0.5,
        split: "0.5,0.25,rest".parse().expect("split"),
        seed: 3,
        ..SbmOptions::default()
    })
    .expect("generate sbm")
}

/// Checks a sampled batch against the graph it came from and gathers its inputs.
fn check_batch_and_gather(ds: &Dataset, seeds: &[u32], fanouts: &[u32]) {
    let sampler = NeighborSampler::new(fanouts.to_vec()).expect("sampler");
    let mut scratch = SamplerScratch::new(ds.num_vertices());
    let batch = sampler
        .sample(&ds.graph, seeds, 11, &mut scratch)
        .expect("sample");
    assert_eq!(batch.blocks().len(), fanouts.len());
    let top = batch.blocks().last().expect("a block");
    assert_eq!(top.dst_ids(), seeds);
    for (layer, b) in batch.blocks().iter().enumerate() {
        let fanout = fanouts[layer] as usize;
        for d in 0..b.num_dst() {
            let dst = b.src_ids()[d];
            let row = ds.graph.neighbors(dst);
            let picked = b.neighbors(d);
            assert_eq!(picked.len(), row.len().min(fanout));
            for &s in picked {
                assert!(
                    row.contains(&b.src_ids()[s as usize]),
                    "sampled edge not in graph"
                );
            }
        }
    }
    for w in batch.blocks().windows(2) {
        assert_eq!(w[0].dst_ids(), w[1].src_ids());
    }
    let ids = batch.input_ids();
    let dim = ds.features.dim();
    let mut buf = vec![0f32; ids.len() * dim];
    gather_rows(&ds.features, ids, &mut buf).expect("gather");
    for (i, &v) in ids.iter().enumerate() {
        assert_eq!(&buf[i * dim..(i + 1) * dim], ds.features.row(v as usize));
    }
}

#[test]
fn generated_dataset_through_store_export_import_and_sampler() {
    let ds = sbm();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sbm.tds");
    write_dataset(&path, &ds).expect("write");
    let mapped = open_dataset(&path, Verify::Full).expect("open");
    assert!(mapped.features.data().is_mapped());
    assert_eq!(mapped, ds);

    let npy = dir.path().join("npy");
    export_npy(&mapped, &npy).expect("export");
    let back = import_npy_dir(&npy).expect("import npy dir");
    assert_eq!(back.graph, ds.graph);
    assert_eq!(back.features, ds.features);
    assert_eq!(back.labels, ds.labels);
    assert_eq!(
        (
            back.train_mask.clone(),
            back.val_mask.clone(),
            back.test_mask.clone()
        ),
        (
            ds.train_mask.clone(),
            ds.val_mask.clone(),
            ds.test_mask.clone()
        )
    );

    let seeds: Vec<u32> = mapped.train_ids().into_iter().take(256).collect();
    check_batch_and_gather(&mapped, &seeds, &[10, 5]);
}

#[test]
fn rmat_batches_are_identical_on_one_and_two_threads() {
    let ds = generate_rmat(&RmatOptions {
        num_vertices: 20_000,
        num_edges: 200_000,
        num_classes: 4,
        feature_dim: 8,
        seed: 5,
        ..RmatOptions::default()
    })
    .expect("generate rmat");
    let seeds: Vec<u32> = (0..512).map(|i| i * 37 % 20_000).collect();
    check_batch_and_gather(&ds, &seeds, &[25, 10, 5]);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        pool.install(|| {
            let s = NeighborSampler::new(vec![25, 10, 5]).expect("sampler");
            let mut scratch = SamplerScratch::new(ds.num_vertices());
            s.sample(&ds.graph, &seeds, 99, &mut scratch)
                .expect("sample")
        })
    };
    let (a, b) = (run(1), run(2));
    assert_eq!(a.blocks().len(), b.blocks().len());
    for (x, y) in a.blocks().iter().zip(b.blocks()) {
        assert_eq!(x.src_ids(), y.src_ids());
        assert_eq!(x.indptr(), y.indptr());
        assert_eq!(x.indices(), y.indices());
    }
}

#[test]
fn wordnet_import_when_installed() {
    let dir = std::path::Path::new("/usr/share/wordnet");
    if !dir.join("data.noun").exists() {
        assert!(
            std::env::var("TANDEM_REQUIRE_WORDNET").as_deref() != Ok("1"),
            "TANDEM_REQUIRE_WORDNET=1 but /usr/share/wordnet/data.noun is missing"
        );
        eprintln!("skip: /usr/share/wordnet/data.noun missing (apt-get install wordnet-base)");
        return;
    }
    let ds = runtime::data::import_wordnet(&runtime::data::WordNetOptions::default())
        .expect("import wordnet");
    assert_eq!(ds.num_vertices(), 117_659);
    assert_eq!(ds.graph.num_edges(), 2 * 183_789);
    let d = tempfile::tempdir().expect("tempdir");
    let p = d.path().join("wn.tds");
    write_dataset(&p, &ds).expect("write");
    let mapped = open_dataset(&p, Verify::Default).expect("open");
    let seeds: Vec<u32> = mapped.train_ids().into_iter().take(1024).collect();
    check_batch_and_gather(&mapped, &seeds, &[10, 10]);
}
