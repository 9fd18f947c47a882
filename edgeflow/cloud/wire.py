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
MAX_PING_BYTES = 2 << 20  # a Ping payload or reply fits in one message
DTYPES = {dt.name: dt for dt in dtypes.ALL}  # the names on the wire: "float32", "bool", ...
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
    """`value` as a numpy array of an edgeflow dtype, else InvalidInputError."""
    array = np.asarray(value)
    if array.dtype.name not in DTYPES:
        raise InvalidInputError(f"{what}: expected an array of {', '.join(DTYPES)}, "
                                f"got dtype {array.dtype}")
    return array


def chunks(name, array, chunk_bytes=CHUNK_BYTES):
    """TensorChunk messages carrying `array` (of an edgeflow dtype) as tensor `name`; a
    tensor without elements is one chunk with no data."""
    dtype = DTYPES[array.dtype.name]
    raw = np.ascontiguousarray(array, dtype.newbyteorder("<")).reshape(-1).view(np.uint8)
    total = raw.nbytes
    yield pb.TensorChunk(name=name, dtype=dtype.name, shape=array.shape, offset=0,
                         total_bytes=total, data=raw[:chunk_bytes].tobytes())
    for offset in range(chunk_bytes, total, chunk_bytes):
        yield pb.TensorChunk(name=name, offset=offset, data=raw[offset:offset + chunk_bytes].tobytes())


class _Partial:
    """A tensor whose chunks are still arriving."""

    def __init__(self, name, dtype, shape, total):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.buffer = np.empty(total, np.uint8)
        self.received = 0

    def array(self):
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
        size = math.prod(shape) * dtype.itemsize
        if chunk.total_bytes != size:
            raise InvalidInputError(f"{what}: expected total_bytes {size} (shape {shape} of "
                                    f"{dtype.name}), got {chunk.total_bytes}")
        if self.max_bytes is not None and self.total_bytes + size > self.max_bytes:
            raise PayloadTooLarge(f"{what}: {self.total_bytes + size} bytes of tensors exceed the "
                                  f"limit of {self.max_bytes} bytes")
        if self.expect is not None:
            self.expect(name, dtype, shape)
        self.total_bytes += size
        return _Partial(name, dtype, shape, size)

    def finish(self):
        """{name: array} of every tensor; InvalidInputError if one is incomplete."""
        part = self._partial
        if part is not None:
            raise InvalidInputError(f"{self.what} {part.name!r} is incomplete: the stream ended after "
                                    f"{part.received} of its {part.buffer.nbytes} bytes")
        return self.tensors
