"""tandem.NeighborLoader: batches against a scalar reference read from the
dataset's arrays, determinism, early exit, bad arguments, and (where torch,
PyG or DGL import; skipped with the reason otherwise) PyG's and DGL's
layouts and an unchanged PyG GraphSAGE loop."""

import numpy as np
import pytest

import tandem

N, D, CLASSES = 300, 6, 4


def graph(seed=3):
    """A random symmetric graph with class-dependent features."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, N)
    src = rng.integers(0, N, 2400)
    dst = rng.integers(0, N, 2400)
    centers = rng.standard_normal((CLASSES, D))
    x = (centers[labels] + 0.5 * rng.standard_normal((N, D))).astype(np.float32)
    ds = tandem.Dataset.from_arrays(
        features=x, labels=labels, edge_index=np.stack([src, dst]), symmetrize=True, seed=1
    )
    return ds, x, labels, src, dst


@pytest.fixture(scope="module")
def data():
    return graph()


def in_neighbors(src, dst):
    """Row v: the in-neighbors of v after symmetrizing (no self-loops)."""
    nb = [set() for _ in range(N)]
    for s, t in zip(src, dst):
        if s != t:
            nb[t].add(int(s))
            nb[s].add(int(t))
    return nb


def check_batch(b, fanouts, x, labels, nb):
    n_id = b.n_id
    assert n_id.dtype == np.int64 and len(set(n_id.tolist())) == len(n_id)
    seeds = n_id[: b.batch_size]
    np.testing.assert_array_equal(b.y, labels[seeds])
    np.testing.assert_array_equal(b.x, x[n_id])
    assert b.x.dtype == np.float32 and b.x.shape == (len(n_id), D)
    assert sum(b.num_sampled_nodes) == len(n_id) and b.num_sampled_nodes[0] == b.batch_size
    ei = b.edge_index
    assert ei.dtype == np.int64 and ei.shape == (2, sum(b.num_sampled_edges))
    # Hop by hop: destinations are the vertices new at the hop before, each
    # drawing min(fanout, degree) distinct neighbors that exist in the graph.
    start, nodes = 0, np.cumsum(b.num_sampled_nodes)
    e0 = 0
    for h, fanout in enumerate(reversed(fanouts)):
        e1 = e0 + b.num_sampled_edges[h]
        s, t = ei[0, e0:e1], ei[1, e0:e1]
        lo = nodes[h - 1] if h else 0
        assert np.all((t >= lo) & (t < nodes[h])), "destinations of a hop"
        assert np.all(s < nodes[h + 1]), "sources of a hop"
        assert np.all(np.diff(t) >= 0), "grouped by destination"
        for d in range(lo, nodes[h]):
            got = s[t == d]
            v = int(n_id[d])
            assert len(got) == min(fanout, len(nb[v])), (h, v)
            assert len(set(got.tolist())) == len(got)
            for u in n_id[got]:
                assert int(u) in nb[v], f"sampled edge {u} -> {v} is not in the graph"
        hop = b.hops[h]
        assert (hop.num_dst, hop.num_src, hop.first_sampled) == (nodes[h], nodes[h + 1], lo)
        assert hop.indptr[-1] == e1 - e0 and hop.indices.dtype == np.uint32
        np.testing.assert_array_equal(hop.indices, s)
        e0 = e1
        start = nodes[h]
    assert start == nodes[-2]


def test_batches_match_a_scalar_reference(data):
    ds, x, labels, src, dst = data
    nb = in_neighbors(src, dst)
    loader = tandem.NeighborLoader(ds, [4, 3, 2], 40, device="host", threads=2)
    batches = list(loader)
    assert len(batches) == len(loader) == -(-len(ds.train_ids) // 40)
    seeds = np.concatenate([b.n_id[: b.batch_size] for b in batches])
    np.testing.assert_array_equal(np.sort(seeds), ds.train_ids)
    for b in batches:
        check_batch(b, [4, 3, 2], x, labels, nb)


def test_seeds_as_ids_or_mask_and_num_neighbors(data):
    ds, x, labels, src, dst = data
    nb = in_neighbors(src, dst)
    ids = np.arange(10, 60)
    a = tandem.NeighborLoader(ds, num_neighbors=[2, 3], batch_size=50, seeds=ids, shuffle=False)
    assert a.fanouts == [3, 2]
    (b,) = list(a)
    np.testing.assert_array_equal(b.n_id[:50], ids)
    check_batch(b, [3, 2], x, labels, nb)
    mask = np.zeros(N, dtype=bool)
    mask[ids] = True
    (c,) = list(tandem.NeighborLoader(ds, [3, 2], 50, seeds=mask, shuffle=False))
    np.testing.assert_array_equal(c.n_id, b.n_id)
    # -1 takes every neighbor.
    (f,) = list(tandem.NeighborLoader(ds, [-1], 50, seeds=ids, shuffle=False))
    assert f.num_sampled_edges == [sum(len(nb[v]) for v in ids)]


def test_bf16_rows_are_rounded_f32_rows(data):
    ds, x, *_ = data
    b = next(iter(tandem.NeighborLoader(ds, [3], 64, feature_dtype="bf16")))
    assert b.feature_dtype == "bf16" and b.x.dtype == np.uint16
    bits = x[b.n_id].view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(b.x, rounded)


def arrays(b):
    return [b.n_id, b.x, b.y, b.edge_index]


def test_same_seed_same_batches_whatever_the_prefetch(data):
    ds = data[0]

    def epochs(prefetch, seed, threads):
        loader = tandem.NeighborLoader(ds, [3, 3], 32, prefetch=prefetch, seed=seed, threads=threads)
        return [[arrays(b) for b in loader] for _ in range(2)]

    a, b, c = epochs(1, 5, 1), epochs(4, 5, 2), epochs(2, 6, 2)
    for e in range(2):
        for p, q in zip(a[e], b[e]):
            for u, v in zip(p, q):
                np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[0][0][0], a[1][0][0]), "epochs are shuffled differently"
    assert not np.array_equal(a[0][0][0], c[0][0][0]), "seeds differ"
    # epoch(k) replays epoch k without moving the counter.
    loader = tandem.NeighborLoader(ds, [3, 3], 32, seed=5)
    np.testing.assert_array_equal(next(iter(loader.epoch(1))).n_id, a[1][0][0])


def test_rows_freed_by_numpy_are_reused_and_kept_rows_are_not(data):
    ds, x, labels, src, dst = data
    nb = in_neighbors(src, dst)
    # A loop that drops each batch: later batches reuse the freed rows, and
    # are still right (every value overwritten).
    loader = tandem.NeighborLoader(ds, [3, 2], 16, prefetch=1, seed=2)
    n = 0
    for b in loader:
        check_batch(b, [3, 2], x, labels, nb)
        b.x[:] = np.nan  # the consumer may write to its rows
        n += 1
    assert loader.rows_reused >= n - 3, (loader.rows_reused, n)
    # Batches kept alive (and a view of x) keep their rows: nothing is reused.
    loader = tandem.NeighborLoader(ds, [3, 2], 16, prefetch=1, seed=2)
    kept = [(b, b.x[:4]) for b in loader]
    assert loader.rows_reused == 0
    for b, head in kept:
        check_batch(b, [3, 2], x, labels, nb)
        np.testing.assert_array_equal(head, x[b.n_id[:4]])


def test_breaking_out_stops_the_workers(data):
    ds = data[0]
    loader = tandem.NeighborLoader(ds, [3], 1, prefetch=2)
    assert len(loader) > 100
    for _ in loader:
        assert loader.workers_running == 1
        break
    assert loader.workers_running == 0
    built = loader.batches_built
    assert 1 <= built <= 3, built
    it = iter(loader)
    next(it)
    it.close()
    assert loader.workers_running == 0 and loader.batches_built <= built + 3
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize(
    "kwargs, name, text",
    [
        (dict(fanouts=[]), "fanouts", "at least one hop"),
        (dict(fanouts=[3, 0]), "fanouts", "fanouts[1] is 0"),
        (dict(fanouts=[3, -2]), "fanouts", "fanouts[1] = -2"),
        (dict(fanouts="3"), "fanouts", "list of ints"),
        (dict(fanouts=None), "fanouts", "required"),
        (dict(num_neighbors=[3]), "fanouts", "not both"),
        (dict(batch_size=None), "batch_size", "required"),
        (dict(batch_size=0), "batch_size", "at least 1"),
        (dict(seeds=[1, N]), "seeds", f"seeds[1] = {N} is not a vertex"),
        (dict(seeds=[4, 4]), "seeds", "repeats"),
        (dict(seeds=np.zeros(3, dtype=bool)), "seeds", "a mask of 3 entries"),
        (dict(device="tpu"), "device", "expected \"auto\""),
        (dict(feature_cache_bytes="lots"), "feature_cache_bytes", "byte count"),
        (dict(feature_dtype="f16"), "feature_dtype", "\"bf16\""),
        (dict(prefetch=0), "prefetch", "at least 1"),
    ],
)
def test_bad_arguments_name_the_argument(data, kwargs, name, text):
    args = dict(fanouts=[3], batch_size=8)
    args.update(kwargs)
    with pytest.raises(tandem.ArgumentError) as e:
        tandem.NeighborLoader(data[0], **args)
    assert e.value.name == name
    assert text in str(e.value) and f"`{name}`" in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, tandem.TandemError)


def test_a_cuda_device_that_is_not_there(data):
    # No GPU here (or no CUDA in the build): a DeviceError naming the device.
    # On a GPU machine the device loader is built and says where it runs.
    try:
        loader = tandem.NeighborLoader(data[0], [3], 8, device="cuda:0", feature_cache_bytes=1)
    except tandem.DeviceError as e:
        assert "cuda:0" in str(e) and "\n" not in str(e)
    else:
        assert "cuda:0" in loader.note and "feature cache" in loader.note
    note = tandem.NeighborLoader(data[0], [3], 8).note
    assert "host" in note


# ---- PyG and DGL ------------------------------------------------------------


def pyg():
    torch = pytest.importorskip("torch", reason="torch is not installed (python3-torch)")
    tg = pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    return torch, tg


def test_to_pyg_has_the_neighbor_loader_layout(data):
    torch, tg = pyg()
    from torch_geometric.utils import trim_to_layer

    ds = data[0]
    b = next(iter(tandem.NeighborLoader(ds, [4, 3, 2], 32)))
    d = b.to_pyg()
    assert isinstance(d, tg.data.Data)
    assert d.x.dtype == torch.float32 and d.edge_index.dtype == torch.long
    assert d.y.dtype == torch.long and d.n_id.dtype == torch.long
    assert d.batch_size == 32 and d.num_nodes == len(b.n_id)
    assert d.num_sampled_nodes == b.num_sampled_nodes
    assert d.num_sampled_edges == b.num_sampled_edges
    assert np.shares_memory(d.x.numpy(), b.x), "x crosses without a copy"
    # Row 0 the source, row 1 the destination (check_batch checks these rows).
    assert torch.equal(d.edge_index, torch.from_numpy(b.edge_index))
    assert torch.equal(d.n_id, torch.from_numpy(b.n_id)) and torch.equal(d.y, torch.from_numpy(b.y))
    # Trimming for layer 1 drops the last hop's vertices and edges.
    x, ei, _ = trim_to_layer(1, d.num_sampled_nodes, d.num_sampled_edges, d.x, d.edge_index)
    assert x.shape[0] == sum(b.num_sampled_nodes[:-1])
    assert ei.shape[1] == sum(b.num_sampled_edges[:-1])
    assert int(ei.max()) < x.shape[0]
    b16 = next(iter(tandem.NeighborLoader(ds, [3], 32, feature_dtype="bf16"))).to_pyg()
    assert b16.x.dtype == torch.bfloat16


def pyg_neighbor_loader_runs(tg):
    try:
        import torch_geometric.typing as t
    except ImportError:
        return False
    return bool(getattr(t, "WITH_PYG_LIB", False) or getattr(t, "WITH_TORCH_SPARSE", False))


def test_to_pyg_equals_pygs_neighbor_loader_at_full_fanout(data):
    """With every neighbor taken nothing is random: the same seeds give PyG's
    batch exactly (vertex order, edge order, counts where PyG reports them;
    with torch-sparse's sampler instead of pyg-lib's, the same vertices and
    edges in its own order)."""
    torch, tg = pyg()
    if not pyg_neighbor_loader_runs(tg):
        pytest.skip("PyG's NeighborLoader needs pyg-lib or torch-sparse (neither imports)")
    ds, x, labels, src, dst = data
    nb = in_neighbors(src, dst)
    s = [v for v in range(N) for _ in nb[v]]
    t = [u for v in range(N) for u in sorted(nb[v])]
    g = tg.data.Data(
        x=torch.from_numpy(x),
        y=torch.from_numpy(labels),
        edge_index=torch.tensor([t, s]),
        num_nodes=N,
    )
    seeds = torch.arange(20, 52)
    theirs = next(iter(tg.loader.NeighborLoader(g, [-1, -1], input_nodes=seeds, batch_size=32)))
    ours = next(
        iter(tandem.NeighborLoader(ds, [-1, -1], 32, seeds=seeds.numpy(), shuffle=False))
    ).to_pyg()
    import torch_geometric.typing as t

    if not getattr(t, "WITH_PYG_LIB", False):
        # torch-sparse's sampler numbers the new vertices of a hop in its own
        # order: the same vertices and the same edges between them.
        assert torch.equal(ours.n_id[:32], theirs.n_id[:32])
        assert sorted(ours.n_id.tolist()) == sorted(theirs.n_id.tolist())
        as_global = lambda d: sorted(zip(d.n_id[d.edge_index[0]].tolist(), d.n_id[d.edge_index[1]].tolist()))
        assert as_global(ours) == as_global(theirs)
        assert torch.equal(ours.x, torch.from_numpy(x)[ours.n_id])
        assert torch.equal(ours.y, theirs.y[:32])
        return
    assert torch.equal(ours.n_id, theirs.n_id)
    assert torch.equal(ours.edge_index, theirs.edge_index)
    assert torch.equal(ours.x, theirs.x)
    assert torch.equal(ours.y, theirs.y[:32])
    if getattr(theirs, "num_sampled_nodes", None) is not None:
        assert list(theirs.num_sampled_nodes) == ours.num_sampled_nodes
        assert list(theirs.num_sampled_edges) == ours.num_sampled_edges


def test_an_unchanged_pyg_graphsage_loop_trains(data):
    torch, tg = pyg()
    from torch_geometric.nn import GraphSAGE

    torch.manual_seed(0)
    ds = data[0]
    model = GraphSAGE(D, 32, num_layers=2, out_channels=CLASSES)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    loader = tandem.NeighborLoader(ds, [5, 5], 32, seed=1)
    losses = []
    for epoch in range(4):
        for batch in loader:
            batch = batch.to_pyg()
            opt.zero_grad()
            out = model(
                batch.x,
                batch.edge_index,
                num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                num_sampled_edges_per_hop=batch.num_sampled_edges,
            )[: batch.batch_size]
            # Trimming changes the work, not the seeds' outputs.
            full = model(batch.x, batch.edge_index)[: batch.batch_size]
            assert torch.allclose(out, full, atol=1e-5)
            loss = torch.nn.functional.cross_entropy(out, batch.y[: batch.batch_size])
            loss.backward()
            opt.step()
            losses.append(float(loss))
    assert np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < np.mean(losses[:5]), losses


def test_to_dgl_blocks_where_dgl_imports(data):
    torch = pytest.importorskip("torch", reason="torch is not installed (python3-torch)")
    torch.__version__ = "1.13.1"  # Debian's version string carries +dfsg, which DGL rejects
    try:
        import dgl
    except Exception as e:  # noqa: BLE001 (DGL fails in many ways when its backend is off)
        pytest.skip(f"dgl does not import: {e}")
    from dgl.nn import SAGEConv

    b = next(iter(tandem.NeighborLoader(data[0], [4, 3, 2], 16)))
    blocks = b.to_dgl_blocks()
    assert len(blocks) == 3
    nodes = np.cumsum(b.num_sampled_nodes)
    for layer, blk in enumerate(blocks):
        assert blk.num_src_nodes() == nodes[3 - layer]
        assert blk.num_dst_nodes() == nodes[2 - layer]
        assert torch.equal(blk.srcdata[dgl.NID], torch.from_numpy(b.n_id[: nodes[3 - layer]]))
    assert blocks[-1].num_dst_nodes() == b.batch_size
    h = blocks[0].srcdata["feat"]
    for blk in blocks:
        h = SAGEConv(h.shape[1], 8, "mean")(blk, h)
    assert h.shape == (16, 8)
