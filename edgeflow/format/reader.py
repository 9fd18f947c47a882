"""Reads `.efl` files without copying their weights.

A path is memory-mapped read-only; bytes-like sources are used in place. The verifier
checks the FlatBuffer first (O(its size), never the weights), then every constant
becomes a read-only numpy view into the mapping. Each view keeps the mapping alive
through its `.base` chain, so a model's weights stay valid for as long as any is
referenced, and opening a model costs the same whatever its weights weigh.
"""
import mmap
import os
import stat
from dataclasses import dataclass

import numpy as np

from ..errors import FormatError
from .verifier import verify


@dataclass(frozen=True)
class FileInfo:
    file_bytes: int  # the whole file
    flatbuffer_bytes: int  # the FlatBuffer (graph, names, attributes), size prefix included
    weight_bytes: int  # sum of the buffers' sizes
    num_buffers: int


def load(source):
    """The ModelDef in `source` (a path, or bytes-like), weights as read-only views.

    FormatError if the file is not a valid `.efl` model; FileNotFoundError if the
    path does not exist.
    """
    buf = _open(source)
    verified = _verify(buf, source)
    _attach_views(verified, buf)
    return verified.model


def file_info(source):
    """Sizes of the file and its parts (verified, weights untouched)."""
    verified = _verify(_open(source), source)
    return FileInfo(file_bytes=verified.file_size, flatbuffer_bytes=verified.flatbuffer_size,
                    weight_bytes=sum(size for _, size in verified.buffers),
                    num_buffers=len(verified.buffers))


def _verify(buf, source):
    """verify(buf); a file of another format says what it is and how to convert it."""
    try:
        return verify(buf)
    except FormatError as e:
        kind = _other_format(buf, source)
        if kind is None:
            raise
        path = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "MODEL"
        stem = os.path.splitext(path)[0] if isinstance(source, (str, os.PathLike)) else "MODEL"
        raise FormatError(f"{path} is {kind}, not an .efl package: convert it first with "
                          f"`edgeflow convert {path} -o {stem}.efl`") from None


def _other_format(buf, source):
    """"a TFLite model" or "an ONNX model" when `buf` looks like one, else None."""
    if len(buf) >= 8 and bytes(buf[4:8]) == b"TFL3":
        return "a TFLite model"
    suffix = os.path.splitext(os.fspath(source))[1].lower() if isinstance(source, (str, os.PathLike)) else ""
    if suffix == ".onnx" or (len(buf) > 2 and buf[0] == 0x08 and b"onnx" in bytes(buf[:256]).lower()):
        return "an ONNX model"  # a ModelProto starts with its ir_version (field 1, a varint)
    return None


def _open(source):
    """A read-only, flat memoryview of the file or bytes in `source`."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        view = memoryview(source)
        if not view.c_contiguous:
            raise FormatError("the buffer is not contiguous")
        # toreadonly: views of a bytearray must not let callers write the model's weights.
        return view.cast("B").toreadonly()
    if isinstance(source, (str, os.PathLike)):
        return map_file(source)
    raise TypeError(f"expected a path or a bytes-like object, got {type(source).__name__}")


def map_file(path):
    # stat first: opening a FIFO or device could block or read forever.
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise FormatError(f"{os.fspath(path)}: not a regular file")
    if info.st_size == 0:
        raise FormatError(f"{os.fspath(path)}: empty file")
    with open(path, "rb") as f:
        try:
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError) as e:  # e.g. emptied since the stat
            raise FormatError(f"{os.fspath(path)}: cannot map the file ({e})") from None
    return memoryview(mapping)  # the mapping lives while this or any slice of it does


def _attach_views(verified, buf):
    """Point every constant tensor at its bytes; tensors sharing a buffer (with the
    same dtype and shape) share one array, as they shared one when written."""
    views = {}
    for subgraph, buffer_of in zip(verified.model.subgraphs, verified.buffer_of):
        for tensor, index in zip(subgraph.tensors, buffer_of):
            if index < 0:
                continue
            key = (index, tensor.dtype, tensor.shape)
            if key not in views:
                views[key] = _view(buf, verified.buffers[index], tensor.dtype, tensor.shape)
            tensor.data = views[key]


def _view(buf, extent, dtype, shape):
    offset, size = extent
    # The file is little-endian whatever the host; on little-endian hosts this is `dtype`.
    little = dtype.newbyteorder("<")
    return np.frombuffer(buf, dtype=little, count=size // little.itemsize,
                         offset=offset).reshape(shape)
