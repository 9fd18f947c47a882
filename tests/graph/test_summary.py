"""ef.summary: summaries become outputs of the `train` signature, marked by kind in the
package's "edgeflow.summaries" metadata; optimizers add their learning rate. Values are
checked against numpy."""
import pathlib

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.errors import GraphError
from edgeflow.format import metadata, reader, writer

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "onnx"
W0 = np.array([[0.5], [-1.0], [2.0]], np.float32)


def regression(optimizer=None):
    """(graph, x, y, pred, loss, step): y ~ x @ w, mean squared error."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 3], name="x")
        y = ef.placeholder(ef.float32, [None, 1], name="y")
        w = ef.Variable(W0, name="w")
        pred = ef.matmul(x, w, name="pred")
        loss = ef.reduce_mean((pred - y) * (pred - y), name="loss")
        step = (optimizer or ef.train.GradientDescent(0.1)).minimize(loss)
    return g, x, y, pred, loss, step


def batch(n=5):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 3)).astype(np.float32), rng.standard_normal((n, 1)).astype(np.float32)


def train_once(model, **feeds):
    return ef.Interpreter(writer.to_bytes(model)).get_signature_runner("train")(**feeds)


def test_summaries_are_outputs_of_train_marked_by_kind():
    g, x, y, pred, loss, step = regression()
    with g.as_default():
        assert ef.summary.scalar("pred/max", ef.reduce_max(pred)) is not None
        assert ef.summary.histogram("pred", pred) is pred
        ef.summary.scalar("loss", loss)  # an output already: marked, not added twice
    model = ef.to_model(g, {"train": ({"x": x, "y": y}, {"loss": loss}, [step]), "infer": ({"x": x}, {"y": pred})})
    loaded = reader.load(writer.to_bytes(model))
    assert metadata.summaries(loaded) == {"train": {"pred/max": "scalar", "pred": "histogram", "loss": "scalar",
                                                    "learning_rate": "scalar"}}
    signatures = {s.key: s for s in loaded.signatures}
    assert set(signatures["train"].outputs) == {"loss", "pred/max", "pred", "learning_rate"}
    assert set(signatures["infer"].outputs) == {"y"}
    xs, ys = batch()
    out = train_once(model, x=xs, y=ys)
    p = xs.astype(np.float64) @ W0  # the weights before the step: reads come before writes
    np.testing.assert_allclose(out["pred"], p, rtol=1e-6)
    assert out["pred/max"] == pytest.approx(p.max(), rel=1e-6)
    assert out["loss"] == pytest.approx(((p - ys) ** 2).mean(), rel=1e-6)
    assert out["learning_rate"].dtype == np.float32 and out["learning_rate"] == np.float32(0.1)


def test_each_optimizer_adds_its_learning_rate_where_its_updates_run():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 3], name="x")
        a, b = ef.Variable(W0, name="a"), ef.Variable(W0 * 2, name="b")
        rate = ef.Variable(np.float32(0.05), name="rate", trainable=False)
        loss_a, loss_b = ef.reduce_mean(ef.matmul(x, a)), ef.reduce_mean(ef.matmul(x, b))
        adam = ef.train.Adam(0.001)
        step_a = adam.minimize(loss_a)
        step_a2 = adam.minimize(loss_a * 2.0)  # the same optimizer again: still one summary
        step_b = ef.train.Momentum(rate, 0.9).minimize(loss_b)
    xs, _ = batch()
    for targets, want in (([step_a], {"learning_rate": np.float32(0.001)}),
                          ([step_a2], {"learning_rate": np.float32(0.001)}),
                          ([step_b], {"learning_rate_1": np.float32(0.05)}),
                          ([step_a, step_b], {"learning_rate": np.float32(0.001), "learning_rate_1": np.float32(0.05)})):
        model = ef.to_model(g, {"train": ({"x": x}, {"loss": loss_a + loss_b}, targets)})
        assert metadata.summaries(model) == {"train": {name: "scalar" for name in want}}
        out = train_once(model, x=xs)
        assert {n: out[n] for n in out if n != "loss"} == want


def test_a_converted_trainable_model_logs_its_optimizers_learning_rate(tmp_path):
    result = onnx_converter.convert(DATA / "mlp.onnx", tmp_path / "t.efl", trainable=True, optimizer="adam:0.001")
    assert metadata.summaries(reader.load(tmp_path / "t.efl")) == {"train": {"learning_rate": "scalar"}}
    train = ef.Interpreter(tmp_path / "t.efl").get_signature_runner("train")
    out = train(x=np.ones((2, 64), np.float32), labels=np.array([1, 2]))
    assert out["learning_rate"] == np.float32(0.001) and set(out) == {"loss", "learning_rate"}
    assert result.model.signatures


def test_no_train_signature_no_summaries():
    g, x, y, pred, loss, step = regression()
    with g.as_default():
        ef.summary.histogram("pred", pred)
    model = ef.to_model(g, {"infer": ({"x": x}, {"y": pred})})
    assert metadata.SUMMARIES not in model.metadata
    assert metadata.summaries(reader.load(writer.to_bytes(model))) is None


def test_an_entry_for_a_signature_the_package_lacks_is_left_out():
    """A package derived from the model (an inference split's device package) keeps the
    entry but not the `train` signature."""
    g, x, y, pred, loss, step = regression()
    model = ef.to_model(g, {"infer": ({"x": x}, {"y": pred})})
    model.metadata.update(metadata.summaries_entry({"train": {"pred": "histogram"}}))
    assert metadata.summaries(reader.load(writer.to_bytes(model))) == {}


@pytest.mark.parametrize("case", ["not one value", "needs an unfed placeholder", "name of another output",
                                  "name taken", "in a branch", "no name"])
def test_summaries_that_cannot_be_logged_are_refused(case):
    g, x, y, pred, loss, step = regression()
    signatures = {"train": ({"x": x, "y": y}, {"loss": loss}, [step])}
    with g.as_default():
        if case == "not one value":
            with pytest.raises(GraphError, match=r"summary.scalar\('pred'\): expected a tensor of one value"):
                ef.summary.scalar("pred", pred)
            assert "pred" not in g.summaries
            return
        if case == "needs an unfed placeholder":
            mask = ef.placeholder(ef.float32, [None, 1], name="mask")
            ef.summary.histogram("masked", pred * mask)
            with pytest.raises(GraphError, match=r"summary 'masked' needs placeholder\(s\) \['mask'\]"):
                ef.to_model(g, signatures)
            return
        if case == "name of another output":
            ef.summary.scalar("loss", ef.reduce_max(pred))
            with pytest.raises(GraphError, match="output 'loss' is another tensor"):
                ef.to_model(g, signatures)
            return
        if case == "name taken":
            ef.summary.histogram("p", pred)
            with pytest.raises(GraphError, match="already has a histogram summary 'p'"):
                ef.summary.histogram("p", loss)
            return
        if case == "in a branch":
            with pytest.raises(GraphError, match="a cond branch or loop body"):
                ef.cond(ef.constant(True), lambda: ef.summary.scalar("b", ef.reduce_sum(pred)),
                        lambda: ef.reduce_sum(pred))
            return
        with pytest.raises(GraphError, match="non-empty string"):
            ef.summary.histogram("", pred)
