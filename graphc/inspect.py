"""Model statistics for `Model.summary()` and `graphc inspect`: op histogram, parameters."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import onnx_ir as ir

if TYPE_CHECKING:
    from graphc.model import Model


def op_histogram(graph: ir.Graph) -> Counter:
    """Op types of every node, subgraphs included."""
    counts: Counter = Counter()
    for node in ir.traversal.RecursiveGraphIterator(graph):
        counts[node.op_type if not node.domain else f"{node.domain}::{node.op_type}"] += 1
    return counts


def param_stats(model: "Model") -> tuple[int, int]:
    """(element count, bytes) of all initializers."""
    elems = nbytes = 0
    for value in model.ir.graph.initializers.values():
        if value.const_value is not None:
            elems += value.const_value.size
            nbytes += value.const_value.nbytes
    return elems, nbytes


def summary(model: "Model") -> str:
    lines = [f"model {model.name!r}  opset {model.opset}  ir_version {model.proto.ir_version}"]
    lines += [f"  input  {s}" for s in model.inputs]
    lines += [f"  output {s}" for s in model.outputs]
    elems, nbytes = param_stats(model)
    lines.append(f"  params {elems:,} ({nbytes:,} bytes) in {len(model.ir.graph.initializers)} tensors")
    hist = op_histogram(model.ir.graph)
    lines.append(f"  nodes  {sum(hist.values())}: " + ", ".join(f"{op} {n}" for op, n in hist.most_common()))
    return "\n".join(lines)
