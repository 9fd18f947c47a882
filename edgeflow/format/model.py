"""The in-memory form of a `.efl` model: what the writer takes and the reader gives.

Everything refers to tensors by integer index into its subgraph's `tensors`, as the
file does. Constant data are numpy arrays; after reading they are read-only views
into the mapped file.
"""
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

FORMAT_VERSION = 1
FILE_IDENTIFIER = b"EFL1"
ALIGNMENT = 64
# Signatures a trainable package carries besides `infer` and `train`: variables out, and in.
SAVE, RESTORE = "save", "restore"


@dataclass
class QuantizationDef:
    """Affine quantization: real = scale * (q - zero_point), per tensor or along `axis`.

    `zero_point` has one entry per scale, or none when all are zero (symmetric).
    """

    scale: tuple
    zero_point: tuple
    axis: int = -1  # -1: per tensor (one scale and zero point)


@dataclass
class TensorDef:
    name: str
    dtype: np.dtype
    shape: tuple  # -1 marks a dynamic dimension
    data: Optional[np.ndarray] = None  # constant value, or a variable's initial value
    quantization: Optional[QuantizationDef] = None
    is_variable: bool = False


@dataclass
class OperatorDef:
    opcode: str  # an op name from edgeflow.ops
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)  # canonical values, as OpDef.check_attrs gives
    placement: str = ""  # "", "device" or "cloud"


@dataclass
class SubGraphDef:
    name: str
    tensors: list
    operators: list
    inputs: list
    outputs: list


@dataclass
class SignatureDef:
    key: str
    inputs: dict  # signature name -> tensor index
    outputs: dict
    subgraph: int = 0
    targets: list = field(default_factory=list)  # operator indices run for their effect


@dataclass
class ModelDef:
    subgraphs: list
    signatures: list = field(default_factory=list)
    metadata: dict = field(default_factory=dict)  # str -> bytes
    description: str = ""
    producer: str = "edgeflow"
    version: int = FORMAT_VERSION
