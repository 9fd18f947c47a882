"""`edgeflow train`: train on the device through the train signature, split with a server or
with a parameter server."""
import os

import numpy as np

from ..errors import EdgeflowError
from . import arguments
from .arguments import positive
from .progress import progress


def add_parser(verbs):
    p = verbs.add_parser("train", help="train a model on the device through its train signature",
                         description="Train through the model's 'train' signature on arrays from "
                                     "an .npz file (keys = the signature's input names), with "
                                     "checkpoints to resume from.")
    p.add_argument("model", help="a trainable .efl file")
    p.add_argument("--data", required=True, help=".npz with one array per train input")
    p.add_argument("--epochs", type=positive, default=1)
    p.add_argument("--batch-size", type=positive, default=32)
    p.add_argument("--seed", type=int, default=0, help="data order seed (default 0)")
    p.add_argument("--checkpoint-dir", help="save checkpoints here and resume from the last one")
    p.add_argument("--checkpoint-every", type=positive, default=50, help="steps between checkpoints")
    p.add_argument("-o", "--output", help="export the trained model to this .efl")
    arguments.add_accel_args(p)
    arguments.add_cloud_args(p)
    p.add_argument("--device-id", help="with --cloud: this device's id on the server (default: random); "
                                       "keep it to resume after a restart")
    p.add_argument("--mode", choices=["split", "sync", "async", "fedavg"], default="split",
                   help="with --cloud: split (a device package from `edgeflow split --train`, the "
                        "default), or with a parameter server: sync, async, or fedavg (--epochs rounds "
                        "of --local-epochs each)")
    p.add_argument("--local-epochs", type=positive, default=1, help="with --mode fedavg: epochs per round")
    p.add_argument("--model-id", help="with sync/async/fedavg: the model's id on the server (default: "
                                      "the file name)")
    p.set_defaults(fn=cmd_train)


def cmd_train(args):
    from .. import training_loop
    from ..interp import Interpreter
    if args.mode != "split":
        return _train_with_parameter_server(args, _load_npz(args.data))
    if args.device_id and not args.cloud:
        raise EdgeflowError("--device-id needs --cloud HOST:PORT")
    interp = Interpreter(args.model, delegates=arguments.cloud_delegates(args, args.device_id)
                         + arguments.delegates(args))
    if "train" not in interp.get_signature_list():
        raise EdgeflowError(f"{args.model} has no 'train' signature; make one with ef.save(..., "
                            "signatures={'train': ...}) or edgeflow convert --trainable")
    data = _load_npz(args.data)
    n = len(next(iter(data.values()))) if data else 0
    steps = args.epochs * -(-n // args.batch_size)
    bar = progress(steps, "training")

    def on_step(epoch, step, loss):
        bar.update(1)
        bar.set_postfix(epoch=epoch + 1, loss=f"{loss:.4f}")
    history = training_loop.fit(interp, data, args.epochs, args.batch_size, args.seed, args.checkpoint_dir,
                          args.checkpoint_every, on_step)
    bar.close()
    if history:
        print(f"trained {len(history)} steps: loss {history[0][1]:.4f} -> {history[-1][1]:.4f}")
    else:
        print("nothing to do: the checkpoint is already at the last epoch")
    if args.output:
        interp.export(args.output)
        print(f"wrote the trained model to {args.output}")


def _train_with_parameter_server(args, data):
    """edgeflow train --mode sync|async|fedavg: push gradients (or models) to the server."""
    from ..cloud.ps import ParameterClient, train
    if not args.cloud:
        raise EdgeflowError(f"--mode {args.mode} needs --cloud HOST:PORT (a parameter server: "
                            "edgeflow serve --parameter-server MODE)")
    cloud = arguments.cloud(args)
    model_id = args.model_id or os.path.splitext(os.path.basename(args.model))[0]
    device_id = args.device_id or cloud["device_id"] or f"device-{os.getpid()}"
    n = len(next(iter(data.values()))) if data else 0
    total = args.epochs if args.mode == "fedavg" else args.epochs * -(-n // args.batch_size)
    bar = progress(total, f"training ({args.mode})")

    def on_step(record):
        bar.update(1)
        bar.set_postfix(loss=f"{record['loss']:.4f}", version=record["version"])
    options = dict(batch_size=args.batch_size, seed=args.seed, on_step=on_step)
    if args.mode == "fedavg":
        options.update(rounds=args.epochs, local_epochs=args.local_epochs)
    else:
        options.update(epochs=args.epochs)
    with ParameterClient(args.cloud, token=cloud["token"], root_cert=cloud["root_cert"],
                         client_cert=cloud["client_cert"], client_key=cloud["client_key"]) as client:
        history = train(args.model, data, client, model_id, device_id, args.mode, **options)
    bar.close()
    if history:
        print(f"trained {len(history)} {'rounds' if args.mode == 'fedavg' else 'steps'} as {device_id!r}: "
              f"loss {history[0]['loss']:.4f} -> {history[-1]['loss']:.4f}")


def _load_npz(path):
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {k: archive[k] for k in archive.files}
    except (OSError, ValueError) as e:
        raise EdgeflowError(f"--data: cannot read {path!r} as .npz ({e})") from None
