"""Suite-wide settings: hypothesis profiles and the `slow` marker.

Hypothesis profiles (HYPOTHESIS_PROFILE selects one): `dev`, the default locally, runs
few examples per property, the same ones each run (so the OpenCL programs their shapes
need are compiled once and cached); `ci` (the default where CI is set) runs hundreds of
fresh ones; `fuzz` runs a long campaign, for a machine with time to spare:
    HYPOTHESIS_PROFILE=fuzz python -m pytest tests/format/test_fuzz.py --run-slow

Tests marked `slow` run in CI and with --run-slow (or -m slow), not in a plain local run.
"""
import os

from hypothesis import HealthCheck, settings

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
settings.register_profile("dev", deadline=None, suppress_health_check=_QUIET)
settings.register_profile("ci", deadline=None, suppress_health_check=_QUIET,
                          print_blob=True)
settings.register_profile("fuzz", deadline=None, suppress_health_check=_QUIET,
                          print_blob=True)
IN_CI = bool(os.environ.get("CI"))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if IN_CI else "dev"))

# In the default JIT mode a process's first plans bind without numba while it loads in the
# background, and are made again once it is ready (edgeflow/interp/kernels/jit.py's
# `deferred`). Loaded here, before any test, every test's plans bind as a long-running
# process's do, whichever tests ran before it in its worker: two interpreters of a test
# never straddle the load. The first-run policy is tested in fresh interpreters
# (tests/interp/test_jit.py). Under EDGEFLOW_JIT=0 nothing is imported.
from edgeflow.interp.kernels import jit as _jit  # noqa: E402

_jit.available()


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true",
                     help="also run the tests marked slow (CI always runs them)")


def pytest_collection_modifyitems(config, items):
    if IN_CI or config.getoption("--run-slow") or config.getoption("-m"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def pytest_report_header(config):
    runs_slow = IN_CI or config.getoption("--run-slow") or config.getoption("-m")
    return (f"hypothesis profile: {settings._current_profile}; "
            f"slow tests: {'run' if runs_slow else 'deselected (--run-slow runs them)'}")
