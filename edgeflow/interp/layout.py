"""Layout ops a plan runs as views, or not at all: transposes, reshape-likes (reshape,
squeeze, expand_dims) and gathers of one constant index.

A reshape-like op's output is a view of its input (no step). So is a transpose that moves
only axes of one element (`reorders_nothing`) and a gather whose slice is contiguous
(`contiguous_slice`); any other transpose or gather copies its input.

A torch-exported attention layer copies each element of q, k and v twice: its input
projection's output (S, N, 3 * D) is reshaped and transposed into (3, S, N, D), q, k and v
are taken from that, each reshaped into its heads and transposed again, to (N * H, S, D).
`chains` finds such runs: a layout op that copies, whose output only layout ops read, and
below which every path through layout ops ends in one that copies anyway, makes a *virtual*
tensor (no memory, no step), as do the views between it and those ends. Each op that reads
a virtual tensor and whose own output is not virtual (the chain's *leaf*) copies its elements
straight from the chain's source, the last tensor with memory, through one strided view that
composes the chain's ops (`Fine`). In the BERT-like encoder of benchmarks/bench_models.py
(torch's TransformerEncoderLayer) that is the stack's copy of 3 MB a layer at batch 8: its
layout steps, one thread, 10.6 -> 6.4 ms a run (two threads 7.3 -> 4.8), and the stack has
no bytes in the arena.

A view composes where strides can say it: a transpose and a gather of one index always; a
reshape where its axes' sizes and those of the axes it takes apart divide each other ((6, 4)
-> (24,) or (2, 3, 4); not (2, 3) -> (3, 2) after a transpose, whose elements then must be
copied in the order they are read). `chains` materializes a tensor before such a reshape,
and before the last copy of a chain whose leaf would read its innermost axis across the
source's rows: k^T straight from the encoder's projection, one float of each 24 KiB row
(8 x 768 floats) in turn, took 1.4 ms against 0.5 for k's heads copied, then transposed.
"""
import math

import numpy as np

from .. import ops


def reorders_nothing(op, specs):
    """Whether op is a transpose whose permutation moves only axes of one element (batch 1's
    (1, 128, 256) -> (128, 1, 256) in a torch-exported encoder): its output is its input's
    elements in their order, a reshape."""
    perm = _permutation(op, specs)
    if perm is None:
        return False
    shape = specs[op.inputs[0]].shape
    kept = [axis for axis in perm if shape[axis] != 1]
    return kept == sorted(kept)


def _permutation(op, specs):
    """A transpose's permutation (none given: x's axes reversed), or None where op is not a
    transpose or its perm is not a permutation of x's axes (its kernel says what is wrong)."""
    if op.opcode != "transpose":
        return None
    rank = len(specs[op.inputs[0]].shape)
    perm = list(op.attrs.get("perm") or range(rank)[::-1])
    return perm if sorted(perm) == list(range(rank)) else None


def contiguous_slice(op, specs):
    """Where op is a gather of one index known to the plan (a constant) whose slice of x is
    contiguous (the axes before it of one element: a torch-exported encoder's q, k and v
    taken from their stack), the index of that slice in x; else None."""
    taken = _taken_index(op, specs)
    if taken is None:
        return None
    axis, k = taken
    if any(d != 1 for d in specs[op.inputs[0]].shape[:axis]):
        return None
    return (0,) * axis + (k,)


def _taken_index(op, specs):
    """(axis, index) of a gather of one constant index within x's axis, or None."""
    if op.opcode != "gather" or len(op.inputs) != 2:
        return None
    x, index = specs[op.inputs[0]], specs[op.inputs[1]]
    if index.value is None or np.ndim(index.value) != 0 or not np.issubdtype(np.asarray(index.value).dtype, np.integer):
        return None
    if not x.shape:
        return None
    axis = op.attrs["axis"] % len(x.shape)
    k, n = int(index.value), x.shape[axis]
    if not -n <= k < n:
        return None  # out of range: its kernel says so
    return axis, k % n


