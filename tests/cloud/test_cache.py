"""The prediction cache (edgeflow.cloud.cache): a hit answers without running, a change of
any input byte, dtype, shape, fetch or package misses, the least recently used go first,
callers never get the stored arrays, and a server with cache_entries answers repeats
from it."""
import threading
import types

import numpy as np
import pytest

from edgeflow.cloud import Client, Server
from edgeflow.cloud.budget import MemoryBudget, Reservation
from edgeflow.cloud.cache import Cached
from edgeflow.errors import EdgeflowError

from .conftest import budget_settles, reference
from .test_batching import Recorder

MODEL = types.SimpleNamespace(id="m", sha256="ab" * 32)


class Doubling:
    """A backend that doubles feed x, counting its runs (and the feeds each saw)."""

    def __init__(self):
        self.runs, self.rounds, self.closed = 0, 0, False

    def run(self, model, fetches, feeds, reservation, encoding=""):
        self.runs += 1
        return {name: feeds["x"] * 2 for name in fetches}

    def round(self, model, device_id, step, feeds, fetches):
        self.rounds += 1
        return {"y": feeds["x"] * 2}

    def close(self):
        self.closed = True


def run(cache, x, fetches=("y",), model=MODEL, encoding=""):
    return cache.run(model, list(fetches), {"x": x}, None, encoding)


def test_a_hit_answers_without_running_inner():
    inner, metrics = Doubling(), Recorder()
    cache = Cached(inner, 4, metrics=metrics)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    first, second = run(cache, x), run(cache, x.copy())
    assert inner.runs == 1 and metrics.lookups == [False, True]
    np.testing.assert_array_equal(first["y"], x * 2)
    np.testing.assert_array_equal(second["y"], x * 2)
    assert second["y"].dtype == np.float32 and second["y"].flags.writeable


@pytest.mark.parametrize("change", ["bytes", "dtype", "shape", "fetches", "package", "encoding", "name"])
def test_any_change_of_what_determines_the_outputs_misses(change):
    inner = Doubling()
    cache = Cached(inner, 8)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    run(cache, x)
    if change == "bytes":
        y = x.copy()
        y[1, 2] = np.nextafter(y[1, 2], np.float32(9))  # one bit
        run(cache, y)
    elif change == "dtype":
        run(cache, x.view(np.int32))  # the same bytes
    elif change == "shape":
        run(cache, x.reshape(3, 2))
    elif change == "fetches":
        run(cache, x, fetches=("y", "z"))
    elif change == "package":
        run(cache, x, model=types.SimpleNamespace(id="m", sha256="cd" * 32))
    elif change == "encoding":
        run(cache, x, encoding="fp16")
    else:
        cache.run(MODEL, ["y"], {"x": x, "x2": np.zeros(0, np.float32)}, None)
    assert inner.runs == 2
    run(cache, x)
    assert inner.runs == 2  # the first is still there


def test_the_least_recently_used_entry_goes_first():
    inner = Doubling()
    cache = Cached(inner, 2)
    a, b, c = (np.full(3, v, np.float32) for v in (1, 2, 3))
    run(cache, a)
    run(cache, b)
    run(cache, a)  # a is now the most recent
    run(cache, c)  # b goes
    assert inner.runs == 3 and len(cache) == 2
    run(cache, a)
    run(cache, c)
    assert inner.runs == 3
    run(cache, b)
    assert inner.runs == 4


def test_max_bytes_bounds_the_entries():
    inner = Doubling()
    cache = Cached(inner, 100, max_bytes=1000)
    big = np.ones(300, np.float32)  # 1200 bytes of outputs: never kept
    run(cache, big)
    run(cache, big)
    assert inner.runs == 2 and len(cache) == 0
    small = [np.full(100, v, np.float32) for v in range(3)]  # 400 bytes each: two fit
    for x in small:
        run(cache, x)
    assert len(cache) == 2 and cache.nbytes == 800
    run(cache, small[0])  # the oldest went
    assert inner.runs == 6
    run(cache, small[2])
    assert inner.runs == 6


def test_callers_never_get_the_stored_arrays():
    cache = Cached(Doubling(), 4)
    x = np.arange(4, dtype=np.float32)
    first = run(cache, x)["y"]
    first[:] = -1  # the miss's answer: not what was stored
    hit = run(cache, x)["y"]
    np.testing.assert_array_equal(hit, x * 2)
    hit[:] = -2  # nor the hit's
    np.testing.assert_array_equal(run(cache, x)["y"], x * 2)
    stored = next(iter(cache._entries.values()))["y"]
    assert not stored.flags.writeable and not np.shares_memory(stored, hit)


def test_rounds_pass_through_uncached_and_close_closes_inner():
    inner = Doubling()
    cache = Cached(inner, 4)
    x = np.ones(2, np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(cache.round(MODEL, "dev", None, {"x": x}, ["y"])["y"], x * 2)
    assert inner.rounds == 2 and len(cache) == 0
    cache.close()
    assert inner.closed


def test_arguments_are_checked():
    with pytest.raises(EdgeflowError, match="max_entries >= 1"):
        Cached(Doubling(), 0)


def test_threads_share_the_cache():
    inner = Doubling()
    cache = Cached(inner, 16)
    inputs = [np.full(4, k % 8, np.float32) for k in range(64)]
    answers = [None] * len(inputs)

    def work(k):
        answers[k] = run(cache, inputs[k])["y"]
    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for x, y in zip(inputs, answers):
        np.testing.assert_array_equal(y, x * 2)
    assert 8 <= inner.runs < 64 and len(cache) == 8


def test_a_server_with_cache_entries_answers_repeats_from_the_cache(model_dir):
    metrics = Recorder()
    with Server(models={"m": model_dir / "m.efl"}, cache_entries=8, metrics=metrics,
                memory_budget_bytes=1 << 30) as server, Client(server.address, timeout=30) as client:
        x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
        for _ in range(3):
            out = client.run("m", {"x": x}, ["y", "h"])
            np.testing.assert_allclose(out["y"], reference(x)["y"], rtol=1e-6)
            np.testing.assert_allclose(out["h"], reference(x)["h"], rtol=1e-6)
        other = x + 1
        np.testing.assert_allclose(client.run("m", {"x": other}, ["y"])["y"], reference(other)["y"], rtol=1e-6)
        assert metrics.lookups == [False, True, True, False]
        kept = budget_settles(server, "m")  # the hits gave back what they reserved
        assert server.budget.used == kept


def test_a_hit_reserves_its_outputs_like_a_run():
    budget = MemoryBudget(1 << 20)
    cache = Cached(Doubling(), 4)
    x = np.ones(100, np.float32)
    run(cache, x, encoding="fp16")
    with Reservation(budget, "m") as held:
        cache.run(MODEL, ["y"], {"x": x}, held, "fp16")
        assert held.nbytes == budget.used == 400 * 2  # the outputs and the encoding's copy
    assert budget.used == 0
