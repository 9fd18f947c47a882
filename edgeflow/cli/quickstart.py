"""`edgeflow quickstart`: build a small model, package it, inspect it and run it."""
import contextlib
import os
import tempfile

import numpy as np

from ..errors import EdgeflowError


def _step(n, text):
    print(f"\n[{n}] {text}")


def build_classifier(path, seed=0):
    """A 2-layer MLP classifier (16 -> 32 -> 4) with softmax, saved to `path`."""
    import edgeflow as ef
    rng = np.random.default_rng(seed)
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 16], name="x")
        w1 = ef.constant(rng.standard_normal((16, 32)).astype(np.float32) * 0.25, name="w1")
        b1 = ef.constant(np.zeros(32, np.float32), name="b1")
        w2 = ef.constant(rng.standard_normal((32, 4)).astype(np.float32) * 0.25, name="w2")
        h = ef.nn.relu(x @ w1 + b1, name="hidden")
        logits = ef.matmul(h, w2, name="logits")
        probs = ef.nn.softmax(logits, name="probs")
        label = ef.argmax(probs, axis=1, name="label")
    ef.save(g, path, signatures={"infer": ({"x": x}, {"probs": probs, "label": label})},
            description="quickstart MLP classifier")
    return {"w1": w1.node.attrs["value"], "b1": b1.node.attrs["value"], "w2": w2.node.attrs["value"]}


