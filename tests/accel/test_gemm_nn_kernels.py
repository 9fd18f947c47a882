"""OpenCL matmul, normalizing, reduction and data-movement kernels against the numpy
kernels: each op in a one-op model, run with and without the OpenCL delegate."""
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import edgeflow as ef
import edgeflow.accel
from edgeflow.format.writer import to_bytes
from edgeflow.graph.math_ops import apply

from .harness import randn, run_both

from edgeflow.accel.kernels import gemm

dims = st.sampled_from([1, 2, 3, 7, 16, 33, 65])
small = st.integers(1, 5)


@pytest.fixture(scope="module")
def delegate():
    return edgeflow.accel.OpenCLDelegate()


# -- matmul ------------------------------------------------------------------------------

@given(m=dims, n=dims, k=dims, ta=st.booleans(), tb=st.booleans(),
       act=st.sampled_from(["", "relu", "relu6", "swish", "hard_swish"]), cpu=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_matmul_2d(delegate, m, n, k, ta, tb, act, cpu, seed):
    """Both kernels whatever the device: local-memory tiles (GPUs) and register blocks (CPUs)."""
    rng = np.random.default_rng(seed)
    a = randn(rng, (k, m) if ta else (m, k))
    b = randn(rng, (n, k) if tb else (k, n))
    with mock.patch.object(gemm, "CPU_PATH", cpu):
        want, got, _ = run_both(delegate, "matmul", [a, b], {"transpose_a": ta, "transpose_b": tb, "activation": act})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@given(batch_a=st.lists(st.sampled_from([1, 2, 3]), max_size=2), batch_b=st.lists(st.sampled_from([1, 2, 3]), max_size=2),
       m=small, n=small, k=dims, ta=st.booleans(), tb=st.booleans(), cpu=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_matmul_batched_broadcast(delegate, batch_a, batch_b, m, n, k, ta, tb, cpu, seed):
    rng = np.random.default_rng(seed)
    batch_b = [d if i >= len(batch_a) or batch_a[-1 - i] == 1 or d == 1 else batch_a[-1 - i]
               for i, d in enumerate(batch_b[::-1])][::-1]
    a = randn(rng, tuple(batch_a) + ((k, m) if ta else (m, k)))
    b = randn(rng, tuple(batch_b) + ((n, k) if tb else (k, n)))
    with mock.patch.object(gemm, "CPU_PATH", cpu):
        want, got, _ = run_both(delegate, "matmul", [a, b], {"transpose_a": ta, "transpose_b": tb})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("sa,sb", [((33,), (33, 7)), ((2, 5, 9), (9,)), ((65,), (65,)), ((1, 1), (1, 1))])
def test_matmul_rank1_and_tiny(delegate, sa, sb):
    rng = np.random.default_rng(0)
    want, got, _ = run_both(delegate, "matmul", [randn(rng, sa), randn(rng, sb)])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_matmul_larger_than_a_tile(delegate):
    rng = np.random.default_rng(1)
    a, b = randn(rng, (130, 257)), randn(rng, (257, 129))
    want, got, _ = run_both(delegate, "matmul", [a, b])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


# -- softmax, layer_norm, reductions ------------------------------------------------------

shapes = st.lists(st.sampled_from([1, 2, 3, 5, 17, 300]), min_size=1, max_size=4).filter(
    lambda s: np.prod(s) <= 20000)


@given(shape=shapes, data=st.data(), log=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_softmax(delegate, shape, data, log, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = randn(np.random.default_rng(seed), shape) * 10 + 50  # large values: needs the max subtracted
    want, got, _ = run_both(delegate, "log_softmax" if log else "softmax", [x], {"axis": axis})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@given(shape=shapes, data=st.data(), with_bias=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_layer_norm(delegate, shape, data, with_bias, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    normalized = shape[axis:]
    cut = data.draw(st.integers(0, len(normalized)))  # scale/bias broadcast over a suffix
    param_shape = tuple(d if data.draw(st.booleans()) else 1 for d in normalized[cut:])
    rng = np.random.default_rng(seed)
    ins = [randn(rng, shape) * 3 + 1, randn(rng, param_shape)] + ([randn(rng, param_shape)] if with_bias else [])
    want, got, _ = run_both(delegate, "layer_norm", ins, {"axis": axis, "epsilon": 1e-5})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@given(op=st.sampled_from(["reduce_sum", "reduce_mean", "reduce_max"]), shape=shapes, data=st.data(),
       keepdims=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_reductions(delegate, op, shape, data, keepdims, seed):
    axes = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)))
    axes = [a - len(shape) if data.draw(st.booleans()) else a for a in axes]
    x = randn(np.random.default_rng(seed), shape)
    want, got, _ = run_both(delegate, op, [x], {"axes": tuple(axes), "keepdims": keepdims})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


# -- data movement ------------------------------------------------------------------------

@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=5), data=st.data(),
       dtype=st.sampled_from([np.float32, np.int32]), seed=st.integers(0, 2 ** 16))
def test_transpose(delegate, shape, data, dtype, seed):
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    x = (randn(np.random.default_rng(seed), shape) * 100).astype(dtype)
    want, got, _ = run_both(delegate, "transpose", [x], {"perm": perm})
    np.testing.assert_array_equal(got, want)


@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=4), data=st.data(), seed=st.integers(0, 2 ** 16))
def test_slice(delegate, shape, data, seed):
    axes = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, min_size=1, max_size=len(shape)))
    bound = st.integers(-9, 9)
    starts = [data.draw(bound) for _ in axes]
    ends = [data.draw(bound) for _ in axes]
    steps = [data.draw(st.sampled_from([1, 2, 3, -1, -2])) for _ in axes]
    x = randn(np.random.default_rng(seed), shape)
    want, got, _ = run_both(delegate, "slice", [x], {"starts": tuple(starts), "ends": tuple(ends),
                                                      "axes": tuple(axes), "steps": tuple(steps)})
    np.testing.assert_array_equal(got, want)


