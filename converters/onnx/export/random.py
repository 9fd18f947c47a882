"""Random draws (edgeflow/ops/random.py): other numbers than edgeflow's, of the same law."""
import numpy as np

from . import elem_type, exporter, tensor_proto


@exporter
def random_uniform(g, op):
    """RandomUniformLike of a tensor of the shape the operand holds."""
    a, dtype = op.attrs, op.attrs["dtype"]
    shape = g.cast(op.inputs[0], op.input_specs[0].dtype, np.int64)
    like = g.node("ConstantOfShape", [shape], value=tensor_proto(np.zeros(1, dtype), "value"))
    g.node("RandomUniformLike", [like], op.outputs, dtype=elem_type(dtype), low=a["minval"], high=a["maxval"],
           seed=float(a["seed"]))