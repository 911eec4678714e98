"""What the link-prediction peers share: the edge split of a `tandem export` directory,
Tandem's evaluation negatives drawn bit for bit, and Tandem's metrics.

Only numpy is needed here, so the CPU peers (`dgl_link.py`, `mlp_link.py`) and the GPU
peer (`torch_gpu_link.py`) use one copy. Definitions follow Tandem:

- Evaluation negatives (`runtime/src/session/link.rs`, `LinkEval::new`): the store's
  fixed ones when the export has `edge_split/{val,test}_neg.npy`; otherwise
  `link.eval_negatives` destinations per positive, drawn uniformly with the
  counter-based draw of `cpu_ops::sample_negatives` (`cpu_ops/src/link.rs`,
  `cpu_ops/src/rng.rs`) from `derive_seed(train.seed, 8_000_000 + split)` (split 0
  validation, 1 test): draw `t` is `uniform_below(hash_draw(hash_key(seed',
  NEGATIVE_STREAM), t), n)` and belongs to positive `t // k`. `tandem_negatives`
  below is that arithmetic in numpy `uint64`; `python3 bench/peers/link_common.py
  --self-test` checks it against the values `cpu_ops/src/rng.rs`'s tests pin, and
  `--check-run` against a Tandem run's own metrics (its embeddings from `tandem
  infer` scored here give the metrics it printed).
- Metrics (`runtime/src/task/metrics.rs`): MRR with ties counting half (as
  ogbl-citation2), Hits@K the share of positives whose rank among their own negatives
  (the same rank) is at most K (as ogbl-citation2's hits@K_list), AUC with ties half.
"""
import json
import os

import numpy as np

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
STREAM_MUL = 0xD1B54A32D192ED03
NEGATIVE_STREAM = 0x6E65676174697665  # "negative"
EVAL_NEGATIVES = 8_000_000  # runtime/src/session/link.rs


# ---------------------------------------------------------------- the draw


def _mix64_int(z):
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def derive_seed(seed, stream):
    """cpu_ops::derive_seed: the second SplitMix64 output from seed ^ stream·C."""
    s = (seed ^ (stream * STREAM_MUL)) & M64
    return _mix64_int(s + 2 * GOLDEN)


def hash_key(a, b):
    """cpu_ops::hash_key."""
    return _mix64_int(_mix64_int(a + GOLDEN) ^ ((b * STREAM_MUL) & M64))


