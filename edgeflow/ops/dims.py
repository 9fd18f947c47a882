"""Shape arithmetic shared by the op definitions. A dimension is an int, or None if unknown."""
from ..errors import GraphError
from .registry import get


def broadcast(*shapes):
    """numpy's broadcasting rule over shapes whose dimensions may be None."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        known = {d for d in dims if d is not None and d != 1}
        if len(known) > 1:
            raise GraphError(f"shapes {', '.join(map(fmt, shapes))} do not broadcast "
                             f"(dimension {i - rank}: {sorted(known)})")
        if known:
            out.append(known.pop())
        elif None in dims:
            out.append(None)
        else:
            out.append(1)
    return tuple(out)


def normalize_axis(axis, rank, op="op"):
    if not -rank <= axis < rank:
        raise GraphError(f"{op}: axis {axis} out of range for rank {rank}")
    return axis % rank


def normalize_axes(axes, rank, op="op"):
    out = tuple(sorted({normalize_axis(a, rank, op) for a in axes}))
    if len(out) != len(axes):
        raise GraphError(f"{op}: repeated axis in {tuple(axes)}")
    return out


def num_elements(shape):
    """Product of the dimensions, or None if any is unknown."""
    n = 1
    for d in shape:
        if d is None:
            return None
        n *= d
    return n


def fmt(shape):
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def one_shape(op, a, b, names):
    """The shape of specs a and b, which must agree where both are known (no broadcasting):
    their dimensions, unknown ones filled from the other; GraphError naming `names` else."""
    if a.rank != b.rank or any(None not in (m, n) and m != n for m, n in zip(a.shape, b.shape)):
        raise GraphError(f"{op}: {names[0]} and {names[1]} must have one shape, got {fmt(a.shape)} and {fmt(b.shape)}")
    return tuple(m if m is not None else n for m, n in zip(a.shape, b.shape))


def check_gradient_shape(op, forward, inputs, attrs, dy):
    """GraphError unless gradient op `op`'s gradient operand dy has the dtype and (where
    known) the shape of forward op `forward`'s output on `inputs` (its checks included)."""
    spec = get(forward).infer(list(inputs), attrs)[0]
    if dy.dtype != spec.dtype:
        raise GraphError(f"{op}: the gradient is {dy.dtype}, the forward op's output {spec.dtype}")
    if len(dy.shape) != len(spec.shape) or any(None not in (a, b) and a != b for a, b in zip(dy.shape, spec.shape)):
        raise GraphError(f"{op}: the gradient has shape {fmt(dy.shape)}, but the forward op gives {fmt(spec.shape)}")


def vector_length(op, spec, what):
    """How many values a 1-D operand holds; GraphError if not even that is known."""
    n = spec.shape[0] if spec.rank == 1 else 1
    if n is None:
        raise GraphError(f"{op}: the length of {what} must be known (it sets the output rank)")
    return n
