"""Link prediction from Python: edge splits from arrays or fractions, the
metrics of each epoch, evaluate_link and score_edges, and the errors of bad
edge arrays."""

import numpy as np
import pytest

import tandem


def sbm_arrays(n=600, blocks=20, degree=10, d=20, seed=0):
    """An undirected SBM: edges mostly inside a block, features that name the
    block weakly, so a GNN learns which pairs are linked."""
    rng = np.random.default_rng(seed)
    block = np.arange(n) % blocks
    src, dst = [], []
    for v in range(n):
        for _ in range(degree // 2):
            same = rng.random() < 0.9
            pool = np.flatnonzero(block == block[v]) if same else np.arange(n)
            u = int(rng.choice(pool))
            if u != v:
                src.append(v)
                dst.append(u)
    pairs = {(min(a, b), max(a, b)) for a, b in zip(src, dst)}
    pairs = np.array(sorted(pairs), dtype=np.int64)
    x = rng.standard_normal((n, d)).astype(np.float32)
    x[np.arange(n), block % d] += 1.0
    labels = block.astype(np.int64)
    return pairs, x, labels


def config(epochs=3):
    return {
        "model": {"task": "link", "hidden": 16, "layers": 2},
        "train": {"epochs": epochs, "batch_size": 64, "fanouts": [5, 5], "lr": 0.01},
        "link": {"eval_negatives": 20},
        "threads": {"compute": 1},
        "device": {"kind": "host"},
    }


def split_by_hand(pairs, seed=1):
    rng = np.random.default_rng(seed)
    p = pairs[rng.permutation(len(pairs))]
    nv, nt = len(p) // 20, len(p) // 10
    val, test, train = p[:nv], p[nv : nv + nt], p[nv + nt :]
    return train.T.copy(), val.T.copy(), test.T.copy()


def test_fractions_hold_out_edges_and_training_learns():
    pairs, x, y = sbm_arrays()
    ds = tandem.Dataset.from_arrays(
        features=x, labels=y, edge_index=pairs.T.copy(), symmetrize=True, edge_split=(0.85, 0.05, 0.1)
    )
    es = ds.edge_split
    assert set(es) == {"train", "val", "test"}
    total = sum(es[k].shape[1] for k in es)
    assert total == len(pairs)
    # Held-out edges are not in the graph (both directions: symmetric).
    assert ds.num_edges == 2 * es["train"].shape[1]
    t = tandem.Trainer(ds, config(epochs=15))
    untrained = t.evaluate_link()[1]["mrr"]
    records = t.fit()
    last = records[-1]
    assert list(last.val_metrics) == ["mrr", "hits@10", "auc"]
    assert last.val_acc is None and last.test_acc is None
    # Chance MRR against 20 negatives is about 0.17 (H(21) / 21); training
    # lifts it well above that and above the untrained model's.
    assert last.test_metrics["mrr"] > max(0.3, untrained + 0.1), (untrained, last)
    assert "mrr" in repr(last)


def test_given_split_negatives_and_scores():
    pairs, x, y = sbm_arrays(seed=3)
    train, val, test = split_by_hand(pairs)
    rng = np.random.default_rng(0)
    negs = {
        "val": rng.integers(0, len(x), (val.shape[1], 7)),
        "test": rng.integers(0, len(x), (test.shape[1], 7)),
    }
    ds = tandem.Dataset.from_arrays(
        features=x,
        labels=y,
        symmetrize=True,
        edge_split={"train": train, "val": (val[0], val[1]), "test": test},
        edge_negatives=negs,
    )
    es = ds.edge_split
    np.testing.assert_array_equal(es["val"], val)
    np.testing.assert_array_equal(es["test_neg"], negs["test"])
    assert ds.num_edges == 2 * train.shape[1]
    t = tandem.Trainer(ds, config(epochs=2))
    t.fit()
    v, te = t.evaluate_link()
    assert set(v) == {"mrr", "hits@10", "auc"} and 0.0 <= te["auc"] <= 1.0
    scores = t.score_edges(test[0], test[1])
    assert scores.shape == (test.shape[1],) and scores.dtype == np.float32
    assert np.isfinite(scores).all()
    # A pair's score does not depend on the other pairs asked with it.
    np.testing.assert_allclose(t.score_edges(test[0][:3], test[1][:3]), scores[:3], rtol=1e-5)
    with pytest.raises(tandem.TandemError, match="dst"):
        t.score_edges([0, 1], [2])
    # A link model has no accuracy.
    with pytest.raises(tandem.TandemError):
        t.evaluate()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(edge_split={"train": None}), "edge_split"),
        (dict(edge_split={"train": [[0], [1]], "val": [[0], [2]], "tst": [[1], [2]]}), "tst"),
        (dict(edge_split={"train": [[0], [1]], "val": [[0], [2]], "test": [[1.5], [2]]}), "integer"),
        (dict(edge_split={"train": [[0], [1]], "val": [[0], [2]], "test": [[1, 2, 3]]}), r"\(2, P\)"),
        (dict(edge_split=(0.5, 0.5)), "fractions"),
        (dict(edge_negatives={"val": [[1]], "test": [[1]]}), "edge_negatives"),
        (dict(edge_split={"train": [[0], [1]], "val": [[0], [2]], "test": [[1], [-2]]}), "test"),
    ],
)
def test_bad_edge_arrays_raise_dataset_errors_naming_the_field(kwargs, match):
    _, x, y = sbm_arrays(n=20)
    ei = np.array([[0, 1], [1, 2]])
    with pytest.raises(tandem.DatasetError, match=match):
        tandem.Dataset.from_arrays(features=x, labels=y, edge_index=ei, **kwargs)


def test_a_node_dataset_has_no_edge_split():
    _, x, y = sbm_arrays(n=20)
    ds = tandem.Dataset.from_arrays(features=x, labels=y, edge_index=np.array([[0, 1], [1, 2]]))
    assert ds.edge_split is None
