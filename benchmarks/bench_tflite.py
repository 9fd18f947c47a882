"""Real `.tflite` models: edgeflow's TFLite import against LiteRT, in one process.

    .venv/bin/python benchmarks/bench_tflite.py [--models a,b] [--runs N] [--threads 1,2]
                                                [--converts N] [--no-xnnpack] [--cache DIR]
                                                [--mediapipe-python PATH]
                                                [--suite litert-torch --litert-torch-python PATH]

The models are the 14 that MediaPipe's 0.10.14 wheel ships (face detection short range and
full range sparse, face landmark with and without attention, hand landmark lite and full,
hand recrop, iris landmark, palm detection lite and full, pose detection, pose landmark
full, selfie segmentation and its landscape variant). The script gets them itself: `pip
download --no-deps mediapipe==0.10.14` for this interpreter's platform, into a folder
outside the checkout (default $EDGEFLOW_BENCH_CACHE or ~/.cache/edgeflow-bench, then
mediapipe-0.10.14), whose `*.tflite` members are extracted once; needs `ai-edge-litert`.

Measured, for each model: the median time of `--converts` conversions, the `.tflite` and
`.efl` sizes and their ratio; then at each thread count (edgeflow's `num_threads`,
LiteRT's `num_threads`; LiteRT applies its default XNNPACK delegate, as its users get it,
unless `--no-xnnpack`): the time a new edgeflow Interpreter takes to make its plan, the
first time the model is planned in the process ("cold": its JIT kernels loaded; numba's
import is timed once, before all) and again, and the first run of that second one (plan
included), LiteRT's from `Interpreter(...)` through its first `invoke`, the median latency
of both (interleaved, inputs set and outputs read on both sides), their ratio, and their
agreement on the same seeded random inputs (uniform in [-1, 1)): for each output
max|edgeflow - LiteRT| / max|LiteRT|, the worst output shown, beside LiteRT's own spread
(the same figure for its builtin kernels against XNNPACK's). A model that does not
convert is listed with its error's first line.

LiteRT cannot run face_landmark_with_attention: its three custom ops are MediaPipe's.
With `--mediapipe-python PATH` (a Python with mediapipe==0.10.14 installed, e.g. a venv
of its own: its pins need not suit edgeflow's), such a model's reference is MediaPipe's
own inference graph (benchmarks/mediapipe_reference.py, run by that Python) on a seeded
random image, which both get as the tensor image / 255; its row has no LiteRT latency.
`--suite litert-torch` runs the same on PyTorch models exported by litert-torch
(formerly ai-edge-torch, Google's PyTorch -> LiteRT converter): eight torchvision
classifiers and a BERT-like encoder from Hugging Face transformers
(benchmarks/litert_torch_export.py, run by `--litert-torch-python PATH`, a Python with
litert-torch installed, once; the files cached in litert-torch-0.10.0 beside the
MediaPipe folder). Last, a summary: how many convert, how many
agree within 1e-4 (and how many more within LiteRT's own spread), the median
edgeflow/LiteRT ratio at each thread count.
"""
import argparse
import importlib
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np

import edgeflow as ef
import harness
from bench_models import first_run

MEDIAPIPE = "0.10.14"
MODELS = ("face_detection_short_range", "face_detection_full_range_sparse", "face_landmark",
          "face_landmark_with_attention", "hand_landmark_lite", "hand_landmark_full", "hand_recrop",
          "iris_landmark", "palm_detection_lite", "palm_detection_full", "pose_detection",
          "pose_landmark_full", "selfie_segmentation", "selfie_segmentation_landscape")
AGREE = 1e-4
LITERT_TORCH = "0.10.0"


# -- the models ------------------------------------------------------------------------------
def default_cache(suite="mediapipe"):
    return (pathlib.Path(os.environ.get("EDGEFLOW_BENCH_CACHE") or pathlib.Path.home() / ".cache" / "edgeflow-bench")
            / (f"mediapipe-{MEDIAPIPE}" if suite == "mediapipe" else f"litert-torch-{LITERT_TORCH}"))


def export_litert_torch(cache, names, python):
    """{name: path} of litert-torch's exports of `names` in `cache`, exporting those not
    there yet with `python` (benchmarks/litert_torch_export.py)."""
    cache = pathlib.Path(cache)
    missing = [n for n in names if not (cache / f"{n}.tflite").exists()]
    if missing:
        if not python:
            sys.exit(f"{missing} not exported yet in {cache}: give --litert-torch-python PATH (a Python with "
                     f"litert-torch=={LITERT_TORCH})")
        harness.log(f"exporting {missing} with litert-torch into {cache}...")
        subprocess.run([python, str(pathlib.Path(__file__).with_name("litert_torch_export.py")), str(cache),
                        "--models", ",".join(missing)], check=True)
    return {n: cache / f"{n}.tflite" for n in names}