def small_cnn_onnx(seed=0):
    """A small ONNX CNN: conv-BN-relu, depthwise conv, global pool, dense; dynamic batch."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)

    def init(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
    inits = [init("w1", 8, 3, 3, 3), init("b1", 8), init("bn_scale", 8), init("bn_bias", 8),
             init("bn_mean", 8), numpy_helper.from_array(rng.uniform(0.5, 2, 8).astype(np.float32), "bn_var"),
             init("w2", 8, 1, 3, 3), init("fc_w", 10, 8), init("fc_b", 10)]
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c1", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], group=8, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c2", "zero", "six"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    inits += [numpy_helper.from_array(np.array(0, np.float32), "zero"),
              numpy_helper.from_array(np.array(6, np.float32), "six")]
    graph = helper.make_graph(
        nodes, "quickstart_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def convert_onnx(directory):
    try:
        import onnx
        from onnx.reference import ReferenceEvaluator
        from edgeflow.converters import onnx as onnx_converter
    except ImportError:
        print("  skipped: needs the 'convert' extra (pip install 'edgeflow[convert]')")
        return
    import edgeflow as ef
    onnx_path = os.path.join(directory, "cnn.onnx")
    model = small_cnn_onnx()
    onnx.save(model, onnx_path)
    x = np.random.default_rng(2).standard_normal((4, 3, 16, 16)).astype(np.float32)
    reference = ReferenceEvaluator(model).run(None, {"image": x})[0]
    for quantize in (None, "int8"):
        out = os.path.join(directory, f"cnn{'-' + quantize if quantize else ''}.efl")
        result = onnx_converter.convert(onnx_path, out, quantize=quantize)
        probs = ef.Interpreter(out).get_signature_runner("infer")(image=x)["probs"]
        err = float(np.abs(probs - reference).max())
        print(f"  {os.path.basename(out)}: {sum(result.source_ops.values())} ONNX ops -> "
              f"{sum(result.ops.values())} edgeflow ops ({', '.join(sorted(result.ops))}), "
              f"{result.efl_bytes:,} bytes; max |edgeflow - onnx reference| = {err:.1e}")
        if err > (1e-5 if quantize is None else 5e-2):
            raise SystemExit(f"quickstart: converted model differs from the ONNX reference by {err}")


def train_on_device(directory):
    """y = 0.1 x + 0.3: package a trainable model, train it with the interpreter on an
    ef.data pipeline, with TensorBoard logs when tensorboardX is installed; export it."""
    import edgeflow as ef
    from ..training_loop import fit
    path = os.path.join(directory, "linear.efl")
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None], name="x")
        y = ef.placeholder(ef.float32, [None], name="y")
        w = ef.Variable(ef.random_uniform([1], -1.0, 1.0, seed=0), name="W")
        b = ef.Variable(ef.zeros([1]), name="b")
        pred = ef.add(w * x, b, name="pred")
        loss = ef.losses.mean_squared_error(y, pred)
        step = ef.train.GradientDescent(0.5).minimize(loss)
    ef.save(g, path, signatures={"infer": ({"x": x}, {"pred": pred}),
                                 "train": ({"x": x, "y": y}, {"loss": loss}, [step])})
    rng = np.random.default_rng(0)
    xs = rng.random(100).astype(np.float32)
    data = {"x": xs, "y": (0.1 * xs + 0.3 + rng.normal(0, 0.01, 100)).astype(np.float32)}
    interp = ef.Interpreter(path)
    batches = ef.data.Dataset.from_tensor_slices(data).shuffle(100, seed=0).batch(50)
    logger = _tensorboard(os.path.join(directory, "runs"))
    try:
        history = fit(interp, batches, epochs=100, checkpoint_dir=os.path.join(directory, "checkpoints"),
                      checkpoint_every=10, logger=logger)
    finally:
        if logger is not None:
            logger.close()
    state = interp.variables()
    print(f"  {len(history)} steps on the device: loss {history[0][1]:.4f} -> {history[-1][1]:.6f}; "
          f"W = {state['W'][0]:.3f} (0.1), b = {state['b'][0]:.3f} (0.3)")
    interp.export(os.path.join(directory, "linear-trained.efl"))
    print("  checkpointed to checkpoints/, exported linear-trained.efl"
          + ("; TensorBoard logs in runs/ (loss, learning rate, steps/s, weight and gradient histograms)"
             if logger is not None else ""))
    if abs(state["W"][0] - 0.1) > 0.02 or abs(state["b"][0] - 0.3) > 0.02:
        raise SystemExit("quickstart: training did not recover W and b")


def _tensorboard(logdir):
    """A TensorBoardLogger into `logdir`, or None without the 'tensorboard' extra."""
    import importlib.util
    if importlib.util.find_spec("tensorboardX") is None:
        return None
    from ..tensorboard import TensorBoardLogger
    return TensorBoardLogger(logdir, histogram_every=50)


def export_to_onnx(directory):
    """The model trained in step 6, back to ONNX, checked with ONNX's reference evaluator."""
    try:
        from onnx.reference import ReferenceEvaluator
        from edgeflow.converters.onnx import export as exporter
    except ImportError:
        print("  skipped: needs the 'convert' extra (pip install 'edgeflow[convert]')")
        return
    import edgeflow as ef
    source, out = os.path.join(directory, "linear-trained.efl"), os.path.join(directory, "linear-trained.onnx")
    model = exporter.export(source, out)
    x = np.linspace(-1, 1, 7, dtype=np.float32)
    got = ReferenceEvaluator(model).run(None, {"x": x})[0]
    want = ef.Interpreter(source).get_signature_runner("infer")(x=x)["pred"]
    err = float(np.abs(got - want).max())
    print(f"  wrote linear-trained.onnx ({len(model.graph.node)} ONNX nodes, opset {exporter.OPSET}, the trained "
          f"W and b as initializers); max |onnx reference - edgeflow| = {err:.1e}")
    if err > 1e-6:
        raise SystemExit(f"quickstart: the exported model differs from edgeflow by {err}")


def decode_with_a_loop(directory, vocab=10, hidden=16, end=0, max_len=12):
    """A greedy decoder: an RNN cell in ef.while_loop that stops at an end token, against numpy."""
    import edgeflow as ef
    rng = np.random.default_rng(2)
    p = {k: (rng.standard_normal(s) * 0.5).astype(np.float32)
         for k, s in (("embed", (vocab, hidden)), ("w", (hidden, hidden)), ("out", (hidden, vocab)))}
    path = os.path.join(directory, "decoder.efl")
    g = ef.Graph()
    with g.as_default():
        h0 = ef.placeholder(ef.float32, [1, hidden], name="state")
        start = ef.placeholder(ef.int64, [], name="start")
        embed, w, out = (ef.constant(p[k], name=k) for k in ("embed", "w", "out"))

        def step(i, token, h, tokens):
            h = ef.tanh(ef.expand_dims(ef.gather(embed, token), 0) + ef.matmul(h, w))
            token = ef.reshape(ef.argmax(ef.matmul(h, out), axis=1), [])
            return i + 1, token, h, ef.concat([tokens, ef.reshape(token, [1])], 0)

        def going(i, token, h, tokens):
            return ef.logical_and(i < max_len, ef.logical_not(ef.logical_and(i > 0, ef.equal(token, end))))
        tokens = ef.while_loop(going, step, [ef.constant(0), start, h0, ef.constant(np.zeros(0, np.int64))],
                               shape_invariants=[(), (), (1, hidden), (None,)], name="decode")[3]
    ef.save(g, path, {"infer": ({"state": h0, "start": start}, {"tokens": tokens})})
    run = ef.Interpreter(path).get_signature_runner("infer")
    for seed in range(3):
        state = np.random.default_rng(seed).standard_normal((1, hidden)).astype(np.float32)
        got = run(state=state, start=np.int64(seed + 1))["tokens"].tolist()
        want, token, h = [], seed + 1, state
        while len(want) < max_len and not (want and want[-1] == end):
            h = np.tanh(p["embed"][token] + h @ p["w"])
            token = int(np.argmax(h @ p["out"]))
            want.append(token)
        print(f"  start {seed + 1}: tokens {got}" + ("  (stopped at the end token)" if got[-1] == end else ""))
        if got != want:
            raise SystemExit(f"quickstart: the decoder gave {got}, numpy {want}")
    print("  the loop ran in the interpreter (its body planned once per length of the token list); "
          "numpy agrees")


