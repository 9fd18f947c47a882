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


def fit(interpreter, data, epochs=1, batch_size=32, seed=0, checkpoint_dir=None,
        checkpoint_every=50, on_step=None):
    """Train; returns the list of (global step, loss). Resumes from checkpoint_dir if it
    holds a checkpoint of this run."""
    runner = interpreter.get_signature_runner("train")
    data = check_data(runner, data)
    start = {"epoch": 0, "step": 0, "global_step": 0}
    if checkpoint_dir:
        os.makedirs(checkpoint_dir, exist_ok=True)
        saved = _load_state(checkpoint_dir)
        if saved is not None:
            interpreter.restore_checkpoint(os.path.join(checkpoint_dir, saved["checkpoint"]))
            start = saved
    history, global_step = [], start["global_step"]

    def checkpoint(epoch, step):
        name = "checkpoint.npz"
        interpreter.save_checkpoint(os.path.join(checkpoint_dir, name))
        _save_state(checkpoint_dir, {"epoch": epoch, "step": step, "global_step": global_step,
                                     "checkpoint": name, "seed": seed, "batch_size": batch_size})

    for epoch in range(start["epoch"], epochs):
        for step, batch in batches(data, batch_size, seed, epoch):
            if epoch == start["epoch"] and step < start["step"]:
                continue
            outputs = runner(**batch)
            global_step += 1
            loss = float(np.asarray(outputs.get("loss", np.nan)).mean())
            history.append((global_step, loss))
            if on_step:
                on_step(epoch, global_step, loss)
            if checkpoint_dir and global_step % checkpoint_every == 0:
                checkpoint(epoch, step + 1)
        if checkpoint_dir:
            checkpoint(epoch + 1, 0)
    return history
