"""Checks a `.efl` buffer before anything else reads it.

Python's flatbuffers package has no verifier, and its generated accessors trust every
offset they meet; so this module is the only code that follows raw offsets in a file.
It works in two passes:

1. `_Walker`, a structural walk in the manner of the C++ `flatbuffers::Verifier` over
   the tables of schema.fbs (mirrored by `TABLES` below). Every vtable, field, offset,
   string and vector is checked for bounds and alignment before it is followed or
   decoded, and the walk decodes what it checked into plain Python values. Its work
   is capped by a budget proportional to the FlatBuffer's size, so shared or
   overlapping objects in a hostile file cannot make it superlinear. It never touches
   the weights: the FlatBuffer is size-prefixed, so its end is known up front.
2. Semantic checks on the decoded values, which build the ModelDef skeleton the
   reader hands out: version, indices, dtypes, shapes against buffer sizes, buffer
   placement, ops, attributes and input dtypes against `edgeflow.ops`, dataflow (one
   producer per tensor, no cycles), signatures, metadata (edgeflow's own entries:
   format/metadata.py).

Every problem raises FormatError naming where it is and what is wrong; no other
exception escapes, and nothing is allocated from a size that was not checked first.
"""
import struct
import sys
from dataclasses import dataclass
from math import prod
from typing import NamedTuple

from .. import dtypes, ops
from ..ops import control as control_ops
from ..errors import FormatError, GraphError
from . import metadata
from .model import (ALIGNMENT, FILE_IDENTIFIER, FORMAT_VERSION, ModelDef, OperatorDef,
                    QuantizationDef, SignatureDef, SubGraphDef, TensorDef)

MAX_RANK = 8
MAX_FLATBUFFER_SIZE = 2**31 - 1  # FlatBuffers' own limit: uoffsets are 32-bit
PLACEMENTS = ("", "device", "cloud")

_PREFIX = 4  # the uint32 size prefix before the FlatBuffer proper
_HEADER = 12  # size prefix, root offset, file identifier
# A file from our writer references each object once, so the walk reads at most the
# FlatBuffer's size. FlatBuffers allows sharing (e.g. one string used twice), so allow
# some re-reading; a hostile file that shares or overlaps more is refused, which keeps
# the walk and everything built from it linear in the FlatBuffer's size.
_SHARING_ALLOWANCE = 4

# --- The schema, as the walker sees it --------------------------------------------
# Field order is vtable slot order and must match schema.fbs exactly (checked by
# tests/format/test_schema.py). Types are written as in the .fbs: a scalar, `string`,
# an enum, a struct, a table, or `[...]` for a vector of any of these. Scalars may
# carry their schema default as a third element.

ENUMS = {"DType": "ubyte", "AttrType": "ubyte"}
STRUCTS = {"Buffer": (("offset", "ulong"), ("size", "ulong"))}
TABLES = {
    "Quantization": (("scale", "[float]"), ("zero_point", "[long]"), ("axis", "int", -1)),
    "Tensor": (("name", "string"), ("dtype", "DType"), ("shape", "[long]"),
               ("buffer", "int", -1), ("quantization", "Quantization"),
               ("is_variable", "bool")),
    "Attr": (("name", "string"), ("type", "AttrType"), ("i", "long"), ("f", "double"),
             ("s", "string"), ("ints", "[long]"), ("floats", "[double]")),
    "Operator": (("opcode_index", "uint"), ("inputs", "[int]"), ("outputs", "[int]"),
                 ("attrs", "[Attr]"), ("placement", "string")),
    "SubGraph": (("name", "string"), ("tensors", "[Tensor]"), ("operators", "[Operator]"),
                 ("inputs", "[int]"), ("outputs", "[int]")),
    "TensorMap": (("name", "string"), ("tensor", "int")),
    "Signature": (("key", "string"), ("inputs", "[TensorMap]"), ("outputs", "[TensorMap]"),
                  ("subgraph", "uint"), ("targets", "[uint]")),
    "Metadata": (("name", "string"), ("data", "[ubyte]")),
    "Model": (("version", "uint"), ("producer", "string"), ("description", "string"),
              ("opcodes", "[string]"), ("subgraphs", "[SubGraph]"), ("buffers", "[Buffer]"),
              ("signatures", "[Signature]"), ("metadata", "[Metadata]")),
}
ROOT = "Model"

