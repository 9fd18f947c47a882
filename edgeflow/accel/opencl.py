"""The OpenCL delegate: partitions of the graph run on an OpenCL device (a GPU, or a CPU
through PoCL), their intermediates kept in device buffers.

Kernels are `.cl` sources in edgeflow/accel/kernels/, each launched by a small Python
`make(rt, ins, outs, attrs) -> step` registered by op name (edgeflow.accel.kernels), the
same shape as the numpy kernels. Programs are built once per process and cached on disk
across processes by pyopencl.
"""
import logging
import os
import threading
import warnings

import numpy as np

from .. import dtypes, ops
from ..errors import EdgeflowError
from ..interp.delegate import Delegate
from ..ops.registry import dtype_names

_log = logging.getLogger(__name__)

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
    """The context, queue and built programs of one device, and how it stores tensors:
    with precision "fp16" float32 tensors live in half (float16) buffers (`half`).

    Interpreters on several threads may share one Runtime (a server's requests): each
    partition has its own buffers and kernel objects, whose arguments are set once when it
    is compiled; OpenCL's enqueues are thread-safe, and the program cache is locked."""

    def __init__(self, device, precision):
        cl = _pyopencl()
        self.cl, self.device, self.precision = cl, device, precision
        self.half = precision == "fp16"
        self.ctx = cl.Context([device])
        self.queue = cl.CommandQueue(self.ctx)
        self._programs = {}
        self._building = threading.Lock()
        self.uploads = self.downloads = 0
        self.allocated = 0  # bytes of tensor buffers made by empty() and to_device()

    def program(self, name, **defines):
        """The program built from kernels/common.cl + kernels/NAME.cl with -D defines, and
        -DEF_HALF=1 in fp16 mode (cached)."""
        if self.half:
            defines = dict(defines, EF_HALF=1)
        key = (name, tuple(sorted(defines.items())))
        with self._building:
            if key not in self._programs:
                folder = os.path.join(os.path.dirname(__file__), "kernels")
                source = "".join(_read(os.path.join(folder, f)) for f in ("common.cl", f"{name}.cl"))
                options = [f"-D{k}={v}" for k, v in sorted(defines.items())]
                self._programs[key] = self._build(name, source, options)
            return self._programs[key]

    def _build(self, name, source, options):
        """Build a program; the compiler's remarks (pyopencl's CompilerWarning, which PoCL
        and some drivers raise on every build) go to the debug log, not to stderr."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", self.cl.CompilerWarning)
            program = self.cl.Program(self.ctx, source).build(options=options)
        for w in caught:
            if issubclass(w.category, self.cl.CompilerWarning):
                _log.debug("OpenCL build of %s.cl %s: %s", name, " ".join(options), w.message)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return program

    def kernel(self, program, name):
        return self.cl.Kernel(program, name)

    def max_group(self, kernel):
        """The largest work-group size this device allows for `kernel`."""
        return kernel.get_work_group_info(self.cl.kernel_work_group_info.WORK_GROUP_SIZE, self.device)

    def storage(self, dtype):
        """The dtype a tensor of `dtype` has in device memory: float16 for float32 in fp16
        mode, else `dtype` itself."""
        dtype = np.dtype(dtype)
        return np.dtype(np.float16) if self.half and dtype == np.float32 else dtype

    def empty(self, shape, dtype):
        """A device buffer for a tensor of `shape` and (host) `dtype`, in its storage dtype."""
        import pyopencl.array as cla
        array = cla.empty(self.queue, tuple(shape), self.storage(dtype))
        self.allocated += array.nbytes
        return array

    def to_device(self, host):
        """A device copy of host array `host`, converted to its storage dtype once, here."""
        import pyopencl.array as cla
        array = cla.to_device(self.queue, np.ascontiguousarray(host, self.storage(host.dtype)))
        self.allocated += array.nbytes
        return array


# What the kernels' buffers hold: float32 tensors (as half in fp16 mode) and, in kernels
# that move or select elements (`int_inputs`), integer and bool tensors as they are;
# uint16, uint32, uint64 and bfloat16 stay with numpy.
STORED = frozenset((dtypes.float32,))
STORED_INTS = frozenset((dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.bool_))
_UNDECLARED = ops.Types("any* -> any*")  # ops that declare no dtypes (gradient ops) take any


def _dtype_unsupported(op, entry, ins, outs):
    """Why an input or output of `op` has a dtype its OpenCL kernel does not take (those the
    op's declaration admits and the buffers hold), or None."""
    types = ops.get(op.opcode).types or _UNDECLARED
    stored = STORED | (STORED_INTS if entry.int_inputs else frozenset())
    for side, arrays, declared in (("input", ins, types.input_dtypes(len(ins), op.attrs)),
                                   ("output", outs, types.output_dtypes(len(outs), op.attrs))):
        for i, (a, allowed) in enumerate(zip(arrays, declared)):
            if a is not None and a.dtype not in allowed & stored:
                return (f"{side} {i} has dtype {dtypes.name(a.dtype)} (OpenCL's {op.opcode} takes "
                        f"{dtype_names(allowed & stored)})")
    return None


class OpenCLDelegate(Delegate):
    """Runs the ops it has kernels for on an OpenCL device.

    `device`: a name substring or index (default: EDGEFLOW_OPENCL_DEVICE, else the first
    GPU, else the first device).

    `precision`: "fp32" (default), or "fp16": half storage, on any device (no cl_khr_fp16
    needed). Every float32 tensor of a partition (inputs, weights, intermediates,
    gradients, outputs) is held on the device as float16, halving its memory and memory
    traffic; kernels load halves into float, compute and accumulate in float32, and round
    each stored value to the nearest half. Inputs are converted on upload and outputs back
    to float32 on download, weights once at compile; integer and bool tensors are
    unchanged. Tolerance: a kernel's result is within one rounding of the float32 result
    on the same (half) inputs, 2**-11 ~ 4.9e-4 of the magnitudes involved; fp16's range
    holds |x| <= 65504, loses precision below 6.1e-5 and flushes below 3e-8 to 0. The
    converted test models (MobileNetV2, ResNet, transformer) stay within 1e-3 of the
    float32 result relative to the output's largest magnitude (tested at 5e-3; README,
    "OpenCL"). For training, the optimizer's updates (the ops the graph marks as updating
    a variable) stay on the CPU in float32, as mixed-precision training keeps them: Adam's
    squared gradients and epsilon (1e-8) would underflow in half. Devices with cl_khr_fp16
    could also compute in half; this delegate does not.
    """

    name = "opencl"

    def __init__(self, device=None, precision="fp32"):
        if precision not in ("fp32", "fp16"):
            raise EdgeflowError(f"precision must be 'fp32' or 'fp16', got {precision!r}")
        self.rt = Runtime(pick_device(device), precision)
        self.float32_updates = precision == "fp16"

    @property
    def device_name(self):
        return self.rt.device.name

    @property
    def precision(self):
        return self.rt.precision

    def unsupported(self, op, ins, outs):
        from .kernels import CL_KERNELS
        entry = CL_KERNELS.get(op.opcode)
        if entry is None:
            return "no OpenCL kernel"
        if any(a.size == 0 for a in list(ins) + [o for o in outs if o is not None]):
            return "an empty tensor (nothing to run)"
        return _dtype_unsupported(op, entry, ins, outs) or (
            entry.unsupported(op.attrs, ins, outs) if entry.unsupported else None)

    def compile(self, partition):
        from .kernels import CL_KERNELS
        rt = self.rt
        device = {}
        for t in partition.constants:
            device[t] = rt.to_device(partition.arrays[t])
        uploads = [(t, partition.arrays[t]) for t in partition.inputs]
        for t, host in uploads:
            device[t] = rt.empty(host.shape, host.dtype)
        launches = []
        for _, op in partition.ops:
            ins = [device[t] for t in op.inputs]
            if ops.get(op.opcode).view:
                device[op.outputs[0]] = ins[0].reshape(partition.arrays[op.outputs[0]].shape)
                continue
            outs = []
            for t in op.outputs:
                host = partition.arrays[t]
                device[t] = rt.empty(host.shape, host.dtype)
                outs.append(device[t])
            launches.append(CL_KERNELS[op.opcode].make(rt, ins, outs, op.attrs))
        # (host array, device array, staging): outputs stored in another dtype (half) are
        # read into a staging array, then converted into the host array
        downloads = []
        for t in partition.outputs:
            host, dev = partition.arrays[t], device[t]
            downloads.append((host, dev, None if dev.dtype == host.dtype else np.empty(host.shape, dev.dtype)))
        cl, queue = rt.cl, rt.queue

        uploads = [(device[t].data, host, device[t].dtype) for t, host in uploads]
        downloads = [(host if staging is None else staging, dev.data, host, staging)
                     for host, dev, staging in downloads]
        enqueue_copy = cl.enqueue_copy

        def run(keep=device):  # the partition's device arrays live as long as its step
            # Every copy is enqueued without blocking and the one finish() waits for all:
            # a blocking copy waits for the device on its own (on PoCL, a wake-up of its
            # threads per copy), and the sources (`staged`: converted where the storage
            # differs, float32 -> half in fp16 mode) stay alive until then.
            staged = [np.ascontiguousarray(host, dtype) for _, host, dtype in uploads]
            for (buffer, _, _), source in zip(uploads, staged):
                enqueue_copy(queue, buffer, source, is_blocking=False)
            rt.uploads += len(uploads)
            for launch in launches:
                launch()
            for target, buffer, _, _ in downloads:
                enqueue_copy(queue, target, buffer, is_blocking=False)
            rt.downloads += len(downloads)
            queue.finish()
            for _, _, host, staging in downloads:
                if staging is not None:
                    host[...] = staging
        return run
