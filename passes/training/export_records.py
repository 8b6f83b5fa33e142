"""What a torch.onnx export leaves out about layers that train differently from the file, told by
what the file does record, as warnings naming the layers and the fix (an exact result is out of
reach: the file lacks what torch would compute):

* ``spectral_vectors``: the hook form ``torch.nn.utils.spectral_norm`` keeps ``<w>_orig`` (the
  parameter) and the buffers ``<w>_u``, ``<w>_v``, which torch's power iteration rewrites under
  ``no_grad`` each training forward; TorchScript records neither the write nor that they are
  buffers, so they are exporter constants (kept as exported, not trained) and ``warn`` names them.
* a BatchNorm(momentum=None) exported by TorchScript in training mode: torch.onnx writes its
  factor then, ``1/k`` after ``k`` tracked batches, as ONNX momentum ``1 - 1/k``; torch keeps
  counting (1/(k+1), ...). ``warn`` names the training-mode BatchNormalizations whose momentum is
  ``1 - 1/k`` for a whole k >= 2 other than 10, 100 and 1000 (the 0.1, 0.01 and 0.001 that code
  writes; k = 1, momentum 0, is ``modes.warn_fixed_momentum``'s).
* a dynamo export's norm layer whose running statistics it drops (InstanceNorm with
  ``track_running_stats=True`` in training mode: ``aten.instance_norm`` reads them, the ONNX
  InstanceNormalization does not): the signature lists the buffers, the graph holds none of them,
  so their values are gone (the fx node keeps the momentum). The eval-mode export keeps them, as a
  BatchNormalization of the statistics tiled over the batch, which ``modes`` trains as torch.
* a dynamo export in eval mode (``model.eval()``, torch.onnx's usual): Dropout-family modules are
  recorded (``class_hierarchy``) but hold no random op (an Identity; with ``optimize=False``: the
  default optimizer removes it and its record), and a recurrent layer's ``fx_node`` records its
  dropout between layers with ``train=False``, so training runs them as in eval. TorchScript leaves no trace of them (nor of RReLU's random slope, which the dynamo
  exporter cannot export); docs/api.md says so.
"""

from __future__ import annotations

import ast
import re
import warnings

import onnx_ir as ir

from graphc.errors import first_few
from graphc.passes.training import imports, modes
from graphc.passes.values import exact_float

_CLASSES = "pkg.torch.onnx.class_hierarchy"
_BUFFER = re.compile(r"^(\S+): BUFFER target='([^']+)'", re.MULTILINE)
_RANDOM_IN_TRAINING = "Dropout"  # in the torch.nn classes Dropout*d, AlphaDropout, FeatureAlphaDropout
_RANDOM_OPS = frozenset({"Dropout", "RandomUniformLike", "RandomUniform", "RandomNormalLike", "RandomNormal",
                         "Bernoulli"})
_NORMALIZATIONS = frozenset({"InstanceNormalization", "BatchNormalization", "GroupNormalization",
                             "LayerNormalization"})
# aten.lstm/gru/rnn_*(input, hx, params, has_biases, num_layers, dropout, train, ...)
_RNN = re.compile(r"target=torch\.ops\.aten\.(lstm|gru|rnn_tanh|rnn_relu)\.input\]\(args = \(.*\], "
                  r"(?:True|False), (\d+), ([0-9.e+-]+), False")
_CODE_MOMENTA = (10, 100, 1000)  # 1/k = 0.1, 0.01, 0.001: momenta written in code, not counted


def spectral_vectors(model: ir.Model, names) -> dict[str, str]:
    """``{name: why}`` for the ``<w>_u``/``<w>_v`` among ``names`` that sit next to a ``<w>_orig``
    initializer in a TorchScript export: spectral norm's power-iteration vectors, buffers of the
    torch module (a dynamo export records them as buffers: ``imports.exporter_constants``)."""
    if not imports.torchscript(model):
        return {}
    graph = model.graph
    found = {}
    for name in names:
        stem, _, last = name.rpartition("_")
        if last in ("u", "v") and f"{stem}_orig" in graph.initializers:
            found[name] = f"spectral norm's power-iteration vector of {stem}_orig, a buffer of the torch module"
    return found


