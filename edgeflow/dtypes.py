"""The element types edgeflow knows, and their codes in the `.efl` schema.

Types are plain `numpy.dtype` objects everywhere in Python; the integer code is used
only inside the file (it equals the schema's `DType` enum value).
"""
import numpy as np

from .errors import GraphError

float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
float64 = np.dtype(np.float64)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
bool_ = np.dtype(np.bool_)

# Order is the schema's DType enum order; append only.
ALL = (float32, float16, float64, int8, int16, int32, int64, uint8, bool_)
_CODE = {dt: code for code, dt in enumerate(ALL)}

# Named dtype sets: the ops' type constraints (edgeflow.ops.registry.Types) are written with them.
FLOATS = frozenset((float16, float32, float64))
INTEGERS = frozenset((int8, int16, int32, int64, uint8))
NUMERIC = FLOATS | INTEGERS
INDEX = frozenset((int32, int64))  # indices, and operands that hold shapes or positions
ANY = frozenset(ALL)


def as_dtype(value):
    """A numpy dtype from a dtype, numpy type, or name; GraphError if edgeflow lacks it."""
    try:
        dt = np.dtype(value)
    except TypeError as e:
        raise GraphError(f"not a dtype: {value!r}") from e
    if dt not in _CODE:
        raise GraphError(f"dtype {dt} is not supported; expected one of {', '.join(d.name for d in ALL)}")
    return dt


def to_code(dtype):
    return _CODE[np.dtype(dtype)]


def from_code(code):
    """The dtype for a schema code, or None if the code is unknown."""
    return ALL[code] if 0 <= code < len(ALL) else None
