"""Verified allocations (issue 16, finding 6): every size a plan would allocate is
computed exactly and bounded by `Interpreter(max_tensor_bytes=...)` before anything is
allocated; past it, FormatError where the file fixes the size, InvalidInputError where
the inputs make it; files the interpreter cannot run are FormatErrors at load.

Each model here asked main's interpreter for gigabytes to exbibytes (or wrapped an int64
size to 0): run under `ulimit -v` there, they raised MemoryError or ValueError.
"""
import numpy as np
import pytest

import edgeflow as ef
from edgeflow import dtypes
from edgeflow.errors import FormatError, InvalidInputError
from edgeflow.format import writer
from edgeflow.format.model import ModelDef, OperatorDef, SignatureDef, SubGraphDef, TensorDef
from edgeflow.interp import arena


def model(tensors, operators, inputs, outputs, signatures=None):
    """A one-subgraph model's bytes; tensors are (name, dtype, shape[, data])."""
    defs = [TensorDef(t[0], np.dtype(t[1]), tuple(t[2]), *t[3:]) for t in tensors]
    names = {t.name: k for k, t in enumerate(defs)}
    ops = [OperatorDef(op, [names[n] for n in ins], [names[n] for n in outs], attrs)
           for op, ins, outs, attrs in operators]
    sub = SubGraphDef("g", defs, ops, [names[n] for n in inputs], [names[n] for n in outputs])
    if signatures is None:
        signatures = [SignatureDef("infer", {n: names[n] for n in inputs}, {n: names[n] for n in outputs})]
    return writer.to_bytes(ModelDef([sub], signatures))


def const(name, values, dtype="int64"):
    a = np.asarray(values, dtype)
    return (name, dtype, a.shape, a)


def one_op(op, x_shape, operands=(), attrs=None, y_rank=None, x_dtype="float32"):
    """y = op(x, *operands): x an input of static `x_shape`, y declared with unknown dims."""
    tensors = [("x", x_dtype, x_shape), *operands, ("y", x_dtype, (-1,) * (y_rank or len(x_shape)))]
    return model(tensors, [(op, ["x", *[o[0] for o in operands]], ["y"], attrs or {})], ["x"], ["y"])


def run(data, **inputs):
    interp = ef.Interpreter(data)
    runner = interp.get_signature_runner("infer")
    details = runner.get_input_details()
    feeds = {n: np.zeros(d["shape"], d["dtype"]) for n, d in details.items()}
    feeds.update(inputs)
    return runner(**feeds)


# Sizes the file fixes: FormatError, naming the op and the tensor.
FIXED = {
    "resize scales 1e4": one_op("resize", (1, 1, 8, 8), attrs={"scales": (1.0, 1.0, 1e4, 1e4)}),
    "resize sizes 2**20": one_op("resize", (1, 1, 8, 8), attrs={"sizes": (1, 1, 2**20, 2**20)}),
    "pad 2**18": one_op("pad", (1, 1, 8, 8), attrs={"pads": (0, 0, 2**18, 2**18, 0, 0, 2**18, 2**18)}),
    "tile 2**30": one_op("tile", (4, 4), [const("repeats", [2**30, 2**30])]),
    "expand [2**16, 2**16, 64]": one_op("expand", (1,), [const("shape", [2**16, 2**16, 64])], y_rank=3),
    "expand [2**32, 2**32] (an int64 product wraps to 0)": one_op(
        "expand", (1,), [const("shape", [2**32, 2**32])], y_rank=2),
}


@pytest.mark.parametrize("name", FIXED)
def test_sizes_the_file_fixes_are_format_errors_naming_the_op(name):
    with pytest.raises(FormatError, match=r"op 0 \((resize|pad|tile|expand)\) output 'y'.*max_tensor_bytes"):
        run(FIXED[name])


def folded(op, operands, out_dtype, rank):
    tensors = [*operands, ("y", out_dtype, (-1,) * rank)]
    return model(tensors, [(op, [o[0] for o in operands], ["y"], {})], [], ["y"])


