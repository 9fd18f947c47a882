"""ef.layers against numpy references with the weights read back from the session, and the
random_uniform op they draw dropout masks from."""
import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply

rng = np.random.default_rng(0)


def r(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture
def graph():
    g = ef.Graph()
    with g.as_default():
        yield g


def session(values=None):
    """A session with every variable initialized, then set to `values` (variable -> array)."""
    sess = ef.Session()
    sess.run(ef.global_variables_initializer())
    for v, a in (values or {}).items():
        sess.run(ef.assign(v, a.astype(v.dtype)))
    return sess


def variable(graph, name):
    return graph.get_tensor_by_name(name)


# -- numpy references -----------------------------------------------------------------------

def same_pads(n, k, s):
    """TensorFlow's SAME: output ceil(n / s); the odd pad goes at the end."""
    total = max((-(-n // s) - 1) * s + k - n, 0)
    return total // 2, total - total // 2


def pad_hw(x, kernel, strides, padding, fill):
    if padding == "valid":
        return x
    (t, b), (lft, rgt) = (same_pads(n, k, s) for n, k, s in zip(x.shape[2:], kernel, strides))
    return np.pad(x, ((0, 0), (0, 0), (t, b), (lft, rgt)), constant_values=fill)


def conv_ref(x, w, b, strides, padding):
    x = pad_hw(x, w.shape[2:], strides, padding, 0.0)
    windows = sliding_window_view(x, w.shape[2:], axis=(2, 3))[:, :, ::strides[0], ::strides[1]]
    return np.einsum("nchwij,mcij->nmhw", windows, w) + b.reshape(1, -1, 1, 1)


def max_pool_ref(x, pool, strides, padding):
    x = pad_hw(x, pool, strides, padding, -np.inf)
    return sliding_window_view(x, pool, axis=(2, 3))[:, :, ::strides[0], ::strides[1]].max(axis=(4, 5))


def batch_norm_ref(x, gamma, beta, mean, var, eps, axis):
    shape = [1] * x.ndim
    shape[axis] = -1
    mean, var, gamma, beta = (a.reshape(shape) for a in (mean, var, gamma, beta))
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


# -- dense, conv2d, max_pool2d, flatten -----------------------------------------------------

def test_dense_matches_numpy_and_names_its_variables(graph):
    x = ef.placeholder(ef.float32, [None, 5], name="x")
    y = ef.layers.dense(x, 3, activation=ef.nn.relu)
    z = ef.layers.dense(y, 2, use_bias=False)
    names = [v.name for v in ef.global_variables()]
    assert names == ["dense/kernel", "dense/bias", "dense_1/kernel"]
    assert [v.name for v in ef.trainable_variables()] == names
    bias = r(3)
    sess = session({variable(graph, "dense/bias"): bias})
    w0, w1 = sess.run([variable(graph, "dense/kernel"), variable(graph, "dense_1/kernel")])
    assert w0.shape == (5, 3) and w1.shape == (3, 2)
    assert np.abs(w0).max() <= np.sqrt(6 / 8) and np.abs(w0).std() > 0  # glorot_uniform
    xs = r(4, 5)
    got_y, got_z = sess.run([y, z], {x: xs})
    want_y = np.maximum(xs @ w0 + bias, 0)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_z, want_y @ w1, rtol=1e-5, atol=1e-6)


def test_dense_on_rank_3_with_a_kernel_initializer(graph):
    x = ef.placeholder(ef.float32, [2, 3, 4])
    y = ef.layers.dense(x, 6, kernel_initializer=ef.ones, name="proj")
    assert y.shape == (2, 3, 6) and ef.global_variables()[0].name == "proj/kernel"
    xs = r(2, 3, 4)
    np.testing.assert_allclose(session().run(y, {x: xs}), np.repeat(xs.sum(-1, keepdims=True), 6, -1),
                               rtol=1e-5)


@pytest.mark.parametrize("padding", ["valid", "same"])
@pytest.mark.parametrize("kernel_size, strides", [(3, 1), ((2, 3), 2), (1, (2, 1))])
def test_conv2d_matches_numpy(graph, padding, kernel_size, strides):
    x = ef.placeholder(ef.float32, [2, 3, 7, 6], name="x")
    y = ef.layers.conv2d(x, 4, kernel_size, strides=strides, padding=padding, activation=ef.nn.relu)
    bias = r(4)
    sess = session({variable(graph, "conv2d/bias"): bias})
    w = sess.run(variable(graph, "conv2d/kernel"))
    k = (kernel_size,) * 2 if isinstance(kernel_size, int) else kernel_size
    s = (strides,) * 2 if isinstance(strides, int) else strides
    assert w.shape == (4, 3) + k
    xs = r(2, 3, 7, 6)
    want = np.maximum(conv_ref(xs, w, bias, s, padding), 0)
    got = sess.run(y, {x: xs})
    assert y.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_conv2d_same_with_unknown_spatial_size(graph):
    x = ef.placeholder(ef.float32, [None, 2, None, None], name="x")
    y = ef.layers.conv2d(x, 3, 3, strides=2, padding="same", use_bias=False)
    sess = session()
    w = sess.run(variable(graph, "conv2d/kernel"))
    for hw in [(5, 6), (8, 7)]:
        xs = r(1, 2, *hw)
        np.testing.assert_allclose(sess.run(y, {x: xs}), conv_ref(xs, w, np.zeros(3), (2, 2), "same"),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pool, strides, padding", [
    (2, 2, "valid"), (3, 1, "valid"), (3, 2, "same"), ((2, 3), (1, 2), "same"), (2, 2, "same")])
def test_max_pool2d_matches_numpy(graph, pool, strides, padding):
    x = ef.placeholder(ef.float32, [2, 3, 7, 6], name="x")
    y = ef.layers.max_pool2d(x, pool, strides, padding=padding)
    xs = r(2, 3, 7, 6)
    p = (pool,) * 2 if isinstance(pool, int) else pool
    s = (strides,) * 2 if isinstance(strides, int) else strides
    want = max_pool_ref(xs, p, s, padding)
    assert y.shape == want.shape
    np.testing.assert_array_equal(ef.Session().run(y, {x: xs}), want)


def test_flatten_static_and_dynamic(graph):
    x = ef.placeholder(ef.float32, [None, 2, 3, 4], name="x")
    y = ef.layers.flatten(x)
    assert y.shape == (None, 24)
    u = ef.placeholder(ef.float32, [None, 2, None], name="u")
    v = ef.layers.flatten(u)
    assert v.rank == 2
    xs, us = r(5, 2, 3, 4), r(3, 2, 7)
    got_y, got_v = ef.Session().run([y, v], {x: xs, u: us})
    np.testing.assert_array_equal(got_y, xs.reshape(5, 24))
    np.testing.assert_array_equal(got_v, us.reshape(3, 14))


def test_small_cnn_end_to_end(graph):
    """conv -> pool -> flatten -> dense, against the numpy references chained."""
    x = ef.placeholder(ef.float32, [None, 1, 8, 8], name="x")
    h = ef.layers.conv2d(x, 4, 3, padding="same", activation=ef.nn.relu)
    h = ef.layers.max_pool2d(h, 2, 2)
    logits = ef.layers.dense(ef.layers.flatten(h), 10)
    assert logits.shape == (None, 10)
    sess = session()
    w, b, k, kb = sess.run([variable(graph, n) for n in
                            ("conv2d/kernel", "conv2d/bias", "dense/kernel", "dense/bias")])
    xs = r(3, 1, 8, 8)
    h_ref = max_pool_ref(np.maximum(conv_ref(xs, w, b, (1, 1), "same"), 0), (2, 2), (2, 2), "valid")
    np.testing.assert_allclose(sess.run(logits, {x: xs}), h_ref.reshape(3, -1) @ k + kb, rtol=1e-4, atol=1e-5)


def test_layer_names_are_unique_per_graph(graph):
    x = ef.placeholder(ef.float32, [2, 3, 4, 4])
    ef.layers.conv2d(x, 2, 1)
    ef.layers.conv2d(x, 2, 1)
    ef.layers.batch_norm(x)
    ef.layers.batch_norm(x, name="bn")
    ef.layers.batch_norm(x, name="bn")
    names = [v.name for v in ef.global_variables()]
    assert names[:4] == ["conv2d/kernel", "conv2d/bias", "conv2d_1/kernel", "conv2d_1/bias"]
    stats = ["gamma", "beta", "moving_mean", "moving_variance"]
    assert names[4:] == [f"{s}/{n}" for s in ("batch_norm", "bn", "bn_1") for n in stats]
    assert [v.name for v in ef.trainable_variables()][4:] == [f"{s}/{n}" for s in ("batch_norm", "bn", "bn_1")
                                                            for n in ("gamma", "beta")]


def test_bad_arguments_are_refused(graph):
    x = ef.placeholder(ef.float32, [2, 3, 4, 4])
    with pytest.raises(GraphError, match="padding"):
        ef.layers.conv2d(x, 2, 3, padding="full")
    with pytest.raises(GraphError, match="kernel_size"):
        ef.layers.conv2d(x, 2, (3, 3, 3))
    with pytest.raises(GraphError, match="rate"):
        ef.layers.dropout(x, 1.0, training=True)
    with pytest.raises(GraphError, match="training"):
        ef.layers.dropout(x, 0.5, training=ef.placeholder(ef.float32, []))
    with pytest.raises(GraphError, match="last dimension"):
        ef.layers.dense(ef.placeholder(ef.float32, [2, None]), 3)


# -- dropout ---------------------------------------------------------------------------------

def test_dropout_statistics_and_scaling(graph):
    x = ef.placeholder(ef.float32, [None, 500], name="x")
    y = ef.layers.dropout(x, 0.3, training=True, seed=7)
    sess = ef.Session()
    ones = np.ones((200, 500), np.float32)
    first, second = sess.run(y, {x: ones}), sess.run(y, {x: ones})
    for out in (first, second):
        assert abs((out == 0).mean() - 0.3) < 0.01
        np.testing.assert_allclose(out[out != 0], 1 / 0.7, rtol=1e-6)
    assert not np.array_equal(first == 0, second == 0)  # new masks every run
    xs = r(200, 500)
    kept = sess.run(y, {x: xs}) != 0
    np.testing.assert_allclose(sess.run(y, {x: xs}).mean(), xs.mean(), atol=0.02)  # unbiased
    assert kept.any() and not kept.all()


def test_dropout_is_identity_when_not_training(graph):
    x = ef.placeholder(ef.float32, [4, 5])
    assert ef.layers.dropout(x, 0.5) is x
    assert ef.layers.dropout(x, 0.5, training=False) is x
    assert ef.layers.dropout(x, 0.0, training=True) is x


def test_dropout_with_a_training_tensor(graph):
    x = ef.placeholder(ef.float32, [100, 100], name="x")
    training = ef.placeholder(ef.bool_, [], name="training")
    y = ef.layers.dropout(x, 0.5, training=training, seed=1)
    sess = ef.Session()
    xs = r(100, 100)
    np.testing.assert_array_equal(sess.run(y, {x: xs, training: False}), xs)
    out = sess.run(y, {x: xs, training: True})
    assert abs((out == 0).mean() - 0.5) < 0.03
    np.testing.assert_allclose(out[out != 0], 2 * xs[out != 0], rtol=1e-6)


def _first_masks(seed=None, graph_seed=None, layers=1):
    g = ef.Graph()
    with g.as_default():
        if graph_seed is not None:
            ef.set_random_seed(graph_seed)
        x = ef.placeholder(ef.float32, [50, 50], name="x")
        ys = [ef.layers.dropout(x, 0.5, training=True, seed=seed) for _ in range(layers)]
        return [m == 0 for m in ef.Session().run(ys, {x: np.ones((50, 50), np.float32)})]


def test_dropout_is_reproducible_with_a_seed():
    assert np.array_equal(_first_masks(seed=3)[0], _first_masks(seed=3)[0])
    assert not np.array_equal(_first_masks(seed=3)[0], _first_masks(seed=4)[0])
    a, b = _first_masks(graph_seed=5, layers=2)
    c, d = _first_masks(graph_seed=5, layers=2)
    assert np.array_equal(a, c) and np.array_equal(b, d)
    assert not np.array_equal(a, b)  # layers without a seed draw different ones from the graph's


def test_dropout_gradient_is_the_mask_scaled(graph):
    x = ef.placeholder(ef.float32, [30, 40], name="x")
    w = ef.Variable(np.ones((30, 40), np.float32), name="w")
    y = ef.layers.dropout(x * w, 0.25, training=True, seed=2)
    dx, dw = ef.gradients(ef.reduce_sum(y), [x, w])
    sess = session()
    xs = r(30, 40)
    out, gx, gw = sess.run([y, dx, dw], {x: xs})
    mask = out != 0
    np.testing.assert_allclose(gx, mask / 0.75, rtol=1e-6)
    np.testing.assert_allclose(gw, mask * xs / 0.75, rtol=1e-6)


# -- batch_norm ------------------------------------------------------------------------------

def test_batch_norm_inference_uses_the_moving_statistics(graph):
    x = ef.placeholder(ef.float32, [None, 3, 4, 5], name="x")
    y = ef.layers.batch_norm(x, epsilon=1e-3)
    assert ef.layers.update_ops() == []
    params = {n: rng.uniform(0.5, 2.0, 3).astype(np.float32) for n in
              ("gamma", "beta", "moving_mean", "moving_variance")}
    sess = session({variable(graph, f"batch_norm/{n}"): a for n, a in params.items()})
    xs = r(2, 3, 4, 5)
    want = batch_norm_ref(xs, params["gamma"], params["beta"], params["moving_mean"],
                          params["moving_variance"], 1e-3, 1)
    np.testing.assert_allclose(sess.run(y, {x: xs}), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, axis", [((8, 3, 4, 5), 1), ((16, 6), -1), ((4, 5, 6, 3), -1)])
def test_batch_norm_training_and_moving_averages(graph, shape, axis):
    """A few steps with a Tensor `training`: batch statistics and moving averages against
    numpy; then inference runs, which use the moving statistics and leave them alone."""
    x = ef.placeholder(ef.float32, shape, name="x")
    training = ef.placeholder(ef.bool_, [], name="training")
    y = ef.layers.batch_norm(x, training=training, momentum=0.9, epsilon=1e-3, axis=axis)
    updates = ef.layers.update_ops()
    assert len(updates) == 1 and isinstance(updates[0], ef.Operation)
    channels = shape[axis]
    gamma, beta = rng.uniform(0.5, 2.0, channels).astype(np.float32), r(channels)
    sess = session({variable(graph, "batch_norm/gamma"): gamma, variable(graph, "batch_norm/beta"): beta})
    stats = [variable(graph, "batch_norm/moving_mean"), variable(graph, "batch_norm/moving_variance")]
    axis %= len(shape)
    others = tuple(a for a in range(len(shape)) if a != axis)
    mean_ref, var_ref = np.zeros(channels), np.ones(channels)
    for step in range(3):
        xs = (r(*shape) * (step + 1) + step).astype(np.float32)
        got, _ = sess.run([y, updates], {x: xs, training: True})
        mean, var = xs.mean(axis=others), xs.var(axis=others)
        np.testing.assert_allclose(got, batch_norm_ref(xs, gamma, beta, mean, var, 1e-3, axis),
                                   rtol=1e-4, atol=1e-4)
        mean_ref, var_ref = 0.9 * mean_ref + 0.1 * mean, 0.9 * var_ref + 0.1 * var
        for v, want in zip(sess.run(stats), (mean_ref, var_ref)):
            np.testing.assert_allclose(v, want, rtol=1e-5, atol=1e-6)
    xs = r(*shape)
    got, _ = sess.run([y, updates], {x: xs, training: False})
    np.testing.assert_allclose(got, batch_norm_ref(xs, gamma, beta, mean_ref, var_ref, 1e-3, axis),
                               rtol=1e-4, atol=1e-4)
    for v, want in zip(sess.run(stats), (mean_ref, var_ref)):
        np.testing.assert_allclose(v, want, rtol=1e-5, atol=1e-6)


def test_batch_norm_with_python_training_and_a_train_op(graph):
    x = ef.placeholder(ef.float32, [10, 4], name="x")
    y = ef.layers.batch_norm(x, training=True, momentum=0.5)
    xs = r(10, 4) * 3 + 1
    sess = session()
    out = sess.run(y, {x: xs})
    np.testing.assert_allclose(out.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(out.var(0), xs.var(0) / (xs.var(0) + 1e-3), rtol=1e-4)
    moving_mean = variable(graph, "batch_norm/moving_mean")
    np.testing.assert_array_equal(sess.run(moving_mean), 0)  # the output alone updates nothing
    sess.run(ef.group(*ef.layers.update_ops()), {x: xs})
    np.testing.assert_allclose(sess.run(moving_mean), 0.5 * xs.mean(0), rtol=1e-5)


def test_batch_norm_training_gradient(graph):
    """dL/dx, dL/dgamma, dL/dbeta against the closed form of batch norm's backward pass."""
    x = ef.placeholder(ef.float64, [6, 3, 2, 2], name="x")
    y = ef.layers.batch_norm(x, training=True, epsilon=1e-3)
    weights = rng.standard_normal((6, 3, 2, 2))
    gamma_v, beta_v = variable(graph, "batch_norm/gamma"), variable(graph, "batch_norm/beta")
    grads = ef.gradients(ef.reduce_sum(y * ef.constant(weights)), [x, gamma_v, beta_v])
    gamma = rng.uniform(0.5, 2.0, 3)
    sess = session({gamma_v: gamma})
    xs = rng.standard_normal((6, 3, 2, 2)) * 2 + 1
    dx, dgamma, dbeta = sess.run(grads, {x: xs})
    axes, n = (0, 2, 3), 6 * 2 * 2
    mean, var = xs.mean(axes, keepdims=True), xs.var(axes, keepdims=True)
    xhat = (xs - mean) / np.sqrt(var + 1e-3)
    dxhat = weights * gamma.reshape(1, -1, 1, 1)
    want_dx = (n * dxhat - dxhat.sum(axes, keepdims=True) - xhat * (dxhat * xhat).sum(axes, keepdims=True)) \
        / (n * np.sqrt(var + 1e-3))
    np.testing.assert_allclose(dx, want_dx, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(dgamma, (weights * xhat).sum(axes), rtol=1e-10)
    np.testing.assert_allclose(dbeta, weights.sum(axes), rtol=1e-10)


# -- the random_uniform op --------------------------------------------------------------------

def _uniform(shape, **attrs):
    return apply("random_uniform", [np.asarray(shape, np.int64)], attrs)


@pytest.mark.parametrize("dtype", [ef.float32, ef.float64])
def test_random_uniform_range_shape_dtype_and_seed(graph, dtype):
    u = _uniform([400, 300], dtype=dtype, minval=-2.0, maxval=3.0, seed=11)
    assert u.shape == (400, 300) and u.dtype == dtype
    assert u.spec.value is None  # not folded while building, though its operand is known
    sess = ef.Session()
    first, second = sess.run(u), sess.run(u)
    for a in (first, second):
        assert a.dtype == dtype and a.shape == (400, 300)
        assert a.min() >= -2.0 and a.max() < 3.0
        assert abs(a.mean() - 0.5) < 0.02 and abs(a.var() - 25 / 12) < 0.03
    assert not np.array_equal(first, second)
    gen = np.random.default_rng(11)
    for a in (first, second):
        np.testing.assert_allclose(a, gen.random((400, 300), dtype=dtype) * 5 - 2, rtol=1e-6)


def test_random_uniform_with_a_shape_known_only_when_running(graph):
    x = ef.placeholder(ef.float32, [None, 3], name="x")
    u = apply("random_uniform", [ef.shape(x)], {"seed": 0})
    assert u.rank == 2
    assert ef.Session().run(u, {x: np.zeros((5, 3), np.float32)}).shape == (5, 3)


def test_random_uniform_bad_attributes(graph):
    shape = [2]
    with pytest.raises(GraphError, match="float32 or float64"):
        _uniform(shape, dtype=ef.int32)
    with pytest.raises(GraphError, match="below maxval"):
        _uniform(shape, minval=1.0, maxval=1.0)
    with pytest.raises(GraphError, match="seed"):
        _uniform(shape, seed=-1)


def test_random_uniform_in_a_saved_model_is_run_not_folded(graph, tmp_path):
    x = ef.placeholder(ef.float32, [None, 4], name="x")
    noise = _uniform([3, 4], seed=5)  # operand known when packaging and when preparing
    y = ef.layers.dropout(x, 0.5, training=True, seed=6)
    path = tmp_path / "random.efl"
    ef.save(graph, str(path), {"infer": ({"x": x}, {"noise": noise, "y": y})})
    xs = np.ones((8, 4), np.float32)
    runs = []
    for _ in range(2):
        interp = ef.Interpreter(str(path))
        runner = interp.get_signature_runner("infer")
        runs.append([runner(x=xs) for _ in range(2)])
        opcodes = [interp.model.subgraphs[0].operators[i].opcode for i in runner.last_plan.step_ops]
        assert opcodes.count("random_uniform") == 2
    (a, b), (c, d) = runs
    assert not np.array_equal(a["noise"], b["noise"]) and not np.array_equal(a["y"], b["y"])
    for one, other in ((a, c), (b, d)):  # the same sequence in every interpreter
        np.testing.assert_array_equal(one["noise"], other["noise"])
        np.testing.assert_array_equal(one["y"], other["y"])
    gen = np.random.default_rng(5)
    np.testing.assert_array_equal(a["noise"], gen.random((3, 4), dtype=np.float32))
    np.testing.assert_array_equal(b["noise"], gen.random((3, 4), dtype=np.float32))


def test_random_uniform_bytes_round_trip(graph):
    """The op and its attributes survive the file format."""
    u = _uniform([2, 3], dtype=ef.float64, minval=10.0, maxval=11.0, seed=2**40)
    interp = ef.Interpreter(writer.to_bytes(ef.to_model(graph, {"infer": ({}, {"u": u})})))
    out = interp.get_signature_runner("infer")()["u"]
    np.testing.assert_array_equal(out, np.random.default_rng(2**40).random((2, 3)) + 10.0)
