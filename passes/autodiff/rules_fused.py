"""Backward rules of fused kernels that a pass wrote out as several ONNX nodes (``FUSED_RULES``): the
kernel's own backward, with its roundings, where the nodes' rules would round elsewhere.

``cpu_flash_attention``: torch's CPU flash attention on bfloat16/float16 q, k, v, as autocast's
rewrite writes it (``precision/autocast_kernels``): ``s`` the scores, ``p = Softmax(s)`` and
``r = ReduceMax(p)`` in float32, the output ``MatMul(round(p / r), v) * r``, rounded. torch's
backward recomputes ``p`` in float32 and, with ``dy`` the output's gradient and ``o`` the rounded
output, takes ``dv = round(p)^T @ dy`` and ``ds = round(p * (dy @ v^T - rowsum(dy * o)))``, each
product accumulated in float32 (``dv``, and ``ds @ k`` and ``ds^T @ q`` after it, rounded where the
Casts of v, q and k send them back). The nodes' own rules differ from it by bfloat16's rounding:
they round ``dy @ v^T`` and differentiate through ``r``, which cancels only in exact arithmetic
(the in-projection's gradient of a transformer block 3.5e-3 off torch's, against 4e-8 for the other params).
"""

from __future__ import annotations

import onnx_ir as ir

from graphc.errors import AutodiffError
from graphc.passes.autodiff.builder import GradBuilder, static_shape
from graphc.passes.autodiff.registry import fused_grad_rule

FLOAT = ir.DataType.FLOAT


def _made_by(value: ir.Value, op_type: str, kernel: ir.Node) -> ir.Node:
    node = value.producer()
    if node is None or node.op_type != op_type:
        raise AutodiffError(f"node {kernel.name!r} ends a cpu_flash_attention kernel, but its value {value.name!r} "
                            f"is not a {op_type}'s output (got {'none' if node is None else node.op_type})")
    return node


def _rounded(g: GradBuilder, x: ir.Value, low: ir.DataType) -> ir.Value:
    """``x`` (float32) rounded to ``low`` and read as float32."""
    return g.op("Cast", g.op("Cast", x, to=int(low)), to=int(FLOAT))


@fused_grad_rule("cpu_flash_attention")
def grad_cpu_flash_attention(g, node, dy):
    unnormalized, v = _made_by(node.inputs[0], "MatMul", node).inputs
    low = _made_by(_made_by(unnormalized, "Cast", node).inputs[0], "Cast", node).outputs[0].dtype
    p = _made_by(node.inputs[1], "ReduceMax", node).inputs[0]
    s = _made_by(p, "Softmax", node).inputs[0]
    out = _rounded(g, node.outputs[0], low)
    rowsum = g.reduce("ReduceSum", g.mul(dy, out), [-1])
    ds = _rounded(g, g.mul(p, g.sub(g.op("MatMul", dy, g.swap_last(v)), rowsum)), low)
    dv = g.op("MatMul", g.swap_last(_rounded(g, p, low)), dy)
    shape_p, shape_dy = static_shape(p), static_shape(dy)
    return {s: ds, v: g.broadcast_from(dv, (*shape_dy[:-2], shape_p[-1], shape_dy[-1]))}
