"""Recurrent layers: `rnn`, `lstm` and `gru`, with the semantics of ONNX's RNN, LSTM and GRU
(opset 14).

Layout is ONNX's default: X is [seq, batch, input], Y is [seq, directions, batch, hidden],
final states are [directions, batch, hidden] (a converter transposes around `layout` 1).
Weights keep ONNX's gate order (LSTM iofc, GRU zrh) and stack the directions first, so an
ONNX model's initializers load as they are.

ONNX lets optional inputs be absent in the middle of the list; edgeflow ops have
positional inputs only, so X, W, R come first and then those optional inputs whose `has_*`
attribute is set (absent ones are skipped, not left as holes), in the order of *_OPTIONAL:
B, initial_h, initial_c, P (LSTM's peepholes), then sequence_lens (int32). Since optional
inputs are typed first to last, an op with sequence_lens has every float optional input
before it too (a converter gives zeros for the absent ones).

With sequence_lens, entry b's steps from sequence_lens[b] on are padding: Y is zero there,
the final states are those of the last valid step, and the reverse direction starts at
sequence_lens[b] - 1. `activations` names each direction's gate functions (ONNX's names,
comma-separated, all of the first direction's then the second's; "" for the defaults),
`activation_alpha` and `activation_beta` one value per listed function (read only by the
functions that take them).
"""
from .. import dtypes
from ..errors import GraphError
from .registry import Attr, AttrKind, TensorSpec, Types, define, gradient
from .dims import fmt

DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}

# (input name, the attribute saying it is present), in the ops' input order.
_LENS = ("sequence_lens", "has_sequence_lens")
LSTM_OPTIONAL = (("B", "has_bias"), ("initial_h", "has_initial_h"), ("initial_c", "has_initial_c"),
                 ("P", "has_peepholes"), _LENS)
GRU_OPTIONAL = RNN_OPTIONAL = (("B", "has_bias"), ("initial_h", "has_initial_h"), _LENS)

# Gate functions (ONNX's names, lower-case) -> (alpha, beta) defaults; None: not taken.
ACTIVATIONS = {"relu": (None, None), "tanh": (None, None), "sigmoid": (None, None), "affine": (1.0, 0.0),
               "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None), "scaledtanh": (1.0, 1.0),
               "hardsigmoid": (0.2, 0.5), "elu": (1.0, None), "softsign": (None, None),
               "softplus": (None, None)}
DEFAULT_ACTIVATIONS = {"rnn": ("tanh",), "lstm": ("sigmoid", "tanh", "tanh"), "gru": ("sigmoid", "tanh")}


def activations(op, attrs):
    """[(name, alpha, beta)] per gate function per direction, from the op's attrs (checked)."""
    dirs = DIRECTIONS[attrs["direction"]]
    given = attrs["activations"]
    names = [a.strip().lower() for a in given.split(",")] if given else list(DEFAULT_ACTIVATIONS[op] * dirs)
    expected = len(DEFAULT_ACTIVATIONS[op]) * dirs
    if len(names) != expected or any(n not in ACTIVATIONS for n in names):
        raise GraphError(f"{op}: activations must name {expected} functions of {sorted(ACTIVATIONS)}, "
                         f"got {given!r}")
    alphas, betas = attrs["activation_alpha"], attrs["activation_beta"]
    if len(alphas) not in (0, len(names)) or len(betas) not in (0, len(names)):
        raise GraphError(f"{op}: activation_alpha and activation_beta must hold one value per activation "
                         f"({len(names)}) or none, got {len(alphas)} and {len(betas)}")
    return [(n, alphas[k] if alphas else ACTIVATIONS[n][0], betas[k] if betas else ACTIVATIONS[n][1])
            for k, n in enumerate(names)]


def named_inputs(op, inputs, attrs, optional):
    """`inputs` by ONNX name: X, W, R, then the optional ones whose has_* attribute is set."""
    names = ["X", "W", "R"] + [name for name, flag in optional if attrs[flag]]
    if len(inputs) != len(names):
        raise GraphError(f"{op}: with these has_* attributes the inputs are ({', '.join(names)}), "
                         f"got {len(inputs)} inputs")
    return dict(zip(names, inputs))


def _merge(op, what, dims):
    """The one known value among `dims` (None if none is known); GraphError if they disagree."""
    known = {d for d in dims if d is not None}
    if len(known) > 1:
        raise GraphError(f"{op}: {what} disagrees between inputs: {sorted(known)}")
    return known.pop() if known else None


def _check_shape(op, name, spec, expected):
    """GraphError unless `spec` has the rank of `expected` and agrees where both are known."""
    if spec.rank != len(expected) or any(
            e is not None and d is not None and e != d for d, e in zip(spec.shape, expected)):
        raise GraphError(f"{op}: {name} must have shape {fmt(expected)}, got {fmt(spec.shape)}")


