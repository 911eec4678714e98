//! Datasets from in-memory arrays (`runtime::DatasetBuilder`): each way in gives
//! the dataset the equivalent importer (or generator) gives, and every bad input
//! is an error naming the field.

use cpu_ops::Rng;
use runtime::data::npy;
use runtime::data::{generate_sbm, SbmOptions};
use runtime::data::{
    import_edge_list, import_npy_dir, FeatureSource, GraphImportOptions, LabelSource,
};
use runtime::data::{Dataset, SplitSpec};
use runtime::ndarray::{array, Array1, Array2, ShapeBuilder};
use runtime::{DatasetBuilder, DatasetProblem as P, Error};

/// A generated dataset: 300 vertices, 4 classes, 6 features.
fn generated() -> Dataset {
    generate_sbm(&SbmOptions {
        num_vertices: 300,
        num_edges: 1500,
        num_classes: 4,
        feature_dim: 6,
        seed: 3,
        ..SbmOptions::default()
    })
    .unwrap()
}

fn features_of(ds: &Dataset) -> Array2<f32> {
    Array2::from_shape_vec(
        (ds.num_vertices(), ds.features.dim()),
        ds.features.as_slice().to_vec(),
    )
    .unwrap()
}

fn bools(mask: &[u8]) -> Vec<bool> {
    mask.iter().map(|&m| m == 1).collect()
}

/// `n` vertices' worth of random edges, with repeats and self-loops; vertex
/// `n - 1` appears, so an edge list of them has `n` vertices.
fn random_edges(n: u32, e: usize, seed: u64) -> Vec<(u32, u32)> {
    let mut rng = Rng::new(seed);
    let mut edges: Vec<(u32, u32)> = (0..e)
        .map(|_| (rng.below(n as u64) as u32, rng.below(n as u64) as u32))
        .collect();
    edges.extend([(n - 1, 0), (5, 5), (1, 2), (1, 2)]);
    edges
}

fn edge_index(edges: &[(u32, u32)]) -> Array2<i64> {
    let e = edges.len();
    Array2::from_shape_fn((2, e), |(r, j)| {
        let (s, d) = edges[j];
        if r == 0 {
            s as i64
        } else {
            d as i64
        }
    })
}

#[test]
fn csr_gives_back_a_generated_dataset_whatever_the_index_types_and_layout() {
    let ds = generated();
    let n = ds.num_vertices();
    let (indptr, indices) = (ds.graph.offsets(), ds.graph.indices());
    let x = features_of(&ds);
    let [train, val, test] = [&ds.train_mask, &ds.val_mask, &ds.test_mask].map(|m| bools(m));
    let base = || {
        DatasetBuilder::new(ds.name.clone())
            .labels(ds.labels.as_slice())
            .num_classes(ds.num_classes)
            .masks(&train, &val, &test)
    };
    let built = base()
        .csr(indptr.as_slice(), indices.as_slice())
        .features(&x)
        .build()
        .unwrap();
    assert_eq!(built, ds);

    // usize / i64 offsets, i64 / i32 ids, labels as i64, features in Fortran order.
    let indptr_usize: Vec<usize> = indptr.iter().map(|&o| o as usize).collect();
    let indptr_i64: Vec<i64> = indptr.iter().map(|&o| o as i64).collect();
    let ids_i64: Array1<i64> = indices.iter().map(|&v| v as i64).collect();
    let ids_i32: Vec<i32> = indices.iter().map(|&v| v as i32).collect();
    let mut fortran = Array2::<f32>::zeros((n, ds.features.dim()).f());
    fortran.assign(&x);
    assert!(fortran.as_slice().is_none(), "not C-contiguous");
    let labels_i64: Vec<i64> = ds.labels.iter().map(|&l| l as i64).collect();
    let other = DatasetBuilder::new(ds.name.clone())
        .csr(&indptr_usize, &ids_i64)
        .features(&fortran)
        .labels(&labels_i64)
        .num_classes(ds.num_classes)
        .masks(&train, &val, &test)
        .build()
        .unwrap();
    assert_eq!(other, ds);
    let strided = base()
        .csr(&indptr_i64, &ids_i32)
        .features(x.t().t()) // a view, not an owned array
        .build()
        .unwrap();
    assert_eq!(strided, ds);

    // The graph is symmetric already: symmetrizing changes nothing.
    let sym = base()
        .csr(indptr.as_slice(), indices.as_slice())
        .symmetrize(true)
        .features(&x)
        .build()
        .unwrap();
    assert_eq!(sym, ds);
}

