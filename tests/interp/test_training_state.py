"""Trainable packages on the interpreter: train steps, save/restore signatures,
checkpoints (atomic, checked) and export."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import FormatError


def _linear_model(path, lr=0.1, seed=0):
    """y = x @ W + b with a hand-written SGD step (W -= lr * dW), as a trainable package."""
    rng = np.random.default_rng(seed)
    w0, b0 = rng.standard_normal((3, 2)), rng.standard_normal(2)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float64, [None, 3], name="x")
        y = ef.placeholder(ef.float64, [None, 2], name="y")
        w = ef.Variable(w0, name="W")
        b = ef.Variable(b0, name="b")
        pred = ef.add(x @ w, b, name="pred")
        loss = ef.reduce_mean((pred - y) * (pred - y), name="loss")
        dw, db = ef.gradients(loss, [w, b])
        step = ef.group(w.assign_sub(dw * lr), b.assign_sub(db * lr))
    ef.save(g, path, signatures={"infer": ({"x": x}, {"pred": pred}),
                                 "train": ({"x": x, "y": y}, {"loss": loss}, [step])})
    return w0, b0


def _numpy_steps(w, b, batches, lr=0.1):
    w, b = w.copy(), b.copy()
    for xv, yv in batches:
        err = xv @ w + b - yv
        n = err.size
        w, b = w - lr * 2 * xv.T @ err / n, b - lr * 2 * err.sum(0) / n
    return w, b


def _batches(n, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((4, 3)), rng.standard_normal((4, 2))) for _ in range(n)]


def test_train_signature_updates_variables_like_numpy(tmp_path):
    w0, b0 = _linear_model(tmp_path / "m.efl")
    interp = ef.Interpreter(tmp_path / "m.efl")
    assert set(interp.get_signature_list()) == {"infer", "train", "save", "restore"}
    train = interp.get_signature_runner("train")
    batches = _batches(5)
    losses = [float(train(x=xv, y=yv)["loss"]) for xv, yv in batches]
    w, b = _numpy_steps(w0, b0, batches)
    state = interp.get_signature_runner("save")()
    np.testing.assert_allclose(state["W"], w, rtol=1e-12)
    np.testing.assert_allclose(state["b"], b, rtol=1e-12)
    err = batches[0][0] @ w0 + b0 - batches[0][1]
    assert losses[0] == pytest.approx(float((err ** 2).mean()))  # loss of the weights before the step


def test_restore_signature_and_checkpoints(tmp_path):
    w0, b0 = _linear_model(tmp_path / "m.efl")
    interp = ef.Interpreter(tmp_path / "m.efl")
    train = interp.get_signature_runner("train")
    for xv, yv in _batches(3):
        train(x=xv, y=yv)
    trained = interp.variables()
    interp.save_checkpoint(tmp_path / "ckpt.npz")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".checkpoint")] == []
    interp.get_signature_runner("restore")(W=w0, b=b0)
    np.testing.assert_array_equal(interp.variables()["W"], w0)
    interp.restore_checkpoint(tmp_path / "ckpt.npz")
    for name, value in trained.items():
        np.testing.assert_array_equal(interp.variables()[name], value)


def test_torn_or_mismatched_checkpoint_changes_nothing(tmp_path):
    _linear_model(tmp_path / "m.efl")
    interp = ef.Interpreter(tmp_path / "m.efl")
    interp.save_checkpoint(tmp_path / "good.npz")
    data = (tmp_path / "good.npz").read_bytes()
    for n in (0, 10, len(data) // 2, len(data) - 5):
        (tmp_path / "torn.npz").write_bytes(data[:n])
        with pytest.raises(FormatError, match="torn or corrupt"):
            interp.restore_checkpoint(tmp_path / "torn.npz")
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0xFF  # inside the W array's bytes: the CRC must catch it
    (tmp_path / "flipped.npz").write_bytes(bytes(flipped))
    before = interp.variables()
    with pytest.raises(FormatError):
        interp.restore_checkpoint(tmp_path / "flipped.npz")
    np.savez(tmp_path / "other.npz", W=np.zeros((3, 2)), c=np.zeros(2))
    with pytest.raises(FormatError, match=r"missing \['b'\]; unknown \['c'\]"):
        interp.restore_checkpoint(tmp_path / "other.npz")
    np.savez(tmp_path / "shape.npz", W=np.zeros((2, 3)), b=np.zeros(2))
    with pytest.raises(FormatError, match="'W' is float64\\[2, 3\\] in the checkpoint"):
        interp.restore_checkpoint(tmp_path / "shape.npz")
    for name, value in before.items():
        np.testing.assert_array_equal(interp.variables()[name], value)


def _central_directory(data):
    """Offsets of the zip archive's central directory entries (signature PK\\1\\2)."""
    at, out = data.find(b"PK\x01\x02"), []
    while at >= 0:
        out.append(at)
        at = data.find(b"PK\x01\x02", at + 4)
    return out


