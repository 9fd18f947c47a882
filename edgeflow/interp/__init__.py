"""The device runtime: Interpreter, arena planner, numpy kernels, profiler.

Importing this package pulls in numpy and flatbuffers only.
"""
from .interpreter import Interpreter, SignatureRunner

__all__ = ["Interpreter", "SignatureRunner"]
