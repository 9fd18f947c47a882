"""einsum: sums of products of tensors, named by an Einstein-summation equation."""
import string

from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define, gradient
from .dims import broadcast, fmt

ELLIPSIS = "."  # stands for '...' in a parsed term
_SUBSCRIPTS = frozenset(string.ascii_letters) | {ELLIPSIS}


def _term(text, equation):
    term = text.replace("...", ELLIPSIS)
    stray_dots = text.count(".") != 3 * term.count(ELLIPSIS)
    if set(term) - _SUBSCRIPTS or term.count(ELLIPSIS) > 1 or stray_dots:
        raise GraphError(f"einsum: bad term {text!r} in {equation!r}; a term is letters "
                         f"with at most one '...'")
    return term


def parse(equation, count):
    """The input terms and the output term of `equation` for `count` operands.

    A term is a str of labels in which '.' stands for '...'. Without '->' the output is
    '...' (when an input has one) followed by the labels that occur once, in
    alphabetical (ASCII) order, as numpy and ONNX define it. GraphError if malformed.
    """
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = [_term(t, equation) for t in lhs.split(",")]
    if len(terms) != count:
        raise GraphError(f"einsum: {equation!r} has {len(terms)} input term(s) for {count} input(s)")
    labels = "".join(terms)
    if not arrow:
        once = sorted(c for c in set(labels) - {ELLIPSIS} if labels.count(c) == 1)
        return terms, (ELLIPSIS if ELLIPSIS in labels else "") + "".join(once)
    out = _term(rhs, equation)
    if len(set(out)) != len(out):
        raise GraphError(f"einsum: output term of {equation!r} repeats a label")
    if set(out) - set(labels) - {ELLIPSIS}:
        raise GraphError(f"einsum: output labels {sorted(set(out) - set(labels) - {ELLIPSIS})} "
                         f"of {equation!r} are in no input")
    return terms, out


def numpy_equation(equation, count):
    """`equation` with its output spelled out, for np.einsum."""
    terms, out = parse(equation, count)
    return (",".join(terms) + "->" + out).replace(ELLIPSIS, "...")


def _axes(spec, term, equation):
    """(label, dimension) pairs of one operand, and the dimensions its '...' stands for."""
    head, _, tail = term.partition(ELLIPSIS)
    extra = spec.rank - len(head) - len(tail)
    if extra < 0 or (extra and ELLIPSIS not in term):
        raise GraphError(f"einsum: term {term.replace(ELLIPSIS, '...')!r} of {equation!r} does not "
                         f"fit an input of shape {fmt(spec.shape)}")
    shape = spec.shape
    labeled = list(zip(head + tail, shape[:len(head)] + shape[len(head) + extra:]))
    return labeled, shape[len(head):len(head) + extra]


def _size(label, dims, equation):
    """One label's size: equal within an operand, broadcast (numpy's rule) across operands."""
    try:
        return broadcast(*[(d,) for d in dims])[0]
    except GraphError:
        raise GraphError(f"einsum: label {label!r} of {equation!r} has sizes "
                         f"{sorted(set(dims))}") from None


@define("einsum", attrs={"equation": Attr(AttrKind.STRING)},
        types=Types("T+ -> T", T=dtypes.NUMERIC | {dtypes.bfloat16}))
def _einsum(inputs, attrs):
    """Sum of products over the labels of `equation` ('ij,jk->ik', 'bhqd,bhkd->bhqk', ...).

    Semantics of numpy's and ONNX's Einsum: a label repeated within one term takes a
    diagonal; labels missing from the output are summed over; '...' stands for the
    leading unnamed axes, broadcast across operands; a size-1 axis broadcasts against
    the same label's size in another operand.
    """
    equation = attrs["equation"]
    terms, out = parse(equation, len(inputs))
    sizes, ellipses = {}, []
    for spec, term in zip(inputs, terms):
        labeled, ellipsis = _axes(spec, term, equation)
        ellipses.append(ellipsis)
        own = {}
        for label, d in labeled:
            if d is not None and own.get(label) not in (None, d):
                raise GraphError(f"einsum: label {label!r} of {equation!r} has sizes {own[label]} "
                                 f"and {d} in one input of shape {fmt(spec.shape)}")
            own[label] = d if own.get(label) is None else own[label]
        for label, d in own.items():
            sizes.setdefault(label, []).append(d)
    try:
        ellipsis = broadcast(*ellipses)
    except GraphError as e:
        raise GraphError(f"einsum: the '...' axes of {equation!r} do not broadcast: {e}") from None
    if ellipsis and ELLIPSIS not in out:
        raise GraphError(f"einsum: the output of {equation!r} needs '...' for the inputs' "
                         f"{len(ellipsis)} unnamed axes")
    sizes = {label: _size(label, dims, equation) for label, dims in sizes.items()}
    shape = ()
    for label in out:
        shape += ellipsis if label == ELLIPSIS else (sizes[label],)
    return [TensorSpec(shape, inputs[0].dtype)]


