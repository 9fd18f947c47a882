"""Plans for graphs whose shapes depend on values (TFLite's dynamic tensors).

Where an op's output shape depends on values that are known only when running (a
Reshape to a shape fed as an input, NonZero, TopK with a fed k), one Plan cannot be
made in advance. `make_plan` then makes a StagedPlan: a Plan for the ops before that
op, the op itself run on the values it gets (its outputs allocated once their shapes are
known), and a plan for the rest, made for the shapes it meets and cached. The rest may
itself be staged, at the next such op.
"""
from collections import OrderedDict

import numpy as np

from .. import ops
from ..errors import GraphError, InvalidInputError
from ..ops.registry import TensorSpec
from .arena import bounded, nbytes, size_text
from .kernels import evaluate, jit
from .plan import Plan, ShapeDependsOnValues, _check_declared, needed_operators

_REST_CACHE_SIZE = 8
SHAPE_LIKE_MAX = 16  # elements: a small integer tensor may set later shapes; plan for its value


class PlanCache:
    """Plans by key; past `size`, the least recently used is dropped."""

    def __init__(self, size):
        self._plans, self._size = OrderedDict(), size

    def get(self, key, make):
        """The plan cached under `key`, or `make()`'s, cached; a provisional one (bound while
        numba loads: plan.py's _bind) made again once numba is ready."""
        plan = self._plans.get(key)
        if plan is not None and getattr(plan, "provisional", False) and jit.ready():
            del self._plans[key]
            plan = None
        if plan is None:
            plan = self._plans[key] = make()
            if len(self._plans) > self._size:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(key)
        return plan

    def values(self):
        return self._plans.values()

    def pop_oldest(self):
        """Drop the least recently used plan and return it (None if there is none)."""
        return self._plans.popitem(last=False)[1] if self._plans else None


def make_plan(subgraph, inputs, outputs, shapes, constants, variables, folded, preserve_all=False,
              targets=(), delegates=(), known=None, update_ops=frozenset(), program=None, max_bytes=None):
    """A Plan, or a StagedPlan where some shape depends on values (same arguments as Plan)."""
    args = (subgraph, inputs, outputs, shapes, constants, variables, folded, preserve_all,
            targets, delegates, known, update_ops, program, max_bytes)
    try:
        return Plan(*args)
    except ShapeDependsOnValues as e:
        if e.op is None:
            raise
        return StagedPlan(e.op, *args)


