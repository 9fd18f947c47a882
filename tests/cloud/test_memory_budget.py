"""The server's memory budget (issue 16, finding 1): requests reserve what they will use
before allocating it, wait for memory or get RESOURCE_EXHAUSTED saying what they needed,
cached plans keep no per-request buffers, and the server's RSS stays within the budget
plus what it holds idle, whatever valid requests come."""
import os
import pathlib
import re
import subprocess
import threading
import time
from concurrent import futures

import numpy as np
import pytest

from .conftest import budget_settles, reference
from .test_serve_cli import Lines, edgeflow

import grpc  # noqa: F401  (declared: a broken install fails here)
from edgeflow.cloud import Client, Server  # noqa: E402
from edgeflow.cloud.budget import MemoryBudget, OverBudget, Reservation, heap_trimmer  # noqa: E402
from edgeflow.errors import RemoteError  # noqa: E402

MiB = 1 << 20
OUTSIDE_BUDGET_MIB = 16  # see test_server_rss_stays_within_the_budget


def test_budget_waits_for_memory_given_back():
    budget = MemoryBudget(100, wait_s=5)
    budget.take("a", 80, "first")
    threading.Timer(0.1, budget.give, ("a", 80)).start()
    start = time.monotonic()
    budget.take("b", 50, "second")  # waits for the first to give back
    assert 0.05 < time.monotonic() - start < 5 and budget.used == 50 and budget.by_model == {"a": 0, "b": 50}


def test_budget_refuses_what_never_fits_at_once_and_what_does_not_fit_in_time():
    budget = MemoryBudget(100, model_limit=60, wait_s=0.05)
    with pytest.raises(OverBudget, match=r"needs 61 bytes .* more than the server's budget"):
        budget.take("a", 61, "x", wait_s=60)  # over the model's limit: no wait
    with Reservation(budget, "a", wait_s=60) as held:
        held.add(40, "feed")
        with pytest.raises(OverBudget, match="besides the 40 it holds"):
            held.add(30, "plan")  # 70 > 60 per model, whatever the others give back
    assert budget.used == 0
    budget.take("b", 60, "y")
    with pytest.raises(OverBudget, match=r"needs 50 bytes of memory; 60 .* in use .*try again later"):
        budget.take("a", 50, "z")


def test_a_full_budget_calls_on_pressure_before_waiting_at_most_every_interval():
    calls = []
    budget = MemoryBudget(100, wait_s=0.01, on_pressure=lambda: calls.append(budget.used))
    budget.take("a", 60, "fits")
    assert calls == []  # it fit: no pressure
    with pytest.raises(OverBudget):
        budget.take("a", 50, "waits")
    with pytest.raises(OverBudget):
        budget.take("a", 50, "waits again at once")
    assert calls == [60]  # once in RELIEVE_EVERY_S
    time.sleep(0.06)
    budget.give("a", 60)
    budget.take("a", 50, "fits again")
    with pytest.raises(OverBudget):
        budget.take("a", 60, "waits, later")
    assert calls == [60, 50]


def test_heap_trimmer_gives_freed_heap_pages_back():
    """40 MiB of 4 KiB blocks freed below one that stays: glibc keeps the pages (not at the
    heap's top) until trimmed. Threads of its own: a fresh heap, not pytest's."""
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    rss = {}

    def run():
        blocks = [libc.malloc(4096) for _ in range(10240)]
        for b in blocks:
            ctypes.memset(b, 1, 4096)
        keep = libc.malloc(4096)
        for b in blocks:
            libc.free(b)
        rss["freed"] = _memory(os.getpid())["VmRSS"]
        heap_trimmer()()
        rss["trimmed"] = _memory(os.getpid())["VmRSS"]
        libc.free(keep)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert rss["freed"] - rss["trimmed"] > 30 * MiB, rss


@pytest.fixture
def small_server(model_dir):
    with Server(model_dir, memory_budget_bytes=24 * MiB, memory_wait_s=1) as s:
        yield s


def test_a_request_over_the_budget_is_refused_and_the_server_keeps_serving(small_server):
    with Client(f"127.0.0.1:{small_server.port}", timeout=30) as client:
        big = np.ones((1 << 20, 4), np.float32)  # 16 MiB fed; with its plan and outputs over 24 MiB
        with pytest.raises(RemoteError, match=r"RESOURCE_EXHAUSTED: model 'm': running these inputs "
                                              r"\(arena and scratch \d+ bytes, outputs \d+ bytes\) needs \d+ "
                                              r"bytes of memory besides the \d+ it holds, more than the "
                                              r"server's budget \(budget 25165824 bytes"):
            client.run("m", {"x": big}, ["y", "double"])
        x = np.random.default_rng(0).standard_normal((1000, 4), dtype=np.float32)
        out = client.run("m", {"x": x}, ["y"])
        np.testing.assert_allclose(out["y"], reference(x)["y"], rtol=1e-5)
    kept = budget_settles(small_server, "m")  # what cached interpreters keep
    assert small_server.budget.used == small_server.budget.by_model["m"] == kept


