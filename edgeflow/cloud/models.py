"""The models a server hosts: cloud packages loaded once, each with a pool of interpreters.

A model's id is its package's metadata "edgeflow.model_id" (UTF-8) if present, else the
file's stem; its sha256 is the hex digest of the package's bytes, so a device can check
that the server runs the package it was split against. Interpreters are not
thread-safe, so each request borrows one from its model's pool (a new one is made when
all are busy and the memory budget holds it: there are never more than the server's
worker threads). All of a model's interpreters share one read-only mapping of the file.
With a MemoryBudget, `run` reserves what a request's plan writes before running it, and
each cached interpreter is charged what it keeps (see budget.py); a cached plan's arena
and scratch pages are given back after each run, and the least recently used plans are
dropped when what they keep no longer fits.
"""
import contextlib
import hashlib
import logging
import os
import pathlib
import queue
import threading
import types
import weakref

import numpy as np

from .. import dtypes
from ..errors import EdgeflowError, InvalidInputError
from ..format import metadata, reader
from ..interp import Interpreter
from ..interp.interpreter import check_shape, release, working_bytes
from .budget import OverBudget
from ..ops.dims import fmt

_log = logging.getLogger("edgeflow.cloud")


def _describe(tensor):
    return f"{dtypes.name(tensor.dtype)}{fmt(tuple(None if d == -1 else d for d in tensor.shape))}"


