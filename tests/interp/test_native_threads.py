"""Native intra-op workers (edgeflow/interp/native_threads.py): the sgemm rows they run give
numpy's products for every layout they accept, they refuse the others, and the workers
sleep, wake and stop."""
import functools
import threading
import time

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from edgeflow.interp import native_threads, threads



@pytest.fixture(scope="module")
def pool():
    assert native_threads.available(), "llvmlite (the jit extra) does not import, or no BLAS sgemm was found"
    p = native_threads.Pool(2)
    yield p
    p.close()


def _layout(rng, shape, how):
    """An array of `shape` in memory laid out `how`: rows, columns (transposed), or a strided
    view of a wider array."""
    if how == "columns":  # each matrix's elements down its columns
        return np.swapaxes(rng.standard_normal(shape[:-2] + shape[:-3:-1]).astype(np.float32), -1, -2)
    if how == "view":
        wide = rng.standard_normal(shape[:-1] + (shape[-1] + 5,)).astype(np.float32)
        return wide[..., 2:2 + shape[-1]]
    return rng.standard_normal(shape).astype(np.float32)


@settings(max_examples=30, deadline=None)
@given(batch=st.sampled_from([(), (1,), (3,), (2, 2)]), m=st.integers(2, 40), k=st.integers(1, 30),
       n=st.integers(2, 50), a_how=st.sampled_from(["rows", "columns", "view"]),
       b_how=st.sampled_from(["rows", "columns", "view"]), broadcast_a=st.booleans(),
       out_view=st.booleans(), cut=st.integers(0, 3))
def test_posted_products_equal_numpy(pool, batch, m, k, n, a_how, b_how, broadcast_a, out_view, cut):
    rng = np.random.default_rng(m * 10007 + n * 101 + k)
    a = _layout(rng, (m, k) if broadcast_a else batch + (m, k), a_how)
    b = _layout(rng, batch + (k, n), b_how)
    wide = np.full(batch + (m, n + 3), np.nan, np.float32)
    out = wide[..., 1:1 + n] if out_view else np.full(batch + (m, n), np.nan, np.float32)
    # The output's rows in up to three pieces, on this thread and the two workers.
    edges = sorted({0, m, min(m, cut), min(m, 2 * cut)})
    assume(all(r1 - r0 > 1 for r0, r1 in zip(edges, edges[1:])))  # vectors are numpy's (below)
    parts = [functools.partial(np.matmul, a[..., r0:r1, :], b, out=out[..., r0:r1, :]) for r0, r1 in zip(edges, edges[1:])]
    rows = [native_threads.gemms(part) for part in parts]
    assert None not in rows
    table = np.array([r for found in rows for r in found], np.int64)
    spans, first = [], 0
    for found in rows + [[]] * (3 - len(rows)):
        spans.append((first, first + len(found)))
        first += len(found)
    pool.run(table, spans)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    if out_view:  # nothing written outside the output
        assert np.isnan(wide[..., 0]).all() and np.isnan(wide[..., -2:]).all()


def test_the_workers_call_numpys_own_blas_where_its_wheels_bundle_one(pool):
    """numpy's wheels bundle an OpenBLAS (scipy-openblas, 64-bit integers): the workers call its
    sgemm and sgemv, so that their products are numpy's matmul's bit for bit (scipy's build of
    OpenBLAS rounds differently, and ran the pointwise convs' products 25% slower)."""
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    found = native_threads._numpy_blas()
    if blas.get("name") == "scipy-openblas":
        assert found is not None and all(found[:2]) and found[2] is np.int64
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((37, 150)).astype(np.float32), rng.standard_normal((150, 300)).astype(np.float32)
    out = np.full((37, 300), np.nan, np.float32)
    pool.run(*_halves(a, b, out))
    if found is not None:  # the same pieces through numpy (a whole product may round otherwise)
        np.testing.assert_array_equal(out, np.concatenate([np.matmul(a[:18], b), np.matmul(a[18:], b)]))
    else:
        np.testing.assert_allclose(out, a @ b.astype(np.float64), rtol=1e-4, atol=1e-3)


