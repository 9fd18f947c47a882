"""The conv kernel's Winograd paths (edgeflow/interp/kernels/winograd.py) against a float64
direct conv written here, onnxruntime's Conv and the direct path forced on; the rule's
choice for ResNet-like layers reaches the Winograd path."""
import os
from unittest import mock

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from edgeflow import ops
from edgeflow.errors import EdgeflowError
from edgeflow.interp import threads
from edgeflow.interp.kernels import KERNELS, jit, native_gemm, native_winograd, winograd

from .native_cases import run_graph


def onnx_conv(x, w, b, pads):
    """onnxruntime's Conv (1 thread) of x with the constants w, b."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    consts = [numpy_helper.from_array(w, "w")] + ([] if b is None else [numpy_helper.from_array(b, "b")])
    node = helper.make_node("Conv", ["x", "w"] + ([] if b is None else ["b"]), ["y"], pads=list(pads))
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every onnxruntime release reads
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]

TOL = 1e-4  # max abs error / max abs output, float32 (F(4x4,3x3) measures ~1e-5 at 512 channels)


def reference(x, w, b, pads, activation=""):
    """float64 conv of x (N, C, H, W) with w (M, C, 3, 3), pads (top, left, bottom, right):
    an einsum over the padded 3x3 windows."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    top, left, bottom, right = pads
    p = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    windows = np.lib.stride_tricks.sliding_window_view(p, (3, 3), axis=(2, 3))  # (N, C, OH, OW, 3, 3)
    y = np.einsum("nchwij,mcij->nmhw", windows, w)
    if b is not None:
        y = y + b.astype(np.float64)[:, None, None]
    return np.maximum(y, 0) if activation == "relu" else y


def conv(x, w, b, pads, activation="", algo=None):
    """The conv kernel bound once (with EDGEFLOW_CONV_ALGO=algo) and its step."""
    attrs = {name: a.default for name, a in ops.get("conv").attrs.items()}
    attrs.update(pads=tuple(pads), activation=activation)
    out_shape = (x.shape[0], w.shape[0], x.shape[2] + pads[0] + pads[2] - 2, x.shape[3] + pads[1] + pads[3] - 2)
    out = np.full(out_shape, np.nan, x.dtype)
    env = {winograd.ENV: algo} if algo else {}
    with mock.patch.dict(os.environ, env):
        if not algo:
            os.environ.pop(winograd.ENV, None)
        step = KERNELS["conv"]([x, w] + ([] if b is None else [b]), [out], attrs)
    return step, out


def assert_near(got, want, tol=TOL):
    scale = max(np.abs(want).max(), 1e-3)
    err = np.abs(got.astype(np.float64) - want).max() / scale
    assert err <= tol, f"max abs error {err:.2e} of the output scale {scale:.3g}"


@pytest.fixture(params=["numpy", "jit"])
def transforms(request, monkeypatch):
    """Which path the tiles' transforms take: numpy's products (numba not loaded, as a plan
    that loaded nothing else runs them), or jit.py's loops (the jit extra is installed with
    the tests: a broken numba fails here). Returns (path, the names of the loops bound)."""
    bound = []
    if request.param == "numpy":
        monkeypatch.setattr(jit, "loaded", lambda: False)
    else:
        assert jit.available(), "numba does not import"
        monkeypatch.setattr(jit, "SMALL_CONV_CHANNELS", 0)  # convs of 1-4 channels take Winograd too, not the stem loop
        compiled = jit.compiled
        monkeypatch.setattr(jit, "compiled", lambda loop, *args, **kwargs: bound.append(loop.__name__) or compiled(loop, *args, **kwargs))

        def recording(bind, name):
            def binding(*args):
                step = bind(*args)
                if step is not None:
                    bound.append(name)
                return step
            return binding
        monkeypatch.setattr(native_winograd, "bind_input",
                            recording(native_winograd.bind_input, "native_winograd_input"))
        monkeypatch.setattr(native_winograd, "bind_output",
                            recording(native_winograd.bind_output, "native_winograd_output"))
    return request.param, bound


def input_loop(algo, dtype=np.float32):
    """The input transform's loop: native_winograd's in float32 where native_gemm runs
    (x86-64 with AVX2 and FMA), else jit.py's."""
    native = dtype == np.float32 and native_gemm.available()
    return "native_winograd_input" if native else "winograd_input_loop"


def check_transforms(transforms, *loops):
    """Under the JIT, `loops` were bound (and under numpy none of them)."""
    path, bound = transforms
    assert set(loops) <= set(bound) if path == "jit" else not set(loops) & set(bound), bound


@st.composite
def problems(draw):
    n, c, m = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 5))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    h = draw(st.integers(max(1, 3 - pads[0] - pads[2]), 11))
    wd = draw(st.integers(max(1, 3 - pads[1] - pads[3]), 11))
    return (n, c, m, h, wd, pads, draw(st.booleans()), draw(st.sampled_from(["", "relu"])),
            draw(st.booleans()), draw(st.integers(0, 2 ** 16)))


