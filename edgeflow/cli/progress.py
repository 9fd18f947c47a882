"""A progress bar for long verbs: tqdm when installed, else a plain line now and then."""
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
        return tqdm(total=total, desc=desc, unit="step", disable=not sys.stderr.isatty())
    except ImportError:
        return _Bar(total, desc)
