"""Best-fit placement of tensors in one arena by lifetime, as TFLite's arena planner does.

Tensors whose lifetimes (the first and last step that touch them, inclusive) overlap
get disjoint byte ranges; the others may share. Offsets are 64-byte aligned.

Kernels' own scratch memory (im2col columns, wide results) lives in a Workspace: the steps
of a plan run one at a time, so every step's scratch can share the same bytes. A kernel
factory asks `scratch(shape, dtype)` while its plan binds it.

Sizes are Python integers (no int64 product wraps) and bounded: a plan checks every
tensor, the arena and each scratch array against its interpreter's `max_tensor_bytes`
(`bounded`), before anything of that size is allocated.
"""
import bisect
import contextlib
import contextvars
import math
import mmap
import os

import numpy as np

from ..errors import InvalidInputError
from .scoped import scoped

ALIGNMENT = 64
MAX_TENSOR_BYTES = 4 * 2**30  # the default bound, unless the machine has less memory


def default_max_tensor_bytes():
    """The default bound on one allocation (a tensor, a plan's arena, a scratch array):
    4 GiB, or the machine's physical memory if it has less (more can never succeed)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return MAX_TENSOR_BYTES
    return min(MAX_TENSOR_BYTES, memory) if memory > 0 else MAX_TENSOR_BYTES


def nbytes(shape, dtype):
    """Bytes of an array of `shape` (a tuple, or an int as numpy takes) and `dtype`,
    exactly (Python integers)."""
    dims = (shape,) if isinstance(shape, (int, np.integer)) else shape
    return math.prod(int(d) for d in dims) * np.dtype(dtype).itemsize


def size_text(n):
    """`n` bytes, readably."""
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


class TooLarge(InvalidInputError):
    """A scratch array larger than the bound in force (`bounded`); a plan names the op."""

    def __init__(self, message, nbytes):
        super().__init__(message)
        self.nbytes = nbytes


_MAPPED_MIN = 1 << 20  # blocks this large get their own mapping, whose pages `release` returns


_HUGE_MIN = 2 << 20  # blocks this large ask for transparent huge pages (where madvise takes it)


def new_block(nbytes):
    """An uninitialised uint8 array of `nbytes`: a private anonymous mapping from 1 MiB on
    (where madvise exists), so that `release` can give its pages back without unmapping it;
    from 2 MiB on in huge pages where the system gives them (MADV_HUGEPAGE: Linux's
    transparent huge pages, "always" or "madvise"). A first run writes its arena and scratch
    fresh, a fault a page: here 32 MiB took 27-30 ms to fault in by 4 KiB pages, 5 in 2 MiB
    ones (fewer TLB misses after, too)."""
    if nbytes < _MAPPED_MIN or not hasattr(mmap, "MADV_DONTNEED"):
        return np.empty(nbytes, np.uint8)
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    if nbytes >= _HUGE_MIN and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # a kernel without transparent huge pages
            memory.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(memory, np.uint8)


def zeroed(nbytes):
    """A zeroed uint8 array of `nbytes`: a `new_block` where it is a fresh mapping (zeros, in
    huge pages from 2 MiB on), else numpy's. For weights laid out once (packed, transformed):
    ResNet-18's Winograd transforms write 72 MB fresh."""
    if nbytes < _MAPPED_MIN or not hasattr(mmap, "MADV_DONTNEED"):
        return np.zeros(nbytes, np.uint8)
    return new_block(nbytes)


def release(array):
    """Give the pages of a `new_block` back to the system (its contents become zeros, its views
    stay valid: the next write maps fresh pages); a no-op for a small block."""
    base = array.base.obj if isinstance(array.base, memoryview) else array.base
    if isinstance(base, mmap.mmap):
        base.madvise(mmap.MADV_DONTNEED)


