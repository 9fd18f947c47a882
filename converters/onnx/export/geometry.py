"""MediaPipe's landmark ops (edgeflow/ops/geometry.py) as ONNX subgraphs: ONNX has none of
them. The crop matrix is built without angles (the turn's cosine and sine from the pair's
direction, ONNX having no Atan2); the crop is GridSample (align_corners) with the
positions outside the map masked to 0."""
import numpy as np

from . import exporter, unsupported

_LAST = np.iinfo(np.int64).max


def _slice(g, x, starts, ends, axes):
    return g.node("Slice", [x, g.const(np.array(starts, np.int64), "starts"), g.const(np.array(ends, np.int64), "ends"),
                            g.const(np.array(axes, np.int64), "axes")])


def _c(g, value, dtype, hint="c"):
    return g.const(np.asarray(value, dtype), hint)


@exporter
def transform_landmarks(g, op):
    x, m = op.inputs
    xy = _slice(g, x, [0], [2], [2])  # (N, L, 2)
    turn = g.node("Transpose", [_slice(g, m, [0, 0], [2, 2], [1, 2])], perm=[0, 2, 1])  # (B, 2, 2)^T
    shift = g.node("Transpose", [_slice(g, m, [0, 3], [2, 4], [1, 2])], perm=[0, 2, 1])  # (B, 1, 2)
    moved = g.node("Add", [g.node("MatMul", [xy, turn]), shift])
    rest = _slice(g, x, [2], [_LAST], [2])  # z, if any
    g.node("Concat", [moved, rest], op.outputs, axis=2)


@exporter
def transform_tensor_bilinear(g, op):
    x, m = op.inputs
    spec = op.input_specs[0]
    dtype = spec.dtype
    height, width = spec.shape[2:]
    if height is None or width is None:
        raise unsupported(op, "a feature map of unknown height or width")
    h, w = op.attrs["output_size"]
    i, j = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    pixels = _c(g, np.stack([j.ravel(), i.ravel(), np.ones(h * w)]), dtype, "pixels")  # (3, h * w)
    rows = g.node("Gather", [_slice(g, m, [0], [2], [1]), g.const(np.array([0, 1, 3], np.int64), "xy1")],
                  axis=2)  # (B, 2, 3)
    if op.attrs["half_pixel"]:  # (j + 1/2, i + 1/2) -> (px + 1/2, py + 1/2)
        rows = g.node("Add", [g.node("MatMul", [rows, _c(g, [[1, 0, 0.5], [0, 1, 0.5], [0, 0, 1]], dtype, "half")]),
                              _c(g, [[[0, 0, -0.5]]], dtype, "minus_half")])
    pos = g.node("MatMul", [rows, pixels])  # (B, 2, h * w): px, py
    last = np.array([[[width - 1]], [[height - 1]]], dtype).reshape(1, 2, 1)
    scale = np.where(last > 0, 2 / np.maximum(last, 1), 0).astype(dtype)  # to GridSample's [-1, 1]
    grid = g.node("Sub", [g.node("Mul", [pos, _c(g, scale, dtype, "scale")]), _c(g, 1, dtype, "one")])
    grid = g.node("Reshape", [g.node("Transpose", [grid], perm=[0, 2, 1]), g.const(np.array([-1, h, w, 2], np.int64),
                                                                                     "grid_shape")])
    batch = g.node("Shape", [x], end=1)
    grid = g.node("Expand", [grid, g.node("Concat", [batch, g.const(np.array([h, w, 2], np.int64), "hw2")], axis=0)])
    sampled = g.node("GridSample", [x, grid], mode="linear", padding_mode="zeros", align_corners=1)
    inside = g.node("And", [g.node("GreaterOrEqual", [pos, _c(g, 0, dtype, "zero")]),
                            g.node("LessOrEqual", [pos, _c(g, last, dtype, "last")])])  # (B, 2, h * w)
    both = g.node("ReduceMin", [g.node("Cast", [inside], to=6), g.const(np.array([1], np.int64), "axis")],
                  keepdims=1)  # int32: 1 where px and py are inside
    mask = g.node("Reshape", [g.node("Cast", [both], to=9), g.const(np.array([-1, 1, h, w], np.int64), "mask_shape")])
    g.node("Where", [mask, sampled, _c(g, 0, dtype, "zero")], op.outputs)


