"""README.md: its links stay inside the repository, and its command-line table names every
verb with flags that verb really has (the table is what new users read first)."""
import pathlib
import re

import pytest

from edgeflow.cli import VERBS, build_parser

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _table():
    """{verb: set of --flags} from the rows of the "The command line" table."""
    section = README.split("## The command line", 1)[1].split("\n## ", 1)[0]
    flags = {}
    for row in re.findall(r"^\| `edgeflow (\w+)([^`]*)`", section, re.M):
        flags.setdefault(row[0], set()).update(re.findall(r"--[a-z][a-z0-9-]*", row[1]))
    return flags


def _options(verb):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "verb").choices[verb]
    return {o for a in sub._actions for o in a.option_strings}


def test_links_point_into_the_repository():
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    assert links, "the README links to its docs"
    for link in links:
        if link.startswith("#"):
            continue
        assert not re.match(r"[a-z]+:", link), f"{link}: the README links only to files in the repository"
        assert (ROOT / link.split("#")[0]).resolve().is_relative_to(ROOT), link
        assert (ROOT / link.split("#")[0]).exists(), f"{link}: no such file in the repository"


def test_every_verb_has_a_row():
    assert set(VERBS) <= set(_table()), sorted(set(VERBS) - set(_table()))


@pytest.mark.parametrize("verb", VERBS)
def test_the_flags_the_table_shows_exist(verb):
    shown = _table().get(verb, set())
    assert shown <= _options(verb), f"edgeflow {verb} has no {sorted(shown - _options(verb))}"


def test_the_documented_apis_are_there():
    for text in ("convert resnet18.onnx -o resnet18-train.efl --trainable", "Interpreter(model, num_threads=N)",
                 "ef.data.Dataset", "edgeflow export", "--logdir", "inspect MODEL [--json]"):
        assert text in README, text
