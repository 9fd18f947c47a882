"""Ops that select elements by their values: nonzero, compress, unique. How many elements
they give depends on the values, so a plan runs them once those are known and plans what
follows for the sizes they gave (edgeflow/interp/staged.py)."""
import numpy as np

from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define
from .dims import fmt, normalize_axis


def _value(spec):
    """The spec's value as numbers (bfloat16 widened to float32: -0.0 is zero), or None."""
    if spec.value is None:
        return None
    return dtypes.widen(spec.value) if spec.dtype == dtypes.bfloat16 else np.asarray(spec.value)


def _count(spec, fn):
    """fn(value) once the value is known, else None (an unknown dimension)."""
    return None if spec.value is None else int(fn(_value(spec)))


@define("nonzero", types=Types("x: any -> int64"))
def _nonzero(inputs, attrs):
    """The indices of x's non-zero elements, one column per element in row-major order:
    int64 (rank, count), as ONNX's NonZero (a scalar gives (0, count))."""
    x = inputs[0]
    return [TensorSpec((x.rank, _count(x, np.count_nonzero)), dtypes.int64)]


@define("compress", types=Types("x: T, condition: bool -> T", T=dtypes.ANY),
        attrs={"axis": Attr(AttrKind.INT, None)})
def _compress(inputs, attrs):
    """The slices of x along `axis` where `condition` holds (x flattened when no axis);
    a condition shorter than the axis selects among its first slices, as numpy.compress."""
    x, condition = inputs
    if condition.rank != 1:
        raise GraphError(f"compress: condition must be a vector, got {fmt(condition.shape)}")
    axis = None if attrs["axis"] is None else normalize_axis(attrs["axis"], x.rank, "compress")
    length = _num_elements(x.shape) if axis is None else x.shape[axis]
    if None not in (length, condition.shape[0]) and condition.shape[0] > length:
        raise GraphError(f"compress: condition has {condition.shape[0]} entries for {length} slices")
    count = _count(condition, np.count_nonzero)
    if axis is None:
        return [TensorSpec((count,), x.dtype)]
    return [TensorSpec(x.shape[:axis] + (count,) + x.shape[axis + 1:], x.dtype)]


def _num_elements(shape):
    return None if None in shape else int(np.prod(shape, dtype=np.int64))


def unique_count(x, axis):
    """How many distinct elements (axis None) or slices along `axis` x holds."""
    if axis is None:
        return np.unique(x.reshape(-1)).size
    return np.unique(x, axis=axis).shape[axis]


@define("unique", types=Types("x: T -> y: T, indices: int64, inverse_indices: int64, counts: int64",
                              T=dtypes.NUMERIC | {dtypes.bool_, dtypes.bfloat16}),
        attrs={"axis": Attr(AttrKind.INT, None), "sorted": Attr(AttrKind.BOOL, True)})
def _unique(inputs, attrs):
    """The distinct elements of x (flattened when no axis) or its distinct slices along
    `axis`; ascending, or in order of first occurrence if not `sorted`. Also where each
    first occurs in x, which one each element of x is, and how often each occurs."""
    x = inputs[0]
    axis = None if attrs["axis"] is None else normalize_axis(attrs["axis"], x.rank, "unique")
    n = None if x.value is None else unique_count(_value(x), axis)
    length = _num_elements(x.shape) if axis is None else x.shape[axis]
    y = (n,) if axis is None else x.shape[:axis] + (n,) + x.shape[axis + 1:]
    return [TensorSpec(y, x.dtype), TensorSpec((n,), dtypes.int64), TensorSpec((length,), dtypes.int64),
            TensorSpec((n,), dtypes.int64)]