class HostedModel:
    """One cloud package: its id, hash, signatures, tensors, and interpreters to run it."""

    budget = None  # a MemoryBudget the server sets

    def __init__(self, data, source, model_id=None, default_id=None):
        self.source = source  # the file, or "<bytes>"
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.file_bytes = data.nbytes
        self._data = data
        first = Interpreter(data)  # verifies the package and that every op has a kernel
        self.model = first.model
        self.id = model_id or _model_id(self.model, default_id)
        if not self.id:
            raise EdgeflowError(f"{source}: the package has no {metadata.MODEL_ID!r} metadata; give its id")
        self._tensors = {t.name: t for t in self.model.subgraphs[0].tensors}
        self.feedable, self.fetchable = exposed(self.model)
        # A trainable split package: a "train" signature whose targets write its variables
        # (the only operators a training round may run as targets).
        self.writes = {i for sig in self.model.signatures if sig.key == "train" for i in sig.targets}
        self.trainable = bool(self.writes)
        self._idle = queue.SimpleQueue()
        self._idle.put(first)
        self._charged = weakref.WeakKeyDictionary()  # interpreter -> bytes charged to the budget
        self._held = weakref.WeakKeyDictionary()  # plan -> bytes its bound kernels keep
        self.steps = None  # the StepHost, once a device trains this model
        self._steps_lock = threading.Lock()

    def step_host(self, state_dir=None, checkpoint_every=1, **limits):
        """The StepHost running split training steps on this model's one trained copy of
        its variables (made on first use, with StepHost's `limits`; resumes from its folder
        under `state_dir` if it holds a checkpoint). The folder is named by a sanitised id
        (steps.state_folder), never by the id itself; a checkpoint in the folder of the
        old layout (`state_dir`/<id>, if that is inside `state_dir`) is read once."""
        with self._steps_lock:
            if self.steps is None:
                from .steps import StepHost, state_folder
                folder = legacy = None
                if state_dir:
                    folder = state_folder(state_dir, self.id)
                    legacy = os.path.join(state_dir, self.id)
                    root = os.path.realpath(state_dir)
                    if os.path.dirname(os.path.realpath(legacy)) != root or legacy == folder:
                        legacy = None  # an id that left the folder: never read from there
                self.steps = StepHost(Interpreter(self._data), folder, checkpoint_every, name=self.id,
                                      legacy_state_dir=legacy, **limits)
            return self.steps

    @contextlib.contextmanager
    def interpreter(self):
        """An interpreter no other request uses until the `with` block ends; once the model
        trains, the one holding the trained variables (under its lock)."""
        if self.steps is not None:
            with self.steps.lock:
                yield self.steps.interp
            return
        try:
            interp = self._idle.get_nowait()
        except queue.Empty:
            interp = self._new_interpreter()
        try:
            yield interp
        finally:
            self._idle.put(interp)

    def use_budget(self, budget):
        """Charge what this model's interpreters keep to `budget` (a MemoryBudget), and
        reserve through it from now on."""
        self.budget, idle = budget, []
        while True:
            try:
                idle.append(self._idle.get_nowait())
            except queue.Empty:
                break
        for interp in idle:
            self._charged[interp] = 0
            self._settle(interp)
            self._idle.put(interp)

    def _new_interpreter(self):
        """A new interpreter, charged to the budget; where it does not fit, the next one
        another request gives back."""
        if self.budget is None:
            return Interpreter(self._data)
        first = next(iter(self._charged), None)
        need = self._resident(first) if first is not None else self.file_bytes
        if not self.budget.try_take(self.id, need):
            try:
                return self._idle.get(timeout=self.budget.wait_s)
            except queue.Empty:
                raise OverBudget(f"model {self.id!r}: every interpreter is busy and another needs "
                                 f"{need} bytes, more than the memory budget leaves") from None
        interp = Interpreter(self._data)
        self._charged[interp] = need
        self._settle(interp)
        return interp

    def run(self, fetches, feeds, reservation, encoding=""):
        """{name: array} of `fetches` from `feeds`, with the plan's working bytes and the
        outputs (and their encoded copies) reserved in `reservation` (a budget.Reservation)
        before anything runs; the arena's share is given back once the outputs are copied."""
        copies = {"": 1, "fp16": 2, "int8": 4}.get(encoding, 4)  # encode(): temporaries per output byte

        @contextlib.contextmanager
        def reserve(plan, outs):
            new = plan not in self._held
            held = self._held.setdefault(plan, _held_bytes(plan, interp)) if new else 0
            work = working_bytes(plan)
            out = sum(plan.arrays[i].nbytes for i in outs) * copies
            reservation.add(work + held + out, f"model {self.id!r}: running these inputs (arena and "
                                               f"scratch {work} bytes, outputs {out} bytes)")
            try:
                yield
            finally:
                release(plan)
                reservation.give(work + held)  # the held share is charged to the interpreter next

        with self.interpreter() as interp:
            try:
                return interp.run(fetches, feeds, reserve=reserve if self.budget is not None else None)
            finally:
                if self.budget is not None:
                    self._settle(interp)

    def _resident(self, interp):
        """What `interp` keeps between requests: variables, folded constants, and what its
        cached plans' kernels hold (their arenas and scratch are released after each run)."""
        arrays = {id(a): a.nbytes for a in [*interp._variables.values(), *interp._folded.values()]}
        return sum(arrays.values()) + sum(self._held.get(p, 0) for p in interp._plans.values())

    def _settle(self, interp):
        """Charge the budget what `interp` now keeps; drop its least recently used plans
        while that does not fit."""
        while True:
            now, before = self._resident(interp), self._charged.get(interp, 0)
            if now <= before:
                self.budget.give(self.id, before - now)
                break
            if self.budget.try_take(self.id, now - before):
                break
            if interp._plans.pop_oldest() is None:  # nothing more to drop: it keeps what it must
                self.budget.force(self.id, now - before)
                break
        self._charged[interp] = now

    def signatures(self):
        """[(key, inputs, outputs)], each of inputs/outputs a list of (signature name, tensor)."""
        tensors = self.model.subgraphs[0].tensors
        return [(s.key, [(n, tensors[i]) for n, i in s.inputs.items()],
                 [(n, tensors[i]) for n, i in s.outputs.items()]) for s in self.model.signatures]

    def _expected(self, kind):
        names = {t.name: _describe(t) for key, ins, outs in self.signatures() if key not in ("save", "restore")
                 for _, t in (ins if kind == "inputs" else outs)}  # a request's, not the weights
        return ", ".join(f"{n}: {d}" for n, d in names.items()) or "none"

    def check_feed(self, name, dtype, shape):
        """InvalidInputError unless the model has a tensor `name` of `dtype` and a shape
        that fits `shape` (-1 in the declared shape takes any size)."""
        what = f"feed {name!r}"
        tensor = self._tensors.get(name)
        if tensor is None:
            raise InvalidInputError(f"{what}: model {self.id!r} has no tensor {name!r}; its "
                                    f"signatures take {self._expected('inputs')}")
        if dtype != tensor.dtype:
            raise InvalidInputError(f"{what}: expected dtype {dtypes.name(tensor.dtype)} ({_describe(tensor)}), "
                                    f"got {dtypes.name(dtype)}")
        if name not in self.feedable:
            kind = "a weight" if tensor.is_variable or tensor.data is not None else "not computed from its inputs"
            raise InvalidInputError(f"{what}: tensor {name!r} of model {self.id!r} is {kind}; a request feeds "
                                    f"its signatures' inputs ({self._expected('inputs')}) or tensors computed "
                                    "from them")
        check_shape(tensor, shape, what)

    def check_targets(self, targets):
        """InvalidInputError unless a training round's `targets` are variable writes of the
        model's `train` signature (a round may not run `restore`'s writes, say)."""
        bad = [t for t in targets if t not in self.writes]
        if bad:
            raise InvalidInputError(f"step targets {bad[:8]}: model {self.id!r} runs only its train signature's "
                                    f"variable writes ({len(self.writes)} operators)")

    def check_fetches(self, fetches, allow_none=False):
        """InvalidInputError unless `fetches` names distinct tensors of the model, at least
        one (unless `allow_none`: a training round may only apply updates)."""
        if not fetches and not allow_none:
            raise InvalidInputError(f"expected at least one fetch; model {self.id!r} outputs "
                                    f"{self._expected('outputs')}")
        seen = set()
        for name in fetches:
            if name not in self._tensors:
                raise InvalidInputError(f"fetch {name!r}: model {self.id!r} has no tensor {name!r}; "
                                        f"its signatures output {self._expected('outputs')}")
            if name not in self.fetchable:
                raise InvalidInputError(f"fetch {name!r}: model {self.id!r} does not give out this tensor (a "
                                        "weight, or not computed from its inputs); a request fetches its "
                                        f"signatures' outputs ({self._expected('outputs')}) or tensors "
                                        "computed from its inputs")
            if name in seen:
                raise InvalidInputError(f"fetch {name!r} is asked for twice; expected distinct names")
            seen.add(name)


