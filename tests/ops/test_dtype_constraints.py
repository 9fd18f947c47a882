"""Dtype constraints declared in define(): inference accepts the declared dtypes, rejects
the others with GraphError naming the op, the input and the dtypes it takes.

Representative ops are checked against sets written here (ONNX's type constraints and
the kernels' reach); every other declared op against its declaration, which checks that
its inference takes each dtype the declaration admits and gives the declared outputs.
"""
import numpy as np
import pytest

from edgeflow import dtypes, ops
from edgeflow.errors import GraphError
from edgeflow.ops import TensorSpec

D = "dtype under test"


class S:
    """An input of an example: `shape`, and `dtype` (D: the one under test); `value` where
    the op reads it (a shape operand), converted to the input's dtype."""

    def __init__(self, shape, dtype=D, value=None):
        self.shape, self.dtype, self.value = tuple(shape), dtype, value

    def spec(self, dt):
        dt = dtypes.as_dtype(dt if self.dtype is D else self.dtype)
        return TensorSpec(self.shape, dt, None if self.value is None else dtypes.array(np.array(self.value), dt))


def _unary(dims=(2, 3), **attrs):
    return [S(dims)], attrs


def _binary(a=(2, 3), b=(3,), **attrs):
    return [S(a), S(b)], attrs


_IMAGE = (1, 2, 5, 5)
_LSTM = [S((5, 2, 4)), S((1, 12, 4)), S((1, 12, 3))]
_GRU = [S((5, 2, 4)), S((1, 9, 4)), S((1, 9, 3))]

