"""Gradients against central finite differences, in float64.

`check_gradients(fn, *arrays)` builds fn(*placeholders) -> Tensor, weighs its output with
a fixed random tensor so every element matters, and compares ef.gradients of the
weighted sum with (f(x + h e_i) - f(x - h e_i)) / 2h for every element of every input
(or a random sample of `max_elements` of them), all run through ef.Session.
"""
import numpy as np

import edgeflow as ef


def check_gradients(fn, *arrays, wrt=None, rtol=1e-5, atol=1e-7, h=1e-6, max_elements=60, seed=0):
    arrays = [np.asarray(a) for a in arrays]
    wrt = range(len(arrays)) if wrt is None else wrt
    g = ef.Graph()
    with g.as_default():
        xs = [ef.placeholder(a.dtype, a.shape, name=f"x{i}") for i, a in enumerate(arrays)]
        y = fn(*xs)
        y = y[0] if isinstance(y, (tuple, list)) else y
        weights = np.random.default_rng(seed).uniform(0.5, 1.5, [d for d in y.shape]).astype(y.dtype)
        loss = ef.reduce_sum(y * ef.constant(weights))
        grads = ef.gradients(loss, [xs[i] for i in wrt])
        sess = ef.Session()
    feed = {x: a for x, a in zip(xs, arrays)}
    analytic = sess.run([gr for gr in grads if gr is not None], feed)
    assert all(gr is not None for gr in grads), "no gradient reached an input"
    rng = np.random.default_rng(seed + 1)
    for k, (i, got) in enumerate(zip(wrt, analytic)):
        base = arrays[i]
        assert got.shape == base.shape, (got.shape, base.shape)
        flat = np.arange(base.size)
        if base.size > max_elements:
            flat = rng.choice(base.size, max_elements, replace=False)
        numeric = np.empty(len(flat))
        for j, e in enumerate(flat):
            values = []
            for sign in (1, -1):
                moved = base.copy()
                moved.reshape(-1)[e] += sign * h
                values.append(sess.run(loss, {**feed, xs[i]: moved}))
            numeric[j] = (values[0] - values[1]) / (2 * h)
        np.testing.assert_allclose(got.reshape(-1)[flat], numeric, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i}")
