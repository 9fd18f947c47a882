"""`edgeflow inspect`: every op's FLOPs and bytes against hand counts, the per-type table,
metadata decoded, and models whose plans need the server or values known when running."""
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.cli.inspect import describe, render
from edgeflow.errors import InvalidInputError
from edgeflow.format import reader, writer
from edgeflow.graph.math_ops import apply

F32 = 4  # bytes


def edgeflow(*args):
    return subprocess.run([sys.executable, "-m", "edgeflow.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def conv_flops(n, cout, h, w, cin, kh, kw, group):
    return 2 * n * cout * h * w * cin * kh * kw // group


@pytest.fixture(scope="module")
def convnet(tmp_path_factory):
    """x (N, 3, 8, 8) -> conv 3x3 stride 2 (4 out, bias) -> grouped conv 3x3 (group 2) ->
    reshape (N, 64) -> matmul (64, 5); with metadata entries of each kind."""
    path = tmp_path_factory.mktemp("inspect") / "convnet.efl"
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 3, 8, 8], name="x")
        c1 = apply("conv", [x, ef.constant(np.ones((4, 3, 3, 3), np.float32), name="w1"),
                            ef.constant(np.ones(4, np.float32), name="b1")],
                   {"strides": [2, 2], "pads": [1, 1, 1, 1]}, name="c1")
        c2 = apply("conv", [c1, ef.constant(np.ones((4, 2, 3, 3), np.float32), name="w2")],
                   {"pads": [1, 1, 1, 1], "group": 2}, name="c2")
        flat = ef.reshape(c2, [-1, 64], name="flat")
        y = ef.matmul(flat, ef.constant(np.ones((64, 5), np.float32), name="w3"), name="y")
    ef.save(g, path, {"infer": ({"x": x}, {"y": y})})
    model = reader.load(path)
    extra = {"vendor.json": b'{"a": [1, 2], "b": "c"}', "vendor.text": "h\u00e9llo".encode(),
             "vendor.number": b"42", "vendor.blob": b"\xff\x00\x01"}
    writer.write(dataclasses.replace(model, metadata={**model.metadata, **extra}), path)
    return path


def hand_counts(n):
    """{op name: (FLOPs, bytes read, bytes written)} at batch n, counted by hand."""
    c1 = conv_flops(n, 4, 4, 4, 3, 3, 3, 1)
    c2 = conv_flops(n, 4, 4, 4, 4, 3, 3, 2)
    mm = 2 * n * 5 * 64  # 2*M*N*K
    x, act = n * 3 * 8 * 8 * F32, n * 4 * 4 * 4 * F32
    return {"c1": (c1, x + 4 * 27 * F32 + 4 * F32, act),
            "c2": (c2, act + 4 * 18 * F32, act),
            "flat": (0, 0, 0),  # a view: no arithmetic, no bytes moved
            "y": (mm, act + 64 * 5 * F32, n * 5 * F32)}


@pytest.mark.parametrize("batch", [None, 3])
def test_every_op_has_the_hand_counted_flops_and_bytes(convnet, batch):
    info = describe(convnet, input_shapes={"x": (batch, 3, 8, 8)} if batch else None)
    n = batch or 1  # a dynamic dimension counts as 1 unless --input-shape gives it
    got = {o["name"]: (o["flops"], o["bytes_read"], o["bytes_written"]) for o in info["ops"]}
    assert got == hand_counts(n)
    assert [o["type"] for o in info["ops"]] == ["conv", "conv", "reshape", "matmul"]
    assert all(o["status"] == "runs" and o["signature"] == "infer" for o in info["ops"])
    sig = info["signatures"]["infer"]
    assert sig["flops"] == sum(f for f, _, _ in hand_counts(n).values())
    assert sig["planned_at"] == {"x": [n, 3, 8, 8]}


def test_the_text_table_gives_flops_and_share_per_op_type(convnet):
    text = render(describe(convnet))
    rows = {line.split()[0]: line.split()[1:] for line in
            text.split("ops by type")[1].split("\n")[2:] if line.startswith("  ")}
    conv, mm = conv_flops(1, 4, 4, 4, 3, 3, 3, 1) + conv_flops(1, 4, 4, 4, 4, 3, 3, 2), 640
    total = conv + mm
    assert rows["conv"] == ["2", f"{conv:,}", f"{conv / total:.1%}"]
    assert rows["matmul"] == ["1", f"{mm:,}", f"{mm / total:.1%}"]
    assert rows["reshape"] == ["1", "0", "0.0%"]
    assert rows["total"] == ["4", f"{total:,}"]
    assert "planned at x(1, 3, 8, 8)" in text


def test_metadata_values_are_decoded(convnet):
    meta = describe(convnet)["metadata"]
    assert meta["vendor.json"] == {"a": [1, 2], "b": "c"}
    assert meta["vendor.text"] == "h\u00e9llo"
    assert meta["vendor.number"] == "42"  # text that is not a JSON object or array stays text
    assert meta["vendor.blob"] == {"bytes": 3, "hex": "ff0001"}


def test_input_shape_must_name_an_input_and_fit_it(convnet):
    with pytest.raises(InvalidInputError, match="names no input"):
        describe(convnet, input_shapes={"nope": (1,)})
    with pytest.raises(InvalidInputError, match="--input-shape x"):
        describe(convnet, input_shapes={"x": (1, 4, 8, 8)})


def test_ops_sized_when_running_have_no_flops(tmp_path):
    """nonzero's output shape depends on values: ops from it on are planned when running."""
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None], name="x")
        h = ef.nn.relu(x, name="h")
        idx = apply("nonzero", [h], name="idx")
        y = ef.cast(idx, ef.float32, name="y")
    ef.save(g, tmp_path / "staged.efl", {"infer": ({"x": x}, {"y": y})})
    info = describe(tmp_path / "staged.efl")
    ops = {o["name"]: o for o in info["ops"]}
    assert (ops["h"]["status"], ops["h"]["flops"]) == ("runs", 1)
    assert [(ops[k]["status"], ops[k]["flops"]) for k in ("idx", "y")] == [("at run time", None)] * 2
    assert info["signatures"]["infer"]["sized_when_running_from_op"] == 1
    assert "sized when running from op 1" in render(info)


def test_cli_json_text_and_input_shape(convnet):
    r = edgeflow("inspect", convnet, "--json", "--input-shape", "x=2,3,8,8")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert {o["name"]: o["flops"] for o in info["ops"]} == {k: v[0] for k, v in hand_counts(2).items()}
    assert info["metadata"]["vendor.json"] == {"a": [1, 2], "b": "c"}
    r = edgeflow("inspect", convnet)
    assert r.returncode == 0, r.stderr
    assert "infer: 4 ops, 6.40 kFLOPs" in r.stdout and "vendor.text: h\u00e9llo" in r.stdout
    r = edgeflow("inspect", convnet, "--input-shape", "y=1,5")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "names no input" in r.stderr
