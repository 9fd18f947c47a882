"""The arena plan: tensors alive at the same time never share bytes; reuse keeps results right."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import edgeflow as ef
from edgeflow.interp import arena
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply


def _overlapping_pairs(requests, offsets):
    """Pairs of requests that are alive together and share a byte (should be none)."""
    bad = []
    for i, (ni, fi, li) in enumerate(requests):
        for j, (nj, fj, lj) in enumerate(requests[:i]):
            if ni and nj and fi <= lj and fj <= li:
                if offsets[i] < offsets[j] + nj and offsets[j] < offsets[i] + ni:
                    bad.append((i, j))
    return bad


@st.composite
def _requests(draw, most=5000):
    n = draw(st.integers(1, 40))
    out = []
    for _ in range(n):
        first = draw(st.integers(0, 30))
        out.append((draw(st.integers(0, most)), first, first + draw(st.integers(0, 10))))
    return out


@given(_requests())
def test_place_never_overlaps_live_tensors(requests):
    offsets, total = arena.place(requests)
    assert _overlapping_pairs(requests, offsets) == []
    assert all(o % 64 == 0 for o in offsets)
    assert all(o + n <= total for (n, _, _), o in zip(requests, offsets))
    # the most bytes alive at any one step is a floor no plan can beat
    steps = range(0, 41)
    peak = max(sum(-(-n // 64) * 64 for n, f, l in requests if f <= s <= l) for s in steps)
    assert total >= peak
    assert arena.lower_bound(requests) == peak


@given(_requests(most=1 << 20))
def test_place_tries_another_order_only_far_from_the_bound(requests):
    """The orders are tried until one is near the lower bound (1/64 of it, or 256 KiB);
    the best of those tried is kept, and the search goes on only while none is near."""
    results = []
    real = arena._place_in_order

    def counting(requests_, order):
        results.append(real(requests_, order))
        return results[-1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(arena, "_place_in_order", counting)
        offsets, total = arena.place(requests)
    bound = arena.lower_bound(requests)
    near = [t <= bound + max(bound // 64, 1 << 18) for _, t in results]
    assert near[:-1] == [False] * (len(results) - 1) and (near[-1] or len(results) == len(arena._ORDERS))
    assert total == min(t for _, t in results) and (offsets, total) in results
    assert _overlapping_pairs(requests, offsets) == []


def _branchy(rng, width=6, depth=5):
    """A graph of parallel branches that merge: many tensors, few alive at once."""
    g = ef.Graph()
    ws = [rng.standard_normal((16, 16)).astype(np.float32) * 0.3 for _ in range(width)]
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 16], name="x")
        h = x
        for d in range(depth):
            branches = [ef.tanh(h @ ef.constant(w)) for w in ws]
            h = branches[0]
            for b in branches[1:]:
                h = h + b
            h = ef.reshape(h, [-1, 4, 4])
            h = ef.reshape(ef.transpose(h, [0, 2, 1]), [-1, 16])
        y = ef.reduce_sum(h, axis=1, name="y")

    def ref(xv):
        hv = xv
        for _ in range(depth):
            hv = sum(np.tanh(hv @ w) for w in ws)
            hv = hv.reshape(-1, 4, 4).transpose(0, 2, 1).reshape(-1, 16)
        return hv.sum(1)
    return writer.to_bytes(ef.to_model(g, {"infer": ({"x": x}, {"y": y})})), ref


def test_plan_of_a_real_graph_keeps_live_tensors_apart():
    data, _ = _branchy(np.random.default_rng(0))
    interp = ef.Interpreter(data)
    runner = interp.get_signature_runner("infer")
    runner(x=np.zeros((8, 16), np.float32))
    plan = runner.last_plan
    sub = interp.model.subgraphs[0]
    # Lifetimes recomputed here from the op order: a tensor lives from the step that
    # makes it to the last step that reads it (or a view of it); outputs and inputs live
    # throughout.
    storage = {}
    for t in plan.offsets:
        storage[t] = t
    for i in plan.order:
        op = sub.operators[i]
        if op.opcode == "reshape" and op.inputs[0] in storage:
            storage[op.outputs[0]] = storage[op.inputs[0]]
    end = len(plan.order)
    life = {}
    for step, i in enumerate(plan.order):
        op = sub.operators[i]
        for t in op.outputs:
            if storage.get(t) == t:
                life.setdefault(t, [step, step])
        for t in op.inputs:
            if t in storage:
                root = storage[t]
                life.setdefault(root, [0, 0])[1] = step
    for t in sub.inputs + sub.outputs:
        life[storage[t]] = [0 if t in sub.inputs else life[storage[t]][0], end]
    owned = sorted(life)
    requests = [(plan.arrays[t].nbytes, *life[t]) for t in owned]
    offsets = [plan.offsets[t] for t in owned]
    assert _overlapping_pairs(requests, offsets) == []
    assert plan.arena.nbytes < sum(n for n, _, _ in requests) / 3  # memory really is reused


def test_results_right_when_buffers_are_reused():
    rng = np.random.default_rng(1)
    data, ref = _branchy(rng)
    runner = ef.Interpreter(data).get_signature_runner("infer")
    for batch in (1, 5, 32):
        xv = rng.standard_normal((batch, 16)).astype(np.float32)
        np.testing.assert_allclose(runner(x=xv)["y"], ref(xv), rtol=1e-4, atol=1e-5)


def test_arena_views_are_aligned():
    data, _ = _branchy(np.random.default_rng(2))
    runner = ef.Interpreter(data).get_signature_runner("infer")
    runner(x=np.zeros((3, 16), np.float32))
    plan = runner.last_plan
    assert all(plan.arrays[t].ctypes.data % 64 == 0 for t in plan.offsets)


# -- the kernels' shared scratch (arena.Workspace) ----------------------------------------------
def _span(a):
    return a.ctypes.data, a.ctypes.data + a.nbytes


def _overlap(a, b):
    (s1, e1), (s2, e2) = _span(a), _span(b)
    return s1 < e2 and s2 < e1


def test_scratch_outside_a_plan_is_a_new_array():
    a, b = arena.scratch((3, 5), np.float32), arena.scratch((3, 5), np.float32)
    assert a.shape == (3, 5) and a.dtype == np.float32 and not _overlap(a, b)


@given(st.lists(st.lists(st.tuples(st.integers(0, 3000), st.sampled_from([np.float32, np.int8, np.float64])),
                         min_size=1, max_size=4), min_size=1, max_size=8))
def test_workspace_steps_share_bytes_but_one_step_never_overlaps_itself(steps):
    ws = arena.Workspace()
    taken = []
    for requests in steps:
        with ws.step():
            arrays = [arena.scratch((n,), dtype) for n, dtype in requests]
        assert arena.scratch((4,), np.float32).base is None  # outside the step: a new array again
        for a, (n, dtype) in zip(arrays, requests):
            assert a.shape == (n,) and a.dtype == dtype and (a.ctypes.data % arena.ALIGNMENT == 0 or not n)
        assert not any(_overlap(a, b) for i, a in enumerate(arrays) for b in arrays[:i] if a.size and b.size)
        taken.append(arrays)
    # each step's arrays keep their values while it runs, whatever the others hold between runs
    for arrays in taken:
        for k, a in enumerate(arrays):
            a[...] = k + 1
        for k, a in enumerate(arrays):
            assert (a == k + 1).all()
    # memory is shared: it never exceeds about twice what the largest step takes (plus alignment)
    largest = max(sum(arena.aligned(n * np.dtype(d).itemsize) for n, d in r) for r in steps)
    assert ws.nbytes <= 4 * largest + 64


def test_plans_have_a_workspace_and_kernels_draw_from_it():
    from edgeflow.interp.kernels import KERNELS
    data, ref = _branchy(np.random.default_rng(3))
    interp = ef.Interpreter(data)
    runner = interp.get_signature_runner("infer")
    xv = np.ones((4, 16), np.float32)
    np.testing.assert_allclose(runner(x=xv)["y"], ref(xv), rtol=1e-4, atol=1e-5)
    assert isinstance(runner.last_plan.workspace, arena.Workspace)
    # a kernel factory run by a plan gets its scratch from that plan's workspace
    seen, original = [], KERNELS["tanh"]

    def spying(ins, outs, attrs):
        seen.append(arena.scratch((8,), np.float32))
        return original(ins, outs, attrs)
    KERNELS["tanh"] = spying
    try:
        plan = interp._make_plan(interp._io[0], interp._io[1], {interp._io[0][0]: (2, 16)}, [], {})
    finally:
        KERNELS["tanh"] = original
    blocks = plan.workspace.blocks
    assert seen and all(any(np.may_share_memory(a, b) for b in blocks) for a in seen)


def _place_in_order_reference(requests, order):
    """The placement loop as first written (one Python pass over the placed tensors)."""
    offsets, placed = [0] * len(requests), []
    for i in order:
        size, first, last = requests[i]
        size = arena.aligned(size)
        if size == 0:
            continue
        busy = sorted((o, e) for o, e, f, l in placed if f <= last and first <= l)
        best, best_gap, cursor = None, None, 0
        for start, end in busy:
            gap = start - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, end)
        offsets[i] = cursor if best is None else best
        placed.append((offsets[i], offsets[i] + size, first, last))
    return offsets, max((e for _, e, _, _ in placed), default=0)


@given(_requests(), st.randoms(use_true_random=False))
def test_placement_places_as_the_plain_loop(requests, random):
    order = list(range(len(requests)))
    random.shuffle(order)
    assert arena._place_in_order(requests, order) == _place_in_order_reference(requests, order)


# -- scratch with borders: padding is rewritten on every run ---------------------------------

def _conv_reference(x, w, stride, pad, dilation):
    """float64 conv2d (N, C, H, W) * (M, C, k, k) by sliding windows: independent of the kernels."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    k = (w.shape[2] - 1) * dilation + 1
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[..., ::dilation, ::dilation]
    return np.einsum("nchwij,mcij->nmhw", win[:, :, ::stride, ::stride], w)


