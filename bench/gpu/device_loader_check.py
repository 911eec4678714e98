"""The Python device loader on a GPU (`bench/gpu/verify.sh 13`): batches of
`tandem.NeighborLoader(device="cuda")` read through DLPack on a torch stream of
their own, checked against the dataset on the host:

- `n_id` distinct with the seeds first, `x` the rows of `n_id`, `y` the seeds'
  labels, every edge of `edge_index` an edge of the graph, no destination with
  more edges than its hop's fanout;
- the stream hand-over: the batch is consumed on a side stream that did not
  exist when the loader's kernels ran (its reads wait for the batch's event),
  and tensors kept from earlier batches are still intact after later batches
  reused the loader's memory (their buffers were not handed out again).

Prints one line `device loader check: ok, N batches, ...` or raises.
Usage: PYTHONPATH=<unpacked wheel> python3 bench/gpu/device_loader_check.py [BATCHES [DEVICE]]
(DEVICE `host-backend`: a dry run of the same checks on the host, no streams).
"""

import contextlib
import sys

import numpy as np
import torch

import tandem

BATCHES = int(sys.argv[1]) if len(sys.argv) > 1 else 40
DEVICE = sys.argv[2] if len(sys.argv) > 2 else "cuda"
CUDA = DEVICE == "cuda"
FANOUTS = [10, 5, 3]

ds = tandem.Dataset.generate_sbm(vertices=50000, edges=600000, classes=8, dim=64, seed=1)
n = ds.num_vertices
x_host = np.asarray(ds.features)
labels = np.asarray(ds.labels).astype(np.int64)

# The graph's edges as keys src * n + dst (row v of the store holds v's
# in-neighbors: PyG's source -> destination).
full = tandem.NeighborLoader(ds, [-1], 65536, seeds=np.arange(n), shuffle=False, device="host")
keys = []
for b in full:
    keys.append(b.n_id[b.edge_index[0]] * n + b.n_id[b.edge_index[1]])
edge_keys = np.unique(np.concatenate(keys))

loader = tandem.NeighborLoader(ds, FANOUTS, 512, device=DEVICE, seed=3,
                               feature_cache_bytes=x_host.nbytes // 4)
print(loader.note, flush=True)
side = torch.cuda.Stream() if CUDA else None
kept = []
checked = 0
for i, b in enumerate(loader):
    if i >= BATCHES:
        break
    with torch.cuda.stream(side) if CUDA else contextlib.nullcontext():
        d = b.to_pyg()
        row_sums = d.x.sum(1)
    if CUDA:
        side.synchronize()
    assert d.x.is_cuda == CUDA and d.edge_index.is_cuda == CUDA and d.n_id.dtype == torch.long
    n_id = d.n_id.cpu().numpy()
    assert len(np.unique(n_id)) == len(n_id), "n_id repeats a vertex"
    np.testing.assert_array_equal(d.x.cpu().numpy(), x_host[n_id])
    np.testing.assert_allclose(row_sums.cpu().numpy(), x_host[n_id].sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(d.y.cpu().numpy(), labels[n_id[: d.batch_size]])
    ei = d.edge_index.cpu().numpy()
    assert np.isin(n_id[ei[0]] * n + n_id[ei[1]], edge_keys).all(), "an edge not in the graph"
    assert sum(d.num_sampled_nodes) == len(n_id)
    assert sum(d.num_sampled_edges) == ei.shape[1]
    start = 0
    for h, fanout in enumerate(reversed(FANOUTS)):
        e = ei[1, start : start + d.num_sampled_edges[h]]
        assert np.bincount(e).max(initial=0) <= fanout, f"hop {h}: more than {fanout} edges"
        start += d.num_sampled_edges[h]
    if i % 8 == 0:
        kept.append((n_id, d.x))  # held across later batches
    checked += 1
if CUDA:
    torch.cuda.synchronize()
for n_id, x in kept:
    np.testing.assert_array_equal(x.cpu().numpy(), x_host[n_id])
print(f"device loader check: ok, {checked} batches, {len(kept)} kept across later batches, "
      f"fanouts {FANOUTS}, torch {torch.__version__}", flush=True)
