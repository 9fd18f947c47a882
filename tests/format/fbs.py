"""A small reader of schema.fbs, so tests can check code against the schema itself."""
import pathlib
import re

SCHEMA = pathlib.Path(__file__).resolve().parents[2] / "edgeflow" / "format" / "schema.fbs"


def parse(path=SCHEMA):
    """{"tables": {name: [(field, type, default or None)]}, "structs": ..., "enums":
    {name: (underlying type, {member: value})}} in declaration order."""
    text = re.sub(r"//[^\n]*", "", path.read_text())
    out = {"tables": {}, "structs": {}, "enums": {}}
    for kind, name, body in re.findall(r"\b(table|struct)\s+(\w+)\s*\{(.*?)\}", text, re.S):
        # name: type (= default)? (attributes)? ;
        fields = re.findall(r"(\w+)\s*:\s*([\w\[\]]+)\s*(?:=\s*([^;(]+?))?\s*"
                            r"(?:\([^)]*\))?\s*;", body)
        out[kind + "s"][name] = [(f, t, d.strip() or None) for f, t, d in fields]
    for name, base, body in re.findall(r"\benum\s+(\w+)\s*:\s*(\w+)\s*\{(.*?)\}", text, re.S):
        members = dict(re.findall(r"(\w+)\s*=\s*(-?\d+)", body))
        out["enums"][name] = (base, {k: int(v) for k, v in members.items()})
    return out


def voffset(table, field, schema=None):
    """The vtable offset of `table.field` (what generated code passes to _tab.Offset)."""
    fields = [f for f, _, _ in (schema or _SCHEMA)["tables"][table]]
    return 4 + 2 * fields.index(field)


_SCHEMA = parse()
