"""Kernels of edgeflow/ops/rnn.py: LSTM and GRU, one direction after the other.

The input projection X @ W^T + bias of every time step is one matrix product, made
before the time loop; each step then multiplies only the hidden state by R^T and works
on buffers allocated once, at prepare time. float16 models compute in float32.
"""
import numpy as np

from ...ops.rnn import GRU_OPTIONAL, LSTM_OPTIONAL, named_inputs
from . import kernel


def _sigmoid(a):
    """sigmoid(a) in place, as 0.5 * tanh(a / 2) + 0.5: nothing overflows."""
    a *= 0.5
    np.tanh(a, out=a)
    a *= 0.5
    a += 0.5


class _Recurrence:
    """What LSTM and GRU share: the input projection, the states, the time loop.

    A subclass names its gate count and `optional` inputs, and defines
    `bias(b)`, the part of direction d's bias B[d] that joins the input projection;
    `recurrent(r, b)`, what its step needs of R[d] and B[d] (b None when absent); and
    `step(xw_t, *recurrent)`, which advances the states by one time step, `xw_t` being
    that step's input projection. Weights are read when the kernel runs, not when it is
    made: they may be inputs fed anew on each invoke.
    """

    gates = optional = None
    states = ("initial_h",)

    def __init__(self, op, ins, outs, attrs):
        x = named_inputs(op, ins, attrs, self.optional)
        self.X, self.W, self.R, self.B = x["X"], x["W"], x["R"], x.get("B")
        self.outs, self.clip = outs, attrs["clip"]
        seq, batch, _ = self.X.shape
        self.hidden = self.W.shape[1] // self.gates
        self.dtype = np.result_type(self.X.dtype, np.float32)
        self.initial = [x.get(name) for name in self.states]
        self.state = [np.empty((batch, self.hidden), self.dtype) for _ in self.states]
        self.xw = np.empty((seq * batch, self.W.shape[1]), self.dtype)
        reverse = attrs["direction"] == "reverse"
        self.directions = [(d, reverse or d == 1) for d in range(self.W.shape[0])]

    def clipped(self, a):
        if self.clip:
            np.clip(a, -self.clip, self.clip, out=a)
        return a

    def __call__(self):
        seq, batch, size = self.X.shape
        dt = self.dtype
        x = self.X.reshape(seq * batch, size).astype(dt, copy=False)
        xw = self.xw.reshape(seq, batch, -1)
        y = self.outs[0]
        for d, backward in self.directions:
            b = None if self.B is None else self.B[d].astype(dt, copy=False)
            np.matmul(x, self.W[d].astype(dt, copy=False).T, out=self.xw)
            if b is not None:
                self.xw += self.bias(b)
            recurrent = self.recurrent(self.R[d].astype(dt, copy=False), b)
            for state, initial in zip(self.state, self.initial):
                state[...] = 0 if initial is None else initial[d]
            for t in (reversed(range(seq)) if backward else range(seq)):
                self.step(xw[t], *recurrent)
                y[t, d] = self.state[0]
            for out, state in zip(self.outs[1:], self.state):
                out[d] = state


class _LSTM(_Recurrence):
    gates, optional = 4, LSTM_OPTIONAL
    states = ("initial_h", "initial_c")

    def __init__(self, ins, outs, attrs):
        super().__init__("lstm", ins, outs, attrs)
        self.input_forget = attrs["input_forget"]
        self.g = np.empty((self.state[0].shape[0], 4 * self.hidden), self.dtype)

    def bias(self, b):
        return b[:4 * self.hidden] + b[4 * self.hidden:]

    def recurrent(self, r, b):
        return (r.T,)

    def step(self, xw_t, r):
        (h, c), g, n = self.state, self.g, self.hidden
        np.matmul(h, r, out=g)
        g += xw_t
        self.clipped(g)
        _sigmoid(g[:, :3 * n])
        i, o, f, cell = g[:, :n], g[:, n:2 * n], g[:, 2 * n:3 * n], g[:, 3 * n:]
        np.tanh(cell, out=cell)
        if self.input_forget:
            np.subtract(1, i, out=f)
        c *= f
        i *= cell
        c += i
        np.tanh(c, out=cell)
        np.multiply(o, cell, out=h)


class _GRU(_Recurrence):
    gates, optional = 3, GRU_OPTIONAL

    def __init__(self, ins, outs, attrs):
        super().__init__("gru", ins, outs, attrs)
        self.linear_before_reset = attrs["linear_before_reset"]
        n, batch = self.hidden, self.state[0].shape[0]
        self.zr = np.empty((batch, 2 * n), self.dtype)
        self.hh, self.rh = np.empty((batch, n), self.dtype), np.empty((batch, n), self.dtype)

    def bias(self, b):
        # Rbh joins the input projection only where the reset gate comes before R.
        n = self.hidden
        out = b[:3 * n] + b[3 * n:]
        if self.linear_before_reset:
            out[2 * n:] = b[2 * n:3 * n]
        return out

    def recurrent(self, r, b):
        """R of the update and reset gates, R of the candidate, and Rbh where it is separate."""
        n = self.hidden
        rbh = b[5 * n:] if b is not None and self.linear_before_reset else None
        return r[:2 * n].T, r[2 * n:].T, rbh

    def step(self, xw_t, r_zr, r_h, rbh):
        (h,), zr, hh, n = self.state, self.zr, self.hh, self.hidden
        np.matmul(h, r_zr, out=zr)
        zr += xw_t[:, :2 * n]
        _sigmoid(self.clipped(zr))
        z, r = zr[:, :n], zr[:, n:]
        if self.linear_before_reset:
            np.matmul(h, r_h, out=hh)
            if rbh is not None:
                hh += rbh
            hh *= r
        else:
            np.multiply(r, h, out=self.rh)
            np.matmul(self.rh, r_h, out=hh)
        hh += xw_t[:, 2 * n:]
        np.tanh(self.clipped(hh), out=hh)
        # h = (1 - z) * hh + z * h, in place
        h -= hh
        h *= z
        h += hh


kernel("lstm")(_LSTM)
kernel("gru")(_GRU)
