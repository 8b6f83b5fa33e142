"""Training vs inference mode for Dropout and BatchNormalization.

* ``set_inference_mode``: Dropout loses its ``training_mode`` input (ONNX's default is
  inference, the identity); BatchNormalization gets ``training_mode=0`` and one output (it
  normalises with the running statistics); a float64 one whose float32 ``epsilon`` rounds the eps
  its metadata records (``EPSILON_KEY``) gets that double added to its variance input and
  ``epsilon=0``, as ``ops_nn.batch_norm`` captures it (``own_batchnorm_stats`` undoes this first).
* ``set_training_mode``: each top-level Dropout is written out in standard ops fed by an explicit
  noise input (``dropout_noise.<k>``: uniform [0, 1) float32 of the Dropout input's shape, drawn
  by the caller each step): ``keep = noise >= ratio``, ``y = x * Cast(keep) * 1/(1-ratio)``,
  ``mask = keep``. The randomness is thus the caller's (the Trainer draws it from a seeded numpy
  Generator saved in checkpoints), identical on every backend. A Dropout inside a subgraph
  (If/Loop body) is left as it is. BatchNormalization gets ``training_mode=1``: autodiff
  differentiates it by its closed-form rule (``rules_norm``).
* ``lower_batchnorm``, after autodiff: each training-mode BatchNormalization is written out in
  the batch statistics in primitive ops (ReduceMean/Sub/Mul) and an inference-mode
  BatchNormalization on them, which every backend runs (onnxruntime's inference build has no
  training-mode BatchNormalization); in CPU graphs, over large maps, a 1x1 Conv of one channel
  a group instead, into which onnxruntime fuses a Relu or a residual Add after it
  (``rules_norm.normalize``). Batch statistics normalise the input (biased variance, as
  PyTorch); the running statistics are updated as PyTorch does:
  ``running = m*running + (1-m)*batch`` with ONNX's momentum ``m`` (PyTorch's 1 - momentum) and
  the *unbiased* batch variance for ``running_var``; for torch's cumulative moving average
  (``momentum=None``, the node names its ``num_batches_tracked`` counter in metadata:
  ``add_batch_counters`` made it an int64 initializer) ``1 - m`` is ``1/num_batches_tracked``
  after the counter's increment, as torch's. A statistic tiled N times (an instance norm with
  running statistics, ``tracked_stat``) is updated by the mean of its N updates. It returns
  ``{stat name: updated value}`` (the counters' included) for the step to output.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx_ir as ir

from graphc.errors import PassError
from graphc.model import COUNT_KEY, COUNTER_KEY, SOURCE_KEY, VMAP_FOLDED_KEY
from graphc.passes.autodiff.rules_norm import affine_as_conv, batch_statistics, normalize
from graphc.passes.emit import Emitter
from graphc.passes.training import imports
from graphc.passes.training.recompute import inherited
from graphc.passes.values import (EPSILON_KEY, exact_float, onnx_opset, replace_value,
                                  static_shape)


def batchnorm_stats(graph: ir.Graph) -> list[str]:
    """Names of the running mean/var initializers of every BatchNormalization node."""
    names: list[str] = []
    for node in graph:
        if node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx"):
            for value in node.inputs[3:5]:
                stat = tracked_stat(value)
                if stat is not None and stat.name not in names:
                    names.append(stat.name)
    return names


def one_row_batchnorms(graph: ir.Graph) -> dict[str, tuple[str, int]]:
    """The BatchNormalizations whose input has one value per channel when a data input's
    symbolic dim is 1 (``[N, C]`` or ``[N, C, 1, ...]``, N that dim): {the BatchNorm, as its
    running mean's module (``bn``) or its node's name: (that input, its axis)}. Trained on such a
    batch, the running variance's unbiased factor n/(n-1) is 1/0 and the statistics turn NaN
    while the loss stays finite; PyTorch raises ("Expected more than 1 value per channel when
    training"), and the Trainer refuses the batch."""
    dims = {d.value: (v.name, j) for v in reversed(graph.inputs) if not v.is_initializer() and v.shape is not None
            for j, d in enumerate(v.shape) if not isinstance(d, int) and d.value}
    found: dict[str, tuple[str, int]] = {}
    for node in graph:
        x = node.inputs[0] if node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx") else None
        if x is None or x.shape is None or len(x.shape) < 2 or isinstance(x.shape[0], int):
            continue
        if x.shape[0].value in dims and all(d == 1 for d in list(x.shape)[2:]):
            stat = tracked_stat(node.inputs[3]) if len(node.inputs) > 3 else None
            found[stat.name.rsplit(".", 1)[0] if stat is not None else node.name] = dims[x.shape[0].value]
    return found


# what an imported BatchNorm's extreme momentum does to its running statistics in training, and
# the torch BatchNorm(momentum=None) export that records it (torch.onnx cannot write the cumulative
# average: its factor, 1/num_batches_tracked, is 0 in eval mode and 1 in a training-mode export
# of a fresh module)
_FIXED_MOMENTA = {1.0: ("never updates their running statistics (torch's momentum=0)",
                        "in eval mode, torch.onnx's default"),
                  0.0: ("replaces their running statistics with each batch's (torch's momentum=1)", "in training mode")}


def warn_fixed_momentum(graph: ir.Graph, batchnorm: str) -> None:
    """With ``batchnorm`` "train", one warning per momentum naming the imported
    BatchNormalizations with tracked running statistics whose ONNX momentum is 1.0 or 0.0
    (``_FIXED_MOMENTA``): training follows it, and the torch BatchNorm(momentum=None) the model may
    come from trains the cumulative average. Captured BatchNorms (``SOURCE_KEY``) are left out:
    their momentum is the one the code gave."""
    if batchnorm == "frozen":
        return
    found: dict[float, list[str]] = {}
    for node in graph:
        if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx") or \
                SOURCE_KEY in node.metadata_props or COUNTER_KEY in node.metadata_props:
            continue
        stat = tracked_stat(node.inputs[3]) if len(node.inputs) > 3 else None
        momentum = exact_float(node, "momentum", 0.9)
        if stat is not None and momentum in _FIXED_MOMENTA:
            found.setdefault(momentum, []).append(stat.name.rsplit(".", 1)[0] if "." in stat.name else node.name)
    for momentum, names in found.items():
        does, when = _FIXED_MOMENTA[momentum]
        warnings.warn(
            f"BatchNormalization {', '.join(map(repr, names))}: ONNX momentum {momentum}, so training {does}. "
            f"torch.onnx also writes {momentum} for a BatchNorm with momentum=None (torch's "
            f"cumulative average, which torch would train) exported {when}: if that is the source model, set its "
            "momentum before exporting (bn.momentum = 0.1) or build it with gc.nn.BatchNorm*d(momentum=None); "
            "batchnorm=\"frozen\" keeps the exported statistics and normalizes with them.", UserWarning, stacklevel=5)


def tracked_stat(value: ir.Value | None) -> ir.Value | None:
    """The initializer a BatchNormalization's running statistic is, or tiles along its one axis
    (``gc.nn.InstanceNorm*d(track_running_stats=True)``, torch's instance norm: a BatchNorm of
    ``[1, N*C, ...]`` on the statistics tiled N times), or either cast (a float16 or bfloat16
    statistic read in float32, ``graphc.dsl.upcast``); else None."""
    if value is None or value.is_initializer():
        return value
    producer = value.producer()
    if producer is not None and producer.op_type in ("Tile", "Cast"):
        return tracked_stat(producer.inputs[0])
    return None


def _tiled(value: ir.Value) -> bool:
    """Is the running statistic ``value`` its initializer tiled (``tracked_stat``)?"""
    producer = value.producer()
    return producer is not None and (producer.op_type == "Tile" or producer.op_type == "Cast" and
                                     _tiled(producer.inputs[0]))


def add_batch_counters(graph: ir.Graph) -> list[str]:
    """An int64 scalar initializer for each ``num_batches_tracked`` counter a BatchNormalization
    with torch's cumulative moving average names (``COUNTER_KEY``), holding its count at capture
    (``COUNT_KEY``), in place; their names."""
    counters: list[str] = []
    for node in graph:
        name = node.metadata_props.get(COUNTER_KEY)
        if node.op_type != "BatchNormalization" or name is None:
            continue
        if name in counters or name in graph.initializers:
            raise PassError(f"BatchNormalization {node.name!r}: its counter {name!r} (momentum=None) is read by "
                            "another BatchNormalization or names an existing tensor; a BatchNorm module with "
                            "momentum=None may run once per forward")
        count = np.array(int(node.metadata_props.get(COUNT_KEY, "0")), dtype=np.int64)
        graph.initializers[name] = ir.Value(name=name, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]),
                                            const_value=ir.tensor(count, name=name))
        counters.append(name)
    return counters


