"""Tensors on the wire: numpy arrays <-> TensorChunk messages, both directions.

A tensor travels as its raw little-endian C-order bytes with its dtype name and shape,
cut into chunks of at most CHUNK_BYTES, so that every gRPC message stays well under
MAX_MESSAGE_BYTES (the limit both ends set). `Assembler` puts the chunks back together
and checks them as they come, before allocating anything: chunks of one tensor are
contiguous and complete, its byte size is prod(shape) * itemsize, and the tensors'
total stays under a cap.
"""
import math

import numpy as np

from .. import dtypes
from ..errors import InvalidInputError
from . import edgeflow_pb2 as pb

CHUNK_BYTES = 1 << 20
MAX_MESSAGE_BYTES = 4 << 20  # grpc.max_{send,receive}_message_length on both ends
# The most tensor bytes a RunOnce request carries, and its reply. gRPC receives a unary
# request whole before the server sees it, and sends the reply after the handler returns:
# both sit outside the server's memory budget, so they stay small (a larger request or
# reply streams, flow-controlled, through Run).
ONE_MESSAGE_BYTES = 64 << 10
ONE_REPLY_BYTES = CHUNK_BYTES
MAX_PING_BYTES = 2 << 20  # a Ping payload or reply fits in one message
DTYPES = {dtypes.name(dt): dt for dt in dtypes.ALL}  # the names on the wire: "float32", "bool", ...
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]


class PayloadTooLarge(InvalidInputError):
    """The tensors of one message stream hold more bytes than the receiver accepts."""


