"""ef.train's optimizers against numpy references of their update rules, on the seeds'
linear regression, and through a packaged train signature."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import GraphError

STEPS = 5


# -- the problem: y = x @ W + b, mean squared error, a fresh batch per step --------------

def _batches(n=STEPS, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((6, 3)), rng.standard_normal((6, 2))) for _ in range(n)]


def _initial(seed=0):
    rng = np.random.default_rng(seed)
    return {"W": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}


def _numpy_grads(params, xv, yv):
    err = xv @ params["W"] + params["b"] - yv
    return {"W": 2 * xv.T @ err / err.size, "b": 2 * err.sum(0) / err.size}


def _graph(optimizer, initial, dtype=ef.float64):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(dtype, [None, 3], name="x")
        y = ef.placeholder(dtype, [None, 2], name="y")
        w = ef.Variable(initial["W"], name="W", dtype=dtype)
        b = ef.Variable(initial["b"], name="b", dtype=dtype)
        loss = ef.losses.mean_squared_error(y, x @ w + b)
        step = optimizer().minimize(loss)
    return g, x, y, {"W": w, "b": b}, loss, step


def _train_in_session(optimizer, initial, batches, feed_extra=lambda k: {}):
    g, x, y, params, _, step = _graph(optimizer, initial)
    sess = ef.Session(g)
    sess.run(ef.variables_initializer(ef.global_variables(g)))
    for k, (xv, yv) in enumerate(batches):
        sess.run(step, {x: xv, y: yv, **feed_extra(k)})
    return sess.run(params)


# -- numpy references: (state, param, grad, lr) -> new param, state updated in place -----

def ref_sgd(s, p, g, lr):
    return p - lr * g


def ref_momentum(mu, nesterov=False):
    def step(s, p, g, lr):
        s["a"] = mu * s.get("a", 0) + g
        return p - lr * (g + mu * s["a"]) if nesterov else p - lr * s["a"]
    return step


def ref_adam(b1=0.9, b2=0.999, eps=1e-8, wd=0.0):
    def step(s, p, g, lr):
        s["t"] = s.get("t", 0) + 1
        s["m"] = b1 * s.get("m", 0) + (1 - b1) * g
        s["v"] = b2 * s.get("v", 0) + (1 - b2) * g * g
        m_hat, v_hat = s["m"] / (1 - b1 ** s["t"]), s["v"] / (1 - b2 ** s["t"])
        return p * (1 - lr * wd) - lr * m_hat / (np.sqrt(v_hat) + eps)
    return step


def ref_adagrad(init):
    def step(s, p, g, lr):
        s["acc"] = s.get("acc", init) + g * g
        return p - lr * g / np.sqrt(s["acc"])
    return step


def ref_rmsprop(decay=0.9, mu=0.0, eps=1e-10, centered=False):
    def step(s, p, g, lr):
        s["ms"] = decay * s.get("ms", 1.0) + (1 - decay) * g * g
        s["mg"] = decay * s.get("mg", 0) + (1 - decay) * g if centered else 0
        s["mom"] = mu * s.get("mom", 0) + lr * g / np.sqrt(s["ms"] - s["mg"] ** 2 + eps)
        return p - s["mom"]
    return step


def _reference(rule, initial, batches, lrs):
    params = {k: v.copy() for k, v in initial.items()}
    state = {k: {} for k in params}
    for (xv, yv), lr in zip(batches, lrs):
        grads = _numpy_grads(params, xv, yv)
        params = {k: rule(state[k], params[k], grads[k], lr) for k in params}
    return params


CASES = {
    "sgd": (lambda: ef.train.GradientDescent(0.1), ref_sgd, 0.1),
    "momentum": (lambda: ef.train.Momentum(0.05, 0.9), ref_momentum(0.9), 0.05),
    "nesterov": (lambda: ef.train.Momentum(0.05, 0.9, use_nesterov=True), ref_momentum(0.9, True), 0.05),
    "adam": (lambda: ef.train.Adam(0.1), ref_adam(), 0.1),
    "adam_betas": (lambda: ef.train.Adam(0.05, beta1=0.5, beta2=0.9, epsilon=1e-3),
                   ref_adam(0.5, 0.9, 1e-3), 0.05),
    "adamw": (lambda: ef.train.AdamW(0.1, weight_decay=0.5), ref_adam(wd=0.5), 0.1),
    "adagrad": (lambda: ef.train.Adagrad(0.3, initial_accumulator_value=0.2), ref_adagrad(0.2), 0.3),
    "rmsprop": (lambda: ef.train.RMSProp(0.05), ref_rmsprop(), 0.05),
    "rmsprop_momentum": (lambda: ef.train.RMSProp(0.05, decay=0.8, momentum=0.7, epsilon=1e-6),
                         ref_rmsprop(0.8, 0.7, 1e-6), 0.05),
    "rmsprop_centered": (lambda: ef.train.RMSProp(0.05, momentum=0.5, centered=True),
                         ref_rmsprop(mu=0.5, centered=True), 0.05),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_update_rule_matches_numpy_reference(case):
    optimizer, rule, lr = CASES[case]
    initial, batches = _initial(), _batches()
    got = _train_in_session(optimizer, initial, batches)
    expected = _reference(rule, initial, batches, [lr] * STEPS)
    for k in initial:
        assert not np.allclose(expected[k], initial[k], rtol=1e-3)  # the steps moved it
        np.testing.assert_allclose(got[k], expected[k], rtol=1e-6, atol=1e-12, err_msg=f"{case} {k}")


def test_learning_rate_tensor_fed_per_step():
    lrs = [0.1, 0.05, 0.2, 0.01, 0.1]
    holder = {}

    def adam():
        holder["lr"] = ef.placeholder(ef.float64, [], name="lr")
        return ef.train.Adam(holder["lr"])
    initial, batches = _initial(), _batches()
    got = _train_in_session(adam, initial, batches, lambda k: {holder["lr"]: lrs[k]})
    expected = _reference(ref_adam(), initial, batches, lrs)
    for k in initial:
        np.testing.assert_allclose(got[k], expected[k], rtol=1e-6)


def test_float32_model_and_float32_learning_rate_tensor():
    g = ef.Graph()
    with g.as_default():
        w = ef.Variable(np.array([1.0, -2.0], np.float32), name="w")
        loss = ef.reduce_sum(w * w)
        lr = ef.constant(0.1, dtype=ef.float32)
        steps = [opt.minimize(loss) for opt in (ef.train.RMSProp(lr, momentum=0.9, centered=True),
                                                ef.train.Adam(lr), ef.train.AdamW(lr),
                                                ef.train.Adagrad(lr), ef.train.Momentum(0.1, 0.9))]
        sess = ef.Session()
        sess.run(ef.global_variables_initializer())
    for step in steps:
        sess.run(step)
    value = sess.run(w)
    assert value.dtype == np.float32 and np.all(np.abs(value) < [1.0, 2.0])


# -- slots, var_list, placement -----------------------------------------------------------

def test_slots_are_named_non_trainable_variables():
    g = ef.Graph()
    with g.as_default():
        w = ef.Variable(np.ones((2, 2)), name="W")
        frozen = ef.Variable(np.ones(2), name="frozen", trainable=False)
        ef.Variable(np.ones(2), name="unused")
        loss = ef.reduce_sum(w * frozen)
        opt = ef.train.Adam(0.1)
        grads_and_vars = opt.compute_gradients(loss)
        opt.apply_gradients(grads_and_vars)
    assert [v.name for _, v in grads_and_vars] == ["W"]
    assert [v.name for v in ef.trainable_variables(g)] == ["W", "unused"]
    slots = [v.name for v in ef.global_variables(g) if v.name.startswith("W/")]
    assert slots == ["W/Adam/m", "W/Adam/v", "W/Adam/step"]
    assert opt.get_slot(w, "m").name == "W/Adam/m" and opt.get_slot(w, "step").shape == ()
    assert opt.get_slot_names() == ["m", "step", "v"]
    assert opt.get_slot(frozen, "m") is None


def test_var_list_and_missing_gradients():
    g = ef.Graph()
    with g.as_default():
        a = ef.Variable(np.array([1.0, 2.0]), name="a")
        c = ef.Variable(np.array([3.0]), name="c")
        loss = ef.reduce_sum(a * a)
        step = ef.train.GradientDescent(0.25).minimize(loss, var_list=[a, c], name="sgd")
        assert step.name == "sgd"
        with pytest.raises(GraphError, match="no gradient reaches"):
            ef.train.GradientDescent(0.1).minimize(loss, var_list=[c])
        with pytest.raises(GraphError, match="not an ef.Variable"):
            ef.train.GradientDescent(0.1).minimize(loss, var_list=[loss])
        with pytest.raises(GraphError, match="learning_rate must be a scalar"):
            ef.train.Adam(ef.constant([0.1, 0.2]))
        with pytest.raises(GraphError, match="depends on no trainable"):
            ef.train.GradientDescent(0.1).minimize(ef.reduce_sum(ef.constant([1.0])))
        sess = ef.Session()
        sess.run(ef.global_variables_initializer())
    sess.run(step)
    np.testing.assert_allclose(sess.run(a), [0.5, 1.0])
    np.testing.assert_array_equal(sess.run(c), [3.0])


def test_updates_run_where_the_variable_lives():
    g = ef.Graph()
    with g.as_default():
        with ef.device("cloud"):
            w = ef.Variable(np.ones(3), name="w")
        v = ef.Variable(np.ones(3), name="v")
        step = ef.train.Momentum(0.1, 0.9).minimize(ef.reduce_sum(w * v))
    devices = {n.inputs[0].name: n.device for n in step.nodes}
    assert devices == {"w/Momentum/momentum": "cloud", "w": "cloud", "v/Momentum/momentum": "", "v": ""}


# -- the seeds' linear regression ----------------------------------------------------------

def test_linear_regression_recovers_weights():
    rng = np.random.default_rng(0)
    x_data = rng.random(100).astype(np.float32)
    y_data = (x_data * 0.1 + 0.3 + rng.normal(0, 0.003, 100)).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        W = ef.Variable(ef.random_uniform([1], -1.0, 1.0), name="W")  # noqa: N806  (the seeds' names)
        b = ef.Variable(ef.zeros([1]), name="b")
        y = W * x_data + b
        loss = ef.losses.mean_squared_error(y_data, y)
        train = ef.train.GradientDescent(0.5).minimize(loss)
        init = ef.global_variables_initializer()
    sess = ef.Session(g)
    sess.run(init)
    for _ in range(200):
        sess.run(train)
    w_value, b_value = sess.run([W, b])
    assert abs(w_value[0] - 0.1) < 0.01 and abs(b_value[0] - 0.3) < 0.01


# -- the same steps through a packaged train signature ---------------------------------------

def test_train_signature_matches_session(tmp_path):
    rng = np.random.default_rng(3)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float64, [None, 4], name="x")
        labels = ef.placeholder(ef.int64, [None], name="labels")
        w1 = ef.Variable(rng.standard_normal((4, 8)) * 0.5, name="w1")
        w2 = ef.Variable(rng.standard_normal((8, 3)) * 0.5, name="w2")
        logits = ef.nn.relu(x @ w1) @ w2
        loss = ef.losses.softmax_cross_entropy(labels, logits)
        step = ef.train.AdamW(0.05, weight_decay=0.1).minimize(loss)
        init = ef.global_variables_initializer()
    ef.save(g, tmp_path / "m.efl", signatures={"infer": ({"x": x}, {"logits": logits}),
                                               "train": ({"x": x, "labels": labels}, {"loss": loss}, [step])})
    batches = [(rng.standard_normal((5, 4)), rng.integers(0, 3, 5)) for _ in range(4)]
    interp = ef.Interpreter(tmp_path / "m.efl")
    train = interp.get_signature_runner("train")
    device_losses = [float(train(x=xv, labels=yv)["loss"]) for xv, yv in batches]
    device_state = interp.get_signature_runner("save")()

    sess = ef.Session(g)
    sess.run(init)
    host_losses = [float(sess.run([loss, step], {x: xv, labels: yv})[0]) for xv, yv in batches]
    variables = ef.global_variables(g)
    host_state = dict(zip([v.name for v in variables], sess.run(variables)))
    assert set(device_state) == set(host_state) == {
        "w1", "w2", *(f"{w}/AdamW/{s}" for w in ("w1", "w2") for s in ("m", "v", "step"))}
    np.testing.assert_allclose(device_losses, host_losses, rtol=1e-12)
    assert device_losses[-1] < device_losses[0]
    for name, value in host_state.items():
        np.testing.assert_allclose(device_state[name], value, rtol=1e-12, err_msg=name)
    np.testing.assert_array_equal(device_state["w1/AdamW/step"], 4.0)
