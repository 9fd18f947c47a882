"""Graph rewrites applied when packaging: constant folding, BatchNorm folding into the
conv or dense layer before it, a zero padding of the spatial axes folded into the convs
that read it, fusing an activation into the op that produces its input, x * sigmoid(x)
(SiLU as ONNX exports it) into one swish op, and GELU's tanh form written out in ops (GPT-2's)
into one gelu op. Dead nodes need no pass: `to_model` writes only what the signatures need.

Each pass mutates the graph and returns the signatures with replaced tensors updated.
"""
import numpy as np

from ..ops.registry import fused_activation
from .graph import CONST, PLACEHOLDER, Node, Tensor

FUSABLE = ("conv", "matmul", "add")


def optimize(graph, signatures):
    """All passes, in an order where each one's output feeds the next."""
    signatures = fold_constants(graph, signatures)
    signatures = fold_batch_norm(graph, signatures)
    signatures = fold_pads(graph, signatures)
    signatures = fuse_swish(graph, signatures)  # first: a swish op may then fuse into its producer
    signatures = fuse_tanh_gelu(graph, signatures)
    signatures = fuse_activations(graph, signatures)
    return signatures


def _consumers(graph, signatures):
    uses = {}
    for node in graph.nodes:
        for t in node.inputs:
            uses.setdefault(t, []).append(node)
    for sig in signatures.values():
        for t in sig[1].values():
            uses.setdefault(t, []).append(None)  # a signature output: used outside the graph
    return uses


def _replace(graph, signatures, old, new):
    """Every use of tensor `old` now reads `new`."""
    for node in graph.nodes:
        if old in node.inputs:
            node.inputs = [new if t is old else t for t in node.inputs]
    return {key: (sig[0], {n: new if t is old else t for n, t in sig[1].items()}, *sig[2:])
            for key, sig in signatures.items()}


def _insert_const(graph, before, value, name):
    """A constant node placed just before `before`, so the node order stays topological."""
    from ..ops.registry import TensorSpec
    value = np.ascontiguousarray(value)
    value.setflags(write=False)
    node = Node(graph, CONST, graph.unique_name(name), [], {"value": value}, before.device)
    node.outputs = [Tensor(node, 0, TensorSpec(value.shape, value.dtype, value))]
    graph.nodes.insert(graph.nodes.index(before), node)
    return node.outputs[0]


def fold_constants(graph, signatures):
    """Ops whose values are known (operands all constant, or static shapes) become constants."""
    for node in list(graph.nodes):
        if node.op in (CONST, PLACEHOLDER) or any(t.spec.value is None for t in node.outputs):
            continue
        if len(node.outputs) == 1:
            node.op, node.inputs = CONST, []
            node.attrs = {"value": node.outputs[0].spec.value}
            continue
        for t in node.outputs:
            signatures = _replace(graph, signatures, t, _insert_const(graph, node, t.spec.value, t.name))
    return signatures


def _const(t):
    return t.spec.value if t is not None and t.node.op == CONST else None


def _bn_factors(bn):
    """(f, shift) with batch_norm(y) == y * f + shift per channel, or None."""
    scale, beta, mean, var = (_const(t) for t in bn.inputs[1:5])
    if any(v is None for v in (scale, beta, mean, var)):
        return None
    f = scale / np.sqrt(var + np.asarray(bn.attrs["epsilon"], var.dtype))
    return f, beta - mean * f


def fold_batch_norm(graph, signatures):
    """conv -> batch_norm and matmul -> add(bias) -> batch_norm become one conv / matmul + add."""
    uses = _consumers(graph, signatures)
    for bn in [n for n in graph.nodes if n.op == "batch_norm"]:
        x = bn.inputs[0]
        factors = _bn_factors(bn)
        if factors is None or len(uses.get(x, ())) != 1:
            continue
        f, shift = factors
        producer = x.node
        if producer.op == "conv" and not producer.attrs["activation"] and _const(producer.inputs[1]) is not None:
            w = _const(producer.inputs[1])
            bias = _const(producer.inputs[2]) if len(producer.inputs) > 2 else np.zeros(w.shape[0], w.dtype)
            if bias is None:
                continue
            new_w = w * f.reshape((-1,) + (1,) * (w.ndim - 1))
            new_b = bias * f + shift
            producer.inputs = [producer.inputs[0],
                               _insert_const(graph, producer, new_w.astype(w.dtype), f"{producer.name}/w"),
                               _insert_const(graph, producer, new_b.astype(w.dtype), f"{producer.name}/b")]
        elif producer.op == "add" and not producer.attrs["activation"] and len(x.shape) == 2:
            mm, bias = producer.inputs[0].node, _const(producer.inputs[1])
            if mm.op != "matmul" or mm.attrs["activation"] or bias is None \
                    or _const(mm.inputs[1]) is None or len(uses.get(mm.outputs[0], ())) != 1:
                continue
            w = _const(mm.inputs[1])
            scaled = w * (f[:, None] if mm.attrs["transpose_b"] else f[None, :])
            mm.inputs = [mm.inputs[0], _insert_const(graph, mm, scaled.astype(w.dtype), f"{mm.name}/w")]
            producer.inputs = [producer.inputs[0],
                               _insert_const(graph, producer, (bias * f + shift).astype(w.dtype),
                                             f"{producer.name}/b")]
        else:
            continue
        signatures = _replace(graph, signatures, bn.outputs[0], x)
        graph.nodes.remove(bn)
    return signatures