def own_batchnorm_stats(graph: ir.Graph) -> None:
    """Give each BatchNormalization's running mean and var an initializer of its own, in place,
    where they are an ``Identity`` of an initializer or an initializer read elsewhere too.
    torch.onnx merges initializers of equal values, so a fresh BatchNorm's statistics (zeros and
    ones) read its bias and weight: through an Identity (TorchScript) or as they are (dynamo),
    and training would take the params for statistics or track none. The new initializer holds
    a copy of the value, named as torch names the buffer: the Identity's output
    (``bn.running_mean``), else the buffer a dynamo export's signature lists for the node's
    module (a fresh BatchNorm's scale and bias merged with a LayerNorm's name the LayerNorm),
    else ``<p>.running_mean``/``<p>.running_var`` for a scale ``<p>.weight`` and bias
    ``<p>.bias``, else ``<node name>.running_mean``/``...var``. A float64 inference node with its
    exact eps added to the variance input (``ops_nn.batch_norm``) reads the running variance again."""
    names = {*graph.initializers, *(v.name for v in graph.inputs), *(v.name for n in graph for v in n.outputs)}
    buffers = imports.signature_targets(graph, "BUFFER")
    for node in list(graph):
        if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        eps_as_attribute(graph, node)
        for index, stat in ((3, "running_mean"), (4, "running_var")):
            value = node.inputs[index] if len(node.inputs) > index else None
            alias = value is not None and value.producer() is not None and value.producer().op_type == "Identity"
            source = value.producer().inputs[0] if alias else value
            if source is None or not source.is_initializer() or source.const_value is None or (
                    not alias and len(value.uses()) == 1):
                continue
            own = ir.Value(type=ir.TensorType(source.dtype), shape=ir.Shape(source.const_value.shape),
                           const_value=ir.tensor(source.const_value.numpy().copy()))
            node.replace_input_with(index, own)
            if alias and not value.uses() and not value.is_graph_output():
                graph.remove(value.producer(), safe=True)
                own.name = value.name
            else:
                own.name = _stat_name(node, stat, names, buffers)
            names.add(own.name)
            own.const_value.name = own.name
            graph.register_initializer(own)


