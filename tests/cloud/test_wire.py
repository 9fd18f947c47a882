"""numpy <-> TensorChunk messages: exact round trips, and every malformed stream refused."""
import numpy as np
import pytest

from edgeflow import dtypes
from edgeflow.errors import InvalidInputError

from edgeflow.cloud import edgeflow_pb2 as pb
from edgeflow.cloud import wire


def roundtrip(arrays, chunk_bytes=wire.CHUNK_BYTES, **kw):
    tensors = wire.Assembler(**kw)
    messages = [c for name, a in arrays.items() for c in wire.chunks(name, a, chunk_bytes)]
    for m in messages:
        tensors.add(pb.TensorChunk.FromString(m.SerializeToString()))  # through the wire format
    return tensors.finish(), messages


@pytest.mark.parametrize("dtype", sorted(wire.DTYPES))
def test_every_dtype_round_trips_exactly(dtype):
    rng = np.random.default_rng(1)
    a = dtypes.array(rng.standard_normal((3, 5)) * 100, dtype)  # bfloat16: rounded, edgeflow's
    out, _ = roundtrip({"t": a}, chunk_bytes=7)  # chunks that split elements
    assert out["t"].dtype == a.dtype and out["t"].shape == (3, 5)
    np.testing.assert_array_equal(out["t"], a)


