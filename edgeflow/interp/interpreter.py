"""The Interpreter: loads a `.efl` model and runs its signatures, with TFLite's API."""
import contextlib
import logging
import sys
from functools import partial

import numpy as np

from .. import dtypes, ops
from ..errors import EdgeflowError, InvalidInputError, UnsupportedOpError
from ..format import metadata, reader, verifier
from ..ops.dims import fmt
from . import threads
from .arena import default_max_tensor_bytes
from .control import Program
from .kernels import KERNELS
from .kernels import jit as jit_kernels
from .plan import ShapeDependsOnValues
from .profiler import Profiler
from .staged import SHAPE_LIKE_MAX, PlanCache, StagedPlan, make_plan

_PLAN_CACHE_SIZE = 8
_log = logging.getLogger("edgeflow")


def _describe(tensor, shape=None):
    dims = tuple(None if d == -1 else d for d in (shape if shape is not None else tensor.shape))
    return f"{dtypes.name(tensor.dtype)}{fmt(dims)}"


class Interpreter:
    """Runs a `.efl` model with numpy kernels, and delegates for the ops they claim.

    `model` is a path (mapped, not read: opening costs O(1) in the weights' size) or the
    file's bytes. `delegates` (e.g. `[edgeflow.accel.OpenCLDelegate()]`) run partitions of
    consecutive ops they support on their device; the rest runs on the CPU.
    `num_threads`: None (default) leaves threading to numpy's BLAS; N > 1 runs the big
    ops (matrix products, convolutions) split over N threads, each with one BLAS thread;
    1 keeps everything on one thread. `preserve_all_tensors` keeps every intermediate readable with `get_tensor` (no arena
    reuse), for debugging. A device package made by `edgeflow split` runs with an
    `edgeflow.cloud.CloudDelegate("host:port", token=...)` among its delegates.
    `max_tensor_bytes` bounds every allocation a plan makes (each tensor, folded
    constant, scratch array, and a plan's whole arena), checked before allocating: by
    default 4 GiB, or the machine's physical memory if less. A model whose file fixes a
    larger size raises FormatError (when loaded, where the declared shapes say so);
    inputs that make one raise InvalidInputError. Either names the op and the tensor.
    `jit` (where numba is installed: the `jit` extra): None (default) lets the kernels that
    gain much from a compiled loop import numba, and a plan of 2 GFLOP a run or more
    (jit.PLAN_FLOPS: ResNet-18 at 224x224) import it before it binds; the kernels of smaller
    plans take theirs once it is loaded (a first run without numba's import and its first
    loop's setup, 0.7-1.0 s once a process); True imports it now, so that every kernel that
    has a loop binds it (ResNet-18 at batch 1 on one thread: 59.8 -> 38.8 ms a run, its
    first run 0.3 -> 1.0 s); False keeps this interpreter's plans on numpy's kernels.
    """

    def __init__(self, model, delegates=(), num_threads=None, preserve_all_tensors=False,
                 max_tensor_bytes=None, jit=None):
        if jit not in (None, True, False):
            raise InvalidInputError(f"jit: expected None (the default policy), True or False, got {jit!r}")
        if jit and not jit_kernels.available():
            raise EdgeflowError("jit=True needs numba (pip install 'edgeflow[jit]'), and EDGEFLOW_JIT not \"0\"")
        self.jit = jit
        self.delegates = list(delegates)
        self.max_tensor_bytes = default_max_tensor_bytes() if max_tensor_bytes is None else int(max_tensor_bytes)
        self.model = reader.load(model)
        verifier.check_runnable(self.model, self.max_tensor_bytes)
        for delegate in self.delegates:
            delegate.prepare(self)
        self._subgraph = self.model.subgraphs[0]
        self._check_kernels()
        tensors = self._subgraph.tensors
        self._constants = {i: t.data for i, t in enumerate(tensors)
                           if t.data is not None and not t.is_variable}
        self._variables = {i: np.array(t.data) for i, t in enumerate(tensors) if t.is_variable}
        self._folded = {}  # values computed from constants while preparing, shared by plans
        self._signatures = {s.key: s for s in self.model.signatures}
        self._plans = PlanCache(_PLAN_CACHE_SIZE)
        self._program = Program(self.model, self.delegates, self.max_tensor_bytes)  # subgraphs that ops run (if, while)
        self._preserve_all = preserve_all_tensors
        # The tensor-level API (set_tensor, invoke, ...) serves the first signature, as
        # TFLite's serves the primary subgraph.
        first = self.model.signatures[0] if self.model.signatures else None
        self._io = (list(first.inputs.values()), list(first.outputs.values()), list(first.targets)) \
            if first else (list(self._subgraph.inputs), list(self._subgraph.outputs), [])
        self._input_shapes = {i: tuple(max(d, 1) for d in self._subgraph.tensors[i].shape)
                              for i in self._io[0]}
        self._plan = None
        self._names = None
        self._produced = None  # the tensors some op writes (run() checks fetches against them)
        self._update_ops = _update_ops(self.model)
        self._value_routes = set()  # (feeds, fetches) whose plans need small int feeds' values
        self.profiler = None
        self.num_threads = num_threads
        # N > 1: N workers split the big ops (interp/threads.py), BLAS capped at one thread each.
        self._workers = threads.Workers(num_threads) if num_threads is not None and num_threads > 1 else None
        self._threads = _thread_limiter(1 if self._workers is not None else num_threads)

    def _check_kernels(self):
        missing = sorted({op.opcode for sg in self.model.subgraphs for op in sg.operators
                          if op.opcode not in KERNELS and not ops.get(op.opcode).view
                          and not ops.get(op.opcode).remote and not ops.get(op.opcode).subgraphs})
        if missing:
            raise UnsupportedOpError(f"no numpy kernel for op(s): {', '.join(missing)}",
                                     [(m, "no numpy kernel") for m in missing])

    # -- planning ------------------------------------------------------------------
    def plan_for(self, inputs, outputs, shapes, targets=(), known=None):
        """The cached Plan computing `outputs` (and running `targets`) from `inputs` at
        `shapes` (made if new). `known` gives inputs whose values the plan may assume
        (small integer tensors that set shapes); a new value makes a new plan."""
        known = known or {}
        key = (tuple(inputs), tuple(outputs), tuple(targets), tuple(shapes[i] for i in inputs),
               tuple((i, v.tobytes()) for i, v in sorted(known.items())))
        return self._plans.get(key, lambda: self._make_plan(inputs, outputs, shapes, targets, known))

    def _make_plan(self, inputs, outputs, shapes, targets, known):
        # Kernels bound now split their work for these workers; BLAS capped as when running
        # (binding runs products too, e.g. Winograd's weight transforms: an uncapped BLAS
        # spins its threads on busy cores, measured 5x slower at num_threads=1).
        with self._threads(), threads.using(self._workers), jit_kernels.using(self.jit):
            return self._planned(inputs, outputs, shapes, targets, known)

    def _planned(self, inputs, outputs, shapes, targets, known):
        plan = make_plan(self._subgraph, inputs, outputs, shapes, self._constants, self._variables,
                         self._folded, self._preserve_all, targets, self.delegates, known, self._update_ops,
                         self._program, self.max_tensor_bytes)
        if self.delegates:
            _log.info("%s", plan.placement_summary())
        return plan

    def run_plan(self, plan):
        # subgraphs may be planned while running
        with self._threads(), threads.using(self._workers), jit_kernels.using(self.jit):
            workers = self._workers
            if workers is not None and self.profiler is None and workers.adaptive:
                choice = getattr(plan, "threads_choice", None)
                if choice is None:  # whole runs with the workers against runs on this thread alone
                    choice = plan.threads_choice = threads.Adaptive(partial(workers.running, plan.run, False),
                                                                    partial(workers.running, plan.run, True))
                # Awake by the time the run's first split comes; not for a run on this thread
                # alone (a tiny model's, which the choice keeps there: 18 us of its run, and
                # workers spinning on the other core for nothing).
                if choice.threaded_next():
                    workers.wake()
                choice()
            else:
                if workers is not None:
                    workers.wake()
                if self.profiler is not None:
                    self.profiler.run(plan)
                else:
                    plan.run()
        if getattr(plan, "provisional", False):
            jit_kernels.warm()  # bound while numba is not loaded: it loads now (a profiled run's too)

    def enable_profiling(self):
        """Time every op of later invocations; read `interpreter.profiler`."""
        self.profiler = Profiler()
        return self.profiler

    # -- trainable state -------------------------------------------------------------
    def variables(self):
        """{name: copy of the current value} of every variable."""
        tensors = self._subgraph.tensors
        return {tensors[i].name: np.array(a) for i, a in self._variables.items()}

    def save_checkpoint(self, path):
        """Write every variable's value to `path` atomically (temp file, fsync, rename)."""
        from . import checkpoint
        checkpoint.write(path, self.variables())

    def restore_checkpoint(self, path):
        """Set every variable from a checkpoint; a torn or mismatched one raises FormatError
        and leaves the variables as they were."""
        from . import checkpoint
        tensors = self._subgraph.tensors
        expected = {tensors[i].name: (a.dtype, a.shape) for i, a in self._variables.items()}
        self.set_variables(checkpoint.read(path, expected))

    def set_variables(self, values):
        """Set the variables named in `values` ({name: array}, as `variables()` gives);
        InvalidInputError, changing nothing, if one is unknown or of another dtype or shape."""
        tensors = self._subgraph.tensors
        index = {tensors[i].name: i for i in self._variables}
        for name, value in values.items():
            a = self._variables.get(index.get(name))
            value = np.asarray(value)
            if a is None or value.dtype != a.dtype or value.shape != a.shape:
                raise InvalidInputError(f"variable {name!r}: expected " + (
                    f"{a.dtype}{list(a.shape)}, got {value.dtype}{list(value.shape)}" if a is not None
                    else f"one of the model's variables {sorted(index)[:10]}"))
        for name, value in values.items():
            np.copyto(self._variables[index[name]], value)

    def sync_variables(self):
        """Let each delegate bring the variables up to date where its backend holds newer
        values (a CloudDelegate after split training pulls the server's)."""
        for delegate in self.delegates:
            delegate.sync_variables(self)

    def export(self, path):
        """Write a new `.efl` model whose variables start at their current values, after
        `sync_variables`; each delegate may shape what is written (`Delegate.exported`: a
        split training package exports as the whole model)."""
        import copy
        from ..format import writer
        self.sync_variables()
        model = copy.copy(self.model)
        sub = copy.copy(self._subgraph)
        sub.tensors = [copy.copy(t) for t in sub.tensors]
        for i, a in self._variables.items():
            sub.tensors[i].data = np.array(a)
        model.subgraphs = [sub] + list(self.model.subgraphs[1:])
        for delegate in self.delegates:
            model = delegate.exported(model)
        writer.write(model, path)

    # -- signatures ----------------------------------------------------------------
    def get_signature_list(self):
        return {s.key: {"inputs": list(s.inputs), "outputs": list(s.outputs)}
                for s in self.model.signatures}

    def get_signature_runner(self, signature_key=None):
        if signature_key is None:
            if len(self._signatures) != 1:
                raise InvalidInputError(f"the model has signatures {sorted(self._signatures)}; "
                                        "name one")
            signature_key = next(iter(self._signatures))
        if signature_key not in self._signatures:
            raise InvalidInputError(f"no signature {signature_key!r}; the model has "
                                    f"{sorted(self._signatures)}")
        runner = SignatureRunner(self, self._signatures[signature_key])
        for delegate in self.delegates:
            runner = delegate.wrap_runner(self, signature_key, runner)
        return runner

    # -- any tensors in, any tensors out ---------------------------------------------
    def tensor_index(self, name):
        """The index of the tensor called `name`, else InvalidInputError."""
        if self._names is None:
            self._names = {t.name: i for i, t in enumerate(self._subgraph.tensors)}
        if name not in self._names:
            raise InvalidInputError(f"the model has no tensor {name!r}")
        return self._names[name]

    def run(self, fetches, feeds, targets=(), reserve=None):
        """{name: value} of the tensors `fetches`, computed from `feeds` ({tensor name:
        array}), which may be intermediate tensors: only the ops between them run, as in a
        TensorFlow Session; `targets` (operator indices, such as variable writes) run too.
        Serves split inference and training, where each side runs part of a graph.
        `reserve(plan, outputs)`, if given, is a context manager entered once the plan is
        known and before anything runs (a server reserves its memory there; it may raise),
        around the run and the copies of the outputs (`outputs`: their tensor indices)."""
        values = {}
        for name, v in feeds.items():
            i = self.tensor_index(name)
            values[i] = as_input(self._subgraph.tensors[i], v, f"feed {name!r}")
        outs = [self.tensor_index(n) for n in fetches]
        if self._produced is None:
            self._produced = {t for op in self._subgraph.operators for t in op.outputs}
        for name, i in zip(fetches, outs):
            if i not in values and i not in self._produced and i not in self._constants and i not in self._variables:
                raise InvalidInputError(f"fetch {name!r} is an input of the model that no feed gives")
        shapes = {i: v.shape for i, v in values.items()}
        # A fed small integer tensor may be a shape computed upstream (Shape -> Gather ->
        # Concat), as when the other side of a split sends it: then plan for its value.
        known = {i: v for i, v in values.items() if v.dtype.kind in "iu" and v.size <= SHAPE_LIKE_MAX}
        targets = list(targets)
        bad = [i for i in targets if not (isinstance(i, int) and 0 <= i < len(self._subgraph.operators))]
        if bad:
            raise InvalidInputError(f"targets must be operator indices in [0, "
                                    f"{len(self._subgraph.operators)}), got {bad}")
        routes = (tuple(values), tuple(outs), tuple(targets))
        try:
            plan = self.plan_for(list(values), outs, shapes, targets,
                                 known=known if routes in self._value_routes else None)
            staged = isinstance(plan, StagedPlan)
        except ShapeDependsOnValues:
            if not known or routes in self._value_routes:
                raise
            staged = True
        if staged and known and routes not in self._value_routes:
            self._value_routes.add(routes)  # one plan per value beats a staged plan
            plan = self.plan_for(list(values), outs, shapes, targets, known=known)
        with reserve(plan, outs) if reserve is not None else contextlib.nullcontext():
            for i, v in values.items():
                np.copyto(plan.arrays[i], v)
            self.run_plan(plan)
            return {n: np.array(plan.arrays[i]) for n, i in zip(fetches, outs)}

    # -- TFLite's tensor-level API (the subgraph's own inputs and outputs) ------------
    def _details(self, index, shape):
        t = self._subgraph.tensors[index]
        q = t.quantization
        return {
            "name": t.name, "index": index, "dtype": t.dtype.type,
            "shape": np.array(shape, np.int32),
            "shape_signature": np.array(t.shape, np.int32),
            "quantization": (q.scale[0], q.zero_point[0]) if q and len(q.scale) == 1 else (0.0, 0),
            "quantization_parameters": {
                "scales": np.array(q.scale if q else (), np.float32),
                "zero_points": np.array(q.zero_point if q else (), np.int32),
                "quantized_dimension": q.axis if q else 0},
        }

    def get_input_details(self):
        return [self._details(i, self._input_shapes[i]) for i in self._io[0]]

    def get_output_details(self):
        plan = self._plan
        return [self._details(i, plan.arrays[i].shape if plan else
                              tuple(max(d, 1) for d in self._subgraph.tensors[i].shape))
                for i in self._io[1]]

    def resize_input_tensor(self, input_index, tensor_size):
        if input_index not in self._input_shapes:
            raise InvalidInputError(f"tensor {input_index} is not an input; inputs are "
                                    f"{sorted(self._input_shapes)}")
        t = self._subgraph.tensors[input_index]
        shape = tuple(int(d) for d in tensor_size)
        check_shape(t, shape, f"input {t.name!r}")
        self._input_shapes[input_index] = shape
        self._plan = None

    def allocate_tensors(self):
        self._plan = self.plan_for(self._io[0], self._io[1], self._input_shapes, self._io[2])

    def set_tensor(self, tensor_index, value):
        if tensor_index not in self._input_shapes:
            raise InvalidInputError(f"tensor {tensor_index} is not an input; inputs are "
                                    f"{sorted(self._input_shapes)}")
        if self._plan is None:
            self.allocate_tensors()
        t = self._subgraph.tensors[tensor_index]
        value = as_input(t, value, f"input {t.name!r}")
        want = self._input_shapes[tensor_index]
        if value.shape != want:
            raise InvalidInputError(f"input {t.name!r}: got shape {value.shape}, the current shape is "
                                    f"{want}; call resize_input_tensor({tensor_index}, {list(value.shape)}) first")
        np.copyto(self._plan.arrays[tensor_index], value)

    def invoke(self):
        if self._plan is None:
            self.allocate_tensors()
        elif getattr(self._plan, "provisional", False) and jit_kernels.ready():
            old = self._plan  # bound while numba was loading: made again now, the inputs set in it carried over
            self.allocate_tensors()
            for i in self._io[0]:
                np.copyto(self._plan.arrays[i], old.arrays[i])
        self.run_plan(self._plan)

    def get_tensor(self, tensor_index):
        """A copy of a tensor's value: an input, output, constant or variable (every
        tensor with preserve_all_tensors=True)."""
        plan = self._plan
        keep = set(self._io[0]) | set(self._io[1])
        if not 0 <= tensor_index < len(self._subgraph.tensors):
            raise InvalidInputError(f"tensor index {tensor_index} out of range "
                                    f"[0, {len(self._subgraph.tensors)})")
        for known in (self._variables, self._folded, self._constants):
            if tensor_index in known:
                return np.array(known[tensor_index])
        if plan is None or tensor_index not in plan.arrays or not (
                tensor_index in keep or self._preserve_all):
            name = self._subgraph.tensors[tensor_index].name
            raise InvalidInputError(f"tensor {tensor_index} {name!r} is an intermediate whose memory "
                                    "is reused; create the Interpreter with preserve_all_tensors=True")
        return plan.arrays[tensor_index].copy()

    def get_tensor_details(self):
        return [self._details(i, tuple(max(d, 1) for d in t.shape))
                for i, t in enumerate(self._subgraph.tensors)]


