"""Build, package and run small graphs, and compare their results with numpy.

Every op test goes the whole way a user goes: builder -> `.efl` (a file, or bytes) ->
`ef.Interpreter` -> signature runner. Expected values are numpy expressions written in
the tests themselves, never edgeflow's own kernels.
"""
import itertools
import warnings

import numpy as np

import edgeflow as ef
from edgeflow import dtypes
from edgeflow.format import writer

FLOATS = ("float16", "float32", "float64")
INTS = ("int32", "int64")

# (rtol, atol) per result dtype; references are computed in float64 and compared with
# the op's result in its own dtype, so the tolerance covers its rounding.
_TOLERANCE = {
    np.dtype("float16"): (4e-3, 1e-3),
    np.dtype("float32"): (1e-5, 1e-6),
    np.dtype("float64"): (1e-12, 1e-12),
}

_names = itertools.count()


def compile_graph(graph, inputs, outputs, directory=None):
    """The "infer" signature runner of `graph`, packaged in `directory` (else in memory)."""
    signatures = {"infer": (inputs, outputs)}
    if directory is None:
        source = writer.to_bytes(ef.to_model(graph, signatures))
    else:
        source = str(directory / f"model_{next(_names)}.efl")
        ef.save(graph, source, signatures=signatures)
    return ef.Interpreter(source).get_signature_runner("infer")


def check_static(tensor, array):
    """The tensor's build-time shape (None: unknown) and dtype describe the run-time `array`."""
    assert array.dtype == tensor.dtype, f"{tensor.name}: built as {tensor.dtype}, ran as {array.dtype}"
    assert len(tensor.shape) == array.ndim and all(
        d is None or d == n for d, n in zip(tensor.shape, array.shape)), \
        f"{tensor.name}: built with shape {tensor.shape}, ran with shape {array.shape}"


def run_op(fn, *arrays, shapes=None, directory=None):
    """fn(*placeholders) on placeholders shaped like `arrays` (or `shapes`), run on `arrays`.

    Returns the result array (a tuple when fn returns several Tensors), after checking
    that each Tensor's static shape and dtype match what the interpreter produced.
    """
    arrays = [np.asarray(a) for a in arrays]
    shapes = shapes or [a.shape for a in arrays]
    graph = ef.Graph()
    with graph.as_default():
        holders = [ef.placeholder(a.dtype, s, name=f"x{i}") for i, (a, s) in enumerate(zip(arrays, shapes))]
        result = fn(*holders)
    tensors = result if isinstance(result, tuple) else (result,)
    runner = compile_graph(graph, {f"x{i}": h for i, h in enumerate(holders)},
                           {f"y{i}": t for i, t in enumerate(tensors)}, directory)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # a kernel using a numpy API on its way out
        out = runner(**{f"x{i}": a for i, a in enumerate(arrays)})
    outs = tuple(out[f"y{i}"] for i in range(len(tensors)))
    for t, o in zip(tensors, outs):
        check_static(t, o)
    return outs if isinstance(result, tuple) else outs[0]


def assert_close(actual, expected, dtype, rtol=None, atol=None):
    """`actual` has `dtype` and `expected`'s shape, and equals it (floats: within tolerance;
    bfloat16: `expected` in bfloat16 or a float dtype, compared as float32)."""
    dtype = dtypes.as_dtype(dtype)
    expected = np.asarray(expected)
    assert actual.dtype == dtype, f"dtype {actual.dtype}, expected {dtype}"
    assert actual.shape == expected.shape, f"shape {actual.shape}, expected {expected.shape}"
    if dtype == dtypes.bfloat16:
        wide = dtypes.widen(expected) if expected.dtype == dtypes.bfloat16 else expected
        np.testing.assert_allclose(dtypes.widen(actual), wide, rtol=2.0 ** -8 if rtol is None else rtol,
                                   atol=0 if atol is None else atol)
    elif dtype.kind == "f":
        default_rtol, default_atol = _TOLERANCE[dtype]
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                                   rtol=default_rtol if rtol is None else rtol,
                                   atol=default_atol if atol is None else atol)
    else:
        np.testing.assert_array_equal(actual, expected.astype(dtype))


def random_array(rng, shape, dtype, low=-5.0, high=5.0):
    """Values in [low, high): floats uniform, ints uniform among the integers, bools fair;
    bfloat16: floats uniform, rounded."""
    dtype = dtypes.as_dtype(dtype)
    if dtype == dtypes.bfloat16:
        return dtypes.narrow(rng.uniform(low, high, size=shape))
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(int(np.floor(low)), int(np.ceil(high)), size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)