def _poisoned_run(runner, **feeds):
    """Run twice, the plan's whole workspace set to NaN before the second run: a step that
    read padding it did not write on that run would give NaN."""
    runner(**feeds)
    for block in runner.last_plan.workspace.blocks:
        block.view(np.uint8)[...] = 0xFF  # NaN in every float dtype
    return runner(**feeds)


@pytest.mark.parametrize("algo", ["direct", "winograd4"])
@pytest.mark.parametrize("stride,pad,dilation", [(1, 1, 1), (2, 1, 1), (1, 2, 2), (2, 0, 1)])
def test_padding_of_scratch_buffers_is_rewritten_on_every_run(monkeypatch, algo, stride, pad, dilation):
    """Forward (conv, max and average pool) against a numpy reference, and the conv's
    gradients against central differences of it, from a workspace poisoned between runs."""
    if algo != "direct" and (stride, dilation) != (1, 1):
        return  # Winograd serves 3x3 stride-1 convs only
    monkeypatch.setenv("EDGEFLOW_CONV_ALGO", algo)
    rng = np.random.default_rng(stride * 10 + pad)
    x = rng.normal(size=(2, 3, 9, 8))
    w = rng.normal(size=(4, 3, 3, 3))
    r = rng.normal(size=_conv_reference(x, w, stride, pad, dilation).shape)
    g = ef.Graph()
    with g.as_default():
        xt = ef.placeholder(ef.float64, x.shape, name="x")
        wt = ef.placeholder(ef.float64, w.shape, name="w")
        y = apply("conv", [xt, wt], {"strides": (stride,) * 2, "pads": (pad,) * 4, "dilations": (dilation,) * 2})
        window = {"kernel_shape": (3, 3), "pads": (1, 1, 1, 1)}
        pooled = apply("max_pool", [y], window) + apply("avg_pool", [y], window)
        loss = ef.reduce_sum(y * ef.constant(r))
        dx, dw = ef.gradients(loss, [xt, wt])
    model = ef.to_model(g, {"infer": ({"x": xt, "w": wt}, {"y": y, "pooled": pooled}),
                            "grads": ({"x": xt, "w": wt}, {"dx": dx, "dw": dw})})
    interp = ef.Interpreter(writer.to_bytes(model))
    out = _poisoned_run(interp.get_signature_runner("infer"), x=x, w=w)
    expected = _conv_reference(x, w, stride, pad, dilation)
    np.testing.assert_allclose(out["y"], expected, rtol=1e-10, atol=1e-10)
    padded = np.pad(expected, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    def window_sums(a):
        return np.lib.stride_tricks.sliding_window_view(np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3),
                                                        axis=(2, 3)).sum((-1, -2))
    mean = window_sums(expected) / window_sums(np.ones_like(expected))  # padding not counted
    np.testing.assert_allclose(out["pooled"], windows.max((-1, -2)) + mean, rtol=1e-10, atol=1e-10)
    grads = _poisoned_run(interp.get_signature_runner("grads"), x=x, w=w)

    def loss_of(xv, wv):
        return float((_conv_reference(xv, wv, stride, pad, dilation) * r).sum())
    for name, base, got in (("x", x, grads["dx"]), ("w", w, grads["dw"])):
        numeric = np.empty(base.size)
        for e in range(base.size):
            moved = [base.copy(), base.copy()]
            moved[0].reshape(-1)[e] += 1e-3
            moved[1].reshape(-1)[e] -= 1e-3
            args = [(m, w) if name == "x" else (x, m) for m in moved]
            numeric[e] = (loss_of(*args[0]) - loss_of(*args[1])) / 2e-3  # exact: the loss is linear
        np.testing.assert_allclose(got.reshape(-1), numeric, rtol=1e-7, atol=1e-9, err_msg=name)


