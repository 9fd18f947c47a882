"""Kernel of edgeflow/ops/einsum.py."""
from functools import partial

import numpy as np

from ...ops.einsum import numpy_equation
from . import kernel


@kernel("einsum")
def _einsum(ins, outs, attrs):
    equation = numpy_equation(attrs["equation"], len(ins))
    # The contraction order depends on shapes only: choose it once, while preparing.
    path = np.einsum_path(equation, *ins, optimize="greedy")[0]
    return partial(np.einsum, equation, *ins, out=outs[0], optimize=path)
