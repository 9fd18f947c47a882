"""nll_loss and softmax_cross_entropy_loss (every reduction, weight, ignore_index, rank 2 to
5, float16/32/64 scores, int32/int64 labels): against a Python loop over the labels and
onnxruntime."""
import itertools
import math

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError, InvalidInputError
from edgeflow.graph.math_ops import apply

from .harness import FLOATS, assert_close
from .onnx_reference import onnx_reference

SHAPES = [(4, 3), (2, 5, 3), (2, 3, 2, 2), (2, 4, 1, 2, 3)]
REDUCTIONS = ("none", "sum", "mean")


def loss_by_loop(log_prob, labels, weight, ignore, reduction):
    """The loss, label by label, in float64 Python arithmetic."""
    n, classes = log_prob.shape[:2]
    losses, weights = np.zeros(labels.shape), np.zeros(labels.shape)
    for index in np.ndindex(*labels.shape):
        c = int(labels[index])
        if c == ignore:
            continue
        w = 1.0 if weight is None else float(weight[c])
        losses[index] = -float(log_prob[(index[0], c) + index[1:]]) * w
        weights[index] = w
    if reduction == "none":
        return losses
    total = math.fsum(losses.reshape(-1))
    return np.array(total if reduction == "sum" else total / math.fsum(weights.reshape(-1)))


def log_softmax_by_loop(x):
    x = x.astype(np.float64)
    out = np.empty_like(x)
    for index in np.ndindex(*x.shape[:1] + x.shape[2:]):
        line = x[(index[0], slice(None)) + index[1:]]
        top = line.max()
        out[(index[0], slice(None)) + index[1:]] = line - top - math.log(sum(math.exp(v - top) for v in line))
    return out


def case(rng, shape, dtype, label_dtype, weighted, ignore):
    x = rng.uniform(-3, 3, shape).astype(dtype)
    labels = rng.integers(0, shape[1], (shape[0],) + shape[2:]).astype(label_dtype)
    if ignore is not None:
        labels.reshape(-1)[::3] = ignore
    weight = rng.uniform(0.2, 2.0, shape[1]).astype(dtype) if weighted else None
    return x, labels, weight


def loss_op(name, reduction, ignore, outputs=1):
    def build(*inputs):
        attrs = {"reduction": reduction, "ignore_index": () if ignore is None else (ignore,)}
        out = apply(name, list(inputs), attrs)
        return tuple(out) if outputs == 2 else out[0] if isinstance(out, (tuple, list)) else out
    return build


_TOL = {"float16": (2e-3, 2e-3)}

GRID = list(itertools.product(SHAPES, REDUCTIONS, (False, True), (None, 1, -1)))


@pytest.mark.parametrize("shape,reduction,weighted,ignore", GRID)
def test_nll_loss_against_a_loop(run_op, rng, shape, reduction, weighted, ignore):
    x, labels, weight = case(rng, shape, "float32", "int64", weighted, ignore)
    inputs = (x, labels) + (() if weight is None else (weight,))
    got = run_op(loss_op("nll_loss", reduction, ignore), *inputs)
    assert_close(got, loss_by_loop(x, labels, weight, ignore, reduction), "float32")


@pytest.mark.parametrize("shape,reduction,weighted,ignore", GRID)
def test_softmax_cross_entropy_loss_against_a_loop(run_op, rng, shape, reduction, weighted, ignore):
    x, labels, weight = case(rng, shape, "float64", "int64", weighted, ignore)
    inputs = (x, labels) + (() if weight is None else (weight,))
    loss, log_prob = run_op(loss_op("softmax_cross_entropy_loss", reduction, ignore, outputs=2), *inputs)
    expected_log_prob = log_softmax_by_loop(x)
    assert_close(log_prob, expected_log_prob, "float64")
    assert_close(loss, loss_by_loop(expected_log_prob, labels, weight, ignore, reduction), "float64")


@pytest.mark.parametrize("dtype,label_dtype", list(itertools.product(FLOATS, ("int32", "int64"))))
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_dtypes_against_onnxruntime(run_op, rng, dtype, label_dtype, reduction):
    x, labels, weight = case(rng, (3, 4, 5), dtype, label_dtype, True, 2)
    attrs = {"reduction": reduction, "ignore_index": 2}
    rtol, atol = _TOL.get(dtype, (None, None))
    loss, log_prob = run_op(loss_op("softmax_cross_entropy_loss", reduction, 2, outputs=2), x, labels, weight)
    want_loss, want_log_prob = onnx_reference("SoftmaxCrossEntropyLoss", [x, labels, weight], [dtype, dtype],
                                              opset=13, **attrs)
    assert_close(loss, want_loss, dtype, rtol, atol)
    assert_close(log_prob, want_log_prob, dtype, rtol, atol)
    nll = run_op(loss_op("nll_loss", reduction, 2), x, labels, weight)
    (want_nll,) = onnx_reference("NegativeLogLikelihoodLoss", [x, labels, weight], [dtype], opset=22, **attrs)
    assert_close(nll, want_nll, dtype, rtol, atol)


def test_float16_sums_do_not_overflow(run_op):
    x = np.full((4000, 2, 10), -30.0, np.float16)  # each term 30: 1.2e6 in all, past float16
    labels = np.zeros((4000, 10), np.int64)
    got = run_op(loss_op("nll_loss", "mean", None), x, labels)
    assert_close(got, np.array(30.0), "float16")


def test_a_label_out_of_range_is_an_input_error(run_op):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(InvalidInputError, match=r"outside \[0, 3\)"):
        run_op(loss_op("nll_loss", "sum", -1), x, np.array([3, -1]))
    # the ignored one may lie anywhere
    assert run_op(loss_op("nll_loss", "sum", 7), x, np.array([7, 2])) == 0


@pytest.mark.parametrize("scores,labels,weight,reduction,message", [
    ((2, 3, 4), (3, 4), None, "mean", r"scores \(2, 3, 4\) and labels \(3, 4\) differ: 2 and 3"),
    ((2, 3, 4), (2,), None, "mean", r"labels \(N, d1, ..., dk\)"),
    ((2, 3, 5), (2, 5), (4,), "mean", r"the classes of weight and scores differ: 4 and 3"),
    ((2, 3, 5), (2, 5), (3, 1), "mean", r"weight must be \(C,\)"),
    ((2, 3, 5), (2, 5), None, "max", r"reduction must be one of"),
])
def test_shapes_and_attributes_are_checked(graph, scores, labels, weight, reduction, message):
    inputs = [ef.placeholder(ef.float32, scores), ef.placeholder(ef.int64, labels)]
    if weight:
        inputs.append(ef.placeholder(ef.float32, weight))
    for name in ("nll_loss", "softmax_cross_entropy_loss"):
        with pytest.raises(GraphError, match=rf"\b{name}: .*{message}"):
            apply(name, inputs, {"reduction": reduction})