_SCALAR_CODES = {"bool": "?", "ubyte": "B", "int": "i", "uint": "I", "long": "q",
                 "ulong": "Q", "float": "f", "double": "d"}
_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from


class _Field(NamedTuple):
    name: str
    slot: int  # byte position of the field's entry in the vtable
    size: int  # bytes the field occupies inside its table
    read: object  # (walker, position of the field) -> value
    absent: object  # the value when the vtable omits the field
    index: int  # the field's entry among the vtable's uint16s (2 + its slot number)
    align: int  # the alignment its position must have: min(size, 8)
    unpack: object  # a scalar's struct unpack_from (read without a call through the walker), else None


def _compile_field(slot, name, type_, default=None):
    type_ = ENUMS.get(type_, type_)
    size, read, absent = _field_reader(type_, default)
    unpack = struct.Struct("<" + _SCALAR_CODES[type_]).unpack_from if type_ in _SCALAR_CODES else None
    return _Field(name, 4 + 2 * slot, size, read, absent, 2 + slot, min(size, 8), unpack)


def _field_reader(type_, default):
    """(bytes in the table, read(walker, position), value when absent) for `type_`."""
    if type_ in _SCALAR_CODES:
        unpack = struct.Struct("<" + _SCALAR_CODES[type_]).unpack_from
        absent = default if default is not None else (False if type_ == "bool" else 0)
        return struct.calcsize(_SCALAR_CODES[type_]), lambda w, pos: unpack(w.buf, pos)[0], absent
    if type_ == "string":
        return 4, lambda w, pos: w.string(w.follow(pos)), ""
    if type_ in TABLES:
        return 4, lambda w, pos: w.table(w.follow(pos), type_), None
    if type_.startswith("["):
        read_vector = _compile_vector(ENUMS.get(type_[1:-1], type_[1:-1]))
        return 4, lambda w, pos: read_vector(w, w.follow(pos)), ()
    raise AssertionError(f"schema type {type_!r} unknown to the verifier")


def _compile_vector(elem):
    """(walker, vector position) -> tuple of decoded elements."""
    if elem == "ubyte":  # metadata blobs: keep them bytes
        return lambda w, pos: w.blob(pos)
    if elem in _SCALAR_CODES:
        code = _SCALAR_CODES[elem]
        return lambda w, pos: w.scalars(pos, code)
    if elem in STRUCTS:
        layout = struct.Struct("<" + "".join(_SCALAR_CODES[t] for _, t in STRUCTS[elem]))
        align = max(struct.calcsize(_SCALAR_CODES[t]) for _, t in STRUCTS[elem])
        return lambda w, pos: w.structs(pos, layout, align)
    if elem == "string":
        return lambda w, pos: tuple(w.string(p) for p in w.offsets(pos))
    if elem in TABLES:
        return lambda w, pos: tuple(w.table(p, elem) for p in w.offsets(pos))
    raise AssertionError(f"schema vector of {elem!r} unknown to the verifier")


_LAYOUT = {table: tuple(_compile_field(slot, *field) for slot, field in enumerate(fields))
           for table, fields in TABLES.items()}


