"""Pictures of graphs as SVG: `edgeflow inspect --svg` (a model's ops, coloured by the
backend that runs each or by the side of a split package) and `edgeflow split --svg` (a
plan: ops by side, the tensors that cross the link with their bytes).

A layered (Sugiyama) layout: each node goes one layer below its deepest input, an edge
that spans layers passes through a dummy vertex in each layer between its ends, and
igraph (the 'draw' extra) orders the layers to cut crossings and places the vertices. An
edge is drawn from its source's bottom, straight down through each layer at its dummy,
into its target's top: its slanted parts lie in the gaps between layers and its vertical
parts clear of the boxes (a dummy stands a box and a gap from its neighbours), so a skip
connection never crosses a box.
Boxes are all one size (names shortened; each box's tooltip has the whole name), and the
SVG is plain text written here.
"""
import re
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

from ..errors import EdgeflowError

BOX_W, BOX_H = 168, 38      # every node's box
GAP_X, GAP_Y = 36, 46       # between boxes of a layer, between layers (edges and labels go there)
MARGIN, HEADER = 20, 70     # around the picture; the title and legend above it
CHARS = 26                  # characters that fit a box's line

# Fills by group: light, so that the dark text reads on every one.
COLOURS = {
    "device": "#a6cee3", "cloud": "#fdbf6f", "link": "#fb9a99",
    "cpu": "#c6dbef", "folded": "#eeeeee", "at run time": "#dadaeb", "unused": "#ffffff",
    "remote": "#fb9a99", "after the link": "#dadaeb", "input": "#e5e5e5", "output": "#e5e5e5",
}
_MEANING = {  # what each group means, for the legend
    "device": "device", "cloud": "cloud", "link": "send/recv (the link)", "cpu": "CPU (numpy)",
    "folded": "folded when planned", "at run time": "sized when running",
    "unused": "in no signature", "remote": "send/recv (the link)", "after the link": "after the link",
    "input": "input", "output": "output"}
_MORE = ["#b2df8a", "#cab2d6", "#ffff99", "#8dd3c7", "#fccde5"]  # delegates, in order of appearance
CUT = "#d62728"
_HALO = 'stroke="white" stroke-width="3" paint-order="stroke"'  # labels stay readable over edges


@dataclass
class Node:
    key: str    # its id in the SVG
    kind: str   # "op", "input" or "output"
    title: str  # first line: the op type, or the tensor's name
    detail: str  # second line: the op's name, or the tensor's shape
    group: str  # its fill (COLOURS) and legend entry
    tip: str    # the tooltip


@dataclass
class Edge:
    src: str
    dst: str
    tensor: str  # the tensor's name
    label: str   # its shape, written once beside its source
    tip: str
    cut: str = None  # the link's label ("1,024 B up") when the tensor crosses it


