"""The plan report: a Placement as JSON, as a readable table, and as an SVG picture of the
graph coloured by side (a layered layout written by hand: no graphviz needed)."""
from xml.sax.saxutils import escape, quoteattr

from .links import Link

_COLOURS = {"device": "#4e79a7", "cloud": "#f28e2b", "input": "#9c9c9c"}


def to_json(placement, cost_graph, link):
    """A JSON-ready dict: link, objective, predicted seconds, where each op runs, and the
    tensors that cross the link."""
    link = Link.parse(link)
    return {
        "objective": placement.objective,
        "exact": placement.exact,
        "link": {"name": link.name, "up_bps": link.up_bps, "down_bps": link.down_bps,
                 "rtt_s": link.rtt_s, "overhead_s": link.overhead_s},
        "compression": cost_graph.compression,
        "predicted_s": dict(placement.predicted),
        "breakdown": dict(placement.breakdown),
        "device_memory_bytes": placement.device_memory,
        "ops": [{"name": op.name, "opcode": op.opcode, "side": placement.side[op.name],
                 "pinned": op.pinned, "device_s": op.device_s, "cloud_s": op.cloud_s,
                 "param_bytes": op.param_bytes, "flops": op.flops} for op in cost_graph.ops],
        "upload": [{"name": n, "bytes": b, "seconds": link.up_s(b)} for n, b in placement.cut_tensors],
        "download": [{"name": n, "bytes": b, "seconds": link.down_s(b)}
                     for n, b in placement.download_tensors],
    }


def _ms(seconds):
    return f"{seconds * 1e3:.3f}"


def _grid(header, rows):
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def table(placement, cost_graph, link):
    """A plain-text report: each op's side and times, the tensors on the link, and the
    predicted cost of this split against device-only and cloud-only."""
    link = Link.parse(link)
    p, parts = placement.predicted, placement.breakdown
    lines = [f"split plan: objective {placement.objective}"
             + ("" if placement.exact else " (not proven optimal)"),
             f"link {link.describe()}; wire compression {cost_graph.compression}", ""]
    lines += _grid(["op", "type", "side", "device ms", "cloud ms", "pinned"],
                   [[op.name, op.opcode, placement.side[op.name], _ms(op.device_s), _ms(op.cloud_s),
                     op.pinned or ""] for op in cost_graph.ops])
    transfers = [[n, "up", b, _ms(link.up_s(b))] for n, b in placement.cut_tensors] + \
                [[n, "down", b, _ms(link.down_s(b))] for n, b in placement.download_tensors]
    lines.append("")
    if transfers:
        lines += _grid(["tensor", "link", "bytes", "ms"], transfers)
    else:
        lines.append("nothing crosses the link")
    lines += ["", f"device {_ms(parts['device_s'])} ms + cloud {_ms(parts['cloud_s'])} ms + up "
              f"{_ms(parts['up_s'])} ms ({parts['up_bytes']} B) + down {_ms(parts['down_s'])} ms "
              f"({parts['down_bytes']} B) + RTT {_ms(parts['rtt_s'])} ms + call overhead "
              f"{_ms(parts['overhead_s'])} ms; device memory "
              f"{placement.device_memory} B", ""]
    rows = [["split", _ms(p["split"]), "1.00x"]]
    pinned_up = any(op.pinned == "cloud" for op in cost_graph.ops)
    for key in ("device_only", "cloud_only"):
        ratio = p[key] / p["split"] if p["split"] > 0 else float("inf")
        label = key.replace("_", "-")
        if pinned_up and key == "device_only":
            label += " (ignores cloud pins)"
        rows.append([label, _ms(p[key]), f"{ratio:.2f}x"])
    lines += _grid([f"predicted {placement.objective}", "ms", "vs split"], rows)
    return "\n".join(lines) + "\n"


def _layers(cost_graph):
    """{node: layer}: graph inputs (by name) 0, op ("op", index) one below its deepest
    input (ops without inputs 0)."""
    layer = {t.name: 0 for t in cost_graph.inputs}
    for op in cost_graph.ops:  # ops come in dependency order
        layer[("op", op.index)] = 1 + max((layer[_node_of(cost_graph, t)] for t in op.inputs),
                                          default=-1)
    return layer


