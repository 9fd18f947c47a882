"""`ef.nn`: neural-network ops, as in tf.nn."""
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