def _stat_name(node: ir.Node, stat: str, taken: set[str], buffers: set[str]) -> str:
    """``<m>.<stat>`` for a BatchNormalization a dynamo export recorded under module ``<m>``, when
    ``buffers`` (its signature's) hold that name; else ``<p>.<stat>`` for one of scale
    ``<p>.weight`` and bias ``<p>.bias``; else ``<node name>.<stat>``; with a suffix while taken."""
    scale, bias = (v.name or "" if v is not None else "" for v in node.inputs[1:3])
    prefix = scale.removesuffix(".weight")
    if f"{imports.module_path(node)}.{stat}" in buffers - taken:
        prefix = imports.module_path(node)
    elif not (scale.endswith(".weight") and bias == f"{prefix}.bias") or f"{prefix}.{stat}" in taken:
        prefix = node.name or "BatchNormalization"
    name, k = f"{prefix}.{stat}", 0
    while name in taken:
        k += 1
        name = f"{prefix}.{stat}_{k}"
    return name


def eps_as_attribute(graph: ir.Graph, node: ir.Node) -> None:
    """``node``'s exact eps (``EPSILON_KEY``) taken off its variance input into its attribute again
    (rounded; the metadata keeps the double), where ``_eps_in_variance`` added it."""
    exact, var = node.metadata_props.get(EPSILON_KEY), node.inputs[4]
    if exact is None or _eps_attribute(node) != 0.0 or var.producer() is None:
        return
    add = var.producer()
    node.replace_input_with(4, add.inputs[0])
    node.attributes["epsilon"] = ir.AttrFloat32("epsilon", float(exact))
    for dead in (add, add.inputs[1].producer()):
        if dead is not None and not any(out.uses() or out.is_graph_output() for out in dead.outputs):
            graph.remove(dead, safe=True)