class SignatureRunner:
    """Calls one signature: `runner(x=array, ...) -> {"y": array, ...}` (fresh arrays)."""

    def __init__(self, interpreter, signature):
        self._interp, self._sig = interpreter, signature
        self._tensors = interpreter.model.subgraphs[signature.subgraph].tensors
        self._in = list(signature.inputs.values())
        self._out = list(signature.outputs.values())
        self.last_plan = None

    @property
    def key(self):
        return self._sig.key

    def get_input_details(self):
        return {n: self._interp._details(i, tuple(max(d, 1) for d in self._tensors[i].shape))
                for n, i in self._sig.inputs.items()}

    def get_output_details(self):
        return {n: self._interp._details(i, tuple(max(d, 1) for d in self._tensors[i].shape))
                for n, i in self._sig.outputs.items()}

    def _expected(self):
        return ", ".join(f"{n}: {_describe(self._tensors[i])}" for n, i in self._sig.inputs.items())

    def __call__(self, **inputs):
        sig = self._sig
        missing = [n for n in sig.inputs if n not in inputs]
        extra = [n for n in inputs if n not in sig.inputs]
        if missing or extra:
            raise InvalidInputError(
                f"signature {sig.key!r} takes inputs {{{self._expected()}}}; "
                + "; ".join(p for p in (f"missing {missing}" if missing else "",
                                        f"unexpected {extra}" if extra else "") if p))
        values = {sig.inputs[n]: as_input(self._tensors[sig.inputs[n]], v,
                                          f"signature {sig.key!r} input {n!r}")
                  for n, v in inputs.items()}
        plan = self._interp.plan_for(self._in, self._out, {i: v.shape for i, v in values.items()},
                                     sig.targets)
        for i, v in values.items():
            np.copyto(plan.arrays[i], v)
        self._interp.run_plan(plan)
        self.last_plan = plan
        return {n: plan.arrays[i].copy() for n, i in sig.outputs.items()}


