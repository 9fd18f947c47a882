"""Running control flow in the interpreter: subgraph plans made once per input shapes,
a greedy decoder against numpy, training through a loop against the same model unrolled,
and OpenCL partitions inside loop bodies."""
import numpy as np

import edgeflow as ef
import edgeflow.accel
from edgeflow.interp.staged import StagedPlan


def _save(tmp_path, g, signatures, name="m.efl"):
    ef.save(g, tmp_path / name, signatures)
    return str(tmp_path / name)


def test_a_loop_with_fixed_shapes_plans_its_body_once(tmp_path):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        n = ef.placeholder(ef.int32, [], name="n")
        w = ef.constant(np.eye(4, dtype=np.float32) * 0.5)
        _, y = ef.while_loop(lambda i, h: i < n, lambda i, h: (i + 1, ef.tanh(ef.matmul(h, w)) + h), [ef.constant(0), x])
    interp = ef.Interpreter(_save(tmp_path, g, {"infer": ({"x": x, "n": n}, {"y": y})}))
    run = interp.get_signature_runner("infer")
    xv = np.ones((2, 4), np.float32)
    for count in (1, 5, 50):
        want = xv.copy()
        for _ in range(count):
            want = np.tanh(want @ (np.eye(4) * 0.5)) + want
        np.testing.assert_allclose(run(x=xv, n=np.int32(count))["y"], want, rtol=1e-5)
    plans = interp._program.plans()
    assert len(plans) == 2  # one for the condition, one for the body: 56 iterations, one shape
    run(x=np.ones((3, 4), np.float32), n=np.int32(2))
    assert len(interp._program.plans()) == 4  # a new batch size: each planned once more


def test_a_growing_loop_variable_replans_the_body_only_when_its_shape_changes(tmp_path):
    g = ef.Graph()
    with g.as_default():
        n = ef.placeholder(ef.int32, [], name="n")
        x = ef.placeholder(ef.float32, [2], name="x")

        def body(i, seq):
            # The last row's shape is fixed; the sequence grows by one row every other step.
            grow = ef.equal(i - (i / 2) * 2, 0)
            new = ef.cond(grow, lambda: ef.concat([seq, ef.expand_dims(x, 0)], 0), lambda: seq * 1.0)
            return i + 1, new
        _, seq = ef.while_loop(lambda i, s: i < n, body, [ef.constant(0), ef.expand_dims(x, 0)],
                               shape_invariants=[(), (None, 2)])
    interp = ef.Interpreter(_save(tmp_path, g, {"infer": ({"x": x, "n": n}, {"seq": seq})}))
    out = interp.get_signature_runner("infer")(x=np.array([1, 2], np.float32), n=np.int32(6))["seq"]
    np.testing.assert_array_equal(out, np.tile([1, 2], (4, 1)))
    body = next(op for op in interp.model.subgraphs[0].operators if op.opcode == "while").attrs["body"]
    assert len(interp._program._plans[body].values()) == 4  # the body met 1, 2, 3, 4 rows


def _decoder_weights(vocab=12, hidden=16, seed=0):
    rng = np.random.default_rng(seed)
    return {"embed": rng.standard_normal((vocab, hidden)).astype(np.float32),
            "w": (rng.standard_normal((hidden, hidden)) * 0.4).astype(np.float32),
            "u": (rng.standard_normal((hidden, hidden)) * 0.4).astype(np.float32),
            "out": rng.standard_normal((hidden, vocab)).astype(np.float32)}


def _numpy_decoder(p, h, start, end, max_len):
    tokens, token = [], start
    for _ in range(max_len):
        h = np.tanh(p["embed"][token] @ p["w"] + h @ p["u"])
        token = int(np.argmax(h @ p["out"]))
        tokens.append(token)
        if token == end:
            break
    return tokens


def test_greedy_decoder_built_with_while_loop_matches_numpy(tmp_path):
    p, end, max_len = _decoder_weights(), 3, 8
    g = ef.Graph()
    with g.as_default():
        h0 = ef.placeholder(ef.float32, [16], name="h0")
        start = ef.placeholder(ef.int64, [], name="start")
        embed, w, u, out = (ef.constant(p[k]) for k in ("embed", "w", "u", "out"))

        def step(i, token, h, tokens):
            h = ef.tanh(ef.matmul(ef.expand_dims(ef.gather(embed, token), 0), w) + ef.matmul(ef.expand_dims(h, 0), u))
            h = ef.reshape(h, [16])
            token = ef.argmax(ef.matmul(ef.expand_dims(h, 0), out), axis=1)
            token = ef.reshape(token, [])
            return i + 1, token, h, ef.concat([tokens, ef.reshape(token, [1])], 0)

        def going(i, token, h, tokens):
            return ef.logical_and(i < max_len, ef.logical_not(ef.logical_and(i > 0, ef.equal(token, end))))
        _, _, _, tokens = ef.while_loop(going, step, [ef.constant(0), start, h0, ef.constant(np.zeros(0, np.int64))],
                                        shape_invariants=[(), (), (16,), (None,)])
    run = ef.Interpreter(_save(tmp_path, g, {"infer": ({"h0": h0, "start": start}, {"tokens": tokens})})) \
        .get_signature_runner("infer")
    rng = np.random.default_rng(5)
    lengths = set()
    for _ in range(12):
        hv, sv = rng.standard_normal(16).astype(np.float32), np.int64(rng.integers(12))
        got = run(h0=hv, start=sv)["tokens"].tolist()
        want = _numpy_decoder(p, hv, sv, end, max_len)
        assert got == want
        lengths.add(len(got))
    assert min(lengths) < max_len == max(lengths)  # some stop at the end token, some run out


