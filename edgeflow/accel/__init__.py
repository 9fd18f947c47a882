"""Accelerator delegates. pyopencl is imported only when a delegate is created."""
from .opencl import OpenCLDelegate, available

__all__ = ["OpenCLDelegate", "available"]
