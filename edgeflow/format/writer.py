"""Writes a ModelDef as an `.efl` file: a size-prefixed FlatBuffer, then the weights.

Each distinct weight array (by object identity) becomes one buffer at a 64-byte-aligned
absolute file offset, and the arrays are streamed to the file one at a time, never
concatenated. Before any byte is written, the FlatBuffer is checked by the verifier
the reader runs, so the writer cannot produce a file that the reader refuses.
"""
import contextlib
import io
import operator
import struct
from dataclasses import dataclass

import flatbuffers
import numpy as np

from .. import dtypes, ops
from ..atomic import atomic_file
from ..errors import FormatError, GraphError
from . import verifier
from .efl import (Attr, Buffer, Metadata, Model, Operator, Quantization, Signature, SubGraph,
                  Tensor, TensorMap)
from .model import ALIGNMENT, FILE_IDENTIFIER, FORMAT_VERSION


def to_bytes(model):
    """The `.efl` encoding of `model` (a ModelDef); GraphError if it is malformed."""
    out = io.BytesIO()
    _stream(_plan(model), out)
    return out.getvalue()


def write(model, path):
    """Write `model` to `path` atomically: readers see the old file or the whole new one."""
    plan = _plan(model)  # a malformed model fails before the filesystem is touched
    with atomic_file(path) as f:
        _stream(plan, f)


@dataclass
class _Plan:
    """Everything a file holds, placed: the FlatBuffer, and each buffer's array and offset."""

    flatbuffer: bytearray
    arrays: list
    offsets: list
    file_size: int


def _plan(model, data_start=None):
    """The validated layout of `model`; `data_start` (a multiple of 64) moves the weights."""
    encoder = _Encoder()
    flatbuffer, buffers_at = encoder.model(model)
    start = _align(len(flatbuffer)) if data_start is None else data_start
    offsets, file_size = _place(start, [a.nbytes for a in encoder.arrays])
    _patch_offsets(flatbuffer, buffers_at, offsets)
    try:
        verifier.verify(flatbuffer, file_size=file_size)
    except FormatError as e:
        raise GraphError(f"invalid model: {e}") from None
    return _Plan(flatbuffer, encoder.arrays, offsets, file_size)


