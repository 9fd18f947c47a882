"""Read a `.tflite` file into plain Python values, with the `tflite` package's generated
binding of TensorFlow Lite's schema (schema.fbs).

Everything is decoded and checked here, once: every subgraph, tensor, buffer (also those
stored past the FlatBuffer by offset and size, as TFLite's converter writes models over
2 GB), operator with its builtin options as a dict of schema field names, signature def
and metadata entry. A file that is not a well-formed TFLite model raises ConversionError,
whatever the damage: the converters after this see only valid indices.
"""
import functools
import os
import re
from dataclasses import dataclass, field

import flatbuffers
import numpy as np

from edgeflow.errors import ConversionError

# TensorType -> numpy dtype (STRING, COMPLEX and RESOURCE types have none in edgeflow).
_DTYPES = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 6: np.bool_,
           7: np.int16, 9: np.int8, 10: np.float64, 12: np.uint64, 15: np.uint32, 16: np.uint16}
_TYPE_NAMES = {5: "STRING", 8: "COMPLEX64", 11: "COMPLEX128", 13: "RESOURCE", 14: "VARIANT", 17: "INT4",
               18: "BFLOAT16"}
CUSTOM = 32  # BuiltinOperator.CUSTOM
MAX_RANK = 16


@dataclass
class Quantization:
    """Affine quantization of a tensor: real = scale * (q - zero_point), per tensor
    (axis None) or per index along `axis`."""
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int = None


@dataclass
class Tensor:
    name: str
    dtype: np.dtype
    shape: tuple            # static shape; a dynamic dimension is None
    data: np.ndarray = None  # constant value (dense), or None
    quantization: Quantization = None
    is_variable: bool = False
    sparsity: dict = None    # the sparse encoding of `data` (densified by the converter)


@dataclass
class Operator:
    opcode: str             # builtin name ("CONV_2D") or "CUSTOM:<code>"
    version: int
    inputs: list            # tensor indices; -1 marks an absent optional input
    outputs: list
    options: dict           # builtin options: schema field name -> value
    custom_options: bytes = b""


@dataclass
class Subgraph:
    name: str
    tensors: list
    inputs: list
    outputs: list
    operators: list


@dataclass
class Signature:
    key: str
    subgraph: int
    inputs: dict            # name -> tensor index
    outputs: dict


@dataclass
class Model:
    version: int
    description: str
    subgraphs: list
    signatures: list
    metadata: dict = field(default_factory=dict)  # name -> bytes
    size: int = 0


def read(source):
    """The Model in `source`: a path, or the file's bytes."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, where = bytes(source), "TFLite model"
    else:
        where = os.fspath(source)
        with open(where, "rb") as f:
            data = f.read()
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ConversionError(f"{where}: not a TFLite model (no 'TFL3' file identifier at byte 4)")
    try:
        return _Decoder(data).model()
    except ConversionError as e:
        raise ConversionError(f"{where}: {e}") from None
    except Exception as e:  # the generated accessors raise struct.error, IndexError, ...
        raise ConversionError(f"{where}: malformed TFLite FlatBuffer ({type(e).__name__}: {e})") from None


@functools.lru_cache(maxsize=None)
def builtin_names():
    """BuiltinOperator code -> name."""
    from tflite.BuiltinOperator import BuiltinOperator
    return {v: k for k, v in vars(BuiltinOperator).items() if not k.startswith("_")}


@functools.lru_cache(maxsize=None)
def _options_classes():
    """BuiltinOptions union type -> its generated table class."""
    import importlib
    from tflite.BuiltinOptions import BuiltinOptions
    classes = {}
    for name, code in vars(BuiltinOptions).items():
        if name.startswith("_") or name == "NONE":
            continue
        classes[code] = getattr(importlib.import_module(f"tflite.{name}"), name)
    return classes


def _snake(name):
    """"DilationHFactor" -> "dilation_h_factor", the schema's field name."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


@functools.lru_cache(maxsize=None)
def _fields(cls):
    """(snake_case field name, accessor name, is_vector) of a generated options table."""
    found = []
    for attr in sorted(vars(cls)):
        fn = vars(cls)[attr]
        if attr.startswith("_") or attr in ("Init",) or not callable(fn) or attr.startswith("GetRootAs"):
            continue
        if attr.endswith(("AsNumpy", "Length", "IsNone")) or "BufferHasIdentifier" in attr:
            continue
        code = getattr(fn, "__code__", None)
        if code is None:
            continue
        if code.co_argcount == 1:
            found.append((_snake(attr), attr, False))
        elif code.co_argcount == 2 and f"{attr}AsNumpy" in vars(cls):
            found.append((_snake(attr), attr, True))
    return tuple(found)


def _vector(value):
    """A generated `XAsNumpy()` result: an array, or 0 when the vector is absent."""
    return np.asarray(value).reshape(-1) if not isinstance(value, int) else np.zeros(0, np.int32)