# -- gradients -----------------------------------------------------------------------------

def _positions(term, rank):
    """label -> its axes in an operand of `rank` that `term` describes."""
    head, _, tail = term.partition(ELLIPSIS) if ELLIPSIS in term else (term, "", "")
    axes = {}
    for i, c in enumerate(head):
        axes.setdefault(c, []).append(i)
    for i, c in enumerate(tail):
        axes.setdefault(c, []).append(rank - len(tail) + i)
    return axes


def _diagonal(g, operand, axes):
    """1 where the indices along `axes` are all equal, else 0; broadcasts against operand."""
    n = g("shape", operand, start=axes[0], end=axes[0] + 1)
    index = g("range", g.constant(0, n), n, g.constant(1, n))

    def along(axis):
        return g("reshape", index, shape=tuple(-1 if i == axis else 1 for i in range(operand.rank)))
    first, mask = along(axes[0]), None
    for axis in axes[1:]:
        same = g("cast", g("equal", first, along(axis)), dtype=operand.dtype)
        mask = same if mask is None else g("mul", mask, same)
    return mask


def _operand_gradient(g, dy, out, operand, term, others):
    """d(sum of dy * y)/d(operand): dy contracted with the other operands onto `term`.

    `others` are (tensor, term) pairs. The contraction cannot name the labels of `term`
    that occur nowhere else (they were summed over) nor a label's repeats after its first
    (a diagonal): the result gets size-1 axes there, stretched to the operand's shape, and
    diagonals are masked out of it. Axes that broadcasting stretched (size 1 in the
    operand, or '...' axes it lacks) are summed back by sum_to.
    """
    terms = [out] + [t for _, t in others]
    named = set("".join(terms))
    kept = [i for i, c in enumerate(term) if c in named and term.index(c) == i]
    target = "".join(term[i] for i in kept)
    if ELLIPSIS not in named:  # the operand's '...' stands for no axes
        target = target.replace(ELLIPSIS, "")
    elif ELLIPSIS not in target:  # the others' '...' axes, to be summed by sum_to
        target = ELLIPSIS + target
    equation = (",".join(terms) + "->" + target).replace(ELLIPSIS, "...")
    grad = g("einsum", dy, *(t for t, _ in others), equation=equation)
    # Axes to insert, as positions in the result: counted from the front before the
    # operand's '...', from the back after it (the result's '...' may be wider).
    split = term.find(ELLIPSIS) if ELLIPSIS in term else 0
    missing = [i if i < split else i - len(term) for i, c in enumerate(term)
               if c != ELLIPSIS and i not in kept]
    if missing:
        grad = g("expand", g("expand_dims", grad, axes=tuple(missing)), g("shape", operand))
    grad = g.sum_to(grad, operand)
    for axes in _positions(term, operand.rank).values():
        if len(axes) > 1:
            grad = g("mul", grad, _diagonal(g, operand, axes))
    return grad


@gradient("einsum")
def _einsum_grad(g, op, grads):
    """Each operand's gradient is an einsum of dy with the other operands."""
    terms, out = parse(op.attrs["equation"], len(op.inputs))
    pairs = list(zip(op.inputs, terms))
    return [_operand_gradient(g, grads[0], out, x, term, pairs[:i] + pairs[i + 1:])
            for i, (x, term) in enumerate(pairs)]
