"""Gradient rules of activations, normalization, reductions, einsum and recurrent layers
against finite differences (float64)."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

from .gradcheck import check_gradients

rng = np.random.default_rng(0)


def r(*shape, low=-2.0, high=2.0):
    return rng.uniform(low, high, shape)


def away_from(x, points, gap=1e-3):
    """x with elements near any of `points` (kinks) moved `gap` off them."""
    x = np.array(x, np.float64)
    for p in points:
        near = np.abs(x - p) < gap
        x[near] = p + np.where(x[near] >= p, gap, -gap)
    return x


def op(name, **attrs):
    return lambda *xs: apply(name, list(xs), attrs)


# -- activations --------------------------------------------------------------------------

@pytest.mark.parametrize("name, attrs, kinks", [
    ("clip", {"min": -0.5, "max": 1.0}, (-0.5, 1.0)), ("clip", {"min": 0.0}, (0.0,)),
    ("clip", {"max": -0.25}, (-0.25,)), ("clip", {}, ()),
    ("leaky_relu", {}, (0.0,)), ("leaky_relu", {"alpha": 0.3}, (0.0,)),
    ("hard_sigmoid", {}, (-2.5, 2.5)), ("hard_sigmoid", {"alpha": 0.5, "beta": 0.25}, (-0.5, 1.5)),
    ("hard_swish", {}, (-3.0, 3.0)),
    ("gelu", {}, ()), ("gelu", {"approximate": "tanh"}, ()),
    ("erf", {}, ()), ("softplus", {}, ()),
    ("elu", {}, (0.0,)), ("elu", {"alpha": 0.5}, (0.0,)),
    ("selu", {}, (0.0,)), ("selu", {"alpha": 2.0, "gamma": 1.5}, (0.0,)),
    ("swish", {}, ()), ("swish", {"alpha": 0.4}, ()),
])
def test_activation(name, attrs, kinks):
    x = away_from(r(4, 10, low=-4, high=4), kinks)
    check_gradients(op(name, **attrs), x, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_swiglu(alpha):
    check_gradients(op("swiglu", alpha=alpha), r(3, 7, low=-4, high=4), r(3, 7), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("slope_shape", [(3, 1, 1), (1,), (2, 3, 4, 5)])
def test_prelu(slope_shape):
    """Both operands, the slope summed over the axes it broadcast along."""
    check_gradients(op("prelu"), away_from(r(2, 3, 4, 5, low=-4, high=4), (0.0,)), r(*slope_shape, low=-1, high=1),
                    rtol=1e-5, atol=1e-8)


def test_clip_gradient_is_zero_outside_and_passes_at_the_bounds():
    x = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    g = ef.Graph()
    with g.as_default():
        p = ef.placeholder(ef.float64, [5])
        grads = [ef.gradients(ef.reduce_sum(apply("clip", [p], bounds)), [p])[0]
                 for bounds in ({"min": -1.0, "max": 1.0}, {"min": 1.0, "max": -1.0})]
        inside, empty = ef.Session().run(grads, {p: x})
    np.testing.assert_array_equal(inside, [0, 1, 1, 1, 0])
    np.testing.assert_array_equal(empty, [0, 0, 0, 0, 0])


def test_clip_grad_gradients():
    """clip_grad (clip's gradient op) is linear in dy with clip's mask; x gets none."""
    x = away_from(r(4, 10, low=-4, high=4), (-0.5, 1.0))
    check_gradients(lambda dy: apply("clip_grad", [dy, ef.constant(x)], {"min": -0.5, "max": 1.0}), r(4, 10),
                    rtol=1e-5, atol=1e-8)


def test_relu_grad_gradients():
    """relu_grad (relu's gradient op) is linear in dy with relu's mask; x gets none."""
    x = away_from(r(4, 10, low=-4, high=4), (0.0,))
    check_gradients(lambda dy: apply("relu_grad", [dy, ef.constant(x)], {}), r(4, 10), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("op, attrs", [("relu_grad", {}), ("clip_grad", {"min": 0.0, "max": 6.0})])
def test_mask_gradient_ops_take_operands_of_one_shape(op, attrs):
    g = ef.Graph()
    with g.as_default():
        with pytest.raises(GraphError, match=f"{op}: dy and x must have one shape, got \\(2, 3\\) and \\(3, 2\\)"):
            apply(op, [ef.placeholder(ef.float32, (2, 3)), ef.placeholder(ef.float32, (3, 2))], attrs)
        assert apply(op, [ef.placeholder(ef.float32, (None, 3)), ef.placeholder(ef.float32, (2, None))],
                     attrs).shape == (2, 3)


def test_gelu_gradients_far_out():
    x = np.array([-40.0, -8.0, 8.0, 40.0])
    for approximate in ("none", "tanh"):
        g = ef.Graph()
        with g.as_default():
            p = ef.placeholder(ef.float64, [4])
            (grad,) = ef.gradients(ef.reduce_sum(apply("gelu", [p], {"approximate": approximate})), [p])
            out = ef.Session().run(grad, {p: x})
        np.testing.assert_allclose(out, [0, 0, 1, 1], atol=1e-12)


# -- normalization ------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 2, 2)])
def test_batch_norm(shape):
    channels = shape[1]
    check_gradients(op("batch_norm", epsilon=1e-3), r(*shape), r(channels), r(channels), r(channels),
                    rng.uniform(0.5, 2.0, channels), rtol=1e-5)


@pytest.mark.parametrize("shape, axis, scale, bias", [
    ((3, 6), -1, (6,), (6,)), ((2, 3, 4), 1, (3, 4), (4,)), ((2, 3, 4), -1, (4,), None),
    ((2, 3, 4), 0, (1, 4), (3, 1)), ((2, 5), 1, (1,), (5,)),
])
def test_layer_norm(shape, axis, scale, bias):
    arrays = [r(*shape), r(*scale)] + ([r(*bias)] if bias else [])
    check_gradients(op("layer_norm", axis=axis, epsilon=1e-5), *arrays, rtol=1e-5)


def test_layer_norm_of_nearly_constant_rows():
    """Rows whose spread is far below epsilon: the closed form stays finite and right."""
    x = 3.0 + 1e-4 * r(2, 8)
    check_gradients(op("layer_norm", epsilon=1e-3), x, r(8), r(8), rtol=1e-5, atol=1e-6)


# -- reductions ---------------------------------------------------------------------------

AXES = [((), False), ((1,), False), ((0, 2), True), ((-1,), True)]


@pytest.mark.parametrize("name", ["reduce_min", "reduce_prod", "reduce_l2", "reduce_log_sum_exp"])
@pytest.mark.parametrize("axes, keepdims", AXES)
def test_reductions(name, axes, keepdims):
    x = r(3, 4, 5, low=0.5, high=1.5) * rng.choice([-1, 1], (3, 4, 5)) if name == "reduce_prod" else r(3, 4, 5)
    check_gradients(op(name, axes=axes, keepdims=keepdims), x, rtol=1e-5)


def _gradient(fn, x):
    g = ef.Graph()
    with g.as_default():
        p = ef.placeholder(ef.float64, x.shape)
        (grad,) = ef.gradients(ef.reduce_sum(fn(p)), [p])
        return ef.Session().run(grad, {p: x})


def test_reduce_prod_with_zeros():
    x = np.array([[2.0, 0.0, 3.0, 4.0], [0.0, 5.0, 0.0, 1.0], [1.0, 2.0, 3.0, -1.0]])
    expected = [[0, 24, 0, 0], [0, 0, 0, 0], [-6, -3, -2, 6]]
    np.testing.assert_array_equal(_gradient(op("reduce_prod", axes=(1,)), x), expected)
    check_gradients(op("reduce_prod", axes=(1,)), x)  # piecewise polynomial: exact enough


def test_reduce_min_splits_ties_and_l2_of_zeros_is_zero():
    x = np.array([[1.0, -3.0, -3.0], [0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(_gradient(op("reduce_min", axes=(1,)), x), [[0, 0.5, 0.5], [1 / 3] * 3])
    np.testing.assert_array_equal(_gradient(op("reduce_l2", axes=(1,)), x)[1], [0, 0, 0])


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum(axis, exclusive, reverse):
    check_gradients(op("cumsum", axis=axis, exclusive=exclusive, reverse=reverse), r(3, 4, 2))


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumprod(axis, exclusive, reverse):
    check_gradients(op("cumprod", axis=axis, exclusive=exclusive, reverse=reverse), r(3, 4, 2))


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumprod_with_zeros(exclusive, reverse):
    """No zero, one (first, inside, last) and two per line: a polynomial in each x, so
    central differences are exact."""
    x = r(6, 5)
    x[1, 0] = x[2, 2] = x[3, 4] = x[4, 1] = x[4, 3] = x[5, 2] = x[5, 3] = 0
    check_gradients(op("cumprod", axis=1, exclusive=exclusive, reverse=reverse), x, max_elements=30)


@pytest.mark.parametrize("shape, k, axis, largest", [
    ((3, 6), 2, -1, True), ((3, 6), 3, 0, False), ((2, 5, 3), 4, 1, True), ((7,), 7, 0, False),
    ((2, 3, 4), 1, 0, True),
])
def test_topk_values(shape, k, axis, largest):
    x = rng.permutation(np.arange(np.prod(shape)) * 0.37).reshape(shape)  # no ties
    check_gradients(lambda p: apply("topk", [p], {"k": k, "axis": axis, "largest": largest})[0], x)


def test_topk_with_dynamic_batch():
    x = r(5, 6)
    g = ef.Graph()
    with g.as_default():
        p = ef.placeholder(ef.float64, [None, 6])
        values, indices = apply("topk", [p], {"k": 2})
        (grad,) = ef.gradients(ef.reduce_sum(values * values), [p])
        out, idx = ef.Session().run([grad, indices], {p: x})
    expected = np.zeros_like(x)
    np.put_along_axis(expected, idx, 2 * np.take_along_axis(x, idx, 1), 1)
    np.testing.assert_array_equal(out, expected)


def test_argmax_has_no_gradient():
    from edgeflow import ops
    assert ops.get("argmax").gradient is not None
    g = ef.Graph()
    with g.as_default():
        p = ef.placeholder(ef.float64, [3, 4])
        y = ef.reduce_sum(ef.cast(ef.argmax(p, axis=1), ef.float64) * p[:, 0])
        (grad,) = ef.gradients(y, [p])
        idx, out = ef.Session().run([ef.argmax(p, axis=1), grad], {p: np.eye(3, 4)})
    np.testing.assert_array_equal(out[:, 0], idx)


# -- einsum -------------------------------------------------------------------------------

@pytest.mark.parametrize("equation, shapes", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 2)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (3, 4, 2)]),
    ("ij->ji", [(3, 4)]),
    ("bi,bi->b", [(3, 4), (3, 4)]),
    ("ij,jk", [(3, 4), (4, 2)]),  # implicit output: 'ik'
    ("ij->i", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("bi,bj->b", [(3, 4), (3, 2)]),
    ("i,j->ij", [(3,), (4,)]),
    ("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)]),  # a size-1 label broadcast
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("ij,ii->j", [(3, 4), (3, 3)]),  # a diagonal in the other operand
    ("...i,i->...", [(2, 3, 4), (4,)]),
    ("i...,i->...", [(4, 2, 3), (4,)]),
    ("a...b,b->a", [(2, 3), (3,)]),  # '...' of no axes
    ("ii->i", [(3, 3)]), ("ii->", [(3, 3)]), ("iji->j", [(3, 2, 3)]),  # diagonals
    ("bii,bj->ij", [(2, 3, 3), (2, 4)]), ("...ii->...i", [(2, 3, 3)]), ("iii->", [(3, 3, 3)]),
])
def test_einsum(equation, shapes):
    check_gradients(op("einsum", equation=equation),
                    *[r(*s) for s in shapes])


# -- recurrent layers ---------------------------------------------------------------------

SEQ, BATCH, SIZE, HIDDEN = 3, 2, 3, 2


def _recurrent(name, gates, direction="forward", optional=("B", "initial_h", "initial_c"), **attrs):
    """fn(*arrays) -> a mix of all the layer's outputs, and the arrays: X, W, R, then `optional`."""
    dirs = 2 if direction == "bidirectional" else 1
    shapes = {"X": (SEQ, BATCH, SIZE), "W": (dirs, gates * HIDDEN, SIZE), "R": (dirs, gates * HIDDEN, HIDDEN),
              "B": (dirs, 2 * gates * HIDDEN), "initial_h": (dirs, BATCH, HIDDEN), "initial_c": (dirs, BATCH, HIDDEN)}
    flags = {"B": "has_bias", "initial_h": "has_initial_h", "initial_c": "has_initial_c"}
    names = ["X", "W", "R"] + list(optional)
    attrs = {"hidden_size": HIDDEN, "direction": direction, **attrs, **{flags[k]: True for k in optional}}

    def fn(*xs):
        y, *states = apply(name, list(xs), attrs)
        mixed = ef.reduce_sum(y * y, axis=0) + states[0]
        return mixed + ef.exp(states[1]) if len(states) > 1 else mixed
    return fn, [r(*shapes[k], low=-1, high=1) for k in names]


LSTM_CASES = [
    {}, {"direction": "reverse"}, {"direction": "bidirectional"}, {"optional": ()},
    {"optional": ("B",)}, {"optional": ("initial_c",)}, {"clip": 0.7}, {"input_forget": True},
    {"direction": "bidirectional", "optional": ("initial_h",), "input_forget": True, "clip": 1.0},
]
GRU_CASES = [
    {}, {"linear_before_reset": 1}, {"direction": "reverse"}, {"direction": "bidirectional"},
    {"optional": ()}, {"optional": ("B",), "linear_before_reset": 1}, {"clip": 0.5},
    {"clip": 0.5, "linear_before_reset": 1, "direction": "bidirectional"},
]


@pytest.mark.parametrize("case", LSTM_CASES, ids=str)
def test_lstm(case):
    fn, arrays = _recurrent("lstm", 4, **case)
    check_gradients(fn, *arrays, rtol=1e-5, atol=1e-8, max_elements=24)


@pytest.mark.parametrize("case", GRU_CASES, ids=str)
def test_gru(case):
    case = {"optional": ("B", "initial_h"), **case}
    fn, arrays = _recurrent("gru", 3, **case)
    check_gradients(fn, *arrays, rtol=1e-5, atol=1e-8, max_elements=24)


@pytest.mark.parametrize("name, gates, output", [("lstm", 4, 1), ("lstm", 4, 2), ("gru", 3, 1), ("gru", 3, 0)])
def test_recurrent_single_output(name, gates, output):
    """Outputs that no gradient reaches pass zeros to the gradient op."""
    fn, arrays = _recurrent(name, gates, optional=("B",))
    attrs = {"hidden_size": HIDDEN, "has_bias": True}
    check_gradients(lambda *xs: apply(name, list(xs), attrs)[output], *arrays, rtol=1e-5, atol=1e-8,
                    max_elements=24)


def test_gradients_with_a_dynamic_batch():
    """lstm, einsum and topk gradients built with a None batch dimension run at any batch."""
    w, r_, wq = r(1, 8, 3), r(1, 8, 2), r(2, 4)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float64, [4, None, 3])
        _, h, _ = apply("lstm", [x, ef.constant(w), ef.constant(r_)], {"hidden_size": 2})
        scores = apply("einsum", [h[0], ef.constant(wq)], {"equation": "bi,ij->bj"})
        values, _ = apply("topk", [scores], {"k": 2})
        loss = ef.reduce_sum(values * values)
        (grad,) = ef.gradients(loss, [x])
        sess = ef.Session()
    for batch in (1, 3):
        xv = r(4, batch, 3)
        got = sess.run(grad, {x: xv})
        numeric = np.zeros_like(xv)
        for i in np.ndindex(xv.shape):
            moved = [xv.copy(), xv.copy()]
            moved[0][i] += 1e-6
            moved[1][i] -= 1e-6
            numeric[i] = (sess.run(loss, {x: moved[0]}) - sess.run(loss, {x: moved[1]})) / 2e-6
        np.testing.assert_allclose(got, numeric, rtol=1e-5, atol=1e-8)


def test_recurrent_grad_ops_check_their_gradients():
    g = ef.Graph()
    with g.as_default():
        x, w, rr = (ef.placeholder(ef.float32, s) for s in [(3, 2, 4), (1, 9, 4), (1, 9, 3)])
        y, h = apply("gru", [x, w, rr], {"hidden_size": 3})
        dx, dw, dr = apply("gru_grad", [x, w, rr, y, h], {"hidden_size": 3})
        assert (dx.shape, dw.shape, dr.shape) == ((3, 2, 4), (1, 9, 4), (1, 9, 3))
        with pytest.raises(GraphError, match="dY_h must have shape"):
            apply("gru_grad", [x, w, rr, y, y], {"hidden_size": 3})
        with pytest.raises(GraphError, match="dY must be float32"):
            apply("gru_grad", [x, w, rr, ef.cast(y, ef.float64), h], {"hidden_size": 3})


# -- attention ----------------------------------------------------------------------------

def _attention(attrs, past=False):
    def fn(*xs):
        flags = {"has_past": past, "with_present": past, **attrs}
        outs = apply("attention", list(xs), flags)
        if not past:
            return outs
        # every output weighs in, so the present_* gradients are checked too
        y, present_key, present_value = outs
        return ef.reduce_sum(y) + ef.reduce_sum(present_key * present_key) + ef.reduce_sum(present_value)
    return fn


@pytest.mark.parametrize("shapes, attrs", [
    ([(2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3)], {}),
    ([(1, 4, 3, 4), (1, 2, 3, 4), (1, 2, 3, 5)], {"is_causal": True, "scale": 0.7}),
    ([(2, 3, 8), (2, 4, 4), (2, 4, 6)], {"q_num_heads": 2, "kv_num_heads": 1, "softcap": 1.5}),
    ([(1, 2, 3, 4), (1, 2, 4, 4), (1, 2, 4, 4), (1, 4)], {"has_mask": True, "left_window": 1}),
])
def test_attention(shapes, attrs):
    xs = [r(*s) for s in shapes]
    wrt = range(3)
    if attrs.get("has_mask"):
        xs[3] = xs[3] > -1.0  # a bool mask, with some keys masked
        xs[3][..., 0] = True
    check_gradients(_attention(attrs), *xs, wrt=wrt, rtol=1e-5, atol=1e-8)


def test_attention_with_a_past_and_grouped_heads():
    xs = [r(1, 4, 2, 3), r(1, 2, 2, 3), r(1, 2, 2, 5), r(1, 2, 3, 3), r(1, 2, 3, 5)]
    check_gradients(_attention({"is_causal": True}, past=True), *xs, rtol=1e-5, atol=1e-8)


def test_attention_has_no_gradient_through_its_scores_output():
    g = ef.Graph()
    with g.as_default():
        q = ef.placeholder("float64", (1, 1, 2, 3))
        y, scores = apply("attention", [q, q, q], {"qk_output": 0})
        with pytest.raises(GraphError, match="no gradient flows back through qk_matmul_output"):
            ef.gradients(ef.reduce_sum(scores), [q])


@pytest.mark.parametrize("shapes, attrs", [
    ([(2, 2, 3, 4), (2, 3, 2), (2, 3, 2)], {}),
    ([(1, 3, 12), (5, 2), (5, 2), (1, 3)], {"num_heads": 2, "interleaved": True, "rotary_embedding_dim": 4}),
])
def test_rotary_embedding(shapes, attrs):
    xs = [r(*s) for s in shapes]
    if len(xs) == 4:
        xs[3] = np.array([[4, 0, 2]])
    check_gradients(op("rotary_embedding", **attrs), *xs, wrt=[0], rtol=1e-5, atol=1e-8)
