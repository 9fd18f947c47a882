"""Winograd against the direct conv: ResNet-18's 3x3 stride-1 layer shapes, one conv per model.

    .venv/bin/python benchmarks/bench_winograd.py [--runs N] [--batch 1 8] [--threads 1] [--error]
    .venv/bin/python benchmarks/bench_winograd.py --model resnet18.onnx [--runs N] [--batch 1 8]

Each shape (C = M channels at H = W, padding 1, bias, relu) runs as a one-op
`edgeflow.Interpreter` model three times, its kernel bound with EDGEFLOW_CONV_ALGO set to
direct, winograd2 (F(2x2,3x3)) and winograd4 (F(4x4,3x3)), and as an onnxruntime session
of the one Conv node, all interleaved on `--threads` threads each: median times, and each
over onnxruntime's; "auto" names the path edgeflow's rule picks (winograd.rule).
`--error` also prints, per shape and path, the float32 max abs error over the max abs
output against a float64 direct conv (He-initialised weights, standard normal inputs).
`--model` instead runs an ONNX model (its first input of shape (batch, ...), e.g. a
torchvision ResNet-18 exported by benchmarks/zoo.py) end to end: converted, bound with
EDGEFLOW_CONV_ALGO=auto (the rule) and =direct, against onnxruntime, interleaved.
`--grad` instead times a train step's gradients of the same layers: conv_filter_grad and
conv_input_grad as one-op models on each path, and torch's (torch.nn.grad, the `zoo`
extra; left out without it), interleaved; "auto" the path the kernels pick
(winograd.filter_grad_rule for the filter's, winograd.variable_rule for the input's).
"""
import argparse
import os

import numpy as np

import harness
from bench_conv import edgeflow_model, onnx_model

import edgeflow as ef
from edgeflow.interp.kernels import winograd

SHAPES = [(64, 56), (128, 28), (256, 14), (512, 7)]
PATHS = ("direct", "winograd2", "winograd4")


def reference(x, w, b):
    """float64 direct conv, padding 1, then bias and relu."""
    n, c, h, wd = x.shape
    p = np.zeros((n, c, h + 2, wd + 2))
    p[:, :, 1:-1, 1:-1] = x
    y = sum(np.einsum("mc,nchw->nmhw", w[:, :, i, j].astype(np.float64), p[:, :, i:i + h, j:j + wd])
            for i in range(3) for j in range(3))
    return np.maximum(y + b[:, None, None], 0)


def interpreter(model, algo, threads):
    os.environ[winograd.ENV] = algo  # read when the kernel binds, at the first run's plan
    interp = ef.Interpreter(model, num_threads=threads)
    interp.allocate_tensors()
    return interp


