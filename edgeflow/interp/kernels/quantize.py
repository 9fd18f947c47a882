"""numpy kernels of the affine quantization ops (edgeflow/ops/quantize.py)."""
import numpy as np

from . import jit, kernel


def _along(a, axis, rank):
    """A scale or zero point shaped to broadcast against the tensor: as is per tensor,
    along `axis` per axis."""
    if a.ndim == 0 or a.size == 1:
        return a.reshape(())
    shape = [1] * rank
    shape[axis % rank] = -1
    return a.reshape(shape)


@kernel("quantize_linear")
def _quantize_linear(ins, outs, attrs):
    x, scale, zero_point = (ins + [None])[:3]
    y, axis = outs[0], attrs["axis"]
    info = np.iinfo(y.dtype)
    s = _along(scale, axis, x.ndim)
    z = None if zero_point is None else _along(zero_point, axis, x.ndim)  # a view: read each run
    step = jit.bind_quantize(x, s, z, y)  # one pass where numba is
    if step is not None:
        return step
    work = np.empty(x.shape, np.result_type(x.dtype, np.float32))  # float64 stays float64

    def run():
        np.divide(x, s, out=work, casting="unsafe")
        np.rint(work, out=work)  # half to even, as ONNX rounds
        if z is not None:
            np.add(work, z, out=work, casting="unsafe")
        np.clip(work, info.min, info.max, out=work)
        np.copyto(y, work, casting="unsafe")
    return run


@kernel("dequantize_linear")
def _dequantize_linear(ins, outs, attrs):
    x, scale, zero_point = (ins + [None])[:3]
    y, axis = outs[0], attrs["axis"]
    s = _along(scale, axis, x.ndim)
    z = None if zero_point is None else _along(zero_point, axis, x.ndim)
    step = jit.bind_quantize(x, s, z, y)  # one pass where numba is
    if step is not None:
        return step

    if y.dtype == np.float32 and x.dtype.itemsize <= 2:  # q - z exact in float32; its product rounds once
        def run():
            if z is None:
                np.multiply(x, s, out=y, dtype=np.float32)
            else:
                np.subtract(x, z, out=y, dtype=np.float32)
                np.multiply(y, s, out=y)
        return run

    def run():
        q = x.astype(np.int64) if z is None else x.astype(np.int64) - z
        np.multiply(q, s, out=y, casting="unsafe")
    return run