#[test]
fn symmetrized_edge_index_is_import_edgelist() {
    let d = tempfile::tempdir().unwrap();
    let (n, dim) = (200u32, 5);
    let edges = random_edges(n, 900, 7);
    let mut rng = Rng::new(8);
    let labels: Vec<i64> = (0..n).map(|_| rng.below(3) as i64).collect();
    let x: Vec<f32> = (0..n as usize * dim).map(|_| rng.normal() as f32).collect();

    let text: String = edges.iter().map(|(s, d)| format!("{s}\t{d}\n")).collect();
    let edge_file = d.path().join("toy.txt");
    std::fs::write(&edge_file, text).unwrap();
    let (label_file, feature_file) = (d.path().join("y.npy"), d.path().join("x.npy"));
    npy::write_i64(&label_file, &[n as usize], labels.iter().copied()).unwrap();
    npy::write_f32_matrix(&feature_file, &x, n as usize, dim).unwrap();
    let split: SplitSpec = "10/class,0.2,rest".parse().unwrap();
    let imported = import_edge_list(
        &edge_file,
        &GraphImportOptions {
            features: FeatureSource::Npy(feature_file),
            labels: LabelSource::Npy(label_file),
            split,
            seed: 11,
            ..GraphImportOptions::default()
        },
    )
    .unwrap();

    let built = DatasetBuilder::new("toy")
        .edge_index(&edge_index(&edges))
        .symmetrize(true)
        .features(&Array2::from_shape_vec((n as usize, dim), x).unwrap())
        .labels(&labels)
        .split(split)
        .seed(11)
        .build()
        .unwrap();
    assert_eq!(built, imported);
    // Both directions, no self-loop, no repeat.
    assert_eq!(
        built.graph.neighbors(5).iter().filter(|&&v| v == 5).count(),
        0
    );
    assert_eq!(
        built.graph.neighbors(2).iter().filter(|&&v| v == 1).count(),
        1
    );
    assert!(built.graph.neighbors(1).contains(&2));
}

#[test]
fn edge_index_as_given_is_import_npy_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = generated();
    let n = ds.num_vertices();
    let x = features_of(&ds);
    let [train, val, test] = [&ds.train_mask, &ds.val_mask, &ds.test_mask].map(|m| bools(m));
    // The graph's own edges (sorted by target, as an export writes them) and random
    // ones with repeats and self-loops (kept, as a PyG edge index is).
    let cases = [ds.graph.edges().collect(), random_edges(n as u32, 700, 9)];
    for (k, edges) in cases.iter().enumerate() {
        let dir = tmp.path().join(format!("case{k}"));
        std::fs::create_dir(&dir).unwrap();
        let ei = edge_index(edges);
        let file = |name: &str| dir.join(name);
        npy::write_i64(
            &file("edge_index.npy"),
            &[2, edges.len()],
            ei.iter().copied(),
        )
        .unwrap();
        npy::write_f32_matrix(&file("features.npy"), ds.features.as_slice(), n, 6).unwrap();
        npy::write_i64(
            &file("labels.npy"),
            &[n],
            ds.labels.iter().map(|&l| l as i64),
        )
        .unwrap();
        for (name, m) in [
            ("train_mask.npy", &ds.train_mask),
            ("val_mask.npy", &ds.val_mask),
            ("test_mask.npy", &ds.test_mask),
        ] {
            npy::write_bool(&file(name), m).unwrap();
        }
        let imported = import_npy_dir(&dir).unwrap();
        let built = DatasetBuilder::new(format!("case{k}"))
            .edge_index(&ei)
            .features(&x)
            .labels(ds.labels.as_slice())
            .masks(&train, &val, &test)
            .build()
            .unwrap();
        assert_eq!(built, imported, "case {k}");
        assert_eq!(
            built.graph.num_edges(),
            edges.len(),
            "case {k}: kept as given"
        );
        if k == 0 {
            assert_eq!(built.graph, ds.graph);
        }
    }
}

