#!/usr/bin/env python3
"""DGL 1.1.3 CPU reference trainer for Tandem comparisons (accuracy and epoch time).

Reads a directory written by `tandem export FILE.tds --format npy -o DIR` and trains a
GraphSAGE / GCN / GAT node classifier with DGL's mini-batch neighbor sampling, the way
DGL's own examples do. See bench/peers/README.md for setup and exact semantics.

Model semantics (L = --layers, H = --hidden, C = num_classes):
  sage: SAGEConv(d,H,'mean') -> ... -> SAGEConv(H,C,'mean')          (DGL graphsage example)
  gcn : GraphConv(d,H,norm='both') -> ... -> GraphConv(H,C)          (DGL gcn example)
        on dgl.add_self_loop(dgl.remove_self_loop(g)): self-loops are added to the
        graph BEFORE sampling, so a vertex's self-loop is one of its sampled in-edges
        and competes with real neighbors for the fanout. 'both' normalisation inside a
        sampled block uses the block's degrees (sampled in-degree of the destination,
        out-degree of the source within the block), which is what GraphConv does on
        blocks.
  gat : GATConv(d,H/heads,heads) [flatten, i.e. concat heads] -> ... ->
        GATConv(H,C,heads) [mean of heads]; GATConv feat_drop = attn_drop = 0 (the only
        dropout is the one below). Self-loops added as for gcn (DGL's GAT example does;
        GATConv also refuses zero-in-degree destinations).
  Hidden activation ReLU (gat: ELU), then Dropout(p) — after every layer but the last,
  as in DGL's GraphSAGE example. No dropout on the input features.
  Adam(lr, weight_decay), cross-entropy on the seeds' logits.

Training: NeighborSampler(fanouts) (DGL order: fanouts[0] is the input/bottom layer),
  DataLoader(g, train_ids, sampler, batch_size, shuffle=True, drop_last=False,
  num_workers=0); features via blocks[0].srcdata['feat'] (prefetch_node_feats) and
  labels via blocks[-1].dstdata['label'].
Evaluation (--eval-mode full, the default): layer-wise full-neighbour inference in eval
  mode (no dropout): every layer is applied to the WHOLE graph (all vertices, all
  in-edges) before the next one — the same result as DGL's layer-wise `inference` with
  MultiLayerFullNeighborSampler(1), but without block-local degrees for GCN, i.e. exact
  full-graph GCN normalisation. Accuracy = argmax over train / val / test masks.
  (--eval-mode minibatch: MultiLayerFullNeighborSampler(L) over val+test seeds, in
  batches of --eval-batch-size; exact for sage/gat, but GCN's source degrees are then
  block-local. Only sensible on small graphs.)
Timing: `train_s` is wall time of the training loop only (sampling, feature gather,
  forward, backward, Adam) for all batches; `eval_s` is timed separately.
"""
import argparse
import json
import os
import platform
import random
import resource
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="directory from `tandem export --format npy`")
    p.add_argument("--model", choices=["sage", "gcn", "gat"], default="sage")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4, help="GAT heads (hidden per head = hidden/heads)")
    p.add_argument("--fanouts", default="10,10",
                   help="comma list, DGL order: first = input (bottom) layer; -1 = all neighbours")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=1,
                   help="evaluate every N epochs (the last epoch is always evaluated); 0 = only last")
    p.add_argument("--eval-mode", choices=["full", "minibatch"], default="full")
    p.add_argument("--eval-batch-size", type=int, default=4096)
    p.add_argument("--max-batches", type=int, default=0,
                   help="stop each epoch after N batches (0 = all) and extrapolate the epoch time")
    p.add_argument("--json", default=None, help="write the run record here")
    return p.parse_args(argv)


args = parse_args()
# Thread count must be fixed before torch / OpenBLAS / DGL start their OpenMP pools.
os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.__version__ = "1.13.1"  # DGL 1.1.3 cannot parse Debian's torch version string
import warnings  # noqa: E402