def warn(model: ir.Model, batchnorm: str) -> None:
    """The warnings of the module docstring, one per kind, for ``model`` as imported, after
    ``modes.warn_fixed_momentum``'s."""
    modes.warn_fixed_momentum(model.graph, batchnorm)
    graph = model.graph
    dynamo = imports.SIGNATURE in graph.metadata_props
    vectors = spectral_vectors(model, graph.initializers)
    if vectors:
        _say(f"spectral norm buffers {', '.join(map(repr, vectors))} stay as exported and are not trained: torch "
             "rewrites them by power iteration in each training forward (under no_grad), which a TorchScript export "
             "does not record. Export with torch.onnx.export(..., dynamo=True, optimize=False) to train them as "
             "torch does, or use gc.nn.utils.spectral_norm")
    counted = _counted_momenta(graph) if batchnorm != "frozen" else {}
    if counted:
        _say(f"BatchNormalization {', '.join(f'{n!r} (momentum {m})' for n, m in counted.items())} of a "
             "training-mode export: torch.onnx writes 1 - 1/k for a BatchNorm with momentum=None (torch's cumulative "
             "average) that has tracked k - 1 batches, whose factor torch keeps lowering (1/(k+1), ...); training "
             "here keeps it fixed. If that is the source model, set its momentum before exporting "
             "(bn.momentum = 0.1) or build it with gc.nn.BatchNorm*d(momentum=None)")
    dropped = _dropped_statistics(graph) if dynamo else {}
    if dropped:
        _say(f"the export dropped the running statistics of {', '.join(f'{m!r} ({b})' for m, b in dropped.items())}: "
             "training normalizes with batch statistics and updates no running statistics, and eval and inference "
             "normalize with batch statistics too, while torch (InstanceNorm*d(track_running_stats=True)) tracks them "
             "and normalizes with them in eval. Their values are not in the file (only the momentum is, "
             "in each node's pkg.torch.onnx.fx_node). Export in eval mode (model.eval() before torch.onnx.export): "
             "that export keeps them, and training tracks them as torch does")
    idle = {**_eval_layers(graph), **_rnn_dropouts(graph)} if dynamo else {}
    if idle:
        _say(f"exported in eval mode: {first_few([f'{m!r} ({c})' for m, c in idle.items()], 6)} hold no "
             "dropout in this file, so training runs them as torch does in eval mode (the same for a p of 0). "
             "Export the model in training mode (model.train() before torch.onnx.export) to train them as torch does")


def _say(text: str) -> None:
    warnings.warn(text + ".", UserWarning, stacklevel=5)


def _counted_momenta(graph: ir.Graph) -> dict[str, float]:
    """{BatchNorm: ONNX momentum} of the training-mode BatchNormalizations whose momentum is
    ``1 - 1/k`` (see the module docstring)."""
    found = {}
    for node in graph:
        if node.op_type != "BatchNormalization" or node.attributes.get_int("training_mode", 0) != 1:
            continue
        momentum = exact_float(node, "momentum", 0.9)
        k = round(1 / (1 - momentum)) if momentum < 1 else 0
        if k >= 2 and k not in _CODE_MOMENTA and abs((1 - 1 / k) - momentum) < 1e-6:
            stat = node.inputs[3] if len(node.inputs) > 3 else None
            found[stat.name.rsplit(".", 1)[0] if stat is not None and "." in stat.name else node.name] = momentum
    return found


def _dropped_statistics(graph: ir.Graph) -> dict[str, str]:
    """{module: its buffers} for the normalization nodes whose torch op (``fx_node``) read buffers
    of the signature that are not in the graph: their ONNX op has no input for them. (A Conv into
    which the exporter fused a BatchNorm records the BatchNorm's op too: the statistics are in its
    weights.)"""
    buffers = {f"%{placeholder}": target
               for placeholder, target in _BUFFER.findall(graph.metadata_props[imports.SIGNATURE])}
    found = {}
    for node in (n for n in graph if n.op_type in _NORMALIZATIONS):
        read = re.findall(r"%\w+", node.metadata_props.get(imports.FX_NODE, "").split("](args", 1)[-1])
        gone = [buffers[p] for p in read if p in buffers and buffers[p] not in graph.initializers]
        if gone:
            found[imports.module_path(node) or node.name] = ", ".join(gone)
    return found


def _eval_layers(graph: ir.Graph) -> dict[str, str]:
    """{module: class} for the Dropout-family modules a dynamo export recorded with no random op
    among their nodes."""
    layers: dict[str, tuple[str, bool]] = {}
    for node in graph:
        try:
            classes = ast.literal_eval(node.metadata_props.get(_CLASSES, "[]"))
        except (ValueError, SyntaxError):
            continue
        owner = next((c.rsplit(".", 1)[-1] for c in reversed(classes[:-1])
                      if _RANDOM_IN_TRAINING in c.rsplit(".", 1)[-1]), None)
        if owner is not None:
            path = imports.module_path(node) or owner
            _, random = layers.get(path, (owner, False))
            layers[path] = (owner, random or node.op_type in _RANDOM_OPS)
    return {path: owner for path, (owner, random) in layers.items() if not random}


def _rnn_dropouts(graph: ir.Graph) -> dict[str, str]:
    """{module: "LSTM, dropout 0.5 between layers"} for the recurrent layers of several layers and a
    dropout that a dynamo export recorded in eval mode (``train`` False in their ``fx_node``)."""
    found = {}
    for node in graph:
        match = _RNN.search(node.metadata_props.get(imports.FX_NODE, ""))
        if match and int(match[2]) > 1 and float(match[3]) > 0:
            kind = match[1].upper().replace("_", " ")
            found[imports.module_path(node) or node.name] = f"{kind}, dropout {match[3]} between layers"
    return found
