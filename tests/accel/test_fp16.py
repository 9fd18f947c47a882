"""fp16 mode of the OpenCL delegate (half storage, float math): every kernel against the
numpy kernel on the same inputs rounded to half, within a few half ULPs of the magnitudes
involved; the converted models against float32 numpy; device buffers really half; a
digits CNN trained in fp16 against the float32 run."""
import contextlib
import pathlib
import subprocess
import sys
from dataclasses import dataclass, field
from unittest import mock

import numpy as np
import pytest

import edgeflow as ef
import edgeflow.accel
from edgeflow.format.writer import to_bytes

from .harness import one_op_model, randn, run_both, run_numpy

from edgeflow.accel.kernels import CL_KERNELS, conv as conv_kernels, gemm

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "onnx"
HALF_EPS = 2.0 ** -10  # fp16's machine epsilon: a store rounds by at most HALF_EPS / 2 relative
TINY = 2.0 ** -24  # the smallest half (subnormal): the absolute rounding error near 0
VIEWS = ("reshape", "squeeze", "expand_dims")
MODEL_RTOL = 5e-3  # whole models vs float32 numpy, relative to the largest output; measured <= 9.4e-4


@pytest.fixture(scope="module")
def delegate():
    return edgeflow.accel.OpenCLDelegate(precision="fp16")


def to_half(a):
    """Float arrays rounded to the nearest half (so the upload is exact); others as they are."""
    return a.astype(np.float16).astype(np.float32) if a.dtype == np.float32 else a