@pytest.mark.parametrize("data", [
    folded("constant_of_shape", [const("shape", [2**20, 2**20])], "float32", 2),
    folded("range", [const("start", 0), const("limit", 2**40), const("delta", 1)], "int64", 1),
], ids=["constant_of_shape [2**20, 2**20]", "range to 2**40"])
def test_folded_constants_are_bounded_before_they_are_computed(data):
    with pytest.raises(FormatError, match=r"op 0 \((constant_of_shape|range)\) output 'y'.*TiB"):
        run(data)


def test_an_input_declared_too_large_is_refused_at_load():
    data = model([("x", "float32", (2**30, 2**30)), ("y", "float32", (2**30, 2**30))],
                 [("relu", ["x"], ["y"], {})], ["x"], ["y"])
    with pytest.raises(FormatError, match=r"tensor 0 'x': shape \(1073741824, 1073741824\).*max_tensor_bytes"):
        ef.Interpreter(data).allocate_tensors()  # main: MemoryError (4 EiB)


def test_constants_are_mapped_not_allocated_and_not_bounded():
    w = np.arange(64, dtype=np.float32).reshape(8, 8)
    data = model([("x", "float32", (1, 8)), ("w", "float32", (8, 8), w), ("y", "float32", (1, 8))],
                 [("matmul", ["x", "w"], ["y"], {})], ["x"], ["y"])
    interp = ef.Interpreter(data, max_tensor_bytes=200)  # w is 256 bytes, in the file
    x = np.ones((1, 8), np.float32)
    np.testing.assert_array_equal(interp.get_signature_runner("infer")(x=x)["y"], x @ w)


def test_inputs_that_make_too_large_a_tensor_are_invalid_inputs():
    data = model([("x", "float32", (-1, 8)), const("repeats", [1, 2**20]), ("y", "float32", (-1, -1))],
                 [("tile", ["x", "repeats"], ["y"], {})], ["x"], ["y"])
    assert run(data, x=np.ones((1, 8), np.float32))["y"].shape == (1, 8 * 2**20)  # 32 MiB: fine
    with pytest.raises(InvalidInputError, match=r"op 0 \(tile\) output 'y'.*for these inputs"):
        run(data, x=np.ones((2**10, 8), np.float32))  # 32 GiB


def test_the_bound_is_the_interpreters_and_covers_the_whole_arena():
    data = model([("x", "float32", (-1, 1024)), ("h", "float32", (-1, 1024)), ("y", "float32", (-1, 1024))],
                 [("relu", ["x"], ["h"], {}), ("neg", ["h"], ["y"], {})], ["x"], ["y"])
    x = np.ones((256, 1024), np.float32)  # 1 MiB each: x, h and y live together, 3 MiB
    runner = ef.Interpreter(data, max_tensor_bytes=3 * 2**20).get_signature_runner("infer")
    np.testing.assert_array_equal(runner(x=x)["y"], -x)
    runner = ef.Interpreter(data, max_tensor_bytes=2**21).get_signature_runner("infer")
    with pytest.raises(InvalidInputError, match=r"the plan's arena: 3 tensors needs 3 MiB"):
        runner(x=x)
    with pytest.raises(InvalidInputError, match=r"input 'x'"):
        runner(x=np.ones((1024, 1024), np.float32))


def test_the_default_bound_is_4_gib_or_the_machines_memory():
    import os
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert arena.default_max_tensor_bytes() == min(4 * 2**30, memory)
    assert ef.Interpreter(one_op("relu", (2,))).max_tensor_bytes == arena.default_max_tensor_bytes()


def test_scratch_is_bounded_and_named():
    with arena.bounded(100):
        assert arena.scratch((25,), np.float32).shape == (25,)
        with pytest.raises(arena.TooLarge, match=r"scratch float32\[26\] needs 104 bytes"):
            arena.scratch((26,), np.float32)
    assert arena.nbytes((2**32, 2**32), np.float32) == 2**66  # no int64 wrap


