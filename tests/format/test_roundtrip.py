"""Writing then reading gives back the model: values, layout, zero-copy views."""
import mmap
import os

import numpy as np
import pytest

from edgeflow import dtypes, ops
from edgeflow.errors import FormatError, GraphError
from edgeflow.format import reader, writer
from edgeflow.format.efl.Model import Model
from edgeflow.format.model import (ALIGNMENT, ModelDef, OperatorDef, QuantizationDef,
                                   SubGraphDef, TensorDef)

from .models import every_feature_model, mlp_model, sample, tensor_index


def assert_same_model(got, want):
    assert (got.version, got.producer, got.description) == (want.version, want.producer,
                                                            want.description)
    assert got.metadata == want.metadata
    assert [(s.key, s.inputs, s.outputs, s.subgraph) for s in got.signatures] == \
        [(s.key, s.inputs, s.outputs, s.subgraph) for s in want.signatures]
    assert len(got.subgraphs) == len(want.subgraphs)
    for g, w in zip(got.subgraphs, want.subgraphs):
        assert (g.name, g.inputs, g.outputs) == (w.name, list(w.inputs), list(w.outputs))
        assert len(g.tensors) == len(w.tensors)
        for gt, wt in zip(g.tensors, w.tensors):
            assert_same_tensor(gt, wt)
        assert len(g.operators) == len(w.operators)
        for go, wo in zip(g.operators, w.operators):
            assert (go.opcode, go.inputs, go.outputs, go.placement) == \
                (wo.opcode, list(wo.inputs), list(wo.outputs), wo.placement)
            # Canonical values with defaults, as the op's own definition gives them.
            assert go.attrs == ops.get(wo.opcode).check_attrs(wo.attrs)


def assert_same_tensor(got, want):
    assert (got.name, got.dtype, got.shape, got.is_variable) == \
        (want.name, np.dtype(want.dtype), tuple(want.shape), want.is_variable)
    if want.data is None:
        assert got.data is None
    else:
        assert got.data.dtype == want.data.dtype and got.data.shape == want.data.shape
        np.testing.assert_array_equal(got.data, want.data, strict=True)
    if want.quantization is None:
        assert got.quantization is None
    else:
        q, wq = got.quantization, want.quantization
        np.testing.assert_array_equal(q.scale, np.float32(wq.scale))  # stored as float32
        assert (q.zero_point, q.axis) == (tuple(wq.zero_point), wq.axis)


@pytest.fixture(params=["bytes", "bytearray", "memoryview", "path", "pathlike"])
def load_via(request, tmp_path):
    """Writes a model and loads it through one kind of source."""
    def via(model):
        if request.param in ("path", "pathlike"):
            path = tmp_path / "model.efl"
            writer.write(model, path)
            return reader.load(str(path) if request.param == "path" else path)
        data = writer.to_bytes(model)
        return reader.load({"bytes": data, "bytearray": bytearray(data),
                            "memoryview": memoryview(data)}[request.param])
    return via


def test_every_feature_round_trips(load_via):
    model = every_feature_model()
    assert_same_model(load_via(model), model)


def test_mlp_round_trips(load_via):
    model = mlp_model((5, 7, 3, 2))
    assert_same_model(load_via(model), model)


@pytest.mark.parametrize("dtype", dtypes.ALL, ids=dtypes.name)
@pytest.mark.parametrize("shape", [(), (1,), (0,), (3, 0, 2), (5, 3), (2, 1, 3, 1, 2, 1, 1, 2)])
def test_every_dtype_and_shape_round_trips(dtype, shape):
    data = sample(dtype, shape, np.random.default_rng(1))
    model = ModelDef([SubGraphDef("g", [TensorDef("c", dtype, shape, data)], [], [], [0])])
    got = reader.load(writer.to_bytes(model)).subgraphs[0].tensors[0].data
    assert got.dtype == dtype and got.shape == shape
    np.testing.assert_array_equal(got, data, strict=True)


def test_empty_model_round_trips():
    model = ModelDef(subgraphs=[], producer="", description="")
    assert_same_model(reader.load(writer.to_bytes(model)), model)


def test_non_contiguous_and_big_endian_arrays_are_written_by_value():
    rng = np.random.default_rng(2)
    fortran = np.asfortranarray(sample("float32", (3, 5), rng))
    strided = sample("int16", (8, 6), rng)[::2, ::3]
    big = sample("float64", (4,), rng).astype(">f8")
    tensors = [TensorDef("f", dtypes.float32, (3, 5), fortran),
               TensorDef("s", dtypes.int16, (4, 2), strided),
               TensorDef("b", dtypes.float64, (4,), big)]
    got = reader.load(writer.to_bytes(ModelDef([SubGraphDef("g", tensors, [], [], [])])))
    for t, want in zip(got.subgraphs[0].tensors, (fortran, strided, big)):
        np.testing.assert_array_equal(t.data, want)
        assert t.data.dtype == want.dtype.newbyteorder("=")


