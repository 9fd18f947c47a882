"""MediaPipe's landmark ops (edgeflow/ops/geometry.py) against its kernels written again as
plain loops (mediapipe_reference.py), and closed forms."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import edgeflow as ef
from edgeflow.errors import GraphError
from edgeflow.graph.math_ops import apply

from . import mediapipe_reference as ref
from .harness import assert_close, run_op


def _matrices(rng, n, spread):
    """(n, 4, 4) crop matrices: a turn, a scale and a shift, MediaPipe's shape of matrix."""
    m = np.zeros((n, 4, 4), np.float32)
    for k in range(n):
        a, s = rng.uniform(-math.pi, math.pi), rng.uniform(0.3, 1.8)
        m[k, :2, :2] = s * np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
        m[k, :2, 3] = rng.uniform(-spread, spread, 2)
        m[k, 2, 2] = m[k, 3, 3] = 1
    return m


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 31), n=st.integers(1, 3), landmarks=st.integers(3, 40),
       rotation=st.sampled_from([0.0, 0.7, -2.0]), dims=st.sampled_from([2, 3]))
def test_landmarks_to_transform_matrix(seed, n, landmarks, rotation, dims):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-50, 200, (n, landmarks, dims)).astype(np.float32)
    left, right = rng.choice(landmarks, 2, replace=False)
    subset = tuple(int(i) for i in rng.choice(landmarks, rng.integers(1, landmarks + 1)))
    attrs = {"left": int(left), "right": int(right), "subset": subset, "output_size": (16, 24),
             "scale": (1.5, 1.25), "target_rotation": rotation}
    got = run_op(lambda t: apply("landmarks_to_transform_matrix", [t], attrs), x)
    want = np.stack([ref.landmarks_to_transform_matrix(x[k], int(left), int(right), subset, (16, 24), (1.5, 1.25),
                                                       rotation) for k in range(n)])
    assert_close(got, want, np.float32, rtol=1e-5, atol=1e-4)


def test_landmarks_to_transform_matrix_levels_the_pair():
    """The crop's own x axis runs from landmark `left` to `right`: mapped back, the crop's
    horizontal direction is theirs, and its size is the subset's box times the scale."""
    x = np.array([[[10, 10, 0], [30, 30, 0], [20, 0, 0], [20, 40, 0]]], np.float32)  # a square turned 45 degrees
    attrs = {"left": 0, "right": 1, "subset": (0, 1, 2, 3), "output_size": (8, 8), "scale": (1.0, 1.0)}
    m = run_op(lambda t: apply("landmarks_to_transform_matrix", [t], attrs), x)[0]
    direction = m[:2, :2] @ np.array([1.0, 0.0])
    assert np.allclose(direction / np.linalg.norm(direction), [math.sqrt(0.5)] * 2, atol=1e-6)
    corners = [m @ np.array([u, v, 0, 1]) for u, v in ((0, 0), (8, 0), (0, 8), (8, 8))]
    side = np.linalg.norm(corners[1][:2] - corners[0][:2])
    assert side == pytest.approx(20 * math.sqrt(2), rel=1e-5)  # the turned square's side
    assert np.allclose(np.mean(corners, axis=0)[:2], [20, 20], atol=1e-4)  # centred on the subset


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("matrix_batch", [1, 3])
def test_transform_landmarks(rng, dims, matrix_batch):
    x = rng.uniform(-10, 30, (3, 17, dims)).astype(np.float32)
    m = _matrices(rng, matrix_batch, 20)
    m[:, 0, 2] = m[:, 1, 2] = 5.0  # z's column: MediaPipe multiplies it by 0
    got = run_op(lambda a, b: apply("transform_landmarks", [a, b]), x, m)
    want = np.stack([ref.transform_landmarks(x[k], m[k % matrix_batch]) for k in range(3)])
    assert_close(got, want, np.float32, rtol=1e-5, atol=1e-5)
    if dims == 3:
        assert np.array_equal(got[:, :, 2], x[:, :, 2])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 31), n=st.integers(1, 2), channels=st.integers(1, 5), height=st.integers(1, 9),
       width=st.integers(1, 9), out=st.tuples(st.integers(1, 7), st.integers(1, 7)), half_pixel=st.booleans(),
       shared=st.booleans())
