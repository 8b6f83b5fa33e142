"""VJP rules of the indexing ops: Gather, GatherElements, GatherND, ScatterElements and ScatterND.

A gradient that sums dy into positions an index may repeat (an embedding's rows) is a
ScatterElements with reduction="add", never a ScatterND: onnxruntime's CPU ScatterND (1.31) splits
its updates between threads with no guard for repeated indices and loses some of the sums. An
embedding's gradient, [2048, 256] from 4,096 tokens (bench_zoo's GPT at batch 32), came out wrong
by up to 3.3 in 11 of 20 runs at 2 threads (exact at 1 thread); ScatterElements, the indices
broadcast along the row, was exact in every one of 40 runs at 2, 4 and 8 threads. It costs more:
12.8 ms there where the racing ScatterND took 0.45 (2 threads; the sum as a one-hot Gemm: 35 ms).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.errors import GraphError
from graphc.passes.autodiff.builder import GradBuilder, attr, const_array, static_shape
from graphc.passes.autodiff.registry import grad_rule

ADD_SCATTER = "ScatterElements with reduction='add'"


def _non_negative(g: GradBuilder, idx: ir.Value, dim: ir.Value | int) -> ir.Value:
    """``idx`` with negative entries counted from the end of an axis of ``dim`` values (left as it is
    when it is a constant with none)."""
    known = const_array(idx)
    if known is not None and not np.any(known < 0):
        return idx
    dim = g.const(dim, np.int64) if isinstance(dim, int) else g.op("Reshape", dim, g.ints([]))
    return g.op("Where", g.op("Less", idx, g.const(0, idx.dtype or np.int64)), g.add(idx, g.cast_like(dim, idx)), idx)


def _merged_shape(g: GradBuilder, x: ir.Value, start: int, stop: int) -> ir.Value:
    """A Reshape target for ``x`` with its axes [start, stop) merged into one: the axes before them
    copied (0), those after them x's own (static, else read off ``Shape``)."""
    shape = static_shape(x)
    after = list(shape[stop:]) if shape is not None else None
    if after is not None and all(isinstance(d, int) for d in after):
        return g.ints([0] * start + [-1] + after)
    rest = g.op("Slice", g.op("Shape", x), g.ints([stop]), g.ints([2 ** 62]))
    return g.op("Concat", g.ints([0] * start + [-1]), rest, axis=0)


def _add_into(g: GradBuilder, zeros: ir.Value, idx: ir.Value, dy: ir.Value, axis: int) -> ir.Value:
    """``zeros`` plus each slice of ``dy`` along ``axis`` at the position ``idx`` (broadcast to dy's
    shape) names: repeated positions accumulate."""
    spread = g.op("Expand", idx, g.op("Shape", dy))
    return g.op("ScatterElements", zeros, spread, dy, axis=axis, reduction="add")


@grad_rule("Gather")
def grad_gather(g, node, dy):
    # y = data[..., idx, ...] along `axis`: dy, its index axes merged into one, summed into zeros
    # along the same axis at the flattened indices (see the module docstring).
    data, idx = node.inputs
    g.require_opset(16, ADD_SCATTER)
    r, q = g.rank(data), g.rank(idx)
    axis = attr(node, "axis", 0) % r
    idx = _non_negative(g, idx, g.dim(data, axis))
    if q != 1:
        dy = g.op("Reshape", dy, _merged_shape(g, dy, axis, axis + q))
    flat = g.op("Reshape", idx, g.ints([1] * axis + [-1] + [1] * (r - axis - 1)))
    return _add_into(g, g.zeros_like(data), flat, dy, axis), None


@grad_rule("GatherElements")
def grad_gather_elements(g, node, dy):
    data, idx = node.inputs
    g.require_opset(16, ADD_SCATTER)
    zeros = g.zeros_like(data)
    return g.op("ScatterElements", zeros, idx, dy, axis=attr(node, "axis", 0), reduction="add"), None


@grad_rule("GatherND")
def grad_gather_nd(g, node, dy):
    # dy goes back to the slices the index tuples name. A tuple over data's axes [b, b + k) (after
    # the b batch axes) is one position over those axes merged (Horner's rule, negative entries
    # counted from the end); dy, its tuple axes merged, is summed along axis b into zeros with
    # those k axes merged (repeated tuples accumulate), then shaped as data.
    data, idx = node.inputs
    g.require_opset(16, ADD_SCATTER)
    b, r, sidx = attr(node, "batch_dims", 0), g.rank(data), static_shape(idx)
    if sidx is None or not isinstance(sidx[-1], int):
        raise GraphError(f"gradient of GatherND {node.name!r} needs the length of its index tuples (the last dim "
                         f"of {idx.name!r}), got shape {sidx}")
    q, k = len(sidx), sidx[-1]
    idx = idx if idx.dtype == ir.DataType.INT64 else g.op("Cast", idx, to=int(ir.DataType.INT64))
    flat = None
    for j in range(k):
        dim = g.dim(data, b + j)
        part = _non_negative(g, g.op("Slice", idx, g.ints([j]), g.ints([j + 1]), g.ints([-1])), dim)
        flat = part if flat is None else g.add(g.mul(flat, g.const(dim, np.int64) if isinstance(dim, int) else dim), part)
    flat = g.op("Reshape", flat, g.ints([0] * b + [-1] + [1] * (r - b - k)))
    zeros = g.op("Reshape", g.zeros_like(data), _merged_shape(g, data, b, b + k))
    summed = _add_into(g, zeros, flat, g.op("Reshape", dy, _merged_shape(g, dy, b, q - 1)), b)
    return g.reshape_like(summed, data), None


@grad_rule("ScatterElements", "ScatterND")
def grad_scatter(g, node, dy):
    # reduction none: dy passes where data was not overwritten (zeros scattered over it) and the
    # updates get dy at their positions (a Gather); "add": data gets all of dy. The other
    # reductions (mul, max, min) have no rule. Duplicate indices without a reduction write in an
    # unspecified order: each update is then given the gradient of its position.
    data, idx, updates = node.inputs
    reduction = attr(node, "reduction", "none")
    if reduction not in ("none", "add"):
        raise GraphError(f"gradient of {node.op_type} {node.name!r} with reduction={reduction!r} is not supported")
    elements = node.op_type == "ScatterElements"
    axis = {"axis": attr(node, "axis", 0)} if elements else {}
    ddata = dupdates = None
    if g.wants(data):
        ddata = dy if reduction == "add" else g.op(node.op_type, dy, idx, g.zeros_like(updates), **axis)
    if g.wants(updates):
        dupdates = g.op("GatherElements" if elements else "GatherND", dy, idx, **axis)
    return ddata, None, dupdates
