"""Intra-op threads (edgeflow/interp/threads.py): ops split over an interpreter's workers
give numpy's results, on odd shapes, and the workers' errors reach the caller; each test
runs with the native workers (native_threads.py) and with the lock hand-off."""
import functools
import os

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import edgeflow as ef
from edgeflow.format import writer
from edgeflow.interp import threads


@pytest.fixture(scope="module", params=["native", "locks"], autouse=True)
def workers_kind(request):
    """EDGEFLOW_NATIVE_THREADS for the module's tests (module-scoped: hypothesis's tests take
    no function-scoped fixtures)."""
    had = os.environ.get("EDGEFLOW_NATIVE_THREADS")
    os.environ["EDGEFLOW_NATIVE_THREADS"] = "1" if request.param == "native" else "0"
    yield request.param
    if had is None:
        del os.environ["EDGEFLOW_NATIVE_THREADS"]
    else:
        os.environ["EDGEFLOW_NATIVE_THREADS"] = had


def test_the_workers_are_of_the_kind_asked(workers_kind):
    workers = threads.Workers(2)
    assert (workers.native is not None) == (workers_kind == "native")
    workers.close()


@pytest.mark.parametrize("length,parts,minimum", [(10, 3, 1), (7, 4, 2), (3, 8, 1), (0, 2, 1), (100, 2, 64)])
def test_pieces_cover_the_range_once(length, parts, minimum):
    got = threads.pieces(length, parts, minimum)
    assert [i for a, b in got for i in range(a, b)] == list(range(length))
    assert len(got) <= parts and all(b - a >= min(minimum, length) for a, b in got)


def test_workers_run_every_task_and_raise_their_errors():
    workers = threads.Workers(3)
    done = []
    workers.run([lambda k=k: done.append(k) for k in range(5)])
    assert sorted(done) == list(range(5))

    def fail():
        raise ValueError("in a worker")
    with pytest.raises(ValueError, match="in a worker"):
        workers.run([lambda: None, fail])
    workers.close()