@pytest.mark.parametrize("algo", ["winograd2", "winograd4"])
@settings(max_examples=12)
@given(problem=problems())
def test_winograd_matches_references(algo, problem, transforms):
    """Odd sizes (tiles cut by the output's edge, H or W below a tile), asymmetric pads, bias
    or none, relu or none, w a constant (transformed once) or a variable (at each run); the
    tiles' transforms in numpy and in jit.py's loops."""
    n, c, m, h, wd, pads, bias, activation, constant, seed = problem
    transforms[1].clear()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    w = rng.standard_normal((m, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    if constant:
        w.setflags(write=False)
    step, out = conv(x, w, b, pads, activation, algo)
    step()
    check_transforms(transforms, input_loop(algo), "winograd_output_loop")
    want = reference(x, w, b, pads, activation)
    assert_near(out, want)
    direct_step, direct = conv(x, w, b, pads, activation, "direct")
    direct_step()
    assert_near(out, direct.astype(np.float64))
    peer = onnx_conv(x, np.array(w), b, pads)
    assert_near(out, np.maximum(peer, 0) if activation else peer)
    if not constant:  # a variable changed between runs: the next run uses its new value
        w *= -0.5
        step()
        assert_near(out, reference(x, w, b, pads, activation))


@pytest.mark.parametrize("algo", ["winograd2", "winograd4"])
@pytest.mark.parametrize("activation", ["", "relu6", "hard_swish"])
def test_winograd_float64(algo, activation, transforms):
    """float64 to float64's precision, with the activations the output loop clips to (relu6)
    or runs after the tiles (hard_swish: float32 alone in the loops, so numpy's here)."""
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((2, 6, 9, 10)), rng.standard_normal((7, 6, 3, 3)), rng.standard_normal(7)
    step, out = conv(x, w, b, (1, 0, 2, 1), activation, algo)
    step()
    check_transforms(transforms, input_loop(algo, np.float64),
                     *(["winograd_output_loop"] if activation != "hard_swish" else []))
    y = reference(x, w, b, (1, 0, 2, 1))
    want = {"": y, "relu6": np.clip(y, 0, 6), "hard_swish": y * np.clip(y + 3, 0, 6) / 6}[activation]
    assert_near(out, want, 1e-12)


@pytest.mark.parametrize("algo", ["winograd2", "winograd4"])
def test_winograd_output_loop_activations(algo, transforms):
    """float32's fused activations through the output loop: relu6 clipped in it, swish and
    hard_swish after its tiles, against float64."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 9, 13, 11)).astype(np.float32)
    w, b = rng.standard_normal((10, 9, 3, 3)).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    w.setflags(write=False)
    y = reference(x, w, b, (1, 1, 1, 1))
    for activation, f in (("relu6", lambda v: np.clip(v, 0, 6)), ("swish", lambda v: v / (1 + np.exp(-v))),
                          ("hard_swish", lambda v: v * np.clip(v + 3, 0, 6) / 6)):
        transforms[1].clear()
        step, out = conv(x, w, b, (1, 1, 1, 1), activation, algo)
        step()
        check_transforms(transforms, input_loop(algo), "winograd_output_loop")
        assert_near(out, f(y))


@pytest.mark.parametrize("algo", ["winograd2", "winograd4"])
def test_error_on_a_resnet_like_layer(algo, transforms):
    """He-initialised weights, inputs of magnitude ~1, 128 channels: the bound of the module doc."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 128, 16, 16)).astype(np.float32)
    w = (rng.standard_normal((128, 128, 3, 3)) * np.sqrt(2 / (9 * 128))).astype(np.float32)
    w.setflags(write=False)
    b = (0.1 * rng.standard_normal(128)).astype(np.float32)
    step, out = conv(x, w, b, (1, 1, 1, 1), "relu", algo)
    step()
    assert_near(out, reference(x, w, b, (1, 1, 1, 1), "relu"))


@pytest.mark.parametrize("shape, m, algo", [((1, 64, 56, 56), 64, "winograd4"), ((1, 256, 14, 14), 256, "winograd2"),
                                            ((1, 8, 56, 56), 8, "direct"), ((1, 512, 2, 2), 512, "direct"),
                                            ((1, 16, 55, 55), 64, "direct"), ((1, 24, 56, 56), 24, "winograd4"),
                                            ((1, 64, 56, 56), 8, "direct"),
                                            ((1, 128, 14, 14), 32, "winograd2"),  # DenseNet-121's
                                            ((1, 128, 7, 7), 32, "winograd2"), ((1, 128, 6, 6), 32, "direct")])
def test_rule(shape, m, algo):
    assert winograd.rule(shape, (m, shape[1], 3, 3), shape[2:]) == algo


def test_resnet_layer_takes_the_winograd_path(monkeypatch):
    """No EDGEFLOW_CONV_ALGO: the kernel of a ResNet-18 layer (64 channels, 56x56) binds
    the path the rule picks, F(4x4), and computes the conv; forced direct, it does not."""
    bound = []
    original = winograd.conv
    monkeypatch.setattr(winograd, "conv", lambda *args: bound.append(args[5]) or original(*args))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 64, 56, 56)).astype(np.float32)
    w = (rng.standard_normal((64, 64, 3, 3)) * np.sqrt(2 / (9 * 64))).astype(np.float32)
    w.setflags(write=False)
    b = rng.standard_normal(64).astype(np.float32)
    step, out = conv(x, w, b, (1, 1, 1, 1), "relu")
    step()
    assert bound == ["winograd4"]
    assert_near(out, reference(x, w, b, (1, 1, 1, 1), "relu"))
    conv(x, w, b, (1, 1, 1, 1), "relu", "direct")
    assert bound == ["winograd4"]


