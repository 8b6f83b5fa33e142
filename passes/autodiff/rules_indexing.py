"""VJP rules of the indexing ops: Gather, GatherElements, GatherND, ScatterElements, ScatterND and OneHot.

A gradient that sums dy into positions an index may repeat (an embedding's rows) is never a
reducing ScatterND, which onnxruntime's CPU provider runs with a race (``graphc.passes.scatters``;
rechecked on 1.31: dW [2048, 256] from 4,096 ids off by up to 3.0 at 2 threads, exact at 1).
Gather's along axis 0 sorts its rows when dy has ``SORTED_FROM`` values or more, or a size known
only at run time, and data is not float64 (``scatters.sorted_row_sums``: TopK, float64 CumSum, one
Gather of the runs' ends, a ScatterND of unique rows); else it is a ScatterElements (add) of dy at
the expanded indices. dW = sum of dY [N, D] rows into [V, D] on ort-cpu, ms, median (min) of 20
interleaved runs on 2 loaded cores, errors against float64 np.add.at:

    V, D, N               threads  ScatterElements  ScatterND(add)  one-hot Gemm   sorted (f64 CumSum)
    100, 16, 64 (tiny)    1        0.010            0.006           0.010          0.013
    2048, 256, 16         1        0.178            0.148           0.185          0.196
    2048, 256, 256 (GPT   1        0.471 (0.410)    0.169           1.705          0.359 (0.327)
      tokens, batch 2)    2        0.501 (0.444)    0.263           11.5 (1.65)    0.544 (0.384)
    2048, 256, 4096 (GPT  1        10.5 (6.03)      0.393           42.5 (38.5)    2.52 (2.24)
      tokens, batch 32)   2        64.0 (24.0)      0.577, off 2.8  232 (121)      29.1 (2.80)
    1000, 256, 2048 (LSTM 1        3.70 (2.61)      0.159           10.1 (5.84)    1.07 (1.00)
      LM, 16 x 128)       2        38.3 (4.89)      0.298 (racy)    43.7 (30.4)    1.22 (1.04)
    50000, 256, 4096      1        21.5 (11.8)      6.86 (3.73)     -              14.6 (6.71)
                          2        49.0 (25.7)      15.5, off 1.8   -              30.4 (11.2)

max error: ScatterElements 1.0e-6 (float32 adds in index order), sorted 4.8e-7 (rounded once);
float32 prefix sums instead lost 3e-5; Unique for the runs and a second Gather (their starts, from
the prefix sums behind a zero row) cost 25% more. ScatterND's 0.4 ms is the race's. The one-hot Gemm
(N * V * D flops) loses everywhere but the tiny shape. bench_zoo's GPT has no second Gather: its
positions are a Parameter added whole.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from graphc.errors import GraphError
from graphc.passes.autodiff.builder import GradBuilder, attr, static_shape
from graphc.passes.autodiff.registry import grad_rule
from graphc.passes.scatters import merged_shape, non_negative, scatter_tuples, sorted_row_sums
from graphc.passes.values import StaticShape, const_array

ADD_SCATTER = "ScatterElements with reduction='add'"
SORTED_FROM = 2 ** 15  # dy's size from which an embedding's gradient sorts its rows (module docstring)


@grad_rule("Gather")
def grad_gather(g, node, dy):
    # y = data[..., idx, ...] along `axis`: dy, its index axes merged into one, summed into zeros
    # along the same axis at the flattened indices (see the module docstring).
    data, idx = node.inputs
    r, q = g.rank(data), g.rank(idx)
    axis = attr(node, "axis", 0) % r
    shape = static_shape(data)
    inverse = _inverse_permutation(idx, shape[axis] if shape else None)
    if q != 1:
        dy = g.op("Reshape", dy, merged_shape(g, dy, axis, axis + q))
    if inverse is not None:  # each index once: dy gathered back by the inverse permutation
        return g.op("Gather", dy, g.const(inverse, np.int64), axis=axis), None
    idx = non_negative(g, idx, g.dim(data, axis))
    if _sorts(data, dy, axis):
        flat = g.op("Reshape", idx if idx.dtype == ir.DataType.INT64 else g.op("Cast", idx, to=ir.DataType.INT64), g.ints([-1]))
        return sorted_row_sums(g, g.zeros_like(data), flat, dy), None
    g.require_opset(16, ADD_SCATTER)
    flat = g.op("Reshape", idx, g.ints([1] * axis + [-1] + [1] * (r - axis - 1)))
    spread = g.op("Expand", flat, g.op("Shape", dy))
    return g.scatter_elements(g.zeros_like(data), spread, dy, axis), None


def _sorts(data: ir.Value, dy: ir.Value, axis: int) -> bool:
    """Whether the sum of dy's rows into data's goes through ``sorted_row_sums``: along axis 0, for
    data not float64 (its prefix sums could not be wider), and dy of 2**15 values or more, or of a
    size known only at run time (see the module docstring)."""
    shape = static_shape(dy)
    size = math.prod(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None
    return axis == 0 and data.dtype != ir.DataType.DOUBLE and (size is None or size >= SORTED_FROM)


def _inverse_permutation(idx: ir.Value, dim) -> np.ndarray | None:
    """The inverse of a constant index that names each of an axis's ``dim`` positions once (a
    layout change written as a Gather, ``dense_conv``'s weight rows); else None."""
    known = const_array(idx)
    if known is None or not isinstance(dim, int) or known.size != dim:
        return None
    flat = np.where(known < 0, known + dim, known).ravel()
    if not np.array_equal(np.sort(flat), np.arange(dim)):
        return None
    return np.argsort(flat)


