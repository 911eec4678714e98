#!/usr/bin/env python3
"""The same PyG GraphSAGE fed by PyG's NeighborLoader and by tandem.NeighborLoader.

Reads a directory written by `tandem export FILE.tds --format npy -o DIR` (or
generates an SBM with --sbm) and prints, for each loader:
  - loader-only batches/s: one pass over --loader-seeds (sampling, feature
    gather, labels; Tandem's batches converted with to_pyg()), nothing else;
  - training: epoch time (mean over epochs 1..N-1) of an unchanged
    torch_geometric.nn.GraphSAGE trained on the batches (trim_to_layer on),
    and its test accuracy (exact: every neighbor of every hop, in batches, the
    same evaluation for both models);
and DGL 1.1's NeighborSampler DataLoader loader-only batches/s.

Fanouts are given bottom (input layer) first, Tandem's and DGL's order:
`--fanouts 15,10,5` draws 5 neighbors per seed, 10 per vertex those reach, 15
per vertex those reach; PyG gets the same hops as num_neighbors=[5, 10, 15].
PyG's NeighborLoader needs pyg-lib or torch-sparse; without either its
columns are skipped and say so. One JSON line with every number closes the
output (--json writes it to a file too).
"""
import argparse
import json
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="directory from `tandem export --format npy`")
    src.add_argument("--sbm", help="generate an SBM: VERTICES,EDGES,CLASSES,DIM")
    p.add_argument("--fanouts", default="15,10,5", help="bottom (input layer) first")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loader-seeds", choices=["train", "all"], default="all",
                   help="seeds of the loader-only pass (all: every vertex, more batches)")
    p.add_argument("--loader-batches", type=int, default=0, help="stop the pass after N (0: all)")
    p.add_argument("--eval-batch-size", type=int, default=4096)
    p.add_argument("--eval-fanouts", default="",
                   help="fanouts of the test inference, bottom first (default: every neighbor)")
    p.add_argument("--eval-limit", type=int, default=0,
                   help="evaluate the first N test vertices (0: all)")
    p.add_argument("--skip", default="", help="comma list of pyg,dgl,train to leave out")
    p.add_argument("--device", choices=["cpu", "cuda", "host-backend"], default="cpu",
                   help="where the model trains; cuda: Tandem's device loader (device=\"cuda\"), "
                        "PyG's batches moved with .to(\"cuda\"); host-backend: the device "
                        "loader's path on the CPU (a dry run of cuda)")
    p.add_argument("--max-batches", type=int, default=0,
                   help="training batches per epoch (0: every one)")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


args = parse_args()
os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import warnings  # noqa: E402

# Read-only dataset views (a memory-mapped or generated dataset) become tensors
# that are never written to.
warnings.filterwarnings("ignore", message=".*NumPy array is not writable.*")
warnings.filterwarnings("ignore", message=".*CPU affinity opt is not enabled.*")

torch.set_num_threads(args.threads)
import torch.nn.functional as F  # noqa: E402
from torch_geometric.data import Data  # noqa: E402
from torch_geometric.nn import GraphSAGE  # noqa: E402

import tandem  # noqa: E402

SKIP = set(filter(None, args.skip.split(",")))
FANOUTS = [int(f) for f in args.fanouts.split(",")]


def log(*a):
    print(*a, flush=True)


def load():
    if args.data:
        meta = json.load(open(os.path.join(args.data, "meta.json")))
        ei = np.load(os.path.join(args.data, "edge_index.npy"))
        x = np.ascontiguousarray(np.load(os.path.join(args.data, "features.npy")), dtype=np.float32)
        y = np.load(os.path.join(args.data, "labels.npy")).astype(np.int64)
        masks = [np.load(os.path.join(args.data, f"{k}_mask.npy")).astype(bool)
                 for k in ("train", "val", "test")]
        ds = tandem.Dataset.from_arrays(features=x, labels=y, edge_index=ei, train=masks[0],
                                        val=masks[1], test=masks[2], name=meta.get("name", "npy"))
        return ds, x, y, ei, masks
    v, e, c, d = (int(s) for s in args.sbm.split(","))
    ds = tandem.Dataset.generate_sbm(vertices=v, edges=e, classes=c, dim=d, seed=args.seed)
    x = ds.features
    y = ds.labels.astype(np.int64)
    masks = []
    for ids in (ds.train_ids, ds.val_ids, ds.test_ids):
        m = np.zeros(ds.num_vertices, dtype=bool)
        m[ids] = True
        masks.append(m)
    # The dataset's CSR as PyG's edge_index (row v holds v's in-neighbors).
    src, dst = [], []
    full = tandem.NeighborLoader(ds, [-1], 65536, seeds=np.arange(ds.num_vertices), shuffle=False)
    for b in full:
        src.append(b.n_id[b.edge_index[0]])
        dst.append(b.n_id[b.edge_index[1]])
    ei = np.stack([np.concatenate(src), np.concatenate(dst)])
    return ds, x, y, ei, masks