def test_forcing_where_winograd_does_not_apply_and_bad_values():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((1, 4, 8, 8)).astype(np.float32), rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    assert winograd.choose(x, w, 2, (1, 1), (1, 1), (6, 6)) == "direct"  # grouped
    assert winograd.choose(x, w, 1, (2, 2), (1, 1), (3, 3)) == "direct"  # strided
    assert winograd.choose(x.astype(np.float16), w.astype(np.float16), 1, (1, 1), (1, 1), (6, 6)) == "direct"
    with mock.patch.dict(os.environ, {winograd.ENV: "winograd4"}):
        assert winograd.choose(x, w, 1, (1, 1), (1, 1), (6, 6)) == "winograd4"
        assert winograd.choose(x, w, 1, (1, 1), (2, 2), (4, 4)) == "direct"  # dilated
    with mock.patch.dict(os.environ, {winograd.ENV: "fast"}):
        with pytest.raises(EdgeflowError, match=winograd.ENV):
            winograd.choose(x, w, 1, (1, 1), (1, 1), (6, 6))


@pytest.mark.parametrize("algo", ["winograd2", "winograd4"])
@pytest.mark.parametrize("constant", [True, False])
def test_split_over_workers(algo, constant, transforms):
    """Bound with 3 intra-op workers (each phase split over them, and a variable's weight
    transform at each run), on an odd layer."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 24, 23, 19)).astype(np.float32)
    w = rng.standard_normal((40, 24, 3, 3)).astype(np.float32)
    w.setflags(write=not constant)
    b = rng.standard_normal(40).astype(np.float32)
    workers = threads.Workers(3)
    try:
        with threads.using(workers), mock.patch.object(threads, "MIN_FLOPS", 1):
            step, out = conv(x, w, b, (1, 0, 2, 1), "relu", algo)
        step()
        assert_near(out, reference(x, w, b, (1, 0, 2, 1), "relu"))
        if not constant:
            w *= -0.5
            step()
            assert_near(out, reference(x, w, b, (1, 0, 2, 1), "relu"))
    finally:
        workers.close()


@pytest.mark.parametrize("workers_n", [1, 2])
@pytest.mark.parametrize("shape", [(1, 16, 56, 56), (2, 8, 28, 30)])
def test_wide_planes_take_both_native_transforms(workers_n, shape, transforms):
    """F(4x4) on planes of 14 and 7-8 tile columns: native_winograd's input and output
    transforms and native_gemm's products (36 a worker, bound as one chain, over U packed for
    each worker's output channels) where native_gemm runs (under the JIT), alone and split over 2 workers
    (each its channels), the values the float64 reference's."""
    rng = np.random.default_rng(shape[2])
    x = rng.standard_normal(shape).astype(np.float32)
    w = (rng.standard_normal((12, shape[1], 3, 3)) * 0.3).astype(np.float32)
    w.setflags(write=False)
    b = rng.standard_normal(12).astype(np.float32)
    workers = threads.Workers(workers_n) if workers_n > 1 else None
    transforms[1].clear()
    products = []
    bind_chain = native_gemm.bind_chain

    def counted(*args):
        steps = bind_chain(*args)
        products.extend(steps or ())
        return steps
    try:
        with threads.using(workers), mock.patch.object(threads, "MIN_FLOPS", 1), \
                mock.patch.object(native_gemm, "bind_chain", counted):
            step, out = conv(x, w, b, (1, 1, 1, 1), "relu", "winograd4")
        step()
    finally:
        if workers is not None:
            workers.close()
    native = native_gemm.available()
    check_transforms(transforms, input_loop("winograd4"),
                     "native_winograd_output" if native else "winograd_output_loop")
    assert len(products) == (36 * workers_n if native and transforms[0] == "jit" else 0)
    assert_near(out, reference(x, w, b, (1, 1, 1, 1), "relu"))


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("channels, size, algo, activation", [
    (32, 28, "winograd4", "relu"), (24, 30, "winograd4", ""), (32, 7, "winograd2", "relu"),
    (40, 13, "winograd2", "relu6")])
