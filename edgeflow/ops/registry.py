"""The op registry: every op is defined here once, by name.

An `OpDef` holds what is true of an op whatever runs it: its arity, its typed
attributes with their defaults, and shape/dtype inference. Kernels (numpy in
`edgeflow.interp`, OpenCL in `edgeflow.accel`), the file verifier and converters look
ops up by name; none of them re-describes one.
"""
import enum
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
    raise TypeError(f"unknown attribute kind {kind}")


# The `activation` attribute of ops that can apply one to their output in place (conv,
# matmul, add, ...), so that the graph optimizer can fuse a following activation op.
ACTIVATIONS = ("", "relu", "relu6")


def activation_attr():
    return Attr(AttrKind.STRING, "")


def check_activation(op, attrs):
    if attrs.get("activation", "") not in ACTIVATIONS:
        raise GraphError(f"{op}: activation must be one of {ACTIVATIONS}, got {attrs['activation']!r}")


@dataclass(frozen=True)
class OpDef:
    name: str
    num_inputs: tuple  # (min, max); max None means variadic
    num_outputs: Any  # an int, or a function of the attrs (split)
    attrs: dict
    infer: Callable  # (list[TensorSpec], attrs) -> list[TensorSpec]
    view: bool  # output 0 is input 0 reinterpreted (reshape-like): no copy, no new bytes
    doc: str
    flops: Callable = None  # (input specs, output specs, attrs) -> arithmetic operations
    stateful: bool = False  # writes a variable (input 0): never folded, run after pure ops
    random: bool = False  # draws new values every run: never folded
    remote: bool = False  # exchanges tensors with another process (send/recv): no numpy
    #                       kernel; a delegate that reaches the peer runs it

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

    def check_attrs(self, given):
        """Attributes with defaults filled in and values coerced; GraphError on a bad one."""
        unknown = set(given) - set(self.attrs)
        if unknown:
            raise GraphError(f"{self.name}: unknown attribute(s) {sorted(unknown)}; "
                             f"expected some of {sorted(self.attrs)}")
        out = {}
        for key, spec in self.attrs.items():
            if key not in given or given[key] is None:
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

    def output_count(self, attrs):
        return self.num_outputs(attrs) if callable(self.num_outputs) else self.num_outputs

    def infer_specs(self, inputs, attrs):
        """Output specs for these input specs; GraphError when they are incompatible."""
        self.check_arity(len(inputs))
        outs = self.infer(list(inputs), attrs)
        if len(outs) != self.output_count(attrs):
            raise AssertionError(f"{self.name}: inference gave {len(outs)} outputs")
        return outs


_REGISTRY = {}


def define(name, *, inputs, outputs=1, attrs=None, view=False, flops=None, stateful=False, random=False,
           remote=False):
    """Decorator: register the shape/dtype inference function `fn` as op `name`.

    `inputs` is an int or a (min, max) pair, max None for variadic; `outputs` an int or
    a function of the attrs. `fn(input_specs, attrs)` returns the output TensorSpecs
    (with `value` set where it can compute the value itself, as `shape` does) and
    raises GraphError on inputs the op cannot take.
    """
    arity = (inputs, inputs) if isinstance(inputs, int) else tuple(inputs)

    def register(fn):
        if name in _REGISTRY:
            raise AssertionError(f"op {name!r} defined twice")
        _REGISTRY[name] = OpDef(name, arity, outputs, dict(attrs or {}), fn, view,
                                (fn.__doc__ or "").strip(), flops, stateful, random, remote)
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
    zero = g.constant(0, y)
    live = g("greater", y, zero)
    if act == "relu6":
        live = g("where", live, g("less", y, g.constant(6, y)), live)
    return g("where", live, dy, zero)
