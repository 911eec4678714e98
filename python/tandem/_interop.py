"""Duck-typed adapters: PyTorch Geometric ``Data`` objects and DGL graphs to the
arguments of ``Dataset.from_arrays``. Neither torch, PyG nor DGL is imported:
tensors are recognized by their methods (``__dlpack__``, ``numpy``).
"""

import numpy as np


def to_numpy(t, name):
    """An array viewing ``t``'s memory where possible.

    NumPy arrays pass through; a tensor on the CPU crosses through DLPack
    (``numpy.from_dlpack``) or ``.numpy()`` without a copy; a tensor elsewhere
    (a GPU) is copied to the host with ``.cpu()`` first. Anything else goes
    through ``numpy.asarray``.
    """
    if t is None or isinstance(t, np.ndarray):
        return t
    if hasattr(t, "detach"):  # a torch tensor: no autograd graph
        t = t.detach()
    device = getattr(t, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu" and hasattr(t, "cpu"):
        t = t.cpu()
    if hasattr(t, "__dlpack__") and hasattr(np, "from_dlpack"):
        try:
            return np.from_dlpack(t)
        except (TypeError, RuntimeError, BufferError, ValueError):
            pass
    if hasattr(t, "numpy"):
        return t.numpy()
    return np.asarray(t)


def _get(obj, *names):
    for n in names:
        v = getattr(obj, n, None)
        if v is not None:
            return v
    return None


def pyg_arrays(data, split_idx=None):
    """``from_arrays`` keyword arguments for a PyG ``Data`` object."""
    x = _get(data, "x")
    y = _get(data, "y")
    ei = _get(data, "edge_index")
    missing = [n for n, v in (("x", x), ("y", y), ("edge_index", ei)) if v is None]
    if missing:
        raise AttributeError(
            f"the Data object has no {', '.join(missing)}; from_pyg needs x, y and edge_index"
        )
    kw = {
        "features": to_numpy(x, "x"),
        "labels": to_numpy(y, "y"),
        "edge_index": to_numpy(ei, "edge_index"),
        "name": "pyg",
    }
    n = _get(data, "num_nodes")
    if n is not None:
        kw["num_vertices"] = int(n)
    if split_idx is not None:
        kw["train"] = to_numpy(split_idx["train"], "split_idx['train']")
        val = split_idx.get("valid", split_idx.get("val"))
        kw["val"] = to_numpy(val, "split_idx['valid']")
        kw["test"] = to_numpy(split_idx["test"], "split_idx['test']")
    else:
        for key, attr in (("train", "train_mask"), ("val", "val_mask"), ("test", "test_mask")):
            m = _get(data, attr)
            if m is not None:
                kw[key] = to_numpy(m, attr)
    return kw


def dgl_arrays(graph, features, labels, train, val, test):
    """``from_arrays`` keyword arguments for a DGL graph."""
    src, dst = graph.edges()
    nd = graph.ndata
    kw = {
        "num_vertices": int(graph.num_nodes()),
        "edge_index": (to_numpy(src, "src"), to_numpy(dst, "dst")),
        "features": to_numpy(nd[features], features),
        "labels": to_numpy(nd[labels], labels),
        "name": "dgl",
    }
    for key, name in (("train", train), ("val", val), ("test", test)):
        if name in nd:
            kw[key] = to_numpy(nd[name], name)
    return kw