def test_a_residual_add_after_a_winograd_conv_runs_in_its_output_transform(num_threads, channels, size, algo,
                                                                           activation):
    """A ResNet block's end: a 3x3 conv that the rule runs as Winograd (F(4x4) on planes of 7
    and 8 tile columns, one cropped; F(2x2) at 7x7 and 13x13), then add(its output, the
    block's input) with an activation: at 1 and 2 threads (output channels apart) F(4x4)'s
    plan binds the add into the conv's step, whose output transform (native_winograd's)
    adds the residual as it stores; F(2x2)'s (jit.py's loop) binds them apart. Bit for bit
    the conv and the add run apart (the conv's output a signature output too: nothing
    fuses), and the float64 reference's values within float32 rounding."""
    from edgeflow.graph.math_ops import apply
    assert jit.available()
    assert winograd.rule((1, channels, size, size), (channels, channels, 3, 3), (size, size)) == algo
    rng = np.random.default_rng(size)
    x = rng.standard_normal((1, channels, size, size)).astype(np.float32)
    w = (rng.standard_normal((channels, channels, 3, 3)) * 0.2).astype(np.float32)
    b = rng.standard_normal(channels).astype(np.float32)

    def build(apart):
        def outputs(t):
            y = apply("conv", [t, w, b], {"pads": (1, 1, 1, 1)})
            z = apply("add", [y, t], {"activation": activation})
            return {"z": z, **({"y": y} if apart else {})}
        return outputs
    fused, ran = run_graph(build(False), x, profile=True, num_threads=num_threads)
    apart, ran_apart = run_graph(build(True), x, profile=True, num_threads=num_threads)
    fuses = algo == "winograd4" and native_gemm.available()
    assert ran == (["conv"] if fuses else ["add", "conv"]) and ran_apart == ["add", "conv"], (ran, ran_apart)
    np.testing.assert_array_equal(fused["z"], apart["z"])
    want = reference(x, w, b, (1, 1, 1, 1)) + x
    assert_near(fused["z"], {"": want, "relu": np.maximum(want, 0), "relu6": np.clip(want, 0, 6)}[activation])


@pytest.mark.parametrize("m, shape", [(4, (170, 160)), (2, (250, 240)), (4, (5, 3))])
@pytest.mark.parametrize("split", [False, True])
def test_transformed_weights_match_numpy(m, shape, split):
    """U = G g G^T (split over 2 workers where the product is large enough: the first two
    shapes) against a float64 einsum, in the layout the products take: each U[k] an (M, C)
    matrix with unit column stride."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal(shape + (3, 3)).astype(np.float32)
    g = winograd.TRANSFORMS[m][1]
    want = np.einsum("ik,mckl,jl->ijmc", g, w.astype(np.float64), g).reshape((m + 2) ** 2, *shape)
    workers = threads.Workers(2) if split else None
    try:
        got = winograd.weights_buffer(np.empty((shape[0], (m + 2) ** 2, shape[1]), np.float32))
        parts = winograd._parts(workers, (m + 2) ** 2 * 9 * shape[0] * shape[1])  # the variable path's split
        winograd._run(winograd._weight_steps(w, got, m, parts), workers)
    finally:
        if workers is not None:
            workers.close()
    assert got.dtype == np.float32 and got.shape == want.shape and got.strides[2] == 4
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("m, shape", [(4, (170, 160)), (2, (250, 240)), (4, (5, 3)), (2, (13, 7)), (4, (8, 1))])
@pytest.mark.parametrize("split", [False, True])
def test_packed_weights_match_numpy(m, shape, split):
    """packed_weights, made without U (split over 2 workers where the product is large
    enough): for each position, native_gemm's panels of U[k] from a float64 einsum
    (MR rows each, k-major, the rows past M zero, on 64-byte boundaries), and a zero bias
    as long as the panels' rows."""
    rng = np.random.default_rng(9)
    w = rng.standard_normal(shape + (3, 3)).astype(np.float32)
    g = winograd.TRANSFORMS[m][1]
    u = np.einsum("ik,mckl,jl->ijmc", g, w.astype(np.float64), g).reshape((m + 2) ** 2, *shape)
    mm, c = shape
    rows = -(-mm // native_gemm.VEC) * native_gemm.VEC
    workers = threads.Workers(2) if split else None
    try:
        with threads.using(workers):
            packs = winograd.packed_weights(w, m)
    finally:
        if workers is not None:
            workers.close()
    assert len(packs) == (m + 2) ** 2
    for k, (panels, bias) in enumerate(packs):
        padded = np.zeros((rows, c))
        padded[:mm] = u[k]
        want = padded.reshape(-1, native_gemm.MR, c).transpose(0, 2, 1).reshape(-1)
        assert panels.dtype == np.float32 and panels.ctypes.data % 64 == 0
        np.testing.assert_allclose(panels, want, rtol=1e-5, atol=1e-5)
        assert bias.shape == (rows,) and not bias.any()


def _padded_conv_model(shape, w):
    """The bytes of a model y = conv(x, w) (w a constant, pads 1) of x's `shape`."""
    import edgeflow as ef
    from edgeflow.format import writer
    from edgeflow.graph.math_ops import apply
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, shape, name="x")
        y = apply("conv", [t, w], {"pads": (1, 1, 1, 1)})
    return writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})}))