def test_a_kernels_scratch_is_bounded_too():
    # conv_transpose's columns: 16 x 16 taps of a 64 x 64 image, 4 MiB for a 24 KiB output
    w = np.ones((1, 1, 16, 16), np.float32)
    data = model([("x", "float32", (1, 1, 64, 64)), ("w", "float32", w.shape, w), ("y", "float32", (-1,) * 4)],
                 [("conv_transpose", ["x", "w"], ["y"], {})], ["x"], ["y"])
    x = np.ones((1, 1, 64, 64), np.float32)
    with pytest.raises(FormatError, match=r"op 0 \(conv_transpose\): scratch needs 4 MiB"):
        ef.Interpreter(data, max_tensor_bytes=2**20).get_signature_runner("infer")(x=x)
    y = ef.Interpreter(data, max_tensor_bytes=2**23).get_signature_runner("infer")(x=x)["y"]
    assert y.shape == (1, 1, 79, 79) and y.max() == 256


# Sizes that come from fed values: checked when the op that sizes them runs.
@pytest.mark.parametrize("op, inputs, feeds", [
    ("constant_of_shape", [("shape", "int64", (2,))], {"shape": np.array([2**20, 2**20])}),
    ("range", [("start", "int64", ()), ("limit", "int64", ()), ("delta", "int64", ())],
     {"start": np.int64(0), "limit": np.int64(2**40), "delta": np.int64(1)}),
    ("nonzero", [("x", "float32", (-1,))], {"x": np.ones(2**10, np.float32)}),
])
def test_sizes_from_fed_values_are_checked_before_allocating(op, inputs, feeds):
    dtype = "int64" if op != "constant_of_shape" else "float32"
    data = model([*inputs, ("y", dtype, (-1,) * (2 if op != "range" else 1))],
                 [(op, [t[0] for t in inputs], ["y"], {})], [t[0] for t in inputs], ["y"])
    limit = 2**12 if op == "nonzero" else None  # nonzero's 1,024 int64 pairs: 16 KiB
    interp = ef.Interpreter(data, max_tensor_bytes=limit)
    with pytest.raises(InvalidInputError, match=rf"op 0 \({op}\).*'y'.*max_tensor_bytes"):
        interp.get_signature_runner("infer")(**feeds)
    with pytest.raises(InvalidInputError, match=rf"op 0 \({op}\).*'y'.*max_tensor_bytes"):
        interp.run(["y"], feeds)  # small integer feeds: planned for their values


def test_a_loop_variable_that_grows_is_bounded(tmp_path):
    g = ef.Graph()
    with g.as_default():
        n = ef.placeholder(ef.int32, [], name="n")
        x = ef.placeholder(ef.float32, [1, 256], name="x")
        _, seq = ef.while_loop(lambda i, s: i < n, lambda i, s: (i + 1, ef.concat([s, s], 0)),
                               [ef.constant(0), x], shape_invariants=[(), (None, 256)])
    ef.save(g, tmp_path / "m.efl", {"infer": ({"x": x, "n": n}, {"seq": seq})})
    runner = ef.Interpreter(str(tmp_path / "m.efl"), max_tensor_bytes=2**20).get_signature_runner("infer")
    x = np.ones((1, 256), np.float32)
    assert runner(x=x, n=np.int32(9))["seq"].shape == (512, 256)  # 512 KiB
    with pytest.raises(InvalidInputError, match=r"max_tensor_bytes=1048576"):
        runner(x=x, n=np.int32(40))  # 2**40 rows


# F1-F4: files the verifier accepted that raised raw exceptions.
def test_f1_a_model_without_subgraphs():
    with pytest.raises(FormatError, match="no subgraph"):
        ef.Interpreter(writer.to_bytes(ModelDef(subgraphs=[])))


def test_f2_a_signature_output_no_op_produces():
    sig = [SignatureDef("infer", {"x": 0}, {"y": 1, "z": 2})]
    data = model([("x", "float32", (2,)), ("y", "float32", (2,)), ("z", "float32", (2,))],
                 [("relu", ["x"], ["y"], {})], ["x"], ["y"], signatures=sig)
    with pytest.raises(FormatError, match=r"signature 0 'infer': output 'z' is tensor 2 'z', which no operator"):
        run(data)  # main: KeyError


