"""Kernels of edgeflow/ops/rnn.py: RNN, LSTM and GRU, one direction after the other.

The input projection X @ W^T + bias of every time step is one matrix product, made
before the time loop; each step then multiplies only the hidden state by R^T and works
on buffers allocated once, at prepare time. float16 models compute in float32.
"""
from functools import partial

import numpy as np

from ...ops.rnn import DEFAULT_ACTIVATIONS, GRU_OPTIONAL, LSTM_OPTIONAL, RNN_OPTIONAL, activations, named_inputs
from .. import threads
from . import jit, kernel
from .math import split_matmul


def _sigmoid(a):
    """sigmoid(a) in place, as 0.5 * tanh(a / 2) + 0.5: nothing overflows."""
    a *= 0.5
    np.tanh(a, out=a)
    a *= 0.5
    a += 0.5


def _scaled_tanh(a, alpha, beta):
    a *= beta
    np.tanh(a, out=a)
    a *= alpha


def _hard_sigmoid(a, alpha, beta):
    a *= alpha
    a += beta
    np.clip(a, 0, 1, out=a)


# Batch rows from which a compiled loop's products run on native_gemm's tile (jit._product),
# R packed once: lstm2 at batch 8, alternating processes, 19.7 -> 18.6 ms at 1 thread, 13.0
# -> 12.3 at 2; the BiGRU 13.3 -> 12.0 and 8.3 -> 7.2. At 1 row _matmul_nt's dot products
# were faster (28.5 against 32.2 us for lstm2's 1 x 256 by 256 x 1024), at 2 the same.
NATIVE_ROWS = 3

# ONNX's gate functions, each f(a, alpha, beta) in place (a may be a view).
_FUNCTIONS = {
    "sigmoid": lambda a, al, be: _sigmoid(a),
    "tanh": lambda a, al, be: np.tanh(a, out=a),
    "relu": lambda a, al, be: np.maximum(a, 0, out=a),
    "affine": lambda a, al, be: np.add(a * al, be, out=a),
    "leakyrelu": lambda a, al, be: np.copyto(a, a * al, where=a < 0),
    "thresholdedrelu": lambda a, al, be: np.copyto(a, 0, where=a <= al),
    "scaledtanh": _scaled_tanh,
    "hardsigmoid": _hard_sigmoid,
    "elu": lambda a, al, be: np.copyto(a, al * np.expm1(np.minimum(a, 0)), where=a < 0),
    "softsign": lambda a, al, be: np.divide(a, 1 + np.abs(a), out=a),
    "softplus": lambda a, al, be: np.logaddexp(0, a, out=a),
}


def _gate_functions(op, attrs, per_direction):
    """Per direction, its gate functions as in-place callables of one array."""
    fns = [lambda a, f=_FUNCTIONS[name], al=alpha, be=beta: f(a, al, be)
           for name, alpha, beta in activations(op, attrs)]
    return [fns[k:k + per_direction] for k in range(0, len(fns), per_direction)]