@dataclass
class Picture:
    """Nodes and edges to draw; `svg()` lays them out, with a legend of the groups used."""

    title: str
    nodes: dict = field(default_factory=dict)
    edges: list = field(default_factory=list)

    def node(self, key, kind, title, detail, group, tip):
        self.nodes[key] = Node(key, kind, title, detail, group, tip)

    def edge(self, src, dst, tensor, label, tip, cut=None):
        self.edges.append(Edge(src, dst, tensor, label, tip, cut))

    def svg(self):
        """The SVG text: the title, the legend, the edges, then the boxes over them."""
        keys = list(self.nodes)
        index = {k: n for n, k in enumerate(keys)}
        place, routes = layout(len(keys), [(index[e.src], index[e.dst]) for e in self.edges],
                               {index[k] for k, n in self.nodes.items() if n.kind == "input"})
        xs = [x for x, _ in place] + [x for r in routes for x, _ in r] or [0]
        x0, width = min(xs), max(xs) - min(xs)
        colours = _colours(n.group for n in self.nodes.values())
        legend = [(g, _MEANING.get(g, g)) for g in colours]
        if any(e.cut for e in self.edges):
            legend.append((None, "sent over the link (bytes)"))

        def px(x):
            return MARGIN + BOX_W / 2 + (x - x0) * (BOX_W + GAP_X)

        def top(layer):
            return HEADER + layer * (BOX_H + GAP_Y)

        centre = {k: (px(x), top(y) + BOX_H / 2) for k, (x, y) in zip(keys, place)}
        paths = [self._path(e, r, centre, px, top) for e, r in zip(self.edges, routes)]
        _spread_ports(self.edges, paths, centre)
        layers = max((y for _, y in place), default=0) + 1
        w = max(2 * MARGIN + BOX_W + width * (BOX_W + GAP_X), 7 * len(self.title) + 2 * MARGIN,
                sum(40 + 6.5 * len(m) for _, m in legend) + 2 * MARGIN)
        h = top(layers) - GAP_Y + MARGIN
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}" '
               f'viewBox="0 0 {w:.0f} {h:.0f}" font-family="sans-serif" font-size="11">',
               '<defs>' + "".join(
                   f'<marker id="{name}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
                   f'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="{fill}"/></marker>'
                   for name, fill in (("arrow", "#555"), ("arrow-cut", CUT))) + '</defs>',
               '<rect width="100%" height="100%" fill="white"/>',
               f'<text class="title" x="{MARGIN}" y="24" font-size="13">{_text(self.title)}</text>',
               '<g class="legend">']
        x = MARGIN
        for group, meaning in legend:
            mark = (f'<rect x="{x:.0f}" y="38" width="12" height="12" fill="{colours[group]}" stroke="#333"/>'
                    if group else f'<line x1="{x:.0f}" y1="44" x2="{x + 12:.0f}" y2="44" stroke="{CUT}" '
                                  'stroke-width="2.5" stroke-dasharray="6,3"/>')
            out.append(f'<g class="legend-item" data-group={_attr(group or "cut")}>{mark}'
                       f'<text x="{x + 16:.0f}" y="48">{_text(meaning)}</text></g>')
            x += 40 + 6.5 * len(meaning)
        out.append('</g><g class="edges">')
        labelled = set()
        for e, points in zip(self.edges, paths):
            out.append(self._edge_svg(e, points, e.tensor not in labelled))
            labelled.add(e.tensor)
        out.append('</g><g class="nodes">')
        out += [self._node_svg(n, *centre[n.key], colours[n.group]) for n in self.nodes.values()]
        out.append("</g></svg>")
        return "\n".join(out) + "\n"

    def _path(self, edge, route, centre, px, top):
        """The edge's points: its source's bottom, down through each dummy's layer, its
        target's top (ports are spread along the boxes afterwards)."""
        (sx, sy), (tx, ty) = centre[edge.src], centre[edge.dst]
        points = [(sx, sy + BOX_H / 2)]
        for x, layer in route:
            points += [(px(x), top(layer)), (px(x), top(layer) + BOX_H)]
        return points + [(tx, ty - BOX_H / 2)]

    @staticmethod
    def _edge_svg(e, points, labelled):
        d = "M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in points)
        style = (f'stroke="{CUT}" stroke-width="2.5" stroke-dasharray="6,3" marker-end="url(#arrow-cut)"'
                 if e.cut else 'stroke="#555" stroke-width="1.2" marker-end="url(#arrow)"')
        parts = [f'<g class="edge{" cut" if e.cut else ""}" data-tensor={_attr(e.tensor)} '
                 f'data-from="{e.src}" data-to="{e.dst}"><title>{_text(e.tip)}</title>'
                 f'<path d="{d}" fill="none" {style}/>']
        if labelled:  # the shape once per tensor, beside where it leaves its source
            (x, y) = points[0]
            parts.append(f'<text class="shape" x="{x + 4:.1f}" y="{y + 12:.1f}" font-size="9" fill="#444" '
                         f'{_HALO}>{_text(e.label)}</text>')
        if e.cut:  # the bytes on the link, beside where it enters its reader
            (x1, y1), (x2, y2) = points[-2], points[-1]
            parts.append(f'<text class="cut" x="{(x1 + x2) / 2 + 5:.1f}" y="{(y1 + y2) / 2 + 4:.1f}" '
                         f'font-size="10" fill="{CUT}" {_HALO}>{_text(e.cut)}</text>')
        return "".join(parts) + "</g>"

    @staticmethod
    def _node_svg(n, cx, cy, fill):
        x, y = cx - BOX_W / 2, cy - BOX_H / 2
        rx = BOX_H / 2 if n.kind != "op" else 5
        dash = ' stroke-dasharray="4,3"' if n.group == "unused" else ""
        return (f'<g class="node {n.kind}" id="{n.key}" data-group={_attr(n.group)}>'
                f'<title>{_text(n.tip)}</title>'
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{BOX_W}" height="{BOX_H}" rx="{rx:.0f}" '
                f'fill="{fill}" stroke="#333"{dash}/>'
                f'<text x="{cx:.1f}" y="{y + 16:.1f}" text-anchor="middle" font-weight="bold">'
                f'{_text(_short(n.title))}</text>'
                f'<text x="{cx:.1f}" y="{y + 30:.1f}" text-anchor="middle" font-size="9">'
                f'{_text(_short(n.detail, CHARS + 6))}</text></g>')