@pytest.mark.parametrize("shape, perm, view", [
    ((1, 128, 16), (1, 0, 2), True),  # batch 1's (B, S, E) -> (S, B, E) of a torch-exported encoder
    ((1, 8, 1, 16), (2, 1, 0, 3), True),
    ((1, 128, 1, 3, 16), (3, 1, 2, 0, 4), False),  # the same encoder's q, k, v apart: 3 moves before 128
    ((2, 128, 16), (1, 0, 2), False),
    ((1, 4, 8, 16), (0, 1, 3, 2), False),
    ((1, 4, 1, 16), None, False)])  # reversed: 16 and 4 swap
def test_a_transpose_that_moves_only_axes_of_one_element_is_a_view(shape, perm, view):
    """Its output is its input's elements in their order: a view of the input's bytes (no
    step, no bytes of its own), the values numpy's transpose gives, also where the model is
    run again on other values; any other transpose copies."""
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        y = apply("transpose", [t * 2.0], {"perm": perm}) + 1.0
    interp = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})})))
    runner = interp.get_signature_runner("infer")
    for scale in (1.0, -3.0):
        np.testing.assert_array_equal(runner(x=x * scale)["y"], (x * scale * 2.0).transpose(perm) + 1.0)
    plan = runner.last_plan
    transpose = next(i for i, op in enumerate(plan.subgraph.operators) if op.opcode == "transpose")
    assert (transpose in plan.views) == view
    assert (transpose in plan.step_ops) != view
    op = plan.subgraph.operators[transpose]
    assert np.shares_memory(plan.arrays[op.inputs[0]], plan.arrays[op.outputs[0]]) == view


