"""The numba loops of edgeflow/interp/kernels/jit.py against the numpy kernels they replace
and against onnxruntime, in one process.

    .venv/bin/python benchmarks/bench_jit.py [--runs N] [--part kernels|models|all]

Measured, interleaved, on 1 thread each (edgeflow's BLAS and onnxruntime's intra-op pool):
- kernels: one-op models of each JIT'd kernel (edgeflow with EDGEFLOW_JIT=0 at prepare,
  edgeflow with the JIT, onnxruntime on the same ONNX node(s)): MobileNetV2's depthwise
  3x3 layers at 224x224 batch 1 with bias and ReLU6, a pointwise conv + bias + ReLU6
  (the bias and activation pass), a residual add + ReLU, softmax, layer norm and GELU
  along the last axis of a BERT-like encoder's tensors;
- models: tests/data/onnx/mobilenetv2.onnx (64x64) and a MobileNetV2 built here at its
  real size (224x224, torchvision's layer table, random weights, batch norm folded),
  edgeflow numpy / edgeflow JIT / onnxruntime.
Also printed: what the first bind of each loop cost (compiling, or loading numba's cache).
"""
import argparse
import os
import time

import numpy as np

import edgeflow as ef
import harness
from edgeflow.format import writer
from edgeflow.graph.math_ops import apply

RELU6 = {"activation": "relu6"}
# MobileNetV2's depthwise 3x3 layers at 224x224: (channels, input size, stride).
DEPTHWISE = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2),
             (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1)]


def jit_setting(on):
    """Sets EDGEFLOW_JIT (read when kernels bind, at the first run of a plan)."""
    os.environ["EDGEFLOW_JIT"] = "1" if on else "0"


def edgeflow_runner(model_bytes, x, jit):
    """A zero-argument callable running the model on x, its plan bound with or without the JIT."""
    interp = ef.Interpreter(model_bytes, num_threads=1)
    runner = interp.get_signature_runner("infer")
    jit_setting(jit)
    runner(x=x)
    jit_setting(True)
    return lambda: runner(x=x)


def one_op(shape, build):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, shape, name="x")
        y = build(x)
    return writer.to_bytes(ef.to_model(g, {"infer": ({"x": x}, {"y": y})}))


def onnx_bytes(nodes, shape, inits, opset=17, out_shape=None):
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def kernel_cases(rng):
    """{name: (x, edgeflow model, onnx model)}."""
    from onnx import helper
    cases = {}
    clip = {"lo": np.float32(0), "hi": np.float32(6)}
    for c, size, stride in DEPTHWISE:
        shape = (1, c, size, size)
        w = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
        b = rng.standard_normal(c).astype(np.float32)
        attrs = {"pads": (1, 1, 1, 1), "strides": (stride, stride), "group": c}
        cases[f"dw3x3 {c} {size}x{size} s{stride}"] = (
            shape, one_op(shape, lambda t: apply("conv", [t, w, b], {**attrs, **RELU6})),
            onnx_bytes([helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
                        helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], shape, {"w": w, "b": b, **clip}))
    shape = (1, 96, 56, 56)
    w = rng.standard_normal((24, 96, 1, 1)).astype(np.float32) / 10
    b = rng.standard_normal(24).astype(np.float32)
    cases["1x1 96->24 56x56 +bias+relu6"] = (
        shape, one_op(shape, lambda t: apply("conv", [t, w, b], RELU6)),
        onnx_bytes([helper.make_node("Conv", ["x", "w", "b"], ["c"]),
                    helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], shape, {"w": w, "b": b, **clip}))
    shape = (1, 64, 56, 56)
    r = rng.standard_normal(shape).astype(np.float32)
    cases["add+relu 64x56x56"] = (
        shape, one_op(shape, lambda t: apply("add", [t, r], {"activation": "relu"})),
        onnx_bytes([helper.make_node("Add", ["x", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                   shape, {"r": r}))
    shape = (1, 4, 128, 128)
    cases["softmax 4x128x128"] = (shape, one_op(shape, lambda t: apply("softmax", [t], {"axis": -1})),
                                  onnx_bytes([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], shape, {}))
    shape, scale, bias = (1, 128, 256), rng.standard_normal(256).astype(np.float32), \
        rng.standard_normal(256).astype(np.float32)
    cases["layer_norm 128x256"] = (
        shape, one_op(shape, lambda t: apply("layer_norm", [t, scale, bias], {"axis": -1, "epsilon": 1e-5})),
        onnx_bytes([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1)], shape,
                   {"s": scale, "b": bias}))
    shape = (1, 128, 1024)
    cases["gelu 128x1024"] = (shape, one_op(shape, lambda t: apply("gelu", [t], {})),
                              onnx_bytes([helper.make_node("Gelu", ["x"], ["y"])], shape, {}, opset=20))
    return cases


def _make_divisible(v, divisor=8):
    return max(divisor, int(v + divisor / 2) // divisor * divisor)


def mobilenetv2_224(rng, size=224):
    """MobileNetV2 (torchvision's layer table, width 1.0) as ONNX bytes: Conv with bias (batch
    norm folded), Clip(0, 6), residual Add, GlobalAveragePool, Gemm; random weights."""
    from onnx import helper
    nodes, inits, count = [], {"lo": np.float32(0), "hi": np.float32(6)}, [0]

    def conv(x, cin, cout, k, stride, group=1, act=True):
        i = count[0] = count[0] + 1
        w = (rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2 / (cin // group * k * k))).astype(np.float32)
        inits[f"w{i}"], inits[f"b{i}"] = w, (rng.standard_normal(cout) * 0.1).astype(np.float32)
        p = k // 2
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], group=group,
                                      strides=[stride, stride], pads=[p, p, p, p], kernel_shape=[k, k]))
        if not act:
            return f"c{i}"
        nodes.append(helper.make_node("Clip", [f"c{i}", "lo", "hi"], [f"a{i}"]))
        return f"a{i}"

    x, cin = conv("x", 3, 32, 3, 2), 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        for i in range(n):
            stride, hidden = s if i == 0 else 1, cin * t
            h = conv(x, cin, hidden, 1, 1) if t != 1 else x
            h = conv(h, hidden, hidden, 3, stride, group=hidden)
            h = conv(h, hidden, c, 1, 1, act=False)
            if stride == 1 and cin == c:
                nodes.append(helper.make_node("Add", [x, h], [f"r{count[0]}"]))
                h = f"r{count[0]}"
            x, cin = h, c
    x = conv(x, cin, 1280, 1, 1)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"]))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["flat"]))
    inits["fc_w"] = (rng.standard_normal((1000, 1280)) * 0.03).astype(np.float32)
    inits["fc_b"] = np.zeros(1000, np.float32)
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], transB=1))
    return onnx_bytes(nodes, (1, 3, size, size), inits, out_shape=(1, 1000))