def svg(placement, cost_graph, link=None):
    """An SVG picture: graph inputs and ops as boxes in layers top to bottom, coloured by
    side; tensors sent up drawn as thick red dashed edges labelled with their bytes."""
    node_w, node_h, gap_x, gap_y, margin, top = 170, 38, 24, 56, 20, 64
    layer = _layers(cost_graph)
    rows = {}
    for key, depth in layer.items():
        rows.setdefault(depth, []).append(key)
    # One barycentre pass: order each layer by the mean position of its inputs, to keep
    # edges short and crossings few.
    position = {}
    for depth in sorted(rows):
        def centre(key):
            if not isinstance(key, tuple):  # a graph input
                return 0.0
            srcs = [_node_of(cost_graph, t) for t in cost_graph.ops[key[1]].inputs]
            xs = [position[s] for s in srcs if s in position]
            return sum(xs) / len(xs) if xs else 0.0
        rows[depth].sort(key=centre)
        for k, key in enumerate(rows[depth]):
            position[key] = k
    p = placement.predicted
    title = (f"{placement.objective}: split {p['split'] * 1e3:.2f} ms, device-only "
             f"{p['device_only'] * 1e3:.2f} ms, cloud-only {p['cloud_only'] * 1e3:.2f} ms")
    if link is not None:
        title += f" ({Link.parse(link).describe()})"
    width = max(len(r) for r in rows.values()) if rows else 1
    graph_w = width * node_w + (width - 1) * gap_x
    canvas_w = margin * 2 + max(graph_w, len(title) * 7, 460)  # ~7 px per character
    canvas_h = top + margin + len(rows) * node_h + max(len(rows) - 1, 0) * gap_y

    def xy(key):
        row = rows[layer[key]]
        offset = (canvas_w - 2 * margin - len(row) * (node_w + gap_x) + gap_x) / 2
        return (margin + offset + position[key] * (node_w + gap_x),
                top + layer[key] * (node_h + gap_y))

    cut = dict(placement.cut_tensors)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{canvas_w:.0f}" height="{canvas_h:.0f}" '
           f'viewBox="0 0 {canvas_w:.0f} {canvas_h:.0f}" font-family="sans-serif" font-size="11">',
           '<rect width="100%" height="100%" fill="white"/>']
    out.append(f'<text x="{margin}" y="22" font-size="13">{escape(title)}</text>')
    legend_x = margin
    for label, colour in (("device", _COLOURS["device"]), ("cloud", _COLOURS["cloud"]),
                          ("graph input", _COLOURS["input"])):
        out.append(f'<rect x="{legend_x}" y="34" width="12" height="12" fill="{colour}"/>'
                   f'<text x="{legend_x + 16}" y="44">{label}</text>')
        legend_x += 100
    out.append(f'<line x1="{legend_x}" y1="40" x2="{legend_x + 24}" y2="40" stroke="#d62728" '
               f'stroke-width="3" stroke-dasharray="6,3"/>'
               f'<text x="{legend_x + 28}" y="44">sent up</text>')
    for op in cost_graph.ops:
        x2, y2 = xy(("op", op.index))
        for t in op.inputs:
            x1, y1 = xy(_node_of(cost_graph, t))
            a = (x1 + node_w / 2, y1 + node_h)
            b = (x2 + node_w / 2, y2)
            producer = cost_graph.tensors[t].producer
            crosses = t in cut and placement.side[op.name] == "cloud" and (
                producer is None or placement.side[cost_graph.ops[producer].name] == "device")
            style = 'stroke="#d62728" stroke-width="3" stroke-dasharray="6,3"' if crosses \
                else 'stroke="#555" stroke-width="1.2"'
            out.append(f'<line x1="{a[0]:.1f}" y1="{a[1]:.1f}" x2="{b[0]:.1f}" y2="{b[1]:.1f}" {style}>'
                       f'<title>{escape(t)}</title></line>')
            if crosses:
                out.append(f'<text x="{(a[0] + b[0]) / 2 + 4:.1f}" y="{(a[1] + b[1]) / 2:.1f}" '
                           f'fill="#d62728">{cut[t]} B</text>')
    for key in layer:
        x, y = xy(key)
        if isinstance(key, tuple):  # an op
            op = cost_graph.ops[key[1]]
            colour, label = _COLOURS[placement.side[op.name]], op.name
            tip = (f"{op.name} ({op.opcode}) on the {placement.side[op.name]}: device "
                   f"{op.device_s * 1e3:.3f} ms, cloud {op.cloud_s * 1e3:.3f} ms")
            sub = op.opcode + (f" [{op.pinned}]" if op.pinned else "")
        else:
            t = cost_graph.tensors[key]
            colour, label, sub = _COLOURS["input"], key, f"input {t.nbytes} B"
            tip = f"graph input {key}: {t.dtype}{list(t.shape)}"
        out.append(f'<g><title>{escape(tip)}</title>'
                   f'<rect x="{x:.1f}" y="{y:.1f}" width="{node_w}" height="{node_h}" rx="6" '
                   f'fill={quoteattr(colour)} stroke="#333"/>'
                   f'<text x="{x + node_w / 2:.1f}" y="{y + 16:.1f}" text-anchor="middle" fill="white">'
                   f'{escape(_short(label))}</text>'
                   f'<text x="{x + node_w / 2:.1f}" y="{y + 30:.1f}" text-anchor="middle" fill="white" '
                   f'font-size="9">{escape(_short(sub))}</text></g>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _node_of(cost_graph, tensor):
    p = cost_graph.tensors[tensor].producer
    return tensor if p is None else ("op", p)


def _short(text, n=26):
    return text if len(text) <= n else text[:n - 1] + "\u2026"