# op -> (inputs, attrs): one valid use of every op that declares its dtypes
EXAMPLES = {
    **{name: _unary() for name in ("abs", "neg", "exp", "log", "sqrt", "sigmoid", "tanh", "relu", "softmax",
                                   "log_softmax", "leaky_relu", "hard_sigmoid", "hard_swish", "gelu", "erf",
                                   "softplus", "elu", "selu", "clip", "transpose", "shape",
                                   "reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod",
                                   "reduce_l2", "reduce_log_sum_exp", "cumsum", "cumprod", "argmax")},
    **{name: _binary() for name in ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "equal", "less",
                                    "greater")},
    "topk": _unary(k=1),
    "send": _unary(key="k"),
    "cast": _unary(dtype="float32"),
    "squeeze": _unary((2, 1, 3)),
    "expand_dims": _unary(axes=(0,)),
    "reshape": _unary(shape=(-1,)),
    "slice": _unary(starts=(0,), ends=(1,)),
    "split": _unary((4, 3), num_outputs=2),
    "pad": _unary(pads=(1, 0, 0, 1)),
    "resize": _unary(_IMAGE, scales=(2.0, 2.0)),
    "grid_sample": ([S(_IMAGE), S((1, 3, 4, 2), "float32")], {"mode": "nearest"}),
    "affine_grid": ([S((1, 2, 3))], {"size": (1, 3, 4, 5)}),
    "col2im": ([S((1, 8, 9))], {"image_shape": (4, 4), "block_shape": (2, 2)}),
    "roi_align": ([S((1, 2, 6, 6)), S((3, 4)), S((3,), "int64")], {}),
    "adam_update": ([S((2, 3))] * 3 + [S(())] * 3, {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}),
    "landmarks_to_transform_matrix": ([S((1, 6, 3))], {"left": 0, "right": 1, "subset": (2, 3), "output_size": (4, 4)}),
    "transform_landmarks": ([S((1, 6, 2)), S((1, 4, 4))], {}),
    "transform_tensor_bilinear": ([S(_IMAGE), S((1, 4, 4))], {"output_size": (2, 3)}),
    "max_pool": _unary(_IMAGE, kernel_shape=(2, 2)),
    "avg_pool": _unary(_IMAGE, kernel_shape=(2, 2)),
    "lp_pool": _unary(_IMAGE, kernel_shape=(2, 2)),
    "lrn": _unary(_IMAGE, size=3),
    "reverse_sequence": ([S((3, 2)), S((2,), "int64")], {}),
    "eye_like": _unary((2, 3), dtype="float32"),
    "max_pool_indices": _unary(_IMAGE, kernel_shape=(2, 2)),
    "max_unpool": ([S((1, 2, 2, 2)), S((1, 2, 2, 2), "int64")], {"kernel_shape": (2, 2), "strides": (2, 2)}),
    "matmul": _binary((2, 3), (3, 4)),
    "einsum": _binary((2, 3), (3, 4), equation="ij,jk->ik"),
    "concat": _binary((2, 3), (1, 3), axis=0),
    "where": ([S((2, 3), "bool"), S((2, 3)), S((3,))], {}),
    "gather": ([S((4, 3)), S((2,), "int64")], {}),
    "expand": ([S((1, 3)), S((2,), "int64", [2, 3])], {}),
    "tile": ([S((1, 3)), S((2,), "int64", [2, 1])], {}),
    "range": ([S(()), S(()), S(())], {}),
    "constant_of_shape": ([S((2,), D, [2, 3])], {}),
    "random_uniform": ([S((2,), D, [2, 3])], {}),
    "recv": ([S((0, 3))], {"key": "k", "dtype": "float32", "shape": (3,)}),
    "conv": ([S(_IMAGE), S((3, 2, 3, 3)), S((3,))], {}),
    "deform_conv": ([S(_IMAGE), S((3, 2, 3, 3)), S((1, 18, 3, 3)), S((3,)), S((1, 9, 3, 3))], {}),
    "conv_transpose": ([S(_IMAGE), S((2, 3, 3, 3)), S((3,))], {}),
    "batch_norm": ([S((2, 3, 4))] + [S((3,)) for _ in range(4)], {}),
    "layer_norm": ([S((2, 3)), S((3,)), S((3,))], {}),
    "lstm": (_LSTM, {"hidden_size": 3}),
    "gru": (_GRU, {"hidden_size": 3}),
    "rnn": ([S((5, 2, 4)), S((1, 3, 4)), S((1, 3, 3))], {"hidden_size": 3}),
    "lstm_grad": (_LSTM + [S((5, 1, 2, 3)), S((1, 2, 3)), S((1, 2, 3))], {"hidden_size": 3}),
    "gru_grad": (_GRU + [S((5, 1, 2, 3)), S((1, 2, 3))], {"hidden_size": 3}),
    **{name: _binary((3,), (3,)) for name in ("assign", "assign_add", "assign_sub")},
    "quantize_linear": ([S((2, 3)), S(()), S((), "uint8")], {}),
    "dequantize_linear": ([S((2, 3)), S((), "float32"), S(())], {}),
    "argmin": _unary(),
    "gather_elements": ([S((4, 3)), S((2, 3), "int64")], {}),
    "gather_nd": ([S((4, 3)), S((2, 1), "int64")], {}),
    "scatter_elements": ([S((4, 3)), S((2, 3), "int64"), S((2, 3))], {"reduction": "add"}),
    "scatter_nd": ([S((4, 3)), S((2, 1), "int64"), S((2, 3))], {}),
    "one_hot": ([S((2, 3)), S((2,))], {"depth": 4}),
    "trilu": ([S((3, 3)), S((), "int64")], {}),
    **{name: _unary() for name in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
                                   "atanh", "floor", "ceil", "round", "sign", "is_nan", "is_inf")},
    **{name: _binary() for name in ("logical_and", "logical_or", "logical_xor", "mod", "bit_shift")},
    **{name: _unary() for name in ("celu", "softsign", "mish", "thresholded_relu", "shrink")},
    # Gradient ops: where `like` gives only a shape, any dtype does; where it is the forward
    # op's input, the gradient's dtype.
    "sum_to": ([S((2, 3)), S((3,), "int8")], {}),
    "clip_grad": ([S((2, 3)), S((2, 3))], {"min": 0.0, "max": 6.0}),
    "relu_grad": ([S((2, 3)), S((2, 3))], {}),
    "slice_grad": ([S((1, 3)), S((2, 3), "int8")], {"starts": (0,), "ends": (1,)}),
    "gather_grad": ([S((2, 3)), S((2,), "int64"), S((4, 3), "int8")], {}),
    "conv_input_grad": ([S((1, 3, 3, 3)), S((3, 2, 3, 3)), S(_IMAGE)], {}),
    "conv_filter_grad": ([S(_IMAGE), S((1, 3, 3, 3)), S((3, 2, 3, 3))], {}),
    "max_pool_grad": ([S(_IMAGE), S((1, 2, 4, 4))], {"kernel_shape": (2, 2)}),
    "avg_pool_grad": ([S((1, 2, 4, 4)), S(_IMAGE)], {"kernel_shape": (2, 2)}),
    "pad_grad": ([S((3, 4)), S((2, 3))], {"pads": (1, 0, 0, 1), "mode": "reflect"}),
    "resize_grad": ([S((1, 2, 10, 10)), S(_IMAGE)], {"scales": (2.0, 2.0)}),
    **{name: _binary() for name in ("less_equal", "greater_equal")},
    "logical_not": _unary(),
    "hardmax": _unary(),
    "nonzero": _unary(),
    "compress": ([S((4, 3)), S((4,), "bool")], {"axis": 0}),
    "unique": _unary(),
    "non_max_suppression": ([S((1, 3, 4)), S((1, 2, 3))], {"max_output_boxes_per_class": 2}),
    **{name: _binary() for name in ("bitwise_and", "bitwise_or", "bitwise_xor")},
    "bitwise_not": _unary(),
    "bitcast": _unary(dtype="int32"),
    "dft": ([S((2, 8, 2)), S((), "int64", 6)], {"axis": 1}),
    "stft": ([S((1, 16, 1)), S((), "int64", 4), S((), "int64", 8), S((8,))], {}),
    "window": ([S((), D, 8)], {"kind": "hann"}),
    "mel_weight_matrix": ([S((), D, 4), S((), D, 16), S((), D, 8000), S((), "float32", 0), S((), "float32", 4000)], {}),
    "det": _unary((2, 3, 3)),
    **{name: ([S((2, 3, 4)), S((2, 4), "int64"), S((3,))], {}) for name in ("nll_loss", "softmax_cross_entropy_loss")},
    "nll_loss_grad": ([S(()), S((2, 3, 4), "int8"), S((2, 4), "int32"), S((3,))], {}),
    "attention": ([S((1, 2, 3, 4)), S((1, 1, 5, 4)), S((1, 1, 5, 6))], {}),
    "attention_grad": ([S((1, 2, 3, 4)), S((1, 1, 5, 4)), S((1, 1, 5, 6)), S((1, 2, 3, 6))], {}),
    "swish": _unary(),
    "swiglu": _binary((2, 3), (2, 3)),
    "prelu": _binary((2, 3, 4), (3, 1)),
    "rotary_embedding": ([S((1, 2, 3, 4)), S((1, 3, 2)), S((1, 3, 2))], {}),
}

