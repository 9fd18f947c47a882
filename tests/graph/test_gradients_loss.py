"""Gradient rules of nll_loss and softmax_cross_entropy_loss w.r.t. the scores, against
finite differences (float64), for every reduction, weight and ignore_index."""
import itertools

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.graph.math_ops import apply

from .gradcheck import check_gradients

rng = np.random.default_rng(0)

CASES = list(itertools.product([(4, 3), (2, 4, 3), (2, 3, 2, 2)], ("none", "sum", "mean"), (False, True),
                               (None, 1)))


def _inputs(shape, weighted, ignore):
    x = rng.uniform(-2, 2, shape)
    labels = rng.integers(0, shape[1], (shape[0],) + shape[2:])
    if ignore is not None:
        labels.reshape(-1)[::3] = ignore
    return [x, labels] + ([rng.uniform(0.5, 2.0, shape[1])] if weighted else [])


def _attrs(reduction, ignore):
    return {"reduction": reduction, "ignore_index": () if ignore is None else (ignore,)}


@pytest.mark.parametrize("shape,reduction,weighted,ignore", CASES)
def test_nll_loss(shape, reduction, weighted, ignore):
    check_gradients(lambda *xs: apply("nll_loss", list(xs), _attrs(reduction, ignore)),
                    *_inputs(shape, weighted, ignore), wrt=[0])


@pytest.mark.parametrize("shape,reduction,weighted,ignore", CASES)
def test_softmax_cross_entropy_loss(shape, reduction, weighted, ignore):
    check_gradients(lambda *xs: apply("softmax_cross_entropy_loss", list(xs), _attrs(reduction, ignore))[0],
                    *_inputs(shape, weighted, ignore), wrt=[0])


@pytest.mark.parametrize("use_loss", [False, True])
def test_softmax_cross_entropy_loss_through_log_prob(use_loss):
    """log_prob's gradient alone, and added to the loss's."""
    def fn(x, labels, weight):
        loss, log_prob = apply("softmax_cross_entropy_loss", [x, labels, weight], {"reduction": "mean"})
        mixed = log_prob * ef.constant(rng.uniform(-1, 1, (3, 4, 2)))
        return ef.reduce_sum(mixed) + loss if use_loss else mixed
    check_gradients(fn, *_inputs((3, 4, 2), True, None), wrt=[0])


def test_labels_and_weight_get_no_gradient():
    g = ef.Graph()
    with g.as_default():
        x, labels, weight = ef.placeholder(ef.float64, (2, 3)), ef.placeholder(ef.int64, (2,)), \
            ef.placeholder(ef.float64, (3,))
        loss = apply("nll_loss", [x, labels, weight], {})
        grads = ef.gradients(loss, [x, labels, weight])
    assert grads[0] is not None and grads[1:] == [None, None]