# DGL suggests enable_cpu_affinity(), which only applies to num_workers > 0.
warnings.filterwarnings("ignore", message=".*CPU affinity opt is not enabled.*")
import dgl  # noqa: E402
import dgl.nn as dglnn  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)
dgl.utils.set_num_threads(args.threads)


def log(*a):
    print(*a, flush=True)


# --------------------------------------------------------------------------- data
def load_export(path, model):
    t0 = time.perf_counter()
    meta = json.load(open(os.path.join(path, "meta.json")))
    ei = np.load(os.path.join(path, "edge_index.npy"))
    feats = np.load(os.path.join(path, "features.npy"))
    labels = np.load(os.path.join(path, "labels.npy"))
    masks = {k: np.load(os.path.join(path, f"{k}_mask.npy")) for k in ("train", "val", "test")}
    n = feats.shape[0]
    g = dgl.graph((torch.from_numpy(ei[0]), torch.from_numpy(ei[1])), num_nodes=n)
    del ei
    stored_edges = g.num_edges()
    if model in ("gcn", "gat"):
        g = dgl.remove_self_loop(g)
        g = dgl.add_self_loop(g)
    g.ndata["feat"] = torch.from_numpy(np.ascontiguousarray(feats, dtype=np.float32))
    g.ndata["label"] = torch.from_numpy(labels.astype(np.int64))
    for k, m in masks.items():
        g.ndata[f"{k}_mask"] = torch.from_numpy(m.astype(bool))
    # Build the in-edge CSC once up front (sampling walks in-edges), not inside epoch 0.
    g.create_formats_()
    num_classes = int(meta.get("num_classes", int(labels.max()) + 1))
    return g, meta, num_classes, stored_edges, time.perf_counter() - t0


# --------------------------------------------------------------------------- models
class Net(nn.Module):
    def __init__(self, model, in_size, hidden, out_size, layers, heads, dropout):
        super().__init__()
        self.model, self.heads = model, heads
        self.layers = nn.ModuleList()
        dims = [in_size] + [hidden] * (layers - 1) + [out_size]
        for l in range(layers):
            last = l == layers - 1
            if model == "sage":
                self.layers.append(dglnn.SAGEConv(dims[l], dims[l + 1], "mean"))
            elif model == "gcn":
                self.layers.append(dglnn.GraphConv(dims[l], dims[l + 1], norm="both"))
            else:
                assert hidden % heads == 0, "--hidden must be divisible by --heads"
                out = dims[l + 1] if last else dims[l + 1] // heads
                self.layers.append(dglnn.GATConv(dims[l], out, num_heads=heads,
                                                 feat_drop=0.0, attn_drop=0.0))
        self.dropout = nn.Dropout(dropout)
        self.act = F.elu if model == "gat" else F.relu

    def apply_layer(self, l, g, h):
        h = self.layers[l](g, h)
        last = l == len(self.layers) - 1
        if self.model == "gat":
            h = h.mean(1) if last else h.flatten(1)
        if not last:
            h = self.act(h)
            h = self.dropout(h)
        return h

    def forward(self, blocks, x):
        h = x
        for l, block in enumerate(blocks):
            h = self.apply_layer(l, block, h)
        return h

    @torch.no_grad()
    def inference_full(self, g, x):
        """Layer-wise inference: layer l on the whole graph before layer l+1."""
        h = x
        for l in range(len(self.layers)):
            h = self.apply_layer(l, g, h)
        return h


# --------------------------------------------------------------------------- eval
@torch.no_grad()
def evaluate(net, g, args):
    net.eval()
    labels = g.ndata["label"]
    accs = {}
    if args.eval_mode == "full":
        logits = net.inference_full(g, g.ndata["feat"])
        pred = logits.argmax(1)
        for k in ("train", "val", "test"):
            m = g.ndata[f"{k}_mask"]
            accs[k] = float((pred[m] == labels[m]).float().mean()) if m.any() else float("nan")
    else:
        sampler = dgl.dataloading.MultiLayerFullNeighborSampler(len(net.layers),
                                                                prefetch_node_feats=["feat"],
                                                                prefetch_labels=["label"])
        for k in ("train", "val", "test"):
            ids = torch.nonzero(g.ndata[f"{k}_mask"], as_tuple=True)[0]
            loader = dgl.dataloading.DataLoader(g, ids, sampler, batch_size=args.eval_batch_size,
                                                shuffle=False, drop_last=False, num_workers=0)
            correct = 0
            for _, _, blocks in loader:
                y = blocks[-1].dstdata["label"]
                correct += int((net(blocks, blocks[0].srcdata["feat"]).argmax(1) == y).sum())
            accs[k] = correct / max(1, len(ids))
    net.train()
    return accs


