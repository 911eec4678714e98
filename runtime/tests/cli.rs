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

/// `tandem generate sbm`: 3000 vertices, 20,000 edges, 4 classes, 8 features.
fn generate_sbm(ds: &Path) -> String {
    ok(&[
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
        s(ds),
    ])
}

#[test]
fn generate_info_export_import_round_trip() {
    let d = tempfile::tempdir().expect("tempdir");
    let ds = d.path().join("g.tds");
    let out = generate_sbm(&ds);
    assert!(out.contains("3000 vertices"), "{out}");
    let info = ok(&["info", s(&ds), "--verify"]);
    assert!(info.contains("4 classes"), "{info}");
    let npy = d.path().join("npy");
    ok(&["export", s(&ds), "--format", "npy", "-o", s(&npy)]);
    assert!(npy.join("edge_index.npy").exists());
    let back = d.path().join("back.tds");
    ok(&["import", "npy", s(&npy), "-o", s(&back)]);
    // Same content; the name differs only if the exporter did not record it.
    let a = runtime::data::open_dataset(&ds, runtime::data::Verify::Full).expect("a");
    let b = runtime::data::open_dataset(&back, runtime::data::Verify::Full).expect("b");
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

/// Off a terminal (here stderr is a pipe) generation and import print plain progress
/// lines on stderr, at most one per tenth of each phase; stdout keeps only the summary.
#[test]
fn progress_lines_on_stderr_when_not_a_terminal() {
    let d = tempfile::tempdir().expect("tempdir");
    let ds = d.path().join("r.tds");
    // 150,000 edges are three generation chunks: the edge phase has lines before 100%.
    let out = tandem(&[
        "generate",
        "rmat",
        "--vertices",
        "2000",
        "--edges",
        "150000",
        "--classes",
        "4",
        "--dim",
        "4",
        "-o",
        s(&ds),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "stdout: {stdout}");
    assert!(lines[1].starts_with("wrote "), "stdout: {stdout}");
    assert!(!stdout.contains('%'), "progress on stdout: {stdout}");
    let progress: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("generate rmat: "))
        .collect();
    assert!(
        !stderr.contains('\r'),
        "bar drawn off a terminal: {stderr:?}"
    );
    for phase in ["edges", "graph", "features"] {
        assert!(
            progress
                .iter()
                .any(|l| l.contains(&format!(": {phase} 100% "))),
            "no end of {phase} in {stderr}"
        );
    }
    let edges = progress.iter().filter(|l| l.contains(": edges ")).count();
    assert!((2..=10).contains(&edges), "{edges} edge lines in {stderr}");

    let el = d.path().join("edges.txt");
    std::fs::write(&el, "0 1\n1 2\n2 0\n2 3\n").expect("write");
    let out = tandem(&[
        "import",
        "edgelist",
        s(&el),
        "-o",
        s(&d.path().join("e.tds")),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    for phase in ["reading", "graph", "attach"] {
        assert!(
            stderr.contains(&format!("import edgelist: {phase} 100% ")),
            "no end of {phase} in {stderr}"
        );
    }
    assert!(!String::from_utf8_lossy(&out.stdout).contains('%'));
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
    // Both loaders on the same seeds: the same batches, so the same sizes.
    let out = ok(&[
        "bench",
        "loader",
        "--dataset",
        s(&ds),
        "--fanouts",
        "4,3",
        "--batch-size",
        "32",
        "--batches",
        "4",
        "--cache-bytes",
        "1000",
        "--dtype",
        "bf16",
    ]);
    let json: serde_json::Value = serde_json::from_str(
        out.lines()
            .find_map(|l| l.strip_prefix("json: "))
            .unwrap_or_else(|| panic!("no json line: {out}")),
    )
    .expect("json");
    assert_eq!(json["host"]["batches"], 4, "{json}");
    assert_eq!(json["device_run"]["batches"], 4, "{json}");
    assert_eq!(json["host"]["mean_edges"], json["device_run"]["mean_edges"]);
    assert_eq!(json["host"]["mean_nodes"], json["device_run"]["mean_nodes"]);
    assert!(json["ratio"].as_f64().is_some_and(|r| r > 0.0), "{json}");
    for (key, bad) in [("--device", "tpu"), ("--dtype", "f16")] {
        let e = err(&[
            "bench",
            "loader",
            "--vertices",
            "100",
            "--edges",
            "300",
            key,
            bad,
        ]);
        assert!(e.contains(key) && e.contains(bad), "{e}");
    }
    // One rank needs no MPI: the full-graph evaluation rows report its time.
    let small = [
        "--set",
        "data.synthetic.vertices=1500",
        "--set",
        "data.synthetic.edges=6000",
        "--set",
        "model.hidden=16",
    ];
    let mut args = vec![
        "bench",
        "dist",
        "--ranks",
        "1",
        "--epochs",
        "1",
        "--features",
        "full-sharded,replicated",
    ];
    args.extend(small);
    let out = ok(&args);
    let row = out
        .lines()
        .find(|l| l.starts_with("full-sharded"))
        .unwrap_or_else(|| panic!("no full-sharded row: {out}"));
    assert!(row.trim_end().ends_with("1.00×"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("replicated ")), "{out}");
    let e = err(&["bench", "dist", "--ranks", "1", "--features", "sharded"]);
    assert!(
        e.contains("--features") && e.contains("full-sharded"),
        "{e}"
    );
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

/// A config's relative `data.path` is taken from the config's folder (from any
/// directory); a missing file's error names the config that pointed at it; a
/// `--set` path is the current directory's.
#[test]
fn a_configs_data_path_is_taken_from_its_folder_and_errors_name_the_config() {
    let d = tempfile::tempdir().expect("tempdir");
    let configs = d.path().join("configs");
    std::fs::create_dir(&configs).expect("mkdir");
    generate_sbm(&d.path().join("g.tds"));
    let cfg = configs.join("run.toml");
    std::fs::write(
        &cfg,
        "[data]\npath = \"../g.tds\"\n[model]\nhidden = 16\n[train]\nepochs = 1\n",
    )
    .expect("write");
    // Run from elsewhere: the path is the config's, and the effective
    // configuration holds it absolute.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["train", "--config", s(&cfg)])
        .current_dir(elsewhere.path())
        .output()
        .expect("run tandem");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let abs = std::path::absolute(configs.join("../g.tds")).expect("absolute");
    assert!(
        stdout.contains(&format!("path = {:?}", s(&abs))),
        "{stdout}"
    );
    // A missing file: the error names the file where it was looked for and the
    // config that named it, and the hint says how relative paths resolve.
    std::fs::write(&cfg, "[data]\npath = \"missing.tds\"\n").expect("write");
    let e = err(&["train", "--config", s(&cfg)]);
    let missing = std::path::absolute(configs.join("missing.tds")).expect("absolute");
    assert!(e.contains(&format!("{}:", missing.display())), "{e}");
    assert!(
        e.contains(&format!("(data.path, set by {})", cfg.display())),
        "{e}"
    );
    assert!(
        e.contains("hint: a relative data.path in a config file"),
        "{e}"
    );
    // --set wins, from the current directory.
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["train", "--config", s(&cfg), "--set", "data.path=\"g.tds\""])
        .current_dir(d.path())
        .output()
        .expect("run tandem");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Without a GPU the run speaks the host's terms: what runs where in the device
/// note, the host backend's tracks and copies in the trace summary (no
/// accelerator stream, no transfer rate, no NVML note), and counts in the
/// singular where they are one.
#[test]
fn a_host_run_says_what_the_cpu_does_in_its_own_terms() {
    let d = tempfile::tempdir().expect("tempdir");
    let trace = d.path().join("t.json");
    let out = tandem(&[
        "train",
        "--quiet-config",
        "--device",
        "host",
        "--set",
        "data.synthetic.vertices=2000",
        "--set",
        "data.synthetic.edges=10000",
        "--set",
        "model.hidden=16",
        "--set",
        "model.layers=1",
        "--set",
        "train.fanouts=[5]",
        "--set",
        "threads.compute=1",
        "--set",
        "train.epochs=2",
        "--trace",
        s(&trace),
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("sage × 1 layer,") && text.contains("; 1 thread\n"),
        "{text}"
    );
    for gpu_speak in [
        "gpu-sample-gpu-gather",
        "acc stream",
        "GB/s",
        "h2d",
        "NVML",
        "accelerator not recorded",
        " acc)",
    ] {
        assert!(!text.contains(gpu_speak), "{gpu_speak}:\n{text}");
    }
    assert!(
        text.contains("sampling, gathering and training all on the CPU"),
        "{text}"
    );
    assert!(text.contains("host backend compute"), "{text}");
    assert!(text.contains("into the host backend's buffers"), "{text}");
    // The report of the written trace, and its picture, say the same.
    let svg = d.path().join("u.svg");
    let report = ok(&["report", s(&trace), "--svg", s(&svg)]);
    assert!(
        report.contains("host backend compute") && !report.contains("GB/s"),
        "{report}"
    );
    let picture = std::fs::read_to_string(&svg).expect("svg");
    assert!(
        picture.contains("epoch 0") && picture.contains("epoch 1"),
        "epoch markers"
    );
    assert!(picture.contains("evaluation"), "the evaluation's own track");
}

/// A split part that draws no vertex is an error naming it (a 3-vertex graph
/// split 60% / 20% / rest has no test vertex), not a test accuracy of 0; a
/// part asked to be empty gives no accuracy, and the run says so.
#[test]
fn empty_splits_are_refused_or_said() {
    let e = err(&[
        "train",
        "--set",
        "data.synthetic.vertices=3",
        "--set",
        "data.synthetic.classes=1",
    ]);
    assert!(e.contains("the test part (rest) has no vertices"), "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "one line: {e}");
    let d = tempfile::tempdir().expect("tempdir");
    let ds = d.path().join("g.tds");
    let e = err(&[
        "generate",
        "sbm",
        "--vertices",
        "3",
        "--edges",
        "3",
        "--classes",
        "1",
        "-o",
        s(&ds),
    ]);
    assert!(e.contains("the test part (rest) has no vertices"), "{e}");
    ok(&[
        "generate",
        "sbm",
        "--vertices",
        "300",
        "--edges",
        "1000",
        "--classes",
        "2",
        "--split",
        "0.8,0.2,0",
        "-o",
        s(&ds),
    ]);
    let out = ok(&[
        "train",
        "--quiet-config",
        "--set",
        &format!("data.path={:?}", s(&ds)),
        "--set",
        "train.epochs=2",
        "--set",
        "model.hidden=8",
    ]);
    assert!(out.contains("note: the test split is empty"), "{out}");
    // Epoch lines: epoch, loss, train, val, test, ...: no test accuracy (not 0).
    let epochs: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|t| t.len() == 7 && (t[0] == "0" || t[0] == "1"))
        .collect();
    assert_eq!(epochs.len(), 2, "{out}");
    assert!(epochs.iter().all(|t| t[4] == "-" && t[3] != "-"), "{out}");
    assert!(
        !out.lines().any(|l| l.starts_with("test accuracy")),
        "{out}"
    );
    assert!(out.contains("mean epoch time"), "{out}");
}

fn tandem_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run tandem")
}

fn metrics(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[test]
fn train_out_dir_env_overrides_and_bit_exact_resume() {
    let d = tempfile::tempdir().expect("tempdir");
    let (run, whole) = (d.path().join("run"), d.path().join("whole"));
    let small = [
        "train",
        "--quiet-config",
        "--set",
        "data.synthetic.vertices=2000",
        "--set",
        "data.synthetic.edges=12000",
        "--set",
        "model.hidden=16",
        "--set",
        "train.batch_size=256",
        "--set",
        "threads.compute=2",
    ];
    fn with<'a>(small: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [small, extra].concat()
    }

    // Two epochs (from the environment), checkpoint every epoch.
    let out = tandem_env(
        &with(
            &small,
            &["--set", "train.checkpoint_every=1", "--out", s(&run)],
        ),
        &[("TANDEM_TRAIN__EPOCHS", "2"), ("TANDEM_TRAIN__LR", "0.01")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cfg = std::fs::read_to_string(run.join("config.toml")).expect("config.toml");
    let cfg = runtime::config::TrainConfig::from_toml(&cfg, Path::new("config.toml"))
        .expect("the saved config parses");
    assert_eq!((cfg.train.epochs, cfg.train.lr), (2, 0.01));
    assert_eq!(cfg.data.synthetic.vertices, 2000);
    assert_eq!(metrics(&run).len(), 2);
    let ck = runtime::Checkpoint::read(&run.join("checkpoint.tck")).expect("checkpoint");
    assert_eq!(ck.position.epoch, 2);
    // Only the three outputs, no temporaries.
    assert_eq!(std::fs::read_dir(&run).expect("dir").count(), 3);

    // The same run in one go, four epochs.
    let out = tandem_env(
        &with(&small, &["--set", "train.epochs=4", "--out", s(&whole)]),
        &[("TANDEM_TRAIN__LR", "0.01")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Resume to four epochs from the checkpoint (its config is the base).
    let resumed = ok(&[
        "train",
        "--resume",
        s(&run.join("checkpoint.tck")),
        "--set",
        "train.epochs=4",
        "--out",
        s(&run),
    ]);
    assert!(
        resumed.contains("resumed from") && resumed.contains("epoch 2"),
        "{resumed}"
    );
    let (a, b) = (metrics(&run), metrics(&whole));
    assert_eq!(a.len(), 4);
    for (x, y) in a.iter().zip(&b) {
        for k in ["epoch", "loss", "train_acc", "val_acc", "test_acc", "steps"] {
            assert_eq!(x[k], y[k], "{k}: resumed {x} vs uninterrupted {y}");
        }
    }

    // Resuming a finished run trains nothing and says so (the library's
    // `Error::TrainingComplete` is not an error here).
    let done = ok(&["train", "--resume", s(&run.join("checkpoint.tck"))]);
    assert!(done.contains("nothing to train"), "{done}");

    // A new run may not overwrite an earlier one.
    let e = err(&with(&small, &["--out", s(&run)]));
    assert!(e.contains("earlier run") && e.contains("--resume"), "{e}");
    // Environment errors name the variable.
    let out = tandem_env(&small, &[("TANDEM_TRAIN__EPOCH", "2")]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("TANDEM_TRAIN__EPOCH"),
        "{e}"
    );
    // A damaged checkpoint is named.
    let bad = d.path().join("bad.tck");
    std::fs::write(&bad, b"TANDEMCK\x01\x00\x00\x00garbage-garbage").expect("write");
    let e = err(&["train", "--resume", s(&bad)]);
    assert!(e.contains("bad.tck") && e.contains("checksum"), "{e}");
    #[cfg(not(feature = "hwloc"))]
    {
        let e = err(&with(&small, &["--set", "threads.pin=cores"]));
        assert!(e.contains("threads.pin") && e.contains("hwloc"), "{e}");
    }
}

#[test]
fn device_cuda_without_a_gpu_is_a_one_line_error_and_auto_falls_back() {
    let small = [
        "--set",
        "data.synthetic.vertices=2000",
        "--set",
        "data.synthetic.edges=12000",
        "--set",
        "train.epochs=1",
        "--set",
        "model.hidden=16",
        "--quiet-config",
    ];
    let gpu =
        tandem(&["--version"]).status.success() && std::path::Path::new("/dev/nvidia0").exists();
    if gpu {
        eprintln!("skipped: this machine has a GPU (/dev/nvidia0)");
        return;
    }
    let mut args = vec!["train", "--device", "cuda"];
    args.extend(small);
    let e = err(&args);
    assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    assert!(e.contains("device.kind") && e.contains("lib"), "{e}");
    let mut args = vec!["train", "--device", "auto"];
    args.extend(small);
    let out = ok(&args);
    assert!(
        out.contains("device: host") && out.contains("no usable GPU"),
        "{out}"
    );
    assert!(out.contains("test accuracy"), "{out}");
    let e = err(&["train", "--device", "tpu"]);
    assert!(e.contains("device.kind"), "{e}");
}

#[test]
fn ctrl_c_checkpoints_exits_130_and_resume_finishes_the_run() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let d = tempfile::tempdir().expect("tempdir");
    let run = d.path().join("run");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args([
            "train",
            "--quiet-config",
            "--set",
            "data.synthetic.vertices=3000",
            "--set",
            "data.synthetic.edges=20000",
            "--set",
            "model.hidden=16",
            "--set",
            "train.epochs=400",
            "--out",
            s(&run),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tandem");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    // Wait for the first epoch line, then interrupt.
    for line in lines.by_ref() {
        if line.expect("line").trim_start().starts_with("0 ") {
            break;
        }
    }
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    // As a shell reports a process SIGINT ended: 128 + 2, and no error line.
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains("interrupted") && err.contains("--resume"),
        "{err}"
    );
    assert!(!err.lines().any(|l| l.starts_with("error:")), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let ck = run.join("checkpoint.tck");
    assert!(ck.exists());
    let resumed = ok(&[
        "train",
        "--quiet-config",
        "--resume",
        s(&ck),
        "--set",
        "train.epochs=3",
        "--out",
        s(&run),
    ]);
    assert!(resumed.contains("resumed from"), "{resumed}");
}

#[test]
fn bench_orchestration_prints_one_row_per_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("tiny.toml");
    std::fs::write(
        &cfg,
        "[data.synthetic]\nvertices = 800\nedges = 4000\nclasses = 3\ndim = 8\n\
         [model]\nhidden = 16\n[train]\nbatch_size = 200\n\
         [device]\nkind = \"host\"\n[threads]\ncompute = 1\n",
    )
    .expect("write config");
    let out = ok(&[
        "bench",
        "orchestration",
        "--config",
        cfg.to_str().expect("utf-8 path"),
        "--epochs",
        "2",
    ]);
    // The host backend stands in for the accelerator, and the report says so,
    // naming its columns for what the host backend did.
    assert!(out.contains("host backend stands in"), "{out}");
    assert!(
        out.contains("hb busy") && out.contains("copy/epoch"),
        "{out}"
    );
    assert!(!out.contains("acc busy") && !out.contains("h2d"), "{out}");
    let names = [
        "layer ",
        "cpu-sample-cpu-gather",
        "gpu-sample-cpu-gather",
        "cpu-sample-gpu-gather",
        "gpu-sample-gpu-gather",
        "auto ",
    ];
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| names.iter().any(|n| l.starts_with(n)))
        .collect();
    assert_eq!(rows.len(), 6, "{out}");
    for r in rows {
        assert_eq!(r.split_whitespace().count(), 8, "{r}");
    }
}

#[test]
fn bench_orchestration_regimes_prints_every_regime_and_policy() {
    let d = tempfile::tempdir().expect("tempdir");
    let json = d.path().join("regimes.jsonl");
    let out = ok(&[
        "bench",
        "orchestration",
        "--regimes",
        "--vertices",
        "2000",
        "--edges",
        "10000",
        "--classes",
        "4",
        "--dims",
        "8,16",
        "--cache-fractions",
        "1,0",
        "--epochs",
        "1",
        "--set",
        "model.hidden=16",
        "--set",
        "train.batch_size=256",
        "--set",
        "train.fanouts=[5,5]",
        "--set",
        "device.kind=host",
        "--json",
        s(&json),
    ]);
    assert!(out.contains("host backend stands in"), "{out}");
    let policies = [
        "layer",
        "cpu-sample-cpu-gather",
        "gpu-sample-cpu-gather",
        "cpu-sample-gpu-gather",
        "gpu-sample-gpu-gather",
        "auto",
    ];
    // Rows are f32 unless `--row-dtypes` says otherwise; the precision is
    // the default "auto" (FP32 on this host backend, TF32 on a GPU).
    assert!(out.contains("model.precision auto"), "{out}");
    for dim in ["8", "16"] {
        for cache in ["100%", "0%"] {
            for p in policies {
                let n = out
                    .lines()
                    .filter(|l| l.split_whitespace().take(4).eq([dim, cache, "f32", p]))
                    .count();
                assert_eq!(n, 1, "dim {dim}, cache {cache}, {p}:\n{out}");
            }
            let verdict = format!("-> dim {dim}, cache {cache} ");
            assert!(out.contains(&verdict), "{verdict}:\n{out}");
        }
    }
    // Host timings get the measured ratios and no verdict on a GPU's targets.
    assert!(out.contains("no verdict on the targets"), "{out}");
    for verdict in ["HOLDS", "does not hold", "NOT within", "holds in"] {
        assert!(!out.contains(verdict), "{verdict}:\n{out}");
    }
    let text = std::fs::read_to_string(&json).expect("json written");
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(rows.len(), 2 * 2 * policies.len());
    assert_eq!(rows[0]["policy"], "layer");
    assert_eq!(rows[0]["cache_bytes"], 2000 * 8 * 4);
    assert_eq!(rows.last().expect("rows")["cache_bytes"], 0);
    assert!(rows.iter().all(|r| r["row_dtype"] == "f32"), "{text}");
    assert!(rows.iter().all(|r| r["precision"] == "auto"), "{text}");
}

/// `--row-dtypes f32,bf16`: every policy runs with each, bf16 regimes get half the
/// cache bytes (the same 5% of the rows), and TF32 from `--set` is recorded.
#[test]
fn bench_orchestration_regimes_runs_each_row_dtype() {
    let d = tempfile::tempdir().expect("tempdir");
    let json = d.path().join("regimes.jsonl");
    let out = ok(&[
        "bench",
        "orchestration",
        "--regimes",
        "--vertices",
        "2000",
        "--edges",
        "10000",
        "--classes",
        "4",
        "--dims",
        "8",
        "--cache-fractions",
        "0.05",
        "--row-dtypes",
        "f32,bf16",
        "--epochs",
        "1",
        "--set",
        "model.hidden=16",
        "--set",
        "train.batch_size=256",
        "--set",
        "train.fanouts=[5,5]",
        "--set",
        "device.kind=host",
        "--set",
        "model.precision=\"tf32\"",
        "--json",
        s(&json),
    ]);
    assert!(out.contains("model.precision tf32"), "{out}");
    let policies = [
        "layer",
        "cpu-sample-cpu-gather",
        "gpu-sample-cpu-gather",
        "cpu-sample-gpu-gather",
        "gpu-sample-gpu-gather",
        "auto",
    ];
    for dtype in ["f32", "bf16"] {
        for p in policies {
            let n = out
                .lines()
                .filter(|l| l.split_whitespace().take(4).eq(["8", "5%", dtype, p]))
                .count();
            assert_eq!(n, 1, "{dtype}, {p}:\n{out}");
        }
        let verdict = format!("), {dtype} rows: best step-based ");
        let n = out
            .lines()
            .filter(|l| l.trim_start().starts_with("-> dim 8, cache 5% (") && l.contains(&verdict))
            .count();
        assert_eq!(n, 1, "{verdict}:\n{out}");
    }
    // 2000 × 8 × 0.05 rows' worth: 3200 bytes of f32 rows, 1600 of bf16 ones.
    assert!(out.contains("no verdict on the targets"), "{out}");
    let text = std::fs::read_to_string(&json).expect("json written");
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(rows.len(), 2 * policies.len());
    for (i, r) in rows.iter().enumerate() {
        let (dtype, bytes) = if i < policies.len() {
            ("f32", 3200)
        } else {
            ("bf16", 1600)
        };
        assert_eq!(r["row_dtype"], dtype, "{r}");
        assert_eq!(r["cache_bytes"], bytes, "{r}");
        assert_eq!(r["precision"], "tf32", "{r}");
        assert_eq!(r["policy"], policies[i % policies.len()], "{r}");
        // Each line names the device engine of its own run.
        let device = r["device"].as_str().expect("a device note");
        assert_eq!(device.contains("bf16 feature rows"), dtype == "bf16", "{r}");
    }
}

#[test]
fn bench_orchestration_regimes_bad_values_name_the_flag() {
    for (flag, value) in [
        ("--dims", "8,x"),
        ("--dims", "0"),
        ("--dims", "-8"),
        ("--cache-fractions", "1,1.5"),
        ("--cache-fractions", "-0.1"),
        ("--cache-fractions", "half"),
        ("--row-dtypes", "f16"),
        ("--row-dtypes", "f32,fp32"),
        ("--row-dtypes", "F32"),
        ("--row-dtypes", "f32,"),
        ("--row-dtypes", ""),
    ] {
        let e = err(&["bench", "orchestration", "--regimes", flag, value]);
        assert!(e.contains(flag), "{flag} {value}: {e}");
        assert_eq!(e.trim_end().lines().count(), 1, "one line: {e}");
        if flag == "--row-dtypes" {
            // The accepted values, as `device.feature_dtype` spells them.
            assert!(e.contains(r#""f32", "bf16""#), "{value}: {e}");
        }
    }
    // The regime options need `--regimes`.
    for flag in ["--dims", "--row-dtypes"] {
        let e = err(&["bench", "orchestration", flag, "8"]);
        assert!(e.contains("--regimes"), "{flag}: {e}");
    }
}

/// `tandem partition` writes a METIS partition that cuts fewer edges than
/// contiguous ranges (feature `metis`), or says how to build it.
#[test]
fn partition_writes_a_partition_file_or_says_how_to_build_it() {
    let d = tempfile::tempdir().expect("tempdir");
    let ds = d.path().join("g.tds");
    generate_sbm(&ds);
    let part = d.path().join("g.part.3");
    let args = ["partition", s(&ds), "--parts", "3", "-o", s(&part)];
    if !cfg!(feature = "metis") {
        let e = err(&args);
        assert!(e.contains("--features metis"), "{e}");
        return;
    }
    let out = ok(&args);
    let text = std::fs::read_to_string(&part).expect("partition file");
    let parts: Vec<u32> = text.lines().map(|l| l.parse().expect("part")).collect();
    assert_eq!(parts.len(), 3000);
    assert!(parts.iter().all(|&p| p < 3));
    // "edges cut A% (contiguous ranges: B%)": METIS cuts fewer.
    let pct = |after: &str| -> f64 {
        let rest = out.split(after).nth(1).expect(after);
        rest.trim_start()
            .split('%')
            .next()
            .unwrap()
            .parse()
            .expect("percent")
    };
    let (metis, ranges) = (pct("edges cut"), pct("contiguous ranges:"));
    assert!(metis < ranges, "{out}");
    let e = err(&["partition", s(&ds), "--parts", "0", "-o", s(&part)]);
    assert!(e.contains("--parts"), "{e}");
}

/// `tandem infer` writes every vertex's rows from a checkpoint as `.npy`
/// (header shape, size), reports per layer on stderr when piped, and names the
/// file in its errors.
#[test]
fn infer_writes_every_vertex_and_names_bad_files() {
    let d = tempfile::tempdir().expect("tempdir");
    let run = d.path().join("run");
    ok(&[
        "train",
        "--quiet-config",
        "--set",
        "data.synthetic.vertices=3000",
        "--set",
        "data.synthetic.edges=20000",
        "--set",
        "data.synthetic.classes=4",
        "--set",
        "train.epochs=1",
        "--set",
        "model.hidden=16",
        "--set",
        "model.layers=3",
        "--set",
        "train.fanouts=[5,5,5]",
        "--out",
        s(&run),
    ]);
    let ck = run.join("checkpoint.tck");
    for (flag, width) in [(None, 16usize), (Some("--logits"), 4)] {
        let npy = d.path().join("rows.npy");
        let mut args = vec!["infer", "--checkpoint", s(&ck), "-o", s(&npy)];
        args.extend(flag);
        let out = tandem(&args);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{stdout}{stderr}");
        assert!(stdout.contains(&format!("3000 × {width} f32")), "{stdout}");
        let layers = if flag.is_some() { 3 } else { 2 };
        assert!(
            stderr.contains(&format!("infer: layer {layers}/{layers} 100%")),
            "{stderr}"
        );
        let bytes = std::fs::read(&npy).expect("rows file");
        let header = String::from_utf8_lossy(&bytes[..128]);
        assert!(
            header.contains(&format!("'shape': (3000, {width})")),
            "{header}"
        );
        assert_eq!(bytes.len(), 128 + 3000 * width * 4);
    }
    // Only the output is left beside it (no layer file, no temporary).
    let mut names: Vec<String> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, vec!["rows.npy", "run"]);
    let e = err(&[
        "infer",
        "--checkpoint",
        "/nonexistent/ck.tck",
        "-o",
        "x.npy",
    ]);
    assert!(
        e.contains("/nonexistent/ck.tck") && e.lines().count() <= 2,
        "{e}"
    );
    let bad_out = d.path().join("missing-dir").join("rows.npy");
    let e = err(&["infer", "--checkpoint", s(&ck), "-o", s(&bad_out)]);
    assert!(e.contains("missing-dir"), "{e}");
}