class _Walker:
    """Bounds-checked reads of one FlatBuffer (bytes [4, end) of `buf`)."""

    def __init__(self, buf, end):
        self.buf, self.end = buf, end
        self.budget = _SHARING_ALLOWANCE * end

    def spend(self, nbytes):
        self.budget -= nbytes
        if self.budget < 0:
            raise FormatError("the FlatBuffer's objects overlap or are shared far more than "
                              "a well-formed file's are; refusing to walk it")

    def need(self, pos, size, align, what):
        if pos % align:
            raise FormatError(f"{what} at byte {pos} is not {align}-byte aligned")
        if pos < _PREFIX or pos + size > self.end:
            raise FormatError(f"{what} at byte {pos} ({size} bytes) lies outside the "
                              f"FlatBuffer (bytes {_PREFIX} to {self.end})")

    def follow(self, pos):
        """The position a uoffset at `pos` points to (forward, so walks terminate)."""
        offset = _U32(self.buf, pos)[0]
        if offset == 0:
            raise FormatError(f"offset at byte {pos} points to itself")
        return pos + offset

    def table(self, pos, name, only=None):
        """The table's fields as a dict (just field `only`, if given)."""
        self.need(pos, 4, 4, f"{name} table")
        vtable = pos - _I32(self.buf, pos)[0]
        self.need(vtable, 4, 2, f"vtable of the {name} table at byte {pos}")
        vsize, tsize = _U16(self.buf, vtable)[0], _U16(self.buf, vtable + 2)[0]
        if vsize < 4 or vsize % 2 or vtable + vsize > self.end:
            raise FormatError(f"vtable of the {name} table at byte {pos} has a bad size {vsize}")
        if tsize < 4 or pos + tsize > self.end:
            raise FormatError(f"{name} table at byte {pos} has a bad size {tsize}")
        self.spend(tsize)
        # The whole vtable in one read, and the fields in a loop here rather than a call each
        # (iris_landmark's 1,125 tables and 7,119 fields: its verify 27.2 -> 21.4 ms).
        entries = struct.unpack_from(f"<{vsize // 2}H", self.buf, vtable)
        count, buf, fields = len(entries), self.buf, {}
        for f in _LAYOUT[name]:
            if only is not None and only != f.name:
                continue
            at = entries[f.index] if f.index < count else 0
            if at == 0:
                fields[f.name] = f.absent
                continue
            if at < 4 or at + f.size > tsize:
                raise FormatError(f"field {name}.{f.name} of the table at byte {pos} lies "
                                  f"outside the table ({tsize} bytes)")
            if (pos + at) % f.align:
                raise FormatError(f"field {name}.{f.name} at byte {pos + at} is misaligned")
            fields[f.name] = f.unpack(buf, pos + at)[0] if f.unpack is not None else f.read(self, pos + at)
        return fields

    def length(self, pos, elem_size, elem_align, what):
        """Element count of the vector at `pos`, checked against the bytes left."""
        self.need(pos, 4, 4, what)
        n = _U32(self.buf, pos)[0]
        self.need(pos + 4, n * elem_size, elem_align, f"{what} of {n} elements")
        self.spend(4 + n * elem_size)
        return n

    def string(self, pos):
        n = self.length(pos, 1, 1, "string")
        self.need(pos + 4 + n, 1, 1, "string terminator")
        if self.buf[pos + 4 + n] != 0:
            raise FormatError(f"string at byte {pos} is not NUL-terminated")
        try:
            return str(self.buf[pos + 4:pos + 4 + n], "utf-8")
        except UnicodeDecodeError:
            raise FormatError(f"string at byte {pos} is not valid UTF-8") from None

    def blob(self, pos):
        n = self.length(pos, 1, 1, "byte vector")
        return bytes(self.buf[pos + 4:pos + 4 + n])

    def scalars(self, pos, code):
        size = struct.calcsize(code)
        n = self.length(pos, size, size, "vector")
        return struct.unpack_from(f"<{n}{code}", self.buf, pos + 4)

    def structs(self, pos, layout, align):
        n = self.length(pos, layout.size, align, "vector of structs")
        return tuple(layout.iter_unpack(self.buf[pos + 4:pos + 4 + n * layout.size]))

    def offsets(self, pos):
        n = self.length(pos, 4, 4, "vector of offsets")
        return [pos + 4 + 4 * k + u for k, u in
                enumerate(struct.unpack_from(f"<{n}I", self.buf, pos + 4))]


# --- Entry point --------------------------------------------------------------------

@dataclass
class VerifiedFile:
    """What `verify` found: the model without its weights, and where the weights are."""

    model: ModelDef  # TensorDef.data is still None
    buffer_of: list  # per subgraph, per tensor: its buffer index, or -1
    buffers: list  # per buffer: (absolute file offset, size in bytes)
    flatbuffer_size: int  # bytes from the file's start to the FlatBuffer's end
    file_size: int


def verify(buf, file_size=None):
    """Check a whole `.efl` file in `buf` (bytes-like); a VerifiedFile, or FormatError.

    With `file_size`, `buf` may hold just the file's leading FlatBuffer: the writer
    checks what it is about to write before it streams any weights.
    """
    view = _byte_view(buf)
    file_size = len(view) if file_size is None else file_size
    end = _flatbuffer_end(view, file_size)
    walker = _Walker(view, end)
    root = _PREFIX + _U32(view, _PREFIX)[0]
    # The version first: a newer file should say so, not fail on a layout it changed.
    _check_version(walker.table(root, ROOT, only="version")["version"])
    return _check_model(walker.table(root, ROOT), end, file_size)


