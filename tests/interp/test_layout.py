"""Chains of layout ops (transposes, reshape-likes, gathers of one constant index) run as one
strided copy from their source (interp/layout.py): the values numpy's ops give one by one."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import edgeflow as ef
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply
from edgeflow.interp import layout


def _factors(n):
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def _reorders(shape, perm):
    kept = [a for a in perm if shape[a] != 1]
    return kept != sorted(kept)


@st.composite
def _chain(draw, copying=False):
    """(x's shape, [(kind, argument)], the step after which a second branch reads, or None).
    `copying`: dims of 2 or more, and the first and last steps transposes that move elements
    (copies where they run alone: a chain the plan may compose)."""
    shape = tuple(draw(st.lists(st.integers(2 if copying else 1, 4), min_size=2 if copying else 1, max_size=4)))
    steps, current = [], shape
    count = draw(st.integers(1, 6))
    for k in range(count):
        kind = draw(st.sampled_from(["transpose", "transpose", "reshape", "gather", "squeeze", "expand_dims"]))
        if copying and k in (0, count - 1):
            kind = "transpose"
        if kind == "transpose":
            perm = tuple(draw(st.permutations(range(len(current)))))
            if copying and k in (0, count - 1):
                perm = draw(st.permutations(range(len(current))).filter(lambda p: _reorders(current, p))
                            if sum(d != 1 for d in current) > 1 else st.just(perm))
            steps.append((kind, perm))
            current = tuple(current[p] for p in perm)
        elif kind == "reshape":  # any row-major regrouping of the elements, ones anywhere
            factors = _factors(int(np.prod(current)))
            cuts = sorted(draw(st.sets(st.integers(1, max(len(factors) - 1, 1)), max_size=len(factors))))
            dims = [int(np.prod(factors[a:b])) for a, b in zip([0, *cuts], [*cuts, len(factors)]) if b > a]
            for _ in range(draw(st.integers(0, min(2, 8 - len(dims))))):  # the format's rank: 8 at most
                dims.insert(draw(st.integers(0, len(dims))), 1)
            dims = dims or [1]
            steps.append((kind, tuple(dims)))
            current = tuple(dims)
        elif kind == "gather" and len(current) > 1:
            axis = draw(st.integers(0, len(current) - 1))
            index = draw(st.integers(-current[axis], current[axis] - 1))
            steps.append((kind, (axis, index)))
            current = current[:axis] + current[axis + 1:]
        elif kind == "squeeze" and 1 in current and len(current) > 1:
            axes = tuple(a for a, d in enumerate(current) if d == 1)[:len(current) - 1]
            steps.append((kind, axes))
            current = tuple(d for a, d in enumerate(current) if a not in axes)
        elif kind == "expand_dims" and len(current) < 6:
            axis = draw(st.integers(0, len(current)))
            steps.append((kind, (axis,)))
            current = current[:axis] + (1,) + current[axis:]
    branch = draw(st.one_of(st.none(), st.integers(0, len(steps) - 1))) if steps else None
    return shape, steps, branch


def _graph_step(t, kind, arg):
    if kind == "transpose":
        return apply("transpose", [t], {"perm": arg})
    if kind == "reshape":
        return apply("reshape", [t], {"shape": arg})
    if kind == "gather":
        return apply("gather", [t, ef.constant(np.int64(arg[1]))], {"axis": arg[0]})
    return apply(kind, [t], {"axes": arg})


def _numpy_step(a, kind, arg):
    if kind == "transpose":
        return a.transpose(arg)
    if kind == "reshape":
        return a.reshape(arg)
    if kind == "gather":
        return np.take(a, arg[1], axis=arg[0])
    if kind == "squeeze":
        return np.squeeze(a, arg)
    return np.expand_dims(a, arg)


def _runner(shape, steps, branch, dtype=ef.float32, **options):
    """A model of x * 2 through `steps`, plus 1 (a reader that is not a layout op); where
    `branch` is a step, a second output reads that step's tensor transposed (reversed axes),
    minus 1."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(dtype, shape, name="x")
        t, outputs = x * 2, {}
        for k, (kind, arg) in enumerate(steps):
            t = _graph_step(t, kind, arg)
            if k == branch:
                outputs["b"] = apply("transpose", [t], {"perm": ()}) - 1
        outputs["y"] = t + 1
    model = ef.to_model(g, {"infer": ({"x": x}, outputs)})
    return ef.Interpreter(writer.to_bytes(model), **options).get_signature_runner("infer")


def _expected(x, steps, branch):
    one = x.dtype.type(1)
    a, out = x * x.dtype.type(2), {}
    for k, (kind, arg) in enumerate(steps):
        a = _numpy_step(a, kind, arg)
        if k == branch:
            out["b"] = a.transpose() - one
    out["y"] = a + one
    return out


@settings(max_examples=120, deadline=None)
@given(st.one_of(_chain(), _chain(copying=True)))
def test_chains_of_layout_ops_give_numpys_values(case):
    """Any chain of transposes, reshapes, squeezes, expand_dims and gathers of one constant
    index (half of them starting and ending with a transpose that moves elements), a second
    branch reading one of its tensors or not: the outputs are those of numpy's ops applied
    one by one, exactly, on two inputs in turn (nothing left over from a run in the arena),
    whichever of the chain's tensors the plan made virtual."""
    shape, steps, branch = case
    runner = _runner(shape, steps, branch)
    rng = np.random.default_rng(len(steps))
    for _ in range(2):
        x = rng.standard_normal(shape).astype(np.float32)
        got, want = runner(x=x), _expected(x, steps, branch)
        assert set(got) == set(want)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    plan = runner.last_plan
    for i in plan.virtual:
        assert i not in plan.step_ops
        out = plan.subgraph.operators[i].outputs[0]
        assert not plan.arrays[out].flags.writeable and plan.arrays[out].strides == (0,) * plan.arrays[out].ndim
    assert set(plan.composed) <= set(plan.step_ops)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64])
