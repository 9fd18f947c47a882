"""Reduction, running-sum and top-k nodes (edgeflow/ops/reduce.py)."""
import numpy as np

from edgeflow.graph.math_ops import apply

from . import attrs_or_operands, first_int, handler, ints, unsupported

_REDUCE = {"ReduceSum": "reduce_sum", "ReduceMean": "reduce_mean", "ReduceMax": "reduce_max",
           "ReduceMin": "reduce_min", "ReduceProd": "reduce_prod", "ReduceL2": "reduce_l2",
           "ReduceLogSumExp": "reduce_log_sum_exp"}
# Global pooling is a reduction over the spatial axes.
_GLOBAL_POOL = {"GlobalAveragePool": "reduce_mean", "GlobalMaxPool": "reduce_max"}


def _axes(ctx, node):
    """(attrs, operands) giving a reduction's axes: an attribute (before opset 18), a
    constant input, or an input known only when running."""
    attrs, operands = attrs_or_operands(ctx, node, {"axes": (1, ints)})
    if not (attrs or operands):
        attrs = {"axes": tuple(node.attr("axes", ()))}
    if operands:  # empty axes known only when running: reduce none of them, or all
        attrs["noop_with_empty_axes"] = bool(node.attr("noop_with_empty_axes", 0))
    return {**attrs, "keepdims": bool(node.attr("keepdims", 1))}, operands


@handler(_REDUCE)
def _reduce(ctx, node):
    x = ctx.input(node, 0)
    attrs, operands = _axes(ctx, node)
    if "axes" in attrs and not attrs["axes"] and node.attr("noop_with_empty_axes", 0):
        return x
    out = node.outputs[0]
    if x.dtype == np.bool_ and node.op_type in ("ReduceMax", "ReduceMin"):
        # Any and all (opset 20): edgeflow's reductions are numeric, so reduce 0s and 1s.
        as_uint8 = apply("cast", [x], {"dtype": np.dtype(np.uint8)}, name=f"{out}/uint8")
        reduced = apply(_REDUCE[node.op_type], [as_uint8, *operands], attrs, name=f"{out}/reduced")
        return apply("cast", [reduced], {"dtype": np.dtype(np.bool_)}, name=out)
    return apply(_REDUCE[node.op_type], [x, *operands], attrs, name=out)


# Reductions spelled as a sum between elementwise ops, as ONNX's function bodies spell
# them: ONNX type -> (op before the sum, op after it); "square" is x * x.
_AROUND_SUM = {"ReduceSumSquare": ("square", None), "ReduceL1": ("abs", None), "ReduceLogSum": (None, "log")}


@handler({op_type: "reduce_sum" for op_type in _AROUND_SUM})
def _around_sum(ctx, node):
    """With noop_with_empty_axes and no axes, the sum is left out (the elementwise ops stay)."""
    x, out = ctx.input(node, 0), node.outputs[0]
    attrs, operands = _axes(ctx, node)
    before, after = _AROUND_SUM[node.op_type]
    noop = "axes" in attrs and not attrs["axes"] and node.attr("noop_with_empty_axes", 0)
    steps = [s for s in (before, None if noop else "reduce_sum", after) if s is not None]
    for i, step in enumerate(steps):
        name = out if i == len(steps) - 1 else f"{out}/{step}"
        if step == "square":
            x = apply("mul", [x, x], name=name)
        elif step == "reduce_sum":
            x = apply(step, [x, *operands], attrs, name=name)
        else:
            x = apply(step, [x], name=name)
    return x


@handler(_GLOBAL_POOL)
def _global_pool(ctx, node):
    x = ctx.input(node, 0)
    return apply(_GLOBAL_POOL[node.op_type], [x], {"axes": tuple(range(2, len(x.shape))), "keepdims": True},
                 name=node.outputs[0])


@handler({"ArgMax": "argmax", "ArgMin": "argmin"})
def _arg_index(ctx, node):
    attrs = {"axis": node.attr("axis", 0), "keepdims": bool(node.attr("keepdims", 1)),
             "select_last_index": bool(node.attr("select_last_index", 0))}
    return apply(node.op_type.lower(), [ctx.input(node, 0)], attrs, name=node.outputs[0])