def pyg_loader_runs():
    import torch_geometric.typing as t

    return bool(getattr(t, "WITH_PYG_LIB", False) or getattr(t, "WITH_TORCH_SPARSE", False))


DEVICE = torch.device("cuda" if args.device == "cuda" else "cpu")


def sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def timed_pass(batches, limit):
    """Batches/s of one pass over an iterable (the first batch included; on a
    GPU every batch's work finished)."""
    sync()
    t0 = time.perf_counter()
    n = 0
    for _ in batches:
        n += 1
        if limit and n >= limit:
            break
    sync()
    return n / (time.perf_counter() - t0), n


def tandem_loader(ds, seeds, shuffle=True, fanouts=None, batch_size=None, device=None):
    """Tandem's loader: on a GPU run its device loader (batches on the GPU)."""
    device = device or {"cuda": "cuda", "host-backend": "host-backend"}.get(args.device, "host")
    return tandem.NeighborLoader(ds, fanouts or FANOUTS, batch_size or args.batch_size,
                                 seeds=seeds, shuffle=shuffle, seed=args.seed,
                                 threads=args.threads, device=device)


def tandem_batches(loader):
    """The loader's next epoch in PyG's layout."""
    return (b.to_pyg() for b in loader)


def pyg_batches(data, seeds):
    """PyG's NeighborLoader (its CPU sampler), each batch moved to the device
    the model trains on."""
    from torch_geometric.loader import NeighborLoader

    loader = NeighborLoader(data, num_neighbors=FANOUTS[::-1], batch_size=args.batch_size,
                            input_nodes=torch.from_numpy(seeds), shuffle=True, num_workers=0)
    return (b.to(DEVICE) for b in loader) if DEVICE.type == "cuda" else loader


def dgl_batches(ei, x, y, seeds, n):
    torch.__version__ = "1.13.1"  # DGL 1.1.3 cannot parse Debian's torch version string
    import dgl

    dgl.utils.set_num_threads(args.threads)
    g = dgl.graph((torch.from_numpy(ei[0]), torch.from_numpy(ei[1])), num_nodes=n)
    g.ndata["feat"] = torch.from_numpy(x)
    g.ndata["label"] = torch.from_numpy(y)
    g.create_formats_()
    sampler = dgl.dataloading.NeighborSampler(
        FANOUTS, prefetch_node_feats=["feat"], prefetch_labels=["label"])
    return dgl.dataloading.DataLoader(g, torch.from_numpy(seeds), sampler,
                                      batch_size=args.batch_size, shuffle=True, num_workers=0)


def model(dim, classes):
    torch.manual_seed(args.seed)
    return GraphSAGE(dim, args.hidden, num_layers=len(FANOUTS), out_channels=classes,
                     dropout=args.dropout).to(DEVICE)


def step(net, opt, batch):
    """One unchanged PyG training step on a NeighborLoader-style batch."""
    opt.zero_grad()
    if "num_sampled_nodes" in batch:
        out = net(batch.x, batch.edge_index,
                  num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                  num_sampled_edges_per_hop=batch.num_sampled_edges)
    else:
        # PyG's NeighborLoader over torch-sparse (no pyg-lib) gives no per-hop
        # counts, so its batches train untrimmed (same output, more work).
        out = net(batch.x, batch.edge_index)
    out = out[: batch.batch_size]
    loss = F.cross_entropy(out, batch.y[: batch.batch_size])
    loss.backward()
    opt.step()
    return loss.detach()  # read once an epoch: no synchronization per step


@torch.no_grad()
def test_accuracy(net, ds, test_ids):
    """Inference on the test vertices: every neighbor at every hop unless
    --eval-fanouts says otherwise (seed 0: the same for every model)."""
    net.eval()
    correct = 0
    if args.eval_limit:
        test_ids = test_ids[: args.eval_limit]
    fanouts = [int(f) for f in args.eval_fanouts.split(",")] if args.eval_fanouts else [-1] * len(FANOUTS)
    for b in tandem_batches(tandem_loader(ds, test_ids, shuffle=False, fanouts=fanouts,
                                          batch_size=args.eval_batch_size, device="host")):
        b = b.to(DEVICE)
        out = net(b.x, b.edge_index)[: b.batch_size]
        correct += int((out.argmax(-1) == b.y[: b.batch_size]).sum())
    net.train()
    return correct / len(test_ids)


def train(name, make_batches, ds, dim, classes, test_ids):
    net = model(dim, classes)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    times, loss = [], float("nan")
    for epoch in range(args.epochs):
        sync()
        t0 = time.perf_counter()
        for i, batch in enumerate(make_batches()):
            if args.max_batches and i >= args.max_batches:
                break
            loss = step(net, opt, batch)
        loss = float(loss)
        times.append(time.perf_counter() - t0)
        log(f"  {name} epoch {epoch}: {times[-1]:.3f} s, loss {loss:.4f}")
    acc = test_accuracy(net, ds, test_ids)
    epoch_s = float(np.mean(times[1:] if len(times) > 1 else times))
    return {"epoch_s": epoch_s, "test_acc": acc, "final_loss": loss}


