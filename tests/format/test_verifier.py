"""Each verifier rule, broken on purpose in an otherwise valid file, is reported."""
import struct

import flatbuffers
import numpy as np
import pytest

from edgeflow.errors import FormatError
from edgeflow.format import reader, verifier, writer
from edgeflow.format.efl import Model as ModelTable
from edgeflow.format.model import FILE_IDENTIFIER, QuantizationDef, SignatureDef

from .models import every_feature_model, mlp_model
from .patch import Patcher


def mlp():
    """x w0 b0 xw0 y0 r0 w1 b1 xw1 y1 r1 probs; matmul add relu matmul add relu softmax."""
    return mlp_model((3, 4, 2))


@pytest.fixture
def unchecked(monkeypatch):
    """`to_bytes` without the writer's final verification, to write broken graphs."""
    monkeypatch.setattr(writer.verifier, "verify", lambda *args, **kwargs: None)
    return writer.to_bytes


def rejects(data, message):
    with pytest.raises(FormatError, match=message):
        reader.load(data)


# --- Semantic rules, broken through the ModelDef --------------------------------------

def _op(k, **change):
    def mutate(m):
        for key, value in change.items():
            setattr(m.subgraphs[0].operators[k], key, value)
    return mutate


def _tensor(k, **change):
    def mutate(m):
        for key, value in change.items():
            setattr(m.subgraphs[0].tensors[k], key, value)
    return mutate


def _subgraph(**change):
    def mutate(m):
        for key, value in change.items():
            setattr(m.subgraphs[0], key, value)
    return mutate


def _signatures(*signatures):
    def mutate(m):
        m.signatures = list(signatures)
    return mutate


