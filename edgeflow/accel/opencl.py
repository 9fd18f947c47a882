"""The OpenCL delegate: partitions of the graph run on an OpenCL device (a GPU, or a CPU
through PoCL), their intermediates kept in device buffers.

Kernels are `.cl` sources in edgeflow/accel/kernels/, each launched by a small Python
`make(rt, ins, outs, attrs) -> step` registered by op name (edgeflow.accel.kernels), the
same shape as the numpy kernels. Programs are built once per process and cached on disk
across processes by pyopencl.
"""
import os

import numpy as np

from ..errors import EdgeflowError
from ..interp.delegate import Delegate

INSTALL_HINT = ("install an OpenCL runtime: pip install 'edgeflow[opencl]' brings pyopencl and PoCL "
                "(a CPU OpenCL runtime); GPUs need their vendor's OpenCL driver")


def _pyopencl():
    try:
        import pyopencl
    except ImportError:
        raise EdgeflowError(f"the OpenCL delegate needs pyopencl; {INSTALL_HINT}") from None
    return pyopencl


def devices():
    """Every OpenCL device, as (platform name, device)."""
    cl = _pyopencl()
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        return []
    return [(p.name, d) for p in platforms for d in p.get_devices()]


def available():
    """Whether an OpenCL device can be used here."""
    try:
        return bool(devices())
    except EdgeflowError:
        return False


def _pyopencl_ctx():
    """The device PYOPENCL_CTX selects ("platform[:device]" indices), as pyopencl reads it."""
    spec = os.environ.get("PYOPENCL_CTX")
    if not spec:
        return None
    cl = _pyopencl()
    try:
        platform, _, device = spec.partition(":")
        return cl.get_platforms()[int(platform or 0)].get_devices()[int(device or 0)]
    except (ValueError, IndexError, cl.Error):
        raise EdgeflowError(f"PYOPENCL_CTX={spec!r} names no OpenCL device (expected "
                            "'platform:device' indices)") from None


def pick_device(name=None):
    """The device named (a substring of its or its platform's name, or an index), else
    EDGEFLOW_OPENCL_DEVICE, else pyopencl's PYOPENCL_CTX, else the first GPU, else the
    first device."""
    found = devices()
    if not found:
        raise EdgeflowError(f"no OpenCL platform found; {INSTALL_HINT}")
    name = name if name is not None else os.environ.get("EDGEFLOW_OPENCL_DEVICE")
    cl = _pyopencl()
    if name is None and _pyopencl_ctx() is not None:
        return _pyopencl_ctx()
    if name is not None:
        if str(name).isdigit() and int(name) < len(found):
            return found[int(name)][1]
        for platform, d in found:
            if str(name).lower() in (d.name + " " + platform).lower():
                return d
        raise EdgeflowError(f"no OpenCL device matches {name!r}; devices: "
                            + ", ".join(f"{k}: {d.name} ({p})" for k, (p, d) in enumerate(found)))
    gpus = [d for _, d in found if d.type & cl.device_type.GPU]
    return (gpus or [d for _, d in found])[0]


def _read(path):
    with open(path) as f:
        return f.read() + "\n"


class Runtime:
    """The context, queue and built programs of one device."""

    def __init__(self, device, precision):
        cl = _pyopencl()
        self.cl, self.device, self.precision = cl, device, precision
        self.ctx = cl.Context([device])
        self.queue = cl.CommandQueue(self.ctx)
        self._programs = {}
        self.uploads = self.downloads = 0

    def program(self, name, **defines):
        """The program built from kernels/common.cl + kernels/NAME.cl with -D defines (cached)."""
        key = (name, tuple(sorted(defines.items())))
        if key not in self._programs:
            folder = os.path.join(os.path.dirname(__file__), "kernels")
            source = "".join(_read(os.path.join(folder, f)) for f in ("common.cl", f"{name}.cl"))
            options = [f"-D{k}={v}" for k, v in sorted(defines.items())]
            self._programs[key] = self.cl.Program(self.ctx, source).build(options=options)
        return self._programs[key]

    def kernel(self, program, name):
        return self.cl.Kernel(program, name)

    def max_group(self, kernel):
        """The largest work-group size this device allows for `kernel`."""
        return kernel.get_work_group_info(self.cl.kernel_work_group_info.WORK_GROUP_SIZE, self.device)

    def empty(self, shape, dtype):
        import pyopencl.array as cla
        return cla.empty(self.queue, tuple(shape), np.dtype(dtype))


class OpenCLDelegate(Delegate):
    """Runs the ops it has kernels for on an OpenCL device.

    `device`: a name substring or index (default: EDGEFLOW_OPENCL_DEVICE, else the first
    GPU, else the first device). precision "fp16" computes in half precision where the
    device has cl_khr_fp16.
    """

    name = "opencl"

    def __init__(self, device=None, precision="fp32"):
        if precision not in ("fp32", "fp16"):
            raise EdgeflowError(f"precision must be 'fp32' or 'fp16', got {precision!r}")
        dev = pick_device(device)
        if precision == "fp16" and "cl_khr_fp16" not in dev.extensions:
            raise EdgeflowError(f"{dev.name} has no cl_khr_fp16: use precision='fp32'")
        self.rt = Runtime(dev, precision)

    @property
    def device_name(self):
        return self.rt.device.name

    def unsupported(self, op, ins, outs):
        from .kernels import CL_KERNELS
        entry = CL_KERNELS.get(op.opcode)
        if entry is None:
            return "no OpenCL kernel"
        arrays = list(ins) + [o for o in outs if o is not None]
        if any(a.size == 0 for a in arrays):
            return "an empty tensor (nothing to run)"
        for a in arrays:
            if a.dtype != np.float32 and not (a.dtype.kind in "iub" and entry.int_inputs):
                return f"dtype {a.dtype} (OpenCL kernels take float32)"
        return entry.unsupported(op.attrs, ins, outs) if entry.unsupported else None

    def compile(self, partition):
        from .kernels import CL_KERNELS
        from .. import ops as registry
        rt = self.rt
        device = {}
        for t in partition.constants:
            device[t] = self._upload(np.ascontiguousarray(partition.arrays[t]))
        uploads = [(t, partition.arrays[t]) for t in partition.inputs]
        for t, host in uploads:
            device[t] = rt.empty(host.shape, host.dtype)
        launches = []
        for _, op in partition.ops:
            ins = [device[t] for t in op.inputs]
            if registry.get(op.opcode).view:
                device[op.outputs[0]] = ins[0].reshape(partition.arrays[op.outputs[0]].shape)
                continue
            outs = []
            for t in op.outputs:
                host = partition.arrays[t]
                device[t] = rt.empty(host.shape, host.dtype)
                outs.append(device[t])
            launches.append(CL_KERNELS[op.opcode].make(rt, ins, outs, op.attrs))
        downloads = [(partition.arrays[t], device[t]) for t in partition.outputs]
        cl, queue = rt.cl, rt.queue

        def run():
            for t, host in uploads:
                cl.enqueue_copy(queue, device[t].data, np.ascontiguousarray(host))
            rt.uploads += len(uploads)
            for launch in launches:
                launch()
            for host, dev in downloads:
                cl.enqueue_copy(queue, host, dev.data)
            rt.downloads += len(downloads)
            queue.finish()
        return run

    def _upload(self, host):
        import pyopencl.array as cla
        return cla.to_device(self.rt.queue, host)
