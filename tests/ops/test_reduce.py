"""reduce_sum, reduce_mean, reduce_max and argmax: axes None/int/list/negative, keepdims."""
import itertools

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError

from .harness import FLOATS, INTS, assert_close, random_array

SHAPE = (2, 3, 4)


def reduce_by_loops(x, axes, keepdims, combine):
    """Reduce `x` over `axes` (None: all) by visiting every element: no numpy reduction."""
    axes = tuple(range(x.ndim)) if axes is None else tuple(sorted(a % x.ndim for a in np.atleast_1d(axes)))
    kept = [i for i in range(x.ndim) if i not in axes]
    groups = {}
    for index in np.ndindex(*x.shape):
        groups.setdefault(tuple(index[i] for i in kept), []).append(x[index])
    shape = tuple(x.shape[i] for i in kept)
    out = np.empty(shape, np.float64 if x.dtype.kind == "f" else np.int64)
    for key, values in groups.items():
        out[key] = combine(values)
    if keepdims:
        out = out.reshape(tuple(1 if i in axes else n for i, n in enumerate(x.shape)))
    return out


def _mean(values):
    total, n = sum(values), len(values)
    if isinstance(total, (int, np.integer)):
        return int(abs(total) // n) * (1 if total >= 0 else -1)  # integers: truncate toward zero
    return total / n


# name -> (builder, combine over a list of Python numbers)
REDUCTIONS = {
    "reduce_sum": (ef.reduce_sum, lambda vs: sum(v.item() for v in vs)),
    "reduce_mean": (ef.reduce_mean, lambda vs: _mean([v.item() for v in vs])),
    "reduce_max": (ef.reduce_max, lambda vs: max(v.item() for v in vs)),
}
AXES = [None, 0, 1, 2, -1, -3, [0, 2], (1, 2), [-1, 0], [0, 1, 2], (-3, -2, -1)]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_axes(run_op, rng, name, axis, keepdims):
    builder, combine = REDUCTIONS[name]
    x = random_array(rng, SHAPE, "float32")
    out = run_op(lambda t: builder(t, axis=axis, keepdims=keepdims), x)
    assert_close(out, reduce_by_loops(x, axis, keepdims, combine), np.float32)


@pytest.mark.parametrize("dtype", FLOATS + INTS)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_dtypes(run_op, rng, name, dtype):
    builder, combine = REDUCTIONS[name]
    x = random_array(rng, SHAPE, dtype, -9, 10)
    for axis in (None, 1, [0, 2]):
        out = run_op(lambda t: builder(t, axis=axis), x)
        tol = 1e-2 if dtype == "float16" else None
        assert_close(out, reduce_by_loops(x, axis, False, combine), dtype, rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", [(3, 64, 64), (2, 5, 112, 112), (2, 4099), (1, 3, 8191)], ids=str)
@pytest.mark.parametrize("name", ["reduce_sum", "reduce_mean"])
def test_long_sums_over_the_last_axes(run_op, rng, name, shape):
    """Sums and means over the last axes past BLAS's 4096 elements a row (in pieces of a
    divisor of the count, or numpy's where none fits): float64's sums within 1e-5 of the
    largest, the values offset so that a running float32 sum would drift."""
    builder = REDUCTIONS[name][0]
    x = random_array(rng, shape, "float32") + 3
    axes = tuple(range(1, len(shape)))
    out = run_op(lambda t: builder(t, axis=list(axes)), x)
    want = getattr(x.astype(np.float64), "sum" if name == "reduce_sum" else "mean")(axis=axes)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("dtype", INTS)
def test_integer_mean_truncates_toward_zero(run_op, dtype):
    x = np.array([[1, 2, 4], [-1, -2, -4], [3, 3, 4], [-3, -3, -4]], dtype)
    assert_close(run_op(lambda t: ef.reduce_mean(t, axis=1), x), [2, -2, 3, -3], dtype)


def test_float16_mean_does_not_overflow_when_the_mean_fits(run_op):
    # The sum (6e8) overflows float16; the mean (6e4) does not.
    x = np.full((2, 10000), 60000, np.float16)
    assert_close(run_op(lambda t: ef.reduce_mean(t, axis=1), x), [60000, 60000], np.float16)
    assert_close(run_op(ef.reduce_mean, x), 60000, np.float16)


def test_reduce_max_all_negative(run_op):
    # A kernel that starts from 0 instead of the first element would return 0 here.
    x = np.array([[-3.0, -1.5], [-7.0, -2.0]], np.float32)
    assert_close(run_op(lambda t: ef.reduce_max(t, axis=1), x), [-1.5, -2.0], np.float32)
    assert_close(run_op(ef.reduce_max, x), -1.5, np.float32)


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_dynamic_batch(compile_graph, graph, rng, name):
    builder, combine = REDUCTIONS[name]
    x = ef.placeholder("float32", (None, 4), name="x")
    rows, cols, every = builder(x, axis=1), builder(x, axis=0, keepdims=True), builder(x)
    assert rows.shape == (None,) and cols.shape == (1, 4) and every.shape == ()
    run = compile_graph(graph, {"x": x}, {"rows": rows, "cols": cols, "all": every})
    for batch in (1, 3, 7):
        v = random_array(rng, (batch, 4), "float32")
        out = run(x=v)
        assert_close(out["rows"], reduce_by_loops(v, 1, False, combine), np.float32)
        assert_close(out["cols"], reduce_by_loops(v, 0, True, combine), np.float32)
        assert_close(out["all"], reduce_by_loops(v, None, False, combine), np.float32)


@pytest.mark.parametrize("axis", [3, -4, [0, 0], [1, -2]])
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_bad_axes(graph, name, axis):
    with pytest.raises(GraphError):
        REDUCTIONS[name][0](ef.placeholder("float32", SHAPE), axis=axis)


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_of_a_scalar(run_op, graph, name):
    assert_close(run_op(REDUCTIONS[name][0], np.float32(2.5)), 2.5, np.float32)
    with pytest.raises(GraphError):
        REDUCTIONS[name][0](ef.placeholder("float32", ()), axis=0)


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_rejects_bool(graph, name):
    with pytest.raises(GraphError):
        REDUCTIONS[name][0](ef.placeholder("bool", SHAPE))


# -- argmax ------------------------------------------------------------------------------

def argmax_by_loops(x, axis, keepdims):
    def first_largest(values):
        best = 0
        for i, v in enumerate(values):
            if v > values[best]:
                best = i
        return best
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape[:-1], np.int64)
    for index in np.ndindex(*out.shape):
        out[index] = first_largest(list(moved[index]))
    return np.expand_dims(out, axis) if keepdims else out


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_argmax(run_op, rng, dtype, axis, keepdims):
    x = random_array(rng, SHAPE, dtype, -3, 3)  # small range: ties happen
    out = run_op(lambda t: ef.argmax(t, axis=axis, keepdims=keepdims), x)
    assert_close(out, argmax_by_loops(x, axis, keepdims), np.int64)


def test_argmax_ties_take_the_first_index(run_op):
    x = np.array([[1, 3, 3], [2, 2, 1], [2, 3, 1], [0, -1, 0]], np.float32)
    assert_close(run_op(lambda t: ef.argmax(t, axis=1), x), [1, 0, 1, 0], np.int64)
    assert_close(run_op(ef.argmax, x), [1, 0, 0], np.int64)  # default axis 0
    assert_close(run_op(lambda t: ef.argmax(t, axis=1), np.full((2, 4), 7, np.int32)), [0, 0], np.int64)


def test_argmax_dynamic_batch(compile_graph, graph, rng):
    x = ef.placeholder("float32", (None, 5), name="x")
    y = ef.argmax(x, axis=-1)
    assert y.shape == (None,) and y.dtype == np.int64
    run = compile_graph(graph, {"x": x}, {"y": y})
    for batch in (1, 3, 7):
        v = random_array(rng, (batch, 5), "float32")
        assert_close(run(x=v)["y"], argmax_by_loops(v, 1, False), np.int64)


def test_argmax_errors(graph):
    with pytest.raises(GraphError):
        ef.argmax(ef.placeholder("float32", (2, 3)), axis=2)
    with pytest.raises(GraphError):
        ef.argmax(ef.placeholder("float32", ()))


def test_reference_helpers_agree_with_numpy():
    x = np.random.default_rng(0).integers(-3, 3, size=SHAPE)
    for axis, keepdims in itertools.product(AXES, (False, True)):
        ax = None if axis is None else tuple(np.atleast_1d(axis))
        np.testing.assert_array_equal(reduce_by_loops(x, axis, keepdims, REDUCTIONS["reduce_sum"][1]),
                                      x.sum(axis=ax, keepdims=keepdims))
    for axis in range(3):
        np.testing.assert_array_equal(argmax_by_loops(x, axis, False), x.argmax(axis=axis))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,axes", [((2, 70, 7, 7), (2, 3)), ((3, 4097), -1), ((5, 64, 64), (1, 2)),
                                        ((2, 3, 5), (0, 1, 2))])
@pytest.mark.parametrize("name", ["reduce_sum", "reduce_mean"])
def test_trailing_axes_sums(run_op, rng, name, shape, axes, dtype):
    """Sums and means over the last axes (a global average pool; counts at and past the
    BLAS path's limit): within float32's rounding of the float64 sum, with NaN and inf
    carried to their rows alone."""
    builder, _ = REDUCTIONS[name]
    x = rng.standard_normal(shape).astype(dtype)
    x.reshape(-1)[[0, -1]] = np.nan, np.inf
    out = run_op(lambda t: builder(t, axis=axes, keepdims=False), x)
    wide = x.astype(np.float64)
    expected = wide.sum(axis=axes) if name == "reduce_sum" else wide.mean(axis=axes)
    assert out.dtype == x.dtype and out.shape == expected.shape
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4 if dtype == "float32" else 1e-10)