def working_bytes(plan):
    """The bytes a run of `plan` writes in its arena and its kernels' scratch (a staged plan:
    the part before its boundary; the rest is planned when it runs)."""
    plan = getattr(plan, "before", plan)
    return plan.arena.nbytes + plan.workspace.nbytes


def release(plan):
    """Give back the pages of `plan`'s arena and scratch (and of its staged rests') until
    it runs again: a cached plan then holds no per-run buffers."""
    for part in (plan.before, *plan._rests.values()) if isinstance(plan, StagedPlan) else (plan,):
        if isinstance(part, StagedPlan):
            release(part)
        else:
            part.arena.release()
            part.workspace.release()


def _update_ops(model):
    """Indices of the ops the graph marked as optimizer updates ("edgeflow.roles")."""
    roles = metadata.roles(model)
    return frozenset(roles.update) if roles else frozenset()


def check_shape(tensor, shape, what):
    declared = tensor.shape
    if len(shape) != len(declared) or any(d not in (-1, s) for d, s in zip(declared, shape)) \
            or any(not 0 <= s <= verifier.MAX_DIM for s in shape):
        raise InvalidInputError(f"{what}: expected shape {fmt(tuple(None if d == -1 else d for d in declared))}"
                                f" (? is any size), got {tuple(shape)}")


