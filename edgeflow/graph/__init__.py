"""The graph IR and its TensorFlow-style builder API (re-exported as `edgeflow`)."""
from . import data, losses, nn, summary, train
from .graph import (Graph, Node, Tensor, constant, convert_to_tensor, device, get_default_graph,
                    placeholder, reset_default_graph)
from . import math_ops
from .math_ops import *  # noqa: F401,F403
from .math_ops import slice, strided_slice  # noqa: A004
from .gradients import gradients
from .control import case, cond, map_fn, while_loop
from . import layers
from .save import save, to_model
from .session import Session
from .variables import (Operation, Variable, assign, assign_add, assign_sub, global_variables,
                        global_variables_initializer, glorot_uniform, group, ones, random_normal,
                        random_uniform, set_random_seed, trainable_variables, variables_initializer,
                        zeros)

__all__ = ["Graph", "Node", "Tensor", "constant", "convert_to_tensor", "device", "get_default_graph",
           "placeholder", "reset_default_graph", "data", "nn", "layers", "save", "to_model", "Session", "Operation", "gradients",
           "losses", "summary", "train", "cond", "case", "while_loop", "map_fn",
           "Variable", "assign", "assign_add", "assign_sub", "global_variables",
           "global_variables_initializer", "glorot_uniform", "group", "ones", "random_normal",
           "random_uniform", "set_random_seed", "trainable_variables", "variables_initializer",
           "zeros", *math_ops.__all__]
