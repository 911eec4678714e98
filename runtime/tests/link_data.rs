//! The data side of link prediction: edge splits generated, imported, built from
//! arrays, stored, exported and read back, and the one-line errors for bad input.

use std::path::Path;
use std::process::{Command, Output};

use runtime::data::{
    export_npy, generate_sbm, import_edge_list, import_npy_dir, open_dataset, write_dataset,
    Dataset, EdgeSplitSource, EdgeSplitSpec, GraphImportOptions, SbmOptions, Verify,
};
use runtime::DatasetBuilder;

fn tandem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .output()
        .expect("run tandem")
}

fn ok(args: &[&str]) -> String {
    let out = tandem(args);
    assert!(
        out.status.success(),
        "tandem {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The line of stderr that holds the error of a failing command (every check
/// below looks for the whole message on that one line).
fn err(args: &[&str]) -> String {
    let out = tandem(args);
    assert!(!out.status.success(), "tandem {args:?} should fail");
    let e = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!e.contains("panicked"), "panic instead of an error: {e}");
    e.lines()
        .find(|l| l.starts_with("error"))
        .unwrap_or_else(|| panic!("no error line in: {e}"))
        .to_string()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

fn split_spec() -> EdgeSplitSpec {
    "0.85,0.05,0.1".parse().expect("valid edge split")
}

/// An SBM link set: 4 blocks, homophily 0.8, 16 features.
fn sbm_link(seed: u64) -> Dataset {
    generate_sbm(&SbmOptions {
        num_vertices: 4000,
        num_edges: 40_000,
        num_classes: 4,
        feature_dim: 16,
        signal: 0.25,
        edge_split: Some(split_spec()),
        seed,
        ..SbmOptions::default()
    })
    .expect("generate sbm")
}

/// The area under the ROC curve of `score` on positives against negatives (ties
/// count one half).
fn auc(pos: &[f64], neg: &[f64]) -> f64 {
    let mut all: Vec<(f64, bool)> = pos
        .iter()
        .map(|&x| (x, true))
        .chain(neg.iter().map(|&x| (x, false)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut rank_sum, mut i) = (0.0, 0);
    while i < all.len() {
        let mut j = i;
        while j < all.len() && all[j].0 == all[i].0 {
            j += 1;
        }
        let mid = (i + j + 1) as f64 / 2.0; // 1-based average rank of the tie group
        rank_sum += mid * all[i..j].iter().filter(|x| x.1).count() as f64;
        i = j;
    }
    let (p, n) = (pos.len() as f64, neg.len() as f64);
    (rank_sum - p * (p + 1.0) / 2.0) / (p * n)
}

/// `rows` averaged over each vertex and its neighbors in the training graph (one
/// round of mean aggregation, as a GNN layer without weights).
fn aggregate(ds: &Dataset, rows: &[Vec<f64>]) -> Vec<Vec<f64>> {
    (0..ds.num_vertices() as u32)
        .map(|v| {
            let nb = ds.graph.neighbors(v);
            let mut acc = rows[v as usize].clone();
            for &u in nb {
                for (a, x) in acc.iter_mut().zip(&rows[u as usize]) {
                    *a += x;
                }
            }
            acc.iter().map(|a| a / (nb.len() + 1) as f64).collect()
        })
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Held-out SBM links are predictable: far more of them stay inside a block than
/// random pairs do, and a dot product of features averaged over the training
/// graph ranks them above uniform negatives nearly as well as knowing the blocks,
/// far better than the raw features.
#[test]
fn sbm_held_out_links_follow_communities_and_features() {
    let ds = sbm_link(3);
    let split = ds.edges.as_ref().expect("edge split");
    let inside = |(s, d): (u32, u32)| ds.labels[s as usize] == ds.labels[d as usize];
    let test_inside =
        split.test.iter().filter(|&e| inside(e)).count() as f64 / split.test.len() as f64;
    let mut rng = cpu_ops::Rng::new(5);
    let n = ds.num_vertices();
    let negatives: Vec<(u32, u32)> = split
        .test
        .iter()
        .map(|(s, _)| (s, rng.below(n as u64) as u32))
        .collect();
    let random_inside =
        negatives.iter().filter(|&&e| inside(e)).count() as f64 / negatives.len() as f64;
    assert!(
        test_inside > 0.7 && random_inside < 0.35,
        "inside a block: test edges {test_inside:.3}, random pairs {random_inside:.3}"
    );

    let test_auc = |rows: &[Vec<f64>]| {
        let score = |&(s, t): &(u32, u32)| dot(&rows[s as usize], &rows[t as usize]);
        let pos: Vec<f64> = split.test.iter().map(|e| score(&e)).collect();
        let neg: Vec<f64> = negatives.iter().map(score).collect();
        auc(&pos, &neg)
    };
    let d = ds.features.dim();
    let raw: Vec<Vec<f64>> = (0..n)
        .map(|v| {
            ds.features.as_slice()[v * d..(v + 1) * d]
                .iter()
                .map(|&x| x as f64)
                .collect()
        })
        .collect();
    let two_hops = aggregate(&ds, &aggregate(&ds, &raw));
    let blocks: Vec<Vec<f64>> = (0..n)
        .map(|v| {
            let mut x = vec![0.0; ds.num_classes as usize];
            x[ds.labels[v] as usize] = 1.0;
            x
        })
        .collect();
    let (raw_auc, hop_auc, block_auc) = (test_auc(&raw), test_auc(&two_hops), test_auc(&blocks));
    eprintln!(
        "test AUC of a dot product: raw features {raw_auc:.3}, two hops of the training graph \
         {hop_auc:.3}, the blocks themselves {block_auc:.3}"
    );
    assert!(raw_auc > 0.5, "raw features {raw_auc:.3}");
    assert!(
        hop_auc > raw_auc + 0.1,
        "two hops {hop_auc:.3}, raw {raw_auc:.3}"
    );
    assert!(
        hop_auc > block_auc - 0.05,
        "two hops {hop_auc:.3}, blocks {block_auc:.3}"
    );
}

#[test]
fn generated_splits_are_seeded_and_hold_no_test_edge_in_the_graph() {
    let a = sbm_link(3);
    assert_eq!(a, sbm_link(3));
    assert_ne!(a.edges, sbm_link(4).edges);
    let split = a.edges.as_ref().unwrap();
    assert!(split.symmetric);
    let total = split.train.len() + split.val.len() + split.test.len();
    assert_eq!(a.graph.num_edges(), 2 * split.train.len());
    assert_eq!(split.val.len(), (0.05 * total as f64).round() as usize);
    for (s, d) in split.val.iter().chain(split.test.iter()) {
        assert!(!a.graph.neighbors(d).contains(&s) && !a.graph.neighbors(s).contains(&d));
    }
}

/// The `.tds` store and the `.npy` directory round-trip a split bit for bit.
#[test]
fn store_and_npy_round_trip_the_split() {
    let d = tempfile::tempdir().unwrap();
    let ds = sbm_link(1);
    let p = d.path().join("a.tds");
    write_dataset(&p, &ds).unwrap();
    let back = open_dataset(&p, Verify::Full).unwrap();
    assert_eq!(back, ds);
    assert!(back.edges.as_ref().unwrap().train.src.is_mapped());
    let dir = d.path().join("npy");
    export_npy(&back, &dir).unwrap();
    for f in ["train_src", "val_dst", "test_src"] {
        assert!(
            dir.join("edge_split").join(format!("{f}.npy")).exists(),
            "{f}"
        );
    }
    let again = import_npy_dir(&dir).unwrap();
    assert_eq!(again, ds);
    let q = d.path().join("b.tds");
    write_dataset(&q, &again).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), std::fs::read(&q).unwrap());
}

/// A mutated version-2 file is an error or a valid dataset, never a panic.
#[test]
fn mutated_split_files_never_panic() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("a.tds");
    let small = generate_sbm(&SbmOptions {
        num_vertices: 80,
        num_edges: 400,
        num_classes: 3,
        feature_dim: 2,
        edge_split: Some(split_spec()),
        ..SbmOptions::default()
    })
    .unwrap();
    write_dataset(&p, &small).unwrap();
    let good = std::fs::read(&p).unwrap();
    let header_len = u32::from_le_bytes(good[12..16].try_into().unwrap()) as usize;
    let mut rng = cpu_ops::Rng::new(9);
    for round in 0..2000 {
        let mut b = good.clone();
        // Half the mutations land in the header (its checksum resealed, so the
        // size checks see them), half in the data.
        let in_header = round % 2 == 0;
        let span = if in_header { header_len - 8 } else { b.len() };
        for _ in 0..1 + rng.below(3) {
            let i = rng.below(span as u64) as usize;
            b[i] ^= 1 << rng.below(8);
        }
        if in_header {
            let sum = xxhash_rust::xxh3::xxh3_64(&b[..header_len - 8]);
            b[header_len - 8..header_len].copy_from_slice(&sum.to_le_bytes());
        }
        if round % 7 == 0 {
            b.truncate(rng.below(b.len() as u64) as usize);
        }
        if let Ok(ds) = runtime::data::parse_dataset_bytes(Path::new("m.tds"), &b, Verify::Full) {
            ds.validate().expect("a dataset that parsed validates");
        }
    }
}

#[test]
fn builder_takes_arrays_and_draws_the_importers_split() {
    let features = runtime::ndarray::Array2::<f32>::zeros((6, 2));
    let labels = [0u32, 1, 0, 1, 0, 1];
    // A 6-cycle given as training edges only: they are the graph.
    let train = (vec![0i64, 1, 2, 3, 4, 5], vec![1i64, 2, 3, 4, 5, 0]);
    let ds = DatasetBuilder::new("cycle")
        .edge_split(
            (&train.0, &train.1),
            (&vec![0i64], &vec![3i64]),
            (&vec![1i64, 2], &vec![4i64, 5]),
        )
        .edge_negatives(
            &runtime::ndarray::array![[2i64, 4]],
            &runtime::ndarray::array![[0i64], [0]],
        )
        .symmetrize(true)
        .features(&features)
        .labels(&labels)
        .build()
        .unwrap();
    let e = ds.edges.as_ref().unwrap();
    assert!(e.symmetric);
    assert_eq!(ds.graph.num_edges(), 12);
    assert_eq!(e.val_negatives_per_positive(), Some(2));
    assert_eq!(e.test_negatives_per_positive(), Some(1));

    // Errors name the field and the element.
    let build = |val: (Vec<i64>, Vec<i64>), neg_rows: usize| {
        DatasetBuilder::new("bad")
            .edge_split(
                (&train.0, &train.1),
                (&val.0, &val.1),
                (&vec![1i64], &vec![4i64]),
            )
            .edge_negatives(
                &runtime::ndarray::Array2::<i64>::zeros((neg_rows, 1)),
                &runtime::ndarray::Array2::<i64>::zeros((1, 1)),
            )
            .symmetrize(true)
            .features(&features)
            .labels(&labels)
            .build()
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        build((vec![0, 9], vec![3, 3]), 2),
        "invalid dataset: edges.val.src[1] = 9 is not below the vertex count 6"
    );
    assert!(build((vec![0, 2], vec![3, 1]), 2)
        .starts_with("invalid dataset: edges.val[1]: (2, 1) is also training edge edges.train[1]"));
    assert!(build((vec![], vec![]), 0).starts_with("invalid dataset: edges.val: no edges"));
    assert!(build((vec![0], vec![-3]), 1)
        .starts_with("invalid dataset: edges.val.dst[0] = -3 is negative"));
    assert!(
        build((vec![0], vec![3]), 2).starts_with("invalid dataset: edges.val_neg: shape (2, 1)")
    );

    // `split_edges` draws the split `import edgelist --edge-split` draws.
    let d = tempfile::tempdir().unwrap();
    let n = 300;
    let (src, dst): (Vec<u32>, Vec<u32>) = (0..n).map(|i| (i, (i * 7 + 3) % n)).unzip();
    let text: String = src
        .iter()
        .zip(&dst)
        .map(|(a, b)| format!("{a} {b}\n"))
        .collect();
    let file = d.path().join("g.txt");
    std::fs::write(&file, text).unwrap();
    let imported = import_edge_list(
        &file,
        &GraphImportOptions {
            edge_split: EdgeSplitSource::Holdout(split_spec()),
            seed: 11,
            ..GraphImportOptions::default()
        },
    )
    .unwrap();
    let built = DatasetBuilder::new("g")
        .edge_index(&runtime::ndarray::Array2::from_shape_fn(
            (2, n as usize),
            |(r, j)| {
                if r == 0 {
                    src[j]
                } else {
                    dst[j]
                }
            },
        ))
        .symmetrize(true)
        .features(&runtime::ndarray::Array2::<f32>::zeros((n as usize, 1)))
        .labels(&vec![0u32; n as usize])
        .split_edges([0.85, 0.05, 0.1], 11)
        .build()
        .unwrap();
    assert_eq!(built.edges, imported.edges);
    assert_eq!(built.graph, imported.graph);
}

/// `tandem generate | info | export | import` with an edge split, and the CLI's
/// one-line errors for bad splits.
#[test]
fn cli_generates_imports_and_exports_splits() {
    let d = tempfile::tempdir().unwrap();
    let g = d.path().join("g.tds");
    let out = ok(&[
        "generate",
        "sbm",
        "--vertices",
        "3000",
        "--edges",
        "20000",
        "--classes",
        "4",
        "--dim",
        "8",
        "--edge-split",
        "0.85,0.05,0.1",
        "-o",
        s(&g),
    ]);
    assert!(out.contains("edge split train/val/test = "), "{out}");
    let info = ok(&["info", s(&g), "--verify"]);
    let ds = open_dataset(&g, Verify::Full).unwrap();
    let e = ds.edges.as_ref().unwrap();
    let sizes = format!(
        "{}/{}/{} positive edges",
        e.train.len(),
        e.val.len(),
        e.test.len()
    );
    assert!(info.contains(&sizes), "{info}");
    let r = d.path().join("r.tds");
    ok(&[
        "generate",
        "rmat",
        "--vertices",
        "2000",
        "--edges",
        "20000",
        "--dim",
        "4",
        "--edge-split",
        "0.8,0.1,0.1",
        "-o",
        s(&r),
    ]);
    assert!(open_dataset(&r, Verify::Default).unwrap().edges.is_some());

    // Export and import back, bit for bit.
    let npy = d.path().join("npy");
    ok(&["export", s(&g), "--format", "npy", "-o", s(&npy)]);
    let again = d.path().join("again.tds");
    ok(&["import", "npy", s(&npy), "-o", s(&again)]);
    assert_eq!(std::fs::read(&g).unwrap(), std::fs::read(&again).unwrap());

    // Edge lists: a held-out split, then explicit split files.
    let el = d.path().join("edges.txt");
    let text: String = (0..100)
        .map(|i| format!("{i} {}\n", (i + 1) % 100))
        .collect();
    std::fs::write(&el, text).unwrap();
    let held = d.path().join("held.tds");
    ok(&[
        "import",
        "edgelist",
        s(&el),
        "--edge-split",
        "0.8,0.1,0.1",
        "--seed",
        "3",
        "-o",
        s(&held),
    ]);
    let e = open_dataset(&held, Verify::Default).unwrap().edges.unwrap();
    assert_eq!((e.train.len(), e.val.len(), e.test.len()), (80, 10, 10));
    let val = d.path().join("val.txt");
    let test = d.path().join("test.txt");
    let test_neg = d.path().join("test_neg.txt");
    std::fs::write(&val, "0 50\n").unwrap();
    std::fs::write(&test, "1 51\n2 52\n").unwrap();
    std::fs::write(&test_neg, "7 8 9\n10 11 12\n").unwrap();
    let files = d.path().join("files.tds");
    let args = |test: &Path| {
        vec![
            "import".to_string(),
            "edgelist".into(),
            s(&el).into(),
            "--val-edges".into(),
            s(&val).into(),
            "--test-edges".into(),
            s(test).into(),
            "--test-negatives".into(),
            s(&test_neg).into(),
            "-o".into(),
            s(&files).into(),
        ]
    };
    let argv = args(&test);
    ok(&argv.iter().map(String::as_str).collect::<Vec<_>>());
    let e = open_dataset(&files, Verify::Default)
        .unwrap()
        .edges
        .unwrap();
    assert_eq!((e.train.len(), e.val.len(), e.test.len()), (100, 1, 2));
    assert_eq!(e.test_negatives_per_positive(), Some(3));

    // One-line errors naming the option, file and line.
    let bad_test = d.path().join("bad_test.txt");
    std::fs::write(&bad_test, "1 51\n# a training edge\n5 4\n").unwrap();
    let argv = args(&bad_test);
    let e = err(&argv.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        e.contains("bad_test.txt:3: edge (5, 4) is an edge of the graph file")
            && e.contains("never enter the sampled graph"),
        "{e}"
    );
    std::fs::write(&bad_test, "1 51\n2\n").unwrap();
    let e = err(&argv.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(e.contains("bad_test.txt:2: expected two vertex ids"), "{e}");
    std::fs::write(&bad_test, "# empty\n").unwrap();
    let e = err(&argv.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(e.contains("bad_test.txt: no edges"), "{e}");
    std::fs::write(&bad_test, "1 51\n2 500\n").unwrap();
    let e = err(&argv.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        e.contains("bad_test.txt:2: vertex id 500 is out of range"),
        "{e}"
    );
    let gen = |split: &str| {
        err(&[
            "generate",
            "sbm",
            "--vertices",
            "100",
            "--edges",
            "400",
            split,
            "-o",
            s(&g),
        ])
    };
    let e = gen("--edge-split=0.9,0.05,0.1");
    assert!(
        e.contains("--edge-split") && e.contains("add up to 1.05, expected 1"),
        "{e}"
    );
    let e = gen("--edge-split=-0.1,0.6,0.5");
    assert!(
        e.contains("--edge-split") && e.contains("-0.1 is negative"),
        "{e}"
    );
    let e = gen("--edge-split=0.999,0.0005,0.0005");
    assert!(
        e.contains("edge_split") && e.contains("gives no validation edge"),
        "{e}"
    );
}