# --------------------------------------------------------------------------- main
def main():
    global load_start
    load_start = list(os.getloadavg())  # other processes on the machine skew epoch times
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    dgl.seed(args.seed)

    fanouts = [int(x) for x in args.fanouts.split(",")]
    if len(fanouts) != args.layers:
        sys.exit(f"--fanouts has {len(fanouts)} entries but --layers is {args.layers}")

    g, meta, num_classes, stored_edges, load_s = load_export(args.data, args.model)
    train_ids = torch.nonzero(g.ndata["train_mask"], as_tuple=True)[0]
    log(f"# data {meta.get('name')}: {g.num_nodes()} vertices, {stored_edges} stored edges"
        f" ({g.num_edges()} in DGL graph), dim {g.ndata['feat'].shape[1]}, {num_classes} classes,"
        f" train/val/test {int(g.ndata['train_mask'].sum())}/{int(g.ndata['val_mask'].sum())}/"
        f"{int(g.ndata['test_mask'].sum())}; loaded in {load_s:.1f}s")
    log(f"# dgl {dgl.__version__}, torch threads {torch.get_num_threads()}, "
        f"dgl omp threads {dgl.utils.get_num_threads()}")

    net = Net(args.model, g.ndata["feat"].shape[1], args.hidden, num_classes, args.layers,
              args.heads, args.dropout)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sampler = dgl.dataloading.NeighborSampler(fanouts, prefetch_node_feats=["feat"],
                                              prefetch_labels=["label"])
    loader = dgl.dataloading.DataLoader(g, train_ids, sampler, batch_size=args.batch_size,
                                        shuffle=True, drop_last=False, num_workers=0)
    num_batches = len(loader)

    epochs = []
    log("epoch    loss  train_acc  val_acc  test_acc  train_s  eval_s  (sample_s compute_s)")
    for epoch in range(args.epochs):
        net.train()
        loss_sum, seen, correct, nb = 0.0, 0, 0, 0
        sample_s = 0.0
        batch_s = []  # wall time of each batch (sample + gather + fwd/bwd/step)
        t0 = time.perf_counter()
        c0 = time.process_time()
        it = iter(loader)
        while True:
            ts = time.perf_counter()
            try:
                _, _, blocks = next(it)
            except StopIteration:
                break
            x = blocks[0].srcdata["feat"]
            y = blocks[-1].dstdata["label"]
            sample_s += time.perf_counter() - ts
            logits = net(blocks, x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += float(loss) * len(y)
            seen += len(y)
            correct += int((logits.argmax(1) == y).sum())
            nb += 1
            batch_s.append(time.perf_counter() - ts)
            if args.max_batches and nb >= args.max_batches:
                break
        train_s = time.perf_counter() - t0
        train_cpu_s = time.process_time() - c0  # CPU s of all threads (incl. OpenMP spin-waits)
        rec = {"epoch": epoch, "loss": loss_sum / max(1, seen), "train_s": train_s,
               "sample_s": sample_s, "compute_s": train_s - sample_s, "train_cpu_s": train_cpu_s,
               "batches": nb,
               "train_acc_sampled": correct / max(1, seen),
               "loadavg_1min": os.getloadavg()[0]}  # >~0.5 besides us: time is contended
        rec["batch_s"] = batch_s
        # Median batch time x batches: an epoch-time estimate robust to intermittent load.
        rec["median_batch_s"] = float(np.median(batch_s))
        if nb < num_batches:
            rec["extrapolated_train_s"] = train_s / nb * num_batches
        do_eval = epoch == args.epochs - 1 or (args.eval_every > 0 and (epoch + 1) % args.eval_every == 0)
        if do_eval:
            t1 = time.perf_counter()
            accs = evaluate(net, g, args)
            rec["eval_s"] = time.perf_counter() - t1
            rec.update({"train_acc": accs["train"], "val_acc": accs["val"], "test_acc": accs["test"]})
        epochs.append(rec)
        f = lambda k: f"{rec[k]:.4f}" if k in rec else "   -  "  # noqa: E731
        log(f"{epoch:5d} {rec['loss']:7.4f}    {f('train_acc')}   {f('val_acc')}    {f('test_acc')}"
            f"  {train_s:7.2f}  {rec.get('eval_s', 0.0):6.2f}  ({sample_s:.2f} {train_s - sample_s:.2f})"
            + (f"  [{nb}/{num_batches} batches, extrapolated {rec['extrapolated_train_s']:.1f}s]"
               if nb < num_batches else ""))

    times = [r.get("extrapolated_train_s", r["train_s"]) for r in epochs]
    evald = [r for r in epochs if "val_acc" in r]
    best = max(evald, key=lambda r: r["val_acc"])  # first epoch with the highest val acc
    result = {
        "peer": "dgl",
        "config": vars(args) | {"fanouts": fanouts},
        "dataset": {"name": meta.get("name"), "path": os.path.abspath(args.data),
                    "vertices": g.num_nodes(), "stored_edges": stored_edges,
                    "dgl_graph_edges": g.num_edges(), "feature_dim": int(g.ndata["feat"].shape[1]),
                    "num_classes": num_classes, "train": len(train_ids),
                    "val": int(g.ndata["val_mask"].sum()), "test": int(g.ndata["test_mask"].sum())},
        "semantics": {
            "self_loops_added": args.model in ("gcn", "gat"),
            "dropout": "after activation of every layer but the last; none on input",
            "eval": ("layer-wise full-graph inference (all neighbours), eval mode"
                     if args.eval_mode == "full" else
                     "MultiLayerFullNeighborSampler mini-batches, eval mode"),
            "epoch_time": "training loop only (sampling + gather + fwd/bwd/step); eval separate",
        },
        "env": {"dgl": dgl.__version__, "torch": torch.__version__, "python": platform.python_version(),
                "torch_threads": torch.get_num_threads(), "dgl_threads": dgl.utils.get_num_threads(),
                "cpu_count": os.cpu_count(), "machine": platform.machine()},
        "batches_per_epoch": num_batches,
        "load_s": load_s,
        "epochs": epochs,
        "epoch_train_s": times,
        "mean_epoch_s_excl_first": float(np.mean(times[1:])) if len(times) > 1 else times[0],
        "median_epoch_s_excl_first": float(np.median(times[1:])) if len(times) > 1 else times[0],
        "min_epoch_s": float(np.min(times)),
        "loadavg_start": load_start,
        "loadavg_end": list(os.getloadavg()),
        "times_extrapolated": any("extrapolated_train_s" in r for r in epochs),
        "final": {"epoch": evald[-1]["epoch"], "val_acc": evald[-1]["val_acc"],
                  "test_acc": evald[-1]["test_acc"]},
        "best_val": {"epoch": best["epoch"], "val_acc": best["val_acc"], "test_acc": best["test_acc"]},
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    log(f"# mean epoch (train only, excl. epoch 0): {result['mean_epoch_s_excl_first']:.3f}s"
        f" (median {result['median_epoch_s_excl_first']:.3f}s, min {result['min_epoch_s']:.3f}s)"
        + (" [extrapolated]" if result["times_extrapolated"] else "")
        + f"; best val {best['val_acc']:.4f} at epoch {best['epoch']} -> test {best['test_acc']:.4f};"
        f" final test {evald[-1]['test_acc']:.4f}; peak RSS {result['peak_rss_mib']:.0f} MiB")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