def _eps_attribute(node: ir.Node) -> float:
    """A BatchNormalization's ``epsilon`` attribute (ONNX's default 1e-5 where it has none)."""
    return node.attributes.get_float("epsilon", 1e-5)


def _eps_in_variance(graph: ir.Graph, nodes: list[ir.Node]) -> None:
    """Inference ``nodes`` as ``ops_nn.batch_norm`` captures one whose float32 ``epsilon`` may round its
    exact eps (``EPSILON_KEY``): the double added to the variance input, ``epsilon=0``; exact in any
    runtime."""
    b = Emitter(graph, onnx_opset(graph, 0), "eps")
    for node in nodes:
        var = node.inputs[4]
        node.replace_input_with(4, b.op("Add", var, b.scalar(float(node.metadata_props[EPSILON_KEY]), var)))
        node.attributes["epsilon"] = ir.AttrFloat32("epsilon", 0.0)
    graph.sort()


def set_inference_mode(graph: ir.Graph, ops: tuple[str, ...] = ("Dropout", "BatchNormalization")) -> None:
    """Inference mode for the nodes of types ``ops`` (see the module docstring)."""
    rounded: list[ir.Node] = []
    for node in list(graph):
        if node.domain not in ("", "ai.onnx") or node.op_type not in ops:
            continue
        if node.op_type == "Dropout" and len(node.inputs) > 2:
            node.resize_inputs(2)
        elif node.op_type == "BatchNormalization":
            if "training_mode" in node.attributes:
                node.attributes.pop("training_mode")
            for out in node.outputs[1:]:
                if out.uses() or out.is_graph_output():
                    raise ValueError(f"BatchNormalization {node.name!r}: output {out.name!r} (a "
                                     f"training-mode statistic) is used; cannot switch to inference")
            node.resize_outputs(1)
            rounded += [node] if EPSILON_KEY in node.metadata_props and _eps_attribute(node) != 0.0 else []
    if rounded:
        _eps_in_variance(graph, rounded)


NOISE_PREFIX = "dropout_noise."
DROPOUT_INPUT_KEY = "graphc.dropout_input"


