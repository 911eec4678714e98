"""The trainer: configuration as TOML has it, fit and its callbacks, Ctrl-C,
outputs (embeddings, predictions, checkpoints, files) and errors."""

import copy
import json
import os
import signal
import threading
import time

import numpy as np
import pytest

import tandem
from conftest import SMALL


def cfg(**sections):
    c = copy.deepcopy(SMALL)
    for k, v in sections.items():
        c.setdefault(k, {}).update(v)
    return c


def test_fit_returns_epoch_records_and_outputs_have_their_shapes():
    t = tandem.Trainer(config=SMALL)
    recs = t.fit()
    assert [r.epoch for r in recs] == [0, 1]
    assert all(np.isfinite(r.loss) and r.batches == 3 for r in recs)
    assert all(r.val_acc is not None for r in recs)  # train.eval_every = 1
    assert t.epoch == 2 and t.steps == 6
    with pytest.raises(tandem.TandemError, match="all 2 epochs of train.epochs are trained"):
        t.fit()
    assert len(t.fit(epochs=1)) == 1
    emb = t.embeddings([0, 5, 7])
    assert emb.shape == (3, 16) and emb.dtype == np.float32
    assert t.embeddings().shape == (600, 16)
    np.testing.assert_array_equal(t.embeddings(np.array([5], dtype=np.int32)), emb[1:2])
    assert t.predict([1, 2]).shape == (2, 3)
    val, test = t.evaluate()
    assert 0 <= val <= 1 and 0 <= test <= 1
    assert 0 <= t.evaluate(t.dataset.test_ids) <= 1
    with pytest.raises(tandem.DatasetError, match=r"ids\[0\] = -1 is negative"):
        t.embeddings([-1])
    with pytest.raises(tandem.TandemError, match="600"):
        t.predict([600])


def test_config_from_a_dict_a_file_and_overrides(tmp_path):
    t = tandem.Trainer(config=cfg(model={"kind": "gcn"}), overrides={"train.lr": 0.01}, train__epochs=1)
    assert 'kind = "gcn"' in t.config_toml and "lr = 0.01" in t.config_toml
    assert "epochs = 1" in t.config_toml
    f = tmp_path / "run.toml"
    f.write_text('[model]\nkind = "gat"\nhidden = 8\nheads = 2\n[train]\nepochs = 1\n[threads]\ncompute = 1\n')
    t = tandem.Trainer(config=str(f), overrides={"data.synthetic.vertices": 300})
    assert 'kind = "gat"' in t.config_toml and "vertices = 300" in t.config_toml


def test_bad_configuration_raises_config_error_with_key_and_origin(tmp_path):
    with pytest.raises(tandem.ConfigError) as e:
        tandem.Trainer(config={"train": {"epochz": 3}})
    assert e.value.key == "train.epochz" and e.value.origin == "<config dict>"
    assert str(e.value).startswith("<config dict>: key `train.epochz`: unknown key; expected one of")
    with pytest.raises(tandem.ConfigError) as e:
        tandem.Trainer(config=SMALL, overrides={"train.lr": -1.0})
    assert (e.value.key, e.value.origin) == ("train.lr", "overrides")
    f = tmp_path / "bad.toml"
    f.write_text("[train\nepochs = 1\n")
    with pytest.raises(tandem.ConfigError) as e:
        tandem.Trainer(config=f)
    assert str(e.value).startswith(f"{f}: line 1")
    with pytest.raises(tandem.ConfigError, match="found None"):
        tandem.Trainer(config={"train": {"lr": None}})


class Recorder:
    def __init__(self, stop_at=None):
        self.batches, self.epochs, self.stop_at = [], [], stop_at

    def on_batch(self, b):
        self.batches.append((b.epoch, b.batch))
        if self.stop_at == (b.epoch, b.batch):
            return False
        return None

    def on_epoch(self, e):
        self.epochs.append(e.epoch)


def test_callbacks_see_batches_and_epochs_and_false_stops():
    t = tandem.Trainer(config=SMALL)
    r = Recorder(stop_at=(1, 0))
    recs = t.fit(callback=r)
    assert r.batches == [(0, 0), (0, 1), (0, 2), (1, 0)] and r.epochs == [0]
    assert [x.epoch for x in recs] == [0]
    assert (t.epoch, t.batch_in_epoch) == (1, 1)
    # A plain callable sees epochs; the stopped epoch goes on where it stopped.
    seen = []
    t.fit(callback=lambda e: seen.append((e.epoch, e.batches)))
    assert seen == [(1, 3)]  # the epoch's batches, the first trained before


class Boom(Exception):
    pass


def test_a_callback_exception_stops_training_and_propagates_unchanged():
    t = tandem.Trainer(config=SMALL)
    err = Boom("from the callback")

    class Raiser:
        def on_batch(self, b):
            if b.batch == 1:
                raise err

    with pytest.raises(Boom) as e:
        t.fit(callback=Raiser())
    assert e.value is err
    assert (t.epoch, t.batch_in_epoch) == (0, 2)
    # The trainer stays usable and the callback is gone.
    assert [r.epoch for r in t.fit()] == [0, 1]


