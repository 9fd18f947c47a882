"""MediaPipe's landmark custom ops (edgeflow/ops/geometry.py), version 2, as its attention
face mesh (face_landmark_with_attention.tflite) holds them. Their options are FlexBuffer
maps (the keys MediaPipe's parsers read)."""
from edgeflow.graph.math_ops import apply

from ..context import NCHW, unsupported
from . import handler


def _options(op, keys):
    """{key: value} of op's FlexBuffer custom options, each of `keys` present."""
    from flatbuffers import flexbuffers
    try:
        options = flexbuffers.Loads(bytes(op.op.custom_options)) if op.op.custom_options else {}
    except Exception as e:  # a corrupt FlexBuffer fails in many ways inside the decoder
        raise unsupported(op, f"custom options that do not decode as a FlexBuffer ({type(e).__name__}: {e})") \
            from None
    if not isinstance(options, dict):
        raise unsupported(op, f"custom options that are not a map ({type(options).__name__})")
    missing = [k for k in keys if k not in options]
    if missing:
        raise unsupported(op, f"custom options without {', '.join(missing)}")
    return options


def _version(op, want=2):
    if op.op.version != want:
        raise unsupported(op, f"version {op.op.version} (edgeflow converts version {want})")


@handler("CUSTOM:Landmarks2TransformMatrix", op="landmarks_to_transform_matrix")
def _landmarks_to_transform_matrix(ctx, op):
    _version(op)
    o = _options(op, ("left_rotation_idx", "right_rotation_idx", "subset_idxs", "output_height", "output_width",
                      "scale_x", "scale_y"))
    attrs = {"left": int(o["left_rotation_idx"]), "right": int(o["right_rotation_idx"]),
             "subset": tuple(int(i) for i in o["subset_idxs"]),
             "output_size": (int(o["output_height"]), int(o["output_width"])),
             "scale": (float(o["scale_y"]), float(o["scale_x"])),
             "target_rotation": float(o.get("target_rotation_radians", 0.0))}
    y = apply("landmarks_to_transform_matrix", [ctx.get(op.inputs[0])], attrs, name=f"{op.name}/matrix")
    ctx.set(op.outputs[0], y)


@handler("CUSTOM:TransformLandmarks", op="transform_landmarks")
def _transform_landmarks(ctx, op):
    _version(op)
    y = apply("transform_landmarks", [ctx.get(op.inputs[0]), ctx.get(op.inputs[1])], name=f"{op.name}/transform")
    ctx.set(op.outputs[0], y)


@handler("CUSTOM:TransformTensorBilinear", op="transform_tensor_bilinear")
def _transform_tensor_bilinear(ctx, op):
    """The feature map (NHWC in TFLite) is sampled in NCHW, as the convs around it run."""
    _version(op)
    o = _options(op, ("output_height", "output_width"))
    attrs = {"output_size": (int(o["output_height"]), int(o["output_width"])), "half_pixel": True}
    y = apply("transform_tensor_bilinear", [ctx.get(op.inputs[0], NCHW), ctx.get(op.inputs[1])], attrs,
              name=f"{op.name}/sample")
    ctx.set(op.outputs[0], y, NCHW)
