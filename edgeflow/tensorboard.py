"""TensorBoard event files of a training run: `edgeflow train --logdir DIR`, or

    with TensorBoardLogger("runs/1", histogram_every=100) as logger:
        training_loop.fit(interpreter, data, epochs=3, logger=logger)

then `tensorboard --logdir runs`. At every step: each output of the train signature that
holds one value (the loss, the optimizer's "learning_rate", `ef.summary.scalar`s) as a
scalar of its name, and every `rate_every` steps "steps_per_second". Every
`histogram_every` steps: "weights/<variable>" (the trainable variables, after the step),
"gradients/<variable>" (the gradients that step applied) and the `ef.summary.histogram`
outputs. The package says which outputs are summaries ("edgeflow.summaries",
edgeflow.format.metadata) and which tensor is each variable's gradient ("edgeflow.roles").

Gradients are no outputs of the train signature: on a histogram step the logger's runner
(`wrap_runner`) runs the step through `Interpreter.run` with the gradients fetched too
(the same ops, one more cached plan), and at other steps the plain runner, so they cost
nothing between histograms. A runner a delegate wraps (split training's CloudDelegate)
runs as it is, without gradient histograms; a split device package's weights are the
device's own (the server holds the others).

The writer is tensorboardX's (the `tensorboard` extra), imported only here.
"""
import logging
import time

import numpy as np

from . import dtypes
from .errors import EdgeflowError
from .format import metadata

_log = logging.getLogger("edgeflow")
INSTALL = "pip install 'edgeflow[tensorboard]'"


def open_writer(logdir, flush_secs=10):
    """A tensorboardX SummaryWriter writing event files into `logdir` (made if missing);
    EdgeflowError saying what to install if tensorboardX is not."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise EdgeflowError(f"TensorBoard logging (--logdir) needs tensorboardX: {INSTALL}") from None
    try:
        return SummaryWriter(logdir=str(logdir), flush_secs=flush_secs)
    except OSError as e:
        raise EdgeflowError(f"--logdir: cannot write event files in {str(logdir)!r} ({e.strerror})") from None


def _number(value):
    """The one value of a number or boolean array as a float (NaN kept), else None."""
    a = np.asarray(value)
    if a.dtype == dtypes.bfloat16:
        a = dtypes.widen(a)
    return float(a.reshape(-1)[0]) if a.size == 1 and a.dtype.kind in "biuf" else None


def histogram_values(array):
    """`array`'s finite values as float64, flat (bfloat16 widened; bools as 0 and 1)."""
    a = np.asarray(array)
    if a.dtype == dtypes.bfloat16:
        a = dtypes.widen(a)
    a = a.astype(np.float64).reshape(-1)
    return a[np.isfinite(a)]


