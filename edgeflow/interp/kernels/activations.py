"""Kernels of edgeflow/ops/activations.py, and erf/erfc in plain numpy."""
from functools import partial

import numpy as np

from .. import threads
from . import jit, kernel

# Chebyshev coefficients, computed offline from mpmath's erf at 40 digits (interpolation
# at 40 Chebyshev nodes, truncated where the terms drop below 1e-17):
# - erf(x) / x as a series in 2x^2 - 1, for |x| < 1;
# - log(erfc(x) * exp(x^2) / t) as a series in 3t - 1, t = 2 / (2 + x), for x >= 1
#   (the variable of Numerical Recipes' erfc, which maps [1, inf) onto (0, 2/3]).
_ERF_NEAR_ZERO = (
    0.9754769393826541, -0.14226120510371365, 0.010035582187599796, -0.0005768764699767485,
    2.741993125219606e-05, -1.1043175507344507e-06, 3.8488755420345036e-08,
    -1.1808582533875466e-09, 3.2334215826050907e-11, -7.991015947004549e-13,
    1.7990725113961456e-14, -3.718635487818693e-16, 7.103599003714253e-18)
_ERFC_TAIL = (
    -0.8715936894945394, 0.4125578578540687, 0.01715948121717183, -0.0018831910158454003,
    -0.0004021475665823962, 1.1040527818911942e-05, 1.03890820849577e-05,
    1.6556332888329293e-07, -3.056195401230843e-07, -1.2560882126825629e-08,
    1.0076908616496913e-08, 4.727947439244141e-10, -3.636939017854876e-10,
    -1.1472552050473852e-11, 1.3832474975312072e-11, -5.947733609366037e-14,
    -5.243997146922256e-13, 3.162076007737252e-14, 1.820809108745058e-14,
    -2.6592086231635925e-15, -4.799610853241498e-16, 1.5647777254053967e-16,
    1.462569026933705e-18)
_HIGH_HALF = np.uint64(0xFFFFFFFF00000000)


def _chebyshev(u, coeffs):
    """sum(c_k T_k(u)) by Clenshaw's recurrence."""
    b1 = b2 = 0.0
    for c in coeffs[:0:-1]:
        b1, b2 = 2 * u * b1 - b2 + c, b1
    return u * b1 - b2 + coeffs[0]


def _erf_near_zero(x):
    return x * _chebyshev(2 * x * x - 1, _ERF_NEAR_ZERO)


def _erfc_tail(a):
    """erfc(a) for float64 a >= 1, with full relative precision (0 past 28, where it underflows)."""
    a = np.minimum(a, 28.0)
    t = 2 / (2 + a)
    # exp(-a^2) with a^2 split exactly as h^2 + (a - h)(a + h), h = a with its low 32 bits
    # cleared: a rounded a^2 would cost up to a^2 ulps (~800 near 28).
    h = (a.view(np.uint64) & _HIGH_HALF).view(np.float64)
    return t * np.exp(-h * h) * np.exp((h - a) * (h + a) + _chebyshev(3 * t - 1, _ERFC_TAIL))


def erf(x):
    """The error function in float64, within 2 ulps (tests/ops/test_activations.py)."""
    x = np.asarray(x, np.float64)
    out, a = x.copy(), np.abs(x)  # NaN stays NaN
    near, far = a < 1, a >= 1
    out[near] = _erf_near_zero(x[near])
    out[far] = np.copysign(1 - _erfc_tail(a[far]), x[far])
    return out


def erfc(x):
    """1 - erf(x) in float64, with full relative precision where it is tiny (large x)."""
    x = np.asarray(x, np.float64)
    out, a = x.copy(), np.abs(x)
    near, far = a < 1, a >= 1
    out[near] = 1 - _erf_near_zero(x[near])
    tail = _erfc_tail(a[far])
    out[far] = np.where(x[far] > 0, tail, 2 - tail)
    return out


_special = []


def special_functions():
    """(erf, erfc): scipy.special's ufuncs where scipy is installed (far faster on small
    arrays, within 3 ulps in float64), else the numpy series above. Imported lazily, once:
    the device path needs numpy only."""
    if not _special:
        try:
            from scipy import special
            _special.append((special.erf, special.erfc))
        except ImportError:
            _special.append((erf, erfc))
    return _special[0]


def _gelu(x, attrs):
    if attrs["approximate"] == "tanh":
        # x / 2 * (1 + tanh(z)) as x * sigmoid(2z): no cancellation for negative x.
        return x / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    # erfc(-x / sqrt 2) rather than 1 + erf(x / sqrt 2): no cancellation for negative x.
    return x / 2 * special_functions()[1](-x / np.sqrt(2).astype(x.dtype))