class _Recurrence:
    """What LSTM and GRU share: the input projection, the states, the time loop.

    A subclass names its gate count, gate `functions` and `optional` inputs, and defines
    `bias(b)`, the part of direction d's bias B[d] that joins the input projection;
    `recurrent(r, b)`, what its step needs of R[d] and B[d] (b None when absent); and
    `step(xw_t, *recurrent)`, which advances the states by one time step, `xw_t` being
    that step's input projection, with the direction's gate functions `self.fns` (and
    LSTM's peepholes `self.peepholes`). Weights are read when the kernel runs, not when it
    is made: they may be inputs fed anew on each invoke.

    With sequence_lens, a step leaves the states of the entries it is past the end of as
    they were and writes zeros to their Y.
    """

    gates = optional = None
    functions = 0
    states = ("initial_h",)

    def __init__(self, op, ins, outs, attrs):
        x = named_inputs(op, ins, attrs, self.optional)
        self.X, self.W, self.R, self.B = x["X"], x["W"], x["R"], x.get("B")
        self.P, self.lens = x.get("P"), x.get("sequence_lens")
        self.fn_sets = _gate_functions(op, attrs, self.functions)
        self.op, self.outs, self.clip = op, outs, attrs["clip"]
        seq, batch, _ = self.X.shape
        self.hidden = self.W.shape[1] // self.gates
        self.dtype = np.result_type(self.X.dtype, np.float32)
        self.initial = [x.get(name) for name in self.states]
        self.state = [np.empty((batch, self.hidden), self.dtype) for _ in self.states]
        self.xw = np.empty((seq * batch, self.W.shape[1]), self.dtype)
        reverse = attrs["direction"] == "reverse"
        self.directions = [(d, reverse or d == 1) for d in range(self.W.shape[0])]
        # The whole time loop compiled (jit.py, float32), where the gate functions are the
        # defaults and nothing per step (clip, sequence_lens) or per cell (peepholes) is
        # asked for. A subclass binds it (`bind_sequence`) once its buffers are made. Its
        # gates' sigmoid and tanh vectorize, so it beats numpy's steps at every batch (lstm2
        # at batch 1, 2, 4, 8: 5.8, 18.9, 31.7, 48.7 ms against 5.8, 31.6, 47.7, 57.1; bigru
        # 3.3, 5.7, 12.1, 23.8 against 5.3, 8.5, 18.5, 38.8).
        names = [name for name, _, _ in activations(op, attrs)]
        self.plain = (names == list(DEFAULT_ACTIVATIONS[op]) * len(self.directions) and not self.clip
                      and self.lens is None and self.P is None and not attrs.get("input_forget"))
        self.sequence = self.shared = None
        self._natives, self._keep = {}, []  # native_products' tables, and the steps their entries call
        self.workers = threads.current()
        self.flops = flops = 2 * seq * batch * self.hidden * self.gates * self.hidden  # a direction's steps
        threaded = self.workers is not None and flops >= threads.MIN_FLOPS
        # A one-way recurrence's compiled loop runs on all the plan's workers at once, each
        # step's hidden units in blocks they share (jit.lstm_shared, gru_shared; `shared`,
        # bound by the subclass), where a worker's share of the batch would be fewer than
        # NATIVE_ROWS rows (lstm2 on 2 threads, alternating processes: batch 1 5.0-5.5 ->
        # 3.0-4.2 ms, onnxruntime 2.1-2.8); from there the batch splits, each worker's rows
        # an independent recurrence whose products run on native_gemm, with no meeting a
        # step (lstm2 at batch 8: 13.4, 13.8, 11.5-11.9 ms shared, 11.7, 10.9, 10.7 split; at
        # batch 6 12.2 and 9.9); a bidirectional one's runs its two directions at once
        # (_directions_apart), or, on more workers, splits the batch.
        self.shares = threaded and self.plain and len(self.directions) == 1 and self.dtype == np.float32 \
            and batch < NATIVE_ROWS * self.workers.n \
            and (op == "lstm" or (op == "gru" and attrs["linear_before_reset"]))
        # Two workers run a bidirectional recurrence's two directions at once at every batch
        # (_directions_apart): the BiGRU at batch 8, alternating processes, 10.0-10.7 ms with
        # the batch split, 8.0-8.3 (one 10.6) apart (onnxruntime 9.5).
        apart = len(self.directions) == 2 and threaded and self.workers.n == 2
        self.rows = threads.pieces(batch, self.workers.n) if threaded and not (self.shares or apart) \
            else [(0, batch)]
        # Each direction's input projection, one product of the whole sequence: with W (and
        # B) a model's float32 constants, native_gemm's, the bias added in its pass
        # (fused_projection); else numpy's, split over the workers with the batch or the
        # shared steps (on one thread it kept lstm2 at batch 8 and 2 threads at 14.95 ms,
        # 12.34 split; the BiGRU 12.96 and 10.77), or None: the operands need a cast first, or
        # the loop runs on one thread (at batch 1 a split product was 4-10% slower).
        x = self.X.reshape(seq * batch, -1)
        split = len(self.rows) > 1 or self.shares
        self.projections, self.fused_bias = [], []
        for d, _ in self.directions:
            step = self.fused_projection(x, d, split)
            self.fused_bias.append(step is not None and self.B is not None)
            if step is None and split and x.dtype == self.W.dtype == self.dtype:
                step = split_matmul(x, self.W[d].T, self.xw)
            self.projections.append(step)

    def fused_projection(self, x, d, split):
        """xw = x @ W[d]^T + the bias's part that joins it, one step of native_gemm's
        (math.matmul_epilogue: W packed once; its columns split over the workers where
        `split`), or None: W or B not a model's float32 constant, numba not loaded, shapes
        it leaves to BLAS. Interleaved against numpy's product and bias pass, one thread:
        lstm2's 512 x 128 @ 128 x 1024 0.65x of their time, 512 x 256 @ 256 x 1024 0.99x,
        batch 1's 64 x 256 @ 256 x 1024 0.89x."""
        from .math import matmul_epilogue
        constant = [self.W] + ([] if self.B is None else [self.B])
        if any(a.flags.writeable or a.dtype != np.float32 for a in constant) or x.dtype != np.float32:
            return None
        bias = None
        if self.B is not None:
            bias = self.bias(self.B[d])
            bias.flags.writeable = False  # made once, here: a constant to matmul_epilogue
        with threads.using(self.workers if split else None):
            return matmul_epilogue([x, self.W[d]], self.xw, {"transpose_a": False, "transpose_b": True}, bias=bias)

    def native_products(self, key, d, shape, products):
        """The int64 table (`shape`, 2) of native_gemm products the compiled loop runs
        (jit._product): at each index of products()' (index, first, last, a, out), the
        product a @ R[d][first:last]^T into out (its address, then its fields'), R's rows
        packed once; made on the first run and kept under (key, d) with the steps it calls
        (the buffers it names live as long as the kernel). Zeros where the loop runs its own
        _matmul_nt: R not a model's float32 constant (fed, or trained: the packing would be
        stale), d None (typing the loop), fewer than NATIVE_ROWS rows of a, or no native_gemm."""
        from . import native_gemm
        found = self._natives.get((key, d))
        if found is not None:
            return found
        table = np.zeros((*shape, 2), np.int64)
        if d is None or self.R.flags.writeable or self.R.dtype != np.float32 or self.dtype != np.float32 \
                or self.X.shape[1] < NATIVE_ROWS or not native_gemm.available():
            return table
        keep = []
        for index, first, last, a, out in products():
            if a.shape[0] < NATIVE_ROWS:
                return np.zeros_like(table)
            step = native_gemm.bind_rows(native_gemm.pack_columns(self.R[d, first:last].T), a[None], out[None])
            if step is None:
                return np.zeros_like(table)
            table[index] = step.native_call
            keep.append(step)
        self._natives[key, d] = table
        self._keep.append(keep)
        return table

    def bind_sequence(self):
        """The compiled loop (jit.bind_recurrence), or None. Every piece of the batch passes
        the same arrays and its own row range, so one compilation serves them all."""
        xw = self.xw.reshape(self.X.shape[0], self.X.shape[1], -1)
        recurrent = self.recurrent(np.empty(self.R.shape[1:], self.dtype), None)
        return jit.bind_recurrence(self.op, *self.sequence_args(xw, recurrent, self.outs[0][:, 0], True, self.rows[0]))

    def bind_shared(self):
        """The compiled loop that the workers run at once (jit.lstm_shared, gru_shared), or
        None where numba does not bind it; `units`, the hidden units of a block (a block a
        worker's share), and the loop's buffers are set here."""
        seq, batch, _ = self.X.shape
        n, parts = self.hidden, self.workers.n
        units = self.units = max(4, -(-n // (4 * parts)) * 4)  # a multiple of 4: _matmul_nt's tile
        self.hbuf = np.empty((2, batch, n), self.dtype)  # h read, h written: alternating by step
        self.scratch = np.empty((parts, self.gates * batch * units), self.dtype)
        self.sync = np.zeros(seq * (parts + 1) * 8 + 1, np.int64)  # jit._claim_units' counters, sched_yield
        self.sync[-1] = jit.yield_address()
        xw = self.xw.reshape(seq, batch, -1)
        recurrent = self.recurrent(np.empty(self.R.shape[1:], self.dtype), np.empty(self.B.shape[1:], self.dtype)
                                   if self.B is not None else None)
        return jit.bind_recurrence(self.op + "_shared", *self.shared_args(xw, recurrent, self.outs[0][:, 0], True),
                                   0, parts, units)

    def run_shared(self, xw, recurrent, y, backward, d):
        """The sequence of one direction on all the workers at once (`shared`)."""
        self.hbuf[0] = self.state[0]
        self.sync[:-1] = 0
        args, parts = self.shared_args(xw, recurrent, y, backward, d), self.workers.n
        self.workers.run([partial(self.shared, *args, me, parts, self.units) for me in range(parts)])
        self.state[0][...] = self.hbuf[xw.shape[0] % 2]

    def shared_products(self, d):
        """native_products' table for the shared loop: per worker, per step's parity (the h
        it reads: hbuf[s % 2]), per block of units and per gate, the block's gate rows of R
        into the worker's scratch."""
        parts, batch, n, units = self.workers.n, self.X.shape[1], self.hidden, self.units
        blocks = -(-n // units)

        def products():
            for me in range(parts):
                for parity in range(2):
                    for block in range(blocks):
                        u0 = block * units
                        w = min(units, n - u0)
                        g = self.scratch[me, :self.gates * batch * w].reshape(self.gates, batch, w)
                        for q in range(self.gates):
                            yield (me, parity, block, q), q * n + u0, q * n + u0 + w, self.hbuf[parity], g[q]
        return self.native_products("shared", d, (parts, 2, blocks, self.gates), products)

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
            if self.projections[d] is not None:
                self.projections[d]()
            else:
                np.matmul(x, self.W[d].astype(dt, copy=False).T, out=self.xw)
            if b is not None and not self.fused_bias[d]:
                self.xw += self.bias(b)
            recurrent = self.recurrent(self.R[d].astype(dt, copy=False), b)
            self.fns = self.fn_sets[d]
            self.peepholes = None if self.P is None else self.P[d].astype(dt, copy=False)
            for state, initial in zip(self.state, self.initial):
                state[...] = 0 if initial is None else initial[d]
            if self.shared is not None:
                self.run_shared(xw, recurrent, y[:, d], backward, d)
            elif self.sequence is not None:
                steps = [partial(self.sequence, *self.sequence_args(xw, recurrent, y[:, d], backward, rows, d))
                         for rows in self.rows]
                if len(steps) > 1:
                    self.workers.run(steps)
                else:
                    steps[0]()
            else:
                for t in (reversed(range(seq)) if backward else range(seq)):
                    if self.lens is None:
                        self.step(xw[t], *recurrent)
                        y[t, d] = self.state[0]
                    else:
                        self.masked_step(t, xw[t], recurrent, y[t, d])
            for out, state in zip(self.outs[1:], self.state):
                out[d] = state

    def masked_step(self, t, xw_t, recurrent, y_t):
        """One step for the entries whose sequences reach step t; the others keep their states."""
        live = (t < self.lens)[:, None]
        if not live.any():
            y_t[...] = 0
            return
        kept = None if live.all() else [state.copy() for state in self.state]
        self.step(xw_t, *recurrent)
        if kept is not None:
            for state, old in zip(self.state, kept):
                np.copyto(state, old, where=~live)
        np.multiply(self.state[0], live, out=y_t)


class _LSTM(_Recurrence):
    gates, functions, optional = 4, 3, LSTM_OPTIONAL
    states = ("initial_h", "initial_c")

    def __init__(self, ins, outs, attrs):
        super().__init__("lstm", ins, outs, attrs)
        self.input_forget = attrs["input_forget"]
        self.g = np.empty((self.state[0].shape[0], 4 * self.hidden), self.dtype)
        self.sequence = self.bind_sequence() if self.plain else None
        self.shared = self.bind_shared() if self.shares and self.sequence is not None else None

    def bias(self, b):
        return b[:4 * self.hidden] + b[4 * self.hidden:]

    def recurrent(self, r, b):
        return (r.T,)

    def sequence_args(self, xw, recurrent, y, backward, rows, d=None):
        """lstm_loop's arguments for the batch rows `rows` (R as ONNX lays it out) of
        direction d."""
        b0, b1 = rows
        native = self.native_products(rows, d, (1,), lambda: [((0,), 0, 4 * self.hidden, self.state[0][b0:b1],
                                                                self.g[b0:b1])])
        return (xw, np.ascontiguousarray(recurrent[0].T), *self.state, self.g, y, backward) + rows + (native,)

    def shared_args(self, xw, recurrent, y, backward, d=None):
        """lstm_shared's arguments but the thread's own."""
        return xw, np.ascontiguousarray(recurrent[0].T), self.hbuf, self.state[1], self.scratch, y, self.sync, \
            backward, self.shared_products(d)

    def step(self, xw_t, r):
        (h, c), g, n, p = self.state, self.g, self.hidden, self.peepholes
        gate, cell_fn, out_fn = self.fns
        np.matmul(h, r, out=g)
        g += xw_t
        i, o, f, cell = g[:, :n], g[:, n:2 * n], g[:, 2 * n:3 * n], g[:, 3 * n:]
        if p is None:
            gate(self.clipped(g)[:, :3 * n])
        else:  # i and f look at the previous cell, o at the new one
            i += p[:n] * c
            f += p[2 * n:] * c
            gate(self.clipped(i))
            gate(self.clipped(g[:, 2 * n:3 * n]))
            self.clipped(cell)
        cell_fn(cell)
        if self.input_forget:
            np.subtract(1, i, out=f)
        c *= f
        i *= cell
        c += i
        if p is not None:
            o += p[n:2 * n] * c
            gate(self.clipped(o))
        np.copyto(cell, c)
        out_fn(cell)
        np.multiply(o, cell, out=h)


class _GRU(_Recurrence):
    gates, functions, optional = 3, 2, GRU_OPTIONAL

    def __init__(self, ins, outs, attrs):
        self.linear_before_reset = attrs["linear_before_reset"]  # before the projections bind: bias() reads it
        super().__init__("gru", ins, outs, attrs)
        n, batch = self.hidden, self.state[0].shape[0]
        self.zr = np.empty((batch, 2 * n), self.dtype)
        self.hh, self.rh = np.empty((batch, n), self.dtype), np.empty((batch, n), self.dtype)
        self.zero_rbh = np.zeros(n, self.dtype)
        self.sequence = self.bind_sequence() if self.plain else None
        self.shared = self.bind_shared() if self.shares and self.sequence is not None else None

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

    def sequence_args(self, xw, recurrent, y, backward, rows, d=None):
        """gru_loop's arguments for the batch rows `rows` (R's rows, views) of direction d."""
        (r_zr, r_h), rbh = (np.ascontiguousarray(a.T) for a in recurrent[:2]), recurrent[2]
        (b0, b1), n = rows, self.hidden
        h = self.state[0][b0:b1]
        native = self.native_products(rows, d, (2,), lambda: [
            ((0,), 0, 2 * n, h, self.zr[b0:b1]),
            ((1,), 2 * n, 3 * n, h if self.linear_before_reset else self.rh[b0:b1], self.hh[b0:b1])])
        return (xw, r_zr, r_h, self.zero_rbh if rbh is None else rbh, self.state[0], self.zr, self.hh, self.rh, y,
                backward, bool(self.linear_before_reset)) + rows + (native,)

    def shared_args(self, xw, recurrent, y, backward, d=None):
        """gru_shared's arguments but the thread's own."""
        (r_zr, r_h), rbh = (np.ascontiguousarray(a.T) for a in recurrent[:2]), recurrent[2]
        return xw, r_zr, r_h, self.zero_rbh if rbh is None else rbh, self.hbuf, self.scratch, y, self.sync, \
            backward, self.shared_products(d)

    def step(self, xw_t, r_zr, r_h, rbh):
        (h,), zr, hh, n = self.state, self.zr, self.hh, self.hidden
        np.matmul(h, r_zr, out=zr)
        zr += xw_t[:, :2 * n]
        gate, candidate = self.fns
        gate(self.clipped(zr))
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
        candidate(self.clipped(hh))
        # h = (1 - z) * hh + z * h, in place
        h -= hh
        h *= z
        h += hh


class _RNN(_Recurrence):
    gates, functions, optional = 1, 1, RNN_OPTIONAL

    def __init__(self, ins, outs, attrs):
        super().__init__("rnn", ins, outs, attrs)
        self.a = np.empty_like(self.state[0])

    def bias(self, b):
        return b[:self.hidden] + b[self.hidden:]

    def recurrent(self, r, b):
        return (r.T,)

    def step(self, xw_t, r):
        (h,), a = self.state, self.a
        np.matmul(h, r, out=a)
        a += xw_t
        self.fns[0](self.clipped(a))
        np.copyto(h, a)


def _directions_apart(cls):
    """The kernel of `cls`: its directions one after the other, but for a bidirectional
    recurrence whose compiled loop does not split the batch (two workers; one row, or too few
    for more), which runs its two directions at once on the workers, each an instance of its
    own buffers computing one (its half of Y and of the final states): the same steps in the
    same order as on one thread, so the same bits. The BiGRU at batch 1 on 2 threads: 4.66
    -> 2.57 ms (alternating processes; its 1-thread runs 4.35-4.44, onnxruntime's 2 threads
    2.46-2.73)."""
    def factory(ins, outs, attrs):
        first = cls(ins, outs, attrs)
        workers = first.workers
        if workers is None or len(first.directions) != 2 or len(first.rows) > 1 or first.sequence is None \
                or first.flops < threads.MIN_FLOPS:
            return first
        second = cls(ins, outs, attrs)
        first.directions, second.directions = first.directions[:1], first.directions[1:]
        return partial(workers.run, [first, second])
    return factory


kernel("lstm")(_directions_apart(_LSTM))
kernel("gru")(_directions_apart(_GRU))
kernel("rnn")(_RNN)


# -- gradients: backpropagation through time ----------------------------------------------

class _Backward:
    """What lstm_grad and gru_grad share: per direction, the forward recurrence again
    (keeping each step's states and gates), then the steps walked back.

    A subclass defines `bias(b)` as the forward does; `forward(xw, r, b, initial)`,
    which runs the steps (in processing order) into its buffers; and `backward(r, b, dy,
    dfinal)`, which returns the gradients of each step's input projection (`da`, [seq,
    batch, gates * H]), of R[d], of R's half of B[d], and of the initial states. What
    the input projection X @ W^T + bias passes on (to X, W and W's half of B) is common.
    Step buffers are allocated once, when the kernel is made.
    """

    gates = optional = None
    states = ("initial_h",)

    def __init__(self, op, ins, outs, attrs):
        count = len(self.states) + 1
        x = named_inputs(op, ins[:-count], attrs, self.optional)
        self.dy, self.dfinal = ins[-count], ins[-count + 1:]
        self.X, self.W, self.R, self.B = x["X"], x["W"], x["R"], x.get("B")
        self.initial = [x.get(name) for name in self.states]
        self.outs = dict(zip(x, outs))
        self.clip, self.dtype = attrs["clip"], np.result_type(self.X.dtype, np.float32)
        seq, batch, _ = self.X.shape
        self.hidden = n = self.W.shape[1] // self.gates
        reverse = attrs["direction"] == "reverse"
        self.directions = [(d, reverse or d == 1) for d in range(self.W.shape[0])]
        self.h = np.empty((seq + 1, batch, n), self.dtype)  # h[k]: the state before step k
        self.act = np.empty((seq, batch, self.gates * n), self.dtype)  # gates after activation
        self.live = np.empty(self.act.shape, bool) if self.clip else None  # not clipped
        self.da = np.empty(self.act.shape, self.dtype)

    def clipped(self, a, live):
        if self.clip:
            np.less_equal(np.abs(a), self.clip, out=live)
            np.clip(a, -self.clip, self.clip, out=a)
        return a

    def unclipped(self, da, live):
        if self.clip:
            da *= live
        return da

    def __call__(self):
        seq, batch, size = self.X.shape
        dt, n = self.dtype, self.hidden
        grads = {name: np.zeros(out.shape, dt) for name, out in self.outs.items()}
        for d, backward in self.directions:
            order = np.arange(seq)[::-1] if backward else np.arange(seq)
            x = self.X[order].astype(dt, copy=False).reshape(seq * batch, size)
            w, r = self.W[d].astype(dt, copy=False), self.R[d].astype(dt, copy=False)
            b = None if self.B is None else self.B[d].astype(dt, copy=False)
            xw = (x @ w.T).reshape(seq, batch, -1)
            if b is not None:
                xw += self.bias(b)
            initial = [np.zeros((batch, n), dt) if s is None else s[d].astype(dt) for s in self.initial]
            self.forward(xw, r, b, initial)
            dfinal = [s[d].astype(dt) for s in self.dfinal]
            da, dr, drb, dinitial = self.backward(r, b, self.dy[order, d].astype(dt, copy=False), dfinal)
            da = da.reshape(seq * batch, -1)
            grads["X"][order] += (da @ w).reshape(seq, batch, size)
            grads["W"][d] = da.T @ x
            grads["R"][d] = dr
            if "B" in grads:
                grads["B"][d] = np.concatenate([da.sum(0), drb])
            for name, value in zip(self.states, dinitial):
                if name in grads:
                    grads[name][d] = value
        for name, out in self.outs.items():
            np.copyto(out, grads[name], casting="unsafe")


class _LSTMBackward(_Backward):
    gates, optional = 4, LSTM_OPTIONAL
    states = ("initial_h", "initial_c")

    def __init__(self, ins, outs, attrs):
        super().__init__("lstm", ins, outs, attrs)
        self.input_forget = attrs["input_forget"]
        self.c = np.empty_like(self.h)

    def bias(self, b):
        return b[:4 * self.hidden] + b[4 * self.hidden:]

    def forward(self, xw, r, b, initial):
        h, c, n = self.h, self.c, self.hidden
        h[0], c[0] = initial
        for k in range(len(xw)):
            a = self.act[k]
            np.matmul(h[k], r.T, out=a)
            a += xw[k]
            self.clipped(a, None if self.live is None else self.live[k])
            _sigmoid(a[:, :3 * n])
            np.tanh(a[:, 3 * n:], out=a[:, 3 * n:])
            i, o, f, cell = a[:, :n], a[:, n:2 * n], a[:, 2 * n:3 * n], a[:, 3 * n:]
            if self.input_forget:
                np.subtract(1, i, out=f)
            np.multiply(f, c[k], out=c[k + 1])
            c[k + 1] += i * cell
            np.multiply(o, np.tanh(c[k + 1]), out=h[k + 1])

    def backward(self, r, b, dy, dfinal):
        n = self.hidden
        dh, dc = dfinal
        for k in reversed(range(len(dy))):
            dh = dh + dy[k]
            i, o, f, cell = (self.act[k, :, j * n:(j + 1) * n] for j in range(4))
            tanh_c = np.tanh(self.c[k + 1])
            dc = dc + dh * o * (1 - tanh_c * tanh_c)
            da = self.da[k]
            di, df = dc * cell, dc * self.c[k]
            if self.input_forget:  # f = 1 - i
                di -= df
                df[...] = 0
            da[:, :n] = di * i * (1 - i)
            da[:, n:2 * n] = dh * tanh_c * o * (1 - o)
            da[:, 2 * n:3 * n] = df * f * (1 - f)
            da[:, 3 * n:] = dc * i * (1 - cell * cell)
            self.unclipped(da, None if self.live is None else self.live[k])
            dh, dc = da @ r, dc * f
        da = self.da.reshape(-1, 4 * n)
        return self.da, da.T @ self.h[:-1].reshape(-1, n), da.sum(0), (dh, dc)


class _GRUBackward(_Backward):
    gates, optional = 3, GRU_OPTIONAL

    def __init__(self, ins, outs, attrs):
        self.linear_before_reset = attrs["linear_before_reset"]  # before the projections bind: bias() reads it
        super().__init__("gru", ins, outs, attrs)
        self.q = np.empty_like(self.h[1:])  # h @ Rh^T + Rbh, where the reset gate comes after it

    bias = _GRU.bias

    def rbh(self, b):
        return b[5 * self.hidden:] if b is not None and self.linear_before_reset else 0

    def forward(self, xw, r, b, initial):
        h, n = self.h, self.hidden
        h[0] = initial[0]
        for k in range(len(xw)):
            a, live = self.act[k], None if self.live is None else self.live[k]
            np.matmul(h[k], r[:2 * n].T, out=a[:, :2 * n])
            a[:, :2 * n] += xw[k, :, :2 * n]
            _sigmoid(self.clipped(a[:, :2 * n], None if live is None else live[:, :2 * n]))
            z, reset, cand = a[:, :n], a[:, n:2 * n], a[:, 2 * n:]
            if self.linear_before_reset:
                np.matmul(h[k], r[2 * n:].T, out=self.q[k])
                self.q[k] += self.rbh(b)
                np.multiply(reset, self.q[k], out=cand)
            else:
                np.matmul(reset * h[k], r[2 * n:].T, out=cand)
            cand += xw[k, :, 2 * n:]
            np.tanh(self.clipped(cand, None if live is None else live[:, 2 * n:]), out=cand)
            h[k + 1] = cand + z * (h[k] - cand)

    def backward(self, r, b, dy, dfinal):
        n, (dh,) = self.hidden, dfinal
        r_h = r[2 * n:]
        dr_h, drbh = np.zeros_like(r_h), np.zeros(n, self.dtype)
        for k in reversed(range(len(dy))):
            dh = dh + dy[k]
            z, reset, cand = (self.act[k, :, j * n:(j + 1) * n] for j in range(3))
            h, da = self.h[k], self.da[k]
            da[:, 2 * n:] = dh * (1 - z) * (1 - cand * cand)
            if self.live is not None:
                da[:, 2 * n:] *= self.live[k, :, 2 * n:]
            dcand = da[:, 2 * n:]
            if self.linear_before_reset:
                dreset, dq = dcand * self.q[k], dcand * reset
                dh_prev = dh * z + dq @ r_h
                dr_h += dq.T @ h
                drbh += dq.sum(0)
            else:
                dgated = dcand @ r_h  # of reset * h
                dreset = dgated * h
                dh_prev = dh * z + dgated * reset
                dr_h += dcand.T @ (reset * h)
            da[:, :n] = dh * (h - cand) * z * (1 - z)
            da[:, n:2 * n] = dreset * reset * (1 - reset)
            if self.live is not None:
                da[:, :2 * n] *= self.live[k, :, :2 * n]
            dh = dh_prev + da[:, :2 * n] @ r[:2 * n]
        da = self.da.reshape(-1, 3 * n)
        dr = np.concatenate([da[:, :2 * n].T @ self.h[:-1].reshape(-1, n), dr_h])
        drb = da.sum(0)
        if self.linear_before_reset:
            drb[2 * n:] = drbh
        return self.da, dr, drb, (dh,)


kernel("lstm_grad")(_LSTMBackward)
kernel("gru_grad")(_GRUBackward)