def as_input(tensor, value, what):
    """`value` as an array of the tensor's dtype and an allowed shape, else InvalidInputError.
    A bfloat16 tensor takes ml_dtypes' bfloat16 arrays too, bit for bit."""
    if isinstance(value, np.ndarray):
        value = dtypes.asarray(value) if tensor.dtype == dtypes.bfloat16 else value
        if value.dtype != tensor.dtype:
            raise InvalidInputError(f"{what}: expected dtype {dtypes.name(tensor.dtype)}, got "
                                    f"{dtypes.name(value.dtype)} (expected {_describe(tensor)})")
    else:
        try:
            value = dtypes.array(value, tensor.dtype)
        except (TypeError, ValueError) as e:
            raise InvalidInputError(f"{what}: expected {_describe(tensor)}, got {type(value).__name__}"
                                    f" ({e})") from None
    check_shape(tensor, value.shape, what)
    return value


def _thread_limiter(num_threads):
    """A context manager capping numpy's BLAS threads, or a no-op when not asked."""
    if num_threads is None:
        return contextlib.nullcontext
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        raise EdgeflowError("num_threads needs the threadpoolctl package "
                            "(pip install threadpoolctl)") from None
    # Finding the BLAS libraries costs 1-3 ms (threadpoolctl reads every loaded library's
    # path: 3.2 ms in a fresh process beside torch-free numpy, a tenth of ResNet-18's plan):
    # done once a process, shared by its interpreters, and again only once modules have been
    # imported since (a kernel importing scipy loads its own OpenBLAS, which a plan made
    # after the interpreter would otherwise run at its own thread count). threadpoolctl's
    # limit() cost 18 us a run (22 us an invoke, where a tiny model's whole invoke takes 9):
    # each run only reads every library's thread count and sets (and restores) those that
    # differ, through the library's own functions (_counts).
    def limiter():
        found = _BLAS_FOUND
        if found[1] != len(sys.modules):
            found[:] = [_counts(c) for c in ThreadpoolController().lib_controllers], len(sys.modules)
        return _BlasThreads(found[0], int(num_threads))
    return limiter


