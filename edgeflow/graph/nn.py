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
    minimum(x, slope * x): two fast passes even without numba, equal to the definition on
    every input, infinities, NaN and -0.0 included (a slope of 0 would not: 0 * inf is
    NaN). Other slopes (trained ones take both signs) make the `prelu` op."""
    x = convert_to_tensor(x)
    slope = convert_to_tensor(slope, x.dtype)
    value = slope.spec.value
    if value is not None and value.size and np.all(value > 0) and (np.all(value <= 1) or np.all(value >= 1)):
        scaled = apply("mul", [x, slope], name=name and f"{name}/scaled")
        return apply("maximum" if np.all(value <= 1) else "minimum", [x, scaled], name=name)
    return apply("prelu", [x, slope], name=name)
