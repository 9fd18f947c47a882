"""Mutants of small valid models, and running all of a model as a client would.

Seeds (`seeds()`) cover the ops that size their outputs from attributes or values (tile,
pad, resize, expand, constant_of_shape, range, nonzero, gather), control flow (while,
if), matrix products and a train step writing variables. `mutate` damages one: byte
flips, truncations, FlatBuffer words set to edge values, or a field changed in the model
(a dimension, an attribute, a constant's element, an op's wiring or opcode, a
signature's tensor) and written back. `run_everything` loads a file and calls every
signature on inputs of the declared shapes and dtypes (dynamic dims 2, integers in
[0, 3)), plus the tensor-level API; it returns the outcome's name.
"""
import copy
import importlib

import numpy as np

import edgeflow as ef
from edgeflow.errors import FormatError, InvalidInputError, UnsupportedOpError
from edgeflow.format import reader, writer
from edgeflow.graph.math_ops import apply
from edgeflow.ops.registry import AttrKind

ALLOWED = (FormatError, InvalidInputError, UnsupportedOpError)
MAX_TENSOR_BYTES = 64 * 2**20  # the bound the fuzzed interpreters run under

_save = importlib.import_module("edgeflow.graph.save")


def _shapes():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        tiled = apply("tile", [x, np.array([2, 1], np.int64)])
        padded = apply("pad", [tiled], {"pads": (0, 1, 0, 1)})
        resized = apply("resize", [ef.reshape(x, [-1, 1, 2, 2])], {"scales": (1.0, 1.0, 2.0, 2.0)})
        expanded = apply("expand", [ef.reduce_sum(x), np.array([3, 4], np.int64)])
        filled = apply("constant_of_shape", [apply("shape", [x])], {"value": 1.5})
        counted = apply("range", [np.int64(0), np.int64(5), np.int64(1)])
        picked = apply("gather", [x, np.array([0, 2], np.int64)], {"axis": 1})
        y = (ef.reduce_sum(padded) + ef.reduce_sum(resized) + ef.reduce_sum(expanded) + ef.reduce_sum(filled)
             + ef.reduce_sum(ef.cast(counted, ef.float32)) + ef.reduce_sum(picked))
    return _save.to_model(g, {"infer": ({"x": x}, {"y": y, "padded": padded, "resized": resized})})


def _dynamic():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None], name="x")
        n = ef.placeholder(ef.int64, [], name="n")
        where = apply("nonzero", [x])
        counted = apply("range", [np.int64(0), n, np.int64(1)])
        filled = apply("constant_of_shape", [ef.reshape(n, [1])], {"value": 2.0})
        tiled = apply("tile", [x, ef.reshape(n, [1])])
        y = (ef.reduce_sum(ef.cast(where, ef.float32)) + ef.reduce_sum(ef.cast(counted, ef.float32))
             + ef.reduce_sum(filled) + ef.reduce_sum(tiled))
    return _save.to_model(g, {"infer": ({"x": x, "n": n}, {"y": y})})


def _control():
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4], name="x")
        n = ef.placeholder(ef.int32, [], name="n")
        w = ef.constant(np.eye(4, dtype=np.float32) * 0.5)
        _, h = ef.while_loop(lambda i, h: i < n, lambda i, h: (i + 1, ef.tanh(ef.matmul(h, w)) + h),
                             [ef.constant(0), x], maximum_iterations=8)
        y = ef.cond(n > 2, lambda: h * 2.0, lambda: h - 1.0)
    return _save.to_model(g, {"infer": ({"x": x, "n": n}, {"y": y})})


def _trainable():
    rng = np.random.default_rng(0)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 3], name="x")
        y = ef.placeholder(ef.float32, [None, 2], name="y")
        w = ef.Variable(rng.standard_normal((3, 2)).astype(np.float32), name="W")
        b = ef.Variable(rng.standard_normal(2).astype(np.float32), name="b")
        pred = ef.nn.softmax(ef.add(x @ w, b))
        loss = ef.reduce_mean((pred - y) * (pred - y), name="loss")
        dw, db = ef.gradients(loss, [w, b])
        step = ef.group(w.assign_sub(dw * 0.1), b.assign_sub(db * 0.1))
    return _save.to_model(g, {"infer": ({"x": x}, {"pred": pred}),
                              "train": ({"x": x, "y": y}, {"loss": loss}, [step])})


