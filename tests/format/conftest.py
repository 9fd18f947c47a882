"""Fixtures for the `.efl` format tests."""
import pytest

from edgeflow.ops import registry

from .models import EVERY_ATTR_OP, define_every_attr_op


@pytest.fixture(scope="package", autouse=True)
def every_attr_op():
    """A test-only op with an attribute of every kind (no real op has FLOAT, STRING
    and FLOATS attributes yet), registered for this package's tests only."""
    define_every_attr_op()
    yield
    registry._REGISTRY.pop(EVERY_ATTR_OP)  # the registry has no public way to undefine
