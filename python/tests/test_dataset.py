"""Datasets from arrays (used in place), PyG-like objects, OGB directories and
stores; every bad input raises DatasetError with the runtime's message."""

import os
import subprocess
import sys
import types

import numpy as np
import pytest

import tandem
from conftest import small_arrays, write_gz, write_ogb_dir


def test_float32_features_are_used_in_place_not_copied():
    ei, x, y = small_arrays()
    ds = tandem.Dataset.from_arrays(features=x, labels=y, edge_index=ei)
    view = ds.features
    # The dataset's feature matrix is the caller's buffer: same address.
    assert view.ctypes.data == x.ctypes.data
    assert np.shares_memory(view, x)
    assert not view.flags.writeable
    assert ds.conversions == ["labels: i64 → u32 (copied)"]
    # The buffer outlives the caller's reference: the dataset holds the array.
    addr = x.ctypes.data
    del x, view
    assert ds.features.ctypes.data == addr
    assert np.isfinite(ds.features).all()


def test_csr_int32_and_int64_arrays_and_int32_labels_are_shared():
    n = 6
    indptr = np.array([0, 1, 2, 3, 4, 5, 6], dtype=np.int64)
    indices = np.array([1, 2, 3, 4, 5, 0], dtype=np.int32)
    x = np.ones((n, 2), dtype=np.float32)
    y = np.array([0, 1, 0, 1, 0, 1], dtype=np.int32)
    train = np.array([True, True, False, False, False, False])
    ds = tandem.Dataset.from_arrays(
        features=x, labels=y, csr=(indptr, indices), train=train, val=[2, 3], test=[4, 5]
    )
    assert ds.conversions == []
    assert (ds.num_vertices, ds.num_edges, ds.num_classes) == (6, 6, 2)
    assert list(ds.train_ids) == [0, 1] and list(ds.val_ids) == [2, 3]
    assert ds.split_sizes == (2, 2, 2)


def test_other_dtypes_are_converted_once_and_the_dataset_says_so():
    ei, x, y = small_arrays()
    ds = tandem.Dataset.from_arrays(features=x.astype(np.float64), labels=y.astype(np.int16),
                                    edge_index=ei.astype(np.int32))
    assert "features: float64 → float32 (copied)" in ds.conversions
    assert any(c.startswith("labels: i16 → u32") for c in ds.conversions)
    np.testing.assert_array_equal(ds.features, x)


def test_edge_index_as_a_pair_and_symmetrize():
    ei, x, y = small_arrays()
    a = tandem.Dataset.from_arrays(features=x, labels=y, edge_index=ei)
    b = tandem.Dataset.from_arrays(features=x, labels=y, edge_index=(ei[0], ei[1]))
    c = tandem.Dataset.from_arrays(features=x, labels=y, edge_index=np.ascontiguousarray(ei[:, :50]), symmetrize=True)
    assert a.num_edges == b.num_edges == c.num_edges == 100


def bad(kwargs, message, field=None, index=None):
    with pytest.raises(tandem.DatasetError) as e:
        tandem.Dataset.from_arrays(**kwargs)
    assert str(e.value) == message
    assert isinstance(e.value, tandem.TandemError)
    if field is not None:
        assert e.value.field == field
    if index is not None:
        assert e.value.index == index
    return e.value