def test_workers_shared_by_two_callers_run_every_task_once():
    """A caller that finds the workers busy runs its tasks itself; nothing runs twice."""
    import threading
    workers = threads.Workers(2)
    counts = [0] * 400
    gate = threading.Barrier(2)

    def caller(base):
        gate.wait()
        for k in range(0, 200, 4):
            def bump(j):
                counts[j] += 1
            workers.run([lambda j=j: bump(j) for j in range(base + k, base + k + 4)])
    callers = [threading.Thread(target=caller, args=(b,)) for b in (0, 200)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert counts == [1] * 400


def test_a_split_shared_by_two_callers_computes_every_product():
    """A caller that finds the workers busy runs the split's products itself (native or not)."""
    import functools
    import threading
    workers = threads.Workers(2)
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((64, 40)).astype(np.float32), rng.standard_normal((40, 50)).astype(np.float32)
    outs = [np.zeros((64, 50), np.float32) for _ in range(2)]
    steps = [workers.split([functools.partial(np.matmul, a[i:j], b, out=out[i:j]) for i, j in threads.pieces(64, 2)])
             for out in outs]
    gate = threading.Barrier(2)
    wrong = []

    def caller(k):
        gate.wait()
        for _ in range(200):
            outs[k].fill(np.nan)
            steps[k]()
            if not np.allclose(outs[k], a @ b, rtol=1e-5, atol=1e-4):
                wrong.append(k)
    callers = [threading.Thread(target=caller, args=(k,)) for k in range(2)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    workers.close()
    assert not wrong


class _Clock:
    """A stand-in for threads.perf_counter that only the variants below advance."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _timed_choice(monkeypatch, cost):
    """An Adaptive over two variants that take cost[name] seconds of a stand-in clock:
    (choice, the names of the variants it ran, in order)."""
    clock = _Clock()
    monkeypatch.setattr(threads, "perf_counter", clock)
    ran = []

    def variant(name):
        def run():
            ran.append(name)
            clock.now += cost[name]
        return run
    return threads.Adaptive(variant("threaded"), variant("serial")), ran


def test_adaptive_runs_the_variant_that_has_been_faster(monkeypatch):
    cost = {"threaded": 5.0, "serial": 1.0}
    choice, ran = _timed_choice(monkeypatch, cost)
    for _ in range(2 * threads.TRIALS):
        choice()
    assert ran == ["threaded", "serial"] * threads.TRIALS  # trials alternate, the split first
    ran.clear()
    for _ in range(200):
        choice()
    # serial from then on, but for the threaded variant tried again at growing gaps
    explored = [k for k, name in enumerate(ran) if name == "threaded"]
    assert explored and explored[0] == threads.EXPLORE - 1
    gaps = np.diff(explored)
    assert all(g2 == min(2 * g1, threads.EXPLORE_MAX) for g1, g2 in zip(gaps, gaps[1:])) and gaps[0] == 2 * threads.EXPLORE
    # the serial variant slows down (its core taken): the choice follows within a few calls
    # of the next exploration, and keeps to threaded once it is the faster
    cost["serial"] = 20.0
    ran.clear()
    for _ in range(threads.EXPLORE_MAX + 64):
        choice()
    assert ran[-32:] == ["threaded"] * 32
    assert choice.seconds[0] == cost["threaded"] and choice.seconds[1] > cost["threaded"]


def test_adaptive_tells_which_variant_its_next_call_runs(monkeypatch):
    """threaded_next() says beforehand what each call then runs, through the trials, the
    settled choice and its explorations (the interpreter wakes its workers only for a
    threaded run)."""
    cost = {"threaded": 1.0, "serial": 3.0}
    choice, ran = _timed_choice(monkeypatch, cost)
    said = []
    for k in range(300):
        if k == 100:
            cost["threaded"] = 9.0  # its core taken: serial wins from the next exploration on
        said.append("threaded" if choice.threaded_next() else "serial")
        choice()
    assert said == ran
    assert {"threaded", "serial"} <= set(ran[-100:])  # settled on serial, threaded explored


def test_an_interpreter_wakes_its_workers_only_for_runs_it_splits(monkeypatch):
    """A plan whose run the choice keeps on the caller's thread does not wake the workers
    (native ones would spin on the other core for nothing); a threaded run does. Either way
    the result is the product's."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((256, 256)).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 256], name="x")
        y = ef.tanh(ef.matmul(x, ef.constant(w, name="w")), name="y")
    interp = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": x}, {"y": y})})), num_threads=2)
    runner = interp.get_signature_runner("infer")
    xv = rng.standard_normal((64, 256)).astype(np.float32)
    workers = interp._workers
    wakes, alone = [], []
    monkeypatch.setattr(workers, "wake", lambda: wakes.append(len(alone)))
    real = workers.running

    def running(run, serial):
        alone.append(serial)
        real(run, serial)
    monkeypatch.setattr(workers, "running", running)
    runner(x=xv)
    choice = runner.last_plan.threads_choice
    for _ in range(60):
        threaded = choice.threaded_next()
        k = len(alone)
        out = runner(x=xv)["y"]
        assert alone[-1] is not threaded
        assert (k in wakes) is threaded  # woken before this run, only where it splits
    assert set(alone) == {True, False}  # both ran: the trials, then the explorations
    np.testing.assert_allclose(out, np.tanh(xv.astype(np.float64) @ w), rtol=1e-4, atol=1e-5)


def test_a_run_alone_runs_every_split_on_the_callers_thread_with_the_same_bits():
    """Workers.running(run, alone=True): the same pieces in turn on this thread (products and
    Python's callables alike), so the same bits as split over the workers."""
    import threading
    workers = threads.Workers(2)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((300, 70)).astype(np.float32), rng.standard_normal((70, 90)).astype(np.float32)
    out = np.zeros((300, 90), np.float32)
    product = workers.split([functools.partial(np.matmul, a[i:j], b, out=out[i:j]) for i, j in threads.pieces(300, 2)])
    x = rng.standard_normal((64, 5000)).astype(np.float32)
    y = np.zeros_like(x)
    where = []

    def tanh(i, j):
        where.append(threading.get_ident())
        np.tanh(x[i:j], out=y[i:j])
    elementwise = workers.split([functools.partial(tanh, i, j) for i, j in threads.pieces(64, 2)])

    def run():
        out.fill(np.nan)
        y.fill(np.nan)
        product()
        elementwise()
        return out.copy(), y.copy()
    results = {}
    for alone in (False, True, False, True):
        where.clear()
        workers.running(lambda: results.setdefault(alone, []).append(run()), alone)
        assert (set(where) == {threading.get_ident()}) == alone
    assert not workers.alone
    for got in results[False] + results[True]:
        np.testing.assert_array_equal(got[0], results[False][0][0])
        np.testing.assert_array_equal(got[1], results[False][0][1])
    np.testing.assert_allclose(results[True][0][0], a @ b, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(results[True][0][1], np.tanh(x), rtol=1e-6, atol=1e-6)
    workers.close()


def test_an_interpreter_at_two_threads_gives_the_same_bits_on_every_run():
    """Its runs go with the workers or on its thread alone as they time themselves."""
    from edgeflow.graph.math_ops import apply
    rng = np.random.default_rng(2)
    w, bias = rng.standard_normal((64, 16, 1, 1)).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, (1, 16, 40, 40), name="x")
        y = apply("conv", [x, ef.constant(w), ef.constant(bias)],
                  {"strides": (1, 1), "pads": (0, 0, 0, 0), "group": 1, "activation": "relu"})
    runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": x}, {"y": y})})), num_threads=2) \
        .get_signature_runner("infer")
    feed = rng.standard_normal((1, 16, 40, 40)).astype(np.float32)
    first = runner(x=feed)["y"]
    want = np.maximum(np.einsum("mc,nchw->nmhw", w[:, :, 0, 0].astype(np.float64), feed) + bias[:, None, None], 0)
    np.testing.assert_allclose(first, want, rtol=1e-4, atol=1e-4)
    for _ in range(3 * threads.EXPLORE):
        np.testing.assert_array_equal(runner(x=feed)["y"], first)


def test_workers_threads_end_when_the_workers_are_collected():
    import gc
    import threading

    def ours():
        return {t for t in threading.enumerate() if t.name in ("edgeflow-worker", "edgeflow-native-worker")}
    before = ours()
    for _ in range(20):
        threads.Workers(3).run([lambda: None] * 3)
    gc.collect()
    for _ in range(200):
        if not ours() - before:
            break
        threading.Event().wait(0.01)
    assert not ours() - before


def _matmul_model(a_shape, b_shape, transpose_a, transpose_b):
    g = ef.Graph()
    with g.as_default():
        a = ef.placeholder(ef.float32, a_shape, name="a")
        b = ef.placeholder(ef.float32, b_shape, name="b")
        y = ef.nn.relu(ef.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b))
    return writer.to_bytes(ef.to_model(g, {"infer": ({"a": a, "b": b}, {"y": y})}))


@settings(max_examples=12)
@given(batch=st.sampled_from([(), (1,), (3,), (2, 3), (4,), (2, 13)]), m=st.integers(1, 70), k=st.integers(1, 40),
       n=st.integers(1, 700), transpose_a=st.booleans(), transpose_b=st.booleans(),
       b_batch=st.sampled_from(["none", "same", "broadcast"]))
def test_a_matmul_split_over_threads_equals_numpy(batch, m, k, n, transpose_a, transpose_b, b_batch):
    rng = np.random.default_rng(m * 1000 + n)
    a = rng.standard_normal(batch + ((k, m) if transpose_a else (m, k))).astype(np.float32)
    lead = {"none": (), "same": batch, "broadcast": (1,) * len(batch)}[b_batch]
    b = rng.standard_normal(lead + ((k, n) if not transpose_b else (n, k))).astype(np.float32)
    data = _matmul_model(a.shape, b.shape, transpose_a, transpose_b)
    want = np.maximum(np.matmul(np.swapaxes(a, -1, -2) if transpose_a else a,
                                np.swapaxes(b, -1, -2) if transpose_b else b, dtype=np.float64), 0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threads, "MIN_FLOPS", 1)  # small products split too (by default they stay whole)
        patch.setattr(threads, "VECTOR_MIN_FLOPS", 1)
        patch.setattr(threads, "MIN_COLUMNS", 1)
        got = ef.Interpreter(data, num_threads=3).get_signature_runner("infer")(a=a, b=b)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


def test_a_stack_of_products_splits_by_whole_matrices():
    """Attention's heads (a stack of 4 products of 128x64 @ 64x128) split over 2 workers by
    heads, each worker's products whole (not halves of every head's rows or columns); a
    stack of 3 (not even over 2, fewer than 8) splits each product instead. Both give
    numpy's product."""
    from edgeflow.interp import native_threads
    from edgeflow.interp.kernels.math import split_matmul
    rng = np.random.default_rng(11)
    workers = threads.Workers(2)
    try:
        for heads, whole in ((4, True), (3, False)):
            a = rng.standard_normal((1, heads, 128, 64)).astype(np.float32)
            b = rng.standard_normal((1, heads, 64, 128)).astype(np.float32)
            out = np.empty((1, heads, 128, 128), np.float32)
            with threads.using(workers):
                step = split_matmul(a, b, out)
            tasks = step.args[-1] if step.func == workers._run_native else step.args[0]
            shapes = {task.keywords["out"].shape for task in tasks}
            assert (shapes == {(1, heads // 2, 128, 128)}) == whole
            if workers.native is not None:
                table = step.args[0][0]
                assert len(table) == (heads if whole else 2 * heads)
                assert ((table[:, native_threads.M] == 128) & (table[:, native_threads.N] == 128)).all() == whole
            step()
            np.testing.assert_allclose(out, np.matmul(a.astype(np.float64), b), rtol=1e-4, atol=1e-4)
    finally:
        workers.close()


def test_a_vector_product_splits_only_from_vector_min_flops(monkeypatch, workers_kind):
    """A product of one row or column (a classifier at batch 1; a product above MIN_FLOPS) stays whole below
    threads.VECTOR_MIN_FLOPS on the lock workers, NATIVE_VECTOR_MIN_FLOPS on the native ones
    (sgemv's rows), where a matrix product of as many operations splits; from it, it splits
    too, and the pieces give numpy's product."""
    from edgeflow.interp.kernels.math import split_matmul
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((1, 1024)).astype(np.float32), rng.standard_normal((1024, 1000)).astype(np.float32)
    rows = rng.standard_normal((8, 1024)).astype(np.float32)
    workers = threads.Workers(2)
    native = workers.native is not None
    assert native == (workers_kind == "native")
    bound = "NATIVE_VECTOR_MIN_FLOPS" if native else "VECTOR_MIN_FLOPS"
    monkeypatch.setattr(threads, bound, 2 * 1024 * 1000 + 1)
    try:
        with threads.using(workers):
            assert split_matmul(x, w, np.empty((1, 1000), np.float32)) is None
            column = rng.standard_normal((1024, 1)).astype(np.float32)
            assert split_matmul(w.T.copy(), column, np.empty((1000, 1), np.float32)) is None
            assert split_matmul(rows, w, np.empty((8, 1000), np.float32)) is not None
            monkeypatch.setattr(threads, bound, 2 * 1024 * 1000)
            if native:  # float64 pieces would go to the lock workers: theirs is the bound
                assert split_matmul(x.astype(np.float64), w.astype(np.float64), np.empty((1, 1000))) is None
            out = np.empty((1, 1000), np.float32)
            step = split_matmul(x, w, out)
            assert step is not None and (step.func == workers._run_native) == native
            step()
    finally:
        workers.close()
    np.testing.assert_allclose(out, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-3)


def _conv(x, w, bias, strides, pads, group, threads_):
    from edgeflow.graph.math_ops import apply
    g = ef.Graph()
    with g.as_default():
        xp = ef.placeholder(ef.float32, x.shape, name="x")
        y = apply("conv", [xp, ef.constant(w), ef.constant(bias)],
                  {"strides": strides, "pads": pads, "group": group, "activation": "relu"})
    data = writer.to_bytes(ef.to_model(g, {"infer": ({"x": xp}, {"y": y})}))
    return ef.Interpreter(data, num_threads=threads_).get_signature_runner("infer")(x=x)["y"]


@settings(max_examples=16)
@given(n=st.integers(1, 4), c=st.sampled_from([1, 2, 4, 6]), m_per=st.sampled_from([1, 3, 17]), size=st.integers(3, 11),
       kernel=st.sampled_from([1, 3]), stride=st.sampled_from([1, 2]), pad=st.sampled_from([0, 1]),
       grouping=st.sampled_from(["dense", "grouped", "depthwise"]), columns=st.sampled_from([1, 10**9]))
def test_a_conv_split_over_threads_equals_one_thread(n, c, m_per, size, kernel, stride, pad, grouping, columns):
    """Dense convs split their product's columns (or, when it has too few, its output
    channels: `columns` forces either), grouped and depthwise ones their groups; pointwise
    (1x1) convs take their own path: each against the same conv on one thread."""
    group = {"dense": 1, "grouped": 2 if c % 2 == 0 else 1, "depthwise": c}[grouping]
    rng = np.random.default_rng(size * 100 + c)
    x = rng.standard_normal((n, c, size, size + 2)).astype(np.float32)
    w = rng.standard_normal((group * m_per, c // group, kernel, kernel)).astype(np.float32)
    bias = rng.standard_normal(group * m_per).astype(np.float32)
    args = (x, w, bias, (stride, stride), (pad,) * 4, group)
    want = _conv(*args, threads_=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threads, "MIN_FLOPS", 1)  # small convs split too
        patch.setattr(threads, "MIN_COLUMNS", columns)
        got = _conv(*args, threads_=3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _conv_grads(x, w, dy, attrs, threads_):
    from edgeflow.graph.math_ops import apply
    g = ef.Graph()
    with g.as_default():
        xp, dyp = ef.placeholder(ef.float32, x.shape, name="x"), ef.placeholder(ef.float32, dy.shape, name="dy")
        dx = apply("conv_input_grad", [dyp, ef.constant(w), ef.constant(np.zeros_like(x))], attrs)
        dw = apply("conv_filter_grad", [xp, dyp, ef.constant(np.zeros_like(w))], attrs)
    data = writer.to_bytes(ef.to_model(g, {"infer": ({"x": xp, "dy": dyp}, {"dx": dx, "dw": dw})}))
    got = ef.Interpreter(data, num_threads=threads_).get_signature_runner("infer")(x=x, dy=dy)
    return got["dx"], got["dw"]


@settings(max_examples=16)
@given(n=st.integers(1, 5), c=st.sampled_from([2, 4, 6]), m_per=st.sampled_from([1, 3, 17]), size=st.integers(3, 9),
       kernel=st.sampled_from([1, 3]), stride=st.sampled_from([1, 2]), pad=st.sampled_from([0, 1]),
       grouped=st.booleans())
def test_conv_gradients_split_over_threads_equal_one_thread(n, c, m_per, size, kernel, stride, pad, grouped):
    """A train step's conv backwards: the input's gradient split by images (product and the
    taps' adds), the filter's by images where there are as many as workers (dy's widening,
    the gathers and a product each, then their sum), else by input channels (the gathers)
    and output channels (the product), pointwise ones by images: each against the same
    gradients on one thread."""
    group = 2 if grouped else 1
    rng = np.random.default_rng(size * 100 + c * 10 + n)
    x = rng.standard_normal((n, c, size, size + 1)).astype(np.float32)
    w = rng.standard_normal((group * m_per, c // group, kernel, kernel)).astype(np.float32)
    attrs = {"strides": (stride, stride), "pads": (pad,) * 4, "group": group}
    out = [(d + 2 * pad - kernel) // stride + 1 for d in x.shape[2:]]
    dy = rng.standard_normal((n, w.shape[0], *out)).astype(np.float32)
    want = _conv_grads(x, w, dy, attrs, 1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threads, "MIN_FLOPS", 1)  # small convs split too
        got = _conv_grads(x, w, dy, attrs, 3)
    for a, b in zip(got, want):  # sums of many products: an error in float32 of the sum's scale
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(b).max())) * np.sqrt(n * size * size))


@settings(max_examples=12)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), other=st.sampled_from(["same", "row", "scalar", "column"]),
       op=st.sampled_from(["add", "sub", "mul", "maximum", "relu", "clip"]))
@example(shape=[1, 4, 3], other="column", op="add")  # split along axis 1, which y broadcasts along
def test_elementwise_ops_split_over_threads_equal_numpy(shape, other, op):
    """Split along the first axis long enough; the other operand broadcasts along it or not."""
    from edgeflow.graph.math_ops import apply
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    y = {"same": rng.standard_normal(shape), "row": rng.standard_normal(shape[-1:]),
         "scalar": rng.standard_normal(()), "column": rng.standard_normal(shape[:1] + [1] * (len(shape) - 1))}[other]
    y = y.astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        xp, yp = ef.placeholder(ef.float32, x.shape, name="x"), ef.placeholder(ef.float32, y.shape, name="y")
        out = apply("relu", [xp + yp]) if op == "relu" else apply("clip", [xp + yp], {"min": 0.0, "max": 0.5}) \
            if op == "clip" else apply(op, [xp, yp])
    data = writer.to_bytes(ef.to_model(g, {"infer": ({"x": xp, "y": yp}, {"out": out})}))
    want = {"add": x + y, "sub": x - y, "mul": x * y, "maximum": np.maximum(x, y), "relu": np.maximum(x + y, 0),
            "clip": np.clip(x + y, 0, 0.5)}[op]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threads, "MIN_ELEMENTS", 1)
        got = ef.Interpreter(data, num_threads=2).get_signature_runner("infer")(x=x, y=y)["out"]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@settings(max_examples=16)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data(),
       op=st.sampled_from(["reduce_sum", "reduce_mean", "reduce_max"]), keepdims=st.booleans())
def test_reductions_split_over_threads_equal_numpy(shape, data, op, keepdims):
    """Reductions split along their first kept axis long enough (a bias gradient's sum over
    all but the channels, by channels), against numpy."""
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape)))))
    _check_reduction(shape, axes, op, keepdims)


