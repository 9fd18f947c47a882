"""The training loop and `edgeflow train`: resume after a crash gives the same result."""
import subprocess
import sys

import numpy as np
import pytest

import edgeflow as ef
from edgeflow import training_loop
from edgeflow.errors import InvalidInputError

from .test_training_state import _linear_model


def _data(n=37, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3))
    return {"x": x, "y": x @ np.array([[1.0, -2.0], [0.5, 0.0], [0.0, 3.0]]) + 0.1}


class Crash(Exception):
    pass


def test_resume_after_crash_equals_uninterrupted(tmp_path):
    _linear_model(tmp_path / "m.efl", lr=0.05)
    whole = ef.Interpreter(tmp_path / "m.efl")
    reference = training_loop.fit(whole, _data(), epochs=3, batch_size=8, seed=1)

    def crash_at_11(epoch, step, loss):
        if step == 11:
            raise Crash()
    first = ef.Interpreter(tmp_path / "m.efl")
    with pytest.raises(Crash):
        training_loop.fit(first, _data(), epochs=3, batch_size=8, seed=1,
                    checkpoint_dir=tmp_path / "ckpt", checkpoint_every=4, on_step=crash_at_11)
    resumed = ef.Interpreter(tmp_path / "m.efl")
    rest = training_loop.fit(resumed, _data(), epochs=3, batch_size=8, seed=1,
                       checkpoint_dir=tmp_path / "ckpt", checkpoint_every=4)
    # checkpoints at steps 4, 5 (end of epoch 1), 8 and 10 (end of epoch 2): resume after 10
    assert rest[0][0] == 11 and rest[-1][0] == reference[-1][0] == 15  # 5 batches x 3 epochs
    for name, value in whole.variables().items():
        np.testing.assert_array_equal(resumed.variables()[name], value)
    assert [loss for _, loss in rest] == [loss for _, loss in reference[10:]]


def test_loss_goes_down_and_data_is_checked(tmp_path):
    _linear_model(tmp_path / "m.efl", lr=0.05)
    interp = ef.Interpreter(tmp_path / "m.efl")
    history = training_loop.fit(interp, _data(200), epochs=5, batch_size=16)
    assert history[-1][1] < 0.1 * history[0][1]
    with pytest.raises(InvalidInputError, match=r"no \['y'\]"):
        training_loop.fit(interp, {"x": _data()["x"]})
    with pytest.raises(InvalidInputError, match="differ in length"):
        training_loop.fit(interp, {"x": _data(10)["x"], "y": _data(11)["y"]})


def test_cli_train_with_checkpoints_and_export(tmp_path):
    _linear_model(tmp_path / "m.efl", lr=0.05)
    np.savez(tmp_path / "data.npz", **_data(64))
    run = [sys.executable, "-m", "edgeflow", "train", tmp_path / "m.efl", "--data", tmp_path / "data.npz",
           "--epochs", "2", "--batch-size", "16", "--checkpoint-dir", tmp_path / "ck", "-o", tmp_path / "t.efl"]
    r = subprocess.run(list(map(str, run)), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "trained 8 steps" in r.stdout and (tmp_path / "t.efl").exists()
    r = subprocess.run(list(map(str, run)), capture_output=True, text=True, timeout=120)
    assert "already at the last epoch" in r.stdout  # resumed from the finished checkpoint
    np.savez(tmp_path / "bad.npz", z=np.zeros(3))
    r = subprocess.run([sys.executable, "-m", "edgeflow", "train", str(tmp_path / "m.efl"), "--data",
                        str(tmp_path / "bad.npz")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "train signature takes" in r.stderr
