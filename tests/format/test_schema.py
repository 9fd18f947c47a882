"""schema.fbs, the generated code, the verifier's layout and the enums agree."""
import filecmp
import pathlib
import shutil
import subprocess

import pytest

from edgeflow import dtypes
from edgeflow.format import verifier
from edgeflow.format.efl.AttrType import AttrType
from edgeflow.format.efl.DType import DType
from edgeflow.format.model import FILE_IDENTIFIER
from edgeflow.ops import AttrKind

from . import fbs

FORMAT = pathlib.Path(verifier.__file__).parent


def test_verifier_layout_matches_schema():
    schema = fbs.parse()
    as_declared = {name: [(f, t, int(d) if d else None) for f, t, d in fields]
                   for name, fields in schema["tables"].items()}
    mirrored = {name: [(f[0], f[1], f[2] if len(f) > 2 else None) for f in fields]
                for name, fields in verifier.TABLES.items()}
    assert mirrored == as_declared
    assert {n: [(f, t) for f, t, _ in fs] for n, fs in schema["structs"].items()} == \
        {n: list(fs) for n, fs in verifier.STRUCTS.items()}
    assert {n: base for n, (base, _) in schema["enums"].items()} == verifier.ENUMS


def test_schema_identifier_is_the_models():
    assert f'file_identifier "{FILE_IDENTIFIER.decode()}";' in fbs.SCHEMA.read_text()


def test_attr_type_enum_equals_attr_kind():
    members = fbs.parse()["enums"]["AttrType"][1]
    assert {k: v for k, v in members.items() if k != "NONE"} == {k.name: k.value for k in AttrKind}
    assert all(getattr(AttrType, k.name) == k.value for k in AttrKind)


def test_dtype_enum_follows_dtypes_order():
    members = fbs.parse()["enums"]["DType"][1]
    assert members == {dtypes.name(dt).upper(): dtypes.to_code(dt) for dt in dtypes.ALL}
    assert all(getattr(DType, name) == code for name, code in members.items())


def test_generated_code_is_up_to_date(tmp_path):
    venv_flatc = FORMAT.parents[1] / ".venv" / "bin" / "flatc"  # the pinned 25.12.19
    flatc = str(venv_flatc) if venv_flatc.exists() else shutil.which("flatc")
    if flatc is None:
        pytest.skip("flatc not installed")
    subprocess.run([flatc, "--python", "-o", str(tmp_path), str(fbs.SCHEMA)], check=True)
    fresh = tmp_path / "edgeflow" / "format" / "efl"
    names = sorted(p.name for p in fresh.glob("*.py"))
    assert names == sorted(p.name for p in (FORMAT / "efl").glob("*.py"))
    match, mismatch, errors = filecmp.cmpfiles(fresh, FORMAT / "efl", names, shallow=False)
    assert not mismatch and not errors, "run edgeflow/format/generate.sh"
