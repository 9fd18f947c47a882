"""Ops that make or reshape tensors from shape values: shape, constant_of_shape, eye_like,
range, expand, tile, split.

Operands that decide an output's shape (a target shape, a repeat count, a limit) are
tensors, as in ONNX. While building, their values may be unknown (they depend on a
dynamic dimension): the dimensions they decide are then None. When a plan is made every
shape must be known, so such operands must then be constants or computed from shapes,
which the interpreter works out while preparing.
"""
import numpy as np

from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define, gradient
from .dims import broadcast, fmt, normalize_axis, vector_length


def known_ints(op, spec, what):
    """The values of a 1-D or scalar operand (declared `index`), or None while they are unknown."""
    if spec.rank > 1:
        raise GraphError(f"{op}: {what} must be a vector, got {spec.dtype}{fmt(spec.shape)}")
    if spec.value is None:
        return None
    return tuple(int(v) for v in np.asarray(spec.value).reshape(-1))


def unknown_dims(op, spec, what):
    return (None,) * vector_length(op, spec, what)


@define("shape", types=Types("x: any -> int64"),
        attrs={"start": Attr(AttrKind.INT, 0), "end": Attr(AttrKind.INT, 2**62)})
def _shape(inputs, attrs):
    """The shape of x (dims start:end) as int64; its value is known once x's shape is."""
    dims = inputs[0].shape[slice(attrs["start"], attrs["end"])]
    value = None if None in dims else np.array(dims, np.int64)
    return [TensorSpec((len(dims),), dtypes.int64, value)]


@define("constant_of_shape", types=Types("shape: index -> dtype"),
        attrs={"value": Attr(AttrKind.FLOAT, 0.0), "dtype": Attr(AttrKind.DTYPE, dtypes.float32)})
def _constant_of_shape(inputs, attrs):
    """A tensor of shape `shape` (an operand) filled with `value`."""
    shape = known_ints("constant_of_shape", inputs[0], "the shape")
    if shape is None:
        return [TensorSpec(unknown_dims("constant_of_shape", inputs[0], "the shape"), attrs["dtype"])]
    if any(d < 0 for d in shape):
        raise GraphError(f"constant_of_shape: negative dimension in {shape}")
    return [TensorSpec(shape, attrs["dtype"])]


@define("eye_like", types=Types("x: any -> dtype"),
        attrs={"k": Attr(AttrKind.INT, 0), "dtype": Attr(AttrKind.DTYPE)})
def _eye_like(inputs, attrs):
    """Ones on diagonal k (above the main one for k > 0) of a matrix shaped like x, zeros
    elsewhere (ONNX's EyeLike)."""
    x = inputs[0]
    if x.rank != 2:
        raise GraphError(f"eye_like: x must be a matrix, got {fmt(x.shape)}")
    return [TensorSpec(x.shape, attrs["dtype"])]


@define("range", types=Types("start: T, limit: T, delta: T -> T", T=dtypes.NUMERIC | {dtypes.bfloat16}))
def _range(inputs, attrs):
    """start, start + delta, ... up to (not including) limit; scalars of one dtype."""
    if any(s.rank not in (0, 1) for s in inputs):
        raise GraphError("range: start, limit and delta must be scalars")
    dt = inputs[0].dtype
    if any(s.value is None for s in inputs):
        return [TensorSpec((None,), dt)]
    values = (dtypes.widen(s.value) if dt == dtypes.bfloat16 else s.value for s in inputs)
    start, limit, delta = (np.asarray(v).reshape(()).item() for v in values)
    if delta == 0:
        raise GraphError("range: delta must not be 0")
    return [TensorSpec((max(int(np.ceil((limit - start) / delta)), 0),), dt)]


@define("expand", types=Types("x: T, shape: index -> T", T=dtypes.ANY))
def _expand(inputs, attrs):
    """x broadcast against `shape` (an operand), as ONNX Expand does."""
    x, shape = inputs[0], known_ints("expand", inputs[1], "the shape")
    if shape is None:
        shape = unknown_dims("expand", inputs[1], "the shape")
    return [TensorSpec(broadcast(x.shape, shape), x.dtype)]


