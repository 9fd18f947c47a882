"""`ef.layers`: layers that make their own variables, as tf.layers in the seeds' TensorFlow.

Layouts are edgeflow's, channels first: conv2d and max_pool2d take (N, C, H, W) and
conv2d's kernel is (filters, C, kh, kw); batch_norm normalizes per channel of axis 1.
Every call is a new layer with new variables, named `<layer>/kernel`, `<layer>/bias`,
... where the layer name is unique in the graph ("dense", "dense_1", ...).

`training` (dropout, batch_norm) is a Python bool, fixed while building, or a bool
scalar Tensor (a placeholder) chosen per run. batch_norm's moving-average updates are
not run by its output: as TF1's UPDATE_OPS, they collect in `update_ops(graph)`, for
the caller to group with the train op.
"""
import numpy as np

from .. import dtypes
from ..errors import GraphError
from ..ops.conv import same_pads
from .graph import Tensor, constant, convert_to_tensor
from .math_ops import (add, apply, concat, less, matmul, multiply, reduce_mean, reshape, shape,
                       sqrt, subtract, where)
from .variables import Variable, assign, glorot_uniform, group, ones, zeros

__all__ = ["dense", "conv2d", "max_pool2d", "flatten", "dropout", "batch_norm", "update_ops"]


def _scope(x, name, default):
    """The unique layer name for `name` (or `default`) in x's graph."""
    return x.graph.unique_name(name or default)


def _tensor(x):
    return x if isinstance(x, Tensor) else convert_to_tensor(x)


def _pair(value, what):
    pair = (value, value) if isinstance(value, (int, np.integer)) else tuple(value)
    if len(pair) != 2 or any(int(v) < 1 for v in pair):
        raise GraphError(f"{what} must be a positive int or a pair of them, got {value!r}")
    return tuple(int(v) for v in pair)


