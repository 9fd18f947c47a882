"""converters.tflite against LiteRT (the TFLite runtime) on the fixtures of tests/data/tflite
(written by make_fixtures.py there): float within 1e-5 relative, quantized within one
quantization step; signatures, storage, layouts, and malformed files."""
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import edgeflow as ef
from ai_edge_litert.interpreter import Interpreter as LiteRT
from edgeflow.converters import tflite as tflite_converter
from edgeflow.converters.tflite import reader
from edgeflow.converters.tflite.context import densify
from edgeflow.errors import ConversionError, UnsupportedOpError

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "tflite"
RUNNABLE = ("conv_float", "conv_dilated", "transpose_conv", "slicing", "batch_matmul_sig", "int8_conv",
            "int8_io", "uint8_fc", "fp16_weights", "external_buffers", "while_loop", "global_pool")


def _inputs(details, rng, scale=1.0):
    feeds = {}
    for name, d in details.items():
        dtype = np.dtype(d["dtype"])
        if dtype.kind == "f":
            feeds[name] = (rng.standard_normal(d["shape"]) * scale).astype(dtype)
        else:
            info = np.iinfo(dtype)
            feeds[name] = rng.integers(info.min, info.max, d["shape"], endpoint=True).astype(dtype)
    return feeds


def _step(model, name, key):
    """The quantization step of the tensor that signature output `name` reads: its own
    scale, or (a DEQUANTIZE at the end) its input's; None if float all along."""
    sig = next((s for s in model.signatures if s.key == key), None)
    sg = model.subgraphs[sig.subgraph if sig else 0]
    index = sig.outputs[name] if sig else next(i for i in sg.outputs if sg.tensors[i].name == name)
    q = sg.tensors[index].quantization
    if q is None:
        producer = next((op for op in sg.operators if index in op.outputs), None)
        if producer is not None and producer.opcode == "DEQUANTIZE":
            q = sg.tensors[producer.inputs[0]].quantization
    return None if q is None else float(np.max(q.scale))


def _compare(name, tmp_path, scales=(1.0,), seeds=(0, 1)):
    path = DATA / f"{name}.tflite"
    efl = tmp_path / f"{name}.efl"
    tflite_converter.convert(path, efl)
    model = reader.read(path)
    ours = ef.Interpreter(efl)
    litert = LiteRT(model_path=str(path), num_threads=1)
    keys = list(litert.get_signature_list()) or [None]
    assert sorted(ours.get_signature_list()) == sorted(k or "infer" for k in keys)
    checked = 0
    for key in keys:
        runner = litert.get_signature_runner(key) if key else None
        for seed in seeds:
            for scale in scales:
                rng = np.random.default_rng(seed)
                if runner is not None:
                    feeds = _inputs(runner.get_input_details(), rng, scale)
                    expected = runner(**feeds)
                else:
                    litert.allocate_tensors()
                    details = {d["name"]: d for d in litert.get_input_details()}
                    feeds = _inputs(details, rng, scale)
                    for n, d in details.items():
                        litert.set_tensor(d["index"], feeds[n])
                    litert.invoke()
                    expected = {d["name"]: litert.get_tensor(d["index"]) for d in litert.get_output_details()}
                got = ours.get_signature_runner(key or "infer")(**feeds)
                assert sorted(got) == sorted(expected)
                for out, want in expected.items():
                    have = got[out]
                    assert have.dtype == want.dtype and have.shape == want.shape, out
                    step = _step(model, out, key)
                    if want.dtype.kind in "iu" and step is not None:  # quantized: one step
                        assert np.max(np.abs(have.astype(np.int64) - want.astype(np.int64)), initial=0) <= 1, out
                    elif step is not None:  # dequantized at the end: one step of its grid
                        np.testing.assert_allclose(have, want, rtol=0, atol=step * 1.001, err_msg=out)
                    elif want.dtype.kind == "f":
                        peak = float(np.max(np.abs(want), initial=0))
                        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5 * peak, err_msg=out)
                    else:
                        np.testing.assert_array_equal(have, want, err_msg=out)
                    checked += 1
    return checked


@pytest.mark.parametrize("name", RUNNABLE)
def test_fixture_agrees_with_litert(name, tmp_path):
    scales = (0.05, 1.0, 4.0) if name == "while_loop" else (1.0,)  # loops of several lengths
    assert _compare(name, tmp_path, scales) > 0