def _zero_spatial_pads(pad):
    """(begin..., end...) of the spatial axes (all but the first two) a `pad` node adds,
    when it adds zeros there alone; else None."""
    x = pad.inputs[0]
    pads = pad.attrs["pads"] if len(pad.inputs) < 2 or pad.inputs[1] is None else _const(pad.inputs[1])
    value = pad.attrs["value"] if len(pad.inputs) < 3 or pad.inputs[2] is None else _const(pad.inputs[2])
    if pads is None or value is None or pad.attrs["mode"] != "constant" or x.dtype.kind != "f":
        return None
    pads, rank = [int(p) for p in np.asarray(pads).reshape(-1)], len(x.shape)
    value = np.asarray(value).reshape(-1)
    if rank < 3 or len(pads) != 2 * rank or value.size != 1 or float(value[0]) != 0 \
            or min(pads) < 0 or any(pads[a] or pads[rank + a] for a in (0, 1)):
        return None
    return pads[2:rank] + pads[rank + 2:]


def fold_pads(graph, signatures):
    """A constant-zero pad of the spatial axes read only by convs of explicit or VALID pads
    (TFLite's PAD before a VALID conv, Keras' ZeroPadding2D) becomes those convs' own padding: the
    conv reads its input padded anyway, so the pad's copy of the tensor goes."""
    uses = _consumers(graph, signatures)
    for pad in [n for n in graph.nodes if n.op == "pad"]:
        extra, out = _zero_spatial_pads(pad), pad.outputs[0]
        readers = uses.get(out, ())
        if extra is None or not readers or any(r is None or r.op != "conv" or r.inputs[0] is not out
                                               or out in r.inputs[1:] or r.attrs["auto_pad"] not in ("NOTSET", "VALID")
                                               for r in readers):
            continue
        for conv in readers:
            d = len(extra) // 2
            own = tuple(conv.attrs["pads"]) or (0,) * (2 * d)
            conv.attrs = {**conv.attrs, "auto_pad": "NOTSET", "pads": tuple(a + b for a, b in zip(own, extra))}
            conv.inputs = [pad.inputs[0]] + conv.inputs[1:]
        graph.nodes.remove(pad)
        uses = _consumers(graph, signatures)
    return signatures


def _activation_of(node):
    """The fused-activation name equal to this op, or None."""
    return fused_activation(node.op, node.attrs)


def fuse_activations(graph, signatures):
    """relu, relu6, swish or hard_swish right after a conv, matmul or add runs inside that
    op's kernel, on its output while it is in cache: EfficientNet's and MobileNetV3's
    activations then cost no pass over memory of their own. (Graphs that train are not
    optimized: a fused swish could not be differentiated, ops.registry.NEEDS_INPUT.)"""
    uses = _consumers(graph, signatures)
    for act in [n for n in graph.nodes if _activation_of(n)]:
        x = act.inputs[0]
        producer = x.node
        if producer.op not in FUSABLE or producer.attrs.get("activation") or len(uses.get(x, ())) != 1:
            continue
        if x.dtype.kind != "f":
            continue
        producer.attrs = {**producer.attrs, "activation": _activation_of(act)}
        signatures = _replace(graph, signatures, act.outputs[0], x)
        graph.nodes.remove(act)
        uses = _consumers(graph, signatures)
    return signatures


