"""einsum: sums of products of tensors, named by an Einstein-summation equation."""
import string

from ..errors import GraphError
from .math import NUMERIC, _same_dtype
from .registry import Attr, AttrKind, TensorSpec, define
from .shapes import broadcast, fmt

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


@define("einsum", inputs=(1, None), attrs={"equation": Attr(AttrKind.STRING)})
def _einsum(inputs, attrs):
    """Sum of products over the labels of `equation` ('ij,jk->ik', 'bhqd,bhkd->bhqk', ...).

    Semantics of numpy's and ONNX's Einsum: a label repeated within one term takes a
    diagonal; labels missing from the output are summed over; '...' stands for the
    leading unnamed axes, broadcast across operands; a size-1 axis broadcasts against
    the same label's size in another operand.
    """
    equation = attrs["equation"]
    terms, out = parse(equation, len(inputs))
    dtype = _same_dtype("einsum", inputs, NUMERIC)
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
    return [TensorSpec(shape, dtype)]