@define("tile", types=Types("x: T, repeats: index -> T", T=dtypes.ANY))
def _tile(inputs, attrs):
    """x repeated `repeats[i]` times along each axis i."""
    x, repeats = inputs[0], known_ints("tile", inputs[1], "repeats")
    if repeats is None:
        vector_length("tile", inputs[1], "repeats")
        return [TensorSpec((None,) * x.rank, x.dtype)]
    if len(repeats) != x.rank or any(r < 0 for r in repeats):
        raise GraphError(f"tile: repeats {repeats} must give one count >= 0 per axis of {fmt(x.shape)}")
    return [TensorSpec(tuple(None if d is None else d * r for d, r in zip(x.shape, repeats)), x.dtype)]


def split_sizes(dim, sizes, num_outputs):
    """Sizes of the pieces: as given, or `num_outputs` near-equal ones (the last smaller)."""
    if sizes:
        if dim is not None and sum(sizes) != dim:
            raise GraphError(f"split: sizes {sizes} do not add up to the dimension {dim}")
        return sizes
    if dim is None:
        return (None,) * num_outputs
    chunk = -(-dim // num_outputs)
    return tuple(max(min(chunk, dim - i * chunk), 0) for i in range(num_outputs))


def _split_outputs(attrs):
    return len(attrs["sizes"]) or attrs["num_outputs"]


def _pieces_unknown(own, attrs, operands):
    x = own[0]
    axis = normalize_axis(attrs["axis"], x.rank, "split")
    return [TensorSpec(x.shape[:axis] + (None,) + x.shape[axis + 1:], x.dtype)] * attrs["num_outputs"]


@define("split", outputs=_split_outputs, types=Types("x: T, sizes: index? -> T+", T=dtypes.ANY),
        attrs={"axis": Attr(AttrKind.INT, 0), "sizes": Attr(AttrKind.INTS, ()),
               "num_outputs": Attr(AttrKind.INT, 0)}, operands=("sizes",), unknown=_pieces_unknown)
def _split(inputs, attrs):
    """Cut x along `axis` into pieces of `sizes`, or into `num_outputs` near-equal pieces."""
    x = inputs[0]
    if not attrs["sizes"] and attrs["num_outputs"] < 1:
        raise GraphError("split: give sizes or num_outputs >= 1")
    if any(s < 0 for s in attrs["sizes"]):
        raise GraphError(f"split: negative size in {attrs['sizes']}")
    if attrs["sizes"] and attrs["num_outputs"] not in (0, len(attrs["sizes"])):
        raise GraphError(f"split: {len(attrs['sizes'])} sizes {attrs['sizes']} for {attrs['num_outputs']} outputs")
    axis = normalize_axis(attrs["axis"], x.rank, "split")
    pieces = split_sizes(x.shape[axis], attrs["sizes"], attrs["num_outputs"])
    return [TensorSpec(x.shape[:axis] + (n,) + x.shape[axis + 1:], x.dtype) for n in pieces]


# -- gradients -----------------------------------------------------------------------------

@gradient("split")
def _split_grad(g, op, grads):
    pieces = [gr if gr is not None else g.zeros_like(out) for gr, out in zip(grads, op.outputs)]
    return [g("concat", *pieces, axis=op.attrs["axis"])]


@gradient("expand")
def _expand_grad(g, op, grads):
    return [g.sum_to(grads[0], op.inputs[0]), None]


@gradient("tile")
def _tile_grad(g, op, grads):
    """Each tile's gradient, summed: view dy as (r0, d0, r1, d1, ...) and sum the r axes."""
    x = op.inputs[0]
    repeats = known_ints("tile", op.inputs[1].spec, "repeats")
    if repeats is None or None in x.shape:
        raise GraphError("tile: gradients need the repeats and x's shape known while building")
    blocks = g("reshape", grads[0], shape=tuple(v for r, d in zip(repeats, x.shape) for v in (r, d)))
    return [g("reduce_sum", blocks, axes=tuple(range(0, 2 * x.rank, 2)), keepdims=False), None]