@pytest.mark.parametrize("numba_loaded", [True, False])
def test_plans_of_one_model_share_its_transformed_weights(numba_loaded, monkeypatch):
    """An interpreter's plans for two batch sizes bind a Winograd conv to one transformed
    copy of its constant weights (U, or U packed for native_gemm's products where they run:
    a plan made before numba loads takes U), freed with the model (their background thread's
    steps, which hold w, let go once made); the outputs are the reference's."""
    import gc

    import edgeflow as ef
    if not numba_loaded:
        monkeypatch.setattr(jit, "loaded", lambda: False)
    rng = np.random.default_rng(8)
    w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    it = ef.Interpreter(_padded_conv_model((None, 32, 16, 16), w), num_threads=1)
    runner = it.get_signature_runner("infer")
    gc.collect()

    def copies():
        return len(winograd._TRANSFORMED) + len(winograd._PACKED)
    before = copies()
    made = []
    with mock.patch.dict(os.environ, {winograd.ENV: "winograd4"}):
        for batch in (1, 3, 1):
            x = rng.standard_normal((batch, 32, 16, 16)).astype(np.float32)
            assert_near(runner(x=x)["y"], reference(x, w, None, (1, 1, 1, 1), ""))
            made.append(copies() - before)
    assert made[-1] == made[-2] and 1 <= made[-1] <= 2  # each form once: the plans share it
    del it, runner
    gc.collect()
    assert copies() == before


def test_a_plan_of_the_packs_lets_a_first_plans_weights_go(monkeypatch):
    """U made for a plan bound before numba loaded is dropped from the cache once a plan
    packs the same weights for native_gemm's products (where they run): it goes with the
    first plan; both plans give the reference's result."""
    rng = np.random.default_rng(12)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    w.flags.writeable = False
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    with monkeypatch.context() as first:
        first.setattr(jit, "loaded", lambda: False)
        step, out = conv(x, w, None, (1, 1, 1, 1), algo="winograd4")
    assert (id(w), 4) in winograd._TRANSFORMED
    step()
    assert_near(out, reference(x, w, None, (1, 1, 1, 1)))
    assert jit.available()  # the jit extra is installed with the tests
    again, out2 = conv(x, w, None, (1, 1, 1, 1), algo="winograd4")
    again()
    assert_near(out2, reference(x, w, None, (1, 1, 1, 1)))
    assert ((id(w), 4) in winograd._TRANSFORMED) != native_gemm.available()


class _HeldExecutor:
    """winograd's background thread stood in for: what it is given waits until `release`;
    the first `started` jobs count as started (being made: their futures running, so that
    no caller can take them), the rest as queued."""

    def __init__(self, fail=False, started=1):
        self.held, self.fail, self.started = [], fail, started

    def submit(self, fn, *args):
        import concurrent.futures
        future = concurrent.futures.Future()
        if len(self.held) < self.started:
            assert future.set_running_or_notify_cancel()
        self.held.append((future, fn, args))
        return future

    def release(self):
        for future, fn, args in self.held:
            if future.cancelled():  # taken by a caller, which made it
                continue
            if self.fail:
                future.set_exception(MemoryError("no memory for U"))
            else:
                future.set_result(fn(*args))