#[test]
fn the_default_split_is_the_importers() {
    let ds = generated();
    let spec = SplitSpec::default();
    let built = DatasetBuilder::new("d")
        .csr(ds.graph.offsets().as_slice(), ds.graph.indices().as_slice())
        .features(&features_of(&ds))
        .labels(ds.labels.as_slice())
        .build()
        .unwrap();
    let again = DatasetBuilder::new("d")
        .csr(ds.graph.offsets().as_slice(), ds.graph.indices().as_slice())
        .features(&features_of(&ds))
        .labels(ds.labels.as_slice())
        .split(spec)
        .seed(0)
        .build()
        .unwrap();
    assert_eq!(built, again);
    assert_eq!(built.train_ids().len(), 180);
    assert_eq!(built.val_ids().len(), 60);
    assert_eq!(built.test_ids().len(), 60);
    let other_seed = DatasetBuilder::new("d")
        .csr(ds.graph.offsets().as_slice(), ds.graph.indices().as_slice())
        .features(&features_of(&ds))
        .labels(ds.labels.as_slice())
        .seed(1)
        .build()
        .unwrap();
    assert_ne!(other_seed.train_mask, built.train_mask);
}

/// A valid 4-vertex dataset's parts: a cycle as CSR, 2 features, 2 classes.
struct Parts {
    indptr: Vec<u64>,
    indices: Vec<u32>,
    x: Array2<f32>,
    y: Vec<u32>,
}

fn parts() -> Parts {
    Parts {
        indptr: vec![0, 2, 4, 6, 8],
        indices: vec![1, 3, 0, 2, 1, 3, 0, 2],
        x: Array2::from_shape_fn((4, 2), |(v, c)| (v * 2 + c) as f32),
        y: vec![0, 1, 0, 1],
    }
}

fn ok() -> DatasetBuilder {
    let p = parts();
    DatasetBuilder::new("ok")
        .csr(&p.indptr, &p.indices)
        .features(&p.x)
        .labels(&p.y)
}

/// The build's error, which must be an [`Error::Dataset`]: its field, index and
/// problem, and its message (one line).
fn dataset_error(b: DatasetBuilder) -> (String, Vec<usize>, P, String) {
    match b.build() {
        Ok(_) => panic!("expected an error"),
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "{msg}");
            match e {
                Error::Dataset {
                    field,
                    index,
                    problem,
                } => (field, index, problem, msg),
                e => panic!("expected an Error::Dataset, got {e:?}"),
            }
        }
    }
}

#[test]
fn the_valid_parts_build() {
    let ds = ok().build().unwrap();
    assert_eq!(ds.num_vertices(), 4);
    assert_eq!(ds.graph.neighbors(0), &[1, 3]);
    assert_eq!(ds.num_classes, 2);
    assert_eq!(ds.features.row(3), &[6.0, 7.0]);
}