def aligned(n):
    return -(-n // ALIGNMENT) * ALIGNMENT


# Orders to place tensors in. Greedy best-fit is a heuristic: TFLite's order (largest
# first) is often optimal but not always, so each is tried until one meets the bound.
_ORDERS = (
    lambda r: (-r[0], r[1]),            # largest first, as TFLite
    lambda r: (r[1] - r[2], -r[0]),     # longest-lived first
    lambda r: ((r[1] - r[2] - 1) * r[0], r[1]),  # largest size x lifetime first
)


# An order's arena within this much of the lower bound ends the search: each order costs
# as long as the first (a recurrence litert-torch unrolled, 1,900 tensors: 85-130 ms each)
# to save less than this (75 KiB of its 313 KiB; a MobileNetV2 train step's first order is
# 0.5% above the bound).
def _near(total, bound):
    return total <= bound + max(bound >> 6, 1 << 18)  # 1/64 of the bound, or 256 KiB


def place(requests):
    """Offsets for `requests`, a list of (nbytes, first, last); returns (offsets, arena_bytes).

    Tensors are placed one by one, each into the smallest gap (among the tensors already
    placed whose lifetimes overlap its own) that holds it, else above them all. The best
    of a few placement orders is kept; the search stops near the lower bound (`_near`).
    """
    bound, best = lower_bound(requests), None
    for key in _ORDERS:
        order = sorted(range(len(requests)), key=lambda i: (key(requests[i]), i))
        offsets, total = _place_in_order(requests, order)
        if best is None or total < best[1]:
            best = offsets, total
        if _near(total, bound):
            break
    return best


def _place_in_order(requests, order):
    """Offsets placing requests[i] for i in `order`, each into the smallest gap between the
    byte ranges of the tensors placed before it that are alive with it (the first such gap
    in offset order on ties), else above them all; and the arena's size. The tensors placed
    are kept sorted by offset, so one pass over them finds the gap (no sort per tensor: a
    train step's thousand tensors place in tens of milliseconds)."""
    offsets, placed, top = [0] * len(requests), [], 0  # placed: (offset, end, first, last)
    for i in order:
        size, first, last = requests[i]
        size = aligned(size)
        if size == 0:
            continue
        best, best_gap, cursor = None, None, 0
        for start, end, f, l in placed:
            if f <= last and first <= l:
                gap = start - cursor
                if gap >= size and (best_gap is None or gap < best_gap):
                    best, best_gap = cursor, gap
                if end > cursor:
                    cursor = end
        offsets[i] = offset = cursor if best is None else best
        bisect.insort(placed, (offset, offset + size, first, last))
        top = max(top, offset + size)
    return offsets, top


def lower_bound(requests):
    """The most (aligned) bytes live at any one step: no plan can use fewer."""
    change = {}  # step -> bytes that become live there, less those that died just before
    for n, first, last in requests:
        change[first] = change.get(first, 0) + aligned(n)
        change[last + 1] = change.get(last + 1, 0) - aligned(n)
    live = peak = 0
    for step in sorted(change):
        live += change[step]
        peak = max(peak, live)
    return peak


class Arena:
    """One aligned block of memory with typed views at planned offsets."""

    def __init__(self, nbytes):
        self.nbytes = nbytes
        self._block = new_block(nbytes + ALIGNMENT)
        self._base = -self._block.ctypes.data % ALIGNMENT

    def release(self):
        """Return the arena's pages until the next run writes them (its values are lost:
        a plan's caller copies inputs in before every run)."""
        release(self._block)

    def view(self, offset, shape, dtype):
        size = nbytes(shape, dtype)
        start = self._base + offset
        if start + size > self._block.nbytes:
            raise AssertionError(f"a view of {size} bytes at {offset} runs past an arena of {self.nbytes}")
        return self._block[start:start + size].view(dtype).reshape(shape)


class Workspace:
    """Scratch memory shared by the steps of one plan, which run one at a time.

    A kernel factory asks `scratch(shape, dtype)` for arrays its step overwrites whole on
    every run before reading them, and reads nowhere else: they may hold anything between
    runs, and another step's scratch uses the same bytes. The arrays of one step never
    overlap each other. Arrays are carved from the newest block from offset 0 at each step;
    a step that needs more than it holds gets a new block at least twice as large (the steps
    bound before keep the older), so the blocks hold at most four times the largest step's
    need (and pages never written are never mapped), not the sum of every step's.
    """

    def __init__(self):
        self.blocks = []  # uint8 arrays, the last the largest
        self._cursor = 0

    @property
    def nbytes(self):
        """Bytes reserved (the blocks' sizes); the pages the steps write are what they use."""
        return sum(b.nbytes - ALIGNMENT for b in self.blocks)

    def release(self):
        """Return the blocks' pages until a step writes them again (scratch holds anything
        between runs)."""
        for b in self.blocks:
            release(b)

    def step(self):
        """Binding one step: `scratch` draws from this workspace, from offset 0."""
        self._cursor = 0
        return scoped(_ACTIVE, self)

    def take(self, shape, dtype):
        dtype = np.dtype(dtype)
        size = nbytes(shape, dtype)
        start, end = self._cursor, self._cursor + aligned(size)
        if not self.blocks or end > self.blocks[-1].nbytes - ALIGNMENT:
            # A new block, at least twice the last (pages never written cost nothing): what
            # this step took from the old one stays there, and overlaps nothing it takes now.
            start, end = 0, aligned(size)
            last = self.blocks[-1].nbytes - ALIGNMENT if self.blocks else 0
            self.blocks.append(new_block(max(end, 2 * last) + ALIGNMENT))
        block = self.blocks[-1]
        self._cursor = end
        base = -block.ctypes.data % ALIGNMENT + start
        return block[base:base + size].view(dtype).reshape(shape)


_ACTIVE = contextvars.ContextVar("edgeflow_workspace", default=None)
_BOUND = contextvars.ContextVar("edgeflow_max_bytes", default=None)


def bounded(max_bytes):
    """While inside: `scratch` refuses (TooLarge) arrays of more than `max_bytes`."""
    return scoped(_BOUND, max_bytes)


def scratch(shape, dtype):
    """An uninitialised array for a kernel step's own use while it runs (see Workspace):
    from the plan's shared workspace while a plan binds the kernel, else a new array.
    TooLarge past the bound in force (`bounded`)."""
    limit, size = _BOUND.get(), nbytes(shape, dtype)
    if limit is not None and size > limit:
        raise TooLarge(f"scratch {np.dtype(dtype)}{list(shape)} needs {size_text(size)}, more than "
                       f"max_tensor_bytes={limit}", size)
    workspace = _ACTIVE.get()
    if workspace is None:
        return np.empty(shape, dtype)
    return workspace.take(shape, dtype)


def outside(array, box):
    """Views of `array` that together cover every element outside `box` (slices of step
    1, one per leading axis) once: per axis, the slabs before and after the box's range
    within the box's ranges of the axes before it. A step filling a scratch array's box
    fills these too (padding, say), since the workspace holds anything between runs."""
    views, within = [], ()
    for size, part in zip(array.shape, box):
        start, stop, _ = part.indices(size)
        stop = max(start, stop)
        views += [array[within + (cut,)] for cut in (slice(0, start), slice(stop, size))
                  if len(range(size)[cut])]
        within += (slice(start, stop),)
    return views