@exporter
def landmarks_to_transform_matrix(g, op):
    """cos and sin of r = target - atan2(dy, dx) from the pair's unit direction (1, 0 for
    a pair on one point, as atan2(0, 0) = 0); then the subset turned by r, its box, and
    T(centre) R(-r) S T(-w / 2, -h / 2) assembled row by row."""
    x = op.inputs[0]
    dtype = op.input_specs[0].dtype
    a = op.attrs
    h, w = a["output_size"]
    scale_y, scale_x = a["scale"]
    xy = _slice(g, x, [0], [2], [2])  # (N, L, 2)

    def part(t, k):  # (..., 1) slice k of the last axis
        return _slice(g, t, [k], [k + 1], [2])

    pair = g.node("Gather", [xy, g.const(np.array([a["left"], a["right"]], np.int64), "pair")], axis=1)  # (N, 2, 2)
    d = g.node("Sub", [_slice(g, pair, [1], [2], [1]), _slice(g, pair, [0], [1], [1])])  # (N, 1, 2)
    dx, dy = part(d, 0), part(d, 1)
    norm = g.node("Sqrt", [g.node("Add", [g.node("Mul", [dx, dx]), g.node("Mul", [dy, dy])])])
    zero, one = _c(g, 0, dtype, "zero"), _c(g, 1, dtype, "one")
    flat = g.node("Equal", [norm, zero])
    safe = g.node("Where", [flat, one, norm])
    ca = g.node("Where", [flat, one, g.node("Div", [dx, safe])])
    sa = g.node("Div", [dy, safe])
    ct, st = (_c(g, f(a["target_rotation"]), dtype, n) for f, n in ((np.cos, "cos_target"), (np.sin, "sin_target")))
    c = g.node("Add", [g.node("Mul", [ct, ca]), g.node("Mul", [st, sa])])  # cos r, (N, 1, 1)
    s = g.node("Sub", [g.node("Mul", [st, ca]), g.node("Mul", [ct, sa])])  # sin r

    points = g.node("Gather", [xy, g.const(np.array(a["subset"], np.int64), "subset")], axis=1)  # (N, S, 2)
    px, py = part(points, 0), part(points, 1)
    turned = g.node("Concat", [g.node("Sub", [g.node("Mul", [c, px]), g.node("Mul", [s, py])]),
                               g.node("Add", [g.node("Mul", [s, px]), g.node("Mul", [c, py])])], axis=2)
    axis = g.const(np.array([1], np.int64), "axis")
    low, high = g.node("ReduceMin", [turned, axis], keepdims=1), g.node("ReduceMax", [turned, axis], keepdims=1)
    mid = g.node("Mul", [g.node("Add", [low, high]), _c(g, 0.5, dtype, "half")])  # (N, 1, 2)
    mx, my = part(mid, 0), part(mid, 1)
    cx = g.node("Add", [g.node("Mul", [c, mx]), g.node("Mul", [s, my])])  # R(-r) mid
    cy = g.node("Sub", [g.node("Mul", [c, my]), g.node("Mul", [s, mx])])
    size = g.node("Mul", [g.node("Sub", [high, low]), _c(g, [[[scale_x / w, scale_y / h]]], dtype, "scale")])
    ax, ay = part(size, 0), part(size, 1)
    m00, m01 = g.node("Mul", [c, ax]), g.node("Mul", [s, ay])  # R(-r) S
    m10, m11 = g.node("Neg", [g.node("Mul", [s, ax])]), g.node("Mul", [c, ay])
    half_w, half_h = _c(g, w / 2, dtype, "half_w"), _c(g, h / 2, dtype, "half_h")
    tx = g.node("Sub", [cx, g.node("Add", [g.node("Mul", [m00, half_w]), g.node("Mul", [m01, half_h])])])
    ty = g.node("Sub", [cy, g.node("Add", [g.node("Mul", [m10, half_w]), g.node("Mul", [m11, half_h])])])
    batch = g.node("Shape", [x], end=1)
    zeros = g.node("Expand", [_c(g, [[[0]]], dtype, "zeros"), g.node("Concat", [
        batch, g.const(np.array([1, 1], np.int64), "one_one")], axis=0)])  # (N, 1, 1)
    tail = g.node("Expand", [_c(g, [[[0, 0, 1, 0], [0, 0, 0, 1]]], dtype, "rows_2_3"), g.node("Concat", [
        batch, g.const(np.array([2, 4], np.int64), "two_four")], axis=0)])  # (N, 2, 4)
    rows = [g.node("Concat", [p, q, zeros, t], axis=2) for p, q, t in ((m00, m01, tx), (m10, m11, ty))]
    g.node("Concat", [*rows, tail], op.outputs, axis=1)
