"""Optimizer steps fused into one op: the elementwise arithmetic of an update in one pass
over a variable's gradient and slots, where the optimizer's graph took one op (one pass
over the variable's size) per multiply, add, divide and square root: Adam's ~13. The
writes stay `assign` ops (edgeflow/ops/state.py), so what an update writes, and where the
splitter and the parameter server run it, are as before."""
import math

from .. import dtypes
from ..errors import GraphError
from .dims import fmt, one_shape
from .registry import Attr, AttrKind, TensorSpec, Types, define


def _adam_flops(inputs, outputs, attrs):
    """About 12 arithmetic operations per element."""
    return 12 * math.prod(outputs[0].shape)


@define("adam_update", types=Types("m: T, v: T, grad: T, lr: T, correction1: T, correction2: T, var: T? -> T, T, T",
                                   T=dtypes.FLOATS), attrs={
    "beta1": Attr(AttrKind.FLOAT), "beta2": Attr(AttrKind.FLOAT), "epsilon": Attr(AttrKind.FLOAT),
    "weight_decay": Attr(AttrKind.FLOAT, 0.0)}, flops=_adam_flops)
def _adam_update(inputs, attrs):
    """(m', v', delta) of one Adam step (torch.optim.Adam's arithmetic, in this order, in
    the variable's dtype): m' = beta1 m + (1 - beta1) grad; v' = beta2 v + (1 - beta2) grad
    grad; delta = lr (m' / correction1) / (sqrt(v' / correction2) + epsilon), plus
    (lr weight_decay) var with a weight decay (AdamW; `var` given only then). lr and the
    bias corrections 1 - beta^t are scalars; the caller assigns m' and v' and subtracts delta."""
    m, v, grad, *scalars = inputs[:6]
    shape = one_shape("adam_update", m, v, ("m", "v"))
    shape = one_shape("adam_update", TensorSpec(shape, m.dtype), grad, ("the slots", "grad"))
    for name, s in zip(("lr", "correction1", "correction2"), scalars):
        if s.rank:
            raise GraphError(f"adam_update: {name} must be a scalar, got {fmt(s.shape)}")
    decays = attrs["weight_decay"] != 0
    if decays != (len(inputs) == 7):
        raise GraphError(f"adam_update: var is an input exactly when weight_decay is not 0 "
                         f"(weight_decay {attrs['weight_decay']}, {len(inputs)} inputs)")
    if decays:
        shape = one_shape("adam_update", TensorSpec(shape, m.dtype), inputs[6], ("the slots", "var"))
    return [TensorSpec(shape, m.dtype)] * 3
