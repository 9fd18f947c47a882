"""Running control flow: the model's subgraphs, each planned per input shapes and cached.

An `if` or `while` op (edgeflow/ops/control.py) runs subgraphs of the model. A `Program`
holds, for each subgraph, its constants, the values folded from them, and a cache of
plans by input shapes: a subgraph is prepared once per set of input shapes, its arena
planned like the main graph's, and a loop whose variables keep their shapes runs one
plan for every iteration (a new shape finds or makes another). Delegates partition
subgraphs' plans as they do the main graph's.

While preparing the op that runs them, a plan asks `specs` for the op's output shapes:
known when the branches agree, or when a loop keeps its variables' shapes and stacks
nothing; otherwise ShapeDependsOnValues makes the op a boundary of a staged plan, run
on its values (`run`) before what follows it is planned.
"""
import numpy as np

from ..errors import InvalidInputError
from ..ops.control import IF, WHILE
from ..ops.registry import TensorSpec
from .arena import default_max_tensor_bytes, size_text
from .plan import ShapeDependsOnValues
from .staged import PlanCache, StagedPlan, make_plan

_PLANS_PER_SUBGRAPH = 16


def truth(value, opcode="if"):
    """The Python bool of a one-element condition."""
    value = np.asarray(value)
    if value.size != 1:
        raise InvalidInputError(f"{opcode}: a condition must hold one value, got shape {value.shape}")
    return bool(value.reshape(-1)[0])


class Program:
    """The subgraphs of `model`, planned on demand for the shapes they meet."""

    def __init__(self, model, delegates=(), max_bytes=None):
        self.model, self.delegates = model, list(delegates)
        self.max_bytes = default_max_tensor_bytes() if max_bytes is None else max_bytes
        self._constants, self._folded, self._plans = {}, {}, {}
        self.iterations = {}  # loop body subgraph -> iterations its last run took

    def plan(self, k, shapes):
        """The plan of subgraph `k` (its outputs from its inputs) at input `shapes`."""
        cache = self._plans.get(k)
        if cache is None:
            sub = self.model.subgraphs[k]
            self._constants[k] = {i: t.data for i, t in enumerate(sub.tensors) if t.data is not None}
            self._folded[k] = {}
            cache = self._plans[k] = PlanCache(_PLANS_PER_SUBGRAPH)
        return cache.get(shapes, lambda: self._make(k, shapes))

    def _make(self, k, shapes):
        sub = self.model.subgraphs[k]
        return make_plan(sub, sub.inputs, sub.outputs, dict(zip(sub.inputs, shapes)), self._constants[k],
                         {}, self._folded[k], delegates=self.delegates, program=self, max_bytes=self.max_bytes)

    def plans(self):
        """Every cached plan of every subgraph (for memory accounting)."""
        return [p for cache in self._plans.values() for p in cache.values()]

    # -- what a plan asks while preparing ----------------------------------------------
    def specs(self, index, op, ins, unread=()):
        """Output specs of control op `op` (operator `index`) for input specs `ins`;
        ShapeDependsOnValues when they are known only once it runs. A loop's stacked
        outputs at positions `unread` (that nothing reads: those kept for gradients, in
        an inference signature) are not made: empty, shape [0, ...]."""
        later = ShapeDependsOnValues(f"op {index} ({op.opcode}): its output shapes are known only "
                                     "once it runs", op=index)
        if op.opcode == IF:
            names = ("then_branch", "else_branch")
            if ins[0].value is not None:
                names = (names[0] if truth(ins[0].value) else names[1],)
            results = [self._static_outputs(op.attrs[n], ins[1:]) for n in names]
            if None in results or any(r != results[0] for r in results):
                raise later
            return results[0]
        n = len(ins)
        body = self.model.subgraphs[op.attrs["body"]]
        outs = self._static_outputs(op.attrs["body"], ins)
        stacks = range(n, len(body.outputs))
        if outs is None or any(k not in unread for k in stacks) or \
                [s.shape for s in outs[:n]] != [s.shape for s in ins]:
            raise later
        return [TensorSpec(s.shape, s.dtype) for s in ins] + [TensorSpec((0,) + s.shape, s.dtype) for s in outs[n:]]

    def _static_outputs(self, k, ins):
        """Output specs of subgraph `k` for input specs `ins`, if a plan fixes them."""
        try:
            plan = self.plan(k, tuple(s.shape for s in ins))
        except InvalidInputError:  # may hold only for values that never reach it
            return None
        if isinstance(plan, StagedPlan):
            return None
        return [TensorSpec(plan.arrays[t].shape, plan.arrays[t].dtype) for t in self.model.subgraphs[k].outputs]

    def flops(self, op, ins):
        """Arithmetic operations of one run of control op `op` on inputs `ins` (specs): the
        costlier branch; a loop's body times the iterations its last run took (else its
        bound, else one). 0 where a subgraph cannot be planned ahead for these shapes."""
        def cost(k, specs):
            try:
                plan = self.plan(k, tuple(s.shape for s in specs))
            except InvalidInputError:
                return 0
            return sum(plan.flops().values())
        if op.opcode == IF:
            return max(cost(op.attrs[n], ins[1:]) for n in ("then_branch", "else_branch"))
        body = op.attrs["body"]
        limit = op.attrs["maximum_iterations"]
        count = self.iterations.get(body, limit if limit >= 0 else 1)
        return count * (cost(body, ins) + cost(op.attrs["cond"], ins))

    # -- running -------------------------------------------------------------------------
    def bind(self, op, ins, outs, unread=()):
        """A step running control op `op` from arrays `ins` into arrays `outs` (a loop
        makes no stacks at positions `unread`: see `specs`)."""
        if op.opcode == IF:
            branches = (_Runner(self, op.attrs["then_branch"]), _Runner(self, op.attrs["else_branch"]))
            cond, args = ins[0], ins[1:]

            def step():
                for dst, src in zip(outs, branches[not truth(cond)](args)):
                    np.copyto(dst, src)
            return step
        loop = _Loop(self, op, skip={k - len(ins) for k in unread if k >= len(ins)})
        wanted = [(k, a) for k, a in enumerate(outs) if k not in unread]

        def step():
            values = loop(ins)
            for k, dst in wanted:
                np.copyto(dst, values[k])
        return step

    def run(self, op, values):
        """The outputs of control op `op` on input `values`, as new arrays."""
        if op.opcode == IF:
            k = op.attrs["then_branch"] if truth(values[0]) else op.attrs["else_branch"]
            return [np.array(a) for a in _Runner(self, k)(values[1:])]
        return _Loop(self, op)(values)