def model_end_to_end(path, batches, runs, threads):
    """`--model`: the model with each conv path against onnxruntime, per batch size."""
    import tempfile
    from edgeflow.converters import onnx as onnx_converter
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        efl = os.path.join(folder, "model.efl")
        onnx_converter.convert(path, efl)
        sess = harness.ort_session(path, threads)
        feed = sess.get_inputs()[0]
        for n in batches:
            x = np.random.default_rng(0).standard_normal([n] + list(feed.shape[1:])).astype(np.float32)
            contenders = {}
            for algo in ("auto", "direct"):
                interp = interpreter(efl, algo, threads)
                inp = interp.get_input_details()[0]
                interp.resize_input_tensor(inp["index"], list(x.shape))
                interp.allocate_tensors()
                interp.set_tensor(inp["index"], x)
                contenders[algo] = interp.invoke
            contenders["ort"] = lambda x=x: sess.run(None, {feed.name: x})
            t = harness.medians(contenders, runs)
            rows.append([str(n)] + [f"{harness.ms(t[k])} ({harness.ratio(t[k], t['ort'])})" for k in ("auto", "direct")]
                        + [harness.ms(t["ort"]), harness.ratio(t["auto"], t["direct"])])
    print(f"{os.path.basename(path)}: median ms of {runs} interleaved runs on {threads} thread(s); "
          f"(x) = time / onnxruntime's")
    harness.print_table(["batch", "edgeflow auto", "edgeflow direct", "ort", "auto/direct"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="timed runs of each contender (default 10)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--error", action="store_true", help="also measure float32 errors")
    parser.add_argument("--model", help="an ONNX model to run end to end instead")
    parser.add_argument("--grad", action="store_true", help="time the layers' gradients instead")
    args = parser.parse_args()
    if args.grad:
        saved = os.environ.get(winograd.ENV)
        gradients(args.batch, args.runs, args.threads)
        os.environ.pop(winograd.ENV, None) if saved is None else os.environ.update({winograd.ENV: saved})
        return
    if args.model:
        saved = os.environ.get(winograd.ENV)
        model_end_to_end(args.model, args.batch, args.runs, args.threads)
        os.environ.pop(winograd.ENV, None) if saved is None else os.environ.update({winograd.ENV: saved})
        return
    rng = np.random.default_rng(0)
    rows, errors = [], []
    saved = os.environ.get(winograd.ENV)
    for n in args.batch:
        for c, hw in SHAPES:
            x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
            w = (rng.standard_normal((c, c, 3, 3)) * np.sqrt(2 / (9 * c))).astype(np.float32)
            b = (0.1 * rng.standard_normal(c)).astype(np.float32)
            attrs = {"pads": (1, 1, 1, 1)}
            model, _ = edgeflow_model(x.shape, w, b, {**attrs, "activation": "relu"})
            sess = harness.ort_session(onnx_model_relu(x.shape, w, b, attrs), args.threads)
            contenders, outputs = {}, {}
            for algo in PATHS:
                interp = interpreter(model, algo, args.threads)
                (inp,), (res,) = interp.get_input_details(), interp.get_output_details()
                interp.set_tensor(inp["index"], x)
                contenders[algo] = interp.invoke
                outputs[algo] = (interp, res["index"])
            contenders["ort"] = lambda sess=sess, x=x: sess.run(None, {"x": x})
            t = harness.medians(contenders, args.runs)
            flop = 2 * 9 * c * c * hw * hw * n
            auto = winograd.rule(x.shape, w.shape, (hw, hw))
            rows.append([f"{c}x{hw}x{hw}", str(n), f"{flop / 1e6:.0f}"]
                        + [f"{harness.ms(t[p], 2)} ({harness.ratio(t[p], t['ort'])})" for p in PATHS]
                        + [harness.ms(t["ort"], 2), auto, harness.ratio(t[auto], t["direct"])])
            if args.error:
                ref = reference(x, w, b)
                scale = np.abs(ref).max()
                row = [f"{c}x{hw}x{hw}", str(n)]
                for algo in PATHS:
                    interp, index = outputs[algo]
                    interp.invoke()
                    row.append(f"{np.abs(interp.get_tensor(index) - ref).max() / scale:.1e}")
                row.append(f"{np.abs(sess.run(None, {'x': x})[0] - ref).max() / scale:.1e}")
                errors.append(row)
    if saved is None:
        os.environ.pop(winograd.ENV, None)
    else:
        os.environ[winograd.ENV] = saved
    print(f"3x3 conv, pad 1, bias + relu; median ms of {args.runs} interleaved runs on {args.threads} "
          f"thread(s); (x) = time / onnxruntime's; auto = the rule's pick, its time / direct's")
    harness.print_table(["C=M x H x W", "batch", "MFLOP", *PATHS, "ort", "auto", "auto/direct"], rows)
    if errors:
        print("float32 max abs error / max abs output, against a float64 direct conv")
        harness.print_table(["C=M x H x W", "batch", *PATHS, "ort"], errors)


def gradient_model(op, x_shape, w):
    """A one-op model of a conv's gradient (padding 1): `op` conv_filter_grad (inputs x, dy)
    or conv_input_grad (input dy, w a constant)."""
    from edgeflow.format import writer
    from edgeflow.graph.math_ops import apply
    g = ef.Graph()
    with g.as_default():
        dy = ef.placeholder(ef.float32, x_shape, name="dy")
        if op == "conv_filter_grad":
            x = ef.placeholder(ef.float32, x_shape, name="x")
            out, inputs = apply(op, [x, dy, ef.constant(np.zeros_like(w))], {"pads": (1, 1, 1, 1)}), {"x": x, "dy": dy}
        else:
            out = apply(op, [dy, ef.constant(w), ef.constant(np.zeros(x_shape, np.float32))], {"pads": (1, 1, 1, 1)})
            inputs = {"dy": dy}
    return writer.to_bytes(ef.to_model(g, {"infer": (inputs, {"out": out})}))


def gradients(batches, runs, threads):
    """`--grad`: each layer's filter and input gradients on each path (and torch's)."""
    try:
        import torch
        torch.set_num_threads(threads)
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    rows = []
    for n in batches:
        for c, hw in SHAPES:
            x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
            dy = rng.standard_normal(x.shape).astype(np.float32)
            w = (rng.standard_normal((c, c, 3, 3)) * np.sqrt(2 / (9 * c))).astype(np.float32)
            for op, feeds, pick in (("conv_filter_grad", {"x": x, "dy": dy}, winograd.filter_grad_rule),
                                    ("conv_input_grad", {"dy": dy}, winograd.variable_rule)):
                model, contenders = gradient_model(op, x.shape, w), {}
                for algo in PATHS:
                    runner = interpreter(model, algo, threads).get_signature_runner("infer")
                    runner(**feeds)  # binds the kernel while EDGEFLOW_CONV_ALGO is this path
                    contenders[algo] = lambda runner=runner, feeds=feeds: runner(**feeds)
                if torch is not None:
                    tx, tdy, tw = (torch.from_numpy(a) for a in (x, dy, w))
                    if op == "conv_filter_grad":
                        contenders["torch"] = lambda: torch.nn.grad.conv2d_weight(tx, tw.shape, tdy, padding=1)
                    else:
                        contenders["torch"] = lambda: torch.nn.grad.conv2d_input(tx.shape, tw, tdy, padding=1)
                t = harness.medians(contenders, runs)
                auto = pick(x.shape, w.shape, (hw, hw))
                peer = [harness.ms(t["torch"], 2), harness.ratio(t[auto], t["torch"])] if torch is not None else []
                rows.append([op, f"{c}x{hw}x{hw}", str(n)] + [harness.ms(t[p], 2) for p in PATHS]
                            + [auto, harness.ratio(t[auto], t["direct"])] + peer)
    print(f"3x3 conv gradients, pad 1; median ms of {runs} interleaved runs on {threads} thread(s); "
          f"auto = the kernels' pick, its time / direct's" + ("" if torch is None else " and / torch's"))
    harness.print_table(["op", "C=M x H x W", "batch", *PATHS, "auto", "auto/direct"]
                        + ([] if torch is None else ["torch", "auto/torch"]), rows)


def onnx_model_relu(x_shape, w, b, attrs):
    """bench_conv's one-Conv model followed by a Relu."""
    import onnx
    model = onnx.load_from_string(onnx_model(x_shape, w, b, attrs))
    graph = model.graph
    graph.node[0].output[0] = "conv"
    graph.node.append(onnx.helper.make_node("Relu", ["conv"], ["y"]))
    return model.SerializeToString()


if __name__ == "__main__":
    main()
