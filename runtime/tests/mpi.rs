//! `mpirun -np N tandem train` on loopback (feature `mpi`; CI installs Open MPI
//! and sets `TANDEM_REQUIRE_MPI=1`, so a missing `mpirun` fails instead of
//! skipping): N ranks train the one-rank model, partitioned features train
//! what replicated features train, one rank writes the outputs, and a failing
//! rank ends the job within seconds with its error printed once.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use runtime::Checkpoint;

/// `mpirun`, or `None` (with the reason printed) when absent and not required.
fn mpirun() -> Option<PathBuf> {
    if !cfg!(feature = "mpi") {
        eprintln!("skipped: built without the `mpi` feature (cargo test --features mpi)");
        return None;
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("mpirun"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("TANDEM_REQUIRE_MPI").is_none(),
            "TANDEM_REQUIRE_MPI is set but mpirun is not on PATH (apt-get install openmpi-bin)"
        );
        eprintln!("skipped: mpirun not found (apt-get install libopenmpi-dev openmpi-bin)");
    }
    found
}

const SETS: &[&str] = &[
    "data.synthetic.vertices=3000",
    "data.synthetic.edges=20000",
    "data.synthetic.dim=16",
    "data.synthetic.classes=4",
    "model.hidden=32",
    "model.dropout=0.0",
    "train.epochs=2",
    "train.batch_size=256",
    "train.fanouts=[5,5]",
    "train.eval_mode=\"sampled\"",
    "train.eval_fanouts=[5,5]",
    "device.kind=\"host\"",
    "threads.compute=1",
];

