//! The `tandem` binary as a user runs it: happy paths and one-line errors.

use std::path::Path;
use std::process::{Command, Output};

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

fn err(args: &[&str]) -> String {
    let out = tandem(args);
    assert!(!out.status.success(), "tandem {args:?} should fail");
    let e = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!e.contains("panicked"), "panic instead of an error: {e}");
    e
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

#[test]
fn generate_info_export_import_round_trip() {
    let d = tempfile::tempdir().expect("tempdir");
    let ds = d.path().join("g.tds");
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
        "--seed",
        "7",
        "-o",
        s(&ds),
    ]);
    assert!(out.contains("3000 vertices"), "{out}");
    let info = ok(&["info", s(&ds), "--verify"]);
    assert!(info.contains("4 classes"), "{info}");
    let npy = d.path().join("npy");
    ok(&["export", s(&ds), "--format", "npy", "-o", s(&npy)]);
    assert!(npy.join("edge_index.npy").exists());
    let back = d.path().join("back.tds");
    ok(&["import", "npy", s(&npy), "-o", s(&back)]);
    // Same content; the name differs only if the exporter did not record it.
    let a = runtime::dataset::open_dataset(&ds, runtime::dataset::Verify::Full).expect("a");
    let b = runtime::dataset::open_dataset(&back, runtime::dataset::Verify::Full).expect("b");
    assert_eq!(
        (a.graph, a.features, a.labels),
        (b.graph, b.features, b.labels)
    );
}

#[test]
fn rmat_generation_is_deterministic_across_runs() {
    let d = tempfile::tempdir().expect("tempdir");
    let (x, y) = (d.path().join("x.tds"), d.path().join("y.tds"));
    for p in [&x, &y] {
        ok(&[
            "generate",
            "rmat",
            "--vertices",
            "5000",
            "--edges",
            "40000",
            "--dim",
            "4",
            "--seed",
            "3",
            "-o",
            s(p),
        ]);
    }
    assert_eq!(std::fs::read(&x).expect("x"), std::fs::read(&y).expect("y"));
}

#[test]
fn edge_list_import_and_small_benches() {
    let d = tempfile::tempdir().expect("tempdir");
    let el = d.path().join("edges.txt");
    let mut text = String::from("# ring with chords\n");
    for i in 0..500u32 {
        text.push_str(&format!(
            "{i} {}\n{i}\t{}\n",
            (i + 1) % 500,
            (i * 7 + 3) % 500
        ));
    }
    std::fs::write(&el, text).expect("write");
    let ds = d.path().join("e.tds");
    ok(&[
        "import",
        "edgelist",
        s(&el),
        "--classes",
        "3",
        "--feature-dim",
        "5",
        "-o",
        s(&ds),
    ]);
    let out = ok(&[
        "bench",
        "sample",
        "--dataset",
        s(&ds),
        "--fanouts",
        "5,5",
        "--batch-size",
        "64",
        "--batches",
        "5",
    ]);
    assert!(out.contains("edges"), "{out}");
    let out = ok(&[
        "bench",
        "gather",
        "--rows",
        "4096",
        "--dim",
        "16",
        "--batch-rows",
        "1000",
        "--batches",
        "2",
    ]);
    assert!(out.contains("GB/s"), "{out}");
    let out = ok(&[
        "bench",
        "aggregate",
        "--dst",
        "500",
        "--fanout",
        "5",
        "--src",
        "3000",
        "--dim",
        "16",
        "--reps",
        "2",
    ]);
    assert!(out.contains("GB/s"), "{out}");
    let out = ok(&[
        "bench",
        "gemm",
        "--shapes",
        "64,32,16;33,17,5",
        "--reps",
        "1",
    ]);
    assert!(out.contains("GFLOP/s"), "{out}");
    let e = err(&["bench", "gemm", "--shapes", "1,2"]);
    assert!(e.contains("--shapes"), "{e}");
}

#[test]
fn bad_input_gives_one_line_errors_naming_the_file() {
    let d = tempfile::tempdir().expect("tempdir");
    let missing = d.path().join("missing.tds");
    let e = err(&["info", s(&missing)]);
    assert!(e.contains("missing.tds"), "{e}");

    let junk = d.path().join("junk.tds");
    std::fs::write(&junk, b"this is not a dataset at all").expect("write");
    let e = err(&["info", s(&junk)]);
    assert!(e.contains("junk.tds") && e.contains("magic"), "{e}");

    let metis = d.path().join("bad.graph");
    std::fs::write(&metis, b"3 2\n2\n1 4\n\n").expect("write");
    let out = d.path().join("never.tds");
    let e = err(&["import", "metis", s(&metis), "-o", s(&out)]);
    assert!(e.contains("bad.graph"), "{e}");
    assert!(!out.exists(), "no partial output on failure");
    assert_eq!(
        std::fs::read_dir(d.path()).expect("ls").count(),
        2,
        "no temporary files left behind"
    );

    let e = err(&["generate", "rmat", "--vertices", "0", "-o", s(&out)]);
    assert!(e.contains("vertices") || e.contains("num_vertices"), "{e}");
    let e = err(&["bench", "sample", "--fanouts", "0,3"]);
    assert!(e.contains("fanout"), "{e}");
}

#[test]
fn train_reports_config_errors_by_key() {
    let e = err(&["train", "--set", "model.kind=mlp"]);
    assert!(e.contains("model.kind"), "{e}");
    let d = tempfile::tempdir().expect("tempdir");
    let cfg = d.path().join("c.toml");
    std::fs::write(&cfg, "[train]\nepochz = 3\n").expect("write");
    let e = err(&["train", "--config", s(&cfg)]);
    assert!(e.contains("c.toml") && e.contains("epochz"), "{e}");
}

#[test]
fn train_runs_a_small_config() {
    let out = ok(&[
        "train",
        "--set",
        "data.synthetic.vertices=3000",
        "--set",
        "data.synthetic.edges=20000",
        "--set",
        "train.epochs=2",
        "--set",
        "model.hidden=16",
    ]);
    assert!(out.contains("test accuracy"), "{out}");
    assert!(out.contains("[train]"), "effective config printed: {out}");
}
