"""Shared helpers of the pytest suite (python/tests).

Tests that need the `tandem` CLI binary (Python and Rust give the same
results and messages) find it through TANDEM_BIN or in the workspace's
target/ folder, and skip with a reason when it is missing; with
TANDEM_REQUIRE_CLI=1 (as .ci/run sets) a missing binary is a failure.
"""

import gzip
import os
import pathlib
import shutil

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# A small run: a few batches an epoch, one thread, seconds in all.
SMALL = {
    "data": {"synthetic": {"vertices": 600, "edges": 3000, "classes": 3, "dim": 8}},
    "model": {"hidden": 16},
    "train": {"epochs": 2, "batch_size": 128},
    "threads": {"compute": 1},
    "device": {"kind": "host"},
}


def small_arrays(n=50, d=4, classes=3, seed=0):
    """A ring graph of n vertices with float32 features and int64 labels."""
    rng = np.random.default_rng(seed)
    src = np.arange(n, dtype=np.int64)
    dst = (src + 1) % n
    edge_index = np.stack([np.concatenate([src, dst]), np.concatenate([dst, src])])
    features = rng.standard_normal((n, d)).astype(np.float32)
    labels = (np.arange(n) % classes).astype(np.int64)
    return edge_index, features, labels


def cli_binary():
    """The `tandem` binary, or None."""
    env = os.environ.get("TANDEM_BIN")
    if env:
        return env
    for profile in ("release", "debug"):
        p = REPO / "target" / profile / "tandem"
        if p.exists():
            return str(p)
    return shutil.which("tandem")


@pytest.fixture
def tandem_cli():
    b = cli_binary()
    if b is None:
        if os.environ.get("TANDEM_REQUIRE_CLI") == "1":
            pytest.fail("TANDEM_REQUIRE_CLI=1 but no tandem binary (TANDEM_BIN, target/*/tandem)")
        pytest.skip("no tandem CLI binary (set TANDEM_BIN or build `cargo build -p runtime`)")
    return b


def write_gz(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(text)


def write_ogb_dir(root, n=40, d=3, classes=2, seed=1):
    """An OGB node-property directory (as the ogb package downloads it) of a
    small synthetic graph; returns (root, features, labels, edges, split)."""
    rng = np.random.default_rng(seed)
    edges = [(v, (v + 1) % n) for v in range(n)] + [(v, (v + 7) % n) for v in range(0, n, 3)]
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = np.arange(n) % classes
    perm = rng.permutation(n)
    split = {"train": np.sort(perm[: n // 2]), "valid": np.sort(perm[n // 2 : 3 * n // 4]),
             "test": np.sort(perm[3 * n // 4 :])}
    write_gz(root / "raw" / "num-node-list.csv.gz", f"{n}\n")
    write_gz(root / "raw" / "num-edge-list.csv.gz", f"{len(edges)}\n")
    write_gz(root / "raw" / "edge.csv.gz", "".join(f"{s},{t}\n" for s, t in edges))
    write_gz(root / "raw" / "node-feat.csv.gz",
             "".join(",".join(repr(float(v)) for v in row) + "\n" for row in x))
    write_gz(root / "raw" / "node-label.csv.gz", "".join(f"{c}\n" for c in y))
    for part, ids in split.items():
        write_gz(root / "split" / "time" / f"{part}.csv.gz", "".join(f"{v}\n" for v in ids))
    return root, x, y, edges, split
