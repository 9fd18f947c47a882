"""The on-device training loop behind `edgeflow train`: batches from arrays through a
model's `train` signature, with checkpoints to resume from after a crash.

The data order is a function of (seed, epoch) alone, and a checkpoint records the
variables and how far training got, so a run that crashes and resumes makes the same
steps, on the same batches, as one that never stopped.
"""
import json
import os

import numpy as np

from .atomic import write_text
from .errors import InvalidInputError

STATE = "state.json"
_MAX_AGAIN = 5  # a split step the server keeps losing between its rounds fails after this


def batches(data, batch_size, seed, epoch):
    """(step in epoch, {name: batch}) for one epoch, shuffled by (seed, epoch)."""
    n = len(next(iter(data.values())))
    order = np.random.default_rng([seed, epoch]).permutation(n)
    for step, start in enumerate(range(0, n, batch_size)):
        index = order[start:start + batch_size]
        yield step, {name: values[index] for name, values in data.items()}


def check_data(runner, data):
    want = runner.get_input_details()
    missing, extra = sorted(set(want) - set(data)), sorted(set(data) - set(want))
    if missing:
        raise InvalidInputError(f"the data has no {missing}; the train signature takes {sorted(want)}"
                                + (f" (the data also holds {extra}, unused)" if extra else ""))
    sizes = {name: len(data[name]) for name in want}
    if len(set(sizes.values())) != 1:
        raise InvalidInputError(f"the data's arrays differ in length: {sizes}")
    return {name: data[name] for name in want}


def _load_state(folder):
    path = os.path.join(folder, STATE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _save_state(folder, state):
    write_text(os.path.join(folder, STATE), json.dumps(state))


def batch_at(data, batch_size, seed, epoch, step):
    """Batch `step` of `epoch`, as `batches` yields it."""
    n = len(next(iter(data.values())))
    order = np.random.default_rng([seed, epoch]).permutation(n)
    index = order[step * batch_size:(step + 1) * batch_size]
    return {name: values[index] for name, values in data.items()}


def fit(interpreter, data, epochs=1, batch_size=32, seed=0, checkpoint_dir=None,
        checkpoint_every=50, on_step=None):
    """Train; returns the list of (global step, loss). Resumes from checkpoint_dir if it
    holds a checkpoint of this run.

    With a split training package (run with a CloudDelegate), step ids are the global
    steps, and when the server asks to resume from an earlier step (it restarted from an
    older checkpoint: `RemoteError.resume_from`), the device restores its own checkpoint
    of that step and trains on from there; checkpoint every K steps on both sides
    (`--checkpoint-every` here and on `edgeflow serve`) so that one exists. When the
    server lost a step between its rounds (it restarted after round 1 of a U-shaped step:
    `resume_from` is the step itself), the device puts back the variables it had before
    the step (its own writes may have run between the rounds) and runs the step again.
    """
    from .errors import RemoteError
    runner = interpreter.get_signature_runner("train")
    data = check_data(runner, data)
    n = len(next(iter(data.values())))
    per_epoch = -(-n // batch_size)
    # A split training package's delegate numbers its steps: the global steps here.
    cloud = next((d for d in interpreter.delegates if getattr(d, "rounds", None)), None)
    rounds = len(cloud.rounds) if cloud is not None else 0
    again = 0  # times in a row the current step was run again from its first round
    global_step = 0
    if checkpoint_dir:
        os.makedirs(checkpoint_dir, exist_ok=True)
        global_step = _restore(interpreter, checkpoint_dir)
    history = []

    def checkpoint():
        name = "checkpoint.npz"
        interpreter.save_checkpoint(os.path.join(checkpoint_dir, name))
        epoch, step = divmod(global_step, per_epoch)
        _save_state(checkpoint_dir, {"epoch": epoch, "step": step, "global_step": global_step,
                                     "checkpoint": name, "seed": seed, "batch_size": batch_size})

    while global_step < epochs * per_epoch:
        epoch, step = divmod(global_step, per_epoch)
        if cloud is not None:
            cloud.step_id = global_step
        before = interpreter.variables() if rounds > 1 else None  # device writes run between rounds
        try:
            outputs = runner(**batch_at(data, batch_size, seed, epoch, step))
        except RemoteError as e:
            resume = getattr(e, "resume_from", None)
            if cloud is None or resume is None:
                raise
            if resume == global_step:  # the server lost this step's earlier rounds: run it again
                again += 1
                if again > _MAX_AGAIN:
                    raise RemoteError(f"{e}; step {global_step} was run again {_MAX_AGAIN} times") from None
                if before is not None:
                    interpreter.set_variables(before)
                continue
            saved = _load_state(checkpoint_dir) if checkpoint_dir else None
            if saved is None or saved["global_step"] != resume:
                raise RemoteError(f"{e}; the device has no checkpoint of step {resume} to resume "
                                  f"from (checkpoint every K steps, as the server does)") from None
            global_step = _restore(interpreter, checkpoint_dir)
            history = [(g, loss) for g, loss in history if g <= global_step]
            continue
        global_step, again = global_step + 1, 0
        loss = float(np.asarray(outputs.get("loss", np.nan)).mean())
        history.append((global_step, loss))
        if on_step:
            on_step(epoch, global_step, loss)
        at_epoch_end = global_step % per_epoch == 0 and cloud is None
        if checkpoint_dir and (global_step % checkpoint_every == 0 or at_epoch_end):
            checkpoint()
    if checkpoint_dir and cloud is None:
        checkpoint()
    return history


def _restore(interpreter, folder):
    """Restore the checkpoint in `folder`, if any; the global step it was taken at."""
    saved = _load_state(folder)
    if saved is None:
        return 0
    interpreter.restore_checkpoint(os.path.join(folder, saved["checkpoint"]))
    return saved["global_step"]
