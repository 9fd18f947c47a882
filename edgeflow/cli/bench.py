"""`edgeflow bench`: time a model the way TFLite's benchmark_model does."""
import json
import time

import numpy as np

from ..interp.inputs import pick_signature, random_inputs
from . import arguments


def bench_model(path, runs=50, warmup=3, signature=None, inputs=None, top=10, delegates=(), threads=None,
                shapes=None, jit=None):
    """Init time, first run, steady-state statistics (ms), arena bytes and the slowest ops.

    Steady-state runs are timed without the profiler; a separate profiled pass of the
    same length attributes time to ops, so profiling does not inflate the totals. `threads`:
    the Interpreter's num_threads (None: numpy's BLAS decides); `shapes` {input: shape} for
    the random inputs not given in `inputs` (default: the declared shapes, dynamic dims 1). With
    `delegates`, also where ops run and the host<->device copies per run (a split model
    runs with an edgeflow.cloud.CloudDelegate among them). `jit`: the Interpreter's.
    """
    from ..accel import transfers
    from ..interp import Interpreter
    from ..interp.kernels import jit as jit_kernels

    t0 = time.perf_counter()
    interp = Interpreter(path, delegates=delegates, num_threads=threads, jit=jit)
    init_s = time.perf_counter() - t0
    runner = pick_signature(interp, signature)
    feed = random_inputs(runner, inputs or {}, shapes=shapes)

    t0 = time.perf_counter()
    runner(**feed)
    first_s = time.perf_counter() - t0
    jit_kernels.wait()  # numba's background load (a first plan bound without it), before the runs
    for _ in range(warmup):
        runner(**feed)
    times = np.empty(runs)
    copied = transfers(delegates)
    for r in range(runs):
        t0 = time.perf_counter()
        runner(**feed)
        times[r] = time.perf_counter() - t0
    uploads, downloads = (n - before for n, before in zip(transfers(delegates), copied))
    profiler = interp.enable_profiling()
    for _ in range(runs):
        runner(**feed)
    interp.profiler = None
    plan = runner.last_plan
    ms = times * 1e3
    profiled_total = sum(r.total_ns for r in profiler.records.values()) or 1
    result = {
        "model": str(path),
        "signature": runner.key,
        "input_shapes": {n: list(v.shape) for n, v in feed.items()},
        "ops": len(plan.order),
        "threads": threads,
        "jit": JIT_NAMES[jit],
        "init_ms": init_s * 1e3,
        "first_run_ms": first_s * 1e3,
        "runs": runs,
        "mean_ms": float(ms.mean()),
        "std_ms": float(ms.std()),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "min_ms": float(ms.min()),
        "arena_bytes": plan.arena.nbytes,
        "top_ops": [{"op": r.index, "type": r.opcode, "output": r.output,
                     "mean_ms": r.mean_us / 1e3, "percent": 100.0 * r.total_ns / profiled_total}
                    for r in profiler.top(top)],
        "by_type": {op: {"calls_per_run": calls / runs, "ms_per_run": ns / runs / 1e6,
                         "percent": 100.0 * ns / profiled_total}
                    for op, (calls, ns) in sorted(profiler.by_opcode().items(),
                                                 key=lambda kv: -kv[1][1])},
    }
    if delegates:
        result["placement"] = plan.placement_summary()
        result["uploads_per_run"] = uploads / runs
        result["downloads_per_run"] = downloads / runs
    return result


JIT_MODES = {"auto": None, "on": True, "off": False}  # --jit: the Interpreter's jit
JIT_NAMES = {mode: name for name, mode in JIT_MODES.items()}


def ms(value):
    """A time in ms with three significant digits or more: 0.0123, 1.23, 12.3, 123."""
    return f"{value:.{max(0, 2 - int(np.floor(np.log10(value))))}f}" if value > 0 else "0"


def render(r):
    lines = [
        f"{r['model']} [{r['signature']}] inputs {r['input_shapes']}, {r['ops']} ops, "
        f"{'threads as numpy BLAS decides' if r['threads'] is None else str(r['threads']) + ' thread(s)'}, "
        f"jit {r['jit']}",
        f"  init {ms(r['init_ms'])} ms, first run {ms(r['first_run_ms'])} ms",
        f"  {r['runs']} runs (ms): mean {ms(r['mean_ms'])}, std {ms(r['std_ms'])}, "
        f"p50 {ms(r['p50_ms'])}, p99 {ms(r['p99_ms'])}, min {ms(r['min_ms'])}",
        f"  arena {r['arena_bytes']:,} bytes",
    ]
    if "placement" in r:
        lines.append(f"  placement: {r['placement']}; per run {r['uploads_per_run']:g} upload(s), "
                     f"{r['downloads_per_run']:g} download(s) host<->device")
    lines.append("  top ops by time (ms per call):")
    lines += [f"    {o['percent']:5.1f}%  {ms(o['mean_ms']):>8}  {o['type']:12} -> {o['output']}"
              for o in r["top_ops"]]
    lines.append("  by op type (ms per run):")
    lines += [f"    {v['percent']:5.1f}%  {ms(v['ms_per_run']):>8}  {op} x{v['calls_per_run']:g}"
              for op, v in r["by_type"].items()]
    return "\n".join(lines)


def add_parser(verbs):
    p = verbs.add_parser("bench", help="time a model as TFLite's benchmark_model does",
                         description="Time init, first run and steady-state runs; inputs not "
                                     "given are random, of --input-shape or the declared shapes "
                                     "with dynamic dimensions 1.",
                         epilog="example: edgeflow bench mobilenet.efl --threads 2 --input-shape "
                                "input=8,3,224,224 --runs 20")
    p.add_argument("model", help="a .efl file")
    arguments.add_inputs_args(p)
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D1,D2,...",
                   help="the shape of a random input (default: as declared, dynamic dims 1); repeat "
                        "for each input")
    p.add_argument("--runs", type=arguments.positive, default=50, help="timed runs (default 50)")
    p.add_argument("--warmup", type=arguments.non_negative, default=3, help="untimed runs first (default 3)")
    p.add_argument("--top", type=arguments.positive, default=10, help="ops to list by time (default 10)")
    p.add_argument("--threads", type=arguments.positive, metavar="N",
                   help="threads the interpreter splits big ops over, each with one BLAS thread "
                        "(default: as numpy's BLAS decides)")
    p.add_argument("--jit", choices=JIT_MODES, default="auto",
                   help="numba's compiled loops: auto (default: the kernels that gain much, and plans "
                        "of 2 GFLOP a run or more, import numba), on (imported up front: every kernel's "
                        "loop; a slower first run), off")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    arguments.add_accel_args(p)
    arguments.add_cloud_args(p)
    p.set_defaults(fn=cmd_bench)


def cmd_bench(args):
    result = bench_model(args.model, runs=args.runs, warmup=args.warmup, signature=args.signature,
                         inputs=arguments.parse_inputs(args.input), top=args.top,
                         delegates=arguments.cloud_delegates(args) + arguments.delegates(args),
                         threads=args.threads, shapes=arguments.parse_shapes(args.input_shape),
                         jit=JIT_MODES[args.jit])
    print(json.dumps(result, indent=2) if args.json else render(result))