INSTALL = "pip install 'edgeflow[draw]'"


def available():
    """Whether igraph (the 'draw' extra) is installed."""
    import importlib.util
    return importlib.util.find_spec("igraph") is not None


def require():
    """The igraph module; EdgeflowError naming the 'draw' extra if it is not installed."""
    try:
        import igraph
    except ImportError:
        raise EdgeflowError(f"drawing a graph needs igraph, which the 'draw' extra installs: {INSTALL}") from None
    return igraph


def layout(n, edges, top=()):
    """A layered layout of `n` nodes and `edges` [(src, dst)]: ([(x, layer)] per node,
    [[(x, layer)] of its bends] per edge), x in units of one box and its gap.

    Each node goes one layer below its deepest input (`layering`); an edge that spans
    layers becomes a chain through one dummy vertex per layer it passes, and igraph's
    Sugiyama layout orders each layer (barycentre sweeps) and places the vertices. (igraph
    1.0 adds such dummies itself, but its edge_routing can give an edge another edge's
    bends, and two vertices of a layer may come closer than the gap it is given: each
    layer keeps igraph's order and is spread to one unit apart by `_separate`.)"""
    layer = layering(n, edges, top)
    layers, chains, links = list(layer), [], []
    for s, t in edges:
        chain = list(range(len(layers), len(layers) + layer[t] - layer[s] - 1))
        layers += range(layer[s] + 1, layer[t])
        path = [s, *chain, t]
        links += zip(path, path[1:])
        chains.append(chain)
    graph = require().Graph(n=len(layers), edges=links, directed=True)
    coords = [[float(x), layers[v]] for v, (x, _) in enumerate(graph.layout_sugiyama(layers=layers, hgap=1, vgap=1))]
    by_layer = {}
    for point in coords:
        by_layer.setdefault(point[1], []).append(point)
    for points in by_layer.values():
        points.sort(key=lambda p: p[0])
        for p, x in zip(points, _separate([p[0] for p in points])):
            p[0] = x
    return [tuple(p) for p in coords[:n]], [[tuple(coords[v]) for v in chain] for chain in chains]


def layering(n, edges, top=()):
    """[layer of each node]: one below its deepest input; a node without inputs (except
    those in `top`, kept in layer 0) one above its first reader, not far above it.
    EdgeflowError if the edges make a cycle."""
    preds, succs = [[] for _ in range(n)], [[] for _ in range(n)]
    for s, t in edges:
        preds[t].append(s)
        succs[s].append(t)
    waiting = [len(p) for p in preds]
    order = [v for v in range(n) if not waiting[v]]
    for v in order:  # grows as nodes become ready (Kahn's topological sort)
        for t in succs[v]:
            waiting[t] -= 1
            if not waiting[t]:
                order.append(t)
    if len(order) < n:
        raise EdgeflowError("cannot draw the graph: its edges make a cycle")
    layer = [0] * n
    for v in order:
        layer[v] = max((layer[s] + 1 for s in preds[v]), default=0)
    for v in reversed(order):
        if not preds[v] and succs[v] and v not in top:
            layer[v] = min(layer[t] for t in succs[v]) - 1
    return layer


