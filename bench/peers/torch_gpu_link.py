#!/usr/bin/env python3
"""GPU link-prediction peer for Tandem: PyTorch + PyG SAGEConv, everything on the GPU.

The link-prediction counterpart of torch_gpu_train.py, for the same machine: the
training graph (CSC) and the features in device memory, each batch's seeds and
neighbourhoods made with torch ops on the GPU. PyG's own `LinkNeighborLoader` cannot
run there: like `NeighborLoader` it samples through pyg-lib or torch-sparse, and the
GPU machine has neither (pyg-lib is not on PyPI; torch-sparse builds from source and
the machine has no network). What it does instead, per batch of B training positives:

1. k negatives per positive: its source, a destination drawn uniformly (`torch.randint`).
2. Seeds: every endpoint, deduplicated (`torch.unique`, inverse = each pair's local ids).
3. Layered sampling from the seeds, top layer first (fanout f: all in-neighbours when
   the degree is <= f, else f draws with replacement, as torch_gpu_train.py), with the
   batch's positives and their reverses dropped from every sampled hop (Tandem's
   `link.exclude = "reverse"`, DGL's `exclude="reverse_id"`).
4. PyG `SAGEConv` (mean) layers, ReLU + dropout between them, the top layer H wide; a
   dot-product decoder; binary cross-entropy on the logits; Adam.

Evaluation: full-neighbour layer-wise inference over the training graph (as Tandem's
`train.eval_mode = "full"`), in chunks of destination rows, then every validation and
test positive against the same negatives Tandem uses (the store's, or Tandem's draw:
link_common.py) with Tandem's MRR / Hits@K / AUC.

Reads `tandem export --format npy` output of a store with an edge split. Prints one
line per epoch and at the end:
  torchgpu-link epoch_s=<mean over epochs 1.. (or the only one)> test_mrr=... test_hits@10=...
  test_auc=... batches=<per epoch> extrapolated=<0|1>
With --max-batches N an epoch stops after N batches and its time is extrapolated to
the whole epoch (a products-scale link epoch has ~50k batches).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch_geometric.nn import SAGEConv  # noqa: E402

import link_common as lc  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--data", required=True)
p.add_argument("--fanouts", default="25,10,5")  # DGL order: first = input layer
p.add_argument("--batch-size", type=int, default=1024, help="positive edges per batch")
p.add_argument("--negatives", type=int, default=1)
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--lr", type=float, default=0.003)
p.add_argument("--dropout", type=float, default=0.5)
p.add_argument("--seed", type=int, default=0, help="also Tandem's train.seed for its negatives")
p.add_argument("--max-batches", type=int, default=0, help="0 = whole epochs")
p.add_argument("--eval-negatives", type=int, default=100)
p.add_argument("--metrics", default="mrr,hits@10,auc")
p.add_argument("--eval-chunk-edges", type=int, default=1 << 22,
               help="in-edges per chunk of full-neighbour inference (PyG gathers one "
                    "source row per edge: 4M edges x 256 columns = 4 GB of temporaries)")
p.add_argument("--no-eval", action="store_true")
p.add_argument("--device", default="cuda", help="cuda, or cpu to check the program where no GPU is")
a = p.parse_args()
dev = torch.device(a.device)
torch.manual_seed(a.seed)
names = [m.strip() for m in a.metrics.split(",") if m.strip()]


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


t_load = time.perf_counter()
data = lc.load_link_export(a.data)
n = int(data["meta"]["num_vertices"])
ei = torch.from_numpy(np.array(data["edge_index"]))  # a copy of the mapped file
src, dst = ei[0].to(dev), ei[1].to(dev)
order = torch.argsort(dst, stable=True)
indices = src[order].contiguous()
indptr = torch.zeros(n + 1, dtype=torch.long, device=dev)
indptr[1:] = torch.cumsum(torch.bincount(dst, minlength=n), 0)
del ei, src, dst, order
x = torch.from_numpy(np.array(data["features"], dtype=np.float32)).to(dev)
tsrc, tdst = (torch.from_numpy(v.astype(np.int64)).to(dev) for v in data["parts"]["train"])
symmetric = data["symmetric"]
fanouts = [int(f) for f in a.fanouts.split(",")]
node_map = torch.full((n,), -1, dtype=torch.long, device=dev)
print(f"# {n} vertices, {indices.numel()} training-graph edges, {tsrc.numel()} training positives, "
      f"loaded in {time.perf_counter() - t_load:.1f}s on {dev}", flush=True)


def sample(seeds, excluded):
    """Layers top-down from `seeds`, leaving out (dst, src) keys in sorted `excluded`;
    returns input ids and per-layer (edge_index, n_dst), bottom first."""
    nodes, blocks = seeds, []
    for k in reversed(fanouts):
        nd = nodes.numel()
        start, deg = indptr[nodes], indptr[nodes + 1] - indptr[nodes]
        ar = torch.arange(k, device=dev)
        big = (deg > k)[:, None]
        offs = torch.where(big, (torch.rand(nd, k, device=dev) * deg[:, None]).long(), ar)
        valid = big | (ar < deg[:, None])
        nbr = indices[(start[:, None] + offs).clamp(max=indices.numel() - 1)]
        key = nodes[:, None] * n + nbr
        pos = torch.searchsorted(excluded, key).clamp(max=excluded.numel() - 1)
        valid &= excluded[pos] != key
        nbr = nbr[valid]
        dloc = torch.arange(nd, device=dev)[:, None].expand(nd, k)[valid]
        node_map[nodes] = torch.arange(nd, device=dev)
        new = torch.unique(nbr[node_map[nbr] < 0])
        node_map[new] = torch.arange(nd, nd + new.numel(), device=dev)
        sloc = node_map[nbr]
        allnodes = torch.cat([nodes, new])
        node_map[allnodes] = -1
        blocks.append((torch.stack([sloc, dloc]), nd))
        nodes = allnodes
    return nodes, blocks[::-1]


class Sage(torch.nn.Module):
    def __init__(s, d, h, L):
        super().__init__()
        dims = [d] + [h] * L
        s.convs = torch.nn.ModuleList(SAGEConv(dims[i], dims[i + 1]) for i in range(L))

    def layer(s, i, h, h_dst, e):
        h = s.convs[i]((h, h_dst), e)
        if i < len(s.convs) - 1:
            h = F.dropout(F.relu(h), a.dropout, s.training)
        return h

    def forward(s, h, blocks):
        for i, (e, nd) in enumerate(blocks):
            h = s.layer(i, h, h[:nd], e)
        return h

    @torch.no_grad()
    def inference_full(s):
        """Layer by layer over every vertex, in chunks of destination rows."""
        h = x
        for i in range(len(s.convs)):
            out = torch.empty(n, s.convs[i].out_channels, device=dev)
            lo = 0
            while lo < n:
                # The largest hi with at most eval_chunk_edges in-edges (at least one row).
                hi = int(torch.searchsorted(indptr, indptr[lo] + a.eval_chunk_edges, right=True)) - 1
                hi = min(n, max(hi, lo + 1))
                e0, e1 = int(indptr[lo]), int(indptr[hi])
                deg = indptr[lo + 1:hi + 1] - indptr[lo:hi]
                dloc = torch.repeat_interleave(torch.arange(hi - lo, device=dev), deg)
                out[lo:hi] = s.layer(i, h, h[lo:hi], torch.stack([indices[e0:e1], dloc]))
                lo = hi
            h = out
        return h


model = Sage(x.shape[1], a.hidden, len(fanouts)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=a.lr)
k = a.negatives
batches = (tsrc.numel() + a.batch_size - 1) // a.batch_size
times, extrapolated = [], False
for ep in range(a.epochs):
    model.train()
    sync()
    t0 = time.perf_counter()
    perm = torch.randperm(tsrc.numel(), device=dev)
    nb = 0
    for b in range(0, perm.numel(), a.batch_size):
        e = perm[b:b + a.batch_size]
        u, v = tsrc[e], tdst[e]
        B = e.numel()
        w = torch.randint(0, n, (B * k,), device=dev)
        seeds, inv = torch.unique(torch.cat([u, v, w]), return_inverse=True)
        excl = [v * n + u] + ([u * n + v] if symmetric else [])
        excluded = torch.sort(torch.cat(excl)).values
        inp, blocks = sample(seeds, excluded)
        h = model(x[inp], blocks)
        hu = h[inv[:B]]
        pos = (hu * h[inv[B:2 * B]]).sum(1)
        neg = (hu.repeat_interleave(k, 0) * h[inv[2 * B:]]).sum(1)
        logits = torch.cat([pos, neg])
        loss = F.binary_cross_entropy_with_logits(logits, torch.cat([torch.ones_like(pos), torch.zeros_like(neg)]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        nb += 1
        if a.max_batches and nb >= a.max_batches:
            break
    sync()
    t = time.perf_counter() - t0
    if nb < batches:
        t, extrapolated = t / nb * batches, True
    times.append(t)
    print(f"epoch {ep} {t:.3f}s{' (extrapolated from %d batches)' % nb if nb < batches else ''} "
          f"loss {loss.item():.4f}", flush=True)

ep_s = sum(times[1:]) / (len(times) - 1) if len(times) > 1 else times[0]
result = {}
if not a.no_eval:
    model.eval()
    t0 = time.perf_counter()
    h = model.inference_full()
    sets, source = lc.eval_sets(data, a.eval_negatives, a.seed)
    with torch.no_grad():
        for part in ("val", "test"):
            s_, d_, neg_ = (torch.from_numpy(np.ascontiguousarray(z)).to(dev) for z in sets[part])
            pos_s = (h[s_] * h[d_]).sum(1)
            neg_s = torch.empty(neg_.shape, device=dev)
            step = max(1, (1 << 22) // neg_.shape[1])
            for i in range(0, s_.numel(), step):
                neg_s[i:i + step] = torch.einsum("ij,ikj->ik", h[s_[i:i + step]], h[neg_[i:i + step]])
            result[part] = lc.metrics(names, pos_s.cpu().numpy(), neg_s.cpu().numpy())
    print(f"# evaluation ({source['test']}) in {time.perf_counter() - t0:.1f}s: "
          + json.dumps(result), flush=True)
test = result.get("test", {})
print(f"torchgpu-link epoch_s={ep_s:.4f} "
      + " ".join(f"test_{m}={v:.4f}" for m, v in test.items())
      + f" batches={batches} extrapolated={int(extrapolated)}", flush=True)