def test_products_blas_cannot_read_are_left_to_numpy():
    a = np.ones((4, 6), np.float32)
    b = np.ones((6, 5), np.float32)
    out = np.empty((4, 5), np.float32)
    assert native_threads.gemms(functools.partial(np.matmul, a, b, out=out)) is not None
    for one_row_or_column in (functools.partial(np.matmul, a[:1], b, out=out[:1]),
                              functools.partial(np.matmul, a, b[:, :1], out=out[:, :1])):
        assert [row[native_threads.TA] for row in native_threads.gemms(one_row_or_column)] == [native_threads.GEMV]
    refused = [
        functools.partial(np.matmul, a.astype(np.float64), b.astype(np.float64), out=out.astype(np.float64)),
        functools.partial(np.matmul, np.ones((4, 12), np.float32)[:, ::2], b, out=out),  # strided both ways
        functools.partial(np.matmul, a, b, out=np.empty((5, 4), np.float32).T),  # output down its columns
        functools.partial(np.matmul, a, np.ones(6, np.float32), out=np.empty(4, np.float32)),  # a vector
        functools.partial(np.matmul, np.ones((1, 12), np.float32)[:, ::-2], b, out=out[:1]),  # x backwards
        functools.partial(np.add, a, a, out=a),
        functools.partial(np.matmul, a, b),  # no output
    ]
    square = np.ones((5, 5), np.float32)
    refused.append(functools.partial(np.matmul, square, square, out=square))  # in place
    for part in refused:
        assert native_threads.gemms(part) is None, part


def _halves(a, b, out):
    """A table computing a @ b into out, its rows' halves apart, and its spans for a pool of one."""
    h = len(a) // 2
    rows = native_threads.gemms(functools.partial(np.matmul, a[:h], b, out=out[:h])) \
        + native_threads.gemms(functools.partial(np.matmul, a[h:], b, out=out[h:]))
    return np.array(rows, np.int64), [(0, 1), (1, 2)]


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 70), n=st.integers(1, 90), column=st.booleans(), transposed=st.booleans(),
       step_x=st.integers(1, 3), step_y=st.integers(1, 3), seed=st.integers(0, 2 ** 16))
def test_vector_products_run_as_sgemv_rows(pool, k, n, column, transposed, step_x, step_y, seed):
    """A product with one row (x @ W) or one column (W @ x) of result is one GEMV row, its
    matrix read in either layout and its vectors strided; split by the result's elements
    over the caller and a worker, numpy's values."""
    rng = np.random.default_rng(seed)
    matrix = rng.standard_normal((n, k) if column else (k, n)).astype(np.float32)
    if transposed:
        matrix = np.asfortranarray(matrix)
    x = rng.standard_normal(k * step_x).astype(np.float32)[::step_x]
    x = x.reshape(k, 1) if column else x.reshape(1, k)
    y = np.full((n * step_y,), np.nan, np.float32)[::step_y]
    y = y.reshape(n, 1) if column else y.reshape(1, n)
    cut = n // 2
    if column:
        halves = [functools.partial(np.matmul, matrix[:cut], x, out=y[:cut]),
                  functools.partial(np.matmul, matrix[cut:], x, out=y[cut:])]
    else:
        halves = [functools.partial(np.matmul, x, matrix[:, :cut], out=y[:, :cut]),
                  functools.partial(np.matmul, x, matrix[:, cut:], out=y[:, cut:])]
    halves = [h for h in halves if h.keywords["out"].size]
    rows = [native_threads.gemms(h) for h in halves]
    assert all(found is not None and [row[native_threads.TA] for row in found] == [native_threads.GEMV]
               for found in rows)
    table = [row for found in rows for row in found]
    spans = [(0, 1), (1, len(table)), (len(table), len(table))]
    pool.run(np.array(table, np.int64), spans)
    want = matrix.astype(np.float64) @ x if column else x.astype(np.float64) @ matrix
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def test_sleeping_workers_wake_for_the_next_post(monkeypatch):
    monkeypatch.setattr(native_threads, "SPIN_YIELDS", 10)
    p = native_threads.Pool(1)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((40, 30)).astype(np.float32), rng.standard_normal((30, 20)).astype(np.float32)
    try:
        for _ in range(3):
            deadline = time.monotonic() + 5
            while p.slots[native_threads.STATE] != native_threads.SLEEPING:
                assert time.monotonic() < deadline, "the worker never went to sleep"
                time.sleep(0.001)
            out = np.full((40, 20), np.nan, np.float32)
            p.run(*_halves(a, b, out))
            np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)
    finally:
        p.close()


