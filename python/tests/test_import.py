"""Importing tandem imports neither torch nor dgl, and says which device it uses."""

import subprocess
import sys


def test_import_loads_neither_torch_nor_dgl():
    code = (
        "import sys, tandem\n"
        "bad = [m for m in ('torch', 'dgl', 'torch_geometric') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing tandem imported {out.stdout.strip()}"


def test_the_package_is_built_with_cuda_and_names_its_device():
    import tandem

    assert tandem.CUDA_COMPILED is True
    ds = tandem.Dataset.generate_sbm(vertices=300, edges=1500, classes=2, dim=4)
    t = tandem.Trainer(ds, {"train": {"epochs": 1}, "threads": {"compute": 1}})
    note = t.device_note
    # `auto` on a machine without a GPU falls back to the host backend and says why.
    assert note and ("host" in note or "cuda" in note.lower()), note
