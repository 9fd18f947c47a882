"""`edgeflow train`: train on the device through the train signature, split with a server or
with a parameter server."""
import os

import numpy as np

from ..errors import EdgeflowError, InvalidInputError
from . import arguments
from .arguments import positive
from .progress import progress

HISTOGRAM_EVERY = 100


def add_parser(verbs):
    p = verbs.add_parser("train", help="train a model on the device through its train signature",
                         description="Train through the model's 'train' signature on --data (an "
                                     ".npz file, a folder of .npy files or a folder of images, read "
                                     "lazily, so larger than memory is fine), with checkpoints to "
                                     "resume from.")
    p.add_argument("model", help="a trainable .efl file")
    p.add_argument("--data", required=True,
                   help="an .npz with one array per train input (keys = input names; memory-mapped when "
                        "saved with np.savez); a folder of NAME.npy files (memory-mapped) or NAME/ folders "
                        "of one .npy per example; or a folder of images (Pillow), in class subfolders for "
                        "an integer label input, resized to the image input's size, scaled to [0, 1] for "
                        "a float input")
    p.add_argument("--epochs", type=positive, default=1)
    p.add_argument("--batch-size", type=positive, default=32)
    p.add_argument("--seed", type=int, default=0, help="data order seed (default 0)")
    p.add_argument("--checkpoint-dir", help="save checkpoints here and resume from the last one")
    p.add_argument("--checkpoint-every", type=positive, default=50, help="steps between checkpoints")
    p.add_argument("--steps", type=positive, help="stop after this global step (a later run with "
                                                  "--checkpoint-dir goes on from there); not with fedavg")
    p.add_argument("-o", "--output", help="export the trained model to this .efl")
    p.add_argument("--logdir", metavar="DIR",
                   help="write TensorBoard event files into DIR (tensorboard --logdir DIR): each step's loss "
                        "and other one-value outputs (the learning rate, ef.summary.scalar), steps per second, "
                        "and every --histogram-every steps histograms of the weights, their gradients and "
                        "ef.summary.histogram outputs; needs pip install 'edgeflow[tensorboard]'")
    p.add_argument("--histogram-every", type=positive, metavar="N",
                   help=f"with --logdir: steps between histograms (default {HISTOGRAM_EVERY})")
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
    if args.histogram_every and not args.logdir:
        raise EdgeflowError("--histogram-every goes with --logdir DIR")
    if args.mode != "split":
        if args.logdir:
            raise EdgeflowError(f"--logdir is for on-device and split training, not --mode {args.mode}")
        return _train_with_parameter_server(args, _dataset(args, Interpreter(args.model)))
    if args.device_id and not args.cloud:
        raise EdgeflowError("--device-id needs --cloud HOST:PORT")
    interp = Interpreter(args.model, delegates=arguments.cloud_delegates(args, args.device_id)
                         + arguments.delegates(args))
    if "train" not in interp.get_signature_list():
        raise EdgeflowError(f"{args.model} has no 'train' signature; make one with ef.save(..., "
                            "signatures={'train': ...}) or edgeflow convert --trainable")
    data = _dataset(args, interp)
    steps = args.epochs * data.cardinality()
    bar = progress(min(steps, args.steps or steps), "training")

    def on_step(epoch, step, loss):
        bar.update(1)
        bar.set_postfix(epoch=epoch + 1, loss=f"{loss:.4f}")
    logger = _logger(args)
    try:
        history = training_loop.fit(interp, data, epochs=args.epochs, checkpoint_dir=args.checkpoint_dir,
                                    checkpoint_every=args.checkpoint_every, on_step=on_step, steps=args.steps,
                                    logger=logger)
    finally:
        if logger is not None:
            logger.close()
    bar.close()
    if history:
        print(f"trained {len(history)} steps: loss {history[0][1]:.4f} -> {history[-1][1]:.4f}")
    else:
        print("nothing to do: the checkpoint is already at the last epoch")
    if args.output:
        interp.export(args.output)
        print(f"wrote the trained model to {args.output}")


def _logger(args):
    """The TensorBoardLogger --logdir asks for, or None."""
    if not args.logdir:
        return None
    from ..tensorboard import TensorBoardLogger
    return TensorBoardLogger(args.logdir, histogram_every=args.histogram_every or HISTOGRAM_EVERY)