def half_ulps(got, want, magnitude):
    """The largest |got - want| in units of HALF_EPS * magnitude (+ TINY); NaNs must match."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(want)), "NaNs differ"
    ok = ~np.isnan(want)
    scale = HALF_EPS * np.broadcast_to(magnitude, want.shape)[ok] + TINY
    err = np.abs(got[ok] - want[ok])
    return float((err / scale).max()) if err.size else 0.0


# -- the kernels: a table of cases per op ---------------------------------------------------

@dataclass
class Case:
    """op on `arrays` (rounded to half first). `magnitude`: what the error is measured
    against: "value" (|result|: one rounding of a float32 result), "abs" (the op on |inputs|,
    no activation: sums, whose terms may cancel), "exact" (bit-equal: data movement,
    comparisons, integer results), or a function of (inputs, result). `ulps`: the bound in
    HALF_EPS units: storing a float32 result in half rounds it by at most 0.5 of them (the
    measured maximum, every case), and float32 sums in another order move the result a
    little more. `patch`: module attributes set while it runs (the kernel variant)."""
    op: str
    arrays: list
    attrs: dict = field(default_factory=dict)
    magnitude: object = "value"
    ulps: float = 1
    patch: dict = field(default_factory=dict)
    name: str = ""

    @property
    def id(self):
        return f"{self.op}-{self.name}" if self.name else self.op


def _cases():
    rng = np.random.default_rng(7)

    def r(*shape):
        return randn(rng, shape)

    def positive(*shape):
        return rng.uniform(0.25, 4, shape).astype(np.float32)

    gpu, cpu = {(gemm, "CPU_PATH"): False}, {(gemm, "CPU_PATH"): True}
    cases = []
    # elementwise: one rounding of a float32 result
    for op in ("add", "sub", "mul", "maximum", "minimum"):
        cases += [Case(op, [r(3, 37), r(37)], name="broadcast"), Case(op, [r(5, 33), r(5, 33)], name="same")]
    cases += [Case("add", [r(2, 1, 19), r(3, 19)], {"activation": "relu6"}, name="relu6"),
              Case("div", [r(4, 29), positive(29) * np.sign(r(29))]),
              Case("pow", [positive(6, 17), rng.uniform(-2, 2, 17).astype(np.float32)])]
    for op, x in (("neg", r(101)), ("abs", r(101)), ("exp", rng.uniform(-8, 8, 101).astype(np.float32)),
                  ("log", positive(101)), ("sqrt", positive(101)), ("relu", r(101)), ("sigmoid", 4 * r(101)),
                  ("tanh", 2 * r(101))):
        cases.append(Case(op, [x]))
    cases.append(Case("swish", [4 * r(101)], {"alpha": 1.0}))
    cases.append(Case("prelu", [r(3, 8, 5), rng.uniform(-1, 1, (8, 1)).astype(np.float32)]))
    # matmul: both kernels, sizes that divide no tile, transposes, batch broadcasting
    for path, patch in (("blocked", cpu), ("tiled", gpu)):
        cases += [
            Case("matmul", [r(37, 53), r(53, 29)], {"activation": "relu"}, "abs", patch=patch, name=path),
            Case("matmul", [r(53, 37), r(29, 53)], {"transpose_a": True, "transpose_b": True}, "abs",
                 patch=patch, name=f"{path}-transposed"),
            Case("matmul", [r(54, 17), r(54, 24)], {"transpose_a": True}, "abs", patch=patch, name=f"{path}-ta"),
            Case("matmul", [r(16, 31), r(40, 31)], {"transpose_b": True}, "abs", patch=patch, name=f"{path}-tb"),
            Case("matmul", [r(2, 1, 9, 70), r(3, 70, 13)], {}, "abs", patch=patch, name=f"{path}-batched"),
            Case("matmul", [r(16, 3), r(3, 24)], {}, "abs", patch=patch, name=f"{path}-short-k"),
            Case("matmul", [r(33), r(33, 7)], {"activation": "relu6"}, "abs", patch=patch, name=f"{path}-rank1"),
        ]
    # conv: the direct, depthwise, local-memory pointwise and im2col + GEMM kernels
    conv_attrs = {"strides": (2, 1), "dilations": (1, 2), "pads": (1, 2, 0, 1), "group": 2, "activation": "relu"}
    cases += [
        Case("conv", [r(2, 4, 13, 11), r(6, 2, 3, 3), r(6)], conv_attrs, "abs", patch=cpu, name="im2col-gemm"),
        Case("conv", [r(2, 4, 13, 11), r(6, 2, 3, 3), r(6)], conv_attrs, "abs", patch=gpu, name="direct"),
        Case("conv", [r(1, 5, 9, 7), r(10, 1, 3, 3), r(10)], {"group": 5, "pads": (1, 1, 1, 1),
                                                               "activation": "relu6"}, "abs", patch=gpu,
             name="depthwise"),
        Case("conv", [r(2, 5, 9, 7), r(10, 1, 3, 3), r(10)], {"group": 5, "pads": (1, 0, 1, 2), "strides": (2, 1),
                                                               "activation": "relu6"}, "abs", patch=cpu,
             name="depthwise-fixed"),
        Case("conv", [r(2, 19, 5, 7), r(37, 19, 1, 1), r(37)], {}, "abs",
             patch={**gpu, (conv_kernels, "LOCAL_TILING"): True}, name="pointwise-tiled"),
        Case("conv", [r(2, 19, 5, 7), r(37, 19, 1, 1)], {}, "abs", patch=cpu, name="pointwise-gemm"),
        Case("conv", [r(2, 3, 23), r(5, 3, 4)], {"strides": (2,), "pads": (1, 2)}, "abs", patch=gpu, name="1d"),
    ]
    pool = {"kernel_shape": (3, 2), "strides": (2, 2), "pads": (1, 0, 1, 1), "ceil_mode": True}
    for path, patch in (("fixed", cpu), ("direct", gpu)):
        cases += [Case("max_pool", [r(2, 3, 11, 9)], {**pool, "dilations": (1, 2)}, patch=patch, name=path),
                  Case("avg_pool", [r(2, 3, 11, 9)], {**pool, "count_include_pad": True}, "abs", patch=patch,
                       name=path)]
    scale, bias, mean = r(5), r(5), r(5)
    var = positive(5)
    cases.append(Case("batch_norm", [r(2, 5, 7, 3), scale, bias, mean, var], {"epsilon": 1e-5},
                      lambda ins, want: np.abs(want - ins[2].reshape(5, 1, 1))
                      + np.abs(ins[2].reshape(5, 1, 1))))
    cases += [Case("pad", [r(3, 5, 4)], {"pads": (1, 0, 2, 0, 3, 1), "mode": mode, "value": 1.5}, "exact",
                   name=mode) for mode in ("constant", "reflect", "edge")]
    # rows: softmax, layer_norm, reductions
    x = 3 * r(6, 37) + 20
    cases += [Case("softmax", [x], {"axis": -1}),
              Case("softmax", [x.reshape(3, 2, 37)], {"axis": 1}, name="middle-axis"),
              # log_softmax subtracts the max and log(sum): measured against those terms
              Case("log_softmax", [x], {"axis": -1},
                   lambda ins, want: np.abs(want) + np.abs(ins[0] - ins[0].max(-1, keepdims=True)))]
    ln_x, ln_scale, ln_bias = 2 * r(4, 3, 45) + 1, r(45), r(45)
    cases += [Case("layer_norm", [ln_x, ln_scale, ln_bias], {"axis": -1, "epsilon": 1e-5},
                   lambda ins, want: np.abs(want - ins[2]) + np.abs(ins[2])),
              Case("layer_norm", [ln_x, r(3, 1)], {"axis": 1, "epsilon": 1e-5}, name="two-axes")]
    for op in ("reduce_sum", "reduce_mean"):
        cases += [Case(op, [r(5, 300, 3)], {"axes": (1,), "keepdims": False}, "abs"),
                  Case(op, [r(4, 17, 6)], {"axes": (0, 2), "keepdims": True}, "abs", name="two-axes")]
    cases.append(Case("reduce_max", [r(5, 300, 3)], {"axes": (-2,), "keepdims": True}))
    # data movement: the halves themselves, bit for bit
    cases += [Case("transpose", [r(3, 4, 5, 2)], {"perm": (2, 0, 3, 1)}, "exact"),
              Case("slice", [r(7, 9)], {"starts": (1, -2), "ends": (6, 0), "axes": (0, 1), "steps": (2, -3)},
                   "exact"),
              Case("concat", [r(2, 3, 5), r(2, 1, 5), r(2, 4, 5)], {"axis": 1}, "exact"),
              Case("gather", [r(6, 7), np.array([[5, -1], [0, 2]], np.int64)], {"axis": 0}, "exact"),
              Case("gather", [r(3, 6, 4), np.array([1, 5, -6], np.int32)], {"axis": 1}, "exact", name="int32"),
              Case("where", [r(4, 1) > 0, r(4, 9), r(9)], {}, "exact"),
              Case("cast", [r(41) * 100], {"dtype": np.dtype(np.int32)}, "exact", name="to-int"),
              Case("cast", [np.arange(-1000, 1000, 37, dtype=np.int32)], {"dtype": np.dtype(np.float32)}, "exact",
                   name="to-float"),
              Case("cast", [r(41) > 0], {"dtype": np.dtype(np.float32)}, "exact", name="bool-to-float"),
              Case("cast", [r(41)], {"dtype": np.dtype(np.float32)}, "exact", name="float-to-float")]
    ties = np.round(r(4, 6)).astype(np.float32)  # many equal pairs
    cases += [Case(op, [ties, np.round(r(6))], {}, "exact")
              for op in ("equal", "less", "greater", "less_equal", "greater_equal")]
    # gradients
    cases += [Case("clip_grad", [r(3, 4, 57), np.round(r(3, 4, 57) * 4)], {"min": 0.0, "max": 6.0}, "exact"),
              Case("relu_grad", [r(3, 4, 57), np.round(r(3, 4, 57))], {}, "exact"),
              Case("sum_to", [r(3, 4, 57), r(4, 1)], {}, "abs"),
              Case("slice_grad", [r(3, 3), r(7, 9)], {"starts": (1, -2), "ends": (6, 0), "axes": (0, 1),
                                                       "steps": (2, -3)}, "exact"),
              Case("gather_grad", [r(2, 5, 3), np.array([1, -1, 1, 0, 3], np.int64), r(2, 4, 3)], {"axis": 1},
                   "abs")]
    x = r(2, 3, 9, 8)
    pool_attrs = {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1), "ceil_mode": False}
    max_grad_attrs = {**pool_attrs, "dilations": (1, 1)}
    cases += [Case("max_pool_grad", [np.round(x), r(2, 3, 5, 4)], max_grad_attrs,  # the same winners, |dy|
                   lambda ins, want: np.abs(run_numpy("max_pool_grad", [ins[0], np.abs(ins[1])], max_grad_attrs))),
              Case("avg_pool_grad", [r(2, 3, 5, 4), x], {**pool_attrs, "count_include_pad": 0}, "abs")]
    grad_attrs = {"strides": (2, 1), "dilations": (1, 2), "pads": (1, 1, 0, 2), "group": 2}
    cases += [Case("conv_input_grad", [r(2, 4, 6, 8), r(4, 3, 3, 3), r(2, 6, 13, 9)], grad_attrs, "abs"),
              Case("conv_filter_grad", [r(2, 6, 13, 9), r(2, 4, 6, 8), r(4, 3, 3, 3)], grad_attrs, "abs")]
    return cases


CASES = _cases()


def magnitude_of(case, ins, want):
    if callable(case.magnitude):
        return case.magnitude(ins, want)
    if case.magnitude == "value":
        return np.abs(want)
    attrs = {k: v for k, v in case.attrs.items() if k != "activation"}
    return np.abs(run_numpy(case.op, [np.abs(a) if a.dtype == np.float32 else a for a in ins], attrs))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kernel_in_fp16(delegate, case):
    ins = [to_half(a) for a in case.arrays]
    with contextlib.ExitStack() as patches:
        for (module, name), value in case.patch.items():
            patches.enter_context(mock.patch.object(module, name, value))
        want, got, _ = run_both(delegate, case.op, ins, case.attrs)
    if case.magnitude == "exact":
        np.testing.assert_array_equal(got, want)
        return
    ulps = half_ulps(got, want, magnitude_of(case, ins, want))
    print(f"{case.id}: {ulps:.2f} x HALF_EPS")
    assert ulps <= case.ulps, f"{case.id}: off by {ulps:.2f} x HALF_EPS x magnitude (bound {case.ulps})"


def test_every_kernel_has_an_fp16_case():
    missing = set(CL_KERNELS) - set(VIEWS) - {c.op for c in CASES}
    assert not missing, f"OpenCL kernels with no case in test_fp16.CASES: {sorted(missing)}"


def test_stores_round_to_nearest_even(delegate):
    """The kernels' stores round as numpy's float16 conversion does: halfway cases to the
    even neighbour, past 65504 to inf, under the smallest subnormal to 0. The operands are
    halves (uploaded exactly); their float32 sums and products are not."""
    e = 2.0 ** -10  # the spacing of halves in [1, 2)
    cases = {"add": [(1, e / 2), (1 + e, e / 2), (-1, -e / 2), (1, e / 4), (1, 3 * e / 4), (65504, 16),
                     (65504, 15.5), (60000, 60000), (-60000, -60000), (2048, 1), (2050, 1)],
             "mul": [(2.0 ** -24, 0.5), (3 * 2.0 ** -24, 0.5), (2.0 ** -14, 0.75), (1 + e, 1 + e), (300, 300)]}
    for op, pairs in cases.items():
        a, b = (np.array(column, np.float32) for column in zip(*pairs))
        assert np.array_equal(to_half(a), a) and np.array_equal(to_half(b), b)
        _, got, _ = run_both(delegate, op, [a, b])
        exact = a + b if op == "add" else a * b
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(got, exact.astype(np.float16).astype(np.float32), err_msg=op)


def test_gather_out_of_range_is_nan_in_half(delegate):
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    want, got, _ = run_both(delegate, "gather", [x, np.array([1, 2], np.int32)], {"axis": 0})
    np.testing.assert_array_equal(got, want)
    runner = ef.Interpreter(one_op_model("gather", [x, np.array([1, 4, -1], np.int32)], {"axis": 0}),
                            delegates=[delegate]).get_signature_runner("infer")
    got = runner(x0=x, x1=np.array([1, 4, -1], np.int32))["y"]
    np.testing.assert_array_equal(got[[0, 2]], [[2, 3], [6, 7]])
    assert np.isnan(got[1]).all()


def test_device_buffers_are_half():
    """A matmul partition holds a, b and the product: 2 bytes an element in fp16, 4 in fp32."""
    a, b = np.ones((5, 7), np.float32), np.ones((7, 3), np.float32)
    model = one_op_model("matmul", [a, b])
    elements = a.size + b.size + 5 * 3
    for precision, width in (("fp16", 2), ("fp32", 4)):
        d = edgeflow.accel.OpenCLDelegate(precision=precision)
        got = ef.Interpreter(model, delegates=[d]).get_signature_runner("infer")(x0=a, x1=b)["y"]
        np.testing.assert_array_equal(got, np.full((5, 3), 7, np.float32))
        assert d.rt.allocated == width * elements, (precision, d.rt.allocated)


# -- whole models ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from edgeflow.converters import onnx as onnx_converter
    folder = tmp_path_factory.mktemp("converted")
    out = {}
    for name in ("mobilenetv2", "resnet", "transformer"):
        out[name] = folder / f"{name}.efl"
        onnx_converter.convert(str(DATA / f"{name}.onnx"), str(out[name]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenetv2", "resnet", "transformer"])
def test_converted_models_in_fp16(converted, name):
    """Within MODEL_RTOL of float32 numpy (relative to the largest output magnitude), and
    every float tensor on the device in half: half the bytes of fp32 mode for the same plan
    where all its tensors are float."""
    io = np.load(DATA / f"{name}_io.npz")
    bytes_used = {}
    for precision in ("fp32", "fp16"):
        d = edgeflow.accel.OpenCLDelegate(precision=precision)
        with_cl, plain = ef.Interpreter(converted[name], delegates=[d]), ef.Interpreter(converted[name])
        for batch in (1, 8):
            case = next(str(c) for c in io["cases"] if str(c).startswith(f"b{batch}"))
            runner = with_cl.get_signature_runner("infer")
            feed = {n: io[f"{case}.{n}"] for n in runner.get_input_details()}
            got = runner(**feed)
            want = plain.get_signature_runner("infer")(**feed)
            assert "opencl" in runner.last_plan.placement.values()
            for key, value in want.items():
                err = float(np.abs(got[key] - value).max() / np.abs(value).max())
                print(f"{name} b{batch} {precision}: max |diff| / max |want| = {err:.2e}")
                assert err <= (MODEL_RTOL if precision == "fp16" else 1e-4), (name, batch, key, err)
        bytes_used[precision] = d.rt.allocated
    print(f"{name}: device bytes fp32 {bytes_used['fp32']}, fp16 {bytes_used['fp16']}")
    if name != "transformer":  # all-float models (the transformer also holds int64 token ids)
        assert bytes_used["fp16"] * 2 == bytes_used["fp32"]
    else:
        assert bytes_used["fp16"] < 0.55 * bytes_used["fp32"]


# -- training -------------------------------------------------------------------------------

def digits_cnn(optimizer="momentum"):
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        image = ef.placeholder(ef.float32, [32, 1, 8, 8], name="image")
        label = ef.placeholder(ef.int32, [32], name="label")
        h = ef.layers.conv2d(image, 8, 3, padding="same", activation=ef.nn.relu)
        h = ef.layers.max_pool2d(h, 2, 2)
        h = ef.layers.conv2d(h, 16, 3, padding="same", activation=ef.nn.relu)
        h = ef.layers.max_pool2d(h, 2, 2)
        logits = ef.layers.dense(ef.layers.flatten(h), 10, name="logits")
        loss = ef.losses.softmax_cross_entropy(label, logits)
        opt = ef.train.Momentum(0.05, 0.9) if optimizer == "momentum" else ef.train.Adam(0.01)
        step = opt.minimize(loss)
    return to_bytes(ef.to_model(g, {"train": ({"image": image, "label": label}, {"loss": loss}, [step])}))


TRAIN_LOSS_TOL = 5e-2  # |fp16 loss - fp32 loss| at every step; measured 1.9e-2 (momentum), 3.2e-2 (Adam)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_digits_cnn_trains_in_fp16_close_to_fp32(optimizer):
    """Forward and backward on the device in half storage; the optimizer's updates on the
    CPU in float32 (Adam's squared gradients and epsilon would underflow in half), and the
    variables float32 on the host."""
    digits = np.load(DATA / "digits_test.npz")  # 397 real 8x8 digits, pixels in [0, 1]
    x, y = digits["X"], digits["y"].astype(np.int32)
    batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 384, 32)] * 4  # 4 epochs of 12 steps
    package = digits_cnn(optimizer)
    losses = {}
    for precision in ("fp32", "fp16"):  # fp32: the numpy kernels
        delegates = [edgeflow.accel.OpenCLDelegate(precision="fp16")] if precision == "fp16" else []
        runner = ef.Interpreter(package, delegates=delegates).get_signature_runner("train")
        losses[precision] = np.array([float(runner(image=xb, label=yb)["loss"]) for xb, yb in batches])
        if delegates:
            plan = runner.last_plan
            assert set(plan.fallbacks.values()) == {"an optimizer update: kept in float32 on the CPU"}
            assert sum(where == "opencl" for where in plan.placement.values()) >= 30  # forward, backward
    epochs = {p: l.reshape(4, 12).mean(1) for p, l in losses.items()}
    diff = np.abs(losses["fp16"] - losses["fp32"])
    print(f"epoch mean losses fp32 {np.round(epochs['fp32'], 3)}, fp16 {np.round(epochs['fp16'], 3)}; "
          f"max |fp16 - fp32| per step {diff.max():.2e}")
    assert np.all(np.diff(epochs["fp16"]) < 0) and epochs["fp16"][-1] < 0.6 * epochs["fp16"][0]
    assert diff.max() <= TRAIN_LOSS_TOL


# -- the command line -----------------------------------------------------------------------

def test_cli_precision_fp16(tmp_path):
    rng = np.random.default_rng(5)
    a, b = randn(rng, (6, 40)), randn(rng, (40, 9))
    model = tmp_path / "matmul.efl"
    model.write_bytes(one_op_model("matmul", [a, b]))
    for i, x in enumerate((a, b)):
        np.save(tmp_path / f"x{i}.npy", x)
    cli = [sys.executable, "-m", "edgeflow.cli", "run", str(model), "-i", f"x0={tmp_path / 'x0.npy'}",
           "-i", f"x1={tmp_path / 'x1.npy'}", "--accel", "opencl", "-o", str(tmp_path / "out")]
    r = subprocess.run(cli + ["--precision", "fp16"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "out" / "y.npy")
    ha, hb = to_half(a), to_half(b)
    assert half_ulps(got, ha @ hb, np.abs(ha) @ np.abs(hb)) <= 1  # the device got halves
    assert np.abs(got - a @ b).max() > 1e-6  # and not float32 (those would be within ~1e-6)
    r = subprocess.run(cli + ["--precision", "fp8"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "fp32" in r.stderr and "fp16" in r.stderr