@pytest.mark.parametrize("shape, axes", [((2, 3, 4), (0,)), ((8, 6, 5, 5), (0, 2, 3)), ((3, 1, 4), (0, 1))])
@pytest.mark.parametrize("keepdims", [False, True])
def test_a_bias_gradient_splits_by_channels(shape, axes, keepdims):
    """Reduced axes before the kept one: out's axis is x's less those (keepdims or not)."""
    _check_reduction(list(shape), axes, "reduce_sum", keepdims)


def _check_reduction(shape, axes, op, keepdims):
    from edgeflow.graph.math_ops import apply
    x = np.random.default_rng(len(shape) + len(axes)).standard_normal(shape).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        xp = ef.placeholder(ef.float32, x.shape, name="x")
        out = apply(op, [xp], {"axes": axes, "keepdims": int(keepdims)})
    data_ = writer.to_bytes(ef.to_model(g, {"infer": ({"x": xp}, {"out": out})}))
    fn = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max}[op]
    want = fn(x.astype(np.float64), axis=axes, keepdims=keepdims)
    # A float32 sum's error grows with its terms' magnitudes, not its value (a sum that
    # cancels to 0.05 from 300 terms near 1 rounds by some 1e-6, BLAS's order or numpy's).
    scale = np.abs(fn(np.abs(x).astype(np.float64), axis=axes, keepdims=keepdims))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threads, "MIN_ELEMENTS", 1)
        got = ef.Interpreter(data_, num_threads=2).get_signature_runner("infer")(x=x)["out"]
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= 1e-5 * np.abs(want) + 1e-6 * np.maximum(scale, 1.0))


