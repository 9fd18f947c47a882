"""ONNX's own backend node tests (onnx.backend.test), run through converters.onnx and the
edgeflow interpreter: each test's one-node model is converted with optimize=True, written
to bytes, loaded by an Interpreter and run on ONNX's inputs; outputs are compared with
ONNX's expected ones (rtol 1e-3, atol 1e-7, dtype and shape exact). Every case runs as
given: operands that set shapes or attributes stay graph inputs, known only when running.

Only node tests of the op types converters.onnx claims (the keys of HANDLERS) run, plus
their `_expanded` function-body variants when every op of the body is claimed too; the
variants edgeflow leaves out on purpose are excluded below, each with its reason.
`python tests/conversion/backend_report.py` prints the results per ONNX op.
"""
import re
import warnings

import ml_dtypes
import onnx
import onnx.backend.base
import onnx.backend.test
from onnx.backend.test.loader import load_model_tests

import edgeflow as ef
from edgeflow.converters import onnx as onnx_converter
from edgeflow.converters.onnx.handlers import HANDLERS
from edgeflow.format import writer


class EdgeflowRep(onnx.backend.base.BackendRep):
    def __init__(self, model):
        initializers = {i.name for i in model.graph.initializer}
        self._inputs = [vi.name for vi in model.graph.input if vi.name not in initializers]
        self._outputs = [vi.name for vi in model.graph.output]
        blob = writer.to_bytes(onnx_converter.convert(model, optimize=True).model)
        self._runner = ef.Interpreter(blob).get_signature_runner("infer")

    def run(self, inputs, **kwargs):
        feeds = dict(inputs) if isinstance(inputs, dict) else dict(zip(self._inputs, inputs))
        results = self._runner(**feeds)  # ml_dtypes' bfloat16 arrays feed edgeflow's bfloat16 inputs
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


def _node_cases():
    with warnings.catch_warnings():  # ONNX's case generators overflow on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        return load_model_tests(kind="node")


def _tested_ops(cases):
    """ONNX test name -> the op type it tests: a one-node case's op; an `_expanded` case
    (a function op's body spelled in primitive ops) counts under the function op."""
    tested = {c.name: c.model.graph.node[0].op_type for c in cases if len(c.model.graph.node) == 1}
    return {c.name: tested.get(re.sub(r"_expanded(_ver\d+)?$", "", c.name), c.model.graph.node[0].op_type)
            for c in cases}


CASES = _node_cases()
TESTED = _tested_ops(CASES)
# The cases that run: those of the op types converters.onnx claims, an `_expanded` one
# when edgeflow claims every op of the body too.
TEST_OPS = {c.name: TESTED[c.name] for c in CASES
            if TESTED[c.name] in HANDLERS and {n.op_type for n in c.model.graph.node} <= HANDLERS.keys()}

# ONNX op types with node tests that converters.onnx does not claim: op -> why.
NOT_CLAIMED = {
    **{op: "strings are not an edgeflow dtype"
       for op in ("StringSplit", "StringNormalizer", "StringConcat", "RegexFullMatch", "TfIdfVectorizer")},
    **{op: "optional and sequence values: edgeflow graphs carry tensors"
       for op in ("OptionalHasElement", "OptionalGetElement", "SequenceMap")},
    **{op: "opset 27, newer than what exporters emit" for op in ("LinearAttention", "CausalConvWithState")},
    "FlexAttention": "the ai.onnx.preview domain",
    "TensorScatter": "opset 24's in-place KV-cache write: not yet",
    "ImageDecoder": "decodes JPEG/PNG bytes: an image codec, not a tensor op",
    "Bernoulli": "random draws: ONNX's expected values come from one generator's stream",
    "Upsample": "removed from ONNX at opset 10 (Resize replaces it)",
    **{op: "the ai.onnx.ml domain (classical ML)"
       for op in ("LabelEncoder", "TreeEnsemble", "ArrayFeatureExtractor", "Binarizer")},
    **{op: "the ai.onnx.preview.training domain (edgeflow packages its own optimizers)"
       for op in ("Momentum", "Adagrad", "Adam")},
}


