"""ReduceL1, ReduceLogSum and ReduceLogSumExp (axes as an attribute before opset 18, as an
input from it; keepdims, noop_with_empty_axes) converted and run, against onnxruntime."""
import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.format import writer

rng = np.random.default_rng(0)
OPS = ("ReduceL1", "ReduceLogSum", "ReduceLogSumExp")
# Operands onnxruntime can take the log of: positive for ReduceLogSum.
LOW = {"ReduceL1": -5.0, "ReduceLogSum": 0.1, "ReduceLogSumExp": -5.0}


def _model(op_type, x, axes, opset, **attrs):
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    inputs, inits = ["x"], []
    if axes is not None and opset >= 18:
        inputs.append("axes")
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
    elif axes is not None:
        attrs["axes"] = list(axes)
    reduced = x.ndim if axes is None else len(axes)
    rank = x.ndim if attrs.get("keepdims", 1) or (not axes and attrs.get("noop_with_empty_axes")) else \
        x.ndim - (reduced or x.ndim)
    graph = helper.make_graph([helper.make_node(op_type, inputs, ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("x", elem, x.shape)],
                              [helper.make_tensor_value_info("y", elem, [f"d{i}" for i in range(rank)])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", opset)])
    model.ir_version = 8
    return model


def run_both(op_type, x, axes, opset, **attrs):
    model = _model(op_type, x, axes, opset, **attrs)
    runner = ef.Interpreter(writer.to_bytes(onnx_converter.convert(model).model)).get_signature_runner("infer")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return runner(x=x)["y"], session.run(None, {"x": x})[0]


@pytest.mark.parametrize("op_type,opset,axes,keepdims", list(itertools.product(
    OPS, (13, 18), (None, (1,), (-1, 0), (0, 1, 2)), (0, 1))))
def test_axes_and_keepdims(op_type, opset, axes, keepdims):
    x = rng.uniform(LOW[op_type], 5.0, (2, 3, 4)).astype(np.float32)
    got, want = run_both(op_type, x, axes, opset, keepdims=keepdims)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op_type", OPS)
def test_noop_with_empty_axes_keeps_the_elementwise_part(op_type):
    x = rng.uniform(LOW[op_type], 5.0, (2, 3)).astype(np.float32)
    got, want = run_both(op_type, x, (), 18, noop_with_empty_axes=1)
    expected = {"ReduceL1": np.abs, "ReduceLogSum": np.log, "ReduceLogSumExp": lambda v: v}[op_type](x)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("op_type,dtype", [(op, d) for op in OPS for d in ("float16", "float64")] +
                         [("ReduceL1", "int32"), ("ReduceL1", "int64")])
def test_dtypes(op_type, dtype):
    x = rng.uniform(LOW[op_type], 5.0, (3, 5)) if dtype.startswith("float") else rng.integers(-9, 10, (3, 5))
    x = x.astype(dtype)
    got, want = run_both(op_type, x, (1,), 18, keepdims=0)
    assert got.dtype == np.dtype(dtype)
    tol = 2e-3 if dtype == "float16" else 1e-12
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
