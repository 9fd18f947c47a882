"""`ef.train`: optimizers that add their updates to the graph, as tf.train's do.

`opt.minimize(loss)` is `apply_gradients(compute_gradients(loss))`: gradient nodes from
`ef.gradients`, then per variable the ops computing its new value and its slots' new
values, and assign ops writing them. Within one run the writes come after every read
(see edgeflow/interp/plan.py), so each rule reads old values and writes new ones, and
the same Operation trains through ef.Session or a packaged `train` signature.

Slots are non-trainable variables named `<var>/<Optimizer>/<slot>`, so `save`,
`restore` and checkpoints carry them with the model. Each update runs where its
variable is placed (`ef.device`).
"""
import numpy as np

from ..errors import GraphError
from .gradients import gradients
from .graph import Tensor, constant
from .math_ops import apply, cast, pow, sqrt  # noqa: A004
from .save import needed_nodes
from .variables import VARIABLE, Variable, group, is_variable

__all__ = ["Optimizer", "GradientDescent", "Momentum", "Adam", "AdamW", "Adagrad", "RMSProp"]


class Optimizer:
    """Gradients, slots and grouping; a subclass gives `_updates(grad, var)`, which builds
    (inside var's graph and device) and returns the var's assign Operations."""

    def __init__(self, learning_rate, name):
        if isinstance(learning_rate, Tensor) and learning_rate.shape != ():
            raise GraphError(f"{name}: learning_rate must be a scalar, got {learning_rate!r}")
        if not isinstance(learning_rate, Tensor) and not learning_rate >= 0:
            raise GraphError(f"{name}: learning_rate must be >= 0, got {learning_rate!r}")
        self.learning_rate, self.name = learning_rate, name
        self._slots = {}  # (variable node, slot name) -> slot variable

    def compute_gradients(self, loss, var_list=None):
        """[(gradient or None, variable)] for `var_list` (default: the trainable variables
        `loss` depends on)."""
        if var_list is None:
            needed = needed_nodes([loss])
            var_list = [n.outputs[0] for n in loss.graph.nodes
                        if n in needed and n.op == VARIABLE and n.attrs["trainable"]]
        var_list = list(var_list)
        for v in var_list:
            if not is_variable(v):
                raise GraphError(f"{self.name}: var_list holds {v!r}, which is not an ef.Variable")
        if not var_list:
            raise GraphError(f"{self.name}: the loss {loss.name!r} depends on no trainable variable")
        return list(zip(gradients(loss, var_list), var_list))

    def apply_gradients(self, grads_and_vars, name=None):
        """One Operation updating each variable whose gradient is not None."""
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            names = [v.node.name for _, v in grads_and_vars]
            raise GraphError(f"{self.name}: no gradient reaches any of the variables {names}")
        updates = []
        for grad, var in pairs:
            var.graph.gradient_of[var.node] = grad  # recorded in the package's roles
            with var.graph.as_default(), var.graph.device(var.node.device), \
                    var.graph.role("update", var.node):
                updates.extend(self._updates(grad, var))
        op = group(*updates, name=name or self.name)
        self._summarize_learning_rate(pairs[0][1], op)
        return op

    def _summarize_learning_rate(self, var, op):
        """The learning rate as the scalar summary "learning_rate" of the train signatures
        that run `op` (edgeflow.graph.summary.add_learning_rate)."""
        from .summary import add_learning_rate
        lr = self.learning_rate
        if not isinstance(lr, Tensor):
            with var.graph.as_default():
                lr = constant(lr, dtype=var.dtype, name=f"{self.name}/learning_rate")
        add_learning_rate(var.graph, lr, op.nodes, self)

    def minimize(self, loss, var_list=None, name=None):
        """An Operation doing one step of this optimizer on `loss`."""
        return self.apply_gradients(self.compute_gradients(loss, var_list), name=name)

    def get_slot(self, var, name):
        """The slot variable `name` of `var`, or None."""
        return self._slots.get((var.node, name))

    def get_slot_names(self):
        return sorted({name for _, name in self._slots})

    def _slot(self, var, name, value=0.0, dtype=None, shape=None):
        key = (var.node, name)
        if key not in self._slots:
            initial = np.full(var.shape if shape is None else shape, value, dtype or var.dtype)
            self._slots[key] = Variable(initial, name=f"{var.node.name}/{self.name}/{name}", trainable=False)
        return self._slots[key]

    def _lr(self, var):
        lr = self.learning_rate
        if isinstance(lr, Tensor):
            return lr if lr.dtype == var.dtype else cast(lr, var.dtype)
        return _const(lr, var)


def _const(value, like):
    """A scalar constant of `like`'s dtype (Python floats do not mix with float32 tensors)."""
    return constant(value, dtype=like.dtype)


class GradientDescent(Optimizer):
    """var -= lr * grad (tf.train.GradientDescentOptimizer)."""

    def __init__(self, learning_rate, name="GradientDescent"):
        super().__init__(learning_rate, name)

    def _updates(self, grad, var):
        return [var.assign_sub(self._lr(var) * grad)]


