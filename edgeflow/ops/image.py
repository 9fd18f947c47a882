"""Image ops: padding and resizing (ONNX's Pad and Resize), sampling and cropping."""
import numpy as np

from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define, get, gradient
from .dims import check_gradient_shape, fmt, vector_length

PAD_MODES = ("constant", "reflect", "edge", "wrap")


@define("pad", types=Types("x: T, pads: index?, value: T? -> T", T=dtypes.ANY),
        attrs={"pads": Attr(AttrKind.INTS), "mode": Attr(AttrKind.STRING, "constant"),
               "value": Attr(AttrKind.FLOAT, 0.0)}, operands=("pads", "value"))
def _pad(inputs, attrs):
    """Grow each axis by pads (begin..., end...): with `value`, a mirror (reflect), the edge, or
    the axis repeated as on a torus (wrap).

    Negative pads remove elements, in constant mode only.
    """
    x, pads, mode = inputs[0], attrs["pads"], attrs["mode"]
    if mode not in PAD_MODES:
        raise GraphError(f"pad: mode must be one of {PAD_MODES}, got {mode!r}")
    if len(pads) != 2 * x.rank:
        raise GraphError(f"pad: pads must hold {2 * x.rank} ints (begin..., end...) for "
                         f"{fmt(x.shape)}, got {len(pads)}")
    if mode != "constant" and min(pads, default=0) < 0:
        raise GraphError(f"pad: negative pads crop, which only mode 'constant' does; got {pads}")
    shape = []
    for i, n in enumerate(x.shape):
        pb, pe = pads[i], pads[i + x.rank]
        if n is not None and n + pb + pe < 0:
            raise GraphError(f"pad: pads {pb}, {pe} remove more than axis {i} of {fmt(x.shape)} holds")
        if mode != "constant" and n == 0 and pb + pe:
            raise GraphError(f"pad: mode {mode!r} cannot pad axis {i} of {fmt(x.shape)}: it is empty")
        shape.append(None if n is None else n + pb + pe)
    return [TensorSpec(tuple(shape), x.dtype)]


RESIZE_MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                    "half_pixel_symmetric", "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def resize_axes(op, attrs, shape):
    """(sizes, scales) of every axis of `shape`: output lengths (None where unknown until
    run) and the scale each output coordinate maps back with (None: size / length, known
    at run time). GraphError where the attributes are inconsistent.

    `scales` and `sizes` hold one entry per axis, or two for the last two axes (the others
    are kept). With scales only, an axis's length is floor(n * scale), computed in float32
    as onnxruntime does (and ONNX's reference: not times the roi's extent, as ONNX's spec
    says for tf_crop_and_resize); with both, sizes
    are the output lengths and scales the coordinate scales (keep_aspect_ratio_policy).
    """
    rank, scales, sizes = len(shape), attrs["scales"], attrs["sizes"]
    if not scales and not sizes:
        raise GraphError(f"{op}: give scales or sizes (or both), got neither")
    for name, given in (("scales", scales), ("sizes", sizes)):
        if given and len(given) not in {2, rank}:
            raise GraphError(f"{op}: {name} must have 2 (the last two axes) or {rank} entries, got {given}")
    if rank < len(scales or sizes) or rank < 1:
        raise GraphError(f"{op}: x of rank {rank} has fewer axes than scales or sizes")
    if scales and not all(0 < s < float("inf") for s in scales):  # NaN fails too
        raise GraphError(f"{op}: scales must be positive and finite, got {scales}")
    if sizes and min(sizes) < 1:
        raise GraphError(f"{op}: sizes must be positive, got {sizes}")
    roi = attrs["roi"]
    crop = attrs["coordinate_transformation_mode"] == "tf_crop_and_resize"
    if crop and len(roi) != 2 * rank:
        raise GraphError(f"{op}: tf_crop_and_resize needs roi (start..., end...) of {2 * rank} values, got {roi}")
    full_scales = (1.0,) * (rank - len(scales)) + tuple(scales) if scales else (None,) * rank
    full_sizes = tuple(shape[:rank - len(sizes)]) + tuple(sizes) if sizes else None
    if full_sizes is None:
        with np.errstate(over="ignore"):
            products = [None if n is None else np.float32(n) * np.float32(s) for n, s in zip(shape, full_scales)]
        if not all(p is None or np.isfinite(p) for p in products):
            raise GraphError(f"{op}: scales {scales} make {fmt(shape)} overflow float32")
        full_sizes = tuple(None if p is None else int(np.floor(p)) for p in products)
        if any(s is not None and s < 1 for s in full_sizes):
            raise GraphError(f"{op}: scales {scales} shrink {fmt(shape)} to nothing")
    return full_sizes, full_scales


