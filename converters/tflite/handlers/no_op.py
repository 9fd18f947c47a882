"""TFLite ops that build no edgeflow op."""
from . import handler


@handler("DENSIFY", op=None)
def _densify(ctx, op):
    """The reader's sparse constant, densified while converting (context.densify)."""
    ctx.alias(op.outputs[0], op.inputs[0])
