"""edgeflow: package, run and train neural networks on the device, split with the cloud.

`import edgeflow as ef` gives the TensorFlow-style builder (`ef.placeholder`,
`ef.matmul`, `ef.nn.relu`, ...), `ef.save` to package a graph, and `ef.Interpreter`
to run a package.

The top level is lazy (PEP 562): the builder (edgeflow.graph) is imported the first time
one of its names is used, so a device that only runs packages (`import edgeflow.interp`,
or `ef.Interpreter`) never loads it.
"""
import importlib
import importlib.util

from . import errors
from .dtypes import (bfloat16, bool_, float16, float32, float64, int8, int16, int32, int64, uint8, uint16, uint32,
                     uint64)

__version__ = "0.1.0"

_DEVICE = {"Interpreter", "SignatureRunner"}
# Builder names that graph/__init__.py's __all__ does not list.
_BUILDER_EXTRA = {"save", "to_model", "slice", "strided_slice", "nn"}


def _builder_names():
    graph = importlib.import_module(".graph", __name__)
    return graph, set(graph.__all__) | _BUILDER_EXTRA


def __getattr__(name):
    if name in _DEVICE:
        value = getattr(importlib.import_module(".interp", __name__), name)
    elif name.startswith("__") or importlib.util.find_spec(f"{__name__}.{name}") is not None:
        # A submodule: `from edgeflow import ops` asks for the attribute first, and the
        # import system imports the submodule only when that fails.
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    else:
        graph, names = _builder_names()
        if name not in names:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(graph, name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__():
    return sorted(set(globals()) | _DEVICE | _builder_names()[1])