@grad_rule("GatherElements")
def grad_gather_elements(g, node, dy):
    data, idx = node.inputs
    g.require_opset(16, ADD_SCATTER)
    zeros = g.zeros_like(data)
    return g.scatter_elements(zeros, idx, dy, attr(node, "axis", 0)), None


def scattered(dy: ir.Value) -> tuple[ir.Value, ir.Value, int] | None:
    """(indices, updates, axis) where ``dy`` is ``ScatterElements(zeros, indices, updates, axis,
    reduction="add")``, GatherElements' gradient; else None. A rule that reads dy only through sums
    along ``axis`` and elementwise terms can keep it sparse (``rules_reduce.grad_log_softmax``)."""
    node, shape = dy.producer(), static_shape(dy)
    if node is None or node.op_type != "ScatterElements" or attr(node, "reduction") != "add" or not shape:
        return None
    zeros, (idx, updates) = node.inputs[0].producer(), node.inputs[1:3]
    if zeros is None or zeros.op_type != "ConstantOfShape":
        return None
    fill, axis = attr(zeros, "value"), attr(node, "axis", 0) % len(shape)
    spread = static_shape(updates)  # dy's shape off the axis: a sum along it broadcasts back
    if (fill is not None and fill.numpy().any()) or spread is None or len(spread) != len(shape) or any(
            a is None or a != b for i, (a, b) in enumerate(zip(spread, shape)) if i != axis):
        return None
    return idx, updates, axis


@grad_rule("GatherND")
def grad_gather_nd(g, node, dy):
    # dy goes back to the slices the index tuples name (repeated tuples accumulate), the
    # batch_dims leading axes shared: ScatterND(zeros, idx, dy, "add") written race-free.
    data, idx = node.inputs
    g.require_opset(16, ADD_SCATTER)
    sidx = _tuples_shape(g, node)
    b = attr(node, "batch_dims", 0)
    if sidx[-1] == 0:  # empty tuples: each names all of data[B...], so dy sums over idx's M axes
        return g.reduce("ReduceSum", dy, list(range(b, len(sidx) - 1)), keepdims=False), None
    return scatter_tuples(g, g.zeros_like(data), idx, dy, b), None


def _tuples_shape(g: GradBuilder, node: ir.Node) -> StaticShape:
    """The static shape of a GatherND's or ScatterND's indices, whose last dim (the length of its
    index tuples) must be known, as must the rank of its data; a GraphError naming them if not."""
    data, idx = node.inputs[:2]
    sidx = static_shape(idx)
    if sidx is None or not isinstance(sidx[-1], int):
        raise GraphError(f"gradient of {node.op_type} {node.name!r} needs the length of its index tuples (the last "
                         f"dim of {idx.name!r}), got shape {sidx}")
    g.rank(data)  # known, or a clear error
    return sidx