def _rnn_regression(unrolled, steps=4, seed=0):
    """An Elman RNN over `steps` time steps, mean squared error on its last state, trained
    with SGD: through ef.while_loop, or with the time steps unrolled in Python."""
    rng = np.random.default_rng(seed)
    g = ef.Graph()
    with g.as_default():
        xs = ef.placeholder(ef.float64, [steps, None, 3], name="xs")
        target = ef.placeholder(ef.float64, [None, 5], name="target")
        w = ef.Variable(rng.standard_normal((3, 5)) * 0.5, name="w")
        u = ef.Variable(rng.standard_normal((5, 5)) * 0.5, name="u")
        h = ef.matmul(xs[0], w) * 0.0
        if unrolled:
            for t in range(steps):
                h = ef.tanh(ef.matmul(xs[t], w) + ef.matmul(h, u))
        else:
            h = ef.while_loop(lambda t, h: t < steps,
                              lambda t, h: (t + 1, ef.tanh(ef.matmul(ef.gather(xs, t), w) + ef.matmul(h, u))),
                              [ef.constant(0), h])[1]
        loss = ef.losses.mean_squared_error(target, h)
        step = ef.train.GradientDescent(0.3).minimize(loss)
    return g, {"train": ({"xs": xs, "target": target}, {"loss": loss}, [step]), "infer": ({"xs": xs}, {"h": h})}


def test_training_through_a_loop_reaches_the_loss_of_the_unrolled_model(tmp_path):
    rng = np.random.default_rng(9)
    batches = [(rng.standard_normal((4, 6, 3)), np.tanh(rng.standard_normal((6, 5)))) for _ in range(8)]
    losses = {}
    for unrolled in (False, True):
        g, sigs = _rnn_regression(unrolled)
        interp = ef.Interpreter(_save(tmp_path, g, sigs, f"rnn{unrolled}.efl"))
        train = interp.get_signature_runner("train")
        losses[unrolled] = [float(train(xs=x, target=y)["loss"]) for x, y in batches]
        if not unrolled:
            assert any(isinstance(p, StagedPlan) for p in interp._plans.values())
    np.testing.assert_allclose(losses[False], losses[True], rtol=1e-10)
    assert losses[False][-1] < losses[False][0]


def test_opencl_partitions_run_inside_loop_bodies(tmp_path):
    rng = np.random.default_rng(4)
    wv = (rng.standard_normal((32, 32)) * 0.2).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [8, 32], name="x")
        w = ef.constant(wv)
        y = ef.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, ef.nn.relu(ef.matmul(h, w)) + h),
                          [ef.constant(0), x])[1]
    path = _save(tmp_path, g, {"infer": ({"x": x}, {"y": y})})
    interp = ef.Interpreter(path, delegates=[edgeflow.accel.OpenCLDelegate()])
    xv = rng.standard_normal((8, 32)).astype(np.float32)
    got = interp.get_signature_runner("infer")(x=xv)["y"]
    want = xv
    for _ in range(3):
        want = np.maximum(want @ wv, 0) + want
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert sum(p.partitions for p in interp._program.plans()) >= 1


def test_inference_skips_the_stacks_a_loop_keeps_for_its_gradient(tmp_path):
    g, sigs = _rnn_regression(unrolled=False)
    interp = ef.Interpreter(_save(tmp_path, g, sigs))
    loop = next(op for op in interp.model.subgraphs[0].operators if op.opcode == "while")
    assert len(loop.outputs) > len(loop.inputs)  # the entry stacks, for the backward loop
    xs = np.random.default_rng(0).standard_normal((4, 2, 3))
    infer = interp.get_signature_runner("infer")
    h = infer(xs=xs)["h"]
    assert not isinstance(infer.last_plan, StagedPlan)  # planned ahead: the stacks are not made
    w, u = (interp.variables()[k] for k in ("w", "u"))
    want = np.zeros((2, 5))
    for t in range(4):
        want = np.tanh(xs[t] @ w + want @ u)
    np.testing.assert_allclose(h, want, rtol=1e-12)
