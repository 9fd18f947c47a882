"""Ops that select elements by their values: nonzero, compress, unique. How many elements
they give depends on the values, so a plan runs them once those are known and plans what
follows for the sizes they gave (edgeflow/interp/staged.py)."""
import numpy as np

from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define
from .dims import fmt, normalize_axis


def _value(spec):
    """The spec's value as numbers (bfloat16 widened to float32: -0.0 is zero), or None."""
    if spec.value is None:
        return None
    return dtypes.widen(spec.value) if spec.dtype == dtypes.bfloat16 else np.asarray(spec.value)


def _count(spec, fn):
    """fn(value) once the value is known, else None (an unknown dimension)."""
    return None if spec.value is None else int(fn(_value(spec)))


@define("nonzero", types=Types("x: any -> int64"))
def _nonzero(inputs, attrs):
    """The indices of x's non-zero elements, one column per element in row-major order:
    int64 (rank, count), as ONNX's NonZero (a scalar gives (0, count))."""
    x = inputs[0]
    return [TensorSpec((x.rank, _count(x, np.count_nonzero)), dtypes.int64)]


@define("compress", types=Types("x: T, condition: bool -> T", T=dtypes.ANY),
        attrs={"axis": Attr(AttrKind.INT, None)})
def _compress(inputs, attrs):
    """The slices of x along `axis` where `condition` holds (x flattened when no axis);
    a condition shorter than the axis selects among its first slices, as numpy.compress."""
    x, condition = inputs
    if condition.rank != 1:
        raise GraphError(f"compress: condition must be a vector, got {fmt(condition.shape)}")
    axis = None if attrs["axis"] is None else normalize_axis(attrs["axis"], x.rank, "compress")
    length = _num_elements(x.shape) if axis is None else x.shape[axis]
    if None not in (length, condition.shape[0]) and condition.shape[0] > length:
        raise GraphError(f"compress: condition has {condition.shape[0]} entries for {length} slices")
    count = _count(condition, np.count_nonzero)
    if axis is None:
        return [TensorSpec((count,), x.dtype)]
    return [TensorSpec(x.shape[:axis] + (count,) + x.shape[axis + 1:], x.dtype)]


def _num_elements(shape):
    return None if None in shape else int(np.prod(shape, dtype=np.int64))


def unique_count(x, axis):
    """How many distinct elements (axis None) or slices along `axis` x holds."""
    if axis is None:
        return np.unique(x.reshape(-1)).size
    return np.unique(x, axis=axis).shape[axis]


@define("unique", types=Types("x: T -> y: T, indices: int64, inverse_indices: int64, counts: int64",
                              T=dtypes.NUMERIC | {dtypes.bool_, dtypes.bfloat16}),
        attrs={"axis": Attr(AttrKind.INT, None), "sorted": Attr(AttrKind.BOOL, True)})
def _unique(inputs, attrs):
    """The distinct elements of x (flattened when no axis) or its distinct slices along
    `axis`; ascending, or in order of first occurrence if not `sorted`. Also where each
    first occurs in x, which one each element of x is, and how often each occurs."""
    x = inputs[0]
    axis = None if attrs["axis"] is None else normalize_axis(attrs["axis"], x.rank, "unique")
    n = None if x.value is None else unique_count(_value(x), axis)
    length = _num_elements(x.shape) if axis is None else x.shape[axis]
    y = (n,) if axis is None else x.shape[:axis] + (n,) + x.shape[axis + 1:]
    return [TensorSpec(y, x.dtype), TensorSpec((n,), dtypes.int64), TensorSpec((length,), dtypes.int64),
            TensorSpec((n,), dtypes.int64)]


def _corners(boxes, center_point_box):
    """(y1, x1, y2, x2) with y1 <= y2 and x1 <= x2, from ONNX's corner or centre layout."""
    if center_point_box:
        xc, yc, w, h = np.moveaxis(boxes, -1, 0)
        return yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2
    y1, x1, y2, x2 = np.moveaxis(boxes, -1, 0)
    return np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)


def non_max_suppression(boxes, scores, attrs):
    """ONNX's NonMaxSuppression: (batch, class, box) int64 rows, batch by batch and class by
    class, each class's boxes greedily by falling score (ties: lower index first), dropping
    those whose IoU with one kept is above the threshold."""
    limit = attrs["max_output_boxes_per_class"]
    y1, x1, y2, x2 = (np.asarray(c, np.float64) for c in _corners(np.asarray(boxes, np.float64),
                                                                   attrs["center_point_box"]))
    corners = np.stack([y1, x1, y2, x2, (y2 - y1) * (x2 - x1)], -1)  # (batches, n, 5)
    rows = []
    for b, c in np.ndindex(*scores.shape[:2]):
        s = scores[b, c]
        order = np.argsort(-s.astype(np.float64), kind="stable")
        if attrs["score_threshold"] is not None:
            order = order[s[order] > attrs["score_threshold"]]
        kept = _greedy(corners[b], order, attrs["iou_threshold"], limit)
        rows += [(b, c, k) for k in kept]
    return np.array(rows, np.int64).reshape(-1, 3)


# A compiled stand-in for _in_blocks (the same arguments, the same boxes kept), or None:
# interp/kernels/select.py sets it to jit.py's greedy loop (`nms_group`), which returns None
# where numba is not loaded (_in_blocks then). The ops stay numpy's; the interpreter's
# value inference, where a NonMaxSuppression's rows are made (a staged plan's boundary),
# reaches it through here.
group_pass = None


