"""Adaptive batching (edgeflow.cloud.batching): the AIMD controller on a synthetic latency
model, batches on a counting backend, and 32 devices through a real server, each answered
with its own rows: bit for bit where the model is batch-invariant, within float rounding on
MobileNetV2. References are unbatched runs and numpy, never the batching code."""
import subprocess
import threading

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.cloud import models
from edgeflow.cloud.backends import Local
from edgeflow.cloud.batching import AIMD, Batching, bucket
from edgeflow.cloud.budget import MemoryBudget, Reservation
from edgeflow.cloud.metrics import Metrics
from edgeflow.errors import EdgeflowError, InvalidInputError, RemoteError
from edgeflow.format import writer

from .conftest import TABLE, build_model
from .test_serve_cli import Lines, edgeflow

from edgeflow.cloud import Client, Server

LONG_WAIT_MS = 30000  # batches in these tests fill by rows; the wait only bounds a broken test


# -- the controller ----------------------------------------------------------------------------

def latency(batch):
    """The synthetic model: 2 ms, and 1 ms a row."""
    return (2 + batch) / 1000  # (18 rows: exactly 0.020)


def drive(aimd, steps):
    """Run full batches of the controller's size `steps` times; the sizes run."""
    sizes = []
    for _ in range(steps):
        sizes.append(aimd.size)
        aimd.observe(aimd.size, latency(aimd.size))
    return sizes


def test_aimd_grows_additively_to_the_largest_size_within_the_slo_then_backs_off():
    aimd = AIMD(slo_s=0.020, max_batch=64)
    sizes = drive(aimd, 19)
    assert sizes == list(range(1, 20))  # +1 per full batch within the SLO; 18 rows take 20 ms: within
    assert latency(18) <= 0.020 < latency(19)
    assert aimd.size == 17  # 19 rows took 21 ms: floor(19 * 0.9)


def test_aimd_oscillates_at_the_slo_boundary():
    aimd = AIMD(slo_s=0.020, max_batch=64)
    sizes = drive(aimd, 300)[50:]
    assert set(sizes) == {17, 18, 19}  # 19 is over, 18 the largest within
    assert 0.018 < np.mean([latency(s) for s in sizes]) <= 0.0205


def test_aimd_stays_within_one_and_max_batch():
    fast = AIMD(slo_s=1.0, max_batch=8)
    assert max(drive(fast, 50)) == 8 and fast.size == 8
    slow = AIMD(slo_s=0.001, max_batch=8, start=8)
    assert drive(slow, 20)[:4] == [8, 7, 6, 5] and slow.size == 1  # each step at least one less
    slow.observe(1, 10.0)
    assert slow.size == 1


def test_aimd_backoff_is_multiplicative_and_at_least_one():
    aimd = AIMD(slo_s=0.010, max_batch=100, start=50)
    aimd.observe(50, 0.011)
    assert aimd.size == 45
    gentle = AIMD(slo_s=0.010, backoff=0.99, start=10)
    gentle.observe(10, 1.0)
    assert gentle.size == 9  # floor(9.9) = 9


def test_aimd_grows_only_after_a_full_batch_and_by_its_step():
    aimd = AIMD(slo_s=0.020, start=4, step=3)
    aimd.observe(2, 0.001)  # a partial batch says nothing about a bigger one
    assert aimd.size == 4
    aimd.observe(4, 0.001)
    assert aimd.size == 7


@pytest.mark.parametrize("kw", [dict(slo_s=0), dict(slo_s=1, max_batch=0), dict(slo_s=1, backoff=1),
                                dict(slo_s=1, step=0), dict(slo_s=1, start=0)])
def test_aimd_arguments_are_checked(kw):
    with pytest.raises(EdgeflowError, match="AIMD: expected"):
        AIMD(**kw)


# -- models ------------------------------------------------------------------------------------

def save(graph, path, outputs, inputs):
    ef.save(graph, path, signatures={"infer": (inputs, outputs)})
    return path


