"""Context variables set for the length of a block: what a plan binds or runs under (its
workers, its workspace and the bound on scratch, its JIT mode)."""


class scoped:
    """`var` (a contextvars.ContextVar) set to `value` inside the block, as it was after.

    A class rather than a contextlib generator: each run of a plan enters two (its workers,
    its JIT mode), and a generator's context manager cost some 3 us an entry and exit where
    this costs under 1 (a tiny model's whole run takes 100-200)."""

    __slots__ = ("var", "value", "token")

    def __init__(self, var, value):
        self.var, self.value = var, value

    def __enter__(self):
        self.token = self.var.set(self.value)
        return self.value

    def __exit__(self, *exc):
        self.var.reset(self.token)
