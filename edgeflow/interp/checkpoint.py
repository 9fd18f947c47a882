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
import zlib

import numpy as np

from ..atomic import atomic_file
from ..errors import FormatError


def write(path, arrays):
    """Write {name: array} to `path` atomically."""
    with atomic_file(path) as f:
        np.savez(f, **arrays)


def read(path, expected):
    """{name: array} from `path`, checked against `expected` {name: (dtype, shape)}."""
    path = os.fspath(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except FileNotFoundError:
        raise
    except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, KeyError) as e:
        raise FormatError(f"{path}: not a readable checkpoint (torn or corrupt: {e})") from None
    missing = sorted(set(expected) - set(arrays))
    extra = sorted(set(arrays) - set(expected))
    if missing or extra:
        raise FormatError(f"{path}: checkpoint does not match the model's variables"
                          + (f"; missing {missing}" if missing else "")
                          + (f"; unknown {extra}" if extra else ""))
    for name, (dtype, shape) in expected.items():
        a = arrays[name]
        if a.dtype != dtype or a.shape != tuple(shape):
            raise FormatError(f"{path}: variable {name!r} is {a.dtype}{list(a.shape)} in the "
                              f"checkpoint, {dtype}{list(shape)} in the model")
    return arrays