def fetch_models(cache):
    """{name: path} of the wheel's `.tflite` files in `cache`, downloading the wheel (pip,
    this interpreter's platform) and extracting them first if they are not there yet."""
    cache = pathlib.Path(cache)
    done = cache / ".extracted"
    if not done.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            harness.log(f"downloading mediapipe=={MEDIAPIPE} into {cache}...")
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp,
                            f"mediapipe=={MEDIAPIPE}"], check=True)
            wheel = next(pathlib.Path(tmp).glob("mediapipe-*.whl"))
            with zipfile.ZipFile(wheel) as z:
                for member in z.namelist():
                    if member.endswith(".tflite"):
                        target = cache / pathlib.PurePosixPath(member).name
                        part = target.with_suffix(".part")
                        part.write_bytes(z.read(member))
                        part.replace(target)
        done.write_text(f"mediapipe=={MEDIAPIPE}\n")
    return {p.stem: p for p in sorted(cache.glob("*.tflite"))}


def random_inputs(details, seed=0):
    """{tensor name: seeded random array} for LiteRT's input details: floats uniform in
    [-1, 1), integers small and non-negative."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for d in details:
        shape, dtype = [int(s) for s in d["shape"]], np.dtype(d["dtype"])
        if dtype.kind == "f":
            feeds[d["name"]] = rng.uniform(-1, 1, shape).astype(dtype)
        else:
            feeds[d["name"]] = rng.integers(0, min(np.iinfo(dtype).max, 127), shape, endpoint=True).astype(dtype)
    return feeds


# -- LiteRT ----------------------------------------------------------------------------------
def litert(path, threads, xnnpack=True):
    """(seconds from Interpreter(...) through the first invoke, run(feeds) -> {output: array},
    its input details) of a new LiteRT interpreter of `path`, with its default XNNPACK
    delegate or its builtin kernels alone."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    resolver = OpResolverType.AUTO if xnnpack else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    start = time.perf_counter()
    interp = Interpreter(model_path=str(path), num_threads=threads, experimental_op_resolver_type=resolver)
    interp.allocate_tensors()
    signatures = interp.get_signature_list()
    if signatures:  # its first signature def, by the names edgeflow's signature has too
        runner = interp.get_signature_runner(next(iter(signatures)))
        ins = [dict(d, name=name) for name, d in runner.get_input_details().items()]
        runner(**{d["name"]: np.zeros(d["shape"], d["dtype"]) for d in ins})
        return time.perf_counter() - start, lambda feeds: runner(**feeds), ins
    ins, outs = interp.get_input_details(), interp.get_output_details()
    for d in ins:
        interp.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    interp.invoke()
    first = time.perf_counter() - start
    index = {d["name"]: d["index"] for d in ins}

    def run(feeds):
        for name, value in feeds.items():
            interp.set_tensor(index[name], value)
        interp.invoke()
        return {d["name"]: interp.get_tensor(d["index"]) for d in outs}
    return first, run, ins


def litert_spread(path, threads, xnnpack, feeds, theirs):
    """LiteRT's own spread: the worst max|other - theirs| / max|theirs| of its other kernel
    set (builtin kernels against XNNPACK's `theirs`, or the reverse); None where that one
    does not run the model (MediaPipe's custom ops are XNNPACK's alone)."""
    try:
        other = litert(path, threads, not xnnpack)[1]
        return agreement(other(feeds), theirs)[1]
    except RuntimeError:
        return None


def agreement(ours, theirs):
    """(worst output name, its max|ours - theirs| / max|theirs|); outputs matched by name,
    else by position."""
    if set(ours) != set(theirs):
        ours = dict(zip(theirs, ours.values()))
    worst = (None, 0.0)
    for name, ref in theirs.items():
        ref = np.asarray(ref, np.float64)
        got = np.asarray(ours[name], np.float64)
        if got.shape != ref.shape:
            return name, float("inf")
        err = float(np.max(np.abs(got - ref))) / max(float(np.max(np.abs(ref))), 1e-30) if ref.size else 0.0
        if not err <= worst[1]:  # NaN counts as the worst
            worst = (name, err)
    return worst


# -- the benchmark ---------------------------------------------------------------------------
def first_line(exc):
    """The error's type and first line, and the op types an UnsupportedOpError lists."""
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0] if text else ''}"
    ops = sorted({str(op[0]) for op in getattr(exc, "ops", ())})
    return f"{line} {', '.join(ops)}" if ops else line


