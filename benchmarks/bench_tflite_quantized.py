"""A fully int8 TFLite model against its float twin: edgeflow against LiteRT, in one process.

    .venv/bin/python benchmarks/bench_tflite_quantized.py [--runs N] [--inputs N]
                                                          [--cache DIR] [--rebuild]

No real int8 .tflite ships in a pip package, so one is built at real size: MobileNetV1
(224x224x3, alpha 1.0: a 3x3 stride-2 conv to 32, the 13 depthwise-separable blocks
64,128,128,256,256,512x6,1024,1024 with their strides, ReLU6 fused, 7x7 average pool,
FULLY_CONNECTED to 1001, SOFTMAX) with seeded He-scaled random weights, written twice with
tests/data/tflite/make_fixtures.py's ModelBuilder: float32, and fully int8 as TFLite's
converter writes it (float input -> QUANTIZE -> int8 CONV_2D/DEPTHWISE_CONV_2D with
per-channel symmetric weights and int32 biases, int8 AVERAGE_POOL_2D/RESHAPE at their
input's parameters, per-tensor int8 FULLY_CONNECTED, int8 SOFTMAX at (1/256, -128) ->
DEQUANTIZE), its activation ranges calibrated by the float model run in LiteRT with every
intermediate preserved, on a few random inputs. The two files are cached outside the
checkout (default ~/.cache/edgeflow-bench/tflite-synthetic/; --rebuild writes them again).

edgeflow runs quantized models by dequantizing once at plan time: int8 weights stay int8
in the .efl, activations compute in float32 and are rounded to their int8 grid after every
op that TFLite writes as int8. Measured, for the float model, the int8 model, and the float
model converted with `quantize="int8"` (int8 weight storage, float activations):
- sizes: the .tflite and the .efl, and the convert time (`edgeflow.converters.tflite.convert`,
  the median of three);
- latency at 1 thread: edgeflow's `infer` runner against LiteRT's interpreter
  (`ai_edge_litert.interpreter.Interpreter(num_threads=1)`, its default XNNPACK delegate
  for float and int8 alike) on the same input, the medians of interleaved runs
  of all five contenders, and their ratio (the quantize="int8" .efl against LiteRT float);
- agreement over `--inputs` random inputs: for the int8 model, edgeflow's output against
  LiteRT's in steps of the softmax's int8 grid (1/256): the largest, and the fraction of
  elements more than one step off; for float outputs, the largest |edgeflow - LiteRT| over
  the largest |LiteRT| of that input ("max rel"); and how often the top-1 class agrees. The
  yardstick row: LiteRT's own reference kernels (BUILTIN_REF) against its default ones on
  the int8 model, as far as two correct integer kernel sets drift apart over 27 layers, each
  op within a step of the other on the same input (1-step rounding differences compound);
- the share of edgeflow's int8 op time spent rounding activations to their grid (profiler).
"""
import argparse
import importlib.util
import pathlib
import tempfile
import time

import numpy as np

import edgeflow as ef
import harness

BLOCKS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
SIZE, CLASSES, SEED = 224, 1001, 2024
SOFTMAX_STEP = 1 / 256