def test_a_flipped_compression_byte_is_a_format_error(tmp_path):
    # main: NotImplementedError ("That compression method is not supported")
    _linear_model(tmp_path / "m.efl")
    interp = ef.Interpreter(tmp_path / "m.efl")
    interp.save_checkpoint(tmp_path / "good.npz")
    data = bytearray((tmp_path / "good.npz").read_bytes())
    for entry in _central_directory(bytes(data)):
        data[entry + 10] ^= 0x63  # the compression method: 99 (AES), which zipfile does not read
    (tmp_path / "bad.npz").write_bytes(bytes(data))
    with pytest.raises(FormatError, match="compression method 99"):
        interp.restore_checkpoint(tmp_path / "bad.npz")


def test_a_hostile_array_header_allocates_nothing(tmp_path):
    # main: MemoryError (32 TiB)
    import io
    import zipfile
    _linear_model(tmp_path / "m.efl")
    interp = ef.Interpreter(tmp_path / "m.efl")
    with zipfile.ZipFile(tmp_path / "big.npz", "w") as z:
        for name, shape in (("W", (2**22, 2**20)), ("b", (2,))):
            f = io.BytesIO()
            np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": shape})
            z.writestr(name + ".npy", f.getvalue() + bytes(16))
    with pytest.raises(FormatError, match=r"'W' is float64\[4194304, 1048576\] in the checkpoint"):
        interp.restore_checkpoint(tmp_path / "big.npz")


@pytest.mark.parametrize("seed", range(3))
def test_damaged_checkpoints_raise_only_format_errors(tmp_path, seed):
    rng = np.random.default_rng(seed)
    _linear_model(tmp_path / "m.efl")
    interp = ef.Interpreter(tmp_path / "m.efl")
    interp.save_checkpoint(tmp_path / "good.npz")
    data = (tmp_path / "good.npz").read_bytes()
    before = interp.variables()
    for _ in range(150):
        damaged = bytearray(data)
        for at in rng.integers(0, len(data), rng.integers(1, 4)):
            damaged[at] ^= int(rng.integers(1, 256))
        (tmp_path / "bad.npz").write_bytes(bytes(damaged))
        try:
            interp.restore_checkpoint(tmp_path / "bad.npz")
        except FormatError:
            continue
        after = interp.variables()  # a flip the format cannot see (e.g. an unused field)
        for name, value in before.items():
            np.testing.assert_array_equal(after[name], value)


def test_export_bakes_in_trained_values(tmp_path):
    _linear_model(tmp_path / "m.efl")
    interp = ef.Interpreter(tmp_path / "m.efl")
    train = interp.get_signature_runner("train")
    for xv, yv in _batches(4):
        train(x=xv, y=yv)
    interp.export(tmp_path / "trained.efl")
    xv = np.random.default_rng(9).standard_normal((5, 3))
    expected = interp.get_signature_runner("infer")(x=xv)["pred"]
    fresh = ef.Interpreter(tmp_path / "trained.efl")
    np.testing.assert_array_equal(fresh.get_signature_runner("infer")(x=xv)["pred"], expected)
    assert set(fresh.get_signature_list()) == {"infer", "train", "save", "restore"}


def test_variables_persist_and_reads_see_old_values_within_a_step(tmp_path):
    """Ops in one run read the values from before it; the writes land after them, and a
    variable given as an output is read at the end of the run."""
    g = ef.Graph()
    with g.as_default():
        v = ef.Variable(np.array([1.0, 2.0]), name="v")
        doubled = ef.mul(v, 2.0, name="doubled")
        step = v.assign(doubled)
    ef.save(g, tmp_path / "m.efl", signatures={"step": ({}, {"doubled": doubled, "v": v}, [step])})
    runner = ef.Interpreter(tmp_path / "m.efl").get_signature_runner("step")
    for k in range(3):
        out = runner()
        np.testing.assert_array_equal(out["v"], np.array([1.0, 2.0]) * 2 ** (k + 1))
        np.testing.assert_array_equal(out["doubled"], np.array([1.0, 2.0]) * 2 ** (k + 1))


def test_set_variables_checks_every_value_before_setting_any(tmp_path):
    w0, b0 = _linear_model(tmp_path / "m.efl")
    interp = ef.Interpreter(tmp_path / "m.efl")
    from edgeflow.errors import InvalidInputError
    for bad, message in (({"W": np.ones((3, 2)), "b": np.ones(3)}, r"'b': expected float64\[2\], got float64\[3\]"),
                         ({"W": np.ones((3, 2)), "b": np.ones(2, np.float32)}, "got float32"),
                         ({"W": np.ones((3, 2)), "V": np.ones(2)}, "'V': expected one of the model's variables")):
        with pytest.raises(InvalidInputError, match=message):
            interp.set_variables(bad)
        np.testing.assert_array_equal(interp.variables()["W"], w0)  # the good one was not set either
    interp.set_variables({"b": np.full(2, 3.0)})
    np.testing.assert_array_equal(interp.variables()["b"], np.full(2, 3.0))
    np.testing.assert_array_equal(interp.variables()["W"], w0)
