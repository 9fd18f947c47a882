"""An execution plan: made once per set of input shapes, then run as a tight loop.

Preparing does the work that running must not: pick the ops the outputs need, order
them, infer every shape, place intermediates in one arena, and bind each kernel to its
input and output arrays.
"""
import contextlib
import math
from collections import deque
from dataclasses import replace

import numpy as np

from .. import ops
from ..errors import FormatError, InvalidInputError, UnsupportedOpError
from ..ops.registry import TensorSpec, fused_activation
from ..ops.dims import fmt
from . import layout, threads
from .arena import (Arena, TooLarge, Workspace, bounded, default_max_tensor_bytes, lower_bound, nbytes,
                    place, size_text)
from .kernels import KERNELS, evaluate, jit
from .kernels import array as array_kernels
from .kernels import conv as conv_kernels
from .kernels import math as math_kernels
from .kernels import norm as norm_kernels

EXACT_ACTIVATIONS = ("", "relu", "relu6")  # selects: the same bits wherever they are applied


class ShapeDependsOnValues(InvalidInputError):
    """An output's shape depends on an input's value, which the plan does not know:
    op `op` (an operator index) must run before what follows it can be planned."""

    def __init__(self, message, op=None):
        super().__init__(message)
        self.op = op


def needed_operators(subgraph, outputs, producer, targets=()):
    """Indices of the operators `outputs` and `targets` depend on (targets included), in
    an order where inputs come first and ops that write variables come after every op
    that does not depend on them, so reads in one run see the values from before it."""
    needed, todo = set(), [producer[t] for t in outputs if t in producer] + list(targets)
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
    writes = {op for op in needed if ops.get(subgraph.operators[op].opcode).stateful}
    ready = [deque(), deque()]  # pure ops first, then writes
    for op in sorted(op for op, n in waiting.items() if n == 0):
        ready[op in writes].append(op)
    order = []
    while ready[0] or ready[1]:
        op = (ready[0] or ready[1]).popleft()
        order.append(op)
        for c in consumers.get(op, ()):
            waiting[c] -= 1
            if waiting[c] == 0:
                ready[c in writes].append(c)
    if len(order) != len(needed):
        raise FormatError("the graph has a cycle")
    return order


def dequantize(tensor):
    """The real values of a quantized constant: scale * (q - zero_point), as float32."""
    q = tensor.quantization
    shape = [1] * len(tensor.shape)
    if q.axis >= 0:
        shape[q.axis] = -1
    scale = np.asarray(q.scale, np.float32).reshape(shape)
    zero = np.asarray(q.zero_point or (0,), np.float32).reshape(shape if q.zero_point else ())
    with np.errstate(over="ignore"):  # a scale near float32's limit: inf, as the file says
        out = (tensor.data.astype(np.float32) - zero) * scale
    out.setflags(write=False)
    return out


def _check_declared(index, declared, spec, opcode):
    fits = len(declared.shape) == spec.rank and all(
        d in (-1, s) for d, s in zip(declared.shape, spec.shape))
    if spec.dtype != declared.dtype or not fits:
        raise FormatError(f"tensor {index} {declared.name!r} is declared {declared.dtype}"
                          f"{fmt(declared.shape)} but op {opcode} makes {spec.dtype}{fmt(spec.shape)}")


