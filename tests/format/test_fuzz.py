"""Damaged files load cleanly or raise FormatError: never another exception.

About 11,000 truncations and mutations of valid files in CI (HYPOTHESIS_PROFILE=fuzz runs
25 times as many), aimed mostly at the FlatBuffer, where every byte is an offset, length,
index or code the verifier must check before use.
"""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeflow.errors import FormatError
from edgeflow.format import reader, writer

from .models import every_feature_model, mlp_model


def fuzz(weight):
    """A slow test running `weight` times the hypothesis profile's example count (dev 20,
    ci 200, fuzz 5000: tests/conftest.py)."""
    run = settings(max_examples=int(settings.default.max_examples * weight), deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    return lambda test: pytest.mark.slow(run(test))


class Seed(bytes):
    """A valid file, shown by name when hypothesis reports a failing example."""

    def __new__(cls, name, data):
        seed = super().__new__(cls, data)
        seed.name = name
        return seed

    def __repr__(self):
        return f"<{self.name}: {len(self)} bytes>"


@pytest.fixture(scope="module")
def seeds():
    return [Seed("every_feature_model", writer.to_bytes(every_feature_model())),
            Seed("mlp_model", writer.to_bytes(mlp_model()))]


def flatbuffer_end(seed):
    return 4 + int.from_bytes(seed[:4], "little")


def position(data, seed):
    """A byte position in the undamaged `seed`: half the time in its FlatBuffer."""
    return data.draw(st.one_of(st.integers(0, flatbuffer_end(seed) - 1),
                               st.integers(0, len(seed) - 1)))


def loads_cleanly_or_raises_format_error(damaged):
    try:
        model = reader.load(bytes(damaged))
    except FormatError:
        return
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            if tensor.data is not None:
                assert tensor.data.shape == tensor.shape
                tensor.data.tobytes()  # every view lies inside the buffer
    # What the reader accepts, the writer can write back.
    reader.load(writer.to_bytes(model))


@fuzz(7.5)
@given(data=st.data())
def test_truncations(seeds, data):
    seed = data.draw(st.sampled_from(seeds))
    cut = data.draw(st.one_of(st.integers(0, flatbuffer_end(seed)), st.integers(0, len(seed) - 1)))
    loads_cleanly_or_raises_format_error(seed[:cut])


@fuzz(15)
@given(data=st.data())
def test_single_byte_flips(seeds, data):
    seed = data.draw(st.sampled_from(seeds))
    damaged = bytearray(seed)
    damaged[position(data, seed)] ^= data.draw(st.integers(1, 255))
    loads_cleanly_or_raises_format_error(damaged)


@fuzz(12.5)
@given(data=st.data())
def test_multi_byte_flips(seeds, data):
    seed = data.draw(st.sampled_from(seeds))
    damaged = bytearray(seed)
    for _ in range(data.draw(st.integers(2, 12))):
        damaged[position(data, seed)] ^= data.draw(st.integers(1, 255))
    loads_cleanly_or_raises_format_error(damaged)


@fuzz(12.5)
@given(data=st.data())
def test_random_overwrites_in_the_flatbuffer(seeds, data):
    seed = data.draw(st.sampled_from(seeds))
    damaged = bytearray(seed)
    start = data.draw(st.integers(0, flatbuffer_end(seed) - 1))
    junk = data.draw(st.binary(min_size=1, max_size=48))
    damaged[start:start + len(junk)] = junk[:len(damaged) - start]
    loads_cleanly_or_raises_format_error(damaged)


def edge_values(width, end, size):
    """Values that probe bounds checks for a field `width` bytes wide."""
    top = 2**(8 * width)
    return st.sampled_from([0, 1, 2, 3, 4, 8, 0x7F, 0x80, 0xFF, end, size, top // 2 - 1,
                            top // 2, top - 4, top - 1]) | st.integers(0, top - 1)


@fuzz(7.5)
@given(data=st.data())
def test_fields_set_to_edge_values(seeds, data):
    # Aligned 2-byte (vtable entries), 4-byte (offsets, lengths, indices) and 8-byte
    # (dims, buffer offsets and sizes, attribute values) words.
    seed = data.draw(st.sampled_from(seeds))
    damaged = bytearray(seed)
    width = data.draw(st.sampled_from([2, 4, 8]))
    at = data.draw(st.integers(0, flatbuffer_end(seed) // width - 1)) * width
    value = data.draw(edge_values(width, flatbuffer_end(seed), len(seed)))
    damaged[at:at + width] = value.to_bytes(width, "little")
    loads_cleanly_or_raises_format_error(damaged)


def test_metadata_without_its_data_reads_as_empty_bytes():
    """A byte flip that empties a Metadata table's vtable entry for `data` (hypothesis
    found one) leaves the default: the reader gives empty bytes, which the writer takes."""
    from edgeflow.format.efl import Model
    from edgeflow.format.model import ModelDef, SubGraphDef
    model = writer.to_bytes(ModelDef(subgraphs=[SubGraphDef("g", [], [], [], [])], metadata={"k": b"v"}))
    fb = Model.Model.GetRootAs(model, 4)
    meta = fb.Metadata(0)
    vtable = meta._tab.Pos - int.from_bytes(model[meta._tab.Pos:meta._tab.Pos + 4], "little", signed=True)
    damaged = bytearray(model)
    data_slot = vtable + 4 + 2 * 1  # the vtable's entry for field 1 (data)
    damaged[data_slot:data_slot + 2] = b"\x00\x00"
    loaded = reader.load(bytes(damaged))
    assert loaded.metadata == {"k": b""}
    reader.load(writer.to_bytes(loaded))