def build_invariant(path):
    """Convolution, pooling, softmax and elementwise ops: batched rows equal single runs bit
    for bit (checked against single runs in the tests below, not assumed)."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 3, 8, 8], name="x")
        c = ef.layers.conv2d(x, 4, 3, activation=ef.nn.relu, name="c")
        p = ef.nn.relu(ef.layers.max_pool2d(c, 2, 2), name="p")  # (the pool's own tensor gets a suffix)
        e = ef.tanh(x * 0.5 + 1.0, name="e")
        s = ef.nn.softmax(ef.exp(-x) - x * x, name="s")
    return save(g, path, {"p": p, "e": e, "s": s}, {"x": x})


def build_mixing(path):
    """Outputs that are not one row per input row: a sum over the batch (declared without
    the batch axis) and a flattening (declared (-1,): found only when it runs)."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        total = ef.reduce_sum(x, axis=0, name="total")
        flat = ef.reshape(x * 3.0, [-1], name="flat")
    return save(g, path, {"total": total, "flat": flat}, {"x": x})


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    from edgeflow.converters import onnx
    d = tmp_path_factory.mktemp("batching")
    writer.write(build_model(), d / "m.efl")
    onnx.convert("tests/data/onnx/mobilenetv2.onnx", str(d / "mnv2.efl"))
    return {"m": d / "m.efl", "conv": build_invariant(d / "conv.efl"), "mixing": build_mixing(d / "mixing.efl"),
            "mnv2": d / "mnv2.efl"}


def unbatched(path, fetches, feeds):
    """The reference: the package run alone on these feeds, outside any server."""
    return models.load(path).run(fetches, feeds, None)


# -- Batching on a counting backend ------------------------------------------------------------

class Counting(Local):
    """Local, counting the rows of each run it is given."""

    def __init__(self, fail=None):
        super().__init__(None)
        self.calls, self.fail, self.closed = [], fail, False

    def run(self, model, fetches, feeds, reservation, encoding=""):
        rows = len(next(iter(feeds.values())))
        self.calls.append(rows)
        if self.fail is not None and rows > 1:
            raise self.fail
        return super().run(model, fetches, feeds, reservation, encoding)

    def close(self):
        self.closed = True


class Recorder(Metrics):
    def __init__(self):
        self.batches, self.depths, self.lookups = [], [], []

    def batch(self, model, size):
        self.batches.append(size)

    def queue(self, model, depth):
        self.depths.append(depth)

    def cache(self, model, hit):
        self.lookups.append(hit)