def test_a_sleeping_worker_woken_without_work_spins_then_serves(monkeypatch):
    """wake() brings a sleeping worker back to looking for work (IDLE) with nothing posted;
    a wake of an awake worker changes nothing, and the next post is served (no lost or
    doubled release of its lock)."""
    monkeypatch.setattr(native_threads, "SPIN_YIELDS", 10)
    p = native_threads.Pool(1)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((40, 30)).astype(np.float32), rng.standard_normal((30, 20)).astype(np.float32)
    try:
        deadline = time.monotonic() + 5
        while p.slots[native_threads.STATE] != native_threads.SLEEPING:
            assert time.monotonic() < deadline, "the worker never went to sleep"
            time.sleep(0.001)
        monkeypatch.setattr(native_threads, "SPIN_YIELDS", 10 ** 12)  # once woken it spins until work comes
        p.wake()
        assert p.slots[native_threads.STATE] == native_threads.IDLE
        p.wake()  # awake already: nothing to release
        assert p.slots[native_threads.STATE] == native_threads.IDLE
        for _ in range(2):
            out = np.full((40, 20), np.nan, np.float32)
            p.run(*_halves(a, b, out))
            np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)
    finally:
        p.close()


def test_a_closed_pool_runs_the_products_itself():
    p = native_threads.Pool(1)
    p.close()
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((40, 30)).astype(np.float32), rng.standard_normal((30, 20)).astype(np.float32)
    out = np.full((40, 20), np.nan, np.float32)
    p.run(*_halves(a, b, out))
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)


def test_closed_pools_threads_end():
    def ours():
        return {t for t in threading.enumerate() if t.name == "edgeflow-native-worker"}
    before = ours()
    pools = [native_threads.Pool(2) for _ in range(3)]
    assert len(ours() - before) == 6
    for p in pools:
        p.close()
    deadline = time.monotonic() + 5
    while ours() - before:
        assert time.monotonic() < deadline, "native workers still running after close"
        time.sleep(0.01)


def test_workers_of_an_interpreter_are_native_unless_told_not(monkeypatch):
    w = threads.Workers(2)
    assert w.native is not None and w.native.n == 1
    w.close()
    monkeypatch.setenv("EDGEFLOW_NATIVE_THREADS", "0")
    w = threads.Workers(2)
    assert w.native is None
    w.close()


def test_a_split_of_products_runs_on_the_native_workers():
    w = threads.Workers(2)
    a = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((48, 30)).astype(np.float32)
    out = np.zeros((64, 30), np.float32)
    parts = [functools.partial(np.matmul, a[r0:r1], b, out=out[r0:r1]) for r0, r1 in threads.pieces(64, 2)]
    step = w.split(parts)
    assert step.func == w._run_native
    step()
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)
    assert w.split(parts + [lambda: None]).func == w.run  # not every task a product: Python's
    w.close()


def test_a_forked_child_runs_the_products_itself():
    """The child of a fork has none of the pool's threads: its posts run on its own thread."""
    import multiprocessing
    p = native_threads.Pool(1)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((40, 30)).astype(np.float32), rng.standard_normal((30, 20)).astype(np.float32)

    def child(conn):
        out = np.full((40, 20), np.nan, np.float32)
        p.run(*_halves(a, b, out))
        conn.send(out)
    try:
        ours, theirs = multiprocessing.get_context("fork").Pipe()
        proc = multiprocessing.get_context("fork").Process(target=child, args=(theirs,))
        proc.start()
        assert ours.poll(30), "the forked child did not answer"
        np.testing.assert_allclose(ours.recv(), a @ b, rtol=1e-5, atol=1e-4)
        proc.join(10)
    finally:
        p.close()