def set_training_mode(b: Emitter, graph: ir.Graph, noise: list[str] | None = None,
                      batchnorm: bool = True) -> None:
    """Training mode in place (for BatchNormalization only with ``batchnorm``). The names of
    the noise inputs added for Dropout are appended to ``noise``."""
    noise = [] if noise is None else noise
    for node in list(graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Dropout":
            with inherited(graph, node):  # a checkpoint region's Dropout recomputes its mask from the noise
                _dropout_with_noise(b, graph, node, noise)
        elif node.op_type == "BatchNormalization" and batchnorm:
            _refuse_vmap_folded(node)
            node.attributes["training_mode"] = ir.AttrInt64("training_mode", 1)


def _refuse_vmap_folded(node: ir.Node) -> None:
    """A PassError for an inference BatchNorm ``gc.vmap`` ran on the examples folded into N
    (``VMAP_FOLDED_KEY``): its batch statistics would span all examples, and each example would
    update the shared running statistics, which torch.func.vmap refuses."""
    where = node.metadata_props.get(VMAP_FOLDED_KEY)
    if where is not None:
        raise PassError(f"the BatchNorm at {where}, run per example under gc.vmap in eval mode, cannot train "
                        f"with batch statistics: they would span all the examples folded into its batch, and "
                        f"each example would update the same running statistics (torch.func.vmap refuses "
                        f"this too); generate with batchnorm=\"frozen\", or give it track_running_stats=False "
                        f"and capture in training mode for each example's own statistics")


def lower_batchnorm(b: Emitter, graph: ir.Graph, device: str = "cpu") -> dict[str, ir.Value]:
    """Training-mode BatchNormalization written out in primitive ops, in place (see the module
    docstring); returns the BN statistics' updated values. ``device``: the graphs' ("cpu" or
    "cuda"), which picks how the normalisation is written (``rules_norm.affine_as_conv``).

    Done after autodiff, so the backward is the closed-form rule rather than what autodiff
    derives from these ops: the rule's batch mean, variance and normalised input are the same
    nodes as the ones written here, which onnxruntime's common-subexpression elimination
    merges. CPU time of a train step, 1 thread, interleaved (this rule vs autodiff through the
    decomposition): ResNet-18 at batch 32 -8 %, ResNet-50 at batch 2 -4 %, EfficientNet-B0 at
    batch 32 -11 %."""
    updated: dict[str, ir.Value] = {}
    for node in list(graph):
        if (node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx")
                and node.attributes.get_int("training_mode", 0)):
            with inherited(graph, node):
                updated.update(_batchnorm_training(b, graph, node, device))
    return updated


def _dropout_with_noise(b: Emitter, graph: ir.Graph, node: ir.Node, noise: list[str]) -> None:
    """Replace a Dropout by ops driven by a new float32 noise input (see the module docstring)."""
    x = node.inputs[0]
    ratio = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] is not None else None
    fixed = 0.5 if ratio is None else _const_float(ratio)
    y_old = node.outputs[0]
    mask_old = node.outputs[1] if len(node.outputs) > 1 else None
    mask_used = mask_old is not None and (mask_old.uses() or mask_old.is_graph_output())
    if fixed == 0.0 and not mask_used:  # ratio 0: the identity, no draw
        replace_value(y_old, b.op("Identity", x))
        graph.remove(node, safe=True)
        return
    name = f"{NOISE_PREFIX}{len(noise)}"
    while name in b._names.taken:  # noqa: SLF001 - the emitter's name registry
        name += "_"
    b._names.claim(name)  # noqa: SLF001
    # the Dropout input's dims: ints stay, symbolic ones keep their names, unknown ones stay unknown
    dims = static_shape(x)
    value = ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=None if dims is None else ir.Shape(dims))
    graph.inputs.append(value)
    noise.append(name)
    if fixed is not None:
        ratio32 = b.const(fixed, np.float32, "dropout_ratio")
    else:
        ratio32 = b.op("Cast", ratio, to=ir.DataType.FLOAT)
    keep = b.op("GreaterOrEqual", value, ratio32)
    # which value the noise must match in shape, for a caller that cannot bind its dims
    keep.producer().metadata_props[DROPOUT_INPUT_KEY] = b.name_value(x).name
    keep_x = b.op("Cast", keep, to=x.dtype) if x.dtype is not None else b.op("CastLike", keep, x)
    if fixed is not None:  # ratio 1 keeps nothing: zeros, as torch's Dropout(p=1)
        scale = b.scalar(1.0 / (1.0 - fixed) if fixed < 1.0 else 0.0, x)
    else:
        one = b.scalar(1.0, x)
        scale = b.op("Div", one, b.op("Sub", one, b.op("CastLike", ratio, x)))
    y = b.op("Mul", x, b.op("Mul", keep_x, scale))
    y.shape = None if dims is None else ir.Shape(dims)
    replace_value(y_old, y)
    if mask_old is not None:
        replace_value(mask_old, keep)
    graph.remove(node, safe=True)