def not_run():
    """ONNX test name -> why that case does not run: its op is not claimed (NOT_CLAIMED), or
    its function body uses ops that are not."""
    out = {}
    for c in CASES:
        if c.name in TEST_OPS:
            continue
        op = TESTED[c.name]
        missing = sorted({n.op_type for n in c.model.graph.node} - HANDLERS.keys())
        out[c.name] = NOT_CLAIMED.get(op) if op not in HANDLERS else \
            f"its function body uses {', '.join(missing)}: " + "; ".join(
                sorted({NOT_CLAIMED.get(m, "?") for m in missing}))
    return out


def test_every_case_that_does_not_run_says_why():
    """Nothing is left out silently: every op type with node tests is claimed or listed in
    NOT_CLAIMED, and NOT_CLAIMED lists no op that is claimed."""
    ops = set(TESTED.values())
    assert not (ops - HANDLERS.keys()) - NOT_CLAIMED.keys(), "op types neither claimed nor in NOT_CLAIMED"
    assert not NOT_CLAIMED.keys() & HANDLERS.keys(), "claimed op types listed in NOT_CLAIMED"
    assert None not in not_run().values() and not any("?" in why for why in not_run().values())

# Variants of claimed ops that edgeflow leaves out on purpose (the converter raises
# UnsupportedOpError or ConversionError naming them): test-name pattern -> reason.
EXCLUDED = {
    r"(?i)FLOAT8|FLOAT4E2M1|e8m0|e4m3|e5m2": "float8 and float4 are not edgeflow dtypes",
    r"(?i)_U?INT[24]_": "2- and 4-bit integers are not edgeflow dtypes",
    r"^test_(de)?quantizelinear_blocked": "blocked quantization (block_size) is not supported",
    r"_string": "strings are not an edgeflow dtype",
    r"^test_identity_(opt|sequence)_": "optional and sequence values: edgeflow graphs carry tensors",
    r"^test_if_seq_": "the branches give sequences, and the condition is a graph input: edgeflow has no "
        "sequence values (a sequence is a list of tensors while converting, so only an If whose "
        "condition is known then may give one)",
    r"^test_if_opt_": "the branches give optional values (Optional): edgeflow graphs carry tensors",
    r"^test_loop13_seq_": "sequence-typed graph input, carried through the loop and growing each "
        "iteration: edgeflow has no sequence values",
    r"^test_loop16_seq_none_": "optional-sequence graph input (OptionalHasElement, OptionalGetElement): "
        "edgeflow has no optional or sequence values",
    r"^test_sequence_insert_at_(back|front)_": "sequence-typed graph input and output: edgeflow has no "
        "sequence values (SequenceInsert converts where the sequence is made in the graph)",
    r"^test_split_to_sequence_": "sequence-typed graph output: edgeflow has no sequence values "
        "(SplitToSequence converts where ConcatFromSequence or SequenceAt reads the pieces)",
    r"^test_scan_sum_": "opset 8's Scan (a batch axis and sequence_lens): ONNX's version converter, "
        "through which edgeflow reads opsets below 13, rewrites it to opset 9's Scan with the batch "
        "axis dropped from the graph inputs (float[2], not the [1,2] the case feeds)",
    r"^test_affine_grid_2d(_align_corners)?_expanded_": "the function body squeezes (Squeeze without "
        "axes) a tensor whose first dimension is read from the `size` input when running, so its "
        "rank would depend on that value; edgeflow's ranks are known while converting (AffineGrid "
        "itself passes)",
    r"^test_affine_grid_3d_align_corners_expanded_": "the function body's nested If gives a scalar in "
        "one branch and a [1] tensor in the other, on a condition computed when running: edgeflow's "
        "if gives each output one rank (AffineGrid itself passes)",
    r"^test_batchnorm_.*_training_mode_": "BatchNormalization in training mode (inference graphs only)",
    r"^test_training_dropout": "Dropout in training mode (inference graphs only)",
    r"^test_dropout_default_mask": "Dropout's mask output (inference graphs only)",
    r"^test_maxunpool_export_with_output_shape": "MaxUnpool's indices index the output_shape tensor, as "
        "onnxruntime and PyTorch read them (MaxPool's input, which the unpooling restores); ONNX's "
        "reference reads them in the default-shaped output and pads that to output_shape",
    r"^test_resize_downsample_scales_(linear|cubic)_align_corners_":
        "align_corners at a fractional input length * scale: edgeflow divides by the output "
        "length, as onnxruntime does (its result is 0.86 and 1.05 off the expected ones); "
        "ONNX's reference divides by input length * scale",
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