def main():
    t0 = time.perf_counter()
    ds, x, y, ei, (train_m, _, test_m) = load()
    n, dim, classes = ds.num_vertices, ds.num_features, ds.num_classes
    train_ids = np.flatnonzero(train_m)
    test_ids = np.flatnonzero(test_m)
    seeds = np.arange(n) if args.loader_seeds == "all" else train_ids
    log(f"data: {ds.name}, {n} vertices, {ei.shape[1]} edges, dim {dim}, {classes} classes, "
        f"train {len(train_ids)}, test {len(test_ids)} (loaded in {time.perf_counter() - t0:.1f} s)")
    log(f"fanouts {FANOUTS} bottom first (PyG num_neighbors={FANOUTS[::-1]}), batch "
        f"{args.batch_size}, {args.threads} threads, loader pass over {len(seeds)} seeds")
    data = Data(x=torch.from_numpy(x), y=torch.from_numpy(y),
                edge_index=torch.from_numpy(ei.astype(np.int64)), num_nodes=n)
    pyg_ok = "pyg" not in SKIP and pyg_loader_runs()
    if "pyg" not in SKIP and not pyg_ok:
        log("PyG's NeighborLoader: skipped (needs pyg-lib or torch-sparse; neither imports)")
    rec = {"data": ds.name, "vertices": n, "edges": int(ei.shape[1]), "fanouts": FANOUTS,
           "device": args.device, "max_batches": args.max_batches,
           "batch_size": args.batch_size, "threads": args.threads, "epochs": args.epochs,
           "torch": torch.__version__, "tandem": tandem.__version__}

    rate, nb = timed_pass(tandem_batches(tandem_loader(ds, seeds)), args.loader_batches)
    rec["tandem_batches_per_s"] = rate
    log(f"loader only: tandem.NeighborLoader {rate:.2f} batches/s ({nb} batches)")
    if pyg_ok:
        rate, nb = timed_pass(pyg_batches(data, seeds), args.loader_batches)
        rec["pyg_batches_per_s"] = rate
        log(f"loader only: PyG NeighborLoader {rate:.2f} batches/s ({nb} batches); "
            f"ratio tandem/pyg {rec['tandem_batches_per_s'] / rate:.2f}")
    if "dgl" not in SKIP:
        rate, nb = timed_pass(dgl_batches(ei, x, y, seeds, n), args.loader_batches)
        rec["dgl_batches_per_s"] = rate
        log(f"loader only: DGL NeighborSampler DataLoader {rate:.2f} batches/s ({nb} batches); "
            f"ratio tandem/dgl {rec['tandem_batches_per_s'] / rate:.2f}")

    if "train" not in SKIP:
        # One loader for the whole run: each pass over it is the next epoch
        # (a fresh shuffle and fresh samples), as PyG's loader draws anew.
        loader = tandem_loader(ds, train_ids)
        r = train("tandem", lambda: tandem_batches(loader), ds, dim, classes, test_ids)
        rec.update({f"tandem_{k}": v for k, v in r.items()})
        log(f"train with tandem.NeighborLoader: {r['epoch_s']:.3f} s/epoch, "
            f"test accuracy {r['test_acc']:.4f}")
        if args.device != "cpu":
            # The same model fed by Tandem's host loader, batches moved to the
            # device: the reference where PyG's loader cannot run (no pyg-lib or
            # torch-sparse), and itself faster than PyG's on the CPU
            # (docs/performance.md).
            host = tandem_loader(ds, train_ids, device="host")
            r = train("tandem-host", lambda: (b.to_pyg().to(DEVICE) for b in host), ds, dim,
                      classes, test_ids)
            rec.update({f"tandem_host_{k}": v for k, v in r.items()})
            log(f"train with tandem.NeighborLoader(device=\"host\"), batches moved: "
                f"{r['epoch_s']:.3f} s/epoch, test accuracy {r['test_acc']:.4f}; epoch ratio "
                f"host/device {r['epoch_s'] / rec['tandem_epoch_s']:.2f}")
        if pyg_ok:
            r = train("pyg", lambda: pyg_batches(data, train_ids), ds, dim, classes, test_ids)
            rec.update({f"pyg_{k}": v for k, v in r.items()})
            log(f"train with PyG NeighborLoader: {r['epoch_s']:.3f} s/epoch, "
                f"test accuracy {r['test_acc']:.4f}; epoch ratio pyg/tandem "
                f"{r['epoch_s'] / rec['tandem_epoch_s']:.2f}")
    line = json.dumps(rec, sort_keys=True)
    print(line)
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            f.write(line + "\n")
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
