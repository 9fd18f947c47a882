"""Interpreter.run: any tensors in, any tensors out (what split inference runs on each side)."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import InvalidInputError
from edgeflow.format import writer


@pytest.fixture(scope="module")
def interp(tmp_path_factory):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        h = ef.nn.relu(ef.matmul(x, ef.constant(np.arange(12, dtype=np.float32).reshape(4, 3) - 5)), name="h")
        y = ef.exp(-h, name="y")
        z = ef.add(h, y, name="z")
    path = tmp_path_factory.mktemp("m") / "m.efl"
    ef.save(g, path, signatures={"infer": ({"x": x}, {"z": z})})
    return ef.Interpreter(path)


def test_from_inputs_and_from_an_intermediate(interp):
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    w = np.arange(12, dtype=np.float32).reshape(4, 3) - 5
    h = np.maximum(x @ w, 0)
    out = interp.run(["h", "z"], {"x": x})
    np.testing.assert_allclose(out["h"], h, rtol=1e-6)
    np.testing.assert_allclose(out["z"], h + np.exp(-h), rtol=1e-6)
    fed = np.abs(x[:, :3])  # a value h could never take from x: proves x's ops did not run
    np.testing.assert_allclose(interp.run(["z"], {"h": fed})["z"], fed + np.exp(-fed), rtol=1e-6)


def test_unknown_names_and_missing_feeds(interp):
    with pytest.raises(InvalidInputError, match="no tensor 'nope'"):
        interp.run(["nope"], {"x": np.zeros((1, 4), np.float32)})
    with pytest.raises(InvalidInputError, match="which no input feeds"):
        interp.run(["z"], {})
    with pytest.raises(InvalidInputError, match="fetch 'x' is an input of the model that no feed gives"):
        interp.run(["x"], {})
    with pytest.raises(InvalidInputError, match="expected shape"):
        interp.run(["z"], {"x": np.zeros((1, 5), np.float32)})


def test_targets_run_variable_writes(tmp_path):
    g = ef.Graph()
    with g.as_default():
        v = ef.Variable(np.zeros(3, np.float32), name="v")
        d = ef.placeholder(ef.float32, [3], name="d")
        w = v.assign_add(d)
    model = ef.to_model(g, {"step": ({"d": d}, {}, [w])})
    interp = ef.Interpreter(writer.to_bytes(model))
    write = model.signatures[0].targets[0]
    interp.run([], {"d": np.array([1, 2, 3], np.float32)}, targets=[write])
    interp.run([], {"d": np.array([1, 0, 0], np.float32)}, targets=[write])
    np.testing.assert_array_equal(interp.variables()["v"], [2, 2, 3])
    with pytest.raises(InvalidInputError, match="operator indices"):
        interp.run([], {}, targets=[999])