#[test]
fn every_bad_input_is_an_error_naming_the_field() {
    let p = parts();
    let x = &p.x;
    let y = &p.y;
    let five = Array2::<f32>::zeros((5, 2));
    let mut nan = x.clone();
    nan[[2, 1]] = f32::NAN;
    let mut inf = x.clone();
    inf[[3, 0]] = f32::NEG_INFINITY;
    let mut far = Array2::<i64>::zeros((2, 18));
    far[[1, 17]] = 9;
    let t = [true, false, false, false];
    let f = [false; 4];
    let out = |value: i128, bound: u64| move |p: &P| matches!(p, P::OutOfRange { value: v, bound: b, .. } if *v == value && *b == bound);
    let neg = |value: i128| move |p: &P| matches!(p, P::Negative { value: v } if *v == value);
    let count = |expected: u64, found: u64| move |p: &P| matches!(p, P::Count { expected: e, found: f, .. } if *e == expected && *f == found);
    let invalid = |p: &P| matches!(p, P::Invalid { .. });
    type Check = Box<dyn Fn(&P) -> bool>;
    // (builder, field, index, problem, text in the message)
    let cases: Vec<(DatasetBuilder, &str, Vec<usize>, Check, &str)> = vec![
        (
            DatasetBuilder::new("g").features(x).labels(y),
            "graph",
            vec![],
            Box::new(|p: &P| matches!(p, P::Missing)),
            "graph: not given",
        ),
        (
            DatasetBuilder::new("f")
                .csr(&p.indptr, &p.indices)
                .labels(y),
            "features",
            vec![],
            Box::new(|p: &P| matches!(p, P::Missing)),
            "features: not given",
        ),
        (
            DatasetBuilder::new("l")
                .csr(&p.indptr, &p.indices)
                .features(x),
            "labels",
            vec![],
            Box::new(|p: &P| matches!(p, P::Missing)),
            "labels: not given",
        ),
        // CSR.
        (
            ok().csr(&Vec::<u64>::new(), &p.indices),
            "indptr",
            vec![],
            Box::new(invalid),
            "indptr: empty; it needs num_vertices + 1 entries",
        ),
        (
            ok().csr(&[0u64], &Vec::<u32>::new())
                .features(&Array2::<f32>::zeros((0, 2)))
                .labels(&Vec::<u32>::new()),
            "graph",
            vec![],
            Box::new(invalid),
            "graph: 0 vertices",
        ),
        (
            ok().csr(&[1u64, 2, 4, 6, 8], &p.indices),
            "indptr",
            vec![0],
            Box::new(invalid),
            "indptr[0]: 1, expected 0",
        ),
        (
            ok().csr(&[0u64, 2, 1, 6, 8], &p.indices),
            "indptr",
            vec![2],
            Box::new(invalid),
            "indptr[2]: 1 is less than indptr[1] = 2; offsets must not decrease",
        ),
        (
            ok().csr(&[0u64, 2, 4, 6, 7], &p.indices),
            "indptr",
            vec![4],
            Box::new(invalid),
            "indptr[4]: 7, expected the number of indices 8",
        ),
        (
            ok().csr(&[0i64, -1, 4, 6, 8], &p.indices),
            "indptr",
            vec![1],
            Box::new(neg(-1)),
            "indptr[1] = -1 is negative",
        ),
        (
            ok().csr(&p.indptr, &[1u32, 3, 0, 9, 1, 3, 0, 2]),
            "indices",
            vec![3],
            Box::new(out(9, 4)),
            "indices[3] = 9 is not below the vertex count 4",
        ),
        (
            ok().csr(&p.indptr, &[-2i32, 3, 0, 2, 1, 3, 0, 2]),
            "indices",
            vec![0],
            Box::new(neg(-2)),
            "indices[0] = -2 is negative",
        ),
        (
            ok().num_vertices(5),
            "indptr",
            vec![],
            Box::new(count(6, 5)),
            "indptr: length 5, expected 6 (num_vertices + 1)",
        ),
        // Edge index.
        (
            ok().edge_index(&Array2::<i64>::zeros((3, 2))),
            "edge_index",
            vec![],
            Box::new(|p: &P| matches!(p, P::Shape { found, .. } if found == &[3, 2])),
            "edge_index: shape (3, 2), expected (2, E)",
        ),
        (
            DatasetBuilder::new("e")
                .edge_index(&far)
                .features(&five)
                .labels(&[0u32; 5]),
            "edge_index",
            vec![1, 17],
            Box::new(out(9, 5)),
            "edge_index[1, 17] = 9 is not below the vertex count 5",
        ),
        (
            ok().edge_index(&array![[0i64, 1, -1], [1, 2, 3]]),
            "edge_index",
            vec![0, 2],
            Box::new(neg(-1)),
            "edge_index[0, 2] = -1 is negative",
        ),
        (
            ok().edge_index(&array![[1u64 << 33], [1]]),
            "edge_index",
            vec![0, 0],
            Box::new(out(1 << 33, u32::MAX as u64)),
            "edge_index[0, 0] = 8589934592 is not below the u32 vertex id limit",
        ),
        (
            ok().edge_index(&array![[0i64], [1]])
                .features(&Array2::<f32>::zeros((0, 2)))
                .labels(&Vec::<u32>::new()),
            "graph",
            vec![],
            Box::new(invalid),
            "graph: 0 vertices",
        ),
        // Counts come before ids: one feature row short is that, not an id
        // out of range (with the edge index's ids below 5 but not below 4).
        (
            DatasetBuilder::new("short")
                .edge_index(&array![[0i64, 4], [4, 1]])
                .features(x)
                .labels(&[0u32; 5]),
            "features",
            vec![],
            Box::new(count(5, 4)),
            "features: length 4, expected 5 (the number of labels",
        ),
        (
            DatasetBuilder::new("stated")
                .edge_index(&array![[0i64, 4], [4, 1]])
                .num_vertices(5)
                .features(x)
                .labels(&[0u32; 5]),
            "features",
            vec![],
            Box::new(count(5, 4)),
            "features: length 4, expected 5 (num_vertices)",
        ),
        (
            DatasetBuilder::new("stated")
                .edge_index(&array![[0i64, 4], [4, 1]])
                .num_vertices(4)
                .features(x)
                .labels(y),
            "edge_index",
            vec![1, 0],
            Box::new(out(4, 4)),
            "edge_index[1, 0] = 4 is not below the vertex count 4",
        ),
        // Features.
        (
            ok().features(&Array2::<f32>::zeros((3, 2))),
            "features",
            vec![],
            Box::new(count(4, 3)),
            "features: length 3, expected 4 (the vertices of the CSR)",
        ),
        (
            ok().features(&Array2::<f32>::zeros((4, 0))),
            "features",
            vec![],
            Box::new(|p: &P| matches!(p, P::Shape { found, .. } if found == &[4, 0])),
            "features: shape (4, 0), expected (n, d) with d ≥ 1",
        ),
        (
            ok().features(&nan),
            "features",
            vec![2, 1],
            Box::new(|p: &P| matches!(p, P::NonFinite { value } if value.is_nan())),
            "features[2, 1] = NaN is not a finite number",
        ),
        (
            ok().features(&inf),
            "features",
            vec![3, 0],
            Box::new(|p: &P| matches!(p, P::NonFinite { value } if *value == f32::NEG_INFINITY)),
            "features[3, 0] = -inf is not a finite number",
        ),
        // Labels.
        (
            ok().labels(&[0u32, 1, 0]),
            "labels",
            vec![],
            Box::new(count(4, 3)),
            "labels: length 3, expected 4",
        ),
        (
            ok().labels(&[0i64, -1, 0, 1]),
            "labels",
            vec![1],
            Box::new(neg(-1)),
            "labels[1] = -1 is negative",
        ),
        (
            ok().labels(&[1u64 << 32, 0, 0, 0]),
            "labels",
            vec![0],
            Box::new(out(1 << 32, u32::MAX as u64)),
            "labels[0] = 4294967296 is not below the u32 label limit",
        ),
        (
            ok().labels(&[0u32, 1, 0, 2]).num_classes(2),
            "labels",
            vec![3],
            Box::new(out(2, 2)),
            "labels[3] = 2 is not below num_classes 2",
        ),
        (
            ok().num_classes(0),
            "num_classes",
            vec![],
            Box::new(invalid),
            "num_classes: 0",
        ),
        // Masks.
        (
            ok().masks(&t, &[false; 3], &f),
            "val_mask",
            vec![],
            Box::new(count(4, 3)),
            "val_mask: length 3, expected 4",
        ),
        (
            ok().masks(&t, &f, &[false, false, true, false, true]),
            "test_mask",
            vec![],
            Box::new(count(4, 5)),
            "test_mask: length 5, expected 4",
        ),
        (
            ok().masks(&t, &f, &[false, true, false, false]).masks(
                &[false, false, true, true],
                &f,
                &[false, false, true, false],
            ),
            "train_mask",
            vec![2],
            Box::new(|p: &P| matches!(p, P::Overlap { other } if *other == "test_mask")),
            "train_mask[2]: also in test_mask",
        ),
        // The first failure is reported even if a later call would have been fine.
        (
            ok().labels(&[-3i64, 0, 0, 0]).labels(y),
            "labels",
            vec![0],
            Box::new(neg(-3)),
            "labels[0] = -3 is negative",
        ),
    ];
    for (builder, want_field, want_index, want_problem, want_text) in cases {
        let (field, index, problem, msg) = dataset_error(builder);
        assert_eq!((field.as_str(), &index), (want_field, &want_index), "{msg}");
        assert!(want_problem(&problem), "{problem:?}: {msg}");
        assert!(msg.starts_with("invalid dataset: "), "{msg}");
        assert!(msg.contains(want_text), "want `{want_text}` in: {msg}");
    }
    // The split's own check names it.
    let (field, _, problem, msg) = dataset_error(ok().split("0.7,0.7,rest".parse().unwrap()));
    assert_eq!(field, "split", "{msg}");
    assert!(matches!(problem, P::Split { .. }), "{msg}");
    assert!(msg.contains("more than 1"), "{msg}");
}