def test_chains_of_other_dtypes(dtype):
    """A chain of two transposes around a gather and a reshape, on float64 and integer
    tensors: the first transpose virtual, the leaf a copy of the source's elements in the
    chain's order, exactly numpy's (the copy moves bytes of any dtype)."""
    steps = [("transpose", (2, 0, 1)), ("gather", (1, 2)), ("reshape", (5, 2, 2)), ("transpose", (1, 2, 0))]
    runner = _runner((3, 4, 5), steps, None, dtype=getattr(ef, np.dtype(dtype).name))
    x = np.random.default_rng(8).integers(-50, 50, (3, 4, 5)).astype(dtype)
    got, want = runner(x=x), _expected(x, steps, None)
    assert got["y"].dtype == dtype
    np.testing.assert_array_equal(got["y"], want["y"])
    plan = runner.last_plan
    first = next(i for i in plan.order if plan.subgraph.operators[i].opcode == "transpose")
    assert first in plan.virtual and plan.composed


def _attention_steps(s, n, e, heads):
    """A torch-exported MultiheadAttention's input projection output (S, N, 3E) taken apart:
    q, k and v as (N * heads, S, E / heads), k's last two axes swapped (as q @ k^T reads it)."""
    unflat = [("reshape", (s, n, 3, e)), ("expand_dims", (0,)), ("transpose", (3, 1, 2, 0, 4)),
              ("squeeze", (3,))]
    heads_of = [("reshape", (s, n * heads, e // heads)), ("transpose", (1, 0, 2))]
    return unflat, {name: [("gather", (0, k)), *heads_of] for k, name in enumerate("qkv")}


def _attention_runner(s, n, e, heads, **options):
    unflat, branches = _attention_steps(s, n, e, heads)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, (s, n, 3 * e), name="x")
        t = x * 2.0
        for kind, arg in unflat:
            t = _graph_step(t, kind, arg)
        outs = {}
        for name, steps in branches.items():
            b = t
            for kind, arg in steps:
                b = _graph_step(b, kind, arg)
            if name == "k":
                b = apply("transpose", [apply("reshape", [b], {"shape": (n, heads, s, e // heads)})],
                          {"perm": (0, 1, 3, 2)})
            outs[name] = b + 1.0
    model = ef.to_model(g, {"infer": ({"x": x}, outs)})
    return ef.Interpreter(writer.to_bytes(model), **options).get_signature_runner("infer"), unflat, branches


@pytest.mark.parametrize("threads", [None, 2])
def test_an_attention_layers_q_k_and_v_are_copied_once(threads):
    """The stack of q, k and v (the transpose to (3, S, N, 1, E)) gets no memory and no step:
    q and v are each one copy from the projection's output; k is made before its last
    transpose (k^T read straight from the projection would read across its rows, one float
    a cache line), then transposed from that. Values exactly numpy's; at 2 threads (a size that
    splits the copies over the workers: threads.MIN_ELEMENTS) too."""
    s, n, e, heads = (128, 8, 256, 4) if threads else (6, 2, 12, 3)
    runner, unflat, branches = _attention_runner(s, n, e, heads, num_threads=threads)
    x = np.random.default_rng(5).standard_normal((s, n, 3 * e)).astype(np.float32)
    got = runner(x=x)
    stack = x * np.float32(2)
    for kind, arg in unflat:
        stack = _numpy_step(stack, kind, arg)
    for name, steps in branches.items():
        want = stack
        for kind, arg in steps:
            want = _numpy_step(want, kind, arg)
        if name == "k":
            want = want.reshape(n, heads, s, e // heads).transpose(0, 1, 3, 2)
        np.testing.assert_array_equal(got[name], want + np.float32(1), err_msg=name)
    plan = runner.last_plan
    ops_ = plan.subgraph.operators
    made_by = {t: i for i in plan.order for t in ops_[i].outputs}
    transposes = {}  # output name -> the transposes on its way from x * 2, last first
    for name, details in runner.get_output_details().items():
        i, chain = made_by[details["index"]], []
        while ops_[i].opcode != "mul":
            if ops_[i].opcode == "transpose":
                chain.append(i)
            i = made_by[ops_[i].inputs[0]]
        transposes[name] = chain
    (q_heads, stack_transpose), (v_heads, _) = transposes["q"], transposes["v"]
    k_swap, k_heads, _ = transposes["k"]
    assert stack_transpose in plan.virtual
    gathers = [i for i in plan.order if ops_[i].opcode == "gather"]
    assert set(gathers) <= plan.virtual
    source = ops_[stack_transpose].inputs[0]
    assert all(plan.composed[i][0] == source for i in (q_heads, k_heads, v_heads))
    assert k_swap not in plan.virtual and k_swap in plan.step_ops
    assert k_swap not in plan.composed or plan.composed[k_swap][0] == ops_[k_heads].outputs[0]


def test_the_stack_has_no_bytes_in_the_arena(monkeypatch):
    """Made virtual, the stack of q, k and v has no bytes in the arena: the plan asks for its
    3 * S * N * E floats fewer than the plan that copies it (layout.chains declined), the
    values the same; preserve_all_tensors keeps every tensor, so it makes none virtual."""
    s, n, e, heads = 16, 2, 24, 3
    x = np.random.default_rng(6).standard_normal((s, n, 3 * e)).astype(np.float32)
    lean, _, _ = _attention_runner(s, n, e, heads)
    kept, _, _ = _attention_runner(s, n, e, heads, preserve_all_tensors=True)
    got = [lean(x=x), kept(x=x)]  # planned now
    monkeypatch.setattr(layout, "chains", lambda *args: (set(), {}))
    copied, _, _ = _attention_runner(s, n, e, heads)
    want = copied(x=x)
    for outputs in got:
        for name, value in outputs.items():
            np.testing.assert_array_equal(value, want[name])
    assert lean.last_plan.virtual and not copied.last_plan.virtual
    assert not kept.last_plan.virtual and not kept.last_plan.composed
    stack = next(op.outputs[0] for i, op in enumerate(lean.last_plan.subgraph.operators)
                 if i in lean.last_plan.virtual and op.opcode == "transpose")
    assert stack not in lean.last_plan.offsets and stack in copied.last_plan.offsets
    requested = [sum(r[0] for r in runner.last_plan.requests) for runner in (lean, copied)]
    assert requested[0] == requested[1] - 3 * s * n * e * 4


def test_a_reshape_that_cannot_be_composed_makes_the_tensor_before_it():
    """(2, 3) transposed to (3, 2), reshaped to (2, 3) (no strides say that of the source's
    elements), transposed again: the first transpose is made (a copy), the rest read it."""
    runner = _runner((2, 3), [("transpose", (1, 0)), ("reshape", (2, 3)), ("transpose", (1, 0))], None)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(runner(x=x)["y"], (x * 2).T.reshape(2, 3).T + 1)
    plan = runner.last_plan
    first = next(i for i in plan.order if plan.subgraph.operators[i].opcode == "transpose")
    assert first not in plan.virtual and first in plan.step_ops


def test_a_chain_ending_in_a_view_is_not_composed():
    """A transpose whose output a reshape feeds to a multiply (a reader that is not a layout
    op): nothing copies after it, so it stays the one copy, and nothing is virtual."""
    runner = _runner((2, 3, 4), [("transpose", (2, 0, 1)), ("reshape", (4, 6))], None)
    x = np.random.default_rng(7).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(runner(x=x)["y"], (x * 2).transpose(2, 0, 1).reshape(4, 6) + 1)
    assert not runner.last_plan.virtual and not runner.last_plan.composed


def test_compose_reads_a_constant_that_is_not_contiguous_from_a_copy():
    """A source that is not C-contiguous and does not change (a folded constant's view),
    where the chain's reshape cuts its axes where no strides say it, is composed from a
    contiguous copy; one that changes must be C-contiguous."""
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    source = base.T  # (6, 4), its axes 4 and 24 bytes apart
    source.setflags(write=False)
    moves = [lambda f: f.reshaped((4, 6)), lambda f: f.transposed((1, 0))]
    assert layout.Fine.whole(source).reshaped((4, 6)) is None
    src, dst = layout.compose(source, moves).source_and_target(np.empty((6, 4), np.float32))
    np.copyto(dst, src)
    np.testing.assert_array_equal(dst, base.T.reshape(4, 6).T)
    with pytest.raises(AssertionError):
        layout.compose(np.arange(24, dtype=np.float32).reshape(4, 6).T, moves)
