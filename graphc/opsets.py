"""Converting a model to another ai.onnx opset (servers often run an older onnxruntime)."""

from __future__ import annotations

import onnx
import onnx_ir as ir

from graphc.errors import GraphError
from graphc.model import Model, load
from graphc.passes.functions import expand_functions

__all__ = ["convert_opset"]


def convert_opset(model: Model, target: int, hint: str = "") -> Model:
    """``model`` at ai.onnx opset ``target`` (onnx's version converter). Ops ONNX added after
    ``target`` but defines as functions of older ops (Gelu from 20, ...) are first replaced by
    their function body. Raises ``GraphError`` naming the model, both opsets and why."""
    current = model.opset
    if target == current:
        return model
    try:
        converted = onnx.version_converter.convert_version(_without_newer_functions(model, target), target)
        _drop_default_attributes_unknown_at(converted, current, target)
    except Exception as exc:  # noqa: BLE001 - the converter raises bare RuntimeErrors from C++
        raise GraphError(f"cannot convert model {model.name!r} from opset {current} to {target}: {exc}"
                         + (f"; {hint}" if hint else "")) from None
    return load(converted)


def _drop_default_attributes_unknown_at(proto: onnx.ModelProto, current: int, target: int) -> None:
    """Remove, in place, attributes the converter leaves on a node although its op at ``target``
    has no such attribute (ReduceMean's ``noop_with_empty_axes`` going from 18 to 17), when
    they hold the default of the op at ``current`` and so change nothing. Any other such
    attribute raises: the model cannot mean the same at ``target``."""
    for node in proto.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        old, new = onnx.defs.get_schema(node.op_type, current), onnx.defs.get_schema(node.op_type, target)
        kept = []
        for attribute in node.attribute:
            if attribute.name in new.attributes:
                kept.append(attribute)
                continue
            default = old.attributes[attribute.name].default_value if attribute.name in old.attributes else None
            if default is None or not default.HasField("name") or \
                    onnx.helper.get_attribute_value(default) != onnx.helper.get_attribute_value(attribute):
                raise ValueError(f"{node.op_type} node {node.name!r}: attribute {attribute.name!r} has no "
                                 f"equivalent at opset {target}")
        if len(kept) != len(node.attribute):
            del node.attribute[:]
            node.attribute.extend(kept)


def _exists_at(op_type: str, opset: int) -> bool:
    try:
        onnx.defs.get_schema(op_type, opset)
    except onnx.defs.SchemaError:
        return False
    return True


def _without_newer_functions(model: Model, target: int) -> onnx.ModelProto:
    """The model as a proto, each node whose op ONNX added after opset ``target`` but defines as
    a function of older ops replaced by onnx's own body: the converter has no adapter for an op
    with no earlier version. ``model`` itself is not changed."""
    if all(_exists_at(node.op_type, target) for node in model.ir.graph if node.domain in ("", "ai.onnx")):
        return model.proto
    proto = model.proto
    try:  # context-dependent bodies (RMSNormalization, Attention, ...) need their inputs' types
        proto = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # noqa: BLE001 - without types those nodes just stay (and the converter says so)
        pass
    copy = ir.serde.deserialize_model(proto)
    if not expand_functions(copy, lambda node: not _exists_at(node.op_type, target)):
        return model.proto
    # a body computes some inputs at run time from shapes (RMSNormalization's reduce axes from
    # the rank): folded to constants, they are what the converter's adapters need
    from graphc.optimization import optimize

    return optimize(Model(copy), level=1).proto