def mediapipe_reference(python, path, efl):
    """(feeds, {output name: array}): MediaPipe's own outputs for model `path`
    (benchmarks/mediapipe_reference.py run by `python`), on the input tensor it made."""
    runner = ef.Interpreter(efl).get_signature_runner("infer")
    ins, outs = runner.get_input_details(), runner.get_output_details()  # {signature name: details}
    if len(ins) != 1 or [len(d["shape"]) for d in ins.values()] != [4] or next(iter(ins.values()))["shape"][-1] != 3:
        raise ValueError(f"the MediaPipe reference takes one RGB image input, the model has {len(ins)} input(s)")
    name, shape = next((k, d["shape"]) for k, d in ins.items())
    height, width = int(shape[1]), int(shape[2])
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "reference.npz"
        subprocess.run([python, str(pathlib.Path(__file__).with_name("mediapipe_reference.py")), str(path), str(out),
                        "--outputs", str(len(outs)), "--height", str(height), "--width", str(width)],
                       check=True, capture_output=True)
        with np.load(out) as data:
            feeds = {name: data["input"]}
            theirs = {k: data[f"output_{i}"].reshape(d["shape"]) for i, (k, d) in enumerate(outs.items())}
    return feeds, theirs


def measure(path, efl, threads, runs, xnnpack, mediapipe_python=None):
    """(cells of the table from "cold plan ms" to the worst output, edgeflow/LiteRT ratio,
    max rel err, LiteRT spread) of one converted model at `threads`; against MediaPipe's
    own graph (no ratio) where LiteRT cannot run it and `mediapipe_python` is given."""
    try:
        lite_first, lite_run, details = litert(path, threads, xnnpack)
    except RuntimeError:  # "Encountered unresolved custom op"
        if not mediapipe_python:
            raise
        feeds, theirs = mediapipe_reference(mediapipe_python, path, efl)
        cold = first_run(efl, threads, feeds)[0]
        plan, first, runner = first_run(efl, threads, feeds)
        output, worst = agreement(runner(**feeds), theirs)
        t = harness.medians({"edgeflow": lambda: runner(**feeds)}, runs, warmup=2)
        cells = [harness.ms(cold, 1), harness.ms(plan, 1), harness.ms(first, 1), "-", harness.ms(t["edgeflow"], 2),
                 "-", "-", f"{worst:.1e}", "-", "yes" if worst <= AGREE else "NO", f"{output} (against MediaPipe)"]
        return cells, None, worst, None
    feeds = random_inputs(details)
    key = next(iter(ef.Interpreter(efl).get_signature_list()))  # TFLite's first signature def, or infer
    cold = first_run(efl, threads, feeds, key)[0]  # this model's kernels new to the process
    plan, first, runner = first_run(efl, threads, feeds, key)
    theirs = lite_run(feeds)
    output, worst = agreement(runner(**feeds), theirs)
    spread = litert_spread(path, threads, xnnpack, feeds, theirs)
    t = harness.medians({"edgeflow": lambda: runner(**feeds), "litert": lambda: lite_run(feeds)}, runs, warmup=2)
    cells = [harness.ms(cold, 1), harness.ms(plan, 1), harness.ms(first, 1), harness.ms(lite_first, 1),
             harness.ms(t["edgeflow"], 2), harness.ms(t["litert"], 2), harness.ratio(t["edgeflow"], t["litert"]),
             f"{worst:.1e}", "-" if spread is None else f"{spread:.1e}", "yes" if worst <= AGREE else "NO", output]
    return cells, t["edgeflow"] / t["litert"], worst, spread


