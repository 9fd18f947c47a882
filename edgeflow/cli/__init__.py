"""The `edgeflow` command. Each verb is a module here with `add_parser(verbs)` and its
`cmd_<verb>(args)`; a verb imports what it needs (onnx, grpc, scipy, pyopencl) only when run."""
import argparse
import importlib
import logging
import os
import sys

from ..errors import EdgeflowError

VERBS = ("inspect", "run", "bench", "convert", "export", "train", "quickstart", "profile", "split", "serve")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="edgeflow", description="Package, inspect, run and benchmark edgeflow models (.efl).")
    parser.add_argument("--version", action="version", version=f"edgeflow {_version()}")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                        help="log this level and up to stderr (default: warnings only; serve: info); "
                             "debug shows e.g. the OpenCL compiler's remarks")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in VERBS:
        importlib.import_module(f"{__name__}.{verb}").add_parser(verbs)
    return parser


def _version():
    from .. import __version__
    return __version__


def main(argv=None):
    """Run the command line `argv` (default sys.argv[1:]); the exit status: 0, 2 on an error."""
    args = build_parser().parse_args(argv)
    if args.log_level and args.verb != "serve":  # serve installs its own handler (--log-format)
        logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        args.fn(args)
    except BrokenPipeError:  # `edgeflow inspect m.efl | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (EdgeflowError, OSError) as e:
        print(f"edgeflow {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
