//! Training memory grows with the store, not faster.
//!
//! `tandem train` runs as a subprocess on two generated R-MAT stores, one four
//! times the other, and reports its peak resident memory (`VmHWM`) on its last
//! line. The peak may hold the store's pages (mapped, counted once) plus a working
//! set that does not depend on the vertex count: so the growth of the peak from
//! the small run to the large one must stay within 1.2× the growth of the store
//! plus a small constant. Without streaming it would not: full-graph evaluation held a
//! copy of the features and topology and several activation matrices of every
//! vertex (7.4 GB peak for a 1.2 GB store at 2M vertices), and the host backend's
//! feature cache copied every cached row (the default 4 GiB budget duplicated the
//! whole matrix), so the peak grew more than twice as fast as the store.

use std::path::Path;
use std::process::Command;

/// Slack on top of 1.2× the store growth: allocator and thread-stack noise, and
/// per-vertex arrays of a few bytes (labels, degree order, sampler marks) that are
/// far below the store's 500+ bytes a vertex.
const SLACK_BYTES: u64 = 64 << 20;

fn tandem(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .output()
        .expect("run tandem");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "tandem {args:?} failed:\n{text}");
    text
}

/// The `peak host memory … (N bytes, VmHWM)` figure of a tandem run.
fn peak_of(out: &str) -> u64 {
    out.lines()
        .find_map(|l| {
            let rest = l.strip_prefix("peak host memory ")?;
            let inner = rest.split('(').nth(1)?;
            inner.split(" bytes").next()?.parse::<u64>().ok()
        })
        .unwrap_or_else(|| panic!("no `peak host memory` line in:\n{out}"))
}

/// Peaks of one size: `tandem train` and `tandem infer`.
struct Peaks {
    store: u64,
    train: u64,
    infer: u64,
}

/// Generates an R-MAT store of `vertices` (4 drawn edges a vertex, 128 columns,
/// small splits so one epoch is a few batches), trains one epoch on it with the
/// default model and evaluation, then infers every vertex's logits from the
/// checkpoint (one 256-wide layer file of every vertex on the way).
fn store_and_peaks(dir: &Path, vertices: usize) -> Peaks {
    let ds = dir.join(format!("g{vertices}.tds"));
    let ds = ds.to_str().expect("utf-8 temp path");
    let (v, e) = (vertices.to_string(), (4 * vertices).to_string());
    tandem(&[
        "generate",
        "rmat",
        "--vertices",
        &v,
        "--edges",
        &e,
        "--dim",
        "128",
        "--classes",
        "16",
        "--split",
        "0.02,0.01,0.01",
        "--seed",
        "3",
        "-o",
        ds,
    ]);
    let store = std::fs::metadata(ds).expect("store file").len();
    let run = dir.join(format!("run{vertices}"));
    let run = run.to_str().expect("utf-8 temp path");
    let train = peak_of(&tandem(&[
        "train",
        "--quiet-config",
        "--device",
        "host",
        "--set",
        &format!("data.path={ds:?}"),
        "--set",
        "train.epochs=1",
        "--set",
        "train.fanouts=[10,5]",
        "--out",
        run,
    ]));
    let logits = dir.join(format!("logits{vertices}.npy"));
    let infer = peak_of(&tandem(&[
        "infer",
        "--checkpoint",
        &format!("{run}/checkpoint.tck"),
        "--logits",
        "-o",
        logits.to_str().expect("utf-8 temp path"),
    ]));
    let header = 128; // `.npy` header of an `(n, 16)` `<f4` array
    assert_eq!(
        std::fs::metadata(&logits).expect("logits file").len(),
        header + (vertices * 16 * 4) as u64
    );
    std::fs::remove_file(ds).expect("remove the store");
    std::fs::remove_file(logits).expect("remove the logits");
    Peaks {
        store,
        train,
        infer,
    }
}

#[test]
fn peak_training_memory_grows_with_the_store_not_faster() {
    if std::fs::read_to_string("/proc/self/status").is_err() {
        eprintln!("skipping: no /proc/self/status here, so no peak-memory figure (not Linux)");
        return;
    }
    let d = tempfile::tempdir().expect("tempdir");
    let small = store_and_peaks(d.path(), 200_000);
    let large = store_and_peaks(d.path(), 800_000);
    for (what, small_peak, large_peak) in [
        ("train", small.train, large.train),
        ("infer", small.infer, large.infer),
    ] {
        let (small_store, large_store) = (small.store, large.store);
        let store_growth = large_store - small_store;
        let peak_growth = large_peak.saturating_sub(small_peak);
        let bound = store_growth + store_growth / 5 + SLACK_BYTES;
        eprintln!(
            "{what}: stores {small_store} → {large_store} bytes, peaks {small_peak} → \
             {large_peak} bytes: growth {peak_growth} against the bound {bound}"
        );
        assert!(
            peak_growth <= bound,
            "{what}: peak memory grew by {peak_growth} bytes for {store_growth} more store \
             bytes (bound 1.2 × store growth + {SLACK_BYTES} = {bound}); peaks {small_peak} \
             and {large_peak}, stores {small_store} and {large_store}"
        );
        // And the large run stays within its own store plus a bounded working set.
        assert!(
            large_peak <= large_store + (1 << 30),
            "{what}: peak {large_peak} bytes exceeds the store's {large_store} bytes + 1 GiB"
        );
    }
}