SG = r"subgraph 0 'mlp': "
Q = QuantizationDef
# rule: (how to break it, the message expected)
GRAPH_RULES = {
    "op output not a constant": (  # main: accepted, then a read-only array written (fuzzer)
        _op(1, outputs=[6]),
        SG + r"operator 1 'add': outputs tensor 6 'w1', a constant \(its value is in the file\)"),
    "op input in range": (
        _op(1, inputs=[3, 40]),
        SG + r"operator 1 'add': inputs: tensor 40 out of range \(subgraph has 12 tensors\)"),
    "op input not negative": (
        _op(0, inputs=[-1, 1]), r"operator 0 'matmul': inputs: tensor -1 out of range"),
    "op output in range": (
        _op(2, outputs=[12]), r"operator 2 'relu': outputs: tensor 12 out of range"),
    "subgraph input in range": (
        _subgraph(inputs=[12]), SG + r"inputs: tensor 12 out of range"),
    "subgraph output in range": (
        _subgraph(outputs=[99]), SG + r"outputs: tensor 99 out of range"),
    "arity": (
        _op(1, inputs=[3]), r"operator 1 'add': add takes 2 inputs, got 1"),
    "input dtype declared": (
        _tensor(0, dtype=np.dtype(np.bool_)),
        r"operator 0 'matmul': matmul: a: dtype bool not supported; expected float32, float16, float64, "
        r"int8, int16, int32, int64, uint8, uint16, uint32, uint64 or bfloat16"),
    "input dtypes of one type variable agree": (
        _tensor(0, dtype=np.dtype(np.float64)),
        r"operator 0 'matmul': matmul: b must be float64, got float32"),
    "output count": (
        _op(6, outputs=[11, 10]), r"operator 6 'softmax': softmax has 1 outputs, the file lists 2"),
    "placement known": (
        _op(0, placement="moon"), r"operator 0 'matmul': placement 'moon' is not one of"),
    "one producer per tensor": (
        _op(2, outputs=[4]), SG + r"tensor 4 'y0' is produced by operators 1 and 2"),
    "inputs not produced": (
        _subgraph(inputs=[0, 3]), SG + r"input tensor 3 'xw0' is produced by operator 0"),
    "acyclic": (
        _op(0, inputs=[5, 1]),
        SG + r"operators form a cycle: 1 'add' -> 2 'relu' -> 0 'matmul' -> 1 'add'"),
    "no self loop": (
        _op(2, inputs=[5]), r"operators form a cycle: 2 'relu' -> 2 'relu'"),
    "rank at most 8": (
        _tensor(0, shape=(1,) * 9), r"tensor 0 'x': rank 9 exceeds the maximum of 8"),
    "dims at least -1": (
        _tensor(0, shape=(-2, 3)), r"tensor 0 'x': shape \(-2, 3\) has a dimension below -1"),
    "shape addressable": (
        _tensor(0, shape=(0, 2**62)),
        r"tensor 0 'x': shape \(0, 4611686018427387904\) of float32 spans more than 2\*\*63 bytes"),
    "signature keys unique": (
        _signatures(SignatureDef("infer", {}, {}), SignatureDef("infer", {}, {})),
        r"signature 1 'infer': key appears more than once"),
    "signature subgraph in range": (
        _signatures(SignatureDef("infer", {}, {}, 3)),
        r"signature 0 'infer': subgraph 3 out of range \(model has 1 subgraphs\)"),
    "signature tensors in range": (
        _signatures(SignatureDef("infer", {"x": 50}, {})),
        r"signature 0 'infer': inputs: 'x': tensor 50 out of range"),
    "per-tensor scale count": (
        _tensor(1, quantization=Q((0.1, 0.2), (0, 0))),
        r"tensor 1 'w0': quantization has 2 scales, expected 1"),
    "per-axis scale count": (
        _tensor(1, quantization=Q((0.1,) * 3, (0,) * 3, axis=1)),
        r"tensor 1 'w0': quantization has 3 scales, expected 4"),
    "quantization axis in range": (
        _tensor(1, quantization=Q((0.1,), (0,), axis=2)),
        r"quantization axis 2 is not -1 or a static axis of shape \(3, 4\)"),
    "quantization axis static": (
        _tensor(0, quantization=Q((0.1,), (0,), axis=0)),
        r"tensor 0 'x': quantization axis 0 is not -1 or a static axis"),
    "zero points match scales": (
        _tensor(1, quantization=Q((0.1,), (0, 1))), r"quantization has 2 zero points for 1 scales"),
}


@pytest.mark.parametrize("rule", GRAPH_RULES)
def test_graph_rule(rule, unchecked):
    mutate, message = GRAPH_RULES[rule]
    model = mlp()
    reader.load(unchecked(model))  # valid before
    mutate(model)
    rejects(unchecked(model), message)


# --- Semantic rules, broken in the bytes -----------------------------------------------

def patched(model, change):
    p = Patcher(writer.to_bytes(model))
    reader.load(p.bytes())  # valid before
    change(p)
    return p.bytes()


def test_identifier():
    data = bytearray(writer.to_bytes(mlp()))
    data[8:12] = b"TFL3"
    rejects(bytes(data), r"not an .efl file: identifier b'TFL3', expected b'EFL1'")


def test_version():
    data = patched(mlp(), lambda p: p.set(p.model, "Model", "version", "I", 2))
    rejects(data, r"format version 2 is not supported \(this reader reads version 1\)")


def test_opcode_is_a_known_op():
    def change(p):
        index = [p.model.Opcodes(k) for k in range(p.model.OpcodesLength())].index(b"relu")
        at = p.target(p.model, "Model", "opcodes") + 4 + 4 * index
        at += struct.unpack_from("<I", p.buf, at)[0]
        p.buf[at + 4:at + 8] = b"relX"
    rejects(patched(mlp(), change), r"opcode 2 'relX': not a known op")


def test_opcode_index_in_range():
    def change(p):
        p.set(p.model.Subgraphs(0).Operators(1), "Operator", "opcode_index", "I", 99)
    rejects(patched(mlp(), change),
            SG + r"operator 1: opcode index 99 out of range \(model has 4 opcodes\)")