def _overlaps(a, b, threshold):
    """[len(a), len(b)]: whether box a[i] overlaps b[j] by IoU above `threshold` (rows of
    y1, x1, y2, x2, area; boxes of no area overlap nothing)."""
    inter = (np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
             * np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None))
    union = a[:, None, 4] + b[None, :, 4] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return (inter > 0) & (a[:, None, 4] > 0) & (b[None, :, 4] > 0) & (inter / union > threshold)


def _greedy(boxes, order, threshold, limit):
    """Indices NMS keeps of `boxes` taken in `order`: a box is kept unless one kept before
    it overlaps it. Boxes whose x ranges do not meet cannot overlap, so the boxes fall into
    groups along x (sorted by x1, a group ends where no box so far reaches past the next
    box's x1), and each group's choices depend on its own boxes alone: a group of one box
    keeps it, a larger one runs the greedy pass by itself (`_in_blocks`), and the kept boxes
    of all groups, back in `order`'s order, are cut to `limit`. torchvision's batched NMS
    shifts each class's boxes apart, so its classes are groups of their own: SSDlite's
    27,000 candidates in 91 classes took 3.2 s as one pass over all of them."""
    n = order.size
    if n < 2:
        return _in_blocks(boxes, order, threshold, limit)
    x1, x2 = boxes[order, 1], boxes[order, 3]
    by_x = np.argsort(x1, kind="stable")
    reach = np.maximum.accumulate(x2[by_x])
    starts = np.ones(n, bool)
    starts[1:] = x1[by_x][1:] >= reach[:-1]  # NaN reaches on: the rest stays in one group
    group = np.empty(n, np.int64)
    group[by_x] = np.cumsum(starts) - 1
    counts = np.bincount(group)
    alone = counts[group] == 1
    kept = [np.flatnonzero(alone)]  # ranks in `order`
    crowded = np.flatnonzero(~alone)
    if crowded.size:
        rank = np.empty(len(boxes), np.int64)
        rank[order] = np.arange(n)
        members = crowded[np.argsort(group[crowded], kind="stable")]  # by group, each in rank order
        for part in np.split(members, np.cumsum(counts[counts > 1])[:-1]):
            chosen = None if group_pass is None else group_pass(boxes, order[part], threshold, limit)
            kept.append(rank[_in_blocks(boxes, order[part], threshold, limit) if chosen is None else chosen])
    return order[np.sort(np.concatenate(kept))[:limit]].tolist()


def _in_blocks(boxes, order, threshold, limit, block=64, elements=1 << 21):
    """_greedy's choice among `order`, a block of the best remaining boxes at a time: the
    greedy pass within it needs only their overlaps with each other; then every later box
    overlapped by one the block kept is dropped at once (blocks shrink so that this holds
    at most `elements`). The kept boxes' indices, in `order`'s order."""
    kept = []
    while order.size and len(kept) < limit:
        size = max(1, min(block, elements // order.size))
        head, order = order[:size], order[size:]
        among = _overlaps(boxes[head], boxes[head], threshold)
        alive, chosen = np.ones(len(head), bool), []
        for i in range(len(head)):
            if alive[i]:
                chosen.append(i)
                if len(kept) + len(chosen) == limit:
                    break
                alive &= ~among[i]
        kept += head[chosen].tolist()
        if order.size and len(kept) < limit:
            order = order[~_overlaps(boxes[head[chosen]], boxes[order], threshold).any(0)]
    return kept


@define("non_max_suppression", types=Types(
            "boxes: float32, scores: float32, max_output_boxes_per_class: int64?, iou_threshold: float32?, "
            "score_threshold: float32? -> int64"),
        attrs={"center_point_box": Attr(AttrKind.INT, 0), "max_output_boxes_per_class": Attr(AttrKind.INT, 0),
               "iou_threshold": Attr(AttrKind.FLOAT, 0.0), "score_threshold": Attr(AttrKind.FLOAT, None)},
        operands=("max_output_boxes_per_class", "iou_threshold", "score_threshold"),
        unknown=lambda own, attrs, operands: [TensorSpec((None, 3), dtypes.int64)])
def _non_max_suppression(inputs, attrs):
    """The boxes each class keeps, as ONNX's NonMaxSuppression: int64 rows (batch, class, box
    index). boxes (batches, n, 4) are corners [y1, x1, y2, x2] (or centres [xc, yc, w, h]
    with center_point_box); scores (batches, classes, n). At most max_output_boxes_per_class
    per class, scores above score_threshold, IoU with a kept box at most iou_threshold."""
    boxes, scores = inputs
    if boxes.rank != 3 or boxes.shape[2] not in (4, None) or scores.rank != 3:
        raise GraphError(f"non_max_suppression: boxes must be (batches, n, 4) and scores (batches, "
                         f"classes, n); got {fmt(boxes.shape)} and {fmt(scores.shape)}")
    for i, j in ((0, 0), (1, 2)):
        if None not in (boxes.shape[i], scores.shape[j]) and boxes.shape[i] != scores.shape[j]:
            raise GraphError(f"non_max_suppression: boxes {fmt(boxes.shape)} and scores {fmt(scores.shape)} "
                             "disagree on the batches or the number of boxes")
    if attrs["center_point_box"] not in (0, 1):
        raise GraphError(f"non_max_suppression: center_point_box must be 0 or 1, got {attrs['center_point_box']}")
    if boxes.value is not None and scores.value is not None:  # the rows themselves: not computed twice
        rows = non_max_suppression(np.asarray(boxes.value), np.asarray(scores.value), attrs)
        return [TensorSpec(rows.shape, dtypes.int64, rows)]
    return [TensorSpec((None, 3), dtypes.int64)]