MAX_DIM = 2**31 - 1  # TFLite's tensor details give shapes as int32


def check_runnable(model, max_tensor_bytes):
    """FormatError unless a verified `model` is one the interpreter can run: it has a
    subgraph; every dimension fits int32 and no declared tensor the interpreter would
    allocate (its dynamic dims at 1, a quantized constant as the float32 it becomes; not
    the constants it maps from the file) needs more than `max_tensor_bytes`;
    signatures run subgraph 0, feed no constant, and each output is produced by an op,
    fed, or a constant or variable; so are the inputs and outputs of the subgraphs that
    ops run (and of subgraph 0 when there is no signature)."""
    if not model.subgraphs:
        raise FormatError("the model has no subgraph: nothing to run")
    for k, sg in enumerate(model.subgraphs):
        where = _label("subgraph", k, sg.name)
        for i, t in enumerate(sg.tensors):
            here = f"{where}: {_label('tensor', i, t.name)}"
            if any(d > MAX_DIM for d in t.shape):
                _fail(here, f"dimension {max(t.shape)} of shape {t.shape} exceeds {MAX_DIM}, the "
                            "largest the interpreter's tensor details (int32) hold")
            constant = t.data is not None and not t.is_variable
            if constant and t.quantization is None:
                continue  # mapped from the file, not allocated
            dtype = dtypes.float32 if constant else t.dtype  # quantized: dequantized when planned
            size = prod(max(d, 1) for d in t.shape) * dtype.itemsize
            if size > max_tensor_bytes:
                _fail(here, f"shape {t.shape} of {dtype} needs {size} bytes, more than "
                            f"max_tensor_bytes={max_tensor_bytes} allows")
        if k:
            _check_io(where, sg, [(sg.tensors[t].name, t) for t in sg.inputs],
                      [(sg.tensors[t].name, t) for t in sg.outputs])
    main = model.subgraphs[0]
    for k, sig in enumerate(model.signatures):
        where = _label("signature", k, sig.key)
        if sig.subgraph != 0:
            _fail(where, f"runs subgraph {sig.subgraph}; the interpreter runs signatures of subgraph 0 "
                         "(other subgraphs are run by ops)")
        _check_io(where, main, sig.inputs.items(), sig.outputs.items())
    if not model.signatures:
        _check_io(_label("subgraph", 0, main.name), main, [(main.tensors[t].name, t) for t in main.inputs],
                  [(main.tensors[t].name, t) for t in main.outputs])


def _check_io(where, sg, inputs, outputs):
    """Inputs are not constants; each output is made by an op, fed, or held (constant, variable)."""
    fed = set()
    for name, t in inputs:
        tensor = sg.tensors[t]
        if tensor.data is not None and not tensor.is_variable:
            _fail(where, f"input {name[:40]!r} is {_label('tensor', t, tensor.name)}, a constant: "
                         "it cannot be fed")
        fed.add(t)
    produced = {t for op in sg.operators for t in op.outputs}
    for name, t in outputs:
        if t not in produced and t not in fed and sg.tensors[t].data is None:
            _fail(where, f"output {name[:40]!r} is {_label('tensor', t, sg.tensors[t].name)}, which no "
                         "operator produces, no input feeds and no constant holds")