def _fixtures():
    """tests/data/tflite/make_fixtures.py as a module (ModelBuilder and the quantizing helpers)."""
    path = harness.ROOT / "tests" / "data" / "tflite" / "make_fixtures.py"
    spec = importlib.util.spec_from_file_location("make_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mobilenet_v1(fm, ranges=None):
    """MobileNetV1 as a make_fixtures ModelBuilder: float32 when `ranges` is None, else fully
    int8 with activation parameters from `ranges` ({tensor name: (min, max)})."""
    rng = np.random.default_rng(SEED)
    m = fm.ModelBuilder(description="MobileNetV1 1.0 224, random weights (edgeflow benchmark)")
    g = m.add_subgraph("main")
    q = fm._Q(g, ranges)
    quantized = ranges is not None

    def he(fan_in, *shape):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    def conv(op, src, name, w, b, axis, shape, opts):
        if not quantized:
            wt, bt = g.const(f"{name}/weights", w), g.const(f"{name}/bias", b)
        else:  # op_version.cc: int8 per-channel CONV_2D / DEPTHWISE_CONV_2D are version 3
            wq, ws = fm._per_channel(w, axis)
            bq, bquant = fm._bias(b, q.quant_of(src)[0][0], ws)
            wt = g.const(f"{name}/weights", wq, quant=(ws.tolist(), [0] * ws.size, axis))
            bt = g.const(f"{name}/bias", bq, quant=bquant)
        return g.add_op(op, [src, wt, bt], [q.act(name, shape)], opts, version=3 if quantized else 1)

    x = g.add_tensor("input", [1, SIZE, SIZE, 3], np.float32)
    h = x
    if quantized:
        h = g.add_op("QUANTIZE", [x], [g.add_tensor("input_int8", [1, SIZE, SIZE, 3], np.int8,
                                                    quant=fm._qparams(*ranges["input"]))], version=2)
    side, channels = SIZE // 2, 32
    h = conv("CONV_2D", h, "conv0", he(27, 32, 3, 3, 3), he(1, 32) * 0.05, 0, [1, side, side, 32],
             fm._conv_opts(fm.SAME, 2, fm.Act.RELU6))
    for k, (out, stride) in enumerate(BLOCKS, 1):
        side //= stride
        h = conv("DEPTHWISE_CONV_2D", h, f"block{k}/depthwise", he(9, 1, 3, 3, channels), he(1, channels) * 0.05, 3,
                 [1, side, side, channels], fm._conv_opts(fm.SAME, stride, fm.Act.RELU6, multiplier=1))
        h = conv("CONV_2D", h, f"block{k}/pointwise", he(channels, out, 1, 1, channels), he(1, out) * 0.05, 0,
                 [1, side, side, out], fm._conv_opts(fm.SAME, 1, fm.Act.RELU6))
        channels = out
    same = q.quant_of(h) if quantized else None  # int8 pooling and reshape keep their input's parameters
    h = g.add_op("AVERAGE_POOL_2D", [h], [q.act("avgpool", [1, 1, 1, channels], same)],
                 fm._pool_opts(fm.VALID, side, side), version=2 if quantized else 1)
    h = g.add_op("RESHAPE", [h, g.const("flatten/shape", [1, channels], np.int32)], [q.act("flatten", [1, channels], same)],
                 ("ReshapeOptions", dict(new_shape=[1, channels])))
    # logits spread by a few units (a trained classifier's are), so the softmax is peaked
    # and its int8 grid is exercised beyond the zero point
    wf, bf = he(channels, CLASSES, channels) * 4, he(1, CLASSES) * 0.05
    if not quantized:
        wt, bt = g.const("logits/weights", wf), g.const("logits/bias", bf)
    else:  # per-tensor int8 FULLY_CONNECTED (version 4), as TFLite's converter writes it
        ws = np.float32(np.abs(wf).max() / 127)
        bq, bquant = fm._bias(bf, same[0][0], [ws])
        wt = g.const("logits/weights", fm._quantize(wf, ws, 0, np.int8), quant=([float(ws)], [0], 0))
        bt = g.const("logits/bias", bq, quant=bquant)
    h = g.add_op("FULLY_CONNECTED", [h, wt, bt], [q.act("logits", [1, CLASSES])],
                 ("FullyConnectedOptions", dict(fused_activation_function=fm.Act.NONE)), version=4 if quantized else 1)
    out_name = "probs_int8" if quantized else "probs"
    h = g.add_op("SOFTMAX", [h], [q.act(out_name, [1, CLASSES], ([SOFTMAX_STEP], [-128], 0))],
                 ("SoftmaxOptions", dict(beta=1.0)), version=2 if quantized else 1)
    if quantized:
        h = g.add_op("DEQUANTIZE", [h], [g.add_tensor("probs", [1, CLASSES], np.float32)], version=2)
    g.inputs, g.outputs = [x], [h]
    return m


def random_images(n, seed):
    """`n` inputs in MobileNet's [-1, 1] range."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, (1, SIZE, SIZE, 3)).astype(np.float32) for _ in range(n)]


def build(cache, rebuild=False):
    """(float .tflite path, int8 .tflite path), written now unless cached."""
    paths = cache / "mobilenet_v1_float.tflite", cache / "mobilenet_v1_int8.tflite"
    if not rebuild and all(p.exists() for p in paths):
        return paths
    fm = _fixtures()
    cache.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    float_bytes = mobilenet_v1(fm).serialize()
    ranges = fm.calibrate(float_bytes, [[x] for x in random_images(8, SEED + 1)])
    int8_bytes = mobilenet_v1(fm, ranges).serialize()
    paths[0].write_bytes(float_bytes)
    paths[1].write_bytes(int8_bytes)
    harness.log(f"wrote {paths[0]} and {paths[1]} in {time.perf_counter() - start:.1f} s")
    return paths


# -- the benchmark ----------------------------------------------------------------------------
class LiteRT:
    """LiteRT's interpreter on one thread, fed and read through its tensor API."""

    def __init__(self, path):
        from ai_edge_litert.interpreter import Interpreter
        self.it = Interpreter(model_path=str(path), num_threads=1)
        self.it.allocate_tensors()
        self.input = self.it.get_input_details()[0]["index"]
        self.output = self.it.get_output_details()[0]["index"]

    def __call__(self, image):
        self.it.set_tensor(self.input, image)
        self.it.invoke()
        return self.it.get_tensor(self.output)


def litert_reference(path):
    """image -> output of LiteRT's reference kernels (BUILTIN_REF: TFLite's integer
    reference arithmetic, no XNNPACK): the yardstick of how far two correct int8 kernel
    sets drift apart over the network's depth."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    it = Interpreter(model_path=str(path), num_threads=1, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    index, output = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]

    def run(image):
        it.set_tensor(index, image)
        it.invoke()
        return it.get_tensor(output)
    return run


def rounding_share(interpreter, image, runs=5):
    """The fraction of the int8 plan's op time spent in quantize_linear/dequantize_linear."""
    runner = interpreter.get_signature_runner("infer")
    profiler = interpreter.enable_profiling()
    for _ in range(runs):
        runner(input=image)
    interpreter.profiler = None
    total = sum(r.total_ns for r in profiler.records.values())
    return sum(r.total_ns for r in profiler.records.values() if r.opcode in ("quantize_linear", "dequantize_linear")) / total


def agreement(ours, theirs, images, steps):
    """Agreement of `ours` with `theirs` (callables image -> probabilities) over `images`:
    in steps of the softmax's grid when `steps`, else the max relative difference."""
    diffs, rel, top1 = [], 0.0, 0
    for image in images:
        a, b = ours(image), theirs(image)
        diffs.append(np.abs(a.astype(np.float64) - b) / SOFTMAX_STEP)
        rel = max(rel, float(np.max(np.abs(a - b)) / np.max(np.abs(b))))
        top1 += int(np.argmax(a) == np.argmax(b))
    top1 = f"top-1 {top1}/{len(images)}"
    if not steps:
        return f"max rel {rel:.1e}, {top1}"
    d = np.concatenate([x.ravel() for x in diffs])
    return f"max {np.round(d.max(), 3):g} steps, {np.mean(d > 1.001):.2%} > 1 step, {top1}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs of each contender (default 20)")
    parser.add_argument("--inputs", type=int, default=8, help="random inputs for agreement (default 8)")
    parser.add_argument("--cache", default=None, help="folder of the two .tflite files "
                        "(default ~/.cache/edgeflow-bench/tflite-synthetic)")
    parser.add_argument("--rebuild", action="store_true", help="write the .tflite files again")
    args = parser.parse_args()
    from edgeflow.converters import tflite

    cache = pathlib.Path(args.cache) if args.cache else pathlib.Path.home() / ".cache" / "edgeflow-bench" / "tflite-synthetic"
    float_path, int8_path = build(cache, args.rebuild)
    variants = [("float32", float_path, None), ("int8", int8_path, None), ("float32, quantize=int8", float_path, "int8")]
    images = random_images(args.inputs, SEED + 2)
    with tempfile.TemporaryDirectory() as tmp:
        runners, interpreters, rows = {}, {}, []
        for name, src, quantize in variants:
            efl = pathlib.Path(tmp) / f"{len(runners)}.efl"
            seconds = []
            for _ in range(3):  # the median of three: the first also pays for lazy imports
                start = time.perf_counter()
                result = tflite.convert(src, efl, quantize=quantize)
                seconds.append(time.perf_counter() - start)
            seconds = harness.median(seconds)
            interpreters[name] = ef.Interpreter(str(efl), num_threads=1)
            runner = interpreters[name].get_signature_runner("infer")
            runners[name] = lambda image, r=runner: r(input=image)["probs"]
            rows.append([name, f"{result.source_bytes:,}", f"{result.efl_bytes:,}",
                         f"{result.efl_bytes / result.source_bytes:.3f}", f"{seconds:.2f}"])
            harness.log(f"{name}: converted in {seconds:.2f} s")
        peers = {"float32": LiteRT(float_path), "int8": LiteRT(int8_path)}
        peer_of = {"float32": "float32", "int8": "int8", "float32, quantize=int8": "float32"}
        image = images[0]
        contenders = {f"edgeflow {n}": (lambda f=f: f(image)) for n, f in runners.items()}
        contenders.update({f"LiteRT {n}": (lambda p=p: p(image)) for n, p in peers.items()})
        t = harness.medians(contenders, args.runs, warmup=2)
        for row, (name, _, _) in zip(rows, variants):
            ours, theirs = t[f"edgeflow {name}"], t[f"LiteRT {peer_of[name]}"]
            row += [harness.ms(ours, 2), harness.ms(theirs, 2), harness.ratio(ours, theirs),
                    agreement(runners[name], peers[peer_of[name]], images, steps=name == "int8")]
        rows.append(["int8, LiteRT's reference kernels", "-", "-", "-", "-", "-", "-", "-",
                     agreement(litert_reference(int8_path), peers["int8"], images, steps=True)])
        rounding = rounding_share(interpreters["int8"], image)
    print(f"\nMobileNetV1 1.0 224 (random weights), 1 thread, medians of {args.runs} interleaved runs; "
          f"agreement over {args.inputs} random inputs against LiteRT (the int8 one in 1/256 softmax steps)\n")
    columns = ["model", ".tflite bytes", ".efl bytes", ".efl/.tflite", "convert s", "edgeflow ms", "LiteRT ms",
               "edgeflow/LiteRT", "agreement with LiteRT"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    print(f"\nedgeflow int8: {rounding:.0%} of its op time rounds activations to their int8 grid "
          "(quantize_linear + dequantize_linear pairs); the rest is float32 compute on the plan's dequantized weights")


if __name__ == "__main__":
    main()
