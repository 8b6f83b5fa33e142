"""``gc.nn.SyncBatchNorm`` in training mode: the batch statistics of every data-parallel worker's
shard together, as torch's SyncBatchNorm under DDP.

Each training-mode BatchNormalization marked ``SYNC_BATCHNORM_KEY`` is written out, before
autodiff, in primitive ops around three all-reduce points (``ALL_REDUCE_KEY`` Identities, the
identity in one process): the values per channel and ``sum(x)`` (one exchange), then
``sum((x - mean)^2)`` over the global mean (a second one: the two-pass variance, exact where
``sum(x^2) - n*mean^2`` cancels). Autodiff differentiates the ops, each all-reduce's gradient an
all-reduce of the cotangents (``rules_elementwise.grad_identity``), so the backward's per-channel
sums are summed over the workers too. The running statistics are updated from the global mean
and the global unbiased variance (torch's count: every worker's values), as ``modes`` updates a
plain BatchNorm's. ``stages.split`` cuts the graph at the all-reduce points for a staged run.

The backward of such a graph is seeded ``LOSS_SEED`` (an initializer, 1) times the loss's
gradient: a worker whose shard counts for nothing in the loss (every label ignored) feeds 0, so
its gradients are the other workers' loss's through the exchanges alone (``runtime.staged``).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import Emitter
from graphc.passes.training.modes import replace_training_batchnorm, training_axes, values_per_channel
from graphc.passes.values import ALL_REDUCE_KEY, SYNC_BATCHNORM_KEY

LOSS_SEED = "graphc.loss_seed"  # the backward's seed factor of a graph with SyncBatchNorms (module docstring)


def write_out(b: Emitter, graph: ir.Graph) -> dict[str, ir.Value]:
    """Every training-mode SyncBatchNorm of ``graph`` written out, in place (module docstring);
    returns {running statistic (or counter) name: its updated value}."""
    updated: dict[str, ir.Value] = {}
    for node in list(graph):
        if (node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx")
                and node.attributes.get_int("training_mode", 0) and node.metadata_props.get(SYNC_BATCHNORM_KEY)):
            updated.update(_write_out(b, graph, node))
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


def all_reduce(b: Emitter, value: ir.Value) -> ir.Value:
    """``value`` summed over the data-parallel workers: an Identity marked ``"sum"``."""
    out = b.op("Identity", value)
    out.producer().metadata_props[ALL_REDUCE_KEY] = "sum"
    out.dtype, out.shape = value.dtype, value.shape
    return out


def _write_out(b: Emitter, graph: ir.Graph, node: ir.Node) -> dict[str, ir.Value]:
    x, scale, bias = node.inputs[:3]
    axes = training_axes(node)
    count = all_reduce(b, values_per_channel(b, graph, x))
    mean = b.op("Div", all_reduce(b, b.reduce("ReduceSum", x, axes)), count)
    centred = b.op("Sub", x, mean)
    var = b.op("Div", all_reduce(b, b.reduce("ReduceSum", b.op("Mul", centred, centred), axes)), count)
    eps = b.scalar(node.attributes.get_float("epsilon", 1e-5), x)
    y = b.op("Mul", centred, b.op("Reciprocal", b.op("Sqrt", b.op("Add", var, eps))))
    per_channel = b.ints([-1] + [1] * (len(axes) - 1))
    for op, param in (("Mul", scale), ("Add", bias)):
        param = param if param.dtype == x.dtype else b.op("Cast", param, to=x.dtype)
        y = b.op(op, y, b.op("Reshape", param, per_channel))
    return replace_training_batchnorm(b, graph, node, y, b.squeeze(mean, axes), b.squeeze(var, axes), count)