def _check_attrs(op, attrs):
    if attrs["hidden_size"] <= 0:
        raise GraphError(f"{op}: hidden_size must be positive, got {attrs['hidden_size']}")
    if attrs["direction"] not in DIRECTIONS:
        raise GraphError(f"{op}: direction must be one of {sorted(DIRECTIONS)}, "
                         f"got {attrs['direction']!r}")
    activations(op, attrs)
    if attrs["clip"] < 0:
        raise GraphError(f"{op}: clip must be >= 0 (0: no clipping), got {attrs['clip']}")


def _infer_recurrent(op, gates, optional, num_outputs):
    """Inference of a recurrent op whose W stacks `gates` gate matrices per direction."""
    def infer(inputs, attrs):
        x = named_inputs(op, inputs, attrs, optional)
        _check_attrs(op, attrs)
        dt = x["X"].dtype
        if x["X"].rank != 3:
            raise GraphError(f"{op}: X must be [seq, batch, input], got {fmt(x['X'].shape)}")
        seq, batch, size = x["X"].shape
        states = [x[k] for k in ("initial_h", "initial_c") if k in x and x[k].rank == 3]
        lens = [x["sequence_lens"].shape[0]] if "sequence_lens" in x and x["sequence_lens"].rank == 1 else []
        batch = _merge(op, "the batch size", [batch] + [s.shape[1] for s in states] + lens)
        dirs, hidden = DIRECTIONS[attrs["direction"]], attrs["hidden_size"]
        expected = {"W": (dirs, gates * hidden, size), "R": (dirs, gates * hidden, hidden),
                    "B": (dirs, 2 * gates * hidden), "initial_h": (dirs, batch, hidden),
                    "initial_c": (dirs, batch, hidden), "P": (dirs, 3 * hidden), "sequence_lens": (batch,)}
        for name, spec in x.items():
            if name != "X":
                _check_shape(op, name, spec, expected[name])
        state = TensorSpec((dirs, batch, hidden), dt)
        return [TensorSpec((seq, dirs, batch, hidden), dt)] + [state] * (num_outputs - 1)
    return infer


def _common_attrs(optional):
    attrs = {"hidden_size": Attr(AttrKind.INT), "direction": Attr(AttrKind.STRING, "forward"),
             "clip": Attr(AttrKind.FLOAT, 0.0), "activations": Attr(AttrKind.STRING, ""),
             "activation_alpha": Attr(AttrKind.FLOATS, ()), "activation_beta": Attr(AttrKind.FLOATS, ())}
    attrs.update((flag, Attr(AttrKind.BOOL, False)) for _, flag in optional)
    return attrs


_infer_lstm = _infer_recurrent("lstm", 4, LSTM_OPTIONAL, 3)


def _types(optional, num_outputs, grad=False):
    """X, W, R, then the optional inputs, of one float dtype; the gradient op takes one dY
    per forward output too, and gives one gradient per input."""
    inputs = ["X: T", "W: T", "R: T"] + ["sequence_lens: int32?" if name == "sequence_lens" else "T?"
                                         for name, _ in optional]
    outputs = ["T"] * num_outputs
    if grad:
        outputs = ["dX: T", "dW: T", "dR: T"] + ["T?"] * (len(optional) - 1)  # no gradient for lengths
        inputs += [f"d{y}: T" for y in ("Y", "Y_h", "Y_c")[:num_outputs]]
    return Types(", ".join(inputs) + " -> " + ", ".join(outputs), T=dtypes.FLOATS)


def _recurrent_flops(gates):
    def flops(inputs, outputs, attrs):
        seq, dirs, batch, hidden = outputs[0].shape
        features = inputs[0].shape[-1]
        return 2 * seq * dirs * batch * gates * hidden * (features + hidden)
    return flops


@define("lstm", types=_types(LSTM_OPTIONAL, 3), flops=_recurrent_flops(4),
        attrs={**_common_attrs(LSTM_OPTIONAL), "input_forget": Attr(AttrKind.BOOL, False)})
def _lstm(inputs, attrs):
    """ONNX LSTM: inputs X, W [dirs, 4H, I], R [dirs, 4H, H], then if present (has_bias,
    has_initial_h, has_initial_c, has_peepholes, has_sequence_lens) B [dirs, 8H] (Wb then
    Rb), initial_h and initial_c [dirs, batch, H], P [dirs, 3H] (peepholes, iof) and
    sequence_lens [batch]; absent states are zeros. Gate order iofc. Outputs Y
    [seq, dirs, batch, H], Y_h and Y_c [dirs, batch, H]. `clip` > 0 bounds the gates'
    pre-activations to [-clip, clip]; `input_forget` couples the forget gate to 1 - input.
    """
    return _infer_lstm(inputs, attrs)


_infer_gru = _infer_recurrent("gru", 3, GRU_OPTIONAL, 2)


@define("gru", types=_types(GRU_OPTIONAL, 2), flops=_recurrent_flops(3),
        attrs={**_common_attrs(GRU_OPTIONAL), "linear_before_reset": Attr(AttrKind.INT, 0)})