class StagedPlan:
    """Runs the ops before op `boundary` (a Plan), then op `boundary` on the values it
    gets, then a plan for the rest made for the shapes that gives (cached)."""

    def __init__(self, boundary, subgraph, inputs, outputs, shapes, constants, variables, folded,
                 preserve_all=False, targets=(), delegates=(), known=None, update_ops=frozenset(),
                 program=None, max_bytes=None):
        self.subgraph, self.inputs, self.outputs = subgraph, list(inputs), list(outputs)
        self.boundary = boundary
        self._common = (constants, variables, folded, preserve_all, tuple(targets), delegates)
        self._update_ops, self.program = update_ops, program
        fed = set(inputs)
        producer = {t: i for i, op in enumerate(subgraph.operators) for t in op.outputs if t not in fed}
        order = needed_operators(subgraph, outputs, producer, targets)
        position = order.index(boundary)
        # Ops run for their effect (variable writes) come last in `order`, so they run in
        # the rest, after every read: unless the boundary itself reads what one wrote.
        written = [i for i in order[:position] if ops.get(subgraph.operators[i].opcode).stateful]
        if written:
            raise ShapeDependsOnValues(f"op {boundary} ({subgraph.operators[boundary].opcode}) has output "
                                       f"shapes known only when running, and reads what op {written[0]} "
                                       "writes in the same run")
        made = fed | {t for i in order[:position] for t in subgraph.operators[i].outputs}
        later = {t for i in order[position + 1:] for t in subgraph.operators[i].inputs} | set(outputs)
        here = subgraph.operators[boundary]
        # What the ops from the boundary on read of what came before (constants, variables
        # and folded values the rest finds itself; a fed tensor held in `variables` is an
        # outer stage's, carried on as held).
        self._carried = sorted(t for t in made & later if t not in constants and (t not in variables or t in fed))
        needed = sorted(set(self._carried) | {t for t in here.inputs if t in made})
        self.before = Plan(subgraph, inputs, needed, shapes, constants, variables, folded,
                           preserve_all, (), delegates, known, update_ops, program, max_bytes)
        self.max_bytes = self.before.max_bytes
        self._known_before = {t: v for t, v in self.before.values.items() if t in self._carried}
        self._rests = PlanCache(_REST_CACHE_SIZE)
        self.rest = None  # the plan the last run used for the rest
        self.arrays = {t: self.before.arrays[t] for t in inputs}

    @property
    def provisional(self):
        """Whether the ops before the boundary were bound while numba loads (PlanCache then
        makes this plan again once it is ready; the rests' plans are cached alike)."""
        return self.before.provisional

    # -- running -----------------------------------------------------------------------
    def _boundary_values(self):
        """Run the boundary op on the values it gets; its outputs, newly allocated."""
        op = self.subgraph.operators[self.boundary]
        ins = [TensorSpec(a.shape, a.dtype, a) for a in (self.before.arrays[t] for t in op.inputs)]
        try:
            if ops.get(op.opcode).subgraphs:
                with np.errstate(all="ignore"):
                    values = self.program.run(op, [s.value for s in ins])
                for t, v in zip(op.outputs, values):
                    if v is not None:
                        _check_declared(t, self.subgraph.tensors[t], TensorSpec(v.shape, v.dtype), op.opcode)
                return values
            outs = ops.get(op.opcode).infer_specs(ins, op.attrs)
            for t, spec in zip(op.outputs, outs):  # sized by values: checked before allocating
                _check_declared(t, self.subgraph.tensors[t], spec, op.opcode)
                size = nbytes(spec.shape, spec.dtype)
                if size > self.max_bytes:
                    raise InvalidInputError(
                        f"op {self.boundary} ({op.opcode}) output {self.subgraph.tensors[t].name[:40]!r}: "
                        f"{spec.dtype}{list(spec.shape)} needs {size_text(size)}, more than "
                        f"max_tensor_bytes={self.max_bytes} allows (for these input values)")
            with np.errstate(all="ignore"), bounded(self.max_bytes):
                return evaluate(op.opcode, op.attrs, [s.value for s in ins], outs)
        except (GraphError, IndexError, ValueError, ArithmeticError) as e:
            raise InvalidInputError(f"op {self.boundary} ({op.opcode}) rejects the values it got: {e}") from None

    def _rest_for(self, feeds):
        """The cached plan for the ops after the boundary, given the boundary op's outputs
        `feeds`. The carried tensors are its inputs too, held where the ops before put them
        (the before plan's arrays, which stay while this plan lives): the rest reads them
        there, as it reads a variable, and nothing copies them (SSDlite's 180 stages, one per
        class, each carried 184 tensors: 247 MB of copies a run)."""
        here = self.subgraph.operators[self.boundary]
        known = dict(self._known_before)
        known.update((t, feeds[t]) for t in here.outputs
                     if feeds[t].dtype.kind in "iu" and feeds[t].size <= SHAPE_LIKE_MAX)
        key = (tuple((t, a.shape) for t, a in feeds.items()),
               tuple((t, v.tobytes()) for t, v in sorted(known.items()) if t in here.outputs))
        constants, variables, folded, preserve_all, targets, delegates = self._common

        def make():
            held = {t: self.before.arrays[t] for t in self._carried if t not in feeds and t not in known}
            shapes = {t: self.before.arrays[t].shape for t in self._carried}  # a known one: its value assumed
            shapes.update((t, a.shape) for t, a in feeds.items())
            return make_plan(self.subgraph, list(shapes), self.outputs, shapes, constants, {**variables, **held},
                             folded, preserve_all, targets, delegates, known, self._update_ops, self.program,
                             self.max_bytes)
        return self._rests.get(key, make)

    def _enter_rest(self, values):
        """The rest's plan for the boundary op's output `values`, with them copied in."""
        here = self.subgraph.operators[self.boundary]
        feeds = dict(zip(here.outputs, values))
        self.rest = self._rest_for(feeds)
        for t, a in feeds.items():
            np.copyto(self.rest.arrays[t], a)
        return self.rest

    def each_step(self):
        """(step, op index, arrays) in running order: the steps before the boundary, the
        boundary op, then the rest's (planned once the boundary op has run)."""
        yield from self.before.each_step()
        here, got = self.subgraph.operators[self.boundary], {}
        yield (lambda: got.update(zip(here.outputs, self._boundary_values()))), self.boundary, got
        yield from self._enter_rest([got[t] for t in here.outputs]).each_step()
        self.arrays.update((t, self.rest.arrays[t]) for t in self.outputs)

    def run(self, errstate=True):
        self.before.run(errstate)
        self._enter_rest(self._boundary_values()).run(errstate)
        self.arrays.update((t, self.rest.arrays[t]) for t in self.outputs)

    # -- what a Plan tells ---------------------------------------------------------------
    @property
    def order(self):
        rest = self.rest.order if self.rest is not None else []
        return self.before.order + [self.boundary] + rest

    @property
    def arena(self):
        return self.before.arena

    def placement_summary(self):
        return "; ".join(p.placement_summary() for p in (self.before, self.rest) if p is not None)

    def flops(self):
        out = self.before.flops()
        if self.rest is not None:
            out.update(self.rest.flops())
        return out
