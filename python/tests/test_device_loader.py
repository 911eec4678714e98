"""The device loader's batches (``device="host-backend"``: the device path on
the host backend, DLPack's CPU device): the host loader's batches read in
place through DLPack, PyG's layout built with torch, the batch kept alive by
the tensors made from it, and its refusals. On a GPU the same path runs with
``device="cuda"`` (``bench/gpu/verify.sh 13``)."""

import gc

import numpy as np
import pytest

import tandem

from test_loader import graph


@pytest.fixture(scope="module")
def data():
    return graph()


def loaders(ds, **kw):
    args = dict(fanouts=[4, 3], batch_size=40, seed=5)
    args.update(kw)
    return (
        tandem.NeighborLoader(ds, device="host", **args),
        tandem.NeighborLoader(ds, device="host-backend", **args),
    )


@pytest.mark.parametrize("cache", [0, 2000, "auto"])
def test_batches_equal_the_host_loaders_through_dlpack(data, cache):
    host, dev = loaders(data[0], feature_cache_bytes=cache)
    assert "feature cache" in dev.note and len(dev) == len(host)
    n = 0
    for h, d in zip(host.epoch(2), dev.epoch(2)):
        assert isinstance(d, tandem.DeviceBatch) and d.x.__dlpack_device__() == (1, 0)
        assert (d.index, d.batch_size, d.num_nodes) == (h.index, h.batch_size, len(h.n_id))
        assert d.n_id.dtype == "int32" and d.x.shape == [len(h.n_id), h.x.shape[1]]
        np.testing.assert_array_equal(np.from_dlpack(d.n_id), h.n_id)
        np.testing.assert_array_equal(np.from_dlpack(d.x), h.x)
        np.testing.assert_array_equal(d.y, h.y)
        assert (d.num_sampled_nodes, d.num_sampled_edges) == (h.num_sampled_nodes, h.num_sampled_edges)
        for a, b in zip(h.hops, d.hops):
            assert (b.num_dst, b.num_src, b.first_sampled) == (a.num_dst, a.num_src, a.first_sampled)
            assert b.num_edges == len(a.indices)
            np.testing.assert_array_equal(np.from_dlpack(b.indptr), a.indptr)
            np.testing.assert_array_equal(np.from_dlpack(b.indices), a.indices)
        n += 1
    assert n == len(dev)


def test_arrays_are_read_in_place_and_keep_the_batch_alive(data):
    torch = pytest.importorskip("torch", reason="torch is not installed (python3-torch)")
    _, dev = loaders(data[0])
    b = next(iter(dev))
    first, second = torch.from_dlpack(b.x), torch.from_dlpack(b.x)
    assert first.data_ptr() == second.data_ptr(), "a copy was made"
    want = first.clone()
    ids = torch.from_dlpack(b.n_id)
    assert ids.dtype == torch.int32
    del b, second
    gc.collect()
    # The tensors own references to the batch: its buffers are still there.
    assert torch.equal(first, want)
    assert torch.equal(first, torch.from_numpy(data[1])[ids.long()])


def test_to_pyg_equals_the_host_batchs(data):
    torch = pytest.importorskip("torch", reason="torch is not installed (python3-torch)")
    pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    host, dev = loaders(data[0], fanouts=[-1, 2, 3])
    for h, d in zip(host, dev):
        p, q = h.to_pyg(), d.to_pyg()
        for key in ["x", "edge_index", "y", "n_id"]:
            assert torch.equal(p[key], q[key]), key
            assert p[key].dtype == q[key].dtype, key
        assert (p.batch_size, p.num_sampled_nodes, p.num_sampled_edges) == (
            q.batch_size,
            q.num_sampled_nodes,
            q.num_sampled_edges,
        )


def test_to_dgl_blocks_equal_the_host_batchs(data):
    torch = pytest.importorskip("torch", reason="torch is not installed (python3-torch)")
    torch.__version__ = "1.13.1"  # Debian's version string carries +dfsg, which DGL rejects
    try:
        import dgl
    except Exception as e:  # noqa: BLE001 (DGL fails in many ways when its backend is off)
        pytest.skip(f"dgl does not import: {e}")
    host, dev = loaders(data[0], fanouts=[4, 3, 2])
    h, d = next(iter(host)), next(iter(dev))
    for a, b in zip(h.to_dgl_blocks(), d.to_dgl_blocks()):
        assert (a.num_src_nodes(), a.num_dst_nodes()) == (b.num_src_nodes(), b.num_dst_nodes())
        assert [torch.equal(u, v) for u, v in zip(a.edges(), b.edges())] == [True, True]
        assert torch.equal(a.srcdata[dgl.NID], b.srcdata[dgl.NID])
    assert torch.equal(h.to_dgl_blocks()[0].srcdata["feat"], d.to_dgl_blocks()[0].srcdata["feat"])


def test_breaking_out_stops_the_device_workers(data):
    _, dev = loaders(data[0], batch_size=8, prefetch=2)
    it = iter(dev)
    next(it)
    it.close()
    assert dev.workers_running == 0
    assert dev.batches_built <= 1 + 2 + 1


def test_a_cache_larger_than_free_memory_is_refused(data):
    with pytest.raises(tandem.ArgumentError) as e:
        tandem.NeighborLoader(data[0], [3], 8, device="host-backend", feature_cache_bytes=2**62)
    assert e.value.name == "feature_cache_bytes" and "bytes free" in str(e.value)
    with pytest.raises(tandem.ArgumentError) as e:
        tandem.NeighborLoader(data[0], [3], 8, device="tpu")
    assert "host-backend" in str(e.value)