def build_encoder_classifier(path):
    """DADS's case for a split: a cheap encoder that shrinks a 64x64 image 24x (strided
    conv, pooling), then heavy dense layers."""
    import edgeflow as ef
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        image = ef.placeholder(ef.float32, [None, 3, 64, 64], name="image")
        h = ef.layers.conv2d(image, 8, 3, strides=2, padding="same", activation=ef.nn.relu, name="encoder")
        h = ef.layers.flatten(ef.layers.max_pool2d(h, 4, 4, name="pool"), name="features")
        h = ef.layers.dense(h, 1024, activation=ef.nn.relu, name="fc1")
        h = ef.layers.dense(h, 1024, activation=ef.nn.relu, name="fc2")
        probs = ef.nn.softmax(ef.layers.dense(h, 10, name="logits"), name="probs")
    ef.save(g, path, signatures={"infer": ({"image": image}, {"probs": probs})})


def split_with_cloud(directory):
    """Split a model for a WiFi link and a phone-class device, serve the cloud part on
    127.0.0.1 in this process, and run a split inference against it."""
    try:
        from ..cloud import CloudDelegate, Server
        from ..splitter.package import split_file
        import scipy  # noqa: F401 (the planner's max-flow)
    except ImportError:
        print("  skipped: needs the 'cloud' and 'split' extras (pip install 'edgeflow[cloud,split]')")
        return
    import edgeflow as ef
    source = os.path.join(directory, "encoder.efl")
    build_encoder_classifier(source)
    # Without profiles, op times are estimated from FLOPs and bytes: the device is taken
    # as 1/100 of this machine's numpy (a low-end phone core), the server as 10x.
    result = split_file(source, os.path.join(directory, "split"), link="wifi", device_speed=0.01)
    p = result.placement
    print(f"  plan for {result.link.describe()}: {len(p.device_ops)} ops on the device, "
          f"{len(p.cloud_ops)} on the cloud; sends {', '.join(n for n, _ in p.cut_tensors) or 'nothing'} "
          f"({sum(b for _, b in p.cut_tensors):,} B up)")
    print(f"  predicted: split {p.predicted['split'] * 1e3:.2f} ms, device-only "
          f"{p.predicted['device_only'] * 1e3:.2f} ms, cloud-only {p.predicted['cloud_only'] * 1e3:.2f} ms")
    x = np.random.default_rng(2).standard_normal((1, 3, 64, 64)).astype(np.float32)
    want = ef.Interpreter(source).get_signature_runner("infer")(image=x)["probs"]
    with Server(models={result.model_id: result.paths["cloud"]}) as server:
        cloud = CloudDelegate(server.address)
        device = ef.Interpreter(result.paths["device"], delegates=[cloud])
        got = device.get_signature_runner("infer")(image=x)["probs"]
        print(f"  served {result.model_id} on {server.address}; split inference made "
              f"{cloud.calls} call(s); max |split - whole| = {float(np.abs(got - want).max()):.1e}")
    print(f"  wrote {', '.join(os.path.basename(v) for v in result.paths.values())} in split/")
    if not np.array_equal(got, want):
        raise SystemExit("quickstart: the split inference differs from the whole model")


