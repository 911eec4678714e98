"""Train on a PyTorch Geometric `Data` object, then hand embeddings back to torch.

    python examples/python/train_pyg_data.py

`tandem.Dataset.from_pyg` is duck-typed: it reads `x`, `y`, `edge_index` and the
masks of any object that has them, and CPU tensors cross without a copy
(DLPack or `.numpy()`). With torch and PyG installed the object is a real
`torch_geometric.data.Data`; without them a stand-in of NumPy arrays shows
the same call.
"""

import types

import numpy as np

import tandem


def make_data(n=3000, d=32, classes=5, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = (rng.standard_normal((n, d)) + 0.8 * np.eye(classes, d)[y]).astype(np.float32)
    src = rng.integers(0, n, 10 * n)
    same = rng.random(10 * n) < 0.8
    # Homophilous edges: most connect vertices of one class.
    pool = {c: np.flatnonzero(y == c) for c in range(classes)}
    dst = np.array([rng.choice(pool[y[s]]) if k else rng.integers(0, n) for s, k in zip(src, same)])
    edge_index = np.concatenate([np.stack([src, dst]), np.stack([dst, src])], axis=1)
    train = np.zeros(n, dtype=bool)
    train[: n // 2] = True
    val = np.zeros(n, dtype=bool)
    val[n // 2 : 3 * n // 4] = True
    test = ~(train | val)
    try:
        import torch
        from torch_geometric.data import Data

        t = torch.from_numpy
        return Data(x=t(x), y=t(y), edge_index=t(edge_index), train_mask=t(train), val_mask=t(val),
                    test_mask=t(test))
    except ImportError:
        return types.SimpleNamespace(x=x, y=y, edge_index=edge_index, train_mask=train,
                                     val_mask=val, test_mask=test, num_nodes=n)


def main():
    data = make_data()
    ds = tandem.Dataset.from_pyg(data)
    print(ds.summary())
    print("arrays copied:", ds.conversions or "none")
    trainer = tandem.Trainer(ds, {"model": {"kind": "gcn", "hidden": 64}, "train": {"epochs": 20}},
                             overrides={"train.lr": 0.01})
    for rec in trainer.fit():
        print(rec)
    emb = trainer.embeddings()  # (n, 64) float32 NumPy array
    print("embeddings", emb.shape, "test accuracy", trainer.evaluate(ds.test_ids))
    try:
        import torch

        print("as a tensor:", torch.from_numpy(emb).shape)  # shares the array's memory
    except ImportError:
        pass


if __name__ == "__main__":
    main()
