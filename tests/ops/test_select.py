"""nonzero, compress and unique (edgeflow/ops/select.py) through the interpreter, against
numpy and a first-occurrence reference written here; sizes follow the values."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply


def _run(op, arrays, attrs=None):
    g = ef.Graph()
    with g.as_default():
        feeds = {f"in{i}": ef.placeholder(a.dtype, [None] * a.ndim, name=f"in{i}") for i, a in enumerate(arrays)}
        outs = apply(op, list(feeds.values()), attrs or {})
        outs = outs if isinstance(outs, tuple) else (outs,)
        fetch = {f"out{i}": t for i, t in enumerate(outs)}
    interp = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": (feeds, fetch)})))
    got = interp.get_signature_runner("infer")(**{f"in{i}": a for i, a in enumerate(arrays)})
    return [got[f"out{i}"] for i in range(len(outs))]


@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 2)])
def test_nonzero(shape):
    x = (np.random.default_rng(0).random(shape) < 0.4).astype(np.float32)
    (got,) = _run("nonzero", [x])
    np.testing.assert_array_equal(got, np.array(np.nonzero(x), np.int64).reshape(len(shape), -1))


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress(axis):
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    condition = np.array([True, False, True])
    (got,) = _run("compress", [x, condition], {"axis": axis})
    np.testing.assert_array_equal(got, np.compress(condition, x, axis=axis))


def _first_occurrence_unique(values):
    """(unique, first index, inverse, counts) in order of first occurrence, by a dict."""
    first, counts = {}, {}
    for i, v in enumerate(values.tolist()):
        first.setdefault(v, i)
        counts[v] = counts.get(v, 0) + 1
    keys = list(first)
    return (np.array(keys, values.dtype), np.array([first[k] for k in keys]),
            np.array([keys.index(v) for v in values.tolist()]), np.array([counts[k] for k in keys]))


@pytest.mark.parametrize("sorted_", [True, False])
def test_unique_of_flattened(sorted_):
    x = np.array([[2, 1, 1], [3, 4, 3]], np.int64)
    got = _run("unique", [x], {"sorted": sorted_})
    if sorted_:
        want = np.unique(x.reshape(-1), return_index=True, return_inverse=True, return_counts=True)
    else:
        want = _first_occurrence_unique(x.reshape(-1))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_unique_rows():
    x = np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4]], np.float32)
    y, first, inverse, counts = _run("unique", [x], {"axis": 0})
    np.testing.assert_array_equal(y, [[1, 0, 0], [2, 3, 4]])
    np.testing.assert_array_equal(first, [0, 2])
    np.testing.assert_array_equal(inverse, [0, 0, 1])
    np.testing.assert_array_equal(counts, [2, 1])
