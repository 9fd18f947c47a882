"""Op definitions, one registry for the whole project (see registry.py)."""
from .registry import REQUIRED, Attr, AttrKind, OpDef, TensorSpec, Types, define, find, get, gradient, names
from . import math, nn, array, reduce, shape, conv, pool, norm, image, activations, attention, einsum, rnn, state, random, comm, quantize, loss, select, signal, control, geometry, optim  # noqa: F401,E501  (each module registers its ops)

__all__ = ["REQUIRED", "Attr", "AttrKind", "OpDef", "TensorSpec", "Types", "define", "find", "get",
           "gradient", "names"]