@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data(),
       dtype=st.sampled_from([np.float32, np.int32]), seed=st.integers(0, 2 ** 16))
def test_concat(delegate, shape, data, dtype, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    rng = np.random.default_rng(seed)
    parts = []
    for s in sizes:
        part_shape = list(shape)
        part_shape[axis] = s
        parts.append((randn(rng, part_shape) * 100).astype(dtype))
    want, got, _ = run_both(delegate, "concat", parts, {"axis": axis})
    np.testing.assert_array_equal(got, want)


@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), data=st.data(),
       index_dtype=st.sampled_from([np.int32, np.int64]), seed=st.integers(0, 2 ** 16))
def test_gather(delegate, shape, data, index_dtype, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[axis]
    index_shape = data.draw(st.lists(st.integers(1, 4), max_size=2))
    rng = np.random.default_rng(seed)
    indices = rng.integers(-n, n, size=index_shape).astype(index_dtype)
    want, got, _ = run_both(delegate, "gather", [randn(rng, shape), indices], {"axis": axis})
    np.testing.assert_array_equal(got, want)


def test_gather_out_of_range_gives_nan_on_the_device(delegate):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, (4, 2), name="x")
        i = ef.placeholder(ef.int32, (3,), name="i")
        y = apply("gather", [x, i], {"axis": 0})
    model = to_bytes(ef.to_model(g, {"infer": ({"x": x, "i": i}, {"y": y})}))
    runner = ef.Interpreter(model, delegates=[delegate]).get_signature_runner("infer")
    got = runner(x=np.arange(8, dtype=np.float32).reshape(4, 2), i=np.array([1, 4, -1], np.int32))["y"]
    np.testing.assert_array_equal(got[[0, 2]], [[2, 3], [6, 7]])
    assert np.isnan(got[1]).all()


@given(shapes3=st.lists(st.lists(st.sampled_from([1, 3, 4]), min_size=0, max_size=3), min_size=3, max_size=3),
       seed=st.integers(0, 2 ** 16))
def test_where(delegate, shapes3, seed):
    rank = max(len(s) for s in shapes3)
    full = [max([s[-1 - i] for s in shapes3 if i < len(s)], default=1) for i in range(rank)][::-1]
    shapes3 = [[d if d == 1 else full[rank - len(s) + j] for j, d in enumerate(s)] for s in shapes3]
    rng = np.random.default_rng(seed)
    cond = rng.random(shapes3[0]) < 0.5
    want, got, plan = run_both(delegate, "where", [cond, randn(rng, shapes3[1]), randn(rng, shapes3[2])],
                               on_device=False)
    np.testing.assert_array_equal(got, want)
    assert set(plan.placement.values()) == {"opencl"}


@pytest.mark.parametrize("src,dst", [(np.float32, np.int32), (np.int32, np.float32), (np.int32, np.int32)])
def test_cast(delegate, src, dst):
    x = (np.random.default_rng(0).standard_normal(37) * 100).astype(src)
    want, got, _ = run_both(delegate, "cast", [x], {"dtype": np.dtype(dst)})
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_bool_to_float_cast(delegate):
    x = np.random.default_rng(1).standard_normal(41) > 0
    want, got, _ = run_both(delegate, "cast", [x], {"dtype": np.dtype(np.float32)})
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_a_chain_stays_on_the_device(delegate):
    """matmul -> softmax -> reduce_max -> concat: one partition, right numbers."""
    rng = np.random.default_rng(3)
    a, b = randn(rng, (7, 33)), randn(rng, (33, 5))
    g = ef.Graph()
    with g.as_default():
        pa, pb = ef.placeholder(ef.float32, a.shape, name="a"), ef.placeholder(ef.float32, b.shape, name="b")
        h = apply("softmax", [apply("matmul", [pa, pb], {"activation": "relu"})], {"axis": 0})
        y = apply("concat", [h, apply("reduce_max", [h], {"axes": (0,), "keepdims": True})], {"axis": 0})
    model = to_bytes(ef.to_model(g, {"infer": ({"a": pa, "b": pb}, {"y": y})}))
    want = ef.Interpreter(model).get_signature_runner("infer")(a=a, b=b)["y"]
    runner = ef.Interpreter(model, delegates=[delegate]).get_signature_runner("infer")
    got = runner(a=a, b=b)["y"]
    assert runner.last_plan.partitions == 1 and not runner.last_plan.fallbacks
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
