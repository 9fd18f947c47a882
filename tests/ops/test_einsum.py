"""einsum: the forms real models use, '...' and implicit outputs, against onnxruntime and a
loop over every assignment of the labels."""
import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import edgeflow as ef
from edgeflow.errors import GraphError, InvalidInputError
from edgeflow.graph.math_ops import apply

from .harness import FLOATS, assert_close, random_array, run_op as run_in_memory
from .onnx_reference import onnx_reference


def einsum_by_loops(equation, *arrays):
    """The sum, over every assignment of values to the labels, of the operands' product.

    '...' becomes labels of its own, right-aligned; a size-1 axis broadcasts.
    """
    equation = equation.replace(" ", "")
    lhs, arrow, out = equation.partition("->")
    terms = lhs.split(",")
    if not arrow:  # implicit: '...', then the labels that occur once, sorted
        letters = lhs.replace(",", "").replace("...", "")
        once = sorted(c for c in set(letters) if letters.count(c) == 1)
        out = ("..." if "..." in lhs else "") + "".join(once)
    n_ellipsis = max((a.ndim - len(t.replace("...", "")) for t, a in zip(terms, arrays) if "..." in t),
                     default=0)
    unnamed = "0123456789"[:n_ellipsis]  # labels for the axes under '...'

    def expand(term, ndim):
        k = ndim - len(term.replace("...", ""))
        return term.replace("...", unnamed[n_ellipsis - k:]) if "..." in term else term
    terms = [expand(t, a.ndim) for t, a in zip(terms, arrays)]
    out = out.replace("...", unnamed)
    sizes = {}
    for term, a in zip(terms, arrays):
        for label, n in zip(term, a.shape):
            sizes[label] = max(sizes.get(label, 1), n)
    labels = sorted(sizes)
    result = np.zeros([sizes[c] for c in out], np.float64 if arrays[0].dtype.kind == "f" else np.int64)
    for values in itertools.product(*(range(sizes[c]) for c in labels)):
        at = dict(zip(labels, values))
        product = 1
        for term, a in zip(terms, arrays):
            product *= a[tuple(at[c] if n > 1 else 0 for c, n in zip(term, a.shape))].item()
        result[tuple(at[c] for c in out)] += product
    return result


def einsum(equation):
    return lambda *ts: apply("einsum", list(ts), {"equation": equation})


# (equation, operand shapes, whether onnxruntime runs it)
FORMS = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], True),        # batched matmul
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)], True),  # attention scores
    ("bhqk,bhkd->bhqd", [(2, 3, 4, 6), (2, 3, 6, 5)], True),  # attention-weighted values
    ("ij->ji", [(3, 4)], True),
    ("ii->i", [(4, 4)], True),                             # diagonal
    ("ii", [(4, 4)], True),                                # trace, implicit
    ("i,i->", [(5,), (5,)], True),                         # dot
    ("bi,bi->b", [(3, 4), (3, 4)], True),                  # row-wise dot
    ("i,j->ij", [(3,), (4,)], True),                       # outer
    ("ij,jk", [(3, 4), (4, 5)], True),                     # implicit matmul
    ("ji", [(3, 4)], True),                                # implicit transpose
    ("ij->", [(3, 4)], True),
    ("ij->i", [(3, 4)], True),
    ("abc,cd,de->abe", [(2, 3, 4), (4, 3), (3, 2)], True),  # three operands
    (" ij , jk -> ik ", [(2, 3), (3, 4)], True),           # spaces
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)], True),
    ("...ij,...jk->...ik", [(3, 4), (4, 5)], True),        # '...' of no axes
    ("...ij,...jk", [(2, 2, 3, 4), (2, 2, 4, 5)], True),   # implicit with '...'
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)], False),  # '...' broadcast across ranks
    ("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)], True),        # a size-1 label broadcasts
    ("...i->...", [(2, 3, 4)], True),
    ("Ab,bA", [(2, 3), (3, 2)], False),                    # upper case labels
    ("aB", [(2, 3)], False),                               # implicit: 'B' sorts before 'a'
]


