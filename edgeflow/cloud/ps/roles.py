"""What a trainable package says about its training: its variables, each one's gradient,
optimizer update, slots and placement (the "edgeflow.roles" metadata), and the `train` and
`restore` signatures. The parameter server and the device loops both read it.
"""
import dataclasses

import numpy as np

from ... import ops
from ...errors import FormatError, GraphError, InvalidInputError, PlacementError
from ...format import metadata
from ...format.model import RESTORE


@dataclasses.dataclass
class VariableRole:
    """One trainable variable: its tensor, the gradient its optimizer applies, the ops of its
    update that write state (assigns), the slots they write, and where they run."""
    name: str
    index: int
    gradient: str  # the gradient tensor's name
    assigns: list  # operator indices
    slots: list  # slot variable names
    placement: str  # "cloud", "device" or ""


class TrainingRoles:
    """The training structure of a trainable package (a ModelDef): its variables, each
    trainable one's gradient, update ops, slots and placement (edgeflow.format.metadata.Roles), the
    `train` signature and the `restore` assigns that set variables."""

    def __init__(self, model):
        sub = model.subgraphs[0]
        self.tensors, self.operators = sub.tensors, sub.operators
        signatures = {s.key: s for s in model.signatures}
        for key in ("train", RESTORE):
            if key not in signatures:
                raise FormatError(f"expected a trainable package with a {key!r} signature (ef.save with "
                                  f"'train': (inputs, {{'loss': loss}}, [optimizer.minimize(loss)])); "
                                  f"it has {sorted(signatures)}")
        found = metadata.roles(model)  # malformed or out of range: FormatError
        if found is None:
            raise FormatError(f"the package has no {metadata.ROLES!r} metadata: expected one made by "
                              "ef.save/ef.to_model from a graph with an optimizer")
        update, gradients = found.update, found.gradients
        self.variables = {t.name: i for i, t in enumerate(self.tensors) if t.is_variable}
        self.train = signatures["train"]
        self.inputs = {name: self.tensors[i].name for name, i in self.train.inputs.items()}
        self.outputs = {name: self.tensors[i].name for name, i in self.train.outputs.items()}
        restore = signatures[RESTORE]
        writes = {self.operators[op].inputs[0]: op for op in restore.targets}
        self.restore = {}  # variable name -> (restore input tensor name, its assign op)
        for name, i in restore.inputs.items():
            var = self.variables.get(name)
            if var is None or var not in writes or self.operators[writes[var]].inputs[1] != i:
                raise FormatError(f"the {RESTORE!r} signature's input {name!r} does not assign a variable")
            self.restore[name] = (self.tensors[i].name, writes[var])
        self.roles = {}  # name -> VariableRole, for every variable its optimizer updates
        by_var = {}
        for op, var in update.items():
            by_var.setdefault(var, []).append(op)
        for var, op_list in sorted(by_var.items()):
            if var not in gradients or not self.tensors[var].is_variable:
                continue
            assigns = sorted(op for op in op_list if ops.get(self.operators[op].opcode).stateful)
            places = {self.operators[op].placement or "" for op in assigns}
            if len(places) > 1:
                raise PlacementError(f"variable {self.tensors[var].name!r}: its optimizer update is placed "
                                     f"on {sorted(places)}; expected one side")
            slots = sorted({self.tensors[self.operators[op].inputs[0]].name for op in assigns} -
                           {self.tensors[var].name})
            self.roles[self.tensors[var].name] = VariableRole(
                self.tensors[var].name, var, self.tensors[gradients[var]].name, assigns, slots,
                places.pop() if places else "")
        if not self.roles:
            raise FormatError("the package's roles name no variable updated by an optimizer")

    def served(self, which="cloud"):
        """Names of the trainable variables a parameter server holds: those whose updates
        are placed "cloud" (`with ef.device("cloud")`), or "all"."""
        if which == "all":
            return list(self.roles)
        names = [n for n, r in self.roles.items() if r.placement == "cloud"]
        if not names:
            raise PlacementError("no trainable variable is placed in the cloud: create them under "
                                 "`with ef.device(\"cloud\"):`, or serve every one (variables=\"all\")")
        return names

    def check_served(self, names):
        """InvalidInputError unless `names` are trainable variables of this package."""
        unknown = [n for n in names if n not in self.roles]
        if unknown:
            raise InvalidInputError(f"the server holds variable(s) {unknown} that this package does not "
                                    f"train; it trains {sorted(self.roles)} (another package?)")

    def slots_of(self, names):
        return [s for n in names for s in self.roles[n].slots]

    def update_targets(self, names):
        """The assign ops of the updates of variables `names` (their slots' writes included)."""
        return sorted(op for n in names for op in self.roles[n].assigns)

    def device_targets(self, names):
        """The `train` signature's targets, less the updates of the variables `names`."""
        remote = set(self.update_targets(names))
        return [op for op in self.train.targets if op not in remote]

    def check_update_closed(self, names):
        """GraphError unless the updates of `names` need only their gradients, constants and
        the server's variables (those, and their slots)."""
        held = {self.variables[n] for n in list(names) + self.slots_of(names)}
        fed = {i for i, t in enumerate(self.tensors) if t.name in {self.roles[n].gradient for n in names}}
        producer = {t: i for i, op in enumerate(self.operators) for t in op.outputs}
        seen, todo = set(), [t for op in self.update_targets(names) for t in self.operators[op].inputs]
        while todo:
            t = todo.pop()
            if t in seen or t in fed or t in held:
                continue
            seen.add(t)
            tensor = self.tensors[t]
            if tensor.is_variable:
                raise GraphError(f"the optimizer update of the served variables reads variable "
                                 f"{tensor.name!r}, which the server does not hold")
            if t in producer:
                todo.extend(self.operators[producer[t]].inputs)
            elif tensor.data is None:
                raise GraphError(f"the optimizer update of the served variables needs {tensor.name!r} "
                                 "(fed at run time), which the server does not have; expected updates "
                                 "computed from the gradients, the variables and constants")

    def set_variables(self, interp, values):
        """Write {variable name: array} into `interp`'s variables through the package's
        `restore` assigns (only those named)."""
        if not values:
            return
        feeds, targets = {}, []
        for name, value in values.items():
            tensor_name, op = self.restore[name]
            feeds[tensor_name] = value
            targets.append(op)
        interp.run([], feeds, targets)

    def initial(self, name):
        """A variable's value in the package."""
        return np.array(self.tensors[self.variables[name]].data)

    def spec(self, name):
        t = self.tensors[self.variables[name]]
        return t.dtype, tuple(t.shape)

