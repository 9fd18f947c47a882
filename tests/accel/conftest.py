"""The OpenCL tests need a device. The `opencl` extra brings PoCL's CPU device, so a
missing one is a broken install: every test here fails saying so, none is skipped."""
import pytest

import edgeflow.accel


@pytest.fixture(autouse=True, scope="session")
def opencl_device():
    if not edgeflow.accel.available():
        pytest.fail("no OpenCL device: install the 'opencl' extra (pyopencl with PoCL's CPU "
                    "runtime) or a GPU's OpenCL driver", pytrace=False)