def test_cached_plans_keep_no_arena_pages(small_server):
    """After a request, the plan stays cached (bound kernels) but its arena's pages are
    given back: a read sees zeros, not the last request's values."""
    with Client(f"127.0.0.1:{small_server.port}", timeout=30) as client:
        x = np.full((50000, 4), 3.0, np.float32)  # an arena of several MiB: its own mapping
        np.testing.assert_array_equal(client.run("m", {"x": x}, ["double"])["double"], x * 2)
    model = small_server.models["m"]
    plans = [p for interp in model._charged for p in interp._plans.values()
             if p.arena.nbytes >= 1 << 20]
    assert plans and all(not p.arena._block.any() for p in plans)


@pytest.mark.slow
def test_server_rss_stays_within_the_budget(model_dir):
    """1,000 requests of random sizes and fetches from 32 threads against `edgeflow serve`
    with a 96 MiB budget: each is answered right or refused with RESOURCE_EXHAUSTED, and
    the server's peak RSS stays within the budget plus its RSS loaded and idle, plus
    OUTSIDE_BUDGET_MIB: what gRPC and the allocator hold beside the reservations (calls
    queued for a worker, with their flow-control buffers; freed heap pages between trims).
    Measured: 60-99 MiB above idle (without the budget, requests of up to 16 MiB from 32
    threads would take several hundred)."""
    budget_mb = 96
    proc = subprocess.Popen(edgeflow("serve", "--model-dir", model_dir, "--port", 0, "--max-workers", 8,
                                     "--memory-budget-mb", budget_mb, "--memory-wait", 2),
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        port = Lines(proc.stderr).wait_for(r"serving \d+ models on 127\.0\.0\.1:(\d+)").group(1)
        with Client(f"127.0.0.1:{port}", timeout=120) as client:
            def warm(rows):  # 1 MiB of x: chunks the size of the largest; 1 KiB: one message
                x = np.ones((rows, 4), np.float32)
                client.run("m", {"x": x, "idx": np.zeros(rows, np.int32)}, ["y", "double", "picked"])
            with futures.ThreadPoolExecutor(32) as pool:  # every thread, buffer and malloc arena made
                list(pool.map(warm, [1 << 16, 1 << 6] * 64))
            idle = _memory(proc.pid)["VmRSS"]  # the fixed overhead: models loaded, idle
            rng = np.random.default_rng(16)
            # Log-uniform rows up to 2**20 (16 MiB of x): most small, the largest can never fit.
            rows = np.exp(rng.uniform(0, np.log(1 << 20), 1000)).astype(int)
            fetch_sets = [["y"], ["double"], ["y", "double"], ["y", "picked"]]
            cases = [(int(n), fetch_sets[k], rng.choice(["none", "fp16"]), seed)
                     for seed, (n, k) in enumerate(zip(rows, rng.integers(0, 4, 1000)))]

            def one(case):
                n, fetches, compression, seed = case
                r = np.random.default_rng(seed)
                x = r.standard_normal((n, 4), dtype=np.float32)
                feeds = {"x": x}
                if "picked" in fetches:
                    feeds["idx"] = r.integers(0, 5, n).astype(np.int32)
                try:
                    out = client.run("m", feeds, fetches, compression=compression)
                except RemoteError as e:
                    assert "RESOURCE_EXHAUSTED" in str(e), e
                    # Too large for the budget at any time, or still not fitting when the wait ended.
                    return "never fits" if "more than the server's budget" in str(e) else "busy"
                sent = x.astype(np.float16).astype(np.float32) if compression == "fp16" else x
                want = reference(sent, feeds.get("idx"))
                for name in fetches:  # fp16 rounds the outputs too: 2**-11 relative
                    rtol, atol = (1e-3, 1e-4) if compression == "fp16" else (1e-5, 1e-6)
                    np.testing.assert_allclose(out[name], want[name], rtol=rtol, atol=atol)
                return "answered"

            with futures.ThreadPoolExecutor(32) as pool:
                outcomes = list(pool.map(one, cases))
        peak = _memory(proc.pid)["VmHWM"]
    finally:
        proc.terminate()
        proc.wait(30)
    counts = {k: outcomes.count(k) for k in ("answered", "never fits", "busy")}
    print(f"peak RSS {peak >> 20} MiB, idle {idle >> 20} MiB, budget {budget_mb} MiB, {counts}")
    # A few requests can never fit (6-7 of the seed's). How many others still wait when
    # --memory-wait ends depends on the machine's speed: 84-101 of 1,000 on this 2-core VM
    # (answered 899-909, against a bound of 900 before, which a CI run missed by one).
    assert counts["never fits"] > 0 and counts["busy"] > 0 and counts["answered"] > 800, counts
    assert peak <= idle + (budget_mb + OUTSIDE_BUDGET_MIB) * MiB, f"peak RSS {peak >> 20} MiB, idle {idle >> 20} MiB"


def _memory(pid):
    """{"VmRSS": bytes, "VmHWM": bytes} of process `pid`."""
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    return {k: int(re.search(rf"{k}:\s+(\d+) kB", status).group(1)) << 10 for k in ("VmRSS", "VmHWM")}