/// Runs `tandem train` on `ranks` ranks (1: without mpirun) with `extra` sets and
/// `--out out`, killed after `limit`.
fn train(
    ranks: usize,
    out: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> (Output, Duration) {
    train_args(ranks, out, extra, env, limit, &[])
}

/// [`train`] with more command-line arguments (`args`, e.g. `--resume`).
fn train_args(
    ranks: usize,
    out: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
    args: &[&str],
) -> (Output, Duration) {
    let tandem = env!("CARGO_BIN_EXE_tandem");
    let mut cmd = if ranks == 1 {
        Command::new(tandem)
    } else {
        let mut c = Command::new("mpirun");
        c.args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            &ranks.to_string(),
            tandem,
        ]);
        c
    };
    cmd.args(["train", "--quiet-config", "--out"]).arg(out);
    cmd.args(args);
    for s in SETS.iter().chain(extra) {
        cmd.args(["--set", s]);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let t = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if t.elapsed() > limit {
            child.kill().ok();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{ranks} ranks still running after {limit:?} (a hang)\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (child.wait_with_output().expect("output"), t.elapsed())
}

fn params(dir: &Path) -> Vec<f32> {
    let ck = Checkpoint::read(&dir.join("checkpoint.tck")).expect("checkpoint");
    ck.tensors.into_iter().flat_map(|t| t.values).collect()
}

fn ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn mpi_ranks_train_the_one_rank_model_and_partitioned_equals_replicated() {
    if mpirun().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let limit = Duration::from_secs(120);
    let one = dir.path().join("one");
    ok(&train(1, &one, &[], &[], limit).0, "1 rank");
    let p1 = params(&one);
    let scale = p1.iter().fold(0f32, |m, x| m.max(x.abs()));
    for n in [2usize, 3] {
        let out = dir.path().join(format!("rep{n}"));
        let (o, _) = train(n, &out, &[], &[], limit);
        ok(&o, &format!("{n} ranks"));
        let stdout = String::from_utf8_lossy(&o.stdout);
        // Rank 0 alone prints: one header line, one summary.
        assert_eq!(stdout.matches("epoch   loss").count(), 1, "{stdout}");
        assert!(
            stdout.contains(&format!("data-parallel over {n} ranks")),
            "{stdout}"
        );
        let pn = params(&out);
        let worst = pn
            .iter()
            .zip(&p1)
            .map(|(a, b)| (a - b).abs() / b.abs().max(1e-3 * scale))
            .fold(0f32, f32::max);
        eprintln!("mpi: {n} ranks vs 1, largest relative parameter difference {worst:.2e}");
        assert!(worst < 1e-3, "{n} ranks differ from one rank by {worst}");

        let part = dir.path().join(format!("part{n}"));
        let (o, _) = train(
            n,
            &part,
            &[
                "dist.features=\"partitioned\"",
                "dist.remote_cache_rows=100",
            ],
            &[],
            limit,
        );
        ok(&o, &format!("{n} ranks, partitioned"));
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(stdout.contains("feature exchanges"), "{stdout}");
        assert_eq!(
            params(&part),
            pn,
            "partitioned features train other weights ({n} ranks)"
        );
        let m = |d: &Path| std::fs::read_to_string(d.join("metrics.jsonl")).unwrap();
        let acc = |s: String| -> Vec<String> {
            s.lines()
                .map(|l| l.split("\"train_secs\"").next().unwrap().to_string())
                .collect()
        };
        assert_eq!(acc(m(&part)), acc(m(&out)));
    }
}

/// Device ranks (the GPU code path on the host backend) over MPI train the
/// one-rank device model, and a 2-rank job checkpointed after epoch 1 and
/// resumed with `--resume` on 2 ranks trains what the uninterrupted job trains.
#[test]
fn mpi_device_ranks_train_the_one_rank_model_and_a_job_resumes() {
    if mpirun().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let limit = Duration::from_secs(120);
    let ops = ["orchestration.policy=\"gpu-sample-gpu-gather\""];
    let one = dir.path().join("one");
    ok(&train(1, &one, &ops, &[], limit).0, "1 device rank");
    let two = dir.path().join("two");
    ok(&train(2, &two, &ops, &[], limit).0, "2 device ranks");
    let (p1, p2) = (params(&one), params(&two));
    let scale = p1.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = p2
        .iter()
        .zip(&p1)
        .map(|(a, b)| (a - b).abs() / b.abs().max(1e-3 * scale))
        .fold(0f32, f32::max);
    eprintln!("mpi: 2 device ranks vs 1, largest relative parameter difference {worst:.2e}");
    assert!(worst < 1e-3, "2 device ranks differ from one by {worst}");
    // Partitioned features on device ranks: rows through the exchange, the
    // same model as replicated features.
    let part = dir.path().join("part");
    let partitioned = [
        ops[0],
        "dist.features=\"partitioned\"",
        "train.sparse_features=\"off\"",
    ];
    ok(
        &train(2, &part, &partitioned, &[], limit).0,
        "2 device ranks, partitioned features",
    );
    assert_eq!(
        params(&part),
        p2,
        "partitioned device ranks train other weights"
    );

    // Resume: epoch 1, then --resume to epoch 2, on 2 host ranks.
    let whole = dir.path().join("whole");
    ok(&train(2, &whole, &[], &[], limit).0, "2 ranks");
    let half = dir.path().join("half");
    ok(
        &train(2, &half, &["train.epochs=1"], &[], limit).0,
        "2 ranks, epoch 1",
    );
    let rest = dir.path().join("rest");
    let ck = half.join("checkpoint.tck");
    let (o, _) = train_args(
        2,
        &rest,
        &[],
        &[],
        limit,
        &["--resume", ck.to_str().unwrap()],
    );
    ok(&o, "2 ranks, resumed");
    assert!(String::from_utf8_lossy(&o.stdout).contains("resumed from"));
    assert_eq!(
        params(&rest),
        params(&whole),
        "a resumed job trains other weights"
    );
}

#[test]
fn a_failing_rank_ends_the_mpi_job_with_its_error_once() {
    if mpirun().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (o, took) = train(
        3,
        &dir.path().join("fail"),
        &["train.epochs=50"],
        &[("TANDEM_TEST_FAIL_RANK", "1")],
        // A guard against a hang, as every run here has; not a timing bound.
        Duration::from_secs(120),
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert_eq!(
        stderr.matches("injected failure on rank 1").count(),
        1,
        "the error is printed once:\n{stderr}"
    );
    assert!(stderr.contains("error: rank 1 of 3"), "{stderr}");
    eprintln!("mpi: the job ended {took:?} after start, with the failing rank's error");
    // Promptness in epochs, not seconds: rank 1 fails before its first step, so
    // rank 0 (which prints every epoch) finishes none of the 50.
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        !stdout.lines().any(|l| l.trim_start().starts_with("0 ")),
        "an epoch was trained after the failure:\n{stdout}"
    );
}

#[test]
fn a_tandem_without_mpi_refuses_a_launcher_it_cannot_join() {
    // Only meaningful for a build without the feature; with it, the launcher
    // environment below would make this process initialize MPI as a singleton.
    if cfg!(feature = "mpi") {
        return;
    }
    let o = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["train", "--quiet-config"])
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && stderr.contains("without the `mpi` feature"),
        "{stderr}"
    );
}
