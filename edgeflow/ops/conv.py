"""Convolutions over channels-first layouts (N, C, *spatial), as ONNX's Conv and ConvTranspose.

1, 2 or 3 spatial axes. The window arithmetic here (strides, dilations, explicit or
automatic pads, output sizes) is shared with the pooling ops.
"""
import math

import numpy as np

from .. import dtypes
from ..errors import GraphError
from .registry import (Attr, AttrKind, TensorSpec, Types, activation_attr, activation_gradient, check_activation,
                       define, gradient)
from .dims import check_gradient_shape, fmt

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def window_attrs():
    """The attributes every sliding-window op takes; empty tuples mean all 1s (pads: all 0s)."""
    return {"strides": Attr(AttrKind.INTS, ()), "pads": Attr(AttrKind.INTS, ()),
            "auto_pad": Attr(AttrKind.STRING, "NOTSET"), "dilations": Attr(AttrKind.INTS, ())}


def _per_axis(op, attrs, key, n, default, low):
    values = attrs.get(key, ()) or (default,) * n
    if len(values) != n or any(v < low for v in values):
        raise GraphError(f"{op}: {key} must be {n} ints >= {low}, got {values}")
    return tuple(values)


def window_params(op, attrs, d):
    """(strides, dilations, pads) for `d` spatial axes, checked; pads are (begin..., end...)."""
    if attrs["auto_pad"] not in AUTO_PADS:
        raise GraphError(f"{op}: auto_pad must be one of {AUTO_PADS}, got {attrs['auto_pad']!r}")
    pads = _per_axis(op, attrs, "pads", 2 * d, 0, 0)
    if attrs["auto_pad"] != "NOTSET" and any(pads):
        raise GraphError(f"{op}: give pads or auto_pad={attrs['auto_pad']}, not both")
    return _per_axis(op, attrs, "strides", d, 1, 1), _per_axis(op, attrs, "dilations", d, 1, 1), pads


def same_pads(total, auto_pad):
    """(begin, end) splitting `total` padding: the odd one goes to the end for SAME_UPPER."""
    small = total // 2
    return (small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small)


