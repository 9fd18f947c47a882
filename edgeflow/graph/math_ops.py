"""Builder functions for ops, at the top level as in TensorFlow (`ef.exp`, `ef.matmul`, ...).

Each one adds a node to the graph of its tensor inputs (the default graph when none is
a Tensor); the op itself is defined in edgeflow.ops. TensorFlow's names `abs`, `pow`, `slice` and
`range` are defined here, so code in this module must write `builtins.range` for Python's.
"""
import numpy as np

from .. import dtypes
from ..errors import GraphError
from .graph import Tensor, convert_to_tensor, get_default_graph

__all__ = ["add", "subtract", "sub", "multiply", "mul", "divide", "div", "pow", "maximum", "minimum",
           "equal", "less", "greater", "less_equal", "greater_equal", "logical_and", "logical_or",
           "logical_not", "sin", "cos", "negative", "neg", "abs", "exp", "log", "sqrt", "sigmoid",
           "tanh", "matmul", "where", "cast", "reduce_sum", "reduce_mean", "reduce_max", "argmax",
           "reshape", "transpose", "concat", "squeeze", "expand_dims", "slice", "strided_slice",
           "gather", "shape", "fill", "range", "broadcast_to", "tile", "split"]


def apply(op, inputs, attrs=None, name=None):
    """Add op `op` on `inputs` (Tensors, arrays or scalars); return its output Tensor(s)."""
    tensors = [v for v in inputs if isinstance(v, Tensor)]
    graph = get_default_graph()  # inside a cond branch or loop body: that subgraph
    if tensors and not all(map(graph.owns, tensors)) and getattr(graph, "parent", None) is None:
        graph = tensors[0].graph  # a graph that is not the default one
    hint = tensors[0].dtype if tensors else None
    with graph.as_default():
        inputs = [convert_to_tensor(v, hint) for v in inputs]
        node = graph.add_op(op, inputs, attrs, name)
    return node.outputs[0] if len(node.outputs) == 1 else tuple(node.outputs)


def _unary(op, doc):
    def fn(x, name=None):
        return apply(op, [x], name=name)
    fn.__name__, fn.__doc__ = op, doc
    return fn


def _binary(op, doc):
    def fn(x, y, name=None):
        return apply(op, [x, y], name=name)
    fn.__name__, fn.__doc__ = op, doc
    return fn


add = _binary("add", "x + y, elementwise with broadcasting.")
subtract = sub = _binary("sub", "x - y, elementwise with broadcasting.")
multiply = mul = _binary("mul", "x * y, elementwise with broadcasting.")
divide = div = _binary("div", "x / y; integer division truncates toward zero.")
pow = _binary("pow", "x ** y for floats.")  # noqa: A001  (TensorFlow's name)
maximum = _binary("maximum", "The larger of x and y, elementwise.")
minimum = _binary("minimum", "The smaller of x and y, elementwise.")
equal = _binary("equal", "x == y as bool, elementwise.")
less = _binary("less", "x < y as bool, elementwise.")
greater = _binary("greater", "x > y as bool, elementwise.")
less_equal = _binary("less_equal", "x <= y as bool, elementwise.")
greater_equal = _binary("greater_equal", "x >= y as bool, elementwise.")
logical_and = _binary("logical_and", "x and y, elementwise on bools.")
logical_or = _binary("logical_or", "x or y, elementwise on bools.")
logical_not = _unary("logical_not", "not x, elementwise on bools.")
sin = _unary("sin", "Sine.")
cos = _unary("cos", "Cosine.")
negative = neg = _unary("neg", "-x.")
abs = _unary("abs", "|x|.")  # noqa: A001
exp = _unary("exp", "e ** x.")
log = _unary("log", "Natural logarithm.")
sqrt = _unary("sqrt", "Square root.")
sigmoid = _unary("sigmoid", "1 / (1 + exp(-x)).")
tanh = _unary("tanh", "Hyperbolic tangent.")


def matmul(a, b, transpose_a=False, transpose_b=False, name=None):
    """Matrix product of the last two axes, batched over the leading ones (numpy's rules)."""
    return apply("matmul", [a, b], {"transpose_a": transpose_a, "transpose_b": transpose_b}, name)


def where(condition, x, y, name=None):
    """Elements of x where condition holds, else of y."""
    # Plain values take the dtype of the other branch (not of the bool condition).
    tensors = [v for v in (x, y, condition) if isinstance(v, Tensor)]
    with (tensors[0].graph if tensors else get_default_graph()).as_default():
        hint = tensors[0].dtype if tensors and tensors[0] is not condition else None
        x, y = (convert_to_tensor(v, hint) for v in (x, y))
        condition = convert_to_tensor(condition, dtypes.bool_)
    return apply("where", [condition, x, y], name=name)


