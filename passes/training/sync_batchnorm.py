"""``gc.nn.SyncBatchNorm`` in training mode: the batch statistics of every data-parallel worker's
shard together, as torch's SyncBatchNorm under DDP.

Each training-mode BatchNormalization marked ``SYNC_BATCHNORM_KEY`` is written out, before
autodiff, in primitive ops around one exchange: every worker's count, mean and sum of squared
deviations from that mean, gathered by ``EXCHANGE_KEY`` Identities marked ``"gather"`` (the
identity in one process) and combined by Chan et al.'s parallel formula (M2 = sum M2_i + sum n_i
(mean_i - mean)^2), as torch's ``batch_norm_gather_stats_with_counts``. The local statistics are
taken about the layer's running mean ``s`` (every worker holds the same), as d_i = mean_i - s:
the combination's cancellation then scales with |mean - s|, not |mean| (float32, mean 1000,
std 1, shards of 7 and 5 rows, against float64: gradients 1e-4 of their largest off with s = 0,
as torch's float32 BatchNorm2d, 3e-7 with s at the mean, where the two-exchange two-pass form
was 6e-5). Autodiff differentiates the ops, a gather's adjoint the workers'
cotangents summed, each taking its own row (``"gather_grad"``, ``rules_elementwise.grad_identity``):
one exchange back. The running statistics are updated from the global mean and the global
unbiased variance (torch's count: every worker's values), as ``modes`` updates a plain
BatchNorm's. A SyncBatchNorm without running statistics (plain ops whose mean, centring and
variance nodes are marked, ``ops_nn.batch_statistics_norm``) has its centring and variance
replaced the same way, about each worker's own mean (gathered too, the statistics rebased to
worker 0's: float32, mean 1000, 2.4e-7 of the largest gradient off, where 0 as the shift was
5.4e-4 and torch's float32 2.6e-4). ``stages.split`` cuts the graph at the exchanges for a staged run.

The backward of such a graph is seeded ``LOSS_SEED`` (an initializer, 1) times the loss's
gradient: a worker whose shard counts for nothing in the loss (every label ignored) feeds 0, so
its gradients are the other workers' loss's through the exchanges alone (``runtime.staged``).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import Emitter
from graphc.passes.training.modes import replace_training_batchnorm, training_axes, values_per_channel
from graphc.passes.infer import infer
from graphc.errors import PassError
from graphc.passes.values import (EXCHANGE_KEY, STOP_GRADIENT_KEY, SYNC_BATCHNORM_KEY, exact_float,
                                   exchange_kind, replace_value)

LOSS_SEED = "graphc.loss_seed"  # the backward's seed factor of a graph with SyncBatchNorms (module docstring)
WORKERS = "graphc_workers"  # the leading dim of a gathered value


def write_out(b: Emitter, graph: ir.Graph) -> dict[str, ir.Value]:
    """Every training-mode SyncBatchNorm of ``graph`` written out, in place (module docstring);
    returns {running statistic (or counter) name: its updated value}."""
    updated: dict[str, ir.Value] = {}
    for node in list(graph):
        mark = node.metadata_props.get(SYNC_BATCHNORM_KEY)
        if (mark and node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx")
                and node.attributes.get_int("training_mode", 0)):
            updated.update(_write_out(b, graph, node))
        elif mark == "centred":
            _write_out_batch_statistics(b, graph, node)
    return updated


def unmarked(model: ir.Model) -> ir.Model | None:
    """A copy of ``model`` whose SyncBatchNorms are plain BatchNorms (for the one-process
    ``train_step``), or None when it has none."""
    if not any(node.metadata_props.get(SYNC_BATCHNORM_KEY) for node in model.graph):
        return None
    plain = model.clone()
    for node in plain.graph:
        node.metadata_props.pop(SYNC_BATCHNORM_KEY, None)
    return plain


def loss_seed(graph: ir.Graph, loss: ir.Value) -> ir.Value:
    """``LOSS_SEED``, a scalar initializer 1 in the loss's dtype, added to ``graph``."""
    value = ir.Value(name=LOSS_SEED, const_value=ir.tensor(np.ones((), loss.dtype.numpy()), name=LOSS_SEED),
                     type=ir.TensorType(loss.dtype), shape=ir.Shape([]))
    graph.register_initializer(value)
    return value


def gather(b: Emitter, value: ir.Value) -> ir.Value:
    """Every data-parallel worker's ``value`` ([1, ...]) stacked in rank order ([workers, ...]): an
    Identity marked ``"gather"``, whose adjoint (autodiff) is the workers' cotangents summed, each
    worker taking its own row back."""
    out = b.op("Identity", value)
    out.producer().metadata_props[EXCHANGE_KEY] = "gather"
    out.dtype, out.shape = value.dtype, ir.Shape([WORKERS, *value.shape[1:]])
    return out


def widen(graph: ir.Graph, opset: int) -> None:
    """The gathered values' leading dim back to ``WORKERS`` after ONNX shape inference (which
    types a gather, an Identity, as its [1, ...] input), and the shapes of the values computed
    from them inferred again, so autodiff reduces their cotangents to [workers, ...], not [1, ...]."""
    wide: set[ir.Value] = set()
    for node in graph:
        if exchange_kind(node) == "gather":
            node.outputs[0].shape = ir.Shape([WORKERS, *node.inputs[0].shape[1:]])
        elif any(v in wide for v in node.inputs):
            for out, (_, shape) in zip(node.outputs, infer(node, opset)):
                out.shape = None if shape is None else ir.Shape(shape)
        else:
            continue
        wide.update(v for v in node.outputs if v.shape is not None and WORKERS in [str(d) for d in v.shape])


