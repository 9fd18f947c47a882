"""A progress bar for long verbs: tqdm when installed, else a plain line now and then."""
import os
import sys


class _Bar:
    """A minimal progress line when tqdm is not installed."""

    def __init__(self, total, desc):
        self.total, self.desc, self.n, self.post = total, desc, 0, {}

    def update(self, k):
        self.n += k
        if self.n == self.total or self.n % max(self.total // 20, 1) == 0:
            post = ", ".join(f"{k}={v}" for k, v in self.post.items())
            print(f"{self.desc}: {self.n}/{self.total} {post}", file=sys.stderr)

    def set_postfix(self, **kw):
        self.post = kw

    def close(self):
        """Nothing to release: each update printed its own line."""


def progress(total, desc):
    """A tqdm bar on a terminal (silent otherwise), or a line per 5% without tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _Bar(total, desc)
    tty = sys.stderr.isatty()
    sized = _sized(tty)
    return tqdm(total=total, desc=desc, unit="step", disable=not tty, ncols=None if sized else 80,
                nrows=None if sized else 24)


def _sized(tty):
    """Whether the terminal reports its size. A pty nobody sized (under `script`, in some IDE
    consoles and CI runners) says 0 x 0, and tqdm then draws nothing: give it 80 x 24."""
    try:
        return tty and os.get_terminal_size(sys.stderr.fileno()).columns > 0
    except (OSError, ValueError):
        return False