class Momentum(Optimizer):
    """tf.train.MomentumOptimizer (the same as torch.optim.SGD with momentum, dampening 0):

        accum = momentum * accum + grad
        var -= lr * accum                             (use_nesterov=False)
        var -= lr * grad + lr * momentum * accum      (use_nesterov=True)
    """

    def __init__(self, learning_rate, momentum, use_nesterov=False, name="Momentum"):
        super().__init__(learning_rate, name)
        self.momentum, self.use_nesterov = momentum, use_nesterov

    def _updates(self, grad, var):
        accum = self._slot(var, "momentum")
        mu, lr = _const(self.momentum, var), self._lr(var)
        new = mu * accum + grad
        step = lr * (grad + mu * new) if self.use_nesterov else lr * new
        return [accum.assign(new), var.assign_sub(step)]


class Adam(Optimizer):
    """torch.optim.Adam (epsilon added to the bias-corrected sqrt(v), where TF1's Adam adds
    its "epsilon hat" to the uncorrected one), with t counted per variable in slot `step`:

        t += 1;  m = beta1 * m + (1 - beta1) * grad;  v = beta2 * v + (1 - beta2) * grad^2
        var -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon)
    """

    weight_decay = 0.0

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, name="Adam"):
        super().__init__(learning_rate, name)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon

    def _updates(self, grad, var):
        m, v = self._slot(var, "m"), self._slot(var, "v")
        # counted in float32 at least: a float16 counter stops at 2048
        step = self._slot(var, "step", dtype=np.promote_types(var.dtype, np.float32), shape=())
        t = step + _const(1.0, step)
        correction1, correction2 = _bias_correction(self.beta1, t, var), _bias_correction(self.beta2, t, var)
        # the elementwise step in one op, one pass (its unfused ops' arithmetic and rounding)
        new_m, new_v, delta = apply("adam_update", [m, v, grad, self._lr(var), correction1, correction2]
                                    + ([var] if self.weight_decay else []),
                                    {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon,
                                     "weight_decay": self.weight_decay}, name=f"{var.node.name}/{self.name}/update")
        return [m.assign(new_m), v.assign(new_v), step.assign(t), var.assign_sub(delta)]


def _bias_correction(beta, t, var):
    """1 - beta^t, computed in t's dtype, as var's."""
    c = _const(1.0, t) - pow(_const(beta, t), t)
    return c if c.dtype == var.dtype else cast(c, var.dtype)


class AdamW(Adam):
    """torch.optim.AdamW: Adam plus decoupled weight decay (Loshchilov & Hutter), the decay
    taken from the variable's value before the step, scaled by lr but not by Adam's
    normalisation:

        var -= lr * weight_decay * var + (Adam's step above)
    """

    def __init__(self, learning_rate=0.001, weight_decay=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 name="AdamW"):
        super().__init__(learning_rate, beta1, beta2, epsilon, name)
        self.weight_decay = weight_decay


class Adagrad(Optimizer):
    """tf.train.AdagradOptimizer (no epsilon; torch.optim.Adagrad adds one to sqrt(accum)):

        accum += grad^2;  var -= lr * grad / sqrt(accum)
    """

    def __init__(self, learning_rate, initial_accumulator_value=0.1, name="Adagrad"):
        super().__init__(learning_rate, name)
        if not initial_accumulator_value > 0:
            raise GraphError(f"{name}: initial_accumulator_value must be > 0, "
                             f"got {initial_accumulator_value!r}")
        self.initial_accumulator_value = initial_accumulator_value

    def _updates(self, grad, var):
        accum = self._slot(var, "accumulator", self.initial_accumulator_value)
        new = accum + grad * grad
        return [accum.assign(new), var.assign_sub(self._lr(var) * grad / sqrt(new))]


class RMSProp(Optimizer):
    """tf.train.RMSPropOptimizer, its `rms` slot starting at ones (torch's at zeros, with
    epsilon outside the sqrt and lr outside the momentum buffer):

        rms = decay * rms + (1 - decay) * grad^2
        mg = decay * mg + (1 - decay) * grad                        (centered only)
        mom = momentum * mom + lr * grad / sqrt(rms - mg^2 + epsilon)   (mg = 0 if not centered)
        var -= mom

    The `momentum` slot is made only when momentum is not 0 (the result is the same).
    """

    def __init__(self, learning_rate, decay=0.9, momentum=0.0, epsilon=1e-10, centered=False,
                 name="RMSProp"):
        super().__init__(learning_rate, name)
        self.decay, self.momentum, self.epsilon, self.centered = decay, momentum, epsilon, centered

    def _updates(self, grad, var):
        rho, one, lr = _const(self.decay, var), _const(1.0, var), self._lr(var)
        rms = self._slot(var, "rms", 1.0)
        new_rms = rho * rms + (one - rho) * grad * grad
        updates, denom = [rms.assign(new_rms)], new_rms
        if self.centered:
            mg = self._slot(var, "mg")
            new_mg = rho * mg + (one - rho) * grad
            updates.append(mg.assign(new_mg))
            denom = new_rms - new_mg * new_mg
        step = lr * grad / sqrt(denom + _const(self.epsilon, var))
        if self.momentum:
            mom = self._slot(var, "momentum")
            step = _const(self.momentum, var) * mom + step
            updates.append(mom.assign(step))
        return updates + [var.assign_sub(step)]
