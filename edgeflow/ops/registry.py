"""The op registry: every op is defined here once, by name.

An `OpDef` holds what is true of an op whatever runs it: its arity, its typed
attributes with their defaults, its dtype constraints (`Types`) and shape inference. Kernels (numpy in
`edgeflow.interp`, OpenCL in `edgeflow.accel`), the file verifier and converters look
ops up by name; none of them re-describes one.
"""
import enum
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from .. import dtypes
from ..errors import GraphError, UnsupportedOpError


class AttrKind(enum.IntEnum):
    """Attribute types; values equal the schema's `AttrType` enum."""

    INT = 1
    FLOAT = 2
    BOOL = 3
    STRING = 4
    INTS = 5
    FLOATS = 6
    DTYPE = 7
    SUBGRAPH = 8  # a subgraph the op runs: its index in the model, or a builder's Body


REQUIRED = object()


@dataclass(frozen=True)
class Attr:
    kind: AttrKind
    default: Any = REQUIRED


@dataclass(frozen=True)
class TensorSpec:
    """Shape (ints, None where unknown) and dtype of a value flowing along an edge.

    `value` is the array itself when it is known before running: a constant, or a
    value computed from shapes (`shape(x)`) and constants. Ops whose output shape
    depends on an operand's value (reshape to a computed shape, range, tile, ...) read
    it here; it is None when unknown.
    """

    shape: tuple
    dtype: np.dtype
    value: Optional[np.ndarray] = field(default=None, compare=False, repr=False)

    @property
    def rank(self):
        return len(self.shape)


def _coerce(kind, value):
    """The attribute value in canonical Python form, or ValueError/TypeError."""
    if kind is AttrKind.INT:
        if isinstance(value, (bool, float)) or not isinstance(value, (int, np.integer)):
            raise TypeError("expected an int")
        return int(value)
    if kind is AttrKind.FLOAT:
        return float(value)
    if kind is AttrKind.BOOL:
        if not isinstance(value, (bool, np.bool_, int)) or value not in (0, 1):
            raise TypeError("expected a bool")
        return bool(value)
    if kind is AttrKind.STRING:
        if not isinstance(value, str):
            raise TypeError("expected a str")
        return value
    if kind is AttrKind.INTS:
        return tuple(_coerce(AttrKind.INT, v) for v in value)
    if kind is AttrKind.FLOATS:
        return tuple(float(v) for v in value)
    if kind is AttrKind.DTYPE:
        return dtypes.as_dtype(value)
    if kind is AttrKind.SUBGRAPH:
        if hasattr(value, "inputs") and hasattr(value, "outputs"):
            return value  # a graph being built (edgeflow.graph.control.Body)
        value = _coerce(AttrKind.INT, value)
        if value < 0:
            raise ValueError("a subgraph index is not negative")
        return value
    raise TypeError(f"unknown attribute kind {kind}")


# The `activation` attribute of ops that can apply one to their output in place (conv,
# matmul, add, ...), so that the graph optimizer can fuse a following activation op:
# relu, relu6 = min(max(x, 0), 6), swish = x sigmoid(x) (SiLU) and hard_swish =
# x min(max(x + 3, 0), 6) / 6 (MobileNetV3's).
ACTIVATIONS = ("", "relu", "relu6", "swish", "hard_swish")
# Those whose gradient needs the input as well as the output: an op fusing one cannot be
# differentiated (the optimizer fuses them into inference graphs only).
NEEDS_INPUT = ("swish", "hard_swish")


def fused_activation(opcode, attrs):
    """The fused-activation name (ACTIVATIONS) that op `opcode` with `attrs` computes, or
    None: relu, a clip to [0, 6] (relu6) or [0, inf) (relu), swish of alpha 1, hard_swish."""
    if opcode == "relu":
        return "relu"
    if opcode == "clip" and attrs["min"] == 0.0:
        if attrs["max"] == 6.0:
            return "relu6"
        if attrs["max"] == float("inf"):
            return "relu"
    if opcode == "swish" and attrs["alpha"] == 1.0:
        return "swish"
    if opcode == "hard_swish":
        return "hard_swish"
    return None


