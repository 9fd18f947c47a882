"""Context variables set for the length of a block: what a plan binds or runs under (its
workers, its workspace and the bound on scratch, its JIT mode)."""
import contextlib


@contextlib.contextmanager
def scoped(var, value):
    """`var` (a contextvars.ContextVar) set to `value` inside the block, as it was after."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)
