"""Python and the Rust CLI: one config and seed give bit-identical losses and
embeddings, and the same errors print the same messages."""

import json
import subprocess

import numpy as np
import pytest

import tandem

TOML = """
[data.synthetic]
vertices = 800
edges = 4000
classes = 4
dim = 8
[model]
hidden = 16
[train]
epochs = 3
batch_size = 128
seed = 7
[threads]
compute = 1
[device]
kind = "host"
"""


def test_python_and_the_cli_train_bit_identically(tmp_path, tandem_cli):
    cfg = tmp_path / "run.toml"
    cfg.write_text(TOML)
    out = tmp_path / "run"
    subprocess.run([tandem_cli, "train", "--config", str(cfg), "--out", str(out), "--quiet-config"],
                   check=True, capture_output=True, text=True)
    rust_losses = [json.loads(l)["loss"] for l in (out / "metrics.jsonl").read_text().splitlines()]
    emb = tmp_path / "emb.npy"
    subprocess.run([tandem_cli, "infer", "--checkpoint", str(out / "checkpoint.tck"), "-o", str(emb)],
                   check=True, capture_output=True, text=True)

    t = tandem.Trainer(config=cfg)
    py_losses = [r.loss for r in t.fit()]
    assert py_losses == rust_losses  # exact: every f64 bit
    rust_emb = np.load(emb)
    np.testing.assert_array_equal(t.embeddings(), rust_emb)
    # The same written by Python, compared as bytes.
    t.infer_to_file(tmp_path / "py.npy")
    assert (tmp_path / "py.npy").read_bytes() == emb.read_bytes()


@pytest.mark.parametrize("text", [
    "[train]\nepochz = 3\n",
    "[train]\nlr = -1.0\n",
    "[model]\nkind = \"gnn\"\n",
    "[train\n",
])
def test_config_errors_print_as_the_cli_prints_them(tmp_path, tandem_cli, text):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    cli = subprocess.run([tandem_cli, "train", "--config", str(cfg)], capture_output=True, text=True)
    assert cli.returncode != 0
    line = next(l for l in cli.stderr.splitlines() if l.startswith("error: "))
    with pytest.raises(tandem.ConfigError) as e:
        tandem.Trainer(config=cfg)
    assert "error: " + str(e.value) == line


def test_tandem_import_ogb_gives_the_dataset_from_ogb_dir_gives(tmp_path, tandem_cli):
    from conftest import write_ogb_dir

    root, *_ = write_ogb_dir(tmp_path / "ogbn_toy")
    out = tmp_path / "toy.tds"
    subprocess.run([tandem_cli, "import", "ogb", str(root), "-o", str(out)], check=True,
                   capture_output=True, text=True)
    a, b = tandem.Dataset.open(out), tandem.Dataset.from_ogb_dir(root)
    assert (a.num_vertices, a.num_edges, a.num_classes) == (b.num_vertices, b.num_edges, b.num_classes)
    np.testing.assert_array_equal(a.features, b.features)
    np.testing.assert_array_equal(a.train_ids, b.train_ids)
    bad = tmp_path / "bad"
    write_ogb_dir(bad)
    (bad / "raw" / "node-label.csv.gz").write_bytes(b"\x1f\x8b broken")
    cli = subprocess.run([tandem_cli, "import", "ogb", str(bad), "-o", str(tmp_path / "bad.tds")],
                         capture_output=True, text=True)
    line = next(l for l in cli.stderr.splitlines() if l.startswith("error: "))
    with pytest.raises(tandem.TandemError) as e:
        tandem.Dataset.from_ogb_dir(bad)
    assert line == "error: " + str(e.value)
    assert not (tmp_path / "bad.tds").exists()
