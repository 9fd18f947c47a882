"""Atomic file writes: readers see the old file or the whole new one, never a torn one.

    with atomic_file("model.efl") as f:
        f.write(data)

writes to a temporary file in the target's folder, flushes and fsyncs it, renames it
over the target, then fsyncs the folder (so the rename itself survives a crash); on an
exception the temporary file is removed and the target is untouched. Models, checkpoints,
trainer state, profiles and plan reports are all written this way.
"""
import contextlib
import os
import tempfile


@contextlib.contextmanager
def atomic_file(path, mode="wb"):
    """A file object (mode "wb" or "w") whose contents replace `path` when the block ends."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the file from other users
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_folder(folder)


def write_bytes(path, data):
    with atomic_file(path) as f:
        f.write(data)


def write_text(path, text):
    with atomic_file(path, "w") as f:
        f.write(text)


def fsync_folder(folder):
    """Make renames in `folder` durable (POSIX); not every platform or filesystem allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
