"""Make imported models trainable.

Exporters keep weights in odd places. This pass handles:

1. weights stored in ``Constant`` nodes: a floating-point ``Constant`` of rank >= 1 with at
   least 2 elements becomes an initializer named after its output (scalars and 1-element
   constants such as epsilons, scales and exponents stay constants, and so do constants that
   only set how an op behaves, such as Resize scales: ``settings_only``). Constants captured from
   the DSL (they carry ``graphc.source``) stay constants: there the user chose between
   ``gc.nn.Parameter`` and a constant;
2. an initializer aliased through ``Identity`` or read by several nodes: nothing to rewrite;
   the initializer is the param and autodiff sums the gradients of every use;
3. shape arithmetic built from ``Shape``/``Gather``/``Concat``: integer paths, which autodiff
   never differentiates;
4. one initializer feeding the scale or bias of several normalization layers: usually not a
   tie in the source model but an exporter merging equal values (torch.onnx's dynamo exporter
   does it to every freshly initialized LayerNorm), so training would tie those layers. It
   stays as it is (the graph means exactly that) with a warning naming the layers.

Initializers listed as graph inputs (IR < 4 exports) keep working: they already are inputs.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import onnx_ir as ir

from graphc.model import SOURCE_KEY
from graphc.passes.autodiff.registry import settings_only

_FLOAT = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})


def promote_constant_weights(graph: ir.Graph) -> list[str]:
    """Turn weight-like ``Constant`` nodes of the main graph into initializers; return names."""
    promoted = []
    for node in list(graph):
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or "value" not in node.attributes:
            continue
        if SOURCE_KEY in node.metadata_props:
            continue
        tensor = node.attributes["value"].as_tensor()
        if tensor.dtype not in _FLOAT or len(tensor.shape) == 0 or tensor.size < 2:
            continue
        out = node.outputs[0]
        if out.is_graph_output() or out.name in graph.initializers or settings_only(out):
            continue
        name, out.name = out.name, f"{out.name}/constant"
        value = ir.Value(name=name, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype),
                         const_value=tensor)
        out.replace_all_uses_with(value)
        graph.remove(node, safe=True)
        graph.register_initializer(value)
        promoted.append(value.name)
    return promoted


def is_float(value: ir.Value) -> bool:
    return value.dtype in _FLOAT


_NORMALIZATIONS = frozenset({"LayerNormalization", "BatchNormalization", "GroupNormalization",
                             "InstanceNormalization", "RMSNormalization"})


def warn_shared_normalization_params(graph: ir.Graph, params: Sequence[str]) -> None:
    """One warning naming each trainable param that is the scale or bias of several
    normalization nodes, and those nodes."""
    shared = {}
    for name in params:
        users = [use.node.name for use in graph.initializers[name].uses()
                 if use.node.op_type in _NORMALIZATIONS and use.idx in (1, 2)]
        if len(users) > 1:
            shared[name] = users
    if shared:
        listed = "; ".join(f"{name!r} by {', '.join(map(repr, users))}" for name, users in shared.items())
        warnings.warn(
            f"one tensor is the scale or bias of several normalization nodes ({listed}): training updates each as "
            "one tensor. If they are separate layers in the source model, the exporter merged initializers with "
            "equal values (torch.onnx.export(..., dynamo=True) does unless optimize=False); export without that "
            "merge to train them apart.", UserWarning, stacklevel=4)
