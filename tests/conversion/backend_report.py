"""Runs ONNX's backend node tests (test_onnx_backend.py) and prints the outcome per ONNX
op as a Markdown table: passed, failed, excluded (with the reasons); then the ops whose
cases do not run, with why.

    python tests/conversion/backend_report.py [pytest options, e.g. -n 2]

Exits with pytest's status.
"""
import collections
import pathlib
import re
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
OUTCOMES = ("passed", "failed", "excluded")


class Tally:
    """A pytest plugin that keeps each backend test's outcome (by ONNX test name)."""

    def __init__(self):
        self.outcomes = {}  # test name -> (outcome, exclude pattern or None)

    def pytest_runtest_logreport(self, report):
        name = report.nodeid.rpartition("::")[2].removesuffix("_cpu")
        if report.failed:
            self.outcomes[name] = ("failed", None)
        elif report.skipped:
            found = re.search(r'exclude pattern "(.*)"', str(report.longrepr))
            self.outcomes[name] = ("excluded", found and found.group(1))
        elif report.when == "call" and name not in self.outcomes:
            self.outcomes[name] = ("passed", None)


def table(outcomes, test_ops, excluded):
    """Markdown rows: op, a count per outcome, and why tests were excluded."""
    counts = collections.defaultdict(collections.Counter)
    reasons = collections.defaultdict(set)
    for name, (outcome, pattern) in outcomes.items():
        op = test_ops.get(name, "?")
        counts[op][outcome] += 1
        if pattern:
            reasons[op].add(excluded.get(pattern, pattern))
    rows = ["| ONNX op | " + " | ".join(OUTCOMES) + " | excluded because |",
            "|---" * (len(OUTCOMES) + 2) + "|"]
    for op in sorted(counts):
        rows.append(f"| {op} | " + " | ".join(str(counts[op][o]) for o in OUTCOMES)
                    + f" | {'; '.join(sorted(reasons[op]))} |")
    total = collections.Counter(outcome for outcome, _ in outcomes.values())
    rows.append("| **all** | " + " | ".join(str(total[o]) for o in OUTCOMES) + " | |")
    return "\n".join(rows)


def not_run_table(why, tested):
    """Markdown rows: each ONNX op whose cases do not run, how many, and why."""
    counts = collections.Counter((tested[name], reason) for name, reason in why.items())
    rows = ["| ONNX op (not run) | cases | why |", "|---|---|---|"]
    rows += [f"| {op} | {n} | {reason} |" for (op, reason), n in sorted(counts.items())]
    rows.append(f"| **all** | {sum(counts.values())} | |")
    return "\n".join(rows)


def main(args):
    sys.path.insert(0, str(HERE.parent))  # the name pytest gives the module (tests/ has no __init__)
    from conversion import test_onnx_backend as suite
    tally = Tally()
    status = pytest.main([str(HERE / "test_onnx_backend.py"), "-q", "-p", "no:cacheprovider", *args],
                         plugins=[tally])
    outcomes = {name: o for name, o in tally.outcomes.items() if name in suite.TEST_OPS}  # ONNX's cases only
    print()
    print(table(outcomes, suite.TEST_OPS, suite.EXCLUDED))
    print()
    print(not_run_table(suite.not_run(), suite.TESTED))
    passed = sum(outcome == "passed" for outcome, _ in outcomes.values())
    print(f"\n{passed} of ONNX's {len(suite.CASES)} node test cases pass.")
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