def _const_float(value: ir.Value) -> float | None:
    from onnx_ir.convenience import get_const_tensor

    if value.is_graph_input():
        return None
    tensor = get_const_tensor(value)
    return None if tensor is None else float(np.asarray(tensor.numpy()).reshape(-1)[0])


def training_axes(node: ir.Node) -> list[int]:
    """The axes a training-mode BatchNormalization's statistics reduce: all but the channels."""
    x = node.inputs[0]
    if x.shape is None:
        raise ValueError(f"BatchNormalization {node.name!r}: rank of input {x.name!r} is unknown")
    return [0, *range(2, len(x.shape))]


def _batchnorm_training(b: Emitter, graph: ir.Graph, node: ir.Node, device: str) -> dict[str, ir.Value]:
    x, scale, bias = node.inputs[:3]
    axes = training_axes(node)
    eps = exact_float(node, "epsilon", 1e-5)

    # Decomposed for onnxruntime, whose CPU provider has no training-mode kernel: the batch
    # statistics as the gradient rule writes them (onnxruntime merges the two), then the
    # inference-mode BatchNormalization of the centred input (or its Conv twin,
    # ``rules_norm.normalize``), which normalises and applies scale and bias in one pass (see
    # the rule's docstring for the times). Tried before on Conv+BN+ReLU train steps (CPU, 2
    # threads, interleaved): var as ReduceSumSquare/count and the scale folded into inv_std
    # moved steps by -5 to +10 % across [2,64,32,32], [32,64,32,32], [32,256,8,8]. On
    # CUDA (H100, batch 32 at 128 px), the per-channel means and sums as a GEMV against ones
    # (MatMul [N*C, H*W] x [H*W, 1], then ReduceSum over N) instead of cuDNN's reduction over
    # (0, 2, 3): ResNet-50 66.4 vs 66.0 ms a step, EfficientNet-B0 62.0 vs 62.4, MobileNetV3-small
    # 56.2 vs 53.5: not kept. What CUDA graphs keep instead is both sums on onnxruntime's own row
    # and column kernels (``reductions.split_reductions``: graphed ResNet-50 41.2 -> 28.8 ms).
    # The statistics of each image's channel from one LayerNormalization of x as rows [N*C, H*W]
    # (its Mean and InvStdDev outputs, combined over the images; its normalised rows turned into
    # the BatchNorm's output by a per-row Conv affine, the Relu fused): one read and one write of x
    # where the Sub, Mul and two ReduceMeans take four reads and two writes; 2 threads, ms,
    # statistics and normalisation with a Relu: [32,64,32,32] 1.37 vs 1.86, but [32,64,16,16]
    # 0.233 vs 0.217 and [32,128,8,8] 0.208 vs 0.117 (in cache, the per-row work loses), and
    # onnxruntime's LayerNormalization takes a row's variance as E[x^2] - E[x]^2: not taken.
    mean, centred, var, zeros = batch_statistics(b, x, axes, device)
    batch_mean, biased_var = b.squeeze(mean, axes), b.squeeze(var, axes)
    y = normalize(b, centred, scale, bias, zeros, biased_var, eps,
                  affine_as_conv(x, (scale, bias), fused=_fused_after(node.outputs[0]), device=device))
    return replace_training_batchnorm(b, graph, node, y, batch_mean, biased_var, values_per_channel(b, graph, x))


