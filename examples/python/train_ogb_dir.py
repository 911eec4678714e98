"""Train GraphSAGE on an OGB node-property dataset as the `ogb` package leaves it.

    python examples/python/train_ogb_dir.py dataset/ogbn_arxiv [--epochs 10]

The directory is what `ogb.nodeproppred.NodePropPredDataset("ogbn-arxiv")`
downloads (raw/*.csv.gz, split/<scheme>/); Tandem reads it itself, streamed —
neither `ogb` nor torch is needed. Without an argument a small directory of the
same layout is written to a temporary folder first, so the example runs here.
"""

import argparse
import gzip
import pathlib
import tempfile

import numpy as np

import tandem


def write_toy_ogb_dir(root: pathlib.Path, n=2000, d=16, classes=4, seed=0):
    """A small graph in OGB's layout (what the ogb package writes after download)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = (rng.standard_normal((n, d)) + y[:, None]).astype(np.float32)
    src = rng.integers(0, n, 8 * n)
    dst = np.where(rng.random(8 * n) < 0.8, src + rng.integers(1, 50, 8 * n), rng.integers(0, n, 8 * n)) % n
    files = {
        "raw/num-node-list.csv.gz": f"{n}\n",
        "raw/edge.csv.gz": "".join(f"{s},{t}\n" for s, t in zip(src, dst)),
        "raw/node-feat.csv.gz": "".join(",".join(f"{v:.5f}" for v in row) + "\n" for row in x),
        "raw/node-label.csv.gz": "".join(f"{c}\n" for c in y),
    }
    perm = rng.permutation(n)
    for part, ids in (("train", perm[: n // 2]), ("valid", perm[n // 2 : 3 * n // 4]), ("test", perm[3 * n // 4 :])):
        files[f"split/random/{part}.csv.gz"] = "".join(f"{v}\n" for v in np.sort(ids))
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(p, "wt") as f:
            f.write(text)
    return root


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?", help="an OGB node-property dataset directory")
    ap.add_argument("--epochs", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(args.dir) if args.dir else write_toy_ogb_dir(pathlib.Path(tmp) / "ogbn_toy")
        ds = tandem.Dataset.from_ogb_dir(root)
        print(ds.summary())
        trainer = tandem.Trainer(ds, {"model": {"kind": "sage", "hidden": 128},
                                      "train": {"epochs": args.epochs, "fanouts": [10, 10]}},
                                 verbose=True)
        print(trainer.device_note)
        trainer.fit()
        val, test = trainer.evaluate()
        print(f"val accuracy {val:.4f}, test accuracy {test:.4f}")
        ds.save("ogb.tds")  # `tandem train --set data.path='"ogb.tds"'` trains on it from the CLI
        print("saved ogb.tds")


if __name__ == "__main__":
    main()