def _separate(xs):
    """The positions nearest `xs` (ascending; least squares) that are at least 1 apart:
    pool-adjacent-violators on x - rank, which must not decrease."""
    blocks = []  # [sum, count] of runs that move together
    for k, x in enumerate(xs):
        blocks.append([x - k, 1])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    out = [total / count for total, count in blocks for _ in range(count)]
    return [y + k for k, y in enumerate(out)]


def _spread_ports(edges, paths, centre):
    """Moves each edge's ends apart along its boxes: a source's tensors leave from their own
    points of its bottom, a target's edges arrive at their own points of its top, each in
    the order of where the edge comes from or goes to (to keep them from crossing)."""
    leaving, arriving = {}, {}
    for k, e in enumerate(edges):
        leaving.setdefault(e.src, {}).setdefault(e.tensor, []).append(k)
        arriving.setdefault(e.dst, []).append(k)
    for node, tensors in leaving.items():
        order = sorted(tensors.values(), key=lambda ks: min(paths[k][1][0] for k in ks))
        for slot, ks in enumerate(order):
            x = centre[node][0] - BOX_W / 2 + BOX_W * (slot + 1) / (len(order) + 1)
            for k in ks:
                paths[k][0] = (x, paths[k][0][1])
    for node, ks in arriving.items():
        ks = sorted(ks, key=lambda k: paths[k][-2][0])
        for slot, k in enumerate(ks):
            x = centre[node][0] - BOX_W / 2 + BOX_W * (slot + 1) / (len(ks) + 1)
            paths[k][-1] = (x, paths[k][-1][1])


def _colours(groups):
    found, extra = {}, iter(_MORE * 4)
    for g in groups:
        if g not in found:
            found[g] = COLOURS.get(g) or next(extra, "#dddddd")
    return found


_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(s):
    """`s` as XML text: escaped, with characters XML cannot hold replaced by U+FFFD."""
    return escape(_NOT_XML.sub("\ufffd", str(s)))


def _attr(s):
    return quoteattr(_NOT_XML.sub("\ufffd", str(s)))


def _short(text, n=CHARS):
    """`text` cut to `n` characters, keeping its end (a path's last parts say the most)."""
    return text if len(text) <= n else "\u2026" + text[-(n - 1):]


def shape_text(dtype, shape):
    """ "(?, 3, 64, 64)", with the dtype first unless float32."""
    dims = "(" + ", ".join("?" if d is None or d < 0 else str(d) for d in shape) + ")"
    return dims if dtype == "float32" else f"{dtype} {dims}"


# -- the two pictures edgeflow draws -----------------------------------------------------