def _byte_view(buf):
    try:
        view = memoryview(buf)
    except TypeError:
        raise FormatError(f"expected a bytes-like object, got {type(buf).__name__}") from None
    if not view.c_contiguous:
        raise FormatError("the buffer is not contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _flatbuffer_end(view, file_size):
    if len(view) < _HEADER:
        raise FormatError(f"file too short: {len(view)} bytes (an .efl file starts with a "
                          f"{_HEADER}-byte header)")
    ident = bytes(view[8:12])
    if ident != FILE_IDENTIFIER:
        raise FormatError(f"not an .efl file: identifier {ident!r}, expected {FILE_IDENTIFIER!r}")
    size = _U32(view, 0)[0]
    if size < _HEADER - _PREFIX or size > MAX_FLATBUFFER_SIZE:
        raise FormatError(f"bad FlatBuffer size {size}")
    if _PREFIX + size > min(len(view), file_size):
        raise FormatError(f"FlatBuffer of {size} bytes runs past the end of the file "
                          f"({file_size} bytes): truncated?")
    return _PREFIX + size


# --- Semantic checks ------------------------------------------------------------------

def _fail(where, message):
    raise FormatError(f"{where}: {message}")


def _label(kind, index, name):
    shown = name if len(name) <= 40 else name[:37] + "..."
    return f"{kind} {index} {shown!r}"


def _check_version(version):
    if version != FORMAT_VERSION:
        raise FormatError(f"format version {version} is not supported "
                          f"(this reader reads version {FORMAT_VERSION})")


def _check_model(raw, fb_end, file_size):
    opdefs = [_opdef(k, name) for k, name in enumerate(raw["opcodes"])]
    buffers = [_check_buffer(k, b, fb_end, file_size) for k, b in enumerate(raw["buffers"])]
    checked = [_subgraph(k, sg, opdefs, buffers) for k, sg in enumerate(raw["subgraphs"])]
    subgraphs = [sg for sg, _ in checked]
    _check_control(subgraphs, [b for _, b in checked])
    model = ModelDef(subgraphs=subgraphs, signatures=_signatures(raw["signatures"], subgraphs),
                     metadata=_metadata(raw["metadata"]), description=raw["description"],
                     producer=raw["producer"], version=raw["version"])
    metadata.check(model)
    return VerifiedFile(model, [b for _, b in checked], buffers, fb_end, file_size)


def _check_control(subgraphs, buffer_of):
    """Ops that run subgraphs (if, while) name subgraphs that exist, never reach themselves
    again, and agree with them in arity and dtypes; those subgraphs hold no variables."""
    def read(k, t):  # the dtype ops read: quantized constants are dequantized to float32
        tensor = subgraphs[k].tensors[t]
        return dtypes.float32 if tensor.quantization is not None and buffer_of[k][t] >= 0 else tensor.dtype

    calls, control = {k: set() for k in range(len(subgraphs))}, []
    for k, sg in enumerate(subgraphs):
        for i, op in enumerate(sg.operators):
            names = ops.get(op.opcode).subgraphs
            here = f"{_label('subgraph', k, sg.name)}: operator {i} {op.opcode!r}"
            for name in names:
                if not 0 <= op.attrs[name] < len(subgraphs):
                    _fail(here, f"attribute {name!r} names subgraph {op.attrs[name]}, but the model "
                                f"has {len(subgraphs)}")
                calls[k].add(op.attrs[name])
            if names:
                control.append((here, k, op))
    _check_acyclic(subgraphs, calls)
    for here, k, op in control:
        def signature(name):
            callee = op.attrs[name]
            return ([read(callee, t) for t in subgraphs[callee].inputs],
                    [subgraphs[callee].tensors[t].dtype for t in subgraphs[callee].outputs])
        problems = control_ops.check_subgraphs(op.opcode, op.attrs, [read(k, t) for t in op.inputs],
                                               [subgraphs[k].tensors[t].dtype for t in op.outputs], signature)
        if problems:
            _fail(here, "; ".join(problems))
    for k in sorted(set().union(*calls.values())):
        held = [t.name for t in subgraphs[k].tensors if t.is_variable]
        if held:
            _fail(_label("subgraph", k, subgraphs[k].name), f"is run by an op but holds variable "
                  f"{held[0][:40]!r}; variables live in the subgraphs signatures run, and reach "
                  "others as inputs")


def _check_acyclic(subgraphs, calls):
    """FormatError if a subgraph runs itself, directly or through others."""
    state = {}  # subgraph -> 1 while being walked, 2 once done
    for start in calls:
        if start in state:
            continue
        stack = [(start, iter(sorted(calls[start])))]
        state[start] = 1
        while stack:
            k, todo = stack[-1]
            callee = next(todo, None)
            if callee is None:
                state[k] = 2
                stack.pop()
            elif state.get(callee) == 1:
                path = [j for j, _ in stack[[j for j, _ in stack].index(callee):]] + [callee]
                _fail(_label("subgraph", callee, subgraphs[callee].name),
                      "runs itself: subgraphs " + " -> ".join(map(str, path)))
            elif callee not in state:
                state[callee] = 1
                stack.append((callee, iter(sorted(calls[callee]))))


def _opdef(index, name):
    opdef = ops.find(name)
    if opdef is None:
        _fail(_label("opcode", index, name), "not a known op (see edgeflow.ops.names())")
    return opdef


def _check_buffer(index, extent, fb_end, file_size):
    offset, size = extent
    where = f"buffer {index}"
    if offset % ALIGNMENT:
        _fail(where, f"offset {offset} is not {ALIGNMENT}-byte aligned")
    if offset < fb_end:
        _fail(where, f"offset {offset} lies inside the FlatBuffer (which ends at {fb_end})")
    if offset + size > file_size:
        _fail(where, f"bytes {offset} to {offset + size} run past the end of the file "
                     f"({file_size} bytes): truncated?")
    return offset, size


def _subgraph(index, raw, opdefs, buffers):
    """(SubGraphDef, buffer index per tensor) for one raw SubGraph table."""
    where = _label("subgraph", index, raw["name"])
    tensors, buffer_of = [], []
    for k, t in enumerate(raw["tensors"]):
        tensors.append(_tensor(f"{where}: {_label('tensor', k, t['name'])}", t, buffers))
        buffer_of.append(t["buffer"])
    inputs = _indices(f"{where}: inputs", raw["inputs"], tensors)
    outputs = _indices(f"{where}: outputs", raw["outputs"], tensors)
    for k, t in enumerate(tensors):
        if t.is_variable and buffer_of[k] < 0:
            _fail(f"{where}: {_label('tensor', k, t.name)}", "a variable needs a buffer with its initial value")
    # What ops read: the interpreter dequantizes quantized constants to float32 before any op runs.
    seen = [dtypes.float32 if t.quantization is not None and buffer_of[k] >= 0 and not t.is_variable
            else t.dtype for k, t in enumerate(tensors)]
    operators = [_operator(where, k, op, opdefs, tensors, seen) for k, op in enumerate(raw["operators"])]
    for k, op in enumerate(operators):
        written = [t for t in op.outputs if tensors[t].is_variable]
        if written:
            _fail(f"{where}: operator {k} {op.opcode!r}", f"outputs variable {written[0]}; variables "
                                                           "change only through assign ops")
        held = [t for t in op.outputs if buffer_of[t] >= 0]
        if held:
            _fail(f"{where}: operator {k} {op.opcode!r}", f"outputs {_label('tensor', held[0], tensors[held[0]].name)},"
                                                           " a constant (its value is in the file)")
    _check_dataflow(where, tensors, operators, inputs)
    return SubGraphDef(raw["name"], tensors, operators, inputs, outputs), buffer_of


def _tensor(where, raw, buffers):
    dtype = dtypes.from_code(raw["dtype"])
    if dtype is None:
        _fail(where, f"unknown dtype code {raw['dtype']}")
    shape = raw["shape"]
    if len(shape) > MAX_RANK:
        _fail(where, f"rank {len(shape)} exceeds the maximum of {MAX_RANK}")
    if any(d < -1 for d in shape):
        _fail(where, f"shape {shape} has a dimension below -1")
    # numpy refuses shapes whose non-zero dims span more bytes than an index can hold,
    # even for empty arrays; no real tensor comes near.
    if prod(max(d, 1) for d in shape) * dtype.itemsize > sys.maxsize:
        _fail(where, f"shape {shape} of {dtype} spans more than 2**63 bytes")
    if raw["buffer"] != -1:
        _check_constant(where, raw["buffer"], shape, dtype, buffers)
    quantization = _quantization(where, raw["quantization"], shape)
    return TensorDef(raw["name"], dtype, tuple(shape), None, quantization,
                     bool(raw["is_variable"]))


def _check_constant(where, index, shape, dtype, buffers):
    if not 0 <= index < len(buffers):
        _fail(where, f"buffer {index} out of range (model has {len(buffers)} buffers)")
    if -1 in shape:
        _fail(where, f"has constant data (buffer {index}) but a dynamic shape {shape}")
    need = prod(shape) * dtype.itemsize
    if buffers[index][1] != need:
        _fail(where, f"buffer {index} holds {buffers[index][1]} bytes, but shape {shape} "
                     f"of {dtype} needs {need}")


def _quantization(where, raw, shape):
    if raw is None:
        return None
    axis, scale, zero_point = raw["axis"], raw["scale"], raw["zero_point"]
    if axis == -1:
        want = 1
    elif 0 <= axis < len(shape) and shape[axis] >= 0:
        want = shape[axis]
    else:
        _fail(where, f"quantization axis {axis} is not -1 or a static axis of shape {shape}")
    if len(scale) != want:
        _fail(where, f"quantization has {len(scale)} scales, expected {want} "
                     f"(1 per tensor, or shape[axis] along axis {axis})")
    if zero_point and len(zero_point) != len(scale):
        _fail(where, f"quantization has {len(zero_point)} zero points for {len(scale)} scales "
                     f"(give one per scale, or none for all zero)")
    return QuantizationDef(scale, zero_point, axis)


def _indices(where, raw, tensors):
    for t in raw:
        if not 0 <= t < len(tensors):
            _fail(where, f"tensor {t} out of range (subgraph has {len(tensors)} tensors)")
    return list(raw)


def _operator(where, index, raw, opdefs, tensors, seen):
    """The OperatorDef of `raw`, checked against its op; `seen`: the dtype ops read of each tensor."""
    if raw["opcode_index"] >= len(opdefs):
        _fail(f"{where}: operator {index}", f"opcode index {raw['opcode_index']} out of range "
                                            f"(model has {len(opdefs)} opcodes)")
    opdef = opdefs[raw["opcode_index"]]
    here = f"{where}: operator {index} {opdef.name!r}"
    inputs = _indices(f"{here}: inputs", raw["inputs"], tensors)
    outputs = _indices(f"{here}: outputs", raw["outputs"], tensors)
    try:
        opdef.check_arity(len(inputs))
    except GraphError as e:
        _fail(here, str(e))
    attrs = _attrs(here, opdef, raw["attrs"])
    try:
        opdef.check_dtypes([seen[t] for t in inputs], attrs)
    except GraphError as e:
        _fail(here, str(e))
    try:
        count = opdef.output_count(attrs)
    except (GraphError, TypeError, ValueError) as e:
        _fail(here, f"attributes do not give an output count: {e}")
    if count is not None and len(outputs) != count:  # None: checked against its subgraphs
        _fail(here, f"{opdef.name} has {count} outputs, the file lists {len(outputs)}")
    if raw["placement"] not in PLACEMENTS:
        _fail(here, f"placement {raw['placement'][:40]!r} is not one of {PLACEMENTS}")
    if opdef.stateful and not tensors[inputs[0]].is_variable:
        _fail(here, f"{opdef.name} writes tensor {inputs[0]} {tensors[inputs[0]].name[:40]!r}, "
                    "which is not a variable")
    return OperatorDef(opdef.name, inputs, outputs, attrs, raw["placement"])


def _attrs(where, opdef, raws):
    """The op's attributes in canonical form, defaults filled in as check_attrs does."""
    given = {}
    for raw in raws:
        name = raw["name"]
        spec = opdef.attrs.get(name)
        if spec is None:
            _fail(where, f"unknown attribute {name[:40]!r}; {opdef.name} has {sorted(opdef.attrs)}")
        if name in given:
            _fail(where, f"attribute {name!r} appears twice")
        if raw["type"] != spec.kind:
            _fail(where, f"attribute {name!r} is stored as {_kind_name(raw['type'])}, "
                         f"but {opdef.name} declares it {spec.kind.name}")
        given[name] = _attr_value(f"{where}: attribute {name!r}", spec.kind, raw)
    for name, spec in opdef.attrs.items():
        if name not in given and spec.default is ops.REQUIRED:
            _fail(where, f"attribute {name!r} ({spec.kind.name}) is required but missing")
    return {name: given.get(name, spec.default) for name, spec in opdef.attrs.items()}


def _kind_name(code):
    try:
        return ops.AttrKind(code).name
    except ValueError:
        return f"unknown type {code}"


# Which Attr field holds a value of each kind (as in schema.fbs's AttrType comments).
_ATTR_FIELD = {ops.AttrKind.INT: "i", ops.AttrKind.FLOAT: "f", ops.AttrKind.BOOL: "i",
               ops.AttrKind.STRING: "s", ops.AttrKind.INTS: "ints",
               ops.AttrKind.FLOATS: "floats", ops.AttrKind.DTYPE: "i",
               ops.AttrKind.SUBGRAPH: "i"}


def _attr_value(where, kind, raw):
    value = raw[_ATTR_FIELD[kind]]
    if kind == ops.AttrKind.BOOL:
        if value not in (0, 1):
            _fail(where, f"BOOL value {value} is not 0 or 1")
        return bool(value)
    if kind == ops.AttrKind.DTYPE:
        if dtypes.from_code(value) is None:
            _fail(where, f"unknown dtype code {value}")
        return dtypes.from_code(value)
    return value


def _check_dataflow(where, tensors, operators, inputs):
    """Each tensor has at most one producer, inputs have none, and ops form a DAG."""
    producer = {}
    for k, op in enumerate(operators):
        for t in op.outputs:
            if t in producer:
                _fail(where, f"{_label('tensor', t, tensors[t].name)} is produced by operators "
                             f"{producer[t]} and {k}")
            producer[t] = k
    for t in inputs:
        if t in producer:
            _fail(where, f"input {_label('tensor', t, tensors[t].name)} is produced by "
                         f"operator {producer[t]}")
    cycle = _find_cycle(operators, producer)
    if cycle:
        steps = [f"{k} {operators[k].opcode!r}" for k in cycle]
        if len(steps) > 9:  # keep the message readable
            steps = steps[:4] + [f"({len(steps) - 8} more)"] + steps[-4:]
        _fail(where, f"operators form a cycle: {' -> '.join(steps)}")


def _find_cycle(operators, producer):
    """Operator indices along a cycle in dataflow order (first repeated last), or None.

    Kahn's algorithm; the ops it cannot order all wait on another op it cannot order.
    """
    deps = [{producer[t] for t in op.inputs if t in producer} for op in operators]
    users = [[] for _ in operators]
    for k, ds in enumerate(deps):
        for d in ds:
            users[d].append(k)
    waiting = [len(ds) for ds in deps]
    ready = [k for k, n in enumerate(waiting) if n == 0]
    for k in ready:  # `ready` grows while we walk it
        for u in users[k]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    if len(ready) == len(operators):
        return None
    k, seen = next(i for i, n in enumerate(waiting) if n > 0), {}  # op -> step
    while k not in seen:  # walk from consumers back to producers until one repeats
        seen[k] = len(seen)
        k = next(d for d in deps[k] if waiting[d] > 0)
    cycle = list(seen)[seen[k]:][::-1]
    return cycle + cycle[:1]


def _signatures(raws, subgraphs):
    signatures, keys = [], set()
    for k, raw in enumerate(raws):
        where = _label("signature", k, raw["key"])
        if raw["key"] in keys:
            _fail(where, "key appears more than once")
        keys.add(raw["key"])
        if raw["subgraph"] >= len(subgraphs):
            _fail(where, f"subgraph {raw['subgraph']} out of range "
                         f"(model has {len(subgraphs)} subgraphs)")
        tensors = subgraphs[raw["subgraph"]].tensors
        inputs = _tensor_map(f"{where}: inputs", raw["inputs"], tensors)
        outputs = _tensor_map(f"{where}: outputs", raw["outputs"], tensors)
        count = len(subgraphs[raw["subgraph"]].operators)
        bad = [t for t in raw["targets"] if t >= count]
        if bad:
            _fail(where, f"target operator {bad[0]} out of range (subgraph has {count} operators)")
        signatures.append(SignatureDef(raw["key"], inputs, outputs, raw["subgraph"],
                                       list(raw["targets"])))
    return signatures


def _tensor_map(where, raws, tensors):
    out = {}
    for raw in raws:
        if raw["name"] in out:
            _fail(where, f"name {raw['name'][:40]!r} appears more than once")
        if not 0 <= raw["tensor"] < len(tensors):
            _fail(where, f"{raw['name'][:40]!r}: tensor {raw['tensor']} out of range "
                         f"(subgraph has {len(tensors)} tensors)")
        out[raw["name"]] = raw["tensor"]
    return out


def _metadata(raws):
    out = {}
    for raw in raws:
        if raw["name"] in out:
            _fail("metadata", f"name {raw['name'][:40]!r} appears more than once")
        # An absent byte vector reads as the schema default, (): it is empty bytes.
        out[raw["name"]] = raw["data"] if isinstance(raw["data"], bytes) else b""
    return out