@define("resize", types=Types("x: T, roi: float32?, scales: float32?, sizes: int64? -> T",
                              T=dtypes.NUMERIC), operands=("roi", "scales", "sizes"), attrs={
    "scales": Attr(AttrKind.FLOATS, ()), "sizes": Attr(AttrKind.INTS, ()),
    "mode": Attr(AttrKind.STRING, "nearest"),
    "coordinate_transformation_mode": Attr(AttrKind.STRING, "half_pixel"),
    "nearest_mode": Attr(AttrKind.STRING, "round_prefer_floor"),
    "cubic_coeff_a": Attr(AttrKind.FLOAT, -0.75), "exclude_outside": Attr(AttrKind.BOOL, False),
    "antialias": Attr(AttrKind.BOOL, False), "roi": Attr(AttrKind.FLOATS, ()),
    "extrapolation_value": Attr(AttrKind.FLOAT, 0.0)})
def _resize(inputs, attrs):
    """Resample x to `sizes`, or to floor(length * scales), as ONNX's Resize.

    Each output coordinate maps back to an input coordinate by
    coordinate_transformation_mode; nearest rounds it by nearest_mode, linear and cubic
    (Keys' kernel with cubic_coeff_a) interpolate each axis in turn. exclude_outside gives
    taps outside x no weight; antialias widens the filter by 1 / scale when shrinking;
    tf_crop_and_resize samples the box `roi` and writes extrapolation_value outside x.
    """
    x = inputs[0]
    for key, allowed in (("mode", RESIZE_MODES), ("coordinate_transformation_mode", COORDINATE_MODES),
                         ("nearest_mode", NEAREST_MODES)):
        if attrs[key] not in allowed:
            raise GraphError(f"resize: {key} must be one of {allowed}, got {attrs[key]!r}")
    if attrs["mode"] != "nearest" and x.dtype not in dtypes.FLOATS:  # a declaration cannot say this
        raise GraphError(f"resize: mode {attrs['mode']!r} does not take dtype {x.dtype}")
    sizes, _ = resize_axes("resize", attrs, x.shape)
    return [TensorSpec(sizes, x.dtype)]


@gradient("pad")
def _pad_grad(g, op, grads):
    """Constant padding's gradient is dy cropped (and zero-padded where pad cropped): pad by
    the negated pads. Reflect, edge and wrap also add each border's gradient to its source."""
    if op.attrs["mode"] == "constant":
        return [g("pad", grads[0], pads=tuple(-p for p in op.attrs["pads"]))]
    return [g("pad_grad", grads[0], op.inputs[0], **op.attrs)]


@gradient("resize")
def _resize_grad(g, op, grads):
    return [g("resize_grad", grads[0], op.inputs[0], **op.attrs)]


# Gradients of pad and resize, as ops (their operands as conv_input_grad's).

@define("pad_grad", types=Types("dy: T, like: T -> T", T=dtypes.NUMERIC), attrs=get("pad").attrs)
def _pad_grad_infer(inputs, attrs):
    """dy of pad (same attrs, mode reflect, edge or wrap) with each border element's gradient added
    to the element it copies, cropped to like's shape."""
    dy, like = inputs
    if attrs["mode"] == "constant":
        raise GraphError("pad_grad: mode 'constant' needs no op of its own: pad by the negated pads")
    check_gradient_shape("pad_grad", "pad", (like,), attrs, dy)
    return [TensorSpec(like.shape, dy.dtype)]


@define("resize_grad", types=Types("dy: T, like: T -> T", T=dtypes.FLOATS), attrs=get("resize").attrs)
def _resize_grad_infer(inputs, attrs):
    """dy of resize (same attrs) added back to the input pixels each output pixel read, with
    the weights it read them with; shaped like `like`."""
    dy, like = inputs
    check_gradient_shape("resize_grad", "resize", (like,), attrs, dy)
    return [TensorSpec(like.shape, dy.dtype)]


@gradient("pad_grad")
def _pad_grad_grad(g, op, grads):
    return [g("pad", grads[0], **op.attrs), None]


@gradient("resize_grad")
def _resize_grad_grad(g, op, grads):
    return [g("resize", grads[0], **op.attrs), None]


GRID_SAMPLE_MODES = ("linear", "nearest", "cubic")
GRID_PADDING_MODES = ("zeros", "border", "reflection")