/// The case: an edge index over 5,000 vertices with a features matrix one
/// row short is a row-count mismatch (features against labels, or against a stated
/// vertex count), not an edge id out of range, even when an edge names vertex
/// 4,999.
#[test]
fn one_feature_row_short_is_a_count_mismatch_not_an_id_out_of_range() {
    let n = 5_000usize;
    let mut rng = Rng::new(7);
    let mut ei = Array2::<i64>::zeros((2, 20_000));
    for j in 0..ei.ncols() {
        ei[[0, j]] = (rng.next_u64() % n as u64) as i64;
        ei[[1, j]] = (rng.next_u64() % n as u64) as i64;
    }
    ei[[1, 1405]] = 4_999; // an edge to the last vertex, as in the report
    let short = Array2::<f32>::ones((n - 1, 8));
    let labels: Vec<u32> = (0..n as u32).map(|v| v % 3).collect();
    let (field, index, problem, msg) = dataset_error(
        DatasetBuilder::new("short")
            .edge_index(&ei)
            .features(&short)
            .labels(&labels),
    );
    assert_eq!(
        (field.as_str(), index.as_slice()),
        ("features", &[][..]),
        "{msg}"
    );
    assert!(
        matches!(
            problem,
            P::Count {
                expected: 5_000,
                found: 4_999,
                ..
            }
        ),
        "{problem:?}"
    );
    assert!(!msg.contains("edge_index"), "{msg}");
    // Stated, the count is the basis (and the labels agree with it).
    let (field, _, problem, msg) = dataset_error(
        DatasetBuilder::new("short")
            .edge_index(&ei)
            .num_vertices(n)
            .features(&short)
            .labels(&labels),
    );
    assert_eq!(field, "features", "{msg}");
    assert!(
        matches!(&problem, P::Count { expected: 5_000, found: 4_999, basis } if *basis == "num_vertices"),
        "{problem:?}"
    );
    // Labels short as well as features: still a count, named on the features
    // against the stated count.
    let (field, _, problem, _) = dataset_error(
        DatasetBuilder::new("short")
            .edge_index(&ei)
            .num_vertices(n)
            .features(&Array2::<f32>::ones((n, 8)))
            .labels(&labels[..n - 1]),
    );
    assert_eq!(field, "labels");
    assert!(matches!(
        problem,
        P::Count {
            expected: 5_000,
            found: 4_999,
            ..
        }
    ));
    // With every count right it builds.
    let ds = DatasetBuilder::new("ok")
        .edge_index(&ei)
        .num_vertices(n)
        .features(&Array2::<f32>::ones((n, 8)))
        .labels(&labels)
        .build()
        .unwrap();
    assert_eq!(ds.num_vertices(), n);
}

