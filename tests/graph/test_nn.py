"""ef.nn: prelu against its definition (numpy's where), for every form it takes."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.format import writer

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.5, -3.5], np.float32)


def _run(slope, x, fed_slope=False):
    g = ef.Graph()
    with g.as_default():
        xp = ef.placeholder(ef.float32, x.shape, name="x")
        sp = ef.placeholder(ef.float32, slope.shape, name="s") if fed_slope else slope
        y = ef.nn.prelu(xp, sp, name="y")
    ops = {n.op for n in g.nodes}
    feeds = {"x": xp, "s": sp} if fed_slope else {"x": xp}
    runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": (feeds, {"y": y})}))).get_signature_runner("infer")
    return runner(**({"x": x, "s": slope} if fed_slope else {"x": x}))["y"], ops


@pytest.mark.parametrize("low, high, fed, op", [
    (0.01, 1.0, False, "maximum"), (1.0, 3.0, False, "minimum"), (0.0, 0.5, False, "where"),
    (-0.5, 0.5, False, "where"), (0.5, 2.0, False, "where"), (0.1, 0.9, True, "where")])
def test_prelu_equals_its_definition(low, high, fed, op):
    rng = np.random.default_rng(int(low * 100 + high * 10) + 100)
    slope = rng.uniform(low, high, (4, 1, 1)).astype(np.float32)
    slope.flat[0], slope.flat[-1] = low, high
    x = rng.standard_normal((2, 4, 3, 3)).astype(np.float32) * 4
    x.reshape(-1)[:SPECIAL.size] = SPECIAL
    x.reshape(-1)[-SPECIAL.size:] = SPECIAL
    got, ops = _run(slope, x, fed)
    with np.errstate(invalid="ignore"):  # 0 * inf
        expected = np.where(x >= 0, x, slope * x)
    np.testing.assert_array_equal(got, expected)  # NaN where NaN, inf and the sign of 0 too
    np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))
    assert op in ops and ({"maximum", "minimum", "where"} - {op}).isdisjoint(ops)
