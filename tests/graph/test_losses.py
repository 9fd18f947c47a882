"""ef.losses against numpy closed forms, at ordinary and at huge logits, and their
gradients against finite differences."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError

from .gradcheck import check_gradients

rng = np.random.default_rng(0)


def run(fn, *arrays):
    """fn(*constants) evaluated in a fresh graph."""
    g = ef.Graph()
    with g.as_default():
        out = fn(*[ef.constant(a) for a in arrays])
    return ef.Session(g).run(out)


def np_log_softmax(x):
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def np_sigmoid_xent(z, x):
    p = 1 / (1 + np.exp(-x))
    return -z * np.log(p) - (1 - z) * np.log(1 - p)


REDUCE = {"none": lambda v: v, "sum": np.sum, "mean": np.mean}


@pytest.mark.parametrize("reduction", sorted(REDUCE))
def test_mean_squared_error(reduction):
    labels, predictions = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    got = run(lambda a, b: ef.losses.mean_squared_error(a, b, reduction=reduction), labels, predictions)
    np.testing.assert_allclose(got, REDUCE[reduction]((predictions - labels) ** 2), rtol=1e-12)


@pytest.mark.parametrize("reduction", sorted(REDUCE))
def test_softmax_cross_entropy_integer_and_one_hot_labels(reduction):
    logits, ids = rng.standard_normal((5, 4)), rng.integers(0, 4, 5)
    expected = REDUCE[reduction](-np_log_softmax(logits)[np.arange(5), ids])
    one_hot = np.eye(4)[ids]
    for labels in (ids, ids.astype(np.int32), one_hot):
        got = run(lambda a, b: ef.losses.softmax_cross_entropy(a, b, reduction=reduction), labels, logits)
        np.testing.assert_allclose(got, expected, rtol=1e-12, err_msg=str(labels.dtype))


def test_softmax_cross_entropy_probabilities_and_plain_labels():
    logits = rng.standard_normal((3, 5)).astype(np.float32)
    probs = rng.dirichlet(np.ones(5), 3)
    g = ef.Graph()
    with g.as_default():
        x = ef.constant(logits)
        soft = ef.losses.softmax_cross_entropy(probs, x)        # a float64 array, float32 logits
        hard = ef.losses.softmax_cross_entropy([4, 0, 2], x, reduction="none")
    soft_v, hard_v = ef.Session(g).run([soft, hard])
    assert soft_v.dtype == np.float32
    np.testing.assert_allclose(soft_v, np.mean(-(probs * np_log_softmax(logits.astype(np.float64))).sum(-1)),
                               rtol=1e-5)
    np.testing.assert_allclose(hard_v, -np_log_softmax(logits.astype(np.float64))[[0, 1, 2], [4, 0, 2]],
                               rtol=1e-5)


def test_softmax_cross_entropy_with_unknown_class_count():
    logits, ids = rng.standard_normal((3, 6)), np.array([5, 0, 3])
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float64, [None, None])
        y = ef.placeholder(ef.int64, [None])
        loss = ef.losses.softmax_cross_entropy(y, x, reduction="none")
    got = ef.Session(g).run(loss, {x: logits, y: ids})
    np.testing.assert_allclose(got, -np_log_softmax(logits)[np.arange(3), ids], rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_huge_logits_stay_finite(dtype):
    logits = np.array([[1e4, 0.0, -1e4], [-3e4, 3e4, 0.0]], dtype)
    ids = np.array([0, 0])
    g = ef.Graph()
    with g.as_default():
        x = ef.constant(logits)
        soft = ef.losses.softmax_cross_entropy(ids, x, reduction="none")
        (dsoft,) = ef.gradients(ef.reduce_sum(soft), [x])
        sig = ef.losses.sigmoid_cross_entropy(np.array([[1, 0, 0], [1, 1, 0]], dtype), x, reduction="none")
        (dsig,) = ef.gradients(ef.reduce_sum(sig), [x])
    values = ef.Session(g).run([soft, dsoft, sig, dsig])
    assert all(np.all(np.isfinite(v)) for v in values)
    np.testing.assert_allclose(values[0], [0.0, 6e4], rtol=1e-6)
    np.testing.assert_allclose(values[1], [[0, 0, 0], [-1, 1, 0]], atol=1e-6)
    np.testing.assert_allclose(values[2], [[0, np.log(2), 0], [3e4, 0, np.log(2)]], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(values[3], [[0, 0.5, 0], [-1, 0, 0.5]], atol=1e-6)


@pytest.mark.parametrize("reduction", sorted(REDUCE))
def test_sigmoid_cross_entropy(reduction):
    labels, logits = rng.uniform(0, 1, (4, 3)), rng.uniform(-8, 8, (4, 3))
    got = run(lambda z, x: ef.losses.sigmoid_cross_entropy(z, x, reduction=reduction), labels, logits)
    np.testing.assert_allclose(got, REDUCE[reduction](np_sigmoid_xent(labels, logits)), rtol=1e-10)


def test_integer_labels_for_sigmoid_are_cast():
    ids, logits = rng.integers(0, 2, (3, 2)), rng.standard_normal((3, 2))
    got = run(lambda z, x: ef.losses.sigmoid_cross_entropy(z, x), ids, logits)
    np.testing.assert_allclose(got, np.mean(np_sigmoid_xent(ids, logits)), rtol=1e-12)


def test_bad_arguments():
    with ef.Graph().as_default():
        x = ef.constant(np.zeros((2, 3)))
        with pytest.raises(GraphError, match="reduction must be one of"):
            ef.losses.mean_squared_error(x, x, reduction="average")
        with pytest.raises(GraphError, match="integer labels must have logits' shape"):
            ef.losses.softmax_cross_entropy(np.zeros((2, 3), np.int64), x)


# -- gradients ----------------------------------------------------------------------------------

def test_mean_squared_error_gradients():
    check_gradients(lambda a, b: ef.losses.mean_squared_error(a, b, reduction="none"),
                    rng.standard_normal((3, 4)), rng.standard_normal((3, 4)))


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_softmax_cross_entropy_gradients_integer_labels(reduction):
    ids = rng.integers(0, 5, 4)
    check_gradients(lambda x: ef.losses.softmax_cross_entropy(ids, x, reduction=reduction),
                    rng.standard_normal((4, 5)) * 3)


def test_softmax_cross_entropy_gradients_probability_labels():
    check_gradients(lambda z, x: ef.losses.softmax_cross_entropy(z, x, reduction="none"),
                    rng.dirichlet(np.ones(5), 4), rng.standard_normal((4, 5)) * 3)


def test_sigmoid_cross_entropy_gradients():
    logits = rng.uniform(-6, 6, (4, 3))
    logits[0, 0] = 0.0  # where max(x, 0) and |x| have kinks, and the loss none
    check_gradients(lambda z, x: ef.losses.sigmoid_cross_entropy(z, x, reduction="none"),
                    rng.uniform(0, 1, (4, 3)), logits, rtol=1e-4)