def test_transform_tensor_bilinear(seed, n, channels, height, width, out, half_pixel, shared):
    """Random crops, partly outside the map (zeros there), against the per-pixel loop."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, channels, height, width)).astype(np.float32)
    m = _matrices(rng, 1 if shared else n, max(height, width))
    attrs = {"output_size": out, "half_pixel": half_pixel}
    got = run_op(lambda a, b: apply("transform_tensor_bilinear", [a, b], attrs), x, m)
    want = np.stack([ref.transform_tensor_bilinear(x[k].transpose(1, 2, 0), m[0 if shared else k], out, half_pixel)
                     .transpose(2, 0, 1) for k in range(n)])
    assert_close(got, want, np.float32, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("half_pixel", [False, True])
def test_transform_tensor_bilinear_identity_and_edges(rng, half_pixel):
    """The identity crops x itself; a shift by whole pixels crops it shifted, zeros past the
    last row and column (a position past W - 1 is outside, W - 1 itself is inside)."""
    x = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
    eye = np.eye(4, dtype=np.float32)[None]
    crop = run_op(lambda a, b: apply("transform_tensor_bilinear", [a, b], {"output_size": (4, 6),
                                                                         "half_pixel": half_pixel}), x, eye)
    assert np.allclose(crop, x[:, :, :4, :], atol=1e-6)
    shift = eye.copy()
    shift[0, 0, 3], shift[0, 1, 3] = 2.0, 1.0
    moved = run_op(lambda a, b: apply("transform_tensor_bilinear", [a, b], {"output_size": (5, 6),
                                                                          "half_pixel": half_pixel}), x, shift)
    assert np.allclose(moved[:, :, :4, :4], x[:, :, 1:, 2:], atol=1e-6)
    assert not moved[:, :, 4:, :].any() and not moved[:, :, :, 4:].any()


@pytest.mark.parametrize("op, shapes, attrs, message", [
    ("landmarks_to_transform_matrix", [(1, 5, 1)], {"left": 0, "right": 1, "subset": (2,), "output_size": (4, 4)},
     "D >= 2"),
    ("landmarks_to_transform_matrix", [(1, 5, 3)], {"left": 0, "right": 7, "subset": (2,), "output_size": (4, 4)},
     r"indices \[7\]"),
    ("landmarks_to_transform_matrix", [(1, 5, 3)], {"left": 0, "right": 1, "subset": (), "output_size": (4, 4)},
     "subset is empty"),
    ("landmarks_to_transform_matrix", [(1, 5, 3)], {"left": 0, "right": 1, "subset": (2,), "output_size": (0, 4)},
     "positive"),
    ("transform_landmarks", [(1, 5, 4), (1, 4, 4)], {}, r"\(N, L, 2\)"),
    ("transform_landmarks", [(2, 5, 3), (3, 4, 4)], {}, "batch of 1 or 2"),
    ("transform_tensor_bilinear", [(1, 2, 4, 4), (1, 3, 4)], {"output_size": (2, 2)}, r"\(N, 4, 4\)"),
    ("transform_tensor_bilinear", [(1, 4, 4), (1, 4, 4)], {"output_size": (2, 2)}, r"\(N, C, H, W\)"),
    ("transform_tensor_bilinear", [(1, 2, 4, 4), (1, 4, 4)], {"output_size": (2,)}, "two positive"),
])
def test_invalid(graph, op, shapes, attrs, message):
    with pytest.raises(GraphError, match=message):
        apply(op, [ef.placeholder("float32", s) for s in shapes], attrs)
