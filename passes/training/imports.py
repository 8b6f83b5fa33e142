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
   never differentiates.

Initializers listed as graph inputs (IR < 4 exports) keep working: they already are inputs.
"""

from __future__ import annotations

import numpy as np
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


def fill_unknown_ranks(model: ir.Model) -> bool:
    """Give values whose rank shape inference could not find (a Reshape to a shape computed
    from Shape/Slice/Concat, as torch.onnx writes attention) the rank they have when the model
    runs once on a small dummy batch (symbolic dims set to 2) with onnx's reference evaluator.
    Dims stay unknown: only the rank is recorded, which does not depend on the batch. Returns
    whether any value changed."""
    graph = model.graph
    unknown = [v for node in graph for v in node.outputs if v.shape is None and v.name and v.dtype is not None]
    if not unknown:
        return False
    import onnx
    from onnx.reference import ReferenceEvaluator

    proto = ir.serde.serialize_model(model)
    del proto.graph.output[:]
    proto.graph.output.extend(onnx.helper.make_empty_tensor_value_info(v.name) for v in unknown)
    try:
        feeds = {v.name: _dummy(v) for v in graph.inputs if not v.is_initializer()}
        values = ReferenceEvaluator(proto).run(None, feeds)
    except Exception:  # noqa: BLE001 - a probe that fails leaves the ranks unknown
        return False
    for value, array in zip(unknown, values):
        value.shape = ir.Shape([None] * np.ndim(array))
    return True


def _dummy(value: ir.Value) -> np.ndarray:
    if value.shape is None:
        raise ValueError(f"input {value.name!r} has no shape; cannot probe ranks")
    dims = [d if isinstance(d, int) else 2 for d in value.shape]
    return np.zeros(dims, dtype=value.dtype.numpy())