def test_ctrl_c_stops_within_one_batch_and_leaves_the_trainer_usable(tmp_path):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    t = tandem.Trainer(config=cfg(train={"epochs": 3}))

    handled = threading.Event()

    def on_sigint(signum, frame):
        handled.set()
        raise KeyboardInterrupt

    class Interrupt:
        def on_batch(self, b):
            if (b.epoch, b.batch) == (0, 1):
                os.kill(os.getpid(), signal.SIGINT)
                # This batch waits until the main thread has run the handler
                # (so the cancel lands before the next batch), however long
                # the machine takes to get there.
                assert handled.wait(60), "the SIGINT handler never ran"

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with pytest.raises(KeyboardInterrupt):
            t.fit(callback=Interrupt())
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (t.epoch, t.batch_in_epoch) == (0, 2)
    ck = tmp_path / "mid.tck"
    t.save_checkpoint(ck)
    recs = t.fit()
    assert [r.epoch for r in recs] == [0, 1, 2]
    # The interrupted run ends where an uninterrupted one does.
    ref = tandem.Trainer(config=cfg(train={"epochs": 3}))
    ref_recs = ref.fit()
    assert [r.loss for r in recs[1:]] == [r.loss for r in ref_recs[1:]]
    np.testing.assert_array_equal(t.embeddings([0, 1, 2]), ref.embeddings([0, 1, 2]))
    resumed = tandem.Trainer(config=cfg(train={"epochs": 3}))
    resumed.load_checkpoint(ck)
    assert (resumed.epoch, resumed.batch_in_epoch) == (0, 2)


def test_training_releases_the_gil():
    t = tandem.Trainer(config=cfg(train={"epochs": 3}))
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    th = threading.Thread(target=spin)
    th.start()
    counts = []
    t.fit(callback=lambda e: counts.append(len(ticks)))
    stop.set()
    th.join()
    # The other Python thread ran while epochs trained.
    assert counts[-1] > counts[0] >= 0 and len(ticks) > 0


def test_checkpoints_files_and_onnx(tmp_path):
    t = tandem.Trainer(config=SMALL)
    t.fit()
    ck = tmp_path / "a.tck"
    t.save_checkpoint(ck)
    again = tandem.Trainer(config=SMALL)
    again.load_checkpoint(ck)
    np.testing.assert_array_equal(again.embeddings([3, 4]), t.embeddings([3, 4]))
    other = tandem.Trainer(config=cfg(model={"hidden": 8}))
    with pytest.raises(tandem.CheckpointError) as e:
        other.load_checkpoint(ck)
    assert "model.hidden" in str(e.value) and e.value.path == str(ck)
    (tmp_path / "junk.tck").write_bytes(b"not a checkpoint")
    with pytest.raises(tandem.CheckpointError):
        other.load_checkpoint(tmp_path / "junk.tck")
    rows, cols = t.infer_to_file(tmp_path / "emb.npy")
    assert (rows, cols) == (600, 16)
    np.testing.assert_allclose(np.load(tmp_path / "emb.npy"), t.embeddings(), rtol=1e-5, atol=1e-6)
    assert t.infer_to_file(tmp_path / "logits.npy", what="logits") == (600, 3)
    t.export_onnx(tmp_path / "m.onnx")
    assert (tmp_path / "m.onnx").stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.tck", "emb.npy", "junk.tck", "logits.npy", "m.onnx"]  # no temporaries left
    params = t.params()
    assert "layer0.weight" in params or len(params) > 0


def test_verbose_prints_a_progress_bar_and_quiet_prints_nothing(capfd):
    tandem.Trainer(config=SMALL).fit()
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    tandem.Trainer(config=SMALL, verbose=True).fit()
    out, err = capfd.readouterr()
    assert out == ""
    assert "batches" in err and "epoch   1: loss" in err


def test_trace_is_written_after_fit(tmp_path):
    p = tmp_path / "run.json"
    t = tandem.Trainer(config=SMALL, trace=p)
    t.fit()
    doc = json.loads(p.read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    assert any(e.get("name") == "device step" for e in events)


def test_a_non_finite_loss_raises_non_finite_error():
    n = 40
    x = np.full((n, 2), 3e38, dtype=np.float32)  # finite, but the products overflow
    src = np.arange(n)
    ds = tandem.Dataset.from_arrays(features=x, labels=np.arange(n) % 2,
                                    edge_index=np.stack([src, (src + 1) % n]))
    t = tandem.Trainer(ds, {"train": {"epochs": 1, "lr": 1e30}, "threads": {"compute": 1}, "model": {"hidden": 8}})
    with pytest.raises(tandem.NonFiniteError) as e:
        t.fit()
    assert e.value.epoch == 0 and not np.isfinite(e.value.loss)