def seeds():
    """[(name, file bytes)] of the seed models."""
    return [(f.__name__.strip("_"), writer.to_bytes(f())) for f in (_shapes, _dynamic, _control, _trainable)]


# --- running ----------------------------------------------------------------------------
def feeds_for(details, rng, key="shape_signature"):
    """Random inputs of the shapes in `details` (dynamic dims 2)."""
    out = {}
    for name, d in details.items():
        dtype, shape = np.dtype(d["dtype"]), tuple(2 if s < 0 else int(s) for s in d[key])
        if dtype.kind == "f":
            out[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            out[name] = rng.random(shape) < 0.5
        elif dtype.kind in "iu":
            out[name] = rng.integers(0, 3, shape).astype(dtype)
        else:  # bfloat16 and others: bits
            out[name] = np.zeros(shape, dtype)
    return out


def run_everything(data, max_tensor_bytes=MAX_TENSOR_BYTES, seed=0):
    """'ran', or the name of the allowed error the first refusal raised; other
    exceptions propagate (they are bugs)."""
    rng = np.random.default_rng(seed)
    outcome = "ran"
    try:
        interp = ef.Interpreter(bytes(data), max_tensor_bytes=max_tensor_bytes)
    except ALLOWED as e:
        return type(e).__name__
    for call in (interp.get_input_details, interp.get_output_details, interp.get_tensor_details):
        call()
    for key in interp.get_signature_list():
        try:
            runner = interp.get_signature_runner(key)
            runner(**feeds_for(runner.get_input_details(), rng))
        except ALLOWED as e:
            outcome = type(e).__name__ if outcome == "ran" else outcome
    try:
        interp.allocate_tensors()
        details = {d["index"]: d for d in interp.get_input_details()}
        for index, value in feeds_for(details, rng, "shape").items():
            interp.set_tensor(index, value)
        interp.invoke()
        interp.get_output_details()
    except ALLOWED as e:
        outcome = type(e).__name__ if outcome == "ran" else outcome
    return outcome


# --- field-level mutations --------------------------------------------------------------
DIMS = (-1, 0, 1, 2, 3, 7, 2**16, 2**20, 2**31 - 1, 2**31, 2**40)
INTS = (-2**63, -2**31, -3, -1, 0, 1, 2, 3, 8, 2**16, 2**20, 2**30, 2**31 - 1, 2**32, 2**40, 2**62, 2**63 - 1)
FLOATS = (0.0, -1.0, 0.5, 3.0, 1e4, 1e30, float("inf"), float("-inf"), float("nan"))


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def mutate_fields(data, rng, count=1):
    """`data` with `count` fields of its model changed (see the module), written back; None
    if the writer refuses the result."""
    model = copy.deepcopy(reader.load(bytes(data)))
    for _ in range(count):
        _mutate_field(model, rng)
    try:
        return writer.to_bytes(model)
    except (FormatError, ValueError, TypeError, OverflowError):
        return None


def _mutate_field(model, rng):
    sg = _pick(rng, model.subgraphs)
    kind = _pick(rng, ("dim", "attr", "attr", "const", "wire", "opcode", "signature"))
    if kind == "dim" and sg.tensors:
        t = _pick(rng, sg.tensors)
        if t.shape and t.data is None:
            k = int(rng.integers(len(t.shape)))
            t.shape = t.shape[:k] + (_pick(rng, DIMS),) + t.shape[k + 1:]
    elif kind == "attr" and sg.operators:
        op = _pick(rng, sg.operators)
        from edgeflow import ops
        specs = {n: s for n, s in ops.get(op.opcode).attrs.items()
                 if s.kind in (AttrKind.INT, AttrKind.INTS, AttrKind.FLOAT, AttrKind.FLOATS, AttrKind.BOOL)}
        if specs:
            name = _pick(rng, sorted(specs))
            kind = specs[name].kind
            if kind == AttrKind.INT:
                op.attrs[name] = _pick(rng, INTS)
            elif kind == AttrKind.BOOL:
                op.attrs[name] = not op.attrs[name]
            elif kind == AttrKind.FLOAT:
                op.attrs[name] = _pick(rng, FLOATS)
            else:
                values = list(op.attrs[name] or ())
                edge = INTS if kind == AttrKind.INTS else FLOATS
                if values and rng.random() < 0.7:
                    values[int(rng.integers(len(values)))] = _pick(rng, edge)
                else:
                    values = [_pick(rng, edge) for _ in range(int(rng.integers(0, 5)))]
                op.attrs[name] = tuple(values)
    elif kind == "const":
        held = [t for t in sg.tensors if t.data is not None and t.data.size]
        if held:
            t = _pick(rng, held)
            a = np.array(t.data)
            if a.dtype.kind in "iu":
                info = np.iinfo(a.dtype)
                a.flat[int(rng.integers(a.size))] = min(max(_pick(rng, INTS), info.min), info.max)
            elif a.dtype.kind == "f":
                a.flat[int(rng.integers(a.size))] = _pick(rng, FLOATS)
            elif a.dtype.kind == "b":
                a.flat[int(rng.integers(a.size))] ^= True
            t.data = a
    elif kind == "wire" and sg.operators and sg.tensors:
        op = _pick(rng, sg.operators)
        ends = op.inputs if rng.random() < 0.7 or not op.outputs else op.outputs
        if ends:
            ends[int(rng.integers(len(ends)))] = int(rng.integers(len(sg.tensors)))
    elif kind == "opcode" and len(sg.operators) > 1:
        op, other = _pick(rng, sg.operators), _pick(rng, sg.operators)
        op.opcode, op.attrs = other.opcode, dict(other.attrs)
    elif kind == "signature" and model.signatures:
        sig = _pick(rng, model.signatures)
        side = sig.inputs if rng.random() < 0.5 else sig.outputs
        if side:
            name = _pick(rng, sorted(side))
            side[name] = int(rng.integers(len(model.subgraphs[sig.subgraph].tensors)))


# --- byte-level mutations ---------------------------------------------------------------
KINDS = ("flip", "flips", "truncate", "edge", "overwrite", "field", "fields")


def flatbuffer_end(data):
    return 4 + int.from_bytes(data[:4], "little")


def _position(data, rng):
    """A byte position: half the time in the FlatBuffer (offsets, lengths, indices)."""
    end = flatbuffer_end(data) if rng.random() < 0.5 else len(data)
    return int(rng.integers(0, min(end, len(data))))


def mutate(data, kind, rng):
    """A mutant of `data` by `kind` (one of KINDS); None where a field change could not be
    written."""
    if kind == "fields" or kind == "field":
        return mutate_fields(data, rng, 1 if kind == "field" else int(rng.integers(2, 5)))
    damaged = bytearray(data)
    if kind == "truncate":
        return bytes(damaged[:_position(data, rng)])
    if kind in ("flip", "flips"):
        for _ in range(1 if kind == "flip" else int(rng.integers(2, 13))):
            damaged[_position(data, rng)] ^= int(rng.integers(1, 256))
    elif kind == "edge":  # an aligned 2-, 4- or 8-byte word of the FlatBuffer set to an edge value
        width = _pick(rng, (2, 4, 8))
        at = int(rng.integers(0, flatbuffer_end(data) // width)) * width
        top = 2**(8 * width)
        value = _pick(rng, (0, 1, 2, 3, 4, 8, 0x7F, 0x80, 0xFF, top // 2 - 1, top // 2, top - 4, top - 1,
                            int.from_bytes(rng.bytes(width), "little")))
        damaged[at:at + width] = value.to_bytes(width, "little")
    elif kind == "overwrite":
        start = int(rng.integers(0, flatbuffer_end(data)))
        junk = rng.integers(0, 256, int(rng.integers(1, 49)), dtype=np.uint8).tobytes()
        damaged[start:start + len(junk)] = junk[:len(damaged) - start]
    return bytes(damaged)


CONVERTED = ("digits_cnn", "qdq_cnn", "bigru", "lstm", "attention_mod")  # tests/data/onnx: fast to run


def converted_seeds(root):
    """[(name, file bytes)] of the CONVERTED ONNX models under `root` (needs onnx)."""
    from edgeflow.converters import onnx as onnx_converter
    return [(name, writer.to_bytes(onnx_converter.convert(f"{root}/{name}.onnx").model)) for name in CONVERTED]