@pytest.mark.parametrize("kind", ["depthwise", "stem"])
@pytest.mark.parametrize("batch,channels,size,stride", [(1, 6, 9, 1), (1, 5, 12, 2), (4, 6, 9, 1), (5, 5, 12, 2)])
def test_a_jit_conv_split_over_threads_equals_one_thread(kind, batch, channels, size, stride):
    """numba's one-pass depthwise conv and stem conv (3 input channels; where numba is
    installed) split their output channels (one image) or their images (as many as threads
    or more)."""
    rng = np.random.default_rng(channels)
    c, group = (channels, channels) if kind == "depthwise" else (3, 1)
    x = rng.standard_normal((batch, c, size, size)).astype(np.float32)
    w = rng.standard_normal((channels, c // group, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(channels).astype(np.float32)
    args = (x, w, bias, (stride, stride), (1, 1, 1, 1), group)
    want = _conv(*args, threads_=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threads, "MIN_FLOPS", 1)
        got = _conv(*args, threads_=3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["lstm", "gru"])
@pytest.mark.parametrize("batch", [1, 4])
def test_a_bidirectional_recurrence_runs_its_directions_apart(op, batch, monkeypatch):
    """On two workers, at batch 1 (nothing to split in the batch) and above, a bidirectional
    recurrence runs its two directions at once, each on buffers of its own: Y and the final
    states as on one thread, bit for bit."""
    from edgeflow.graph.math_ops import apply
    from edgeflow.interp.kernels import jit, rnn
    assert jit.available()
    rng = np.random.default_rng(7)
    gates, hidden, size = {"lstm": 4, "gru": 3}[op], 16, 8
    x = rng.normal(0, 1, (9, batch, size)).astype(np.float32)
    w = rng.normal(0, 0.5, (2, gates * hidden, size)).astype(np.float32)
    r = rng.normal(0, 0.5, (2, gates * hidden, hidden)).astype(np.float32)
    b = rng.normal(0, 0.5, (2, 2 * gates * hidden)).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        xp = ef.placeholder(ef.float32, x.shape, name="x")
        outs = apply(op, [xp, w, r, b], {"hidden_size": hidden, "direction": "bidirectional", "has_bias": True})
    data = writer.to_bytes(ef.to_model(g, {"infer": ({"x": xp}, {f"y{k}": t for k, t in enumerate(outs)})}))
    made = []
    cls = {"lstm": rnn._LSTM, "gru": rnn._GRU}[op]
    init = cls.__init__
    monkeypatch.setattr(cls, "__init__", lambda self, *a: (made.append(self), init(self, *a))[1])
    want = ef.Interpreter(data, num_threads=1).get_signature_runner("infer")(x=x)
    assert len(made) == 1 and len(made[0].directions) == 2
    made.clear()
    monkeypatch.setattr(threads, "MIN_FLOPS", 1)
    interp = ef.Interpreter(data, num_threads=2)
    interp._workers.adaptive = False  # always split
    got = interp.get_signature_runner("infer")(x=x)
    assert [m.directions for m in made] == [[(0, False)], [(1, True)]]
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("op", ["lstm", "gru"])
@pytest.mark.parametrize("batch", [1, 2, 5])
def test_a_recurrence_split_over_threads_equals_one_thread(op, batch):
    """numba's sequence loop splits the batch over the workers (its rows are independent
    recurrences): Y and the final states as on one thread, both directions."""
    from edgeflow.graph.math_ops import apply
    from edgeflow.interp.kernels import jit
    assert jit.available()
    rng = np.random.default_rng(batch)
    gates, hidden, size = {"lstm": 4, "gru": 3}[op], 6, 5
    x = rng.normal(0, 1, (7, batch, size)).astype(np.float32)
    w = rng.normal(0, 0.8, (2, gates * hidden, size)).astype(np.float32)
    r = rng.normal(0, 0.8, (2, gates * hidden, hidden)).astype(np.float32)

    def run(threads_):
        g = ef.Graph()
        with g.as_default():
            xp = ef.placeholder(ef.float32, x.shape, name="x")
            outs = apply(op, [xp, w, r], {"hidden_size": hidden, "direction": "bidirectional"})
        data = writer.to_bytes(ef.to_model(g, {"infer": ({"x": xp}, {f"y{k}": t for k, t in enumerate(outs)})}))
        return ef.Interpreter(data, num_threads=threads_).get_signature_runner("infer")(x=x)

    want = run(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threads, "MIN_FLOPS", 1)
        got = run(3)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6)
