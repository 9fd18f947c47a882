"""Clipper's prediction cache in front of a backend: the outputs of recent Run requests,
keyed by what determines them.

The key is the package's SHA-256 (the model's bytes, whatever id serves them), the fetches
in order, the wire encoding, and a SHA-256 over every feed's name, dtype, shape and bytes
in name order: the same inputs to the same package give the same outputs, so a hit skips
the run. Training rounds are never cached (they change the variables). Entries are
read-only copies, and a hit answers copies of them, so nothing a caller does to its
outputs reaches the cache; the least recently used go beyond `max_entries` or
`max_bytes` of outputs (an entry larger than `max_bytes` is not kept). Concurrent misses
of one key each run (nothing waits on another's run). A hit reserves its outputs in the
request's Reservation, as a run does.
"""
import collections
import hashlib
import threading

import numpy as np

from ..errors import EdgeflowError
from .metrics import NO_METRICS
from .wire import encode_copies



def feeds_digest(feeds):
    """SHA-256 (hex) over each feed's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(feeds):
        a = feeds[name]
        h.update(f"{len(name)}:{name}|{a.dtype.str}|{a.shape}|{a.nbytes}\n".encode())
        h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()


class Cached:
    """An LRU of at most `max_entries` replies (and `max_bytes` of their outputs) in front
    of `inner` (a backend). Thread-safe. Reports each lookup to `metrics.cache`."""

    def __init__(self, inner, max_entries, metrics=NO_METRICS, max_bytes=256 << 20):
        if not max_entries >= 1 or not max_bytes >= 1:
            raise EdgeflowError(f"Cached: expected max_entries >= 1 and max_bytes >= 1, got {max_entries} "
                                f"and {max_bytes}")
        self.inner, self.metrics = inner, metrics
        self.max_entries, self.max_bytes = int(max_entries), int(max_bytes)
        self._entries = collections.OrderedDict()  # key -> {name: read-only array}, oldest first
        self.nbytes = 0  # of the entries' outputs
        self._lock = threading.Lock()

    def run(self, model, fetches, feeds, reservation, encoding=""):
        key = (model.sha256, tuple(fetches), encoding, feeds_digest(feeds))
        with self._lock:
            stored = self._entries.get(key)
            if stored is not None:
                self._entries.move_to_end(key)
        self.metrics.cache(model.id, stored is not None)
        if stored is not None:
            if reservation is not None:
                reservation.add(sum(a.nbytes for a in stored.values()) * encode_copies(encoding),
                                f"model {model.id!r}: a cached reply")
            return {name: a.copy() for name, a in stored.items()}
        outputs = self.inner.run(model, fetches, feeds, reservation, encoding)
        self._store(key, outputs)
        return outputs

    def _store(self, key, outputs):
        nbytes = sum(a.nbytes for a in outputs.values())
        if nbytes > self.max_bytes:
            return
        entry = {}
        for name, a in outputs.items():
            entry[name] = a.copy()
            entry[name].flags.writeable = False
        with self._lock:
            old = self._entries.pop(key, None)
            self.nbytes -= 0 if old is None else sum(a.nbytes for a in old.values())
            self._entries[key] = entry
            self.nbytes += nbytes
            while len(self._entries) > self.max_entries or self.nbytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self.nbytes -= sum(a.nbytes for a in dropped.values())

    def __len__(self):
        return len(self._entries)

    def round(self, model, device_id, step, feeds, fetches):
        return self.inner.round(model, device_id, step, feeds, fetches)

    def close(self):
        self.inner.close()
