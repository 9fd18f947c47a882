"""Graph pictures (`edgeflow inspect --svg`, `edgeflow split --svg`): valid SVG with one
box per op and one edge per (tensor, reader), shapes on the edges, colours that match
where each op runs, and, checked by brute force, no edge through a box it does not join."""
import json
import math
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import edgeflow as ef
from edgeflow.cli import draw
from edgeflow.cli.inspect import describe
from edgeflow.errors import EdgeflowError
from edgeflow.format import metadata, reader
from edgeflow.graph.math_ops import apply
from edgeflow.interp.delegate import Delegate
from edgeflow.splitter import CostGraph, CostOp, CostTensor, Link, plan
from edgeflow.splitter.package import split_file

import igraph  # noqa: F401  (declared: a broken install fails here)
SVG = "{http://www.w3.org/2000/svg}"


def edgeflow(*args):
    return subprocess.run([sys.executable, "-m", "edgeflow.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def conv(x, cin, cout, k, name):
    w = np.full((cout, cin, k, k), 0.01, np.float32)
    return apply("conv", [x, ef.constant(w, name=f"{name}.w")], {"pads": [k // 2] * 4}, name=name)


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    """A stem, two residual blocks (identity skip; 1x1 projection), x*x (one tensor read
    twice by one op), a skip from the stem over everything, and a second output."""
    path = tmp_path_factory.mktemp("draw") / "resnet.efl"
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 4, 8, 8], name="x")
        stem = ef.nn.relu(conv(x, 4, 8, 3, "stem"), name="stem.relu")
        h = ef.nn.relu(conv(stem, 8, 8, 3, "b1.conv1"), name="b1.relu1")
        a = ef.nn.relu(conv(h, 8, 8, 3, "b1.conv2") + stem, name="b1.out")
        h = ef.nn.relu(conv(a, 8, 16, 3, "b2.conv1"), name="b2.relu1")
        b = ef.nn.relu(conv(h, 16, 16, 3, "b2.conv2") + conv(a, 8, 16, 1, "b2.proj"), name="b2.out")
        sq = ef.multiply(b, b, name="square")
        y = ef.reduce_mean(sq, axis=[1], name="y") + ef.reduce_mean(stem, axis=[1], name="skip")
        e = ef.tanh(stem, name="e")
    ef.save(g, path, {"infer": ({"x": x}, {"y": y, "e": e})})
    return path


def parse(text):
    root = ET.fromstring(text)
    assert root.tag == f"{SVG}svg" and root.get("viewBox").startswith("0 0 ")
    nodes = {g.get("id"): g for g in root.iter(f"{SVG}g") if "node" in g.get("class", "").split()}
    edges = [g for g in root.iter(f"{SVG}g") if "edge" in g.get("class", "").split()]
    legend = {g.get("data-group"): g for g in root.iter(f"{SVG}g") if g.get("class") == "legend-item"}
    return root, nodes, edges, legend


def box(g):
    r = g.find(f"{SVG}rect")
    return tuple(float(r.get(k)) for k in ("x", "y", "width", "height"))


def polyline(g):
    d = g.find(f"{SVG}path").get("d")
    return [tuple(map(float, p.lstrip("ML").split(","))) for p in d.split()]


def boxes_crossed(points, boxes, inset=0.5):
    """Indices of the boxes (x, y, w, h) whose inside (`inset` px in from the border) a
    point of the polyline falls in, sampling every segment every quarter pixel."""
    if not boxes:
        return set()
    samples = []
    for (x1, y1), (x2, y2) in zip(points, points[1:]):
        n = max(2, math.ceil(4 * math.hypot(x2 - x1, y2 - y1)) + 1)
        t = np.linspace(0, 1, n)[:, None]
        samples.append(np.hstack([x1 + t * (x2 - x1), y1 + t * (y2 - y1)]))
    s, b = np.vstack(samples), np.array(boxes)
    inside = ((s[:, None, 0] > b[None, :, 0] + inset) & (s[:, None, 0] < b[None, :, 0] + b[None, :, 2] - inset)
              & (s[:, None, 1] > b[None, :, 1] + inset) & (s[:, None, 1] < b[None, :, 1] + b[None, :, 3] - inset))
    return set(np.nonzero(inside.any(axis=0))[0].tolist())


def check_geometry(nodes, edges):
    """No two boxes overlap, and no edge passes through a box other than its two ends."""
    keys = list(nodes)
    boxes = [box(nodes[k]) for k in keys]
    for i, (x1, y1, w1, h1) in enumerate(boxes):
        for j, (x2, y2, w2, h2) in enumerate(boxes[:i]):
            assert x1 + w1 <= x2 or x2 + w2 <= x1 or y1 + h1 <= y2 or y2 + h2 <= y1, (keys[i], keys[j])
    for e in edges:
        points = polyline(e)
        ends = {keys.index(e.get("data-from")), keys.index(e.get("data-to"))}
        crossed = boxes_crossed(points, boxes) - ends
        assert not crossed, (e.get("data-tensor"), [keys[k] for k in crossed])
        (sx, sy, sw, sh), (tx, ty, tw, _) = box(nodes[e.get("data-from")]), box(nodes[e.get("data-to")])
        assert sx <= points[0][0] <= sx + sw and points[0][1] == pytest.approx(sy + sh)  # leaves the bottom
        assert tx <= points[-1][0] <= tx + tw and points[-1][1] == pytest.approx(ty)  # enters the top
    arrivals = [(e.get("data-to"), polyline(e)[-1]) for e in edges]
    assert len(set(arrivals)) == len(arrivals)  # each edge has its own arrowhead


def readers(model):
    """{(tensor index, op index)} of subgraph 0: each activation tensor and each op reading it."""
    sub = model.subgraphs[0]
    weights = {i for i, t in enumerate(sub.tensors) if t.data is not None or t.is_variable}
    return {(t, i) for i, op in enumerate(sub.operators) for t in op.inputs if t not in weights}


def colour_of(legend, group):
    return legend[group].find(f"{SVG}rect").get("fill")


def test_one_box_per_op_one_edge_per_reader_shapes_on_edges(resnet):
    model = reader.load(resnet)
    sub = model.subgraphs[0]
    root, nodes, edges, _ = parse(draw.model_svg(model, describe(resnet)))
    assert sorted(k for k in nodes if k.startswith("op")) == sorted(f"op{i}" for i in range(len(sub.operators)))
    assert {nodes[f"op{i}"].find(f"{SVG}text").text for i in range(len(sub.operators))} == \
        {op.opcode for op in sub.operators}
    pairs = readers(model)
    to_ops = [e for e in edges if e.get("data-to").startswith("op")]
    assert len(to_ops) == len(pairs) < sum(len(op.inputs) for op in sub.operators)  # x*x: one edge
    producer = {t: f"op{i}" for i, op in enumerate(sub.operators) for t in op.outputs}
    assert sorted((e.get("data-from"), e.get("data-to")) for e in to_ops) == \
        sorted((producer.get(t, f"in{t}"), f"op{i}") for t, i in pairs)
    sig = model.signatures[0]
    outputs = [e for e in edges if e.get("data-to").startswith("out")]
    assert sorted(e.get("data-tensor") for e in outputs) == sorted(sub.tensors[t].name for t in sig.outputs.values())
    assert {nodes[e.get("data-to")].find(f"{SVG}text").text for e in outputs} == {"y", "e"}
    shapes = {}
    for e in edges:
        label = e.find(f"{SVG}text[@class='shape']")
        if label is not None:
            shapes[e.get("data-tensor")] = label.text
    by_name = {t.name: t for t in sub.tensors}
    assert shapes == {name: "(" + ", ".join("?" if d < 0 else str(d) for d in by_name[name].shape) + ")"
                      for name in {e.get("data-tensor") for e in edges}}
    assert shapes["x"] == "(?, 4, 8, 8)" and shapes["b2.out"] == "(?, 16, 8, 8)"


def test_no_edge_crosses_a_box_it_does_not_join(resnet):
    _, nodes, edges, _ = parse(draw.model_svg(reader.load(resnet), describe(resnet)))
    check_geometry(nodes, edges)
    # The check can fail: the skips drawn as straight lines would cross the blocks' boxes.
    keys, boxes = list(nodes), [box(g) for g in nodes.values()]
    straight = [e for e in edges if boxes_crossed([polyline(e)[0], polyline(e)[-1]], boxes)
                - {keys.index(e.get("data-from")), keys.index(e.get("data-to"))}]
    assert {e.get("data-tensor") for e in straight} >= {"stem.relu"}


@pytest.mark.parametrize("name", ["resnet", "mobilenetv2"])
def test_converted_models_keep_their_edges_clear(name, tmp_path):
    from edgeflow.converters import onnx as from_onnx
    from_onnx.convert(f"tests/data/onnx/{name}.onnx", tmp_path / "m.efl")
    model = reader.load(tmp_path / "m.efl")
    _, nodes, edges, _ = parse(draw.model_svg(model, describe(tmp_path / "m.efl")))
    assert len([k for k in nodes if k.startswith("op")]) == len(model.subgraphs[0].operators)
    assert len([e for e in edges if e.get("data-to").startswith("op")]) == len(readers(model))
    check_geometry(nodes, edges)


@pytest.mark.parametrize("seed", range(12))
def test_random_dags_keep_boxes_apart_and_edges_clear(seed):
    """igraph may put two vertices of a layer half a box apart: the layout spreads them."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 30))
    pairs = sorted({(int(a), int(b)) for a, b in rng.integers(0, n, (2 * n, 2)) if a < b})
    picture = draw.Picture(f"random DAG {seed}")
    for k in range(n):
        picture.node(f"n{k}", "op", "op", f"n{k}", "cpu", "")
    for a, b in pairs:
        picture.edge(f"n{a}", f"n{b}", f"t{a}", "(1,)", "")
    _, nodes, edges, _ = parse(picture.svg())
    assert len(nodes) == n and len(edges) == len(pairs)
    check_geometry(nodes, edges)


def test_layering_puts_sources_above_their_first_reader_and_refuses_cycles():
    chain = [(0, 1), (1, 2), (2, 3), (4, 3)]  # 4: an op reading only weights, feeding op 3
    assert draw.layering(5, chain) == [0, 1, 2, 3, 2]
    assert draw.layering(5, chain, top={4}) == [0, 1, 2, 3, 0]  # a graph input stays on top
    with pytest.raises(EdgeflowError, match="cycle"):
        draw.layering(3, [(0, 1), (1, 2), (2, 1)])


class ReluOnly(Delegate):
    """Claims relu ops (planning binds, nothing runs here)."""
    name = "relu-only"

    def unsupported(self, op, ins, outs):
        return None if op.opcode == "relu" else "not a relu"

    def compile(self, partition):
        return lambda: None


def test_ops_are_coloured_by_the_backend_that_runs_them(resnet):
    model = reader.load(resnet)
    info = describe(resnet, delegates=[ReluOnly()])
    _, nodes, _, legend = parse(draw.model_svg(model, info))
    assert set(legend) == {"relu-only", "cpu", "input", "output"}
    for i, op in enumerate(model.subgraphs[0].operators):
        want = "relu-only" if op.opcode == "relu" else "cpu"
        assert nodes[f"op{i}"].get("data-group") == want
        assert box_fill(nodes[f"op{i}"]) == colour_of(legend, want)
    assert colour_of(legend, "relu-only") != colour_of(legend, "cpu")


def box_fill(g):
    return g.find(f"{SVG}rect").get("fill")


def test_split_packages_are_coloured_by_side(resnet, tmp_path):
    result = split_file(resnet, tmp_path, cut=["b1.out", "stem.relu"], link="4g")
    device = reader.load(result.paths["device"])
    info = metadata.split(device)
    sub = device.subgraphs[0]
    names = {sub.tensors[op.outputs[0]].name: i for i, op in enumerate(sub.operators)}
    want = {i: "cloud" for i in range(len(sub.operators))}
    want.update((names[n], "device") for n in info["device_ops"])
    want.update((i, "link") for i, op in enumerate(sub.operators) if op.opcode in ("send", "recv"))
    assert set(want.values()) == {"device", "cloud", "link"}
    _, nodes, edges, legend = parse(draw.model_svg(device, describe(result.paths["device"])))
    assert {i: nodes[f"op{i}"].get("data-group") for i in want} == want
    assert all(box_fill(nodes[f"op{i}"]) == colour_of(legend, side) for i, side in want.items())
    assert len({colour_of(legend, s) for s in ("device", "cloud", "link")}) == 3
    check_geometry(nodes, edges)
    _, nodes, _, legend = parse(draw.model_svg(reader.load(result.paths["cloud"]),
                                               describe(result.paths["cloud"])))
    assert {g.get("data-group") for k, g in nodes.items() if k.startswith("op")} == {"cloud"}

    # The plan's picture: sides as plan.json says, the cut tensors red with their bytes.
    doc = json.loads(open(result.paths["plan"]).read())
    _, nodes, edges, legend = parse(draw.plan_svg(result.placement, result.cost_graph, result.link))
    ops = {g.get("id"): g for k, g in nodes.items() if k.startswith("op")}
    assert len(ops) == len(doc["ops"])
    for k, op in enumerate(doc["ops"]):
        assert ops[f"op{k}"].get("data-group") == op["side"]
        assert box_fill(ops[f"op{k}"]) == colour_of(legend, op["side"])
    cut = {(e.get("data-tensor"), e.find(f"{SVG}text[@class='cut']").text) for e in edges
           if "cut" in e.get("class").split()}
    assert cut == {(u["name"], f"{u['bytes']:,} B up") for u in doc["upload"]} | \
        {(d["name"], f"{d['bytes']:,} B down") for d in doc["download"]}
    assert doc["upload"] and doc["download"]
    check_geometry(nodes, edges)


def test_names_are_escaped_in_the_plan_picture():
    t = [CostTensor("x", np.float32, (100,)), CostTensor("a<&>", np.float32, (50,)),
         CostTensor("b\"'", np.float32, (5,), is_output=True)]
    ops = [CostOp("a<&>", "conv", ["x"], ["a<&>"], 0.002, 0.0002, pinned="device"),
           CostOp("b\"'", "matmul", ["a<&>"], ["b\"'"], 0.050, 0.001)]
    cg = CostGraph(ops, t)
    link = Link(8e6, 16e6, 0.01, "test")
    _, nodes, edges, _ = parse(draw.plan_svg(plan(cg, link, margin=0, min_gain_s=0), cg, link))
    assert [nodes[k].findall(f"{SVG}text")[1].text for k in ("op0", "op1")] == ["a<&>", "b\"'"]
    assert {e.get("data-tensor") for e in edges} == {"x", "a<&>", "b\"'"}


def test_without_igraph_a_clear_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "igraph", None)  # import igraph then raises ImportError
    with pytest.raises(EdgeflowError, match=r"'draw' extra.*edgeflow\[draw\]"):
        draw.Picture("t").svg()


def test_cli_split_and_inspect_draw(resnet, tmp_path):
    r = edgeflow("split", resnet, "-o", tmp_path / "out", "--cut", "b1.out,stem.relu", "--svg", tmp_path / "plan.svg")
    assert r.returncode == 0, r.stderr
    assert f"wrote {tmp_path / 'plan.svg'}" in r.stdout
    _, nodes, edges, _ = parse((tmp_path / "plan.svg").read_text())
    assert {g.get("data-group") for g in nodes.values()} == {"input", "device", "cloud", "output"}
    r = edgeflow("inspect", tmp_path / "out" / "device.efl", "--svg", tmp_path / "device.svg", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["metadata"]["edgeflow.role"] == "device"
    _, nodes, _, _ = parse((tmp_path / "device.svg").read_text())
    assert {"device", "cloud", "link"} <= {g.get("data-group") for g in nodes.values()}


def test_cli_split_draws_outdir_plan_svg_unless_told_not_to(resnet, tmp_path):
    r = edgeflow("split", resnet, "-o", tmp_path / "a", "--cut", "b1.out,stem.relu")
    assert r.returncode == 0 and f"wrote {tmp_path / 'a' / 'plan.svg'}" in r.stdout, r.stderr
    sides = [op["side"] for op in json.loads((tmp_path / "a" / "plan.json").read_text())["ops"]]
    _, nodes, _, _ = parse((tmp_path / "a" / "plan.svg").read_text())
    drawn = [g.get("data-group") for k, g in nodes.items() if k.startswith("op")]
    assert sorted(drawn) == sorted(sides) and set(sides) == {"device", "cloud"}
    r = edgeflow("split", resnet, "-o", tmp_path / "b", "--cut", "b1.out,stem.relu", "--no-svg")
    assert r.returncode == 0 and sorted(p.name for p in (tmp_path / "b").iterdir()) == \
        ["cloud.efl", "device.efl", "plan.json"], r.stderr


def test_cli_colours_the_ops_opencl_runs_and_those_it_leaves(tmp_path):
    g = ef.Graph()
    with g.as_default():
        x = ef.placeholder(ef.float32, [None, 16], name="x")
        h = apply("cumsum", [ef.nn.relu(x, name="h")], {"axis": 1}, name="c")  # no OpenCL kernel
        y = ef.exp(h, name="y")
    ef.save(g, tmp_path / "m.efl", {"infer": ({"x": x}, {"y": y})})
    r = edgeflow("inspect", tmp_path / "m.efl", "--accel", "opencl", "--json", "--svg", tmp_path / "m.svg")
    assert r.returncode == 0, r.stderr
    placed = {f"op{o['index']}": o["placement"] for o in json.loads(r.stdout)["ops"]}
    _, nodes, _, legend = parse((tmp_path / "m.svg").read_text())
    assert {k: g.get("data-group") for k, g in nodes.items() if k.startswith("op")} == placed
    assert sorted(placed.values()) == ["cpu", "opencl", "opencl"]
    assert colour_of(legend, "opencl") != colour_of(legend, "cpu")