def form_id(form):
    return f"{form[0].strip()}|{'|'.join(map(str, form[1]))}"


@pytest.mark.parametrize("form", FORMS, ids=form_id)
def test_forms_match_loops(run_op, rng, form):
    equation, shapes, _ = form
    arrays = [random_array(rng, s, "float64") for s in shapes]
    out = run_op(einsum(equation), *arrays)  # run_op also checks build-time shape == run-time shape
    assert_close(out, einsum_by_loops(equation, *arrays), np.float64)


@pytest.mark.parametrize("form", [f for f in FORMS if f[2]], ids=form_id)
def test_forms_match_onnxruntime(run_op, rng, form):
    equation, shapes, _ = form
    arrays = [random_array(rng, s, "float32") for s in shapes]
    expected, = onnx_reference("Einsum", arrays, ["float32"], equation=equation)
    assert_close(run_op(einsum(equation), *arrays), expected, np.float32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", FLOATS + ("int32", "int64"))
def test_dtypes_match_onnxruntime(run_op, rng, dtype):
    a, b = random_array(rng, (2, 3, 4), dtype, -3, 4), random_array(rng, (2, 4, 5), dtype, -3, 4)
    expected, = onnx_reference("Einsum", [a, b], [dtype], equation="bij,bjk->bik")
    assert_close(run_op(einsum("bij,bjk->bik"), a, b), expected, dtype)


@pytest.mark.parametrize("dtype", ("int8", "int16", "uint8"))
def test_small_integers_match_loops(run_op, rng, dtype):
    a, b = random_array(rng, (3, 4), dtype, 0, 4), random_array(rng, (4, 2), dtype, 0, 4)
    assert_close(run_op(einsum("ij,jk->ik"), a, b), einsum_by_loops("ij,jk->ik", a, b), dtype)


@pytest.mark.parametrize("equation,shapes,static", [
    ("bij,bjk->bik", [(None, 3, 4), (None, 4, 5)], (None, 3, 5)),
    ("bhqd,bhkd->bhqk", [(None, 2, None, 4), (None, 2, None, 4)], (None, 2, None, None)),
    ("...ij,...jk->...ik", [(None, 3, 4), (4, 5)], (None, 3, 5)),
    ("bi,bi->b", [(None, 4), (1, 4)], (None,)),  # 1 broadcasts against the unknown size
    ("ii->i", [(None, 3)], (3,)),  # a repeated label is one size: known from either axis
])
def test_unknown_dims(compile_graph, graph, rng, equation, shapes, static):
    holders = [ef.placeholder("float32", s, name=f"x{i}") for i, s in enumerate(shapes)]
    y = einsum(equation)(*holders)
    assert y.shape == static and y.dtype == np.float32
    run = compile_graph(graph, {f"x{i}": h for i, h in enumerate(holders)}, {"y": y})
    for fill in (2, 3):
        arrays = [random_array(rng, [fill if d is None else d for d in s], "float32") for s in shapes]
        if equation == "ii->i":
            arrays = [random_array(rng, (3, 3), "float32")]
        out = run(**{f"x{i}": a for i, a in enumerate(arrays)})["y"]
        assert_close(out, einsum_by_loops(equation, *arrays), np.float32)


def test_sizes_that_disagree_at_run_time(compile_graph, graph):
    a, b = ef.placeholder("float32", (2, None), name="a"), ef.placeholder("float32", (None, 4), name="b")
    run = compile_graph(graph, {"a": a, "b": b}, {"y": einsum("ij,jk->ik")(a, b)})
    with pytest.raises(InvalidInputError, match="label 'j'"):
        run(a=np.ones((2, 3), np.float32), b=np.ones((5, 4), np.float32))


@pytest.mark.parametrize("equation,shapes,message", [
    ("ij,jk->ik", [(2, 3)], "2 input term"),
    ("ij->ik", [(2, 3)], "in no input"),
    ("ij->ii", [(2, 2)], "repeats a label"),
    ("i.j->ij", [(2, 3)], "bad term"),
    ("ij-ji", [(2, 3)], "bad term"),
    ("i1->i", [(2, 3)], "bad term"),
    ("ij->ji->ij", [(2, 3)], "bad term"),
    ("......->", [(2, 3)], "bad term"),
    ("ijk->i", [(2, 3)], "does not fit"),
    ("i->i", [(2, 3)], "does not fit"),
    ("ij,jk->ik", [(2, 3), (4, 5)], "label 'j'"),
    ("ii->i", [(2, 3)], "in one input"),
    ("...ij->ij", [(2, 3, 4)], "needs '...'"),
    ("...i,...i->...i", [(2, 3), (4, 3)], "do not broadcast"),
])
def test_invalid_equations(graph, equation, shapes, message):
    holders = [ef.placeholder("float32", s) for s in shapes]
    with pytest.raises(GraphError, match=message):
        einsum(equation)(*holders)


def test_invalid_operands(graph):
    f, i = ef.placeholder("float32", (2, 2)), ef.placeholder("int32", (2, 2))
    with pytest.raises(GraphError, match="share one dtype"):
        einsum("ij,jk->ik")(f, i)
    with pytest.raises(GraphError, match="not supported"):
        einsum("ij->ji")(ef.placeholder("bool", (2, 2)))
    with pytest.raises(GraphError, match="required"):
        apply("einsum", [f])
    with pytest.raises(GraphError, match="takes 1 to any number"):
        apply("einsum", [], {"equation": ""})


@st.composite
def equations(draw):
    """A random equation over labels a-d, with shapes: diagonals, sums, broadcasting, '...'."""
    sizes = {c: draw(st.integers(1, 3)) for c in "abcd"}
    n = draw(st.integers(1, 3))
    ellipsis = draw(st.lists(st.integers(1, 2), max_size=2)) if draw(st.booleans()) else None
    terms, shapes = [], []
    for _ in range(n):
        term = draw(st.lists(st.sampled_from("abcd"), max_size=3))
        shape = [sizes[c] for c in term]
        for j, c in enumerate(term):  # a label that occurs once in this term may have size 1 here
            if term.count(c) == 1 and draw(st.integers(0, 4)) == 0:
                shape[j] = 1
        text = "".join(term)
        if ellipsis is not None:
            k = draw(st.integers(0, len(ellipsis)))
            under = [d if draw(st.booleans()) else 1 for d in ellipsis[len(ellipsis) - k:]]
            at = draw(st.integers(0, len(term)))
            text, shape = text[:at] + "..." + text[at:], shape[:at] + under + shape[at:]
        terms.append(text)
        shapes.append(tuple(shape))
    equation = ",".join(terms)
    if draw(st.booleans()):
        used = sorted(set("".join(terms).replace(".", "")))
        order = draw(st.permutations(used))
        out = order[:draw(st.integers(0, len(order)))]
        equation += "->" + ("..." if ellipsis is not None else "") + "".join(out)
    return equation, shapes


@given(form=equations(), seed=st.integers(0, 2 ** 16))
def test_random_equations_match_loops(form, seed):
    equation, shapes = form
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(-3, 4, size=s).astype(np.int64) for s in shapes]
    out = run_in_memory(einsum(equation), *arrays)
    assert_close(out, einsum_by_loops(equation, *arrays), np.int64)


def test_loop_reference_agrees_with_textbook_cases():
    a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(einsum_by_loops("ij,jk->ik", a, b), a @ b)
    np.testing.assert_array_equal(einsum_by_loops("ij", a), a)
    np.testing.assert_array_equal(einsum_by_loops("ji", a), a.T)
    np.testing.assert_array_equal(einsum_by_loops("ii", b[:, :3]), np.trace(b[:, :3]))
