"""An op family lives in one place: each op's numpy kernel, OpenCL launcher and ONNX
handlers sit in the modules named like the ops/ module that defines it, gradient ops
beside their forward op, and kernel modules share nothing private."""
import ast
import pathlib

import pytest

from edgeflow.converters.onnx.handlers import BUILDS, HANDLERS
from edgeflow.converters.tflite import handlers as tflite_handlers
from edgeflow import ops
from edgeflow.accel.kernels import CL_KERNELS
from edgeflow.interp.kernels import KERNELS

ROOT = pathlib.Path(__file__).resolve().parents[1]
KERNEL_PACKAGES = ("edgeflow/interp/kernels", "edgeflow/accel/kernels", "converters/onnx/handlers",
                   "converters/tflite/handlers")
# The forward op of each gradient op whose name is not "<forward>_grad". sum_to is a sum
# over axes (the gradient of broadcasting): it lives with the reductions.
FORWARD = {"sum_to": "reduce_sum", "conv_input_grad": "conv", "conv_filter_grad": "conv"}
NO_OP = "no_op"  # the handler module of ONNX nodes that build no edgeflow op


def home(op):
    """The ops/ module (its last name) that defines op `op`."""
    return ops.get(op).infer.__module__.rsplit(".", 1)[1]


def module_name(fn):
    return fn.__module__.rsplit(".", 1)[1]


def misplaced(registry):
    """(name, module it sits in, module it belongs in) for each entry out of place."""
    return sorted((name, module_name(fn), home(name)) for name, fn in registry.items()
                  if module_name(fn) != home(name))


def test_numpy_kernels_sit_in_their_ops_module():
    assert KERNELS
    assert misplaced(KERNELS) == []


def test_opencl_launchers_sit_in_their_ops_module():
    launchers = {name: entry.make for name, entry in CL_KERNELS.items() if entry.make is not None}
    assert launchers
    assert misplaced(launchers) == []


def test_onnx_handlers_sit_in_the_module_of_the_op_they_build():
    assert HANDLERS.keys() == BUILDS.keys()
    placed = sorted((onnx_type, module_name(fn), NO_OP if BUILDS[onnx_type] is None else home(BUILDS[onnx_type]))
                   for onnx_type, fn in HANDLERS.items())
    assert [p for p in placed if p[1] != p[2]] == []


def test_tflite_handlers_sit_in_the_module_of_the_op_they_build():
    handlers, builds = tflite_handlers.HANDLERS, tflite_handlers.BUILDS
    assert handlers.keys() == builds.keys() and "CONV_2D" in handlers
    placed = sorted((opcode, module_name(fn), NO_OP if builds[opcode] is None else home(builds[opcode]))
                    for opcode, fn in handlers.items())
    assert [p for p in placed if p[1] != p[2]] == []


def gradient_ops():
    return [name for name in ops.names() if name.endswith("_grad") or name in FORWARD]


def test_gradient_ops_are_defined_beside_their_forward_op():
    grads = gradient_ops()
    assert "sum_to" in grads and "conv_input_grad" in grads
    apart = [(g, home(g), home(FORWARD.get(g, g[:-len("_grad")]))) for g in grads]
    assert [a for a in apart if a[1] != a[2]] == []


def parse(text, attempts=3):
    """ast.parse(text), again where CPython 3.11 raises its spurious SystemError "AST
    constructor recursion depth mismatch" (python/cpython#106905: the AST state is the
    interpreter's, and a thread of another test's library, such as Ray's, building an AST
    meanwhile upsets it)."""
    for attempt in range(attempts):
        try:
            return ast.parse(text)
        except SystemError:
            if attempt == attempts - 1:
                raise


def private_imports(path):
    """Private names that module `path` takes from another module: `from m import _x`,
    or `m._x` where m is a module it imported."""
    tree = parse(path.read_text())
    modules, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"line {node.lineno}: imports {alias.name}")
                modules.add(name)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"line {node.lineno}: uses {node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("package", KERNEL_PACKAGES)
def test_kernel_modules_import_no_private_names(package):
    files = sorted((ROOT / package).glob("*.py"))
    assert files
    offences = {str(f.relative_to(ROOT)): private_imports(f) for f in files}
    assert {f: o for f, o in offences.items() if o} == {}


def test_the_private_import_check_sees_both_forms(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("from .image import _ROUND, source_coordinates\nfrom . import pool\n"
                      "counts = pool._window_counts\nok = pool.public\n")
    assert private_imports(source) == ["line 1: imports _ROUND", "line 3: uses pool._window_counts"]
