#!/usr/bin/env python3
"""DGL 1.1.3 link-prediction reference for Tandem comparisons (quality and epoch time).

Reads a directory written by `tandem export FILE.tds --format npy -o DIR` from a store
with an edge split (`tandem generate sbm --edge-split 0.85,0.05,0.1`) and trains what
Tandem trains with `model.task = "link"` (docs/training.md, "Link prediction"), with
DGL's link-prediction machinery. See bench/peers/README.md for setup and semantics.

Model: GraphSAGE-mean, SAGEConv(d,H,'mean') -> ... -> SAGEConv(H,H,'mean') (the top
  layer outputs H-wide embeddings, as Tandem's link encoder), ReLU then Dropout(p)
  after every layer but the last (DGL's GraphSAGE example; Tandem's placement).
  Decoder: the dot product of the two endpoints' embeddings (`link.decoder = "dot"`).
  Loss: binary cross-entropy on the logits, mean over the batch's positive and
  negative pairs. Adam(lr, weight_decay).
Training: the graph is the exported training graph (edge_index.npy: every training
  positive both ways, never a validation or test edge), built here from
  edge_split/train_{src,dst}.npy as edges 0..t-1 (one way) and t..2t-1 (the
  reverses) so that an epoch visits each training positive once, as Tandem's does.
  `as_edge_prediction_sampler(NeighborSampler(fanouts), exclude="reverse_id",
  reverse_eids=..., negative_sampler=negative_sampler.Uniform(k))` over the
  positives 0..t-1, DataLoader(batch_size positives, shuffle=True, drop_last=False):
  the batch's positives and their reverses leave every sampled hop (Tandem's
  `link.exclude = "reverse"`); each positive gets k negatives that keep its source
  and draw a destination uniformly (Tandem's `link.negative_sampler = "uniform"`).
  A directed split uses exclude="self".
Evaluation (full-neighbour, as Tandem's `train.eval_mode = "full"`): layer-wise
  inference over the whole training graph in eval mode, then every validation and
  test positive scored against its negatives: the store's fixed negatives when the
  export has them, else Tandem's own draw (bench/peers/link_common.py), so both
  systems rank against identical negatives. MRR, Hits@K, AUC as Tandem defines them.
Timing: `train_s` is the training loop only (sampling, exclusion, negative draws,
  feature gather, forward, backward, Adam), `cpu_s` the CPU time of all its threads
  over the same loop; evaluation is timed apart.
"""
import argparse
import json
import os
import platform
import random
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="directory from `tandem export --format npy`")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--fanouts", default="10,10", help="comma list, DGL order (input layer first)")
    p.add_argument("--batch-size", type=int, default=1024, help="positive edges per batch")
    p.add_argument("--negatives", type=int, default=1, help="negatives per positive in training")
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seed", type=int, default=0, help="also Tandem's train.seed for its negatives")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=1,
                   help="evaluate every N epochs (the last is always evaluated); 0 = only last")
    p.add_argument("--eval-negatives", type=int, default=100,
                   help="Tandem's link.eval_negatives (used when the export has no fixed negatives)")
    p.add_argument("--metrics", default="mrr,hits@10,auc", help="Tandem's link.metrics; the first selects")
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

warnings.filterwarnings("ignore", message=".*CPU affinity opt is not enabled.*")
import dgl  # noqa: E402
import dgl.nn as dglnn  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import link_common as lc  # noqa: E402

torch.set_num_threads(args.threads)
dgl.utils.set_num_threads(args.threads)


def log(*a):
    print(*a, flush=True)


class Encoder(nn.Module):
    """SAGE-mean, H-wide output; ReLU + dropout after every layer but the last."""

    def __init__(self, in_size, hidden, layers, dropout):
        super().__init__()
        dims = [in_size] + [hidden] * layers
        self.layers = nn.ModuleList(dglnn.SAGEConv(dims[l], dims[l + 1], "mean") for l in range(layers))
        self.dropout = nn.Dropout(dropout)

    def apply_layer(self, l, g, h):
        h = self.layers[l](g, h)
        if l < len(self.layers) - 1:
            h = self.dropout(F.relu(h))
        return h

    def forward(self, blocks, x):
        h = x
        for l, block in enumerate(blocks):
            h = self.apply_layer(l, block, h)
        return h

    @torch.no_grad()
    def inference_full(self, g, x):
        h = x
        for l in range(len(self.layers)):
            h = self.apply_layer(l, g, h)
        return h