@pytest.mark.parametrize("fail", [False, True])
def test_a_plan_does_not_wait_for_its_transformed_weights(monkeypatch, fail):
    """A plan binds a Winograd conv of a constant w before U is made (on winograd's
    background thread, here held back): the plan is made, and its first run waits for U
    (a run in another thread has not ended while U is held), then gives the reference's
    result; a child forked while U is held makes it on its own thread; where making U
    failed, the run raises that error, and the next run again."""
    import threading

    import edgeflow as ef
    monkeypatch.setattr(jit, "loaded", lambda: False)  # the path of a first plan, numba not loaded
    held = _HeldExecutor(fail)
    monkeypatch.setattr(winograd, "_BACKGROUND", {os.getpid(): held})
    monkeypatch.setenv(winograd.ENV, "winograd4")
    rng = np.random.default_rng(11)
    w = rng.standard_normal((8, 6, 3, 3)).astype(np.float32)
    x = rng.standard_normal((1, 6, 12, 12)).astype(np.float32)
    it = ef.Interpreter(_padded_conv_model(x.shape, w), num_threads=1)
    it.allocate_tensors()
    assert len(held.held) == 1 and not held.held[0][0].done()
    runner = it.get_signature_runner("infer")
    if not fail:  # a child forked meanwhile has no background thread: it makes U itself
        import multiprocessing
        fork = multiprocessing.get_context("fork")
        ours, theirs = fork.Pipe()
        child = fork.Process(target=lambda: theirs.send(runner(x=x)["y"]))
        child.start()
        assert ours.poll(30), "the forked child did not answer"
        assert_near(ours.recv(), reference(x, w, None, (1, 1, 1, 1)))
        child.join(10)
        assert not held.held[0][0].done()
    results = []
    thread = threading.Thread(target=lambda: results.append(_outcome(lambda: runner(x=x)["y"])))
    thread.start()
    thread.join(0.3)
    assert thread.is_alive() and not results  # waiting for U
    held.release()
    thread.join(10)
    if fail:
        assert isinstance(results[0], MemoryError) and "no memory for U" in str(results[0])
        with pytest.raises(MemoryError):
            runner(x=x)
    else:
        assert_near(results[0], reference(x, w, None, (1, 1, 1, 1)))
        assert_near(runner(x=x)["y"], reference(x, w, None, (1, 1, 1, 1)))


def _two_conv_model(shape, w1, w2):
    """The bytes of a model y = conv(relu(conv(x, w1)), w2) (pads 1, w1 and w2 constants)."""
    import edgeflow as ef
    from edgeflow.format import writer
    from edgeflow.graph.math_ops import apply
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, shape, name="x")
        h = ef.nn.relu(apply("conv", [t, w1], {"pads": (1, 1, 1, 1)}))
        y = apply("conv", [h, w2], {"pads": (1, 1, 1, 1)})
    return writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, {"y": y})}))


def test_a_run_waiting_for_its_weights_makes_those_not_started():
    """Two convs' U queued on the background thread, the first started (being made, held
    back here), the second not: the first run waits for the first conv's U and meanwhile
    makes the second's itself (the thread's job for it cancelled, so that it is not made
    twice); once the first U is there, the result is the reference's."""
    import threading

    import edgeflow as ef
    held = _HeldExecutor(started=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jit, "loaded", lambda: False)  # the path of a first plan, numba not loaded
        mp.setattr(winograd, "_BACKGROUND", {os.getpid(): held})
        mp.setattr(winograd, "_QUEUED", {})
        mp.setenv(winograd.ENV, "winograd2")
        rng = np.random.default_rng(13)
        w1 = rng.standard_normal((8, 6, 3, 3)).astype(np.float32)
        w2 = rng.standard_normal((5, 8, 3, 3)).astype(np.float32)
        x = rng.standard_normal((1, 6, 10, 10)).astype(np.float32)
        it = ef.Interpreter(_two_conv_model(x.shape, w1, w2), num_threads=1)
        it.allocate_tensors()
        assert len(held.held) == 2 and not any(f.done() for f, _, _ in held.held)
        runner = it.get_signature_runner("infer")
        results = []
        thread = threading.Thread(target=lambda: results.append(_outcome(lambda: runner(x=x)["y"])), daemon=True)
        thread.start()
        try:
            thread.join(0.5)
            assert thread.is_alive() and not results  # waiting for the first conv's U
            assert held.held[1][0].cancelled() and not held.held[0][0].done()  # the second's made here
        finally:
            held.release()
            thread.join(10)
    h = np.maximum(reference(x, w1, None, (1, 1, 1, 1)), 0)
    assert_near(results[0], reference(h, w2, None, (1, 1, 1, 1)))


def test_weights_taken_from_the_thread_and_failing_raise_their_error(monkeypatch):
    """A U not started by the background thread, made by its waiting caller, whose making
    fails: result() raises that error (and again on the next call), and the thread's job
    for it is cancelled."""
    import concurrent.futures

    def fail(steps, workers):
        raise MemoryError("no memory for U")
    monkeypatch.setattr(winograd, "_run", fail)
    monkeypatch.setattr(winograd, "_QUEUED", {})
    future = concurrent.futures.Future()
    made = winograd._Made(future, [lambda: None], os.getpid())
    for _ in range(2):
        with pytest.raises(MemoryError, match="no memory for U"):
            made.result()
    assert future.cancelled()


def _outcome(call):
    try:
        return call()
    except Exception as e:  # noqa: BLE001: the test looks at it
        return e