def activation_attr():
    return Attr(AttrKind.STRING, "")


def check_activation(op, attrs):
    if attrs.get("activation", "") not in ACTIVATIONS:
        raise GraphError(f"{op}: activation must be one of {ACTIVATIONS}, got {attrs['activation']!r}")


def dtype_names(allowed):
    """The dtypes of `allowed`, in the schema's order, for messages: "int32 or int64"."""
    names = [dtypes.name(d) for d in dtypes.ALL if d in allowed]
    return " or ".join(filter(None, (", ".join(names[:-1]), names[-1]))) if names else "none"


@dataclass(frozen=True)
class _Slot:
    label: str  # the input's or output's name in messages ("indices"), or ""
    constraint: str  # a type variable, a dtype name, "any", or a DTYPE attribute
    repeat: str  # "": exactly one; "?": optional; "+": one or more; "*": any number


def _slots(text):
    slots = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        label, _, constraint = item.rpartition(":")
        constraint = constraint.strip()
        repeat = constraint[-1] if constraint[-1] in "?+*" else ""
        slots.append(_Slot(label.strip(), constraint.rstrip("?+*"), repeat))
    return tuple(slots)


def _arity(slots):
    """(min, max) values that `slots` take; max None when one of them repeats."""
    low = sum(s.repeat in ("", "+") for s in slots)
    return low, None if any(s.repeat in ("+", "*") for s in slots) else low + sum(s.repeat == "?" for s in slots)


@functools.lru_cache(maxsize=None)  # per (op signature, count): planning asks for every op
def _spread(slots, n):
    """The slot of each of `n` values: optional slots are filled first to last (ops take
    positional inputs, absent ones skipped), a repeated slot takes what the others leave."""
    extra, out = n - _arity(slots)[0], []
    for s in slots:
        if s.repeat == "?":
            take = min(extra, 1)
        elif s.repeat in ("+", "*"):
            take = extra + (s.repeat == "+")
        else:
            take = 1
        extra -= take - (s.repeat in ("", "+"))
        out += [s] * take
    return tuple(out)


