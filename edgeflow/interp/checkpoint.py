"""Variable checkpoints: written atomically, checked fully before any value is used.

A checkpoint is an uncompressed `.npz` (a zip archive whose members carry CRC-32
checksums) holding one array per variable, by name. Writing goes to a temporary file in
the same directory, is flushed and fsynced, then renamed over the target (and the
directory fsynced), so a crash leaves the old checkpoint or the new one, never a torn
one. Reading loads and checks every array (checksum, name, dtype, shape) before
returning, so a bad checkpoint changes nothing.
"""
import os
import zipfile

import numpy as np

from ..atomic import atomic_file
from ..errors import FormatError


def write(path, arrays):
    """Write {name: array} to `path` atomically."""
    with atomic_file(path) as f:
        np.savez(f, **arrays)


def read(path, expected):
    """{name: array} from `path`, checked against `expected` {name: (dtype, shape)}.

    FormatError for anything else (FileNotFoundError if there is no file): each member's
    header is checked against the variable it sets before its data is read, so a hostile
    header allocates nothing, and every byte is read through the archive's CRC-32 check.
    """
    path = os.fspath(path)
    try:
        with zipfile.ZipFile(path) as archive:
            arrays = _members(path, archive, expected)
    except (FileNotFoundError, FormatError):
        raise
    except Exception as e:  # noqa: BLE001 -- zipfile and numpy raise many kinds on damaged bytes
        raise FormatError(f"{path}: not a readable checkpoint (torn or corrupt: "
                          f"{type(e).__name__}: {e})") from None
    return arrays


def _members(path, archive, expected):
    infos = {}
    for info in archive.infolist():
        name = info.filename[:-4] if info.filename.endswith(".npy") else None
        if name is None or name in infos:
            raise FormatError(f"{path}: member {info.filename[:60]!r} is not one array per variable (.npy)")
        infos[name] = info
    missing = sorted(set(expected) - set(infos))
    extra = sorted(set(infos) - set(expected))
    if missing or extra:
        raise FormatError(f"{path}: checkpoint does not match the model's variables"
                          + (f"; missing {missing}" if missing else "")
                          + (f"; unknown {[n[:60] for n in extra[:10]]}" if extra else ""))
    arrays = {}
    for name, (dtype, shape) in expected.items():
        info = infos[name]
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise FormatError(f"{path}: variable {name!r} is stored with compression method "
                              f"{info.compress_type}, not stored or deflated")
        with archive.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version not in ((1, 0), (2, 0), (3, 0)):
                raise FormatError(f"{path}: variable {name!r}: .npy version {version} unknown")
            header = {(1, 0): np.lib.format.read_array_header_1_0}.get(
                version, np.lib.format.read_array_header_2_0)
            got_shape, fortran, got_dtype = header(f)
            if got_dtype != dtype or tuple(got_shape) != tuple(shape) or got_dtype.hasobject:
                raise FormatError(f"{path}: variable {name!r} is {got_dtype}{list(got_shape)} in the "
                                  f"checkpoint, {dtype}{list(shape)} in the model")
            size = got_dtype.itemsize * int(np.prod(shape, dtype=object))
            data = f.read(size)
            if len(data) != size or f.read(1):  # reading to the end checks the CRC-32
                raise FormatError(f"{path}: variable {name!r} does not hold the {size} bytes its shape needs")
        order = "F" if fortran else "C"
        arrays[name] = np.frombuffer(bytearray(data), got_dtype).reshape(shape, order=order)
    return arrays