def test_f3_a_signature_input_that_is_a_constant():
    sig = [SignatureDef("infer", {"x": 0, "c": 1}, {"y": 2})]
    data = model([("x", "float32", (2,)), const("c", [1.0, 2.0], "float32"), ("y", "float32", (2,))],
                 [("add", ["x", "c"], ["y"], {})], ["x"], ["y"], signatures=sig)
    with pytest.raises(FormatError, match=r"signature 0 'infer': input 'c' is tensor 1 'c', a constant"):
        run(data)  # main: ValueError


def test_f4_a_dimension_past_int32():
    data = model([("x", "float32", (0, 2**40)), ("y", "float32", (0, 2**40))],
                 [("relu", ["x"], ["y"], {})], ["x"], ["y"])
    with pytest.raises(FormatError, match=r"tensor 0 'x': dimension 1099511627776 .* exceeds 2147483647"):
        ef.Interpreter(data).get_input_details()


def test_resizing_an_input_past_int32():
    interp = ef.Interpreter(model([("x", "float32", (-1, 2)), ("y", "float32", (-1, 2))],
                                  [("relu", ["x"], ["y"], {})], ["x"], ["y"]))
    with pytest.raises(InvalidInputError, match=r"expected shape \(\?, 2\).*got \(1099511627776, 2\)"):
        interp.resize_input_tensor(0, [2**40, 2])
    interp.get_input_details()  # main: OverflowError (int32)


def test_a_signature_of_another_subgraph():
    tensors = [TensorDef(n, dtypes.float32, (2,)) for n in ("x", "h", "y")]
    first = SubGraphDef("g", tensors[:2], [OperatorDef("relu", [0], [1])], [0], [1])
    second = SubGraphDef("h", tensors, [OperatorDef("relu", [0], [1]), OperatorDef("neg", [1], [2])], [0], [2])
    data = writer.to_bytes(ModelDef([first, second], [SignatureDef("infer", {"x": 0}, {"y": 2}, subgraph=1)]))
    with pytest.raises(FormatError, match=r"signature 0 'infer': runs subgraph 1"):
        run(data)  # main: tensor 2 of subgraph 0, which has 2


def test_an_empty_batch_runs_to_empty_outputs():
    # main: ValueError "cannot reshape array of size 0" binding the conv kernel (found by
    # tests/interp/test_fuzz_interpreter.py on a mutated digits_cnn)
    w = np.ones((2, 1, 3, 3), np.float32)
    data = model([("x", "float32", (-1, 1, 8, 8)), ("w", "float32", w.shape, w), ("c", "float32", (-1, 2, 6, 6)),
                  ("y", "float32", (-1, 2, 6, 6))],
                 [("conv", ["x", "w"], ["c"], {}), ("relu", ["c"], ["y"], {})], ["x"], ["y"])
    runner = ef.Interpreter(data).get_signature_runner("infer")
    assert runner(x=np.zeros((0, 1, 8, 8), np.float32))["y"].shape == (0, 2, 6, 6)
    np.testing.assert_array_equal(runner(x=np.ones((1, 1, 8, 8), np.float32))["y"], np.full((1, 2, 6, 6), 9.0))


def test_an_output_sized_by_values_is_checked_against_its_declaration():
    # main: TypeError copying float32 into the int64 tensor the file declares (found by
    # tests/interp/test_fuzz_interpreter.py: a reshape turned into constant_of_shape)
    data = model([("n", "int64", (1,)), ("c", "int64", (-1,)), ("y", "int64", (-1,))],
                 [("constant_of_shape", ["n"], ["c"], {"dtype": dtypes.float32}), ("neg", ["c"], ["y"], {})],
                 ["n"], ["y"])
    with pytest.raises(FormatError, match=r"tensor 1 'c' is declared int64\(-1\) but op constant_of_shape "
                                          r"makes float32\(3\)"):
        ef.Interpreter(data).get_signature_runner("infer")(n=np.array([3]))
