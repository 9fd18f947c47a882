"""The interpreter end to end: build, save, load, run, compare with numpy."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.errors import InvalidInputError
from edgeflow.format import writer


def _mlp(path, rng):
    w1 = rng.standard_normal((4, 8)).astype(np.float32)
    w2 = rng.standard_normal((8, 3)).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        h = ef.tanh(x @ ef.constant(w1, name="w1"), name="h")
        logits = ef.matmul(h, ef.constant(w2, name="w2"), name="logits")
        probs = ef.nn.softmax(logits, name="probs")
    ef.save(g, path, signatures={"infer": ({"x": x}, {"probs": probs}),
                                 "features": ({"x": x}, {"h": h, "logits": logits})})

    def ref(xv):
        hv = np.tanh(xv @ w1)
        lv = hv @ w2
        e = np.exp(lv - lv.max(1, keepdims=True))
        return hv, lv, e / e.sum(1, keepdims=True)
    return ref


def test_issue_example(tmp_path):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        w = ef.constant(np.ones((4, 3), np.float32), name="w")
        y = ef.nn.relu(ef.matmul(x, w) + 1.0, name="y")
    ef.save(g, tmp_path / "m.efl", signatures={"infer": ({"x": x}, {"y": y})})
    out = ef.Interpreter(str(tmp_path / "m.efl")).get_signature_runner("infer")(
        x=np.ones((2, 4), np.float32))
    assert list(out) == ["y"]
    assert out["y"].shape == (2, 3) and out["y"].dtype == np.float32
    np.testing.assert_array_equal(out["y"], np.full((2, 3), 5.0, np.float32))


def test_multiple_signatures_and_dynamic_batch(tmp_path):
    rng = np.random.default_rng(0)
    ref = _mlp(tmp_path / "m.efl", rng)
    interp = ef.Interpreter(tmp_path / "m.efl")
    assert set(interp.get_signature_list()) == {"infer", "features"}
    infer, features = interp.get_signature_runner("infer"), interp.get_signature_runner("features")
    plans = {}
    for batch in (1, 3, 7, 3):
        xv = rng.standard_normal((batch, 4)).astype(np.float32)
        hv, lv, pv = ref(xv)
        np.testing.assert_allclose(infer(x=xv)["probs"], pv, rtol=1e-5, atol=1e-6)
        plans.setdefault(batch, infer.last_plan)
        assert infer.last_plan is plans[batch]  # a repeated shape reuses its plan
        out = features(x=xv)
        np.testing.assert_allclose(out["h"], hv, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["logits"], lv, rtol=1e-5, atol=1e-5)
    assert len({id(p) for p in plans.values()}) == 3


def test_infer_prunes_to_what_outputs_need(tmp_path):
    _mlp(tmp_path / "m.efl", np.random.default_rng(0))
    interp = ef.Interpreter(tmp_path / "m.efl")
    runner = interp.get_signature_runner("features")
    runner(x=np.zeros((2, 4), np.float32))
    ops = [interp.model.subgraphs[0].operators[i].opcode for i in runner.last_plan.order]
    assert "softmax" not in ops and ops.count("matmul") == 2


def test_loads_from_bytes_and_returns_fresh_arrays(tmp_path):
    rng = np.random.default_rng(1)
    ref = _mlp(tmp_path / "m.efl", rng)
    interp = ef.Interpreter((tmp_path / "m.efl").read_bytes())
    runner = interp.get_signature_runner("infer")
    a, b = (rng.standard_normal((2, 4)).astype(np.float32) for _ in range(2))
    first = runner(x=a)["probs"]
    kept = first.copy()
    second = runner(x=b)["probs"]
    np.testing.assert_array_equal(first, kept)  # not overwritten by the second run
    np.testing.assert_allclose(second, ref(b)[2], rtol=1e-5, atol=1e-6)
    first[...] = 0  # writing to a result must not touch the interpreter
    np.testing.assert_allclose(runner(x=a)["probs"], kept, rtol=0, atol=0)


def test_tensor_api(tmp_path):
    rng = np.random.default_rng(2)
    ref = _mlp(tmp_path / "m.efl", rng)
    interp = ef.Interpreter(tmp_path / "m.efl")
    (inp,) = interp.get_input_details()
    assert inp["name"] == "x" and list(inp["shape_signature"]) == [-1, 4]
    assert inp["dtype"] == np.float32
    xv = rng.standard_normal((5, 4)).astype(np.float32)
    with pytest.raises(InvalidInputError, match="resize_input_tensor"):
        interp.set_tensor(inp["index"], xv)
    interp.resize_input_tensor(inp["index"], [5, 4])
    interp.allocate_tensors()
    interp.set_tensor(inp["index"], xv)
    interp.invoke()
    outs = {d["name"]: interp.get_tensor(d["index"]) for d in interp.get_output_details()}
    hv, lv, pv = ref(xv)
    np.testing.assert_allclose(outs["probs"], pv, rtol=1e-5, atol=1e-6)
    assert list(outs) == ["probs"]  # the tensor-level API serves the first signature, 'infer'

    interp.invoke()  # inputs survive a run: a second invoke gives the same answer
    again = {d["name"]: interp.get_tensor(d["index"]) for d in interp.get_output_details()}
    np.testing.assert_array_equal(again["probs"], outs["probs"])
    with pytest.raises(InvalidInputError, match="expected shape"):
        interp.resize_input_tensor(inp["index"], [5, 3])


def test_intermediates_need_preserve_all_tensors(tmp_path):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 4)).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [2, 4], name="x")
        a = ef.exp(x, name="a")
        b = ef.matmul(a, ef.constant(w), name="b")
        y = ef.nn.relu(b, name="y")
    ef.save(g, tmp_path / "m.efl", signatures={"infer": ({"x": x}, {"y": y})})
    xv = rng.standard_normal((2, 4)).astype(np.float32)
    index = {t.name: i for i, t in enumerate(ef.Interpreter(tmp_path / "m.efl").model.subgraphs[0].tensors)}
    plain = ef.Interpreter(tmp_path / "m.efl")
    plain.set_tensor(index["x"], xv)
    plain.invoke()
    with pytest.raises(InvalidInputError, match="preserve_all_tensors"):
        plain.get_tensor(index["a"])
    kept = ef.Interpreter(tmp_path / "m.efl", preserve_all_tensors=True)
    kept.set_tensor(index["x"], xv)
    kept.invoke()
    np.testing.assert_allclose(kept.get_tensor(index["a"]), np.exp(xv), rtol=1e-6)
    np.testing.assert_allclose(kept.get_tensor(index["b"]), np.exp(xv) @ w, rtol=1e-5)


@pytest.mark.parametrize("call, message", [
    (lambda r: r(), r"missing \['x'\]"),
    (lambda r: r(x=np.zeros((2, 4), np.float32), z=1), r"unexpected \['z'\]"),
    (lambda r: r(x=np.zeros((2, 4), np.float64)), "expected dtype float32, got float64"),
    (lambda r: r(x=np.zeros((2, 5), np.float32)), r"expected shape \(\?, 4\).*got \(2, 5\)"),
    (lambda r: r(x=np.zeros((4,), np.float32)), r"expected shape \(\?, 4\)"),
    (lambda r: r(x="text"), "expected float32"),
])
def test_bad_inputs_name_what_was_expected(tmp_path, call, message):
    _mlp(tmp_path / "m.efl", np.random.default_rng(0))
    runner = ef.Interpreter(tmp_path / "m.efl").get_signature_runner("infer")
    with pytest.raises(InvalidInputError, match=message):
        call(runner)
    # the interpreter still works after a rejected call
    assert runner(x=np.zeros((1, 4), np.float32))["probs"].shape == (1, 3)


def test_lists_are_accepted_as_inputs(tmp_path):
    _mlp(tmp_path / "m.efl", np.random.default_rng(0))
    runner = ef.Interpreter(tmp_path / "m.efl").get_signature_runner("infer")
    np.testing.assert_allclose(runner(x=[[0.0, 0.0, 0.0, 0.0]])["probs"].sum(), 1.0, rtol=1e-6)


def test_unknown_signature(tmp_path):
    _mlp(tmp_path / "m.efl", np.random.default_rng(0))
    interp = ef.Interpreter(tmp_path / "m.efl")
    with pytest.raises(InvalidInputError, match="'features', 'infer'"):
        interp.get_signature_runner("train")


def test_profiler_times_every_op(tmp_path):
    _mlp(tmp_path / "m.efl", np.random.default_rng(0))
    interp = ef.Interpreter(tmp_path / "m.efl")
    runner = interp.get_signature_runner("infer")
    profiler = interp.enable_profiling()
    for _ in range(3):
        runner(x=np.ones((2, 4), np.float32))
    ops = sorted(r.opcode for r in profiler.records.values())
    assert ops == ["matmul", "matmul", "softmax", "tanh"]
    assert all(r.calls == 3 and r.total_ns > 0 for r in profiler.records.values())


def test_bytes_of_a_model_without_a_file():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.int32, [3], name="x")
        y = ef.reduce_sum(x * 2, name="y")
    data = writer.to_bytes(ef.to_model(g, {"infer": ({"x": x}, {"y": y})}))
    out = ef.Interpreter(data).get_signature_runner()(x=np.array([1, 2, 3], np.int32))
    assert out["y"].dtype == np.int32 and out["y"] == 12


def test_num_threads_caps_blas_threads(tmp_path, monkeypatch):
    import threadpoolctl
    from edgeflow.interp.plan import Plan
    rng = np.random.default_rng(4)
    ref = _mlp(tmp_path / "m.efl", rng)
    seen, run = [], Plan.run

    def spy(plan):
        seen.extend(p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas")
        run(plan)
    monkeypatch.setattr(Plan, "run", spy)
    interp = ef.Interpreter(tmp_path / "m.efl", num_threads=1)
    xv = rng.standard_normal((3, 4)).astype(np.float32)

    def blas():
        return [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    with threadpoolctl.threadpool_limits(2, "blas"):  # the application's own setting, kept
        np.testing.assert_allclose(interp.get_signature_runner("infer")(x=xv)["probs"], ref(xv)[2],
                                   rtol=1e-5, atol=1e-6)
        assert blas() and set(blas()) == {2}
    assert seen and set(seen) == {1}


def test_interpreters_share_the_blas_libraries_found(tmp_path, monkeypatch):
    """Finding the BLAS libraries (threadpoolctl's scan of every loaded library, 1-3 ms of a
    first plan) is done once a process, not once an interpreter: a second interpreter of the
    same model plans and runs with BLAS capped, without a scan of its own."""
    import threadpoolctl
    rng = np.random.default_rng(6)
    ref = _mlp(tmp_path / "m.efl", rng)
    xv = rng.standard_normal((3, 4)).astype(np.float32)
    ef.Interpreter(tmp_path / "m.efl", num_threads=1).get_signature_runner("infer")(x=xv)
    scans, real = [], threadpoolctl.ThreadpoolController

    def counted(*args, **kwargs):
        scans.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(threadpoolctl, "ThreadpoolController", counted)
    second = ef.Interpreter(tmp_path / "m.efl", num_threads=1)
    np.testing.assert_allclose(second.get_signature_runner("infer")(x=xv)["probs"], ref(xv)[2], rtol=1e-5, atol=1e-6)
    assert not scans


def test_blas_thread_counts_through_the_libraries_own_functions():
    """_counts' get and set of each BLAS library agree with threadpoolctl's own methods
    (their reference): what one sets, the other reads, and back."""
    import threadpoolctl
    from edgeflow.interp.interpreter import _counts
    controllers = threadpoolctl.ThreadpoolController().lib_controllers
    assert controllers  # numpy's BLAS at least
    for controller in controllers:
        get, put = _counts(controller)
        had = controller.get_num_threads()
        try:
            assert get() == had
            for n in (1, 3, 2):
                put(n)
                assert controller.get_num_threads() == n
                controller.set_num_threads(n + 1)
                assert get() == n + 1
        finally:
            controller.set_num_threads(had)


@pytest.mark.parametrize("num_threads", [1, 2])
def test_num_threads_caps_blas_threads_while_planning(tmp_path, monkeypatch, num_threads):
    """Binding runs products too (Winograd's weight transforms): BLAS is capped then as well."""
    import threadpoolctl
    from edgeflow.interp.plan import Plan
    rng = np.random.default_rng(5)
    ref = _mlp(tmp_path / "m.efl", rng)
    seen, bind = [], Plan._bind

    def spy(plan, *args):
        seen.extend(p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas")
        return bind(plan, *args)
    monkeypatch.setattr(Plan, "_bind", spy)
    interp = ef.Interpreter(tmp_path / "m.efl", num_threads=num_threads)
    xv = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(interp.get_signature_runner("infer")(x=xv)["probs"], ref(xv)[2],
                               rtol=1e-5, atol=1e-6)
    assert seen and set(seen) == {1}