def _text(raw):
    return raw.decode("utf-8", "replace") if raw is not None else ""


class _Decoder:
    def __init__(self, data):
        import tflite
        self.data = data
        self.root = tflite.Model.GetRootAs(data, 0)

    def model(self):
        m = self.root
        buffers = [self.buffer(m.Buffers(i)) for i in range(m.BuffersLength())]
        codes = [self.opcode(m.OperatorCodes(i)) for i in range(m.OperatorCodesLength())]
        subgraphs = [self.subgraph(m.Subgraphs(i), i, buffers, codes) for i in range(m.SubgraphsLength())]
        if not subgraphs:
            raise ConversionError("the model has no subgraphs")
        metadata = {}
        for i in range(m.MetadataLength()):
            entry = m.Metadata(i)
            index = entry.Buffer()
            if not 0 <= index < len(buffers):
                raise ConversionError(f"metadata {_text(entry.Name())!r} names buffer {index} of {len(buffers)}")
            metadata[_text(entry.Name())] = bytes(buffers[index]) if buffers[index] is not None else b""
        signatures = [self.signature(m.SignatureDefs(i), subgraphs) for i in range(m.SignatureDefsLength())]
        return Model(m.Version(), _text(m.Description()), subgraphs, signatures, metadata, len(self.data))

    def buffer(self, b):
        """The bytes of Buffer `b` as a uint8 array (a view of the file), or None if empty."""
        offset, size = b.Offset(), b.Size()
        if offset > 1:  # stored past the FlatBuffer (offset 1 marks an empty one)
            if offset + size > len(self.data):
                raise ConversionError(f"a buffer at offset {offset} of {size} bytes runs past the "
                                      f"end of the file ({len(self.data)} bytes)")
            return np.frombuffer(self.data, np.uint8, size, offset)
        if b.DataIsNone() or b.DataLength() == 0:
            return None
        return _vector(b.DataAsNumpy())

    def opcode(self, code):
        builtin = max(_builtin_code(code), code.DeprecatedBuiltinCode())  # TFLite's own rule
        if builtin == CUSTOM:
            return f"CUSTOM:{_text(code.CustomCode())}", code.Version()
        name = builtin_names().get(builtin)
        if name is None:
            raise ConversionError(f"unknown builtin operator code {builtin}")
        return name, code.Version()

    def subgraph(self, sg, index, buffers, codes):
        where = f"subgraph {index}"
        tensors = [self.tensor(sg.Tensors(i), f"{where} tensor {i}", buffers) for i in range(sg.TensorsLength())]
        n = len(tensors)

        def indices(vector, what, optional=False):
            values = [int(v) for v in _vector(vector)]
            bad = [v for v in values if not (0 <= v < n or (optional and v == -1))]
            if bad:
                raise ConversionError(f"{what} refers to tensor(s) {bad[:4]}; {where} has {n}")
            return values

        operators = []
        for i in range(sg.OperatorsLength()):
            op = sg.Operators(i)
            k = op.OpcodeIndex()
            if k >= len(codes):
                raise ConversionError(f"{where} operator {i} has opcode index {k}; the model has {len(codes)}")
            name, version = codes[k]
            operators.append(Operator(name, version, indices(op.InputsAsNumpy(), f"{where} operator {i}", True),
                                      indices(op.OutputsAsNumpy(), f"{where} operator {i}"),
                                      self.options(op, f"{where} operator {i} ({name})"),
                                      bytes(_vector(op.CustomOptionsAsNumpy()).astype(np.uint8))))
        return Subgraph(_text(sg.Name()), tensors, indices(sg.InputsAsNumpy(), f"{where} inputs"),
                        indices(sg.OutputsAsNumpy(), f"{where} outputs"), operators)

    def tensor(self, t, where, buffers):
        kind = t.Type()
        if kind not in _DTYPES:
            raise ConversionError(f"{where} {_text(t.Name())!r} has type "
                                  f"{_TYPE_NAMES.get(kind, kind)}, which edgeflow cannot hold")
        dtype = np.dtype(_DTYPES[kind])
        shape = [int(d) for d in _vector(t.ShapeAsNumpy())]
        signature = [int(d) for d in _vector(t.ShapeSignatureAsNumpy())]
        if len(shape) > MAX_RANK or any(d < 0 for d in shape):
            raise ConversionError(f"{where} {_text(t.Name())!r} has shape {shape}")
        if len(signature) == len(shape):
            shape = [None if s == -1 else d for d, s in zip(shape, signature)]
        b = t.Buffer()
        if not 0 <= b < max(len(buffers), 1):
            raise ConversionError(f"{where} {_text(t.Name())!r} refers to buffer {b}; the model has {len(buffers)}")
        raw = buffers[b] if buffers else None
        sparsity = self.sparsity(t.Sparsity(), where) if t.Sparsity() is not None else None
        data = None
        if raw is not None:
            if sparsity is not None:
                data = raw  # the packed values; converters densify them
            else:
                if None in shape:
                    raise ConversionError(f"{where} {_text(t.Name())!r} holds data but has a dynamic shape")
                count = int(np.prod(shape, dtype=np.int64))
                if raw.size != count * dtype.itemsize:
                    raise ConversionError(f"{where} {_text(t.Name())!r}: buffer {b} holds {raw.size} bytes, "
                                          f"shape {shape} of {dtype} needs {count * dtype.itemsize}")
                data = raw.view(dtype).reshape(shape)
        return Tensor(_text(t.Name()), dtype, tuple(shape), data, self.quantization(t.Quantization(), shape, where),
                      bool(t.IsVariable()), sparsity)

    @staticmethod
    def quantization(q, shape, where):
        if q is None:
            return None
        scale = _vector(q.ScaleAsNumpy()).astype(np.float32)
        zero = _vector(q.ZeroPointAsNumpy()).astype(np.int64)
        if scale.size == 0:
            return None  # min/max only (calibration ranges): not quantized
        if zero.size not in (0, scale.size):
            raise ConversionError(f"{where}: {scale.size} quantization scales but {zero.size} zero points")
        axis = None
        if scale.size > 1:
            axis = q.QuantizedDimension()
            if not 0 <= axis < len(shape) or shape[axis] != scale.size:
                raise ConversionError(f"{where}: {scale.size} quantization scales along axis {axis} "
                                      f"of shape {shape}")
        return Quantization(scale, zero if zero.size else np.zeros(scale.size, np.int64), axis)

    @staticmethod
    def sparsity(s, where):
        """TFLite's SparsityParameters as a dict: traversal_order, block_map, and per
        dimension ("dense", size) or ("csr", segments, indices)."""
        dims = []
        for i in range(s.DimMetadataLength()):
            d = s.DimMetadata(i)
            if d.Format() == 0:
                dims.append(("dense", d.DenseSize()))
                continue
            vectors = []
            for kind, table in ((d.ArraySegmentsType(), d.ArraySegments()), (d.ArrayIndicesType(), d.ArrayIndices())):
                cls = {1: "Int32Vector", 2: "Uint16Vector", 3: "Uint8Vector"}.get(kind)
                if cls is None or table is None:
                    raise ConversionError(f"{where}: sparse dimension {i} has no segment or index vector")
                import importlib
                vec = getattr(importlib.import_module(f"tflite.{cls}"), cls)()
                vec.Init(table.Bytes, table.Pos)
                vectors.append(_vector(vec.ValuesAsNumpy()).astype(np.int64))
            dims.append(("csr", *vectors))
        return {"traversal_order": [int(v) for v in _vector(s.TraversalOrderAsNumpy())],
                "block_map": [int(v) for v in _vector(s.BlockMapAsNumpy())], "dims": dims}

    def options(self, op, where):
        kind = op.BuiltinOptionsType()
        if kind == 0:
            return {}
        cls = _options_classes().get(kind)
        table = op.BuiltinOptions()
        if cls is None or table is None:
            raise ConversionError(f"{where}: builtin options of unknown type {kind}")
        options = cls()
        options.Init(table.Bytes, table.Pos)
        values = {}
        for name, accessor, is_vector in _fields(cls):
            if is_vector:
                values[name] = [int(v) for v in _vector(getattr(options, f"{accessor}AsNumpy")())]
            else:
                value = getattr(options, accessor)()
                values[name] = _text(value) if isinstance(value, bytes) else value
        return values

    @staticmethod
    def signature(s, subgraphs):
        key, index = _text(s.SignatureKey()), s.SubgraphIndex()
        if not 0 <= index < len(subgraphs):
            raise ConversionError(f"signature {key!r} names subgraph {index}; the model has {len(subgraphs)}")
        n = len(subgraphs[index].tensors)

        def names(count, get, what):
            found = {}
            for i in range(count):
                m = get(i)
                if not 0 <= m.TensorIndex() < n:
                    raise ConversionError(f"signature {key!r} {what} {_text(m.Name())!r} refers to tensor "
                                          f"{m.TensorIndex()}; subgraph {index} has {n}")
                found[_text(m.Name())] = m.TensorIndex()
            return found
        return Signature(key, index, names(s.InputsLength(), s.Inputs, "input"),
                         names(s.OutputsLength(), s.Outputs, "output"))


def _builtin_code(code):
    """OperatorCode.builtin_code as stored (0 where absent). The binding's BuiltinCode()
    returns deprecated_builtin_code for a stored code under 127, and that field's default, 0
    (ADD), where a writer left it out, as ai-edge-quantizer does: its DEQUANTIZE (6) read
    as ADD."""
    tab = code._tab
    o = tab.Offset(10)
    return tab.Get(flatbuffers.number_types.Int32Flags, o + tab.Pos) if o else 0
