"""det: batched determinants against the Leibniz formula (a sum over permutations, in
Python floats) and onnxruntime."""
import itertools
import math

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

from .harness import FLOATS, assert_close
from .onnx_reference import onnx_reference


def _sign(perm):
    inversions = sum(a > b for a, b in itertools.combinations(perm, 2))
    return -1 if inversions % 2 else 1


def leibniz(x):
    """det of each matrix in the last two axes, as sum over permutations of signed products."""
    n = x.shape[-1]
    out = np.empty(x.shape[:-2])
    for index in np.ndindex(*x.shape[:-2]):
        m = x[index].tolist()
        out[index] = math.fsum(_sign(p) * math.prod(m[i][p[i]] for i in range(n))
                               for p in itertools.permutations(range(n)))
    return out


def det(t):
    return apply("det", [t])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (3, 3), (4, 4), (5, 3, 3), (2, 3, 2, 2), (0, 3, 3)])
def test_against_leibniz(run_op, rng, dtype, shape):
    x = rng.uniform(-2, 2, shape).astype(dtype)
    tol = {"float16": (1e-2, 1e-2), "float32": (1e-5, 1e-5)}.get(dtype, (None, None))
    assert_close(run_op(det, x), leibniz(x.astype(np.float64)), dtype, *tol)


def test_singular_and_identity(run_op):
    x = np.array([[[1.0, 2.0], [2.0, 4.0]], [[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]])
    assert_close(run_op(det, x), [0.0, 1.0, -1.0], np.float64)


@pytest.mark.parametrize("dtype", ["float16", "float32"])  # onnxruntime has no float64 Det
def test_against_onnxruntime(run_op, rng, dtype):
    x = rng.uniform(-2, 2, (2, 3, 4, 4)).astype(dtype)
    expected, = onnx_reference("Det", [x], [dtype], opset=22)
    tol = {"float16": (1e-2, 1e-2)}.get(dtype, (None, None))
    assert_close(run_op(det, x), expected, dtype, *tol)


def test_shape_with_unknown_dims_and_errors(graph):
    assert det(ef.placeholder("float32", (None, 3, 3))).shape == (None,)
    assert det(ef.placeholder("float32", (2, None, None))).shape == (2,)
    for shape in [(3,), (2, 3, 4)]:
        with pytest.raises(GraphError, match=r"det: input must be \(\*, M, M\)"):
            det(ef.placeholder("float32", shape))
    with pytest.raises(GraphError, match="dtype int32 not supported"):
        det(ef.placeholder("int32", (3, 3)))