def _write_out(b: Emitter, graph: ir.Graph, node: ir.Node) -> dict[str, ir.Value]:
    x, scale, bias, shift = node.inputs[:4]
    axes = training_axes(node)
    per_channel = b.ints([-1] + [1] * (len(axes) - 1))
    shift = b.op("Reshape", shift if shift.dtype == x.dtype else b.op("Cast", shift, to=x.dtype), per_channel)
    centred, var, d, total = _combined(b, graph, x, shift, axes)
    eps = b.scalar(exact_float(node, "epsilon", 1e-5), x)
    y = b.op("Mul", centred, b.op("Reciprocal", b.op("Sqrt", b.op("Add", var, eps))))
    for op, param in (("Mul", scale), ("Add", bias)):
        param = param if param.dtype == x.dtype else b.op("Cast", param, to=x.dtype)
        y = b.op(op, y, b.op("Reshape", param, per_channel))
    mean = b.op("Add", b.squeeze(d, axes), b.op("Reshape", shift, b.ints([-1])))
    return replace_training_batchnorm(b, graph, node, y, mean, b.squeeze(var, axes), b.op("Reshape", total, b.ints([1])))


def _write_out_batch_statistics(b: Emitter, graph: ir.Graph, node: ir.Node) -> None:
    """A SyncBatchNorm without running statistics (plain ops, ``ops_nn.batch_statistics_norm``):
    its centring (``node``, x - mean) and its variance replaced by the workers' together. The shift
    is this worker's own mean (no gradient: the result does not depend on it), gathered with the
    statistics, which are rebased to worker 0's shift before they are combined."""
    x, variance = node.inputs[0], _variance(node)
    axes = [0, *range(2, len(x.shape))]
    own = b.op("Identity", _mean(b, x, values_per_channel(b, graph, x), axes))
    own.producer().metadata_props[STOP_GRADIENT_KEY] = "true"
    centred, var, _, _ = _combined(b, graph, x, own, axes, own_shift=True)
    replace_value(node.outputs[0], centred)
    replace_value(variance.outputs[0], var)


def _mean(b: Emitter, x: ir.Value, count: ir.Value, axes: list[int]) -> ir.Value:
    """x's mean over ``axes`` (kept) of ``count`` values; 0 for none."""
    return b.op("Div", b.reduce("ReduceSum", x, axes), b.op("Max", count, b.scalar(1.0, x)))


def _variance(centring: ir.Node) -> ir.Node:
    """The node marked "variance" nearest after ``centring`` (its mean of squares)."""
    seen, frontier = set(), [centring]
    while frontier:
        nodes = [use.node for n in frontier for v in n.outputs for use in v.uses()]
        for n in nodes:
            if n.metadata_props.get(SYNC_BATCHNORM_KEY) == "variance":
                return n
        frontier = [n for n in nodes if n not in seen]
        seen.update(frontier)
    raise PassError(f"SyncBatchNorm centring node {centring.name!r}: no variance node marked after it")


def _combined(b: Emitter, graph: ir.Graph, x: ir.Value, shift: ir.Value, axes: list[int],
              own_shift: bool = False) -> tuple[ir.Value, ...]:
    """x - mean, the biased variance, mean - shift (kept dims) and the count over every worker's
    shard, from one exchange (module docstring); ``own_shift``: each worker's ``shift`` is its own,
    gathered too, the statistics taken about worker 0's."""
    # this worker's count n_i, mean (s + d_i) and sum of squares about it (m2_i), in x - s
    shifted = b.op("Sub", x, shift)
    count = values_per_channel(b, graph, x)
    d_i = _mean(b, shifted, count, axes)
    local = b.op("Sub", shifted, d_i)
    m2_i = b.reduce("ReduceSum", b.op("Mul", local, local), axes)
    # every worker's, combined by Chan et al.'s parallel formula
    counts = gather(b, b.op("Reshape", count, b.ints([1] * (len(axes) + 1))))
    ds = gather(b, d_i)
    if own_shift:  # each mean about worker 0's shift: the shifts' differences are exact when they are close
        shifts = gather(b, shift)
        first = b.op("Gather", shifts, b.ints([0]), axis=0)
        d_i, ds = b.op("Add", d_i, b.op("Sub", shift, first)), b.op("Add", ds, b.op("Sub", shifts, first))
    total = b.reduce("ReduceSum", counts, [0])
    d = b.op("Div", b.reduce("ReduceSum", b.op("Mul", counts, ds), [0]), total)
    apart = b.op("Sub", ds, d)
    m2 = b.op("Add", b.reduce("ReduceSum", gather(b, m2_i), [0]),
              b.reduce("ReduceSum", b.op("Mul", counts, b.op("Mul", apart, apart)), [0]))
    var = b.op("Div", m2, total)
    return b.op("Add", local, b.op("Sub", d_i, d)), var, d, total
