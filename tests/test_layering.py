"""The package's layout holds: the device path imports only itself, and every import
points down the layers of docs/architecture.md."""
import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import edgeflow
from test_op_families import parse  # ast.parse, again past CPython 3.11's spurious SystemError

ROOT = Path(edgeflow.__file__).parent
CONVERTERS = ROOT.parent / "converters"

# What each layer may import besides itself and the base modules (errors, dtypes, atomic).
# Keep in step with docs/architecture.md.
ALLOWED = {
    "ops": set(),
    "format": {"ops"},
    "interp": {"format", "ops"},
    "accel": {"interp", "format", "ops"},
    "graph": {"interp", "format", "ops"},
    "training_loop": {"interp", "format", "ops"},
    "tensorboard": {"interp", "format", "ops"},
    "splitter": {"interp", "format", "ops"},
    "cloud": {"splitter", "accel", "interp", "format", "ops", "training_loop", "tensorboard"},
    "converters": {"graph", "format", "ops"},
    "top": {"graph", "interp"},
}
BASE = {"errors", "dtypes", "atomic"}
EVERYTHING = set(ALLOWED) - {"top"}
COMMAND_LINE = {"cli", "__main__"}


def layer(module):
    """The layer of a dotted module name inside edgeflow (None outside it)."""
    parts = module.split(".")
    if parts[0] == "converters" or parts[:2] == ["edgeflow", "converters"]:
        return "converters"
    if parts[0] != "edgeflow":
        return None
    if len(parts) == 1:
        return "top"
    return "cli" if parts[1] in COMMAND_LINE else parts[1]


def module_name(path):
    if path.is_relative_to(CONVERTERS):
        rel, prefix = path.relative_to(CONVERTERS.parent), []
    else:
        rel, prefix = path.relative_to(ROOT.parent), []
    parts = prefix + list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts), parts[-1] == "__init__"


def imports(path):
    """Every module `path` imports, at any depth of the file (lazy imports included)."""
    name, is_package = module_name(path)
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            yield target
            # `from package import module` imports that module too.
            yield from (f"{target}.{a.name}" for a in node.names if is_module(f"{target}.{a.name}"))


def is_module(dotted):
    try:
        return importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError):
        return False


def sources():
    for path in sorted(list(ROOT.rglob("*.py")) + list(CONVERTERS.rglob("*.py"))):
        generated = path.parent.name == "efl" or "_pb2" in path.name  # flatc's and protoc's
        if not generated:
            yield path


def test_imports_point_down_the_layers():
    bad = []
    for path in sources():
        source = layer(module_name(path)[0])
        if source in BASE or source == "cli":
            allowed = EVERYTHING | {"cli"} if source == "cli" else set()
        else:
            assert source in ALLOWED, f"{path}: layer {source!r} is not in the table"
            allowed = ALLOWED[source]
        for target in set(imports(path)):
            dest = layer(target)
            if dest is None or dest == source or dest in BASE or dest == "top":
                continue
            if target.split(".")[-1] in BASE and layer(target.rpartition(".")[0]) == "top":
                continue  # `from .. import errors`
            if dest not in allowed:
                bad.append(f"{path.relative_to(ROOT.parent)}: {source} imports {target}")
    assert not bad, "\n".join(sorted(bad))


def loaded_after(statement):
    """(edgeflow modules, third-party top-level modules) loaded by `statement` in a fresh
    interpreter."""
    code = (f"{statement}\nimport sys, json\n"
            "mods = sorted(sys.modules)\n"
            "print(json.dumps([[m for m in mods if m.split('.')[0] == 'edgeflow'],"
            " sorted({m.split('.')[0] for m in mods} - set(sys.stdlib_module_names))]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("statement", ["import edgeflow.interp",
                                       "import edgeflow; edgeflow.Interpreter"])
def test_the_device_path_imports_only_itself(statement):
    ours, theirs = loaded_after(statement)
    layers = {layer(m) for m in ours}
    assert layers <= {"top", "interp", "format", "ops"} | BASE, sorted(layers)
    assert "edgeflow.interp" in ours and "edgeflow.format.reader" in ours
    # numpy and flatbuffers, and what site-packages' .pth files load at start-up.
    extra = {m for m in theirs if m not in ("numpy", "flatbuffers", "edgeflow", "_distutils_hack", "__main__")
             and not m.startswith("__editable__")}
    assert not extra, extra


def test_the_builder_loads_on_first_use():
    ours, _ = loaded_after("import edgeflow as ef")
    assert not {layer(m) for m in ours} - ({"top"} | BASE), ours
    ours, _ = loaded_after("import edgeflow as ef; ef.placeholder")
    assert "edgeflow.graph" in ours and "edgeflow.interp.interpreter" not in ours


def test_converters_install_inside_edgeflow(tmp_path):
    """converters/ sits at the repository's root but installs as edgeflow.converters: no
    top-level `converters` in site-packages to collide with another distribution's."""
    code = ("import importlib.util as u, json; print(json.dumps([u.find_spec('converters') is None,"
            " u.find_spec('edgeflow.converters.onnx').origin]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=tmp_path)
    no_top_level, origin = json.loads(out.stdout)
    assert no_top_level and Path(origin) == CONVERTERS / "onnx" / "__init__.py"
