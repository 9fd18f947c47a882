"""gather_elements, gather_nd, scatter_elements, scatter_nd, one_hot, trilu and argmin against
element-by-element references written from ONNX's definitions."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow import dtypes
from edgeflow.errors import GraphError, InvalidInputError
from edgeflow.graph.math_ops import apply

from .harness import assert_close, random_array

EVERY = tuple(map(dtypes.name, dtypes.ALL))
REDUCTIONS = ("none", "add", "mul", "max", "min")
COMBINE = {"none": lambda old, new: new, "add": lambda a, b: a + b, "mul": lambda a, b: a * b,
           "max": np.maximum, "min": np.minimum}


def _indices(rng, shape, n, dtype="int64"):
    """Indices in [-n, n): both signs, as ONNX allows."""
    return rng.integers(-n, n, size=shape).astype(dtype)


# -- gather_elements -----------------------------------------------------------------------

def gather_elements_reference(data, indices, axis):
    out = np.empty(indices.shape, data.dtype)
    for pos in np.ndindex(*indices.shape):
        source = list(pos)
        source[axis] = indices[pos] % data.shape[axis]
        out[pos] = data[tuple(source)]
    return out


@pytest.mark.parametrize("data_shape,indices_shape,axis", [
    ((3, 4), (2, 4), 0), ((3, 4), (3, 6), 1), ((3, 4), (1, 2), -1), ((2, 3, 4), (2, 3, 5), 2),
    ((2, 3, 4), (2, 1, 4), -2), ((5,), (7,), 0)])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_gather_elements(run_op, rng, data_shape, indices_shape, axis, index_dtype):
    data = random_array(rng, data_shape, "float32")
    indices = _indices(rng, indices_shape, data_shape[axis], index_dtype)
    out = run_op(lambda d, i: apply("gather_elements", [d, i], {"axis": axis}), data, indices)
    assert_close(out, gather_elements_reference(data, indices, axis % len(data_shape)), np.float32)


@pytest.mark.parametrize("dtype", EVERY)
def test_gather_elements_dtypes(run_op, rng, dtype):
    data, indices = random_array(rng, (3, 4), dtype), _indices(rng, (3, 2), 4)
    out = run_op(lambda d, i: apply("gather_elements", [d, i], {"axis": 1}), data, indices)
    assert_close(out, gather_elements_reference(data, indices, 1), dtype)


# -- gather_nd -----------------------------------------------------------------------------

def gather_nd_reference(data, indices, batch_dims):
    k = indices.shape[-1]
    out = np.empty(indices.shape[:-1] + data.shape[batch_dims + k:], data.dtype)
    for pos in np.ndindex(*indices.shape[:-1]):
        where = tuple(int(i) % n for i, n in zip(indices[pos], data.shape[batch_dims:]))
        out[pos] = data[pos[:batch_dims] + where]
    return out


@pytest.mark.parametrize("data_shape,indices_shape,batch_dims", [
    ((4, 3), (2, 1), 0), ((4, 3), (2, 2), 0), ((4, 3), (5, 2, 2), 0), ((2, 3, 4), (2, 1), 0),
    ((2, 3, 4), (2, 2), 1), ((2, 3, 4), (2, 5, 1), 1), ((2, 3, 4, 5), (2, 3, 2), 2), ((4, 3), (2, 0), 0)])
def test_gather_nd(run_op, rng, data_shape, indices_shape, batch_dims):
    data = random_array(rng, data_shape, "float32")
    k = indices_shape[-1]
    columns = [_indices(rng, indices_shape[:-1], n) for n in data_shape[batch_dims:batch_dims + k]]
    indices = np.stack(columns, -1) if k else np.zeros(indices_shape, np.int64)
    out = run_op(lambda d, i: apply("gather_nd", [d, i], {"batch_dims": batch_dims}), data, indices)
    assert_close(out, gather_nd_reference(data, indices, batch_dims), np.float32)


@pytest.mark.parametrize("data_shape,indices_shape,batch_dims", [
    ((4, 3), (2, 2), 0), ((2, 16), (2, 1, 1, 16, 2), 0), ((2, 3, 4), (2, 5, 1), 1), ((2, 3, 4, 5), (2, 3, 2), 2)])
def test_gather_nd_by_constant_indices(compile_graph, graph, rng, data_shape, indices_shape, batch_dims):
    """Indices the model holds as a constant (a dynamo-exported BERT's mask expansion, the
    second shape) are checked and made flat positions when the plan binds: each run takes
    them; negative ones count from the end. An out-of-range one fails the plan, naming the op."""
    k = indices_shape[-1]
    columns = [_indices(rng, indices_shape[:-1], n) for n in data_shape[batch_dims:batch_dims + k]]
    indices = np.stack(columns, -1)
    data = ef.placeholder("float32", data_shape, name="d")
    run = compile_graph(graph, {"d": data}, {"y": apply("gather_nd", [data, ef.constant(indices)],
                                                        {"batch_dims": batch_dims})})
    for seed in range(2):  # new data each run, the same positions
        values = random_array(np.random.default_rng(seed), data_shape, "float32")
        np.testing.assert_array_equal(run(d=values)["y"], gather_nd_reference(values, indices, batch_dims))
    bad = indices.copy()
    bad.reshape(-1, k)[0, 0] = data_shape[batch_dims]
    with ef.Graph().as_default() as other:
        data = ef.placeholder("float32", data_shape, name="d")
        run = compile_graph(other, {"d": data}, {"y": apply("gather_nd", [data, ef.constant(bad)],
                                                            {"batch_dims": batch_dims})})
        with pytest.raises((InvalidInputError, ef.errors.FormatError), match="gather_nd"):
            run(d=np.zeros(data_shape, np.float32))


@pytest.mark.parametrize("dtype", EVERY)
def test_gather_nd_dtypes(run_op, rng, dtype):
    data = random_array(rng, (3, 4), dtype)
    indices = np.array([[0, 1], [-1, -4], [2, 3]], np.int64)
    out = run_op(lambda d, i: apply("gather_nd", [d, i]), data, indices)
    assert_close(out, data[[0, 2, 2], [1, 0, 3]], dtype)


# -- scatter_elements and scatter_nd -------------------------------------------------------

def scatter_elements_reference(data, indices, updates, axis, reduction):
    out = data.copy()
    for pos in np.ndindex(*indices.shape):
        target = list(pos)
        target[axis] = indices[pos] % data.shape[axis]
        out[tuple(target)] = COMBINE[reduction](out[tuple(target)], updates[pos])
    return out


def _distinct_along(rng, shape, axis, n):
    """Indices with no repeat along `axis` (where reduction none leaves the order open)."""
    picks = np.argsort(rng.random(shape[:axis] + (n,) + shape[axis + 1:]), axis=axis)
    return np.take(picks, np.arange(shape[axis]), axis=axis) - rng.integers(0, 2, shape) * n


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("data_shape,indices_shape,axis", [
    ((4, 3), (2, 3), 0), ((4, 3), (4, 2), 1), ((2, 5, 3), (2, 3, 3), -2), ((6,), (4,), 0)])
def test_scatter_elements(run_op, rng, reduction, data_shape, indices_shape, axis):
    data = random_array(rng, data_shape, "float64")
    updates = random_array(rng, indices_shape, "float64")
    rank_axis = axis % len(data_shape)
    if reduction == "none":
        indices = _distinct_along(rng, indices_shape, rank_axis, data_shape[rank_axis])
    else:  # repeats: every update to a place combines with it
        indices = _indices(rng, indices_shape, data_shape[rank_axis])
    out = run_op(lambda d, i, u: apply("scatter_elements", [d, i, u], {"axis": axis, "reduction": reduction}),
                 data, indices, updates)
    assert_close(out, scatter_elements_reference(data, indices, updates, rank_axis, reduction), np.float64)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements_of_whole_slices(run_op, rng, reduction, axis):
    """Indices the same at every position off the axis, spanning data's other axes whole
    (torchvision's MultiScaleRoIAlign putting each level's results back): whole slices
    written at once, the per-element definition's values; repeated and negative indices
    (reductions combine the repeats in order); an index off by one place off the axis takes
    the element path, and an index past the end is refused either way."""
    data = random_array(rng, (5, 4, 3), "float64")
    count = (7, 4, 3)[axis] if axis != -1 else 4  # more than data's along the axis: repeats
    if reduction == "none":  # no repeats: the order is open there
        count = min(count, data.shape[axis])
    shape = list(data.shape)
    shape[axis] = count
    picks = rng.integers(-data.shape[axis], data.shape[axis], count)
    if reduction == "none":
        picks = rng.permutation(data.shape[axis])[:count] - rng.integers(0, 2, count) * data.shape[axis]
    view = [1, 1, 1]
    view[axis] = count
    indices = np.ascontiguousarray(np.broadcast_to(picks.reshape(view), shape)).astype(np.int64)
    updates = random_array(rng, tuple(shape), "float64")
    op = lambda d, i, u: apply("scatter_elements", [d, i, u], {"axis": axis, "reduction": reduction})  # noqa: E731
    rank_axis = axis % 3
    assert_close(run_op(op, data, indices, updates),
                 scatter_elements_reference(data, indices, updates, rank_axis, reduction), np.float64)
    odd = indices.copy()
    odd[(0,) * 3] = (odd[(0,) * 3] + 1) % data.shape[rank_axis]
    assert_close(run_op(op, data, odd, updates), scatter_elements_reference(data, odd, updates, rank_axis, reduction),
                 np.float64)
    bad = indices.copy()
    bad[...] = data.shape[rank_axis]
    with pytest.raises(ef.errors.InvalidInputError, match="out of range"):
        run_op(op, data, bad, updates)


@pytest.mark.parametrize("dtype", EVERY)
def test_scatter_elements_dtypes(run_op, rng, dtype):
    data, updates = random_array(rng, (3, 4), dtype), random_array(rng, (3, 2), dtype)
    indices = np.array([[0, -1], [2, 1], [-4, 3]], np.int32)
    out = run_op(lambda d, i, u: apply("scatter_elements", [d, i, u], {"axis": 1}), data, indices, updates)
    assert_close(out, scatter_elements_reference(data, indices, updates, 1, "none"), dtype)


def scatter_nd_reference(data, indices, updates, reduction):
    out = data.copy()
    for pos in np.ndindex(*indices.shape[:-1]):
        where = tuple(int(i) % n for i, n in zip(indices[pos], data.shape))
        out[where] = COMBINE[reduction](out[where], updates[pos]) if reduction != "none" else updates[pos]
    return out


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("data_shape,indices_shape", [((5, 3), (4, 1)), ((4, 3), (3, 2)), ((2, 3, 4), (2, 2, 2)),
                                                     ((6, 4), (2, 3, 1))])
def test_scatter_nd(run_op, rng, reduction, data_shape, indices_shape):
    k = indices_shape[-1]
    count = int(np.prod(indices_shape[:-1]))
    places = rng.choice(int(np.prod(data_shape[:k])), count, replace=reduction != "none")
    indices = np.stack(np.unravel_index(places, data_shape[:k]), -1)
    indices = (indices - rng.integers(0, 2, indices.shape) * np.array(data_shape[:k])).reshape(indices_shape)
    updates = random_array(rng, indices_shape[:-1] + data_shape[k:], "float32")
    data = random_array(rng, data_shape, "float32")
    out = run_op(lambda d, i, u: apply("scatter_nd", [d, i, u], {"reduction": reduction}), data, indices, updates)
    assert_close(out, scatter_nd_reference(data, indices, updates, reduction), np.float32)


@pytest.mark.parametrize("dtype", EVERY)
def test_scatter_nd_dtypes(run_op, rng, dtype):
    data, updates = random_array(rng, (4, 3), dtype), random_array(rng, (2, 3), dtype)
    indices = np.array([[-1], [1]], np.int64)
    out = run_op(lambda d, i, u: apply("scatter_nd", [d, i, u]), data, indices, updates)
    assert_close(out, scatter_nd_reference(data, indices, updates, "none"), dtype)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("index", [0, 2, -1, -3])
def test_gather_of_one_index_is_numpys_take(run_op, rng, axis, index):
    data = random_array(rng, (3, 4, 5), "float32")
    out = run_op(lambda d, i: apply("gather", [d, i], {"axis": axis}), data, np.array(index, np.int64))
    assert_close(out, np.take(data, index, axis=axis), np.float32)


# -- hostile indices -----------------------------------------------------------------------

HOSTILE = [
    ("gather", lambda d, i: [d, i], {"axis": 0}, (4, 3), 4),  # one index
    ("gather", lambda d, i: [d, i], {"axis": 1}, (4, 3), -4),
    ("gather", lambda d, i: [d, i], {"axis": 1}, (4, 3), [[-4, 0]]),
    ("gather_elements", lambda d, i: [d, i], {"axis": 0}, (4, 3), [[0, 4, 1]]),
    ("gather_elements", lambda d, i: [d, i], {"axis": 1}, (4, 3), [[-4, 0, 1]]),
    ("gather_nd", lambda d, i: [d, i], {}, (4, 3), [[0, 3]]),
    ("gather_nd", lambda d, i: [d, i], {}, (4, 3), [[-5, 0]]),
    ("scatter_elements", lambda d, i: [d, i, ef.constant(np.ones((1, 3), np.float32))],
     {"axis": 0}, (4, 3), [[0, 2**40, 1]]),
    ("scatter_nd", lambda d, i: [d, i, ef.constant(np.ones((1, 3), np.float32))], {}, (4, 3), [[4]]),
    ("scatter_nd", lambda d, i: [d, i, ef.constant(np.ones((1,), np.float32))], {"reduction": "add"},
     (4, 3), [[1, -4]]),
]


@pytest.mark.parametrize("op,operands,attrs,data_shape,bad", HOSTILE,
                         ids=[f"{h[0]}-{i}" for i, h in enumerate(HOSTILE)])
def test_out_of_range_indices_are_invalid_input(compile_graph, graph, op, operands, attrs, data_shape, bad):
    bad = np.array(bad, np.int64)
    data = ef.placeholder("float32", data_shape, name="d")
    indices = ef.placeholder("int64", bad.shape, name="i")
    run = compile_graph(graph, {"d": data, "i": indices}, {"y": apply(op, operands(data, indices), attrs)})
    with pytest.raises(InvalidInputError, match=op):
        run(d=np.zeros(data_shape, np.float32), i=bad)
    # Still usable with indices in range.
    run(d=np.zeros(data_shape, np.float32), i=np.zeros_like(bad))


def test_indices_wider_than_data_off_the_axis_are_invalid_input(compile_graph, graph):
    data, indices = ef.placeholder("float32", (4, 3), name="d"), ef.placeholder("int64", (1, None), name="i")
    run = compile_graph(graph, {"d": data, "i": indices}, {"y": apply("gather_elements", [data, indices])})
    with pytest.raises(InvalidInputError, match="gather_elements"):
        run(d=np.zeros((4, 3), np.float32), i=np.zeros((1, 4), np.int64))


@pytest.mark.parametrize("op,inputs,attrs", [
    ("gather_elements", [(3, 4), (3,)], {}),  # ranks differ
    ("gather_elements", [(3, 4), (3, 4)], {"axis": 2}),
    ("gather_nd", [(3, 4), (2, 3)], {}),  # tuples longer than data's rank
    ("gather_nd", [(3, 4), (3, 1)], {"batch_dims": 2}),
    ("scatter_elements", [(3, 4), (2, 4), (2, 3)], {}),  # updates not shaped like indices
    ("scatter_elements", [(3, 4), (2, 4), (2, 4)], {"reduction": "sub"}),
    ("scatter_nd", [(3, 4), (2, 1), (2, 3)], {}),
    ("trilu", [(3,)], {}),
])
def test_shape_errors(graph, op, inputs, attrs):
    specs = [ef.placeholder("float32" if n != 1 else "int64", s) for n, s in enumerate(inputs)]
    with pytest.raises(GraphError, match=op):
        apply(op, specs, attrs)


# -- one_hot -------------------------------------------------------------------------------

def one_hot_reference(indices, depth, values, axis):
    axis = axis % (indices.ndim + 1)
    out = np.full(indices.shape[:axis] + (depth,) + indices.shape[axis:], values[0])
    for pos in np.ndindex(*indices.shape):
        i = int(indices[pos])
        if -depth <= i < depth:
            out[pos[:axis] + (i % depth,) + pos[axis:]] = values[1]
    return out


@pytest.mark.parametrize("axis", [-1, 0, 1, -3, 2])
@pytest.mark.parametrize("index_dtype", ["int64", "int32", "float32", "uint8"])
def test_one_hot(run_op, rng, axis, index_dtype):
    indices = rng.integers(-7 if index_dtype != "uint8" else 0, 7, size=(2, 3)).astype(index_dtype)
    values = np.array([-2.0, 3.5], np.float32)
    out = run_op(lambda i, v: apply("one_hot", [i, v], {"depth": 5, "axis": axis}), indices, values)
    assert_close(out, one_hot_reference(indices, 5, values, axis), np.float32)


@pytest.mark.parametrize("dtype", EVERY)
def test_one_hot_value_dtypes(run_op, rng, dtype):
    indices, values = np.array([0, -1, 3, 9]), random_array(rng, (2,), dtype)
    out = run_op(lambda i, v: apply("one_hot", [i, v], {"depth": 4}), indices, values)
    assert_close(out, one_hot_reference(indices, 4, values, -1), dtype)


# -- trilu ---------------------------------------------------------------------------------

def trilu_reference(x, k, upper):
    rows, cols = np.indices(x.shape[-2:])
    keep = cols - rows >= k if upper else cols - rows <= k
    return np.where(keep, x, np.zeros_like(x))


@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("k", [0, 1, -1, 3, -5, 100, -100])
@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (2, 5, 3), (0, 3)])
def test_trilu(run_op, rng, upper, k, shape):
    x = random_array(rng, shape, "float32")
    assert_close(run_op(lambda t: apply("trilu", [t], {"upper": upper, "k": k}), x),
                 trilu_reference(x, k, upper), np.float32)
    # k as a run-time operand
    out = run_op(lambda t, kk: apply("trilu", [t, kk], {"upper": upper}), x, np.array(k, np.int64))
    assert_close(out, trilu_reference(x, k, upper), np.float32)


@pytest.mark.parametrize("dtype", EVERY)
def test_trilu_dtypes(run_op, rng, dtype):
    x = random_array(rng, (3, 4), dtype)
    assert_close(run_op(lambda t: apply("trilu", [t], {"upper": False, "k": 1}), x), trilu_reference(x, 1, False),
                 dtype)


# -- argmin --------------------------------------------------------------------------------

def arg_reference(x, axis, keepdims, last, better):
    """The first (last) index along `axis` of the value no other beats."""
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape[:-1], np.int64)
    for pos in np.ndindex(*out.shape):
        row = moved[pos]
        best = 0
        for j in range(1, len(row)):
            if better(row[j], row[best]) or (last and row[j] == row[best]):
                best = j
        out[pos] = best
    return np.expand_dims(out, axis) if keepdims else out


@pytest.mark.parametrize("op,better", [("argmin", lambda a, b: a < b), ("argmax", lambda a, b: a > b)])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [True, False])
@pytest.mark.parametrize("last", [True, False])
def test_argmin_argmax(run_op, rng, op, better, axis, keepdims, last):
    x = rng.integers(0, 3, size=(3, 4, 5)).astype(np.float32)  # many ties
    out = run_op(lambda t: apply(op, [t], {"axis": axis, "keepdims": keepdims, "select_last_index": last}), x)
    assert_close(out, arg_reference(x, axis % 3, keepdims, last, better), np.int64)


@pytest.mark.parametrize("dtype", EVERY)
def test_argmin_dtypes(run_op, rng, dtype):
    x = random_array(rng, (4, 3), dtype)
    out = run_op(lambda t: apply("argmin", [t], {"axis": 0}), x)
    values = dtypes.widen(x) if x.dtype == dtypes.bfloat16 else x
    assert_close(out, arg_reference(values, 0, False, False, lambda a, b: a < b), np.int64)


# -- reverse_sequence -----------------------------------------------------------------------

def reverse_sequence_reference(x, lens, batch_axis, time_axis):
    """Entry by entry: the first lens[b] steps reversed with Python slicing."""
    out = np.array(x)
    for b, n in enumerate(lens):
        entry = [slice(None)] * x.ndim
        entry[batch_axis], entry[time_axis] = b, slice(0, n)
        out[tuple(entry)] = x[tuple(entry)][::-1]  # the time axis comes first once b indexes the batch
    return out


@pytest.mark.parametrize("batch_axis, time_axis", [(1, 0), (0, 1)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "int8", "uint8", "bool"])
def test_reverse_sequence(run_op, rng, batch_axis, time_axis, dtype):
    shape = [0, 0, 3, 2]
    shape[batch_axis], shape[time_axis] = 4, 5
    x = random_array(rng, tuple(shape), dtype, -50, 50)
    lens = np.array([5, 0, 1, 3], np.int64)
    got = run_op(lambda t, n: apply("reverse_sequence", [t, n], {"batch_axis": batch_axis, "time_axis": time_axis}),
                 x, lens)
    np.testing.assert_array_equal(got, reverse_sequence_reference(x, lens, batch_axis, time_axis))
    from .onnx_reference import onnx_reference
    if dtype != "float16":
        np.testing.assert_array_equal(got, onnx_reference("ReverseSequence", [x, lens], [x.dtype], opset=10,
                                                          batch_axis=batch_axis, time_axis=time_axis)[0])


def test_reverse_sequence_invalid(graph, run_op):
    x = ef.placeholder("float32", (4, 3))
    with pytest.raises(GraphError, match="one length per batch entry"):
        apply("reverse_sequence", [x, ef.placeholder("int64", (4,))], {})
    with pytest.raises(GraphError, match="batch_axis"):
        apply("reverse_sequence", [x, ef.placeholder("int64", (3,))], {"batch_axis": 1, "time_axis": 1})
    with pytest.raises(GraphError, match="int64"):
        apply("reverse_sequence", [x, ef.placeholder("int32", (3,))], {})
    with pytest.raises(InvalidInputError, match="sequence length"):
        run_op(lambda t, n: apply("reverse_sequence", [t, n], {}), np.ones((4, 3), np.float32),
               np.array([1, 5, 2], np.int64))


# -- eye_like ---------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [0, 1, -2, 4, -3])
@pytest.mark.parametrize("shape", [(3, 3), (2, 5), (4, 2)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "uint8", "bool", "float16"])
def test_eye_like(run_op, rng, shape, k, dtype):
    x = random_array(rng, shape, "int32", 0, 9)
    got = run_op(lambda t: apply("eye_like", [t], {"k": k, "dtype": dtype}), x)
    rows, cols = np.indices(shape)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, (cols - rows == k).astype(dtype))


def test_eye_like_invalid(graph):
    with pytest.raises(GraphError, match="matrix"):
        apply("eye_like", [ef.placeholder("float32", (2, 2, 2))], {"dtype": "float32"})