class Types:
    """An op's dtype constraints, in ONNX's type-constraint style:

        Types("x: T, y: T -> T", T=dtypes.NUMERIC)                      add, matmul
        Types("condition: bool, x: T, y: T -> T", T=dtypes.ANY)           where
        Types("x: T, indices: index -> T", T=dtypes.ANY)                  gather
        Types("x: any -> dtype")                                          cast: the `dtype` attr
        Types("shape: index -> dtype", dtype=(dtypes.float32, dtypes.float64))  random_uniform
        Types("T+ -> T", T=dtypes.ANY)                                    concat
        Types("X: T, W: T, R: T, T?, T?, T? -> T, T, T", T=dtypes.FLOATS) lstm

    Inputs, then outputs, each `[name:] constraint[repeat]`; the name only labels messages.
    A constraint is an upper-case type variable, given as a keyword with the dtypes it
    admits: every input and output it names has one and the same dtype. Lower-case
    constraints hold each value on its own: a dtype name (`bool`, `int64`), `index`
    (int32 or int64), `any`, or, for an output, the op's DTYPE attribute of that name (the
    output has the dtype it names; a keyword of the same name restricts it). `?` marks an
    optional value (filled first to last: absent ones are skipped, not left as holes), `+`
    one or more, `*` any number. `define(..., types=...)` derives the op's arity from it.
    """

    def __init__(self, signature, **sets):
        ins, arrow, outs = signature.partition("->")
        if not arrow:
            raise AssertionError(f"signature {signature!r} has no '->'")
        self.signature = signature
        self.inputs, self.outputs = _slots(ins), _slots(outs)
        self.sets = {k: frozenset(dtypes.as_dtype(d) for d in v) for k, v in sets.items()}
        self._spreads = {}  # (outputs?, count) -> _spread's slots: a plan checks every op

    def spread(self, outputs, n):
        """The slot of each of `n` inputs (or outputs), as _spread gives them, made once."""
        slots = self._spreads.get((outputs, n))
        if slots is None:
            slots = self._spreads[(outputs, n)] = _spread(self.outputs if outputs else self.inputs, n)
        return slots

    def __repr__(self):
        sets = "".join(f", {k}=({', '.join(map(dtypes.name, (d for d in dtypes.ALL if d in v)))})"
                       for k, v in self.sets.items())
        return f"Types({self.signature!r}{sets})"

    def validate(self, op, attrs):
        """AssertionError unless every constraint names something and each side repeats at most once."""
        dtype_attrs = {k for k, a in attrs.items() if a.kind is AttrKind.DTYPE}
        names = {dtypes.name(d) for d in dtypes.ALL} | {"any", "index"}
        for slots, side in ((self.inputs, "inputs"), (self.outputs, "outputs")):
            repeats = [s.repeat for s in slots if s.repeat]
            if len(repeats) > 1 and set(repeats) & {"+", "*"}:
                raise AssertionError(f"{op}: the {side} of {self.signature!r} repeat ambiguously")
            for s in slots:
                c = s.constraint
                known = c in self.sets if c[0].isupper() else c in names or (
                    side == "outputs" and c in dtype_attrs)
                if not known:
                    raise AssertionError(f"{op}: {c!r} in {self.signature!r} names no type variable, "
                                         f"dtype, set or DTYPE attribute")
        used = {s.constraint for s in self.inputs + self.outputs}
        if set(self.sets) - used:
            raise AssertionError(f"{op}: {sorted(set(self.sets) - used)} unused in {self.signature!r}")

    def allowed(self, constraint, attrs):
        """The dtypes `constraint` admits for one value (attrs: the op's, coerced)."""
        if constraint[0].isupper():
            return self.sets[constraint]
        if constraint == "any":
            return dtypes.ANY
        if constraint == "index":
            return dtypes.INDEX
        if constraint in attrs:
            return frozenset((attrs[constraint],))
        return _named(constraint)

    def input_dtypes(self, n, attrs):
        """The dtypes each of `n` inputs may have, one set per input (type variables unbound)."""
        return [self.allowed(s.constraint, attrs) for s in self.spread(False, n)]

    def output_dtypes(self, n, attrs):
        return [self.allowed(s.constraint, attrs) for s in self.spread(True, n)]

    def check_inputs(self, op, dts, attrs):
        """The type variables bound by input dtypes `dts`: {name: dtype}; GraphError naming
        the op, the input, its dtype and the dtypes allowed when they do not fit."""
        for key, allowed in self.sets.items():
            if not key[0].isupper() and attrs[key] not in allowed:
                raise GraphError(f"{op}: attribute {key!r} is {dtypes.name(attrs[key])}; expected "
                                 f"{dtype_names(allowed)}")
        bound, where = {}, {}
        for i, (slot, dt) in enumerate(zip(self.spread(False, len(dts)), dts)):
            c = slot.constraint
            if c in bound and bound[c] != dt:
                raise GraphError(f"{op}: {slot.label or f'input {i}'} must be {dtypes.name(bound[c])}, got "
                                 f"{dtypes.name(dt)} (inputs of type {c} share one dtype, and {where[c]} is "
                                 f"{dtypes.name(bound[c])})")
            allowed = self.allowed(c, attrs)
            if dt not in allowed:
                raise GraphError(f"{op}: {slot.label or f'input {i}'}: dtype {dtypes.name(dt)} not supported; "
                                 f"expected {dtype_names(allowed)}")
            if c[0].isupper() and c not in bound:
                bound[c], where[c] = dt, slot.label or f"input {i}"
        return bound

    def check_outputs(self, op, bound, dts, attrs):
        """AssertionError unless output dtypes `dts` are the declared ones: the op's
        inference and its declaration disagree."""
        for i, (slot, dt) in enumerate(zip(self.spread(True, len(dts)), dts)):
            c = slot.constraint
            allowed = {bound[c]} if c in bound else self.allowed(c, attrs)
            if dt not in allowed:
                raise AssertionError(f"{op}: inference gave output {i} dtype {dtypes.name(dt)}; "
                                     f"{self.signature!r} declares {dtype_names(allowed)}")