def test_bad_inputs_raise_dataset_errors_with_the_runtime_messages():
    ei, x, y = small_arrays()
    ok = dict(features=x, labels=y, edge_index=ei)
    # Wrong dtype.
    bad({**ok, "features": x.astype(np.complex64)},
        "invalid dataset: features: dtype complex64, expected float32 (or a number type, converted)",
        field="features", index=())
    bad({**ok, "labels": y.astype(np.float32)},
        "invalid dataset: labels: dtype float32, expected an integer dtype", field="labels")
    # Non-contiguous.
    with pytest.raises(tandem.DatasetError, match=r"^invalid dataset: features: not a C-contiguous"):
        tandem.Dataset.from_arrays(**{**ok, "features": np.asfortranarray(x)})
    with pytest.raises(tandem.DatasetError, match=r"^invalid dataset: edge_index: not a C-contiguous"):
        tandem.Dataset.from_arrays(**{**ok, "edge_index": np.asfortranarray(ei)})
    # Mismatched lengths.
    bad({**ok, "labels": y[:-1]},
        "invalid dataset: features: length 50, expected 49 (the number of labels; "
        "DatasetBuilder::num_vertices states the count)")
    bad({**ok, "labels": y[:-1], "num_vertices": 50},
        "invalid dataset: labels: length 49, expected 50 (num_vertices)", field="labels", index=())
    bad({**ok, "train": np.ones(49, dtype=bool)},
        "invalid dataset: train_mask: length 49, expected 50 (the feature rows)")
    # NaN features.
    xn = x.copy()
    xn[2, 1] = np.nan
    bad({**ok, "features": xn}, "invalid dataset: features[2, 1] = NaN is not a finite number",
        field="features", index=(2, 1))
    # Ids out of range, negative ids.
    eo = ei.copy()
    eo[1, 3] = 99
    bad({**ok, "edge_index": eo},
        "invalid dataset: edge_index[1, 3] = 99 is not below the vertex count 50",
        field="edge_index", index=(1, 3))
    eo[1, 3] = -1
    bad({**ok, "edge_index": eo}, "invalid dataset: edge_index[1, 3] = -1 is negative")
    bad({**ok, "train": [0, 60]},
        "invalid dataset: train[1] = 60 is not below the vertex count 50", index=(1,))
    bad({**ok, "train": [0, 1], "val": [1]},
        "invalid dataset: train_mask[1]: also in val_mask; the parts must be disjoint")
    bad({**ok, "labels": np.full(50, 7), "num_classes": 3},
        "invalid dataset: labels[0] = 7 is not below num_classes 3")
    # A CSR whose offsets decrease.
    bad({"features": x[:3], "labels": y[:3], "csr": (np.array([0, 2, 1, 3]), np.array([1, 2, 0]))},
        "invalid dataset: indptr[2]: 1 is less than indptr[1] = 2; offsets must not decrease")
    bad({"features": x, "labels": y}, "invalid dataset: graph: not given: pass edge_index or csr")


def test_store_round_trip_and_generators(tmp_path):
    ds = tandem.Dataset.generate_rmat(vertices=500, edges=2000, classes=4, dim=8, seed=3)
    p = tmp_path / "g.tds"
    ds.save(p)
    back = tandem.Dataset.open(p, verify=True)
    assert (back.num_vertices, back.num_edges, back.num_features) == (500, ds.num_edges, 8)
    np.testing.assert_array_equal(back.features, ds.features)
    np.testing.assert_array_equal(back.labels, ds.labels)
    assert [f.name for f in tmp_path.iterdir()] == ["g.tds"]  # nothing half-written
    sbm = tandem.Dataset.generate_sbm(vertices=400, edges=1600, classes=2, dim=4, split="0.5,0.25,rest")
    assert sbm.split_sizes == (200, 100, 100)
    with pytest.raises(tandem.TandemError) as e:
        tandem.Dataset.open(tmp_path / "missing.tds")
    assert "missing.tds" in str(e.value)


def test_a_failed_save_leaves_nothing_behind(tmp_path):
    ds = tandem.Dataset.generate_sbm(vertices=200, edges=800, classes=2, dim=4)
    target = tmp_path / "no-such-dir" / "g.tds"
    with pytest.raises(tandem.TandemError):
        ds.save(target)
    assert list(tmp_path.iterdir()) == []


def test_from_ogb_dir_reads_the_ogb_layout(tmp_path):
    root, x, y, edges, split = write_ogb_dir(tmp_path / "ogbn_toy")
    ds = tandem.Dataset.from_ogb_dir(root)
    assert ds.name == "ogbn_toy"
    assert ds.num_vertices == 40 and ds.num_classes == 2
    np.testing.assert_allclose(ds.features, x)
    np.testing.assert_array_equal(ds.labels, y)
    np.testing.assert_array_equal(ds.train_ids, split["train"])
    np.testing.assert_array_equal(ds.val_ids, split["valid"])
    undirected = {(a, b) for a, b in edges} | {(b, a) for a, b in edges}
    assert ds.num_edges == len(undirected)
    assert tandem.Dataset.from_ogb_dir(root, directed=True).num_edges == len(set(edges))


