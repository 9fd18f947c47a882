"""Delegates: backends that run partitions of a plan on another device.

A delegate claims the ops it supports; consecutive claimed ops (in execution order)
form one partition, which becomes a single step of the plan: it copies the partition's
inputs to the device, runs its kernels there (intermediates never come back), and copies
back only what ops outside it or the caller read. Unclaimed ops run on the CPU, and the
plan records why each one fell back.

A delegate may also take part in the interpreter's life: `prepare` sees the model once,
when the interpreter loads it (to read its metadata, or refuse it), and `wrap_runner` may
wrap the runner of a signature (edgeflow.cloud.CloudDelegate falls back to a local
signature while the server is unreachable), `sync_variables` bring the variables up to
date and `exported` shape the model `Interpreter.export` writes (CloudDelegate: the
jointly trained model after split training).
"""
import abc
from dataclasses import dataclass, field


class Delegate(abc.ABC):
    """The interface a backend implements (see edgeflow.accel.OpenCLDelegate)."""

    name = "delegate"
    # True: optimizer updates (ops the graph marks as updating a variable) stay on the CPU
    # in float32, as for a delegate that stores tensors in half precision.
    float32_updates = False

    @abc.abstractmethod
    def unsupported(self, op, ins, outs):
        """None if the delegate runs `op` (an OperatorDef) on these host arrays, else why not."""

    @abc.abstractmethod
    def compile(self, partition):
        """A zero-argument step running `partition` (a Partition) and writing its outputs."""

    def prepare(self, interpreter):
        """Called once by the Interpreter this delegate serves, when its model is loaded and
        before anything is planned; raise an EdgeflowError to refuse the model."""

    def wrap_runner(self, interpreter, key, runner):
        """The runner `interpreter.get_signature_runner(key)` hands out: `runner` itself, or
        one wrapping it (with the same call and details)."""
        return runner

    def sync_variables(self, interpreter):
        """Bring `interpreter`'s variables up to date where this delegate's backend holds
        newer values (CloudDelegate: the server's, after split training); called by
        `Interpreter.sync_variables` and before `Interpreter.export`."""

    def exported(self, model):
        """The ModelDef `Interpreter.export` writes, given the interpreter's (its variables
        at their current values): `model` itself, or one without what only this delegate
        runs."""
        return model


@dataclass
class Partition:
    """Consecutive ops for one delegate. `arrays` maps tensor index -> host array (the
    plan's: arena views, constants, variables); `inputs` are read from the host each run,
    `constants` once; `outputs` are copied back to the host after each run."""

    ops: list  # (op index, OperatorDef), in execution order
    arrays: dict
    inputs: list
    constants: list
    outputs: list
    views: dict = field(default_factory=dict)  # op index -> True for reshape-like ops


def partition(plan, delegates):
    """Group the plan's ops into [(delegate or None, [op indices])], and the reasons for
    ops no delegate took: {op index: "delegate: reason"}."""
    from .. import ops as registry
    groups, fallbacks = [], {}
    for i in plan.order:
        op = plan.subgraph.operators[i]
        ins = [plan.arrays[t] for t in op.inputs]
        outs = [plan.arrays.get(t) for t in op.outputs]
        owner = None
        if i in plan.update_ops and any(d.float32_updates for d in delegates):
            fallbacks[i] = "an optimizer update: kept in float32 on the CPU"
        elif not registry.get(op.opcode).stateful:
            for d in delegates:
                why = d.unsupported(op, ins, outs)
                if why is None:
                    owner = d
                    break
                fallbacks[i] = f"{d.name}: {why}"
        else:
            fallbacks[i] = "writes a variable: runs on the CPU"
        if owner is not None:
            fallbacks.pop(i, None)
        if groups and groups[-1][0] is owner and owner is not None:
            groups[-1][1].append(i)
        else:
            groups.append((owner, [i]))
    return groups, fallbacks


def make_partition(plan, indices, persistent):
    """The Partition of ops `indices`: what it reads from and writes back to the host."""
    subgraph = plan.subgraph
    inside = set(indices)
    produced = {t for i in indices for t in subgraph.operators[i].outputs}
    read_outside = {t for i in plan.order if i not in inside for t in subgraph.operators[i].inputs}
    read_outside |= set(plan.outputs)
    reads = list(dict.fromkeys(t for i in indices for t in subgraph.operators[i].inputs if t not in produced))
    return Partition(
        ops=[(i, subgraph.operators[i]) for i in indices], arrays=plan.arrays,
        inputs=[t for t in reads if t not in persistent],
        constants=[t for t in reads if t in persistent],
        outputs=[t for t in dict.fromkeys(t for i in indices for t in subgraph.operators[i].outputs)
                 if t in read_outside])