def test_steps_sharing_the_workspace():
    """Two Winograd convs bound as steps of one plan draw their scratch from the same
    workspace bytes; run alternately on new inputs, each stays right."""
    from edgeflow.interp.arena import Workspace
    rng = np.random.default_rng(6)
    workspace = Workspace()
    layers, blocks = [], None
    for algo, (n, c, h, wd, m) in (("winograd4", (2, 20, 17, 15, 24)), ("winograd2", (1, 24, 9, 11, 18))):
        x = np.zeros((n, c, h, wd), np.float32)
        w = rng.standard_normal((m, c, 3, 3)).astype(np.float32)
        w.setflags(write=False)
        b = rng.standard_normal(m).astype(np.float32)
        with workspace.step():
            step, out = conv(x, w, b, (1, 1, 1, 1), "relu", algo)
        layers.append((x, w, b, step, out))
        blocks = blocks if layers[1:] else len(workspace.blocks)
    assert len(workspace.blocks) == blocks  # the second step reuses the first's bytes
    for _ in range(2):
        for x, w, b, step, out in layers:
            x[...] = rng.standard_normal(x.shape)
            step()
        for x, w, b, step, out in layers:
            assert_near(out, reference(x, w, b, (1, 1, 1, 1), "relu"))


def input_grad_reference(dy, w, pads, x_shape):
    """float64 gradient of conv(x, w) (3x3, stride 1, pads) w.r.t. x for the output's dy:
    each tap's weights times dy added into the padded input's window it read."""
    top, left, bottom, right = pads
    dx = np.zeros((x_shape[0], x_shape[1], x_shape[2] + top + bottom, x_shape[3] + left + right))
    oh, ow = dy.shape[2:]
    for i in range(3):
        for j in range(3):
            dx[:, :, i:i + oh, j:j + ow] += np.einsum("nmhw,mc->nchw", dy.astype(np.float64), w[:, :, i, j])
    return dx[:, :, top:top + x_shape[2], left:left + x_shape[3]]


@pytest.mark.parametrize("algo", ["winograd2", "winograd4"])
@settings(max_examples=12)
@given(problem=problems())
def test_input_gradient_as_a_winograd_conv(algo, problem, transforms):
    """A train step's input gradient of a 3x3 stride-1 conv runs as a conv of dy with the
    flipped, channel-swapped weights (a variable: copied every run) on the Winograd path,
    against a float64 reference and the im2col path (forced direct)."""
    n, c, m, h, wd, pads, _, _, _, seed = problem
    assume(not c == m == 1)  # one channel in and out: a depthwise conv, jit's own loop
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, c, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((n, m, h + pads[0] + pads[2] - 2, wd + pads[1] + pads[3] - 2)).astype(np.float32)
    attrs = {name: a.default for name, a in ops.get("conv_input_grad").attrs.items()}
    attrs.update(pads=tuple(pads))
    like = np.zeros((n, c, h, wd), np.float32)
    bound = []
    original = winograd.conv

    def grad(forced):
        out = np.full(like.shape, np.nan, np.float32)
        with mock.patch.dict(os.environ, {winograd.ENV: forced}), \
                mock.patch.object(winograd, "conv", lambda *args: bound.append(args[-1]) or original(*args)):
            return KERNELS["conv_input_grad"]([dy, w, like], [out], attrs), out
    step, out = grad(algo)
    step()
    assert bound == [algo]
    assert_near(out, input_grad_reference(dy, w, pads, like.shape))
    direct_step, direct = grad("direct")
    direct_step()
    assert bound == [algo]
    assert_near(out, direct.astype(np.float64))
    w *= -0.5  # the variable changed between runs: the next run flips its new value
    step()
    assert_near(out, input_grad_reference(dy, w, pads, like.shape))


def filter_grad_reference(x, dy, pads):
    """float64 gradient of conv(x, w) (3x3, stride 1, pads) w.r.t. w for the output's dy."""
    top, left, bottom, right = pads
    p = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    windows = np.lib.stride_tricks.sliding_window_view(p, (3, 3), axis=(2, 3))  # (N, C, OH, OW, 3, 3)
    return np.einsum("nchwij,nmhw->mcij", windows, dy.astype(np.float64))


def filter_grad(x, dy, c_out, pads, forced, workers=None):
    """The conv_filter_grad kernel bound with EDGEFLOW_CONV_ALGO=forced (and `workers`), its
    step and output; the winograd.filter_grad calls made, by algorithm."""
    attrs = {name: a.default for name, a in ops.get("conv_filter_grad").attrs.items()}
    attrs.update(pads=tuple(pads))
    like = np.zeros((c_out, x.shape[1], 3, 3), x.dtype)
    out, bound = np.full(like.shape, np.nan, x.dtype), []
    original = winograd.filter_grad
    with mock.patch.dict(os.environ, {winograd.ENV: forced}), threads.using(workers), \
            mock.patch.object(winograd, "filter_grad", lambda *args: bound.append(args[-1]) or original(*args)):
        return KERNELS["conv_filter_grad"]([x, dy, like], [out], attrs), out, bound


