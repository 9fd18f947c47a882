"""Neural-network activations and normalizing functions."""
from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, define, gradient
from .dims import normalize_axis


def _unary(op, spec, allowed):
    if spec.dtype not in allowed:
        raise GraphError(f"{op}: dtype {spec.dtype} not supported; expected one of "
                         f"{', '.join(sorted(d.name for d in allowed))}")
    return [TensorSpec(spec.shape, spec.dtype)]


@define("relu", inputs=1)
def _relu(inputs, attrs):
    """max(x, 0)."""
    return _unary("relu", inputs[0], dtypes.FLOATS | dtypes.INTEGERS)


def _along_axis(name):
    def infer(inputs, attrs):
        normalize_axis(attrs["axis"], inputs[0].rank, name)
        return _unary(name, inputs[0], dtypes.FLOATS)
    return infer


define("softmax", inputs=1, attrs={"axis": Attr(AttrKind.INT, -1)})(_along_axis("softmax"))
define("log_softmax", inputs=1, attrs={"axis": Attr(AttrKind.INT, -1)})(_along_axis("log_softmax"))


# -- gradients -----------------------------------------------------------------------------

@gradient("relu")
def _relu_grad(g, op, grads):
    x = op.inputs[0]
    zero = g.constant(0, x)
    return [g("where", g("greater", x, zero), grads[0], zero)]


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