def split_training(directory):
    """Split learning, U-shaped: the device keeps its first layer, the loss and the labels;
    the server trains the middle; a few steps against a server on 127.0.0.1, checked
    against training in one process."""
    try:
        from ..cloud import Server, connect
        from ..splitter.training import write_pair
    except ImportError:
        print("  skipped: needs the 'cloud' extra (pip install 'edgeflow[cloud]')")
        return
    import edgeflow as ef
    from ..format import reader
    from ..training_loop import batch_at
    path = os.path.join(directory, "mlp-train.efl")
    g = ef.Graph()
    with g.as_default():
        ef.set_random_seed(0)
        x = ef.placeholder(ef.float32, [None, 16], name="x")
        y = ef.placeholder(ef.int64, [None], name="y")
        h = ef.layers.dense(x, 32, activation=ef.nn.relu, name="device_layer")
        h = ef.layers.dense(h, 64, activation=ef.nn.relu, name="cloud_layer")
        logits = ef.layers.dense(h, 4, name="logits")
        loss = ef.losses.softmax_cross_entropy(y, logits)
        step = ef.train.Adam(0.01).minimize(loss)
    ef.save(g, path, signatures={"train": ({"x": x, "y": y}, {"loss": loss}, [step])})
    model = reader.load(path)
    sub = model.subgraphs[0]
    head = {i for i, op in enumerate(sub.operators) if op.outputs  # the first layer's forward ops
            and sub.tensors[op.outputs[0]].name in ("device_layer/matmul", "device_layer/bias_add", "relu")}
    out = os.path.join(directory, "split-train")
    os.makedirs(out, exist_ok=True)
    cut = write_pair(model, head, out, model_id="mlp-train", labels="device", label_inputs=["y"])
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((256, 16)).astype(np.float32)
    data = {"x": xs, "y": (xs[:, :4].argmax(1)).astype(np.int64)}
    local = ef.Interpreter(path).get_signature_runner("train")
    with Server(models={"mlp-train": os.path.join(out, "cloud.efl")}) as server:
        device = connect(os.path.join(out, "device.efl"), server.address, device_id="quickstart")
        runner = device.get_signature_runner("train")
        gaps, losses = [], []
        for s in range(16):
            batch = batch_at(data, 32, 0, s // 8, s % 8)
            a, b = float(local(**batch)["loss"]), float(runner(**batch)["loss"])
            gaps.append(abs(a - b))
            losses.append(b)
        host = server.models["mlp-train"].steps
        sent = sorted({n for names in host.received for n in names})
    print(f"  {len(cut.rounds)} round trips per step; the server received only {sent} (no labels)")
    print(f"  16 split steps: loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
          f"max |split - one process| = {max(gaps):.1e}")
    if max(gaps) > 1e-5 or "y" in sent:
        raise SystemExit("quickstart: split training differs from training in one process")


def serve_many_devices(path):
    """Sixteen devices at once against a server with adaptive batching and Prometheus
    metrics on 127.0.0.1: each gets its own answer (against its own unbatched run), and
    the metrics say how the requests were batched."""
    try:
        from concurrent.futures import ThreadPoolExecutor
        from ..cloud import Client, Server
        from ..cloud.metrics import PrometheusMetrics
        metrics = PrometheusMetrics()
    except (ImportError, EdgeflowError):
        print("  skipped: needs the 'cloud' and 'metrics' extras (pip install 'edgeflow[cloud,metrics]')")
        return
    import edgeflow as ef
    local = ef.Interpreter(path).get_signature_runner("infer")
    inputs = [np.random.default_rng(10 + k).standard_normal((1, 16)).astype(np.float32) for k in range(16)]
    with Server(models={"classifier": path}, max_workers=16, metrics=metrics,
                batching=dict(slo_ms=50, max_batch=16, max_wait_ms=20)) as server:
        def device(x):
            with Client(server.address, timeout=30) as client:
                return client.run("classifier", {"x": x}, ["probs"])["probs"]
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(device, inputs))
        text = metrics.text()
    err = max(float(np.abs(a - local(x=x)["probs"]).max()) for a, x in zip(answers, inputs))
    batches = _sample(text, "edgeflow_batch_size_count")
    print(f"  16 devices, {_sample(text, 'edgeflow_requests_total')} requests answered in {batches} "
          f"batch(es) of up to 16 (AIMD under a 50 ms SLO); max |batched - alone| = {err:.1e}")
    print("  the same server runs its models as Ray Serve replicas with `edgeflow serve --ray`")
    if err > 1e-5:
        raise SystemExit(f"quickstart: a batched answer differs from the device's own run by {err}")