def convert_to_tensor_like(value, like):
    with like.graph.as_default():
        return convert_to_tensor(value, like.dtype)


def cast(x, dtype, name=None):
    return apply("cast", [x], {"dtype": dtypes.as_dtype(dtype)}, name)


def _axes(axis):
    if axis is None:
        return ()
    return tuple(int(a) for a in np.atleast_1d(axis))


def _reduce(op, x, axis, keepdims, name):
    if axis is not None and len(_axes(axis)) == 0:
        return x  # reducing over no axis is the identity, as in TensorFlow
    return apply(op, [x], {"axes": _axes(axis), "keepdims": keepdims}, name)


def reduce_sum(x, axis=None, keepdims=False, name=None):
    """Sum over `axis` (an int, a list, or None for all)."""
    return _reduce("reduce_sum", x, axis, keepdims, name)


def reduce_mean(x, axis=None, keepdims=False, name=None):
    """Mean over `axis` (an int, a list, or None for all)."""
    return _reduce("reduce_mean", x, axis, keepdims, name)


def reduce_max(x, axis=None, keepdims=False, name=None):
    """Maximum over `axis` (an int, a list, or None for all)."""
    return _reduce("reduce_max", x, axis, keepdims, name)


def argmax(x, axis=0, keepdims=False, name=None):
    """int64 index of the largest element along `axis`."""
    return apply("argmax", [x], {"axis": axis, "keepdims": keepdims}, name)


def reshape(x, shape, name=None):
    """Same elements, new shape (a list, or an int tensor such as one from ef.shape);
    one dimension may be -1."""
    if isinstance(shape, Tensor):
        return apply("reshape", [x, shape], name=name)
    return apply("reshape", [x], {"shape": tuple(int(d) for d in shape)}, name)


def _int_operand(value, like):
    """An int64 tensor operand: a Tensor as is, a list or number as a constant."""
    if isinstance(value, Tensor):
        return value
    return convert_to_tensor_like(np.asarray(value, np.int64), like) if isinstance(like, Tensor) \
        else convert_to_tensor(np.asarray(value, np.int64))


def shape(x, name=None):
    """The shape of x as an int64 vector (known while building when x's shape is)."""
    return apply("shape", [x], name=name)


def fill(dims, value, dtype=None, name=None):
    """A tensor of shape `dims` (a list or an int tensor) filled with `value`."""
    if dtype is None:  # from a Python value: float32 or int32, as TensorFlow's
        dtype = np.asarray(value).dtype
        dtype = dtypes.float32 if dtype == np.float64 else dtypes.int32 if dtype == np.int64 else dtype
    dtype = dtypes.as_dtype(dtype)
    return apply("constant_of_shape", [_int_operand(dims, dims)],
                 {"value": float(value), "dtype": dtype}, name)


def range(start, limit=None, delta=1, dtype=None, name=None):  # noqa: A001  (TensorFlow's name)
    """start, start + delta, ... below limit (`range(n)` counts from 0), as tf.range."""
    if limit is None:
        start, limit = 0, start
    values = [start, limit, delta]
    tensors = [v for v in values if isinstance(v, Tensor)]
    if dtype is not None:
        dt = dtypes.as_dtype(dtype)
    elif tensors:
        dt = tensors[0].dtype
    else:  # Python numbers: float32 or int32, as in TensorFlow
        dt = {np.dtype(np.float64): dtypes.float32, np.dtype(np.int64): dtypes.int32}.get(
            np.asarray(values).dtype, np.asarray(values).dtype)
    like = tensors[0] if tensors else None
    ops = [v if isinstance(v, Tensor) else
           (convert_to_tensor_like(dtypes.array(v, dt), like) if like is not None else
            convert_to_tensor(dtypes.array(v, dt))) for v in values]
    return apply("range", ops, name=name)


def broadcast_to(x, shape, name=None):
    """x broadcast to `shape` (a list or an int tensor)."""
    return apply("expand", [x, _int_operand(shape, x)], name=name)


def tile(x, multiples, name=None):
    """x repeated multiples[i] times along axis i."""
    return apply("tile", [x, _int_operand(multiples, x)], name=name)


def split(x, num_or_size_splits, axis=0, name=None):
    """A list of pieces of x along `axis`: `n` near-equal ones, or of the sizes given."""
    if isinstance(num_or_size_splits, (int, np.integer)):
        attrs = {"axis": axis, "num_outputs": int(num_or_size_splits)}
    else:
        attrs = {"axis": axis, "sizes": tuple(int(n) for n in num_or_size_splits)}
    out = apply("split", [x], attrs, name)
    return list(out) if isinstance(out, tuple) else [out]