def bench(models, runs, threads_list, converts, folder, xnnpack=True, mediapipe_python=None):
    """models: {name: .tflite path}. (table rows, models converted, models agreeing within
    AGREE at every thread count, models within LiteRT's own spread only, {threads: ratios})."""
    from edgeflow.converters import tflite
    rows, converted, agreed, spreads, ratios = [], 0, 0, 0, {t: [] for t in threads_list}
    for name, path in models.items():
        efl = folder / f"{name}.efl"
        try:
            times = []
            for _ in range(converts):
                start = time.perf_counter()
                result = tflite.convert(path, efl)
                times.append(time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 -- a model that does not convert is a row, not a crash
            rows.append([name, "-", "-", f"{path.stat().st_size / 1e6:.2f}", *["-"] * 12, first_line(exc)])
            harness.log(f"{name}: does not convert: {first_line(exc)}")
            continue
        converted += 1
        convert = harness.median(times)
        sizes = [f"{result.source_bytes / 1e6:.2f}", f"{result.efl_bytes / 1e6:.2f}",
                 f"{result.efl_bytes / result.source_bytes:.3f}"]
        harness.log(f"{name}: converted in {convert:.2f} s")
        agrees = within_spread = True
        for threads in threads_list:
            head = [name, threads, f"{convert:.2f}", *sizes]
            try:
                cells, r, worst, spread = measure(path, efl, threads, runs, xnnpack, mediapipe_python)
            except Exception as exc:  # noqa: BLE001 -- a model that fails to run is a row, not a crash
                rows.append([*head, *["-"] * 10, first_line(exc)])
                harness.log(f"  {threads} thread(s): {first_line(exc)}")
                agrees = within_spread = False
                continue
            agrees &= worst <= AGREE
            within_spread &= worst <= AGREE or (spread is not None and worst <= spread)
            if r is not None:
                ratios[threads].append(r)
            rows.append(head + cells)
            harness.log("  " + "  ".join(str(c) for c in rows[-1]))
        agreed += agrees
        spreads += within_spread and not agrees
    return rows, converted, agreed, spreads, ratios


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help=f"of {','.join(MODELS)} (default all)")
    parser.add_argument("--runs", type=int, default=50, help="timed runs of each runtime (default 50)")
    parser.add_argument("--threads", default="1", help="thread counts, for both (default 1)")
    parser.add_argument("--converts", type=int, default=3, help="conversions timed per model (default 3)")
    parser.add_argument("--no-xnnpack", action="store_true",
                        help="LiteRT with its builtin kernels alone, not its default XNNPACK delegate")
    parser.add_argument("--cache", default=None, help="folder of the suite's .tflite files (default "
                        f"$EDGEFLOW_BENCH_CACHE or ~/.cache/edgeflow-bench, then mediapipe-{MEDIAPIPE} or "
                        f"litert-torch-{LITERT_TORCH})")
    parser.add_argument("--mediapipe-python", default=None, metavar="PATH",
                        help="a Python with mediapipe==0.10.14: the reference for models LiteRT cannot run "
                             "(MediaPipe's custom ops)")
    parser.add_argument("--suite", choices=("mediapipe", "litert-torch"), default="mediapipe",
                        help="MediaPipe's models (default), or PyTorch models exported by litert-torch")
    parser.add_argument("--litert-torch-python", default=None, metavar="PATH",
                        help=f"a Python with litert-torch=={LITERT_TORCH}, torchvision and transformers: exports "
                             "the litert-torch suite's models (once)")
    args = parser.parse_args()
    from litert_torch_export import MODELS as TORCH_MODELS
    known = MODELS if args.suite == "mediapipe" else TORCH_MODELS
    names = [m for m in args.models.split(",") if m] or list(known)
    unknown = [m for m in names if m not in known]
    if unknown:
        parser.error(f"unknown model(s) {unknown}: of {','.join(known)}")
    threads_list = [int(x) for x in args.threads.split(",") if x]
    cache = pathlib.Path(args.cache) if args.cache else default_cache(args.suite)
    if args.suite == "mediapipe":
        available = fetch_models(cache)
        missing = [m for m in names if m not in available]
        if missing:
            sys.exit(f"not in the mediapipe {MEDIAPIPE} wheel's files: {missing}")
    else:
        available = export_litert_torch(cache, names, args.litert_torch_python)
    start = time.perf_counter()
    try:
        importlib.import_module("numba")  # edgeflow's JIT kernels import it at their first plan, once per process
        numba_note = f"numba's import, once per process and in no plan: {harness.ms(time.perf_counter() - start, 0)} ms"
    except ImportError:
        numba_note = "numba not installed"
    source = f"MediaPipe {MEDIAPIPE}'s models" if args.suite == "mediapipe" else \
        f"PyTorch models exported by litert-torch {LITERT_TORCH}"
    print(f"{source}, edgeflow against LiteRT "
          f"({'builtin kernels' if args.no_xnnpack else 'its default XNNPACK delegate'}); medians of {args.runs} "
          f"interleaved runs, convert time the median of {args.converts}; {numba_note}; agreement "
          "max|edgeflow - LiteRT| / max|LiteRT| of the worst output\n", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows, converted, agreed, spreads, ratios = bench({m: available[m] for m in names}, args.runs, threads_list,
                                                args.converts, pathlib.Path(tmp), not args.no_xnnpack,
                                                args.mediapipe_python)
    columns = ["model", "threads", "convert s", ".tflite MB", ".efl MB", "efl/tflite", "cold plan ms", "plan ms",
               "first run ms", "LiteRT first ms", "edgeflow ms", "LiteRT ms", "ratio", "max rel err", "LiteRT spread",
               f"within {AGREE:g}", "worst output / error"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" if i == 0 or i == len(columns) - 1 else "---:" for i in range(len(columns))) + "|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    medians = ", ".join(f"{harness.median(r):.2f}x at {t} thread(s)" if r else f"- at {t} thread(s)"
                        for t, r in ratios.items())
    more = f" (and {spreads} more within LiteRT's own spread)" if spreads else ""
    print(f"\n{converted}/{len(names)} convert; {agreed}/{converted} agree within {AGREE:g} at every thread "
          f"count{more}; median edgeflow/LiteRT latency {medians}")


if __name__ == "__main__":
    main()
