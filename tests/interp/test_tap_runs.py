"""conv.py's tap runs: after each load, the buffers (workspace scratch, which other steps
overwrite between runs) hold x padded by `fill`, phase-split as the module doc lays it out
(checked against np.pad and strided slices here), run after run."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from edgeflow.interp.kernels.conv import tap_runs


@settings(max_examples=15, deadline=None)
@given(size=st.tuples(st.integers(1, 9), st.integers(1, 9)), kernel=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       strides=st.tuples(st.integers(1, 3), st.integers(1, 3)), dilations=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       begin=st.tuples(st.integers(0, 2), st.integers(0, 2)), fill=st.sampled_from([0.0, -np.inf]))
def test_buffers_hold_x_padded_by_fill(size, kernel, strides, dilations, begin, fill):
    reach = [(k - 1) * dl + 1 for k, dl in zip(kernel, dilations)]
    out_shape = tuple((b + m + b - r) // s + 1 for b, m, r, s in zip(begin, size, reach, strides))
    if min(out_shape) < 1:
        return
    rng = np.random.default_rng(0)
    x = np.empty((2, 3) + size, np.float32)
    runs = tap_runs(x, kernel, strides, dilations, begin, out_shape, fill)
    n, phases, c, length = runs.buffers.shape
    widths = (length // math.prod(runs.wide[1:]),) + runs.wide[1:]
    used = sorted({tuple(t * dl % s for t, dl, s in zip(tap, dilations, strides))
                   for tap in itertools.product(*map(range, kernel))})
    for _ in range(2):  # each load rewrites the whole buffers, whatever another step left there
        x[...] = rng.standard_normal(x.shape)
        runs.buffers[...] = 7.0
        runs.load()
        # Phase (a0, a1) element (q0, q1) is the padded input at (q0 * s0 + a0, q1 * s1 + a1).
        grid = runs.buffers.reshape(n, phases, c, *widths)
        ends = [w * s + s for w, s in zip(widths, strides)]
        padded = np.pad(x, ((0, 0), (0, 0)) + tuple((b, e - b - m) for b, e, m in zip(begin, ends, size)),
                        constant_values=fill)
        for p, (a0, a1) in enumerate(used):
            want = padded[:, :, a0::strides[0], a1::strides[1]][:, :, :widths[0], :widths[1]]
            np.testing.assert_array_equal(grid[:, p], want)


@pytest.mark.parametrize("fill", [0.0, -np.inf])
def test_runs_read_the_windows(fill):
    """Each tap's run, over the outputs, is that tap's window element (a conv's direct sum)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 7, 8)).astype(np.float32)
    kernel, strides, dilations, begin = (3, 2), (2, 1), (1, 2), (1, 1)
    out_shape = (4, 7)
    runs = tap_runs(x, kernel, strides, dilations, begin, out_shape, fill)
    runs.buffers[...] = 7.0
    runs.load()
    padded = np.pad(x, ((0, 0), (0, 0), (1, 3), (1, 3)), constant_values=fill)
    for (t0, t1), run in zip(itertools.product(range(3), range(2)), runs.runs()):
        got = runs.crop(run.reshape((1, 2) + runs.wide))
        want = padded[:, :, t0:t0 + 2 * 4:2, t1 * 2:t1 * 2 + 7]
        np.testing.assert_array_equal(got, want)
