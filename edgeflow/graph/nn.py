"""`ef.nn`: neural-network ops, as in tf.nn."""
import numpy as np

from .graph import convert_to_tensor
from .math_ops import apply, sigmoid, tanh  # noqa: F401  (aliases, as tf.nn has them)


def relu(x, name=None):
    """max(x, 0)."""
    return apply("relu", [x], name=name)


def softmax(logits, axis=-1, name=None):
    """exp(x) / sum(exp(x)) along `axis`, computed stably."""
    return apply("softmax", [logits], {"axis": axis}, name)


def log_softmax(logits, axis=-1, name=None):
    """x - log(sum(exp(x))) along `axis`, computed stably."""
    return apply("log_softmax", [logits], {"axis": axis}, name)


def prelu(x, slope, name=None):
    """x where x >= 0, else slope * x, slope broadcast to x (ONNX's PRelu, TFLite's PRELU).

    A constant slope within (0, 1] makes it maximum(x, slope * x), one of at least 1
    minimum(x, slope * x): two passes that equal the definition on every input, infinities,
    NaN and -0.0 included (a slope of 0 would not: 0 * inf is NaN). Other slopes take a
    select, which branches on every element's sign."""
    x = convert_to_tensor(x)
    slope = convert_to_tensor(slope, x.dtype)
    scaled = apply("mul", [x, slope], name=name and f"{name}/scaled")
    value = slope.spec.value
    if value is not None and value.size and np.all(value > 0):
        if np.all(value <= 1):
            return apply("maximum", [x, scaled], name=name)
        if np.all(value >= 1):
            return apply("minimum", [x, scaled], name=name)
    negative = apply("less", [x, np.zeros((), x.dtype)], name=name and f"{name}/negative")
    return apply("where", [negative, scaled, x], name=name)