@dataclass(frozen=True)
class OpDef:
    name: str
    num_inputs: tuple  # (min, max); max None means variadic
    num_outputs: Any  # an int, or a function of the attrs (split); None: as many as
    #                   the op's subgraphs give (control flow, see `subgraphs`)
    attrs: dict
    infer: Callable  # (list[TensorSpec], attrs) -> list[TensorSpec]
    view: bool  # output 0 is input 0 reinterpreted (reshape-like): no copy, no new bytes
    doc: str
    flops: Callable = None  # (input specs, output specs, attrs) -> arithmetic operations
    stateful: bool = False  # writes a variable (input 0): never folded, run after pure ops
    random: bool = False  # draws new values every run: never folded
    remote: bool = False  # exchanges tensors with another process (send/recv): no numpy
    #                       kernel; a delegate that reaches the peer runs it
    types: Optional[Types] = None  # dtype constraints; None: inference checks dtypes itself
    fold_at_plan: bool = False  # on constants, computed when a plan is made, not when the graph
    #                             is built, so the file keeps the compact operands (int8 weights)
    operands: tuple = ()  # attributes that inputs past the op's own may give instead (ONNX's
    #                       axes, k, pads...), in this order: see take_operands
    unknown: Callable = None  # (own input specs, attrs, operand specs) -> output specs while
    #                           an operand's value is unknown; default: input 0's rank, all ?

    @property
    def gradient(self):
        """The gradient rule registered with @gradient(name), or None (not differentiable)."""
        return _GRADIENTS.get(self.name)

    def cost(self, inputs, outputs, attrs):
        """Arithmetic operations (a multiply-add counts 2) for concrete shapes; one per
        output element unless the op says otherwise. Cost models and benchmarks read it."""
        if self.flops is not None:
            return int(self.flops(inputs, outputs, attrs))
        return 0 if self.view else sum(int(np.prod(s.shape, dtype=np.int64)) for s in outputs)

    def check_attrs(self, given, num_inputs=0):
        """Attributes with defaults filled in and values coerced; GraphError on a bad one.
        A required attribute that one of `num_inputs` inputs gives (`operands`) may be absent."""
        supplied = self.operands[:self.operand_inputs(num_inputs)]
        unknown = set(given) - set(self.attrs)
        if unknown:
            raise GraphError(f"{self.name}: unknown attribute(s) {sorted(unknown)}; "
                             f"expected some of {sorted(self.attrs)}")
        out = {}
        for key, spec in self.attrs.items():
            if key not in given or given[key] is None:
                if spec.default is REQUIRED and key in supplied:
                    out[key] = _coerce(spec.kind, [] if spec.kind in (AttrKind.INTS, AttrKind.FLOATS) else 0)
                    continue
                if spec.default is REQUIRED:
                    raise GraphError(f"{self.name}: attribute {key!r} ({spec.kind.name}) is required")
                out[key] = spec.default
                continue
            try:
                out[key] = _coerce(spec.kind, given[key])
            except (TypeError, ValueError) as e:
                raise GraphError(f"{self.name}: attribute {key!r} must be {spec.kind.name}, "
                                 f"got {given[key]!r} ({e})") from None
        return out

    def check_arity(self, n):
        lo, hi = self.num_inputs
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else f"{lo} to {hi if hi is not None else 'any number'}"
            raise GraphError(f"{self.name} takes {want} inputs, got {n}")

    @functools.cached_property  # asked of every op while planning
    def subgraphs(self):
        """Names of the attributes that name subgraphs the op runs (If's branches, While's
        condition and body); empty for ops that run no subgraph."""
        return tuple(k for k, a in self.attrs.items() if a.kind is AttrKind.SUBGRAPH)

    def output_count(self, attrs):
        """How many outputs the op has with these attrs; None: as its subgraphs say."""
        return self.num_outputs(attrs) if callable(self.num_outputs) else self.num_outputs

    def check_dtypes(self, dts, attrs):
        """The type variables that input dtypes `dts` bind ({} without a declaration);
        GraphError when they, or the dtype attributes, break the declaration."""
        return {} if self.types is None else self.types.check_inputs(self.name, dts, attrs)

    def operand_inputs(self, n):
        """How many of `n` inputs give attributes (the `operands` past the op's own)."""
        return max(n - self.num_inputs[0], 0) if self.operands else 0

    def take_operands(self, inputs, attrs):
        """(own inputs, attrs): the values of the inputs that give attributes (arrays, or
        TensorSpecs with known values) moved into the attrs. Kernels see only these."""
        extra = self.operand_inputs(len(inputs))
        if not extra:
            return list(inputs), attrs
        own = len(inputs) - extra
        attrs = dict(attrs)
        for name, given in zip(self.operands, inputs[own:]):
            value = np.asarray(getattr(given, "value", given))
            if value.dtype == dtypes.bfloat16:
                value = dtypes.widen(value)
            kind = self.attrs[name].kind
            try:
                if kind in (AttrKind.INTS, AttrKind.FLOATS):
                    attrs[name] = _coerce(kind, value.reshape(-1).tolist())
                else:  # a float count (OneHot's depth) is truncated, as ONNX does
                    scalar = value.reshape(())
                    attrs[name] = _coerce(kind, scalar.astype(np.int64).item() if kind is AttrKind.INT
                                          else scalar.item())
            except (TypeError, ValueError) as e:
                raise GraphError(f"{self.name}: operand {name!r} must hold {kind.name}, got "
                                 f"{value.dtype}{list(value.shape)} ({e})") from None
        return list(inputs[:own]), attrs

    def infer_specs(self, inputs, attrs):
        """Output specs for these input specs; GraphError when they are incompatible."""
        self.check_arity(len(inputs))
        bound = self.check_dtypes([s.dtype for s in inputs], attrs)
        extra = self.operand_inputs(len(inputs))
        if extra and any(s.value is None for s in inputs[-extra:]):
            own = list(inputs[:-extra])
            outs = (self.unknown(own, attrs, list(inputs[-extra:])) if self.unknown is not None
                    else [TensorSpec((None,) * own[0].rank, own[0].dtype)] * self.output_count(attrs))
        else:
            inputs, attrs = self.take_operands(inputs, attrs)
            outs = self.infer(list(inputs), attrs)
        if self.num_outputs is not None and len(outs) != self.output_count(attrs):
            raise AssertionError(f"{self.name}: inference gave {len(outs)} outputs")
        if self.types is not None:
            self.types.check_outputs(self.name, bound, [s.dtype for s in outs], attrs)
        return outs


