"""`python benchmarks/netlab [--quick]`: the lab's self-test (or one of its tools)."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from netlab import selftest  # noqa: E402

sys.exit(selftest.main(sys.argv))