def _buffer_offset(p, k):
    return p.model.Buffers(k)._tab.Pos  # Buffer.offset is the struct's first field


def test_buffer_aligned():
    def change(p):
        at = _buffer_offset(p, 0)
        struct.pack_into("<Q", p.buf, at, struct.unpack_from("<Q", p.buf, at)[0] + 8)
    rejects(patched(mlp(), change), r"buffer 0: offset \d+ is not 64-byte aligned")


def test_buffer_after_the_flatbuffer():
    rejects(patched(mlp(), lambda p: struct.pack_into("<Q", p.buf, _buffer_offset(p, 1), 0)),
            r"buffer 1: offset 0 lies inside the FlatBuffer \(which ends at \d+\)")


def test_buffer_inside_the_file():
    data = writer.to_bytes(mlp())
    rejects(data[:-64], r"buffer 3: bytes \d+ to \d+ run past the end of the file")

    def huge_size(p):
        struct.pack_into("<Q", p.buf, _buffer_offset(p, 0) + 8, 2**63)  # Buffer.size
    rejects(patched(mlp(), huge_size), r"buffer 0: bytes \d+ to \d+ run past the end of the file")


def test_dtype_code_known():
    model = every_feature_model()
    change = lambda p: p.set(p.tensor(0, "const_int32"), "Tensor", "dtype", "B", 200)  # noqa: E731
    rejects(patched(model, change),
            r"tensor \d+ 'const_int32': unknown dtype code 200")


def test_tensor_buffer_in_range():
    rejects(patched(mlp(), lambda p: p.set(p.tensor(0, "w0"), "Tensor", "buffer", "i", 7)),
            r"tensor 1 'w0': buffer 7 out of range \(model has 4 buffers\)")


def test_constant_needs_a_static_shape():
    rejects(patched(mlp(), lambda p: p.set_vector_item(p.tensor(0, "w0"), "Tensor", "shape", 0,
                                                        "q", -1)),
            r"tensor 1 'w0': has constant data \(buffer 0\) but a dynamic shape \(-1, 4\)")


def test_shape_matches_buffer_size():
    rejects(patched(mlp(), lambda p: p.set_vector_item(p.tensor(0, "w0"), "Tensor", "shape", 0,
                                                        "q", 5)),
            r"tensor 1 'w0': buffer 0 holds 48 bytes, but shape \(5, 4\) of float32 needs 80")


def _first_attr(p, op=0):
    return p.model.Subgraphs(0).Operators(op).Attrs(0)


def test_attribute_name_known():
    rejects(patched(mlp(), lambda p: p.set_string(_first_attr(p), "Attr", "name", "transpose_x")),
            r"operator 0 'matmul': unknown attribute 'transpose_x'; matmul has")


def test_attribute_type_equals_the_ops():
    rejects(patched(mlp(), lambda p: p.set(_first_attr(p), "Attr", "type", "B", 2)),
            r"attribute 'transpose_a' is stored as FLOAT, but matmul declares it BOOL")
    rejects(patched(mlp(), lambda p: p.set(_first_attr(p), "Attr", "type", "B", 77)),
            r"attribute 'transpose_a' is stored as unknown type 77")


def test_attribute_appears_once():
    def change(p):
        op = p.model.Subgraphs(0).Operators(0)
        p.set_string(op.Attrs(1), "Attr", "name", "transpose_a")
    rejects(patched(mlp(), change), r"operator 0 'matmul': attribute 'transpose_a' appears twice")


def test_required_attribute_present():
    model = every_feature_model()
    cast = next(k for k, op in enumerate(model.subgraphs[0].operators) if op.opcode == "cast")
    change = lambda p: p.set_length(p.model.Subgraphs(0).Operators(cast), "Operator", "attrs", 0)
    rejects(patched(model, change),
            rf"operator {cast} 'cast': attribute 'dtype' \(DTYPE\) is required but missing")