def transpose(x, perm=None, name=None):
    return apply("transpose", [x], {"perm": tuple(perm) if perm is not None else ()}, name)


def concat(values, axis, name=None):
    """Join a list of tensors along `axis`."""
    return apply("concat", list(values), {"axis": axis}, name)


def squeeze(x, axis=None, name=None):
    """Drop size-1 dimensions (those in `axis`, or all known ones)."""
    x = convert_to_tensor(x) if not isinstance(x, Tensor) else x
    axes = _axes(axis) or tuple(i for i, d in enumerate(x.shape) if d == 1)
    return apply("squeeze", [x], {"axes": axes}, name)


def expand_dims(x, axis, name=None):
    """Insert a size-1 dimension at `axis`."""
    return apply("expand_dims", [x], {"axes": (int(axis),)}, name)


def slice(x, begin, size, name=None):  # noqa: A001  (TensorFlow's name)
    """x[begin : begin + size] per axis; a size of -1 takes the rest of that axis."""
    if any(b < 0 for b in begin) or any(z < -1 for z in size):
        raise GraphError(f"slice: begin must be >= 0 and size >= -1, got begin={list(begin)}, "
                         f"size={list(size)} (use x[a:b] or ef.strided_slice for negative starts)")
    ends = tuple(2**62 if s == -1 else b + s for b, s in zip(begin, size))
    return apply("slice", [x], {"starts": tuple(begin), "ends": ends}, name)


def strided_slice(x, starts, ends, axes=None, steps=None, name=None):
    """ONNX-style slice: x[starts:ends:steps] along `axes`."""
    return apply("slice", [x], {"starts": tuple(starts), "ends": tuple(ends),
                                "axes": tuple(axes or ()), "steps": tuple(steps or ())}, name)


def gather(params, indices, axis=0, name=None):
    """Slices of `params` along `axis` at `indices`."""
    if not isinstance(indices, Tensor):
        indices = convert_to_tensor_like(np.asarray(indices, np.int64), params)
    return apply("gather", [params, indices], {"axis": axis}, name)


def _getitem(x, key):
    """Basic indexing: ints, slices with steps, and Ellipsis; ints drop their axis."""
    key = key if isinstance(key, tuple) else (key,)
    if key.count(Ellipsis) > 1:
        raise IndexError("only one Ellipsis allowed")
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (np.s_[:],) * (len(x.shape) - len(key) + 1) + key[i + 1:]
    if len(key) > len(x.shape):
        raise IndexError(f"too many indices ({len(key)}) for a tensor of rank {len(x.shape)}")
    starts, ends, axes, steps, drop = [], [], [], [], []
    for axis, k in enumerate(key):
        if isinstance(k, (int, np.integer)):
            n = x.shape[axis]
            if n is not None and not -n <= k < n:
                raise IndexError(f"index {k} is out of range for axis {axis} of size {n}")
            k, _ = int(k), drop.append(axis)
            starts.append(k), ends.append(k + 1 if k != -1 else 2**62), axes.append(axis), steps.append(1)
        elif isinstance(k, type(np.s_[:])):
            step = 1 if k.step is None else k.step
            lo, hi = (0, 2**62) if step > 0 else (-1, -2**62)
            starts.append(lo if k.start is None else k.start)
            ends.append(hi if k.stop is None else k.stop)
            axes.append(axis), steps.append(step)
        else:
            raise TypeError(f"unsupported index {k!r}; use ef.gather for tensor indices")
    out = strided_slice(x, starts, ends, axes, steps) if axes else x
    return squeeze(out, drop) if drop else out


def _reflect(fn):
    return lambda self, other: fn(other, self)


Tensor.__add__, Tensor.__radd__ = add, _reflect(add)
Tensor.__sub__, Tensor.__rsub__ = subtract, _reflect(subtract)
Tensor.__mul__, Tensor.__rmul__ = multiply, _reflect(multiply)
Tensor.__truediv__, Tensor.__rtruediv__ = divide, _reflect(divide)
Tensor.__pow__, Tensor.__rpow__ = pow, _reflect(pow)
Tensor.__matmul__, Tensor.__rmatmul__ = matmul, _reflect(matmul)
Tensor.__neg__, Tensor.__abs__ = negative, abs
Tensor.__lt__, Tensor.__gt__ = less, greater
Tensor.__getitem__ = _getitem
