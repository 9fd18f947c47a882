"""nonzero, compress and unique (edgeflow/ops/select.py) through the interpreter, against
numpy and a first-occurrence reference written here; sizes follow the values."""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply


def _run(op, arrays, attrs=None):
    g = ef.Graph()
    with g.as_default():
        feeds = {f"in{i}": ef.placeholder(a.dtype, [None] * a.ndim, name=f"in{i}") for i, a in enumerate(arrays)}
        outs = apply(op, list(feeds.values()), attrs or {})
        outs = outs if isinstance(outs, tuple) else (outs,)
        fetch = {f"out{i}": t for i, t in enumerate(outs)}
    interp = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": (feeds, fetch)})))
    got = interp.get_signature_runner("infer")(**{f"in{i}": a for i, a in enumerate(arrays)})
    return [got[f"out{i}"] for i in range(len(outs))]


@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 2)])
def test_nonzero(shape):
    x = (np.random.default_rng(0).random(shape) < 0.4).astype(np.float32)
    (got,) = _run("nonzero", [x])
    np.testing.assert_array_equal(got, np.array(np.nonzero(x), np.int64).reshape(len(shape), -1))


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress(axis):
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    condition = np.array([True, False, True])
    (got,) = _run("compress", [x, condition], {"axis": axis})
    np.testing.assert_array_equal(got, np.compress(condition, x, axis=axis))


def _first_occurrence_unique(values):
    """(unique, first index, inverse, counts) in order of first occurrence, by a dict."""
    first, counts = {}, {}
    for i, v in enumerate(values.tolist()):
        first.setdefault(v, i)
        counts[v] = counts.get(v, 0) + 1
    keys = list(first)
    return (np.array(keys, values.dtype), np.array([first[k] for k in keys]),
            np.array([keys.index(v) for v in values.tolist()]), np.array([counts[k] for k in keys]))


@pytest.mark.parametrize("sorted_", [True, False])
def test_unique_of_flattened(sorted_):
    x = np.array([[2, 1, 1], [3, 4, 3]], np.int64)
    got = _run("unique", [x], {"sorted": sorted_})
    if sorted_:
        want = np.unique(x.reshape(-1), return_index=True, return_inverse=True, return_counts=True)
    else:
        want = _first_occurrence_unique(x.reshape(-1))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_unique_rows():
    x = np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4]], np.float32)
    y, first, inverse, counts = _run("unique", [x], {"axis": 0})
    np.testing.assert_array_equal(y, [[1, 0, 0], [2, 3, 4]])
    np.testing.assert_array_equal(first, [0, 2])
    np.testing.assert_array_equal(inverse, [0, 0, 1])
    np.testing.assert_array_equal(counts, [2, 1])