def replace_training_batchnorm(b: Emitter, graph: ir.Graph, node: ir.Node, y: ir.Value, batch_mean: ir.Value,
                               biased_var: ir.Value, count: ir.Value) -> dict[str, ir.Value]:
    """``node`` (training mode) replaced by its normalised output ``y`` and its running
    statistics' updates from the batch's ``batch_mean`` and ``biased_var`` [C] over ``count``
    values per channel ([1], x's dtype), in place; returns {stat name: updated value}."""
    x, mean_in, var_in = node.inputs[0], node.inputs[3], node.inputs[4]
    momentum = exact_float(node, "momentum", 0.9)
    y.dtype, y.shape = x.dtype, ir.Shape(x.shape)  # what the BatchNorms lowered after this one read

    # Running statistics (off the loss path, so autodiff never visits them), in their own type
    # (opset 15 on, it may differ from x's).
    unbias = b.op("Div", count, b.op("Sub", count, b.scalar(1.0, x)))
    batch_var = b.op("Mul", biased_var, unbias)
    if mean_in.dtype != x.dtype:
        batch_mean, batch_var = (b.op("Cast", v, to=mean_in.dtype) for v in (batch_mean, batch_var))
    counter = node.metadata_props.get(COUNTER_KEY)
    updated = {}
    if counter is None:
        m, one_m = b.scalar(momentum, mean_in), b.scalar(1.0 - momentum, mean_in)
    else:  # torch's cumulative average: factor 1/num_batches_tracked, the counter stepped first
        count = graph.initializers[counter]
        updated[counter] = b.op("Add", count, b.scalar(1, count))
        one_m = b.op("Reciprocal", b.op("Cast", updated[counter], to=mean_in.dtype))
        m = b.op("Sub", b.scalar(1.0, mean_in), one_m)
    new_mean = b.op("Add", b.op("Mul", mean_in, m), b.op("Mul", batch_mean, one_m))
    new_var = b.op("Add", b.op("Mul", var_in, m), b.op("Mul", batch_var, one_m))

    outs = list(node.outputs) + [None] * (3 - len(node.outputs))
    for old, new in zip(outs, (y, new_mean, new_var)):
        if old is not None:
            replace_value(old, new)
    graph.remove(node, safe=True)
    for value, new in ((mean_in, new_mean), (var_in, new_var)):
        stat = tracked_stat(value)
        if stat is not None and _tiled(value):  # tiled per sample: the samples' updates averaged, as torch
            new = b.reduce("ReduceMean", b.op("Reshape", new, b.ints([-1, stat.shape[0]])), [0], keepdims=0)
        if stat is not None:  # in the statistic's own dtype where it is read cast
            updated[stat.name] = new if new.dtype == stat.dtype else b.op("Cast", new, to=stat.dtype)
    return updated


def _fused_after(value: ir.Value) -> bool:
    """Is ``value`` read by a Relu alone, or by an Add alone whose other input has its shape (a
    residual sum, a Relu after it or not)? onnxruntime fuses either into a Conv that makes
    ``value`` (a Relu after the Add too)."""
    uses = list(value.uses())
    if len(uses) != 1 or value.is_graph_output() or uses[0].node.domain not in ("", "ai.onnx"):
        return False
    node, index = uses[0]
    if node.op_type == "Relu":
        return True
    if node.op_type != "Add" or len(node.inputs) != 2:
        return False
    shape = static_shape(value)
    return shape is not None and static_shape(node.inputs[1 - index]) == shape


def values_per_channel(b: Emitter, graph: ir.Graph, x: ir.Value) -> ir.Value:
    """The number of values per channel of x [N, C, *S], in x's dtype, computed without reading x
    itself: onnxruntime does not fold Size, and a Size of x run late in the step kept each
    BatchNorm's full-size input alive until then (ResNet-50 b32 at 128 px, peak RSS 2,438 vs
    1,983 MB). Static dims count as constants, a symbolic one as the same-named dim of a graph
    input (ONNX's contract: one name, one size); only a dim found nowhere reads x's shape."""
    count, parts = 1, []
    for i, dim in enumerate(x.shape):
        if i == 1:
            continue
        if isinstance(dim, int):
            count *= dim
            continue
        source = next(((v, j) for v in graph.inputs if v.shape is not None
                       for j, d in enumerate(v.shape) if not isinstance(d, int) and d.value and d.value == dim.value),
                      (x, i))
        parts.append(b.op("Shape", source[0], start=source[1], end=source[1] + 1, dtype=ir.DataType.INT64))
    total = b.const(np.array([count], np.int64))
    for part in parts:
        total = b.op("Mul", total, part)
    return b.op("Cast", total, to=x.dtype, dtype=x.dtype)