def fuse_swish(graph, signatures):
    """mul(x, sigmoid(x)) (either operand order), sigmoid's output read by that mul alone,
    becomes swish(x) (alpha 1): one pass over x instead of two, and no tensor in between."""
    uses = _consumers(graph, signatures)
    for mul in [n for n in graph.nodes if n.op == "mul"]:
        for x, s in (mul.inputs, mul.inputs[::-1]):
            if s.node.op == "sigmoid" and s.node.inputs[0] is x and len(uses.get(s, ())) == 1 \
                    and x.dtype.kind == "f" and x.shape == mul.outputs[0].shape:
                graph.nodes.remove(s.node)
                mul.op, mul.inputs, mul.attrs = "swish", [x], {"alpha": 1.0}
                break
    return signatures


def _scalar(t, value):
    """Whether t is a constant of one element within 1e-4 (relative) of `value`."""
    c = _const(t)
    return c is not None and np.size(c) == 1 and np.asarray(c).dtype.kind == "f" \
        and abs(float(np.asarray(c).reshape(-1)[0]) - value) <= 1e-4 * abs(value)


def _operands(node, op, scalar=None):
    """node's two operands (x, y) where node is a binary `op`, y the one that is the constant
    `scalar` when given; None otherwise."""
    if node is None or node.op != op or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if scalar is None:
        return a, b
    if _scalar(b, scalar):
        return a, b
    if _scalar(a, scalar):
        return b, a
    return None


def _only_read(t, uses):
    return t.node.op not in (CONST, PLACEHOLDER) and len(uses.get(t, ())) == 1


def _cube_of(t, uses):
    """The x of pow(x, 3), x * x * x or x * (x * x), where t is one and read once; else None."""
    if not _only_read(t, uses):
        return None
    node = t.node
    found = _operands(node, "pow")
    if found and _scalar(found[1], 3.0):
        return found[0]
    found = _operands(node, "mul")
    if found:
        for a, b in (found, found[::-1]):
            inner = _operands(b.node, "mul") if _only_read(b, uses) else None
            if inner and inner[0] is a and inner[1] is a:
                return a
    return None


def _tanh_gelu_input(top, uses):
    """The x of 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))) where mul node
    `top` computes it (operands in either order, the half on either product; each step's
    output read by the next alone), else None."""
    pair = _operands(top, "mul")
    if pair is None:
        return None
    for p, q in (pair, pair[::-1]):
        half = _operands(p.node, "mul", 0.5) if _only_read(p, uses) else None
        halved = _operands(q.node, "mul", 0.5) if half is None and _only_read(q, uses) else None
        if half is not None:  # (x * 0.5) * (1 + tanh(...))
            x, one_plus = half[0], q
        elif halved is not None:  # x * ((1 + tanh(...)) * 0.5)
            x, one_plus = p, halved[0]
        else:
            continue
        added = _operands(one_plus.node, "add", 1.0) if _only_read(one_plus, uses) else None
        if added is None or not _only_read(added[0], uses) or added[0].node.op != "tanh":
            continue
        scaled = added[0].node.inputs[0]
        inner = _operands(scaled.node, "mul", float(np.sqrt(2 / np.pi))) if _only_read(scaled, uses) else None
        if inner is None or not _only_read(inner[0], uses):
            continue
        terms = _operands(inner[0].node, "add")
        if terms is None:
            continue
        for a, b in (terms, terms[::-1]):
            cubic = _operands(b.node, "mul", 0.044715) if _only_read(b, uses) else None
            if a is x and cubic is not None and _cube_of(cubic[0], uses) is x:
                return x
    return None


def fuse_tanh_gelu(graph, signatures):
    """GELU's tanh approximation written out in ops (GPT-2's NewGELUActivation, exported as
    pow, three muls, two adds and a tanh) becomes one gelu op (approximate "tanh"), whose
    kernel is one pass (jit.py's gelu loop where numba is loaded): numpy's tanh alone took
    some 5 ns an element, and each of the seven ops a pass over the activations. GPT-2's
    (1, 1024, 3072) at its 1024 tokens, one thread: 27.1 ms a layer as the ops (Pow already
    as products), 8.3 as one gelu; the zoo's tiny gpt2 1.53x / 1.57x -> 1.35x / 1.38x
    onnxruntime's time (whose FastGelu fusion does the same). The intermediate ops are left
    to the writer, which drops what nothing reads."""
    uses = _consumers(graph, signatures)
    for mul in [n for n in graph.nodes if n.op == "mul"]:
        x = _tanh_gelu_input(mul, uses)
        if x is not None and x.dtype.kind == "f" and x.shape == mul.outputs[0].shape \
                and x.dtype == mul.outputs[0].dtype:
            mul.op, mul.inputs, mul.attrs = "gelu", [x], {"approximate": "tanh"}
    return signatures