@pytest.mark.parametrize("shape, axis, index, view", [
    ((3, 8, 2, 16), 0, 1, True),  # a torch-exported encoder's q, k, v from their stack
    ((3, 8, 2, 16), 0, -1, True),
    ((1, 1, 5, 16), 2, 4, True),
    ((1,), 0, 0, True),  # a 0-d view (a greedy decoder's token: its loop's condition reads it)
    ((2, 5, 16), 1, 3, False),  # a strided slice: copied
    ((3, 8, 16), 0, None, False)])  # an index fed at run time
def test_a_gather_of_one_constant_index_whose_slice_is_contiguous_is_a_view(shape, axis, index, view):
    """Its output is a contiguous slice of x: a view of x's bytes (no step), the values
    numpy's take gives, also on other values of x; other gathers copy."""
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        feeds = {"x": t}
        if index is None:
            i = ef.placeholder(ef.int64, (), name="i")
            feeds["i"] = i
        else:
            i = ef.constant(np.int64(index))
        y = apply("gather", [t * 2.0, i], {"axis": axis}) + 1.0
    runner = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": (feeds, {"y": y})}))).get_signature_runner("infer")
    k = 1 if index is None else index
    for scale in (1.0, -3.0):
        given = {"x": x * scale, **({"i": np.int64(k)} if index is None else {})}
        np.testing.assert_array_equal(runner(**given)["y"], np.take(x * scale * 2.0, k, axis=axis) + 1.0)
    plan = runner.last_plan
    gather = next(i for i, op in enumerate(plan.subgraph.operators) if op.opcode == "gather")
    assert (gather in plan.views) == view and (gather in plan.step_ops) != view