def model_svg(model, info):
    """The picture of subgraph 0 of `model` (a ModelDef), each op coloured by what
    `info["ops"]` (edgeflow.cli.inspect.describe) says of it: its side in a split package,
    else the backend that runs it, else why none does (folded, unused, ...). Edges are the
    activation tensors (not weights), one per reader, with their declared shapes."""
    from .. import dtypes
    sub = model.subgraphs[0]
    weights = {i for i, t in enumerate(sub.tensors) if t.data is not None or t.is_variable}
    producer = {t: i for i, op in enumerate(sub.operators) for t in op.outputs}
    ops = info["ops"]
    by_side = any("side" in o for o in ops)
    picture = Picture(f"{info['file']}: {len(ops)} ops, coloured by " + ("side" if by_side else "backend"))

    def tensor(t):
        d = sub.tensors[t]
        return d.name, shape_text(dtypes.name(d.dtype), d.shape)

    def source(t):
        if t in producer:
            return f"op{producer[t]}"
        key = f"in{t}"
        if key not in picture.nodes:
            name, shape = tensor(t)
            picture.node(key, "input", name, shape, "input", f"input {name}: {shape}")
        return key

    for i, op in enumerate(sub.operators):
        o = ops[i]
        group = o.get("side") or (o["placement"] if o["status"] == "runs" else o["status"])
        held = [tensor(t) for t in op.inputs if t in weights]
        tip = (f"op {i} {o['type']} {o['name']}: {_MEANING.get(group, group)}"
               + (f", {o['flops']:,} FLOPs" if o["flops"] else "") + "".join(f"\nweight {n}: {s}" for n, s in held))
        picture.node(f"op{i}", "op", o["type"], o["name"], group, tip)
    for i, op in enumerate(sub.operators):
        for t in dict.fromkeys(t for t in op.inputs if t not in weights):
            name, shape = tensor(t)
            picture.edge(source(t), f"op{i}", name, shape, f"{name}: {shape}")
    outputs = {}  # tensor -> the names signatures give it (a `save` signature's variables are not drawn)
    for sig in model.signatures:
        for key, t in sig.outputs.items():
            if sig.subgraph == 0 and t not in weights:
                outputs.setdefault(t, {})[key] = None
    for t, keys in outputs.items():
        name, shape = tensor(t)
        src = source(t)
        picture.node(f"out{t}", "output", ", ".join(keys), shape, "output",
                     f"output {', '.join(keys)}: tensor {name} {shape}")
        picture.edge(src, f"out{t}", name, shape, f"{name}: {shape}")
    return picture.svg()


def plan_svg(placement, cost_graph, link=None):
    """The picture of a split plan: graph inputs, ops coloured by side, outputs; tensors sent
    up (and outputs sent down) drawn red with their bytes on the wire."""
    from .. import dtypes
    from ..splitter.links import Link
    p = placement.predicted
    title = (f"{placement.objective}: split {p['split'] * 1e3:.2f} ms, device-only "
             f"{p['device_only'] * 1e3:.2f} ms, cloud-only {p['cloud_only'] * 1e3:.2f} ms")
    if link is not None:
        title += f" ({Link.parse(link).describe()})"
    picture = Picture(title)
    up, down = dict(placement.cut_tensors), dict(placement.download_tensors)
    keys = {}

    def shape(t):
        return shape_text(dtypes.name(t.dtype), t.shape)

    for k, t in enumerate(cost_graph.inputs):
        keys[t.name] = f"in{k}"
        picture.node(f"in{k}", "input", t.name, shape(t), "input", f"graph input {t.name}: {shape(t)}, "
                     f"{t.nbytes:,} B")
    for op in cost_graph.ops:
        side = placement.side[op.name]
        picture.node(f"op{op.index}", "op", op.opcode + (f" [{op.pinned}]" if op.pinned else ""), op.name,
                     side, f"{op.name} ({op.opcode}) on the {side}: device {op.device_s * 1e3:.3f} ms, "
                     f"cloud {op.cloud_s * 1e3:.3f} ms, {op.flops:,} FLOPs")
        keys.update((t, f"op{op.index}") for t in op.outputs)

    def on_device(name):
        made = cost_graph.tensors[name].producer
        return made is None or placement.side[cost_graph.ops[made].name] == "device"

    for op in cost_graph.ops:
        for name in dict.fromkeys(op.inputs):
            t = cost_graph.tensors[name]
            sent = name in up and placement.side[op.name] == "cloud" and on_device(name)
            picture.edge(keys[name], f"op{op.index}", name, shape(t), f"{name}: {shape(t)}, {t.nbytes:,} B",
                         f"{up[name]:,} B up" if sent else None)
    for k, t in enumerate(t for t in cost_graph.tensors.values() if t.is_output):
        picture.node(f"out{k}", "output", t.name, shape(t), "output", f"output {t.name}: {shape(t)}")
        picture.edge(keys[t.name], f"out{k}", t.name, shape(t), f"{t.name}: {shape(t)}, {t.nbytes:,} B",
                     f"{down[t.name]:,} B down" if t.name in down else None)
    return picture.svg()