_RUNNING = {"CumSum": "cumsum", "CumProd": "cumprod"}


@handler(_RUNNING)
def _running(ctx, node):
    attrs, operands = attrs_or_operands(ctx, node, {"axis": (1, first_int)})
    return apply(_RUNNING[node.op_type], [ctx.input(node, 0), *operands], {
        **attrs, "exclusive": bool(node.attr("exclusive", 0)), "reverse": bool(node.attr("reverse", 0))},
        name=node.outputs[0])


@handler("TopK", op="topk")
def _topk(ctx, node):
    attrs, operands = attrs_or_operands(ctx, node, {"k": (1, first_int)})
    values, indices = apply("topk", [ctx.input(node, 0), *operands], {
        **attrs, "axis": node.attr("axis", -1), "largest": bool(node.attr("largest", 1)),
        "sorted": bool(node.attr("sorted", 1))}, name=node.outputs[0])
    return [values, indices]


@handler("MeanVarianceNormalization", op="reduce_mean")
def _mean_variance_normalization(ctx, node):
    """(x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over `axes`, as ONNX's function body
    computes it."""
    x, out = ctx.input(node, 0), node.outputs[0]
    reduce = {"axes": tuple(node.attr("axes", (0, 2, 3))), "keepdims": True}
    mean = apply("reduce_mean", [x], reduce, name=f"{out}/mean")
    mean_of_squares = apply("reduce_mean", [apply("mul", [x, x], name=f"{out}/squares")], reduce,
                            name=f"{out}/mean_of_squares")
    variance = apply("sub", [mean_of_squares, apply("mul", [mean, mean], name=f"{out}/square_of_mean")],
                     name=f"{out}/variance")
    std = apply("add", [apply("sqrt", [variance], name=f"{out}/sqrt"), np.array(1e-9, x.dtype)], name=f"{out}/std")
    return apply("div", [apply("sub", [x, mean], name=f"{out}/centered"), std], name=out)


@handler("LpNormalization", op="reduce_l2")
def _lp_normalization(ctx, node):
    """x / ||x||_p along `axis` (p 1 or 2), 0 where the norm is 0."""
    x, out = ctx.input(node, 0), node.outputs[0]
    p, reduce = node.attr("p", 2), {"axes": (node.attr("axis", -1),), "keepdims": True}
    if p not in (1, 2):
        raise unsupported(node, f"LpNormalization with p={p} (ONNX defines p = 1 or 2)")
    if p == 2:
        norm = apply("reduce_l2", [x], reduce, name=f"{out}/norm")
    else:
        norm = apply("reduce_sum", [apply("abs", [x], name=f"{out}/abs")], reduce, name=f"{out}/norm")
    zero = np.zeros((), x.dtype)
    safe = apply("where", [apply("equal", [norm, zero], name=f"{out}/is_zero"), np.ones((), x.dtype), norm],
                 name=f"{out}/safe_norm")
    return apply("div", [x, safe], name=out)


@handler("RMSNormalization", op="reduce_mean")
def _rms_normalization(ctx, node):
    """x / sqrt(mean(x^2) + epsilon) * scale, the mean over axes [axis, rank), computed in
    float32 for half inputs (stash_type 1)."""
    x, scale, out = ctx.input(node, 0), ctx.input(node, 1), node.outputs[0]
    f32 = np.dtype(np.float32)
    work = apply("cast", [x], {"dtype": f32}, name=f"{out}/f32") if x.dtype == np.float16 else x
    reduce = {"axes": tuple(range(node.attr("axis", -1) % x.rank, x.rank)), "keepdims": True}
    mean_square = apply("reduce_mean", [apply("mul", [work, work], name=f"{out}/squares")], reduce,
                        name=f"{out}/mean_square")
    rms = apply("sqrt", [apply("add", [mean_square, np.array(node.attr("epsilon", 1e-5), work.dtype)],
                               name=f"{out}/eps")], name=f"{out}/rms")
    y = apply("div", [work, rms], name=f"{out}/normalized")
    if work is not x:
        y = apply("cast", [y], {"dtype": x.dtype}, name=f"{out}/half")
    return apply("mul", [y, scale], name=out)
