"""Send and recv: the two ends of an edge that a split cuts between device and cloud.

As in TensorFlow's partitioner, each tensor that crosses the cut becomes a `send` on the
side that produces it, named by a rendezvous key; the other side receives it by that key.
In a device package, `send(x)` hands x to the link and yields a *receipt*: a tensor of
shape (0, *x.shape) that holds no bytes but carries x's shape, so that `recv` ops (which
take every receipt of the round trip as inputs) run after every send and can compute
their own output shapes from what was sent. One round trip per run: the first recv to run
sends everything and fetches every recv'd tensor.

A training step may need several round trips (U-shaped split learning: activations up,
the body's output down, its gradient up, the cut's gradient down): `round` numbers them,
and the sends and recvs of round k make the k-th call of the step.

A recv's output shape is given by `shape`; a dimension that is -1 there is dimension
`shape_dim[i]` of the tensor sent as receipt `shape_input[i]` (the batch size, say), as
recorded when the model was split.

Neither has a numpy kernel: a delegate that reaches the cloud runs them
(`Interpreter(..., delegates=[edgeflow.cloud.CloudDelegate("host:port")])`).
"""
import numpy as np

from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, REQUIRED, TensorSpec, Types, define


@define("send", remote=True, types=Types("x: T -> receipt: T", T=dtypes.ANY), flops=lambda ins, outs, attrs: 0,
        attrs={"key": Attr(AttrKind.STRING, REQUIRED), "round": Attr(AttrKind.INT, 1)})
def _send(inputs, attrs):
    """send(x) -> receipt: x goes to the peer under `key`; the receipt is (0, *x.shape), no bytes."""
    x = inputs[0]
    return [TensorSpec((0,) + tuple(x.shape), x.dtype)]


@define("recv", remote=True, types=Types("receipts: any* -> dtype"), flops=lambda ins, outs, attrs: 0,
        attrs={"key": Attr(AttrKind.STRING, REQUIRED), "dtype": Attr(AttrKind.DTYPE, REQUIRED),
               "shape": Attr(AttrKind.INTS, REQUIRED), "round": Attr(AttrKind.INT, 1),
               "shape_input": Attr(AttrKind.INTS, ()), "shape_dim": Attr(AttrKind.INTS, ())})
def _recv(inputs, attrs):
    """recv(receipts...) -> the tensor the peer computed under `key`."""
    shape, src, dim = list(attrs["shape"]), attrs["shape_input"], attrs["shape_dim"]
    if src and (len(src) != len(shape) or len(dim) != len(shape)):
        raise GraphError(f"recv {attrs['key']!r}: shape_input and shape_dim need one entry per "
                         f"dimension of shape {tuple(shape)}")
    for i, d in enumerate(shape):
        if d >= 0:
            continue
        if not src or src[i] < 0:
            shape[i] = None  # unknown until the peer answers: the plan will refuse it
            continue
        if src[i] >= len(inputs) or dim[i] >= len(inputs[src[i]].shape) - 1:
            raise GraphError(f"recv {attrs['key']!r}: dimension {i} refers to receipt "
                             f"{src[i]} dimension {dim[i]}, which does not exist")
        shape[i] = inputs[src[i]].shape[1 + dim[i]]
    return [TensorSpec(tuple(shape), np.dtype(attrs["dtype"]))]
