"""Normalization: batch norm in its inference form, and layer norm."""
from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define, gradient
from .dims import fmt, normalize_axis


@define("batch_norm", attrs={"epsilon": Attr(AttrKind.FLOAT, 1e-5)},
        types=Types("x: T, scale: T, bias: T, mean: T, var: T -> T", T=dtypes.FLOATS))
def _batch_norm(inputs, attrs):
    """(x - mean) / sqrt(var + epsilon) * scale + bias, per channel (axis 1) of x (N, C, ...)."""
    x = inputs[0]
    if x.rank < 2:
        raise GraphError(f"batch_norm: x must be (N, C, ...), got {fmt(x.shape)}")
    for name, s in zip(("scale", "bias", "mean", "var"), inputs[1:]):
        if s.rank != 1 or None not in (s.shape[0], x.shape[1]) and s.shape[0] != x.shape[1]:
            raise GraphError(f"batch_norm: {name} must have one element per channel of x "
                             f"{fmt(x.shape)}, got {fmt(s.shape)}")
    return [TensorSpec(x.shape, x.dtype)]


@define("layer_norm", attrs={"axis": Attr(AttrKind.INT, -1), "epsilon": Attr(AttrKind.FLOAT, 1e-5)},
        types=Types("x: T, scale: T, bias: T? -> T", T=dtypes.FLOATS))
def _layer_norm(inputs, attrs):
    """(x - mean) / sqrt(var + epsilon) * scale + bias, statistics over axes [axis, rank).

    scale and bias broadcast against x.shape[axis:].
    """
    x = inputs[0]
    if x.rank == 0:
        raise GraphError("layer_norm: x must have rank >= 1")
    axis = normalize_axis(attrs["axis"], x.rank, "layer_norm")
    normalized = x.shape[axis:]
    for name, s in zip(("scale", "bias"), inputs[1:]):
        fits = s.rank <= len(normalized) and all(
            d in (1, None) or n in (d, None) for d, n in zip(s.shape[::-1], normalized[::-1]))
        if not fits:
            raise GraphError(f"layer_norm: {name} {fmt(s.shape)} does not broadcast to the "
                             f"normalized shape {fmt(normalized)}")
    return [TensorSpec(x.shape, x.dtype)]


# -- gradients -----------------------------------------------------------------------------

@gradient("batch_norm")
def _batch_norm_grad(g, op, grads):
    """The inference formula y = (x - mean) * a + bias, a = scale / sqrt(var + eps),
    differentiated in each of its five inputs (mean and var are inputs, not statistics of x)."""
    (x, scale, _, mean, var), dy = op.inputs, grads[0]
    axes = (0,) + tuple(range(2, x.rank))  # all but the channels

    def per_channel(v):  # (C,) -> (C, 1, ...), to broadcast against x (N, C, ...)
        return g("expand_dims", v, axes=tuple(range(1, x.rank - 1))) if x.rank > 2 else v

    inv_std = g("div", g.constant(1, var), g("sqrt", g("add", var, g.constant(op.attrs["epsilon"], var))))
    a = g("mul", scale, inv_std)
    dbias = g("reduce_sum", dy, axes=axes)
    # sum(dy * (x - mean)) / sqrt(var + eps) = sum(dy * x_normalized)
    dscale = g("mul", g("reduce_sum", g("mul", dy, g("sub", x, per_channel(mean))), axes=axes), inv_std)
    dvar = g("mul", g("mul", dscale, a), g("mul", inv_std, g.constant(-0.5, var)))
    return [g("mul", dy, per_channel(a)), dscale, dbias, g("neg", g("mul", dbias, a)), dvar]


@gradient("layer_norm")
def _layer_norm_grad(g, op, grads):
    """With z = (x - mu) / s the normalized x, s = sqrt(var + eps) and dz = dy * scale:
    dx = (dz - mean(dz) - z * mean(dz * z)) / s, means over the normalized axes."""
    x, scale, dy = op.inputs[0], op.inputs[1], grads[0]
    axes = tuple(range(normalize_axis(op.attrs["axis"], x.rank, "layer_norm"), x.rank))

    def mean(t):
        return g("reduce_mean", t, axes=axes, keepdims=True)

    centered = g("sub", x, mean(x))
    inv_std = g("div", g.constant(1, x), g("sqrt", g("add", mean(g("mul", centered, centered)),
                                                          g.constant(op.attrs["epsilon"], x))))
    z = g("mul", centered, inv_std)
    dz = g("mul", dy, scale)
    dx = g("mul", g("sub", g("sub", dz, mean(dz)), g("mul", z, mean(g("mul", dz, z)))), inv_std)
    dscale = g.sum_to(g("mul", dy, z), scale)
    return [dx, dscale] + ([g.sum_to(dy, op.inputs[2])] if len(op.inputs) > 2 else [])