def exposed(model):
    """(feedable, fetchable): the names of subgraph 0's tensors a request may feed and fetch.

    A request feeds a signature's inputs or the tensors computed from them (the cut
    tensors of any split), and fetches those and the signatures' outputs. Weights never
    cross (constants, variables, and the optimizer's updates of them, which hold the new
    values; nor `save`'s outputs and `restore`'s inputs), unless the package opts in with "edgeflow.fetchable"."""
    sub = model.subgraphs[0]
    roles = metadata.roles(model)
    updates = set(roles.update) if roles else set()
    weights = {i for i, t in enumerate(sub.tensors) if t.is_variable or t.data is not None}
    ours = [s for s in model.signatures if s.subgraph == 0 and s.key != "restore"]  # no weights in or out
    computed = {i for s in ours for i in s.inputs.values()} - weights
    readers = {}
    for k, op in enumerate(sub.operators):
        for i in op.inputs:
            readers.setdefault(i, []).append(k)
    todo = list(computed)
    while todo:  # forward from the inputs, through every op but the optimizer's
        for k in readers.get(todo.pop(), ()):
            if k in updates:
                continue
            for o in sub.operators[k].outputs:
                if o not in computed and o not in weights:
                    computed.add(o)
                    todo.append(o)
    names = [t.name for t in sub.tensors]
    feedable = {names[i] for i in computed}
    fetchable = feedable | {names[i] for s in ours if s.key != "save" for i in s.outputs.values()}
    extra = metadata.fetchable(model) or set()
    fetchable |= set(names) if "*" in extra else extra
    return feedable, fetchable
def _held_bytes(plan, interp, depth=4):
    """Bytes of the arrays that `plan`'s bound kernel steps keep for themselves (per-shape
    buffers made while binding), found through their closures and objects; not the arena,
    scratch, constants, variables or folded values."""
    plans = [getattr(plan, "before", plan)]
    shared = {id(a) for p in plans for a in (p.arena._block, *p.workspace.blocks)}
    shared |= {id(a) for a in [*interp._variables.values(), *interp._folded.values()]}
    seen, total = set(), 0

    def visit(obj, depth):
        nonlocal total
        if isinstance(obj, np.ndarray):
            while isinstance(obj.base, np.ndarray):
                obj = obj.base
            if obj.base is None and id(obj) not in shared and id(obj) not in seen:
                seen.add(id(obj))
                total += obj.nbytes
            return
        if depth == 0 or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            items = obj
        elif isinstance(obj, dict):
            items = obj.values()
        elif isinstance(obj, types.FunctionType):
            items = [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
        elif isinstance(obj, types.MethodType):
            items = [obj.__self__]
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            items = vars(obj).values()
        else:
            return
        for item in items:
            visit(item, depth - 1)

    for p in plans:
        for step in p.steps:
            visit(step, depth)
    return total


def _filled(cell):
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _model_id(model, fallback):
    return metadata.model_id(model) or fallback


def load(source, model_id=None):
    """A HostedModel from a path or the package's bytes; its id is `model_id` if given,
    else the package's own (FormatError, UnsupportedOpError or OSError if it is bad)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return HostedModel(memoryview(bytes(source)), "<bytes>", model_id)
    path = pathlib.Path(source)
    return HostedModel(reader.map_file(path), str(path), model_id, path.stem)  # one mapping, shared


def load_models(model_dir=None, models=None):
    """{id: HostedModel}: every `*.efl` in `model_dir` (a bad file is logged and skipped,
    as is a second file with an id already taken), plus `models` ({id: path or bytes},
    whose errors raise)."""
    hosted = {}
    if model_dir is not None:
        directory = pathlib.Path(model_dir)
        if not directory.is_dir():
            raise EdgeflowError(f"--model-dir {str(directory)!r}: expected a directory of .efl files")
        for path in sorted(directory.glob("*.efl")):
            try:
                model = load(path)
            except (EdgeflowError, OSError) as e:
                _log.error("skipping %s: %s", path, e)
                continue
            if model.id in hosted:
                _log.error("skipping %s: model id %r is taken by %s", path, model.id, hosted[model.id].source)
                continue
            hosted[model.id] = model
    for model_id, source in (models or {}).items():
        if model_id in hosted:
            raise EdgeflowError(f"model id {model_id!r} is given twice ({hosted[model_id].source})")
        hosted[model_id] = load(source, model_id)
    return hosted