@define("grid_sample", types=Types("x: T, grid: G -> T", T=dtypes.NUMERIC, G=dtypes.FLOATS), attrs={
    "mode": Attr(AttrKind.STRING, "linear"), "padding_mode": Attr(AttrKind.STRING, "zeros"),
    "align_corners": Attr(AttrKind.BOOL, False)})
def _grid_sample(inputs, attrs):
    """Sample x (N, C, d1..dr) at the normalized positions grid (N, o1..or, r) holds (its last
    axis lists them w, h, d...: the last spatial axis first), as ONNX's GridSample.

    -1 and 1 are the centres of the corner pixels with align_corners, else their outer
    edges; positions outside read zeros, the border, or the reflection (padding_mode).
    """
    x, grid = inputs
    for key, allowed in (("mode", GRID_SAMPLE_MODES), ("padding_mode", GRID_PADDING_MODES)):
        if attrs[key] not in allowed:
            raise GraphError(f"grid_sample: {key} must be one of {allowed}, got {attrs[key]!r}")
    if attrs["mode"] != "nearest" and x.dtype not in dtypes.FLOATS:
        raise GraphError(f"grid_sample: mode {attrs['mode']!r} does not take dtype {x.dtype}")
    r = x.rank - 2
    if r < 1 or grid.rank != r + 2 or grid.shape[-1] not in (None, r):
        raise GraphError(f"grid_sample: x (N, C, d1..dr) {fmt(x.shape)} needs grid (N, o1..or, r) of rank "
                         f"{x.rank} ending in {r}, got {fmt(grid.shape)}")
    if None not in (x.shape[0], grid.shape[0]) and x.shape[0] != grid.shape[0]:
        raise GraphError(f"grid_sample: x {fmt(x.shape)} and grid {fmt(grid.shape)} differ in batch")
    return [TensorSpec((x.shape[0] if x.shape[0] is not None else grid.shape[0], x.shape[1])
                       + tuple(grid.shape[1:-1]), x.dtype)]


def _grid_unknown(own, attrs, operands):
    """While the size is unknown: its length (N, C, d1..dr) sets the rank."""
    r = vector_length("affine_grid", operands[0], "size") - 2
    return [TensorSpec((None,) * (r + 2), own[0].dtype)]


@define("affine_grid", types=Types("theta: T, size: int64? -> T", T=dtypes.FLOATS), operands=("size",),
        unknown=_grid_unknown, attrs={
    "size": Attr(AttrKind.INTS), "align_corners": Attr(AttrKind.BOOL, False)})
def _affine_grid(inputs, attrs):
    """The grid (N, d1..dr, r) grid_sample reads for x of shape `size` (N, C, d1..dr): theta
    (N, r, r + 1) applied to each output position's normalized (w, h, d..., 1), as ONNX's AffineGrid."""
    theta, size = inputs[0], attrs["size"]
    r = len(size) - 2
    if r not in (2, 3) or min(size) < 1:
        raise GraphError(f"affine_grid: size must be (N, C, H, W) or (N, C, D, H, W) of positive lengths, got {size}")
    if theta.rank != 3 or any(n is not None and n != m for n, m in zip(theta.shape, (size[0], r, r + 1))):
        raise GraphError(f"affine_grid: theta must be ({size[0]}, {r}, {r + 1}) for size {size}, got {fmt(theta.shape)}")
    return [TensorSpec(tuple(size[:1]) + tuple(size[2:]) + (r,), theta.dtype)]


def _image_unknown(own, attrs, operands):
    """While the image shape is unknown: (N, C, one ? per image axis)."""
    return [TensorSpec((None,) * (2 + vector_length("col2im", operands[0], "image_shape")), own[0].dtype)]


@define("col2im", types=Types("x: T, image_shape: int64?, block_shape: int64? -> T", T=dtypes.NUMERIC),
        operands=("image_shape", "block_shape"), unknown=_image_unknown, attrs={
    "image_shape": Attr(AttrKind.INTS), "block_shape": Attr(AttrKind.INTS),
    "strides": Attr(AttrKind.INTS, ()), "pads": Attr(AttrKind.INTS, ()), "dilations": Attr(AttrKind.INTS, ())})
