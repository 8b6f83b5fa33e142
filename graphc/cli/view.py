"""A picture of an ONNX graph (``graphc view``): SVG, or an HTML page around it.

Netron is the standard viewer and ``graphc view`` opens it when it is installed; it is a
browser application, though, and cannot write a picture. No pip-installable library turns an
ONNX graph into a static SVG without a system binary (graphviz's Python package needs ``dot``
installed apart), so this module lays the graph out itself: layers by longest path from the
inputs, nodes without inputs (constants, params) placed just above their first reader, the
order in each layer by the barycenter of the nodes above, edges as curves.

Training graphs are drawn with their parts told apart: autodiff names a gradient node
``<forward node>/grad/<op>_<n>`` (``passes/autodiff``), so each gradient node is coloured as
one and labelled with the forward node it comes from; ``loss/`` and ``optim/`` nodes are the
loss and the optimizer update. Hover a node for its name, op, source line and values.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import onnx

from graphc.model import node_source

__all__ = ["Box", "boxes", "render_html", "render_svg", "write"]

GRAD_MARK = "/grad/"
KINDS = {  # kind -> (fill, stroke, legend)
    "input": ("#fff3bf", "#e0a800", "graph input"),
    "output": ("#d3f9d8", "#2b8a3e", "graph output"),
    "forward": ("#dbe4ff", "#3b5bdb", "forward node"),
    "loss": ("#f3d9fa", "#9c36b5", "loss"),
    "gradient": ("#ffe8cc", "#e8590c", "gradient node (∇ of the forward node named)"),
    "optimizer": ("#e6fcf5", "#0ca678", "optimizer update"),
}
BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 168, 40, 24, 36, 20


@dataclass
class Box:
    """One drawn item: a node, a graph input or a graph output."""

    key: str
    title: str  # first line: op type or value name
    kind: str
    detail: str = ""  # second line
    tooltip: str = ""
    preds: list[str] = field(default_factory=list)
    layer: int = 0
    x: float = 0.0
    y: float = 0.0


def _kind_of(name: str) -> tuple[str, str]:
    """(kind, the forward node a gradient node comes from or "") from a node's name."""
    if GRAD_MARK in name:
        return "gradient", name.split(GRAD_MARK)[0]
    if name.startswith("grad/"):
        return "gradient", ""
    if name.startswith("optim/"):
        return "optimizer", ""
    if name.startswith("loss/"):
        return "loss", ""
    return "forward", ""


def boxes(graph: onnx.GraphProto) -> list[Box]:
    """The items to draw, in topological order, with their predecessors and kinds."""
    initializers = {t.name for t in graph.initializer}
    items: list[Box] = []
    producer: dict[str, str] = {}
    for value in graph.input:
        if value.name not in initializers:
            items.append(Box(f"in:{value.name}", value.name, "input", _type_text(value), f"input {value.name}"))
            producer[value.name] = items[-1].key
    for i, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}_{i}"
        kind, origin = _kind_of(name)
        source = node_source(node) or ""
        detail = f"∇ {origin}" if origin else ("∇ seed" if kind == "gradient" else name)
        lines = [f"{node.op_type}  {name}"]
        if origin:
            lines.append(f"gradient of forward node {origin}")
        if source:
            lines.append(f"source {source}")
        lines += ["inputs: " + ", ".join(v or "-" for v in node.input), "outputs: " + ", ".join(node.output)]
        box = Box(f"node:{i}", node.op_type, kind, detail, "\n".join(lines),
                  preds=list(dict.fromkeys(producer[v] for v in node.input if v in producer)))
        items.append(box)
        for out in node.output:
            producer[out] = box.key
    for value in graph.output:
        items.append(Box(f"out:{value.name}", value.name, "output", _type_text(value), f"output {value.name}",
                         preds=[producer[value.name]] if value.name in producer else []))
    return items


def _type_text(value: onnx.ValueInfoProto) -> str:
    """``float32[N, 64]``."""
    tt = value.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else "?"
    if not tt.HasField("shape"):
        return dtype
    dims = [d.dim_param if d.dim_param else str(d.dim_value) if d.HasField("dim_value") else "?" for d in tt.shape.dim]
    return f"{dtype}[{', '.join(dims)}]"


