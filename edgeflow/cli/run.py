"""`edgeflow run`: run a signature on inputs from .npy files."""
import os

import numpy as np

from .. import dtypes
from . import arguments


def add_parser(verbs):
    p = verbs.add_parser("run", help="run a signature on inputs from .npy files",
                         description="Run a signature; inputs come from .npy files.")
    p.add_argument("model", help="a .efl file")
    arguments.add_inputs_args(p)
    p.add_argument("--output-dir", "-o", help="also save each output as NAME.npy here")
    arguments.add_accel_args(p)
    arguments.add_cloud_args(p)
    p.set_defaults(fn=cmd_run)


def cmd_run(args):
    from ..interp import Interpreter
    from ..interp.inputs import pick_signature
    interp = Interpreter(args.model, delegates=arguments.cloud_delegates(args) + arguments.delegates(args))
    runner = pick_signature(interp, args.signature)
    outputs = runner(**arguments.parse_inputs(args.input))
    for name, value in outputs.items():
        print(f"{name}: {dtypes.name(value.dtype)}{list(value.shape)}")
        print(np.array2string(value, threshold=20, edgeitems=3, precision=5))
        if args.output_dir:
            os.makedirs(args.output_dir, exist_ok=True)
            np.save(os.path.join(args.output_dir, f"{name}.npy"), value)
    if args.output_dir:
        print(f"wrote {len(outputs)} output(s) to {args.output_dir}/")