def _attr(p, op, name):
    operator = p.model.Subgraphs(0).Operators(op)
    return next(operator.Attrs(k) for k in range(operator.AttrsLength())
                if operator.Attrs(k).Name() == name.encode())


def _op_index(model, opcode):
    return next(k for k, op in enumerate(model.subgraphs[0].operators) if op.opcode == opcode)


def test_bool_attribute_is_0_or_1():
    model = every_feature_model()
    k = _op_index(model, "matmul")
    rejects(patched(model, lambda p: p.set(_attr(p, k, "transpose_b"), "Attr", "i", "q", 2)),
            r"attribute 'transpose_b': BOOL value 2 is not 0 or 1")


def test_dtype_attribute_known():
    model = every_feature_model()
    k = _op_index(model, "cast")
    rejects(patched(model, lambda p: p.set(_attr(p, k, "dtype"), "Attr", "i", "q", 99)),
            rf"operator {k} 'cast': attribute 'dtype': unknown dtype code 99")


def test_signature_names_unique():
    model = mlp()
    model.signatures = [SignatureDef("infer", {"x": 0}, {"p1": 11, "p2": 10})]
    change = lambda p: p.set_string(p.model.Signatures(0).Outputs(1), "TensorMap", "name", "p1")
    rejects(patched(model, change),
            r"signature 0 'infer': outputs: name 'p1' appears more than once")


def test_metadata_names_unique():
    model = mlp()
    model.metadata = {"m1": b"a", "m2": b"b"}
    rejects(patched(model, lambda p: p.set_string(p.model.Metadata(1), "Metadata", "name", "m1")),
            r"metadata: name 'm1' appears more than once")


def test_names_in_messages_are_shortened():
    model = mlp()
    model.subgraphs[0].tensors[1].name = "w" * 10_000
    data = patched(model, lambda p: p.set(p.tensor(0, "w" * 10_000), "Tensor", "buffer", "i", 7))
    with pytest.raises(FormatError) as e:
        reader.load(data)
    assert len(str(e.value)) < 200


# --- Structural rules -----------------------------------------------------------------

def valid():
    return bytearray(writer.to_bytes(mlp()))


def root_and_vtable(data):
    root = 4 + struct.unpack_from("<I", data, 4)[0]
    return root, root - struct.unpack_from("<i", data, root)[0]


def test_too_short():
    rejects(bytes(valid()[:11]), r"file too short: 11 bytes")


def test_truncated_flatbuffer():
    rejects(bytes(valid()[:100]),
            r"FlatBuffer of \d+ bytes runs past the end of the file \(100 bytes\)")


def test_size_prefix_sane():
    data = valid()
    struct.pack_into("<I", data, 0, 4)
    rejects(bytes(data), r"bad FlatBuffer size 4")


def test_root_offset_in_range_and_aligned():
    data = valid()
    struct.pack_into("<I", data, 4, 0xFFFFFF00)
    rejects(bytes(data), r"Model table at byte \d+ \(4 bytes\) lies outside the FlatBuffer")
    data = valid()
    struct.pack_into("<I", data, 4, struct.unpack_from("<I", data, 4)[0] + 2)
    rejects(bytes(data), r"Model table at byte \d+ is not 4-byte aligned")


def test_vtable_in_range():
    data = valid()
    root, _ = root_and_vtable(data)
    struct.pack_into("<i", data, root, -2**30)
    rejects(bytes(data), r"vtable of the Model table at byte \d+ .* lies outside the FlatBuffer")


def test_vtable_and_table_sizes_sane():
    data = valid()
    _, vtable = root_and_vtable(data)
    struct.pack_into("<H", data, vtable, 3)
    rejects(bytes(data), r"vtable of the Model table at byte \d+ has a bad size 3")
    data = valid()
    struct.pack_into("<H", data, vtable + 2, 0xFFFF)
    rejects(bytes(data), r"Model table at byte \d+ has a bad size 65535")


