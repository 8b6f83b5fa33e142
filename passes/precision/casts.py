"""Cast nodes made once per (graph, value, dtype) and reused by every consumer, as torch's autocast
caches its casts; named ``<value>_to_<dtype>`` (node) and ``<value>_<dtype>`` (output)."""

from __future__ import annotations

import onnx_ir as ir


class Casts:
    """The Casts a rewrite adds; ``count``: how many."""

    def __init__(self) -> None:
        self.made: dict[tuple[int, int, ir.DataType], ir.Value] = {}
        self.count = 0

    def cast(self, value: ir.Value, to: ir.DataType, graph: ir.Graph, before: ir.Node | None = None,
             after: ir.Node | None = None) -> ir.Value:
        """``value`` cast to ``to`` in ``graph``, the Cast put before ``before``, after ``after``, or
        last; the one made before for the same value and dtype if any."""
        key = (id(graph), id(value), to)
        if key not in self.made:
            node = ir.node("Cast", [value], {"to": int(to)}, name=f"{value.name}_to_{to.name.lower()}")
            out = node.outputs[0]
            out.name, out.type, out.shape = f"{value.name}_{to.name.lower()}", ir.TensorType(to), value.shape
            if before is not None:
                graph.insert_before(before, node)
            elif after is not None:
                graph.insert_after(after, node)
            else:
                graph.append(node)
            self.made[key] = out
            self.count += 1
        return self.made[key]
