"""Ops that draw random numbers: random_uniform.

They are never folded, neither while building nor while preparing, though their operand
(a shape) is known then: each run draws new numbers. A kernel's generator is seeded
from the `seed` attribute when it is prepared, so the same seed gives the same sequence
in every interpreter.
"""
from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define
from .shape import known_ints, unknown_dims


@define("random_uniform", random=True,
        types=Types("shape: index -> dtype", dtype=(dtypes.float32, dtypes.float64)),
        attrs={"dtype": Attr(AttrKind.DTYPE, dtypes.float32), "minval": Attr(AttrKind.FLOAT, 0.0),
               "maxval": Attr(AttrKind.FLOAT, 1.0), "seed": Attr(AttrKind.INT, 0)})
def _random_uniform(inputs, attrs):
    """Samples uniform in [minval, maxval), float32 or float64, of shape `shape` (an operand)."""
    if not attrs["minval"] < attrs["maxval"]:
        raise GraphError(f"random_uniform: minval ({attrs['minval']}) must be below maxval "
                         f"({attrs['maxval']})")
    if attrs["seed"] < 0:
        raise GraphError(f"random_uniform: seed must be >= 0, got {attrs['seed']}")
    shape = known_ints("random_uniform", inputs[0], "the shape")
    if shape is None:
        return [TensorSpec(unknown_dims("random_uniform", inputs[0], "the shape"), attrs["dtype"])]
    if any(d < 0 for d in shape):
        raise GraphError(f"random_uniform: negative dimension in {shape}")
    return [TensorSpec(shape, attrs["dtype"])]
