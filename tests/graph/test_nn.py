"""ef.nn: prelu against its definition (numpy's where), for every form it takes."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.format import writer

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.5, -3.5], np.float32)


def _run(slope, x, fed_slope=False):
    """(y, the ops the graph holds)."""
    g = ef.Graph()
    with g.as_default():
        xp = ef.placeholder(ef.float32, x.shape, name="x")
        sp = ef.placeholder(ef.float32, slope.shape, name="s") if fed_slope else slope
        y = ef.nn.prelu(xp, sp, name="y")
    ops = {n.op for n in g.nodes}
    feeds = {"x": xp, "s": sp} if fed_slope else {"x": xp}
    runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": (feeds, {"y": y})}))).get_signature_runner("infer")
    return runner(**({"x": x, "s": slope} if fed_slope else {"x": x}))["y"], ops


@pytest.fixture(params=["jit", "numpy"])
def kernels(request, monkeypatch):
    """prelu's numba loop, or its numpy path (the numpy-only install's)."""
    monkeypatch.setenv("EDGEFLOW_JIT", "1" if request.param == "jit" else "0")


@pytest.mark.parametrize("low, high, fed, op", [
    (0.01, 1.0, False, "maximum"), (1.0, 3.0, False, "minimum"), (0.0, 0.5, False, "prelu"),
    (-0.5, 0.5, False, "prelu"), (0.5, 2.0, False, "prelu"), (0.1, 0.9, True, "prelu")])
def test_prelu_equals_its_definition(kernels, low, high, fed, op):
    rng = np.random.default_rng(int(low * 100 + high * 10) + 100)
    slope = rng.uniform(low, high, (4, 1, 1)).astype(np.float32)
    slope.flat[0], slope.flat[-1] = low, high
    x = rng.standard_normal((2, 4, 30, 30)).astype(np.float32) * 4  # enough for the loop to split
    x.reshape(-1)[:SPECIAL.size] = SPECIAL
    x.reshape(-1)[-SPECIAL.size:] = SPECIAL
    got, ops = _run(slope, x, fed)
    with np.errstate(invalid="ignore"):  # 0 * inf
        expected = np.where(x >= 0, x, slope * x)
    np.testing.assert_array_equal(got, expected)  # NaN where NaN, inf and the sign of 0 too
    np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))
    assert op in ops and ({"maximum", "minimum", "prelu"} - {op}).isdisjoint(ops)


@pytest.mark.parametrize("x_shape, slope_shape", [((1, 16, 40, 40), (16, 1, 1)), ((3, 5, 7), (5, 7)),
                                                  ((2, 9, 9, 4), (4,)), ((1, 3, 70, 70), (1,)),
                                                  ((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (2, 1, 4))])
@pytest.mark.parametrize("threads", [1, 2])
def test_prelu_kernel_of_every_slope_layout(kernels, x_shape, slope_shape, threads):
    """Per channel, per trailing axes, one value, whole, and a slope varying along axes
    apart (the numpy path); on one thread and split over two."""
    from edgeflow.interp import threads as pool
    rng = np.random.default_rng(len(x_shape) * 10 + len(slope_shape))
    x = rng.standard_normal(x_shape).astype(np.float32)
    slope = rng.uniform(-1, 1, slope_shape).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        xp = ef.placeholder(ef.float32, x.shape, name="x")
        sp = ef.placeholder(ef.float32, slope.shape, name="s")
        y = ef.nn.prelu(xp, sp)
    data = writer.to_bytes(ef.to_model(g, {"infer": ({"x": xp, "s": sp}, {"y": y})}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pool, "MIN_ELEMENTS", 1)
        got = ef.Interpreter(data, num_threads=threads).get_signature_runner("infer")(x=x, s=slope)["y"]
    np.testing.assert_array_equal(got, np.where(x >= 0, x, slope * x))


def test_prelu_loop_folds_the_slope_axes():
    """The JIT loop's (A, C, B) view: the slope varies along C alone, or it does not fold."""
    from edgeflow.interp.kernels import jit
    assert jit._channels((1, 16, 40, 40), (16, 1, 1)) == (1, 16, 1600)
    assert jit._channels((3, 5, 7), (5, 7)) == (3, 35, 1)
    assert jit._channels((2, 9, 9, 4), (4,)) == (162, 4, 1)
    assert jit._channels((5, 6), (1,)) == (1, 1, 30)
    assert jit._channels((2, 3, 4), (2, 1, 4)) is None
    x, slope = np.ones((1, 16, 40, 40), np.float32), np.ones((16, 1, 1), np.float32)
    assert jit.bind_prelu(x, slope, np.empty_like(x)) is not None  # numba is installed with the tests