@pytest.mark.parametrize("algo", ["winograd2", "winograd4"])
@settings(max_examples=12)
@given(problem=problems())
def test_filter_gradient_on_the_winograd_path(algo, problem, transforms):
    """A train step's filter gradient of a 3x3 stride-1 conv with F(m x m, 3x3)'s transforms
    run backwards (odd sizes, tiles cut by the output's edge, asymmetric pads), against a
    float64 reference and the im2col path (forced direct); a new dy, a new gradient."""
    n, c, m, h, wd, pads, _, _, _, seed = problem
    assume(not c == m == 1)  # one channel in and out: a depthwise conv, jit's own loop
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    dy = rng.standard_normal((n, m, h + pads[0] + pads[2] - 2, wd + pads[1] + pads[3] - 2)).astype(np.float32)
    transforms[1].clear()
    step, out, bound = filter_grad(x, dy, m, pads, algo)
    step()
    assert bound == [algo]
    check_transforms(transforms, input_loop(algo), "winograd_gradient_loop")
    assert_near(out, filter_grad_reference(x, dy, pads))
    direct_step, direct, none = filter_grad(x, dy, m, pads, "direct")
    direct_step()
    assert none == []
    assert_near(out, direct.astype(np.float64))
    dy *= -0.5
    step()
    assert_near(out, filter_grad_reference(x, dy, pads))


@pytest.mark.parametrize("algo", ["winograd2", "winograd4"])
def test_filter_gradient_float64_and_split_over_workers(algo, transforms):
    """float64 to float64's precision; with 3 workers (each phase split: x's channels, dy's
    channels, the products) the same gradient as one thread."""
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal((2, 24, 13, 10)), rng.standard_normal((2, 20, 13, 10))
    step, out, _ = filter_grad(x, dy, 20, (1, 1, 1, 1), algo)
    step()
    np.testing.assert_allclose(out, filter_grad_reference(x, dy, (1, 1, 1, 1)), rtol=1e-10, atol=1e-10)
    workers = threads.Workers(3)
    try:
        with mock.patch.object(threads, "MIN_FLOPS", 1):
            split_step, split, _ = filter_grad(x.astype(np.float32), dy.astype(np.float32), 20, (1, 1, 1, 1), algo,
                                               workers)
        split_step()
    finally:
        workers.close()
    assert_near(split, filter_grad_reference(x, dy, (1, 1, 1, 1)))


@pytest.mark.parametrize("shape, algo", [((8, 64, 56, 56), "winograd4"), ((8, 128, 28, 28), "winograd4"),
                                         ((8, 256, 14, 14), "winograd2"), ((8, 512, 7, 7), "direct"),
                                         ((1, 128, 28, 28), "winograd2"), ((1, 256, 14, 14), "direct"),
                                         ((8, 8, 56, 56), "direct")])
def test_filter_gradient_rule(shape, algo):
    """ResNet-18's layers: F(4x4) with 192 tiles or more, else F(2x2) with as many, else direct."""
    assert winograd.filter_grad_rule(shape, (shape[1],), shape[2:]) == algo


@pytest.mark.parametrize("shape, algo", [((8, 64, 56, 56), "winograd4"), ((8, 512, 7, 7), "winograd4"),
                                         ((1, 128, 28, 28), "winograd4"), ((1, 256, 14, 14), "direct"),
                                         ((1, 512, 7, 7), "direct")])
def test_variable_rule(shape, algo):
    """Weights transformed every run (an input gradient's, a variable's): the constant's pick,
    but direct below 64 tiles of F(2x2)."""
    assert winograd.variable_rule(shape, (shape[1],), shape[2:]) == algo


def test_a_variable_layer_takes_the_variable_rule(monkeypatch):
    """ResNet-18's 7x7 layer at batch 1: constant weights (transformed once) take F(2x2);
    a variable's (transformed every run, a train step's) the direct path."""
    bound = []
    original = winograd.conv
    monkeypatch.setattr(winograd, "conv", lambda *args: bound.append(args[5]) or original(*args))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 512, 7, 7)).astype(np.float32)
    w = (rng.standard_normal((512, 512, 3, 3)) * np.sqrt(2 / (9 * 512))).astype(np.float32)
    b = np.zeros(512, np.float32)
    step, out = conv(x, w, b, (1, 1, 1, 1))
    step()
    assert bound == []
    assert_near(out, reference(x, w, b, (1, 1, 1, 1)))
    w.setflags(write=False)
    conv(x, w, b, (1, 1, 1, 1))
    assert bound == ["winograd2"]
