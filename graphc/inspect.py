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
    lines = [f"model {model.name!r}  opset {model.opset}  ir_version {model.ir_version}"]
    lines += [f"  input  {s}" for s in model.inputs]
    lines += [f"  output {s}" for s in model.outputs]
    elems, nbytes = param_stats(model)
    lines.append(f"  params {elems:,} ({nbytes:,} bytes) in {len(model.ir.graph.initializers)} tensors")
    hist = op_histogram(model.ir.graph)
    lines.append(f"  nodes  {sum(hist.values())}: " + ", ".join(f"{op} {n}" for op, n in hist.most_common()))
    return "\n".join(lines)


# -- FLOPs ----------------------------------------------------------------------------------------

FLOP_OPS = ("MatMul", "Gemm", "Conv")


def value_shapes(model: "Model", dims: dict[str, int] | None = None, default_dim: int = 1) -> dict[str, list | None]:
    """Shapes of every main-graph value (ONNX shape inference fills what the file lacks), with
    symbolic dims replaced by ``dims`` (else ``default_dim``)."""
    import onnx

    dims = dims or {}
    proto = model.proto
    try:
        proto = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # noqa: BLE001 - an imported model inference cannot handle: use what it has
        pass
    shapes: dict[str, list | None] = {}
    for info in [*proto.graph.input, *proto.graph.value_info, *proto.graph.output]:
        tt = info.type.tensor_type
        if not tt.HasField("shape"):
            shapes[info.name] = None
            continue
        shapes[info.name] = [d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, default_dim)
                             for d in tt.shape.dim]
    for init in proto.graph.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


def estimate_flops(model: "Model", dims: dict[str, int] | None = None) -> dict[str, int]:
    """Estimated floating-point operations (a multiply-add counts 2) of MatMul, Gemm and Conv
    nodes of the main graph, by op type. Nodes whose shapes are unknown are skipped."""
    import math

    shapes = value_shapes(model, dims)
    flops: Counter = Counter()
    for node in model.ir.graph:
        if node.op_type not in FLOP_OPS or not node.outputs:
            continue
        out = shapes.get(node.outputs[0].name)
        ins = [shapes.get(v.name) if v is not None else None for v in node.inputs]
        if out is None or any(s is None for s in ins[:2]):
            continue
        if node.op_type == "MatMul":
            k = ins[0][-1]
        elif node.op_type == "Gemm":
            trans_a = node.attributes.get("transA")
            k = ins[0][0] if trans_a is not None and trans_a.value else ins[0][-1]
        else:  # Conv: each output element is a dot product over in/groups * kernel
            k = math.prod(ins[1][1:])
        flops[node.op_type] += 2 * math.prod(out) * k
    return dict(flops)