def _col2im(inputs, attrs):
    """Sum the sliding blocks x (N, C * prod(block_shape), L) back into an image (N, C,
    *image_shape), as ONNX's Col2Im (the adjoint of im2col)."""
    x = inputs[0]
    image, block = attrs["image_shape"], attrs["block_shape"]
    r = len(image)
    strides, pads, dilations = col2im_geometry("col2im", attrs)
    if x.rank != 3:
        raise GraphError(f"col2im: x must be (N, C * prod(block_shape), L), got {fmt(x.shape)}")
    blocks = []
    for i in range(r):
        span = dilations[i] * (block[i] - 1) + 1
        blocks.append((image[i] + pads[i] + pads[i + r] - span) // strides[i] + 1)
    if min(blocks) < 1:
        raise GraphError(f"col2im: block_shape {block} (dilations {dilations}) does not fit image_shape {image} "
                         f"with pads {pads}")
    k = int(np.prod(block))
    if x.shape[1] is not None and x.shape[1] % k:
        raise GraphError(f"col2im: x's axis 1 ({x.shape[1]}) must be a multiple of prod(block_shape) = {k}")
    if x.shape[2] is not None and x.shape[2] != int(np.prod(blocks)):
        raise GraphError(f"col2im: x must hold {int(np.prod(blocks))} blocks ({' x '.join(map(str, blocks))}) "
                         f"along axis 2, got {x.shape[2]}")
    return [TensorSpec((x.shape[0], None if x.shape[1] is None else x.shape[1] // k) + tuple(image), x.dtype)]


def col2im_geometry(op, attrs):
    """(strides, pads, dilations) of col2im with their defaults; GraphError if malformed."""
    image, block = attrs["image_shape"], attrs["block_shape"]
    r = len(image)
    strides, pads, dilations = attrs["strides"] or (1,) * r, attrs["pads"] or (0,) * 2 * r, \
        attrs["dilations"] or (1,) * r
    if r < 1 or len(block) != r or len(strides) != r or len(dilations) != r or len(pads) != 2 * r:
        raise GraphError(f"{op}: image_shape {image}, block_shape {block}, strides {strides}, dilations "
                         f"{dilations} need one entry per spatial axis, pads two")
    if min(image + block + strides + dilations) < 1 or min(pads) < 0:
        raise GraphError(f"{op}: image_shape, block_shape, strides and dilations must be positive, pads "
                         f"non-negative; got {attrs}")
    return strides, pads, dilations


@define("roi_align", types=Types("x: T, rois: T, batch_indices: index -> T", T=dtypes.FLOATS), attrs={
    "mode": Attr(AttrKind.STRING, "avg"), "output_height": Attr(AttrKind.INT, 1),
    "output_width": Attr(AttrKind.INT, 1), "sampling_ratio": Attr(AttrKind.INT, 0),
    "spatial_scale": Attr(AttrKind.FLOAT, 1.0),
    "coordinate_transformation_mode": Attr(AttrKind.STRING, "half_pixel")})
def _roi_align(inputs, attrs):
    """Pool each box rois[i] (x1, y1, x2, y2, times spatial_scale) of image batch_indices[i]
    of x (N, C, H, W) into (output_height, output_width) bins, as ONNX's RoiAlign: each bin
    averages (or takes the max of) sampling_ratio^2 bilinear samples (adaptive: ceil(bin
    size) per axis when 0). half_pixel shifts the box by -0.5 pixel; output_half_pixel
    does not, and makes it at least 1 pixel wide."""
    x, rois, indices = inputs
    if attrs["mode"] not in ("avg", "max"):
        raise GraphError(f"roi_align: mode must be 'avg' or 'max', got {attrs['mode']!r}")
    if attrs["coordinate_transformation_mode"] not in ("half_pixel", "output_half_pixel"):
        raise GraphError("roi_align: coordinate_transformation_mode must be 'half_pixel' or 'output_half_pixel', "
                         f"got {attrs['coordinate_transformation_mode']!r}")
    if min(attrs["output_height"], attrs["output_width"]) < 1 or attrs["sampling_ratio"] < 0:
        raise GraphError("roi_align: output_height and output_width must be positive, sampling_ratio at least 0; "
                         f"got {attrs['output_height']}, {attrs['output_width']}, {attrs['sampling_ratio']}")
    if x.rank != 4 or rois.rank != 2 or rois.shape[1] not in (None, 4) or indices.rank != 1:
        raise GraphError(f"roi_align: x must be (N, C, H, W), rois (R, 4) and batch_indices (R,); got "
                         f"{fmt(x.shape)}, {fmt(rois.shape)}, {fmt(indices.shape)}")
    if None not in (rois.shape[0], indices.shape[0]) and rois.shape[0] != indices.shape[0]:
        raise GraphError(f"roi_align: rois {fmt(rois.shape)} and batch_indices {fmt(indices.shape)} differ in length")
    r = rois.shape[0] if rois.shape[0] is not None else indices.shape[0]
    return [TensorSpec((r, x.shape[1], attrs["output_height"], attrs["output_width"]), x.dtype)]