/// The `*_shared` setters use the arrays in place — the dataset's features,
/// CSR and labels are the very buffers given (the same addresses) — and
/// convert only other widths, saying which; their checks and messages are the
/// copying setters'.
#[test]
fn shared_arrays_are_used_in_place_and_checked_as_the_others() {
    use cpu_ops::HostArray;
    let ds = generated();
    let n = ds.num_vertices();
    let features: HostArray<f32> = ds.features.data().clone();
    let indptr: HostArray<i64> =
        HostArray::from_vec(ds.graph.offsets().iter().map(|&o| o as i64).collect());
    let indices: HostArray<i32> =
        HostArray::from_vec(ds.graph.indices().iter().map(|&v| v as i32).collect());
    let labels: HostArray<i32> = HostArray::from_vec(ds.labels.iter().map(|&l| l as i32).collect());
    let b = DatasetBuilder::new("shared")
        .csr_shared(indptr.clone(), indices.clone())
        .features_shared(features.clone(), n, ds.features.dim())
        .labels_shared(labels.clone())
        .masks_shared(
            ds.train_mask.clone(),
            ds.val_mask.clone(),
            ds.test_mask.clone(),
        );
    assert!(b.copies().is_empty(), "{:?}", b.copies());
    let built = b.build().unwrap();
    let addr = |s: &[u8]| s.as_ptr() as usize;
    assert!(built.features.data().shares_storage(&features));
    assert_eq!(
        addr(bytemuck::cast_slice(built.graph.offsets())),
        addr(bytemuck::cast_slice(&indptr))
    );
    assert_eq!(
        addr(bytemuck::cast_slice(built.graph.indices())),
        addr(bytemuck::cast_slice(&indices))
    );
    assert_eq!(
        addr(bytemuck::cast_slice(&built.labels)),
        addr(bytemuck::cast_slice(&labels))
    );
    assert!(built.train_mask.shares_storage(&ds.train_mask));
    assert_eq!(built.graph, ds.graph);
    assert_eq!(built.labels, ds.labels);

    // Other widths are converted, and named.
    let narrow: HostArray<i16> = HostArray::from_vec(ds.labels.iter().map(|&l| l as i16).collect());
    let b = DatasetBuilder::new("narrow")
        .csr_shared(
            HostArray::from_vec(
                ds.graph
                    .offsets()
                    .iter()
                    .map(|&o| o as u32)
                    .collect::<Vec<_>>(),
            ),
            ds.graph.indices().clone(),
        )
        .features_shared(features.clone(), n, ds.features.dim())
        .labels_shared(narrow);
    assert_eq!(b.copies(), ["indptr: u32 → u64", "labels: i16 → u32"]);
    assert_eq!(b.build().unwrap().labels, ds.labels);

    // The checks and messages of the copying setters.
    let mut bad = indices.to_vec();
    bad[5] = -3;
    let e = DatasetBuilder::new("bad")
        .csr_shared(indptr.clone(), HostArray::from_vec(bad))
        .features_shared(features.clone(), n, ds.features.dim())
        .labels_shared(labels.clone())
        .build()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid dataset: indices[5] = -3 is negative"
    );
    let mut nan = features.to_vec();
    nan[7] = f32::NAN;
    let dim = ds.features.dim();
    let e = DatasetBuilder::new("nan")
        .csr_shared(indptr, indices)
        .features_shared(HostArray::from_vec(nan), n, dim)
        .labels_shared(labels)
        .masks_shared(
            HostArray::from_vec(vec![2u8; n]),
            ds.val_mask.clone(),
            ds.test_mask.clone(),
        )
        .build()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "invalid dataset: features[{}, {}] = NaN is not a finite number",
            7 / dim,
            7 % dim
        )
    );
}

/// `edge_lists` is `edge_index` with its rows apart: same graph, same messages.
#[test]
fn edge_lists_are_an_edge_index_in_two_arrays() {
    let ds = generated();
    let edges: Vec<(u32, u32)> = ds.graph.edges().collect();
    let ei = edge_index(&edges);
    let (src, dst) = (ei.row(0).to_owned(), ei.row(1).to_owned());
    let a = DatasetBuilder::new("a")
        .edge_index(&ei)
        .features(&features_of(&ds))
        .labels(&*ds.labels)
        .build()
        .unwrap();
    let b = DatasetBuilder::new("b")
        .edge_lists(&src, &dst)
        .features(&features_of(&ds))
        .labels(&*ds.labels)
        .build()
        .unwrap();
    assert_eq!(a.graph, b.graph);
    let e = DatasetBuilder::new("c")
        .edge_lists(&src, &dst.slice(runtime::ndarray::s![..3]).to_owned())
        .features(&features_of(&ds))
        .labels(&*ds.labels)
        .build()
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("invalid dataset: edge_index: length 3, expected"),
        "{e}"
    );
}