# Ops whose inference takes fewer dtypes than their declaration admits (a constraint that
# Types cannot state): op -> the dtypes its example takes.
NARROWER = {"bitcast": ("float32", "int32", "uint32")}  # the width of its `dtype` attribute, 32 bits


FLOAT = ("float16", "float32", "float64")
INT = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
EVERY = FLOAT + INT + ("bool", "bfloat16")

# op -> the dtypes it takes, written out here; inputs are the op's example with other
# dtypes where given: (op, the inputs to vary, their dtypes elsewhere): dtypes taken
INDEPENDENT = [
    ("matmul", None, FLOAT + INT + ("bfloat16",)),
    ("add", None, FLOAT + INT + ("bfloat16",)),
    ("relu", None, FLOAT + INT),
    ("where", "x, y", EVERY),
    ("where", "condition", ("bool",)),
    ("cast", None, EVERY),
    ("conv", None, FLOAT),
    ("gather", "params", EVERY),
    ("gather", "indices", ("int32", "int64")),
    ("concat", None, EVERY),
    ("argmax", None, EVERY),
    ("lstm", None, FLOAT),
]
_FIXED = {("where", "x, y"): [S((2, 3), "bool"), S((2, 3)), S((3,))],
          ("where", "condition"): [S((2, 3)), S((2, 3), "float32"), S((3,), "float32")],
          ("gather", "params"): [S((4, 3)), S((2,), "int32")],
          ("gather", "indices"): [S((4, 3), "float32"), S((2,))]}


def _infer(name, inputs, attrs, dt):
    opdef = ops.get(name)
    return opdef.infer_specs([s.spec(dt) for s in inputs], opdef.check_attrs(attrs))


