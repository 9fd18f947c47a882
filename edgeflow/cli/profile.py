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
                              device=args.name, input_shapes=arguments.parse_shapes(args.input_shape) or None)
    profile.save(args.output)
    total = sum(profile.seconds.values())
    print(f"profiled {len(profile.seconds)} ops of {args.model} on {profile.device}: "
          f"{total * 1e3:.3f} ms per run (per-op medians of {profile.runs} runs) -> {args.output}")
