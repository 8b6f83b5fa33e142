"""Model statistics for `Model.summary()` and `graphc inspect`: op histogram, parameters."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
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


def _typed_values(graph):
    return [*graph.input, *graph.value_info, *graph.output]


def symbolic_dims(model: "Model") -> set[str]:
    """The dim names (``N``, ``batch``) in the shapes of the main graph's values."""
    return {d.dim_param for info in _typed_values(model.proto.graph) for d in info.type.tensor_type.shape.dim
            if d.HasField("dim_param") and d.dim_param}


def value_shapes(model: "Model", dims: dict[str, int] | None = None, default_dim: int = 1) -> dict[str, list | None]:
    """Shapes of every main-graph value for the given sizes of its dim names (``default_dim``
    for a name not in ``dims``). The sizes are set into the model before ONNX shape inference
    (with data propagation), so shapes computed from them follow, e.g. the ``-1`` of a
    ``reshape((-1, 1, 8, 8))``; a dim that inference still cannot tell is None."""
    import onnx

    dims = dims or {}
    proto = model.proto
    for info in _typed_values(proto.graph):
        for d in info.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                d.dim_value = dims.get(d.dim_param, default_dim)
    try:
        proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception:  # noqa: BLE001 - an imported model inference cannot handle: use what it has
        pass
    shapes: dict[str, list | None] = {}
    for info in _typed_values(proto.graph):
        tt = info.type.tensor_type
        shapes[info.name] = ([d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
                             if tt.HasField("shape") else None)
    for init in proto.graph.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


@dataclass
class FlopsEstimate:
    """``by_op``: FLOPs by op type; ``unknown``: the FLOP nodes whose shapes could not be told
    (not counted); ``defaulted``: dim names not given, counted as 1; ``independent``: the given
    dim names the total does not depend on."""

    by_op: dict[str, int]
    unknown: list[str] = field(default_factory=list)
    defaulted: list[str] = field(default_factory=list)
    independent: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.by_op.values())


def _count_flops(model: "Model", dims: dict[str, int]) -> tuple[dict[str, int], list[str]]:
    import math

    shapes = value_shapes(model, dims)
    flops: Counter = Counter()
    unknown = []
    for node in model.ir.graph:
        if node.op_type not in FLOP_OPS or not node.outputs:
            continue
        out = shapes.get(node.outputs[0].name)
        ins = [shapes.get(v.name) if v is not None else None for v in node.inputs]
        if any(s is None or None in s for s in [out, *ins[:2]]):
            unknown.append(node.name or node.op_type)
            continue
        if node.op_type == "MatMul":
            k = ins[0][-1]
        elif node.op_type == "Gemm":
            trans_a = node.attributes.get("transA")
            k = ins[0][0] if trans_a is not None and trans_a.value else ins[0][-1]
        else:  # Conv: each output element is a dot product over in/groups * kernel
            k = math.prod(ins[1][1:])
        flops[node.op_type] += 2 * math.prod(out) * k
    return dict(flops), unknown


def flops_estimate(model: "Model", dims: dict[str, int] | None = None) -> FlopsEstimate:
    """Estimated floating-point operations (a multiply-add counts 2) of the MatMul, Gemm and
    Conv nodes of the main graph for the dim sizes ``dims``. A name in ``dims`` the model does
    not have raises ``InputError`` (listing the names it has)."""
    from graphc.errors import InputError

    dims = dict(dims or {})
    names = symbolic_dims(model)
    unknown_names = sorted(set(dims) - names)
    if unknown_names:
        raise InputError(f"the model has no dim named {', '.join(map(repr, unknown_names))}; its dim names: "
                         f"{', '.join(sorted(names)) or 'none (every dim is fixed)'}")
    by_op, unknown = _count_flops(model, dims)
    total = sum(by_op.values())
    independent = [n for n, size in dims.items() if sum(_count_flops(model, {**dims, n: size + 1})[0].values()) == total]
    return FlopsEstimate(by_op, unknown, sorted(names - set(dims)), independent)


def estimate_flops(model: "Model", dims: dict[str, int] | None = None) -> dict[str, int]:
    """``flops_estimate(model, dims).by_op``."""
    return flops_estimate(model, dims).by_op
