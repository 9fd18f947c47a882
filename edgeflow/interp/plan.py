"""An execution plan: made once per set of input shapes, then run as a tight loop.

Preparing does the work that running must not: pick the ops the outputs need, order
them, infer every shape, place intermediates in one arena, and bind each kernel to its
input and output arrays.
"""
from collections import deque

import numpy as np

from .. import ops
from ..errors import FormatError, GraphError, InvalidInputError
from ..ops.registry import TensorSpec
from ..ops.shapes import fmt
from .arena import Arena, lower_bound, place
from .kernels import KERNELS


def needed_operators(subgraph, outputs, producer):
    """Indices of the operators `outputs` depend on, in an order where inputs come first."""
    needed, todo = set(), [producer[t] for t in outputs if t in producer]
    while todo:
        op = todo.pop()
        if op not in needed:
            needed.add(op)
            todo.extend(producer[t] for t in subgraph.operators[op].inputs if t in producer)
    waiting = {op: sum(1 for t in set(subgraph.operators[op].inputs) if t in producer) for op in needed}
    consumers = {}
    for op in needed:
        for t in set(subgraph.operators[op].inputs):
            if t in producer:
                consumers.setdefault(producer[t], []).append(op)
    ready = deque(sorted(op for op, n in waiting.items() if n == 0))
    order = []
    while ready:
        op = ready.popleft()
        order.append(op)
        for c in consumers.get(op, ()):
            waiting[c] -= 1
            if waiting[c] == 0:
                ready.append(c)
    if len(order) != len(needed):
        raise FormatError("the graph has a cycle")
    return order


class Plan:
    """Arrays and bound kernel calls for one signature at one set of input shapes."""

    def __init__(self, subgraph, inputs, outputs, input_shapes, persistent, preserve_all=False):
        self.subgraph, self.inputs, self.outputs = subgraph, list(inputs), list(outputs)
        producer = {t: i for i, op in enumerate(subgraph.operators) for t in op.outputs}
        fed = set(inputs)
        self.order = needed_operators(subgraph, outputs, producer)
        specs = self._infer(input_shapes, persistent)
        self.arrays = dict(persistent)  # constants and variables: not in the arena
        self._allocate(specs, preserve_all, fed)
        self.steps, self.step_ops = self._bind()

    def _infer(self, input_shapes, persistent):
        tensors = self.subgraph.tensors
        specs = {t: TensorSpec(tuple(shape), tensors[t].dtype) for t, shape in input_shapes.items()}
        specs.update((t, TensorSpec(a.shape, a.dtype)) for t, a in persistent.items())
        for i in self.order:
            op = self.subgraph.operators[i]
            missing = [tensors[t].name for t in op.inputs if t not in specs]
            if missing:
                raise InvalidInputError(f"op {i} ({op.opcode}) needs {missing}, which no input feeds")
            try:
                outs = ops.get(op.opcode).infer_specs([specs[t] for t in op.inputs], op.attrs)
            except GraphError as e:
                raise InvalidInputError(f"op {i} ({op.opcode}) rejects these input shapes: {e}") from None
            for t, spec in zip(op.outputs, outs):
                declared = tensors[t]
                fits = len(declared.shape) == spec.rank and all(
                    d in (-1, s) for d, s in zip(declared.shape, spec.shape))
                if spec.dtype != declared.dtype or not fits:
                    raise FormatError(f"tensor {t} {declared.name!r} is declared {declared.dtype}"
                                      f"{fmt(declared.shape)} but op {op.opcode} makes "
                                      f"{spec.dtype}{fmt(spec.shape)}")
                specs[t] = spec
        return specs

    def _allocate(self, specs, preserve_all, fed):
        """Arena offsets for every tensor that needs bytes; views alias their source's bytes."""
        end = len(self.order)
        root = {}  # view tensor -> the tensor whose bytes it reinterprets
        life = {t: [0, end] for t in fed}  # inputs stay intact: invoke can run again
        for step, i in enumerate(self.order):
            op = self.subgraph.operators[i]
            for t in op.inputs:
                r = root.get(t, t)
                if r in life:
                    life[r][1] = max(life[r][1], step)
            if ops.get(op.opcode).view:
                root[op.outputs[0]] = root.get(op.inputs[0], op.inputs[0])
                continue
            for t in op.outputs:
                life.setdefault(t, [step, step])
        for t in self.outputs:
            r = root.get(t, t)
            if r in life:
                life[r][1] = end
        if preserve_all:
            life = {t: [0, end] for t in life}
        owned = [t for t in life if t not in self.arrays]
        requests = [(int(np.prod(specs[t].shape, dtype=np.int64)) * specs[t].dtype.itemsize,
                     *life[t]) for t in owned]
        offsets, nbytes = place(requests)
        self.arena = Arena(nbytes)
        self.requests, self.offsets = requests, dict(zip(owned, offsets))
        self.lower_bound = lower_bound(requests)
        for t, offset in self.offsets.items():
            self.arrays[t] = self.arena.view(offset, specs[t].shape, specs[t].dtype)
        self._specs = specs

    def _bind(self):
        steps, step_ops = [], []
        for i in self.order:
            op = self.subgraph.operators[i]
            ins = [self.arrays[t] for t in op.inputs]
            if ops.get(op.opcode).view:
                self.arrays[op.outputs[0]] = ins[0].reshape(self._specs[op.outputs[0]].shape)
                continue
            outs = [self.arrays[t] for t in op.outputs]
            steps.append(KERNELS[op.opcode](ins, outs, op.attrs))
            step_ops.append(i)
        return steps, step_ops

    def run(self):
        it = iter(self.steps)
        try:
            with np.errstate(all="ignore"):
                for step in it:
                    step()
        except (IndexError, ValueError) as e:
            i = self.step_ops[len(self.steps) - 1 - sum(1 for _ in it)]
            raise InvalidInputError(f"op {i} ({self.subgraph.operators[i].opcode}) failed: {e}") from e