@grad_rule("ScatterElements", "ScatterND")
def grad_scatter(g, node, dy):
    # reduction none: dy passes where data was not overwritten (zeros scattered over it) and the
    # updates get dy at their positions (a Gather); "add": data gets all of dy; mul, max, min:
    # ``_grad_scatter_mul``, ``_grad_scatter_extreme``. Duplicate indices without a reduction write in
    # an unspecified order: each update is then given the gradient of its position.
    data, idx, updates = node.inputs
    reduction = attr(node, "reduction", "none")
    if reduction == "mul":
        return _grad_scatter_mul(g, dy, data, updates, *_scatter_gather(g, node))
    if reduction in ("max", "min"):
        return _grad_scatter_extreme(g, dy, data, updates, node.outputs[0], *_scatter_gather(g, node))
    elements = node.op_type == "ScatterElements"
    axis = {"axis": attr(node, "axis", 0)} if elements else {}
    ddata = dupdates = None
    if g.wants(data):
        ddata = dy if reduction == "add" else g.op(node.op_type, dy, idx, g.zeros_like(updates), **axis)
    if g.wants(updates):
        dupdates = g.op("GatherElements" if elements else "GatherND", dy, idx, **axis)
    return ddata, None, dupdates


def _scatter_gather(g, node):
    """(scatter(target, values, reduction), gather(x)) along the node's indices: a reducing scatter
    of values shaped like its updates into a tensor shaped like its data, and the read back."""
    idx = node.inputs[1]
    if node.op_type == "ScatterElements":
        axis = attr(node, "axis", 0)
        return (lambda target, values, reduction: g.scatter_elements(target, idx, values, axis, reduction),
                lambda x: g.op("GatherElements", x, idx, axis=axis))
    _tuples_shape(g, node)
    return (lambda target, values, reduction: scatter_tuples(g, target, idx, values, 0, reduction),
            lambda x: g.op("GatherND", x, idx))


def _grad_scatter_mul(g, dy, data, updates, scatter, gather):
    """y[p] = data[p] * the product of the updates u_j sent to p. data gets dy times that product,
    u_j gets dy * data * the product of the others, written without dividing by a zero: y / u_j
    where no update at p is 0; the product of the rest for the only zero at p; nothing for any
    update at a position with two zeros (as torch's scatter_reduce "prod")."""
    ddata = dupdates = None
    if g.wants(data):
        ddata = g.mul(dy, scatter(g.full(g.shape_of(data), 1.0, data), updates, "mul"))
    if g.wants(updates):
        zero = g.op("Equal", updates, g.scalar(0.0, updates))
        zeros_at = gather(scatter(g.zeros_like(data), g.cast_like(zero, updates), "add"))  # zero updates at u_j's p
        nonzero = scatter(data, g.op("Where", zero, g.scalar(1.0, updates), updates), "mul")
        only_zero = g.cast_like(g.op("Equal", zeros_at, g.scalar(1.0, updates)), updates)
        no_zero = g.cast_like(g.op("Equal", zeros_at, g.scalar(0.0, updates)), updates)
        rest = g.op("Where", zero, only_zero, g.div(no_zero, g.op("Where", zero, g.scalar(1.0, updates), updates)))
        dupdates = g.mul(gather(g.mul(dy, nonzero)), rest)
    return ddata, None, dupdates


def _grad_scatter_extreme(g, dy, data, updates, y, scatter, gather):
    """y[p] = max (min) of data[p] and the updates sent to p: the winners, those equal to y[p],
    share dy[p] evenly (torch's scatter_reduce "amax"/"amin" with include_self=True)."""
    data_wins = g.cast_like(g.op("Equal", data, y), data)
    update_wins = g.cast_like(g.op("Equal", updates, gather(y)), updates)
    share = g.div(dy, scatter(data_wins, update_wins, "add"))
    ddata = g.mul(share, data_wins) if g.wants(data) else None
    dupdates = g.mul(gather(share), update_wins) if g.wants(updates) else None
    return ddata, None, dupdates


@grad_rule("OneHot")
def grad_one_hot(g, node, dy):
    # y = on where the index picks, else off: values = [off, on] gets dy summed over the picked
    # positions (on) and over the rest (off); the indices and depth have none
    indices, depth, values = node.inputs
    if not g.wants(values):
        return None, None, None
    picked = g.op("OneHot", indices, depth, g.const(np.array([0.0, 1.0]), values.dtype), axis=attr(node, "axis", -1))
    on = g.reduce("ReduceSum", g.mul(dy, picked), None, keepdims=False)
    off = g.sub(g.reduce("ReduceSum", dy, None, keepdims=False), on)
    return None, None, g.op("Concat", g.unsqueeze(off, [0]), g.unsqueeze(on, [0]), axis=0)