def test_signature_defs_keep_their_keys_and_names(tmp_path):
    tflite_converter.convert(DATA / "batch_matmul_sig.tflite", tmp_path / "m.efl")
    interp = ef.Interpreter(tmp_path / "m.efl")
    runner = interp.get_signature_runner("serving_default")
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 10
    b = np.ones((2, 5, 4), np.float32)
    out = runner(a=a, b=b)
    assert list(out) == ["scores"] and out["scores"].shape == (2, 3, 5)
    details = interp.get_signature_list()
    assert details["serving_default"] == {"inputs": ["a", "b"], "outputs": ["scores"]}
    assert "double" in details
    model = reader.read(DATA / "batch_matmul_sig.tflite")
    assert model.metadata["min_runtime_version"].rstrip(b"\0") == b"1.5.0"
    # dynamic batch: shape_signature [-1, ...] stays dynamic
    assert runner(a=np.concatenate([a, a]), b=np.concatenate([b, b]))["scores"].shape == (4, 3, 5)


def test_a_model_without_signature_defs_gets_infer_named_by_its_tensors(tmp_path):
    model = reader.read(DATA / "conv_float.tflite")
    sg = model.subgraphs[0]
    tflite_converter.convert(DATA / "conv_float.tflite", tmp_path / "m.efl")
    assert ef.Interpreter(tmp_path / "m.efl").get_signature_list() == {
        "infer": {"inputs": [sg.tensors[i].name for i in sg.inputs], "outputs": [sg.tensors[i].name for i in sg.outputs]}}


def test_buffers_past_the_flatbuffer_are_read_and_bounded():
    """external_buffers.tflite keeps every weight past the FlatBuffer (Buffer.offset/size,
    as TFLite writes models over 2 GB; it agrees with LiteRT above). Cut short, it names
    the buffer that runs past the end."""
    raw = (DATA / "external_buffers.tflite").read_bytes()
    model = reader.read(raw)
    weights = [t for t in model.subgraphs[0].tensors if t.data is not None]
    assert weights and all(t.data.base is not None for t in weights)  # views of the file, not copies
    with pytest.raises(ConversionError, match="runs past the end"):
        reader.read(raw[:-16])


def test_quantized_weights_stay_integers_and_float16_ones_float16(tmp_path):
    result = tflite_converter.convert(DATA / "int8_conv.tflite", tmp_path / "q.efl")
    stored = [t for t in result.model.subgraphs[0].tensors if t.data is not None]
    int8 = [t for t in stored if t.dtype == np.int8 and t.data.size > 1]  # weights, not zero points
    assert int8 and all(t.quantization is not None for t in int8)
    per_channel = [t for t in int8 if len(t.quantization.scale) > 1]
    assert per_channel  # conv weights: one scale per output channel, along edgeflow's axis 0
    assert all(t.quantization.axis == 0 and len(t.quantization.scale) == t.shape[0] for t in per_channel)
    assert not [t for t in stored if t.dtype == np.float32 and t.data.size >= 64]

    fp16 = tflite_converter.convert(DATA / "fp16_weights.tflite", tmp_path / "h.efl")
    halves = [t for t in fp16.model.subgraphs[0].tensors if t.data is not None and t.dtype == np.float16]
    assert halves and fp16.model.metadata["quantization"] == b"fp16"


def test_convolutions_chain_in_nchw_without_a_transpose_per_op(tmp_path):
    result = tflite_converter.convert(DATA / "conv_float.tflite", tmp_path / "m.efl")
    assert result.ops["conv"] == 3
    # one transpose into NCHW at the input and one back before the RESHAPE: none per op
    assert result.ops["transpose"] == 2


def test_a_pool_over_the_whole_image_is_a_reduction(tmp_path):
    """Keras writes global pooling as a window the size of the image; as a pool it would
    make a tap per pixel (seconds to plan a 128x128 one)."""
    result = tflite_converter.convert(DATA / "global_pool.tflite", tmp_path / "m.efl")
    assert result.ops["reduce_mean"] == 1 and result.ops["reduce_max"] == 1
    assert "avg_pool" not in result.ops and "max_pool" not in result.ops


def test_a_custom_op_is_reported_with_its_name_and_node():
    with pytest.raises(UnsupportedOpError) as info:
        tflite_converter.convert(DATA / "custom_op.tflite")
    assert "CUSTOM:MyCustomOp" in str(info.value) and "custom op" in str(info.value)
    assert [(op, name) for op, _, name, _ in info.value.ops] == [("CUSTOM:MyCustomOp", "custom")]


