"""Arguments several verbs share: inputs from .npy files, --accel, --cloud, shapes and counts."""
import argparse
import sys
import zipfile

import numpy as np

from ..errors import EdgeflowError


def add_inputs_args(p):
    p.add_argument("--signature", "-s", help="signature key (default: the only one, or 'infer')")
    p.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy|FILE.npz",
                   help="an input array from a .npy file, or every array of an .npz file (its keys "
                        "are the input names); repeat as needed")


def parse_inputs(items):
    """{name: array} from NAME=FILE.npy and FILE.npz items (an .npz's keys name its arrays)."""
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep and item.endswith(".npz"):
            out.update(_load_npz(item))
            continue
        if not sep or not name or not path:
            raise EdgeflowError(f"--input expects NAME=FILE.npy or FILE.npz, got {item!r}")
        try:
            value = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
            raise EdgeflowError(f"--input {name}: cannot read {path!r} as .npy ({e})") from None
        if not isinstance(value, np.ndarray):
            value.close()
            raise EdgeflowError(f"--input {name}: {path!r} is an .npz archive; pass it as -i {path}")
        out[name] = value
    return out


def _load_npz(path):
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise EdgeflowError(f"--input: cannot read {path!r} as .npz ({e})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise EdgeflowError(f"--input: {path!r} holds one array, not an .npz archive; pass it as "
                            "NAME=FILE")
    with archive:
        try:
            return {k: archive[k] for k in archive.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # a corrupt member
            raise EdgeflowError(f"--input: cannot read {path!r} as .npz ({e})") from None


def parse_shapes(items):
    """{input name: shape} from NAME=D1,D2,... items."""
    out = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            out[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            sep = ""
        if not sep or not name:
            raise EdgeflowError(f"--input-shape expects NAME=D1,D2,..., got {item!r}")
    return out


def add_accel_args(p):
    p.add_argument("--accel", choices=["none", "opencl", "auto"], default="none",
                   help="run supported ops on an OpenCL device (opencl), on one if there is one "
                        "(auto), or with numpy only (none, the default)")
    p.add_argument("--device", metavar="NAME",
                   help="with --accel: the OpenCL device, a name substring or an index "
                        "(default: EDGEFLOW_OPENCL_DEVICE, else the first GPU, else the first device)")
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp32",
                   help="with --accel: how the OpenCL device stores float tensors: fp32 (the default), or "
                        "fp16 (half: half the device memory and traffic, math still in float32, results "
                        "within about 1e-3 relative)")


def delegates(args):
    """The delegates --accel asks for; 'auto' without a device says so on stderr."""
    from ..accel import delegates_for
    found = delegates_for(args.accel, args.device, args.precision)
    if args.accel == "auto":
        print(f"edgeflow {args.verb}: " + (f"using OpenCL on {found[0].device_name}" if found
                                            else "no OpenCL device found: running with numpy"),
              file=sys.stderr)
    return found


def add_cloud_args(p):
    p.add_argument("--cloud", metavar="HOST:PORT",
                   help="a device package from `edgeflow split`: run (or train) its cloud part on "
                        "this server")
    p.add_argument("--token-file", metavar="FILE",
                   help="with --cloud: the server's bearer token (the file's first line: TOKEN, or "
                        "TOKEN DEVICE_ID for a per-device token, whose device id is then the default)")
    p.add_argument("--root-cert", metavar="PEM", help="with --cloud: use TLS, trusting this certificate")
    p.add_argument("--tls-client-cert", metavar="PEM",
                   help="with --root-cert: this device's certificate, for a server that requires client "
                        "certificates (with --tls-client-key; its CN is the device id)")
    p.add_argument("--tls-client-key", metavar="PEM", help="the client certificate's private key")
    p.add_argument("--adapt", action=argparse.BooleanOptionalAction, default=None,
                   help="with --cloud: let the device move the split's cut from the link it measures "
                        "(default: as the package says; `edgeflow split --cut` packages keep their cut)")


def cloud(args):
    """{"cloud", "token", "root_cert", "client_cert", "client_key", "device_id"} from --cloud,
    --token-file, --root-cert, --tls-client-cert, --tls-client-key ({} without --cloud);
    "device_id" is the one a per-device token's line names (else None)."""
    client_cert, client_key = getattr(args, "tls_client_cert", None), getattr(args, "tls_client_key", None)
    if not args.cloud:
        if args.token_file or args.root_cert or client_cert or client_key:
            raise EdgeflowError("--token-file, --root-cert and --tls-client-cert/--tls-client-key need "
                                "--cloud HOST:PORT")
        return {}
    if bool(client_cert) != bool(client_key) or (client_cert and not args.root_cert):
        raise EdgeflowError("--tls-client-cert and --tls-client-key go together, with --root-cert")
    token = device_id = None
    if args.token_file:
        token, device_id = token_line(_read_file(args.token_file, "rt"), args.token_file)
    root = _read_file(args.root_cert, "rb") if args.root_cert else None
    return {"cloud": args.cloud, "token": token, "root_cert": root, "device_id": device_id,
            "client_cert": _read_file(client_cert, "rb") if client_cert else None,
            "client_key": _read_file(client_key, "rb") if client_key else None}


def token_line(text, where):
    """(token, device id or None) of a client's token file: its first line that is not a
    comment, `TOKEN` or `TOKEN DEVICE_ID ...` (a line of the server's per-device file)."""
    for line in text.splitlines():
        fields = line.split()
        if fields and not fields[0].startswith("#"):
            return fields[0], (fields[1] if len(fields) > 1 and not fields[1].startswith("#") else None)
    raise EdgeflowError(f"--token-file {where!r} holds no token")


def cloud_delegates(args, device_id=None):
    """[a CloudDelegate] for --cloud (a device package from `edgeflow split`), else []."""
    found = cloud(args)
    if not found:
        return []
    from ..cloud import CloudDelegate
    delegate = CloudDelegate(found["cloud"], token=found["token"], root_cert=found["root_cert"],
                             device_id=device_id or found["device_id"], client_cert=found["client_cert"],
                             client_key=found["client_key"])
    delegate.adapt = getattr(args, "adapt", None)  # read by SplitRunner
    return [delegate]


def _read_file(path, mode):
    with open(path, mode) as f:
        return f.read()


def positive(text):
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def non_negative(text):
    """argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text}")
    return value
