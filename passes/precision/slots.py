"""Which dtype each input and output of a node takes in a half-precision model: the target
(float16 or bfloat16) where the op's schema allows it, float32 where the schema fixes float
(Resize's scales) or the node is blocked (no half schema, numerically unsafe, or named by the user)."""

from __future__ import annotations

import onnx
import onnx_ir as ir

FLOAT = ir.DataType.FLOAT
TARGETS = {"float16": ir.DataType.FLOAT16, "bfloat16": ir.DataType.BFLOAT16}

# Ops kept in float32 by default although their schemas allow half: their intermediate (a sum of
# squares) overflows float16's 65504 on ordinary activations. Measured on ort-cpu, rows of 4096
# values ~N(0, 4): ReduceSumSquare gives inf in 3 of 8 rows; ReduceL2's squares sum to 6.7e4 too,
# which kernels that accumulate in the input's type (graphc's numpy backend) overflow.
DEFAULT_BLOCKED = frozenset({"ReduceSumSquare", "ReduceL2"})
CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})


def by_domain(opset_imports: dict[str, int]) -> dict[str, int]:
    """A model's opset imports with the ai.onnx domain under ``""`` (``schema``'s keys)."""
    return {("" if d == "ai.onnx" else d): v for d, v in opset_imports.items()}


def standard(node: ir.Node) -> bool:
    """Whether ``node`` is an ai.onnx op (domain ``""`` or ``"ai.onnx"``)."""
    return node.domain in ("", "ai.onnx")


def is_float(value: ir.Value | None) -> bool:
    """Whether ``value`` is a float32 tensor."""
    return value is not None and isinstance(value.type, ir.TensorType) and value.dtype == FLOAT


def schema(node: ir.Node, opsets: dict[str, int]) -> onnx.defs.OpSchema | None:
    """``node``'s schema at the model's opset of its domain (``opsets``: ``by_domain``'s); None for
    an op onnx does not know."""
    domain = "" if standard(node) else node.domain
    try:
        return onnx.defs.get_schema(node.op_type, opsets.get(domain, 1), domain)
    except onnx.defs.SchemaError:
        return None


def allows(op_schema: onnx.defs.OpSchema, outputs: bool, index: int, target: ir.DataType) -> bool:
    """Whether the schema lets input (or output) ``index`` be a tensor of ``target``."""
    params = op_schema.outputs if outputs else op_schema.inputs
    if not params:
        return False
    if index >= len(params):
        if params[-1].option != onnx.defs.OpSchema.FormalParameterOption.Variadic:
            return False
        index = len(params) - 1
    type_str = params[index].type_str
    allowed = {c.type_param_str: c.allowed_type_strs for c in op_schema.type_constraints}.get(type_str, [type_str])
    return f"tensor({target.name.lower()})" in allowed  # FLOAT16 -> tensor(float16), BFLOAT16 -> tensor(bfloat16)