def dtype_named(name, what):
    """The edgeflow dtype called `name` on the wire, else InvalidInputError."""
    if name not in DTYPES:
        raise InvalidInputError(f"{what}: dtype {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]


def as_array(value, what):
    """`value` as a numpy array of an edgeflow dtype (ml_dtypes' bfloat16 as edgeflow's),
    else InvalidInputError."""
    array = dtypes.asarray(value)
    if array.dtype not in dtypes.ALL:
        raise InvalidInputError(f"{what}: expected an array of {', '.join(DTYPES)}, "
                                f"got dtype {array.dtype}")
    return array


ENCODINGS = {"none": "", "fp16": "fp16", "int8": "int8"}  # wire compression -> chunk encoding
_ENCODED = {"": None, "fp16": np.dtype("<f2"), "int8": np.dtype("i1")}


def encoding_named(compression, what="compression"):
    """The chunk encoding of a wire compression ("none", "fp16", "int8"), else InvalidInputError."""
    if compression not in ENCODINGS:
        raise InvalidInputError(f"{what}: expected one of {', '.join(ENCODINGS)}, got {compression!r}")
    return ENCODINGS[compression]


def encode(array, encoding):
    """(little-endian bytes as uint8, scale) of `array` under `encoding`; only float32
    tensors are compressed, others travel raw."""
    dtype = DTYPES[dtypes.name(array.dtype)]
    if encoding and dtype == np.float32:
        if encoding == "fp16":
            return np.ascontiguousarray(array, "<f2").reshape(-1).view(np.uint8), 0.0
        peak = float(np.max(np.abs(array))) if array.size else 0.0
        scale = peak / 127 if peak > 0 and np.isfinite(peak) else 1.0
        q = np.clip(np.rint(array / np.float32(scale)), -127, 127).astype(np.int8)
        return q.reshape(-1).view(np.uint8), scale
    return np.ascontiguousarray(array, dtype.newbyteorder("<")).reshape(-1).view(np.uint8), 0.0


def encode_copies(encoding):
    """The bytes that encoding an output holds per byte of it (encode's temporaries): what a
    server reserves for each output before it is streamed; unknown encodings count as int8."""
    return {"": 1, "fp16": 2, "int8": 4}.get(encoding, 4)


def encoded_bytes(array, encoding):
    """The bytes `array` takes on the wire under `encoding`."""
    if encoding and array.dtype == np.float32:
        return array.size * _ENCODED[encoding].itemsize
    return array.nbytes


def chunks(name, array, chunk_bytes=CHUNK_BYTES, encoding=""):
    """TensorChunk messages carrying `array` (of an edgeflow dtype) as tensor `name`, a
    float32 one compressed by `encoding` ("", "fp16", "int8"); a tensor without elements
    is one chunk with no data."""
    dtype = DTYPES[dtypes.name(array.dtype)]
    raw, scale = encode(array, encoding)
    encoding = encoding if dtype == np.float32 else ""
    total = raw.nbytes
    yield pb.TensorChunk(name=name, dtype=dtypes.name(dtype), shape=array.shape, offset=0,
                         total_bytes=total, data=raw[:chunk_bytes].tobytes(), encoding=encoding,
                         scale=scale)
    for offset in range(chunk_bytes, total, chunk_bytes):
        yield pb.TensorChunk(name=name, offset=offset, data=raw[offset:offset + chunk_bytes].tobytes())


class _Partial:
    """A tensor whose chunks are still arriving."""

    def __init__(self, name, dtype, shape, total, encoding="", scale=0.0):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.encoding, self.scale = encoding, scale
        self.buffer = np.empty(total, np.uint8)
        self.received = 0

    def array(self):
        if self.encoding == "fp16":
            return self.buffer.view("<f2").reshape(self.shape).astype(np.float32)
        if self.encoding == "int8":
            return self.buffer.view(np.int8).reshape(self.shape).astype(np.float32) * np.float32(self.scale)
        if self.dtype == dtypes.bool_:  # any nonzero byte is True, as numpy's bool casts say
            return (self.buffer != 0).reshape(self.shape)
        little = self.dtype.newbyteorder("<")
        array = self.buffer.view(little).reshape(self.shape)
        return array if little == self.dtype else array.astype(self.dtype)


class Assembler:
    """Rebuilds tensors from TensorChunk messages, checking each chunk as it comes.

    `max_bytes` caps the sum of the tensors' declared sizes (PayloadTooLarge, raised
    before the tensor that would pass it is allocated). `expect(name, dtype, shape)`, if
    given, checks each tensor's header against what the receiver knows and raises
    InvalidInputError. `what` names the tensors in messages ("feed", "output").
    """

    def __init__(self, max_bytes=None, expect=None, what="tensor"):
        self.max_bytes, self.expect, self.what = max_bytes, expect, what
        self.tensors = {}  # name -> complete array
        self.total_bytes = 0  # declared bytes so far
        self._partial = None

    def add(self, chunk):
        part = self._partial
        if part is None:
            part = self._partial = self._start(chunk)
        elif chunk.name != part.name:
            raise InvalidInputError(f"{self.what} {part.name!r} is incomplete: got {part.received} of "
                                    f"{part.buffer.nbytes} bytes, then a chunk of {chunk.name!r} "
                                    "(send each tensor's chunks in order, one tensor after another)")
        elif chunk.offset != part.received:
            raise InvalidInputError(f"{self.what} {part.name!r}: expected the chunk at offset "
                                    f"{part.received}, got one at offset {chunk.offset} "
                                    "(chunks must be contiguous and in order)")
        n = len(chunk.data)
        if part.received + n > part.buffer.nbytes:
            raise InvalidInputError(f"{self.what} {part.name!r}: a chunk of {n} bytes at offset "
                                    f"{chunk.offset} runs past the tensor's {part.buffer.nbytes} bytes")
        part.buffer[part.received:part.received + n] = np.frombuffer(chunk.data, np.uint8)
        part.received += n
        if part.received == part.buffer.nbytes:
            self.tensors[part.name] = part.array()
            self._partial = None

    def _start(self, chunk):
        name, what = chunk.name, f"{self.what} {chunk.name!r}"
        if not name:
            raise InvalidInputError(f"a {self.what} chunk has no tensor name")
        if name in self.tensors:
            raise InvalidInputError(f"{what} was sent twice")
        if chunk.offset != 0:
            raise InvalidInputError(f"{what}: expected its first chunk at offset 0, got offset "
                                    f"{chunk.offset}")
        dtype = dtype_named(chunk.dtype, what)
        shape = tuple(chunk.shape)
        if any(d < 0 for d in shape):
            raise InvalidInputError(f"{what}: expected a shape of sizes >= 0, got {shape}")
        if chunk.encoding not in _ENCODED or (chunk.encoding and dtype != np.float32):
            raise InvalidInputError(f"{what}: encoding {chunk.encoding!r}: expected none, or fp16 "
                                    "or int8 for a float32 tensor")
        if chunk.encoding == "int8" and not (np.isfinite(chunk.scale) and chunk.scale > 0):
            raise InvalidInputError(f"{what}: an int8 tensor needs a scale > 0, got {chunk.scale}")
        itemsize = (_ENCODED[chunk.encoding] or dtype).itemsize
        size = math.prod(shape) * itemsize
        if chunk.total_bytes != size:
            raise InvalidInputError(f"{what}: expected total_bytes {size} (shape {shape} of "
                                    f"{dtypes.name(dtype)}{' as ' + chunk.encoding if chunk.encoding else ''}), "
                                    f"got {chunk.total_bytes}")
        if self.max_bytes is not None and self.total_bytes + size > self.max_bytes:
            raise PayloadTooLarge(f"{what}: {self.total_bytes + size} bytes of tensors exceed the "
                                  f"limit of {self.max_bytes} bytes")
        if self.expect is not None:
            self.expect(name, dtype, shape)
        self.total_bytes += size
        return _Partial(name, dtype, shape, size, chunk.encoding, chunk.scale)

    def finish(self):
        """{name: array} of every tensor; InvalidInputError if one is incomplete."""
        part = self._partial
        if part is not None:
            raise InvalidInputError(f"{self.what} {part.name!r} is incomplete: the stream ended after "
                                    f"{part.received} of its {part.buffer.nbytes} bytes")
        return self.tensors