def buffer_extents(data):
    """(offset, size) of every buffer, read with the generated accessors."""
    model = Model.GetRootAs(data, 4)
    return [(model.Buffers(k).Offset(), model.Buffers(k).Size())
            for k in range(model.BuffersLength())]


def test_every_buffer_is_aligned_after_the_flatbuffer_and_inside_the_file():
    data = writer.to_bytes(every_feature_model())
    extents = buffer_extents(data)
    fb_end = 4 + int.from_bytes(data[:4], "little")
    assert extents and len(data) % ALIGNMENT == 0
    for offset, size in extents:
        assert offset % ALIGNMENT == 0 and offset >= fb_end and offset + size <= len(data)


def test_mapped_views_are_aligned_in_memory(tmp_path):
    path = tmp_path / "m.efl"
    writer.write(every_feature_model(), path)
    for t in reader.load(path).subgraphs[0].tensors:
        if t.data is not None and t.data.size:
            assert t.data.ctypes.data % ALIGNMENT == 0  # mmap starts page-aligned


def constants(model):
    return [t.data for sg in model.subgraphs for t in sg.tensors if t.data is not None]


def root_of(array):
    """The object at the end of a view's `.base` chain (through memoryviews too)."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def test_path_views_are_read_only_views_of_the_mapping(tmp_path):
    path = tmp_path / "m.efl"
    writer.write(every_feature_model(), path)
    arrays = [a for a in constants(reader.load(path)) if a.size]
    mapping = root_of(arrays[0])
    assert isinstance(mapping, mmap.mmap)
    whole = np.frombuffer(mapping, np.uint8)
    for a in arrays:
        assert not a.flags.writeable and not a.flags.owndata
        assert root_of(a) is mapping and np.shares_memory(a, whole)
        with pytest.raises(ValueError):
            a.flat[0] = a.flat[0]


@pytest.mark.parametrize("kind", [bytes, bytearray])
def test_bytes_views_are_read_only_views_of_the_source(kind):
    source = kind(writer.to_bytes(every_feature_model()))
    whole = np.frombuffer(source, np.uint8)
    for a in constants(reader.load(source)):
        assert not a.flags.writeable
        assert a.size == 0 or np.shares_memory(a, whole)


def test_mapping_outlives_the_model_while_a_view_is_held(tmp_path):
    path = tmp_path / "m.efl"
    model = mlp_model()
    writer.write(model, path)
    weights = reader.load(path).subgraphs[0].tensors[1].data  # the model itself is dropped
    np.testing.assert_array_equal(weights, model.subgraphs[0].tensors[1].data)


def test_one_array_used_twice_is_stored_once_and_read_back_shared():
    model = every_feature_model()
    sg = model.subgraphs[0]
    data_of = lambda g, name: g.tensors[tensor_index(g, name)].data  # noqa: E731
    assert data_of(sg, "shared_a") is data_of(sg, "shared_b")
    data = writer.to_bytes(model)
    distinct = {id(a): a.nbytes for a in constants(model)}
    assert reader.file_info(data).num_buffers == len(distinct) == len(buffer_extents(data))
    got = reader.load(data).subgraphs[0]
    assert data_of(got, "shared_a") is data_of(got, "shared_b")


def test_file_info_reports_sizes(tmp_path):
    model = every_feature_model()
    path = tmp_path / "m.efl"
    writer.write(model, path)
    info = reader.file_info(path)
    assert info.file_bytes == os.path.getsize(path)
    assert info.weight_bytes == sum({id(a): a.nbytes for a in constants(model)}.values())
    assert info.flatbuffer_bytes == 4 + int.from_bytes(path.read_bytes()[:4], "little")
    assert info.flatbuffer_bytes + info.weight_bytes <= info.file_bytes


def test_output_is_deterministic_and_write_matches_to_bytes(tmp_path):
    data = writer.to_bytes(every_feature_model())
    assert writer.to_bytes(every_feature_model()) == data
    writer.write(every_feature_model(), tmp_path / "m.efl")
    assert (tmp_path / "m.efl").read_bytes() == data


def test_write_replaces_atomically_and_leaves_no_temporary_files(tmp_path, monkeypatch):
    path = tmp_path / "m.efl"
    writer.write(mlp_model(seed=1), path)
    writer.write(mlp_model(seed=2), path)  # replaces
    assert sorted(os.listdir(tmp_path)) == ["m.efl"]
    before = path.read_bytes()
    assert before == writer.to_bytes(mlp_model(seed=2))

    def crash_midway(plan, f):
        f.write(plan.flatbuffer[:10])
        raise OSError("disk full")
    monkeypatch.setattr(writer, "_stream", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        writer.write(mlp_model(seed=3), path)
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["m.efl"]


def test_invalid_model_fails_before_touching_the_file(tmp_path):
    path = tmp_path / "m.efl"
    writer.write(mlp_model(), path)
    before = path.read_bytes()
    bad = mlp_model()
    bad.subgraphs[0].operators[0].inputs = [0, 99]
    with pytest.raises(GraphError, match="tensor 99 out of range"):
        writer.write(bad, path)
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["m.efl"]


def test_empty_file_directory_and_missing_path(tmp_path):
    (tmp_path / "empty.efl").write_bytes(b"")
    with pytest.raises(FormatError, match="empty file"):
        reader.load(tmp_path / "empty.efl")
    with pytest.raises(FormatError, match="not a regular file"):
        reader.load(tmp_path)
    with pytest.raises(FileNotFoundError):
        reader.load(tmp_path / "missing.efl")
    with pytest.raises(FormatError, match="too short"):
        reader.load(b"")


def _sparse_files_work(directory):
    probe = directory / "probe"
    try:
        with open(probe, "wb") as f:
            f.seek(5 * 2**30)
            f.write(b"\0")
        return os.stat(probe).st_blocks * 512 < 2**20
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)


def test_buffers_past_the_4_gib_mark(tmp_path):
    if not _sparse_files_work(tmp_path):
        pytest.skip("this filesystem does not keep sparse files sparse")
    rng = np.random.default_rng(3)
    tensors = [TensorDef("a", dtypes.float32, (16, 16), sample("float32", (16, 16), rng)),
               TensorDef("b", dtypes.int64, (5,), sample("int64", (5,), rng))]
    model = ModelDef([SubGraphDef("g", tensors, [], [], [0, 1])])
    past_4_gib = 2**32 + 7 * ALIGNMENT
    plan = writer._plan(model, data_start=past_4_gib)  # the weights start past the mark
    path = tmp_path / "big.efl"
    with open(path, "wb") as f:
        writer._stream(plan, f)
    assert os.path.getsize(path) > 2**32
    with open(path, "rb") as f:
        head = f.read(len(plan.flatbuffer))  # not the whole sparse file
    assert buffer_extents(head)[0][0] == past_4_gib
    got = reader.load(path)
    for t, want in zip(got.subgraphs[0].tensors, tensors):
        np.testing.assert_array_equal(t.data, want.data, strict=True)
    assert reader.file_info(path).file_bytes == os.path.getsize(path)


def _model_with(**change):
    """A one-op model (x -> relu -> y, plus a constant) with one part changed."""
    tensors = [TensorDef("x", dtypes.float32, (2,)), TensorDef("y", dtypes.float32, (2,)),
               TensorDef("c", dtypes.float32, (2,), np.ones(2, np.float32))]
    op = OperatorDef("relu", [0], [1])
    for key, value in change.items():
        on_op = key in ("opcode", "inputs", "outputs", "attrs", "placement")
        setattr(op if on_op else tensors[2], key, value)
    return ModelDef([SubGraphDef("g", tensors, [op], [0], [1])])


@pytest.mark.parametrize("change, message", [
    (dict(opcode="no_such_op"), r"operator 0 'no_such_op': unknown op"),
    (dict(opcode="cast"), r"cast: attribute 'dtype' \(DTYPE\) is required"),
    (dict(opcode="softmax", attrs={"axis": 1.5}), r"attribute 'axis' must be INT"),
    (dict(opcode="softmax", attrs={"axes": 1}), r"unknown attribute"),
    (dict(opcode="reshape", attrs={"shape": (2**63,)}), r"attribute 'shape'.* fit int64"),
    (dict(inputs=[0, 0]), r"relu takes 1 inputs, got 2"),
    (dict(outputs=[1, 2]), r"relu has 1 outputs, the file lists 2"),
    (dict(inputs=[5]), r"operator 0 'relu': inputs: tensor 5 out of range"),
    (dict(inputs=["x"]), r"inputs: expected ints"),
    (dict(placement="moon"), r"placement 'moon' is not one of"),
    (dict(data=[1.0, 2.0]), r"tensor 2 'c': data must be a numpy array"),
    (dict(data=np.ones(2, np.float64)), r"data has dtype float64, the tensor float32"),
    (dict(data=np.ones((1, 2), np.float32)), r"data has shape \(1, 2\), the tensor \(2,\)"),
    (dict(dtype=np.complex64, data=None), r"dtype complex64 is not supported"),
    (dict(shape=(2, 2**63), data=None), r"shape: expected ints that fit int64"),
    (dict(shape=(-2,), data=None), r"shape \(-2,\) has a dimension below -1"),
    (dict(name=7), r"expected a str, got 7"),
    (dict(quantization=QuantizationDef((0.1, 0.2), (0, 0))), r"2 scales, expected 1"),
])
def test_writer_rejects_malformed_models_with_a_clear_error(change, message):
    with pytest.raises(GraphError, match=message):
        writer.to_bytes(_model_with(**change))


def test_writer_rejects_other_versions_and_bad_metadata():
    with pytest.raises(GraphError, match="format version 1, not 2"):
        writer.to_bytes(ModelDef([], version=2))
    with pytest.raises(GraphError, match="metadata: 'k': value must be bytes"):
        writer.to_bytes(ModelDef([], metadata={"k": 5}))
