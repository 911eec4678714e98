"""A ``LoaderBatch`` as PyG's and DGL's loaders lay a mini-batch out.

``to_pyg`` builds the ``torch_geometric.data.Data`` PyG's ``NeighborLoader``
yields (with ``pyg-lib``: per-hop counts included, so ``trim_to_layer``
works); ``to_dgl_blocks`` the list of blocks DGL's ``NeighborSampler`` yields; the
``device_*`` functions do the same for a ``DeviceBatch``, with torch on its device.
The tensors share the batch's numpy buffers (``torch.from_numpy``), except
where torch needs another dtype. torch, PyG and DGL are imported here only
when these are called.
"""

import numpy as np


def features_tensor(batch):
    """``batch.x`` as a torch tensor: float32, or bfloat16 for bf16 rows
    (the uint16 bit patterns viewed as int16, which torch reads, then as
    ``torch.bfloat16``: no copy)."""
    import torch

    if batch.feature_dtype == "bf16":
        return torch.from_numpy(batch.x.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(batch.x)


def to_pyg(batch):
    """A ``torch_geometric.data.Data`` with ``x``, ``edge_index`` (row 0 the
    source, row 1 the destination, local ids into ``n_id``; the seeds' hop
    first), ``y`` (the seeds' labels), ``batch_size``, ``n_id``,
    ``num_sampled_nodes`` and ``num_sampled_edges``."""
    import torch
    from torch_geometric.data import Data

    return Data(
        x=features_tensor(batch),
        edge_index=torch.from_numpy(batch.edge_index),
        y=torch.from_numpy(batch.y),
        n_id=torch.from_numpy(batch.n_id),
        batch_size=batch.batch_size,
        num_sampled_nodes=list(batch.num_sampled_nodes),
        num_sampled_edges=list(batch.num_sampled_edges),
    )


def dgl_block_parts(edge_index, num_sampled_nodes, num_sampled_edges):
    """``[(src, dst, num_src, num_dst), ...]``, input layer first: layer ``l``
    of ``L`` reads the edges of the first ``L - l`` hops, from the vertices
    reached in ``L - l`` hops to those reached in ``L - l - 1`` (what PyG's
    ``trim_to_layer`` leaves for that layer). ``edge_index`` is a numpy array
    or a torch tensor; the parts are slices of it."""
    nodes = np.cumsum(num_sampled_nodes)
    edges = np.cumsum([0] + list(num_sampled_edges))
    hops = len(num_sampled_edges)
    parts = []
    for layer in range(hops):
        reach = hops - layer
        e = int(edges[reach])
        parts.append((edge_index[0, :e], edge_index[1, :e], int(nodes[reach]), int(nodes[reach - 1])))
    return parts


def blocks_from_parts(parts, n_id, x, y):
    """DGL blocks from ``dgl_block_parts`` (torch tensors), with the global
    ids, the features on the first block and the labels on the last."""
    import dgl

    blocks = []
    for src, dst, num_src, num_dst in parts:
        b = dgl.create_block((src, dst), num_src_nodes=num_src, num_dst_nodes=num_dst)
        b.srcdata[dgl.NID] = n_id[:num_src]
        b.dstdata[dgl.NID] = n_id[:num_dst]
        blocks.append(b)
    blocks[0].srcdata["feat"] = x
    blocks[-1].dstdata["label"] = y
    return blocks


def to_dgl_blocks(batch):
    """DGL blocks, input layer first, as ``dgl.dataloading.NeighborSampler``
    yields them: ``srcdata[dgl.NID]`` / ``dstdata[dgl.NID]`` hold the global
    ids, the first block's ``srcdata["feat"]`` the features and the last
    block's ``dstdata["label"]`` the seeds' labels."""
    import torch

    parts = [
        (torch.from_numpy(np.ascontiguousarray(src)), torch.from_numpy(np.ascontiguousarray(dst)), ns, nd)
        for src, dst, ns, nd in dgl_block_parts(batch.edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
    ]
    return blocks_from_parts(parts, torch.from_numpy(batch.n_id), features_tensor(batch), torch.from_numpy(batch.y))


def device_tensors(batch):
    """A ``DeviceBatch``'s ``(x, edge_index, n_id, y)`` as torch tensors on the
    arrays' device (``torch.from_dlpack``: no copy of ``x``; the ids widened
    to int64 there). Each hop's CSR becomes its COO edges: the sources as
    sampled, each destination repeated once per edge."""
    import torch

    x = torch.from_dlpack(batch.x)
    srcs, dsts = [], []
    for hop in batch.hops:
        indptr = torch.from_dlpack(hop.indptr)
        first = hop.first_sampled
        counts = indptr[first + 1 :] - indptr[first:-1]
        rows = torch.arange(first, hop.num_dst, device=x.device)
        dsts.append(torch.repeat_interleave(rows, counts, output_size=hop.num_edges))
        srcs.append(torch.from_dlpack(hop.indices).long())
    empty = torch.zeros(0, dtype=torch.long, device=x.device)
    edge_index = torch.stack([torch.cat(srcs) if srcs else empty, torch.cat(dsts) if dsts else empty])
    n_id = torch.from_dlpack(batch.n_id).long()
    return x, edge_index, n_id, torch.from_numpy(batch.y).to(x.device)


def device_to_dgl_blocks(batch):
    """``to_dgl_blocks`` of a ``DeviceBatch``: the same blocks, on the arrays'
    device."""
    x, edge_index, n_id, y = device_tensors(batch)
    parts = dgl_block_parts(edge_index, batch.num_sampled_nodes, batch.num_sampled_edges)
    return blocks_from_parts(parts, n_id, x, y)


def device_to_pyg(batch):
    """``to_pyg`` of a ``DeviceBatch``: the same ``Data``, on the arrays'
    device (``device_tensors``)."""
    from torch_geometric.data import Data

    x, edge_index, n_id, y = device_tensors(batch)
    return Data(
        x=x,
        edge_index=edge_index,
        y=y,
        n_id=n_id,
        batch_size=batch.batch_size,
        num_sampled_nodes=list(batch.num_sampled_nodes),
        num_sampled_edges=list(batch.num_sampled_edges),
    )
