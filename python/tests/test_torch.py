"""PyTorch tensors and a PyG Data object (where torch imports; skipped
otherwise, with the reason)."""

import numpy as np
import pytest

import tandem
from conftest import small_arrays

torch = pytest.importorskip("torch", reason="torch is not installed (apt-get install python3-torch)")


def test_cpu_tensors_cross_without_a_copy():
    ei, x, y = small_arrays()
    tx = torch.from_numpy(x.copy())
    data = type("Data", (), {})()
    data.x, data.y, data.edge_index = tx, torch.from_numpy(y), torch.from_numpy(ei)
    data.num_nodes = 50
    ds = tandem.Dataset.from_pyg(data)
    assert ds.features.ctypes.data == tx.data_ptr()
    t = tandem.Trainer(ds, {"train": {"epochs": 1}, "threads": {"compute": 1}})
    assert len(t.fit()) == 1


def test_a_pyg_data_object_where_pyg_imports():
    tg = pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    ei, x, y = small_arrays()
    data = tg.data.Data(x=torch.from_numpy(x), y=torch.from_numpy(y), edge_index=torch.from_numpy(ei))
    ds = tandem.Dataset.from_pyg(data)
    assert ds.num_vertices == 50 and ds.num_edges == 100