def concurrently(fn, inputs):
    """fn(each input) in a thread of its own; [result or exception], in input order."""
    results = [None] * len(inputs)

    def call(k):
        try:
            results[k] = fn(inputs[k])
        except Exception as e:  # checked by the caller
            results[k] = e
    threads = [threading.Thread(target=call, args=(k,)) for k in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def images(seed, rows):
    return np.random.default_rng(seed).standard_normal((rows, 3, 8, 8)).astype(np.float32)


def test_requests_run_as_one_batch_and_each_gets_its_own_rows(paths):
    model, inner, metrics = models.load(paths["conv"]), Counting(), Recorder()
    rows = [1, 2, 3, 1, 2, 3]
    batching = Batching(inner, slo_ms=1000, max_wait_ms=LONG_WAIT_MS, metrics=metrics, start=sum(rows))
    feeds = [images(k, n) for k, n in enumerate(rows)]
    fetches = ["p", "e", "s"]
    results = concurrently(lambda x: batching.run(model, fetches, {"x": x}, Reservation(None, "conv")), feeds)
    assert inner.calls == [16] and metrics.batches == [6]  # one run: full at 12 rows, padded to 16
    assert metrics.depths[-1] == 0 and max(metrics.depths) == 6
    for x, out in zip(feeds, results):
        ref = unbatched(paths["conv"], fetches, {"x": x})
        for name in fetches:
            assert out[name].shape[0] == len(x)
            np.testing.assert_array_equal(out[name], ref[name])  # bit for bit
        np.testing.assert_array_equal(out["e"], np.tanh(x * np.float32(0.5) + np.float32(1)))


def test_a_batch_runs_partly_full_after_the_wait(paths):
    model, inner = models.load(paths["conv"]), Counting()
    batching = Batching(inner, slo_ms=1000, max_wait_ms=1, start=64)
    x = images(0, 2)
    out = batching.run(model, ["e"], {"x": x}, Reservation(None, "conv"))  # nobody else comes
    assert inner.calls == [2]
    np.testing.assert_array_equal(out["e"], unbatched(paths["conv"], ["e"], {"x": x})["e"])


def test_what_cannot_batch_goes_straight_to_inner(paths):
    model, inner = models.load(paths["m"]), Counting()
    batching = Batching(inner, slo_ms=1000, max_wait_ms=LONG_WAIT_MS, start=64)
    x, idx = np.ones((3, 4), np.float32), np.array([1, 4], np.int32)
    out = batching.run(model, ["double", "picked"], {"x": x, "idx": idx}, None)  # leading sizes differ
    np.testing.assert_array_equal(out["picked"], TABLE[idx])
    out = batching.run(model, ["double"], {"x": np.ones((0, 4), np.float32)}, None)  # no rows
    assert out["double"].shape == (0, 4)
    assert inner.calls == [3, 0]  # each ran at once, alone: no 30 s wait for a batch


def test_a_non_batch_major_output_is_answered_one_request_at_a_time(paths):
    model, inner = models.load(paths["mixing"]), Counting()
    batching = Batching(inner, slo_ms=1000, max_wait_ms=LONG_WAIT_MS, start=4)
    feeds = [np.full((1, 4), k, np.float32) + np.arange(4, dtype=np.float32) for k in range(4)]
    run = lambda fetches: concurrently(lambda x: batching.run(model, fetches, {"x": x}, None), feeds)  # noqa: E731
    for x, out in zip(feeds, run(["total"])):  # declared (4,): never batched
        np.testing.assert_array_equal(out["total"], x.sum(axis=0))
    assert inner.calls == [1, 1, 1, 1]
    inner.calls.clear()
    for x, out in zip(feeds, run(["flat"])):  # declared (-1,), 16 values for 4 rows: re-run alone
        np.testing.assert_array_equal(out["flat"], (x * 3).reshape(-1))
    assert inner.calls == [4, 1, 1, 1, 1]
    inner.calls.clear()
    out = batching.run(model, ["flat"], {"x": feeds[0]}, None)  # unbatchable from now on: no wait
    np.testing.assert_array_equal(out["flat"], (feeds[0] * 3).reshape(-1))
    assert inner.calls == [1]


def test_a_failed_batch_raises_its_error_in_every_request(paths):
    model, inner = models.load(paths["conv"]), Counting(fail=RuntimeError("kernel on fire"))
    batching = Batching(inner, slo_ms=1000, max_wait_ms=LONG_WAIT_MS, start=4)
    results = concurrently(lambda x: batching.run(model, ["e"], {"x": x}, None), [images(k, 1) for k in range(4)])
    assert inner.calls == [4]  # one run, not retried
    assert all(type(e) is RuntimeError and str(e) == "kernel on fire" for e in results)
    assert len({id(e) for e in results}) == 4  # each thread raised its own copy
    inner.fail = None
    feeds = [images(10 + k, 1) for k in range(4)]
    for x, out in zip(feeds, concurrently(lambda x: batching.run(model, ["e"], {"x": x}, None), feeds)):
        np.testing.assert_array_equal(out["e"], unbatched(paths["conv"], ["e"], {"x": x})["e"])
    assert inner.calls == [4, 4]  # the key batches on


def test_one_devices_bad_rows_fail_its_own_request_alone(paths):
    model, inner = models.load(paths["m"]), Counting()
    batching = Batching(inner, slo_ms=1000, max_wait_ms=LONG_WAIT_MS, start=4)
    run = lambda feeds: concurrently(lambda idx: batching.run(model, ["picked"], {"idx": idx}, None), feeds)  # noqa
    feeds = [np.array([k], np.int32) for k in (0, 7, 2, 3)]  # the second is out of range
    results = run(feeds)
    assert inner.calls == [4, 1, 1, 1, 1]  # the batch failed: each ran alone
    assert isinstance(results[1], InvalidInputError) and "out of range" in str(results[1])
    for k in (0, 2, 3):
        np.testing.assert_array_equal(results[k]["picked"], TABLE[feeds[k]])
    inner.calls.clear()
    feeds[1] = np.array([1], np.int32)
    for idx, out in zip(feeds, run(feeds)):
        np.testing.assert_array_equal(out["picked"], TABLE[idx])
    assert inner.calls == [4]  # still batched: a device's values failed the batch, not batching


def test_every_device_failing_alone_gets_its_error(paths):
    model, inner = models.load(paths["m"]), Counting()
    batching = Batching(inner, slo_ms=1000, max_wait_ms=LONG_WAIT_MS, start=3)
    results = concurrently(lambda idx: batching.run(model, ["picked"], {"idx": idx}, None),
                           [np.array([9], np.int32)] * 3)
    assert all(isinstance(e, InvalidInputError) and "out of range" in str(e) for e in results)


def test_a_batch_reserves_memory_and_gives_it_all_back(paths):
    model, inner = models.load(paths["conv"]), Counting()
    budget = MemoryBudget(1 << 30)
    model.use_budget(budget)
    batching = Batching(inner, slo_ms=1000, max_wait_ms=LONG_WAIT_MS, start=4)
    held = [Reservation(budget, model.id) for _ in range(4)]
    results = concurrently(lambda k: batching.run(model, ["e", "s"], {"x": images(k, 1)}, held[k]), [0, 1, 2, 3])
    assert inner.calls == [4]
    for k in range(4):  # each request holds its own outputs, as an unbatched run does
        assert held[k].nbytes == results[k]["e"].nbytes + results[k]["s"].nbytes
        held[k].close()
    assert budget.used == budget.by_model[model.id] == sum(model._charged.values())  # what interpreters keep


def test_rounds_and_close_go_to_inner():
    class Inner:
        closed = False

        def round(self, *args):
            return {"args": args}

        def close(self):
            self.closed = True
    inner = Inner()
    batching = Batching(inner, slo_ms=10)
    assert batching.round("model", "dev", "step", {"x": 1}, ["y"]) == {"args": ("model", "dev", "step", {"x": 1},
                                                                                 ["y"])}
    batching.close()
    assert inner.closed


# -- 32 devices through a server ---------------------------------------------------------------

def devices(server, work, n=32):
    """work(client, k) for k in range(n), each device a thread with its own client."""
    def device(k):
        with Client(server.address, timeout=60) as client:
            return work(client, k)
    results = concurrently(device, list(range(n)))
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors[:3]
    return results


def test_32_devices_get_their_own_rows_bit_for_bit(paths):
    metrics = Recorder()
    batching = dict(slo_ms=1000, max_batch=64, max_wait_ms=50)
    with Server(models={"conv": paths["conv"]}, max_workers=32, batching=batching, metrics=metrics) as server:
        def work(client, k):
            sent = [images(100 * k + i, 1 + (k + i) % 3) for i in range(3)]
            return [(x, client.run("conv", {"x": x}, ["p", "e", "s"])) for x in sent]
        results = devices(server, work)
    assert sum(metrics.batches) == 96 and max(metrics.batches) > 1  # batches of several devices ran
    for replies in results:
        for x, out in replies:
            ref = unbatched(paths["conv"], ["p", "e", "s"], {"x": x})
            for name in ("p", "e", "s"):
                np.testing.assert_array_equal(out[name], ref[name])


def test_32_devices_on_mobilenetv2_get_their_own_answers(paths):
    metrics = Recorder()
    batching = dict(slo_ms=1000, max_batch=32, max_wait_ms=50)
    inputs = [np.random.default_rng(k).standard_normal((1, 3, 64, 64)).astype(np.float32) for k in range(32)]
    refs = [unbatched(paths["mnv2"], ["logits"], {"image": x})["logits"] for x in inputs]
    with Server(models={"mnv2": paths["mnv2"]}, max_workers=32, batching=batching, metrics=metrics) as server:
        results = devices(server, lambda client, k: client.run("mnv2", {"image": inputs[k]}, ["logits"]))
    assert max(metrics.batches) > 1
    for k, out in enumerate(results):
        # the classifier's one-row matmul sums in another order than the batch's: rounding apart
        np.testing.assert_allclose(out["logits"], refs[k], rtol=1e-5, atol=1e-6)
        others = [j for j in range(32) if j != k]
        assert all(not np.allclose(out["logits"], refs[j], rtol=1e-5, atol=1e-6) for j in others)


def test_a_non_batch_major_model_answers_correctly_over_grpc(paths):
    batching = dict(slo_ms=1000, max_batch=64, max_wait_ms=20)
    with Server(models={"mixing": paths["mixing"]}, max_workers=16, batching=batching) as server:
        def work(client, k):
            x = np.random.default_rng(k).standard_normal((1 + k % 3, 4)).astype(np.float32)
            return x, client.run("mixing", {"x": x}, ["total", "flat"])
        for x, out in devices(server, work, n=12):
            np.testing.assert_allclose(out["total"], x.sum(axis=0), rtol=1e-6)
            np.testing.assert_array_equal(out["flat"], (x * np.float32(3)).reshape(-1))


class KernelOnFire(RuntimeError):
    """An unexpected failure of a kind no other test's server logs (the server logs one line
    per kind every few seconds, process-wide)."""


def test_a_failed_batch_fails_every_request_and_the_server_keeps_serving(paths):
    batching = dict(slo_ms=1000, max_batch=64, max_wait_ms=LONG_WAIT_MS, start=8)
    with Server(models={"m": paths["m"]}, max_workers=16, batching=batching) as server:
        local = server.backend.inner
        server.backend.inner = Counting(fail=KernelOnFire("kernel on fire"))

        def work(client, k):
            try:
                client.run("m", {"x": np.full((1, 4), k, np.float32)}, ["double"])
            except RemoteError as e:
                return [e]  # (returned, not raised: devices() checks that nothing raised)
        errors = [e for e, in devices(server, work, n=8)]
        assert server.backend.inner.calls == [8]
        assert all(e.code == "INTERNAL" and "KernelOnFire: kernel on fire" in e.details for e in errors)
        server.backend.inner = local

        def bad(client, k):  # every device's index out of range: each alone is INVALID_ARGUMENT too
            try:
                client.run("m", {"idx": np.array([5 + k], np.int32)}, ["picked"])
            except RemoteError as e:
                return [e]
        errors = [e for e, in devices(server, bad, n=8)]
        assert all(e.code == "INVALID_ARGUMENT" and "out of range" in e.details for e in errors)

        def good(client, k):
            x = np.full((1, 4), k, np.float32)
            return x, client.run("m", {"x": x}, ["double"])
        for x, out in devices(server, good, n=8):  # a batch of 8 again, on the first failed key
            np.testing.assert_array_equal(out["double"], x * 2)


# -- the command line --------------------------------------------------------------------------

def test_serve_help_lists_the_batching_and_cache_flags():
    r = subprocess.run(edgeflow("serve", "--help"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0
    for flag in ("--slo-ms", "--max-batch", "--batch-wait-ms", "--cache-entries"):
        assert flag in r.stdout


@pytest.mark.parametrize("args, reason", [
    (["--slo-ms", "0"], "expected --slo-ms > 0, got 0.0"),
    (["--slo-ms", "10", "--max-batch", "0"], "expected --max-batch > 0, got 0"),
    (["--slo-ms", "10", "--batch-wait-ms", "-1"], "expected --batch-wait-ms > 0, got -1.0"),
    (["--cache-entries", "-1"], "expected --cache-entries >= 0"),
    (["--max-batch", "8"], "--max-batch: only with --slo-ms"),
])
def test_bad_batching_flags_exit_2_with_one_line(tmp_path, args, reason):
    r = subprocess.run(edgeflow("serve", "--model-dir", tmp_path, *args), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("edgeflow serve: error:") and reason in r.stderr


def test_serve_with_batching_and_cache(paths, tmp_path):
    import shutil
    shutil.copy(paths["conv"], tmp_path / "conv.efl")
    proc = subprocess.Popen(edgeflow("serve", "--model-dir", tmp_path, "--port", 0, "--slo-ms", 50,
                                     "--max-batch", 16, "--batch-wait-ms", 1, "--cache-entries", 10, "--grace", 0),
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        lines = Lines(proc.stderr)
        lines.wait_for(r"adaptive batching on: batches within 50 ms, at most 16 rows, waiting up to 1 ms")
        lines.wait_for(r"prediction cache on: the replies of the last 10 distinct requests")
        port = lines.wait_for(r"serving 1 models on 127\.0\.0\.1:(\d+)").group(1)
        with Client(f"127.0.0.1:{port}", timeout=30) as client:
            x = images(0, 2)
            for _ in range(2):  # a run, then the cache
                np.testing.assert_array_equal(client.run("conv", {"x": x}, ["e"])["e"],
                                              unbatched(paths["conv"], ["e"], {"x": x})["e"])
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_a_batch_runs_at_the_next_power_of_two_rows_at_most_max_batch():
    assert [bucket(n, 32) for n in (1, 2, 3, 5, 8, 9, 17, 32, 35)] == [1, 2, 4, 8, 8, 16, 32, 32, 35]
    assert [bucket(n, 12) for n in (5, 9, 12)] == [8, 12, 12]

