"""tools/: the programs that make what the package keeps as constants make them again."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from edgeflow.interp.kernels import jit

TOOLS = Path(__file__).parent.parent / "tools"


def _tool(name):
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_fit_tanh_makes_the_gates_coefficients_again():
    """tools/fit_tanh.py's fit, run again, gives jit._tanh_gate's coefficients (to float32's
    rounding, give or take the last bits a different BLAS may leave in the least squares),
    and its float32 evaluation is within 3.5e-7 of float64 tanh."""
    fit = _tool("fit_tanh")
    p, q, relative = fit.fit(9.0)
    assert relative < 1e-8
    np.testing.assert_allclose(p, np.float32(jit._G_P), rtol=1e-4, atol=0)
    np.testing.assert_allclose(q, np.float32(jit._G_Q), rtol=1e-4, atol=0)
    x = np.linspace(-12, 12, 200_001, dtype=np.float32)
    assert np.abs(fit.tanh32(x, p, q, 9.0) - np.tanh(x.astype(np.float64))).max() <= 3.5e-7