def _window_pads(op, x, kernel, strides, padding):
    """Window attrs for "valid" or "same" (TensorFlow's: the odd pad at the end)."""
    if padding == "valid":
        return {"strides": strides}
    if padding != "same":
        raise GraphError(f"{op}: padding must be 'valid' or 'same', got {padding!r}")
    if x.rank != 4 or None in x.shape[2:]:
        return {"strides": strides, "auto_pad": "SAME_UPPER"}
    begin, end = zip(*(same_pads(max(0, (-(-n // s) - 1) * s + k - n), "SAME_UPPER")
                       for n, k, s in zip(x.shape[2:], kernel, strides)))
    return {"strides": strides, "pads": begin + end}


def _like(value, x):
    """`value` as an array of x's dtype, rounded: a constant operand next to x (a Python
    float such as 0.1 is refused next to a float32 tensor, as it does not convert exactly)."""
    return np.asarray(value, x.dtype)


def _activate(y, activation):
    return activation(y) if activation is not None else y


def dense(inputs, units, activation=None, use_bias=True, kernel_initializer=None, name=None):
    """activation(inputs @ kernel + bias) over the last axis; kernel (in, units) starts
    from `kernel_initializer(shape, dtype=)` (glorot_uniform by default), bias from zeros."""
    x = _tensor(inputs)
    if x.rank < 1 or x.shape[-1] is None:
        raise GraphError(f"dense: the last dimension of {x!r} must be known")
    scope, init = _scope(x, name, "dense"), kernel_initializer or glorot_uniform
    with x.graph.as_default():
        kernel = Variable(init((x.shape[-1], int(units)), dtype=x.dtype), name=f"{scope}/kernel")
        y = matmul(x, kernel, name=f"{scope}/matmul")
        if use_bias:
            bias = Variable(zeros((int(units),), x.dtype), name=f"{scope}/bias")
            y = add(y, bias, name=f"{scope}/bias_add")
        return _activate(y, activation)


def conv2d(inputs, filters, kernel_size, strides=1, padding="valid", activation=None, use_bias=True,
           kernel_initializer=None, name=None):
    """2-D convolution of channels-first (NCHW) `inputs`, with a kernel of shape
    (filters, C, kh, kw), edgeflow's layout (not TensorFlow's NHWC / HWIO)."""
    x = _tensor(inputs)
    if x.rank != 4 or x.shape[1] is None:
        raise GraphError(f"conv2d: inputs must be (N, C, H, W) with C known, got {x!r}")
    kernel_size, strides = _pair(kernel_size, "conv2d: kernel_size"), _pair(strides, "conv2d: strides")
    scope, init = _scope(x, name, "conv2d"), kernel_initializer or glorot_uniform
    with x.graph.as_default():
        kernel = Variable(init((int(filters), x.shape[1]) + kernel_size, dtype=x.dtype),
                          name=f"{scope}/kernel")
        operands = [x, kernel]
        if use_bias:
            operands.append(Variable(zeros((int(filters),), x.dtype), name=f"{scope}/bias"))
        y = apply("conv", operands, _window_pads("conv2d", x, kernel_size, strides, padding),
                  name=f"{scope}/conv")
        return _activate(y, activation)


def max_pool2d(inputs, pool_size, strides, padding="valid", name=None):
    """Largest element of each pool_size window of channels-first (NCHW) `inputs`."""
    x = _tensor(inputs)
    pool_size, strides = _pair(pool_size, "max_pool2d: pool_size"), _pair(strides, "max_pool2d: strides")
    attrs = {"kernel_shape": pool_size, **_window_pads("max_pool2d", x, pool_size, strides, padding)}
    return apply("max_pool", [x], attrs, name=_scope(x, name, "max_pool2d"))


def flatten(inputs, name=None):
    """(N, ...) -> (N, product of the rest)."""
    x = _tensor(inputs)
    if x.rank < 1:
        raise GraphError(f"flatten: inputs must have a batch axis, got {x!r}")
    scope = _scope(x, name, "flatten")
    rest = x.shape[1:]
    if None not in rest:
        return reshape(x, (-1, int(np.prod(rest, dtype=np.int64))), name=scope)
    with x.graph.as_default():
        target = concat([apply("shape", [x], {"end": 1}), constant(np.array([-1], np.int64))], axis=0)
    return reshape(x, target, name=scope)


def _op_seed(graph, seed):
    """`seed`, or one drawn from the graph's seed (ef.set_random_seed) in turn."""
    if seed is not None:
        return int(seed)
    draws = graph.seed_draws
    graph.seed_draws = draws + 1
    return int(np.random.default_rng([graph.seed, draws]).integers(2**31))


def _select(training, if_true, if_false):
    """if_true or if_false by `training`, a Python bool or a bool scalar Tensor."""
    if isinstance(training, Tensor):
        if training.dtype != dtypes.bool_ or training.rank != 0:
            raise GraphError(f"training must be a Python bool or a bool scalar Tensor, got {training!r}")
        return where(training, if_true(), if_false())
    return if_true() if training else if_false()


def dropout(inputs, rate, training=False, seed=None, name=None):
    """When training, zeros each element with probability `rate` and scales the others by
    1 / (1 - rate); otherwise `inputs` unchanged. New elements are dropped every run; the
    sequence of masks is fixed by `seed` (or by the graph's seed, ef.set_random_seed)."""
    x = _tensor(inputs)
    if not 0 <= rate < 1:
        raise GraphError(f"dropout: rate must be in [0, 1), got {rate}")
    if rate == 0 or not isinstance(training, Tensor) and not training:
        return x
    scope = _scope(x, name, "dropout")
    with x.graph.as_default():
        def dropped():
            noise = apply("random_uniform", [shape(x)], {"dtype": x.dtype, "seed": _op_seed(x.graph, seed)},
                          name=f"{scope}/random_uniform")
            return where(less(noise, _like(rate, x)), 0, multiply(x, _like(1 / (1 - rate), x)),
                         name=f"{scope}/dropped")
        return _select(training, dropped, lambda: x)


def update_ops(graph=None):
    """The moving-average updates batch_norm layers of `graph` (the default one) made, as
    TF1's UPDATE_OPS collection: run them with the train op,
    `ef.group(opt.minimize(loss), *ef.layers.update_ops())`."""
    from .graph import get_default_graph
    graph = graph or get_default_graph()
    return graph.update_ops


def batch_norm(inputs, training=False, momentum=0.99, epsilon=1e-3, axis=1, name=None):
    """(x - mean) / sqrt(variance + epsilon) * gamma + beta, per channel of `axis`.

    Training uses the batch's mean and (biased) variance over the other axes, and adds to
    `update_ops()` an Operation moving each moving statistic: m = m * momentum + batch *
    (1 - momentum). Inference uses the moving statistics.
    """
    x = _tensor(inputs)
    axis = axis + x.rank if -x.rank <= axis < 0 else axis
    if not 0 <= axis < x.rank or x.shape[axis] is None:
        raise GraphError(f"batch_norm: axis {axis} must be an axis of known size of {x!r}")
    scope, channels = _scope(x, name, "batch_norm"), (x.shape[axis],)
    with x.graph.as_default():
        gamma = Variable(ones(channels, x.dtype), name=f"{scope}/gamma")
        beta = Variable(zeros(channels, x.dtype), name=f"{scope}/beta")
        moving_mean = Variable(zeros(channels, x.dtype), name=f"{scope}/moving_mean", trainable=False)
        moving_var = Variable(ones(channels, x.dtype), name=f"{scope}/moving_variance", trainable=False)
        params = (gamma, beta, moving_mean, moving_var)
        if not isinstance(training, Tensor) and not training:
            return _normalize(x, axis, epsilon, *params)
        others = [a for a in range(x.rank) if a != axis]
        mean = reduce_mean(x, others, keepdims=True, name=f"{scope}/mean")
        centered = subtract(x, mean)
        var = reduce_mean(multiply(centered, centered), others, keepdims=True, name=f"{scope}/variance")
        y = _select(training, lambda: _normalize(x, axis, epsilon, gamma, beta, mean, var, centered),
                    lambda: _normalize(x, axis, epsilon, *params))
        updates = [_moving_update(m, reshape(batch, channels), momentum, training)
                   for m, batch in ((moving_mean, mean), (moving_var, var))]
        update_ops(x.graph).append(group(*updates, name=f"{scope}/update"))
        return y


def _normalize(x, axis, epsilon, gamma, beta, mean, var, centered=None):
    """The batch_norm op over axis 1 with moving statistics; elementwise ops otherwise."""
    if axis == 1 and centered is None:
        return apply("batch_norm", [x, gamma, beta, mean, var], {"epsilon": epsilon})
    per_channel = tuple(-1 if a == axis else 1 for a in range(x.rank))
    mean, var = (reshape(t, per_channel) if t.rank == 1 else t for t in (mean, var))
    centered = centered if centered is not None else subtract(x, mean)
    scale = multiply(reshape(gamma, per_channel), 1 / sqrt(add(var, _like(epsilon, x))))
    return add(multiply(centered, scale), reshape(beta, per_channel))


def _moving_update(moving, batch, momentum, training):
    """assign(moving, moving * momentum + batch * (1 - momentum)), a no-op (the old value
    written back) in runs where a Tensor `training` is false."""
    new = add(multiply(moving, _like(momentum, moving)), multiply(batch, _like(1 - momentum, moving)))
    return assign(moving, where(training, new, moving) if isinstance(training, Tensor) else new)