class Plan:
    """Arrays and bound kernel calls for one signature at one set of input shapes.

    `constants` and `variables` map tensor indices to arrays; `folded` is the
    interpreter's cache of values computed from constants alone (quantized weights
    dequantized, ops on constants), shared by all its plans. Ops whose operands are all
    known while preparing (constants, shapes) run here, once, and not when invoked.

    Every size is checked before it is allocated: each input, each op's outputs (folded
    values included), each scratch array and the arena must hold at most `max_bytes`
    (default: arena.default_max_tensor_bytes()). Past it: FormatError when the file fixes
    the sizes (every input declared with static dims, no fed values assumed), else
    InvalidInputError; the message names the op and the tensor.
    """

    def __init__(self, subgraph, inputs, outputs, input_shapes, constants, variables, folded,
                 preserve_all=False, targets=(), delegates=(), known=None, update_ops=frozenset(),
                 program=None, max_bytes=None):
        # Its own list of operators: an op whose attributes come from operands is replaced
        # by the op with those values as attributes (see _infer).
        subgraph = replace(subgraph, operators=list(subgraph.operators))
        self.subgraph, self.inputs, self.outputs = subgraph, list(inputs), list(outputs)
        self.max_bytes = default_max_tensor_bytes() if max_bytes is None else max_bytes
        # Sizes fixed by the file: no dimension or value comes from what is fed.
        self.fixed = not known and all(-1 not in subgraph.tensors[t].shape for t in inputs)
        self.update_ops = update_ops  # indices of ops that compute optimizer updates
        self.program = program  # the model's subgraphs, for ops that run them (interp/control.py)
        fed = set(inputs)  # may be intermediates: what produces them then does not run
        producer = {t: i for i, op in enumerate(subgraph.operators) for t in op.outputs if t not in fed}
        self.arrays = dict(variables)  # variables, constants and folded values: not in the arena
        specs = self._infer(needed_operators(subgraph, outputs, producer, targets), input_shapes,
                            constants, variables, folded, known or {})
        self.preserve_all = preserve_all
        # conv, matmul, mul or batch_norm index -> the ops right after it that its step may run (_fusions)
        self.chains = {}
        self.scaled = {}  # mul index -> (x, scale): a 1x1 conv reads x times scale (_epilogues)
        self.provisional = False  # bound without numba while it loads (_bind): made again once it is ready
        if not preserve_all:
            self.order = self._epilogues(self.order, specs)
        # With no delegate to bind them, chains of layout ops that end in copies: those whose
        # outputs only more of them read have no memory and no step (`virtual`), each op that
        # reads one copies from the chain's source through one view (`composed`: layout.py).
        self.virtual, self.composed = (set(), {}) if delegates or preserve_all else \
            layout.chains(self.order, subgraph.operators, specs, set(self.outputs))
        rest = [i for i in self.order if i not in self.virtual and i not in self.composed]
        # Ops whose output is a view of their input (reshape-likes; with no delegate to bind
        # them, transposes that move only axes of one element: the same elements in the same
        # order, and gathers of one constant index whose slice is contiguous: `slices`)
        self.slices = {} if delegates else {i: s for i in rest
                                            if (s := layout.contiguous_slice(subgraph.operators[i], specs)) is not None}
        self.views = {i for i in rest if ops.get(subgraph.operators[i].opcode).view or i in self.slices
                      or (not delegates and layout.reorders_nothing(subgraph.operators[i], specs))}
        self._allocate(specs, preserve_all, fed)
        self._views(specs)
        self.workspace = Workspace()  # the kernels' scratch, shared by their steps
        self.placement, self.fallbacks, self.partitions = {}, {}, 0
        if delegates:
            self.steps, self.step_ops = self._bind_delegated(delegates, constants, folded)
        else:
            self.steps, self.step_ops = self._bind()

    def _infer(self, order, input_shapes, constants, variables, folded, known):
        """Specs of every tensor; folds what is known now; sets self.order to what remains.
        `known` inputs' values are assumed (this plan serves only those values)."""
        tensors = self.subgraph.tensors
        specs = {t: TensorSpec(tuple(shape), tensors[t].dtype, known.get(t))
                 for t, shape in input_shapes.items()}
        for t, spec in specs.items():
            self._bound(lambda: f"input {tensors[t].name[:40]!r}", spec)
        # A fed value the plan assumes is held outside the arena, so that kernels bound now
        # read it (the caller copies the same value in before each run).
        self.arrays.update((t, np.array(v, tensors[t].dtype).reshape(input_shapes[t])) for t, v in known.items())
        specs.update((t, TensorSpec(a.shape, a.dtype)) for t, a in variables.items())
        static = set()  # tensors whose value follows from constants alone
        for t, data in constants.items():
            if tensors[t].quantization is not None:
                if t not in folded:
                    self._refuse(f"constant {tensors[t].name[:40]!r}", "its float32 values",
                                 nbytes(tensors[t].shape, np.float32))
                    folded[t] = dequantize(tensors[t])
                data = folded[t]
            specs[t] = TensorSpec(data.shape, data.dtype, data)
            self.arrays[t] = data
            static.add(t)
        self.order = []
        consumed = {t for i in order for t in self.subgraph.operators[i].inputs} | set(self.outputs)
        self.unread = {}  # control op -> positions of its outputs that nothing here reads
        for i in order:
            op = self.subgraph.operators[i]
            missing = [tensors[t].name for t in op.inputs if t not in specs]
            if missing:
                raise InvalidInputError(f"op {i} ({op.opcode}) needs {missing}, which no input feeds")
            ins = [specs[t] for t in op.inputs]
            opdef = ops.get(op.opcode)
            if opdef.subgraphs:  # control flow: its subgraphs' plans give the shapes
                if self.program is None:
                    raise FormatError(f"op {i} ({op.opcode}) runs subgraphs, but the plan was made "
                                      "without the model's (program=None)")
                self.unread[i] = {k for k, t in enumerate(op.outputs) if t not in consumed}
                outs = self.program.specs(i, op, ins, self.unread[i])
                for t, spec in zip(op.outputs, outs):
                    _check_declared(t, tensors[t], spec, op.opcode)
                    self._bound(lambda: f"op {i} ({op.opcode}) output {tensors[t].name[:40]!r}", spec)
                self.order.append(i)
                specs.update(zip(op.outputs, outs))
                continue
            try:
                outs = opdef.infer_specs(ins, op.attrs)
            except (ValueError, ArithmeticError) as e:  # GraphError, or numbers no shape has (NaN, inf)
                raise (FormatError if self.fixed else InvalidInputError)(
                    f"op {i} ({op.opcode}) rejects these inputs: {e}") from None
            own = len(ins) - opdef.operand_inputs(len(ins))
            unknown = [tensors[t].name for t in op.inputs[own:] if specs[t].value is None]
            if unknown:
                raise ShapeDependsOnValues(f"op {i} ({op.opcode}): its attributes come from "
                                           f"{unknown}, known only when running", op=i)
            read = op.inputs  # operands included: a value folded from them depends on them too
            if own < len(ins):  # kernels and delegates see the op with those values as attributes
                ins, attrs = opdef.take_operands(ins, op.attrs)
                op = self.subgraph.operators[i] = replace(op, inputs=op.inputs[:own], attrs=attrs)
            for t, spec in zip(op.outputs, outs):
                if None in spec.shape:
                    raise ShapeDependsOnValues(
                        f"op {i} ({op.opcode}): the shape of {tensors[t].name!r} depends on input "
                        f"values, not only on input shapes", op=i)
                _check_declared(t, tensors[t], spec, op.opcode)
                self._bound(lambda: f"op {i} ({op.opcode}) output {tensors[t].name[:40]!r}", spec)
            if not (opdef.stateful or opdef.random or opdef.remote) and (all(s.value is not None for s in ins)
                                                         or all(s.value is not None for s in outs)):
                is_static = all(t in static for t in read)
                values = self._fold(i, op, ins, outs, folded if is_static else {}, is_static)
                outs = [TensorSpec(s.shape, s.dtype, v) for s, v in zip(outs, values)]
                self.arrays.update(zip(op.outputs, values))
                if is_static:
                    static.update(op.outputs)
            else:
                self.order.append(i)
            specs.update(zip(op.outputs, outs))
        self.values = {t: s.value for t, s in specs.items() if s.value is not None}
        return specs

    def _bound(self, what, spec):
        """FormatError or InvalidInputError (see the class) if `spec` needs more than max_bytes;
        what() names the tensor (formatted only then: 17 us a tensor, a sixth of a MediaPipe
        model's shape inference, when every tensor's message was made)."""
        if None not in spec.shape:
            size = nbytes(spec.shape, spec.dtype)
            if size > self.max_bytes:
                self._refuse(what(), f"{spec.dtype}{list(spec.shape)}", size)

    def _refuse(self, what, thing, size):
        if size > self.max_bytes:
            kind, why = (FormatError, "the file fixes this size") if self.fixed else \
                (InvalidInputError, "for these inputs")
            raise kind(f"{what}: {thing} needs {size_text(size)}, more than max_tensor_bytes="
                       f"{self.max_bytes} allows ({why})")

    def _fold(self, i, op, ins, outs, cache, is_static):
        """The output values of op `i`, computed now (or taken from `cache`)."""
        if all(t in cache for t in op.outputs):
            return [cache[t] for t in op.outputs]
        try:
            with bounded(self.max_bytes):
                values = evaluate(op.opcode, op.attrs, [s.value for s in ins], outs)
        except TooLarge as e:
            self._refuse(f"op {i} ({op.opcode})", "scratch", e.nbytes)
            raise
        except (IndexError, ValueError, ArithmeticError) as e:  # a kernel refusing these values
            raise (FormatError if is_static else InvalidInputError)(
                f"op {i} ({op.opcode}) fails on the values it is given: {e}") from None
        for t, v in zip(op.outputs, values):
            v.setflags(write=False)
            cache[t] = v
        return values

    def _allocate(self, specs, preserve_all, fed):
        """Arena offsets for every tensor that needs bytes; views alias their source's bytes."""
        end = len(self.order)
        root = {}  # view tensor -> the tensor whose bytes it reinterprets
        life = {t: [0, end] for t in fed}  # inputs stay intact: invoke can run again
        until = {}  # step -> the last step of the conv chain it is in (inputs read until then)
        for step, i in enumerate(self.order):
            if i in self.chains:
                last = step + len(self.chains[i])
                until.update((q, last) for q in range(step, last + 1))
        for step, i in enumerate(self.order):
            op = self.subgraph.operators[i]
            for t in op.inputs:
                r = root.get(t, t)
                if r in life:
                    life[r][1] = max(life[r][1], until.get(step, step))
            if i in self.views or i in self.virtual:
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
        requests = [(nbytes(specs[t].shape, specs[t].dtype), *life[t]) for t in owned]
        offsets, total = place(requests)
        self._refuse("the plan's arena", f"{len(owned)} tensors", total)
        self.arena = Arena(total)
        self.requests, self.offsets = requests, dict(zip(owned, offsets))
        self.lower_bound = lower_bound(requests)
        for t, offset in self.offsets.items():
            self.arrays[t] = self.arena.view(offset, specs[t].shape, specs[t].dtype)

    def _views(self, specs):
        """Outputs of reshape-like ops (self.views): views of their inputs' arrays, no step.
        A virtual tensor's array (self.virtual) is a read-only broadcast zero of its shape and
        dtype, for what reads only those (flops, the splitter's cost graph): no step writes
        or reads it."""
        for i in self.order:
            op = self.subgraph.operators[i]
            if i in self.virtual:
                spec = specs[op.outputs[0]]
                self.arrays[op.outputs[0]] = np.broadcast_to(np.zeros((), spec.dtype), spec.shape)
            elif i in self.views:
                source = self.arrays[op.inputs[0]]
                # x[k, ...]: a view even where it leaves no axis (x[k] would be a scalar, a copy)
                self.arrays[op.outputs[0]] = (source[(*self.slices[i], ...)] if i in self.slices else source).reshape(
                    specs[op.outputs[0]].shape)

    def _bind(self, indices=None):
        """Numpy kernel steps for ops `indices` (default: all), bound to their arrays. In the
        default JIT mode while numba is not loaded, bound without it; if the plan wants it,
        numba loads in the background and the plan is provisional (kernels/jit.py's
        `deferred`: its cache makes it again once numba is ready)."""
        if self.update_ops:  # a train step: its gradients' kernels load numba anyway; loaded first, the
            jit.available()  # forward's pools and bias passes bind their loops too (kernels/jit.py's loaded())
        elif jit.deferring():
            bound, wanted = jit.deferred(lambda: self._bind_steps(indices), lambda: self.flops(subgraphs=False))
            self.provisional = self.provisional or wanted
            return bound
        return self._bind_steps(indices)

    def _bind_steps(self, indices):
        """_bind's steps: a chain's (self.chains) as its product's one step where it binds
        so, else each op's own."""
        indices = self.order if indices is None else indices
        fusions, fused, steps, step_ops = self._fusions(indices), set(), [], []
        for i in indices:
            if i in fused:
                continue
            step = self._bind_fused(i, fusions[i]) if i in fusions else None
            if step is not None:
                fused.update(fusions[i][0])
            else:
                step = self._bind_op(i)
            if step is not None:
                steps.append(step)
                step_ops.append(i)
        return steps, step_ops

    def _bind_fused(self, i, fusion):
        """The fused step of the chain from op i (conv_epilogue or matmul_epilogue), or None."""
        op = self.subgraph.operators[i]
        chain, out, residual, extra, activation, scaled = fusion
        with self.workspace.step(), bounded(self.max_bytes):
            if scaled is not None:  # a multiply's x and factors, its conv's other operands
                conv = self.subgraph.operators[chain[0]]
                x, factors = scaled
                return conv_kernels.conv_epilogue([self.arrays[t] for t in [x, *conv.inputs[1:]]], out, conv.attrs,
                                                  residual, extra, activation, self.arrays[factors])
            if op.opcode == "batch_norm":
                return norm_kernels.batch_norm_activation([self.arrays[t] for t in op.inputs], out, op.attrs,
                                                          activation)
            if op.opcode == "conv" and self.subgraph.operators[chain[0]].opcode == "conv":
                depthwise = self.subgraph.operators[chain[0]]
                return conv_kernels.pointwise_depthwise(
                    [self.arrays[t] for t in op.inputs], self.arrays[op.outputs[0]],
                    [self.arrays[t] for t in depthwise.inputs[1:]], out, op.attrs, depthwise.attrs)
            if op.opcode == "conv":
                return conv_kernels.conv_epilogue([self.arrays[t] for t in op.inputs], out, op.attrs,
                                                  residual, extra, activation)
            return math_kernels.matmul_epilogue([self.arrays[t] for t in op.inputs], out, op.attrs,
                                                extra, residual, activation)

    def _bind_op(self, i):
        """Op i's own step, or None where it has none (a view; nothing to write)."""
        op = self.subgraph.operators[i]
        if i in self.views or i in self.virtual:
            return None
        if i in self.composed:  # a layout chain's leaf: one copy from its source
            source, moves = self.composed[i]
            src, dst = layout.compose(self.arrays[source], moves).source_and_target(self.arrays[op.outputs[0]])
            return array_kernels.copy_view(src, dst)
        if ops.get(op.opcode).remote:  # a valid file this interpreter cannot run alone
            raise UnsupportedOpError(
                f"op {i} ({op.opcode} {op.attrs.get('key')!r}) exchanges tensors with the cloud: "
                "create the Interpreter with delegates=[edgeflow.cloud.CloudDelegate('host:port')] "
                "(or run a signature that "
                "runs on the device alone, such as 'infer_local')", [(op.opcode, "needs a cloud delegate")])
        ins = [self.arrays[t] for t in op.inputs]
        outs = [self.arrays[t] for t in op.outputs]
        if ops.get(op.opcode).subgraphs:
            return self.program.bind(op, ins, outs, self.unread.get(i, ()))
        if outs and not any(a.size for a in outs) and not ops.get(op.opcode).stateful:
            return None  # no element to write (an empty batch): no kernel to bind, no step to run
        try:
            with self.workspace.step(), bounded(self.max_bytes):
                return KERNELS[op.opcode](ins, outs, op.attrs)
        except TooLarge as e:
            self._refuse(f"op {i} ({op.opcode})", "scratch", e.nbytes)
            raise
        except (ValueError, IndexError, ArithmeticError) as e:  # a kernel refusing these shapes
            raise (FormatError if self.fixed else InvalidInputError)(
                f"op {i} ({op.opcode}) cannot run on inputs "
                f"{', '.join(f'{a.dtype}{list(a.shape)}' for a in ins)}: {e}") from None

    def _epilogues(self, order, specs):
        """`order` with the ops that a conv's or a matmul's output alone goes into, and that
        its product can apply as it stores, moved up to right after it where their other
        operands are ready there (before the arena is placed, which follows the order; a
        model's two branches otherwise interleave their ops: iris_landmark's conv, conv,
        prelu, prelu):
        - after a conv: the add of a residual of its shape (the conv without an activation of
          its own), then or instead the prelu;
        - before a 1x1 conv: the multiply of x by a factor for each image and channel (a
          squeeze-excitation's, (N, C, H, W) by (N, C, 1, 1)) that alone makes its x: the
          multiply heads a chain of the conv and the conv's own chain, and the product applies
          the factors as it packs x (self.scaled; the same bits: the products are rounded
          where numpy's multiply would round them);
        - after a matmul (a not transposed, no activation of its own): the add of a bias, a
          vector along its last axis (a BERT layer's dense layers), then the add of a residual
          of its shape; an add's relu or relu6 ends the chain, and one with another activation
          stays out of it. Those are exact where the product applies them, so that a model
          split between the matmul and its adds (splitter/) runs to the same bits;
        - after a batch norm in no other chain: the relu (or clip to relu6) that alone reads its
          output, which the batch norm's pass applies (norm.batch_norm_activation);
        - with workers, after a 1x1 conv in no other chain: the depthwise conv that alone reads
          its output, its weights made by then (conv.pointwise_depthwise: each worker's output
          channels of the product, then the depthwise conv of those channels).
        Sets self.chains: _fusions binds each as the product's one step, and _allocate keeps
        the inputs of the product and of those ops alive until the last of them, so that the
        arena places no output of theirs over an input that the fused step still reads."""
        operators, outputs = self.subgraph.operators, set(self.outputs)
        readers, made_by = {}, {}
        for i in order:
            for t in set(operators[i].inputs):
                readers.setdefault(t, []).append(i)
            made_by.update((t, i) for t in operators[i].outputs)

        def sole_reader(t, kind):  # the op of `kind` that alone reads t (not an output), or None
            into = readers.get(t, ())
            return into[0] if t not in outputs and len(into) == 1 and operators[into[0]].opcode == kind else None

        def add_of(t, fits):  # the add that alone reads t, with another operand u: fits(u), or None
            add = sole_reader(t, "add")
            if add is None or len(operators[add].inputs) != 2 or specs[operators[add].outputs[0]].shape != specs[t].shape:
                return None
            other = [u for u in operators[add].inputs if u != t]
            return add if len(other) == 1 and fits(specs[other[0]].shape) else None

        def conv_chain(t):
            chain = []
            add = None if operators[i].attrs.get("activation") else add_of(t, lambda s: s == specs[t].shape)
            if add is not None:
                chain.append(add)
                t = operators[add].outputs[0]
            prelu = sole_reader(t, "prelu")
            if prelu is not None and operators[prelu].inputs[0] == t and operators[prelu].inputs[1] != t:
                chain.append(prelu)
            return chain

        def scaled_conv(i):  # (conv, x, scale) where mul i's product is x * scale, which a 1x1 conv alone reads
            t = operators[i].outputs[0]
            conv = sole_reader(t, "conv")
            if conv is None or len(operators[i].inputs) != 2 or operators[conv].inputs[0] != t \
                    or t in operators[conv].inputs[1:] or operators[conv].attrs.get("group", 1) != 1:
                return None
            shape = tuple(specs[t].shape)
            for x, scale in (operators[i].inputs, operators[i].inputs[::-1]):
                sx, ss = tuple(specs[x].shape), tuple(specs[scale].shape)
                if x != scale and sx == shape and len(shape) == 4 and ss[1:] == (shape[1], 1, 1) \
                        and ss[0] in (1, shape[0]) and specs[x].dtype == specs[scale].dtype == np.float32:
                    return conv, x, scale
            return None

        def depthwise_after(i):  # the depthwise conv that alone reads 1x1 conv i's output (as its x), or None
            op, t = operators[i], operators[i].outputs[0]
            w = specs[op.inputs[1]].shape if len(op.inputs) > 1 else ()
            j = sole_reader(t, "conv") if len(w) == 4 and tuple(w[2:]) == (1, 1) and op.attrs.get("group", 1) == 1 \
                else None
            if j is None or operators[j].inputs[0] != t or t in operators[j].inputs[1:] \
                    or operators[j].attrs.get("group", 1) != w[0] or specs[operators[j].inputs[1]].shape[:2] != (w[0], 1):
                return None
            return j

        def matmul_chain(t):
            attrs, shape = operators[i].attrs, specs[t].shape
            if attrs.get("activation") or attrs.get("transpose_a") or not shape:
                return []
            chain = []
            for fits in (lambda s: 0 < len(s) <= len(shape) and s[-1] == shape[-1] and math.prod(s) == s[-1],
                         lambda s: s == shape):  # the bias, then the residual
                add = add_of(t, fits)
                if add is None or operators[add].attrs.get("activation", "") not in EXACT_ACTIVATIONS:
                    break
                chain.append(add)
                t = operators[add].outputs[0]
                if operators[add].attrs.get("activation"):
                    break
            return chain

        order = list(order)
        for i in [i for i in order if operators[i].opcode in ("conv", "matmul") and len(operators[i].outputs) == 1]:
            at, t = order.index(i), operators[i].outputs[0]
            chain = (conv_chain if operators[i].opcode == "conv" else matmul_chain)(t)
            ready = set(order[:at + 1]) | {i}  # what is made by then (chain ops add their own)
            for k, j in enumerate(chain):
                if any(u in made_by and made_by[u] not in ready for u in operators[j].inputs):
                    del chain[k:]  # an operand made later: this op and those after it stay
                    break
                ready.add(j)
            for j in chain:
                order.remove(j)
                at += 1
                order.insert(at, j)
            if chain:
                self.chains[i] = chain
        for i in [i for i in order if operators[i].opcode == "mul" and not operators[i].attrs.get("activation")]:
            found = scaled_conv(i)
            if found is None:
                continue
            conv, x, scale = found
            chain = [conv] + self.chains.get(conv, [])
            made = set(order[:order.index(i) + 1])
            if any(u in made_by and made_by[u] not in made | set(chain) for j in chain
                   for u in operators[j].inputs if u != operators[i].outputs[0]):
                continue  # an operand made after the multiply
            at = order.index(i)
            for j in chain:
                order.remove(j)
                at += 1
                order.insert(at, j)
            self.chains[i], self.scaled[i] = chain, (x, scale)
        members = {j for chain in self.chains.values() for j in chain}
        for i in [i for i in order if operators[i].opcode == "batch_norm" and i not in members]:
            t = operators[i].outputs[0]
            j = next((k for k in (sole_reader(t, "relu"), sole_reader(t, "clip")) if k is not None), None)
            if j is not None and fused_activation(operators[j].opcode, operators[j].attrs) in EXACT_ACTIVATIONS:
                order.remove(j)  # (a relu heads no chain, nor is in one)
                order.insert(order.index(i) + 1, j)
                self.chains[i] = [j]
                members.add(j)
        if threads.current() is not None:  # a 1x1 conv, then the depthwise conv that alone reads it
            for i in [i for i in order if operators[i].opcode == "conv" and i not in self.chains and i not in members]:
                j = depthwise_after(i)
                if j is not None and j not in self.chains and j not in members \
                        and not any(u in made_by and order.index(made_by[u]) > order.index(i)
                                    for u in operators[j].inputs[1:]):  # its weights made by then
                    order.remove(j)
                    order.insert(order.index(i) + 1, j)
                    self.chains[i] = [j]
                    members.add(j)
        return order

    def _fusions(self, indices):
        """The chains (self.chains) whose ops follow their conv or matmul in `indices` (a
        delegate partition may take some of them): {index: (the ops after it, the final
        output array, the residual, a conv's PReLU slope or a matmul's bias, the activation
        after the residual, a multiply's (x, factors) tensors or None)}; kernels/conv.py's conv_epilogue and kernels/math.py's
        matmul_epilogue bind each, or decline (the ops then bind apart)."""
        operators, out = self.subgraph.operators, {}
        for pos, i in enumerate(indices):
            chain = self.chains.get(i)
            if not chain or list(indices[pos + 1:pos + 1 + len(chain)]) != chain:
                continue
            head, scaled = i, self.scaled.get(i)
            if scaled is not None:  # a multiply, then its conv
                head = chain[0]
            t, residual, extra = operators[head].outputs[0], None, None
            activation = operators[head].attrs.get("activation", "")
            for j in chain[1:] if head != i else chain:
                op = operators[j]
                if op.opcode == "add" and operators[i].opcode == "matmul" and extra is None:
                    extra = self.arrays[next(u for u in op.inputs if u != t)]  # the bias
                    activation = op.attrs.get("activation", "")
                elif op.opcode == "add":
                    residual = self.arrays[next(u for u in op.inputs if u != t)]
                    activation = op.attrs.get("activation", "")
                elif op.opcode == "prelu":
                    extra = self.arrays[op.inputs[1]]  # the slope
                elif op.opcode in ("relu", "clip"):  # a batch norm's activation
                    activation = fused_activation(op.opcode, op.attrs)
                t = op.outputs[0]
            out[i] = (chain, self.arrays[t], residual, extra, activation, scaled)
        return out

    def _bind_delegated(self, delegates, constants, folded):
        """Steps where each delegate partition is one step; the rest as in _bind."""
        from .delegate import make_partition, partition
        groups, self.fallbacks = partition(self, delegates)
        persistent = set(constants) | set(folded) | {t for t, a in self.arrays.items()
                                                     if t not in self.offsets and not a.flags.writeable}
        steps, step_ops = [], []
        for owner, indices in groups:
            if owner is None:
                more, more_ops = self._bind(indices)
                steps += more
                step_ops += more_ops
                self.placement.update((i, "cpu") for i in indices)
                continue
            steps.append(owner.compile(make_partition(self, indices, persistent)))
            step_ops.append(indices[0])
            self.placement.update((i, owner.name) for i in indices)
            self.partitions += 1
        return steps, step_ops

    def placement_summary(self):
        """"N ops on <delegate> in K partitions, M on CPU" for this plan."""
        counts = {}
        for where in self.placement.values():
            counts[where] = counts.get(where, 0) + 1
        cpu = counts.pop("cpu", 0)
        parts = [f"{n} ops on {name} in {self.partitions} partition(s)" for name, n in counts.items()]
        return ", ".join(parts + [f"{cpu} on CPU"])

    def flops(self, subgraphs=True):
        """Arithmetic operations per run of each op that runs, by op index (OpDef.cost);
        with subgraphs=False, 0 for control flow ops (whose subgraphs are planned to count
        theirs)."""
        out = {}
        for i in self.order:
            op = self.subgraph.operators[i]
            specs = [[TensorSpec(self.arrays[t].shape, self.arrays[t].dtype) for t in ts]
                     for ts in (op.inputs, op.outputs)]
            opdef = ops.get(op.opcode)
            if opdef.subgraphs:
                out[i] = self.program.flops(op, specs[0]) if subgraphs else 0
            else:
                out[i] = opdef.cost(*specs, op.attrs)
        return out

    def each_step(self):
        """(step, op index, arrays) in running order, for a caller that times each step."""
        for step, i in zip(self.steps, self.step_ops):
            yield step, i, self.arrays

    def run(self, errstate=True):
        """Run every step. `errstate=False`: the caller has numpy's floating-point
        warnings off already (a subgraph's plan, run by a step of another)."""
        it = iter(self.steps)
        try:
            with np.errstate(all="ignore") if errstate else contextlib.nullcontext():
                for step in it:
                    step()
        except (IndexError, ValueError) as e:
            i = self.step_ops[len(self.steps) - 1 - sum(1 for _ in it)]
            raise InvalidInputError(f"op {i} ({self.subgraph.operators[i].opcode}) failed: {e}") from e
        if self.provisional:
            jit.warm()  # bound while numba is not loaded: it loads now, in the background
