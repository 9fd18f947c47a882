"""Landmark geometry: MediaPipe's landmark ops, which its attention face mesh
(face_landmark_with_attention) runs between its stages to crop a feature map around
the lips and eyes it has found.

A crop is a 4x4 matrix mapping the crop's pixel coordinates (x, y, z, 1) to the source's:
`landmarks_to_transform_matrix` fits one around a subset of landmarks,
`transform_tensor_bilinear` samples a feature map through it and `transform_landmarks`
maps landmarks found in the crop back. Each row of the batch has its own matrix (a
matrix batch of 1 serves every row); MediaPipe's own kernels run the first row only.
"""
from .. import dtypes
from ..errors import GraphError
from .dims import fmt
from .registry import Attr, AttrKind, TensorSpec, Types, define

_FLOAT = Types("landmarks: T -> T", T=(dtypes.float32, dtypes.float64))


def _matrix(op, m, n):
    """Check m is (N or 1, 4, 4) for a batch of n."""
    if m.rank != 3 or m.shape[1:] not in ((4, 4), (None, 4), (4, None), (None, None)):
        raise GraphError(f"{op}: matrix must be (N, 4, 4), got {fmt(m.shape)}")
    if None not in (m.shape[0], n) and m.shape[0] not in (1, n):
        raise GraphError(f"{op}: matrix {fmt(m.shape)} must have a batch of 1 or {n}")


def _pair(op, attrs, key, positive):
    values = attrs[key]
    if len(values) != 2 or not all(v > 0 if positive else True for v in values):
        raise GraphError(f"{op}: {key} must be two {'positive ' if positive else ''}numbers (y, x), got {values}")
    return values


@define("landmarks_to_transform_matrix", types=_FLOAT, attrs={
    "left": Attr(AttrKind.INT), "right": Attr(AttrKind.INT), "subset": Attr(AttrKind.INTS),
    "output_size": Attr(AttrKind.INTS), "scale": Attr(AttrKind.FLOATS, (1.0, 1.0)),
    "target_rotation": Attr(AttrKind.FLOAT, 0.0)})
def _landmarks_to_transform_matrix(inputs, attrs):
    """The (N, 4, 4) matrix of a crop of output_size (h, w) around landmarks (N, L, D >= 2)
    `subset` (indices into L), as MediaPipe's Landmarks2TransformMatrix (version 2).

    The crop turns by r = target_rotation - atan2(y_right - y_left, x_right - x_left) (the
    line through landmarks `left` and `right` becomes level); in the turned frame it is the
    subset's bounding box, centred, scaled by `scale` (y, x). The matrix is
    T(centre) R(-r) S(scale_x * width / w, scale_y * height / h) T(-w / 2, -h / 2): from
    the crop's pixels to the landmarks' coordinates; z passes unchanged.
    """
    x = inputs[0]
    op = "landmarks_to_transform_matrix"
    _pair(op, attrs, "output_size", True)
    _pair(op, attrs, "scale", True)
    if x.rank != 3 or (x.shape[2] is not None and x.shape[2] < 2):
        raise GraphError(f"{op}: landmarks must be (N, L, D) with D >= 2, got {fmt(x.shape)}")
    indices = [attrs["left"], attrs["right"], *attrs["subset"]]
    if not attrs["subset"]:
        raise GraphError(f"{op}: subset is empty")
    bad = [i for i in indices if i < 0 or (x.shape[1] is not None and i >= x.shape[1])]
    if bad:
        raise GraphError(f"{op}: landmark indices {sorted(set(bad))} outside the {x.shape[1]} landmarks "
                         f"of {fmt(x.shape)}")
    return [TensorSpec((x.shape[0], 4, 4), x.dtype)]


@define("transform_landmarks", types=Types("landmarks: T, matrix: T -> T", T=(dtypes.float32, dtypes.float64)))
def _transform_landmarks(inputs, attrs):
    """Landmarks (N, L, D), D of 2 or 3, through the matrix (N or 1, 4, 4): (x, y) becomes
    the first two rows of matrix times (x, y, 0, 1); z is kept. MediaPipe's
    TransformLandmarks (version 2)."""
    x, m = inputs
    if x.rank != 3 or x.shape[2] not in (None, 2, 3):
        raise GraphError(f"transform_landmarks: landmarks must be (N, L, 2) or (N, L, 3), got {fmt(x.shape)}")
    _matrix("transform_landmarks", m, x.shape[0])
    return [TensorSpec(x.shape, x.dtype)]


@define("transform_tensor_bilinear", types=Types("x: T, matrix: T -> T", T=(dtypes.float32, dtypes.float64)),
        attrs={"output_size": Attr(AttrKind.INTS), "half_pixel": Attr(AttrKind.BOOL, True)})
def _transform_tensor_bilinear(inputs, attrs):
    """x (N, C, H, W) sampled bilinearly at the positions the matrix (N or 1, 4, 4) maps
    each output pixel (j, i) of output_size (h, w) to: (px, py) = the first two rows of
    matrix times (j, i, 0, 1). With half_pixel (MediaPipe's TransformTensorBilinear
    version 2) the matrix maps pixel centres, (j + 1/2, i + 1/2) to (px + 1/2, py + 1/2).
    A position outside [0, W - 1] x [0, H - 1] gives 0."""
    x, m = inputs
    h, w = _pair("transform_tensor_bilinear", attrs, "output_size", True)
    if x.rank != 4:
        raise GraphError(f"transform_tensor_bilinear: x must be (N, C, H, W), got {fmt(x.shape)}")
    _matrix("transform_tensor_bilinear", m, x.shape[0])
    return [TensorSpec((x.shape[0], x.shape[1], h, w), x.dtype)]
