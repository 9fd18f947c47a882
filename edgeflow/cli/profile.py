"""`edgeflow profile`: time every op of a model on this machine, for the split planner."""
from . import arguments
from .arguments import positive


def add_parser(verbs):
    p = verbs.add_parser("profile", help="time every op of a model here, for the split planner",
                         description="Run a signature and time every op (medians); write a profile "
                                     "that `edgeflow split --device-profile/--server-profile` reads. "
                                     "Run it on the device and on the server.")
    p.add_argument("model", help="a .efl file")
    p.add_argument("-o", "--output", required=True, help="the profile JSON to write")
    arguments.add_inputs_args(p)
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D1,D2,...",
                   help="random inputs of this shape (default: declared, dynamic dimensions 1)")
    p.add_argument("--runs", type=positive, help="timed runs (default 20)")
    p.add_argument("--scale", choices=("runs", "none"), default="runs",
                   help="runs (default): scale the per-op medians to add up to the median whole "
                        "run, which counts what timing ops alone misses (a CPU quota's "
                        "throttling, dispatch between ops); none: the per-op medians as measured")
    p.add_argument("--name", help="what to call this machine in the profile (default: its hostname "
                                  "and processor)")
    arguments.add_accel_args(p)
    p.set_defaults(fn=cmd_profile)


def cmd_profile(args):
    from ..splitter import measure_profile
    from ..splitter.profiles import DEFAULT_RUNS
    profile = measure_profile(args.model, signature=args.signature or "infer",
                              inputs=arguments.parse_inputs(args.input) or None,
                              runs=args.runs or DEFAULT_RUNS, delegates=arguments.delegates(args),
                              device=args.name, input_shapes=arguments.parse_shapes(args.input_shape) or None,
                              scale=args.scale)
    profile.save(args.output)
    op_sum = sum(profile.seconds.values()) / profile.scale
    scaled = f", scaled x{profile.scale:.2f} to the whole run" if args.scale == "runs" else ""
    print(f"profiled {len(profile.seconds)} ops of {args.model} on {profile.device}: "
          f"{profile.total * 1e3:.3f} ms per run, {op_sum * 1e3:.3f} ms in ops (medians of "
          f"{profile.runs} runs{scaled}) -> {args.output}")