def _layout(items: list[Box]) -> tuple[float, float]:
    """Set each box's layer and position; returns the picture's width and height."""
    by_key = {b.key: b for b in items}
    readers: dict[str, list[Box]] = {}
    for b in items:
        b.layer = 1 + max((by_key[p].layer for p in b.preds), default=-1)
        for p in b.preds:
            readers.setdefault(p, []).append(b)
    for b in reversed(items):  # sources sit just above their first reader
        if not b.preds and b.key in readers:
            b.layer = max(0, min(r.layer for r in readers[b.key]) - 1)
    layers: dict[int, list[Box]] = {}
    for b in items:
        layers.setdefault(b.layer, []).append(b)
    order: dict[str, float] = {}
    for depth in sorted(layers):
        row = layers[depth]
        for i, b in enumerate(row):  # barycenter of the predecessors placed so far
            placed = [order[p] for p in b.preds if p in order]
            order[b.key] = sum(placed) / len(placed) if placed else float(i)
        row.sort(key=lambda b: order[b.key])
        for i, b in enumerate(row):
            order[b.key] = float(i) - (len(row) - 1) / 2
    widest = max((len(r) for r in layers.values()), default=1)
    width = 2 * MARGIN + widest * BOX_W + (widest - 1) * GAP_X
    for depth, row in layers.items():
        for b in row:
            b.x = width / 2 + order[b.key] * (BOX_W + GAP_X) - BOX_W / 2
            b.y = MARGIN + depth * (BOX_H + GAP_Y)
    return width, 2 * MARGIN + (max(layers, default=0) + 1) * (BOX_H + GAP_Y) - GAP_Y


def _clip(text: str, chars: int = 24) -> str:
    return text if len(text) <= chars else text[:chars - 1] + "…"


def render_svg(model: onnx.ModelProto) -> str:
    """The main graph of ``model`` as a standalone SVG document."""
    items = boxes(model.graph)
    width, height = _layout(items)
    by_key = {b.key: b for b in items}
    esc = html.escape
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
             f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="12">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" '
             'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#868e96"/></marker></defs>']
    for b in items:
        for p in b.preds:
            a = by_key[p]
            x1, y1, x2, y2 = a.x + BOX_W / 2, a.y + BOX_H, b.x + BOX_W / 2, b.y
            mid = (y1 + y2) / 2
            parts.append(f'<path d="M{x1:.1f},{y1:.1f} C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} {x2:.1f},{y2:.1f}" '
                         'fill="none" stroke="#868e96" marker-end="url(#arrow)"/>')
    for b in items:
        fill, stroke, _ = KINDS[b.kind]
        rx = 18 if b.kind in ("input", "output") else 4
        parts.append(f'<g class="{b.kind}"><title>{esc(b.tooltip)}</title>'
                     f'<rect x="{b.x:.1f}" y="{b.y:.1f}" width="{BOX_W}" height="{BOX_H}" rx="{rx}" '
                     f'fill="{fill}" stroke="{stroke}"/>'
                     f'<text x="{b.x + BOX_W / 2:.1f}" y="{b.y + 16:.1f}" text-anchor="middle" font-weight="bold">'
                     f'{esc(_clip(b.title))}</text>'
                     f'<text x="{b.x + BOX_W / 2:.1f}" y="{b.y + 31:.1f}" text-anchor="middle" fill="#495057">'
                     f'{esc(_clip(b.detail))}</text></g>')
    parts.append("</svg>")
    return "\n".join(parts)


def render_html(model: onnx.ModelProto, title: str) -> str:
    """An HTML page with the SVG, a legend of the node kinds present and the node counts."""
    counts: dict[str, int] = {}
    for b in boxes(model.graph):
        counts[b.kind] = counts.get(b.kind, 0) + 1
    legend = "".join(f'<span style="background:{KINDS[k][0]};border:1px solid {KINDS[k][1]};padding:2px 6px;'
                     f'margin-right:8px">{html.escape(KINDS[k][2])}: {n}</span>' for k, n in counts.items())
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
            f"<body style='font-family:sans-serif'><h2>{html.escape(title)}</h2><p>{legend}</p>"
            f"<p>Hover a node for its name, op, source line and values.</p>\n{render_svg(model)}\n</body></html>\n")


def write(model_path: Union[str, os.PathLike], output: Union[str, os.PathLike]) -> Path:
    """Write the picture of the model at ``model_path`` to ``output`` (``.svg`` or ``.html``),
    atomically."""
    from graphc.fileio import atomic_write
    from graphc.model import load

    output = Path(output)
    suffix = output.suffix.lower()
    if suffix not in (".svg", ".html", ".htm"):
        raise ValueError(f"-o {output}: graphc view writes .svg or .html pictures, not {suffix or 'a file without a suffix'!r}")
    proto = load(model_path).proto  # checks the file as every command does; external data stays unread
    text = render_svg(proto) if suffix == ".svg" else render_html(proto, f"{Path(model_path).name}: {proto.graph.name}")
    atomic_write(output, text.encode())
    return output