def _sample(text, name):
    """The sum of the samples named `name` in Prometheus exposition `text`, as an int."""
    return int(sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name)))


def main(directory=None):
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # not gRPC's notes on connections closing
    import edgeflow as ef
    from .inspect import describe, render

    keep = directory is not None
    with (contextlib.nullcontext(directory) if keep
          else tempfile.TemporaryDirectory(prefix="edgeflow-quickstart-")) as directory:
        os.makedirs(directory, exist_ok=True)
        print(f"edgeflow quickstart: writing its files to {os.path.abspath(directory)}" if keep else
              "edgeflow quickstart: writing its files to a temporary folder, removed at the end "
              "(--dir DIR keeps them)")
        path = os.path.join(directory, "quickstart.efl")

        _step(1, "Build a graph with the TensorFlow-style API and package it")
        weights = build_classifier(path)
        print(f"  wrote quickstart.efl ({os.path.getsize(path):,} bytes)")

        _step(2, "Inspect the package")
        print("\n".join("  " + line for line in render(describe(path)).replace(path, "quickstart.efl").splitlines()))

        _step(3, "Run the 'infer' signature on a dynamic batch of 5")
        x = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
        runner = ef.Interpreter(path).get_signature_runner("infer")
        out = runner(x=x)
        h = np.maximum(x @ weights["w1"] + weights["b1"], 0) @ weights["w2"]
        ref = np.exp(h - h.max(1, keepdims=True))
        ref /= ref.sum(1, keepdims=True)
        err = float(np.abs(out["probs"] - ref).max())
        print(f"  probs {out['probs'].shape}, labels {out['label'].tolist()}")
        print(f"  max |edgeflow - numpy| = {err:.2e}")
        if err > 1e-5:
            raise SystemExit(f"quickstart: result differs from numpy by {err}")

        _step(4, "Benchmark it")
        from .bench import bench_model
        r = bench_model(path, runs=200)
        print(f"  {r['ops']} ops: p50 {r['p50_ms'] * 1e3:.1f} us per run, arena {r['arena_bytes']:,} bytes")

        _step(5, "Convert an ONNX model (a small CNN made on the spot) and run it")
        convert_onnx(directory)

        _step(6, "Train on the device: the seeds' linear regression through a train signature, "
              "fed by an ef.data pipeline")
        train_on_device(directory)

        _step(7, "Control flow: a greedy decoder in a while loop that stops at an end token")
        decode_with_a_loop(directory)

        _step(8, "Split a model with the cloud: plan, package, serve on 127.0.0.1, infer jointly")
        split_with_cloud(directory)

        _step(9, "Train jointly: U-shaped split learning, the labels stay on the device")
        split_training(directory)

        _step(10, "Serve many devices: adaptive batching and Prometheus metrics")
        serve_many_devices(path)

        _step(11, "Export the model trained in step 6 back to ONNX, for Netron and onnxruntime")
        export_to_onnx(directory)
    print("\nquickstart finished: built, packaged, inspected, ran and benchmarked a model, "
          "converted one from ONNX, trained one on the device, decoded with a loop, split one with "
          "the cloud, trained one jointly with it, served many devices in batches, and exported a trained "
          "model back to ONNX.")
    if keep:
        print(f"the files are in {os.path.abspath(directory)}: "
              + ", ".join(sorted(f + ("/" if os.path.isdir(os.path.join(directory, f)) else "")
                                 for f in os.listdir(directory))))


def add_parser(verbs):
    p = verbs.add_parser("quickstart", help="an end-to-end tour: build, convert, run and train models",
                         description="An end-to-end tour: build a small model with the graph "
                                     "API, package, inspect, run and benchmark it; convert an "
                                     "ONNX model; train a model on the device; split a model "
                                     "with a server it starts on 127.0.0.1, for inference and "
                                     "for training.")
    p.add_argument("--dir", default=None, help="write the files here and keep them (default: a "
                                                "temporary folder, removed at the end)")
    p.set_defaults(fn=cmd_quickstart)


def cmd_quickstart(args):
    main(args.dir)