class _Runner:
    """Runs subgraph `k` on given arrays, through the plan for their shapes."""

    def __init__(self, program, k):
        self.program, self.k = program, k
        self.sub = sub = program.model.subgraphs[k]
        self.shapes, self.plan, self.given = None, None, {}
        # Inputs that an op or the outputs read (a loop condition reads few of the loop's
        # values: not the weights its body is given): the others are not copied in.
        read = {t for op in sub.operators for t in op.inputs} | set(sub.outputs)
        self.read = [(i, t) for i, t in enumerate(sub.inputs) if t in read]

    def __call__(self, values, keep=()):
        """The subgraph's output arrays (the plan's own: valid until its next run) for
        input `values`; inputs at positions `keep` still hold what the last call gave them."""
        shapes = [v.shape for v in values]
        if shapes != self.shapes:
            self.plan, self.shapes, keep, self.given = self.program.plan(self.k, tuple(shapes)), shapes, (), {}
        plan = self.plan
        if getattr(plan, "loaded_by", None) is not self:  # another op ran the same plan since
            plan.loaded_by, keep = self, ()
            self.given = {}
        arrays, given = plan.arrays, self.given
        for i, t in self.read:
            v = values[i]
            if i in keep or given.get(i) is v:
                continue
            np.copyto(arrays[t], v)
            if not v.flags.writeable:  # a constant of the caller's: the same next time it comes
                given[i] = v
            elif given:
                given.pop(i, None)
        plan.run(errstate=False)
        return [arrays[t] for t in self.sub.outputs]


class _Loop:
    """One `while` op: runs its condition and body until the condition is false."""

    def __init__(self, program, op, skip=()):
        self.cond, self.body = _Runner(program, op.attrs["cond"]), _Runner(program, op.attrs["body"])
        self.keep = [k for k in range(len(program.model.subgraphs[op.attrs["body"]].outputs) - len(op.inputs))
                     if k not in skip]  # the stacks to make
        self.limit = op.attrs["maximum_iterations"]
        self.max_bytes = program.max_bytes
        body = self.body.sub
        self.n = len(op.inputs)
        # Loop variables the body passes through unchanged (captured values: weights) are
        # copied into its plan once, not once per iteration.
        self.same = {i for i in range(self.n) if body.outputs[i] == body.inputs[i]}

    def __call__(self, values):
        n, limit, cond, body, keep = self.n, self.limit, self.cond, self.body, self.keep
        changing = [i for i in range(n) if i not in self.same]
        extra = len(body.sub.outputs) - n
        values, stacks, iterations, stacked = list(values), [], 0, 0
        kept = ()
        while limit < 0 or iterations < limit:
            flag = cond(values, kept)[0]
            if not (bool(flag) if flag.size == 1 else truth(flag, WHILE)):
                break
            outs = body(values, kept)
            kept = self.same
            for i in changing:
                values[i] = outs[i].copy()  # the plan's arrays are overwritten next time
            if keep:
                stacks.append([outs[n + k].copy() for k in keep])
                stacked += sum(a.nbytes for a in stacks[-1])
                if 2 * stacked > self.max_bytes:  # the parts, then the stacks made of them
                    raise InvalidInputError(
                        f"while: after {iterations + 1} iterations its stacked outputs need "
                        f"{size_text(2 * stacked)}, more than max_tensor_bytes={self.max_bytes} allows")
            iterations += 1
        self.body.program.iterations[self.body.k] = iterations
        if not extra:
            return values
        if not iterations:
            return values + self._empty_stacks(values)
        try:
            made = {k: np.stack(parts) for k, parts in zip(self.keep, zip(*stacks))}
        except ValueError:
            shapes = sorted({a.shape for parts in stacks for a in parts[:1]})
            raise InvalidInputError(f"while: a stacked output changes shape between iterations "
                                    f"({shapes[:3]}); it must keep one shape") from None
        return values + [made.get(k) for k in range(extra)]  # None: not wanted (see bind)

    def _empty_stacks(self, values):
        """Stacks of zero iterations: [0, ...] with the element shape the body would give
        these loop variables (its declared shape, unknown dimensions 0, if it cannot say)."""
        body = self.body.sub
        try:
            plan = self.body.program.plan(self.body.k, tuple(v.shape for v in values))
            shapes = [plan.arrays[t].shape for t in body.outputs[self.n:]] \
                if not isinstance(plan, StagedPlan) else None
        except InvalidInputError:
            shapes = None
        if shapes is None:
            shapes = [tuple(max(d, 0) for d in body.tensors[t].shape) for t in body.outputs[self.n:]]
        return [np.empty((0,) + tuple(s), body.tensors[t].dtype) for s, t in zip(shapes, body.outputs[self.n:])]