class TensorBoardLogger:
    """The `logger` of `training_loop.fit`: `wrap_runner(interpreter, runner)` before the
    first step, `step(global_step, outputs, interpreter)` after each, `close()` at the end
    (or use it as a context manager). `writer`: a tensorboardX SummaryWriter (default: one
    writing into `logdir`)."""

    def __init__(self, logdir=None, histogram_every=100, rate_every=10, writer=None):
        if writer is None and logdir is None:
            raise EdgeflowError("TensorBoardLogger: give a logdir (or a writer)")
        for name, value in (("histogram_every", histogram_every), ("rate_every", rate_every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EdgeflowError(f"TensorBoardLogger: {name} must be an integer >= 1, got {value!r}")
        self.writer = writer if writer is not None else open_writer(logdir)
        self.histogram_every, self.rate_every = histogram_every, rate_every
        self._package = None  # (model, {output: kind}, {variable name: gradient name}, weight names)
        self._gradients = None  # {variable name: value} fetched by the last run of the wrapped runner
        self._last = None  # the last global step logged
        self._rate_from = None  # (global step, time) the current steps-per-second window starts at

    # -- what the package says ---------------------------------------------------------------
    def _read(self, interpreter):
        if self._package is None or self._package[0] is not interpreter.model:
            model = interpreter.model
            tensors = model.subgraphs[0].tensors
            kinds = (metadata.summaries(model) or {}).get("train", {})
            roles = metadata.roles(model)
            grads = {tensors[v].name: tensors[g].name for v, g in roles.gradients.items()} if roles else {}
            weights = list(grads) or [t.name for t in tensors if t.is_variable]
            split = metadata.split(model)
            if split is not None:  # the server holds (and updates) the cloud's variables
                cloud = set(split.get("cloud_variables") or ())
                weights = [n for n in weights if n not in cloud]
            self._package = model, kinds, grads, weights
        return self._package

    def is_histogram_step(self, global_step):
        return global_step % self.histogram_every == 0

    # -- the runner --------------------------------------------------------------------------
    def wrap_runner(self, interpreter, runner):
        """The train runner to call: `runner`, wrapped so that the step of each histogram
        step also fetches the gradients it applies (a plain SignatureRunner only)."""
        from .interp.interpreter import SignatureRunner
        _, _, grads, _ = self._read(interpreter)
        if not isinstance(runner, SignatureRunner) or not grads:
            if not grads:
                _log.info("tensorboard: the package records no gradients (edgeflow.roles): "
                          "no gradient histograms")
            else:
                _log.info("tensorboard: the train runner is a delegate's: no gradient histograms")
            return runner
        return _FetchingRunner(self, interpreter, runner, grads)

    def _wants_gradients(self):
        """Whether the next step is a histogram step (unknown before the first: yes)."""
        return self._last is None or self.is_histogram_step(self._last + 1)

    # -- each step ----------------------------------------------------------------------------
    def step(self, global_step, outputs, interpreter):
        """Log step `global_step`: its `outputs` (the train signature's), and on histogram
        steps the interpreter's weights and the gradients the step applied."""
        _, kinds, _, weights = self._read(interpreter)
        gradients, self._gradients = self._gradients, None
        now = time.perf_counter()
        w = self.writer
        for name, value in outputs.items():
            number = _number(value) if kinds.get(name, "scalar") == "scalar" else None
            if number is not None:
                w.add_scalar(name, number, global_step)
        if self.is_histogram_step(global_step):
            for name, value in outputs.items():
                if kinds.get(name) == "histogram":
                    self._histogram(name, value, global_step)
            variables = interpreter.variables()
            for name in weights:
                self._histogram(f"weights/{name}", variables[name], global_step)
            for name, value in (gradients or {}).items():
                self._histogram(f"gradients/{name}", value, global_step)
        if self._rate_from is None or global_step <= self._rate_from[0]:
            self._rate_from = global_step, now  # the first step (plans are made) is not timed
        elif global_step % self.rate_every == 0:
            start, then = self._rate_from
            if now > then:
                w.add_scalar("steps_per_second", (global_step - start) / (now - then), global_step)
            self._rate_from = global_step, now
        self._last = global_step

    def _histogram(self, tag, value, global_step):
        values = histogram_values(value)
        if values.size:
            self.writer.add_histogram(tag, values, global_step)

    def close(self):
        """Write what is buffered and close the event file."""
        self.writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _FetchingRunner:
    """A train SignatureRunner whose calls on histogram steps run through Interpreter.run,
    fetching the gradients too (given to the logger); the same call and details."""

    def __init__(self, logger, interpreter, runner, grads):
        self._logger, self._interp, self._runner, self._grads = logger, interpreter, runner, grads
        self._sig = next(s for s in interpreter.model.signatures if s.key == runner.key)

    def __getattr__(self, name):  # key, get_input_details, get_output_details, last_plan
        return getattr(self._runner, name)

    def __call__(self, **inputs):
        self._logger._gradients = None
        sig = self._sig
        if not self._logger._wants_gradients() or set(inputs) != set(sig.inputs):
            return self._runner(**inputs)  # (the runner says what is wrong with the inputs)
        tensors = self._interp.model.subgraphs[sig.subgraph].tensors
        outputs = {n: tensors[i].name for n, i in sig.outputs.items()}
        fetches = list(dict.fromkeys(list(outputs.values()) + list(self._grads.values())))
        values = self._interp.run(fetches, {tensors[sig.inputs[n]].name: v for n, v in inputs.items()},
                                  targets=sig.targets)
        self._logger._gradients = {var: values[g] for var, g in self._grads.items()}
        return {n: values[t] for n, t in outputs.items()}
