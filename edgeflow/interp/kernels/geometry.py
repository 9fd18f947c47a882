"""Kernels of edgeflow/ops/geometry.py: a few landmarks and small crops a run, in numpy.
The matrices are computed in float64 (MediaPipe's kernels in float32)."""
import numpy as np

from . import kernel


def _rows(matrix, n):
    """The (n, 4, 4) matrices of a batch of n (a batch of 1 serves every row)."""
    return np.broadcast_to(matrix, (n, 4, 4))


@kernel("landmarks_to_transform_matrix")
def _landmarks_to_transform_matrix(ins, outs, attrs):
    x, out = ins[0], outs[0]
    subset = np.asarray(attrs["subset"], np.intp)
    left, right = attrs["left"], attrs["right"]
    (h, w), (scale_y, scale_x) = attrs["output_size"], attrs["scale"]
    target = attrs["target_rotation"]

    def run():
        xy = x[:, :, :2].astype(np.float64)
        d = xy[:, right] - xy[:, left]
        r = target - np.arctan2(d[:, 1], d[:, 0])  # (N,): the turn that levels left -> right
        c, s = np.cos(r), np.sin(r)
        turn = np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], -2)  # (N, 2, 2): R(r)
        points = np.einsum("nij,nkj->nki", turn, xy[:, subset])
        low, high = points.min(axis=1), points.max(axis=1)
        size = high - low
        centre = np.einsum("nji,nj->ni", turn, (low + high) / 2)  # R(-r) = R(r)^T
        scale = np.stack([scale_x * size[:, 0] / w, scale_y * size[:, 1] / h], -1)  # (N, 2)
        m = np.zeros(out.shape, np.float64)
        m[:, :2, :2] = turn.transpose(0, 2, 1) * scale[:, None, :]  # R(-r) S
        m[:, :2, 3] = centre - np.einsum("nij,j->ni", m[:, :2, :2], [w / 2, h / 2])
        m[:, 2, 2] = m[:, 3, 3] = 1
        np.copyto(out, m, casting="unsafe")
    return run


@kernel("transform_landmarks")
def _transform_landmarks(ins, outs, attrs):
    x, matrix, out = ins[0], ins[1], outs[0]

    def run():
        m = _rows(matrix, x.shape[0])
        xy = np.einsum("nij,nkj->nki", m[:, :2, :2], x[:, :, :2]) + m[:, None, :2, 3]
        out[:, :, 2:] = x[:, :, 2:]
        out[:, :, :2] = xy
    return run


@kernel("transform_tensor_bilinear")
def _transform_tensor_bilinear(ins, outs, attrs):
    """Each output pixel's four neighbours gathered from the flat planes, weighted; the
    positions are computed in x's dtype, as MediaPipe's in float32."""
    x, matrix, out = ins[0], ins[1], outs[0]
    n, c, height, width = x.shape
    h, w = attrs["output_size"]
    i, j = np.meshgrid(np.arange(h, dtype=x.dtype), np.arange(w, dtype=x.dtype), indexing="ij")
    pixels = np.stack([j.ravel(), i.ravel(), np.ones(h * w, x.dtype)])  # (3, h * w)
    half = x.dtype.type(0.5)
    planes = x.reshape(n, c, height * width)
    flat = out.reshape(n, c, h * w)

    def run():
        m = _rows(matrix, n)[:, :2][:, :, [0, 1, 3]].astype(x.dtype)  # (N, 2, 3): x, y, 1
        if attrs["half_pixel"]:
            m = m.copy()
            m[:, :, 2] += half * m[:, :, 0] + half * m[:, :, 1] - half
        pos = np.matmul(m, pixels)  # (N, 2, h * w): px, py
        px, py = pos[:, 0], pos[:, 1]
        inside = (px >= 0) & (px <= width - 1) & (py >= 0) & (py <= height - 1)
        x0, y0 = np.floor(px), np.floor(py)
        fx, fy = px - x0, py - y0
        x0 = np.where(inside, x0, 0).astype(np.intp)
        y0 = np.where(inside, y0, 0).astype(np.intp)
        total = np.zeros((n, c, h * w), x.dtype)
        for dy, wy in ((0, 1 - fy), (1, fy)):
            for dx, wx in ((0, 1 - fx), (1, fx)):
                yy, xx = y0 + dy, x0 + dx
                ok = inside & (yy < height) & (xx < width)  # a neighbour past the edge reads 0
                index = np.where(ok, yy * width + xx, 0)
                weight = np.where(ok, wy * wx, 0).astype(x.dtype)
                total += np.take_along_axis(planes, index[:, None, :].repeat(c, 1), 2) * weight[:, None, :]
        np.copyto(flat, total)
    return run