def _nms_model(center_point_box, with_threshold):
    from onnx import TensorProto, helper
    inputs = ["boxes", "scores", "max_out", "iou"] + (["score"] if with_threshold else [])
    node = helper.make_node("NonMaxSuppression", inputs, ["selected"], center_point_box=center_point_box)
    vi = [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [None, None, 4]),
          helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, None, None]),
          helper.make_tensor_value_info("max_out", TensorProto.INT64, [1]),
          helper.make_tensor_value_info("iou", TensorProto.FLOAT, [1]),
          helper.make_tensor_value_info("score", TensorProto.FLOAT, [1])][:len(inputs)]
    graph = helper.make_graph([node], "nms", vi, [helper.make_tensor_value_info("selected", TensorProto.INT64, [None, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])


@pytest.mark.parametrize("center_point_box", [0, 1])
@pytest.mark.parametrize("with_threshold", [False, True])
def test_non_max_suppression_matches_onnxruntime(center_point_box, with_threshold):
    """Random overlapping boxes (some flipped corners, tied scores), fed thresholds: the
    same selection as onnxruntime, at several values of each operand."""
    import onnxruntime as ort
    from edgeflow.converters import onnx as onnx_converter
    model = _nms_model(center_point_box, with_threshold)
    runner = ef.Interpreter(writer.to_bytes(onnx_converter.convert(model).model)).get_signature_runner("infer")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(center_point_box + 2 * with_threshold)
    for batches, classes, n in ((1, 1, 6), (2, 3, 20), (1, 2, 300)):  # 300: several blocks of the greedy pass
        corners = rng.random((batches, n, 2)) * 10
        boxes = np.concatenate([corners, corners + rng.random((batches, n, 2)) * 4 - 1], -1).astype(np.float32)
        scores = np.round(rng.random((batches, classes, n)), 1).astype(np.float32)  # ties
        for max_out, iou, score in ((3, 0.5, 0.2), (100, 0.1, 0.0), (0, 0.5, 0.5)):
            feeds = {"boxes": boxes, "scores": scores, "max_out": np.array([max_out]),
                     "iou": np.array([iou], np.float32)}
            if with_threshold:
                feeds["score"] = np.array([score], np.float32)
            np.testing.assert_array_equal(runner(**feeds)["selected"], session.run(None, feeds)[0])


def _brute_force_nms(boxes, scores, iou_threshold, limit):
    """Greedy NMS, box by box by falling score (ties: lower index), each against every box
    kept so far: the definition, O(n * kept)."""
    y1, x1 = np.minimum(boxes[:, 0], boxes[:, 2]), np.minimum(boxes[:, 1], boxes[:, 3])
    y2, x2 = np.maximum(boxes[:, 0], boxes[:, 2]), np.maximum(boxes[:, 1], boxes[:, 3])
    area = (y2.astype(np.float64) - y1) * (x2.astype(np.float64) - x1)
    kept = []
    for i in np.argsort(-scores.astype(np.float64), kind="stable"):
        if len(kept) == limit:
            break
        k = np.array(kept, np.int64)
        inter = (np.clip(np.minimum(y2[k], y2[i]) - np.maximum(y1[k], y1[i]).astype(np.float64), 0, None)
                 * np.clip(np.minimum(x2[k], x2[i]) - np.maximum(x1[k], x1[i]).astype(np.float64), 0, None))
        with np.errstate(divide="ignore", invalid="ignore"):
            iou = inter / (area[k] + area[i] - inter)
        if not np.any((inter > 0) & (area[k] > 0) & (area[i] > 0) & (iou > iou_threshold)):
            kept.append(int(i))
    return kept


@pytest.mark.parametrize("limit", [10_000, 150, 7])
def test_non_max_suppression_of_boxes_shifted_apart_by_class(limit):
    """torchvision's batched NMS: each class's boxes shifted by the class times the largest
    coordinate, so that classes never overlap, all in one NonMaxSuppression class; some
    classes of one box, a box thinner than nothing, ties. The greedy pass runs per group of
    boxes whose x ranges meet; the kept boxes, cut to the limit in score order, are
    onnxruntime's and the brute-force definition's."""
    import onnxruntime as ort
    from edgeflow.converters import onnx as onnx_converter
    model = _nms_model(0, False)
    runner = ef.Interpreter(writer.to_bytes(onnx_converter.convert(model).model)).get_signature_runner("infer")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(limit)
    parts = []
    for c in range(40):
        count = 1 if c % 7 == 0 else int(rng.integers(2, 60))
        corners = rng.random((count, 2)) * 30
        parts.append(np.concatenate([corners, corners + rng.random((count, 2)) * 12], -1) + c * 50)
    boxes = np.concatenate(parts).astype(np.float32)
    boxes[3, 3] = boxes[3, 1]  # no area: overlaps nothing
    boxes = boxes[rng.permutation(len(boxes))][None]
    scores = np.round(rng.random((1, 1, boxes.shape[1])), 2).astype(np.float32)
    feeds = {"boxes": boxes, "scores": scores, "max_out": np.array([limit]), "iou": np.array([0.3], np.float32)}
    got = runner(**feeds)["selected"]
    np.testing.assert_array_equal(got, session.run(None, feeds)[0])
    np.testing.assert_array_equal(got[:, 2], _brute_force_nms(boxes[0], scores[0, 0], np.float32(0.3), limit))
    full = len(_brute_force_nms(boxes[0], scores[0, 0], np.float32(0.3), 10 ** 9))
    assert len(got) == min(limit, full) and full > 150  # the smaller limits cut across the groups


@pytest.mark.parametrize("limit", [0, 1, 9, 10 ** 6])
@pytest.mark.parametrize("iou", [0.0, 0.3, 0.7])
def test_the_compiled_greedy_pass_keeps_what_the_numpy_blocks_keep(monkeypatch, limit, iou):
    """jit.nms_group (numba, where loaded: the interpreter's kernels hand it to ops/select.py)
    against _in_blocks, numpy's pass in blocks of 64, and the brute-force definition: clusters
    of up to 300 boxes (several blocks), flipped corners, boxes of no area, a NaN corner and an
    infinite one, tied scores, limits that cut inside a group."""
    from edgeflow.interp.kernels import jit, select as select_kernels  # noqa: F401 (sets the hook)
    from edgeflow.ops import select
    assert jit.available() and select.group_pass is jit.nms_group
    rng = np.random.default_rng(limit + int(10 * iou))
    parts = []
    for c in range(12):
        count = int(rng.integers(1, 300 if c < 2 else 40))
        corners = rng.random((count, 2)) * 30
        parts.append(np.concatenate([corners, corners + rng.random((count, 2)) * 14 - 2], -1) + c * 60)
    boxes = np.concatenate(parts).astype(np.float32)
    boxes[5, 3] = boxes[5, 1]  # no area
    boxes[7, 0] = np.nan
    boxes[11, 2] = np.inf
    boxes = boxes[rng.permutation(len(boxes))][None]
    scores = np.round(rng.random((1, 1, boxes.shape[1])), 2).astype(np.float32)
    attrs = {"max_output_boxes_per_class": limit, "iou_threshold": iou, "score_threshold": None,
             "center_point_box": 0}
    calls = []
    monkeypatch.setattr(select, "group_pass", lambda *args: calls.append(1) or jit.nms_group(*args))
    with np.errstate(all="ignore"):  # as the interpreter runs it (inf - inf in numpy's union)
        got = select.non_max_suppression(boxes, scores, attrs)
        assert calls or limit == 0
        monkeypatch.setattr(select, "group_pass", None)
        np.testing.assert_array_equal(got, select.non_max_suppression(boxes, scores, attrs))
    np.testing.assert_array_equal(got[:, 2], _brute_force_nms(boxes[0], scores[0, 0], np.float32(iou), limit))
