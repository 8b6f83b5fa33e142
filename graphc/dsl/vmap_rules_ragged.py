"""``gc.vmap``'s rules for the ops that read a Loop's per-step outputs of a number of steps that differs
per example (``Batching.ragged``: stacked to the longest, ``(B, T_max, ...)``, the steps an example did
not run zeros), added to ``vmap_rules.RAGGED``: each example's own length is what they see. These are
the reads of ``gc.func.grad``'s backward Loop of a ``gc.while_loop``: the steps' count (``Shape``) and
step ``t`` (``Gather``)."""

from __future__ import annotations

import onnx_ir as ir

from graphc.dsl import ops
from graphc.dsl.vmap_rules import (
    RAGGED,
    RULES,
    Arg,
    Batching,
    NoRule,
    as_batched,
    node_attrs,
    rank_of,
)

__all__: list[str] = []


def _shape(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """The example's shape: its own number of steps for dim 0, per example; dims after it as for any
    batched value."""
    rank = rank_of(node.inputs[0], args[0])
    attrs = node_attrs(node)
    start, end = (min(max(d + rank if d < 0 else d, 0), rank) for d in (attrs.get("start", 0), attrs.get("end", rank)))
    if start > 0 or end <= start:
        return RULES["Shape"](b, node, args)
    lengths = ops.unsqueeze(b.ragged[id(args[0].t.value)], [1])
    if end == 1:
        return [Arg(lengths, True)]
    rest = ops.emit("Shape", [args[0].t], {"start": 2, "end": end + 1})
    rest = ops.emit("Expand", [ops.unsqueeze(rest, [0]), ops.concat([b.batch_shape(), ops.const_i64([end - 1])])])
    return [Arg(ops.concat([lengths, rest], axis=1), True)]


def _gather(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """Steps picked by index (``Gather`` along dim 0): a negative index counted from the example's own
    last step."""
    data, idx = args
    if node_attrs(node).get("axis", 0) % rank_of(node.inputs[0], data) != 0:
        raise NoRule("a Gather of a Loop's per-step outputs along a dim other than the steps")
    lengths = b.ragged[id(data.t.value)]
    idx_rank = rank_of(node.inputs[1], idx)
    index = as_batched(b, idx)
    lengths = ops.unsqueeze(lengths, list(range(1, idx_rank + 1))) if idx_rank else lengths
    zero = ops.scalar(0, index)
    index = ops.emit("Where", [ops.emit("Less", [index, zero]), index + ops.cast(lengths, index.dtype), index])
    return RULES["Gather"](b, node, [data, Arg(index, True)])


RAGGED.update({"Shape": _shape, "Gather": _gather})