class Fine:
    """A tensor as a strided view of another's elements: `array`, a numpy view of that
    other's memory whose axes (the fine axes) each belong to one axis of the tensor:
    groups[a] lists axis a's fine axes, outermost first (none for an axis of one element).
    Its elements in the tensor's order are array.transpose(order()) read row-major."""

    __slots__ = ("array", "groups")

    def __init__(self, array, groups):
        self.array, self.groups = array, groups

    @classmethod
    def whole(cls, a):
        """Array `a` itself (its axes of one element dropped: they have no fine axis)."""
        array = a[tuple(0 if d == 1 else slice(None) for d in a.shape)]
        groups, n = [], 0
        for d in a.shape:
            groups.append([] if d == 1 else [n])
            n += d != 1
        return cls(array, groups)

    def order(self):
        return [x for group in self.groups for x in group]

    def transposed(self, perm):
        return Fine(self.array, [self.groups[p] for p in perm])

    def taken(self, axis, k):
        """Index k of axis `axis` (the axis removed)."""
        axes = self.groups[axis]
        index = [slice(None)] * self.array.ndim
        for x, i in zip(axes, np.unravel_index(k, [self.array.shape[x] for x in axes])):
            index[x] = int(i)
        gone = set(axes)
        renumbered = {x: n for n, x in enumerate(x for x in range(self.array.ndim) if x not in gone)}
        return Fine(self.array[tuple(index)], [[renumbered[x] for x in group]
                                               for a, group in enumerate(self.groups) if a != axis])

    def reshaped(self, shape):
        """The tensor reshaped (row-major) to `shape`, or None where its fine axes cannot be
        cut to fit: each new axis's size a product of whole runs of fine axes (neighbours in
        the tensor's order that lie one after the other in memory: one run) and of the outer
        or inner factors of one that it cuts."""
        runs = []  # (size, stride) of each run of fine axes, in the tensor's order
        for x in self.order():
            size, stride = self.array.shape[x], self.array.strides[x]
            if runs and runs[-1][1] == stride * size:
                runs[-1] = (runs[-1][0] * size, stride)
            else:
                runs.append((size, stride))
        fine_dims, fine_strides, groups = [], [], []
        at, left = 0, None  # left: what is not yet taken of runs[at]
        for d in shape:
            group = []
            while d > 1:
                if at == len(runs):
                    return None
                size, stride = runs[at]
                size = size if left is None else left
                if size <= d:
                    if d % size:
                        return None
                    group.append(len(fine_dims))
                    fine_dims.append(size)
                    fine_strides.append(stride)
                    d //= size
                    at, left = at + 1, None
                else:
                    if size % d:
                        return None
                    group.append(len(fine_dims))
                    fine_dims.append(d)
                    fine_strides.append(stride * (size // d))  # its outer factor; the inner one is left
                    d, left = 1, size // d
            groups.append(group)
        if at != len(runs):
            return None
        array = np.lib.stride_tricks.as_strided(self.array, fine_dims, fine_strides)
        return Fine(array, groups)

    def source_and_target(self, out):
        """(the tensor's elements as a view of the source, the same of `out`, a C-contiguous
        array of the tensor's shape), for one copy."""
        src = self.array.transpose(self.order())
        return src, out.reshape(src.shape)


def move(op, specs):
    """A function taking op's input as a Fine to its output as one, where op is a layout op
    (a transpose, a reshape-like op or a gather of one constant index); else None."""
    if op.opcode == "transpose":
        perm = _permutation(op, specs)
        return None if perm is None else lambda fine: fine.transposed(perm)
    if ops.get(op.opcode).view:
        shape = specs[op.outputs[0]].shape
        return lambda fine: fine.reshaped(shape)
    taken = _taken_index(op, specs)
    if taken is not None:
        return lambda fine: fine.taken(*taken)
    return None


def copies(op, specs):
    """Whether a layout op copies its input where it runs alone (not a view of it)."""
    if op.opcode == "transpose":
        return not reorders_nothing(op, specs)
    return op.opcode == "gather" and contiguous_slice(op, specs) is None


def chains(order, operators, specs, outputs):
    """(virtual, leaves): the ops of `order` whose outputs get no memory and no step, and
    {leaf op: (the chain's source tensor, the moves (`move`) from it to the leaf's output, in
    order)} for each op that reads a virtual tensor and makes one with memory (see the module
    notes). `outputs`: the tensors the plan gives back (never virtual)."""
    moves = {i: m for i in order if len(operators[i].outputs) == 1 and (m := move(operators[i], specs)) is not None
             and all(math.prod(specs[t].shape) for t in (operators[i].inputs[0], operators[i].outputs[0]))}
    readers = {}
    for i in order:
        for t in set(operators[i].inputs):
            readers.setdefault(t, []).append(i)

    def ends(t, below):
        """Whether every path from t through layout ops ends at one that copies; the views on
        the way into `below`."""
        if t in outputs or not readers.get(t):
            return False
        for r in readers[t]:
            if r not in moves or operators[r].inputs[0] != t or t in operators[r].inputs[1:]:
                return False
            if not copies(operators[r], specs):
                below.add(r)
                if not ends(operators[r].outputs[0], below):
                    return False
        return True

    virtual = set()
    for i in order:
        below = set()
        if i in moves and copies(operators[i], specs) and ends(operators[i].outputs[0], below):
            virtual |= below | {i}
    while True:  # each leaf's view composed, at the plan's shapes; a tensor made where one does not
        made_by = {operators[i].outputs[0]: i for i in virtual}
        leaves, failed = {}, None
        for i in order:
            if i in virtual or i not in moves or operators[i].inputs[0] not in made_by:
                continue
            chain, t = [i], operators[i].inputs[0]
            while t in made_by:
                chain.append(made_by[t])
                t = operators[made_by[t]].inputs[0]
            chain.reverse()
            fine = Fine.whole(_standing_for(specs[t]))
            for j in chain:
                fine = moves[j](fine)
                if fine is None:  # (never the chain's first op: a transpose or a gather)
                    failed = made_by[operators[j].inputs[0]]
                    break
            else:
                inner = fine.order()[-1:]
                copying = [j for j in chain[:-1] if copies(operators[j], specs)]
                if inner and fine.array.strides[inner[0]] != fine.array.itemsize and copying:
                    failed = copying[-1]  # read across the source's rows: made before the last copy
            if failed is not None:
                break
            leaves[i] = (t, [moves[j] for j in chain])
        if failed is None:
            return virtual, leaves
        virtual.discard(failed)


def _standing_for(spec):
    """A read-only C-contiguous view of spec's shape over one element: its strides are the
    arrays' the plan will have (views are composed on it; nothing is read)."""
    itemsize = np.dtype(spec.dtype).itemsize
    strides = [itemsize * math.prod(spec.shape[k + 1:]) for k in range(len(spec.shape))]
    return np.lib.stride_tricks.as_strided(np.zeros(1, spec.dtype), spec.shape, strides, writeable=False)


def compose(source, moves):
    """The Fine of a chain's leaf output: `moves` (chains') applied to array `source`. They
    compose on the plan's C-contiguous arrays; a source that is not one (a folded constant's
    transposed view) is read from a C-contiguous copy, made once (it does not change)."""
    fine = _applied(Fine.whole(source), moves)
    if fine is None:
        if source.flags.writeable:
            raise AssertionError("a layout chain's source changes between runs but is not C-contiguous")
        fine = _applied(Fine.whole(np.ascontiguousarray(source)), moves)
    return fine


def _applied(fine, moves):
    """`moves` applied to `fine` in turn, or None where one does not compose."""
    for step in moves:
        fine = step(fine)
        if fine is None:
            return None
    return fine
