"""edgeflow: package, run and train neural networks on the device, split with the cloud.

`import edgeflow as ef` gives the TensorFlow-style builder (`ef.placeholder`,
`ef.matmul`, `ef.nn.relu`, ...), `ef.save` to package a graph, and `ef.Interpreter`
to run a package.
"""
from . import errors
from .dtypes import bool_, float16, float32, float64, int8, int16, int32, int64, uint8
from .graph import *  # noqa: F401,F403
from .graph import nn, save, to_model  # noqa: F401
from .graph import slice, strided_slice  # noqa: F401,A004
from .interp import Interpreter, SignatureRunner  # noqa: F401

__version__ = "0.1.0"
