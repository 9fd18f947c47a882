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
import collections.abc
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
from .wire import encode_copies
from ..ops.dims import fmt

_log = logging.getLogger("edgeflow.cloud")


def _describe(tensor):
    return f"{dtypes.name(tensor.dtype)}{fmt(tuple(None if d == -1 else d for d in tensor.shape))}"


class HostedModel:
    """One cloud package: its id, hash, signatures, tensors, and interpreters to run it."""

    budget = None  # a MemoryBudget the server sets

    def __init__(self, data, source, model_id=None, default_id=None, delegates=()):
        self.source = source  # the file, or "<bytes>"
        # Every interpreter of this model runs with these (an OpenCL delegate: a server's
        # accelerator, shared by its requests' interpreters).
        self.delegates = tuple(delegates)
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.file_bytes = data.nbytes
        self._data = data
        first = self._interpreter()  # verifies the package and that every op has a kernel
        self.model = first.model
        self.id = model_id or _model_id(self.model, default_id)
        self.role = metadata.role(self.model)  # "cloud", "device" or None (a plain model)
        self.sole_version = True  # the only version of its id the server hosts (HostedModels sets it)
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

    @property
    def package(self):
        """The package's bytes (a read-only mapping of its file, or the bytes given)."""
        return self._data

    def declared_shape(self, name):
        """The shape the package declares for tensor `name` (-1: a dimension known only
        when it runs), or None if it has no such tensor."""
        tensor = self._tensors.get(name)
        return None if tensor is None else tuple(tensor.shape)

    def step_host(self, state_dir=None, checkpoint_every=1, **limits):
        """The StepHost running split training steps on this version's one trained copy of
        its variables (made on first use, with StepHost's `limits`; resumes from its folder
        under `state_dir` if it holds a checkpoint). Each version of a model id trains on
        its own: its folder is named by the sanitised id and a prefix of the package's
        SHA-256 (steps.state_folder), never by the id itself. A checkpoint of an older
        layout (one folder per id: `state_dir`/<sanitised id>, or `state_dir`/<id> if that
        is inside `state_dir`) is read once, and only while the id has this one version:
        it does not say which version it trained."""
        with self._steps_lock:
            if self.steps is None:
                from .steps import StepHost, state_folder
                folder = legacy = None
                if state_dir:
                    folder = state_folder(state_dir, self.id, self.sha256)
                    root = os.path.realpath(state_dir)
                    candidates = [state_folder(state_dir, self.id), os.path.join(state_dir, self.id)]
                    legacy = next((c for c in candidates if os.path.dirname(os.path.realpath(c)) == root
                                   and os.path.exists(os.path.join(c, "steps.npz"))), None)
                    if legacy and not self.sole_version:
                        _log.warning("%s: not resuming from %s: it holds the training state of one version "
                                     "of model %r, and the server hosts several (host that version alone "
                                     "once to move it to its own folder)", self.id, legacy, self.id)
                        legacy = None
                self.steps = StepHost(self._interpreter(), folder, checkpoint_every, name=self.id,
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

    def _interpreter(self):
        return Interpreter(self._data, delegates=self.delegates)

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
            return self._interpreter()
        first = next(iter(self._charged), None)
        need = self._resident(first) if first is not None else self.file_bytes
        if not self.budget.try_take(self.id, need):
            try:
                return self._idle.get(timeout=self.budget.wait_s)
            except queue.Empty:
                raise OverBudget(f"model {self.id!r}: every interpreter is busy and another needs "
                                 f"{need} bytes, more than the memory budget leaves") from None
        interp = self._interpreter()
        self._charged[interp] = need
        self._settle(interp)
        return interp

    def run(self, fetches, feeds, reservation, encoding=""):
        """{name: array} of `fetches` from `feeds`, with the plan's working bytes and the
        outputs (and their encoded copies) reserved in `reservation` (a budget.Reservation)
        before anything runs; the arena's share is given back once the outputs are copied."""
        copies = encode_copies(encoding)

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

    A request feeds a signature's inputs or the tensors ops compute (the cut tensors of
    any split), and fetches the tensors computed from the inputs and the signatures'
    outputs. Weights never cross (constants, variables, and the optimizer's updates of
    them, which hold the new values; nor `save`'s outputs and `restore`'s inputs), unless
    the package opts in with "edgeflow.fetchable"."""
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
    # What ops compute from weights alone (a transposed weight, say) may be fed too, never
    # fetched: a split whose device computes one sends it (the cloud package is the whole
    # model, with no signature per cut to name it an input).
    derived = {o for k, op in enumerate(sub.operators) if k not in updates for o in op.outputs} - weights
    feedable = {names[i] for i in computed | derived}
    fetchable = {names[i] for i in computed} | \
        {names[i] for s in ours if s.key != "save" for i in s.outputs.values()}
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


def load(source, model_id=None, delegates=()):
    """A HostedModel from a path or the package's bytes; its id is `model_id` if given,
    else the package's own (FormatError, UnsupportedOpError or OSError if it is bad). Its
    interpreters run with `delegates`."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return HostedModel(memoryview(bytes(source)), "<bytes>", model_id, delegates=delegates)
    path = pathlib.Path(source)
    return HostedModel(reader.map_file(path), str(path), model_id, path.stem, delegates)  # one mapping, shared


