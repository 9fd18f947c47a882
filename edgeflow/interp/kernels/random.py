"""Kernels of edgeflow/ops/random.py: one numpy Generator per bound kernel, seeded when the
plan is prepared, drawn from on every run."""
import numpy as np

from . import kernel


@kernel("random_uniform")
def _random_uniform(ins, outs, attrs):
    rng = np.random.default_rng(attrs["seed"])
    out, low, span = outs[0], attrs["minval"], attrs["maxval"] - attrs["minval"]

    def run():
        rng.random(dtype=out.dtype, out=out)
        np.multiply(out, span, out=out)
        np.add(out, low, out=out)
    return run