def test_a_malformed_ogb_file_names_file_and_line(tmp_path):
    root, *_ = write_ogb_dir(tmp_path / "ogbn_toy")
    write_gz(root / "raw" / "edge.csv.gz", "0,1\n1,2\n2,oops\n")
    with pytest.raises(tandem.TandemError) as e:
        tandem.Dataset.from_ogb_dir(root)
    msg = str(e.value)
    assert msg.endswith("raw/edge.csv.gz:3: target vertex id `oops` is not a non-negative integer"), msg
    assert e.value.path.endswith("edge.csv.gz")


class FakeTensor:
    """Duck-types a CPU torch tensor: `.numpy()`, `.detach()`, `.device`."""

    def __init__(self, a):
        self.a = a
        self.device = types.SimpleNamespace(type="cpu")

    def detach(self):
        return self

    def numpy(self):
        return self.a


def test_from_pyg_is_duck_typed_and_needs_no_torch():
    ei, x, y = small_arrays()
    train = np.zeros(50, dtype=bool)
    train[:20] = True
    data = types.SimpleNamespace(
        x=FakeTensor(x), y=FakeTensor(y.reshape(-1, 1)), edge_index=FakeTensor(ei),
        train_mask=FakeTensor(train), num_nodes=50,
    )
    ds = tandem.Dataset.from_pyg(data)
    assert ds.features.ctypes.data == x.ctypes.data  # through .numpy(): no copy
    assert ds.split_sizes == (20, 0, 0)
    split_idx = {"train": FakeTensor(np.arange(10)), "valid": FakeTensor(np.arange(10, 20)),
                 "test": FakeTensor(np.arange(20, 50))}
    ds = tandem.Dataset.from_pyg(data, split_idx=split_idx)
    assert ds.split_sizes == (10, 10, 30)
    # In a fresh interpreter (another test module may have imported torch here):
    # from_pyg on duck-typed tensors imports no torch.
    code = (
        "import sys, types, numpy as np, tandem\n"
        "class T:\n"
        "    def __init__(s, a): s.a, s.device = a, types.SimpleNamespace(type='cpu')\n"
        "    def detach(s): return s\n"
        "    def numpy(s): return s.a\n"
        "ei = np.array([[0, 1], [1, 2]]); x = np.zeros((20, 2), np.float32)\n"
        "d = types.SimpleNamespace(x=T(x), y=T(np.arange(20) % 2), edge_index=T(ei), num_nodes=20)\n"
        "tandem.Dataset.from_pyg(d)\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_from_dgl_is_duck_typed():
    ei, x, y = small_arrays()

    class Graph:
        ndata = {"feat": x, "label": y}

        def edges(self):
            return FakeTensor(ei[0]), FakeTensor(ei[1])

        def num_nodes(self):
            return 50

    ds = tandem.Dataset.from_dgl(Graph())
    assert (ds.num_vertices, ds.num_edges) == (50, 100)
    assert ds.split_sizes == (30, 10, 10)  # the default 60/20/rest split


RSS_SCRIPT = r"""
import resource, sys
import numpy as np
import tandem
n, d = int(sys.argv[1]), 128
x = np.ones((n, d), dtype=np.float32)           # touched: resident now
y = (np.arange(n) % 16).astype(np.int32)
indptr = np.arange(n + 1, dtype=np.int64)
indices = ((np.arange(n) + 1) % n).astype(np.int32)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
ds = tandem.Dataset.from_arrays(features=x, labels=y, csr=(indptr, indices))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
assert ds.conversions == [], ds.conversions
print(after - before, x.nbytes)
"""


def test_from_arrays_does_not_copy_the_feature_matrix_peak_rss():
    """Peak RSS grows by the graph's own arrays, not by the feature matrix:
    a copy of the features would add x.nbytes (256 MB here) to the peak."""
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, "500000"], capture_output=True,
                         text=True, check=True)
    grew, matrix = map(int, out.stdout.split())
    # Features, CSR and labels are shared; the split's masks take 3 bytes a vertex
    # (0.6% of the 512-byte rows). A copy of any array would show.
    assert grew <= 0.05 * matrix, f"peak RSS grew {grew} bytes for a {matrix}-byte matrix"