_REGISTRY = {}


@functools.lru_cache(maxsize=None)
def _named(name):
    """The dtypes a constraint naming one admits ("float32"): made once per name (a plan
    checks every op's inputs)."""
    return frozenset((dtypes.as_dtype(name),))


def _count(name, given, slots):
    """(min, max) values: `given` (an int or a pair), else what the signature `slots` takes."""
    derived = None if slots is None else _arity(slots)
    count = derived if given is None else (given, given) if isinstance(given, int) else tuple(given)
    if count is None or (derived is not None and count != derived):
        raise AssertionError(f"{name}: {given} values, but the signature takes {derived}")
    return count


def define(name, *, inputs=None, outputs=None, attrs=None, types=None, view=False, flops=None,
           stateful=False, random=False, remote=False, fold_at_plan=False, operands=(), unknown=None):
    """Decorator: register the shape inference function `fn` as op `name`.

    `types` declares the dtypes the op takes and gives (a `Types`); its arity follows
    from it, else `inputs` is an int or a (min, max) pair, max None for variadic, and
    `outputs` an int or a function of the attrs (default 1), or "subgraphs" for an op
    with as many outputs as its subgraphs give (control flow). `fn(input_specs, attrs)`,
    called once the dtypes passed the declaration, returns the output TensorSpecs (with
    `value` set where it can compute the value itself, as `shape` does) and raises
    GraphError on inputs the op cannot take.

    `operands` names attributes that optional inputs past the op's own may give instead
    (an ONNX operand that is not a constant); while one's value is unknown, `unknown(own
    input specs, attrs, operand specs)` gives the output specs. A plan runs such an op
    once the values are known (edgeflow/interp/staged.py), its kernel seeing attrs only.
    """
    attrs = dict(attrs or {})
    if set(operands) - set(attrs):
        raise AssertionError(f"{name}: operands {operands} must name attributes")
    if types is not None:
        types.validate(name, attrs)
    arity = _count(name, inputs, types and types.inputs)
    if outputs == "subgraphs":
        outputs = None
    elif not callable(outputs):
        low, high = _count(name, 1 if outputs is None and types is None else outputs, types and types.outputs)
        if low != high:
            raise AssertionError(f"{name}: the signature leaves the output count open; give it")
        outputs = low

    def register(fn):
        if name in _REGISTRY:
            raise AssertionError(f"op {name!r} defined twice")
        _REGISTRY[name] = OpDef(name, arity, outputs, attrs, fn, view, (fn.__doc__ or "").strip(), flops,
                                stateful, random, remote, types, fold_at_plan, tuple(operands), unknown)
        return fn

    return register


