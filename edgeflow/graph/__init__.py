"""The graph IR and its TensorFlow-style builder API (re-exported as `edgeflow`)."""
from . import nn
from .graph import (Graph, Node, Tensor, constant, convert_to_tensor, device, get_default_graph,
                    placeholder, reset_default_graph)
from . import math_ops
from .math_ops import *  # noqa: F401,F403
from .math_ops import slice, strided_slice  # noqa: A004
from .save import save, to_model

__all__ = ["Graph", "Node", "Tensor", "constant", "convert_to_tensor", "device", "get_default_graph",
           "placeholder", "reset_default_graph", "nn", "save", "to_model", *math_ops.__all__]