def _sigmoid(x):
    """1 / (1 + exp(-x)) as tanh(x / 2) / 2 + 1 / 2: nothing overflows."""
    return np.tanh(x / 2) / 2 + 0.5


def _elu(x, alpha):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


# name -> (x, attrs) -> y; x arrives as float32 when the input is float16, so that
# float16 results are rounded once.
FORMULAS = {
    "leaky_relu": lambda x, a: np.where(x >= 0, x, x * a["alpha"]),
    "hard_sigmoid": lambda x, a: np.clip(x * a["alpha"] + a["beta"], 0, 1),
    "hard_swish": lambda x, a: x * np.clip(x / 6 + 0.5, 0, 1),
    "gelu": _gelu,
    "erf": lambda x, a: special_functions()[0](x),
    "softplus": lambda x, a: np.logaddexp(0, x),
    "elu": lambda x, a: _elu(x, a["alpha"]),
    "selu": lambda x, a: a["gamma"] * _elu(x, a["alpha"]),
    "celu": lambda x, a: np.maximum(x, 0) + np.minimum(0, a["alpha"] * np.expm1(x / a["alpha"])),
    "softsign": lambda x, a: x / (1 + np.abs(x)),
    "mish": lambda x, a: x * np.tanh(np.logaddexp(0, x)),
    "thresholded_relu": lambda x, a: np.where(x > a["alpha"], x, 0),
    "swish": lambda x, a: x * _sigmoid(x * a["alpha"]),
    "shrink": lambda x, a: np.where(x > a["lambd"], x - a["bias"], np.where(x < -a["lambd"], x + a["bias"], 0)),
}


def evaluate(formula, x, attrs, out):
    np.copyto(out, formula(x.astype(np.float32) if x.dtype == np.float16 else x, attrs),
              casting="unsafe")


def _make(name, formula):
    """The kernel of activation `name`: a JIT loop where jit has one for its operands (swish,
    hard_sigmoid, hard_swish in float32), else numpy's `formula`."""
    def make(ins, outs, attrs):
        return jit.bind_activation(name, ins[0], outs[0], attrs) or partial(evaluate, formula, ins[0], attrs, outs[0])
    return make


for _name, _formula in FORMULAS.items():
    if _name != "gelu":
        kernel(_name)(_make(_name, _formula))


def _prelu(x, slope, out):
    np.multiply(x, slope, out=out, casting="unsafe")
    np.copyto(out, x, where=x >= 0, casting="unsafe")


@kernel("prelu")
def _prelu_kernel(ins, outs, attrs):
    """numba's one pass where it takes the operands, else slope * x, then x where x >= 0."""
    return jit.bind_prelu(ins[0], ins[1], outs[0]) or partial(_prelu, ins[0], ins[1], outs[0])


@kernel("gelu")
def _gelu_kernel(ins, outs, attrs):
    return jit.bind_gelu(ins[0], outs[0], attrs["approximate"]) or partial(evaluate, _gelu, ins[0], attrs, outs[0])


def _swiglu(a, b, alpha, out):
    wide = np.float32 if a.dtype == np.float16 else a.dtype
    a, b = a.astype(wide, copy=False), b.astype(wide, copy=False)
    np.copyto(out, a * _sigmoid(a * alpha) * b, casting="unsafe")


@kernel("swiglu")
def _swiglu_kernel(ins, outs, attrs):
    return partial(_swiglu, ins[0], ins[1], attrs["alpha"], outs[0])


def _bound(value, dtype):
    """A clip bound as a scalar of `dtype`: rounded for floats, saturated for integers."""
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            return dtype.type(value)
    info = np.iinfo(dtype)
    return dtype.type(min(max(value, info.min), info.max))


@kernel("clip")
def _clip(ins, outs, attrs):
    x = ins[0]
    low, high = _bound(attrs["min"], x.dtype), _bound(attrs["max"], x.dtype)
    return threads.elementwise(np.clip, [x, low, high], outs[0]) or partial(np.clip, x, low, high, out=outs[0])


def _clip_grad_numpy(dy, x, low, high, out):
    np.copyto(out, dy)
    np.copyto(out, 0, where=x < low)
    np.copyto(out, 0, where=x > high)


@kernel("clip_grad")
def _clip_grad(ins, outs, attrs):
    """numba's one pass where it takes the operands, else dy then zeros where x is out of bounds."""
    dy, x = ins
    low, high = _bound(attrs["min"], x.dtype), _bound(attrs["max"], x.dtype)
    return jit.bind_clip_grad(dy, x, low, high, outs[0]) or partial(_clip_grad_numpy, dy, x, low, high, outs[0])
