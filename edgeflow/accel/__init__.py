"""Accelerator delegates. pyopencl is imported only when a delegate is created."""
from .opencl import OpenCLDelegate, available

__all__ = ["OpenCLDelegate", "available", "delegates_for", "ACCELS"]

ACCELS = ("none", "opencl", "auto")


def delegates_for(accel="none", device=None, precision="fp32"):
    """The delegates `--accel` names: [] for "none"; an OpenCLDelegate for "opencl"
    (EdgeflowError saying how to install a runtime when there is none); for "auto" the
    OpenCL delegate where a device exists, else [] (numpy kernels). `device` and
    `precision` ("fp32", or "fp16": half storage) go to OpenCLDelegate."""
    if accel not in ACCELS:
        raise ValueError(f"accel must be one of {ACCELS}, got {accel!r}")
    if accel == "none" or (accel == "auto" and not available()):
        return []
    return [OpenCLDelegate(device=device, precision=precision)]


def transfers(delegates):
    """(uploads, downloads) host<->device copies so far, summed over `delegates`."""
    rts = [d.rt for d in delegates if hasattr(d, "rt")]
    return sum(r.uploads for r in rts), sum(r.downloads for r in rts)