def test_mediapipe_landmark_ops_match_their_kernels(tmp_path):
    """MediaPipe's three landmark custom ops (version 2), which LiteRT cannot run: against
    MediaPipe's kernels written again as loops, on a conv's NHWC output, with landmarks
    placed so the crop falls partly inside the feature map."""
    from tests.ops import mediapipe_reference as mp
    path = DATA / "mediapipe_landmarks.tflite"
    tflite_converter.convert(path, tmp_path / "m.efl")
    runner = ef.Interpreter(tmp_path / "m.efl").get_signature_runner("infer")
    sg = reader.read(path).subgraphs[0]
    w, b = (next(t.data for t in sg.tensors if t.name == name) for name in ("conv/w", "conv/b"))
    for seed in range(4):
        rng = np.random.default_rng(seed)
        feeds = {"features": rng.standard_normal((1, 6, 7, 3)).astype(np.float32),
                 "mesh": rng.uniform(-1, 8, (1, 12, 3)).astype(np.float32),
                 "points": rng.uniform(-2, 6, (1, 5, 2)).astype(np.float32)}
        got = runner(**feeds)
        matrix = mp.landmarks_to_transform_matrix(feeds["mesh"][0], 1, 4, (0, 2, 3, 5, 7, 9, 11), (4, 5),
                                                  (1.25, 1.5), 0.3)
        conv = np.einsum("hwc,mc->hwm", feeds["features"][0], w.reshape(4, 3)) + b
        np.testing.assert_allclose(got["matrix"][0], matrix, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(got["crop"][0], mp.transform_tensor_bilinear(conv, got["matrix"][0], (4, 5)),
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["points_back"][0], mp.transform_landmarks(feeds["points"][0], got["matrix"][0]),
                                   rtol=1e-5, atol=1e-5)
        assert got["crop"].shape == (1, 4, 5, 4) and got["crop"].any()


def test_an_operator_code_without_its_deprecated_field_is_read_as_tflite_reads_it(tmp_path):
    """TFLite takes max(builtin_code, deprecated_builtin_code); the binding's BuiltinCode()
    gives the deprecated field (0, ADD, where a writer zeroed or left it out, as
    ai-edge-quantizer does) for codes under 127. fp16_weights' DEQUANTIZE with its
    deprecated code zeroed: LiteRT still runs it as DEQUANTIZE, and so must the converter."""
    from tflite.Model import Model
    data = bytearray((DATA / "fp16_weights.tflite").read_bytes())
    root = Model.GetRootAsModel(data, 0)
    code = next(root.OperatorCodes(k) for k in range(root.OperatorCodesLength())
                if root.OperatorCodes(k).BuiltinCode() == 6)  # DEQUANTIZE
    at = code._tab.Pos + code._tab.Offset(4)  # OperatorCode.deprecated_builtin_code (field 0, int8)
    data[at] = 0
    path = tmp_path / "zeroed.tflite"
    path.write_bytes(bytes(data))
    assert [op.opcode for op in reader.read(path).subgraphs[0].operators].count("DEQUANTIZE") > 0
    tflite_converter.convert(path, tmp_path / "m.efl")
    litert = LiteRT(model_path=str(path))
    litert.allocate_tensors()
    (d,) = litert.get_input_details()
    x = np.random.default_rng(2).standard_normal(d["shape"]).astype(np.float32)
    litert.set_tensor(d["index"], x)
    litert.invoke()
    want = litert.get_tensor(litert.get_output_details()[0]["index"])
    got = next(iter(ef.Interpreter(tmp_path / "m.efl").get_signature_runner("infer")(**{d["name"]: x}).values()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_a_landmark_op_of_another_version_is_reported(tmp_path):
    """Version 1 of TransformLandmarks has other semantics (rank 4, a scale): named, not guessed."""
    data = bytearray((DATA / "mediapipe_landmarks.tflite").read_bytes())
    model = reader.read(bytes(data))
    assert any(op.opcode == "CUSTOM:TransformLandmarks" and op.version == 2 for op in model.subgraphs[0].operators)
    from tflite.Model import Model
    root = Model.GetRootAsModel(data, 0)
    code = next(root.OperatorCodes(k) for k in range(root.OperatorCodesLength())
                if root.OperatorCodes(k).CustomCode() == b"TransformLandmarks")
    at = code._tab.Pos + code._tab.Offset(8)  # OperatorCode.version (field 2)
    data[at:at + 4] = np.int32(1).tobytes()
    with pytest.raises(UnsupportedOpError, match="version 1"):
        tflite_converter.convert(bytes(data), tmp_path / "m.efl")


@pytest.mark.parametrize("block", [False, True])
def test_densify_matches_the_dense_tensor(block):
    """TFLite's sparse encoding (CSR, and 2x2 blocks as MediaPipe's sparse models use),
    encoded here by brute force from a dense matrix, decodes to that matrix."""
    rng = np.random.default_rng(3)
    dense = (rng.standard_normal((6, 8)) * (rng.random((6, 8)) < 0.3)).astype(np.float32)
    if not block:
        segments, indices, values = [0], [], []
        for row in dense:
            nz = np.flatnonzero(row)
            indices += nz.tolist()
            values += row[nz].tolist()
            segments.append(len(indices))
        sparsity = {"traversal_order": [0, 1], "block_map": [],
                    "dims": [("dense", 6), ("csr", np.array(segments), np.array(indices))]}
    else:
        segments, indices, values = [0], [], []
        for br in range(3):
            for bc in range(4):
                tile = dense[2 * br:2 * br + 2, 2 * bc:2 * bc + 2]
                if tile.any():
                    indices.append(bc)
                    values += tile.reshape(-1).tolist()
            segments.append(len(indices))
        sparsity = {"traversal_order": [0, 1, 2, 3], "block_map": [0, 1],
                    "dims": [("dense", 3), ("csr", np.array(segments), np.array(indices)), ("dense", 2),
                             ("dense", 2)]}
    t = reader.Tensor("w", np.dtype(np.float32), (6, 8), np.asarray(values, np.float32).view(np.uint8),
                      sparsity=sparsity)
    np.testing.assert_array_equal(densify(t), dense)


def test_corrupt_sparsity_is_a_conversion_error():
    t = reader.Tensor("w", np.dtype(np.float32), (2, 2), np.zeros(2, np.float32).view(np.uint8),
                      sparsity={"traversal_order": [0, 1], "block_map": [],
                                "dims": [("dense", 2), ("csr", np.array([0, 1, 9]), np.array([0]))]})
    with pytest.raises(ConversionError, match="sparse"):
        densify(t)


def _mutants(data, rng, count):
    """Truncations, and copies with a few bytes overwritten (some with extreme values)."""
    for _ in range(count // 4):
        yield data[:int(rng.integers(0, len(data)))]
    for _ in range(count - count // 4):
        mutant = bytearray(data)
        for _ in range(int(rng.integers(1, 6))):
            at = int(rng.integers(8, len(data)))
            mutant[at] = int(rng.choice([0, 1, 0x7F, 0x80, 0xFF, int(rng.integers(0, 256))]))
        yield bytes(mutant)


@pytest.mark.parametrize("name", ["conv_float", "int8_conv", "slicing", "while_loop", "batch_matmul_sig",
                                  "mediapipe_landmarks"])
def test_hostile_files_give_a_clear_error_never_a_crash(name, tmp_path):
    """Every mutant either converts (and then loads and runs, or is refused with an edgeflow
    error: a tensor past the interpreter's max_tensor_bytes when loaded, an input it cannot
    take when run) or fails with ConversionError / UnsupportedOpError."""
    data = (DATA / f"{name}.tflite").read_bytes()
    rng = np.random.default_rng(7)
    converted = 0
    for k, mutant in enumerate(_mutants(data, rng, 120)):
        try:
            result = tflite_converter.convert(mutant, tmp_path / "m.efl")
        except (ConversionError, UnsupportedOpError) as e:
            assert str(e)
            continue
        converted += 1
        try:
            interp = ef.Interpreter(tmp_path / "m.efl")
        except ef.errors.EdgeflowError:  # a size the converter keeps, the loader's limit refuses
            continue
        for key in [s.key for s in result.model.signatures]:
            runner = interp.get_signature_runner(key)
            feeds = {n: np.zeros([1 if d is None or d < 0 else d for d in spec["shape"]], spec["dtype"])
                     for n, spec in runner.get_input_details().items()}
            try:
                runner(**feeds)
            except ef.errors.EdgeflowError:
                pass
    assert converted < 120  # the mutants were not all harmless


def test_not_a_tflite_file():
    with pytest.raises(ConversionError, match="TFL3"):
        tflite_converter.convert(b"\0" * 64)


def edgeflow(*args):
    return subprocess.run([sys.executable, "-m", "edgeflow", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_cli_converts_inspects_and_runs_a_tflite_model(tmp_path):
    out = tmp_path / "m.efl"
    done = edgeflow("convert", DATA / "int8_conv.tflite", "-o", out)
    assert done.returncode == 0, done.stderr
    assert "TFLite ops" in done.stdout and "CONV_2D" in done.stdout and "(.tflite)" in done.stdout
    assert edgeflow("inspect", out).returncode == 0
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((1, 12, 12, 3)).astype(np.float32))
    ran = edgeflow("run", out, "-i", f"input={tmp_path / 'x.npy'}")
    assert ran.returncode == 0, ran.stderr
    refused = edgeflow("convert", DATA / "custom_op.tflite", "-o", tmp_path / "c.efl")
    assert refused.returncode != 0 and "MyCustomOp" in refused.stderr
