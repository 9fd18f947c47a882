"""Ops that write variables: assign, assign_add, assign_sub.

Input 0 is a variable (trainable state, kept outside the arena); they have no outputs
and are run for their effect, after every op that does not depend on them, so that
reads in the same run see the old values, as an optimizer's updates need.
"""
from .. import dtypes
from ..errors import GraphError
from .registry import Types, define
from .dims import fmt


def _update(name):
    def infer(inputs, attrs):
        var, value = inputs
        if None not in var.shape + value.shape and var.shape != value.shape:
            raise GraphError(f"{name}: the value {value.dtype}{fmt(value.shape)} must match the "
                             f"variable {var.dtype}{fmt(var.shape)}")
        return []
    infer.__doc__ = f"{name}(variable, value): writes the variable in place; no outputs."
    return infer


for _name, _allowed in (("assign", dtypes.ANY), ("assign_add", dtypes.NUMERIC), ("assign_sub", dtypes.NUMERIC)):
    define(_name, stateful=True, types=Types("variable: T, value: T ->", T=_allowed))(_update(_name))