def _window_axis(op, axis, n, k, s, dil, pads, auto_pad, ceil_mode):
    """(output size, pad begin, pad end) along one axis; None for what unknown `n` decides."""
    extent = (k - 1) * dil + 1
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if n is None:
            return None, None, None
        out = -(-n // s)
        return (out,) + same_pads(max(0, (out - 1) * s + extent - n), auto_pad)
    if n is None:
        return (None,) + pads
    span = n + sum(pads) - extent
    if span < 0:
        raise GraphError(f"{op}: window extent {extent} (kernel {k}, dilation {dil}) is larger "
                         f"than spatial axis {axis} of size {n} padded by {pads[0]}+{pads[1]}")
    if not ceil_mode:
        return (span // s + 1,) + pads
    out = -(-span // s) + 1
    return (out - 1 if (out - 1) * s >= n + pads[0] else out,) + pads


def window_geometry(op, sizes, kernel, attrs, ceil_mode=False):
    """(output sizes, pads begin, pads end) of a sliding window over spatial `sizes`.

    Entries are None where an input size is unknown (and SAME padding depends on it).
    With ceil_mode the last, partial window counts, unless it would start past the
    input and the begin padding (PyTorch's and ONNX's rule).
    """
    d = len(sizes)
    strides, dilations, pads = window_params(op, attrs, d)
    axes = [_window_axis(op, i, n, k, s, dil, (pads[i], pads[i + d]), attrs["auto_pad"], ceil_mode)
            for i, (n, k, s, dil) in enumerate(zip(sizes, kernel, strides, dilations))]
    return tuple(zip(*axes))


def _known_divides(op, what, n, group):
    if n is not None and n % group:
        raise GraphError(f"{op}: {what} ({n}) is not divisible by group ({group})")


def _check_operands(op, inputs, attrs):
    """(x, w, bias or None, dtype), checked for rank, group and activation."""
    x, w = inputs[:2]
    bias = inputs[2] if len(inputs) > 2 else None
    if not 3 <= x.rank <= 5 or w.rank != x.rank:
        raise GraphError(f"{op}: x must be (N, C, spatial...) with 1 to 3 spatial axes and w of "
                         f"the same rank; got x {fmt(x.shape)}, w {fmt(w.shape)}")
    if attrs["group"] < 1:
        raise GraphError(f"{op}: group must be >= 1, got {attrs['group']}")
    if bias is not None and bias.rank != 1:
        raise GraphError(f"{op}: bias must have rank 1, got {fmt(bias.shape)}")
    if None in w.shape[2:]:
        raise GraphError(f"{op}: the kernel's spatial size must be known, got w {fmt(w.shape)}")
    check_activation(op, attrs)
    return x, w, bias, x.dtype


def _check_bias(op, bias, channels):
    if bias is not None and None not in (bias.shape[0], channels) and bias.shape[0] != channels:
        raise GraphError(f"{op}: bias has {bias.shape[0]} elements, expected one per output "
                         f"channel ({channels})")


_TYPES = Types("x: T, w: T, bias: T? -> T", T=dtypes.FLOATS)


def _conv_attrs():
    return {**window_attrs(), "group": Attr(AttrKind.INT, 1), "activation": activation_attr()}


def _conv_flops(inputs, outputs, attrs):
    """2 per multiply-add: every output element sums C/group * kernel products."""
    w = inputs[1].shape
    return 2 * int(np.prod(outputs[0].shape, dtype=np.int64)) * int(np.prod(w[1:], dtype=np.int64))


def _conv_transpose_flops(inputs, outputs, attrs):
    """2 per multiply-add: every input element scatters into M/group * kernel outputs."""
    w = inputs[1].shape
    return 2 * int(np.prod(inputs[0].shape, dtype=np.int64)) * int(np.prod(w[1:], dtype=np.int64))


@define("conv", attrs=_conv_attrs(), types=_TYPES, flops=_conv_flops)
def _conv(inputs, attrs):
    """Cross-correlation of x (N, C, *in) with w (M, C/group, *kernel), plus bias (M,)."""
    x, w, bias, dt = _check_operands("conv", inputs, attrs)
    group, channels, per_group = attrs["group"], x.shape[1], w.shape[1]
    _known_divides("conv", "output channels", w.shape[0], group)
    if None not in (channels, per_group) and channels != per_group * group:
        raise GraphError(f"conv: x has {channels} channels but w {fmt(w.shape)} with group {group} "
                         f"expects {per_group * group}")
    _check_bias("conv", bias, w.shape[0])
    out, _, _ = window_geometry("conv", x.shape[2:], w.shape[2:], attrs)
    return [TensorSpec((x.shape[0], w.shape[0]) + out, dt)]


def transposed_geometry(op, sizes, kernel, attrs):
    """(output sizes, pads begin, pads end) of a transposed convolution; None where unknown."""
    d = len(sizes)
    strides, dilations, pads = window_params(op, attrs, d)
    extra = attrs["output_padding"] or (0,) * d
    if len(extra) != d or any(not 0 <= e < max(s, dil) for e, s, dil in zip(extra, strides, dilations)):
        raise GraphError(f"{op}: output_padding must be {d} ints, each below its stride or "
                         f"dilation, got {extra}")
    axes = []
    for i, (n, k, s, dil, e) in enumerate(zip(sizes, kernel, strides, dilations, extra)):
        if attrs["auto_pad"] in ("SAME_UPPER", "SAME_LOWER"):  # output n * s
            total = (k - 1) * dil + 1 + e - s
            if total < 0:
                raise GraphError(f"{op}: auto_pad {attrs['auto_pad']} needs kernel extent + "
                                 f"output_padding >= stride on axis {i}")
            pb, pe = same_pads(total, attrs["auto_pad"])
        else:
            pb, pe = pads[i], pads[i + d]
        out = None if n is None else s * (n - 1) + (k - 1) * dil + 1 + e - pb - pe
        if out is not None and out < 1:
            raise GraphError(f"{op}: pads {pb}+{pe} remove the whole output on spatial axis {i}")
        axes.append((out, pb, pe))
    return tuple(zip(*axes))


@define("conv_transpose", types=_TYPES, flops=_conv_transpose_flops,
        attrs={**_conv_attrs(), "output_padding": Attr(AttrKind.INTS, ())})
def _conv_transpose(inputs, attrs):
    """Gradient of conv w.r.t. its input: x (N, C, *in), w (C, M/group, *kernel) -> (N, M, *out).

    out = stride * (in - 1) + output_padding + (kernel - 1) * dilation + 1 - pads.
    """
    x, w, bias, dt = _check_operands("conv_transpose", inputs, attrs)
    group = attrs["group"]
    if None not in (x.shape[1], w.shape[0]) and x.shape[1] != w.shape[0]:
        raise GraphError(f"conv_transpose: x has {x.shape[1]} channels but w {fmt(w.shape)} "
                         f"expects {w.shape[0]}")
    _known_divides("conv_transpose", "input channels", w.shape[0], group)
    channels = None if w.shape[1] is None else w.shape[1] * group
    _check_bias("conv_transpose", bias, channels)
    out, _, _ = transposed_geometry("conv_transpose", x.shape[2:], w.shape[2:], attrs)
    return [TensorSpec((x.shape[0], channels) + out, dt)]



def _window_only(attrs):
    """The attrs of conv's gradient ops: the window and the group, not the activation."""
    return {k: attrs[k] for k in ("strides", "dilations", "pads", "auto_pad", "group")}


def _bias_grad(g, op, dy):
    """The bias's gradient (dy summed over all but the channel axis), if the op has a bias."""
    if len(op.inputs) < 3:
        return []
    return [g("reduce_sum", dy, axes=(0,) + tuple(range(2, dy.rank)))]


@gradient("conv")
def _conv_grad(g, op, grads):
    (x, w), dy = op.inputs[:2], activation_gradient(g, op, grads[0])
    attrs = _window_only(op.attrs)
    return [g("conv_input_grad", dy, w, x, **attrs), g("conv_filter_grad", x, dy, w, **attrs)] + \
        _bias_grad(g, op, dy)


@gradient("conv_transpose")
def _conv_transpose_grad(g, op, grads):
    """conv_transpose is conv's input gradient, so its gradients are conv and conv's filter
    gradient, of dy padded as conv would pad it: by the pads conv_transpose cropped, less
    output_padding at the end (the outputs there are zeros that no input reaches)."""
    (x, w), dy = op.inputs[:2], activation_gradient(g, op, grads[0])
    d = x.rank - 2
    _, begin, end = transposed_geometry("conv_transpose", x.shape[2:], w.shape[2:], op.attrs)
    end = tuple(e - extra for e, extra in zip(end, op.attrs["output_padding"] or (0,) * d))
    cropped = dy
    if min(end) < 0:
        cropped = g("pad", dy, pads=(0,) * (d + 2) + (0, 0) + tuple(min(e, 0) for e in end))
    attrs = {**_window_only(op.attrs), "auto_pad": "NOTSET", "pads": begin + tuple(max(e, 0) for e in end)}
    return [g("conv", cropped, w, **attrs), g("conv_filter_grad", cropped, x, w, **attrs)] + \
        _bias_grad(g, op, dy)


# Gradients of conv, as ops; each takes the forward input (or a tensor shaped like it, `like`)
# as an operand, so that its output shape is known when the batch is not.

def _conv_grad_attrs():
    return {**window_attrs(), "group": Attr(AttrKind.INT, 1)}


def _conv_grad_flops(dy, w):
    return lambda inputs, outputs, attrs: 2 * math.prod(inputs[dy].shape) * math.prod(inputs[w].shape[1:])


@define("conv_input_grad", types=Types("dy: T, w: T, like: T -> T", T=dtypes.FLOATS), attrs=_conv_grad_attrs(), flops=_conv_grad_flops(0, 1))
def _conv_input_grad(inputs, attrs):
    """Gradient of conv (same attrs) with respect to its input: dy (N, M, *out) taken back
    through w (M, C/group, *kernel) to like's shape (N, C, *in)."""
    dy, w, like = inputs
    check_gradient_shape("conv_input_grad", "conv", (like, w), {**attrs, "activation": ""}, dy)
    return [TensorSpec(like.shape, dy.dtype)]


@define("conv_filter_grad", types=Types("x: T, dy: T, like: T -> T", T=dtypes.FLOATS), attrs=_conv_grad_attrs(), flops=_conv_grad_flops(1, 2))
def _conv_filter_grad(inputs, attrs):
    """Gradient of conv (same attrs) with respect to its filter: x (N, C, *in) correlated with
    dy (N, M, *out), summed over the batch, shaped like w (M, C/group, *kernel)."""
    x, dy, like = inputs
    check_gradient_shape("conv_filter_grad", "conv", (x, like), {**attrs, "activation": ""}, dy)
    return [TensorSpec(like.shape, dy.dtype)]


# Each is linear in its gradient operand; the rules below are its transpose.

@gradient("conv_input_grad")
def _conv_input_grad_grad(g, op, grads):
    dy, w, _ = op.inputs
    return [g("conv", grads[0], w, **op.attrs), g("conv_filter_grad", grads[0], dy, w, **op.attrs), None]


@gradient("conv_filter_grad")
def _conv_filter_grad_grad(g, op, grads):
    x, dy, _ = op.inputs
    return [g("conv_input_grad", dy, grads[0], x, **op.attrs), g("conv", x, grads[0], **op.attrs), None]
