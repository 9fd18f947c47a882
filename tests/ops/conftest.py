"""Fixtures of the per-op tests (helpers live in harness.py)."""
import zlib

import numpy as np
import pytest

import edgeflow as ef

from . import harness


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """One directory for the session's `.efl` files (session scope: usable under hypothesis)."""
    return tmp_path_factory.mktemp("ops_models")


@pytest.fixture(scope="session")
def run_op(model_dir):
    """harness.run_op, packaging each graph as a file in `model_dir`."""
    def run(fn, *arrays, shapes=None):
        return harness.run_op(fn, *arrays, shapes=shapes, directory=model_dir)
    return run


@pytest.fixture(scope="session")
def compile_graph(model_dir):
    """harness.compile_graph, packaging each graph as a file in `model_dir`."""
    def compile_(graph, inputs, outputs):
        return harness.compile_graph(graph, inputs, outputs, directory=model_dir)
    return compile_


@pytest.fixture
def graph():
    """A fresh graph, the default while the test runs."""
    g = ef.Graph()
    with g.as_default():
        yield g


@pytest.fixture
def rng(request):
    """A generator seeded by the test's name: reproducible, different per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