def _train_with_parameter_server(args, data):
    """edgeflow train --mode sync|async|fedavg: push gradients (or models) to the server."""
    from ..cloud.ps import ParameterClient, train
    if not args.cloud:
        raise EdgeflowError(f"--mode {args.mode} needs --cloud HOST:PORT (a parameter server: "
                            "edgeflow serve --parameter-server MODE)")
    cloud = arguments.cloud(args)
    model_id = args.model_id or os.path.splitext(os.path.basename(args.model))[0]
    device_id = args.device_id or cloud["device_id"] or f"device-{os.getpid()}"
    if args.steps and args.mode == "fedavg":
        raise EdgeflowError("--steps is for split, sync and async training; fedavg trains --epochs rounds")
    total = args.epochs if args.mode == "fedavg" else args.steps or args.epochs * data.cardinality()
    bar = progress(total, f"training ({args.mode})")

    def on_step(record):
        bar.update(1)
        bar.set_postfix(loss=f"{record['loss']:.4f}", version=record["version"])
    options = dict(on_step=on_step)
    if args.mode == "fedavg":
        options.update(rounds=args.epochs, local_epochs=args.local_epochs)
    elif args.steps:
        options.update(steps=args.steps)
    else:
        options.update(epochs=args.epochs)
    with ParameterClient(args.cloud, token=cloud["token"], root_cert=cloud["root_cert"],
                         client_cert=cloud["client_cert"], client_key=cloud["client_key"]) as client:
        history = train(args.model, data, client, model_id, device_id, args.mode, **options)
    bar.close()
    if history:
        print(f"trained {len(history)} {'rounds' if args.mode == 'fedavg' else 'steps'} as {device_id!r}: "
              f"loss {history[0]['loss']:.4f} -> {history[-1]['loss']:.4f}")


def _dataset(args, interp):
    """--data as an ef.data.Dataset of the train signature's batches: shuffled by --seed (a
    permutation per epoch, of indices: the data stays on disk), batches of --batch-size,
    read a step ahead on a background thread."""
    from ..graph.data import Dataset
    path, inputs = args.data, interp.get_signature_runner("train").get_input_details()
    if os.path.isfile(path):
        data = Dataset.from_npz(path)
    elif not os.path.isdir(path):
        raise InvalidInputError(f"--data: expected an .npz file, a folder of .npy files or a folder of images; "
                                f"{path!r} does not exist")
    elif _has_npy(path):
        data = Dataset.from_npy_folder(path)
    else:
        data = _images(Dataset, path, inputs)
    return data.shuffle(max(len(data), 1), seed=args.seed).batch(args.batch_size).prefetch(2)


def _has_npy(folder):
    entries = [os.path.join(folder, e) for e in os.listdir(folder)]
    return any(e.endswith(".npy") for e in entries) or any(
        os.path.isdir(e) and any(f.endswith(".npy") for f in os.listdir(e)) for e in entries)


def _images(Dataset, path, inputs):
    """A folder of images as elements of the train inputs: the image input (shape [N, H, W,
    C], [N, C, H, W] or [N, H, W]) and, from class subfolders, the integer label input."""
    names = sorted(inputs)
    labels = [n for n in names if np.issubdtype(inputs[n]["dtype"], np.integer)]
    expected = ("a folder of images feeds a train signature of an image input, [N, H, W, C], [N, C, H, W] or "
                "[N, H, W], and, from class subfolders, an integer label input")
    if len(names) == 1:
        image, label = names[0], None
    elif len(names) == 2 and len(labels) == 1:
        label = labels[0]
        image = next(n for n in names if n != label)
    else:
        raise InvalidInputError(f"--data: {expected}; the train signature takes " + ", ".join(
            f"{n}: {np.dtype(inputs[n]['dtype']).name}{list(inputs[n]['shape_signature'])}" for n in names))
    shape = [int(d) for d in inputs[image]["shape_signature"]]
    channels_first = len(shape) == 4 and shape[1] in (1, 3, 4) and shape[3] not in (1, 3, 4)
    if len(shape) == 4 and (channels_first or shape[3] in (1, 3, 4)):
        height, width, channels = (shape[2], shape[3], shape[1]) if channels_first else shape[1:]
    elif len(shape) == 3:
        (height, width), channels = shape[1:], 1
    else:
        raise InvalidInputError(f"--data: {expected}; {image!r} has shape {shape}")
    size = (height, width) if height > 0 and width > 0 else None
    data = Dataset.from_image_folder(path, image_size=size, channels=channels)
    if label is not None and not data.class_names:
        raise InvalidInputError(f"--data: expected class subfolders in {path!r} to label {label!r}; it holds "
                                "images only")
    dtype, label_dtype = inputs[image]["dtype"], inputs[label]["dtype"] if label else None

    def to_inputs(element):
        x = element["image"]
        x = x.transpose(2, 0, 1) if channels_first else x[:, :, 0] if len(shape) == 3 else x
        x = (x / np.float32(255)).astype(dtype) if np.issubdtype(dtype, np.floating) else x.astype(dtype)
        return {image: x, label: element["label"].astype(label_dtype)} if label else {image: x}
    return data.map(to_inputs)
