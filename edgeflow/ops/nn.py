"""Neural-network activations and normalizing functions."""
from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define, gradient
from .dims import fmt, normalize_axis, one_shape


@define("relu", types=Types("x: T -> T", T=dtypes.NUMERIC))
def _relu(inputs, attrs):
    """max(x, 0)."""
    return [TensorSpec(inputs[0].shape, inputs[0].dtype)]


def _along_axis(name):
    def infer(inputs, attrs):
        normalize_axis(attrs["axis"], inputs[0].rank, name)
        return [TensorSpec(inputs[0].shape, inputs[0].dtype)]
    return infer


# hardmax: 1 at the first maximum along `axis`, 0 elsewhere (ONNX's Hardmax, opset 13).
# All take bfloat16 (computed in float32).
for _name in ("softmax", "log_softmax", "hardmax"):
    define(_name, attrs={"axis": Attr(AttrKind.INT, -1)},
           types=Types("x: T -> T", T=dtypes.FLOATS | {dtypes.bfloat16}))(
        _along_axis(_name))


@define("lrn", types=Types("x: T -> T", T=dtypes.FLOATS),
        attrs={"size": Attr(AttrKind.INT), "alpha": Attr(AttrKind.FLOAT, 1e-4),
               "beta": Attr(AttrKind.FLOAT, 0.75), "bias": Attr(AttrKind.FLOAT, 1.0)})
def _lrn(inputs, attrs):
    """Local response normalization across channels (ONNX's LRN): x / (bias + alpha / size *
    sum of x^2 over channels c - (size - 1) // 2 .. c + size // 2) ^ beta; x is (N, C, ...)."""
    x = inputs[0]
    if x.rank < 3:
        raise GraphError(f"lrn: x must be (N, C, spatial...), got {fmt(x.shape)}")
    if attrs["size"] < 1:
        raise GraphError(f"lrn: size must be >= 1, got {attrs['size']}")
    return [TensorSpec(x.shape, x.dtype)]


# -- gradients -----------------------------------------------------------------------------

@gradient("relu")
def _relu_grad(g, op, grads):
    x = op.inputs[0]
    if x.dtype not in dtypes.FLOATS:
        zero = g.constant(0, x)
        return [g("where", g("greater", x, zero), grads[0], zero)]
    return [g("relu_grad", grads[0], x)]


@define("relu_grad", types=Types("dy: T, x: T -> T", T=dtypes.FLOATS))
def _relu_grad_op(inputs, attrs):
    """relu's gradient, one pass (TensorFlow's ReluGrad): dy where x > 0, else 0 (x = 0
    and NaN included)."""
    dy, x = inputs
    return [TensorSpec(one_shape("relu_grad", dy, x, ("dy", "x")), dy.dtype)]


@gradient("relu_grad")
def _relu_grad_grad(g, op, grads):
    """Linear in dy, with the same mask; x's gradient is 0 wherever it exists."""
    return [g("relu_grad", grads[0], op.inputs[1]), None]


@gradient("softmax")
def _softmax_grad(g, op, grads):
    y, dy, axis = op.outputs[0], grads[0], op.attrs["axis"]
    inner = g("reduce_sum", g("mul", dy, y), axes=(axis,), keepdims=True)
    return [g("mul", y, g("sub", dy, inner))]


@gradient("log_softmax")
def _log_softmax_grad(g, op, grads):
    y, dy, axis = op.outputs[0], grads[0], op.attrs["axis"]
    total = g("reduce_sum", dy, axes=(axis,), keepdims=True)
    return [g("sub", dy, g("mul", g("exp", y), total))]