def _check(name, inputs, attrs, taken):
    for dt in dtypes.ALL:
        if dt in taken:
            _infer(name, inputs, attrs, dt)
            continue
        with pytest.raises(GraphError, match=rf"^{name}: [^:]+: dtype {dtypes.name(dt)} not supported; expected \w"):
            _infer(name, inputs, attrs, dt)


def _defined_in_edgeflow_ops():
    """The ops of edgeflow/ops/, not those other tests register."""
    return {name for name in ops.names() if ops.get(name).infer.__module__.startswith("edgeflow.ops.")}


def test_every_op_declares_its_dtypes():
    assert not {name for name in _defined_in_edgeflow_ops() if ops.get(name).types is None}


def test_every_op_has_an_example():
    # Control flow (if, while) takes any dtypes its subgraphs take: tests/graph/test_control.py
    # checks that op and subgraphs must agree.
    assert set(EXAMPLES) == {n for n in _defined_in_edgeflow_ops() if not ops.get(n).subgraphs}


@pytest.mark.parametrize("name,which,taken", INDEPENDENT, ids=[f"{n}-{w or 'all'}" for n, w, _ in INDEPENDENT])
def test_representative_ops_take_the_dtypes_onnx_and_the_kernels_do(name, which, taken):
    inputs, attrs = EXAMPLES[name]
    _check(name, _FIXED.get((name, which), inputs), attrs, {dtypes.as_dtype(t) for t in taken})


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_inference_takes_what_the_declaration_admits(name):
    inputs, attrs = EXAMPLES[name]
    opdef = ops.get(name)
    allowed = opdef.types.input_dtypes(len(inputs), opdef.check_attrs(attrs))
    taken = frozenset.intersection(*(a for a, s in zip(allowed, inputs) if s.dtype is D))
    if name in NARROWER:
        taken = {np.dtype(t) for t in NARROWER[name]}
    _check(name, inputs, attrs, taken)


@pytest.mark.parametrize("name,attr,taken", [("cast", "dtype", EVERY), ("constant_of_shape", "dtype", EVERY),
                                             ("recv", "dtype", EVERY),
                                             ("random_uniform", "dtype", ("float32", "float64"))])
def test_output_dtype_from_an_attribute(name, attr, taken):
    inputs, attrs = EXAMPLES[name]
    for dt in dtypes.ALL:
        given = {**attrs, attr: dt}
        if dtypes.name(dt) in taken:
            assert _infer(name, inputs, given, "int64")[0].dtype == dt
            continue
        with pytest.raises(GraphError, match=rf"^{name}: attribute '{attr}' is {dtypes.name(dt)}; "
                                             r"expected float32 or float64$"):
            _infer(name, inputs, given, "int64")


def test_the_message_names_the_op_the_input_and_the_dtypes():
    inputs, attrs = EXAMPLES["gather"]
    with pytest.raises(GraphError, match=r"^gather: indices: dtype float32 not supported; "
                                         r"expected int32 or int64$"):
        _infer("gather", [S((4, 3), "float32"), S((2,), "float32")], attrs, None)
    with pytest.raises(GraphError, match=r"^matmul: b must be float32, got float64 \(inputs of type T share "
                                         r"one dtype, and a is float32\)$"):
        _infer("matmul", [S((2, 3), "float32"), S((3, 4), "float64")], {}, None)
    with pytest.raises(GraphError, match=r"^concat: input 2 must be int8, got uint8"):
        _infer("concat", [S((1,), "int8"), S((1,), "int8"), S((1,), "uint8")], {"axis": 0}, None)


def test_optional_inputs_fill_first_to_last():
    """lstm's optional inputs come in ONNX's order (B, initial_h, initial_c), absent ones
    skipped; all share X's dtype."""
    x = [S((5, 2, 4), "float32"), S((1, 12, 4), "float32"), S((1, 12, 3), "float32")]
    h = S((1, 2, 3), "float64")
    with pytest.raises(GraphError, match=r"^lstm: input 3 must be float32, got float64"):
        _infer("lstm", x + [h], {"hidden_size": 3, "has_initial_h": True}, None)
    ops.get("lstm").infer_specs([s.spec(None) for s in x] + [S((1, 2, 3), "float32").spec(None)],
                                ops.get("lstm").check_attrs({"hidden_size": 3, "has_initial_h": True}))
