"""Ops whose output sizes depend on values (edgeflow/ops/select.py)."""
import numpy as np

from . import exporter

SAME = {"nonzero": "NonZero", "compress": "Compress", "unique": "Unique"}


@exporter
def non_max_suppression(g, op):
    """The limits as ONNX's inputs; without a score_threshold none applies."""
    limits = [g.given(op, "max_output_boxes_per_class", np.int64, (1,)),
              g.given(op, "iou_threshold", np.float32, (1,))]
    if "score_threshold" in op.operands or op.attrs["score_threshold"] is not None:
        limits.append(g.given(op, "score_threshold", np.float32, (1,)))
    g.node("NonMaxSuppression", op.inputs[:2] + limits, op.outputs, center_point_box=op.attrs["center_point_box"])