def _mix64(z):
    """cpu_ops::mix64 on a uint64 array (numpy wraps on overflow)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _uniform_below(bits, bound):
    """cpu_ops::uniform_below: the high word of bits·bound, for bound < 2^32."""
    b = np.uint64(bound)
    hi = bits >> np.uint64(32)
    lo = bits & np.uint64(0xFFFFFFFF)
    return (hi * b + ((lo * b) >> np.uint64(32))) >> np.uint64(32)


def tandem_negatives(num_vertices, positives, k, seed, split, chunk=1 << 24):
    """Tandem's drawn evaluation negatives of one split (0 validation, 1 test):
    an int64 array (positives, k), row i the destinations of positive i."""
    if not 0 < num_vertices < (1 << 32):
        raise ValueError(f"num_vertices {num_vertices}: expected 1 ..= 2^32 - 1")
    key = np.uint64(hash_key(derive_seed(seed, EVAL_NEGATIVES + split), NEGATIVE_STREAM))
    total = positives * k
    out = np.empty(total, dtype=np.int64)
    with np.errstate(over="ignore"):
        for start in range(0, total, chunk):
            t = np.arange(start, min(total, start + chunk), dtype=np.uint64)
            bits = _mix64(key + (t + np.uint64(1)) * np.uint64(GOLDEN))
            out[start:start + len(t)] = _uniform_below(bits, num_vertices).astype(np.int64)
    return out.reshape(positives, k)


# ---------------------------------------------------------------- the export


def load_link_export(path):
    """A `tandem export --format npy` directory with an edge split: meta, features,
    the training graph's edge_index and the split's parts."""
    meta = json.load(open(os.path.join(path, "meta.json")))
    if "edge_split" not in meta:
        raise SystemExit(f"{path}/meta.json: no `edge_split`: export a store made with --edge-split")
    sp = os.path.join(path, "edge_split")
    parts = {}
    for p in ("train", "val", "test"):
        parts[p] = (np.load(os.path.join(sp, f"{p}_src.npy")), np.load(os.path.join(sp, f"{p}_dst.npy")))
    neg = {}
    for p in ("val", "test"):
        f = os.path.join(sp, f"{p}_neg.npy")
        neg[p] = np.load(f) if os.path.exists(f) else None
    return {
        "meta": meta,
        "symmetric": meta["edge_split"] == "symmetric",
        "features": np.load(os.path.join(path, "features.npy"), mmap_mode="r"),
        "edge_index": np.load(os.path.join(path, "edge_index.npy"), mmap_mode="r"),
        "parts": parts,
        "fixed_negatives": neg,
    }


def eval_sets(data, eval_negatives, seed):
    """{'val': (src, dst, neg (E, k)), 'test': ...} and where the negatives come from."""
    n = int(data["meta"]["num_vertices"])
    sets, source = {}, {}
    for i, p in enumerate(("val", "test")):
        src, dst = data["parts"][p]
        fixed = data["fixed_negatives"][p]
        if fixed is not None:
            sets[p] = (src, dst, fixed)
            source[p] = f"the store's fixed negatives ({fixed.shape[1]} per positive)"
        else:
            sets[p] = (src, dst, tandem_negatives(n, len(src), eval_negatives, seed, i))
            source[p] = (f"{eval_negatives} per positive drawn as Tandem draws them "
                         f"(train.seed {seed}, split {i})")
    return sets, source


def check_training_graph(data):
    """The training graph edge_index.npy holds exactly the training positives (both
    ways when symmetric); returns its edge count."""
    src, dst = data["parts"]["train"]
    ei = np.asarray(data["edge_index"])
    if data["symmetric"]:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    n = np.int64(data["meta"]["num_vertices"])
    a = np.sort(ei[0].astype(np.int64) * n + ei[1])
    b = np.sort(src.astype(np.int64) * n + dst)
    if len(a) != len(b) or not np.array_equal(a, b):
        raise SystemExit(f"edge_index.npy ({len(a)} edges) is not the training positives "
                         f"({len(b)} {'both ways' if data['symmetric'] else 'directed'})")
    return len(a)


# ---------------------------------------------------------------- metrics


def ranks(pos, neg):
    """pos (E,), neg (E, k): each positive's rank among its own negatives,
    1 + (above + at_least) / 2 (ties cost half); None when there is nothing to rank."""
    pos = np.asarray(pos, dtype=np.float32)[:, None]
    neg = np.asarray(neg, dtype=np.float32)
    if pos.size == 0 or neg.shape[1] == 0:
        return None
    above = (neg > pos).sum(1, dtype=np.float64)
    at_least = (neg >= pos).sum(1, dtype=np.float64)
    return 1.0 + 0.5 * (above + at_least)


def mrr(pos, neg):
    """Mean of 1 / rank."""
    r = ranks(pos, neg)
    return 0.0 if r is None else float(np.mean(1.0 / r))


def hits_at(pos, neg, k):
    """Share of positives whose rank is at most k."""
    r = ranks(pos, neg)
    return 0.0 if r is None else float(np.mean(r <= k))


def auc(pos, neg):
    """Mann-Whitney AUC, ties half, from one sort of all scores."""
    pos = np.asarray(pos, dtype=np.float32).ravel()
    neg = np.asarray(neg, dtype=np.float32).ravel()
    if pos.size == 0 or neg.size == 0:
        return 0.0
    allv = np.concatenate([pos, neg])
    _, inv, counts = np.unique(allv, return_inverse=True, return_counts=True)
    # 1-based average rank of each distinct value: (first + last) / 2.
    last = np.cumsum(counts).astype(np.float64)
    avg = last - (counts - 1) / 2.0
    rank_sum = avg[inv[: pos.size]].sum()
    p, n = float(pos.size), float(neg.size)
    return float((rank_sum - p * (p + 1) / 2) / (p * n))


def metrics(names, pos, neg):
    """{name: value} for `link.metrics` names (mrr, hits@K, auc)."""
    out = {}
    for m in names:
        if m == "mrr":
            out[m] = mrr(pos, neg)
        elif m == "auc":
            out[m] = auc(pos, neg)
        elif m.startswith("hits@") and m[5:].isdigit() and int(m[5:]) >= 1:
            out[m] = hits_at(pos, neg, int(m[5:]))
        else:
            raise SystemExit(f"--metrics: `{m}`: expected mrr, hits@K (K >= 1) or auc")
    return out


def dot_scores(h, src, dst, neg, chunk=1 << 20):
    """Dot-product logits (numpy float32) of (src, dst) and of src against each row of
    neg, from embeddings h (numpy (n, H))."""
    k = neg.shape[1]
    pos = np.empty(len(src), dtype=np.float32)
    negs = np.empty((len(src), k), dtype=np.float32)
    step = max(1, chunk // max(1, k))
    for s in range(0, len(src), step):
        e = min(len(src), s + step)
        hs = h[src[s:e]]
        pos[s:e] = np.einsum("ij,ij->i", hs, h[dst[s:e]])
        negs[s:e] = np.einsum("ij,ikj->ik", hs, h[neg[s:e]])
    return pos, negs


def _self_test():
    # The values cpu_ops/src/rng.rs's `counter_draws_are_splitmix_and_pinned` pins.
    key = hash_key(42, 7)
    assert key == 0x5864FA25FD883A8A, hex(key)
    with np.errstate(over="ignore"):
        draws = _mix64(np.uint64(key) + (np.array([0, 999], dtype=np.uint64) + np.uint64(1)) * np.uint64(GOLDEN))
    assert draws.tolist() == [0x9C25C36DC45DE5FC, 0x39C9AC055EB12E6E], [hex(int(d)) for d in draws]
    ub = _uniform_below(np.array([M64, 0, 1 << 63], dtype=np.uint64), 10).tolist()
    assert ub == [9, 0, 5] and int(_uniform_below(np.array([1 << 63], dtype=np.uint64), 7)[0]) == 3
    # SplitMix64's output of state z - GOLDEN is mix64(z) (the same test's loop).
    for z in (0, 1, 0xDEADBEEF, M64):
        assert int(_mix64(np.array([z], dtype=np.uint64))[0]) == _mix64_int(z)
    # MRR / Hits / AUC on the cases of runtime/src/task/metrics.rs's tests.
    pos = np.array([0.9, 0.5, 0.3])
    neg = np.array([[0.1, 0.2], [0.7, 0.1], [0.3, 0.0]])
    assert abs(mrr(pos, neg) - (1.0 + 0.5 + 1.0 / 1.5) / 3.0) < 1e-12
    # Ranks 1, 2, 1.5, 3 (the hits test's case).
    p4 = np.array([0.9, 0.5, 0.3, 0.0])
    n4 = np.array([[0.1, 0.2], [0.7, 0.1], [0.3, 0.0], [0.4, 0.6]])
    assert hits_at(p4, n4, 1) == 0.25 and hits_at(p4, n4, 2) == 0.75 and hits_at(p4, n4, 3) == 1.0
    assert auc([1.0, 2.0], [0.0, 0.5]) == 1.0 and auc([0.0], [1.0]) == 0.0 and auc([1.0], [1.0]) == 0.5
    rng = np.random.default_rng(7)
    p = rng.integers(0, 20, 57).astype(np.float32)
    q = rng.integers(0, 20, 91).astype(np.float32)
    brute = ((p[:, None] > q[None]).sum() + 0.5 * (p[:, None] == q[None]).sum()) / (57 * 91)
    assert abs(auc(p, q) - brute) < 1e-12
    print("link_common self-test: ok")


def _check_run(data_dir, embeddings, run_dir, seed=None):
    """Recomputes a Tandem link run's last test metrics from its embeddings (`tandem
    infer`, full-graph) with the negatives drawn here: agreement to rounding shows
    that the draw and the metrics are Tandem's."""
    cfg = open(os.path.join(run_dir, "config.toml")).read()
    import re

    if seed is None:  # train.seed of the run
        train = cfg.split("\n[train]", 1)[1].split("\n[", 1)[0]
        seed = re.search(r"^seed\s*=\s*(\d+)", train, re.M)[1]
    k = int((re.search(r"^eval_negatives\s*=\s*(\d+)", cfg, re.M) or [0, 100])[1])
    names = re.search(r"^metrics\s*=\s*\[(.*?)\]", cfg, re.M | re.S)
    names = [x.strip().strip('"') for x in names[1].split(",") if x.strip()] if names else ["mrr", "hits@10", "auc"]
    last = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if l.strip()][-1]
    data = load_link_export(data_dir)
    sets, source = eval_sets(data, k, int(seed))
    h = np.load(embeddings)
    worst = 0.0
    for p in ("val", "test"):
        mine = metrics(names, *dot_scores(h, *sets[p]))
        theirs = {m["name"]: m["value"] for m in last[f"{p}_metrics"]}
        for name in names:
            d = abs(mine[name] - theirs[name])
            worst = max(worst, d)
            print(f"{p} {name}: tandem {theirs[name]:.6f}, here {mine[name]:.6f}, |diff| {d:.2e}")
    print(f"negatives: {source['test']}; largest difference {worst:.2e}")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--self-test"]:
        _self_test()
    elif len(sys.argv) in (5, 6) and sys.argv[1] == "--check-run":
        _check_run(*sys.argv[2:])
    else:
        sys.exit("usage: link_common.py --self-test | --check-run DATA_NPY EMBEDDINGS_NPY RUN_DIR [SEED]\n"
                 "  (SEED: the run's train.seed unless given)")