def test_a_caller_waiting_long_sleeps_between_looks(pool):
    """A worker's share long enough that the caller's wait passes WAIT_YIELDS and sleeps
    (usleep through its address) between looks: the product still comes back whole."""
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((600, 600)).astype(np.float32), rng.standard_normal((600, 600)).astype(np.float32)
    out = np.full((600, 600), np.nan, np.float32)
    rows = native_threads.gemms(functools.partial(np.matmul, a, b, out=out))
    pool.run(np.array(rows, np.int64), [(0, 0), (0, 1), (1, 1)])  # all on worker 0; the caller only waits
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


def test_call_rows_run_native_gemm_pieces_beside_products(pool):
    """A table mixing CALL rows (native_gemm's pieces: columns of one product with its
    epilogue, each piece its own operands) and sgemm rows, spread over this thread and the
    two workers: every piece written as numpy computes it."""
    from edgeflow.interp.kernels import native_gemm
    if not native_gemm.available():
        pytest.skip("native_gemm runs on x86-64 with AVX2 and FMA")
    rng = np.random.default_rng(7)
    w, bias = rng.standard_normal((20, 30)).astype(np.float32), rng.standard_normal(20).astype(np.float32)
    x = rng.standard_normal((1, 30, 100)).astype(np.float32)
    out = np.full((1, 20, 100), np.nan, np.float32)
    packed = native_gemm.pack(w, bias)
    pieces = [native_gemm.bind(packed, x[:, :, a:b], out[:, :, a:b], "relu") for a, b in ((0, 48), (48, 72), (72, 100))]
    a, b = rng.standard_normal((9, 8)).astype(np.float32), rng.standard_normal((8, 7)).astype(np.float32)
    product = np.full((9, 7), np.nan, np.float32)
    rows = [native_threads.gemms(piece) for piece in pieces] + [native_threads.gemms(
        functools.partial(np.matmul, a, b, out=product))]
    assert all(len(r) == 1 for r in rows) and [r[0][native_threads.TA] for r in rows[:3]] == [native_threads.CALL] * 3
    table = np.array([r[0] for r in rows], np.int64)
    pool.run(table, [(0, 2), (2, 3), (3, 4)])
    want = np.maximum(np.einsum("mk,nkp->nmp", w.astype(np.float64), x) + bias[:, None], 0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    np.testing.assert_allclose(product, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_a_chain_runs_its_stages_in_order_on_one_worker(pool):
    """threads.chain(product, native piece): its rows in order, so the piece (native_gemm's
    w @ t with its bias and relu) reads the product t the same worker wrote just before; two
    chains on the two workers, one part of nothing on this thread; and a chain holding a step
    that is neither gives no rows."""
    from edgeflow.interp.kernels import native_gemm
    if not native_gemm.available():
        pytest.skip("native_gemm runs on x86-64 with AVX2 and FMA")
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((2, 30, 12)).astype(np.float32), rng.standard_normal((12, 40)).astype(np.float32)
    w, bias = rng.standard_normal((20, 30)).astype(np.float32), rng.standard_normal(20).astype(np.float32)
    t = np.full((2, 30, 40), np.nan, np.float32)
    out = np.full((2, 20, 40), np.nan, np.float32)
    packed = native_gemm.pack(w, bias)
    chains = [threads.chain(functools.partial(np.matmul, a[i], b, out=t[i]),
                            native_gemm.bind(packed, t[i:i + 1], out[i:i + 1], "relu")) for i in range(2)]
    rows = [native_threads.gemms(c) for c in chains]
    assert [len(r) for r in rows] == [2, 2] and [r[1][native_threads.TA] for r in rows] == [native_threads.CALL] * 2
    pool.run(np.array(rows[0] + rows[1], np.int64), [(0, 0), (0, 2), (2, 4)])
    want = np.maximum(np.einsum("mk,nkp->nmp", w.astype(np.float64), a.astype(np.float64) @ b) + bias[:, None], 0)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert native_threads.gemms(threads.chain(chains[0], lambda: None)) is None
