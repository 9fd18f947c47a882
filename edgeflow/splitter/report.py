"""The plan report: a Placement as JSON and as a readable table. Its picture is drawn by
`edgeflow split` (edgeflow/cli/draw.py's plan_svg, the `draw` extra)."""
from .links import Link


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