def compare(contenders, runs):
    t = harness.medians(contenders, runs, warmup=2)
    return [harness.ms(t["numpy"], 3), harness.ms(t["jit"], 3), harness.ms(t["ort"], 3),
            harness.ratio(t["jit"], t["numpy"]), harness.ratio(t["numpy"], t["ort"]), harness.ratio(t["jit"], t["ort"])]


COLUMNS = ["numpy ms", "jit ms", "ort ms", "jit/numpy", "numpy/ort", "jit/ort"]


def bench_kernels(runs, rng):
    rows = []
    for name, (shape, model, peer) in kernel_cases(rng).items():
        x = rng.standard_normal(shape).astype(np.float32)
        sess = harness.ort_session(peer, threads=1)
        rows.append([name] + compare({"numpy": edgeflow_runner(model, x, False), "jit": edgeflow_runner(model, x, True),
                                      "ort": lambda: sess.run(None, {"x": x})}, runs))
    harness.print_table(["kernel (1 thread)"] + COLUMNS, rows)


def bench_models(runs, rng, folder):
    from edgeflow.converters import onnx as onnx_converter
    rows = []
    models = {"mobilenetv2.onnx (64x64)": (harness.ONNX_DIR / "mobilenetv2.onnx").read_bytes(),
              "MobileNetV2 224x224": mobilenetv2_224(rng)}
    for name, peer in models.items():
        src, efl = folder / "model.onnx", folder / "model.efl"
        src.write_bytes(peer)
        onnx_converter.convert(src, efl)
        sess = harness.ort_session(peer, threads=1)
        (inp,) = sess.get_inputs()
        x = rng.standard_normal([d if isinstance(d, int) else 1 for d in inp.shape]).astype(np.float32)
        model = efl.read_bytes()
        runners = {}
        for jit in (False, True):
            interp = ef.Interpreter(model, num_threads=1)
            runner = interp.get_signature_runner("infer")
            (key,) = runner.get_input_details()
            jit_setting(jit)
            start = time.perf_counter()
            runner(**{key: x})
            first = time.perf_counter() - start
            jit_setting(True)
            runners["jit" if jit else "numpy"] = (lambda runner=runner, key=key: runner(**{key: x}))
            harness.log(f"{name}: first run ({'JIT' if jit else 'numpy'}) {first * 1e3:.0f} ms")
        runners["ort"] = lambda: sess.run(None, {inp.name: x})
        rows.append([name] + compare(runners, runs))
    harness.print_table(["model (batch 1, 1 thread)"] + COLUMNS, rows)


def bind_costs():
    """Seconds to bind (compile or load from cache) each loop the first time in this process."""
    from edgeflow.interp.kernels import jit
    return dict(jit.BIND_SECONDS)


def main():
    import tempfile
    import pathlib
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each contender (default 30)")
    parser.add_argument("--part", choices=("kernels", "models", "all"), default="all")
    args = parser.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    rng = np.random.default_rng(0)
    print(f"medians of {args.runs} interleaved runs, 1 thread each; numpy = edgeflow with EDGEFLOW_JIT=0\n")
    if args.part in ("kernels", "all"):
        bench_kernels(args.runs, rng)
        print()
    if args.part in ("models", "all"):
        with tempfile.TemporaryDirectory() as folder:
            bench_models(args.runs, rng, pathlib.Path(folder))
        print()
    print("first bind of each loop in this process (compile, or load from numba's cache), seconds:",
          {k: round(v, 3) for k, v in bind_costs().items()})


if __name__ == "__main__":
    main()
