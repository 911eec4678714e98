"""Peak resident memory added by Dataset.from_arrays on a large float32 matrix,
as a fraction of the matrix's bytes (a copy of the features would add 100%).

    python bench/python/from_arrays_rss.py [--vertices 2000000] [--dim 128] [--graph csr|edge_index]

The features, int32 labels and a ring graph (an int64/int32 CSR, used in
place, or a (2, E) int32 edge index, from which a CSR is built) are allocated
and touched first; the peak (ru_maxrss) is read before and after the call.
What the peak gains beyond the arrays given is the split masks (3 bytes a
vertex), the split's bookkeeping and, for an edge index, the CSR built from it.
"""

import argparse
import resource
import time

import numpy as np

import tandem


def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vertices", type=int, default=2_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--graph", choices=["csr", "edge_index"], default="csr")
    a = ap.parse_args()
    n, d = a.vertices, a.dim
    x = np.random.default_rng(0).standard_normal((n, d), dtype=np.float32)
    y = (np.arange(n) % 16).astype(np.int32)
    src = np.arange(n, dtype=np.int32)
    if a.graph == "csr":
        graph = {"csr": (np.arange(n + 1, dtype=np.int64), (src + 1) % n)}
    else:
        graph = {"edge_index": np.stack([src, (src + 1) % n])}
    before = peak()
    t = time.perf_counter()
    ds = tandem.Dataset.from_arrays(features=x, labels=y, **graph)
    secs = time.perf_counter() - t
    grew = peak() - before
    print(f"{a.graph}: {n} x {d} float32 = {x.nbytes / 2**20:.0f} MiB; from_arrays {secs:.2f} s; "
          f"peak RSS +{grew / 2**20:.1f} MiB = {100 * grew / x.nbytes:.2f}% of the matrix "
          f"(target <= 5%); shared: {ds.features.ctypes.data == x.ctypes.data}; "
          f"conversions: {ds.conversions or 'none'}")


if __name__ == "__main__":
    main()