class HostedModels(collections.abc.Mapping):
    """The models a server hosts, each id with one or more versions (HostedModel), keyed
    by their packages' SHA-256, side by side: a device package names the SHA-256 of the
    cloud package it was split against and is served by that version, so a new version
    rolls out while devices split against the old one keep working. As a mapping it is
    {id: the id's newest version}; the newest is the one loaded last (`load_models`
    loads a directory's files oldest modification time first)."""

    def __init__(self):
        self._versions = {}  # id -> [HostedModel], oldest first

    def add(self, model):
        """Host `model` as its id's newest version; False (nothing added) if a version of
        that id with the same SHA-256 is hosted already (the same package)."""
        versions = self._versions.setdefault(model.id, [])
        if any(v.sha256 == model.sha256 for v in versions):
            return False
        versions.append(model)
        for v in versions:
            v.sole_version = len(versions) == 1
        return True

    def versions(self, model_id):
        """The versions of `model_id`, oldest first ([] if none)."""
        return list(self._versions.get(model_id, ()))

    def version(self, model_id, sha256=None):
        """The version of `model_id` whose package has SHA-256 `sha256` (hex, any case), or
        the newest without one; None if the id or that version is not hosted."""
        versions = self._versions.get(model_id)
        if not versions:
            return None
        if not sha256:
            return versions[-1]
        return next((v for v in versions if v.sha256 == sha256.lower()), None)

    def all(self):
        """Every hosted version of every id (each id's oldest first)."""
        return [v for versions in self._versions.values() for v in versions]

    def __getitem__(self, model_id):
        versions = self._versions.get(model_id)
        if not versions:
            raise KeyError(model_id)
        return versions[-1]

    def __iter__(self):
        return iter(self._versions)

    def __len__(self):
        return len(self._versions)


def _by_age(path):
    try:
        return path.stat().st_mtime, path.name
    except OSError:
        return 0.0, path.name  # load() reports it


def load_models(model_dir=None, models=None, delegates=()):
    """A HostedModels: every `*.efl` in `model_dir` that is not a device package (those
    are skipped, as are bad files, with a log line saying why), loaded oldest modification
    time first, so that a model id's newest file is its default version; then `models`
    ({id: path or bytes, or a list of them, oldest first}; their errors raise). Files with
    the same id and different bytes are versions of one model; the same bytes twice (two
    splits of a model give one cloud package) are hosted once. Every model's interpreters
    run with `delegates` (shared: a delegate serves interpreters on several threads)."""
    hosted = HostedModels()
    if model_dir is not None:
        directory = pathlib.Path(model_dir)
        if not directory.is_dir():
            raise EdgeflowError(f"--model-dir {str(directory)!r}: expected a directory of .efl files")
        for path in sorted(directory.glob("*.efl"), key=_by_age):
            try:
                model = load(path, delegates=delegates)
            except (EdgeflowError, OSError) as e:
                _log.error("skipping %s: %s", path, e)
                continue
            if model.role == "device":
                info = metadata.split(model.model) or {}
                _log.info("skipping %s: a device package (role 'device'): devices run it; the server hosts "
                          "its cloud package (model id %r, sha256 %s...)", path, info.get("cloud_model_id"),
                          str(info.get("cloud_sha256"))[:16])
                continue
            _add(hosted, model)
    for model_id, sources in (models or {}).items():
        for source in sources if isinstance(sources, (list, tuple)) else [sources]:
            model = load(source, model_id, delegates)
            if model.role == "device":
                raise EdgeflowError(f"model {model_id!r} ({model.source}): a device package (role 'device') "
                                    "is run by devices; host its cloud package")
            _add(hosted, model)
    return hosted


def _add(hosted, model):
    first = hosted.versions(model.id)
    if not hosted.add(model):
        same = next(v for v in first if v.sha256 == model.sha256)
        _log.info("%s: the same package as %s (model %r, sha256 %s...): hosted once", model.source,
                  same.source, model.id, model.sha256[:16])
    elif first:
        _log.info("%s: model %r version sha256 %s... hosted beside %d older version(s); requests "
                  "without a sha256 get it", model.source, model.id, model.sha256[:16], len(first))
