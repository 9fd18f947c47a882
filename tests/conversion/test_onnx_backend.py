"""ONNX's own backend node tests (onnx.backend.test), run through converters.onnx and the
edgeflow interpreter: each test's one-node model is converted with optimize=True, written
to bytes, loaded by an Interpreter and run on ONNX's inputs; outputs are compared with
ONNX's expected ones (rtol 1e-3, atol 1e-7, dtype and shape exact). Operands that the
converter needs as constants are made initializers first (CONSTANT_OPERANDS).

Only node tests of the op types converters.onnx claims (the keys of HANDLERS) run, plus
their `_expanded` function-body variants when every op of the body is claimed too; the
variants edgeflow leaves out on purpose are excluded below, each with its reason.
`python tests/conversion/backend_report.py` prints the results per ONNX op.
"""
import re
import warnings

import ml_dtypes
import numpy as np
import onnx
import onnx.backend.base
import onnx.backend.test
from onnx.backend.test.loader import load_model_tests

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.converters.onnx.handlers import HANDLERS
from edgeflow.format import writer


# Operands that converters.onnx needs as constants (they set shapes, or attributes of
# edgeflow's ops). Exported models give them as initializers or Constant nodes; ONNX's node
# tests give them as graph inputs, so the backend makes them initializers holding the
# test's values before converting: op type -> input positions.
CONSTANT_OPERANDS = {"Resize": (1, 2, 3)}


# Ops whose output depends only on their input's shape: values traced back stop there.
_SHAPE_ONLY = {"Shape", "Size"}


def _constant_inputs(model):
    """Names of graph inputs whose values an operand listed in CONSTANT_OPERANDS depends
    on, directly or through the nodes computing it (a function's `_expanded` body)."""
    graph_inputs = {vi.name for vi in model.graph.input}
    producer = {out: node for node in model.graph.node for out in node.output}
    pending = [node.input[i] for node in model.graph.node for i in CONSTANT_OPERANDS.get(node.op_type, ())
               if i < len(node.input) and node.input[i]]
    seen = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producer.get(name)
        if node is not None and node.op_type not in _SHAPE_ONLY:
            pending.extend(v for v in node.input if v)
    return seen & graph_inputs


def _with_initializers(model, values):
    """A copy of `model` in which the graph inputs named in `values` are initializers."""
    from onnx import numpy_helper
    frozen = onnx.ModelProto()
    frozen.CopyFrom(model)
    kept = [vi for vi in frozen.graph.input if vi.name not in values]
    del frozen.graph.input[:]
    frozen.graph.input.extend(kept)
    frozen.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), name)
                                    for name, v in values.items())
    return frozen


class EdgeflowRep(onnx.backend.base.BackendRep):
    def __init__(self, model):
        self._model = model
        initializers = {i.name for i in model.graph.initializer}
        self._inputs = [vi.name for vi in model.graph.input if vi.name not in initializers]
        self._outputs = [vi.name for vi in model.graph.output]
        self._constant = _constant_inputs(model)
        self._runner = None if self._constant else self._prepare(model)

    @staticmethod
    def _prepare(model):
        blob = writer.to_bytes(onnx_converter.convert(model, optimize=True).model)
        return ef.Interpreter(blob).get_signature_runner("infer")

    def run(self, inputs, **kwargs):
        feeds = dict(inputs) if isinstance(inputs, dict) else dict(zip(self._inputs, inputs))
        runner = self._runner
        if self._constant:
            runner = self._prepare(_with_initializers(
                self._model, {n: feeds.pop(n) for n in self._constant}))
        results = runner(**feeds)  # ml_dtypes' bfloat16 arrays feed edgeflow's bfloat16 inputs
        # edgeflow's bfloat16 as ml_dtypes' (ONNX's expected outputs), bit for bit
        return tuple(results[name].view(ml_dtypes.bfloat16) if results[name].dtype == ef.dtypes.bfloat16
                     else results[name] for name in self._outputs)


class EdgeflowBackend(onnx.backend.base.Backend):
    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        return EdgeflowRep(model)

    @classmethod
    def supports_device(cls, device):
        return device == "CPU"


def _test_ops():
    """ONNX test name -> the op type it tests. A function op's `_expanded` test (its body
    spelled in primitive ops) counts under that op when edgeflow claims all the body's ops."""
    with warnings.catch_warnings():  # ONNX's case generators overflow on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        cases = load_model_tests(kind="node")
    tested = {c.name: c.model.graph.node[0].op_type for c in cases if len(c.model.graph.node) == 1}
    ops = {}
    for c in cases:
        body = {n.op_type for n in c.model.graph.node}
        base = re.sub(r"_expanded(_ver\d+)?$", "", c.name)
        op = tested.get(base)
        if op in HANDLERS and body <= HANDLERS.keys():
            ops[c.name] = op
    return ops


TEST_OPS = _test_ops()

# Variants of claimed ops that edgeflow leaves out on purpose (the converter raises
# UnsupportedOpError or ConversionError naming them): test-name pattern -> reason.
EXCLUDED = {
    r"(?i)FLOAT8|FLOAT4E2M1|e8m0|e4m3|e5m2": "float8 and float4 are not edgeflow dtypes",
    r"(?i)_U?INT[24]_": "2- and 4-bit integers are not edgeflow dtypes",
    r"^test_(de)?quantizelinear_blocked": "blocked quantization (block_size) is not supported",
    r"_string": "strings are not an edgeflow dtype",
    r"^test_identity_(opt|sequence)_": "optional and sequence values: edgeflow graphs carry tensors",
    r"^test_batchnorm_.*_training_mode_": "BatchNormalization in training mode (inference graphs only)",
    r"^test_training_dropout": "Dropout in training mode (inference graphs only)",
    r"^test_dropout_default_mask": "Dropout's mask output (inference graphs only)",
    r"^test_reduce_sum_empty_axes_input_noop": "noop_with_empty_axes with axes known only when "
        "running (a graph input): edgeflow's reductions read empty axes as all axes",
    r"^test_maxunpool_export_with_output_shape": "MaxUnpool's indices index the output_shape tensor, as "
        "onnxruntime and PyTorch read them (MaxPool's input, which the unpooling restores); ONNX's "
        "reference reads them in the default-shaped output and pads that to output_shape",
    r"^test_resize_.*cubic": "Resize mode cubic",
    r"^test_resize_.*antialias": "Resize with antialias",
    r"^test_resize_tf_crop_and_resize": "Resize with tf_crop_and_resize",
    r"^test_resize_.*half_pixel_symmetric": "Resize with half_pixel_symmetric",
    r"^test_resize_.*_not_(larger|smaller)_": "Resize with keep_aspect_ratio_policy",
    r"^test_resize_downsample_scales_linear_align_corners_":
        "align_corners at a fractional input length * scale: edgeflow divides by the output "
        "length, as onnxruntime does; ONNX's reference divides by input length * scale",
}

backend_test = onnx.backend.test.BackendTest(EdgeflowBackend, __name__)
backend_test.include(rf"^({'|'.join(map(re.escape, TEST_OPS))})_cpu$")
for pattern in EXCLUDED:
    backend_test.exclude(pattern)


def _node_tests():
    """ONNX's node-test case class holding only the included tests: the other ~3000 (other
    ops, the CUDA device, real models that would be downloaded) would only be skipped."""
    case = backend_test.test_cases["OnnxBackendNodeModelTest"]
    for name in [a for a in vars(case) if a.startswith("test_") and a.removesuffix("_cpu") not in TEST_OPS]:
        delattr(case, name)
    return case


OnnxBackendNodeModelTest = _node_tests()
