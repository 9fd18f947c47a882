"""The on-device training loop behind `edgeflow train`: batches from arrays or an
ef.data.Dataset through a model's `train` signature, with checkpoints to resume from after
a crash.

The data order is a function of (seed, epoch) alone (a dataset's, of its seeds and the
epoch), and a checkpoint records the variables and how far training and the data got, so a
run that crashes and resumes makes the same steps, on the same batches, as one that never
stopped. The checkpoint's state.json is a JSON object whose readers ignore keys they do
not know, so that more can be recorded beside it.
"""
import json
import os
from collections.abc import Mapping

import numpy as np

from .atomic import write_text
from .errors import InvalidInputError

STATE = "state.json"
_MAX_AGAIN = 5  # a split step the server keeps losing between its rounds fails after this


def batches(data, batch_size, seed, epoch):
    """(step in epoch, {name: batch}) for one epoch, shuffled by (seed, epoch)."""
    return enumerate(_Arrays(data, batch_size, seed).iterator(epoch))


class _Arrays:
    """A dict of arrays as a dataset of batches: each epoch a permutation by (seed, epoch),
    cut into batches of `batch_size` (the last one smaller)."""

    def __init__(self, data, batch_size, seed):
        self.data, self.batch_size, self.seed = data, batch_size, seed
        self.n = len(next(iter(data.values()))) if data else 0

    def cardinality(self):
        return -(-self.n // self.batch_size)

    def iterator(self, epoch=0, position=0):
        order = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        for start in range(position * self.batch_size, self.n, self.batch_size):
            index = order[start:start + self.batch_size]
            yield {name: values[index] for name, values in self.data.items()}


class Batches:
    """Batch i of the endless sequence of epochs of `data`: batch i mod per_epoch of epoch
    i div per_epoch, with the train signature's `inputs` only. `data` is a dict of arrays
    (shuffled by (seed, epoch), cut into batches of batch_size) or a finite ef.data.Dataset
    of batches (dicts; one pass is an epoch). Read in order; any other index (a resumed
    step) starts the data afresh there."""

    def __init__(self, data, batch_size=32, seed=0, inputs=None):
        self.inputs = sorted(inputs) if inputs is not None else None
        if isinstance(data, Mapping):
            if self.inputs is not None:
                data = _check_arrays(self.inputs, data)
            self.source = _Arrays(data, batch_size, seed)
        elif callable(getattr(data, "iterator", None)) and callable(getattr(data, "cardinality", None)):
            self.source = data
        else:
            raise InvalidInputError(f"expected the data as a dict of arrays or an ef.data.Dataset of batches, "
                                    f"got {type(data).__name__}")
        self.per_epoch = int(self.source.cardinality())
        if self.per_epoch < 0:
            raise InvalidInputError("expected a finite dataset (one pass is an epoch); this one repeats "
                                    "forever: leave out .repeat(), the epochs repeat it")
        if self.per_epoch == 0:
            raise InvalidInputError("expected data to train on; it holds no batch")
        self._iterator, self._next = None, None

    def __call__(self, index):
        at = divmod(index, self.per_epoch)
        if self._iterator is None or self._next != at:
            self.close()
            self._iterator = iter(self.source.iterator(*at))
        try:
            batch = next(self._iterator)
        except StopIteration:
            raise InvalidInputError(f"the dataset ended before batch {at[1]} of epoch {at[0]}; expected "
                                    f"{self.per_epoch} batches (its cardinality)") from None
        self._next = (at[0], at[1] + 1)
        return batch if self.inputs is None else self._select(batch)

    def _select(self, batch):
        if not isinstance(batch, Mapping):
            raise InvalidInputError(f"expected batches as dicts of the train signature's inputs {self.inputs}; "
                                    f"the dataset gives a {type(batch).__name__}")
        missing = [name for name in self.inputs if name not in batch]
        if missing:
            raise InvalidInputError(f"the data has no {missing}; the train signature takes {self.inputs}")
        return {name: batch[name] for name in self.inputs}

    def state(self, index):
        """The data's position at batch `index` (what a checkpoint records)."""
        epoch, position = divmod(index, self.per_epoch)
        return {"epoch": epoch, "position": position, "batches_per_epoch": self.per_epoch}

    def close(self):
        """Stop reading (a dataset's prefetch thread stops too)."""
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()
        self._iterator = None


def check_data(runner, data):
    """The arrays of `data` the train signature takes, checked: every input, one length."""
    return _check_arrays(runner.get_input_details(), data)


def _check_arrays(want, data):
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
        checkpoint_every=50, on_step=None, logger=None, steps=None):
    """Train; returns the list of (global step, loss). Resumes from checkpoint_dir if it
    holds a checkpoint of this run.

    `data` is a dict of arrays, shuffled by (seed, epoch) and cut into batches of
    `batch_size`, or a finite ef.data.Dataset of batches (dicts keyed by the train inputs;
    one pass is an epoch, and batch_size and seed are its own). A checkpoint records the
    data's position with the variables. Training stops after global step `steps` if given
    (a later run with checkpoint_dir goes on from there), else at the end of `epochs`.
    `on_step(epoch, global_step, loss)` and `logger.step(global_step, outputs,
    interpreter)` (the train signature's outputs) are called after each step; a logger
    with `wrap_runner(interpreter, runner)` gives the train runner to call (a
    tensorboard.TensorBoardLogger's fetches the gradients on its histogram steps).

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
    if getattr(logger, "wrap_runner", None) is not None:  # it may fetch more on some steps (gradients)
        runner = logger.wrap_runner(interpreter, runner)
    feed = Batches(data, batch_size, seed, inputs=runner.get_input_details())
    per_epoch = feed.per_epoch
    last = epochs * per_epoch if steps is None else min(steps, epochs * per_epoch)
    # A split training package's delegate numbers its steps: the global steps here.
    cloud = next((d for d in interpreter.delegates if getattr(d, "rounds", None)), None)
    rounds = len(cloud.rounds) if cloud is not None else 0
    again = 0  # times in a row the current step was run again from its first round
    global_step = 0
    if checkpoint_dir:
        os.makedirs(checkpoint_dir, exist_ok=True)
        global_step = _restore(interpreter, checkpoint_dir, per_epoch)
    history = []

    def checkpoint():
        name = "checkpoint.npz"
        interpreter.save_checkpoint(os.path.join(checkpoint_dir, name))
        epoch, step = divmod(global_step, per_epoch)
        _save_state(checkpoint_dir, {"epoch": epoch, "step": step, "global_step": global_step,
                                     "checkpoint": name, "seed": seed, "batch_size": batch_size,
                                     "data": feed.state(global_step)})

    try:
        while global_step < last:
            epoch, step = divmod(global_step, per_epoch)
            if cloud is not None:
                cloud.step_id = global_step
            before = interpreter.variables() if rounds > 1 else None  # device writes run between rounds
            try:
                outputs = runner(**feed(global_step))
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
                global_step = _restore(interpreter, checkpoint_dir, per_epoch)
                history = [(g, loss) for g, loss in history if g <= global_step]
                continue
            global_step, again = global_step + 1, 0
            loss = float(np.asarray(outputs.get("loss", np.nan)).mean())
            history.append((global_step, loss))
            if logger is not None:
                logger.step(global_step, outputs, interpreter)
            if on_step:
                on_step(epoch, global_step, loss)
            at_epoch_end = global_step % per_epoch == 0 and cloud is None
            if checkpoint_dir and (global_step % checkpoint_every == 0 or at_epoch_end):
                checkpoint()
    finally:
        feed.close()
    if checkpoint_dir and cloud is None:
        checkpoint()
    return history


def _restore(interpreter, folder, per_epoch):
    """Restore the checkpoint in `folder`, if any; the global step it was taken at."""
    saved = _load_state(folder)
    if saved is None:
        return 0
    taken = (saved.get("data") or {}).get("batches_per_epoch", per_epoch)
    if taken != per_epoch:
        raise InvalidInputError(f"the checkpoint in {folder} was taken with {taken} batches per epoch; the data "
                                f"gives {per_epoch} (resume with the same data and batch size)")
    interpreter.restore_checkpoint(os.path.join(folder, saved["checkpoint"]))
    return saved["global_step"]
