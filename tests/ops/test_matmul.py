"""matmul: 1-D, 2-D, batched and broadcast operands, transpose flags, against np.matmul."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import edgeflow as ef
from edgeflow.errors import GraphError, InvalidInputError

from .harness import FLOATS, INTS, assert_close, random_array, run_op as run_in_memory

# (a shape, b shape) as numpy's matmul sees them, i.e. before any transpose flag.
SHAPES = [
    ((3,), (3,)),  # dot product: a scalar
    ((3,), (3, 4)),  # vector @ matrix
    ((2, 3), (3,)),  # matrix @ vector
    ((2, 3), (3, 4)),
    ((1, 1), (1, 1)),
    ((5, 2, 3), (3, 4)),  # batch on one side
    ((6, 1, 3), (3, 4)),  # sequence-first rows of one: run as one (6, 3) @ (3, 4) product
    ((2, 3, 1, 3), (3, 5)),
    ((2, 3), (5, 3, 4)),
    ((5, 2, 3), (5, 3, 4)),
    ((5, 1, 2, 3), (4, 3, 2)),  # batch dims broadcast: (5, 4)
    ((3,), (2, 3, 4)),  # 1-D against a batch
    ((2, 2, 3), (3,)),
]


def swap(x, flag):
    return np.swapaxes(x, -1, -2) if flag and x.ndim >= 2 else x


def expected_product(a, b):
    """Sum over the shared axis, written with einsum-free broadcasting (float64 / int64)."""
    wide = np.float64 if a.dtype.kind == "f" else np.int64
    a2 = a.astype(wide)[None, :] if a.ndim == 1 else a.astype(wide)
    b2 = b.astype(wide)[:, None] if b.ndim == 1 else b.astype(wide)
    out = (a2[..., :, :, None] * b2[..., None, :, :]).sum(axis=-2)
    if a.ndim == 1:
        out = out[..., 0, :]
    if b.ndim == 1:
        out = out[..., 0]
    return out


def test_reference_agrees_with_numpy():
    rng = np.random.default_rng(0)
    for sa, sb in SHAPES:
        a, b = rng.normal(size=sa), rng.normal(size=sb)
        np.testing.assert_allclose(expected_product(a, b), np.matmul(a, b), rtol=1e-12)


@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("shape_a,shape_b", SHAPES, ids=str)
def test_matmul_shapes_and_flags(run_op, rng, shape_a, shape_b, transpose_a, transpose_b):
    a = random_array(rng, shape_a, "float32", -2, 2)
    b = random_array(rng, shape_b, "float32", -2, 2)
    # Feed the operands pre-transposed so that the flags undo it.
    out = run_op(lambda x, y: ef.matmul(x, y, transpose_a=transpose_a, transpose_b=transpose_b),
                 swap(a, transpose_a), swap(b, transpose_b))
    assert_close(out, expected_product(a, b), np.float32, rtol=1e-5, atol=1e-5)
    assert_close(out, np.matmul(a.astype(np.float64), b.astype(np.float64)), np.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_matmul_dtypes(run_op, rng, dtype):
    a = random_array(rng, (3, 2, 5), dtype, -4, 4)
    b = random_array(rng, (5, 4), dtype, -4, 4)
    tol = 1e-2 if dtype == "float16" else None
    assert_close(run_op(ef.matmul, a, b), expected_product(a, b), dtype, rtol=tol, atol=tol)


def test_matmul_operator(run_op, rng):
    a = random_array(rng, (2, 3), "float32")
    b = random_array(rng, (3, 2), "float32")
    assert_close(run_op(lambda x, y: x @ y, a, b), expected_product(a, b), np.float32)
    assert_close(run_op(lambda x: b.T @ x, a.T), expected_product(b.T, a.T), np.float32)  # __rmatmul__


def test_matmul_with_constant_weights_and_dynamic_batch(compile_graph, graph, rng):
    w = random_array(rng, (3, 4), "float32")
    x = ef.placeholder("float32", (None, 3), name="x")
    y = ef.matmul(x, ef.constant(w))
    yt = ef.matmul(ef.constant(w), x, transpose_a=True, transpose_b=True)
    assert y.shape == (None, 4) and yt.shape == (4, None)
    run = compile_graph(graph, {"x": x}, {"y": y, "yt": yt})
    for batch in (1, 3, 7):
        xv = random_array(rng, (batch, 3), "float32")
        out = run(x=xv)
        assert_close(out["y"], expected_product(xv, w), np.float32)
        assert_close(out["yt"], expected_product(w.T, xv.T), np.float32)


def test_matmul_dynamic_batch_dims(run_op, rng):
    a = random_array(rng, (6, 2, 3), "float32")
    b = random_array(rng, (3, 5), "float32")
    out = run_op(ef.matmul, a, b, shapes=[(None, None, 3), (None, None)])
    assert_close(out, expected_product(a, b), np.float32)


@given(batch_a=st.lists(st.integers(1, 3), max_size=2), batch_b=st.lists(st.integers(1, 3), max_size=2),
       m=st.integers(1, 4), k=st.integers(1, 4), n=st.integers(1, 4), flags=st.tuples(st.booleans(), st.booleans()),
       seed=st.integers(0, 2**32 - 1))
def test_matmul_random_batches(batch_a, batch_b, m, k, n, flags, seed):
    # Batch dims that are equal or 1 broadcast; make them so, aligned from the right.
    width = min(len(batch_a), len(batch_b))
    for i in range(1, width + 1):
        if batch_a[-i] != batch_b[-i] and 1 not in (batch_a[-i], batch_b[-i]):
            batch_b[-i] = 1
    rng = np.random.default_rng(seed)
    a = random_array(rng, (*batch_a, m, k), "float32", -2, 2)
    b = random_array(rng, (*batch_b, k, n), "float32", -2, 2)
    out = run_in_memory(lambda x, y: ef.matmul(x, y, *flags), swap(a, flags[0]), swap(b, flags[1]))
    assert_close(out, expected_product(a, b), np.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape_a,shape_b,flags", [
    ((2, 3), (4, 5), (False, False)),  # inner dims differ
    ((3,), (4,), (False, False)),
    ((2, 3), (3, 4), (True, False)),  # a^T is (3, 2)
    ((2, 3), (3, 4), (False, True)),  # b^T is (4, 3)
    ((2, 2, 3), (3, 3, 4), (False, False)),  # batch dims 2 and 3 do not broadcast
    ((), (3,), (False, False)),  # rank 0
    ((3,), (), (False, False)),
])
def test_matmul_shape_errors(graph, shape_a, shape_b, flags):
    a, b = ef.placeholder("float32", shape_a), ef.placeholder("float32", shape_b)
    with pytest.raises(GraphError):
        ef.matmul(a, b, *flags)


def test_matmul_dtype_errors(graph):
    with pytest.raises(GraphError, match="dtype"):
        ef.matmul(ef.placeholder("float32", (2, 3)), ef.placeholder("float64", (3, 2)))
    with pytest.raises(GraphError):
        ef.matmul(ef.placeholder("bool", (2, 3)), ef.placeholder("bool", (3, 2)))


def test_matmul_inner_dim_mismatch_at_run_time(compile_graph, graph):
    x = ef.placeholder("float32", (2, None), name="x")
    y = ef.matmul(x, ef.constant(np.ones((3, 2), np.float32)))
    run = compile_graph(graph, {"x": x}, {"y": y})
    assert_close(run(x=np.ones((2, 3), np.float32))["y"], np.full((2, 2), 3.0), np.float32)
    with pytest.raises(InvalidInputError):
        run(x=np.ones((2, 4), np.float32))
