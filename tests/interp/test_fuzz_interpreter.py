"""Damaged models, run: every signature of every mutant that loads is called, under a
memory bound, and the only outcomes are a clean run, FormatError, InvalidInputError or
UnsupportedOpError (a valid file asking for an op this interpreter cannot run: one with
no numpy kernel, or one that needs the cloud delegate).

Mutants (tests/interp/fuzzing.py): byte flips, truncations, FlatBuffer words set to edge
values, overwrites, and fields of the model changed and written back (dimensions,
attributes, constants' elements, wiring, opcodes, signatures), of seed models that
exercise the ops sizing outputs from attributes and values, control flow and a train
step. Each interpreter has max_tensor_bytes=64 MiB; the process's address space is
capped at its size plus 1 GiB while the mutants run, so an allocation the bound misses
is a MemoryError (a failure), not a machine out of memory.

The default run takes 300 mutants; the slow tests (CI) 6,000 of the seeds and 1,000 of
models converted from tests/data/onnx (a CNN, a quantized CNN, GRU, LSTM, attention),
about 40 s on one core; HYPOTHESIS_PROFILE=fuzz runs 100,000 of each (`-s` prints the
counts by outcome, EDGEFLOW_FUZZ_COUNTS=path.json keeps them):
    HYPOTHESIS_PROFILE=fuzz python -m pytest tests/interp/test_fuzz_interpreter.py --run-slow -s
"""
import collections
import contextlib
import json
import os
import pathlib
import resource
import signal
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import edgeflow as ef
from edgeflow.errors import InvalidInputError

from . import fuzzing

COUNTS = collections.Counter()
PER_MUTANT_SECONDS = 30  # a mutant running longer hangs: a failure


@pytest.fixture(scope="module")
def seeds():
    return fuzzing.seeds()


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if COUNTS:
        total = sum(v for k, v in COUNTS.items() if k != "unwritable")
        print(f"\nmutants run through the interpreter: {total}; by outcome: {dict(COUNTS.most_common())}")


@contextlib.contextmanager
def memory_cap(extra=2**30):
    """Address space capped at what the process maps now plus `extra` (Linux only)."""
    try:
        with open("/proc/self/status") as f:
            mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped + extra if hard == resource.RLIM_INFINITY else min(mapped + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _timeout(signum, frame):
    raise TimeoutError(f"a mutant ran for more than {PER_MUTANT_SECONDS} s")


def run_mutant(seeds, index, kind, rng_seed):
    name, data = seeds[index]
    mutant = fuzzing.mutate(data, kind, np.random.default_rng(rng_seed))
    if mutant is None:  # a field change the writer refused
        COUNTS["unwritable"] += 1
        _progress()
        return
    previous = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(PER_MUTANT_SECONDS)
    try:
        with memory_cap():
            COUNTS[fuzzing.run_everything(mutant)] += 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        _progress()


def _progress():
    """Every 5,000 mutants, the counts so far (seen with -s), and in the JSON file
    EDGEFLOW_FUZZ_COUNTS names, if set: a long run's record even if it is cut short."""
    total = sum(COUNTS.values())
    if total % 5000 == 0:
        print(f"\n{total} mutants: {dict(COUNTS.most_common())}", flush=True)
        path = os.environ.get("EDGEFLOW_FUZZ_COUNTS")
        if path:
            with open(path, "w") as f:
                json.dump({"mutants": total, "outcomes": dict(COUNTS), "time": time.time()}, f)


def mutants(count):
    """A test running `count` mutants (the fuzz profile: 100,000)."""
    if settings._current_profile == "fuzz":
        count = max(count, 100_000)
    return settings(max_examples=count, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


MUTANT = dict(index=st.integers(0, 3), kind=st.sampled_from(fuzzing.KINDS), rng_seed=st.integers(0, 2**32 - 1))


@mutants(300)
@given(**MUTANT)
def test_mutants_run_cleanly_or_raise_typed_errors(seeds, index, kind, rng_seed):
    run_mutant(seeds, index, kind, rng_seed)


@pytest.mark.slow
@mutants(6000)
@given(**MUTANT)
def test_many_mutants_run_cleanly_or_raise_typed_errors(seeds, index, kind, rng_seed):
    run_mutant(seeds, index, kind, rng_seed)


@pytest.fixture(scope="module")
def converted():
    return fuzzing.converted_seeds(pathlib.Path(__file__).parents[1] / "data" / "onnx")


@pytest.mark.slow
@mutants(1000)
@given(index=st.integers(0, len(fuzzing.CONVERTED) - 1), kind=st.sampled_from(fuzzing.KINDS),
       rng_seed=st.integers(0, 2**32 - 1))
def test_mutants_of_converted_models(converted, index, kind, rng_seed):
    run_mutant(converted, index, kind, rng_seed)


def test_the_seeds_run():
    for name, data in fuzzing.seeds():
        assert fuzzing.run_everything(data) == "ran", name


# Mutants the fuzzer found, each a raw exception before its fix.
def test_resize_scales_of_nan_are_refused():
    # main: ValueError "cannot convert float NaN to integer" (shape inference)
    model = fuzzing.reader.load(dict(fuzzing.seeds())["shapes"])
    resize = next(op for op in model.subgraphs[0].operators if op.opcode == "resize")
    resize.attrs["scales"] = (1.0, 1.0, float("nan"), 2.0)
    runner = ef.Interpreter(fuzzing.writer.to_bytes(model)).get_signature_runner("infer")
    with pytest.raises(InvalidInputError, match=r"\(resize\) rejects.*scales must be positive and finite"):
        runner(x=np.ones((2, 4), np.float32))