def test_field_inside_its_table():
    data = valid()
    _, vtable = root_and_vtable(data)
    struct.pack_into("<H", data, vtable + 4, 0x7FF0)  # Model.version
    rejects(bytes(data), r"field Model.version of the table at byte \d+ lies outside the table")


def test_strings_terminated_and_utf8():
    p = Patcher(writer.to_bytes(mlp()))
    at = p.target(p.model, "Model", "producer")
    n = struct.unpack_from("<I", p.buf, at)[0]
    p.buf[at + 4 + n] = ord("!")
    rejects(p.bytes(), r"string at byte \d+ is not NUL-terminated")
    p.buf[at + 4 + n], p.buf[at + 4] = 0, 0xFF
    rejects(p.bytes(), r"string at byte \d+ is not valid UTF-8")


def test_vector_length_checked_before_reading():
    change = lambda p: p.set_length(p.tensor(0, "w0"), "Tensor", "shape", 2**31)
    rejects(patched(mlp(), change), r"vector of 2147483648 elements at byte \d+ .* lies outside")


def test_vector_elements_aligned():
    def change(p):
        at = p.at(p.tensor(0, "w0"), "Tensor", "shape")
        struct.pack_into("<I", p.buf, at, struct.unpack_from("<I", p.buf, at)[0] + 4)
    rejects(patched(mlp(), change), r"elements at byte \d+ is not 8-byte aligned")


def test_offsets_point_forward():
    rejects(patched(mlp(), lambda p: p.set(p.model, "Model", "producer", "I", 0)),
            r"offset at byte \d+ points to itself")


def test_sharing_cannot_blow_up_the_walk():
    # 20,000 references to one 1,000-byte string: an 80 KB file whose naive walk
    # would decode 20 MB.
    b = flatbuffers.Builder(0)
    s = b.CreateString("x" * 1000)
    b.StartVector(4, 20_000, 4)
    for _ in range(20_000):
        b.PrependUOffsetTRelative(s)
    opcodes = b.EndVector()
    ModelTable.Start(b)
    ModelTable.AddVersion(b, 1)
    ModelTable.AddOpcodes(b, opcodes)
    b.FinishSizePrefixed(ModelTable.End(b), FILE_IDENTIFIER)
    rejects(bytes(b.Output()), r"overlap or are shared far more than a well-formed file")


def test_a_few_shared_objects_are_fine():
    b = flatbuffers.Builder(0)
    s = b.CreateString("relu")
    b.StartVector(4, 3, 4)
    for _ in range(3):
        b.PrependUOffsetTRelative(s)
    opcodes = b.EndVector()
    ModelTable.Start(b)
    ModelTable.AddVersion(b, 1)
    ModelTable.AddOpcodes(b, opcodes)
    b.FinishSizePrefixed(ModelTable.End(b), FILE_IDENTIFIER)
    assert reader.load(bytes(b.Output())).subgraphs == []


def test_verify_reports_the_layout():
    data = writer.to_bytes(mlp())
    found = verifier.verify(data)
    assert found.file_size == len(data) and found.flatbuffer_size < len(data)
    assert found.buffer_of[0] == [-1, 0, 1, -1, -1, -1, 2, 3, -1, -1, -1, -1]
    assert all(t.data is None for t in found.model.subgraphs[0].tensors)
    with pytest.raises(FormatError, match="expected a bytes-like object"):
        verifier.verify(12)


def test_non_contiguous_memoryview_is_refused():
    data = np.frombuffer(writer.to_bytes(mlp()), np.uint8)[::2]
    with pytest.raises(FormatError, match="not contiguous"):
        reader.load(memoryview(data))


def test_version_is_reported_before_layout_problems():
    def change(p):
        p.set(p.model, "Model", "version", "I", 2)
        p.set(p.model, "Model", "producer", "I", 0)  # a broken offset after the version
    rejects(patched(mlp(), change), r"format version 2 is not supported")
