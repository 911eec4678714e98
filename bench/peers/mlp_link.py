#!/usr/bin/env python3
"""Feature-only link-prediction baseline: what the features alone predict, no graph.

The same training as bench/peers/dgl_link.py with the graph taken away: an MLP
Linear(d,H) -> ... -> Linear(H,H) (ReLU then Dropout(p) after every layer but the
last, as the SAGE encoder), the dot-product decoder, binary cross-entropy on the
logits over each batch's positives and `--negatives` uniform negatives per positive
(source kept), Adam, the same epochs, batch size (positive edges) and seed; evaluated
against the same negatives as Tandem and the DGL peer (bench/peers/link_common.py),
with the same MRR, Hits@K and AUC. Runs with any PyTorch (CPU).

    python bench/peers/mlp_link.py --data DIR_npy --layers 2 --hidden 256 \
        --batch-size 1024 --negatives 1 --lr 0.003 --dropout 0.5 --epochs 5 --json out.json
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--negatives", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-negatives", type=int, default=100)
    p.add_argument("--metrics", default="mrr,hits@10,auc")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


args = parse_args()
os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import link_common as lc  # noqa: E402

torch.set_num_threads(args.threads)


class MLP(nn.Module):
    def __init__(self, in_size, hidden, layers, dropout):
        super().__init__()
        dims = [in_size] + [hidden] * layers
        self.layers = nn.ModuleList(nn.Linear(dims[l], dims[l + 1]) for l in range(layers))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        for l, lin in enumerate(self.layers):
            x = lin(x)
            if l < len(self.layers) - 1:
                x = self.dropout(F.relu(x))
        return x


def main():
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    names = [m.strip() for m in args.metrics.split(",") if m.strip()]
    data = lc.load_link_export(args.data)
    n = int(data["meta"]["num_vertices"])
    x = torch.from_numpy(np.array(data["features"], dtype=np.float32))  # a copy of the mapped file
    src, dst = (torch.from_numpy(a.astype(np.int64)) for a in data["parts"]["train"])
    sets, neg_source = lc.eval_sets(data, args.eval_negatives, args.seed)
    print(f"# feature-only MLP on {args.data}: {n} vertices, dim {x.shape[1]}, {len(src)} training "
          f"positives; evaluation negatives: {neg_source['test']}", flush=True)
    net = MLP(x.shape[1], args.hidden, args.layers, args.dropout)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    k = args.negatives
    epochs = []
    for epoch in range(args.epochs):
        net.train()
        t0 = time.perf_counter()
        perm = torch.randperm(len(src))
        loss_sum, rows = 0.0, 0
        for s in range(0, len(src), args.batch_size):
            e = perm[s:s + args.batch_size]
            u, v = src[e], dst[e]
            w = torch.randint(0, n, (len(e) * k,))
            hu = net(x[torch.cat([u, v, w])])
            b = len(e)
            pos = (hu[:b] * hu[b:2 * b]).sum(1)
            neg = (hu[:b].repeat_interleave(k, 0) * hu[2 * b:]).sum(1)
            logits = torch.cat([pos, neg])
            labels = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
            loss = F.binary_cross_entropy_with_logits(logits, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += float(loss) * len(logits)
            rows += len(logits)
        train_s = time.perf_counter() - t0
        net.eval()
        with torch.no_grad():
            h = net(x).numpy()
        rec = {"epoch": epoch, "loss": loss_sum / rows, "train_s": train_s}
        for p, (ps, pd, pn) in sets.items():
            rec[p] = lc.metrics(names, *lc.dot_scores(h, ps, pd, pn))
        epochs.append(rec)
        print("json " + json.dumps(rec), flush=True)
    best = max(epochs, key=lambda r: r["val"][names[0]])
    fin = epochs[-1]["test"]
    print("# mlp final test " + " ".join(f"{k} {v:.4f}" for k, v in fin.items())
          + f"; best val {names[0]} {best['val'][names[0]]:.4f} at epoch {best['epoch']}", flush=True)
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"peer": "mlp-link", "config": vars(args), "epochs": epochs,
                       "final": {"test": fin, "val": epochs[-1]["val"]},
                       "best_val": {"epoch": best["epoch"], "val": best["val"], "test": best["test"]},
                       "eval_negatives": neg_source}, fh, indent=1)
        os.replace(tmp, args.json)


if __name__ == "__main__":
    main()
