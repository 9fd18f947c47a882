"""MediaPipe's landmark custom ops (mediapipe/util/tflite/operations, version 2), written
again here as plain loops over one batch row, a landmark or pixel at a time, as its C++
kernels run: the references edgeflow's vectorized kernels (edgeflow/ops/geometry.py) are
tested against."""
import math

import numpy as np


def _mat_mul(a, b):
    return [[sum(a[r][k] * b[k][c] for k in range(len(b))) for c in range(len(b[0]))] for r in range(len(a))]


def landmarks_to_transform_matrix(landmarks, left, right, subset, output_size, scale, target_rotation=0.0):
    """landmarks (L, >= 2) -> the 4x4 matrix (Landmarks2TransformMatrix v2)."""
    (out_h, out_w), (scale_y, scale_x) = output_size, scale
    lx, ly = float(landmarks[left][0]), float(landmarks[left][1])
    rx, ry = float(landmarks[right][0]), float(landmarks[right][1])
    r = target_rotation - math.atan2(ry - ly, rx - lx)
    turned = []
    for i in subset:
        x, y = float(landmarks[i][0]), float(landmarks[i][1])
        turned.append((math.cos(r) * x - math.sin(r) * y, math.sin(r) * x + math.cos(r) * y))
    xmin, xmax = min(p[0] for p in turned), max(p[0] for p in turned)
    ymin, ymax = min(p[1] for p in turned), max(p[1] for p in turned)
    mx, my = (xmin + xmax) / 2, (ymin + ymax) / 2
    cx, cy = math.cos(-r) * mx - math.sin(-r) * my, math.sin(-r) * mx + math.cos(-r) * my
    t = [[1, 0, 0, cx], [0, 1, 0, cy], [0, 0, 1, 0], [0, 0, 0, 1]]
    q = -r
    t = _mat_mul(t, [[math.cos(q), -math.sin(q), 0, 0], [math.sin(q), math.cos(q), 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    sx, sy = scale_x * (xmax - xmin) / out_w, scale_y * (ymax - ymin) / out_h
    t = _mat_mul(t, [[sx, 0, 0, 0], [0, sy, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    t = _mat_mul(t, [[1, 0, 0, -out_w / 2], [0, 1, 0, -out_h / 2], [0, 0, 1, 0], [0, 0, 0, 1]])
    return np.array(t)


def transform_landmarks(landmarks, matrix):
    """landmarks (L, 2 or 3) through matrix (4, 4) (TransformLandmarks v2)."""
    out = np.array(landmarks, np.float64)
    for k, row in enumerate(landmarks):
        x, y = float(row[0]), float(row[1])
        out[k, 0] = matrix[0][0] * x + matrix[0][1] * y + matrix[0][2] * 0 + matrix[0][3]
        out[k, 1] = matrix[1][0] * x + matrix[1][1] * y + matrix[1][2] * 0 + matrix[1][3]
    return out


def transform_tensor_bilinear(image, matrix, output_size, half_pixel=True):
    """image (H, W, C), channels last as TFLite holds it, sampled through matrix (4, 4) into
    (h, w, C) (TransformTensorBilinear v2 with half_pixel, v1's sampling without)."""
    height, width, channels = image.shape
    out_h, out_w = output_size
    xt = [float(v) for v in matrix[0]]
    yt = [float(v) for v in matrix[1]]
    if half_pixel:  # T -> S (T A): A adds 1/2 to the pixel, S takes it off again
        xt[3] += xt[0] * 0.5 + xt[1] * 0.5 - 0.5
        yt[3] += yt[0] * 0.5 + yt[1] * 0.5 - 0.5
    out = np.zeros((out_h, out_w, channels))

    def read(h, w, c):
        return 0.0 if h < 0 or w < 0 or h >= height or w >= width else float(image[h, w, c])

    for oy in range(out_h):
        for ox in range(out_w):
            tx = xt[0] * ox + xt[1] * oy + xt[3]
            ty = yt[0] * ox + yt[1] * oy + yt[3]
            if tx < 0 or tx > width - 1 or ty < 0 or ty > height - 1:
                continue
            fx, fy = math.floor(tx), math.floor(ty)
            right, lower = tx - fx, ty - fy
            for c in range(channels):
                upper = (1 - right) * read(fy, fx, c) + right * read(fy, fx + 1, c)
                below = (1 - right) * read(fy + 1, fx, c) + right * read(fy + 1, fx + 1, c)
                out[oy, ox, c] = lower * below + (1 - lower) * upper
    return out
