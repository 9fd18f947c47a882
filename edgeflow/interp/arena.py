"""Best-fit placement of tensors in one arena by lifetime, as TFLite's arena planner does.

Tensors whose lifetimes (the first and last step that touch them, inclusive) overlap
get disjoint byte ranges; the others may share. Offsets are 64-byte aligned.
"""
import numpy as np

ALIGNMENT = 64


def aligned(n):
    return -(-n // ALIGNMENT) * ALIGNMENT


# Orders to place tensors in. Greedy best-fit is a heuristic: TFLite's order (largest
# first) is often optimal but not always, so each is tried until one meets the bound.
_ORDERS = (
    lambda r: (-r[0], r[1]),            # largest first, as TFLite
    lambda r: (r[1] - r[2], -r[0]),     # longest-lived first
    lambda r: ((r[1] - r[2] - 1) * r[0], r[1]),  # largest size x lifetime first
)


def place(requests):
    """Offsets for `requests`, a list of (nbytes, first, last); returns (offsets, arena_bytes).

    Tensors are placed one by one, each into the smallest gap (among the tensors already
    placed whose lifetimes overlap its own) that holds it, else above them all. The best
    of a few placement orders is kept; the search stops at the lower bound.
    """
    bound, best = lower_bound(requests), None
    for key in _ORDERS:
        order = sorted(range(len(requests)), key=lambda i: (key(requests[i]), i))
        offsets, total = _place_in_order(requests, order)
        if best is None or total < best[1]:
            best = offsets, total
        if total <= bound:
            break
    return best


def _place_in_order(requests, order):
    offsets = [0] * len(requests)
    placed = []  # (offset, end, first, last)
    for i in order:
        size, first, last = requests[i]
        size = aligned(size)
        if size == 0:
            continue
        busy = sorted((o, e) for o, e, f, l in placed if f <= last and first <= l)
        best, best_gap, cursor = None, None, 0
        for start, end in busy:
            gap = start - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, end)
        offsets[i] = cursor if best is None else best
        placed.append((offsets[i], offsets[i] + size, first, last))
    return offsets, max((e for _, e, _, _ in placed), default=0)


def lower_bound(requests):
    """The most (aligned) bytes live at any one step: no plan can use fewer."""
    steps = {s for _, first, last in requests for s in (first, last)}
    return max((sum(aligned(n) for n, f, l in requests if f <= s <= l) for s in steps), default=0)


class Arena:
    """One aligned block of memory with typed views at planned offsets."""

    def __init__(self, nbytes):
        self.nbytes = nbytes
        self._block = np.empty(nbytes + ALIGNMENT, np.uint8)
        self._base = -self._block.ctypes.data % ALIGNMENT

    def view(self, offset, shape, dtype):
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        start = self._base + offset
        return self._block[start:start + nbytes].view(dtype).reshape(shape)
