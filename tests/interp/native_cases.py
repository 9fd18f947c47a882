"""What the tests of native_gemm's compiled convs share: the activations' float64
references, an output array guarded by NaN either side, a record of a kernel's binds, a
graph built and run with the JIT on, and the mark that skips them where native_gemm's
module does not run (x86-64 with AVX2 and FMA)."""
import numpy as np
import pytest

from edgeflow.interp.kernels import native_gemm

ACTIVATIONS = {"": lambda y: y, "relu": lambda y: np.maximum(y, 0), "relu6": lambda y: np.clip(y, 0, 6),
               "swish": lambda y: y / (1 + np.exp(-y)), "hard_swish": lambda y: y * np.clip(y + 3, 0, 6) / 6}
needs_native = pytest.mark.skipif(not native_gemm.available(), reason="native_gemm runs on x86-64 with AVX2 and FMA")


def guarded(shape, guard=64):
    """A float32 array of `shape`, NaN, inside a buffer whose `guard` floats either side are
    NaN too: (the array, the buffer)."""
    size = int(np.prod(shape))
    buffer = np.full(size + 2 * guard, np.nan, np.float32)
    return buffer[guard:guard + size].reshape(shape), buffer


def record_binds(monkeypatch, module):
    """A list that gets, for each call of module.bind from now on (the test's), whether it
    bound a step."""
    bound, bind = [], module.bind

    def recording(*args, **kwargs):
        step = bind(*args, **kwargs)
        bound.append(step is not None)
        return step
    monkeypatch.setattr(module, "bind", recording)
    return bound


def run_graph(build, x, profile=False, num_threads=1):
    """The signature of build(x's float32 placeholder)'s outputs, run on x with the JIT on;
    and, with `profile`, the sorted opcodes of the steps that ran (else None)."""
    import edgeflow as ef
    from edgeflow.format import writer
    g = ef.Graph()
    with g.as_default():
        t = ef.placeholder(ef.float32, x.shape, name="x")
        outputs = build(t)
    it = ef.Interpreter(writer.to_bytes(ef.to_model(g, {"infer": ({"x": t}, outputs)})), num_threads=num_threads,
                        jit=True)
    prof = it.enable_profiling() if profile else None
    got = it.get_signature_runner("infer")(x=x)
    return got, (sorted(r.opcode for r in prof.records.values()) if profile else None)