_GRADIENTS = {}


def gradient(*names):
    """Decorator: register `rule(g, op, grads) -> list` as the gradient of ops `names`.

    `op` has `.inputs`, `.outputs` (symbolic tensors with `.shape`, `.dtype`) and
    `.attrs`; `grads` holds one gradient per output (None where no gradient flows).
    The rule returns one gradient per input (None where the input gets none), built
    with `g(op_name, *inputs, **attrs)`, which adds an op and returns its output(s);
    `g.constant(value, like)` makes a constant of `like`'s dtype. Rules live next to
    their op's definition, and see nothing of the graph machinery.
    """
    def register(rule):
        for name in names:
            get(name)
            if name in _GRADIENTS:
                raise AssertionError(f"two gradient rules for {name!r}")
            _GRADIENTS[name] = rule
        return rule
    return register


def get(name):
    """The definition of op `name`; UnsupportedOpError if there is none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnsupportedOpError(f"unknown op {name!r}", [(name, "not defined")]) from None


def find(name):
    return _REGISTRY.get(name)


def names():
    return sorted(_REGISTRY)


def activation_gradient(g, op, dy):
    """dy taken back through the op's fused activation (the `activation` attr), if any."""
    act, y = op.attrs.get("activation", ""), op.outputs[0]
    if not act:
        return dy
    if act in NEEDS_INPUT:
        raise GraphError(f"{op.name}: cannot differentiate its fused {act} activation (its gradient needs "
                         "the value before it, which the op does not keep): build the graph with a separate "
                         f"{act} op")
    zero = g.constant(0, y)
    live = g("greater", y, zero)
    if act == "relu6":
        live = g("where", live, g("less", y, g.constant(6, y)), live)
    return g("where", live, dy, zero)