def _gru(inputs, attrs):
    """ONNX GRU: inputs X, W [dirs, 3H, I], R [dirs, 3H, H], then if present (has_bias,
    has_initial_h, has_sequence_lens) B [dirs, 6H] (Wb then Rb), initial_h [dirs, batch, H]
    and sequence_lens [batch]. Gate order
    zrh. Outputs Y [seq, dirs, batch, H] and Y_h [dirs, batch, H]. linear_before_reset 1
    (PyTorch's form) applies the reset gate after the recurrent product: r * (h @ Rh^T + Rbh).
    """
    if attrs["linear_before_reset"] not in (0, 1):
        raise GraphError(f"gru: linear_before_reset must be 0 or 1, got {attrs['linear_before_reset']}")
    return _infer_gru(inputs, attrs)


_infer_rnn = _infer_recurrent("rnn", 1, RNN_OPTIONAL, 2)


@define("rnn", types=_types(RNN_OPTIONAL, 2), flops=_recurrent_flops(1), attrs=_common_attrs(RNN_OPTIONAL))
def _rnn(inputs, attrs):
    """ONNX RNN: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb). Inputs X, W [dirs, H, I],
    R [dirs, H, H], then if present (has_bias, has_initial_h, has_sequence_lens) B [dirs, 2H],
    initial_h [dirs, batch, H] and sequence_lens [batch]. Outputs Y [seq, dirs, batch, H]
    and Y_h [dirs, batch, H]."""
    return _infer_rnn(inputs, attrs)


# -- gradients -----------------------------------------------------------------------------
# Backpropagation through time is one op per layer, lstm_grad or gru_grad: its kernel
# runs the forward recurrence again, keeping every step's gates, then walks the steps
# back (about three times the forward's work). Its inputs are the forward op's, then one
# gradient per forward output; its outputs are the gradients of the forward op's inputs,
# in their order.

def _infer_recurrent_grad(op, forward, num_outputs):
    def infer(inputs, attrs):
        plain = {"activations": "", "activation_alpha": (), "activation_beta": (), "has_sequence_lens": False,
                 "has_peepholes": False}
        if any(attrs.get(k, v) != v for k, v in plain.items()):
            raise GraphError(f"{op}: gradients are for the default activations without peepholes or "
                             f"sequence_lens; got {({k: attrs[k] for k in plain if k in attrs})}")
        ins, dys = inputs[:-num_outputs], inputs[-num_outputs:]
        for name, dy, out in zip(("dY", "dY_h", "dY_c"), dys, forward(ins, attrs)):
            _check_shape(op, name, dy, out.shape)
        return [TensorSpec(s.shape, s.dtype) for s in ins]
    return infer


def _grad_outputs(optional):
    return lambda attrs: 3 + sum(attrs[flag] for name, flag in optional if name != "sequence_lens")


def _grad_flops(gates, num_outputs):
    return lambda ins, outs, attrs: 3 * _recurrent_flops(gates)(ins, ins[-num_outputs:], attrs)


_infer_lstm_grad = _infer_recurrent_grad("lstm_grad", _infer_lstm, 3)


@define("lstm_grad", types=_types(LSTM_OPTIONAL, 3, grad=True), outputs=_grad_outputs(LSTM_OPTIONAL),
        flops=_grad_flops(4, 3),
        attrs={**_common_attrs(LSTM_OPTIONAL), "input_forget": Attr(AttrKind.BOOL, False)})
def _lstm_grad(inputs, attrs):
    """Gradients of lstm (same attrs) with respect to its inputs: inputs are lstm's, then
    dY, dY_h, dY_c; outputs dX, dW, dR, then dB, dinitial_h, dinitial_c where present."""
    return _infer_lstm_grad(inputs, attrs)


_infer_gru_grad = _infer_recurrent_grad("gru_grad", _gru, 2)


@define("gru_grad", types=_types(GRU_OPTIONAL, 2, grad=True), outputs=_grad_outputs(GRU_OPTIONAL),
        flops=_grad_flops(3, 2),
        attrs={**_common_attrs(GRU_OPTIONAL), "linear_before_reset": Attr(AttrKind.INT, 0)})
def _gru_grad(inputs, attrs):
    """Gradients of gru (same attrs) with respect to its inputs: inputs are gru's, then
    dY, dY_h; outputs dX, dW, dR, then dB, dinitial_h where present."""
    return _infer_gru_grad(inputs, attrs)


def _through_time(grad_op):
    """The rule of a recurrent op: one `grad_op`, given zeros for outputs that get no gradient."""
    def rule(g, op, grads):
        dys = [dy if dy is not None else g.zeros_like(out) for dy, out in zip(grads, op.outputs)]
        return list(g(grad_op, *op.inputs, *dys, **op.attrs))
    return rule


gradient("lstm")(_through_time("lstm_grad"))
gradient("gru")(_through_time("gru_grad"))
