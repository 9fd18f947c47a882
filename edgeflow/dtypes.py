"""The element types edgeflow knows, and their codes in the `.efl` schema.

Types are plain `numpy.dtype` objects everywhere in Python; the integer code is used
only inside the file (it equals the schema's `DType` enum value).

bfloat16: numpy has none (ml_dtypes has one, but the device path loads only numpy), so
edgeflow's is a structured dtype of one little-endian uint16 field named "bfloat16",
holding the bits (the top half of a float32's). It is 2 bytes like uint16 yet a distinct
dtype (== and as a dict key), numpy refuses arithmetic on it, and arrays view to and from
`ml_dtypes.bfloat16` bit for bit (`a.view(dtypes.bfloat16)`). Kernels compute on it in
float32 (`widen`, `narrow`); its name in messages, on the wire and in dtype names is
"bfloat16" (`name`; numpy's own name for it is "void16").
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
uint16 = np.dtype(np.uint16)
uint32 = np.dtype(np.uint32)
uint64 = np.dtype(np.uint64)
bfloat16 = np.dtype([("bfloat16", "<u2")])

# Order is the schema's DType enum order; append only.
ALL = (float32, float16, float64, int8, int16, int32, int64, uint8, bool_, uint16, uint32, uint64, bfloat16)
_CODE = {dt: code for code, dt in enumerate(ALL)}
_BY_NAME = {"bfloat16": bfloat16}

# Named dtype sets: the ops' type constraints (edgeflow.ops.registry.Types) are written with
# them. bfloat16 is in ANY only: an op that computes on it says so (its kernel widens it).
FLOATS = frozenset((float16, float32, float64))
UNSIGNED = frozenset((uint8, uint16, uint32, uint64))
INTEGERS = frozenset((int8, int16, int32, int64)) | UNSIGNED
NUMERIC = FLOATS | INTEGERS
INDEX = frozenset((int32, int64))  # indices, and operands that hold shapes or positions
ANY = frozenset(ALL)


def name(dtype):
    """The dtype's name: numpy's ("float32", "bool"), and "bfloat16" for bfloat16."""
    return "bfloat16" if dtype == bfloat16 else np.dtype(dtype).name


def as_dtype(value):
    """A numpy dtype from a dtype, numpy type, or name; GraphError if edgeflow lacks it."""
    if isinstance(value, str) and value in _BY_NAME:
        return _BY_NAME[value]
    try:
        dt = np.dtype(value)
    except TypeError as e:
        raise GraphError(f"not a dtype: {value!r}") from e
    if dt not in _CODE:
        raise GraphError(f"dtype {dt.name} is not supported; expected one of {', '.join(map(name, ALL))}")
    return dt


def asarray(value):
    """np.asarray(value), with an array of ml_dtypes' bfloat16 (a 2-byte dtype named
    "bfloat16") viewed as edgeflow's bfloat16, bit for bit."""
    a = np.asarray(value)
    if a.dtype != bfloat16 and a.dtype.name == "bfloat16" and a.dtype.itemsize == 2:
        return a.view(bfloat16)
    return a


def to_code(dtype):
    return _CODE[np.dtype(dtype)]


def from_code(code):
    """The dtype for a schema code, or None if the code is unknown."""
    return ALL[code] if 0 <= code < len(ALL) else None


def array(value, dtype):
    """np.array(value, dtype), except that values become bfloat16 by rounding (numpy would
    take them as the bits)."""
    dtype = as_dtype(dtype)
    if dtype != bfloat16:
        return np.array(value, dtype)
    value = np.asarray(value)
    return value.copy() if value.dtype == bfloat16 else narrow(value)


def widen(bits, out=None):
    """bfloat16 array `bits` as float32 (exact): its 16 bits are a float32's top half."""
    out = np.empty(bits.shape, float32) if out is None else out
    np.left_shift(bits["bfloat16"], 16, out=out.view(np.uint32), dtype=np.uint32)
    return out


def narrow(x, out=None):
    """Array `x` rounded to bfloat16, to nearest with ties to even; NaN stays NaN (quiet),
    infinities and signed zeros stay. float64 (and integers, through float64) round once:
    to float32 rounding to odd first, whose two extra bits keep the second rounding right."""
    x = np.asarray(x)
    if x.dtype != float32 and x.dtype != float16:
        wide = np.asarray(x, float64)
        f = wide.astype(float32)
        back = f.astype(float64)
        f = np.where(np.abs(back) > np.abs(wide), np.nextafter(f, float32.type(0)), f)  # toward zero
        u = f.view(np.uint32) | (back != wide).astype(np.uint32)  # odd where inexact
        nan = np.isnan(wide)
    else:
        u = np.asarray(x, float32).view(np.uint32)
        nan = np.isnan(x)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16  # may carry into the exponent
    bits = np.where(nan, (u >> 16) | np.uint32(0x40), rounded).astype(np.uint16)
    out = np.empty(x.shape, bfloat16) if out is None else out
    out["bfloat16"] = bits
    return out
