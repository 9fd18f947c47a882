"""Fit the rational tanh of edgeflow/interp/kernels/jit.py (`_tanh_gate`): tanh(x) = x P(z) / Q(z),
z = x^2, P of degree 6 and Q of degree 3 with Q(0) = 1, on |x| <= CLAMP, and print its
float32 coefficients and its error evaluated in float32 (Horner's rule, as the loops run it)
against numpy's float64 tanh.

The fit: P - f Q, f = tanh(x) / x, solved by linear least squares in u = z / CLAMP^2 (scaled, so
that the powers stay near 1) with each point's weight 1 / (f Q_previous) (Sanathanan and
Koerner's iteration: it converges to the relative error's least squares), then Lawson's
reweighting (a point's weight times its error) towards the minimax fit; the best iterate is kept.

    python tools/fit_tanh.py [--clamp 9.0]
"""
import argparse

import numpy as np

NP, NQ = 7, 4  # coefficients of P and Q (in z)


def fit(clamp, points=40000, iterations=300):
    """(P's float32 coefficients, Q's, the float64 fit's largest relative error) on (0, clamp]."""
    x = np.linspace(0, clamp, points + 1)[1:]
    u = (x / clamp) ** 2
    f = np.tanh(x) / x
    weight = np.full_like(u, 1 / len(u))
    q = np.zeros(NQ)
    q[0] = 1
    best, coefficients = np.inf, None
    for it in range(iterations):
        scale = np.sqrt(weight) / (f * np.polyval(q[::-1], u))
        a = np.hstack([u[:, None] ** np.arange(NP), -f[:, None] * u[:, None] ** np.arange(1, NQ)])
        solution = np.linalg.lstsq(a * scale[:, None], f * scale, rcond=None)[0]
        p, q = solution[:NP], np.concatenate([[1.0], solution[NP:]])
        error = np.abs(np.polyval(p[::-1], u) / np.polyval(q[::-1], u) / f - 1)
        if error.max() < best:
            best, coefficients = error.max(), (p, q)
        if it > 20:
            weight = weight * (error + 1e-3 * error.max())
            weight /= weight.sum()
    p, q = coefficients
    powers = clamp ** (2.0 * np.arange(max(NP, NQ)))
    return (p / powers[:NP]).astype(np.float32), (q / powers[:NQ]).astype(np.float32), best


def tanh32(x, p, q, clamp):
    """The float32 evaluation in jit._tanh_gate's steps (each rounded: the loops contract the
    multiply-adds, a rounding fewer each)."""
    x = np.asarray(x, np.float32)
    c = np.clip(x, np.float32(-clamp), np.float32(clamp))
    z = c * c
    num = np.full_like(z, p[-1])
    for k in p[-2::-1]:
        num = num * z + k
    den = np.full_like(z, q[-1])
    for k in q[-2::-1]:
        den = den * z + k
    return np.clip(c * num / den, np.float32(-1), np.float32(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clamp", type=float, default=9.0, help="|x| beyond which tanh is +-1 (default 9)")
    args = parser.parse_args()
    p, q, relative = fit(args.clamp)
    x = np.concatenate([np.linspace(-12, 12, 2_000_001), np.geomspace(1e-30, 12, 100_001)]).astype(np.float32)
    exact = np.tanh(x.astype(np.float64))
    error = np.abs(tanh32(x, p, q, args.clamp) - exact)
    print(f"float64 fit: {relative:.2e} relative at most")
    print(f"float32: {error.max():.2e} absolute, {(error / np.maximum(np.abs(exact), 1e-38)).max():.2e} relative at most")
    print("P:", ", ".join(repr(float(v)) for v in p))
    print("Q:", ", ".join(repr(float(v)) for v in q))


if __name__ == "__main__":
    main()
