"""Hand-built ModelDefs for the format tests, and the test-only op they use."""
import numpy as np

from edgeflow import dtypes
from edgeflow.format.model import (ModelDef, OperatorDef, QuantizationDef, SignatureDef,
                                   SubGraphDef, TensorDef)
from edgeflow.ops import Attr, AttrKind, registry

EVERY_ATTR_OP = "format_test_every_attr"


def define_every_attr_op():
    K = AttrKind
    attrs = {"i": Attr(K.INT), "f": Attr(K.FLOAT, 0.5), "b": Attr(K.BOOL, False),
             "s": Attr(K.STRING, ""), "ints": Attr(K.INTS, ()), "floats": Attr(K.FLOATS, ()),
             "dtype": Attr(K.DTYPE, dtypes.float32)}
    registry.define(EVERY_ATTR_OP, inputs=(1, None), outputs=2, attrs=attrs)(
        lambda specs, attrs: [specs[0], specs[0]])


def sample(dtype, shape, rng):
    """Values spanning the dtype's range (extremes included where there is room)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if dtype == dtypes.bfloat16:  # the largest finite, the smallest subnormal, -0.0, NaN: by their bits
        a = dtypes.narrow(rng.standard_normal(shape))
        a["bfloat16"].flat[:4] = [0x7F7F, 0x0001, 0x8000, 0x7FC1][:a.size]
        return a
    if dtype.kind == "f":
        a = np.asarray(rng.standard_normal(shape), dtype=dtype)
        if a.size >= 3:
            a.flat[:3] = [np.finfo(dtype).max, np.finfo(dtype).tiny, -0.0]
        return a
    info = np.iinfo(dtype)
    a = np.asarray(rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True))
    if a.size >= 2:
        a.flat[:2] = [info.min, info.max]
    return a


class _Tensors:
    """Collects tensors of a subgraph, handing out their indices."""

    def __init__(self):
        self.defs = []

    def __call__(self, name, dtype, shape, data=None, **kw):
        self.defs.append(TensorDef(name, np.dtype(dtype), tuple(shape), data, **kw))
        return len(self.defs) - 1


def every_feature_model():
    """Two subgraphs touching every part of the schema: all dtypes, a scalar, an empty
    tensor, dynamic dims, both quantizations, variables, a shared array, ops with
    attributes of every kind, placements, three signatures, metadata."""
    rng = np.random.default_rng(0)
    t = _Tensors()
    x = t("x", "float32", (-1, 4))
    w = t("w", "float32", (4, 4), sample("float32", (4, 4), rng))
    b = t("b", "float32", (4,), sample("float32", (4,), rng))
    shared = sample("float32", (4, 4), rng)
    t("shared_a", "float32", (4, 4), shared)
    t("shared_b", "float32", (4, 4), shared)
    for dt in dtypes.ALL:
        t(f"const_{dtypes.name(dt)}", dt, (2, 3), sample(dt, (2, 3), rng))
    t("scalar", "float64", (), np.array(3.25))
    t("empty", "int32", (0, 3), np.zeros((0, 3), np.int32))
    q8 = t("q8", "int8", (3, 2), sample("int8", (3, 2), rng),
           quantization=QuantizationDef((0.1, 0.2, 0.3), (0, 1, -1), axis=0))
    t("qt", "uint8", (4,), sample("uint8", (4,), rng),
      quantization=QuantizationDef((0.05,), (128,)))
    t("state", "float32", (4,), sample("float32", (4,), rng), is_variable=True)
    xw, y, r = t("xw", "float32", (-1, 4)), t("y", "float32", (-1, 4)), t("r", "float32", (-1, 4))
    rs, rc = t("rs", "float32", (-1, 2, 2)), t("rc", "int32", (-1, 2, 2))
    rsum, cat = t("rsum", "int32", (-1, 1, 1)), t("cat", "float32", (-1, 12))
    sm, e0, e1 = (t(name, "float32", (-1, 12)) for name in ("sm", "e0", "e1"))
    operators = [
        OperatorDef("matmul", [x, w], [xw], {"transpose_b": True}),
        OperatorDef("add", [xw, b], [y]),
        OperatorDef("relu", [y], [r], placement="device"),
        OperatorDef("reshape", [r], [rs], {"shape": (-1, 2, 2)}),
        OperatorDef("cast", [rs], [rc], {"dtype": dtypes.int32}),
        OperatorDef("reduce_sum", [rc], [rsum], {"axes": (1, 2), "keepdims": True}),
        OperatorDef("concat", [r, r, y], [cat], {"axis": 1}),
        OperatorDef("softmax", [cat], [sm], placement="cloud"),
        OperatorDef(EVERY_ATTR_OP, [sm, q8], [e0, e1],
                    {"i": -7, "f": 1.5, "b": True, "s": "héllo ✓", "ints": (1, -2, 2**40),
                     "floats": (0.25, -1e300), "dtype": dtypes.float16}),
    ]
    main = SubGraphDef("main", t.defs, operators, [x], [rsum, sm, e0])

    u = _Tensors()
    state = u("state", "float32", (4,), sample("float32", (4,), rng), is_variable=True)
    grad, new = u("grad", "float32", (4,)), u("new_state", "float32", (4,))
    train = SubGraphDef("train", u.defs, [OperatorDef("sub", [state, grad], [new])], [grad], [new])

    return ModelDef(
        subgraphs=[main, train],
        signatures=[SignatureDef("infer", {"x": x}, {"sum": rsum, "probs": sm}, 0),
                    SignatureDef("train", {"grad": grad}, {"state": new}, 1),
                    SignatureDef("save", {}, {}, 1)],
        metadata={"labels": b"cat\ndog", "empty": b"", "binary": bytes(range(256))},
        description="every feature ✓ — 模型", producer="tests/format")


def mlp_model(sizes=(8, 16, 4), seed=0):
    """x -> (matmul, add, relu)* -> softmax, with float32 weights."""
    rng = np.random.default_rng(seed)
    t = _Tensors()
    h = x = t("x", "float32", (-1, sizes[0]))
    operators = []
    for k, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        w = t(f"w{k}", "float32", (n_in, n_out), sample("float32", (n_in, n_out), rng))
        bias = t(f"b{k}", "float32", (n_out,), sample("float32", (n_out,), rng))
        xw, y, r = (t(f"{name}{k}", "float32", (-1, n_out)) for name in ("xw", "y", "r"))
        operators += [OperatorDef("matmul", [h, w], [xw]), OperatorDef("add", [xw, bias], [y]),
                      OperatorDef("relu", [y], [r])]
        h = r
    probs = t("probs", "float32", (-1, sizes[-1]))
    operators.append(OperatorDef("softmax", [h], [probs]))
    return ModelDef([SubGraphDef("mlp", t.defs, operators, [x], [probs])],
                    [SignatureDef("infer", {"x": x}, {"probs": probs})])


def tensor_index(subgraph, name):
    return next(k for k, t in enumerate(subgraph.tensors) if t.name == name)