def _align(n):
    return -(-n // ALIGNMENT) * ALIGNMENT


def _place(start, sizes):
    """Aligned offsets for buffers of `sizes` from `start`, and the padded file size."""
    offsets, cursor = [], start
    for size in sizes:
        offsets.append(_align(cursor))
        cursor = offsets[-1] + size
    # Padding the end keeps even an empty buffer at the aligned cursor inside the file.
    return offsets, _align(cursor)


def _patch_offsets(flatbuffer, buffers_at, offsets):
    """Fill in buffer offsets, known only once the FlatBuffer's size is.

    The Buffer structs were written with offset 0: struct fields are never elided, so
    their values do not change the FlatBuffer's size.
    """
    for k, offset in enumerate(offsets):
        struct.pack_into("<Q", flatbuffer, buffers_at + 4 + k * Buffer.Buffer.SizeOf(), offset)


def _stream(plan, f):
    f.write(plan.flatbuffer)
    for offset, array in zip(plan.offsets, plan.arrays):
        f.seek(offset)  # the gap reads back as zeros
        f.write(_little_endian_bytes(array))
    f.seek(0, io.SEEK_END)  # after empty buffers, the end may lie before the cursor
    f.write(bytes(plan.file_size - f.tell()))  # tail padding, under 64 bytes


def _little_endian_bytes(array):
    """A flat uint8 view of `array` as the file stores it; copies only when it must."""
    a = np.ascontiguousarray(array)
    little = a.dtype.newbyteorder("<")
    if a.dtype != little:
        a = a.astype(little)
    return a.reshape(-1).view(np.uint8)


@contextlib.contextmanager
def _context(where):
    """Prefix GraphErrors raised inside with where in the model they arose."""
    try:
        yield
    except GraphError as e:
        raise GraphError(f"{where}: {e}") from None


def _int_array(values, dtype, what):
    """`values` as a 1-D little-endian numpy array; GraphError unless all are ints in range."""
    try:
        return np.array([operator.index(v) for v in values], dtype=dtype)
    except (TypeError, OverflowError):
        raise GraphError(f"{what}: expected ints that fit {np.dtype(dtype).name}, "
                         f"got {values!r}") from None


def _float_array(values, dtype, what):
    try:
        return np.array([float(v) for v in values], dtype=dtype)
    except (TypeError, ValueError):
        raise GraphError(f"{what}: expected floats, got {values!r}") from None


class _Encoder:
    """Builds the FlatBuffer, children before parents as FlatBuffers requires, and
    collects the distinct weight arrays on the way."""

    def __init__(self):
        self.b = flatbuffers.Builder(4096)
        self.opcodes = {}  # op name -> opcode index, in order of first use
        self.buffer_index = {}  # id(array) -> buffer index
        self.arrays = []

    def model(self, m):
        """The finished FlatBuffer, and the position of its buffers vector."""
        if m.version != FORMAT_VERSION:
            raise GraphError(f"can only write format version {FORMAT_VERSION}, not {m.version!r}")
        subgraphs = self.tables([self.subgraph(k, sg) for k, sg in enumerate(m.subgraphs)])
        signatures = self.tables([self.signature(k, s) for k, s in enumerate(m.signatures)])
        with _context("metadata"):
            metadata = self.tables([self.metadata(n, d) for n, d in m.metadata.items()])
        opcodes = self.tables([self.string(name) for name in self.opcodes])
        producer, description = self.string(m.producer), self.string(m.description)
        buffers = self.buffer_table()
        b = self.b
        Model.Start(b)
        Model.AddVersion(b, FORMAT_VERSION)
        Model.AddProducer(b, producer)
        Model.AddDescription(b, description)
        Model.AddOpcodes(b, opcodes)
        Model.AddSubgraphs(b, subgraphs)
        Model.AddBuffers(b, buffers)
        Model.AddSignatures(b, signatures)
        Model.AddMetadata(b, metadata)
        b.FinishSizePrefixed(Model.End(b), FILE_IDENTIFIER)
        out = b.Output()
        # Offsets from the builder count from the buffer's end.
        return out, len(out) - buffers

    def subgraph(self, index, sg):
        with _context(f"subgraph {index} {sg.name!r}"):
            tensors = self.tables([self.tensor(k, t) for k, t in enumerate(sg.tensors)])
            operators = self.tables([self.operator(k, op) for k, op in enumerate(sg.operators)])
            inputs = self.numbers(_int_array(sg.inputs, "<i4", "inputs"))
            outputs = self.numbers(_int_array(sg.outputs, "<i4", "outputs"))
            name = self.string(sg.name)
        b = self.b
        SubGraph.Start(b)
        SubGraph.AddName(b, name)
        SubGraph.AddTensors(b, tensors)
        SubGraph.AddOperators(b, operators)
        SubGraph.AddInputs(b, inputs)
        SubGraph.AddOutputs(b, outputs)
        return SubGraph.End(b)

    def tensor(self, index, t):
        with _context(f"tensor {index} {t.name!r}"):
            dtype = dtypes.as_dtype(t.dtype)
            shape = _int_array(t.shape, "<i8", "shape")
            buffer = self.buffer_of(t.data, dtype, tuple(shape.tolist()))
            quantization = self.quantization(t.quantization)
            name = self.string(t.name)
            shape = self.numbers(shape)
        b = self.b
        Tensor.Start(b)
        Tensor.AddName(b, name)
        Tensor.AddDtype(b, dtypes.to_code(dtype))
        Tensor.AddShape(b, shape)
        Tensor.AddBuffer(b, buffer)
        Tensor.AddQuantization(b, quantization)
        Tensor.AddIsVariable(b, bool(t.is_variable))
        return Tensor.End(b)

    def buffer_of(self, data, dtype, shape):
        """The buffer index holding `data` (-1 for none); one buffer per array object."""
        if data is None:
            return -1
        if not isinstance(data, np.ndarray):
            raise GraphError(f"data must be a numpy array, got {type(data).__name__}")
        if data.dtype.newbyteorder("<") != dtype.newbyteorder("<"):
            raise GraphError(f"data has dtype {data.dtype}, the tensor {dtype}")
        if data.shape != shape:
            raise GraphError(f"data has shape {data.shape}, the tensor {shape}")
        if id(data) not in self.buffer_index:
            self.buffer_index[id(data)] = len(self.arrays)
            self.arrays.append(data)  # also keeps `data` alive, so its id stays unique
        return self.buffer_index[id(data)]

    def quantization(self, q):
        if q is None:
            return 0
        with _context("quantization"):
            scale = self.numbers(_float_array(q.scale, "<f4", "scale"))
            zero_point = self.numbers(_int_array(q.zero_point, "<i8", "zero_point"))
            axis = int(_int_array([q.axis], "<i4", "axis")[0])
        b = self.b
        Quantization.Start(b)
        Quantization.AddScale(b, scale)
        Quantization.AddZeroPoint(b, zero_point)
        Quantization.AddAxis(b, axis)
        return Quantization.End(b)

    def operator(self, index, op):
        with _context(f"operator {index} {op.opcode!r}"):
            opdef = ops.find(op.opcode)
            if opdef is None:
                raise GraphError("unknown op (see edgeflow.ops.names())")
            attrs = self.tables([self.attr(name, opdef.attrs[name].kind, value)
                                 for name, value in opdef.check_attrs(dict(op.attrs), len(op.inputs)).items()
                                 if value is not None])  # None: optional and unset
            inputs = self.numbers(_int_array(op.inputs, "<i4", "inputs"))
            outputs = self.numbers(_int_array(op.outputs, "<i4", "outputs"))
            placement = self.string(op.placement)
        opcode_index = self.opcodes.setdefault(opdef.name, len(self.opcodes))
        b = self.b
        Operator.Start(b)
        Operator.AddOpcodeIndex(b, opcode_index)
        Operator.AddInputs(b, inputs)
        Operator.AddOutputs(b, outputs)
        Operator.AddAttrs(b, attrs)
        Operator.AddPlacement(b, placement)
        return Operator.End(b)

    def attr(self, name, kind, value):
        """An Attr table; `value` is canonical (OpDef.check_attrs) for its `kind`."""
        K = ops.AttrKind
        with _context(f"attribute {name!r}"):
            s = self.string(value) if kind == K.STRING else 0
            ints = self.numbers(_int_array(value, "<i8", "value")) if kind == K.INTS else 0
            floats = self.numbers(_float_array(value, "<f8", "value")) if kind == K.FLOATS else 0
            if kind == K.INT:
                i = int(_int_array([value], "<i8", "value")[0])
            elif kind == K.DTYPE:
                i = dtypes.to_code(value)
            elif kind == K.SUBGRAPH:
                i = int(_int_array([value], "<i8", "value")[0])
            else:
                i = int(value) if kind == K.BOOL else 0
            name = self.string(name)
        b = self.b
        Attr.Start(b)
        Attr.AddName(b, name)
        Attr.AddType(b, int(kind))
        Attr.AddI(b, i)
        Attr.AddF(b, float(value) if kind == K.FLOAT else 0.0)
        Attr.AddS(b, s)
        Attr.AddInts(b, ints)
        Attr.AddFloats(b, floats)
        return Attr.End(b)

    def signature(self, index, s):
        with _context(f"signature {index} {s.key!r}"):
            inputs = self.tables([self.tensor_map(n, t) for n, t in s.inputs.items()])
            outputs = self.tables([self.tensor_map(n, t) for n, t in s.outputs.items()])
            subgraph = int(_int_array([s.subgraph], "<u4", "subgraph")[0])
            targets = self.numbers(_int_array(s.targets, "<u4", "targets")) if s.targets else None
            key = self.string(s.key)
        b = self.b
        Signature.Start(b)
        Signature.AddKey(b, key)
        Signature.AddInputs(b, inputs)
        Signature.AddOutputs(b, outputs)
        Signature.AddSubgraph(b, subgraph)
        if targets is not None:
            Signature.AddTargets(b, targets)
        return Signature.End(b)

    def tensor_map(self, name, tensor):
        with _context(f"{name!r}"):
            tensor = int(_int_array([tensor], "<i4", "tensor")[0])
            name = self.string(name)
        TensorMap.Start(self.b)
        TensorMap.AddName(self.b, name)
        TensorMap.AddTensor(self.b, tensor)
        return TensorMap.End(self.b)

    def metadata(self, name, data):
        with _context(f"{name!r}"):
            try:
                data = self.b.CreateByteVector(bytes(memoryview(data)))
            except TypeError:
                raise GraphError(f"value must be bytes, got {type(data).__name__}") from None
            name = self.string(name)
        Metadata.Start(self.b)
        Metadata.AddName(self.b, name)
        Metadata.AddData(self.b, data)
        return Metadata.End(self.b)

    def buffer_table(self):
        Model.StartBuffersVector(self.b, len(self.arrays))
        for array in reversed(self.arrays):
            Buffer.CreateBuffer(self.b, 0, array.nbytes)
        return self.b.EndVector()

    def string(self, s):
        """A string's offset; 0 (field left out, read back as "") for the empty string."""
        if not isinstance(s, str):
            raise GraphError(f"expected a str, got {s!r}")
        try:
            return self.b.CreateString(s) if s else 0
        except UnicodeEncodeError:
            raise GraphError(f"{s!r} cannot be encoded as UTF-8") from None

    def numbers(self, array):
        return self.b.CreateNumpyVector(array)

    def tables(self, offsets):
        """A vector of the tables (or strings) at `offsets`."""
        self.b.StartVector(4, len(offsets), 4)
        for offset in reversed(offsets):
            self.b.PrependUOffsetTRelative(offset)
        return self.b.EndVector()