def test_chunking_scalars_empty_and_strided_arrays():
    a = np.arange(10_000, dtype=np.float64).reshape(100, 100)[::3, ::2]  # not contiguous
    arrays = {"a": a, "s": np.float32(2.5), "e": np.zeros((0, 4), np.int64),
              "big_endian": np.arange(6, dtype=">i4").reshape(2, 3)}
    out, messages = roundtrip(arrays, chunk_bytes=1000)
    for name, value in arrays.items():
        assert out[name].shape == np.shape(value)
        np.testing.assert_array_equal(out[name], value)
    a_chunks = [m for m in messages if m.name == "a"]
    assert len(a_chunks) == -(-a.nbytes // 1000)  # ceil: each chunk at most 1000 bytes
    assert [m.offset for m in a_chunks] == list(range(0, a.nbytes, 1000))
    assert sum(len(m.data) for m in a_chunks) == a.nbytes == a_chunks[0].total_bytes
    assert len([m for m in messages if m.name == "e"]) == 1  # no elements: one empty chunk
    assert out["big_endian"].dtype == np.dtype("<i4")


def test_bool_bytes_other_than_0_and_1_read_as_true():
    chunk = pb.TensorChunk(name="b", dtype="bool", shape=[4], total_bytes=4, data=bytes([0, 1, 2, 255]))
    tensors = wire.Assembler()
    tensors.add(chunk)
    np.testing.assert_array_equal(tensors.finish()["b"], [False, True, True, True])


def test_ml_dtypes_bfloat16_is_sent_as_edgeflows():
    import ml_dtypes
    a = wire.as_array(np.array([1.5, -2.0], ml_dtypes.bfloat16), "feed 'x'")
    assert a.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(dtypes.widen(roundtrip({"t": a})[0]["t"]), [1.5, -2.0])


def test_sending_an_unsupported_dtype_is_refused():
    with pytest.raises(InvalidInputError, match="complex128"):
        wire.as_array(np.zeros(2, complex), "feed 'x'")
    with pytest.raises(InvalidInputError, match="object"):
        wire.as_array(np.array([None]), "feed 'x'")


def first(name="x", dtype="float32", shape=(2,), total=8, data=b"\0" * 8, offset=0):
    return pb.TensorChunk(name=name, dtype=dtype, shape=shape, offset=offset, total_bytes=total, data=data)


BAD_STREAMS = {
    "no tensor name": ([first(name="")], "has no tensor name"),
    "unknown dtype": ([first(dtype="complex64")], "dtype 'complex64' is not one of"),
    "negative size": ([first(shape=(-2,))], "sizes >= 0"),
    "total_bytes lies": ([first(total=9)], "expected total_bytes 8"),
    "first chunk not at 0": ([first(offset=4, data=b"\0" * 4)], "at offset 0, got offset 4"),
    "gap between chunks": ([first(data=b"\0" * 4), pb.TensorChunk(name="x", offset=6, data=b"\0\0")],
                           "expected the chunk at offset 4, got one at offset 6"),
    "chunk past the end": ([first(data=b"\0" * 4), pb.TensorChunk(name="x", offset=4, data=b"\0" * 8)],
                           "runs past the tensor's 8 bytes"),
    "interleaved tensors": ([first(data=b"\0" * 4), first(name="y")], "'x' is incomplete: got 4 of 8"),
    "sent twice": ([first(), first()], "'x' was sent twice"),
    "stream ends early": ([first(data=b"\0" * 3)], "ended after 3 of its 8 bytes"),
}


@pytest.mark.parametrize("case", sorted(BAD_STREAMS))
def test_malformed_streams_are_refused_with_the_reason(case):
    messages, reason = BAD_STREAMS[case]
    tensors = wire.Assembler(what="feed")
    with pytest.raises(InvalidInputError, match=reason):
        for m in messages:
            tensors.add(m)
        tensors.finish()


def test_the_byte_cap_is_checked_before_allocating():
    tensors = wire.Assembler(max_bytes=100)
    tensors.add(first(name="a", shape=(10,), total=40, data=b"\0" * 40))
    huge = first(name="b", shape=(1 << 40, 1 << 20), total=(1 << 62), data=b"")
    with pytest.raises(wire.PayloadTooLarge, match="limit of 100 bytes"):
        tensors.add(huge)
    with pytest.raises(wire.PayloadTooLarge, match="104 bytes of tensors exceed the limit of 100"):
        tensors.add(first(name="c", shape=(16,), total=64, data=b""))


def test_expect_sees_each_tensor_header_once():
    seen = []
    tensors = wire.Assembler(expect=lambda *header: seen.append(header))
    for m in wire.chunks("x", np.zeros((3, 2), np.int16), chunk_bytes=4):
        tensors.add(m)
    assert seen == [("x", np.dtype(np.int16), (3, 2))]


def _encoded_roundtrip(a, encoding, chunk_bytes=wire.CHUNK_BYTES):
    tensors = wire.Assembler()
    messages = list(wire.chunks("t", a, chunk_bytes, encoding=encoding))
    for m in messages:
        tensors.add(pb.TensorChunk.FromString(m.SerializeToString()))
    return tensors.finish()["t"], sum(len(m.data) for m in messages)


@pytest.mark.parametrize("chunk_bytes", [5, wire.CHUNK_BYTES])
def test_compressed_float32_within_the_encodings_rounding(chunk_bytes):
    a = (np.random.default_rng(3).standard_normal((7, 33)) * 3).astype(np.float32)
    half, n = _encoded_roundtrip(a, "fp16", chunk_bytes)
    assert half.dtype == np.float32 and n == a.size * 2
    np.testing.assert_array_equal(half, a.astype(np.float16).astype(np.float32))
    q, n = _encoded_roundtrip(a, "int8", chunk_bytes)
    step = np.abs(a).max() / 127
    assert q.dtype == np.float32 and n == a.size
    assert np.max(np.abs(q - a)) <= step / 2 * (1 + 1e-5)  # half a quantization step at most
    zeros, _ = _encoded_roundtrip(np.zeros((2, 3), np.float32), "int8")
    np.testing.assert_array_equal(zeros, 0)


def test_other_dtypes_travel_raw_under_compression():
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    out, n = _encoded_roundtrip(a, "int8")
    np.testing.assert_array_equal(out, a)
    assert n == a.nbytes


def test_bad_encodings_are_refused():
    base = dict(name="t", dtype="float32", shape=[4], offset=0)
    for chunk, reason in [(pb.TensorChunk(**base, total_bytes=4, encoding="zip", data=bytes(4)), "encoding"),
                          (pb.TensorChunk(**base, total_bytes=4, encoding="int8", data=bytes(4)), "scale"),
                          (pb.TensorChunk(**base, total_bytes=16, encoding="fp16", data=bytes(16)), "total_bytes"),
                          (pb.TensorChunk(name="t", dtype="int32", shape=[1], offset=0, total_bytes=2,
                                          encoding="fp16", data=bytes(2)), "encoding")]:
        with pytest.raises(InvalidInputError, match=reason):
            wire.Assembler().add(chunk)
    with pytest.raises(InvalidInputError, match="compression"):
        wire.encoding_named("gzip")