def pair_dot(h, pair_graph):
    s, d = pair_graph.edges()
    return (h[s] * h[d]).sum(1)


@torch.no_grad()
def evaluate(net, g, sets, names):
    net.eval()
    h = net.inference_full(g, g.ndata["feat"]).numpy()
    net.train()
    out = {}
    for p, (src, dst, neg) in sets.items():
        pos_s, neg_s = lc.dot_scores(h, src, dst, neg)
        out[p] = lc.metrics(names, pos_s, neg_s)
    return out


def main():
    load_start = list(os.getloadavg())
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    dgl.seed(args.seed)
    fanouts = [int(x) for x in args.fanouts.split(",")]
    if len(fanouts) != args.layers:
        sys.exit(f"--fanouts has {len(fanouts)} entries but --layers is {args.layers}")
    names = [m.strip() for m in args.metrics.split(",") if m.strip()]

    t0 = time.perf_counter()
    data = lc.load_link_export(args.data)
    n = int(data["meta"]["num_vertices"])
    stored = lc.check_training_graph(data)
    src, dst = (torch.from_numpy(a.astype(np.int64)) for a in data["parts"]["train"])
    t = len(src)
    if data["symmetric"]:
        g = dgl.graph((torch.cat([src, dst]), torch.cat([dst, src])), num_nodes=n)
        reverse = torch.cat([torch.arange(t, 2 * t), torch.arange(0, t)])
        exclude = dict(exclude="reverse_id", reverse_eids=reverse)
    else:
        g = dgl.graph((src, dst), num_nodes=n)
        exclude = dict(exclude="self")
    g.ndata["feat"] = torch.from_numpy(np.array(data["features"], dtype=np.float32))  # a copy: the file is mapped read-only
    g.create_formats_()
    sets, neg_source = lc.eval_sets(data, args.eval_negatives, args.seed)
    load_s = time.perf_counter() - t0
    log(f"# data {data['meta'].get('name')}: {n} vertices, {stored} training-graph edges, "
        f"dim {g.ndata['feat'].shape[1]}, positives train/val/test {t}/{len(sets['val'][0])}/"
        f"{len(sets['test'][0])} ({data['meta']['edge_split']}); loaded in {load_s:.1f}s")
    log(f"# evaluation negatives: {neg_source['test']}")
    log(f"# dgl {dgl.__version__}, torch threads {torch.get_num_threads()}, "
        f"dgl omp threads {dgl.utils.get_num_threads()}")

    net = Encoder(g.ndata["feat"].shape[1], args.hidden, args.layers, args.dropout)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sampler = dgl.dataloading.NeighborSampler(fanouts, prefetch_node_feats=["feat"])
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        sampler, negative_sampler=dgl.dataloading.negative_sampler.Uniform(args.negatives), **exclude)
    loader = dgl.dataloading.DataLoader(g, torch.arange(t), sampler, batch_size=args.batch_size,
                                        shuffle=True, drop_last=False, num_workers=0)
    num_batches = len(loader)

    epochs = []
    first = names[0]
    log(f"epoch    loss  val_{first}  test_{first}  train_s  eval_s  (sample_s compute_s)")
    for epoch in range(args.epochs):
        net.train()
        loss_sum, rows, nb, sample_s, batch_s = 0.0, 0, 0, 0.0, []
        t0, c0 = time.perf_counter(), time.process_time()
        it = iter(loader)
        while True:
            ts = time.perf_counter()
            try:
                _, pair_graph, neg_graph, blocks = next(it)
            except StopIteration:
                break
            x = blocks[0].srcdata["feat"]
            sample_s += time.perf_counter() - ts
            h = net(blocks, x)
            pos, neg = pair_dot(h, pair_graph), pair_dot(h, neg_graph)
            logits = torch.cat([pos, neg])
            labels = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
            loss = F.binary_cross_entropy_with_logits(logits, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += float(loss) * len(logits)
            rows += len(logits)
            nb += 1
            batch_s.append(time.perf_counter() - ts)
            if args.max_batches and nb >= args.max_batches:
                break
        train_s = time.perf_counter() - t0
        cpu_s = time.process_time() - c0  # every thread's CPU time: the work, less the waiting
        rec = {"epoch": epoch, "loss": loss_sum / max(1, rows), "train_s": train_s, "cpu_s": cpu_s,
               "sample_s": sample_s, "compute_s": train_s - sample_s, "batches": nb,
               "median_batch_s": float(np.median(batch_s)), "loadavg_1min": os.getloadavg()[0]}
        if nb < num_batches:
            rec["extrapolated_train_s"] = train_s / nb * num_batches
        if epoch == args.epochs - 1 or (args.eval_every > 0 and (epoch + 1) % args.eval_every == 0):
            t1 = time.perf_counter()
            m = evaluate(net, g, sets, names)
            rec["eval_s"] = time.perf_counter() - t1
            rec["val"], rec["test"] = m["val"], m["test"]
        epochs.append(rec)
        f = lambda p: f"{rec[p][first]:.4f}" if p in rec else "   -  "  # noqa: E731
        log(f"{epoch:5d} {rec['loss']:7.4f}  {f('val')}  {f('test')}  {train_s:7.2f}  "
            f"{rec.get('eval_s', 0.0):6.2f}  ({sample_s:.2f} {train_s - sample_s:.2f})"
            + (f"  [{nb}/{num_batches} batches, extrapolated {rec['extrapolated_train_s']:.1f}s]"
               if nb < num_batches else ""))
        log("json " + json.dumps({k: v for k, v in rec.items()}))

    times = [r.get("extrapolated_train_s", r["train_s"]) for r in epochs]
    evald = [r for r in epochs if "val" in r]
    best = max(evald, key=lambda r: r["val"][first])  # first epoch with the best val metric
    result = {
        "peer": "dgl-link",
        "config": vars(args) | {"fanouts": fanouts, "metrics": names},
        "dataset": {"name": data["meta"].get("name"), "path": os.path.abspath(args.data),
                    "vertices": n, "training_graph_edges": stored, "edge_split": data["meta"]["edge_split"],
                    "train": t, "val": len(sets["val"][0]), "test": len(sets["test"][0]),
                    "feature_dim": int(g.ndata["feat"].shape[1]),
                    "eval_negatives": {p: neg_source[p] for p in ("val", "test")}},
        "env": {"dgl": dgl.__version__, "torch": torch.__version__, "python": platform.python_version(),
                "torch_threads": torch.get_num_threads(), "dgl_threads": dgl.utils.get_num_threads(),
                "cpu_count": os.cpu_count()},
        "batches_per_epoch": num_batches,
        "load_s": load_s,
        "epochs": epochs,
        "epoch_train_s": times,
        "mean_epoch_s_excl_first": float(np.mean(times[1:])) if len(times) > 1 else times[0],
        "median_epoch_s_excl_first": float(np.median(times[1:])) if len(times) > 1 else times[0],
        "times_extrapolated": any("extrapolated_train_s" in r for r in epochs),
        "loadavg_start": load_start,
        "loadavg_end": list(os.getloadavg()),
        "final": {"epoch": evald[-1]["epoch"], "val": evald[-1]["val"], "test": evald[-1]["test"]},
        "best_val": {"epoch": best["epoch"], "val": best["val"], "test": best["test"]},
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    fin = evald[-1]["test"]
    log(f"# mean epoch (train only, excl. epoch 0): {result['mean_epoch_s_excl_first']:.3f}s"
        f" (median {result['median_epoch_s_excl_first']:.3f}s)"
        + (" [extrapolated]" if result["times_extrapolated"] else "")
        + "; final test " + " ".join(f"{k} {v:.4f}" for k, v in fin.items())
        + f"; best val {first} {best['val'][first]:.4f} at epoch {best['epoch']}"
        f"; peak RSS {result['peak_rss_mib']:.0f} MiB")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        tmp = args.json + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(result, fh, indent=1)
        os.replace(tmp, args.json)


if __name__ == "__main__":
    main()
