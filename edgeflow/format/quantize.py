"""Weight quantization of a ModelDef: fp16 storage, or int8 with affine scales.

fp16: each large float32 constant is stored as float16 and a `cast` back to float32 is
inserted; the interpreter folds the cast once, while preparing. int8: each large float32
constant is stored as int8 with the format's quantization fields (symmetric, zero point
0): per output channel for conv weights (axis 0) and matmul weights (the output axis),
per tensor otherwise; the interpreter dequantizes it once, while preparing.
"""
import copy

import numpy as np

from .. import dtypes
from .model import OperatorDef, QuantizationDef, TensorDef

MIN_ELEMENTS = 64  # smaller constants (biases, norm scales) stay float32: they weigh little


def quantize(model, mode, exact_only=False):
    """A copy of `model` with its weights stored as `mode` ("fp16" or "int8").

    exact_only (fp16): only the weights that float16 holds exactly (a model whose
    weights came as float16, as MediaPipe's), so that nothing changes but the size."""
    if mode not in ("fp16", "int8"):
        raise ValueError(f"quantization mode must be 'fp16' or 'int8', got {mode!r}")
    model = copy.copy(model)
    model.subgraphs = [_quantize_subgraph(sg, mode, exact_only) for sg in model.subgraphs]
    model.metadata = {**model.metadata, "quantization": mode.encode()}
    return model


def _weights(subgraph):
    """Indices of the float32 constants worth quantizing: not small, and not the scales of
    (de)quantize ops, which float16 or int8 would round."""
    scales = {t for op in subgraph.operators if op.opcode in ("quantize_linear", "dequantize_linear")
              for t in op.inputs[1:]}
    return [i for i, t in enumerate(subgraph.tensors)
            if t.data is not None and not t.is_variable and t.quantization is None and i not in scales
            and t.dtype == dtypes.float32 and t.data.size >= MIN_ELEMENTS]


def _fp16_exact(data):
    with np.errstate(over="ignore"):
        return bool(np.array_equal(data.astype(np.float16).astype(np.float32), data, equal_nan=True))


def channel_axis(subgraph, index):
    """The output-channel axis of weight `index` if every consumer agrees on one, else None."""
    axes = set()
    for op in subgraph.operators:
        for position, t in enumerate(op.inputs):
            if t != index:
                continue
            rank = len(subgraph.tensors[t].shape)
            if op.opcode == "conv" and position == 1:
                axes.add(0)
            elif op.opcode == "matmul" and position == 1 and rank >= 2:
                axes.add(rank - 2 if op.attrs.get("transpose_b") else rank - 1)
            else:
                axes.add(None)
    return axes.pop() if len(axes) == 1 else None


def int8_symmetric(data, axis):
    """(q, scales): data ~= q * scale, q in [-127, 127], scale per slice along `axis`."""
    reduce_axes = tuple(a for a in range(data.ndim) if a != axis) if axis is not None else None
    peak = np.abs(data).max(axis=reduce_axes, keepdims=True) if data.size else np.zeros(1)
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(data / scale), -127, 127).astype(np.int8)
    return q, scale.reshape(-1)


def _quantize_subgraph(sg, mode, exact_only=False):
    tensors, operators = list(sg.tensors), list(sg.operators)
    for i in _weights(sg):
        t = tensors[i]
        if exact_only and not _fp16_exact(t.data):
            continue
        if mode == "int8":
            axis = channel_axis(sg, i)
            q, scale = int8_symmetric(t.data, axis)
            tensors[i] = TensorDef(t.name, dtypes.int8, t.shape, q,
                                   QuantizationDef(tuple(scale.tolist()), (),
                                                   -1 if axis is None else axis))
        else:
            half = len(tensors)
            tensors.append(TensorDef(f"{t.name}/fp16", dtypes.float16, t.shape, t.data.astype(np.float16)))
            tensors[i] = TensorDef(t.name, t.dtype, t.shape)
            # The cast goes first: it must run before any consumer, and needs no input.
            operators.insert(0, OperatorDef("cast", [half], [i], {"dtype": dtypes.float32}))
    return type(sg)(sg.name, tensors, operators, list(sg.inputs), list(sg.outputs))


def absorb_dequantize(model):
    """A copy of `model` in which each dequantize_linear of integer constants (a
    converter's quantized weights) is gone: its input carries the format's quantization
    fields instead, which the interpreter dequantizes once, while preparing. Tensors no
    longer used are dropped."""
    model = copy.copy(model)
    subgraphs, renames = [], []
    for k, sg in enumerate(model.subgraphs):
        sg, remap = _absorb(sg, [s for s in model.signatures if s.subgraph == k])
        subgraphs.append(sg)
        renames.append(remap)
    model.subgraphs = subgraphs
    model.signatures = [_resigned(s, renames[s.subgraph]) for s in model.signatures]
    return model


def _resigned(s, remap):
    tensors, ops = remap
    s = copy.copy(s)
    s.inputs = {n: tensors[t] for n, t in s.inputs.items()}
    s.outputs = {n: tensors[t] for n, t in s.outputs.items()}
    s.targets = [ops[i] for i in s.targets]
    return s


def _absorb(sg, signatures):
    tensors, operators, kept_ops = list(sg.tensors), [], {}
    readers = {}
    for op in sg.operators:
        for t in op.inputs:
            readers[t] = readers.get(t, 0) + 1
    replaced = {}  # dequantized output -> the quantized constant that replaces it
    for i, op in enumerate(sg.operators):
        ins = [tensors[t] for t in op.inputs]
        if (op.opcode == "dequantize_linear" and all(t.data is not None and not t.is_variable for t in ins)
                and ins[0].dtype in (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32)
                and ins[0].quantization is None and readers[op.inputs[0]] == 1):
            x, scale = ins[0], np.asarray(ins[1].data, np.float32).reshape(-1)
            zero = np.asarray(ins[2].data).reshape(-1) if len(ins) > 2 else np.zeros(0, np.int64)
            axis = op.attrs["axis"] % x.data.ndim if scale.size > 1 else -1
            tensors[op.inputs[0]] = TensorDef(x.name, x.dtype, x.shape, x.data, QuantizationDef(
                tuple(float(v) for v in scale), tuple(int(v) for v in zero) if np.any(zero) else (), axis))
            replaced[op.outputs[0]] = op.inputs[0]
            continue
        kept_ops[i] = len(operators)
        operators.append(op)
    if not replaced:
        return sg, ({t: t for t in range(len(sg.tensors))}, {i: i for i in range(len(sg.operators))})
    swap = lambda t: replaced.get(t, t)  # noqa: E731
    operators = [OperatorDef(op.opcode, [swap(t) for t in op.inputs], list(op.outputs), op.attrs, op.placement)
                 for op in operators]
    outputs = [swap(t) for t in sg.outputs]
    used = set(sg.inputs) | set(outputs)
    for op in operators:
        used.update(op.inputs)
        used.update(op.outputs)
    for s in signatures:
        used.update(swap(t) for t in s.inputs.values())
        used.update(swap(t) for t in s.outputs.values())
    kept = [t for t in range(len(tensors)) if t in used]
    index = {t: k for k, t in enumerate(kept)}
    remap = {t: index[swap(t)] for t in range(len(tensors)) if swap(t) in index}
    operators = [OperatorDef(op.opcode, [index[t] for t in op.inputs], [index[t] for t in op.outputs], op.attrs,
                             op.placement) for op in operators]
    return type(sg)(sg.name, [tensors[t] for t in kept], operators, [index[t] for t in sg.inputs],
                    [index[t] for t in outputs]), (remap, kept_ops)
