#!/usr/bin/env python3
"""How much bigger a link-prediction batch is than a node-classification batch.

Reads a `tandem export --format npy` directory of a store with an edge split and
node masks, samples layered neighbourhoods (fanouts in DGL order, input layer
first; f neighbours drawn without replacement, all of them when the in-degree is
<= f, as Tandem's sampler) for
- node batches: `--batch-size` vertices drawn from train_mask.npy,
- link batches: `--batch-size` training positives, their endpoints and one
  uniform negative destination per positive (`--negatives`), deduplicated,
and prints the mean per batch of the seeds, each layer's destination rows and
sampled edges, and the input rows gathered, with the link/node ratios. These are
what a batch's device work scales with (sampling, gather, aggregation, GEMM rows);
docs/records/2026-11-28-predictions.md §8 scales the measured node batch by them.
Exclusion of the batch's own edges is left out (it removes at most 2 edges per
positive). Only numpy is needed.

    python3 bench/peers/link_batch_size.py --data DIR_npy --fanouts 25,10,5 --batches 20
"""
import argparse
import json
import os

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--fanouts", default="25,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--negatives", type=int, default=1)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    meta = json.load(open(os.path.join(a.data, "meta.json")))
    n = int(meta["num_vertices"])
    ei = np.load(os.path.join(a.data, "edge_index.npy"), mmap_mode="r")
    dst = np.asarray(ei[1])
    order = np.argsort(dst, kind="stable")
    indices = np.asarray(ei[0])[order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(np.bincount(dst, minlength=n))
    del dst, order
    fanouts = [int(f) for f in a.fanouts.split(",")]
    train_v = np.flatnonzero(np.load(os.path.join(a.data, "train_mask.npy")))
    sp = os.path.join(a.data, "edge_split")
    tsrc, tdst = np.load(os.path.join(sp, "train_src.npy")), np.load(os.path.join(sp, "train_dst.npy"))

    def sizes(seeds):
        """[seeds, (dst rows, edges) per layer top-down, input rows]."""
        nodes, out = seeds, [len(seeds)]
        for f in reversed(fanouts):
            start, deg = indptr[nodes], indptr[nodes + 1] - indptr[nodes]
            take = np.minimum(deg, f)
            # Without replacement: a random f-subset of each in-list longer than f.
            picks = [indices[s + (rng.choice(d, f, replace=False) if d > f else np.arange(d))]
                     for s, d in zip(start, deg) if d > 0]
            nbr = np.concatenate(picks) if picks else np.empty(0, dtype=indices.dtype)
            out.append((len(nodes), int(take.sum())))
            nodes = np.union1d(nodes, nbr)
        out.append(len(nodes))
        return out

    def mean(rows):
        seeds = np.mean([r[0] for r in rows])
        layers = [(np.mean([r[1 + i][0] for r in rows]), np.mean([r[1 + i][1] for r in rows]))
                  for i in range(len(fanouts))]
        return seeds, layers, np.mean([r[-1] for r in rows])

    node, link = [], []
    for _ in range(a.batches):
        node.append(sizes(np.unique(rng.choice(train_v, a.batch_size, replace=False))))
        e = rng.choice(len(tsrc), a.batch_size, replace=False)
        w = rng.integers(0, n, a.batch_size * a.negatives)
        link.append(sizes(np.unique(np.concatenate([tsrc[e], tdst[e], w]))))
    (ns, nl, ni), (ls, ll, li) = mean(node), mean(link)
    print(f"# {a.data}: {n} vertices, {len(indices)} edges, fanouts {fanouts} (input first), "
          f"batch {a.batch_size}, {a.batches} batches each")
    print(f"{'':>14} {'node':>10} {'link':>10} {'link/node':>9}")
    print(f"{'seeds':>14} {ns:10.0f} {ls:10.0f} {ls / ns:9.2f}")
    for i, ((nd, ne), (ld, le)) in enumerate(zip(nl, ll)):
        layer = len(fanouts) - 1 - i
        print(f"{f'layer {layer} dst':>14} {nd:10.0f} {ld:10.0f} {ld / nd:9.2f}")
        print(f"{f'layer {layer} edges':>14} {ne:10.0f} {le:10.0f} {le / ne:9.2f}")
    print(f"{'input rows':>14} {ni:10.0f} {li:10.0f} {li / ni:9.2f}")
    te = sum(e for _, e in nl), sum(e for _, e in ll)
    print(f"{'all edges':>14} {te[0]:10.0f} {te[1]:10.0f} {te[1] / te[0]:9.2f}")


if __name__ == "__main__":
    main()