_BLAS_FOUND = [None, -1]  # the BLAS libraries' (get, set) (_counts), and how many modules were loaded when found


def _counts(controller):
    """(get, set) of the thread count of a threadpoolctl controller's library: OpenBLAS's own
    C functions where threadpoolctl names them (the symbols it would call, found once),
    else the controller's methods. Through threadpoolctl's methods each call looked its
    symbol up again: two OpenBLAS libraries read, set and restored took 10.5 us of every
    run (a tiny model's run 100-200 us), 2.5 so."""
    symbol = getattr(controller, "_get_symbol", None)
    if controller.internal_api == "openblas" and symbol is not None:
        layer = "omp_get_max_threads", "omp_set_num_threads"
        names = layer if getattr(controller, "threading_layer", None) == "openmp" \
            else ("openblas_get_num_threads", "openblas_set_num_threads")
        get, put = (symbol(name) for name in names)
        if get is not None and put is not None:
            return get, put
    return controller.get_num_threads, controller.set_num_threads


class _BlasThreads:
    """Within it, each of `libraries` ((get, set) of their thread counts: _counts) runs `n`
    threads; then the counts they had."""

    __slots__ = ("libraries", "n", "changed")

    def __init__(self, libraries, n):
        self.libraries, self.n, self.changed = libraries, n, []

    def __enter__(self):
        n = self.n
        for get, put in self.libraries:
            had = get()
            if had != n:
                put(n)
                self.changed.append((put, had))
        return self

    def __exit__(self, *exc):
        for put, had in reversed(self.changed):
            put(had)
